//! Readers of `/proc` for cosched.
//!
//! Everything takes the proc root as a path ([`ProcFs::new`]), so tests run on fake trees made of
//! plain files in a temp dir. Only what the host daemon needs is read: a process's identity
//! (start time, executable, command name) and its threads (`task/*`: name, start time).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: cannot parse {what}: {content:?}")]
    Parse { path: PathBuf, what: &'static str, content: String },
}

impl Error {
    /// True when the process or thread does not exist (any more).
    pub fn is_gone(&self) -> bool {
        matches!(self, Error::Io { source, .. }
            if source.kind() == io::ErrorKind::NotFound || source.raw_os_error() == Some(libc_esrch()))
    }
}

/// ESRCH: reading a file of a task that exited between `readdir` and `open`.
const fn libc_esrch() -> i32 {
    3
}

pub type Result<T> = std::result::Result<T, Error>;

/// A task (process or thread) as identified across time: Linux reuses ids, so an id alone
/// names a different task after the first one exits. `start_time` is field 22 of `stat`
/// (clock ticks since boot) and is what makes the pair unique.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize)]
pub struct TaskId {
    pub id: i32,
    pub start_time: u64,
}

/// What a QEMU thread does, from its name (QEMU names its threads when started with
/// `-name ...,debug-threads=on`, which libvirt always sets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThreadRole {
    /// `CPU <n>/KVM`, `CPU <n>/TCG`, `ALL CPUs/TCG`: runs guest code.
    Vcpu,
    /// The thread-group leader: QEMU's main loop (device emulation, timers under TCG, chardevs).
    Main,
    /// `IO <id>`: an `-object iothread`.
    Io,
    /// `worker`: thread-pool threads doing blocking I/O for the block layer; exit after 10 s idle.
    Worker,
    /// Anything else (`call_rcu`, `vnc_worker`, `qemu-system-x86` without debug-threads, ...).
    Other,
}

impl ThreadRole {
    /// Classifies a thread of process `pid` from its `comm`.
    pub fn classify(pid: i32, tid: i32, comm: &str) -> ThreadRole {
        if comm.starts_with("CPU ") && (comm.ends_with("/KVM") || comm.ends_with("/TCG")) || comm == "ALL CPUs/TCG" {
            ThreadRole::Vcpu
        } else if tid == pid {
            ThreadRole::Main
        } else if comm.starts_with("IO ") {
            ThreadRole::Io
        } else if comm == "worker" {
            ThreadRole::Worker
        } else {
            ThreadRole::Other
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ThreadRole::Vcpu => "vcpu",
            ThreadRole::Main => "main",
            ThreadRole::Io => "io",
            ThreadRole::Worker => "worker",
            ThreadRole::Other => "other",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ThreadInfo {
    pub task: TaskId,
    pub comm: String,
    pub role: ThreadRole,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessInfo {
    pub task: TaskId,
    pub comm: String,
    /// Target of `exe` (empty if unreadable, e.g. a kernel thread).
    pub exe: String,
}

impl ProcessInfo {
    /// A QEMU system emulator: `qemu-system-<arch>` or `qemu-kvm` (RHEL's name), judged by the
    /// executable's file name (a deleted-and-upgraded binary reads `... (deleted)`), or by the
    /// command name when `exe` is unreadable.
    pub fn is_qemu(&self) -> bool {
        let exe_name = self.exe.trim_end_matches(" (deleted)").rsplit('/').next().unwrap_or_default();
        let name = if exe_name.is_empty() { self.comm.as_str() } else { exe_name };
        name.starts_with("qemu-system-") || name == "qemu-kvm"
            // comm is truncated to 15 bytes: "qemu-system-x86"
            || (exe_name.is_empty() && name.starts_with("qemu-system"))
    }
}

/// `/proc`, or a fake tree shaped like it.
#[derive(Debug, Clone)]
pub struct ProcFs {
    root: PathBuf,
}

impl Default for ProcFs {
    fn default() -> Self {
        ProcFs::new("/proc")
    }
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })
}

/// Parses `stat` (`pid (comm) state ...`): returns (comm, start_time). The command name may hold
/// spaces and parentheses, so the fixed fields are read after the last `)`.
fn parse_stat(path: &Path, content: &str) -> Result<(String, u64)> {
    let bad = |what| Error::Parse { path: path.to_path_buf(), what, content: content.into() };
    let open = content.find('(').ok_or_else(|| bad("comm"))?;
    let close = content.rfind(')').ok_or_else(|| bad("comm"))?;
    if close < open {
        return Err(bad("comm"));
    }
    let comm = content[open + 1..close].to_string();
    // Fields after ')' start at field 3 (state); start_time is field 22.
    let start_time = content[close + 1..]
        .split_whitespace()
        .nth(22 - 3)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("start_time"))?;
    Ok((comm, start_time))
}

impl ProcFs {
    pub fn new(root: impl Into<PathBuf>) -> ProcFs {
        ProcFs { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn task_dir(&self, pid: i32, tid: i32) -> PathBuf {
        self.root.join(pid.to_string()).join("task").join(tid.to_string())
    }

    /// Identity of task `tid` of process `pid` (`tid == pid` for the process itself).
    pub fn task_id(&self, pid: i32, tid: i32) -> Result<TaskId> {
        let path = self.task_dir(pid, tid).join("stat");
        let (_, start_time) = parse_stat(&path, &read(&path)?)?;
        Ok(TaskId { id: tid, start_time })
    }

    pub fn process(&self, pid: i32) -> Result<ProcessInfo> {
        let dir = self.root.join(pid.to_string());
        let stat = dir.join("stat");
        let (comm, start_time) = parse_stat(&stat, &read(&stat)?)?;
        let exe = fs::read_link(dir.join("exe")).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(ProcessInfo { task: TaskId { id: pid, start_time }, comm, exe })
    }

    /// The thread ids of `pid` (one `readdir`; cheap enough for every boost).
    pub fn thread_ids(&self, pid: i32) -> Result<Vec<i32>> {
        let dir = self.root.join(pid.to_string()).join("task");
        let entries = fs::read_dir(&dir).map_err(|source| Error::Io { path: dir.clone(), source })?;
        Ok(entries.flatten().filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok())).collect())
    }

