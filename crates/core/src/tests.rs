//! Coordinator tests with a fake clock: time is a plain number of ns.

use super::*;
use cosched_proto::{caps, DenyReason, Frame, Kind, Resource};

const CPU: Resource = Resource::Cpu;

const MS: u64 = NS_PER_MS;
const VM: VmId = VmId(1);

struct Sim {
    c: Coordinator,
    now: u64,
    seq: u32,
    /// Everything the coordinator asked for, in order.
    log: Vec<Action>,
}

impl Sim {
    fn new(policy: Policy) -> Sim {
        let mut c = Coordinator::with_cpu(policy, 64);
        let s = c.default_settings();
        c.vm_found(VM, "vm1", s, 0);
        Sim { c, now: 0, seq: 0, log: Vec::new() }
    }

    /// Sends a frame from the guest and returns what it caused.
    fn send(&mut self, kind: Kind, value: u64) -> Vec<Action> {
        self.seq += 1;
        let mut out = Vec::new();
        self.c.frame(VM, Frame::new(kind, self.seq, value), self.now, &mut out);
        self.log.extend(out.clone());
        out
    }

    /// The single reply to the last frame.
    fn reply(&mut self, kind: Kind, value: u64) -> Frame {
        let seq = self.seq + 1;
        let out = self.send(kind, value);
        let replies: Vec<Frame> = out
            .iter()
            .filter_map(|a| match a {
                Action::Send { frame, .. } if frame.seq == seq => Some(*frame),
                _ => None,
            })
            .collect();
        assert_eq!(replies.len(), 1, "exactly one reply to seq {seq}: {out:?}");
        replies[0]
    }

    fn register(&mut self) {
        assert_eq!(self.reply(Kind::Register, caps::CPU), Frame::ack(self.seq, caps::CPU));
    }

    /// Advances the clock to `to`, running every tick the coordinator asks for on the way.
    fn advance(&mut self, to: u64) -> Vec<Action> {
        let mut out = Vec::new();
        while let Some(d) = self.c.next_deadline() {
            if d > to {
                break;
            }
            self.now = d.max(self.now);
            self.c.tick(self.now, &mut out);
        }
        self.now = to;
        self.c.tick(self.now, &mut out);
        self.log.extend(out.clone());
        out
    }

    fn level(&self) -> Level {
        self.c.vm(VM).unwrap().level(CPU)
    }

    fn counters(&self) -> &Counters {
        &self.c.vm(VM).unwrap().slots[&CPU].counters
    }
}

fn set_cpu(level: Level, priority: u8) -> Action {
    Action::Apply { vm: VM, resource: CPU, level, grant: Grant::Plain { priority } }
}

fn sends(actions: &[Action]) -> Vec<Frame> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send { frame, .. } => Some(*frame),
            _ => None,
        })
        .collect()
}

fn no_budget_no_guard() -> Policy {
    Policy {
        max_continuous_boost_ms: 0,
        max_boost_share_permille: 1000,
        rt_guard_max_share_permille: 0,
        ..Policy::default()
    }
}

#[test]
fn register_boost_deboost() {
    let mut s = Sim::new(no_budget_no_guard());
    s.register();
    let out = s.send(Kind::Cpu, 1);
    assert_eq!(out, vec![set_cpu(Level::Boosted, 1), Action::Send { vm: VM, frame: Frame::ack(2, 1) }]);
    // A second CPU 1 while boosted changes nothing but is acknowledged.
    assert_eq!(s.send(Kind::Cpu, 1), vec![Action::Send { vm: VM, frame: Frame::ack(3, 1) }]);
    s.now = 7 * MS;
    let out = s.send(Kind::Cpu, 0);
    assert_eq!(out, vec![set_cpu(Level::Normal, 1), Action::Send { vm: VM, frame: Frame::ack(4, 0) }]);
    let vm = s.c.vm(VM).unwrap();
    let k = &vm.slots[&CPU].counters;
    assert_eq!((k.boosts, k.deboosts, k.boosted_ns), (1, 1, 7 * MS));
    // Deboosting when not boosted: acknowledged, nothing to undo.
    assert_eq!(s.send(Kind::Cpu, 0), vec![Action::Send { vm: VM, frame: Frame::ack(5, 0) }]);
}

