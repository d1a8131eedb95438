//! A thread's cgroup membership: read from `/proc/<tid>/cgroup`, changed by writing the thread
//! id to the group's `tasks` (cgroup v1) or `cgroup.threads` (v2). Both roots are paths, so
//! tests use fake trees; the real ones are `/proc` and `/sys/fs/cgroup`.
//!
//! A hierarchy is named by a v1 controller (`blkio`, `cpu`, `cpuset`, ...; its hierarchy is
//! mounted at `<root>/<controller>`, as systemd and Debian mount it) or by `""` for the unified
//! v2 hierarchy: mounted at `<root>` on a v2-only host, at `<root>/unified` on a hybrid one
//! (systemd's layout: v1 controllers beside a v2 hierarchy with none, whose `cgroup.freeze`
//! and threaded groups are real all the same). Paths are relative to the hierarchy's root, as
//! the kernel shows them (`/`, `/machine.slice/...`).
//!
//! [`RESCTRL`] names resctrl (`/sys/fs/resctrl`, Intel RDT / AMD PQoS) as one more hierarchy
//! that places threads one by one: its groups are directories with a `tasks` file, like a v1
//! hierarchy's, and a thread's group is the `res:` line of `/proc/<tid>/cpu_resctrl_groups`
//! (or, without that file, the group whose `tasks` lists it; the default group `/` otherwise).

use std::fs;
use std::io::{self, Write};
use std::path::PathBuf;

/// The name of resctrl as a hierarchy.
pub const RESCTRL: &str = "resctrl";

/// The groups the daemon makes (and removes once it has restored their VM), by the prefix of
/// their name: the I/O weight lever's, ...
pub const IO_GROUP_PREFIX: &str = "cosched-io-";
/// ... the shield's vCPU groups, ...
pub const SHIELD_GROUP_PREFIX: &str = "cosched-shield-";
/// ... and the memory-bandwidth throttle's frozen (or resctrl) groups.
pub const MEMBW_GROUP_PREFIX: &str = "cosched-membw-";
/// Every kind of group the daemon makes.
pub const OWN_GROUP_PREFIXES: [&str; 3] = [IO_GROUP_PREFIX, SHIELD_GROUP_PREFIX, MEMBW_GROUP_PREFIX];

/// Whether `group`'s own name starts with `prefix`.
pub fn is_named(group: &str, prefix: &str) -> bool {
    group.rsplit('/').next().is_some_and(|leaf| leaf.starts_with(prefix))
}

/// The parent of `group` (`/` for a top-level group).
pub fn parent(group: &str) -> &str {
    match group.rsplit_once('/') {
        Some(("", _)) | None => "/",
        Some((p, _)) => p,
    }
}

/// The default weight in a BFQ weight file: `N` (v1 `blkio.bfq.weight`) or the `default N`
/// line (v2 `io.bfq.weight`, which may add per-device lines); also a plain number file's value
/// (`cgroup.freeze`).
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

#[derive(Debug, Clone)]
pub struct CgroupFs {
    proc: PathBuf,
    root: PathBuf,
    resctrl: PathBuf,
}

impl Default for CgroupFs {
    fn default() -> Self {
        CgroupFs::new("/proc", "/sys/fs/cgroup")
    }
}

impl CgroupFs {
    /// resctrl is at `/sys/fs/resctrl` unless [`CgroupFs::with_resctrl`] says.
    pub fn new(proc: impl Into<PathBuf>, root: impl Into<PathBuf>) -> CgroupFs {
        CgroupFs { proc: proc.into(), root: root.into(), resctrl: "/sys/fs/resctrl".into() }
    }

    pub fn with_resctrl(mut self, resctrl: impl Into<PathBuf>) -> CgroupFs {
        self.resctrl = resctrl.into();
        self
    }

