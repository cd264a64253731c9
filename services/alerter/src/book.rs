//! What is alerting: a fold over the changes topic. An endpoint alert fires while the endpoint is
//! out of rotation (unhealthy) and resolves when it is back; a pool alert fires while the pool is
//! in panic mode or a correlated outage. With an availability rule, an endpoint alert also fires
//! while the endpoint's availability over a trailing window (the definitions of `vitals-uptime`,
//! in stream time: changes and the processor's ticks) is below a threshold, and resolves when it
//! is back above. Every change yields the alerts to send now; `firing` is what must be re-sent so
//! that Alertmanager keeps it open.

use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use vitals_contracts::seq::Applied;
use vitals_contracts::{HealthChanged, HealthState, Micros, PoolHealthChanged};

pub const ENDPOINT_ALERT: &str = "VitalsEndpointOutOfRotation";
pub const PANIC_ALERT: &str = "VitalsPoolPanic";
pub const OUTAGE_ALERT: &str = "VitalsCorrelatedOutage";
pub const AVAILABILITY_ALERT: &str = "VitalsEndpointAvailabilityLow";

/// Fire while an endpoint's availability over the trailing `window_us` is below `below`.
#[derive(Debug, Clone, Copy)]
pub struct AvailabilityRule {
    pub below: f64,
    pub window_us: Micros,
}

/// An endpoint's recent history for the availability rule, and its alert if firing.
struct Recent {
    history: vitals_uptime::History,
    alert: Option<Alert>,
    /// The changes topic's partition its changes come on: its stream time is that partition's.
    partition: i32,
}

/// An alert as Alertmanager's API v2 takes it (`POST /api/v2/alerts`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Alert {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub starts_at: DateTime<Utc>,
    /// Set when resolved; while firing, Alertmanager sets it to now + its resolve timeout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ends_at: Option<DateTime<Utc>>,
    #[serde(rename = "generatorURL", skip_serializing_if = "String::is_empty")]
    pub generator_url: String,
}

impl Alert {
    pub fn resolved(&self) -> bool {
        self.ends_at.is_some()
    }

    pub fn name(&self) -> &str {
        self.labels.get("alertname").map_or("", String::as_str)
    }
}

/// Where an alert links to.
#[derive(Debug, Clone, Default)]
pub struct Links {
    /// The API's base URL (the history of an endpoint or pool).
    pub api: Option<String>,
    /// The dashboard's base URL.
    pub dashboard: Option<String>,
}

fn time(us: Micros) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or_default()
}

#[derive(Default)]
struct PoolAlerts {
    seq: i64,
    panic: Option<Alert>,
    outage: Option<Alert>,
}

#[derive(Default)]
pub struct Book {
    links: Links,
    endpoints: HashMap<(String, String), (i64, Option<Alert>)>,
    pools: HashMap<String, PoolAlerts>,
    availability: Option<AvailabilityRule>,
    recent: HashMap<(String, String), Recent>,
    /// Stream time per partition of the changes topic: its latest change or tick. Partitions
    /// are read at their own pace (a replay from the beginning reads one to its end while
    /// another is hours behind): an endpoint is judged at its own partition's time, so that a
    /// change replayed from the past is not judged at another partition's present (before,
    /// every past episode fired at once, stamped with the replay's start, at 0.000 %).
    now: HashMap<i32, Micros>,
}

impl Book {
    pub fn new(links: Links) -> Book {
        Book {
            links,
            ..Book::default()
        }
    }

    pub fn with_availability(mut self, rule: AvailabilityRule) -> Book {
        self.availability = Some(rule);
        self
    }

    /// Stream time moved on (a tick on `partition`): availability alerts of its endpoints fired
    /// or resolved now.
    pub fn tick(&mut self, partition: i32, at: Micros) -> Vec<Alert> {
        let now = self.now.entry(partition).or_insert(at);
        *now = (*now).max(at);
        let keys: Vec<(String, String)> = self
            .recent
            .iter()
            .filter(|(_, r)| r.partition == partition)
            .map(|(k, _)| k.clone())
            .collect();
        let mut send: Vec<Alert> = keys.iter().filter_map(|k| self.judge(k)).collect();
        send.sort_by(|a, b| a.labels.cmp(&b.labels));
        send
    }

