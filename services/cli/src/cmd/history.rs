//! `vitals history`: transitions from the audit log, newest first.

use super::{print_typed, Connection};
use crate::api::transition_line;
use vitals_contracts::view;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long)]
    pool: Option<String>,
    #[arg(long)]
    endpoint: Option<String>,
    /// RFC 3339.
    #[arg(long)]
    from: Option<String>,
    /// RFC 3339.
    #[arg(long)]
    to: Option<String>,
    /// Only transitions into this state.
    #[arg(long)]
    state: Option<String>,
    /// At most this many (pages are followed).
    #[arg(long, default_value_t = 50)]
    limit: usize,
    #[command(flatten)]
    conn: Connection,
}

pub async fn run(a: Args) -> anyhow::Result<u8> {
    let api = a.conn.api()?;
    let mut q: Vec<(&str, String)> = [
        ("pool", a.pool),
        ("endpoint", a.endpoint),
        ("from", a.from),
        ("to", a.to),
        ("state", a.state),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| (k, v)))
    .collect();
    q.push(("limit", a.limit.clamp(1, 500).to_string()));
    let mut items: Vec<view::Transition> = Vec::new();
    loop {
        let page: view::HistoryPage = api.get_as("/v1/transitions", &q).await?;
        items.extend(page.items);
        match page.next_cursor {
            Some(c) if items.len() < a.limit => {
                q.retain(|(k, _)| *k != "cursor");
                q.push(("cursor", c));
            }
            _ => break,
        }
    }
    items.truncate(a.limit);
    if a.conn.json {
        print_typed(&items)?;
    } else {
        for t in &items {
            println!("{}", transition_line(t));
        }
    }
    Ok(0)
}
