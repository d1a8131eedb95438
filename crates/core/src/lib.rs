//! The cosched coordinator: all policy, no I/O.
//!
//! [`Coordinator`] is the one decision point. It takes every event (a frame from a guest, a
//! malformed frame, a host event such as a device interrupt, a tick of the clock with the
//! host's measurements at hand, a VM found or gone, an operator command) with the current
//! monotonic time in ns, and appends every [`Action`] for the caller to carry out: send a frame
//! to a VM, bring a VM's threads to a [`Level`] on one [`Resource`] with a typed [`Grant`], tell
//! the host which VMs to watch for device events, move a static FIFO tuning's vCPUs to its
//! guard's class and back. The host daemon owns the sockets and the actuators and only feeds
//! this and executes; the tests drive it with a fake clock and fake [`Sensors`].
//!
//! Resources are data (one model for many resources). Everything they share is in [`Shared`]:
//! - a VM is known with or without an agent; an agent registers the resources it can detect, and
//!   is granted those the host supports ([`ResourcePolicy`]s given to [`Coordinator::new`]);
//!   each guest frame gets exactly one reply, and a `DENY` names its resource and the reason;
//! - the operator enables or disables each resource globally and per VM, and sets a VM's
//!   priority; a VM whose resource is turned off is deboosted on it and told `DISABLE`;
//! - budgets per VM and per resource: at most `max_continuous_boost` in one go, at most
//!   `max_boost_share` of every `budget_window`; past either the host deboosts, tells the guest
//!   `DENY(<resource>: budget)` and refuses boosts for `budget_cooldown`;
//! - rate limits per VM and per resource: requests beyond `frame_rate` are refused with
//!   `DENY(<resource>: rate_limited)` (a request that lowers a privilege always passes), and a VM
//!   sending more than `malformed_rate` malformed frames per second is deregistered;
//! - one ordered set of deadlines ([`Due`]): budgets, the resources' own (the CPU's guard and
//!   predictions, event boosting's slices, memory-bandwidth checks) and the static guards, so a
//!   frame or a tick costs O(log n), not a scan of every VM.
//!
//! What is a resource's own is in its policy: the CPU's host reserve, real-time guard, RT
//! co-scheduling and predictions (`cpu`), event boosting (`feas`), memory-bandwidth regulation
//! (`membw`).

pub mod cpu;
pub mod error;
pub mod feas;
mod frame;
pub mod guard;
pub mod io;
pub mod membw;
pub mod policy;
pub mod resource;
pub mod shared;
pub mod vm;
pub mod window;

use std::collections::BTreeMap;

use cosched_proto::{DenyReason, Frame, Resource};
use serde::Serialize;

pub use cpu::rt::{self, PriorityMap, RtConfig, RtStatus};
pub use cpu::CpuPolicy;
pub use error::{ConfigError, Error, MembwError};
pub use feas::{EventPolicy, EventVms, FeasConfig};
pub use guard::{GuardRule, StaticGuard, StaticGuardStatus};
pub use io::IoPolicy;
pub use membw::{MembwPolicy, Regulator, RegulatorConfig};
pub use policy::{check_priority, Limits, LimitsOverride, Policy, VM_PRIORITY};
pub use resource::{EventOutcome, Grant, HostEvent, Level, NoSensors, ResourcePolicy, Sensors, VmFacts};
pub use shared::{Due, Shared};
pub use vm::{Counters, Slot, Vm, VmCounters, VmSettings};
use window::Bucket;

pub const NS_PER_MS: u64 = 1_000_000;
pub const NS_PER_S: u64 = 1_000_000_000;

/// Opaque VM handle, chosen by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct VmId(pub u64);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Send {
        vm: VmId,
        frame: Frame,
    },
    /// Bring the VM's threads to `level` on `resource`, with what was granted.
    Apply {
        vm: VmId,
        resource: Resource,
        level: Level,
        grant: Grant,
    },
    /// Whether the host watches the VM for device events (event boosting applies to it now).
    WatchEvents {
        vm: VmId,
        on: bool,
    },
    /// A static FIFO tuning's guard: its vCPU threads to the guard's fair class (`guarded`) or
    /// back at FIFO.
    StaticGuard {
        vm: VmId,
        guarded: bool,
    },
}

