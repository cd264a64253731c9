//! Request availability alerts: every `--success-check-secs` the alerter reads each pool's
//! uptime over the last `--success-window-secs` from the API (the processor's per-minute counts
//! of the calls gateways reported) and fires `VitalsEndpointSuccessLow` for an endpoint whose
//! calls succeeded less than `--success-below` of the time, over at least `--success-min-calls`
//! calls. It resolves when the share is back at or above the threshold over enough calls, or
//! when the window holds no calls of the endpoint at all (nothing left for users to feel).

use crate::book::{annotations, history, Alert, Links};
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, HashMap};
use vitals_contracts::view::{EndpointUptime, PoolPage, PoolUptime};

pub const SUCCESS_ALERT: &str = "VitalsEndpointSuccessLow";

/// Fire while fewer than `below` of an endpoint's calls over the window succeeded.
#[derive(Debug, Clone, Copy)]
pub struct SuccessRule {
    pub below: f64,
    pub window_secs: u64,
    pub min_calls: i64,
}

/// What is firing, by (pool, endpoint).
pub struct SuccessBook {
    rule: SuccessRule,
    links: Links,
    firing: HashMap<(String, String), Alert>,
}

impl SuccessBook {
    pub fn new(rule: SuccessRule, links: Links) -> SuccessBook {
        SuccessBook {
            rule,
            links,
            firing: HashMap::new(),
        }
    }

    /// A pool's endpoints over the window ending `now`: the alerts to send now. An endpoint of
    /// the pool that is not in `endpoints` had no calls.
    pub fn judge(&mut self, pool: &str, endpoints: &[EndpointUptime], now: DateTime<Utc>) -> Vec<Alert> {
        let mut send = Vec::new();
        let rule = self.rule;
        let mut seen = Vec::new();
        for e in endpoints {
            let key = (pool.to_owned(), e.endpoint.clone());
            seen.push(e.endpoint.as_str());
            let calls = e.requests.counted();
            let share = e.request_availability.unwrap_or(1.0);
            let enough = calls >= rule.min_calls.max(1);
            match self.firing.get(&key) {
                None if enough && share < rule.below => {
                    let summary = format!(
                        "{pool}/{}: {:.3} % of {calls} calls succeeded over the last {} s (alert below {:.3} %)",
                        e.endpoint,
                        share * 100.0,
                        rule.window_secs,
                        rule.below * 100.0
                    );
                    let alert = Alert {
                        labels: BTreeMap::from([
                            ("alertname".to_owned(), SUCCESS_ALERT.to_owned()),
                            ("pool".to_owned(), pool.to_owned()),
                            ("endpoint".to_owned(), e.endpoint.clone()),
                        ]),
                        annotations: annotations(&self.links, summary, pool, Some(&e.endpoint)),
                        starts_at: now,
                        ends_at: None,
                        generator_url: history(&self.links, pool, Some(&e.endpoint)),
                    };
                    self.firing.insert(key, alert.clone());
                    send.push(alert);
                }
                Some(_) if calls == 0 || (enough && share >= rule.below) => {
                    let why = if calls == 0 {
                        "no calls in the window".to_owned()
                    } else {
                        format!("{:.3} % of {calls} calls succeeded", share * 100.0)
                    };
                    send.extend(self.resolve(&key, now, why));
                }
                _ => {}
            }
        }
        let gone: Vec<(String, String)> = self
            .firing
            .keys()
            .filter(|(p, e)| p == pool && !seen.contains(&e.as_str()))
            .cloned()
            .collect();
        for key in gone {
            send.extend(self.resolve(&key, now, "no calls in the window".to_owned()));
        }
        send.sort_by(|a, b| a.labels.cmp(&b.labels));
        send
    }

    fn resolve(&mut self, key: &(String, String), now: DateTime<Utc>, why: String) -> Option<Alert> {
        let mut a = self.firing.remove(key)?;
        a.ends_at = Some(now.max(a.starts_at));
        a.annotations.insert("resolution".into(), why);
        Some(a)
    }

    /// Pools not in the API's list any more: their alerts resolve.
    pub fn keep_pools(&mut self, pools: &[String], now: DateTime<Utc>) -> Vec<Alert> {
        let gone: Vec<(String, String)> = self
            .firing
            .keys()
            .filter(|(p, _)| !pools.contains(p))
            .cloned()
            .collect();
        gone.iter()
            .filter_map(|k| self.resolve(k, now, "the pool is gone".to_owned()))
            .collect()
    }

