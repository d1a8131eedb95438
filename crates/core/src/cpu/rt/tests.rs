//! RT co-scheduling and predictive boost with a fake clock.

use cosched_proto::{caps, cpu::Need, DenyReason, Frame, Kind, Resource};

use super::*;
use crate::{Coordinator, Grant, Level, Policy, NS_PER_MS};

const CPU: Resource = Resource::Cpu;
const MS: u64 = NS_PER_MS;
const VM: VmId = VmId(1);

struct Sim {
    c: Coordinator,
    now: u64,
    seq: u32,
}

fn quiet() -> Policy {
    Policy {
        max_continuous_boost_ms: 0,
        max_boost_share_permille: 1000,
        rt_guard_max_share_permille: 0,
        ..Policy::default()
    }
}

impl Sim {
    fn new(rt: RtConfig) -> Sim {
        Sim::with(quiet(), rt)
    }

    fn with(policy: Policy, rt: RtConfig) -> Sim {
        let mut c = Coordinator::with_cpu(policy, 64);
        c.set_rt(rt);
        let s = c.default_settings();
        c.vm_found(VM, "vm1", s, 0);
        let mut sim = Sim { c, now: 0, seq: 0 };
        assert_eq!(sim.reply(Kind::Register, caps::CPU), Frame::ack(1, caps::CPU));
        sim
    }

    fn send(&mut self, kind: Kind, value: u64) -> Vec<Action> {
        self.seq += 1;
        let mut out = Vec::new();
        self.c.frame(VM, Frame::new(kind, self.seq, value), self.now, &mut out);
        out
    }

    fn reply(&mut self, kind: Kind, value: u64) -> Frame {
        let out = self.send(kind, value);
        let seq = self.seq;
        let r: Vec<Frame> = out
            .iter()
            .filter_map(|a| match a {
                Action::Send { frame, .. } if frame.seq == seq => Some(*frame),
                _ => None,
            })
            .collect();
        assert_eq!(r.len(), 1, "one reply: {out:?}");
        r[0]
    }

    /// `CPU 1` naming guest priority `p`.
    fn cpu_rt(&mut self, p: u8) -> Frame {
        self.reply(Kind::Cpu, Need { priority: p, irq: false }.encode())
    }

    fn wake(&mut self, delay_us: u32, p: u8) -> Frame {
        self.reply(Kind::Wake, cosched_proto::wake::encode(delay_us, p))
    }

    /// Runs every deadline up to `to`, returning the actions with the time they happened.
    fn advance(&mut self, to: u64) -> Vec<(u64, Action)> {
        let mut log = Vec::new();
        while let Some(d) = self.c.next_deadline() {
            if d > to {
                break;
            }
            self.now = d.max(self.now);
            let mut out = Vec::new();
            self.c.tick(self.now, &mut out);
            log.extend(out.into_iter().map(|a| (self.now, a)));
        }
        self.now = to;
        log
    }

    fn level(&self) -> Level {
        self.c.vm(VM).unwrap().level(CPU)
    }

    fn granted(&self) -> u64 {
        self.c.vm(VM).unwrap().slots[&CPU].granted
    }

    fn st(&self) -> RtStatus {
        self.c.rt_status(VM, self.now).unwrap()
    }
}

fn applies(actions: &[Action]) -> Vec<(Level, u64)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Apply { level, grant: g, .. } => Some((*level, value_of(*level, *g))),
            _ => None,
        })
        .collect()
}

fn rt(map: PriorityMap, ceiling: u8) -> RtConfig {
    RtConfig { priority_map: map, rt_ceiling: Some(ceiling), ..RtConfig::default() }
}

const fn grant(p: u8) -> u64 {
    1 | (p as u64) << 8
}

/// What an `Apply`'s typed grant is as the slot's granted value (the ACK's): `grant(p)` for an
/// RT co-scheduling grant, 1 for a plain boost, 0 at normal.
fn value_of(level: Level, g: Grant) -> u64 {
    match g {
        Grant::Rt { priority } => grant(priority),
        Grant::Plain { .. } => level.is_changed() as u64,
        Grant::Share(s) => s,
    }
}

