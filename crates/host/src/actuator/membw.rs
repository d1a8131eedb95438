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
//!   Only threads QEMU names vCPUs move: a QEMU without `debug-threads=on` is not throttled
//!   (said at each throttle), rather than every thread but its main one stopped. A thread that
//!   loses its vCPU name while stopped is moved back at once.
//! - cgroup v2: a process's threads share one group outside a threaded subtree, so the throttle
//!   freezes the VM's own group (`cgroup.freeze`), all of its threads; only a VM alone in its
//!   group (libvirt's `machine-*.scope`) can be throttled.
//!
//! Where resctrl offers memory-bandwidth allocation ([`crate::membw::Mba`]), the lever is MBA
//! instead: each vCPU thread moves into `/cosched-membw-<pid>`, a resctrl control group of the
//! daemon's (one per VM, made at its first throttle) whose `MB` line is the floor, and back to
//! the default group; the vCPUs keep running, their memory traffic slowed. Only threads in the
//! default group move (one that someone else placed in a group of theirs is left there).
//!
//! Every value is recorded before it is set and undone through the one restore logic
//! ([`crate::store`]), after `kill -9` too: the threads are moved back (which thaws them) and
//! the frozen group removed. The actuator is [`LeverActuator::throttle`], a
//! [`LeverActuator`] with one of these levers.

use std::path::PathBuf;

use cosched_procfs::{ThreadInfo, ThreadRole};
use cosched_proto::Resource;

use super::class::is_vcpu;
use super::lever::{GroupLever, GroupValueLever, LeverActuator};
use crate::cgroup::{CgroupFs, MEMBW_GROUP_PREFIX};
use crate::membw::FreezerChoice;

/// The layer the throttle records its changes under (the resource's name).
pub const THROTTLE_LAYER: &str = "membw";
/// The prefix of the frozen groups the v1 lever creates.
pub const THROTTLE_GROUP_PREFIX: &str = MEMBW_GROUP_PREFIX;
/// The v1 controller.
pub const FREEZER: &str = "freezer";
/// A v1 freezer group's state file, and the states the throttle writes to it (a restore thaws).
pub const V1_STATE: &str = "freezer.state";
pub const V1_FROZEN: &str = "FROZEN";
pub const V1_THAWED: &str = "THAWED";
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

/// What holds back a VM over its budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThrottleLever {
    Freezer(FreezerKind),
    /// resctrl MBA: the `schemata` of a held-back VM's group.
    Mba {
        schemata: String,
        describe: String,
    },
}

impl ThrottleLever {
    pub fn describe(&self) -> String {
        match self {
            ThrottleLever::Freezer(k) => k.describe().to_string(),
            ThrottleLever::Mba { describe, .. } => describe.clone(),
        }
    }
}

/// Finds the freezer `choice` asks for, or says why there is none. `auto` takes the v1
/// `freezer` controller where it is bound (it stops the vCPU threads alone, leaving QEMU's main
/// loop and I/O threads running), else the v2 hierarchy's `cgroup.freeze` (the VM's whole
/// group). On a hybrid host both are real: `[membw] freezer = "v2"` takes the v2 one.
pub fn freezer(cg: &CgroupFs, choice: FreezerChoice) -> Result<FreezerKind, FreezerUnsupported> {
    let v1 = cg.has_hierarchy(FREEZER);
    // Every non-root v2 group has cgroup.freeze (Linux 5.2+); the root has none to look at.
    let v2 = cg.has_hierarchy("");
    let (v1_dir, v2_root) = (cg.dir(FREEZER, "/"), cg.v2_root());
    match choice {
        FreezerChoice::Auto if v1 => Ok(FreezerKind::V1),
        FreezerChoice::Auto if v2 => Ok(FreezerKind::V2),
        FreezerChoice::Auto => Err(FreezerUnsupported::None { v1: v1_dir, v2: v2_root }),
        FreezerChoice::V1 if v1 => Ok(FreezerKind::V1),
        FreezerChoice::V1 => Err(FreezerUnsupported::NoV1 { v1: v1_dir }),
        FreezerChoice::V2 if v2 => Ok(FreezerKind::V2),
        FreezerChoice::V2 => Err(FreezerUnsupported::NoV2 { v2: v2_root }),
    }
}

