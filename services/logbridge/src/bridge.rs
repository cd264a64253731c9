//! One line in, its reports out. Every line is counted by what became of it: reported (one
//! report per attempt), skipped (no server to blame), or bad (by reason); a bad line never
//! stops the bridge, and a few of them (at most `sample_per_minute`) are written to the log so
//! that an operator can see what was sent.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vitals_contracts::{validate_name, CallOutcome};
use vitals_gateways::map::Map;
use vitals_gateways::{haproxy, nginx, syslog, Bad, Skip};

const SKIPS: [Skip; 5] = [
    Skip::NoServer,
    Skip::ClientAborted,
    Skip::GatewayAnswered,
    Skip::OtherMessage,
    Skip::BackendSkipped,
];
const BADS: [&str; 7] = [
    "unknown_format",
    "truncated",
    "bad_field",
    "not_utf8",
    "oversized",
    "framing",
    "invalid_name",
];

/// What one input has seen.
#[derive(Debug, Default)]
pub struct InputCounters {
    pub lines: AtomicU64,
    /// Bytes read (files).
    pub bytes: AtomicU64,
    /// Times a followed file was opened (the first time, then after each rotation).
    pub opened: AtomicU64,
    /// Datagrams the kernel dropped on this input's socket (UDP; read from /proc).
    pub kernel_drops: AtomicU64,
    /// Datagrams from a sender not allowed (UDP: `--udp-allow-from`), dropped unread.
    pub refused: AtomicU64,
}

/// Where reports go: the reporter in the service, a collector in tests.
pub trait Sink: Send + Sync {
    /// Queue `o`, or drop it (counted) when the queue is full.
    fn report(&self, o: CallOutcome);
    /// Queue `o`, waiting for room.
    fn report_waiting(&self, o: CallOutcome) {
        self.report(o)
    }
}

impl Sink for vitals_reporter::Reporter {
    fn report(&self, o: CallOutcome) {
        vitals_reporter::Reporter::report(self, o)
    }
    fn report_waiting(&self, o: CallOutcome) {
        vitals_reporter::Reporter::report_waiting(self, o)
    }
}

/// The bridge's rules and counters, shared by every input thread.
pub struct Bridge {
    map: Map,
    /// The gateway name when neither the map nor the syslog header gives one.
    gateway: String,
    /// Lines longer than this are counted and dropped.
    pub max_line: usize,
    sink: Arc<dyn Sink>,
    pub reports: AtomicU64,
    /// Lines that gave at least one report: with the skipped and the bad ones, every line read.
    pub reported_lines: AtomicU64,
    skipped: [AtomicU64; 5],
    bad: [AtomicU64; 7],
    pub unattributed: AtomicU64,
    sample: Mutex<(Instant, u32)>,
    sample_per_minute: u32,
}

/// What one line gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    Reported(usize),
    Skipped(Skip),
    Bad(&'static str),
}

impl Bridge {
    pub fn new(map: Map, gateway: String, max_line: usize, sample_per_minute: u32, sink: Arc<dyn Sink>) -> Bridge {
        Bridge {
            map,
            gateway,
            max_line,
            sink,
            reports: AtomicU64::new(0),
            reported_lines: AtomicU64::new(0),
            skipped: Default::default(),
            bad: Default::default(),
            unattributed: AtomicU64::new(0),
            sample: Mutex::new((Instant::now(), 0)),
            sample_per_minute,
        }
    }

    /// Read one datagram or line from `input`; when the reporter's queue is full, its reports
    /// are dropped and counted (a datagram cannot wait: the kernel drops the next ones).
    pub fn line(&self, raw: &[u8], input: &str) -> Read {
        self.take(raw, input, false)
    }

    /// Read one line of a file: when the reporter's queue is full, wait for room (a file can
    /// wait, and a backlog read at full speed would otherwise be mostly dropped).
    pub fn line_waiting(&self, raw: &[u8], input: &str) -> Read {
        self.take(raw, input, true)
    }

