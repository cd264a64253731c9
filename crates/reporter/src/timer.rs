//! Measuring a call for the caller: start, first token, end, and the outcome class.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use vitals_contracts::{CallOutcome, OutcomeClass};

/// How a call ended, as the gateway saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallResult {
    /// An HTTP answer (the whole body read, or the stream ended normally).
    Status(u16),
    /// No answer (or no first token) within the gateway's deadline.
    Timeout,
    /// The connection could not be opened.
    ConnectError,
    /// The connection broke before the answer was complete.
    Dropped,
    /// The answer could not be understood (not the protocol, not JSON, …).
    InvalidResponse,
    /// The caller went away.
    Cancelled,
}

impl CallResult {
    /// The outcome class vitals counts.
    pub fn class(self) -> OutcomeClass {
        match self {
            CallResult::Status(429) => OutcomeClass::RateLimited,
            CallResult::Status(s) if s >= 500 => OutcomeClass::ServerError,
            CallResult::Status(s) if s >= 400 => OutcomeClass::ClientError,
            CallResult::Status(_) => OutcomeClass::Success,
            CallResult::Timeout => OutcomeClass::Timeout,
            CallResult::ConnectError => OutcomeClass::ConnectError,
            CallResult::Dropped => OutcomeClass::ConnectionDropped,
            CallResult::InvalidResponse => OutcomeClass::InvalidResponse,
            CallResult::Cancelled => OutcomeClass::Cancelled,
        }
    }
}

/// A watched call's first token: still awaited, come (or the call ended), or reported late.
pub(crate) const WAITING: u8 = 0;
pub(crate) const DONE: u8 = 1;
pub(crate) const EARLY: u8 = 2;

/// One call being measured.
#[derive(Debug, Clone)]
pub struct CallTimer {
    pub(crate) pool: String,
    pub(crate) endpoint: String,
    started: Instant,
    pub(crate) started_at_us: i64,
    first_token: Option<Instant>,
    /// Set when the reporter watches the first token's deadline ([`crate::Reporter::start_call`]).
    pub(crate) watch: Option<Arc<AtomicU8>>,
}

impl CallTimer {
    pub fn start(pool: impl Into<String>, endpoint: impl Into<String>) -> CallTimer {
        CallTimer {
            pool: pool.into(),
            endpoint: endpoint.into(),
            started: Instant::now(),
            started_at_us: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as i64),
            first_token: None,
            watch: None,
        }
    }

    /// When the call started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The first content token arrived (the first call wins).
    pub fn first_token(&mut self) {
        self.first_token.get_or_insert_with(Instant::now);
        self.settle();
    }

    /// The call's own report is still due: no early report of a slow first token went out (and
    /// none will now).
    pub(crate) fn settle(&self) -> bool {
        match &self.watch {
            None => true,
            Some(w) => match w.compare_exchange(WAITING, DONE, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => true,
                Err(now) => now == DONE,
            },
        }
    }

    /// The call ended: its outcome, with an id unique to this gateway.
    pub fn finish(
        self,
        gateway: &str,
        id: impl Into<String>,
        result: CallResult,
        retry_after_ms: Option<i64>,
    ) -> CallOutcome {
        let status = match result {
            CallResult::Status(s) => Some(i32::from(s)),
            _ => None,
        };
        CallOutcome {
            event_id: id.into(),
            pool: self.pool,
            endpoint: self.endpoint,
            gateway: gateway.to_owned(),
            occurred_at: self.started_at_us,
            outcome: result.class(),
            http_status: status,
            latency_us: self.started.elapsed().as_micros() as i64,
            ttft_us: self.first_token.map(|f| (f - self.started).as_micros() as i64),
            tpot_us: None,
            attributes: Default::default(),
            model: None,
            retry_after_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_transport_errors_map_to_the_outcome_classes() {
        let cases = [
            (CallResult::Status(200), OutcomeClass::Success),
            (CallResult::Status(304), OutcomeClass::Success),
            (CallResult::Status(400), OutcomeClass::ClientError),
            (CallResult::Status(429), OutcomeClass::RateLimited),
            (CallResult::Status(503), OutcomeClass::ServerError),
            (CallResult::Timeout, OutcomeClass::Timeout),
            (CallResult::ConnectError, OutcomeClass::ConnectError),
            (CallResult::Dropped, OutcomeClass::ConnectionDropped),
            (CallResult::InvalidResponse, OutcomeClass::InvalidResponse),
            (CallResult::Cancelled, OutcomeClass::Cancelled),
        ];
        for (r, c) in cases {
            assert_eq!(r.class(), c, "{r:?}");
        }
    }

    #[test]
    fn a_timed_call_carries_its_first_token_and_latency() {
        let mut t = CallTimer::start("p", "e");
        std::thread::sleep(std::time::Duration::from_millis(20));
        t.first_token();
        std::thread::sleep(std::time::Duration::from_millis(10));
        t.first_token();
        let o = t.finish("gw", "id-1", CallResult::Status(200), None);
        let ttft = o.ttft_us.unwrap();
        assert!((20_000..30_000).contains(&ttft), "{ttft}");
        assert!(o.latency_us >= ttft + 10_000);
        assert_eq!((o.outcome, o.http_status), (OutcomeClass::Success, Some(200)));
    }
}
