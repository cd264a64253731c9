//! `vitals backtest`: the signals of a time range (and a warm-up before it) read back from the
//! signals topic, replayed through the engine under a candidate policy, and compared with what
//! the audit log recorded for the same range: per endpoint, ejections added and removed, the first
//! detection and restore moved, time out of rotation.

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};
use vitals_contracts::{decode_signal, validate_signal, Micros, Policy, Signal};
use vitals_engine::{Decision, Engine};

/// One transition, as both sides are compared: when, into what, why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    pub t_us: Micros,
    pub from: String,
    pub to: String,
    pub reason_code: String,
}

pub type Timelines = BTreeMap<(String, String), Vec<Step>>;

pub struct Range {
    pub from_us: Micros,
    pub to_us: Micros,
    pub warmup_us: Micros,
    pub pool: Option<String>,
}

/// Replay the signals topic over the range under `policy`: the candidate's transitions inside
/// the range, per endpoint.
pub fn replay(brokers: &str, topic: &str, range: &Range, policy: &Policy) -> anyhow::Result<Timelines> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "vitals-backtest")
        .set("enable.auto.commit", "false")
        .create()
        .context("creating the Kafka consumer")?;
    let partitions = vitals_runtime::kafka::partitions(&consumer, topic, Duration::from_secs(10))
        .with_context(|| format!("cannot read the metadata of {topic} from {brokers}"))?;
    anyhow::ensure!(!partitions.is_empty(), "no topic {topic} on {brokers}");
    let start_ms = (range.from_us - range.warmup_us) / 1000;
    let end_ms = range.to_us / 1000;
    // Where the range starts and ends in each partition.
    let mut bounds = Vec::new();
    for p in &partitions {
        let (low, high) = consumer.fetch_watermarks(topic, *p, Duration::from_secs(10))?;
        let at = |ms: i64| -> anyhow::Result<i64> {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, *p, Offset::Offset(ms))?;
            let found = consumer.offsets_for_times(tpl, Duration::from_secs(10))?;
            Ok(match found.elements().first().map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => high,
            })
        };
        let (from, to) = (at(start_ms)?, at(end_ms + 1)?);
        if low > 0 && from == low {
            // Records before `low` are gone: is the range's start among them?
            let first_ts = first_timestamp(&consumer, topic, *p, low)?;
            if first_ts.is_some_and(|t| t > start_ms) {
                anyhow::bail!(
                    "the range (with its warm-up) starts at {}, but partition {p} of {topic} keeps records only from {} (retention): choose a later --from or a shorter --warmup-secs",
                    fmt_ms(start_ms),
                    fmt_ms(first_ts.unwrap_or(0))
                );
            }
        }
        if to > from {
            bounds.push((*p, from, to));
        }
    }
    let total: i64 = bounds.iter().map(|(_, f, t)| t - f).sum();
    let mut progress = Progress::new(total as u64);
    let mut out = Timelines::new();
    let mut decisions = Vec::new();
    for (p, from, to) in bounds {
        let mut engine = Engine::new(policy.clone());
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, Offset::Offset(from))?;
        consumer.assign(&tpl)?;
        let mut next = from;
        while next < to {
            let Some(m) = consumer.poll(Duration::from_secs(10)) else {
                anyhow::bail!("no record from partition {p} of {topic} within 10 s (at offset {next} of {to})");
            };
            let m = m?;
            next = m.offset() + 1;
            progress.step();
            let at = m.timestamp().to_millis().map_or(engine.now(), |ms| ms * 1000);
            let Some(Ok(signal)) = m.payload().map(decode_signal) else {
                continue;
            };
            if validate_signal(&signal, Some(at)).is_err() {
                continue;
            }
            // The candidate replaces every policy; other pools are left out when one is chosen.
            if matches!(signal, Signal::Policy(_)) {
                continue;
            }
            if let (Some(want), Some(pool)) = (&range.pool, signal.pool()) {
                if want != pool {
                    continue;
                }
            }
            engine.apply(at, &signal, &mut decisions);
            for d in decisions.drain(..) {
                if let Decision::Endpoint(h) = d {
                    if (range.from_us..=range.to_us).contains(&h.stream_time) {
                        out.entry((h.pool.clone(), h.endpoint.clone())).or_default().push(Step {
                            t_us: h.stream_time,
                            from: h.from_state.as_str().to_owned(),
                            to: h.to_state.as_str().to_owned(),
                            reason_code: h.reason_code.clone(),
                        });
                    }
                }
            }
        }
    }
    progress.done();
    Ok(out)
}

