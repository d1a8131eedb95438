//! The kinds of setting the daemon changes, each written once: how a value is read, set,
//! compared, shown and recorded ([`Kind`]). Like a tuned plugin's get/set pair: the actuators
//! apply a kind through their ledger ([`crate::actuator::ledger`]), which records a value before
//! it sets it, and the restore ([`crate::store::restore_record`]) puts a record back through the
//! same kind, so a restore is the inverse of an apply by construction.
//!
//! - [`SchedKind`]: scheduling attributes (`sched_setattr`);
//! - [`IoprioKind`]: the I/O priority (`ioprio_set`);
//! - [`AffinityKind`]: the CPUs a thread may run on (`sched_setaffinity`);
//! - [`CgroupKind`]: membership in a group of one hierarchy, making the daemon's own groups as
//!   they are first used;
//! - [`GroupValueKind`]: a number in a file of a whole (v2) group, kept on the VM's main thread
//!   (the default BFQ weight, `cgroup.freeze`).
//!
//! This module knows the record ([`Setting`]) and the system ([`ThreadOps`]), no actuator.

use std::fmt::Debug;
use std::io;

use crate::cgroup::{self, parse_weight, weight_text};
use crate::sched::{self, SchedAttr, ThreadOps};
use crate::shield::format_cpus;
use crate::store::Setting;

/// One kind of setting of a thread (or of a group, kept on one of its threads).
pub trait Kind: Debug {
    type V: Clone + PartialEq + Debug;
    /// What a thread's status line calls it, and messages about it.
    fn label(&self) -> &'static str;
    fn get(&self, ops: &mut dyn ThreadOps, tid: i32) -> io::Result<Self::V>;
    fn set(&self, ops: &mut dyn ThreadOps, tid: i32, v: &Self::V) -> io::Result<()>;
    /// Whether a value read back is `b` (the kernel may report what `b` leaves unused).
    fn same(&self, a: &Self::V, b: &Self::V) -> bool {
        a == b
    }
    fn show(&self, v: &Self::V) -> String;
    /// What a `set` of `v` that failed with `e` says.
    fn explain(&self, _ops: &dyn ThreadOps, tid: i32, v: &Self::V, e: &io::Error) -> String {
        format!("setting {} {} on thread {tid}: {e}", self.label(), self.show(v))
    }
    /// The record of a thread that had `original` and may get any of `applied`.
    fn record(&self, original: &Self::V, applied: &[Self::V]) -> Setting;
    /// The original and applied values of a record of this kind; `None`: another kind.
    fn parse_record(&self, s: &Setting) -> Option<(Self::V, Vec<Self::V>)>;
    /// Whether setting `v` made something of the daemon's that outlives the threads that had
    /// it (a group of its own), which the restore must still remove once they are gone.
    fn creates(&self, _v: &Self::V) -> bool {
        false
    }
}

/// Whether an error says the thread (or the group) is gone: nothing left to change.
pub fn is_gone(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ESRCH)
}

/// `sched_getattr(2)` / `sched_setattr(2)`.
#[derive(Debug, Clone, Copy)]
pub struct SchedKind;

