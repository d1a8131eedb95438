//! The cosched coordinator: all policy, no I/O.
//!
//! It takes events (a frame from a guest, a malformed frame, a host-originated request, a tick of
//! the clock, a VM found or gone, an operator command) with the current monotonic time in ns,
//! and appends [`Action`]s for the caller to carry out: send a frame to a VM, or bring a VM's
//! threads to a [`Level`] on one [`Resource`]. The host daemon owns the sockets and the
//! actuators; the tests drive it with a fake clock.
//!
//! Resources are data (DESIGN.md "One model for many resources"). Everything they share is here:
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
//!   sending more than `malformed_rate` malformed frames per second is deregistered.
//!
//! What is a resource's own (the CPU's host reserve and real-time guard) is in its policy
//! (`cpu.rs`). Deadlines are kept in an ordered set, so a frame or a tick costs O(log VMs), not a
//! scan of every VM.

pub mod cpu;
pub mod feas;
pub mod guard;
pub mod io;
pub mod membw;
pub mod policy;
pub mod resource;
pub mod rt;
pub mod vm;
pub mod window;

use std::collections::{BTreeMap, BTreeSet};

use cosched_proto::{DenyReason, Frame, Kind, Resource};
use serde::Serialize;

pub use cpu::CpuPolicy;
pub use feas::{EventPolicy, EventVms, Feas, FeasConfig, FeasHost};
pub use io::IoPolicy;
pub use membw::{MembwPolicy, Regulator, RegulatorConfig};
pub use policy::{check_priority, Limits, LimitsOverride, Policy, VM_PRIORITY};
pub use resource::{Level, ResourcePolicy, VmFacts};
pub use rt::{PriorityMap, RtConfig, RtStatus};
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
    /// Bring the VM's threads to `level` on `resource`. `value` is what was granted (1 for a
    /// boost, a share for memory bandwidth, 0 at `Normal`); `priority` is the VM's.
    Apply {
        vm: VmId,
        resource: Resource,
        level: Level,
        value: u64,
        priority: u8,
    },
}

/// See the crate documentation.
#[derive(Debug)]
pub struct Coordinator {
    policy: Policy,
    resources: BTreeMap<Resource, Box<dyn ResourcePolicy>>,
    limits: BTreeMap<Resource, Limits>,
    /// Capability bits the operator turned off for the whole host.
    host_disabled: u64,
    vms: BTreeMap<VmId, Vm>,
    /// (when, VM, resource): the earliest time each boosted slot needs a tick.
    deadlines: BTreeSet<(u64, VmId, Resource)>,
    /// RT co-scheduling with the guest's priority and predictive boost (`rt.rs`).
    rt: rt::Rt,
}

impl Coordinator {
    /// A coordinator for the resources this host can act on, one policy each.
    pub fn new(policy: Policy, resources: Vec<Box<dyn ResourcePolicy>>) -> Coordinator {
        let resources: BTreeMap<Resource, Box<dyn ResourcePolicy>> =
            resources.into_iter().map(|p| (p.resource(), p)).collect();
        let limits = resources.keys().map(|r| (*r, policy.limits(*r))).collect();
        let rt = rt::Rt::new(RtConfig::default(), policy.limits(Resource::Cpu).window_ns);
        Coordinator {
            policy,
            resources,
            limits,
            host_disabled: 0,
            vms: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            rt,
        }
    }

    /// CPU coordination only, on a host with `host_cpus` CPUs.
    pub fn with_cpu(policy: Policy, host_cpus: u32) -> Coordinator {
        let cpu = CpuPolicy::new(&policy, host_cpus);
        Coordinator::new(policy, vec![Box::new(cpu)])
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The resources this host supports.
    pub fn resources(&self) -> impl Iterator<Item = Resource> + '_ {
        self.resources.keys().copied()
    }

    pub fn limits(&self, r: Resource) -> Option<&Limits> {
        self.limits.get(&r)
    }

    /// A resource's own figures for `cosched status`.
    pub fn figures(&self, r: Resource) -> Vec<(&'static str, u64)> {
        self.resources.get(&r).map(|p| p.figures()).unwrap_or_default()
    }

    /// Capability bits a guest may be granted: the supported resources a guest asks for.
    pub fn grantable(&self) -> u64 {
        self.resources.keys().filter(|r| r.request_kind().is_some()).fold(0, |b, r| b | r.cap())
    }

