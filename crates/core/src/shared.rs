//! What every resource shares, and what a resource's policy may use of it ([`Shared`]): the VMs
//! and their slots, the operator's switches, the budgets and rate limits, the path every request
//! takes, and the coordinator's one ordered set of deadlines.

use std::collections::{BTreeMap, BTreeSet};

use cosched_proto::{DenyReason, Frame, Resource};

use crate::policy::{Limits, Policy};
use crate::resource::{Level, ResourcePolicy};
use crate::vm::Vm;
use crate::{Action, VmId};

/// What a deadline in the coordinator's ordered set is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Due {
    /// A boosted slot: a budget running out, or its resource's own rule (the CPU's guard).
    Slot(VmId, Resource),
    /// A resource policy's own deadline, for a VM or (`None`) host-wide: the CPU's predicted
    /// boosts, event boosting's slices and pay-back, memory-bandwidth checks.
    Policy(Resource, Option<VmId>),
    /// The guard of a VM's static FIFO tuning.
    StaticGuard(VmId),
}

/// See the module documentation.
#[derive(Debug)]
pub struct Shared {
    pub(crate) policy: Policy,
    pub(crate) limits: BTreeMap<Resource, Limits>,
    /// Capability bits the operator turned off for the whole host.
    pub(crate) host_disabled: u64,
    pub(crate) vms: BTreeMap<VmId, Vm>,
    /// (when, what): every deadline, so that a frame or a tick costs O(log n), not a scan.
    deadlines: BTreeSet<(u64, Due)>,
    /// Each entry's time in `deadlines`.
    deadline_of: BTreeMap<Due, u64>,
    /// Boosts of another resource ended on the way ([`ResourcePolicy::takes_over`]): their
    /// policy is told once the call that ended them returns.
    pub(crate) stopped_others: Vec<(VmId, Resource, u64)>,
}

