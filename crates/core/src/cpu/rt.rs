//! Real-time co-scheduling with the guest's priority (Performance Tuning, sec. 4.3; docs/references.md) and predictive boost
//! of its next wake-up, both on the CPU resource. Pure, like the rest of the coordinator.
//!
//! **Co-scheduling.** A `CPU 1` that names the guest's RT priority (bits 8-15; bit 16, an
//! interrupt being handled, counts as the highest priority, 99) is granted as
//! `1 | host_priority << 8`: the VM's vCPU threads go to `SCHED_FIFO` at `host_priority`, its other
//! threads `other_threads_priority_offset` above. `[rt] priority_map` turns the guest's priority
//! into the host's: `vm` ignores it (a plain boost at the VM's priority and `[boost]` class, as
//! before), `same` takes it as it is, `linear` scales 1..=99 onto 1..=ceiling; the result is
//! capped at the VM's ceiling (`[rt] rt_ceiling`, `[vm.NAME] rt_ceiling`, `cosched vm ceiling`)
//! and never below the VM's own priority. A `CPU 1` with a new priority while boosted re-applies;
//! the ACK carries what was granted.
//!
//! **Predictive boost.** `WAKE d` received at host time `t` says the guest's next RT wake-up is
//! due `d` µs after it sent the frame. The host plans a boost of the VM's CPU slot at
//! `start = t + d - lead` (the same slot, switches, budgets, guard and host reserve as the
//! guest's own boosts) and answers `ACK(start - t in µs)`. The guest's `CPU 1` at its wake-up
//! confirms the prediction (the slot is already boosted) and its `CPU 0` ends the boost; a
//! prediction not confirmed by `t + d + hold` ends by itself and counts as *unconfirmed*: the
//! time it held the VM boosted is charged to a per-VM budget (`predict_max_share_permille` of the
//! CPU's budget window), and a `WAKE` that would overrun it, or that reaches further than
//! `predict_max_delay_ms`, gets `DENY(cpu: budget)`. One prediction per VM: a new `WAKE` replaces
//! it, `WAKE 0` withdraws it.
//!
//! **Standing predictions.** A `WAKE` with a period `P` (a periodic RT task, told once) stands:
//! when one wake-up's hold is over the host plans the next at `due + P` by itself, with no frame
//! from the guest, which stays silent while its wake-ups keep to the pattern. Each period's boost
//! is counted as *standing*, neither confirmed nor charged to the prediction budget: it goes
//! through the CPU slot's own budgets like every boost, and a boost they refuse ends the pattern
//! with `DENY(cpu: budget)`, seq 0, so that the guest speaks again. A standing boost lasts at
//! most half its period: the hold is cut to `P / 2 - lead` where the adapted hold is longer, and
//! a `P` under twice the lead plus the least hold (`predict_hold_us`) is refused with
//! `DENY(cpu: budget)`. The
//! guest's own `CPU 1` / `CPU 0` meanwhile (another task's need, an activation outside the
//! window) are boosts layered on the pattern: a period's boost does not end while the guest holds
//! one, and the guest's `CPU 0` does not end a period's boost. Only `WAKE 0`, a new `WAKE` or the
//! host's budgets end the pattern. Its `ACK` carries the hold (see `cosched_proto::wake`), so the
//! guest knows how long after a due wake-up it stays covered.
//!
//! **Error and lead.** For every confirmed prediction the error `e = arrival of CPU 1 - (t + d)`
//! is kept (the two frames' transit times cancel to first order; what is left is the guest's
//! wake-up latency, its jitter and the drift between the clocks). A negative error means the
//! guest woke before the predicted time, so the boost must come earlier: `lead` is
//! `predict_lead_min_us` plus the 99th percentile of `-e` over the last [`SAMPLES`] predictions,
//! at most `predict_lead_max_us`. A `CPU 1` earlier than `t + d - predict_lead_max_us` is taken
//! for an unrelated need, not a confirmation. The lead and the hold take only the errors of the
//! last [`ADAPT_WINDOW_NS`] (10 s): once the guest is on time again they come back to their least.

use std::collections::BTreeMap;

use cosched_proto::{cpu::Need, wake, DenyReason, Frame, Resource};
use serde::{Deserialize, Serialize};

use super::CpuPolicy;
use crate::shared::{Due, Shared};
use crate::window::OnTime;
use crate::{check_priority, Action, ConfigError, Error, VmId};

const US: u64 = 1_000;
/// Recent samples kept per VM for the error and lateness percentiles (fixed memory per VM).
pub const SAMPLES: usize = 128;
/// The lead and the hold adapt to the errors of this last stretch of time only: a burst of late
/// or early wake-ups (a host that stalled the guest) stops counting once it is this old, and with
/// no error this recent both are back at their least.
pub const ADAPT_WINDOW_NS: u64 = 10_000_000_000;

