//! Memory-bandwidth regulation (DREAMS D2.2.3 §2, after MemGuard): the pure policy.
//!
//! The operator declares the host's guaranteed bandwidth `G` (what the memory system delivers
//! even under full contention) and a regulation period. Each VM has a guaranteed share of `G`, in
//! permille: the operator's (`[vm.NAME] membw_share`), or what its guest asked for (`MEMBW
//! <permille>`) and was admitted. The shares in force never add up to more than 1000: that is
//! the admission rule, for the operator's shares and the guests' requests alike.
//!
//! Per period, a VM's budget is its share of `G × period`. The caller feeds the bytes each VM
//! moved since the last check ([`Regulator::step`], several checks per period); a VM whose use
//! reaches its budget is throttled (its vCPUs stopped) until the period ends. MemGuard's two
//! ways of not wasting bandwidth:
//! - **reclaim**: at the start of each period a VM that used less than its budget in the last
//!   one is predicted to do so again, and the difference goes to a pool, with the bandwidth no
//!   share holds; a VM that reaches its budget borrows from the pool before it is throttled. A
//!   VM that lent and needs its budget after all takes it back at once: its guarantee is never
//!   lent away for good (within that one period the VMs together may then use more than `G`).
//! - **best effort**: once the VMs together have used `G × period` in a period (every guarantee
//!   met), the throttled VMs run again until the period ends, sharing what the memory system
//!   has beyond `G`.
//!
//! No I/O: [`MembwPolicy`], the `membw` resource's policy in the coordinator, owns the
//! regulator: it admits the guests' requests, runs the checks at its deadlines in the
//! coordinator's one set (the bytes each VM moved come from the [`Sensors`]: the daemon reads
//! PMU, resctrl or a replayed trace) and asks for the throttles ([`Action::Apply`] at
//! [`Level::Throttled`]); the experiment `membw` drives the regulator with a model of the memory
//! system ([`sim`]).

pub mod sim;

use std::collections::BTreeMap;

use cosched_proto::{DenyReason, Resource};
use serde::{Deserialize, Serialize};

use crate::resource::{EventOutcome, Grant, HostEvent, Level, ResourcePolicy, Sensors};
use crate::shared::{Due, Shared};
use crate::{Action, ConfigError, MembwError, VmFacts, VmId, NS_PER_S};

/// The regulator's settings (the operator's `[membw]` and `cosched membw`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegulatorConfig {
    /// The host's guaranteed memory bandwidth, MB/s (10^6 bytes): what the shares divide.
    pub guaranteed_mbps: u64,
    /// The regulation period: budgets are per period, a throttled VM waits for the next one.
    pub period_ns: u64,
    /// Lend what a VM is predicted not to use (and what no share holds) to VMs that need more.
    pub reclaim: bool,
    /// Once every guarantee is met in a period, let every VM run until it ends.
    pub best_effort: bool,
}

impl RegulatorConfig {
    /// `G × period`, in bytes.
    pub fn period_bytes(&self) -> u64 {
        (self.guaranteed_mbps as u128 * 1_000_000 * self.period_ns as u128 / NS_PER_S as u128) as u64
    }

    /// A share's budget per period, in bytes.
    pub fn budget(&self, share_permille: u64) -> u64 {
        (self.period_bytes() as u128 * share_permille as u128 / 1000) as u64
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.guaranteed_mbps == 0 {
            return Err(ConfigError::range("guaranteed_mbps", "> 0 (the host's guaranteed memory bandwidth, MB/s)"));
        }
        if self.period_ns < 1_000_000 || self.period_ns > 10 * NS_PER_S {
            return Err(ConfigError::range("period_ms", "1..=10000"));
        }
        Ok(())
    }
}

