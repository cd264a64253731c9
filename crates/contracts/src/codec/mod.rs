//! Avro single-object encoding: `C3 01`, the 8-byte little-endian CRC-64-AVRO fingerprint of the
//! writer schema, then the Avro binary datum.
//!
//! Decoding looks the fingerprint up among every schema version we know. A record written with an
//! older version is resolved to the current one by Avro's schema-resolution rules, so schemas may
//! evolve by adding optional fields with defaults. Nothing here panics on bad bytes: an unknown
//! fingerprint, a truncated body or a value that does not fit the schema is a [`CodecError`].

mod error;
mod fast;
mod fast_encode;

use crate::types::*;
use apache_avro::{from_avro_datum, from_value, to_avro_datum, to_value, write_avro_datum_ref, Schema};
pub use error::CodecError;
use serde::{de::DeserializeOwned, Serialize};
use std::collections::HashMap;
use std::sync::OnceLock;

pub const MAGIC: [u8; 2] = [0xC3, 0x01];
pub const HEADER_LEN: usize = 10;

/// The record types of the contracts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SchemaKind {
    CallOutcome,
    CallSummary,
    ProbeResult,
    Tick,
    OperatorOverride,
    PolicyChange,
    HealthChanged,
    PoolHealthChanged,
    EndpointState,
}

/// (kind, schema text, is it the current version) — the files in `schemas/`.
const SCHEMA_FILES: &[(SchemaKind, &str, bool)] = &[
    (
        SchemaKind::CallOutcome,
        include_str!("../../../../schemas/call_outcome.avsc"),
        true,
    ),
    (
        SchemaKind::CallOutcome,
        include_str!("../../../../schemas/call_outcome.v2.avsc"),
        false,
    ),
    (
        SchemaKind::CallOutcome,
        include_str!("../../../../schemas/call_outcome.v1.avsc"),
        false,
    ),
    (
        SchemaKind::CallSummary,
        include_str!("../../../../schemas/call_summary.avsc"),
        true,
    ),
    (
        SchemaKind::CallSummary,
        include_str!("../../../../schemas/call_summary.v1.avsc"),
        false,
    ),
    (
        SchemaKind::ProbeResult,
        include_str!("../../../../schemas/probe_result.avsc"),
        true,
    ),
    (SchemaKind::Tick, include_str!("../../../../schemas/tick.avsc"), true),
    (
        SchemaKind::OperatorOverride,
        include_str!("../../../../schemas/operator_override.avsc"),
        true,
    ),
    (
        SchemaKind::PolicyChange,
        include_str!("../../../../schemas/policy_change.avsc"),
        true,
    ),
    (
        SchemaKind::PolicyChange,
        include_str!("../../../../schemas/policy_change.v2.avsc"),
        false,
    ),
    (
        SchemaKind::PolicyChange,
        include_str!("../../../../schemas/policy_change.v1.avsc"),
        false,
    ),
    (
        SchemaKind::HealthChanged,
        include_str!("../../../../schemas/health_changed.avsc"),
        true,
    ),
    (
        SchemaKind::HealthChanged,
        include_str!("../../../../schemas/health_changed.v1.avsc"),
        false,
    ),
    (
        SchemaKind::PoolHealthChanged,
        include_str!("../../../../schemas/pool_health_changed.avsc"),
        true,
    ),
    (
        SchemaKind::PoolHealthChanged,
        include_str!("../../../../schemas/pool_health_changed.v1.avsc"),
        false,
    ),
    (
        SchemaKind::EndpointState,
        include_str!("../../../../schemas/endpoint_state.avsc"),
        true,
    ),
];

struct Known {
    kind: SchemaKind,
    schema: Schema,
    /// `None` for the current version; otherwise the current schema to resolve to.
    resolve_to: Option<usize>,
}

