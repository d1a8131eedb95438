//! Event-aware boosting for guests without an agent (the FEAS paper, §3.2), on Linux.
//!
//! The host BPF reports an *event* for a VM (its main-loop or I/O thread woken by a device, or a
//! KVM interrupt injection) while one of its vCPU threads is runnable but waiting for a CPU.
//! [`Feas`] decides what to do, and drives the coordinator's `event` resource, which brings the
//! VM's vCPU threads to `SCHED_RR` at the VM's priority ([`Level::Boosted`]), to a low-weight
//! fair class while the VM pays its boost back ([`Level::Guarded`]), or back to what they had
//! ([`Level::Normal`]). The operator switches, per-VM settings, budgets and counters are the
//! coordinator's, as for every resource.
//!
//! The rules, from the seed, and what a Linux host changes:
//! - **At most `n_limit` boosts per counting cycle** (seed: 1 per 10 ms). The count is per VM:
//!   a boost raises all the VM's vCPU threads at once (the host does not know which vCPU the
//!   guest routes the interrupt to). Cycles are `now / cycle_ns`.
//! - **An event beyond the limit is postponed, not dropped:** the VM is boosted at the start of
//!   the next cycle if a vCPU is still waiting then (the seed's postponed queue, swapped in at
//!   the cycle's tick). Several events in one cycle make one postponed boost.
//! - **A boosted vCPU runs until it blocks or its slice ends** (`slice_ns`). The seed's boosted
//!   vCPU cannot be pre-empted (`is_immediate`); here the RR class does that. With `run_us`
//!   (ours), the boost ends once the VM's vCPUs have run that long since it started, from the
//!   host BPF's run time: it costs what the vCPU used to handle the event. A block before that
//!   does not end it (a TCG or KVM vCPU blocks on its VM's own lock in the middle of an I/O
//!   exit, and is woken within microseconds; measured, ending the boost there sent 40% of the
//!   answers back behind the other VMs), and an event while a vCPU *runs* boosts it too, so it
//!   is not preempted before it has answered (FEAS boosts only waiting vCPUs: measured, the 15%
//!   of pings that found the vCPU running made the whole tail).
//! - **Guaranteed-slice accounting.** Xen's credit scheduler debits the time a boosted vCPU ran,
//!   so boosting reorders but does not give more. Linux's fair class does not: time a thread
//!   runs at `SCHED_RR` is not added to its virtual runtime, so every boost would be a gift of
//!   CPU time. With `charge` on, the CPU time the VM's vCPUs ran while boosted becomes a debt,
//!   paid back at [`Level::Guarded`]: the vCPUs are held at `repay_nice` (10 by default: weight
//!   110 against nice 0's 1024), where they run little while anyone else wants the CPU,
//!   until they have missed as much as they got. What they miss is measured, not assumed: a hold
//!   of `t` pays `t x share`, where `share` is the VM's CPU share at its normal level, averaged
//!   over the cycles after each boost or pay-back (see `close_sample()`: the cycle right after a
//!   hold is settled against it instead, and what the vCPUs run while held is in no sample).
//!   Measured, sampling only the cycle after a hold, with what ran while held added, priced a
//!   25% share at about 39% of a CPU, and the VM kept about a quarter of each boost. Until a
//!   first sample, a hold pays its whole length. (Charging the boost to the virtual runtime
//!   through the low weight does not work: the kernel rescales a thread's lag when its weight
//!   changes back, which forgives most of it; measured, a pinged VM kept 26.5% of a CPU shared
//!   four ways.) A pay-back is checked when the debt should be paid at the measured share
//!   (at least 0.5 ms, at most a cycle later): a check once a cycle held a VM 10 ms for a
//!   0.5 ms debt, and an event arriving meanwhile waited for the rest. What a check overshoots
//!   is kept as credit for the next boosts. A VM in debt is not boosted: its events are postponed until the debt is
//!   paid (the seed's "overdraft limited to one rotation"). Only a CPU-bound VM pays: one whose
//!   vCPUs slept less than a tenth of the time since its previous boost. A VM that sleeps uses
//!   less than its share anyway, and a hold at a low weight beside busy VMs would make its next
//!   answer wait for the whole hold (measured: a ping p99 of 260 ms).
//!
//! Pure: time is passed in; what the VM's vCPUs ran and whether one is waiting come from the
//! [`Sensors`] (the daemon reads them from the BPF maps; the tests fake them). [`EventPolicy`] is
//! the `event` resource's policy in the coordinator: the host's events reach it as
//! [`HostEvent`]s, its slices and pay-back checks are its deadlines in the coordinator's one set,
//! and it tells the host which VMs to watch ([`Action::WatchEvents`]).

