//! Reading a span's or a resource's attributes by key.

use crate::view::{Attr, Scalar, Val};
use std::borrow::Cow;

/// An attribute list, read by key (the first of a key wins, as the SDKs write each once).
#[derive(Clone, Copy)]
pub struct Attrs<'s, 'a>(pub &'s [Attr<'a>]);

impl<'s, 'a> Attrs<'s, 'a> {
    pub fn get(&self, key: &str) -> Option<Val<'a>> {
        self.0
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
            .filter(|v| v.scalar != Scalar::Other || v.array)
    }

    /// A scalar as text (an array: its first element, as HTTP header attributes are arrays of
    /// strings).
    pub fn text(&self, key: &str) -> Option<Cow<'a, str>> {
        match self.get(key)?.scalar {
            Scalar::Str(s) => Some(Cow::Borrowed(s)),
            Scalar::Int(i) => Some(Cow::Owned(i.to_string())),
            Scalar::Double(d) => Some(Cow::Owned(d.to_string())),
            Scalar::Bool(b) => Some(Cow::Borrowed(if b { "true" } else { "false" })),
            Scalar::Other => None,
        }
    }

    /// An integer, or a string holding one (some SDKs write status codes as strings).
    pub fn int(&self, key: &str) -> Option<i64> {
        let v = self.get(key).filter(|v| !v.array)?;
        match v.scalar {
            Scalar::Int(i) => Some(i),
            Scalar::Str(s) => s.trim().parse().ok(),
            Scalar::Double(d) if d.fract() == 0.0 && d.abs() < 1e15 => Some(d as i64),
            _ => None,
        }
    }

    /// A number (a string holding one too).
    pub fn number(&self, key: &str) -> Option<f64> {
        let v = self.get(key).filter(|v| !v.array)?;
        match v.scalar {
            Scalar::Int(i) => Some(i as f64),
            Scalar::Double(d) => Some(d),
            Scalar::Str(s) => s.trim().parse().ok(),
            _ => None,
        }
        .filter(|n: &f64| n.is_finite())
    }

    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }
}
