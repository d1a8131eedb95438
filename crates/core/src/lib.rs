//! The cosched coordinator: all policy, no I/O.
//!
//! It takes events (a frame from a guest, a malformed frame, a tick of the clock, a VM gone, an
//! operator command) with the current monotonic time in ns, and appends [`Action`]s for the caller
//! to carry out: send a frame to a VM, or put a VM's threads at a CPU [`Level`]. The host daemon
//! owns the sockets and the actuators; the tests drive it with a fake clock.
//!
//! Per VM (seed 000 sec. VII, seed 004 sec. 3, DESIGN.md "CPU coordination"):
//! - a guest registers, then sends `CPU 1` / `CPU 0`; each guest frame gets exactly one reply;
//! - the operator enables or disables coordination globally and per VM and sets a VM's priority;
//!   a disabled VM's registration is denied, and a VM disabled at run time is told `DISABLE`;
//! - budgets bound a boost: at most `max_continuous_boost` in one go, at most
//!   `max_boost_share` of every `budget_window`; past either the host deboosts, tells the guest
//!   `DENY(budget)` and refuses boosts for `budget_cooldown`;
//! - the real-time guard keeps a boosted VM's vCPU threads at a real-time class for at most
//!   `rt_guard_max_share` of every `rt_guard_window`, and moves them to [`Level::Guarded`] (a
//!   high-weight fair class) for the rest, so that the kernel's RT throttling
//!   (`sched_rt_runtime_us`), which would stall the VM for ~50 ms, never fires;
//! - the host reserve: boosted VMs together never hold more vCPUs than the host has CPUs minus
//!   `host_reserve_cpus`; a boost that would go past it is refused with `DENY(budget)`. A boosted
//!   vCPU occupies at most one CPU, so about that many CPUs stay with the host's own tasks (the
//!   VMs' main-loop and I/O threads are boosted too; they are not counted, as they mostly wait);
//! - rate limits: frames beyond `frame_rate` are refused with `DENY(rate_limited)` (a deboost is
//!   always honoured), and a VM sending more than `malformed_rate` malformed frames per second is
//!   deregistered.

pub mod window;

use std::collections::BTreeMap;

use cosched_proto::{caps, DenyReason, Frame, Kind};
use serde::{Deserialize, Serialize};
use window::{Bucket, OnTime};

pub const NS_PER_MS: u64 = 1_000_000;
pub const NS_PER_S: u64 = 1_000_000_000;

/// How privileged a VM's threads are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// The attributes the threads had before we touched them.
    #[default]
    Normal,
    /// Every thread at the boost class (`SCHED_RR` at the VM's priority).
    Boosted,
    /// Boosted, but the vCPU threads are at the guard class (fair class, high weight) because
    /// they used their real-time share of the guard window; the other threads stay boosted.
    Guarded,
}

impl Level {
    pub fn is_boosted(self) -> bool {
        self != Level::Normal
    }
    pub fn name(self) -> &'static str {
        match self {
            Level::Normal => "normal",
            Level::Boosted => "boosted",
            Level::Guarded => "guarded",
        }
    }
}

/// Opaque VM handle, chosen by the caller (one per connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct VmId(pub u64);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Send {
        vm: VmId,
        frame: Frame,
    },
    /// Put every thread of the VM at `level`; `priority` is the VM's real-time priority.
    SetCpu {
        vm: VmId,
        level: Level,
        priority: u8,
    },
}

