//! The schedule in-process, against the simulator, with results into a channel: starts spread
//! over the interval, no two probes of a target in flight, reloads that keep unchanged targets'
//! cadence, the adaptive cadence, and the token budget.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use vitals_contracts::{HealthState, OutcomeClass, ProbeResult};
use vitals_prober::config::{parse, Target};
use vitals_prober::metrics::Metrics;
use vitals_prober::probe::Clients;
use vitals_prober::schedule::{Context, Scheduler};
use vitals_prober::sink::ChannelSink;
use vitals_prober::view::CadenceView;
use vitals_upstream_sim::{Behaviour, Sim, SimConfig};

struct Rig {
    sim: Sim,
    view: Arc<CadenceView>,
    metrics: Arc<Metrics>,
    scheduler: Scheduler,
    rx: mpsc::UnboundedReceiver<ProbeResult>,
}

async fn rig(behaviour: Behaviour) -> Rig {
    let mut c = SimConfig::healthy(1, 1);
    c.endpoints[0].behaviour = behaviour;
    let sim = Sim::start(c).await.unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let view = Arc::new(CadenceView::default());
    let metrics = Arc::new(Metrics::default());
    let ctx = Arc::new(Context::new(
        "test/p1".into(),
        Clients::new().unwrap(),
        Arc::new(ChannelSink(tx)),
        view.clone(),
        metrics.clone(),
    ));
    Rig {
        sim,
        view,
        metrics,
        scheduler: Scheduler::new(ctx),
        rx,
    }
}

fn targets(sim: &Sim, n: usize, extra: &str) -> Vec<Target> {
    let addr = sim.addr("e0").unwrap();
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&format!(
            "[[target]]\nid = \"t{i:02}\"\npool = \"p\"\nendpoint = \"ep{i:02}\"\nkind = \"http\"\nurl = \"http://{addr}/health\"\n{extra}\n"
        ));
    }
    parse(&text).unwrap()
}

/// Every result that arrives within `span`.
async fn collect(rx: &mut mpsc::UnboundedReceiver<ProbeResult>, span: Duration) -> Vec<ProbeResult> {
    let end = tokio::time::Instant::now() + span;
    let mut out = Vec::new();
    while let Ok(Some(r)) = tokio::time::timeout_at(end, rx.recv()).await {
        out.push(r);
    }
    out
}

fn by_target(results: &[ProbeResult]) -> BTreeMap<String, Vec<&ProbeResult>> {
    let mut m: BTreeMap<String, Vec<&ProbeResult>> = BTreeMap::new();
    for r in results {
        m.entry(r.endpoint.clone()).or_default().push(r);
    }
    m
}

#[tokio::test]
async fn first_probes_spread_over_the_interval_and_keep_their_cadence() {
    let mut r = rig(Behaviour::default()).await;
    let t = targets(
        &r.sim,
        20,
        "interval_ms = 1000\ntimeout_ms = 500\nfast_interval_ms = 1000",
    );
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    r.scheduler.reconcile(&t, |_| true);
    let results = collect(&mut r.rx, Duration::from_millis(3_500)).await;
    let per = by_target(&results);
    assert_eq!(per.len(), 20);
    let mut firsts: Vec<i64> = per.values().map(|v| v[0].occurred_at - start).collect();
    firsts.sort();
    // Spread: the first probes of 20 targets cover most of the 1 s interval, none bunched.
    assert!(firsts[19] - firsts[0] > 600_000, "{firsts:?}");
    let bunched = firsts.windows(5).filter(|w| w[4] - w[0] < 10_000).count();
    assert_eq!(bunched, 0, "five first probes within 10 ms: {firsts:?}");
    for (id, v) in &per {
        assert!((3..=4).contains(&v.len()), "{id}: {} probes in 3.5 s", v.len());
        for w in v.windows(2) {
            let gap = w[1].occurred_at - w[0].occurred_at;
            assert!((930_000..=1_070_000).contains(&gap), "{id}: {gap} µs apart");
        }
    }
    assert!(results
        .iter()
        .all(|p| p.outcome == OutcomeClass::Success && p.interval_ms == Some(1000)));
    r.scheduler.stop().await;
    r.sim.shutdown().await;
}

