//! CPU shielding's host-wide part (the Performance Tuning paper, sec. 4.2.1): while any VM's vCPUs
//! have dedicated CPUs, the IRQs and the host groups the operator named leave those CPUs, and come
//! back when no VM is shielded any more, when the daemon stops, or when a restarted daemon finds
//! what a dead one left (`kill -9`).
//!
//! What moves is the operator's choice, like systemd's `AllowedCPUs=`: `[shield] host_groups`
//! names cpuset groups (v1: paths under `<cgroup_root>/cpuset`, v2: under `<cgroup_root>`) whose
//! `cpuset.cpus` are narrowed to the housekeeping CPUs. Nothing else of the host moves: never
//! "every process" by default. IRQs (`/proc/irq/<n>/smp_affinity_list`) move when `irqs` is on;
//! an IRQ whose affinity the kernel fixes (managed, per-CPU: the write fails) is reported, and
//! so are the per-CPU kernel threads bound to a shielded CPU, which nothing can move.
//!
//! The VM's own threads are the per-VM static actuator's ([`crate::actuator::statics`]).
//!
//! Every original value is on disk (`<state_dir>/host-shield.state`) before the first change,
//! and a value is put back only if it still holds what we wrote: a change someone else made
//! meanwhile stays.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cgroup::CgroupFs;
/// What a shield moved and could not do, for `cosched status` (a part of the status).
pub use cosched_status::ShieldReport;

/// A set of CPU numbers.
pub type Cpus = BTreeSet<usize>;

/// A CPU list that does not parse (or names a CPU beyond 4095).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a CPU list like \"1\", \"2-3\" or \"0,4-5\"")]
pub struct CpuListError {
    pub text: String,
}

/// Parses a CPU list as the kernel writes it (`0-2,5`; empty: no CPU).
pub fn parse_cpus(text: &str) -> Result<Cpus, CpuListError> {
    let mut out = Cpus::new();
    for part in text.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || CpuListError { text: text.to_string() };
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => {
                (a.trim().parse::<usize>().map_err(|_| bad())?, b.trim().parse::<usize>().map_err(|_| bad())?)
            }
            None => {
                let a = part.parse::<usize>().map_err(|_| bad())?;
                (a, a)
            }
        };
        if a > b || b >= 4096 {
            return Err(bad());
        }
        out.extend(a..=b);
    }
    Ok(out)
}

/// Why the shield cannot be had, or what of it could not be put back.
#[derive(Debug, thiserror::Error)]
pub enum ShieldError {
    /// `[shield] housekeeping_cpus` does not parse.
    #[error("[shield] housekeeping_cpus: {0}")]
    Housekeeping(CpuListError),
    /// A housekeeping CPU is one of the shielded.
    #[error("housekeeping CPU {cpu} is also shielded")]
    HousekeepingShielded { cpu: usize },
    /// Shielding these CPUs would leave the host none.
    #[error("shielding CPUs {} would leave the host no CPU for everything else", format_cpus(.shielded))]
    NoHousekeeping { shielded: Cpus },
    /// Reading a value, or writing the record, failed.
    #[error("{}: {error}", .path.display())]
    Io { path: PathBuf, error: io::Error },
    /// An original value could not be written back.
    #[error("putting {} back to {original:?}: {error}", .path.display())]
    PutBack { path: PathBuf, original: String, error: io::Error },
    /// The record does not parse; it is kept.
    #[error("{}: corrupt, kept for you: {error}", .path.display())]
    Corrupt { path: PathBuf, error: serde_json::Error },
    /// The record is of another format; it is kept.
    #[error("{}: format {version} (this cosched reads {RECORD_VERSION}), kept", .path.display())]
    Format { path: PathBuf, version: u32 },
    /// What a restore could not put back, each.
    #[error("{}", join(.0))]
    NotRestored(Vec<ShieldError>),
}

