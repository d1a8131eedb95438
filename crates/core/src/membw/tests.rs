//! The regulator with a fake clock and fake counters: budgets, reclaim, best effort, admission;
//! and the memory model with the paper's scenarios.

use super::sim::{self, Demand, SimConfig, SimVm};
use super::*;
use crate::{Action, Coordinator, CpuPolicy, Policy};
use cosched_proto::{caps, Frame, Kind};

const MS: u64 = crate::NS_PER_MS;
const A: VmId = VmId(1);
const B: VmId = VmId(2);

/// G = 1000 MB/s and 10 ms periods: 10 MB per period; a share of 100‰ is 1 MB.
fn cfg(reclaim: bool, best_effort: bool) -> RegulatorConfig {
    RegulatorConfig { guaranteed_mbps: 1000, period_ns: 10 * MS, reclaim, best_effort }
}

const MB: u64 = 1_000_000;

fn reg(reclaim: bool, best_effort: bool, a: u64, b: u64) -> Regulator {
    let mut r = Regulator::new(cfg(reclaim, best_effort), 0);
    r.add(A, a).unwrap();
    r.add(B, b).unwrap();
    r
}

fn step(r: &mut Regulator, now: u64, usage: &[(VmId, u64)]) -> Vec<Throttle> {
    let mut out = Vec::new();
    r.step(now, usage, &mut out);
    out
}

#[test]
fn a_vm_over_its_budget_is_throttled_until_the_period_ends() {
    let mut r = reg(false, false, 600, 200);
    assert_eq!(step(&mut r, 10 * MS, &[]), vec![]);
    assert_eq!(r.vm(B).unwrap().budget, 2 * MB);
    assert_eq!(step(&mut r, 12 * MS, &[(B, MB)]), vec![]);
    assert_eq!(step(&mut r, 14 * MS, &[(B, MB + 1)]), vec![(B, true)], "past 2 MB: stopped at this check");
    assert!(r.vm(B).unwrap().throttled());
    r.confirm_stop(B, 14 * MS);
    assert_eq!(step(&mut r, 16 * MS, &[(A, 3 * MB)]), vec![], "A is within its 6 MB");
    assert_eq!(step(&mut r, 20 * MS, &[]), vec![(B, false)], "a new period lets B run");
    let b = r.vm(B).unwrap();
    assert_eq!((b.stats.throttles, b.stats.throttled_ns, b.stats.last_period_bytes), (1, 6 * MS, 2 * MB + 1));
    assert_eq!((b.stats.stopping_ns, b.stats.unconfirmed_throttles), (0, 0), "the lever confirmed at once");
    assert_eq!(r.pool(), 0, "without reclaim nothing is lent");
}

/// A throttle the lever has not confirmed (a v1 freezer group still `FREEZING`: a vCPU in
/// uninterruptible sleep) does not count as a stop: the VM is throttled but not stopped, its
/// time goes to `stopping_ns`; the regulator goes on without waiting (the next period lets it
/// run all the same), and a confirmation that comes late counts from then on.
#[test]
fn a_throttle_counts_as_a_stop_only_once_the_lever_confirms_it() {
    let mut r = reg(false, false, 600, 200);
    assert_eq!(step(&mut r, 10 * MS, &[]), vec![]);
    assert_eq!(step(&mut r, 12 * MS, &[(B, 3 * MB)]), vec![(B, true)]);
    let b = r.vm(B).unwrap();
    assert!(b.throttled() && !b.stopped(), "decided, not in force");
    assert_eq!(r.stopping().collect::<Vec<_>>(), vec![B]);
    // Checks go on; B still moves bytes (it is not stopped) and is not throttled twice.
    assert_eq!(step(&mut r, 14 * MS, &[(B, MB)]), vec![]);
    assert_eq!(step(&mut r, 16 * MS, &[(B, MB)]), vec![]);
    // Never confirmed: the period's end lets it run, without a stop counted.
    assert_eq!(step(&mut r, 20 * MS, &[]), vec![(B, false)]);
    let b = r.vm(B).unwrap();
    assert!(!b.throttled() && !b.stopped());
    assert_eq!(
        (b.stats.throttles, b.stats.throttled_ns, b.stats.stopping_ns, b.stats.unconfirmed_throttles),
        (1, 0, 8 * MS, 1)
    );
    assert_eq!(b.stats.last_period_bytes, 5 * MB, "what it moved while freezing is its own");
    // Next period: the stop is confirmed 3 ms after the decision, and counts from there.
    assert_eq!(step(&mut r, 21 * MS, &[(B, 3 * MB)]), vec![(B, true)]);
    r.confirm_stop(B, 24 * MS);
    r.confirm_stop(B, 25 * MS); // a second confirmation changes nothing
    r.confirm_stop(A, 25 * MS); // nor one of a VM not throttled
    assert!(r.vm(B).unwrap().stopped() && !r.vm(A).unwrap().stopped());
    assert_eq!(r.stopping().count(), 0);
    assert_eq!(step(&mut r, 30 * MS, &[]), vec![(B, false)]);
    let b = r.vm(B).unwrap();
    assert_eq!(
        (b.stats.throttles, b.stats.throttled_ns, b.stats.stopping_ns, b.stats.unconfirmed_throttles),
        (2, 6 * MS, 11 * MS, 1)
    );
}

