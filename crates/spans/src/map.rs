//! Which spans are upstream calls, and which pool, endpoint and gateway they are (`--map`, TOML).
//! Every key is optional; without a file the defaults below apply:
//!
//! ```toml
//! gateway = ["{resource:service.name}", "{reporter}", "otlp"]   # templates, the first that renders wins
//!
//! # Rules, tried in order: the first whose kinds, span names and attributes match makes the
//! # span a call. Giving any [[call]] replaces the two default rules:
//! [[call]]
//! name = "http-client"                            # for the receiver's metrics
//! kinds = ["client"]                              # client | server | internal | producer | consumer
//! span_names = []                                 # empty: any name
//! when_any = ["http.request.method", "http.method", "http.response.status_code",
//!             "http.status_code", "url.full", "http.url", "gen_ai.operation.name",
//!             "gen_ai.request.model", "rpc.system"]   # empty: no attribute needed
//! pool = ["{gen_ai.request.model}", "{peer.service}", "{resource:service.name}"]
//! endpoint = ["{server.address}:{server.port}", "{url.full|hostport}", "{http.url|hostport}",
//!             "{net.peer.name}:{net.peer.port}", "{server.address}", "{net.peer.name}"]
//!
//! [[call]]
//! name = "gateway-upstream"                       # a gateway's SERVER span naming its upstream
//! kinds = ["server"]
//! when_any = ["upstream_address", "upstream.address"]
//! pool = ["{upstream_cluster}", "{upstream.cluster}", "{http.route}", "{resource:service.name}"]
//! endpoint = ["{upstream_address}", "{upstream.address}"]
//!
//! [pools]              # rename: what the templates gave → the vitals pool
//! "gpt-4o" = "chat"
//! [endpoints]          # rename: what the templates gave → the vitals endpoint
//! "10.0.0.7:443" = "azure-west"
//! skip_pools = ["internal-health"]                # never reported
//!
//! [errors]             # error type fragment (case-insensitive) → outcome class, before the built-in rules
//! "BackendGone" = "connection_dropped"
//!
//! # The first token, where the span records it (none of LiteLLM 1.110.2's spans does):
//! ttft_seconds = ["gen_ai.server.time_to_first_token", "gen_ai.response.time_to_first_chunk"]
//! ttft_ms = ["ai.response.msToFirstChunk"]
//! ttft_events = ["gen_ai.first_token", "ai.stream.firstChunk", "first_token"]
//! ```
//!
//! Templates are described in [`crate::template`].

use crate::attrs::Attrs;
use crate::classify::{self, STATUS_KEYS};
use crate::template::{Subject, Template};
use crate::view::{self, wire, Attr, SpanView};
use crate::{Skip, Tally};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use vitals_contracts::validate::{MAX_ATTRIBUTE_VALUE_LEN, MAX_DURATION_US};
use vitals_contracts::{validate_name, CallOutcome, OutcomeClass};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    gateway: Option<Vec<String>>,
    #[serde(rename = "call")]
    calls: Option<Vec<RuleFile>>,
    #[serde(default)]
    pools: BTreeMap<String, String>,
    #[serde(default)]
    endpoints: BTreeMap<String, String>,
    #[serde(default)]
    skip_pools: Vec<String>,
    #[serde(default)]
    errors: BTreeMap<String, String>,
    ttft_seconds: Option<Vec<String>>,
    ttft_ms: Option<Vec<String>>,
    ttft_events: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    name: String,
    #[serde(default)]
    kinds: Vec<String>,
    #[serde(default)]
    span_names: Vec<String>,
    #[serde(default)]
    when_any: Vec<String>,
    pool: Vec<String>,
    endpoint: Vec<String>,
}

/// One rule: which spans are calls, and where their names come from.
#[derive(Debug, Clone)]
pub struct Rule {
    pub name: String,
    kinds: Vec<i32>,
    span_names: HashSet<String>,
    when_any: Vec<String>,
    pool: Vec<Template>,
    endpoint: Vec<Template>,
}

