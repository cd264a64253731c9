//! The per-endpoint sequence check that every consumer of the changes topic applies. Each
//! `HealthChanged` carries its endpoint's `seq` (1, 2, 3, …); the outbox relay may publish one
//! twice after a crash, and a consumer that fell behind may miss some. One rule, here, for the
//! health view, the API's live stream and hub, and the alerter: a `seq` at or below the last one
//! seen is a duplicate (dropped), one more than the last is the next, anything beyond is a gap
//! (applied: it is the endpoint's latest state, but what came between was missed).

use std::collections::HashMap;

/// What a change's `seq` is, against the last one seen of its endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The next change of the endpoint (or its first one seen).
    Next,
    /// Newer than the next: changes were missed (the state it carries is still the latest).
    Gap,
    /// Seen already (a republished change): drop it.
    Duplicate,
}

impl Applied {
    /// `seq` against `last` (None: nothing seen of the endpoint yet).
    pub fn of(last: Option<i64>, seq: i64) -> Applied {
        match last {
            Some(l) if seq <= l => Applied::Duplicate,
            Some(l) if seq > l.saturating_add(1) => Applied::Gap,
            _ => Applied::Next,
        }
    }
}

/// The last `seq` of every endpoint seen, for a consumer that keeps nothing else per endpoint.
#[derive(Debug, Default)]
pub struct SeqGate {
    last: HashMap<(String, String), i64>,
}

impl SeqGate {
    /// Check a change and, unless it is a duplicate, remember its `seq`.
    pub fn admit(&mut self, pool: &str, endpoint: &str, seq: i64) -> Applied {
        let key = (pool.to_owned(), endpoint.to_owned());
        let applied = Applied::of(self.last.get(&key).copied(), seq);
        if applied != Applied::Duplicate {
            self.last.insert(key, seq);
        }
        applied
    }

    /// Endpoints seen.
    pub fn len(&self) -> usize {
        self.last.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_are_refused_and_gaps_told() {
        let mut g = SeqGate::default();
        assert_eq!(g.admit("p", "a", 1), Applied::Next);
        assert_eq!(g.admit("p", "a", 1), Applied::Duplicate);
        assert_eq!(g.admit("p", "a", 2), Applied::Next);
        assert_eq!(g.admit("p", "a", 5), Applied::Gap);
        assert_eq!(g.admit("p", "a", 3), Applied::Duplicate, "older than the latest");
        assert_eq!(g.admit("p", "b", 9), Applied::Next, "the first seen of an endpoint");
        assert_eq!(g.admit("q", "a", 1), Applied::Next, "pools apart");
        assert_eq!(g.len(), 3);
    }
}
