//! Which vitals pool and endpoint a gateway's backend and server are (`--map`, TOML):
//!
//! ```toml
//! gateway = "edge-lb-1"        # put on every report (default: the syslog host, else the input)
//! report_unlisted = true       # backends not listed: reported under their own name (default)
//!
//! [[backend]]
//! name = "be_chat"             # HAProxy backend, or nginx upstream (`$proxy_host`)
//! pool = "chat"                # default: the backend's name
//! servers = { s1 = "openai-eu", "10.0.0.7:443" = "azure-west" }   # default: the server's name or address
//!
//! [[backend]]
//! name = "be_static"
//! skip = true                  # never reported, never steered
//! ```
//!
//! vitals-haproxy reads the same table to find the server a decision is about.

use crate::Attempt;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use vitals_contracts::{validate_name, CallOutcome};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    gateway: Option<String>,
    #[serde(default = "yes")]
    report_unlisted: bool,
    #[serde(default, rename = "backend")]
    backends: Vec<Backend>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Backend {
    name: String,
    pool: Option<String>,
    #[serde(default)]
    servers: BTreeMap<String, String>,
    #[serde(default)]
    skip: bool,
}

/// The table, indexed.
#[derive(Debug, Clone)]
pub struct Map {
    pub gateway: Option<String>,
    report_unlisted: bool,
    backends: HashMap<String, Backend>,
}

impl Default for Map {
    /// Every backend under its own name, every server under its own name.
    fn default() -> Map {
        Map {
            gateway: None,
            report_unlisted: true,
            backends: HashMap::new(),
        }
    }
}

impl Map {
    /// Parse and check the table; the error names the backend and the field.
    pub fn parse(text: &str) -> Result<Map, String> {
        let f: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut backends = HashMap::new();
        if let Some(g) = &f.gateway {
            validate_name("gateway", g).map_err(|e| e.to_string())?;
        }
        for b in f.backends {
            let at = |e: String| format!("backend {:?}: {e}", b.name);
            validate_name("name", &b.name).map_err(|e| at(e.to_string()))?;
            if let Some(p) = &b.pool {
                validate_name("pool", p).map_err(|e| at(e.to_string()))?;
            }
            for (server, endpoint) in &b.servers {
                validate_name("servers", endpoint).map_err(|e| at(format!("server {server:?}: {e}")))?;
            }
            if backends.contains_key(&b.name) {
                return Err(at("listed twice".into()));
            }
            backends.insert(b.name.clone(), b);
        }
        Ok(Map {
            gateway: f.gateway,
            report_unlisted: f.report_unlisted,
            backends,
        })
    }

    /// The pool and endpoint of `server` in `backend`, or None if the backend is not reported.
    pub fn resolve<'a>(&'a self, backend: &'a str, server: &'a str) -> Option<(&'a str, &'a str)> {
        match self.backends.get(backend) {
            Some(b) if b.skip => None,
            Some(b) => Some((
                b.pool.as_deref().unwrap_or(backend),
                b.servers.get(server).map_or(server, String::as_str),
            )),
            None if self.report_unlisted => Some((backend, server)),
            None => None,
        }
    }

    /// The report of `a` from `gateway`, or None if its backend is not reported. The names are
    /// checked by the processor as by any report; attributes keep the gateway's own names.
    pub fn outcome(&self, a: &Attempt<'_>, gateway: &str) -> Option<CallOutcome> {
        let (pool, endpoint) = self.resolve(a.backend, a.server)?;
        let mut attributes = BTreeMap::new();
        if endpoint != a.server {
            attributes.insert("gateway.server".to_owned(), a.server.to_owned());
        }
        if pool != a.backend {
            attributes.insert("gateway.backend".to_owned(), a.backend.to_owned());
        }
        if let Some(d) = a.detail {
            attributes.insert("gateway.termination".to_owned(), d.to_owned());
        }
        Some(CallOutcome {
            event_id: a.id.clone(),
            pool: pool.to_owned(),
            endpoint: endpoint.to_owned(),
            gateway: self.gateway.as_deref().unwrap_or(gateway).to_owned(),
            occurred_at: a.started_us,
            outcome: a.outcome,
            http_status: a.status,
            latency_us: a.latency_us,
            ttft_us: None,
            tpot_us: None,
            attributes,
            model: None,
            retry_after_ms: a.retry_after_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vitals_contracts::OutcomeClass;

    const TABLE: &str = r#"
gateway = "lb-1"
[[backend]]
name = "be_chat"
pool = "chat"
servers = { s1 = "openai-eu" }
[[backend]]
name = "be_static"
skip = true
"#;

    #[test]
    fn listed_names_are_mapped_and_the_rest_kept() {
        let m = Map::parse(TABLE).unwrap();
        assert_eq!(m.resolve("be_chat", "s1"), Some(("chat", "openai-eu")));
        assert_eq!(m.resolve("be_chat", "s2"), Some(("chat", "s2")));
        assert_eq!(m.resolve("be_other", "x"), Some(("be_other", "x")));
        assert_eq!(m.resolve("be_static", "x"), None);
        let strict = Map::parse("report_unlisted = false").unwrap();
        assert_eq!(strict.resolve("be_other", "x"), None);
    }

    #[test]
    fn an_attempt_becomes_a_report_with_the_gateways_names_kept() {
        let m = Map::parse(TABLE).unwrap();
        let a = Attempt {
            backend: "be_chat",
            server: "s1",
            id: "r1".into(),
            started_us: 5,
            outcome: OutcomeClass::ConnectError,
            status: Some(503),
            latency_us: 7,
            retry_after_ms: None,
            detail: Some("SC--"),
        };
        let o = m.outcome(&a, "from-syslog").unwrap();
        assert_eq!(
            (o.pool.as_str(), o.endpoint.as_str(), o.gateway.as_str()),
            ("chat", "openai-eu", "lb-1")
        );
        assert_eq!(o.attributes["gateway.server"], "s1");
        assert_eq!(o.attributes["gateway.termination"], "SC--");
        assert!(vitals_contracts::encode(&o).is_ok());
    }

    #[test]
    fn a_bad_table_names_the_backend_and_the_field() {
        let e = Map::parse("[[backend]]\nname = \"b\"\npool = \"\"\n").unwrap_err();
        assert!(e.contains("backend \"b\"") && e.contains("pool"), "{e}");
        let e = Map::parse("[[backend]]\nname = \"b\"\n[[backend]]\nname = \"b\"\n").unwrap_err();
        assert!(e.contains("twice"), "{e}");
        let e = Map::parse("[[backend]]\nname = \"b\"\nweight = 3\n").unwrap_err();
        assert!(e.contains("weight"), "{e}");
    }
}