struct Registry {
    known: Vec<Known>,
    /// Looked up for every record read: Fx, not SipHash (the keys are our schemas'
    /// fingerprints; a record's is only looked up).
    by_fingerprint: rustc_hash::FxHashMap<u64, usize>,
    current: HashMap<SchemaKind, (usize, u64)>,
    /// The version before the current one, of the kinds that have one.
    previous: HashMap<SchemaKind, (usize, u64)>,
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut known = Vec::new();
        let mut by_fingerprint = rustc_hash::FxHashMap::default();
        let mut current = HashMap::new();
        let mut previous = HashMap::new();
        for (kind, text, is_current) in SCHEMA_FILES {
            // The schema files are part of this crate's source; a parse failure is a build defect
            // that the unit tests catch, not a runtime condition.
            let schema = Schema::parse_str(text).unwrap_or_else(|e| panic!("schema {kind:?}: {e}"));
            let fp = fingerprint(&schema);
            let idx = known.len();
            known.push(Known {
                kind: *kind,
                schema,
                resolve_to: None,
            });
            by_fingerprint.insert(fp, idx);
            if *is_current {
                current.insert(*kind, (idx, fp));
            } else {
                // The files of a kind are listed newest first.
                previous.entry(*kind).or_insert((idx, fp));
            }
        }
        for (idx, k) in known.iter_mut().enumerate() {
            let (cur, _) = current[&k.kind];
            if cur != idx {
                k.resolve_to = Some(cur);
            }
        }
        Registry {
            known,
            by_fingerprint,
            current,
            previous,
        }
    })
}

/// The schema's Parsing Canonical Form, as the Avro specification defines it.
///
/// apache-avro 0.21 writes a primitive that carries a logical type as `{"type":"long"}` where the
/// specification's [PRIMITIVES] rule wants `"long"`; other implementations (fastavro, Java) follow
/// the rule, so we apply it here. In canonical form such an object has no other attribute left,
/// which makes the textual rewrite exact.
pub fn canonical_form(schema: &Schema) -> String {
    let mut cf = schema.canonical_form();
    for p in ["null", "boolean", "int", "long", "float", "double", "bytes", "string"] {
        cf = cf.replace(&format!("{{\"type\":\"{p}\"}}"), &format!("\"{p}\""));
    }
    cf
}

/// CRC-64-AVRO (the specification's 64-bit Rabin fingerprint) of the parsing canonical form.
pub fn fingerprint(schema: &Schema) -> u64 {
    crc64_avro(canonical_form(schema).as_bytes())
}

const CRC64_EMPTY: u64 = 0xc15d_213a_a4d7_a795;

const CRC64_TABLE: [u64; 256] = {
    let mut table = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        let mut fp = i as u64;
        let mut j = 0;
        while j < 8 {
            fp = (fp >> 1) ^ (CRC64_EMPTY & (0u64.wrapping_sub(fp & 1)));
            j += 1;
        }
        table[i] = fp;
        i += 1;
    }
    table
};

pub fn crc64_avro(data: &[u8]) -> u64 {
    data.iter().fold(CRC64_EMPTY, |fp, b| {
        (fp >> 8) ^ CRC64_TABLE[((fp ^ u64::from(*b)) & 0xff) as usize]
    })
}

/// The current schema of a kind and its fingerprint.
pub fn current_schema(kind: SchemaKind) -> (&'static Schema, u64) {
    let r = registry();
    let (idx, fp) = r.current[&kind];
    (&r.known[idx].schema, fp)
}

/// A Rust type with an Avro schema.
pub trait Record: Serialize + DeserializeOwned {
    const KIND: SchemaKind;

    /// Write the Avro body by hand (true), or leave it to apache-avro (false); `previous`: in the
    /// kind's previous schema version.
    #[doc(hidden)]
    fn encode_body(&self, _out: &mut Vec<u8>, _previous: bool) -> bool {
        false
    }

    /// Whether the record is written in its kind's previous schema version: that version holds
    /// it whole (the new fields are at their defaults). A fleet transition is written as
    /// version 1 of HealthChanged, so that a consumer built before scopes reads it; a scoped
    /// one, which such a consumer must not apply, is version 2 (it skips it as a gap).
    fn fits_previous(&self) -> bool {
        false
    }
}

