//! Name templates: how the table says where a pool, an endpoint or a gateway name comes from.
//!
//! A template is text with fields in braces, e.g. `"{server.address}:{server.port}"`. A field is
//! a span attribute (`{http.route}`), a resource attribute (`{resource:service.name}`) or the
//! span's name (`{span.name}`), or the reporter the request was authenticated as (`{reporter}`:
//! the token's name; nothing without authentication); `#key` reads a field of an attribute holding a JSON object
//! (`{hidden_params#api_base}`: LiteLLM's); `|host` and `|hostport` read a URL's host, or host
//! and port (the scheme's default port when none is written). A template gives a name only when
//! every field in it is present and not empty, so a list of templates is tried in order.

use crate::attrs::Attrs;

#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    parts: Vec<Part>,
    source: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Field(Field),
}

#[derive(Debug, Clone, PartialEq)]
struct Field {
    scope: Scope,
    key: String,
    json: Option<String>,
    filter: Filter,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Scope {
    Span,
    Resource,
    SpanName,
    Reporter,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Filter {
    None,
    Host,
    HostPort,
}

/// What a template reads from: one span's attributes, its resource's, and its name.
pub struct Subject<'s, 'a> {
    pub span: Attrs<'s, 'a>,
    pub resource: Attrs<'s, 'a>,
    pub name: &'a str,
    /// The token's name the request was authenticated with.
    pub reporter: Option<&'a str>,
}

impl Template {
    /// Parse `text`; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find('{') {
                Some(0) => {
                    let end = rest
                        .find('}')
                        .ok_or_else(|| format!("template {text:?}: a '{{' without its '}}'"))?;
                    parts.push(Part::Field(
                        Field::parse(&rest[1..end]).map_err(|e| format!("template {text:?}: {e}"))?,
                    ));
                    rest = &rest[end + 1..];
                }
                Some(i) => {
                    parts.push(Part::Text(rest[..i].to_owned()));
                    rest = &rest[i..];
                }
                None => {
                    if rest.contains('}') {
                        return Err(format!("template {text:?}: a '}}' without its '{{'"));
                    }
                    parts.push(Part::Text(rest.to_owned()));
                    rest = "";
                }
            }
        }
        if parts.is_empty() {
            return Err("a template must not be empty".into());
        }
        if let Some(Part::Text(t)) = parts.iter().find(|p| matches!(p, Part::Text(t) if t.contains('}'))) {
            return Err(format!("template {text:?}: a '}}' without its '{{' in {t:?}"));
        }
        Ok(Template {
            parts,
            source: text.to_owned(),
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The name this template gives for `s`, or None if a field is missing or empty.
    pub fn render(&self, s: &Subject<'_, '_>) -> Option<String> {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Field(f) => out.push_str(&f.value(s)?),
            }
        }
        Some(out)
    }
}

impl Field {
    fn parse(inner: &str) -> Result<Field, String> {
        let (inner, filter) = match inner.split_once('|') {
            Some((f, "host")) => (f, Filter::Host),
            Some((f, "hostport")) => (f, Filter::HostPort),
            Some((_, other)) => return Err(format!("unknown filter {other:?} (host, hostport)")),
            None => (inner, Filter::None),
        };
        let (inner, json) = match inner.split_once('#') {
            Some((f, k)) if !k.is_empty() => (f, Some(k.to_owned())),
            Some(_) => return Err("'#' needs a JSON key after it".into()),
            None => (inner, None),
        };
        let (scope, key) = match inner.split_once(':') {
            Some(("resource", k)) => (Scope::Resource, k),
            Some((other, _)) => return Err(format!("unknown scope {other:?} (resource)")),
            None if inner == "span.name" => (Scope::SpanName, inner),
            None if inner == "reporter" => (Scope::Reporter, inner),
            None => (Scope::Span, inner),
        };
        if key.trim().is_empty() {
            return Err("a field needs an attribute name".into());
        }
        Ok(Field {
            scope,
            key: key.to_owned(),
            json,
            filter,
        })
    }

    fn value(&self, s: &Subject<'_, '_>) -> Option<String> {
        let raw = match self.scope {
            Scope::SpanName => std::borrow::Cow::Borrowed(s.name),
            Scope::Span => s.span.text(&self.key)?,
            // An SDK names a service it was not told the name of `unknown_service` (or
            // `unknown_service:<process>`): that is no name (the semantic conventions).
            Scope::Resource if self.key == "service.name" => s
                .resource
                .text(&self.key)
                .filter(|n| n != "unknown_service" && !n.starts_with("unknown_service:"))?,
            Scope::Resource => s.resource.text(&self.key)?,
            Scope::Reporter => std::borrow::Cow::Borrowed(s.reporter?),
        };
        let raw = match &self.json {
            None => raw,
            Some(k) => std::borrow::Cow::Owned(json_field(&raw, k)?),
        };
        let v = match self.filter {
            Filter::None => raw.into_owned(),
            Filter::Host => url_host(&raw, false)?,
            Filter::HostPort => url_host(&raw, true)?,
        };
        (!v.trim().is_empty()).then_some(v)
    }
}

