//! The ledger on a fake kind of setting (its state machine alone), and each real kind applied
//! through a ledger and put back by the crash restore from the ledger's record: the restore is
//! the inverse of the apply.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::rc::Rc;

use cosched_procfs::fake;

use super::ledger::{Applied, Ledger, Newcomer};
use super::tests::FakeSched;
use super::*;
use crate::cgroup::{CgroupFs, IO_GROUP_PREFIX};
use crate::sched::{SCHED_FLAG_RESET_ON_FORK, SCHED_RR};
use crate::settings::{AffinityKind, CgroupKind, GroupValueKind, IoprioKind, Kind, OwnGroups, SchedKind};
use crate::store::{restore_record, Setting};

const PID: i32 = 700;

/// A number per thread, kept by the test; threads without one are gone. Values from 100 up
/// stand for groups of the daemon's making.
#[derive(Debug, Default, Clone)]
struct Num {
    values: Rc<RefCell<BTreeMap<i32, u16>>>,
    reads: Rc<RefCell<u32>>,
    refuse: Rc<RefCell<Option<u16>>>,
}

impl Kind for Num {
    type V = u16;
    fn label(&self) -> &'static str {
        "num"
    }
    fn get(&self, _: &mut dyn ThreadOps, tid: i32) -> io::Result<u16> {
        *self.reads.borrow_mut() += 1;
        self.values.borrow().get(&tid).copied().ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))
    }
    fn set(&self, _: &mut dyn ThreadOps, tid: i32, v: &u16) -> io::Result<()> {
        if *self.refuse.borrow() == Some(*v) {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        match self.values.borrow_mut().get_mut(&tid) {
            Some(slot) => {
                *slot = *v;
                Ok(())
            }
            None => Err(io::Error::from_raw_os_error(libc::ESRCH)),
        }
    }
    fn show(&self, v: &u16) -> String {
        v.to_string()
    }
    fn record(&self, original: &u16, applied: &[u16]) -> Setting {
        Setting::Ioprio { original: *original, applied: applied.to_vec() }
    }
    fn parse_record(&self, s: &Setting) -> Option<(u16, Vec<u16>)> {
        IoprioKind.parse_record(s)
    }
    fn creates(&self, v: &u16) -> bool {
        *v >= 100
    }
}

struct World {
    dir: tempfile::TempDir,
    host: Host,
    num: Num,
}

impl World {
    /// A QEMU (main loop, a vCPU, a worker), every thread at 1; a v1 blkio tree and a v2 tree
    /// (its own scope) for the group kinds.
    fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        fake::add_process(
            &proc,
            PID,
            "/usr/bin/qemu-system-x86_64",
            &[(PID, "qemu-system-x86"), (701, "CPU 0/TCG"), (702, "worker")],
        );
        let cg = dir.path().join("cg");
        fs::create_dir_all(cg.join("blkio")).unwrap();
        fs::write(cg.join("blkio/tasks"), "").unwrap();
        fs::create_dir_all(cg.join("vm.scope")).unwrap();
        fs::write(cg.join("cgroup.controllers"), "cpuset io\n").unwrap();
        fs::write(cg.join("vm.scope/cgroup.procs"), format!("{PID}\n")).unwrap();
        fs::write(cg.join("vm.scope/io.bfq.weight"), "default 100\n").unwrap();
        fs::write(cg.join("vm.scope/cgroup.freeze"), "0\n").unwrap();
        let sched = FakeSched(Default::default(), CgroupFs::new(&proc, &cg));
        let num = Num::default();
        for tid in [PID, 701, 702] {
            num.values.borrow_mut().insert(tid, 1);
            let mut st = sched.0.borrow_mut();
            st.attrs.insert(tid, SchedAttr::other(0, 0));
            st.ioprio.insert(tid, 2 << 13 | 4);
            st.affinity.insert(tid, vec![0, 1]);
            st.cgroups.insert((tid, "blkio".into()), "/".into());
            st.cgroups.insert((tid, "".into()), "/vm.scope".into());
        }
        let host = Host {
            procfs: ProcFs::new(&proc),
            sched: Box::new(sched.clone()),
            store: StateDir::open(dir.path().join("state")).unwrap(),
            fresh: std::time::Duration::ZERO,
            verify: std::time::Duration::ZERO,
            syscall_ns: 0,
        };
        World { dir, host, num }
    }

    fn threads(&self) -> Threads {
        Threads::new(self.host.procfs.process(PID).unwrap().task, &self.host.procfs).unwrap()
    }

    fn num(&self, tid: i32) -> u16 {
        self.num.values.borrow()[&tid]
    }

    fn put(&self, tid: i32, v: u16) {
        self.num.values.borrow_mut().insert(tid, v);
    }

    /// A ledger of the fake kind over every thread, following the list as it is.
    fn ledger(&mut self, threads: &Threads) -> Ledger<Num> {
        let mut l = Ledger::new(self.num.clone(), "test");
        let mut out = Outcome::default();
        assert!(l.follow(self.host.sched.as_mut(), threads, |_| true, Newcomer::Present, &mut out));
        assert_eq!(out, Outcome::default());
        l
    }
}