#[test]
fn priority_maps_and_the_ceiling() {
    let need = |p| Need { priority: p, irq: false };
    let same = rt(PriorityMap::Same, 50);
    assert_eq!(same.host_priority(need(80), 50, 1), Some(50), "capped at the ceiling");
    assert_eq!(same.host_priority(need(20), 50, 1), Some(20));
    assert_eq!(same.host_priority(need(20), 50, 30), Some(30), "never below the VM's own priority");
    assert_eq!(same.host_priority(need(0), 50, 1), None, "no priority given: a plain boost");
    assert_eq!(same.host_priority(Need { priority: 0, irq: true }, 50, 1), Some(50), "an interrupt ranks highest");
    let linear = rt(PriorityMap::Linear, 50);
    assert_eq!(linear.host_priority(need(99), 50, 1), Some(50));
    assert_eq!(linear.host_priority(need(1), 50, 1), Some(1));
    assert_eq!(linear.host_priority(need(80), 50, 1), Some(41)); // ceil(80 * 50 / 99)
    assert_eq!(linear.host_priority(need(50), 50, 1), Some(26));
    assert_eq!(rt(PriorityMap::Vm, 50).host_priority(need(80), 50, 1), None, "vm: the guest's priority ignored");
    assert_eq!(granted_priority(grant(41)), Some(41));
    assert_eq!(granted_priority(1), None);
    assert_eq!(granted_priority(0), None);
}

#[test]
fn a_guest_priority_is_granted_mapped_and_capped_and_a_new_one_reapplies() {
    let mut s = Sim::new(rt(PriorityMap::Same, 40));
    let out = s.send(Kind::Cpu, Need { priority: 80, irq: false }.encode());
    assert_eq!(applies(&out), [(Level::Boosted, grant(40))], "80 capped at the ceiling 40");
    assert!(out.contains(&Action::Send { vm: VM, frame: Frame::ack(2, grant(40)) }), "{out:?}");
    // The same need again changes nothing; a lower one re-applies at once.
    let out = s.send(Kind::Cpu, Need { priority: 80, irq: false }.encode());
    assert_eq!(applies(&out), []);
    let out = s.send(Kind::Cpu, Need { priority: 10, irq: false }.encode());
    assert_eq!(applies(&out), [(Level::Boosted, grant(10))]);
    assert_eq!(s.st().host_priority, Some(10));
    assert_eq!(s.st().guest_priority, 10);
    // A plain CPU 1 while boosted goes back to the VM's own priority and class.
    assert_eq!(s.reply(Kind::Cpu, 1), Frame::ack(5, 1));
    assert_eq!(s.granted(), 1);
    // Deboost as always.
    let out = s.send(Kind::Cpu, 0);
    assert_eq!(applies(&out), [(Level::Normal, 0)]);
    let k = &s.c.vm(VM).unwrap().slots[&CPU].counters;
    assert_eq!((k.boosts, k.deboosts), (1, 1), "a change of priority is not a new boost");
}

#[test]
fn per_vm_ceiling_from_config_and_operator_and_the_vm_priority() {
    let mut s = Sim::new(rt(PriorityMap::Linear, 40));
    s.c.set_ceiling("vm1", Some(20));
    assert_eq!(s.cpu_rt(99), Frame::ack(2, grant(20)), "the VM's own ceiling wins over [rt]");
    // The operator lowers it while boosted: re-applied.
    let mut out = Vec::new();
    s.c.set_vm_ceiling(VM, 10, &mut out).unwrap();
    assert_eq!(applies(&out), [(Level::Boosted, grant(10))]);
    assert!(s.c.set_vm_ceiling(VM, 99, &mut out).is_err(), "99 is the daemon's");
    // A VM priority above the mapped one lifts the grant (never below the VM's priority).
    let mut out = Vec::new();
    s.c.set_vm_priority(VM, 15, &mut out).unwrap();
    assert_eq!(applies(&out), [(Level::Boosted, grant(15))]);
    assert_eq!(s.st().ceiling, 10);
}

#[test]
fn priority_map_vm_keeps_the_plain_boost() {
    let mut s = Sim::new(rt(PriorityMap::Vm, 40));
    assert_eq!(s.cpu_rt(80), Frame::ack(2, 1));
    assert_eq!(s.st().host_priority, None);
}

