//! Hand-written encoders for the three records the processor writes for every transition
//! (HealthChanged, EndpointState and PoolHealthChanged) and the four signals gateways, mergers
//! and probers write for nearly every record (CallOutcome, CallSummary, ProbeResult, Tick).
//! apache-avro's serde path cannot follow HealthChanged's reference to a named type defined
//! earlier in the schema (`to_state`), so it went through a generic `Value` tree and schema
//! resolution: a fifth of the processor's CPU in a 5 M-signal profile; a merged summary through
//! apache-avro cost the merger a schema resolution for every record it wrote. Writing the binary
//! encoding field by field in schema order gives the same bytes; a property test holds these
//! encoders byte-equal to the generic path.

use crate::types::*;

/// Avro binary encoding onto the end of a buffer.
pub(crate) struct Writer<'a>(pub(crate) &'a mut Vec<u8>);

impl Writer<'_> {
    /// Avro `long` (and `int`): zig-zag, then 7 bits a byte, low bits first.
    fn long(&mut self, v: i64) {
        let mut n = ((v << 1) ^ (v >> 63)) as u64;
        while n >= 0x80 {
            self.0.push((n as u8 & 0x7f) | 0x80);
            n >>= 7;
        }
        self.0.push(n as u8);
    }

    fn int(&mut self, v: i32) {
        self.long(i64::from(v));
    }

    fn double(&mut self, v: f64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn boolean(&mut self, v: bool) {
        self.0.push(u8::from(v));
    }

    fn string(&mut self, s: &str) {
        self.long(s.len() as i64);
        self.0.extend_from_slice(s.as_bytes());
    }

    /// An enum symbol by its index in the schema (the declaration order of the Rust enum).
    fn state(&mut self, s: HealthState) {
        self.long(s as i64);
    }

    fn outcome(&mut self, o: OutcomeClass) {
        self.long(o as i64);
    }

    /// An array: one block of `items`, each written by `write`, then the empty block that ends
    /// it (what apache-avro writes).
    fn array<T>(&mut self, items: &[T], mut write: impl FnMut(&mut Self, &T)) {
        if !items.is_empty() {
            self.long(items.len() as i64);
            items.iter().for_each(|i| write(self, i));
        }
        self.long(0);
    }

    /// `["null", T]`.
    fn optional<T>(&mut self, v: Option<T>, write: impl FnOnce(&mut Self, T)) {
        match v {
            None => self.long(0),
            Some(v) => {
                self.long(1);
                write(self, v);
            }
        }
    }

    /// An array of strings: one block, then the empty block that ends it.
    fn strings(&mut self, items: &[String]) {
        self.array(items, |w, s| w.string(s));
    }
}

pub(crate) fn health_changed(w: &mut Writer<'_>, v: &HealthChanged, previous: bool) {
    w.string(&v.transition_id);
    w.string(&v.pool);
    w.string(&v.endpoint);
    w.long(v.seq);
    w.state(v.from_state);
    w.state(v.to_state);
    w.double(v.weight);
    w.long(v.ramp_ms);
    w.optional(v.retry_at, Writer::long);
    w.string(&v.reason_code);
    w.string(&v.reason);
    evidence(w, &v.evidence);
    w.int(v.policy_version);
    w.strings(&v.trigger_ids);
    w.long(v.stream_time);
    if previous {
        return;
    }
    match &v.scope {
        None => w.long(0),
        Some(s) => {
            w.long(1);
            w.string(s);
        }
    }
}

fn evidence(w: &mut Writer<'_>, e: &Evidence) {
    for n in [
        e.window_ms,
        e.success,
        e.timeout,
        e.connect_error,
        e.connection_dropped,
        e.rate_limited,
        e.server_error,
        e.client_error,
        e.invalid_response,
        e.cancelled,
    ] {
        w.long(n);
    }
    w.double(e.failure_rate);
    w.double(e.score);
    for d in [
        e.ttft_p50_ms,
        e.ttft_p99_ms,
        e.latency_ewma_ms,
        e.pool_latency_median_ms,
    ] {
        w.optional(d, Writer::double);
    }
    for n in [
        e.consecutive_failures,
        e.consecutive_successes,
        e.consecutive_hard_failures,
        e.isolations,
    ] {
        w.int(n);
    }
    w.strings(&e.thresholds);
}