    /// The availability rule on one endpoint: an alert to send if it fires or resolves now.
    /// Changes older than the window (but the last before it) are dropped, and so is an endpoint
    /// with no alert and nothing left inside the window.
    fn judge(&mut self, key: &(String, String)) -> Option<Alert> {
        let rule = self.availability?;
        let now = *self.now.get(&self.recent.get(key)?.partition)?;
        let range = vitals_uptime::Range {
            from: now - rule.window_us,
            to: now,
            bucket: None,
        };
        let r = self.recent.get_mut(key)?;
        let before = r.history.changes.iter().filter(|c| c.at < range.from).count();
        r.history.changes.drain(..before.saturating_sub(1));
        let availability = vitals_uptime::endpoint(&r.history, &range).availability.unwrap_or(1.0);
        let low = availability < rule.below;
        let quiet = r.history.changes.iter().all(|c| c.at < range.from);
        let send = match (r.alert.take(), low) {
            (None, true) => {
                let (pool, endpoint) = key;
                let summary = format!(
                    "{pool}/{endpoint} was in rotation {:.3} % of the last {} s (alert below {:.3} %)",
                    availability * 100.0,
                    rule.window_us / 1_000_000,
                    rule.below * 100.0
                );
                let alert = Alert {
                    labels: BTreeMap::from([
                        ("alertname".to_owned(), AVAILABILITY_ALERT.to_owned()),
                        ("pool".to_owned(), pool.clone()),
                        ("endpoint".to_owned(), endpoint.clone()),
                    ]),
                    annotations: self.annotations(summary, pool, Some(endpoint)),
                    starts_at: time(now),
                    ends_at: None,
                    generator_url: self.history(pool, Some(endpoint)),
                };
                self.recent.get_mut(key)?.alert = Some(alert.clone());
                Some(alert)
            }
            (Some(mut a), false) => {
                a.ends_at = Some(time(now).max(a.starts_at));
                a.annotations.insert(
                    "resolution".into(),
                    format!("in rotation {:.3} % of the window", availability * 100.0),
                );
                if quiet {
                    self.recent.remove(key);
                }
                Some(a)
            }
            (current, _) => {
                let r = self.recent.get_mut(key)?;
                r.alert = current;
                if r.alert.is_none() && quiet {
                    self.recent.remove(key);
                }
                None
            }
        };
        send
    }

    /// Record a change for the availability rule and judge its endpoint.
    fn remember(&mut self, partition: i32, h: &HealthChanged) -> Option<Alert> {
        self.availability?;
        let now = self.now.entry(partition).or_insert(h.stream_time);
        *now = (*now).max(h.stream_time);
        let key = (h.pool.clone(), h.endpoint.clone());
        let r = self.recent.entry(key.clone()).or_insert_with(|| Recent {
            history: vitals_uptime::History {
                requests: Vec::new(),
                endpoint: h.endpoint.clone(),
                // Known to the alerter: counted over the whole window.
                seen: Micros::MIN / 4,
                changes: Vec::new(),
            },
            alert: None,
            partition,
        });
        r.partition = partition;
        r.history.changes.push(vitals_uptime::Change {
            at: h.stream_time,
            seq: h.seq,
            from: h.from_state,
            to: h.to_state,
            weight: h.weight,
            code: h.reason_code.clone(),
            calls: 0,
        });
        self.judge(&key)
    }

    fn history(&self, pool: &str, endpoint: Option<&str>) -> String {
        history(&self.links, pool, endpoint)
    }

    fn annotations(&self, summary: String, pool: &str, endpoint: Option<&str>) -> BTreeMap<String, String> {
        annotations(&self.links, summary, pool, endpoint)
    }