use std::collections::BTreeMap;

use cosched_proto::Resource;
use serde::{Deserialize, Serialize};

use crate::resource::{EventOutcome, HostEvent, Level, ResourcePolicy, Sensors};
use crate::shared::{Due, Shared};
use crate::{Action, ConfigError, VmId, NS_PER_MS};

/// The most a VM may have paid in advance, in cycles: an overshoot is bounded by one slice of
/// the fair class, so this only guards against a clock that jumps.
const MAX_CREDIT_CYCLES: u64 = 10;

/// Which VMs get event boosting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum EventVms {
    /// VMs whose guest runs no registered agent (an agent's VM keeps guest-driven CPU
    /// coordination).
    #[default]
    NoAgent,
    /// Every VM (not while an agent's CPU boost holds it).
    All,
    /// None.
    None,
}

impl EventVms {
    pub fn name(self) -> &'static str {
        match self {
            EventVms::NoAgent => "no-agent",
            EventVms::All => "all",
            EventVms::None => "none",
        }
    }
}

/// `[event]` in the host config: FEAS's knobs, the FEAS paper's defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FeasConfig {
    pub vms: EventVms,
    /// Boosts per VM per counting cycle (seed: 1).
    pub n_limit: u32,
    /// The counting cycle (seed: the 10 ms tick).
    pub cycle_ms: u64,
    /// The longest boost: a boosted vCPU runs at `SCHED_RR` until it blocks or this ends.
    pub slice_us: u64,
    /// Guaranteed-slice accounting: the CPU time run while boosted is paid back at `repay_nice`
    /// before the next boost, so boosting does not change CPU shares.
    pub charge: bool,
    /// Measure the vCPUs' run delay with the same host BPF (a measure, not part of the policy:
    /// it applies to every VM the daemon knows, whether or not `vms` boosts it).
    pub run_delay: bool,
    /// A boost ends once the VM's vCPUs have run this long since it started (µs): the woken vCPU
    /// had its turn, and the boost costs what it used. A vCPU that blocks before (on a lock of
    /// its own VM's, in the middle of handling the event) stays boosted. 0: a boost lasts until
    /// a vCPU blocks or the slice ends (the FEAS paper's rule). Above `slice_us`, the slice ends
    /// a boost first.
    pub run_us: u64,
    /// With `run_us`: an event that finds a vCPU running (none waiting) boosts it too, so it is
    /// not preempted before it has handled the event. Off (the default): only a waiting vCPU is
    /// boosted (the FEAS paper's rule), and the event is pending until a vCPU is preempted.
    /// Measured: on, a busy VM's ping average fell 1843 -> 648 µs beside 3 busy VMs, but an idle
    /// VM streaming a download beside 3 busy ones was boosted on its packets, paid it back at
    /// nice 19, and downloaded at less than half the speed.
    pub boost_running: bool,
    /// The nice level a VM pays its boosts back at (1..=19). Nice 19 pays fastest and holds the
    /// vCPUs hardest (weight 15); a milder level pays over more cycles, and an event that comes
    /// meanwhile waits for less. 10 by default: in `feas-latency` on two hosts it kept every VM
    /// within ±5% of an equal share with a ping average at or below nice 19's (5.37x against
    /// 5.39x the limit, +0.6% against -0.9%; on a noisier host 3.60x against 5.95x, +3.2%
    /// against -9.8%, where nice 19 overcharged the pinged VM).
    pub repay_nice: i32,
}

