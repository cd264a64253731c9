//! The table's conversion, span by span.

use crate::{Map, Skip, Tally, Verdict};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, ArrayValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::{Event, SpanKind};
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use vitals_contracts::OutcomeClass;

fn s(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        key_strindex: 0,
        value: Some(AnyValue {
            value: Some(Value::StringValue(v.into())),
        }),
    }
}

fn i(k: &str, v: i64) -> KeyValue {
    KeyValue {
        key: k.into(),
        key_strindex: 0,
        value: Some(AnyValue {
            value: Some(Value::IntValue(v)),
        }),
    }
}

const T0: u64 = 1_700_000_000_000_000_000;

fn client(attrs: Vec<KeyValue>) -> Span {
    Span {
        trace_id: vec![7; 16],
        span_id: vec![9; 8],
        name: "POST".into(),
        kind: SpanKind::Client as i32,
        start_time_unix_nano: T0,
        end_time_unix_nano: T0 + 250_000_000,
        attributes: attrs,
        ..Default::default()
    }
}

fn failed(mut sp: Span, message: &str) -> Span {
    sp.status = Some(Status {
        code: StatusCode::Error as i32,
        message: message.into(),
    });
    sp
}

fn resource() -> Vec<KeyValue> {
    vec![s("service.name", "checkout")]
}

fn call(m: &Map, sp: &Span) -> Result<vitals_contracts::CallOutcome, Verdict> {
    m.call(sp, &resource())
}

fn addr(host: &str, port: i64) -> Vec<KeyValue> {
    vec![
        s("http.request.method", "POST"),
        s("server.address", host),
        i("server.port", port),
    ]
}

#[test]
fn an_http_client_span_is_a_call_of_its_server_by_the_default_table() {
    let m = Map::default();
    let mut a = addr("api.a", 443);
    a.push(i("http.response.status_code", 200));
    let o = call(&m, &client(a)).unwrap();
    assert_eq!(
        (o.pool.as_str(), o.endpoint.as_str(), o.gateway.as_str()),
        ("checkout", "api.a:443", "checkout")
    );
    assert_eq!(o.outcome, OutcomeClass::Success);
    assert_eq!(o.http_status, Some(200));
    assert_eq!(o.latency_us, 250_000);
    assert_eq!(o.occurred_at, (T0 / 1000) as i64);
    assert_eq!(o.event_id, format!("{}{}", "07".repeat(16), "09".repeat(8)));
    assert_eq!(o.attributes["otel.rule"], "http-client");
    assert!(vitals_contracts::encode(&o).is_ok());
}

#[test]
fn the_cloud_region_or_zone_is_the_calls_location() {
    let m = Map::default();
    let o = call(&m, &client(addr("api.a", 443))).unwrap();
    assert!(
        !o.attributes.contains_key("location"),
        "no cloud attributes: no location"
    );
    let zoned = m
        .call(
            &client(addr("api.a", 443)),
            &[
                s("service.name", "checkout"),
                s("cloud.availability_zone", "eu-west-1a"),
            ],
        )
        .unwrap();
    assert_eq!(zoned.attributes["location"], "eu-west-1a");
    let both = m
        .call(
            &client(addr("api.a", 443)),
            &[
                s("service.name", "checkout"),
                s("cloud.region", "eu-west-1"),
                s("cloud.availability_zone", "eu-west-1a"),
            ],
        )
        .unwrap();
    assert_eq!(both.attributes["location"], "eu-west-1", "the region when there is one");
    assert_eq!(vitals_contracts::scope::of_call(&both)[1], "location=eu-west-1");
}