    /// Whether `r` is supported and enabled for the whole host.
    pub fn enabled(&self, r: Resource) -> bool {
        self.resources.contains_key(&r) && self.host_disabled & r.cap() == 0
    }

    fn on_for(&self, vm: &Vm, r: Resource) -> bool {
        self.enabled(r) && vm.settings.enabled(r)
    }

    /// Capability bits in effect for `vm` (supported, enabled globally and for the VM).
    fn on_bits(&self, vm: &Vm) -> u64 {
        self.resources.keys().filter(|r| self.on_for(vm, **r)).fold(0, |b, r| b | r.cap())
    }

    pub fn vm(&self, id: VmId) -> Option<&Vm> {
        self.vms.get(&id)
    }

    pub fn vms(&self) -> impl Iterator<Item = (VmId, &Vm)> {
        self.vms.iter().map(|(id, vm)| (*id, vm))
    }

    pub fn default_settings(&self) -> VmSettings {
        VmSettings { disabled: 0, priority: self.policy.default_priority }
    }

    /// A VM is known (its channel connected, or its QEMU process found). Nothing is sent until
    /// its guest speaks.
    pub fn vm_found(&mut self, id: VmId, name: &str, settings: VmSettings, now: u64) {
        let slots = self.limits.iter().map(|(r, l)| (*r, Slot::new(l, now))).collect();
        let p = &self.policy;
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
        self.vms.insert(id, vm);
    }

    /// The VM's process exited or its channel closed for good: deboost and forget it.
    pub fn vm_gone(&mut self, id: VmId, now: u64, out: &mut Vec<Action>) {
        self.rt_forget(id, true);
        let resources: Vec<Resource> = self.resources.keys().copied().collect();
        for r in resources {
            self.end_boost(id, r, now, out);
        }
        if self.vms.remove(&id).is_some() {
            for p in self.resources.values_mut() {
                p.vm_gone(id);
            }
        }
    }

    /// The VM is known by another name now (its agent's channel joined a VM found by process).
    pub fn rename(&mut self, id: VmId, name: &str) {
        if let Some(vm) = self.vms.get_mut(&id) {
            vm.name = name.to_string();
        }
    }

    /// The VM's vCPU count changed (its thread list was re-read).
    pub fn set_vm_vcpus(&mut self, id: VmId, vcpus: u32) {
        let Some(vm) = self.vms.get_mut(&id) else { return };
        vm.vcpus = vcpus.max(1);
        let facts = VmFacts { vcpus: vm.vcpus };
        for p in self.resources.values_mut() {
            p.vm_changed(id, facts);
        }
    }

    /// A well-formed frame from VM `id`.
    pub fn frame(&mut self, id: VmId, f: Frame, now: u64, out: &mut Vec<Action>) {
        if !f.kind.is_guest_to_host() {
            // Host-to-guest kinds coming from a guest are a protocol violation.
            return self.malformed(id, Some(f.seq), 0, now, out);
        }
        let Some(vm) = self.vms.get_mut(&id) else { return };
        vm.counters.frames += 1;
        match f.kind {
            Kind::Register => self.register(id, f, now, out),
            Kind::Deregister => {
                self.end_agent_boosts(id, now, out);
                let vm = self.vms.get_mut(&id).expect("checked above");
                vm.registered = None;
                vm.told_disabled = 0;
                out.push(Action::Send { vm: id, frame: Frame::ack(f.seq, 0) });
            }
            Kind::Wake => self.wake(id, f, now, out),
            kind => {
                let r = Resource::of_kind(kind).expect("every other guest kind asks for a resource");
                let granted = vm.registered;
                let deny = |vm: &mut Vm, reason: DenyReason, out: &mut Vec<Action>| {
                    if let Some(s) = vm.slots.get_mut(&r) {
                        *s.counters.denied.entry(reason.name()).or_default() += 1;
                    } else {
                        *vm.counters.denied.entry(reason.name()).or_default() += 1;
                    }
                    out.push(Action::Send { vm: id, frame: Frame::deny_for(f.seq, r, reason) });
                };
                match granted {
                    None => deny(vm, DenyReason::NotRegistered, out),
                    Some(g) if g & r.cap() == 0 || !vm.slots.contains_key(&r) => deny(vm, DenyReason::Unsupported, out),
                    Some(_) => {
                        // The CPU's value is what the guest's need maps to (`rt.rs`).
                        let value =
                            if r == Resource::Cpu { self.rt_cpu_frame(id, &f, now, out) } else { Some(f.value) };
                        if let Some(value) = value {
                            let _ = self.request(id, r, value, now, Some(f.seq), out);
                        }
                    }
                }
            }
        }
    }

