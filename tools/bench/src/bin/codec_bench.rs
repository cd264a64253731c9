//! Codec cost: Avro single-object encode/decode against serde_json on the same struct.
//!
//!   cargo run --release -p vitals-bench --bin codec-bench -- [--records N]

use clap::Parser;
use std::hint::black_box;
use std::time::Instant;
use vitals_bench::workload;
use vitals_contracts::{decode_signal, encode_signal, CallOutcome, Signal};

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
    Ok(())
}
