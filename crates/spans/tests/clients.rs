//! Failed client spans as real OpenTelemetry instrumentations write them (captured by the
//! scripts beside the fixtures, against a refusing port and a silent server on loopback): each
//! gets the outcome class of what happened, not "server error". Node's fetch puts a DOMException
//! code (23) in `error.type`, its http module `Error`; Go's otelhttp `*net.OpError`. (Go's transport
//! sees a client timeout as a cancelled request: a span cannot tell them apart.)

use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::span::{Event, SpanKind};
use opentelemetry_proto::tonic::trace::v1::{status::StatusCode, Span, Status};
use vitals_contracts::OutcomeClass;
use vitals_spans::Map;

fn value(v: &serde_json::Value) -> Option<Value> {
    match v {
        serde_json::Value::String(s) => Some(Value::StringValue(s.clone())),
        serde_json::Value::Number(n) if n.is_i64() => Some(Value::IntValue(n.as_i64()?)),
        serde_json::Value::Number(n) => Some(Value::DoubleValue(n.as_f64()?)),
        serde_json::Value::Bool(b) => Some(Value::BoolValue(*b)),
        _ => None,
    }
}

fn attributes(o: &serde_json::Value) -> Vec<KeyValue> {
    o.as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| KeyValue {
            key: k.clone(),
            key_strindex: 0,
            value: Some(AnyValue { value: value(v) }),
        })
        .collect()
}

/// The span of a fixture case: its name, attributes, status and events as captured; ids and
/// times made up (they do not decide the class).
fn span(s: &serde_json::Value) -> Span {
    Span {
        trace_id: vec![7; 16],
        span_id: vec![9; 8],
        name: s["name"].as_str().unwrap_or("GET").into(),
        kind: SpanKind::Client as i32,
        start_time_unix_nano: 1_700_000_000_000_000_000,
        end_time_unix_nano: 1_700_000_000_300_000_000,
        attributes: attributes(&s["attributes"]),
        status: Some(Status {
            code: if s["status"]["code"] == 2 {
                StatusCode::Error as i32
            } else {
                0
            },
            message: s["status"]["message"].as_str().unwrap_or("").into(),
        }),
        events: s["events"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| Event {
                name: e["name"].as_str().unwrap_or("").into(),
                attributes: attributes(&e["attributes"]),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn check(fixture: &str) {
    let text = std::fs::read_to_string(format!("{}/tests/fixtures/{fixture}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let f: serde_json::Value = serde_json::from_str(&text).unwrap();
    let resource = vec![KeyValue {
        key: "service.name".into(),
        key_strindex: 0,
        value: Some(AnyValue {
            value: Some(Value::StringValue("client".into())),
        }),
    }];
    let cases = f["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for c in cases {
        let got = Map::default().call(&span(&c["span"]), &resource).unwrap().outcome;
        let want = OutcomeClass::parse(c["want"].as_str().unwrap()).unwrap();
        assert_eq!(got, want, "{fixture}: {}", c["case"]);
    }
}

#[test]
fn node_fetch_and_http_failures_are_told_apart() {
    check("node20-client-spans.json");
}

#[test]
fn go_otelhttp_failures_are_told_apart() {
    check("go-otelhttp-client-spans.json");
}