fn first_timestamp(consumer: &BaseConsumer, topic: &str, p: i32, offset: i64) -> anyhow::Result<Option<i64>> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, p, Offset::Offset(offset))?;
    consumer.assign(&tpl)?;
    Ok(match consumer.poll(Duration::from_secs(10)) {
        Some(Ok(m)) => m.timestamp().to_millis(),
        _ => None,
    })
}

fn fmt_ms(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms).map_or(ms.to_string(), |t| t.to_rfc3339())
}

pub fn fmt_us(us: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(us)
        .map_or(us.to_string(), |t| t.format("%Y-%m-%d %H:%M:%S%.3fZ").to_string())
}

/// A progress bar on stderr (a line every 10 % when stderr is not a terminal).
struct Progress {
    total: u64,
    done: u64,
    shown: Instant,
    tty: bool,
    last_tenth: u64,
}

impl Progress {
    fn new(total: u64) -> Progress {
        eprintln!("vitals backtest: reading {total} records of the signals topic");
        Progress {
            total,
            done: 0,
            shown: Instant::now(),
            tty: std::io::stderr().is_terminal(),
            last_tenth: 0,
        }
    }

    fn step(&mut self) {
        self.done += 1;
        let tenth = self.done * 10 / self.total.max(1);
        if self.tty && self.shown.elapsed() >= Duration::from_millis(100) {
            let width = 30;
            let filled = (self.done * width / self.total.max(1)) as usize;
            eprint!(
                "\r[{}{}] {}/{} records",
                "#".repeat(filled),
                " ".repeat(width as usize - filled),
                self.done,
                self.total
            );
            let _ = std::io::stderr().flush();
            self.shown = Instant::now();
        } else if !self.tty && tenth > self.last_tenth {
            eprintln!("vitals backtest: {} % ({} records)", tenth * 10, self.done);
            self.last_tenth = tenth;
        }
    }

    fn done(&self) {
        if self.tty {
            eprintln!("\r{} records read{}", self.done, " ".repeat(40));
        }
    }
}

/// How one endpoint's decisions differ.
#[derive(Debug, Serialize)]
pub struct EndpointDiff {
    pub pool: String,
    pub endpoint: String,
    pub ejections_current: usize,
    pub ejections_candidate: usize,
    /// Candidate's first ejection minus the current one, ms (negative: earlier).
    pub first_ejection_moved_ms: Option<i64>,
    /// Candidate's first return to rotation after its first ejection minus the current one, ms.
    pub first_restore_moved_ms: Option<i64>,
    pub out_of_rotation_current_ms: i64,
    pub out_of_rotation_candidate_ms: i64,
    pub same: bool,
    pub current: Vec<Step>,
    pub candidate: Vec<Step>,
}

fn out_of_rotation(to: &str) -> bool {
    matches!(to, "unhealthy" | "maintenance")
}

/// Time spent out of rotation inside the range (the state before the first step is its `from`).
fn time_out(steps: &[Step], range: &Range) -> i64 {
    let mut total = 0;
    let mut since = range.from_us;
    let mut out = steps.first().is_some_and(|s| out_of_rotation(&s.from));
    for s in steps {
        if out {
            total += s.t_us - since;
        }
        out = out_of_rotation(&s.to);
        since = s.t_us;
    }
    if out {
        total += range.to_us - since;
    }
    total / 1000
}

fn first_ejection(steps: &[Step]) -> Option<usize> {
    steps.iter().position(|s| s.to == "unhealthy")
}

fn first_restore(steps: &[Step]) -> Option<i64> {
    let e = first_ejection(steps)?;
    steps[e..]
        .iter()
        .find(|s| matches!(s.to.as_str(), "recovering" | "healthy"))
        .map(|s| s.t_us)
}

