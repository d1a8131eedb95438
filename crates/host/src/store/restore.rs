//! The one restore logic: puts back what a record says, through the kinds of setting the
//! actuators applied ([`crate::settings`]).
//!
//! For each thread and setting, if the thread still has a value one of the layers applied, it
//! gets the original value of the lowest layer (what it had before any of them); otherwise
//! someone else changed it after us and it is left alone ([`undo_value`], the same decision an
//! actuator takes when it resumes a record). Layers on one setting undo in any order and still
//! end exact. Restore goes on past a failing thread and reports each failure, then removes the
//! groups the daemon made.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;

use cosched_procfs::{ProcFs, TaskId};
use serde::Serialize;

use super::{layer_rank, Entry, Setting, StateDir, VmRecord};
use crate::actuator::membw;
use crate::cgroup::{self, CgroupFs, OWN_GROUP_PREFIXES};
use crate::sched::ThreadOps;
use crate::settings::{is_gone, AffinityKind, CgroupKind, GroupValueKind, IoprioKind, Kind, SchedKind};

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct RestoreReport {
    /// Settings put back to their original value.
    pub restored: u64,
    /// Threads that exited (or whose id now names another thread).
    pub gone: u64,
    /// Settings already at their original value, or changed by someone else since.
    pub untouched: u64,
    /// Human-readable errors: records that cannot be used, settings that cannot be put back.
    pub errors: Vec<String>,
}

impl RestoreReport {
    pub fn add(&mut self, other: RestoreReport) {
        self.restored += other.restored;
        self.gone += other.gone;
        self.untouched += other.untouched;
        self.errors.extend(other.errors);
    }
}

/// What to do with one setting of one thread, given its layers (any order) and its current
/// value: `Some(original)` to set it back, `None` to leave it (at its original already, or
/// changed by someone else). Pure: the one decision every restore path takes.
pub fn undo_value<T: Clone>(layers: &[(&str, &T, &[T])], current: &T, same: impl Fn(&T, &T) -> bool) -> Option<T> {
    let bottom = layers.iter().min_by_key(|(layer, _, _)| layer_rank(layer))?;
    let original = bottom.1;
    if same(current, original) {
        return None;
    }
    let ours = layers.iter().any(|(_, _, applied)| applied.iter().any(|a| same(current, a)));
    ours.then(|| original.clone())
}

/// The outcome of putting one setting back.
enum Undo {
    Restored,
    Untouched,
    Gone,
    Failed(String),
}

/// Puts back one setting of one thread from its layers' entries, read and set as `kind`.
fn undo<K: Kind>(kind: &K, tid: i32, entries: &[&Entry], ops: &mut dyn ThreadOps) -> Undo {
    let recorded: Vec<_> =
        entries.iter().filter_map(|e| Some((e.layer.as_str(), kind.parse_record(&e.setting)?))).collect();
    let layers: Vec<_> =
        recorded.iter().map(|(layer, (original, applied))| (*layer, original, applied.as_slice())).collect();
    let current = match kind.get(ops, tid) {
        Ok(c) => c,
        Err(e) if is_gone(&e) => return Undo::Gone,
        Err(e) => return Undo::Failed(format!("reading {} of thread {tid}: {e}", kind.label())),
    };
    match undo_value(&layers, &current, |a, b| kind.same(a, b)) {
        None => Undo::Untouched,
        Some(original) => match kind.set(ops, tid, &original) {
            Ok(()) => Undo::Restored,
            Err(e) if is_gone(&e) => Undo::Gone,
            Err(e) => Undo::Failed(kind.explain(ops, tid, &original, &e)),
        },
    }
}

/// The kind that reads a record's setting back.
fn undo_setting(tid: i32, entries: &[&Entry], ops: &mut dyn ThreadOps) -> Undo {
    // Grouped by `Setting::key`: every entry here is of the first one's kind (and hierarchy,
    // group and file).
    match &entries[0].setting {
        Setting::Sched { .. } => undo(&SchedKind, tid, entries, ops),
        Setting::Ioprio { .. } => undo(&IoprioKind, tid, entries, ops),
        Setting::Affinity { .. } => undo(&AffinityKind, tid, entries, ops),
        Setting::Cgroup { hierarchy, .. } => undo(&CgroupKind::recorded(hierarchy), tid, entries, ops),
        Setting::GroupWeight { hierarchy, group, file, .. } => {
            undo(&GroupValueKind::recorded(hierarchy, group, file), tid, entries, ops)
        }
    }
}

