//! Actuators: what changes a VM's threads for one resource, and puts them back.
//!
//! A VM's threads are discovered once ([`Threads`]: its task directory, the threads' names and
//! roles, kept current by thread events or by listing again) and shared by every actuator. An
//! [`Actuator`] acts for one resource: it follows the thread list, brings the threads to a
//! [`Level`] and names every value it may set. [`VmThreads`] persists that, one versioned
//! record per VM holding each actuator's layer, before the first change, and undoes through the
//! one restore logic of [`crate::store`], the same that runs after a crash. Adding a resource is
//! adding an actuator: the daemon's loop hands it the coordinator's `Apply` actions unchanged.
//!
//! Built as tuned builds its plugins: a kind of setting is a get/set pair written once
//! ([`crate::settings::Kind`]: scheduling attributes, I/O priority, affinity, cgroup membership,
//! a group file's value), and one state machine keeps, per thread, the original, what we
//! applied, what we want and every value we may set ([`ledger::Ledger`]: follow the thread list,
//! verify, prepare, apply, record). The restore reads a record back through the same kinds.
//! Files by resource:
//! - `cpu.rs`: the CPU and event sched layers ([`CpuActuator`], classes from `class.rs`);
//! - `io.rs`: the I/O boost's levers (`ioprio`, `weight` in v1 and v2);
//! - `membw.rs`: the memory-bandwidth throttle's levers (v1/v2 freezer, resctrl MBA);
//! - `statics.rs`: the operator's static FIFO and shield (three settings per thread);
//! - `lever.rs`: the actuator of one setting per thread that `io.rs` and `membw.rs` configure;
//! - `ledger.rs`: the per-thread slots every one of them keeps.
//!
//! Invariants:
//! - what a thread had before our first change to it is on disk ([`StateDir`]) before the change;
//! - only threads listed under `/proc/<qemu pid>/task/` are touched, and the list is re-read
//!   before a change whenever it is older than [`Host::fresh`] (unless thread events keep it
//!   current): a thread id seen there that recently cannot name another process's thread, since
//!   the kernel hands out ids cyclically and would have to go through all `pid_max` of them first;
//! - going back to [`Level::Normal`] restores a thread only if it still has what we set; if
//!   someone else changed it meanwhile, their change stays.

pub mod class;
pub mod cpu;
pub mod io;
pub mod ledger;
pub mod lever;
pub mod membw;
pub mod statics;

use std::collections::BTreeMap;
use std::io as stdio;
use std::time::{Duration, Instant};

use cosched_core::{Grant, Level};
use cosched_procfs::{ProcFs, TaskId, ThreadInfo, ThreadRole};
use cosched_proto::Resource;
use serde::Serialize;

pub use class::{BoostClass, BoostPolicy, DeadlineLimits, DL_MIN_RUNTIME_NS};
pub use cpu::{CpuActuator, EVENT_REPAY_NICE};
pub use io::{weight_hierarchy, IoBoost, IoLever, WeightHierarchy, WeightUnsupported, IO_LAYER};
/// The daemon's name for the actuator of one lever (the I/O boost, the throttle).
pub use lever::LeverActuator as KnobActuator;
pub use lever::LeverActuator;
pub use membw::{freezer, FreezerKind, FreezerUnsupported, ThrottleLever};
pub use statics::{ShieldPlan, StaticActuator, StaticPlan};

pub use crate::sched::{RealSched, SchedOps};
use crate::sched::{SchedAttr, ThreadOps};
use crate::store::{Entry, RestoreReport, StateDir, VmRecord, STATIC_LAYER};

/// What every actuator uses from the outside world.
pub struct Host {
    pub procfs: ProcFs,
    pub sched: Box<dyn ThreadOps>,
    pub store: StateDir,
    /// How long a listing of a VM's threads is trusted before a change needs a new one.
    pub fresh: Duration,
    /// How long the threads' settings as an actuator knows them are trusted before a change
    /// reads them again (someone else may have changed them).
    pub verify: Duration,
    /// Time spent in the system calls that make changes on behalf of transitions (the cost
    /// breakdown).
    pub syscall_ns: u64,
}

