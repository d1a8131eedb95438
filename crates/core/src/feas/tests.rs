//! FEAS with a fake clock: the per-cycle limit, postponement, slices, the pay-back, the
//! switches, and fairness over a long random run on a simulated CPU.

use std::collections::BTreeMap;

use super::*;
use crate::{Coordinator, CpuPolicy, Policy};
use cosched_proto::{caps, Frame};

const MS: u64 = NS_PER_MS;
const US: u64 = 1_000;
const VM: VmId = VmId(1);
const EVENT: Resource = Resource::Event;

#[derive(Default)]
struct FakeHost {
    cpu: BTreeMap<VmId, u64>,
    asleep: BTreeMap<VmId, u64>,
    not_waiting: bool,
    running: bool,
}

impl Sensors for FakeHost {
    fn vcpu_run_ns(&mut self, vm: VmId) -> u64 {
        self.cpu.get(&vm).copied().unwrap_or(0)
    }
    fn vcpu_asleep_ns(&mut self, vm: VmId) -> u64 {
        self.asleep.get(&vm).copied().unwrap_or(0)
    }
    fn vcpu_waiting(&mut self, _vm: VmId) -> bool {
        !self.not_waiting
    }
    fn vcpu_running(&mut self, _vm: VmId) -> bool {
        self.running
    }
}

fn coordinator(vms: &[VmId], cfg: FeasConfig) -> Coordinator {
    let policy = Policy { rt_guard_max_share_permille: 0, ..Policy::default() };
    let cpu = CpuPolicy::new(&policy, 8);
    let mut c = Coordinator::new(policy, vec![Box::new(cpu), Box::new(EventPolicy::new(cfg))]);
    for &vm in vms {
        let s = c.default_settings();
        c.vm_found(vm, &format!("vm{}", vm.0), s, 0);
    }
    c
}

fn levels(out: &[Action]) -> Vec<Level> {
    out.iter()
        .filter_map(|a| match a {
            Action::Apply { resource: EVENT, level, .. } => Some(*level),
            _ => None,
        })
        .collect()
}

fn counter(c: &Coordinator, vm: VmId, name: &str) -> u64 {
    c.vm(vm).unwrap().slot(EVENT).unwrap().counters.events.get(name).copied().unwrap_or(0)
}

struct Rig {
    coord: Coordinator,
    host: FakeHost,
    out: Vec<Action>,
}

impl Rig {
    fn new(cfg: FeasConfig) -> Rig {
        Rig { coord: coordinator(&[VM], cfg), host: FakeHost::default(), out: Vec::new() }
    }
    fn event(&mut self, now: u64) -> Outcome {
        self.coord.host_event(EVENT, VM, HostEvent::Device, now, &mut self.host, &mut self.out)
    }
    fn blocked(&mut self, now: u64) {
        self.coord.host_event(EVENT, VM, HostEvent::VcpuBlocked, now, &mut self.host, &mut self.out);
    }
    fn tick(&mut self, now: u64) {
        self.coord.tick_sensed(now, &mut self.host, &mut self.out);
    }
    fn feas(&self) -> &EventPolicy {
        self.coord.policy_of::<EventPolicy>().expect("the event policy")
    }
    fn run(&mut self, ns: u64) {
        *self.host.cpu.entry(VM).or_default() += ns;
    }
    fn take(&mut self) -> Vec<Level> {
        levels(&std::mem::take(&mut self.out))
    }
}

/// The FEAS paper's rules: a boost ends when a vCPU blocks or its slice ends.
fn seed() -> FeasConfig {
    FeasConfig { run_us: 0, ..FeasConfig::default() }
}

fn no_charge() -> FeasConfig {
    FeasConfig { charge: false, ..seed() }
}

#[test]
fn defaults_are_the_seeds() {
    let c = FeasConfig::default();
    assert_eq!((c.n_limit, c.cycle_ms, c.slice_us, c.vms), (1, 10, 1000, EventVms::NoAgent));
    assert_eq!((c.run_us, c.boost_running, c.repay_nice), (1000, false, 10), "ours: a boost ends once it ran 1 ms");
    c.validate().unwrap();
    let bad = FeasConfig { slice_us: 20_000, ..FeasConfig::default() };
    assert!(bad.validate().unwrap_err().to_string().contains("at most one cycle"));
    assert!(FeasConfig { n_limit: 0, ..FeasConfig::default() }.validate().is_err());
}

