//! OTLP trace export bodies into requests, with limits checked before anything large is
//! allocated: the body (after gzip) at most `max_body` bytes, at most `max_spans` spans
//! (counted on the protobuf wire before decoding), and for JSON at most `max_json_objects`
//! objects (counted in one pass before parsing), so that a small body of empty spans or empty
//! attributes cannot make the receiver build a huge request in memory.

use crate::view::wire;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;
use std::io::Read as _;

/// How a body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Protobuf,
    Json,
}

/// What a receiver accepts in one request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes of the body, after decompression.
    pub max_body: usize,
    /// Spans in one request.
    pub max_spans: usize,
    /// JSON objects in one request (spans, attributes, values, events...).
    pub max_json_objects: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_body: 8 << 20,
            max_spans: 50_000,
            max_json_objects: 1_000_000,
        }
    }
}

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Over a limit (HTTP 413, gRPC RESOURCE_EXHAUSTED without retry).
    TooLarge(String),
    /// Not an export request in its format (HTTP 400, gRPC INVALID_ARGUMENT).
    Malformed(String),
}

impl Refused {
    pub fn message(&self) -> &str {
        match self {
            Refused::TooLarge(m) | Refused::Malformed(m) => m,
        }
    }
    /// For the receiver's metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::TooLarge(_) => "too_large",
            Refused::Malformed(_) => "malformed",
        }
    }
}

/// A gzip body, decompressed, refusing to grow past `max` bytes.
pub fn gunzip(body: &[u8], max: usize) -> Result<Vec<u8>, Refused> {
    let mut out = Vec::with_capacity(body.len().saturating_mul(4).min(max));
    let mut d = flate2::read::GzDecoder::new(body).take(max as u64 + 1);
    d.read_to_end(&mut out)
        .map_err(|e| Refused::Malformed(format!("not gzip: {e}")))?;
    if out.len() > max {
        return Err(Refused::TooLarge(format!("more than {max} bytes once decompressed")));
    }
    Ok(out)
}

/// A protobuf export request's size and span count within the limits (checked on the wire,
/// before anything is read out of it: what `Map::convert_wire` then reads).
pub fn protobuf_within(body: &[u8], limits: &Limits) -> Result<(), Refused> {
    if body.len() > limits.max_body {
        return Err(Refused::TooLarge(format!(
            "a body of {} bytes; at most {}",
            body.len(),
            limits.max_body
        )));
    }
    let spans =
        count_spans(body).map_err(|e| Refused::Malformed(format!("not an OTLP protobuf export request: {e}")))?;
    too_many(spans, limits)
}

/// Decode an export request (all of it, with prost or serde: OTLP/JSON's way in).
pub fn request(format: Format, body: &[u8], limits: &Limits) -> Result<ExportTraceServiceRequest, Refused> {
    if body.len() > limits.max_body {
        return Err(Refused::TooLarge(format!(
            "a body of {} bytes; at most {}",
            body.len(),
            limits.max_body
        )));
    }
    match format {
        Format::Protobuf => {
            let spans = count_spans(body)
                .map_err(|e| Refused::Malformed(format!("not an OTLP protobuf export request: {e}")))?;
            too_many(spans, limits)?;
            ExportTraceServiceRequest::decode(body)
                .map_err(|e| Refused::Malformed(format!("not an OTLP protobuf export request: {e}")))
        }
        Format::Json => {
            let objects = count_json_objects(body);
            if objects > limits.max_json_objects {
                return Err(Refused::TooLarge(format!(
                    "{objects} JSON objects in one request; at most {}: send smaller batches",
                    limits.max_json_objects
                )));
            }
            let req: ExportTraceServiceRequest = serde_json::from_slice(body)
                .map_err(|e| Refused::Malformed(format!("not an OTLP JSON export request: {e}")))?;
            too_many(span_count(&req), limits)?;
            Ok(req)
        }
    }
}

