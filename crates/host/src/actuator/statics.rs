//! Static per-VM tunings (the Performance Tuning paper, sec. 4.2): what the operator sets on a VM
//! for as long as it runs, under every dynamic boost, recorded under the `static` layer of the VM's
//! record.
//!
//! - **FIFO** (sec. 4.2.2, 5.4): the vCPU threads `SCHED_FIFO` 97, every other thread 98 (the
//!   main loop delivers the guest's timers under TCG; the paper's "I/O thread").
//! - **Shielding** (sec. 4.2.1): the vCPU threads run on dedicated host CPUs, every other thread
//!   of the VM on the housekeeping CPUs (thread affinity). With a cpuset hierarchy the vCPUs also
//!   go into a cpuset group of their own, `<the VM's cpuset group>/cosched-shield-<pid>`,
//!   holding just the dedicated CPUs: v1 marks it `cpu_exclusive` (no other exclusive cpuset
//!   may take those CPUs), v2 makes it a threaded group and asks for an `isolated` partition.
//!   What the kernel refuses (exclusivity, the partition) is noted and the shield goes on with
//!   affinities alone. The host's side (IRQs, the operator's host groups) is [`crate::shield`].
//!
//! A thread that already runs at a real-time class the daemon did not set is left alone. A
//! thread that a dynamic boost (the CPU or event layer) holds keeps that layer's original as
//! the static layer's original, and the boost's layer lets go of it: static lies under boosts.
//!
//! Three settings per thread, each a [`Ledger`] recorded under the `static` layer: the class,
//! the affinity and the cpuset group. A value the plan no longer wants and someone else changed
//! after us stays theirs; otherwise the layer holds its values without reading them again.

use std::collections::BTreeSet;

use serde::Serialize;

use super::ledger::{Applied, Ledger, Newcomer, Slot};
use super::{class::is_vcpu, Host, Outcome, Prepared, Threads};
pub use crate::cgroup::SHIELD_GROUP_PREFIX;
use crate::sched::{SchedAttr, SCHED_FIFO, SCHED_FLAG_RESET_ON_FORK};
use crate::settings::{AffinityKind, CgroupKind, Kind, OwnGroups, SchedKind};
use crate::shield::{format_cpus, Cpus};
use crate::store::{Entry, STATIC_LAYER};
use cosched_procfs::ThreadRole;

/// What the operator asked for one VM, resolved against the host (CPUs checked).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StaticPlan {
    /// (vCPU priority, other threads' priority) at `SCHED_FIFO`.
    pub fifo: Option<(u8, u8)>,
    /// The static guard holds the vCPU threads at this nice (`SCHED_OTHER`) instead of FIFO.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guarded: Option<i32>,
    pub shield: Option<ShieldPlan>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShieldPlan {
    /// The vCPU threads' dedicated CPUs.
    pub vcpus: Cpus,
    /// Where the VM's other threads go.
    pub housekeeping: Cpus,
}

impl StaticPlan {
    pub fn is_empty(&self) -> bool {
        self.fifo.is_none() && self.shield.is_none()
    }

    /// `fifo 97/98, shield 1 (housekeeping 0)`, for status and logs.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match (self.fifo, self.guarded) {
            (Some((v, o)), None) => parts.push(format!("fifo {v}/{o}")),
            (Some((_, o)), Some(n)) => parts.push(format!("fifo guarded (vCPUs at nice {n})/{o}")),
            _ => {}
        }
        if let Some(s) = &self.shield {
            parts.push(format!("shield {} (housekeeping {})", format_cpus(&s.vcpus), format_cpus(&s.housekeeping)));
        }
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }
}

/// A slot the plan no longer wants and we still hold.
fn undoing<V>(_: i32, s: &Slot<V>) -> bool {
    s.want.is_none() && s.applied.is_some()
}

/// Books one setting's outcome in a thread's static tuning. False: the thread's next settings
/// are not set (it is gone, or the kernel refused this one).
fn booked<V>(r: &Applied<V>, tid: i32, changed: &mut bool, gone: &mut Vec<i32>, out: &mut Outcome) -> bool {
    match r {
        Applied::Unchanged => true,
        Applied::Set(_) => {
            *changed = true;
            true
        }
        Applied::Gone => {
            gone.push(tid);
            false
        }
        Applied::Failed(why) => {
            out.errors.push(format!("static tuning: {why}"));
            false
        }
    }
}

/// The static layer of one VM.
#[derive(Debug)]
pub struct StaticActuator {
    plan: StaticPlan,
    sched: Ledger<SchedKind>,
    affinity: Ledger<AffinityKind>,
    /// Membership in the cpuset hierarchy (`None`: none is mounted, or none seen yet).
    cpuset: Option<Ledger<CgroupKind>>,
    /// The cpuset hierarchy (`cpuset` v1, `""` v2) and the vCPUs' group, once made.
    group: Option<(String, String)>,
    /// What the kernel refused of the shield (exclusivity, partition), for status.
    pub notes: Vec<String>,
    /// Groups of a shield that was removed or changed: they go once their threads left.
    stale_groups: Vec<(String, String)>,
}

