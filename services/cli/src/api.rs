//! The HTTP API's routes as verbs: tables for people, `--json` for scripts.

use anyhow::Context as _;
use chrono::{DateTime, SecondsFormat, Utc};
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::io::{IsTerminal, Write};
use std::time::Duration;
use vitals_contracts::view;

/// Where the API is and who we are.
pub struct Api {
    pub base: String,
    pub token: Option<String>,
    pub client: reqwest::Client,
}

/// An answer the API refused, with its status (the exit code tells which: see `main`).
#[derive(Debug)]
pub struct Refused {
    pub status: u16,
    pub message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the API answered {}: {}", self.status, self.message)
    }
}

impl std::error::Error for Refused {}

impl Api {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base.trim_end_matches('/'))
    }

    fn auth(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    async fn answer(&self, r: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        let resp = self
            .auth(r)
            .send()
            .await
            .with_context(|| format!("cannot reach the API at {}", self.base))?;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            let message = body["error"]["message"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| body.to_string());
            let field = body["error"]["field"]
                .as_str()
                .map(|f| format!(" (field {f})"))
                .unwrap_or_default();
            return Err(Refused {
                status: status.as_u16(),
                message: format!("{message}{field}"),
            }
            .into());
        }
        Ok(body)
    }

    pub async fn get(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<Value> {
        self.answer(self.client.get(self.url(path)).query(query)).await
    }

    /// A GET whose answer is one of the API's view types.
    pub async fn get_as<T: DeserializeOwned>(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<T> {
        typed(path, self.get(path, query).await?)
    }

    /// A PUT or POST answered with an `Accepted`.
    pub async fn send_accepted(&self, put: bool, path: &str, body: &Value) -> anyhow::Result<view::Accepted> {
        let v = if put {
            self.put(path, body).await?
        } else {
            self.post(path, body).await?
        };
        typed(path, v)
    }

    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.answer(self.client.post(self.url(path)).json(body)).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.answer(self.client.put(self.url(path)).json(body)).await
    }

    /// Follow `/v1/stream`, calling `each` with (event, data); resumes after a dropped
    /// connection from the last event id. Returns when `each` says stop.
    pub async fn tail(
        &self,
        query: &[(&str, String)],
        mut each: impl FnMut(&str, &Value) -> bool,
    ) -> anyhow::Result<()> {
        let mut last_id: Option<String> = None;
        let mut backoff = Duration::from_millis(200);
        loop {
            let mut req = self.client.get(self.url("/v1/stream")).query(query);
            if let Some(id) = &last_id {
                req = req.header("Last-Event-ID", id);
            }
            let resp = match self.auth(req).send().await {
                Ok(r) if r.status().is_success() => r,
                Ok(r) => {
                    let status = r.status().as_u16();
                    let body: Value = r.json().await.unwrap_or(Value::Null);
                    return Err(Refused {
                        status,
                        message: body["error"]["message"].as_str().unwrap_or("").to_owned(),
                    }
                    .into());
                }
                Err(e) => {
                    eprintln!("vitals tail: {e}; reconnecting in {backoff:?}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            backoff = Duration::from_millis(200);
            let mut stream = resp.bytes_stream();
            let mut pending = String::new();
            let (mut event, mut data, mut id) = (String::new(), String::new(), None::<String>);
            while let Some(chunk) = stream.next().await {
                let Ok(chunk) = chunk else { break };
                pending.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = pending.find('\n') {
                    let line: String = pending.drain(..=end).collect();
                    let line = line.trim_end_matches(['\n', '\r']);
                    if line.is_empty() {
                        if !data.is_empty() {
                            if let Some(i) = id.take() {
                                last_id = Some(i);
                            }
                            let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
                            if !each(&event, &v) {
                                return Ok(());
                            }
                        }
                        event.clear();
                        data.clear();
                    } else if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    } else if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().to_owned());
                    }
                }
            }
            eprintln!("vitals tail: the stream ended; reconnecting");
        }
    }
}

/// Print rows as an aligned table with a header.
/// `name` as one path segment (see [`vitals_contracts::keys::path_segment`]).
pub fn seg(name: &str) -> String {
    vitals_contracts::keys::path_segment(name)
}

pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = std::io::stdout().lock();
    let line = |cells: Vec<String>| -> String {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let _ = writeln!(out, "{}", line(header.iter().map(|h| h.to_uppercase()).collect()));
    for r in rows {
        let _ = writeln!(out, "{}", line(r.clone()));
    }
}

/// A JSON value as a cell.
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => format!("{f:.2}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// An answer as the view type it must be (an API of another version says so, not `?`).
pub fn typed<T: DeserializeOwned>(path: &str, v: Value) -> anyhow::Result<T> {
    serde_json::from_value(v).with_context(|| format!("the API's answer to {path} is not the one this build reads"))
}

/// A time as the API writes it (RFC 3339, UTC).
pub fn rfc3339(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// One transition as a line, coloured by its target state on a terminal.
pub fn transition_line(t: &view::Transition) -> String {
    let to = t.to_state.as_str();
    let colour = std::io::stdout().is_terminal();
    let paint = |s: &str| -> String {
        if !colour {
            return s.to_owned();
        }
        let code = match to {
            "healthy" => "32",
            "recovering" => "36",
            "suspect" | "degraded" => "33",
            "unhealthy" => "31",
            _ => "35",
        };
        format!("\x1b[{code}m{s}\x1b[0m")
    };
    // A scoped transition names its scope: it holds for those reporters only.
    let scope = t.scope.as_ref().map(|s| format!(" ({s} only)")).unwrap_or_default();
    format!(
        "{}  {}/{}{scope}  {} -> {}  [{}] {}",
        rfc3339(&t.stream_time),
        t.pool,
        t.endpoint,
        t.from_state.as_str(),
        paint(to),
        t.reason_code.as_str(),
        t.reason
    )
}
