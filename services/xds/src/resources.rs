//! The xDS resources of a pool, pure: what vitals-xds serves for a pool `P` to a client of some
//! identity, from the endpoints' health as the client's view routes by.
//!
//! - **Listener `P`** (LDS): an API listener (what proxyless gRPC dials as `xds:///P`) whose HTTP
//!   connection manager holds its route configuration inline: every request to cluster `P`.
//! - **RouteConfiguration `P`** (RDS): the same routes, for a client that asks for them by name.
//! - **Cluster `P`** (CDS): an EDS cluster whose endpoints come over the same ADS stream, with
//!   the load-balancing policy `--lb-policy` names.
//! - **ClusterLoadAssignment `P`** (EDS): each endpoint with its address (its name when that is
//!   `host:port`, or the address map's entry), its `health_status` from vitals' state and its
//!   `load_balancing_weight` from vitals' weight (slow start and probation included), grouped
//!   in localities by the map's `zone`.
//!
//! A resource's version is a hash of its encoding, so that every instance and every restart
//! serves the same version for the same content.

use crate::map::{Address, AddressMap};
use envoy_types::pb::envoy::config::cluster::v3::{cluster, Cluster};
use envoy_types::pb::envoy::config::core::v3::{
    address, config_source, socket_address, AggregatedConfigSource, ApiVersion, ConfigSource, HealthStatus, Locality,
    SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Listener};
use envoy_types::pb::envoy::config::route::v3::{
    route, route_action, route_match, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager, http_filter, HttpConnectionManager, HttpFilter,
};
use envoy_types::pb::google::protobuf::{Any, UInt32Value};
use prost::{Message, Name};
use std::collections::BTreeMap;
use vitals_contracts::HealthState;

pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ENDPOINTS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// The resource types served, and whether a client that names none of a type means all of them
/// (LDS and CDS are wildcard types in the xDS protocol; RDS and EDS are asked for by name).
pub const TYPES: [(&str, bool); 4] = [(LISTENER, true), (ROUTE, false), (CLUSTER, true), (ENDPOINTS, false)];

pub fn is_wildcard_type(type_url: &str) -> bool {
    TYPES.iter().any(|(t, w)| *t == type_url && *w)
}

pub fn is_served(type_url: &str) -> bool {
    TYPES.iter().any(|(t, _)| *t == type_url)
}

/// The load-balancing policy of the clusters served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LbPolicy {
    RoundRobin,
    LeastRequest,
    RingHash,
}

impl LbPolicy {
    pub fn parse(s: &str) -> Result<LbPolicy, String> {
        match s {
            "round_robin" => Ok(LbPolicy::RoundRobin),
            "least_request" => Ok(LbPolicy::LeastRequest),
            "ring_hash" => Ok(LbPolicy::RingHash),
            _ => Err(format!("{s:?}: expected round_robin, least_request or ring_hash")),
        }
    }

    fn proto(self) -> cluster::LbPolicy {
        match self {
            LbPolicy::RoundRobin => cluster::LbPolicy::RoundRobin,
            LbPolicy::LeastRequest => cluster::LbPolicy::LeastRequest,
            LbPolicy::RingHash => cluster::LbPolicy::RingHash,
        }
    }
}

/// How a degraded endpoint is served: `DEGRADED` (Envoy uses it only when too few are healthy;
/// some gRPC versions drop it) or `HEALTHY` at its lowered weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Degraded {
    #[default]
    Degraded,
    Healthy,
}

/// One endpoint as a client is to route by it.
#[derive(Debug, Clone, PartialEq)]
pub struct Served {
    pub name: String,
    pub state: HealthState,
    /// 0..1: vitals' weight (0 out of rotation).
    pub weight: f64,
}

/// The xDS health status of a vitals state: in rotation is `HEALTHY` (degraded as `how` says),
/// out for a fault `UNHEALTHY`, an operator's maintenance `DRAINING`.
pub fn health_status(state: HealthState, how: Degraded) -> HealthStatus {
    match state {
        HealthState::Healthy | HealthState::Suspect | HealthState::Recovering => HealthStatus::Healthy,
        HealthState::Degraded if how == Degraded::Degraded => HealthStatus::Degraded,
        HealthState::Degraded => HealthStatus::Healthy,
        HealthState::Unhealthy => HealthStatus::Unhealthy,
        HealthState::Maintenance => HealthStatus::Draining,
    }
}

/// An endpoint's `load_balancing_weight`: vitals' weight in hundredths, at least 1 (the protocol
/// has no weight 0: an endpoint out of rotation is out by its health status).
pub fn lb_weight(weight: f64) -> u32 {
    ((weight.clamp(0.0, 1.0) * 100.0).round() as u32).max(1)
}

