//! The fallback transport: batches of reports to the API's `POST /v1/signals`. Items the API
//! did not confirm, and whole batches it could not take (down, busy), are sent again after a
//! backoff; what is held stays within the configured bound (beyond it, new reports are dropped
//! and counted).

use crate::{Counters, Error, HttpIngest, Sink};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use vitals_contracts::view::{CallItem, SignalItem, SummaryItem};
use vitals_contracts::Signal;

pub(crate) struct HttpSink {
    cfg: HttpIngest,
    url: String,
    client: reqwest::Client,
    rt: tokio::runtime::Runtime,
    held: VecDeque<(Instant, Signal)>,
    capacity: usize,
    /// No request before this (a backoff after a failure).
    next_try: Instant,
    backoff: Duration,
}

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What became of one request.
enum Sent {
    /// Per item: accepted, rejected (invalid: dropped), or failed (sent again).
    Answered(Vec<ItemStatus>),
    /// The API could not take the batch now: send it again after this.
    Later(Option<Duration>, String),
    /// The API refused the batch for good (a bad token, a body it cannot read).
    Refused(String),
}

#[derive(Clone, Copy, PartialEq)]
enum ItemStatus {
    Accepted,
    Rejected,
    Failed,
}

impl HttpSink {
    pub(crate) fn new(cfg: HttpIngest, capacity: usize) -> Result<HttpSink, Error> {
        if !(cfg.url.starts_with("http://") || cfg.url.starts_with("https://")) {
            return Err(Error::Config(format!(
                "HTTP ingest URL {:?} must start with http:// or https://",
                cfg.url
            )));
        }
        if cfg.batch_items == 0 || capacity == 0 {
            return Err(Error::Config("batch_items and the queue must be above 0".into()));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Http(e.to_string()))?;
        let client = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .build()
            .map_err(|e| Error::Http(e.to_string()))?;
        Ok(HttpSink {
            url: format!("{}/v1/signals", cfg.url.trim_end_matches('/')),
            cfg,
            client,
            rt,
            held: VecDeque::new(),
            capacity,
            next_try: Instant::now(),
            backoff: FIRST_BACKOFF,
        })
    }

    fn due(&self, now: Instant) -> bool {
        now >= self.next_try
            && self.held.front().is_some_and(|(since, _)| {
                self.held.len() >= self.cfg.batch_items || now.duration_since(*since) >= self.cfg.linger
            })
    }

    /// Send the oldest batch and settle its items.
    fn post(&mut self, counters: &Counters) {
        let n = self.held.len().min(self.cfg.batch_items);
        let batch: Vec<(Instant, Signal)> = self.held.drain(..n).collect();
        let items: Vec<SignalItem> = batch
            .iter()
            .filter_map(|(_, s)| match s {
                Signal::Call(o) => Some(SignalItem::Call(CallItem::from(o.clone()))),
                Signal::Summary(x) => Some(SignalItem::Summary(SummaryItem::from(x.clone()))),
                _ => None,
            })
            .collect();
        let sent = self
            .rt
            .block_on(send(&self.client, &self.url, self.cfg.token.as_deref(), &items));
        match sent {
            Sent::Answered(statuses) => {
                self.backoff = FIRST_BACKOFF;
                let mut again = Vec::new();
                for (item, status) in batch
                    .into_iter()
                    .zip(statuses.iter().copied().chain(std::iter::repeat(ItemStatus::Failed)))
                {
                    match status {
                        ItemStatus::Accepted => counters.delivered.fetch_add(1, Ordering::Relaxed),
                        ItemStatus::Rejected => counters.dropped_invalid.fetch_add(1, Ordering::Relaxed),
                        ItemStatus::Failed => {
                            again.push(item);
                            0
                        }
                    };
                }
                if !again.is_empty() {
                    counters.retries.fetch_add(1, Ordering::Relaxed);
                    self.hold_again(again);
                    self.next_try = Instant::now() + FIRST_BACKOFF;
                }
            }
            Sent::Later(after, why) => {
                counters.retries.fetch_add(1, Ordering::Relaxed);
                counters.error(format!("HTTP ingest {}: {why}", self.url));
                self.hold_again(batch);
                let wait = after.unwrap_or(self.backoff);
                self.next_try = Instant::now() + wait;
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
            }
            Sent::Refused(why) => {
                counters
                    .delivery_failed
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                counters.error(format!("HTTP ingest {}: {why}", self.url));
                self.next_try = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
            }
        }
    }

    /// Put a batch back at the front, in order.
    fn hold_again(&mut self, batch: Vec<(Instant, Signal)>) {
        for item in batch.into_iter().rev() {
            self.held.push_front(item);
        }
    }
}

async fn send(client: &reqwest::Client, url: &str, token: Option<&str>, items: &[SignalItem]) -> Sent {
    let mut req = client.post(url).json(&serde_json::json!({ "items": items }));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => return Sent::Later(None, e.to_string()),
    };
    let status = resp.status();
    let retry_after = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let body = resp.text().await.unwrap_or_default();
    if status.is_success() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) else {
            return Sent::Later(None, format!("an answer that is not JSON: {body:.200}"));
        };
        let statuses = v["results"]
            .as_array()
            .map(|r| {
                let mut out = vec![ItemStatus::Failed; items.len()];
                for x in r {
                    if let (Some(i), Some(s)) = (x["index"].as_u64(), x["status"].as_str()) {
                        if let Some(slot) = out.get_mut(i as usize) {
                            *slot = match s {
                                "accepted" => ItemStatus::Accepted,
                                "rejected" => ItemStatus::Rejected,
                                _ => ItemStatus::Failed,
                            };
                        }
                    }
                }
                out
            })
            .unwrap_or_default();
        return Sent::Answered(statuses);
    }
    let why = format!("{status}: {body:.300}");
    if status.as_u16() == 429 || status.is_server_error() {
        Sent::Later(retry_after, why)
    } else {
        Sent::Refused(why)
    }
}

impl Sink for HttpSink {
    fn send(&mut self, o: Signal, counters: &Counters) {
        if self.held.len() >= self.capacity {
            counters.dropped_producer_full.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.held.push_back((Instant::now(), o));
        if self.due(Instant::now()) {
            self.post(counters);
        }
    }

    fn tick(&mut self, counters: &Counters) {
        if self.due(Instant::now()) {
            self.post(counters);
        }
    }

    fn flush(&mut self, timeout: Duration, counters: &Counters) -> bool {
        let deadline = Instant::now() + timeout;
        while !self.held.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            if now < self.next_try {
                std::thread::sleep((self.next_try - now).min(deadline - now));
                continue;
            }
            self.post(counters);
        }
        true
    }
}