fn entries<K: Kind>(l: &Ledger<K>) -> Vec<Entry> {
    let mut v = Vec::new();
    l.entries(&mut v);
    v
}

#[test]
fn the_ledger_records_what_it_may_set_before_it_sets_it_and_undoes_exactly() {
    let mut w = World::new();
    w.put(702, 3);
    let threads = w.threads();
    let mut l = w.ledger(&threads);
    // Following an unchanged list again reads nothing.
    let reads = *w.num.reads.borrow();
    assert!(!l.follow(w.host.sched.as_mut(), &threads, |_| true, Newcomer::Present, &mut Outcome::default()));
    assert_eq!(*w.num.reads.borrow(), reads);
    assert!(entries(&l).is_empty(), "nothing recorded before anything may be set");
    // Raise the vCPU to 5 and the worker to 6: noted as values we may set, before the change.
    let want = |s: &ledger::Slot<u16>| match s.role {
        ThreadRole::Vcpu => Some(5),
        ThreadRole::Worker => Some(6),
        _ => None,
    };
    let p = l.prepare(want);
    assert!(p.changed && p.sets);
    assert_eq!(w.num(701), 1, "prepare sets nothing");
    let rec = entries(&l);
    assert_eq!(rec.len(), 2);
    assert_eq!(rec[1].setting, Setting::Ioprio { original: 3, applied: vec![6] });
    assert!(!l.prepare(want).changed, "the same values again: the record stands");
    let (mut out, mut gone) = (Outcome::default(), Vec::new());
    l.apply(&mut w.host, &mut out, &mut gone);
    assert_eq!((out.changed, w.num(PID), w.num(701), w.num(702)), (2, 1, 5, 6));
    assert_eq!(l.show(701), Some(("num", "5".into(), true)));
    assert_eq!(l.show(PID), Some(("num", "1".into(), false)));
    // Applying again changes nothing; back to the originals, exactly.
    let mut out = Outcome::default();
    l.apply(&mut w.host, &mut out, &mut gone);
    assert_eq!(out.changed, 0);
    assert!(!l.prepare(|_| None).sets);
    l.apply(&mut w.host, &mut out, &mut gone);
    assert_eq!((out.changed, w.num(701), w.num(702)), (2, 1, 3));
    assert_eq!(entries(&l).len(), 2, "what we may set stays recorded until restored");
    l.restored();
    assert!(entries(&l).is_empty() && !l.active());
}

#[test]
fn the_ledger_takes_in_what_someone_else_changed() {
    let mut w = World::new();
    let threads = w.threads();
    let mut l = w.ledger(&threads);
    l.prepare(|s| (s.role == ThreadRole::Vcpu).then_some(5));
    l.apply(&mut w.host, &mut Outcome::default(), &mut Vec::new());
    // The operator changes the vCPU (ours) and the worker (its own) meanwhile.
    w.put(701, 9);
    w.put(702, 7);
    let mut out = Outcome::default();
    assert!(l.verify(w.host.sched.as_mut(), |_, _| true, &mut out), "originals moved");
    assert_eq!(out.foreign, 1);
    assert_eq!((l.slot(701).unwrap().original, l.slot(701).unwrap().applied), (9, None), "we let go");
    assert_eq!(l.slot(702).unwrap().original, 7, "its own value is its original now");
    // Undoing leaves the other's change; a pick leaves threads unread.
    l.prepare(|_| None);
    l.apply(&mut w.host, &mut out, &mut Vec::new());
    assert_eq!((w.num(701), w.num(702)), (9, 7));
    w.put(702, 8);
    assert!(!l.verify(w.host.sched.as_mut(), |tid, _| tid != 702, &mut out));
}

