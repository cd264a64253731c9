//! The message inside a syslog datagram or a log file's line: RFC 5424 (`<PRI>1 TIMESTAMP HOST
//! APP PROCID MSGID SD MSG`), RFC 3164 (`<PRI>Mmm dd hh:mm:ss [HOST ]TAG[PID]: MSG`; HAProxy
//! leaves the host out, nginx puts it in), the same without `<PRI>` (a file written by a syslog
//! daemon), or a bare line (a file the gateway writes itself).

use crate::Bad;

/// A message and what its framing said about its sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    pub host: Option<&'a str>,
    /// The tag (3164) or APP-NAME (5424), without its `[pid]`.
    pub app: Option<&'a str>,
    pub body: &'a [u8],
}

fn trim_end(mut b: &[u8]) -> &[u8] {
    while let [rest @ .., b'\n' | b'\r' | b'\0'] = b {
        b = rest;
    }
    b
}

fn utf8(b: &[u8]) -> Option<&str> {
    std::str::from_utf8(b).ok()
}

/// The next space-separated token and what follows its space.
fn token(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let i = b.iter().position(|c| *c == b' ')?;
    Some((&b[..i], &b[i + 1..]))
}

fn nil(v: &str) -> Option<&str> {
    (v != "-").then_some(v)
}

/// Read one datagram or line.
pub fn parse(raw: &[u8]) -> Result<Message<'_>, Bad> {
    let b = trim_end(raw);
    let Some(rest) = b.strip_prefix(b"<") else {
        return Ok(rfc3164_header(b).unwrap_or(Message {
            host: None,
            app: None,
            body: b,
        }));
    };
    let end = rest
        .iter()
        .take(4)
        .position(|c| *c == b'>')
        .ok_or(Bad::Field("syslog priority"))?;
    let pri = utf8(&rest[..end]).and_then(|p| p.parse::<u8>().ok());
    if end == 0 || pri.is_none_or(|p| p > 191) {
        return Err(Bad::Field("syslog priority"));
    }
    let rest = &rest[end + 1..];
    if let Some(r) = rest.strip_prefix(b"1 ") {
        return rfc5424(r);
    }
    Ok(rfc3164_header(rest).unwrap_or(Message {
        host: None,
        app: None,
        body: rest,
    }))
}

/// `Mmm dd hh:mm:ss [HOST ]TAG[PID]: MSG`, or None if the timestamp is not there.
fn rfc3164_header(b: &[u8]) -> Option<Message<'_>> {
    let ts = b.get(..16)?;
    let looks = ts[..3].iter().all(u8::is_ascii_alphabetic)
        && ts[3] == b' '
        && ts[6] == b' '
        && ts[9] == b':'
        && ts[12] == b':'
        && ts[15] == b' ';
    if !looks {
        return None;
    }
    let rest = &b[16..];
    fn tag(t: &[u8]) -> Option<&str> {
        let t = utf8(t)?;
        Some(t.split_once('[').map_or(t, |(n, _)| n))
    }
    let (first, after) = token(rest)?;
    if let Some(t) = first.strip_suffix(b":") {
        return Some(Message {
            host: None,
            app: tag(t),
            body: after,
        });
    }
    if let Some((second, body)) = token(after) {
        if let Some(t) = second.strip_suffix(b":") {
            return Some(Message {
                host: utf8(first),
                app: tag(t),
                body,
            });
        }
    }
    Some(Message {
        host: None,
        app: None,
        body: rest,
    })
}

/// After `<PRI>1 `: five header fields, the structured data, the message (its BOM dropped).
fn rfc5424(b: &[u8]) -> Result<Message<'_>, Bad> {
    let truncated = Bad::Field("syslog header");
    let (_ts, b) = token(b).ok_or(truncated)?;
    let (host, b) = token(b).ok_or(truncated)?;
    let (app, b) = token(b).ok_or(truncated)?;
    let (_procid, b) = token(b).ok_or(truncated)?;
    let (_msgid, b) = token(b).ok_or(truncated)?;
    let body = if let Some(r) = b.strip_prefix(b"-") {
        r
    } else {
        // One or more [id param="value" ...] elements; `\]` and `\"` are escaped in values.
        let mut i = 0;
        while b.get(i) == Some(&b'[') {
            let mut quoted = false;
            i += 1;
            loop {
                match b.get(i) {
                    None => return Err(Bad::Field("syslog structured data")),
                    Some(b'\\') if quoted => i += 2,
                    Some(b'"') => {
                        quoted = !quoted;
                        i += 1;
                    }
                    Some(b']') if !quoted => {
                        i += 1;
                        break;
                    }
                    Some(_) => i += 1,
                }
            }
        }
        if i == 0 {
            return Err(Bad::Field("syslog structured data"));
        }
        &b[i..]
    };
    let body = body.strip_prefix(b" ").unwrap_or(body);
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    Ok(Message {
        host: utf8(host).and_then(nil),
        app: utf8(app).and_then(nil),
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(raw: &str) -> Message<'_> {
        parse(raw.as_bytes()).unwrap()
    }

    #[test]
    fn haproxy_rfc3164_has_no_host() {
        let x = m("<134>Dec  1 08:21:26 haproxy[10458]: vitals1 1 - b s 200\n");
        assert_eq!((x.host, x.app), (None, Some("haproxy")));
        assert_eq!(x.body, b"vitals1 1 - b s 200");
    }

    #[test]
    fn nginx_rfc3164_has_a_host_and_a_json_body() {
        let x = m("<190>Dec 11 18:01:02 web-3 nginx: {\"a\": \"b: c\"}");
        assert_eq!((x.host, x.app), (Some("web-3"), Some("nginx")));
        assert_eq!(x.body, b"{\"a\": \"b: c\"}");
    }

    #[test]
    fn rfc5424_with_and_without_structured_data() {
        let x = m("<134>1 2026-12-01T08:21:26.123+00:00 lb-1 haproxy 4242 - - vitals1 x");
        assert_eq!((x.host, x.app), (Some("lb-1"), Some("haproxy")));
        assert_eq!(x.body, b"vitals1 x");
        let x = m("<134>1 2026-12-01T08:21:26Z - app - ID7 [ex@1 a=\"q\\]\" b=\"2\"][y@1] \u{feff}body");
        assert_eq!((x.host, x.app), (None, Some("app")));
        assert_eq!(x.body, b"body");
    }

    #[test]
    fn a_file_line_with_or_without_a_syslog_header() {
        let x = m("Dec  1 08:21:26 lb haproxy[1]: vitals1 y");
        assert_eq!((x.host, x.body), (Some("lb"), &b"vitals1 y"[..]));
        let x = m("{\"json\": 1}");
        assert_eq!((x.host, x.app, x.body), (None, None, &b"{\"json\": 1}"[..]));
    }

    #[test]
    fn broken_framing_is_refused_with_its_part_named() {
        for raw in [
            "<999>x",
            "<>x",
            "<13",
            "<1x>",
            "<134>1 2026 host",
            "<134>1 t h a p m [unclosed",
        ] {
            assert!(
                matches!(parse(raw.as_bytes()), Err(Bad::Field(f)) if f.starts_with("syslog")),
                "{raw}"
            );
        }
    }
}