/// Counters of one VM's regulation, as `cosched status` and the metrics show them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VmBwStats {
    /// Bytes moved, in total.
    pub bytes: u64,
    /// Bytes moved in the last complete period.
    pub last_period_bytes: u64,
    /// Times throttled (decided).
    pub throttles: u64,
    /// Time the VM was stopped (closed throttles): from the lever's confirmation that it is in
    /// force ([`Regulator::confirm_stop`]) to the throttle's end.
    pub throttled_ns: u64,
    /// Time between a throttle's decision and that confirmation (or the throttle's end, when
    /// it never came): a v1 freezer group reads `FREEZING` until every thread in it is frozen,
    /// which a thread in uninterruptible sleep can put off for long.
    pub stopping_ns: u64,
    /// Throttles that ended before the lever confirmed them.
    pub unconfirmed_throttles: u64,
    /// Bytes borrowed from the pool (reclaim).
    pub borrowed_bytes: u64,
    /// Bytes of its budget lent to the pool (predicted unused).
    pub lent_bytes: u64,
    /// Bytes of a lent budget taken back.
    pub taken_back_bytes: u64,
}

/// One VM's regulation.
#[derive(Debug, Clone, Default)]
pub struct VmBw {
    /// The operator's share, permille of `G`.
    pub share: u64,
    /// The guest's admitted request, which replaces the operator's share while it stands.
    pub requested: Option<u64>,
    /// Bytes moved this period.
    pub used: u64,
    /// This period's own budget (the guarantee less what was lent).
    pub budget: u64,
    /// Bytes borrowed from the pool this period.
    pub borrowed: u64,
    /// Throttled since this time (ns), until the period ends: the decision.
    pub throttled_since: Option<u64>,
    /// Stopped since this time (ns): when the lever confirmed the throttle in force.
    pub stopped_since: Option<u64>,
    pub stats: VmBwStats,
}

impl VmBw {
    /// The share in force.
    pub fn effective(&self) -> u64 {
        self.requested.unwrap_or(self.share)
    }

    /// Whether the regulator holds it back (decided; perhaps not in force yet).
    pub fn throttled(&self) -> bool {
        self.throttled_since.is_some()
    }

    /// Whether it is held back and the lever said so: only such a VM counts as stopped.
    pub fn stopped(&self) -> bool {
        self.stopped_since.is_some()
    }

    /// The throttle ends at `now`: the time stopped, or waiting to stop, is counted.
    fn end_throttle(&mut self, now: u64) {
        let Some(since) = self.throttled_since.take() else { return };
        match self.stopped_since.take() {
            Some(stopped) => {
                self.stats.stopping_ns += stopped.saturating_sub(since);
                self.stats.throttled_ns += now.saturating_sub(stopped);
            }
            None => {
                self.stats.stopping_ns += now.saturating_sub(since);
                self.stats.unconfirmed_throttles += 1;
            }
        }
    }
}

/// Host-wide counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RegulatorStats {
    pub periods: u64,
    /// Periods in which best effort started (every guarantee met before the end).
    pub best_effort_periods: u64,
}

/// A throttle decision: stop (`true`) or let run (`false`) the VM's vCPUs.
pub type Throttle = (VmId, bool);

/// MemGuard for VMs: see the module documentation.
#[derive(Debug, Clone)]
pub struct Regulator {
    cfg: RegulatorConfig,
    vms: BTreeMap<VmId, VmBw>,
    period_start: u64,
    /// Bytes left to lend this period.
    pool: u64,
    /// Bytes moved this period by every VM.
    used_total: u64,
    /// Best effort has started this period.
    spare: bool,
    pub stats: RegulatorStats,
}

impl Regulator {
    pub fn new(cfg: RegulatorConfig, now: u64) -> Regulator {
        Regulator {
            cfg,
            vms: BTreeMap::new(),
            period_start: now,
            pool: 0,
            used_total: 0,
            spare: false,
            stats: RegulatorStats::default(),
        }
    }

    pub fn config(&self) -> &RegulatorConfig {
        &self.cfg
    }

    /// New settings; they take effect at the next period (a new period length at once).
    pub fn set_config(&mut self, cfg: RegulatorConfig) -> Result<(), ConfigError> {
        cfg.validate()?;
        self.cfg = cfg;
        Ok(())
    }

    pub fn vm(&self, id: VmId) -> Option<&VmBw> {
        self.vms.get(&id)
    }

    pub fn vms(&self) -> impl Iterator<Item = (VmId, &VmBw)> {
        self.vms.iter().map(|(id, v)| (*id, v))
    }

    /// The shares in force, in total (permille).
    pub fn committed(&self) -> u64 {
        self.vms.values().map(VmBw::effective).sum()
    }

