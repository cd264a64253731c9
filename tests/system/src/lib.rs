//! What the system tests of gateways share (tests/litellm.rs, tests/haproxy.rs): the processor,
//! the prober and three simulated endpoints of one pool on the real broker and database, the
//! reports on the signals topic, and the calls as a gateway saw them. Needs the local stack: run
//! `scripts/test.sh`.

use rdkafka::consumer::Consumer;
use rdkafka::Message;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vitals_contracts::{decode_signal, CallOutcome, Signal};
use vitals_testkit::{brokers, free_port, http_get, unique, wait_until, Service, Stamp, Topics};
use vitals_upstream_sim::{Behaviour, Sim, SimConfig};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A program of the LiteLLM virtual environment (`scripts/install-deps.sh`): its Python with
/// LiteLLM, vitals-litellm and the OpenTelemetry SDK installed, or `litellm`.
pub fn venv_bin(name: &str) -> PathBuf {
    let dir = std::env::var("VITALS_LITELLM_VENV").unwrap_or_else(|_| "/opt/vitals-litellm-venv".into());
    let p = PathBuf::from(dir).join("bin").join(name);
    assert!(
        p.exists(),
        "{} is missing: run scripts/install-deps.sh (it makes LiteLLM's virtual environment)",
        p.display()
    );
    p
}

/// A program the test started, killed when the test ends however it ends (a panicking test
/// left its LiteLLM proxy running, holding its port and its Kafka producer).
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

pub fn flags(pairs: &[(&str, &str)]) -> Vec<String> {
    pairs.iter().flat_map(|(k, v)| [k.to_string(), v.to_string()]).collect()
}

pub fn healthy() -> Behaviour {
    Behaviour {
        ttft_ms: 30,
        tokens: 2,
        token_ms: 5,
        ..Behaviour::default()
    }
}

/// The processor, the prober and three simulated deployments e0, e1, e2 of one pool.
pub struct Stack {
    pub sim: Sim,
    pub topics: Topics,
    pub schema: String,
    pub db: sqlx::PgPool,
    pub processor: Service,
    _prober: Option<Service>,
}

impl Stack {
    /// With a prober that readmits a healed deployment.
    pub async fn start(name: &str, pool: &str) -> Stack {
        Stack::start_with(name, pool, true).await
    }

    /// With no prober: what readmits an endpoint is the gateway's own trial call.
    pub async fn start_without_prober(name: &str, pool: &str) -> Stack {
        Stack::start_with(name, pool, false).await
    }

    async fn start_with(name: &str, pool: &str, prober: bool) -> Stack {
        let mut sc = SimConfig::healthy(3, 7);
        for e in &mut sc.endpoints {
            e.behaviour = healthy();
        }
        let sim = Sim::start(sc).await.unwrap();
        let topics = Topics::create(&unique(name), 2, Stamp::LogAppendTime).await;
        let schema = unique(name);
        let db = vitals_testkit::migrated_schema(&schema).await;
        let processor = vitals_testkit::start_processor(
            &topics,
            &unique(&format!("{name}_proc")),
            &schema,
            &["--view-tick-interval-ms", "1000", "--tick-interval-ms", "1000"],
        );
        let prober = if prober {
            Some(Stack::start_prober(name, pool, &sim, &topics).await)
        } else {
            None
        };
        Stack {
            sim,
            topics,
            schema,
            db,
            processor,
            _prober: prober,
        }
    }

    /// A prober that readmits a healed deployment (health route, one a second, fast while out).
    async fn start_prober(name: &str, pool: &str, sim: &Sim, topics: &Topics) -> Service {
        let cfg = std::env::temp_dir().join(format!("{}.toml", unique(name)));
        let mut targets = String::from("[defaults]\ninterval_ms = 1000\nfast_interval_ms = 200\ntimeout_ms = 150\n");
        for (ep, addr) in sim.endpoints() {
            targets.push_str(&format!(
                "[[target]]\nid = \"{ep}\"\npool = \"{pool}\"\nendpoint = \"{ep}\"\nkind = \"http\"\nurl = \"http://{addr}/health\"\n"
            ));
        }
        std::fs::write(&cfg, targets).unwrap();
        let prober_port = free_port();
        let b = brokers();
        let prober = Service::start(
            "vitals-prober",
            &format!("{name}-prober"),
            &flags(&[
                ("--config", cfg.to_str().unwrap()),
                ("--name", &unique("p")),
                ("--brokers", &b),
                ("--signals-topic", &topics.signals),
                ("--state-topic", &topics.state),
                ("--shard-topic", &unique(&format!("{name}_shards"))),
                ("--http-addr", &format!("127.0.0.1:{prober_port}")),
            ]),
        );
        wait_until("prober ready", Duration::from_secs(30), || async move {
            http_get(prober_port, "/readyz").await.as_deref() == Some("ready")
        })
        .await;
        prober
    }

