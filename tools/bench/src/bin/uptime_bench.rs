//! Uptime and incidents of one large pool through the HTTP API: 1,000 endpoints over 92 days,
//! an incident on each endpoint every two days (three transitions each), so that every answer
//! the API gives for a legal pool is measured: its size and its latency.
//!
//!   scripts/stack.sh up && cargo run --release -p vitals-bench --bin uptime-bench -- [--endpoints 1000] [--queries 20]

use clap::Parser;
use std::time::{Duration, Instant};
use vitals_bench::stack;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 1_000)]
    endpoints: i64,
    /// Hours between two incidents of one endpoint.
    #[arg(long, default_value_t = 48)]
    incident_every_hours: i64,
    /// Times each kind of first page is asked for.
    #[arg(long, default_value_t = 20)]
    queries: usize,
}

const DAY_US: i64 = 86_400_000_000;
const H_US: i64 = 3_600_000_000;

fn iso(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The pool `big`: every endpoint out for an hour and on probation for another, once every
/// `every_h` hours, each at its own phase, over `[from, to)`.
async fn load(db: &sqlx::PgPool, endpoints: i64, every_h: i64, from: i64, to: i64) -> anyhow::Result<i64> {
    vitals_store::months::create_months(db, vitals_store::timestamp(from - DAY_US), vitals_store::timestamp(to))
        .await?;
    let per = (to - from) / (every_h * H_US);
    sqlx::query(
        "INSERT INTO transitions (pool, endpoint, seq, transition_id, from_state, to_state, weight, ramp_ms,
           reason_code, reason, window_calls, trigger_ids, policy_version, evidence, stream_time,
           source_partition, source_offset)
         SELECT 'big', 'ep-' || e, k * 3 + s + 1, 'big/ep-' || e || '/' || (k * 3 + s + 1),
           (ARRAY['healthy','unhealthy','recovering'])[s + 1], (ARRAY['unhealthy','recovering','healthy'])[s + 1],
           (ARRAY[0.0, 0.1, 1.0])[s + 1], 0, (ARRAY['ejected','readmitted','recovered'])[s + 1],
           'ejected: consecutive_failures>=5 (failure rate 83% of 12 calls, score 31); isolated for 30 s',
           12, ARRAY['ev'], 0,
           '{\"window_ms\":30000,\"success\":2,\"timeout\":10,\"connect_error\":0,\"connection_dropped\":0,\"rate_limited\":0,\"server_error\":0,\"client_error\":1,\"invalid_response\":0,\"cancelled\":0,\"failure_rate\":0.83,\"score\":31.0,\"ttft_p50_ms\":310.0,\"ttft_p99_ms\":1900.0,\"latency_ewma_ms\":null,\"pool_latency_median_ms\":null,\"consecutive_failures\":5,\"consecutive_successes\":0,\"consecutive_hard_failures\":5,\"isolations\":1,\"thresholds\":[\"consecutive_failures>=5\"]}',
           to_timestamp(($1::bigint + k * $3::bigint + (e * 2833 % $3::bigint) + s * 3600000000::bigint)::double precision / 1e6), 0, 0
         FROM generate_series(0, $4::bigint - 1) e, generate_series(0, $5::bigint - 1) k, generate_series(0, 2) s",
    )
    .bind(from)
    .bind(to)
    .bind(every_h * H_US)
    .bind(endpoints)
    .bind(per)
    .execute(db)
    .await?;
    sqlx::query(
        "INSERT INTO endpoint_state (pool, endpoint, seq, state, weight, ramp_ms, score, failure_rate, since, reason,
           policy_version, first_seen)
         SELECT 'big', 'ep-' || e, $2::bigint * 3, 'healthy', 1, 0, 100, 0, now(), '', 0,
           to_timestamp(($1::bigint - 86400000000)::double precision / 1e6)
         FROM generate_series(0, $3::bigint - 1) e",
    )
    .bind(from)
    .bind(per)
    .bind(endpoints)
    .execute(db)
    .await?;
    sqlx::query("ANALYZE transitions").execute(db).await?;
    Ok(endpoints * per * 3)
}

fn percentiles(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    (q(0.5), q(0.99))
}

/// Latencies (ms) and the largest answer (bytes) of a set of requests.
#[derive(Default)]
struct Figures {
    ms: Vec<f64>,
    max_bytes: usize,
    pages: usize,
}

impl Figures {
    fn line(&self, what: &str) {
        let (p50, p99) = percentiles(self.ms.clone());
        println!(
            "  {what:<52} p50 {p50:>7.1} ms  p99 {p99:>7.1} ms  largest answer {:>9} bytes  ({} answers)",
            self.max_bytes, self.pages
        );
    }
}