impl Default for FeasConfig {
    fn default() -> Self {
        FeasConfig {
            vms: EventVms::NoAgent,
            n_limit: 1,
            cycle_ms: 10,
            slice_us: 1000,
            charge: true,
            run_delay: true,
            run_us: 1000,
            boost_running: false,
            repay_nice: 10,
        }
    }
}

impl FeasConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.n_limit == 0 {
            return Err(ConfigError::range("[event] n_limit", "> 0 (use vms = \"none\" to turn event boosting off)"));
        }
        if self.cycle_ms == 0 {
            return Err(ConfigError::range("[event] cycle_ms", "> 0"));
        }
        if self.slice_us < 100 || self.slice_us > self.cycle_ms * 1000 {
            return Err(ConfigError::invalid(
                "[event] slice_us",
                self.slice_us,
                format!("must be 100..={} (at least 100 µs, at most one cycle)", self.cycle_ms * 1000),
            ));
        }
        if self.run_us != 0 && self.run_us < 50 {
            return Err(ConfigError::invalid("[event] run_us", self.run_us, "must be 0 (off) or at least 50"));
        }
        if !(1..=19).contains(&self.repay_nice) {
            return Err(ConfigError::invalid("[event] repay_nice", self.repay_nice, "must be 1..=19"));
        }
        Ok(())
    }

    /// Whether an event that finds a vCPU running boosts it (`boost_running`, with `run_us`).
    pub fn boosts_running(&self) -> bool {
        self.boost_running && self.run_us > 0
    }

    pub fn run_ns(&self) -> u64 {
        self.run_us * 1000
    }

    pub fn cycle_ns(&self) -> u64 {
        self.cycle_ms * NS_PER_MS
    }

    pub fn slice_ns(&self) -> u64 {
        self.slice_us * 1000
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    /// Boosted until `until` at the latest; its vCPUs had run `cpu0` ns when it started;
    /// `check`: when to see whether they have run `run_us` (`until` without it); `charged`:
    /// whether the VM was CPU-bound before it (its boosts are then paid back).
    Boosted {
        until: u64,
        check: u64,
        cpu0: u64,
        charged: bool,
    },
    /// Paying back; its vCPUs had run `cpu` ns at the last check, at `at`; `next` is the next.
    Repaying {
        cpu: u64,
        at: u64,
        next: u64,
    },
}

/// The least share a hold is priced at (ppm of a CPU): a sample of a stretch in which the fair
/// class took back what the vCPUs ran while held can be near 0, and a hold priced at 0 would
/// never end.
const MIN_SHARE_PPM: u64 = 20_000;

/// How many cycles at the normal level after a boost or a pay-back are sampled for the share
/// (each a sample of its own, closed by a deadline, not by the next event): enough to cover
/// the time between the boosts of a VM that is boosted often, without a deadline every cycle
/// for a VM that no longer is.
const SAMPLED_CYCLES: u32 = 10;

/// What closing a stretch at the normal level found: the ns the fair class gave the VM back
/// (> 0) or took back from it (< 0) in the cycle after a hold, against its measured share.
type Settled = i64;