/// The table, checked.
#[derive(Debug, Clone)]
pub struct Map {
    gateway: Vec<Template>,
    pub rules: Vec<Rule>,
    pools: HashMap<String, String>,
    endpoints: HashMap<String, String>,
    skip_pools: HashSet<String>,
    errors: Vec<(String, OutcomeClass)>,
    ttft_seconds: Vec<String>,
    ttft_ms: Vec<String>,
    ttft_events: Vec<String>,
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

fn default_rules() -> Vec<RuleFile> {
    vec![
        RuleFile {
            name: "http-client".into(),
            kinds: strings(&["client"]),
            span_names: Vec::new(),
            when_any: strings(&[
                "http.request.method",
                "http.method",
                "http.response.status_code",
                "http.status_code",
                "url.full",
                "http.url",
                "gen_ai.operation.name",
                "gen_ai.request.model",
                "rpc.system",
            ]),
            pool: strings(&["{gen_ai.request.model}", "{peer.service}", "{resource:service.name}"]),
            endpoint: strings(&[
                "{server.address}:{server.port}",
                "{url.full|hostport}",
                "{http.url|hostport}",
                "{net.peer.name}:{net.peer.port}",
                "{server.address}",
                "{net.peer.name}",
            ]),
        },
        RuleFile {
            name: "gateway-upstream".into(),
            kinds: strings(&["server"]),
            span_names: Vec::new(),
            when_any: strings(&["upstream_address", "upstream.address"]),
            pool: strings(&[
                "{upstream_cluster}",
                "{upstream.cluster}",
                "{http.route}",
                "{resource:service.name}",
            ]),
            endpoint: strings(&["{upstream_address}", "{upstream.address}"]),
        },
    ]
}

fn kind(name: &str) -> Result<i32, String> {
    Ok(match name {
        "internal" => SpanKind::Internal,
        "server" => SpanKind::Server,
        "client" => SpanKind::Client,
        "producer" => SpanKind::Producer,
        "consumer" => SpanKind::Consumer,
        other => {
            return Err(format!(
                "unknown span kind {other:?} (client, server, internal, producer, consumer)"
            ))
        }
    } as i32)
}

fn templates(field: &str, v: &[String]) -> Result<Vec<Template>, String> {
    if v.is_empty() {
        return Err(format!("{field}: give at least one template"));
    }
    v.iter()
        .map(|t| Template::parse(t).map_err(|e| format!("{field}: {e}")))
        .collect()
}

impl Default for Map {
    fn default() -> Map {
        Map::parse("").expect("the default table is valid")
    }
}

impl Map {
    /// Parse and check the table; the error names the rule and the field.
    pub fn parse(text: &str) -> Result<Map, String> {
        let f: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut rules = Vec::new();
        let mut names = HashSet::new();
        for r in f.calls.unwrap_or_else(default_rules) {
            let at = |e: String| format!("call {:?}: {e}", r.name);
            validate_name("name", &r.name).map_err(|e| at(e.to_string()))?;
            if !names.insert(r.name.clone()) {
                return Err(at("listed twice".into()));
            }
            let kinds = if r.kinds.is_empty() {
                vec![SpanKind::Client as i32]
            } else {
                r.kinds.iter().map(|k| kind(k)).collect::<Result<_, _>>().map_err(at)?
            };
            rules.push(Rule {
                kinds,
                span_names: r.span_names.iter().cloned().collect(),
                when_any: r.when_any.clone(),
                pool: templates("pool", &r.pool).map_err(at)?,
                endpoint: templates("endpoint", &r.endpoint).map_err(at)?,
                name: r.name,
            });
        }
        let gateway = templates(
            "gateway",
            &f.gateway
                .unwrap_or_else(|| strings(&["{resource:service.name}", "{reporter}", "otlp"])),
        )?;
        for (from, to) in f.pools.iter().chain(&f.endpoints) {
            validate_name("pools/endpoints", to).map_err(|e| format!("renaming {from:?}: {e}"))?;
        }
        let mut errors = Vec::new();
        for (fragment, class) in f.errors {
            let c = OutcomeClass::parse(&class).ok_or_else(|| {
                let all: Vec<_> = OutcomeClass::ALL.iter().map(|c| c.as_str()).collect();
                format!(
                    "errors: {fragment:?} = {class:?} is not an outcome class ({})",
                    all.join(", ")
                )
            })?;
            if fragment.is_empty() {
                return Err("errors: an empty fragment would match every error".into());
            }
            errors.push((fragment.to_ascii_lowercase(), c));
        }
        Ok(Map {
            gateway,
            rules,
            pools: f.pools.into_iter().collect(),
            endpoints: f.endpoints.into_iter().collect(),
            skip_pools: f.skip_pools.into_iter().collect(),
            errors,
            ttft_seconds: f.ttft_seconds.unwrap_or_else(|| {
                strings(&[
                    "gen_ai.server.time_to_first_token",
                    "gen_ai.response.time_to_first_chunk",
                ])
            }),
            ttft_ms: f.ttft_ms.unwrap_or_else(|| strings(&["ai.response.msToFirstChunk"])),
            ttft_events: f
                .ttft_events
                .unwrap_or_else(|| strings(&["gen_ai.first_token", "ai.stream.firstChunk", "first_token"])),
        })
    }

