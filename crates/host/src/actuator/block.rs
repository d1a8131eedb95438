//! The I/O actuator (Virtual-BFQ, seed 003): while a guest's BFQ has weight-raised busy queues
//! (`IO 1`), the VM's I/O-issuing threads are raised on the host's BFQ, and put back at `IO 0`.
//!
//! Two levers ([`IoLever`]):
//! - `ioprio`: each I/O thread gets the real-time I/O class (`ioprio_set`), which BFQ serves
//!   before every best-effort queue. A thread already in the real-time class is left alone.
//! - `weight`: a raised BFQ weight through a cgroup. With the v1 `blkio` hierarchy (threads can
//!   be placed one by one) each I/O thread moves into a group of the daemon's,
//!   `<its group>/cosched-io-<pid>`, whose `blkio.bfq.weight` is the raised weight; the group
//!   is created at the first raise and removed when the VM is restored. In v2 the `io`
//!   controller is not threaded (a process's threads share one group), so the lever raises the
//!   default `io.bfq.weight` of the VM's own group, which only this VM may be in (libvirt's
//!   `machine-*.scope`, `systemd-run --scope`); a VM that shares its group is refused.
//!
//! I/O-issuing threads: the main loop, `IO <id>` iothreads and `worker` threads (QEMU's
//! thread pool, which exits after 10 s idle and is re-created: a worker born while raised is
//! raised when the thread list moves). Without thread names (no `debug-threads=on`) every
//! thread is raised. Every value is recorded before it is set and undone through the one
//! restore logic ([`crate::store`]), after `kill -9` too.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::time::Instant;

use cosched_core::Level;
use cosched_procfs::{TaskId, ThreadInfo, ThreadRole};
use cosched_proto::Resource;
use serde::{Deserialize, Serialize};

use super::{Actuator, Host, Outcome, Prepared, Threads};
use crate::cgroup::CgroupFs;
use crate::cgroup::{weight_text, IO_GROUP_PREFIX};
use crate::store::{self, Entry, Setting};

/// The layer the I/O boost records its changes under (the resource's name).
pub const IO_LAYER: &str = "io";

/// `IOPRIO_CLASS_RT` in the class bits of an ioprio value.
pub const IOPRIO_CLASS_RT: u16 = 1;
const IOPRIO_CLASS_SHIFT: u16 = 13;

/// The v1 controller that carries BFQ's weights.
pub const BLKIO: &str = "blkio";
const V1_WEIGHT: &str = "blkio.bfq.weight";
const V2_WEIGHT: &str = "io.bfq.weight";

/// How a raised VM is privileged on the host's BFQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoLever {
    /// The real-time I/O class for every I/O thread.
    #[default]
    Ioprio,
    /// A raised BFQ weight through a per-VM cgroup.
    Weight,
}

impl IoLever {
    pub fn name(self) -> &'static str {
        match self {
            IoLever::Ioprio => "ioprio",
            IoLever::Weight => "weight",
        }
    }
}

/// `[io]` in the host config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IoBoost {
    pub lever: IoLever,
    /// `ioprio` lever: the level within the real-time class, 0 (first) ..= 7.
    pub ioprio_level: u8,
    /// `weight` lever: the BFQ weight of a raised VM's group, 1..=1000 (a group's default is
    /// 100; a best-effort queue of I/O priority 4 weighs 40).
    pub weight: u32,
}

impl Default for IoBoost {
    fn default() -> Self {
        IoBoost { lever: IoLever::default(), ioprio_level: 0, weight: 1000 }
    }
}

impl IoBoost {
    pub fn validate(&self) -> Result<(), String> {
        if self.ioprio_level > 7 {
            return Err(format!("[io] ioprio_level = {}: must be 0..=7", self.ioprio_level));
        }
        if !(1..=1000).contains(&self.weight) {
            return Err(format!("[io] weight = {}: must be 1..=1000 (BFQ's range)", self.weight));
        }
        Ok(())
    }

    /// The ioprio value of a raised thread.
    pub fn raised_ioprio(&self) -> u16 {
        IOPRIO_CLASS_RT << IOPRIO_CLASS_SHIFT | self.ioprio_level as u16
    }
}

/// Which cgroup hierarchy the `weight` lever uses here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightHierarchy {
    /// cgroup v1 `blkio`: threads move into a group of the daemon's.
    V1,
    /// cgroup v2 with the `io` controller: the VM's own group is weighted.
    V2,
}

