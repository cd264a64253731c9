//! The records as JSON: transitions, pool events, endpoint health, signals.

use super::{DependencyStatusName, Outcome, ProbeKindName, ReasonCode, StateName};
use crate::types::{self as c, Micros};
use crate::types::{CallSummary, Histogram, OutcomeCounts};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A stream time (µs) as a timestamp; times outside chrono's range become the epoch.
pub fn time(us: Micros) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or_default()
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ViewError {
    #[error("unknown reason code {0:?}: this build knows {known}", known = ReasonCode::names().join(", "))]
    UnknownReasonCode(String),
}

/// One transition with its evidence.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    pub pool: String,
    pub endpoint: String,
    pub seq: i64,
    pub transition_id: String,
    pub from_state: StateName,
    pub to_state: StateName,
    pub weight: f64,
    pub ramp_ms: i64,
    pub retry_at: Option<DateTime<Utc>>,
    pub reason_code: ReasonCode,
    /// One line a person can read.
    pub reason: String,
    pub policy_version: i32,
    pub trigger_ids: Vec<String>,
    pub evidence: c::Evidence,
    pub stream_time: DateTime<Utc>,
    /// Null: the endpoint's fleet-wide state. Otherwise the scope of reporters it is for
    /// (`gateway=g1`, `location=eu`, `key=k1`): only their routers apply it.
    #[serde(default)]
    pub scope: Option<String>,
}

/// A scoped decision in force: the endpoint out for one scope of reporters only.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScopedHealth {
    pub endpoint: String,
    /// `gateway=g1`, `location=eu` or `key=k1`.
    pub scope: String,
    pub state: StateName,
    pub weight: f64,
    /// When a call from the scope is its trial.
    pub retry_at: Option<DateTime<Utc>>,
    pub since: DateTime<Utc>,
    pub reason: String,
    pub seq: i64,
}

impl TryFrom<c::HealthChanged> for Transition {
    type Error = ViewError;

    fn try_from(h: c::HealthChanged) -> Result<Transition, ViewError> {
        let reason_code = ReasonCode::parse(&h.reason_code).ok_or(ViewError::UnknownReasonCode(h.reason_code))?;
        Ok(Transition {
            pool: h.pool,
            endpoint: h.endpoint,
            seq: h.seq,
            transition_id: h.transition_id,
            from_state: h.from_state.into(),
            to_state: h.to_state.into(),
            weight: h.weight,
            ramp_ms: h.ramp_ms,
            retry_at: h.retry_at.map(time),
            reason_code,
            reason: h.reason,
            policy_version: h.policy_version,
            trigger_ids: h.trigger_ids,
            evidence: h.evidence,
            stream_time: time(h.stream_time),
            scope: h.scope,
        })
    }
}

/// A pool-level decision (panic mode, correlated outage, policy change).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolEvent {
    pub pool: String,
    pub seq: i64,
    pub endpoints: i32,
    pub healthy: i32,
    pub ejected: i32,
    pub healthy_fraction: f64,
    pub panic: bool,
    pub correlated_outage: bool,
    pub reason: String,
    pub policy_version: i32,
    pub stream_time: DateTime<Utc>,
}

impl From<c::PoolHealthChanged> for PoolEvent {
    fn from(p: c::PoolHealthChanged) -> PoolEvent {
        PoolEvent {
            pool: p.pool,
            seq: p.seq,
            endpoints: p.endpoints,
            healthy: p.healthy,
            ejected: p.ejected,
            healthy_fraction: p.healthy_fraction,
            panic: p.panic,
            correlated_outage: p.correlated_outage,
            reason: p.reason,
            policy_version: p.policy_version,
            stream_time: time(p.stream_time),
        }
    }
}

/// The current health of one endpoint.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointHealth {
    pub endpoint: String,
    pub state: StateName,
    /// Routing weight 0..1; during slow start it rises to 1 over `ramp_ms` from `since`.
    pub weight: f64,
    pub ramp_ms: i64,
    pub score: f64,
    pub failure_rate: f64,
    pub since: DateTime<Utc>,
    /// The reason of the last transition ("first seen" before any).
    pub reason: String,
    /// Sequence number of the last transition (0: none yet).
    pub seq: i64,
    pub policy_version: i32,
}

