//! The coordinator with more than one resource: the I/O policy beside the CPU, and a fake
//! host-originated event resource. None of these needs a change to the coordinator: each is a
//! [`ResourcePolicy`] given to [`Coordinator::new`].

use super::*;
use cosched_proto::{caps, DenyReason, Frame, Kind, Resource};

const MS: u64 = NS_PER_MS;
const VM: VmId = VmId(7);
const CPU: Resource = Resource::Cpu;
const IO: Resource = Resource::Io;
const EVENT: Resource = Resource::Event;

/// A resource with no rules of its own: only the shared switches, budgets and rate limits.
#[derive(Debug)]
struct Plain(Resource);

impl ResourcePolicy for Plain {
    fn resource(&self) -> Resource {
        self.0
    }
}

fn policy() -> Policy {
    let mut p = Policy {
        max_continuous_boost_ms: 0,
        max_boost_share_permille: 1000,
        rt_guard_max_share_permille: 0,
        host_reserve_cpus: 0,
        ..Policy::default()
    };
    // I/O alone gets a 100 ms continuous budget and a small burst.
    p.resource.insert(
        "io".into(),
        LimitsOverride { max_continuous_boost_ms: Some(100), frame_burst: Some(3), ..Default::default() },
    );
    p
}

fn coordinator() -> Coordinator {
    let p = policy();
    let cpu = CpuPolicy::new(&p, 8);
    let mut c = Coordinator::new(p, vec![Box::new(cpu), Box::new(IoPolicy), Box::new(Plain(EVENT))]);
    let s = c.default_settings();
    c.vm_found(VM, "vm", s, 0);
    c
}

fn frame(c: &mut Coordinator, f: Frame, now: u64) -> Vec<Action> {
    let mut out = Vec::new();
    c.frame(VM, f, now, &mut out);
    out
}

fn sends(out: &[Action]) -> Vec<Frame> {
    out.iter().filter_map(|a| if let Action::Send { frame, .. } = a { Some(*frame) } else { None }).collect()
}

fn applied(out: &[Action]) -> Vec<(Resource, Level)> {
    out.iter()
        .filter_map(|a| if let Action::Apply { resource, level, .. } = a { Some((*resource, *level)) } else { None })
        .collect()
}

fn registered() -> Coordinator {
    let mut c = coordinator();
    let out = frame(&mut c, Frame::register(1, caps::CPU | caps::IO | caps::EVENT), 0);
    // The host-originated event resource is never granted to a guest.
    assert_eq!(sends(&out), vec![Frame::ack(1, caps::CPU | caps::IO)]);
    c
}

#[test]
fn each_resource_is_granted_boosted_and_replied_to_on_its_own() {
    let mut c = registered();
    assert_eq!(c.grantable(), caps::CPU | caps::IO);
    let out = frame(&mut c, Frame::new(Kind::Io, 2, 1), 0);
    assert_eq!(applied(&out), vec![(IO, Level::Boosted)]);
    assert_eq!(sends(&out), vec![Frame::ack(2, 1)]);
    let out = frame(&mut c, Frame::cpu(3, true), 0);
    assert_eq!(applied(&out), vec![(CPU, Level::Boosted)]);
    let out = frame(&mut c, Frame::new(Kind::Io, 4, 0), 5 * MS);
    assert_eq!(applied(&out), vec![(IO, Level::Normal)], "the CPU stays boosted");
    let vm = c.vm(VM).unwrap();
    assert_eq!((vm.level(CPU), vm.level(IO)), (Level::Boosted, Level::Normal));
    assert_eq!(vm.slots[&IO].counters.boosted_ns, 5 * MS);
    assert_eq!(vm.slots[&CPU].counters.boosts, 1);
}

#[test]
fn budgets_are_per_resource_and_the_denial_names_it() {
    let mut c = registered();
    frame(&mut c, Frame::cpu(2, true), 0);
    frame(&mut c, Frame::new(Kind::Io, 3, 1), 0);
    assert_eq!(c.next_deadline(), Some(100 * MS), "only I/O has a continuous budget");
    let mut out = Vec::new();
    c.tick(100 * MS, &mut out);
    assert_eq!(applied(&out), vec![(IO, Level::Normal)]);
    assert_eq!(sends(&out), vec![Frame::deny_for(0, IO, DenyReason::Budget)]);
    let vm = c.vm(VM).unwrap();
    assert_eq!(vm.level(CPU), Level::Boosted, "the CPU's budget is its own");
    assert_eq!(vm.slots[&IO].counters.budget_exhausted, 1);
    assert_eq!(vm.slots[&CPU].counters.budget_exhausted, 0);
    // In the I/O cooldown, an I/O boost is refused and a CPU one is not affected.
    let out = frame(&mut c, Frame::new(Kind::Io, 4, 1), 150 * MS);
    assert_eq!(sends(&out), vec![Frame::deny_for(4, IO, DenyReason::Budget)]);
    assert_eq!(c.next_deadline(), None);
}