/// How a guest's RT priority becomes the host's (`[rt] priority_map`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PriorityMap {
    /// The guest's priority is ignored: the VM's own priority and `[boost]` class.
    Vm,
    /// The guest's priority, capped at the ceiling.
    Same,
    /// 1..=99 scaled onto 1..=ceiling (keeps the guest's order of priorities).
    Linear,
}

/// `[rt]` in the host config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RtConfig {
    pub priority_map: PriorityMap,
    /// Highest host priority a guest's priority maps to, unless set per VM (1..=98; it and
    /// `other_threads_priority_offset` must stay below `daemon_priority`). Unset:
    /// [`DEFAULT_CEILING`], or lower if the daemon's own priority is lower.
    pub rt_ceiling: Option<u8>,
    /// Whether `WAKE` is honoured (else `DENY(cpu: unsupported)`).
    pub predict: bool,
    /// The least time a predicted boost comes before the predicted wake-up.
    pub predict_lead_min_us: u64,
    /// The most, however early guests have woken.
    pub predict_lead_max_us: u64,
    /// A predicted boost not confirmed this long after the predicted wake-up ends by itself, at
    /// least: the hold grows to `p99` of how late the guest's confirmations came in the last 10 s
    /// (a standing pattern's to half its period less the lead at most), ...
    pub predict_hold_us: u64,
    /// ... and at most this long.
    pub predict_hold_max_us: u64,
    /// A `WAKE` further ahead than this is refused (`DENY(cpu: budget)`).
    pub predict_max_delay_ms: u64,
    /// Unconfirmed predicted boost time a VM may hold per CPU budget window, in permille of it
    /// (1000: no limit).
    pub predict_max_share_permille: u64,
}

impl Default for RtConfig {
    fn default() -> Self {
        RtConfig {
            priority_map: PriorityMap::Same,
            rt_ceiling: None,
            predict: true,
            predict_lead_min_us: 500,
            predict_lead_max_us: 2_000,
            predict_hold_us: 500,
            predict_hold_max_us: 10_000,
            predict_max_delay_ms: 1_000,
            predict_max_share_permille: 100,
        }
    }
}

/// The ceiling when `[rt] rt_ceiling` is not set: below the kernel's threaded interrupt handlers
/// (`SCHED_FIFO` 50), so that a guest cannot hold off the host's interrupts.
pub const DEFAULT_CEILING: u8 = 49;

impl RtConfig {
    /// The global ceiling in force.
    pub fn ceiling(&self) -> u8 {
        self.rt_ceiling.unwrap_or(DEFAULT_CEILING)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(c) = self.rt_ceiling {
            check_priority("[rt] rt_ceiling", c)?;
        }
        if self.predict_lead_min_us > self.predict_lead_max_us {
            return Err(ConfigError::conflict(
                "[rt] predict_lead_min_us",
                self.predict_lead_min_us,
                format!("at most predict_lead_max_us = {}", self.predict_lead_max_us),
            ));
        }
        if self.predict_hold_us > self.predict_hold_max_us {
            return Err(ConfigError::conflict(
                "[rt] predict_hold_us",
                self.predict_hold_us,
                format!("at most predict_hold_max_us = {}", self.predict_hold_max_us),
            ));
        }
        // A WAKE's delay is a u32 of µs.
        if self.predict_max_delay_ms == 0 || self.predict_max_delay_ms > u32::MAX as u64 / 1000 {
            return Err(ConfigError::range("[rt] predict_max_delay_ms", format!("1..={}", u32::MAX / 1000)));
        }
        if self.predict_max_share_permille == 0 || self.predict_max_share_permille > 1000 {
            return Err(ConfigError::range("[rt] predict_max_share_permille", "1..=1000"));
        }
        Ok(())
    }

    /// The host priority for the guest's `need`, or `None` for a plain boost (no priority
    /// given, or `priority_map = "vm"`).
    pub fn host_priority(&self, need: Need, ceiling: u8, vm_priority: u8) -> Option<u8> {
        let guest = if need.irq { cosched_proto::cpu::MAX_GUEST_PRIORITY } else { need.priority };
        if guest == 0 {
            return None;
        }
        let max = cosched_proto::cpu::MAX_GUEST_PRIORITY as u32;
        let mapped = match self.priority_map {
            PriorityMap::Vm => return None,
            PriorityMap::Same => guest.min(ceiling),
            PriorityMap::Linear => (guest as u32 * ceiling as u32).div_ceil(max).clamp(1, ceiling as u32) as u8,
        };
        Some(mapped.max(vm_priority))
    }
}