pub fn compare(current: &Timelines, candidate: &Timelines, range: &Range) -> Vec<EndpointDiff> {
    let mut keys: Vec<&(String, String)> = current.keys().chain(candidate.keys()).collect();
    keys.sort();
    keys.dedup();
    let empty = Vec::new();
    keys.into_iter()
        .map(|k| {
            let (cur, cand) = (current.get(k).unwrap_or(&empty), candidate.get(k).unwrap_or(&empty));
            let ej = |s: &[Step]| s.iter().filter(|s| s.to == "unhealthy").count();
            let moved = |a: Option<i64>, b: Option<i64>| a.zip(b).map(|(a, b)| (b - a) / 1000);
            let essence = |s: &[Step]| s.iter().map(|s| (s.t_us, s.to.clone())).collect::<Vec<_>>();
            EndpointDiff {
                pool: k.0.clone(),
                endpoint: k.1.clone(),
                ejections_current: ej(cur),
                ejections_candidate: ej(cand),
                first_ejection_moved_ms: moved(
                    first_ejection(cur).map(|i| cur[i].t_us),
                    first_ejection(cand).map(|i| cand[i].t_us),
                ),
                first_restore_moved_ms: moved(first_restore(cur), first_restore(cand)),
                out_of_rotation_current_ms: time_out(cur, range),
                out_of_rotation_candidate_ms: time_out(cand, range),
                same: essence(cur) == essence(cand),
                current: cur.clone(),
                candidate: cand.clone(),
            }
        })
        .collect()
}

/// The audit log's transitions of the range, per endpoint, through the API.
pub async fn current(api: &crate::api::Api, range: &Range) -> anyhow::Result<Timelines> {
    let mut q: Vec<(&str, String)> = vec![
        ("from", fmt_rfc3339(range.from_us)),
        ("to", fmt_rfc3339(range.to_us + 1)),
        ("limit", "500".into()),
    ];
    if let Some(p) = &range.pool {
        q.push(("pool", p.clone()));
    }
    let mut out = Timelines::new();
    loop {
        let page: vitals_contracts::view::HistoryPage = api.get_as("/v1/transitions", &q).await?;
        for t in page.items {
            out.entry((t.pool, t.endpoint)).or_default().push(Step {
                t_us: t.stream_time.timestamp_micros(),
                from: t.from_state.as_str().to_owned(),
                to: t.to_state.as_str().to_owned(),
                reason_code: t.reason_code.as_str().to_owned(),
            });
        }
        match page.next_cursor {
            Some(c) => {
                q.retain(|(k, _)| *k != "cursor");
                q.push(("cursor", c));
            }
            None => break,
        }
    }
    // The API pages newest first.
    for steps in out.values_mut() {
        steps.sort_by_key(|s| s.t_us);
    }
    Ok(out)
}

fn fmt_rfc3339(us: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(us).map_or(us.to_string(), |t| {
        t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    })
}

/// The comparison as a table for people.
pub fn print_table(diffs: &[EndpointDiff]) {
    let ms = |v: Option<i64>| v.map_or("-".into(), |v| format!("{:+.1} s", v as f64 / 1000.0));
    let rows: Vec<Vec<String>> = diffs
        .iter()
        .map(|d| {
            vec![
                format!("{}/{}", d.pool, d.endpoint),
                format!("{} → {}", d.ejections_current, d.ejections_candidate),
                ms(d.first_ejection_moved_ms),
                ms(d.first_restore_moved_ms),
                format!(
                    "{:.1} s → {:.1} s",
                    d.out_of_rotation_current_ms as f64 / 1000.0,
                    d.out_of_rotation_candidate_ms as f64 / 1000.0
                ),
                if d.same { "same".into() } else { "changed".into() },
            ]
        })
        .collect();
    crate::api::table(
        &[
            "endpoint",
            "ejections",
            "first ejection moved",
            "first restore moved",
            "out of rotation",
            "verdict",
        ],
        &rows,
    );
    let changed = diffs.iter().filter(|d| !d.same).count();
    let added: usize = diffs
        .iter()
        .map(|d| d.ejections_candidate.saturating_sub(d.ejections_current))
        .sum();
    let removed: usize = diffs
        .iter()
        .map(|d| d.ejections_current.saturating_sub(d.ejections_candidate))
        .sum();
    println!(
        "{} of {} endpoints decide differently; the candidate adds {added} ejections and removes {removed}",
        changed,
        diffs.len()
    );
}

fn colour(state: &str) -> &'static str {
    match state {
        "healthy" => "#3a9d5d",
        "recovering" => "#4aa3c7",
        "suspect" => "#e0c341",
        "degraded" => "#e08a3c",
        "unhealthy" => "#c8423b",
        _ => "#8a63b8",
    }
}