#[test]
fn rate_limits_are_per_resource() {
    let mut c = registered();
    // I/O's burst is 3: the 4th I/O boost request is refused, the CPU's bucket is untouched.
    for seq in 2..5 {
        assert_eq!(sends(&frame(&mut c, Frame::new(Kind::Io, seq, 1), 0)), vec![Frame::ack(seq, 1)]);
    }
    assert_eq!(
        sends(&frame(&mut c, Frame::new(Kind::Io, 5, 1), 0)),
        vec![Frame::deny_for(5, IO, DenyReason::RateLimited)]
    );
    assert_eq!(sends(&frame(&mut c, Frame::cpu(6, true), 0)), vec![Frame::ack(6, 1)]);
    // Lowering a privilege is never refused.
    assert_eq!(applied(&frame(&mut c, Frame::new(Kind::Io, 7, 0), 0)), vec![(IO, Level::Normal)]);
}

#[test]
fn switches_are_per_resource_globally_and_per_vm() {
    let mut c = registered();
    frame(&mut c, Frame::cpu(2, true), 0);
    frame(&mut c, Frame::new(Kind::Io, 3, 1), 0);
    let mut out = Vec::new();
    c.set_enabled(Some(IO), false, 0, &mut out);
    assert_eq!(applied(&out), vec![(IO, Level::Normal)]);
    assert_eq!(sends(&out), vec![Frame::disable(caps::IO)]);
    assert_eq!(
        sends(&frame(&mut c, Frame::new(Kind::Io, 4, 1), 0)),
        vec![Frame::deny_for(4, IO, DenyReason::Disabled)]
    );
    assert_eq!(c.vm(VM).unwrap().level(CPU), Level::Boosted);
    // Per VM: the CPU off for this VM only.
    out.clear();
    c.set_vm_enabled(VM, Some(CPU), false, 0, &mut out);
    assert_eq!(applied(&out), vec![(CPU, Level::Normal)]);
    assert_eq!(sends(&out), vec![Frame::disable(caps::CPU)]);
    // Back on: each is announced on its own.
    out.clear();
    c.set_enabled(Some(IO), true, 0, &mut out);
    assert_eq!(sends(&out), vec![Frame::enable(caps::IO)]);
    out.clear();
    c.set_vm_enabled(VM, None, true, 0, &mut out);
    assert_eq!(sends(&out), vec![Frame::enable(caps::CPU)]);
}

#[test]
fn a_registration_with_one_resource_off_acks_the_other_and_enables_it_later() {
    let mut c = coordinator();
    let mut out = Vec::new();
    c.set_enabled(Some(IO), false, 0, &mut out);
    let out = frame(&mut c, Frame::register(1, caps::CPU | caps::IO), 0);
    assert_eq!(sends(&out), vec![Frame::ack(1, caps::CPU)]);
    let mut out = Vec::new();
    c.set_enabled(Some(IO), true, 0, &mut out);
    assert_eq!(sends(&out), vec![Frame::enable(caps::IO)]);
    assert_eq!(sends(&frame(&mut c, Frame::new(Kind::Io, 2, 1), 0)), vec![Frame::ack(2, 1)]);
}

#[test]
fn a_host_originated_resource_needs_no_agent_and_keeps_the_budgets() {
    let mut p = policy();
    p.resource.insert("event".into(), LimitsOverride { max_continuous_boost_ms: Some(2), ..Default::default() });
    let mut c = Coordinator::new(p, vec![Box::new(Plain(EVENT))]);
    let s = c.default_settings();
    c.vm_found(VM, "no-agent", s, 0);
    let mut out = Vec::new();
    assert_eq!(c.host_request(VM, EVENT, 1, 0, &mut out), Ok(1));
    assert_eq!(applied(&out), vec![(EVENT, Level::Boosted)]);
    assert!(sends(&out).is_empty(), "no agent: nothing to send");
    out.clear();
    c.tick(2 * MS, &mut out);
    assert_eq!(applied(&out), vec![(EVENT, Level::Normal)]);
    assert!(sends(&out).is_empty(), "the budget ends it silently");
    assert_eq!(c.host_request(VM, EVENT, 1, 3 * MS, &mut out), Err(DenyReason::Budget), "cooldown");
    assert_eq!(c.host_request(VM, CPU, 1, 3 * MS, &mut out), Err(DenyReason::Unsupported));
    c.set_vm_enabled(VM, Some(EVENT), false, 0, &mut out);
    assert_eq!(c.host_request(VM, EVENT, 1, 2_000 * MS, &mut out), Err(DenyReason::Disabled));
}

#[test]
fn deadlines_are_kept_in_order_across_vms_and_resources() {
    let p = policy();
    let mut c = Coordinator::new(p, vec![Box::new(Plain(IO))]);
    let mut out = Vec::new();
    for i in 0..100u64 {
        let s = c.default_settings();
        c.vm_found(VmId(i), "vm", s, 0);
        c.frame(VmId(i), Frame::register(1, caps::IO), 0, &mut out);
        // VM i boosts at i ms: its budget runs out at i + 100 ms.
        c.frame(VmId(i), Frame::new(Kind::Io, 2, 1), i * MS, &mut out);
    }
    assert_eq!(c.next_deadline(), Some(100 * MS));
    out.clear();
    c.tick(149 * MS, &mut out);
    assert_eq!(applied(&out).len(), 50, "VMs 0..=49 ran out");
    assert_eq!(c.next_deadline(), Some(150 * MS));
    // A VM that deboosts leaves the set.
    c.frame(VmId(99), Frame::new(Kind::Io, 3, 0), 150 * MS, &mut out);
    out.clear();
    c.tick(1000 * MS, &mut out);
    assert_eq!(applied(&out).len(), 49);
    assert_eq!(c.next_deadline(), None);
}
