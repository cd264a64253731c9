//! Writes a Tick record to every partition of a topic at a fixed period. On the signals topic the
//! broker stamps each with its append time, which moves the partition's stream time forward, so
//! an endpoint that goes silent is noticed even when nothing else arrives. On the changes topic
//! ticks say the processor is alive and keeping up (they are written only while `alive`), so a
//! router's health view can tell a quiet pool from a processor that stopped.

use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use vitals_contracts::{encode, Tick};
use vitals_runtime::produce;

pub async fn run(
    producer: FutureProducer,
    topic: String,
    every: Duration,
    name: String,
    alive: impl Fn() -> bool,
    cancel: CancellationToken,
) {
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut partitions = 0i32;
    let mut refreshed = std::time::Instant::now() - Duration::from_secs(3600);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = interval.tick() => {}
        }
        if partitions == 0 || refreshed.elapsed() > Duration::from_secs(60) {
            let p = producer.clone();
            let t = topic.clone();
            let meta =
                tokio::task::spawn_blocking(move || p.client().fetch_metadata(Some(&t), Duration::from_secs(5))).await;
            match meta {
                Ok(Ok(m)) => {
                    partitions = m.topics().first().map_or(0, |t| t.partitions().len() as i32);
                    refreshed = std::time::Instant::now();
                }
                other => tracing::debug!(?other, "ticker cannot read topic metadata"),
            }
        }
        if !alive() {
            continue;
        }
        let now_us = chrono::Utc::now().timestamp_micros();
        let Ok(payload) = encode(&Tick {
            ticker: name.clone(),
            emitted_at: now_us,
        }) else {
            continue;
        };
        for p in 0..partitions {
            let record: FutureRecord<'_, (), [u8]> = FutureRecord::to(&topic).partition(p).payload(&payload);
            if let Err(e) = produce::try_queue(&producer, record) {
                tracing::debug!(error = %e, partition = p, "tick not queued");
            }
        }
    }
}
