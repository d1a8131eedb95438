//! Actuator and restore logic on a fake `/proc` tree and a fake scheduler.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use cosched_procfs::fake;

use std::io;

use super::*;
use crate::sched::{SCHED_FIFO, SCHED_FLAG_RESET_ON_FORK, SCHED_OTHER, SCHED_RR};
use crate::settings::{Kind, SchedKind};
use crate::store::{restore_all, Entry, Setting, VmRecord};

/// A scheduler that keeps attributes in a map; threads not in the map do not exist. Shared
/// (`Rc`) so the test can look inside while the [`Host`] owns it.
#[derive(Default)]
pub(super) struct FakeState {
    pub(super) attrs: HashMap<i32, SchedAttr>,
    pub(super) sets: Vec<(i32, SchedAttr)>,
    pub(super) fail_with: Option<i32>,
    pub(super) ioprio: HashMap<i32, u16>,
    pub(super) gets: u64,
    pub(super) affinity: HashMap<i32, Vec<usize>>,
    pub(super) cgroups: HashMap<(i32, String), String>,
}

/// The scheduler state, and the cgroup tree groups are made in (a fake tree where a test needs
/// one; otherwise a path that does not exist).
#[derive(Clone)]
pub(super) struct FakeSched(pub(super) Rc<RefCell<FakeState>>, pub(super) crate::cgroup::CgroupFs);

impl Default for FakeSched {
    fn default() -> Self {
        FakeSched(Rc::default(), crate::cgroup::CgroupFs::new("/nonexistent/proc", "/nonexistent/cgroup"))
    }
}

impl ThreadOps for FakeSched {
    fn get_ioprio(&mut self, tid: i32) -> io::Result<u16> {
        self.0.borrow().ioprio.get(&tid).copied().ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))
    }
    fn set_ioprio(&mut self, tid: i32, ioprio: u16) -> io::Result<()> {
        self.0.borrow_mut().ioprio.insert(tid, ioprio);
        Ok(())
    }
    fn get_affinity(&mut self, tid: i32) -> io::Result<Vec<usize>> {
        self.0.borrow().affinity.get(&tid).cloned().ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))
    }
    fn set_affinity(&mut self, tid: i32, cpus: &[usize]) -> io::Result<()> {
        self.0.borrow_mut().affinity.insert(tid, cpus.to_vec());
        Ok(())
    }
    fn get_cgroup(&mut self, tid: i32, hierarchy: &str) -> io::Result<String> {
        let st = self.0.borrow();
        st.cgroups.get(&(tid, hierarchy.to_string())).cloned().ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))
    }
    fn set_cgroup(&mut self, tid: i32, hierarchy: &str, group: &str) -> io::Result<()> {
        self.0.borrow_mut().cgroups.insert((tid, hierarchy.to_string()), group.to_string());
        Ok(())
    }
    fn cgroups(&self) -> &crate::cgroup::CgroupFs {
        &self.1
    }
}

impl SchedOps for FakeSched {
    fn get(&mut self, tid: i32) -> io::Result<SchedAttr> {
        self.0.borrow_mut().gets += 1;
        self.0.borrow().attrs.get(&tid).copied().ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))
    }
    fn set(&mut self, tid: i32, attr: &SchedAttr) -> io::Result<()> {
        let mut st = self.0.borrow_mut();
        if let Some(errno) = st.fail_with {
            return Err(io::Error::from_raw_os_error(errno));
        }
        let slot = st.attrs.get_mut(&tid).ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
        *slot = *attr;
        st.sets.push((tid, *attr));
        Ok(())
    }
}

struct World {
    proc_dir: tempfile::TempDir,
    _state_dir: tempfile::TempDir,
    host: Host,
    sched: FakeSched,
    class: BoostClass,
}

const PID: i32 = 500;

