//! The reference of the host configuration (`/etc/cosched/host.toml`): for every key its TOML
//! path, unit, range, what it does and when to change it, in one place ([`keys`]).
//!
//! Defaults are never written here: each is read from [`HostConfig::default()`] serialized (a
//! VM's keys from [`VmConfig::default()`], a resource's overrides from
//! [`LimitsOverride::default()`]), so the reference shows what the daemon really starts with.
//!
//! Three renderings are generated from it ([`render`]), by `cosched generate config-reference
//! --format markdown|toml|man`:
//! - `docs/configuration.md`, the reference in the repository;
//! - `packaging/host.toml`, the commented file the package installs as `/etc/cosched/host.toml`;
//! - `cosched-host.toml(5)`, the man page the package installs.
//!
//! The tests (`tests.rs`) fail when a key of the default config is missing here or a key here
//! does not exist, when a range or a list of choices says something the code does not do, and
//! when the two committed files differ from what the generator writes.

mod keys;
mod resource_keys;
#[cfg(test)]
mod tests;
mod vm_keys;

use std::fmt::Write as _;

use cosched_core::LimitsOverride;
use serde_json::Value;

use crate::config::{HostConfig, VmConfig};

/// A VM's name in a key's path (`vm.NAME.priority`).
pub const NAME: &str = "NAME";
/// A resource's name in a key's path (`policy.resource.RESOURCE.frame_rate`, `resources.RESOURCE`).
pub const RESOURCE: &str = "RESOURCE";
/// The VM name the examples use.
pub const EXAMPLE_VM: &str = "myvm";

/// What values a key takes.
#[derive(Debug, Clone, PartialEq)]
pub enum Range {
    /// `true` or `false`.
    Bool,
    /// An integer from `min`, to `max` or the type's largest. The tests check that both bounds
    /// load (with every other key at its default) and that the values just outside do not.
    Int { min: i64, max: Option<i64> },
    /// One of these strings. The tests check the list against the code's.
    Choice(&'static [&'static str]),
    /// In words: a path, a CPU list, or a bound that depends on other keys.
    Rule(&'static str),
}

impl Range {
    fn describe(&self) -> String {
        match self {
            Range::Bool => "true or false".into(),
            Range::Int { min, max: None } => format!("{min} or more"),
            Range::Int { min, max: Some(max) } => format!("{min} to {max}"),
            Range::Choice(c) => {
                let quoted: Vec<String> = c.iter().map(|c| format!("\"{c}\"")).collect();
                match quoted.split_last() {
                    Some((last, [])) => last.clone(),
                    Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                    None => String::new(),
                }
            }
            Range::Rule(r) => (*r).into(),
        }
    }
}

/// One key of the configuration.
#[derive(Debug, Clone)]
pub struct Key {
    /// Its TOML path: `policy.frame_rate`; `NAME` and `RESOURCE` stand for a VM's and a
    /// resource's name (`vm.NAME.static.fifo`, `resources.RESOURCE`).
    pub path: String,
    /// Its unit (`ms`, `µs`, `‰`, ...), or empty.
    pub unit: &'static str,
    pub range: Range,
    /// What it does (Markdown: `code` in backquotes).
    pub does: String,
    /// When an operator changes it.
    pub change: String,
    /// For a key that is unset by default: what unset means.
    pub unset: Option<String>,
    /// A value to show (TOML) for a key that is unset by default.
    pub example: Option<&'static str>,
}

impl Key {
    /// Its name within its table: the last part of its path.
    pub fn name(&self) -> &str {
        self.path.rsplit('.').next().unwrap_or(&self.path)
    }

    /// Its default as TOML (`10000`, `"rr"`), or `None` when it is unset by default. Read from
    /// the code's defaults, serialized.
    pub fn default_toml(&self) -> Option<String> {
        let v = default_value(&self.path).unwrap_or_else(|e| panic!("{e}"));
        toml_literal(&v)
    }
}

/// A table of the file and its keys.
#[derive(Debug, Clone)]
pub struct Table {
    /// Its TOML path (`policy`, `vm.NAME.static`); empty for the top level.
    pub path: &'static str,
    pub title: &'static str,
    /// What the table is for (Markdown).
    pub about: &'static str,
    pub keys: Vec<Key>,
}

impl Table {
    /// Whether its name in the file is an example (a VM's or a resource's name).
    pub fn is_example(&self) -> bool {
        self.path.split('.').any(|p| p == NAME || p == RESOURCE)
    }

    /// Its header as the examples write it (`vm.myvm.static`, `policy.resource.cpu`).
    pub fn shown_path(&self) -> String {
        example_path(self.path)
    }
}

