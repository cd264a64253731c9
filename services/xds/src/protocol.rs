//! The xDS transport protocol, one stream at a time, pure (no I/O): what to answer to a request,
//! and what to send when the table changes, for the state-of-the-world variant ([`Sotw`]) and the
//! incremental one ([`Delta`]). A [`Source`] says what the resources are now.
//!
//! State of the world: per resource type, the names a client subscribes to (none of a wildcard
//! type — listeners, clusters — means all), the version and nonce last sent. A request whose
//! `response_nonce` is not the last one sent is stale and changes nothing; one that carries an
//! `error_detail` is a NACK (the client kept its previous version: logged and counted, the same
//! version is not sent again); a request that changes the names, or the first of its type, is
//! answered at once; an ACK is not answered. A change is sent when a subscription's answer has
//! another version than the last sent.
//!
//! Incremental: per type, the names subscribed (`*` or none at first of a wildcard type: all),
//! and the version of each resource the client holds (from `initial_resource_versions`, then
//! what was sent). An answer holds the resources whose version the client does not hold and, in
//! `removed_resources`, the names subscribed that are not (or no longer) served.

use crate::resources::{self, Built, Degraded};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use std::collections::{BTreeSet, HashMap};
use vitals_contracts::Micros;
use vitals_healthview::Identity;

/// A stream's client: the scopes it is in, and how it is to be told of a degraded endpoint.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Client {
    pub identity: Identity,
    pub degraded: Degraded,
}

/// A stream whose node has not said who it is yet: the fleet's, told of degraded endpoints as
/// they are.
static NO_CLIENT: std::sync::LazyLock<Client> = std::sync::LazyLock::new(Client::default);

/// What the resources are now, for a client.
pub trait Source {
    fn resources(&self, type_url: &str, names: Option<&BTreeSet<String>>, client: &Client, now: Micros) -> Vec<Built>;
}

impl Source for crate::table::Table {
    fn resources(&self, type_url: &str, names: Option<&BTreeSet<String>>, client: &Client, now: Micros) -> Vec<Built> {
        crate::table::Table::resources(self, type_url, names, &client.identity, client.degraded, now)
    }
}

/// How a degraded endpoint is served: `auto` gives Envoy `DEGRADED` (it uses such hosts only when
/// too few are healthy) and every other client, gRPC's among them (which drops `DEGRADED`
/// endpoints altogether), `HEALTHY` at the lowered weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DegradedAs {
    Auto,
    Degraded,
    Healthy,
}

impl DegradedAs {
    pub fn parse(s: &str) -> Result<DegradedAs, String> {
        match s {
            "auto" => Ok(DegradedAs::Auto),
            "degraded" => Ok(DegradedAs::Degraded),
            "healthy" => Ok(DegradedAs::Healthy),
            _ => Err(format!("{s:?}: expected auto, degraded or healthy")),
        }
    }

    fn for_node(self, node: &Node) -> Degraded {
        match self {
            DegradedAs::Degraded => Degraded::Degraded,
            DegradedAs::Healthy => Degraded::Healthy,
            DegradedAs::Auto if node.user_agent_name.eq_ignore_ascii_case("envoy") => Degraded::Degraded,
            DegradedAs::Auto => Degraded::Healthy,
        }
    }
}

/// How a client's node names its scopes: its gateway (the node's `cluster` or `id`) and its
/// location (a part of its locality).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeScopes {
    pub gateway: NodeField,
    pub location: NodeField,
    pub degraded: DegradedAs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeField {
    Id,
    Cluster,
    Region,
    Zone,
    SubZone,
    None,
}

impl NodeField {
    pub fn parse(s: &str) -> Result<NodeField, String> {
        Ok(match s {
            "id" => NodeField::Id,
            "cluster" => NodeField::Cluster,
            "region" => NodeField::Region,
            "zone" => NodeField::Zone,
            "sub_zone" => NodeField::SubZone,
            "none" => NodeField::None,
            _ => return Err(format!("{s:?}: expected id, cluster, region, zone, sub_zone or none")),
        })
    }

    fn of(self, node: &Node) -> Option<&str> {
        let l = node.locality.as_ref();
        let v = match self {
            NodeField::Id => node.id.as_str(),
            NodeField::Cluster => node.cluster.as_str(),
            NodeField::Region => l.map_or("", |l| l.region.as_str()),
            NodeField::Zone => l.map_or("", |l| l.zone.as_str()),
            NodeField::SubZone => l.map_or("", |l| l.sub_zone.as_str()),
            NodeField::None => "",
        };
        (!v.is_empty()).then_some(v)
    }
}

