//! A client resuming from further back than the hub's ring: a Kafka consumer of its own,
//! assigned by hand at the client's positions (the group id is only a label, nothing is
//! committed), at most `--max-kafka-streams` at once.

use super::protocol::{self, encode_positions, Decoder, Filter, Positions};
use super::slot::StreamSlot;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::AppState;
use axum::body::Bytes;
use futures::{Stream, StreamExt};
use rdkafka::consumer::StreamConsumer;
use rdkafka::message::Message;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

struct Live {
    consumer: StreamConsumer,
    positions: Positions,
    /// Its pool and endpoint.
    filter: Filter,
    decoder: Decoder,
    ready: bool,
    cancel: CancellationToken,
    /// When the stream ends with a `reconnect` event.
    ends_at: tokio::time::Instant,
    ended: bool,
    metrics: Arc<Metrics>,
    _slot: StreamSlot,
    _kafka_slot: StreamSlot,
}

/// The events after `resume` (every partition it does not name from its beginning: one added
/// since; without it, from the end of the topic), as the client's filter wants them, until
/// `ends_at`.
pub async fn events(
    app: &AppState,
    resume: Option<Positions>,
    filter: Filter,
    ends_at: tokio::time::Instant,
    slot: StreamSlot,
) -> Result<impl Stream<Item = Bytes> + Unpin + Send + 'static, ApiError> {
    let kafka_slot = app.kafka_streams.take(slot.client(), slot.anonymous())?;
    let prefetch = app.cfg.kafka_stream_prefetch();
    let mut settings = vec![("isolation.level", "read_committed"), ("fetch.wait.max.ms", "50")];
    settings.extend(prefetch.iter().map(|(k, v)| (*k, v.as_str())));
    let consumer: StreamConsumer = vitals_runtime::kafka::consumer(&app.cfg.kafka, "vitals-api-live", &settings)
        .create()
        .map_err(|e| ApiError::Internal(e.into()))?;
    let topic = app.cfg.topics.changes_topic.clone();
    // Every partition's starting offset resolved now, so the `ready` event is exact.
    let (consumer, positions) = tokio::task::spawn_blocking(move || {
        let start = |p| resume.as_ref().map(|r| r.get(&p).copied().unwrap_or(0));
        let positions = protocol::assign(&consumer, &topic, start)?;
        anyhow::Ok((consumer, positions))
    })
    .await
    .map_err(|e| ApiError::Internal(e.into()))?
    .map_err(|e| {
        tracing::warn!(error = %e, "live stream: cannot read the changes topic");
        ApiError::Unavailable("the changes topic is unavailable".into())
    })?;
    let live = Live {
        consumer,
        positions,
        filter,
        decoder: Decoder::default(),
        ready: false,
        cancel: app.cancel.clone(),
        ends_at,
        ended: false,
        metrics: app.metrics.clone(),
        _slot: slot,
        _kafka_slot: kafka_slot,
    };
    Ok(futures::stream::unfold(live, |mut live| async move {
        let e = live.next_event().await?;
        Some((e, live))
    })
    .boxed())
}

impl Live {
    async fn next_event(&mut self) -> Option<Bytes> {
        if !self.ready {
            self.ready = true;
            return Some(protocol::ready(&encode_positions(&self.positions)));
        }
        if self.ended {
            return None;
        }
        loop {
            let msg = tokio::select! {
                _ = self.cancel.cancelled() => return None,
                _ = tokio::time::sleep_until(self.ends_at) => {
                    self.ended = true;
                    return Some(protocol::reconnect(&encode_positions(&self.positions)));
                }
                m = self.consumer.recv() => m,
            };
            let m = match msg {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "live stream: consumer error");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            self.positions.insert(m.partition(), m.offset() + 1);
            let payload = m.payload().unwrap_or_default();
            let only = Some(&self.filter);
            if let Some(item) =
                self.decoder
                    .decode(m.partition(), m.offset(), payload, &self.positions, only, &self.metrics)
            {
                return Some(item.frame);
            }
        }
    }
}