#[test]
fn unregistered_and_unsupported_are_denied() {
    let mut s = Sim::new(no_budget_no_guard());
    assert_eq!(s.reply(Kind::Cpu, 1), Frame::deny_for(1, CPU, DenyReason::NotRegistered));
    assert_eq!(s.reply(Kind::Register, caps::IO), Frame::deny(2, DenyReason::Unsupported));
    assert_eq!(s.c.vm(VM).unwrap().registered, None);
    // Offering more than the host supports grants the intersection.
    assert_eq!(s.reply(Kind::Register, caps::CPU | caps::IO | 0x40), Frame::ack(3, caps::CPU));
    assert_eq!(s.reply(Kind::Io, 1), Frame::deny_for(4, Resource::Io, DenyReason::Unsupported));
    assert_eq!(s.reply(Kind::Membw, 100), Frame::deny_for(5, Resource::Membw, DenyReason::Unsupported));
    assert_eq!(s.level(), Level::Normal);
    let vm = s.c.vm(VM).unwrap();
    assert_eq!(vm.counters.denied.get("unsupported"), Some(&3), "no I/O or membw slot on this host");
    assert_eq!(s.counters().denied.get("not_registered"), Some(&1));
}

#[test]
fn deregister_deboosts_and_forgets_registration() {
    let mut s = Sim::new(no_budget_no_guard());
    s.register();
    s.send(Kind::Cpu, 1);
    let out = s.send(Kind::Deregister, 0);
    assert_eq!(out[0], set_cpu(Level::Normal, 1));
    assert_eq!(s.reply(Kind::Cpu, 1), Frame::deny_for(4, CPU, DenyReason::NotRegistered));
}

#[test]
fn reregistering_agent_is_deboosted() {
    let mut s = Sim::new(no_budget_no_guard());
    s.register();
    s.send(Kind::Cpu, 1);
    let out = s.send(Kind::Register, caps::CPU);
    assert_eq!(out, vec![set_cpu(Level::Normal, 1), Action::Send { vm: VM, frame: Frame::ack(3, caps::CPU) }]);
}

#[test]
fn disabled_vm_registration_is_denied_and_enable_is_announced() {
    let mut s = Sim::new(no_budget_no_guard());
    let mut out = Vec::new();
    assert!(s.c.set_vm_enabled(VM, None, false, 0, &mut out));
    assert!(out.is_empty(), "an unregistered VM is not told anything: {out:?}");
    assert_eq!(s.reply(Kind::Register, caps::CPU), Frame::deny(1, DenyReason::Disabled));
    assert_eq!(s.reply(Kind::Cpu, 1), Frame::deny_for(2, CPU, DenyReason::NotRegistered));
    s.c.set_vm_enabled(VM, None, true, 0, &mut out);
    assert_eq!(out, vec![Action::Send { vm: VM, frame: Frame::enable(caps::CPU) }]);
    s.register();
}

#[test]
fn disabling_at_run_time_deboosts_and_tells_disable() {
    for global in [false, true] {
        let mut s = Sim::new(no_budget_no_guard());
        s.register();
        s.send(Kind::Cpu, 1);
        let mut out = Vec::new();
        if global {
            s.c.set_enabled(Some(CPU), false, 0, &mut out);
        } else {
            s.c.set_vm_enabled(VM, None, false, 0, &mut out);
        }
        assert_eq!(
            out,
            vec![set_cpu(Level::Normal, 1), Action::Send { vm: VM, frame: Frame::disable(caps::CPU) }],
            "global={global}"
        );
        assert_eq!(s.reply(Kind::Cpu, 1), Frame::deny_for(3, CPU, DenyReason::Disabled));
        assert_eq!(s.level(), Level::Normal);
        assert!(s.c.vm(VM).unwrap().registered.is_some(), "DISABLE keeps the registration");
        // Disabling twice says DISABLE once.
        out.clear();
        if global {
            s.c.set_enabled(Some(CPU), false, 0, &mut out);
        } else {
            s.c.set_vm_enabled(VM, None, false, 0, &mut out);
        }
        assert!(out.is_empty());
        if global {
            s.c.set_enabled(Some(CPU), true, 0, &mut out);
        } else {
            s.c.set_vm_enabled(VM, None, true, 0, &mut out);
        }
        assert_eq!(out, vec![Action::Send { vm: VM, frame: Frame::enable(caps::CPU) }]);
        assert_eq!(s.reply(Kind::Cpu, 1), Frame::ack(4, 1));
    }
}