impl NodeScopes {
    /// The client a node stands for: the fleet's decisions plus its gateway's and location's,
    /// and degraded endpoints as it honours them.
    pub fn client(&self, node: &Node) -> Client {
        Client {
            identity: Identity::new(self.gateway.of(node), self.location.of(node), &[]),
            degraded: self.degraded.for_node(node),
        }
    }
}

/// Something a stream's client said that the operator should hear of.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    /// The client refused a version (NACK), with its reason.
    Nack {
        type_url: String,
        version: String,
        reason: String,
    },
    /// A type this server does not serve: not answered.
    Unserved { type_url: String },
}

/// What both variants keep of a stream: how its client is named, who it is once its node has
/// said, the one type a per-type service serves, and the nonces handed out.
#[derive(Debug)]
struct Stream {
    scopes: NodeScopes,
    client: Option<Client>,
    only: Option<&'static str>,
    nonces: u64,
}

impl Stream {
    fn new(scopes: NodeScopes, only: Option<&'static str>) -> Stream {
        Stream {
            scopes,
            client: None,
            only,
            nonces: 0,
        }
    }

    /// A request's common part: the client named by its first node, an empty type taken as the
    /// per-type service's, and a type not served refused (with the note to make of it).
    fn admit(&mut self, node: Option<&Node>, type_url: &mut String) -> Result<(), Note> {
        if let (Some(node), None) = (node, &self.client) {
            self.client = Some(self.scopes.client(node));
        }
        if let (true, Some(t)) = (type_url.is_empty(), self.only) {
            *type_url = t.to_owned();
        }
        if !resources::is_served(type_url) || self.only.is_some_and(|t| t != type_url) {
            return Err(Note::Unserved {
                type_url: type_url.clone(),
            });
        }
        Ok(())
    }

    fn client(&self) -> &Client {
        self.client.as_ref().unwrap_or(&NO_CLIENT)
    }

    fn nonce(&mut self) -> String {
        self.nonces += 1;
        self.nonces.to_string()
    }
}

#[derive(Debug, Default)]
struct SotwSub {
    names: BTreeSet<String>,
    wildcard: bool,
    sent: Option<String>,
    nonce: String,
}

/// One state-of-the-world stream.
#[derive(Debug)]
pub struct Sotw {
    stream: Stream,
    subs: HashMap<String, SotwSub>,
}

impl Sotw {
    /// `only`: the type a per-type service (EDS) serves; None on ADS.
    pub fn new(scopes: NodeScopes, only: Option<&'static str>) -> Sotw {
        Sotw {
            stream: Stream::new(scopes, only),
            subs: HashMap::new(),
        }
    }

    pub fn client(&self) -> Option<&Client> {
        self.stream.client.as_ref()
    }

    fn current(&self, type_url: &str, src: &dyn Source, now: Micros) -> Vec<Built> {
        let sub = &self.subs[type_url];
        src.resources(
            type_url,
            (!sub.wildcard).then_some(&sub.names),
            self.stream.client(),
            now,
        )
    }

    fn answer(&mut self, type_url: &str, built: Vec<Built>) -> DiscoveryResponse {
        let nonce = self.stream.nonce();
        let sub = self.subs.get_mut(type_url).expect("subscribed");
        let version = resources::version_of(&built);
        sub.nonce = nonce;
        sub.sent = Some(version.clone());
        DiscoveryResponse {
            version_info: version,
            resources: built.into_iter().map(|b| b.any).collect(),
            type_url: type_url.to_owned(),
            nonce: sub.nonce.clone(),
            ..Default::default()
        }
    }

    /// A request from the client: the answer to send now, if any, and what to note.
    pub fn on_request(
        &mut self,
        mut req: DiscoveryRequest,
        src: &dyn Source,
        now: Micros,
    ) -> (Option<DiscoveryResponse>, Option<Note>) {
        if let Err(note) = self.stream.admit(req.node.as_ref(), &mut req.type_url) {
            return (None, Some(note));
        }
        let first = !self.subs.contains_key(&req.type_url);
        let sub = self.subs.entry(req.type_url.clone()).or_default();
        if !first && !req.response_nonce.is_empty() && req.response_nonce != sub.nonce {
            return (None, None); // stale: an answer to an older response
        }
        let note = req.error_detail.as_ref().map(|e| Note::Nack {
            type_url: req.type_url.clone(),
            version: sub.sent.clone().unwrap_or_default(),
            reason: e.message.clone(),
        });
        let names: BTreeSet<String> = req.resource_names.iter().filter(|n| *n != "*").cloned().collect();
        let wildcard = resources::is_wildcard_type(&req.type_url)
            && (req.resource_names.is_empty() || req.resource_names.iter().any(|n| n == "*"));
        let changed = first || names != sub.names || wildcard != sub.wildcard;
        sub.names = names;
        sub.wildcard = wildcard;
        if changed {
            let built = self.current(&req.type_url, src, now);
            return (Some(self.answer(&req.type_url, built)), note);
        }
        (None, note)
    }

