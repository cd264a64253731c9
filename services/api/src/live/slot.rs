//! A live stream's place under the API's limits: `--max-streams` in all, of which a quarter is
//! kept for clients with a token, and `--max-streams-per-client` per token (or per IP address
//! without one). A resume from further back than the ring takes a second place the same way:
//! `--max-kafka-streams` in all (a quarter kept for tokens), `--max-kafka-streams-per-client`.

use crate::error::ApiError;
use crate::AppState;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::OwnedSemaphorePermit;

/// A live stream's place: its permits and its count against its client, given back on drop.
pub struct StreamSlot {
    _all: OwnedSemaphorePermit,
    _anonymous: Option<OwnedSemaphorePermit>,
    client: String,
    clients: Arc<Mutex<HashMap<String, usize>>>,
}

impl StreamSlot {
    /// Whose place it is: `token:<name>` or `ip:<address>`.
    pub fn client(&self) -> &str {
        &self.client
    }

    /// Taken without a token.
    pub fn anonymous(&self) -> bool {
        self._anonymous.is_some()
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = clients.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                clients.remove(&self.client);
            }
        }
    }
}

/// One kind of place: its permits in all, those anonymous clients may use, the count per client
/// and its cap, and what a refusal says.
pub struct Places {
    pub all: Arc<tokio::sync::Semaphore>,
    pub anonymous: Arc<tokio::sync::Semaphore>,
    pub clients: Arc<Mutex<HashMap<String, usize>>>,
    pub per_client: usize,
    /// "live streams", "live streams resuming from far back".
    pub what: &'static str,
}

impl Places {
    pub fn new(all: usize, per_client: usize, what: &'static str) -> Places {
        Places {
            all: Arc::new(tokio::sync::Semaphore::new(all)),
            anonymous: Arc::new(tokio::sync::Semaphore::new(anonymous_share(all))),
            clients: Arc::default(),
            per_client,
            what,
        }
    }

    /// Take a place for `client`, or say why not. Permits taken before a refusal are given
    /// back as they drop.
    pub fn take(&self, client: &str, anonymous: bool) -> Result<StreamSlot, ApiError> {
        let anonymous_permit = if anonymous {
            Some(self.anonymous.clone().try_acquire_owned().map_err(|_| {
                ApiError::Unavailable(format!(
                    "too many anonymous {}; a token gets a reserved slot",
                    self.what
                ))
            })?)
        } else {
            None
        };
        let all = self
            .all
            .clone()
            .try_acquire_owned()
            .map_err(|_| ApiError::Unavailable(format!("too many {}; retry later", self.what)))?;
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if clients.get(client).copied().unwrap_or(0) >= self.per_client {
            return Err(ApiError::TooMany(format!(
                "this client already holds {} {}",
                self.per_client, self.what
            )));
        }
        *clients.entry(client.to_owned()).or_insert(0) += 1;
        Ok(StreamSlot {
            _all: all,
            _anonymous: anonymous_permit,
            client: client.to_owned(),
            clients: self.clients.clone(),
        })
    }
}

/// Places anonymous clients may use: all but a quarter (at least one is kept for token holders
/// when there are two or more).
pub fn anonymous_share(all: usize) -> usize {
    let reserved = (all / 4).max(usize::from(all > 1));
    all - reserved
}

/// Take a live stream's place for `client`, or say why not.
pub fn take_slot(app: &AppState, client: &str, anonymous: bool) -> Result<StreamSlot, ApiError> {
    app.streams.take(client, anonymous)
}
