//! A new config, or the operator's settings reset, while the daemon runs: what the daemon can
//! take at once and what needs a restart ([`merge`]), the difference between two configs in
//! force as steps, each with its inverse ([`diff`]), and carrying them out whole or not at all
//! ([`apply`]). Pure: the daemon is a [`Target`] (`daemon/reload.rs`), the tests a fake.
//!
//! What a running daemon takes (everything else is reported as "needs a restart" and left as it
//! runs): host-wide `enabled` and `[resources]`; every `[vm.NAME]` key (enabled, resources,
//! priority, rt_ceiling, membw_share, static); the `[policy]` keys the coordinator can take
//! ([`cosched_core::policy::HOT_KEYS`]: the default priority, the continuous and share budgets,
//! the cooldown, globally and per resource); `[membw]` period_ms, reclaim, best_effort and
//! default_share_permille; and, from the next rescan, discover_processes, discover_libvirt and
//! libvirt_dir.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;

use cosched_core::policy::{HOT_KEYS, HOT_RESOURCE_KEYS};
use cosched_core::Policy;
use cosched_proto::Resource;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::{ConfigError, HostConfig, StaticConfig};
use crate::error::Error;

/// Where the daemon's config comes from: the file (`None`: the default path, which may be
/// absent) and the command line's overrides, read again by a reload.
#[derive(Debug, Clone, Default)]
pub struct Source {
    pub path: Option<PathBuf>,
    pub socket_dir: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub control_socket: Option<PathBuf>,
    pub metrics_listen: Option<String>,
    /// `cosched host --disabled`: as `enabled = false` in the file.
    pub disabled: bool,
}

impl Source {
    /// The file, loaded and validated, with the command line's overrides.
    pub fn load(&self) -> anyhow::Result<HostConfig> {
        let mut cfg = match HostConfig::load(self.path.as_deref()) {
            Ok(cfg) => cfg,
            Err(e) => {
                // The loader stops at its first error; the check lists every one.
                let report = crate::config::check::check(self.path.as_deref());
                if report.errors.len() < 2 {
                    return Err(e);
                }
                let all: Vec<String> = report
                    .errors
                    .iter()
                    .map(|f| match &f.at {
                        Some(at) => format!("  line {}, column {}: {f}", at.line, at.column),
                        None => format!("  {f}"),
                    })
                    .collect();
                anyhow::bail!("{}: {} errors:\n{}", report.path.display(), all.len(), all.join("\n"));
            }
        };
        if let Some(d) = &self.socket_dir {
            cfg.socket_dir = d.clone();
        }
        if let Some(d) = &self.state_dir {
            cfg.state_dir = d.clone();
        }
        if let Some(s) = &self.control_socket {
            cfg.control_socket = s.clone();
        }
        if self.metrics_listen.is_some() {
            cfg.metrics_listen = self.metrics_listen.clone();
        }
        if self.disabled {
            cfg.enabled = false;
        }
        Ok(cfg)
    }
}

/// What a reload or a reset changed, as the control socket answers it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Changes {
    /// What changed, one line each (`vm1: priority 1 -> 7`).
    pub applied: Vec<String>,
    /// Keys of the new config that only a restart applies: left as they run.
    pub needs_restart: Vec<String>,
    /// Settings the new config changes that the operator set: the operator's stay in force
    /// until reset (`cosched vm reset NAME`, `cosched reset`).
    pub operator_kept: Vec<String>,
}

/// A new config as the running daemon can take it.
#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    /// The new config, with every key that needs a restart as it runs.
    pub config: HostConfig,
    /// The keys that differ and need a restart (`socket_dir`, `[boost] policy`).
    pub needs_restart: Vec<String>,
    /// Keys read at every rescan that changed (`discover_processes: false -> true`).
    pub rescan: Vec<String>,
}

/// Keys read at every rescan: they apply from the next one.
const RESCAN_KEYS: [&str; 3] = ["discover_processes", "discover_libvirt", "libvirt_dir"];

/// Whether the key at `path` (its sections, then its name) can change while the daemon runs.
fn hot(path: &[String]) -> bool {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    match p.as_slice() {
        ["enabled"] | ["resources", _] | ["vm", ..] => true,
        [k] => RESCAN_KEYS.contains(k),
        ["policy", k] => HOT_KEYS.contains(k),
        ["policy", "resource", _, k] => HOT_RESOURCE_KEYS.contains(k),
        ["membw", "period_ms" | "reclaim" | "best_effort" | "default_share_permille"] => true,
        _ => false,
    }
}