/// The errors, one after the other.
fn join(errors: &[ShieldError]) -> String {
    errors.iter().map(ShieldError::to_string).collect::<Vec<_>>().join("; ")
}

/// Formats a CPU set as a kernel CPU list (`0-2,5`).
pub fn format_cpus(cpus: &Cpus) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut it = cpus.iter().copied().peekable();
    while let Some(a) = it.next() {
        let mut b = a;
        while it.peek() == Some(&(b + 1)) {
            b = it.next().expect("peeked");
        }
        out.push(if a == b { a.to_string() } else { format!("{a}-{b}") });
    }
    out.join(",")
}

/// `[shield]`: what the host gives up to the shielded vCPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShieldConfig {
    /// The CPUs everything that leaves a shield goes to (the shielded VMs' other threads, the
    /// host groups, IRQs). Default: every CPU of the host that no VM is shielded on.
    pub housekeeping_cpus: Option<String>,
    /// cpuset groups whose CPUs are narrowed to the housekeeping CPUs while any VM is shielded
    /// (e.g. `/system.slice`, `/user.slice`). Empty: no host task is moved.
    pub host_groups: Vec<String>,
    /// Move every IRQ's affinity off the shielded CPUs.
    pub irqs: bool,
    /// Where IRQ affinities are (tests give a fake tree).
    pub irq_dir: PathBuf,
}

impl Default for ShieldConfig {
    fn default() -> Self {
        ShieldConfig { housekeeping_cpus: None, host_groups: Vec::new(), irqs: true, irq_dir: "/proc/irq".into() }
    }
}

/// One host-wide value we changed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Target {
    /// `<irq_dir>/<irq>/smp_affinity_list`.
    Irq { irq: u32 },
    /// `cpuset.cpus` of a group of the cpuset hierarchy (`hierarchy`: `cpuset` for v1, `""` v2).
    GroupCpus { hierarchy: String, group: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Changed {
    #[serde(flatten)]
    pub target: Target,
    pub original: String,
    pub applied: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Record {
    version: u32,
    changed: Vec<Changed>,
}

const RECORD_VERSION: u32 = 1;
pub const RECORD_FILE: &str = "host-shield.state";

/// The cpuset hierarchy: `cpuset` (v1) or `""` (v2), if either is mounted with cpusets.
pub fn cpuset_hierarchy(cg: &CgroupFs) -> Option<&'static str> {
    if cg.has_hierarchy("cpuset") {
        Some("cpuset")
    } else if cg.v2_controllers().iter().any(|c| c == "cpuset") {
        Some("")
    } else {
        None
    }
}

/// The CPUs the host has (the cpuset hierarchy's root), else the online CPUs.
pub fn host_cpus(cg: &CgroupFs) -> Cpus {
    let from_cg = match cpuset_hierarchy(cg) {
        Some("cpuset") => cg.read("cpuset", "/", "cpuset.effective_cpus").ok(),
        Some(_) => cg.read("", "/", "cpuset.cpus.effective").ok(),
        None => None,
    };
    let text = from_cg.or_else(|| fs::read_to_string("/sys/devices/system/cpu/online").ok()).unwrap_or_default();
    parse_cpus(&text).unwrap_or_default()
}

/// The host-wide shield: applied for the union of the shielded VMs' CPUs.
#[derive(Debug)]
pub struct HostShield {
    cfg: ShieldConfig,
    cg: CgroupFs,
    proc: PathBuf,
    file: PathBuf,
    changed: BTreeMap<Target, Changed>,
    /// What is shielded now (empty: nothing).
    shielded: Cpus,
    report: ShieldReport,
}

fn read_trim(p: &Path) -> io::Result<String> {
    Ok(fs::read_to_string(p)?.trim().to_string())
}

/// One write, as `echo value > file` does (an empty value is a lone newline: "inherit" for a
/// v2 `cpuset.cpus`). The file must exist.
fn write_once(p: &Path, value: &str) -> io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).truncate(true).open(p)?;
    f.write_all(if value.is_empty() { b"\n" } else { value.as_bytes() })
}