/// Finds where the `weight` lever can act, or says why it cannot.
pub fn weight_hierarchy(cg: &CgroupFs) -> Result<WeightHierarchy, String> {
    if cg.has_hierarchy(BLKIO) {
        if bfq_v1_files(cg) {
            return Ok(WeightHierarchy::V1);
        }
        return Err(format!(
            "the blkio hierarchy at {} has no BFQ weights ({V1_WEIGHT}): the kernel has no BFQ with cgroup support",
            cg.dir(BLKIO, "/").display()
        ));
    }
    if cg.v2_controllers().iter().any(|c| c == "io") {
        return Ok(WeightHierarchy::V2);
    }
    Err(format!(
        "no cgroup v1 blkio hierarchy at {} and no io controller in the cgroup v2 hierarchy at {}",
        cg.dir(BLKIO, "/").display(),
        cg.root().display()
    ))
}

/// Whether BFQ's files are in the v1 hierarchy: the root group has no `blkio.bfq.weight` (a
/// child has), but BFQ's statistics files (`blkio.bfq.*`) are there.
fn bfq_v1_files(cg: &CgroupFs) -> bool {
    std::fs::read_dir(cg.dir(BLKIO, "/"))
        .map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with("blkio.bfq.")))
        .unwrap_or(false)
}

/// Whether a thread issues the VM's I/O.
fn issues_io(role: ThreadRole, vcpus_known: bool) -> bool {
    match role {
        ThreadRole::Main | ThreadRole::Io | ThreadRole::Worker => true,
        ThreadRole::Other => !vcpus_known, // no thread names: cannot tell, raise all
        ThreadRole::Vcpu => false,
    }
}

/// One setting an actuator changes, per thread (the I/O levers here, the memory-bandwidth
/// throttle in `throttle.rs`).
pub(super) trait Knob: Debug {
    type V: Clone + PartialEq + Debug;
    /// The layer its changes are recorded under.
    fn layer(&self) -> &'static str {
        IO_LAYER
    }
    fn applies_to(&self, process: TaskId, t: &ThreadInfo, vcpus_known: bool) -> bool;
    fn get(&self, env: &mut Host, tid: i32) -> io::Result<Self::V>;
    fn set(&self, env: &mut Host, tid: i32, v: &Self::V) -> io::Result<()>;
    /// The raised value for a thread that has `original`; `None`: leave it.
    fn target(&self, process: TaskId, original: &Self::V) -> Option<Self::V>;
    fn setting(&self, original: &Self::V, applied: &[Self::V]) -> Setting;
    fn parse_setting(&self, s: &Setting) -> Option<(Self::V, Vec<Self::V>)>;
    fn show(&self, v: &Self::V) -> (&'static str, String);
    /// A thread first seen while the VM is raised has `current`, perhaps inherited from the
    /// raised thread that created it: its original is what that creator had before the raise.
    /// `main` is the main thread's original, when known.
    fn born_into(&self, current: &Self::V, _main: Option<&Self::V>) -> Self::V {
        current.clone()
    }
    /// Whether setting `v` made something of the daemon's that outlives the threads that had
    /// it (a group of its own), which the restore must still remove once they are gone.
    fn creates(&self, _v: &Self::V) -> bool {
        false
    }
    /// Whether the change to `applied` is in force: most are once set; a freeze is only once
    /// the kernel has frozen every thread (a v1 group reads `FREEZING` until then, a v2 group's
    /// `cgroup.events` says `frozen 0`). One read, never a wait.
    fn in_force(&self, _env: &mut Host, _applied: &Self::V) -> io::Result<bool> {
        Ok(true)
    }
}

#[derive(Debug)]
struct IoprioKnob(u16);

