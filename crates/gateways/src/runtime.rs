//! HAProxy's Runtime API (the stats socket, `level admin`): read every server's state with
//! `show servers state`, and the commands that bring them to vitals' decisions with `set server`.
//!
//! vitals takes a server out of rotation with `state maint` (or `state drain`, which keeps
//! persistent sessions) and puts it back with `state ready`; its weight follows vitals' weight
//! (the slow-start ramp included) as a share of the server's configured weight. A server an
//! operator put in maintenance or drain (not vitals) is left alone, weight included: vitals never
//! fights an operator. Which forced states are vitals' own is kept by the caller (and in its
//! state file across restarts), since HAProxy records only that the state was forced.

use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

/// `srv_admin_state` bits (HAProxy's `SRV_ADMF_*`).
pub mod admin {
    /// Forced into maintenance from the Runtime API.
    pub const FMAINT: u32 = 0x01;
    /// Inherited from a tracked server.
    pub const IMAINT: u32 = 0x02;
    /// `disabled` in the configuration.
    pub const CMAINT: u32 = 0x04;
    /// Forced into drain from the Runtime API.
    pub const FDRAIN: u32 = 0x08;
    /// Inherited drain.
    pub const IDRAIN: u32 = 0x10;
    /// Its address does not resolve.
    pub const RMAINT: u32 = 0x20;
    /// Its hostname does not resolve.
    pub const HMAINT: u32 = 0x40;
}

/// One row of `show servers state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    pub backend: String,
    pub name: String,
    /// 0 stopped, 1 starting, 2 running, 3 stopping (health checks' view).
    pub op_state: u32,
    pub admin_state: u32,
    /// The weight in force.
    pub weight: u32,
    /// The weight in the configuration.
    pub initial_weight: u32,
}

impl Server {
    pub fn key(&self) -> (String, String) {
        (self.backend.clone(), self.name.clone())
    }
    /// Forced out of rotation from the Runtime API (by vitals or an operator).
    pub fn forced_out(&self) -> bool {
        self.admin_state & (admin::FMAINT | admin::FDRAIN) != 0
    }
    /// Forced into `out` exactly (maint, or drain without maint).
    pub fn forced_into(&self, out: OutState) -> bool {
        match out {
            OutState::Maint => self.admin_state & admin::FMAINT != 0,
            OutState::Drain => self.admin_state & admin::FDRAIN != 0 && self.admin_state & admin::FMAINT == 0,
        }
    }
    /// Out for a reason no Runtime API caller set (configuration, tracking, DNS).
    pub fn held_by_haproxy(&self) -> bool {
        self.admin_state & (admin::IMAINT | admin::CMAINT | admin::IDRAIN | admin::RMAINT | admin::HMAINT) != 0
    }
}

/// Parse `show servers state` (format 1): columns by their header names.
pub fn parse_servers_state(text: &str) -> Result<Vec<Server>, String> {
    let mut lines = text.lines();
    match lines.next().map(str::trim) {
        Some("1") => {}
        other => return Err(format!("show servers state: unknown format {other:?}")),
    }
    let header = lines
        .next()
        .and_then(|h| h.strip_prefix("# "))
        .ok_or("show servers state: no header")?;
    let cols: HashMap<&str, usize> = header.split(' ').enumerate().map(|(i, c)| (c, i)).collect();
    let col = |name: &str| {
        cols.get(name)
            .copied()
            .ok_or(format!("show servers state: no column {name}"))
    };
    let (be, srv, op, adm, uw, iw) = (
        col("be_name")?,
        col("srv_name")?,
        col("srv_op_state")?,
        col("srv_admin_state")?,
        col("srv_uweight")?,
        col("srv_iweight")?,
    );
    let mut out = Vec::new();
    for line in lines.map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let f: Vec<&str> = line.split(' ').collect();
        let get = |i: usize| {
            f.get(i)
                .copied()
                .ok_or(format!("show servers state: short row {line:?}"))
        };
        let num = |i: usize| -> Result<u32, String> {
            get(i)?
                .parse()
                .map_err(|_| format!("show servers state: bad number in {line:?}"))
        };
        out.push(Server {
            backend: get(be)?.to_owned(),
            name: get(srv)?.to_owned(),
            op_state: num(op)?,
            admin_state: num(adm)?,
            weight: num(uw)?,
            initial_weight: num(iw)?,
        });
    }
    Ok(out)
}

/// What vitals wants of a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// In rotation at this HAProxy weight.
    Ready(u32),
    /// Out of rotation.
    Out,
}

impl Want {
    /// vitals' weight (0..=1) as a share of the server's configured weight: 0 is out; above,
    /// at least 1 (HAProxy's weight 0 would take it out without saying so), at most 256.
    pub fn from_weight(weight: f64, initial: u32) -> Want {
        if weight <= 0.0 {
            return Want::Out;
        }
        if initial == 0 {
            return Want::Ready(0);
        }
        let w = (f64::from(initial) * weight.min(1.0)).round() as u32;
        Want::Ready(w.clamp(1, 256))
    }
}

