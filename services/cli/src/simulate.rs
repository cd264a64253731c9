//! `vitals simulate`: the engine as a filter. One JSON object per input line — a call, a call
//! summary, a probe, a tick, a policy or an override, each with its stream time `t_us` — and one JSON line per
//! decision out; a tick is acknowledged (`{"kind":"tick_done","t_us":T}`) after the decisions it
//! caused, so a driver can run in lock-step. A bad line gets an error line naming the field, and
//! the stream goes on. The same signals at the same times give the processor's transitions: the
//! engine, the validation and the order are the processor's.

use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::io::{BufRead, Write};
use vitals_contracts::view::{Action, CallItem, ProbeItem, SignalItem, SummaryItem};
use vitals_contracts::{self as c, HealthChanged, Micros, Policy, PoolHealthChanged, Signal};
use vitals_engine::{Decision, Engine};

/// The common line, a call, parsed in one pass (the general [`Line`] buffers the object to read
/// its tag first): the same fields as a call of HTTP ingest, borrowed where they can be. A line
/// this does not take goes the general way, which also names what is wrong with it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FastCall<'a> {
    #[serde(rename = "type")]
    _kind: CallTag,
    t_us: Micros,
    #[serde(borrow)]
    event_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pool: Cow<'a, str>,
    #[serde(borrow)]
    endpoint: Cow<'a, str>,
    #[serde(borrow)]
    gateway: Cow<'a, str>,
    occurred_at: Option<chrono::DateTime<chrono::Utc>>,
    outcome: vitals_contracts::view::Outcome,
    http_status: Option<i32>,
    latency_us: i64,
    ttft_us: Option<i64>,
    tpot_us: Option<i64>,
    #[serde(default)]
    attributes: std::collections::BTreeMap<String, String>,
    model: Option<String>,
    retry_after_ms: Option<i64>,
}

#[derive(Deserialize)]
enum CallTag {
    #[serde(rename = "call")]
    Call,
}

impl FastCall<'_> {
    fn signal(self, line: u64) -> (Micros, Signal) {
        let t = self.t_us;
        let call = c::CallOutcome {
            event_id: self
                .event_id
                .map_or_else(|| format!("api-line-{line}"), Cow::into_owned),
            pool: self.pool.into_owned(),
            endpoint: self.endpoint.into_owned(),
            gateway: self.gateway.into_owned(),
            occurred_at: self.occurred_at.map_or(t, |o| o.timestamp_micros()),
            outcome: self.outcome.into(),
            http_status: self.http_status,
            latency_us: self.latency_us,
            ttft_us: self.ttft_us,
            tpot_us: self.tpot_us,
            attributes: self.attributes,
            model: self.model,
            retry_after_ms: self.retry_after_ms,
        };
        (t, Signal::Call(call))
    }
}

/// One input line: a stream time and what happens at it.
#[derive(Deserialize)]
struct Line {
    /// Stream time, µs since the epoch (the processor's record timestamp).
    t_us: Micros,
    #[serde(flatten)]
    input: Input,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Input {
    Call(CallItem),
    /// Calls summed at a gateway (the reporter's summaries).
    Summary(SummaryItem),
    Probe(ProbeItem),
    /// Moves stream time: timers fire, silence is noticed.
    Tick {},
    /// A pool's policy (fields left out keep their defaults).
    Policy {
        pool: String,
        policy: Policy,
    },
    /// An operator's override.
    Override {
        pool: String,
        endpoint: String,
        action: Action,
        #[serde(default)]
        reason: String,
    },
}

#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Out<'a> {
    Endpoint {
        t_us: Micros,
        pool: &'a str,
        endpoint: &'a str,
        seq: i64,
        from: &'static str,
        to: &'static str,
        weight: f64,
        ramp_ms: i64,
        retry_at_us: Option<Micros>,
        reason_code: &'a str,
        reason: &'a str,
        evidence: &'a c::Evidence,
        /// The scope of reporters it holds for (`gateway=g1`); absent for the fleet's.
        #[serde(skip_serializing_if = "Option::is_none")]
        scope: Option<&'a str>,
    },
    Pool {
        t_us: Micros,
        pool: &'a str,
        seq: i64,
        endpoints: i32,
        healthy: i32,
        ejected: i32,
        panic: bool,
        correlated_outage: bool,
        reason: &'a str,
        #[serde(skip_serializing_if = "<[String]>::is_empty")]
        faulty_reporters: &'a [String],
    },
    TickDone {
        t_us: Micros,
    },
    Error {
        line: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        field: Option<&'a str>,
        error: String,
    },
}