    fn take(&self, raw: &[u8], input: &str, wait: bool) -> Read {
        let read = self.read(raw, wait);
        match read {
            Read::Reported(n) => {
                self.reports.fetch_add(n as u64, Ordering::Relaxed);
                self.reported_lines.fetch_add(1, Ordering::Relaxed);
            }
            Read::Skipped(s) => {
                self.skipped[SKIPS.iter().position(|k| *k == s).unwrap_or(0)].fetch_add(1, Ordering::Relaxed);
            }
            Read::Bad(reason) => self.bad_line(reason, raw, input),
        }
        read
    }

    /// Count a bad line, and log it if the sample allows.
    pub fn bad_line(&self, reason: &'static str, raw: &[u8], input: &str) {
        let i = BADS.iter().position(|b| *b == reason).unwrap_or(0);
        self.bad[i].fetch_add(1, Ordering::Relaxed);
        let mut s = self.sample.lock().unwrap_or_else(|p| p.into_inner());
        if s.0.elapsed() >= Duration::from_secs(60) {
            *s = (Instant::now(), 0);
        }
        if s.1 < self.sample_per_minute {
            s.1 += 1;
            let shown = String::from_utf8_lossy(&raw[..raw.len().min(200)]);
            tracing::warn!(input, reason, bytes = raw.len(), line = ?shown, "bad log line (sampled)");
        }
    }

    fn read(&self, raw: &[u8], wait: bool) -> Read {
        if raw.len() > self.max_line {
            return Read::Bad(Bad::Oversized.as_str());
        }
        let msg = match syslog::parse(raw) {
            Ok(m) => m,
            Err(_) => return Read::Bad("framing"),
        };
        let line = match msg.body.first() {
            Some(b'{') => nginx::parse(msg.body),
            _ => haproxy::parse(msg.body),
        };
        let line = match line {
            Ok(l) => l,
            // HAProxy logs its own events (a server going down) where it logs requests.
            Err(Bad::UnknownFormat) if msg.app.is_some() => return Read::Skipped(Skip::OtherMessage),
            Err(e) => return Read::Bad(e.as_str()),
        };
        if line.unattributed > 0 {
            self.unattributed
                .fetch_add(u64::from(line.unattributed), Ordering::Relaxed);
        }
        if let Some(s) = line.skipped {
            return Read::Skipped(s);
        }
        let gateway = self.map.gateway.as_deref().unwrap_or_else(|| {
            msg.host
                .filter(|h| validate_name("gateway", h).is_ok())
                .unwrap_or(&self.gateway)
        });
        let mut n = 0;
        let mut skipped = 0;
        for a in &line.attempts {
            let Some(o) = self.map.outcome(a, gateway) else {
                skipped += 1;
                continue;
            };
            if validate_name("pool", &o.pool).is_err()
                || validate_name("endpoint", &o.endpoint).is_err()
                || validate_name("event_id", &o.event_id).is_err()
            {
                return Read::Bad("invalid_name");
            }
            if wait {
                self.sink.report_waiting(o);
            } else {
                self.sink.report(o);
            }
            n += 1;
        }
        if n == 0 && skipped > 0 {
            return Read::Skipped(Skip::BackendSkipped);
        }
        Read::Reported(n)
    }

