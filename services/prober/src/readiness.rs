//! Whether the prober is ready: its results reach the broker (what `/readyz` reads, beside the
//! shard assignment). The sink records each delivery here; the metrics hold it.

/// Whether results reach the broker: what `/readyz` reads. Not ready when the latest delivery
/// failed (a timeout counts), or when results have waited for the broker longer than
/// [`Deliveries::PATIENCE`] with none delivered.
#[derive(Default)]
pub struct Deliveries {
    pending: std::sync::atomic::AtomicI64,
    /// Unix ms of the latest delivered result, of the latest failure, and of when results
    /// started waiting (pending went from 0).
    last_ok: std::sync::atomic::AtomicI64,
    last_failed: std::sync::atomic::AtomicI64,
    waiting_since: std::sync::atomic::AtomicI64,
    /// Unix ms of the latest failure logged (at most one line every 10 s).
    logged: std::sync::atomic::AtomicI64,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Deliveries {
    pub const PATIENCE: std::time::Duration = std::time::Duration::from_secs(15);

    pub fn queued(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.pending.fetch_add(1, Relaxed) == 0 {
            self.waiting_since.store(now_ms(), Relaxed);
        }
    }

    pub fn delivered(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        self.pending.fetch_sub(1, Relaxed);
        self.last_ok.store(now_ms(), Relaxed);
        self.waiting_since.store(now_ms(), Relaxed);
    }

    pub fn failed(&self, error: &dyn std::fmt::Display) {
        use std::sync::atomic::Ordering::Relaxed;
        self.pending.fetch_sub(1, Relaxed);
        let now = now_ms();
        self.last_failed.store(now, Relaxed);
        let logged = self.logged.load(Relaxed);
        if now - logged >= 10_000 && self.logged.compare_exchange(logged, now, Relaxed, Relaxed).is_ok() {
            tracing::warn!(error = %error, "probe results are not delivered to the broker");
        }
    }

    /// Why results are not being delivered, if they are not.
    pub fn problem(&self) -> Option<&'static str> {
        use std::sync::atomic::Ordering::Relaxed;
        let (ok, failed) = (self.last_ok.load(Relaxed), self.last_failed.load(Relaxed));
        if failed > ok {
            return Some("probe results are not delivered: the latest delivery to the broker failed");
        }
        let waiting = now_ms() - self.waiting_since.load(Relaxed).max(ok);
        (self.pending.load(Relaxed) > 0 && waiting > Self::PATIENCE.as_millis() as i64)
            .then_some("probe results have waited for the broker for over 15 s")
    }
}

#[cfg(test)]
mod tests {
    use super::Deliveries;

    #[test]
    fn readiness_follows_the_latest_delivery() {
        let d = Deliveries::default();
        assert_eq!(d.problem(), None, "nothing sent yet");
        d.queued();
        assert_eq!(d.problem(), None, "waiting, not for long");
        d.failed(&"Local: Message timed out");
        assert!(d.problem().unwrap().contains("failed"));
        d.queued();
        d.delivered();
        assert_eq!(d.problem(), None, "delivered again");
    }
}
