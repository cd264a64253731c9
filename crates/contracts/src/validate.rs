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
/// Most entries in a call's `attributes`, and the longest key and value.
pub const MAX_ATTRIBUTES: usize = 32;
pub const MAX_ATTRIBUTE_KEY_LEN: usize = 128;
pub const MAX_ATTRIBUTE_VALUE_LEN: usize = 1024;
/// Longest probe `detail`.
pub const MAX_DETAIL_LEN: usize = 4096;
/// Most dependencies one probe may report.
pub const MAX_DEPENDENCIES: usize = 64;
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

/// A character no name may hold: a control character (NUL, newline, …), or an invisible one —
/// Unicode's format characters (category Cf: bidirectional controls such as U+202E, which make
/// a name display as another, `abc\u{202E}gpj.exe`; zero-width spaces and joiners, the soft
/// hyphen, U+FEFF, tags, interlinear annotations) and the line and paragraph separators (Zl,
/// Zp) — with which two pools look alike and are not.
pub fn is_hidden_control(c: char) -> bool {
    c.is_control() || is_format_or_separator(c)
}

/// Unicode general categories Cf, Zl and Zp (Unicode 16; held equal to the Unicode tables by a
/// test).
pub fn is_format_or_separator(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{0600}'..='\u{0605}'
            | '\u{061C}'
            | '\u{06DD}'
            | '\u{070F}'
            | '\u{0890}'..='\u{0891}'
            | '\u{08E2}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{110BD}'
            | '\u{110CD}'
            | '\u{13430}'..='\u{1343F}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0001}'
            | '\u{E0020}'..='\u{E007F}'
    )
}

/// A name (pool, endpoint, id): not blank, at most [`MAX_NAME_LEN`] bytes (UTF-8), no control
/// characters, no invisible format characters ([`is_hidden_control`]).
pub fn validate_name(field: &'static str, v: &str) -> Result<(), ValidationError> {
    // Nearly every name is printable ASCII with a non-space in it: valid at once (no control
    // or format character is printable ASCII, and space is its only whitespace).
    if v.len() <= MAX_NAME_LEN && v.bytes().all(|b| (0x20..0x7f).contains(&b)) && v.bytes().any(|b| b != b' ') {
        return Ok(());
    }
    if v.trim().is_empty() {
        return Err(bad(field, "must not be empty"));
    }
    if v.len() > MAX_NAME_LEN {
        return Err(bad(field, format!("longer than {MAX_NAME_LEN} bytes (UTF-8)")));
    }
    if v.chars().any(char::is_control) {
        return Err(bad(field, "contains control characters"));
    }
    if v.chars().any(is_hidden_control) {
        return Err(bad(
            field,
            "contains invisible format characters (bidirectional controls, zero-width characters, \
             separators: Unicode Cf, Zl, Zp)",
        ));
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
            validate_name("event_id", &c.event_id)?;
            validate_name("pool", &c.pool)?;
            validate_name("endpoint", &c.endpoint)?;
            validate_name("gateway", &c.gateway)?;
            timestamp("occurred_at", c.occurred_at, reference)?;
            status(c.http_status)?;
            duration("latency_us", c.latency_us)?;
            opt_duration("ttft_us", c.ttft_us)?;
            opt_duration("tpot_us", c.tpot_us)?;
            if c.attributes.len() > MAX_ATTRIBUTES {
                return Err(bad(
                    "attributes",
                    format!("{} entries; at most {MAX_ATTRIBUTES}", c.attributes.len()),
                ));
            }
            for (k, v) in &c.attributes {
                if k.is_empty() || k.len() > MAX_ATTRIBUTE_KEY_LEN {
                    return Err(bad(
                        "attributes",
                        format!("a key must have 1..={MAX_ATTRIBUTE_KEY_LEN} bytes"),
                    ));
                }
                if v.len() > MAX_ATTRIBUTE_VALUE_LEN {
                    return Err(bad(
                        "attributes",
                        format!("the value of {k:?} is longer than {MAX_ATTRIBUTE_VALUE_LEN} bytes"),
                    ));
                }
            }
            if let Some(m) = &c.model {
                validate_name("model", m)?;
            }
            if let Some(r) = c.retry_after_ms {
                if !(0..=MAX_POLICY_SPAN_MS).contains(&r) {
                    return Err(bad(
                        "retry_after_ms",
                        format!("{r} ms is not within 0..={MAX_POLICY_SPAN_MS} ms (a day)"),
                    ));
                }
            }
        }
        Signal::Summary(s) => validate_summary(s, reference)?,
        Signal::Probe(p) => {
            validate_name("probe_id", &p.probe_id)?;
            validate_name("pool", &p.pool)?;
            validate_name("endpoint", &p.endpoint)?;
            validate_name("prober", &p.prober)?;
            timestamp("occurred_at", p.occurred_at, reference)?;
            status(p.http_status)?;
            duration("latency_us", p.latency_us)?;
            opt_duration("ttft_us", p.ttft_us)?;
            if let Some(i) = p.interval_ms {
                if !(1..=3_600_000).contains(&i) {
                    return Err(bad("interval_ms", format!("{i} ms is not between 1 ms and an hour")));
                }
            }
            if p.dependencies.len() > MAX_DEPENDENCIES {
                return Err(bad(
                    "dependencies",
                    format!("{} entries; at most {MAX_DEPENDENCIES}", p.dependencies.len()),
                ));
            }
            for d in &p.dependencies {
                validate_name("dependencies.name", &d.name)?;
            }
            if p.detail.len() > MAX_DETAIL_LEN {
                return Err(bad("detail", format!("longer than {MAX_DETAIL_LEN} bytes")));
            }
        }
        Signal::Tick(t) => {
            validate_name("ticker", &t.ticker)?;
            timestamp("emitted_at", t.emitted_at, None)?;
        }
        Signal::Override(o) => {
            validate_name("override_id", &o.override_id)?;
            validate_name("pool", &o.pool)?;
            validate_name("endpoint", &o.endpoint)?;
            validate_name("actor", &o.actor)?;
            validate_name("reason", &o.reason)?;
            timestamp("issued_at", o.issued_at, reference)?;
        }
        Signal::Policy(p) => {
            validate_name("change_id", &p.change_id)?;
            validate_name("pool", &p.pool)?;
            validate_name("actor", &p.actor)?;
            timestamp("issued_at", p.issued_at, reference)?;
            validate_policy(&p.policy)?;
        }
    }
    Ok(())
}

