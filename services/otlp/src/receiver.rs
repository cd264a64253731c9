//! One export request, whatever carried it: refuse it while vitals is behind (before decoding
//! anything), decode it within the limits on a blocking thread (at most `decoders` at once),
//! turn its spans into call reports by the table, and queue them for the reporter; count every
//! span and request by what became of it.

use crate::trust::{Budgets, Caller, Over};
use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;
use vitals_contracts::recent::RecentIds;
use vitals_reporter::Reporter;
use vitals_spans::decode::{self, Format, Limits, Refused};
use vitals_spans::{Map, Skip, Tally};

/// What carried a request (for the metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Http = 0,
    Grpc = 1,
}

impl Transport {
    const ALL: [Transport; 2] = [Transport::Http, Transport::Grpc];
    fn as_str(self) -> &'static str {
        match self {
            Transport::Http => "http",
            Transport::Grpc => "grpc",
        }
    }
}

/// What became of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every span taken (reported, or skipped as not a call).
    Ok = 0,
    /// Some spans rejected (malformed) or dropped: OTLP's partial success.
    Partial = 1,
    Malformed = 2,
    TooLarge = 3,
    /// Refused while vitals is behind: the client sends again later.
    Busy = 4,
    /// A content type or encoding the receiver does not speak.
    Unsupported = 5,
    /// The body ended before its end: the client went away or broke the stream (it was
    /// counted as too large before).
    Broken = 6,
    /// No token, or not one of ours.
    Unauthenticated = 7,
    /// A token that may not report (a reader's).
    Forbidden = 8,
    /// Over its reporter's budget: the client sends again later.
    Limited = 9,
}

impl Outcome {
    /// What a refused request counts as.
    pub fn of(r: &Refused) -> Outcome {
        match r {
            Refused::TooLarge(_) => Outcome::TooLarge,
            Refused::Malformed(_) => Outcome::Malformed,
        }
    }

    const ALL: [Outcome; 10] = [
        Outcome::Ok,
        Outcome::Partial,
        Outcome::Malformed,
        Outcome::TooLarge,
        Outcome::Busy,
        Outcome::Unsupported,
        Outcome::Broken,
        Outcome::Unauthenticated,
        Outcome::Forbidden,
        Outcome::Limited,
    ];
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Partial => "partial",
            Outcome::Malformed => "malformed",
            Outcome::TooLarge => "too_large",
            Outcome::Busy => "busy",
            Outcome::Unsupported => "unsupported",
            Outcome::Broken => "broken",
            Outcome::Unauthenticated => "unauthenticated",
            Outcome::Forbidden => "forbidden",
            Outcome::Limited => "limited",
        }
    }
}

/// The answer to an export.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Taken; `rejected` spans were not (with why).
    Accepted {
        rejected: u64,
        message: String,
    },
    Refused(Refused),
    /// vitals is behind: send again after the Retry-After.
    Busy,
    /// The reporter is over its budget: send again after `retry_after`.
    Limited(Over),
}

/// What became of a reporter's spans: taken, refused by its binding, refused by its budget.
#[derive(Default, Clone, Copy)]
struct PerReporter {
    taken: u64,
    unbound: u64,
    limited: u64,
}

#[derive(Default)]
pub struct Counters {
    requests: [[AtomicU64; Outcome::ALL.len()]; Transport::ALL.len()],
    spans: AtomicU64,
    calls: AtomicU64,
    rejected: AtomicU64,
    skipped: [AtomicU64; Skip::ALL.len()],
    queued: AtomicU64,
    dropped: AtomicU64,
    /// Calls passed over as repeats of spans reported lately (a retried export).
    repeats: AtomicU64,
    /// By token name: bounded by the tokens file.
    reporters: Mutex<BTreeMap<String, PerReporter>>,
}

pub struct Receiver {
    map: Map,
    limits: Limits,
    reporter: Arc<Reporter>,
    /// Outcomes in the reporter's queue at which requests are refused as busy.
    busy_at: u64,
    decoders: Semaphore,
    budgets: Budgets,
    /// The tokens a request must carry one of; `None`: no authentication (`--no-auth`).
    pub auth: Option<Arc<vitals_runtime::tokens::Watched>>,
    pub retry_after_secs: u64,
    /// Time a request's body has to arrive whole.
    pub body_timeout: std::time::Duration,
    /// Span ids reported lately: a retried export is reported once ([`remembered_spans`]).
    pub recent: Mutex<RecentIds>,
    pub counters: Counters,
}

impl Receiver {
    pub fn new(
        map: Map,
        limits: Limits,
        reporter: Arc<Reporter>,
        busy_at: u64,
        decoders: usize,
        retry_after_secs: u64,
        budgets: Budgets,
    ) -> Receiver {
        Receiver {
            map,
            limits,
            reporter,
            busy_at,
            budgets,
            auth: None,
            body_timeout: std::time::Duration::from_secs(30),
            recent: Mutex::new(remembered_spans(262_144)),
            decoders: Semaphore::new(decoders.max(1)),
            retry_after_secs,
            counters: Counters::default(),
        }
    }