impl Knob for IoprioKnob {
    type V = u16;
    fn applies_to(&self, _: TaskId, t: &ThreadInfo, vcpus_known: bool) -> bool {
        issues_io(t.role, vcpus_known)
    }
    fn get(&self, env: &mut Host, tid: i32) -> io::Result<u16> {
        env.sched.get_ioprio(tid)
    }
    fn set(&self, env: &mut Host, tid: i32, v: &u16) -> io::Result<()> {
        env.sched.set_ioprio(tid, *v)
    }
    fn target(&self, _: TaskId, original: &u16) -> Option<u16> {
        // Never lower a thread the operator put in the real-time class.
        (original >> IOPRIO_CLASS_SHIFT != IOPRIO_CLASS_RT).then_some(self.0)
    }
    fn setting(&self, original: &u16, applied: &[u16]) -> Setting {
        Setting::Ioprio { original: *original, applied: applied.to_vec() }
    }
    fn parse_setting(&self, s: &Setting) -> Option<(u16, Vec<u16>)> {
        match s {
            Setting::Ioprio { original, applied } => Some((*original, applied.clone())),
            _ => None,
        }
    }
    fn show(&self, v: &u16) -> (&'static str, String) {
        ("ioprio", format!("{v:#x}"))
    }
    /// A thread created by a raised thread inherits its I/O priority (`copy_io`): ours. Its
    /// creator is not known; QEMU creates workers from its main loop or iothreads, which had
    /// the main thread's priority unless someone set them apart, so that is its original.
    fn born_into(&self, current: &u16, main: Option<&u16>) -> u16 {
        if *current == self.0 {
            main.copied().unwrap_or(0)
        } else {
            *current
        }
    }
}

/// cgroup v1: the thread's group in `hierarchy`. Raised, a thread moves into
/// `<its group>/<prefix><pid>`, a group of the daemon's made at the first move with `file` set to
/// `value`: the I/O lever's weighted `blkio` group, the memory-bandwidth throttle's frozen
/// `freezer` group (`throttle.rs`).
#[derive(Debug)]
pub(super) struct V1GroupKnob {
    pub hierarchy: &'static str,
    pub prefix: &'static str,
    pub layer: &'static str,
    /// The control file written when the group is made, and its value.
    pub file: &'static str,
    pub value: String,
    /// Which threads move.
    pub members: fn(&ThreadInfo, bool) -> bool,
    /// Groups do not nest (resctrl's control groups): the group is `/<prefix><pid>`, and only
    /// threads in the default group `/` move (one in another's group is left to its owner).
    pub flat: bool,
    /// `file` reads back `value` only once the change is in force on every thread in the group
    /// (the v1 freezer: `FREEZING` until each is frozen); otherwise it is in force once set.
    pub settles: bool,
}

impl V1GroupKnob {
    /// The I/O lever's: I/O threads into a group weighted `weight`.
    fn io(weight: u32) -> V1GroupKnob {
        V1GroupKnob {
            hierarchy: BLKIO,
            prefix: IO_GROUP_PREFIX,
            layer: IO_LAYER,
            file: V1_WEIGHT,
            value: weight_text(BLKIO, weight),
            members: |t, vcpus_known| issues_io(t.role, vcpus_known),
            flat: false,
            settles: false,
        }
    }

    /// `<group>/<prefix><pid>`: the group of the daemon's for threads of `process` that were in
    /// `group`.
    fn own_group(&self, process: TaskId, group: &str) -> String {
        let parent = if self.flat { "" } else { group.trim_end_matches('/') };
        format!("{parent}/{}{}", self.prefix, process.id)
    }

    fn is_own(&self, group: &str) -> bool {
        group.rsplit('/').next().is_some_and(|leaf| leaf.starts_with(self.prefix))
    }
}