impl World {
    fn new() -> World {
        let proc_dir = tempfile::tempdir().unwrap();
        let state_dir = tempfile::tempdir().unwrap();
        fake::add_process(
            proc_dir.path(),
            PID,
            "/usr/bin/qemu-system-x86_64",
            &[(PID, "qemu-system-x86"), (501, "call_rcu"), (502, "CPU 0/TCG"), (503, "worker")],
        );
        // Another process: must never be touched.
        fake::add_process(proc_dir.path(), 900, "/usr/bin/bash", &[(900, "bash")]);
        let sched = FakeSched::default();
        for tid in [500, 501, 502, 503, 900] {
            sched.0.borrow_mut().attrs.insert(tid, SchedAttr::other(0, 0));
        }
        sched.0.borrow_mut().attrs.insert(501, SchedAttr::other(5, 0)); // a niced thread
        let host = Host {
            procfs: ProcFs::new(proc_dir.path()),
            sched: Box::new(sched.clone()),
            store: StateDir::open(state_dir.path().join("state")).unwrap(),
            // Re-list before every change, so each test sees the tree as it is now.
            fresh: std::time::Duration::ZERO,
            // And read every thread's attributes again before every change.
            verify: std::time::Duration::ZERO,
            syscall_ns: 0,
        };
        World { proc_dir, _state_dir: state_dir, host, sched, class: BoostClass::default() }
    }

    fn vm(&mut self) -> VmThreads {
        let process = self.host.procfs.process(PID).unwrap().task;
        let cpu: Box<dyn Actuator> = Box::new(CpuActuator::new(self.class.clone()));
        VmThreads::new("vm1", process, &mut self.host, vec![cpu]).unwrap()
    }

    fn attr(&self, tid: i32) -> SchedAttr {
        self.sched.0.borrow().attrs[&tid]
    }

    fn put(&self, tid: i32, attr: SchedAttr) {
        self.sched.0.borrow_mut().attrs.insert(tid, attr);
    }

    fn records(&self) -> Vec<VmRecord> {
        self.host.store.load_all().unwrap().into_iter().filter_map(|(_, r)| r.ok()).collect()
    }
}

/// The original scheduling attributes a record holds for thread `tid`.
fn original(rec: &VmRecord, tid: i32) -> SchedAttr {
    match rec.entries.iter().find(|e: &&Entry| e.task.id == tid).map(|e| &e.setting) {
        Some(Setting::Sched { original, .. }) => *original,
        other => panic!("no sched entry for {tid}: {other:?}"),
    }
}

fn rr(prio: u32) -> SchedAttr {
    SchedAttr::rt(SCHED_RR, prio, SCHED_FLAG_RESET_ON_FORK)
}

#[test]
fn boost_sets_every_thread_and_deboost_restores_exactly() {
    let mut w = World::new();
    let mut vm = w.vm();
    let out = vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    assert_eq!(out, Outcome { changed: 4, ..Default::default() });
    for tid in 500..=503 {
        assert_eq!(w.attr(tid), rr(1), "tid {tid}");
    }
    assert_eq!(w.attr(900), SchedAttr::other(0, 0), "outside the VM");
    let out = vm.set_level(&mut w.host, Resource::Cpu, Level::Normal, 1);
    assert_eq!(out.changed, 4);
    assert_eq!(w.attr(501), SchedAttr::other(5, 0), "nice 5 comes back");
    assert_eq!(w.attr(502), SchedAttr::other(0, 0));
    assert!(w.sched.0.borrow().sets.iter().all(|(tid, _)| (500..=503).contains(tid)));
}

#[test]
fn originals_are_on_disk_before_the_first_change() {
    let mut w = World::new();
    let mut vm = w.vm();
    assert!(w.host.store.load_all().unwrap().is_empty(), "tracking alone writes nothing");
    // Make every set fail: the record must be on disk anyway, written before.
    w.sched.0.borrow_mut().fail_with = Some(libc::EPERM);
    let out = vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    assert_eq!(out.changed, 0);
    assert!(out.errors[0].contains("CAP_SYS_NICE"), "{:?}", out.errors);
    let recs = w.host.store.load_all().unwrap();
    let rec = recs[0].1.as_ref().unwrap();
    assert_eq!(rec.entries.len(), 4);
    assert_eq!(original(rec, 501), SchedAttr::other(5, 0));
}

#[test]
fn unwritable_state_dir_means_no_boost_until_it_is_writable_again() {
    let mut w = World::new();
    let mut vm = w.vm();
    let dir = w.host.store.path().to_path_buf();
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::write(&dir, b"not a dir").unwrap();
    let out = vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    assert!(out.errors[0].contains("not changing anything"), "{:?}", out.errors);
    assert!(w.sched.0.borrow().sets.is_empty(), "nothing changed without the originals on disk");
    assert_eq!(vm.level(Resource::Cpu), Level::Boosted, "the level asked for stays, so a refresh tries again");
    std::fs::remove_file(&dir).unwrap();
    std::fs::create_dir(&dir).unwrap();
    let out = vm.refresh(&mut w.host);
    assert_eq!(out.changed, 4, "{out:?}");
    assert_eq!(w.attr(502), rr(1));
}

