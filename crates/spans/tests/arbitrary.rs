//! Generative tests of what reads network input: any bytes as a protobuf, JSON or gzip body
//! are a request or a refusal, never a panic; any span is a report that the contract accepts,
//! or a counted skip or rejection; the wire count of spans equals the decoded count.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, ArrayValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::span::Event;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use proptest::prelude::*;
use prost::Message as _;
use vitals_spans::decode::{self, Format, Limits};
use vitals_spans::{Map, Tally};

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        ".{0,40}".prop_map(Value::StringValue),
        any::<i64>().prop_map(Value::IntValue),
        (100i64..600).prop_map(Value::IntValue),
        any::<f64>().prop_map(Value::DoubleValue),
        any::<bool>().prop_map(Value::BoolValue),
        prop::collection::vec("[0-9]{0,3}", 0..3).prop_map(|v| Value::ArrayValue(ArrayValue {
            values: v
                .into_iter()
                .map(|s| AnyValue {
                    value: Some(Value::StringValue(s)),
                })
                .collect(),
        })),
        prop_oneof![
            Just("http://h:1/x".to_owned()),
            Just("https://[::1]/".to_owned()),
            Just("{\"model_id\": 3}".to_owned())
        ]
        .prop_map(Value::StringValue),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("http.request.method".to_owned()),
        Just("http.response.status_code".to_owned()),
        Just("http.status_code".to_owned()),
        Just("server.address".to_owned()),
        Just("server.port".to_owned()),
        Just("url.full".to_owned()),
        Just("error.type".to_owned()),
        Just("gen_ai.request.model".to_owned()),
        Just("gen_ai.server.time_to_first_token".to_owned()),
        Just("http.response.header.retry-after".to_owned()),
        Just("upstream_address".to_owned()),
        Just("http.response.header.retry-after".to_owned()),
        ".{0,12}",
    ]
}

fn span() -> impl Strategy<Value = Span> {
    (
        prop::collection::vec(any::<u8>(), 0..18),
        prop::collection::vec(any::<u8>(), 0..10),
        0i32..7,
        any::<u64>(),
        0u64..10_000_000_000_000,
        prop::collection::vec((key(), value()), 0..8),
        0i32..4,
        ".{0,20}",
        prop::option::of(("(exception|gen_ai.first_token)", ".{0,12}", 0u64..1_000_000_000)),
    )
        .prop_map(|(trace_id, span_id, kind, start, len, attrs, code, msg, event)| Span {
            trace_id,
            span_id,
            kind,
            name: "s".into(),
            start_time_unix_nano: start,
            end_time_unix_nano: start.saturating_add(len),
            attributes: attrs
                .into_iter()
                .map(|(k, v)| KeyValue {
                    key: k,
                    key_strindex: 0,
                    value: Some(AnyValue { value: Some(v) }),
                })
                .collect(),
            status: Some(Status { code, message: msg }),
            events: event
                .into_iter()
                .map(|(name, ty, at)| Event {
                    name,
                    time_unix_nano: start.saturating_add(at),
                    attributes: vec![KeyValue {
                        key: "exception.type".into(),
                        key_strindex: 0,
                        value: Some(AnyValue {
                            value: Some(Value::StringValue(ty)),
                        }),
                    }],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
}

fn request() -> impl Strategy<Value = ExportTraceServiceRequest> {
    prop::collection::vec(prop::collection::vec(span(), 0..6), 0..4).prop_map(|groups| ExportTraceServiceRequest {
        resource_spans: groups
            .into_iter()
            .map(|spans| ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect(),
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_bytes_are_a_request_or_a_refusal(body in prop::collection::vec(any::<u8>(), 0..512)) {
        let l = Limits::default();
        let _ = decode::request(Format::Protobuf, &body, &l);
        let _ = decode::request(Format::Json, &body, &l);
        // The wire reader takes any bytes too: a request, or an error.
        let (mut out, mut t) = (Vec::new(), Tally::default());
        let _ = Map::default().convert_wire(&body, &mut out, &mut t);
        let _ = decode::gunzip(&body, 1 << 20);
    }

    #[test]
    fn every_span_is_a_valid_report_or_counted(req in request()) {
        let m = Map::default();
        let (mut out, mut t) = (Vec::new(), Tally::default());
        m.convert(&req, &mut out, &mut t);
        prop_assert_eq!(t.spans as usize, decode::span_count(&req));
        prop_assert_eq!(t.calls + t.rejected + t.skipped.iter().sum::<u64>(), t.spans);
        prop_assert_eq!(out.len() as u64, t.calls);
        for o in &out {
            let rec = vitals_contracts::Signal::Call(o.clone());
            prop_assert!(vitals_contracts::validate_signal(&rec, None).is_ok(), "{:?} {:?}", vitals_contracts::validate_signal(&rec, None), o);
            prop_assert!(vitals_contracts::encode(o).is_ok());
        }
        let bytes = req.encode_to_vec();
        prop_assert_eq!(decode::count_spans(&bytes).unwrap(), decode::span_count(&req));
        // Read off the wire span by span, the request gives what prost's decoding gives.
        let (mut wired, mut wt) = (Vec::new(), Tally::default());
        m.convert_wire(&bytes, &mut wired, &mut wt).unwrap();
        prop_assert_eq!(&wired, &out);
        prop_assert_eq!(&wt, &t);
        let back = decode::request(Format::Protobuf, &bytes, &Limits::default()).unwrap();
        prop_assert_eq!(&back, &req);
    }
}
