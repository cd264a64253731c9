//! Where each partition stands, measured from the write path rather than from the consumer's
//! statistics (which arrive only while the loop polls, and read 0 for a partition the loop has
//! silently stopped processing).
//!
//! The writer records the offset of every commit; a monitor asks the broker for the high
//! watermarks once a second. A partition's lag is `high watermark − committed offset`, both taken
//! at the same moment (the watermark fetch), so that a commit between two fetches cannot clamp a
//! real lag to 0. An assigned partition that has lag but no commit for `stall_after` is
//! *stalled*, which turns `/readyz` false.
//!
//! The group's lag covers every partition of the topic, assigned here or not: the high
//! watermark less the latest offset this processor knows the group committed (its own commits,
//! and the group's rows in Postgres, read every few seconds while Postgres answers). It cannot
//! read 0 while records wait: when nothing is assigned (a rebalance that cannot restore its
//! partitions, Postgres down) the watermarks still grow, and a known offset is never newer than
//! the true one, so the figure errs high, never low. A partition whose offset was never learned
//! counts from its low watermark.

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
    /// Sampled at the last watermark fetch (None before the first).
    lag: Option<i64>,
}

/// One partition of the topic as far as the group goes.
#[derive(Debug, Clone, Default)]
struct GroupPart {
    /// The latest offset the group is known to have committed.
    known: Option<i64>,
    /// Sampled at the last watermark fetch.
    lag: Option<i64>,
}

fn behind(high: i64, low: i64, committed: Option<i64>) -> i64 {
    (high - committed.unwrap_or(low).max(low)).max(0)
}

/// What the metrics and readiness read: per partition (lag, seconds since the last commit).
pub type PartitionFigures = BTreeMap<i32, (Option<i64>, f64)>;

pub struct Progress {
    parts: Mutex<BTreeMap<i32, Part>>,
    group: Mutex<BTreeMap<i32, GroupPart>>,
    stall_after: Duration,
}

