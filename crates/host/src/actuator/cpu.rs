//! The scheduling-class actuator: a boosted VM's threads get a real-time class (or what
//! `[boost]` says) with `sched_setattr`, and their own attributes back at normal. Two resources
//! use it: the CPU (guest-driven boosts, every thread of the VM) and events (FEAS: the vCPU
//! threads only, `SCHED_RR` at the VM's priority while boosted, `repay_nice` while the VM pays its
//! boost back at [`Level::Guarded`]).
//!
//! A thread that already runs at a real-time class is never touched (a boost never lowers).
//! What a thread has is read when the actuator first sees it and again at most every
//! [`Host::verify`]; in between, a transition is one `sched_setattr` per thread that changes.

use cosched_core::{Grant, Level};
use cosched_procfs::ThreadRole;
use cosched_proto::Resource;

use super::ledger::{Ledger, Newcomer};
use super::{Actuator, BoostClass, Host, Outcome, Prepared, Threads};
use crate::sched::{SchedAttr, SCHED_FLAG_RESET_ON_FORK, SCHED_RR};
use crate::settings::SchedKind;
use crate::store::Entry;

/// The nice level a VM pays an event boost back at by default (weight 15 against nice 0's 1024:
/// see `cosched_core::feas`); `[event] repay_nice`.
pub const EVENT_REPAY_NICE: i32 = 19;

/// What each level sets on which threads.
#[derive(Debug, Clone)]
enum Targets {
    /// CPU coordination: `[boost]`.
    Cpu(BoostClass),
    /// Event boosting: vCPU threads only; the nice level of the pay-back.
    Event { repay_nice: i32 },
}

impl Targets {
    fn target(&self, level: Level, role: ThreadRole, vcpus_known: bool, grant: Grant) -> Option<SchedAttr> {
        match self {
            Targets::Cpu(class) => class.target(level, role, vcpus_known, grant),
            Targets::Event { repay_nice } => match level {
                _ if !super::class::is_vcpu(role, vcpus_known) => None,
                Level::Normal | Level::Throttled => None,
                Level::Boosted => Some(SchedAttr::rt(SCHED_RR, grant.priority() as u32, SCHED_FLAG_RESET_ON_FORK)),
                Level::Guarded => Some(SchedAttr::other(*repay_nice, SCHED_FLAG_RESET_ON_FORK)),
            },
        }
    }
}

#[derive(Debug)]
pub struct CpuActuator {
    resource: Resource,
    targets: Targets,
    ledger: Ledger<SchedKind>,
    level: Level,
    grant: Grant,
}

impl CpuActuator {
    /// CPU coordination with `[boost]`'s class. Each actuator records its changes under its
    /// resource's name (the layer).
    pub fn new(class: BoostClass) -> CpuActuator {
        CpuActuator::with(Resource::Cpu, Targets::Cpu(class))
    }

    /// Event boosting (FEAS), paid back at nice `repay_nice`.
    pub fn event(repay_nice: i32) -> CpuActuator {
        CpuActuator::with(Resource::Event, Targets::Event { repay_nice })
    }

    fn with(resource: Resource, targets: Targets) -> CpuActuator {
        CpuActuator {
            resource,
            targets,
            ledger: Ledger::new(SchedKind, resource.name()),
            level: Level::Normal,
            grant: Grant::Plain { priority: 1 },
        }
    }

    /// Every thread of the VM, its present attributes its original.
    fn follow(&mut self, env: &mut Host, threads: &Threads, out: &mut Outcome) -> bool {
        self.ledger.follow(env.sched.as_mut(), threads, |_| true, Newcomer::Present, out)
    }
}

impl Actuator for CpuActuator {
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
        self.follow(env, threads, &mut Outcome::default());
        self.ledger.resume(entries);
    }

    fn prepare(
        &mut self,
        env: &mut Host,
        threads: &Threads,
        level: Level,
        grant: Grant,
        out: &mut Outcome,
    ) -> Prepared {
        let mut changed = self.follow(env, threads, out);
        self.level = level;
        self.grant = grant;
        if self.ledger.verify_due(env.verify) {
            // A thread the other sched layer holds has that layer's value, not someone else's.
            let me = self.resource;
            let mine = |tid: i32, _: &_| threads.sched_held_by(tid).is_none_or(|r| r == me);
            changed |= self.ledger.verify(env.sched.as_mut(), mine, out);
        }
        let (targets, vcpus_known) = (&self.targets, threads.vcpus_known());
        let p = self.ledger.prepare(|s| {
            if s.original.is_realtime() {
                None // never lower a thread that is already real-time
            } else {
                targets.target(level, s.role, vcpus_known, grant)
            }
        });
        Prepared { changed: changed || p.changed, sets: p.sets }
    }

    fn apply(&mut self, env: &mut Host, out: &mut Outcome, gone: &mut Vec<i32>) {
        self.ledger.apply(env, out, gone)
    }

    fn entries(&self, out: &mut Vec<Entry>) {
        self.ledger.entries(out)
    }

    fn restored(&mut self) {
        self.level = Level::Normal;
        self.ledger.restored()
    }

    fn show(&self, tid: i32) -> Option<(&'static str, String, bool)> {
        self.ledger.show(tid)
    }

    fn sched_layer(&self) -> bool {
        true
    }

    fn holds_sched(&self, tid: i32) -> bool {
        self.ledger.applied(tid).is_some()
    }

    fn sched_original(&self, tid: i32) -> Option<SchedAttr> {
        self.ledger.slot(tid).filter(|s| s.applied.is_some()).map(|s| s.original)
    }

    fn rebase_sched(&mut self, tid: i32, now: SchedAttr) {
        self.ledger.rebase(tid, now)
    }
}
