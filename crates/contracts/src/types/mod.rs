//! Rust types of the Avro records in `schemas/`. Field names and enum symbols match the schemas.

mod call_summary;

use crate::symbols::symbols;
pub use call_summary::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Stream time and record timestamps: microseconds since the Unix epoch.
pub type Micros = i64;

symbols! {
    /// How a call or a probe ended.
    OutcomeClass / Outcome {
        Success = "success",
        Timeout = "timeout",
        ConnectError = "connect_error",
        ConnectionDropped = "connection_dropped",
        RateLimited = "rate_limited",
        ServerError = "server_error",
        ClientError = "client_error",
        InvalidResponse = "invalid_response",
        Cancelled = "cancelled",
    }
}

impl OutcomeClass {
    /// Timeouts, connect errors, dropped connections, 429, 5xx and invalid responses are failures.
    pub fn is_failure(self) -> bool {
        !matches!(
            self,
            OutcomeClass::Success | OutcomeClass::ClientError | OutcomeClass::Cancelled
        )
    }

    /// 4xx and cancelled calls say nothing about the endpoint's health: they are recorded in the
    /// window, and nothing else.
    pub fn is_neutral(self) -> bool {
        matches!(self, OutcomeClass::ClientError | OutcomeClass::Cancelled)
    }

    /// Whether an outcome counts against the endpoint's failure rate and its runs of failures:
    /// every failure but a 429 (rate limiting is the upstream asking for less traffic, which
    /// the cooldown answers; it is not an outage). 4xx and cancelled calls count neither way.
    pub fn counts_as_failure(self) -> bool {
        self.is_failure() && self != OutcomeClass::RateLimited
    }

    /// 5xx and timeouts lead to the hard break (three in a row by default).
    pub fn is_hard(self) -> bool {
        matches!(self, OutcomeClass::ServerError | OutcomeClass::Timeout)
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// Calls as users felt them, by what they got: the request-availability counts of an endpoint
/// (or a pool) over some time, summed from the calls and summaries the processor read.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requests {
    /// Calls that succeeded.
    pub succeeded: i64,
    /// Timeouts, refused or dropped connections, 5xx and invalid responses.
    pub failed: i64,
    /// 429s: the caller did not get an answer either.
    pub rate_limited: i64,
    /// 4xx and cancelled calls: the caller's doing, left out of the share.
    pub neutral: i64,
}

impl Requests {
    /// Count `n` calls of a class.
    pub fn add(&mut self, class: OutcomeClass, n: i64) {
        let slot = match class {
            OutcomeClass::Success => &mut self.succeeded,
            OutcomeClass::RateLimited => &mut self.rate_limited,
            c if c.is_neutral() => &mut self.neutral,
            _ => &mut self.failed,
        };
        *slot = slot.saturating_add(n);
    }

    /// The calls of a summary (or any per-class counts).
    pub fn of_counts(counts: &OutcomeCounts) -> Requests {
        let mut r = Requests::default();
        for (c, n) in counts.iter() {
            r.add(c, n);
        }
        r
    }

    pub fn merge(&mut self, o: &Requests) {
        self.succeeded = self.succeeded.saturating_add(o.succeeded);
        self.failed = self.failed.saturating_add(o.failed);
        self.rate_limited = self.rate_limited.saturating_add(o.rate_limited);
        self.neutral = self.neutral.saturating_add(o.neutral);
    }

    /// The calls the share is taken over: every call but the neutral ones.
    pub fn counted(&self) -> i64 {
        self.succeeded
            .saturating_add(self.failed)
            .saturating_add(self.rate_limited)
    }

    /// Every call, neutral ones included.
    pub fn total(&self) -> i64 {
        self.counted().saturating_add(self.neutral)
    }