/// See the crate documentation.
#[derive(Debug)]
pub struct Coordinator {
    sh: Shared,
    resources: BTreeMap<Resource, Box<dyn ResourcePolicy>>,
    /// The guards of the VMs' static FIFO tunings.
    statics: BTreeMap<VmId, StaticGuard>,
}

/// Which VMs the policies follow after a call ([`ResourcePolicy::follow`]).
pub(crate) enum Touched {
    One(VmId),
    All,
    /// The VMs of the actions appended from this index on.
    Actions(usize),
}

impl Coordinator {
    /// A coordinator for the resources this host can act on, one policy each.
    pub fn new(policy: Policy, resources: Vec<Box<dyn ResourcePolicy>>) -> Coordinator {
        let resources: BTreeMap<Resource, Box<dyn ResourcePolicy>> =
            resources.into_iter().map(|p| (p.resource(), p)).collect();
        let limits = resources.keys().map(|r| (*r, policy.limits(*r))).collect();
        let mut c = Coordinator { sh: Shared::new(policy, limits), resources, statics: BTreeMap::new() };
        for p in c.resources.values_mut() {
            p.init(&mut c.sh);
        }
        c
    }

    /// CPU coordination only, on a host with `host_cpus` CPUs.
    pub fn with_cpu(policy: Policy, host_cpus: u32) -> Coordinator {
        let cpu = CpuPolicy::new(&policy, host_cpus);
        Coordinator::new(policy, vec![Box::new(cpu)])
    }

    pub fn policy(&self) -> &Policy {
        self.sh.policy()
    }

    /// The shared state (VMs, slots, switches), read-only.
    pub fn shared(&self) -> &Shared {
        &self.sh
    }