#[test]
fn a_reprioritised_vm_at_full_host_reserve_is_not_refused() {
    let mut c = Coordinator::with_cpu(Policy { host_reserve_cpus: 1, ..quiet() }, 2);
    let s = c.default_settings();
    c.vm_found(VM, "vm1", s, 0);
    let mut out = Vec::new();
    c.frame(VM, Frame::register(1, caps::CPU), 0, &mut out);
    c.frame(VM, Frame::cpu_rt(2, Need { priority: 10, irq: false }), 0, &mut out);
    out.clear();
    c.frame(VM, Frame::cpu_rt(3, Need { priority: 20, irq: false }), 0, &mut out);
    assert!(out.contains(&Action::Send { vm: VM, frame: Frame::ack(3, grant(20)) }), "{out:?}");
}

fn predict() -> RtConfig {
    RtConfig {
        predict_lead_min_us: 200,
        predict_lead_max_us: 2_000,
        predict_hold_us: 1_000,
        predict_max_delay_ms: 100,
        predict_max_share_permille: 1000,
        ..RtConfig::default()
    }
}

#[test]
fn a_prediction_boosts_at_t_plus_d_minus_lead_is_confirmed_and_ended_by_cpu_0() {
    let mut s = Sim::new(predict());
    s.now = 10 * MS;
    // Due 20 ms after arrival; the boost comes 200 µs before.
    assert_eq!(s.wake(20_000, 80), Frame::ack(2, 19_800));
    assert_eq!(s.level(), Level::Normal);
    assert_eq!(s.c.next_deadline(), Some(10 * MS + 19_800_000));
    let log = s.advance(30 * MS + 50_000);
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].0, 29_800_000);
    assert!(
        matches!(log[0].1, Action::Apply { level: Level::Boosted, grant: g, .. } if value_of(Level::Boosted, g) == grant(49))
    );
    assert_eq!(s.c.predicted_starts(), [(VM, 29_800_000, 29_800_000)]);
    s.c.predict_applied(VM, 29_800_000, 29_800_000, 29_830_000);
    // The guest wakes 50 µs after the predicted time: its CPU 1 confirms; the slot is boosted.
    let out = s.send(Kind::Cpu, Need { priority: 80, irq: false }.encode());
    assert_eq!(applies(&out), [], "already boosted at that priority");
    let st = s.st();
    assert_eq!((st.predictions.received, st.predictions.applied, st.predictions.confirmed), (1, 1, 1));
    assert_eq!(st.predict_error_us.p50_us, 50.0);
    assert_eq!(st.predict_apply_late_us.max_us, 30.0);
    assert_eq!(st.pending, None);
    // It stays boosted past the hold: the guest holds it now. CPU 0 ends it.
    s.advance(40 * MS);
    assert_eq!(s.level(), Level::Boosted);
    let out = s.send(Kind::Cpu, 0);
    assert_eq!(applies(&out), [(Level::Normal, 0)]);
    assert_eq!(s.st().predictions.unconfirmed, 0);
    assert_eq!(s.st().unconfirmed_ms, 0.0);
}

#[test]
fn an_unconfirmed_prediction_ends_after_the_hold_and_is_charged() {
    let mut s = Sim::new(predict());
    assert_eq!(s.wake(5_000, 0), Frame::ack(2, 4_800));
    let log = s.advance(20 * MS);
    let times: Vec<(u64, Level)> = log
        .iter()
        .filter_map(|(t, a)| match a {
            Action::Apply { level, .. } => Some((*t, *level)),
            _ => None,
        })
        .collect();
    // Boosted at 4.8 ms (a plain boost: no priority given), ended at 5 ms + 1 ms hold.
    assert_eq!(times, [(4_800_000, Level::Boosted), (6 * MS, Level::Normal)]);
    assert!(log.iter().all(|(_, a)| !matches!(a, Action::Send { .. })), "nothing to tell the guest");
    let st = s.st();
    assert_eq!((st.predictions.applied, st.predictions.unconfirmed, st.predictions.confirmed), (1, 1, 0));
    assert_eq!(st.unconfirmed_ms, 1.2);
    // A CPU 1 now is a fresh boost, not a confirmation.
    s.cpu_rt(10);
    assert_eq!(s.st().predictions.confirmed, 0);
}