/// Ends a stretch at the normal level (`idle_from` to `now`, the vCPUs at `cpu`). `go_on`: the
/// VM stays at its normal level and the next stretch starts here (a deadline closes a stretch
/// each cycle).
///
/// - The first cycle after a hold is settled, not sampled: the fair class keeps a thread's lag
///   across a change of weight, so in that cycle it gives the VM back part of what the hold
///   took from it, or takes back what the vCPUs ran while held. What the VM ran above or below
///   its measured share there goes into its balance. (Measured: sampling that cycle, with what
///   the vCPUs ran while held added, priced a VM whose share was 25% at about 39% of a CPU, and
///   it kept about a quarter of each boost.)
///   Until the VM has a share sample, that cycle is one (a VM evented every cycle has no
///   other stretch of a cycle).
/// - Any other stretch of a cycle or more is a share sample. A shorter one, ended by the next
///   boost, is not: a boost starts when a vCPU waits, so such a stretch ends before the vCPU's
///   next turn, and would price the share too low.
fn close_sample(s: &mut VmState, now: u64, cpu: u64, cycle_ns: u64, go_on: bool) -> Settled {
    let Some((t0, c0)) = s.idle_from.take() else { return 0 };
    let settle = std::mem::take(&mut s.settle);
    if go_on {
        s.idle_from = Some((now, cpu));
    }
    let (t, ran) = (now.saturating_sub(t0), cpu.saturating_sub(c0));
    if t < cycle_ns {
        return 0;
    }
    if let (true, Some(share)) = (settle, s.share_ppm) {
        let due = (t as u128 * share as u128 / 1_000_000) as i64;
        return (ran as i64 - due).clamp(-(cycle_ns as i64), cycle_ns as i64);
    }
    let sample = (ran as u128 * 1_000_000 / t as u128).min(1_000_000) as u64;
    s.share_ppm = Some(
        match s.share_ppm {
            None => sample,
            Some(old) => (old * 3 + sample) / 4,
        }
        .max(MIN_SHARE_PPM),
    );
    0
}

#[derive(Debug, Clone)]
struct VmState {
    cycle: u64,
    count: u32,
    /// An event is waiting for the next cycle (or for the debt to be paid).
    postponed: bool,
    phase: Phase,
    /// ns of CPU time owed (> 0) or paid in advance (< 0: a pay-back overshoots, as the fair
    /// class runs a thread a whole slice at a time; the next boost uses it up first).
    balance: i64,
    /// Since when (time, its vCPUs' run time) the VM has been at its normal level after a boost
    /// or a pay-back, to measure its share of the CPU.
    idle_from: Option<(u64, u64)>,
    /// Cycles still to sample at the normal level ([`SAMPLED_CYCLES`] after each return to it).
    samples_left: u32,
    /// The stretch at the normal level follows a hold: its first cycle is settled.
    settle: bool,
    /// The CPU share the VM's vCPUs get at their normal level, in parts per million (an
    /// average of samples a cycle long each): what holding them back costs them.
    share_ppm: Option<u64>,
    /// The last boost's start: (time, the vCPUs' time asleep then).
    last_start: Option<(u64, u64)>,
}

/// See the module documentation.
#[derive(Debug)]
pub struct EventPolicy {
    cfg: FeasConfig,
    vms: BTreeMap<VmId, VmState>,
    /// Whether the host was told to watch each VM ([`Action::WatchEvents`]).
    told: BTreeMap<VmId, bool>,
}

/// Why an event did not boost its VM at once.
pub type Outcome = EventOutcome;

impl EventPolicy {
    pub fn new(cfg: FeasConfig) -> EventPolicy {
        EventPolicy { cfg, vms: BTreeMap::new(), told: BTreeMap::new() }
    }

    pub fn config(&self) -> &FeasConfig {
        &self.cfg
    }

    /// Whether `vm` gets event boosting now: the mode, the operator's switches, and no agent
    /// CPU boost in force.
    pub fn eligible(&self, sh: &Shared, vm: VmId) -> bool {
        let Some(v) = sh.vm(vm) else { return false };
        let mode = match self.cfg.vms {
            EventVms::None => false,
            EventVms::All => true,
            EventVms::NoAgent => v.registered.is_none(),
        };
        mode && sh.on_for(v, Resource::Event) && !v.level(Resource::Cpu).is_changed()
    }

    fn state(&mut self, vm: VmId) -> &mut VmState {
        self.vms.entry(vm).or_insert(VmState {
            cycle: 0,
            count: 0,
            postponed: false,
            phase: Phase::Idle,
            balance: 0,
            idle_from: None,
            samples_left: 0,
            settle: false,
            share_ppm: None,
            last_start: None,
        })
    }