/// A self-contained HTML page: per endpoint, the current and the candidate timelines as bars
/// (states labelled as well as coloured), and the table.
pub fn html(diffs: &[EndpointDiff], range: &Range) -> String {
    let span = (range.to_us - range.from_us).max(1) as f64;
    let width = 900.0;
    let x = |t: i64| ((t - range.from_us) as f64 / span * width).clamp(0.0, width);
    let bar = |steps: &[Step], y: f64| -> String {
        let mut svg = String::new();
        let mut since = range.from_us;
        let mut state = steps.first().map_or("healthy".to_owned(), |s| s.from.clone());
        let seg = |from: i64, to: i64, state: &str, svg: &mut String| {
            let (x0, x1) = (x(from), x(to));
            svg.push_str(&format!(
                "<rect x=\"{x0:.1}\" y=\"{y}\" width=\"{:.1}\" height=\"16\" fill=\"{}\"><title>{state} from {}</title></rect>",
                (x1 - x0).max(0.5),
                colour(state),
                fmt_us(from)
            ));
            if x1 - x0 > 60.0 {
                svg.push_str(&format!(
                    "<text x=\"{:.1}\" y=\"{}\" font-size=\"10\" fill=\"#fff\">{state}</text>",
                    x0 + 3.0,
                    y + 12.0
                ));
            }
        };
        for s in steps {
            seg(since, s.t_us, &state, &mut svg);
            since = s.t_us;
            state = s.to.clone();
        }
        seg(since, range.to_us, &state, &mut svg);
        svg
    };
    let mut body = String::new();
    for d in diffs {
        body.push_str(&format!(
            "<section class=\"{}\"><h2>{}/{} — {}</h2><svg width=\"{}\" height=\"44\" role=\"img\" aria-label=\"current and candidate timelines\">{}{}</svg><p>ejections {} → {}; out of rotation {:.1} s → {:.1} s</p></section>\n",
            if d.same { "same" } else { "changed" },
            escape(&d.pool),
            escape(&d.endpoint),
            if d.same { "same" } else { "changed" },
            width as i64 + 10,
            bar(&d.current, 2.0),
            bar(&d.candidate, 24.0),
            d.ejections_current,
            d.ejections_candidate,
            d.out_of_rotation_current_ms as f64 / 1000.0,
            d.out_of_rotation_candidate_ms as f64 / 1000.0
        ));
    }
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>vitals backtest</title>\
<style>body{{font:14px system-ui,sans-serif;margin:2em}}h2{{font-size:15px;margin:1.2em 0 .3em}}.changed h2{{color:#a3231b}}</style></head>\
<body><h1>vitals backtest</h1><p>From {} to {}. In each pair of bars, the top one is what the audit log recorded, the bottom one what the candidate policy decides.</p>\n{body}</body></html>\n",
        fmt_us(range.from_us),
        fmt_us(range.to_us)
    )
}

pub(crate) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(t: i64, from: &str, to: &str) -> Step {
        Step {
            t_us: t,
            from: from.into(),
            to: to.into(),
            reason_code: String::new(),
        }
    }

    #[test]
    fn differences_are_counted_and_timed() {
        let range = Range {
            from_us: 0,
            to_us: 100_000_000,
            warmup_us: 0,
            pool: None,
        };
        let key = ("p".to_owned(), "a".to_owned());
        let current: Timelines = [(
            key.clone(),
            vec![
                step(10_000_000, "healthy", "unhealthy"),
                step(40_000_000, "unhealthy", "recovering"),
            ],
        )]
        .into();
        let candidate: Timelines = [(
            key,
            vec![
                step(6_000_000, "healthy", "unhealthy"),
                step(40_000_000, "unhealthy", "recovering"),
                step(70_000_000, "recovering", "unhealthy"),
            ],
        )]
        .into();
        let d = &compare(&current, &candidate, &range)[0];
        assert_eq!((d.ejections_current, d.ejections_candidate), (1, 2));
        assert_eq!(d.first_ejection_moved_ms, Some(-4_000));
        assert_eq!(d.first_restore_moved_ms, Some(0));
        assert_eq!(
            (d.out_of_rotation_current_ms, d.out_of_rotation_candidate_ms),
            (30_000, 64_000)
        );
        assert!(!d.same);
        assert!(compare(&current, &current, &range).iter().all(|d| d.same));
        let page = html(&compare(&current, &candidate, &range), &range);
        assert!(page.contains("p/a — changed") && page.contains(">unhealthy<"), "{page}");
    }
}
