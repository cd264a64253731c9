//! What can go wrong reading or writing a record.

use super::SchemaKind;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CodecError {
    #[error("record is {0} bytes, shorter than the 10-byte single-object header")]
    TooShort(usize),
    #[error("bad magic {0:02x} {1:02x}: not Avro single-object encoding (want c3 01)")]
    BadMagic(u8, u8),
    #[error("unknown schema fingerprint {0:016x}")]
    UnknownFingerprint(u64),
    #[error("schema {found:?} where {expected:?} was expected")]
    WrongSchema { expected: SchemaKind, found: SchemaKind },
    #[error("invalid avro body for {kind:?}: {message}")]
    Body { kind: SchemaKind, message: String },
    #[error("cannot encode {kind:?}: {message}")]
    Encode { kind: SchemaKind, message: String },
}

impl CodecError {
    /// A short machine-readable code, for a dead-letter header or a metric label.
    pub fn code(&self) -> &'static str {
        match self {
            CodecError::TooShort(_) => "too_short",
            CodecError::BadMagic(..) => "bad_magic",
            CodecError::UnknownFingerprint(_) => "unknown_fingerprint",
            CodecError::WrongSchema { .. } => "wrong_schema",
            CodecError::Body { .. } => "invalid_body",
            CodecError::Encode { .. } => "encode",
        }
    }
}
