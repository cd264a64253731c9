//! A call span's outcome class, by the OpenTelemetry semantic conventions: the HTTP status code
//! first (`http.response.status_code`, or the older `http.status_code`), then the error's type
//! (`error.type`, else the `exception` event's `exception.type`, else the span status's
//! message) when the span says the call failed. A generic type that no rule knows (Node's `Error`
//! or a DOMException code such as `23`, Go's `*net.OpError`) gives way to the next text that one
//! does: `exception.type`, `exception.message`, the status message.

use crate::attrs::Attrs;
use crate::view::SpanView;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use vitals_contracts::OutcomeClass;

/// The status code attributes, newest convention first.
pub const STATUS_KEYS: [&str; 3] = ["http.response.status_code", "http.status_code", "rpc.grpc.status_code"];

/// What the span says of how the call ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    pub class: OutcomeClass,
    pub http_status: Option<i32>,
    /// The error's type as the span named it (for the report's attributes).
    pub error: Option<String>,
}

/// Built-in rules for an error's type, tried in order on its lower-cased text: the first
/// fragment found decides. The table's `[errors]` entries are tried before these.
pub const ERROR_RULES: &[(&str, OutcomeClass)] = &[
    ("cancel", OutcomeClass::Cancelled),
    ("ratelimit", OutcomeClass::RateLimited),
    ("rate_limit", OutcomeClass::RateLimited),
    // Node's fetch on AbortSignal.timeout: "The operation was aborted due to timeout".
    ("due to timeout", OutcomeClass::Timeout),
    ("disconnect", OutcomeClass::ConnectionDropped),
    ("reset", OutcomeClass::ConnectionDropped),
    ("abort", OutcomeClass::ConnectionDropped),
    ("broken", OutcomeClass::ConnectionDropped),
    ("connecttimeout", OutcomeClass::ConnectError),
    ("connect", OutcomeClass::ConnectError),
    ("refused", OutcomeClass::ConnectError),
    ("unreachable", OutcomeClass::ConnectError),
    ("unknownhost", OutcomeClass::ConnectError),
    ("nameresolution", OutcomeClass::ConnectError),
    ("dns", OutcomeClass::ConnectError),
    ("timeout", OutcomeClass::Timeout),
    ("timedout", OutcomeClass::Timeout),
    ("timed out", OutcomeClass::Timeout),
    ("deadline", OutcomeClass::Timeout),
    ("remoteprotocol", OutcomeClass::ConnectionDropped),
    ("readerror", OutcomeClass::ConnectionDropped),
    ("closed", OutcomeClass::ConnectionDropped),
    ("eof", OutcomeClass::ConnectionDropped),
    ("incomplete", OutcomeClass::ConnectionDropped),
    ("decode", OutcomeClass::InvalidResponse),
    ("json", OutcomeClass::InvalidResponse),
    ("invalid", OutcomeClass::InvalidResponse),
    ("badrequest", OutcomeClass::ClientError),
    ("notfound", OutcomeClass::ClientError),
    ("authentication", OutcomeClass::ClientError),
    ("permission", OutcomeClass::ClientError),
];

/// The class of an answer: 429 rate limited, 5xx server error, other 4xx client error; None
/// below 400 (the answer was one; the span may still say the call failed after it).
pub fn class_of_status(status: i32) -> Option<OutcomeClass> {
    match status {
        429 => Some(OutcomeClass::RateLimited),
        500..=599 => Some(OutcomeClass::ServerError),
        400..=499 => Some(OutcomeClass::ClientError),
        _ => None,
    }
}

/// The class of an error by its type's text: the table's rules (`own`, fragment → class) first,
/// then the built-in ones; a failure of no known kind is a server error.
pub fn class_of_error(error: &str, own: &[(String, OutcomeClass)]) -> OutcomeClass {
    known_class(error, own).unwrap_or(OutcomeClass::ServerError)
}