#[test]
fn global_and_vm_switches_combine() {
    let mut s = Sim::new(no_budget_no_guard());
    s.register();
    let mut out = Vec::new();
    s.c.set_vm_enabled(VM, None, false, 0, &mut out);
    s.c.set_enabled(Some(CPU), false, 0, &mut out);
    out.clear();
    s.c.set_enabled(Some(CPU), true, 0, &mut out);
    assert!(out.is_empty(), "still disabled per VM: no ENABLE yet");
    s.c.set_vm_enabled(VM, None, true, 0, &mut out);
    assert_eq!(sends(&out), vec![Frame::enable(caps::CPU)]);
}

#[test]
fn continuous_boost_budget_deboosts_denies_and_cools_down() {
    let mut s = Sim::new(Policy { max_continuous_boost_ms: 200, budget_cooldown_ms: 100, ..no_budget_no_guard() });
    s.register();
    s.send(Kind::Cpu, 1);
    assert_eq!(s.c.next_deadline(), Some(200 * MS));
    assert!(s.advance(199 * MS).is_empty());
    let out = s.advance(200 * MS);
    assert_eq!(
        out,
        vec![set_cpu(Level::Normal, 1), Action::Send { vm: VM, frame: Frame::deny_for(0, CPU, DenyReason::Budget) }]
    );
    assert_eq!(s.counters().budget_exhausted, 1);
    s.now = 299 * MS;
    assert_eq!(s.reply(Kind::Cpu, 1), Frame::deny_for(3, CPU, DenyReason::Budget));
    assert_eq!(s.level(), Level::Normal);
    s.now = 300 * MS;
    assert_eq!(s.reply(Kind::Cpu, 1), Frame::ack(4, 1));
    assert_eq!(s.level(), Level::Boosted);
}

/// A reload's `[policy]`: new budgets hold a boost in force (its deadline moves, one already
/// past ends it at the next tick); keys built into the slots are refused, with nothing changed.
#[test]
fn a_new_policy_holds_the_boost_in_force_to_its_budgets_and_refuses_what_needs_a_restart() {
    let mut s = Sim::new(no_budget_no_guard());
    s.register();
    s.send(Kind::Cpu, 1);
    assert_eq!((s.level(), s.c.next_deadline()), (Level::Boosted, None));
    s.now = 500 * MS;
    let before = s.c.policy().clone();
    let window = Policy { budget_window_ms: 5_000, frame_rate: 10, ..before.clone() };
    let e = s.c.set_policy(window, s.now).unwrap_err();
    assert_eq!(e.to_string(), "needs a restart: [policy] budget_window_ms, [policy] frame_rate");
    let mut per_resource = before.clone();
    per_resource.resource.insert("cpu".into(), LimitsOverride { frame_burst: Some(3), ..Default::default() });
    assert_eq!(
        s.c.set_policy(per_resource, s.now).unwrap_err().to_string(),
        "needs a restart: [policy.resource.cpu] frame_burst"
    );
    assert!(s.c.set_policy(Policy { max_boost_share_permille: 0, ..before.clone() }, s.now).is_err());
    assert_eq!((s.c.policy(), s.c.next_deadline()), (&before, None), "refused: nothing changed");
    // 300 ms at a time from now on: the boost under way (500 ms old) is over it.
    let tighter = Policy { max_continuous_boost_ms: 300, budget_cooldown_ms: 50, default_priority: 4, ..before };
    s.c.set_policy(tighter, s.now).unwrap();
    assert_eq!(s.c.next_deadline(), Some(300 * MS));
    assert_eq!(s.c.limits(CPU).unwrap().max_continuous_ns, 300 * MS);
    assert_eq!(s.c.default_settings().priority, 4);
    let out = s.advance(s.now);
    assert_eq!(
        out,
        vec![set_cpu(Level::Normal, 1), Action::Send { vm: VM, frame: Frame::deny_for(0, CPU, DenyReason::Budget) }]
    );
    s.now = 549 * MS;
    assert_eq!(s.reply(Kind::Cpu, 1), Frame::deny_for(3, CPU, DenyReason::Budget), "the new cooldown");
    s.now = 550 * MS;
    assert_eq!(s.reply(Kind::Cpu, 1), Frame::ack(4, 1));
}

