//! Bearer tokens: one file format for every way into vitals (the API, the OTLP receiver), each
//! token with a role and, for those that report, the reporters and pools it may speak for.
//! Secrets are compared in constant time and never logged; errors name a token by its place.
//!
//! A line is `name:role:secret`, blank lines and `#` comments skipped. The role may carry a
//! binding after a `;`:
//!
//! ```text
//! ops:admin:0123456789abcdef-ops
//! edge-eu:reporter;gateways=edge-eu-*;pools=chat,embed:0123456789abcdef-eu
//! ```
//!
//! - `gateways=` the reporters it may speak as: a call's or a summary's gateway, a probe's
//!   prober. A name ending in `*` is a prefix. Without it: any.
//! - `pools=` the pools it may report on, the same way. Without it: any.
//!
//! Names in a binding cannot hold `:`, `,`, `;` or `*` (use a prefix). The file is read again
//! when it changes ([`Watched`]): a file that no longer parses keeps the tokens before it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use subtle::ConstantTimeEq;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Read history and health (the API's read routes).
    Reader,
    /// Report calls and probes (OTLP, the API's ingest) and nothing else.
    Reporter,
    /// Read and report (the API's ingest, as before the reporter role).
    Writer,
    /// Everything, operator actions and policies included.
    Admin,
}

/// What a request needs to be allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    Read,
    Report,
    Act,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "reader" => Some(Role::Reader),
            "reporter" => Some(Role::Reporter),
            "writer" => Some(Role::Writer),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Reporter => "reporter",
            Role::Writer => "writer",
            Role::Admin => "admin",
        }
    }

    pub fn may(self, need: Need) -> bool {
        match need {
            Need::Read => matches!(self, Role::Reader | Role::Writer | Role::Admin),
            Need::Report => matches!(self, Role::Reporter | Role::Writer | Role::Admin),
            Need::Act => self == Role::Admin,
        }
    }
}

/// Names a binding allows: exact names and prefixes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names(Vec<Pattern>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Exact(String),
    Prefix(String),
}

impl Names {
    fn parse(list: &str) -> Result<Names, String> {
        let mut out = Vec::new();
        for n in list.split(',').map(str::trim) {
            let p = match n.strip_suffix('*') {
                Some(prefix) => Pattern::Prefix(prefix.to_owned()),
                None => Pattern::Exact(n.to_owned()),
            };
            match &p {
                Pattern::Exact(x) if x.is_empty() => return Err("an empty name".into()),
                Pattern::Exact(x) | Pattern::Prefix(x) if x.contains('*') => {
                    return Err(format!("{n:?}: '*' only ends a name (a prefix)"))
                }
                _ => {}
            }
            out.push(p);
        }
        Ok(Names(out))
    }

    pub fn allows(&self, name: &str) -> bool {
        self.0.iter().any(|p| match p {
            Pattern::Exact(x) => x == name,
            Pattern::Prefix(x) => name.starts_with(x.as_str()),
        })
    }
}

impl std::fmt::Display for Names {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match p {
                Pattern::Exact(x) => f.write_str(x)?,
                Pattern::Prefix(x) => write!(f, "{x}*")?,
            }
        }
        Ok(())
    }
}

/// What a token may speak for; `None`: anything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Binding {
    pub gateways: Option<Names>,
    pub pools: Option<Names>,
}

/// Why a report is not this token's to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotBound {
    /// `gateway` (or `prober`) or `pool`.
    pub field: &'static str,
    pub message: String,
}

impl Binding {
    /// Whether the token may report `reporter` (a gateway, or a prober) on `pool`.
    pub fn check(&self, token: &str, field: &'static str, reporter: &str, pool: &str) -> Result<(), NotBound> {
        if let Some(g) = &self.gateways {
            if !g.allows(reporter) {
                return Err(NotBound {
                    field,
                    message: format!("token {token:?} may report as {g}, not as {reporter:?}"),
                });
            }
        }
        if let Some(p) = &self.pools {
            if !p.allows(pool) {
                return Err(NotBound {
                    field: "pool",
                    message: format!("token {token:?} may report on pools {p}, not on {pool:?}"),
                });
            }
        }
        Ok(())
    }
}

#[derive(Clone)]
pub struct Token {
    pub name: String,
    pub role: Role,
    pub binding: Binding,
    secret: Vec<u8>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("name", &self.name)
            .field("role", &self.role)
            .field("binding", &self.binding)
            .finish_non_exhaustive()
    }
}

