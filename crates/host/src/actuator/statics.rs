//! Static per-VM tunings (seed 002 sec. 4.2): what the operator sets on a VM for as long as it
//! runs, under every dynamic boost, recorded under the `static` layer of the VM's record.
//!
//! - **FIFO** (sec. 4.2.2, 5.4): the vCPU threads `SCHED_FIFO` 97, every other thread 98 (the
//!   main loop delivers the guest's timers under TCG; seed 002's "I/O thread").
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

use std::collections::BTreeMap;

use cosched_procfs::{TaskId, ThreadRole};
use serde::Serialize;

use super::{class::is_vcpu, Host, Outcome, Prepared, Threads};
pub use crate::cgroup::SHIELD_GROUP_PREFIX;
use crate::sched::{SchedAttr, SCHED_FIFO, SCHED_FLAG_RESET_ON_FORK};
use crate::shield::{format_cpus, Cpus};
use crate::store::{Entry, Setting, STATIC_LAYER};

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

/// One setting of one thread: its original, what we set and it still has, what the plan wants,
/// and every value we may set (persisted before any is set).
#[derive(Debug, Clone)]
struct Slot<T> {
    original: T,
    applied: Option<T>,
    want: Option<T>,
    may: Vec<T>,
}

impl<T: Clone + PartialEq> Slot<T> {
    fn new(original: T) -> Slot<T> {
        Slot { original, applied: None, want: None, may: Vec::new() }
    }

    /// Sets what the plan wants; returns whether a new value joined the ones we may set.
    fn plan(&mut self, want: Option<T>) -> bool {
        self.want = want.clone();
        match want {
            Some(v) if !self.may.contains(&v) => {
                self.may.push(v);
                true
            }
            _ => false,
        }
    }

    fn pending(&self) -> Option<T> {
        (self.want != self.applied).then(|| self.want.clone().unwrap_or_else(|| self.original.clone()))
    }
}

#[derive(Debug, Clone)]
struct Tracked {
    task: TaskId,
    role: ThreadRole,
    sched: Slot<SchedAttr>,
    affinity: Slot<Vec<usize>>,
    /// Membership in the cpuset hierarchy (`None`: none is mounted, or not read yet).
    cpuset: Option<Slot<String>>,
}

