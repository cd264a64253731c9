//! The few Google RPC messages OTLP answers with: `google.rpc.Status` (the body of an OTLP/HTTP
//! error, and gRPC's `grpc-status-details-bin`) and `google.rpc.RetryInfo` (how long a client
//! should wait before it sends again).

use base64::Engine as _;
use prost::Message;

#[derive(Clone, PartialEq, Message)]
pub struct Status {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<Any>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Any {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
pub struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    pub retry_delay: Option<Duration>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Duration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// gRPC status codes OTLP uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok = 0,
    InvalidArgument = 3,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl Status {
    pub fn new(code: Code, message: impl Into<String>) -> Status {
        Status {
            code: code as i32,
            message: message.into(),
            details: Vec::new(),
        }
    }

    /// With a RetryInfo: the client may send again after `seconds`.
    pub fn retry_after(mut self, seconds: u64) -> Status {
        self.details.push(Any {
            type_url: "type.googleapis.com/google.rpc.RetryInfo".into(),
            value: RetryInfo {
                retry_delay: Some(Duration {
                    seconds: seconds as i64,
                    nanos: 0,
                }),
            }
            .encode_to_vec(),
        });
        self
    }

    /// gRPC's `grpc-status-details-bin` trailer: the status, base64 without padding.
    pub fn details_bin(&self) -> String {
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(self.encode_to_vec())
    }

    /// The JSON form OTLP/HTTP uses for a JSON request's error body.
    pub fn json(&self) -> String {
        serde_json::json!({"code": self.code, "message": self.message}).to_string()
    }
}

/// A gRPC message's text in `grpc-message`: percent-encoded outside printable ASCII.
pub fn grpc_message(m: &str) -> String {
    let mut out = String::with_capacity(m.len());
    for b in m.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