    /// Requests must carry one of these tokens.
    pub fn with_auth(mut self, tokens: Arc<vitals_runtime::tokens::Watched>) -> Receiver {
        self.auth = Some(tokens);
        self
    }

    /// Who sent a request with these `Authorization` values, if they may do `need`.
    pub fn caller<'v>(
        &self,
        authorization: impl Iterator<Item = &'v [u8]>,
        need: vitals_runtime::tokens::Need,
    ) -> Result<Caller, vitals_runtime::tokens::Denied> {
        let Some(auth) = &self.auth else {
            return Ok(Caller::anonymous());
        };
        let tokens = auth.get();
        let t = tokens.authorize(authorization, need)?;
        Ok(Caller {
            name: t.name.clone(),
            binding: t.binding.clone(),
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn count(&self, t: Transport, o: Outcome) {
        self.counters.requests[t as usize][o as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn per_reporter(&self, who: &str, f: impl FnOnce(&mut PerReporter)) {
        let mut m = self.counters.reporters.lock().unwrap_or_else(|e| e.into_inner());
        match m.get_mut(who) {
            Some(r) => f(r),
            None => f(m.entry(who.to_owned()).or_default()),
        }
    }

    /// One export request's body, `gzip` compressed or not. It is inflated here, under a decoder
    /// permit on a blocking thread like the decoding: inflated before the permit, many small
    /// compressed requests at once held a full-size body each (100 of 28 KiB took the receiver
    /// to 873 MB) and starved the runtime's threads.
    /// The spans are `caller`'s: those naming a gateway or pool it may not report for are
    /// refused (a partial success), and the rest are taken from its budget, all or none.
    pub async fn export(
        self: &Arc<Self>,
        t: Transport,
        format: Format,
        body: Bytes,
        gzip: bool,
        caller: Caller,
    ) -> Answer {
        if self.reporter.queued() >= self.busy_at {
            self.count(t, Outcome::Busy);
            return Answer::Busy;
        }
        let Ok(_permit) = self.decoders.acquire().await else {
            self.count(t, Outcome::Busy);
            return Answer::Busy;
        };
        let me = self.clone();
        let who = caller.clone();
        let converted = tokio::task::spawn_blocking(move || {
            let reporter = who.reporter();
            let body = if gzip {
                Bytes::from(decode::gunzip(&body, me.limits.max_body)?)
            } else {
                body
            };
            let (mut out, mut tally) = (Vec::new(), Tally::default());
            match format {
                // Read span by span off the wire: nothing is held but the reports.
                Format::Protobuf => {
                    decode::protobuf_within(&body, &me.limits)?;
                    me.map
                        .convert_wire_as(&body, reporter, &mut out, &mut tally)
                        .map_err(|e| Refused::Malformed(format!("not an OTLP protobuf export request: {e}")))?;
                }
                Format::Json => {
                    let req = decode::request(format, &body, &me.limits)?;
                    drop(body);
                    me.map.convert_as(&req, reporter, &mut out, &mut tally);
                }
            }
            Ok::<_, Refused>((out, tally))
        })
        .await;
        let (mut outcomes, mut tally) = match converted {
            Ok(Ok(c)) => c,
            Ok(Err(r)) => {
                self.count(t, Outcome::of(&r));
                return Answer::Refused(r);
            }
            Err(e) => {
                tracing::error!(error = %e, "decoding an export request panicked");
                self.count(t, Outcome::Malformed);
                return Answer::Refused(Refused::Malformed("the request could not be read".into()));
            }
        };
        // What the caller may not report for is refused, with the first reason.
        let before = outcomes.len();
        let mut refusal = None;
        outcomes.retain(|o| match caller.may_report(o) {
            Ok(()) => true,
            Err(e) => {
                refusal.get_or_insert(e.message);
                false
            }
        });
        let unbound = (before - outcomes.len()) as u64;
        if unbound > 0 {
            tally.rejected += unbound;
            tally.calls -= unbound;
            let why = format!("{unbound} calls refused: {}", refusal.unwrap_or_default());
            tally.first_rejection = Some(match tally.first_rejection.take() {
                Some(m) => format!("{m}; {why}"),
                None => why,
            });
        }
        if let Err(over) = self
            .budgets
            .take(&caller.name, std::time::Instant::now(), tally.spans, &outcomes)
        {
            self.count(t, Outcome::Limited);
            self.per_reporter(&caller.name, |r| {
                r.unbound += unbound;
                r.limited += tally.spans;
            });
            return Answer::Limited(over);
        }
        self.per_reporter(&caller.name, |r| {
            r.unbound += unbound;
            r.taken += tally.spans - unbound;
        });
        // A retried export: its spans were reported already (the answer was lost). Taken, not
        // reported again.
        let before = outcomes.len();
        {
            let now = vitals_contracts::clock::now_us();
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            outcomes.retain(|o| recent.first(&o.event_id, now));
        }
        let repeats = (before - outcomes.len()) as u64;
        tally.calls -= repeats;
        self.counters.repeats.fetch_add(repeats, Ordering::Relaxed);
        let c = &self.counters;
        c.spans.fetch_add(tally.spans, Ordering::Relaxed);
        c.calls.fetch_add(tally.calls, Ordering::Relaxed);
        c.rejected.fetch_add(tally.rejected, Ordering::Relaxed);
        for (i, n) in tally.skipped.iter().enumerate() {
            c.skipped[i].fetch_add(*n, Ordering::Relaxed);
        }
        let mut dropped = 0u64;
        for o in outcomes {
            if !self.reporter.try_report(o) {
                dropped += 1;
            }
        }
        c.queued.fetch_add(tally.calls - dropped, Ordering::Relaxed);
        c.dropped.fetch_add(dropped, Ordering::Relaxed);
        let rejected = tally.rejected + dropped;
        let mut message = tally.first_rejection.unwrap_or_default();
        if dropped > 0 {
            if !message.is_empty() {
                message.push_str("; ");
            }
            message.push_str(&format!("{dropped} calls dropped: vitals' report queue is full"));
        }
        self.count(t, if rejected > 0 { Outcome::Partial } else { Outcome::Ok });
        Answer::Accepted { rejected, message }
    }

    /// The receiver's counters in the Prometheus text format (`vitals_otlp_*`), then the
    /// reporter's.
    pub fn prometheus(&self) -> String {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::from(
            "# HELP vitals_otlp_requests_total Export requests by transport and what became of them.\n# TYPE vitals_otlp_requests_total counter\n",
        );
        for t in Transport::ALL {
            for o in Outcome::ALL {
                out.push_str(&format!(
                    "vitals_otlp_requests_total{{transport=\"{}\",result=\"{}\"}} {}\n",
                    t.as_str(),
                    o.as_str(),
                    g(&c.requests[t as usize][o as usize])
                ));
            }
        }
        out.push_str("# HELP vitals_otlp_spans_total Spans received, by what became of them.\n# TYPE vitals_otlp_spans_total counter\n");
        out.push_str(&format!(
            "vitals_otlp_spans_total{{result=\"received\"}} {}\n",
            g(&c.spans)
        ));
        out.push_str(&format!("vitals_otlp_spans_total{{result=\"call\"}} {}\n", g(&c.calls)));
        out.push_str(&format!(
            "vitals_otlp_spans_total{{result=\"rejected\"}} {}\n",
            g(&c.rejected)
        ));
        out.push_str(&format!(
            "vitals_otlp_spans_total{{result=\"repeat\"}} {}\n",
            g(&c.repeats)
        ));
        out.push_str(
            "# HELP vitals_otlp_spans_skipped_total Spans read that are not calls vitals reports, by reason.\n# TYPE vitals_otlp_spans_skipped_total counter\n",
        );
        for s in Skip::ALL {
            out.push_str(&format!(
                "vitals_otlp_spans_skipped_total{{reason=\"{}\"}} {}\n",
                s.as_str(),
                g(&c.skipped[s as usize])
            ));
        }
        out.push_str("# HELP vitals_otlp_outcomes_total Call reports: queued for Kafka, or dropped (the queue full).\n# TYPE vitals_otlp_outcomes_total counter\n");
        out.push_str(&format!(
            "vitals_otlp_outcomes_total{{result=\"queued\"}} {}\n",
            g(&c.queued)
        ));
        out.push_str(&format!(
            "vitals_otlp_outcomes_total{{result=\"dropped\"}} {}\n",
            g(&c.dropped)
        ));
        out.push_str("# HELP vitals_otlp_reporter_spans_total Spans by the token that sent them: taken, refused by its binding (unbound: calls for a gateway or pool it may not report for), refused by its budget (limited).\n# TYPE vitals_otlp_reporter_spans_total counter\n");
        for (who, r) in self.counters.reporters.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            for (result, n) in [("taken", r.taken), ("unbound", r.unbound), ("limited", r.limited)] {
                out.push_str(&format!(
                    "vitals_otlp_reporter_spans_total{{token=\"{}\",result=\"{result}\"}} {n}\n",
                    label(who)
                ));
            }
        }
        out.push_str(&format!(
            "# HELP vitals_otlp_report_queue Call reports waiting for the Kafka producer.\n# TYPE vitals_otlp_report_queue gauge\nvitals_otlp_report_queue {}\n",
            self.reporter.queued()
        ));
        out + &crate::listen::prometheus() + &self.reporter.counters().prometheus()
    }
}

/// How long a reported span id is remembered: past the exporters' 10 s timeout and their
/// backed-off retries.
pub const REMEMBER_SPANS_US: i64 = 120 * 1_000_000;

/// The span ids this receiver reported lately, so that an export sent again — every OTLP
/// exporter retries on a timeout, a 429 or a 503, so an export whose answer was lost arrives
/// twice — is reported once: for [`REMEMBER_SPANS_US`], at most `cap` of them (16 bytes an id,
/// 4 MiB at the default 262,144). Only this receiver's: a retry that reaches another replica is
/// caught by the processor for calls sent one by one (failures), whose event ids it remembers
/// per pool, and not for successes summed into a summary.
pub fn remembered_spans(cap: usize) -> RecentIds {
    RecentIds::new(REMEMBER_SPANS_US, cap)
}

/// A Prometheus label value: backslash, quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
