//! Where lines come from. Each input runs on its own thread until `stop` is set, reading with a
//! short timeout so that it notices. Syslog inputs take one message per datagram (when the
//! reporter's queue is full their reports are dropped, counted: a datagram cannot wait). A
//! followed file is read line by line from its end (or its start), waiting for room in the
//! reporter's queue (a backlog is read as fast as it can be sent, never dropped), and reopened
//! when it is rotated (its inode changes: the old file is read until it has been quiet for
//! `rotated_quiet`, since the gateway writes to it until it reopens its log) or truncated (it
//! shrinks).

use crate::bridge::{Bridge, InputCounters};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::UdpSocket;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const TICK: Duration = Duration::from_millis(200);

/// An input as given on the command line.
#[derive(Debug, Clone)]
pub enum Input {
    Udp(String),
    Unix(PathBuf),
    File(PathBuf),
}

impl Input {
    pub fn name(&self) -> String {
        match self {
            Input::Udp(a) => format!("udp:{a}"),
            Input::Unix(p) => format!("unix:{}", p.display()),
            Input::File(p) => format!("file:{}", p.display()),
        }
    }
}

/// A started input: its counters and its thread.
pub struct Running {
    pub name: String,
    pub counters: Arc<InputCounters>,
    /// The UDP socket's inode, for its kernel drop count.
    udp_inode: Option<u64>,
    pub thread: JoinHandle<()>,
}

/// Options of the socket inputs.
#[derive(Debug, Clone, Copy)]
pub struct SocketOptions {
    /// Mode of a Unix socket file the bridge creates (e.g. 0o660).
    pub unix_mode: u32,
    /// Read a followed file from its start (default: its end, as `tail -F`).
    pub from_start: bool,
    /// The receive buffer asked of the kernel for each socket (capped by net.core.rmem_max): it
    /// absorbs bursts while the bridge is not scheduled; beyond it, datagrams are dropped.
    pub recv_buffer: usize,
    /// A rotated file is read until it has written nothing for this long (after the new one
    /// appeared), then the new one.
    pub rotated_quiet: Duration,
}

/// The senders a UDP input takes datagrams from: networks (`10.0.0.0/8`, `2001:db8::/32`, an
/// address alone), or, with none given, loopback only. A log line is evidence that can take an
/// endpoint out, and syslog over UDP carries no credential: who may send is where it comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Senders(Vec<(std::net::IpAddr, u8)>);

impl Senders {
    /// Parse `a.b.c.d/n`, `addr/n` or an address alone; the error names the entry.
    pub fn parse(list: &[String]) -> anyhow::Result<Senders> {
        let mut out = Vec::new();
        for entry in list.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            let (ip, bits) = match entry.split_once('/') {
                Some((ip, bits)) => (ip, Some(bits)),
                None => (entry, None),
            };
            let ip: std::net::IpAddr = ip
                .parse()
                .map_err(|_| anyhow::anyhow!("--udp-allow-from {entry:?}: not an address or a network (a.b.c.d/n)"))?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let bits = match bits {
                None => max,
                Some(b) => b
                    .parse::<u8>()
                    .ok()
                    .filter(|b| *b <= max)
                    .ok_or_else(|| anyhow::anyhow!("--udp-allow-from {entry:?}: the prefix must be 0 to {max}"))?,
            };
            out.push((ip, bits));
        }
        Ok(Senders(out))
    }

    pub fn allows(&self, from: std::net::IpAddr) -> bool {
        let from = match from {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(from, std::net::IpAddr::V4),
            v4 => v4,
        };
        if self.0.is_empty() {
            return from.is_loopback();
        }
        self.0.iter().any(|(net, bits)| match (net, from) {
            (std::net::IpAddr::V4(n), std::net::IpAddr::V4(f)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(*bits)).unwrap_or(0);
                u32::from(*n) & mask == u32::from(f) & mask
            }
            (std::net::IpAddr::V6(n), std::net::IpAddr::V6(f)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(*bits)).unwrap_or(0);
                u128::from(*n) & mask == u128::from(f) & mask
            }
            _ => false,
        })
    }
}