pub(crate) fn endpoint_state(w: &mut Writer<'_>, v: &EndpointState, _previous: bool) {
    w.string(&v.pool);
    w.string(&v.endpoint);
    w.long(v.seq);
    w.state(v.state);
    w.double(v.weight);
    w.long(v.ramp_ms);
    w.double(v.score);
    w.double(v.failure_rate);
    w.long(v.since);
    w.string(&v.reason);
    w.int(v.policy_version);
}

pub(crate) fn pool_health_changed(w: &mut Writer<'_>, v: &PoolHealthChanged, previous: bool) {
    w.string(&v.pool);
    w.long(v.seq);
    w.int(v.endpoints);
    w.int(v.healthy);
    w.int(v.ejected);
    w.double(v.healthy_fraction);
    w.boolean(v.panic);
    w.boolean(v.correlated_outage);
    w.string(&v.reason);
    w.int(v.policy_version);
    w.long(v.stream_time);
    if !previous {
        w.strings(&v.faulty_reporters);
    }
}

pub(crate) fn call_outcome(w: &mut Writer<'_>, v: &CallOutcome, _previous: bool) {
    w.string(&v.event_id);
    w.string(&v.pool);
    w.string(&v.endpoint);
    w.string(&v.gateway);
    w.long(v.occurred_at);
    w.outcome(v.outcome);
    w.optional(v.http_status, Writer::int);
    w.long(v.latency_us);
    w.optional(v.ttft_us, Writer::long);
    w.optional(v.tpot_us, Writer::long);
    // A map: one block of key, value pairs in the map's order, then the empty block.
    if !v.attributes.is_empty() {
        w.long(v.attributes.len() as i64);
        for (k, val) in &v.attributes {
            w.string(k);
            w.string(val);
        }
    }
    w.long(0);
    w.optional(v.model.as_deref(), Writer::string);
    w.optional(v.retry_after_ms, Writer::long);
}

fn histogram(w: &mut Writer<'_>, h: &Histogram) {
    w.long(h.sum_us);
    w.array(&h.buckets, |w, b| {
        w.int(b.index);
        w.long(b.count);
    });
}

/// `previous`: version 1, before merged summaries listed their reporters.
pub(crate) fn call_summary(w: &mut Writer<'_>, v: &CallSummary, previous: bool) {
    w.string(&v.summary_id);
    w.string(&v.pool);
    w.string(&v.endpoint);
    w.string(&v.gateway);
    w.long(v.started_at);
    w.long(v.ended_at);
    let c = &v.calls;
    for n in [
        c.success,
        c.timeout,
        c.connect_error,
        c.connection_dropped,
        c.rate_limited,
        c.server_error,
        c.client_error,
        c.invalid_response,
        c.cancelled,
    ] {
        w.long(n);
    }
    histogram(w, &v.latency);
    histogram(w, &v.ttft);
    for n in [
        v.leading_failures,
        v.longest_failure_run,
        v.trailing_failures,
        v.trailing_successes,
        v.longest_hard_run,
        v.trailing_hard,
        v.trailing_rate_limited,
    ] {
        w.int(n);
    }
    w.optional(v.max_retry_after_ms, Writer::long);
    w.strings(&v.models);
    if previous {
        return;
    }
    w.optional(v.reporters.as_deref(), |w, reporters| {
        w.array(reporters, |w, r| {
            w.strings(&r.scopes);
            w.long(r.calls);
            w.long(r.failures);
            w.long(r.trailing_failures);
        });
    });
}

pub(crate) fn probe_result(w: &mut Writer<'_>, v: &ProbeResult, _previous: bool) {
    w.string(&v.probe_id);
    w.string(&v.pool);
    w.string(&v.endpoint);
    w.string(&v.prober);
    w.long(v.occurred_at);
    w.long(v.kind as i64);
    w.outcome(v.outcome);
    w.long(v.latency_us);
    w.optional(v.ttft_us, Writer::long);
    w.optional(v.http_status, Writer::int);
    w.optional(v.interval_ms, Writer::long);
    w.array(&v.dependencies, |w, d| {
        w.string(&d.name);
        w.boolean(d.critical);
        w.long(d.status as i64);
    });
    w.string(&v.detail);
}

pub(crate) fn tick(w: &mut Writer<'_>, v: &Tick, _previous: bool) {
    w.string(&v.ticker);
    w.long(v.emitted_at);
}
