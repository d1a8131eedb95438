//! The record a daemon leaves when it is killed with every layer on, and its restore: the
//! records in `testdata/state-v2/` were written by the daemon of format 2 as first released
//! (before the actuators shared one ledger), on the fake world built here. A daemon upgraded
//! after a crash must put back exactly what they say, and a daemon of this format must write
//! the same records for the same changes.
//!
//! `COSCHED_WRITE_TESTDATA=1 cargo test --release -p cosched-host tests_record` writes them
//! (it wrote them once, before the ledger). Never again into `state-v2/`: a new format gets a
//! new version, a directory of its own, and keeps this test for the old one.

use std::fs;
use std::path::{Path, PathBuf};

use cosched_procfs::fake;

use super::tests::FakeSched;
use super::*;
use crate::cgroup::CgroupFs;
use crate::sched::{SCHED_FIFO, SCHED_FLAG_RESET_ON_FORK};
use crate::shield::Cpus;
use crate::store::{restore_all, Entry, VmRecord};

/// VM `a`: CPU boost, I/O priority, v1 freezer throttle, static FIFO and shield (v1 cpuset).
const A: i32 = 500;
/// VM `b`: the I/O weight lever in v1 blkio.
const B: i32 = 600;
const BE4: u16 = 2 << 13 | 4;
const BE7: u16 = 2 << 13 | 7;
const RAISED: u16 = 1 << 13;
const ALL: [usize; 4] = [0, 1, 2, 3];

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/state-v2")
}

struct World {
    dir: tempfile::TempDir,
    host: Host,
    sched: FakeSched,
}

/// What each thread had before the daemon touched it: (tid, sched, ioprio, blkio group).
fn originals() -> Vec<(i32, SchedAttr, u16, &'static str)> {
    let other = |nice| SchedAttr::other(nice, 0);
    vec![
        (500, other(0), BE4, "/"),
        (501, other(5), BE4, "/"),
        (502, other(0), BE4, "/"),
        (503, other(0), BE4, "/"),
        (504, other(-3), BE4, "/"),
        (505, SchedAttr::rt(SCHED_FIFO, 10, 0), BE7, "/"),
        (506, other(0), BE4, "/"),
        (600, other(0), BE4, "/"),
        (601, other(0), BE4, "/"),
        (602, other(0), BE4, "/tenant"),
        (900, other(0), BE4, "/"),
    ]
}