    /// `REGISTER`: grants the resources asked for that the host supports. Those the operator
    /// turned off are granted too but not acknowledged: the agent is told `ENABLE` when they
    /// come back on. A registration with nothing on is refused with `DENY(disabled)`.
    fn register(&mut self, id: VmId, f: Frame, now: u64, out: &mut Vec<Action>) {
        let vm = self.vms.get_mut(&id).expect("caller checked");
        if !vm.frames.take(now) {
            *vm.counters.denied.entry(DenyReason::RateLimited.name()).or_default() += 1;
            out.push(Action::Send { vm: id, frame: Frame::deny(f.seq, DenyReason::RateLimited) });
            return;
        }
        // A (re-)registering agent starts from scratch: nothing is boosted on its side.
        self.end_agent_boosts(id, now, out);
        let granted = f.value & self.grantable();
        let vm = &self.vms[&id];
        let on = self.on_bits(vm) & granted;
        let vm = self.vms.get_mut(&id).expect("caller checked");
        vm.registered = None; // a refused registration replaces the previous one too
        let reply = if granted == 0 {
            vm.told_disabled = 0;
            Err(DenyReason::Unsupported)
        } else if on == 0 {
            vm.told_disabled = granted;
            Err(DenyReason::Disabled)
        } else {
            vm.registered = Some(granted);
            vm.told_disabled = granted & !on;
            Ok(on)
        };
        let frame = match reply {
            Ok(on) => Frame::ack(f.seq, on),
            Err(reason) => {
                *vm.counters.denied.entry(reason.name()).or_default() += 1;
                Frame::deny(f.seq, reason)
            }
        };
        out.push(Action::Send { vm: id, frame });
    }

    /// A host-originated request (event boosting: no frame, no agent needed): the value granted
    /// or why not, with the same switches, rate limit and budgets as a guest's request.
    pub fn host_request(
        &mut self,
        id: VmId,
        r: Resource,
        value: u64,
        now: u64,
        out: &mut Vec<Action>,
    ) -> Result<u64, DenyReason> {
        if !self.vms.get(&id).is_some_and(|vm| vm.slots.contains_key(&r)) {
            return Err(DenyReason::Unsupported);
        }
        self.request(id, r, value, now, None, out)
    }

    /// A host-originated change of level while boosted (event boosting's pay-back at
    /// `Guarded`): the VM's threads go to `level`. Nothing happens unless the VM is boosted on
    /// `r` and `level` is not `Normal` (ending a boost is a request for 0).
    pub fn host_level(&mut self, id: VmId, r: Resource, level: Level, out: &mut Vec<Action>) {
        let Some(vm) = self.vms.get_mut(&id) else { return };
        let priority = vm.settings.priority;
        let Some(slot) = vm.slots.get_mut(&r) else { return };
        if !slot.level.is_changed() || level == Level::Normal || slot.level == level {
            return;
        }
        slot.level = level;
        out.push(Action::Apply { vm: id, resource: r, level, value: slot.granted, priority });
    }

    /// Adds `n` to one of a resource's own counters of a VM (shown by `cosched status` and the
    /// metrics beside the shared ones).
    pub fn count(&mut self, id: VmId, r: Resource, name: &'static str, n: u64) {
        if let Some(slot) = self.vms.get_mut(&id).and_then(|vm| vm.slots.get_mut(&r)) {
            *slot.counters.events.entry(name).or_default() += n;
        }
    }

    /// The path every request for a resource takes; `seq` is the guest frame's, if any (then
    /// the reply is sent).
    fn request(
        &mut self,
        id: VmId,
        r: Resource,
        value: u64,
        now: u64,
        seq: Option<u32>,
        out: &mut Vec<Action>,
    ) -> Result<u64, DenyReason> {
        let result = self.decide(id, r, value, now, out);
        let vm = self.vms.get_mut(&id).expect("caller checked");
        let slot = vm.slots.get_mut(&r).expect("caller checked");
        if let Err(reason) = result {
            *slot.counters.denied.entry(reason.name()).or_default() += 1;
        }
        if let Some(seq) = seq {
            let frame = match result {
                Ok(v) => Frame::ack(seq, v),
                Err(reason) => Frame::deny_for(seq, r, reason),
            };
            out.push(Action::Send { vm: id, frame });
        }
        result
    }

