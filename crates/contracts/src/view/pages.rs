//! The HTTP API's answers, typed on both sides: the API serializes them and the command-line
//! tool reads them, so a renamed field fails to compile instead of printing `?`.

use super::{EndpointHealth, ScopedHealth, StateName, Transition};
use crate::types as c;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A pool with a page of its endpoints (in name order) and counts over all of them.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolHealth {
    pub pool: String,
    /// A page of the pool's endpoints: see `next_after`.
    pub endpoints: Vec<EndpointHealth>,
    /// Endpoints healthy, of all the pool holds (not only this page).
    pub healthy: usize,
    /// Endpoints the pool holds.
    pub total: usize,
    /// How many of the pool's endpoints are in each state (states with none are left out).
    #[serde(default)]
    pub by_state: std::collections::BTreeMap<String, usize>,
    /// More endpoints follow: pass as `after` to `GET /v1/pools/{pool}` for the next page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
    /// Panic mode (routing over every endpoint), from the pool's latest decision.
    pub panic: bool,
    /// A correlated outage suspected, from the pool's latest decision.
    pub correlated_outage: bool,
}

/// A page of pools, in name order.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolPage {
    pub pools: Vec<PoolHealth>,
    /// Pass as `after` for the next page; absent on the last page.
    pub next_after: Option<String>,
}

/// One endpoint with its latest evidence.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointDetail {
    pub pool: String,
    #[serde(flatten)]
    pub current: EndpointHealth,
    /// The last transition with its full evidence, if there was one.
    pub last_transition: Option<Transition>,
    /// The scoped decisions in force: scopes of reporters the endpoint is out for (the fleet's
    /// state is `current`).
    #[serde(default)]
    pub scoped: Vec<ScopedHealth>,
}

/// A page of transitions, newest first.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryPage {
    pub items: Vec<Transition>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// An operator action on the signals topic.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Accepted {
    /// Id of the record on the signals topic (the trigger id of the resulting transition).
    pub id: String,
    pub partition: i32,
    pub offset: i64,
}

/// A pool's policy in force.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolPolicy {
    pub pool: String,
    /// The policy's version (0: the default, never changed).
    pub version: i64,
    pub policy: c::Policy,
}

// Uptime and incidents: the figures `vitals-uptime` computes from the audit log (its crate docs
// hold the definitions), shown by the API, the dashboard and `vitals report`.

/// Time over one bucket (an hour or a day, UTC-aligned; the first and last clipped to the range).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UptimeBucket {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// Seconds the endpoint (or the pool) was known in this bucket.
    pub observed_s: f64,
    /// Seconds in rotation; for the pool, with at least one endpoint in rotation.
    pub available_s: f64,
    /// Seconds in maintenance (left out of availability); for the pool, with every known
    /// endpoint in maintenance.
    pub maintenance_s: f64,
    /// `available_s / (observed_s − maintenance_s)`; absent when that is 0.
    pub availability: Option<f64>,
    /// The calls in this bucket by what they got (from the processor's per-minute counts of
    /// every call and summary it read; zeros before the counts existed).
    #[serde(default)]
    pub requests: c::Requests,
    /// Request availability: the share of those calls that succeeded (4xx and cancelled calls
    /// left out); absent without calls.
    #[serde(default)]
    pub request_availability: Option<f64>,
}

/// One endpoint over a range.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointUptime {
    pub endpoint: String,
    pub observed_s: f64,
    pub available_s: f64,
    pub maintenance_s: f64,
    /// `available_s / (observed_s − maintenance_s)`; absent when that is 0.
    pub availability: Option<f64>,
    /// Seconds in each state (states with none left out).
    pub state_s: BTreeMap<String, f64>,
    /// Incidents that overlap the range.
    pub incidents: usize,
    /// Calls counted in the evidence of its transitions in the range (the traffic-weighted
    /// figure's weight where the range has no per-minute counts).
    pub calls: i64,
    /// The calls in this range by what they got (from the processor's per-minute counts of
    /// every call and summary it read; zeros before the counts existed).
    #[serde(default)]
    pub requests: c::Requests,
    /// Request availability: the share of those calls that succeeded (4xx and cancelled calls
    /// left out); absent without calls.
    #[serde(default)]
    pub request_availability: Option<f64>,
    pub buckets: Vec<UptimeBucket>,
}

