//! `cosched check-config`: what the daemon checks in its config before it starts, and what it
//! would find wrong only once starting (the metrics address, its paths, a memory-bandwidth
//! trace), every error found rather than the first; and the paths an operator command can still
//! read from a config that does not load ([`salvage`]).
//!
//! Every entry the TOML parser refuses is reported with its line and column and taken out
//! (blanked, so that the lines and columns of the rest stay right), and the file is read again,
//! until what is left loads: then the settings' own checks run on it, each reported.

use std::fs;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use super::{ConfigError, HostConfig, DEFAULT_CONFIG};
use crate::membw::{BackendChoice, Trace, TraceError};

/// At most this many parser errors are reported, each entry taken out in turn.
const MAX_PARSE_ERRORS: usize = 100;

/// Where in the file, 1-based, in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub line: usize,
    pub column: usize,
}

/// One thing wrong (or, as a warning, doubtful) in a config.
#[derive(Debug)]
pub struct Finding {
    /// The key, as `[section] key` or `key` (for a parser's error: the entry it was found in).
    pub key: Option<String>,
    /// For a parser's error.
    pub at: Option<Position>,
    pub error: CheckError,
}

impl std::fmt::Display for Finding {
    /// `KEY: what` (where the message does not name the key already).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let message = self.error.to_string();
        match &self.key {
            Some(k) if !names(&message, k) => write!(f, "{k}: {message}"),
            _ => f.write_str(&message),
        }
    }
}

/// Whether `message` names `key` (its last part, as the parser quotes it, or whole).
fn names(message: &str, key: &str) -> bool {
    let leaf = key.rsplit(' ').next().unwrap_or(key);
    message.contains(key) || message.contains(&format!("`{leaf}`"))
}

/// Why a config or one of its settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("cannot read it: {0}")]
    Read(io::Error),
    /// The TOML parser's message (a syntax error, an unknown key, a value of the wrong type),
    /// with Rust's type names said plainly.
    #[error("{0}")]
    Toml(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{key} = {}: {why}", .path.display())]
    Path { key: &'static str, path: PathBuf, why: PathError },
    #[error("[membw] trace: {0}")]
    Trace(#[from] TraceError),
}

/// What is wrong with a path the daemon uses.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error("exists and is not a directory")]
    NotDirectory,
    #[error("cannot be created: {} is not a directory", .0.display())]
    ParentNotDirectory(PathBuf),
    #[error("exists and is not a socket: the daemon removes whatever is there when it starts")]
    NotSocket,
    #[error("does not exist")]
    Missing,
    #[error("is relative: the daemon resolves it from its working directory (/ under systemd)")]
    Relative,
}

/// What `cosched check-config` found.
#[derive(Debug)]
pub struct Report {
    pub path: PathBuf,
    /// `false`: the default path, absent (the daemon runs with every default).
    pub found: bool,
    /// The settings as loaded, once what the parser refused is taken out.
    pub config: Option<HostConfig>,
    pub errors: Vec<Finding>,
    pub warnings: Vec<Finding>,
}

/// Checks the config at `path` (`None`: the default path, which may be absent).
pub fn check(path: Option<&Path>) -> Report {
    let (path, explicit) = match path {
        Some(p) => (p.to_path_buf(), true),
        None => (PathBuf::from(DEFAULT_CONFIG), false),
    };
    let mut report = Report { path: path.clone(), found: true, config: None, errors: Vec::new(), warnings: Vec::new() };
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound && !explicit => {
            report.found = false;
            String::new()
        }
        Err(e) => {
            report.errors.push(Finding { key: None, at: None, error: CheckError::Read(e) });
            return report;
        }
    };
    let (config, parse_errors) = parse_all(&text);
    report.errors.extend(parse_errors);
    let Some(cfg) = config else { return report };
    report.errors.extend(cfg.problems().into_iter().map(|e| Finding { key: None, at: None, error: e.into() }));
    paths(&cfg, &mut report);
    if cfg.membw.backend == BackendChoice::Simulated {
        if let Some(trace) = &cfg.membw.trace {
            if let Err(e) = Trace::load(trace) {
                report.errors.push(Finding { key: Some("[membw] trace".into()), at: None, error: e.into() });
            }
        }
    }
    report.config = Some(cfg);
    report
}