#[test]
fn outcome_classes_follow_status_codes_then_error_types_then_the_span_status() {
    let m = Map::default();
    let with = |extra: Vec<KeyValue>| {
        let mut a = addr("h", 80);
        a.extend(extra);
        client(a)
    };
    let class = |sp: Span| call(&m, &sp).unwrap().outcome;
    assert_eq!(
        class(with(vec![i("http.response.status_code", 503)])),
        OutcomeClass::ServerError
    );
    assert_eq!(
        class(with(vec![s("http.status_code", "429")])),
        OutcomeClass::RateLimited
    );
    assert_eq!(
        class(with(vec![i("http.response.status_code", 404)])),
        OutcomeClass::ClientError
    );
    // No answer: the error's type says what happened.
    assert_eq!(
        class(failed(with(vec![s("error.type", "httpx.ConnectError")]), "")),
        OutcomeClass::ConnectError
    );
    assert_eq!(
        class(failed(with(vec![s("error.type", "httpx.ReadTimeout")]), "")),
        OutcomeClass::Timeout
    );
    // The exception event's type when there is no error.type.
    let mut sp = failed(with(vec![]), "");
    sp.events.push(Event {
        name: "exception".into(),
        attributes: vec![s("exception.type", "ConnectionResetError")],
        ..Default::default()
    });
    assert_eq!(class(sp), OutcomeClass::ConnectionDropped);
    // Failed with nothing said: a server error. Not failed, no code: a success.
    assert_eq!(class(failed(with(vec![]), "")), OutcomeClass::ServerError);
    assert_eq!(class(with(vec![])), OutcomeClass::Success);
    // A 200 whose body then broke: the span's error decides.
    assert_eq!(
        class(failed(
            with(vec![
                i("http.response.status_code", 200),
                s("error.type", "httpx.RemoteProtocolError")
            ]),
            ""
        )),
        OutcomeClass::ConnectionDropped
    );
}

#[test]
fn a_429_carries_its_retry_after_and_first_tokens_come_from_events_or_attributes() {
    let m = Map::default();
    let mut a = addr("h", 80);
    a.push(i("http.response.status_code", 429));
    a.push(KeyValue {
        key: "http.response.header.retry-after".into(),
        key_strindex: 0,
        value: Some(AnyValue {
            value: Some(Value::ArrayValue(ArrayValue {
                values: vec![AnyValue {
                    value: Some(Value::StringValue("7".into())),
                }],
            })),
        }),
    });
    let o = call(&m, &client(a)).unwrap();
    assert_eq!((o.outcome, o.retry_after_ms), (OutcomeClass::RateLimited, Some(7000)));

    // Without a Retry-After, the reset of the limit that ran out (OpenAI's headers).
    let header = |name: &str, v: &str| KeyValue {
        key: format!("http.response.header.{name}"),
        key_strindex: 0,
        value: Some(AnyValue {
            value: Some(Value::ArrayValue(ArrayValue {
                values: vec![AnyValue {
                    value: Some(Value::StringValue(v.into())),
                }],
            })),
        }),
    };
    let mut a = addr("h", 80);
    a.push(i("http.response.status_code", 429));
    a.push(header("x-ratelimit-remaining-requests", "0"));
    a.push(header("x-ratelimit-reset-requests", "1.5s"));
    a.push(header("x-ratelimit-reset-tokens", "6m0s"));
    let o = call(&m, &client(a)).unwrap();
    assert_eq!(o.retry_after_ms, Some(1500));
    // retry-after-ms first (OpenAI's and Azure's exact delay).
    let mut a = addr("h", 80);
    a.push(i("http.response.status_code", 429));
    a.push(header("retry-after-ms", "250"));
    a.push(header("retry-after", "1"));
    assert_eq!(call(&m, &client(a)).unwrap().retry_after_ms, Some(250));

    let mut sp = client(addr("h", 80));
    sp.events.push(Event {
        name: "gen_ai.first_token".into(),
        time_unix_nano: T0 + 40_000_000,
        ..Default::default()
    });
    assert_eq!(call(&m, &sp).unwrap().ttft_us, Some(40_000));
    let mut a = addr("h", 80);
    a.push(KeyValue {
        key: "gen_ai.server.time_to_first_token".into(),
        key_strindex: 0,
        value: Some(AnyValue {
            value: Some(Value::DoubleValue(0.12)),
        }),
    });
    assert_eq!(call(&m, &client(a)).unwrap().ttft_us, Some(120_000));
}

