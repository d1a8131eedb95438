//! A guest's frame, from its arrival to the actions it causes: the dispatch to the resource it
//! is for (registration, deregistration, a malformed frame, a resource's request or another kind
//! a resource answers, such as the CPU's `WAKE`), the resource's hook, and the path every
//! request takes ([`Shared::request`]: the operator's switches, the rate limit, the budgets, the
//! resource's admission, the reply and the `Apply`).

use cosched_proto::{DenyReason, Frame, Kind, Resource};

use crate::resource::{ResourcePolicy, VmFacts};
use crate::shared::Shared;
use crate::{Action, Coordinator, Touched, VmId};

impl Coordinator {
    /// A well-formed frame from VM `id`.
    pub fn frame(&mut self, id: VmId, f: Frame, now: u64, out: &mut Vec<Action>) {
        self.on_frame(id, f, now, out);
        self.finish(Touched::One(id), now, out);
    }

    fn on_frame(&mut self, id: VmId, f: Frame, now: u64, out: &mut Vec<Action>) {
        if !f.kind.is_guest_to_host() {
            // Host-to-guest kinds coming from a guest are a protocol violation.
            return self.on_malformed(id, Some(f.seq), 0, now, out);
        }
        let Some(vm) = self.sh.vms.get_mut(&id) else { return };
        vm.counters.frames += 1;
        match f.kind {
            Kind::Register => self.register(id, f, now, out),
            Kind::Deregister => {
                self.end_agent_boosts(id, now, out);
                let vm = self.sh.vms.get_mut(&id).expect("checked above");
                vm.registered = None;
                vm.told_disabled = 0;
                out.push(Action::Send { vm: id, frame: Frame::ack(f.seq, 0) });
            }
            kind => {
                // A resource's request kind, or another kind a resource answers (the CPU's WAKE).
                let Some(r) = Resource::of_kind(kind)
                    .or_else(|| self.resources.iter().find(|(_, p)| p.frame_kinds().contains(&kind)).map(|(r, _)| *r))
                else {
                    return self.on_malformed(id, Some(f.seq), 0, now, out);
                };
                if Resource::of_kind(kind).is_some() {
                    let granted = vm.registered;
                    let reason = match granted {
                        None => Some(DenyReason::NotRegistered),
                        Some(g) if g & r.cap() == 0 || !vm.slots.contains_key(&r) => Some(DenyReason::Unsupported),
                        Some(_) => None,
                    };
                    if let Some(reason) = reason {
                        self.sh.count_denied(id, r, reason);
                        out.push(Action::Send { vm: id, frame: Frame::deny_for(f.seq, r, reason) });
                        return;
                    }
                }
                let Some(policy) = self.resources.get_mut(&r) else {
                    self.sh.count_denied(id, r, DenyReason::Unsupported);
                    out.push(Action::Send { vm: id, frame: Frame::deny_for(f.seq, r, DenyReason::Unsupported) });
                    return;
                };
                if let Some(value) = policy.frame(&mut self.sh, id, &f, now, out) {
                    let _ = self.sh.request(policy.as_mut(), id, value, now, Some(f.seq), out);
                }
            }
        }
    }