    /// Takes in what the coordinator did on its own (an operator switch, a budget, the VM
    /// gone): a VM it put back to normal is idle here too, and its debt forgiven.
    fn sync(&mut self, sh: &Shared, vm: VmId) {
        let level = sh.vm(vm).map_or(Level::Normal, |v| v.level(Resource::Event));
        let s = self.state(vm);
        if level == Level::Normal && s.phase != Phase::Idle {
            s.phase = Phase::Idle;
            s.balance = s.balance.min(0);
            s.idle_from = None;
        }
    }

    fn roll(&mut self, vm: VmId, now: u64) {
        let cycle = now / self.cfg.cycle_ns();
        let s = self.state(vm);
        if s.cycle != cycle {
            s.cycle = cycle;
            s.count = 0;
        }
    }

    /// Puts `vm`'s next deadline in the coordinator's set.
    fn reschedule(&mut self, sh: &mut Shared, vm: VmId) {
        let when = self.vms.get(&vm).and_then(|s| self.deadline(s));
        sh.schedule(Due::Policy(Resource::Event, Some(vm)), when);
    }

    /// An event for `vm` at `now`.
    fn event(&mut self, sh: &mut Shared, vm: VmId, now: u64, host: &mut dyn Sensors, out: &mut Vec<Action>) -> Outcome {
        sh.count(vm, Resource::Event, "events", 1);
        if !self.eligible(sh, vm) {
            sh.count(vm, Resource::Event, "ignored", 1);
            return Outcome::Off;
        }
        self.sync(sh, vm);
        self.roll(vm, now);
        let n_limit = self.cfg.n_limit;
        let s = self.state(vm);
        let (phase, count) = (s.phase, s.count);
        match phase {
            Phase::Boosted { .. } => Outcome::AlreadyBoosted,
            Phase::Repaying { .. } => self.postpone(sh, vm),
            Phase::Idle if count >= n_limit => self.postpone(sh, vm),
            Phase::Idle if !self.wants_boost(vm, host) => {
                sh.count(vm, Resource::Event, "not_waiting", 1);
                Outcome::NotWaiting
            }
            Phase::Idle => self.start(sh, vm, now, host, out),
        }
    }

    /// Whether a boost of `vm` would do anything: a vCPU waits for a CPU, or (with `run_us`) one
    /// runs, and the boost keeps it on its CPU until it has handled the event.
    fn wants_boost(&self, vm: VmId, host: &mut dyn Sensors) -> bool {
        host.vcpu_waiting(vm) || (self.cfg.boosts_running() && host.vcpu_running(vm))
    }

    fn postpone(&mut self, sh: &mut Shared, vm: VmId) -> Outcome {
        let s = self.state(vm);
        if !s.postponed {
            s.postponed = true;
            sh.count(vm, Resource::Event, "postponed", 1);
        }
        Outcome::Postponed
    }

    fn start(&mut self, sh: &mut Shared, vm: VmId, now: u64, host: &mut dyn Sensors, out: &mut Vec<Action>) -> Outcome {
        let (slice, cycle_ns) = (self.cfg.slice_ns(), self.cfg.cycle_ns());
        let cpu0 = host.vcpu_run_ns(vm);
        let asleep = host.vcpu_asleep_ns(vm);
        let s = self.state(vm);
        s.count += 1;
        s.postponed = false;
        let settled = close_sample(s, now, cpu0, cycle_ns, false);
        self.settle(sh, vm, settled);
        let s = self.state(vm);
        // CPU-bound since the last boost (asleep less than a tenth of the time): the boost takes
        // CPU from the others and is paid back. A VM that sleeps uses less than its share, and
        // holding it back would only make it late.
        let charged = s.last_start.is_some_and(|(t0, a0)| asleep.saturating_sub(a0) * 10 < now.saturating_sub(t0));
        s.last_start = Some((now, asleep));
        let until = now + slice;
        let check = if self.cfg.run_us > 0 { now + self.cfg.run_ns() } else { until };
        match sh.request(self, vm, 1, now, None, out) {
            Ok(_) => {
                self.state(vm).phase = Phase::Boosted { until, check, cpu0, charged };
                Outcome::Boosted
            }
            Err(reason) => Outcome::Refused(reason),
        }
    }