/// What one call changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub changed: u32,
    /// Threads found gone while applying.
    pub gone: u32,
    /// Threads left alone because someone else changed them after us.
    pub foreign: u32,
    pub errors: Vec<String>,
}

/// A thread as shown by `cosched status`: each actuator's setting on it (`sched`, ...) and
/// the resources whose boost it now carries.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadView {
    pub tid: i32,
    pub comm: String,
    pub role: ThreadRole,
    #[serde(flatten)]
    pub settings: BTreeMap<&'static str, String>,
    pub changed_by: Vec<&'static str>,
}

/// The threads of one QEMU process: the one discovery every actuator of the VM shares.
#[derive(Debug)]
pub struct Threads {
    pub process: TaskId,
    list: BTreeMap<i32, ThreadInfo>,
    /// Goes up whenever a thread comes, goes or changes role: actuators follow the list only
    /// when it moved.
    generation: u64,
    /// vCPUs from QEMU's command line, for when its threads have no names.
    smp: u32,
    /// When the task directory was last listed (membership of every thread verified).
    listed_at: Option<Instant>,
    /// Threads whose scheduling attributes one of our sched layers (CPU, event) holds now:
    /// the other layer must not take that value for a change by someone else.
    sched_held: BTreeMap<i32, Resource>,
}