    /// Request availability: succeeded / (succeeded + failed + rate limited); None without such
    /// calls.
    pub fn availability(&self) -> Option<f64> {
        let n = self.counted();
        (n > 0).then(|| self.succeeded as f64 / n as f64)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallOutcome {
    pub event_id: String,
    pub pool: String,
    pub endpoint: String,
    pub gateway: String,
    pub occurred_at: Micros,
    pub outcome: OutcomeClass,
    pub http_status: Option<i32>,
    pub latency_us: i64,
    pub ttft_us: Option<i64>,
    pub tpot_us: Option<i64>,
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
    #[serde(default)]
    pub model: Option<String>,
    /// The upstream's Retry-After (429 or 503), in milliseconds. Version 3.
    #[serde(default)]
    pub retry_after_ms: Option<i64>,
}

impl CallOutcome {
    /// A call with what every report has, and the rest empty (no status, no latency, no first
    /// token, no attributes, no model, no Retry-After). Fixtures build on it with struct update
    /// syntax — `CallOutcome { http_status: Some(503), ..CallOutcome::new(…) }` — so that a new
    /// optional field of the schema is added here, not in every test.
    pub fn new(
        event_id: impl Into<String>,
        pool: impl Into<String>,
        endpoint: impl Into<String>,
        gateway: impl Into<String>,
        occurred_at: Micros,
        outcome: OutcomeClass,
    ) -> CallOutcome {
        CallOutcome {
            event_id: event_id.into(),
            pool: pool.into(),
            endpoint: endpoint.into(),
            gateway: gateway.into(),
            occurred_at,
            outcome,
            http_status: None,
            latency_us: 0,
            ttft_us: None,
            tpot_us: None,
            attributes: BTreeMap::new(),
            model: None,
            retry_after_ms: None,
        }
    }
}

symbols! {
    ProbeKind / ProbeKindName {
        Http = "http",
        Tcp = "tcp",
        SyntheticCompletion = "synthetic_completion",
        Heartbeat = "heartbeat",
    }
}

symbols! {
    DependencyStatus / DependencyStatusName {
        Up = "up",
        Degraded = "degraded",
        Down = "down",
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DependencyReport {
    pub name: String,
    pub critical: bool,
    pub status: DependencyStatus,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeResult {
    pub probe_id: String,
    pub pool: String,
    pub endpoint: String,
    pub prober: String,
    pub occurred_at: Micros,
    pub kind: ProbeKind,
    pub outcome: OutcomeClass,
    pub latency_us: i64,
    pub ttft_us: Option<i64>,
    pub http_status: Option<i32>,
    pub interval_ms: Option<i64>,
    #[serde(default)]
    pub dependencies: Vec<DependencyReport>,
    #[serde(default)]
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tick {
    pub ticker: String,
    pub emitted_at: Micros,
}

symbols! {
    /// What an operator asks of an endpoint.
    OverrideAction / Action {
        ForceHealthy = "force_healthy",
        ForceUnhealthy = "force_unhealthy",
        MaintenanceOn = "maintenance_on",
        MaintenanceOff = "maintenance_off",
        Clear = "clear",
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperatorOverride {
    pub override_id: String,
    pub pool: String,
    pub endpoint: String,
    pub action: OverrideAction,
    pub actor: String,
    pub reason: String,
    pub issued_at: Micros,
}

/// Every number of the health model, per pool. Defaults come from the practice articles (see the
/// schema `policy_change.avsc` and the table in docs/decisions.md).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Policy {
    pub version: i32,
    pub window_ms: i64,
    pub bucket_ms: i64,
    pub min_volume: i32,
    pub failure_rate_threshold: f64,
    pub consecutive_failures: i32,
    pub consecutive_successes: i32,
    pub suspect_after_failures: i32,
    pub hard_break_after: i32,
    pub ewma_beta: f64,
    pub ttft_baseline_ms: f64,
    pub ttft_max_ms: f64,
    pub slow_call_ms: i64,
    pub degrade_below: f64,
    pub recover_above: f64,
    pub recover_hold_ms: i64,
    pub degraded_weight: f64,
    pub isolation_base_ms: i64,
    pub isolation_max_ms: i64,
    pub isolation_reset_ms: i64,
    pub slow_start_ms: i64,
    pub slow_start_weight: f64,
    pub max_ejection_pct: f64,
    pub panic_threshold_pct: f64,
    pub latency_outlier_factor: f64,
    pub latency_outlier_min_peers: i32,
    pub latency_outlier_min_ms: f64,
    pub heartbeat_interval_ms: i64,
    pub heartbeat_suspect_intervals: i32,
    pub heartbeat_unhealthy_intervals: i32,
    /// The least an ejected endpoint stays out before a passing probe may readmit it.
    pub readmit_min_ms: i64,
    /// A rate-limited endpoint's cooldown when the upstream sent no Retry-After.
    pub cooldown_ms: i64,
    /// Share of 429s among the recent calls (the last third of the window, at least
    /// `min_volume` calls) that starts a cooldown.
    pub rate_limited_share: f64,
    /// Width (z) of the Wilson bounds that compare an endpoint's failure rate with its peers'.
    pub peer_failure_z: f64,
    /// How far an endpoint's failure rate must lie above its peers' to make it an outlier.
    pub peer_failure_margin: f64,
    /// The most endpoints the pool may hold (version 3). A signal naming one more is refused
    /// and dead-lettered with the reason `pool_full`; the endpoints it holds stay.
    pub max_endpoints: i32,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            version: 0,
            window_ms: 30_000,
            bucket_ms: 3_000,
            min_volume: 10,
            failure_rate_threshold: 0.8,
            consecutive_failures: 5,
            consecutive_successes: 3,
            suspect_after_failures: 2,
            hard_break_after: 3,
            ewma_beta: 0.7,
            ttft_baseline_ms: 250.0,
            ttft_max_ms: 1_250.0,
            slow_call_ms: 10_000,
            degrade_below: 60.0,
            recover_above: 85.0,
            recover_hold_ms: 30_000,
            degraded_weight: 0.25,
            isolation_base_ms: 30_000,
            isolation_max_ms: 300_000,
            isolation_reset_ms: 600_000,
            slow_start_ms: 30_000,
            slow_start_weight: 0.1,
            max_ejection_pct: 50.0,
            panic_threshold_pct: 30.0,
            latency_outlier_factor: 3.0,
            latency_outlier_min_peers: 3,
            latency_outlier_min_ms: 50.0,
            heartbeat_interval_ms: 5_000,
            heartbeat_suspect_intervals: 3,
            heartbeat_unhealthy_intervals: 9,
            readmit_min_ms: 10_000,
            cooldown_ms: 10_000,
            rate_limited_share: 0.25,
            peer_failure_z: 2.0,
            peer_failure_margin: 0.05,
            max_endpoints: 1_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyChange {
    pub change_id: String,
    pub pool: String,
    pub actor: String,
    pub issued_at: Micros,
    pub policy: Policy,
}

/// Everything that may arrive on `vitals.signals.v1`.
#[derive(Debug, Clone, PartialEq)]
pub enum Signal {
    Call(CallOutcome),
    /// Calls summed at the gateway ([`crate::summary`]).
    Summary(CallSummary),
    Probe(ProbeResult),
    Tick(Tick),
    Override(OperatorOverride),
    Policy(PolicyChange),
}

impl Signal {
    /// The pool a signal belongs to; ticks belong to a whole partition.
    pub fn pool(&self) -> Option<&str> {
        match self {
            Signal::Call(c) => Some(&c.pool),
            Signal::Summary(s) => Some(&s.pool),
            Signal::Probe(p) => Some(&p.pool),
            Signal::Override(o) => Some(&o.pool),
            Signal::Policy(p) => Some(&p.pool),
            Signal::Tick(_) => None,
        }
    }

    /// The endpoint a signal is about; policy changes and ticks are about no single endpoint.
    pub fn endpoint(&self) -> Option<&str> {
        match self {
            Signal::Call(c) => Some(&c.endpoint),
            Signal::Summary(s) => Some(&s.endpoint),
            Signal::Probe(p) => Some(&p.endpoint),
            Signal::Override(o) => Some(&o.endpoint),
            Signal::Policy(_) | Signal::Tick(_) => None,
        }
    }

    /// A stable id of the signal, for evidence ("which signals triggered this").
    pub fn id(&self) -> &str {
        match self {
            Signal::Call(c) => &c.event_id,
            Signal::Summary(s) => &s.summary_id,
            Signal::Probe(p) => &p.probe_id,
            Signal::Override(o) => &o.override_id,
            Signal::Policy(p) => &p.change_id,
            Signal::Tick(t) => &t.ticker,
        }
    }

    pub fn occurred_at(&self) -> Micros {
        match self {
            Signal::Call(c) => c.occurred_at,
            Signal::Summary(s) => s.ended_at,
            Signal::Probe(p) => p.occurred_at,
            Signal::Override(o) => o.issued_at,
            Signal::Policy(p) => p.issued_at,
            Signal::Tick(t) => t.emitted_at,
        }
    }
}

symbols! {
    /// The health of an endpoint.
    HealthState / StateName {
        Healthy = "healthy",
        Suspect = "suspect",
        Degraded = "degraded",
        Unhealthy = "unhealthy",
        Recovering = "recovering",
        Maintenance = "maintenance",
    }
}

/// Why a transition happened. On the wire (`HealthChanged.reason_code`) and in the audit log it
/// is the readable name, a string, so that a consumer built before a new code was added still
/// reads the record; everything that lists or filters codes uses this enum.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasonCode {
    /// Failure rate, consecutive failures, a hard break, a failed critical dependency or
    /// heartbeat silence took the endpoint out.
    Ejected,
    /// The score fell below the degrade threshold.
    Degraded,
    /// Early failures: watched, still in rotation.
    Suspect,
    /// A suspect endpoint's failures stopped.
    Cleared,
    /// Back to healthy after recovering or degraded.
    Recovered,
    /// The trial call after an isolation failed: out again for the same isolation, jittered (it
    /// grows only when an endpoint fails soon after a readmission).
    TrialFailed,
    /// The trial call after an isolation succeeded: recovering with slow start.
    TrialSucceeded,
    /// A recovering endpoint failed again.
    FailedWhileRecovering,
    /// Ejecting would exceed the pool's max-ejection share: kept in rotation, flagged.
    EjectionRefused,
    ForcedHealthy,
    ForcedUnhealthy,
    MaintenanceOn,
    OverrideCleared,
    /// Passing evidence that can see what the endpoint was ejected for (a probe, or a call in
    /// panic mode) readmitted it after the minimum isolation: recovering with slow start.
    Readmitted,
    /// The endpoint rate-limited its callers: out for the upstream's Retry-After (or the
    /// policy's cooldown), with no isolation backoff.
    Cooldown,
    /// A cooldown ended: recovering with slow start.
    CooldownOver,
    /// An endpoint kept serving through a suspected shared outage answers again: it is judged on
    /// what happened after the outage, not on the outage's window.
    OutageOver,
    /// Readmitted on probation: after a flap, a failure-rate ejection, or on evidence that cannot
    /// see the fault (a health probe after a first-token ejection). Held at the probation weight
    /// while real calls decide.
    Probation,
    /// On probation, a run of passing outcomes: its weight grows from the probation weight to
    /// full over the ramp while they go on passing.
    ProbationGrowing,
    /// On probation, a failure while its weight grew: back to the probation weight, held.
    ProbationHeld,
    /// Probation passed: enough passing outcomes in a row; recovering with slow start.
    ProbationOver,
}

impl ReasonCode {
    pub const ALL: [ReasonCode; 21] = [
        ReasonCode::Ejected,
        ReasonCode::Degraded,
        ReasonCode::Suspect,
        ReasonCode::Cleared,
        ReasonCode::Recovered,
        ReasonCode::TrialFailed,
        ReasonCode::TrialSucceeded,
        ReasonCode::FailedWhileRecovering,
        ReasonCode::EjectionRefused,
        ReasonCode::ForcedHealthy,
        ReasonCode::ForcedUnhealthy,
        ReasonCode::MaintenanceOn,
        ReasonCode::OverrideCleared,
        ReasonCode::Readmitted,
        ReasonCode::Cooldown,
        ReasonCode::CooldownOver,
        ReasonCode::OutageOver,
        ReasonCode::Probation,
        ReasonCode::ProbationGrowing,
        ReasonCode::ProbationHeld,
        ReasonCode::ProbationOver,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReasonCode::Ejected => "ejected",
            ReasonCode::Degraded => "degraded",
            ReasonCode::Suspect => "suspect",
            ReasonCode::Cleared => "cleared",
            ReasonCode::Recovered => "recovered",
            ReasonCode::TrialFailed => "trial_failed",
            ReasonCode::TrialSucceeded => "trial_succeeded",
            ReasonCode::FailedWhileRecovering => "failed_while_recovering",
            ReasonCode::EjectionRefused => "ejection_refused",
            ReasonCode::ForcedHealthy => "forced_healthy",
            ReasonCode::ForcedUnhealthy => "forced_unhealthy",
            ReasonCode::MaintenanceOn => "maintenance_on",
            ReasonCode::OverrideCleared => "override_cleared",
            ReasonCode::Readmitted => "readmitted",
            ReasonCode::Cooldown => "cooldown",
            ReasonCode::CooldownOver => "cooldown_over",
            ReasonCode::OutageOver => "outage_over",
            ReasonCode::Probation => "probation",
            ReasonCode::ProbationGrowing => "probation_growing",
            ReasonCode::ProbationHeld => "probation_held",
            ReasonCode::ProbationOver => "probation_over",
        }
    }

    pub fn parse(s: &str) -> Option<ReasonCode> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }

    pub fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|c| c.as_str()).collect()
    }
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Evidence {
    pub window_ms: i64,
    pub success: i64,
    pub timeout: i64,
    pub connect_error: i64,
    pub connection_dropped: i64,
    pub rate_limited: i64,
    pub server_error: i64,
    pub client_error: i64,
    pub invalid_response: i64,
    pub cancelled: i64,
    pub failure_rate: f64,
    pub score: f64,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub latency_ewma_ms: Option<f64>,
    pub pool_latency_median_ms: Option<f64>,
    pub consecutive_failures: i32,
    pub consecutive_successes: i32,
    pub consecutive_hard_failures: i32,
    pub isolations: i32,
    pub thresholds: Vec<String>,
    /// Reports of the endpoint set aside as late in this window and the last (whatever their
    /// outcome: a call later than the window, after its reporter's clock offset). In the audit
    /// log and the API; the event on the changes topic says it in its reason.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub late: i64,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

impl Evidence {
    /// Calls in the window that count against the endpoint (every class that
    /// [`OutcomeClass::is_failure`] names).
    pub fn failures(&self) -> i64 {
        self.timeout
            + self.connect_error
            + self.connection_dropped
            + self.rate_limited
            + self.server_error
            + self.invalid_response
    }

    /// Calls that decide the failure rate: successes and failures (4xx and cancelled are neutral).
    pub fn decisive_calls(&self) -> i64 {
        self.success + self.failures()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthChanged {
    pub transition_id: String,
    pub pool: String,
    pub endpoint: String,
    pub seq: i64,
    pub from_state: HealthState,
    pub to_state: HealthState,
    pub weight: f64,
    pub ramp_ms: i64,
    pub retry_at: Option<Micros>,
    pub reason_code: String,
    pub reason: String,
    pub evidence: Evidence,
    pub policy_version: i32,
    pub trigger_ids: Vec<String>,
    pub stream_time: Micros,
    /// None: the endpoint's fleet-wide state. Otherwise the reporters the transition is for
    /// ([`crate::scope`]): only the routers in that scope apply it. Version 2.
    #[serde(default)]
    pub scope: Option<String>,
}

impl HealthChanged {
    /// A transition of `endpoint` into `to` with its id from pool, endpoint and seq, weight 0 out
    /// of rotation (unhealthy, maintenance) and 1 otherwise, and the rest empty (no reason, no
    /// evidence, no triggers, policy version 0). Fixtures build on it with struct update syntax,
    /// so that a new field of the schema is added here, not in every test.
    pub fn new(
        pool: impl Into<String>,
        endpoint: impl Into<String>,
        seq: i64,
        from: HealthState,
        to: HealthState,
        stream_time: Micros,
    ) -> HealthChanged {
        let (pool, endpoint) = (pool.into(), endpoint.into());
        HealthChanged {
            transition_id: format!("{pool}/{endpoint}/{seq}"),
            pool,
            endpoint,
            seq,
            from_state: from,
            to_state: to,
            weight: if matches!(to, HealthState::Unhealthy | HealthState::Maintenance) {
                0.0
            } else {
                1.0
            },
            ramp_ms: 0,
            retry_at: None,
            reason_code: String::new(),
            reason: String::new(),
            evidence: Evidence::default(),
            policy_version: 0,
            trigger_ids: Vec::new(),
            stream_time,
            scope: None,
        }
    }

    /// The reason code as the enum, to compare with (None: a code this build does not know, from
    /// a newer processor).
    pub fn reason(&self) -> Option<ReasonCode> {
        ReasonCode::parse(&self.reason_code)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolHealthChanged {
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
    pub stream_time: Micros,
    /// Reporters whose calls fail to most of the pool while the others' pass (`gateway=g1`):
    /// their calls are set aside for fleet decisions. Version 2.
    #[serde(default)]
    pub faulty_reporters: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointState {
    pub pool: String,
    pub endpoint: String,
    pub seq: i64,
    pub state: HealthState,
    pub weight: f64,
    pub ramp_ms: i64,
    pub score: f64,
    pub failure_rate: f64,
    pub since: Micros,
    pub reason: String,
    pub policy_version: i32,
}

impl EndpointState {
    /// The state an endpoint is in after a transition.
    /// An endpoint seen for the first time, before any transition: healthy at full weight.
    pub fn first_seen(pool: &str, endpoint: &str, stream_time: Micros, policy_version: i32) -> EndpointState {
        EndpointState {
            pool: pool.to_owned(),
            endpoint: endpoint.to_owned(),
            seq: 0,
            state: HealthState::Healthy,
            weight: 1.0,
            ramp_ms: 0,
            score: 100.0,
            failure_rate: 0.0,
            since: stream_time,
            reason: "first seen".into(),
            policy_version,
        }
    }

    pub fn from_change(c: &HealthChanged) -> EndpointState {
        EndpointState {
            pool: c.pool.clone(),
            endpoint: c.endpoint.clone(),
            seq: c.seq,
            state: c.to_state,
            weight: c.weight,
            ramp_ms: c.ramp_ms,
            score: c.evidence.score,
            failure_rate: c.evidence.failure_rate,
            since: c.stream_time,
            reason: c.reason.clone(),
            policy_version: c.policy_version,
        }
    }
}
