//! What the HTTP services' own accept loops share (the API's, the OTLP receiver's): how many
//! connections fit the open-file limit, and backing off accept errors.

use std::time::Duration;

/// The connections to allow: `requested` (0: as many as fit, at most `max`) with `reserve` open
/// files kept for everything else `who` needs, under an open-file limit of `limit`.
pub fn fit_connections(requested: usize, reserve: u64, limit: u64, max: usize, who: &str) -> anyhow::Result<usize> {
    let room = limit.saturating_sub(reserve);
    if requested == 0 {
        anyhow::ensure!(
            room >= 16,
            "the open-file limit ({limit}, ulimit -n) leaves room for {room} connections beside the {reserve} \
             files {who} needs: raise the limit"
        );
        return Ok((room as usize).min(max));
    }
    anyhow::ensure!(
        requested as u64 <= room,
        "--max-connections {requested} needs about {} open files with the {reserve} {who} needs, but the \
         open-file limit is {limit} (ulimit -n): raise the limit, or lower --max-connections to at most {room} \
         (0 fits it to the limit)",
        requested as u64 + reserve
    );
    Ok(requested)
}

/// Accept errors in a row: each waits twice as long as the last (50 ms up to 1 s), and they are
/// logged at most once every 10 s, with how many there were (a full descriptor table used to
/// write a line every 50 ms).
#[derive(Default)]
pub struct AcceptErrors {
    in_a_row: u32,
    unlogged: u64,
    logged_at: Option<std::time::Instant>,
}

impl AcceptErrors {
    pub fn ok(&mut self) {
        if self.in_a_row > 0 {
            tracing::info!(errors = self.unlogged, "accepting connections again");
        }
        self.in_a_row = 0;
        self.unlogged = 0;
    }

    /// Count an error; how long to wait before the next accept.
    pub fn failed(&mut self, e: &std::io::Error) -> Duration {
        self.in_a_row = self.in_a_row.saturating_add(1);
        self.unlogged += 1;
        if self.logged_at.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            tracing::warn!(error = %e, errors = self.unlogged, "accept failed; backing off");
            self.logged_at = Some(std::time::Instant::now());
            self.unlogged = 0;
        }
        (Duration::from_millis(50) * 2u32.saturating_pow(self.in_a_row.min(6) - 1)).min(Duration::from_secs(1))
    }
}

impl AcceptErrors {
    /// The next connection on `listener`, accept errors (EMFILE and the like) backed off rather
    /// than spun on; `None` once `cancel` fires.
    pub async fn next(
        &mut self,
        listener: &tokio::net::TcpListener,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Option<(tokio::net::TcpStream, std::net::SocketAddr)> {
        loop {
            let accepted = tokio::select! {
                _ = cancel.cancelled() => return None,
                a = listener.accept() => a,
            };
            match accepted {
                Ok(a) => {
                    self.ok();
                    return Some(a);
                }
                Err(e) => {
                    let pause = self.failed(&e);
                    tokio::select! {
                        _ = cancel.cancelled() => return None,
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::AcceptErrors;
    use std::time::Duration;

    #[test]
    fn accept_errors_back_off_to_a_second_and_start_over_after_a_success() {
        let mut a = AcceptErrors::default();
        let e = std::io::Error::from_raw_os_error(24); // EMFILE
        let waits: Vec<u128> = (0..7).map(|_| a.failed(&e).as_millis()).collect();
        assert_eq!(waits, [50, 100, 200, 400, 800, 1000, 1000]);
        a.ok();
        assert_eq!(a.failed(&e), Duration::from_millis(50));
    }
}
