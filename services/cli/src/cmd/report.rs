//! `vitals report`: availability and incidents over a range.

use super::{print_typed, Connection};

#[derive(clap::Args)]
pub struct Args {
    /// Start of the range (RFC 3339) [default: seven days before --to].
    #[arg(long)]
    from: Option<String>,
    /// End of the range (RFC 3339) [default: now].
    #[arg(long)]
    to: Option<String>,
    /// Only this pool [default: every pool].
    #[arg(long)]
    pool: Option<String>,
    /// One self-contained HTML page on stdout (redirect it to a file to send it).
    #[arg(long, conflicts_with = "json")]
    html: bool,
    #[command(flatten)]
    conn: Connection,
}

pub async fn run(a: Args) -> anyhow::Result<u8> {
    for (flag, v) in [("--from", &a.from), ("--to", &a.to)] {
        if let Some(v) = v
            .as_deref()
            .filter(|v| chrono::DateTime::parse_from_rfc3339(v).is_err())
        {
            eprintln!("vitals: {flag} {v:?} is not an RFC 3339 time (e.g. 2026-11-24T00:00:00Z)");
            return Ok(2);
        }
    }
    let now = chrono::Utc::now();
    let to = a.to.unwrap_or_else(|| now.to_rfc3339());
    let from = match a.from {
        Some(f) => f,
        None => (chrono::DateTime::parse_from_rfc3339(&to)? - chrono::Duration::days(7)).to_rfc3339(),
    };
    let r = crate::report::read(&a.conn.api()?, &from, &to, a.pool).await?;
    if a.conn.json {
        print_typed(&r)?;
    } else if a.html {
        print!("{}", crate::report::html(&r));
    } else {
        crate::report::print(&r);
    }
    Ok(0)
}
