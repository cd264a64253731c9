//! Who sends an export, and how much they may send: the bearer token a request carries (the
//! tokens file the API reads, [`vitals_runtime::tokens`]), the gateways and pools that token may
//! report for, and a budget per token — spans per second, and new endpoints per minute — so that
//! one reporter that floods is slowed and no other is.
//!
//! Without authentication (`--no-auth`, loopback only) every request is the one reporter
//! `anonymous`, with the same budget.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vitals_contracts::hash::Fnv64;
use vitals_contracts::CallOutcome;
use vitals_runtime::tokens::{Binding, NotBound};

/// The reporter a request was authenticated as.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The token's name (the label of its metrics), or `anonymous`.
    pub name: String,
    pub binding: Binding,
}

impl Caller {
    pub fn anonymous() -> Caller {
        Caller {
            name: ANONYMOUS.to_owned(),
            binding: Binding::default(),
        }
    }

    /// Whether this caller may report `call` (its gateway and pool within the binding).
    pub fn may_report(&self, call: &CallOutcome) -> Result<(), NotBound> {
        self.binding.check(&self.name, "gateway", &call.gateway, &call.pool)
    }

    /// The name spans whose resource names no service are reported as: the token's.
    pub fn reporter(&self) -> Option<&str> {
        (self.name != ANONYMOUS).then_some(self.name.as_str())
    }
}

pub const ANONYMOUS: &str = "anonymous";

/// A reporter's budget.
#[derive(Debug, Clone, Copy)]
pub struct Quota {
    /// Spans a second, on average; a burst of two seconds' worth is taken at once.
    pub spans_per_sec: u64,
    /// Distinct (pool, endpoint) pairs a reporter may report in a minute.
    pub endpoints_per_min: usize,
}

/// One reporter's use of its budget.
#[derive(Debug)]
struct Use {
    /// Spans it may still send now (a token bucket).
    spans: f64,
    at: Instant,
    /// The minute its endpoints are counted in, and those seen in it (hashes of pool and
    /// endpoint: a span's lookup allocates nothing).
    minute: Instant,
    endpoints: rustc_hash::FxHashSet<u64>,
}

/// Why a request is over its reporter's budget, and when it may be sent again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Over {
    pub message: String,
    pub retry_after: Duration,
}

/// Every reporter's budget: a map bounded by the tokens (one entry each, and `anonymous`).
pub struct Budgets {
    quota: Quota,
    uses: Mutex<HashMap<String, Use>>,
}

const MINUTE: Duration = Duration::from_secs(60);

impl Budgets {
    pub fn new(quota: Quota) -> Budgets {
        Budgets {
            quota,
            uses: Mutex::new(HashMap::new()),
        }
    }

