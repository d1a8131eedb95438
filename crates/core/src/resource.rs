//! What differs from one resource to the next: a [`ResourcePolicy`] per resource.
//!
//! The coordinator does everything every resource shares (registration and grants, operator
//! switches, rate limits, budgets, replies, deadlines); a resource's policy only adds its own
//! limits (the CPU's host reserve) and its own levels over time (the CPU's real-time guard).
//! Adding a resource is a new policy in a file of its own, registered with
//! [`crate::Coordinator::new`]: nothing in the coordinator changes.

use std::fmt;

use cosched_proto::{DenyReason, Resource};
use serde::{Deserialize, Serialize};

use crate::vm::Counters;
use crate::VmId;

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

/// What a resource's policy may know about a VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmFacts {
    /// vCPU threads of the VM.
    pub vcpus: u32,
}

/// One resource's own rules. Every method has a default that adds nothing, so a resource with
/// no rules of its own (only the shared budgets) implements just [`ResourcePolicy::resource`].
pub trait ResourcePolicy: fmt::Debug {
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

    /// The VM's facts changed (its threads were re-read).
    fn vm_changed(&mut self, _vm: VmId, _facts: VmFacts) {}

    /// The VM is gone; forget it.
    fn vm_gone(&mut self, _vm: VmId) {}

    /// Figures for `cosched status` (e.g. the CPU's boost capacity), as (name, value).
    fn figures(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}