async fn get(http: &reqwest::Client, url: &str, f: &mut Figures) -> anyhow::Result<serde_json::Value> {
    let t = Instant::now();
    let r = http.get(url).send().await?;
    anyhow::ensure!(r.status().is_success(), "{url}: {}", r.status());
    let body = r.bytes().await?;
    f.ms.push(t.elapsed().as_secs_f64() * 1000.0);
    f.max_bytes = f.max_bytes.max(body.len());
    f.pages += 1;
    Ok(serde_json::from_slice(&body)?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let schema = stack::unique("uptb");
    let db = vitals_testkit::migrated_schema(&schema).await;
    let today = chrono::Utc::now()
        .date_naive()
        .and_hms_opt(0, 0, 0)
        .unwrap_or_default()
        .and_utc();
    let to = today.timestamp_micros() - DAY_US;
    let from = to - 92 * DAY_US;
    let t = Instant::now();
    let rows = load(&db, args.endpoints, args.incident_every_hours, from, to).await?;
    eprintln!(
        "loaded {rows} transitions of {} endpoints over 92 days in {:.1} s",
        args.endpoints,
        t.elapsed().as_secs_f64()
    );
    let topics = stack::Topics::create(&stack::unique("uptb"), 1, stack::Stamp::LogAppendTime).await;
    let port = vitals_testkit::free_port();
    let _api = vitals_testkit::start_api(&topics, &schema, port, &[]).await;
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(120)).build()?;
    let month = format!("from={}&to={}", iso(to - 31 * DAY_US), iso(to));
    let quarter = format!("from={}&to={}", iso(from), iso(to));

    let mut hourly = Figures::default();
    let mut daily = Figures::default();
    let mut first_incident = Figures::default();
    let mut first_500 = Figures::default();
    for _ in 0..args.queries {
        get(
            &http,
            &format!("{base}/v1/pools/big/uptime?{month}&bucket=hour"),
            &mut hourly,
        )
        .await?;
        get(
            &http,
            &format!("{base}/v1/pools/big/uptime?{quarter}&bucket=day"),
            &mut daily,
        )
        .await?;
        get(
            &http,
            &format!("{base}/v1/incidents?pool=big&{quarter}&limit=1"),
            &mut first_incident,
        )
        .await?;
        get(
            &http,
            &format!("{base}/v1/incidents?pool=big&{quarter}&limit=500"),
            &mut first_500,
        )
        .await?;
    }
    // Every page once: the uptime of all endpoints hourly, and every incident 500 at a time.
    let mut all_hourly = Figures::default();
    let mut endpoints = 0;
    let mut cursor: Option<String> = None;
    loop {
        let c = cursor.as_deref().map_or(String::new(), |c| format!("&cursor={c}"));
        let page = get(
            &http,
            &format!("{base}/v1/pools/big/uptime?{month}&bucket=hour{c}"),
            &mut all_hourly,
        )
        .await?;
        endpoints += page["endpoints"].as_array().map_or(0, Vec::len);
        cursor = page["next_cursor"].as_str().map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    let mut all_incidents = Figures::default();
    let mut incidents = 0;
    let mut cursor: Option<String> = None;
    loop {
        let c = cursor.as_deref().map_or(String::new(), |c| format!("&cursor={c}"));
        let page = get(
            &http,
            &format!("{base}/v1/incidents?pool=big&{quarter}&limit=500{c}"),
            &mut all_incidents,
        )
        .await?;
        incidents += page["items"].as_array().map_or(0, Vec::len);
        cursor = page["next_cursor"].as_str().map(str::to_owned);
        if cursor.is_none() {
            break;
        }
        if all_incidents.pages % 20 == 0 {
            eprintln!("  {incidents} incidents read");
        }
    }
    println!(
        "uptime-bench: pool of {} endpoints, {rows} transitions over 92 days, an incident every {} h per endpoint",
        args.endpoints, args.incident_every_hours
    );
    hourly.line("uptime, 31 days hourly, first page");
    daily.line("uptime, 92 days daily, first page");
    all_hourly.line(&format!("uptime, 31 days hourly, every page ({endpoints} endpoints)"));
    first_incident.line("incidents, 92 days, limit=1, first page");
    first_500.line("incidents, 92 days, limit=500, first page");
    all_incidents.line(&format!("incidents, 92 days, limit=500, every page ({incidents})"));
    vitals_testkit::drop_schema(&db, &schema).await;
    Ok(())
}
