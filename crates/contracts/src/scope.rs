//! Scopes: who saw a call. A call's outcome is the endpoint's, or only its reporters': the
//! gateway that made it (`gateway=g1`), the location it was made from (`location=eu-west-1`,
//! from the call's `location` attribute; vitals-otlp fills it from OpenTelemetry's
//! `cloud.region`, or `cloud.availability_zone` without one) and the credential it used
//! (`key=k1`, from its `key_id` attribute: an opaque id, never the secret). The engine compares
//! the scopes' failures with the rest's (docs/decisions.md, "Scoped health") and decides per
//! scope; a router applies the fleet's decisions and those of the scopes it is in
//! ([`Identity`]).

use crate::{CallOutcome, HealthState, OutcomeClass};

/// The call attribute that names where the call was made from.
pub const LOCATION_ATTRIBUTE: &str = "location";

/// A call attribute (`"true"`): count the call's outcome, not its timing — a gateway's first
/// call to an upstream, whose latency is its own cold start (a client made, a connection
/// opened), not the upstream's. Its latency and first token are kept out of the engine's.
pub const UNTIMED_ATTRIBUTE: &str = "vitals.untimed";
/// The call attribute that names the credential the call used (an opaque id).
pub const KEY_ATTRIBUTE: &str = "key_id";

/// The kinds of scope, as they begin a scope's name.
pub const KINDS: [&str; 3] = ["gateway", "location", "key"];

/// A scope's name: `kind=value`.
pub fn name(kind: &str, value: &str) -> String {
    let mut s = String::with_capacity(kind.len() + 1 + value.len());
    write_name(&mut s, kind, value);
    s
}

/// [`name`] written into `into`, which is cleared first (its buffer is kept).
fn write_name(into: &mut String, kind: &str, value: &str) {
    into.clear();
    into.push_str(kind);
    into.push('=');
    into.push_str(value);
}

/// Whether `scope` is [`name`]`(kind, value)`, without building it.
pub fn is_named(scope: &str, kind: &str, value: &str) -> bool {
    scope
        .strip_prefix(kind)
        .and_then(|rest| rest.strip_prefix('='))
        .is_some_and(|rest| rest == value)
}

/// A scope's kind and value, if `scope` is a well-formed scope name.
pub fn parse(scope: &str) -> Result<(&str, &str), String> {
    let (kind, value) = scope
        .split_once('=')
        .ok_or_else(|| format!("scope {scope:?} is not kind=value (e.g. gateway=g1)"))?;
    if !KINDS.contains(&kind) {
        return Err(format!("scope {scope:?}: the kind must be one of {}", KINDS.join(", ")));
    }
    if value.is_empty() || value.len() > 200 || value.chars().any(char::is_control) {
        return Err(format!(
            "scope {scope:?}: the value must be 1 to 200 printable characters"
        ));
    }
    Ok((kind, value))
}

/// The scopes of a call, narrowest first: its gateway, its credential, its location (the ones
/// it names).
pub fn of_call(c: &CallOutcome) -> Vec<String> {
    let mut v = Vec::new();
    let n = of_call_into(c, &mut v);
    v.truncate(n);
    v
}

/// [`of_call`] written into the first strings of `buf`, whose buffers are reused (the engine
/// names a call's scopes once per call, and formatting new strings each time was a sixth of its
/// work on a call): how many it wrote. Strings past them are left as they were.
pub fn of_call_into(c: &CallOutcome, buf: &mut Vec<String>) -> usize {
    let mut n = 0;
    let mut put = |kind: &str, value: &str| {
        if buf.len() == n {
            buf.push(String::new());
        }
        write_name(&mut buf[n], kind, value);
        n += 1;
    };
    if !c.gateway.is_empty() {
        put("gateway", &c.gateway);
    }
    for (attr, kind) in [(KEY_ATTRIBUTE, "key"), (LOCATION_ATTRIBUTE, "location")] {
        if let Some(value) = c.attributes.get(attr).filter(|v| !v.is_empty()) {
            put(kind, value);
        }
    }
    n
}

/// A call the endpoint refused the caller's credential on (401, 403): no fault of the endpoint
/// for the fleet, but the credential's (or, naming none, the gateway's) scope cannot use it.
pub fn credential_refused(c: &CallOutcome) -> bool {
    c.outcome == OutcomeClass::ClientError && matches!(c.http_status, Some(401 | 403))
}

/// Whether a state takes an endpoint out of rotation for the fleet (unhealthy, maintenance):
/// a fleet transition into it ends every scoped decision of the endpoint, in the engine, the
/// projection and every view alike.
pub fn ends_scoped(fleet_state: HealthState) -> bool {
    matches!(fleet_state, HealthState::Unhealthy | HealthState::Maintenance)
}