#[test]
fn a_thread_made_realtime_after_connect_is_not_lowered() {
    let mut w = World::new();
    let mut vm = w.vm();
    w.put(503, SchedAttr::rt(SCHED_FIFO, 50, 0)); // the operator, after we started tracking
    vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    assert_eq!(w.attr(503), SchedAttr::rt(SCHED_FIFO, 50, 0));
    assert_eq!(w.attr(502), rr(1));
    vm.set_level(&mut w.host, Resource::Cpu, Level::Normal, 1);
    assert_eq!(w.attr(503), SchedAttr::rt(SCHED_FIFO, 50, 0));
}

#[test]
fn a_record_left_on_disk_keeps_the_true_originals_across_a_reconnect() {
    let mut w = World::new();
    let mut vm = w.vm();
    vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    // The restore fails (say EPERM) and the record stays; the VM reconnects.
    w.sched.0.borrow_mut().fail_with = Some(libc::EPERM);
    assert!(!vm.restore(&mut w.host).errors.is_empty());
    w.sched.0.borrow_mut().fail_with = None;
    assert_eq!(w.attr(501), rr(1), "still boosted");
    let mut vm = w.vm();
    assert_eq!(original(&w.records()[0], 501), SchedAttr::other(5, 0), "record untouched by tracking");
    // A boost and deboost later, nice 5 comes back: the disk's original won over what we read.
    vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    vm.set_level(&mut w.host, Resource::Cpu, Level::Normal, 1);
    assert_eq!(w.attr(501), SchedAttr::other(5, 0));
    assert_eq!(w.attr(502), SchedAttr::other(0, 0));
    // Even without a new boost, restoring puts them back.
    let mut w = World::new();
    let mut vm = w.vm();
    vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    drop(vm);
    let mut vm = w.vm();
    assert!(vm.restore(&mut w.host).errors.is_empty());
    assert_eq!(w.attr(501), SchedAttr::other(5, 0));
    assert!(w.records().is_empty());
}

#[test]
fn guarded_moves_only_vcpus_to_the_fair_class() {
    let mut w = World::new();
    w.class.other_threads_priority_offset = 1;
    let mut vm = w.vm();
    vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 3);
    assert_eq!(w.attr(502), rr(3), "vCPU");
    assert_eq!(w.attr(500), rr(4), "main loop one above");
    vm.set_level(&mut w.host, Resource::Cpu, Level::Guarded, 3);
    assert_eq!(w.attr(502), SchedAttr::other(-20, SCHED_FLAG_RESET_ON_FORK));
    assert_eq!(w.attr(500), rr(4));
    vm.set_level(&mut w.host, Resource::Cpu, Level::Normal, 3);
    assert_eq!(w.attr(502), SchedAttr::other(0, 0));
}

#[test]
fn without_thread_names_every_non_main_thread_is_guarded() {
    let c = BoostClass::default();
    assert_eq!(c.target(Level::Guarded, ThreadRole::Other, false, 1), Some(SchedAttr::other(-20, 1)));
    assert_eq!(c.target(Level::Guarded, ThreadRole::Main, false, 1), Some(rr(1)));
    assert_eq!(c.target(Level::Guarded, ThreadRole::Other, true, 1), Some(rr(1)));
    assert_eq!(c.target(Level::Normal, ThreadRole::Vcpu, true, 1), None);
    let c = BoostClass { other_threads_priority_offset: 5, ..c };
    assert_eq!(c.target(Level::Boosted, ThreadRole::Io, true, 97), Some(rr(98)), "capped at 98");
}