/// Most calls one summary may sum: a million calls a second to one endpoint for an hour.
pub const MAX_SUMMARY_CALLS: i64 = 3_600_000_000;
/// The longest interval one summary may cover: a minute.
pub const MAX_SUMMARY_SPAN_US: i64 = 60_000_000;
/// Most buckets in a summary's histogram (an hour needs 1,106 at 1 %).
pub const MAX_HISTOGRAM_BUCKETS: usize = 1_200;

fn histogram(field: &'static str, h: &crate::summary::Histogram, calls: i64) -> Result<(), ValidationError> {
    if h.buckets.len() > MAX_HISTOGRAM_BUCKETS {
        return Err(bad(
            field,
            format!("{} buckets; at most {MAX_HISTOGRAM_BUCKETS}", h.buckets.len()),
        ));
    }
    let top = crate::summary::Histogram::index(MAX_DURATION_US);
    let mut last = -1;
    for b in &h.buckets {
        if b.index <= last || b.index > top {
            return Err(bad(
                field,
                format!(
                    "bucket indexes must ascend within 0..={top} (an hour); {} follows {last}",
                    b.index
                ),
            ));
        }
        if b.count <= 0 {
            return Err(bad(
                field,
                format!("bucket {} counts {}; counts are above 0", b.index, b.count),
            ));
        }
        last = b.index;
    }
    if h.count() > calls {
        return Err(bad(field, format!("{} values for {calls} successful calls", h.count())));
    }
    if h.sum_us < 0 {
        return Err(bad(field, format!("sum_us {} is negative", h.sum_us)));
    }
    Ok(())
}