impl Kind for SchedKind {
    type V = SchedAttr;
    fn label(&self) -> &'static str {
        "sched"
    }
    fn get(&self, ops: &mut dyn ThreadOps, tid: i32) -> io::Result<SchedAttr> {
        ops.get(tid)
    }
    fn set(&self, ops: &mut dyn ThreadOps, tid: i32, v: &SchedAttr) -> io::Result<()> {
        ops.set(tid, v)
    }
    fn same(&self, a: &SchedAttr, b: &SchedAttr) -> bool {
        a.same_as(b)
    }
    fn show(&self, v: &SchedAttr) -> String {
        v.to_string()
    }
    /// The kernel's reasons (privileges, admission control), and the cpu groups that RT group
    /// scheduling holds at no runtime.
    fn explain(&self, ops: &dyn ThreadOps, tid: i32, v: &SchedAttr, e: &io::Error) -> String {
        let why = sched::explain_set_error(tid, v, e);
        let blocker = (e.raw_os_error() == Some(libc::EPERM) && v.is_realtime())
            .then(|| ops.cgroups().rt_runtime_blocker(tid))
            .flatten();
        match blocker {
            Some(group) => format!("{why}: {group}"),
            None => why,
        }
    }
    fn record(&self, original: &SchedAttr, applied: &[SchedAttr]) -> Setting {
        Setting::Sched { original: *original, applied: applied.to_vec() }
    }
    fn parse_record(&self, s: &Setting) -> Option<(SchedAttr, Vec<SchedAttr>)> {
        match s {
            Setting::Sched { original, applied } => Some((*original, applied.clone())),
            _ => None,
        }
    }
}

/// `ioprio_get(2)` / `ioprio_set(2)`: the raw value, class << 13 | data.
#[derive(Debug, Clone, Copy)]
pub struct IoprioKind;

impl Kind for IoprioKind {
    type V = u16;
    fn label(&self) -> &'static str {
        "ioprio"
    }
    fn get(&self, ops: &mut dyn ThreadOps, tid: i32) -> io::Result<u16> {
        ops.get_ioprio(tid)
    }
    fn set(&self, ops: &mut dyn ThreadOps, tid: i32, v: &u16) -> io::Result<()> {
        ops.set_ioprio(tid, *v)
    }
    fn show(&self, v: &u16) -> String {
        format!("{v:#x}")
    }
    fn record(&self, original: &u16, applied: &[u16]) -> Setting {
        Setting::Ioprio { original: *original, applied: applied.to_vec() }
    }
    fn parse_record(&self, s: &Setting) -> Option<(u16, Vec<u16>)> {
        match s {
            Setting::Ioprio { original, applied } => Some((*original, applied.clone())),
            _ => None,
        }
    }
}

/// `sched_getaffinity(2)` / `sched_setaffinity(2)`: the CPUs, sorted.
#[derive(Debug, Clone, Copy)]
pub struct AffinityKind;

impl Kind for AffinityKind {
    type V = Vec<usize>;
    fn label(&self) -> &'static str {
        "affinity"
    }
    fn get(&self, ops: &mut dyn ThreadOps, tid: i32) -> io::Result<Vec<usize>> {
        ops.get_affinity(tid)
    }
    fn set(&self, ops: &mut dyn ThreadOps, tid: i32, v: &Vec<usize>) -> io::Result<()> {
        ops.set_affinity(tid, v)
    }
    fn show(&self, v: &Vec<usize>) -> String {
        format_cpus(&v.iter().copied().collect())
    }
    fn record(&self, original: &Vec<usize>, applied: &[Vec<usize>]) -> Setting {
        Setting::Affinity { original: original.clone(), applied: applied.to_vec() }
    }
    fn parse_record(&self, s: &Setting) -> Option<(Vec<usize>, Vec<Vec<usize>>)> {
        match s {
            Setting::Affinity { original, applied } => Some((original.clone(), applied.clone())),
            _ => None,
        }
    }
}

/// Groups of the daemon's making in one hierarchy: named `<prefix>...`.
#[derive(Debug, Clone)]
pub struct OwnGroups {
    pub prefix: &'static str,
    /// A control file and its value, written when a thread is first moved into such a group
    /// (the group is made then); `None`: someone else makes them (the shield's groups).
    pub made_with: Option<(&'static str, String)>,
}

/// Membership in a group of one hierarchy ([`crate::cgroup`]): a v1 controller's name, `""`
/// for v2, or resctrl. Groups are paths in that hierarchy.
#[derive(Debug, Clone)]
pub struct CgroupKind {
    pub hierarchy: String,
    label: &'static str,
    pub own: Option<OwnGroups>,
}

impl CgroupKind {
    /// Membership in `hierarchy`, shown under its name, with the daemon's groups named by `own`.
    pub fn new(hierarchy: &'static str, own: Option<OwnGroups>) -> CgroupKind {
        CgroupKind { hierarchy: hierarchy.to_string(), label: hierarchy, own }
    }