impl Token {
    pub fn new(name: &str, role: Role, secret: &str) -> Token {
        Token {
            name: name.to_owned(),
            role,
            binding: Binding::default(),
            secret: secret.as_bytes().to_vec(),
        }
    }
}

/// Why a request's credentials were not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No bearer token, or not one of ours.
    Unauthenticated,
    /// More than one `Authorization` header: which one counts would be a guess.
    Ambiguous,
    /// A known token whose role may not do this.
    Forbidden,
}

/// The credentials of a `Bearer` authorization; the scheme is case-insensitive (RFC 9110 §11.1).
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// A parsed set of tokens.
#[derive(Debug, Clone, Default)]
pub struct Tokens(Vec<Token>);

impl Tokens {
    pub fn new(tokens: Vec<Token>) -> Tokens {
        Tokens(tokens)
    }

    /// Parse lines of `name:role[;binding]:secret` (blank lines and `#` comments skipped); the
    /// error names a line by its place, never by its text.
    pub fn parse<'a>(lines: impl IntoIterator<Item = &'a str>) -> Result<Tokens, String> {
        let mut out: Vec<Token> = Vec::new();
        let lines = lines
            .into_iter()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'));
        for (i, t) in lines.enumerate() {
            let n = i + 1;
            let mut parts = t.splitn(3, ':');
            let (Some(name), Some(role), Some(secret)) = (parts.next(), parts.next(), parts.next()) else {
                return Err(format!("token #{n} is not name:role:secret"));
            };
            let mut role_parts = role.split(';');
            let role = role_parts.next().and_then(Role::parse).ok_or_else(|| {
                format!("token #{n}: the role (name:ROLE:secret) must be reader, reporter, writer or admin")
            })?;
            let mut binding = Binding::default();
            for b in role_parts {
                let (key, list) = b
                    .split_once('=')
                    .ok_or_else(|| format!("token #{n}: {b:?} is not gateways=… or pools=…"))?;
                let names = Names::parse(list).map_err(|e| format!("token #{n}: {key}: {e}"))?;
                let slot = match key.trim() {
                    "gateways" => &mut binding.gateways,
                    "pools" => &mut binding.pools,
                    other => return Err(format!("token #{n}: {other:?} is not gateways or pools")),
                };
                if slot.replace(names).is_some() {
                    return Err(format!("token #{n}: {key} is given twice"));
                }
            }
            if role == Role::Reader && binding != Binding::default() {
                return Err(format!(
                    "token #{n}: a reader reports nothing: a binding has no meaning"
                ));
            }
            if name.is_empty() {
                return Err(format!("token #{n}: empty name"));
            }
            if secret.len() < 16 {
                return Err(format!(
                    "token #{n}: the secret (name:role:SECRET) must be at least 16 characters"
                ));
            }
            if let Some(j) = out.iter().position(|o| o.name == name) {
                return Err(format!(
                    "tokens #{} and #{n} have the same name: each name is given once",
                    j + 1
                ));
            }
            if let Some(j) = out.iter().position(|o| o.secret == secret.as_bytes()) {
                return Err(format!(
                    "tokens #{} and #{n} have the same secret: each token needs its own",
                    j + 1
                ));
            }
            out.push(Token {
                name: name.to_owned(),
                role,
                binding,
                secret: secret.as_bytes().to_vec(),
            });
        }
        Ok(Tokens(out))
    }

    /// Read and parse a tokens file.
    pub fn read(path: &Path) -> Result<Tokens, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Tokens::parse(text.lines()).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Token> {
        self.0.iter()
    }

    /// The token a request's `Authorization` values present, if it is ours and may do `need`.
    pub fn authorize<'v>(
        &self,
        mut authorization: impl Iterator<Item = &'v [u8]>,
        need: Need,
    ) -> Result<&Token, Denied> {
        let first = authorization.next();
        if authorization.next().is_some() {
            return Err(Denied::Ambiguous);
        }
        let presented = first
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(bearer)
            .ok_or(Denied::Unauthenticated)?
            .as_bytes();
        // Compare against every token so that timing says nothing about which one matched.
        let mut found: Option<&Token> = None;
        for t in &self.0 {
            if bool::from(t.secret.as_slice().ct_eq(presented)) {
                found = Some(t);
            }
        }
        let t = found.ok_or(Denied::Unauthenticated)?;
        if !t.role.may(need) {
            return Err(Denied::Forbidden);
        }
        Ok(t)
    }
}

