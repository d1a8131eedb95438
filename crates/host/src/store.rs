//! Persistence of what the daemon changed, so that nothing it changes outlives it.
//!
//! Before its first change to a thread, an actuator records, per thread and per layer (a
//! dynamic boost of one resource, `cpu`, `io`, ..., or a `static` per-VM policy), the setting it
//! changes (scheduling attributes, I/O priority, CPU affinity), its original value and every value
//! it may apply. The records of one VM are one file, `<state_dir>/<pid>-<start_time>.json`,
//! written atomically (temp file, then rename), with a format version.
//!
//! [`restore_record`] is the one restore logic, used when a VM exits, when the daemon stops, and
//! after a crash (a restarted daemon, or `cosched restore`): for each thread and setting, if the
//! thread still has a value one of the layers applied, it gets the original value of the lowest
//! layer (what it had before any of them); otherwise someone else changed it after us and it is
//! left alone. Layers on one setting undo in any order and still end exact. A record that cannot
//! be read, or has a version or a setting this daemon does not know, is reported and kept for a
//! human: never skipped in silence. Restore goes on past a failing thread and reports each failure.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use cosched_procfs::{ProcFs, TaskId};
use serde::{Deserialize, Serialize};

use crate::cgroup::CgroupFs;
use crate::sched::SchedAttr;
use crate::SchedOps;

/// The format of the state files this daemon writes and reads.
pub const STATE_VERSION: u32 = 2;

/// The layer a static per-VM policy is recorded under; boosts use their resource's name.
pub const STATIC_LAYER: &str = "static";

/// A thread setting an actuator changes, with its original value and every value it may apply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "setting", rename_all = "snake_case")]
pub enum Setting {
    /// `sched_setattr(2)`.
    Sched { original: SchedAttr, applied: Vec<SchedAttr> },
    /// `ioprio_set(2)` (the raw `ioprio` value: class << 13 | data).
    Ioprio { original: u16, applied: Vec<u16> },
    /// `sched_setaffinity(2)`: the CPUs, sorted.
    Affinity { original: Vec<usize>, applied: Vec<Vec<usize>> },
    /// Membership in a cgroup of one hierarchy ([`crate::cgroup`]): `hierarchy` is a v1
    /// controller's name (`blkio`, ...) or `""` for v2; groups are paths in that hierarchy.
    Cgroup { hierarchy: String, original: String, applied: Vec<String> },
    /// A number in a file of a whole group the VM is alone in, recorded under the VM's main
    /// thread: the default BFQ weight (`blkio.bfq.weight` in v1, the `default` line of
    /// `io.bfq.weight` in v2), or `cgroup.freeze` (the memory-bandwidth throttle in v2).
    GroupWeight { hierarchy: String, group: String, file: String, original: u32, applied: Vec<u32> },
}

impl Setting {
    pub fn kind(&self) -> &'static str {
        match self {
            Setting::Sched { .. } => "sched",
            Setting::Ioprio { .. } => "ioprio",
            Setting::Affinity { .. } => "affinity",
            Setting::Cgroup { .. } => "cgroup",
            Setting::GroupWeight { .. } => "group_weight",
        }
    }

    /// What one restore decision covers: the kind, and for cgroups the hierarchy (a thread is
    /// in one group per hierarchy).
    fn key(&self) -> String {
        match self {
            Setting::Cgroup { hierarchy, .. } => format!("cgroup:{hierarchy}"),
            Setting::GroupWeight { hierarchy, group, file, .. } => format!("group_weight:{hierarchy}:{group}/{file}"),
            other => other.kind().to_string(),
        }
    }
}

/// One thread's setting changed by one layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub task: TaskId,
    /// `static`, or the name of the resource whose boost made the change.
    pub layer: String,
    #[serde(flatten)]
    pub setting: Setting,
}

/// What is persisted for one VM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmRecord {
    pub version: u32,
    pub vm: String,
    pub process: TaskId,
    pub entries: Vec<Entry>,
}

impl VmRecord {
    pub fn new(vm: &str, process: TaskId, entries: Vec<Entry>) -> VmRecord {
        VmRecord { version: STATE_VERSION, vm: vm.to_string(), process, entries }
    }
}

/// Static policies lie under boosts: they were there first and outlast them.
fn layer_rank(layer: &str) -> (u8, &str) {
    (if layer == STATIC_LAYER { 0 } else { 1 }, layer)
}

