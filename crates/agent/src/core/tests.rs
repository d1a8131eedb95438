use super::*;
use cosched_proto::Resource::{Cpu, Io};

fn io(seq: u32, boost: bool) -> Frame {
    Frame::new(Kind::Io, seq, boost as u64)
}

fn registered() -> (AgentCore, u32) {
    let mut a = AgentCore::new(Config::default(), &[Cpu]);
    let mut out = Vec::new();
    a.tick(0, &mut out);
    assert_eq!(out, vec![Out::Send(Frame::register(1, caps::CPU))]);
    out.clear();
    a.on_frame(Frame::ack(1, caps::CPU), 1, &mut out);
    assert!(out.contains(&Out::Attach(Cpu)));
    assert_eq!(a.phase(Cpu), Some(Phase::Active));
    (a, 1)
}

/// Registered with CPU and I/O detectors, the host granting both.
fn registered_both() -> AgentCore {
    let mut a = AgentCore::new(Config::default(), &[Cpu, Io]);
    let mut out = Vec::new();
    a.tick(0, &mut out);
    assert_eq!(sent(&out), vec![Frame::register(1, caps::CPU | caps::IO)]);
    out.clear();
    a.on_frame(Frame::ack(1, caps::CPU | caps::IO), 1, &mut out);
    assert_eq!(attached(&out), vec![Out::Attach(Cpu), Out::Attach(Io)]);
    a
}

fn sent(out: &[Out]) -> Vec<Frame> {
    out.iter().filter_map(|o| if let Out::Send(f) = o { Some(*f) } else { None }).collect()
}

fn attached(out: &[Out]) -> Vec<Out> {
    out.iter().filter(|o| matches!(o, Out::Attach(_) | Out::Detach(_))).cloned().collect()
}

fn exited(out: &[Out]) -> bool {
    out.iter().any(|o| matches!(o, Out::Exit(_)))
}

#[test]
fn sends_only_transitions_of_the_whole_vm() {
    let (mut a, _) = registered();
    let mut out = Vec::new();
    a.on_transition(Cpu, 0, true, 10, &mut out);
    a.on_transition(Cpu, 1, true, 11, &mut out); // another CPU: still boosted, nothing new
    a.on_transition(Cpu, 0, false, 12, &mut out);
    a.on_transition(Cpu, 1, false, 13, &mut out);
    a.on_transition(Cpu, 1, false, 14, &mut out);
    assert_eq!(sent(&out), vec![Frame::cpu(2, true), Frame::cpu(3, false)]);
}

#[test]
fn register_is_retried_until_answered() {
    let mut a = AgentCore::new(Config::default(), &[Cpu]);
    let mut out = Vec::new();
    a.tick(0, &mut out);
    assert_eq!(a.next_tick(0), Some(1_000_000_000));
    a.tick(999_999_999, &mut out);
    a.tick(1_000_000_000, &mut out);
    assert_eq!(sent(&out), vec![Frame::register(1, caps::CPU), Frame::register(2, caps::CPU)]);
    // A late ACK to the first one is not taken as the answer.
    out.clear();
    a.on_frame(Frame::ack(1, caps::CPU), 5, &mut out);
    assert!(!out.contains(&Out::Attach(Cpu)));
    a.on_frame(Frame::ack(2, caps::CPU), 5, &mut out);
    assert!(out.contains(&Out::Attach(Cpu)));
}

#[test]
fn denied_registration_detaches_and_waits_for_enable() {
    let mut a = AgentCore::new(Config::default(), &[Cpu]);
    let mut out = Vec::new();
    a.tick(0, &mut out);
    a.on_frame(Frame::deny(1, DenyReason::Disabled), 1, &mut out);
    assert_eq!(a.registration, Registration::Denied);
    assert!(!out.contains(&Out::Attach(Cpu)));
    a.tick(10_000_000_000, &mut out);
    assert_eq!(sent(&out).len(), 1, "no retries while disabled");
    assert!(!exited(&out));
    out.clear();
    a.on_frame(Frame::enable(caps::CPU), 2, &mut out);
    assert_eq!(sent(&out), vec![Frame::register(2, caps::CPU)]);
    assert!(out.contains(&Out::Log("the host operator enabled coordination; registering".into())));
}

#[test]
fn disable_at_run_time_detaches() {
    let (mut a, _) = registered();
    let mut out = Vec::new();
    a.on_transition(Cpu, 0, true, 10, &mut out);
    out.clear();
    a.on_frame(Frame::disable(caps::CPU), 11, &mut out);
    assert!(out.contains(&Out::Detach(Cpu)));
    assert!(out.contains(&Out::Log("the host operator disabled coordination; detaching".into())));
    assert!(!exited(&out), "disabled, not gone: it may be enabled again");
    a.on_transition(Cpu, 0, false, 12, &mut out);
    assert!(sent(&out).is_empty(), "detached: nothing sent");
    // ENABLE: the registration stands, so the detector is attached again (fresh state)
    // without registering again.
    out.clear();
    a.on_frame(Frame::enable(caps::CPU), 13, &mut out);
    assert_eq!(attached(&out), vec![Out::Attach(Cpu)]);
    assert!(out.iter().any(|o| matches!(o, Out::Log(m) if m.contains("enabled coordination; registering"))));
    assert!(sent(&out).is_empty(), "{out:?}");
    a.reconcile(Cpu, &[true], 14, &mut out);
    assert_eq!(sent(&out), vec![Frame::cpu(3, true)]);
}

#[test]
fn unsupported_exits() {
    let mut a = AgentCore::new(Config::default(), &[Cpu]);
    let mut out = Vec::new();
    a.tick(0, &mut out);
    a.on_frame(Frame::deny(1, DenyReason::Unsupported), 1, &mut out);
    assert!(matches!(out.last(), Some(Out::Exit(_))));
    assert_eq!(sent(&out), vec![Frame::register(1, caps::CPU)], "not registered: no DEREGISTER");
}

#[test]
fn budget_denial_backs_off_then_asks_again() {
    // Both the named denial (this protocol) and one naming no resource (an older host).
    for deny in [Frame::deny_for(0, Cpu, DenyReason::Budget), Frame::deny(0, DenyReason::Budget)] {
        let (mut a, _) = registered();
        let mut out = Vec::new();
        a.on_transition(Cpu, 0, true, 0, &mut out);
        // The host ends the boost (unsolicited DENY(budget)).
        a.on_frame(deny, 1_000, &mut out);
        out.clear();
        a.tick(50_000_000, &mut out);
        assert!(sent(&out).is_empty(), "within the backoff");
        assert_eq!(a.next_tick(50_000_000), Some(100_001_000));
        a.tick(100_001_000, &mut out);
        assert_eq!(sent(&out), vec![Frame::cpu(3, true)]);
        // If the guest no longer wants it by then, nothing is sent.
        let (mut a, _) = registered();
        a.on_transition(Cpu, 0, true, 0, &mut out);
        a.on_frame(deny, 1_000, &mut out);
        out.clear();
        a.on_transition(Cpu, 0, false, 2_000, &mut out);
        a.tick(200_000_000, &mut out);
        assert!(sent(&out).is_empty(), "{out:?}");
    }
}