/// A key as the config writes it: `socket_dir`, `[boost] policy`, `[policy.resource.io] frame_rate`.
fn key_name(path: &[String]) -> String {
    match path {
        [] => String::new(),
        [k] => k.clone(),
        [sections @ .., k] => format!("[{}] {k}", sections.join(".")),
    }
}

/// Every value of `v` that is not a table, by its path (an unset optional key is no value).
fn leaves(v: &Value, at: &mut Vec<String>, out: &mut BTreeMap<Vec<String>, Value>) {
    match v {
        Value::Object(m) => {
            for (k, e) in m {
                at.push(k.clone());
                leaves(e, at, out);
                at.pop();
            }
        }
        Value::Null => {}
        other => {
            out.insert(at.clone(), other.clone());
        }
    }
}

/// Sets (`Some`) or removes (`None`) the value at `path` of `root`, making tables on the way.
fn put(root: &mut Value, path: &[String], value: Option<Value>) {
    let Some((last, sections)) = path.split_last() else { return };
    let mut at = root;
    for s in sections {
        let Some(table) = at.as_object_mut() else { return };
        at = table.entry(s.clone()).or_insert_with(|| Value::Object(Default::default()));
    }
    let Some(table) = at.as_object_mut() else { return };
    match value {
        Some(v) => {
            table.insert(last.clone(), v);
        }
        None => {
            table.remove(last);
        }
    }
}

/// `loaded` as the daemon running `running` can take it: every key that needs a restart and
/// differs is put back as it runs, and named.
pub fn merge(running: &HostConfig, loaded: &HostConfig) -> Result<Merged, serde_json::Error> {
    let (old_v, mut merged) = (serde_json::to_value(running)?, serde_json::to_value(loaded)?);
    let (mut old, mut new) = (BTreeMap::new(), BTreeMap::new());
    leaves(&old_v, &mut Vec::new(), &mut old);
    leaves(&merged, &mut Vec::new(), &mut new);
    let paths: BTreeSet<&Vec<String>> = old.keys().chain(new.keys()).collect();
    let (mut needs_restart, mut rescan) = (Vec::new(), Vec::new());
    let show = |v: Option<&Value>| v.map_or_else(|| "unset".to_string(), Value::to_string);
    for path in paths {
        let (a, b) = (old.get(path), new.get(path));
        if a == b {
            continue;
        }
        if hot(path) {
            if path.len() == 1 && RESCAN_KEYS.contains(&path[0].as_str()) {
                rescan.push(format!("{}: {} -> {} (from the next rescan)", key_name(path), show(a), show(b)));
            }
            continue;
        }
        needs_restart.push(key_name(path));
        put(&mut merged, path, a.cloned());
    }
    needs_restart.sort();
    let mut config: HostConfig = serde_json::from_value(merged)?;
    // A per-resource section left with nothing set is no section.
    config.policy.resource.retain(|_, o| *o != Default::default());
    Ok(Merged { config, needs_restart, rescan })
}

/// One setting the daemon changes while it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// The coordinator's `[policy]` ([`HostConfig::coordinator_policy`]).
    Policy(Box<Policy>),
    /// One resource on or off for the whole host.
    Host { resource: Resource, on: bool },
    /// The memory-bandwidth regulation.
    Membw { period_ms: u64, reclaim: bool, best_effort: bool },
    /// A setting of the VMs named `vm` (of none, while no such VM runs).
    Vm { vm: String, set: VmChange },
}

impl Change {
    /// Whether `self` and `other` change the same setting (of the same VM, resource...).
    pub fn same_setting(&self, other: &Change) -> bool {
        match (self, other) {
            (Change::Policy(_), Change::Policy(_)) | (Change::Membw { .. }, Change::Membw { .. }) => true,
            (Change::Host { resource: a, .. }, Change::Host { resource: b, .. }) => a == b,
            (Change::Vm { vm: a, set: x }, Change::Vm { vm: b, set: y }) => {
                a == b
                    && match (x, y) {
                        (VmChange::Enabled { resource: r, .. }, VmChange::Enabled { resource: s, .. }) => r == s,
                        _ => std::mem::discriminant(x) == std::mem::discriminant(y),
                    }
            }
            _ => false,
        }
    }
}

/// A setting of one VM.
#[derive(Debug, Clone, PartialEq)]
pub enum VmChange {
    Enabled {
        resource: Resource,
        on: bool,
    },
    Priority(u8),
    /// `None`: `[rt] rt_ceiling`'s.
    Ceiling(Option<u8>),
    MembwShare(u64),
    Static(StaticConfig),
}