/// The pool as a whole over a range.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolFigures {
    /// Seconds with at least one endpoint known.
    pub observed_s: f64,
    /// Seconds with at least one endpoint in rotation.
    pub any_available_s: f64,
    /// Seconds with every known endpoint not in maintenance in rotation (and at least one).
    pub all_available_s: f64,
    /// Seconds with every known endpoint in maintenance.
    pub maintenance_s: f64,
    /// Seconds in panic mode (routing over every endpoint), from the pool's decisions.
    pub panic_s: f64,
    /// Seconds with a correlated outage suspected.
    pub correlated_outage_s: f64,
    /// `any_available_s / (observed_s − maintenance_s)`.
    pub availability: Option<f64>,
    /// `all_available_s / (observed_s − maintenance_s)`.
    pub all_availability: Option<f64>,
    /// The endpoints' availabilities weighted by the calls each served in the range (by the
    /// calls in their evidence, an estimate, for endpoints without per-minute counts).
    pub traffic_weighted_availability: Option<f64>,
    /// The calls in this range, every endpoint's by what they got (from the processor's per-minute counts of
    /// every call and summary it read; zeros before the counts existed).
    #[serde(default)]
    pub requests: c::Requests,
    /// Request availability: the share of those calls that succeeded (4xx and cancelled calls
    /// left out); absent without calls.
    #[serde(default)]
    pub request_availability: Option<f64>,
    pub incidents: usize,
    pub buckets: Vec<UptimeBucket>,
}

/// `GET /v1/pools/{pool}/uptime`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolUptime {
    pub pool: String,
    pub from: DateTime<Utc>,
    /// The range's end, or now if that is earlier.
    pub to: DateTime<Utc>,
    /// `hour`, `day`, or absent (no buckets).
    pub bucket: Option<String>,
    #[serde(rename = "pool_figures")]
    pub figures: PoolFigures,
    /// Worst availability first: a page of them (`limit`, and at most 5,000 buckets in all).
    pub endpoints: Vec<EndpointUptime>,
    /// The `cursor` of the next page of endpoints, if there are more.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// An incident: an endpoint out of rotation, from the transition that took it out to the one
/// that ended it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Incident {
    pub pool: String,
    pub endpoint: String,
    /// The seq of the transition that took it out.
    pub seq: i64,
    /// When it left rotation.
    pub started_at: DateTime<Utc>,
    /// When it came back (or went into maintenance); absent while it lasts.
    pub ended_at: Option<DateTime<Utc>>,
    pub ongoing: bool,
    /// Until `ended_at`, or until the range's end (or now) while it lasts.
    pub duration_s: f64,
    /// Its first sign: the last departure from healthy since the previous incident (suspect,
    /// degraded), or the start itself.
    pub first_sign_at: DateTime<Utc>,
    /// From the first sign to out of rotation.
    pub time_to_out_s: f64,
    /// From out of rotation to back; absent while it lasts.
    pub time_to_back_s: Option<f64>,
    /// The reason codes of its transitions, first to last, each once.
    pub reason_codes: Vec<String>,
    /// The state it ended in (`recovering`, `healthy`, `maintenance`, …).
    pub ended_in: Option<StateName>,
    /// The reason and evidence of the transition that took it out.
    pub reason: String,
    pub evidence: Option<c::Evidence>,
}

/// A page of incidents, newest first.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IncidentPage {
    pub items: Vec<Incident>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    pub next_cursor: Option<String>,
}
