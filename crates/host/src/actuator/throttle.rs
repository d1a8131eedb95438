//! The memory-bandwidth throttle: a VM over its budget has its vCPU threads stopped until the
//! regulation period ends (MemGuard stops the core), then let run again.
//!
//! The lever is the cgroup freezer, which stops a thread of any scheduling class. (The CPU
//! controller's bandwidth limit does not stop a `SCHED_RR` thread, and a vCPU the CPU
//! coordination boosts is one; with `RT_GROUP_SCHED` a child CPU group even refuses it.)
//! - cgroup v1 (`freezer` hierarchy, threads placed one by one): stopping moves each vCPU
//!   thread into `<its group>/cosched-membw-<pid>`, a group of the daemon's that stays
//!   `FROZEN`; the kernel freezes a thread as it enters a frozen group and thaws it as it
//!   leaves for a thawed one, so letting it run is moving it back. One write per vCPU thread
//!   each way; the group is created at the first stop and removed when the VM is restored.
//! - cgroup v2: a process's threads share one group outside a threaded subtree, so the throttle
//!   freezes the VM's own group (`cgroup.freeze`), all of its threads; only a VM alone in its
//!   group (libvirt's `machine-*.scope`) can be throttled.
//!
//! Every value is recorded before it is set and undone through the one restore logic
//! ([`crate::store`]), after `kill -9` too: the threads are moved back (which thaws them) and
//! the frozen group removed.

use std::io;

use cosched_core::Level;
use cosched_procfs::{TaskId, ThreadInfo, ThreadRole};
use cosched_proto::Resource;

use super::block::{own_v2_group, Knob, PerThread};
use super::{Actuator, Host, Outcome, Prepared, Threads};
use crate::cgroup::CgroupFs;
use crate::store::{Entry, Setting};

/// The layer the throttle records its changes under (the resource's name).
pub const THROTTLE_LAYER: &str = "membw";
/// The prefix of the frozen groups the v1 lever creates.
pub const THROTTLE_GROUP_PREFIX: &str = "cosched-membw-";
/// The v1 controller.
pub const FREEZER: &str = "freezer";
const V2_FREEZE: &str = "cgroup.freeze";

/// Which freezer the throttle uses here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreezerKind {
    /// cgroup v1 `freezer`: vCPU threads move into a frozen group.
    V1,
    /// cgroup v2 `cgroup.freeze` of the VM's own group.
    V2,
}

impl FreezerKind {
    pub fn describe(self) -> &'static str {
        match self {
            FreezerKind::V1 => "cgroup v1 freezer (vCPU threads into a frozen group)",
            FreezerKind::V2 => "cgroup v2 cgroup.freeze (the VM's own group)",
        }
    }
}

/// Finds the freezer, or says why there is none.
pub fn freezer(cg: &CgroupFs) -> Result<FreezerKind, String> {
    if cg.has_hierarchy(FREEZER) {
        return Ok(FreezerKind::V1);
    }
    if cg.has_hierarchy("") {
        // Every non-root v2 group has cgroup.freeze (Linux 5.2+); the root has none to look at.
        return Ok(FreezerKind::V2);
    }
    Err(format!(
        "no cgroup v1 freezer hierarchy at {} and no cgroup v2 hierarchy at {}: nothing can stop a VM's vCPUs",
        cg.dir(FREEZER, "/").display(),
        cg.root().display()
    ))
}

/// Whether a thread is a vCPU (without thread names: every thread but the main one).
fn is_vcpu(process: TaskId, t: &ThreadInfo, vcpus_known: bool) -> bool {
    t.role == ThreadRole::Vcpu || (!vcpus_known && t.task != process)
}

/// cgroup v1: the thread's `freezer` group.
#[derive(Debug)]
struct V1FreezerKnob;

impl V1FreezerKnob {
    fn own_group(process: TaskId, group: &str) -> String {
        format!("{}/{THROTTLE_GROUP_PREFIX}{}", group.trim_end_matches('/'), process.id)
    }

    fn is_own(group: &str) -> bool {
        group.rsplit('/').next().is_some_and(|leaf| leaf.starts_with(THROTTLE_GROUP_PREFIX))
    }
}

