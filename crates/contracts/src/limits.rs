//! When a rate limit lifts, as an upstream's HTTP answer says it: `retry-after-ms` (OpenAI's and
//! Azure OpenAI's exact delay), `Retry-After` in seconds, and OpenAI's `x-ratelimit-reset-*`
//! durations. Pure text parsing, shared by every reader of a gateway's answers (the router, the
//! OTLP mapping, the HAProxy and nginx log parsers), so that each takes the same delay from the
//! same headers. A delay is at most a day; anything else is passed over (None).

/// A Retry-After value in milliseconds: delay-seconds only (an HTTP date needs a clock).
pub fn retry_after_ms(v: &str) -> Option<i64> {
    let v = v.trim();
    if v.is_empty() || v.len() > 9 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse::<i64>().ok().map(|s| s * 1000)
}

/// An `x-ratelimit-reset-*` value in milliseconds: the time until the limit resets as OpenAI
/// and the APIs that copy its headers write it (`20ms`, `1s`, `6m0s`, `1h2m3.5s`), or plain
/// seconds. None for anything else, or past a day.
pub fn ratelimit_reset_ms(v: &str) -> Option<i64> {
    let v = header_value(v)?;
    if let Ok(secs) = v.parse::<f64>() {
        return within_a_day(secs * 1000.0);
    }
    let (mut total, mut rest) = (0.0f64, v);
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let n: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit_ms, len) = if rest.starts_with("ms") {
            (1.0, 2)
        } else if rest.starts_with('h') {
            (3_600_000.0, 1)
        } else if rest.starts_with('m') {
            (60_000.0, 1)
        } else if rest.starts_with('s') {
            (1000.0, 1)
        } else {
            return None;
        };
        total += n * unit_ms;
        rest = &rest[len..];
    }
    within_a_day(total)
}

/// A delay header's value, trimmed: None when empty or longer than any delay is written.
fn header_value(v: &str) -> Option<&str> {
    let v = v.trim();
    (!v.is_empty() && v.len() <= 24).then_some(v)
}

/// `ms` rounded, if it is a delay within a day (not negative, not NaN, not infinite).
fn within_a_day(ms: f64) -> Option<i64> {
    (0.0..=86_400_000.0).contains(&ms).then(|| ms.round() as i64)
}

/// A `retry-after-ms` value (OpenAI's and Azure OpenAI's, which their SDKs read before
/// Retry-After): milliseconds, whole or not, within a day. None for anything else.
pub fn retry_after_exact_ms(v: &str) -> Option<i64> {
    within_a_day(header_value(v)?.parse::<f64>().ok()?)
}

/// When a 429's limit lifts, in milliseconds, from the response headers `header` gives (by
/// lower-case name): `retry-after-ms` first, then `Retry-After`, else the `x-ratelimit-reset-*`
/// of the limit that ran out (requests or tokens, by their `x-ratelimit-remaining-*`; the later
/// of the two when the headers do not say which). A header that does not parse is passed over.
pub fn limit_lifts_in_ms<S: AsRef<str>>(header: impl Fn(&str) -> Option<S>) -> Option<i64> {
    if let Some(ms) = header("retry-after-ms").and_then(|v| retry_after_exact_ms(v.as_ref())) {
        return Some(ms);
    }
    if let Some(ms) = header("retry-after").and_then(|v| retry_after_ms(v.as_ref())) {
        return Some(ms);
    }
    let reset = |kind: &str| header(&format!("x-ratelimit-reset-{kind}")).and_then(|v| ratelimit_reset_ms(v.as_ref()));
    let out = |kind: &str| {
        header(&format!("x-ratelimit-remaining-{kind}"))
            .and_then(|v| v.as_ref().trim().parse::<f64>().ok())
            .is_some_and(|n| n <= 0.0)
    };
    match (out("requests"), out("tokens")) {
        (true, false) => reset("requests"),
        (false, true) => reset("tokens"),
        _ => reset("requests").max(reset("tokens")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratelimit_resets_read_openai_durations_and_plain_seconds() {
        for (v, ms) in [
            ("20ms", 20),
            ("1s", 1000),
            ("6m0s", 360_000),
            ("1h2m3.5s", 3_723_500),
            ("0.5s", 500),
            (" 2 ", 2000),
            ("1.25", 1250),
        ] {
            assert_eq!(ratelimit_reset_ms(v), Some(ms), "{v}");
        }
        for v in ["", "s", "1x", "m1s", "-1s", "1d", "25h", "90000", "1s2", "NaN", "inf"] {
            assert_eq!(ratelimit_reset_ms(v), None, "{v}");
        }
    }

    #[test]
    fn a_limit_lifts_when_retry_after_says_else_when_the_exhausted_limit_resets() {
        fn lifts(pairs: &[(&str, &'static str)]) -> Option<i64> {
            limit_lifts_in_ms(|name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| *v))
        }
        let (rq, tk) = (
            ("x-ratelimit-reset-requests", "2s"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        );
        assert_eq!(lifts(&[("retry-after", "7"), rq, tk]), Some(7000));
        assert_eq!(lifts(&[rq, tk]), Some(360_000), "the later, when unsaid");
        let remaining = |requests, tokens| {
            [
                ("x-ratelimit-remaining-requests", requests),
                ("x-ratelimit-remaining-tokens", tokens),
                rq,
                tk,
            ]
        };
        assert_eq!(lifts(&remaining("0", "900")), Some(2000));
        assert_eq!(lifts(&remaining("12", "0")), Some(360_000));
        assert_eq!(lifts(&[("retry-after", "soon")]), None);
        assert_eq!(lifts(&[]), None);
        // retry-after-ms first; one that does not parse is passed over.
        let ra = ("retry-after", "7");
        assert_eq!(lifts(&[("retry-after-ms", "1500"), ra, rq, tk]), Some(1500));
        assert_eq!(lifts(&[("retry-after-ms", "20.4"), ra]), Some(20));
        for bad in ["inf", "NaN", "-5", "", "1e309", "soon", "86400001"] {
            assert_eq!(lifts(&[("retry-after-ms", bad), ra]), Some(7000), "{bad}");
        }
    }

    #[test]
    fn retry_after_takes_seconds_and_refuses_the_rest() {
        assert_eq!(retry_after_ms("7"), Some(7000));
        assert_eq!(retry_after_ms(" 30 "), Some(30_000));
        assert_eq!(retry_after_ms("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(retry_after_ms("-1"), None);
        assert_eq!(retry_after_ms("99999999999"), None);
        assert_eq!(retry_after_ms(""), None);
    }
}