    /// An endpoint's transition: the alerts to send now (none for a duplicate or a change that
    /// neither takes it out nor brings it back).
    pub fn change(&mut self, partition: i32, h: &HealthChanged) -> Vec<Alert> {
        let key = (h.pool.clone(), h.endpoint.clone());
        let (seq, current) = self.endpoints.get(&key).cloned().unwrap_or((-1, None));
        if Applied::of((seq >= 0).then_some(seq), h.seq) == Applied::Duplicate {
            return Vec::new();
        }
        let out = h.to_state == HealthState::Unhealthy;
        let (next, send) = match (current, out) {
            (None, true) => {
                let labels = BTreeMap::from([
                    ("alertname".to_owned(), ENDPOINT_ALERT.to_owned()),
                    ("pool".to_owned(), h.pool.clone()),
                    ("endpoint".to_owned(), h.endpoint.clone()),
                    ("state".to_owned(), h.to_state.as_str().to_owned()),
                    ("reason_code".to_owned(), h.reason_code.clone()),
                ]);
                let alert = Alert {
                    labels,
                    annotations: self.annotations(
                        format!("{}/{} is out of rotation: {}", h.pool, h.endpoint, h.reason),
                        &h.pool,
                        Some(&h.endpoint),
                    ),
                    starts_at: time(h.stream_time),
                    ends_at: None,
                    generator_url: self.history(&h.pool, Some(&h.endpoint)),
                };
                (Some(alert.clone()), vec![alert])
            }
            (Some(a), false) => {
                let mut resolved = a;
                resolved.ends_at = Some(time(h.stream_time).max(resolved.starts_at));
                resolved.annotations.insert(
                    "resolution".into(),
                    format!("back in rotation ({}): {}", h.to_state.as_str(), h.reason),
                );
                (None, vec![resolved])
            }
            (current, _) => (current, Vec::new()),
        };
        self.endpoints.insert(key, (h.seq, next));
        let mut send = send;
        send.extend(self.remember(partition, h));
        send
    }

    /// A pool decision: panic mode and correlated outage alerts, fired or resolved.
    pub fn pool(&mut self, p: &PoolHealthChanged) -> Vec<Alert> {
        let mut state = self.pools.remove(&p.pool).unwrap_or_default();
        if p.seq <= state.seq {
            self.pools.insert(p.pool.clone(), state);
            return Vec::new();
        }
        state.seq = p.seq;
        let mut send = Vec::new();
        let summary = |what: &str| {
            format!(
                "pool {} {what}: {} of {} endpoints healthy, {} ejected. {}",
                p.pool, p.healthy, p.endpoints, p.ejected, p.reason
            )
        };
        for (name, on, slot, what) in [
            (
                PANIC_ALERT,
                p.panic,
                &mut state.panic,
                "is in panic mode (routing over every endpoint)",
            ),
            (
                OUTAGE_ALERT,
                p.correlated_outage,
                &mut state.outage,
                "has a correlated outage (a shared dependency?)",
            ),
        ] {
            match (slot.take(), on) {
                (None, true) => {
                    let alert = Alert {
                        labels: BTreeMap::from([
                            ("alertname".to_owned(), name.to_owned()),
                            ("pool".to_owned(), p.pool.clone()),
                        ]),
                        annotations: self.annotations(summary(what), &p.pool, None),
                        starts_at: time(p.stream_time),
                        ends_at: None,
                        generator_url: self.history(&p.pool, None),
                    };
                    send.push(alert.clone());
                    *slot = Some(alert);
                }
                (Some(mut a), false) => {
                    a.ends_at = Some(time(p.stream_time).max(a.starts_at));
                    send.push(a);
                }
                (current, _) => *slot = current,
            }
        }
        self.pools.insert(p.pool.clone(), state);
        send
    }

    /// Every alert firing now, to re-send.
    pub fn firing(&self) -> Vec<Alert> {
        let mut v: Vec<Alert> = self
            .endpoints
            .values()
            .filter_map(|(_, a)| a.clone())
            .chain(
                self.pools
                    .values()
                    .flat_map(|p| [p.panic.clone(), p.outage.clone()])
                    .flatten(),
            )
            .chain(self.recent.values().filter_map(|r| r.alert.clone()))
            .collect();
        v.sort_by(|a, b| a.labels.cmp(&b.labels));
        v
    }
}

/// The API's history of an endpoint (or a pool), if the API's URL is known.
pub fn history(links: &Links, pool: &str, endpoint: Option<&str>) -> String {
    let Some(api) = &links.api else {
        return String::new();
    };
    let api = api.trim_end_matches('/');
    match endpoint {
        Some(e) => format!("{api}/v1/transitions?pool={pool}&endpoint={e}"),
        None => format!("{api}/v1/transitions?pool={pool}"),
    }
}

