//! Running one probe and classifying what it saw with the same outcome classes as call outcomes,
//! so that the engine treats both alike.

use crate::config::{Kind, Target};
use futures::StreamExt;
use std::time::Duration;
use tokio::time::Instant;
use vitals_contracts::{DependencyReport, DependencyStatus, OutcomeClass};

/// Most bytes of a probe's answer that are read (a health body, a deep-health document).
const MAX_BODY: usize = 1 << 20;
/// Most dependencies a result carries (the contracts' bound).
const MAX_DEPENDENCIES: usize = 64;

/// What one probe observed.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub outcome: OutcomeClass,
    pub http_status: Option<u16>,
    pub latency: Duration,
    /// Request start → first content token (completions).
    pub ttft: Option<Duration>,
    /// Mean time between output tokens after the first (completions).
    pub tpot: Option<Duration>,
    /// Output tokens received (completions), for the token budget.
    pub tokens: u64,
    pub dependencies: Vec<DependencyReport>,
    pub detail: String,
}

impl Observation {
    fn new(outcome: OutcomeClass, started: Instant, detail: impl Into<String>) -> Observation {
        Observation {
            outcome,
            http_status: None,
            latency: started.elapsed(),
            ttft: None,
            tpot: None,
            tokens: 0,
            dependencies: Vec::new(),
            detail: detail.into(),
        }
    }

    fn status(mut self, s: u16) -> Observation {
        self.http_status = Some(s);
        self
    }
}

/// The prober's HTTP clients: its own connection pool (never shared with gateway traffic), and
/// one that opens a new connection for every probe.
#[derive(Clone)]
pub struct Clients {
    pooled: reqwest::Client,
    fresh: reqwest::Client,
}

impl Clients {
    pub fn new() -> anyhow::Result<Clients> {
        let base = || {
            reqwest::Client::builder()
                .user_agent("vitals-prober")
                .redirect(reqwest::redirect::Policy::none())
                .tcp_nodelay(true)
        };
        Ok(Clients {
            pooled: base().pool_idle_timeout(Duration::from_secs(90)).build()?,
            fresh: base().pool_max_idle_per_host(0).build()?,
        })
    }

    fn for_target(&self, t: &Target) -> &reqwest::Client {
        if t.fresh_connection {
            &self.fresh
        } else {
            &self.pooled
        }
    }

    /// Run one probe of `t`, bounded by its timeout. `nonce` goes into a completion's prompt so
    /// that no cache can answer it.
    pub async fn probe(&self, t: &Target, nonce: u64) -> Observation {
        let started = Instant::now();
        let run = async {
            match t.kind {
                Kind::Tcp => tcp(t, started).await,
                Kind::Http => http(self.for_target(t), t, started).await,
                Kind::DeepHealth => deep_health(self.for_target(t), t, started).await,
                Kind::Completion => completion(self.for_target(t), t, started, nonce).await,
            }
        };
        match tokio::time::timeout(t.timeout, run).await {
            Ok(o) => o,
            Err(_) => Observation::new(
                OutcomeClass::Timeout,
                started,
                format!("no answer within {} ms", t.timeout.as_millis()),
            ),
        }
    }
}

/// The class of a request that failed before an answer.
fn transport(e: &reqwest::Error, started: Instant) -> Observation {
    let class = if e.is_timeout() {
        OutcomeClass::Timeout
    } else if e.is_connect() {
        OutcomeClass::ConnectError
    } else {
        // The connection closed or broke before a whole answer arrived.
        OutcomeClass::ConnectionDropped
    };
    Observation::new(class, started, error_chain(e))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s.chars().take(512).collect()
}

/// The class of an answer whose status did not pass.
fn status_class(status: u16) -> OutcomeClass {
    match status {
        429 => OutcomeClass::RateLimited,
        500..=599 => OutcomeClass::ServerError,
        _ => OutcomeClass::InvalidResponse,
    }
}

/// Read a body up to [`MAX_BODY`]; a connection that breaks mid-body is a dropped connection.
async fn body(r: reqwest::Response, started: Instant, status: u16) -> Result<Vec<u8>, Observation> {
    let mut out = Vec::new();
    let mut stream = r.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| transport(&e, started).status(status))?;
        let room = MAX_BODY - out.len();
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() >= MAX_BODY {
            break;
        }
    }
    Ok(out)
}

async fn tcp(t: &Target, started: Instant) -> Observation {
    match tokio::net::TcpStream::connect(&t.address).await {
        Ok(_) => Observation::new(OutcomeClass::Success, started, ""),
        Err(e) => Observation::new(
            OutcomeClass::ConnectError,
            started,
            format!("connect {}: {e}", t.address),
        ),
    }
}

fn request(client: &reqwest::Client, t: &Target, method: &str) -> reqwest::RequestBuilder {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap_or(reqwest::Method::GET);
    t.headers
        .iter()
        .fold(client.request(method, &t.address), |r, (k, v)| r.header(k, v))
}

/// Send a request and read its answer: (status, body), or what went wrong on the way.
async fn fetch(
    client: &reqwest::Client,
    t: &Target,
    method: &str,
    started: Instant,
) -> Result<(u16, Vec<u8>), Observation> {
    let r = request(client, t, method)
        .send()
        .await
        .map_err(|e| transport(&e, started))?;
    let status = r.status().as_u16();
    Ok((status, body(r, started, status).await?))
}

