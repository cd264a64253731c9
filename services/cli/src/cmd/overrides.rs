//! `vitals override`: an operator action on an endpoint.

use super::{print_typed, Connection};
use crate::api;
use serde_json::json;

#[derive(clap::Args)]
pub struct Args {
    pool: String,
    endpoint: String,
    action: String,
    /// Why (recorded in the audit log with the token's name).
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    conn: Connection,
}

pub async fn run(a: Args) -> anyhow::Result<u8> {
    let Args {
        pool,
        endpoint,
        action,
        reason,
        conn,
    } = a;
    let accepted = conn
        .api()?
        .send_accepted(
            false,
            &format!(
                "/v1/pools/{}/endpoints/{}/override",
                api::seg(&pool),
                api::seg(&endpoint)
            ),
            &json!({"action": action, "reason": reason}),
        )
        .await?;
    if conn.json {
        print_typed(&accepted)?;
    } else {
        println!("accepted: {action} on {pool}/{endpoint} (record {})", accepted.id);
    }
    Ok(0)
}