    /// Take `spans` spans reporting `calls` from `who`'s budget at `now`, all or nothing.
    pub fn take(&self, who: &str, now: Instant, spans: u64, calls: &[CallOutcome]) -> Result<(), Over> {
        let q = self.quota;
        let burst = (q.spans_per_sec * 2) as f64;
        let mut uses = self.uses.lock().unwrap_or_else(|e| e.into_inner());
        let u = uses.entry(who.to_owned()).or_insert_with(|| Use {
            spans: burst,
            at: now,
            minute: now,
            endpoints: Default::default(),
        });
        let elapsed = now.saturating_duration_since(u.at).as_secs_f64();
        u.spans = (u.spans + elapsed * q.spans_per_sec as f64).min(burst);
        u.at = now;
        if now.saturating_duration_since(u.minute) >= MINUTE {
            u.minute = now;
            u.endpoints.clear();
        }
        if spans as f64 > u.spans {
            let short = spans as f64 - u.spans;
            let wait = if spans as f64 > burst {
                // More than a burst in one request: it can never fit; split it.
                return Err(Over {
                    message: format!(
                        "{spans} spans in one request is more than reporter {who:?} may send at once ({burst}): send smaller requests"
                    ),
                    retry_after: Duration::from_secs(1),
                });
            } else {
                // Whole seconds: what a Retry-After header says.
                Duration::from_secs((short / q.spans_per_sec.max(1) as f64).ceil() as u64)
            };
            return Err(Over {
                message: format!(
                    "reporter {who:?} sends more than {} spans a second: send again later",
                    q.spans_per_sec
                ),
                retry_after: wait.max(Duration::from_secs(1)),
            });
        }
        let new: rustc_hash::FxHashSet<u64> = calls
            .iter()
            .map(|c| Fnv64::new().parts(&[c.pool.as_bytes(), c.endpoint.as_bytes()]).finish())
            .filter(|h| !u.endpoints.contains(h))
            .collect();
        if u.endpoints.len() + new.len() > q.endpoints_per_min {
            let lifts = MINUTE.saturating_sub(now.saturating_duration_since(u.minute));
            return Err(Over {
                message: format!(
                    "reporter {who:?} reports on more than {} endpoints a minute: check its table, or send again later",
                    q.endpoints_per_min
                ),
                retry_after: lifts.max(Duration::from_secs(1)),
            });
        }
        u.spans -= spans as f64;
        u.endpoints.extend(new);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vitals_contracts::OutcomeClass;

    fn calls(endpoints: std::ops::Range<usize>) -> Vec<CallOutcome> {
        endpoints
            .map(|e| CallOutcome::new(format!("c{e}"), "p", format!("e{e}"), "g", 0, OutcomeClass::Success))
            .collect()
    }

    #[test]
    fn spans_beyond_a_reporters_rate_wait_and_other_reporters_are_untouched() {
        let b = Budgets::new(Quota {
            spans_per_sec: 100,
            endpoints_per_min: 1_000,
        });
        let t0 = Instant::now();
        assert!(b.take("a", t0, 150, &[]).is_ok());
        assert!(b.take("a", t0, 50, &[]).is_ok(), "a burst of two seconds");
        let over = b.take("a", t0, 50, &[]).unwrap_err();
        assert!(over.message.contains("100 spans a second"), "{}", over.message);
        assert_eq!(over.retry_after, Duration::from_secs(1));
        assert!(b.take("b", t0, 200, &[]).is_ok(), "another reporter has its own budget");
        assert!(
            b.take("a", t0 + Duration::from_millis(500), 50, &[]).is_ok(),
            "refilled"
        );
        let big = b.take("a", t0 + Duration::from_secs(60), 201, &[]).unwrap_err();
        assert!(big.message.contains("send smaller requests"), "{}", big.message);
        assert!(b.take("a", t0 + Duration::from_secs(60), 150, &[]).is_ok());
        let waits = b.take("a", t0 + Duration::from_secs(60), 180, &[]).unwrap_err();
        assert_eq!(
            waits.retry_after,
            Duration::from_secs(2),
            "130 short at 100 a second, rounded up"
        );
    }

    #[test]
    fn new_endpoints_beyond_a_minutes_cap_are_refused_whole_until_the_minute_ends() {
        let b = Budgets::new(Quota {
            spans_per_sec: 1_000_000,
            endpoints_per_min: 10,
        });
        let t0 = Instant::now();
        assert!(b.take("a", t0, 8, &calls(0..8)).is_ok());
        assert!(b.take("a", t0, 8, &calls(0..8)).is_ok(), "known endpoints cost nothing");
        let over = b.take("a", t0 + Duration::from_secs(20), 5, &calls(6..11)).unwrap_err();
        assert!(over.message.contains("10 endpoints a minute"), "{}", over.message);
        assert_eq!(over.retry_after, Duration::from_secs(40));
        assert!(
            b.take("a", t0, 2, &calls(8..10)).is_ok(),
            "refused whole: 8 and 9 were not taken"
        );
        assert!(b.take("b", t0, 10, &calls(100..110)).is_ok());
        assert!(b.take("a", t0 + MINUTE, 10, &calls(20..30)).is_ok(), "a new minute");
    }
}