/// Every `[policy]` key (and every per-resource one) is either one a running coordinator takes
/// ([`policy::HOT_KEYS`], what a reload applies) or one [`Policy::needs_restart`] names.
#[test]
fn each_policy_key_is_hot_or_needs_a_restart() {
    let base = Policy::default();
    let toml::Value::Table(table) = toml::Value::try_from(&base).unwrap() else { panic!("a table") };
    let keys: Vec<&String> = table.keys().filter(|k| *k != "resource").collect();
    assert_eq!(keys.len(), 14, "{keys:?}");
    for key in keys {
        let mut t = table.clone();
        let v = t.get_mut(key).unwrap();
        *v = toml::Value::Integer(v.as_integer().unwrap() + 1);
        let changed: Policy = toml::Value::Table(t).try_into().unwrap();
        let restart = base.needs_restart(&changed);
        assert_eq!(restart.is_empty(), policy::HOT_KEYS.contains(&key.as_str()), "{key}: {restart:?}");
    }
    let one = |f: fn(&mut LimitsOverride)| {
        let mut p = base.clone();
        f(p.resource.entry("io".into()).or_default());
        base.needs_restart(&p)
    };
    assert!(one(|o| o.max_continuous_boost_ms = Some(1)).is_empty());
    assert!(one(|o| o.max_boost_share_permille = Some(1)).is_empty());
    assert!(one(|o| o.budget_cooldown_ms = Some(1)).is_empty());
    assert_eq!(one(|o| o.budget_window_ms = Some(1)), ["[policy.resource.io] budget_window_ms"]);
    assert_eq!(one(|o| o.frame_rate = Some(1)), ["[policy.resource.io] frame_rate"]);
    assert_eq!(one(|o| o.frame_burst = Some(1)), ["[policy.resource.io] frame_burst"]);
    assert_eq!(policy::HOT_RESOURCE_KEYS.len(), 3);
}

#[test]
fn share_budget_counts_boosted_time_in_the_window() {
    // 30% of 1 s: 300 ms boosted per second at most.
    let mut s = Sim::new(Policy {
        max_boost_share_permille: 300,
        budget_window_ms: 1000,
        budget_cooldown_ms: 0,
        ..no_budget_no_guard()
    });
    s.register();
    // Boost 100 ms out of every 200 ms: the third boost runs out 100 ms in.
    let mut denied_at = None;
    for i in 0..3 {
        s.now = i * 200 * MS;
        s.send(Kind::Cpu, 1);
        let out = s.advance(i * 200 * MS + 100 * MS);
        if sends(&out).contains(&Frame::deny_for(0, CPU, DenyReason::Budget)) {
            denied_at = Some(s.now);
            break;
        }
        s.send(Kind::Cpu, 0);
    }
    assert_eq!(denied_at, Some(500 * MS), "300 ms used by t=500 ms");
    s.now = 600 * MS;
    let seq = s.seq + 1;
    assert_eq!(s.reply(Kind::Cpu, 1), Frame::deny_for(seq, CPU, DenyReason::Budget), "window still full");
    // At t=1100 ms the first boost (0-100 ms) has left the window.
    s.now = 1100 * MS;
    assert_eq!(s.reply(Kind::Cpu, 1), Frame::ack(seq + 1, 1));
}

#[test]
fn rt_guard_keeps_real_time_share_below_the_kernel_throttle() {
    let mut s = Sim::new(Policy {
        rt_guard_max_share_permille: 900,
        rt_guard_window_ms: 1000,
        rt_guard_hysteresis_ms: 50,
        ..no_budget_no_guard()
    });
    s.register();
    s.send(Kind::Cpu, 1);
    // The guest stays boosted for 5 s; sample the level every ms.
    let mut rt_ms = vec![false; 5000];
    let mut switches = 0;
    for (t, rt) in rt_ms.iter_mut().enumerate() {
        let out = s.advance(t as u64 * MS);
        switches += out.len();
        assert!(s.level().is_changed(), "the guard never deboosts: {out:?}");
        *rt = s.level() == Level::Boosted;
    }
    // Every 1 s window holds at most 900 ms at the real-time class (the kernel's is 950 ms)...
    for start in 0..=(5000 - 1000) {
        let used = rt_ms[start..start + 1000].iter().filter(|b| **b).count();
        assert!(used <= 901, "window at {start} ms has {used} ms real time");
    }
    // ...but not much less, and without flapping.
    let total = rt_ms.iter().filter(|b| **b).count();
    assert!(total >= 4300, "real-time share too low: {total} ms of 5000");
    assert!(switches <= 5 * 2 * 10, "{switches} level changes in 5 s");
    assert!(s.counters().events["guard_demotions"] >= 4);
    // Guarded means: vCPUs at the guard class, reported as a SetCpu.
    assert!(s.log.contains(&set_cpu(Level::Guarded, 1)));
}

