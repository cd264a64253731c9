//! History query latency over a 10-million-row audit log, uptime and incidents of one pool over
//! 30 days of it, and ingest throughput, through the HTTP API (loopback HTTP client).
//!
//!   scripts/stack.sh up && cargo run --release -p vitals-bench --bin api-bench -- [--rows 10000000]
//!
//! The rows are bulk-loaded with generate_series into their own schema (about 10 minutes for
//! 10 M on this machine); `--reuse SCHEMA` skips loading and uses a schema loaded before.

use clap::Parser;
use std::time::{Duration, Instant};
use vitals_bench::stack;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 10_000_000)]
    rows: i64,
    /// Use an already loaded schema instead of loading a new one.
    #[arg(long)]
    reuse: Option<String>,
    /// Keep the loaded schema for another run.
    #[arg(long)]
    keep: bool,
    #[arg(long, default_value_t = 2_000)]
    queries: usize,
    /// Uptime and incident queries (one pool, 30 days each).
    #[arg(long, default_value_t = 500)]
    uptime_queries: usize,
    /// Seconds of ingest load.
    #[arg(long, default_value_t = 10)]
    ingest_secs: u64,
}

const POOLS: i64 = 1_000;
const EP_PER_POOL: i64 = 10;

async fn load(db: &sqlx::PgPool, rows: i64) -> anyhow::Result<()> {
    let chunk = 500_000i64;
    let t = Instant::now();
    // The history indexes are dropped during the load and built once at the end, as the
    // migrations define them: much faster than maintaining three b-trees row by row.
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT indexname, indexdef FROM pg_indexes
         WHERE schemaname = current_schema() AND tablename = 'transitions' AND indexname LIKE 'transitions_by_%'",
    )
    .fetch_all(db)
    .await?;
    for (idx, _) in &indexes {
        sqlx::query(&format!("DROP INDEX {idx}")).execute(db).await?;
    }
    let start: chrono::DateTime<chrono::Utc> = "2026-10-01T00:00:00Z".parse()?;
    let end = start + chrono::Duration::milliseconds(259 * rows);
    vitals_store::months::create_months(db, start, end).await?;
    let mut done = 0;
    while done < rows {
        let n = chunk.min(rows - done);
        // Row i: endpoint i % 10,000 (pool = endpoint / 10), seq = i / 10,000 + 1, times over 30 days.
        sqlx::query(
            "INSERT INTO transitions (pool, endpoint, seq, transition_id, from_state, to_state, weight, ramp_ms,
               reason_code, reason, window_calls, trigger_ids, policy_version, evidence, stream_time,
               source_partition, source_offset)
             SELECT 'pool-' || ((i % $3) / $4), 'ep-' || (i % $3), i / $3 + 1, 'pool-' || ((i % $3) / $4) || '/ep-' || (i % $3) || '/' || (i / $3 + 1),
               'healthy', (ARRAY['degraded','unhealthy','recovering','healthy'])[1 + (i % 4)], 0.25, 0,
               (ARRAY['degraded','ejected','trial_succeeded','recovered'])[1 + (i % 4)],
               'ejected: consecutive_failures>=5 (failure rate 83% of 12 calls, score 31); isolated for 30 s',
               12, ARRAY['ev-' || i], 0,
               '{\"window_ms\":30000,\"success\":2,\"timeout\":10,\"connect_error\":0,\"connection_dropped\":0,\"rate_limited\":0,\"server_error\":0,\"client_error\":1,\"invalid_response\":0,\"cancelled\":0,\"failure_rate\":0.83,\"score\":31.0,\"ttft_p50_ms\":310.0,\"ttft_p99_ms\":1900.0,\"latency_ewma_ms\":null,\"pool_latency_median_ms\":null,\"consecutive_failures\":5,\"consecutive_successes\":0,\"consecutive_hard_failures\":5,\"isolations\":1,\"thresholds\":[\"consecutive_failures>=5\"]}',
               timestamptz '2026-10-01' + (i * interval '259 milliseconds'), 0, i
             FROM generate_series($1::bigint, $2::bigint) i",
        )
        .bind(done)
        .bind(done + n - 1)
        .bind(POOLS * EP_PER_POOL)
        .bind(EP_PER_POOL)
        .execute(db)
        .await?;
        done += n;
        eprintln!("  loaded {done} of {rows} rows ({:.0} s)", t.elapsed().as_secs_f64());
    }
    eprintln!("  building indexes…");
    for (_, ddl) in &indexes {
        // A partitioned table's definition reads `ON ONLY transitions`: built that way, the
        // index would cover no month.
        let ddl = ddl.replace(" ON ONLY ", " ON ");
        // An index over 10 M rows may take longer than the sessions' statement timeout.
        let mut tx = db.begin().await?;
        sqlx::query("SET LOCAL statement_timeout = 0").execute(&mut *tx).await?;
        sqlx::query(&ddl).execute(&mut *tx).await?;
        tx.commit().await?;
    }
    sqlx::query("ANALYZE transitions").execute(db).await?;
    eprintln!("  loaded and indexed in {:.0} s", t.elapsed().as_secs_f64());
    Ok(())
}

