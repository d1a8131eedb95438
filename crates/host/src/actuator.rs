//! The CPU actuator: puts a VM's threads at a [`Level`] and back, remembering what it changed.
//!
//! Invariants:
//! - a thread's original attributes are on disk ([`StateDir`]) before its first change;
//! - only threads listed under `/proc/<qemu pid>/task/` are touched, and the list is re-read
//!   before a change whenever it is older than [`Host::fresh`] (100 ms by default): a thread id
//!   seen there that recently cannot name another process's thread, since the kernel hands out
//!   ids cyclically and would have to go through all `pid_max` of them first;
//! - going back to [`Level::Normal`] restores a thread only if it still has what we set; if
//!   someone else changed it meanwhile, their change stays;
//! - a thread that already runs at a real-time class is never touched (a boost never lowers).

use std::collections::BTreeMap;
use std::io;
use std::time::{Duration, Instant};

use cosched_core::Level;
use cosched_procfs::{ProcFs, TaskId, ThreadRole};
use serde::{Deserialize, Serialize};

use crate::sched::{self, SchedAttr, SCHED_FIFO, SCHED_FLAG_RESET_ON_FORK, SCHED_RR};
use crate::store::{Entry, RestoreReport, Setting, StateDir, ThreadOps, VmRecord};

/// The layer the CPU boost records its changes under.
pub const CPU_LAYER: &str = "cpu";

/// Access to the scheduler: the real syscalls, or a fake in tests.
pub trait SchedOps {
    fn get(&mut self, tid: i32) -> io::Result<SchedAttr>;
    fn set(&mut self, tid: i32, attr: &SchedAttr) -> io::Result<()>;
}

/// `sched_getattr` / `sched_setattr` on the running kernel.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealSched;

impl SchedOps for RealSched {
    fn get(&mut self, tid: i32) -> io::Result<SchedAttr> {
        sched::get(tid)
    }
    fn set(&mut self, tid: i32, attr: &SchedAttr) -> io::Result<()> {
        sched::set(tid, attr)
    }
}

impl ThreadOps for RealSched {
    fn get_ioprio(&mut self, tid: i32) -> io::Result<u16> {
        sched::get_ioprio(tid)
    }
    fn set_ioprio(&mut self, tid: i32, ioprio: u16) -> io::Result<()> {
        sched::set_ioprio(tid, ioprio)
    }
    fn get_affinity(&mut self, tid: i32) -> io::Result<Vec<usize>> {
        sched::get_affinity(tid)
    }
    fn set_affinity(&mut self, tid: i32, cpus: &[usize]) -> io::Result<()> {
        sched::set_affinity(tid, cpus)
    }
}

/// The scheduling class of a boost (config `[boost] policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BoostPolicy {
    /// Every thread `SCHED_RR` at the VM's priority (seed 000).
    Rr,
    /// Every thread `SCHED_FIFO` at the VM's priority.
    Fifo,
    /// vCPU threads get a `SCHED_DEADLINE` reservation (`deadline_runtime_us` every
    /// `deadline_period_us`); the other threads `SCHED_FIFO` at the VM's priority.
    Deadline,
    /// Every thread `SCHED_OTHER` at `boost_nice`: no real-time class at all.
    Nice,
}

impl BoostPolicy {
    /// Whether vCPU threads run at an RT class the kernel's RT throttling applies to, and so
    /// need the real-time guard.
    pub fn needs_rt_guard(self) -> bool {
        matches!(self, BoostPolicy::Rr | BoostPolicy::Fifo)
    }
}

/// How a boosted VM's threads are scheduled (config section `[boost]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BoostClass {
    pub policy: BoostPolicy,
    /// Non-vCPU threads (main loop, I/O threads, workers) run this many priority levels above
    /// the vCPUs. Under TCG the main loop delivers the guest's timer interrupts (seed 002 puts
    /// the I/O thread above the vCPU).
    pub other_threads_priority_offset: u8,
    /// Nice value of the vCPU threads while the real-time guard holds them off the real-time
    /// class ([`Level::Guarded`]).
    pub guard_nice: i32,
    /// `policy = "deadline"`: each vCPU thread's reservation.
    pub deadline_runtime_us: u64,
    pub deadline_period_us: u64,
    /// `policy = "nice"`: the nice value of every thread.
    pub boost_nice: i32,
}