#[test]
fn a_thread_born_of_a_raised_one_is_ours_to_put_back_and_a_gone_one_keeps_our_groups_recorded() {
    let mut w = World::new();
    let mut threads = w.threads();
    let mut l = w.ledger(&threads);
    // Every thread into "group" 100 (of the daemon's making), refused for the worker at first.
    *w.num.refuse.borrow_mut() = Some(100);
    l.prepare(|s| (s.role != ThreadRole::Main).then_some(100));
    let (mut out, mut gone) = (Outcome::default(), Vec::new());
    l.apply(&mut w.host, &mut out, &mut gone);
    assert_eq!(
        out.errors,
        ["setting num 100 on thread 701: Operation not permitted (os error 1)".to_string(), {
            "setting num 100 on thread 702: Operation not permitted (os error 1)".to_string()
        }]
    );
    *w.num.refuse.borrow_mut() = None;
    l.apply(&mut w.host, &mut Outcome::default(), &mut gone);
    // Two workers appear: one born of a raised thread (it has our 100), one not.
    fake::add_thread(&w.dir.path().join("proc"), PID, 703, "worker");
    fake::add_thread(&w.dir.path().join("proc"), PID, 704, "worker");
    w.put(703, 100);
    w.put(704, 2);
    threads.rescan(&w.host.procfs).unwrap();
    let born = |cur: &u16, main: Option<&u16>| if *cur == 100 { *main.unwrap() } else { *cur };
    assert!(l.follow(w.host.sched.as_mut(), &threads, |_| true, Newcomer::Born(&born), &mut out));
    let s = l.slot(703).unwrap();
    assert_eq!((s.original, s.applied, s.may_apply.as_slice()), (1, Some(100), [100].as_slice()));
    assert_eq!((l.slot(704).unwrap().original, l.slot(704).unwrap().applied), (2, None));
    // The vCPU and a worker exit: the one applying finds them gone; group 100 stays named in
    // the record once, so that a restore removes it.
    w.num.values.borrow_mut().remove(&701);
    w.num.values.borrow_mut().remove(&702);
    l.prepare(|_| None);
    let mut gone = Vec::new();
    l.apply(&mut w.host, &mut Outcome::default(), &mut gone);
    assert_eq!(gone, [701, 702]);
    assert!(l.slot(701).is_none());
    let rec = entries(&l);
    let named: Vec<i32> = rec.iter().filter(|e| e.task.id <= 702).map(|e| e.task.id).collect();
    assert_eq!(named, [701], "one retired entry per value of ours: {rec:?}");
    assert_eq!(w.num(703), 1, "the born thread went back to its creator's original");
}

#[test]
fn a_record_taken_back_in_holds_what_is_still_ours() {
    let mut w = World::new();
    w.put(701, 5); // still what the dead daemon set
    w.put(702, 8); // changed by someone since
    let threads = w.threads();
    let mut l = w.ledger(&threads);
    let task = |tid| threads.get(tid).unwrap().task;
    let entry = |tid, layer: &str| Entry {
        task: task(tid),
        layer: layer.into(),
        setting: Setting::Ioprio { original: 1, applied: vec![5] },
    };
    l.resume(&[entry(701, "test"), entry(702, "test"), entry(PID, "other layer")]);
    assert_eq!(l.slot(701).map(|s| (s.original, s.applied)), Some((1, Some(5))));
    assert_eq!(l.slot(702).map(|s| (s.original, s.applied)), Some((1, None)));
    assert_eq!(l.slot(PID).map(|s| s.may_apply.len()), Some(0), "another layer's entry is not this one's");
    l.prepare(|_| None);
    l.apply(&mut w.host, &mut Outcome::default(), &mut Vec::new());
    assert_eq!((w.num(701), w.num(702)), (1, 8));
}

