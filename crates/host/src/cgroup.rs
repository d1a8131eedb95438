//! A thread's cgroup membership: read from `/proc/<tid>/cgroup`, changed by writing the thread
//! id to the group's `tasks` (cgroup v1) or `cgroup.threads` (v2). Both roots are paths, so
//! tests use fake trees; the real ones are `/proc` and `/sys/fs/cgroup`.
//!
//! A hierarchy is named by a v1 controller (`blkio`, `cpu`, `cpuset`, ...; its hierarchy is
//! mounted at `<root>/<controller>`, as systemd and Debian mount it) or by `""` for the unified
//! v2 hierarchy mounted at `<root>`. Paths are relative to the hierarchy's root, as the kernel
//! shows them (`/`, `/machine.slice/...`).

use std::fs;
use std::io::{self, Write};
use std::path::PathBuf;

#[derive(Debug, Clone)]
pub struct CgroupFs {
    proc: PathBuf,
    root: PathBuf,
}

impl Default for CgroupFs {
    fn default() -> Self {
        CgroupFs::new("/proc", "/sys/fs/cgroup")
    }
}

impl CgroupFs {
    pub fn new(proc: impl Into<PathBuf>, root: impl Into<PathBuf>) -> CgroupFs {
        CgroupFs { proc: proc.into(), root: root.into() }
    }

    /// The group of thread `tid` in `hierarchy`.
    pub fn get(&self, tid: i32, hierarchy: &str) -> io::Result<String> {
        let path = self.proc.join(tid.to_string()).join("cgroup");
        let text = fs::read_to_string(&path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => io::Error::from_raw_os_error(libc::ESRCH),
            _ => e,
        })?;
        parse(&text, hierarchy).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("thread {tid} is in no {} hierarchy", if hierarchy.is_empty() { "v2" } else { hierarchy }),
            )
        })
    }

    /// Moves thread `tid` into `group` of `hierarchy`.
    pub fn set(&self, tid: i32, hierarchy: &str, group: &str) -> io::Result<()> {
        let dir = self.dir(hierarchy, group);
        let file = if hierarchy.is_empty() { "cgroup.threads" } else { "tasks" };
        // One write of the id: the kernel moves the thread, or says why not (ESRCH: gone).
        let mut f = fs::OpenOptions::new().write(true).open(dir.join(file))?;
        f.write_all(tid.to_string().as_bytes())
    }

    /// The directory of `group` in `hierarchy`.
    pub fn dir(&self, hierarchy: &str, group: &str) -> PathBuf {
        let base = if hierarchy.is_empty() { self.root.clone() } else { self.root.join(hierarchy) };
        base.join(group.trim_start_matches('/'))
    }
}

/// The path of `hierarchy` in a `/proc/<tid>/cgroup` text (`id:controllers:path` lines; v2 is
/// `0::path`).
fn parse(text: &str, hierarchy: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches =
            if hierarchy.is_empty() { controllers.is_empty() } else { controllers.split(',').any(|c| c == hierarchy) };
        matches.then(|| path.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_v1_and_v2_lines() {
        let text = "12:blkio:/vm1\n4:cpu,cpuacct:/\n1:name=systemd:/init.scope\n0::/machine.slice/vm1\n";
        assert_eq!(parse(text, "blkio").as_deref(), Some("/vm1"));
        assert_eq!(parse(text, "cpuacct").as_deref(), Some("/"));
        assert_eq!(parse(text, "name=systemd").as_deref(), Some("/init.scope"));
        assert_eq!(parse(text, "").as_deref(), Some("/machine.slice/vm1"));
        assert_eq!(parse(text, "cpuset"), None);
    }

    #[test]
    fn moves_threads_on_fake_v1_and_v2_trees() {
        let d = tempfile::tempdir().unwrap();
        let (proc, root) = (d.path().join("proc"), d.path().join("cg"));
        fs::create_dir_all(proc.join("42")).unwrap();
        fs::write(proc.join("42/cgroup"), "3:blkio:/\n0::/a\n").unwrap();
        for g in ["blkio/vm1", "b"] {
            fs::create_dir_all(root.join(g)).unwrap();
        }
        fs::write(root.join("blkio/vm1/tasks"), "").unwrap();
        fs::write(root.join("b/cgroup.threads"), "").unwrap();
        let cg = CgroupFs::new(&proc, &root);
        assert_eq!(cg.get(42, "blkio").unwrap(), "/");
        assert_eq!(cg.get(42, "").unwrap(), "/a");
        cg.set(42, "blkio", "/vm1").unwrap();
        assert_eq!(fs::read_to_string(root.join("blkio/vm1/tasks")).unwrap(), "42");
        cg.set(42, "", "/b").unwrap();
        assert_eq!(fs::read_to_string(root.join("b/cgroup.threads")).unwrap(), "42");
        assert_eq!(cg.dir("blkio", "/vm1"), root.join("blkio/vm1"));
        assert_eq!(cg.get(7, "blkio").unwrap_err().raw_os_error(), Some(libc::ESRCH), "no such thread");
        assert!(cg.get(42, "cpuset").is_err());
        assert!(cg.set(42, "blkio", "/missing").is_err());
    }
}
