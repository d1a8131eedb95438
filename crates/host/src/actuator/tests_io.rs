//! The I/O actuator on fake trees: both levers, cgroup v1 and v2, new threads, restore.

use std::fs;

use cosched_procfs::fake;

use super::tests::FakeSched;
use super::*;
use crate::cgroup::CgroupFs;
use crate::store::{restore_all, VmRecord};

const PID: i32 = 500;
const RAISED: u16 = 1 << 13; // IOPRIO_CLASS_RT, level 0
const BE4: u16 = 2 << 13 | 4;

struct World {
    dir: tempfile::TempDir,
    host: Host,
    sched: FakeSched,
}

impl World {
    /// A QEMU with a main loop, an RCU thread, a vCPU, a worker and an iothread; another
    /// process beside it. Every thread at best-effort 4, in the root groups.
    fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        fake::add_process(
            &proc,
            PID,
            "/usr/bin/qemu-system-x86_64",
            &[(PID, "qemu-system-x86"), (501, "call_rcu"), (502, "CPU 0/TCG"), (503, "worker"), (504, "IO iot0")],
        );
        fake::add_process(&proc, 900, "/usr/bin/bash", &[(900, "bash")]);
        let cg = CgroupFs::new(&proc, dir.path().join("cg")).with_resctrl(dir.path().join("resctrl"));
        let sched = FakeSched(Default::default(), cg);
        for tid in [500, 501, 502, 503, 504, 900] {
            let mut st = sched.0.borrow_mut();
            st.attrs.insert(tid, crate::sched::SchedAttr::other(0, 0));
            st.ioprio.insert(tid, BE4);
            st.cgroups.insert((tid, "blkio".into()), "/".into());
            st.cgroups.insert((tid, "".into()), "/machine.slice/vm1.scope".into());
        }
        let host = Host {
            procfs: ProcFs::new(&proc),
            sched: Box::new(sched.clone()),
            store: StateDir::open(dir.path().join("state")).unwrap(),
            fresh: std::time::Duration::ZERO,
            verify: std::time::Duration::ZERO,
            syscall_ns: 0,
        };
        World { dir, host, sched }
    }

    fn cg(&self) -> std::path::PathBuf {
        self.dir.path().join("cg")
    }

    /// A v1 tree: the blkio hierarchy with BFQ weights.
    fn v1_tree(&self) {
        fs::create_dir_all(self.cg().join("blkio")).unwrap();
        fs::write(self.cg().join("blkio/tasks"), "").unwrap();
        fs::write(self.cg().join("blkio/blkio.bfq.weight"), "100\n").unwrap();
    }

    /// A v2 tree with the io controller; the VM alone in its scope unless `others` says.
    fn v2_tree(&self, others: &str) {
        fs::create_dir_all(self.cg().join("machine.slice/vm1.scope")).unwrap();
        fs::write(self.cg().join("cgroup.controllers"), "cpuset cpu io memory pids\n").unwrap();
        fs::write(self.cg().join("machine.slice/vm1.scope/cgroup.procs"), format!("{PID}\n{others}")).unwrap();
        fs::write(self.cg().join("machine.slice/vm1.scope/io.bfq.weight"), "default 100\n8:0 300\n").unwrap();
    }

    fn vm(&mut self, boost: &IoBoost) -> VmThreads {
        let hierarchy = match boost.lever {
            IoLever::Ioprio => None,
            IoLever::Weight => Some(weight_hierarchy(self.sched.cgroups()).unwrap()),
        };
        let process = self.host.procfs.process(PID).unwrap().task;
        VmThreads::new("vm1", process, &mut self.host, vec![Box::new(KnobActuator::io(boost, hierarchy))]).unwrap()
    }

    fn ioprio(&self, tid: i32) -> u16 {
        self.sched.0.borrow().ioprio[&tid]
    }

    fn group(&self, tid: i32) -> String {
        self.sched.0.borrow().cgroups[&(tid, "blkio".to_string())].clone()
    }

    fn records(&self) -> Vec<VmRecord> {
        self.host.store.load_all().unwrap().into_iter().map(|(_, r)| r.unwrap()).collect()
    }

    fn restore_all(&mut self) {
        let r = restore_all(&self.host.store, &self.host.procfs, self.host.sched.as_mut()).unwrap();
        assert!(r.errors.is_empty(), "{r:?}");
    }

    /// The VM's end: its own restore, or (`crash`) the daemon gone and the crash restore.
    fn end(&mut self, mut vm: VmThreads, crash: bool) {
        if crash {
            drop(vm);
            self.restore_all();
        } else {
            let r = vm.restore(&mut self.host);
            assert!(r.errors.is_empty(), "{r:?}");
        }
    }
}