#[test]
fn a_confirmation_after_the_hold_lengthens_the_hold_up_to_its_maximum() {
    let mut s = Sim::new(predict());
    s.wake(5_000, 0);
    s.advance(7 * MS); // boosted at 4.8 ms, ended unconfirmed at 6 ms (1 ms hold)
    assert_eq!(s.level(), Level::Normal);
    // The guest's CPU 1 comes 3 ms after the predicted wake-up: a late confirmation.
    s.now = 8 * MS;
    s.cpu_rt(10);
    let st = s.st();
    assert_eq!((st.predictions.unconfirmed, st.predictions.late, st.predictions.confirmed), (1, 1, 0));
    assert_eq!((st.predict_error_us.max_us, st.hold_us), (3_000.0, 3_000.0));
    s.send(Kind::Cpu, 0);
    // The next prediction waits 3 ms after its wake-up before it ends by itself.
    s.now = 20 * MS;
    s.wake(5_000, 0);
    let ends: Vec<u64> = s
        .advance(40 * MS)
        .iter()
        .filter_map(|(t, a)| matches!(a, Action::Apply { level: Level::Normal, .. }).then_some(*t))
        .collect();
    assert_eq!(ends, [28 * MS]);
    // A CPU 1 after the guest told its next wake-up is not the last one's late confirmation,
    // even when that WAKE was refused (here: further ahead than predict_max_delay_ms).
    let mut t = Sim::new(predict());
    t.wake(5_000, 0);
    t.advance(7 * MS);
    assert_eq!(t.wake(200_000, 0).deny_reason(), Some(DenyReason::Budget));
    t.now = 8 * MS;
    t.cpu_rt(10);
    assert_eq!((t.st().predictions.late, t.st().hold_us), (0, 1_000.0));
    // A CPU 1 further after the wake-up than the hold may grow (10 ms) is no confirmation.
    s.now = 39 * MS;
    s.cpu_rt(10);
    assert_eq!(s.st().predictions.late, 1, "not counted");
    s.send(Kind::Cpu, 0);
    // A guest 9.5 ms late every time: the hold follows it (p99 of the errors), within the most
    // it may grow (predict_hold_max_us, 10 ms).
    late_guest(&mut s);
}

/// A guest 9.5 ms late 20 times in a row (a host that stalled it), 20 ms apart: the hold it grew
/// to, 9.5 ms.
fn late_guest(s: &mut Sim) {
    let late = s.st().predictions.late;
    for k in 0..20u64 {
        let t = s.now + 20 * MS;
        s.now = t;
        s.wake(1_000, 0);
        s.advance(t + MS + 9_400_000);
        s.now = t + MS + 9_500_000;
        s.cpu_rt(10);
        s.send(Kind::Cpu, 0);
        assert!(k > 0 || s.st().predictions.late == late + 1, "the first came after its hold");
    }
    assert_eq!(s.st().hold_us, 9_500.0);
}

#[test]
fn the_hold_and_the_lead_come_back_down_once_their_errors_are_old() {
    let mut s = Sim::new(predict());
    late_guest(&mut s);
    // The lead too, from a guest that woke 1.5 ms early.
    let t = s.now + 20 * MS;
    s.now = t;
    s.wake(5_000, 0);
    s.now = t + 3_500_000;
    s.cpu_rt(10);
    s.send(Kind::Cpu, 0);
    assert_eq!((s.st().lead_us, s.st().hold_us), (1_700.0, 9_500.0));
    // 10 s on with no error since (ADAPT_WINDOW_NS), the next WAKE finds both at their least.
    s.now += ADAPT_WINDOW_NS + MS;
    assert_eq!(s.wake(5_000, 0), Frame::ack(s.seq, 4_800));
    assert_eq!((s.st().lead_us, s.st().hold_us), (200.0, 1_000.0));
    let ends: Vec<u64> = level_changes(&s.advance(s.now + 20 * MS)).iter().map(|c| c.0).collect();
    assert_eq!(ends, [s.now - 20 * MS + 4_800_000, s.now - 20 * MS + 6 * MS], "boosted 4.8-6 ms");
}

#[test]
fn a_standing_prediction_holds_half_its_period_at_most() {
    let mut s = Sim::new(predict());
    late_guest(&mut s);
    // Lead 200 µs + hold 9.5 ms would keep the VM boosted nearly all of a 10 ms period: the
    // pattern is taken with its hold cut to 5 ms - 200 µs.
    let t0 = s.now;
    let ack = s.wake_standing(10_000, 80, 10_000);
    assert_eq!(ack, Frame::ack(s.seq, cosched_proto::wake::standing_ack(9_800, 4_800)));
    let log = s.advance(t0 + 35 * MS);
    let mut want = Vec::new();
    for k in 1..=3 {
        want.push((t0 + k * 10 * MS - 200_000, Level::Boosted));
        want.push((t0 + k * 10 * MS + 4_800_000, Level::Normal));
    }
    assert_eq!(level_changes(&log), want, "boosted from 200 µs before each period to 4.8 ms after");
    // A period too short for the lead and the least hold (2 × 1.2 ms) is still refused.
    assert_eq!(s.wake_standing(10_000, 80, 2_000).deny_reason(), Some(DenyReason::Budget));
}

