//! What the prober knows of each endpoint, for the adaptive cadence: an endpoint that is
//! suspect, unhealthy or recovering is probed at its fast interval (that is what brings it back
//! quickly), filled from the compacted state topic; and whether gateway calls reach it (a
//! healthy endpoint that carries traffic is probed at its slower traffic interval, and a
//! synthetic completion is skipped while real calls bring first-token times), filled from the
//! call outcomes on the signals topic.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use vitals_contracts::cadence::{wants_fast, TRAFFIC_MEMORY};
use vitals_contracts::HealthState;

/// When the latest calls, and the last successful call with a first-token time, were seen (ms
/// since the view's epoch, plus one; 0: never).
#[derive(Debug, Default, Clone, Copy)]
struct Traffic {
    /// A ring: the next call goes at `next`.
    calls: [u64; TRAFFIC_MEMORY],
    next: usize,
    ttft: u64,
}

impl Traffic {
    fn saw(&mut self, now: u64) {
        self.calls[self.next] = now;
        self.next = (self.next + 1) % TRAFFIC_MEMORY;
    }

    /// When the `k`-th latest call (1: the latest) was seen, `k` at most [`TRAFFIC_MEMORY`].
    fn call(&self, k: usize) -> u64 {
        self.calls[(self.next + TRAFFIC_MEMORY - k) % TRAFFIC_MEMORY]
    }
}

/// What the prober knows of each endpoint for its cadence (not a router's health view:
/// `vitals-healthview` is that).
pub struct CadenceView {
    endpoints: Mutex<HashMap<(String, String), watch::Sender<bool>>>,
    /// pool → endpoint → traffic (nested, so that a lookup by &str allocates nothing).
    traffic: Mutex<HashMap<String, HashMap<String, Traffic>>>,
    epoch: Instant,
}

impl Default for CadenceView {
    fn default() -> Self {
        CadenceView {
            endpoints: Mutex::new(HashMap::new()),
            traffic: Mutex::new(HashMap::new()),
            epoch: Instant::now(),
        }
    }
}

impl CadenceView {
    /// Follow whether `pool`/`endpoint` wants the fast cadence.
    pub fn fast(&self, pool: &str, endpoint: &str) -> watch::Receiver<bool> {
        let mut map = self.endpoints.lock().expect("view lock");
        map.entry((pool.to_owned(), endpoint.to_owned()))
            .or_insert_with(|| watch::channel(false).0)
            .subscribe()
    }

    pub fn set(&self, pool: &str, endpoint: &str, state: HealthState) {
        let fast = wants_fast(state);
        let mut map = self.endpoints.lock().expect("view lock");
        let tx = map
            .entry((pool.to_owned(), endpoint.to_owned()))
            .or_insert_with(|| watch::channel(false).0);
        tx.send_if_modified(|v| std::mem::replace(v, fast) != fast);
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// A gateway call to `pool`/`endpoint` was seen; `with_ttft`: a success with a first-token time.
    pub fn saw_call(&self, pool: &str, endpoint: &str, with_ttft: bool) {
        let now = self.now_ms();
        let mut map = self.traffic.lock().expect("traffic lock");
        let eps = match map.get_mut(pool) {
            Some(e) => e,
            None => map.entry(pool.to_owned()).or_default(),
        };
        let t = match eps.get_mut(endpoint) {
            Some(t) => t,
            None => eps.entry(endpoint.to_owned()).or_default(),
        };
        t.saw(now);
        if with_ttft {
            t.ttft = now;
        }
    }

    fn seen_within(&self, pool: &str, endpoint: &str, within: Duration, f: impl Fn(&Traffic) -> u64) -> bool {
        let now = self.now_ms();
        let map = self.traffic.lock().expect("traffic lock");
        map.get(pool)
            .and_then(|e| e.get(endpoint))
            .map(f)
            .is_some_and(|at| at > 0 && now.saturating_sub(at) <= within.as_millis() as u64)
    }

    /// Whether at least `calls` gateway calls reached the endpoint within `within` (at most
    /// [`TRAFFIC_MEMORY`]).
    pub fn carries_traffic(&self, pool: &str, endpoint: &str, within: Duration, calls: usize) -> bool {
        let k = calls.clamp(1, TRAFFIC_MEMORY);
        self.seen_within(pool, endpoint, within, |t| t.call(k))
    }

    /// Whether a real call brought a first-token time within `within`.
    pub fn ttft_covered(&self, pool: &str, endpoint: &str, within: Duration) -> bool {
        self.seen_within(pool, endpoint, within, |t| t.ttft)
    }

    /// Endpoints on the fast cadence now.
    pub fn fast_count(&self) -> usize {
        let map = self.endpoints.lock().expect("view lock");
        map.values().filter(|tx| *tx.borrow()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_is_the_latest_calls_within_the_interval() {
        let ms = Duration::from_millis;
        let v = CadenceView::default();
        let within = Duration::from_secs(60);
        assert!(!v.carries_traffic("p", "e", within, 3), "no calls");
        v.saw_call("p", "e", false);
        v.saw_call("p", "e", false);
        assert!(!v.carries_traffic("p", "e", within, 3), "two calls of three");
        v.saw_call("p", "e", true);
        assert!(v.carries_traffic("p", "e", within, 3));
        assert!(!v.carries_traffic("p", "e", within, 9));
        assert!(v.ttft_covered("p", "e", within));
        assert!(!v.carries_traffic("p", "other", within, 1), "per endpoint");
        std::thread::sleep(ms(20));
        assert!(
            !v.carries_traffic("p", "e", ms(10), 3),
            "the third-latest call is older than the interval"
        );
    }
}