fn ioprio_lever() -> IoBoost {
    IoBoost::default()
}

fn weight_lever() -> IoBoost {
    IoBoost { lever: IoLever::Weight, ..IoBoost::default() }
}

#[test]
fn ioprio_lever_raises_the_io_threads_only_and_puts_back_exactly() {
    let mut w = World::new();
    w.sched.0.borrow_mut().ioprio.insert(504, 2 << 13 | 7); // the iothread was at best-effort 7
    let mut vm = w.vm(&ioprio_lever());
    let out = vm.set_level(&mut w.host, Resource::Io, Level::Boosted, 1);
    assert!(out.errors.is_empty(), "{out:?}");
    assert_eq!(out.changed, 3, "main, worker, iothread");
    for tid in [500, 503, 504] {
        assert_eq!(w.ioprio(tid), RAISED, "thread {tid}");
    }
    for tid in [501, 502, 900] {
        assert_eq!(w.ioprio(tid), BE4, "thread {tid} issues no I/O (or is not the VM's)");
    }
    // Recorded before the change, under the io layer.
    let rec = &w.records()[0];
    assert!(rec.entries.iter().all(|e| e.layer == "io") && rec.entries.len() == 3, "{rec:?}");
    let view = vm.threads().into_iter().find(|t| t.tid == 503).unwrap();
    assert_eq!((view.settings["ioprio"].as_str(), view.changed_by.as_slice()), ("0x2000", ["io"].as_slice()));
    // A worker born while raised is raised when the list moves (thread event or refresh);
    // one born from a raised thread inherits our value (copy_io) and is ours to put back.
    fake::add_thread(&w.dir.path().join("proc"), PID, 505, "worker");
    fake::add_thread(&w.dir.path().join("proc"), PID, 506, "worker");
    w.sched.0.borrow_mut().ioprio.insert(505, BE4);
    w.sched.0.borrow_mut().ioprio.insert(506, RAISED);
    let out = vm.refresh(&mut w.host);
    assert_eq!((out.changed, w.ioprio(505), w.ioprio(506)), (1, RAISED, RAISED));
    // IO 0: exactly what each had.
    let out = vm.set_level(&mut w.host, Resource::Io, Level::Normal, 1);
    assert_eq!(out.changed, 5);
    assert_eq!((w.ioprio(500), w.ioprio(503), w.ioprio(504), w.ioprio(505)), (BE4, BE4, 2 << 13 | 7, BE4));
    assert_eq!(w.ioprio(506), BE4, "an inherited raise goes back to what the main thread had");
}

