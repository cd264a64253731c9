//! vitals' nginx log format (`deploy/nginx/vitals.conf`), one JSON object per request:
//!
//! ```text
//! log_format vitals_json escape=json '{"v":1,"time":"$msec","id":"$request_id",'
//!   '"upstream":"$proxy_host","addr":"$upstream_addr","status":"$upstream_status",'
//!   '"connect":"$upstream_connect_time","header":"$upstream_header_time",'
//!   '"response":"$upstream_response_time","retry_after":"$upstream_http_retry_after",'
//!   '"request_time":"$request_time","client_status":"$status"}';
//! ```
//!
//! nginx lists every upstream server it tried for the request, in order (`, ` between servers,
//! ` : ` between internal redirects), in `$upstream_addr` and the same position of each time and
//! status; each gives one attempt. The times tell what the status cannot:
//!
//! | upstream status and times                      | outcome                        |
//! |------------------------------------------------|--------------------------------|
//! | headers received (`$upstream_header_time`)     | by status: 429 rate_limited (Retry-After of the last answer), 5xx server_error, 4xx client_error, else success |
//! | no headers, 504                                | timeout                        |
//! | no headers, 502, no connect time               | connect_error (refused, unreachable) |
//! | no headers, 502, connected                     | connection_dropped (closed before answering) |
//! | 499, or no status and the client left (499)    | cancelled (neutral)            |
//! | the address is the upstream's name             | not reported: no live server was left to try |

use crate::{class_of_status, line_id, retry_after_ms, Attempt, Bad, Line, Skip};
use serde::Deserialize;
use std::borrow::Cow;
use vitals_contracts::OutcomeClass;

#[derive(Deserialize)]
struct Record<'a> {
    v: Option<i64>,
    #[serde(borrow)]
    time: Cow<'a, str>,
    #[serde(borrow, default)]
    id: Cow<'a, str>,
    #[serde(borrow)]
    upstream: Cow<'a, str>,
    #[serde(borrow)]
    addr: Cow<'a, str>,
    #[serde(borrow)]
    status: Cow<'a, str>,
    #[serde(borrow, default)]
    connect: Cow<'a, str>,
    #[serde(borrow, default)]
    header: Cow<'a, str>,
    #[serde(borrow, default)]
    response: Cow<'a, str>,
    #[serde(borrow, default)]
    retry_after: Cow<'a, str>,
    #[serde(borrow, default)]
    request_time: Cow<'a, str>,
    #[serde(borrow, default)]
    client_status: Cow<'a, str>,
}

/// The values nginx gives per upstream tried, in order.
fn each(v: &str) -> impl Iterator<Item = &str> {
    v.split([',', ':']).map(str::trim).filter(|s| !s.is_empty())
}

/// Addresses, in order: `, ` and ` : ` separate them (an address has `:` but no spaces around).
fn addresses(v: &str) -> impl Iterator<Item = &str> {
    v.split(", ").flat_map(|s| s.split(" : ")).map(str::trim)
}

/// Seconds with a fraction (`0.012`) as µs; None for `-`.
fn secs(v: Option<&str>, field: &'static str) -> Result<Option<i64>, Bad> {
    seconds(v, field, 86_400.0)
}

fn seconds(v: Option<&str>, field: &'static str, max: f64) -> Result<Option<i64>, Bad> {
    match v {
        None | Some("-") | Some("") => Ok(None),
        Some(s) => s
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0 && *s < max)
            .map(|s| Some((s * 1e6).round() as i64))
            .ok_or(Bad::Field(field)),
    }
}

fn borrowed<'a>(c: &Cow<'a, str>, field: &'static str) -> Result<&'a str, Bad> {
    match c {
        Cow::Borrowed(s) => Ok(s),
        Cow::Owned(_) => Err(Bad::Field(field)),
    }
}