#[test]
fn a_denial_of_an_older_frame_does_not_change_what_the_host_has() {
    let (mut a, _) = registered();
    let mut out = Vec::new();
    a.on_transition(Cpu, 0, true, 0, &mut out); // CPU 1, seq 2
    a.on_transition(Cpu, 0, false, 1, &mut out); // CPU 0, seq 3
    a.on_transition(Cpu, 0, true, 2, &mut out); // CPU 1, seq 4
    assert_eq!(sent(&out), vec![Frame::cpu(2, true), Frame::cpu(3, false), Frame::cpu(4, true)]);
    out.clear();
    // seq 2 was refused for rate, but seq 3 and 4 went through: the host is boosted.
    a.on_frame(Frame::deny_for(2, Cpu, DenyReason::RateLimited), 3, &mut out);
    a.on_frame(Frame::ack(3, 0), 3, &mut out);
    a.on_frame(Frame::ack(4, 1), 3, &mut out);
    a.on_transition(Cpu, 0, false, 4, &mut out);
    assert_eq!(sent(&out), vec![Frame::cpu(5, false)], "the deboost must go out");
    // A refusal of the latest request does count.
    out.clear();
    a.on_transition(Cpu, 0, true, 5, &mut out); // seq 6
    a.on_frame(Frame::deny_for(6, Cpu, DenyReason::Budget), 6, &mut out);
    a.on_transition(Cpu, 0, false, 7, &mut out);
    assert_eq!(sent(&out), vec![Frame::cpu(6, true)], "host already deboosted: no CPU 0");
}

#[test]
fn not_registered_reregisters() {
    let (mut a, _) = registered();
    let mut out = Vec::new();
    a.on_transition(Cpu, 0, true, 0, &mut out);
    out.clear();
    a.on_frame(Frame::deny(2, DenyReason::NotRegistered), 5, &mut out);
    assert_eq!(out[1], Out::Detach(Cpu));
    assert_eq!(sent(&out), vec![Frame::register(3, caps::CPU)]);
    out.clear();
    a.on_frame(Frame::ack(3, caps::CPU), 6, &mut out);
    assert!(out.contains(&Out::Attach(Cpu)));
    // Fresh detectors report the CPU still wants a boost: it is asked for again.
    a.reconcile(Cpu, &[true], 7, &mut out);
    assert_eq!(sent(&out), vec![Frame::cpu(4, true)]);
}

#[test]
fn fresh_registration_does_not_send_a_useless_deboost() {
    let (mut a, _) = registered();
    let mut out = Vec::new();
    a.reconcile(Cpu, &[false, false], 5, &mut out);
    a.on_transition(Cpu, 1, false, 6, &mut out);
    assert!(sent(&out).is_empty());
}

#[test]
fn exits_at_once_when_no_detector_can_run() {
    let mut a = AgentCore::new(Config::default(), &[]);
    let mut out = Vec::new();
    a.tick(0, &mut out);
    assert!(sent(&out).is_empty(), "nothing to register");
    assert!(exited(&out));
}

#[test]
fn attaches_exactly_what_the_host_grants() {
    let mut a = AgentCore::new(Config::default(), &[Cpu, Io]);
    let mut out = Vec::new();
    a.tick(0, &mut out);
    assert_eq!(sent(&out), vec![Frame::register(1, caps::CPU | caps::IO)], "both detectors can run");
    out.clear();
    a.on_frame(Frame::ack(1, caps::IO), 1, &mut out);
    assert_eq!(attached(&out), vec![Out::Attach(Io)]);
    assert_eq!((a.phase(Cpu), a.phase(Io)), (Some(Phase::NotGranted), Some(Phase::Active)));
    assert!(!exited(&out));
    // The I/O detector reports; the CPU one is not attached, so nothing of it goes out.
    out.clear();
    a.on_transition(Io, 0, true, 2, &mut out);
    a.on_transition(Cpu, 0, true, 3, &mut out);
    assert_eq!(sent(&out), vec![io(2, true)]);
    // A host granting none of ours: deregister and exit.
    let mut a = AgentCore::new(Config::default(), &[Cpu, Io]);
    out.clear();
    a.tick(0, &mut out);
    a.on_frame(Frame::ack(1, caps::MEMBW), 1, &mut out);
    assert_eq!(sent(&out)[1..], [Frame::deregister(2)]);
    assert!(exited(&out));
    assert!(attached(&out).is_empty());
}

#[test]
fn resources_keep_their_own_state() {
    let mut a = registered_both();
    let mut out = Vec::new();
    a.on_transition(Cpu, 0, true, 10, &mut out);
    a.on_transition(Io, 0, true, 11, &mut out);
    a.on_transition(Io, 1, true, 12, &mut out); // another device: still wanted
    a.on_transition(Cpu, 0, false, 13, &mut out);
    assert_eq!(sent(&out), vec![Frame::cpu(2, true), io(3, true), Frame::cpu(4, false)]);
}

#[test]
fn a_denial_naming_one_resource_leaves_the_other_alone() {
    let mut a = registered_both();
    let mut out = Vec::new();
    a.on_transition(Cpu, 0, true, 0, &mut out); // CPU 1, seq 2
    a.on_transition(Io, 0, true, 0, &mut out); // IO 1, seq 3
    out.clear();
    // The host ends the I/O boost for budget.
    a.on_frame(Frame::deny_for(0, Io, DenyReason::Budget), 1_000, &mut out);
    assert_eq!(a.next_tick(1_000), Some(100_001_000), "I/O waits out its backoff");
    // CPU still has its boost: its deboost goes out; it can boost again at once.
    a.on_transition(Cpu, 0, false, 2_000, &mut out);
    a.on_transition(Cpu, 0, true, 3_000, &mut out);
    a.tick(4_000, &mut out);
    assert_eq!(sent(&out), vec![Frame::cpu(4, false), Frame::cpu(5, true)]);
    // I/O asks again once its backoff is over.
    out.clear();
    a.tick(100_001_000, &mut out);
    assert_eq!(sent(&out), vec![io(6, true)]);
    // A denial naming no resource but answering one request concerns that request's resource.
    out.clear();
    a.on_transition(Io, 0, false, 100_002_000, &mut out); // IO 0, seq 7
    a.on_transition(Io, 0, true, 100_003_000, &mut out); // IO 1, seq 8
    a.on_frame(Frame::deny(8, DenyReason::RateLimited), 100_004_000, &mut out);
    a.on_transition(Cpu, 0, false, 100_005_000, &mut out); // CPU still boosted: CPU 0, seq 9
    a.on_transition(Io, 0, false, 100_006_000, &mut out); // the host has no I/O boost: nothing
    assert_eq!(sent(&out), vec![io(7, false), io(8, true), Frame::cpu(9, false)]);
    // The operator disabling one resource through a DENY detaches only that one.
    out.clear();
    a.on_frame(Frame::deny_for(0, Io, DenyReason::Disabled), 100_007_000, &mut out);
    assert_eq!(attached(&out), vec![Out::Detach(Io)]);
    assert_eq!((a.phase(Cpu), a.phase(Io)), (Some(Phase::Active), Some(Phase::Disabled)));
    // And the host dropping support of one: the other keeps working.
    out.clear();
    a.on_frame(Frame::deny_for(0, Cpu, DenyReason::Unsupported), 100_008_000, &mut out);
    assert_eq!(attached(&out), vec![Out::Detach(Cpu)]);
    assert!(!exited(&out), "I/O may still be enabled again");
}