#[test]
fn the_prediction_budget_denies_and_the_delay_is_bounded() {
    // 20 s window, 1 permille: 20 ms of unconfirmed boost; each prediction reserves lead + hold
    // (1.2 ms) and is charged what it held.
    let mut s = Sim::new(RtConfig { predict_max_share_permille: 1, ..predict() });
    let mut granted = 0;
    loop {
        let t = s.now;
        match s.wake(1_000, 0) {
            f if f.kind == Kind::Ack => granted += 1,
            f => {
                assert_eq!(f, Frame::deny_for(s.seq, CPU, DenyReason::Budget));
                break;
            }
        }
        s.advance(t + 10 * MS);
        assert!(granted < 100, "the budget never ran out");
    }
    // 1.2 ms charged each (0.2 ms lead + 1 ms hold): 16 fit below 20 ms - 1.2 ms.
    assert_eq!(granted, 16);
    let st = s.st();
    assert_eq!((st.predictions.unconfirmed, st.predictions.denied), (16, 1));
    assert_eq!(s.c.vm(VM).unwrap().slots[&CPU].counters.denied.get("budget"), Some(&1));
    // The window moves on and the budget comes back.
    s.advance(s.now + 21_000 * MS);
    assert_eq!(s.wake(1_000, 0).kind, Kind::Ack);
    // Further than predict_max_delay_ms (100 ms): refused.
    assert_eq!(s.wake(100_001, 0), Frame::deny_for(s.seq, CPU, DenyReason::Budget));
}

#[test]
fn wake_0_cancels_and_a_new_wake_replaces() {
    let mut s = Sim::new(predict());
    s.wake(10_000, 50);
    assert_eq!(s.wake(0, 0), Frame::ack(3, 0));
    assert!(s.advance(50 * MS).is_empty(), "cancelled: nothing happens");
    s.wake(10_000, 50);
    s.now += MS;
    s.wake(30_000, 50); // replaces: due 30 ms from now
    let log = s.advance(100 * MS);
    assert_eq!(log.iter().filter(|(_, a)| matches!(a, Action::Apply { level: Level::Boosted, .. })).count(), 1);
    assert_eq!(log[0].0, 50 * MS + MS + 30 * MS - 200_000);
    let st = s.st();
    assert_eq!((st.predictions.received, st.predictions.cancelled, st.predictions.applied), (3, 2, 1));
    // Cancelling an applied prediction ends its boost.
    s.wake(1_000, 0);
    s.advance(s.now + 900_000);
    assert_eq!(s.level(), Level::Boosted);
    let out = s.send(Kind::Wake, 0);
    assert_eq!(applies(&out), [(Level::Normal, 0)]);
}

#[test]
fn wake_needs_a_registered_agent_with_the_cpu_and_predict_on() {
    let mut s = Sim::new(RtConfig { predict: false, ..predict() });
    assert_eq!(s.wake(1_000, 0), Frame::deny_for(2, CPU, DenyReason::Unsupported));
    let mut s = Sim::new(predict());
    s.reply(Kind::Deregister, 0);
    assert_eq!(s.wake(1_000, 0), Frame::deny_for(3, CPU, DenyReason::NotRegistered));
    assert_eq!(s.st().predictions.denied, 1);
}

#[test]
fn a_prediction_while_the_guest_holds_the_boost_is_covered_or_takes_it_over() {
    let mut s = Sim::new(predict());
    s.cpu_rt(30);
    s.wake(5_000, 30);
    // Still boosted by the guest at the start: nothing applied, dropped after the hold.
    assert!(applies(&s.advance(20 * MS).into_iter().map(|x| x.1).collect::<Vec<_>>()).is_empty());
    assert_eq!(s.st().predictions.covered, 1);
    // The guest lets go after the start and before the wake-up: the prediction keeps the boost.
    s.wake(1_000, 30);
    s.advance(s.now + 900_000);
    let out = s.send(Kind::Cpu, 0);
    assert_eq!(applies(&out), [], "the prediction holds the boost");
    assert!(out.contains(&Action::Send { vm: VM, frame: Frame::ack(s.seq, 0) }));
    assert_eq!(s.level(), Level::Boosted);
    // ... until the hold, unconfirmed.
    let log = s.advance(s.now + 5 * MS);
    assert_eq!(applies(&log.into_iter().map(|x| x.1).collect::<Vec<_>>()), [(Level::Normal, 0)]);
    assert_eq!(s.st().predictions.unconfirmed, 1);
}