    /// What is free for VM `id`: 1000 less every other VM's share in force.
    fn free_for(&self, id: VmId) -> u64 {
        let others: u64 = self.vms.iter().filter(|(v, _)| **v != id).map(|(_, b)| b.effective()).sum();
        1000u64.saturating_sub(others)
    }

    /// A VM is regulated from now on, with the operator's share (permille). A share that does not
    /// fit beside the others is refused, and the VM regulated with none.
    pub fn add(&mut self, id: VmId, share: u64) -> Result<(), MembwError> {
        self.vms.entry(id).or_default();
        let result = self.set_share(id, share);
        let v = self.vms.get_mut(&id).expect("just added");
        v.budget = self.cfg.budget(v.effective());
        result
    }

    pub fn remove(&mut self, id: VmId) {
        self.vms.remove(&id);
    }

    /// The operator sets VM `id`'s share. Refused (nothing changes) if the shares in force would
    /// add up to more than 1000; a guest's request in force stays in force.
    pub fn set_share(&mut self, id: VmId, share: u64) -> Result<(), MembwError> {
        let free = self.free_for(id);
        let v = self.vms.get_mut(&id).ok_or(MembwError::NotRegulated(id))?;
        if v.requested.is_none() && share > free {
            return Err(MembwError::DoesNotFit { share, held: 1000 - free });
        }
        if share > 1000 {
            return Err(MembwError::TooLarge { share });
        }
        v.share = share;
        Ok(())
    }

    /// A guest asks for `want` permille (> 0): it is granted what is free, at most `want`;
    /// refused if nothing is free. The grant replaces the VM's share: a larger one at once (as
    /// a lender takes back its budget), a smaller one from the next period.
    pub fn admit(&mut self, id: VmId, want: u64) -> Result<u64, DenyReason> {
        let free = self.free_for(id);
        let v = self.vms.get_mut(&id).ok_or(DenyReason::Unsupported)?;
        let granted = want.min(free).min(1000);
        if granted == 0 {
            return Err(DenyReason::Budget);
        }
        v.requested = Some(granted);
        Ok(granted)
    }

    /// The guest's request ends: the operator's share is in force again (if it still fits;
    /// else the VM has what is free).
    pub fn clear_request(&mut self, id: VmId) {
        let free = self.free_for(id);
        if let Some(v) = self.vms.get_mut(&id) {
            if v.requested.take().is_some() && v.share > free {
                v.share = free;
            }
        }
    }

    /// When the current period ends.
    pub fn period_end(&self) -> u64 {
        self.period_start + self.cfg.period_ns
    }

    /// Bytes left to lend this period.
    pub fn pool(&self) -> u64 {
        self.pool
    }

    /// Whether best effort is on in this period.
    pub fn in_best_effort(&self) -> bool {
        self.spare
    }

    /// A check at `now`: `usage` is what each VM moved since the previous one. Appends to `out`
    /// the VMs to stop or let run. A period that ended lets every throttled VM run and sets the
    /// new budgets.
    pub fn step(&mut self, now: u64, usage: &[(VmId, u64)], out: &mut Vec<Throttle>) {
        for &(id, bytes) in usage {
            self.account(id, bytes, now, out);
        }
        if self.cfg.best_effort && !self.spare && self.used_total >= self.cfg.period_bytes() {
            self.spare = true;
            self.stats.best_effort_periods += 1;
            for (id, v) in self.vms.iter_mut() {
                if v.throttled() {
                    v.end_throttle(now);
                    out.push((*id, false));
                }
            }
        }
        if now >= self.period_end() {
            self.new_period(now, out);
        }
    }

    /// The lever confirms at `now` that VM `id`'s throttle is in force (its freezer group reads
    /// `FROZEN`, its v2 group `frozen 1`; resctrl MBA at once). Until then the VM does not
    /// count as stopped; the regulator never waits for it (the period's end lets the VM run
    /// whether or not it ever stopped). Nothing for a VM that is not throttled.
    pub fn confirm_stop(&mut self, id: VmId, now: u64) {
        if let Some(v) = self.vms.get_mut(&id).filter(|v| v.throttled() && !v.stopped()) {
            v.stopped_since = Some(now);
        }
    }