    pub fn set(&self, ep: &str, b: Behaviour) {
        self.sim.set(ep, b).unwrap();
    }

    /// The transitions of `ep` into `to` (time in unix seconds, trigger ids, first-token p50).
    pub async fn transitions(&self, ep: &str, to: &str) -> Vec<(f64, Vec<String>, Option<f64>)> {
        sqlx::query_as::<_, (f64, Vec<String>, Option<f64>)>(
            "SELECT extract(epoch FROM stream_time)::float8, trigger_ids, (evidence->>'ttft_p50_ms')::float8 FROM transitions \
             WHERE endpoint = $1 AND to_state = $2 ORDER BY seq",
        )
        .bind(ep)
        .bind(to)
        .fetch_all(&self.db)
        .await
        .unwrap()
    }

    /// The first transition of `ep` into `to` after `since` (unix s), waiting up to `within`.
    pub async fn transition_after(
        &self,
        ep: &str,
        to: &str,
        since: f64,
        within: Duration,
    ) -> (f64, Vec<String>, Option<f64>) {
        let found = Arc::new(Mutex::new(None));
        let f = found.clone();
        wait_until(&format!("{ep} {to}"), within, || {
            let f = f.clone();
            async move {
                let t = self.transitions(ep, to).await.into_iter().find(|t| t.0 >= since);
                let got = t.is_some();
                *f.lock().unwrap() = t;
                got
            }
        })
        .await;
        let t = found.lock().unwrap().take().unwrap();
        t
    }

    pub async fn finish(self) {
        vitals_testkit::drop_schema(&self.db, &self.schema).await;
        self.sim.shutdown().await;
    }
}

/// The call reports on the signals topic so far, by event id: each partition read until a record
/// appended after the call (the processor's ticks keep coming), or 3 s of silence.
pub async fn reports(topics: &Topics) -> HashMap<String, CallOutcome> {
    let c = vitals_testkit::consumer(&unique("litellm_reader"));
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..topics.partitions {
        tpl.add_partition_offset(&topics.signals, p, rdkafka::Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut out = HashMap::new();
    let until_ms = (unix_now() * 1e3) as i64;
    let mut done = std::collections::HashSet::new();
    while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(3), c.recv()).await {
        if let Some(Ok(Signal::Call(call))) = m.payload().map(decode_signal) {
            out.insert(call.event_id.clone(), call);
        }
        if m.timestamp().to_millis().is_some_and(|t| t > until_ms) {
            done.insert(m.partition());
            if done.len() == topics.partitions as usize {
                break;
            }
        }
    }
    out
}

/// The reports among an ejection's trigger ids that came from `gateway`.
pub async fn evidence_from(stack: &Stack, triggers: &[String], gateway: &str) -> Vec<CallOutcome> {
    let mut reported = reports(&stack.topics).await;
    triggers
        .iter()
        .filter_map(|id| reported.remove(id))
        .filter(|c| c.gateway == gateway)
        .collect()
}

/// Calls as their gateway saw them: (start, unix s; deployment that served or was tried; ok).
#[derive(Clone, Default)]
pub struct Seen(pub Arc<Mutex<Vec<(f64, String, bool)>>>);

impl Seen {
    pub fn push(&self, t: f64, dep: String, ok: bool) {
        self.0.lock().unwrap().push((t, dep, ok));
    }
    /// Calls started at or after `since`, by deployment.
    pub fn by_deployment(&self, since: f64) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for (_, d, _) in self.0.lock().unwrap().iter().filter(|(t, _, _)| *t >= since) {
            *m.entry(d.clone()).or_default() += 1;
        }
        m
    }
    pub fn failed(&self, since: f64) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _, ok)| *t >= since && !ok)
            .count()
    }
    pub fn last(&self, dep: &str, since: f64) -> Option<f64> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, d, _)| *t >= since && d == dep)
            .map(|(t, _, _)| *t)
            .fold(None, |a: Option<f64>, t| Some(a.map_or(t, |a| a.max(t))))
    }
    /// Wait until the latest `calls` calls (by start, all started after `since`) went to other
    /// deployments than `dep`; then the time of the last attempt `dep` got after `since`. A count
    /// of calls, not a quiet time: on a busy machine the load makes fewer calls a second, and
    /// what matters is what the gateway chose, not how fast it was asked.
    pub async fn wait_left_out(&self, dep: &str, since: f64, calls: usize, within: Duration) -> f64 {
        let s = self.clone();
        wait_until(&format!("{dep} left out of {calls} calls in a row"), within, || {
            let out = s.latest(since, calls).is_some_and(|l| l.iter().all(|(d, _)| d != dep));
            async move { out }
        })
        .await;
        self.last(dep, since).unwrap_or(since)
    }

    /// The latest `n` calls started after `since` (by start, newest first): (deployment, ok);
    /// None while there are fewer.
    pub fn latest(&self, since: f64, n: usize) -> Option<Vec<(String, bool)>> {
        let mut v: Vec<(f64, String, bool)> = self
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _, _)| *t > since)
            .cloned()
            .collect();
        v.sort_by(|a, b| b.0.total_cmp(&a.0));
        (v.len() >= n).then(|| v.into_iter().take(n).map(|(_, d, ok)| (d, ok)).collect())
    }

    pub async fn wait_chosen(&self, dep: &str, since: f64, within: Duration) -> f64 {
        let s = self.clone();
        wait_until(&format!("{dep} chosen again"), within, || {
            let got = s.last(dep, since).is_some();
            async move { got }
        })
        .await;
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, d, _)| *t >= since && d == dep)
            .map(|(t, _, _)| *t)
            .fold(f64::MAX, f64::min)
    }
}

