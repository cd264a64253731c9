//! The fault timeline: a TOML file of faults played in order.

use serde::Deserialize;
use vitals_upstream_sim::Behaviour;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeline {
    /// Load before the first fault, seconds.
    #[serde(default = "default_warmup")]
    pub warmup_s: u64,
    /// A fault not detected within this is reported as missed.
    #[serde(default = "default_detect")]
    pub detect_within_s: u64,
    /// Likewise for the return to rotation after the heal.
    #[serde(default = "default_restore")]
    pub restore_within_s: u64,
    #[serde(rename = "fault")]
    pub faults: Vec<Fault>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    pub name: String,
    pub pool: String,
    pub endpoints: Vec<String>,
    /// What the endpoints do during the fault (the simulator's behaviour).
    pub behaviour: Behaviour,
    /// How long the fault lasts once detected, seconds.
    #[serde(default = "default_hold")]
    pub hold_s: u64,
    /// One gateway's route to the endpoints broken (a scoped fault): the gateway (the second
    /// router's `gateway`), and the simulator's endpoints that are its route to them (its routes
    /// file points there). The behaviour is set on those; vitals must take the endpoints out for
    /// that gateway only.
    #[serde(default)]
    pub gateway: Option<String>,
    #[serde(default)]
    pub via: Vec<String>,
}

impl Fault {
    /// The scope a gateway fault is decided for.
    pub fn scope(&self) -> Option<String> {
        self.gateway
            .as_deref()
            .map(|g| vitals_contracts::scope::name("gateway", g))
    }

    /// The simulator's endpoints the fault's behaviour is set on.
    pub fn sim_endpoints(&self) -> &[String] {
        if self.gateway.is_some() {
            &self.via
        } else {
            &self.endpoints
        }
    }
}

fn default_warmup() -> u64 {
    15
}
fn default_detect() -> u64 {
    60
}
fn default_restore() -> u64 {
    120
}
fn default_hold() -> u64 {
    10
}

impl Timeline {
    pub fn parse(text: &str) -> anyhow::Result<Timeline> {
        let t: Timeline = toml::from_str(text)?;
        anyhow::ensure!(!t.faults.is_empty(), "the timeline has no [[fault]]");
        for (i, f) in t.faults.iter().enumerate() {
            anyhow::ensure!(!f.endpoints.is_empty(), "fault {} ({:?}): no endpoints", i + 1, f.name);
            anyhow::ensure!(
                f.gateway.is_some() != f.via.is_empty(),
                "fault {} ({:?}): a gateway's fault names both `gateway` and `via` (its route's simulator endpoints)",
                i + 1,
                f.name
            );
            f.behaviour
                .validate()
                .map_err(|e| anyhow::anyhow!("fault {} ({:?}): behaviour.{}: {}", i + 1, f.name, e.field, e.message))?;
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_timeline_parses() {
        let t = Timeline::parse(include_str!("../../../deploy/demo/timeline.toml")).unwrap();
        assert_eq!(t.faults.len(), 5);
        assert!(t.faults[1].behaviour.refuse);
        let route = &t.faults[4];
        assert_eq!(route.scope().as_deref(), Some("gateway=demo-router-2"));
        assert_eq!(route.sim_endpoints(), ["chat-c-via-2"]);
        assert_eq!(t.faults[0].sim_endpoints(), ["chat-b"]);
    }

    #[test]
    fn mistakes_are_named() {
        let e = Timeline::parse(
            "[[fault]]\nname = \"x\"\npool = \"p\"\nendpoints = [\"a\"]\nbehaviour = { drops = 2.0 }\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("behaviour.drops"), "{e}");
        let e = Timeline::parse(
            "[[fault]]\nname = \"x\"\npool = \"p\"\nendpoints = [\"a\"]\nbehaviour = { dropz = 0.1 }\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("dropz"), "{e}");
        assert!(Timeline::parse("warmup_s = 1\n").is_err());
        let e = Timeline::parse(
            "[[fault]]\nname = \"x\"\npool = \"p\"\nendpoints = [\"a\"]\ngateway = \"g2\"\nbehaviour = { refuse = true }\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("`via`"), "{e}");
    }
}