/// Every table, in the order of the file.
pub fn reference() -> Vec<Table> {
    keys::tables()
}

/// `path` with its placeholders replaced by the examples' names: `vm.myvm`, `policy.resource.cpu`,
/// `resources.io`.
pub fn example_path(path: &str) -> String {
    let parts: Vec<&str> = path.split('.').collect();
    let mut out = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        out.push(match *p {
            NAME => EXAMPLE_VM,
            // A table of resources (`policy.resource.cpu`), or a resource's switch (`io = false`).
            RESOURCE if i > 0 && parts[i - 1] == "resource" => "cpu",
            RESOURCE => "io",
            other => other,
        });
    }
    out.join(".")
}

/// Why [`default_value`] has no value for a path.
#[derive(Debug, thiserror::Error)]
pub enum DefaultError {
    #[error("serializing the defaults: {0}")]
    Serialize(#[from] serde_json::Error),
    #[error("{0}: no such key in the default configuration")]
    NoSuchKey(String),
}

/// The code's default at `path`: JSON `null` for a key unset by default (an `Option`, or a key
/// of a map such as `resources`). An error names a path that the defaults do not have.
pub fn default_value(path: &str) -> Result<Value, DefaultError> {
    let (root, rest) = if let Some(rest) = path.strip_prefix("vm.NAME.") {
        (serde_json::to_value(VmConfig::default())?, rest)
    } else if let Some(rest) = path.strip_prefix("policy.resource.RESOURCE.") {
        (serde_json::to_value(LimitsOverride::default())?, rest)
    } else {
        (serde_json::to_value(HostConfig::default())?, path)
    };
    let parts: Vec<&str> = rest.split('.').collect();
    let mut at = &root;
    for (i, p) in parts.iter().enumerate() {
        if *p == RESOURCE && i + 1 == parts.len() && at.is_object() {
            return Ok(Value::Null);
        }
        at = at.get(p).ok_or_else(|| DefaultError::NoSuchKey(path.to_string()))?;
    }
    Ok(at.clone())
}

/// A JSON value as a TOML literal; `None` for `null`.
fn toml_literal(v: &Value) -> Option<String> {
    Some(match v {
        Value::Null => return None,
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => toml::Value::String(s.clone()).to_string(),
        Value::Array(a) => format!("[{}]", a.iter().filter_map(toml_literal).collect::<Vec<_>>().join(", ")),
        Value::Object(_) => panic!("a table is not a key's value: {v}"),
    })
}

/// How [`render`] writes the reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `docs/configuration.md`.
    Markdown,
    /// `packaging/host.toml`: every key commented out at its default.
    Toml,
    /// `cosched-host.toml(5)`, in roff.
    Man,
}

/// The reference, written in `format`.
pub fn render(format: Format) -> String {
    let tables = reference();
    match format {
        Format::Markdown => markdown(&tables),
        Format::Toml => packaged_toml(&tables),
        Format::Man => man(&tables),
    }
}

/// How the file is read, for the Markdown page and the man page.
const LOADING: &[&str] = &[
    "The host daemon (`cosched host`) reads `/etc/cosched/host.toml`, or the file named with `--config`. \
     Every key is optional: a key left out takes its default, and a missing `/etc/cosched/host.toml` means \
     every default. A file named with `--config` that does not exist is an error, and so is an unknown key \
     or a value out of range: the message names the key and says what it accepts.",
    "The operator commands (`cosched status`, `cosched vm ...`, `cosched restore`) read the same file \
     (`--config`) to find the daemon's control socket and state directory.",
    "The daemon reads the file when it starts, and again on `cosched reload` (also `systemctl reload \
     cosched-host` or SIGHUP), which applies only what changed: the VMs' keys, `enabled`, `[resources]`, \
     the `[policy]` budgets and `default_priority`, most of `[membw]` and the discovery keys. A reload names \
     every changed key that needs a restart (`systemctl restart cosched-host`) and keeps it as it runs; \
     a file that does not load is refused and the running settings stay. docs/runtime-control.md lists \
     which keys a reload applies. `cosched check-config` checks a file without touching the daemon. \
     `cosched host` takes a few keys on its command line too (`--socket-dir`, `--state-dir`, \
     `--control-socket`, `--metrics-listen`, `--disabled`), which win over the file.",
    "`NAME` in a table's name stands for a VM's name: its socket's file name without `.sock`, the libvirt \
     domain, or QEMU's `-name`. `RESOURCE` stands for a resource: `cpu`, `io`, `membw` or `event`.",
];