/// Applies `raised` to the main thread through a ledger of `kind`, saves the ledger's record,
/// and restores it as after a crash: the thread has its original again. A second round where
/// someone else changed it after us (`foreign`) leaves their value.
fn restore_is_the_inverse_of_apply<K: Kind + Clone>(w: &mut World, kind: K, raised: K::V, foreign: K::V) {
    fn ops(w: &mut World) -> &mut dyn ThreadOps {
        w.host.sched.as_mut()
    }
    let original = kind.get(ops(w), PID).unwrap();
    assert_ne!(original, raised);
    for someone_else in [false, true] {
        let threads = w.threads();
        let mut l = Ledger::new(kind.clone(), "io");
        let main = |t: &cosched_procfs::ThreadInfo| t.task.id == PID;
        l.follow(ops(w), &threads, main, Newcomer::Present, &mut Outcome::default());
        assert!(l.prepare(|_| Some(raised.clone())).sets);
        let mut out = Outcome::default();
        l.apply(&mut w.host, &mut out, &mut Vec::new());
        assert!(out.errors.is_empty() && out.changed == 1, "{out:?}");
        assert!(kind.same(&kind.get(ops(w), PID).unwrap(), &raised), "{kind:?} applied");
        if someone_else {
            kind.set(ops(w), PID, &foreign).unwrap();
        }
        let rec = VmRecord::new("vm", threads.process, entries(&l));
        w.host.store.save(&rec).unwrap();
        let saved = w.host.store.load(threads.process).unwrap().unwrap();
        let r = restore_record(&saved, &w.host.procfs, w.host.sched.as_mut());
        assert!(r.errors.is_empty(), "{r:?}");
        let now = kind.get(ops(w), PID).unwrap();
        if someone_else {
            assert_eq!((r.restored, r.untouched), (0, 1), "{kind:?}");
            assert!(kind.same(&now, &foreign), "{kind:?}: someone else's value stays");
            kind.set(ops(w), PID, &original).unwrap();
        } else {
            assert_eq!((r.restored, r.untouched), (1, 0), "{kind:?}");
            assert!(kind.same(&now, &original), "{kind:?}: {now:?} is not the original {original:?}");
        }
    }
}

#[test]
fn each_kind_of_setting_is_restored_by_the_crash_restore_exactly_as_it_was_before_the_apply() {
    let mut w = World::new();
    let rr = |p| SchedAttr::rt(SCHED_RR, p, SCHED_FLAG_RESET_ON_FORK);
    restore_is_the_inverse_of_apply(&mut w, SchedKind, rr(1), rr(7));
    restore_is_the_inverse_of_apply(&mut w, IoprioKind, 1 << 13, 3 << 13);
    restore_is_the_inverse_of_apply(&mut w, AffinityKind, vec![1], vec![0]);
    // A group of the daemon's, made (weighted) at the first move, and removed by the restore.
    let own = OwnGroups { prefix: IO_GROUP_PREFIX, made_with: Some(("blkio.bfq.weight", "800".into())) };
    let group = format!("/{IO_GROUP_PREFIX}{PID}");
    restore_is_the_inverse_of_apply(&mut w, CgroupKind::new("blkio", Some(own)), group.clone(), "/other".into());
    assert!(!w.dir.path().join("cg/blkio").join(&group[1..]).exists(), "removed by the restore");
    for (file, label, raised) in [("io.bfq.weight", "io_weight", 1000), ("cgroup.freeze", "freeze", 1)] {
        let kind = GroupValueKind::own_v2(file, label, "test");
        let scope = "/vm.scope".to_string();
        restore_is_the_inverse_of_apply(&mut w, kind, (scope.clone(), raised), (scope, raised + 1));
    }
    assert_eq!(fs::read_to_string(w.dir.path().join("cg/vm.scope/io.bfq.weight")).unwrap(), "default 100");
    assert_eq!(fs::read_to_string(w.dir.path().join("cg/vm.scope/cgroup.freeze")).unwrap(), "0");
}

