//! What an endpoint does: its [`Behaviour`], checked.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Longest first token, ramp, period or Retry-After a behaviour may ask for: an hour.
pub(crate) const MAX_MS: u64 = 3_600_000;
/// How long a hanging request hangs (a client times out long before).
pub(crate) const HANG: Duration = Duration::from_secs(3_600);

/// What one endpoint does. Every field has a default (a healthy endpoint answering its first
/// token in 250 ms); unknown fields are an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Behaviour {
    /// Time to the first content token, ms.
    pub ttft_ms: u64,
    /// Ramp the first token from `ttft_ms` to this over `ramp_ms`, from when the behaviour was set.
    pub ttft_to_ms: Option<u64>,
    pub ramp_ms: u64,
    /// Content tokens a completion streams (at most the request's `max_tokens`).
    pub tokens: u32,
    /// Time between content tokens, ms.
    pub token_ms: u64,
    /// Share of requests answered 503.
    pub server_errors: f64,
    /// Share of completions answered 429, with `Retry-After: retry_after_s` when set.
    pub rate_limited: f64,
    pub retry_after_s: Option<u64>,
    /// Share of completions answered 400.
    pub client_errors: f64,
    /// Share of requests whose connection drops mid-response.
    pub drops: f64,
    /// The listener is closed: connections are refused.
    pub refuse: bool,
    /// Requests are never answered.
    pub hang: bool,
    /// A stream's role chunk comes with its first content token instead of at once (some
    /// upstreams send nothing before the first token; a gateway that times the first chunk sees
    /// a slow first token only then).
    pub role_chunk_with_first_token: bool,
    /// The faults above apply only in the bad part of each period (healthy in the good part).
    pub period: Option<Period>,
    /// What the deep-health route reports; a critical one down makes it answer 503.
    pub dependencies: Vec<Dependency>,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            ttft_ms: 250,
            ttft_to_ms: None,
            ramp_ms: 0,
            tokens: 8,
            token_ms: 10,
            server_errors: 0.0,
            rate_limited: 0.0,
            retry_after_s: None,
            client_errors: 0.0,
            drops: 0.0,
            refuse: false,
            hang: false,
            role_chunk_with_first_token: false,
            period: None,
            dependencies: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Period {
    pub bad_ms: u64,
    pub good_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dependency {
    pub name: String,
    pub critical: bool,
    pub status: DependencyStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DependencyStatus {
    Up,
    Degraded,
    Down,
}

/// A behaviour that cannot be served, with the field at fault.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    pub field: &'static str,
    pub message: String,
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for Invalid {}

pub(crate) fn invalid(field: &'static str, message: impl Into<String>) -> Invalid {
    Invalid {
        field,
        message: message.into(),
    }
}

impl Behaviour {
    pub fn validate(&self) -> Result<(), Invalid> {
        let ms = |field, v: u64| {
            if v > MAX_MS {
                Err(invalid(field, format!("{v} ms is more than an hour")))
            } else {
                Ok(())
            }
        };
        ms("ttft_ms", self.ttft_ms)?;
        ms("ttft_to_ms", self.ttft_to_ms.unwrap_or(0))?;
        ms("ramp_ms", self.ramp_ms)?;
        ms("token_ms", self.token_ms)?;
        ms("retry_after_s", self.retry_after_s.unwrap_or(0).saturating_mul(1000))?;
        if self.tokens > 10_000 {
            return Err(invalid("tokens", "at most 10000"));
        }
        let mut sum = 0.0;
        for (field, v) in [
            ("server_errors", self.server_errors),
            ("rate_limited", self.rate_limited),
            ("client_errors", self.client_errors),
            ("drops", self.drops),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(invalid(field, format!("{v} is not a share within 0..=1")));
            }
            sum += v;
        }
        if sum > 1.0 + 1e-9 {
            return Err(invalid(
                "drops",
                format!("server_errors + rate_limited + client_errors + drops is {sum}, more than 1"),
            ));
        }
        if let Some(p) = self.period {
            if p.bad_ms == 0 || p.good_ms == 0 || p.bad_ms > MAX_MS || p.good_ms > MAX_MS {
                return Err(invalid("period", "bad_ms and good_ms must be within 1..=3600000"));
            }
        }
        if self.dependencies.iter().any(|d| d.name.is_empty()) {
            return Err(invalid("dependencies", "a dependency needs a name"));
        }
        Ok(())
    }

    /// Whether the faults apply `elapsed` after the behaviour was set.
    pub(crate) fn bad_at(&self, elapsed: Duration) -> bool {
        match self.period {
            None => true,
            Some(p) => (elapsed.as_millis() as u64) % (p.bad_ms + p.good_ms) < p.bad_ms,
        }
    }

    /// When the phase changes next, `elapsed` after the behaviour was set.
    pub(crate) fn next_phase_change(&self, elapsed: Duration) -> Option<Duration> {
        let p = self.period?;
        let cycle = p.bad_ms + p.good_ms;
        let pos = elapsed.as_millis() as u64 % cycle;
        let left = if pos < p.bad_ms { p.bad_ms - pos } else { cycle - pos };
        Some(Duration::from_millis(left))
    }

    pub(crate) fn ttft(&self, elapsed: Duration) -> Duration {
        let from = self.ttft_ms as f64;
        let ms = match self.ttft_to_ms {
            Some(to) if self.ramp_ms > 0 => {
                let done = (elapsed.as_millis() as f64 / self.ramp_ms as f64).min(1.0);
                from + (to as f64 - from) * done
            }
            Some(to) => to as f64,
            None => from,
        };
        Duration::from_micros((ms * 1000.0) as u64)
    }
}