fn title(t: &Table) -> String {
    if t.path.is_empty() {
        "Top level".into()
    } else {
        format!("[{}]", t.path)
    }
}

/// What a key's default is, in words for a reader.
fn default_words(k: &Key) -> String {
    match (k.default_toml(), &k.unset) {
        (Some(d), _) => format!("`{d}`"),
        (None, Some(u)) => format!("unset: {u}"),
        (None, None) => "unset".into(),
    }
}

/// Default, unit, values and example, on one line.
fn meta(k: &Key) -> String {
    let mut m = format!("Default: {}", default_words(k));
    if !k.unit.is_empty() {
        let _ = write!(m, " · Unit: {}", k.unit);
    }
    let _ = write!(m, " · Values: {}", k.range.describe());
    if let Some(e) = k.example {
        let _ = write!(m, " · Example: `{} = {e}`", example_key(k));
    }
    m
}

/// The key's name as an example writes it (`io` for a resource's switch).
fn example_key(k: &Key) -> String {
    example_path(&k.path).rsplit('.').next().unwrap_or_default().to_string()
}

fn markdown(tables: &[Table]) -> String {
    let mut out = String::from("# Configuration reference\n\n");
    out += "<!-- Generated by `cosched generate config-reference --format markdown`, from \
            crates/host/src/config_reference/ (the host) and crates/cli/src/guest_reference.rs with the \
            agent's options (the guest): edit those, not this page. -->\n\n";
    out += &wrap(
        "The host daemon reads `/etc/cosched/host.toml`, described first; the guest agent reads \
         `/etc/cosched/guest.toml`, described [at the end](#guest-agent-etccoschedguesttoml).",
        100,
        "",
    );
    out += "\n## Host daemon: `/etc/cosched/host.toml`\n\n";
    for p in LOADING {
        out += &wrap(p, 100, "");
        out.push('\n');
    }
    out += &wrap(
        "Every key below shows its default (read from the code), its unit and range, what it does and when \
         to change it. The package installs the same keys, commented out at their defaults, as \
         `/etc/cosched/host.toml` (`packaging/host.toml`), and the same reference as `man 5 cosched-host.toml`.",
        100,
        "",
    );
    out += "\n| table | what it is for |\n|---|---|\n";
    for t in tables {
        let _ =
            writeln!(out, "| [{}](#{}) | {} |", title(t).replace('[', "\\[").replace(']', "\\]"), anchor(t), t.title);
    }
    out += "| [Guest agent](#guest-agent-etccoschedguesttoml) | the guest agent's `/etc/cosched/guest.toml` |\n";
    for t in tables {
        let _ = write!(out, "\n### {}\n\n", title(t));
        out += &wrap(t.about, 100, "");
        for k in &t.keys {
            let _ = write!(out, "\n#### `{}`\n\n{}\n\n", full_name(t, k), meta(k));
            out += &wrap(&k.does, 100, "");
            out.push('\n');
            out += &wrap(&format!("**When to change it.** {}", k.change), 100, "");
        }
    }
    out
}

/// A key's name as a heading says it: `[policy] frame_rate`.
fn full_name(t: &Table, k: &Key) -> String {
    if t.path.is_empty() {
        k.name().to_string()
    } else {
        format!("[{}] {}", t.path, k.name())
    }
}

