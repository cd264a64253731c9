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
use vitals_contracts::HealthState;

/// When the last call, and the last successful call with a first-token time, were seen (ms
/// since the view's epoch, plus one; 0: never).
#[derive(Debug, Default, Clone, Copy)]
struct Traffic {
    call: u64,
    ttft: u64,
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

/// Whether an endpoint in this state wants the fast cadence.
pub fn wants_fast(state: HealthState) -> bool {
    matches!(
        state,
        HealthState::Suspect | HealthState::Unhealthy | HealthState::Recovering
    )
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
        t.call = now;
        if with_ttft {
            t.ttft = now;
        }
    }

    fn seen_within(&self, pool: &str, endpoint: &str, within: Duration, f: fn(&Traffic) -> u64) -> bool {
        let now = self.now_ms();
        let map = self.traffic.lock().expect("traffic lock");
        map.get(pool)
            .and_then(|e| e.get(endpoint))
            .map(f)
            .is_some_and(|at| at > 0 && now.saturating_sub(at) <= within.as_millis() as u64)
    }

    /// Whether gateway calls reached the endpoint within `within`.
    pub fn carries_traffic(&self, pool: &str, endpoint: &str, within: Duration) -> bool {
        self.seen_within(pool, endpoint, within, |t| t.call)
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
