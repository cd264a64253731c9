//! One export request, whatever carried it: refuse it while vitals is behind (before decoding
//! anything), decode it within the limits on a blocking thread (at most `decoders` at once),
//! turn its spans into call reports by the table, and queue them for the reporter; count every
//! span and request by what became of it.

use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Semaphore;
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
}

impl Outcome {
    /// What a refused request counts as.
    pub fn of(r: &Refused) -> Outcome {
        match r {
            Refused::TooLarge(_) => Outcome::TooLarge,
            Refused::Malformed(_) => Outcome::Malformed,
        }
    }

    const ALL: [Outcome; 7] = [
        Outcome::Ok,
        Outcome::Partial,
        Outcome::Malformed,
        Outcome::TooLarge,
        Outcome::Busy,
        Outcome::Unsupported,
        Outcome::Broken,
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
}

pub struct Receiver {
    map: Map,
    limits: Limits,
    reporter: Arc<Reporter>,
    /// Outcomes in the reporter's queue at which requests are refused as busy.
    busy_at: u64,
    decoders: Semaphore,
    pub retry_after_secs: u64,
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
    ) -> Receiver {
        Receiver {
            map,
            limits,
            reporter,
            busy_at,
            decoders: Semaphore::new(decoders.max(1)),
            retry_after_secs,
            counters: Counters::default(),
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn count(&self, t: Transport, o: Outcome) {
        self.counters.requests[t as usize][o as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Take one export request's body (already decompressed).
    /// One export request's body, `gzip` compressed or not. It is inflated here, under a decoder
    /// permit on a blocking thread like the decoding: inflated before the permit, many small
    /// compressed requests at once held a full-size body each (100 of 28 KiB took the receiver
    /// to 873 MB) and starved the runtime's threads.
    pub async fn export(self: &Arc<Self>, t: Transport, format: Format, body: Bytes, gzip: bool) -> Answer {
        if self.reporter.queued() >= self.busy_at {
            self.count(t, Outcome::Busy);
            return Answer::Busy;
        }
        let Ok(_permit) = self.decoders.acquire().await else {
            self.count(t, Outcome::Busy);
            return Answer::Busy;
        };
        let me = self.clone();
        let converted = tokio::task::spawn_blocking(move || {
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
                        .convert_wire(&body, &mut out, &mut tally)
                        .map_err(|e| Refused::Malformed(format!("not an OTLP protobuf export request: {e}")))?;
                }
                Format::Json => {
                    let req = decode::request(format, &body, &me.limits)?;
                    drop(body);
                    me.map.convert(&req, &mut out, &mut tally);
                }
            }
            Ok::<_, Refused>((out, tally))
        })
        .await;
        let (outcomes, tally) = match converted {
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
        out.push_str(&format!(
            "# HELP vitals_otlp_report_queue Call reports waiting for the Kafka producer.\n# TYPE vitals_otlp_report_queue gauge\nvitals_otlp_report_queue {}\n",
            self.reporter.queued()
        ));
        out + &self.reporter.counters().prometheus()
    }
}