    /// A boosted vCPU of `vm` blocked: the boost ends, unless it has not yet run `run_us` (it
    /// waits for a lock of its VM's while it handles the event, and is woken soon).
    fn blocked(&mut self, sh: &mut Shared, vm: VmId, now: u64, host: &mut dyn Sensors, out: &mut Vec<Action>) {
        self.sync(sh, vm);
        if let Phase::Boosted { cpu0, .. } = self.state(vm).phase {
            if self.cfg.run_us > 0 && host.vcpu_run_ns(vm).saturating_sub(cpu0) < self.cfg.run_ns() {
                sh.count(vm, Resource::Event, "blocked_early", 1);
                return;
            }
            sh.count(vm, Resource::Event, "blocked", 1);
            self.end_boost(sh, vm, now, host, out);
        }
    }

    /// When a VM owing `balance` ns, with a share `share_ppm` at its normal level, has paid at
    /// its repay level (at least 0.5 ms from now, at most a cycle).
    fn repay_wait(&self, balance: i64, share_ppm: Option<u64>) -> u64 {
        let share = share_ppm.unwrap_or(1_000_000).max(1) as u128;
        let t = (balance.max(0) as u128 * 1_000_000 / share) as u64;
        t.clamp(NS_PER_MS / 2, self.cfg.cycle_ns())
    }

    /// Ends a boost: the CPU time it gave becomes a debt, paid back at `Guarded`.
    fn end_boost(&mut self, sh: &mut Shared, vm: VmId, now: u64, host: &mut dyn Sensors, out: &mut Vec<Action>) {
        let Phase::Boosted { cpu0, charged, .. } = self.state(vm).phase else { return };
        let cpu = host.vcpu_run_ns(vm);
        let ran = cpu.saturating_sub(cpu0);
        sh.count(vm, Resource::Event, "boosted_cpu_ns", ran);
        let charge = self.cfg.charge && charged;
        if self.cfg.charge && !charged {
            sh.count(vm, Resource::Event, "uncharged", 1);
        }
        let s = self.state(vm);
        if charge {
            s.balance += ran as i64;
        }
        let (balance, share) = (s.balance, s.share_ppm);
        let next = now + self.repay_wait(balance, share);
        let s = self.state(vm);
        if s.balance > 0 {
            s.phase = Phase::Repaying { cpu, at: now, next };
            sh.host_level(self, vm, Level::Guarded, out);
        } else {
            self.back_to_normal(sh, vm, now, Some(cpu), false, out);
        }
    }

    /// Puts `vm` back at its normal level. `sample_from`: its vCPUs' run time now, to measure
    /// its share of the CPU from here (with `charge`: nothing else needs it); `after_hold`: it
    /// paid a boost back until now.
    fn back_to_normal(
        &mut self,
        sh: &mut Shared,
        vm: VmId,
        now: u64,
        sample_from: Option<u64>,
        after_hold: bool,
        out: &mut Vec<Action>,
    ) {
        let charge = self.cfg.charge;
        let s = self.state(vm);
        s.phase = Phase::Idle;
        if let Some(cpu) = sample_from.filter(|_| charge) {
            s.idle_from = Some((now, cpu));
            s.samples_left = SAMPLED_CYCLES;
            s.settle = after_hold;
        }
        let _ = sh.request(self, vm, 0, now, None, out);
    }

    /// Takes into `vm`'s balance what the fair class gave it back (> 0: owed again, paid by the
    /// hold after its next boost) or took back from it (< 0: paid in advance) in the cycle after
    /// a hold.
    fn settle(&mut self, sh: &mut Shared, vm: VmId, settled: Settled) {
        if settled == 0 {
            return;
        }
        let max_credit = (MAX_CREDIT_CYCLES * self.cfg.cycle_ns()) as i64;
        let s = self.state(vm);
        s.balance = (s.balance + settled).max(-max_credit);
        let name = if settled > 0 { "given_back_ns" } else { "taken_back_ns" };
        sh.count(vm, Resource::Event, name, settled.unsigned_abs());
    }

