//! The decisions that are the coordinator's alone, on a fake clock with fake sensors: a CPU
//! boost taking the vCPUs over from event boosting, whether the host watches a VM for events,
//! memory-bandwidth checks and throttles, the static guards, and every deadline in one set.

use std::collections::BTreeMap;

use super::*;
use cosched_proto::{caps, Frame, Kind};

const MS: u64 = NS_PER_MS;
const VM: VmId = VmId(3);
const EVENT: Resource = Resource::Event;
const MEMBW: Resource = Resource::Membw;

#[derive(Default)]
struct Fake {
    run: BTreeMap<VmId, u64>,
    bytes: BTreeMap<VmId, u64>,
    frozen: BTreeMap<VmId, bool>,
}

impl Sensors for Fake {
    fn vcpu_run_ns(&mut self, vm: VmId) -> u64 {
        self.run.get(&vm).copied().unwrap_or(0)
    }
    fn vcpu_waiting(&mut self, _vm: VmId) -> bool {
        true
    }
    fn membw_bytes(&mut self, vm: VmId, _now: u64) -> u64 {
        self.bytes.remove(&vm).unwrap_or(0)
    }
    fn in_force(&mut self, vm: VmId, r: Resource) -> Option<bool> {
        assert_eq!(r, MEMBW);
        self.frozen.get(&vm).copied()
    }
}

fn quiet() -> Policy {
    Policy { rt_guard_max_share_permille: 0, host_reserve_cpus: 0, ..Policy::default() }
}

fn with_events(vms: EventVms) -> Coordinator {
    let p = quiet();
    let cpu = CpuPolicy::new(&p, 4);
    let ev = EventPolicy::new(FeasConfig { vms, charge: false, ..FeasConfig::default() });
    let mut c = Coordinator::new(p, vec![Box::new(cpu), Box::new(ev)]);
    let s = c.default_settings();
    c.vm_found(VM, "vm", s, 0);
    c
}

/// (resource, level) of every `Apply`, and the host's watch, in order.
fn decisions(out: &[Action]) -> Vec<String> {
    out.iter()
        .filter_map(|a| match a {
            Action::Apply { resource, level, .. } => Some(format!("{resource} {}", level.name())),
            Action::WatchEvents { on, .. } => Some(format!("watch {on}")),
            Action::StaticGuard { guarded, .. } => Some(format!("static guarded {guarded}")),
            Action::Send { .. } => None,
        })
        .collect()
}

#[test]
fn the_host_watches_a_vm_for_events_while_event_boosting_applies_to_it() {
    let mut c = with_events(EventVms::NoAgent);
    let mut out = Vec::new();
    c.follow_vm(VM, 0, &mut out);
    assert_eq!(decisions(&out), ["watch true"], "a VM without an agent");
    out.clear();
    c.frame(VM, Frame::register(1, caps::CPU), MS, &mut out);
    assert_eq!(decisions(&out), ["watch false"], "its agent coordinates it");
    out.clear();
    c.frame(VM, Frame::new(Kind::Deregister, 2, 0), 2 * MS, &mut out);
    assert_eq!(decisions(&out), ["watch true"]);
    out.clear();
    c.set_vm_enabled(VM, Some(EVENT), false, 3 * MS, &mut out);
    assert_eq!(decisions(&out), ["watch false"], "the operator turned it off for this VM");
    out.clear();
    c.set_enabled(Some(EVENT), true, 4 * MS, &mut out);
    assert!(decisions(&out).is_empty(), "still off for the VM: nothing changes");
    c.set_vm_enabled(VM, Some(EVENT), true, 5 * MS, &mut out);
    assert_eq!(decisions(&out), ["watch true"]);
}