    /// The VMs throttled whose lever has not confirmed the stop yet.
    pub fn stopping(&self) -> impl Iterator<Item = VmId> + '_ {
        self.vms.iter().filter(|(_, v)| v.throttled() && !v.stopped()).map(|(id, _)| *id)
    }

    fn account(&mut self, id: VmId, bytes: u64, now: u64, out: &mut Vec<Throttle>) {
        let Some(v) = self.vms.get_mut(&id) else { return };
        v.used += bytes;
        v.stats.bytes += bytes;
        self.used_total += bytes;
        if v.throttled() {
            return;
        }
        let guarantee = self.cfg.budget(v.effective());
        // Borrow a little more than the overshoot, so that a VM does not come back every check.
        let chunk = (self.cfg.period_bytes() / 64).max(1);
        loop {
            let limit = v.budget + v.borrowed;
            if v.used <= limit {
                return;
            }
            if v.budget < guarantee {
                // It lent what it needs after all: its guarantee is its own.
                let back = guarantee - v.budget;
                self.pool = self.pool.saturating_sub(back);
                v.budget = guarantee;
                v.stats.taken_back_bytes += back;
                continue;
            }
            if self.cfg.reclaim && self.pool > 0 {
                let take = self.pool.min(v.used - limit + chunk);
                self.pool -= take;
                v.borrowed += take;
                v.stats.borrowed_bytes += take;
                continue;
            }
            if self.spare {
                return;
            }
            v.throttled_since = Some(now);
            v.stats.throttles += 1;
            out.push((id, true));
            return;
        }
    }

    fn new_period(&mut self, now: u64, out: &mut Vec<Throttle>) {
        self.stats.periods += 1;
        // A daemon that was held up does not replay the periods it missed.
        let periods = ((now - self.period_start) / self.cfg.period_ns).max(1);
        self.period_start += periods * self.cfg.period_ns;
        self.spare = false;
        self.used_total = 0;
        let period_bytes = self.cfg.period_bytes();
        let mut pool = period_bytes.saturating_sub(self.cfg.budget(self.committed()));
        for (id, v) in self.vms.iter_mut() {
            if v.throttled() {
                v.end_throttle(now);
                out.push((*id, false));
            }
            let guarantee = self.cfg.budget(v.effective());
            // MemGuard's prediction: a VM uses what it used in the last period.
            v.budget = if self.cfg.reclaim { v.used.min(guarantee) } else { guarantee };
            let lent = guarantee - v.budget;
            v.stats.lent_bytes += lent;
            pool += lent;
            v.stats.last_period_bytes = v.used;
            v.used = 0;
            v.borrowed = 0;
        }
        self.pool = if self.cfg.reclaim { pool } else { 0 };
    }
}

/// The memory-bandwidth resource in the coordinator: the regulator, the admission of the
/// guests' `MEMBW` requests against the shares in force, and the checks.
#[derive(Debug)]
pub struct MembwPolicy {
    regulator: Regulator,
    checks_per_period: u32,
    /// Time between two checks: the period over `checks_per_period`.
    check_ns: u64,
    /// When the next check is due (its entry in the coordinator's set).
    next_check_ns: u64,
    /// Checks run.
    pub checks: u64,
}

impl MembwPolicy {
    pub fn new(cfg: RegulatorConfig, checks_per_period: u32) -> MembwPolicy {
        let checks_per_period = checks_per_period.max(1);
        let check_ns = (cfg.period_ns / checks_per_period as u64).max(1);
        MembwPolicy {
            regulator: Regulator::new(cfg, 0),
            checks_per_period,
            check_ns,
            next_check_ns: check_ns,
            checks: 0,
        }
    }

    pub fn regulator(&self) -> &Regulator {
        &self.regulator
    }

    /// A VM is regulated from now on with the operator's share (permille; see [`Regulator::add`]).
    pub fn add_vm(&mut self, id: VmId, share: u64) -> Result<(), MembwError> {
        self.regulator.add(id, share)
    }

    /// Operator: VM `id`'s share (see [`Regulator::set_share`]).
    pub fn set_share(&mut self, id: VmId, share: u64) -> Result<(), MembwError> {
        self.regulator.set_share(id, share)
    }