/// A change, its inverse, and what it is in words (`vm1: priority 1 -> 7`).
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub change: Change,
    pub undo: Change,
    pub what: String,
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// A static tuning in words, as `[vm.NAME.static]` says it.
pub fn describe_static(s: &StaticConfig) -> String {
    if s.is_empty() {
        return "none".into();
    }
    let mut out = Vec::new();
    if s.fifo {
        out.push(format!("fifo {}/{}", s.vcpu_priority, s.other_priority));
        if s.guard {
            out.push("guard".into());
        }
    }
    if let Some(cpus) = &s.shield {
        out.push(format!("shield {cpus}"));
    }
    out.join(", ")
}

/// The budgets of `p` in words, as far as they differ from `other`'s.
fn describe_policy(p: &Policy, other: &Policy) -> String {
    let mut out = Vec::new();
    if p.default_priority != other.default_priority {
        out.push(format!("default_priority {}", p.default_priority));
    }
    for r in Resource::ALL {
        let (l, o) = (p.limits(r), other.limits(r));
        if l != o {
            out.push(format!(
                "{}: boost <= {} ms at a time, <= {}‰ of the window, cooldown {} ms",
                r.name(),
                l.max_continuous_ns / cosched_core::NS_PER_MS,
                l.max_share_permille,
                l.cooldown_ns / cosched_core::NS_PER_MS
            ));
        }
    }
    out.join("; ")
}

/// The steps from the settings in force under `old` to those under `new` (both the config
/// with the operator's settings over it), for the VMs configured in either and those named
/// `running`. In an order that needs no room it does not have: what lowers first (switches
/// off, memory-bandwidth shares down, shields given up), what raises last (switches on).
pub fn diff(old: &HostConfig, new: &HostConfig, running: &[String]) -> Vec<Step> {
    let (mut first, mut then, mut last) = (Vec::new(), Vec::new(), Vec::new());
    let (po, pn) = (old.coordinator_policy(), new.coordinator_policy());
    if po.default_priority != pn.default_priority || Resource::ALL.iter().any(|r| po.limits(*r) != pn.limits(*r)) {
        let what = format!("[policy] {}", describe_policy(&pn, &po));
        then.push(Step { change: Change::Policy(Box::new(pn)), undo: Change::Policy(Box::new(po)), what });
    }
    for r in Resource::ALL {
        let (a, b) = (old.starts_enabled(r), new.starts_enabled(r));
        if a != b {
            let what = format!("{}: {} -> {} (whole host)", r.name(), on_off(a), on_off(b));
            let s =
                Step { change: Change::Host { resource: r, on: b }, undo: Change::Host { resource: r, on: a }, what };
            if b { &mut last } else { &mut first }.push(s);
        }
    }
    let (mo, mn) = (&old.membw, &new.membw);
    if (mo.period_ms, mo.reclaim, mo.best_effort) != (mn.period_ms, mn.reclaim, mn.best_effort) {
        let m = |c: &crate::membw::MembwConfig| Change::Membw {
            period_ms: c.period_ms,
            reclaim: c.reclaim,
            best_effort: c.best_effort,
        };
        let what = format!(
            "[membw] period {} -> {} ms, reclaim {} -> {}, best effort {} -> {}",
            mo.period_ms,
            mn.period_ms,
            on_off(mo.reclaim),
            on_off(mn.reclaim),
            on_off(mo.best_effort),
            on_off(mn.best_effort)
        );
        then.push(Step { change: m(mn), undo: m(mo), what });
    }
    let names: BTreeSet<&str> =
        old.vm.keys().chain(new.vm.keys()).map(String::as_str).chain(running.iter().map(String::as_str)).collect();
    for name in names {
        let later = if running.iter().any(|r| r == name) { "" } else { " (not running: when it appears)" };
        let vm = |set: VmChange| Change::Vm { vm: name.to_string(), set };
        let step = |to: &mut Vec<Step>, set: VmChange, back: VmChange, what: String| {
            to.push(Step { change: vm(set), undo: vm(back), what: format!("{name}: {what}{later}") });
        };
        let (so, sn) = (old.vm_settings(name), new.vm_settings(name));
        for r in Resource::ALL {
            let (a, b) = (so.enabled(r), sn.enabled(r));
            if a != b {
                let to = if b { &mut last } else { &mut first };
                let what = format!("{} {} -> {}", r.name(), on_off(a), on_off(b));
                step(to, VmChange::Enabled { resource: r, on: b }, VmChange::Enabled { resource: r, on: a }, what);
            }
        }
        if so.priority != sn.priority {
            let what = format!("priority {} -> {}", so.priority, sn.priority);
            step(&mut then, VmChange::Priority(sn.priority), VmChange::Priority(so.priority), what);
        }
        let ceiling = |c: &HostConfig| c.vm.get(name).and_then(|v| v.rt_ceiling);
        let (co, cn) = (ceiling(old), ceiling(new));
        if co != cn {
            let show = |c: Option<u8>| c.map_or_else(|| "[rt]'s".to_string(), |c| c.to_string());
            let what = format!("rt_ceiling {} -> {}", show(co), show(cn));
            step(&mut then, VmChange::Ceiling(cn), VmChange::Ceiling(co), what);
        }
        let (mo, mn) = (old.membw_share(name), new.membw_share(name));
        if mo != mn {
            let to = if mn < mo { &mut first } else { &mut then };
            step(to, VmChange::MembwShare(mn), VmChange::MembwShare(mo), format!("membw_share {mo} -> {mn}"));
        }
        let statics = |c: &HostConfig| c.vm.get(name).map(|v| v.statics.clone()).unwrap_or_default();
        let (to_, tn) = (statics(old), statics(new));
        if to_ != tn {
            // A shield given up (or moved) first: another VM's may take its CPUs.
            let to = if to_.shield.is_some() && to_.shield != tn.shield { &mut first } else { &mut then };
            let what = format!("static {} -> {}", describe_static(&to_), describe_static(&tn));
            step(to, VmChange::Static(tn), VmChange::Static(to_), what);
        }
    }
    first.extend(then);
    first.extend(last);
    first
}

