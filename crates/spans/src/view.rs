//! Spans as the table reads them, borrowed: read straight from the protobuf wire (no allocation
//! per attribute, and nothing of a request held but the span being read), or from a request
//! decoded from OTLP/JSON. Both give the same view of the same span (a generative test holds
//! the wire reader to prost's decoding).

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;

/// A scalar attribute value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar<'a> {
    Str(&'a str),
    Int(i64),
    Double(f64),
    Bool(bool),
    /// Bytes, a key/value list, or an empty value: nothing the table reads.
    Other,
}

/// An attribute's value: a scalar, or an array read as its first element (HTTP header
/// attributes are arrays of strings).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Val<'a> {
    pub scalar: Scalar<'a>,
    pub array: bool,
}

pub type Attr<'a> = (&'a str, Val<'a>);

#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventView<'a> {
    pub name: &'a str,
    pub time_unix_nano: u64,
    pub attrs: Vec<Attr<'a>>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct SpanView<'a> {
    pub trace_id: &'a [u8],
    pub span_id: &'a [u8],
    pub name: &'a str,
    pub kind: i32,
    pub start_time_unix_nano: u64,
    pub end_time_unix_nano: u64,
    pub attrs: Vec<Attr<'a>>,
    pub events: Vec<EventView<'a>>,
    pub status_code: i32,
    pub status_message: &'a str,
}

fn scalar(v: Option<&any_value::Value>) -> Scalar<'_> {
    match v {
        Some(any_value::Value::StringValue(s)) => Scalar::Str(s),
        Some(any_value::Value::IntValue(i)) => Scalar::Int(*i),
        Some(any_value::Value::DoubleValue(d)) => Scalar::Double(*d),
        Some(any_value::Value::BoolValue(b)) => Scalar::Bool(*b),
        _ => Scalar::Other,
    }
}

fn val_of(v: Option<&AnyValue>) -> Val<'_> {
    match v.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::ArrayValue(a)) => Val {
            scalar: scalar(a.values.first().and_then(|v| v.value.as_ref())),
            array: true,
        },
        other => Val {
            scalar: scalar(other),
            array: false,
        },
    }
}

/// A decoded attribute list as views.
pub fn attrs_of(kvs: &[KeyValue]) -> Vec<Attr<'_>> {
    kvs.iter()
        .map(|kv| (kv.key.as_str(), val_of(kv.value.as_ref())))
        .collect()
}

/// A decoded span as a view.
pub fn span_of(s: &Span) -> SpanView<'_> {
    SpanView {
        trace_id: &s.trace_id,
        span_id: &s.span_id,
        name: &s.name,
        kind: s.kind,
        start_time_unix_nano: s.start_time_unix_nano,
        end_time_unix_nano: s.end_time_unix_nano,
        attrs: attrs_of(&s.attributes),
        events: s
            .events
            .iter()
            .map(|e| EventView {
                name: &e.name,
                time_unix_nano: e.time_unix_nano,
                attrs: attrs_of(&e.attributes),
            })
            .collect(),
        status_code: s.status.as_ref().map_or(0, |s| s.code),
        status_message: s.status.as_ref().map_or("", |s| s.message.as_str()),
    }
}

/// The protobuf wire: fields of one message, checked as prost checks them (wire types of known
/// fields, lengths, UTF-8 of strings).
pub mod wire {
    use super::*;

    pub type Result<T> = std::result::Result<T, String>;

    /// One field: its number and value.
    pub enum F<'a> {
        Varint(u64),
        Fixed64(u64),
        Fixed32(u32),
        Len(&'a [u8]),
    }

