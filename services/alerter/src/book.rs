//! What is alerting: a fold over the changes topic. An endpoint alert fires while the endpoint is
//! out of rotation (unhealthy) and resolves when it is back; a pool alert fires while the pool is
//! in panic mode or a correlated outage. Every change yields the alerts to send now; `firing`
//! is what must be re-sent so that Alertmanager keeps it open.

use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use vitals_contracts::seq::Applied;
use vitals_contracts::{HealthChanged, HealthState, Micros, PoolHealthChanged};

pub const ENDPOINT_ALERT: &str = "VitalsEndpointOutOfRotation";
pub const PANIC_ALERT: &str = "VitalsPoolPanic";
pub const OUTAGE_ALERT: &str = "VitalsCorrelatedOutage";

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
}

impl Book {
    pub fn new(links: Links) -> Book {
        Book {
            links,
            ..Book::default()
        }
    }

    fn history(&self, pool: &str, endpoint: Option<&str>) -> String {
        let Some(api) = &self.links.api else {
            return String::new();
        };
        let api = api.trim_end_matches('/');
        match endpoint {
            Some(e) => format!("{api}/v1/transitions?pool={pool}&endpoint={e}"),
            None => format!("{api}/v1/transitions?pool={pool}"),
        }
    }

    fn annotations(&self, summary: String, pool: &str, endpoint: Option<&str>) -> BTreeMap<String, String> {
        let mut a = BTreeMap::from([("summary".to_owned(), summary)]);
        let history = self.history(pool, endpoint);
        if !history.is_empty() {
            a.insert("history".into(), history);
        }
        if let Some(d) = &self.links.dashboard {
            let d = d.trim_end_matches('/');
            let url = match endpoint {
                Some(e) => format!("{d}/#/pools/{pool}/endpoints/{e}"),
                None => format!("{d}/#/pools/{pool}"),
            };
            a.insert("dashboard".into(), url);
        }
        a
    }

    /// An endpoint's transition: the alerts to send now (none for a duplicate or a change that
    /// neither takes it out nor brings it back).
    pub fn change(&mut self, h: &HealthChanged) -> Vec<Alert> {
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
            .collect();
        v.sort_by(|a, b| a.labels.cmp(&b.labels));
        v
    }
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
        }
    }

    #[test]
    fn an_endpoint_alert_fires_while_out_and_resolves_when_back() {
        let mut b = Book::new(Links {
            api: Some("http://api:8080".into()),
            dashboard: Some("http://api:8080".into()),
        });
        let fired = b.change(&change("a", 1, HealthState::Unhealthy, 1_000_000));
        assert_eq!(fired.len(), 1);
        assert_eq!(fired[0].labels["alertname"], ENDPOINT_ALERT);
        assert_eq!(fired[0].labels["reason_code"], "ejected");
        assert_eq!(
            fired[0].annotations["history"],
            "http://api:8080/v1/transitions?pool=p&endpoint=a"
        );
        assert!(!fired[0].resolved());
        assert!(
            b.change(&change("a", 1, HealthState::Unhealthy, 1_000_000)).is_empty(),
            "duplicate"
        );
        assert_eq!(b.firing().len(), 1);
        let done = b.change(&change("a", 2, HealthState::Recovering, 9_000_000));
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].ends_at, Some(time(9_000_000)));
        assert_eq!(done[0].starts_at, time(1_000_000));
        assert!(b.firing().is_empty());
        assert!(b.change(&change("a", 3, HealthState::Healthy, 10_000_000)).is_empty());
        assert!(slack(&done[0])["text"]
            .as_str()
            .unwrap()
            .starts_with("[RESOLVED] VitalsEndpointOutOfRotation"));
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