#[test]
fn not_registered_and_a_denied_registration_concern_every_resource() {
    let mut a = registered_both();
    let mut out = Vec::new();
    a.on_frame(Frame::deny(0, DenyReason::NotRegistered), 5, &mut out);
    assert_eq!(attached(&out), vec![Out::Detach(Cpu), Out::Detach(Io)]);
    assert_eq!(sent(&out), vec![Frame::register(2, caps::CPU | caps::IO)]);
    out.clear();
    a.on_frame(Frame::deny(2, DenyReason::Disabled), 6, &mut out);
    assert_eq!(a.registration, Registration::Denied);
    assert!(attached(&out).is_empty());
    out.clear();
    a.on_frame(Frame::enable(caps::IO), 7, &mut out);
    assert_eq!(sent(&out), vec![Frame::register(3, caps::CPU | caps::IO)], "registers every resource");
    a.on_frame(Frame::ack(3, caps::CPU | caps::IO), 8, &mut out);
    assert_eq!(attached(&out), vec![Out::Attach(Cpu), Out::Attach(Io)]);
}

#[test]
fn disable_and_enable_of_one_resource() {
    let mut a = registered_both();
    let mut out = Vec::new();
    a.on_transition(Io, 0, true, 10, &mut out); // IO 1, seq 2
    out.clear();
    a.on_frame(Frame::disable(caps::IO), 11, &mut out);
    assert_eq!(attached(&out), vec![Out::Detach(Io)]);
    assert!(sent(&out).is_empty(), "the host deboosts a disabled resource itself");
    // CPU keeps working; I/O reports nothing while detached.
    a.on_transition(Cpu, 0, true, 12, &mut out);
    a.on_transition(Io, 0, false, 13, &mut out);
    assert_eq!(sent(&out), vec![Frame::cpu(3, true)]);
    // ENABLE of I/O: attached again with fresh state, no new registration.
    out.clear();
    a.on_frame(Frame::enable(caps::IO), 14, &mut out);
    assert_eq!(attached(&out), vec![Out::Attach(Io)]);
    assert!(sent(&out).is_empty());
    a.reconcile(Io, &[false], 15, &mut out);
    assert!(sent(&out).is_empty(), "fresh state: the host starts deboosted");
    a.reconcile(Io, &[true], 16, &mut out);
    assert_eq!(sent(&out), vec![io(4, true)]);
    // ENABLE of something already attached changes nothing.
    out.clear();
    a.on_frame(Frame::enable(caps::CPU | caps::IO), 17, &mut out);
    assert!(out.is_empty(), "{out:?}");
    // Disabling everything: the agent waits, it does not exit.
    a.on_frame(Frame::disable(caps::ALL), 18, &mut out);
    assert_eq!(attached(&out), vec![Out::Detach(Cpu), Out::Detach(Io)]);
    assert!(!exited(&out));
    assert_eq!(a.next_tick(19), None);
}

#[test]
fn an_attach_failure_leaves_the_others_working() {
    let mut a = registered_both();
    let mut out = Vec::new();
    a.on_attach_failed(Io, "no BFQ here", &mut out);
    assert_eq!(a.phase(Io), Some(Phase::Failed));
    assert!(attached(&out).is_empty(), "nothing to detach: it never attached");
    assert!(!exited(&out));
    assert!(matches!(&out[0], Out::Log(m) if m.contains("io: unsupported") && m.contains("no BFQ here")));
    a.on_transition(Cpu, 0, true, 10, &mut out);
    a.on_transition(Io, 0, true, 11, &mut out);
    assert_eq!(sent(&out), vec![Frame::cpu(2, true)]);
    // A later registration leaves the failed detector out.
    out.clear();
    a.on_frame(Frame::deny(0, DenyReason::NotRegistered), 12, &mut out);
    assert_eq!(sent(&out), vec![Frame::register(3, caps::CPU)]);
    out.clear();
    a.on_frame(Frame::ack(3, caps::CPU | caps::IO), 13, &mut out);
    assert_eq!(attached(&out), vec![Out::Attach(Cpu)]);
    // The last one failing too: nothing is left, so deregister and exit.
    out.clear();
    a.on_attach_failed(Cpu, "verifier", &mut out);
    assert_eq!(sent(&out), vec![Frame::deregister(4)]);
    assert!(matches!(out.last(), Some(Out::Exit(m)) if m.contains("no detector can run here")));
}

#[test]
fn exits_only_when_nothing_is_left() {
    // The host grants CPU only (it does not support I/O, or has it turned off), then stops
    // supporting CPU: either may come back with ENABLE, so the agent waits.
    let mut a = AgentCore::new(Config::default(), &[Cpu, Io]);
    let mut out = Vec::new();
    a.tick(0, &mut out);
    a.on_frame(Frame::ack(1, caps::CPU), 1, &mut out);
    assert_eq!(a.phase(Io), Some(Phase::NotGranted));
    a.on_frame(Frame::deny_for(0, Cpu, DenyReason::Unsupported), 2, &mut out);
    assert_eq!(attached(&out), vec![Out::Attach(Cpu), Out::Detach(Cpu)]);
    assert!(!exited(&out));
    // The operator turns I/O on: the host says ENABLE, and the registration stands.
    out.clear();
    a.on_frame(Frame::enable(caps::IO), 3, &mut out);
    assert_eq!(attached(&out), vec![Out::Attach(Io)]);
    assert!(sent(&out).is_empty(), "no new registration");
    // One disabled, the other failing: the disabled one may come back, so it waits.
    let mut a = registered_both();
    out.clear();
    a.on_frame(Frame::disable(caps::CPU), 2, &mut out);
    a.on_attach_failed(Io, "gone", &mut out);
    assert!(!exited(&out));
    a.on_frame(Frame::enable(caps::CPU), 3, &mut out);
    assert!(out.contains(&Out::Attach(Cpu)));
    // No detector left that can run: deregister and exit.
    out.clear();
    a.on_attach_failed(Cpu, "gone too", &mut out);
    assert_eq!(sent(&out), vec![Frame::deregister(2)]);
    assert!(exited(&out));
}

#[test]
fn other_refusals_of_a_boost_back_off_like_a_budget() {
    // A reason this agent does not know by name (e.g. the host's own reserve): the host does
    // not have the boost; ask again after the budget backoff.
    let (mut a, _) = registered();
    let mut out = Vec::new();
    a.on_transition(Cpu, 0, true, 0, &mut out); // seq 2
    use DenyReason::*;
    let Some(other) = DenyReason::ALL
        .into_iter()
        .find(|r| !matches!(r, Disabled | Unsupported | Budget | Malformed | RateLimited | NotRegistered))
    else {
        return; // this protocol version has no other reason
    };
    a.on_frame(Frame::deny_for(2, Cpu, other), 1_000, &mut out);
    assert_eq!(a.next_tick(1_000), Some(100_001_000));
    // A malformed-frame reply says nothing about the boost.
    a.on_frame(Frame::deny(9, DenyReason::Malformed), 2_000, &mut out);
    assert_eq!(a.next_tick(2_000), Some(100_001_000));
}