/// A tokens file read again when it changes (its length or modification time), so that a token
/// is added or revoked without a restart. A file that no longer parses is reported and the
/// tokens before it stay.
pub struct Watched {
    path: Option<PathBuf>,
    extra: Vec<String>,
    current: RwLock<Arc<Tokens>>,
    stamp: RwLock<Option<(u64, SystemTime)>>,
    pub reloads: std::sync::atomic::AtomicU64,
    pub reload_errors: std::sync::atomic::AtomicU64,
}

fn stamp(path: &Path) -> Option<(u64, SystemTime)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?))
}

impl Watched {
    /// Tokens from `extra` lines (flags, the environment) and the file at `path`; an error if
    /// either does not parse.
    pub fn open(path: Option<&Path>, extra: &[String]) -> Result<Watched, String> {
        let w = Watched {
            path: path.map(Path::to_path_buf),
            extra: extra.to_vec(),
            current: RwLock::new(Arc::new(Tokens::default())),
            stamp: RwLock::new(None),
            reloads: Default::default(),
            reload_errors: Default::default(),
        };
        let (tokens, s) = w.load()?;
        *w.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(tokens);
        *w.stamp.write().unwrap_or_else(|e| e.into_inner()) = s;
        Ok(w)
    }

    fn load(&self) -> Result<(Tokens, Option<(u64, SystemTime)>), String> {
        let mut lines = self.extra.clone();
        let mut s = None;
        if let Some(p) = &self.path {
            s = stamp(p);
            let text = std::fs::read_to_string(p).map_err(|e| format!("tokens file {}: {e}", p.display()))?;
            lines.extend(text.lines().map(str::to_owned));
        }
        let tokens = Tokens::parse(lines.iter().map(String::as_str)).map_err(|e| match &self.path {
            Some(p) => format!("tokens (flags, then {}): {e}", p.display()),
            None => format!("tokens: {e}"),
        })?;
        Ok((tokens, s))
    }