    /// One thread of `pid`.
    pub fn thread(&self, pid: i32, tid: i32) -> Result<ThreadInfo> {
        let path = self.task_dir(pid, tid).join("stat");
        let (comm, start_time) = parse_stat(&path, &read(&path)?)?;
        let role = ThreadRole::classify(pid, tid, &comm);
        Ok(ThreadInfo { task: TaskId { id: tid, start_time }, comm, role })
    }

    /// Every thread of `pid`, sorted by tid. Threads that exit while we read are skipped; the
    /// process itself being gone is an error.
    pub fn threads(&self, pid: i32) -> Result<Vec<ThreadInfo>> {
        let dir = self.root.join(pid.to_string()).join("task");
        let entries = fs::read_dir(&dir).map_err(|source| Error::Io { path: dir.clone(), source })?;
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| Error::Io { path: dir.clone(), source })?;
            let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            match self.thread(pid, tid) {
                Ok(t) => out.push(t),
                Err(e) if e.is_gone() => continue,
                Err(e) => return Err(e),
            }
        }
        out.sort_by_key(|t| t.task.id);
        Ok(out)
    }

    /// True if `task` (a thread id with its start time) still names the same live thread of `pid`.
    pub fn is_same_task(&self, pid: i32, task: TaskId) -> bool {
        matches!(self.task_id(pid, task.id), Ok(t) if t == task)
    }

    /// The command line of process `pid`, one argument per element.
    pub fn cmdline(&self, pid: i32) -> Result<Vec<String>> {
        let path = self.root.join(pid.to_string()).join("cmdline");
        let raw = fs::read(&path).map_err(|source| Error::Io { path, source })?;
        Ok(raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect())
    }

    /// Every process id under the root.
    pub fn pids(&self) -> Result<Vec<i32>> {
        let entries = fs::read_dir(&self.root).map_err(|source| Error::Io { path: self.root.clone(), source })?;
        Ok(entries.flatten().filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok())).collect())
    }

    /// Processes holding the socket with this inode (`fd/*` links reading `socket:[inode]`).
    /// Processes that exit or deny access while we look are skipped.
    pub fn socket_holders(&self, inode: u64) -> Vec<i32> {
        let want = format!("socket:[{inode}]");
        let Ok(procs) = fs::read_dir(&self.root) else { return Vec::new() };
        let mut out = Vec::new();
        for p in procs.flatten() {
            let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
            let Ok(fds) = fs::read_dir(p.path().join("fd")) else { continue };
            if fds.flatten().any(|fd| fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str())) {
                out.push(pid);
            }
        }
        out.sort_unstable();
        out
    }
}