#[test]
fn stop_detaches_and_deregisters() {
    let mut a = registered_both();
    let mut out = Vec::new();
    a.on_frame(Frame::disable(caps::IO), 2, &mut out);
    out.clear();
    a.stop(&mut out);
    assert_eq!(attached(&out), vec![Out::Detach(Cpu)]);
    assert_eq!(sent(&out), vec![Frame::deregister(2)]);
    // Not registered: nothing to deregister.
    let mut a = AgentCore::new(Config::default(), &[Cpu]);
    out.clear();
    a.tick(0, &mut out);
    out.clear();
    a.stop(&mut out);
    assert!(out.is_empty());
}

#[test]
fn disconnection_starts_over_with_every_resource() {
    let mut a = registered_both();
    let mut out = Vec::new();
    a.on_frame(Frame::disable(caps::IO), 2, &mut out);
    out.clear();
    a.on_disconnected(&mut out);
    assert_eq!(attached(&out), vec![Out::Detach(Cpu)]);
    a.tick(3, &mut out);
    assert_eq!(sent(&out), vec![Frame::register(2, caps::CPU | caps::IO)]);
}

fn need(priority: u8, irq: bool) -> Need {
    Need { priority, irq }
}

#[test]
fn cpu_1_names_the_highest_priority_and_a_change_while_boosted_sends_a_new_one() {
    let (mut a, _) = registered();
    let mut out = Vec::new();
    a.on_need(Cpu, 0, Some(need(80, true)), 10, &mut out);
    a.on_need(Cpu, 1, Some(need(50, false)), 11, &mut out); // lower, on another CPU: nothing
    a.on_need(Cpu, 1, Some(need(90, false)), 12, &mut out); // higher: sent
    a.on_need(Cpu, 0, Some(need(80, false)), 13, &mut out); // only the interrupt flag: nothing
    a.on_need(Cpu, 1, None, 14, &mut out); // the 90 is done: back to 80
    a.on_need(Cpu, 1, Some(need(0, false)), 15, &mut out); // a watched task: 0 adds nothing
    a.on_need(Cpu, 0, None, 16, &mut out); // only the watched task: priority 0
    a.on_need(Cpu, 1, None, 17, &mut out);
    assert_eq!(
        sent(&out),
        vec![
            Frame::cpu_rt(2, need(80, true)),
            Frame::cpu_rt(3, need(90, true)),
            Frame::cpu_rt(4, need(80, false)),
            Frame::cpu_rt(5, need(0, false)),
            Frame::cpu(6, false),
        ]
    );
    assert_eq!(Frame::cpu_rt(5, need(0, false)), Frame::cpu(5, true), "no need named: plain CPU 1");
    assert_eq!((a.counters.boosts_sent, a.counters.priority_changes, a.counters.deboosts_sent), (1, 3, 1));
    // Reconciliation with the detector's own state names the need too, and is quiet when
    // nothing changed.
    out.clear();
    a.reconcile_needs(Cpu, &[Some(need(70, false)), None], 18, &mut out);
    a.reconcile_needs(Cpu, &[Some(need(70, false)), None], 19, &mut out);
    assert_eq!(sent(&out), vec![Frame::cpu_rt(7, need(70, false))]);
    // I/O requests carry no need.
    let mut a = registered_both();
    out.clear();
    a.on_need(Io, 0, Some(need(0, false)), 1, &mut out);
    assert_eq!(sent(&out), vec![io(2, true)]);
}

/// Registered (the REGISTER's round trip, 500 µs, is no sample), CPU boosted at 1 ms (seq 2,
/// answered after 200 µs) and deboosted at 1.5 ms (seq 3, answered after 100 µs: the lower
/// median of the two is 100 µs).
fn deboosted_with_a_round_trip() -> AgentCore {
    let mut a = AgentCore::new(Config::default(), &[Cpu]);
    let mut out = Vec::new();
    a.tick(0, &mut out);
    a.on_frame(Frame::ack(1, caps::CPU), 500_000, &mut out);
    assert_eq!(a.rtt_ns(), 0);
    a.on_need(Cpu, 0, Some(need(80, true)), 1_000_000, &mut out);
    a.on_frame(Frame::ack(2, 1), 1_200_000, &mut out);
    assert_eq!(a.rtt_ns(), 200_000);
    assert!(!a.prediction_due());
    a.on_need(Cpu, 0, None, 1_500_000, &mut out);
    assert!(a.prediction_due(), "a CPU 0 went out");
    a.on_frame(Frame::ack(3, 0), 1_600_000, &mut out);
    assert_eq!(a.rtt_ns(), 100_000);
    assert_eq!(sent(&out)[1..], [Frame::cpu_rt(2, need(80, true)), Frame::cpu(3, false)]);
    a
}

fn predicted(in_ns: u64, priority: u8) -> Option<Prediction> {
    Some(Prediction { in_ns, at_ns: 0, priority })
}

#[test]
fn replies_read_late_do_not_move_the_transit_estimate() {
    let mut a = deboosted_with_a_round_trip(); // 200 and 100 µs: 100 µs
    let mut out = Vec::new();
    // A reply read 120 ms late (the guest was not running), then one after 150 µs: the
    // median of 100, 150, 200 µs and 120 ms is 150 µs (the lower of the middle two).
    a.on_need(Cpu, 0, Some(need(80, true)), 2_000_000, &mut out); // seq 4
    a.on_frame(Frame::ack(4, 1), 122_000_000, &mut out);
    a.on_need(Cpu, 0, None, 123_000_000, &mut out); // seq 5
    a.on_frame(Frame::ack(5, 0), 123_150_000, &mut out);
    assert_eq!(a.rtt_ns(), 150_000);
    // So the next WAKE is early by 75 µs, not by half a mean that the 120 ms dominates.
    out.clear();
    a.predict(predicted(8_000_000, 80), 124_000_000, &mut out);
    assert_eq!(sent(&out), vec![Frame::wake(6, 7_925, 80)]);
    // A lasting rise (every reply now 2 ms) wins once it fills half the window.
    let mut now = 130_000_000;
    for i in 0..(RTT_SAMPLES as u32 / 4 + 1) {
        let seq = 7 + 2 * i;
        a.on_need(Cpu, 0, Some(need(80, true)), now, &mut out);
        a.on_frame(Frame::ack(seq, 1), now + 2_000_000, &mut out);
        a.on_need(Cpu, 0, None, now + 3_000_000, &mut out);
        a.on_frame(Frame::ack(seq + 1, 0), now + 5_000_000, &mut out);
        now += 10_000_000;
    }
    assert_eq!(a.rtt_ns(), 2_000_000);
}

#[test]
fn a_slow_first_reply_does_not_set_the_transit_estimate() {
    // The host's first boost of a VM is its slowest (and the agent has just started): 10 ms.
    let mut a = AgentCore::new(Config::default(), &[Cpu]);
    let mut out = Vec::new();
    a.tick(0, &mut out);
    a.on_frame(Frame::ack(1, caps::CPU), 500_000, &mut out);
    a.on_need(Cpu, 0, Some(need(80, true)), 1_000_000, &mut out);
    a.on_frame(Frame::ack(2, 1), 11_000_000, &mut out);
    assert_eq!(a.rtt_ns(), 10_000_000);
    a.on_need(Cpu, 0, None, 12_000_000, &mut out);
    a.on_frame(Frame::ack(3, 0), 12_200_000, &mut out);
    assert_eq!(a.rtt_ns(), 200_000, "the lower of two");
    out.clear();
    a.predict(predicted(8_000_000, 80), 12_300_000, &mut out);
    assert_eq!(sent(&out), vec![Frame::wake(4, 7_900, 80)]);
}