#[test]
fn an_agents_cpu_boost_takes_the_vcpus_over_from_event_boosting_which_lets_go_first() {
    let mut c = with_events(EventVms::All);
    let (mut out, mut fake) = (Vec::new(), Fake::default());
    c.frame(VM, Frame::register(1, caps::CPU), 0, &mut out);
    assert_eq!(c.host_event(EVENT, VM, HostEvent::Device, MS, &mut fake, &mut out), EventOutcome::Boosted);
    out.clear();
    c.frame(VM, Frame::cpu(2, true), MS + 100_000, &mut out);
    assert_eq!(decisions(&out), ["event normal", "cpu boosted", "watch false"], "in this order");
    assert_eq!(c.host_event(EVENT, VM, HostEvent::Device, 2 * MS, &mut fake, &mut out), EventOutcome::Off);
    out.clear();
    c.frame(VM, Frame::cpu(3, false), 3 * MS, &mut out);
    assert_eq!(decisions(&out), ["cpu normal", "watch true"]);
    assert_eq!(c.host_event(EVENT, VM, HostEvent::Device, 20 * MS, &mut fake, &mut out), EventOutcome::Boosted);
    let ev = c.vm(VM).unwrap().slot(EVENT).unwrap();
    assert_eq!((ev.counters.boosts, ev.counters.deboosts), (2, 1));
}

#[test]
fn an_rt_grant_is_typed_with_its_host_priority() {
    let mut c = Coordinator::with_cpu(quiet(), 4);
    c.set_rt(RtConfig { priority_map: PriorityMap::Same, rt_ceiling: Some(40), ..RtConfig::default() });
    let s = c.default_settings();
    c.vm_found(VM, "vm", s, 0);
    let mut out = Vec::new();
    c.frame(VM, Frame::register(1, caps::CPU), 0, &mut out);
    out.clear();
    let need = cosched_proto::cpu::Need { priority: 80, irq: false }.encode();
    c.frame(VM, Frame::new(Kind::Cpu, 2, need), MS, &mut out);
    let applied: Vec<Grant> =
        out.iter().filter_map(|a| if let Action::Apply { grant, .. } = a { Some(*grant) } else { None }).collect();
    assert_eq!(applied, [Grant::Rt { priority: 40 }], "80 capped at the ceiling");
    out.clear();
    c.frame(VM, Frame::new(Kind::Cpu, 3, 1), 2 * MS, &mut out);
    assert!(matches!(out[0], Action::Apply { grant: Grant::Plain { priority: 1 }, .. }), "{out:?}");
}

fn membw() -> Coordinator {
    let p = quiet();
    let cfg = RegulatorConfig { guaranteed_mbps: 1000, period_ns: 10 * MS, reclaim: false, best_effort: false };
    let cpu = CpuPolicy::new(&p, 4);
    let mut c = Coordinator::new(p, vec![Box::new(cpu), Box::new(MembwPolicy::new(cfg, 2))]);
    let s = c.default_settings();
    c.vm_found(VM, "vm", s, 0);
    c.set_membw_share(VM, 500).unwrap();
    c
}

#[test]
fn membw_checks_are_deadlines_that_read_the_sensors_and_throttle_past_the_budget() {
    let mut c = membw();
    let (mut out, mut fake) = (Vec::new(), Fake::default());
    // Checks every 5 ms from the start; the budget is 500‰ of 1000 MB/s x 10 ms = 5 MB.
    assert_eq!(c.next_deadline(), Some(5 * MS));
    fake.bytes.insert(VM, 4_000_000);
    c.tick_sensed(5 * MS - 1, &mut fake, &mut out);
    assert!(out.is_empty(), "not due yet");
    c.tick_sensed(5 * MS, &mut fake, &mut out);
    assert!(out.is_empty(), "within its budget: {out:?}");
    assert_eq!(c.next_deadline(), Some(10 * MS));
    // The period's end lets everyone run and sets new budgets; then 6 MB in 5 ms is too much.
    c.tick_sensed(10 * MS, &mut fake, &mut out);
    assert!(out.is_empty(), "{out:?}");
    fake.bytes.insert(VM, 6_000_000);
    c.tick_sensed(15 * MS, &mut fake, &mut out);
    assert!(
        matches!(
            out[..],
            [Action::Apply { vm: VM, resource: MEMBW, level: Level::Throttled, grant: Grant::Share(500) }]
        ),
        "{out:?}"
    );
    // Not stopped until the lever says so; the throttle carried out is looked at once.
    let reg = |c: &Coordinator| c.policy_of::<MembwPolicy>().unwrap().regulator().vm(VM).unwrap().clone();
    assert!(reg(&c).throttled() && !reg(&c).stopped());
    fake.frozen.insert(VM, false);
    c.host_event(MEMBW, VM, HostEvent::Applied, 15 * MS, &mut fake, &mut out);
    assert!(!reg(&c).stopped(), "FREEZING is not a stop");
    fake.frozen.insert(VM, true);
    c.host_event(MEMBW, VM, HostEvent::Applied, 16 * MS, &mut fake, &mut out);
    assert!(reg(&c).stopped(), "FROZEN is");
    out.clear();
    // The period's end lets it run.
    c.tick_sensed(20 * MS, &mut fake, &mut out);
    assert!(matches!(out[..], [Action::Apply { resource: MEMBW, level: Level::Normal, .. }]), "{out:?}");
    assert_eq!((reg(&c).stats.throttled_ns, reg(&c).stats.stopping_ns), (4 * MS, MS));
}