impl HostShield {
    pub fn new(cfg: ShieldConfig, cg: CgroupFs, proc: impl Into<PathBuf>, state_dir: &Path) -> HostShield {
        HostShield {
            cfg,
            cg,
            proc: proc.into(),
            file: state_dir.join(RECORD_FILE),
            changed: BTreeMap::new(),
            shielded: Cpus::new(),
            report: ShieldReport::default(),
        }
    }

    pub fn report(&self) -> &ShieldReport {
        &self.report
    }

    pub fn shielded(&self) -> &Cpus {
        &self.shielded
    }

    /// The housekeeping CPUs for `shielded`: the configured ones, else every host CPU not
    /// shielded. An error when none is left or the configured ones overlap the shield.
    pub fn housekeeping(&self, shielded: &Cpus) -> Result<Cpus, ShieldError> {
        let hk = match &self.cfg.housekeeping_cpus {
            Some(list) => parse_cpus(list).map_err(ShieldError::Housekeeping)?,
            None => host_cpus(&self.cg).difference(shielded).copied().collect(),
        };
        if let Some(&cpu) = hk.intersection(shielded).next() {
            return Err(ShieldError::HousekeepingShielded { cpu });
        }
        if hk.is_empty() {
            return Err(ShieldError::NoHousekeeping { shielded: shielded.clone() });
        }
        Ok(hk)
    }