#[test]
fn the_lead_adapts_to_guests_that_wake_early() {
    let mut s = Sim::new(predict());
    assert_eq!(s.st().lead_us, 200.0);
    for _ in 0..20 {
        let t = s.now;
        s.wake(10_000, 0);
        // The guest wakes 500 µs before the predicted time (a fast guest clock, a slow WAKE):
        // before the boost while the lead is 200 µs.
        s.advance(t + 9_500_000);
        s.cpu_rt(50);
        s.send(Kind::Cpu, 0);
        s.advance(t + 20 * MS);
    }
    let st = s.st();
    assert_eq!(st.predictions.confirmed, 20);
    assert_eq!(st.predictions.early, 1, "only the first came before its boost");
    assert_eq!(st.lead_us, 700.0, "lead = 200 µs + the 500 µs the guest wakes early");
    assert_eq!(st.predict_error_us.p50_us, -500.0);
    // A later CPU 1 does not pull the lead below the minimum.
    let mut s = Sim::new(predict());
    s.wake(10_000, 0);
    s.advance(10 * MS + 300_000);
    s.cpu_rt(50);
    assert_eq!(s.st().lead_us, 200.0);
    // The lead is bounded.
    let mut s = Sim::new(predict());
    s.now = 100 * MS;
    s.wake(50_000, 0);
    s.now += 40 * MS; // 10 ms early: taken for an unrelated need (beyond predict_lead_max_us)
    s.cpu_rt(50);
    assert_eq!(s.st().predictions.confirmed, 0);
    s.send(Kind::Cpu, 0);
    s.now += 8 * MS; // 2 ms early: a confirmation
    s.cpu_rt(50);
    assert_eq!(s.st().lead_us, 2_000.0);
}

#[test]
fn the_host_acts_early_by_what_it_takes_to_apply_a_boost() {
    let mut s = Sim::new(predict());
    for i in 0..12u64 {
        let t = s.now;
        s.wake(10_000, 0);
        s.advance(t + 10 * MS);
        let starts = s.c.predicted_starts();
        assert_eq!(starts.len(), 1);
        let (_, target, start) = starts[0];
        assert_eq!(target, t + 9_800_000);
        // The first 8 are planned at their target; once the host has seen itself take 100 µs
        // (but 1 ms once), it acts 100 µs before the target.
        let expect = if i < 8 { 0 } else { 100_000 };
        assert_eq!(target - start, expect, "round {i}");
        s.c.predict_applied(VM, target, start, start + if i == 3 { 1_000_000 } else { 100_000 });
        s.advance(t + 20 * MS);
    }
    let st = s.st();
    assert_eq!(st.predict_apply_late_us.count, 12);
}

#[test]
fn a_prediction_refused_by_the_cpu_rules_is_counted() {
    let mut s = Sim::new(predict());
    let mut out = Vec::new();
    s.c.set_vm_enabled(VM, Some(CPU), false, 0, &mut out);
    assert_eq!(s.wake(1_000, 0).deny_reason(), Some(DenyReason::Disabled));
    s.c.set_vm_enabled(VM, Some(CPU), true, 0, &mut out);
    s.wake(1_000, 0);
    s.c.set_vm_enabled(VM, Some(CPU), false, 0, &mut out);
    s.advance(10 * MS);
    assert_eq!(s.st().predictions.refused, 1);
    assert_eq!(s.level(), Level::Normal);
}

