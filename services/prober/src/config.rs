//! Probe targets: a TOML file, checked as a whole before it replaces the running set. Every
//! error names the line and the field. A target is a plain value with a stable id, so that the
//! same model can later come from the API.

use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use vitals_contracts::validate_name;

/// What a probe does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// An HTTP request; the status must be one of `expect_status`, and the body may be asserted.
    Http,
    /// A TCP connect.
    Tcp,
    /// An HTTP route answering JSON with `dependencies: [{name, critical, status}]`.
    DeepHealth,
    /// A streamed OpenAI-compatible chat completion: time to the first content token and per
    /// output token.
    Completion,
}

/// Defaults every target inherits.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Defaults {
    pub interval_ms: u64,
    /// Interval while the endpoint is suspect, unhealthy or recovering (adaptive cadence).
    pub fast_interval_ms: u64,
    /// Interval while the endpoint is healthy and gateway calls reach it (its calls are
    /// evidence already); 0: three times `interval_ms`.
    pub traffic_interval_ms: u64,
    pub timeout_ms: u64,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            interval_ms: 5_000,
            fast_interval_ms: 1_000,
            traffic_interval_ms: 0,
            timeout_ms: 2_000,
        }
    }
}

/// One probe target, as written in the file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetSpec {
    pub id: String,
    pub pool: String,
    pub endpoint: String,
    pub kind: Kind,
    /// For `http`, `deep_health` and `completion`.
    pub url: Option<String>,
    /// For `tcp`: host:port.
    pub address: Option<String>,
    #[serde(default)]
    pub method: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Statuses that pass (`http`); default 200–299.
    #[serde(default)]
    pub expect_status: Vec<u16>,
    /// The body must match this regular expression (`http`).
    pub body_regex: Option<String>,
    /// The JSON value at this pointer (RFC 6901) must equal `body_equals` (`http`).
    pub body_json_pointer: Option<String>,
    pub body_equals: Option<serde_json::Value>,
    /// A new connection for every probe, so that connect failures are seen (default: the
    /// prober's own pool, never shared with gateway traffic).
    #[serde(default)]
    pub fresh_connection: bool,
    pub interval_ms: Option<u64>,
    pub fast_interval_ms: Option<u64>,
    pub traffic_interval_ms: Option<u64>,
    pub timeout_ms: Option<u64>,
    /// `completion`: the model to ask, the tokens to ask for (reasoning models fail with 1), and
    /// the tokens a day this target may spend.
    pub model: Option<String>,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    pub daily_token_budget: Option<u64>,
}

fn default_max_tokens() -> u32 {
    5
}

/// The file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    defaults: Defaults,
    #[serde(default, rename = "target")]
    targets: Vec<toml::Spanned<TargetSpec>>,
}

/// A body assertion: a regular expression, equal to another when its pattern is.
#[derive(Debug, Clone)]
pub struct Pattern(pub regex::Regex);

impl PartialEq for Pattern {
    fn eq(&self, other: &Pattern) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl std::ops::Deref for Pattern {
    type Target = regex::Regex;

    fn deref(&self) -> &regex::Regex {
        &self.0
    }
}

/// A checked target, with every default applied. Two equal targets probe the same way: a
/// reload that leaves a target equal keeps its schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub id: String,
    pub pool: String,
    pub endpoint: String,
    pub kind: Kind,
    /// URL (http kinds) or host:port (tcp).
    pub address: String,
    pub method: String,
    pub headers: Vec<(String, String)>,
    pub expect_status: Vec<u16>,
    pub body_regex: Option<Pattern>,
    pub body_json: Option<(String, serde_json::Value)>,
    pub fresh_connection: bool,
    pub interval: Duration,
    pub fast_interval: Duration,
    pub traffic_interval: Duration,
    pub timeout: Duration,
    pub model: String,
    pub max_tokens: u32,
    pub daily_token_budget: Option<u64>,
}

impl Target {
    /// Whether a probe's status passes.
    pub fn status_passes(&self, status: u16) -> bool {
        if self.expect_status.is_empty() {
            (200..300).contains(&status)
        } else {
            self.expect_status.contains(&status)
        }
    }
}