fn validate_summary(s: &crate::summary::CallSummary, reference: Option<Micros>) -> Result<(), ValidationError> {
    validate_name("summary_id", &s.summary_id)?;
    validate_name("pool", &s.pool)?;
    validate_name("endpoint", &s.endpoint)?;
    validate_name("gateway", &s.gateway)?;
    timestamp("started_at", s.started_at, reference)?;
    timestamp("ended_at", s.ended_at, reference)?;
    if s.ended_at < s.started_at || s.ended_at - s.started_at > MAX_SUMMARY_SPAN_US {
        return Err(bad(
            "ended_at",
            format!(
                "must be within a minute after started_at ({} µs after)",
                s.ended_at - s.started_at
            ),
        ));
    }
    for (c, n) in OutcomeClass::ALL.iter().map(|c| (*c, s.calls.get(*c))) {
        if !(0..=MAX_SUMMARY_CALLS).contains(&n) {
            return Err(bad(
                "calls",
                format!("{}: {n} is not within 0..={MAX_SUMMARY_CALLS}", c.as_str()),
            ));
        }
    }
    let total = s.calls.total();
    if total == 0 || total > MAX_SUMMARY_CALLS {
        return Err(bad(
            "calls",
            format!("{total} calls; a summary sums 1..={MAX_SUMMARY_CALLS}"),
        ));
    }
    histogram("latency", &s.latency, s.calls.success)?;
    histogram("ttft", &s.ttft, s.calls.success)?;
    let failures = s.failures();
    let success = s.calls.success;
    let runs = [
        ("leading_failures", s.leading_failures, failures),
        ("longest_failure_run", s.longest_failure_run, failures),
        ("trailing_failures", s.trailing_failures, failures),
        ("trailing_successes", s.trailing_successes, success),
        ("longest_hard_run", s.longest_hard_run, i64::from(s.longest_failure_run)),
        ("trailing_hard", s.trailing_hard, i64::from(s.trailing_failures)),
        ("trailing_rate_limited", s.trailing_rate_limited, s.calls.rate_limited),
    ];
    for (field, v, most) in runs {
        if v < 0 || i64::from(v) > most {
            return Err(bad(
                field,
                format!("{v} is not within 0..={most} (the calls it counts)"),
            ));
        }
    }
    if s.leading_failures > s.longest_failure_run || s.trailing_failures > s.longest_failure_run {
        return Err(bad("longest_failure_run", "shorter than the leading or trailing run"));
    }
    if s.trailing_failures > 0 && s.trailing_successes > 0 {
        return Err(bad(
            "trailing_successes",
            "a summary ends with failures or with successes, not both",
        ));
    }
    if let Some(r) = s.max_retry_after_ms {
        if !(0..=MAX_POLICY_SPAN_MS).contains(&r) {
            return Err(bad(
                "max_retry_after_ms",
                format!("{r} ms is not within 0..={MAX_POLICY_SPAN_MS} ms (a day)"),
            ));
        }
    }
    if s.models.len() > crate::summary::MAX_SUMMARY_MODELS {
        return Err(bad(
            "models",
            format!(
                "{} entries; at most {}",
                s.models.len(),
                crate::summary::MAX_SUMMARY_MODELS
            ),
        ));
    }
    for m in &s.models {
        validate_name("models", m)?;
    }
    if let Some(reporters) = &s.reporters {
        summary_reporters(reporters, success + failures, failures)?;
    }
    Ok(())
}