impl Knob for V1GroupKnob {
    type V = String;
    fn layer(&self) -> &'static str {
        self.layer
    }
    fn applies_to(&self, _: TaskId, t: &ThreadInfo, vcpus_known: bool) -> bool {
        (self.members)(t, vcpus_known)
    }
    fn get(&self, env: &mut Host, tid: i32) -> io::Result<String> {
        env.sched.get_cgroup(tid, self.hierarchy)
    }
    fn set(&self, env: &mut Host, tid: i32, group: &String) -> io::Result<()> {
        if self.is_own(group) {
            let cg = env.sched.cgroups().clone();
            if !cg.dir(self.hierarchy, group).is_dir() {
                cg.make_group(self.hierarchy, group).map_err(|e| match e.raw_os_error() {
                    Some(libc::ENOSPC) if self.hierarchy == crate::cgroup::RESCTRL => io::Error::new(
                        e.kind(),
                        format!("making resctrl group {group}: every CLOSID is taken (info/MB/num_closids): {e}"),
                    ),
                    _ => e,
                })?;
                if let Err(e) = cg.write(self.hierarchy, group, self.file, &self.value) {
                    let _ = cg.remove_group(self.hierarchy, group);
                    return Err(io::Error::new(e.kind(), format!("writing {} of {group}: {e}", self.file)));
                }
            }
        }
        env.sched.set_cgroup(tid, self.hierarchy, group)
    }
    fn target(&self, process: TaskId, original: &String) -> Option<String> {
        let movable = if self.flat { original == "/" } else { !self.is_own(original) };
        movable.then(|| self.own_group(process, original))
    }
    fn setting(&self, original: &String, applied: &[String]) -> Setting {
        Setting::Cgroup { hierarchy: self.hierarchy.into(), original: original.clone(), applied: applied.to_vec() }
    }
    fn parse_setting(&self, s: &Setting) -> Option<(String, Vec<String>)> {
        match s {
            Setting::Cgroup { hierarchy, original, applied } if hierarchy == self.hierarchy => {
                Some((original.clone(), applied.clone()))
            }
            _ => None,
        }
    }
    fn show(&self, v: &String) -> (&'static str, String) {
        (self.hierarchy, v.clone())
    }
    fn creates(&self, group: &String) -> bool {
        self.is_own(group)
    }
    fn in_force(&self, env: &mut Host, group: &String) -> io::Result<bool> {
        if !self.settles || !self.is_own(group) {
            return Ok(true);
        }
        Ok(env.sched.cgroups().read(self.hierarchy, group, self.file)? == self.value)
    }
    /// A thread created by a thread in our group is born in it: it belongs where the group is.
    fn born_into(&self, current: &String, _: Option<&String>) -> String {
        if self.is_own(current) {
            let parent = current.rsplit_once('/').map_or("", |(p, _)| p);
            if parent.is_empty() {
                "/".to_string()
            } else {
                parent.to_string()
            }
        } else {
            current.clone()
        }
    }
}