/// A configuration error: where, which field, what.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}: {target}{}{message}", if field.is_empty() { String::new() } else { format!("{field}: ") })]
pub struct ConfigError {
    pub line: usize,
    /// `target "id" ` or empty.
    pub target: String,
    pub field: String,
    pub message: String,
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The line of `key = ` inside the span of a target, else the target's first line.
fn field_line(text: &str, span: &std::ops::Range<usize>, key: &str) -> usize {
    let body = &text[span.start.min(text.len())..span.end.min(text.len())];
    let mut offset = 0;
    for l in body.split_inclusive('\n') {
        let t = l.trim_start();
        if t.strip_prefix(key)
            .is_some_and(|rest| rest.trim_start().starts_with('='))
        {
            return line_of(text, span.start + offset);
        }
        offset += l.len();
    }
    line_of(text, span.start)
}

/// Where in the file `line` is: `[defaults] `, `target "id" ` (the id as written in that
/// target's table, if any), or nothing; and the key written on that line.
fn place(text: &str, line: usize) -> (String, String) {
    let lines: Vec<&str> = text.lines().collect();
    let key = lines
        .get(line.saturating_sub(1))
        .and_then(|l| l.split_once('='))
        .map(|(k, _)| k.trim().trim_matches('"').to_owned())
        .filter(|k| !k.is_empty() && !k.starts_with('['))
        .unwrap_or_default();
    let header = (0..line.min(lines.len()))
        .rev()
        .find(|&i| lines[i].trim_start().starts_with('['));
    let section = match header {
        Some(h) if lines[h].trim() == "[defaults]" => "[defaults] ".to_owned(),
        Some(h) if lines[h].trim() == "[[target]]" => {
            let id = lines[h + 1..]
                .iter()
                .take_while(|l| !l.trim_start().starts_with('['))
                .find_map(|l| {
                    let (k, v) = l.split_once('=')?;
                    (k.trim() == "id").then(|| v.trim().trim_matches('"').to_owned())
                });
            id.map_or_else(|| "target (no id) ".to_owned(), |id| format!("target {id:?} "))
        }
        _ => String::new(),
    };
    (section, key)
}

/// The span of the `[defaults]` table's lines, if the file has one.
fn defaults_span(text: &str) -> Option<std::ops::Range<usize>> {
    let start = text
        .match_indices("[defaults]")
        .find(|(i, _)| *i == 0 || text.as_bytes()[i - 1] == b'\n')?
        .0;
    let rest = &text[start + 1..];
    let end = rest
        .match_indices("\n[")
        .next()
        .map_or(text.len(), |(i, _)| start + 1 + i + 1);
    Some(start..end)
}

/// Parse and check a whole file: every target valid, ids unique.
pub fn parse(text: &str) -> Result<Vec<Target>, ConfigError> {
    let file: File = toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(1, |s| line_of(text, s.start));
        let (target, field) = place(text, line);
        ConfigError {
            line,
            target,
            field,
            message: e.message().to_owned(),
        }
    })?;
    let d = &file.defaults;
    // A value the target inherits from `[defaults]` is wrong where it is written.
    let defaults = defaults_span(text);
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(file.targets.len());
    for spanned in &file.targets {
        let span = spanned.span();
        let spec = spanned.get_ref();
        let inherited = |field: &str| match field {
            "interval_ms" => spec.interval_ms.is_none(),
            "fast_interval_ms" => spec.fast_interval_ms.is_none(),
            "traffic_interval_ms" => spec.traffic_interval_ms.is_none(),
            "timeout_ms" => spec.timeout_ms.is_none(),
            _ => false,
        };
        let err = |field: &str, message: String| match &defaults {
            Some(d) if inherited(field) => ConfigError {
                line: field_line(text, d, field),
                target: "[defaults] ".to_owned(),
                field: field.to_owned(),
                message,
            },
            _ => ConfigError {
                line: field_line(text, &span, field),
                target: format!("target {:?} ", spec.id),
                field: field.to_owned(),
                message,
            },
        };
        for (field, v) in [("id", &spec.id), ("pool", &spec.pool), ("endpoint", &spec.endpoint)] {
            validate_name("name", v).map_err(|e| err(field, e.message))?;
        }
        if !seen.insert(spec.id.clone()) {
            return Err(err("id", "another target has this id".into()));
        }
        let interval = spec.interval_ms.unwrap_or(d.interval_ms);
        let fast = spec.fast_interval_ms.unwrap_or(d.fast_interval_ms).min(interval);
        let timeout = spec.timeout_ms.unwrap_or(d.timeout_ms);
        let traffic = match spec.traffic_interval_ms.unwrap_or(d.traffic_interval_ms) {
            0 => interval.saturating_mul(3).min(3_600_000),
            t => t,
        };
        if traffic < interval || traffic > 3_600_000 {
            return Err(err(
                "traffic_interval_ms",
                format!("{traffic} ms must be within interval_ms ({interval} ms)..=3600000"),
            ));
        }
        if !(100..=3_600_000).contains(&interval) {
            return Err(err("interval_ms", format!("{interval} ms is not within 100..=3600000")));
        }
        if fast < 100 {
            return Err(err("fast_interval_ms", format!("{fast} ms is less than 100")));
        }
        if timeout == 0 || timeout >= fast {
            return Err(err(
                "timeout_ms",
                format!("{timeout} ms must be above 0 and shorter than the fastest interval ({fast} ms)"),
            ));
        }
        let address = match spec.kind {
            Kind::Tcp => {
                let a = spec
                    .address
                    .clone()
                    .ok_or_else(|| err("address", "a tcp target needs address = \"host:port\"".into()))?;
                if !a
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
                {
                    return Err(err("address", format!("{a:?} is not host:port")));
                }
                a
            }
            _ => {
                let u = spec
                    .url
                    .clone()
                    .ok_or_else(|| err("url", "this kind of target needs url".into()))?;
                let parsed = reqwest::Url::parse(&u).map_err(|e| err("url", format!("{u:?}: {e}")))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(err("url", format!("{u:?}: only http and https")));
                }
                u
            }
        };
        let method = spec.method.clone().unwrap_or_else(|| "GET".into()).to_ascii_uppercase();
        if !matches!(method.as_str(), "GET" | "HEAD" | "POST" | "PUT" | "OPTIONS") {
            return Err(err(
                "method",
                format!("{method:?} is not GET, HEAD, POST, PUT or OPTIONS"),
            ));
        }
        for (k, v) in &spec.headers {
            if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err()
                || reqwest::header::HeaderValue::from_str(v).is_err()
            {
                return Err(err("headers", format!("{k:?} is not a valid header")));
            }
        }
        if spec.expect_status.iter().any(|s| !(100..=599).contains(s)) {
            return Err(err("expect_status", "statuses are within 100..=599".into()));
        }
        let body_regex = spec
            .body_regex
            .as_deref()
            .map(|r| regex::Regex::new(r).map(Pattern))
            .transpose()
            .map_err(|e| err("body_regex", e.to_string()))?;
        let body_json = match (&spec.body_json_pointer, &spec.body_equals) {
            (None, None) => None,
            (Some(p), Some(v)) if p.is_empty() || p.starts_with('/') => Some((p.clone(), v.clone())),
            (Some(p), Some(_)) => return Err(err("body_json_pointer", format!("{p:?} must start with '/'"))),
            (Some(_), None) => return Err(err("body_equals", "body_json_pointer needs body_equals".into())),
            (None, Some(_)) => return Err(err("body_json_pointer", "body_equals needs body_json_pointer".into())),
        };
        if spec.kind == Kind::Completion {
            if spec.model.as_deref().is_none_or(str::is_empty) {
                return Err(err("model", "a completion target needs model".into()));
            }
            if !(1..=4096).contains(&spec.max_tokens) {
                return Err(err("max_tokens", format!("{} is not within 1..=4096", spec.max_tokens)));
            }
        }
        out.push(Target {
            id: spec.id.clone(),
            pool: spec.pool.clone(),
            endpoint: spec.endpoint.clone(),
            kind: spec.kind,
            address,
            method,
            headers: spec.headers.clone().into_iter().collect(),
            expect_status: spec.expect_status.clone(),
            body_regex,
            body_json,
            fresh_connection: spec.fresh_connection,
            interval: Duration::from_millis(interval),
            fast_interval: Duration::from_millis(fast),
            traffic_interval: Duration::from_millis(traffic),
            timeout: Duration::from_millis(timeout),
            model: spec.model.clone().unwrap_or_default(),
            max_tokens: spec.max_tokens,
            daily_token_budget: spec.daily_token_budget,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[defaults]
interval_ms = 2000
timeout_ms = 500

[[target]]
id = "a-health"
pool = "gpt"
endpoint = "a"
kind = "http"
url = "http://127.0.0.1:9101/health"
body_json_pointer = "/status"
body_equals = "ok"

[[target]]
id = "a-tcp"
pool = "gpt"
endpoint = "a"
kind = "tcp"
address = "127.0.0.1:9101"
"#;

    #[test]
    fn a_good_file_parses_with_its_defaults() {
        let t = parse(GOOD).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].interval, Duration::from_millis(2000));
        assert_eq!(t[0].fast_interval, Duration::from_millis(1000));
        assert_eq!(t[0].traffic_interval, Duration::from_millis(6000));
        assert_eq!(t[0].method, "GET");
        assert!(t[0].status_passes(204) && !t[0].status_passes(301));
        assert_eq!(t[1].address, "127.0.0.1:9101");
    }

    #[test]
    fn the_shipped_example_parses() {
        let t = parse(include_str!("../../../deploy/prober/targets.toml")).unwrap();
        assert_eq!(t.len(), 4);
        assert!(t
            .iter()
            .any(|t| t.kind == Kind::Completion && t.daily_token_budget == Some(200_000)));
    }

    #[test]
    fn errors_name_the_line_and_the_field() {
        let cases = [
            (
                GOOD.replace("address = \"127.0.0.1:9101\"", "address = \"nowhere\""),
                20,
                "address",
            ),
            // A default that no target can live with: where it is written, in [defaults].
            (GOOD.replace("timeout_ms = 500", "timeout_ms = 5000"), 4, "timeout_ms"),
            (
                GOOD.replace("body_json_pointer = \"/status\"", "body_json_pointer = \"status\""),
                12,
                "body_json_pointer",
            ),
            (GOOD.replace("id = \"a-tcp\"", "id = \"a-health\""), 16, "id"),
            // The parser's own errors name the field too.
            (GOOD.replace("kind = \"tcp\"", "kind = \"udp\""), 19, "kind"),
            (GOOD.replace("url = ", "uri = "), 11, "uri"),
        ];
        for (text, line, field) in cases {
            let e = parse(&text).unwrap_err();
            assert_eq!((e.line, e.field.as_str()), (line, field), "{e}");
        }
        let e = parse(&GOOD.replace("kind = \"tcp\"", "kind = \"udp\"")).unwrap_err();
        assert_eq!(
            e.to_string()
                .lines()
                .next()
                .unwrap()
                .split(", expected")
                .next()
                .unwrap(),
            "line 19: target \"a-tcp\" kind: unknown variant `udp`"
        );
        let e = parse(&GOOD.replace("kind = \"tcp\"", "kind = \"tcp\"\nfresh_connection = \"yes\"")).unwrap_err();
        assert_eq!(
            (e.line, e.target.as_str(), e.field.as_str()),
            (20, "target \"a-tcp\" ", "fresh_connection"),
            "the parser's error names the target and the field: {e}"
        );
        let e = parse(&GOOD.replace("timeout_ms = 500", "timeout_ms = 0")).unwrap_err();
        assert_eq!(
            (e.line, e.target.as_str(), e.field.as_str()),
            (4, "[defaults] ", "timeout_ms"),
            "an inherited value is wrong where it is written: {e}"
        );
        let e = parse(&GOOD.replace("address = \"127.0.0.1:9101\"", "address = \"nowhere\"")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 20: target \"a-tcp\" address: \"nowhere\" is not host:port"
        );
    }
}
