//! `vitals health`: every pool, one pool's endpoints, or one endpoint.

use super::{print_typed, Connection};
use crate::api::{self, rfc3339, table, transition_line};
use vitals_contracts::view;

#[derive(clap::Args)]
pub struct Args {
    pool: Option<String>,
    endpoint: Option<String>,
    #[command(flatten)]
    conn: Connection,
}

pub async fn run(a: Args) -> anyhow::Result<u8> {
    let Args { pool, endpoint, conn } = a;
    let api = conn.api()?;
    let f2 = |v: f64| format!("{v:.2}");
    match (pool, endpoint) {
        (None, _) => {
            let pools = crate::report::all_pools(&api).await?;
            if conn.json {
                print_typed(&view::PoolPage {
                    pools,
                    next_after: None,
                })?;
                return Ok(0);
            }
            let rows = pools
                .iter()
                .map(|p| {
                    let out = p
                        .by_state
                        .get(view::StateName::Unhealthy.as_str())
                        .copied()
                        .unwrap_or(0);
                    vec![p.pool.clone(), format!("{}/{}", p.healthy, p.total), out.to_string()]
                })
                .collect::<Vec<_>>();
            table(&["pool", "healthy", "unhealthy"], &rows);
        }
        (Some(pool), None) => {
            // Every endpoint of the pool, a page at a time.
            let path = format!("/v1/pools/{}", api::seg(&pool));
            let mut p: view::PoolHealth = api.get_as(&path, &[("limit", "1000".into())]).await?;
            while let Some(after) = p.next_after.take() {
                let next: view::PoolHealth = api.get_as(&path, &[("limit", "1000".into()), ("after", after)]).await?;
                p.endpoints.extend(next.endpoints);
                p.next_after = next.next_after;
            }
            if conn.json {
                print_typed(&p)?;
                return Ok(0);
            }
            let rows = p
                .endpoints
                .iter()
                .map(|e| {
                    vec![
                        e.endpoint.clone(),
                        e.state.as_str().to_owned(),
                        f2(e.weight),
                        f2(e.score),
                        f2(e.failure_rate),
                        rfc3339(&e.since),
                        e.reason.clone(),
                    ]
                })
                .collect::<Vec<_>>();
            table(
                &[
                    "endpoint",
                    "state",
                    "weight",
                    "score",
                    "failure rate",
                    "since",
                    "reason",
                ],
                &rows,
            );
        }
        (Some(pool), Some(ep)) => {
            let d: view::EndpointDetail = api
                .get_as(
                    &format!("/v1/pools/{}/endpoints/{}", api::seg(&pool), api::seg(&ep)),
                    &[],
                )
                .await?;
            if conn.json {
                print_typed(&d)?;
                return Ok(0);
            }
            let c = &d.current;
            for (k, v) in [
                ("state", c.state.as_str().to_owned()),
                ("weight", f2(c.weight)),
                ("ramp_ms", c.ramp_ms.to_string()),
                ("score", f2(c.score)),
                ("failure_rate", f2(c.failure_rate)),
                ("since", rfc3339(&c.since)),
                ("reason", c.reason.clone()),
                ("seq", c.seq.to_string()),
            ] {
                println!("{k:<13} {v}");
            }
            if let Some(t) = &d.last_transition {
                println!("last          {}", transition_line(t));
            }
        }
    }
    Ok(0)
}