/// The cgroup v2 group of the VM whose main thread is `tid`, if no other process is in it (a
/// lever that acts on `why` needs a group of the VM's own).
pub(super) fn own_v2_group(env: &mut Host, tid: i32, why: &str) -> io::Result<String> {
    let group = env.sched.get_cgroup(tid, "")?;
    let procs = env.sched.cgroups().read("", &group, "cgroup.procs")?;
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

/// The record of a number in `file` of a whole v2 group, (group, value): the v2 weight lever's
/// `io.bfq.weight`, the v2 throttle's `cgroup.freeze`.
pub(super) fn v2_group_setting(file: &str, original: &(String, u32), applied: &[(String, u32)]) -> Setting {
    Setting::GroupWeight {
        hierarchy: String::new(),
        group: original.0.clone(),
        file: file.into(),
        original: original.1,
        applied: applied.iter().map(|a| a.1).collect(),
    }
}

/// A v2 group's value: (group, number).
pub(super) type GroupValue = (String, u32);

/// The original and applied values of a [`v2_group_setting`] of `file`.
pub(super) fn parse_v2_group_setting(file: &str, s: &Setting) -> Option<(GroupValue, Vec<GroupValue>)> {
    match s {
        Setting::GroupWeight { hierarchy, group, file: f, original, applied } if hierarchy.is_empty() && f == file => {
            Some(((group.clone(), *original), applied.iter().map(|w| (group.clone(), *w)).collect()))
        }
        _ => None,
    }
}

/// cgroup v2: the default `io.bfq.weight` of the VM's own group, kept on its main thread.
#[derive(Debug)]
struct V2WeightKnob {
    weight: u32,
}

impl Knob for V2WeightKnob {
    /// (group, default weight)
    type V = (String, u32);
    fn applies_to(&self, process: TaskId, t: &ThreadInfo, _: bool) -> bool {
        t.task == process
    }
    fn get(&self, env: &mut Host, tid: i32) -> io::Result<(String, u32)> {
        let group = own_v2_group(env, tid, "the weight lever in cgroup v2 weights a whole group")?;
        let text = env.sched.cgroups().read("", &group, V2_WEIGHT)?;
        let weight = crate::cgroup::parse_weight(&text)
            .ok_or_else(|| io::Error::other(format!("{V2_WEIGHT} of {group}: no default weight in {text:?}")))?;
        Ok((group, weight))
    }
    fn set(&self, env: &mut Host, _: i32, v: &(String, u32)) -> io::Result<()> {
        env.sched.cgroups().write("", &v.0, V2_WEIGHT, &weight_text("", v.1))
    }
    fn target(&self, _: TaskId, original: &(String, u32)) -> Option<(String, u32)> {
        (original.1 < self.weight).then(|| (original.0.clone(), self.weight))
    }
    fn setting(&self, original: &(String, u32), applied: &[(String, u32)]) -> Setting {
        v2_group_setting(V2_WEIGHT, original, applied)
    }
    fn parse_setting(&self, s: &Setting) -> Option<((String, u32), Vec<(String, u32)>)> {
        parse_v2_group_setting(V2_WEIGHT, s)
    }
    fn show(&self, v: &(String, u32)) -> (&'static str, String) {
        ("io_weight", format!("{} {}", v.0, v.1))
    }
}

#[derive(Debug, Clone)]
struct Tracked<V> {
    task: TaskId,
    original: V,
    /// What we set and the thread still has, as far as we know.
    applied: Option<V>,
    want: Option<V>,
    /// Every value we may set (persisted before any is set).
    may_apply: Vec<V>,
}

/// One knob over the VM's threads it applies to: follows the list, raises, records, shows.
#[derive(Debug)]
pub(super) struct PerThread<K: Knob> {
    knob: K,
    threads: BTreeMap<i32, Tracked<K::V>>,
    /// For each value of the daemon's making ([`Knob::creates`]: a group of its own) whose
    /// threads have all gone, a gone thread's entry that names it: kept in the record, so that
    /// the restore (at the VM's end, the daemon's stop or after a crash) still removes the
    /// group. One per value, so bounded whatever the VM's threads do.
    retired: Vec<(K::V, Entry)>,
    generation: Option<u64>,
    vcpus_known: bool,
    verified_at: Option<Instant>,
}

impl<K: Knob> PerThread<K> {
    pub(super) fn new(knob: K) -> Self {
        PerThread {
            knob,
            threads: BTreeMap::new(),
            retired: Vec::new(),
            generation: None,
            vcpus_known: false,
            verified_at: None,
        }
    }

    /// A tracked thread is dropped (gone, or no longer the knob's): what it may have had of
    /// the daemon's making stays in the record ([`PerThread::retired`]).
    fn retire(knob: &K, retired: &mut Vec<(K::V, Entry)>, t: &Tracked<K::V>) {
        for v in t.may_apply.iter().filter(|v| knob.creates(v)) {
            if !retired.iter().any(|(r, _)| r == v) {
                let e = Entry {
                    task: t.task,
                    layer: knob.layer().into(),
                    setting: knob.setting(&t.original, std::slice::from_ref(v)),
                };
                retired.push((v.clone(), e));
            }
        }
    }

    /// Tracks the I/O threads the list gained (their present value is their original), drops
    /// those it lost. Errors reading a thread's value (other than its exit) are reported.
    fn follow(&mut self, env: &mut Host, threads: &Threads, raised: bool, out: &mut Outcome) -> bool {
        if self.generation == Some(threads.generation()) {
            return false;
        }
        self.generation = Some(threads.generation());
        self.vcpus_known = threads.vcpus_known();
        let before = self.threads.len();
        let process = threads.process;
        let (knob, vcpus_known, retired) = (&self.knob, self.vcpus_known, &mut self.retired);
        self.threads.retain(|tid, t| {
            let keep = threads.get(*tid).is_some_and(|i| i.task == t.task && knob.applies_to(process, i, vcpus_known));
            if !keep {
                Self::retire(knob, retired, t);
            }
            keep
        });
        let mut changed = self.threads.len() != before;
        for info in threads.iter() {
            if self.threads.contains_key(&info.task.id) || !self.knob.applies_to(process, info, self.vcpus_known) {
                continue;
            }
            match self.knob.get(env, info.task.id) {
                Ok(current) => {
                    let main = self.threads.get(&process.id).map(|m| m.original.clone());
                    let original = if raised { self.knob.born_into(&current, main.as_ref()) } else { current.clone() };
                    // Born with our value: it is ours to put back, and recorded as such.
                    let ours = original != current;
                    let t = Tracked {
                        task: info.task,
                        original,
                        applied: ours.then(|| current.clone()),
                        want: None,
                        may_apply: if ours { vec![current] } else { Vec::new() },
                    };
                    self.threads.insert(info.task.id, t);
                    changed = true;
                }
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {} // exited meanwhile
                Err(e) => {
                    // Try again (and say so again) at the next change.
                    out.errors.push(format!("thread {}: {e}", info.task.id));
                    self.generation = None;
                }
            }
        }
        changed
    }

    /// Takes in what someone else changed since we last looked (see the CPU actuator).
    fn verify(&mut self, env: &mut Host, out: &mut Outcome) -> bool {
        let mut changed = false;
        for (tid, t) in self.threads.iter_mut() {
            let Ok(cur) = self.knob.get(env, *tid) else { continue };
            match &t.applied {
                None if cur != t.original => {
                    t.original = cur;
                    changed = true;
                }
                Some(applied) if cur != *applied => {
                    out.foreign += 1;
                    t.original = cur;
                    t.applied = None;
                    changed = true;
                }
                _ => {}
            }
        }
        self.verified_at = Some(Instant::now());
        changed
    }

    pub(super) fn resume(&mut self, env: &mut Host, threads: &Threads, entries: &[Entry]) {
        let mut out = Outcome::default();
        self.follow(env, threads, false, &mut out);
        for e in entries {
            let Some((original, applied)) = self.knob.parse_setting(&e.setting) else { continue };
            let Some(t) = self.threads.get_mut(&e.task.id).filter(|t| t.task == e.task) else { continue };
            let current = t.original.clone();
            let layers = [(self.knob.layer(), &original, applied.as_slice())];
            if store::undo_value(&layers, &current, |a, b| a == b).is_some() {
                t.applied = Some(current); // still ours: the next deboost puts it back
            }
            t.original = original;
            t.may_apply = applied;
        }
    }

    pub(super) fn prepare(&mut self, env: &mut Host, threads: &Threads, raise: bool, out: &mut Outcome) -> Prepared {
        let mut p = Prepared { changed: self.follow(env, threads, raise, out), sets: false };
        if self.verified_at.is_none_or(|t| t.elapsed() >= env.verify) {
            p.changed |= self.verify(env, out);
        }
        let process = threads.process;
        for t in self.threads.values_mut() {
            t.want = if raise { self.knob.target(process, &t.original) } else { None };
            if let Some(v) = &t.want {
                p.sets = true;
                if !t.may_apply.contains(v) {
                    t.may_apply.push(v.clone());
                    p.changed = true;
                }
            }
        }
        p
    }

    pub(super) fn apply(&mut self, env: &mut Host, out: &mut Outcome, gone: &mut Vec<i32>) {
        let mut lost = Vec::new();
        for (tid, t) in self.threads.iter_mut() {
            if t.want == t.applied {
                continue;
            }
            let v = t.want.clone().unwrap_or_else(|| t.original.clone());
            let started = Instant::now();
            let result = self.knob.set(env, *tid, &v);
            env.syscall_ns += started.elapsed().as_nanos() as u64;
            match result {
                Ok(()) => {
                    out.changed += 1;
                    t.applied = t.want.clone();
                }
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => lost.push(*tid),
                Err(e) => {
                    let (what, value) = self.knob.show(&v);
                    out.errors.push(format!("setting {what} {value} on thread {tid}: {e}"));
                }
            }
        }
        for tid in &lost {
            if let Some(t) = self.threads.remove(tid) {
                Self::retire(&self.knob, &mut self.retired, &t);
            }
        }
        gone.extend(lost);
    }

    pub(super) fn entries(&self, out: &mut Vec<Entry>) {
        out.extend(self.threads.values().filter(|t| !t.may_apply.is_empty()).map(|t| Entry {
            task: t.task,
            layer: self.knob.layer().into(),
            setting: self.knob.setting(&t.original, &t.may_apply),
        }));
        out.extend(self.retired.iter().map(|(_, e)| e.clone()));
    }

    pub(super) fn restored(&mut self) {
        self.retired.clear();
        for t in self.threads.values_mut() {
            t.applied = None;
            t.want = None;
            t.may_apply.clear();
        }
    }

    /// Whether what this knob applied is in force (see [`Knob::in_force`]), each distinct
    /// value read once; `None` when nothing is applied. A value that cannot be read is not.
    pub(super) fn in_force(&self, env: &mut Host) -> Option<bool> {
        let mut seen: Vec<&K::V> = Vec::new();
        for v in self.threads.values().filter_map(|t| t.applied.as_ref()) {
            if !seen.contains(&v) {
                seen.push(v);
            }
        }
        if seen.is_empty() {
            return None;
        }
        Some(seen.into_iter().all(|v| self.knob.in_force(env, v).unwrap_or(false)))
    }

    pub(super) fn show(&self, tid: i32) -> Option<(&'static str, String, bool)> {
        let t = self.threads.get(&tid)?;
        let (what, value) = self.knob.show(t.applied.as_ref().unwrap_or(&t.original));
        Some((what, value, t.applied.is_some()))
    }
}

/// The lever in use, over the VM's threads.
#[derive(Debug)]
enum Lever {
    Ioprio(PerThread<IoprioKnob>),
    V1(PerThread<V1GroupKnob>),
    V2(PerThread<V2WeightKnob>),
    V2Freeze(PerThread<super::throttle::V2FreezeKnob>),
}

macro_rules! each {
    ($self:expr, $p:ident => $e:expr) => {
        match $self {
            Lever::Ioprio($p) => $e,
            Lever::V1($p) => $e,
            Lever::V2($p) => $e,
            Lever::V2Freeze($p) => $e,
        }
    };
}

/// One per-thread knob's actuator: the I/O boost ([`KnobActuator::io`]) or the memory-bandwidth
/// throttle ([`KnobActuator::throttle`]). Any level but `Normal` applies the knob.
#[derive(Debug)]
pub struct KnobActuator {
    resource: Resource,
    lever: Lever,
    level: Level,
    priority: u8,
}

impl KnobActuator {
    /// The I/O actuator for `boost`'s lever; the `weight` lever on the hierarchy found (see
    /// [`weight_hierarchy`]).
    pub fn io(boost: &IoBoost, hierarchy: Option<WeightHierarchy>) -> KnobActuator {
        let lever = match (boost.lever, hierarchy) {
            (IoLever::Ioprio, _) => Lever::Ioprio(PerThread::new(IoprioKnob(boost.raised_ioprio()))),
            (IoLever::Weight, Some(WeightHierarchy::V2)) => {
                Lever::V2(PerThread::new(V2WeightKnob { weight: boost.weight }))
            }
            (IoLever::Weight, _) => Lever::V1(PerThread::new(V1GroupKnob::io(boost.weight))),
        };
        KnobActuator { resource: Resource::Io, lever, level: Level::Normal, priority: 0 }
    }

    /// The memory-bandwidth throttle on the lever found (see [`super::throttle::freezer`] and
    /// [`crate::membw::Mba`]): the vCPUs stopped or slowed at [`Level::Throttled`].
    pub fn throttle(lever: &super::throttle::ThrottleLever) -> KnobActuator {
        use super::throttle::{FreezerKind, ThrottleLever};
        let lever = match lever {
            ThrottleLever::Freezer(FreezerKind::V1) => Lever::V1(PerThread::new(super::throttle::v1_knob())),
            ThrottleLever::Freezer(FreezerKind::V2) => Lever::V2Freeze(PerThread::new(super::throttle::V2FreezeKnob)),
            ThrottleLever::Mba { schemata, .. } => Lever::V1(PerThread::new(super::throttle::mba_knob(schemata))),
        };
        KnobActuator { resource: Resource::Membw, lever, level: Level::Normal, priority: 0 }
    }
}

impl Actuator for KnobActuator {
    fn resource(&self) -> Resource {
        self.resource
    }

    fn level(&self) -> Level {
        self.level
    }

    fn priority(&self) -> u8 {
        self.priority
    }

    fn resume(&mut self, env: &mut Host, threads: &Threads, entries: &[Entry]) {
        each!(&mut self.lever, p => p.resume(env, threads, entries))
    }

    fn prepare(
        &mut self,
        env: &mut Host,
        threads: &Threads,
        level: Level,
        priority: u8,
        out: &mut Outcome,
    ) -> Prepared {
        self.level = level;
        self.priority = priority;
        each!(&mut self.lever, p => p.prepare(env, threads, level.is_changed(), out))
    }

    fn apply(&mut self, env: &mut Host, out: &mut Outcome, gone: &mut Vec<i32>) {
        each!(&mut self.lever, p => p.apply(env, out, gone))
    }

    fn entries(&self, out: &mut Vec<Entry>) {
        each!(&self.lever, p => p.entries(out))
    }

    fn restored(&mut self) {
        self.level = Level::Normal;
        each!(&mut self.lever, p => p.restored())
    }

    fn show(&self, tid: i32) -> Option<(&'static str, String, bool)> {
        each!(&self.lever, p => p.show(tid))
    }

    fn in_force(&self, env: &mut Host) -> Option<bool> {
        if self.level == Level::Normal {
            return None;
        }
        each!(&self.lever, p => p.in_force(env))
    }
}