/// A datagram socket bound to `addr`, with the receive buffer asked for; logs what the kernel
/// granted.
fn datagram_socket(
    domain: socket2::Domain,
    addr: &socket2::SockAddr,
    opts: &SocketOptions,
    name: &str,
) -> anyhow::Result<socket2::Socket> {
    let protocol = (domain != socket2::Domain::UNIX).then_some(socket2::Protocol::UDP);
    let s = socket2::Socket::new(domain, socket2::Type::DGRAM, protocol)?;
    if opts.recv_buffer > 0 {
        s.set_recv_buffer_size(opts.recv_buffer)?;
    }
    s.bind(addr).map_err(|e| anyhow::anyhow!("binding {name}: {e}"))?;
    s.set_read_timeout(Some(TICK))?;
    tracing::info!(
        input = name,
        recv_buffer = s.recv_buffer_size().unwrap_or(0),
        "socket bound"
    );
    Ok(s)
}

/// Bind or open `input` (errors now, before the service says it is ready) and start reading it.
pub fn start(
    input: &Input,
    bridge: Arc<Bridge>,
    stop: Arc<AtomicBool>,
    opts: SocketOptions,
    senders: Senders,
) -> anyhow::Result<Running> {
    let name = input.name();
    let counters = Arc::new(InputCounters::default());
    let (c, n) = (counters.clone(), name.clone());
    let thread_name = format!("logbridge-{}", name.split(':').next().unwrap_or("input"));
    let spawn = |f: Box<dyn FnOnce() + Send>| std::thread::Builder::new().name(thread_name.clone()).spawn(f);
    let (thread, udp_inode) = match input {
        Input::Udp(addr) => {
            let sa: std::net::SocketAddr = std::net::ToSocketAddrs::to_socket_addrs(addr)
                .map_err(|e| anyhow::anyhow!("UDP address {addr}: {e}"))?
                .next()
                .ok_or_else(|| anyhow::anyhow!("UDP address {addr} does not resolve"))?;
            let s: UdpSocket = datagram_socket(socket2::Domain::for_address(sa), &sa.into(), &opts, &name)?.into();
            let inode = socket_inode(&s);
            let refused = c.clone();
            let from_allowed = move |buf: &mut [u8]| loop {
                let (len, from) = s.recv_from(buf)?;
                if senders.allows(from.ip()) {
                    return Ok(len);
                }
                refused.refused.fetch_add(1, Ordering::Relaxed);
            };
            let t = spawn(Box::new(move || datagrams(from_allowed, &bridge, &c, &n, &stop)))?;
            (t, inode)
        }
        Input::Unix(path) => {
            if path.exists() {
                // A socket left by an earlier run; anything else is not ours to remove.
                let meta = std::fs::symlink_metadata(path)?;
                if !std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) {
                    anyhow::bail!("{} exists and is not a socket", path.display());
                }
                std::fs::remove_file(path)?;
            }
            let addr = socket2::SockAddr::unix(path)?;
            let s: UnixDatagram = datagram_socket(socket2::Domain::UNIX, &addr, &opts, &name)?.into();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(opts.unix_mode))?;
            let t = spawn(Box::new(move || datagrams(|buf| s.recv(buf), &bridge, &c, &n, &stop)))?;
            (t, None)
        }
        Input::File(path) => {
            let path = path.clone();
            let t = spawn(Box::new(move || follow(&path, &opts, &bridge, &c, &n, &stop)))?;
            (t, None)
        }
    };
    Ok(Running {
        name,
        counters,
        udp_inode,
        thread,
    })
}