    pub fn varint(b: &mut &[u8]) -> Result<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let (&byte, rest) = b.split_first().ok_or("truncated varint")?;
            *b = rest;
            v |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                return Ok(v);
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    /// Every field of a message, in order.
    pub fn each<'a>(mut b: &'a [u8], mut f: impl FnMut(u64, F<'a>) -> Result<()>) -> Result<()> {
        while !b.is_empty() {
            let key = varint(&mut b)?;
            let field = key >> 3;
            if field == 0 {
                return Err("field number 0".into());
            }
            let v = match key & 7 {
                0 => F::Varint(varint(&mut b)?),
                1 => {
                    let (v, rest) = b.split_first_chunk::<8>().ok_or("truncated fixed64")?;
                    b = rest;
                    F::Fixed64(u64::from_le_bytes(*v))
                }
                5 => {
                    let (v, rest) = b.split_first_chunk::<4>().ok_or("truncated fixed32")?;
                    b = rest;
                    F::Fixed32(u32::from_le_bytes(*v))
                }
                2 => {
                    let len = usize::try_from(varint(&mut b)?).map_err(|_| "length out of range")?;
                    if len > b.len() {
                        return Err("truncated length-delimited field".into());
                    }
                    let (v, rest) = b.split_at(len);
                    b = rest;
                    F::Len(v)
                }
                w => return Err(format!("wire type {w} is not used by OTLP")),
            };
            f(field, v)?;
        }
        Ok(())
    }

    fn bad(what: &str) -> String {
        format!("{what} has the wrong wire type")
    }

