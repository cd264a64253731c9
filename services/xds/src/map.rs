//! Where an endpoint is: its name when that is `host:port` (an OTLP endpoint is named
//! `server.address:server.port`), or an entry of the address map (TOML) for names that are not:
//!
//! ```toml
//! [[endpoint]]
//! pool = "chat"
//! endpoint = "chat-a"
//! address = "10.0.0.5:8443"
//! zone = "eu-west-1a"    # optional: a locality per zone
//! ```
//!
//! The map's endpoints of a pool are served even before vitals has heard of them (healthy, at
//! full weight), as a view serves an endpoint it has no word of.

use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Address<'a> {
    pub host: &'a str,
    pub port: u16,
    /// "" for none.
    pub zone: &'a str,
}

#[derive(Debug, Default, Clone)]
pub struct AddressMap {
    /// (pool, endpoint) → (host, port, zone).
    entries: BTreeMap<(String, String), (String, u16, String)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    endpoint: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    pool: String,
    endpoint: String,
    address: String,
    #[serde(default)]
    zone: String,
}

/// `host:port` (a bracketed IPv6 host too), or None.
pub fn host_port(s: &str) -> Option<(&str, u16)> {
    let (host, port) = s.rsplit_once(':')?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    (!host.is_empty() && !host.contains(char::is_whitespace) && !host.contains('/')).then_some((host, port))
}

impl AddressMap {
    pub fn parse(text: &str) -> Result<AddressMap, String> {
        let f: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut entries = BTreeMap::new();
        for (i, e) in f.endpoint.into_iter().enumerate() {
            let at = format!("endpoint {} ({}/{})", i + 1, e.pool, e.endpoint);
            if e.pool.is_empty() || e.endpoint.is_empty() {
                return Err(format!("{at}: pool and endpoint must not be empty"));
            }
            let (host, port) =
                host_port(&e.address).ok_or_else(|| format!("{at}: address {:?} is not host:port", e.address))?;
            let key = (e.pool.clone(), e.endpoint.clone());
            if entries.insert(key, (host.to_owned(), port, e.zone)).is_some() {
                return Err(format!("{at}: listed twice"));
            }
        }
        Ok(AddressMap { entries })
    }

    /// Where `endpoint` of `pool` is: the map's entry, or its name when that is `host:port`.
    pub fn address<'a>(&'a self, pool: &str, endpoint: &'a str) -> Option<Address<'a>> {
        match self.entries.get(&(pool.to_owned(), endpoint.to_owned())) {
            Some((host, port, zone)) => Some(Address {
                host,
                port: *port,
                zone,
            }),
            None => host_port(endpoint).map(|(host, port)| Address { host, port, zone: "" }),
        }
    }

    /// The map's endpoints of `pool`.
    pub fn endpoints_of<'a>(&'a self, pool: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.entries
            .keys()
            .filter(move |(p, _)| p == pool)
            .map(|(_, e)| e.as_str())
    }

    /// The pools the map names.
    pub fn pools(&self) -> impl Iterator<Item = &str> {
        let mut last: Option<&str> = None;
        self.entries.keys().filter_map(move |(p, _)| {
            let new = last != Some(p.as_str());
            last = Some(p.as_str());
            new.then_some(p.as_str())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_addresses_need_no_map_and_the_map_names_the_rest() {
        let m = AddressMap::parse(
            "[[endpoint]]\npool = \"chat\"\nendpoint = \"chat-a\"\naddress = \"10.0.0.5:8443\"\nzone = \"z\"\n\
             [[endpoint]]\npool = \"chat\"\nendpoint = \"chat-b\"\naddress = \"[::1]:9000\"\n",
        )
        .unwrap();
        assert_eq!(
            m.address("chat", "chat-a"),
            Some(Address {
                host: "10.0.0.5",
                port: 8443,
                zone: "z"
            })
        );
        assert_eq!(m.address("chat", "chat-b").unwrap().host, "::1");
        assert_eq!(
            m.address("other", "127.0.0.1:80"),
            Some(Address {
                host: "127.0.0.1",
                port: 80,
                zone: ""
            })
        );
        assert_eq!(m.address("chat", "chat-c"), None);
        assert_eq!(m.endpoints_of("chat").collect::<Vec<_>>(), ["chat-a", "chat-b"]);
        assert_eq!(m.pools().collect::<Vec<_>>(), ["chat"]);
        for bad in ["host", "host:0", "host:x", ":80", "a b:80"] {
            assert_eq!(host_port(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_bad_map_is_refused_naming_the_entry() {
        let e = AddressMap::parse("[[endpoint]]\npool = \"p\"\nendpoint = \"e\"\naddress = \"nowhere\"\n").unwrap_err();
        assert!(e.contains("endpoint 1 (p/e)") && e.contains("not host:port"), "{e}");
        let e = AddressMap::parse("[[endpoint]]\npool = \"p\"\nendpoint = \"e\"\naddress = \"h:1\"\nweight = 3\n")
            .unwrap_err();
        assert!(e.contains("weight"), "{e}");
        let twice = "[[endpoint]]\npool = \"p\"\nendpoint = \"e\"\naddress = \"h:1\"\n";
        assert!(AddressMap::parse(&format!("{twice}{twice}"))
            .unwrap_err()
            .contains("listed twice"));
    }
}