/// An RT co-scheduling grant (the guest named its priority) is `SCHED_FIFO` at the granted
/// priority, the VM's other threads the offset above; a plain grant keeps `[boost]`'s class.
#[test]
fn an_rt_grant_is_fifo_at_its_priority_and_a_plain_one_keeps_the_class() {
    let c = BoostClass { other_threads_priority_offset: 1, ..BoostClass::default() };
    let fifo = |p| SchedAttr::rt(SCHED_FIFO, p, SCHED_FLAG_RESET_ON_FORK);
    let rt = Grant::Rt { priority: 40 };
    assert_eq!(c.target(Level::Boosted, ThreadRole::Vcpu, true, rt), Some(fifo(40)));
    assert_eq!(c.target(Level::Boosted, ThreadRole::Main, true, rt), Some(fifo(41)));
    assert_eq!(c.target(Level::Boosted, ThreadRole::Vcpu, true, Grant::Plain { priority: 40 }), Some(rr(40)));
    // The guard holds an RT grant's vCPUs at the fair class like any other boost's.
    assert_eq!(c.target(Level::Guarded, ThreadRole::Vcpu, true, rt), Some(SchedAttr::other(-20, 1)));
    let nice = BoostClass { policy: BoostPolicy::Nice, ..c };
    assert_eq!(nice.target(Level::Boosted, ThreadRole::Vcpu, true, rt), Some(SchedAttr::other(nice.boost_nice, 1)));
}

#[test]
fn a_fresh_listing_is_trusted_and_a_stale_one_is_redone() {
    let mut w = World::new();
    w.host.fresh = std::time::Duration::from_secs(3600);
    let mut vm = w.vm();
    // A thread appears after the listing: within `fresh` it is not seen by a boost...
    fake::add_thread(w.proc_dir.path(), PID, 510, "worker");
    w.put(510, SchedAttr::other(0, 0));
    vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    assert_eq!(w.attr(510), SchedAttr::other(0, 0));
    // ...the next refresh (a rescan) finds and boosts it.
    vm.refresh(&mut w.host);
    assert_eq!(w.attr(510), rr(1));
    // Once the listing is stale, the next change lists again first.
    w.host.fresh = std::time::Duration::ZERO;
    vm.set_level(&mut w.host, Resource::Cpu, Level::Normal, 1);
    fake::add_thread(w.proc_dir.path(), PID, 511, "worker");
    w.put(511, SchedAttr::other(0, 0));
    vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    assert_eq!(w.attr(511), rr(1));
}

#[test]
fn deadline_and_nice_classes() {
    let dl = BoostClass { policy: BoostPolicy::Deadline, ..BoostClass::default() };
    let reservation = SchedAttr::deadline(900_000, 1_000_000, SCHED_FLAG_RESET_ON_FORK);
    assert_eq!(dl.target(Level::Boosted, ThreadRole::Vcpu, true, 1), Some(reservation));
    assert_eq!(dl.target(Level::Guarded, ThreadRole::Vcpu, true, 1), Some(reservation), "nothing to guard");
    assert_eq!(
        dl.target(Level::Boosted, ThreadRole::Main, true, 3),
        Some(SchedAttr::rt(SCHED_FIFO, 3, SCHED_FLAG_RESET_ON_FORK))
    );
    assert!(!BoostPolicy::Deadline.needs_rt_guard() && BoostPolicy::Rr.needs_rt_guard());
    let nice = BoostClass { policy: BoostPolicy::Nice, boost_nice: -15, ..BoostClass::default() };
    for role in [ThreadRole::Vcpu, ThreadRole::Main, ThreadRole::Worker] {
        for level in [Level::Boosted, Level::Guarded] {
            assert_eq!(nice.target(level, role, true, 1), Some(SchedAttr::other(-15, SCHED_FLAG_RESET_ON_FORK)));
        }
    }
    let bad = BoostClass { deadline_runtime_us: 2000, ..dl };
    assert!(bad.validate().unwrap_err().to_string().contains("deadline_runtime_us"));
}

#[test]
fn new_threads_are_boosted_on_refresh_and_gone_ones_dropped() {
    let mut w = World::new();
    let mut vm = w.vm();
    vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    fake::add_thread(w.proc_dir.path(), PID, 510, "worker");
    w.put(510, SchedAttr::other(0, 0));
    fake::remove_thread(w.proc_dir.path(), PID, 503);
    w.sched.0.borrow_mut().attrs.remove(&503);
    let out = vm.refresh(&mut w.host);
    assert_eq!(out.changed, 1);
    assert_eq!(w.attr(510), rr(1));
    assert_eq!(vm.threads.len(), 4);
    let rec = w.host.store.load_all().unwrap().remove(0).1.unwrap();
    assert!(rec.entries.iter().any(|t| t.task.id == 510), "newcomer persisted before its change");
    vm.set_level(&mut w.host, Resource::Cpu, Level::Normal, 1);
    assert_eq!(w.attr(510), SchedAttr::other(0, 0));
}

