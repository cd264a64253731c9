//! The types of query parameters. Each checks its value as it is read, with the message a
//! client sees; [`crate::extract::ApiQuery`] names the parameter. A route's parameter struct is
//! then both its OpenAPI description and its parser: each type's OpenAPI schema (its bounds,
//! lengths and values) is built from the same constants its check uses, so the two cannot drift.
//! A parameter struct's fields are `#[param(inline)]`, so that the schema is the type's own.

use chrono::{DateTime, Utc};
use serde::de::{Deserializer, Error};
use serde::Deserialize;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, Schema, SchemaFormat, Type};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};
use vitals_contracts as c;

/// The longest pool or endpoint name, in bytes (the contracts' rule for every name).
pub const MAX_NAME: usize = c::validate::MAX_NAME_LEN;

/// A parameter type's OpenAPI schema, and its (unused: the schema is always inline) name.
macro_rules! schema {
    ($ty:ident $(<$(const $g:ident: $gt:ty),*>)?, $build:expr) => {
        impl$(<$(const $g: $gt),*>)? PartialSchema for $ty$(<$($g),*>)? {
            fn schema() -> RefOr<Schema> {
                $build
            }
        }
        impl$(<$(const $g: $gt),*>)? ToSchema for $ty$(<$($g),*>)? {}
    };
}

fn text_schema(min: Option<usize>, max: usize) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(min)
        .max_length(Some(max))
        .into()
}

fn one_of(values: &[&str]) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(values.iter().copied()))
        .into()
}

schema!(Int<const MIN: i64, const MAX: i64>, ObjectBuilder::new()
    .schema_type(Type::Integer)
    .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
    .minimum(Some(MIN as f64))
    .maximum(Some(MAX as f64))
    .into());
schema!(Name, text_schema(Some(1), MAX_NAME));
schema!(After, text_schema(None, MAX_NAME));
schema!(Scope, text_schema(None, MAX_NAME));
schema!(
    Time,
    ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
        .into()
);
schema!(State, one_of(&c::HealthState::names()));
schema!(Reason, one_of(&c::ReasonCode::names()));
schema!(Bucket, one_of(&[Bucket::Hour.as_str(), Bucket::Day.as_str()]));

fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    String::deserialize(d)
}

/// An integer from `MIN` to `MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int<const MIN: i64, const MAX: i64>(pub i64);

impl<'de, const MIN: i64, const MAX: i64> Deserialize<'de> for Int<MIN, MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = text(d)?;
        v.parse::<i64>()
            .ok()
            .filter(|n| (MIN..=MAX).contains(n))
            .map(Int)
            .ok_or_else(|| D::Error::custom(format!("must be an integer from {MIN} to {MAX}")))
    }
}

/// The value of an optional [`Int`], or `default`.
pub fn int_or<const MIN: i64, const MAX: i64>(v: Option<Int<MIN, MAX>>, default: i64) -> i64 {
    v.map_or(default, |Int(n)| n)
}

/// A pool or endpoint name: 1 to [`MAX_NAME`] bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name(pub String);

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = text(d)?;
        if v.is_empty() || v.len() > MAX_NAME {
            return Err(D::Error::custom(format!("must be 1 to {MAX_NAME} bytes (UTF-8)")));
        }
        Ok(Name(v))
    }
}

impl Name {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Where a page of names starts: after this name (empty: from the first), at most
/// [`MAX_NAME`] bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct After(pub String);

impl<'de> Deserialize<'de> for After {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = text(d)?;
        if v.len() > MAX_NAME {
            return Err(D::Error::custom(format!("must be at most {MAX_NAME} bytes (UTF-8)")));
        }
        Ok(After(v))
    }
}

/// A time in RFC 3339.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Time(pub DateTime<Utc>);

impl<'de> Deserialize<'de> for Time {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = text(d)?;
        DateTime::parse_from_rfc3339(&v)
            .map(|t| Time(t.with_timezone(&Utc)))
            .map_err(|_| D::Error::custom(format!("{v:?} is not an RFC 3339 time")))
    }
}

/// A health state by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State(pub c::HealthState);

impl<'de> Deserialize<'de> for State {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = text(d)?;
        c::HealthState::parse(&v).map(State).ok_or_else(|| {
            D::Error::custom(format!(
                "{v:?} is not a health state ({})",
                c::HealthState::names().join(", ")
            ))
        })
    }
}

/// A reason code by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reason(pub c::ReasonCode);

impl<'de> Deserialize<'de> for Reason {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = text(d)?;
        c::ReasonCode::parse(&v).map(Reason).ok_or_else(|| {
            D::Error::custom(format!(
                "{v:?} is not a reason code ({})",
                c::ReasonCode::names().join(", ")
            ))
        })
    }
}

/// A scope of reporters (`gateway=g1`, `location=eu`, `key=k1`), or `fleet` for the fleet's
/// transitions only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope(pub Option<String>);

impl<'de> Deserialize<'de> for Scope {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = text(d)?;
        if v == "fleet" {
            return Ok(Scope(None));
        }
        c::scope::parse(&v).map_err(|e| D::Error::custom(format!("{e}; or fleet for the fleet's transitions")))?;
        Ok(Scope(Some(v)))
    }
}

/// The width of an uptime bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bucket {
    Hour,
    Day,
}

impl<'de> Deserialize<'de> for Bucket {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match text(d)?.as_str() {
            "hour" => Ok(Bucket::Hour),
            "day" => Ok(Bucket::Day),
            b => Err(D::Error::custom(format!("{b:?} is not hour or day"))),
        }
    }
}

impl Bucket {
    pub fn as_str(self) -> &'static str {
        match self {
            Bucket::Hour => "hour",
            Bucket::Day => "day",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, Debug)]
    struct Q {
        limit: Option<Int<1, 500>>,
        pool: Option<Name>,
        from: Option<Time>,
        state: Option<State>,
        bucket: Option<Bucket>,
    }

    fn parse(q: &str) -> Result<Q, String> {
        crate::extract::query::<Q>(q).map_err(|e| format!("{e:?}"))
    }

    #[test]
    fn each_type_checks_its_value_and_says_what_it_wants() {
        let q = parse("limit=500&pool=a%2Fb&from=2026-12-03T10:00:00%2B01:00&state=degraded&bucket=day").unwrap();
        assert_eq!(q.limit, Some(Int(500)));
        assert_eq!(q.pool.unwrap().as_str(), "a/b");
        assert_eq!(q.from.unwrap().0.to_rfc3339(), "2026-12-03T09:00:00+00:00");
        assert_eq!(q.state, Some(State(c::HealthState::Degraded)));
        assert_eq!(q.bucket, Some(Bucket::Day));
        assert!(parse("").unwrap().limit.is_none());
        for (bad, says) in [
            ("limit=0", "from 1 to 500"),
            ("limit=501", "from 1 to 500"),
            ("limit=1.5", "from 1 to 500"),
            ("pool=", "1 to 256 bytes"),
            ("from=yesterday", "RFC 3339"),
            ("state=sleepy", "not a health state (healthy"),
            ("bucket=week", "not hour or day"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert!(parse(&format!("pool={}", "x".repeat(257))).is_err());
    }
}