    /// Operator: new settings, and checks spaced for the new period.
    pub fn set_config(&mut self, cfg: RegulatorConfig) -> Result<(), ConfigError> {
        self.regulator.set_config(cfg)?;
        self.check_ns = (cfg.period_ns / self.checks_per_period as u64).max(1);
        Ok(())
    }

    /// A stop is in force once the lever says so (a freezer group reads `FROZEN`): never waited for.
    fn confirm(&mut self, id: VmId, now: u64, sensors: &mut dyn Sensors) {
        if sensors.in_force(id, Resource::Membw) == Some(true) {
            self.regulator.confirm_stop(id, now);
        }
    }

    /// A check: the stops still waiting for their lever, then every VM's bytes to the
    /// regulator, and its decisions to the throttle.
    fn check(&mut self, sh: &mut Shared, now: u64, sensors: &mut dyn Sensors, out: &mut Vec<Action>) {
        let stopping: Vec<VmId> = self.regulator.stopping().collect();
        for id in stopping {
            self.confirm(id, now, sensors);
        }
        let ids: Vec<VmId> = self.regulator.vms().map(|(id, _)| id).collect();
        let usage: Vec<(VmId, u64)> = ids.into_iter().map(|id| (id, sensors.membw_bytes(id, now))).collect();
        let mut decisions = Vec::new();
        self.regulator.step(now, &usage, &mut decisions);
        self.checks += 1;
        for (id, stop) in decisions {
            let share = self.regulator.vm(id).map_or(0, VmBw::effective);
            let level = if stop { Level::Throttled } else { Level::Normal };
            out.push(Action::Apply { vm: id, resource: Resource::Membw, level, grant: Grant::Share(share) });
        }
        // A daemon held up does not run the checks it missed.
        self.next_check_ns = (self.next_check_ns + self.check_ns).max(now + 1);
        sh.schedule(Due::Policy(Resource::Membw, None), Some(self.next_check_ns));
    }
}

impl ResourcePolicy for MembwPolicy {
    fn resource(&self) -> Resource {
        Resource::Membw
    }

    fn admit(&mut self, vm: VmId, _facts: VmFacts, value: u64, _now: u64) -> Result<u64, DenyReason> {
        self.regulator.admit(vm, value)
    }

    fn stopped(&mut self, vm: VmId, _now: u64) {
        self.regulator.clear_request(vm);
    }

    fn grant(&self, granted: u64, _vm_priority: u8) -> Grant {
        Grant::Share(granted)
    }

    /// A guest's share changes the regulation; only a throttle acts on its threads.
    fn acts_on_grant(&self) -> bool {
        false
    }

    fn due(&mut self, sh: &mut Shared, _vm: Option<VmId>, now: u64, sensors: &mut dyn Sensors, out: &mut Vec<Action>) {
        self.check(sh, now, sensors, out);
    }

    /// A throttle just carried out: confirmed at once if the lever says it is in force.
    fn host_event(
        &mut self,
        _sh: &mut Shared,
        vm: VmId,
        ev: HostEvent,
        now: u64,
        sensors: &mut dyn Sensors,
        _out: &mut Vec<Action>,
    ) -> EventOutcome {
        if ev == HostEvent::Applied {
            self.confirm(vm, now, sensors);
        }
        EventOutcome::Noted
    }

    /// The checks run from the start, with or without VMs (the periods are counted).
    fn init(&mut self, sh: &mut Shared) {
        sh.schedule(Due::Policy(Resource::Membw, None), Some(self.next_check_ns));
    }

    fn vm_gone(&mut self, _sh: &mut Shared, vm: VmId) {
        self.regulator.remove(vm);
    }

    fn figures(&self) -> Vec<(&'static str, u64)> {
        let r = &self.regulator;
        vec![
            ("guaranteed_mbps", r.cfg.guaranteed_mbps),
            ("period_ms", r.cfg.period_ns / 1_000_000),
            ("committed_permille", r.committed()),
            ("reclaim", r.cfg.reclaim as u64),
            ("best_effort", r.cfg.best_effort as u64),
            ("periods", r.stats.periods),
            ("best_effort_periods", r.stats.best_effort_periods),
        ]
    }
}

#[cfg(test)]
mod tests;