impl Default for BoostClass {
    fn default() -> Self {
        BoostClass {
            policy: BoostPolicy::Rr,
            other_threads_priority_offset: 0,
            guard_nice: -20,
            deadline_runtime_us: 900,
            deadline_period_us: 1000,
            boost_nice: -20,
        }
    }
}

impl BoostClass {
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [("guard_nice", self.guard_nice), ("boost_nice", self.boost_nice)] {
            if !(-20..=19).contains(&v) {
                return Err(format!("{name} = {v} out of range -20..=19"));
            }
        }
        if self.other_threads_priority_offset > 10 {
            return Err("other_threads_priority_offset must be 0..=10".into());
        }
        // The running kernel's sysctls only matter when the reservation is used; the fixed
        // limits always do (a value that can never work is a typo).
        let limits = match self.policy {
            BoostPolicy::Deadline => DeadlineLimits::of_running_kernel(),
            _ => DeadlineLimits { period_min_us: 1, period_max_us: u64::MAX / 1000, max_bandwidth: None },
        };
        self.validate_deadline(&limits)
    }

    /// The checks `sched_setattr(2)` makes on a `SCHED_DEADLINE` reservation
    /// (`__checkparam_dl()` and the admission test in kernel/sched/deadline.c), so that a
    /// reservation the kernel would always refuse is an error at config load, not at every boost.
    pub fn validate_deadline(&self, k: &DeadlineLimits) -> Result<(), String> {
        let (runtime_us, period_us) = (self.deadline_runtime_us, self.deadline_period_us);
        if runtime_us * 1000 < DL_MIN_RUNTIME_NS {
            return Err(format!(
                "deadline_runtime_us = {runtime_us}: below the kernel's minimum SCHED_DEADLINE runtime of \
                 {DL_MIN_RUNTIME_NS} ns (2^DL_SCALE); use at least {} µs",
                DL_MIN_RUNTIME_NS.div_ceil(1000)
            ));
        }
        if period_us < k.period_min_us || period_us > k.period_max_us {
            return Err(format!(
                "deadline_period_us = {period_us}: outside the kernel's {}..={} µs \
                 (/proc/sys/kernel/sched_deadline_period_min_us, _max_us)",
                k.period_min_us, k.period_max_us
            ));
        }
        if runtime_us > period_us {
            return Err(format!("deadline_runtime_us = {runtime_us} must be at most deadline_period_us = {period_us}"));
        }
        if let Some((rt_runtime_us, rt_period_us)) = k.max_bandwidth {
            // One reservation may use at most sched_rt_runtime_us / sched_rt_period_us of a CPU.
            if runtime_us as u128 * rt_period_us as u128 > rt_runtime_us as u128 * period_us as u128 {
                return Err(format!(
                    "deadline_runtime_us / deadline_period_us = {runtime_us}/{period_us}: above the kernel's \
                     admission limit of {rt_runtime_us}/{rt_period_us} of a CPU (sched_rt_runtime_us / \
                     sched_rt_period_us)"
                ));
            }
        }
        Ok(())
    }

    /// Target attributes of a thread, or `None` for its original ones. `vcpus_known` is false
    /// when QEMU runs without `debug-threads=on`: then every thread but the main one is treated
    /// as a vCPU.
    pub fn target(&self, level: Level, role: ThreadRole, vcpus_known: bool, priority: u8) -> Option<SchedAttr> {
        let is_vcpu = role == ThreadRole::Vcpu || (!vcpus_known && role != ThreadRole::Main);
        let rt = |policy: u32, offset: u8| {
            let prio = (priority as u32 + offset as u32).min(*cosched_core::VM_PRIORITY.end() as u32);
            SchedAttr::rt(policy, prio, SCHED_FLAG_RESET_ON_FORK)
        };
        let offset = if is_vcpu { 0 } else { self.other_threads_priority_offset };
        if level == Level::Normal {
            return None;
        }
        Some(match self.policy {
            BoostPolicy::Rr | BoostPolicy::Fifo if level == Level::Guarded && is_vcpu => {
                SchedAttr::other(self.guard_nice, SCHED_FLAG_RESET_ON_FORK)
            }
            BoostPolicy::Rr => rt(SCHED_RR, offset),
            BoostPolicy::Fifo => rt(SCHED_FIFO, offset),
            BoostPolicy::Deadline if is_vcpu => SchedAttr::deadline(
                self.deadline_runtime_us * 1000,
                self.deadline_period_us * 1000,
                SCHED_FLAG_RESET_ON_FORK,
            ),
            BoostPolicy::Deadline => rt(SCHED_FIFO, offset),
            BoostPolicy::Nice => SchedAttr::other(self.boost_nice, SCHED_FLAG_RESET_ON_FORK),
        })
    }
}