    fn decide(
        &mut self,
        id: VmId,
        r: Resource,
        value: u64,
        now: u64,
        out: &mut Vec<Action>,
    ) -> Result<u64, DenyReason> {
        let vm = &self.vms[&id];
        let on = self.on_for(vm, r);
        let limits = self.limits[&r];
        let vm = self.vms.get_mut(&id).expect("caller checked");
        let facts = VmFacts { vcpus: vm.vcpus };
        let priority = vm.settings.priority;
        let slot = vm.slots.get_mut(&r).expect("caller checked");
        slot.counters.requests += 1;
        // A request that lowers a privilege is never refused.
        if !slot.requests.take(now) && value != 0 {
            return Err(DenyReason::RateLimited);
        }
        if value == 0 {
            slot.wants = 0;
            self.end_boost(id, r, now, out);
            return Ok(0);
        }
        if !on {
            return Err(DenyReason::Disabled);
        }
        if slot.in_cooldown(now) || limits.share_limit_ns().is_some_and(|limit| slot.boosted.used(now) >= limit) {
            return Err(DenyReason::Budget);
        }
        if slot.level.is_changed() && slot.granted == value {
            slot.wants = value;
            return Ok(value);
        }
        let policy = self.resources.get_mut(&r).expect("slot exists");
        let granted = policy.admit(id, facts, value, now)?;
        slot.wants = value;
        if slot.level.is_changed() {
            // A new value while boosted (a memory-bandwidth share that changes).
            slot.granted = granted;
            out.push(Action::Apply { vm: id, resource: r, level: slot.level, value: granted, priority });
            return Ok(granted);
        }
        slot.boosted.start(now);
        slot.counters.boosts += 1;
        slot.granted = granted;
        slot.level = policy.started(id, facts, now, &mut slot.counters);
        out.push(Action::Apply { vm: id, resource: r, level: slot.level, value: granted, priority });
        self.reschedule(id, r, now);
        Ok(granted)
    }

    /// Ends the boosts the VM's agent asked for (its registration is over).
    fn end_agent_boosts(&mut self, id: VmId, now: u64, out: &mut Vec<Action>) {
        self.rt_forget(id, false);
        let guest: Vec<Resource> = self.resources.keys().filter(|r| r.request_kind().is_some()).copied().collect();
        for r in guest {
            if let Some(s) = self.vms.get_mut(&id).and_then(|vm| vm.slots.get_mut(&r)) {
                s.wants = 0;
            }
            self.end_boost(id, r, now, out);
        }
    }

    fn end_boost(&mut self, id: VmId, r: Resource, now: u64, out: &mut Vec<Action>) {
        let Some(vm) = self.vms.get_mut(&id) else { return };
        let priority = vm.settings.priority;
        let Some(slot) = vm.slots.get_mut(&r) else { return };
        if !slot.level.is_changed() {
            return;
        }
        slot.counters.boosted_ns += slot.boosted.stop(now);
        slot.counters.deboosts += 1;
        slot.level = Level::Normal;
        slot.granted = 0;
        if let Some(d) = slot.deadline.take() {
            self.deadlines.remove(&(d, id, r));
        }
        if let Some(p) = self.resources.get_mut(&r) {
            p.stopped(id, now);
        }
        out.push(Action::Apply { vm: id, resource: r, level: Level::Normal, value: 0, priority });
    }

    /// Recomputes when a boosted slot next needs a tick: a budget running out, or the
    /// resource's own deadline.
    fn reschedule(&mut self, id: VmId, r: Resource, now: u64) {
        let limits = self.limits[&r];
        let Some(slot) = self.vms.get_mut(&id).and_then(|vm| vm.slots.get_mut(&r)) else { return };
        if let Some(d) = slot.deadline.take() {
            self.deadlines.remove(&(d, id, r));
        }
        let Some(since) = slot.boosted.on_since() else { return };
        let mut next: Option<u64> = None;
        let mut consider = |t: u64| next = Some(next.map_or(t, |n| n.min(t)));
        if limits.max_continuous_ns > 0 {
            consider(since + limits.max_continuous_ns);
        }
        if let Some(limit) = limits.share_limit_ns() {
            // Old boosts leave the window as time passes, so this is the earliest it can run out.
            consider(now + limit.saturating_sub(slot.boosted.used(now)));
        }
        if let Some(d) = self.resources.get_mut(&r).and_then(|p| p.next_deadline(id, slot.level, now)) {
            consider(d);
        }
        if let Some(d) = next {
            slot.deadline = Some(d);
            self.deadlines.insert((d, id, r));
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
            vm.registered = None;
            vm.counters.malformed_deregistrations += 1;
            self.end_agent_boosts(id, now, out);
        }
    }