impl Default for StaticActuator {
    fn default() -> Self {
        StaticActuator {
            plan: StaticPlan::default(),
            sched: Ledger::new(SchedKind, STATIC_LAYER),
            affinity: Ledger::new(AffinityKind, STATIC_LAYER),
            cpuset: None,
            group: None,
            notes: Vec::new(),
            stale_groups: Vec::new(),
        }
    }
}

impl StaticActuator {
    pub fn new() -> StaticActuator {
        StaticActuator::default()
    }

    pub fn plan(&self) -> &StaticPlan {
        &self.plan
    }

    /// Whether anything of ours is on a thread.
    pub fn active(&self) -> bool {
        self.sched.active() || self.affinity.active() || self.cpuset.as_ref().is_some_and(|c| c.active())
    }

    /// Follows the thread list. `base`: for a thread one of our boost layers holds, what it had
    /// before the boost. A cpuset group of ours that a gone thread was in stays named in the
    /// record (the VM exited while shielded: the restore still removes the group, which would
    /// otherwise hold its CPUs exclusively for good).
    fn follow(
        &mut self,
        env: &mut Host,
        threads: &Threads,
        base: &dyn Fn(i32) -> Option<SchedAttr>,
        out: &mut Outcome,
    ) -> bool {
        let ops = env.sched.as_mut();
        let mut changed = self.sched.follow(ops, threads, |_| true, Newcomer::Base(base), out);
        changed |= self.affinity.follow(ops, threads, |_| true, Newcomer::Present, out);
        if self.cpuset.is_none() {
            if let Some(h) = crate::shield::cpuset_hierarchy(ops.cgroups()) {
                let own = OwnGroups { prefix: SHIELD_GROUP_PREFIX, made_with: None }; // made by shield_group
                self.cpuset = Some(Ledger::new(CgroupKind::new(h, Some(own)), STATIC_LAYER));
            }
        }
        if let Some(c) = self.cpuset.as_mut() {
            changed |= c.follow(ops, threads, |_| true, Newcomer::Present, out);
        }
        changed
    }

    /// The vCPUs' cpuset group for `shield`, made on first use: `None` without a cpuset
    /// hierarchy or when the kernel refuses it (noted; the shield then uses affinities alone).
    fn shield_group(&mut self, env: &mut Host, threads: &Threads, shield: &ShieldPlan) -> Option<(String, String)> {
        if let Some(g) = &self.group {
            return Some(g.clone());
        }
        let cg = env.sched.cgroups().clone();
        let h = crate::shield::cpuset_hierarchy(&cg)?;
        let pid = threads.process.id;
        let parent = match env.sched.get_cgroup(pid, h) {
            Ok(p) => p,
            Err(e) => {
                self.notes.push(format!("no cpuset group for the vCPUs: reading the VM's group: {e}"));
                return None;
            }
        };
        let group = format!("{}/{SHIELD_GROUP_PREFIX}{pid}", parent.trim_end_matches('/'));
        let made = (|| -> std::io::Result<()> {
            cg.make_group(h, &group)?;
            if h.is_empty() {
                cg.write(h, &group, "cgroup.type", "threaded")?;
                cg.write(h, &group, "cpuset.cpus", &format_cpus(&shield.vcpus))?;
            } else {
                cg.write(h, &group, "cpuset.cpus", &format_cpus(&shield.vcpus))?;
                let mems = cg.read(h, &parent, "cpuset.mems")?;
                cg.write(h, &group, "cpuset.mems", &mems)?;
            }
            Ok(())
        })();
        if let Err(e) = made {
            self.notes.push(format!("no cpuset group for the vCPUs ({group}): {e}; shielding with affinities alone"));
            let _ = cg.remove_group(h, &group);
            return None;
        }
        if h.is_empty() {
            // v2: a partition takes the CPUs from every other group; the kernel says whether
            // it could (`isolated invalid (...)` when a parent is no partition root).
            let state = cg
                .write(h, &group, "cpuset.cpus.partition", "isolated")
                .and_then(|()| cg.read(h, &group, "cpuset.cpus.partition"));
            match state {
                Ok(s) if s == "isolated" => {}
                Ok(s) => self.notes.push(format!("{group}: partition refused by the kernel: {s}")),
                Err(e) => self.notes.push(format!("{group}: partition refused by the kernel: {e}")),
            }
        } else if let Err(e) = cg.write(h, &group, "cpuset.cpu_exclusive", "1") {
            self.notes.push(format!("{group}: cpu_exclusive refused by the kernel: {e}"));
        }
        self.group = Some((h.to_string(), group));
        self.group.clone()
    }

