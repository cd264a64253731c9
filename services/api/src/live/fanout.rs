//! Live-stream clients written to by a few plain threads, one per core, instead of one task per
//! client. With 10,000 clients, a change costs 10,000 deliveries; through a task per client
//! each was a wake-up, a poll of the HTTP connection and of the stream, a timer check and a
//! waiter registration on the broadcast, about a quarter of the API's CPU per delivery. Here a
//! shard walks its clients and writes the shared frame to each socket: one non-blocking
//! `write` per delivery.
//!
//! The connection stays with its task in the server loop (`stream::takeover`), which holds the
//! stream's slot, notices the client going away (reading until end of file) and closes the
//! socket once the shard says the stream ended; the shard shares the socket and writes to it
//! without waiting (`try_write`).
//!
//! A client whose socket is full gets its frames queued — the shared frames themselves (the
//! ring's and the live feed's `Bytes`), not copies, so a queued event costs a handle, not its
//! bytes; one more than `client_buffer` events behind gets a `lagged` event whose id resumes it,
//! and its stream ends (so a slow client never slows the others). A replay longer than
//! `client_buffer` events is cut there the same way (the hub's `attach`): what one client can
//! hold is bounded, replay included. Every second a shard sends keep-alive comments to clients that had
//! nothing for 15 s, and ends streams past their lifetime with a `reconnect` event.

use super::protocol::{self, Filter, Item, KEEP_ALIVE, KEEP_ALIVE_COMMENT};
use axum::body::Bytes;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// A stream handed to a shard.
pub struct RawClient {
    /// The connection's socket, shared with the connection's task.
    pub sock: Arc<TcpStream>,
    pub filter: Filter,
    /// The position after the last event sent or skipped: the id of a `lagged` or
    /// `reconnect` event.
    pub last_id: String,
    pub ends_at: Instant,
    /// Set by the connection when the client went away.
    pub gone: Arc<AtomicBool>,
    /// Told when the stream ends here (everything written): the connection closes the socket.
    pub ended: tokio::sync::oneshot::Sender<()>,
}

enum Cmd {
    /// A client, its first frames (response head with `ready`, the replay) and whether they
    /// end its stream (a replay cut with `lagged`).
    Attach(Box<RawClient>, Vec<Bytes>, bool),
    Event(Arc<Item>),
    Close,
}

pub struct Fanout {
    shards: Vec<mpsc::Sender<Cmd>>,
    next: AtomicUsize,
    clients: Arc<AtomicUsize>,
}

/// How often a shard looks at every client (lifetimes, keep-alives, clients gone).
const HOUSEKEEPING: Duration = Duration::from_secs(1);
/// How often a shard retries clients with queued frames.
const RETRY: Duration = Duration::from_millis(20);

impl Fanout {
    /// `shards` threads; a client more than `client_buffer` events behind is dropped.
    pub fn new(shards: usize, client_buffer: usize) -> Fanout {
        let clients = Arc::new(AtomicUsize::new(0));
        let shards = (0..shards.max(1))
            .map(|i| {
                let (tx, rx) = mpsc::channel();
                let clients = clients.clone();
                std::thread::Builder::new()
                    .name(format!("live-stream-{i}"))
                    .spawn(move || Shard::new(client_buffer.max(1), clients).run(rx))
                    .expect("spawning a live-stream writer thread");
                tx
            })
            .collect();
        Fanout {
            shards,
            next: AtomicUsize::new(0),
            clients,
        }
    }

    /// Clients attached.
    pub fn clients(&self) -> usize {
        self.clients.load(Ordering::Relaxed)
    }

    /// Hand a client to a shard; `first` goes out before any later event, and ends the stream
    /// if `last` says so.
    pub fn attach(&self, client: Box<RawClient>, first: Vec<Bytes>, last: bool) {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.shards.len();
        self.clients.fetch_add(1, Ordering::Relaxed);
        if self.shards[i].send(Cmd::Attach(client, first, last)).is_err() {
            self.clients.fetch_sub(1, Ordering::Relaxed);
        }
    }