#[tokio::test]
async fn a_slow_probe_is_never_overlapped_by_the_next() {
    // Each completion takes ~300 ms against a 400 ms interval with ±5 % jitter.
    let mut r = rig(Behaviour {
        ttft_ms: 280,
        tokens: 2,
        token_ms: 10,
        ..Behaviour::default()
    })
    .await;
    let addr = r.sim.addr("e0").unwrap();
    let t = parse(&format!(
        "[[target]]\nid = \"slow\"\npool = \"p\"\nendpoint = \"e\"\nkind = \"completion\"\nurl = \"http://{addr}/v1/chat/completions\"\nmodel = \"m\"\ninterval_ms = 400\nfast_interval_ms = 400\ntimeout_ms = 350\n"
    ))
    .unwrap();
    r.scheduler.reconcile(&t, |_| true);
    let results = collect(&mut r.rx, Duration::from_millis(2_500)).await;
    assert!(results.len() >= 5, "{}", results.len());
    for w in results.windows(2) {
        assert!(
            w[1].occurred_at >= w[0].occurred_at + w[0].latency_us,
            "a probe began before the previous one ended: {} < {} + {}",
            w[1].occurred_at,
            w[0].occurred_at,
            w[0].latency_us
        );
    }
    assert_eq!(
        r.sim.requests("e0"),
        results.len() as u64 + u64::from(r.metrics.in_flight.get() as u32)
    );
    r.scheduler.stop().await;
    r.sim.shutdown().await;
}

#[tokio::test]
async fn a_reload_keeps_unchanged_targets_and_applies_the_rest() {
    let mut r = rig(Behaviour::default()).await;
    let before = targets(&r.sim, 3, "interval_ms = 300\ntimeout_ms = 200");
    r.scheduler.reconcile(&before, |_| true);
    let first = collect(&mut r.rx, Duration::from_millis(1_000)).await;
    let last_t0 = by_target(&first)["ep00"].last().unwrap().occurred_at;
    // ep01 goes, ep02 changes its interval, ep03 comes; ep00 is the same.
    let mut after = targets(&r.sim, 4, "interval_ms = 300\ntimeout_ms = 200");
    after.remove(1);
    after[1] = targets(&r.sim, 3, "interval_ms = 600\ntimeout_ms = 200").remove(2);
    r.scheduler.reconcile(&after, |_| true);
    assert_eq!(r.scheduler.running(), vec!["t00", "t02", "t03"]);
    let second = collect(&mut r.rx, Duration::from_millis(1_300)).await;
    let per = by_target(&second);
    assert!(
        !per.contains_key("ep01") || per["ep01"].len() <= 1,
        "ep01 stopped (one in flight at most)"
    );
    let gap = per["ep00"][0].occurred_at - last_t0;
    assert!(
        (280_000..=320_000).contains(&gap),
        "ep00 kept its cadence across the reload: {gap} µs"
    );
    assert!(per["ep02"].iter().all(|p| p.interval_ms == Some(600)));
    assert!(per.contains_key("ep03"));
    r.scheduler.stop().await;
    r.sim.shutdown().await;
}

#[tokio::test]
async fn an_endpoint_that_is_not_healthy_is_probed_at_the_fast_interval_at_once() {
    let mut r = rig(Behaviour::default()).await;
    let t = targets(
        &r.sim,
        1,
        "interval_ms = 2000\nfast_interval_ms = 200\ntimeout_ms = 150",
    );
    r.scheduler.reconcile(&t, |_| true);
    let slow = collect(&mut r.rx, Duration::from_millis(2_500)).await;
    assert!((1..=2).contains(&slow.len()), "{}", slow.len());
    r.view.set("p", "ep00", HealthState::Unhealthy);
    let fast = collect(&mut r.rx, Duration::from_millis(1_000)).await;
    assert!(fast.len() >= 4, "{} probes in 1 s at 200 ms", fast.len());
    assert_eq!(fast[0].interval_ms, Some(200));
    let since_last = fast[0].occurred_at - slow.last().unwrap().occurred_at;
    assert!(
        since_last < 2_000_000,
        "the next probe did not wait for the slow interval"
    );
    r.view.set("p", "ep00", HealthState::Healthy);
    let _ = collect(&mut r.rx, Duration::from_millis(300)).await;
    let back = collect(&mut r.rx, Duration::from_millis(1_500)).await;
    assert!(back.len() <= 1, "slow again: {}", back.len());
    r.scheduler.stop().await;
    r.sim.shutdown().await;
}

