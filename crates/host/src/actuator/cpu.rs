//! The scheduling-class actuator: a boosted VM's threads get a real-time class (or what
//! `[boost]` says) with `sched_setattr`, and their own attributes back at normal. Two resources
//! use it: the CPU (guest-driven boosts, every thread of the VM) and events (FEAS: the vCPU
//! threads only, `SCHED_RR` at the VM's priority while boosted, nice 19 while the VM pays its
//! boost back at [`Level::Guarded`]).
//!
//! A thread that already runs at a real-time class is never touched (a boost never lowers).
//! What a thread has is read when the actuator first sees it and again at most every
//! [`Host::verify`]; in between, a transition is one `sched_setattr` per thread that changes.

use std::collections::BTreeMap;
use std::time::Instant;

use cosched_core::Level;
use cosched_procfs::{TaskId, ThreadRole};
use cosched_proto::Resource;

use super::{Actuator, BoostClass, Host, Outcome, Prepared, Threads};
use crate::sched::{self, SchedAttr, SCHED_FLAG_RESET_ON_FORK, SCHED_RR};
use crate::store::{Entry, Setting};

/// The nice level a VM pays an event boost back at (weight 15 against nice 0's 1024: see
/// `cosched_core::feas`).
pub const EVENT_REPAY_NICE: i32 = 19;

/// What each level sets on which threads.
#[derive(Debug, Clone)]
enum Targets {
    /// CPU coordination: `[boost]`.
    Cpu(BoostClass),
    /// Event boosting: vCPU threads only.
    Event,
}

impl Targets {
    fn target(&self, level: Level, role: ThreadRole, vcpus_known: bool, priority: u8) -> Option<SchedAttr> {
        match self {
            Targets::Cpu(class) => class.target(level, role, vcpus_known, priority),
            Targets::Event => match level {
                _ if !super::class::is_vcpu(role, vcpus_known) => None,
                Level::Normal | Level::Throttled => None,
                Level::Boosted => Some(SchedAttr::rt(SCHED_RR, priority as u32, SCHED_FLAG_RESET_ON_FORK)),
                Level::Guarded => Some(SchedAttr::other(EVENT_REPAY_NICE, SCHED_FLAG_RESET_ON_FORK)),
            },
        }
    }
}

#[derive(Debug, Clone)]
struct Tracked {
    task: TaskId,
    /// From the thread list, as of the last generation followed.
    role: ThreadRole,
    original: SchedAttr,
    /// What we set and the thread still has, as far as we know.
    applied: Option<SchedAttr>,
    /// What the level being applied wants it to have (`None`: its original).
    want: Option<SchedAttr>,
    /// Every value we may set on it (persisted before any is set): what tells a restore that
    /// the thread's present value is ours.
    may_apply: Vec<SchedAttr>,
}

#[derive(Debug)]
pub struct CpuActuator {
    resource: Resource,
    targets: Targets,
    threads: BTreeMap<i32, Tracked>,
    /// The [`Threads::generation`] last followed, and what it said of the vCPUs' names.
    generation: Option<u64>,
    vcpus_known: bool,
    level: Level,
    priority: u8,
    /// When every thread's attributes were last read.
    verified_at: Option<Instant>,
}

impl CpuActuator {
    /// CPU coordination with `[boost]`'s class. Each actuator records its changes under its
    /// resource's name (the layer).
    pub fn new(class: BoostClass) -> CpuActuator {
        CpuActuator::with(Resource::Cpu, Targets::Cpu(class))
    }

    /// Event boosting (FEAS).
    pub fn event() -> CpuActuator {
        CpuActuator::with(Resource::Event, Targets::Event)
    }

    fn with(resource: Resource, targets: Targets) -> CpuActuator {
        CpuActuator {
            resource,
            targets,
            threads: BTreeMap::new(),
            generation: None,
            vcpus_known: false,
            level: Level::Normal,
            priority: 1,
            verified_at: None,
        }
    }

    /// Follows the thread list when it moved: tracks threads it gained (their present
    /// attributes are their originals), drops those it lost, takes in roles. A transition
    /// between two moves reads nothing from the list.
    fn follow(&mut self, env: &mut Host, threads: &Threads) -> bool {
        if self.generation == Some(threads.generation()) {
            return false;
        }
        self.generation = Some(threads.generation());
        self.vcpus_known = threads.vcpus_known();
        let before = self.threads.len();
        self.threads.retain(|tid, t| threads.get(*tid).is_some_and(|i| i.task == t.task));
        let mut changed = self.threads.len() != before;
        for info in threads.iter() {
            if let Some(t) = self.threads.get_mut(&info.task.id) {
                t.role = info.role; // QEMU names its threads a moment after creating them
                continue;
            }
            let Ok(original) = env.sched.get(info.task.id) else { continue }; // exited meanwhile
            let t = Tracked {
                task: info.task,
                role: info.role,
                original,
                applied: None,
                want: None,
                may_apply: Vec::new(),
            };
            self.threads.insert(info.task.id, t);
            changed = true;
        }
        changed
    }