    /// The table changed: an answer for each subscription whose answer has another version.
    pub fn on_change(&mut self, src: &dyn Source, now: Micros) -> Vec<DiscoveryResponse> {
        let mut types: Vec<String> = self.subs.keys().cloned().collect();
        types.sort_unstable();
        let mut out = Vec::new();
        for t in types {
            let built = self.current(&t, src, now);
            if Some(resources::version_of(&built)) != self.subs[&t].sent {
                out.push(self.answer(&t, built));
            }
        }
        out
    }
}

#[derive(Debug, Default)]
struct DeltaSub {
    names: BTreeSet<String>,
    wildcard: bool,
    /// Name → the version the client holds.
    held: HashMap<String, String>,
}

/// One incremental stream.
#[derive(Debug)]
pub struct Delta {
    stream: Stream,
    subs: HashMap<String, DeltaSub>,
}

impl Delta {
    pub fn new(scopes: NodeScopes, only: Option<&'static str>) -> Delta {
        Delta {
            stream: Stream::new(scopes, only),
            subs: HashMap::new(),
        }
    }

    pub fn client(&self) -> Option<&Client> {
        self.stream.client.as_ref()
    }

    /// What the client lacks of `type_url`: the resources whose version it does not hold, and
    /// the names it holds or just asked for that are not served. None when nothing.
    fn diff(
        &mut self,
        type_url: &str,
        asked: &BTreeSet<String>,
        src: &dyn Source,
        now: Micros,
    ) -> Option<DeltaDiscoveryResponse> {
        let sub = self.subs.get_mut(type_url)?;
        let built = src.resources(
            type_url,
            (!sub.wildcard).then_some(&sub.names),
            self.stream.client(),
            now,
        );
        let served: BTreeSet<&str> = built.iter().map(|b| b.name.as_str()).collect();
        let mut resources = Vec::new();
        for b in &built {
            if sub.held.get(&b.name) != Some(&b.version) {
                sub.held.insert(b.name.clone(), b.version.clone());
                resources.push(Resource {
                    name: b.name.clone(),
                    version: b.version.clone(),
                    resource: Some(b.any.clone()),
                    ..Default::default()
                });
            }
        }
        let mut removed: Vec<String> = sub
            .held
            .keys()
            .filter(|n| !served.contains(n.as_str()))
            .cloned()
            .collect();
        removed.extend(
            asked
                .iter()
                .filter(|n| !served.contains(n.as_str()) && !sub.held.contains_key(*n))
                .cloned(),
        );
        removed.sort_unstable();
        removed.dedup();
        for n in &removed {
            sub.held.remove(n);
        }
        if resources.is_empty() && removed.is_empty() {
            return None;
        }
        Some(DeltaDiscoveryResponse {
            system_version_info: resources::version_of(&built),
            resources,
            type_url: type_url.to_owned(),
            removed_resources: removed,
            nonce: self.stream.nonce(),
            ..Default::default()
        })
    }

    pub fn on_request(
        &mut self,
        mut req: DeltaDiscoveryRequest,
        src: &dyn Source,
        now: Micros,
    ) -> (Option<DeltaDiscoveryResponse>, Option<Note>) {
        if let Err(note) = self.stream.admit(req.node.as_ref(), &mut req.type_url) {
            return (None, Some(note));
        }
        let first = !self.subs.contains_key(&req.type_url);
        let sub = self.subs.entry(req.type_url.clone()).or_default();
        let note = req.error_detail.as_ref().map(|e| Note::Nack {
            type_url: req.type_url.clone(),
            version: String::new(),
            reason: e.message.clone(),
        });
        if first {
            sub.held = req.initial_resource_versions.clone();
            sub.wildcard = resources::is_wildcard_type(&req.type_url) && req.resource_names_subscribe.is_empty();
        }
        let mut asked = BTreeSet::new();
        for n in &req.resource_names_subscribe {
            if n == "*" {
                sub.wildcard = true;
            } else if sub.names.insert(n.clone()) {
                asked.insert(n.clone());
            }
        }
        for n in &req.resource_names_unsubscribe {
            if n == "*" {
                sub.wildcard = false;
            } else {
                sub.names.remove(n);
                sub.held.remove(n);
            }
        }
        let subscribing =
            first || !req.resource_names_subscribe.is_empty() || !req.resource_names_unsubscribe.is_empty();
        if !subscribing {
            return (None, note); // an ACK or a NACK
        }
        (self.diff(&req.type_url, &asked, src, now), note)
    }