/// The devices a process holds open that raise events for it: tap devices (`/dev/net/tun` fds)
/// and block devices. Regular files (disk images) are not here: an image on a shared filesystem
/// completes its I/O on a device every user of that filesystem shares, so it names no one VM.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProcessDevices {
    /// The inode of the process's network namespace (`ns/net`, `net:[INODE]`): where its taps
    /// are, as far as /proc tells (a tap's fd passed in from another namespace is not told).
    pub netns: Option<u64>,
    /// The interface names of its tap fds (`iff:` of `fdinfo/<fd>`), sorted, each once.
    pub taps: Vec<String>,
    /// `st_rdev` of the block devices it holds open, sorted, each once.
    pub block_devices: Vec<u64>,
}

impl ProcFs {
    /// The devices process `pid` holds open ([`ProcessDevices`]). Fds closed while we look are
    /// skipped; the process being gone (or its fds unreadable) is an error.
    pub fn devices(&self, pid: i32) -> Result<ProcessDevices> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let dir = self.root.join(pid.to_string());
        let netns = fs::read_link(dir.join("ns/net")).ok().and_then(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
        });
        let fd_dir = dir.join("fd");
        let entries = fs::read_dir(&fd_dir).map_err(|source| Error::Io { path: fd_dir.clone(), source })?;
        let mut out = ProcessDevices { netns, ..Default::default() };
        for e in entries.flatten() {
            let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let Ok(target) = fs::read_link(e.path()) else { continue };
            if target == Path::new("/dev/net/tun") {
                let info = fs::read_to_string(dir.join("fdinfo").join(fd.to_string())).unwrap_or_default();
                // A tun fd not yet attached to an interface has no `iff:` line.
                if let Some(name) = info.lines().find_map(|l| l.strip_prefix("iff:")).map(str::trim) {
                    if !name.is_empty() {
                        out.taps.push(name.to_string());
                    }
                }
            } else if target.starts_with("/dev") {
                // The link's target, followed: the device file opened, in whatever mount
                // namespace (a fake tree's links point at real devices).
                if let Ok(m) = fs::metadata(e.path()) {
                    if m.file_type().is_block_device() {
                        out.block_devices.push(m.rdev());
                    }
                }
            }
        }
        out.taps.sort();
        out.taps.dedup();
        out.block_devices.sort_unstable();
        out.block_devices.dedup();
        Ok(out)
    }
}

/// The VM name QEMU was started with: `-name NAME[,...]` or `-name guest=NAME[,...]` (libvirt
/// passes the domain name so).
pub fn qemu_name(args: &[String]) -> Option<String> {
    let i = args.iter().position(|a| a == "-name" || a == "--name")?;
    let spec = args.get(i + 1)?;
    let first = spec.split(',').next()?;
    let name = spec.split(',').find_map(|p| p.strip_prefix("guest=")).unwrap_or(first);
    (!name.is_empty() && !name.contains('=')).then(|| name.to_string())
}

/// Number of vCPUs QEMU was started with: `-smp N`, `-smp cpus=N,...` or `-smp N,...`; 1 when
/// absent (QEMU's default). For QEMU without `debug-threads=on`, whose vCPU threads have no names.
pub fn qemu_smp(args: &[String]) -> u32 {
    let Some(i) = args.iter().position(|a| a == "-smp" || a == "--smp") else { return 1 };
    let Some(spec) = args.get(i + 1) else { return 1 };
    spec.split(',')
        .find_map(|part| match part.split_once('=') {
            Some(("cpus", n)) => n.parse().ok(),
            Some(_) => None,
            None => part.parse().ok(),
        })
        .unwrap_or(1)
}

