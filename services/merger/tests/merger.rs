//! The merge stage on the real broker: a fleet of gateways (the real reporter, keyed by
//! endpoint) → the real `vitals-merger` binary, killed with SIGKILL mid-run and restarted →
//! the signals topic read `read_committed`, as the processor reads it.
// Needs the local stack and its peers: `scripts/test.sh` runs it (`--features stack`).
#![cfg(feature = "stack")]

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::Message;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use vitals_contracts::{decode_signal, encode_signal, CallOutcome, CallSummary, OutcomeClass, Signal};
use vitals_testkit::*;

const GATEWAYS: usize = 8;

fn merger(input: &str, output: &Topics, group: &str, txn: &str, port: u16) -> Service {
    let (dlq, output) = (&output.dlq, &output.signals);
    let args: Vec<String> = [
        "--brokers",
        &brokers(),
        "--input-topic",
        input,
        "--signals-topic",
        output,
        "--dlq-topic",
        dlq,
        "--group",
        group,
        "--transactional-id",
        txn,
        "--http-addr",
        &format!("127.0.0.1:{port}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    Service::start("vitals-merger", "merger", &args)
}

fn reporter(topic: &str) -> vitals_reporter::Reporter {
    let mut c = vitals_reporter::Config::through_merger(brokers());
    c.topic = topic.to_owned();
    vitals_reporter::Reporter::new(c).expect("a reporter")
}

/// Per endpoint: (records, calls they stand for, summaries, failures one by one, gateways seen).
#[derive(Default, Debug)]
struct Seen {
    records: u64,
    calls: u64,
    summaries: u64,
    failures_alone: u64,
}

fn tally(seen: &mut HashMap<String, Seen>, sig: &Signal) {
    let (ep, calls, summary) = match sig {
        Signal::Call(c) => (c.endpoint.clone(), 1, false),
        Signal::Summary(s) => (s.endpoint.clone(), s.calls.total() as u64, true),
        _ => return,
    };
    let e = seen.entry(ep).or_default();
    e.records += 1;
    e.calls += calls;
    if summary {
        e.summaries += 1;
    } else {
        e.failures_alone += 1;
    }
}

/// Read `topic` (committed records only) until `want` calls per endpoint are counted, then on
/// until it has been quiet for 2 s (a duplicate would come after).
async fn read_all(
    topic: &str,
    want: &HashMap<String, u64>,
    deadline: Duration,
) -> (HashMap<String, Seen>, Vec<Signal>) {
    let c: StreamConsumer = consumer(&unique("reader"));
    c.subscribe(&[topic]).expect("subscribe");
    let mut seen: HashMap<String, Seen> = HashMap::new();
    let mut all = Vec::new();
    let end = Instant::now() + deadline;
    let done = |seen: &HashMap<String, Seen>| want.iter().all(|(ep, n)| seen.get(ep).is_some_and(|s| s.calls >= *n));
    loop {
        let wait = if done(&seen) {
            Duration::from_secs(2)
        } else {
            end.saturating_duration_since(Instant::now())
        };
        match tokio::time::timeout(wait, c.recv()).await {
            Ok(Ok(m)) => {
                let sig = decode_signal(m.payload().expect("a payload")).expect("a signal");
                tally(&mut seen, &sig);
                all.push(sig);
            }
            Ok(Err(e)) => panic!("reading {topic}: {e}"),
            Err(_) if done(&seen) => return (seen, all),
            Err(_) => panic!("{topic}: only {seen:#?} of {want:?} within {deadline:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_merged_loses_and_duplicates_no_call_when_the_merger_is_killed_and_its_output_does_not_grow_with_the_fleet(
) {
    let input = Topics::create(&unique("merge_in"), 4, Stamp::LogAppendTime).await;
    let output = Topics::create(&unique("merge_out"), 2, Stamp::LogAppendTime).await;
    let (group, txn) = (unique("merger"), unique("merger_txn"));
    let port = free_port();
    let mut first = merger(&input.signals, &output, &group, &txn, port);
    wait_until("the merger's transactions ready", Duration::from_secs(60), || async {
        http_get(port, "/readyz").await.is_some_and(|b| b.contains("ready"))
    })
    .await;
    let gateways: Vec<_> = (0..GATEWAYS).map(|_| reporter(&input.signals)).collect();
    // Three endpoints: a healthy, b failing one call in ten, c refusing every call.
    let mut want: HashMap<String, u64> = HashMap::new();
    let mut n = 0u64;
    let mut send_round = |round: u64| {
        for (g, r) in gateways.iter().enumerate() {
            for i in 0..20u64 {
                for ep in ["a", "b", "c"] {
                    let class = match ep {
                        "b" if i % 10 == 3 => OutcomeClass::ServerError,
                        "c" => OutcomeClass::ConnectError,
                        _ => OutcomeClass::Success,
                    };
                    n += 1;
                    let call = CallOutcome {
                        latency_us: 20_000 + (i as i64) * 1_000,
                        ttft_us: (class == OutcomeClass::Success).then_some(100_000),
                        ..CallOutcome::new(
                            format!("r{round}-g{g}-{i}-{ep}-{n}"),
                            "pool",
                            ep,
                            format!("gw-{g}"),
                            vitals_testkit_now(),
                            class,
                        )
                    };
                    r.report(call);
                    *want.entry(ep.to_owned()).or_default() += 1;
                }
            }
        }
    };
    // Rounds 40 ms apart for 2 s; the merger is killed once it has committed some of them.
    let started = Instant::now();
    let mut round = 0;
    while started.elapsed() < Duration::from_secs(2) {
        send_round(round);
        round += 1;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    wait_until("a transaction committed", Duration::from_secs(60), || async {
        metric(port, "vitals_merger_transactions_total")
            .await
            .is_some_and(|v| v >= 2.0)
    })
    .await;
    first.kill9();
    // The gateways go on while no merger runs; a new one (same transactional id) takes over.
    for _ in 0..10 {
        send_round(round);
        round += 1;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    let port2 = free_port();
    let _second = merger(&input.signals, &output, &group, &txn, port2);
    for _ in 0..20 {
        send_round(round);
        round += 1;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    for r in gateways {
        let c = r.counters();
        assert!(r.close(Duration::from_secs(30)), "the reporter delivered everything");
        assert_eq!(
            c.dropped_queue_full + c.dropped_producer_full + c.dropped_invalid + c.delivery_failed,
            0,
            "{c:?}"
        );
    }
    let (out, records) = read_all(&output.signals, &want, Duration::from_secs(120)).await;
    // Every call once: none lost with the killed merger's open transaction, none twice.
    for (ep, n) in &want {
        assert_eq!(out[ep].calls, *n, "{ep}: {out:#?}");
    }
    // The merged summaries carry the merger, and failures went on one by one (the dead c's
    // first failures of each interval), keeping the gateway that saw them.
    assert!(records.iter().all(|s| match s {
        Signal::Summary(x) => x.gateway == "vitals-merger",
        Signal::Call(c) => c.gateway.starts_with("gw-") && c.outcome != OutcomeClass::Success,
        _ => false,
    }));
    assert!(out["c"].failures_alone > 0 && out["b"].failures_alone > 0, "{out:#?}");
    // What the gateways sent for a: a summary per gateway per interval; what reached the
    // signals topic: about one per interval — it does not grow with the gateways.
    let (ins, _) = read_all(&input.signals, &want, Duration::from_secs(60)).await;
    eprintln!("gateways sent {ins:?}\nthe merger wrote {out:?}");
    assert!(
        out["a"].summaries * 3 < ins["a"].summaries,
        "a: {} merged summaries from {} the gateways sent",
        out["a"].summaries,
        ins["a"].summaries
    );
    // The cap holds for the fleet: c's failures one by one are at most 8 an interval, where
    // the gateways sent up to 8 each.
    assert!(
        out["c"].failures_alone * 3 < ins["c"].failures_alone,
        "c: {} failures one by one from {}",
        out["c"].failures_alone,
        ins["c"].failures_alone
    );
}

fn vitals_testkit_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as i64
}

/// Time and bad input (docs/fleet.md): one gateway of six with its clock 90 s behind, and a
/// backlog of two minutes read at once, lose no call — the merged summaries are cut by time and
/// pass the processor's validation (none was dead-lettered for its span) — while a record that
/// is no signal and a summary the processor would refuse go to the dead-letter topic alone,
/// with their origin and reason, and the rest of their endpoint's calls are merged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skewed_gateway_and_a_backlog_lose_no_call_and_bad_input_is_dead_lettered_alone() {
    let input = Topics::create(&unique("skew_in"), 2, Stamp::LogAppendTime).await;
    let output = Topics::create(&unique("skew_out"), 1, Stamp::LogAppendTime).await;
    let now = vitals_testkit_now();
    // Two minutes of six gateways' summaries of `a` (40 calls every 250 ms), g6's 90 s behind,
    // all on the topic before the merger starts.
    let mut inputs = Vec::new();
    let mut want: HashMap<String, u64> = HashMap::new();
    for tick in 0..480i64 {
        for g in 1..=6 {
            let at = now - 120_000_000 + tick * 250_000 - if g == 6 { 90_000_000 } else { 0 };
            let gw = format!("g{g}");
            let mut x = CallSummary::new(format!("s{g}-{tick}"), "pool", "a", &gw, at);
            x.add_times(&CallOutcome::new("c", "pool", "a", &gw, at, OutcomeClass::Success), 40);
            *want.entry("a".into()).or_default() += 40;
            inputs.push(Input {
                partition: None,
                ts_ms: now / 1000,
                key: Some("pool/a".into()),
                bytes: encode_signal(&Signal::Summary(x)).unwrap(),
            });
        }
    }
    // Bad input among it: bytes that are no record, and a summary spanning two minutes.
    let mut long = CallSummary::new("s-long".into(), "pool", "a", "g1", now - 120_000_000);
    long.add(&CallOutcome::new(
        "c1",
        "pool",
        "a",
        "g1",
        now - 120_000_000,
        OutcomeClass::Success,
    ));
    long.add(&CallOutcome::new("c2", "pool", "a", "g1", now, OutcomeClass::Success));
    for bytes in [b"not a record".to_vec(), encode_signal(&Signal::Summary(long)).unwrap()] {
        inputs.insert(
            700,
            Input {
                partition: None,
                ts_ms: now / 1000,
                key: Some("pool/a".into()),
                bytes,
            },
        );
    }
    produce(&producer(), &input.signals, inputs).await;
    let (group, txn, port) = (unique("merger"), unique("merger_txn"), free_port());
    let _merger = merger(&input.signals, &output, &group, &txn, port);
    let (out, records) = read_all(&output.signals, &want, Duration::from_secs(120)).await;
    assert_eq!(out["a"].calls, want["a"], "every call of the valid input, once");
    let mut longest = 0;
    for sig in &records {
        assert_eq!(vitals_contracts::validate_signal(sig, Some(now)), Ok(()), "{sig:?}");
        if let Signal::Summary(x) = sig {
            longest = longest.max(x.ended_at - x.started_at);
        }
    }
    eprintln!(
        "{} merged records from {} gateway summaries; the longest spans {} ms",
        records.len(),
        480 * 6,
        longest / 1000
    );
    let dead = read_n(&output.dlq, 2, Duration::from_secs(60)).await;
    let mut codes: Vec<String> = dead.iter().map(|m| header(m, "vitals-error-code").unwrap()).collect();
    codes.sort();
    assert_eq!(codes, ["bad_magic", "invalid_value"]);
    for m in &dead {
        assert_eq!(
            header(m, "vitals-origin-topic").as_deref(),
            Some(input.signals.as_str())
        );
        assert!(header(m, "vitals-origin-offset").is_some());
    }
    assert!(dead
        .iter()
        .any(|m| header(m, "vitals-error").unwrap().contains("within a minute")));
    assert_eq!(metric(port, "vitals_merger_invalid_total").await, Some(1.0));
    assert_eq!(metric(port, "vitals_merger_undecodable_total").await, Some(1.0));
}

/// SplitMix64: a schedule from its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n.max(1)
    }
}

/// One merger of the liveness test: its process (None while killed), its port, and whether it
/// is stopped (SIGSTOP) until a time.
struct Slot {
    service: Option<Service>,
    port: u16,
    stopped_until: Option<Instant>,
}

/// Liveness of the merge stage, generatively: three mergers of one group (each its own
/// transactional id) under a steady load from eight gateways, while a seeded schedule kills
/// them (SIGKILL), stops them (SIGSTOP for up to 12 s: past the session and transaction
/// timeouts, so that a stopped merger comes back fenced) and starts them again. After each
/// step that leaves a merger running, the committed output grows (some merger makes progress);
/// no merger exits by itself; and at the end every call the gateways sent is on the signals
/// topic exactly once. `VITALS_GEN_SEED=N` replays a schedule; `VITALS_GEN_STEPS` (default 10)
/// sets its length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mergers_killed_stopped_and_restarted_at_random_lose_no_call_and_one_always_progresses() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::sync::{Arc, Mutex};
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let seed = env("VITALS_GEN_SEED").unwrap_or_else(|| vitals_testkit_now() as u64 % 1_000_000_000);
    let steps = env("VITALS_GEN_STEPS").unwrap_or(10);
    eprintln!("[merger liveness] seed {seed} (replay: VITALS_GEN_SEED={seed})");
    let mut rng = Rng(seed);
    let input = Topics::create(&unique("live_in"), 4, Stamp::LogAppendTime).await;
    let output = Topics::create(&unique("live_out"), 2, Stamp::LogAppendTime).await;
    let (group, txn) = (unique("merger"), unique("merger_txn"));
    let start = |k: usize, port: u16| merger(&input.signals, &output, &group, &format!("{txn}-{k}"), port);
    let mut slots: Vec<Slot> = (0..3)
        .map(|k| {
            let port = free_port();
            Slot {
                service: Some(start(k, port)),
                port,
                stopped_until: None,
            }
        })
        .collect();
    for s in &slots {
        let port = s.port;
        wait_until("a merger ready", Duration::from_secs(60), || async move {
            http_get(port, "/readyz").await.is_some_and(|b| b.contains("ready"))
        })
        .await;
    }

    // The fleet: calls to six endpoints every 50 ms until told to stop, counted as sent.
    let sent: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let stop_load = Arc::new(AtomicBool::new(false));
    let load = {
        let (sent, stop_load, topic) = (sent.clone(), stop_load.clone(), input.signals.clone());
        std::thread::spawn(move || {
            let gateways: Vec<_> = (0..GATEWAYS).map(|_| reporter(&topic)).collect();
            let mut n = 0u64;
            while !stop_load.load(Relaxed) {
                for (g, r) in gateways.iter().enumerate() {
                    for ep in ["a", "b", "c", "d", "e", "f"] {
                        n += 1;
                        let class = match (ep, n % 7) {
                            ("b", 0) | ("c", _) => OutcomeClass::ServerError,
                            _ => OutcomeClass::Success,
                        };
                        let call = CallOutcome {
                            latency_us: 30_000,
                            ..CallOutcome::new(
                                format!("g{g}-{n}"),
                                "pool",
                                ep,
                                format!("gw-{g}"),
                                vitals_testkit_now(),
                                class,
                            )
                        };
                        r.report(call);
                        *sent.lock().unwrap().entry(ep.to_owned()).or_default() += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            for r in gateways {
                let c = r.counters();
                assert!(r.close(Duration::from_secs(30)), "the reporter delivered everything");
                assert_eq!(
                    c.dropped_queue_full + c.dropped_producer_full + c.dropped_invalid + c.delivery_failed,
                    0,
                    "{c:?}"
                );
            }
        })
    };
    // The signals topic as the processor reads it (committed only), counted as it comes.
    let out_calls = Arc::new(AtomicU64::new(0));
    let seen: Arc<Mutex<HashMap<String, Seen>>> = Arc::default();
    let reader = {
        let (out_calls, seen, topic) = (out_calls.clone(), seen.clone(), output.signals.clone());
        tokio::spawn(async move {
            let c: StreamConsumer = consumer(&unique("reader"));
            c.subscribe(&[&topic]).expect("subscribe");
            loop {
                let m = c.recv().await.expect("reading the signals topic");
                let sig = decode_signal(m.payload().expect("a payload")).expect("a signal");
                out_calls.fetch_add(super_calls(&sig), Relaxed);
                tally(&mut seen.lock().unwrap(), &sig);
            }
        })
    };

    let (mut kills, mut stops, mut starts) = (0, 0, 0);
    for step in 0..steps {
        tokio::time::sleep(Duration::from_millis(1_000 + rng.below(2_500))).await;
        let now = Instant::now();
        // Stopped mergers whose time is up go on.
        for s in slots.iter_mut() {
            if s.stopped_until.is_some_and(|t| t <= now) {
                s.service.as_ref().unwrap().signal("-CONT");
                s.stopped_until = None;
            }
        }
        let k = rng.below(3) as usize;
        let action = match (&slots[k].service, slots[k].stopped_until) {
            (None, _) => {
                slots[k].port = free_port();
                slots[k].service = Some(start(k, slots[k].port));
                starts += 1;
                "started"
            }
            (Some(_), Some(_)) => "left stopped",
            (Some(s), None) if rng.below(2) == 0 => {
                s.signal("-STOP");
                slots[k].stopped_until = Some(now + Duration::from_millis(1_000 + rng.below(11_000)));
                stops += 1;
                "stopped"
            }
            (Some(_), None) => {
                slots[k].service.take().unwrap().kill9();
                kills += 1;
                "killed"
            }
        };
        // No merger exits by itself, fenced or not.
        for (i, s) in slots.iter_mut().enumerate() {
            if let Some(svc) = s.service.as_mut() {
                if let Ok(Some(status)) = svc.child.try_wait() {
                    let log = std::fs::read_to_string(&svc.log).unwrap_or_default();
                    panic!("seed {seed}: merger {i} exited by itself ({status}):\n{log}");
                }
            }
        }
        let running = slots
            .iter()
            .filter(|s| s.service.is_some() && s.stopped_until.is_none())
            .count();
        eprintln!("[merger liveness] step {step}: merger {k} {action}; {running} running");
        if running > 0 {
            let before = out_calls.load(Relaxed);
            let out_calls = out_calls.clone();
            wait_until(
                &format!("seed {seed}, step {step}: the committed output to grow with {running} merger(s) running"),
                Duration::from_secs(90),
                || {
                    let out_calls = out_calls.clone();
                    async move { out_calls.load(Relaxed) > before }
                },
            )
            .await;
        }
    }
    // Everyone back, the load ends, and every call is there once.
    for (k, s) in slots.iter_mut().enumerate() {
        if s.stopped_until.take().is_some() {
            s.service.as_ref().unwrap().signal("-CONT");
        }
        if s.service.is_none() {
            s.port = free_port();
            s.service = Some(start(k, s.port));
        }
    }
    stop_load.store(true, Relaxed);
    tokio::task::spawn_blocking(move || load.join().expect("the load ran"))
        .await
        .unwrap();
    let want = sent.lock().unwrap().clone();
    let total: u64 = want.values().sum();
    wait_until(
        &format!("seed {seed}: every call sent on the signals topic"),
        Duration::from_secs(120),
        || {
            let out_calls = out_calls.clone();
            async move { out_calls.load(Relaxed) >= total }
        },
    )
    .await;
    // Quiet for 3 s: a call written twice would come now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    reader.abort();
    let calls: HashMap<String, u64> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(ep, s)| (ep.clone(), s.calls))
        .collect();
    for (ep, n) in &want {
        assert_eq!(
            calls[ep], *n,
            "seed {seed}: {ep} ({kills} kills, {stops} stops, {starts} starts)"
        );
    }
    let restarts: f64 = {
        let mut sum = 0.0;
        for s in &slots {
            sum += metric(s.port, "vitals_merger_restarts_total").await.unwrap_or(0.0);
        }
        sum
    };
    eprintln!(
        "[merger liveness] seed {seed}: {total} calls in = out over {steps} steps ({kills} kills, {stops} stops, {starts} starts; the last mergers started over {restarts} times)"
    );
}

/// Calls a record on the signals topic stands for.
fn super_calls(sig: &Signal) -> u64 {
    match sig {
        Signal::Call(_) => 1,
        Signal::Summary(s) => s.calls.total() as u64,
        _ => 0,
    }
}