#[test]
fn a_wake_goes_out_at_the_deboost_less_the_transit() {
    let mut a = deboosted_with_a_round_trip();
    let mut out = Vec::new();
    // Next wake-up in 8 ms: the host reads the frame half a round trip (50 µs) later.
    a.predict(predicted(8_000_000, 80), 2_000_000, &mut out);
    assert_eq!(sent(&out), vec![Frame::wake(4, 7_950, 80)]);
    assert!(!a.prediction_due());
    // The same wake-up read again (a withdrawal elsewhere, say): nothing new.
    out.clear();
    a.predict(predicted(7_990_000, 80), 2_010_000, &mut out);
    assert!(sent(&out).is_empty(), "{out:?}");
    // The host acknowledges it: counted, and it says nothing about the CPU boost.
    a.on_frame(Frame::ack(4, 7_950), 2_300_000, &mut out);
    assert_eq!(
        (a.counters.wakes_sent, a.counters.wakes_acked, a.counters.acks),
        (1, 1, 2),
        "the CPU frames' ACKs only"
    );
    // Its round trip (300 µs) is a sample too: the median of 100, 200 and 300 µs.
    assert_eq!(a.rtt_ns(), 200_000);
    // The wake-up comes: CPU 1; the prediction is used up, and the next deboost brings the next.
    a.on_need(Cpu, 0, Some(need(80, true)), 10_000_000, &mut out);
    a.on_need(Cpu, 0, None, 10_500_000, &mut out);
    assert!(a.prediction_due());
    a.predict(predicted(9_500_000, 80), 10_500_000, &mut out);
    let transit = a.rtt_ns() / 2;
    assert_eq!(
        sent(&out),
        vec![Frame::cpu_rt(5, need(80, true)), Frame::cpu_deboost_wake(6, ((9_500_000 - transit) / 1000) as u32, 80)],
        "the prediction rides on its CPU 0"
    );
    // A wake-up beyond the horizon (1 s), or closer than the transit, is not predicted.
    let mut a = deboosted_with_a_round_trip();
    out.clear();
    a.predict(predicted(1_000_000_001, 80), 2_000_000, &mut out);
    a.predict(predicted(40_000, 80), 2_000_000, &mut out);
    assert!(sent(&out).is_empty(), "{out:?}");
    // While boosted nothing is predicted.
    let mut a = deboosted_with_a_round_trip();
    a.on_need(Cpu, 0, Some(need(80, false)), 2_100_000, &mut out);
    out.clear();
    a.predict(predicted(5_000_000, 80), 2_200_000, &mut out);
    assert!(sent(&out).is_empty(), "{out:?}");
    // With --predict false, never.
    let mut a = AgentCore::new(Config { predict: false, ..Config::default() }, &[Cpu]);
    a.tick(0, &mut out);
    a.on_frame(Frame::ack(1, caps::CPU), 1, &mut out);
    a.on_transition(Cpu, 0, true, 2, &mut out);
    a.on_transition(Cpu, 0, false, 3, &mut out);
    assert!(!a.prediction_due());
    out.clear();
    a.predict(predicted(5_000_000, 80), 4, &mut out);
    assert!(sent(&out).is_empty());
}

#[test]
fn a_wake_denied_as_unsupported_stops_predictions_and_leaves_the_cpu_alone() {
    let mut a = deboosted_with_a_round_trip();
    let mut out = Vec::new();
    a.predict(predicted(8_000_000, 80), 2_000_000, &mut out); // WAKE seq 4
    a.on_need(Cpu, 0, Some(need(80, true)), 2_050_000, &mut out); // CPU 1 seq 5, before the reply
    out.clear();
    a.on_frame(Frame::deny_for(4, Cpu, DenyReason::Unsupported), 2_100_000, &mut out);
    assert!(attached(&out).is_empty(), "the CPU detector stays: {out:?}");
    assert_eq!(a.phase(Cpu), Some(Phase::Active));
    assert!(out.iter().any(|o| matches!(o, Out::Log(m) if m.contains("does not support WAKE"))), "{out:?}");
    assert!(!a.predicting());
    assert_eq!((a.counters.wakes_denied, a.counters.other_denials), (1, 0));
    // The host still has the boost of seq 5: the deboost goes out, and no prediction after it.
    a.on_need(Cpu, 0, None, 3_000_000, &mut out);
    assert!(!a.prediction_due());
    a.predict(predicted(7_000_000, 80), 3_000_000, &mut out);
    assert_eq!(sent(&out), vec![Frame::cpu(6, false)]);
    // Other refusals of a WAKE drop that prediction only: no backoff of the CPU.
    let mut a = deboosted_with_a_round_trip();
    a.predict(predicted(8_000_000, 80), 2_000_000, &mut out); // WAKE seq 4
    out.clear();
    a.on_frame(Frame::deny_for(4, Cpu, DenyReason::RateLimited), 2_100_000, &mut out);
    a.on_need(Cpu, 0, Some(need(80, true)), 2_200_000, &mut out);
    assert_eq!(sent(&out), vec![Frame::cpu_rt(5, need(80, true))], "no backoff");
    assert!(a.predicting());
    // A DENY(cpu: unsupported) of a CPU frame still means the host dropped the CPU.
    out.clear();
    a.on_frame(Frame::deny_for(5, Cpu, DenyReason::Unsupported), 2_300_000, &mut out);
    assert_eq!(attached(&out), vec![Out::Detach(Cpu)]);
    // A new registration tries predictions again.
    let mut a = deboosted_with_a_round_trip();
    a.predict(predicted(8_000_000, 80), 2_000_000, &mut out);
    a.on_frame(Frame::deny_for(4, Cpu, DenyReason::Unsupported), 2_100_000, &mut out);
    assert!(!a.predicting());
    a.on_frame(Frame::deny(0, DenyReason::NotRegistered), 2_200_000, &mut out);
    assert!(a.predicting());
}

/// Boosted (CPU 1 seq 2 acknowledged after 200 µs), then deboosted at 1.5 ms with the next
/// wake-up read right after: one frame, seq 3.
fn deboosted_with_a_batched_prediction(cfg: Config) -> (AgentCore, Vec<Out>) {
    let mut a = AgentCore::new(cfg, &[Cpu]);
    let mut out = Vec::new();
    a.tick(0, &mut out);
    a.on_frame(Frame::ack(1, caps::CPU), 500_000, &mut out);
    a.on_need(Cpu, 0, Some(need(80, true)), 1_000_000, &mut out);
    a.on_frame(Frame::ack(2, 1), 1_200_000, &mut out);
    out.clear();
    a.on_need(Cpu, 0, None, 1_500_000, &mut out);
    assert!(a.prediction_due());
    a.predict(predicted(8_600_000, 80), 1_500_000, &mut out);
    (a, out)
}