/// Thread events: a thread is created under its creator's name, then renamed `worker`. The
/// kernel's task_rename fires before the new name is in the task, so `/proc` may still show
/// the old one when the daemon reads it: the event's name decides the role.
#[cfg(feature = "bpf")]
#[test]
fn a_worker_renamed_while_raised_is_raised_by_the_events_name_not_procs() {
    use cosched_hostbpf::ThreadEvent;
    let mut w = World::new();
    let mut vm = w.vm(&ioprio_lever());
    vm.set_level(&mut w.host, Resource::Io, Level::Boosted, 1);
    fake::add_thread(&w.dir.path().join("proc"), PID, 505, "qemu-system-x86");
    w.sched.0.borrow_mut().ioprio.insert(505, BE4);
    assert!(vm.thread_event(&mut w.host, &ThreadEvent::Created { tgid: PID, tid: 505 }));
    vm.reapply(&mut w.host);
    assert_eq!(w.ioprio(505), BE4, "not an I/O thread under its creator's name");
    // /proc still says "qemu-system-x86".
    let renamed = ThreadEvent::Renamed { tgid: PID, tid: 505, comm: "worker".into() };
    assert!(vm.thread_event(&mut w.host, &renamed), "the role moved");
    let out = vm.reapply(&mut w.host);
    assert_eq!((out.changed, w.ioprio(505)), (1, RAISED), "{out:?}");
    let view = vm.threads().into_iter().find(|t| t.tid == 505).unwrap();
    assert_eq!((view.comm.as_str(), view.role), ("worker", ThreadRole::Worker));
    // A rename event for a thread the VM's task directory does not list is not ours.
    let stranger = ThreadEvent::Renamed { tgid: PID, tid: 900, comm: "worker".into() };
    assert!(!vm.thread_event(&mut w.host, &stranger));
    vm.set_level(&mut w.host, Resource::Io, Level::Normal, 1);
    assert_eq!((w.ioprio(505), w.ioprio(900)), (BE4, BE4));
}

#[test]
fn ioprio_lever_never_lowers_a_realtime_thread_and_a_crash_is_restored() {
    let mut w = World::new();
    w.sched.0.borrow_mut().ioprio.insert(503, 1 << 13 | 2); // the operator made the worker RT 2
    let mut vm = w.vm(&IoBoost { ioprio_level: 4, ..ioprio_lever() });
    vm.set_level(&mut w.host, Resource::Io, Level::Boosted, 1);
    assert_eq!((w.ioprio(500), w.ioprio(503)), (1 << 13 | 4, 1 << 13 | 2));
    // Someone changes the main thread meanwhile: theirs stays after a crash.
    w.sched.0.borrow_mut().ioprio.insert(504, 3 << 13);
    drop(vm); // kill -9: nothing put back
    w.restore_all();
    assert_eq!((w.ioprio(500), w.ioprio(503), w.ioprio(504)), (BE4, 1 << 13 | 2, 3 << 13));
    assert!(w.records().is_empty());
}

#[test]
fn weight_lever_v1_moves_io_threads_into_a_weighted_group_and_back() {
    let mut w = World::new();
    w.v1_tree();
    fs::create_dir_all(w.cg().join("blkio/tenant")).unwrap();
    w.sched.0.borrow_mut().cgroups.insert((504, "blkio".into()), "/tenant".into());
    let mut vm = w.vm(&IoBoost { weight: 800, ..weight_lever() });
    let out = vm.set_level(&mut w.host, Resource::Io, Level::Boosted, 1);
    assert!(out.errors.is_empty(), "{out:?}");
    assert_eq!((w.group(500), w.group(503)), ("/cosched-io-500".to_string(), "/cosched-io-500".to_string()));
    assert_eq!(w.group(504), "/tenant/cosched-io-500", "a group of ours under the thread's own");
    assert_eq!((w.group(501), w.group(502), w.group(900)), ("/".into(), "/".into(), "/".into()));
    let weight = |g: &str| fs::read_to_string(w.cg().join("blkio").join(g).join("blkio.bfq.weight")).unwrap();
    assert_eq!((weight("cosched-io-500"), weight("tenant/cosched-io-500")), ("800".into(), "800".into()));
    let view = vm.threads().into_iter().find(|t| t.tid == 500).unwrap();
    assert_eq!(view.settings["blkio"], "/cosched-io-500");
    // A worker born from a thread in our group is born in it: it belongs to the parent.
    fake::add_thread(&w.dir.path().join("proc"), PID, 505, "worker");
    w.sched.0.borrow_mut().cgroups.insert((505, "blkio".into()), "/tenant/cosched-io-500".into());
    vm.refresh(&mut w.host);
    // IO 0: back where each was; the groups stay for the next raise.
    vm.set_level(&mut w.host, Resource::Io, Level::Normal, 1);
    assert_eq!((w.group(500), w.group(503), w.group(504)), ("/".into(), "/".into(), "/tenant".into()));
    assert_eq!(w.group(505), "/tenant");
    // Raised again, then the daemon dies: the restore moves every thread back and removes
    // the groups it made.
    vm.set_level(&mut w.host, Resource::Io, Level::Boosted, 1);
    drop(vm);
    w.restore_all();
    assert_eq!((w.group(500), w.group(503), w.group(504)), ("/".into(), "/".into(), "/tenant".into()));
    assert!(!w.cg().join("blkio/cosched-io-500").exists() && !w.cg().join("blkio/tenant/cosched-io-500").exists());
    assert!(w.cg().join("blkio/tenant").exists(), "the operator's group stays");
}

