//! The coordinator's state of one VM: its agent's registration and, per resource, a [`Slot`].

use std::collections::BTreeMap;

use cosched_proto::Resource;
use serde::{Deserialize, Serialize};

use crate::policy::Limits;
use crate::resource::Level;
use crate::window::{Bucket, OnTime};

/// Per-VM operator settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmSettings {
    /// Capability bits of the resources the operator turned off for this VM.
    pub disabled: u64,
    pub priority: u8,
}

impl VmSettings {
    pub fn enabled(&self, r: Resource) -> bool {
        self.disabled & r.cap() == 0
    }
    pub fn set_enabled(&mut self, r: Resource, on: bool) {
        if on {
            self.disabled &= !r.cap();
        } else {
            self.disabled |= r.cap();
        }
    }
}

/// Counters of one resource of one VM, as shown by `cosched status` and the metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Requests received (guest frames, or host-originated requests).
    pub requests: u64,
    /// Boosts started.
    pub boosts: u64,
    pub deboosts: u64,
    /// Total time boosted (closed boosts).
    pub boosted_ns: u64,
    /// Boosts the host ended because a budget ran out.
    pub budget_exhausted: u64,
    /// Refusals, by reason.
    pub denied: BTreeMap<&'static str, u64>,
    /// The resource's own events (the CPU's `guard_demotions`).
    #[serde(flatten)]
    pub events: BTreeMap<&'static str, u64>,
}

/// One resource of one VM.
#[derive(Debug, Clone)]
pub struct Slot {
    /// The last value asked for (1 = boost for CPU and I/O, a share for memory bandwidth); 0 = none.
    pub wants: u64,
    pub level: Level,
    /// The value in force (what the ACK carried); 0 when not boosted.
    pub granted: u64,
    pub counters: Counters,
    pub(crate) boosted: OnTime,
    pub(crate) cooldown_until_ns: u64,
    pub(crate) requests: Bucket,
}

impl Slot {
    pub(crate) fn new(limits: &Limits, now: u64) -> Slot {
        Slot {
            wants: 0,
            level: Level::Normal,
            granted: 0,
            counters: Counters::default(),
            boosted: OnTime::new(limits.window_ns),
            cooldown_until_ns: 0,
            requests: Bucket::new(limits.frame_rate, limits.frame_burst, now),
        }
    }

    /// How long the current boost has lasted.
    pub fn boosted_for_ns(&self, now: u64) -> u64 {
        self.boosted.on_since().map_or(0, |s| now.saturating_sub(s))
    }

    /// Boosted share of the budget window, in permille.
    pub fn boost_share_permille(&self, now: u64, limits: &Limits) -> u64 {
        self.boosted.clone().used(now) * 1000 / limits.window_ns.max(1)
    }

    pub fn in_cooldown(&self, now: u64) -> bool {
        now < self.cooldown_until_ns
    }
}

/// VM-wide counters: the channel and the registration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VmCounters {
    /// Well-formed frames received.
    pub frames: u64,
    /// Malformed frames and runs of garbage received.
    pub malformed: u64,
    pub garbage_bytes: u64,
    /// Times the VM was deregistered for sending too many malformed frames.
    pub malformed_deregistrations: u64,
    /// Refusals that concern no one resource (`REGISTER`, malformed frames), by reason.
    pub denied: BTreeMap<&'static str, u64>,
}

/// The state of one VM.
#[derive(Debug, Clone)]
pub struct Vm {
    pub name: String,
    pub settings: VmSettings,
    /// Capabilities granted to its agent at registration; `None` = no agent registered.
    pub registered: Option<u64>,
    /// vCPU threads of the VM: what a CPU boost takes from the host reserve.
    pub vcpus: u32,
    pub counters: VmCounters,
    /// One per resource the host supports.
    pub slots: BTreeMap<Resource, Slot>,
    /// Capabilities we told the agent are off (`DISABLE`, or `DENY(disabled)` to its `REGISTER`),
    /// so we owe it an `ENABLE` when they are back on.
    pub(crate) told_disabled: u64,
    pub(crate) frames: Bucket,
    pub(crate) malformed: Bucket,
}

impl Vm {
    pub fn slot(&self, r: Resource) -> Option<&Slot> {
        self.slots.get(&r)
    }

    /// The VM's level on `r` (`Normal` if the host does not support `r`).
    pub fn level(&self, r: Resource) -> Level {
        self.slots.get(&r).map_or(Level::Normal, |s| s.level)
    }
}
