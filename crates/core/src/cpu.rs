//! CPU coordination's own rules (seed 000 sec. VII; README "The real-time guard"):
//!
//! - the host reserve: boosted VMs together never hold more vCPUs than the host has CPUs minus
//!   `host_reserve_cpus`; a boost past it is refused with `DENY(cpu: host_reserve)`. A boosted
//!   vCPU occupies at most one CPU, so about that many CPUs stay with the host's own tasks (the
//!   VMs' main-loop and I/O threads are boosted too; they are not counted, as they mostly wait);
//! - the real-time guard keeps a boosted VM's vCPU threads at a real-time class for at most
//!   `rt_guard_max_share` of every `rt_guard_window`, and moves them to [`Level::Guarded`] for the
//!   rest, so that the kernel's RT throttling (`sched_rt_runtime_us`), which would stall the VM
//!   for ~50 ms, never fires.

use std::collections::BTreeMap;

use cosched_proto::{DenyReason, Resource};

use crate::resource::{Level, ResourcePolicy, VmFacts};
use crate::vm::Counters;
use crate::window::OnTime;
use crate::{Policy, VmId, NS_PER_MS};

#[derive(Debug)]
pub struct CpuPolicy {
    /// (real-time allowance per window, share to fall back to before resuming), in ns.
    guard: Option<(u64, u64)>,
    guard_window_ns: u64,
    capacity: u32,
    /// vCPUs of each boosted VM, and their sum: what the reserve is checked against.
    boosted: BTreeMap<VmId, u32>,
    boosted_vcpus: u32,
    /// Real-time time of each VM's vCPUs over the guard window.
    rt: BTreeMap<VmId, OnTime>,
}

impl CpuPolicy {
    /// `host_cpus`: the CPUs the VMs' threads can run on.
    pub fn new(policy: &Policy, host_cpus: u32) -> CpuPolicy {
        let capacity = match policy.max_boosted_vcpus {
            0 => host_cpus.saturating_sub(policy.host_reserve_cpus),
            cap => cap,
        };
        CpuPolicy {
            guard: policy.rt_guard(),
            guard_window_ns: policy.rt_guard_window_ms.max(1) * NS_PER_MS,
            capacity,
            boosted: BTreeMap::new(),
            boosted_vcpus: 0,
            rt: BTreeMap::new(),
        }
    }

    /// How many vCPUs may be boosted at once (host CPUs minus the reserve, or the explicit cap).
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    pub fn boosted_vcpus(&self) -> u32 {
        self.boosted_vcpus
    }

    fn rt(&mut self, vm: VmId) -> &mut OnTime {
        let w = self.guard_window_ns;
        self.rt.entry(vm).or_insert_with(|| OnTime::new(w))
    }
}

impl ResourcePolicy for CpuPolicy {
    fn resource(&self) -> Resource {
        Resource::Cpu
    }

    fn admit(&mut self, vm: VmId, facts: VmFacts, value: u64, _now: u64) -> Result<u64, DenyReason> {
        // A VM boosted already (asking for a new priority) holds its vCPUs: not counted twice.
        let held = self.boosted.get(&vm).copied().unwrap_or(0);
        if self.boosted_vcpus - held + facts.vcpus > self.capacity {
            return Err(DenyReason::HostReserve);
        }
        Ok(value)
    }

    fn started(&mut self, vm: VmId, facts: VmFacts, now: u64, _counters: &mut Counters) -> Level {
        self.boosted.insert(vm, facts.vcpus);
        self.boosted_vcpus += facts.vcpus;
        let Some((max, _)) = self.guard else { return Level::Boosted };
        let rt = self.rt(vm);
        if rt.used(now) >= max {
            Level::Guarded
        } else {
            rt.start(now);
            Level::Boosted
        }
    }

    fn stopped(&mut self, vm: VmId, now: u64) {
        if let Some(n) = self.boosted.remove(&vm) {
            self.boosted_vcpus -= n;
        }
        if let Some(rt) = self.rt.get_mut(&vm) {
            rt.stop(now);
        }
    }

    fn tick(&mut self, vm: VmId, level: Level, now: u64, counters: &mut Counters) -> Option<Level> {
        let (max, resume) = self.guard?;
        let rt = self.rt(vm);
        let used = rt.used(now);
        match level {
            Level::Boosted if used >= max => {
                rt.stop(now);
                *counters.events.entry("guard_demotions").or_default() += 1;
                Some(Level::Guarded)
            }
            Level::Guarded if used <= resume => {
                rt.start(now);
                Some(Level::Boosted)
            }
            _ => None,
        }
    }

    fn next_deadline(&mut self, vm: VmId, level: Level, now: u64) -> Option<u64> {
        let (max, resume) = self.guard?;
        let used = self.rt(vm).used(now);
        match level {
            Level::Boosted => Some(now + max.saturating_sub(used)),
            // The share falls by at most 1 ns per ns, so this is the earliest resume time.
            Level::Guarded => Some(now + used.saturating_sub(resume)),
            Level::Normal => None,
        }
    }

    fn vm_changed(&mut self, vm: VmId, facts: VmFacts) {
        if let Some(n) = self.boosted.get_mut(&vm) {
            self.boosted_vcpus = self.boosted_vcpus - *n + facts.vcpus;
            *n = facts.vcpus;
        }
    }

    fn vm_gone(&mut self, vm: VmId) {
        if let Some(n) = self.boosted.remove(&vm) {
            self.boosted_vcpus -= n;
        }
        self.rt.remove(&vm);
    }

    fn figures(&self) -> Vec<(&'static str, u64)> {
        vec![("boost_capacity_vcpus", self.capacity as u64), ("boosted_vcpus", self.boosted_vcpus as u64)]
    }
}