fn too_many(spans: usize, limits: &Limits) -> Result<(), Refused> {
    if spans > limits.max_spans {
        return Err(Refused::TooLarge(format!(
            "{spans} spans in one request; at most {}: send smaller batches",
            limits.max_spans
        )));
    }
    Ok(())
}

pub fn span_count(req: &ExportTraceServiceRequest) -> usize {
    req.resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .map(|s| s.spans.len())
        .sum()
}

/// Objects in a JSON text: `{` outside strings (an upper bound of what parsing allocates).
fn count_json_objects(body: &[u8]) -> usize {
    let (mut n, mut in_str, mut esc) = (0, false, false);
    for &b in body {
        if in_str {
            match (esc, b) {
                (true, _) => esc = false,
                (false, b'\\') => esc = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
        } else if b == b'"' {
            in_str = true;
        } else if b == b'{' {
            n += 1;
        }
    }
    n
}

/// The spans of a protobuf export request, counted on the wire: request field 1
/// (ResourceSpans) → field 2 (ScopeSpans) → field 2 (Span).
pub fn count_spans(body: &[u8]) -> Result<usize, String> {
    let mut n = 0;
    wire::each(body, |f, v| {
        if f == 1 {
            wire::each(wire::message(v, "resource_spans")?, |f, v| {
                if f == 2 {
                    wire::each(wire::message(v, "scope_spans")?, |f, v| {
                        if f == 2 {
                            wire::message(v, "a span")?;
                            n += 1;
                        }
                        Ok(())
                    })?;
                }
                Ok(())
            })?;
        }
        Ok(())
    })?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    fn req(groups: &[usize]) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: groups
                .iter()
                .map(|&n| ResourceSpans {
                    scope_spans: vec![ScopeSpans {
                        spans: vec![
                            Span {
                                name: "x".into(),
                                ..Default::default()
                            };
                            n
                        ],
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn spans_are_counted_on_the_wire_as_decoding_counts_them() {
        let r = req(&[3, 0, 5]);
        assert_eq!(count_spans(&r.encode_to_vec()), Ok(8));
        assert_eq!(span_count(&r), 8);
        let limits = Limits {
            max_spans: 7,
            ..Limits::default()
        };
        assert!(matches!(
            request(Format::Protobuf, &r.encode_to_vec(), &limits),
            Err(Refused::TooLarge(_))
        ));
        assert!(count_spans(&[0x0a, 0x05, 0x01]).is_err(), "truncated");
    }

    #[test]
    fn json_bodies_decode_by_the_otlp_json_mapping() {
        let body =
            br#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"svc"}}]},
          "scopeSpans":[{"spans":[{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174",
          "name":"GET","kind":3,"startTimeUnixNano":"1544712660000000000","endTimeUnixNano":"1544712661000000000",
          "attributes":[{"key":"http.response.status_code","value":{"intValue":"503"}}],"status":{"code":2}}]}]}]}"#;
        let r = request(Format::Json, body, &Limits::default()).unwrap();
        let s = &r.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(s.trace_id.len(), 16);
        assert_eq!(s.start_time_unix_nano, 1_544_712_660_000_000_000);
        assert_eq!(s.kind, 3);
        let few = Limits {
            max_json_objects: 5,
            ..Limits::default()
        };
        assert!(matches!(request(Format::Json, body, &few), Err(Refused::TooLarge(_))));
        assert!(matches!(
            request(Format::Json, br#"{"resourceSpans":"x"}"#, &Limits::default()),
            Err(Refused::Malformed(_))
        ));
    }

    #[test]
    fn gzip_bodies_are_held_to_the_limit_once_decompressed() {
        use std::io::Write as _;
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(&vec![0u8; 100_000]).unwrap();
        let gz = z.finish().unwrap();
        assert_eq!(gunzip(&gz, 100_000).unwrap().len(), 100_000);
        assert!(matches!(gunzip(&gz, 99_999), Err(Refused::TooLarge(_))));
        assert!(matches!(gunzip(b"not gzip", 10), Err(Refused::Malformed(_))));
    }
}
