//! What differs from one resource to the next: a [`ResourcePolicy`] per resource.
//!
//! The coordinator does everything every resource shares ([`crate::shared::Shared`]:
//! registration and grants, operator switches, rate limits, budgets, replies, the one ordered set
//! of deadlines); a resource's policy adds its own limits (the CPU's host reserve), its own
//! levels over time (the CPU's real-time guard), and, through the hooks below, whatever else it
//! decides: the CPU's real-time co-scheduling and predictions (a hook on its frames), event
//! boosting (host events), memory-bandwidth regulation (its own deadlines, fed by measurements).
//! Adding a resource is a new policy in a file of its own, given to
//! [`crate::Coordinator::new`]: nothing in the coordinator changes.

use std::any::Any;
use std::fmt;

use cosched_proto::{DenyReason, Frame, Kind, Resource};
use serde::{Deserialize, Serialize};

use crate::shared::Shared;
use crate::vm::Counters;
use crate::{Action, VmId};

/// How privileged a VM is on one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// What the VM's threads had before we touched them.
    #[default]
    Normal,
    /// Privileged (for the CPU: every thread at the boost class).
    Boosted,
    /// Privileged, but held back by the resource's own guard (for the CPU: the vCPU threads at a
    /// high-weight fair class, because they used their real-time share of the guard window).
    Guarded,
    /// Held back by the host (memory bandwidth: the vCPU threads stopped until the regulation
    /// period ends). Never a coordinator slot's level: only an actuator's.
    Throttled,
}

impl Level {
    /// Away from normal: boosted, guarded or throttled (a throttle is a change, not a boost).
    pub fn is_changed(self) -> bool {
        self != Level::Normal
    }
    pub fn name(self) -> &'static str {
        match self {
            Level::Normal => "normal",
            Level::Boosted => "boosted",
            Level::Guarded => "guarded",
            Level::Throttled => "throttled",
        }
    }
}

/// What an [`Action::Apply`] grants, typed: the actuator needs no decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grant {
    /// A boost at the VM's own priority and the host's configured class.
    Plain { priority: u8 },
    /// Real-time co-scheduling: the vCPU threads at `SCHED_FIFO` `priority` (mapped from the
    /// guest's), the VM's other threads above them.
    Rt { priority: u8 },
    /// A share, in permille (memory bandwidth).
    Share(u64),
}

/// A bare priority is a plain grant at it.
impl From<u8> for Grant {
    fn from(priority: u8) -> Grant {
        Grant::Plain { priority }
    }
}

impl Grant {
    /// The priority a class actuator sets (0 for a share).
    pub fn priority(self) -> u8 {
        match self {
            Grant::Plain { priority } | Grant::Rt { priority } => priority,
            Grant::Share(_) => 0,
        }
    }
}

/// What a resource's policy may know about a VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmFacts {
    /// vCPU threads of the VM.
    pub vcpus: u32,
}

/// What the host measures at the moment a policy decides: the daemon reads it from the kernel
/// (BPF maps, counters, cgroup files); the tests fake it. Every method has a neutral default.
pub trait Sensors {
    /// CPU time the VM's vCPU threads have run, in total (ns; a monotonic counter).
    fn vcpu_run_ns(&mut self, _vm: VmId) -> u64 {
        0
    }
    /// Time the VM's vCPU threads have spent asleep, in total (ns; a monotonic counter).
    fn vcpu_asleep_ns(&mut self, _vm: VmId) -> u64 {
        0
    }
    /// Whether one of the VM's vCPU threads is runnable but not running.
    fn vcpu_waiting(&mut self, _vm: VmId) -> bool {
        false
    }
    /// Whether one of the VM's vCPU threads is running.
    fn vcpu_running(&mut self, _vm: VmId) -> bool {
        false
    }
    /// Bytes of memory traffic the VM's vCPUs caused since the last call (memory bandwidth).
    fn membw_bytes(&mut self, _vm: VmId, _now: u64) -> u64 {
        0
    }
    /// Whether the change the VM's actuator of `r` made is in force (a freeze completes
    /// asynchronously); `None`: nothing applied, or cannot tell.
    fn in_force(&mut self, _vm: VmId, _r: Resource) -> Option<bool> {
        None
    }
}

/// Sensors that see nothing (a caller with no host behind it: tests of the shared rules).
pub struct NoSensors;

impl Sensors for NoSensors {}

/// Something the host saw happen to a VM, for a resource's policy ([`ResourcePolicy::host_event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostEvent {
    /// A device event: the VM's main-loop or I/O thread woken by a device, or an interrupt
    /// injected (event boosting).
    Device,
    /// A boosted vCPU of the VM blocked (event boosting).
    VcpuBlocked,
    /// The VM's actuator of this resource just carried out a change: what is in force may be
    /// read now (memory bandwidth: a freeze).
    Applied,
}