    pub fn string<'a>(v: F<'a>, what: &str) -> Result<&'a str> {
        match v {
            F::Len(b) => std::str::from_utf8(b).map_err(|_| format!("{what} is not UTF-8")),
            _ => Err(bad(what)),
        }
    }

    pub fn bytes<'a>(v: F<'a>, what: &str) -> Result<&'a [u8]> {
        match v {
            F::Len(b) => Ok(b),
            _ => Err(bad(what)),
        }
    }

    pub fn message<'a>(v: F<'a>, what: &str) -> Result<&'a [u8]> {
        bytes(v, what)
    }

    fn fixed64(v: F<'_>, what: &str) -> Result<u64> {
        match v {
            F::Fixed64(x) => Ok(x),
            _ => Err(bad(what)),
        }
    }

    fn int32(v: F<'_>, what: &str) -> Result<i32> {
        match v {
            F::Varint(x) => Ok(x as i32),
            _ => Err(bad(what)),
        }
    }

    /// An AnyValue. Nested arrays and lists are walked (checked) but read as nothing.
    fn any_value(b: &[u8], depth: u32) -> Result<Scalar<'_>> {
        if depth > 32 {
            return Err("values nested deeper than 32".into());
        }
        let mut out = Scalar::Other;
        each(b, |field, v| {
            out = match field {
                1 => Scalar::Str(string(v, "a string value")?),
                2 => match v {
                    F::Varint(x) => Scalar::Bool(x != 0),
                    _ => return Err(bad("a bool value")),
                },
                3 => match v {
                    F::Varint(x) => Scalar::Int(x as i64),
                    _ => return Err(bad("an int value")),
                },
                4 => Scalar::Double(f64::from_bits(fixed64(v, "a double value")?)),
                5 => {
                    check_array(message(v, "an array value")?, depth + 1)?;
                    Scalar::Other
                }
                6 => {
                    key_values(message(v, "a key/value list")?, depth + 1, &mut Vec::new())?;
                    Scalar::Other
                }
                7 => {
                    bytes(v, "a bytes value")?;
                    Scalar::Other
                }
                8 => {
                    int32(v, "a string index")?;
                    Scalar::Other
                }
                _ => out,
            };
            Ok(())
        })?;
        Ok(out)
    }

    fn check_array(b: &[u8], depth: u32) -> Result<()> {
        each(b, |field, v| {
            if field == 1 {
                any_value(message(v, "an array element")?, depth)?;
            }
            Ok(())
        })
    }

    /// An attribute's value (an array: its first element's scalar).
    fn attr_value(b: &[u8], depth: u32) -> Result<Val<'_>> {
        let mut val = Val {
            scalar: Scalar::Other,
            array: false,
        };
        each(b, |field, v| {
            if field == 5 {
                let arr = message(v, "an array value")?;
                let mut first = None;
                each(arr, |f, v| {
                    if f == 1 {
                        let s = any_value(message(v, "an array element")?, depth + 2)?;
                        first.get_or_insert(s);
                    }
                    Ok(())
                })?;
                val = Val {
                    scalar: first.unwrap_or(Scalar::Other),
                    array: true,
                };
            }
            Ok(())
        })?;
        if !val.array {
            val.scalar = any_value(b, depth + 1)?;
        }
        Ok(val)
    }

    /// A repeated KeyValue field's one entry, appended to `out`.
    fn key_value<'a>(b: &'a [u8], depth: u32, out: &mut Vec<Attr<'a>>) -> Result<()> {
        let (mut key, mut val) = (
            "",
            Val {
                scalar: Scalar::Other,
                array: false,
            },
        );
        each(b, |field, v| {
            match field {
                1 => key = string(v, "an attribute key")?,
                2 => val = attr_value(message(v, "an attribute value")?, depth)?,
                3 => {
                    int32(v, "a key index")?;
                }
                _ => {}
            }
            Ok(())
        })?;
        out.push((key, val));
        Ok(())
    }

    fn key_values<'a>(b: &'a [u8], depth: u32, out: &mut Vec<Attr<'a>>) -> Result<()> {
        each(b, |field, v| {
            if field == 1 {
                key_value(message(v, "a key/value")?, depth, out)?;
            }
            Ok(())
        })
    }

    /// A Resource's (or an InstrumentationScope's) attributes: field 1 of Resource.
    pub fn resource(b: &[u8]) -> Result<Vec<Attr<'_>>> {
        let mut out = Vec::new();
        each(b, |field, v| {
            match field {
                1 => key_value(message(v, "a resource attribute")?, 0, &mut out)?,
                2 => {
                    int32(v, "a dropped count")?;
                }
                _ => {}
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// An InstrumentationScope, checked (name and version UTF-8) but not kept.
    pub fn scope(b: &[u8]) -> Result<()> {
        each(b, |field, v| {
            match field {
                1 => {
                    string(v, "a scope name")?;
                }
                2 => {
                    string(v, "a scope version")?;
                }
                3 => key_value(message(v, "a scope attribute")?, 0, &mut Vec::new())?,
                _ => {}
            }
            Ok(())
        })
    }

    /// One span into `s` (cleared first; its vectors keep their capacity).
    pub fn span<'a>(b: &'a [u8], s: &mut SpanView<'a>) -> Result<()> {
        s.trace_id = &[];
        s.span_id = &[];
        s.name = "";
        s.kind = 0;
        s.start_time_unix_nano = 0;
        s.end_time_unix_nano = 0;
        s.attrs.clear();
        s.events.clear();
        s.status_code = 0;
        s.status_message = "";
        each(b, |field, v| {
            match field {
                1 => s.trace_id = bytes(v, "trace_id")?,
                2 => s.span_id = bytes(v, "span_id")?,
                3 => {
                    string(v, "trace_state")?;
                }
                4 => {
                    bytes(v, "parent_span_id")?;
                }
                5 => s.name = string(v, "a span name")?,
                6 => s.kind = int32(v, "a span kind")?,
                7 => s.start_time_unix_nano = fixed64(v, "a start time")?,
                8 => s.end_time_unix_nano = fixed64(v, "an end time")?,
                9 => key_value(message(v, "a span attribute")?, 0, &mut s.attrs)?,
                11 => {
                    let mut e = EventView::default();
                    each(message(v, "an event")?, |f, v| {
                        match f {
                            1 => e.time_unix_nano = fixed64(v, "an event time")?,
                            2 => e.name = string(v, "an event name")?,
                            3 => key_value(message(v, "an event attribute")?, 0, &mut e.attrs)?,
                            _ => {}
                        }
                        Ok(())
                    })?;
                    s.events.push(e);
                }
                13 => {
                    each(message(v, "a link")?, |f, v| {
                        match f {
                            3 => {
                                string(v, "a link's trace_state")?;
                            }
                            4 => key_value(message(v, "a link attribute")?, 0, &mut Vec::new())?,
                            _ => {}
                        }
                        Ok(())
                    })?;
                }
                15 => each(message(v, "a status")?, |f, v| {
                    match f {
                        2 => s.status_message = string(v, "a status message")?,
                        3 => s.status_code = int32(v, "a status code")?,
                        _ => {}
                    }
                    Ok(())
                })?,
                _ => {}
            }
            Ok(())
        })
    }
}
