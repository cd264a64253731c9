//! vitals' HAProxy log format (`deploy/haproxy/haproxy.cfg`):
//!
//! ```text
//! log-format "vitals1 %Ts.%ms %ID %b %s %ST %TR %Tw %Tc %Tr %Ta %tsc %rc %hs"
//! ```
//!
//! accept time, unique id (`-` without `unique-id-format`), backend, server, status, the
//! request/queue/connect/response/active timers (ms, -1 when the step never happened), the
//! termination state, the retries (`+N` when redispatched) and the captured response headers,
//! the first of which is `Retry-After`. The termination state's first two characters say who
//! ended the request and when; they tell a refused connection (`SC`), a timeout (`sC`, `sH`,
//! `sD`), a server that closed early (`SH`, `SD`) and an invalid answer (`PH`) apart, which the
//! status alone (502, 503, 504 for all of them) cannot.
//!
//! | termination (cause, phase)          | outcome              |
//! |-------------------------------------|----------------------|
//! | `--` normal, or the client left in `D`/`L` | by status: 429 rate_limited (with Retry-After), 5xx server_error, 4xx client_error, else success |
//! | `SC` server refused / reset on connect | connect_error      |
//! | `SH`, `SD`, `SL`, `D*` server closed early, or was marked down | connection_dropped |
//! | `sC`, `sH`, `sD`, `sL` server timeout | timeout             |
//! | `PH`, `PD` HAProxy refused the server's answer | invalid_response |
//! | `CC`, `CH`, `cC`, `cH` client left while waiting for the server | cancelled (neutral) |
//! | `<NOSRV>`, `C`/`c` in `R`/`Q`/`T`, `P`/`L`/`R`/`I`/`K` otherwise, `sQ`/`sT` | not reported (no server was at fault) |
//!
//! Connection retries (`%rc`, HAProxy's default `retry-on conn-failure`) went to the same server
//! unless redispatched: each is reported as one more connect_error; a redispatched request's
//! earlier attempts went to a server the line does not name, and are only counted.

use crate::{class_of_status, line_id, ms, retry_after_ms, Attempt, Bad, Line, Skip};
use vitals_contracts::OutcomeClass;

/// The first word of every line in vitals' format (its version).
pub const MARKER: &str = "vitals1";

fn timer(v: &str, field: &'static str) -> Result<i64, Bad> {
    v.parse::<i64>().ok().filter(|t| *t >= -1).ok_or(Bad::Field(field))
}

/// `%Ts.%ms` (seconds, a dot, a decimal fraction of up to 6 digits) as µs.
fn accept_time(v: &str) -> Result<i64, Bad> {
    let bad = Bad::Field("accept time");
    let (s, frac) = v.split_once('.').unwrap_or((v, "0"));
    let s = s.parse::<i64>().ok().filter(|s| *s > 0 && *s < 1 << 40).ok_or(bad)?;
    if frac.is_empty() || frac.len() > 6 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad);
    }
    let us = frac.parse::<i64>().map_err(|_| bad)? * 10_i64.pow(6 - frac.len() as u32);
    Ok(s * 1_000_000 + us)
}

/// The outcome a termination state and status mean, or why none is reported.
pub fn classify(termination: &str, status: Option<i32>) -> Result<OutcomeClass, Skip> {
    let t = termination.as_bytes();
    let (cause, phase) = (t.first().copied().unwrap_or(b'-'), t.get(1).copied().unwrap_or(b'-'));
    let by_status = || status.map(class_of_status).ok_or(Skip::GatewayAnswered);
    match (cause, phase) {
        (b'-', _) | (b'C' | b'c', b'D' | b'L') => by_status(),
        (b'C' | b'c', b'C' | b'H') => Ok(OutcomeClass::Cancelled),
        (b'C' | b'c', _) => Err(Skip::ClientAborted),
        (b'S', b'C') => Ok(OutcomeClass::ConnectError),
        (b'S', b'H' | b'D' | b'L') | (b'D', _) => Ok(OutcomeClass::ConnectionDropped),
        (b'S', _) => Ok(OutcomeClass::ConnectError),
        (b's', b'C' | b'H' | b'D' | b'L') => Ok(OutcomeClass::Timeout),
        (b'P', b'H' | b'D') => Ok(OutcomeClass::InvalidResponse),
        (b'U', _) => Ok(OutcomeClass::ConnectError),
        _ => Err(Skip::GatewayAnswered),
    }
}

