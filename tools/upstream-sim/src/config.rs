//! The simulator's configuration: endpoints, ports, seed, the admin address.

use crate::behaviour::*;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// One endpoint of the configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    pub name: String,
    /// 0: any free port.
    #[serde(default)]
    pub port: u16,
    #[serde(default)]
    pub behaviour: Behaviour,
}

/// The simulator's configuration (a TOML file, or built by flags or by a test).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimConfig {
    #[serde(default)]
    pub seed: u64,
    /// The admin API's address; port 0 picks a free one.
    #[serde(default = "default_admin")]
    pub admin: SocketAddr,
    #[serde(default, rename = "endpoint")]
    pub endpoints: Vec<EndpointConfig>,
}

pub(crate) fn default_admin() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

impl SimConfig {
    /// `n` healthy endpoints `e0`…, on free ports.
    pub fn healthy(n: usize, seed: u64) -> SimConfig {
        SimConfig {
            seed,
            admin: default_admin(),
            endpoints: (0..n)
                .map(|i| EndpointConfig {
                    name: format!("e{i}"),
                    port: 0,
                    behaviour: Behaviour::default(),
                })
                .collect(),
        }
    }

    /// Parse and check a TOML configuration; errors name the line and the field.
    pub fn from_toml(text: &str) -> anyhow::Result<SimConfig> {
        let config: SimConfig = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        let mut names = std::collections::BTreeSet::new();
        for e in &self.endpoints {
            if e.name.is_empty() || e.name.len() > 200 || e.name.contains('/') {
                anyhow::bail!("endpoint name {:?}: 1..=200 bytes, no '/'", e.name);
            }
            if !names.insert(e.name.as_str()) {
                anyhow::bail!("endpoint {:?} is configured twice", e.name);
            }
            e.behaviour
                .validate()
                .map_err(|err| anyhow::anyhow!("endpoint {:?}: behaviour.{err}", e.name))?;
        }
        Ok(())
    }
}