#[test]
fn weight_lever_v2_raises_the_vms_own_group_and_puts_the_weight_back() {
    let mut w = World::new();
    w.v2_tree("");
    let file = w.cg().join("machine.slice/vm1.scope/io.bfq.weight");
    let mut vm = w.vm(&weight_lever());
    let out = vm.set_level(&mut w.host, Resource::Io, Level::Boosted, 1);
    assert!(out.errors.is_empty(), "{out:?}");
    assert_eq!(fs::read_to_string(&file).unwrap(), "default 1000");
    assert_eq!(w.group(503), "/", "no thread moves in v2");
    vm.set_level(&mut w.host, Resource::Io, Level::Normal, 1);
    assert_eq!(fs::read_to_string(&file).unwrap(), "default 100");
    // A crash mid-raise: the restore writes the original weight back.
    vm.set_level(&mut w.host, Resource::Io, Level::Boosted, 1);
    drop(vm);
    w.restore_all();
    assert_eq!(fs::read_to_string(&file).unwrap(), "default 100");
}

#[test]
fn weight_lever_v2_refuses_a_group_the_vm_shares() {
    let mut w = World::new();
    w.v2_tree("900\n");
    let file = w.cg().join("machine.slice/vm1.scope/io.bfq.weight");
    let mut vm = w.vm(&weight_lever());
    let out = vm.set_level(&mut w.host, Resource::Io, Level::Boosted, 1);
    assert!(out.errors.iter().any(|e| e.contains("shares its cgroup /machine.slice/vm1.scope")), "{out:?}");
    assert!(fs::read_to_string(&file).unwrap().starts_with("default 100"), "nothing changed");
}

#[test]
fn the_weight_lever_finds_its_hierarchy_or_says_why_not() {
    let w = World::new();
    let cg = w.sched.cgroups().clone();
    let why = weight_hierarchy(&cg).unwrap_err().to_string();
    assert!(why.contains("no cgroup v1 blkio hierarchy") && why.contains("no io controller"), "{why}");
    w.v2_tree("");
    assert_eq!(weight_hierarchy(&cg), Ok(WeightHierarchy::V2));
    w.v1_tree();
    assert_eq!(weight_hierarchy(&cg), Ok(WeightHierarchy::V1), "v1 blkio wins where both are mounted");
    fs::remove_file(w.cg().join("blkio/blkio.bfq.weight")).unwrap();
    assert!(weight_hierarchy(&cg).unwrap_err().to_string().contains("no BFQ weights"));
}