#[test]
fn at_most_n_limit_boosts_per_cycle_and_the_rest_postponed_to_the_next() {
    let mut r = Rig::new(no_charge());
    assert_eq!(r.event(MS), Outcome::Boosted);
    assert_eq!(r.take(), vec![Level::Boosted]);
    assert_eq!(r.event(MS + 100 * US), Outcome::AlreadyBoosted, "an event during a boost rides on it");
    r.blocked(MS + 200 * US);
    assert_eq!(r.take(), vec![Level::Normal]);
    // The same cycle: over the limit of 1; three events make one postponed boost.
    for t in [2, 3, 9] {
        assert_eq!(r.event(t * MS), Outcome::Postponed);
    }
    assert!(r.take().is_empty());
    assert_eq!(counter(&r.coord, VM, "postponed"), 1);
    assert_eq!(r.coord.next_deadline(), Some(10 * MS), "the next cycle starts at 10 ms");
    r.tick(10 * MS - 1);
    assert!(r.take().is_empty());
    r.tick(10 * MS);
    assert_eq!(r.take(), vec![Level::Boosted], "postponed, not dropped");
    assert_eq!(counter(&r.coord, VM, "postponed_boosts"), 1);
    // That boost used the new cycle's one.
    r.blocked(10 * MS + 500 * US);
    r.take();
    assert_eq!(r.event(11 * MS), Outcome::Postponed);
    r.tick(20 * MS);
    assert_eq!(r.take(), vec![Level::Boosted]);
    assert_eq!(r.coord.vm(VM).unwrap().slot(EVENT).unwrap().counters.boosts, 3);
}

#[test]
fn n_limit_two_allows_two_per_cycle() {
    let mut r = Rig::new(FeasConfig { n_limit: 2, ..no_charge() });
    for t in [0, 2] {
        assert_eq!(r.event(t * MS), Outcome::Boosted);
        r.blocked(t * MS + 100 * US);
    }
    assert_eq!(r.event(4 * MS), Outcome::Postponed);
}

#[test]
fn a_boost_ends_with_its_slice() {
    let mut r = Rig::new(no_charge());
    r.event(0);
    r.take();
    assert_eq!(r.coord.next_deadline(), Some(MS), "slice_us = 1000");
    r.tick(MS - 1);
    assert!(r.take().is_empty());
    r.tick(MS);
    assert_eq!(r.take(), vec![Level::Normal]);
    assert_eq!(counter(&r.coord, VM, "slices"), 1);
    assert_eq!(r.coord.next_deadline(), None);
}

#[test]
fn with_run_us_a_boost_ends_once_the_vcpu_has_run_that_long() {
    let mut r = Rig::new(FeasConfig { run_us: 300, ..no_charge() });
    r.event(0);
    assert_eq!(r.take(), vec![Level::Boosted]);
    assert_eq!(r.coord.next_deadline(), Some(300 * US), "the earliest it can have run 300 µs");
    // It waited 200 µs for a lock of its VM's, then ran 100 µs: not yet.
    r.run(100 * US);
    r.tick(300 * US);
    assert!(r.take().is_empty());
    assert_eq!(r.coord.next_deadline(), Some(500 * US), "200 µs of run to go");
    // A block before it has run 300 µs does not end it: it is in the middle of the event.
    r.blocked(400 * US);
    assert!(r.take().is_empty());
    assert_eq!(counter(&r.coord, VM, "blocked_early"), 1);
    r.run(200 * US);
    r.tick(500 * US);
    assert_eq!(r.take(), vec![Level::Normal], "it had its turn");
    assert_eq!(counter(&r.coord, VM, "ran"), 1);
    assert_eq!(counter(&r.coord, VM, "boosted_cpu_ns"), 300_000, "the boost cost what it used");
    // A vCPU that never runs enough (asleep in the guest) is ended by the slice.
    r.event(10 * MS);
    r.run(50 * US);
    r.tick(10 * MS + 300 * US);
    r.tick(11 * MS);
    assert_eq!(r.take(), vec![Level::Boosted, Level::Normal]);
    assert_eq!(counter(&r.coord, VM, "slices"), 1);
    // And a block once it has run enough ends it at once.
    r.event(20 * MS);
    r.run(400 * US);
    r.blocked(20 * MS + 200 * US);
    assert_eq!(r.take(), vec![Level::Boosted, Level::Normal]);
    assert_eq!(counter(&r.coord, VM, "blocked"), 1);
}