/// What carries out a change: the daemon (through the coordinator's operator methods), or a
/// test's fake. A change is refused before anything is changed, as far as can be known.
pub trait Target {
    fn apply(&mut self, change: &Change) -> Result<(), Error>;
}

/// A step refused, and what could not be put back after it.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {error}; {}", undo_text(.undo_failed))]
pub struct Failed {
    pub what: String,
    pub error: Box<Error>,
    /// The steps whose undo failed, each with why.
    pub undo_failed: Vec<String>,
}

fn undo_text(failed: &[String]) -> String {
    if failed.is_empty() {
        "nothing changed".into()
    } else {
        format!("the rest was put back, but not: {}", failed.join("; "))
    }
}

/// Carries out `steps` in order; if one fails, undoes it and every one before it, last first,
/// and says what failed and what could not be undone.
pub fn apply(target: &mut dyn Target, steps: &[Step]) -> Result<(), Failed> {
    for (i, s) in steps.iter().enumerate() {
        if let Err(error) = target.apply(&s.change) {
            let mut undo_failed = Vec::new();
            for done in steps[..=i].iter().rev() {
                if let Err(e) = target.apply(&done.undo) {
                    undo_failed.push(format!("{}: {e}", done.what));
                }
            }
            return Err(Failed { what: s.what.clone(), error: Box::new(error), undo_failed });
        }
    }
    Ok(())
}

/// Why a reload or a reset changed nothing (or, past a failed step, what it could not put
/// back: [`Failed`]).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("this daemon was given its settings directly, not from a file: nothing to reload")]
    NoSource,
    /// The file does not read, parse or validate.
    #[error("refused, nothing changed: {0:#}")]
    Load(anyhow::Error),
    #[error("refused, nothing changed: reading the config back: {0}")]
    Merge(#[source] serde_json::Error),
    /// Valid alone, not with the keys that need a restart as they run.
    #[error("refused, nothing changed: with the keys that need a restart as they run: {0}")]
    Invalid(#[source] ConfigError),
    /// Valid alone, not with the operator's settings over it.
    #[error(
        "refused, nothing changed: with the operator's settings over it: {0} (cosched vm reset NAME, or cosched \
         reset, goes back to the config)"
    )]
    WithOperator(#[source] ConfigError),
    #[error("keeping the operator's settings: {0}; nothing changed")]
    Keep(#[source] crate::operator::OperatorError),
    /// `cosched vm reset NAME` for no VM the daemon knows.
    #[error(transparent)]
    Vm(Error),
    #[error(transparent)]
    Apply(#[from] Failed),
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

#[cfg(test)]
mod tests;