    /// The tokens now.
    pub fn get(&self) -> Arc<Tokens> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Read the file again if it changed; true if the tokens were replaced.
    pub fn refresh(&self) -> bool {
        let Some(p) = &self.path else { return false };
        let now = stamp(p);
        if now == *self.stamp.read().unwrap_or_else(|e| e.into_inner()) {
            return false;
        }
        *self.stamp.write().unwrap_or_else(|e| e.into_inner()) = now;
        match self.load() {
            Ok((tokens, _)) => {
                tracing::info!(tokens = tokens.len(), file = %p.display(), "tokens reloaded");
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(tokens);
                self.reloads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "the tokens file changed but does not parse: the tokens before it stay");
                self.reload_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                false
            }
        }
    }

    /// Refresh every `every` until `cancel`.
    pub async fn watch(self: Arc<Self>, every: Duration, cancel: tokio_util::sync::CancellationToken) {
        if self.path.is_none() {
            return;
        }
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {
                    let me = self.clone();
                    let _ = tokio::task::spawn_blocking(move || me.refresh()).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth<'t>(t: &'t Tokens, header: &str, need: Need) -> Result<&'t Token, Denied> {
        t.authorize(std::iter::once(header.as_bytes()), need)
    }

    #[test]
    fn roles_allow_what_they_name_and_a_reporter_only_reports() {
        let t = Tokens::parse([
            "r:reader:reader-secret-00001",
            "p:reporter:reporter-secret-001",
            "w:writer:writer-secret-00001",
            "a:admin:admin-secret-000001",
        ])
        .unwrap();
        let may = |secret: &str, need| auth(&t, &format!("Bearer {secret}"), need).map(|t| t.name.clone());
        assert_eq!(may("reporter-secret-001", Need::Report), Ok("p".into()));
        assert_eq!(may("reporter-secret-001", Need::Read), Err(Denied::Forbidden));
        assert_eq!(may("reporter-secret-001", Need::Act), Err(Denied::Forbidden));
        assert_eq!(may("reader-secret-00001", Need::Report), Err(Denied::Forbidden));
        assert_eq!(may("writer-secret-00001", Need::Report), Ok("w".into()));
        assert_eq!(may("admin-secret-000001", Need::Act), Ok("a".into()));
        assert_eq!(may("nope-nope-nope-nope", Need::Read), Err(Denied::Unauthenticated));
        assert_eq!(
            auth(&t, "Basic reporter-secret-001", Need::Report).unwrap_err(),
            Denied::Unauthenticated
        );
        assert_eq!(auth(&t, "bEaReR reporter-secret-001", Need::Report).unwrap().name, "p");
        let two = [b"Bearer reporter-secret-001".as_slice(), b"Bearer nope".as_slice()];
        assert_eq!(
            t.authorize(two.into_iter(), Need::Report).unwrap_err(),
            Denied::Ambiguous
        );
        assert_eq!(
            t.authorize(std::iter::empty(), Need::Read).unwrap_err(),
            Denied::Unauthenticated
        );
    }

    #[test]
    fn a_binding_names_gateways_and_pools_by_name_or_prefix() {
        let t =
            Tokens::parse(["eu:reporter;gateways=edge-eu-*,lb-1;pools=chat:eu-secret-0000000:with:colons"]).unwrap();
        let b = &t.0[0].binding;
        assert_eq!(t.0[0].secret, b"eu-secret-0000000:with:colons");
        assert!(b.check("eu", "gateway", "edge-eu-7", "chat").is_ok());
        assert!(b.check("eu", "gateway", "lb-1", "chat").is_ok());
        let e = b.check("eu", "gateway", "edge-us-1", "chat").unwrap_err();
        assert_eq!(e.field, "gateway");
        assert!(
            e.message.contains("edge-eu-*,lb-1") && e.message.contains("edge-us-1"),
            "{}",
            e.message
        );
        assert_eq!(b.check("eu", "gateway", "lb-1", "embed").unwrap_err().field, "pool");
        assert!(Binding::default().check("x", "gateway", "any", "any").is_ok());
    }

    #[test]
    fn bad_lines_are_named_by_place_and_never_show_a_secret() {
        for (line, says) in [
            ("x:reporter", "not name:role:secret"),
            ("x:boss:secret-secret-secret", "must be reader, reporter"),
            ("x:reporter;gateways:secret-secret-secret", "is not gateways="),
            ("x:reporter;colour=red:secret-secret-secret", "is not gateways or pools"),
            ("x:reporter;pools=a;pools=b:secret-secret-secret", "given twice"),
            ("x:reporter;pools=a*b:secret-secret-secret", "only ends a name"),
            ("x:reporter;pools=a,,b:secret-secret-secret", "an empty name"),
            ("x:reader;pools=a:secret-secret-secret", "a reader reports nothing"),
            ("x:reporter:short", "at least 16"),
        ] {
            let e = Tokens::parse(["ok:admin:admin-secret-000001", line]).unwrap_err();
            assert!(e.contains("#2") && e.contains(says), "{line}: {e}");
            assert!(!e.contains("secret-secret") && !e.contains("short"), "{e}");
        }
        let e = Tokens::parse(["a:admin:same-secret-000001", "b:reader:same-secret-000001"]).unwrap_err();
        assert!(e.contains("same secret") && !e.contains("same-secret"), "{e}");
    }

    #[test]
    fn a_changed_file_is_read_again_and_a_broken_one_keeps_the_tokens_before_it() {
        let dir = std::env::temp_dir().join(format!("vitals-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens");
        std::fs::write(&path, "a:reporter:first-secret-000001\n").unwrap();
        let w = Watched::open(Some(&path), &["ops:admin:flag-secret-0000001".into()]).unwrap();
        assert_eq!(w.get().len(), 2);
        assert!(!w.refresh(), "unchanged");
        std::fs::write(
            &path,
            "a:reporter:first-secret-000001\nb:reporter:second-secret-00001\n",
        )
        .unwrap();
        assert!(w.refresh());
        let t = w.get();
        assert_eq!(auth(&t, "Bearer second-secret-00001", Need::Report).unwrap().name, "b");
        std::fs::write(&path, "b:reporter:short\n").unwrap();
        assert!(!w.refresh());
        assert_eq!(w.reload_errors.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(w.get().len(), 3, "the tokens before the broken file stay");
        std::fs::write(&path, "").unwrap();
        assert!(w.refresh());
        assert_eq!(
            auth(&w.get(), "Bearer first-secret-000001", Need::Report).unwrap_err(),
            Denied::Unauthenticated
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