    fn rule_for(&self, span: &SpanView<'_>, attrs: Attrs<'_, '_>) -> Option<&Rule> {
        self.rules.iter().find(|r| {
            r.kinds.contains(&span.kind)
                && (r.span_names.is_empty() || r.span_names.contains(span.name))
                && (r.when_any.is_empty() || r.when_any.iter().any(|k| attrs.has(k)))
        })
    }

    fn count(
        &self,
        span: &SpanView<'_>,
        resource: &[Attr<'_>],
        reporter: Option<&str>,
        out: &mut Vec<CallOutcome>,
        tally: &mut Tally,
    ) {
        tally.spans += 1;
        match self.call_view(span, Attrs(resource), reporter) {
            Ok(o) => {
                tally.calls += 1;
                out.push(o);
            }
            Err(Verdict::Skip(s)) => tally.skipped[s as usize] += 1,
            Err(Verdict::Reject(why)) => {
                tally.rejected += 1;
                tally.first_rejection.get_or_insert(why);
            }
        }
    }

    /// Every span of a decoded request (OTLP/JSON) into `out` (the calls' reports), each
    /// counted in `tally`.
    pub fn convert(&self, req: &ExportTraceServiceRequest, out: &mut Vec<CallOutcome>, tally: &mut Tally) {
        self.convert_as(req, None, out, tally)
    }

    /// [`Map::convert`] for a request from `reporter` (the `{reporter}` of the templates).
    pub fn convert_as(
        &self,
        req: &ExportTraceServiceRequest,
        reporter: Option<&str>,
        out: &mut Vec<CallOutcome>,
        tally: &mut Tally,
    ) {
        for rs in &req.resource_spans {
            let resource = view::attrs_of(rs.resource.as_ref().map_or(&[][..], |r| &r.attributes[..]));
            for ss in &rs.scope_spans {
                for span in &ss.spans {
                    self.count(&view::span_of(span), &resource, reporter, out, tally);
                }
            }
        }
    }

    /// Every span of a protobuf export request, read from the wire one at a time, into `out`,
    /// each counted in `tally`; an error if the request is not one (then `out` and `tally` hold
    /// what came before, to be dropped).
    pub fn convert_wire(&self, body: &[u8], out: &mut Vec<CallOutcome>, tally: &mut Tally) -> Result<(), String> {
        self.convert_wire_as(body, None, out, tally)
    }

    /// [`Map::convert_wire`] for a request from `reporter` (the `{reporter}` of the templates).
    pub fn convert_wire_as(
        &self,
        body: &[u8],
        reporter: Option<&str>,
        out: &mut Vec<CallOutcome>,
        tally: &mut Tally,
    ) -> Result<(), String> {
        let mut span = SpanView::default();
        wire::each(body, |field, v| {
            if field != 1 {
                return Ok(());
            }
            let rs = wire::message(v, "resource_spans")?;
            // The resource may come after the spans on the wire: read it first.
            let mut resource = Vec::new();
            wire::each(rs, |f, v| {
                if f == 1 {
                    resource = wire::resource(wire::message(v, "a resource")?)?;
                }
                Ok(())
            })?;
            wire::each(rs, |f, v| {
                match f {
                    2 => wire::each(wire::message(v, "scope_spans")?, |f, v| {
                        match f {
                            1 => wire::scope(wire::message(v, "a scope")?)?,
                            2 => {
                                wire::span(wire::message(v, "a span")?, &mut span)?;
                                self.count(&span, &resource, reporter, out, tally);
                            }
                            3 => {
                                wire::string(v, "a schema URL")?;
                            }
                            _ => {}
                        }
                        Ok(())
                    })?,
                    3 => {
                        wire::string(v, "a schema URL")?;
                    }
                    _ => {}
                }
                Ok(())
            })
        })
    }

    /// The report of one decoded span, or why there is none.
    pub fn call(&self, span: &Span, resource: &[KeyValue]) -> Result<CallOutcome, Verdict> {
        self.call_view(&view::span_of(span), Attrs(&view::attrs_of(resource)), None)
    }

    /// The report of one span, or why there is none.
    pub fn call_view(
        &self,
        span: &SpanView<'_>,
        resource: Attrs<'_, '_>,
        reporter: Option<&str>,
    ) -> Result<CallOutcome, Verdict> {
        let attrs = Attrs(&span.attrs);
        let rule = self.rule_for(span, attrs).ok_or(Verdict::Skip(Skip::NotACall))?;
        if span.trace_id.len() != 16 || span.trace_id.iter().all(|b| *b == 0) {
            return Err(Verdict::Reject("a span's trace_id is not 16 bytes, or all zero".into()));
        }
        if span.span_id.len() != 8 || span.span_id.iter().all(|b| *b == 0) {
            return Err(Verdict::Reject("a span's span_id is not 8 bytes, or all zero".into()));
        }
        let (start, end) = (span.start_time_unix_nano, span.end_time_unix_nano);
        if start == 0 || end < start {
            return Err(Verdict::Reject(
                "a span's start time is missing, or its end is before its start".into(),
            ));
        }
        let subject = Subject {
            span: attrs,
            resource,
            name: span.name,
            reporter,
        };
        let pool = rule
            .pool
            .iter()
            .find_map(|t| t.render(&subject))
            .ok_or(Verdict::Skip(Skip::NoPool))?;
        let pool = self.pools.get(&pool).cloned().unwrap_or(pool);
        if self.skip_pools.contains(&pool) {
            return Err(Verdict::Skip(Skip::PoolSkipped));
        }
        let endpoint = rule
            .endpoint
            .iter()
            .find_map(|t| t.render(&subject))
            .ok_or(Verdict::Skip(Skip::NoEndpoint))?;
        let endpoint = self.endpoints.get(&endpoint).cloned().unwrap_or(endpoint);
        let gateway = self
            .gateway
            .iter()
            .find_map(|t| t.render(&subject))
            .ok_or(Verdict::Skip(Skip::BadName))?;
        for (field, v) in [("pool", &pool), ("endpoint", &endpoint), ("gateway", &gateway)] {
            if !valid_name(field, v) {
                return Err(Verdict::Skip(Skip::BadName));
            }
        }
        let ended = classify::ended(span, attrs, &self.errors);
        let start_us =
            i64::try_from(start / 1000).map_err(|_| Verdict::Reject("a span's start time is out of range".into()))?;
        let latency_us = i64::try_from((end - start) / 1000)
            .unwrap_or(i64::MAX)
            .min(MAX_DURATION_US);
        let ttft_us = self.ttft_us(span, attrs).filter(|t| *t <= latency_us);
        let retry_after_ms = matches!(ended.class, OutcomeClass::RateLimited | OutcomeClass::ServerError)
            .then(|| {
                // When the limit lifts (the bridges' parser: Retry-After, else the exhausted
                // limit's x-ratelimit-reset-*), held to a day, the most the contract takes.
                vitals_contracts::limits::limit_lifts_in_ms(|name| attrs.text(&format!("http.response.header.{name}")))
                    .map(|ms| ms.min(86_400_000))
            })
            .flatten();
        let mut attributes = BTreeMap::new();
        attributes.insert("otel.span".to_owned(), bounded(span.name));
        attributes.insert("otel.rule".to_owned(), rule.name.clone());
        if let Some(e) = &ended.error {
            attributes.insert("error.type".to_owned(), bounded(e));
        }
        // Where the call was made from, for scoped health: the span's or its resource's
        // cloud region, or its zone without one (OpenTelemetry's semantic conventions).
        let location = ["cloud.region", "cloud.availability_zone"]
            .iter()
            .find_map(|k| attrs.text(k).or_else(|| resource.text(k)));
        if let Some(l) = location.filter(|l| !l.is_empty()) {
            attributes.insert(vitals_contracts::scope::LOCATION_ATTRIBUTE.to_owned(), bounded(&l));
        }
        if ended.http_status.is_none() {
            if let Some(code) = attrs.int(STATUS_KEYS[2]) {
                attributes.insert(STATUS_KEYS[2].to_owned(), code.to_string());
            }
        }
        let model = ["gen_ai.response.model", "gen_ai.request.model"]
            .iter()
            .find_map(|k| attrs.text(k))
            .filter(|m| valid_name("model", m))
            .map(|m| m.into_owned());
        Ok(CallOutcome {
            event_id: event_id(span.trace_id, span.span_id),
            pool,
            endpoint,
            gateway,
            occurred_at: start_us,
            outcome: ended.class,
            http_status: ended.http_status,
            latency_us,
            ttft_us,
            tpot_us: None,
            attributes,
            model,
            retry_after_ms,
        })
    }

    /// The first token's time after the span's start, from an attribute or an event.
    fn ttft_us(&self, span: &SpanView<'_>, attrs: Attrs<'_, '_>) -> Option<i64> {
        let us = |x: f64| (0.0..1e13).contains(&x).then_some(x as i64);
        self.ttft_seconds
            .iter()
            .find_map(|k| attrs.number(k).and_then(|s| us(s * 1e6)))
            .or_else(|| {
                self.ttft_ms
                    .iter()
                    .find_map(|k| attrs.number(k).and_then(|ms| us(ms * 1e3)))
            })
            .or_else(|| {
                span.events
                    .iter()
                    .filter(|e| self.ttft_events.iter().any(|n| n == e.name))
                    .find_map(|e| e.time_unix_nano.checked_sub(span.start_time_unix_nano))
                    .and_then(|ns| i64::try_from(ns / 1000).ok())
            })
    }
}

/// Why a span gave no report: skipped (not a call, or not vitals'), or rejected (malformed, as
/// OTLP's partial success counts it).
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Skip(Skip),
    Reject(String),
}

/// Whether vitals takes `v` as a name (the contract's rule).
fn valid_name(field: &'static str, v: &str) -> bool {
    validate_name(field, v).is_ok()
}

/// A stable id for a span: the same span exported twice (a retried export) gives the same id.
pub fn event_id(trace_id: &[u8], span_id: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 * (trace_id.len() + span_id.len()));
    for b in trace_id.iter().chain(span_id) {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 15)] as char);
    }
    s
}

/// Text cut to the contract's attribute value length, at a character boundary.
fn bounded(s: &str) -> String {
    if s.len() <= MAX_ATTRIBUTE_VALUE_LEN {
        return s.to_owned();
    }
    let mut end = MAX_ATTRIBUTE_VALUE_LEN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}