/// Builds fake `/proc` trees for tests (here and in other crates). Always compiled, not behind a
/// feature: a feature that only tests turn on makes `cargo test` and `cargo build` compile this
/// crate, and every crate above it, twice (the daemon's binary does not use it).
pub mod fake {
    use super::*;

    /// A `stat` line as the kernel writes it, with the given comm and start time.
    pub fn stat_line(id: i32, comm: &str, start_time: u64) -> String {
        // Fields 3..=21 are filler; field 22 is start_time.
        let filler: Vec<String> = (4..=21).map(|i| i.to_string()).collect();
        format!("{id} ({comm}) S {} {start_time} 23 24\n", filler.join(" "))
    }

    /// Adds process `pid` with exe `exe` and the given threads `(tid, comm)`; thread start times
    /// are `1000 + tid` and the process's is `1000 + pid`.
    pub fn add_process(root: &Path, pid: i32, exe: &str, threads: &[(i32, &str)]) {
        let dir = root.join(pid.to_string());
        fs::create_dir_all(dir.join("task")).unwrap();
        let main_comm = threads.iter().find(|(t, _)| *t == pid).map(|t| t.1).unwrap_or("main");
        fs::write(dir.join("stat"), stat_line(pid, main_comm, 1000 + pid as u64)).unwrap();
        if !exe.is_empty() {
            std::os::unix::fs::symlink(exe, dir.join("exe")).unwrap();
        }
        for (tid, comm) in threads {
            add_thread(root, pid, *tid, comm);
        }
    }

    pub fn add_thread(root: &Path, pid: i32, tid: i32, comm: &str) {
        let t = root.join(pid.to_string()).join("task").join(tid.to_string());
        fs::create_dir_all(&t).unwrap();
        fs::write(t.join("stat"), stat_line(tid, comm, 1000 + tid as u64)).unwrap();
    }

    /// Gives process `pid` fd `fd` pointing at `target`, with `fdinfo` (if any).
    pub fn add_fd(root: &Path, pid: i32, fd: u32, target: &str, fdinfo: Option<&str>) {
        let dir = root.join(pid.to_string());
        fs::create_dir_all(dir.join("fd")).unwrap();
        fs::create_dir_all(dir.join("fdinfo")).unwrap();
        std::os::unix::fs::symlink(target, dir.join("fd").join(fd.to_string())).unwrap();
        if let Some(info) = fdinfo {
            fs::write(dir.join("fdinfo").join(fd.to_string()), info).unwrap();
        }
    }

    /// Puts process `pid` in network namespace `inode`.
    pub fn set_netns(root: &Path, pid: i32, inode: u64) {
        let dir = root.join(pid.to_string()).join("ns");
        fs::create_dir_all(&dir).unwrap();
        let _ = fs::remove_file(dir.join("net"));
        std::os::unix::fs::symlink(format!("net:[{inode}]"), dir.join("net")).unwrap();
    }

