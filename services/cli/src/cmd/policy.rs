//! `vitals policy get|set`: a pool's policy.

use super::{print_typed, read_policy, Connection};
use crate::api::{self, cell};
use clap::Subcommand;
use serde_json::Value;
use std::path::PathBuf;
use vitals_contracts::view;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand)]
enum Action {
    /// The policy the engine applies to a pool (from the processor's latest snapshot of it).
    Get {
        pool: String,
        #[command(flatten)]
        conn: Connection,
    },
    /// Replace a pool's policy with the one in FILE (JSON; missing fields keep their defaults).
    Set {
        pool: String,
        file: PathBuf,
        #[command(flatten)]
        conn: Connection,
    },
}

pub async fn run(a: Args) -> anyhow::Result<u8> {
    match a.action {
        Action::Get { pool, conn } => {
            let p: view::PoolPolicy = conn
                .api()?
                .get_as(&format!("/v1/pools/{}/policy", api::seg(&pool)), &[])
                .await?;
            if conn.json {
                print_typed(&p)?;
            } else {
                println!("pool {pool}, policy version {}", p.version);
                if let Value::Object(fields) = serde_json::to_value(&p.policy)? {
                    for (k, val) in &fields {
                        println!("  {k:<28} {}", cell(val));
                    }
                }
            }
        }
        Action::Set { pool, file, conn } => {
            let body = read_policy(&file)?;
            let accepted = conn
                .api()?
                .send_accepted(true, &format!("/v1/pools/{}/policy", api::seg(&pool)), &body)
                .await?;
            if conn.json {
                print_typed(&accepted)?;
            } else {
                println!(
                    "accepted: the policy of {pool} from {} (record {})",
                    file.display(),
                    accepted.id
                );
            }
        }
    }
    Ok(0)
}