#[test]
fn rt_guard_remembers_across_boosts() {
    let mut s = Sim::new(Policy { rt_guard_hysteresis_ms: 50, ..no_budget_no_guard() }.with_guard());
    s.register();
    s.send(Kind::Cpu, 1);
    s.advance(950 * MS);
    assert_eq!(s.level(), Level::Guarded);
    s.send(Kind::Cpu, 0);
    s.now = 960 * MS;
    // A new boost right away starts guarded: the window still holds 900 ms of real time.
    let out = s.send(Kind::Cpu, 1);
    assert_eq!(out[0], set_cpu(Level::Guarded, 1));
}

impl Policy {
    fn with_guard(self) -> Policy {
        Policy { rt_guard_max_share_permille: 900, rt_guard_window_ms: 1000, ..self }
    }
}

fn capacity(c: &Coordinator) -> u64 {
    c.figures(CPU).into_iter().find(|f| f.0 == "boost_capacity_vcpus").unwrap().1
}

#[test]
fn host_reserve_limits_boosted_vcpus_across_vms() {
    // 4 host CPUs, 1 kept for the host: 3 vCPUs may be boosted at once.
    let mut c = Coordinator::with_cpu(no_budget_no_guard(), 4);
    assert_eq!(capacity(&c), 3);
    let (a, b) = (VmId(1), VmId(2));
    let mut out = Vec::new();
    for (id, vcpus) in [(a, 2), (b, 2)] {
        c.vm_found(id, "x", c.default_settings(), 0);
        c.set_vm_vcpus(id, vcpus);
        c.frame(id, Frame::register(1, caps::CPU), 0, &mut out);
    }
    out.clear();
    c.frame(a, Frame::cpu(2, true), 0, &mut out);
    assert_eq!(c.vm(a).unwrap().level(CPU), Level::Boosted);
    c.frame(b, Frame::cpu(2, true), 0, &mut out);
    assert_eq!(sends(&out).last(), Some(&Frame::deny_for(2, CPU, DenyReason::HostReserve)), "2 + 2 > 3");
    assert_eq!(c.vm(b).unwrap().slots[&CPU].counters.denied["host_reserve"], 1);
    assert_eq!(c.figures(CPU), vec![("boost_capacity_vcpus", 3), ("boosted_vcpus", 2)]);
    // A, at capacity with B's vCPUs refused, names a new guest priority while boosted: its own
    // vCPUs are already counted, so it is not refused, and nothing is counted twice.
    let need = cosched_proto::cpu::Need { priority: 80, irq: false };
    c.frame(a, Frame::cpu_rt(4, need), 0, &mut out);
    assert_eq!(sends(&out).last().unwrap().kind, cosched_proto::Kind::Ack, "{out:?}");
    assert_eq!(c.figures(CPU), vec![("boost_capacity_vcpus", 3), ("boosted_vcpus", 2)]);
    // Once A deboosts, B fits.
    c.frame(a, Frame::cpu(3, false), 0, &mut out);
    c.frame(b, Frame::cpu(3, true), 0, &mut out);
    assert_eq!(sends(&out).last(), Some(&Frame::ack(3, 1)));
    // An explicit cap replaces the reserve.
    let mut capped = Coordinator::with_cpu(Policy { max_boosted_vcpus: 10, ..no_budget_no_guard() }, 4);
    assert_eq!(capacity(&capped), 10);
    capped.vm_found(a, "x", capped.default_settings(), 0);
    capped.set_vm_vcpus(a, 8);
    capped.frame(a, Frame::register(1, caps::CPU), 0, &mut out);
    capped.frame(a, Frame::cpu(2, true), 0, &mut out);
    assert_eq!(capped.vm(a).unwrap().level(CPU), Level::Boosted);
    // A VM as large as the host can never be boosted: the reserve holds.
    let mut c = Coordinator::with_cpu(no_budget_no_guard(), 2);
    c.vm_found(a, "big", c.default_settings(), 0);
    c.set_vm_vcpus(a, 2);
    c.frame(a, Frame::register(1, caps::CPU), 0, &mut out);
    c.frame(a, Frame::cpu(2, true), 0, &mut out);
    assert_eq!(sends(&out).last(), Some(&Frame::deny_for(2, CPU, DenyReason::HostReserve)));
}