    /// `REGISTER`: grants the resources asked for that the host supports. Those the operator
    /// turned off are granted too but not acknowledged: the agent is told `ENABLE` when they
    /// come back on. A registration with nothing on is refused with `DENY(disabled)`.
    fn register(&mut self, id: VmId, f: Frame, now: u64, out: &mut Vec<Action>) {
        let vm = self.sh.vms.get_mut(&id).expect("caller checked");
        if !vm.frames.take(now) {
            *vm.counters.denied.entry(DenyReason::RateLimited.name()).or_default() += 1;
            out.push(Action::Send { vm: id, frame: Frame::deny(f.seq, DenyReason::RateLimited) });
            return;
        }
        // A (re-)registering agent starts from scratch: nothing is boosted on its side.
        self.end_agent_boosts(id, now, out);
        let granted = f.value & self.grantable();
        let on = self.sh.on_bits(&self.sh.vms[&id]) & granted;
        let vm = self.sh.vms.get_mut(&id).expect("caller checked");
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

    /// Ends the boosts the VM's agent asked for (its registration is over).
    fn end_agent_boosts(&mut self, id: VmId, now: u64, out: &mut Vec<Action>) {
        for (r, p) in self.resources.iter_mut() {
            p.agent_gone(&mut self.sh, id);
            if r.request_kind().is_none() {
                continue;
            }
            if let Some(s) = self.sh.vms.get_mut(&id).and_then(|vm| vm.slots.get_mut(r)) {
                s.wants = 0;
            }
            self.sh.end_boost(p.as_mut(), id, now, out);
        }
    }

    /// A malformed frame (`seq` if its header was readable) or `garbage_bytes` skipped while
    /// resynchronising. Replies `DENY(malformed)`; past `malformed_rate` the VM is deregistered.
    pub fn malformed(&mut self, id: VmId, seq: Option<u32>, garbage_bytes: u64, now: u64, out: &mut Vec<Action>) {
        self.on_malformed(id, seq, garbage_bytes, now, out);
        self.finish(Touched::One(id), now, out);
    }

    fn on_malformed(&mut self, id: VmId, seq: Option<u32>, garbage_bytes: u64, now: u64, out: &mut Vec<Action>) {
        let Some(vm) = self.sh.vms.get_mut(&id) else { return };
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
}

impl Shared {
    /// The path every request for `policy`'s resource takes; `seq` is the guest frame's, if any
    /// (then the reply is sent).
    pub fn request(
        &mut self,
        policy: &mut dyn ResourcePolicy,
        id: VmId,
        value: u64,
        now: u64,
        seq: Option<u32>,
        out: &mut Vec<Action>,
    ) -> Result<u64, DenyReason> {
        let r = policy.resource();
        if !self.vms.get(&id).is_some_and(|vm| vm.slots.contains_key(&r)) {
            return Err(DenyReason::Unsupported);
        }
        let result = self.decide(policy, id, value, now, out);
        if let Err(reason) = result {
            self.count_denied(id, r, reason);
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
        policy: &mut dyn ResourcePolicy,
        id: VmId,
        value: u64,
        now: u64,
        out: &mut Vec<Action>,
    ) -> Result<u64, DenyReason> {
        let r = policy.resource();
        let on = self.on_for(&self.vms[&id], r);
        let limits = self.limits[&r];
        let vm = self.vms.get_mut(&id).expect("caller checked");
        let facts = VmFacts { vcpus: vm.vcpus };
        let slot = vm.slots.get_mut(&r).expect("caller checked");
        slot.counters.requests += 1;
        // A request that lowers a privilege is never refused.
        if !slot.requests.take(now) && value != 0 {
            return Err(DenyReason::RateLimited);
        }
        if value == 0 {
            slot.wants = 0;
            self.end_boost(policy, id, now, out);
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
        let granted = policy.admit(id, facts, value, now)?;
        slot.wants = value;
        if slot.level.is_changed() {
            // A new value while boosted (a new RT priority, a memory-bandwidth share that changes).
            slot.granted = granted;
            if policy.acts_on_grant() {
                let level = slot.level;
                out.push(Shared::apply(policy, &self.vms[&id], id, level));
            }
            return Ok(granted);
        }
        if let Some(other) = policy.takes_over() {
            // That resource lets go of the threads before this one takes them.
            self.end_other(id, other, now, out);
        }
        let vm = self.vms.get_mut(&id).expect("caller checked");
        let slot = vm.slots.get_mut(&r).expect("caller checked");
        slot.boosted.start(now);
        slot.counters.boosts += 1;
        slot.granted = granted;
        slot.level = policy.started(id, facts, now, &mut slot.counters);
        if policy.acts_on_grant() {
            let level = slot.level;
            out.push(Shared::apply(policy, &self.vms[&id], id, level));
        }
        self.reschedule(policy, id, now);
        Ok(granted)
    }
}
