//! The gRPC services: ADS (state of the world and incremental) and plain EDS (both variants), a
//! task per stream driving [`crate::protocol`] with the client's requests and the table's
//! changes.

use crate::protocol::{Client, Delta, NodeScopes, Note, Sotw};
use crate::resources::ENDPOINTS;
use crate::table::Table;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::endpoint::v3::endpoint_discovery_service_server::EndpointDiscoveryService;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use vitals_contracts::clock::now_us;
use vitals_contracts::Micros;
use vitals_runtime::metrics::{Counter, Family, Gauge, Labels, Registry};

/// What the streams have done, for `/metrics`.
pub struct Counters {
    pub streams: Gauge,
    pub responses: Family<Labels, Counter>,
    pub nacks: Family<Labels, Counter>,
    pub unserved: Counter,
    pub unmapped: Counter,
    pub registry: Registry,
}

impl Default for Counters {
    fn default() -> Counters {
        let mut r = Registry::default();
        let streams = Gauge::default();
        r.register(
            "vitals_xds_streams",
            "xDS streams open (ADS and EDS, both variants).",
            streams.clone(),
        );
        let responses = Family::<Labels, Counter>::default();
        r.register(
            "vitals_xds_responses",
            "Responses sent, by resource type.",
            responses.clone(),
        );
        let nacks = Family::<Labels, Counter>::default();
        r.register(
            "vitals_xds_nacks",
            "Responses a client refused (NACK), by resource type: the log says why.",
            nacks.clone(),
        );
        let unserved = Counter::default();
        r.register(
            "vitals_xds_unserved_requests",
            "Requests for a resource type vitals-xds does not serve (not answered).",
            unserved.clone(),
        );
        let unmapped = Counter::default();
        r.register(
            "vitals_xds_unmapped_endpoints",
            "Endpoints left out of an assignment because their name is not host:port and the address map has no entry (counted each time an assignment is built).",
            unmapped.clone(),
        );
        Counters {
            streams,
            responses,
            nacks,
            unserved,
            unmapped,
            registry: r,
        }
    }
}

#[derive(Clone)]
pub struct Xds {
    pub table: Arc<Table>,
    pub scopes: NodeScopes,
    pub counters: Arc<Counters>,
}

fn short(type_url: &str) -> String {
    type_url.rsplit('.').next().unwrap_or(type_url).to_owned()
}

impl Xds {
    fn note(&self, note: Option<Note>, peer: &str) {
        match note {
            Some(Note::Nack {
                type_url,
                version,
                reason,
            }) => {
                tracing::warn!(peer, type_url, version, reason, "a client refused a response (NACK)");
                self.counters
                    .nacks
                    .get_or_create(&vec![("type", short(&type_url))])
                    .inc();
            }
            Some(Note::Unserved { type_url }) => {
                tracing::debug!(peer, type_url, "a request for a type not served");
                self.counters.unserved.inc();
            }
            None => {}
        }
    }

    fn sent(&self, type_url: &str) {
        self.counters
            .responses
            .get_or_create(&vec![("type", short(type_url))])
            .inc();
    }

    /// A task per stream: the client's requests and the table's changes through `variant`, its
    /// answers out.
    fn drive<V: Variant>(
        &self,
        inbound: Streaming<V::Req>,
        peer: String,
        mut variant: V,
    ) -> ReceiverStream<Result<V::Resp, Status>> {
        let (tx, rx) = mpsc::channel(16);
        let this = self.clone();
        tokio::spawn(async move {
            let _open = Open::new(&this.counters.streams);
            let mut inbound = inbound;
            let mut changes = this.table.subscribe();
            loop {
                let answers = tokio::select! {
                    msg = inbound.message() => {
                        let Ok(Some(req)) = msg else { break };
                        let unnamed = variant.client().is_none();
                        let (answer, note) = variant.on_request(req, &this.table, now_us());
                        if unnamed {
                            if let Some(client) = variant.client() {
                                tracing::debug!(peer, ?client, "a stream named its node");
                            }
                        }
                        this.note(note, &peer);
                        answer.into_iter().collect::<Vec<_>>()
                    }
                    changed = changes.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        variant.on_change(&this.table, now_us())
                    }
                };
                for a in answers {
                    this.sent(V::type_url(&a));
                    if tx.send(Ok(a)).await.is_err() {
                        return;
                    }
                }
            }
        });
        ReceiverStream::new(rx)
    }
}