macro_rules! record {
    ($t:ty, $k:ident) => {
        impl Record for $t {
            const KIND: SchemaKind = SchemaKind::$k;
        }
    };
    ($t:ty, $k:ident, $fast:path) => {
        record!($t, $k, $fast, |_: &$t| false);
    };
    ($t:ty, $k:ident, $fast:path, $fits:expr) => {
        impl Record for $t {
            const KIND: SchemaKind = SchemaKind::$k;

            fn encode_body(&self, out: &mut Vec<u8>, previous: bool) -> bool {
                $fast(&mut fast_encode::Writer(out), self, previous);
                true
            }

            fn fits_previous(&self) -> bool {
                ($fits)(self)
            }
        }
    };
}
record!(CallOutcome, CallOutcome, fast_encode::call_outcome);
// A gateway's own summary (no `reporters`) is written in version 1, as before merged ones
// existed, so that every consumer built before them reads it; a merged one is version 2.
record!(
    crate::summary::CallSummary,
    CallSummary,
    fast_encode::call_summary,
    |s: &crate::summary::CallSummary| s.reporters.is_none()
);
record!(ProbeResult, ProbeResult, fast_encode::probe_result);
record!(Tick, Tick, fast_encode::tick);
record!(OperatorOverride, OperatorOverride);
record!(PolicyChange, PolicyChange);
record!(
    HealthChanged,
    HealthChanged,
    fast_encode::health_changed,
    |h: &HealthChanged| h.scope.is_none()
);
record!(
    PoolHealthChanged,
    PoolHealthChanged,
    fast_encode::pool_health_changed,
    |p: &PoolHealthChanged| p.faulty_reporters.is_empty()
);
record!(EndpointState, EndpointState, fast_encode::endpoint_state);

/// Encode with the current schema of `T`.
pub fn encode<T: Record>(value: &T) -> Result<Vec<u8>, CodecError> {
    let previous = value.fits_previous();
    let (schema, mut out) = headed::<T>(previous);
    if value.encode_body(&mut out, previous) {
        return Ok(out);
    }
    encode_with(schema, value, out)
}

/// Encode through apache-avro, whatever `T` is; public for the tests that hold the hand-written
/// encoders equal to it.
#[doc(hidden)]
pub fn encode_generic<T: Record>(value: &T) -> Result<Vec<u8>, CodecError> {
    let (schema, out) = headed::<T>(value.fits_previous());
    encode_with(schema, value, out)
}

/// The schema of `T` a record is written in (the current one, or the previous one), and a
/// buffer holding its single-object header.
fn headed<T: Record>(previous: bool) -> (&'static Schema, Vec<u8>) {
    let (schema, fp) = match registry().previous.get(&T::KIND).filter(|_| previous) {
        Some((idx, fp)) => (&registry().known[*idx].schema, *fp),
        None => current_schema(T::KIND),
    };
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&fp.to_le_bytes());
    (schema, out)
}

/// The body through apache-avro after the header in `out`.
fn encode_with<T: Record>(schema: &Schema, value: &T, mut out: Vec<u8>) -> Result<Vec<u8>, CodecError> {
    let err = |e: apache_avro::Error| CodecError::Encode {
        kind: T::KIND,
        message: e.to_string(),
    };
    // Fast path: serde straight to Avro bytes. It cannot follow references to named types
    // defined earlier in the schema (HealthChanged's `to_state`), so those records take the
    // slower path through an Avro `Value`.
    if write_avro_datum_ref(schema, value, &mut out).is_ok() {
        return Ok(out);
    }
    out.truncate(HEADER_LEN);
    let v = to_value(value).map_err(err)?.resolve(schema).map_err(err)?;
    out.extend(to_avro_datum(schema, v).map_err(err)?);
    Ok(out)
}

/// Split the header off: (kind, schema index, body).
fn header(bytes: &[u8]) -> Result<(SchemaKind, usize, &[u8]), CodecError> {
    if bytes.len() < HEADER_LEN {
        return Err(CodecError::TooShort(bytes.len()));
    }
    if bytes[..2] != MAGIC {
        return Err(CodecError::BadMagic(bytes[0], bytes[1]));
    }
    let mut fp = [0u8; 8];
    fp.copy_from_slice(&bytes[2..HEADER_LEN]);
    let fp = u64::from_le_bytes(fp);
    let idx = *registry()
        .by_fingerprint
        .get(&fp)
        .ok_or(CodecError::UnknownFingerprint(fp))?;
    Ok((registry().known[idx].kind, idx, &bytes[HEADER_LEN..]))
}

/// Every schema version we can read: (kind, fingerprint, is it the current version). For tests
/// and fuzzing that must cover each version.
pub fn known_schemas() -> Vec<(SchemaKind, u64, bool)> {
    let r = registry();
    let mut v: Vec<_> = r
        .by_fingerprint
        .iter()
        .map(|(fp, idx)| (r.known[*idx].kind, *fp, r.known[*idx].resolve_to.is_none()))
        .collect();
    v.sort_by_key(|(_, fp, _)| *fp);
    v
}