/// Read one JSON message in vitals' format.
pub fn parse(body: &[u8]) -> Result<Line<'_>, Bad> {
    if body.first() != Some(&b'{') {
        return Err(Bad::UnknownFormat);
    }
    // nginx's `escape=json` passes bytes above 0x7F as they came (a client's header, say).
    if std::str::from_utf8(body).is_err() {
        return Err(Bad::NotUtf8);
    }
    let r: Record<'_> = serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Eof => Bad::Truncated,
        _ if e.to_string().contains("UTF-8") => Bad::NotUtf8,
        _ => Bad::Field("json"),
    })?;
    if r.v.is_some_and(|v| v != 1) {
        return Err(Bad::Field("v"));
    }
    let backend = borrowed(&r.upstream, "upstream")?;
    let addr = borrowed(&r.addr, "addr")?;
    let ended = seconds(Some(&r.time), "time", 1e11)?.ok_or(Bad::Field("time"))?;
    let took = secs(Some(&r.request_time), "request_time")?.unwrap_or(0);
    let started_us = ended - took;
    let client_left = r.client_status == "499";
    if addr.is_empty() || addr == "-" || backend.is_empty() {
        return Ok(Line::skipped(if client_left {
            Skip::ClientAborted
        } else {
            Skip::NoServer
        }));
    }
    let id = if r.id.is_empty() || r.id == "-" {
        line_id(body)
    } else {
        r.id.into_owned()
    };
    let addrs: Vec<&str> = addresses(addr).collect();
    let (statuses, connects, headers, responses): (Vec<_>, Vec<_>, Vec<_>, Vec<_>) = (
        each(&r.status).collect(),
        each(&r.connect).collect(),
        each(&r.header).collect(),
        each(&r.response).collect(),
    );
    let n = addrs.len();
    if statuses.len() != n {
        return Err(Bad::Field("status"));
    }
    let mut attempts = Vec::with_capacity(n);
    let mut no_server = false;
    for (i, server) in addrs.into_iter().enumerate() {
        // nginx names the upstream group itself when no live server was left to try.
        if server == backend || !(server.contains(':') || server.starts_with("unix")) {
            no_server = true;
            continue;
        }
        let status = match statuses[i] {
            "-" => None,
            s => Some(
                s.parse::<i32>()
                    .ok()
                    .filter(|s| (100..=599).contains(s))
                    .ok_or(Bad::Field("status"))?,
            ),
        };
        let connect = secs(connects.get(i).copied(), "connect")?;
        let header = secs(headers.get(i).copied(), "header")?;
        let response = secs(responses.get(i).copied(), "response")?;
        let outcome = match (status, header) {
            (Some(499), _) => OutcomeClass::Cancelled,
            (Some(s), Some(_)) => class_of_status(s),
            (Some(504), None) => OutcomeClass::Timeout,
            (Some(_), None) if connect.is_none() => OutcomeClass::ConnectError,
            (Some(_), None) => OutcomeClass::ConnectionDropped,
            (None, _) if client_left => OutcomeClass::Cancelled,
            (None, _) => return Err(Bad::Field("status")),
        };
        let last = i + 1 == n;
        attempts.push(Attempt {
            backend,
            server,
            id: if n == 1 { id.clone() } else { format!("{id}/{i}") },
            started_us,
            outcome,
            status,
            latency_us: response.or(header).unwrap_or(0),
            retry_after_ms: if last && matches!(status, Some(429 | 503)) {
                retry_after_ms(&r.retry_after)
            } else {
                None
            },
            detail: None,
        });
    }
    let skipped = (attempts.is_empty() && no_server).then_some(Skip::NoServer);
    Ok(Line {
        attempts,
        skipped,
        unattributed: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(addr: &str, status: &str, connect: &str, header: &str, response: &str) -> String {
        format!(
            r#"{{"v":1,"time":"1796113290.250","id":"abc","upstream":"chat","addr":"{addr}","status":"{status}","connect":"{connect}","header":"{header}","response":"{response}","retry_after":"3","request_time":"0.250","client_status":"200"}}"#
        )
    }

    #[test]
    fn one_upstream_answering_is_one_success() {
        let text = line("127.0.0.1:9001", "200", "0.001", "0.020", "0.200");
        let l = parse(text.as_bytes()).unwrap();
        let a = &l.attempts[0];
        assert_eq!((a.backend, a.server, a.id.as_str()), ("chat", "127.0.0.1:9001", "abc"));
        assert_eq!(
            (a.outcome, a.status, a.latency_us),
            (OutcomeClass::Success, Some(200), 200_000)
        );
        assert_eq!(a.started_us, 1_796_113_290_000_000);
    }

    #[test]
    fn each_upstream_tried_gives_its_own_outcome() {
        let text = line(
            "127.0.0.1:9001, 127.0.0.1:9002, 127.0.0.1:9003 : 127.0.0.1:9004",
            "502, 504, 502 : 429",
            "-, 0.001, 0.001 : 0.000",
            "-, -, - : 0.004",
            "0.000, 1.000, 0.010 : 0.005",
        );
        let l = parse(text.as_bytes()).unwrap();
        let got: Vec<_> = l
            .attempts
            .iter()
            .map(|a| (a.server, a.outcome, a.id.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("127.0.0.1:9001", OutcomeClass::ConnectError, "abc/0"),
                ("127.0.0.1:9002", OutcomeClass::Timeout, "abc/1"),
                ("127.0.0.1:9003", OutcomeClass::ConnectionDropped, "abc/2"),
                ("127.0.0.1:9004", OutcomeClass::RateLimited, "abc/3"),
            ]
        );
        assert_eq!(
            l.attempts[3].retry_after_ms,
            Some(3000),
            "the last answer's Retry-After"
        );
        assert_eq!(l.attempts[0].retry_after_ms, None);
    }

    #[test]
    fn no_live_upstream_is_skipped() {
        let text = line("chat", "502", "-", "-", "0.000");
        let l = parse(text.as_bytes()).unwrap();
        assert_eq!((l.attempts.len(), l.skipped), (0, Some(Skip::NoServer)));
        let text = line("-", "-", "-", "-", "-");
        let l = parse(text.as_bytes()).unwrap();
        assert_eq!(l.skipped, Some(Skip::NoServer));
    }

    #[test]
    fn broken_json_names_what_is_wrong() {
        assert_eq!(parse(b"{\"v\":1,\"time\":").unwrap_err(), Bad::Truncated);
        assert_eq!(parse(b"{\"v\":1}").unwrap_err(), Bad::Field("json"));
        assert_eq!(parse(b"nope").unwrap_err(), Bad::UnknownFormat);
        let text = line("127.0.0.1:1, 127.0.0.1:2", "200", "-", "-", "-");
        assert_eq!(parse(text.as_bytes()).unwrap_err(), Bad::Field("status"));
        let text = line("127.0.0.1:1", "200", "-", "soon", "-");
        assert_eq!(parse(text.as_bytes()).unwrap_err(), Bad::Field("header"));
        let text = line("127.0.0.1:1", "200", "-", "-", "-").replace("\"v\":1", "\"v\":2");
        assert_eq!(parse(text.as_bytes()).unwrap_err(), Bad::Field("v"));
    }
}
