//! The I/O actuator (after the Virtual-BFQ paper): while a guest's BFQ has weight-raised busy
//! queues (`IO 1`), the VM's I/O-issuing threads are raised on the host's BFQ, and put back at
//! `IO 0`.
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
//! restore logic ([`crate::store`]), after `kill -9` too. The actuator is a [`LeverActuator`]
//! with one of these levers.

use std::path::PathBuf;

use cosched_core::ConfigError;
use cosched_procfs::{TaskId, ThreadInfo, ThreadRole};
use cosched_proto::Resource;
use serde::{Deserialize, Serialize};

use super::lever::{GroupLever, GroupValueLever, Lever, LeverActuator};
use crate::cgroup::{weight_text, CgroupFs, IO_GROUP_PREFIX};
use crate::settings::IoprioKind;

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
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.ioprio_level > 7 {
            return Err(ConfigError::invalid("[io] ioprio_level", self.ioprio_level, "must be 0..=7"));
        }
        if !(1..=1000).contains(&self.weight) {
            return Err(ConfigError::invalid("[io] weight", self.weight, "must be 1..=1000 (BFQ's range)"));
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

/// Why the `weight` lever cannot act here: where it looked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WeightUnsupported {
    /// A v1 `blkio` hierarchy without BFQ's files.
    #[error(
        "the blkio hierarchy at {} has no BFQ weights ({V1_WEIGHT}): the kernel has no BFQ with cgroup support",
        .blkio.display()
    )]
    NoBfq { blkio: PathBuf },
    /// Neither a v1 `blkio` hierarchy nor a v2 `io` controller.
    #[error(
        "no cgroup v1 blkio hierarchy at {} and no io controller in the cgroup v2 hierarchy at {}",
        .blkio.display(),
        .v2_root.display()
    )]
    NoHierarchy { blkio: PathBuf, v2_root: PathBuf },
}

/// Finds where the `weight` lever can act, or says why it cannot.
pub fn weight_hierarchy(cg: &CgroupFs) -> Result<WeightHierarchy, WeightUnsupported> {
    let blkio = cg.dir(BLKIO, "/");
    if cg.has_hierarchy(BLKIO) {
        if bfq_v1_files(cg) {
            return Ok(WeightHierarchy::V1);
        }
        return Err(WeightUnsupported::NoBfq { blkio });
    }
    if cg.v2_controllers().iter().any(|c| c == "io") {
        return Ok(WeightHierarchy::V2);
    }
    Err(WeightUnsupported::NoHierarchy { blkio, v2_root: cg.root().to_path_buf() })
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

/// Every I/O thread to the real-time I/O class, at `raised`.
#[derive(Debug)]
struct IoprioLever {
    raised: u16,
}

impl Lever for IoprioLever {
    type K = IoprioKind;
    fn kind(&self) -> IoprioKind {
        IoprioKind
    }
    fn member(&self, _: TaskId, t: &ThreadInfo, vcpus_known: bool) -> bool {
        issues_io(t.role, vcpus_known)
    }
    fn target(&self, _: TaskId, original: &u16) -> Option<u16> {
        // Never lower a thread the operator put in the real-time class.
        (original >> IOPRIO_CLASS_SHIFT != IOPRIO_CLASS_RT).then_some(self.raised)
    }
    /// A thread created by a raised thread inherits its I/O priority (`copy_io`): ours. Its
    /// creator is not known; QEMU creates workers from its main loop or iothreads, which had
    /// the main thread's priority unless someone set them apart, so that is its original.
    fn born_into(&self, current: &u16, main: Option<&u16>) -> u16 {
        if *current == self.raised {
            main.copied().unwrap_or(0)
        } else {
            *current
        }
    }
}

impl LeverActuator {
    /// The I/O actuator for `boost`'s lever; the `weight` lever on the hierarchy found (see
    /// [`weight_hierarchy`]).
    pub fn io(boost: &IoBoost, hierarchy: Option<WeightHierarchy>) -> LeverActuator {
        match (boost.lever, hierarchy) {
            (IoLever::Ioprio, _) => LeverActuator::new(Resource::Io, IoprioLever { raised: boost.raised_ioprio() }),
            (IoLever::Weight, Some(WeightHierarchy::V2)) => LeverActuator::new(
                Resource::Io,
                GroupValueLever {
                    file: V2_WEIGHT,
                    label: "io_weight",
                    why: "the weight lever in cgroup v2 weights a whole group",
                    raised: boost.weight,
                    frozen_event: false,
                },
            ),
            (IoLever::Weight, _) => LeverActuator::new(
                Resource::Io,
                GroupLever {
                    hierarchy: BLKIO,
                    prefix: IO_GROUP_PREFIX,
                    file: V1_WEIGHT,
                    value: weight_text(BLKIO, boost.weight),
                    members: |t, vcpus_known| issues_io(t.role, vcpus_known),
                    named_vcpus_only: None,
                    flat: false,
                    settles: false,
                },
            ),
        }
    }
}