    pub fn remove_thread(root: &Path, pid: i32, tid: i32) {
        fs::remove_dir_all(root.join(pid.to_string()).join("task").join(tid.to_string())).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::fake::*;
    use super::*;

    fn qemu_tree() -> (tempfile::TempDir, ProcFs) {
        let dir = tempfile::tempdir().unwrap();
        add_process(
            dir.path(),
            4242,
            "/usr/bin/qemu-system-x86_64",
            &[
                (4242, "qemu-system-x86"),
                (4243, "call_rcu"),
                (4244, "IO mon_iothread"),
                (4245, "CPU 0/TCG"),
                (4246, "CPU 1/KVM"),
                (4250, "worker"),
                (4251, "IO iothread0"),
            ],
        );
        let fs = ProcFs::new(dir.path());
        (dir, fs)
    }

    #[test]
    fn classifies_qemu_threads() {
        let (_d, fs) = qemu_tree();
        let roles: Vec<(i32, ThreadRole)> = fs.threads(4242).unwrap().iter().map(|t| (t.task.id, t.role)).collect();
        assert_eq!(
            roles,
            vec![
                (4242, ThreadRole::Main),
                (4243, ThreadRole::Other),
                (4244, ThreadRole::Io),
                (4245, ThreadRole::Vcpu),
                (4246, ThreadRole::Vcpu),
                (4250, ThreadRole::Worker),
                (4251, ThreadRole::Io),
            ]
        );
    }

    #[test]
    fn single_threaded_tcg_name_is_a_vcpu() {
        assert_eq!(ThreadRole::classify(1, 2, "ALL CPUs/TCG"), ThreadRole::Vcpu);
        assert_eq!(ThreadRole::classify(1, 1, "qemu-system-x86"), ThreadRole::Main);
        assert_eq!(ThreadRole::classify(1, 3, "CPU 0/KVMX"), ThreadRole::Other);
    }

    #[test]
    fn process_identity_and_qemu_check() {
        let (d, fs) = qemu_tree();
        let p = fs.process(4242).unwrap();
        assert_eq!(p.task, TaskId { id: 4242, start_time: 5242 });
        assert!(p.is_qemu());
        add_process(d.path(), 77, "/usr/bin/python3.11", &[(77, "python3")]);
        let p = fs.process(77).unwrap();
        assert!(!p.is_qemu(), "python is not QEMU");
        add_process(d.path(), 78, "/usr/libexec/qemu-kvm (deleted)", &[(78, "qemu-kvm")]);
        assert!(fs.process(78).unwrap().is_qemu());
        add_process(d.path(), 79, "/tmp/qemu-system-evil/sh", &[(79, "sh")]);
        assert!(!fs.process(79).unwrap().is_qemu(), "only the file name counts");
    }

    #[test]
    fn comm_with_spaces_and_parens() {
        let p = Path::new("x");
        let (comm, st) = parse_stat(p, &stat_line(5, "a) (b c)", 99)).unwrap();
        assert_eq!((comm.as_str(), st), ("a) (b c)", 99));
        assert!(parse_stat(p, "5 (x) S 1 2").is_err());
    }

    #[test]
    fn vanished_threads_are_skipped_and_reuse_is_detected() {
        let (d, fs) = qemu_tree();
        let before = fs.threads(4242).unwrap();
        let worker = before.iter().find(|t| t.comm == "worker").unwrap().task;
        assert!(fs.is_same_task(4242, worker));
        remove_thread(d.path(), 4242, 4250);
        assert_eq!(fs.threads(4242).unwrap().len(), before.len() - 1);
        assert!(!fs.is_same_task(4242, worker));
        // Same tid comes back with another start time: a different thread.
        let t = d.path().join("4242/task/4250");
        fs::create_dir_all(&t).unwrap();
        fs::write(t.join("stat"), stat_line(4250, "worker", 777_777)).unwrap();
        assert!(!fs.is_same_task(4242, worker));
        let err = fs.threads(9999).unwrap_err();
        assert!(err.is_gone(), "{err}");
    }

    #[test]
    fn finds_the_holders_of_a_socket() {
        let (d, fs) = qemu_tree();
        add_process(d.path(), 77, "/usr/sbin/virtqemud", &[(77, "virtqemud")]);
        for (pid, fd, target) in [(4242, 3, "socket:[555]"), (4242, 4, "/dev/null"), (77, 9, "socket:[5555]")] {
            let dir = d.path().join(pid.to_string()).join("fd");
            fs::create_dir_all(&dir).unwrap();
            std::os::unix::fs::symlink(target, dir.join(fd.to_string())).unwrap();
        }
        assert_eq!(fs.socket_holders(555), vec![4242]);
        assert_eq!(fs.socket_holders(5555), vec![77]);
        assert!(fs.socket_holders(1).is_empty());
    }

    /// A tun fd's `fdinfo` as the kernel writes it.
    fn tun_fdinfo(iff: &str) -> String {
        format!("pos:\t0\nflags:\t0104002\nmnt_id:\t26\nino:\t1046\niff:\t{iff}\n")
    }

    #[test]
    fn finds_the_taps_and_block_devices_a_process_holds() {
        let (d, fs) = qemu_tree();
        let root = d.path();
        set_netns(root, 4242, 4026532500);
        add_fd(root, 4242, 0, "/dev/null", Some("pos:\t0\n"));
        add_fd(root, 4242, 3, "socket:[555]", None);
        add_fd(root, 4242, 9, "/dev/net/tun", Some(&tun_fdinfo("tap1")));
        add_fd(root, 4242, 10, "/dev/net/tun", Some(&tun_fdinfo("tap0")));
        // multiqueue: two fds on one interface
        add_fd(root, 4242, 11, "/dev/net/tun", Some(&tun_fdinfo("tap0")));
        // opened, not attached yet (TUNSETIFF not done)
        add_fd(root, 4242, 12, "/dev/net/tun", Some("pos:\t0\nflags:\t02\n"));
        // a disk image on a filesystem: not a device of its own
        add_fd(root, 4242, 13, "/var/lib/images/disk.qcow2", Some("pos:\t0\n"));
        // a block device, if this machine has one to point at
        let blk = ["/dev/loop0", "/dev/sda", "/dev/vda", "/dev/nvme0n1"].into_iter().find(|p| {
            use std::os::unix::fs::FileTypeExt;
            fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device())
        });
        if let Some(b) = blk {
            add_fd(root, 4242, 14, b, None);
            add_fd(root, 4242, 15, b, None);
        }
        let got = fs.devices(4242).unwrap();
        assert_eq!(got.netns, Some(4026532500));
        assert_eq!(got.taps, vec!["tap0".to_string(), "tap1".to_string()]);
        match blk {
            Some(b) => {
                use std::os::unix::fs::MetadataExt;
                assert_eq!(got.block_devices, vec![fs::metadata(b).unwrap().rdev()], "{b}");
            }
            None => assert!(got.block_devices.is_empty()),
        }
        // No fds readable: the process is gone (or not ours to read).
        add_process(root, 77, "/x", &[(77, "x")]);
        assert!(fs.devices(77).is_err());
        assert!(fs.devices(9999).unwrap_err().is_gone());
        // No namespace link: unknown, the taps are still told.
        add_fd(root, 77, 4, "/dev/net/tun", Some(&tun_fdinfo("t")));
        assert_eq!(
            fs.devices(77).unwrap(),
            ProcessDevices { netns: None, taps: vec!["t".into()], block_devices: vec![] }
        );
    }