#[test]
fn reclaim_lends_what_a_vm_did_not_use_and_the_lender_takes_it_back() {
    let mut r = reg(true, false, 600, 200);
    assert_eq!((r.vm(A).unwrap().budget, r.pool()), (6 * MB, 0), "a new VM starts with its whole guarantee");
    // First period: A idle, B streams past its 2 MB and stops (nothing lent yet).
    assert_eq!(step(&mut r, 5 * MS, &[(B, 2 * MB + 1)]), vec![(B, true)]);
    assert_eq!(step(&mut r, 10 * MS, &[]), vec![(B, false)]);
    // A's unused 6 MB and the 2 MB no share holds are lent from this period on; B keeps its own.
    assert_eq!((r.vm(A).unwrap().budget, r.vm(B).unwrap().budget, r.pool()), (0, 2 * MB, 8 * MB));
    // B streams: it borrows past its own 2 MB instead of stopping.
    assert_eq!(step(&mut r, 15 * MS, &[(B, 5 * MB)]), vec![]);
    let b = r.vm(B).unwrap();
    assert!(b.borrowed >= 3 * MB && b.stats.borrowed_bytes == b.borrowed, "{b:?}");
    let left = r.pool();
    // A wakes up: its guarantee is its own at once, whatever B borrowed.
    assert_eq!(step(&mut r, 16 * MS, &[(A, MB)]), vec![]);
    let a = r.vm(A).unwrap();
    assert_eq!((a.budget, a.stats.taken_back_bytes), (6 * MB, 6 * MB));
    assert_eq!(r.pool(), left.saturating_sub(6 * MB));
    assert_eq!(step(&mut r, 17 * MS, &[(B, 2 * MB)]), vec![(B, true)], "B past its budget and the pool");
    assert_eq!(step(&mut r, 18 * MS, &[(A, 4 * MB)]), vec![], "A gets its 6 MB");
    assert_eq!(step(&mut r, 19 * MS, &[(A, MB + 1)]), vec![(A, true)]);
    // Next period: A used 6 MB and keeps its budget, B used more than its 2 MB: 2 MB to lend.
    assert_eq!(step(&mut r, 20 * MS, &[]), vec![(A, false), (B, false)]);
    assert_eq!((r.vm(A).unwrap().budget, r.vm(B).unwrap().budget, r.pool()), (6 * MB, 2 * MB, 2 * MB));
}

#[test]
fn best_effort_lets_everyone_run_once_the_guaranteed_bandwidth_is_used() {
    let mut r = reg(false, true, 600, 200);
    step(&mut r, 10 * MS, &[]);
    assert_eq!(step(&mut r, 12 * MS, &[(B, 2 * MB + 1)]), vec![(B, true)]);
    assert_eq!(step(&mut r, 14 * MS, &[(A, 6 * MB + 1)]), vec![(A, true)]);
    assert!(!r.in_best_effort(), "8 MB of 10 used: the share nobody holds is not best effort");
    let mut r2 = reg(false, true, 800, 200);
    step(&mut r2, 10 * MS, &[]);
    assert_eq!(step(&mut r2, 12 * MS, &[(B, 2 * MB + 1)]), vec![(B, true)]);
    // A reaches its 8 MB: 10 MB used in all, every guarantee met: both run to the period's end.
    let out = step(&mut r2, 14 * MS, &[(A, 8 * MB + 1)]);
    assert_eq!(out, vec![(A, true), (A, false), (B, false)]);
    assert!(r2.in_best_effort());
    assert_eq!(step(&mut r2, 16 * MS, &[(A, 5 * MB), (B, 5 * MB)]), vec![], "no limit until the period ends");
    assert_eq!(r2.stats.best_effort_periods, 1);
    step(&mut r2, 20 * MS, &[]);
    assert!(!r2.in_best_effort(), "a new period regulates again");
    // Without best effort the same period keeps both stopped.
    let mut r3 = reg(false, false, 800, 200);
    step(&mut r3, 10 * MS, &[]);
    step(&mut r3, 12 * MS, &[(B, 2 * MB + 1)]);
    assert_eq!(step(&mut r3, 14 * MS, &[(A, 8 * MB + 1)]), vec![(A, true)]);
}

