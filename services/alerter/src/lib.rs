//! `vitals-alerter`: follows `vitals.health-changes.v1` with its own consumer group and posts
//! alerts to Prometheus Alertmanager's API v2 (and, optionally, a Slack-compatible webhook).
//!
//! An endpoint alert fires while the endpoint is out of rotation and resolves when it is back;
//! pool alerts fire during panic mode and correlated outages. With `--availability-below`, an
//! endpoint alert also fires while its availability over `--availability-window-secs` (stream
//! time: changes and the processor's ticks on the changes topic) is below the threshold. Firing alerts are re-sent every
//! `--resend-secs` so that Alertmanager's resolve timeout never closes them early (and an
//! Alertmanager that restarted learns them again). Delivery is retried with backoff, and the
//! group's offsets advance only after delivery: at least once (Alertmanager de-duplicates).
//! At start the alerter reads the changes topic from its beginning to rebuild what is firing,
//! sending only what comes after its committed offsets. With `--success-below` (and
//! `--api-url`), `VitalsEndpointSuccessLow` fires while too few of an endpoint's calls succeeded
//! over `--success-window-secs`, read from the API's request availability ([`success`]).

pub mod book;
pub mod success;

use anyhow::Context as _;
use book::{slack, Alert, AvailabilityRule, Book, Links};
use clap::Parser;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::time::Duration;
use success::{Reader, SuccessBook, SuccessRule};
use tokio_util::sync::CancellationToken;
use vitals_contracts::codec::peek_kind;
use vitals_contracts::{decode, HealthChanged, PoolHealthChanged, SchemaKind, Tick};
use vitals_runtime::args::KafkaArgs;
use vitals_runtime::kafka;

#[derive(Parser, Clone)]
#[command(
    name = "vitals-alerter",
    about = "Alerts from vitals' health changes to Alertmanager and webhooks"
)]
pub struct Config {
    #[command(flatten)]
    kafka: KafkaArgs,
    #[arg(long, env = "VITALS_CHANGES_TOPIC", default_value = vitals_contracts::topics::HEALTH_CHANGES)]
    changes_topic: String,
    /// The consumer group (its offsets say what was delivered).
    #[arg(long, env = "VITALS_ALERTER_GROUP", default_value = "vitals-alerter")]
    group: String,
    /// Alertmanager's base URL (repeatable: every one gets every alert).
    #[arg(long = "alertmanager-url", env = "VITALS_ALERTMANAGER_URLS", value_delimiter = ',')]
    alertmanagers: Vec<String>,
    /// A webhook that takes Slack's body (`{"text": …}`): one post per alert fired or resolved.
    #[arg(long, env = "VITALS_ALERT_WEBHOOK_URL")]
    webhook_url: Option<String>,
    /// Re-send firing alerts this often (below Alertmanager's resolve_timeout, 5 min by default).
    #[arg(long, env = "VITALS_ALERT_RESEND_SECS", default_value_t = 60)]
    resend_secs: u64,
    /// The API's base URL, for the history links in annotations.
    #[arg(long, env = "VITALS_API_URL")]
    api_url: Option<String>,
    /// The dashboard's base URL, for links in annotations.
    #[arg(long, env = "VITALS_DASHBOARD_URL")]
    dashboard_url: Option<String>,
    /// Fire `VitalsEndpointAvailabilityLow` while an endpoint was in rotation less than this
    /// share (e.g. 0.99) of the last --availability-window-secs (definitions: docs/uptime.md). Needs the processor's ticks on the changes topic
    /// (`--view-tick-interval-ms`, on by default) for time to pass between changes.
    #[arg(long, env = "VITALS_ALERT_AVAILABILITY_BELOW", value_parser = share)]
    availability_below: Option<f64>,
    /// The availability rule's trailing window.
    #[arg(long, env = "VITALS_ALERT_AVAILABILITY_WINDOW_SECS", default_value_t = 3600,
          value_parser = clap::value_parser!(u64).range(1..=31 * 86_400))]
    availability_window_secs: u64,
    /// Fire `VitalsEndpointSuccessLow` while less than this share (e.g. 0.99) of an endpoint's
    /// calls succeeded over the last --success-window-secs: request availability, read from the
    /// API (needs --api-url).
    #[arg(long, env = "VITALS_ALERT_SUCCESS_BELOW", value_parser = share)]
    success_below: Option<f64>,
    /// The request-availability rule's trailing window (whole minutes of the processor's counts).
    #[arg(long, env = "VITALS_ALERT_SUCCESS_WINDOW_SECS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(60..=31 * 86_400))]
    success_window_secs: u64,
    /// Fewer calls than this in the window say nothing either way.
    #[arg(long, env = "VITALS_ALERT_SUCCESS_MIN_CALLS", default_value_t = 20,
          value_parser = clap::value_parser!(i64).range(1..))]
    success_min_calls: i64,
    /// How often the request-availability rule reads the API.
    #[arg(long, env = "VITALS_ALERT_SUCCESS_CHECK_SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    success_check_secs: u64,
    /// A reader token for the API (when it requires one).
    #[arg(long, env = "VITALS_API_TOKEN")]
    api_token: Option<String>,
}

fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("{s:?} is not a share above 0 and at most 1 (e.g. 0.99)")),
    }
}

/// Where alerts go, with retries until they are taken.
#[derive(Clone)]
struct Sinks {
    client: reqwest::Client,
    alertmanagers: Vec<String>,
    webhook: Option<String>,
}

impl Sinks {
    /// Post until it is taken (2xx) or `cancel` fires; returns false when cancelled.
    async fn post(&self, url: &str, body: &serde_json::Value, cancel: &CancellationToken) -> bool {
        let mut backoff = Duration::from_millis(250);
        loop {
            let err = match self.client.post(url).json(body).send().await {
                Ok(r) if r.status().is_success() => return true,
                Ok(r) => format!("{}: {}", r.status(), r.text().await.unwrap_or_default()),
                Err(e) => e.to_string(),
            };
            tracing::warn!(url, error = %err, retry_in = ?backoff, "alert delivery failed; retrying");
            tokio::select! {
                _ = cancel.cancelled() => return false,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(30));
        }
    }

    async fn to_alertmanagers(&self, alerts: &[Alert], cancel: &CancellationToken) -> bool {
        if alerts.is_empty() {
            return true;
        }
        let body = serde_json::to_value(alerts).unwrap_or_default();
        for am in &self.alertmanagers {
            let url = format!("{}/api/v2/alerts", am.trim_end_matches('/'));
            if !self.post(&url, &body, cancel).await {
                return false;
            }
        }
        true
    }

    /// Alerts fired or resolved now: to every Alertmanager, and one post each to the webhook.
    async fn deliver(&self, alerts: &[Alert], cancel: &CancellationToken) -> bool {
        if !self.to_alertmanagers(alerts, cancel).await {
            return false;
        }
        if let Some(w) = &self.webhook {
            for a in alerts {
                if !self.post(w, &slack(a), cancel).await {
                    return false;
                }
            }
        }
        for a in alerts {
            tracing::info!(alert = a.name(), labels = ?a.labels, resolved = a.resolved(), "alert delivered");
        }
        true
    }
}

fn apply(book: &mut Book, partition: i32, payload: &[u8]) -> Vec<Alert> {
    match peek_kind(payload) {
        Ok(SchemaKind::HealthChanged) => decode::<HealthChanged>(payload)
            .map(|h| book.change(partition, &h))
            .unwrap_or_default(),
        Ok(SchemaKind::PoolHealthChanged) => decode::<PoolHealthChanged>(payload)
            .map(|p| book.pool(&p))
            .unwrap_or_default(),
        Ok(SchemaKind::Tick) => decode::<Tick>(payload)
            .map(|t| book.tick(partition, t.emitted_at))
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// The consumer assigned to every partition of the changes topic from its beginning, the
/// group's committed offsets (what was delivered), and each partition's end now.
#[allow(clippy::type_complexity)]
fn start(cfg: &Config) -> anyhow::Result<(StreamConsumer, HashMap<i32, i64>, HashMap<i32, i64>)> {
    let consumer: StreamConsumer = kafka::consumer(&cfg.kafka, &cfg.group, &[("isolation.level", "read_committed")])
        .create()
        .context("creating the Kafka consumer")?;
    let topic = cfg.changes_topic.clone();
    let partitions = kafka::partitions(&consumer, &topic, Duration::from_secs(10))
        .with_context(|| format!("reading the metadata of {topic}"))?;
    anyhow::ensure!(!partitions.is_empty(), "no topic {topic}");
    // What was delivered already: the group's committed offsets.
    let mut all = TopicPartitionList::new();
    for p in &partitions {
        all.add_partition(&topic, *p);
    }
    let committed = consumer.committed_offsets(all, Duration::from_secs(10))?;
    let mut delivered_to: HashMap<i32, i64> = HashMap::new();
    let mut ends: HashMap<i32, i64> = HashMap::new();
    let mut from = TopicPartitionList::new();
    for p in &partitions {
        let c = committed
            .find_partition(&topic, *p)
            .and_then(|e| match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            })
            .unwrap_or(0);
        delivered_to.insert(*p, c);
        let (low, high) = consumer.fetch_watermarks(&topic, *p, Duration::from_secs(10))?;
        if high > low {
            ends.insert(*p, high);
        }
        from.add_partition_offset(&topic, *p, Offset::Beginning)?;
    }
    consumer.assign(&from)?;
    Ok((consumer, delivered_to, ends))
}

/// The request-availability rule: every `every`, each pool's endpoints over the trailing window
/// from the API; what fires or resolves is delivered, what is firing re-sent to Alertmanager. An
/// API that cannot be read is logged and read again at the next check (nothing resolves).
async fn check_success(mut book: SuccessBook, api: Reader, sinks: Sinks, every: Duration, cancel: CancellationToken) {
    let mut timer = tokio::time::interval(every);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = timer.tick() => {}
        }
        let now = chrono::Utc::now();
        let from = now - chrono::Duration::seconds(book.window_secs() as i64);
        let pools = match api.pools().await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the pools for the request-availability rule");
                continue;
            }
        };
        let mut send = book.keep_pools(&pools, now);
        for pool in &pools {
            match api.endpoints(pool, from, now).await {
                Ok(endpoints) => send.extend(book.judge(pool, &endpoints, now)),
                Err(e) => tracing::warn!(pool, error = %e, "cannot read a pool's request availability"),
            }
        }
        if !sinks.deliver(&send, &cancel).await {
            return;
        }
        let firing = book.firing();
        if !firing.is_empty() && !sinks.to_alertmanagers(&firing, &cancel).await {
            return;
        }
    }
}