#[test]
fn a_thread_id_outside_the_process_is_never_touched() {
    let mut w = World::new();
    let mut vm = w.vm();
    // Thread 503 exits; its id now names a thread of process 900.
    fake::remove_thread(w.proc_dir.path(), PID, 503);
    w.put(503, SchedAttr::other(0, 0));
    let out = vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    assert_eq!(out.gone, 1);
    assert_eq!(w.attr(503), SchedAttr::other(0, 0));
    assert!(!w.sched.0.borrow().sets.iter().any(|(tid, _)| *tid == 503));
}

#[test]
fn foreign_changes_are_left_alone_and_realtime_threads_never_lowered() {
    let mut w = World::new();
    w.put(503, SchedAttr::rt(SCHED_FIFO, 50, 0));
    let mut vm = w.vm();
    vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    assert_eq!(w.attr(503), SchedAttr::rt(SCHED_FIFO, 50, 0), "FIFO 50 is not lowered to RR 1");
    // The operator moves thread 502 somewhere else while boosted.
    let operators = SchedAttr::rt(SCHED_FIFO, 10, 0);
    w.put(502, operators);
    let out = vm.set_level(&mut w.host, Resource::Cpu, Level::Normal, 1);
    assert_eq!(out.foreign, 1);
    assert_eq!(w.attr(502), operators);
    assert_eq!(w.attr(500), SchedAttr::other(0, 0));
}

#[test]
fn originals_are_refreshed_between_boosts() {
    let mut w = World::new();
    let mut vm = w.vm();
    vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    vm.set_level(&mut w.host, Resource::Cpu, Level::Normal, 1);
    w.put(502, SchedAttr::other(-5, 0)); // operator renices between boosts
    vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    vm.set_level(&mut w.host, Resource::Cpu, Level::Normal, 1);
    assert_eq!(w.attr(502), SchedAttr::other(-5, 0));
    let rec = w.host.store.load_all().unwrap().remove(0).1.unwrap();
    assert_eq!(original(&rec, 502), SchedAttr::other(-5, 0));
}

#[test]
fn restore_all_after_a_crash_puts_back_only_our_changes() {
    let mut w = World::new();
    let mut vm = w.vm();
    vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    drop(vm); // the daemon dies: nothing restored
    assert_eq!(w.attr(500), rr(1));
    // Meanwhile: 503 exits, 502 is changed by the operator (no RESET_ON_FORK).
    fake::remove_thread(w.proc_dir.path(), PID, 503);
    w.put(502, SchedAttr::rt(SCHED_FIFO, 20, 0));
    let report = restore_all(&w.host.store, &w.host.procfs, w.host.sched.as_mut()).unwrap();
    assert_eq!((report.restored, report.gone, report.untouched), (2, 1, 1), "{report:?}");
    assert!(report.errors.is_empty());
    assert_eq!(w.attr(500), SchedAttr::other(0, 0));
    assert_eq!(w.attr(501), SchedAttr::other(5, 0));
    assert_eq!(w.attr(502), SchedAttr::rt(SCHED_FIFO, 20, 0));
    assert!(w.host.store.load_all().unwrap().is_empty(), "record removed");
    // Running it again is harmless.
    assert_eq!(restore_all(&w.host.store, &w.host.procfs, w.host.sched.as_mut()).unwrap(), Default::default());
}

#[test]
fn restore_all_keeps_records_it_could_not_finish_and_reports_bad_files() {
    let mut w = World::new();
    let mut vm = w.vm();
    vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    std::fs::write(w.host.store.path().join("1-2.json"), b"{garbage").unwrap();
    std::fs::write(w.host.store.path().join("3-4.json.tmp"), b"{half").unwrap();
    w.sched.0.borrow_mut().fail_with = Some(libc::EPERM);
    let report = restore_all(&w.host.store, &w.host.procfs, w.host.sched.as_mut()).unwrap();
    assert_eq!(report.errors.len(), 5, "{:?}", report.errors);
    assert!(report.errors[0].contains("cannot be restored, kept for you to look at: corrupt"));
    let left: Vec<_> = w.host.store.load_all().unwrap().into_iter().map(|(p, _)| p).collect();
    assert_eq!(left.len(), 2, "bad file and unfinished record kept, tmp file dropped: {left:?}");
    w.sched.0.borrow_mut().fail_with = None;
    let report = restore_all(&w.host.store, &w.host.procfs, w.host.sched.as_mut()).unwrap();
    assert_eq!(report.restored, 4);
    assert_eq!(w.attr(502).policy, SCHED_OTHER);
}