/// The host priority a CPU grant carries (bits 8-15), if it is an RT co-scheduling grant.
pub fn granted_priority(value: u64) -> Option<u8> {
    Some((value >> 8 & 0xff) as u8).filter(|p| value & 1 == 1 && *p != 0)
}

/// Fixed-size ring of recent samples (each with when it was taken) with percentiles.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    ring: Vec<(u64, i64)>,
    next: usize,
    pub count: u64,
    pub max: i64,
}

impl Samples {
    pub fn push(&mut self, v: i64) {
        self.push_at(0, v);
    }

    /// A sample taken at time `at`.
    pub fn push_at(&mut self, at: u64, v: i64) {
        self.max = if self.count == 0 { v } else { self.max.max(v) };
        self.count += 1;
        if self.ring.len() < SAMPLES {
            self.ring.push((at, v));
        } else {
            self.ring[self.next] = (at, v);
        }
        self.next = (self.next + 1) % SAMPLES;
    }

    /// The `p`-quantile (0..=1) of the recent samples, if any.
    pub fn quantile(&self, p: f64) -> Option<i64> {
        self.quantile_since(p, 0)
    }

    /// The `p`-quantile (0..=1) of the recent samples taken at `since` or later, if any.
    pub fn quantile_since(&self, p: f64, since: u64) -> Option<i64> {
        let mut v: Vec<i64> = self.ring.iter().filter(|s| s.0 >= since).map(|s| s.1).collect();
        v.sort_unstable();
        (!v.is_empty()).then(|| v[((v.len() - 1) as f64 * p).round() as usize])
    }

