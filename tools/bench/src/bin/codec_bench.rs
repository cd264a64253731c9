//! Codec cost: Avro single-object encode/decode against serde_json on the same struct.
//!
//!   cargo run --release -p vitals-bench --bin codec-bench -- [--records N]

use clap::Parser;
use std::hint::black_box;
use std::time::Instant;
use vitals_bench::workload;
use vitals_contracts::codec::{encode, encode_generic};
use vitals_contracts::{
    decode_signal, encode_signal, CallOutcome, CallSummary, Evidence, HealthChanged, HealthState, ReporterCounts,
    Signal,
};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 200_000)]
    records: usize,
}

fn per_record(n: usize, f: impl FnMut(usize)) -> f64 {
    let mut f = f;
    let t = Instant::now();
    for i in 0..n {
        f(i);
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mix = workload::Mix {
        pools: 100,
        endpoints_per_pool: 10,
        rate: 10_000,
    };
    let calls: Vec<CallOutcome> = workload::generate(&mix, args.records * 2, 7)
        .into_iter()
        .filter_map(|(_, s)| match s {
            Signal::Call(c) => Some(c),
            _ => None,
        })
        .take(args.records)
        .collect();
    let n = calls.len();
    let signals: Vec<Signal> = calls.iter().cloned().map(Signal::Call).collect();
    let avro: Vec<Vec<u8>> = signals.iter().map(encode_signal).collect::<Result<_, _>>()?;
    let json: Vec<Vec<u8>> = calls.iter().map(serde_json::to_vec).collect::<Result<_, _>>()?;
    let avro_enc = per_record(n, |i| {
        black_box(encode_signal(&signals[i]).ok());
    });
    let avro_dec = per_record(n, |i| {
        black_box(decode_signal(&avro[i]).ok());
    });
    let avro_generic = per_record(n, |i| {
        black_box(vitals_contracts::codec::decode_signal_generic(&avro[i]).ok());
    });
    let json_enc = per_record(n, |i| {
        black_box(serde_json::to_vec(&calls[i]).ok());
    });
    let json_dec = per_record(n, |i| {
        black_box(serde_json::from_slice::<CallOutcome>(&json[i]).ok());
    });
    let size = |v: &[Vec<u8>]| v.iter().map(Vec::len).sum::<usize>() as f64 / n as f64;
    println!("codec-bench: {n} CallOutcome records");
    println!(
        "  avro single-object  encode {avro_enc:>6.0} ns  decode {avro_dec:>6.0} ns  size {:.0} B",
        size(&avro)
    );
    println!(
        "  serde_json          encode {json_enc:>6.0} ns  decode {json_dec:>6.0} ns  size {:.0} B",
        size(&json)
    );
    println!("  (avro decoded through apache-avro's generic Value instead: {avro_generic:.0} ns)");
    let changes: Vec<HealthChanged> = calls.iter().enumerate().map(|(i, c)| change(c, i)).collect();
    let fast = per_record(n, |i| {
        black_box(encode(&changes[i]).ok());
    });
    let generic = per_record(n, |i| {
        black_box(encode_generic(&changes[i]).ok());
    });
    println!(
        "codec-bench: {n} HealthChanged records ({:.0} B): encode {fast:.0} ns (through apache-avro: {generic:.0} ns)",
        changes.iter().map(|c| encode(c).map_or(0, |b| b.len())).sum::<usize>() as f64 / n as f64
    );
    // What a merger writes: each endpoint's calls of an interval merged from several gateways'
    // summaries, with the reporters that failed in it.
    let merged: Vec<CallSummary> = calls
        .chunks(20)
        .take(n / 10)
        .enumerate()
        .map(|(i, c)| merged(c, i))
        .collect();
    let m = merged.len();
    let fast = per_record(m, |i| {
        black_box(encode(&merged[i]).ok());
    });
    let generic = per_record(m, |i| {
        black_box(encode_generic(&merged[i]).ok());
    });
    println!(
        "codec-bench: {m} merged CallSummary records ({:.0} B): encode {fast:.0} ns (through apache-avro: {generic:.0} ns)",
        merged.iter().map(|c| encode(c).map_or(0, |b| b.len())).sum::<usize>() as f64 / m as f64
    );
    Ok(())
}

/// Twenty calls of an endpoint summed by three gateways and merged.
fn merged(calls: &[CallOutcome], i: usize) -> CallSummary {
    let first = &calls[0];
    let mut merged = CallSummary::new(
        format!("m/{i}"),
        &first.pool,
        &first.endpoint,
        "merger",
        first.occurred_at,
    );
    for (g, part) in calls.chunks(7).enumerate() {
        let mut s = CallSummary::new(
            format!("g{g}/{i}"),
            &first.pool,
            &first.endpoint,
            &format!("gw-{g}"),
            first.occurred_at,
        );
        for c in part {
            s.add(c);
        }
        merged.append(&s);
    }
    merged.reporters = Some(
        (0..3)
            .map(|g| ReporterCounts {
                scopes: vec![format!("gateway=gw-{g}")],
                calls: 7,
                failures: 1,
                trailing_failures: 0,
            })
            .collect(),
    );
    merged
}

/// A transition of the call's endpoint, with the evidence the engine gives one.
fn change(c: &CallOutcome, i: usize) -> HealthChanged {
    HealthChanged {
        transition_id: format!("{}/{}/{i}", c.pool, c.endpoint),
        pool: c.pool.clone(),
        endpoint: c.endpoint.clone(),
        seq: i as i64,
        from_state: HealthState::Healthy,
        to_state: HealthState::Unhealthy,
        weight: 0.0,
        ramp_ms: 0,
        retry_at: Some(c.occurred_at + 30_000_000),
        reason_code: "failure_rate".into(),
        reason: "failure rate 62% over 10 s (threshold 50%, 40 decisive calls)".into(),
        evidence: Evidence {
            window_ms: 10_000,
            success: 15,
            timeout: 3,
            connect_error: 0,
            connection_dropped: 1,
            rate_limited: 0,
            server_error: 21,
            client_error: 2,
            invalid_response: 0,
            cancelled: 0,
            failure_rate: 0.625,
            score: 41.5,
            ttft_p50_ms: Some(420.0),
            ttft_p99_ms: Some(1900.0),
            latency_ewma_ms: Some(850.0),
            pool_latency_median_ms: Some(610.0),
            consecutive_failures: 4,
            consecutive_successes: 0,
            consecutive_hard_failures: 2,
            isolations: 1,
            thresholds: vec!["failure_rate>=0.5".into(), "min_calls>=20".into()],
            late: 0,
        },
        policy_version: 0,
        trigger_ids: vec![c.event_id.clone()],
        stream_time: c.occurred_at,
        scope: None,
    }
}
