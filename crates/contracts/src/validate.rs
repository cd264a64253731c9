//! Rules a signal must pass before the engine sees it. The processor dead-letters a record that
//! fails them; the HTTP ingest answers with the same reason per item.

use crate::types::*;

/// Signals more than this far from stream time are rejected: a gateway clock that is a day off
/// is broken, and its timestamps would poison time-based evidence.
pub const MAX_SKEW_MICROS: Micros = 24 * 3600 * 1_000_000;
/// Longest name accepted for a pool, endpoint, id, gateway or prober.
pub const MAX_NAME_LEN: usize = 256;
/// Longest latency accepted: one hour.
pub const MAX_DURATION_US: i64 = 3_600 * 1_000_000;
/// Most buckets a sliding window may have; it bounds engine memory per endpoint.
pub const MAX_BUCKETS: i64 = 60;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ValidationError {
    /// The offending field, e.g. `latency_us` or `policy.window_ms`.
    pub field: &'static str,
    pub message: String,
}

fn bad(field: &'static str, message: impl Into<String>) -> ValidationError {
    ValidationError {
        field,
        message: message.into(),
    }
}

fn name(field: &'static str, v: &str) -> Result<(), ValidationError> {
    if v.trim().is_empty() {
        return Err(bad(field, "must not be empty"));
    }
    if v.len() > MAX_NAME_LEN {
        return Err(bad(field, format!("longer than {MAX_NAME_LEN} bytes")));
    }
    if v.chars().any(char::is_control) {
        return Err(bad(field, "contains control characters"));
    }
    Ok(())
}

fn duration(field: &'static str, v: i64) -> Result<(), ValidationError> {
    if v < 0 {
        return Err(bad(field, format!("negative ({v})")));
    }
    if v > MAX_DURATION_US {
        return Err(bad(field, format!("{v} µs is more than an hour")));
    }
    Ok(())
}

fn opt_duration(field: &'static str, v: Option<i64>) -> Result<(), ValidationError> {
    v.map_or(Ok(()), |v| duration(field, v))
}

fn status(v: Option<i32>) -> Result<(), ValidationError> {
    match v {
        Some(s) if !(100..=599).contains(&s) => Err(bad("http_status", format!("{s} is not an HTTP status"))),
        _ => Ok(()),
    }
}

fn timestamp(field: &'static str, t: Micros, reference: Option<Micros>) -> Result<(), ValidationError> {
    if t <= 0 {
        return Err(bad(field, format!("{t} is not a timestamp after 1970")));
    }
    if let Some(r) = reference {
        let skew = t.saturating_sub(r).saturating_abs();
        if skew > MAX_SKEW_MICROS {
            return Err(bad(field, format!("{} s away from stream time", skew / 1_000_000)));
        }
    }
    Ok(())
}

/// Validate a signal. `reference` is the stream time (processor) or the wall clock (ingest API);
/// timestamps more than [`MAX_SKEW_MICROS`] away from it are rejected.
pub fn validate_signal(signal: &Signal, reference: Option<Micros>) -> Result<(), ValidationError> {
    match signal {
        Signal::Call(c) => {
            name("event_id", &c.event_id)?;
            name("pool", &c.pool)?;
            name("endpoint", &c.endpoint)?;
            name("gateway", &c.gateway)?;
            timestamp("occurred_at", c.occurred_at, reference)?;
            status(c.http_status)?;
            duration("latency_us", c.latency_us)?;
            opt_duration("ttft_us", c.ttft_us)?;
            opt_duration("tpot_us", c.tpot_us)?;
        }
        Signal::Probe(p) => {
            name("probe_id", &p.probe_id)?;
            name("pool", &p.pool)?;
            name("endpoint", &p.endpoint)?;
            name("prober", &p.prober)?;
            timestamp("occurred_at", p.occurred_at, reference)?;
            status(p.http_status)?;
            duration("latency_us", p.latency_us)?;
            opt_duration("ttft_us", p.ttft_us)?;
            if let Some(i) = p.interval_ms {
                if !(1..=3_600_000).contains(&i) {
                    return Err(bad("interval_ms", format!("{i} ms is not between 1 ms and an hour")));
                }
            }
            for d in &p.dependencies {
                name("dependencies.name", &d.name)?;
            }
        }
        Signal::Tick(t) => {
            name("ticker", &t.ticker)?;
            timestamp("emitted_at", t.emitted_at, None)?;
        }
        Signal::Override(o) => {
            name("override_id", &o.override_id)?;
            name("pool", &o.pool)?;
            name("endpoint", &o.endpoint)?;
            name("actor", &o.actor)?;
            name("reason", &o.reason)?;
            timestamp("issued_at", o.issued_at, reference)?;
        }
        Signal::Policy(p) => {
            name("change_id", &p.change_id)?;
            name("pool", &p.pool)?;
            name("actor", &p.actor)?;
            timestamp("issued_at", p.issued_at, reference)?;
            validate_policy(&p.policy)?;
        }
    }
    Ok(())
}

fn fraction(field: &'static str, v: f64, lo: f64, hi: f64) -> Result<(), ValidationError> {
    if !v.is_finite() || v < lo || v > hi {
        return Err(bad(field, format!("{v} is not within {lo}..={hi}")));
    }
    Ok(())
}

fn positive(field: &'static str, v: i64) -> Result<(), ValidationError> {
    if v <= 0 {
        return Err(bad(field, format!("{v} must be positive")));
    }
    Ok(())
}