#[test]
fn membw_throttle_on_resctrl_mba_moves_vcpus_into_a_slowed_group_and_back() {
    let mut w = World::new();
    let rc = w.dir.path().join("resctrl");
    fs::create_dir_all(rc.join("info/MB")).unwrap();
    fs::create_dir_all(rc.join("tenant")).unwrap();
    fs::write(rc.join("info/MB/min_bandwidth"), "10\n").unwrap();
    fs::write(rc.join("schemata"), "    L3:0=fff;1=fff\n    MB:0=100;1=100\n").unwrap();
    fs::write(rc.join("tasks"), "").unwrap();
    let mba = crate::membw::Mba::probe(&rc, "").unwrap();
    let lever = ThrottleLever::Mba { schemata: mba.schemata(5000), describe: mba.describe(5000) };
    // A second vCPU that someone else placed in a resctrl group of theirs.
    fake::add_thread(&w.dir.path().join("proc"), PID, 505, "CPU 1/TCG");
    for (tid, group) in [(502, "/"), (505, "/tenant")] {
        w.sched.0.borrow_mut().cgroups.insert((tid, "resctrl".into()), group.into());
    }
    let process = w.host.procfs.process(PID).unwrap().task;
    let mut vm = VmThreads::new("vm1", process, &mut w.host, vec![Box::new(KnobActuator::throttle(&lever))]).unwrap();
    let group = |w: &World, tid: i32| w.sched.0.borrow().cgroups[&(tid, "resctrl".to_string())].clone();
    let out = vm.set_level(&mut w.host, Resource::Membw, Level::Throttled, 0);
    assert!(out.errors.is_empty(), "{out:?}");
    assert_eq!(out.changed, 1, "only the vCPU in the default group moves");
    assert_eq!((group(&w, 502), group(&w, 505)), ("/cosched-membw-500".into(), "/tenant".into()));
    assert_eq!(fs::read_to_string(rc.join("cosched-membw-500/schemata")).unwrap(), "MB:0=10;1=10\n");
    assert_eq!(w.group(503), "/", "no other thread or hierarchy is touched");
    let rec = &w.records()[0];
    assert!(rec.entries.iter().all(|e| e.layer == "membw") && rec.entries.len() == 1, "{rec:?}");
    // Let run: back to the default group; the group stays for the next throttle.
    vm.set_level(&mut w.host, Resource::Membw, Level::Normal, 0);
    assert_eq!(group(&w, 502), "/");
    assert!(rc.join("cosched-membw-500").is_dir());
    // Throttled when the daemon dies: the restore moves it back and removes the group.
    vm.set_level(&mut w.host, Resource::Membw, Level::Throttled, 0);
    drop(vm);
    w.restore_all();
    assert_eq!((group(&w, 502), group(&w, 505)), ("/".into(), "/tenant".into()));
    assert!(!rc.join("cosched-membw-500").exists() && rc.join("tenant").exists());
    assert!(w.records().is_empty());
}

/// A vCPU that exits after a throttle (its VM killed, say) takes nothing of what the daemon
/// made with it: the frozen group stays in the record, and the VM's restore removes it (the
/// soak found groups left after VMs killed while throttled).
#[test]
fn membw_throttle_group_is_removed_after_its_vcpu_has_gone() {
    for crash in [false, true] {
        let mut w = World::new();
        let mut vm = freezer_vm(&mut w);
        let group = w.cg().join("freezer/cosched-membw-500");
        let out = vm.set_level(&mut w.host, Resource::Membw, Level::Throttled, 0);
        assert!(out.errors.is_empty() && out.changed == 1, "{out:?}");
        assert_eq!(fs::read_to_string(group.join("freezer.state")).unwrap(), "FROZEN");
        vm.set_level(&mut w.host, Resource::Membw, Level::Normal, 0);
        assert!(group.is_dir(), "kept for the next throttle");
        // The vCPU exits; the daemon sees its list without it.
        fake::remove_thread(&w.dir.path().join("proc"), PID, 502);
        vm.refresh(&mut w.host);
        vm.set_level(&mut w.host, Resource::Membw, Level::Throttled, 0);
        w.end(vm, crash);
        assert!(!group.exists(), "crash {crash}: the frozen group of a gone vCPU is removed");
        assert!(w.records().is_empty());
    }
}