#[test]
fn admission_never_commits_more_than_the_guaranteed_bandwidth() {
    let mut r = reg(true, true, 600, 200);
    assert_eq!(r.committed(), 800);
    let e = r.add(VmId(3), 300).unwrap_err().to_string();
    assert!(e.contains("300‰ does not fit") && e.contains("800‰"), "{e}");
    assert_eq!(r.vm(VmId(3)).unwrap().share, 0, "regulated with no share");
    // A guest asks: granted what is free, at most what it asked.
    assert_eq!(r.admit(B, 300), Ok(300));
    assert_eq!(r.admit(VmId(3), 500), Ok(100), "lowered to what is free");
    assert_eq!(r.admit(VmId(3), 50), Ok(50), "a VM may ask for less");
    assert_eq!(r.committed(), 950);
    assert_eq!(r.admit(B, 1000), Ok(350), "its own share counts as free for itself");
    assert_eq!(r.admit(VmId(3), 10), Ok(10).and(r.admit(VmId(3), 10)));
    let mut full = reg(true, true, 600, 400);
    assert_eq!(full.admit(A, 700), Ok(600));
    full.add(VmId(3), 0).unwrap();
    assert_eq!(full.admit(VmId(3), 10), Err(DenyReason::Budget), "nothing free: denied");
    // The operator cannot squeeze in beside a guest's grant either.
    assert!(full.set_share(VmId(3), 1).is_err());
    // The request ends: the operator's share is back.
    assert_eq!(full.admit(B, 100), Ok(100));
    full.clear_request(B);
    assert_eq!(full.vm(B).unwrap().effective(), 400);
    assert!(full.set_share(A, 1001).is_err());
}

#[test]
fn the_coordinator_replies_with_the_grant_and_a_share_of_zero_gives_it_back() {
    let p = Policy::default();
    let cpu = CpuPolicy::new(&p, 8);
    let mut c = Coordinator::new(p, vec![Box::new(cpu), Box::new(MembwPolicy::new(cfg(true, true), 4))]);
    let s = c.default_settings();
    for (id, share) in [(A, 0), (B, 700)] {
        c.vm_found(id, "vm", s, 0);
        c.set_membw_share(id, share).unwrap();
    }
    let regulator = |c: &Coordinator| c.policy_of::<MembwPolicy>().unwrap().regulator().clone();
    let mut out = Vec::new();
    c.frame(A, Frame::register(1, caps::CPU | caps::MEMBW), 0, &mut out);
    let sent = |out: &[Action]| -> Vec<Frame> {
        out.iter().filter_map(|a| if let Action::Send { frame, .. } = a { Some(*frame) } else { None }).collect()
    };
    assert_eq!(sent(&out), vec![Frame::ack(1, caps::CPU | caps::MEMBW)]);
    out.clear();
    c.frame(A, Frame::new(Kind::Membw, 2, 500), 0, &mut out);
    assert_eq!(sent(&out), vec![Frame::ack(2, 300)], "lowered to the 300‰ B leaves");
    assert_eq!(regulator(&c).vm(A).unwrap().effective(), 300);
    out.clear();
    // Hours later the grant stands: membw has no time budgets unless the operator sets them.
    c.tick(3_600_000 * MS, &mut out);
    assert!(out.is_empty(), "{out:?}");
    c.set_membw_share(B, 1000).unwrap_err();
    c.frame(A, Frame::new(Kind::Membw, 3, 0), 3_600_000 * MS, &mut out);
    assert_eq!(sent(&out), vec![Frame::ack(3, 0)]);
    assert_eq!(regulator(&c).vm(A).unwrap().requested, None);
    c.set_membw_share(B, 1000).unwrap();
    out.clear();
    c.frame(A, Frame::new(Kind::Membw, 4, 10), 3_600_000 * MS, &mut out);
    assert_eq!(sent(&out), vec![Frame::deny_for(4, Resource::Membw, DenyReason::Budget)]);
    // Figures for status.
    let f = c.figures(Resource::Membw);
    assert!(f.contains(&("committed_permille", 1000)) && f.contains(&("guaranteed_mbps", 1000)), "{f:?}");
}