fn datagrams(
    mut recv: impl FnMut(&mut [u8]) -> std::io::Result<usize>,
    bridge: &Bridge,
    c: &InputCounters,
    name: &str,
    stop: &AtomicBool,
) {
    let mut buf = vec![0u8; 65_536];
    while !stop.load(Ordering::Relaxed) {
        match recv(&mut buf) {
            Ok(n) => {
                c.lines.fetch_add(1, Ordering::Relaxed);
                bridge.line(&buf[..n], name);
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => {
                tracing::warn!(input = name, error = %e, "receive failed");
                std::thread::sleep(TICK);
            }
        }
    }
}

/// The file's identity: a new inode at the same path means it was rotated.
fn identity(m: &std::fs::Metadata) -> (u64, u64) {
    (m.dev(), m.ino())
}

/// Follow `path` like `tail -F`: lines as they are appended; across rotation (the old file is
/// read until it has been quiet for `opts.rotated_quiet` since the new one appeared, then the new
/// one from its start) and truncation (read again from the start). A line longer than the
/// bridge's limit is counted and skipped to its end.
pub fn follow(path: &Path, opts: &SocketOptions, bridge: &Bridge, c: &InputCounters, name: &str, stop: &AtomicBool) {
    let from_start = opts.from_start;
    let mut file: Option<(File, (u64, u64), u64)> = None;
    // When the file last gave bytes, and when its rotation was first seen.
    let mut last_data = Instant::now();
    let mut rotated_at: Option<Instant> = None;
    let mut first = true;
    let mut pending: Vec<u8> = Vec::new();
    let mut skipping = false;
    let mut buf = vec![0u8; 256 * 1024];
    let mut missing_logged = false;
    while !stop.load(Ordering::Relaxed) {
        let Some((f, id, pos)) = file.as_mut() else {
            match File::open(path).and_then(|f| Ok((f.metadata()?, f))) {
                Ok((m, mut f)) => {
                    let at = if first && !from_start { m.len() } else { 0 };
                    if f.seek(SeekFrom::Start(at)).is_ok() {
                        tracing::info!(input = name, from = at, "following");
                        c.opened.fetch_add(1, Ordering::Relaxed);
                        file = Some((f, identity(&m), at));
                        rotated_at = None;
                        first = false;
                        missing_logged = false;
                    }
                }
                Err(e) => {
                    if !missing_logged {
                        tracing::warn!(input = name, error = %e, "cannot open; waiting for it");
                        missing_logged = true;
                    }
                    first = false;
                    std::thread::sleep(TICK);
                }
            }
            continue;
        };
        match f.read(&mut buf) {
            Ok(0) => {
                // At the end: rotated or truncated?
                match std::fs::metadata(path) {
                    Ok(m) if identity(&m) != *id => {
                        // Rotated. The gateway writes to the old file until it reopens its log
                        // (nginx on USR1, after logrotate made the new one): read on until the
                        // old file has been quiet for a while.
                        let seen = *rotated_at.get_or_insert_with(Instant::now);
                        if last_data.max(seen).elapsed() < opts.rotated_quiet {
                            std::thread::sleep(TICK);
                            continue;
                        }
                        // A last line without its newline will never be finished.
                        if !pending.is_empty() && !skipping {
                            c.lines.fetch_add(1, Ordering::Relaxed);
                            bridge.line_waiting(&pending, name);
                        }
                        pending.clear();
                        skipping = false;
                        file = None;
                        continue;
                    }
                    Ok(m) if m.len() < *pos => {
                        tracing::info!(input = name, "truncated; reading from the start");
                        let _ = f.seek(SeekFrom::Start(0));
                        *pos = 0;
                        pending.clear();
                        skipping = false;
                        continue;
                    }
                    _ => {}
                }
                std::thread::sleep(TICK);
            }
            Ok(n) => {
                *pos += n as u64;
                last_data = Instant::now();
                c.bytes.fetch_add(n as u64, Ordering::Relaxed);
                let mut chunk = &buf[..n];
                while let Some(i) = chunk.iter().position(|b| *b == b'\n') {
                    if skipping {
                        skipping = false;
                    } else if pending.is_empty() {
                        c.lines.fetch_add(1, Ordering::Relaxed);
                        bridge.line_waiting(&chunk[..i], name);
                    } else {
                        pending.extend_from_slice(&chunk[..i]);
                        c.lines.fetch_add(1, Ordering::Relaxed);
                        bridge.line_waiting(&pending, name);
                        pending.clear();
                    }
                    chunk = &chunk[i + 1..];
                }
                if !skipping {
                    pending.extend_from_slice(chunk);
                    if pending.len() > bridge.max_line {
                        c.lines.fetch_add(1, Ordering::Relaxed);
                        bridge.bad_line("oversized", &pending, name);
                        pending.clear();
                        skipping = true;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(input = name, error = %e, "read failed; reopening");
                file = None;
                std::thread::sleep(TICK);
            }
        }
    }
}

/// The inode of a socket (`/proc/self/fd/N` → `socket:[inode]`).
fn socket_inode(s: &UdpSocket) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let link = std::fs::read_link(format!("/proc/self/fd/{}", s.as_raw_fd())).ok()?;
    let l = link.to_str()?;
    l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The kernel's drop count of the UDP socket with `inode` (the last column of /proc/net/udp and
/// udp6), or None where it cannot be read.
pub fn udp_drops(inode: u64) -> Option<u64> {
    for table in ["/proc/net/udp", "/proc/net/udp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(9).and_then(|i| i.parse::<u64>().ok()) == Some(inode) {
                return f.last().and_then(|d| d.parse().ok());
            }
        }
    }
    None
}

impl Running {
    /// Read the kernel's drop count into the counters (UDP inputs).
    pub fn refresh_drops(&self) {
        if let Some(d) = self.udp_inode.and_then(udp_drops) {
            self.counters.kernel_drops.store(d, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bridge::Collect;
    use std::io::Write;
    use vitals_gateways::map::Map;

    fn line(server: &str, ms: u32) -> String {
        format!("vitals1 1796113286.{ms:03} - be {server} 200 0 0 0 1 1 ---- 0 {{}}\n")
    }

    fn wait(what: &str, f: impl Fn() -> bool) {
        for _ in 0..500 {
            if f() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("timed out waiting for {what}");
    }

    #[test]
    fn a_followed_file_is_read_across_partial_lines_rotation_and_truncation() {
        let dir = std::env::temp_dir().join(format!("logbridge-follow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("access.log");
        std::fs::write(&path, line("old", 1)).unwrap();
        let sink = Arc::new(Collect::default());
        let bridge = Arc::new(Bridge::new(Map::default(), "g".into(), 300, 5, sink.clone()));
        let stop = Arc::new(AtomicBool::new(false));
        let opts = SocketOptions {
            unix_mode: 0o600,
            from_start: false,
            recv_buffer: 0,
            rotated_quiet: Duration::from_secs(2),
        };
        let run = start(
            &Input::File(path.clone()),
            bridge.clone(),
            stop.clone(),
            opts,
            Senders::default(),
        )
        .unwrap();
        let servers = || {
            sink.0
                .lock()
                .unwrap()
                .iter()
                .map(|o| o.endpoint.clone())
                .collect::<Vec<_>>()
        };
        // Started at the end: the old line is not read. A line written in two parts is one line.
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        let l = line("a", 2);
        wait("following", || run.counters.opened.load(Ordering::Relaxed) == 1);
        f.write_all(&l.as_bytes()[..10]).unwrap();
        wait("the first part read", || {
            run.counters.bytes.load(Ordering::Relaxed) == 10
        });
        f.write_all(&l.as_bytes()[10..]).unwrap();
        // An oversized line is counted and skipped to its end; the next line is read.
        f.write_all(&vec![b'x'; 1000]).unwrap();
        f.write_all(b"\n").unwrap();
        f.write_all(line("b", 3).as_bytes()).unwrap();
        wait("a and b", || servers() == ["a", "b"]);
        assert_eq!(bridge.bad_count("oversized"), 1);
        // Rotation as logrotate's `create` does it: the file renamed, a new one made, and the
        // gateway writing to the old one until it reopens its log. The old file is read until it
        // is quiet, then the new one from its start.
        f.write_all(line("c", 4).as_bytes()).unwrap();
        std::fs::rename(&path, dir.join("access.log.1")).unwrap();
        std::fs::write(&path, line("d", 5) + &line("d2", 7)).unwrap();
        wait("c", || servers().len() == 3);
        std::thread::sleep(Duration::from_millis(200));
        f.write_all(line("c2", 8).as_bytes()).unwrap();
        wait("c2 and d", || servers() == ["a", "b", "c", "c2", "d", "d2"]);
        // Truncation: read again from the start.
        std::fs::write(&path, line("e", 6)).unwrap();
        wait("e", || servers().last().map(String::as_str) == Some("e"));
        stop.store(true, Ordering::Relaxed);
        run.thread.join().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(test)]
mod senders {
    use super::Senders;

    #[test]
    fn senders_are_networks_or_loopback_alone() {
        let ip = |s: &str| s.parse().unwrap();
        let none = Senders::parse(&[]).unwrap();
        assert!(none.allows(ip("127.0.0.1")) && none.allows(ip("::1")) && none.allows(ip("::ffff:127.0.0.1")));
        assert!(!none.allows(ip("10.0.0.5")));
        let some = Senders::parse(&["10.1.0.0/16".into(), "192.168.1.7".into(), "2001:db8::/32".into()]).unwrap();
        assert!(some.allows(ip("10.1.200.3")) && !some.allows(ip("10.2.0.1")));
        assert!(some.allows(ip("192.168.1.7")) && !some.allows(ip("192.168.1.8")));
        assert!(some.allows(ip("2001:db8::9")) && !some.allows(ip("2001:db9::9")));
        assert!(
            some.allows(ip("::ffff:10.1.0.9")),
            "an IPv4 sender on a dual-stack socket"
        );
        assert!(!some.allows(ip("127.0.0.1")), "a list replaces loopback");
        let all = Senders::parse(&["0.0.0.0/0".into(), "::/0".into()]).unwrap();
        assert!(all.allows(ip("8.8.8.8")) && all.allows(ip("2001:db8::1")));
        for bad in ["10.0.0.0/33", "nope", "10.0.0.0/x"] {
            let e = Senders::parse(&[bad.into()]).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }
}