impl Shared {
    pub(crate) fn new(policy: Policy, limits: BTreeMap<Resource, Limits>) -> Shared {
        Shared {
            policy,
            limits,
            host_disabled: 0,
            vms: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            deadline_of: BTreeMap::new(),
            stopped_others: Vec::new(),
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn limits(&self, r: Resource) -> Option<&Limits> {
        self.limits.get(&r)
    }

    pub fn vm(&self, id: VmId) -> Option<&Vm> {
        self.vms.get(&id)
    }

    pub fn vm_mut(&mut self, id: VmId) -> Option<&mut Vm> {
        self.vms.get_mut(&id)
    }

    /// Whether `r` is supported and enabled for the whole host.
    pub fn enabled(&self, r: Resource) -> bool {
        self.limits.contains_key(&r) && self.host_disabled & r.cap() == 0
    }

    /// Whether `r` is on for `vm`: supported, enabled for the host and for the VM.
    pub fn on_for(&self, vm: &Vm, r: Resource) -> bool {
        self.enabled(r) && vm.settings.enabled(r)
    }

    /// Capability bits in effect for `vm`.
    pub(crate) fn on_bits(&self, vm: &Vm) -> u64 {
        self.limits.keys().filter(|r| self.on_for(vm, **r)).fold(0, |b, r| b | r.cap())
    }

    /// Whether `id`'s slot of `r` is away from normal.
    pub fn boosted(&self, id: VmId, r: Resource) -> bool {
        self.vms.get(&id).is_some_and(|vm| vm.level(r).is_changed())
    }

    /// Sets (or moves) the deadline of `due`; `None` removes it.
    pub fn schedule(&mut self, due: Due, when: Option<u64>) {
        if let Some(old) = self.deadline_of.remove(&due) {
            self.deadlines.remove(&(old, due));
        }
        if let Some(w) = when {
            self.deadline_of.insert(due, w);
            self.deadlines.insert((w, due));
        }
    }

    /// The earliest deadline.
    pub(crate) fn first_due(&self) -> Option<(u64, Due)> {
        self.deadlines.first().copied()
    }

    /// Takes the earliest deadline if it has come.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<Due> {
        let &(when, due) = self.deadlines.first()?;
        if when > now {
            return None;
        }
        self.deadlines.pop_first();
        self.deadline_of.remove(&due);
        Some(due)
    }

    /// Forgets every deadline of `vm`.
    pub(crate) fn unschedule_vm(&mut self, vm: VmId) {
        let mine: Vec<Due> = self
            .deadline_of
            .keys()
            .filter(|d| match d {
                Due::Slot(v, _) | Due::StaticGuard(v) => *v == vm,
                Due::Policy(_, v) => *v == Some(vm),
            })
            .copied()
            .collect();
        for d in mine {
            self.schedule(d, None);
        }
    }

    /// Adds `n` to one of a resource's own counters of a VM (shown by `cosched status` and the
    /// metrics beside the shared ones).
    pub fn count(&mut self, id: VmId, r: Resource, name: &'static str, n: u64) {
        if let Some(slot) = self.vms.get_mut(&id).and_then(|vm| vm.slots.get_mut(&r)) {
            *slot.counters.events.entry(name).or_default() += n;
        }
    }

    /// Counts a refusal for `r` (the VM's own counters when it has no slot of `r`).
    pub(crate) fn count_denied(&mut self, id: VmId, r: Resource, reason: DenyReason) {
        let Some(vm) = self.vms.get_mut(&id) else { return };
        match vm.slots.get_mut(&r) {
            Some(s) => *s.counters.denied.entry(reason.name()).or_default() += 1,
            None => *vm.counters.denied.entry(reason.name()).or_default() += 1,
        }
    }

    /// The action bringing `id`'s threads to `level` on `policy`'s resource at what was granted.
    pub(crate) fn apply(policy: &dyn ResourcePolicy, vm: &Vm, id: VmId, level: Level) -> Action {
        let r = policy.resource();
        let granted = vm.slots.get(&r).map_or(0, |s| s.granted);
        let grant = policy.grant(granted, vm.settings.priority);
        Action::Apply { vm: id, resource: r, level, grant }
    }

    /// Ends `id`'s boost on `policy`'s resource, if any.
    pub fn end_boost(&mut self, policy: &mut dyn ResourcePolicy, id: VmId, now: u64, out: &mut Vec<Action>) {
        let r = policy.resource();
        if self.end_slot(id, r, now, policy.acts_on_grant().then_some(&*policy), out) {
            policy.stopped(id, now);
        }
    }

    /// Ends `id`'s boost on another resource `r` than the one deciding; its policy is told
    /// when the call returns ([`Shared::stopped_others`]).
    pub(crate) fn end_other(&mut self, id: VmId, r: Resource, now: u64, out: &mut Vec<Action>) {
        if self.end_slot(id, r, now, None, out) {
            self.stopped_others.push((id, r, now));
        }
    }

    /// The shared part of ending a boost; `Apply(Normal)` through `policy` if given (else a
    /// plain one). Returns whether there was a boost to end.
    fn end_slot(
        &mut self,
        id: VmId,
        r: Resource,
        now: u64,
        policy: Option<&dyn ResourcePolicy>,
        out: &mut Vec<Action>,
    ) -> bool {
        let Some(vm) = self.vms.get_mut(&id) else { return false };
        let priority = vm.settings.priority;
        let Some(slot) = vm.slots.get_mut(&r) else { return false };
        if !slot.level.is_changed() {
            return false;
        }
        slot.counters.boosted_ns += slot.boosted.stop(now);
        slot.counters.deboosts += 1;
        slot.level = Level::Normal;
        slot.granted = 0;
        let acts = policy.is_none_or(|p| p.acts_on_grant());
        self.schedule(Due::Slot(id, r), None);
        if acts {
            let grant = match policy {
                Some(p) => p.grant(0, priority),
                None => crate::Grant::Plain { priority },
            };
            out.push(Action::Apply { vm: id, resource: r, level: Level::Normal, grant });
        }
        true
    }

    /// Recomputes when a boosted slot next needs a tick: a budget running out, or the
    /// resource's own deadline.
    pub(crate) fn reschedule(&mut self, policy: &mut dyn ResourcePolicy, id: VmId, now: u64) {
        let r = policy.resource();
        let limits = self.limits[&r];
        let Some(slot) = self.vms.get_mut(&id).and_then(|vm| vm.slots.get_mut(&r)) else { return };
        let Some(since) = slot.boosted.on_since() else {
            self.schedule(Due::Slot(id, r), None);
            return;
        };
        let mut next: Option<u64> = None;
        let mut consider = |t: u64| next = Some(next.map_or(t, |n| n.min(t)));
        if limits.max_continuous_ns > 0 {
            consider(since + limits.max_continuous_ns);
        }
        if let Some(limit) = limits.share_limit_ns() {
            // Old boosts leave the window as time passes, so this is the earliest it can run out.
            consider(now + limit.saturating_sub(slot.boosted.used(now)));
        }
        if let Some(d) = policy.next_deadline(id, slot.level, now) {
            consider(d);
        }
        self.schedule(Due::Slot(id, r), next);
    }

    /// A boosted slot's deadline came: its budgets, then its resource's own rules.
    pub(crate) fn tick_slot(&mut self, policy: &mut dyn ResourcePolicy, id: VmId, now: u64, out: &mut Vec<Action>) {
        let r = policy.resource();
        let limits = self.limits[&r];
        let Some(vm) = self.vms.get_mut(&id) else { return };
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
            self.end_boost(policy, id, now, out);
            if agent && r.request_kind().is_some() {
                out.push(Action::Send { vm: id, frame: Frame::deny_for(0, r, DenyReason::Budget) });
            }
            return;
        }
        if let Some(level) = policy.tick(id, slot.level, now, &mut slot.counters) {
            slot.level = level;
            if policy.acts_on_grant() {
                out.push(Shared::apply(policy, &self.vms[&id], id, level));
            }
        }
        self.reschedule(policy, id, now);
    }

    /// A host-originated change of level while boosted (event boosting's pay-back at
    /// `Guarded`): the VM's threads go to `level`. Nothing happens unless the VM is boosted on
    /// `policy`'s resource and `level` is not `Normal` (ending a boost is a request for 0).
    pub fn host_level(&mut self, policy: &dyn ResourcePolicy, id: VmId, level: Level, out: &mut Vec<Action>) {
        let r = policy.resource();
        let Some(slot) = self.vms.get_mut(&id).and_then(|vm| vm.slots.get_mut(&r)) else { return };
        if !slot.level.is_changed() || level == Level::Normal || slot.level == level {
            return;
        }
        slot.level = level;
        out.push(Shared::apply(policy, &self.vms[&id], id, level));
    }

    /// `id`'s threads again at its level on `policy`'s resource (a new grant or priority).
    pub fn reapply(&self, policy: &dyn ResourcePolicy, id: VmId, out: &mut Vec<Action>) {
        let Some(vm) = self.vms.get(&id) else { return };
        let level = vm.level(policy.resource());
        if level.is_changed() && policy.acts_on_grant() {
            out.push(Shared::apply(policy, vm, id, level));
        }
    }
}