#[derive(Debug, Clone)]
pub struct StateDir {
    dir: PathBuf,
}

impl StateDir {
    /// Creates the directory (mode 0700) if needed. Its parents get the usual 0755: the
    /// socket directory usually sits beside it (`/run/cosched/vms`), and a QEMU that does not
    /// run as root must reach that.
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<StateDir> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = dir.into();
        if let Some(parent) = dir.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
        Ok(StateDir { dir })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn file_for(&self, process: TaskId) -> PathBuf {
        self.dir.join(format!("{}-{}.json", process.id, process.start_time))
    }

    /// Atomically replaces the record of `rec.process`.
    pub fn save(&self, rec: &VmRecord) -> io::Result<()> {
        let path = self.file_for(rec.process);
        let tmp = path.with_extension("json.tmp");
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(rec).map_err(io::Error::other)?)?;
        f.sync_all()?;
        fs::rename(&tmp, &path)
    }

    /// The record of `process`: `Ok(None)` if there is none, an error if there is one this
    /// daemon cannot read.
    pub fn load(&self, process: TaskId) -> Result<Option<VmRecord>, String> {
        let path = self.file_for(process);
        match fs::read(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", path.display())),
            Ok(b) => parse(&b).map(Some).map_err(|e| format!("{}: {e}", path.display())),
        }
    }

    pub fn remove(&self, process: TaskId) -> io::Result<()> {
        match fs::remove_file(self.file_for(process)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Every record, with the path it came from. Files that cannot be used are returned as
    /// errors so the caller reports them; they are left in place for a human to look at.
    pub fn load_all(&self) -> io::Result<Vec<(PathBuf, Result<VmRecord, String>)>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let ext = path.extension().and_then(|e| e.to_str());
            if ext == Some("tmp") {
                // A write interrupted before its rename: nothing was changed on its account
                // (records are saved before the change), and the previous record is intact.
                let _ = fs::remove_file(&path);
                continue;
            }
            if ext != Some("json") {
                continue;
            }
            let rec = fs::read(&path).map_err(|e| e.to_string()).and_then(|b| parse(&b));
            out.push((path, rec));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

/// Parses a state file, refusing versions this daemon does not write.
fn parse(bytes: &[u8]) -> Result<VmRecord, String> {
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| format!("corrupt: {e}"))?;
    match v.get("version").and_then(|n| n.as_u64()) {
        Some(n) if n == STATE_VERSION as u64 => {}
        Some(n) => return Err(format!("state format version {n}, this cosched reads version {STATE_VERSION}")),
        None => {
            return Err(format!(
                "no format version (written by a cosched older than format {STATE_VERSION}?); restore it with that \
                 version's `cosched restore`"
            ))
        }
    }
    serde_json::from_value(v).map_err(|e| format!("corrupt or unknown setting: {e}"))
}

/// Access to a thread's settings: the real system calls, or a fake in tests.
pub trait ThreadOps: SchedOps {
    fn get_ioprio(&mut self, tid: i32) -> io::Result<u16>;
    fn set_ioprio(&mut self, tid: i32, ioprio: u16) -> io::Result<()>;
    fn get_affinity(&mut self, tid: i32) -> io::Result<Vec<usize>>;
    fn set_affinity(&mut self, tid: i32, cpus: &[usize]) -> io::Result<()>;
    fn get_cgroup(&mut self, tid: i32, hierarchy: &str) -> io::Result<String>;
    fn set_cgroup(&mut self, tid: i32, hierarchy: &str, group: &str) -> io::Result<()>;
    /// The cgroup tree these operations work on (groups are created, weighted and removed
    /// through it).
    fn cgroups(&self) -> &CgroupFs;
}

/// The default weight in a BFQ weight file: `N` (v1 `blkio.bfq.weight`) or the `default N`
/// line (v2 `io.bfq.weight`, which may add per-device lines).
pub fn parse_weight(text: &str) -> Option<u32> {
    let first = text.lines().next()?.trim();
    first.strip_prefix("default").unwrap_or(first).trim().parse().ok()
}

/// What to write to a BFQ weight file to set the default weight: `N` in v1, `default N` in v2
/// (where a bare `N` would do too, but this is what it reads back).
pub fn weight_text(hierarchy: &str, weight: u32) -> String {
    if hierarchy.is_empty() {
        format!("default {weight}")
    } else {
        weight.to_string()
    }
}

/// What to write to a group's file to set `value`: a BFQ weight file's default weight
/// ([`weight_text`]), else the number (`cgroup.freeze`).
pub fn group_value_text(hierarchy: &str, file: &str, value: u32) -> String {
    if file.contains("bfq.weight") {
        weight_text(hierarchy, value)
    } else {
        value.to_string()
    }
}

/// Reads the default BFQ weight of a group.
pub fn read_weight(cg: &CgroupFs, hierarchy: &str, group: &str, file: &str) -> io::Result<u32> {
    let text = cg.read(hierarchy, group, file)?;
    parse_weight(&text).ok_or_else(|| io::Error::other(format!("{file} of {group}: no default weight in {text:?}")))
}

/// The prefix of the groups the daemon creates (and removes once they are empty).
pub const OWN_GROUP_PREFIX: &str = "cosched-io-";
/// Every kind of group the daemon creates: the I/O lever's, the shield's vCPU groups and the
/// memory-bandwidth throttle's frozen groups.
pub const OWN_GROUP_PREFIXES: [&str; 3] =
    [OWN_GROUP_PREFIX, crate::actuator::statics::SHIELD_GROUP_PREFIX, crate::actuator::throttle::THROTTLE_GROUP_PREFIX];

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
    let mut groups = std::collections::BTreeSet::new();
    for e in &rec.entries {
        if let Setting::Cgroup { hierarchy, applied, .. } = &e.setting {
            for g in applied {
                if g.rsplit('/').next().is_some_and(|leaf| OWN_GROUP_PREFIXES.iter().any(|p| leaf.starts_with(p))) {
                    groups.insert((hierarchy.clone(), g.clone()));
                }
            }
        }
    }
    for (hierarchy, group) in groups {
        let parent = group.rsplit_once('/').map_or("", |(p, _)| p);
        let parent = if parent.is_empty() { "/" } else { parent };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::{SCHED_FLAG_RESET_ON_FORK, SCHED_RR};

    #[test]
    fn a_setting_changed_by_two_layers_goes_back_to_what_was_there_before_both() {
        let orig = 4u16;
        let stat = 1u16; // a static policy set 1
        let boost = 0u16; // a boost over it set 0
        let layers: Vec<(&str, &u16, &[u16])> =
            vec![("io", &stat, std::slice::from_ref(&boost)), (STATIC_LAYER, &orig, std::slice::from_ref(&stat))];
        let same = |a: &u16, b: &u16| a == b;
        assert_eq!(undo_value(&layers, &boost, same), Some(orig), "boosted over static: back to the original");
        assert_eq!(undo_value(&layers, &stat, same), Some(orig), "boost already undone: static's original");
        assert_eq!(undo_value(&layers, &orig, same), None, "already original");
        assert_eq!(undo_value(&layers, &7, same), None, "someone else's value stays");
    }

    #[test]
    fn records_carry_their_version_and_unknown_ones_are_refused() {
        let task = TaskId { id: 5, start_time: 9 };
        let rec = VmRecord::new(
            "vm",
            task,
            vec![Entry {
                task,
                layer: "cpu".into(),
                setting: Setting::Sched {
                    original: SchedAttr::other(0, 0),
                    applied: vec![SchedAttr::rt(SCHED_RR, 1, SCHED_FLAG_RESET_ON_FORK)],
                },
            }],
        );
        let text = serde_json::to_string(&rec).unwrap();
        assert!(text.contains("\"version\":2") && text.contains("\"setting\":\"sched\""), "{text}");
        assert_eq!(parse(text.as_bytes()), Ok(rec));
        assert!(parse(b"{garbage").unwrap_err().starts_with("corrupt"));
        let v1 = br#"{"vm":"x","process":{"id":1,"start_time":2},"threads":[]}"#;
        assert!(parse(v1).unwrap_err().contains("no format version"));
        assert!(parse(br#"{"version":3}"#).unwrap_err().contains("version 3"));
        let unknown = text.replace("\"sched\"", "\"memory_tier\"");
        assert!(parse(unknown.as_bytes()).unwrap_err().contains("unknown"), "{unknown}");
    }
}
