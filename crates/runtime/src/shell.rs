//! What every vitals binary does at its edge: structured logs, one cancellation token that the
//! first SIGTERM or Ctrl-C fires, a grace deadline after it, and an immediate exit on a second
//! signal (an operator pressing Ctrl-C twice means it).

use std::future::Future;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Logs to stderr, filtered by `VITALS_LOG` (default `info`, quieter for rdkafka and sqlx).
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("VITALS_LOG")
                .unwrap_or_else(|_| "info,rdkafka=warn,sqlx=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// The open-file limit, raised to the hard limit first if the soft one is lower: a server holds a
/// descriptor per connection, and systemd's default soft limit (1,024) is reached by a few
/// hundred idle clients, after which accepts fail with "Too many open files" and good requests
/// time out. Every binary that listens calls it at start.
pub fn open_file_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let l = getrlimit(Resource::Nofile);
    let (soft, hard) = (l.current.unwrap_or(u64::MAX), l.maximum.unwrap_or(u64::MAX));
    if soft < hard {
        let raised = Rlimit {
            current: l.maximum,
            maximum: l.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return hard;
        }
    }
    soft
}

/// Cancel `cancel` on the first SIGTERM or SIGINT; exit at once (status 130) on the second.
pub fn cancel_on_signals(cancel: CancellationToken) {
    tokio::spawn(async move {
        let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
            tracing::error!("cannot install the SIGTERM handler");
            return;
        };
        let mut signalled = false;
        loop {
            tokio::select! {
                r = tokio::signal::ctrl_c() => if r.is_err() { return },
                _ = term.recv() => {}
            }
            if signalled {
                tracing::warn!("second shutdown signal: exiting now");
                std::process::exit(130);
            }
            signalled = true;
            tracing::info!("shutdown requested; a second signal exits at once");
            cancel.cancel();
        }
    });
}

/// Run a service: tracing, signals, then `service(cancel)` until it returns. After the token
/// fires, the service has `grace` to finish; past it the process fails rather than hang.
pub async fn run<F, Fut>(name: &str, grace: Duration, service: F) -> anyhow::Result<()>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let cancel = CancellationToken::new();
    cancel_on_signals(cancel.clone());
    let run = service(cancel.clone());
    tokio::pin!(run);
    tokio::select! {
        r = &mut run => r,
        _ = async { cancel.cancelled().await; tokio::time::sleep(grace).await } => {
            anyhow::bail!("{name} did not stop within the shutdown grace period of {grace:?}")
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_open_file_limit_is_raised_to_the_hard_one() {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        let before = getrlimit(Resource::Nofile);
        let Some(hard) = before.maximum else { return };
        // Lower the soft limit (any process may), then ask: it comes back up to the hard one.
        let lowered = Rlimit {
            current: Some(hard.min(512)),
            maximum: Some(hard),
        };
        setrlimit(Resource::Nofile, lowered).expect("lowering the soft limit");
        assert_eq!(super::open_file_limit(), hard);
        assert_eq!(getrlimit(Resource::Nofile).current, Some(hard));
    }
}
