//! Where each assigned partition stands, measured from the write path rather than from the
//! consumer's statistics (which arrive only while the loop polls, and read 0 for a partition the
//! loop has silently stopped processing).
//!
//! The writer records the offset of every commit; a monitor asks the broker for the high
//! watermarks once a second. Lag is `high watermark − committed offset`; a partition that has
//! lag but no commit for `stall_after` is *stalled*, which turns `/readyz` false.

use rdkafka::consumer::{BaseConsumer, Consumer};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
struct Part {
    /// First offset not yet in Postgres (None: nothing committed yet; the partition's start).
    committed: Option<i64>,
    committed_at: Instant,
    low: i64,
    high: Option<i64>,
}

impl Part {
    fn lag(&self) -> Option<i64> {
        let high = self.high?;
        Some((high - self.committed.unwrap_or(self.low).max(self.low)).max(0))
    }
}

/// What the metrics and readiness read: per partition (lag, seconds since the last commit).
pub type PartitionFigures = BTreeMap<i32, (Option<i64>, f64)>;

pub struct Progress {
    parts: Mutex<BTreeMap<i32, Part>>,
    stall_after: Duration,
}

impl Progress {
    pub fn new(stall_after: Duration) -> Progress {
        Progress {
            parts: Mutex::new(BTreeMap::new()),
            stall_after,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<i32, Part>> {
        // A panic while holding this lock cannot leave the map inconsistent (every update is a
        // single insert or field store), so a poisoned lock is still usable.
        self.parts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A partition was assigned and restored with this committed offset.
    pub fn assigned(&self, partition: i32, committed: Option<i64>) {
        self.lock().insert(
            partition,
            Part {
                committed,
                committed_at: Instant::now(),
                low: 0,
                high: None,
            },
        );
    }

    pub fn revoked(&self, partition: i32) {
        self.lock().remove(&partition);
    }

    /// A batch committed these (partition, next offset) pairs.
    pub fn committed(&self, partitions: &[(i32, i64)]) {
        let now = Instant::now();
        let mut parts = self.lock();
        for (p, next) in partitions {
            if let Some(part) = parts.get_mut(p) {
                part.committed = Some(part.committed.map_or(*next, |c| c.max(*next)));
                part.committed_at = now;
            }
        }
    }

    fn watermarks(&self, partition: i32, low: i64, high: i64) {
        if let Some(part) = self.lock().get_mut(&partition) {
            part.low = low;
            part.high = Some(high);
            // A partition with nothing to do is not stalled: restart its clock.
            if part.lag() == Some(0) {
                part.committed_at = Instant::now();
            }
        }
    }

    pub fn figures(&self) -> PartitionFigures {
        self.lock()
            .iter()
            .map(|(p, part)| (*p, (part.lag(), part.committed_at.elapsed().as_secs_f64())))
            .collect()
    }

    /// Partitions with lag and no commit for longer than `stall_after`.
    pub fn stalled(&self) -> Vec<i32> {
        self.lock()
            .iter()
            .filter(|(_, part)| part.lag().unwrap_or(0) > 0 && part.committed_at.elapsed() >= self.stall_after)
            .map(|(p, _)| *p)
            .collect()
    }

    fn partitions(&self) -> Vec<i32> {
        self.lock().keys().copied().collect()
    }
}

/// Ask the broker for the watermarks of the assigned partitions once a second, until cancelled.
/// The calls block, so they run on the blocking pool, one round at a time.
pub async fn monitor(
    progress: std::sync::Arc<Progress>,
    client: BaseConsumer,
    topic: String,
    cancel: CancellationToken,
) {
    let client = std::sync::Arc::new(client);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let parts = progress.partitions();
        let (c, t, pr) = (client.clone(), topic.clone(), progress.clone());
        let round = tokio::task::spawn_blocking(move || {
            for p in parts {
                match c.fetch_watermarks(&t, p, Duration::from_secs(2)) {
                    Ok((low, high)) => pr.watermarks(p, low, high),
                    Err(e) => tracing::debug!(partition = p, error = %e, "cannot fetch watermarks"),
                }
            }
        });
        let _ = round.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_comes_from_the_committed_offset_and_a_partition_without_commits_stalls() {
        let p = Progress::new(Duration::ZERO);
        p.assigned(0, Some(10));
        p.assigned(1, None);
        p.watermarks(0, 0, 110);
        p.watermarks(1, 5, 5);
        let f = p.figures();
        assert_eq!(f[&0].0, Some(100));
        assert_eq!(f[&1].0, Some(0));
        assert_eq!(p.stalled(), vec![0], "lag and no commit: stalled; no lag: not");
        p.committed(&[(0, 110)]);
        p.watermarks(0, 0, 110);
        assert_eq!(p.figures()[&0].0, Some(0));
        assert!(p.stalled().is_empty());
        p.revoked(0);
        assert!(!p.figures().contains_key(&0));
    }
}