    /// Ends `vm`'s slice, takes in its paid-back debt, and boosts it if it was postponed and its
    /// time has come.
    fn tick_vm(&mut self, sh: &mut Shared, vm: VmId, now: u64, host: &mut dyn Sensors, out: &mut Vec<Action>) {
        if sh.vm(vm).is_none() {
            self.vms.remove(&vm);
            return;
        }
        self.sync(sh, vm);
        match self.state(vm).phase {
            Phase::Boosted { until, .. } if until <= now => {
                sh.count(vm, Resource::Event, "slices", 1);
                self.end_boost(sh, vm, now, host, out);
            }
            Phase::Boosted { until, check, cpu0, charged } if check <= now => {
                let ran = host.vcpu_run_ns(vm).saturating_sub(cpu0);
                if ran >= self.cfg.run_ns() {
                    sh.count(vm, Resource::Event, "ran", 1);
                    self.end_boost(sh, vm, now, host, out);
                } else {
                    let check = (now + self.cfg.run_ns() - ran).min(until);
                    self.state(vm).phase = Phase::Boosted { until, check, cpu0, charged };
                }
            }
            Phase::Repaying { cpu, at, next } if next <= now => self.repay(sh, vm, now, (at, cpu), host, out),
            _ => {}
        }
        self.roll(vm, now);
        let cycle_ns = self.cfg.cycle_ns();
        let s = self.state(vm);
        if let (Phase::Idle, Some((t0, _))) = (s.phase, s.idle_from) {
            if now >= t0 + cycle_ns {
                s.samples_left = s.samples_left.saturating_sub(1);
                let go_on = s.samples_left > 0;
                let cpu = host.vcpu_run_ns(vm);
                let settled = close_sample(self.state(vm), now, cpu, cycle_ns, go_on);
                self.settle(sh, vm, settled);
            }
        }
        let n_limit = self.cfg.n_limit;
        let s = self.state(vm);
        if s.phase == Phase::Idle && s.postponed && s.count < n_limit {
            s.postponed = false;
            if self.eligible(sh, vm) && self.wants_boost(vm, host) {
                sh.count(vm, Resource::Event, "postponed_boosts", 1);
                self.start(sh, vm, now, host, out);
            }
        }
    }

    /// A check while paying back: held at `repay_nice` since `last` (time, run time), the VM
    /// paid what it would have run at its normal share. What it ran while held the fair class
    /// takes back, or not, in the cycle after the hold, which is settled (see `close_sample()`).
    fn repay(
        &mut self,
        sh: &mut Shared,
        vm: VmId,
        now: u64,
        last: (u64, u64),
        host: &mut dyn Sensors,
        out: &mut Vec<Action>,
    ) {
        let cpu = host.vcpu_run_ns(vm);
        let max_credit = (MAX_CREDIT_CYCLES * self.cfg.cycle_ns()) as i64;
        let s = self.state(vm);
        // Without a measured share yet (the first boost), the whole time held counts.
        let share = s.share_ppm.unwrap_or(1_000_000) as u128;
        let paid = (now.saturating_sub(last.0) as u128 * share / 1_000_000) as u64;
        s.balance = (s.balance - paid as i64).max(-max_credit);
        let (balance, share) = (s.balance, s.share_ppm);
        let next = now + self.repay_wait(balance, share);
        let s = self.state(vm);
        sh.count(vm, Resource::Event, "repaid_ns", paid);
        if s.balance <= 0 {
            // The next stretch's first cycle is settled, the rest samples the share.
            self.back_to_normal(sh, vm, now, Some(cpu), true, out);
        } else {
            s.phase = Phase::Repaying { cpu, at: now, next };
        }
    }

