//! Generative tests of the parsers that read network input (syslog datagrams, HAProxy and nginx
//! access-log lines): any bytes are a line or a counted refusal, never a panic; lines built from
//! arbitrary field values keep their invariants (names taken from the line, no negative times,
//! one attempt per upstream tried at most); a syslog frame gives back the body it framed.

use proptest::prelude::*;
use vitals_gateways::{haproxy, nginx, syslog, Line};

fn check(line: &Line<'_>, raw: &str) -> Result<(), TestCaseError> {
    for a in &line.attempts {
        prop_assert!(raw.contains(a.backend), "{a:?}");
        prop_assert!(raw.contains(a.server), "{a:?}");
        prop_assert!(a.latency_us >= 0, "{a:?}");
        prop_assert!(a.retry_after_ms.is_none_or(|r| r >= 0), "{a:?}");
        prop_assert!(!a.id.is_empty());
    }
    prop_assert!(line.attempts.is_empty() || line.skipped.is_none());
    Ok(())
}

/// A field value: numbers (negative too), HAProxy's `-1` and `<NOSRV>`, words, Unicode, empty.
fn field() -> impl Strategy<Value = String> {
    prop_oneof![
        (-5i64..100_000).prop_map(|n| n.to_string()),
        Just("-1".to_owned()),
        Just("-".to_owned()),
        Just("<NOSRV>".to_owned()),
        Just("+2".to_owned()),
        "(--|SC|sH|SD|PH|CD|cD|LR|xx)[-A-Z]{0,2}",
        "[a-z_]{1,8}",
        "\\PC{0,6}",
        Just(String::new()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn any_bytes_are_a_message_or_a_refusal(raw in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(m) = syslog::parse(&raw) {
            let _ = haproxy::parse(m.body);
            let _ = nginx::parse(m.body);
        }
        let _ = haproxy::parse(&raw);
        let _ = nginx::parse(&raw);
    }

    #[test]
    fn haproxy_lines_of_any_field_values_keep_their_invariants(
        ts in prop_oneof![Just("1764577286.123".to_owned()), field()],
        id in field(),
        names in prop::collection::vec(prop_oneof![3 => "[a-z_]{1,8}", 1 => field()], 2),
        status in prop_oneof![2 => (100i32..600).prop_map(|s| s.to_string()), 1 => field()],
        timers in prop::collection::vec(prop_oneof![3 => (-1i64..5000).prop_map(|t| t.to_string()), 1 => field()], 5),
        termination in prop_oneof![3 => "(--|SC|sH|SD|PH|CD|sC|DC|UP)(--|-L)", 1 => field()],
        retries in prop_oneof![3 => (0u32..3).prop_map(|r| r.to_string()), 1 => Just("+1".to_owned()), 1 => field()],
        captured in prop_oneof![Just(String::new()), Just(" {7|}".to_owned()), "\\PC{0,8}".prop_map(|c| format!(" {c}"))],
    ) {
        let line = format!(
            "{} {ts} {id} {} {} {status} {} {termination} {retries}{captured}",
            haproxy::MARKER,
            names[0],
            names[1],
            timers.join(" ")
        );
        if let Ok(l) = haproxy::parse(line.as_bytes()) {
            check(&l, &line)?;
        }
    }

    #[test]
    fn nginx_lines_of_any_field_values_keep_their_invariants(
        addr in prop::collection::vec(prop_oneof![
            Just("10.0.0.1:443".to_owned()),
            Just("10.0.0.2:443".to_owned()),
            Just("up_chat".to_owned()),
            field(),
        ], 1..4),
        seps in prop::collection::vec(prop_oneof![Just(", "), Just(" : ")], 3),
        statuses in prop::collection::vec(field(), 1..4),
        times in prop::collection::vec(prop_oneof![Just("0.001".to_owned()), Just("-".to_owned()), field()], 9),
        retry_after in field(),
        client_status in field(),
    ) {
        let join = |v: &[String]| {
            let mut s = String::new();
            for (i, x) in v.iter().enumerate() {
                if i > 0 {
                    s.push_str(seps[(i - 1) % seps.len()]);
                }
                s.push_str(x);
            }
            s
        };
        let t = |i: usize| join(&times[i % times.len()..(i % times.len() + addr.len()).min(times.len())]);
        let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        let line = format!(
            r#"{{"v":1,"time":"1764577286.123","id":"abc","upstream":"up_chat","addr":"{}","status":"{}","connect":"{}","header":"{}","response":"{}","retry_after":"{}","request_time":"0.2","client_status":"{}"}}"#,
            esc(&join(&addr)),
            esc(&join(&statuses)),
            esc(&t(0)),
            esc(&t(3)),
            esc(&t(6)),
            esc(&retry_after),
            esc(&client_status),
        );
        if let Ok(l) = nginx::parse(line.as_bytes()) {
            check(&l, &line.replace("\\\"", "\"").replace("\\\\", "\\"))?;
            prop_assert!(l.attempts.len() <= addr.len(), "{} attempts of {} addresses", l.attempts.len(), addr.len());
        }
    }

    #[test]
    fn a_syslog_frame_gives_back_its_body(
        body in "[ -~]{1,80}",
        host in "[a-z][a-z0-9-]{0,10}",
        app in "[a-z]{1,8}",
        pri in 0u8..192,
        rfc5424 in any::<bool>(),
    ) {
        prop_assume!(!body.starts_with(' ') && !body.ends_with(' '));
        let raw = if rfc5424 {
            format!("<{pri}>1 2026-12-01T08:21:26.123Z {host} {app} 4242 - - {body}")
        } else {
            format!("<{pri}>Dec  1 08:21:26 {host} {app}[4242]: {body}")
        };
        let m = syslog::parse(raw.as_bytes()).unwrap();
        prop_assert_eq!(m.body, body.as_bytes());
        prop_assert_eq!(m.app, Some(app.as_str()));
    }
}

/// The case the generative test found: an empty request id (two spaces) gave an attempt with an
/// empty id; it takes the line's hash, as `-` does.
#[test]
fn an_empty_request_id_takes_the_lines_hash() {
    let line = format!("{} 1764577286.123  a _ 100 0 0 0 0 0 ---- 0", haproxy::MARKER);
    let l = haproxy::parse(line.as_bytes()).unwrap();
    assert_eq!(l.attempts.len(), 1);
    assert_eq!(l.attempts[0].id, vitals_gateways::line_id(line.as_bytes()));
}
