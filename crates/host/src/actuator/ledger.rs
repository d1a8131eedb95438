//! The one state machine of every actuator: per thread and kind of setting, what it had before
//! us, what we set, what we want now and every value we may set ([`Slot`]), kept in a
//! [`Ledger`].
//!
//! The life cycle, tuned's plugin model (apply, verify, unapply) with the record first:
//! - [`Ledger::follow`]: tracks the threads the list gained (their present value is their
//!   original, unless they were born of a raised thread: [`Newcomer`]) and drops those it lost;
//! - [`Ledger::verify`]: takes in what someone else changed. A thread at its own value gets its
//!   present one as original (the operator may have made it real-time, which a boost must not
//!   lower); a thread no longer at our value keeps the other's change, and we let go of it;
//! - [`Ledger::prepare`]: what a level wants, noting every value about to be set as one we may
//!   apply, so the record is saved before the change;
//! - [`Ledger::apply`]: sets what changes, one call per thread, nothing read;
//! - [`Ledger::entries`]: the record, undone by [`crate::store::restore_record`] through the same
//!   [`Kind`]; [`Ledger::resume`] takes a record back in with the restore's own decision.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cosched_procfs::{TaskId, ThreadInfo, ThreadRole};

use super::{Host, Outcome, Prepared, Threads};
use crate::sched::ThreadOps;
use crate::settings::{is_gone, Kind};
use crate::store::{undo_value, Entry};

/// One setting of one thread.
#[derive(Debug, Clone)]
pub struct Slot<V> {
    pub task: TaskId,
    /// From the thread list, as of the last generation followed.
    pub role: ThreadRole,
    /// Whether the actuator's lever picks this thread, as of the last generation followed. A
    /// thread that stops being picked while it has a value of ours (a vCPU that lost its name)
    /// is put back, and only then let go of.
    pub member: bool,
    pub original: V,
    /// What we set and the thread still has, as far as we know.
    pub applied: Option<V>,
    /// What the level being applied wants it to have (`None`: its original).
    pub want: Option<V>,
    /// Every value we may set on it (persisted before any is set): what tells a restore that
    /// the thread's present value is ours.
    pub may_apply: Vec<V>,
}

