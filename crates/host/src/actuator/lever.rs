//! An actuator of one setting per thread, set on the threads a `Lever` picks at any level but
//! `Normal` ([`LeverActuator`]): the I/O boost's levers (`io.rs`) and the memory-bandwidth
//! throttle's (`membw.rs`). The two lever shapes they share are here: threads moved into a group
//! of the daemon's (`GroupLever`), and a number in a file of the VM's own group
//! (`GroupValueLever`).

use std::fmt::Debug;
use std::io;

use cosched_core::{Grant, Level};
use cosched_procfs::{TaskId, ThreadInfo};
use cosched_proto::Resource;

use super::ledger::{Ledger, Newcomer};
use super::{Actuator, Host, Outcome, Prepared, Threads};
use crate::cgroup;
use crate::sched::ThreadOps;
use crate::settings::{CgroupKind, GroupValueKind, Kind, OwnGroups};
use crate::store::Entry;

/// The value of a lever's kind.
pub(super) type ValueOf<L> = <<L as Lever>::K as Kind>::V;

/// What an actuator of one setting decides: on which threads, to what.
pub(super) trait Lever: Debug {
    type K: Kind;
    /// The kind its ledger reads and sets.
    fn kind(&self) -> Self::K;
    fn member(&self, process: TaskId, t: &ThreadInfo, vcpus_known: bool) -> bool;
    /// The raised value for a thread that has `original`; `None`: leave it.
    fn target(&self, process: TaskId, original: &ValueOf<Self>) -> Option<ValueOf<Self>>;
    /// A thread first seen while the VM is raised has `current`, perhaps inherited from the
    /// raised thread that created it: its original is what that creator had before the raise.
    /// `main` is the main thread's original, when known.
    fn born_into(&self, current: &ValueOf<Self>, _main: Option<&ValueOf<Self>>) -> ValueOf<Self> {
        current.clone()
    }
    /// Whether the change to `applied` is in force: most are once set; a freeze is only once
    /// the kernel has frozen every thread. One read, never a wait.
    fn in_force(&self, _ops: &mut dyn ThreadOps, _applied: &ValueOf<Self>) -> io::Result<bool> {
        Ok(true)
    }
    /// Why raising it does nothing to this VM (`vcpus_known` false: QEMU names no thread a
    /// vCPU), said at each raise; `None`: it acts.
    fn unsupported(&self, _vcpus_known: bool) -> Option<&'static str> {
        None
    }
}

/// A lever and its ledger, behind one interface whatever the value's type.
trait Levered: Debug {
    fn resume(&mut self, env: &mut Host, threads: &Threads, entries: &[Entry]);
    fn prepare(&mut self, env: &mut Host, threads: &Threads, raise: bool, out: &mut Outcome) -> Prepared;
    fn apply(&mut self, env: &mut Host, out: &mut Outcome, gone: &mut Vec<i32>);
    fn entries(&self, out: &mut Vec<Entry>);
    fn restored(&mut self);
    fn show(&self, tid: i32) -> Option<(&'static str, String, bool)>;
    fn in_force(&self, env: &mut Host) -> Option<bool>;
}

#[derive(Debug)]
struct WithLedger<L: Lever> {
    lever: L,
    ledger: Ledger<L::K>,
}

impl<L: Lever> WithLedger<L> {
    fn follow(&mut self, env: &mut Host, threads: &Threads, raised: bool, out: &mut Outcome) -> bool {
        let (lever, process, vcpus_known) = (&self.lever, threads.process, threads.vcpus_known());
        let born = |current: &ValueOf<L>, main: Option<&ValueOf<L>>| lever.born_into(current, main);
        let newcomer = if raised { Newcomer::Born(&born) } else { Newcomer::Present };
        self.ledger.follow(env.sched.as_mut(), threads, |t| lever.member(process, t, vcpus_known), newcomer, out)
    }
}

impl<L: Lever> Levered for WithLedger<L> {
    fn resume(&mut self, env: &mut Host, threads: &Threads, entries: &[Entry]) {
        self.follow(env, threads, false, &mut Outcome::default());
        self.ledger.resume(entries);
    }