/// The static layer of one VM.
#[derive(Debug, Default)]
pub struct StaticActuator {
    plan: StaticPlan,
    threads: BTreeMap<i32, Tracked>,
    generation: Option<u64>,
    vcpus_known: bool,
    /// The cpuset hierarchy (`cpuset` v1, `""` v2) and the vCPUs' group, once made.
    group: Option<(String, String)>,
    /// What the kernel refused of the shield (exclusivity, partition), for status.
    pub notes: Vec<String>,
    /// Groups of a shield that was removed or changed: they go once their threads left.
    stale_groups: Vec<(String, String)>,
    /// For each cpuset group of ours whose threads have all gone (the VM exited while
    /// shielded), a gone thread's entry that names it: kept in the record so that the restore
    /// (at the VM's end, the daemon's stop, after a crash) still removes the group, which
    /// would otherwise hold its CPUs exclusively for good. One per group.
    retired: Vec<Entry>,
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
        self.threads.values().any(|t| {
            t.sched.applied.is_some()
                || t.affinity.applied.is_some()
                || t.cpuset.as_ref().is_some_and(|c| c.applied.is_some())
        })
    }

    fn follow(&mut self, env: &mut Host, threads: &Threads, base: &dyn Fn(i32) -> Option<SchedAttr>) -> bool {
        if self.generation == Some(threads.generation()) {
            return false;
        }
        self.generation = Some(threads.generation());
        self.vcpus_known = threads.vcpus_known();
        let before = self.threads.len();
        let hierarchy = crate::shield::cpuset_hierarchy(env.sched.cgroups());
        let left: Vec<i32> = self
            .threads
            .iter()
            .filter(|(tid, t)| threads.get(**tid).is_none_or(|i| i.task != t.task))
            .map(|(t, _)| *t)
            .collect();
        for tid in left {
            self.drop_thread(tid, hierarchy);
        }
        let mut changed = self.threads.len() != before;
        for info in threads.iter() {
            let tid = info.task.id;
            if let Some(t) = self.threads.get_mut(&tid) {
                t.role = info.role;
                continue;
            }
            // What the thread has without our boosts (a boost layer that holds it knows).
            let Ok(sched) = base(tid).map_or_else(|| env.sched.get(tid), Ok) else { continue };
            let Ok(affinity) = env.sched.get_affinity(tid) else { continue };
            let cpuset = hierarchy.and_then(|h| env.sched.get_cgroup(tid, h).ok()).map(Slot::new);
            self.threads.insert(
                tid,
                Tracked {
                    task: info.task,
                    role: info.role,
                    sched: Slot::new(sched),
                    affinity: Slot::new(affinity),
                    cpuset,
                },
            );
            changed = true;
        }
        changed
    }

    /// Stops tracking thread `tid` (gone): a cpuset group of ours it may have been moved into
    /// stays named in the record ([`StaticActuator::retired`]).
    fn drop_thread(&mut self, tid: i32, hierarchy: Option<&str>) {
        let Some(t) = self.threads.remove(&tid) else { return };
        let (Some(c), Some(h)) = (&t.cpuset, self.group.as_ref().map(|g| g.0.as_str()).or(hierarchy)) else { return };
        for g in c.may.iter().filter(|g| g.rsplit('/').next().is_some_and(|l| l.starts_with(SHIELD_GROUP_PREFIX))) {
            let named = |e: &Entry| matches!(&e.setting, Setting::Cgroup { applied, .. } if applied.contains(g));
            if !self.retired.iter().any(named) {
                self.retired.push(Entry {
                    task: t.task,
                    layer: STATIC_LAYER.to_string(),
                    setting: Setting::Cgroup {
                        hierarchy: h.to_string(),
                        original: c.original.clone(),
                        applied: vec![g.clone()],
                    },
                });
            }
        }
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
    ) -> Prepared {
        let mut p = Prepared { changed: self.follow(env, threads, base), sets: false };
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
        let vcpus_known = self.vcpus_known;
        for t in self.threads.values_mut() {
            let vcpu = is_vcpu(t.role, vcpus_known);
            let sched = match plan.fifo {
                _ if t.sched.original.is_realtime() => None, // someone else's real-time class stays
                Some(_) if vcpu && plan.guarded.is_some() => {
                    Some(SchedAttr::other(plan.guarded.unwrap_or(0), SCHED_FLAG_RESET_ON_FORK))
                }
                Some((v, o)) => {
                    Some(SchedAttr::rt(SCHED_FIFO, if vcpu { v } else { o } as u32, SCHED_FLAG_RESET_ON_FORK))
                }
                None => None,
            };
            let affinity = plan
                .shield
                .as_ref()
                .map(|s| if vcpu { &s.vcpus } else { &s.housekeeping }.iter().copied().collect::<Vec<usize>>());
            p.changed |= t.sched.plan(sched);
            p.changed |= t.affinity.plan(affinity);
            if let Some(c) = t.cpuset.as_mut() {
                p.changed |= c.plan(group.clone().filter(|_| vcpu));
            }
            p.sets |= t.sched.want.is_some()
                || t.affinity.want.is_some()
                || t.cpuset.as_ref().is_some_and(|c| c.want.is_some());
        }
        p
    }

    /// Makes the changes [`StaticActuator::prepare`] decided: cpuset group first (the kernel
    /// resets a moved thread's affinity to its new group's CPUs), then affinity, then the class.
    /// Returns the threads whose scheduling class it changed, with what they have now.
    pub fn apply(&mut self, env: &mut Host, out: &mut Outcome, gone: &mut Vec<i32>) -> Vec<(i32, SchedAttr)> {
        let h = self
            .group
            .as_ref()
            .map(|g| g.0.clone())
            .or_else(|| crate::shield::cpuset_hierarchy(env.sched.cgroups()).map(str::to_string));
        let mut sched_changed = Vec::new();
        for (tid, t) in self.threads.iter_mut() {
            let tid = *tid;
            let mut result = Ok(());
            // Undoing: a value someone else set after ours stays theirs.
            if t.sched.want.is_none()
                && t.sched.applied.is_some_and(|a| env.sched.get(tid).is_ok_and(|c| !c.same_as(&a)))
            {
                t.sched.applied = None;
                t.sched.original = env.sched.get(tid).unwrap_or(t.sched.original);
                out.foreign += 1;
            }
            if t.affinity.want.is_none()
                && t.affinity.applied.as_ref().is_some_and(|a| env.sched.get_affinity(tid).is_ok_and(|c| c != *a))
            {
                t.affinity.applied = None;
                out.foreign += 1;
            }
            if let (Some(c), Some(h)) = (t.cpuset.as_mut(), h.as_deref()) {
                if let Some(g) = c.pending() {
                    result = env.sched.set_cgroup(tid, h, &g).map(|()| c.applied = c.want.clone());
                }
            }
            if result.is_ok() {
                if let Some(a) = t.affinity.pending() {
                    result = env.sched.set_affinity(tid, &a).map(|()| t.affinity.applied = t.affinity.want.clone());
                }
            }
            if result.is_ok() {
                if let Some(s) = t.sched.pending() {
                    result = env.sched.set(tid, &s).map(|()| {
                        t.sched.applied = t.sched.want;
                        sched_changed.push((tid, s));
                    });
                }
            }
            match result {
                Ok(()) => out.changed += 1,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => gone.push(tid),
                Err(e) => {
                    let blocker = (e.raw_os_error() == Some(libc::EPERM))
                        .then(|| env.sched.cgroups().rt_runtime_blocker(tid))
                        .flatten();
                    out.errors.push(match blocker {
                        Some(why) => format!("static tuning of thread {tid}: {e}: {why}"),
                        None => format!("static tuning of thread {tid}: {e}"),
                    })
                }
            }
        }
        for tid in gone.iter() {
            self.drop_thread(*tid, h.as_deref());
        }
        let cg = env.sched.cgroups().clone();
        self.stale_groups.retain(|(h, g)| {
            let still_used =
                self.threads.values().any(|t| t.cpuset.as_ref().is_some_and(|c| c.applied.as_ref() == Some(g)));
            if still_used {
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
        let h = self.group.as_ref().map(|g| g.0.clone());
        for t in self.threads.values() {
            let layer = || STATIC_LAYER.to_string();
            if !t.sched.may.is_empty() {
                out.push(Entry {
                    task: t.task,
                    layer: layer(),
                    setting: Setting::Sched { original: t.sched.original, applied: t.sched.may.clone() },
                });
            }
            if !t.affinity.may.is_empty() {
                out.push(Entry {
                    task: t.task,
                    layer: layer(),
                    setting: Setting::Affinity {
                        original: t.affinity.original.clone(),
                        applied: t.affinity.may.clone(),
                    },
                });
            }
            if let (Some(c), Some(h)) = (&t.cpuset, &h) {
                if !c.may.is_empty() {
                    out.push(Entry {
                        task: t.task,
                        layer: layer(),
                        setting: Setting::Cgroup {
                            hierarchy: h.clone(),
                            original: c.original.clone(),
                            applied: c.may.clone(),
                        },
                    });
                }
            }
        }
        out.extend(self.retired.iter().cloned());
    }

    /// Everything was put back.
    pub fn restored(&mut self) {
        self.plan = StaticPlan::default();
        self.group = None;
        self.stale_groups.clear();
        self.retired.clear();
        self.notes.clear();
        self.threads.clear();
        self.generation = None;
    }

    /// `static` in a thread's status line.
    pub fn show(&self, tid: i32) -> Option<String> {
        let t = self.threads.get(&tid)?;
        let mut parts = Vec::new();
        if let Some(s) = t.sched.applied {
            parts.push(s.to_string());
        }
        if let Some(a) = &t.affinity.applied {
            parts.push(format!("cpus {}", format_cpus(&a.iter().copied().collect())));
        }
        if let Some(g) = t.cpuset.as_ref().and_then(|c| c.applied.clone()) {
            parts.push(format!("cpuset {g}"));
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    /// The class the static layer set on `tid`, if it holds it.
    pub fn holds_sched(&self, tid: i32) -> Option<SchedAttr> {
        self.threads.get(&tid).and_then(|t| t.sched.applied)
    }
}