/// The class a rule gives `error`'s text, if one does.
fn known_class(error: &str, own: &[(String, OutcomeClass)]) -> Option<OutcomeClass> {
    let e = error.to_ascii_lowercase();
    own.iter()
        .map(|(f, c)| (f.as_str(), *c))
        .chain(ERROR_RULES.iter().copied())
        .find(|(f, _)| e.contains(f))
        .map(|(_, c)| c)
}

/// How `span` ended.
pub fn ended(span: &SpanView<'_>, attrs: Attrs<'_, '_>, own: &[(String, OutcomeClass)]) -> Ended {
    let http_status = STATUS_KEYS[..2]
        .iter()
        .find_map(|k| attrs.int(k))
        .and_then(|s| i32::try_from(s).ok())
        .filter(|s| (100..=999).contains(s));
    let failed = span.status_code == StatusCode::Error as i32;
    let error = attrs
        .text("error.type")
        .map(|e| e.into_owned())
        .or_else(|| {
            span.events
                .iter()
                .filter(|e| e.name == "exception")
                .find_map(|e| Attrs(&e.attrs).text("exception.type").map(|t| t.into_owned()))
        })
        .or_else(|| (failed && !span.status_message.is_empty()).then(|| span.status_message.to_owned()))
        // `error.type` may hold the status code itself ("500"): the code says it already.
        .filter(|e| e.parse::<i32>().ok() != http_status || http_status.is_none());
    let class = match http_status.and_then(class_of_status) {
        Some(c) => c,
        None if failed || (http_status.is_none() && error.is_some()) => {
            // Every text that says what went wrong, the error's type first: the first a rule
            // knows decides.
            let exception = span.events.iter().filter(|e| e.name == "exception");
            let texts = error
                .iter()
                .cloned()
                .chain(exception.flat_map(|e| {
                    let a = Attrs(&e.attrs);
                    [a.text("exception.type"), a.text("exception.message")]
                        .into_iter()
                        .flatten()
                        .map(|t| t.into_owned())
                }))
                .chain((!span.status_message.is_empty()).then(|| span.status_message.to_owned()));
            texts
                .take(8)
                .find_map(|t| known_class(&t, own))
                .unwrap_or(OutcomeClass::ServerError)
        }
        None => OutcomeClass::Success,
    };
    Ended {
        class,
        http_status,
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_types_of_common_clients_are_told_apart() {
        for (e, c) in [
            ("httpx.ConnectError", OutcomeClass::ConnectError),
            ("httpx.ConnectTimeout", OutcomeClass::ConnectError),
            ("httpx.ReadTimeout", OutcomeClass::Timeout),
            ("timeout", OutcomeClass::Timeout),
            ("httpx.RemoteProtocolError", OutcomeClass::ConnectionDropped),
            ("java.net.ConnectException", OutcomeClass::ConnectError),
            ("java.net.SocketTimeoutException", OutcomeClass::Timeout),
            ("ECONNRESET", OutcomeClass::ConnectionDropped),
            ("ECONNREFUSED", OutcomeClass::ConnectError),
            ("RateLimitError", OutcomeClass::RateLimited),
            ("asyncio.CancelledError", OutcomeClass::Cancelled),
            ("InternalServerError", OutcomeClass::ServerError),
            ("json.decoder.JSONDecodeError", OutcomeClass::InvalidResponse),
            ("ServerDisconnectedError", OutcomeClass::ConnectionDropped),
            ("ConnectionResetError", OutcomeClass::ConnectionDropped),
            ("ConnectionAbortedError", OutcomeClass::ConnectionDropped),
            ("ConnectionRefusedError", OutcomeClass::ConnectError),
            ("something else", OutcomeClass::ServerError),
        ] {
            assert_eq!(class_of_error(e, &[]), c, "{e}");
        }
        let own = vec![("weird".to_owned(), OutcomeClass::Timeout)];
        assert_eq!(class_of_error("WeirdFailure", &own), OutcomeClass::Timeout);
    }
}
