//! Reading OTLP attributes: a span's or a resource's key/value list.

use opentelemetry_proto::tonic::common::v1::{any_value::Value, KeyValue};
use std::borrow::Cow;

/// An attribute list, read by key (the first of a key wins, as the SDKs write each once).
#[derive(Clone, Copy)]
pub struct Attrs<'a>(pub &'a [KeyValue]);

impl<'a> Attrs<'a> {
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.0
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref())
            .and_then(|v| v.value.as_ref())
    }

    /// A scalar as text (an array: its first element, as HTTP header attributes are arrays of
    /// strings).
    pub fn text(&self, key: &str) -> Option<Cow<'a, str>> {
        text_of(self.get(key)?)
    }

    /// An integer, or a string holding one (some SDKs write status codes as strings).
    pub fn int(&self, key: &str) -> Option<i64> {
        match self.get(key)? {
            Value::IntValue(i) => Some(*i),
            Value::StringValue(s) => s.trim().parse().ok(),
            Value::DoubleValue(d) if d.fract() == 0.0 && d.abs() < 1e15 => Some(*d as i64),
            _ => None,
        }
    }

    /// A number (a string holding one too).
    pub fn number(&self, key: &str) -> Option<f64> {
        match self.get(key)? {
            Value::IntValue(i) => Some(*i as f64),
            Value::DoubleValue(d) => Some(*d),
            Value::StringValue(s) => s.trim().parse().ok(),
            _ => None,
        }
        .filter(|n: &f64| n.is_finite())
    }

    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }
}

fn text_of(v: &Value) -> Option<Cow<'_, str>> {
    match v {
        Value::StringValue(s) => Some(Cow::Borrowed(s.as_str())),
        Value::IntValue(i) => Some(Cow::Owned(i.to_string())),
        Value::DoubleValue(d) => Some(Cow::Owned(d.to_string())),
        Value::BoolValue(b) => Some(Cow::Borrowed(if *b { "true" } else { "false" })),
        Value::ArrayValue(a) => a.values.first().and_then(|v| v.value.as_ref()).and_then(text_of),
        _ => None,
    }
}