/// What a thread the list gained had before us.
pub enum Newcomer<'a, V> {
    /// Its present value.
    Present,
    /// It was born while we held the VM raised: `born(present, main thread's original)`, and
    /// where that is not its present value, the present one is ours (inherited from the raised
    /// thread that created it) and recorded as such.
    Born(&'a dyn Fn(&V, Option<&V>) -> V),
    /// What `base(tid)` says (what it has under a layer of ours that holds it), else its present
    /// value.
    Base(&'a dyn Fn(i32) -> Option<V>),
}

/// What [`Ledger::apply_one`] did to one thread.
#[derive(Debug)]
pub enum Applied<V> {
    /// Nothing to change.
    Unchanged,
    /// It has `V` now.
    Set(V),
    /// The thread is gone.
    Gone,
    /// The kernel refused: why.
    Failed(String),
}

/// The slots of one kind of setting over a VM's threads, recorded under one layer.
#[derive(Debug)]
pub struct Ledger<K: Kind> {
    kind: K,
    layer: &'static str,
    slots: BTreeMap<i32, Slot<K::V>>,
    /// For each value of the daemon's making ([`Kind::creates`]: a group of its own) whose
    /// threads have gone, a gone thread's entry that names it: kept in the record, so that the
    /// restore (at the VM's end, the daemon's stop or after a crash) still removes the group.
    /// One per value, so bounded whatever the VM's threads do.
    retired: Vec<(K::V, Entry)>,
    /// The [`Threads::generation`] last followed.
    generation: Option<u64>,
    /// When every thread's value was last read.
    verified_at: Option<Instant>,
}

impl<K: Kind> Ledger<K> {
    pub fn new(kind: K, layer: &'static str) -> Ledger<K> {
        Ledger { kind, layer, slots: BTreeMap::new(), retired: Vec::new(), generation: None, verified_at: None }
    }

    pub fn kind(&self) -> &K {
        &self.kind
    }

    pub fn slot(&self, tid: i32) -> Option<&Slot<K::V>> {
        self.slots.get(&tid)
    }

    pub fn slots(&self) -> impl Iterator<Item = (i32, &Slot<K::V>)> {
        self.slots.iter().map(|(t, s)| (*t, s))
    }

    /// What we set on `tid` and it still has.
    pub fn applied(&self, tid: i32) -> Option<&K::V> {
        self.slots.get(&tid).and_then(|s| s.applied.as_ref())
    }

    /// Whether anything of ours is on a thread.
    pub fn active(&self) -> bool {
        self.slots.values().any(|s| s.applied.is_some())
    }

    /// Keeps what a dropped slot made of the daemon's in the record.
    fn retire(kind: &K, layer: &'static str, retired: &mut Vec<(K::V, Entry)>, s: &Slot<K::V>) {
        for v in s.may_apply.iter().filter(|v| kind.creates(v)) {
            if !retired.iter().any(|(r, _)| r == v) {
                let setting = kind.record(&s.original, std::slice::from_ref(v));
                retired.push((v.clone(), Entry { task: s.task, layer: layer.into(), setting }));
            }
        }
    }

    /// Follows the thread list when it moved: drops the threads it lost, and those no longer
    /// `member`s that have nothing of ours (one that still has a value of ours is kept, no
    /// longer a member, until [`Ledger::apply`] has put it back), tracks the members it gained,
    /// takes in roles. A transition between two moves reads nothing. Returns whether the
    /// entries changed. A value that cannot be read (other than for a thread's exit) is
    /// reported, and read again at the next change.
    pub fn follow(
        &mut self,
        ops: &mut dyn ThreadOps,
        threads: &Threads,
        member: impl Fn(&ThreadInfo) -> bool,
        newcomer: Newcomer<'_, K::V>,
        out: &mut Outcome,
    ) -> bool {
        if self.generation == Some(threads.generation()) {
            return false;
        }
        self.generation = Some(threads.generation());
        let before = self.slots.len();
        let (kind, layer, retired) = (&self.kind, self.layer, &mut self.retired);
        self.slots.retain(|tid, s| {
            let keep = threads.get(*tid).is_some_and(|i| i.task == s.task && (member(i) || s.applied.is_some()));
            if !keep {
                Self::retire(kind, layer, retired, s);
            }
            keep
        });
        let mut changed = self.slots.len() != before;
        for info in threads.iter() {
            let is_member = member(info);
            if let Some(s) = self.slots.get_mut(&info.task.id) {
                s.role = info.role; // QEMU names its threads a moment after creating them
                changed |= s.member != is_member;
                s.member = is_member;
                continue;
            }
            if !is_member {
                continue;
            }
            let current = match self.kind.get(ops, info.task.id) {
                Ok(c) => c,
                Err(e) if is_gone(&e) => continue, // exited meanwhile
                Err(e) => {
                    out.errors.push(format!("thread {}: {e}", info.task.id));
                    self.generation = None;
                    continue;
                }
            };
            let (original, ours) = match &newcomer {
                Newcomer::Present => (current, None),
                Newcomer::Base(base) => (base(info.task.id).unwrap_or(current), None),
                Newcomer::Born(born) => {
                    let main = self.slots.get(&threads.process.id).map(|m| &m.original);
                    let original = born(&current, main);
                    let ours = (original != current).then_some(current);
                    (original, ours)
                }
            };
            let slot = Slot {
                task: info.task,
                role: info.role,
                member: true,
                original,
                may_apply: ours.iter().cloned().collect(),
                applied: ours,
                want: None,
            };
            self.slots.insert(info.task.id, slot);
            changed = true;
        }
        changed
    }

    /// Whether the values were last read `every` ago or longer.
    pub fn verify_due(&self, every: Duration) -> bool {
        self.verified_at.is_none_or(|t| t.elapsed() >= every)
    }

    /// Reads the value of each slot `pick` chooses and takes in what someone else changed.
    /// Returns whether an original moved.
    pub fn verify(
        &mut self,
        ops: &mut dyn ThreadOps,
        pick: impl Fn(i32, &Slot<K::V>) -> bool,
        out: &mut Outcome,
    ) -> bool {
        let mut changed = false;
        for (tid, s) in self.slots.iter_mut() {
            if !pick(*tid, s) {
                continue;
            }
            let Ok(cur) = self.kind.get(ops, *tid) else { continue }; // gone: the change will say so
            match &s.applied {
                None if !self.kind.same(&cur, &s.original) => {
                    s.original = cur;
                    changed = true;
                }
                Some(applied) if !self.kind.same(&cur, applied) => {
                    out.foreign += 1;
                    s.original = cur;
                    s.applied = None;
                    changed = true;
                }
                _ => {}
            }
        }
        self.verified_at = Some(Instant::now());
        changed
    }

    /// Takes what `want` says each member thread should have (`None`: its original; a thread
    /// no longer a member wants its original), and notes every value about to be set as one
    /// we may apply.
    pub fn prepare(&mut self, mut want: impl FnMut(&Slot<K::V>) -> Option<K::V>) -> Prepared {
        let mut p = Prepared::default();
        for s in self.slots.values_mut() {
            s.want = if s.member { want(s) } else { None };
            if let Some(v) = &s.want {
                p.sets = true;
                if !s.may_apply.contains(v) {
                    s.may_apply.push(v.clone());
                    p.changed = true;
                }
            }
        }
        p
    }

    /// Sets what [`Ledger::prepare`] decided for thread `tid`, if it changes.
    pub fn apply_one(&mut self, ops: &mut dyn ThreadOps, tid: i32) -> Applied<K::V> {
        let Some(s) = self.slots.get_mut(&tid) else { return Applied::Unchanged };
        if s.want == s.applied {
            return Applied::Unchanged;
        }
        let v = s.want.clone().unwrap_or_else(|| s.original.clone());
        match self.kind.set(ops, tid, &v) {
            Ok(()) => {
                s.applied = s.want.clone();
                Applied::Set(v)
            }
            Err(e) if is_gone(&e) => Applied::Gone,
            Err(e) => Applied::Failed(self.kind.explain(ops, tid, &v, &e)),
        }
    }

    /// Sets what [`Ledger::prepare`] decided, one call per thread that changes and nothing
    /// else: what a thread has was checked by the last verification. Pushes the threads it
    /// found gone, and forgets them; lets go of the threads no longer members once put back.
    pub fn apply(&mut self, env: &mut Host, out: &mut Outcome, gone: &mut Vec<i32>) {
        let tids: Vec<i32> = self.slots.iter().filter(|(_, s)| s.want != s.applied).map(|(t, _)| *t).collect();
        let mut lost = Vec::new();
        for tid in tids {
            let started = Instant::now();
            let result = self.apply_one(env.sched.as_mut(), tid);
            env.syscall_ns += started.elapsed().as_nanos() as u64;
            match result {
                Applied::Unchanged => {}
                Applied::Set(_) => out.changed += 1,
                Applied::Gone => lost.push(tid),
                Applied::Failed(why) => out.errors.push(why),
            }
        }
        self.forget(&lost);
        gone.extend(lost);
        let left: Vec<i32> =
            self.slots.iter().filter(|(_, s)| !s.member && s.applied.is_none()).map(|(t, _)| *t).collect();
        self.forget(&left);
    }

    /// These threads are gone: what they had of the daemon's making stays in the record.
    pub fn forget(&mut self, gone: &[i32]) {
        for tid in gone {
            if let Some(s) = self.slots.remove(tid) {
                Self::retire(&self.kind, self.layer, &mut self.retired, &s);
            }
        }
    }

    /// This layer of the VM's record: per thread we may change, the original and every value
    /// we may apply; then the retired entries.
    pub fn entries(&self, out: &mut Vec<Entry>) {
        out.extend(self.slots.values().filter(|s| !s.may_apply.is_empty()).map(|s| Entry {
            task: s.task,
            layer: self.layer.into(),
            setting: self.kind.record(&s.original, &s.may_apply),
        }));
        out.extend(self.retired.iter().map(|(_, e)| e.clone()));
    }

    /// Takes in this layer's entries of a record a previous daemon left for these threads (a
    /// restore that failed): their originals are the originals, and a thread that still has a
    /// value they say was applied is still changed by us (the restore's own decision). Call
    /// after [`Ledger::follow`], which read what the threads have.
    pub fn resume(&mut self, entries: &[Entry]) {
        for e in entries.iter().filter(|e| e.layer == self.layer) {
            let Some((original, applied)) = self.kind.parse_record(&e.setting) else { continue };
            let Some(s) = self.slots.get_mut(&e.task.id).filter(|s| s.task == e.task) else { continue };
            let current = s.original.clone();
            let layers = [(self.layer, &original, applied.as_slice())];
            if undo_value(&layers, &current, |a, b| self.kind.same(a, b)).is_some() {
                s.applied = Some(current); // still ours: the next undo puts it back
            }
            s.original = original;
            s.may_apply = applied;
        }
    }

    /// Everything was put back: forget what was applied and may be.
    pub fn restored(&mut self) {
        self.retired.clear();
        for s in self.slots.values_mut() {
            s.applied = None;
            s.want = None;
            s.may_apply.clear();
        }
    }

    /// Forgets every thread (they are followed again at the next change).
    pub fn clear(&mut self) {
        self.slots.clear();
        self.retired.clear();
        self.generation = None;
    }

    /// Another layer of ours set thread `tid` to `now` (or put it back to `now`): what we had
    /// applied is gone, and `now` is what the thread has without us.
    pub fn rebase(&mut self, tid: i32, now: K::V) {
        if let Some(s) = self.slots.get_mut(&tid) {
            s.original = now;
            s.applied = None;
        }
    }

    /// What thread `tid` has of this setting: (label, value, set by us).
    pub fn show(&self, tid: i32) -> Option<(&'static str, String, bool)> {
        let s = self.slots.get(&tid)?;
        Some((self.kind.label(), self.kind.show(s.applied.as_ref().unwrap_or(&s.original)), s.applied.is_some()))
    }

    /// The distinct values we applied that threads still have.
    pub fn applied_values(&self) -> Vec<&K::V> {
        let mut seen: Vec<&K::V> = Vec::new();
        for v in self.slots.values().filter_map(|s| s.applied.as_ref()) {
            if !seen.contains(&v) {
                seen.push(v);
            }
        }
        seen
    }
}