    /// Reads every thread's attributes and takes in what someone else changed: a thread at its
    /// own attributes gets its present ones as original (the operator may have made it
    /// real-time, which a boost must not lower); a thread that no longer has what we set keeps
    /// the other's change, and we let go of it. Returns whether an original moved.
    fn verify(&mut self, env: &mut Host, threads: &Threads, out: &mut Outcome) -> bool {
        let mut changed = false;
        for (tid, t) in self.threads.iter_mut() {
            if threads.sched_held_by(*tid).is_some_and(|r| r != self.resource) {
                continue; // the other sched layer's value, not someone else's
            }
            let Ok(cur) = env.sched.get(*tid) else { continue }; // gone: the change will say so
            match t.applied {
                None if !cur.same_as(&t.original) => {
                    t.original = cur;
                    changed = true;
                }
                Some(applied) if !cur.same_as(&applied) => {
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
}

impl Actuator for CpuActuator {
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
        self.follow(env, threads);
        for e in entries {
            let Setting::Sched { original, applied } = &e.setting else { continue };
            let Some(t) = self.threads.get_mut(&e.task.id).filter(|t| t.task == e.task) else { continue };
            let current = t.original;
            // The restore's own decision: a value the record says we applied is still ours.
            let layers = [(self.resource.name(), original, applied.as_slice())];
            if crate::store::undo_value(&layers, &current, SchedAttr::same_as).is_some() {
                t.applied = Some(current); // still ours: the next deboost puts it back
            }
            t.original = *original;
            t.may_apply = applied.clone();
        }
    }

    fn prepare(
        &mut self,
        env: &mut Host,
        threads: &Threads,
        level: Level,
        priority: u8,
        out: &mut Outcome,
    ) -> Prepared {
        let mut p = Prepared { changed: self.follow(env, threads), sets: false };
        self.level = level;
        self.priority = priority;
        if self.verified_at.is_none_or(|t| t.elapsed() >= env.verify) {
            p.changed |= self.verify(env, threads, out);
        }
        for t in self.threads.values_mut() {
            t.want = if t.original.is_realtime() {
                None // never lower a thread that is already real-time
            } else {
                self.targets.target(level, t.role, self.vcpus_known, priority)
            };
            if let Some(attr) = t.want {
                p.sets = true;
                // Every value about to be set is recorded as one we may apply, before it is set.
                if !t.may_apply.contains(&attr) {
                    t.may_apply.push(attr);
                    p.changed = true;
                }
            }
        }
        p
    }

    fn apply(&mut self, env: &mut Host, out: &mut Outcome, gone: &mut Vec<i32>) {
        // One sched_setattr per thread that changes, and nothing else: what a thread has was
        // checked by the last verification.
        let first_gone = gone.len();
        for (tid, t) in self.threads.iter_mut() {
            if t.want == t.applied {
                continue;
            }
            let attr = t.want.unwrap_or(t.original);
            let started = Instant::now();
            let result = env.sched.set(*tid, &attr);
            env.syscall_ns += started.elapsed().as_nanos() as u64;
            match result {
                Ok(()) => {
                    out.changed += 1;
                    t.applied = t.want;
                }
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => gone.push(*tid),
                Err(e) => {
                    let mut why = sched::explain_set_error(*tid, &attr, &e);
                    if e.raw_os_error() == Some(libc::EPERM) && attr.is_realtime() {
                        if let Some(group) = env.sched.cgroups().rt_runtime_blocker(*tid) {
                            why = format!("{why}: {group}");
                        }
                    }
                    out.errors.push(why)
                }
            }
        }
        for tid in &gone[first_gone..] {
            self.threads.remove(tid);
        }
    }

    fn entries(&self, out: &mut Vec<Entry>) {
        out.extend(self.threads.values().filter(|t| !t.may_apply.is_empty()).map(|t| Entry {
            task: t.task,
            layer: self.resource.name().into(),
            setting: Setting::Sched { original: t.original, applied: t.may_apply.clone() },
        }));
    }

    fn restored(&mut self) {
        self.level = Level::Normal;
        for t in self.threads.values_mut() {
            t.applied = None;
            t.want = None;
            t.may_apply.clear();
        }
    }

    fn show(&self, tid: i32) -> Option<(&'static str, String, bool)> {
        let t = self.threads.get(&tid)?;
        Some(("sched", t.applied.unwrap_or(t.original).to_string(), t.applied.is_some()))
    }

    fn sched_layer(&self) -> bool {
        true
    }

    fn holds_sched(&self, tid: i32) -> bool {
        self.threads.get(&tid).is_some_and(|t| t.applied.is_some())
    }

    fn sched_original(&self, tid: i32) -> Option<SchedAttr> {
        self.threads.get(&tid).filter(|t| t.applied.is_some()).map(|t| t.original)
    }

    fn rebase_sched(&mut self, tid: i32, now: SchedAttr) {
        if let Some(t) = self.threads.get_mut(&tid) {
            t.original = now;
            t.applied = None;
        }
    }
}