    #[test]
    fn reads_the_devices_of_this_process() {
        let me = std::process::id() as i32;
        let got = ProcFs::default().devices(me).unwrap();
        assert!(got.netns.is_some(), "{got:?}");
    }

    #[test]
    fn vm_name_from_the_qemu_command_line() {
        let args = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(qemu_name(&args("qemu -name web1,debug-threads=on")), Some("web1".into()));
        assert_eq!(qemu_name(&args("qemu -name guest=dom1,debug-threads=on -m 1")), Some("dom1".into()));
        assert_eq!(qemu_name(&args("qemu -name debug-threads=on")), None);
        assert_eq!(qemu_name(&args("qemu -m 512")), None);
        let (d, fs) = qemu_tree();
        add_process(d.path(), 77, "/x", &[(77, "x")]);
        let mut pids = fs.pids().unwrap();
        pids.sort();
        assert_eq!(pids, vec![77, 4242]);
    }

    #[test]
    fn smp_from_the_qemu_command_line() {
        let args = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(qemu_smp(&args("qemu-system-x86_64 -m 512")), 1);
        assert_eq!(qemu_smp(&args("qemu-system-x86_64 -smp 4 -m 512")), 4);
        assert_eq!(qemu_smp(&args("qemu-system-x86_64 -smp cpus=2,sockets=1")), 2);
        assert_eq!(qemu_smp(&args("qemu-system-x86_64 -smp 3,maxcpus=8")), 3);
        assert_eq!(qemu_smp(&args("qemu-system-x86_64 -smp")), 1);
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("7")).unwrap();
        fs::write(d.path().join("7/cmdline"), b"qemu\x00-smp\x002\x00").unwrap();
        assert_eq!(qemu_smp(&ProcFs::new(d.path()).cmdline(7).unwrap()), 2);
    }

    #[test]
    fn reads_the_real_proc_of_this_process() {
        let fs = ProcFs::default();
        let me = std::process::id() as i32;
        let p = fs.process(me).unwrap();
        assert!(!p.is_qemu());
        let threads = fs.threads(me).unwrap();
        assert!(threads.iter().any(|t| t.task.id == me && t.role == ThreadRole::Main));
    }
}
