//! The OpenAPI document, generated from the handlers and types so that it cannot drift.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(title = "vitals API", version = "1", description = "Health history, current health, live changes, ingest and operator actions."),
    paths(
        crate::history::history,
        crate::uptime::uptime,
        crate::uptime::incidents,
        crate::health::pools,
        crate::health::pool,
        crate::health::endpoint,
        crate::live::stream::stream,
        crate::ingest::ingest,
        crate::ops::override_endpoint,
        crate::ops::put_policy,
        crate::ops::get_policy,
        crate::probes::healthz,
        crate::probes::readyz,
        crate::probes::metrics,
    ),
    components(schemas(vitals_contracts::view::PoolEvent, vitals_contracts::view::ReasonCode)),
    modifiers(&Bearer),
    tags(
        (name = "history", description = "Which endpoint changed state, when, and why"),
        (name = "health", description = "Current health"),
        (name = "stream", description = "Live changes"),
        (name = "ingest", description = "Signals over HTTP"),
        (name = "operations", description = "Overrides and policies"),
        (name = "service", description = "Liveness, readiness, metrics"),
    )
)]
pub struct ApiDoc;

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}
