//! Live stream of health changes as Server-Sent Events, read from the changes topic.
//!
//! Each event's id is the stream position after it: the next offset of every partition,
//! `0:15,1:7,...`. A client that reconnects with `Last-Event-ID` continues exactly after the
//! last event it received, across API restarts and instances, with nothing lost or repeated.
//! Without it, the stream starts at the end of the topic; a first `ready` event carries the
//! starting position. Events republished by the outbox relay after a crash are dropped by
//! (endpoint, seq).
//!
//! The parts, each using only those before it:
//! - [`protocol`]: positions and ids, the frames, the filter, the decoding of a record into the
//!   event every client shares, the partitions' assignment. Nothing else writes a frame.
//! - [`fanout`]: the live-stream writer threads. A connection whose first request is a stream
//!   the ring can serve is written to by them, one write per delivery and no task per client.
//! - [`hub`]: one reader of the topic per API instance, feeding every client from a ring of
//!   recent events (the replay of a resume) and the live feed (the writers, and a broadcast).
//! - [`feed`]: the response body of a stream served by the HTTP server: a stream asked for on a
//!   kept-alive connection (fed by the hub's broadcast) or from further back than the ring.
//! - [`kafka`]: a client resuming from further back than the ring gets a Kafka consumer of its
//!   own (at most `--max-kafka-streams`).
//! - [`stream`]: the route, its limits and the takeover of a connection by the writers.
//!
//! ## Two paths to one route
//!
//! A stream the writers take ([`stream::takeover`]) is answered before the router sees the
//! connection, so none of the router's layers run for it. What they do, it does itself, with
//! the same code where there is code:
//! - **Method and path**: it takes only a complete HTTP/1.x `GET /v1/stream` head in the first
//!   read; any other method (the router's 405) or path goes to the server untouched.
//! - **Authorization, parameters, slot and start**: one function, `stream::admit`, from the
//!   request's headers and raw query, is all either path runs before serving; the handler
//!   takes no extractor that could refuse on its own.
//! - **Every refusal** (token, parameters, slots, the hub not ready, a resume from further back
//!   than the ring) hands the connection back untouched: the server answers it through every
//!   layer, so error bodies, headers and the metrics of refusals are the server's.
//! - **Limits**: the per-route concurrency limit exempts the stream on both paths (its slots
//!   are its limits, taken by the same `open`); the connection cap and the header-read timeout
//!   apply before the takeover sees the connection (`serve.rs`); a request body is read and
//!   dropped, never parsed (no body limit to apply).
//! - **Metrics**: one request `/v1/stream GET 200` at the hand-over, as `metrics::track`
//!   counts the server's.
//! - **Headers**: [`protocol::HEADERS`] on both (the server's `nosniff` layer sets the same).
//!
//! `tests/stream.rs` opens streams by both paths and checks the same headers, shared slots,
//! the same refusals and the same metrics.
//!
//! A client that falls behind the feed gets a `lagged` event whose id resumes it, and the stream
//! ends. Limits: `--max-streams` in all, of which a quarter is kept for clients with a token;
//! `--max-streams-per-client` per token (or per IP address without one); and a lifetime, after
//! which the stream ends with a `reconnect` event whose id resumes it. A record on the changes
//! topic that cannot be decoded is skipped, logged and counted.

pub mod fanout;
pub mod feed;
pub mod hub;
pub mod kafka;
pub mod protocol;
pub mod slot;
pub mod stream;

pub use hub::Hub;
pub use stream::{stream, takeover, StreamParams};