/// A stream's protocol, whichever variant ([`Sotw`] or [`Delta`]).
trait Variant: Send + 'static {
    type Req: prost::Message + Default + Send + 'static;
    type Resp: Send + 'static;
    fn client(&self) -> Option<&Client>;
    fn on_request(&mut self, req: Self::Req, src: &Table, now: Micros) -> (Option<Self::Resp>, Option<Note>);
    fn on_change(&mut self, src: &Table, now: Micros) -> Vec<Self::Resp>;
    fn type_url(resp: &Self::Resp) -> &str;
}

impl Variant for Sotw {
    type Req = DiscoveryRequest;
    type Resp = DiscoveryResponse;
    fn client(&self) -> Option<&Client> {
        Sotw::client(self)
    }
    fn on_request(
        &mut self,
        req: DiscoveryRequest,
        src: &Table,
        now: Micros,
    ) -> (Option<DiscoveryResponse>, Option<Note>) {
        Sotw::on_request(self, req, src, now)
    }
    fn on_change(&mut self, src: &Table, now: Micros) -> Vec<DiscoveryResponse> {
        Sotw::on_change(self, src, now)
    }
    fn type_url(resp: &DiscoveryResponse) -> &str {
        &resp.type_url
    }
}

impl Variant for Delta {
    type Req = DeltaDiscoveryRequest;
    type Resp = DeltaDiscoveryResponse;
    fn client(&self) -> Option<&Client> {
        Delta::client(self)
    }
    fn on_request(
        &mut self,
        req: DeltaDiscoveryRequest,
        src: &Table,
        now: Micros,
    ) -> (Option<DeltaDiscoveryResponse>, Option<Note>) {
        Delta::on_request(self, req, src, now)
    }
    fn on_change(&mut self, src: &Table, now: Micros) -> Vec<DeltaDiscoveryResponse> {
        Delta::on_change(self, src, now)
    }
    fn type_url(resp: &DeltaDiscoveryResponse) -> &str {
        &resp.type_url
    }
}

/// A stream counted open while it lives.
struct Open(Gauge);

impl Open {
    fn new(g: &Gauge) -> Open {
        g.inc();
        Open(g.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn peer<T>(r: &Request<T>) -> String {
    r.remote_addr().map_or_else(|| "unknown".to_owned(), |a| a.to_string())
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Xds {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let p = peer(&request);
        Ok(Response::new(self.drive(
            request.into_inner(),
            p,
            Sotw::new(self.scopes, None),
        )))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let p = peer(&request);
        Ok(Response::new(self.drive(
            request.into_inner(),
            p,
            Delta::new(self.scopes, None),
        )))
    }
}

#[tonic::async_trait]
impl EndpointDiscoveryService for Xds {
    type StreamEndpointsStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaEndpointsStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_endpoints(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamEndpointsStream>, Status> {
        let p = peer(&request);
        Ok(Response::new(self.drive(
            request.into_inner(),
            p,
            Sotw::new(self.scopes, Some(ENDPOINTS)),
        )))
    }

    async fn delta_endpoints(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaEndpointsStream>, Status> {
        let p = peer(&request);
        Ok(Response::new(self.drive(
            request.into_inner(),
            p,
            Delta::new(self.scopes, Some(ENDPOINTS)),
        )))
    }

    async fn fetch_endpoints(&self, request: Request<DiscoveryRequest>) -> Result<Response<DiscoveryResponse>, Status> {
        let mut s = Sotw::new(self.scopes, Some(ENDPOINTS));
        match s.on_request(request.into_inner(), &*self.table, now_us()) {
            (Some(a), _) => {
                self.sent(&a.type_url);
                Ok(Response::new(a))
            }
            (None, _) => Err(Status::invalid_argument("only ClusterLoadAssignment is served on EDS")),
        }
    }
}