/// The daemon's paths: what it creates must be creatable, what it replaces must be its own, what
/// it only reads had better be there.
fn paths(cfg: &HostConfig, report: &mut Report) {
    let mut error = |key: &'static str, path: &Path, why| {
        report.errors.push(Finding {
            key: Some(key.into()),
            at: None,
            error: CheckError::Path { key, path: path.into(), why },
        })
    };
    for (key, dir) in [("socket_dir", &cfg.socket_dir), ("state_dir", &cfg.state_dir)] {
        if let Err(why) = creatable_dir(dir) {
            error(key, dir, why);
        }
    }
    let socket = &cfg.control_socket;
    match fs::symlink_metadata(socket) {
        Ok(m) if !m.file_type().is_socket() => error("control_socket", socket, PathError::NotSocket),
        Ok(_) => {}
        Err(_) => {
            if let Err(why) = socket.parent().map_or(Ok(()), creatable_dir) {
                error("control_socket", socket, why);
            }
        }
    }
    let mut warn = |key: &'static str, path: &Path, why| {
        report.warnings.push(Finding {
            key: Some(key.into()),
            at: None,
            error: CheckError::Path { key, path: path.into(), why },
        })
    };
    for (key, p) in [("socket_dir", &cfg.socket_dir), ("state_dir", &cfg.state_dir), ("control_socket", socket)] {
        if p.is_relative() {
            warn(key, p, PathError::Relative);
        }
    }
    if !cfg.cgroup_root.is_dir() {
        warn("cgroup_root", &cfg.cgroup_root, PathError::Missing);
    }
    if cfg.discover_libvirt && !cfg.libvirt_dir.is_dir() {
        warn("libvirt_dir", &cfg.libvirt_dir, PathError::Missing);
    }
}

/// `dir` is a directory, or can be made one: its nearest existing ancestor is a directory.
fn creatable_dir(dir: &Path) -> Result<(), PathError> {
    let mut p = dir;
    loop {
        match fs::metadata(p) {
            Ok(m) if m.is_dir() => return Ok(()),
            Ok(_) if p == dir => return Err(PathError::NotDirectory),
            Ok(_) => return Err(PathError::ParentNotDirectory(p.to_path_buf())),
            Err(_) => match p.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => p = parent,
                _ => return Ok(()),
            },
        }
    }
}

/// Parses `text`, taking out each entry the parser refuses until the rest loads: the settings
/// loaded from what is left (`None` if a syntax error leaves nothing to go on), and an error
/// for each entry taken out.
pub fn parse_all(text: &str) -> (Option<HostConfig>, Vec<Finding>) {
    let mut text = text.to_string();
    let mut found = Vec::new();
    while found.len() < MAX_PARSE_ERRORS {
        let e = match toml::from_str::<HostConfig>(&text) {
            Ok(cfg) => return (Some(cfg), found),
            Err(e) => e,
        };
        let span = e.span();
        let entry = span.as_ref().and_then(|s| entry_at(&text, s.start));
        found.push(Finding {
            key: entry.as_ref().map(|(key, _)| key.clone()),
            at: span.map(|s| position(&text, s.start)),
            error: CheckError::Toml(plain(e.message())),
        });
        match entry {
            Some((_, range)) => blank(&mut text, range),
            // A syntax error: the entries after it cannot be told apart.
            None => break,
        }
    }
    (None, found)
}

/// Rust's type names in serde's messages, as an operator would say them.
fn plain(message: &str) -> String {
    let mut m = message.to_string();
    for (rust, plain) in [
        ("expected u8", "expected a whole number from 0 to 255"),
        ("expected u16", "expected a whole number from 0 to 65535"),
        ("expected u32", "expected a whole number from 0 (no sign)"),
        ("expected u64", "expected a whole number from 0 (no sign)"),
        ("expected usize", "expected a whole number from 0 (no sign)"),
        ("expected i32", "expected a whole number"),
        ("expected i64", "expected a whole number"),
        ("expected f64", "expected a number"),
        ("expected a boolean", "expected true or false"),
    ] {
        if let Some(rest) = m.strip_suffix(rust).map(str::to_string) {
            m = rest + plain;
        }
        m = m.replace(&format!("{rust},"), &format!("{plain},"));
    }
    m
}

