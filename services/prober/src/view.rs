//! What the prober knows of each endpoint's health, for the adaptive cadence: an endpoint that is
//! suspect, unhealthy or recovering is probed at its fast interval (that is what brings it back
//! quickly). Filled from the compacted state topic, read from its beginning and followed.

use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::watch;
use vitals_contracts::HealthState;

#[derive(Default)]
pub struct HealthView {
    endpoints: Mutex<HashMap<(String, String), watch::Sender<bool>>>,
}

/// Whether an endpoint in this state wants the fast cadence.
pub fn wants_fast(state: HealthState) -> bool {
    matches!(
        state,
        HealthState::Suspect | HealthState::Unhealthy | HealthState::Recovering
    )
}

impl HealthView {
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

    /// Endpoints on the fast cadence now.
    pub fn fast_count(&self) -> usize {
        let map = self.endpoints.lock().expect("view lock");
        map.values().filter(|tx| *tx.borrow()).count()
    }
}