/// How a server is taken out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutState {
    Maint,
    Drain,
}

impl OutState {
    pub fn as_str(self) -> &'static str {
        match self {
            OutState::Maint => "maint",
            OutState::Drain => "drain",
        }
    }
}

/// One Runtime API command and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub backend: String,
    pub server: String,
    /// e.g. `set server be/s1 state maint`.
    pub line: String,
}

/// Whether `s` is held out by someone other than vitals: an operator's forced state (one not in
/// `ours`, the forced states vitals set), or HAProxy's own (configuration, tracking, DNS).
/// vitals sets nothing on such a server, weight included.
pub fn held_by_others(s: &Server, ours: &BTreeSet<(String, String)>) -> bool {
    s.held_by_haproxy() || (s.forced_out() && !ours.contains(&s.key()))
}

/// The commands that bring `servers` to what `want` says of each (None: not vitals' to steer),
/// given the forced states vitals set itself (`ours`, updated as the commands are planned).
/// Servers an operator forced out, and servers HAProxy holds out itself, are left alone; a
/// server vitals wants out is taken out even if the operator had set its weight. A server vitals
/// forced out that now shows the other forced state (`drain` where vitals set `maint`, or the
/// reverse) was forced by an operator since: it is theirs from then on.
pub fn plan(
    servers: &[Server],
    want: impl Fn(&Server) -> Option<Want>,
    ours: &mut BTreeSet<(String, String)>,
    out: OutState,
) -> Vec<Command> {
    let mut cmds = Vec::new();
    for s in servers {
        let key = s.key();
        // A forced state that is no longer there, or not the one vitals set, is no longer ours
        // (an operator set it ready, or forced it into the other state).
        if !s.forced_into(out) {
            ours.remove(&key);
        }
        let Some(w) = want(s) else { continue };
        if held_by_others(s, ours) {
            continue;
        }
        let mut cmd = |what: String| {
            cmds.push(Command {
                backend: s.backend.clone(),
                server: s.name.clone(),
                line: format!("set server {}/{} {what}", s.backend, s.name),
            })
        };
        match w {
            Want::Out => {
                if !s.forced_out() {
                    cmd(format!("state {}", out.as_str()));
                    ours.insert(key);
                }
            }
            Want::Ready(weight) => {
                if s.forced_out() {
                    cmd("state ready".into());
                    ours.remove(&key);
                }
                if s.weight != weight {
                    cmd(format!("weight {weight}"));
                }
            }
        }
    }
    cmds
}

/// Where the Runtime API listens: a Unix socket path, or `host:port` (`ipv4@` in HAProxy).
#[derive(Debug, Clone)]
pub enum Client {
    Unix(PathBuf),
    Tcp(String),
}

impl Client {
    /// `unix:PATH`, a path (anything with a `/`, or without a `:`), or `tcp:host:port` /
    /// `host:port`.
    pub fn parse(s: &str) -> Client {
        if let Some(p) = s.strip_prefix("unix:").or_else(|| s.strip_prefix("unix@")) {
            Client::Unix(p.into())
        } else if let Some(a) = s.strip_prefix("tcp:").or_else(|| s.strip_prefix("ipv4@")) {
            Client::Tcp(a.to_owned())
        } else if s.contains('/') || !s.contains(':') {
            Client::Unix(s.into())
        } else {
            Client::Tcp(s.to_owned())
        }
    }

    /// Send one command and read the answer to its end (HAProxy closes after one command).
    pub fn command(&self, line: &str, timeout: Duration) -> std::io::Result<String> {
        fn talk(mut s: impl Read + Write, line: &str) -> std::io::Result<String> {
            s.write_all(line.as_bytes())?;
            s.write_all(b"\n")?;
            let mut out = String::new();
            s.take(16 << 20).read_to_string(&mut out)?;
            Ok(out)
        }
        match self {
            Client::Unix(p) => {
                let s = std::os::unix::net::UnixStream::connect(p)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
                talk(s, line)
            }
            Client::Tcp(a) => {
                let addr = std::net::ToSocketAddrs::to_socket_addrs(a)?
                    .next()
                    .ok_or_else(|| std::io::Error::other(format!("{a} does not resolve")))?;
                let s = std::net::TcpStream::connect_timeout(&addr, timeout)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
                talk(s, line)
            }
        }
    }

    /// Every server's state.
    pub fn servers(&self, timeout: Duration) -> Result<Vec<Server>, String> {
        let text = self
            .command("show servers state", timeout)
            .map_err(|e| format!("runtime API: {e}"))?;
        parse_servers_state(&text)
    }