fn endpoint(h: &HealthChanged) -> Out<'_> {
    Out::Endpoint {
        t_us: h.stream_time,
        pool: &h.pool,
        endpoint: &h.endpoint,
        seq: h.seq,
        from: h.from_state.as_str(),
        to: h.to_state.as_str(),
        weight: h.weight,
        ramp_ms: h.ramp_ms,
        retry_at_us: h.retry_at,
        reason_code: &h.reason_code,
        reason: &h.reason,
        evidence: &h.evidence,
        scope: h.scope.as_deref(),
    }
}

fn pool(p: &PoolHealthChanged) -> Out<'_> {
    Out::Pool {
        t_us: p.stream_time,
        pool: &p.pool,
        seq: p.seq,
        endpoints: p.endpoints,
        healthy: p.healthy,
        ejected: p.ejected,
        panic: p.panic,
        correlated_outage: p.correlated_outage,
        reason: &p.reason,
        faulty_reporters: &p.faulty_reporters,
    }
}

/// What a run did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    pub lines: u64,
    pub decisions: u64,
    pub errors: u64,
}

/// The signal of a line; ids are made from the line number when the line has none.
fn signal(input: Input, t_us: Micros, line: u64) -> Signal {
    match input {
        Input::Call(i) => SignalItem::Call(i).into_signal(|p| format!("{p}-line-{line}"), t_us),
        Input::Summary(s) => SignalItem::Summary(s).into_signal(|p| format!("{p}-line-{line}"), t_us),
        Input::Probe(p) => SignalItem::Probe(p).into_signal(|p| format!("{p}-line-{line}"), t_us),
        Input::Tick {} => Signal::Tick(c::Tick {
            ticker: "vitals-simulate".into(),
            emitted_at: t_us,
        }),
        Input::Policy { pool, policy } => Signal::Policy(c::PolicyChange {
            change_id: format!("policy-line-{line}"),
            pool,
            actor: "vitals-simulate".into(),
            issued_at: t_us,
            policy,
        }),
        Input::Override {
            pool,
            endpoint,
            action,
            reason,
        } => Signal::Override(c::OperatorOverride {
            override_id: format!("override-line-{line}"),
            pool,
            endpoint,
            action: action.into(),
            actor: "vitals-simulate".into(),
            reason,
            issued_at: t_us,
        }),
    }
}

/// The field a serde error names (`unknown field `x``, `missing field `x``), if any.
fn field_of(e: &serde_json::Error) -> Option<String> {
    let msg = e.to_string();
    let start = msg.find('`')? + 1;
    let end = start + msg[start..].find('`')?;
    Some(msg[start..end].to_owned())
}

