//! `vitals`: the engine as a filter for what-if simulation, and the HTTP API's routes as verbs.
//!
//!   vitals simulate [--policy FILE] < signals.jsonl > decisions.jsonl
//!   vitals health [POOL [ENDPOINT]]      vitals history [--pool P] [--endpoint E] [--from T] [--to T]
//!   vitals override POOL ENDPOINT ACTION --reason WHY
//!   vitals policy get|set POOL [FILE]    vitals tail [--pool P] [--endpoint E]
//!   vitals backtest --from T1 --to T2 --policy candidate.json [--pool P] [--html report.html]
//!   vitals scenarios [--policy candidate.json]
//!   vitals report [--from T] [--to T] [--pool P] [--json|--html]
//!
//! Exit codes: 0 done; 1 the API (or a file) could not be reached or read; 2 bad usage; 3 the API
//! refused the request (the message says why); 4 `simulate` met bad input lines (each has its
//! error line; the others were processed).

mod api;
mod backtest;
mod cmd;
mod report;
mod scenarios;
mod simulate;

use api::Refused;
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "vitals",
    version,
    about = "The vitals command: what-if simulation and the API's routes as verbs"
)]
struct Cli {
    #[command(subcommand)]
    command: cmd::Command,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command.run().await {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("vitals: {e:#}");
            let refused = e.downcast_ref::<Refused>().is_some();
            std::process::ExitCode::from(if refused { 3 } else { 1 })
        }
    }
}