    /// The counters in the Prometheus text format, the inputs' included.
    pub fn prometheus(&self, inputs: &[(String, Arc<InputCounters>)]) -> String {
        let mut out = String::new();
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        out.push_str("# HELP vitals_logbridge_lines_total Log lines (datagrams) read, by input.\n# TYPE vitals_logbridge_lines_total counter\n");
        for (name, c) in inputs {
            let _ = writeln!(
                out,
                "vitals_logbridge_lines_total{{input=\"{}\"}} {}",
                label(name),
                g(&c.lines)
            );
        }
        out.push_str("# HELP vitals_logbridge_refused_total Datagrams from senders not allowed (--udp-allow-from), dropped unread, by input.\n# TYPE vitals_logbridge_refused_total counter\n");
        for (name, c) in inputs {
            let _ = writeln!(
                out,
                "vitals_logbridge_refused_total{{input=\"{}\"}} {}",
                label(name),
                g(&c.refused)
            );
        }
        out.push_str("# HELP vitals_logbridge_kernel_drops Datagrams the kernel dropped on an input's socket (the bridge was behind), by input.\n# TYPE vitals_logbridge_kernel_drops gauge\n");
        for (name, c) in inputs {
            let _ = writeln!(
                out,
                "vitals_logbridge_kernel_drops{{input=\"{}\"}} {}",
                label(name),
                g(&c.kernel_drops)
            );
        }
        let _ = write!(
            out,
            "# HELP vitals_logbridge_reports_total Attempts reported.\n# TYPE vitals_logbridge_reports_total counter\nvitals_logbridge_reports_total {}\n\
# HELP vitals_logbridge_lines_reported_total Lines that gave reports (with the skipped and the bad ones: every line read).\n# TYPE vitals_logbridge_lines_reported_total counter\nvitals_logbridge_lines_reported_total {}\n",
            g(&self.reports),
            g(&self.reported_lines)
        );
        out.push_str("# HELP vitals_logbridge_skipped_total Lines with no server to blame, by reason.\n# TYPE vitals_logbridge_skipped_total counter\n");
        for (s, c) in SKIPS.iter().zip(&self.skipped) {
            let _ = writeln!(
                out,
                "vitals_logbridge_skipped_total{{reason=\"{}\"}} {}",
                s.as_str(),
                g(c)
            );
        }
        out.push_str("# HELP vitals_logbridge_bad_lines_total Lines that could not be read, by reason.\n# TYPE vitals_logbridge_bad_lines_total counter\n");
        for (b, c) in BADS.iter().zip(&self.bad) {
            let _ = writeln!(out, "vitals_logbridge_bad_lines_total{{reason=\"{b}\"}} {}", g(c));
        }
        let _ = write!(
            out,
            "# HELP vitals_logbridge_unattributed_retries_total HAProxy retries on a server the line does not name (redispatched).\n# TYPE vitals_logbridge_unattributed_retries_total counter\nvitals_logbridge_unattributed_retries_total {}\n",
            g(&self.unattributed)
        );
        out
    }

    /// Lines so far that gave reports, were skipped, or were bad: every line read.
    pub fn lines_accounted(&self) -> u64 {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        g(&self.reported_lines) + self.skipped.iter().map(g).sum::<u64>() + self.bad.iter().map(g).sum::<u64>()
    }

    /// Bad lines so far, by reason.
    pub fn bad_count(&self, reason: &str) -> u64 {
        BADS.iter()
            .position(|b| *b == reason)
            .map_or(0, |i| self.bad[i].load(Ordering::Relaxed))
    }
}

fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A sink that keeps what it is given (tests).
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Collect(pub Mutex<Vec<CallOutcome>>);