/// `sched_runtime` below 2^DL_SCALE ns is refused by `__checkparam_dl()`.
pub const DL_MIN_RUNTIME_NS: u64 = 1 << 10;

/// The running kernel's limits on a `SCHED_DEADLINE` reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadlineLimits {
    pub period_min_us: u64,
    pub period_max_us: u64,
    /// (`sched_rt_runtime_us`, `sched_rt_period_us`), `None` when unlimited (runtime -1).
    pub max_bandwidth: Option<(u64, u64)>,
}

impl Default for DeadlineLimits {
    /// The kernel's defaults.
    fn default() -> Self {
        DeadlineLimits { period_min_us: 100, period_max_us: 1 << 22, max_bandwidth: Some((950_000, 1_000_000)) }
    }
}

impl DeadlineLimits {
    /// Read from `/proc/sys/kernel`; a value that cannot be read keeps the kernel's default.
    pub fn of_running_kernel() -> DeadlineLimits {
        DeadlineLimits::read(std::path::Path::new("/proc/sys/kernel"))
    }

    pub fn read(dir: &std::path::Path) -> DeadlineLimits {
        let num = |f: &str| std::fs::read_to_string(dir.join(f)).ok().and_then(|s| s.trim().parse::<i64>().ok());
        let d = DeadlineLimits::default();
        let (rt_runtime, rt_period) = d.max_bandwidth.unwrap();
        DeadlineLimits {
            period_min_us: num("sched_deadline_period_min_us").map_or(d.period_min_us, |v| v.max(0) as u64),
            period_max_us: num("sched_deadline_period_max_us").map_or(d.period_max_us, |v| v.max(0) as u64),
            max_bandwidth: match num("sched_rt_runtime_us") {
                Some(-1) => None,
                r => Some((
                    r.map_or(rt_runtime, |v| v.max(0) as u64),
                    num("sched_rt_period_us").map_or(rt_period, |v| v.max(1) as u64),
                )),
            },
        }
    }
}

/// Everything the actuator needs from the outside world.
pub struct Host {
    pub procfs: ProcFs,
    pub sched: Box<dyn ThreadOps>,
    pub store: StateDir,
    pub class: BoostClass,
    /// How long a listing of a VM's threads is trusted before a change needs a new one.
    pub fresh: Duration,
    /// How long the threads' attributes as we know them are trusted before a change reads them
    /// again (someone else may have changed them).
    pub verify: Duration,
    /// Time spent in `sched_setattr` on behalf of transitions (the cost breakdown).
    pub syscall_ns: u64,
}

#[derive(Debug, Clone)]
struct Tracked {
    task: TaskId,
    comm: String,
    role: ThreadRole,
    original: SchedAttr,
    /// What we set and the thread still has, as far as we know.
    applied: Option<SchedAttr>,
    /// Every value we may set on it (persisted before any is set): what tells a restore that
    /// the thread's present value is ours.
    may_apply: Vec<SchedAttr>,
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

/// A thread as shown by `cosched status`.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadView {
    pub tid: i32,
    pub comm: String,
    pub role: ThreadRole,
    pub sched: String,
    pub boosted: bool,
}