#[test]
fn with_run_us_an_event_while_the_vcpu_runs_keeps_it_on_its_cpu() {
    let mut r = Rig::new(FeasConfig { run_us: 300, boost_running: true, ..no_charge() });
    r.host.not_waiting = true;
    r.host.running = true;
    assert_eq!(r.event(0), Outcome::Boosted, "it runs: the boost keeps it from being preempted");
    r.run(300 * US);
    r.tick(300 * US);
    assert_eq!(r.take(), vec![Level::Boosted, Level::Normal]);
    // Without run_us, FEAS's rule: only a waiting vCPU is boosted; and so with boost_running off.
    for cfg in [no_charge(), FeasConfig { run_us: 300, boost_running: false, ..no_charge() }] {
        let mut r = Rig::new(cfg);
        r.host.not_waiting = true;
        r.host.running = true;
        assert_eq!(r.event(0), Outcome::NotWaiting);
    }
}

#[test]
fn run_us_and_repay_nice_are_checked() {
    let ok = |c: FeasConfig| c.validate().is_ok();
    assert!(ok(FeasConfig { run_us: 0, ..FeasConfig::default() }));
    assert!(ok(FeasConfig { run_us: 50, ..FeasConfig::default() }));
    assert!(ok(FeasConfig { run_us: 5000, ..FeasConfig::default() }), "above the slice: the slice ends it");
    let e = FeasConfig { run_us: 49, ..FeasConfig::default() }.validate().unwrap_err().to_string();
    assert!(e.contains("[event] run_us = 49") && e.contains("at least 50"), "{e}");
    assert!(ok(FeasConfig { repay_nice: 1, ..FeasConfig::default() }));
    assert!(!ok(FeasConfig { repay_nice: 0, ..FeasConfig::default() }));
    assert!(!ok(FeasConfig { repay_nice: 20, ..FeasConfig::default() }));
}

#[test]
fn a_pay_back_is_checked_when_it_should_be_paid_not_a_cycle_later() {
    let mut r = Rig::new(seed());
    r.event(0); // the first boost, not charged
    r.run(500 * US);
    r.tick(MS);
    r.event(10 * MS);
    r.run(500 * US);
    r.tick(11 * MS);
    assert_eq!(r.take(), vec![Level::Boosted, Level::Normal, Level::Boosted, Level::Guarded]);
    // No share measured yet: the time held counts whole, so 500 µs owed are paid in 500 µs.
    assert_eq!(r.coord.next_deadline(), Some(11 * MS + 500 * US));
    r.tick(11 * MS + 500 * US);
    assert_eq!(r.take(), vec![Level::Normal]);
    // A cycle at the normal level: a share of 25%.
    r.run(2_500 * US);
    r.tick(21 * MS + 500 * US);
    assert_eq!(r.feas().share_ppm(VM), Some(250_000));
    assert_eq!(r.event(30 * MS), Outcome::Boosted);
    r.run(500 * US);
    r.tick(31 * MS);
    assert_eq!(r.take(), vec![Level::Boosted, Level::Guarded]);
    assert_eq!(r.feas().balance_ns(VM), 500_000);
    // 500 µs owed at a 25% share: paid after 2 ms held, not at the next cycle's check.
    assert_eq!(r.coord.next_deadline(), Some(33 * MS));
    r.tick(33 * MS);
    assert_eq!(r.take(), vec![Level::Normal]);
    assert_eq!(r.feas().balance_ns(VM), 0);
}

#[test]
fn a_postponed_boost_waits_for_a_waiting_vcpu() {
    let mut r = Rig::new(no_charge());
    r.event(0);
    r.blocked(100 * US);
    r.event(200 * US);
    r.take();
    r.host.not_waiting = true;
    r.tick(10 * MS);
    assert!(r.take().is_empty(), "no vCPU waits at the cycle's start: nothing to boost");
    assert_eq!(r.coord.next_deadline(), None);
    assert_eq!(r.event(11 * MS), Outcome::NotWaiting);
}