/// Where a test reads what a gateway chose: the calls its clients saw ([`Seen`], by the
/// response header naming the server), or the gateway's own reports on the signals topic (what
/// it chose whatever its clients saw: on a starved machine a client may time out on calls the
/// gateway routed well).
#[derive(Clone, Copy)]
pub enum Choices<'a> {
    Seen(&'a Seen),
    Reports { topics: &'a Topics, gateway: &'a str },
}

impl Choices<'_> {
    /// Wait until the latest `calls` calls after `since` (unix s) all went to other endpoints
    /// than `ep`; then the start of the last call `ep` got after `since`, or `since`.
    pub async fn left_out(&self, ep: &str, since: f64, calls: usize, within: Duration) -> f64 {
        let (topics, gateway) = match *self {
            Choices::Seen(seen) => return seen.wait_left_out(ep, since, calls, within).await,
            Choices::Reports { topics, gateway } => (topics, gateway),
        };
        let last = Mutex::new(since);
        wait_until(
            &format!("{gateway}'s reports leaving {ep} out of {calls} calls in a row"),
            within,
            || async {
                let mine = reported_calls(topics, gateway, since).await;
                if let Some((t, _)) = mine.iter().find(|(_, e)| e == ep) {
                    *last.lock().unwrap() = *t;
                }
                mine.len() >= calls && mine.iter().take(calls).all(|(_, e)| e != ep)
            },
        )
        .await;
        let t = *last.lock().unwrap();
        t
    }

    /// Wait until `ep` gets a call after `since`; the start of the first.
    pub async fn chosen(&self, ep: &str, since: f64, within: Duration) -> f64 {
        let (topics, gateway) = match *self {
            Choices::Seen(seen) => return seen.wait_chosen(ep, since, within).await,
            Choices::Reports { topics, gateway } => (topics, gateway),
        };
        let first = Mutex::new(None);
        wait_until(&format!("{gateway}'s reports choosing {ep} again"), within, || async {
            let t = reported_calls(topics, gateway, since)
                .await
                .into_iter()
                .filter(|(_, e)| e == ep)
                .map(|(t, _)| t)
                .reduce(f64::min);
            *first.lock().unwrap() = t;
            t.is_some()
        })
        .await;
        let t = first.lock().unwrap().take().unwrap();
        t
    }
}