/// The threads of one VM and what we did to them.
#[derive(Debug)]
pub struct VmCpu {
    pub name: String,
    pub process: TaskId,
    threads: BTreeMap<i32, Tracked>,
    level: Level,
    priority: u8,
    /// The originals of every tracked thread are on disk.
    persisted: bool,
    /// vCPUs from QEMU's command line, for when its threads have no names.
    smp: u32,
    /// When the task directory was last listed (membership of every tracked thread verified).
    listed_at: Option<Instant>,
    /// When every thread's attributes were last read.
    verified_at: Option<Instant>,
}

impl VmCpu {
    /// Tracks the threads of QEMU process `process` (nothing is changed). If a record of this
    /// process is on disk (a restore that failed earlier), its originals are the originals: the
    /// threads' present attributes may be ours.
    pub fn new(name: &str, process: TaskId, env: &mut Host) -> io::Result<VmCpu> {
        let mut vm = VmCpu {
            name: name.to_string(),
            process,
            threads: BTreeMap::new(),
            level: Level::Normal,
            priority: 1,
            persisted: false,
            smp: env.procfs.cmdline(process.id).map(|a| cosched_procfs::qemu_smp(&a)).unwrap_or(1),
            listed_at: None,
            verified_at: None,
        };
        vm.rescan(env).map_err(io::Error::other)?;
        let rec = env.store.load(process).map_err(|e| {
            io::Error::other(format!("its state record cannot be used ({e}); not coordinating it until that is fixed"))
        })?;
        for e in rec.map(|r| r.entries).unwrap_or_default() {
            let (CPU_LAYER, Setting::Sched { original, applied }) = (e.layer.as_str(), e.setting) else { continue };
            let Some(t) = vm.threads.get_mut(&e.task.id).filter(|t| t.task == e.task) else { continue };
            let current = t.original;
            // The restore's own decision: a value the record says we applied is still ours.
            let layers = [(CPU_LAYER, &original, applied.as_slice())];
            if crate::store::undo_value(&layers, &current, SchedAttr::same_as).is_some() {
                t.applied = Some(current); // still ours: the next deboost puts it back
            }
            t.original = original;
            t.may_apply = applied;
        }
        Ok(vm)
    }

    pub fn level(&self) -> Level {
        self.level
    }

    pub fn thread_count(&self) -> usize {
        self.threads.len()
    }

    pub fn threads(&self) -> Vec<ThreadView> {
        self.threads
            .iter()
            .map(|(tid, t)| ThreadView {
                tid: *tid,
                comm: t.comm.clone(),
                role: t.role,
                sched: t.applied.unwrap_or(t.original).to_string(),
                boosted: t.applied.is_some(),
            })
            .collect()
    }

    /// vCPU threads (named `CPU n/...`), or QEMU's `-smp` when no thread carries such a name.
    pub fn vcpu_count(&self) -> u32 {
        match self.threads.values().filter(|t| t.role == ThreadRole::Vcpu).count() {
            0 => self.smp,
            n => n as u32,
        }
    }

    fn vcpus_known(&self) -> bool {
        self.threads.values().any(|t| t.role == ThreadRole::Vcpu)
    }

    /// Re-reads the thread list: new threads are tracked (their attributes read as original),
    /// exited ones dropped. Does not change anything.
    /// Returns how many tracked threads were gone.
    fn rescan(&mut self, env: &mut Host) -> Result<u32, cosched_procfs::Error> {
        let list = env.procfs.threads(self.process.id)?;
        self.listed_at = Some(Instant::now());
        let live: BTreeMap<i32, _> = list.into_iter().map(|t| (t.task.id, t)).collect();
        let before = self.threads.len();
        self.threads.retain(|tid, t| live.get(tid).is_some_and(|l| l.task == t.task));
        let gone = (before - self.threads.len()) as u32;
        for (tid, info) in live {
            if let Some(t) = self.threads.get_mut(&tid) {
                // QEMU names a thread from inside it, after creation: the role may change.
                t.comm = info.comm;
                t.role = info.role;
                continue;
            }
            self.track(env, info);
        }
        Ok(gone)
    }