    /// Earliest time at which [`Coordinator::tick`] has something to do.
    pub fn next_deadline(&self) -> Option<u64> {
        let slots = self.deadlines.first().map(|d| d.0);
        match (slots, self.rt.next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Enforces budgets and the resources' own rules for every slot whose deadline has come.
    pub fn tick(&mut self, now: u64, out: &mut Vec<Action>) {
        self.rt_tick(now, out);
        while let Some(&(when, id, r)) = self.deadlines.first() {
            if when > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(slot) = self.vms.get_mut(&id).and_then(|vm| vm.slots.get_mut(&r)) {
                slot.deadline = None;
            }
            self.tick_slot(id, r, now, out);
        }
    }

    fn tick_slot(&mut self, id: VmId, r: Resource, now: u64, out: &mut Vec<Action>) {
        let limits = self.limits[&r];
        let Some(vm) = self.vms.get_mut(&id) else { return };
        let priority = vm.settings.priority;
        let agent = vm.registered.is_some_and(|g| g & r.cap() != 0);
        let Some(slot) = vm.slots.get_mut(&r) else { return };
        if !slot.level.is_changed() {
            return;
        }
        let over_continuous = limits.max_continuous_ns > 0 && slot.boosted_for_ns(now) >= limits.max_continuous_ns;
        let over_share = limits.share_limit_ns().is_some_and(|limit| slot.boosted.used(now) >= limit);
        if over_continuous || over_share {
            slot.wants = 0;
            slot.cooldown_until_ns = now + limits.cooldown_ns;
            slot.counters.budget_exhausted += 1;
            *slot.counters.denied.entry(DenyReason::Budget.name()).or_default() += 1;
            self.end_boost(id, r, now, out);
            if agent && r.request_kind().is_some() {
                out.push(Action::Send { vm: id, frame: Frame::deny_for(0, r, DenyReason::Budget) });
            }
            return;
        }
        let policy = self.resources.get_mut(&r).expect("slot exists");
        if let Some(level) = policy.tick(id, slot.level, now, &mut slot.counters) {
            slot.level = level;
            let value = slot.granted;
            out.push(Action::Apply { vm: id, resource: r, level, value, priority });
        }
        self.reschedule(id, r, now);
    }

    /// Operator: `resource` (every supported one if `None`) on or off for the whole host.
    pub fn set_enabled(&mut self, resource: Option<Resource>, enabled: bool, now: u64, out: &mut Vec<Action>) {
        let bits = resource.map_or(!0, Resource::cap);
        if enabled {
            self.host_disabled &= !bits;
        } else {
            self.host_disabled |= bits;
        }
        let ids: Vec<VmId> = self.vms.keys().copied().collect();
        for id in ids {
            self.apply_enabled(id, now, out);
        }
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
        let Some(vm) = self.vms.get_mut(&id) else { return false };
        let bits = resource.map_or(!0, Resource::cap);
        if enabled {
            vm.settings.disabled &= !bits;
        } else {
            vm.settings.disabled |= bits;
        }
        self.apply_enabled(id, now, out);
        true
    }

    /// Deboosts what is off, and tells the agent what changed for it.
    fn apply_enabled(&mut self, id: VmId, now: u64, out: &mut Vec<Action>) {
        let vm = &self.vms[&id];
        let on = self.on_bits(vm);
        let off: Vec<Resource> = self.resources.keys().filter(|r| on & r.cap() == 0).copied().collect();
        for r in off {
            if let Some(s) = self.vms.get_mut(&id).and_then(|vm| vm.slots.get_mut(&r)) {
                s.wants = 0;
            }
            self.end_boost(id, r, now, out);
        }
        let vm = self.vms.get_mut(&id).expect("caller checked");
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
    pub fn set_vm_priority(&mut self, id: VmId, priority: u8, out: &mut Vec<Action>) -> Result<(), String> {
        check_priority("priority", priority)?;
        let vm = self.vms.get_mut(&id).ok_or("no such VM")?;
        vm.settings.priority = priority;
        self.regrant_value(id); // an RT grant is never below the VM's priority
        let vm = self.vms.get_mut(&id).expect("found");
        for (r, s) in &vm.slots {
            if s.level.is_changed() {
                out.push(Action::Apply { vm: id, resource: *r, level: s.level, value: s.granted, priority });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_resources;