    /// A record's hierarchy, to put a thread back (into a group that exists).
    pub fn recorded(hierarchy: &str) -> CgroupKind {
        CgroupKind { hierarchy: hierarchy.to_string(), label: "cgroup", own: None }
    }

    /// Whether `group` is one of the daemon's.
    pub fn is_own(&self, group: &str) -> bool {
        self.own.as_ref().is_some_and(|o| cgroup::is_named(group, o.prefix))
    }
}

impl Kind for CgroupKind {
    type V = String;
    fn label(&self) -> &'static str {
        self.label
    }
    fn get(&self, ops: &mut dyn ThreadOps, tid: i32) -> io::Result<String> {
        ops.get_cgroup(tid, &self.hierarchy)
    }
    fn set(&self, ops: &mut dyn ThreadOps, tid: i32, group: &String) -> io::Result<()> {
        let h = self.hierarchy.as_str();
        if let Some((file, value)) = self.own.as_ref().and_then(|o| o.made_with.as_ref()).filter(|_| self.is_own(group))
        {
            let cg = ops.cgroups().clone();
            if !cg.dir(h, group).is_dir() {
                cg.make_group(h, group).map_err(|e| match e.raw_os_error() {
                    Some(libc::ENOSPC) if h == cgroup::RESCTRL => io::Error::new(
                        e.kind(),
                        format!("making resctrl group {group}: every CLOSID is taken (info/MB/num_closids): {e}"),
                    ),
                    _ => e,
                })?;
                if let Err(e) = cg.write(h, group, file, value) {
                    let _ = cg.remove_group(h, group);
                    return Err(io::Error::new(e.kind(), format!("writing {file} of {group}: {e}")));
                }
            }
        }
        ops.set_cgroup(tid, h, group)
    }
    fn show(&self, v: &String) -> String {
        v.clone()
    }
    fn explain(&self, _: &dyn ThreadOps, tid: i32, group: &String, e: &io::Error) -> String {
        let h = if self.hierarchy.is_empty() { "v2" } else { &self.hierarchy };
        format!("moving thread {tid} into {h} cgroup {group}: {e}")
    }
    fn record(&self, original: &String, applied: &[String]) -> Setting {
        Setting::Cgroup { hierarchy: self.hierarchy.clone(), original: original.clone(), applied: applied.to_vec() }
    }
    fn parse_record(&self, s: &Setting) -> Option<(String, Vec<String>)> {
        match s {
            Setting::Cgroup { hierarchy, original, applied } if *hierarchy == self.hierarchy => {
                Some((original.clone(), applied.clone()))
            }
            _ => None,
        }
    }
    fn creates(&self, group: &String) -> bool {
        self.is_own(group)
    }
}

/// Which group a [`GroupValueKind`] acts on.
#[derive(Debug, Clone)]
pub enum GroupOf {
    /// The v2 group of the thread it is kept on (the VM's main thread), which no other process
    /// may share: a lever that weights or freezes a whole group says `why` it needs that.
    OwnedBy { why: &'static str },
    /// The group a record names (gone with its VM: nothing to put back).
    Recorded(String),
}

/// A number in a file of a whole group: the default BFQ weight (`blkio.bfq.weight` in v1, the
/// `default` line of `io.bfq.weight` in v2), or `cgroup.freeze`. The value is (group, number).
#[derive(Debug, Clone)]
pub struct GroupValueKind {
    pub hierarchy: String,
    pub file: String,
    label: &'static str,
    pub group: GroupOf,
}

impl GroupValueKind {
    /// `file` of the VM's own v2 group, shown as `label`.
    pub fn own_v2(file: &str, label: &'static str, why: &'static str) -> GroupValueKind {
        GroupValueKind { hierarchy: String::new(), file: file.to_string(), label, group: GroupOf::OwnedBy { why } }
    }