#[test]
fn restore_removes_the_record_when_the_vm_exits() {
    let mut w = World::new();
    let mut vm = w.vm();
    vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    std::fs::remove_dir_all(w.proc_dir.path().join(PID.to_string())).unwrap();
    for tid in 500..=503 {
        w.sched.0.borrow_mut().attrs.remove(&tid);
    }
    let out = vm.restore(&mut w.host);
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert!(w.host.store.load_all().unwrap().is_empty());
}

#[test]
fn deadline_reservations_the_kernel_would_refuse_are_config_errors() {
    let k = DeadlineLimits::default();
    let dl = |runtime_us, period_us| BoostClass {
        policy: BoostPolicy::Deadline,
        deadline_runtime_us: runtime_us,
        deadline_period_us: period_us,
        ..BoostClass::default()
    };
    assert_eq!(dl(10, 1000).validate_deadline(&k), Ok(()));
    assert_eq!(dl(2, 100).validate_deadline(&k), Ok(()), "2 µs = 2000 ns >= 1024 ns");
    let e = dl(1, 1000).validate_deadline(&k).unwrap_err().to_string();
    assert!(e.contains("deadline_runtime_us = 1") && e.contains("1024 ns"), "{e}");
    let e = dl(10, 50).validate_deadline(&k).unwrap_err().to_string();
    assert!(e.contains("deadline_period_us = 50") && e.contains("100..=4194304"), "{e}");
    let e = dl(10, 5_000_000).validate_deadline(&k).unwrap_err().to_string();
    assert!(e.contains("deadline_period_us = 5000000"), "{e}");
    let e = dl(960, 1000).validate_deadline(&k).unwrap_err().to_string();
    assert!(e.contains("admission limit of 950000/1000000"), "{e}");
    let unlimited = DeadlineLimits { max_bandwidth: None, ..k.clone() };
    assert_eq!(dl(1000, 1000).validate_deadline(&unlimited), Ok(()));
    // The sysctls are read when present.
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("sched_deadline_period_min_us"), "500\n").unwrap();
    std::fs::write(d.path().join("sched_rt_runtime_us"), "-1\n").unwrap();
    let read = DeadlineLimits::read(d.path());
    assert_eq!((read.period_min_us, read.period_max_us, read.max_bandwidth), (500, 1 << 22, None));
}

#[test]
fn between_verifications_a_transition_is_one_sched_setattr_per_thread_and_no_read() {
    let mut w = World::new();
    w.host.verify = std::time::Duration::from_secs(3600);
    w.host.fresh = std::time::Duration::from_secs(3600);
    let mut vm = w.vm();
    vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1); // verifies once
    let gets = std::rc::Rc::clone(&w.sched.0);
    gets.borrow_mut().gets = 0;
    gets.borrow_mut().sets.clear();
    for _ in 0..10 {
        vm.set_level(&mut w.host, Resource::Cpu, Level::Normal, 1);
        vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    }
    assert_eq!(gets.borrow().gets, 0, "no sched_getattr on the hot path");
    assert_eq!(gets.borrow().sets.len(), 20 * 4, "one sched_setattr per thread per transition");
    // Once the interval has passed, the next change reads them again and takes in a foreign change.
    w.put(502, SchedAttr::rt(SCHED_FIFO, 30, 0));
    w.host.verify = std::time::Duration::ZERO;
    let out = vm.set_level(&mut w.host, Resource::Cpu, Level::Normal, 1);
    assert_eq!(out.foreign, 1);
    assert_eq!(w.attr(502), SchedAttr::rt(SCHED_FIFO, 30, 0), "the other's change stays");
    assert!(w.records()[0].entries.iter().any(|e| e.task.id == 502), "and is on disk as 502's original");
}

