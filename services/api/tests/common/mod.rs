//! API test harness: the API (and, where a test needs it, the processor) run in-process against
//! the real broker and the real database, each test with its own topics and schema.
//!
//! Needs the local stack (Kafka and Postgres, started by `scripts/test.sh`): run `scripts/test.sh`.
#![allow(dead_code)]

pub use clap::Parser;
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::PgPool;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
#[allow(unused_imports)] // each test binary uses a different part
pub use vitals_testkit::{brokers, database_url, reader_url, unique, wait_until};

pub const ADMIN: &str = "admin-secret-0000000001";
pub const WRITER: &str = "writer-secret-000000001";
pub const READER: &str = "reader-secret-000000001";

pub struct Api {
    pub name: String,
    pub base: String,
    pub port: u16,
    pub db: PgPool,
    pub http: reqwest::Client,
    pub cancel: CancellationToken,
    pub topics: vitals_testkit::Topics,
    /// Processors started for this API's topics and schema; killed with it.
    processors: std::sync::Mutex<Vec<vitals_testkit::Service>>,
}

impl Api {
    /// Start the API on a fresh schema and topics; `extra` flags are appended.
    pub async fn start(name: &str, extra: &[&str]) -> Api {
        let name = unique(name);
        let topics = vitals_testkit::Topics::create(&name, 2, vitals_testkit::Stamp::CreateTime).await;
        let mut args: Vec<String> = [
            "vitals-api",
            "--http-addr",
            "127.0.0.1:0",
            "--db-schema",
            &name,
            "--token",
            &format!("ops:admin:{ADMIN}"),
            "--token",
            &format!("gw:writer:{WRITER}"),
            "--token",
            &format!("viewer:reader:{READER}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // The processor owns the schema (it creates and migrates it); the API reads it with the
        // read-only role.
        vitals_testkit::migrated_schema(&name).await;
        args.extend(["--brokers".into(), brokers(), "--database-url".into(), reader_url()]);
        args.extend(topics.args());
        args.extend(extra.iter().map(|s| s.to_string()));
        let cfg = vitals_api::config::Config::parse_from(args);
        let cancel = CancellationToken::new();
        let app = vitals_api::build(cfg, cancel.clone()).await.expect("api starts");
        let port = app.port();
        tokio::spawn(app.run());
        let db = vitals_testkit::schema_pool(&name).await;
        Api {
            base: format!("http://127.0.0.1:{port}"),
            port,
            db,
            http: reqwest::Client::new(),
            cancel,
            topics,
            processors: Default::default(),
            name,
        }
    }

    /// Start the processor binary on this API's topics and schema.
    pub fn start_processor(&self) {
        let p = vitals_testkit::start_processor(&self.topics, &self.name, &self.name, &[]);
        self.processors.lock().expect("not poisoned").push(p);
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// The body of a GET as text (`/metrics`).
    pub async fn text(&self, path: &str) -> String {
        self.http
            .get(self.url(path))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        let r = self.http.get(self.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: String,
    ) -> (u16, serde_json::Value) {
        let mut req = self
            .http
            .request(method, self.url(path))
            .header("content-type", "application/json")
            .body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub async fn drop_schema(&self) {
        self.cancel.cancel();
        self.processors.lock().expect("not poisoned").clear();
        vitals_testkit::drop_schema(&self.db, &self.name).await;
    }
}

pub fn producer() -> FutureProducer {
    vitals_testkit::producer()
}

pub async fn produce(p: &FutureProducer, topic: &str, key: &str, bytes: &[u8]) {
    p.send(FutureRecord::to(topic).key(key).payload(bytes), Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
}

#[allow(unused_imports)]
pub use vitals_testkit::uptime::{seed_uptime, uptime_t0};

/// Insert a transition row directly, as the processor would.
pub async fn insert_transition(
    db: &PgPool,
    pool: &str,
    endpoint: &str,
    seq: i64,
    to: &str,
    reason_code: &str,
    t_us: i64,
) {
    let evidence = vitals_testkit::uptime::evidence_json();
    vitals_testkit::uptime::create_month(db, t_us).await;
    sqlx::query(
        "INSERT INTO transitions (pool, endpoint, seq, transition_id, from_state, to_state, weight, ramp_ms,
         reason_code, reason, window_calls, trigger_ids, policy_version, evidence, stream_time, source_partition,
         source_offset)
         VALUES ($1, $2, $3, $1 || '/' || $2 || '/' || $3, 'healthy', $4, 0, 0, $5, 'test reason ' || $3, 8, ARRAY['sig-' || $3], 0, $6, to_timestamp($7::double precision / 1e6), 0, $3)",
    )
    .bind(pool)
    .bind(endpoint)
    .bind(seq)
    .bind(to)
    .bind(reason_code)
    .bind(evidence)
    .bind(t_us)
    .execute(db)
    .await
    .unwrap();
}

/// A Server-Sent Events client over the API's live stream.
pub struct Sse {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buf: String,
}

#[derive(Debug, Clone)]
pub struct Ev {
    pub id: String,
    pub event: String,
    pub data: String,
}

impl Sse {
    /// The live stream of pool `live`, resumed after `last_id` if given.
    pub async fn connect(api: &Api, last_id: Option<&str>) -> Sse {
        Sse::open(api, "/v1/stream?pool=live", last_id, None)
            .await
            .unwrap_or_else(|(s, b)| panic!("stream refused: {s} {b}"))
    }

    /// A stream at `path`, or the status and error body that refused it.
    pub async fn open(
        api: &Api,
        path: &str,
        last_id: Option<&str>,
        token: Option<&str>,
    ) -> Result<Sse, (u16, serde_json::Value)> {
        Sse::open_with(&api.http, api, path, last_id, token).await
    }

    /// [`Sse::open`] with a client of the caller's (e.g. bound to another loopback address).
    pub async fn open_with(
        http: &reqwest::Client,
        api: &Api,
        path: &str,
        last_id: Option<&str>,
        token: Option<&str>,
    ) -> Result<Sse, (u16, serde_json::Value)> {
        let mut req = http.get(api.url(path));
        if let Some(id) = last_id {
            req = req.header("Last-Event-ID", id);
        }
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        if status != 200 {
            return Err((status, r.json().await.unwrap_or(serde_json::Value::Null)));
        }
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        Ok(Sse {
            body: Box::pin(r.bytes_stream()),
            buf: String::new(),
        })
    }

    /// The next event (keep-alive comments skipped); None when the server ends the stream.
    pub async fn next_or_end(&mut self) -> Option<Ev> {
        use futures::StreamExt;
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut ev = Ev {
                    id: String::new(),
                    event: String::new(),
                    data: String::new(),
                };
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        ev.id = v.trim().into();
                    } else if let Some(v) = line.strip_prefix("event:") {
                        ev.event = v.trim().into();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        ev.data.push_str(v.trim());
                    }
                }
                if ev.event.is_empty() {
                    continue; // a keep-alive comment
                }
                return Some(ev);
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), self.body.next())
                .await
                .expect("an event or the end within 30 s")?;
            self.buf.push_str(&String::from_utf8_lossy(&chunk.ok()?));
        }
    }

    pub async fn next(&mut self) -> Ev {
        self.next_or_end().await.expect("the stream stays open")
    }
}