#[test]
fn boosted_cpu_time_is_paid_back_at_guarded_at_the_vms_measured_share() {
    let mut r = Rig::new(seed());
    // A first boost is never charged: nothing says yet whether the VM is CPU-bound.
    assert_eq!(r.event(0), Outcome::Boosted);
    r.run(500 * US);
    r.tick(MS);
    assert_eq!(r.take(), vec![Level::Boosted, Level::Normal]);
    assert_eq!(counter(&r.coord, VM, "uncharged"), 1);
    // Its first cycle at the normal level is a share sample: 2.5 ms in 10 ms.
    assert_eq!(r.feas().share_ppm(VM), None);
    assert_eq!(r.coord.next_deadline(), Some(11 * MS));
    r.run(2_500 * US);
    r.tick(11 * MS);
    assert_eq!(r.feas().share_ppm(VM), Some(250_000));
    // From here on, the VM does not sleep: it pays. A stretch shorter than a cycle, ended by
    // the boost, is no sample.
    r.run(1_000 * US);
    let o = 15 * MS;
    assert_eq!(r.event(o), Outcome::Boosted);
    assert_eq!(r.take(), vec![Level::Boosted]);
    assert_eq!(r.feas().share_ppm(VM), Some(250_000));
    r.run(900 * US);
    r.tick(o + MS);
    assert_eq!(r.take(), vec![Level::Guarded], "the boost's CPU time is owed");
    assert_eq!(r.feas().balance_ns(VM), 900_000);
    assert_eq!(counter(&r.coord, VM, "boosted_cpu_ns"), 1_400_000, "with the first boost's");
    // In debt: events wait. 900 µs owed at a 25% share: paid after 3.6 ms held. What the
    // vCPUs ran while held (100 µs) neither pays nor counts in a sample.
    assert_eq!(r.event(o + 2 * MS), Outcome::Postponed);
    assert_eq!(r.coord.next_deadline(), Some(o + 4_600 * US));
    r.run(100 * US);
    r.tick(o + 4_600 * US);
    assert_eq!(r.take(), vec![Level::Normal]);
    assert_eq!(r.feas().balance_ns(VM), 0);
    // The postponed event boosts at the next cycle; that stretch (5.4 ms) is not settled.
    let p = 20 * MS;
    assert_eq!(r.coord.next_deadline(), Some(p));
    r.tick(p);
    assert_eq!(r.take(), vec![Level::Boosted], "the postponed event boosts");
    r.run(1_000 * US);
    r.tick(p + MS);
    assert_eq!(r.take(), vec![Level::Guarded]);
    assert_eq!(r.feas().balance_ns(VM), 1_000_000);
    r.tick(p + 5 * MS);
    assert_eq!(r.take(), vec![Level::Normal]);
    assert_eq!(r.feas().balance_ns(VM), 0);
    // The cycle after a hold is settled: the fair class gave the VM back 3.5 ms where its
    // share was 2.5 ms, so 1 ms is owed again (and no sample is taken).
    r.run(3_500 * US);
    r.tick(p + 15 * MS);
    assert_eq!(r.feas().balance_ns(VM), 1_000_000);
    assert_eq!(counter(&r.coord, VM, "given_back_ns"), 1_000_000);
    assert_eq!(r.feas().share_ppm(VM), Some(250_000));
    // The next cycle is a sample again: 2.1 ms, averaged in.
    r.run(2_100 * US);
    r.tick(p + 25 * MS);
    assert_eq!(r.feas().share_ppm(VM), Some(240_000));
    // The next boost adds to what is owed; paid at the new share.
    let q = 50 * MS;
    assert_eq!(r.event(q), Outcome::Boosted);
    r.run(1_400 * US);
    r.tick(q + MS);
    assert_eq!(r.take(), vec![Level::Boosted, Level::Guarded]);
    assert_eq!(r.feas().balance_ns(VM), 2_400_000);
    assert_eq!(r.coord.next_deadline(), Some(q + 11 * MS), "2.4 ms at 24%: 10 ms");
    r.tick(q + 11 * MS);
    assert_eq!(r.take(), vec![Level::Normal]);
    assert_eq!(r.feas().balance_ns(VM), 0);
    // A cycle after a hold in which the fair class took back what the vCPUs ran while held:
    // 0.4 ms where 2.4 ms was due is paid, a credit for the next boost.
    r.run(400 * US);
    r.tick(q + 21 * MS);
    assert_eq!(r.feas().balance_ns(VM), -2_000_000);
    assert_eq!(counter(&r.coord, VM, "taken_back_ns"), 2_000_000);
}