/// A v1 freezer tree: the hierarchy, vm1's vCPU in its root group.
fn freezer_vm(w: &mut World) -> VmThreads {
    fs::create_dir_all(w.cg().join("freezer")).unwrap();
    fs::write(w.cg().join("freezer/tasks"), "").unwrap();
    w.sched.0.borrow_mut().cgroups.insert((502, "freezer".into()), "/".into());
    let process = w.host.procfs.process(PID).unwrap().task;
    let lever = ThrottleLever::Freezer(FreezerKind::V1);
    VmThreads::new("vm1", process, &mut w.host, vec![Box::new(KnobActuator::throttle(&lever))]).unwrap()
}

/// The v1 freezer stops named vCPU threads only. A QEMU that names none (no `debug-threads=on`)
/// is not throttled, and each throttle says why; before, every thread but the main one was
/// taken for a vCPU and frozen (its I/O threads, its workers, whatever relays its chardev). A
/// vCPU that loses its name while frozen is moved back (thawed) at once, the others untouched.
#[test]
fn membw_throttle_v1_freezes_named_vcpus_only_and_thaws_one_that_loses_its_name() {
    let mut w = World::new();
    let mut vm = freezer_vm(&mut w);
    for tid in [500, 501, 503, 504] {
        w.sched.0.borrow_mut().cgroups.insert((tid, "freezer".into()), "/".into());
    }
    let freezer_group = |w: &World, tid: i32| w.sched.0.borrow().cgroups[&(tid, "freezer".to_string())].clone();
    let out = vm.set_level(&mut w.host, Resource::Membw, Level::Throttled, 0);
    assert!(out.errors.is_empty() && out.changed == 1, "{out:?}");
    assert_eq!(freezer_group(&w, 502), "/cosched-membw-500");
    // The vCPU loses its name while frozen: no thread of the VM is a named vCPU now.
    fake::add_thread(&w.dir.path().join("proc"), PID, 502, "renamed");
    vm.refresh(&mut w.host);
    let out = vm.set_level(&mut w.host, Resource::Membw, Level::Throttled, 0);
    assert_eq!(out.errors, [crate::actuator::membw::UNNAMED_VCPUS.to_string()], "{out:?}");
    for tid in [500, 501, 502, 503, 504] {
        assert_eq!(freezer_group(&w, tid), "/", "thread {tid}: the renamed vCPU back, and nobody else taken");
    }
    assert_eq!(vm.in_force(&mut w.host, Resource::Membw), None, "nothing held");
    // Let run and throttled again: still nothing moves, and it says so each time.
    vm.set_level(&mut w.host, Resource::Membw, Level::Normal, 0);
    let out = vm.set_level(&mut w.host, Resource::Membw, Level::Throttled, 0);
    assert_eq!((out.errors.len(), out.changed), (1, 0), "{out:?}");
    // The restore removes the group it made.
    w.end(vm, false);
    assert!(!w.cg().join("freezer/cosched-membw-500").exists());
    assert!(w.records().is_empty());
}