    /// The group of thread `tid` in `hierarchy`.
    pub fn get(&self, tid: i32, hierarchy: &str) -> io::Result<String> {
        if hierarchy == RESCTRL {
            return self.resctrl_group(tid);
        }
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

    /// Thread `tid`'s resctrl control group.
    fn resctrl_group(&self, tid: i32) -> io::Result<String> {
        if !self.proc.join(tid.to_string()).is_dir() {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        // `res:/` (the default group) or `res:<name>`; `res:` alone: resctrl is not mounted.
        if let Ok(text) = fs::read_to_string(self.proc.join(tid.to_string()).join("cpu_resctrl_groups")) {
            if let Some(res) = text.lines().find_map(|l| l.strip_prefix("res:")) {
                if res.is_empty() {
                    return Err(io::Error::other("resctrl is not mounted (cpu_resctrl_groups has an empty res:)"));
                }
                return Ok(format!("/{}", res.trim_start_matches('/')));
            }
        }
        // No such file (a kernel without PROC_CPU_RESCTRL): the control group whose tasks
        // list it. Control groups are the top-level directories with a `tasks` file.
        let id = tid.to_string();
        for e in fs::read_dir(&self.resctrl)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if matches!(name.as_str(), "info" | "mon_groups" | "mon_data") {
                continue;
            }
            let Ok(tasks) = fs::read_to_string(e.path().join("tasks")) else { continue };
            if tasks.split_whitespace().any(|t| t == id) {
                return Ok(format!("/{name}"));
            }
        }
        Ok("/".into())
    }

    /// Moves thread `tid` into `group` of `hierarchy`.
    pub fn set(&self, tid: i32, hierarchy: &str, group: &str) -> io::Result<()> {
        let dir = self.dir(hierarchy, group);
        let file = if hierarchy.is_empty() { "cgroup.threads" } else { "tasks" };
        // One write of the id: the kernel moves the thread, or says why not (ESRCH: gone).
        let mut f = fs::OpenOptions::new().write(true).open(dir.join(file))?;
        f.write_all(tid.to_string().as_bytes())
    }

    /// Creates `group` in `hierarchy` if it does not exist.
    pub fn make_group(&self, hierarchy: &str, group: &str) -> io::Result<()> {
        match fs::create_dir(self.dir(hierarchy, group)) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        }
    }