impl Knob for V1FreezerKnob {
    type V = String;
    fn layer(&self) -> &'static str {
        THROTTLE_LAYER
    }
    fn applies_to(&self, process: TaskId, t: &ThreadInfo, vcpus_known: bool) -> bool {
        is_vcpu(process, t, vcpus_known)
    }
    fn get(&self, env: &mut Host, tid: i32) -> io::Result<String> {
        env.sched.get_cgroup(tid, FREEZER)
    }
    fn set(&self, env: &mut Host, tid: i32, group: &String) -> io::Result<()> {
        if Self::is_own(group) {
            let cg = env.sched.cgroups().clone();
            if !cg.dir(FREEZER, group).is_dir() {
                cg.make_group(FREEZER, group)?;
                if let Err(e) = cg.write(FREEZER, group, "freezer.state", "FROZEN") {
                    let _ = cg.remove_group(FREEZER, group);
                    return Err(io::Error::new(e.kind(), format!("freezing {group}: {e}")));
                }
            }
        }
        env.sched.set_cgroup(tid, FREEZER, group)
    }
    fn target(&self, process: TaskId, original: &String) -> Option<String> {
        (!Self::is_own(original)).then(|| Self::own_group(process, original))
    }
    fn setting(&self, original: &String, applied: &[String]) -> Setting {
        Setting::Cgroup { hierarchy: FREEZER.into(), original: original.clone(), applied: applied.to_vec() }
    }
    fn parse_setting(&self, s: &Setting) -> Option<(String, Vec<String>)> {
        match s {
            Setting::Cgroup { hierarchy, original, applied } if hierarchy == FREEZER => {
                Some((original.clone(), applied.clone()))
            }
            _ => None,
        }
    }
    fn show(&self, v: &String) -> (&'static str, String) {
        ("freezer", v.clone())
    }
    /// A thread born in our frozen group belongs where the group is.
    fn born_into(&self, current: &String, _: Option<&String>) -> String {
        if Self::is_own(current) {
            match current.rsplit_once('/') {
                Some((parent, _)) if !parent.is_empty() => parent.to_string(),
                _ => "/".to_string(),
            }
        } else {
            current.clone()
        }
    }
}

/// cgroup v2: `cgroup.freeze` of the VM's own group, kept on its main thread.
#[derive(Debug)]
struct V2FreezeKnob;

impl Knob for V2FreezeKnob {
    /// (group, cgroup.freeze)
    type V = (String, u32);
    fn layer(&self) -> &'static str {
        THROTTLE_LAYER
    }
    fn applies_to(&self, process: TaskId, t: &ThreadInfo, _: bool) -> bool {
        t.task == process
    }
    fn get(&self, env: &mut Host, tid: i32) -> io::Result<(String, u32)> {
        let group = own_v2_group(env, tid, "the throttle in cgroup v2 freezes a whole group")?;
        let v = env.sched.cgroups().read("", &group, V2_FREEZE)?;
        let frozen = v.parse().map_err(|_| io::Error::other(format!("{V2_FREEZE} of {group}: {v:?}")))?;
        Ok((group, frozen))
    }
    fn set(&self, env: &mut Host, _: i32, v: &(String, u32)) -> io::Result<()> {
        env.sched.cgroups().write("", &v.0, V2_FREEZE, &v.1.to_string())
    }
    fn target(&self, _: TaskId, original: &(String, u32)) -> Option<(String, u32)> {
        (original.1 == 0).then(|| (original.0.clone(), 1))
    }
    fn setting(&self, original: &(String, u32), applied: &[(String, u32)]) -> Setting {
        Setting::GroupWeight {
            hierarchy: String::new(),
            group: original.0.clone(),
            file: V2_FREEZE.into(),
            original: original.1,
            applied: applied.iter().map(|a| a.1).collect(),
        }
    }
    fn parse_setting(&self, s: &Setting) -> Option<((String, u32), Vec<(String, u32)>)> {
        match s {
            Setting::GroupWeight { hierarchy, group, file, original, applied }
                if hierarchy.is_empty() && file == V2_FREEZE =>
            {
                Some(((group.clone(), *original), applied.iter().map(|w| (group.clone(), *w)).collect()))
            }
            _ => None,
        }
    }
    fn show(&self, v: &(String, u32)) -> (&'static str, String) {
        ("freeze", format!("{} {}", v.0, v.1))
    }
}

#[derive(Debug)]
enum Lever {
    V1(PerThread<V1FreezerKnob>),
    V2(PerThread<V2FreezeKnob>),
}

macro_rules! each {
    ($self:expr, $p:ident => $e:expr) => {
        match $self {
            Lever::V1($p) => $e,
            Lever::V2($p) => $e,
        }
    };
}

/// Stops a VM's vCPUs at [`Level::Throttled`], lets them run at [`Level::Normal`].
#[derive(Debug)]
pub struct ThrottleActuator {
    lever: Lever,
    level: Level,
}

impl ThrottleActuator {
    pub fn new(kind: FreezerKind) -> ThrottleActuator {
        let lever = match kind {
            FreezerKind::V1 => Lever::V1(PerThread::new(V1FreezerKnob)),
            FreezerKind::V2 => Lever::V2(PerThread::new(V2FreezeKnob)),
        };
        ThrottleActuator { lever, level: Level::Normal }
    }
}

impl Actuator for ThrottleActuator {
    fn resource(&self) -> Resource {
        Resource::Membw
    }

    fn level(&self) -> Level {
        self.level
    }

    fn priority(&self) -> u8 {
        0
    }

    fn resume(&mut self, env: &mut Host, threads: &Threads, entries: &[Entry]) {
        each!(&mut self.lever, p => p.resume(env, threads, entries))
    }

    fn prepare(&mut self, env: &mut Host, threads: &Threads, level: Level, _: u8, out: &mut Outcome) -> Prepared {
        self.level = level;
        each!(&mut self.lever, p => p.prepare(env, threads, level != Level::Normal, out))
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
}