#[test]
fn rate_limit_refuses_boosts_but_always_honours_deboosts() {
    let mut s = Sim::new(Policy { frame_rate: 10, frame_burst: 4, ..no_budget_no_guard() });
    s.register(); // the registration has its own bucket: the CPU's 4 tokens are untouched
    assert_eq!(s.reply(Kind::Cpu, 1), Frame::ack(2, 1));
    assert_eq!(s.reply(Kind::Cpu, 0), Frame::ack(3, 0));
    assert_eq!(s.reply(Kind::Cpu, 1), Frame::ack(4, 1));
    assert_eq!(s.reply(Kind::Cpu, 1), Frame::ack(5, 1));
    assert_eq!(s.reply(Kind::Cpu, 1), Frame::deny_for(6, CPU, DenyReason::RateLimited));
    // Out of tokens, a deboost still works.
    let out = s.send(Kind::Cpu, 0);
    assert_eq!(out[0], set_cpu(Level::Normal, 1));
    assert_eq!(s.reply(Kind::Cpu, 1), Frame::deny_for(8, CPU, DenyReason::RateLimited));
    s.now = 100 * MS;
    assert_eq!(s.reply(Kind::Cpu, 1), Frame::ack(9, 1), "one token back after 100 ms");
    assert_eq!(s.counters().denied.get("rate_limited"), Some(&2));
}

#[test]
fn the_read_rate_is_twice_what_a_guest_within_every_limit_sends() {
    // 4 resources × (a request and its end) at 2000/s, registrations at 2000/s, 20 malformed/s.
    assert_eq!(Policy::default().read_rate(), 2 * (2 * 4 * 2000 + 2000 + 20));
    // It follows the per-resource overrides, and an explicit read_rate wins.
    let mut p = Policy::default();
    p.resource.insert("io".into(), LimitsOverride { frame_rate: Some(10_000), ..Default::default() });
    assert_eq!(p.read_rate(), 2 * (2 * (3 * 2000 + 10_000) + 2000 + 20));
    assert_eq!(Policy { read_rate: 500, ..p }.read_rate(), 500);
}

#[test]
fn malformed_frames_are_counted_refused_and_a_flood_deregisters() {
    let mut s = Sim::new(Policy { malformed_rate: 3, ..no_budget_no_guard() });
    s.register();
    s.send(Kind::Cpu, 1);
    let mut out = Vec::new();
    s.c.malformed(VM, Some(42), 0, 0, &mut out);
    s.c.malformed(VM, None, 61, 0, &mut out);
    assert_eq!(sends(&out), vec![Frame::deny(42, DenyReason::Malformed), Frame::deny(0, DenyReason::Malformed)]);
    assert_eq!(s.level(), Level::Boosted, "a few bad frames are tolerated");
    out.clear();
    s.c.malformed(VM, None, 5, 0, &mut out);
    s.c.malformed(VM, None, 5, 0, &mut out);
    assert!(out.contains(&set_cpu(Level::Normal, 1)), "flood deregisters and deboosts: {out:?}");
    let vm = s.c.vm(VM).unwrap();
    assert_eq!((vm.counters.malformed, vm.counters.garbage_bytes), (4, 71));
    assert_eq!(vm.counters.malformed_deregistrations, 1);
    assert_eq!(s.reply(Kind::Cpu, 1), Frame::deny_for(3, CPU, DenyReason::NotRegistered));
    // A guest sending host-to-guest frames is malformed too.
    assert_eq!(s.reply(Kind::Ack, 0), Frame::deny(4, DenyReason::Malformed));
}

