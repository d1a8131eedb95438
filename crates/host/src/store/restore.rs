//! The one restore logic: puts back what a record says.
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
use crate::cgroup::{self, parse_weight, weight_text, CgroupFs, OWN_GROUP_PREFIXES};
use crate::sched::{SchedAttr, ThreadOps};

/// What to write to a group's file to set `value`: a BFQ weight file's default weight
/// ([`weight_text`]), else the number (`cgroup.freeze`).
fn group_value_text(hierarchy: &str, file: &str, value: u32) -> String {
    if file.contains("bfq.weight") {
        weight_text(hierarchy, value)
    } else {
        value.to_string()
    }
}

/// Reads the default BFQ weight of a group.
fn read_weight(cg: &CgroupFs, hierarchy: &str, group: &str, file: &str) -> io::Result<u32> {
    let text = cg.read(hierarchy, group, file)?;
    parse_weight(&text).ok_or_else(|| io::Error::other(format!("{file} of {group}: no default weight in {text:?}")))
}

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
}

fn is_gone(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ESRCH)
}

/// Puts back one setting of one thread from its layers' entries.
fn undo_setting(tid: i32, entries: &[&Entry], ops: &mut dyn ThreadOps) -> Result<Undo, String> {
    macro_rules! undo {
        ($variant:ident, $get:expr, $set:expr, $same:expr, $show:expr) => {{
            let layers: Vec<_> = entries
                .iter()
                .filter_map(|e| match &e.setting {
                    Setting::$variant { original, applied, .. } => {
                        Some((e.layer.as_str(), original, applied.as_slice()))
                    }
                    _ => None,
                })
                .collect();
            let current = match $get {
                Ok(c) => c,
                Err(e) if is_gone(&e) => return Ok(Undo::Gone),
                Err(e) => return Err(format!("reading {} of thread {tid}: {e}", entries[0].setting.kind())),
            };
            match undo_value(&layers, &current, $same) {
                None => Ok(Undo::Untouched),
                Some(original) => match $set(&original) {
                    Ok(()) => Ok(Undo::Restored),
                    Err(e) if is_gone(&e) => Ok(Undo::Gone),
                    Err(e) => Err($show(&original, &e)),
                },
            }
        }};
    }
    match &entries[0].setting {
        Setting::Sched { .. } => undo!(
            Sched,
            ops.get(tid),
            |o: &SchedAttr| ops.set(tid, o),
            |a: &SchedAttr, b: &SchedAttr| a.same_as(b),
            |o: &SchedAttr, e: &io::Error| crate::sched::explain_set_error(tid, o, e)
        ),
        Setting::Ioprio { .. } => undo!(
            Ioprio,
            ops.get_ioprio(tid),
            |o: &u16| ops.set_ioprio(tid, *o),
            |a: &u16, b: &u16| a == b,
            |o: &u16, e: &io::Error| format!("ioprio_set({tid}, {o:#x}): {e}")
        ),
        Setting::Affinity { .. } => undo!(
            Affinity,
            ops.get_affinity(tid),
            |o: &Vec<usize>| ops.set_affinity(tid, o),
            |a: &Vec<usize>, b: &Vec<usize>| a == b,
            |o: &Vec<usize>, e: &io::Error| format!("sched_setaffinity({tid}, {o:?}): {e}")
        ),
        Setting::Cgroup { hierarchy, .. } => {
            // Grouped by hierarchy (`Setting::key`): every entry here is of this one.
            let hierarchy = hierarchy.clone();
            let show = if hierarchy.is_empty() { "v2".to_string() } else { hierarchy.clone() };
            undo!(
                Cgroup,
                ops.get_cgroup(tid, &hierarchy),
                |o: &String| ops.set_cgroup(tid, &hierarchy, o),
                |a: &String, b: &String| a == b,
                |o: &String, e: &io::Error| format!("moving thread {tid} back to {show} cgroup {o}: {e}")
            )
        }
        Setting::GroupWeight { hierarchy, group, file, .. } => {
            let cg = ops.cgroups().clone();
            let (hierarchy, group, file) = (hierarchy.clone(), group.clone(), file.clone());
            if !cg.dir(&hierarchy, &group).is_dir() {
                return Ok(Undo::Gone); // the group went with its VM
            }
            undo!(
                GroupWeight,
                read_weight(&cg, &hierarchy, &group, &file),
                |o: &u32| cg.write(&hierarchy, &group, &file, &group_value_text(&hierarchy, &file, *o)),
                |a: &u32, b: &u32| a == b,
                |o: &u32, e: &io::Error| format!("writing {o} to {file} of {group}: {e}")
            )
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
            Ok(Undo::Restored) => report.restored += 1,
            Ok(Undo::Untouched) => report.untouched += 1,
            Ok(Undo::Gone) => report.gone += 1,
            Err(e) => report.errors.push(format!("{}: {e}", rec.vm)),
        }
    }
    remove_own_groups(rec, ops.cgroups(), &mut report);
    report
}

/// Removes the groups the daemon created for `rec`'s threads (named [`OWN_GROUP_PREFIXES`]...).
/// A thread still in one was born there from a thread we had moved in (and not yet seen by a
/// daemon): it goes to the group's parent, where its creator came from.
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
        let file = if hierarchy.is_empty() { "cgroup.threads" } else { "tasks" };
        for tid in cg.read(&hierarchy, &group, file).unwrap_or_default().split_whitespace() {
            if let Ok(tid) = tid.parse::<i32>() {
                match cg.set(tid, &hierarchy, parent) {
                    Ok(()) => report.restored += 1,
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
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