#[test]
fn a_deboost_that_carries_the_next_wake_up_deboosts_and_plans_with_one_reply() {
    let mut s = Sim::new(predict());
    s.cpu_rt(80);
    assert_eq!(s.level(), Level::Boosted);
    s.now = 10 * MS;
    // CPU 0 + WAKE in one frame: deboosted at once, the boost planned 200 µs before the
    // wake-up, and one reply, the WAKE's.
    let out = s.send(Kind::Cpu, cosched_proto::cpu::deboost_wake(9_000, 80));
    assert_eq!(applies(&out), [(Level::Normal, 0)]);
    let replies: Vec<&Action> = out.iter().filter(|a| matches!(a, Action::Send { .. })).collect();
    assert_eq!(replies, [&Action::Send { vm: VM, frame: Frame::ack(3, 8_800) }]);
    let st = s.st();
    assert_eq!((st.predictions.received, st.guest_priority), (1, 0));
    let log = s.advance(19 * MS + 50_000);
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].0, 10 * MS + 8_800_000);
    // The guest's CPU 1 confirms it, as after a WAKE.
    assert_eq!(s.cpu_rt(80), Frame::ack(4, grant(49)));
    assert_eq!(s.st().predictions.confirmed, 1);
    // A refused prediction leaves the deboost done: DENY(cpu: budget) for a delay past the
    // most, and the VM at normal.
    let out = s.send(Kind::Cpu, cosched_proto::cpu::deboost_wake(200_000, 80));
    assert_eq!(applies(&out), [(Level::Normal, 0)]);
    assert!(out.contains(&Action::Send { vm: VM, frame: Frame::deny_for(5, CPU, DenyReason::Budget) }), "{out:?}");
    assert_eq!(s.st().predictions.denied, 1);
    // A host that does not take predictions still deboosts, and says so.
    let mut s = Sim::new(RtConfig { predict: false, ..predict() });
    s.cpu_rt(80);
    let out = s.send(Kind::Cpu, cosched_proto::cpu::deboost_wake(9_000, 80));
    assert_eq!(applies(&out), [(Level::Normal, 0)]);
    assert!(out.contains(&Action::Send { vm: VM, frame: Frame::deny_for(3, CPU, DenyReason::Unsupported) }));
    // Unregistered: refused as any CPU frame.
    s.reply(Kind::Deregister, 0);
    assert_eq!(
        s.reply(Kind::Cpu, cosched_proto::cpu::deboost_wake(9_000, 80)),
        Frame::deny_for(5, CPU, DenyReason::NotRegistered)
    );
}

#[test]
fn a_deboost_with_the_next_wake_up_while_a_prediction_holds_the_boost_replaces_it() {
    let mut s = Sim::new(predict());
    s.cpu_rt(30);
    // Planned while the guest holds the boost; the guest lets go before the wake-up and tells
    // the next one: the new prediction replaces the old (cancelled, its boost ended), one reply.
    s.wake(1_000, 30);
    s.advance(s.now + 900_000);
    let out = s.send(Kind::Cpu, cosched_proto::cpu::deboost_wake(10_000, 30));
    let replies: Vec<&Action> = out.iter().filter(|a| matches!(a, Action::Send { .. })).collect();
    assert_eq!(replies, [&Action::Send { vm: VM, frame: Frame::ack(4, 9_800) }]);
    assert_eq!(applies(&out), [(Level::Normal, 0)]);
    assert_eq!(s.st().predictions.cancelled, 1);
    assert_eq!(s.st().pending.map(|p| p.1), Some("planned"));
}

impl Sim {
    fn wake_standing(&mut self, delay_us: u32, p: u8, period_us: u32) -> Frame {
        self.reply(Kind::Wake, cosched_proto::wake::encode_standing(delay_us, p, period_us))
    }
}

