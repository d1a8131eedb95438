//! CPU coordination's own rules (the Coordinated Task Scheduling paper, sec. VII; for the
//! real-time guard, docs/architecture.md, "Safety"):
//!
//! - the host reserve: boosted VMs together never hold more vCPUs than the host has CPUs minus
//!   `host_reserve_cpus`; a boost past it is refused with `DENY(cpu: host_reserve)`. A boosted
//!   vCPU occupies at most one CPU, so about that many CPUs stay with the host's own tasks (the
//!   VMs' main-loop and I/O threads are boosted too; they are not counted, as they mostly wait);
//! - the real-time guard keeps a boosted VM's vCPU threads at a real-time class for at most
//!   `rt_guard_max_share` of every `rt_guard_window`, and moves them to [`Level::Guarded`] for the
//!   rest, so that the kernel's RT throttling (`sched_rt_runtime_us`), which would stall the VM
//!   for ~50 ms, never fires;
//! - real-time co-scheduling with the guest's priority, and predictive boost ([`rt`]): hooks on
//!   the CPU's frames (`CPU`, `WAKE`) before the shared path, with their own deadlines.

pub mod rt;

use std::collections::BTreeMap;

use cosched_proto::{cpu, DenyReason, Frame, Kind, Resource};

use crate::guard::GuardRule;
use crate::resource::{Grant, Level, ResourcePolicy, Sensors, VmFacts};
use crate::shared::Shared;
use crate::vm::Counters;
use crate::window::OnTime;
use crate::{Action, Policy, VmId};

#[derive(Debug)]
pub struct CpuPolicy {
    guard: Option<GuardRule>,
    capacity: u32,
    /// vCPUs of each boosted VM, and their sum: what the reserve is checked against.
    boosted: BTreeMap<VmId, u32>,
    boosted_vcpus: u32,
    /// Real-time time of each VM's vCPUs over the guard window.
    rt_time: BTreeMap<VmId, OnTime>,
    /// RT co-scheduling and predictions.
    rt: rt::Rt,
}

impl CpuPolicy {
    /// `host_cpus`: the CPUs the VMs' threads can run on.
    pub fn new(policy: &Policy, host_cpus: u32) -> CpuPolicy {
        let capacity = match policy.max_boosted_vcpus {
            0 => host_cpus.saturating_sub(policy.host_reserve_cpus),
            cap => cap,
        };
        CpuPolicy {
            guard: GuardRule::from_policy(policy),
            capacity,
            boosted: BTreeMap::new(),
            boosted_vcpus: 0,
            rt_time: BTreeMap::new(),
            rt: rt::Rt::new(rt::RtConfig::default(), policy.limits(Resource::Cpu).window_ns),
        }
    }

    /// How many vCPUs may be boosted at once (host CPUs minus the reserve, or the explicit cap).
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    pub fn boosted_vcpus(&self) -> u32 {
        self.boosted_vcpus
    }

    fn rt_time(&mut self, vm: VmId, rule: GuardRule) -> &mut OnTime {
        self.rt_time.entry(vm).or_insert_with(|| rule.on_time())
    }
}

impl ResourcePolicy for CpuPolicy {
    fn resource(&self) -> Resource {
        Resource::Cpu
    }

    /// `1 | priority << 8` is an RT co-scheduling grant ([`rt`]); `1` a plain boost.
    fn grant(&self, granted: u64, vm_priority: u8) -> Grant {
        match rt::granted_priority(granted) {
            Some(priority) => Grant::Rt { priority },
            None => Grant::Plain { priority: vm_priority },
        }
    }

    fn takes_over(&self) -> Option<Resource> {
        Some(Resource::Event)
    }

    fn frame_kinds(&self) -> &'static [Kind] {
        &[Kind::Wake]
    }

    fn frame(&mut self, sh: &mut Shared, vm: VmId, f: &Frame, now: u64, out: &mut Vec<Action>) -> Option<u64> {
        if f.kind == Kind::Wake {
            self.wake(sh, vm, f, now, out);
            return None;
        }
        if let Some((delay_us, priority)) = cpu::wake_of(f.value) {
            self.deboost_wake(sh, vm, f, delay_us, priority, now, out);
            return None;
        }
        self.rt_cpu_frame(sh, vm, f, now, out)
    }

    fn due(&mut self, sh: &mut Shared, vm: Option<VmId>, now: u64, _: &mut dyn Sensors, out: &mut Vec<Action>) {
        if let Some(vm) = vm {
            self.prediction_due(sh, vm, now, out);
        }
    }

    fn regrant(&mut self, sh: &mut Shared, vm: VmId) -> bool {
        self.regrant_cpu(sh, vm)
    }

    fn agent_gone(&mut self, sh: &mut Shared, vm: VmId) {
        self.rt_forget(sh, vm, false);
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
        let Some(rule) = self.guard else { return Level::Boosted };
        match rule.may_start(self.rt_time(vm, rule), now) {
            true => Level::Boosted,
            false => Level::Guarded,
        }
    }

    fn stopped(&mut self, vm: VmId, now: u64) {
        if let Some(n) = self.boosted.remove(&vm) {
            self.boosted_vcpus -= n;
        }
        if let Some(rt) = self.rt_time.get_mut(&vm) {
            rt.stop(now);
        }
    }

    fn tick(&mut self, vm: VmId, level: Level, now: u64, counters: &mut Counters) -> Option<Level> {
        let rule = self.guard?;
        let guarded = match level {
            Level::Boosted => false,
            Level::Guarded => true,
            Level::Normal | Level::Throttled => return None,
        };
        match rule.step(self.rt_time(vm, rule), guarded, now)? {
            true => {
                *counters.events.entry("guard_demotions").or_default() += 1;
                Some(Level::Guarded)
            }
            false => Some(Level::Boosted),
        }
    }

    fn next_deadline(&mut self, vm: VmId, level: Level, now: u64) -> Option<u64> {
        let rule = self.guard?;
        let guarded = match level {
            Level::Boosted => false,
            Level::Guarded => true,
            Level::Normal | Level::Throttled => return None,
        };
        Some(rule.deadline(self.rt_time(vm, rule), guarded, now))
    }

    fn vm_changed(&mut self, vm: VmId, facts: VmFacts) {
        if let Some(n) = self.boosted.get_mut(&vm) {
            self.boosted_vcpus = self.boosted_vcpus - *n + facts.vcpus;
            *n = facts.vcpus;
        }
    }

    fn vm_gone(&mut self, sh: &mut Shared, vm: VmId) {
        if let Some(n) = self.boosted.remove(&vm) {
            self.boosted_vcpus -= n;
        }
        self.rt_time.remove(&vm);
        self.rt_forget(sh, vm, true);
    }

    fn figures(&self) -> Vec<(&'static str, u64)> {
        vec![("boost_capacity_vcpus", self.capacity as u64), ("boosted_vcpus", self.boosted_vcpus as u64)]
    }
}