/// What a host event came to (event boosting reports why it did or did not boost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventOutcome {
    Boosted,
    /// The VM is boosted already: the event rides on that boost.
    AlreadyBoosted,
    /// Over the limit this cycle, or paying back: boosted later.
    Postponed,
    /// No vCPU of the VM is waiting (all running or asleep: the fair class wakes them).
    NotWaiting,
    /// The resource is off for this VM.
    Off,
    /// The shared rules refused (disabled, budget, rate limit).
    Refused(DenyReason),
    /// Taken in (no decision to report).
    Noted,
}

/// A policy as its concrete type, for its own status and operator commands (every policy has
/// it).
pub trait AsAny {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: Any> AsAny for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// One resource's own rules. Every method has a default that adds nothing, so a resource with
/// no rules of its own (only the shared budgets) implements just [`ResourcePolicy::resource`].
pub trait ResourcePolicy: fmt::Debug + AsAny {
    fn resource(&self) -> Resource;

    /// A VM asks to be raised to `value` (> 0) on this resource and is not raised yet: the value
    /// granted, or why not. Called after the operator switches, rate limits and budgets passed.
    fn admit(&mut self, _vm: VmId, _facts: VmFacts, value: u64, _now: u64) -> Result<u64, DenyReason> {
        Ok(value)
    }

    /// A boost starts: the level it starts at.
    fn started(&mut self, _vm: VmId, _facts: VmFacts, _now: u64, _counters: &mut Counters) -> Level {
        Level::Boosted
    }

    /// A boost ended.
    fn stopped(&mut self, _vm: VmId, _now: u64) {}

    /// While boosted, time passes: the new level if it changes (never `Normal`: ending a boost
    /// is the coordinator's).
    fn tick(&mut self, _vm: VmId, _level: Level, _now: u64, _counters: &mut Counters) -> Option<Level> {
        None
    }

    /// While boosted at `level`: the earliest time [`ResourcePolicy::tick`] may have something to do.
    fn next_deadline(&mut self, _vm: VmId, _level: Level, _now: u64) -> Option<u64> {
        None
    }

    /// What a slot's `granted` value (what the ACK carried) grants, for the actuators.
    fn grant(&self, _granted: u64, vm_priority: u8) -> Grant {
        Grant::Plain { priority: vm_priority }
    }

    /// Whether a granted request changes the VM's threads (an `Apply`). Memory bandwidth's
    /// does not: a guest's share changes the regulation, and only a throttle acts on threads.
    fn acts_on_grant(&self) -> bool {
        true
    }

    /// A resource whose boost ends when a boost of this one starts on the same VM (the CPU's
    /// takes the vCPUs over from event boosting, which lets go of them first).
    fn takes_over(&self) -> Option<Resource> {
        None
    }

    /// Frame kinds other than its request kind that this resource answers (the CPU: `WAKE`).
    fn frame_kinds(&self) -> &'static [Kind] {
        &[]
    }

    /// A guest's frame for this resource (its request kind, already checked: registered and
    /// granted; or one of [`ResourcePolicy::frame_kinds`], unchecked), before the shared path:
    /// the value to ask for, or `None` when the hook answered it itself (exactly one reply).
    fn frame(&mut self, _sh: &mut Shared, _vm: VmId, f: &Frame, _now: u64, _out: &mut Vec<Action>) -> Option<u64> {
        Some(f.value)
    }

    /// One of this resource's own deadlines ([`crate::Due::Policy`]) came: `vm` is the VM it
    /// was set for (`None`: host-wide).
    fn due(
        &mut self,
        _sh: &mut Shared,
        _vm: Option<VmId>,
        _now: u64,
        _sensors: &mut dyn Sensors,
        _out: &mut Vec<Action>,
    ) {
    }

    /// Something the host saw happen to `vm`.
    fn host_event(
        &mut self,
        _sh: &mut Shared,
        _vm: VmId,
        _ev: HostEvent,
        _now: u64,
        _sensors: &mut dyn Sensors,
        _out: &mut Vec<Action>,
    ) -> EventOutcome {
        EventOutcome::Noted
    }

    /// After anything that may change whether the resource applies to `vm` (a registration,
    /// a switch, a CPU boost): the policy follows (event boosting tells the host whether to
    /// watch the VM, and lets go of it if not).
    fn follow(&mut self, _sh: &mut Shared, _vm: VmId, _now: u64, _out: &mut Vec<Action>) {}

    /// The VM's priority or ceiling changed: re-grant what depends on it. Returns whether the
    /// grant in force changed (the caller applies it again).
    fn regrant(&mut self, _sh: &mut Shared, _vm: VmId) -> bool {
        false
    }

    /// The VM's agent is gone or starts over: what its frames set up ends.
    fn agent_gone(&mut self, _sh: &mut Shared, _vm: VmId) {}

    /// The VM's facts changed (its threads were re-read).
    fn vm_changed(&mut self, _vm: VmId, _facts: VmFacts) {}

    /// The coordinator is made: the policy may set its first deadlines.
    fn init(&mut self, _sh: &mut Shared) {}

    /// The VM is gone; forget it.
    fn vm_gone(&mut self, _sh: &mut Shared, _vm: VmId) {}

    /// Figures for `cosched status` (e.g. the CPU's boost capacity), as (name, value).
    fn figures(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}