/// A second resource behind the same interface: raises every thread's I/O priority while
/// boosted. Written here the way the I/O issue's actuator would be, to show that an actuator is
/// all a resource adds: the record, the restore and the thread list are shared.
#[derive(Debug, Default)]
struct FakeIo {
    level: Level,
    /// tid -> (task, original, applied, wanted)
    threads: BTreeMap<i32, (TaskId, u16, Option<u16>, Option<u16>)>,
    generation: Option<u64>,
}

const IO_RAISED: u16 = 1 << 13 | 4; // IOPRIO_CLASS_RT, level 4

impl Actuator for FakeIo {
    fn resource(&self) -> Resource {
        Resource::Io
    }
    fn level(&self) -> Level {
        self.level
    }
    fn grant(&self) -> Grant {
        Grant::Share(0)
    }
    fn resume(&mut self, _: &mut Host, _: &Threads, _: &[Entry]) {}
    fn prepare(&mut self, env: &mut Host, threads: &Threads, level: Level, _: Grant, _: &mut Outcome) -> Prepared {
        let mut p = Prepared::default();
        if self.generation != Some(threads.generation()) {
            self.generation = Some(threads.generation());
            self.threads.retain(|tid, t| threads.get(*tid).is_some_and(|i| i.task == t.0));
            for i in threads.iter() {
                if let (false, Ok(orig)) = (self.threads.contains_key(&i.task.id), env.sched.get_ioprio(i.task.id)) {
                    self.threads.insert(i.task.id, (i.task, orig, None, None));
                    p.changed = true;
                }
            }
        }
        self.level = level;
        for t in self.threads.values_mut() {
            t.3 = (level != Level::Normal).then_some(IO_RAISED);
            p.sets |= t.3.is_some();
        }
        p
    }
    fn apply(&mut self, env: &mut Host, out: &mut Outcome, _: &mut Vec<i32>) {
        for (tid, t) in self.threads.iter_mut().filter(|(_, t)| t.2 != t.3) {
            env.sched.set_ioprio(*tid, t.3.unwrap_or(t.1)).unwrap();
            t.2 = t.3;
            out.changed += 1;
        }
    }
    fn entries(&self, out: &mut Vec<Entry>) {
        out.extend(self.threads.values().map(|t| Entry {
            task: t.0,
            layer: "io".into(),
            setting: Setting::Ioprio { original: t.1, applied: vec![IO_RAISED] },
        }));
    }
    fn restored(&mut self) {
        self.level = Level::Normal;
        self.threads.values_mut().for_each(|t| t.2 = None);
    }
    fn show(&self, tid: i32) -> Option<(&'static str, String, bool)> {
        let t = self.threads.get(&tid)?;
        Some(("ioprio", format!("{:#x}", t.2.unwrap_or(t.1)), t.2.is_some()))
    }
}

#[test]
fn a_second_actuator_shares_the_threads_the_record_and_the_restore() {
    let mut w = World::new();
    for tid in 500..=503 {
        w.sched.0.borrow_mut().ioprio.insert(tid, 0);
    }
    w.sched.0.borrow_mut().ioprio.insert(501, 2 << 13 | 7); // best-effort 7, set by someone
    let process = w.host.procfs.process(PID).unwrap().task;
    let acts: Vec<Box<dyn Actuator>> = vec![Box::new(CpuActuator::new(w.class.clone())), Box::new(FakeIo::default())];
    let mut vm = VmThreads::new("vm1", process, &mut w.host, acts).unwrap();
    assert_eq!(vm.resources().collect::<Vec<_>>(), [Resource::Cpu, Resource::Io]);
    // The I/O boost alone: CPU untouched.
    let out = vm.set_level(&mut w.host, Resource::Io, Level::Boosted, 1);
    assert_eq!(out.changed, 4, "{out:?}");
    assert_eq!(w.attr(502), SchedAttr::other(0, 0));
    assert_eq!(w.sched.0.borrow().ioprio[&501], IO_RAISED);
    assert_eq!((vm.level(Resource::Io), vm.level(Resource::Cpu)), (Level::Boosted, Level::Normal));
    // Both: one record with both layers, written before the CPU change.
    vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    let rec = &w.records()[0];
    let layers: std::collections::BTreeSet<&str> = rec.entries.iter().map(|e| e.layer.as_str()).collect();
    assert_eq!(layers, ["cpu", "io"].into());
    let view = vm.threads().into_iter().find(|t| t.tid == 501).unwrap();
    assert_eq!(view.changed_by, ["cpu", "io"]);
    assert_eq!(view.settings["ioprio"], format!("{IO_RAISED:#x}"));
    // The daemon dies: the one restore puts back both settings of every thread exactly.
    drop(vm);
    let report = restore_all(&w.host.store, &w.host.procfs, w.host.sched.as_mut()).unwrap();
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(w.attr(501), SchedAttr::other(5, 0));
    assert_eq!(w.sched.0.borrow().ioprio[&501], 2 << 13 | 7);
    assert_eq!(w.sched.0.borrow().ioprio[&502], 0);
}