/// Coordination policy. Durations in ms as they appear in the config file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// Real-time priority of a VM's threads when boosted, unless set per VM (1..=98).
    pub default_priority: u8,
    /// Longest single boost; 0 = no limit.
    pub max_continuous_boost_ms: u64,
    /// Largest share of `budget_window_ms` a VM may spend boosted, in permille; 1000 = no limit.
    pub max_boost_share_permille: u64,
    pub budget_window_ms: u64,
    /// After a budget is exhausted, boosts are refused for this long.
    pub budget_cooldown_ms: u64,
    /// Largest share of `rt_guard_window_ms` a VM's vCPUs may spend at the real-time class, in
    /// permille; 0 disables the guard. Keep it below `sched_rt_runtime_us / sched_rt_period_us`.
    pub rt_guard_max_share_permille: u64,
    pub rt_guard_window_ms: u64,
    /// A guarded VM goes back to real time once its share is this far below the maximum.
    pub rt_guard_hysteresis_ms: u64,
    /// CPUs kept for the host: boosted VMs together hold at most (host CPUs - this) vCPUs.
    pub host_reserve_cpus: u32,
    /// If > 0, the most vCPUs boosted at once instead of (host CPUs - host_reserve_cpus): for
    /// guests whose vCPUs mostly wait, or for measuring the daemon itself.
    pub max_boosted_vcpus: u32,
    /// Frames per second a VM may send (token bucket refill rate); deboosts always pass.
    pub frame_rate: u64,
    pub frame_burst: u64,
    /// Malformed frames per second (burst of the same size) before the VM is deregistered.
    pub malformed_rate: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            default_priority: 1,
            max_continuous_boost_ms: 10_000,
            max_boost_share_permille: 900,
            budget_window_ms: 20_000,
            budget_cooldown_ms: 1_000,
            rt_guard_max_share_permille: 900,
            rt_guard_window_ms: 1_000,
            rt_guard_hysteresis_ms: 50,
            host_reserve_cpus: 1,
            max_boosted_vcpus: 0,
            // The agent sends at most one transition per MIN_BOOST_TIME (500 µs): 2000/s.
            frame_rate: 2_000,
            frame_burst: 200,
            malformed_rate: 20,
        }
    }
}

impl Policy {
    /// Checks ranges; the error says which setting is wrong and why.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=98).contains(&self.default_priority) {
            return Err(format!(
                "default_priority = {}: must be 1..=98 (99 is left to the kernel's own threads)",
                self.default_priority
            ));
        }
        if self.max_boost_share_permille == 0 || self.max_boost_share_permille > 1000 {
            return Err("max_boost_share_permille must be 1..=1000".into());
        }
        if self.budget_window_ms == 0 {
            return Err("budget_window_ms must be > 0".into());
        }
        if self.rt_guard_max_share_permille > 1000 {
            return Err("rt_guard_max_share_permille must be 0..=1000 (0 = off)".into());
        }
        if self.rt_guard_max_share_permille > 0 {
            if self.rt_guard_window_ms == 0 {
                return Err("rt_guard_window_ms must be > 0 when the guard is on".into());
            }
            let max_ms = self.rt_guard_window_ms * self.rt_guard_max_share_permille / 1000;
            if self.rt_guard_hysteresis_ms >= max_ms {
                return Err(format!(
                    "rt_guard_hysteresis_ms = {} must be below the guard's real-time allowance ({max_ms} ms)",
                    self.rt_guard_hysteresis_ms
                ));
            }
        }
        if self.frame_rate == 0 || self.frame_burst == 0 || self.malformed_rate == 0 {
            return Err("frame_rate, frame_burst and malformed_rate must be > 0".into());
        }
        Ok(())
    }

    fn share_limit_ns(&self) -> Option<u64> {
        (self.max_boost_share_permille < 1000)
            .then(|| self.budget_window_ms * NS_PER_MS * self.max_boost_share_permille / 1000)
    }

    /// With the guard on: (real-time allowance per window, share to fall back to before
    /// resuming), in ns.
    fn rt_guard(&self) -> Option<(u64, u64)> {
        (self.rt_guard_max_share_permille > 0).then(|| {
            let max = self.rt_guard_window_ms * NS_PER_MS * self.rt_guard_max_share_permille / 1000;
            (max, max.saturating_sub(self.rt_guard_hysteresis_ms * NS_PER_MS))
        })
    }
}

/// Per-VM operator settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmSettings {
    pub enabled: bool,
    pub priority: u8,
}