#[test]
fn spans_that_are_not_calls_are_skipped_and_malformed_ones_rejected() {
    let m = Map::default();
    let mut server = client(addr("h", 80));
    server.kind = SpanKind::Server as i32;
    assert_eq!(call(&m, &server), Err(Verdict::Skip(Skip::NotACall)));
    let db = client(vec![s("db.system", "postgresql")]);
    assert_eq!(call(&m, &db), Err(Verdict::Skip(Skip::NotACall)));
    let no_endpoint = client(vec![s("http.request.method", "GET")]);
    assert_eq!(call(&m, &no_endpoint), Err(Verdict::Skip(Skip::NoEndpoint)));
    let long = client(addr(&"x".repeat(1 << 20), 80));
    assert_eq!(call(&m, &long), Err(Verdict::Skip(Skip::BadName)));
    let mut bad_id = client(addr("h", 80));
    bad_id.trace_id = vec![0; 16];
    assert!(matches!(call(&m, &bad_id), Err(Verdict::Reject(_))));
    let mut backwards = client(addr("h", 80));
    backwards.end_time_unix_nano = T0 - 1;
    assert!(matches!(call(&m, &backwards), Err(Verdict::Reject(_))));

    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: resource(),
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: vec![client(addr("h", 80)), server, bad_id, db],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let (mut out, mut t) = (Vec::new(), Tally::default());
    m.convert(&req, &mut out, &mut t);
    assert_eq!((t.spans, t.calls, t.rejected, out.len()), (4, 1, 1, 1));
    assert_eq!(t.skipped[Skip::NotACall as usize], 2);
    assert!(t.first_rejection.unwrap().contains("trace_id"));
}

const LITELLM: &str = r#"
gateway = ["litellm-otel"]
[[call]]
name = "litellm"
kinds = ["internal", "client"]
span_names = ["litellm_request"]
pool = ["{litellm.model_group}"]
endpoint = ["{hidden_params#model_id}", "{hidden_params#api_base|hostport}"]
[pools]
"llm" = "chat"
[errors]
"BackendGone" = "connection_dropped"
"#;

#[test]
fn a_table_names_pools_and_endpoints_from_any_attribute() {
    let m = Map::parse(LITELLM).unwrap();
    let mut sp = client(vec![
        s("litellm.model_group", "llm"),
        s(
            "hidden_params",
            r#"{"model_id": "e2", "api_base": "http://127.0.0.1:9/v1"}"#,
        ),
        s("error.type", "BackendGone"),
        s("gen_ai.request.model", "sim"),
    ]);
    sp.kind = SpanKind::Internal as i32;
    sp.name = "litellm_request".into();
    let sp = failed(sp, "boom");
    let o = call(&m, &sp).unwrap();
    assert_eq!(
        (o.pool.as_str(), o.endpoint.as_str(), o.gateway.as_str()),
        ("chat", "e2", "litellm-otel")
    );
    assert_eq!(o.outcome, OutcomeClass::ConnectionDropped);
    assert_eq!(o.model.as_deref(), Some("sim"));
    let mut other = sp.clone();
    other.name = "raw_gen_ai_request".into();
    assert_eq!(call(&m, &other), Err(Verdict::Skip(Skip::NotACall)));
}

#[test]
fn a_bad_table_names_the_rule_and_the_field() {
    for (t, says) in [
        ("[[call]]\nname = \"a\"\npool = []\nendpoint = [\"x\"]\n", "pool"),
        (
            "[[call]]\nname = \"a\"\npool = [\"{x\"]\nendpoint = [\"x\"]\n",
            "call \"a\"",
        ),
        (
            "[[call]]\nname = \"a\"\nkinds = [\"sever\"]\npool = [\"p\"]\nendpoint = [\"x\"]\n",
            "sever",
        ),
        ("[errors]\nx = \"broken\"\n", "outcome class"),
        ("[pools]\nx = \"\"\n", "renaming"),
        ("weight = 3\n", "weight"),
    ] {
        let e = Map::parse(t).unwrap_err();
        assert!(e.contains(says), "{t:?}: {e}");
    }
}

#[test]
fn the_shipped_example_table_parses_and_maps_each_gateway() {
    let m = Map::parse(include_str!("../../../deploy/otlp/map.toml")).unwrap();
    let names: Vec<&str> = m.rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["http-client", "envoy", "litellm", "kong", "apisix", "nginx"]);
    let mut envoy = client(vec![
        s("upstream_cluster.name", "chat"),
        s("upstream_address", "10.0.0.7:443"),
        s("http.status_code", "503"),
    ]);
    envoy.kind = SpanKind::Server as i32;
    let o = call(&m, &envoy).unwrap();
    assert_eq!(
        (o.pool.as_str(), o.endpoint.as_str(), o.outcome),
        ("chat", "10.0.0.7:443", OutcomeClass::ServerError)
    );
}