/// Puts back everything `rec` recorded. Returns the report; `errors` empty means the record is
/// fully handled and may be removed.
pub fn restore_record(rec: &VmRecord, procfs: &ProcFs, ops: &mut dyn ThreadOps) -> RestoreReport {
    let mut report = RestoreReport::default();
    // (thread, setting kind) -> its entries, one per layer.
    let mut groups: BTreeMap<(TaskId, String), Vec<&Entry>> = BTreeMap::new();
    for e in &rec.entries {
        groups.entry((e.task, e.setting.key())).or_default().push(e);
    }
    let mut checked: BTreeMap<TaskId, bool> = BTreeMap::new();
    // Group membership first: moving a thread between cpusets resets its affinity to the
    // group's CPUs, so its own affinity is put back after.
    let mut groups: Vec<_> = groups.into_iter().collect();
    groups.sort_by_key(|((task, key), _)| (!key.starts_with("cgroup:"), *task));
    for ((task, _), entries) in groups {
        // Only a thread that is still the same thread of the same process is touched.
        let alive = *checked.entry(task).or_insert_with(|| procfs.is_same_task(rec.process.id, task));
        if !alive {
            report.gone += 1;
            continue;
        }
        match undo_setting(task.id, &entries, ops) {
            Undo::Restored => report.restored += 1,
            Undo::Untouched => report.untouched += 1,
            Undo::Gone => report.gone += 1,
            Undo::Failed(e) => report.errors.push(format!("{}: {e}", rec.vm)),
        }
    }
    remove_own_groups(rec, ops.cgroups(), &mut report);
    report
}

/// Removes the groups the daemon created for `rec`'s threads (named [`OWN_GROUP_PREFIXES`]...).
/// A thread still in one was born there from a thread we had moved in (and not yet seen by a
/// daemon): it goes to the group's parent, where its creator came from. A v1 freezer group is
/// thawed before.
fn remove_own_groups(rec: &VmRecord, cg: &CgroupFs, report: &mut RestoreReport) {
    let mut groups = BTreeSet::new();
    for e in &rec.entries {
        if let Setting::Cgroup { hierarchy, applied, .. } = &e.setting {
            for g in applied.iter().filter(|g| OWN_GROUP_PREFIXES.iter().any(|p| cgroup::is_named(g, p))) {
                groups.insert((hierarchy.clone(), g.clone()));
            }
        }
    }
    for (hierarchy, group) in groups {
        let parent = cgroup::parent(&group);
        // A frozen group is thawed first: a thread of a process that is exiting is not moved
        // by a migration (the kernel skips it), and left frozen it could never exit.
        if hierarchy == membw::FREEZER && cg.dir(&hierarchy, &group).is_dir() {
            if let Err(e) = cg.write(&hierarchy, &group, membw::V1_STATE, membw::V1_THAWED) {
                report.errors.push(format!("{}: thawing cgroup {group} it created: {e}", rec.vm));
            }
        }
        let file = if hierarchy.is_empty() { "cgroup.threads" } else { "tasks" };
        for tid in cg.read(&hierarchy, &group, file).unwrap_or_default().split_whitespace() {
            if let Ok(tid) = tid.parse::<i32>() {
                match cg.set(tid, &hierarchy, parent) {
                    Ok(()) => report.restored += 1,
                    Err(e) if is_gone(&e) => {}
                    Err(e) => report.errors.push(format!("{}: moving thread {tid} out of {group}: {e}", rec.vm)),
                }
            }
        }
        if let Err(e) = cg.remove_group(&hierarchy, &group) {
            report.errors.push(format!("{}: removing cgroup {group} it created: {e}", rec.vm));
        }
    }
}

/// Restores every record in `store`, and removes the records that were fully handled. A record
/// that cannot be used is reported and kept; the others are restored all the same.
pub fn restore_all(store: &StateDir, procfs: &ProcFs, ops: &mut dyn ThreadOps) -> io::Result<RestoreReport> {
    let mut report = RestoreReport::default();
    for (path, rec) in store.load_all()? {
        let rec = match rec {
            Ok(r) => r,
            Err(e) => {
                report.errors.push(format!("{}: cannot be restored, kept for you to look at: {e}", path.display()));
                continue;
            }
        };
        let r = restore_record(&rec, procfs, ops);
        let done = r.errors.is_empty();
        report.add(r);
        if done {
            fs::remove_file(&path)?;
        }
    }
    Ok(report)
}
