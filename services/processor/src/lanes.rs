//! Lanes: the partitions of one processor consumed in parallel.
//!
//! A lane is a consumer of the group with its own receiver thread, record loop, batches and
//! writer ([`crate::consumer::Processor`]). The lanes of a processor join the group as members
//! of their own, so the group spreads the partitions over them as it does over processors, and
//! everything that keeps several processors exactly once keeps the lanes so: each partition is
//! claimed in Postgres under a new epoch when a lane is assigned it, a lane's batch commits only
//! the partitions whose epoch it holds, and a partition's engine lives in one lane at a time, so
//! replaying its records gives the same transitions. The lanes share the database pool, the
//! relay (which publishes the outbox in the order of its rows, from any number of writers), the
//! metrics and `/readyz`: the processor is ready when every lane is.
//!
//! What a lane costs: a librdkafka consumer (its threads and fetch buffers, up to
//! `max.partition.fetch.bytes` for each partition it is assigned), a receiver thread, the
//! engines of its partitions (as one lane would hold them) and a batch being filled while the
//! previous one is written.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Whether each lane holds an assignment whose partitions are all restored (an empty
/// assignment counts: that lane is ready, with nothing to do).
pub struct Readiness {
    lanes: Vec<AtomicBool>,
}

impl Readiness {
    pub fn new(lanes: usize) -> Readiness {
        Readiness {
            lanes: (0..lanes).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    fn set(&self, lane: usize, ready: bool) {
        self.lanes[lane].store(ready, Ordering::Relaxed);
    }

    /// The handle lane `lane` reports its own readiness by.
    pub(crate) fn lane(self: &Arc<Self>, lane: usize) -> LaneReady {
        LaneReady {
            all: self.clone(),
            lane,
        }
    }

    /// Every lane is ready.
    pub fn all(&self) -> bool {
        self.lanes.iter().all(|l| l.load(Ordering::Relaxed))
    }
}

/// One lane's part of [`Readiness`].
pub(crate) struct LaneReady {
    all: Arc<Readiness>,
    lane: usize,
}

impl LaneReady {
    pub(crate) fn set(&self, ready: bool) {
        self.all.set(self.lane, ready);
    }
}

/// The consumer settings of lane `lane` of `lanes` ([`crate::kafka::consumer_config`] applies
/// it): a static membership id given by the user (`group.instance.id`) gets the lane's number,
/// since two members may not share one.
pub(crate) fn lane_config(mut config: rdkafka::ClientConfig, lane: usize, lanes: usize) -> rdkafka::ClientConfig {
    if lanes > 1 {
        if let Some(id) = config.get("group.instance.id").map(str::to_owned) {
            config.set("group.instance.id", format!("{id}-lane-{lane}"));
        }
        let client = config.get("client.id").unwrap_or("vitals-processor").to_owned();
        config.set("client.id", format!("{client}-lane-{lane}"));
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_lane_is() {
        let r = Readiness::new(3);
        assert!(!r.all());
        r.set(0, true);
        r.set(2, true);
        assert!(!r.all());
        r.set(1, true);
        assert!(r.all());
        r.set(2, false);
        assert!(!r.all());
    }

    #[test]
    fn static_membership_ids_get_the_lane_and_one_lane_keeps_the_users() {
        let mut c = rdkafka::ClientConfig::new();
        c.set("group.instance.id", "proc-a");
        assert_eq!(
            lane_config(c.clone(), 1, 2).get("group.instance.id"),
            Some("proc-a-lane-1")
        );
        assert_eq!(
            lane_config(c.clone(), 1, 2).get("client.id"),
            Some("vitals-processor-lane-1")
        );
        assert_eq!(lane_config(c, 0, 1).get("group.instance.id"), Some("proc-a"));
    }
}