pub async fn run(cfg: Config, cancel: CancellationToken) -> anyhow::Result<()> {
    cfg.kafka.check().map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        cfg.success_below.is_none() || cfg.api_url.is_some(),
        "--success-below reads request availability from the API: give --api-url"
    );
    anyhow::ensure!(
        !cfg.alertmanagers.is_empty() || cfg.webhook_url.is_some(),
        "nowhere to send alerts: give --alertmanager-url or --webhook-url"
    );
    // The broker may not be ready (a group coordinator still being elected): retry until it is.
    let (consumer, delivered_to, ends) = loop {
        // Blocking calls to the broker: off the runtime's threads.
        let c = cfg.clone();
        match tokio::task::spawn_blocking(move || start(&c)).await? {
            Ok(started) => break started,
            Err(e) => {
                tracing::warn!(error = %e, "cannot start following the changes topic; retrying");
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    };
    let (mut delivered_to, mut ends) = (delivered_to, ends);
    let topic = cfg.changes_topic.clone();
    let sinks = Sinks {
        client: reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?,
        alertmanagers: cfg.alertmanagers.clone(),
        webhook: cfg.webhook_url.clone(),
    };
    let mut book = Book::new(Links {
        api: cfg.api_url.clone(),
        dashboard: cfg.dashboard_url.clone(),
    });
    if let Some(below) = cfg.availability_below {
        book = book.with_availability(AvailabilityRule {
            below,
            window_us: cfg.availability_window_secs as i64 * 1_000_000,
        });
    }
    if let (Some(below), Some(api)) = (cfg.success_below, cfg.api_url.clone()) {
        let rule = SuccessRule {
            below,
            window_secs: cfg.success_window_secs,
            min_calls: cfg.success_min_calls,
        };
        let reader = Reader {
            client: sinks.client.clone(),
            base: api,
            token: cfg.api_token.clone(),
        };
        let links = Links {
            api: cfg.api_url.clone(),
            dashboard: cfg.dashboard_url.clone(),
        };
        let every = Duration::from_secs(cfg.success_check_secs);
        tokio::spawn(check_success(
            SuccessBook::new(rule, links),
            reader,
            sinks.clone(),
            every,
            cancel.clone(),
        ));
    }
    tracing::info!(topic, ?delivered_to, "rebuilding what is firing from the changes topic");
    let mut caught_up = ends.is_empty();
    if caught_up {
        tracing::info!("the changes topic is empty; following it");
    }
    let mut resend = tokio::time::interval(Duration::from_secs(cfg.resend_secs.max(1)));
    resend.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let m = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = resend.tick(), if caught_up => {
                let firing = book.firing();
                if !firing.is_empty() && !sinks.to_alertmanagers(&firing, &cancel).await {
                    return Ok(());
                }
                continue;
            }
            m = consumer.recv() => m,
        };
        let m = match m {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "consumer error");
                continue;
            }
        };
        let (p, offset) = (m.partition(), m.offset());
        let alerts = m.payload().map(|b| apply(&mut book, p, b)).unwrap_or_default();
        if offset >= delivered_to.get(&p).copied().unwrap_or(0) {
            if !sinks.deliver(&alerts, &cancel).await {
                return Ok(());
            }
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&topic, p, Offset::Offset(offset + 1))?;
            if let Err(e) = consumer.commit(&tpl, CommitMode::Async) {
                tracing::warn!(error = %e, "committing the offset failed; it is retried with the next");
            }
            delivered_to.insert(p, offset + 1);
        }
        if !caught_up && ends.get(&p).is_some_and(|end| offset + 1 >= *end) {
            ends.remove(&p);
            if ends.is_empty() {
                caught_up = true;
                tracing::info!(firing = book.firing().len(), "caught up; re-sending what is firing");
                resend.reset_immediately();
            }
        }
    }
}