    /// Run a `set` command: HAProxy answers nothing when it worked, the reason when not.
    pub fn set(&self, line: &str, timeout: Duration) -> Result<(), String> {
        let answer = self.command(line, timeout).map_err(|e| format!("runtime API: {e}"))?;
        let answer = answer.trim();
        if answer.is_empty() {
            Ok(())
        } else {
            Err(answer.to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATE: &str = "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change\n\
3 be_chat 1 s1 127.0.0.1 2 0 10 10 7\n\
3 be_chat 2 s2 127.0.0.1 2 1 10 10 7\n\
3 be_chat 3 s3 127.0.0.1 2 0 10 10 7\n\
3 be_chat 4 s4 127.0.0.1 2 4 10 10 7\n";

    fn servers() -> Vec<Server> {
        parse_servers_state(STATE).unwrap()
    }

    #[test]
    fn the_state_is_read_by_column_name() {
        let s = servers();
        assert_eq!(s.len(), 4);
        assert_eq!(
            (s[1].name.as_str(), s[1].admin_state, s[1].initial_weight),
            ("s2", 1, 10)
        );
        assert!(s[1].forced_out() && !s[0].forced_out() && s[3].held_by_haproxy());
        assert!(parse_servers_state("2\n# x\n").is_err());
        assert!(parse_servers_state("1\n# be_name srv_name\nb s\n").is_err());
    }

    #[test]
    fn vitals_takes_out_weights_and_leaves_the_operators_maintenance_alone() {
        let s = servers();
        let mut ours = BTreeSet::new();
        // s1 out, s2 (an operator's maint) wanted ready, s3 ramping, s4 disabled in the config.
        let want = |s: &Server| match s.name.as_str() {
            "s1" => Some(Want::Out),
            "s3" => Some(Want::from_weight(0.25, s.initial_weight)),
            _ => Some(Want::Ready(10)),
        };
        let lines: Vec<String> = plan(&s, want, &mut ours, OutState::Maint)
            .into_iter()
            .map(|c| c.line)
            .collect();
        assert_eq!(
            lines,
            ["set server be_chat/s1 state maint", "set server be_chat/s3 weight 3"]
        );
        assert!(ours.contains(&("be_chat".into(), "s1".into())));
        // Once HAProxy shows s1 in maint, vitals readmits it: ready, at the ramp's weight.
        let mut now = s.clone();
        now[0].admin_state = admin::FMAINT;
        let want = |s: &Server| (s.name == "s1").then_some(Want::Ready(1));
        let lines: Vec<String> = plan(&now, want, &mut ours, OutState::Maint)
            .into_iter()
            .map(|c| c.line)
            .collect();
        assert_eq!(
            lines,
            ["set server be_chat/s1 state ready", "set server be_chat/s1 weight 1"]
        );
        assert!(ours.is_empty());
    }

    #[test]
    fn a_maintenance_vitals_did_not_set_is_the_operators() {
        let mut s = servers();
        s[0].admin_state = admin::FMAINT;
        let mut ours = BTreeSet::new();
        assert!(plan(&s[..1], |_| Some(Want::Ready(5)), &mut ours, OutState::Maint).is_empty());
        // vitals' own maint that an operator readied is no longer vitals': the next decision
        // applies afresh.
        s[0].admin_state = 0;
        ours.insert(s[0].key());
        let lines: Vec<String> = plan(&s[..1], |_| Some(Want::Out), &mut ours, OutState::Drain)
            .into_iter()
            .map(|c| c.line)
            .collect();
        assert_eq!(lines, ["set server be_chat/s1 state drain"]);
    }

    #[test]
    fn the_other_forced_state_on_a_server_vitals_holds_out_is_the_operators() {
        let mut s = servers();
        let mut ours = BTreeSet::new();
        s[0].admin_state = admin::FMAINT;
        ours.insert(s[0].key());
        // vitals holds s1 in maint; an operator drains it (HAProxy clears maint): healed, vitals
        // leaves it drained.
        s[0].admin_state = admin::FDRAIN;
        assert!(plan(&s[..1], |_| Some(Want::Ready(10)), &mut ours, OutState::Maint).is_empty());
        assert!(ours.is_empty());
        // The same the other way round.
        s[0].admin_state = admin::FMAINT;
        ours.insert(s[0].key());
        assert!(plan(&s[..1], |_| Some(Want::Ready(10)), &mut ours, OutState::Drain).is_empty());
    }

    #[test]
    fn weights_are_a_share_of_the_configured_weight() {
        assert_eq!(Want::from_weight(0.0, 10), Want::Out);
        assert_eq!(Want::from_weight(0.01, 10), Want::Ready(1));
        assert_eq!(Want::from_weight(0.5, 100), Want::Ready(50));
        assert_eq!(Want::from_weight(1.0, 256), Want::Ready(256));
        assert_eq!(Want::from_weight(0.5, 0), Want::Ready(0));
    }

    #[test]
    fn addresses_name_a_socket_or_a_port() {
        assert!(matches!(Client::parse("/run/haproxy.sock"), Client::Unix(_)));
        assert!(matches!(Client::parse("unix:rel.sock"), Client::Unix(_)));
        assert!(matches!(Client::parse("127.0.0.1:9999"), Client::Tcp(_)));
        assert!(matches!(Client::parse("target/demo/admin.sock"), Client::Unix(_)));
        assert!(matches!(Client::parse("admin.sock"), Client::Unix(_)));
        assert!(matches!(Client::parse("ipv4@127.0.0.1:9999"), Client::Tcp(_)));
    }
}