/// Why there is no freezer to throttle with: where it looked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FreezerUnsupported {
    /// `auto`, and neither hierarchy.
    #[error(
        "no cgroup v1 freezer hierarchy at {} and no cgroup v2 hierarchy at {}: nothing can stop a VM's vCPUs",
        .v1.display(),
        .v2.display()
    )]
    None { v1: PathBuf, v2: PathBuf },
    /// `[membw] freezer = "v1"`, and no v1 hierarchy.
    #[error("[membw] freezer = \"v1\" but there is no cgroup v1 freezer hierarchy at {}", .v1.display())]
    NoV1 { v1: PathBuf },
    /// `[membw] freezer = "v2"`, and no v2 hierarchy.
    #[error("[membw] freezer = \"v2\" but there is no cgroup v2 hierarchy at {}", .v2.display())]
    NoV2 { v2: PathBuf },
}

fn vcpus(t: &ThreadInfo, vcpus_known: bool) -> bool {
    is_vcpu(t.role, vcpus_known)
}

/// The threads QEMU names vCPUs, and none when it names none: the freezer stops what it takes,
/// and a guess (every thread but the main one) would stop QEMU's I/O threads, its workers and
/// whatever relays its chardevs, with no end while they stay in the frozen group.
fn named_vcpus(t: &ThreadInfo, _: bool) -> bool {
    t.role == ThreadRole::Vcpu
}

/// What the v1 throttle says of a VM whose QEMU names no vCPU thread.
pub const UNNAMED_VCPUS: &str = "memory-bandwidth throttle not applied: the cgroup v1 freezer stops the VM's vCPU \
                                 threads only, and its QEMU names none (start it with -name NAME,debug-threads=on, \
                                 as libvirt does)";

impl LeverActuator {
    /// The memory-bandwidth throttle on the lever found (see [`freezer`] and
    /// [`crate::membw::Mba`]): the vCPUs stopped or slowed at `Level::Throttled`.
    pub fn throttle(lever: &ThrottleLever) -> LeverActuator {
        match lever {
            // cgroup v1: vCPU threads into `<their group>/cosched-membw-<pid>`, made `FROZEN`;
            // FREEZING until every thread moved in is frozen.
            ThrottleLever::Freezer(FreezerKind::V1) => LeverActuator::new(
                Resource::Membw,
                GroupLever {
                    hierarchy: FREEZER,
                    prefix: THROTTLE_GROUP_PREFIX,
                    file: V1_STATE,
                    value: V1_FROZEN.into(),
                    members: named_vcpus,
                    named_vcpus_only: Some(UNNAMED_VCPUS),
                    flat: false,
                    settles: true,
                },
            ),
            // cgroup v2: `cgroup.freeze` of the VM's own group, in force once `cgroup.events`
            // says `frozen 1`.
            ThrottleLever::Freezer(FreezerKind::V2) => LeverActuator::new(
                Resource::Membw,
                GroupValueLever {
                    file: V2_FREEZE,
                    label: "freeze",
                    why: "the throttle in cgroup v2 freezes a whole group",
                    raised: 1,
                    frozen_event: true,
                },
            ),
            // resctrl: vCPU threads of the default group into `/cosched-membw-<pid>`, whose
            // `schemata` is the floor; a thread in the group is slowed at once.
            ThrottleLever::Mba { schemata, .. } => LeverActuator::new(
                Resource::Membw,
                GroupLever {
                    hierarchy: crate::cgroup::RESCTRL,
                    prefix: THROTTLE_GROUP_PREFIX,
                    file: "schemata",
                    value: schemata.clone(),
                    members: vcpus,
                    named_vcpus_only: None,
                    flat: true,
                    settles: false,
                },
            ),
        }
    }
}