impl World {
    /// Two QEMUs and a shell; v1 blkio (with BFQ), freezer and cpuset hierarchies.
    fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        fake::add_process(
            &proc,
            A,
            "/usr/bin/qemu-system-x86_64",
            &[
                (A, "qemu-system-x86"),
                (501, "call_rcu"),
                (502, "CPU 0/TCG"),
                (503, "CPU 1/TCG"),
                (504, "worker"),
                (505, "IO iot0"),
            ],
        );
        fake::add_process(
            &proc,
            B,
            "/usr/bin/qemu-system-x86_64",
            &[(B, "qemu-system-x86"), (601, "CPU 0/TCG"), (602, "worker")],
        );
        fake::add_process(&proc, 900, "/usr/bin/bash", &[(900, "bash")]);
        let cg = dir.path().join("cg");
        for h in ["blkio", "freezer", "cpuset", "cpuset/vm1", "blkio/tenant"] {
            fs::create_dir_all(cg.join(h)).unwrap();
            fs::write(cg.join(h).join("tasks"), "").unwrap();
        }
        fs::write(cg.join("blkio/blkio.bfq.io_service_bytes"), "").unwrap();
        fs::write(cg.join("cpuset/cpuset.effective_cpus"), "0-3\n").unwrap();
        fs::write(cg.join("cpuset/vm1/cpuset.mems"), "0\n").unwrap();
        let sched = FakeSched(Default::default(), CgroupFs::new(&proc, &cg));
        for (tid, attr, ioprio, blkio) in originals() {
            let mut st = sched.0.borrow_mut();
            st.attrs.insert(tid, attr);
            st.ioprio.insert(tid, ioprio);
            st.affinity.insert(tid, ALL.to_vec());
            st.cgroups.insert((tid, "blkio".into()), blkio.into());
            st.cgroups.insert((tid, "freezer".into()), "/".into());
            st.cgroups.insert((tid, "cpuset".into()), if tid / 100 == 5 { "/vm1" } else { "/" }.into());
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

    fn cg(&self) -> PathBuf {
        self.dir.path().join("cg")
    }

    fn proc(&self) -> PathBuf {
        self.dir.path().join("proc")
    }

    fn group(&self, tid: i32, h: &str) -> String {
        self.sched.0.borrow().cgroups[&(tid, h.to_string())].clone()
    }

    /// Every layer on, then `kill -9`: the records the daemon leaves, by file name.
    fn boost_everything_and_die(&mut self) -> Vec<(String, VmRecord)> {
        let task = |w: &World, pid| w.host.procfs.process(pid).unwrap().task;
        let acts: Vec<Box<dyn Actuator>> = vec![
            Box::new(CpuActuator::new(BoostClass::default())),
            Box::new(KnobActuator::io(&IoBoost::default(), None)),
            Box::new(KnobActuator::throttle(&ThrottleLever::Freezer(FreezerKind::V1))),
        ];
        let mut a = VmThreads::new("a", task(self, A), &mut self.host, acts).unwrap();
        for (r, level) in
            [(Resource::Cpu, Level::Boosted), (Resource::Io, Level::Boosted), (Resource::Membw, Level::Throttled)]
        {
            let out = a.set_level(&mut self.host, r, level, 1);
            assert!(out.errors.is_empty(), "{r}: {out:?}");
        }
        let cpus = |v: &[usize]| v.iter().copied().collect::<Cpus>();
        let plan = StaticPlan {
            fifo: Some((97, 98)),
            guarded: None,
            shield: Some(ShieldPlan { vcpus: cpus(&[3]), housekeeping: cpus(&[0, 1, 2]) }),
        };
        let out = a.set_static(&mut self.host, &plan);
        assert!(out.errors.is_empty() && a.static_notes().is_empty(), "{out:?} {:?}", a.static_notes());
        // A worker born of a raised thread (its I/O priority inherited), and a vCPU that exits
        // in the frozen and the shield groups.
        fake::add_thread(&self.proc(), A, 506, "worker");
        self.sched.0.borrow_mut().ioprio.insert(506, RAISED);
        fake::remove_thread(&self.proc(), A, 503);
        let out = a.refresh(&mut self.host);
        assert!(out.errors.is_empty(), "{out:?}");
        let acts: Vec<Box<dyn Actuator>> = vec![Box::new(KnobActuator::io(
            &IoBoost { lever: IoLever::Weight, weight: 800, ..IoBoost::default() },
            Some(WeightHierarchy::V1),
        ))];
        let mut b = VmThreads::new("b", task(self, B), &mut self.host, acts).unwrap();
        let out = b.set_level(&mut self.host, Resource::Io, Level::Boosted, 1);
        assert!(out.errors.is_empty(), "{out:?}");
        drop((a, b)); // kill -9: nothing put back
        let mut recs: Vec<(String, VmRecord)> = self
            .host
            .store
            .load_all()
            .unwrap()
            .into_iter()
            .map(|(p, r)| (p.file_name().unwrap().to_string_lossy().into_owned(), r.unwrap()))
            .collect();
        recs.sort_by(|x, y| x.0.cmp(&y.0));
        recs
    }

    /// What the dead daemon left on the threads (checked before the restore).
    fn assert_left_changed(&self) {
        let st = self.sched.0.borrow();
        let fifo = |p| SchedAttr::rt(SCHED_FIFO, p, SCHED_FLAG_RESET_ON_FORK);
        assert_eq!((st.attrs[&500], st.attrs[&502], st.attrs[&506]), (fifo(98), fifo(97), fifo(98)));
        assert_eq!(st.attrs[&505], SchedAttr::rt(SCHED_FIFO, 10, 0), "someone else's RT class never lowered");
        assert_eq!(st.attrs[&601], SchedAttr::other(0, 0), "VM b has no CPU layer");
        assert_eq!(
            (st.ioprio[&500], st.ioprio[&504], st.ioprio[&505], st.ioprio[&506]),
            (RAISED, RAISED, RAISED, RAISED)
        );
        assert_eq!(
            (st.affinity[&502].as_slice(), st.affinity[&500].as_slice()),
            ([3].as_slice(), [0, 1, 2].as_slice())
        );
        drop(st);
        assert_eq!(self.group(502, "freezer"), "/cosched-membw-500");
        assert_eq!(self.group(502, "cpuset"), "/vm1/cosched-shield-500");
        assert_eq!(
            (self.group(600, "blkio"), self.group(602, "blkio")),
            ("/cosched-io-600".into(), "/tenant/cosched-io-600".into())
        );
    }

    /// Everything as it was before the daemon, and nothing of the daemon's left.
    fn assert_restored(&self) {
        let st = self.sched.0.borrow();
        for (tid, attr, ioprio, blkio) in originals() {
            if tid == 503 {
                continue; // gone
            }
            assert_eq!(st.attrs[&tid], attr, "thread {tid}");
            assert_eq!(st.ioprio[&tid], ioprio, "thread {tid}");
            assert_eq!(st.affinity[&tid], ALL, "thread {tid}");
            assert_eq!(st.cgroups[&(tid, "blkio".to_string())], blkio, "thread {tid}");
            assert_eq!(st.cgroups[&(tid, "freezer".to_string())], "/", "thread {tid}");
            let cpuset = if tid / 100 == 5 { "/vm1" } else { "/" };
            assert_eq!(st.cgroups[&(tid, "cpuset".to_string())], cpuset, "thread {tid}");
        }
        drop(st);
        for g in [
            "freezer/cosched-membw-500",
            "cpuset/vm1/cosched-shield-500",
            "blkio/cosched-io-600",
            "blkio/tenant/cosched-io-600",
        ] {
            assert!(!self.cg().join(g).exists(), "{g} removed");
        }
        assert!(
            self.cg().join("blkio/tenant").is_dir() && self.cg().join("cpuset/vm1").is_dir(),
            "the operator's groups stay"
        );
        assert!(self.host.store.load_all().unwrap().is_empty(), "records done");
    }
}

/// A record's entries in a fixed order: the record's order is not part of its meaning.
fn sorted(rec: &VmRecord) -> Vec<String> {
    let mut v: Vec<String> = rec.entries.iter().map(|e: &Entry| serde_json::to_string(e).unwrap()).collect();
    v.sort();
    v
}

#[test]
fn this_daemon_writes_the_records_of_format_2_as_they_were_first_written() {
    let mut w = World::new();
    let recs = w.boost_everything_and_die();
    assert_eq!(recs.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), ["500-1500.json", "600-1600.json"]);
    if std::env::var_os("COSCHED_WRITE_TESTDATA").is_some() {
        fs::create_dir_all(testdata()).unwrap();
        for (name, rec) in &recs {
            fs::write(testdata().join(name), serde_json::to_vec_pretty(rec).unwrap()).unwrap();
        }
    }
    for (name, rec) in &recs {
        let committed: VmRecord = serde_json::from_slice(&fs::read(testdata().join(name)).unwrap()).unwrap();
        assert_eq!(committed.version, crate::store::STATE_VERSION);
        assert_eq!((&committed.vm, committed.process), (&rec.vm, rec.process));
        assert_eq!(sorted(&committed), sorted(rec), "{name}");
    }
}

#[test]
fn records_of_format_2_written_before_the_ledger_are_restored_exactly() {
    let mut w = World::new();
    w.boost_everything_and_die();
    w.assert_left_changed();
    // The dead daemon's records are the committed ones.
    for e in fs::read_dir(w.host.store.path()).unwrap() {
        fs::remove_file(e.unwrap().path()).unwrap();
    }
    for name in ["500-1500.json", "600-1600.json"] {
        fs::copy(testdata().join(name), w.host.store.path().join(name)).unwrap();
    }
    let r = restore_all(&w.host.store, &w.host.procfs, w.host.sched.as_mut()).unwrap();
    assert!(r.errors.is_empty(), "{r:?}");
    w.assert_restored();
    let again = restore_all(&w.host.store, &w.host.procfs, w.host.sched.as_mut()).unwrap();
    assert_eq!(again, Default::default(), "nothing left to do");
}