/// (time, level) of every `Apply` in an `advance` log.
fn level_changes(log: &[(u64, Action)]) -> Vec<(u64, Level)> {
    log.iter()
        .filter_map(|(t, a)| match a {
            Action::Apply { level, .. } => Some((*t, *level)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_standing_prediction_boosts_every_period_by_itself_until_withdrawn() {
    let mut s = Sim::new(predict());
    // Due in 10 ms, then every 10 ms; the ACK says the start (200 µs lead) and the hold (1 ms).
    assert_eq!(s.wake_standing(10_000, 80, 10_000), Frame::ack(2, cosched_proto::wake::standing_ack(9_800, 1_000)));
    let log = s.advance(45 * MS);
    let mut want = Vec::new();
    for k in 1..=4 {
        want.push((k * 10 * MS - 200_000, Level::Boosted));
        want.push((k * 10 * MS + MS, Level::Normal));
    }
    assert_eq!(level_changes(&log), want, "boosted 200 µs before each period, ended 1 ms after it");
    assert!(log.iter().all(|(_, a)| !matches!(a, Action::Send { .. })), "the guest is told nothing: {log:?}");
    let st = s.st();
    assert_eq!((st.predictions.received, st.predictions.standing), (1, 4));
    assert_eq!((st.predictions.applied, st.predictions.unconfirmed, st.predictions.confirmed), (4, 0, 0));
    assert_eq!(st.unconfirmed_ms, 0.0, "a standing prediction is not charged as unconfirmed");
    assert_eq!(st.pending.map(|p| p.1), Some("standing"));
    // WAKE 0 withdraws it: no period after.
    assert_eq!(s.wake(0, 0).kind, Kind::Ack);
    assert_eq!((s.st().pending, s.st().predictions.cancelled), (None, 1));
    assert_eq!(level_changes(&s.advance(100 * MS)), [], "withdrawn");
}

#[test]
fn the_guests_own_boosts_are_layered_on_a_standing_prediction() {
    let mut s = Sim::new(predict());
    s.wake_standing(10_000, 80, 10_000);
    // Between two periods the guest boosts for a task of its own, and lets go: its boost.
    s.advance(15 * MS);
    let out = s.send(Kind::Cpu, Need { priority: 0, irq: false }.encode());
    assert_eq!(applies(&out), [(Level::Boosted, 1)]);
    s.now = 16 * MS;
    assert_eq!(applies(&s.send(Kind::Cpu, 0)), [(Level::Normal, 0)]);
    // The next period is boosted as planned; a CPU 1 in it (an activation outside the guest's
    // window) and its CPU 0 leave the period's boost on until its hold is over.
    s.advance(20 * MS);
    assert_eq!(s.level(), Level::Boosted);
    s.now = 20 * MS + 300_000;
    s.cpu_rt(80);
    s.now = 20 * MS + 500_000;
    assert_eq!(s.reply(Kind::Cpu, 0), Frame::ack(s.seq, 0));
    assert_eq!(s.level(), Level::Boosted);
    assert_eq!(level_changes(&s.advance(21 * MS)), [(21 * MS, Level::Normal)]);
    // A guest boost still on when a period's hold ends keeps the VM boosted.
    s.advance(30 * MS);
    s.now = 30 * MS + 900_000;
    s.cpu_rt(80);
    assert_eq!(level_changes(&s.advance(31 * MS + 1)), [], "the guest holds its own boost");
    assert_eq!(s.level(), Level::Boosted);
    assert_eq!(s.st().pending.map(|p| p.1), Some("standing"), "the pattern goes on");
    assert_eq!(s.st().predictions.standing, 3);
}

#[test]
fn a_standing_prediction_too_dense_is_refused_and_a_refused_period_tells_the_guest() {
    let mut s = Sim::new(predict());
    // Lead 200 + hold 1000 µs: a period under 2.4 ms would keep the VM boosted half the time.
    assert_eq!(s.wake_standing(10_000, 80, 2_000).deny_reason(), Some(DenyReason::Budget));
    assert_eq!(s.st().pending, None);
    assert_eq!(s.wake_standing(10_000, 80, 2_400).kind, Kind::Ack);
    // The operator turns the CPU off: the next period's boost is refused, and the guest, silent
    // while its pattern stands, hears of it (seq 0).
    let mut out = Vec::new();
    s.c.set_vm_enabled(VM, Some(CPU), false, s.now, &mut out);
    let log = s.advance(30 * MS);
    let sent: Vec<Frame> = log
        .iter()
        .filter_map(|(_, a)| match a {
            Action::Send { frame, .. } => Some(*frame),
            _ => None,
        })
        .collect();
    assert_eq!(sent, [Frame::deny_for(0, CPU, DenyReason::Disabled)]);
    assert_eq!((s.st().predictions.refused, s.st().pending), (1, None));
}

#[test]
fn a_standing_prediction_skips_the_periods_a_late_daemon_missed() {
    let mut s = Sim::new(predict());
    s.wake_standing(10_000, 0, 10_000);
    s.advance(10 * MS);
    assert_eq!(s.level(), Level::Boosted);
    // The daemon wakes 25 ms late for the end of the hold (due 11 ms): the next due one is 40 ms.
    s.now = 36 * MS;
    let log = s.advance(36 * MS);
    assert_eq!(level_changes(&log), [(36 * MS, Level::Normal)]);
    assert_eq!(s.c.next_deadline(), Some(40 * MS - 200_000));
}
