//! The probe cadence a prober keeps per endpoint, from the endpoint's published state and the
//! gateway calls it sees: vitals-prober follows it, and the closed-loop scorecard models it.

use crate::HealthState;
use std::time::Duration;

/// Whether an endpoint in this state is probed at the fast interval: suspect, out or
/// recovering — that is what brings it back quickly.
pub fn wants_fast(state: HealthState) -> bool {
    matches!(
        state,
        HealthState::Suspect | HealthState::Unhealthy | HealthState::Recovering
    )
}

/// The most calls per endpoint a prober remembers to judge its traffic (see
/// [`calls_for_traffic`]).
pub const TRAFFIC_MEMORY: usize = 16;

/// Calls an endpoint must carry within its traffic interval for them to be its evidence (and
/// its probes to slow to that interval): three for each probe the plain interval sends over
/// that time, so that a call now and then does not slow its probes. One call within the plain
/// interval did: in the scorecard's `low-traffic` (0.125 calls a second into the endpoint) an
/// outage was seen 13.1 s after it began at the median of 20 runs and 20.4 s in the worst,
/// against 9.9 and 15.0 s at this count. At most [`TRAFFIC_MEMORY`].
pub fn calls_for_traffic(interval: Duration, traffic_interval: Duration) -> usize {
    let spared = traffic_interval.as_millis().div_ceil(interval.as_millis().max(1)) as usize;
    (3 * spared).clamp(1, TRAFFIC_MEMORY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_calls_for_each_probe_of_the_plain_interval() {
        let ms = Duration::from_millis;
        assert_eq!(calls_for_traffic(ms(5_000), ms(15_000)), 9);
        assert_eq!(calls_for_traffic(ms(300), ms(1_500)), 15);
        assert_eq!(calls_for_traffic(ms(100), ms(3_600_000)), TRAFFIC_MEMORY);
    }
}