#[cfg(test)]
impl Sink for Collect {
    fn report(&self, o: CallOutcome) {
        self.0.lock().unwrap().push(o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vitals_contracts::OutcomeClass;

    fn bridge(map: &str) -> (Bridge, Arc<Collect>) {
        let c = Arc::new(Collect::default());
        (
            Bridge::new(Map::parse(map).unwrap(), "bridge".into(), 4096, 2, c.clone()),
            c,
        )
    }

    #[test]
    fn both_formats_in_one_bridge_with_the_gateway_from_the_syslog_host() {
        let (b, c) = bridge("[[backend]]\nname = \"be\"\npool = \"chat\"\n");
        let ha = b"<134>Dec  1 08:21:26 haproxy[1]: vitals1 1796113286.200 - be s2 503 0 0 -1 -1 5 SC-- 0 {}";
        assert_eq!(b.line(ha, "udp"), Read::Reported(1));
        let ng = br#"<190>Dec  1 08:21:26 web-3 nginx: {"v":1,"time":"1796113290.250","id":"x","upstream":"api","addr":"127.0.0.1:1","status":"200","connect":"0.001","header":"0.002","response":"0.003","request_time":"0.004","client_status":"200"}"#;
        assert_eq!(b.line(ng, "udp"), Read::Reported(1));
        let own = b"<129>Dec  1 08:45:20 haproxy[25836]: Server be_chat/e1 is going DOWN for maintenance.";
        assert_eq!(b.line(own, "udp"), Read::Skipped(Skip::OtherMessage));
        let got = c.0.lock().unwrap();
        assert_eq!(
            (got[0].pool.as_str(), got[0].endpoint.as_str(), got[0].gateway.as_str()),
            ("chat", "s2", "bridge")
        );
        assert_eq!(got[0].outcome, OutcomeClass::ConnectError);
        assert_eq!((got[1].pool.as_str(), got[1].gateway.as_str()), ("api", "web-3"));
    }

    #[test]
    fn garbage_is_counted_by_reason_and_the_next_good_line_still_reported() {
        let (b, c) = bridge("");
        let good = b"vitals1 1796113286.182 - be s1 200 0 0 0 1 1 ---- 0 {}";
        let long = vec![b'x'; 5000];
        for (raw, why) in [
            (&b"\x00\xff\xfe garbage"[..], "not_utf8"),
            (&b"GET / HTTP/1.1 200"[..], "unknown_format"),
            (&b"vitals1 1796113286.182 - be s1 200 0"[..], "truncated"),
            (&long[..], "oversized"),
            (&b"<999>x"[..], "framing"),
            (&b"{\"v\":1,"[..], "truncated"),
            (
                &b"vitals1 1796113286.182 - be s\x01 200 0 0 0 1 1 ---- 0 {}"[..],
                "invalid_name",
            ),
        ] {
            assert_eq!(b.line(raw, "t"), Read::Bad(why), "{}", String::from_utf8_lossy(raw));
            assert_eq!(b.line(good, "t"), Read::Reported(1));
        }
        assert_eq!(c.0.lock().unwrap().len(), 7);
        assert_eq!(b.bad_count("truncated"), 2);
        let text = b.prometheus(&[("udp:x".into(), Arc::new(InputCounters::default()))]);
        assert!(
            text.contains("vitals_logbridge_bad_lines_total{reason=\"oversized\"} 1"),
            "{text}"
        );
        assert!(text.contains("vitals_logbridge_reports_total 7"), "{text}");
    }

    #[test]
    fn every_line_is_counted_by_what_became_of_it() {
        let (b, c) = bridge("[[backend]]\nname = \"stats\"\nskip = true\n");
        let lines: [&[u8]; 6] = [
            b"vitals1 1796113286.182 - be s1 200 0 0 0 1 1 ---- 0 {}",
            b"vitals1 1796113286.182 - stats s1 200 0 0 0 1 1 ---- 0 {}",
            b"vitals1 1796113286.182 - be <NOSRV> 503 0 0 -1 -1 0 SC-- 0 {}",
            br#"{"v":1,"time":"1796113290.250","id":"x","upstream":"stats","addr":"127.0.0.1:1","status":"200","connect":"0.001","header":"0.002","response":"0.003","request_time":"0.004","client_status":"200"}"#,
            b"{\"v\":1,\"time\":\"1796113290.250\",\"id\":\"\xff\xfe\",\"upstream\":\"api\"}",
            b"garbage",
        ];
        let expect = [
            Read::Reported(1),
            Read::Skipped(Skip::BackendSkipped),
            Read::Skipped(Skip::NoServer),
            Read::Skipped(Skip::BackendSkipped),
            Read::Bad("not_utf8"),
            Read::Bad("unknown_format"),
        ];
        for (l, e) in lines.iter().zip(expect) {
            assert_eq!(b.line(l, "t"), e, "{}", String::from_utf8_lossy(l));
        }
        assert_eq!(b.lines_accounted(), lines.len() as u64);
        assert_eq!(c.0.lock().unwrap().len(), 1);
        let text = b.prometheus(&[]);
        assert!(
            text.contains("vitals_logbridge_skipped_total{reason=\"backend_skipped\"} 2"),
            "{text}"
        );
    }
}