#[test]
fn a_prediction_rides_on_its_deboost() {
    let (mut a, out) = deboosted_with_a_batched_prediction(Config::default());
    // Less half the round trip (100 µs), as a WAKE would say.
    assert_eq!(sent(&out), vec![Frame::cpu_deboost_wake(3, 8_500, 80)]);
    let c = &a.counters;
    assert_eq!((c.deboosts_sent, c.wakes_sent, c.wakes_batched), (1, 1, 1));
    // Its ACK answers both.
    let mut out = Vec::new();
    a.on_frame(Frame::ack(3, 8_000), 1_700_000, &mut out);
    assert_eq!((a.counters.acks, a.counters.wakes_acked), (2, 1));
    assert_eq!(a.rtt_ns(), 200_000, "a round trip like any other");
    // The same wake-up read again: nothing new (it stands).
    a.predict(predicted(8_500_000, 80), 1_600_000, &mut out);
    assert!(sent(&out).is_empty(), "{out:?}");
    // A refusal concerns the prediction only (the host deboosted): no backoff of the CPU.
    let (mut a, _) = deboosted_with_a_batched_prediction(Config::default());
    let mut out = Vec::new();
    a.on_frame(Frame::deny_for(3, Cpu, DenyReason::Budget), 1_700_000, &mut out);
    assert_eq!((a.counters.wakes_denied, a.counters.budget_denials), (1, 0));
    a.on_need(Cpu, 0, Some(need(80, true)), 1_800_000, &mut out);
    assert_eq!(sent(&out), vec![Frame::cpu_rt(4, need(80, true))], "no backoff");
    assert_eq!(a.phase(Cpu), Some(Phase::Active));
    // A host that refuses predictions: no more, and the CPU stays attached.
    let (mut a, _) = deboosted_with_a_batched_prediction(Config::default());
    let mut out = Vec::new();
    a.on_frame(Frame::deny_for(3, Cpu, DenyReason::Unsupported), 1_700_000, &mut out);
    assert!(!a.predicting());
    assert!(attached(&out).is_empty(), "{out:?}");
    // A WAKE 0 withdraws it as before (not batched: no CPU 0 goes with it).
    let (mut a, _) = deboosted_with_a_batched_prediction(Config::default());
    let mut out = Vec::new();
    a.predict(None, 2_000_000, &mut out);
    assert_eq!(sent(&out), vec![Frame::wake(4, 0, 0)]);
    // Off in the configuration: CPU 0 and WAKE apart.
    let (_, out) = deboosted_with_a_batched_prediction(Config { predict_batch: false, ..Config::default() });
    assert_eq!(sent(&out), vec![Frame::cpu(3, false), Frame::wake(4, 8_500, 80)]);
}

#[test]
fn a_host_that_refuses_the_batched_deboost_gets_cpu_0_and_wake_apart() {
    let (mut a, _) = deboosted_with_a_batched_prediction(Config::default());
    let mut out = Vec::new();
    // An older host: the value is malformed to it, and it did not deboost.
    a.on_frame(Frame::deny(3, DenyReason::Malformed), 1_700_000, &mut out);
    assert!(out.iter().any(|o| matches!(o, Out::Log(m) if m.contains("apart"))), "{out:?}");
    assert!(a.prediction_due(), "the prediction follows the new CPU 0");
    a.predict(predicted(7_000_000, 80), 1_700_000, &mut out);
    assert_eq!(sent(&out), vec![Frame::cpu(4, false), Frame::wake(5, 6_900, 80)]);
    assert!(attached(&out).is_empty() && a.predicting(), "{out:?}");
    // From then on, apart.
    out.clear();
    a.on_need(Cpu, 0, Some(need(80, true)), 9_000_000, &mut out); // seq 6
    a.on_need(Cpu, 0, None, 9_500_000, &mut out); // seq 7
    a.predict(predicted(9_000_000, 80), 9_500_000, &mut out); // seq 8
    let f = sent(&out);
    assert_eq!((f[1], f[2].kind), (Frame::cpu(7, false), Kind::Wake));
    // If the guest wanted the boost again meanwhile, the host still has it: nothing to resend.
    let (mut a, _) = deboosted_with_a_batched_prediction(Config::default());
    let mut out = Vec::new();
    a.on_need(Cpu, 0, Some(need(80, true)), 1_600_000, &mut out); // CPU 1 seq 4
    out.clear();
    a.on_frame(Frame::deny(3, DenyReason::Malformed), 1_700_000, &mut out);
    assert!(sent(&out).is_empty(), "{out:?}");
    // A new registration tries the one frame again.
    a.on_frame(Frame::deny(0, DenyReason::NotRegistered), 2_000_000, &mut out);
    let reg = sent(&out).into_iter().find(|f| f.kind == Kind::Register).expect("registers again");
    a.on_frame(Frame::ack(reg.seq, caps::CPU), 2_100_000, &mut out);
    a.on_need(Cpu, 0, Some(need(80, true)), 3_000_000, &mut out);
    out.clear();
    a.on_need(Cpu, 0, None, 3_500_000, &mut out);
    a.predict(predicted(8_000_000, 80), 3_500_000, &mut out);
    assert!(matches!(sent(&out)[..], [f] if cosched_proto::cpu::wake_of(f.value).is_some()), "{out:?}");
}

#[test]
fn the_channel_probe_sends_wake_0_while_the_host_has_the_boost() {
    let (mut a, _) = registered();
    let mut out = Vec::new();
    a.probe(10, &mut out); // deboosted: nothing
    a.on_need(Cpu, 0, Some(need(80, false)), 20, &mut out); // CPU 1 seq 2
    a.probe(30, &mut out); // seq 3
    a.on_frame(Frame::ack(3, 0), 40, &mut out);
    assert_eq!(sent(&out), vec![Frame::cpu_rt(2, need(80, false)), Frame::wake(3, 0, 0)]);
    assert_eq!((a.counters.probes_sent, a.counters.wakes_acked, a.counters.wake_withdrawals), (1, 1, 0));
    assert!(a.predicting());
    // Not registered: nothing.
    let mut a = AgentCore::new(Config::default(), &[Cpu]);
    let mut out = Vec::new();
    a.probe(10, &mut out);
    assert!(out.is_empty());
}

#[test]
fn a_withdrawn_prediction_sends_wake_0() {
    let mut a = deboosted_with_a_round_trip();
    let mut out = Vec::new();
    // WAKE seq 4, due at 10 ms; then the task is woken early (a signal): no wake-up is
    // predicted any more.
    a.predict(predicted(8_000_000, 80), 2_000_000, &mut out);
    a.predict(None, 3_000_000, &mut out);
    a.predict(None, 3_100_000, &mut out); // nothing stands: nothing more
    assert_eq!(sent(&out), vec![Frame::wake(4, 7_950, 80), Frame::wake(5, 0, 0)]);
    assert_eq!((a.counters.wakes_sent, a.counters.wake_withdrawals), (1, 1));
    // A later wake-up of another task replaces the standing one (one WAKE, no WAKE 0).
    let mut a = deboosted_with_a_round_trip();
    out.clear();
    a.predict(predicted(8_000_000, 80), 2_000_000, &mut out); // seq 4
    a.predict(predicted(20_000_000, 60), 3_000_000, &mut out); // seq 5
    assert_eq!(sent(&out), vec![Frame::wake(4, 7_950, 80), Frame::wake(5, 19_950, 60)]);
    // A prediction already due needs no withdrawal; one moved beyond the horizon does.
    let mut a = deboosted_with_a_round_trip();
    out.clear();
    a.predict(predicted(1_000_000, 80), 2_000_000, &mut out); // seq 4, due at 3 ms
    a.predict(None, 3_500_000, &mut out);
    a.predict(predicted(8_000_000, 80), 3_600_000, &mut out); // seq 5
    a.predict(predicted(2_000_000_000, 80), 3_700_000, &mut out); // seq 6: WAKE 0
    assert_eq!(sent(&out), vec![Frame::wake(4, 950, 80), Frame::wake(5, 7_950, 80), Frame::wake(6, 0, 0)]);
}