/// `gateway`'s reported calls after `since` (unix s), newest first: (when, endpoint).
async fn reported_calls(topics: &Topics, gateway: &str, since: f64) -> Vec<(f64, String)> {
    let mut mine: Vec<(f64, String)> = reports(topics)
        .await
        .into_values()
        .filter(|c| c.gateway == gateway)
        .map(|c| (c.occurred_at as f64 / 1e6, c.endpoint))
        .filter(|(t, _)| *t >= since)
        .collect();
    mine.sort_by(|a, b| b.0.total_cmp(&a.0));
    mine
}

/// Calls in a row that must go elsewhere for an endpoint to count as left out: with three
/// deployments shared evenly, 20 in a row miss one by chance 0.03 % of the time.
pub const LEFT_OUT_CALLS: usize = 20;

/// Give `ep` a faulty behaviour; wait for its ejection and for the gateway to leave it out (20
/// calls in a row elsewhere); print both. The ejection's time, trigger ids and first-token p50.
pub async fn fault_left_out(
    stack: &Stack,
    choices: Choices<'_>,
    ep: &str,
    fault: Behaviour,
    what: &str,
) -> (f64, Vec<String>, Option<f64>) {
    stack.set(ep, fault);
    let at = unix_now();
    // Bounds for a busy machine, not figures: a gateway that routes around a slow deployment by
    // itself sends it few calls, so vitals' evidence on it gathers slowly when calls are slow.
    let ejection = stack
        .transition_after(ep, "unhealthy", at, Duration::from_secs(120))
        .await;
    let last = choices.left_out(ep, at, LEFT_OUT_CALLS, Duration::from_secs(120)).await;
    eprintln!(
        "{what}: {ep} ejected {:.1} s after the fault (first token p50 {:?} ms); the gateway's last attempt on it {:+.2} s from the ejection",
        ejection.0 - at,
        ejection.2,
        last - ejection.0
    );
    ejection
}

/// Heal `ep`; wait until the gateway chooses it again, and print after how long.
pub async fn healed_chosen(stack: &Stack, choices: Choices<'_>, ep: &str, what: &str) {
    stack.set(ep, healthy());
    let heal = unix_now();
    let back = choices.chosen(ep, heal, Duration::from_secs(60)).await;
    eprintln!("{what}: {ep} chosen again {:.1} s after the heal", back - heal);
}

/// Calls through a gateway at `url` (`POST /v1/chat/completions`, one every `every`), each
/// recorded in a [`Seen`] under the server the gateway names in its `header` (or `-`). Stops
/// when the returned guard is dropped.
pub fn drive(url: String, header: &'static str, every: Duration) -> (Seen, Driving) {
    let seen = Seen::default();
    let s = seen.clone();
    let task = tokio::spawn(async move {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let (client, s, url) = (client.clone(), s.clone(), url.clone());
            tokio::spawn(async move {
                let t = unix_now();
                let body = serde_json::json!({"model": "m", "max_tokens": 2, "messages": []});
                let (server, ok) = match client.post(&url).json(&body).send().await {
                    Ok(r) => {
                        let server = r
                            .headers()
                            .get(header)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("-")
                            .to_owned();
                        let ok = r.status().is_success();
                        let _ = r.bytes().await;
                        (server, ok)
                    }
                    Err(_) => ("-".to_owned(), false),
                };
                s.push(t, server, ok);
            });
        }
    });
    (seen, Driving(task))
}

/// Stops a [`drive`] when dropped.
pub struct Driving(tokio::task::JoinHandle<()>);

impl Drop for Driving {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Start `vitals-logbridge` on `inputs` (flags such as `--udp ADDR`), reporting to `topics` with
/// `map`; waits until it serves its metrics. Returns it and its HTTP port.
pub async fn start_logbridge(label: &str, topics: &Topics, map: &str, inputs: &[&str]) -> (Service, u16) {
    let map_file = std::env::temp_dir().join(format!("{}.toml", unique(label)));
    std::fs::write(&map_file, map).unwrap();
    let port = free_port();
    let mut args = flags(&[
        ("--brokers", &brokers()),
        ("--signals-topic", &topics.signals),
        ("--map", map_file.to_str().unwrap()),
        ("--http-addr", &format!("127.0.0.1:{port}")),
    ]);
    args.extend(inputs.iter().map(|s| s.to_string()));
    let bridge = Service::start("vitals-logbridge", label, &args);
    wait_until("the log bridge up", Duration::from_secs(30), || async move {
        http_get(port, "/readyz").await.as_deref() == Some("ready")
    })
    .await;
    (bridge, port)
}