impl From<c::EndpointState> for EndpointHealth {
    fn from(s: c::EndpointState) -> EndpointHealth {
        EndpointHealth {
            endpoint: s.endpoint,
            state: s.state.into(),
            weight: s.weight,
            ramp_ms: s.ramp_ms,
            score: s.score,
            failure_rate: s.failure_rate,
            since: time(s.since),
            reason: s.reason,
            seq: s.seq,
            policy_version: s.policy_version,
        }
    }
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dependency {
    pub name: String,
    pub critical: bool,
    pub status: DependencyStatusName,
}

/// One call through a gateway, as JSON.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallItem {
    /// Unique id of the event; generated when absent.
    pub event_id: Option<String>,
    pub pool: String,
    pub endpoint: String,
    pub gateway: String,
    /// When the call happened (RFC 3339); now when absent.
    pub occurred_at: Option<DateTime<Utc>>,
    pub outcome: Outcome,
    pub http_status: Option<i32>,
    pub latency_us: i64,
    pub ttft_us: Option<i64>,
    pub tpot_us: Option<i64>,
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
    pub model: Option<String>,
    /// The upstream's Retry-After on a 429 or 503, in milliseconds.
    pub retry_after_ms: Option<i64>,
}

/// One active probe, as JSON.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeItem {
    pub probe_id: Option<String>,
    pub pool: String,
    pub endpoint: String,
    pub prober: String,
    pub occurred_at: Option<DateTime<Utc>>,
    pub kind: ProbeKindName,
    pub outcome: Outcome,
    pub latency_us: i64,
    pub ttft_us: Option<i64>,
    pub http_status: Option<i32>,
    pub interval_ms: Option<i64>,
    #[serde(default)]
    pub dependencies: Vec<Dependency>,
    #[serde(default)]
    pub detail: String,
}

/// Calls summed at a gateway (a `CallSummary`, see `schemas/call_summary.avsc`), as JSON.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SummaryItem {
    /// Unique id of the summary; generated when absent.
    pub summary_id: Option<String>,
    pub pool: String,
    pub endpoint: String,
    pub gateway: String,
    /// When the first call summed here ended (RFC 3339).
    pub started_at: DateTime<Utc>,
    /// When the last call summed here ended (RFC 3339).
    pub ended_at: DateTime<Utc>,
    /// Calls per outcome class (absent classes count 0).
    pub calls: OutcomeCounts,
    /// Latency of the successful calls (µs, 1 % log-linear buckets).
    #[serde(default)]
    pub latency: Histogram,
    /// First-token times of the successful calls that streamed.
    #[serde(default)]
    pub ttft: Histogram,
    #[serde(default)]
    pub leading_failures: i32,
    #[serde(default)]
    pub longest_failure_run: i32,
    #[serde(default)]
    pub trailing_failures: i32,
    #[serde(default)]
    pub trailing_successes: i32,
    #[serde(default)]
    pub longest_hard_run: i32,
    #[serde(default)]
    pub trailing_hard: i32,
    #[serde(default)]
    pub trailing_rate_limited: i32,
    pub max_retry_after_ms: Option<i64>,
    #[serde(default)]
    pub models: Vec<String>,
}

impl From<CallSummary> for SummaryItem {
    fn from(s: CallSummary) -> SummaryItem {
        let t = |us: Micros| DateTime::from_timestamp_micros(us).unwrap_or_default();
        SummaryItem {
            summary_id: Some(s.summary_id),
            pool: s.pool,
            endpoint: s.endpoint,
            gateway: s.gateway,
            started_at: t(s.started_at),
            ended_at: t(s.ended_at),
            calls: s.calls,
            latency: s.latency,
            ttft: s.ttft,
            leading_failures: s.leading_failures,
            longest_failure_run: s.longest_failure_run,
            trailing_failures: s.trailing_failures,
            trailing_successes: s.trailing_successes,
            longest_hard_run: s.longest_hard_run,
            trailing_hard: s.trailing_hard,
            trailing_rate_limited: s.trailing_rate_limited,
            max_retry_after_ms: s.max_retry_after_ms,
            models: s.models,
        }
    }
}