/// A merged summary's reporters: at most [`MAX_SUMMARY_REPORTERS`], each with well-formed scopes
/// and counts within the summary's.
fn summary_reporters(reporters: &[ReporterCounts], calls: i64, failures: i64) -> Result<(), ValidationError> {
    if reporters.len() > MAX_SUMMARY_REPORTERS {
        return Err(bad(
            "reporters",
            format!("{} entries; at most {MAX_SUMMARY_REPORTERS}", reporters.len()),
        ));
    }
    let (mut all_calls, mut all_failures) = (0i64, 0i64);
    for r in reporters {
        if r.scopes.is_empty() || r.scopes.len() > crate::scope::KINDS.len() {
            return Err(bad(
                "reporters",
                format!(
                    "{} scopes; a reporter has 1 to {}",
                    r.scopes.len(),
                    crate::scope::KINDS.len()
                ),
            ));
        }
        for scope in &r.scopes {
            crate::scope::parse(scope).map_err(|e| bad("reporters", e))?;
        }
        if !(0 <= r.trailing_failures && r.trailing_failures <= r.failures && r.failures <= r.calls) {
            return Err(bad(
                "reporters",
                format!(
                    "{}: 0 <= trailing_failures ({}) <= failures ({}) <= calls ({}) does not hold",
                    r.scopes.join(","),
                    r.trailing_failures,
                    r.failures,
                    r.calls
                ),
            ));
        }
        all_calls = all_calls.saturating_add(r.calls);
        all_failures = all_failures.saturating_add(r.failures);
    }
    if all_calls > calls || all_failures > failures {
        return Err(bad(
            "reporters",
            format!(
                "the reporters' {all_calls} calls ({all_failures} failed) are more than the summary's {calls} ({failures} failed)"
            ),
        ));
    }
    Ok(())
}

fn fraction(field: &'static str, v: f64, lo: f64, hi: f64) -> Result<(), ValidationError> {
    if !v.is_finite() || v < lo || v > hi {
        return Err(bad(field, format!("{v} is not within {lo}..={hi}")));
    }
    Ok(())
}

/// Longest time span a policy may set: one day (isolation caps, resets). Every other duration is
/// bounded by an hour. Bounds keep every time computation of the engine far from overflow and
/// every timestamp it writes within what Postgres stores.
pub const MAX_POLICY_SPAN_MS: i64 = 24 * 3_600_000;
const HOUR_MS: i64 = 3_600_000;
/// Largest count a policy may set (volumes, consecutive outcomes, peers).
pub const MAX_POLICY_COUNT: i32 = 1_000_000;

fn span(field: &'static str, v: i64, lo: i64, hi: i64) -> Result<(), ValidationError> {
    if v < lo || v > hi {
        return Err(bad(field, format!("{v} ms is not within {lo}..={hi} ms")));
    }
    Ok(())
}

/// The most endpoints a policy may let one pool hold. An engine keeps about 1 kB per endpoint
/// and a pool's decisions look at all of its endpoints, so a pool this large is already a fleet.
pub const MAX_POOL_ENDPOINTS: i32 = 100_000;

fn count(field: &'static str, v: i32, hi: i32) -> Result<(), ValidationError> {
    if v < 1 || v > hi {
        return Err(bad(field, format!("{v} is not within 1..={hi}")));
    }
    Ok(())
}