#[tokio::test]
async fn completions_stop_when_the_daily_token_budget_is_spent() {
    let mut r = rig(Behaviour {
        ttft_ms: 10,
        tokens: 5,
        token_ms: 1,
        ..Behaviour::default()
    })
    .await;
    let addr = r.sim.addr("e0").unwrap();
    // 20 prompt + 5 output tokens a probe: a budget of 80 pays for three.
    let t = parse(&format!(
        "[[target]]\nid = \"c\"\npool = \"p\"\nendpoint = \"e\"\nkind = \"completion\"\nurl = \"http://{addr}/v1/chat/completions\"\nmodel = \"m\"\nmax_tokens = 5\ndaily_token_budget = 80\ninterval_ms = 150\nfast_interval_ms = 150\ntimeout_ms = 100\n"
    ))
    .unwrap();
    r.scheduler.reconcile(&t, |_| true);
    let results = collect(&mut r.rx, Duration::from_millis(1_500)).await;
    assert_eq!(results.len(), 3, "{results:?}");
    assert!(r.metrics.budget_skipped.get() >= 3);
    r.scheduler.stop().await;
    r.sim.shutdown().await;
}

#[tokio::test]
async fn a_healthy_endpoint_with_gateway_traffic_is_probed_slower_and_its_completions_are_covered() {
    let mut r = rig(Behaviour {
        ttft_ms: 5,
        tokens: 1,
        ..Behaviour::default()
    })
    .await;
    let addr = r.sim.addr("e0").unwrap();
    let t = parse(&format!(
        "[defaults]\ninterval_ms = 300\nfast_interval_ms = 300\ntraffic_interval_ms = 1500\ntimeout_ms = 200\n\
         [[target]]\nid = \"h\"\npool = \"p\"\nendpoint = \"busy\"\nkind = \"http\"\nurl = \"http://{addr}/health\"\n\
         [[target]]\nid = \"c\"\npool = \"p\"\nendpoint = \"busy\"\nkind = \"completion\"\nurl = \"http://{addr}/v1/chat/completions\"\nmodel = \"m\"\n"
    ))
    .unwrap();
    // Gateway calls with first-token times: enough to count as traffic before the first probe
    // (three per plain interval over the traffic interval: 15), then every 50 ms for 3 s.
    for _ in 0..16 {
        r.view.saw_call("p", "busy", true);
    }
    let view = r.view.clone();
    let feeder = tokio::spawn(async move {
        for _ in 0..60 {
            view.saw_call("p", "busy", true);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    r.scheduler.reconcile(&t, |_| true);
    let busy = collect(&mut r.rx, Duration::from_millis(2_500)).await;
    let health = busy.iter().filter(|p| p.probe_id.contains("/h/")).count();
    let completions = busy.iter().filter(|p| p.probe_id.contains("/c/")).count();
    assert!(
        health <= 3,
        "{health} health probes in 2.5 s at the 1.5 s traffic interval"
    );
    assert_eq!(completions, 0, "real calls bring first tokens: no synthetic completion");
    assert!(r.metrics.covered_skipped.get() >= 1);
    feeder.await.unwrap();
    // The calls stop: completions come back at the plain interval.
    let idle = collect(&mut r.rx, Duration::from_millis(2_500)).await;
    let completions = idle.iter().filter(|p| p.probe_id.contains("/c/")).count();
    assert!(completions >= 3, "{completions} completions after the traffic stopped");
    r.scheduler.stop().await;
    r.sim.shutdown().await;
}