/// A v1 freezer group whose thread does not freeze (a vCPU in uninterruptible sleep keeps it
/// `FREEZING`): the throttle returns at once, the regulator counts the VM throttled but not
/// stopped until the group reads `FROZEN`, the period's end lets it run all the same, and a
/// restore while it is `FREEZING` moves it back and removes the group.
#[test]
fn membw_throttle_on_a_freezing_v1_group_is_not_a_stop_and_nothing_waits_for_it() {
    use cosched_core::{Regulator, RegulatorConfig, VmId};
    const MS: u64 = 1_000_000;
    for crash in [false, true] {
        let mut w = World::new();
        let mut vm = freezer_vm(&mut w);
        let id = VmId(1);
        let mut reg = Regulator::new(
            RegulatorConfig { guaranteed_mbps: 1000, period_ns: 10 * MS, reclaim: false, best_effort: false },
            0,
        );
        reg.add(id, 100).unwrap();
        let state = w.cg().join("freezer/cosched-membw-500/freezer.state");
        // The regulator stops the VM (1 MB budget, 2 MB moved): the vCPU moves into the frozen
        // group, and the kernel has not frozen it yet.
        let mut decisions = Vec::new();
        reg.step(2 * MS, &[(id, 2_000_000)], &mut decisions);
        assert_eq!(decisions, vec![(id, true)]);
        let t = std::time::Instant::now();
        let out = vm.set_level(&mut w.host, Resource::Membw, Level::Throttled, 0);
        assert!(out.errors.is_empty() && out.changed == 1, "{out:?}");
        assert!(t.elapsed() < std::time::Duration::from_secs(1), "no wait for the freeze");
        assert_eq!(w.sched.0.borrow().cgroups[&(502, "freezer".to_string())], "/cosched-membw-500");
        fs::write(&state, "FREEZING\n").unwrap();
        assert_eq!(vm.in_force(&mut w.host, Resource::Membw), Some(false));
        let in_force = |w: &mut World, vm: &VmThreads| vm.in_force(&mut w.host, Resource::Membw);
        crate::membw::confirm_stops(&mut reg, 2 * MS, |_| in_force(&mut w, &vm));
        let v = reg.vm(id).unwrap();
        assert!(v.throttled() && !v.stopped(), "FREEZING: throttled, not stopped");
        // Still FREEZING at the next checks; then FROZEN: the stop counts from that check.
        crate::membw::confirm_stops(&mut reg, 4 * MS, |_| in_force(&mut w, &vm));
        assert!(!reg.vm(id).unwrap().stopped());
        fs::write(&state, "FROZEN\n").unwrap();
        crate::membw::confirm_stops(&mut reg, 6 * MS, |_| in_force(&mut w, &vm));
        assert!(reg.vm(id).unwrap().stopped());
        // The period ends: let run, then throttled again and left FREEZING.
        decisions.clear();
        reg.step(10 * MS, &[], &mut decisions);
        assert_eq!(decisions, vec![(id, false)]);
        vm.set_level(&mut w.host, Resource::Membw, Level::Normal, 0);
        assert_eq!(vm.in_force(&mut w.host, Resource::Membw), None, "nothing held");
        let s = &reg.vm(id).unwrap().stats;
        assert_eq!((s.throttled_ns, s.stopping_ns, s.unconfirmed_throttles), (4 * MS, 4 * MS, 0));
        reg.step(11 * MS, &[(id, 2_000_000)], &mut decisions);
        vm.set_level(&mut w.host, Resource::Membw, Level::Throttled, 0);
        fs::write(&state, "FREEZING\n").unwrap();
        crate::membw::confirm_stops(&mut reg, 12 * MS, |_| in_force(&mut w, &vm));
        decisions.clear();
        reg.step(20 * MS, &[], &mut decisions);
        assert_eq!(decisions, vec![(id, false)], "never frozen: let run at the period's end all the same");
        let s = &reg.vm(id).unwrap().stats;
        assert_eq!((s.throttles, s.throttled_ns, s.unconfirmed_throttles), (2, 4 * MS, 1));
        // Restored while FREEZING (at the VM's end, or after a crash): moved back, group gone.
        w.end(vm, crash);
        assert_eq!(w.sched.0.borrow().cgroups[&(502, "freezer".to_string())], "/");
        assert!(!w.cg().join("freezer/cosched-membw-500").exists(), "crash {crash}");
        assert!(w.records().is_empty());
    }
}