    fn summary_us(&self) -> SamplesSummary {
        let us = |v: Option<i64>| v.map_or(0.0, |n| n as f64 / 1e3);
        SamplesSummary {
            count: self.count,
            p50_us: us(self.quantile(0.5)),
            p99_us: us(self.quantile(0.99)),
            max_us: us((self.count > 0).then_some(self.max)),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SamplesSummary {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// Predictions of one VM, by outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PredictCounters {
    /// `WAKE` frames with a delay.
    pub received: u64,
    /// Predicted boosts applied at their time.
    pub applied: u64,
    /// Predictions whose wake-up found the VM already boosted by its guest: nothing to apply.
    pub covered: u64,
    /// Predicted boosts the CPU's rules refused at their time (budget, host reserve, disabled).
    pub refused: u64,
    /// Confirmed by the guest's `CPU 1`.
    pub confirmed: u64,
    /// ... of which the `CPU 1` came before the boost was applied (the lead was too short).
    pub early: u64,
    /// Ended by themselves after the hold, charged to the prediction budget.
    pub unconfirmed: u64,
    /// ... of which the guest's `CPU 1` came after the hold (its error then lengthens the hold).
    pub late: u64,
    /// `WAKE` refused.
    pub denied: u64,
    /// Withdrawn by `WAKE 0` or replaced by a new `WAKE`.
    pub cancelled: u64,
    /// Periods a standing prediction boosted by itself (its hold over, the next one planned).
    pub standing: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for its start.
    Planned,
    /// The host boosted the VM for it, at this time.
    Applied(u64),
    /// The VM was boosted by its guest when it was due to start.
    Covered,
}

#[derive(Debug, Clone)]
struct Prediction {
    /// When the guest's wake-up is due (host time: arrival of the `WAKE` + its delay).
    due: u64,
    /// When the boost should be in force: `due - lead`.
    target: u64,
    /// When the host acts: `target` less how late the daemon's timer usually is.
    start: u64,
    end: u64,
    priority: u8,
    state: State,
    /// A standing prediction's period (0: one wake-up).
    period: u64,
}

#[derive(Debug, Clone)]
struct RtVm {
    /// The guest's last `CPU` value (0: none).
    need: u64,
    pred: Option<Prediction>,
    lead_ns: u64,
    /// How long an applied prediction waits for its confirmation after the predicted wake-up.
    hold_ns: u64,
    /// The predicted wake-up of the last prediction that ended unconfirmed after its hold: a
    /// `CPU 1` soon after, before the guest's next `WAKE`, is its late confirmation, and its error is kept (else the errors
    /// would only ever show confirmations that came within the hold).
    missed_due: Option<u64>,
    /// `e = arrival of the confirming CPU 1 - due`, ns.
    errors: Samples,
    /// Applied vs the target (`due - lead`), ns, measured by the daemon after its actuators ran.
    late: Samples,
    /// Applied vs when the host acted (the daemon's own wake-up and actuation), ns: the host
    /// acts this much (its median) before the target.
    act: Samples,
    /// Unconfirmed predicted boost time over the CPU's budget window.
    unconfirmed: OnTime,
    counters: PredictCounters,
}

/// The CPU policy's RT state: the config, per-VM ceilings (by name, so they survive a
/// reconnect), each VM's predictions (their deadlines are in the coordinator's one set, as
/// [`Due::Policy`] of the CPU).
#[derive(Debug)]
pub struct Rt {
    cfg: RtConfig,
    ceilings: BTreeMap<String, u8>,
    vms: BTreeMap<VmId, RtVm>,
    /// Predicted boosts started since the daemon last asked: (VM, target, acted at).
    started: Vec<(VmId, u64, u64)>,
    window_ns: u64,
}

impl Rt {
    pub fn new(cfg: RtConfig, window_ns: u64) -> Rt {
        Rt { cfg, ceilings: BTreeMap::new(), vms: BTreeMap::new(), started: Vec::new(), window_ns }
    }

    pub fn config(&self) -> &RtConfig {
        &self.cfg
    }

    pub fn ceiling(&self, name: &str) -> u8 {
        self.ceilings.get(name).copied().unwrap_or(self.cfg.ceiling())
    }

    fn vm(&mut self, id: VmId) -> &mut RtVm {
        let (lead, hold, w) = (self.cfg.predict_lead_min_us * US, self.cfg.predict_hold_us * US, self.window_ns);
        self.vms.entry(id).or_insert_with(|| RtVm {
            need: 0,
            pred: None,
            lead_ns: lead,
            hold_ns: hold,
            missed_due: None,
            errors: Samples::default(),
            late: Samples::default(),
            act: Samples::default(),
            unconfirmed: OnTime::new(w),
            counters: PredictCounters::default(),
        })
    }

    /// Sets (or clears) when VM `id`'s prediction next has something to do.
    fn set_deadline(&mut self, sh: &mut Shared, id: VmId, when: Option<u64>) {
        if self.vms.get(&id).is_some_and(|v| v.pred.is_some()) {
            sh.schedule(Due::Policy(Resource::Cpu, Some(id)), when);
        }
    }

    /// Drops VM `id`'s prediction (its deadline too).
    fn drop_prediction(&mut self, sh: &mut Shared, id: VmId) -> Option<Prediction> {
        let p = self.vms.get_mut(&id)?.pred.take()?;
        sh.schedule(Due::Policy(Resource::Cpu, Some(id)), None);
        Some(p)
    }

    /// The lead and the hold from the errors of the last [`ADAPT_WINDOW_NS`] before `now`.
    fn adapt(&mut self, id: VmId, now: u64) {
        let (min, max) = (self.cfg.predict_lead_min_us * US, self.cfg.predict_lead_max_us * US);
        let (hold_min, hold_max) = (self.cfg.predict_hold_us * US, self.cfg.predict_hold_max_us * US);
        let since = now.saturating_sub(ADAPT_WINDOW_NS);
        let v = self.vm(id);
        let early = v.errors.quantile_since(0.01, since).map_or(0, |e| (-e).max(0) as u64);
        v.lead_ns = (min + early).min(max);
        let late = v.errors.quantile_since(0.99, since).map_or(0, |e| e.max(0) as u64);
        v.hold_ns = late.clamp(hold_min, hold_max);
    }

    /// How long VM `id`'s prediction with `period` (0: one wake-up) holds after its wake-up: the
    /// adapted hold, and for a standing one at most what keeps the VM boosted half the period.
    fn hold_for(&self, id: VmId, period: u64) -> u64 {
        let Some(v) = self.vms.get(&id) else { return self.cfg.predict_hold_us * US };
        match period {
            0 => v.hold_ns,
            p => v.hold_ns.min((p / 2).saturating_sub(v.lead_ns)),
        }
    }
}

/// What `cosched status` shows of a VM's RT co-scheduling and predictions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RtStatus {
    pub priority_map: PriorityMap,
    pub ceiling: u8,
    /// The guest's priority in its last `CPU 1` (0: none given).
    pub guest_priority: u8,
    /// The host priority of the vCPUs now, when an RT co-scheduling grant is in force.
    pub host_priority: Option<u8>,
    pub predictions: PredictCounters,
    pub lead_us: f64,
    /// How long an applied prediction now waits for its confirmation after the wake-up.
    pub hold_us: f64,
    /// `arrival of the confirming CPU 1 - predicted wake-up`.
    pub predict_error_us: SamplesSummary,
    /// Planned vs applied start of predicted boosts, measured after the actuators ran.
    pub predict_apply_late_us: SamplesSummary,
    /// Unconfirmed predicted boost time in the budget window.
    pub unconfirmed_ms: f64,
    /// The pending prediction: its wake-up, from now (negative: past), and its state.
    pub pending: Option<(f64, &'static str)>,
}

impl CpuPolicy {
    /// Sets `[rt]` (the default is [`RtConfig::default`]); `window_ns` is the CPU's budget window.
    pub fn set_rt(&mut self, cfg: RtConfig, window_ns: u64) {
        let ceilings = std::mem::take(&mut self.rt.ceilings);
        self.rt = Rt::new(cfg, window_ns);
        self.rt.ceilings = ceilings;
    }

    pub fn rt(&self) -> &Rt {
        &self.rt
    }

    /// Config: the RT ceiling of the VM named `name` (`None`: the default).
    pub fn set_ceiling(&mut self, name: &str, ceiling: Option<u8>) {
        match ceiling {
            Some(c) => self.rt.ceilings.insert(name.to_string(), c),
            None => self.rt.ceilings.remove(name),
        };
    }

    /// Operator: VM `id`'s RT ceiling; a boost in force under the old one is re-granted.
    pub fn set_vm_ceiling(
        &mut self,
        sh: &mut Shared,
        id: VmId,
        ceiling: u8,
        out: &mut Vec<Action>,
    ) -> Result<(), Error> {
        check_priority("ceiling", ceiling)?;
        let name = sh.vm(id).ok_or(Error::NoSuchVm(id))?.name.clone();
        self.rt.ceilings.insert(name, ceiling);
        if self.regrant_cpu(sh, id) {
            sh.reapply(self, id, out);
        }
        Ok(())
    }

    /// The CPU value to grant for the guest's `CPU` value `value`: plain `1`, or
    /// `1 | host_priority << 8` (see the module documentation).
    pub(crate) fn cpu_grant(&self, sh: &Shared, id: VmId, value: u64) -> u64 {
        let (Some(need), Some(vm)) = (Need::decode(value), sh.vm(id)) else { return value };
        match self.rt.cfg.host_priority(need, self.rt.ceiling(&vm.name), vm.settings.priority) {
            Some(p) => 1 | (p as u64) << 8,
            None => 1,
        }
    }

    /// After a change of VM priority or ceiling: a boost in force from the guest's priority gets
    /// what it maps to now. Returns whether the grant changed (the caller re-applies it).
    pub(crate) fn regrant_cpu(&mut self, sh: &mut Shared, id: VmId) -> bool {
        let need = self.rt.vms.get(&id).map_or(0, |v| v.need);
        let grant = self.cpu_grant(sh, id, need);
        let Some(slot) = sh.vm_mut(id).and_then(|vm| vm.slots.get_mut(&Resource::Cpu)) else { return false };
        let changed = slot.level.is_changed() && need != 0 && slot.granted != grant;
        if changed {
            slot.granted = grant;
        }
        changed
    }

    /// A guest's `CPU` frame, before the shared path: takes in its need and what it says about
    /// the pending prediction. Returns the value to ask for, or `None` when it was handled here
    /// (a `CPU 0` that leaves a prediction holding the boost: acknowledged here).
    pub(crate) fn rt_cpu_frame(
        &mut self,
        sh: &mut Shared,
        id: VmId,
        f: &Frame,
        now: u64,
        out: &mut Vec<Action>,
    ) -> Option<u64> {
        let lead_max = self.rt.cfg.predict_lead_max_us * US;
        let hold_max = self.rt.cfg.predict_hold_max_us * US;
        let v = self.rt.vm(id);
        v.need = f.value;
        let state = v.pred.as_ref().map(|p| (p.state, p.due));
        let standing = v.pred.as_ref().is_some_and(|p| p.period != 0);
        match state {
            Some((State::Covered, due)) if f.value == 0 && now < due => {
                // The guest lets go just before its predicted wake-up: the prediction holds the
                // boost from now on, as if it had applied it.
                v.pred.as_mut().expect("matched").state = State::Applied(now);
                out.push(Action::Send { vm: id, frame: Frame::ack(f.seq, 0) });
                return None;
            }
            Some((State::Applied(_), _)) if f.value == 0 && standing => {
                // The guest ends a boost of its own while a standing prediction's is on: the
                // prediction's stays until its hold is over.
                out.push(Action::Send { vm: id, frame: Frame::ack(f.seq, 0) });
                return None;
            }
            Some(_) if f.value != 0 && standing => {
                // The guest boosts while its pattern stands (another task, or an activation
                // outside its window): its own boost, layered on the pattern, which goes on.
            }
            Some((State::Applied(at), _)) if f.value == 0 => {
                // The guest never confirmed and ends the boost itself.
                v.counters.unconfirmed += 1;
                v.unconfirmed.charge(at, now);
                self.rt.drop_prediction(sh, id);
            }
            Some((_, due)) if f.value != 0 && now + lead_max >= due => {
                let early = matches!(state, Some((State::Planned, _)));
                v.counters.confirmed += 1;
                v.counters.early += early as u64;
                v.errors.push_at(now, now as i64 - due as i64);
                v.missed_due = None;
                self.rt.drop_prediction(sh, id);
                self.rt.adapt(id, now);
            }
            None if f.value != 0 => {
                // The late confirmation of a prediction whose hold ran out (within the most the
                // hold may grow to): its error is kept, so the hold learns to wait that long.
                if let Some(due) = v.missed_due.take().filter(|&d| now >= d && now - d <= hold_max) {
                    v.counters.late += 1;
                    v.errors.push_at(now, (now - due) as i64);
                    self.rt.adapt(id, now);
                }
            }
            _ => {}
        }
        Some(self.cpu_grant(sh, id, f.value))
    }

    /// A `CPU 0` that carries the next wake-up (`cosched_proto::cpu`): the deboost of a plain
    /// `CPU 0`, then the `WAKE`; exactly one reply, the `WAKE`'s (a refused prediction leaves the
    /// deboost done). One frame where there were two: each is an interrupt and an exit in the guest
    /// next to its RT task.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn deboost_wake(
        &mut self,
        sh: &mut Shared,
        id: VmId,
        f: &Frame,
        delay_us: u32,
        priority: u8,
        now: u64,
        out: &mut Vec<Action>,
    ) {
        let deboost = Frame::cpu(f.seq, false);
        let mut acts = Vec::new();
        if let Some(value) = self.rt_cpu_frame(sh, id, &deboost, now, &mut acts) {
            let _ = sh.request(self, id, value, now, None, &mut acts);
        }
        // The deboost's own acknowledgement (when a prediction took the boost over): the WAKE's
        // reply answers the frame.
        acts.retain(|a| !matches!(a, Action::Send { vm, frame } if *vm == id && frame.seq == f.seq));
        out.extend(acts);
        self.wake(sh, id, &Frame::wake(f.seq, delay_us, priority), now, out);
    }

    /// `WAKE`: plans, replaces or withdraws VM `id`'s prediction; exactly one reply.
    pub(crate) fn wake(&mut self, sh: &mut Shared, id: VmId, f: &Frame, now: u64, out: &mut Vec<Action>) {
        // The guest tells its next wake-up after the last one: a CPU 1 from now on is not that
        // one's late confirmation (even if this WAKE is refused and plans nothing).
        self.rt.vm(id).missed_due = None;
        let (delay_us, priority) = wake::decode(f.value);
        let period = wake::period_of(f.value) as u64 * US;
        let result = self.plan(sh, id, delay_us as u64 * US, priority, period, now, out);
        let r = Resource::Cpu;
        let frame = match result {
            Ok(after) if period != 0 => {
                let hold = self.rt.hold_for(id, period);
                Frame::ack(f.seq, wake::standing_ack(after / US, hold / US))
            }
            Ok(after) => Frame::ack(f.seq, after / US),
            Err(reason) => {
                sh.count_denied(id, r, reason);
                self.rt.vm(id).counters.denied += 1;
                Frame::deny_for(f.seq, r, reason)
            }
        };
        out.push(Action::Send { vm: id, frame });
    }

    /// Returns the time from now to the planned start. `period`: a standing prediction's (0: one
    /// wake-up).
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &mut self,
        sh: &mut Shared,
        id: VmId,
        delay: u64,
        priority: u8,
        period: u64,
        now: u64,
        out: &mut Vec<Action>,
    ) -> Result<u64, DenyReason> {
        let r = Resource::Cpu;
        let vm = sh.vm(id).ok_or(DenyReason::Unsupported)?;
        if !self.rt.cfg.predict || !vm.slots.contains_key(&r) {
            return Err(DenyReason::Unsupported);
        }
        match vm.registered {
            None => return Err(DenyReason::NotRegistered),
            Some(g) if g & r.cap() == 0 => return Err(DenyReason::Unsupported),
            _ => {}
        }
        if delay == 0 {
            // Withdrawn.
            if self.rt.vms.get(&id).is_some_and(|v| v.pred.is_some()) {
                self.end_prediction(sh, id, now, true, out);
            }
            return Ok(0);
        }
        if !sh.on_for(vm, r) {
            return Err(DenyReason::Disabled);
        }
        let limits = sh.limits[&r];
        if vm.slots[&r].in_cooldown(now) {
            return Err(DenyReason::Budget);
        }
        let vm = sh.vm_mut(id).expect("checked");
        if !vm.slots.get_mut(&r).expect("checked").requests.take(now) {
            return Err(DenyReason::RateLimited);
        }
        let cfg = self.rt.cfg.clone();
        let limit = limits.window_ns * cfg.predict_max_share_permille / 1000;
        self.rt.adapt(id, now);
        let hold = self.rt.hold_for(id, period);
        let v = self.rt.vm(id);
        v.counters.received += 1;
        let reserve = v.lead_ns + hold;
        // A standing pattern keeps the VM boosted half the period at most: its hold is cut to fit
        // (`hold_for`), and a period too short for the lead and the least hold is refused.
        if delay > cfg.predict_max_delay_ms * crate::NS_PER_MS
            || (cfg.predict_max_share_permille < 1000 && v.unconfirmed.used(now) + reserve > limit)
            || (period != 0 && period < 2 * (v.lead_ns + cfg.predict_hold_us * US))
        {
            return Err(DenyReason::Budget);
        }
        if self.rt.vms.get(&id).is_some_and(|v| v.pred.is_some()) {
            self.end_prediction(sh, id, now, true, out);
        }
        let target = self.plan_at(sh, id, now + delay, priority, period, now, out);
        Ok(target - now)
    }

    /// Plans VM `id`'s boost for a wake-up due at `due` (it starts at once if its time has come).
    /// Returns its target, `due - lead`.
    #[allow(clippy::too_many_arguments)]
    fn plan_at(
        &mut self,
        sh: &mut Shared,
        id: VmId,
        due: u64,
        priority: u8,
        period: u64,
        now: u64,
        out: &mut Vec<Action>,
    ) -> u64 {
        let lead_max = self.rt.cfg.predict_lead_max_us * US;
        let hold = self.rt.hold_for(id, period);
        let v = self.rt.vm(id);
        let target = due.saturating_sub(v.lead_ns).max(now);
        // Once a few are known (the first boost of a VM also writes its state record).
        let act = match v.act.count {
            n if n < 8 => 0,
            _ => v.act.quantile(0.5).unwrap_or(0).clamp(0, lead_max as i64) as u64,
        };
        let start = target.saturating_sub(act).max(now);
        v.pred = Some(Prediction { due, target, start, end: due + hold, priority, state: State::Planned, period });
        self.rt.set_deadline(sh, id, Some(start));
        if start <= now {
            self.start_prediction(sh, id, now, out);
        }
        target
    }

    /// A prediction's start: boost the CPU slot unless the guest holds it already.
    fn start_prediction(&mut self, sh: &mut Shared, id: VmId, now: u64, out: &mut Vec<Action>) {
        let Some(p) = self.rt.vms.get(&id).and_then(|v| v.pred.clone()) else { return };
        if sh.boosted(id, Resource::Cpu) {
            self.rt.vm(id).pred.as_mut().expect("some").state = State::Covered;
            self.rt.set_deadline(sh, id, Some(p.end));
            return;
        }
        let need = Need { priority: p.priority, irq: false }.encode();
        let value = self.cpu_grant(sh, id, need);
        match sh.request(self, id, value, now, None, out) {
            Ok(_) => {
                let v = self.rt.vm(id);
                v.counters.applied += 1;
                v.pred.as_mut().expect("some").state = State::Applied(now);
                self.rt.started.push((id, p.target, p.start));
                self.rt.set_deadline(sh, id, Some(p.end));
            }
            Err(reason) => {
                self.rt.vm(id).counters.refused += 1;
                self.rt.drop_prediction(sh, id);
                if p.period != 0 {
                    // The guest is silent while its pattern stands: tell it the pattern ended.
                    out.push(Action::Send { vm: id, frame: Frame::deny_for(0, Resource::Cpu, reason) });
                }
            }
        }
    }

    /// Ends VM `id`'s prediction: withdrawn or replaced (`cancelled`), or its hold over with no
    /// confirmation. A boost it holds ends, and its time is charged.
    /// A standing prediction's hold over (not cancelled): its boost ends and the next period's
    /// is planned.
    fn end_prediction(&mut self, sh: &mut Shared, id: VmId, now: u64, cancelled: bool, out: &mut Vec<Action>) {
        let Some(p) = self.rt.drop_prediction(sh, id) else { return };
        let v = self.rt.vm(id);
        if p.period != 0 && !cancelled && p.state != State::Planned {
            v.counters.standing += 1;
            // Unless the guest holds a boost of its own now.
            if matches!(p.state, State::Applied(_)) && v.need == 0 && sh.boosted(id, Resource::Cpu) {
                let _ = sh.request(self, id, 0, now, None, out);
            }
            // The next wake-up still ahead (a daemon that woke late skips the ones past).
            let mut due = p.due + p.period;
            while due <= now {
                due += p.period;
            }
            self.plan_at(sh, id, due, p.priority, p.period, now, out);
            return;
        }
        match p.state {
            State::Applied(at) => {
                v.unconfirmed.charge(at, now);
                if cancelled {
                    v.counters.cancelled += 1;
                } else {
                    v.counters.unconfirmed += 1;
                    v.missed_due = Some(p.due);
                }
                if sh.boosted(id, Resource::Cpu) {
                    let _ = sh.request(self, id, 0, now, None, out);
                }
            }
            State::Covered if !cancelled => v.counters.covered += 1,
            _ => v.counters.cancelled += cancelled as u64,
        }
    }

    /// VM `id`'s prediction's time has come: it starts, or it ends.
    pub(crate) fn prediction_due(&mut self, sh: &mut Shared, id: VmId, now: u64, out: &mut Vec<Action>) {
        let Some(p) = self.rt.vms.get(&id).and_then(|v| v.pred.clone()) else { return };
        if p.state == State::Planned {
            self.start_prediction(sh, id, now, out);
        } else {
            self.end_prediction(sh, id, now, false, out);
        }
    }

    /// The agent is gone or starts over, or the VM is gone: its prediction ends (not counted).
    pub(crate) fn rt_forget(&mut self, sh: &mut Shared, id: VmId, gone: bool) {
        self.rt.drop_prediction(sh, id);
        if gone {
            self.rt.vms.remove(&id);
        } else if let Some(v) = self.rt.vms.get_mut(&id) {
            v.need = 0;
        }
    }

    /// Predicted boosts started since the last call: (VM, target, planned start).
    /// The daemon measures when its actuators were done and reports it with
    /// [`CpuPolicy::predict_applied`].
    pub fn predicted_starts(&mut self) -> Vec<(VmId, u64, u64)> {
        std::mem::take(&mut self.rt.started)
    }

    pub fn has_predicted_starts(&self) -> bool {
        !self.rt.started.is_empty()
    }

    /// A predicted boost with `target` and planned `start` (see
    /// [`CpuPolicy::predicted_starts`]) was in force at `applied`. `applied - start` is what the
    /// host takes to act on a deadline (its timer's lateness and the actuators): later
    /// predictions start that much (its median over the last samples, once there are 8: robust to the
    /// odd hiccup) before their target.
    pub fn predict_applied(&mut self, id: VmId, target: u64, start: u64, applied: u64) {
        if let Some(v) = self.rt.vms.get_mut(&id) {
            v.late.push(applied as i64 - target as i64);
            v.act.push(applied as i64 - start as i64);
        }
    }

    /// What `cosched status` shows of VM `id`'s RT co-scheduling and predictions.
    pub fn rt_status(&self, sh: &Shared, id: VmId, now: u64) -> Option<RtStatus> {
        let vm = sh.vm(id)?;
        let granted = vm.slot(Resource::Cpu).map_or(0, |s| s.granted);
        let mut st = RtStatus {
            priority_map: self.rt.cfg.priority_map,
            ceiling: self.rt.ceiling(&vm.name),
            guest_priority: 0,
            host_priority: granted_priority(granted),
            predictions: PredictCounters::default(),
            lead_us: self.rt.cfg.predict_lead_min_us as f64,
            hold_us: self.rt.cfg.predict_hold_us as f64,
            predict_error_us: SamplesSummary::default(),
            predict_apply_late_us: SamplesSummary::default(),
            unconfirmed_ms: 0.0,
            pending: None,
        };
        if let Some(v) = self.rt.vms.get(&id) {
            st.guest_priority = Need::decode(v.need).map_or(0, |n| n.priority);
            st.predictions = v.counters.clone();
            st.lead_us = v.lead_ns as f64 / 1e3;
            st.hold_us = v.hold_ns as f64 / 1e3;
            st.predict_error_us = v.errors.summary_us();
            st.predict_apply_late_us = v.late.summary_us();
            st.unconfirmed_ms = v.unconfirmed.clone().used(now) as f64 / 1e6;
            st.pending = v.pred.as_ref().map(|p| {
                let state = match p.state {
                    _ if p.period != 0 => "standing",
                    State::Planned => "planned",
                    State::Applied(_) => "applied",
                    State::Covered => "covered",
                };
                ((p.due as f64 - now as f64) / 1e3, state)
            });
        }
        Some(st)
    }
}

#[cfg(test)]
mod tests;
