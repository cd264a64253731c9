//! A live stream's place under the API's limits: `--max-streams` in all, of which a quarter is
//! kept for clients with a token, and `--max-streams-per-client` per token (or per IP address
//! without one).

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

/// Take a stream slot for `client`, or say why not. Permits taken before a refusal are
/// given back as they drop.
pub fn take_slot(app: &AppState, client: String, anonymous: bool) -> Result<StreamSlot, ApiError> {
    let anonymous_permit = if anonymous {
        Some(app.anonymous_streams.clone().try_acquire_owned().map_err(|_| {
            ApiError::Unavailable("too many anonymous live streams; a token gets a reserved slot".into())
        })?)
    } else {
        None
    };
    let all = app
        .streams
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::Unavailable("too many live streams".into()))?;
    let mut clients = app.stream_clients.lock().unwrap_or_else(|p| p.into_inner());
    if clients.get(&client).copied().unwrap_or(0) >= app.cfg.max_streams_per_client {
        return Err(ApiError::TooMany(format!(
            "this client already holds {} live streams",
            app.cfg.max_streams_per_client
        )));
    }
    *clients.entry(client.clone()).or_insert(0) += 1;
    Ok(StreamSlot {
        _all: all,
        _anonymous: anonymous_permit,
        client,
        clients: app.stream_clients.clone(),
    })
}