    /// Takes `plan` and notes every value about to be set. `base`: for a thread one of our
    /// boost layers holds, what it had before the boost.
    pub fn prepare(
        &mut self,
        env: &mut Host,
        threads: &Threads,
        plan: &StaticPlan,
        base: &dyn Fn(i32) -> Option<SchedAttr>,
        out: &mut Outcome,
    ) -> Prepared {
        let mut changed = self.follow(env, threads, base, out);
        if plan.shield != self.plan.shield {
            // A new shield gets a group for its CPUs; the old one goes once its threads left.
            self.stale_groups.extend(self.group.take());
            self.notes.clear();
        }
        self.plan = plan.clone();
        let group = match &plan.shield {
            Some(s) => self.shield_group(env, threads, s).map(|g| g.1),
            None => None,
        };
        let vcpus_known = threads.vcpus_known();
        let vcpu = |s: ThreadRole| is_vcpu(s, vcpus_known);
        let sched = self.sched.prepare(|s| match plan.fifo {
            _ if s.original.is_realtime() => None, // someone else's real-time class stays
            Some(_) if vcpu(s.role) && plan.guarded.is_some() => {
                Some(SchedAttr::other(plan.guarded.unwrap_or(0), SCHED_FLAG_RESET_ON_FORK))
            }
            Some((v, o)) => {
                Some(SchedAttr::rt(SCHED_FIFO, if vcpu(s.role) { v } else { o } as u32, SCHED_FLAG_RESET_ON_FORK))
            }
            None => None,
        });
        let affinity = self.affinity.prepare(|s| {
            plan.shield
                .as_ref()
                .map(|sh| if vcpu(s.role) { &sh.vcpus } else { &sh.housekeeping }.iter().copied().collect())
        });
        let cpuset = match self.cpuset.as_mut() {
            Some(c) => c.prepare(|s| group.clone().filter(|_| vcpu(s.role))),
            None => Prepared::default(),
        };
        // Undoing: a class or affinity someone else set after ours stays theirs.
        changed |= self.sched.verify(env.sched.as_mut(), undoing, out);
        changed |= self.affinity.verify(env.sched.as_mut(), undoing, out);
        Prepared {
            changed: changed || sched.changed || affinity.changed || cpuset.changed,
            sets: sched.sets || affinity.sets || cpuset.sets,
        }
    }

    /// Makes the changes [`StaticActuator::prepare`] decided: cpuset group first (the kernel
    /// resets a moved thread's affinity to its new group's CPUs), then affinity, then the class;
    /// a thread's first failure stops its others. Returns the threads whose scheduling class it
    /// changed, with what they have now.
    pub fn apply(&mut self, env: &mut Host, out: &mut Outcome, gone: &mut Vec<i32>) -> Vec<(i32, SchedAttr)> {
        let mut tids: BTreeSet<i32> = self.sched.slots().map(|(t, _)| t).collect();
        tids.extend(self.affinity.slots().map(|(t, _)| t));
        tids.extend(self.cpuset.iter().flat_map(|c| c.slots().map(|(t, _)| t)));
        let mut sched_changed = Vec::new();
        let ops = env.sched.as_mut();
        for tid in tids {
            let mut changed = false;
            let ok = self.cpuset.as_mut().is_none_or(|c| booked(&c.apply_one(ops, tid), tid, &mut changed, gone, out))
                && booked(&self.affinity.apply_one(ops, tid), tid, &mut changed, gone, out)
                && {
                    let r = self.sched.apply_one(ops, tid);
                    if let Applied::Set(now) = &r {
                        sched_changed.push((tid, *now));
                    }
                    booked(&r, tid, &mut changed, gone, out)
                };
            if ok && changed {
                out.changed += 1;
            }
        }
        self.sched.forget(gone);
        self.affinity.forget(gone);
        if let Some(c) = self.cpuset.as_mut() {
            c.forget(gone);
        }
        let cg = env.sched.cgroups().clone();
        let cpuset = &self.cpuset;
        self.stale_groups.retain(|(h, g)| {
            if cpuset.as_ref().is_some_and(|c| c.applied_values().contains(&g)) {
                return true;
            }
            if let Err(e) = cg.remove_group(h, g) {
                out.errors.push(format!("removing cpuset group {g}: {e}"));
            }
            false
        });
        sched_changed
    }

    /// The `static` layer of the VM's record.
    pub fn entries(&self, out: &mut Vec<Entry>) {
        self.sched.entries(out);
        self.affinity.entries(out);
        if let Some(c) = &self.cpuset {
            c.entries(out);
        }
    }

    /// Everything was put back.
    pub fn restored(&mut self) {
        self.plan = StaticPlan::default();
        self.group = None;
        self.stale_groups.clear();
        self.notes.clear();
        self.sched.clear();
        self.affinity.clear();
        if let Some(c) = self.cpuset.as_mut() {
            c.clear();
        }
    }

    /// `static` in a thread's status line.
    pub fn show(&self, tid: i32) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(s) = self.sched.applied(tid) {
            parts.push(s.to_string());
        }
        if let Some(a) = self.affinity.applied(tid) {
            parts.push(format!("cpus {}", self.affinity.kind().show(a)));
        }
        if let Some(g) = self.cpuset.as_ref().and_then(|c| c.applied(tid)) {
            parts.push(format!("cpuset {g}"));
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    /// The class the static layer set on `tid`, if it holds it.
    pub fn holds_sched(&self, tid: i32) -> Option<SchedAttr> {
        self.sched.applied(tid).copied()
    }
}