    pub fn window_secs(&self) -> u64 {
        self.rule.window_secs
    }

    pub fn firing(&self) -> Vec<Alert> {
        let mut v: Vec<Alert> = self.firing.values().cloned().collect();
        v.sort_by(|a, b| a.labels.cmp(&b.labels));
        v
    }
}

/// Reads pools and their uptime from the API.
pub struct Reader {
    pub client: reqwest::Client,
    pub base: String,
    pub token: Option<String>,
}

impl Reader {
    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str, query: &[(&str, String)]) -> anyhow::Result<T> {
        let url = format!("{}{path}", self.base.trim_end_matches('/'));
        let mut r = self.client.get(&url).query(query);
        if let Some(t) = &self.token {
            r = r.bearer_auth(t);
        }
        let resp = r.send().await?;
        let status = resp.status();
        if !status.is_success() {
            anyhow::bail!(
                "{url}: the API answered {status}: {}",
                resp.text().await.unwrap_or_default()
            );
        }
        Ok(resp.json().await?)
    }

    /// Every pool's name.
    pub async fn pools(&self) -> anyhow::Result<Vec<String>> {
        let mut names = Vec::new();
        let mut after = String::new();
        loop {
            let q = [
                ("endpoints", "0".to_owned()),
                ("limit", "1000".to_owned()),
                ("after", after),
            ];
            let page: PoolPage = self.get("/v1/pools", &q).await?;
            names.extend(page.pools.into_iter().map(|p| p.pool));
            match page.next_after {
                Some(a) => after = a,
                None => return Ok(names),
            }
        }
    }

    /// Every endpoint of a pool over `[from, to)`, a page at a time.
    pub async fn endpoints(
        &self,
        pool: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> anyhow::Result<Vec<EndpointUptime>> {
        let path = format!("/v1/pools/{}/uptime", vitals_contracts::keys::path_segment(pool));
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut q = vec![
                ("from", from.to_rfc3339()),
                ("to", to.to_rfc3339()),
                ("limit", "1000".to_owned()),
            ];
            if let Some(c) = cursor.take() {
                q.push(("cursor", c));
            }
            let page: PoolUptime = self.get(&path, &q).await?;
            out.extend(page.endpoints);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => return Ok(out),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vitals_contracts::Requests;

    fn ep(name: &str, succeeded: i64, failed: i64) -> EndpointUptime {
        let requests = Requests {
            succeeded,
            failed,
            ..Requests::default()
        };
        EndpointUptime {
            endpoint: name.into(),
            observed_s: 60.0,
            available_s: 60.0,
            maintenance_s: 0.0,
            availability: Some(1.0),
            state_s: BTreeMap::new(),
            incidents: 0,
            calls: 0,
            requests,
            request_availability: requests.availability(),
            buckets: Vec::new(),
        }
    }

    #[test]
    fn fires_below_the_share_over_enough_calls_and_resolves_when_back_or_without_calls() {
        let mut b = SuccessBook::new(
            SuccessRule {
                below: 0.99,
                window_secs: 300,
                min_calls: 20,
            },
            Links::default(),
        );
        let now = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();
        let fired = b.judge("p", &[ep("a", 40, 60), ep("b", 0, 5), ep("c", 100, 0)], now);
        assert_eq!(fired.len(), 1, "b has too few calls, c is fine");
        assert_eq!(fired[0].labels["endpoint"], "a");
        assert_eq!(
            fired[0].annotations["summary"],
            "p/a: 40.000 % of 100 calls succeeded over the last 300 s (alert below 99.000 %)"
        );
        assert!(b.judge("p", &[ep("a", 50, 60)], now).is_empty(), "still low: sent once");
        assert!(b.judge("p", &[ep("a", 5, 0)], now).is_empty(), "too few calls to say");
        assert_eq!(b.firing().len(), 1);
        let back = b.judge("p", &[ep("a", 1000, 5)], now);
        assert_eq!((back.len(), back[0].resolved()), (1, true));
        assert!(b.firing().is_empty());
        b.judge("p", &[ep("a", 0, 30)], now);
        let gone = b.judge("p", &[], now);
        assert_eq!(gone[0].annotations["resolution"], "no calls in the window");
        b.judge("p", &[ep("a", 0, 30)], now);
        assert_eq!(b.keep_pools(&["q".to_owned()], now).len(), 1);
    }
}
