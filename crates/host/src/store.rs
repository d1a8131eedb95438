//! Persistence of original thread attributes, so that nothing we change outlives us.
//!
//! Before the first change to a thread, its original attributes are written to
//! `<state_dir>/<pid>-<start_time>.json` (atomically: write a temp file, then rename). A daemon
//! that restarts after `kill -9`, or `cosched restore`, reads every file and puts back the
//! attributes of each thread that still exists and still carries our mark (see
//! [`looks_applied_by_us`]); then the file is removed.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use cosched_procfs::{ProcFs, TaskId};
use serde::{Deserialize, Serialize};

use crate::sched::{SchedAttr, SCHED_FLAG_RESET_ON_FORK};
use crate::SchedOps;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadRecord {
    pub task: TaskId,
    pub original: SchedAttr,
}

/// What is persisted for one VM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmRecord {
    pub vm: String,
    pub process: TaskId,
    pub threads: Vec<ThreadRecord>,
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

    /// The record of `process`, if there is a readable one.
    pub fn load(&self, process: TaskId) -> Option<VmRecord> {
        let bytes = fs::read(self.file_for(process)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    pub fn remove(&self, process: TaskId) -> io::Result<()> {
        match fs::remove_file(self.file_for(process)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Every record, with the path it came from. Unreadable files are returned as errors so the
    /// caller can report them; they are left in place for a human to look at.
    pub fn load_all(&self) -> io::Result<Vec<(PathBuf, Result<VmRecord, String>)>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if path.extension().and_then(|e| e.to_str()) == Some("tmp") {
                // A write interrupted before its rename: nothing was changed on its account
                // (records are saved before the change), and the previous record is intact.
                let _ = fs::remove_file(&path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let rec = fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()));
            out.push((path, rec));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

/// Whether a thread's current attributes look like ours: everything we set carries
/// `SCHED_FLAG_RESET_ON_FORK`, and differs from the original. Anything else was changed by
/// someone else after us (or never by us) and is left alone.
pub fn looks_applied_by_us(current: &SchedAttr, original: &SchedAttr) -> bool {
    current.flags & SCHED_FLAG_RESET_ON_FORK != 0 && !current.same_as(original)
}

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct RestoreReport {
    /// Threads put back to their original attributes.
    pub restored: u64,
    /// Threads that exited (or whose id now names another thread).
    pub gone: u64,
    /// Threads already at their original attributes, or changed by someone else since.
    pub untouched: u64,
    /// Human-readable errors; files with errors are kept.
    pub errors: Vec<String>,
}

/// Restores every thread recorded in `store` and removes the records that were fully handled.
pub fn restore_all(store: &StateDir, procfs: &ProcFs, sched: &mut dyn SchedOps) -> io::Result<RestoreReport> {
    let mut report = RestoreReport::default();
    for (path, rec) in store.load_all()? {
        let rec = match rec {
            Ok(r) => r,
            Err(e) => {
                report.errors.push(format!("{}: unreadable, kept: {e}", path.display()));
                continue;
            }
        };
        let mut failed = false;
        for t in &rec.threads {
            if !procfs.is_same_task(rec.process.id, t.task) {
                report.gone += 1;
                continue;
            }
            match sched.get(t.task.id) {
                Ok(cur) if looks_applied_by_us(&cur, &t.original) => match sched.set(t.task.id, &t.original) {
                    Ok(()) => report.restored += 1,
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => report.gone += 1,
                    Err(e) => {
                        failed = true;
                        report.errors.push(crate::sched::explain_set_error(t.task.id, &t.original, &e));
                    }
                },
                Ok(_) => report.untouched += 1,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => report.gone += 1,
                Err(e) => {
                    failed = true;
                    report.errors.push(format!("sched_getattr({}): {e}", t.task.id));
                }
            }
        }
        if !failed {
            fs::remove_file(&path)?;
        }
    }
    Ok(report)
}