impl Threads {
    pub fn new(process: TaskId, procfs: &ProcFs) -> Result<Threads, cosched_procfs::Error> {
        let mut t = Threads {
            process,
            list: BTreeMap::new(),
            generation: 0,
            smp: procfs.cmdline(process.id).map(|a| cosched_procfs::qemu_smp(&a)).unwrap_or(1),
            listed_at: None,
            sched_held: BTreeMap::new(),
        };
        t.rescan(procfs)?;
        Ok(t)
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The resource whose sched layer holds thread `tid`'s scheduling attributes now, if any.
    pub fn sched_held_by(&self, tid: i32) -> Option<Resource> {
        self.sched_held.get(&tid).copied()
    }

    pub fn get(&self, tid: i32) -> Option<&ThreadInfo> {
        self.list.get(&tid)
    }

    pub fn iter(&self) -> impl Iterator<Item = &ThreadInfo> {
        self.list.values()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// vCPU threads (named `CPU n/...`), or QEMU's `-smp` when no thread carries such a name.
    pub fn vcpu_count(&self) -> u32 {
        match self.list.values().filter(|t| t.role == ThreadRole::Vcpu).count() {
            0 => self.smp,
            n => n as u32,
        }
    }

    /// Whether QEMU names its threads (`debug-threads=on`): without, every thread but the
    /// main one counts as a vCPU.
    pub fn vcpus_known(&self) -> bool {
        self.list.values().any(|t| t.role == ThreadRole::Vcpu)
    }

    fn stale(&self, fresh: Duration) -> bool {
        self.listed_at.is_none_or(|t| t.elapsed() >= fresh)
    }

    /// Re-reads the whole list: names and roles, exits, newcomers. Returns how many threads
    /// were gone.
    fn rescan(&mut self, procfs: &ProcFs) -> Result<u32, cosched_procfs::Error> {
        let live = procfs.threads(self.process.id)?;
        self.listed_at = Some(Instant::now());
        let before = self.list.len();
        let live: BTreeMap<i32, ThreadInfo> = live.into_iter().map(|t| (t.task.id, t)).collect();
        self.list.retain(|tid, t| live.get(tid).is_some_and(|l| l.task == t.task));
        let gone = before - self.list.len();
        let mut moved = gone > 0;
        for (tid, info) in live {
            match self.list.get_mut(&tid) {
                // QEMU names a thread from inside it, after creation: the role may change.
                Some(t) => {
                    moved |= t.role != info.role;
                    *t = info;
                }
                None => {
                    moved = true;
                    self.list.insert(tid, info);
                }
            }
        }
        if moved {
            self.generation += 1;
        }
        Ok(gone as u32)
    }

    /// Lists the task directory without re-reading the known threads: drops threads that
    /// exited and reads newcomers (one `readdir` plus a `stat` per newcomer).
    /// Returns how many threads were gone.
    fn list(&mut self, procfs: &ProcFs) -> Result<u32, cosched_procfs::Error> {
        let ids: std::collections::BTreeSet<i32> = procfs.thread_ids(self.process.id)?.into_iter().collect();
        self.listed_at = Some(Instant::now());
        let before = self.list.len();
        self.list.retain(|tid, _| ids.contains(tid));
        let gone = before - self.list.len();
        let mut moved = gone > 0;
        for tid in ids {
            if self.list.contains_key(&tid) {
                continue;
            }
            if let Ok(info) = procfs.thread(self.process.id, tid) {
                self.list.insert(tid, info);
                moved = true;
            }
        }
        if moved {
            self.generation += 1;
        }
        Ok(gone as u32)
    }

    /// A thread of this process was created, renamed or exited (seen by the host BPF).
    /// Returns whether the list moved.
    #[cfg(feature = "bpf")]
    fn event(&mut self, procfs: &ProcFs, ev: &cosched_hostbpf::ThreadEvent) -> bool {
        use cosched_hostbpf::ThreadEvent;
        let moved = match ev {
            ThreadEvent::Exited { tid, .. } => self.list.remove(tid).is_some(),
            ThreadEvent::Created { tid, .. } | ThreadEvent::Renamed { tid, .. } => {
                // Read from /proc: a thread id the VM's task directory does not list is not ours.
                let Ok(mut info) = procfs.thread(self.process.id, *tid) else { return false };
                // The name is the event's: task_rename fires before the kernel copies the new
                // name into the task, so /proc may still show the old one (seen: a `worker`
                // read back under its creator's name, and never raised).
                if let ThreadEvent::Renamed { comm, .. } = ev {
                    info.comm.clone_from(comm);
                    info.role = ThreadRole::classify(self.process.id, *tid, comm);
                }
                match self.list.get_mut(tid) {
                    Some(t) if t.task == info.task => {
                        let moved = t.role != info.role;
                        *t = info;
                        moved
                    }
                    _ => {
                        self.list.insert(*tid, info);
                        true
                    }
                }
            }
        };
        if moved {
            self.generation += 1;
        }
        moved
    }

    /// A change found these threads gone.
    fn forget(&mut self, gone: &[i32]) {
        let before = self.list.len();
        for tid in gone {
            self.list.remove(tid);
        }
        if self.list.len() != before {
            self.generation += 1;
        }
    }

    fn clear(&mut self) {
        if !self.list.is_empty() {
            self.list.clear();
            self.generation += 1;
        }
    }
}

/// What [`Actuator::prepare`] found.
#[derive(Debug, Default, Clone, Copy)]
pub struct Prepared {
    /// Its entries changed (a new value it may set, an original that moved): the VM's record
    /// is saved again before a change.
    pub changed: bool,
    /// It will set something other than the originals.
    pub sets: bool,
}

/// Changes the threads of one VM for one resource, and can put them back.
///
/// Undoing goes through the record ([`Actuator::entries`] and [`crate::store::restore_record`]),
/// so a daemon that stopped and one restarted after `kill -9` undo alike.
pub trait Actuator: std::fmt::Debug {
    fn resource(&self) -> Resource;
    fn level(&self) -> Level;
    /// What the coordinator granted at its level.
    fn grant(&self) -> Grant;
    /// Takes in this actuator's entries of a record a previous daemon left for these threads
    /// (a restore that failed): their originals are the originals, and a thread that still
    /// has a value they say was applied is still changed by us.
    fn resume(&mut self, env: &mut Host, threads: &Threads, entries: &[Entry]);
    /// Follows the thread list, takes `level` and notes every value it is about to set.
    fn prepare(&mut self, env: &mut Host, threads: &Threads, level: Level, grant: Grant, out: &mut Outcome)
        -> Prepared;
    /// Makes the changes [`Actuator::prepare`] decided; pushes the threads it found gone.
    fn apply(&mut self, env: &mut Host, out: &mut Outcome, gone: &mut Vec<i32>);
    /// Its layer of the VM's record: per changed thread, the original and every value it may
    /// apply.
    fn entries(&self, out: &mut Vec<Entry>);
    /// Everything was put back: forget what was applied.
    fn restored(&mut self);
    /// What a thread has of this actuator's setting: (setting, value, set by us).
    fn show(&self, tid: i32) -> Option<(&'static str, String, bool)>;
    /// Whether this actuator sets scheduling attributes (a sched layer: CPU, event).
    fn sched_layer(&self) -> bool {
        false
    }
    /// Whether thread `tid` has the scheduling attributes this actuator set.
    fn holds_sched(&self, _tid: i32) -> bool {
        false
    }
    /// For a thread whose scheduling attributes this actuator set: what it had before.
    fn sched_original(&self, _tid: i32) -> Option<SchedAttr> {
        None
    }
    /// The static layer set thread `tid`'s scheduling attributes to `now` (or put them back to
    /// `now`): what this actuator had applied is gone, and `now` is what the thread has
    /// without it.
    fn rebase_sched(&mut self, _tid: i32, _now: SchedAttr) {}
    /// Whether its change is in force now (a freeze completes asynchronously); `None`: at
    /// its normal level, or nothing applied. One read per group, never a wait.
    fn in_force(&self, _env: &mut Host) -> Option<bool> {
        None
    }
}

/// The threads of one VM and the actuators acting on them.
#[derive(Debug)]
pub struct VmThreads {
    pub name: String,
    pub threads: Threads,
    actuators: Vec<Box<dyn Actuator>>,
    /// The operator's static tunings (the `static` layer), and the plan they follow (`None`:
    /// never set).
    statics: StaticActuator,
    statics_plan: Option<StaticPlan>,
    /// The record on disk holds every actuator's entries as they are.
    persisted: bool,
}

impl VmThreads {
    /// Finds the threads of QEMU process `process` (nothing is changed). If a record of this
    /// process is on disk (a restore that failed earlier), each actuator takes in its layer.
    pub fn new(
        name: &str,
        process: TaskId,
        env: &mut Host,
        mut actuators: Vec<Box<dyn Actuator>>,
    ) -> stdio::Result<VmThreads> {
        let threads = Threads::new(process, &env.procfs).map_err(stdio::Error::other)?;
        let rec = env.store.load(process).map_err(|e| {
            stdio::Error::other(format!(
                "its state record cannot be used ({e}); not coordinating it until that is fixed"
            ))
        })?;
        let entries = rec.map(|r| r.entries).unwrap_or_default();
        for a in actuators.iter_mut() {
            let layer = a.resource().name();
            let mine: Vec<Entry> = entries.iter().filter(|e| e.layer == layer).cloned().collect();
            a.resume(env, &threads, &mine);
        }
        Ok(VmThreads {
            name: name.to_string(),
            threads,
            actuators,
            statics: StaticActuator::new(),
            statics_plan: None,
            persisted: false,
        })
    }

    pub fn process(&self) -> TaskId {
        self.threads.process
    }

    pub fn resources(&self) -> impl Iterator<Item = Resource> + '_ {
        self.actuators.iter().map(|a| a.resource())
    }

    /// The level the actuator of `resource` has put the threads at.
    pub fn level(&self, resource: Resource) -> Level {
        self.actuators.iter().find(|a| a.resource() == resource).map_or(Level::Normal, |a| a.level())
    }

    /// Whether the change of `resource`'s actuator is in force ([`Actuator::in_force`]).
    pub fn in_force(&self, env: &mut Host, resource: Resource) -> Option<bool> {
        self.actuators.iter().find(|a| a.resource() == resource)?.in_force(env)
    }

    /// Whether any actuator holds the VM above normal.
    pub fn raised(&self) -> bool {
        self.actuators.iter().any(|a| a.level() != Level::Normal)
            || self.statics_plan.as_ref().is_some_and(|p| !p.is_empty())
    }

    pub fn vcpu_count(&self) -> u32 {
        self.threads.vcpu_count()
    }

    pub fn threads(&self) -> Vec<ThreadView> {
        self.threads
            .iter()
            .map(|t| {
                let mut v = ThreadView {
                    tid: t.task.id,
                    comm: t.comm.clone(),
                    role: t.role,
                    settings: BTreeMap::new(),
                    changed_by: Vec::new(),
                };
                // Several actuators keep the same setting (the CPU and event layers both keep
                // "sched"): the one that set it shows what the thread has; another shows only
                // the original it read, so it never hides the value in force.
                let mut set_by_us = Vec::new();
                for a in &self.actuators {
                    if let Some((setting, value, ours)) = a.show(t.task.id) {
                        if ours {
                            v.changed_by.push(a.resource().name());
                            set_by_us.push(setting);
                            v.settings.insert(setting, value);
                        } else if !set_by_us.contains(&setting) {
                            v.settings.entry(setting).or_insert(value);
                        }
                    }
                }
                if let Some(s) = self.statics.show(t.task.id) {
                    v.settings.insert(STATIC_LAYER, s);
                    v.changed_by.push(STATIC_LAYER);
                }
                v
            })
            .collect()
    }

    fn record(&self) -> VmRecord {
        let mut entries = Vec::new();
        for a in &self.actuators {
            a.entries(&mut entries);
        }
        self.statics.entries(&mut entries);
        VmRecord::new(&self.name, self.threads.process, entries)
    }

    /// Lists the threads again if the last listing is older than [`Host::fresh`]. False when
    /// the list could not be checked: then nothing may be changed.
    fn check_membership(&mut self, env: &mut Host, rescan: bool, out: &mut Outcome) -> bool {
        let found = if rescan {
            self.threads.rescan(&env.procfs)
        } else if self.threads.stale(env.fresh) {
            self.threads.list(&env.procfs)
        } else {
            Ok(0)
        };
        match found {
            Ok(gone) => out.gone += gone,
            Err(e) if e.is_gone() => {
                out.gone += self.threads.len() as u32; // the process exited: nothing to change
                self.threads.clear();
            }
            Err(e) => {
                // Never touch threads whose membership we could not check.
                out.errors.push(format!("{}: reading threads: {e}", self.name));
                return false;
            }
        }
        true
    }

    /// Puts the threads at `level` for `resource`.
    pub fn set_level(&mut self, env: &mut Host, resource: Resource, level: Level, grant: impl Into<Grant>) -> Outcome {
        let grant = grant.into();
        let mut out = Outcome::default();
        let Some(i) = self.actuators.iter().position(|a| a.resource() == resource) else {
            out.errors.push(format!("{}: no {resource} actuator", self.name));
            return out;
        };
        if self.check_membership(env, false, &mut out) {
            self.act(env, i, level, grant, &mut out);
        }
        out
    }

    /// Saves the VM's record before a change (`changed`: an entry moved; `sets`: something is
    /// about to be set). False when that failed: then nothing may be changed, and the level
    /// stays what was asked, so the next refresh tries again.
    fn persist(&mut self, env: &mut Host, changed: bool, sets: bool, out: &mut Outcome) -> bool {
        if changed {
            self.persisted = false;
        }
        if sets && !self.persisted {
            if let Err(e) = env.store.save(&self.record()) {
                out.errors.push(format!(
                    "{}: not changing anything: cannot save original settings in {}: {e}",
                    self.name,
                    env.store.path().display()
                ));
                return false;
            }
            self.persisted = true;
        }
        true
    }

    /// One actuator to `level`: persist what it may set, then set it.
    fn act(&mut self, env: &mut Host, i: usize, level: Level, grant: Grant, out: &mut Outcome) {
        let p = self.actuators[i].prepare(env, &self.threads, level, grant, out);
        if !self.persist(env, p.changed, p.sets, out) {
            return;
        }
        let mut gone = Vec::new();
        self.actuators[i].apply(env, out, &mut gone);
        out.gone += gone.len() as u32;
        self.threads.forget(&gone);
        let a = &self.actuators[i];
        if a.sched_layer() {
            let r = a.resource();
            for t in self.threads.list.keys() {
                if a.holds_sched(*t) {
                    self.threads.sched_held.insert(*t, r);
                } else if self.threads.sched_held.get(t) == Some(&r) {
                    self.threads.sched_held.remove(t);
                }
            }
            let list = &self.threads.list;
            self.threads.sched_held.retain(|t, _| list.contains_key(t));
        }
    }

    /// The operator's static tunings for this VM (an empty plan undoes them). The boosts
    /// under way stay: a thread at the static class is one a boost leaves alone, and one the
    /// static layer lets go of is boosted again.
    pub fn set_static(&mut self, env: &mut Host, plan: &StaticPlan) -> Outcome {
        let mut out = Outcome::default();
        if self.check_membership(env, false, &mut out) {
            self.statics_plan = Some(plan.clone());
            self.act_static(env, &mut out);
            // What the static layer let go of is boosted again where a boost is on.
            for i in 0..self.actuators.len() {
                let (level, grant) = (self.actuators[i].level(), self.actuators[i].grant());
                if level != Level::Normal {
                    self.act(env, i, level, grant, &mut out);
                }
            }
        }
        out
    }

    pub fn static_plan(&self) -> &StaticPlan {
        self.statics.plan()
    }

    /// What the kernel refused of this VM's shield.
    pub fn static_notes(&self) -> &[String] {
        &self.statics.notes
    }

    fn act_static(&mut self, env: &mut Host, out: &mut Outcome) {
        let Some(plan) = self.statics_plan.clone() else { return };
        let actuators = &self.actuators;
        let held = &self.threads.sched_held;
        let base = |tid: i32| {
            held.get(&tid)
                .and_then(|r| actuators.iter().find(|a| a.resource() == *r))
                .and_then(|a| a.sched_original(tid))
        };
        let p = self.statics.prepare(env, &self.threads, &plan, &base, out);
        let undoing = self.statics.active();
        if !self.persist(env, p.changed, p.sets || undoing, out) {
            return;
        }
        let mut gone = Vec::new();
        let changed = self.statics.apply(env, out, &mut gone);
        out.gone += gone.len() as u32;
        self.threads.forget(&gone);
        for (tid, now) in changed {
            for a in self.actuators.iter_mut().filter(|a| a.sched_layer()) {
                a.rebase_sched(tid, now);
            }
            self.threads.sched_held.remove(&tid);
        }
    }

    /// Brings every actuator's threads to its level again (after the list moved), without
    /// listing: what thread events or a refresh found.
    pub fn reapply(&mut self, env: &mut Host) -> Outcome {
        let mut out = Outcome::default();
        self.act_static(env, &mut out);
        for i in 0..self.actuators.len() {
            let (level, grant) = (self.actuators[i].level(), self.actuators[i].grant());
            if level != Level::Normal {
                self.act(env, i, level, grant, &mut out);
            }
        }
        out
    }

    /// Re-reads the thread list (names, roles, exits, newcomers) and brings every thread to
    /// its actuators' levels.
    pub fn refresh(&mut self, env: &mut Host) -> Outcome {
        let mut out = Outcome::default();
        if self.check_membership(env, true, &mut out) {
            self.act_static(env, &mut out);
            for i in 0..self.actuators.len() {
                let (level, grant) = (self.actuators[i].level(), self.actuators[i].grant());
                self.act(env, i, level, grant, &mut out);
            }
        }
        out
    }

    /// A thread of this VM was created, renamed or exited. Changes nothing; returns whether
    /// the list moved (the caller then brings the threads to their levels with
    /// [`VmThreads::reapply`]).
    #[cfg(feature = "bpf")]
    pub fn thread_event(&mut self, env: &mut Host, ev: &cosched_hostbpf::ThreadEvent) -> bool {
        self.threads.event(&env.procfs, ev)
    }

    /// Puts everything back through the one restore logic ([`crate::store::restore_record`],
    /// the same that runs after a crash) and removes the record from disk once it is done.
    pub fn restore(&mut self, env: &mut Host) -> RestoreReport {
        let mut report = crate::store::restore_record(&self.record(), &env.procfs, env.sched.as_mut());
        if report.errors.is_empty() {
            if let Err(e) = env.store.remove(self.threads.process) {
                report.errors.push(format!("{}: removing state record: {e}", self.name));
            }
            for a in self.actuators.iter_mut() {
                a.restored();
            }
            self.statics.restored();
            self.statics_plan = None;
            self.threads.sched_held.clear();
            self.persisted = false;
        }
        report
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_io;
#[cfg(test)]
mod tests_ledger;
#[cfg(test)]
mod tests_record;
#[cfg(test)]
mod tests_static;