#[test]
fn membw_requests_are_relayed_and_asked_again_after_a_new_registration() {
    let cfg = Config { membw: true, ..Config::default() };
    let mut a = AgentCore::new(cfg, &[Resource::Cpu]);
    let mut out = Vec::new();
    a.membw_request(300, 7, 0, &mut out);
    assert!(matches!(&out[..], [Out::MembwReply { client: 7, result: Err(e) }] if e.contains("not registered")));
    out.clear();
    a.tick(0, &mut out);
    assert_eq!(sent(&out), vec![Frame::register(1, caps::CPU | caps::MEMBW)], "MEMBW is offered");
    out.clear();
    a.on_frame(Frame::ack(1, caps::CPU | caps::MEMBW), 1, &mut out);
    out.clear();
    a.membw_request(500, 8, 2, &mut out);
    assert_eq!(sent(&out), vec![Frame::new(Kind::Membw, 2, 500)]);
    out.clear();
    a.on_frame(Frame::ack(2, 300), 3, &mut out);
    let grant = MembwGrant { asked: 500, granted: 300 };
    assert!(out.contains(&Out::MembwReply { client: 8, result: Ok(grant) }), "{out:?}");
    assert_eq!(a.membw_granted, 300);
    out.clear();
    // A host without a backend: the reason reaches the client; the CPU is left alone.
    a.membw_request(100, 9, 4, &mut out);
    out.clear();
    a.on_frame(Frame::deny_for(3, Resource::Membw, DenyReason::Unsupported), 5, &mut out);
    assert!(
        out.iter().any(|o| matches!(o, Out::MembwReply { client: 9, result: Err(e) } if e.starts_with("unsupported"))),
        "{out:?}"
    );
    assert!(out.iter().all(|o| !matches!(o, Out::Detach(_))), "{out:?}");
    // The host restarts: after the new registration the last share is asked for again.
    out.clear();
    a.on_frame(Frame::deny(0, DenyReason::NotRegistered), 6, &mut out);
    let reg = sent(&out).into_iter().find(|f| f.kind == Kind::Register).expect("registers again");
    out.clear();
    a.on_frame(Frame::ack(reg.seq, caps::CPU | caps::MEMBW), 7, &mut out);
    assert!(sent(&out).iter().any(|f| f.kind == Kind::Membw && f.value == 100), "{out:?}");
}

const PERIOD: u64 = 10_000_000;
/// The guest's CLOCK_MONOTONIC (the detector's clock) at the agent's start: the core's clock is
/// the agent's own, from its start.
const MONO: u64 = 7_777_777_000;

/// Registered, then `n` activations of a periodic RT task (period 10 ms, at k * 10 ms): each a
/// `CPU 1` at the activation and a `CPU 0` 1 ms later with the next wake-up read after it, each
/// answered 100 µs after it went out. Returns the frames of the last activation.
fn periodic(a: &mut AgentCore, from: u64, n: u64) -> Vec<Out> {
    let mut out = Vec::new();
    for k in from..from + n {
        out.clear();
        let t = k * PERIOD;
        a.on_need(Cpu, 0, Some(need(80, true)), t, &mut out);
        let boost = sent(&out)[0];
        a.on_frame(Frame::ack(boost.seq, 1), t + 100_000, &mut out);
        a.on_need(Cpu, 0, None, t + 1_000_000, &mut out);
        a.predict(
            Some(Prediction { in_ns: PERIOD - 1_000_000, at_ns: MONO + t + PERIOD, priority: 80 }),
            t + 1_000_000,
            &mut out,
        );
        for f in sent(&out)[1..].to_vec() {
            let value = if f.kind == Kind::Wake && wake::period_of(f.value) != 0 {
                wake::standing_ack(8_000, 2_000) // the host boosts 2 ms before, holds 2 ms after
            } else {
                0
            };
            a.on_frame(Frame::ack(f.seq, value), t + 1_100_000, &mut out);
        }
    }
    out
}

fn windows(out: &[Out]) -> Vec<Option<StandingWindow>> {
    out.iter().filter_map(|o| if let Out::Standing(w) = o { Some(*w) } else { None }).collect()
}

use cosched_proto::wake;

#[test]
fn a_periodic_task_gets_a_standing_prediction_and_its_window() {
    let (mut a, _) = registered();
    // Predictions ride on their deboosts until four intervals in a row kept one period: the
    // fifth goes standing.
    let out = periodic(&mut a, 1, 4);
    assert_eq!(sent(&out)[1].kind, Kind::Cpu, "batched: {out:?}");
    assert!(windows(&out).is_empty());
    let out = periodic(&mut a, 5, 1);
    let f = sent(&out);
    // CPU 0 alone, then the standing WAKE: due in 9 ms less half the round trip (50 µs), every 10 ms.
    assert_eq!(f[1], Frame::cpu(f[1].seq, false));
    assert_eq!(f[2], Frame::wake_standing(f[2].seq, 8_950, 80, 10_000));
    // Its ACK: the host boosts 8 ms after it (a 950 µs lead), and holds 2 ms after each wake-up;
    // the detector's window is inside that by 200 µs at each end.
    let w = StandingWindow { anchor_ns: MONO + 6 * PERIOD, period_ns: PERIOD, before_ns: 750_000, after_ns: 1_800_000 };
    assert_eq!(windows(&out), [Some(w)]);
    assert_eq!(a.standing(), Some(w));
    assert!(
        w.covers(MONO + 6 * PERIOD) && w.covers(MONO + 7 * PERIOD - 750_000) && w.covers(MONO + 9 * PERIOD + 1_800_000)
    );
    assert!(
        !w.covers(MONO + 7 * PERIOD - 751_000)
            && !w.covers(MONO + 9 * PERIOD + 1_801_000)
            && !w.covers(MONO + 6 * PERIOD - 800_000)
    );
    assert_eq!((a.counters.standing_sent, a.counters.standing_acked), (1, 1));
    // The guest's own boosts go out as always (another task); the next wake-up read after its
    // deboost is in the pattern: nothing more is sent.
    let mut out = Vec::new();
    a.on_need(Cpu, 0, Some(need(0, false)), 63 * PERIOD / 10, &mut out);
    a.on_need(Cpu, 0, None, 64 * PERIOD / 10, &mut out);
    a.predict(
        Some(Prediction { in_ns: 6 * PERIOD / 10, at_ns: MONO + 7 * PERIOD, priority: 80 }),
        64 * PERIOD / 10,
        &mut out,
    );
    assert_eq!(sent(&out).iter().map(|f| f.kind).collect::<Vec<_>>(), [Kind::Cpu, Kind::Cpu]);
    assert_eq!(sent(&out)[1].value, 0, "plain CPU 0: {out:?}");
    assert!(windows(&out).is_empty(), "the window stays");
    // A wake-up out of the pattern (another RT task's came first): the pattern stands.
    out.clear();
    a.predict(
        Some(Prediction { in_ns: 3_000_000, at_ns: MONO + 67 * PERIOD / 10, priority: 99 }),
        64 * PERIOD / 10,
        &mut out,
    );
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(a.standing(), Some(w));
    // The task changes its period to 7.5 ms: once its predictions show it (four intervals), the
    // window goes and the new pattern is told standing, replacing the old one on the host.
    let mut all = Vec::new();
    let mut at = MONO + 70 * PERIOD + 3_000_000;
    for i in 0..6 {
        let mut out = Vec::new();
        let now = 69 * PERIOD + i * 7_500_000;
        a.on_need(Cpu, 0, Some(need(0, false)), now, &mut out);
        a.on_need(Cpu, 0, None, now + 100_000, &mut out);
        a.predict(Some(Prediction { in_ns: 5_000_000, at_ns: at, priority: 80 }), now + 100_000, &mut out);
        at += 7_500_000;
        all.extend(out);
    }
    assert_eq!(windows(&all), [None]);
    let told: Vec<u32> = sent(&all).iter().filter(|f| f.kind == Kind::Wake).map(|f| wake::period_of(f.value)).collect();
    assert_eq!(told, [7_500], "{all:?}");
    assert_eq!(a.counters.standing_ended, 1);
}