/// Counters of one VM, as shown by `cosched status` and the metrics endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Well-formed frames received.
    pub frames: u64,
    /// Malformed frames and runs of garbage received.
    pub malformed: u64,
    pub garbage_bytes: u64,
    /// Boosts started (a `CPU 1` that found the VM at normal level).
    pub boosts: u64,
    pub deboosts: u64,
    /// Total time boosted (closed boosts).
    pub boosted_ns: u64,
    /// Boosts the host ended because a budget ran out.
    pub budget_exhausted: u64,
    /// Times the real-time guard moved the vCPUs to the guard class.
    pub guard_demotions: u64,
    /// Times the VM was deregistered for sending too many malformed frames.
    pub malformed_deregistrations: u64,
    /// Boosts refused because the host reserve was reached (also counted as `budget` denials).
    pub reserve_denied: u64,
    /// Replies sent, by kind of denial.
    pub denied: BTreeMap<&'static str, u64>,
}

/// The state of one VM.
#[derive(Debug, Clone)]
pub struct Vm {
    pub name: String,
    pub settings: VmSettings,
    /// Capabilities granted at registration; `None` = not registered.
    pub registered: Option<u64>,
    /// The guest's last word: it wants a boost.
    pub wants_boost: bool,
    pub level: Level,
    /// vCPU threads of the VM: what a boost takes from the host reserve.
    pub vcpus: u32,
    pub counters: Counters,
    /// We told the guest coordination is off (`DISABLE`, or `DENY(disabled)` to a `REGISTER`),
    /// so we owe it an `ENABLE` when it is back on.
    told_disabled: bool,
    boosted: OnTime,
    rt: OnTime,
    cooldown_until_ns: u64,
    frames: Bucket,
    malformed: Bucket,
}

impl Vm {
    /// How long the current boost has lasted.
    pub fn boosted_for_ns(&self, now: u64) -> u64 {
        self.boosted.on_since().map_or(0, |s| now.saturating_sub(s))
    }

    /// Boosted share of the budget window, in permille.
    pub fn boost_share_permille(&self, now: u64, policy: &Policy) -> u64 {
        let w = policy.budget_window_ms * NS_PER_MS;
        self.boosted.clone().used(now) * 1000 / w.max(1)
    }

    pub fn in_cooldown(&self, now: u64) -> bool {
        now < self.cooldown_until_ns
    }
}

/// See the crate documentation.
#[derive(Debug)]
pub struct Coordinator {
    policy: Policy,
    /// Capabilities this host can act on.
    supported_caps: u64,
    /// CPUs of the host (for the host reserve).
    host_cpus: u32,
    /// Operator switch for CPU coordination on the whole host.
    cpu_enabled: bool,
    vms: BTreeMap<VmId, Vm>,
}

impl Coordinator {
    /// `host_cpus`: the CPUs the VMs' threads can run on.
    pub fn new(policy: Policy, host_cpus: u32) -> Coordinator {
        Coordinator { policy, supported_caps: caps::CPU, host_cpus, cpu_enabled: true, vms: BTreeMap::new() }
    }

    /// How many vCPUs may be boosted at once (host CPUs minus the reserve, or the explicit cap).
    pub fn boost_capacity(&self) -> u32 {
        match self.policy.max_boosted_vcpus {
            0 => self.host_cpus.saturating_sub(self.policy.host_reserve_cpus),
            cap => cap,
        }
    }

    /// vCPUs of boosted VMs other than `except`.
    fn boosted_vcpus(&self, except: VmId) -> u32 {
        self.vms.iter().filter(|(id, vm)| **id != except && vm.level.is_boosted()).map(|(_, vm)| vm.vcpus).sum()
    }