/// Range and cross-field checks of a policy. A policy that passes cannot make the engine divide
/// by zero, allocate without bound, overflow its time arithmetic or write a timestamp Postgres
/// cannot store. The same checks serve the API (400 naming the field) and the processor
/// (a PolicyChange that fails them is dead-lettered).
pub fn validate_policy(p: &Policy) -> Result<(), ValidationError> {
    if p.version < 0 {
        return Err(bad("policy.version", "must not be negative"));
    }
    span("policy.window_ms", p.window_ms, 1_000, HOUR_MS)?;
    span("policy.bucket_ms", p.bucket_ms, 100, HOUR_MS)?;
    if p.window_ms % p.bucket_ms != 0 {
        return Err(bad("policy.bucket_ms", "must divide window_ms"));
    }
    if p.window_ms / p.bucket_ms > MAX_BUCKETS {
        return Err(bad(
            "policy.bucket_ms",
            format!("window_ms/bucket_ms must be at most {MAX_BUCKETS}"),
        ));
    }
    count("policy.min_volume", p.min_volume, MAX_POLICY_COUNT)?;
    fraction("policy.failure_rate_threshold", p.failure_rate_threshold, 0.0, 1.0)?;
    count("policy.consecutive_failures", p.consecutive_failures, 10_000)?;
    count("policy.consecutive_successes", p.consecutive_successes, 10_000)?;
    count("policy.suspect_after_failures", p.suspect_after_failures, 10_000)?;
    count("policy.hard_break_after", p.hard_break_after, 10_000)?;
    fraction("policy.ewma_beta", p.ewma_beta, 0.0, 0.999)?;
    fraction("policy.ttft_baseline_ms", p.ttft_baseline_ms, 0.0, HOUR_MS as f64)?;
    if !p.ttft_max_ms.is_finite() || p.ttft_max_ms <= p.ttft_baseline_ms || p.ttft_max_ms > HOUR_MS as f64 {
        return Err(bad(
            "policy.ttft_max_ms",
            format!("must be greater than ttft_baseline_ms and at most {HOUR_MS} ms"),
        ));
    }
    span("policy.slow_call_ms", p.slow_call_ms, 1, HOUR_MS)?;
    fraction("policy.degrade_below", p.degrade_below, 0.0, 100.0)?;
    fraction("policy.recover_above", p.recover_above, 0.0, 100.0)?;
    if p.recover_above < p.degrade_below {
        return Err(bad(
            "policy.recover_above",
            "must not be below degrade_below (the deadband)",
        ));
    }
    span("policy.recover_hold_ms", p.recover_hold_ms, 0, HOUR_MS)?;
    fraction("policy.degraded_weight", p.degraded_weight, 0.0, 1.0)?;
    span("policy.isolation_base_ms", p.isolation_base_ms, 1, HOUR_MS)?;
    span(
        "policy.isolation_max_ms",
        p.isolation_max_ms,
        p.isolation_base_ms,
        MAX_POLICY_SPAN_MS,
    )?;
    span(
        "policy.isolation_reset_ms",
        p.isolation_reset_ms,
        1,
        7 * MAX_POLICY_SPAN_MS,
    )?;
    span("policy.slow_start_ms", p.slow_start_ms, 0, HOUR_MS)?;
    fraction("policy.slow_start_weight", p.slow_start_weight, 0.0, 1.0)?;
    fraction("policy.max_ejection_pct", p.max_ejection_pct, 0.0, 100.0)?;
    fraction("policy.panic_threshold_pct", p.panic_threshold_pct, 0.0, 100.0)?;
    fraction("policy.latency_outlier_factor", p.latency_outlier_factor, 1.0, 1000.0)?;
    count(
        "policy.latency_outlier_min_peers",
        p.latency_outlier_min_peers,
        MAX_POLICY_COUNT,
    )?;
    fraction(
        "policy.latency_outlier_min_ms",
        p.latency_outlier_min_ms,
        0.0,
        HOUR_MS as f64,
    )?;
    span("policy.heartbeat_interval_ms", p.heartbeat_interval_ms, 1, HOUR_MS)?;
    count("policy.heartbeat_suspect_intervals", p.heartbeat_suspect_intervals, 100)?;
    count(
        "policy.heartbeat_unhealthy_intervals",
        p.heartbeat_unhealthy_intervals,
        1000,
    )?;
    if p.heartbeat_unhealthy_intervals <= p.heartbeat_suspect_intervals {
        return Err(bad(
            "policy.heartbeat_unhealthy_intervals",
            "must exceed heartbeat_suspect_intervals",
        ));
    }
    span("policy.readmit_min_ms", p.readmit_min_ms, 0, HOUR_MS)?;
    span("policy.cooldown_ms", p.cooldown_ms, 1, HOUR_MS)?;
    fraction("policy.rate_limited_share", p.rate_limited_share, 0.0, 1.0)?;
    fraction("policy.peer_failure_z", p.peer_failure_z, 0.0, 10.0)?;
    fraction("policy.peer_failure_margin", p.peer_failure_margin, 0.0, 1.0)?;
    count("policy.max_endpoints", p.max_endpoints, MAX_POOL_ENDPOINTS)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-written table is Unicode's: every character, against the general category.
    #[test]
    fn invisible_format_characters_are_exactly_unicodes_cf_zl_and_zp() {
        use unicode_general_category::{get_general_category, GeneralCategory as G};
        let differ: Vec<String> = (0..=0x10FFFFu32)
            .filter_map(char::from_u32)
            .filter(|&c| {
                let unicode = matches!(
                    get_general_category(c),
                    G::Format | G::LineSeparator | G::ParagraphSeparator
                );
                unicode != is_format_or_separator(c)
            })
            .map(|c| format!("U+{:04X}", c as u32))
            .collect();
        assert!(differ.is_empty(), "{differ:?}");
        for look_alike in [
            "pool\u{200B}",
            "\u{FEFF}pool",
            "po\u{00AD}ol",
            "a\u{2028}b",
            "a\u{180E}",
            "a\u{E0001}",
            "a\u{FFF9}",
        ] {
            let e = validate_name("pool", look_alike).unwrap_err();
            assert!(e.message.contains("invisible"), "{look_alike:?}: {e:?}");
        }
        assert!(validate_name("pool", "δelta/ü-1").is_ok(), "letters of any script stay");
    }

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
            retry_after_ms: None,
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
            (
                "attributes",
                Box::new(|c| {
                    c.attributes = (0..100).map(|i| (format!("k{i}"), "v".into())).collect();
                }),
            ),
            (
                "attributes",
                Box::new(|c| {
                    c.attributes.insert("k".into(), "x".repeat(2_000_000));
                }),
            ),
            ("model", Box::new(|c| c.model = Some("m".repeat(10_000)))),
            ("retry_after_ms", Box::new(|c| c.retry_after_ms = Some(-1))),
            ("retry_after_ms", Box::new(|c| c.retry_after_ms = Some(i64::MAX))),
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

    /// The values an administrator got accepted, each of which stalled or broke a pool.
    #[test]
    fn policy_values_that_overflow_time_are_rejected_with_the_field_named() {
        type Mutation = Box<dyn Fn(&mut Policy)>;
        let cases: Vec<(&str, Mutation)> = vec![
            (
                "policy.isolation_base_ms",
                Box::new(|p| {
                    p.isolation_base_ms = 17_444_980_000_000_000;
                    p.isolation_max_ms = 17_444_980_000_000_000;
                }),
            ),
            ("policy.isolation_max_ms", Box::new(|p| p.isolation_max_ms = i64::MAX)),
            (
                "policy.heartbeat_interval_ms",
                Box::new(|p| p.heartbeat_interval_ms = i64::MAX),
            ),
            ("policy.slow_start_ms", Box::new(|p| p.slow_start_ms = i64::MAX)),
            ("policy.recover_hold_ms", Box::new(|p| p.recover_hold_ms = i64::MAX)),
            (
                "policy.window_ms",
                Box::new(|p| {
                    p.window_ms = 60_000_000_000_000_000;
                    p.bucket_ms = 1_000_000_000_000_000;
                }),
            ),
            ("policy.ttft_max_ms", Box::new(|p| p.ttft_max_ms = 1e308)),
            ("policy.slow_call_ms", Box::new(|p| p.slow_call_ms = i64::MAX)),
            (
                "policy.isolation_reset_ms",
                Box::new(|p| p.isolation_reset_ms = i64::MAX),
            ),
            ("policy.min_volume", Box::new(|p| p.min_volume = i32::MAX)),
            (
                "policy.heartbeat_unhealthy_intervals",
                Box::new(|p| p.heartbeat_unhealthy_intervals = i32::MAX),
            ),
            ("policy.readmit_min_ms", Box::new(|p| p.readmit_min_ms = i64::MAX)),
            ("policy.cooldown_ms", Box::new(|p| p.cooldown_ms = 0)),
            (
                "policy.rate_limited_share",
                Box::new(|p| p.rate_limited_share = f64::NAN),
            ),
            ("policy.peer_failure_z", Box::new(|p| p.peer_failure_z = -1.0)),
            ("policy.peer_failure_margin", Box::new(|p| p.peer_failure_margin = 2.0)),
            ("policy.max_endpoints", Box::new(|p| p.max_endpoints = 0)),
            (
                "policy.max_endpoints",
                Box::new(|p| p.max_endpoints = MAX_POOL_ENDPOINTS + 1),
            ),
        ];
        for (field, mutate) in cases {
            let mut p = Policy::default();
            mutate(&mut p);
            let err = validate_policy(&p).unwrap_err();
            assert_eq!(err.field, field, "{err}");
        }
    }
}