/// Run the engine over `input` until its end, writing decisions to `out`.
pub fn run(policy: Policy, input: impl BufRead, mut out: impl Write) -> std::io::Result<Totals> {
    let mut engine = Engine::new(policy);
    let mut decisions = Vec::new();
    let mut totals = Totals::default();
    let mut buf = Vec::with_capacity(512);
    let mut input = input;
    loop {
        buf.clear();
        if input.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        totals.lines += 1;
        let n = totals.lines;
        let text = buf.trim_ascii();
        if text.is_empty() {
            continue;
        }
        let mut error = |field: Option<&str>, e: String, out: &mut dyn Write| -> std::io::Result<()> {
            totals.errors += 1;
            serde_json::to_writer(
                &mut *out,
                &Out::Error {
                    line: n,
                    field,
                    error: e,
                },
            )?;
            out.write_all(b"\n")
        };
        let (t_us, tick, signal) = match serde_json::from_slice::<FastCall<'_>>(text) {
            Ok(call) => {
                let (t, s) = call.signal(n);
                (t, false, s)
            }
            Err(_) => match serde_json::from_slice::<Line>(text) {
                Ok(l) => (l.t_us, matches!(l.input, Input::Tick {}), signal(l.input, l.t_us, n)),
                Err(e) => {
                    error(field_of(&e).as_deref(), e.to_string(), &mut out)?;
                    continue;
                }
            },
        };
        // The processor's rule: values must be valid at the record's time.
        if let Err(e) = c::validate_signal(&signal, Some(t_us)) {
            error(Some(e.field), e.message, &mut out)?;
            continue;
        }
        engine.apply(t_us, &signal, &mut decisions);
        for d in decisions.drain(..) {
            totals.decisions += 1;
            match &d {
                Decision::Endpoint(h) => serde_json::to_writer(&mut out, &endpoint(h))?,
                Decision::Pool(p) => serde_json::to_writer(&mut out, &pool(p))?,
            }
            out.write_all(b"\n")?;
        }
        if tick {
            serde_json::to_writer(&mut out, &Out::TickDone { t_us })?;
            out.write_all(b"\n")?;
            // A driver in lock-step waits for this line.
            out.flush()?;
        }
    }
    out.flush()?;
    Ok(totals)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim(input: &str) -> (Vec<serde_json::Value>, Totals) {
        let mut out = Vec::new();
        let totals = run(Policy::default(), input.as_bytes(), &mut out).unwrap();
        let lines = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (lines, totals)
    }

    fn call(t: i64, ep: &str, outcome: &str) -> String {
        format!(
            r#"{{"type":"call","t_us":{t},"pool":"p","endpoint":"{ep}","gateway":"g","outcome":"{outcome}","latency_us":1000}}"#
        )
    }

    #[test]
    fn refused_calls_eject_and_a_tick_is_acknowledged_after_its_decisions() {
        let t0: i64 = 1_700_000_000_000_000;
        let mut input = String::new();
        for i in 0..20 {
            for ep in ["a", "b", "c"] {
                let outcome = if ep == "a" { "connect_error" } else { "success" };
                input.push_str(&call(t0 + i * 100_000, ep, outcome));
                input.push('\n');
            }
        }
        input.push_str(&format!("{{\"type\":\"tick\",\"t_us\":{}}}\n", t0 + 60_000_000));
        let (lines, totals) = sim(&input);
        assert_eq!(totals.errors, 0);
        let ejected = lines
            .iter()
            .find(|l| l["kind"] == "endpoint" && l["to"] == "unhealthy")
            .expect("an ejection");
        assert_eq!(
            (ejected["endpoint"].as_str(), ejected["reason_code"].as_str()),
            (Some("a"), Some("ejected"))
        );
        let last = lines.last().unwrap();
        assert_eq!(last["kind"], "tick_done");
        assert_eq!(last["t_us"], t0 + 60_000_000);
        assert_eq!(totals.lines, 61);
    }

    #[test]
    fn bad_lines_get_an_error_naming_the_field_and_the_stream_goes_on() {
        let t0: i64 = 1_700_000_000_000_000;
        let input = [
            "not json".to_owned(),
            r#"{"type":"call","pool":"p","endpoint":"e","gateway":"g","outcome":"success","latency_us":1}"#.to_owned(),
            format!(r#"{{"type":"call","t_us":{t0},"pool":"p","endpoint":"e","gateway":"g","outcome":"success","latency_us":1,"colour":"red"}}"#),
            format!(r#"{{"type":"call","t_us":{t0},"pool":"p","endpoint":"e","gateway":"g","outcome":"success","latency_us":-5}}"#),
            format!(r#"{{"type":"teleport","t_us":{t0}}}"#),
            // A misspelt outcome class must not count as no calls of the right one.
            format!(
                r#"{{"type":"summary","t_us":{t0},"pool":"p","endpoint":"e","gateway":"g","started_at":"2023-11-14T22:13:20Z","ended_at":"2023-11-14T22:13:20Z","calls":{{"success":1,"server_errror":500}}}}"#
            ),
            format!(r#"{{"type":"tick","t_us":{t0}}}"#),
        ]
        .join("\n");
        let (lines, totals) = sim(&input);
        assert_eq!(totals.errors, 6, "{lines:?}");
        let errors: Vec<(u64, Option<&str>)> = lines
            .iter()
            .filter(|l| l["kind"] == "error")
            .map(|l| (l["line"].as_u64().unwrap(), l["field"].as_str()))
            .collect();
        assert_eq!(errors[1], (2, Some("t_us")));
        assert_eq!(errors[2], (3, Some("colour")));
        assert_eq!(errors[3], (4, Some("latency_us")));
        assert_eq!(errors[5], (6, Some("server_errror")));
        assert_eq!(lines.last().unwrap()["kind"], "tick_done", "the stream went on");
    }
}