#[test]
fn apply_one_says_what_it_did() {
    let mut w = World::new();
    let threads = w.threads();
    let mut l = w.ledger(&threads);
    l.prepare(|s| (s.role == ThreadRole::Vcpu).then_some(4));
    assert!(matches!(l.apply_one(w.host.sched.as_mut(), PID), Applied::Unchanged));
    assert!(matches!(l.apply_one(w.host.sched.as_mut(), 701), Applied::Set(4)));
    assert!(matches!(l.apply_one(w.host.sched.as_mut(), 701), Applied::Unchanged));
    l.prepare(|_| None);
    w.num.values.borrow_mut().remove(&701);
    assert!(matches!(l.apply_one(w.host.sched.as_mut(), 701), Applied::Gone));
}

/// A thread that stops being a member while it has a value of ours (a vCPU that loses its name
/// while frozen: the throttle's lever takes named vCPUs only) is put back, then let go of; one
/// that stops being a member with nothing of ours is let go of at once. Before, both were
/// dropped as they were: a frozen thread stayed frozen, with nothing left to thaw it.
#[test]
fn a_thread_that_stops_being_a_member_while_changed_is_put_back_then_let_go() {
    let mut w = World::new();
    let mut threads = w.threads();
    let mut l = Ledger::new(w.num.clone(), "test");
    let vcpu = |i: &cosched_procfs::ThreadInfo| i.role == ThreadRole::Vcpu;
    l.follow(w.host.sched.as_mut(), &threads, vcpu, Newcomer::Present, &mut Outcome::default());
    assert!(l.slot(701).is_some() && l.slot(702).is_none(), "the vCPU alone is followed");
    l.prepare(|_| Some(100));
    l.apply(&mut w.host, &mut Outcome::default(), &mut Vec::new());
    assert_eq!((w.num(701), w.num(702), w.num(PID)), (100, 1, 1));
    // The vCPU's name goes: no thread is a member any more, while the level still wants 100.
    fake::add_thread(&w.dir.path().join("proc"), PID, 701, "renamed");
    threads.rescan(&w.host.procfs).unwrap();
    assert!(!threads.vcpus_known());
    assert!(l.follow(w.host.sched.as_mut(), &threads, vcpu, Newcomer::Present, &mut Outcome::default()));
    assert!(l.slot(701).is_some_and(|s| !s.member), "kept until put back");
    let p = l.prepare(|_| Some(100));
    assert!(!p.sets, "a thread no longer a member wants its original");
    let (mut out, mut gone) = (Outcome::default(), Vec::new());
    l.apply(&mut w.host, &mut out, &mut gone);
    assert_eq!((out.changed, w.num(701), w.num(702), w.num(PID)), (1, 1, 1, 1), "put back, nobody else taken");
    assert!(l.slot(701).is_none() && gone.is_empty(), "let go of once put back, and not counted gone");
    // What it had of the daemon's making stays recorded: the restore still removes group 100.
    assert_eq!(entries(&l).len(), 1);
    assert_eq!(entries(&l)[0].setting, Setting::Ioprio { original: 1, applied: vec![100] });
    // Named again: followed again, from the value it has now.
    fake::add_thread(&w.dir.path().join("proc"), PID, 701, "CPU 0/TCG");
    threads.rescan(&w.host.procfs).unwrap();
    assert!(l.follow(w.host.sched.as_mut(), &threads, vcpu, Newcomer::Present, &mut Outcome::default()));
    assert!(l.slot(701).is_some_and(|s| s.member && s.original == 1 && s.applied.is_none()));
    // A member with nothing of ours that stops being one is let go of at the follow.
    fake::add_thread(&w.dir.path().join("proc"), PID, 701, "renamed");
    threads.rescan(&w.host.procfs).unwrap();
    l.follow(w.host.sched.as_mut(), &threads, vcpu, Newcomer::Present, &mut Outcome::default());
    assert!(l.slot(701).is_none());
}