    /// The VM's vCPU count changed (its thread list was re-read).
    pub fn set_vm_vcpus(&mut self, id: VmId, vcpus: u32) {
        if let Some(vm) = self.vms.get_mut(&id) {
            vm.vcpus = vcpus.max(1);
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn cpu_enabled(&self) -> bool {
        self.cpu_enabled
    }

    pub fn vm(&self, id: VmId) -> Option<&Vm> {
        self.vms.get(&id)
    }

    pub fn vms(&self) -> impl Iterator<Item = (VmId, &Vm)> {
        self.vms.iter().map(|(id, vm)| (*id, vm))
    }

    pub fn default_settings(&self) -> VmSettings {
        VmSettings { enabled: true, priority: self.policy.default_priority }
    }

    /// A VM's channel is connected. Nothing is sent until the guest speaks.
    pub fn vm_connected(&mut self, id: VmId, name: &str, settings: VmSettings, now: u64) {
        let p = &self.policy;
        self.vms.insert(
            id,
            Vm {
                name: name.to_string(),
                settings,
                registered: None,
                wants_boost: false,
                level: Level::Normal,
                vcpus: 1,
                counters: Counters::default(),
                told_disabled: false,
                boosted: OnTime::new(p.budget_window_ms * NS_PER_MS),
                rt: OnTime::new(p.rt_guard_window_ms.max(1) * NS_PER_MS),
                cooldown_until_ns: 0,
                frames: Bucket::new(p.frame_rate, p.frame_burst, now),
                malformed: Bucket::new(p.malformed_rate, p.malformed_rate, now),
            },
        );
    }

    /// The VM's channel closed or its process exited: deboost and forget it.
    pub fn vm_gone(&mut self, id: VmId, now: u64, out: &mut Vec<Action>) {
        if let Some(mut vm) = self.vms.remove(&id) {
            end_boost(id, &mut vm, now, out);
        }
    }

    fn effectively_enabled(&self, vm: &Vm) -> bool {
        self.cpu_enabled && vm.settings.enabled
    }

    /// A well-formed frame from VM `id`.
    pub fn frame(&mut self, id: VmId, f: Frame, now: u64, out: &mut Vec<Action>) {
        if !f.kind.is_guest_to_host() {
            // Host-to-guest kinds coming from a guest are a protocol violation.
            return self.malformed(id, Some(f.seq), 0, now, out);
        }
        let enabled = match self.vms.get(&id) {
            Some(vm) => self.effectively_enabled(vm),
            None => return,
        };
        let others_boosted = self.boosted_vcpus(id);
        let capacity = self.boost_capacity();
        let policy = &self.policy;
        let supported = self.supported_caps;
        let vm = self.vms.get_mut(&id).expect("checked above");
        vm.counters.frames += 1;
        let reply = |vm: &mut Vm, out: &mut Vec<Action>, r: Result<u64, DenyReason>| {
            let frame = match r {
                Ok(v) => Frame::ack(f.seq, v),
                Err(reason) => {
                    *vm.counters.denied.entry(reason.name()).or_default() += 1;
                    Frame::deny(f.seq, reason)
                }
            };
            out.push(Action::Send { vm: id, frame });
        };
        let lowers_privilege = matches!((f.kind, f.value), (Kind::Cpu, 0) | (Kind::Io, 0) | (Kind::Deregister, _));
        if !vm.frames.take(now) && !lowers_privilege {
            return reply(vm, out, Err(DenyReason::RateLimited));
        }
        match f.kind {
            Kind::Register => {
                // A (re-)registering agent starts from scratch: nothing is boosted on its side.
                end_boost(id, vm, now, out);
                vm.wants_boost = false;
                let granted = f.value & supported;
                vm.registered = None; // a refused registration replaces the previous one too
                if granted == 0 {
                    reply(vm, out, Err(DenyReason::Unsupported))
                } else if !enabled {
                    vm.told_disabled = true;
                    reply(vm, out, Err(DenyReason::Disabled))
                } else {
                    vm.registered = Some(granted);
                    reply(vm, out, Ok(granted))
                }
            }
            Kind::Deregister => {
                end_boost(id, vm, now, out);
                vm.wants_boost = false;
                vm.registered = None;
                reply(vm, out, Ok(0))
            }
            Kind::Cpu => {
                let Some(granted) = vm.registered else {
                    return reply(vm, out, Err(DenyReason::NotRegistered));
                };
                if granted & caps::CPU == 0 {
                    return reply(vm, out, Err(DenyReason::Unsupported));
                }
                if f.value == 0 {
                    vm.wants_boost = false;
                    end_boost(id, vm, now, out);
                    return reply(vm, out, Ok(0));
                }
                if !enabled {
                    return reply(vm, out, Err(DenyReason::Disabled));
                }
                if budget_refuses(policy, vm, now) {
                    return reply(vm, out, Err(DenyReason::Budget));
                }
                if !vm.level.is_boosted() && others_boosted + vm.vcpus > capacity {
                    vm.counters.reserve_denied += 1;
                    return reply(vm, out, Err(DenyReason::Budget));
                }
                vm.wants_boost = true;
                if !vm.level.is_boosted() {
                    start_boost(policy, id, vm, now, out);
                }
                reply(vm, out, Ok(0))
            }
            // This host grants CPU coordination only (see `supported_caps`), so an I/O or
            // memory-bandwidth request can only come from a guest that ignored its ACK.
            Kind::Io | Kind::Membw => match vm.registered {
                None => reply(vm, out, Err(DenyReason::NotRegistered)),
                Some(_) => reply(vm, out, Err(DenyReason::Unsupported)),
            },
            Kind::Ack | Kind::Deny | Kind::Disable | Kind::Enable => unreachable!("checked above"),
        }
    }

    /// A malformed frame (`seq` if its header was readable) or `garbage_bytes` skipped while
    /// resynchronising. Replies `DENY(malformed)`; past `malformed_rate` the VM is deregistered.
    pub fn malformed(&mut self, id: VmId, seq: Option<u32>, garbage_bytes: u64, now: u64, out: &mut Vec<Action>) {
        let Some(vm) = self.vms.get_mut(&id) else { return };
        vm.counters.malformed += 1;
        vm.counters.garbage_bytes += garbage_bytes;
        *vm.counters.denied.entry(DenyReason::Malformed.name()).or_default() += 1;
        out.push(Action::Send { vm: id, frame: Frame::deny(seq.unwrap_or(0), DenyReason::Malformed) });
        if !vm.malformed.take(now) && vm.registered.is_some() {
            end_boost(id, vm, now, out);
            vm.wants_boost = false;
            vm.registered = None;
            vm.counters.malformed_deregistrations += 1;
        }
    }

    /// Earliest time at which [`Coordinator::tick`] has something to do.
    pub fn next_deadline(&mut self, now: u64) -> Option<u64> {
        let p = &self.policy;
        let mut next: Option<u64> = None;
        let mut consider = |t: u64| next = Some(next.map_or(t, |n| n.min(t)));
        for vm in self.vms.values_mut() {
            let Some(since) = vm.boosted.on_since() else { continue };
            if p.max_continuous_boost_ms > 0 {
                consider(since + p.max_continuous_boost_ms * NS_PER_MS);
            }
            if let Some(limit) = p.share_limit_ns() {
                let used = vm.boosted.used(now);
                // Old boosts leave the window as time passes, so this is the earliest it can run out.
                consider(now + limit.saturating_sub(used));
            }
            if let Some((max, resume)) = p.rt_guard() {
                let used = vm.rt.used(now);
                match vm.level {
                    Level::Boosted => consider(now + max.saturating_sub(used)),
                    // The share falls by at most 1 ns per ns, so this is the earliest resume time.
                    Level::Guarded => consider(now + used.saturating_sub(resume)),
                    Level::Normal => {}
                }
            }
        }
        next
    }

    /// Enforces budgets and the real-time guard at `now`.
    pub fn tick(&mut self, now: u64, out: &mut Vec<Action>) {
        let p = &self.policy;
        for (&id, vm) in self.vms.iter_mut() {
            if !vm.level.is_boosted() {
                continue;
            }
            let over_continuous =
                p.max_continuous_boost_ms > 0 && vm.boosted_for_ns(now) >= p.max_continuous_boost_ms * NS_PER_MS;
            let over_share = p.share_limit_ns().is_some_and(|limit| vm.boosted.used(now) >= limit);
            if over_continuous || over_share {
                end_boost(id, vm, now, out);
                vm.wants_boost = false;
                vm.cooldown_until_ns = now + p.budget_cooldown_ms * NS_PER_MS;
                vm.counters.budget_exhausted += 1;
                *vm.counters.denied.entry(DenyReason::Budget.name()).or_default() += 1;
                out.push(Action::Send { vm: id, frame: Frame::deny(0, DenyReason::Budget) });
                continue;
            }
            guard(p, id, vm, now, out);
        }
    }

    /// Operator: CPU coordination on or off for the whole host.
    pub fn set_cpu_enabled(&mut self, enabled: bool, now: u64, out: &mut Vec<Action>) {
        self.cpu_enabled = enabled;
        let ids: Vec<VmId> = self.vms.keys().copied().collect();
        for id in ids {
            self.apply_enabled(id, now, out);
        }
    }

    /// Operator: CPU coordination on or off for one VM. Returns false if there is no such VM.
    pub fn set_vm_enabled(&mut self, id: VmId, enabled: bool, now: u64, out: &mut Vec<Action>) -> bool {
        let Some(vm) = self.vms.get_mut(&id) else { return false };
        vm.settings.enabled = enabled;
        self.apply_enabled(id, now, out);
        true
    }

    fn apply_enabled(&mut self, id: VmId, now: u64, out: &mut Vec<Action>) {
        let on = self.vms.get(&id).is_some_and(|vm| self.effectively_enabled(vm));
        let vm = self.vms.get_mut(&id).expect("caller checked");
        if on && vm.told_disabled {
            vm.told_disabled = false;
            out.push(Action::Send { vm: id, frame: Frame::enable(caps::CPU) });
        } else if !on && vm.registered.is_some() && !vm.told_disabled {
            end_boost(id, vm, now, out);
            vm.wants_boost = false;
            vm.told_disabled = true;
            out.push(Action::Send { vm: id, frame: Frame::disable(caps::CPU) });
        }
    }

    /// Operator: a VM's real-time priority among coordinated guests (1..=98).
    pub fn set_vm_priority(&mut self, id: VmId, priority: u8, out: &mut Vec<Action>) -> Result<(), String> {
        if !(1..=98).contains(&priority) {
            return Err(format!("priority {priority} out of range 1..=98"));
        }
        let vm = self.vms.get_mut(&id).ok_or("no such VM")?;
        vm.settings.priority = priority;
        if vm.level.is_boosted() {
            out.push(Action::SetCpu { vm: id, level: vm.level, priority });
        }
        Ok(())
    }
}

fn budget_refuses(p: &Policy, vm: &mut Vm, now: u64) -> bool {
    vm.in_cooldown(now) || p.share_limit_ns().is_some_and(|limit| vm.boosted.used(now) >= limit)
}

fn start_boost(p: &Policy, id: VmId, vm: &mut Vm, now: u64, out: &mut Vec<Action>) {
    vm.boosted.start(now);
    vm.counters.boosts += 1;
    let rt_full = p.rt_guard().is_some_and(|(max, _)| vm.rt.used(now) >= max);
    vm.level = if rt_full {
        Level::Guarded
    } else {
        vm.rt.start(now);
        Level::Boosted
    };
    out.push(Action::SetCpu { vm: id, level: vm.level, priority: vm.settings.priority });
}

fn end_boost(id: VmId, vm: &mut Vm, now: u64, out: &mut Vec<Action>) {
    if !vm.level.is_boosted() {
        return;
    }
    vm.counters.boosted_ns += vm.boosted.stop(now);
    vm.rt.stop(now);
    vm.counters.deboosts += 1;
    vm.level = Level::Normal;
    out.push(Action::SetCpu { vm: id, level: Level::Normal, priority: vm.settings.priority });
}

/// The real-time guard: see the crate documentation.
fn guard(p: &Policy, id: VmId, vm: &mut Vm, now: u64, out: &mut Vec<Action>) {
    let Some((max, resume)) = p.rt_guard() else { return };
    let used = vm.rt.used(now);
    let next = match vm.level {
        Level::Boosted if used >= max => {
            vm.rt.stop(now);
            vm.counters.guard_demotions += 1;
            Level::Guarded
        }
        Level::Guarded if used <= resume => {
            vm.rt.start(now);
            Level::Boosted
        }
        _ => return,
    };
    vm.level = next;
    out.push(Action::SetCpu { vm: id, level: next, priority: vm.settings.priority });
}

#[cfg(test)]
mod tests;