fn percentiles(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    (q(0.5), q(0.99))
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: i64) -> i64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as i64
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let schema = args.reuse.clone().unwrap_or_else(|| stack::unique("hist"));
    let migrating = Instant::now();
    let db = vitals_testkit::migrated_schema(&schema).await;
    eprintln!(
        "schema {schema} migrated in {:.1} s (a schema loaded by an older build moves its rows)",
        migrating.elapsed().as_secs_f64()
    );
    let have: i64 = sqlx::query_scalar("SELECT count(*) FROM transitions")
        .fetch_one(&db)
        .await?;
    if have < args.rows {
        eprintln!("loading {} rows into schema {schema}", args.rows - have);
        load(&db, args.rows - have).await?;
    }
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM transitions")
        .fetch_one(&db)
        .await?;

    let topics = stack::Topics::create(&stack::unique("apib"), 8, stack::Stamp::LogAppendTime).await;
    let port = vitals_testkit::free_port();
    let mut api_args: Vec<String> = [
        "--http-addr",
        &format!("127.0.0.1:{port}"),
        "--db-schema",
        &schema,
        "--database-url",
        &stack::database_url(),
        "--brokers",
        &stack::brokers(),
        "--token",
        "bench:writer:bench-writer-secret-01",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    api_args.extend(topics.args());
    let _api = stack::Service::start("vitals-api", "api-bench", &api_args);
    let base = format!("http://127.0.0.1:{port}");
    vitals_testkit::wait_until("the API to be ready", Duration::from_secs(30), || async {
        vitals_testkit::http_get(port, "/readyz")
            .await
            .is_some_and(|b| b.contains("ready"))
    })
    .await;
    let http = reqwest::Client::new();
    let mut rng = Rng(7);

    // History: a first page and the page after it, by endpoint and by pool.
    let mut by_endpoint = Vec::new();
    let mut by_pool = Vec::new();
    for i in 0..args.queries {
        let ep = rng.below(POOLS * EP_PER_POOL);
        let path = if i % 2 == 0 {
            format!(
                "/v1/transitions?pool=pool-{}&endpoint=ep-{ep}&limit=100",
                ep / EP_PER_POOL
            )
        } else {
            format!("/v1/transitions?pool=pool-{}&limit=100", ep / EP_PER_POOL)
        };
        let mut cursor: Option<String> = None;
        for _ in 0..2 {
            let url = format!(
                "{base}{path}{}",
                cursor.as_ref().map(|c| format!("&cursor={c}")).unwrap_or_default()
            );
            let t = Instant::now();
            let r = http.get(&url).send().await?;
            anyhow::ensure!(r.status().is_success(), "{url}: {}", r.status());
            let body: serde_json::Value = r.json().await?;
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            anyhow::ensure!(
                body["items"].as_array().is_some_and(|i| !i.is_empty()),
                "{url}: an empty page"
            );
            if i % 2 == 0 {
                by_endpoint.push(ms)
            } else {
                by_pool.push(ms)
            }
            cursor = body["next_cursor"].as_str().map(str::to_owned);
        }
        if i % 500 == 499 {
            eprintln!("  {} history queries", (i + 1) * 2);
        }
    }
    let (e50, e99) = percentiles(by_endpoint);
    let (p50, p99) = percentiles(by_pool);

    // Uptime and incidents: one pool over the log's 30 days (each endpoint ~1,000 transitions,
    // the pool ~10,000). The state projection names the endpoints; loaded once.
    sqlx::query(
        "INSERT INTO endpoint_state (pool, endpoint, seq, state, weight, ramp_ms, score, failure_rate, since, reason,
           policy_version, first_seen)
         SELECT 'pool-' || (e / $1), 'ep-' || e, 0, 'healthy', 1, 0, 100, 0, timestamptz '2026-10-01', 'first seen', 0,
           timestamptz '2026-09-30'
         FROM generate_series(0, $2 - 1) e ON CONFLICT DO NOTHING",
    )
    .bind(EP_PER_POOL)
    .bind(POOLS * EP_PER_POOL)
    .execute(&db)
    .await?;
    let range = "from=2026-10-01T00:00:00Z&to=2026-10-31T00:00:00Z";
    let (mut uptime, mut incidents, mut listed) = (Vec::new(), Vec::new(), 0usize);
    for i in 0..args.uptime_queries {
        let pool = rng.below(POOLS);
        for (path, out) in [
            (format!("/v1/pools/pool-{pool}/uptime?{range}&bucket=day"), &mut uptime),
            (
                format!("/v1/incidents?pool=pool-{pool}&{range}&limit=100"),
                &mut incidents,
            ),
        ] {
            let t = Instant::now();
            let r = http.get(format!("{base}{path}")).send().await?;
            anyhow::ensure!(r.status().is_success(), "{path}: {}", r.status());
            let body: serde_json::Value = r.json().await?;
            out.push(t.elapsed().as_secs_f64() * 1000.0);
            listed += body["items"].as_array().map_or(0, Vec::len);
            anyhow::ensure!(
                body["items"].is_array()
                    || body["endpoints"]
                        .as_array()
                        .is_some_and(|e| e.len() == EP_PER_POOL as usize),
                "{path}: {body}"
            );
        }
        if i % 100 == 99 {
            eprintln!("  {} uptime and incident queries", (i + 1) * 2);
        }
    }
    let (u50, u99) = percentiles(uptime);
    let (i50, i99) = percentiles(incidents);

    // Ingest: 4 clients posting 500-item batches for the given time.
    let deadline = Instant::now() + Duration::from_secs(args.ingest_secs);
    let mut clients = Vec::new();
    for c in 0..4 {
        let http = http.clone();
        let url = format!("{base}/v1/signals");
        clients.push(tokio::spawn(async move {
            let mut accepted = 0u64;
            let mut n = 0u64;
            while Instant::now() < deadline {
                let items: Vec<serde_json::Value> = (0..500)
                    .map(|i| {
                        n += 1;
                        serde_json::json!({"type": "call", "event_id": format!("b{c}-{n}"), "pool": format!("pool-{}", i % 97),
                            "endpoint": format!("ep-{}", i % 13), "gateway": "bench", "outcome": "success", "latency_us": 20000, "ttft_us": 300000})
                    })
                    .collect();
                let r = http.post(&url).bearer_auth("bench-writer-secret-01").json(&serde_json::json!({"items": items})).send().await;
                if let Ok(r) = r {
                    if let Ok(b) = r.json::<serde_json::Value>().await {
                        accepted += b["accepted"].as_u64().unwrap_or(0);
                    }
                }
            }
            accepted
        }));
    }
    let started = Instant::now();
    let mut accepted = 0;
    for c in clients {
        accepted += c.await?;
    }
    let ingest_rate = accepted as f64 / started.elapsed().as_secs_f64();

    println!(
        "api-bench: {total} transitions in the audit log ({} endpoints, {POOLS} pools)",
        POOLS * EP_PER_POOL
    );
    println!("  page of 100 by endpoint   p50 {e50:>6.2} ms   p99 {e99:>6.2} ms   (target p99 ≤ 20 ms)");
    println!("  page of 100 by pool       p50 {p50:>6.2} ms   p99 {p99:>6.2} ms");
    println!("  uptime, one pool, 30 days p50 {u50:>6.2} ms   p99 {u99:>6.2} ms   (target p99 ≤ 50 ms; daily buckets)");
    println!(
        "  incidents, same, 100/page p50 {i50:>6.2} ms   p99 {i99:>6.2} ms   ({:.0} incidents a page on average)",
        listed as f64 / args.uptime_queries.max(1) as f64
    );
    println!("  ingest                    {ingest_rate:>8.0} items/s acknowledged by the broker (4 clients, 500-item batches)");
    if !args.keep && args.reuse.is_none() {
        sqlx::query(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .execute(&db)
            .await?;
    } else {
        eprintln!("schema {schema} kept");
    }
    Ok(())
}
