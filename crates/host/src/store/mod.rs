//! Persistence of what the daemon changed, so that nothing it changes outlives it.
//!
//! Before its first change to a thread, an actuator records, per thread and per layer (a
//! dynamic boost of one resource, `cpu`, `io`, ..., or a `static` per-VM policy), the setting it
//! changes ([`Setting`]: scheduling attributes, I/O priority, CPU affinity, cgroup membership, a
//! group file's value), its original value and every value it may apply. The records of one VM
//! are one file, `<state_dir>/<pid>-<start_time>.json`, written atomically (temp file, then
//! rename), with a format version ([`STATE_VERSION`]; `testdata/state-v2/` holds records as the
//! daemon of this version first wrote them, which every later daemon must restore).
//!
//! This module is the record alone: it knows no actuator and no system call. [`restore_record`]
//! (in `restore.rs`) puts a record back through the same kinds of setting the actuators apply
//! ([`crate::settings`]), and is the one restore logic: used when a VM exits, when the daemon
//! stops, and after a crash (a restarted daemon, or `cosched restore`). A record that cannot be
//! read, or has a version or a setting this daemon does not know, is reported and kept for a
//! human: never skipped in silence.

mod restore;

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use cosched_procfs::TaskId;
use serde::{Deserialize, Serialize};

pub use self::restore::{restore_all, restore_record, undo_value, RestoreReport};
use crate::sched::SchedAttr;
/// The daemon reaches a thread's settings through this ([`crate::sched`]).
pub use crate::sched::ThreadOps;

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
    pub(crate) fn key(&self) -> String {
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
pub(crate) fn layer_rank(layer: &str) -> (u8, &str) {
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
    pub fn load(&self, process: TaskId) -> Result<Option<VmRecord>, RecordError> {
        let path = self.file_for(process);
        let at = |source| RecordError::File { path: path.clone(), source: Box::new(source) };
        match fs::read(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(at(RecordError::Io(e))),
            Ok(b) => parse(&b).map(Some).map_err(at),
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
    pub fn load_all(&self) -> io::Result<Vec<(PathBuf, Result<VmRecord, RecordError>)>> {
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
            let rec = fs::read(&path).map_err(RecordError::Io).and_then(|b| parse(&b));
            out.push((path, rec));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

/// Why a state file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{0}")]
    Io(#[source] io::Error),
    #[error("corrupt: {0}")]
    Corrupt(#[source] serde_json::Error),
    #[error("state format version {0}, this cosched reads version {STATE_VERSION}")]
    Version(u64),
    #[error(
        "no format version (written by a cosched older than format {STATE_VERSION}?); restore it with that \
         version's `cosched restore`"
    )]
    NoVersion,
    #[error("corrupt or unknown setting: {0}")]
    Unknown(#[source] serde_json::Error),
    #[error("{}: {source}", path.display())]
    File { path: PathBuf, source: Box<RecordError> },
}

/// Parses a state file, refusing versions this daemon does not write.
fn parse(bytes: &[u8]) -> Result<VmRecord, RecordError> {
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(RecordError::Corrupt)?;
    match v.get("version").and_then(|n| n.as_u64()) {
        Some(n) if n == STATE_VERSION as u64 => {}
        Some(n) => return Err(RecordError::Version(n)),
        None => return Err(RecordError::NoVersion),
    }
    serde_json::from_value(v).map_err(RecordError::Unknown)
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
        assert_eq!(parse(text.as_bytes()).unwrap(), rec);
        let err = |b: &[u8]| parse(b).unwrap_err().to_string();
        assert!(err(b"{garbage").starts_with("corrupt"));
        let v1 = br#"{"vm":"x","process":{"id":1,"start_time":2},"threads":[]}"#;
        assert!(err(v1).contains("no format version"));
        assert!(err(br#"{"version":3}"#).contains("version 3"));
        let unknown = text.replace("\"sched\"", "\"memory_tier\"");
        assert!(err(unknown.as_bytes()).contains("unknown"), "{unknown}");
    }
}