/// The anchor GitHub makes of a table's heading.
fn anchor(t: &Table) -> String {
    title(t)
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn packaged_toml(tables: &[Table]) -> String {
    let mut out = String::new();
    for line in [
        "/etc/cosched/host.toml: the configuration of the cosched host daemon (cosched host). Every key,",
        "with its unit, range and when to change it, is described in cosched-host.toml(5) (man 5",
        "cosched-host.toml) and in docs/configuration.md of the source.",
        "",
        "Every key is optional. A line \"#key = value\" shows a key at its default: remove the \"#\" to change",
        "it. Lines that end in \"# example\" show a value for a key that is unset by default, and a table",
        "header that ends in \"# example\" names an example VM or resource: change the name too. An unknown",
        "key is an error.",
        "",
        "After a change: cosched check-config, then systemctl reload cosched-host (applies what changed and",
        "names each changed key that needs systemctl restart cosched-host instead).",
        "",
        "Generated by `cosched generate config-reference --format toml` from the daemon's own definitions.",
    ] {
        out += format!("# {line}").trim_end();
        out.push('\n');
    }
    for t in tables {
        out += "\n# ";
        out += &"=".repeat(97);
        out.push('\n');
        let _ = writeln!(out, "# {}: {}.", title(t), t.title);
        out += &wrap(&plain(t.about), 100, "# ");
        if !t.path.is_empty() {
            let header = format!("#[{}]", t.shown_path());
            if t.is_example() {
                let _ = writeln!(out, "{header:<40} # example");
            } else {
                let _ = writeln!(out, "{header}");
            }
        }
        for k in &t.keys {
            out.push('\n');
            out += &wrap(&plain(&k.does), 100, "# ");
            out += &wrap(&format!("Values: {}.", plain(&range_and_unit(k))), 100, "# ");
            if k.default_toml().is_none() {
                out += &wrap(&format!("Unset by default: {}.", plain(k.unset.as_deref().unwrap_or(""))), 100, "# ");
            }
            let line = match (k.default_toml(), k.example) {
                (Some(d), _) => format!("#{} = {d}", k.name()),
                (None, Some(e)) => format!("{:<40} # example", format!("#{} = {e}", example_key(k))),
                (None, None) => panic!("{}: unset by default and no example", k.path),
            };
            out += &line;
            out.push('\n');
        }
    }
    out
}

fn range_and_unit(k: &Key) -> String {
    if k.unit.is_empty() {
        k.range.describe()
    } else {
        format!("{} ({})", k.range.describe(), k.unit)
    }
}

/// Markdown's backquotes taken out, for a TOML comment.
fn plain(s: &str) -> String {
    s.replace('`', "")
}

fn man(tables: &[Table]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, ".TH COSCHED\\-HOST.TOML 5 \"\" \"cosched {}\" \"File Formats\"", env!("CARGO_PKG_VERSION"));
    out += ".SH NAME\ncosched\\-host.toml \\- configuration of the cosched host daemon\n";
    out += ".SH SYNOPSIS\n.B /etc/cosched/host.toml\n.SH DESCRIPTION\n";
    for (i, p) in LOADING.iter().enumerate() {
        if i > 0 {
            out += ".PP\n";
        }
        out += &roff(p);
    }
    out += ".PP\n";
    out += &roff(
        "Each key below shows its default, its unit and range, what it does and when to change it. The \
         installed /etc/cosched/host.toml holds every key, commented out at its default.",
    );
    for t in tables {
        let _ = writeln!(out, ".SH \"{}\"", roff_inline(&title(t).to_uppercase()).trim_end());
        out += &roff(t.about);
        for k in &t.keys {
            let _ = writeln!(out, ".TP\n\\fB{}\\fR", roff_inline(k.name()));
            out += &roff(&meta(k).replace('`', ""));
            out += ".br\n";
            out += &roff(&k.does);
            out += ".br\n";
            out += &roff(&format!("`When to change it.` {}", k.change));
        }
    }
    out += ".SH FILES\n.TP\n.I /etc/cosched/host.toml\nThe configuration (a dpkg conffile).\n";
    out += ".SH SEE ALSO\n.BR cosched (8),\n.BR cosched\\-host (8),\n.BR systemd.service (5)\n";
    out
}

/// One paragraph of text as roff lines: `code` in bold, lines that would start a request
/// escaped.
fn roff(text: &str) -> String {
    let mut out = String::new();
    for line in wrap(&roff_inline(text), 100, "").lines() {
        if line.starts_with('.') || line.starts_with('\'') {
            out += "\\&";
        }
        out += line;
        out.push('\n');
    }
    out
}

/// Backslashes, hyphens, `code` and characters beyond ASCII for roff.
fn roff_inline(text: &str) -> String {
    let mut out = String::new();
    let mut code = false;
    for c in text.chars() {
        match c {
            '\\' => out += "\\e",
            '-' => out += "\\-",
            c if !c.is_ascii() => {
                let _ = write!(out, "\\[u{:04X}]", c as u32);
            }
            '`' => {
                out += if code { "\\fR" } else { "\\fB" };
                code = !code;
            }
            c => out.push(c),
        }
    }
    out
}

/// `text` wrapped at `width` columns, each line starting with `prefix`.
pub fn wrap(text: &str, width: usize, prefix: &str) -> String {
    let mut out = String::new();
    let mut line = String::from(prefix);
    for word in text.split_whitespace() {
        if line.len() > prefix.len() && line.chars().count() + 1 + word.chars().count() > width {
            out += line.trim_end();
            out.push('\n');
            line = String::from(prefix);
        }
        if line.len() > prefix.len() {
            line.push(' ');
        }
        line += word;
    }
    if line.len() > prefix.len() || out.is_empty() {
        out += line.trim_end();
        out.push('\n');
    }
    out
}
