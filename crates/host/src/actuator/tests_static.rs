//! The static shield on a fake cgroup v2 tree (this host has cpusets only in v1, tested as root
//! in crates/cli/tests/root.rs): the vCPUs' threaded group and its partition, accepted or
//! refused by the kernel, and the restore by the VM's own undo and after a crash.

use std::fs;

use cosched_procfs::fake;

use super::tests::FakeSched;
use super::*;
use crate::cgroup::CgroupFs;
use crate::shield::Cpus;
use crate::store::restore_all;

const PID: i32 = 500;
const SCOPE: &str = "/machine.slice/vm1.scope";
const ALL: [usize; 4] = [0, 1, 2, 3];

struct World {
    dir: tempfile::TempDir,
    host: Host,
    sched: FakeSched,
}

impl World {
    /// A QEMU (main loop, RCU thread, one vCPU, a worker) in its v2 scope, every thread on all
    /// four CPUs; another process beside it. The v2 root has the cpuset controller.
    fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        fake::add_process(
            &proc,
            PID,
            "/usr/bin/qemu-system-x86_64",
            &[(PID, "qemu-system-x86"), (501, "call_rcu"), (502, "CPU 0/TCG"), (503, "worker")],
        );
        fake::add_process(&proc, 900, "/usr/bin/bash", &[(900, "bash")]);
        let cg = dir.path().join("cg");
        fs::create_dir_all(cg.join(&SCOPE[1..])).unwrap();
        fs::write(cg.join("cgroup.controllers"), "cpuset cpu io memory pids\n").unwrap();
        fs::write(cg.join("cpuset.cpus.effective"), "0-3\n").unwrap();
        let sched = FakeSched(Default::default(), CgroupFs::new(&proc, &cg));
        for tid in [500, 501, 502, 503, 900] {
            let mut st = sched.0.borrow_mut();
            st.attrs.insert(tid, crate::sched::SchedAttr::other(0, 0));
            st.affinity.insert(tid, ALL.to_vec());
            st.cgroups.insert((tid, "".into()), SCOPE.into());
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

    fn vm(&mut self) -> VmThreads {
        let process = self.host.procfs.process(PID).unwrap().task;
        VmThreads::new("vm1", process, &mut self.host, vec![]).unwrap()
    }

    /// The vCPU group's directory in the fake tree.
    fn group_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("cg").join(&SCOPE[1..]).join(format!("cosched-shield-{PID}"))
    }

    fn affinity(&self, tid: i32) -> Vec<usize> {
        self.sched.0.borrow().affinity[&tid].clone()
    }

    fn group(&self, tid: i32) -> String {
        self.sched.0.borrow().cgroups[&(tid, String::new())].clone()
    }

    /// Every thread back where it was, and the group gone.
    fn assert_restored(&self) {
        for tid in [500, 501, 502, 503, 900] {
            assert_eq!(self.affinity(tid), ALL, "thread {tid}");
            assert_eq!(self.group(tid), SCOPE, "thread {tid}");
        }
        assert!(!self.group_dir().exists(), "the vCPU group is removed");
    }
}

fn shield_plan() -> StaticPlan {
    let cpus = |v: &[usize]| v.iter().copied().collect::<Cpus>();
    StaticPlan {
        fifo: None,
        guarded: None,
        shield: Some(ShieldPlan { vcpus: cpus(&[3]), housekeeping: cpus(&[0, 1, 2]) }),
    }
}

#[test]
fn v2_shield_puts_the_vcpus_in_a_threaded_isolated_partition_and_the_rest_on_housekeeping() {
    let mut w = World::new();
    let mut vm = w.vm();
    let out = vm.set_static(&mut w.host, &shield_plan());
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let g = w.group_dir();
    let read = |f: &str| fs::read_to_string(g.join(f)).unwrap().trim().to_string();
    assert_eq!(read("cgroup.type"), "threaded", "a group of threads, not of processes");
    assert_eq!(read("cpuset.cpus"), "3");
    assert_eq!(read("cpuset.cpus.partition"), "isolated");
    assert_eq!(w.group(502), format!("{SCOPE}/cosched-shield-{PID}"), "the vCPU moved in (cgroup.threads)");
    assert_eq!(w.affinity(502), [3]);
    for tid in [500, 501, 503] {
        assert_eq!(w.group(tid), SCOPE, "thread {tid} stays in the VM's group");
        assert_eq!(w.affinity(tid), [0, 1, 2], "thread {tid} on the housekeeping CPUs");
    }
    assert_eq!(w.affinity(900), ALL, "another process is never touched");
    assert!(vm.static_notes().is_empty(), "{:?}", vm.static_notes());
    // The operator turns it off: everything back, the group gone.
    let out = vm.set_static(&mut w.host, &StaticPlan::default());
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    w.assert_restored();
}

#[test]
fn v2_partition_refused_by_the_kernel_is_reported_the_shield_goes_on_and_a_crash_is_restored() {
    let mut w = World::new();
    // The kernel refuses the partition (here: the write fails, as it does where cpuset.cpus.
    // partition is missing or the parent is no partition root).
    fs::create_dir_all(w.group_dir().join("cpuset.cpus.partition")).unwrap();
    let mut vm = w.vm();
    let out = vm.set_static(&mut w.host, &shield_plan());
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let notes = vm.static_notes().join("; ");
    assert!(notes.contains("partition refused by the kernel"), "{notes}");
    assert_eq!(w.affinity(502), [3], "the vCPU still has its CPU by affinity");
    assert_eq!(w.affinity(500), [0, 1, 2]);
    // kill -9: nothing undone by the daemon; the record on disk restores all.
    drop(vm);
    assert_eq!(w.affinity(502), [3]);
    let r = restore_all(&w.host.store, &w.host.procfs, w.host.sched.as_mut()).unwrap();
    assert!(r.errors.is_empty(), "{r:?}");
    w.assert_restored();
}

/// A VM that exits while shielded takes nothing of the daemon's with it: its vCPU group (which
/// holds its CPUs exclusively) stays named in the record, and the VM's restore, or the one after
/// a crash, removes it. (A daemon whose shielded VM had exited left `cosched-shield-<pid>`
/// behind, exclusive on its CPU in v1, and every later shield of that CPU was refused.)
#[test]
fn the_shield_group_is_removed_after_its_vm_has_exited() {
    for crash in [false, true] {
        let mut w = World::new();
        let mut vm = w.vm();
        let out = vm.set_static(&mut w.host, &shield_plan());
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        assert_eq!(w.group(502), format!("{SCOPE}/cosched-shield-{PID}"));
        // The VM exits (its process gone; the group holds no thread any more, as the kernel
        // empties it); the daemon finds its task directory gone.
        fs::remove_dir_all(w.dir.path().join(format!("proc/{PID}"))).unwrap();
        vm.refresh(&mut w.host);
        assert!(w.group_dir().is_dir(), "the group stays until the VM is restored");
        if crash {
            drop(vm);
            let r = restore_all(&w.host.store, &w.host.procfs, w.host.sched.as_mut()).unwrap();
            assert!(r.errors.is_empty(), "{r:?}");
        } else {
            let r = vm.restore(&mut w.host);
            assert!(r.errors.is_empty(), "{r:?}");
        }
        assert!(!w.group_dir().exists(), "crash {crash}: the shield group of an exited VM is removed");
        assert!(w.host.store.load_all().unwrap().is_empty(), "crash {crash}: the record is done");
    }
}