    pub fn on_change(&mut self, src: &dyn Source, now: Micros) -> Vec<DeltaDiscoveryResponse> {
        let mut types: Vec<String> = self.subs.keys().cloned().collect();
        types.sort_unstable();
        types
            .iter()
            .filter_map(|t| self.diff(t, &BTreeSet::new(), src, now))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{ENDPOINTS, LISTENER};
    use envoy_types::pb::google::rpc::Status;
    use std::cell::RefCell;

    /// A source whose pools and their content (a number standing for their endpoints' state)
    /// the test sets.
    #[derive(Default)]
    struct Fake(RefCell<Vec<(String, u32)>>);

    impl Source for Fake {
        fn resources(
            &self,
            type_url: &str,
            names: Option<&BTreeSet<String>>,
            client: &Client,
            _: Micros,
        ) -> Vec<Built> {
            let who = &client.identity;
            self.0
                .borrow()
                .iter()
                .filter(|(p, _)| names.is_none_or(|n| n.contains(p)))
                .map(|(p, v)| {
                    let scoped = who.scopes().len() as u32;
                    let any = envoy_types::pb::google::protobuf::Any {
                        type_url: type_url.to_owned(),
                        value: vec![*v as u8, scoped as u8],
                    };
                    Built {
                        name: p.clone(),
                        version: format!("{v}.{scoped}"),
                        any,
                    }
                })
                .collect()
        }
    }

    fn scopes() -> NodeScopes {
        NodeScopes {
            gateway: NodeField::Cluster,
            location: NodeField::Zone,
            degraded: DegradedAs::Auto,
        }
    }

    fn req(type_url: &str, names: &[&str], nonce: &str, node: bool) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: type_url.into(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            response_nonce: nonce.into(),
            node: node.then(|| Node {
                id: "envoy-1".into(),
                cluster: "edge".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn state_of_the_world_answers_subscriptions_ignores_acks_and_stale_nonces_and_sends_changes() {
        let src = Fake::default();
        src.0.borrow_mut().extend([("a".into(), 1), ("b".into(), 1)]);
        let mut s = Sotw::new(scopes(), None);
        let (r, _) = s.on_request(req(ENDPOINTS, &["a"], "", true), &src, 0);
        let r = r.expect("the first request is answered");
        assert_eq!((r.resources.len(), r.nonce.as_str()), (1, "1"));
        assert_eq!(s.client().unwrap().identity.scopes(), ["gateway=edge"]);
        assert_eq!(
            s.client().unwrap().degraded,
            Degraded::Healthy,
            "not Envoy: degraded as healthy"
        );
        // The ACK: nothing to say.
        let (none, note) = s.on_request(req(ENDPOINTS, &["a"], "1", false), &src, 0);
        assert!(none.is_none() && note.is_none());
        // Nothing changed: nothing sent. a changes: sent; b's change is not a's subscription.
        assert!(s.on_change(&src, 0).is_empty());
        src.0.borrow_mut()[1].1 = 2;
        assert!(s.on_change(&src, 0).is_empty());
        src.0.borrow_mut()[0].1 = 2;
        let sent = s.on_change(&src, 0);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].nonce, "2");
        // A request for more names, answering the older nonce: stale, ignored.
        assert!(s
            .on_request(req(ENDPOINTS, &["a", "b"], "1", false), &src, 0)
            .0
            .is_none());
        // The same on the latest nonce: answered with both.
        let (r, _) = s.on_request(req(ENDPOINTS, &["a", "b"], "2", false), &src, 0);
        assert_eq!(r.unwrap().resources.len(), 2);
        // A NACK is noted, and not answered.
        let mut nack = req(ENDPOINTS, &["a", "b"], "3", false);
        nack.error_detail = Some(Status {
            code: 3,
            message: "bad weight".into(),
            ..Default::default()
        });
        let (r, note) = s.on_request(nack, &src, 0);
        assert!(r.is_none());
        assert!(matches!(note, Some(Note::Nack { reason, .. }) if reason == "bad weight"));
    }

    #[test]
    fn envoy_is_told_degraded_and_others_healthy_at_the_lowered_weight() {
        let node = |agent: &str| Node {
            user_agent_name: agent.into(),
            ..Default::default()
        };
        let auto = scopes();
        assert_eq!(auto.client(&node("envoy")).degraded, Degraded::Degraded);
        assert_eq!(auto.client(&node("gRPC Go")).degraded, Degraded::Healthy);
        assert_eq!(auto.client(&node("grpc-c")).degraded, Degraded::Healthy);
        let always = NodeScopes {
            degraded: DegradedAs::Degraded,
            ..auto
        };
        assert_eq!(always.client(&node("gRPC Go")).degraded, Degraded::Degraded);
    }

    #[test]
    fn a_wildcard_type_with_no_names_gets_every_pool_and_an_unserved_type_is_noted() {
        let src = Fake::default();
        src.0.borrow_mut().extend([("a".into(), 1), ("b".into(), 1)]);
        let mut s = Sotw::new(scopes(), None);
        let (r, _) = s.on_request(req(LISTENER, &[], "", true), &src, 0);
        assert_eq!(r.unwrap().resources.len(), 2);
        src.0.borrow_mut().push(("c".into(), 1));
        assert_eq!(
            s.on_change(&src, 0)[0].resources.len(),
            3,
            "a new pool reaches the wildcard"
        );
        let (r, note) = s.on_request(
            req(
                "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
                &[],
                "",
                false,
            ),
            &src,
            0,
        );
        assert!(r.is_none() && matches!(note, Some(Note::Unserved { .. })));
        // A per-type service answers its own type only.
        let mut eds = Sotw::new(scopes(), Some(ENDPOINTS));
        assert!(eds.on_request(req(LISTENER, &[], "", true), &src, 0).0.is_none());
        assert!(
            eds.on_request(req("", &["a"], "", true), &src, 0).0.is_some(),
            "no type_url: EDS's"
        );
    }

    fn dreq(type_url: &str, sub: &[&str], unsub: &[&str], initial: &[(&str, &str)]) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: type_url.into(),
            resource_names_subscribe: sub.iter().map(|s| s.to_string()).collect(),
            resource_names_unsubscribe: unsub.iter().map(|s| s.to_string()).collect(),
            initial_resource_versions: initial.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(),
            node: Some(Node {
                cluster: "edge".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn incremental_sends_what_the_client_lacks_and_names_what_is_gone() {
        let src = Fake::default();
        src.0.borrow_mut().extend([("a".into(), 1), ("b".into(), 1)]);
        let mut d = Delta::new(scopes(), None);
        // The client holds a at its current version already (a reconnect): only "nope" is news.
        let (r, _) = d.on_request(dreq(ENDPOINTS, &["a", "nope"], &[], &[("a", "1.1")]), &src, 0);
        let r = r.unwrap();
        assert!(r.resources.is_empty());
        assert_eq!(r.removed_resources, ["nope"]);
        src.0.borrow_mut()[0].1 = 2;
        let sent = d.on_change(&src, 0);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].resources[0].name, "a");
        assert_eq!(sent[0].resources[0].version, "2.1");
        assert!(d.on_change(&src, 0).is_empty(), "sent once");
        // Subscribing b sends b; a pool going away is removed.
        let (r, _) = d.on_request(dreq(ENDPOINTS, &["b"], &[], &[]), &src, 0);
        assert_eq!(r.unwrap().resources[0].name, "b");
        src.0.borrow_mut().remove(1);
        assert_eq!(d.on_change(&src, 0)[0].removed_resources, ["b"]);
        // Unsubscribed: a's changes are no longer sent.
        d.on_request(dreq(ENDPOINTS, &[], &["a"], &[]), &src, 0);
        src.0.borrow_mut()[0].1 = 3;
        assert!(d.on_change(&src, 0).is_empty());
        // A wildcard type with no names: everything.
        let mut w = Delta::new(scopes(), None);
        let (r, _) = w.on_request(dreq(LISTENER, &[], &[], &[]), &src, 0);
        assert_eq!(r.unwrap().resources.len(), 1);
    }
}