#[test]
fn a_standing_prediction_ends_when_the_host_stops_it_or_its_windows_stay_empty() {
    // The host stops it (a budget): the window goes, and none is told for a while.
    let (mut a, _) = registered();
    let out = periodic(&mut a, 1, 5);
    assert_eq!(windows(&out).len(), 1);
    let mut out = Vec::new();
    a.on_frame(Frame::deny_for(0, Cpu, DenyReason::Budget), 6 * PERIOD, &mut out);
    assert_eq!(windows(&out), [None]);
    // (After the CPU's budget backoff, 100 ms.)
    let out = periodic(&mut a, 17, 6);
    assert!(sent(&out).iter().all(|f| f.kind != Kind::Wake || wake::period_of(f.value) == 0), "{out:?}");
    // Its windows stay empty (the task stopped): withdrawn with WAKE 0 after 300 ms.
    let (mut a, _) = registered();
    periodic(&mut a, 1, 5);
    let mut out = Vec::new();
    let t = 6 * PERIOD;
    a.standing_check(7, t, &mut out);
    a.standing_check(9, t + 100_000_000, &mut out); // two silent activations: it lives
    a.standing_check(9, t + 350_000_000, &mut out);
    assert!(out.is_empty(), "{out:?}");
    a.standing_check(9, t + 401_000_000, &mut out);
    assert_eq!(windows(&out), [None]);
    assert_eq!(sent(&out), [Frame::wake(sent(&out)[0].seq, 0, 0)]);
    assert_eq!(a.standing(), None);
}

#[test]
fn a_host_that_refuses_standing_predictions_gets_them_one_at_a_time() {
    let (mut a, _) = registered();
    periodic(&mut a, 1, 4);
    let mut out = Vec::new();
    let t = 5 * PERIOD;
    a.on_need(Cpu, 0, Some(need(80, true)), t, &mut out);
    a.on_frame(Frame::ack(sent(&out)[0].seq, 1), t + 100_000, &mut out);
    out.clear();
    a.on_need(Cpu, 0, None, t + 1_000_000, &mut out);
    a.predict(Some(Prediction { in_ns: 9_000_000, at_ns: MONO + t + PERIOD, priority: 80 }), t + 1_000_000, &mut out);
    let standing = sent(&out)[1];
    assert_eq!(wake::period_of(standing.value), 10_000);
    // An older host: malformed.
    a.on_frame(Frame::deny(standing.seq, DenyReason::Malformed), t + 1_100_000, &mut out);
    assert!(windows(&out).is_empty());
    // From then on, plain predictions on the deboosts.
    let out = periodic(&mut a, 6, 5);
    assert_eq!(sent(&out)[1].kind, Kind::Cpu);
    assert!(cosched_proto::cpu::wake_of(sent(&out)[1].value).is_some(), "{out:?}");
    assert_eq!(a.counters.standing_sent, 1);
    // Off in the configuration: never.
    let mut a = AgentCore::new(Config { predict_standing: false, ..Config::default() }, &[Cpu]);
    let mut out = Vec::new();
    a.tick(0, &mut out);
    a.on_frame(Frame::ack(1, caps::CPU), 1, &mut out);
    periodic(&mut a, 1, 10);
    assert_eq!(a.counters.standing_sent, 0);
}

#[test]
fn a_standing_prediction_is_told_again_every_second_between_two_boosts() {
    let (mut a, _) = registered();
    let out = periodic(&mut a, 1, 5);
    let first = sent(&out)[2];
    let w = a.standing().expect("taken");
    let mut out = Vec::new();
    // Within the second: nothing. (Each check sees more silent activations.)
    for (i, k) in [6, 30, 55, 80, 100].into_iter().enumerate() {
        a.standing_check(i as u64, k * PERIOD + 5_000_000, &mut out);
    }
    assert!(out.is_empty(), "{out:?}");
    // A second after it was told, but 1 ms after a due wake-up: the host's boost may still be
    // on (its hold, 2 ms). Then 9.9 ms after one: the next one's lead (950 µs) is too near.
    for (i, k) in [120, 140, 160].into_iter().enumerate() {
        a.standing_check(6 + i as u64, k * PERIOD + 1_000_000, &mut out);
    }
    a.standing_check(9, 160 * PERIOD + 9_900_000, &mut out);
    assert!(out.is_empty(), "{out:?}");
    // 5 ms after one: told again, due at the next (5 ms less half the round trip, 50 µs).
    let t = 161 * PERIOD + 5_000_000;
    a.standing_check(10, t, &mut out);
    let again = sent(&out);
    assert_eq!(again, [Frame::wake_standing(again[0].seq, 4_950, 80, 10_000)]);
    assert_ne!(again[0].seq, first.seq);
    out.clear();
    a.on_frame(Frame::ack(again[0].seq, wake::standing_ack(4_000, 2_000)), t + 100_000, &mut out);
    let w2 = StandingWindow { anchor_ns: MONO + 162 * PERIOD, ..w };
    assert_eq!(windows(&out), [Some(w2)]);
    assert_eq!((a.counters.standing_reanchored, a.counters.standing_ended), (1, 0));
    // Refused when told again: the window goes.
    let mut out = Vec::new();
    for (i, k) in [185, 210, 235, 260].into_iter().enumerate() {
        a.standing_check(11 + i as u64, k * PERIOD + 1_000_000, &mut out);
    }
    assert!(out.is_empty(), "within the second, or too near a boost: {out:?}");
    let t = 262 * PERIOD + 5_000_000;
    a.standing_check(20, t, &mut out);
    let again = sent(&out);
    assert_eq!(again.len(), 1, "{out:?}");
    out.clear();
    a.on_frame(Frame::deny_for(again[0].seq, Cpu, DenyReason::Budget), t + 100_000, &mut out);
    assert_eq!(windows(&out), [None]);
    assert_eq!(a.standing(), None);
}