/// 1-based line and column (in characters) of byte `offset`.
fn position(text: &str, offset: usize) -> Position {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    Position { line, column }
}

/// Replaces every byte of `range` but newlines with a space: the entry is gone, every other
/// line and column stays where it was.
fn blank(text: &mut String, range: Range<usize>) {
    let mut bytes = std::mem::take(text).into_bytes();
    for b in &mut bytes[range] {
        if *b != b'\n' {
            *b = b' ';
        }
    }
    *text = String::from_utf8(bytes).expect("whole entries were blanked");
}

/// The innermost entry of the document at byte `offset`: its key (`[a.b] key`, or a table's
/// `[a.b]`) and its whole extent (key to value, or header to its last entry).
fn entry_at(text: &str, offset: usize) -> Option<(String, Range<usize>)> {
    let doc = toml_edit::ImDocument::parse(text.to_string()).ok()?;
    find(doc.as_table(), &[], offset)
}

fn find(table: &dyn toml_edit::TableLike, path: &[String], offset: usize) -> Option<(String, Range<usize>)> {
    for (name, _) in table.iter() {
        let (key, item) = table.get_key_value(name)?;
        let mut inner = path.to_vec();
        inner.push(name.to_string());
        let extent = extent(key, item);
        if let Some(t) = item.as_table_like() {
            // Inside a sub-table's entries: the innermost wins.
            if let Some(found) = find(t, &inner, offset) {
                return Some(found);
            }
        }
        if extent.as_ref().is_some_and(|r| r.contains(&offset)) {
            let label = match item {
                toml_edit::Item::Table(_) => format!("[{}]", inner.join(".")),
                _ if path.is_empty() => name.to_string(),
                _ => format!("[{}] {name}", path.join(".")),
            };
            return extent.map(|r| (label, r));
        }
    }
    None
}

/// From an entry's key (or a table's header) to the end of its value (or of its last entry).
fn extent(key: &toml_edit::Key, item: &toml_edit::Item) -> Option<Range<usize>> {
    let mut start = key.span().map(|s| s.start);
    let mut end = item.span().map(|s| s.end);
    if let toml_edit::Item::Table(t) = item {
        // A header's span starts at its `[`.
        if let Some(s) = t.span() {
            start = Some(start.map_or(s.start, |k| k.min(s.start)));
        }
        for (name, _) in t.iter() {
            if let Some((k, i)) = t.get_key_value(name) {
                if let Some(r) = extent(k, i) {
                    start = Some(start.map_or(r.start, |s| s.min(r.start)));
                    end = Some(end.map_or(r.end, |e| e.max(r.end)));
                }
            }
        }
    }
    Some(start?..end?)
}