/// A field of a JSON object held in text, as text (strings as they are, numbers and booleans
/// written out).
fn json_field(text: &str, key: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    match v.get(key)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The host of an absolute URL (`scheme://[user@]host[:port]/…`), with its port when asked
/// (written, or the scheme's default: 80 for http and ws, 443 for https and wss).
pub fn url_host(url: &str, with_port: bool) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if authority.is_empty() {
        return None;
    }
    // An IPv6 literal keeps its brackets; the port is after them.
    let (host, port) = if let Some(end) = authority.find(']') {
        let host = &authority[..=end];
        (host, authority[end + 1..].strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() || port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    let host = host.to_ascii_lowercase();
    if !with_port {
        return Some(host);
    }
    let port = port
        .map(str::to_owned)
        .or_else(|| match scheme.to_ascii_lowercase().as_str() {
            "http" | "ws" => Some("80".into()),
            "https" | "wss" => Some("443".into()),
            _ => None,
        });
    Some(match port {
        Some(p) => format!("{host}:{p}"),
        None => host,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};

    fn kv(k: &str, v: Value) -> KeyValue {
        KeyValue {
            key: k.into(),
            key_strindex: 0,
            value: Some(AnyValue { value: Some(v) }),
        }
    }

    #[test]
    fn fields_are_read_from_the_span_the_resource_json_and_urls() {
        let span = vec![
            kv("server.address", Value::StringValue("api.example".into())),
            kv("server.port", Value::IntValue(8443)),
            kv(
                "url.full",
                Value::StringValue("https://user@Api.Example/v1/chat?x=1".into()),
            ),
            kv(
                "hidden_params",
                Value::StringValue(r#"{"model_id":"e1","api_base":"http://127.0.0.1:9001/v1"}"#.into()),
            ),
        ];
        let resource = vec![kv("service.name", Value::StringValue("checkout".into()))];
        let (span, resource) = (crate::view::attrs_of(&span), crate::view::attrs_of(&resource));
        let s = Subject {
            span: Attrs(&span),
            resource: Attrs(&resource),
            name: "GET",
            reporter: Some("edge-eu"),
        };
        let r = |t: &str| Template::parse(t).unwrap().render(&s);
        assert_eq!(r("{server.address}:{server.port}").as_deref(), Some("api.example:8443"));
        assert_eq!(r("{url.full|hostport}").as_deref(), Some("api.example:443"));
        assert_eq!(r("{url.full|host}").as_deref(), Some("api.example"));
        assert_eq!(r("{hidden_params#model_id}").as_deref(), Some("e1"));
        assert_eq!(
            r("{hidden_params#api_base|hostport}").as_deref(),
            Some("127.0.0.1:9001")
        );
        assert_eq!(
            r("{resource:service.name}/{span.name}").as_deref(),
            Some("checkout/GET")
        );
        assert_eq!(r("fixed").as_deref(), Some("fixed"));
        assert_eq!(r("{reporter}").as_deref(), Some("edge-eu"));
        assert_eq!(r("{gen_ai.request.model}"), None, "a missing field gives nothing");
        assert_eq!(r("{hidden_params#nope}"), None);
    }

    #[test]
    fn bad_templates_say_what_is_wrong() {
        for (t, says) in [
            ("{a", "without its"),
            ("a}", "without its"),
            ("{}", "attribute name"),
            ("{a|upper}", "unknown filter"),
            ("{span:x}", "unknown scope"),
            ("{a#}", "JSON key"),
            ("", "empty"),
        ] {
            let e = Template::parse(t).unwrap_err();
            assert!(e.contains(says), "{t:?}: {e}");
        }
    }

    #[test]
    fn urls_give_their_host_and_port() {
        assert_eq!(url_host("http://h/x", true).as_deref(), Some("h:80"));
        assert_eq!(url_host("http://[::1]:81/x", true).as_deref(), Some("[::1]:81"));
        assert_eq!(url_host("grpc://h", true).as_deref(), Some("h"));
        assert_eq!(url_host("no scheme", true), None);
        assert_eq!(url_host("http://h:x/", true), None);
        assert_eq!(url_host("http:///x", true), None);
    }
}
