//! `vitals tail`: live transitions and pool events from the API's stream.

use super::Connection;
use crate::api::{rfc3339, transition_line};
use serde_json::json;
use vitals_contracts::view;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long)]
    pool: Option<String>,
    #[arg(long)]
    endpoint: Option<String>,
    /// Stop after this many events (0: never).
    #[arg(long, default_value_t = 0)]
    max: usize,
    #[command(flatten)]
    conn: Connection,
}

pub async fn run(a: Args) -> anyhow::Result<u8> {
    let q: Vec<(&str, String)> = [("pool", a.pool), ("endpoint", a.endpoint)]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect();
    let (conn, max) = (a.conn, a.max);
    let mut seen = 0;
    conn.api()?
        .tail(&q, |event, data| {
            if event == "ready" {
                eprintln!("vitals tail: following the live stream");
                return true;
            }
            if event != "health_changed" && event != "pool_changed" {
                return true;
            }
            if conn.json {
                println!("{}", json!({"event": event, "data": data}));
            } else if event == "health_changed" {
                match serde_json::from_value::<view::Transition>(data.clone()) {
                    Ok(t) => println!("{}", transition_line(&t)),
                    Err(e) => eprintln!("vitals tail: a health_changed event this build cannot read: {e}"),
                }
            } else {
                match serde_json::from_value::<view::PoolEvent>(data.clone()) {
                    Ok(p) => println!(
                        "{}  {} pool: {}/{} healthy, panic={} correlated_outage={}",
                        rfc3339(&p.stream_time),
                        p.pool,
                        p.healthy,
                        p.endpoints,
                        p.panic,
                        p.correlated_outage
                    ),
                    Err(e) => eprintln!("vitals tail: a pool_changed event this build cannot read: {e}"),
                }
            }
            seen += 1;
            max == 0 || seen < max
        })
        .await?;
    Ok(0)
}