#[test]
fn a_share_priced_at_nothing_cannot_hold_a_vm_for_ever() {
    let mut r = Rig::new(seed());
    r.event(0);
    r.run(500 * US);
    r.tick(MS);
    // A cycle in which the vCPUs did not run at all (say the host stopped them).
    r.tick(11 * MS);
    assert_eq!(r.feas().share_ppm(VM), Some(20_000), "the least share a hold is priced at");
    let o = 100 * MS;
    r.event(o);
    r.run(1_000 * US);
    r.tick(o + MS);
    assert_eq!(r.take(), vec![Level::Boosted, Level::Normal, Level::Boosted, Level::Guarded]);
    // 1 ms owed at 2%: 50 ms held at most, in checks a cycle apart.
    let mut t = o + MS;
    while r.take().is_empty() {
        t = r.coord.next_deadline().expect("a check while held");
        r.tick(t);
    }
    assert_eq!(t, o + 51 * MS);
}

#[test]
fn a_vm_that_sleeps_is_not_charged() {
    let mut r = Rig::new(seed());
    for (i, t) in [0u64, 100, 200].into_iter().enumerate() {
        assert_eq!(r.event(t * MS), Outcome::Boosted);
        r.run(MS);
        r.tick(t * MS + MS);
        assert_eq!(r.take(), vec![Level::Boosted, Level::Normal], "boost {i}");
        // Asleep 20 ms of the next 100: more than a tenth.
        *r.host.asleep.entry(VM).or_default() += 20 * MS;
    }
    assert_eq!(counter(&r.coord, VM, "uncharged"), 3);
    assert_eq!(r.feas().balance_ns(VM), 0);
}

#[test]
fn a_boost_the_vcpu_did_not_use_costs_nothing() {
    let mut r = Rig::new(seed());
    r.event(0);
    r.blocked(50 * US); // blocked before it ran (cpu unchanged)
    assert_eq!(r.take(), vec![Level::Boosted, Level::Normal]);
    assert_eq!(counter(&r.coord, VM, "blocked"), 1);
}

#[test]
fn an_agents_vm_keeps_its_own_coordination_unless_all_vms_are_chosen() {
    for (mode, boosts) in [(EventVms::NoAgent, false), (EventVms::All, true), (EventVms::None, false)] {
        let mut r = Rig::new(FeasConfig { vms: mode, ..no_charge() });
        assert_eq!(r.event(0) == Outcome::Boosted, mode != EventVms::None, "{mode:?} without an agent");
        r.blocked(10);
        let mut out = Vec::new();
        r.coord.frame(VM, Frame::register(1, caps::CPU), 20 * MS, &mut out);
        assert_eq!(r.event(20 * MS) == Outcome::Boosted, boosts, "{mode:?} with an agent");
        if boosts {
            r.blocked(20 * MS + 10);
            // Not while the agent's CPU boost holds the VM.
            r.coord.frame(VM, Frame::cpu(2, true), 30 * MS, &mut out);
            assert_eq!(r.event(30 * MS), Outcome::Off);
        }
    }
}

#[test]
fn the_operator_turning_events_off_puts_the_vm_back_and_forgives_its_debt() {
    let mut r = Rig::new(seed());
    r.event(0); // the first boost, not charged
    r.blocked(10);
    r.event(10 * MS);
    r.run(500 * US);
    r.tick(11 * MS);
    assert_eq!(r.take(), vec![Level::Boosted, Level::Normal, Level::Boosted, Level::Guarded]);
    r.coord.set_vm_enabled(VM, Some(EVENT), false, 12 * MS, &mut r.out);
    assert_eq!(r.take(), vec![Level::Normal]);
    assert_eq!(r.event(20 * MS), Outcome::Off);
    r.coord.set_vm_enabled(VM, Some(EVENT), true, 21 * MS, &mut r.out);
    assert_eq!(r.event(30 * MS), Outcome::Boosted, "no debt left from before");
    // And an agent that registers (event boosting no longer applies) ends a boost in force.
    r.take();
    r.coord.frame(VM, Frame::register(9, caps::CPU), 30 * MS + 1, &mut r.out);
    assert_eq!(r.take(), vec![Level::Normal]);
    assert!(r.out.is_empty() || !r.feas().watching(VM));
}