    fn save(&self) -> io::Result<()> {
        let rec = Record { version: RECORD_VERSION, changed: self.changed.values().cloned().collect() };
        if rec.changed.is_empty() {
            return match fs::remove_file(&self.file) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
        }
        let tmp = self.file.with_extension("tmp");
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(&rec).map_err(io::Error::other)?)?;
        f.sync_all()?;
        fs::rename(&tmp, &self.file)
    }

    fn path_of(&self, t: &Target) -> PathBuf {
        match t {
            Target::Irq { irq } => self.cfg.irq_dir.join(irq.to_string()).join("smp_affinity_list"),
            Target::GroupCpus { hierarchy, group } => self.cg.dir(hierarchy, group).join("cpuset.cpus"),
        }
    }

    /// Writes `value` to `t`, recording the original first. `Ok(false)`: not written because
    /// someone else changed a value we had written (theirs stays).
    fn set(&mut self, t: Target, current: &str, value: &str) -> io::Result<bool> {
        match self.changed.get_mut(&t) {
            Some(c) if c.applied.last().map(String::as_str) != Some(current) && current != c.original => {
                return Ok(false)
            }
            Some(c) => {
                if !c.applied.iter().any(|a| a == value) {
                    c.applied.push(value.to_string());
                }
            }
            None => {
                self.changed.insert(
                    t.clone(),
                    Changed { target: t.clone(), original: current.to_string(), applied: vec![value.to_string()] },
                );
            }
        }
        self.save()?;
        write_once(&self.path_of(&t), value)?;
        // The kernel writes lists back in its own form: keep that as what we applied.
        if let Ok(now) = read_trim(&self.path_of(&t)) {
            if let Some(c) = self.changed.get_mut(&t) {
                if !c.applied.contains(&now) {
                    c.applied.push(now);
                    self.save()?;
                }
            }
        }
        Ok(true)
    }

    /// Brings the host to `shielded` (the union of the shielded VMs' CPUs): IRQs and the named
    /// groups leave them. An empty set puts everything back. Called again on every rescan, so
    /// IRQs that appear later are moved too.
    pub fn apply(&mut self, shielded: &Cpus) -> &ShieldReport {
        if shielded.is_empty() {
            let errors = self.restore().iter().map(ShieldError::to_string).collect();
            self.shielded.clear();
            self.report = ShieldReport { errors, ..Default::default() };
            return &self.report;
        }
        let mut report = ShieldReport { shielded_cpus: format_cpus(shielded), ..Default::default() };
        let hk = match self.housekeeping(shielded) {
            Ok(hk) => hk,
            Err(e) => {
                report.errors.push(e.to_string());
                self.report = report;
                return &self.report;
            }
        };
        report.housekeeping_cpus = format_cpus(&hk);
        if self.shielded != *shielded {
            // A CPU no longer shielded: what was moved off it may come back. Restoring first
            // and moving again keeps every original the one from before the first shield.
            let dropped: Vec<usize> = self.shielded.difference(shielded).copied().collect();
            if !dropped.is_empty() {
                report.errors.extend(self.restore().iter().map(ShieldError::to_string));
            }
        }
        self.shielded = shielded.clone();
        if self.cfg.irqs {
            self.move_irqs(shielded, &hk, &mut report);
        }
        self.move_groups(shielded, &hk, &mut report);
        report.kthreads_left = per_cpu_kthreads(&self.proc, shielded);
        self.report = report;
        &self.report
    }

    fn move_irqs(&mut self, shielded: &Cpus, hk: &Cpus, report: &mut ShieldReport) {
        let Ok(dir) = fs::read_dir(&self.cfg.irq_dir) else {
            report.errors.push(format!("cannot read {}", self.cfg.irq_dir.display()));
            return;
        };
        let mut irqs: Vec<u32> = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
        irqs.sort_unstable();
        for irq in irqs {
            let t = Target::Irq { irq };
            let Ok(current) = read_trim(&self.path_of(&t)) else { continue };
            let Ok(cpus) = parse_cpus(&current) else { continue };
            if cpus.is_disjoint(shielded) {
                if self.changed.contains_key(&t) {
                    report.irqs_moved.push(irq);
                }
                continue;
            }
            let rest: Cpus = cpus.difference(shielded).copied().collect();
            let want = format_cpus(if rest.is_empty() { hk } else { &rest });
            match self.set(t, &current, &want) {
                Ok(true) => report.irqs_moved.push(irq),
                Ok(false) => report.irqs_fixed.push(format!("{irq}: set to {current} by someone else, left there")),
                Err(e) => {
                    self.forget_failed(&Target::Irq { irq }, &current);
                    report.irqs_fixed.push(format!("{irq}: {e}"));
                }
            }
        }
    }

    fn move_groups(&mut self, shielded: &Cpus, hk: &Cpus, report: &mut ShieldReport) {
        let Some(h) = cpuset_hierarchy(&self.cg) else {
            if !self.cfg.host_groups.is_empty() {
                report.errors.push("[shield] host_groups: no cpuset hierarchy is mounted".into());
            }
            return;
        };
        for group in self.cfg.host_groups.clone() {
            let t = Target::GroupCpus { hierarchy: h.to_string(), group: group.clone() };
            let current = match read_trim(&self.path_of(&t)) {
                Ok(c) => c,
                Err(e) => {
                    report.errors.push(format!("host group {group}: {e}"));
                    continue;
                }
            };
            // v2: an empty cpuset.cpus means the parent's; what the group runs on is effective.
            let effective = if current.is_empty() && h.is_empty() {
                self.cg.read(h, &group, "cpuset.cpus.effective").unwrap_or_default()
            } else {
                current.clone()
            };
            let cpus = parse_cpus(&effective).unwrap_or_default();
            if !cpus.is_empty() && cpus.is_disjoint(shielded) {
                if self.changed.contains_key(&t) {
                    report.groups_moved.push(group);
                }
                continue;
            }
            let rest: Cpus = cpus.difference(shielded).copied().collect();
            let want = format_cpus(if rest.is_empty() { hk } else { &rest });
            match self.set(t.clone(), &current, &want) {
                Ok(true) => report.groups_moved.push(group),
                Ok(false) => {
                    report.errors.push(format!("host group {group}: CPUs set to {current} by someone else, left"))
                }
                Err(e) => {
                    self.forget_failed(&t, &current);
                    report.errors.push(format!("host group {group}: writing cpuset.cpus {want}: {e}"));
                }
            }
        }
    }

    /// A first write that failed changed nothing: its record entry goes.
    fn forget_failed(&mut self, t: &Target, current: &str) {
        if self
            .changed
            .get(t)
            .is_some_and(|c| c.original == current && read_trim(&self.path_of(t)).ok().as_deref() == Some(current))
        {
            self.changed.remove(t);
            let _ = self.save();
        }
    }

    /// Puts back every value that still holds what we wrote; returns the errors. The record
    /// goes once nothing is left to put back.
    pub fn restore(&mut self) -> Vec<ShieldError> {
        let mut errors = Vec::new();
        let mut left = BTreeMap::new();
        // Groups first (a group may hold tasks whose IRQ-free CPUs come back with it).
        let mut all: Vec<Changed> = std::mem::take(&mut self.changed).into_values().collect();
        all.sort_by_key(|c| matches!(c.target, Target::Irq { .. }));
        for c in all {
            match self.undo(&c) {
                Ok(()) => {}
                Err(e) => {
                    errors.push(e);
                    left.insert(c.target.clone(), c);
                }
            }
        }
        self.changed = left;
        if let Err(error) = self.save() {
            errors.push(ShieldError::Io { path: self.file.clone(), error });
        }
        errors
    }

    fn undo(&self, c: &Changed) -> Result<(), ShieldError> {
        let p = self.path_of(&c.target);
        let current = match read_trim(&p) {
            Ok(v) => v,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()), // IRQ or group gone
            Err(error) => return Err(ShieldError::Io { path: p, error }),
        };
        if !c.applied.contains(&current) {
            return Ok(()); // someone else's value: theirs stays
        }
        match write_once(&p, &c.original) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(ShieldError::PutBack { path: p, original: c.original.clone(), error }),
        }
    }

    /// After a crash: puts back what a dead daemon's record says (`cosched restore`, a restart).
    pub fn restore_leftover(&mut self) -> Result<usize, ShieldError> {
        let path = || self.file.clone();
        let text = match fs::read(&self.file) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(error) => return Err(ShieldError::Io { path: path(), error }),
            Ok(t) => t,
        };
        let rec: Record =
            serde_json::from_slice(&text).map_err(|error| ShieldError::Corrupt { path: path(), error })?;
        if rec.version != RECORD_VERSION {
            return Err(ShieldError::Format { path: path(), version: rec.version });
        }
        let n = rec.changed.len();
        for c in rec.changed {
            self.changed.insert(c.target.clone(), c);
        }
        let errors = self.restore();
        if errors.is_empty() {
            Ok(n)
        } else {
            Err(ShieldError::NotRestored(errors))
        }
    }
}

/// Kernel threads (PF_KTHREAD) allowed only on shielded CPUs: `comm/cpus`, sorted.
pub fn per_cpu_kthreads(proc: &Path, shielded: &Cpus) -> Vec<String> {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let mut out = Vec::new();
    let Ok(dir) = fs::read_dir(proc) else { return out };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(stat) = fs::read_to_string(proc.join(pid.to_string()).join("stat")) else { continue };
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 2..]) else { continue };
        // Fields after the comm: state(3) ppid pgrp session tty_nr tpgid flags(9).
        let Some(flags) = after.split_whitespace().nth(6).and_then(|f| f.parse::<u64>().ok()) else { continue };
        if flags & PF_KTHREAD == 0 {
            continue;
        }
        let Ok(status) = fs::read_to_string(proc.join(pid.to_string()).join("status")) else { continue };
        let Some(list) = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")) else { continue };
        let Ok(cpus) = parse_cpus(list) else { continue };
        if !cpus.is_empty() && cpus.is_subset(shielded) {
            let comm = stat.find('(').zip(stat.rfind(')')).map(|(a, b)| &stat[a + 1..b]).unwrap_or("?");
            out.push(comm.to_string());
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests;