    /// The resources this host supports.
    pub fn resources(&self) -> impl Iterator<Item = Resource> + '_ {
        self.resources.keys().copied()
    }

    pub fn limits(&self, r: Resource) -> Option<&Limits> {
        self.sh.limits(r)
    }

    /// A resource's own figures for `cosched status`.
    pub fn figures(&self, r: Resource) -> Vec<(&'static str, u64)> {
        self.resources.get(&r).map(|p| p.figures()).unwrap_or_default()
    }

    /// The policy of type `P`, if the coordinator has one (its own status and commands).
    pub fn policy_of<P: ResourcePolicy + 'static>(&self) -> Option<&P> {
        self.resources.values().find_map(|p| p.as_ref().as_any().downcast_ref::<P>())
    }

    /// The policy of type `P` and the shared state, to change the policy.
    fn policy_of_mut<P: ResourcePolicy + 'static>(&mut self) -> Option<(&mut P, &mut Shared)> {
        let p = self.resources.values_mut().find_map(|p| p.as_mut().as_any_mut().downcast_mut::<P>())?;
        Some((p, &mut self.sh))
    }

    /// Capability bits a guest may be granted: the supported resources a guest asks for.
    pub fn grantable(&self) -> u64 {
        self.resources.keys().filter(|r| r.request_kind().is_some()).fold(0, |b, r| b | r.cap())
    }

    /// Whether `r` is supported and enabled for the whole host.
    pub fn enabled(&self, r: Resource) -> bool {
        self.sh.enabled(r)
    }

    pub fn vm(&self, id: VmId) -> Option<&Vm> {
        self.sh.vm(id)
    }

    pub fn vms(&self) -> impl Iterator<Item = (VmId, &Vm)> {
        self.sh.vms.iter().map(|(id, vm)| (*id, vm))
    }

    pub fn default_settings(&self) -> VmSettings {
        VmSettings { disabled: 0, priority: self.sh.policy.default_priority }
    }

    /// After any call: the boosts other resources' takeovers ended are told to their policies,
    /// and the policies follow the VMs it touched.
    pub(crate) fn finish(&mut self, touched: Touched, now: u64, out: &mut Vec<Action>) {
        if !self.sh.stopped_others.is_empty() {
            for (vm, r, at) in std::mem::take(&mut self.sh.stopped_others) {
                if let Some(p) = self.resources.get_mut(&r) {
                    p.stopped(vm, at);
                }
            }
        }
        match touched {
            // A frame's VM: the hot path, nothing allocated.
            Touched::One(vm) => self.follow(vm, now, out),
            Touched::All => {
                let ids: Vec<VmId> = self.sh.vms.keys().copied().collect();
                for vm in ids {
                    self.follow(vm, now, out);
                }
            }
            Touched::Actions(from) => {
                let mut ids: Vec<VmId> = out[from..]
                    .iter()
                    .map(|a| match a {
                        Action::Send { vm, .. }
                        | Action::Apply { vm, .. }
                        | Action::WatchEvents { vm, .. }
                        | Action::StaticGuard { vm, .. } => *vm,
                    })
                    .collect();
                ids.sort_unstable();
                ids.dedup();
                for vm in ids {
                    self.follow(vm, now, out);
                }
            }
        }
    }

    /// Every policy follows VM `vm` ([`ResourcePolicy::follow`]).
    fn follow(&mut self, vm: VmId, now: u64, out: &mut Vec<Action>) {
        for p in self.resources.values_mut() {
            p.follow(&mut self.sh, vm, now, out);
        }
    }

    /// A VM is known (its channel connected, or its QEMU process found). Nothing is sent until
    /// its guest speaks.
    pub fn vm_found(&mut self, id: VmId, name: &str, settings: VmSettings, now: u64) {
        let slots = self.sh.limits.iter().map(|(r, l)| (*r, Slot::new(l, now))).collect();
        let p = &self.sh.policy;
        let vm = Vm {
            name: name.to_string(),
            settings,
            registered: None,
            vcpus: 1,
            counters: VmCounters::default(),
            slots,
            told_disabled: 0,
            frames: Bucket::new(p.frame_rate, p.frame_burst, now),
            malformed: Bucket::new(p.malformed_rate, p.malformed_rate, now),
        };
        self.sh.vms.insert(id, vm);
    }

    /// Whether the host should watch VM `id` for device events now, telling the policies to
    /// follow it (a VM just found: what the host must start with). Appends what follows.
    pub fn follow_vm(&mut self, id: VmId, now: u64, out: &mut Vec<Action>) {
        self.finish(Touched::One(id), now, out);
    }

    /// The VM's process exited or its channel closed for good: deboost and forget it.
    pub fn vm_gone(&mut self, id: VmId, now: u64, out: &mut Vec<Action>) {
        // What its agent set up goes first (a prediction would ask for a deboost of its own).
        for p in self.resources.values_mut() {
            p.agent_gone(&mut self.sh, id);
        }
        for p in self.resources.values_mut() {
            self.sh.end_boost(p.as_mut(), id, now, out);
        }
        if self.sh.vms.remove(&id).is_some() {
            for p in self.resources.values_mut() {
                p.vm_gone(&mut self.sh, id);
            }
        }
        self.statics.remove(&id);
        self.sh.unschedule_vm(id);
    }

    /// The VM is known by another name now (its agent's channel joined a VM found by process).
    pub fn rename(&mut self, id: VmId, name: &str) {
        if let Some(vm) = self.sh.vms.get_mut(&id) {
            vm.name = name.to_string();
        }
    }

    /// The VM's vCPU count changed (its thread list was re-read).
    pub fn set_vm_vcpus(&mut self, id: VmId, vcpus: u32) {
        let Some(vm) = self.sh.vms.get_mut(&id) else { return };
        vm.vcpus = vcpus.max(1);
        let facts = VmFacts { vcpus: vm.vcpus };
        for p in self.resources.values_mut() {
            p.vm_changed(id, facts);
        }
    }

    /// A host-originated request (no frame, no agent needed): the value granted or why not,
    /// with the same switches, rate limit and budgets as a guest's request.
    pub fn host_request(
        &mut self,
        id: VmId,
        r: Resource,
        value: u64,
        now: u64,
        out: &mut Vec<Action>,
    ) -> Result<u64, DenyReason> {
        let policy = self.resources.get_mut(&r).ok_or(DenyReason::Unsupported)?;
        let result = self.sh.request(policy.as_mut(), id, value, now, None, out);
        self.finish(Touched::One(id), now, out);
        result
    }

    /// Something the host saw happen to VM `id`, for resource `r`'s policy (event boosting's
    /// device events and blocked vCPUs; a throttle carried out). `sensors`: what the host
    /// measures now.
    pub fn host_event(
        &mut self,
        r: Resource,
        id: VmId,
        ev: HostEvent,
        now: u64,
        sensors: &mut dyn Sensors,
        out: &mut Vec<Action>,
    ) -> EventOutcome {
        if self.sh.vm(id).is_none() {
            return EventOutcome::Off;
        }
        let Some(p) = self.resources.get_mut(&r) else { return EventOutcome::Off };
        let outcome = p.host_event(&mut self.sh, id, ev, now, sensors, out);
        self.finish(Touched::One(id), now, out);
        outcome
    }

    /// Adds `n` to one of a resource's own counters of a VM.
    pub fn count(&mut self, id: VmId, r: Resource, name: &'static str, n: u64) {
        self.sh.count(id, r, name, n);
    }

    /// Earliest time at which [`Coordinator::tick`] has something to do.
    pub fn next_deadline(&self) -> Option<u64> {
        self.sh.first_due().map(|(when, _)| when)
    }

    /// Everything whose deadline has come, with sensors that see nothing (tests of the shared
    /// rules; the daemon uses [`Coordinator::tick_sensed`]).
    pub fn tick(&mut self, now: u64, out: &mut Vec<Action>) {
        self.tick_sensed(now, &mut NoSensors, out);
    }

    /// Everything whose deadline has come, in the order of their deadlines: budgets and the
    /// resources' own rules, predictions, event boosting, memory-bandwidth checks (`sensors`:
    /// what the host measures now), static guards.
    pub fn tick_sensed(&mut self, now: u64, sensors: &mut dyn Sensors, out: &mut Vec<Action>) {
        let from = out.len();
        while let Some(due) = self.sh.pop_due(now) {
            match due {
                Due::Slot(id, r) => {
                    if let Some(p) = self.resources.get_mut(&r) {
                        self.sh.tick_slot(p.as_mut(), id, now, out);
                    }
                }
                Due::Policy(r, vm) => {
                    if let Some(p) = self.resources.get_mut(&r) {
                        p.due(&mut self.sh, vm, now, sensors, out);
                    }
                }
                Due::StaticGuard(vm) => self.tick_static_guard(vm, now, out),
            }
        }
        self.finish(Touched::Actions(from), now, out);
    }

    /// Operator: `resource` (every supported one if `None`) on or off for the whole host.
    pub fn set_enabled(&mut self, resource: Option<Resource>, enabled: bool, now: u64, out: &mut Vec<Action>) {
        let bits = resource.map_or(!0, Resource::cap);
        if enabled {
            self.sh.host_disabled &= !bits;
        } else {
            self.sh.host_disabled |= bits;
        }
        let ids: Vec<VmId> = self.sh.vms.keys().copied().collect();
        for id in ids {
            self.apply_enabled(id, now, out);
        }
        self.finish(Touched::All, now, out);
    }

    /// Operator: `resource` (every one if `None`) on or off for one VM. False if there is no
    /// such VM.
    pub fn set_vm_enabled(
        &mut self,
        id: VmId,
        resource: Option<Resource>,
        enabled: bool,
        now: u64,
        out: &mut Vec<Action>,
    ) -> bool {
        let Some(vm) = self.sh.vms.get_mut(&id) else { return false };
        let bits = resource.map_or(!0, Resource::cap);
        if enabled {
            vm.settings.disabled &= !bits;
        } else {
            vm.settings.disabled |= bits;
        }
        self.apply_enabled(id, now, out);
        self.finish(Touched::One(id), now, out);
        true
    }

    /// Deboosts what is off, and tells the agent what changed for it.
    fn apply_enabled(&mut self, id: VmId, now: u64, out: &mut Vec<Action>) {
        let on = self.sh.on_bits(&self.sh.vms[&id]);
        for (r, p) in self.resources.iter_mut() {
            if on & r.cap() != 0 {
                continue;
            }
            if let Some(s) = self.sh.vms.get_mut(&id).and_then(|vm| vm.slots.get_mut(r)) {
                s.wants = 0;
            }
            self.sh.end_boost(p.as_mut(), id, now, out);
        }
        let vm = self.sh.vms.get_mut(&id).expect("caller checked");
        let back_on = vm.told_disabled & on;
        if back_on != 0 {
            vm.told_disabled &= !back_on;
            out.push(Action::Send { vm: id, frame: Frame::enable(back_on) });
        }
        let newly_off = vm.registered.unwrap_or(0) & !on & !vm.told_disabled;
        if newly_off != 0 {
            vm.told_disabled |= newly_off;
            out.push(Action::Send { vm: id, frame: Frame::disable(newly_off) });
        }
    }

    /// Operator: a VM's real-time priority among coordinated guests (1..=98).
    pub fn set_vm_priority(&mut self, id: VmId, priority: u8, out: &mut Vec<Action>) -> Result<(), Error> {
        check_priority("priority", priority)?;
        let vm = self.sh.vms.get_mut(&id).ok_or(Error::NoSuchVm(id))?;
        vm.settings.priority = priority;
        for p in self.resources.values_mut() {
            // An RT grant is never below the VM's priority: re-granted first, then every level
            // in force is applied again at the new priority.
            p.regrant(&mut self.sh, id);
            self.sh.reapply(p.as_ref(), id, out);
        }
        Ok(())
    }

    /// Operator or config reload: `[policy]` anew, the keys a running coordinator can take
    /// (the VMs' default priority, the continuous and share budgets and the cooldown, globally
    /// and per resource); any other key that differs refuses the whole change
    /// ([`Error::NeedsRestart`]), as does a policy that does not validate. A boost in force
    /// is held to the new budgets: its deadline is computed again (one already past ends it at
    /// the next tick). A VM's priority is its own ([`Coordinator::set_vm_priority`]).
    pub fn set_policy(&mut self, policy: Policy, now: u64) -> Result<(), Error> {
        let keys = self.sh.policy.needs_restart(&policy);
        if !keys.is_empty() {
            return Err(Error::NeedsRestart { keys });
        }
        policy.validate()?;
        for (r, limits) in self.sh.limits.iter_mut() {
            *limits = policy.limits(*r);
        }
        self.sh.policy = policy;
        let ids: Vec<VmId> = self.sh.vms.keys().copied().collect();
        for (r, p) in self.resources.iter_mut() {
            for id in &ids {
                if self.sh.boosted(*id, *r) {
                    self.sh.reschedule(p.as_mut(), *id, now);
                }
            }
        }
        Ok(())
    }

    /// `[rt]` for the CPU (the default is [`RtConfig::default`]).
    pub fn set_rt(&mut self, cfg: RtConfig) {
        let window = self.sh.limits(Resource::Cpu).map_or(self.sh.policy.budget_window_ms * NS_PER_MS, |l| l.window_ns);
        if let Some((cpu, _)) = self.policy_of_mut::<CpuPolicy>() {
            cpu.set_rt(cfg, window);
        }
    }

    /// Config: the RT ceiling of the VM named `name` (`None`: the default).
    pub fn set_ceiling(&mut self, name: &str, ceiling: Option<u8>) {
        if let Some((cpu, _)) = self.policy_of_mut::<CpuPolicy>() {
            cpu.set_ceiling(name, ceiling);
        }
    }

    /// Operator: VM `id`'s RT ceiling; a boost in force under the old one is re-granted.
    pub fn set_vm_ceiling(&mut self, id: VmId, ceiling: u8, out: &mut Vec<Action>) -> Result<(), Error> {
        let (cpu, sh) = self.policy_of_mut::<CpuPolicy>().ok_or(Error::NoCpuPolicy)?;
        cpu.set_vm_ceiling(sh, id, ceiling, out)
    }

    /// What `cosched status` shows of VM `id`'s RT co-scheduling and predictions.
    pub fn rt_status(&self, id: VmId, now: u64) -> Option<RtStatus> {
        self.policy_of::<CpuPolicy>()?.rt_status(&self.sh, id, now)
    }

    /// Predicted boosts started since the last call: (VM, target, planned start); the daemon
    /// measures when its actuators were done and reports it with
    /// [`Coordinator::predict_applied`].
    pub fn predicted_starts(&mut self) -> Vec<(VmId, u64, u64)> {
        self.policy_of_mut::<CpuPolicy>().map(|(cpu, _)| cpu.predicted_starts()).unwrap_or_default()
    }

    pub fn has_predicted_starts(&self) -> bool {
        self.policy_of::<CpuPolicy>().is_some_and(CpuPolicy::has_predicted_starts)
    }

    /// See [`CpuPolicy::predict_applied`].
    pub fn predict_applied(&mut self, id: VmId, target: u64, start: u64, applied: u64) {
        if let Some((cpu, _)) = self.policy_of_mut::<CpuPolicy>() {
            cpu.predict_applied(id, target, start, applied);
        }
    }

    /// Operator or config: VM `id`'s guaranteed memory-bandwidth share (permille).
    pub fn set_membw_share(&mut self, id: VmId, share: u64) -> Result<(), Error> {
        let (m, _) = self.policy_of_mut::<MembwPolicy>().ok_or(Error::NoMembwPolicy)?;
        if m.regulator().vm(id).is_some() {
            Ok(m.set_share(id, share)?)
        } else {
            Ok(m.add_vm(id, share)?)
        }
    }

    /// Operator: the memory-bandwidth regulator's settings.
    pub fn set_membw_config(&mut self, cfg: RegulatorConfig) -> Result<(), Error> {
        let (m, _) = self.policy_of_mut::<MembwPolicy>().ok_or(Error::NoMembwPolicy)?;
        Ok(m.set_config(cfg)?)
    }

    /// VM `id`'s static FIFO tuning is on with `rule` as its guard (`None`: no guard, or no
    /// tuning). A guard already on keeps its state (a new shield keeps its window). Returns
    /// whether its vCPUs are guarded now.
    pub fn set_static_guard(&mut self, id: VmId, rule: Option<GuardRule>, now: u64) -> bool {
        let Some(rule) = rule else {
            self.statics.remove(&id);
            self.sh.schedule(Due::StaticGuard(id), None);
            return false;
        };
        let g = self.statics.entry(id).or_insert_with(|| StaticGuard::new(rule, now));
        let (guarded, next) = (g.guarded(), g.next_deadline(now));
        self.sh.schedule(Due::StaticGuard(id), Some(next));
        guarded
    }

    /// What `cosched status` shows of VM `id`'s static guard.
    pub fn static_guard_status(&self, id: VmId, now: u64) -> Option<StaticGuardStatus> {
        self.statics.get(&id).map(|g| g.clone().status(now))
    }

    fn tick_static_guard(&mut self, id: VmId, now: u64, out: &mut Vec<Action>) {
        let Some(g) = self.statics.get_mut(&id) else { return };
        if let Some(guarded) = g.tick(now) {
            out.push(Action::StaticGuard { vm: id, guarded });
        }
        let next = g.next_deadline(now);
        self.sh.schedule(Due::StaticGuard(id), Some(next));
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_decisions;
#[cfg(test)]
mod tests_resources;