/// Lock a map whose every update is a single insert or field store: a panic while holding it
/// cannot leave it inconsistent, so a poisoned lock is still usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Progress {
    pub fn new(stall_after: Duration) -> Progress {
        Progress {
            parts: Mutex::new(BTreeMap::new()),
            group: Mutex::new(BTreeMap::new()),
            stall_after,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<i32, Part>> {
        lock(&self.parts)
    }

    /// A partition was assigned and restored with this committed offset.
    pub fn assigned(&self, partition: i32, committed: Option<i64>) {
        self.lock().insert(
            partition,
            Part {
                committed,
                committed_at: Instant::now(),
                lag: None,
            },
        );
        if let Some(c) = committed {
            self.known(&[(partition, c)]);
        }
    }

    pub fn revoked(&self, partition: i32) {
        self.lock().remove(&partition);
    }

    /// A batch committed these (partition, next offset) pairs.
    pub fn committed(&self, partitions: &[(i32, i64)]) {
        let now = Instant::now();
        {
            let mut parts = self.lock();
            for (p, next) in partitions {
                if let Some(part) = parts.get_mut(p) {
                    part.committed = Some(part.committed.map_or(*next, |c| c.max(*next)));
                    part.committed_at = now;
                }
            }
        }
        self.known(partitions);
    }

    /// Offsets the group has committed (from this processor or read from Postgres). Offsets only
    /// grow: an older reading changes nothing.
    pub fn known(&self, offsets: &[(i32, i64)]) {
        let mut group = lock(&self.group);
        for (p, next) in offsets {
            let g = group.entry(*p).or_default();
            g.known = Some(g.known.map_or(*next, |k| k.max(*next)));
        }
    }

    fn watermarks(&self, partition: i32, low: i64, high: i64) {
        if let Some(part) = self.lock().get_mut(&partition) {
            let lag = behind(high, low, part.committed);
            part.lag = Some(lag);
            // A partition with nothing to do is not stalled: restart its clock.
            if lag == 0 {
                part.committed_at = Instant::now();
            }
        }
        let mut group = lock(&self.group);
        let g = group.entry(partition).or_default();
        g.lag = Some(behind(high, low, g.known));
    }

    pub fn figures(&self) -> PartitionFigures {
        self.lock()
            .iter()
            .map(|(p, part)| (*p, (part.lag, part.committed_at.elapsed().as_secs_f64())))
            .collect()
    }

    /// Records of the whole topic the group has not committed, as far as this processor can
    /// tell (see the module's note); None before the first watermark fetch.
    pub fn group_lag(&self) -> Option<i64> {
        let group = lock(&self.group);
        let mut lags = group.values().filter_map(|g| g.lag).peekable();
        lags.peek()?;
        Some(lags.sum())
    }

    /// Partitions with lag and no commit for longer than `stall_after`.
    pub fn stalled(&self) -> Vec<i32> {
        self.lock()
            .iter()
            .filter(|(_, part)| part.lag.unwrap_or(0) > 0 && part.committed_at.elapsed() >= self.stall_after)
            .map(|(p, _)| *p)
            .collect()
    }
}

/// Where the monitor reads the group's committed offsets.
pub struct GroupOffsets {
    pub pool: sqlx::PgPool,
    pub group: String,
}

impl GroupOffsets {
    async fn read(&self, topic: &str) -> Result<Vec<(i32, i64)>, sqlx::Error> {
        sqlx::query_as("SELECT partition, next_offset FROM consumer_offsets WHERE consumer_group = $1 AND topic = $2")
            .bind(&self.group)
            .bind(topic)
            .fetch_all(&self.pool)
            .await
    }
}

/// How often the monitor reads the group's offsets from Postgres, in watermark rounds.
const GROUP_READ_EVERY: u32 = 5;

/// Once a second, ask the broker for the topic's partitions and the watermarks of each, and every
/// few seconds read the group's offsets from Postgres, until cancelled. The broker calls block,
/// so they run on the blocking pool, one round at a time.
pub async fn monitor(
    progress: std::sync::Arc<Progress>,
    client: BaseConsumer,
    topic: String,
    offsets: GroupOffsets,
    cancel: CancellationToken,
) {
    let client = std::sync::Arc::new(client);
    let mut round: u32 = 0;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        if round.is_multiple_of(GROUP_READ_EVERY) {
            match tokio::time::timeout(Duration::from_secs(2), offsets.read(&topic)).await {
                Ok(Ok(known)) => progress.known(&known),
                Ok(Err(e)) => tracing::debug!(error = %e, "cannot read the group's offsets"),
                Err(_) => tracing::debug!("reading the group's offsets timed out"),
            }
        }
        round = round.wrapping_add(1);
        let (c, t, pr) = (client.clone(), topic.clone(), progress.clone());
        let fetch = tokio::task::spawn_blocking(move || {
            let partitions: Vec<i32> = match c.fetch_metadata(Some(&t), Duration::from_secs(2)) {
                Ok(md) => md
                    .topics()
                    .iter()
                    .filter(|mt| mt.name() == t)
                    .flat_map(|mt| mt.partitions().iter().map(|p| p.id()))
                    .collect(),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot fetch the topic's partitions");
                    return;
                }
            };
            for p in partitions {
                match c.fetch_watermarks(&t, p, Duration::from_secs(2)) {
                    Ok((low, high)) => pr.watermarks(p, low, high),
                    Err(e) => tracing::debug!(partition = p, error = %e, "cannot fetch watermarks"),
                }
            }
        });
        let _ = fetch.await;
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

    /// A commit between two watermark fetches does not clamp a real lag to 0: the lag is the
    /// fetch's high watermark less the offset committed at that moment.
    #[test]
    fn lag_is_sampled_with_its_watermark() {
        let p = Progress::new(Duration::from_secs(60));
        p.assigned(0, Some(1_000));
        p.watermarks(0, 0, 1_200);
        p.committed(&[(0, 1_250)]);
        assert_eq!(p.figures()[&0].0, Some(200), "until the next fetch, the sampled figure");
        p.watermarks(0, 0, 1_400);
        assert_eq!(p.figures()[&0].0, Some(150));
    }

    /// With no partition assigned (a rebalance that cannot restore them while Postgres is
    /// down), the group's lag still counts what waits, from the offsets known last.
    #[test]
    fn the_group_lag_counts_unassigned_partitions_and_never_goes_back() {
        let p = Progress::new(Duration::from_secs(60));
        assert_eq!(p.group_lag(), None, "no watermark yet");
        p.assigned(0, Some(100));
        p.committed(&[(0, 500)]);
        p.known(&[(1, 300), (0, 400)]);
        p.revoked(0);
        assert!(p.figures().is_empty(), "nothing assigned");
        p.watermarks(0, 0, 900);
        p.watermarks(1, 0, 300);
        p.watermarks(2, 50, 80);
        assert_eq!(
            p.group_lag(),
            Some(400 + 30),
            "partition 1 has none waiting; an older reading (0: 400) does not lower 500"
        );
        p.watermarks(1, 0, 1_300);
        assert_eq!(p.group_lag(), Some(400 + 1_000 + 30));
        p.known(&[(0, 900), (1, 1_300), (2, 80)]);
        p.watermarks(0, 0, 900);
        p.watermarks(1, 0, 1_300);
        p.watermarks(2, 50, 80);
        assert_eq!(p.group_lag(), Some(0));
    }
}