#[test]
fn a_resource_that_names_no_service_is_reported_as_the_token_that_sent_it() {
    let m = Map::default();
    let gateway = |service: Option<&str>, reporter: Option<&str>| {
        let req = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: service.map(|n| vec![s("service.name", n)]).unwrap_or_default(),
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    // The pool from the span (the default table's second choice).
                    spans: vec![client([addr("api.a", 443), vec![s("peer.service", "pay")]].concat())],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let (mut out, mut t) = (Vec::new(), Tally::default());
        m.convert_as(&req, reporter, &mut out, &mut t);
        let mut wired = Vec::new();
        m.convert_wire_as(
            &prost::Message::encode_to_vec(&req),
            reporter,
            &mut wired,
            &mut Tally::default(),
        )
        .unwrap();
        assert_eq!(out, wired, "both readings agree");
        out.pop().map(|o| o.gateway)
    };
    assert_eq!(gateway(Some("checkout"), Some("edge-eu")).as_deref(), Some("checkout"));
    assert_eq!(gateway(None, Some("edge-eu")).as_deref(), Some("edge-eu"));
    for sdk_default in ["unknown_service", "unknown_service:node", "unknown_service:java"] {
        assert_eq!(
            gateway(Some(sdk_default), Some("edge-eu")).as_deref(),
            Some("edge-eu"),
            "{sdk_default}"
        );
    }
    assert_eq!(gateway(Some("unknown_service:node"), None).as_deref(), Some("otlp"));
    assert_eq!(gateway(None, None).as_deref(), Some("otlp"));
}

/// The shapes of failed client spans from stacks whose `error.type` says nothing a rule knows
/// (as Node's fetch and http instrumentations and Go's otelhttp write them): the exception's
/// type, its message or the status message decides, not "server error".
#[test]
fn a_generic_error_type_gives_way_to_the_exception_and_the_status_message() {
    let m = Map::default();
    let span = |error_type: &str, exception: &[(&str, &str)], status: &str| {
        let mut a = addr("h", 80);
        a.push(s("error.type", error_type));
        let mut sp = failed(client(a), status);
        if !exception.is_empty() {
            sp.events.push(Event {
                name: "exception".into(),
                attributes: exception.iter().map(|(k, v)| s(k, v)).collect(),
                ..Default::default()
            });
        }
        call(&m, &sp).unwrap()
    };
    // Node fetch (undici) timing out: a DOMException code in error.type.
    let o = span(
        "23",
        &[
            ("exception.type", "TimeoutError"),
            ("exception.message", "The operation was aborted due to timeout"),
        ],
        "The operation was aborted due to timeout",
    );
    assert_eq!(o.outcome, OutcomeClass::Timeout);
    assert_eq!(
        o.attributes.get("error.type").map(String::as_str),
        Some("23"),
        "reported as the span named it"
    );
    // Node http refused.
    let o = span(
        "Error",
        &[
            ("exception.type", "Error"),
            ("exception.message", "connect ECONNREFUSED 127.0.0.1:9"),
        ],
        "connect ECONNREFUSED 127.0.0.1:9",
    );
    assert_eq!(o.outcome, OutcomeClass::ConnectError);
    // Go otelhttp refused, and timed out: the message only in the status.
    let o = span(
        "*net.OpError",
        &[],
        "Post \"http://127.0.0.1:9/v1\": dial tcp 127.0.0.1:9: connect: connection refused",
    );
    assert_eq!(o.outcome, OutcomeClass::ConnectError);
    let o = span(
        "*url.Error",
        &[],
        "Post \"http://h/v1\": context deadline exceeded (Client.Timeout exceeded)",
    );
    assert_eq!(o.outcome, OutcomeClass::Timeout);
    // Nothing any rule knows: still a server error.
    assert_eq!(
        span("Error", &[("exception.message", "boom")], "boom").outcome,
        OutcomeClass::ServerError
    );
}