/// Cross-field checks of a policy. A policy that passes cannot make the engine divide by zero or
/// allocate without bound.
pub fn validate_policy(p: &Policy) -> Result<(), ValidationError> {
    if p.version < 0 {
        return Err(bad("policy.version", "must not be negative"));
    }
    positive("policy.window_ms", p.window_ms)?;
    positive("policy.bucket_ms", p.bucket_ms)?;
    if p.window_ms % p.bucket_ms != 0 {
        return Err(bad("policy.bucket_ms", "must divide window_ms"));
    }
    if p.window_ms / p.bucket_ms > MAX_BUCKETS {
        return Err(bad(
            "policy.bucket_ms",
            format!("window_ms/bucket_ms must be at most {MAX_BUCKETS}"),
        ));
    }
    positive("policy.min_volume", p.min_volume.into())?;
    fraction("policy.failure_rate_threshold", p.failure_rate_threshold, 0.0, 1.0)?;
    positive("policy.consecutive_failures", p.consecutive_failures.into())?;
    positive("policy.consecutive_successes", p.consecutive_successes.into())?;
    positive("policy.suspect_after_failures", p.suspect_after_failures.into())?;
    positive("policy.hard_break_after", p.hard_break_after.into())?;
    fraction("policy.ewma_beta", p.ewma_beta, 0.0, 0.999)?;
    fraction("policy.ttft_baseline_ms", p.ttft_baseline_ms, 0.0, 3.6e6)?;
    if !p.ttft_max_ms.is_finite() || p.ttft_max_ms <= p.ttft_baseline_ms {
        return Err(bad("policy.ttft_max_ms", "must be greater than ttft_baseline_ms"));
    }
    positive("policy.slow_call_ms", p.slow_call_ms)?;
    fraction("policy.degrade_below", p.degrade_below, 0.0, 100.0)?;
    fraction("policy.recover_above", p.recover_above, 0.0, 100.0)?;
    if p.recover_above < p.degrade_below {
        return Err(bad(
            "policy.recover_above",
            "must not be below degrade_below (the deadband)",
        ));
    }
    if p.recover_hold_ms < 0 {
        return Err(bad("policy.recover_hold_ms", "must not be negative"));
    }
    fraction("policy.degraded_weight", p.degraded_weight, 0.0, 1.0)?;
    positive("policy.isolation_base_ms", p.isolation_base_ms)?;
    if p.isolation_max_ms < p.isolation_base_ms {
        return Err(bad("policy.isolation_max_ms", "must not be below isolation_base_ms"));
    }
    positive("policy.isolation_reset_ms", p.isolation_reset_ms)?;
    if p.slow_start_ms < 0 {
        return Err(bad("policy.slow_start_ms", "must not be negative"));
    }
    fraction("policy.slow_start_weight", p.slow_start_weight, 0.0, 1.0)?;
    fraction("policy.max_ejection_pct", p.max_ejection_pct, 0.0, 100.0)?;
    fraction("policy.panic_threshold_pct", p.panic_threshold_pct, 0.0, 100.0)?;
    fraction("policy.latency_outlier_factor", p.latency_outlier_factor, 1.0, 1000.0)?;
    positive("policy.latency_outlier_min_peers", p.latency_outlier_min_peers.into())?;
    fraction("policy.latency_outlier_min_ms", p.latency_outlier_min_ms, 0.0, 3.6e6)?;
    positive("policy.heartbeat_interval_ms", p.heartbeat_interval_ms)?;
    positive(
        "policy.heartbeat_suspect_intervals",
        p.heartbeat_suspect_intervals.into(),
    )?;
    if p.heartbeat_unhealthy_intervals <= p.heartbeat_suspect_intervals {
        return Err(bad(
            "policy.heartbeat_unhealthy_intervals",
            "must exceed heartbeat_suspect_intervals",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call() -> CallOutcome {
        CallOutcome {
            event_id: "e1".into(),
            pool: "p".into(),
            endpoint: "a".into(),
            gateway: "gw".into(),
            occurred_at: 1_700_000_000_000_000,
            outcome: OutcomeClass::Success,
            http_status: Some(200),
            latency_us: 1000,
            ttft_us: None,
            tpot_us: None,
            attributes: Default::default(),
            model: None,
        }
    }

    #[test]
    fn a_sane_call_passes() {
        assert_eq!(
            validate_signal(&Signal::Call(call()), Some(1_700_000_000_000_000)),
            Ok(())
        );
    }

    #[test]
    fn nonsense_values_are_rejected_with_the_field_named() {
        type Mutation = Box<dyn Fn(&mut CallOutcome)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("latency_us", Box::new(|c| c.latency_us = -5)),
            ("pool", Box::new(|c| c.pool = "".into())),
            ("endpoint", Box::new(|c| c.endpoint = "  ".into())),
            ("http_status", Box::new(|c| c.http_status = Some(42))),
            ("occurred_at", Box::new(|c| c.occurred_at += 3 * MAX_SKEW_MICROS)),
            ("ttft_us", Box::new(|c| c.ttft_us = Some(-1))),
        ];
        for (field, mutate) in cases {
            let mut c = call();
            mutate(&mut c);
            let err = validate_signal(&Signal::Call(c), Some(1_700_000_000_000_000)).unwrap_err();
            assert_eq!(err.field, field, "{err}");
        }
    }

    #[test]
    fn the_default_policy_is_valid_and_a_broken_one_is_not() {
        assert_eq!(validate_policy(&Policy::default()), Ok(()));
        let p = Policy {
            bucket_ms: 7_000,
            ..Policy::default()
        };
        assert_eq!(validate_policy(&p).unwrap_err().field, "policy.bucket_ms");
        let p = Policy {
            recover_above: 50.0,
            ..Policy::default()
        };
        assert_eq!(validate_policy(&p).unwrap_err().field, "policy.recover_above");
    }
}