    fn deadline(&self, s: &VmState) -> Option<u64> {
        match s.phase {
            Phase::Boosted { until, check, .. } => Some(until.min(check)),
            Phase::Repaying { next, .. } => Some(next),
            Phase::Idle if s.postponed => Some((s.cycle + 1) * self.cfg.cycle_ns()),
            Phase::Idle => s.idle_from.map(|(t0, _)| t0 + self.cfg.cycle_ns()),
        }
    }

    /// The VM's CPU share at its normal level as measured, in parts per million.
    pub fn share_ppm(&self, vm: VmId) -> Option<u64> {
        self.vms.get(&vm).and_then(|s| s.share_ppm)
    }

    /// The VM's balance: ns of CPU time still to pay back (> 0) or paid in advance (< 0), for
    /// `cosched status`.
    pub fn balance_ns(&self, vm: VmId) -> i64 {
        self.vms.get(&vm).map_or(0, |s| s.balance)
    }

    /// Whether the host was last told to watch `vm` for events.
    pub fn watching(&self, vm: VmId) -> bool {
        self.told.get(&vm).copied().unwrap_or(false)
    }

    /// Event boosting no longer applies to `vm` (its agent registered, the operator turned it
    /// off): whatever it holds is put back and its debt forgiven.
    fn off(&mut self, sh: &mut Shared, vm: VmId, now: u64, out: &mut Vec<Action>) {
        let Some(s) = self.vms.get_mut(&vm) else { return };
        s.postponed = false;
        s.balance = s.balance.min(0);
        if s.phase != Phase::Idle {
            self.back_to_normal(sh, vm, now, None, false, out);
        }
    }
}

impl ResourcePolicy for EventPolicy {
    fn resource(&self) -> Resource {
        Resource::Event
    }

    fn host_event(
        &mut self,
        sh: &mut Shared,
        vm: VmId,
        ev: HostEvent,
        now: u64,
        sensors: &mut dyn Sensors,
        out: &mut Vec<Action>,
    ) -> EventOutcome {
        let outcome = match ev {
            HostEvent::Device => self.event(sh, vm, now, sensors, out),
            HostEvent::VcpuBlocked => {
                self.blocked(sh, vm, now, sensors, out);
                EventOutcome::Noted
            }
            HostEvent::Applied => EventOutcome::Noted,
        };
        self.reschedule(sh, vm);
        outcome
    }

    fn due(&mut self, sh: &mut Shared, vm: Option<VmId>, now: u64, sensors: &mut dyn Sensors, out: &mut Vec<Action>) {
        let Some(vm) = vm else { return };
        self.tick_vm(sh, vm, now, sensors, out);
        self.reschedule(sh, vm);
    }

    /// Tells the host whether to watch `vm` when that changes, and lets go of it if not.
    fn follow(&mut self, sh: &mut Shared, vm: VmId, now: u64, out: &mut Vec<Action>) {
        if sh.vm(vm).is_none() {
            return;
        }
        let on = self.eligible(sh, vm);
        if self.told.get(&vm) != Some(&on) {
            self.told.insert(vm, on);
            out.push(Action::WatchEvents { vm, on });
        }
        if !on && (sh.boosted(vm, Resource::Event) || self.vms.get(&vm).is_some_and(|s| s.postponed)) {
            self.off(sh, vm, now, out);
            self.reschedule(sh, vm);
        }
    }

    /// A boost ended by the coordinator on its own (a CPU boost took over, a budget, a switch):
    /// idle here too, nothing postponed, its debt forgiven.
    fn stopped(&mut self, vm: VmId, _now: u64) {
        if let Some(s) = self.vms.get_mut(&vm) {
            if s.phase != Phase::Idle {
                s.phase = Phase::Idle;
                s.balance = s.balance.min(0);
                s.idle_from = None;
            }
        }
    }

    fn vm_gone(&mut self, _sh: &mut Shared, vm: VmId) {
        self.vms.remove(&vm);
        self.told.remove(&vm);
    }
}

#[cfg(test)]
mod tests;