    /// Lists the task directory without re-reading the known threads: drops threads that
    /// exited and tracks newcomers (one `readdir` plus a `stat` per newcomer).
    /// Returns how many tracked threads were gone.
    fn list(&mut self, env: &mut Host) -> Result<u32, cosched_procfs::Error> {
        let ids: std::collections::BTreeSet<i32> = env.procfs.thread_ids(self.process.id)?.into_iter().collect();
        self.listed_at = Some(Instant::now());
        let before = self.threads.len();
        self.threads.retain(|tid, _| ids.contains(tid));
        let gone = (before - self.threads.len()) as u32;
        for tid in ids {
            if self.threads.contains_key(&tid) {
                continue;
            }
            if let Ok(info) = env.procfs.thread(self.process.id, tid) {
                self.track(env, info);
            }
        }
        Ok(gone)
    }

    fn track(&mut self, env: &mut Host, info: cosched_procfs::ThreadInfo) {
        let Ok(original) = env.sched.get(info.task.id) else { return }; // exited meanwhile
        let t = Tracked {
            task: info.task,
            comm: info.comm,
            role: info.role,
            original,
            applied: None,
            may_apply: Vec::new(),
        };
        self.threads.insert(info.task.id, t);
        self.persisted = false;
    }

    fn record(&self) -> VmRecord {
        let entries = self
            .threads
            .values()
            .filter(|t| !t.may_apply.is_empty())
            .map(|t| Entry {
                task: t.task,
                layer: CPU_LAYER.into(),
                setting: Setting::Sched { original: t.original, applied: t.may_apply.clone() },
            })
            .collect();
        VmRecord::new(&self.name, self.process, entries)
    }

    /// Puts every thread at `level`. With `rescan` the whole thread list is re-read (names,
    /// roles, exits, newcomers); otherwise it is listed again only if the last listing is older
    /// than [`Host::fresh`] (see the module documentation).
    pub fn set_level(&mut self, env: &mut Host, level: Level, priority: u8, rescan: bool) -> Outcome {
        let mut out = Outcome::default();
        let stale = self.listed_at.is_none_or(|t| t.elapsed() >= env.fresh);
        let found = if rescan {
            self.rescan(env)
        } else if stale {
            self.list(env)
        } else {
            Ok(0)
        };
        match found {
            Ok(gone) => out.gone = gone,
            Err(e) if e.is_gone() => {
                out.gone = self.threads.len() as u32; // the process exited: nothing to change
                self.threads.clear();
            }
            Err(e) => {
                // Never touch threads whose membership we could not check.
                out.errors.push(format!("{}: reading threads: {e}", self.name));
                return out;
            }
        }
        self.level = level;
        self.priority = priority;
        if self.verified_at.is_none_or(|t| t.elapsed() >= env.verify) {
            self.verify(env, &mut out);
        }
        let vcpus_known = self.vcpus_known();
        let class = &env.class;
        let target = |t: &Tracked| {
            if t.original.is_realtime() {
                None // never lower a thread that is already real-time
            } else {
                class.target(level, t.role, vcpus_known, priority)
            }
        };
        // Every value about to be set is recorded as one we may apply, before it is set.
        let mut any_target = false;
        for t in self.threads.values_mut() {
            let Some(attr) = target(t) else { continue };
            any_target = true;
            if !t.may_apply.contains(&attr) {
                t.may_apply.push(attr);
                self.persisted = false;
            }
        }
        // Persist before changing anything. If that fails nothing is changed; the level stays
        // what was asked, so the next refresh tries again.
        if any_target && !self.persisted {
            if let Err(e) = env.store.save(&self.record()) {
                out.errors.push(format!(
                    "{}: not boosting: cannot save original attributes in {}: {e}",
                    self.name,
                    env.store.path().display()
                ));
                return out;
            }
            self.persisted = true;
        }

        // One sched_setattr per thread that changes, and nothing else: what a thread has was
        // checked by the last verification (see `verify`).
        let mut gone = Vec::new();
        for (tid, t) in self.threads.iter_mut() {
            let want = target(t);
            if want == t.applied {
                continue;
            }
            let attr = want.unwrap_or(t.original);
            let started = Instant::now();
            let result = env.sched.set(*tid, &attr);
            env.syscall_ns += started.elapsed().as_nanos() as u64;
            match result {
                Ok(()) => {
                    out.changed += 1;
                    t.applied = want;
                }
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => gone.push(*tid),
                Err(e) => out.errors.push(sched::explain_set_error(*tid, &attr, &e)),
            }
        }
        out.gone += gone.len() as u32;
        for tid in gone {
            self.threads.remove(&tid);
        }
        out
    }