#[test]
fn vm_gone_while_boosted_is_deboosted_and_forgotten() {
    let mut s = Sim::new(no_budget_no_guard());
    s.register();
    s.send(Kind::Cpu, 1);
    let mut out = Vec::new();
    s.c.vm_gone(VM, 5 * MS, &mut out);
    assert_eq!(out, vec![set_cpu(Level::Normal, 1)]);
    assert!(s.c.vm(VM).is_none());
    assert_eq!(s.c.next_deadline(), None);
    // Frames for a VM that is gone are ignored.
    s.c.frame(VM, Frame::cpu(9, true), 6 * MS, &mut out);
    assert_eq!(out.len(), 1);
}

#[test]
fn priority_change_reapplies_while_boosted() {
    let mut s = Sim::new(no_budget_no_guard());
    s.register();
    let mut out = Vec::new();
    s.c.set_vm_priority(VM, 5, &mut out).unwrap();
    assert!(out.is_empty());
    assert_eq!(s.send(Kind::Cpu, 1)[0], set_cpu(Level::Boosted, 5));
    s.c.set_vm_priority(VM, 7, &mut out).unwrap();
    assert_eq!(out, vec![set_cpu(Level::Boosted, 7)]);
    assert!(s.c.set_vm_priority(VM, 99, &mut out).is_err());
    assert!(s.c.set_vm_priority(VM, 0, &mut out).is_err());
}

/// Every guest frame gets exactly one reply echoing its seq, whatever the sequence of frames,
/// operator commands and ticks; and the VM is never left boosted when it is not registered.
#[test]
fn every_guest_frame_gets_exactly_one_reply() {
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut s = Sim::new(Policy {
        max_continuous_boost_ms: 50,
        budget_cooldown_ms: 10,
        max_boost_share_permille: 500,
        budget_window_ms: 200,
        frame_rate: 2000,
        frame_burst: 20,
        malformed_rate: 5,
        ..Policy::default()
    });
    let kinds = [Kind::Register, Kind::Cpu, Kind::Cpu, Kind::Cpu, Kind::Cpu, Kind::Cpu, Kind::Cpu, Kind::Io];
    for _ in 0..20_000 {
        let r = next();
        match r % 10 {
            0 if r % 50 == 0 => {
                let mut out = Vec::new();
                s.c.set_vm_enabled(VM, None, r & 0x100 != 0, s.now, &mut out);
                s.c.set_enabled(Some(CPU), r & 0x200 != 0 || r & 0x400 != 0, s.now, &mut out);
                assert!(sends(&out).iter().all(|f| f.seq == 0), "unsolicited frames carry seq 0");
            }
            1 => {
                s.advance(s.now + (r >> 20) % (30 * MS));
            }
            _ => {
                let kind = if r % 97 == 2 { Kind::Deregister } else { kinds[(r >> 8) as usize % kinds.len()] };
                let value = match kind {
                    // Mostly with the CPU capability, sometimes without (denied).
                    Kind::Register if (r >> 16) % 8 == 0 => caps::IO,
                    Kind::Register => caps::CPU | ((r >> 20) & 6),
                    Kind::Deregister => 0,
                    // Mostly boosts, so that budgets run out.
                    _ => ((r >> 16) & 7 != 0) as u64,
                };
                s.reply(kind, value);
            }
        }
        let vm = s.c.vm(VM).unwrap();
        if vm.level(CPU).is_changed() {
            assert!(vm.registered.is_some() && vm.slots[&CPU].wants == 1, "boosted without a live request");
            assert!(s.c.enabled(CPU) && vm.settings.enabled(CPU), "boosted while disabled");
        }
    }
    let vm = s.c.vm(VM).unwrap();
    let k = &vm.slots[&CPU].counters;
    assert!(k.boosts > 100 && k.budget_exhausted > 10, "{k:?}");
}

#[test]
fn policy_defaults_validate_and_parse_from_toml() {
    let p = Policy::default();
    p.validate().unwrap();
    let parsed: Policy = toml::from_str("max_continuous_boost_ms = 300\n").unwrap();
    assert_eq!(parsed, Policy { max_continuous_boost_ms: 300, ..Policy::default() });
    assert!(toml::from_str::<Policy>("max_continous_boost_ms = 300\n").is_err(), "typos are errors");
    let bad = Policy { default_priority: 99, ..Policy::default() };
    assert!(bad.validate().unwrap_err().to_string().contains("default_priority"));
    let bad = Policy { rt_guard_hysteresis_ms: 900, ..Policy::default() };
    assert!(bad.validate().is_err());
}