/// An alert's annotations: its summary, and links to the history and the dashboard.
pub fn annotations(links: &Links, summary: String, pool: &str, endpoint: Option<&str>) -> BTreeMap<String, String> {
    let mut a = BTreeMap::from([("summary".to_owned(), summary)]);
    let history = history(links, pool, endpoint);
    if !history.is_empty() {
        a.insert("history".into(), history);
    }
    if let Some(d) = &links.dashboard {
        let d = d.trim_end_matches('/');
        let url = match endpoint {
            Some(e) => format!("{d}/#/pools/{pool}/endpoints/{e}"),
            None => format!("{d}/#/pools/{pool}"),
        };
        a.insert("dashboard".into(), url);
    }
    a
}

/// A Slack-compatible webhook body for one alert.
pub fn slack(a: &Alert) -> serde_json::Value {
    let status = if a.resolved() { "RESOLVED" } else { "FIRING" };
    let mut text = format!(
        "[{status}] {}: {}",
        a.name(),
        a.annotations.get("summary").map_or("", String::as_str)
    );
    if let Some(r) = a.annotations.get("resolution") {
        text.push_str(&format!(" — {r}"));
    }
    if let Some(h) = a.annotations.get("history") {
        text.push_str(&format!(" <{h}|history>"));
    }
    serde_json::json!({ "text": text })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(ep: &str, seq: i64, to: HealthState, at: Micros) -> HealthChanged {
        HealthChanged {
            transition_id: format!("p/{ep}/{seq}"),
            weight: 0.0,
            reason_code: "ejected".into(),
            reason: "5 refused in a row".into(),
            ..HealthChanged::new("p", ep, seq, HealthState::Healthy, to, at)
        }
    }

    fn pool(seq: i64, panic: bool, outage: bool) -> PoolHealthChanged {
        PoolHealthChanged {
            pool: "p".into(),
            seq,
            endpoints: 3,
            healthy: 1,
            ejected: 1,
            healthy_fraction: 0.33,
            panic,
            correlated_outage: outage,
            reason: String::new(),
            policy_version: 0,
            stream_time: seq * 1_000_000,
            faulty_reporters: vec![],
        }
    }

    #[test]
    fn an_endpoint_alert_fires_while_out_and_resolves_when_back() {
        let mut b = Book::new(Links {
            api: Some("http://api:8080".into()),
            dashboard: Some("http://api:8080".into()),
        });
        let fired = b.change(0, &change("a", 1, HealthState::Unhealthy, 1_000_000));
        assert_eq!(fired.len(), 1);
        assert_eq!(fired[0].labels["alertname"], ENDPOINT_ALERT);
        assert_eq!(fired[0].labels["reason_code"], "ejected");
        assert_eq!(
            fired[0].annotations["history"],
            "http://api:8080/v1/transitions?pool=p&endpoint=a"
        );
        assert!(!fired[0].resolved());
        assert!(
            b.change(0, &change("a", 1, HealthState::Unhealthy, 1_000_000))
                .is_empty(),
            "duplicate"
        );
        assert_eq!(b.firing().len(), 1);
        let done = b.change(0, &change("a", 2, HealthState::Recovering, 9_000_000));
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].ends_at, Some(time(9_000_000)));
        assert_eq!(done[0].starts_at, time(1_000_000));
        assert!(b.firing().is_empty());
        assert!(b
            .change(0, &change("a", 3, HealthState::Healthy, 10_000_000))
            .is_empty());
        assert!(slack(&done[0])["text"]
            .as_str()
            .unwrap()
            .starts_with("[RESOLVED] VitalsEndpointOutOfRotation"));
    }

    /// The availability rule of the tests: below 99 % of the last 60 s.
    fn below_99_over_a_minute() -> Book {
        Book::default().with_availability(AvailabilityRule {
            below: 0.99,
            window_us: 60_000_000,
        })
    }

    /// Found in testing: a new consumer group replays the changes topic; one partition is read to its
    /// present while another still replays an old episode. Judged at the other partition's
    /// present, the old ejection (its return not read yet) read as out all of the window: the
    /// alert fired stamped with the replay's time, at 0.000 %. Each partition keeps its own
    /// stream time: the old episode is judged in its own, with its true figure.
    #[test]
    fn a_replayed_episode_is_judged_in_its_partitions_stream_time() {
        let s = 1_000_000;
        let mut b = below_99_over_a_minute();
        assert!(b.tick(1, 10_000 * s).is_empty(), "partition 1 at its present");
        let mut z = change("z", 1, HealthState::Suspect, 9_990 * s);
        z.weight = 1.0;
        assert!(b.change(1, &z).is_empty());
        let out = b.change(0, &change("a", 1, HealthState::Unhealthy, 100 * s));
        assert!(
            out.iter().all(|a| a.name() != AVAILABILITY_ALERT),
            "in rotation all of the window before it: {out:?}"
        );
        assert!(
            b.tick(1, 10_001 * s).is_empty(),
            "partition 1's time judges its own endpoints only"
        );
        let low = b.tick(0, 103 * s);
        assert_eq!((low.len(), low[0].name()), (1, AVAILABILITY_ALERT), "{low:?}");
        assert_eq!(low[0].starts_at, time(103 * s));
        assert!(
            low[0].annotations["summary"].contains("in rotation 95.000 % of the last 60 s"),
            "{low:?}"
        );
        let mut back = change("a", 2, HealthState::Recovering, 105 * s);
        back.weight = 0.1;
        b.change(0, &back);
        let over = b.tick(0, 166 * s);
        assert_eq!((over.len(), over[0].resolved()), (1, true), "{over:?}");
        assert_eq!(over[0].ends_at, Some(time(166 * s)));
    }

    /// Availability over the trailing window, in stream time: out 10 s of a 60 s window is
    /// 83 %, below 99 %: fires; once the window holds no outage it resolves and is forgotten.
    #[test]
    fn an_availability_alert_fires_below_the_threshold_and_resolves_when_the_window_recovers() {
        let s = 1_000_000;
        let mut b = below_99_over_a_minute();
        let out = b.change(0, &change("a", 1, HealthState::Unhealthy, 100 * s));
        assert_eq!(
            out.len(),
            1,
            "out of rotation, but in rotation all of the window so far: {out:?}"
        );
        let low = b.tick(0, 101 * s);
        assert_eq!(
            (low.len(), low[0].name()),
            (1, AVAILABILITY_ALERT),
            "1 s out of 60: 98.3 %"
        );
        assert!(
            low[0].annotations["summary"].contains("in rotation 98.333 % of the last 60 s"),
            "{low:?}"
        );
        assert!(b.tick(0, 102 * s).is_empty(), "already firing");
        let mut back = change("a", 2, HealthState::Recovering, 110 * s);
        back.weight = 0.1;
        let sent = b.change(0, &back);
        assert_eq!(
            sent.len(),
            1,
            "the out-of-rotation alert resolves; availability is still low"
        );
        assert_eq!(b.firing().iter().filter(|a| a.name() == AVAILABILITY_ALERT).count(), 1);
        assert!(b.tick(0, 150 * s).is_empty(), "10 s out of the last 60: 83 %");
        let sent = b.tick(0, 171 * s);
        assert_eq!(
            (sent.len(), sent[0].name(), sent[0].resolved()),
            (1, AVAILABILITY_ALERT, true)
        );
        assert!(sent[0].annotations["summary"].contains("of the last 60 s (alert below 99.000 %)"));
        assert!(b.firing().is_empty());
        assert!(b.recent.is_empty(), "nothing left in the window: forgotten");
        // Without the rule, nothing of this happens.
        let mut plain = Book::default();
        assert_eq!(
            plain.change(0, &change("a", 1, HealthState::Unhealthy, 100 * s)).len(),
            1
        );
        assert!(plain.tick(0, 500 * s).is_empty());
    }

    #[test]
    fn pool_alerts_follow_panic_and_correlated_outages() {
        let mut b = Book::default();
        let sent = b.pool(&pool(1, true, true));
        let names: Vec<&str> = sent.iter().map(Alert::name).collect();
        assert_eq!(names, [PANIC_ALERT, OUTAGE_ALERT]);
        assert!(b.pool(&pool(1, false, false)).is_empty(), "an old seq");
        let sent = b.pool(&pool(2, false, true));
        assert_eq!((sent.len(), sent[0].name(), sent[0].resolved()), (1, PANIC_ALERT, true));
        assert_eq!(b.firing().len(), 1);
        let sent = b.pool(&pool(3, false, false));
        assert_eq!((sent[0].name(), sent[0].resolved()), (OUTAGE_ALERT, true));
        assert!(b.firing().is_empty());
    }
}