    /// Reads every thread's attributes and takes in what someone else changed: a thread at its
    /// own attributes gets its present ones as original (the operator may have made it
    /// real-time, which a boost must not lower); a thread that no longer has what we set keeps
    /// the other's change, and we let go of it. Runs before a change when the last run is older
    /// than [`Host::verify`], so a transition costs no `sched_getattr` in between.
    fn verify(&mut self, env: &mut Host, out: &mut Outcome) {
        for (tid, t) in self.threads.iter_mut() {
            let Ok(cur) = env.sched.get(*tid) else { continue }; // gone: the change will say so
            match t.applied {
                None if !cur.same_as(&t.original) => {
                    t.original = cur;
                    self.persisted = false;
                }
                Some(applied) if !cur.same_as(&applied) => {
                    out.foreign += 1;
                    t.original = cur;
                    t.applied = None;
                    self.persisted = false;
                }
                _ => {}
            }
        }
        self.verified_at = Some(Instant::now());
    }

    pub fn priority(&self) -> u8 {
        self.priority
    }

    /// A thread of this VM was created, renamed or exited (seen by the host BPF). Updates what
    /// is tracked, changes nothing; returns whether anything changed (the caller then brings
    /// the VM's threads to its level again).
    pub fn thread_event(&mut self, env: &mut Host, ev: &cosched_hostbpf::ThreadEvent) -> bool {
        use cosched_hostbpf::ThreadEvent;
        match ev {
            ThreadEvent::Exited { tid, .. } => self.threads.remove(tid).is_some(),
            ThreadEvent::Created { tid, .. } | ThreadEvent::Renamed { tid, .. } => {
                // Read from /proc: a thread id the VM's task directory does not list is not ours.
                let Ok(info) = env.procfs.thread(self.process.id, *tid) else { return false };
                match self.threads.get_mut(tid) {
                    Some(t) if t.task == info.task => {
                        let changed = t.role != info.role;
                        t.comm = info.comm;
                        t.role = info.role;
                        changed
                    }
                    _ => {
                        self.threads.remove(tid);
                        self.track(env, info);
                        true
                    }
                }
            }
        }
    }

    /// Re-reads the thread list and brings threads that appeared since to the current level.
    pub fn refresh(&mut self, env: &mut Host) -> Outcome {
        self.set_level(env, self.level, self.priority, true)
    }

    /// Puts everything back and removes the record from disk.
    /// Puts everything back through the one restore logic ([`crate::store::restore_record`],
    /// the same that runs after a crash) and removes the record from disk once it is done.
    pub fn restore(&mut self, env: &mut Host) -> RestoreReport {
        self.level = Level::Normal;
        let mut report = crate::store::restore_record(&self.record(), &env.procfs, env.sched.as_mut());
        if report.errors.is_empty() {
            if let Err(e) = env.store.remove(self.process) {
                report.errors.push(format!("{}: removing state record: {e}", self.name));
            }
            for t in self.threads.values_mut() {
                t.applied = None;
                t.may_apply.clear();
            }
            self.persisted = false;
        }
        report
    }
}

#[cfg(test)]
mod tests;