    pub fn send(&self, item: &Arc<Item>) {
        for s in &self.shards {
            let _ = s.send(Cmd::Event(item.clone()));
        }
    }

    /// End every stream (the API shuts down).
    pub fn close(&self) {
        for s in &self.shards {
            let _ = s.send(Cmd::Close);
        }
    }
}

impl Drop for Fanout {
    fn drop(&mut self) {
        self.close();
    }
}

struct Client {
    c: RawClient,
    /// What the socket did not take yet, in order: shared frames, and the unwritten rest of
    /// the first one.
    queued: VecDeque<Bytes>,
    /// Events in `queued` (reset when it empties).
    queued_events: usize,
    /// A last event (`lagged`, `reconnect`) is written or queued: end once `queued` empties.
    closing: bool,
    /// Something was written since the last keep-alive check.
    sent: bool,
    dead: bool,
}

/// Frames written to a socket in one call, at most.
const WRITE_BATCH: usize = 64;

impl Client {
    /// Write `bytes` after anything queued; what the socket does not take is queued.
    fn put(&mut self, bytes: Bytes) {
        if !self.queued.is_empty() {
            self.queued.push_back(bytes);
            return;
        }
        match self.c.sock.try_write(&bytes) {
            Ok(n) if n == bytes.len() => self.sent = true,
            Ok(n) => {
                self.sent = true;
                self.queued.push_back(bytes.slice(n..));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => self.queued.push_back(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => self.put(bytes),
            Err(_) => self.dead = true,
        }
    }

    fn flush(&mut self) {
        while !self.queued.is_empty() && !self.dead {
            // On the stack: a flush of a slow client allocates nothing.
            let mut slices = [std::io::IoSlice::new(&[]); WRITE_BATCH];
            let mut n = 0;
            for (slot, b) in slices.iter_mut().zip(&self.queued) {
                *slot = std::io::IoSlice::new(b);
                n += 1;
            }
            match self.c.sock.try_write_vectored(&slices[..n]) {
                Ok(0) => self.dead = true,
                Ok(mut n) => {
                    self.sent = true;
                    while n > 0 {
                        let Some(front) = self.queued.front_mut() else { break };
                        if n >= front.len() {
                            n -= front.len();
                            self.queued.pop_front();
                        } else {
                            *front = front.slice(n..);
                            n = 0;
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => self.dead = true,
            }
        }
        if self.queued.is_empty() {
            self.queued_events = 0;
        }
    }

    /// Offer an event; whether this client has bytes queued after it.
    fn offer(&mut self, item: &Item, buffer: usize) -> bool {
        if self.closing || self.dead {
            return !self.queued.is_empty();
        }
        let wanted = self.c.filter.wants(item);
        if wanted && !self.queued.is_empty() && self.queued_events >= buffer {
            let missed = self.queued_events;
            // Its id is the position before this event, which is not sent.
            self.queued.push_back(protocol::lagged(&self.c.last_id, missed as u64));
            self.closing = true;
            return true;
        }
        self.c.last_id.clone_from(&item.id);
        if !wanted {
            return !self.queued.is_empty();
        }
        let was_queued = !self.queued.is_empty();
        self.put(item.frame.clone());
        if was_queued || !self.queued.is_empty() {
            self.queued_events += 1;
        }
        !self.queued.is_empty()
    }

    /// Let go of the socket, then tell the connection (which closes it).
    fn end(self) {
        let RawClient { sock, ended, .. } = self.c;
        drop(sock);
        let _ = ended.send(());
    }

    /// Whether its stream ended (`gone`: only looked at in housekeeping, a cache miss each).
    fn finished(&self, gone: bool) -> bool {
        self.dead || (self.closing && self.queued.is_empty()) || (gone && self.c.gone.load(Ordering::Relaxed))
    }
}

struct Shard {
    clients: Vec<Client>,
    buffer: usize,
    count: Arc<AtomicUsize>,
    /// Some client has bytes queued (retry soon).
    queued: bool,
}

impl Shard {
    fn new(buffer: usize, count: Arc<AtomicUsize>) -> Shard {
        Shard {
            clients: Vec::new(),
            buffer,
            count,
            queued: false,
        }
    }

    fn run(mut self, rx: mpsc::Receiver<Cmd>) {
        let mut housekeeping = Instant::now() + HOUSEKEEPING;
        let mut keep_alive = Instant::now() + KEEP_ALIVE;
        loop {
            let queued = self.queued;
            let wait = if queued {
                RETRY
            } else {
                housekeeping.saturating_duration_since(Instant::now())
            };
            match rx.recv_timeout(wait) {
                Ok(cmd) => {
                    if !self.take(cmd) {
                        return self.close();
                    }
                    // What is already waiting, before looking at anything else.
                    while let Ok(cmd) = rx.try_recv() {
                        if !self.take(cmd) {
                            return self.close();
                        }
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return self.close(),
            }
            let now = Instant::now();
            let house = now >= housekeeping;
            if house {
                housekeeping = now + HOUSEKEEPING;
            }
            let beat = now >= keep_alive;
            if beat {
                keep_alive = now + KEEP_ALIVE;
            }
            if house || queued {
                self.queued = false;
                for c in &mut self.clients {
                    c.flush();
                    if house && !c.closing && now >= c.c.ends_at {
                        let last = protocol::reconnect(&c.c.last_id);
                        c.put(last);
                        c.closing = true;
                    }
                    if beat && !std::mem::take(&mut c.sent) && !c.closing {
                        c.put(Bytes::from_static(KEEP_ALIVE_COMMENT));
                    }
                    self.queued |= !c.queued.is_empty();
                }
            }
            self.sweep(house);
        }
    }

    /// Take a command; false on `Close`.
    fn take(&mut self, cmd: Cmd) -> bool {
        match cmd {
            Cmd::Attach(c, first, last) => {
                let mut c = Client {
                    c: *c,
                    queued: VecDeque::new(),
                    // The replay counts against the buffer like live events.
                    queued_events: first.len().saturating_sub(1),
                    closing: last,
                    sent: false,
                    dead: false,
                };
                for f in first {
                    c.put(f);
                }
                if c.queued.is_empty() {
                    c.queued_events = 0;
                }
                self.queued |= !c.queued.is_empty();
                self.clients.push(c);
            }
            Cmd::Event(item) => {
                for c in &mut self.clients {
                    self.queued |= c.offer(&item, self.buffer);
                }
            }
            Cmd::Close => return false,
        }
        true
    }

    /// Drop the clients whose stream ended, telling their connections.
    fn sweep(&mut self, gone: bool) {
        let mut i = 0;
        while i < self.clients.len() {
            if self.clients[i].finished(gone) {
                self.count.fetch_sub(1, Ordering::Relaxed);
                self.clients.swap_remove(i).end();
            } else {
                i += 1;
            }
        }
    }

    fn close(mut self) {
        for c in self.clients.drain(..) {
            self.count.fetch_sub(1, Ordering::Relaxed);
            c.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::protocol::Positions;
    use tokio::io::AsyncReadExt;

    fn item(offset: i64) -> Arc<Item> {
        let id = format!("0:{}", offset + 1);
        Arc::new(Item {
            partition: 0,
            offset,
            kind: "health_changed",
            pool: "p".into(),
            endpoint: Some("e".into()),
            frame: Bytes::from(format!(
                "event: health_changed\nid: {id}\ndata: {{\"n\":{offset},\"pad\":\"{}\"}}\n\n",
                "x".repeat(1000)
            )),
            id,
        })
    }

    /// A client of `fanout` on a new connection (`small` socket buffers: a client that does
    /// not read fills them quickly); the reading end, and the signal that its stream ended.
    async fn client(
        fanout: &Fanout,
        small: bool,
    ) -> (
        tokio::net::TcpStream,
        tokio::sync::oneshot::Receiver<()>,
        Arc<TcpStream>,
    ) {
        let listener = tokio::net::TcpSocket::new_v4().unwrap();
        let reader = tokio::net::TcpSocket::new_v4().unwrap();
        if small {
            listener.set_send_buffer_size(4096).unwrap();
            reader.set_recv_buffer_size(4096).unwrap();
        }
        listener.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = listener.listen(1).unwrap();
        let reader = reader.connect(listener.local_addr().unwrap()).await.unwrap();
        let (sock, _) = listener.accept().await.unwrap();
        sock.writable().await.unwrap();
        let sock = Arc::new(sock);
        let (ended, ended_rx) = tokio::sync::oneshot::channel();
        fanout.attach(
            Box::new(RawClient {
                sock: sock.clone(),
                filter: Filter {
                    from: Positions::new(),
                    pool: None,
                    endpoint: None,
                },
                last_id: "0:0".into(),
                ends_at: Instant::now() + Duration::from_secs(3600),
                gone: Arc::default(),
                ended,
            }),
            vec![Bytes::from_static(b"head\n\n")],
            false,
        );
        (reader, ended_rx, sock)
    }

    /// The events' numbers and ids in what a client read (whole events only), and the id of
    /// its `lagged` event.
    fn parse(text: &str) -> (Vec<i64>, Vec<String>, Option<String>) {
        let (mut ns, mut ids, mut lagged) = (Vec::new(), Vec::new(), None);
        let whole = text.rfind("\n\n").map_or("", |i| &text[..i]);
        for ev in whole.split("\n\n") {
            let field = |name: &str| ev.lines().find_map(|l| l.strip_prefix(name)).map(str::to_owned);
            match field("event: ").as_deref() {
                Some("health_changed") => {
                    let data: serde_json::Value = serde_json::from_str(&field("data: ").unwrap()).unwrap();
                    ns.push(data["n"].as_i64().unwrap());
                    ids.push(field("id: ").unwrap());
                }
                Some("lagged") => lagged = field("id: "),
                _ => {}
            }
        }
        (ns, ids, lagged)
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_lags_and_resumes_exactly_and_never_slows_the_others() {
        let fanout = Fanout::new(1, 8);
        let (mut slow, slow_ended, _slow_sock) = client(&fanout, true).await;
        let (mut fast, _fast_ended, _fast_sock) = client(&fanout, false).await;
        let n = 300;
        // The fast client reads each event before the next is sent; the slow one reads nothing.
        let mut fast_text = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        for i in 0..n {
            fanout.send(&item(i));
            while parse(&String::from_utf8_lossy(&fast_text)).0.len() <= i as usize {
                let k = tokio::time::timeout(Duration::from_secs(10), fast.read(&mut buf))
                    .await
                    .expect("the fast client is not held up by the slow one")
                    .unwrap();
                assert!(k > 0, "the fast client's stream ended");
                fast_text.extend_from_slice(&buf[..k]);
            }
        }
        assert_eq!(
            parse(&String::from_utf8(fast_text).unwrap()).0,
            (0..n).collect::<Vec<_>>()
        );
        // The slow client now reads: a prefix of the events in order, then `lagged`, whose id
        // is the last event's it got; then its stream ends.
        let mut text = Vec::new();
        let mut ended = Box::pin(slow_ended);
        loop {
            tokio::select! {
                r = slow.read(&mut buf) => {
                    let k = r.unwrap();
                    text.extend_from_slice(&buf[..k]);
                    if k == 0 { break; }
                }
                _ = &mut ended => {
                    // What the connection does when told: close (after reading what is left).
                    let _ = tokio::time::timeout(Duration::from_millis(500), slow.read_to_end(&mut text)).await;
                    break;
                }
            }
        }
        let (ns, ids, lagged) = parse(&String::from_utf8(text).unwrap());
        assert!(!ns.is_empty() && ns.len() < n as usize, "{} events", ns.len());
        assert_eq!(ns, (0..ns.len() as i64).collect::<Vec<_>>(), "in order, none skipped");
        assert_eq!(
            lagged.as_ref(),
            ids.last(),
            "`lagged` resumes after the last event it got"
        );
        assert_eq!(fanout.clients(), 1, "the slow client is gone; the fast one stays");
    }
}