    /// Removes `group` of `hierarchy` if it exists (the kernel refuses while it holds tasks or
    /// children: `EBUSY`).
    pub fn remove_group(&self, hierarchy: &str, group: &str) -> io::Result<()> {
        let dir = self.dir(hierarchy, group);
        match fs::remove_dir(&dir) {
            // A cgroup file system removes a group with its control files; ENOTEMPTY comes
            // only from a plain directory standing in for one (a test's fake tree).
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) && !is_cgroupfs(&dir) => fs::remove_dir_all(&dir),
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// The content of a group's control file (e.g. `blkio.bfq.weight`), trimmed.
    pub fn read(&self, hierarchy: &str, group: &str, file: &str) -> io::Result<String> {
        Ok(fs::read_to_string(self.dir(hierarchy, group).join(file))?.trim().to_string())
    }

    /// Writes a group's control file in one write. (`create`: a cgroup file system has the
    /// file already; a fake tree gets it.)
    pub fn write(&self, hierarchy: &str, group: &str, file: &str, value: &str) -> io::Result<()> {
        let path = self.dir(hierarchy, group).join(file);
        let mut f = fs::OpenOptions::new().write(true).create(true).truncate(true).open(path)?;
        f.write_all(value.as_bytes())
    }

    /// Whether `hierarchy` is mounted here (a v1 controller's directory, or the v2 root's
    /// `cgroup.controllers`).
    pub fn has_hierarchy(&self, hierarchy: &str) -> bool {
        if hierarchy.is_empty() {
            self.v2_root().join("cgroup.controllers").is_file()
        } else if hierarchy == RESCTRL {
            self.resctrl.join("tasks").is_file()
        } else {
            self.root.join(hierarchy).join("tasks").is_file()
        }
    }

    /// The controllers the v2 hierarchy offers (`cgroup.controllers` of its root).
    pub fn v2_controllers(&self) -> Vec<String> {
        fs::read_to_string(self.v2_root().join("cgroup.controllers"))
            .map(|s| s.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default()
    }

    pub fn root(&self) -> &std::path::Path {
        &self.root
    }

    /// Where the v2 hierarchy is: `<root>` where it is mounted there (a v2-only host), else
    /// `<root>/unified` where it is mounted there (a hybrid host), else `<root>` (so that what
    /// fails names it). Looked up at each use: a fake tree may be filled after the
    /// `CgroupFs` is made.
    pub fn v2_root(&self) -> PathBuf {
        let unified = self.root.join("unified");
        if !self.root.join("cgroup.controllers").is_file() && unified.join("cgroup.controllers").is_file() {
            unified
        } else {
            self.root.clone()
        }
    }

    /// Why RT group scheduling (`CONFIG_RT_GROUP_SCHED`, a v1 `cpu` hierarchy) refuses a
    /// real-time policy to thread `tid`: the groups from the top (not the root) down to its own
    /// whose `cpu.rt_runtime_us` is 0. `None` where that is not the reason (no such hierarchy
    /// or file, or every group has runtime). libvirt puts a domain's threads in `cpu` groups of
    /// its own (`/machine/<domain>.libvirt-qemu/vcpu0`) that have none.
    pub fn rt_runtime_blocker(&self, tid: i32) -> Option<String> {
        let group = self.get(tid, "cpu").ok()?;
        let mut zero = Vec::new();
        let mut g = group.trim_end_matches('/');
        while !g.is_empty() {
            if self.read("cpu", g, "cpu.rt_runtime_us").ok()? == "0" {
                zero.push(g);
            }
            g = &g[..g.rfind('/').unwrap_or(0)];
        }
        zero.reverse();
        (!zero.is_empty()).then(|| {
            format!(
                "its cpu cgroup {group} cannot run real-time tasks (RT group scheduling): cpu.rt_runtime_us is 0 \
                 in {}; give {} runtime, from the top down, or keep the VM out of the cpu controller (libvirt: \
                 cgroup_controllers in /etc/libvirt/qemu.conf without \"cpu\")",
                zero.join(", "),
                if zero.len() == 1 { "it" } else { "them" }
            )
        })
    }

    /// The directory of `group` in `hierarchy`.
    pub fn dir(&self, hierarchy: &str, group: &str) -> PathBuf {
        let base = match hierarchy {
            "" => self.v2_root(),
            RESCTRL => self.resctrl.clone(),
            _ => self.root.join(hierarchy),
        };
        base.join(group.trim_start_matches('/'))
    }
}

/// Whether `path` is on a cgroup (v1 or v2) or resctrl file system.
fn is_cgroupfs(path: &std::path::Path) -> bool {
    const CGROUP_SUPER_MAGIC: i64 = 0x27e0eb;
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    const RDTGROUP_SUPER_MAGIC: i64 = 0x0765_5821;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else { return false };
    // SAFETY: `statfs` is a plain C struct of integers, for which all zeroes is valid.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a struct the call fills.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    rc == 0 && matches!(st.f_type as i64, CGROUP_SUPER_MAGIC | CGROUP2_SUPER_MAGIC | RDTGROUP_SUPER_MAGIC)
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
    fn names_the_group_without_rt_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let (proc, root) = (dir.path().join("proc"), dir.path().join("cg"));
        let cg = CgroupFs::new(&proc, &root);
        fs::create_dir_all(root.join("cpu")).unwrap();
        let leaf = "/machine/qemu-1-vm.libvirt-qemu/vcpu0";
        for (tid, group) in [(10, leaf), (11, "/"), (12, "/other")] {
            fs::create_dir_all(proc.join(tid.to_string())).unwrap();
            fs::write(proc.join(format!("{tid}/cgroup")), format!("3:cpu,cpuacct:{group}\n")).unwrap();
        }
        let mut path = String::new();
        for (part, runtime) in [("machine", "950000"), ("qemu-1-vm.libvirt-qemu", "0"), ("vcpu0", "0")] {
            path = format!("{path}/{part}");
            cg.make_group("cpu", &path).unwrap();
            cg.write("cpu", &path, "cpu.rt_runtime_us", runtime).unwrap();
        }
        let why = cg.rt_runtime_blocker(10).unwrap();
        assert!(why.contains(&format!("cgroup {leaf} cannot run real-time")), "{why}");
        assert!(
            why.contains("is 0 in /machine/qemu-1-vm.libvirt-qemu, /machine/qemu-1-vm.libvirt-qemu/vcpu0; give them"),
            "the groups without runtime, from the top: {why}"
        );
        // With runtime in the leaf, the group above it alone is named.
        cg.write("cpu", leaf, "cpu.rt_runtime_us", "100000").unwrap();
        let why = cg.rt_runtime_blocker(10).unwrap();
        assert!(why.contains("is 0 in /machine/qemu-1-vm.libvirt-qemu; give it"), "{why}");
        cg.write("cpu", "/machine/qemu-1-vm.libvirt-qemu", "cpu.rt_runtime_us", "100000").unwrap();
        assert_eq!(cg.rt_runtime_blocker(10), None, "every group has runtime");
        // The root group, a group without the file (no RT group scheduling), a gone thread.
        assert_eq!(cg.rt_runtime_blocker(11), None);
        cg.make_group("cpu", "/other").unwrap();
        assert_eq!(cg.rt_runtime_blocker(12), None);
        assert_eq!(cg.rt_runtime_blocker(13), None);
    }

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

    /// A hybrid host (systemd's layout, this project's test host): v1 controllers at
    /// `<root>/<controller>` and the v2 hierarchy, with no controllers, at `<root>/unified`.
    #[test]
    fn a_hybrid_hosts_v2_hierarchy_is_found_under_unified() {
        let d = tempfile::tempdir().unwrap();
        let (proc, root) = (d.path().join("proc"), d.path().join("cg"));
        fs::create_dir_all(proc.join("42")).unwrap();
        fs::write(proc.join("42/cgroup"), "6:freezer:/\n0::/vm1\n").unwrap();
        fs::create_dir_all(root.join("freezer")).unwrap();
        fs::write(root.join("freezer/tasks"), "").unwrap();
        let cg = CgroupFs::new(&proc, &root);
        assert!(!cg.has_hierarchy(""), "no v2 hierarchy yet");
        assert_eq!((cg.v2_root(), cg.dir("", "/vm1")), (root.clone(), root.join("vm1")));
        fs::create_dir_all(root.join("unified/vm1")).unwrap();
        fs::write(root.join("unified/cgroup.controllers"), "\n").unwrap();
        fs::write(root.join("unified/vm1/cgroup.threads"), "").unwrap();
        assert!(cg.has_hierarchy("") && cg.has_hierarchy("freezer"));
        assert_eq!(cg.v2_controllers(), Vec::<String>::new(), "no controller bound in v2");
        assert_eq!(cg.dir("", "/vm1"), root.join("unified/vm1"));
        assert_eq!(cg.dir("freezer", "/a"), root.join("freezer/a"), "v1 stays where it is");
        cg.set(42, "", &cg.get(42, "").unwrap()).unwrap();
        assert_eq!(fs::read_to_string(root.join("unified/vm1/cgroup.threads")).unwrap(), "42");
        // A v2-only host: the hierarchy at the root wins.
        fs::write(root.join("cgroup.controllers"), "cpuset cpu io\n").unwrap();
        assert_eq!((cg.v2_root(), cg.v2_controllers().len()), (root.clone(), 3));
    }

    #[test]
    fn resctrl_is_a_hierarchy_of_its_own() {
        let d = tempfile::tempdir().unwrap();
        let (proc, rc) = (d.path().join("proc"), d.path().join("resctrl"));
        for t in ["41", "42", "43"] {
            fs::create_dir_all(proc.join(t)).unwrap();
        }
        fs::write(proc.join("41/cpu_resctrl_groups"), "res:/\nmon:/\n").unwrap();
        fs::write(proc.join("42/cpu_resctrl_groups"), "res:tenant\nmon:tenant/mon_groups/m\n").unwrap();
        fs::create_dir_all(rc.join("info/MB")).unwrap();
        fs::create_dir_all(rc.join("tenant")).unwrap();
        fs::write(rc.join("tasks"), "41\n42\n43\n").unwrap();
        fs::write(rc.join("tenant/tasks"), "").unwrap();
        let cg = CgroupFs::new(&proc, d.path().join("cg")).with_resctrl(&rc);
        assert!(cg.has_hierarchy(RESCTRL) && !CgroupFs::new(&proc, d.path()).has_hierarchy(RESCTRL));
        assert_eq!((cg.get(41, RESCTRL).unwrap(), cg.get(42, RESCTRL).unwrap()), ("/".into(), "/tenant".into()));
        // No cpu_resctrl_groups: found by the tasks files, the default group otherwise.
        assert_eq!(cg.get(43, RESCTRL).unwrap(), "/");
        fs::write(rc.join("tenant/tasks"), "7\n43\n").unwrap();
        assert_eq!(cg.get(43, RESCTRL).unwrap(), "/tenant");
        assert_eq!(cg.get(44, RESCTRL).unwrap_err().raw_os_error(), Some(libc::ESRCH));
        cg.make_group(RESCTRL, "/cosched-membw-9").unwrap();
        fs::write(rc.join("cosched-membw-9/tasks"), "").unwrap();
        cg.set(41, RESCTRL, "/cosched-membw-9").unwrap();
        assert_eq!(fs::read_to_string(rc.join("cosched-membw-9/tasks")).unwrap(), "41");
        cg.remove_group(RESCTRL, "/cosched-membw-9").unwrap();
        assert!(!rc.join("cosched-membw-9").exists());
        fs::write(proc.join("41/cpu_resctrl_groups"), "res:\nmon:\n").unwrap();
        assert!(cg.get(41, RESCTRL).unwrap_err().to_string().contains("not mounted"));
    }
}