    fn prepare(&mut self, env: &mut Host, threads: &Threads, raise: bool, out: &mut Outcome) -> Prepared {
        let mut changed = self.follow(env, threads, raise, out);
        if let Some(why) = self.lever.unsupported(threads.vcpus_known()).filter(|_| raise) {
            out.errors.push(why.to_string());
        }
        if self.ledger.verify_due(env.verify) {
            changed |= self.ledger.verify(env.sched.as_mut(), |_, _| true, out);
        }
        let (lever, process) = (&self.lever, threads.process);
        let p = self.ledger.prepare(|s| if raise { lever.target(process, &s.original) } else { None });
        Prepared { changed: changed || p.changed, sets: p.sets }
    }

    fn apply(&mut self, env: &mut Host, out: &mut Outcome, gone: &mut Vec<i32>) {
        self.ledger.apply(env, out, gone)
    }

    fn entries(&self, out: &mut Vec<Entry>) {
        self.ledger.entries(out)
    }

    fn restored(&mut self) {
        self.ledger.restored()
    }

    fn show(&self, tid: i32) -> Option<(&'static str, String, bool)> {
        self.ledger.show(tid)
    }

    /// Each distinct value applied, read once; `None` when nothing is applied. A value that
    /// cannot be read is not in force.
    fn in_force(&self, env: &mut Host) -> Option<bool> {
        let values = self.ledger.applied_values();
        if values.is_empty() {
            return None;
        }
        Some(values.into_iter().all(|v| self.lever.in_force(env.sched.as_mut(), v).unwrap_or(false)))
    }
}

/// One lever's actuator: the I/O boost ([`LeverActuator::io`]) or the memory-bandwidth
/// throttle ([`LeverActuator::throttle`]). Any level but `Normal` applies the lever.
#[derive(Debug)]
pub struct LeverActuator {
    resource: Resource,
    lever: Box<dyn Levered>,
    level: Level,
    grant: Grant,
}

impl LeverActuator {
    /// `lever` for `resource`, recorded under the resource's name.
    pub(super) fn new<L: Lever + 'static>(resource: Resource, lever: L) -> LeverActuator {
        let ledger = Ledger::new(lever.kind(), resource.name());
        LeverActuator {
            resource,
            lever: Box::new(WithLedger { lever, ledger }),
            level: Level::Normal,
            grant: Grant::Share(0),
        }
    }
}

impl Actuator for LeverActuator {
    fn resource(&self) -> Resource {
        self.resource
    }

    fn level(&self) -> Level {
        self.level
    }

    fn grant(&self) -> Grant {
        self.grant
    }

    fn resume(&mut self, env: &mut Host, threads: &Threads, entries: &[Entry]) {
        self.lever.resume(env, threads, entries)
    }

    fn prepare(
        &mut self,
        env: &mut Host,
        threads: &Threads,
        level: Level,
        grant: Grant,
        out: &mut Outcome,
    ) -> Prepared {
        self.level = level;
        self.grant = grant;
        self.lever.prepare(env, threads, level.is_changed(), out)
    }

    fn apply(&mut self, env: &mut Host, out: &mut Outcome, gone: &mut Vec<i32>) {
        self.lever.apply(env, out, gone)
    }

    fn entries(&self, out: &mut Vec<Entry>) {
        self.lever.entries(out)
    }

    fn restored(&mut self) {
        self.level = Level::Normal;
        self.lever.restored()
    }

    fn show(&self, tid: i32) -> Option<(&'static str, String, bool)> {
        self.lever.show(tid)
    }

    fn in_force(&self, env: &mut Host) -> Option<bool> {
        if self.level == Level::Normal {
            return None;
        }
        self.lever.in_force(env)
    }
}