#[test]
fn a_guests_membw_share_changes_the_regulation_not_its_threads() {
    let mut c = membw();
    let mut out = Vec::new();
    c.frame(VM, Frame::register(1, caps::MEMBW), 0, &mut out);
    out.clear();
    c.frame(VM, Frame::new(Kind::Membw, 2, 300), MS, &mut out);
    assert_eq!(out, [Action::Send { vm: VM, frame: Frame::ack(2, 300) }], "no Apply");
    assert_eq!(c.policy_of::<MembwPolicy>().unwrap().regulator().vm(VM).unwrap().effective(), 300);
}

#[test]
fn a_static_guard_is_a_deadline_of_the_coordinator_that_moves_the_vcpus_and_back() {
    let mut c = Coordinator::with_cpu(Policy::default(), 4);
    let s = c.default_settings();
    c.vm_found(VM, "vm", s, 0);
    let rule = GuardRule::from_policy(&Policy::default());
    assert!(!c.set_static_guard(VM, rule, 0), "real-time to begin with");
    assert_eq!(c.next_deadline(), Some(900 * MS));
    let mut out = Vec::new();
    c.tick(899 * MS, &mut out);
    assert!(out.is_empty());
    c.tick(900 * MS, &mut out);
    assert_eq!(decisions(&out), ["static guarded true"]);
    out.clear();
    // Guarded until its share of the window is back under the resume mark: each deadline is
    // the earliest that can be, so a few may pass first.
    let mut resume = 0;
    for _ in 0..100 {
        resume = c.next_deadline().unwrap();
        c.tick(resume, &mut out);
        if !out.is_empty() {
            break;
        }
    }
    assert_eq!(decisions(&out), ["static guarded false"]);
    assert!(resume >= 950 * MS, "{resume}");
    assert!(c.static_guard_status(VM, resume).unwrap().demotions == 1);
    // A tuning changed (a new shield) keeps its guard's window; none drops it.
    assert!(!c.set_static_guard(VM, rule, resume + 1));
    c.set_static_guard(VM, None, resume + 2);
    assert_eq!(c.next_deadline(), None);
}

#[test]
fn every_deadline_is_in_one_set_in_time_order() {
    let mut c = with_events(EventVms::NoAgent);
    let (mut out, mut fake) = (Vec::new(), Fake::default());
    c.set_static_guard(VM, GuardRule::from_policy(&Policy::default()), 0);
    c.host_event(EVENT, VM, HostEvent::Device, MS, &mut fake, &mut out);
    // The event slice ends at 2 ms, the static guard at 900 ms, the event slot's budget at
    // 10 s (max_continuous_boost_ms).
    assert_eq!(c.next_deadline(), Some(2 * MS));
    out.clear();
    c.tick_sensed(2 * MS, &mut fake, &mut out);
    assert_eq!(decisions(&out), ["event normal"]);
    assert_eq!(c.next_deadline(), Some(900 * MS), "the slot's budget deadline went with its boost");
    c.vm_gone(VM, 3 * MS, &mut out);
    assert_eq!(c.next_deadline(), None, "a VM gone takes its deadlines along");
}