fn any<M: Message + Name>(m: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: m.encode_to_vec(),
    }
}

/// The routes of pool `pool`: everything to its cluster.
pub fn route_configuration(pool: &str) -> RouteConfiguration {
    RouteConfiguration {
        name: pool.to_owned(),
        virtual_hosts: vec![VirtualHost {
            name: pool.to_owned(),
            domains: vec!["*".to_owned()],
            routes: vec![Route {
                r#match: Some(RouteMatch {
                    path_specifier: Some(route_match::PathSpecifier::Prefix(String::new())),
                    ..Default::default()
                }),
                action: Some(route::Action::Route(RouteAction {
                    cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(pool.to_owned())),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The API listener a proxyless client dials as `xds:///pool`.
pub fn listener(pool: &str) -> Listener {
    let hcm = HttpConnectionManager {
        stat_prefix: pool.to_owned(),
        route_specifier: Some(http_connection_manager::RouteSpecifier::RouteConfig(
            route_configuration(pool),
        )),
        http_filters: vec![HttpFilter {
            name: "envoy.filters.http.router".to_owned(),
            config_type: Some(http_filter::ConfigType::TypedConfig(any(&Router::default()))),
            ..Default::default()
        }],
        ..Default::default()
    };
    Listener {
        name: pool.to_owned(),
        api_listener: Some(ApiListener {
            api_listener: Some(any(&hcm)),
        }),
        ..Default::default()
    }
}

/// The EDS cluster of pool `pool`, its endpoints over ADS.
pub fn cluster(pool: &str, policy: LbPolicy) -> Cluster {
    Cluster {
        name: pool.to_owned(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(cluster::EdsClusterConfig {
            eds_config: Some(ConfigSource {
                config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
                resource_api_version: ApiVersion::V3 as i32,
                ..Default::default()
            }),
            service_name: pool.to_owned(),
        }),
        lb_policy: policy.proto() as i32,
        connect_timeout: Some(envoy_types::pb::google::protobuf::Duration { seconds: 1, nanos: 0 }),
        ..Default::default()
    }
}

/// What an endpoint assignment needs besides the endpoints: their addresses, and how to serve
/// a degraded one.
pub struct Assign<'a> {
    pub map: &'a AddressMap,
    pub degraded: Degraded,
}

/// The endpoints of pool `pool` with their health and weights, in localities by the map's zone
/// (the zone-less first). Endpoints with no address (a name that is not `host:port` and no map
/// entry) are left out; their count is returned.
pub fn load_assignment(pool: &str, endpoints: &[Served], a: &Assign<'_>) -> (ClusterLoadAssignment, usize) {
    let mut zones: BTreeMap<&str, Vec<LbEndpoint>> = BTreeMap::new();
    let mut unmapped = 0;
    for e in endpoints {
        let Some(Address { host, port, zone }) = a.map.address(pool, &e.name) else {
            unmapped += 1;
            continue;
        };
        zones.entry(zone).or_default().push(LbEndpoint {
            host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                address: Some(envoy_types::pb::envoy::config::core::v3::Address {
                    address: Some(address::Address::SocketAddress(SocketAddress {
                        address: host.to_owned(),
                        port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(port))),
                        ..Default::default()
                    })),
                }),
                hostname: e.name.clone(),
                ..Default::default()
            })),
            health_status: health_status(e.state, a.degraded) as i32,
            load_balancing_weight: Some(UInt32Value {
                value: lb_weight(e.weight),
            }),
            ..Default::default()
        });
    }
    let cla = ClusterLoadAssignment {
        cluster_name: pool.to_owned(),
        endpoints: zones
            .into_iter()
            .map(|(zone, lb_endpoints)| LocalityLbEndpoints {
                // Always present (grpcio refuses an assignment whose locality is missing), empty
                // for endpoints the map gives no zone.
                locality: Some(Locality {
                    zone: zone.to_owned(),
                    ..Default::default()
                }),
                lb_endpoints,
                // gRPC leaves out a locality without a weight.
                load_balancing_weight: Some(UInt32Value { value: 1 }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    (cla, unmapped)
}

/// A resource as sent: its name, its version (a hash of its encoding) and the `Any` it travels in.
#[derive(Debug, Clone, PartialEq)]
pub struct Built {
    pub name: String,
    pub version: String,
    pub any: Any,
}

impl Built {
    pub fn of<M: Message + Name>(name: &str, m: &M) -> Built {
        let any = any(m);
        Built {
            name: name.to_owned(),
            version: format!("{:016x}", vitals_contracts::hash::fnv64(&any.value)),
            any,
        }
    }
}

/// The version of a state-of-the-world answer: a hash of its resources' names and versions.
pub fn version_of(resources: &[Built]) -> String {
    let h = resources.iter().fold(vitals_contracts::hash::Fnv64::new(), |h, r| {
        h.parts(&[r.name.as_bytes(), r.version.as_bytes()])
    });
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(name: &str, state: HealthState, weight: f64) -> Served {
        Served {
            name: name.into(),
            state,
            weight,
        }
    }

    #[test]
    fn states_and_weights_map_to_health_status_and_load_balancing_weight() {
        let d = Degraded::Degraded;
        assert_eq!(health_status(HealthState::Healthy, d), HealthStatus::Healthy);
        assert_eq!(health_status(HealthState::Recovering, d), HealthStatus::Healthy);
        assert_eq!(health_status(HealthState::Suspect, d), HealthStatus::Healthy);
        assert_eq!(health_status(HealthState::Degraded, d), HealthStatus::Degraded);
        assert_eq!(
            health_status(HealthState::Degraded, Degraded::Healthy),
            HealthStatus::Healthy
        );
        assert_eq!(health_status(HealthState::Unhealthy, d), HealthStatus::Unhealthy);
        assert_eq!(health_status(HealthState::Maintenance, d), HealthStatus::Draining);
        assert_eq!(
            (lb_weight(1.0), lb_weight(0.25), lb_weight(0.01), lb_weight(0.0)),
            (100, 25, 1, 1)
        );
    }

    #[test]
    fn an_assignment_has_addresses_health_and_weights_and_leaves_out_unmapped_endpoints() {
        let map = AddressMap::parse(
            "[[endpoint]]\npool = \"p\"\nendpoint = \"b\"\naddress = \"127.0.0.1:7002\"\nzone = \"z1\"\n",
        )
        .unwrap();
        let eps = [
            served("127.0.0.1:7001", HealthState::Recovering, 0.1),
            served("b", HealthState::Unhealthy, 0.0),
            served("no-address", HealthState::Healthy, 1.0),
        ];
        let (cla, unmapped) = load_assignment(
            "p",
            &eps,
            &Assign {
                map: &map,
                degraded: Degraded::Degraded,
            },
        );
        assert_eq!(unmapped, 1);
        assert_eq!(cla.cluster_name, "p");
        assert_eq!(cla.endpoints.len(), 2, "the zone-less locality and z1");
        let first = &cla.endpoints[0].lb_endpoints[0];
        assert_eq!(first.health_status, HealthStatus::Healthy as i32);
        assert_eq!(first.load_balancing_weight.as_ref().unwrap().value, 10);
        assert_eq!(cla.endpoints[0].locality.as_ref().unwrap().zone, "", "present, empty");
        assert_eq!(cla.endpoints[1].locality.as_ref().unwrap().zone, "z1");
        assert_eq!(
            cla.endpoints[1].lb_endpoints[0].health_status,
            HealthStatus::Unhealthy as i32
        );
        assert!(cla
            .endpoints
            .iter()
            .all(|l| l.load_balancing_weight.as_ref().unwrap().value == 1));
    }

    /// A version is the content's: equal content, equal version (another instance, a restart);
    /// other content, another version.
    #[test]
    fn versions_follow_the_content() {
        let a = Built::of("p", &cluster("p", LbPolicy::RoundRobin));
        let b = Built::of("p", &cluster("p", LbPolicy::RoundRobin));
        let c = Built::of("p", &cluster("p", LbPolicy::RingHash));
        assert_eq!(a.version, b.version);
        assert_ne!(a.version, c.version);
        assert_eq!(version_of(std::slice::from_ref(&a)), version_of(&[b]));
        assert_ne!(version_of(std::slice::from_ref(&a)), version_of(&[a.clone(), c]));
        assert_eq!(a.any.type_url, CLUSTER);
        assert_eq!(Built::of("p", &listener("p")).any.type_url, LISTENER);
        assert_eq!(Built::of("p", &route_configuration("p")).any.type_url, ROUTE);
    }

    /// The listener carries its routes inline, and its router filter: what gRPC requires of an
    /// API listener.
    #[test]
    fn a_listener_routes_everything_to_its_pool() {
        let l = listener("chat");
        let any = l.api_listener.unwrap().api_listener.unwrap();
        let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
        let Some(http_connection_manager::RouteSpecifier::RouteConfig(rc)) = hcm.route_specifier else {
            panic!("routes inline");
        };
        let Some(route::Action::Route(ra)) = &rc.virtual_hosts[0].routes[0].action else {
            panic!("a route action");
        };
        assert_eq!(
            ra.cluster_specifier,
            Some(route_action::ClusterSpecifier::Cluster("chat".into()))
        );
        assert_eq!(hcm.http_filters.last().unwrap().name, "envoy.filters.http.router");
    }
}