/// A signal as JSON: a call, a call summary or a probe.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SignalItem {
    Call(CallItem),
    Summary(SummaryItem),
    Probe(ProbeItem),
}

impl From<c::CallOutcome> for CallItem {
    /// The JSON form of a call report (what HTTP ingest takes); the inverse of
    /// [`SignalItem::into_signal`] for a call with its id and time.
    fn from(o: c::CallOutcome) -> CallItem {
        CallItem {
            event_id: Some(o.event_id),
            pool: o.pool,
            endpoint: o.endpoint,
            gateway: o.gateway,
            occurred_at: DateTime::from_timestamp_micros(o.occurred_at),
            outcome: o.outcome.into(),
            http_status: o.http_status,
            latency_us: o.latency_us,
            ttft_us: o.ttft_us,
            tpot_us: o.tpot_us,
            attributes: o.attributes,
            model: o.model,
            retry_after_ms: o.retry_after_ms,
        }
    }
}

impl SignalItem {
    /// The contract record: `id` names it when the item has no id of its own, `now` (µs) dates it
    /// when it has no time.
    pub fn into_signal(self, id: impl FnOnce(&str) -> String, now: Micros) -> c::Signal {
        let at = |t: Option<DateTime<Utc>>| t.map_or(now, |t| t.timestamp_micros());
        match self {
            SignalItem::Call(i) => c::Signal::Call(c::CallOutcome {
                event_id: i.event_id.unwrap_or_else(|| id("api")),
                pool: i.pool,
                endpoint: i.endpoint,
                gateway: i.gateway,
                occurred_at: at(i.occurred_at),
                outcome: i.outcome.into(),
                http_status: i.http_status,
                latency_us: i.latency_us,
                ttft_us: i.ttft_us,
                tpot_us: i.tpot_us,
                attributes: i.attributes,
                model: i.model,
                retry_after_ms: i.retry_after_ms,
            }),
            SignalItem::Summary(s) => c::Signal::Summary(CallSummary {
                summary_id: s.summary_id.unwrap_or_else(|| id("api-summary")),
                pool: s.pool,
                endpoint: s.endpoint,
                gateway: s.gateway,
                started_at: s.started_at.timestamp_micros(),
                ended_at: s.ended_at.timestamp_micros(),
                calls: s.calls,
                latency: s.latency,
                ttft: s.ttft,
                leading_failures: s.leading_failures,
                longest_failure_run: s.longest_failure_run,
                trailing_failures: s.trailing_failures,
                trailing_successes: s.trailing_successes,
                longest_hard_run: s.longest_hard_run,
                trailing_hard: s.trailing_hard,
                trailing_rate_limited: s.trailing_rate_limited,
                max_retry_after_ms: s.max_retry_after_ms,
                models: s.models,
                // Only a merge stage says whose calls another's were (not the HTTP ingest).
                reporters: None,
            }),
            SignalItem::Probe(p) => c::Signal::Probe(c::ProbeResult {
                probe_id: p.probe_id.unwrap_or_else(|| id("api-probe")),
                pool: p.pool,
                endpoint: p.endpoint,
                prober: p.prober,
                occurred_at: at(p.occurred_at),
                kind: p.kind.into(),
                outcome: p.outcome.into(),
                latency_us: p.latency_us,
                ttft_us: p.ttft_us,
                http_status: p.http_status,
                interval_ms: p.interval_ms,
                dependencies: p
                    .dependencies
                    .into_iter()
                    .map(|d| c::DependencyReport {
                        name: d.name,
                        critical: d.critical,
                        status: d.status.into(),
                    })
                    .collect(),
                detail: p.detail,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::Action;

    #[test]
    fn a_summary_survives_its_json_form() {
        let mut s = CallSummary::new("s-1".into(), "p", "e", "g", 1_700_000_000_000_000);
        for (i, class) in [
            c::OutcomeClass::Success,
            c::OutcomeClass::ServerError,
            c::OutcomeClass::Success,
        ]
        .into_iter()
        .enumerate()
        {
            s.add(&c::CallOutcome {
                latency_us: 1_000 * (i as i64 + 1),
                ttft_us: Some(500),
                model: Some("m".into()),
                ..c::CallOutcome::new(format!("c{i}"), "p", "e", "g", 1_700_000_000_000_000 + i as i64, class)
            });
        }
        let json = serde_json::to_string(&SignalItem::Summary(s.clone().into())).unwrap();
        assert!(json.contains("\"type\":\"summary\""), "{json}");
        let back: SignalItem = serde_json::from_str(&json).unwrap();
        assert_eq!(back.into_signal(|_| unreachable!(), 0), c::Signal::Summary(s));
        // Only what a summary needs is required: the runs and histograms default to empty.
        let minimal = r#"{"type":"summary","pool":"p","endpoint":"e","gateway":"g","started_at":"2026-12-01T00:00:00Z","ended_at":"2026-12-01T00:00:00.250Z","calls":{"success":40}}"#;
        let item: SignalItem = serde_json::from_str(minimal).unwrap();
        let c::Signal::Summary(got) = item.into_signal(|p| format!("{p}-1"), 0) else {
            panic!()
        };
        assert_eq!((got.summary_id.as_str(), got.calls.total()), ("api-summary-1", 40));
    }

    #[test]
    fn a_call_survives_its_json_form() {
        let o = c::CallOutcome {
            event_id: "id-1".into(),
            pool: "p".into(),
            endpoint: "e".into(),
            gateway: "g".into(),
            occurred_at: 1_700_000_000_123_456,
            outcome: c::OutcomeClass::RateLimited,
            http_status: Some(429),
            latency_us: 5,
            ttft_us: None,
            tpot_us: Some(3),
            attributes: [("k".to_owned(), "v".to_owned())].into(),
            model: Some("m".into()),
            retry_after_ms: Some(2_000),
        };
        let json = serde_json::to_string(&SignalItem::Call(o.clone().into())).unwrap();
        let back: SignalItem = serde_json::from_str(&json).unwrap();
        assert_eq!(back.into_signal(|_| unreachable!(), 0), c::Signal::Call(o));
    }

    fn json<T: Serialize>(v: T) -> String {
        serde_json::to_value(v).unwrap().as_str().unwrap().to_owned()
    }

    #[test]
    fn views_write_the_readable_names() {
        for s in c::HealthState::ALL {
            assert_eq!(json(StateName::from(s)), s.as_str());
            assert_eq!(c::HealthState::from(StateName::from(s)), s);
        }
        for o in c::OutcomeClass::ALL {
            assert_eq!(json(Outcome::from(o)), o.as_str());
        }
        for k in c::ProbeKind::ALL {
            assert_eq!(json(ProbeKindName::from(k)), k.as_str());
        }
        for d in c::DependencyStatus::ALL {
            assert_eq!(json(DependencyStatusName::from(d)), d.as_str());
        }
        for a in c::OverrideAction::ALL {
            assert_eq!(json(Action::from(a)), a.as_str());
        }
        for r in ReasonCode::ALL {
            assert_eq!(json(r), r.as_str());
            assert_eq!(ReasonCode::parse(r.as_str()), Some(r));
        }
    }

    #[test]
    fn an_unknown_reason_code_is_an_error_not_a_default() {
        let h = c::HealthChanged {
            transition_id: "t".into(),
            pool: "p".into(),
            endpoint: "e".into(),
            seq: 1,
            from_state: c::HealthState::Healthy,
            to_state: c::HealthState::Unhealthy,
            weight: 0.0,
            ramp_ms: 0,
            retry_at: None,
            reason_code: "from_the_future".into(),
            reason: String::new(),
            evidence: c::Evidence::default(),
            policy_version: 0,
            trigger_ids: vec![],
            stream_time: 0,
            scope: None,
        };
        assert!(matches!(
            Transition::try_from(h.clone()),
            Err(ViewError::UnknownReasonCode(c)) if c == "from_the_future"
        ));
        let ok = Transition::try_from(c::HealthChanged {
            reason_code: "ejected".into(),
            ..h
        })
        .unwrap();
        assert_eq!(ok.reason_code, ReasonCode::Ejected);
        assert_eq!(ok.to_state, StateName::Unhealthy);
    }
}