async fn http(client: &reqwest::Client, t: &Target, started: Instant) -> Observation {
    let (status, bytes) = match fetch(client, t, &t.method, started).await {
        Ok(answer) => answer,
        Err(o) => return o,
    };
    if !t.status_passes(status) {
        return Observation::new(status_class(status), started, format!("status {status}")).status(status);
    }
    if let Some(re) = &t.body_regex {
        let text = String::from_utf8_lossy(&bytes);
        if !re.is_match(&text) {
            return Observation::new(
                OutcomeClass::InvalidResponse,
                started,
                format!("body does not match /{}/", re.as_str()),
            )
            .status(status);
        }
    }
    if let Some((pointer, expected)) = &t.body_json {
        let found = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v.pointer(pointer).cloned());
        if found.as_ref() != Some(expected) {
            return Observation::new(
                OutcomeClass::InvalidResponse,
                started,
                format!("body {pointer} is {found:?}, not {expected}"),
            )
            .status(status);
        }
    }
    Observation::new(OutcomeClass::Success, started, "").status(status)
}

/// The dependencies a deep-health document lists, if it is one.
fn dependencies(bytes: &[u8]) -> Option<Vec<DependencyReport>> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let list = v.get("dependencies")?.as_array()?;
    list.iter()
        .take(MAX_DEPENDENCIES)
        .map(|d| {
            let status = match d.get("status")?.as_str()?.to_ascii_lowercase().as_str() {
                "up" | "ok" | "healthy" => DependencyStatus::Up,
                "degraded" => DependencyStatus::Degraded,
                "down" | "unhealthy" | "failed" => DependencyStatus::Down,
                _ => return None,
            };
            Some(DependencyReport {
                name: d.get("name")?.as_str()?.chars().take(256).collect(),
                critical: d.get("critical").and_then(serde_json::Value::as_bool).unwrap_or(false),
                status,
            })
        })
        .collect()
}

/// A deep-health probe: the document's dependencies go into the result, and the engine decides
/// on them (a critical one down ejects). A document is a success whatever its status (a 503 that
/// explains itself); without one, the status decides.
async fn deep_health(client: &reqwest::Client, t: &Target, started: Instant) -> Observation {
    let (status, bytes) = match fetch(client, t, "GET", started).await {
        Ok(answer) => answer,
        Err(o) => return o,
    };
    match dependencies(&bytes) {
        Some(deps) => {
            let down: Vec<&str> = deps
                .iter()
                .filter(|d| d.status == DependencyStatus::Down)
                .map(|d| d.name.as_str())
                .collect();
            let mut o = Observation::new(
                OutcomeClass::Success,
                started,
                if down.is_empty() {
                    String::new()
                } else {
                    format!("down: {}", down.join(", "))
                },
            )
            .status(status);
            o.dependencies = deps;
            o
        }
        None if (200..300).contains(&status) => Observation::new(
            OutcomeClass::InvalidResponse,
            started,
            "no dependencies in the deep-health answer",
        )
        .status(status),
        None => Observation::new(status_class(status), started, format!("status {status}")).status(status),
    }
}

/// A streamed chat completion with a nonce in the prompt: the first content token's time and
/// the time per output token after it.
async fn completion(client: &reqwest::Client, t: &Target, started: Instant, nonce: u64) -> Observation {
    let body = serde_json::json!({
        "model": t.model,
        "stream": true,
        "max_tokens": t.max_tokens,
        "messages": [{"role": "user", "content": format!("vitals probe {nonce:016x}: answer with one word.")}],
    });
    let r = match request(client, t, "POST").json(&body).send().await {
        Ok(r) => r,
        Err(e) => return transport(&e, started),
    };
    let status = r.status().as_u16();
    if !(200..300).contains(&status) {
        let class = match status {
            400..=499 if status != 429 => OutcomeClass::InvalidResponse,
            s => status_class(s),
        };
        return Observation::new(class, started, format!("status {status}")).status(status);
    }
    let mut stream = r.bytes_stream();
    let mut buf = Vec::new();
    let (mut first, mut last, mut tokens, mut done) = (None, None, 0u64, false);
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                let mut o = transport(&e, started).status(status);
                o.ttft = first.map(|f: Instant| f - started);
                o.tokens = tokens;
                return o;
            }
        };
        let now = Instant::now();
        buf.extend_from_slice(&chunk);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            for line in String::from_utf8_lossy(&event).lines() {
                let Some(data) = line.strip_prefix("data:").map(str::trim) else {
                    continue;
                };
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let Ok(v) = serde_json::from_str::<serde_json::Value>(data) else {
                    continue;
                };
                let content = v["choices"][0]["delta"]["content"].as_str().unwrap_or("");
                if !content.is_empty() {
                    first.get_or_insert(now);
                    last = Some(now);
                    tokens += 1;
                }
            }
        }
        if buf.len() > MAX_BODY {
            break;
        }
    }
    let mut o = match (first, done) {
        (Some(_), true) => Observation::new(OutcomeClass::Success, started, ""),
        (None, _) => Observation::new(OutcomeClass::InvalidResponse, started, "no content token"),
        (Some(_), false) => Observation::new(OutcomeClass::ConnectionDropped, started, "stream ended without [DONE]"),
    }
    .status(status);
    o.ttft = first.map(|f| f - started);
    if let (Some(f), Some(l)) = (first, last) {
        if tokens > 1 {
            o.tpot = Some((l - f) / (tokens as u32 - 1));
        }
    }
    o.tokens = tokens;
    o
}