#[test]
fn a_resource_without_an_actuator_is_an_error_and_changes_nothing() {
    let mut w = World::new();
    let mut vm = w.vm();
    let out = vm.set_level(&mut w.host, Resource::Membw, Level::Boosted, 1);
    assert!(out.errors[0].contains("no membw actuator"), "{:?}", out.errors);
    assert!(w.sched.0.borrow().sets.is_empty());
}

#[test]
fn cgroup_membership_in_each_hierarchy_is_restored_exactly_after_a_crash() {
    let w = World::new();
    let task = |tid| w.host.procfs.thread(PID, tid).unwrap().task;
    let put = |tid, h: &str, g: &str| w.sched.0.borrow_mut().cgroups.insert((tid, h.to_string()), g.to_string());
    let group = |tid, h: &str| w.sched.0.borrow().cgroups[&(tid, h.to_string())].clone();
    // What a dead daemon left: thread 502 moved by a static policy into blkio /static, then by
    // an I/O boost into /boost; in v2 moved into /vm1. Thread 503 was moved to /boost, then the
    // operator moved it elsewhere.
    put(502, "blkio", "/boost");
    put(502, "", "/vm1");
    put(503, "blkio", "/operators");
    let cg = |tid, layer: &str, h: &str, original: &str, applied: &str| Entry {
        task: task(tid),
        layer: layer.into(),
        setting: Setting::Cgroup { hierarchy: h.into(), original: original.into(), applied: vec![applied.into()] },
    };
    let rec = VmRecord::new(
        "vm1",
        w.host.procfs.process(PID).unwrap().task,
        vec![
            cg(502, "io", "blkio", "/static", "/boost"),
            cg(502, "static", "blkio", "/", "/static"),
            cg(502, "static", "", "/", "/vm1"),
            cg(503, "io", "blkio", "/", "/boost"),
        ],
    );
    w.host.store.save(&rec).unwrap();
    let mut sched = w.sched.clone();
    let report = restore_all(&w.host.store, &w.host.procfs, &mut sched).unwrap();
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!((report.restored, report.untouched), (2, 1), "{report:?}");
    assert_eq!(group(502, "blkio"), "/", "under both layers: back to before the static one");
    assert_eq!(group(502, ""), "/", "each hierarchy on its own");
    assert_eq!(group(503, "blkio"), "/operators", "someone else's move stays");
    assert!(w.host.store.load_all().unwrap().is_empty());
}

#[test]
fn a_thread_shows_the_sched_value_in_force_whichever_layer_set_it() {
    // The CPU and event layers both keep "sched"; status showed the event layer's original
    // (SCHED_OTHER) for threads the CPU layer had raised.
    let mut w = World::new();
    let process = w.host.procfs.process(PID).unwrap().task;
    let acts: Vec<Box<dyn Actuator>> = vec![
        Box::new(CpuActuator::new(w.class.clone())),
        Box::new(CpuActuator::event(crate::actuator::EVENT_REPAY_NICE)),
    ];
    let mut vm = VmThreads::new("vm1", process, &mut w.host, acts).unwrap();
    vm.set_level(&mut w.host, Resource::Cpu, Level::Boosted, 1);
    let boosted = SchedKind.show(&rr(1));
    for view in vm.threads() {
        assert_eq!(view.settings["sched"], boosted, "tid {}: {view:?}", view.tid);
        assert_eq!(view.changed_by, ["cpu"], "tid {}", view.tid);
    }
    vm.set_level(&mut w.host, Resource::Cpu, Level::Normal, 1);
    let view = vm.threads().into_iter().find(|t| t.tid == 501).unwrap();
    assert_eq!(view.settings["sched"], SchedKind.show(&SchedAttr::other(5, 0)), "{view:?}");
    assert!(view.changed_by.is_empty(), "{view:?}");
}
