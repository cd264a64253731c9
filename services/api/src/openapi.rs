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

#[cfg(test)]
mod tests {
    use utoipa::OpenApi;

    /// The document's bounds are the checks' own: each parameter type builds its schema from
    /// the constants it checks against (see `params`).
    #[test]
    fn the_documented_bounds_are_the_checked_ones() {
        let doc = serde_json::to_value(super::ApiDoc::openapi()).unwrap();
        let param = |path: &str, name: &str| {
            doc["paths"][path]["get"]["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == name)
                .unwrap_or_else(|| panic!("{path} {name}"))["schema"]
                .clone()
        };
        let limit = param("/v1/transitions", "limit");
        assert_eq!(limit["maximum"], crate::history::MAX_LIMIT as f64);
        assert_eq!(limit["minimum"], 1.0);
        let pool = param("/v1/transitions", "pool");
        assert_eq!(pool["maxLength"], crate::params::MAX_NAME);
        assert_eq!(pool["minLength"], 1);
        let state = param("/v1/transitions", "state");
        let states: Vec<&str> = state["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(states, vitals_contracts::HealthState::names());
        let endpoints = param("/v1/pools", "endpoints");
        assert_eq!(
            (endpoints["minimum"].as_f64(), endpoints["maximum"].as_f64()),
            (Some(0.0), Some(1000.0))
        );
        // Every query parameter's schema is a type of its own, never a dangling reference.
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                for p in op["parameters"].as_array().into_iter().flatten() {
                    assert!(
                        !p["schema"]["type"].is_null(),
                        "{method} {path} {}: {}",
                        p["name"],
                        p["schema"]
                    );
                }
            }
        }
    }
}