const NICE_0: u64 = 1024;

/// The fair class's weight of a VM's vCPUs at `level` (nice 0; `repay_nice` while paying back,
/// from the kernel's `sched_prio_to_weight`; at `SCHED_RR` they are not in the fair class, and keep
/// their weight).
fn weight_of(level: Level, repay_nice: i32) -> u64 {
    const NICE_1_TO_19: [u64; 19] =
        [820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87, 70, 56, 45, 36, 29, 23, 18, 15];
    if level == Level::Guarded {
        NICE_1_TO_19[(repay_nice - 1) as usize]
    } else {
        NICE_0
    }
}

/// One CPU shared by four VMs whose vCPUs never block, as EEVDF shares it (kernel/sched/fair.c,
/// simplified): among the threads whose virtual runtime is not past the weighted average `V`
/// (eligible), the one with the earliest virtual deadline runs until it has used its slice
/// (0.75 ms, `base_slice`, from a new deadline of `vruntime + slice x 1024 / weight`); running
/// advances the virtual runtime by time x 1024 / weight. A thread at `SCHED_RR` leaves the fair
/// class, pre-empts it and runs first; its lag (`V - vruntime`, within two slices) is kept in
/// virtual time and it comes back at that lag, at whatever weight it comes back with (the
/// kernel sets the weight of a thread outside the fair class without rescaling its lag). A
/// fair thread whose weight changes keeps its lag times its weight (`reweight_entity()`).
/// VM 0 receives events at random (about `rate` per second). Returns each VM's share of the
/// CPU and VM 0's boosts.
fn simulate(cfg: FeasConfig, rate: u64, seconds: u64) -> (Vec<f64>, u64) {
    const STEP: u64 = 50 * US;
    const SLICE: i128 = 750 * US as i128;
    let ids: Vec<VmId> = (0..4).map(VmId).collect();
    let repay_nice = cfg.repay_nice;
    let mut coord = coordinator(&ids, cfg);
    let mut host = FakeHost::default();
    let mut vruntime = [0i128; 4];
    let mut deadline = [0i128; 4];
    let mut weight = [NICE_0 as i128; 4];
    // The virtual lag a thread took out of the fair class with it (while at SCHED_RR).
    let mut saved_lag: [Option<i128>; 4] = [None; 4];
    let mut out = Vec::new();
    let mut running: Option<usize> = None;
    let mut current: Option<usize> = None;
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next_event = 0;
    let avg = |vr: &[i128; 4], w: &[i128; 4], fair: &[bool; 4]| -> i128 {
        let (sum, tw) = (0..4).filter(|&j| fair[j]).fold((0, 0), |(s, t), j| (s + vr[j] * w[j], t + w[j]));
        if tw == 0 {
            0
        } else {
            sum / tw
        }
    };
    let vslice = |w: i128| SLICE * NICE_0 as i128 / w;
    for step in 0..seconds * 1_000_000_000 / STEP {
        let now = step * STEP;
        // Events for VM 0 at exponential-ish random gaps (mean 1 / rate).
        while next_event <= now {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = ((seed >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
            next_event += (-u.ln() * 1e9 / rate as f64) as u64;
            host.not_waiting = running == Some(0);
            coord.host_event(EVENT, ids[0], HostEvent::Device, now, &mut host, &mut out);
        }
        if coord.next_deadline().is_some_and(|d| d <= now) {
            coord.tick_sensed(now, &mut host, &mut out);
        }
        out.clear();
        let level = |i: usize| coord.vm(ids[i]).unwrap().level(EVENT);
        let fair: [bool; 4] = std::array::from_fn(|i| level(i) != Level::Boosted);
        // Class and weight changes.
        for i in 0..4 {
            let w_new = weight_of(level(i), repay_nice) as i128;
            let mut fair_old = fair;
            fair_old[i] = saved_lag[i].is_none();
            if !fair[i] && saved_lag[i].is_none() {
                // To SCHED_RR: out of the fair class with its lag.
                let v = avg(&vruntime, &weight, &fair_old);
                let lim = 2 * vslice(weight[i]);
                saved_lag[i] = Some((v - vruntime[i]).clamp(-lim, lim));
                if current == Some(i) {
                    current = None;
                }
            } else if fair[i] && saved_lag[i].is_some() {
                // Back: at its saved virtual lag, at its new weight.
                let mut others = fair;
                others[i] = false;
                let v = avg(&vruntime, &weight, &others);
                vruntime[i] = v - saved_lag[i].take().unwrap();
                weight[i] = w_new;
                deadline[i] = vruntime[i] + vslice(w_new);
            } else if fair[i] && w_new != weight[i] {
                let v = avg(&vruntime, &weight, &fair);
                let lag = v - vruntime[i];
                let rel = deadline[i] - vruntime[i];
                vruntime[i] = v - lag * weight[i] / w_new;
                deadline[i] = vruntime[i] + rel * weight[i] / w_new;
                weight[i] = w_new;
            }
        }
        let pick = match (0..4).find(|&i| !fair[i]) {
            Some(rr) => rr,
            None => {
                if current.is_none_or(|c| vruntime[c] >= deadline[c]) {
                    if let Some(c) = current {
                        deadline[c] = vruntime[c] + vslice(weight[c]);
                    }
                    let v = avg(&vruntime, &weight, &fair);
                    let c = (0..4)
                        .filter(|&i| vruntime[i] <= v)
                        .min_by_key(|&i| (deadline[i], i))
                        .or_else(|| (0..4).min_by_key(|&i| (vruntime[i], i)))
                        .expect("four VMs");
                    if vruntime[c] >= deadline[c] {
                        deadline[c] = vruntime[c] + vslice(weight[c]);
                    }
                    current = Some(c);
                }
                current.expect("picked")
            }
        };
        if fair[pick] {
            vruntime[pick] += STEP as i128 * NICE_0 as i128 / weight[pick];
        }
        *host.cpu.entry(ids[pick]).or_default() += STEP;
        running = Some(pick);
    }
    let total = (seconds * 1_000_000_000) as f64;
    let shares = ids.iter().map(|id| host.cpu.get(id).copied().unwrap_or(0) as f64 / total).collect();
    let boosts = coord.vm(ids[0]).unwrap().slot(EVENT).unwrap().counters.boosts;
    (shares, boosts)
}

/// The model is cruder than the kernel (fixed slices, no eligibility, a step of 50 µs). At the
/// default pay-back (nice 10) it keeps every VM within ±5% of an equal share, the experiments'
/// target (`results/feas-fairness`). At nice 19 it overcharges the boosted VM (about -7% at 300
/// events a second), as `feas-latency` measured on the real kernel (-9.8% on a noisy host, at
/// 7548d5d): that is why the default is 10; the bound for nice 19 here is ±10%. Without charging
/// the same model gives the boosted VM far more (below).
#[test]
fn with_charging_every_vm_keeps_about_its_equal_share_over_a_long_random_run() {
    for (rate, nice) in [(50, 10), (300, 10), (2000, 10), (300, 19)] {
        let (shares, boosts) = simulate(FeasConfig { repay_nice: nice, ..seed() }, rate, 20);
        // At most one per 10 ms cycle, and fewer while paying back.
        assert!(boosts > rate.min(100) * 20 / 4, "rate {rate}, nice {nice}: VM 0 was boosted {boosts} times");
        eprintln!("rate {rate}/s, nice {nice}: {boosts} boosts, shares {shares:.3?}");
        let bound = if nice == FeasConfig::default().repay_nice { 0.05 } else { 0.10 };
        for (i, s) in shares.iter().enumerate() {
            assert!(
                (s / 0.25 - 1.0).abs() <= bound,
                "rate {rate}, nice {nice}: VM {i} got {:.1}% of the CPU",
                s * 100.0
            );
        }
    }
}

#[test]
fn without_charging_the_boosted_vm_takes_more_than_its_share() {
    // The same run as above with the accounting off: what the test above would catch.
    let (shares, _) = simulate(no_charge(), 300, 20);
    assert!(shares[0] > 0.25 * 1.10, "VM 0 got {:.1}%", shares[0] * 100.0);
}