/// The kind of a record, from its header alone.
pub fn peek_kind(bytes: &[u8]) -> Result<SchemaKind, CodecError> {
    header(bytes).map(|(k, _, _)| k)
}

fn decode_body<T: Record>(idx: usize, body: &[u8]) -> Result<T, CodecError> {
    let r = registry();
    let known = &r.known[idx];
    let err = |e: apache_avro::Error| CodecError::Body {
        kind: known.kind,
        message: e.to_string(),
    };
    // Every count and length is checked against the bytes that remain before apache-avro, which
    // trusts them, allocates anything.
    crate::bounds::check(&known.schema, body).map_err(|message| CodecError::Body {
        kind: known.kind,
        message,
    })?;
    let reader = known.resolve_to.map(|c| &r.known[c].schema);
    let mut input = Input {
        rest: body,
        hit_end: false,
    };
    let value = from_avro_datum(&known.schema, &mut input, reader).map_err(err)?;
    // apache-avro reads a union index cut off by the end of input as null instead of failing, so
    // a truncated record could decode; a read past the end is a truncation whatever it produced.
    if input.hit_end {
        return Err(CodecError::Body {
            kind: known.kind,
            message: "record is truncated".into(),
        });
    }
    if !input.rest.is_empty() {
        return Err(CodecError::Body {
            kind: known.kind,
            message: format!("{} trailing bytes after the record", input.rest.len()),
        });
    }
    from_value::<T>(&value).map_err(err)
}

/// A reader over the body that remembers whether anyone tried to read past its end.
struct Input<'a> {
    rest: &'a [u8],
    hit_end: bool,
}

impl std::io::Read for Input<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.rest.len() < buf.len() {
            self.hit_end = true;
        }
        self.rest.read(buf)
    }
}

/// Decode a record that must be of type `T`.
pub fn decode<T: Record>(bytes: &[u8]) -> Result<T, CodecError> {
    let (kind, idx, body) = header(bytes)?;
    if kind != T::KIND {
        return Err(CodecError::WrongSchema {
            expected: T::KIND,
            found: kind,
        });
    }
    decode_body(idx, body)
}

/// Decode anything that may arrive on the signals topic.
pub fn decode_signal(bytes: &[u8]) -> Result<Signal, CodecError> {
    let (kind, idx, body) = header(bytes)?;
    let r = registry();
    // A summary's version 1 is version 2 without its last field: the fast path reads both.
    let summary_v1 = kind == SchemaKind::CallSummary && r.previous.get(&kind).is_some_and(|(i, _)| *i == idx);
    if r.known[idx].resolve_to.is_none() || summary_v1 {
        if let Some(result) = fast::decode(kind, body, !summary_v1) {
            return result;
        }
    }
    decode_signal_body(kind, idx, body)
}

/// The generic path (apache-avro with schema resolution) for any signal record; public for the
/// tests that hold the hand-written decoders equal to it.
#[doc(hidden)]
pub fn decode_signal_generic(bytes: &[u8]) -> Result<Signal, CodecError> {
    let (kind, idx, body) = header(bytes)?;
    decode_signal_body(kind, idx, body)
}

fn decode_signal_body(kind: SchemaKind, idx: usize, body: &[u8]) -> Result<Signal, CodecError> {
    Ok(match kind {
        SchemaKind::CallOutcome => Signal::Call(decode_body(idx, body)?),
        SchemaKind::CallSummary => Signal::Summary(decode_body(idx, body)?),
        SchemaKind::ProbeResult => Signal::Probe(decode_body(idx, body)?),
        SchemaKind::Tick => Signal::Tick(decode_body(idx, body)?),
        SchemaKind::OperatorOverride => Signal::Override(decode_body(idx, body)?),
        SchemaKind::PolicyChange => Signal::Policy(decode_body(idx, body)?),
        found => {
            return Err(CodecError::WrongSchema {
                expected: SchemaKind::CallOutcome,
                found,
            });
        }
    })
}

pub fn encode_signal(signal: &Signal) -> Result<Vec<u8>, CodecError> {
    match signal {
        Signal::Call(v) => encode(v),
        Signal::Summary(v) => encode(v),
        Signal::Probe(v) => encode(v),
        Signal::Tick(v) => encode(v),
        Signal::Override(v) => encode(v),
        Signal::Policy(v) => encode(v),
    }
}