/// cgroup v2: the VM's own group is frozen through `cgroup.freeze`, in force once its
/// `cgroup.events` says `frozen 1`; `kill -9` while frozen, and the restore writes 0 back.
#[test]
fn membw_throttle_v2_freezes_the_vms_own_group_and_a_crash_thaws_it() {
    let mut w = World::new();
    w.v2_tree("");
    let group = w.cg().join("machine.slice/vm1.scope");
    fs::write(group.join("cgroup.freeze"), "0\n").unwrap();
    fs::write(group.join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
    let process = w.host.procfs.process(PID).unwrap().task;
    let lever = ThrottleLever::Freezer(FreezerKind::V2);
    let mut vm = VmThreads::new("vm1", process, &mut w.host, vec![Box::new(KnobActuator::throttle(&lever))]).unwrap();
    let out = vm.set_level(&mut w.host, Resource::Membw, Level::Throttled, 0);
    assert!(out.errors.is_empty() && out.changed == 1, "{out:?}");
    assert_eq!(fs::read_to_string(group.join("cgroup.freeze")).unwrap(), "1");
    assert_eq!(vm.in_force(&mut w.host, Resource::Membw), Some(false), "frozen 0: not yet");
    fs::write(group.join("cgroup.events"), "populated 1\nfrozen 1\n").unwrap();
    assert_eq!(vm.in_force(&mut w.host, Resource::Membw), Some(true));
    assert_eq!(w.group(503), "/", "no thread moves in v2");
    let rec = &w.records()[0];
    assert!(rec.entries.iter().all(|e| e.layer == "membw") && rec.entries.len() == 1, "{rec:?}");
    vm.set_level(&mut w.host, Resource::Membw, Level::Normal, 0);
    assert_eq!(fs::read_to_string(group.join("cgroup.freeze")).unwrap(), "0");
    vm.set_level(&mut w.host, Resource::Membw, Level::Throttled, 0);
    drop(vm); // kill -9 while frozen
    w.restore_all();
    assert_eq!(fs::read_to_string(group.join("cgroup.freeze")).unwrap(), "0");
    assert!(group.is_dir(), "the VM's own group stays");
    assert!(w.records().is_empty());
}

/// `auto` takes the v1 freezer where it is bound, else v2 (at `<root>` or, on a hybrid host,
/// `<root>/unified`); `[membw] freezer` forces one, and says when it is not there.
#[test]
fn the_freezer_is_v1_where_bound_else_v2_unless_the_config_says() {
    use crate::membw::FreezerChoice::{Auto, V1, V2};
    let w = World::new();
    let cg = w.sched.cgroups().clone();
    let why = freezer(&cg, Auto).unwrap_err().to_string();
    assert!(why.contains("no cgroup v1 freezer hierarchy") && why.contains("no cgroup v2 hierarchy"), "{why}");
    assert!(freezer(&cg, V2)
        .unwrap_err()
        .to_string()
        .starts_with("[membw] freezer = \"v2\" but there is no cgroup v2"));
    fs::create_dir_all(w.cg().join("unified")).unwrap();
    fs::write(w.cg().join("unified/cgroup.controllers"), "").unwrap();
    assert_eq!((freezer(&cg, Auto), freezer(&cg, V2)), (Ok(FreezerKind::V2), Ok(FreezerKind::V2)));
    assert!(freezer(&cg, V1)
        .unwrap_err()
        .to_string()
        .starts_with("[membw] freezer = \"v1\" but there is no cgroup v1 freezer"));
    fs::create_dir_all(w.cg().join("freezer")).unwrap();
    fs::write(w.cg().join("freezer/tasks"), "").unwrap();
    assert_eq!(freezer(&cg, Auto), Ok(FreezerKind::V1), "a hybrid host: v1 where it is bound");
    assert_eq!((freezer(&cg, V1), freezer(&cg, V2)), (Ok(FreezerKind::V1), Ok(FreezerKind::V2)));
}