/// The paper's setting: a guaranteed VM (70%) beside a hog (20%) and a second hog without a
/// share, on a memory system that delivers 1.25× the guaranteed bandwidth.
fn scenario(reclaim: bool, best_effort: bool, guaranteed: Demand) -> (SimConfig, Vec<SimVm>) {
    let cfg = SimConfig {
        regulator: Some(cfg(reclaim, best_effort)),
        capacity_mbps: 1250,
        checks_per_period: 10,
        duration_ms: 2000,
        report_ms: 10,
    };
    let vm = |name: &str, share, demand| SimVm { name: name.into(), share, max_mbps: 1500, demand };
    let vms = vec![
        vm("rt", 700, vec![(0, guaranteed), (1000, Demand::Idle), (1500, guaranteed)]),
        vm("hog1", 200, vec![(0, Demand::Stream)]),
        vm("hog2", 0, vec![(0, Demand::Stream)]),
    ];
    (cfg, vms)
}

fn mean(report: &sim::Report, vm: &str, from_ms: f64, to_ms: f64) -> f64 {
    let xs: Vec<f64> = report
        .periods
        .iter()
        .filter(|p| p.t_ms >= from_ms && p.t_ms < to_ms)
        .flat_map(|p| p.vms.iter().filter(|v| v.name == vm).map(|v| v.mbps))
        .collect();
    xs.iter().sum::<f64>() / xs.len() as f64
}

#[test]
fn the_guaranteed_vm_gets_its_guarantee_beside_hogs_in_every_mode() {
    for (reclaim, best_effort) in [(false, false), (true, false), (false, true), (true, true)] {
        for demand in [Demand::Stream, Demand::Rate(700)] {
            let (c, vms) = scenario(reclaim, best_effort, demand);
            let r = sim::run(&c, &vms).unwrap();
            let rt = mean(&r, "rt", 100.0, 1000.0);
            assert!(rt >= 0.95 * 700.0, "reclaim {reclaim} best effort {best_effort} {demand:?}: rt {rt:.0} MB/s");
            // Stopped within one period of reaching the limit: within one check here.
            let worst = r.stops.iter().map(|s| s.latency_ms).fold(0.0, f64::max);
            assert!(!r.stops.is_empty() && worst <= 1.0 + 1e-9, "worst stop {worst} ms");
        }
    }
    // Unregulated, the hogs take most of it.
    let (mut c, vms) = scenario(false, false, Demand::Stream);
    c.regulator = None;
    let r = sim::run(&c, &vms).unwrap();
    let rt = mean(&r, "rt", 100.0, 1000.0);
    assert!(rt < 0.7 * 700.0, "unregulated rt {rt:.0} MB/s");
}

#[test]
fn unused_budget_is_lent_within_one_period_only_with_reclaim() {
    for reclaim in [false, true] {
        let (c, vms) = scenario(reclaim, false, Demand::Stream);
        let r = sim::run(&c, &vms).unwrap();
        // rt goes idle at 1000 ms: from the next period on, hog1 runs on what rt left.
        let first_lent = r
            .periods
            .iter()
            .find(|p| p.t_ms >= 1000.0 && p.vms.iter().any(|v| v.name == "hog1" && v.mbps > 2.0 * v.guarantee_mbps))
            .map(|p| p.t_ms);
        let idle_hog1 = mean(&r, "hog1", 1010.0, 1500.0);
        if reclaim {
            let t = first_lent.expect("lent");
            assert!(t <= 1010.0, "lent from {t} ms");
            assert!(idle_hog1 > 500.0, "hog1 {idle_hog1:.0} MB/s on rt's budget");
        } else {
            assert_eq!(first_lent, None);
            // Its own 200 MB/s, and at most one check interval at full speed past it before the
            // check that stops it (1250 MB/s for 1 ms of every 10).
            assert!(idle_hog1 > 200.0 && idle_hog1 <= 200.0 + 125.0 + 1.0, "hog1 {idle_hog1:.0} MB/s");
        }
        // When rt is back, it has its guarantee again.
        let back = mean(&r, "rt", 1510.0, 2000.0);
        assert!(back >= 0.95 * 700.0, "reclaim {reclaim}: rt back at {back:.0} MB/s");
    }
}