/// The paths an operator command needs, from a config that does not load as a whole: each
/// taken from the file where it reads as a path (`socket_dir`, `state_dir`, `control_socket`,
/// `cgroup_root`, `resctrl_root`, `libvirt_dir`, `[shield]`), the default otherwise; and the
/// keys so taken.
pub fn salvage(text: &str) -> (HostConfig, Vec<&'static str>) {
    let mut cfg = HostConfig::default();
    let mut taken = Vec::new();
    let Ok(table) = text.parse::<toml::Table>() else { return (cfg, taken) };
    let mut path = |key: &'static str, field: &mut PathBuf| {
        if let Some(toml::Value::String(s)) = table.get(key) {
            *field = PathBuf::from(s);
            taken.push(key);
        }
    };
    path("socket_dir", &mut cfg.socket_dir);
    path("state_dir", &mut cfg.state_dir);
    path("control_socket", &mut cfg.control_socket);
    path("cgroup_root", &mut cfg.cgroup_root);
    path("resctrl_root", &mut cfg.resctrl_root);
    path("libvirt_dir", &mut cfg.libvirt_dir);
    if let Some(shield) = table.get("shield").and_then(|v| v.clone().try_into().ok()) {
        cfg.shield = shield;
        taken.push("[shield]");
    }
    (cfg, taken)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(text: &str) -> Vec<String> {
        let (_, found) = parse_all(text);
        found
            .iter()
            .map(|f| {
                let at = f.at.map_or(String::new(), |p| format!("{}:{}: ", p.line, p.column));
                format!("{at}{f}")
            })
            .collect()
    }

    #[test]
    fn every_refused_entry_is_reported_with_its_line_and_key_and_the_rest_still_loads() {
        let text = "sockt_dir = \"/x\"\nrescan_ms = 5\n[policy]\ndefault_priority = \"high\"\n\
                    max_continuous_boost_ms = 7\n[vm.a]\npriority = -5\n[polcy]\nx = 1\ny = 2\n";
        let m = messages(text);
        assert_eq!(m.len(), 4, "{m:#?}");
        assert!(m[0].starts_with("1:1: unknown field `sockt_dir`, expected one of"), "{m:#?}");
        assert!(m.iter().any(|l| l.starts_with("4:20: [policy] default_priority: invalid type: string \"high\"")));
        assert!(
            m.iter()
                .any(|l| l
                    == "7:12: [vm.a] priority: invalid value: integer `-5`, expected a whole number from 0 to 255"),
            "{m:#?}"
        );
        assert!(m.iter().any(|l| l.contains("unknown field `polcy`")), "{m:#?}");
        let (cfg, _) = parse_all(text);
        let cfg = cfg.expect("what is left loads");
        assert_eq!((cfg.rescan_ms, cfg.policy.max_continuous_boost_ms), (5, 7));
    }

    #[test]
    fn a_syntax_error_is_one_error_and_nothing_loads() {
        let (cfg, found) = parse_all("a = = 1\nsockt_dir = 1\n");
        assert!(cfg.is_none());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].at, Some(Position { line: 1, column: 5 }));
    }

    #[test]
    fn check_reports_the_settings_checks_the_listen_address_and_the_paths() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        fs::write(&file, "").unwrap();
        let p = dir.path().join("host.toml");
        fs::write(
            &p,
            format!(
                "metrics_listen = \"localhost:abc\"\nstate_dir = {:?}\ncontrol_socket = {:?}\nsocket_dir = {:?}\n\
                 [policy]\ndefault_priority = 0\n[vm.a.static]\nvcpu_priority = 0\n",
                file.join("state"),
                file,
                dir.path().join("vms"),
            ),
        )
        .unwrap();
        let r = check(Some(&p));
        let m: Vec<String> = r.errors.iter().map(ToString::to_string).collect();
        assert!(m.iter().any(|l| l.starts_with("[policy]: default_priority = 0: out of range 1..=98")), "{m:#?}");
        assert!(m.contains(&"[vm.a.static] vcpu_priority = 0: a SCHED_FIFO priority is 1..=99".into()), "{m:#?}");
        assert!(
            m.iter().any(|l| l.starts_with("metrics_listen = \"localhost:abc\": not an IP address and port")),
            "{m:#?}"
        );
        assert!(m.iter().any(|l| l.starts_with("state_dir = ") && l.ends_with("is not a directory")), "{m:#?}");
        assert!(m.iter().any(|l| l.starts_with("control_socket = ") && l.contains("is not a socket")), "{m:#?}");
        assert_eq!(m.len(), 5, "{m:#?}");
        assert!(check(Some(&dir.path().join("absent.toml"))).errors[0].to_string().starts_with("cannot read it"));
    }

    #[test]
    fn salvage_takes_the_paths_that_read_as_paths() {
        let (cfg, taken) =
            salvage("sockt_dir = 1\nstate_dir = \"/s\"\ncontrol_socket = 5\n[shield]\nhost_groups = [\"a\"]\n");
        assert_eq!(cfg.state_dir, PathBuf::from("/s"));
        assert_eq!(cfg.control_socket, PathBuf::from(super::super::DEFAULT_CONTROL_SOCKET));
        assert_eq!(taken, ["state_dir", "[shield]"]);
        assert_eq!(salvage("= broken").1, Vec::<&str>::new());
    }
}