    /// A record's group and file, to put the value back.
    pub fn recorded(hierarchy: &str, group: &str, file: &str) -> GroupValueKind {
        GroupValueKind {
            hierarchy: hierarchy.to_string(),
            file: file.to_string(),
            label: "group_weight",
            group: GroupOf::Recorded(group.to_string()),
        }
    }

    /// What to write to set `value`: a BFQ weight file's default weight, else the number.
    fn text(&self, value: u32) -> String {
        if self.file.contains("bfq.weight") {
            weight_text(&self.hierarchy, value)
        } else {
            value.to_string()
        }
    }
}

impl Kind for GroupValueKind {
    type V = (String, u32);
    fn label(&self) -> &'static str {
        self.label
    }
    fn get(&self, ops: &mut dyn ThreadOps, tid: i32) -> io::Result<(String, u32)> {
        let h = self.hierarchy.as_str();
        let group = match &self.group {
            GroupOf::OwnedBy { why } => own_v2_group(ops, tid, why)?,
            GroupOf::Recorded(g) if !ops.cgroups().dir(h, g).is_dir() => {
                return Err(io::Error::from_raw_os_error(libc::ESRCH)); // the group went with its VM
            }
            GroupOf::Recorded(g) => g.clone(),
        };
        let text = ops.cgroups().read(h, &group, &self.file)?;
        let n = parse_weight(&text)
            .ok_or_else(|| io::Error::other(format!("{} of {group}: no number in {text:?}", self.file)))?;
        Ok((group, n))
    }
    fn set(&self, ops: &mut dyn ThreadOps, _: i32, v: &(String, u32)) -> io::Result<()> {
        ops.cgroups().write(&self.hierarchy, &v.0, &self.file, &self.text(v.1))
    }
    fn show(&self, v: &(String, u32)) -> String {
        format!("{} {}", v.0, v.1)
    }
    fn explain(&self, _: &dyn ThreadOps, _: i32, v: &(String, u32), e: &io::Error) -> String {
        format!("writing {} to {} of {}: {e}", v.1, self.file, v.0)
    }
    fn record(&self, original: &(String, u32), applied: &[(String, u32)]) -> Setting {
        Setting::GroupWeight {
            hierarchy: self.hierarchy.clone(),
            group: original.0.clone(),
            file: self.file.clone(),
            original: original.1,
            applied: applied.iter().map(|a| a.1).collect(),
        }
    }
    fn parse_record(&self, s: &Setting) -> Option<((String, u32), Vec<(String, u32)>)> {
        match s {
            Setting::GroupWeight { hierarchy, group, file, original, applied }
                if *hierarchy == self.hierarchy
                    && *file == self.file
                    && !matches!(&self.group, GroupOf::Recorded(g) if g != group) =>
            {
                Some(((group.clone(), *original), applied.iter().map(|w| (group.clone(), *w)).collect()))
            }
            _ => None,
        }
    }
}

/// The cgroup v2 group of the VM whose main thread is `tid`, if no other process is in it (a
/// lever that acts on `why` needs a group of the VM's own).
pub fn own_v2_group(ops: &mut dyn ThreadOps, tid: i32, why: &str) -> io::Result<String> {
    let group = ops.get_cgroup(tid, "")?;
    let procs = ops.cgroups().read("", &group, "cgroup.procs")?;
    let others: Vec<&str> = procs.split_whitespace().filter(|p| *p != tid.to_string()).collect();
    if !others.is_empty() || group == "/" {
        return Err(io::Error::other(format!(
            "the VM shares its cgroup {group} with other processes ({}): {why}, so run the VM in a group of \
             its own (libvirt does; or systemd-run --scope qemu-system-...)",
            if group == "/" { "the root group".to_string() } else { others.join(" ") }
        )));
    }
    Ok(group)
}