/// Read one message in vitals' format.
pub fn parse(body: &[u8]) -> Result<Line<'_>, Bad> {
    let text = std::str::from_utf8(body).map_err(|_| Bad::NotUtf8)?;
    let mut f = text.split(' ');
    if f.next() != Some(MARKER) {
        return Err(Bad::UnknownFormat);
    }
    let mut next = || f.next().ok_or(Bad::Truncated);
    let (ts, id, backend, server, status) = (next()?, next()?, next()?, next()?, next()?);
    let (tr_req, tw, tc, tr, ta) = (next()?, next()?, next()?, next()?, next()?);
    let (termination, retries) = (next()?, next()?);
    let captured = f.next();
    let started_us = accept_time(ts)?;
    let status = match status.parse::<i32>() {
        Ok(s) if (100..=599).contains(&s) => Some(s),
        Ok(-1) => None,
        _ => return Err(Bad::Field("status")),
    };
    let tr_req = timer(tr_req, "TR")?;
    let tw = timer(tw, "Tw")?;
    let tc = timer(tc, "Tc")?;
    let tr = timer(tr, "Tr")?;
    let ta = timer(ta, "Ta")?;
    if termination.len() < 2 || !termination.is_ascii() {
        return Err(Bad::Field("termination state"));
    }
    let (redispatched, retries) = match retries.strip_prefix('+') {
        Some(r) => (true, r),
        None => (false, retries),
    };
    let retries = retries.parse::<u32>().map_err(|_| Bad::Field("retries"))?;
    if backend.is_empty() || server.is_empty() {
        return Err(Bad::Field("backend or server"));
    }
    if server == "<NOSRV>" {
        return Ok(Line::skipped(Skip::NoServer));
    }
    let outcome = match classify(termination, status) {
        Ok(o) => o,
        Err(s) => return Ok(Line::skipped(s)),
    };
    let retry_after = match (outcome, captured) {
        (OutcomeClass::RateLimited | OutcomeClass::ServerError, Some(c)) => c
            .strip_prefix('{')
            .and_then(|c| c.strip_suffix('}'))
            .and_then(|c| retry_after_ms(c.split('|').next().unwrap_or(""))),
        _ => None,
    };
    let id = if id == "-" || id.is_empty() {
        line_id(body)
    } else {
        id.to_owned()
    };
    // The server's time: from the connection to the last byte, without the client's request and
    // the queue; with retries, the last connection's connect and response time (HAProxy waits
    // between retries, which is not the server's time).
    let latency_us = if retries == 0 && ta >= 0 {
        ms(ta - tr_req.max(0) - tw.max(0))
    } else {
        ms(tc) + ms(tr)
    };
    let detail = Some(&termination[..termination.len().min(4)]);
    let mut attempts = Vec::with_capacity(1 + if redispatched { 0 } else { retries as usize });
    if !redispatched {
        for n in 1..=retries {
            attempts.push(Attempt {
                backend,
                server,
                id: format!("{id}/r{n}"),
                started_us,
                outcome: OutcomeClass::ConnectError,
                status: None,
                latency_us: 0,
                retry_after_ms: None,
                detail: Some("retry"),
            });
        }
    }
    attempts.push(Attempt {
        backend,
        server,
        id,
        started_us,
        outcome,
        status,
        latency_us,
        retry_after_ms: retry_after,
        detail,
    });
    Ok(Line {
        attempts,
        skipped: None,
        unattributed: if redispatched { retries } else { 0 },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(line: &str) -> Attempt<'_> {
        let l = parse(line.as_bytes()).unwrap();
        assert_eq!(l.attempts.len(), 1, "{line}");
        l.attempts.into_iter().next().unwrap()
    }

    #[test]
    fn a_served_request_is_a_success_timed_from_the_connection() {
        let a = one("vitals1 1796113286.182 req-7 be_chat s1 200 3 2 1 40 95 ---- 0 {}");
        assert_eq!((a.backend, a.server, a.id.as_str()), ("be_chat", "s1", "req-7"));
        assert_eq!(a.started_us, 1_796_113_286_182_000);
        assert_eq!(
            (a.outcome, a.status, a.latency_us),
            (OutcomeClass::Success, Some(200), 90_000)
        );
    }

    #[test]
    fn a_refused_connection_retried_three_times_is_four_connect_errors() {
        let l = parse(b"vitals1 1796113286.200 - be_chat s2 503 0 0 -1 -1 3005 SC-- 3 {}").unwrap();
        assert_eq!(l.attempts.len(), 4);
        assert!(l
            .attempts
            .iter()
            .all(|a| a.outcome == OutcomeClass::ConnectError && a.server == "s2"));
        let ids: std::collections::HashSet<_> = l.attempts.iter().map(|a| a.id.clone()).collect();
        assert_eq!(ids.len(), 4, "each attempt its own id");
        assert_eq!(l.attempts[3].status, Some(503));
    }

    #[test]
    fn the_termination_state_tells_apart_what_the_status_cannot() {
        let case = |t: &str, st: &str| one(&format!("vitals1 1.000 - b s {st} 0 0 1 -1 2000 {t} 0 {{}}")).outcome;
        assert_eq!(case("sH--", "504"), OutcomeClass::Timeout);
        assert_eq!(case("SH--", "502"), OutcomeClass::ConnectionDropped);
        assert_eq!(case("PH--", "502"), OutcomeClass::InvalidResponse);
        assert_eq!(case("----", "502"), OutcomeClass::ServerError);
        assert_eq!(case("sD--", "200"), OutcomeClass::Timeout);
        assert_eq!(case("CD--", "200"), OutcomeClass::Success);
        assert_eq!(case("CH--", "-1"), OutcomeClass::Cancelled);
        assert_eq!(case("----", "404"), OutcomeClass::ClientError);
    }

    #[test]
    fn a_rate_limited_answer_carries_its_retry_after() {
        let a = one("vitals1 1.5 - b s 429 0 0 0 1 2 ---- 0 {12}");
        assert_eq!((a.outcome, a.retry_after_ms), (OutcomeClass::RateLimited, Some(12_000)));
        let a = one("vitals1 1.5 - b s 429 0 0 0 1 2 ---- 0");
        assert_eq!(a.retry_after_ms, None, "no capture: no Retry-After");
    }

    #[test]
    fn requests_no_server_was_at_fault_for_are_skipped() {
        for (line, why) in [
            ("vitals1 1.0 - b <NOSRV> 503 0 -1 -1 -1 0 SC-- 0 {}", Skip::NoServer),
            ("vitals1 1.0 - b s -1 0 -1 -1 -1 0 CR-- 0 {}", Skip::ClientAborted),
            ("vitals1 1.0 - b s 403 0 -1 -1 -1 0 PR-- 0 {}", Skip::GatewayAnswered),
            ("vitals1 1.0 - b s 503 0 -1 -1 -1 0 sQ-- 0 {}", Skip::GatewayAnswered),
        ] {
            let l = parse(line.as_bytes()).unwrap();
            assert_eq!((l.attempts.len(), l.skipped), (0, Some(why)), "{line}");
        }
    }

    #[test]
    fn redispatched_retries_are_counted_not_blamed() {
        let l = parse(b"vitals1 1.0 - b s3 200 0 0 1 5 9 ---- +2 {}").unwrap();
        assert_eq!((l.attempts.len(), l.unattributed), (1, 2));
    }

    #[test]
    fn a_line_without_an_id_gets_the_same_id_each_time() {
        let line = "vitals1 1796113286.182 - be_chat s1 200 0 0 0 1 1 ---- 0 {}";
        assert_eq!(one(line).id, one(line).id);
        assert_ne!(one(line).id, one(&line.replace(".182", ".183")).id);
    }

    #[test]
    fn broken_lines_name_what_is_wrong() {
        assert_eq!(parse(b"GET / HTTP/1.1").unwrap_err(), Bad::UnknownFormat);
        assert_eq!(parse(b"vitals1 1.0 - b s 200 0 0").unwrap_err(), Bad::Truncated);
        assert_eq!(
            parse(b"vitals1 x - b s 200 0 0 0 1 1 ---- 0").unwrap_err(),
            Bad::Field("accept time")
        );
        assert_eq!(
            parse(b"vitals1 1.0 - b s 999 0 0 0 1 1 ---- 0").unwrap_err(),
            Bad::Field("status")
        );
        assert_eq!(
            parse(b"vitals1 1.0 - b s 200 0 0 -7 1 1 ---- 0").unwrap_err(),
            Bad::Field("Tc")
        );
        assert_eq!(
            parse(b"vitals1 1.0 - b s 200 0 0 0 1 1 - 0").unwrap_err(),
            Bad::Field("termination state")
        );
        assert_eq!(
            parse(b"vitals1 1.0 - b s 200 0 0 0 1 1 ---- x").unwrap_err(),
            Bad::Field("retries")
        );
        assert_eq!(parse(b"vitals1 \xff").unwrap_err(), Bad::NotUtf8);
    }
}