/// The scopes a router is in: from its configuration (its gateway id, its location, the
/// credentials it calls with). It applies the fleet's transitions and those of these scopes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    scopes: Vec<String>,
    /// Every scope's transitions apply (a view that serves many routers, each with its own
    /// identity: `vitals-xds`), kept apart by scope.
    every: bool,
}

impl Identity {
    /// No scope: the fleet's decisions only (a router that did not say who it is).
    pub fn fleet() -> Identity {
        Identity::default()
    }

    pub fn new(gateway: Option<&str>, location: Option<&str>, keys: &[String]) -> Identity {
        let mut scopes = Vec::new();
        let mut add = |kind: &str, v: &str| {
            if !v.is_empty() {
                scopes.push(name(kind, v));
            }
        };
        if let Some(g) = gateway {
            add("gateway", g);
        }
        keys.iter().for_each(|k| add("key", k));
        if let Some(l) = location {
            add("location", l);
        }
        Identity { scopes, every: false }
    }

    /// Every scope: a view that keeps each scope's decisions for the many routers it serves
    /// (each asks for its own with [`Identity::applies`]).
    pub fn every() -> Identity {
        Identity {
            scopes: Vec::new(),
            every: true,
        }
    }

    /// Whether a transition of `scope` (None: the fleet's) applies to this router.
    pub fn applies(&self, scope: Option<&str>) -> bool {
        self.every || scope.is_none_or(|s| self.scopes.iter().any(|x| x == s))
    }

    pub fn scopes(&self) -> &[String] {
        &self.scopes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_names_its_gateway_credential_and_location() {
        let mut c = CallOutcome::new("e", "p", "a", "g1", 0, OutcomeClass::Success);
        assert_eq!(of_call(&c), ["gateway=g1"]);
        c.attributes.insert("location".into(), "eu".into());
        c.attributes.insert("key_id".into(), "k1".into());
        assert_eq!(of_call(&c), ["gateway=g1", "key=k1", "location=eu"]);
        c.outcome = OutcomeClass::ClientError;
        c.http_status = Some(401);
        assert!(credential_refused(&c));
        c.http_status = Some(400);
        assert!(!credential_refused(&c));
    }

    proptest::proptest! {
        /// One buffer reused call after call names each call's scopes as a fresh one would,
        /// whatever the calls before it named (more scopes, fewer, longer names).
        #[test]
        fn scopes_named_into_a_reused_buffer_are_the_calls_own(
            calls in proptest::collection::vec(
                (
                    proptest::option::of("[a-z0-9-]{0,12}"),
                    proptest::option::of("[a-z0-9-]{0,12}"),
                    proptest::option::of("[a-z0-9-]{0,12}"),
                ),
                1..20,
            )
        ) {
            let mut buf = Vec::new();
            for (gateway, key, location) in calls {
                let mut c = CallOutcome::new("e", "p", "a", gateway.as_deref().unwrap_or(""), 0, OutcomeClass::Success);
                if let Some(k) = key {
                    c.attributes.insert(KEY_ATTRIBUTE.into(), k);
                }
                if let Some(l) = location {
                    c.attributes.insert(LOCATION_ATTRIBUTE.into(), l);
                }
                let n = of_call_into(&c, &mut buf);
                let fresh = of_call(&c);
                proptest::prop_assert_eq!(&buf[..n], fresh.as_slice());
            }
        }
    }

    #[test]
    fn an_identity_applies_the_fleet_and_its_own_scopes() {
        let id = Identity::new(Some("g1"), Some("eu"), &["k1".into()]);
        assert!(id.applies(None));
        assert!(id.applies(Some("gateway=g1")));
        assert!(id.applies(Some("location=eu")));
        assert!(id.applies(Some("key=k1")));
        assert!(!id.applies(Some("gateway=g2")));
        assert!(!Identity::fleet().applies(Some("gateway=g1")));
    }

    #[test]
    fn a_scope_is_told_by_its_kind_and_value() {
        for (kind, value) in [("gateway", "g1"), ("key", "a=b"), ("location", "")] {
            let scope = name(kind, value);
            assert!(is_named(&scope, kind, value), "{scope}");
            assert!(!is_named(&scope, kind, "g"), "{scope}");
            assert!(!is_named(&scope, "gate", value), "{scope}");
            assert!(!is_named(&format!("{scope}x"), kind, value), "{scope}");
        }
        assert!(!is_named("gateway:g1", "gateway", "g1"));
    }

    #[test]
    fn scope_names_are_checked() {
        assert_eq!(parse("gateway=g1"), Ok(("gateway", "g1")));
        assert!(parse("g1").unwrap_err().contains("kind=value"));
        assert!(parse("pod=x").unwrap_err().contains("one of"));
        assert!(parse("gateway=").is_err());
    }
}
