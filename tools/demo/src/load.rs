//! The load generator: an open loop of streamed completions through the router, per pool, at a
//! fixed rate (a slow call does not slow the load down), each call recorded as its user saw it.

use futures::StreamExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One call as its user saw it.
#[derive(Debug, Clone)]
pub struct Call {
    pub pool: String,
    pub started: Instant,
    /// The endpoint that served it (the router's `x-vitals-endpoint`, LiteLLM's
    /// `x-litellm-model-id`), if any.
    pub endpoint: Option<String>,
    /// 200 and the whole stream arrived.
    pub ok: bool,
    /// Time to the first content token of the stream.
    pub first_token: Option<Duration>,
}

#[derive(Default, Clone)]
pub struct Calls(Arc<Mutex<Vec<Call>>>);

impl Calls {
    fn push(&self, c: Call) {
        self.0.lock().expect("calls lock").push(c);
    }

    /// The calls of `pool` started in `[from, to)`.
    pub fn between(&self, pool: &str, from: Instant, to: Instant) -> Vec<Call> {
        self.0
            .lock()
            .expect("calls lock")
            .iter()
            .filter(|c| c.pool == pool && c.started >= from && c.started < to)
            .cloned()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.0.lock().expect("calls lock").len()
    }
}

/// The generator's stop flag.
#[derive(Clone, Default)]
struct Stop(Arc<AtomicBool>);

impl Stop {
    fn stop(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
    fn stopped(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

pub struct Generator {
    pub calls: Calls,
    stop: Stop,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Generator {
    /// `rate` calls a second to each `(pool, model)` through the router at `router`, with `key`
    /// as a bearer token when given (LiteLLM's proxy wants one).
    pub fn start(router: &str, key: Option<&str>, pools: &[(String, String)], rate: f64) -> Generator {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("an HTTP client");
        let calls = Calls::default();
        let stop = Stop::default();
        let url = format!("{}/v1/chat/completions", router.trim_end_matches('/'));
        let tasks = pools
            .iter()
            .map(|(pool, model)| {
                let (client, calls, stop, url, pool) =
                    (client.clone(), calls.clone(), stop.clone(), url.clone(), pool.clone());
                let key = key.map(str::to_owned);
                let body = serde_json::json!({
                    "model": model, "stream": true, "max_tokens": 6,
                    "messages": [{"role": "user", "content": "are you there?"}],
                });
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    while !stop.stopped() {
                        tick.tick().await;
                        let (client, calls, url, pool, body, key) = (
                            client.clone(),
                            calls.clone(),
                            url.clone(),
                            pool.clone(),
                            body.clone(),
                            key.clone(),
                        );
                        tokio::spawn(async move {
                            let started = Instant::now();
                            let call = one(&client, &url, key.as_deref(), &body, started).await;
                            calls.push(Call { pool, started, ..call });
                        });
                    }
                })
            })
            .collect();
        Generator { calls, stop, tasks }
    }

    pub async fn stop(self) {
        self.stop.stop();
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

async fn one(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &serde_json::Value,
    started: Instant,
) -> Call {
    let mut call = Call {
        pool: String::new(),
        started,
        endpoint: None,
        ok: false,
        first_token: None,
    };
    let mut req = client.post(url).json(body);
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    let Ok(r) = req.send().await else {
        return call;
    };
    call.endpoint = ["x-vitals-endpoint", "x-litellm-model-id"]
        .iter()
        .find_map(|h| r.headers().get(*h))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let status = r.status();
    let mut stream = r.bytes_stream();
    let mut whole = true;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(bytes) if call.first_token.is_none() && has_content(&bytes) => {
                call.first_token = Some(started.elapsed());
            }
            Ok(_) => {}
            Err(_) => whole = false,
        }
    }
    call.ok = status.is_success() && whole;
    call
}

/// Whether an SSE chunk carries content (`"content":"x…`, not the empty role chunk).
fn has_content(bytes: &[u8]) -> bool {
    const KEY: &[u8] = b"\"content\":\"";
    bytes
        .windows(KEY.len() + 1)
        .any(|w| w.starts_with(KEY) && w[KEY.len()] != b'"')
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_role_chunk_is_not_content() {
        assert!(!super::has_content(
            br#"data: {"choices":[{"delta":{"role":"assistant","content":""}}]}"#
        ));
        assert!(super::has_content(
            br#"data: {"choices":[{"delta":{"content":"tok "}}]}"#
        ));
    }
}