/// Threads placed one by one (a cgroup v1 hierarchy, resctrl): raised, a thread moves into
/// `<its group>/<prefix><pid>`, a group of the daemon's made at the first move with `file` set
/// to `value`: the I/O lever's weighted `blkio` group, the throttle's frozen `freezer` group or
/// its resctrl group.
#[derive(Debug)]
pub(super) struct GroupLever {
    pub hierarchy: &'static str,
    pub prefix: &'static str,
    /// The control file written when the group is made, and its value.
    pub file: &'static str,
    pub value: String,
    /// Which threads move.
    pub members: fn(&ThreadInfo, bool) -> bool,
    /// `members` takes named vCPU threads only (a lever that stops the threads it takes must
    /// never guess): what to say when QEMU names none.
    pub named_vcpus_only: Option<&'static str>,
    /// Groups do not nest (resctrl's control groups): the group is `/<prefix><pid>`, and only
    /// threads in the default group `/` move (one in another's group is left to its owner).
    pub flat: bool,
    /// `file` reads back `value` only once the change is in force on every thread in the group
    /// (the v1 freezer: `FREEZING` until each is frozen); otherwise it is in force once set.
    pub settles: bool,
}

impl GroupLever {
    /// `<group>/<prefix><pid>`: the group of the daemon's for threads of `process` that were in
    /// `group`.
    fn own_group(&self, process: TaskId, group: &str) -> String {
        let parent = if self.flat { "" } else { group.trim_end_matches('/') };
        format!("{parent}/{}{}", self.prefix, process.id)
    }

    fn is_own(&self, group: &str) -> bool {
        cgroup::is_named(group, self.prefix)
    }
}

impl Lever for GroupLever {
    type K = CgroupKind;
    fn kind(&self) -> CgroupKind {
        let own = OwnGroups { prefix: self.prefix, made_with: Some((self.file, self.value.clone())) };
        CgroupKind::new(self.hierarchy, Some(own))
    }
    fn member(&self, _: TaskId, t: &ThreadInfo, vcpus_known: bool) -> bool {
        (self.members)(t, vcpus_known)
    }
    fn unsupported(&self, vcpus_known: bool) -> Option<&'static str> {
        self.named_vcpus_only.filter(|_| !vcpus_known)
    }
    fn target(&self, process: TaskId, original: &String) -> Option<String> {
        let movable = if self.flat { original == "/" } else { !self.is_own(original) };
        movable.then(|| self.own_group(process, original))
    }
    /// A thread created by a thread in our group is born in it: it belongs where the group is.
    fn born_into(&self, current: &String, _: Option<&String>) -> String {
        if self.is_own(current) {
            cgroup::parent(current).to_string()
        } else {
            current.clone()
        }
    }
    fn in_force(&self, ops: &mut dyn ThreadOps, group: &String) -> io::Result<bool> {
        if !self.settles || !self.is_own(group) {
            return Ok(true);
        }
        Ok(ops.cgroups().read(self.hierarchy, group, self.file)? == self.value)
    }
}

/// A number in `file` of the VM's own cgroup v2 group (no other process in it), kept on its
/// main thread and raised to `raised`: the v2 weight lever's `io.bfq.weight`, the v2
/// throttle's `cgroup.freeze`.
#[derive(Debug)]
pub(super) struct GroupValueLever {
    pub file: &'static str,
    /// Its name in a thread's status line.
    pub label: &'static str,
    /// Why it needs a group of the VM's own (said when the VM shares one).
    pub why: &'static str,
    pub raised: u32,
    /// In force once the group's `cgroup.events` says `frozen <raised>` (a freeze completes
    /// asynchronously); otherwise once written.
    pub frozen_event: bool,
}

impl Lever for GroupValueLever {
    type K = GroupValueKind;
    fn kind(&self) -> GroupValueKind {
        GroupValueKind::own_v2(self.file, self.label, self.why)
    }
    fn member(&self, process: TaskId, t: &ThreadInfo, _: bool) -> bool {
        t.task == process
    }
    fn target(&self, _: TaskId, original: &(String, u32)) -> Option<(String, u32)> {
        (original.1 < self.raised).then(|| (original.0.clone(), self.raised))
    }
    fn in_force(&self, ops: &mut dyn ThreadOps, v: &(String, u32)) -> io::Result<bool> {
        if !self.frozen_event {
            return Ok(true);
        }
        let events = ops.cgroups().read("", &v.0, "cgroup.events")?;
        Ok(events.lines().any(|l| l.split_whitespace().eq(["frozen", &v.1.to_string()])))
    }
}
