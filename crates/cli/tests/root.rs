//! Root tests on the real kernel: the real `cosched host` daemon, a process with real threads
//! posing as QEMU (`cosched-fake-qemu` copied to a file named `qemu-system-x86_64`), and a fake
//! guest speaking the wire protocol through it over a real unix socket. Policies are checked
//! with the real `sched_getattr`.
//!
//! Needs root. Without root these tests say so and pass, unless `COSCHED_REQUIRE_ROOT=1` (set by
//! the project's test command and CI), which makes a missing root a failure.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use cosched_host::sched::{self, SchedAttr, SCHED_FLAG_RESET_ON_FORK, SCHED_OTHER, SCHED_RR};
use cosched_proto::{caps, DenyReason, Event, Frame, Kind, Resource, StreamDecoder};

const CPU: Resource = Resource::Cpu;
use serde_json::Value;

/// Runtime control that persists: operator settings across restarts, reload, `disable --all`.
#[path = "root/persist.rs"]
mod persist;

/// The run delay measured by the host: normal against boosted beside CPU hogs.
#[path = "root/rundelay.rs"]
mod rundelay;

/// Event boosting (FEAS) from packets queued to a VM's tap while its main loop never sleeps.
#[path = "root/feasnet.rs"]
mod feasnet;

/// `cosched-fake-qemu` (crate `cosched-testtools`), built beside `cosched` by `cargo test
/// --workspace` (or `cargo build -p cosched-testtools`): a test tool, not shipped with the CLI.
fn fake_qemu_bin() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_cosched")).with_file_name("cosched-fake-qemu");
    assert!(
        bin.exists(),
        "{} missing: build the test tools (cargo build --release -p cosched-testtools), or run cargo test --workspace",
        bin.display()
    );
    bin
}

fn have_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var("COSCHED_REQUIRE_ROOT").is_ok_and(|v| v == "1") {
        panic!("COSCHED_REQUIRE_ROOT=1 but not running as root");
    }
    eprintln!("not root: skipping (set COSCHED_REQUIRE_ROOT=1 to make this a failure)");
    false
}

fn wait_for<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    wait_for_or(what, timeout, f, String::new)
}

/// [`wait_for`], and on a timeout `context()` ends the message (what was seen instead).
fn wait_for_or<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>, context: impl Fn() -> String) -> T {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}{}", context());
        std::thread::sleep(Duration::from_millis(10));
    }
}

struct World {
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> World {
        World { dir: tempfile::tempdir().unwrap() }
    }
    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
    fn socket_dir(&self) -> PathBuf {
        self.p("vms")
    }
    fn state_dir(&self) -> PathBuf {
        self.p("state")
    }
    fn control(&self) -> PathBuf {
        self.p("control.sock")
    }
    /// `cosched restore --state-dir` on this world's state.
    fn restore(&self) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_cosched"))
            .args(["restore", "--state-dir"])
            .arg(self.state_dir())
            .output()
            .unwrap()
    }

    fn daemon(&self, config: &str) -> Daemon {
        self.daemon_with(config, &[])
    }

    /// The daemon started through `prefix` (e.g. capsh, to run it as another user).
    fn daemon_with(&self, config: &str, prefix: &[&str]) -> Daemon {
        std::fs::write(self.p("host.toml"), config).unwrap();
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(env!("CARGO_BIN_EXE_cosched"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_cosched")),
        };
        let child = cmd
            .arg("host")
            .arg("--config")
            .arg(self.p("host.toml"))
            .arg("--socket-dir")
            .arg(self.socket_dir())
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--control-socket")
            .arg(self.control())
            .arg("-v")
            .stderr(Stdio::from(std::fs::File::create(self.p("daemon.log")).unwrap()))
            .spawn()
            .unwrap();
        let d = Daemon { child: Some(child), control: self.control(), log: self.p("daemon.log") };
        wait_for("the daemon's control socket", Duration::from_secs(10), || d.try_status());
        d
    }

    /// Starts a fake QEMU with a socket in the socket directory.
    fn vm(&self, name: &str, exe_name: &str, threads: &[&str]) -> FakeVm {
        self.vm_with(name, exe_name, threads, None)
    }

    /// With `listener`, the fake QEMU inherits that listening socket, as QEMU does when libvirt
    /// opens the chardev socket.
    fn vm_with(&self, name: &str, exe_name: &str, threads: &[&str], listener: Option<UnixListener>) -> FakeVm {
        let exe = self.fake_qemu(name, exe_name);
        self.vm_from(&exe, name, threads, listener)
    }

    /// The fake QEMU copied to `bin-<name>/<exe_name>`.
    fn fake_qemu(&self, name: &str, exe_name: &str) -> PathBuf {
        let bin_dir = self.p(&format!("bin-{name}"));
        std::fs::create_dir_all(&bin_dir).unwrap();
        let exe = bin_dir.join(exe_name);
        std::fs::copy(fake_qemu_bin(), &exe).unwrap();
        exe
    }

    /// Starts the fake QEMU from `exe` (already in place).
    fn vm_from(&self, exe: &Path, name: &str, threads: &[&str], listener: Option<UnixListener>) -> FakeVm {
        let args: Vec<String> = threads.iter().flat_map(|t| ["--thread".to_string(), t.to_string()]).collect();
        self.vm_args(exe, name, &args, threads, listener)
    }

    /// Starts the fake QEMU from `exe` with `args`, and waits for the threads `named`.
    fn vm_args(
        &self,
        exe: &Path,
        name: &str,
        args: &[String],
        named: &[&str],
        listener: Option<UnixListener>,
    ) -> FakeVm {
        std::fs::create_dir_all(self.socket_dir()).unwrap();
        let mut cmd = Command::new(exe);
        cmd.arg("--socket").arg(self.socket_dir().join(format!("{name}.sock")));
        cmd.args(args);
        if let Some(l) = &listener {
            let fd = l.as_raw_fd();
            cmd.arg("--listen-fd").arg(fd.to_string());
            // SAFETY: between fork and exec we only call fcntl, which is async-signal-safe; it
            // clears close-on-exec in the child's own descriptor table.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                        Err(std::io::Error::last_os_error())
                    } else {
                        Ok(())
                    }
                });
            }
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = spawn_fake_qemu(&mut cmd);
        drop(listener); // like libvirt, the launcher closes its copy once QEMU runs
        let mut stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut d = StreamDecoder::new();
            let mut buf = [0u8; 1024];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                d.push(&buf[..n]);
                while let Some(ev) = d.next_event() {
                    if let Event::Frame(f) = ev {
                        if tx.send(f).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let pid = child.id() as i32;
        let stdin = child.stdin.take();
        let vm = FakeVm { child, stdin, rx, pid, seq: 0 };
        wait_for("the fake VM's named threads", Duration::from_secs(5), || {
            let names: Vec<String> = vm.threads().into_iter().map(|t| t.1).collect();
            named.iter().all(|t| names.iter().any(|n| n == t)).then_some(())
        });
        vm
    }
}

/// Spawns a copy of the fake QEMU (or a hog beside it). A parallel test forking while our copy's fd was open makes
/// exec fail with ETXTBSY for a moment: retry. It starts at `SCHED_OTHER` nice 0 whatever the
/// test runner's class and nice are (`nice cargo test`, `chrt -i 0 cargo test`): the tests
/// compare its threads with what a QEMU starts with.
fn spawn_fake_qemu(cmd: &mut Command) -> Child {
    use std::os::unix::process::CommandExt;
    // SAFETY: sched_setscheduler and setpriority are async-signal-safe and touch only the child.
    unsafe {
        cmd.pre_exec(|| {
            let param = libc::sched_param { sched_priority: 0 };
            if libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::setpriority(libc::PRIO_PROCESS, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    wait_for("exec of the fake QEMU", Duration::from_secs(5), || match cmd.spawn() {
        Ok(c) => Some(c),
        Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => None,
        Err(e) => panic!("spawning {:?}: {e}", cmd.get_program()),
    })
}

struct Daemon {
    child: Option<Child>,
    control: PathBuf,
    log: PathBuf,
}

impl Daemon {
    fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_cosched"))
            .args(args)
            .arg("--control-socket")
            .arg(&self.control)
            .output()
            .unwrap()
    }
    fn try_status(&self) -> Option<Value> {
        let out = self.cli(&["status", "--json"]);
        out.status.success().then(|| serde_json::from_slice(&out.stdout).unwrap())
    }
    fn status(&self) -> Value {
        self.try_status().expect("status")
    }
    fn vm_status(&self, name: &str) -> Option<Value> {
        self.status()["vms"].as_array().unwrap().iter().find(|v| v["name"] == name).cloned()
    }
    fn wait_vm(&self, name: &str) -> Value {
        // The daemon retries a socket it could not use with a doubling back-off (50 ms, 100 ms,
        // ... 6.4 s: 12.7 s in all for 8 tries): a fake QEMU slow to start on a loaded host (a
        // libvirt-style listener's QEMU that has not accepted yet) costs several tries.
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(v) = self.vm_status(name) {
                return v;
            }
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            assert!(Instant::now() < end, "daemon did not connect to {name}; its log:\n{log}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    /// The last lines of the daemon's log, for a failure's message.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
    fn signal(&mut self, sig: i32) {
        let pid = self.child.as_ref().unwrap().id() as i32;
        // SAFETY: sending a signal to our own child.
        unsafe { libc::kill(pid, sig) };
        let status = self.child.take().unwrap().wait().unwrap();
        if sig == libc::SIGTERM {
            assert!(status.success(), "daemon exit on SIGTERM: {status:?}");
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal(libc::SIGTERM);
        }
    }
}

struct FakeVm {
    child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<Frame>,
    pid: i32,
    seq: u32,
}

impl FakeVm {
    fn threads(&self) -> Vec<(i32, String)> {
        let mut out = Vec::new();
        if let Ok(rd) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) {
            for e in rd.flatten() {
                let tid: i32 = e.file_name().to_str().unwrap().parse().unwrap();
                let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
                out.push((tid, comm.trim().to_string()));
            }
        }
        out.sort();
        out
    }
    fn tid(&self, comm: &str) -> i32 {
        self.threads().into_iter().find(|(_, c)| c == comm).unwrap_or_else(|| panic!("no thread {comm}")).0
    }
    fn write(&mut self, bytes: &[u8]) {
        let s = self.stdin.as_mut().unwrap();
        s.write_all(bytes).unwrap();
        s.flush().unwrap();
    }
    fn send(&mut self, kind: Kind, value: u64) -> u32 {
        self.seq += 1;
        let f = Frame::new(kind, self.seq, value);
        self.write(&f.encode());
        self.seq
    }
    fn recv(&self) -> Frame {
        self.rx.recv_timeout(Duration::from_secs(5)).expect("a frame from the host")
    }
    /// Sends a frame and returns the reply to it (unsolicited frames before it are returned too).
    fn request(&mut self, kind: Kind, value: u64) -> Frame {
        let seq = self.send(kind, value);
        loop {
            let f = self.recv();
            if f.seq == seq {
                return f;
            }
        }
    }
    fn register(&mut self) {
        let seq = self.seq + 1;
        assert_eq!(self.request(Kind::Register, caps::CPU), Frame::ack(seq, caps::CPU));
    }
    /// Every thread's attributes.
    fn attrs(&self) -> Vec<(String, SchedAttr)> {
        self.threads().into_iter().filter_map(|(tid, comm)| sched::get(tid).ok().map(|a| (comm, a))).collect()
    }
    /// Every thread boosted, waiting up to a second: a thread born since the daemon last listed
    /// the VM's threads is boosted by its next refresh (thread_refresh_ms, 100 ms).
    fn boosted_soon(&self, prio: u32) -> bool {
        let end = Instant::now() + Duration::from_secs(1);
        while Instant::now() < end {
            if self.all_boosted(prio) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    fn all_boosted(&self, prio: u32) -> bool {
        let a = self.attrs();
        !a.is_empty()
            && a.iter()
                .all(|(_, a)| a.policy == SCHED_RR && a.priority == prio && a.flags & SCHED_FLAG_RESET_ON_FORK != 0)
    }
    fn none_realtime(&self) -> bool {
        self.attrs().iter().all(|(_, a)| !a.is_realtime())
    }
}

impl Drop for FakeVm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A world with a daemon (config `config`) connected to one fake QEMU named vm1. Fields drop in
/// order: the VM, then the daemon (which restores), then the directories.
struct Setup {
    vm: FakeVm,
    d: Daemon,
    w: World,
}

impl Setup {
    /// The VM boosted, then the daemon killed with SIGKILL: its changes stay, recorded.
    fn boost_then_kill_the_daemon(&mut self) {
        self.vm.register();
        self.vm.request(Kind::Cpu, 1);
        assert!(self.vm.boosted_soon(1));
        self.d.signal(libc::SIGKILL);
    }
}

/// `None` without root (see [`have_root`]).
fn one_vm(config: &str) -> Option<Setup> {
    if !have_root() {
        return None;
    }
    let w = World::new();
    let d = w.daemon(config);
    let vm = w.vm("vm1", "qemu-system-x86_64", &THREADS);
    d.wait_vm("vm1");
    Some(Setup { vm, d, w })
}

/// Held by the tests that load a CPU for seconds (event boosting: a spinning vCPU and a hog) and
/// by those that time the daemon under load (the flood): run together under `cargo test`'s
/// threads, the first made the second miss its bound (seen in CI).
static CPU_HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn cpu_heavy() -> std::sync::MutexGuard<'static, ()> {
    CPU_HEAVY.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

const QUIET_POLICY: &str = "[policy]\nmax_continuous_boost_ms = 0\nmax_boost_share_permille = 1000\n\
    rt_guard_max_share_permille = 0\nhost_reserve_cpus = 0\n";
const THREADS: [&str; 3] = ["CPU 0/TCG", "IO iothread0", "worker"];

fn state_files(w: &World) -> Vec<PathBuf> {
    std::fs::read_dir(w.state_dir())
        .map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "json")).collect())
        .unwrap_or_default()
}

#[test]
fn boost_and_deboost_real_threads() {
    if !have_root() {
        return;
    }
    let w = World::new();
    let d = w.daemon(QUIET_POLICY);
    let mut vm = w.vm("vm1", "qemu-system-x86_64", &THREADS);
    let st = d.wait_vm("vm1");
    assert_eq!(st["pid"], vm.pid);
    // QEMU (and our fake) names a thread just after creating it: the daemon's view catches up
    // within its rescan interval.
    wait_for("thread roles in the status", Duration::from_secs(3), || {
        let st = d.vm_status("vm1").unwrap();
        let roles: Vec<String> =
            st["threads"].as_array().unwrap().iter().map(|t| t["role"].as_str().unwrap().to_string()).collect();
        ["vcpu", "io", "worker", "main"].iter().all(|r| roles.iter().any(|x| x == r)).then_some(())
    });

    // A niced vCPU thread must come back to nice 5, not 0.
    let vcpu = vm.tid("CPU 0/TCG");
    sched::set(vcpu, &SchedAttr::other(5, 0)).unwrap();
    let me_before = sched::get(std::process::id() as i32).unwrap();

    assert_eq!(vm.request(Kind::Cpu, 1), Frame::deny_for(1, CPU, DenyReason::NotRegistered));
    vm.register();
    assert_eq!(vm.request(Kind::Cpu, 1), Frame::ack(3, 1));
    assert!(vm.boosted_soon(1), "{:?}", vm.attrs());
    assert_eq!(state_files(&w).len(), 1, "originals persisted while boosted");

    // A thread that appears while boosted is boosted too: at once where thread events work
    // (well before the 1 s rescan that is their safety net), else by the next refresh.
    let events = d.status()["daemon"]["thread_events"].as_str().map(str::to_string);
    let within = if events.is_some() { Duration::from_millis(300) } else { Duration::from_secs(3) };
    let before = vm.threads().len();
    let t0 = Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(vm.pid, libc::SIGUSR1) };
    wait_for("the new worker thread to be boosted", within, || {
        (vm.threads().len() == before + 1 && vm.all_boosted(1)).then_some(())
    });
    eprintln!("new thread boosted {:?} after its creation was asked (thread events: {events:?})", t0.elapsed());

    assert_eq!(vm.request(Kind::Cpu, 0), Frame::ack(4, 0));
    assert!(vm.none_realtime(), "{:?}", vm.attrs());
    assert!(sched::get(vcpu).unwrap().same_as(&SchedAttr::other(5, 0)), "nice 5 restored exactly");
    assert_eq!(sched::get(std::process::id() as i32).unwrap(), me_before, "a process outside the VM is untouched");

    let st = d.vm_status("vm1").unwrap();
    assert_eq!(st["resources"]["cpu"]["counters"]["boosts"], 1);
    assert_eq!(st["resources"]["cpu"]["counters"]["deboosts"], 1);
    assert!(st["latency"]["count"].as_u64().unwrap() >= 2);
}

#[test]
fn budget_exhaustion_deboosts_and_denies() {
    let Some(Setup { w: _w, d, mut vm }) = one_vm(
        "[policy]\nmax_continuous_boost_ms = 300\nbudget_cooldown_ms = 500\nmax_boost_share_permille = 1000\nrt_guard_max_share_permille = 0\n",
    ) else { return };
    vm.register();
    let t0 = Instant::now();
    assert_eq!(vm.request(Kind::Cpu, 1), Frame::ack(2, 1));
    assert!(vm.boosted_soon(1));
    // The host ends the boost on its own, with an unsolicited DENY(budget).
    let f = vm.recv();
    let held = t0.elapsed();
    assert_eq!(f, Frame::deny_for(0, CPU, DenyReason::Budget));
    assert!(held >= Duration::from_millis(280) && held < Duration::from_millis(1000), "boost held {held:?}");
    assert!(vm.none_realtime(), "deboosted by the budget: {:?}", vm.attrs());
    // In the cooldown a new boost is refused.
    assert_eq!(vm.request(Kind::Cpu, 1), Frame::deny_for(3, CPU, DenyReason::Budget));
    assert!(vm.none_realtime());
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(vm.request(Kind::Cpu, 1), Frame::ack(4, 1));
    assert!(vm.boosted_soon(1));
    let st = d.vm_status("vm1").unwrap();
    assert_eq!(st["resources"]["cpu"]["counters"]["budget_exhausted"], 1);
    assert_eq!(st["resources"]["cpu"]["counters"]["denied"]["budget"], 2);
}

#[test]
fn a_flooding_guest_cannot_hold_off_its_budget() {
    let _heavy = cpu_heavy();
    let Some(Setup { w: _w, d, mut vm }) = one_vm(
        "[policy]\nmax_continuous_boost_ms = 300\nbudget_cooldown_ms = 100\nmax_boost_share_permille = 1000\n\
         rt_guard_max_share_permille = 0\nhost_reserve_cpus = 0\n",
    ) else {
        return;
    };
    vm.register();
    vm.request(Kind::Cpu, 1);
    assert!(vm.boosted_soon(1));
    // Keep the channel full of CPU 1 frames: the daemon is never out of bytes to read.
    let mut stdin = vm.stdin.take().unwrap();
    let flood = std::thread::spawn(move || {
        let chunk: Vec<u8> = (0..4096).flat_map(|i| Frame::cpu(10 + i, true).encode()).collect();
        let end = Instant::now() + Duration::from_secs(2);
        while Instant::now() < end {
            if stdin.write_all(&chunk).is_err() {
                break;
            }
        }
        stdin
    });
    let t0 = Instant::now();
    let budget = wait_for("DENY(budget) during the flood", Duration::from_secs(2), || loop {
        match vm.rx.try_recv() {
            Ok(f) if f == Frame::deny_for(0, CPU, DenyReason::Budget) => return Some(t0.elapsed()),
            Ok(_) => continue,
            Err(_) => return None,
        }
    });
    assert!(budget < Duration::from_millis(1000), "budget enforced {budget:?} into the flood");
    vm.stdin = Some(flood.join().unwrap());
    let st = d.vm_status("vm1").unwrap();
    assert!(st["resources"]["cpu"]["counters"]["budget_exhausted"].as_u64().unwrap() >= 1);
    assert!(
        st["resources"]["cpu"]["counters"]["denied"]["rate_limited"].as_u64().unwrap() > 1000,
        "{}",
        st["resources"]
    );
}

/// A guest sending past `[policy] read_rate` is read at that rate: what it sent waits in its
/// channel (none of it lost: every frame answered, in order), and another VM's request is
/// answered at once meanwhile.
#[test]
fn a_guest_past_its_read_rate_is_read_at_that_rate_and_loses_nothing() {
    if !have_root() {
        return;
    }
    const RATE: u64 = 4000;
    const SENT: u32 = 20_000;
    let w = World::new();
    let d = w.daemon(&format!("{QUIET_POLICY}read_rate = {RATE}\n"));
    assert_eq!(d.status()["daemon"]["read_rate_per_vm"], RATE);
    let mut hostile = w.vm("vm1", "qemu-system-x86_64", &THREADS);
    let mut victim = w.vm("vm2", "qemu-system-x86_64", &THREADS);
    d.wait_vm("vm1");
    d.wait_vm("vm2");
    victim.register();
    // vm1 is not registered: each of its frames is answered DENY(not_registered), with its seq.
    let mut stdin = hostile.stdin.take().unwrap();
    let t0 = Instant::now();
    let flood = std::thread::spawn(move || {
        let bytes: Vec<u8> = (1..=SENT).flat_map(|i| Frame::cpu(i, true).encode()).collect();
        stdin.write_all(&bytes).unwrap();
        stdin
    });
    std::thread::sleep(Duration::from_millis(1000));
    // Read at the rate: one burst (2048 frames) and RATE a second since.
    let read = d.vm_status("vm1").unwrap()["counters"]["frames"].as_u64().unwrap();
    let most = 2048 + RATE * t0.elapsed().as_millis() as u64 / 1000;
    assert!(read <= most && read >= RATE / 2, "{read} frames read in {:?} (at most {most})", t0.elapsed());
    // The other VM meanwhile: answered and boosted at once.
    let t = Instant::now();
    assert_eq!(victim.request(Kind::Cpu, 1), Frame::ack(2, 1));
    assert!(victim.boosted_soon(1));
    let victim_ms = t.elapsed().as_millis();
    assert!(victim_ms < 500, "the other VM's boost took {victim_ms} ms");
    victim.request(Kind::Cpu, 0);
    // Every frame answered, in order, at the read rate (not at once: it was held).
    let mut next = 1;
    while next <= SENT {
        let f = hostile.rx.recv_timeout(Duration::from_secs(5)).unwrap_or_else(|_| {
            panic!("frame {next} of {SENT} not answered; {}", d.vm_status("vm1").unwrap()["counters"])
        });
        assert_eq!(f, Frame::deny_for(next, CPU, DenyReason::NotRegistered));
        next += 1;
    }
    let took = t0.elapsed();
    let least = Duration::from_millis(u64::from(SENT - 2048) * 1000 / RATE * 8 / 10);
    assert!(took >= least, "{SENT} frames answered in {took:?}: faster than {RATE}/s");
    hostile.stdin = Some(flood.join().unwrap());
    let st = d.vm_status("vm1").unwrap();
    assert!(st["read_held"].as_u64().unwrap() >= 1, "{st}");
    assert_eq!(d.vm_status("vm2").unwrap()["read_held"], 0);
    let log = std::fs::read_to_string(&d.log).unwrap();
    assert!(log.contains("vm1: sends faster than 4000 frames/s ([policy] read_rate)"), "{log}");
    eprintln!("{SENT} frames at read_rate {RATE}: answered in {took:?}; the other VM's boost in {victim_ms} ms");
}

#[test]
fn rt_guard_moves_only_the_vcpus_to_the_guard_class_and_back() {
    if !have_root() {
        return;
    }
    let w = World::new();
    // Real time for at most 200 ms of every 400 ms.
    let d = w.daemon(
        "[policy]\nmax_continuous_boost_ms = 0\nmax_boost_share_permille = 1000\nhost_reserve_cpus = 0\n\
         rt_guard_window_ms = 400\nrt_guard_max_share_permille = 500\nrt_guard_hysteresis_ms = 50\n",
    );
    let mut vm = w.vm("vm1", "qemu-system-x86_64", &THREADS);
    d.wait_vm("vm1");
    vm.register();
    vm.request(Kind::Cpu, 1);
    let vcpu = vm.tid("CPU 0/TCG");
    let guarded = SchedAttr::other(-20, SCHED_FLAG_RESET_ON_FORK);
    let t0 = Instant::now();
    wait_for("the vCPU at the guard class", Duration::from_secs(2), || {
        sched::get(vcpu).unwrap().same_as(&guarded).then_some(())
    });
    let demoted = t0.elapsed();
    assert!(demoted >= Duration::from_millis(150), "guarded after {demoted:?}");
    for (comm, a) in vm.attrs() {
        if comm != "CPU 0/TCG" {
            assert!(a.policy == SCHED_RR && a.priority == 1, "{comm} stays real-time: {a}");
        }
    }
    wait_for("the vCPU back at real time", Duration::from_secs(2), || {
        let a = sched::get(vcpu).unwrap();
        (a.policy == SCHED_RR).then_some(())
    });
    assert_eq!(d.vm_status("vm1").unwrap()["resources"]["cpu"]["level"], "boosted");
    assert!(d.vm_status("vm1").unwrap()["resources"]["cpu"]["counters"]["guard_demotions"].as_u64().unwrap() >= 1);
    vm.request(Kind::Cpu, 0);
    assert!(vm.none_realtime());
    assert!(sched::get(vcpu).unwrap().same_as(&SchedAttr::other(0, 0)), "nice -20 does not stick");
}

/// The reservation the deadline test asks the daemon for (µs), and the probe asks the kernel for.
const DL_RUNTIME_US: u64 = 10;
const DL_PERIOD_US: u64 = 1000;

/// Whether the kernel admits, right now, the very reservation the daemon will ask for. On Linux
/// 6.18 a thread that leaves SCHED_DEADLINE while asleep never gives its bandwidth back, so a host
/// that has run SCHED_DEADLINE boosts may have none left: the test must not depend on that.
fn deadline_admitted() -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        tx.send(unsafe { libc::gettid() }).unwrap();
        let _ = done_rx.recv();
    });
    let tid = rx.recv().unwrap();
    let asked = SchedAttr::deadline(DL_RUNTIME_US * 1000, DL_PERIOD_US * 1000, 0);
    let result = sched::set(tid, &asked);
    let _ = sched::set(tid, &SchedAttr::other(0, 0));
    done_tx.send(()).unwrap();
    t.join().unwrap();
    match result {
        Ok(()) => true,
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => false,
        // Anything but an admission refusal means the probe itself is wrong.
        Err(e) => panic!("probing SCHED_DEADLINE {asked}: {e}"),
    }
}

#[test]
fn deadline_and_nice_boost_classes_on_the_real_kernel() {
    if !have_root() {
        return;
    }
    let admitted = deadline_admitted();
    eprintln!(
        "SCHED_DEADLINE {DL_RUNTIME_US}/{DL_PERIOD_US} µs {}",
        if admitted {
            "admitted by this kernel at the probe"
        } else {
            "refused by admission control on this host at the probe (leaked bandwidth?)"
        }
    );
    let reservation = format!("SCHED_DEADLINE {DL_RUNTIME_US}/{DL_PERIOD_US}/{DL_PERIOD_US} us|RESET_ON_FORK");
    for (class, check) in [("deadline", reservation.as_str()), ("nice", "SCHED_OTHER nice -20|RESET_ON_FORK")] {
        let config = format!(
            "{QUIET_POLICY}[boost]\npolicy = \"{class}\"\ndeadline_runtime_us = {DL_RUNTIME_US}\n\
             deadline_period_us = {DL_PERIOD_US}\n"
        );
        let Some(Setup { w: _w, d, mut vm }) = one_vm(&config) else { return };
        vm.register();
        vm.request(Kind::Cpu, 1);
        let vcpu = sched::get(vm.tid("CPU 0/TCG")).unwrap();
        // Which path is taken is the kernel's decision at the daemon's request: leaked
        // bandwidth comes and goes (seen in CI: refused at the probe, admitted a moment later).
        if class == "deadline" && vcpu.policy != sched::SCHED_DEADLINE {
            // The daemon must say why (admission control, nothing else) and leave the thread
            // as it was.
            assert_eq!(vcpu.to_string(), "SCHED_OTHER nice 0");
            wait_for("the admission error in the log", Duration::from_secs(3), || {
                std::fs::read_to_string(&d.log)
                    .unwrap()
                    .contains("admission control refused the bandwidth")
                    .then_some(())
            });
            vm.request(Kind::Cpu, 0);
            assert!(vm.none_realtime());
            continue;
        }
        assert_eq!(vcpu.to_string(), check, "{class}");
        let main = sched::get(vm.pid).unwrap();
        if class == "deadline" {
            assert_eq!(main.to_string(), "SCHED_FIFO 1|RESET_ON_FORK", "other threads real-time");
            // No vCPU at an RT class: the guard is off.
            assert_eq!(d.status()["policy"]["rt_guard_max_share_permille"], 0);
        } else {
            assert_eq!(main.to_string(), check);
        }
        vm.request(Kind::Cpu, 0);
        assert!(vm.attrs().iter().all(|(_, a)| a.same_as(&SchedAttr::other(0, 0))), "{class}: {:?}", vm.attrs());
    }
}

#[test]
fn the_host_reserve_refuses_a_boost_past_it() {
    if !have_root() {
        return;
    }
    let cpus = std::thread::available_parallelism().unwrap().get();
    let w = World::new();
    // Keep all CPUs but one for the host: one 1-vCPU VM may be boosted at a time.
    let d = w.daemon(&format!(
        "[policy]\nmax_continuous_boost_ms = 0\nmax_boost_share_permille = 1000\nrt_guard_max_share_permille = 0\n\
         host_reserve_cpus = {}\n",
        cpus - 1
    ));
    let mut vm1 = w.vm("vm1", "qemu-system-x86_64", &THREADS);
    let mut vm2 = w.vm("vm2", "qemu-system-x86_64", &THREADS);
    d.wait_vm("vm1");
    d.wait_vm("vm2");
    assert_eq!(d.status()["resources"]["cpu"]["boost_capacity_vcpus"], 1);
    vm1.register();
    vm2.register();
    assert_eq!(vm1.request(Kind::Cpu, 1), Frame::ack(2, 1));
    assert_eq!(vm2.request(Kind::Cpu, 1), Frame::deny_for(2, CPU, DenyReason::HostReserve));
    assert!(vm2.none_realtime());
    assert_eq!(d.vm_status("vm2").unwrap()["resources"]["cpu"]["counters"]["denied"]["host_reserve"], 1);
    vm1.request(Kind::Cpu, 0);
    assert_eq!(vm2.request(Kind::Cpu, 1), Frame::ack(3, 1));
    assert!(vm2.boosted_soon(1));
}

#[test]
fn operator_disable_enable_and_priority() {
    let Some(Setup { w: _w, d, mut vm }) = one_vm(QUIET_POLICY) else { return };
    vm.register();
    vm.request(Kind::Cpu, 1);
    assert!(d.cli(&["vm", "priority", "vm1", "7"]).status.success());
    wait_for("priority 7 applied", Duration::from_secs(2), || vm.all_boosted(7).then_some(()));

    let out = d.cli(&["vm", "disable", "vm1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(vm.recv(), Frame::disable(caps::CPU));
    assert!(vm.none_realtime(), "disabled VM deboosted: {:?}", vm.attrs());
    assert_eq!(vm.request(Kind::Register, caps::CPU), Frame::deny(3, DenyReason::Disabled));
    assert_eq!(vm.request(Kind::Cpu, 1), Frame::deny_for(4, CPU, DenyReason::NotRegistered));

    assert!(d.cli(&["vm", "enable", "vm1"]).status.success());
    assert_eq!(vm.recv(), Frame::enable(caps::CPU));
    vm.register();

    // Global switch.
    vm.request(Kind::Cpu, 1);
    assert!(vm.all_boosted(7));
    assert!(d.cli(&["disable"]).status.success());
    assert_eq!(vm.recv(), Frame::disable(caps::CPU));
    assert!(vm.none_realtime());
    assert_eq!(d.status()["resources"]["cpu"]["enabled"], false);
    assert!(d.cli(&["enable"]).status.success());
    assert_eq!(vm.recv(), Frame::enable(caps::CPU));

    // One resource, per VM: the CPU off for vm1 is a DISABLE(cpu) and a deboost.
    vm.request(Kind::Cpu, 1);
    assert!(vm.all_boosted(7));
    assert!(d.cli(&["vm", "disable", "vm1", "cpu"]).status.success());
    assert_eq!(vm.recv(), Frame::disable(caps::CPU));
    assert!(vm.none_realtime());
    assert_eq!(d.vm_status("vm1").unwrap()["resources"]["cpu"]["enabled"], false);
    assert!(d.cli(&["vm", "enable", "vm1", "cpu"]).status.success());
    assert_eq!(vm.recv(), Frame::enable(caps::CPU));
    // A resource this daemon has no actuator for is refused by name.
    let out = d.cli(&["disable", "membw"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("membw coordination is not supported by this daemon"),
        "{out:?}"
    );
    let out = d.cli(&["disable", "disk"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown resource \"disk\""), "{out:?}");

    // Errors are clear.
    let out = d.cli(&["vm", "disable", "nosuchvm"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no VM named \"nosuchvm\" (connected: vm1)"));
    let out = d.cli(&["vm", "priority", "vm1", "99"]);
    assert_eq!(out.status.code(), Some(2), "a usage error: {out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be a whole number from 1 to 98"), "{out:?}");
}

#[test]
fn malformed_frames_are_counted_refused_and_resynchronised() {
    let Some(Setup { w: _w, d, mut vm }) = one_vm(&format!("{QUIET_POLICY}malformed_rate = 5\n")) else { return };
    // 61 bytes of garbage then a valid REGISTER: DENY(malformed), then the ACK.
    let mut bytes: Vec<u8> = (0..61u32).map(|i| ((i * 37 + 11) % 256) as u8).collect();
    bytes.extend_from_slice(&Frame::register(1, caps::CPU).encode());
    vm.write(&bytes);
    assert_eq!(vm.recv(), Frame::deny(0, DenyReason::Malformed));
    assert_eq!(vm.recv(), Frame::ack(1, caps::CPU));
    // Unknown type: refused, seq echoed, stream stays aligned.
    let mut unknown = Frame::cpu(2, true).encode();
    unknown[3] = 0x42;
    vm.write(&unknown);
    assert_eq!(vm.recv(), Frame::deny(2, DenyReason::Malformed));
    vm.seq = 2;
    assert_eq!(vm.request(Kind::Cpu, 1), Frame::ack(3, 1));
    assert!(vm.boosted_soon(1));
    // A flood of garbage deregisters the VM and deboosts it.
    for _ in 0..20 {
        vm.write(b"\xff\xfe garbage");
        std::thread::sleep(Duration::from_millis(2));
    }
    wait_for("flood to deregister", Duration::from_secs(3), || {
        let st = d.vm_status("vm1").unwrap();
        (st["registered"] == false).then_some(())
    });
    assert!(vm.none_realtime());
    let st = d.vm_status("vm1").unwrap();
    assert!(st["counters"]["malformed"].as_u64().unwrap() >= 6);
    assert_eq!(st["counters"]["malformed_deregistrations"], 1);
    while vm.rx.try_recv().is_ok() {}
    assert_eq!(vm.request(Kind::Cpu, 1).deny_reason(), Some(DenyReason::NotRegistered));
}

#[test]
fn a_peer_that_is_not_qemu_is_refused() {
    if !have_root() {
        return;
    }
    let w = World::new();
    let d = w.daemon(QUIET_POLICY);
    let mut vm = w.vm("evil", "python3", &THREADS);
    wait_for("the socket to be reported unconnected", Duration::from_secs(5), || {
        let s = d.status();
        s["unconnected_sockets"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().ends_with("evil.sock"))
            .then_some(())
    });
    assert!(d.vm_status("evil").is_none());
    vm.send(Kind::Register, caps::CPU);
    vm.send(Kind::Cpu, 1);
    assert!(vm.rx.recv_timeout(Duration::from_millis(500)).is_err(), "no reply to a refused peer");
    assert!(vm.none_realtime());
    wait_for("the refusal in the daemon's log", Duration::from_secs(5), || {
        let log = std::fs::read_to_string(w.p("daemon.log")).unwrap();
        log.contains("refusing peer pid").then_some(())
    });
    let log = std::fs::read_to_string(w.p("daemon.log")).unwrap();
    assert!(log.contains("(python3): not a QEMU process"), "{log}");
}

#[test]
fn a_qemu_binary_that_is_not_root_owned_is_refused() {
    if !have_root() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let w = World::new();
    let d = w.daemon(QUIET_POLICY);
    // Any user can name a file qemu-system-x86_64: this one is owned by uid 1000.
    let bin_dir = w.p("bin-user");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let exe = bin_dir.join("qemu-system-x86_64");
    std::fs::copy(fake_qemu_bin(), &exe).unwrap();
    std::os::unix::fs::chown(&exe, Some(1000), Some(1000)).unwrap();
    let _vm = w.vm_from(&exe, "user", &THREADS, None);
    wait_for("the refusal in the daemon's log", Duration::from_secs(5), || {
        std::fs::read_to_string(w.p("daemon.log"))
            .unwrap()
            .contains("is not root-owned and protected (uid 1000")
            .then_some(())
    });
    assert!(d.vm_status("user").is_none());
    // World-writable is refused too, even when root owns it.
    std::os::unix::fs::chown(&exe, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o777)).unwrap();
    let exe2 = w.p("bin-user2/qemu-system-x86_64");
    std::fs::create_dir_all(exe2.parent().unwrap()).unwrap();
    std::fs::copy(&exe, &exe2).unwrap();
    std::fs::set_permissions(&exe2, std::fs::Permissions::from_mode(0o777)).unwrap();
    let _vm2 = w.vm_from(&exe2, "user2", &THREADS, None);
    wait_for("the second refusal", Duration::from_secs(5), || {
        std::fs::read_to_string(w.p("daemon.log")).unwrap().contains("mode 777").then_some(())
    });
    assert!(d.vm_status("user2").is_none());
}

#[test]
fn vm_priority_must_stay_below_the_daemon() {
    if !have_root() {
        return;
    }
    let w = World::new();
    let d = w.daemon(&format!("daemon_priority = 20\n{QUIET_POLICY}"));
    let _vm = w.vm("vm1", "qemu-system-x86_64", &THREADS);
    d.wait_vm("vm1");
    let out = d.cli(&["vm", "priority", "vm1", "20"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("below the daemon's own (daemon_priority = 20)"), "{out:?}");
    assert!(d.cli(&["vm", "priority", "vm1", "19"]).status.success());
    assert_eq!(d.vm_status("vm1").unwrap()["priority"], 19);
}

#[test]
fn libvirt_style_fd_passing_finds_the_qemu_behind_the_listener() {
    if !have_root() {
        return;
    }
    let w = World::new();
    let d = w.daemon(QUIET_POLICY);
    // This test process plays libvirt: it binds and listens, so SO_PEERCRED names it.
    std::fs::create_dir_all(w.socket_dir()).unwrap();
    let listener = UnixListener::bind(w.socket_dir().join("lv.sock")).unwrap();
    let mut vm = w.vm_with("lv", "qemu-system-x86_64", &THREADS, Some(listener));
    let st = d.wait_vm("lv");
    assert_eq!(st["pid"], vm.pid, "the VM is the QEMU that accepted, not the listener");
    vm.register();
    vm.request(Kind::Cpu, 1);
    assert!(vm.boosted_soon(1));
    let me = sched::get(std::process::id() as i32).unwrap();
    assert!(!me.is_realtime(), "the listener (us) is not touched");
}

#[test]
fn kill_9_then_restore_command_and_restarted_daemon_put_everything_back() {
    if !have_root() {
        return;
    }
    for how in ["restore command", "daemon restart"] {
        let w = World::new();
        let mut d = w.daemon(QUIET_POLICY);
        let mut vm = w.vm("vm1", "qemu-system-x86_64", &THREADS);
        d.wait_vm("vm1");
        let worker = vm.tid("worker");
        sched::set(worker, &SchedAttr::other(-3, 0)).unwrap();
        vm.register();
        vm.request(Kind::Cpu, 1);
        assert!(vm.boosted_soon(1));
        let n = vm.threads().len();
        d.signal(libc::SIGKILL);
        assert!(vm.boosted_soon(1), "kill -9 restores nothing by itself");
        assert_eq!(state_files(&w).len(), 1);
        // The fake QEMU's relay thread exits once it reads the dead daemon's end of the
        // connection, in its own time: the restore counts it gone only once it has.
        wait_for_or(
            "the relay thread to exit",
            Duration::from_secs(10),
            || (vm.threads().len() == n - 1).then_some(()),
            || format!(": threads {:?}", vm.threads()),
        );
        match how {
            "restore command" => {
                let out = w.restore();
                assert!(out.status.success(), "{out:?}");
                // The relay thread of the fake QEMU exits with the daemon's connection.
                let text = String::from_utf8_lossy(&out.stdout);
                assert!(text.contains(&format!("restored {} thread(s); 1 gone", n - 1)), "{text}");
            }
            _ => {
                let d2 = w.daemon(QUIET_POLICY);
                let log = std::fs::read_to_string(w.p("daemon.log")).unwrap();
                assert!(
                    log.contains(&format!("restored {} thread(s) left boosted by a previous daemon (1 gone", n - 1)),
                    "{log}"
                );
                // The new daemon coordinates the VM again; the agent re-registers.
                d2.wait_vm("vm1");
                assert_eq!(vm.request(Kind::Cpu, 1).deny_reason(), Some(DenyReason::NotRegistered));
            }
        }
        assert!(vm.none_realtime(), "{how}: {:?}", vm.attrs());
        assert!(sched::get(worker).unwrap().same_as(&SchedAttr::other(-3, 0)), "{how}: original nice");
        assert!(state_files(&w).is_empty(), "{how}: state removed");
    }
}

#[test]
fn operator_commands_find_the_daemon_through_its_config() {
    if !have_root() {
        return;
    }
    let w = World::new();
    let cfg = w.p("only.toml");
    std::fs::write(
        &cfg,
        format!(
            "socket_dir = {:?}\nstate_dir = {:?}\ncontrol_socket = {:?}\n",
            w.socket_dir(),
            w.state_dir(),
            w.p("from-config.sock")
        ),
    )
    .unwrap();
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_cosched"))
        .args(["--config"])
        .arg(&cfg)
        .arg("host")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status = || {
        Command::new(env!("CARGO_BIN_EXE_cosched"))
            .arg("--config")
            .arg(&cfg)
            .args(["status", "--json"])
            .output()
            .unwrap()
    };
    let out = wait_for("status through the config", Duration::from_secs(10), || {
        let o = status();
        o.status.success().then_some(o)
    });
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["daemon"]["state_dir"], w.state_dir().to_str().unwrap());
    // restore also reads state_dir from it, and sees the running daemon's lock.
    let out = Command::new(env!("CARGO_BIN_EXE_cosched")).arg("--config").arg(&cfg).arg("restore").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("another cosched host daemon is running"), "{out:?}");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    assert!(daemon.wait().unwrap().success());
}

#[test]
fn restore_refuses_while_a_daemon_runs() {
    if !have_root() {
        return;
    }
    let w = World::new();
    let _d = w.daemon(QUIET_POLICY);
    let out = w.restore();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("another cosched host daemon is running"));
    // And a second daemon on the same state refuses to start.
    let out = Command::new(env!("CARGO_BIN_EXE_cosched"))
        .args(["host", "--state-dir"])
        .arg(w.state_dir())
        .arg("--socket-dir")
        .arg(w.p("vms2"))
        .arg("--control-socket")
        .arg(w.p("c2.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn sigterm_and_vm_exit_leave_nothing_behind() {
    if !have_root() {
        return;
    }
    let w = World::new();
    let mut d = w.daemon(QUIET_POLICY);
    let mut vm1 = w.vm("vm1", "qemu-system-x86_64", &THREADS);
    let mut vm2 = w.vm("vm2", "qemu-system-aarch64", &THREADS);
    d.wait_vm("vm1");
    assert_eq!(d.wait_vm("vm2")["vcpus"], 1, "one thread named CPU n/...");
    for vm in [&mut vm1, &mut vm2] {
        vm.register();
        vm.request(Kind::Cpu, 1);
        assert!(vm.boosted_soon(1));
    }
    assert_eq!(state_files(&w).len(), 2);
    // vm2 exits while boosted: its record goes.
    drop(vm2);
    wait_for("vm2 forgotten", Duration::from_secs(5), || d.vm_status("vm2").is_none().then_some(()));
    assert_eq!(state_files(&w).len(), 1);
    // SIGTERM restores vm1 and exits cleanly.
    d.signal(libc::SIGTERM);
    assert!(vm1.none_realtime(), "{:?}", vm1.attrs());
    assert!(state_files(&w).is_empty());
    assert!(!w.control().exists(), "control socket removed");
    let main = vm1.attrs().into_iter().find(|(c, _)| c.starts_with("qemu-system")).unwrap().1;
    assert_eq!(main.policy, SCHED_OTHER);
}

#[test]
fn metrics_endpoint_serves_prometheus_text() {
    let Some(Setup { w: _w, d, mut vm }) = one_vm(&format!("metrics_listen = \"127.0.0.1:0\"\n{QUIET_POLICY}")) else {
        return;
    };
    vm.register();
    vm.request(Kind::Cpu, 1);
    let out = d.cli(&["metrics"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("cosched_vm_boosted{vm=\"vm1\",resource=\"cpu\"} 1"), "{text}");
    assert!(text.contains("cosched_hint_to_applied_seconds_count{vm=\"vm1\"} 1"), "{text}");
    // The same over HTTP, as Prometheus scrapes it.
    let addr = d.status()["daemon"]["metrics_addr"].as_str().unwrap().to_string();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.0 200 OK"), "{body}");
    assert!(body.contains("cosched_vm_boosts_total{vm=\"vm1\",resource=\"cpu\"} 1"), "{body}");
}

/// The state files of `w`, parsed.
fn state_records(w: &World) -> Vec<Value> {
    state_files(w).iter().map(|p| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()).collect()
}

#[test]
fn a_corrupt_state_file_is_reported_and_the_other_records_are_still_restored() {
    let Some(mut s) = one_vm(QUIET_POLICY) else { return };
    s.boost_then_kill_the_daemon();
    let Setup { w, vm, .. } = &s;
    let corrupt = w.state_dir().join("1-2.json");
    std::fs::write(&corrupt, b"{\"version\": 2, \"vm\": tru").unwrap();
    let unknown = w.state_dir().join("3-4.json");
    std::fs::write(&unknown, br#"{"version": 9, "vm": "x"}"#).unwrap();
    let _d2 = w.daemon(QUIET_POLICY);
    let log = std::fs::read_to_string(w.p("daemon.log")).unwrap();
    assert!(log.contains("1-2.json: cannot be restored, kept for you to look at: corrupt"), "{log}");
    assert!(log.contains("3-4.json: cannot be restored, kept for you to look at: state format version 9"), "{log}");
    assert!(vm.none_realtime(), "the good record was restored: {:?}", vm.attrs());
    assert!(corrupt.exists() && unknown.exists(), "bad records are kept for a human");
}

/// A dead daemon left two layers of change on one thread (a static policy's CPU affinity and
/// I/O priority under a CPU boost): `cosched restore` puts every setting back exactly. The static
/// layer is written here as the daemon would write it; static policies themselves come with the
/// real-time tunings.
#[test]
fn kill_9_with_a_boost_over_a_static_policy_on_one_thread_restores_both_exactly() {
    let Some(mut s) = one_vm(QUIET_POLICY) else { return };
    let vcpu = s.vm.tid("CPU 0/TCG");
    let cpus = sched::get_affinity(vcpu).unwrap();
    let ioprio = sched::get_ioprio(vcpu).unwrap();
    sched::set(vcpu, &SchedAttr::other(3, 0)).unwrap();
    s.boost_then_kill_the_daemon();
    let w = &s.w;
    // The static layer: pinned to the first CPU, best-effort I/O level 0.
    let pinned = vec![cpus[0]];
    let static_ioprio: u16 = 2 << 13;
    sched::set_affinity(vcpu, &pinned).unwrap();
    sched::set_ioprio(vcpu, static_ioprio).unwrap();
    // And a blkio group of its own (cgroup v1, as on this host), if the kernel has one.
    let blkio = TestGroup::new("blkio");
    let cgroups = cosched_host::cgroup::CgroupFs::default();
    let group_before = blkio.as_ref().map(|g| {
        let before = cgroups.get(vcpu, "blkio").unwrap();
        cgroups.set(vcpu, "blkio", &g.name).unwrap();
        assert_eq!(cgroups.get(vcpu, "blkio").unwrap(), g.name);
        before
    });
    let path = &state_files(w)[0];
    let mut rec = state_records(w).remove(0);
    let task = rec["entries"].as_array().unwrap().iter().find(|e| e["task"]["id"] == vcpu).unwrap()["task"].clone();
    let entries = rec["entries"].as_array_mut().unwrap();
    entries.push(serde_json::json!({"task": task, "layer": "static", "setting": "affinity",
        "original": cpus, "applied": [pinned]}));
    entries.push(serde_json::json!({"task": task, "layer": "static", "setting": "ioprio",
        "original": ioprio, "applied": [static_ioprio]}));
    if let (Some(g), Some(before)) = (&blkio, &group_before) {
        entries.push(serde_json::json!({"task": task, "layer": "static", "setting": "cgroup",
            "hierarchy": "blkio", "original": before, "applied": [g.name]}));
    } else {
        eprintln!("no cgroup v1 blkio hierarchy here: cgroup membership not checked");
    }
    std::fs::write(path, serde_json::to_vec(&rec).unwrap()).unwrap();

    let out = w.restore();
    assert!(out.status.success(), "{out:?}");
    assert!(sched::get(vcpu).unwrap().same_as(&SchedAttr::other(3, 0)), "sched: {}", sched::get(vcpu).unwrap());
    assert_eq!(sched::get_affinity(vcpu).unwrap(), cpus, "affinity");
    assert_eq!(sched::get_ioprio(vcpu).unwrap(), ioprio, "I/O priority");
    if let Some(before) = group_before {
        assert_eq!(cgroups.get(vcpu, "blkio").unwrap(), before, "blkio cgroup");
    }
    assert!(state_files(w).is_empty());
}

/// A cgroup group this test makes, `cosched-test-<pid>-<n>`: in a v1 hierarchy (`hierarchy`
/// a controller, at `/sys/fs/cgroup/<controller>`) or in the v2 one (`""`: at `/sys/fs/cgroup`,
/// or `/sys/fs/cgroup/unified` on a hybrid host). `None` where the host has no such hierarchy.
///
/// On drop, also when the test failed half-way: every group in it (the daemon's `cosched-*`
/// too) is thawed, its threads go back to the hierarchy's root group and it is removed,
/// innermost first, retried while the kernel says busy. A frozen thread does not die, and a v1
/// group holding one cannot be removed: declare it after the VM and before the daemon, so that
/// it drops after the daemon (which may freeze or move threads again) and before the VM.
struct TestGroup {
    hierarchy: String,
    dir: PathBuf,
    root: PathBuf,
    name: String,
}

impl TestGroup {
    fn new(hierarchy: &str) -> Option<TestGroup> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let cg = cosched_host::cgroup::CgroupFs::default();
        if !cg.has_hierarchy(hierarchy) {
            return None;
        }
        let root = cg.dir(hierarchy, "/");
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("/cosched-test-{}-{n}", std::process::id());
        let dir = root.join(&name[1..]);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        Some(TestGroup { hierarchy: hierarchy.to_string(), dir, root, name })
    }

    /// Process `pid`, every thread of it, into the group.
    fn add_process(&self, pid: i32) {
        let procs = self.dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string()).unwrap_or_else(|e| panic!("{pid} into {}: {e}", procs.display()));
    }

    /// A control file of the group (or of a group inside it), trimmed.
    fn read(&self, group: &str, file: &str) -> String {
        let dir = self.root.join(group.trim_start_matches('/'));
        std::fs::read_to_string(dir.join(file)).map(|s| s.trim().to_string()).unwrap_or_else(|e| format!("({e})"))
    }
}

impl Drop for TestGroup {
    fn drop(&mut self) {
        fn empty(dir: &Path, root: &Path, v2: bool) {
            for sub in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if sub.file_type().is_ok_and(|t| t.is_dir()) {
                    empty(&sub.path(), root, v2);
                }
            }
            // Thawed first: moving a thread out of a frozen group thaws it too, but a group
            // left frozen would freeze whatever enters it.
            let (thaw, members) = if v2 { ("cgroup.freeze", "cgroup.procs") } else { ("freezer.state", "tasks") };
            if dir.join(thaw).is_file() {
                let _ = std::fs::write(dir.join(thaw), if v2 { "0" } else { "THAWED" });
            }
            remove_group_dir(dir, || {
                let ids = std::fs::read_to_string(dir.join(members)).unwrap_or_default();
                for id in ids.split_whitespace() {
                    let _ = std::fs::write(root.join(members), id);
                }
                format!("; left in it: {ids:?}")
            });
        }
        empty(&self.dir, &self.root, self.hierarchy.is_empty());
    }
}

/// A QEMU with no socket in the daemon's directory (a guest without an agent, a libvirt domain
/// without the channel) is found among the processes, named by its `-name guest=...`, and its
/// `[vm.NAME]` applies; when a socket of it appears, the agent's channel joins the same entry.
#[test]
fn a_qemu_without_an_agent_is_an_entry_and_its_channel_joins_it_later() {
    if !have_root() {
        return;
    }
    let w = World::new();
    let d = w.daemon(&format!("discover_processes = true\nrescan_ms = 100\n{QUIET_POLICY}[vm.dom1]\npriority = 9\n"));
    let bin = w.p("bin-dom1");
    std::fs::create_dir_all(&bin).unwrap();
    let exe = bin.join("qemu-system-x86_64");
    std::fs::copy(fake_qemu_bin(), &exe).unwrap();
    std::fs::create_dir_all(w.p("elsewhere")).unwrap();
    let hidden = w.p("elsewhere/dom1.sock");
    let mut child = spawn_fake_qemu(
        Command::new(&exe)
            .args(["-name", "guest=dom1,debug-threads=on", "--socket"])
            .arg(&hidden)
            .args(["--thread", "CPU 0/TCG"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    let pid = child.id() as i32;
    let st = wait_for("the agentless VM", Duration::from_secs(5), || {
        d.vm_status("dom1").filter(|v| v["pid"] == pid && v["vcpus"] == 1)
    });
    assert_eq!(st["agent"], false, "{st}");
    assert_eq!(st["priority"], 9, "its [vm.dom1] applies");
    assert_eq!(st["registered"], false);
    // Its socket appears in the daemon's directory: the channel joins the same entry.
    wait_for("the listening socket", Duration::from_secs(5), || hidden.exists().then_some(()));
    std::fs::rename(&hidden, w.socket_dir().join("dom1-agent.sock")).unwrap();
    let st = wait_for("the channel to join", Duration::from_secs(5), || {
        d.vm_status("dom1-agent").filter(|v| v["agent"] == true)
    });
    assert_eq!((st["pid"].as_i64(), st["priority"].as_u64()), (Some(pid as i64), Some(9)), "{st}");
    assert!(d.vm_status("dom1").is_none(), "one entry, not two");
    let _ = child.kill();
    let _ = child.wait();
}

impl FakeVm {
    fn register_caps(&mut self, caps: u64) {
        let seq = self.seq + 1;
        assert_eq!(self.request(Kind::Register, caps), Frame::ack(seq, caps));
    }
    /// The I/O priority of every thread, by name.
    fn ioprios(&self) -> Vec<(String, u16)> {
        self.threads().into_iter().filter_map(|(tid, c)| sched::get_ioprio(tid).ok().map(|p| (c, p))).collect()
    }
}

/// `IO 1` with the default lever: the VM's I/O threads (main loop, iothread, workers, and a
/// worker born while raised) get the real-time I/O class, read back with the real
/// `ioprio_get`; the vCPU and the CPU settings are untouched; `IO 0` puts back exactly.
#[test]
fn io_boost_raises_the_io_threads_real_ioprio_and_restores_exactly() {
    let Some(s) = one_vm(QUIET_POLICY) else { return };
    let Setup { mut vm, d, .. } = s;
    let (main, vcpu, iothread) = (vm.pid, vm.tid("CPU 0/TCG"), vm.tid("IO iothread0"));
    let be7: u16 = 2 << 13 | 7;
    sched::set_ioprio(iothread, be7).unwrap();
    let before = vm.ioprios();
    // By thread: the fake QEMU starts a relay thread when the daemon connects, in its own
    // time, so the list may grow after this.
    let attrs_before: Vec<(i32, SchedAttr)> =
        vm.threads().into_iter().filter_map(|(tid, _)| sched::get(tid).ok().map(|a| (tid, a))).collect();
    vm.register_caps(caps::CPU | caps::IO);
    assert_eq!(vm.request(Kind::Io, 1), Frame::ack(2, 1));
    let rt0: u16 = 1 << 13;
    let raised = |vm: &FakeVm| {
        vm.threads().into_iter().all(|(tid, c)| {
            let p = sched::get_ioprio(tid).unwrap();
            if tid == main || c == "IO iothread0" || c == "worker" {
                p == rt0
            } else {
                before.iter().any(|(n, b)| *n == c && *b == p)
            }
        })
    };
    wait_for("the I/O threads raised", Duration::from_secs(1), || raised(&vm).then_some(()));
    assert_eq!(sched::get_ioprio(vcpu).unwrap(), before.iter().find(|t| t.0 == "CPU 0/TCG").unwrap().1);
    // The CPU settings are not the I/O boost's: each thread as it was, a newer one as the main
    // thread was.
    let main_before = attrs_before.iter().find(|(t, _)| *t == main).unwrap().1;
    for (tid, c) in vm.threads() {
        let before = attrs_before.iter().find(|(t, _)| *t == tid).map_or(main_before, |(_, a)| *a);
        let now = sched::get(tid).unwrap();
        assert!(now.same_as(&before), "the CPU settings are not the I/O boost's: {c} at {now}, was {before}");
    }
    // A worker born while raised is raised too.
    let n = vm.threads().len();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(vm.pid, libc::SIGUSR1) };
    wait_for_or(
        "the new worker raised",
        Duration::from_secs(3),
        || (vm.threads().len() == n + 1 && raised(&vm)).then_some(()),
        || format!(": {} threads (was {n}), I/O priorities {:x?}", vm.threads().len(), vm.ioprios()),
    );
    let st = d.vm_status("vm1").unwrap();
    assert_eq!(st["resources"]["io"]["level"], "boosted");
    assert_eq!(st["resources"]["cpu"]["level"], "normal");
    let w = st["threads"].as_array().unwrap().iter().find(|t| t["comm"] == "worker").unwrap().clone();
    assert_eq!((w["ioprio"].as_str(), w["changed_by"].clone()), (Some("0x2000"), serde_json::json!(["io"])));
    assert_eq!(vm.request(Kind::Io, 0), Frame::ack(3, 0));
    let after = vm.ioprios();
    for (c, p) in &before {
        assert!(after.iter().any(|(n, a)| n == c && a == p), "{c} back to {p:#x}: {after:?}");
    }
    assert_eq!(sched::get_ioprio(iothread).unwrap(), be7, "best-effort 7 restored exactly");
    let st = d.vm_status("vm1").unwrap();
    assert_eq!(st["resources"]["io"]["counters"]["boosts"], 1);
    assert_eq!(st["resources"]["io"]["counters"]["deboosts"], 1);
}

/// The weight lever on the real cgroup v1 blkio hierarchy: `IO 1` moves the I/O threads (and a
/// worker born while raised) into a group of the daemon's with the raised `blkio.bfq.weight`;
/// `kill -9` mid-raise, then a restarted daemon, or `cosched restore`, puts every thread back in
/// its group and removes the daemon's group. `cosched restore` runs where the hierarchy is only
/// under the config's `cgroup_root` (a private mount namespace with an empty /sys/fs/cgroup).
/// A host without the v1 blkio hierarchy runs [`io_weight_lever_on_cgroup_v2`] instead.
/// `cosched restore` run where the hierarchy is mounted elsewhere than the daemon saw it: in a
/// private mount namespace, `mount` ("{r}" for the new root) mounts it at `<w>/cgroot`, a tmpfs
/// hides /sys/fs/cgroup, and the restore runs with `cgroup_root` there: it must find the groups
/// from its records' paths relative to the root.
fn restore_elsewhere(w: &World, config: &str, mount: &str, how: &str) {
    let root = w.p("cgroot");
    std::fs::create_dir_all(&root).unwrap();
    let cfg = w.p("restore.toml");
    let top = format!("cgroup_root = {:?}\nstate_dir = {:?}\n", root, w.state_dir());
    std::fs::write(&cfg, format!("{top}{config}")).unwrap();
    let script = format!(
        "{} && mount -t tmpfs cosched-test /sys/fs/cgroup && exec {exe} --config {cfg} restore",
        mount.replace("{r}", &root.display().to_string()),
        exe = env!("CARGO_BIN_EXE_cosched"),
        cfg = cfg.display()
    );
    let out =
        Command::new("unshare").args(["--mount", "--propagation", "private", "sh", "-c", &script]).output().unwrap();
    assert!(out.status.success(), "{how}: {out:?}");
}

#[test]
fn io_weight_lever_moves_io_threads_into_a_real_blkio_group_and_kill_9_is_restored() {
    if !have_root() {
        return;
    }
    if !cosched_host::cgroup::CgroupFs::default().has_hierarchy("blkio") {
        eprintln!("no cgroup v1 blkio hierarchy here: the weight lever runs on the v2 io controller");
        io_weight_lever_on_cgroup_v2();
        return;
    }
    if let Err(why) = cosched_host::actuator::weight_hierarchy(&cosched_host::cgroup::CgroupFs::default()) {
        eprintln!("the weight lever cannot act on this host ({why}): checking that the daemon says so");
        io_weight_lever_without_bfq(&why.to_string());
        return;
    }
    for how in ["daemon restart", "restore command"] {
        let config = format!("{QUIET_POLICY}[io]\nlever = \"weight\"\nweight = 700\n");
        let w = World::new();
        let mut vm = w.vm("vm1", "qemu-system-x86_64", &THREADS);
        // After the VM, before the daemon: dropped after the daemon, before the VM.
        let blkio = TestGroup::new("blkio").expect("this host has the cgroup v1 blkio hierarchy");
        let cg = cosched_host::cgroup::CgroupFs::default();
        // The VM is in a group of the test's before the daemon sees it, so that nothing else's
        // membership is involved.
        for (tid, _) in vm.threads() {
            cg.set(tid, "blkio", &blkio.name).unwrap();
        }
        let mut d = w.daemon(&config);
        d.wait_vm("vm1");
        let vcpu = vm.tid("CPU 0/TCG");
        vm.register_caps(caps::CPU | caps::IO);
        assert_eq!(vm.request(Kind::Io, 1), Frame::ack(2, 1));
        let ours = format!("{}/cosched-io-{}", blkio.name, vm.pid);
        let in_ours = |vm: &FakeVm| {
            vm.threads().into_iter().all(|(tid, c)| {
                let g = cg.get(tid, "blkio").unwrap();
                if c == "CPU 0/TCG" || (tid != vm.pid && c != "IO iothread0" && c != "worker") {
                    g == blkio.name
                } else {
                    g == ours
                }
            })
        };
        let groups = |vm: &FakeVm| -> Vec<(i32, String, String)> {
            vm.threads().into_iter().map(|(tid, c)| (tid, c, cg.get(tid, "blkio").unwrap_or_default())).collect()
        };
        wait_for_or(
            "the I/O threads in the daemon's group",
            Duration::from_secs(5),
            || in_ours(&vm).then_some(()),
            || format!(": threads and groups {:?}; the daemon's log:\n{}", groups(&vm), d.log_tail()),
        );
        assert_eq!(cg.read("blkio", &ours, "blkio.bfq.weight").unwrap(), "700");
        let workers = |vm: &FakeVm| vm.threads().iter().filter(|(_, c)| c == "worker").count();
        let n = workers(&vm);
        // SAFETY: signalling our own child.
        unsafe { libc::kill(vm.pid, libc::SIGUSR1) };
        // Named "worker" already: a thread just created still has its creator's name, and the
        // daemon moves it only once it is named (a CI run killed the daemon in between).
        wait_for_or(
            "the new worker in the group",
            Duration::from_secs(10),
            || (workers(&vm) == n + 1 && in_ours(&vm)).then_some(()),
            || {
                format!(
                    ": {n} workers before; threads and groups {:?}; the daemon's log:\n{}",
                    groups(&vm),
                    d.log_tail()
                )
            },
        );
        d.signal(libc::SIGKILL);
        assert!(in_ours(&vm), "kill -9 restores nothing by itself");
        let d2 = match how {
            "daemon restart" => Some(w.daemon(&config)),
            _ => {
                restore_elsewhere(
                    &w,
                    &config,
                    "mkdir -p {r}/blkio && mount -t cgroup -o blkio cosched-test {r}/blkio",
                    how,
                );
                None
            }
        };
        for (tid, c) in vm.threads() {
            assert_eq!(cg.get(tid, "blkio").unwrap(), blkio.name, "{how}: {c} back in its group");
        }
        assert!(!cg.dir("blkio", &ours).exists(), "{how}: the daemon's group is removed");
        assert_eq!(cg.get(vcpu, "blkio").unwrap(), blkio.name);
        assert!(state_files(&w).is_empty(), "{how}");
        drop(d2);
        drop(blkio);
        drop(vm);
    }
}

/// The v2 `io` controller enabled in the v2 root's `cgroup.subtree_control` for the test's
/// groups, if it was not; put back as it was on drop.
struct SubtreeIo {
    file: PathBuf,
    enabled_here: bool,
}

impl SubtreeIo {
    fn enable() -> SubtreeIo {
        let cg = cosched_host::cgroup::CgroupFs::default();
        let file = cg.v2_root().join("cgroup.subtree_control");
        let on = std::fs::read_to_string(&file).unwrap_or_default().split_whitespace().any(|c| c == "io");
        if !on {
            std::fs::write(&file, "+io").unwrap_or_else(|e| panic!("enabling io in {}: {e}", file.display()));
        }
        SubtreeIo { file, enabled_here: !on }
    }
}

impl Drop for SubtreeIo {
    fn drop(&mut self) {
        if self.enabled_here {
            if let Err(e) = std::fs::write(&self.file, "-io") {
                eprintln!("putting back {} (-io): {e}", self.file.display());
            }
        }
    }
}

/// The weight lever on a host whose kernel has no BFQ (a v1 blkio hierarchy without BFQ's
/// files; the project's test host since its kernel dropped `CONFIG_IOSCHED_BFQ`): the daemon
/// runs, says why I/O coordination is unsupported, a guest's registration is acknowledged
/// without the I/O capability, its `IO 1` is denied as unsupported, and no thread of the VM is
/// touched. The lever's moves and restore are covered by the fake-tree tests (`tests_io.rs`).
fn io_weight_lever_without_bfq(why: &str) {
    let config = format!("{QUIET_POLICY}[io]\nlever = \"weight\"\nweight = 700\n");
    let w = World::new();
    let mut vm = w.vm("vm1", "qemu-system-x86_64", &THREADS);
    let cg = cosched_host::cgroup::CgroupFs::default();
    let home = cg.get(vm.pid, "blkio").unwrap();
    let d = w.daemon(&config);
    d.wait_vm("vm1");
    let st = d.status();
    assert_eq!(st["io"]["unsupported"].as_str(), Some(why), "{}", st["io"]);
    assert_eq!(vm.request(Kind::Register, caps::CPU | caps::IO), Frame::ack(1, caps::CPU), "I/O not acknowledged");
    assert_eq!(vm.request(Kind::Io, 1).deny_reason(), Some(DenyReason::Unsupported));
    let groups: Vec<(i32, String, String)> =
        vm.threads().into_iter().map(|(t, c)| (t, c, cg.get(t, "blkio").unwrap_or_default())).collect();
    assert!(groups.iter().all(|(_, _, g)| *g == home), "no thread moved from {home}: {groups:?}");
}

/// The weight lever on a host whose `io` controller is in cgroup v2 (no v1 blkio): the VM alone
/// in a v2 group of the test's, `IO 1` raises that group's default `io.bfq.weight` (in v2 no
/// thread moves); `kill -9` mid-raise, then a restarted daemon or `cosched restore` (in a
/// private mount namespace where the hierarchy is only under the config's `cgroup_root`)
/// writes the original weight back. Not run on the project's test host, whose `io` is bound to
/// v1: there the fake-tree tests cover this path.
fn io_weight_lever_on_cgroup_v2() {
    let cg = cosched_host::cgroup::CgroupFs::default();
    assert!(
        cg.v2_controllers().iter().any(|c| c == "io"),
        "no cgroup v1 blkio hierarchy and no io controller in the cgroup v2 hierarchy at {}: the weight lever has \
         nothing to act on",
        cg.v2_root().display()
    );
    let _io = SubtreeIo::enable();
    let weight = |group: &TestGroup| {
        let text = group.read(&group.name, "io.bfq.weight");
        cosched_host::cgroup::parse_weight(&text)
            .unwrap_or_else(|| panic!("io.bfq.weight of {}: {text:?}: is BFQ loaded? (modprobe bfq)", group.name))
    };
    for how in ["daemon restart", "restore command"] {
        let config = format!("{QUIET_POLICY}[io]\nlever = \"weight\"\nweight = 700\n");
        let w = World::new();
        let mut vm = w.vm("vm1", "qemu-system-x86_64", &THREADS);
        let group = TestGroup::new("").expect("a cgroup v2 hierarchy");
        group.add_process(vm.pid);
        let before = weight(&group);
        assert_ne!(before, 700, "{how}: the group starts at another weight than the raise");
        let mut d = w.daemon(&config);
        d.wait_vm("vm1");
        vm.register_caps(caps::CPU | caps::IO);
        assert_eq!(vm.request(Kind::Io, 1), Frame::ack(2, 1));
        wait_for_or(
            &format!("{how}: the group's weight raised to 700"),
            Duration::from_secs(2),
            || (weight(&group) == 700).then_some(()),
            || format!(": io.bfq.weight {}", weight(&group)),
        );
        for (tid, c) in vm.threads() {
            assert_eq!(cg.get(tid, "").unwrap(), group.name, "{how}: {c} stays in its group");
        }
        d.signal(libc::SIGKILL);
        assert_eq!(weight(&group), 700, "{how}: kill -9 restores nothing by itself");
        let d2 = match how {
            "daemon restart" => Some(w.daemon(&config)),
            _ => {
                restore_elsewhere(&w, &config, "mount -t cgroup2 cosched-test {r}", how);
                None
            }
        };
        assert_eq!(weight(&group), before, "{how}: the original weight back");
        assert!(state_files(&w).is_empty(), "{how}");
        drop(d2);
        drop(group);
        drop(vm);
    }
}

// ---- Event boosting (FEAS) ----

const FEAS_CONFIG: &str = "[event]\nvms = \"no-agent\"\nn_limit = 1\ncycle_ms = 10\nslice_us = 2000\n";

/// A VM with no agent whose vCPU spins on CPU 1 beside a hog (so it waits about half of the
/// time), and whose `IO event0` thread a datagram socket wakes. Dropping it stops the hog.
struct EventVm {
    vm: FakeVm,
    sock: PathBuf,
    vcpu: i32,
    hog: Child,
}

impl Drop for EventVm {
    fn drop(&mut self) {
        let _ = self.hog.kill();
        let _ = self.hog.wait();
    }
}

fn event_vm(w: &World, d: &Daemon) -> EventVm {
    let sock = w.p("event0.sock");
    let exe = w.fake_qemu("ev", "qemu-system-x86_64");
    let args: Vec<String> =
        ["--busy", "CPU 0/TCG", "--event-socket", sock.to_str().unwrap()].iter().map(|s| s.to_string()).collect();
    let vm = w.vm_args(&exe, "ev", &args, &["CPU 0/TCG", "IO event0"], None);
    d.wait_vm("ev");
    let vcpu = vm.tid("CPU 0/TCG");
    sched::set_affinity(vcpu, &[1]).unwrap();
    // At SCHED_OTHER nice 0, as a host's job is, whatever the runner's class (`chrt -i 0`).
    let hog = spawn_fake_qemu(Command::new("taskset").args(["-c", "1", "sh", "-c", "while :; do :; done"]));
    // This test's own threads (the sender, the sampler) stay off the contended CPU.
    sched::set_affinity(0, &[0]).unwrap();
    EventVm { vm, sock, vcpu, hog }
}

/// Sends a datagram to the VM's event socket every `every` for `for_`, from this process (for
/// the VM, a device: another process writing to its socket), while sampling its vCPU's
/// attributes every 50 µs. Returns the samples (time since start, attributes).
fn drive_events(ev: &EventVm, every: Duration, for_: Duration) -> Vec<(Duration, SchedAttr)> {
    let tx = std::os::unix::net::UnixDatagram::unbound().unwrap();
    let sock = ev.sock.clone();
    let sender = std::thread::spawn(move || {
        let end = Instant::now() + for_;
        while Instant::now() < end {
            let _ = tx.send_to(b"packet", &sock);
            std::thread::sleep(every);
        }
    });
    let start = Instant::now();
    let mut samples = Vec::new();
    while start.elapsed() < for_ + Duration::from_millis(50) {
        if let Ok(a) = sched::get(ev.vcpu) {
            samples.push((start.elapsed(), a));
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    sender.join().unwrap();
    samples
}

/// Runs of samples at `SCHED_RR`: the time of the sample before each run (not at `SCHED_RR`),
/// and of the first and the last sample of the run. The boost began after the sample before, so
/// the run's true start is between the first two, however late the sampler was; the last sample
/// bounds its end from below, not above.
fn rr_episodes(samples: &[(Duration, SchedAttr)]) -> Vec<(Duration, Duration, Duration)> {
    let mut out = Vec::new();
    let mut open: Option<(Duration, Duration, Duration)> = None;
    let mut before = Duration::ZERO;
    for (t, a) in samples {
        match (a.policy == SCHED_RR, open) {
            (true, None) => open = Some((before, *t, *t)),
            (true, Some((b, s, _))) => open = Some((b, s, *t)),
            (false, Some(run)) => {
                out.push(run);
                open = None;
            }
            _ => {}
        }
        if a.policy != SCHED_RR {
            before = *t;
        }
    }
    out
}

#[test]
fn a_device_event_boosts_the_waiting_vcpu_for_a_slice_at_most_n_limit_times_per_cycle() {
    if !have_root() {
        return;
    }
    let _heavy = cpu_heavy();
    let w = World::new();
    let d = w.daemon(FEAS_CONFIG);
    let ev = event_vm(&w, &d);
    let boosts = |d: &Daemon| d.vm_status("ev").unwrap()["resources"]["event"]["counters"]["boosts"].as_u64().unwrap();
    let before = boosts(&d);
    let run = Duration::from_secs(2);
    let samples = drive_events(&ev, Duration::from_millis(3), run);
    let since = rr_episodes(&samples);
    let episodes: Vec<(Duration, Duration)> = since.iter().map(|&(_, s, e)| (s, e)).collect();
    let vm = d.vm_status("ev").unwrap();
    let st = d.status();
    let counters = &vm["resources"]["event"]["counters"];
    let n = boosts(&d) - before;
    eprintln!(
        "{} RR episodes seen, {n} boosts; longest {:?}; event counters {counters}; detection {}",
        episodes.len(),
        episodes.iter().map(|(s, e)| *e - *s).max(),
        st["event"]["counters"]
    );
    assert!(st["event"]["counters"]["device_wakeups"].as_u64().unwrap() > 100, "{}", st["event"]);
    // A datagram every 3 ms and one boost per 10 ms cycle at most: boosts, and postponements.
    assert!(n >= 30, "{n} boosts in {run:?}: {counters}");
    assert!(n <= run.as_millis() as u64 / 10 + 2, "{n} boosts in {run:?}: more than one per 10 ms cycle");
    assert!(counters["postponed"].as_u64().unwrap() > 0, "{counters}");
    assert!(episodes.len() >= 20, "the vCPU was seen at SCHED_RR {} times", episodes.len());
    for (s, _) in &episodes {
        let a = samples.iter().find(|(t, _)| t == s).unwrap().1;
        assert_eq!((a.priority, a.flags & SCHED_FLAG_RESET_ON_FORK), (1, SCHED_FLAG_RESET_ON_FORK), "{a:?}");
    }
    // The slice is 2 ms; the daemon's timer (epoll) has a 1 ms resolution, and the daemon and
    // the sampler share CPU 0 with the sender (and, under `cargo test`, with the other tests'
    // daemons, all at SCHED_FIFO 99): most boosts end within the slice and a millisecond.
    let mut lengths: Vec<Duration> = episodes.iter().map(|(s, e)| *e - *s).collect();
    lengths.sort();
    let within = lengths.iter().filter(|l| **l <= Duration::from_millis(3)).count();
    assert!(within * 10 >= lengths.len() * 9, "boost lengths (slice 2 ms): {lengths:?}");
    // Never two boosts in one 10 ms cycle (n_limit = 1): two may straddle a cycle's start, but
    // three starts are in three cycles, so more than a whole cycle apart (less 1 ms for the
    // daemon's own delay in applying a boost). The sampler can be late too (it shares CPU 0 with
    // the daemons at SCHED_FIFO 99): the first boost began after the sample before its run, the
    // third by its run's first sample, so three boosts are proven within 9 ms only when those two
    // samples are.
    let crowded: Vec<_> = since
        .windows(3)
        .filter(|p| p[2].1 - p[0].0 < Duration::from_millis(9))
        .map(|p| (p[0].0, p[0].1, p[2].1))
        .collect();
    assert!(crowded.is_empty(), "three boosts within 9 ms (after, first seen, third seen): {crowded:?}");
    // The boosted time is paid back (at `repay_nice`), then the vCPU is put back.
    assert!(counters["repaid_ns"].as_u64().unwrap() > 0, "{counters}");
    wait_for("the vCPU put back", Duration::from_secs(2), || {
        sched::get(ev.vcpu).unwrap().same_as(&SchedAttr::other(0, 0)).then_some(())
    });
    let metrics = String::from_utf8(d.cli(&["metrics"]).stdout).unwrap();
    let line = metrics.lines().find(|l| l.starts_with("cosched_vm_events_total{") && l.contains("vm=\"ev\""));
    assert!(line.is_some_and(|l| !l.ends_with(" 0")), "{metrics}");
    // Only the vCPU was ever changed.
    let io = ev.vm.tid("IO event0");
    assert!(!samples.is_empty() && sched::get(io).unwrap().same_as(&SchedAttr::other(0, 0)));
}

#[test]
fn kill_9_mid_event_boost_is_restored() {
    if !have_root() {
        return;
    }
    let _heavy = cpu_heavy();
    let w = World::new();
    // Slices of a second (one per 1 s cycle: the spinning vCPU holds its boost the whole slice)
    // and no pay-back: the boost seen is still on when the kill comes (a 10 ms slice could end
    // between the two under a loaded CPU).
    let mut d = w.daemon("[event]\ncycle_ms = 1000\nslice_us = 1000000\ncharge = false\n");
    let ev = event_vm(&w, &d);
    let tx = std::os::unix::net::UnixDatagram::unbound().unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while sched::get(ev.vcpu).unwrap().policy != SCHED_RR {
        let log = || std::fs::read_to_string(w.p("daemon.log")).unwrap_or_default();
        assert!(Instant::now() < end, "no event boost in 10 s; status {}; daemon log:\n{}", d.status()["event"], log());
        let _ = tx.send_to(b"packet", &ev.sock);
        std::thread::sleep(Duration::from_millis(1));
    }
    d.signal(libc::SIGKILL);
    assert_eq!(sched::get(ev.vcpu).unwrap().policy, SCHED_RR, "kill -9 restores nothing by itself");
    let out = w.restore();
    assert!(out.status.success(), "{out:?}");
    assert!(sched::get(ev.vcpu).unwrap().same_as(&SchedAttr::other(0, 0)), "{:?}", sched::get(ev.vcpu));
    assert!(state_files(&w).is_empty());
}

/// Every IRQ's affinity, put back on drop whatever happened (the tests move real IRQs).
struct IrqSnapshot(Vec<(PathBuf, String)>);

impl IrqSnapshot {
    fn take() -> IrqSnapshot {
        let mut v = Vec::new();
        for e in std::fs::read_dir("/proc/irq").unwrap().flatten() {
            let p = e.path().join("smp_affinity_list");
            if let Ok(s) = std::fs::read_to_string(&p) {
                v.push((p, s.trim().to_string()));
            }
        }
        v.sort();
        IrqSnapshot(v)
    }
    fn now(&self) -> Vec<(PathBuf, String)> {
        self.0
            .iter()
            .map(|(p, _)| (p.clone(), std::fs::read_to_string(p).unwrap_or_default().trim().to_string()))
            .collect()
    }
}

impl Drop for IrqSnapshot {
    fn drop(&mut self) {
        for (p, s) in &self.0 {
            let _ = std::fs::write(p, s);
        }
    }
}

/// A v1 cpuset group of the test's own, holding one process of the test's own: the "host
/// tasks" a shield may move, removed on drop.
struct HostGroup {
    group: String,
    child: Child,
}

impl HostGroup {
    fn new() -> Option<HostGroup> {
        let root = Path::new("/sys/fs/cgroup/cpuset");
        if !root.join("tasks").is_file() {
            eprintln!("no cgroup v1 cpuset hierarchy here: the shield's host-group part is tested on fake trees only");
            return None;
        }
        let group = format!("cosched-test-hostjobs-{}", std::process::id());
        let dir = root.join(&group);
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("sleep").arg("300").spawn().unwrap();
        // The guard first: whatever fails below, the drop kills the child and removes the group.
        let hg = HostGroup { group: format!("/{group}"), child };
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let all = std::fs::read_to_string(root.join(file)).unwrap();
            std::fs::write(dir.join(file), all.trim()).unwrap_or_else(|e| {
                let taken = exclusive_cpusets(root);
                panic!("{file} {} of {}: {e}; groups holding CPUs exclusively: {taken:?}", all.trim(), dir.display())
            });
        }
        std::fs::write(dir.join("cgroup.procs"), hg.pid().to_string()).unwrap();
        Some(hg)
    }
    fn cpus(&self) -> String {
        std::fs::read_to_string(format!("/sys/fs/cgroup/cpuset{}/cpuset.cpus", self.group)).unwrap().trim().to_string()
    }
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for HostGroup {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Reaped, its process may still leave the group a moment later: retried while busy.
        remove_group_dir(Path::new(&format!("/sys/fs/cgroup/cpuset{}", self.group)), String::new);
    }
}

/// Removes the cgroup directory `dir`, retried for up to 5 s while the kernel says it is busy
/// (a thread still leaving it); `each_try` runs before every try (e.g. moving out what is left)
/// and returns what a failure's message adds. A group already gone is not an error.
fn remove_group_dir(dir: &Path, mut each_try: impl FnMut() -> String) {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let context = each_try();
        match std::fs::remove_dir(dir) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < end => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                eprintln!("removing {}: {e}{context}", dir.display());
                return;
            }
            _ => return,
        }
    }
}

/// The v1 cpuset groups right under `root` that hold their CPUs exclusively (a shield's), with
/// their CPUs: a sibling cannot take those.
fn exclusive_cpusets(root: &Path) -> Vec<(String, String)> {
    let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default().trim().to_string();
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| read(e.path().join("cpuset.cpu_exclusive")) == "1")
        .map(|e| (e.file_name().to_string_lossy().into_owned(), read(e.path().join("cpuset.cpus"))))
        .collect()
}

fn affinity(tid: i32) -> Vec<usize> {
    sched::get_affinity(tid).unwrap()
}

fn cpuset_of(tid: i32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{tid}/cgroup")).unwrap();
    text.lines().find_map(|l| l.split_once(":cpuset:").map(|(_, p)| p.to_string())).unwrap_or_default()
}

#[test]
fn shielding_moves_the_vcpus_the_vm_and_a_test_process_and_restores_all_after_sigterm_and_kill_9() {
    if !have_root() {
        return;
    }
    let _heavy = cpu_heavy();
    let ncpus = affinity(0).len();
    if ncpus < 2 {
        eprintln!("one CPU: nothing to shield");
        return;
    }
    let last = ncpus - 1;
    let irqs = IrqSnapshot::take();
    let Some(hg) = HostGroup::new() else { return };
    let all: Vec<usize> = (0..ncpus).collect();
    let rest: Vec<usize> = (0..last).collect();
    let config =
        format!("{QUIET_POLICY}[shield]\nhost_groups = [\"{}\"]\n[vm.vm1.static]\nshield = \"{last}\"\n", hg.group);
    for how in ["sigterm", "kill -9", "operator"] {
        let w = World::new();
        // The operator's shield needs [shield] (host_groups) in the daemon's config.
        let shield_only = format!("{QUIET_POLICY}[shield]\nhost_groups = [\"{}\"]\n", hg.group);
        let mut d = w.daemon(if how == "operator" { &shield_only } else { &config });
        let vm = w.vm("vm1", "qemu-system-x86_64", &THREADS);
        d.wait_vm("vm1");
        if how == "operator" {
            let out = d.cli(&["vm", "static", "vm1", "--shield", &last.to_string()]);
            assert!(out.status.success(), "{out:?}");
        }
        let (vcpu, io, main) = (vm.tid("CPU 0/TCG"), vm.tid("IO iothread0"), vm.pid);
        let vcpu_group_before = String::from("/");
        let group = format!("/cosched-shield-{}", vm.pid);
        // The daemon shields from its loop, one thread and group after the other: wait for the
        // whole of it (the vCPU alone may be seen moved before the others are).
        let rest_text = cosched_host::shield::format_cpus(&rest.iter().copied().collect());
        let shielded = || {
            affinity(vcpu) == [last]
                && affinity(io) == rest
                && affinity(main) == rest
                && affinity(hg.pid()) == rest
                && hg.cpus() == rest_text
                && cpuset_of(vcpu) == group
        };
        wait_for_or(
            "the shield",
            Duration::from_secs(10),
            || shielded().then_some(()),
            || {
                format!(
                    ": vCPU {:?} in {}, IO {:?}, main {:?}, host process {:?}, host group CPUs {}",
                    affinity(vcpu),
                    cpuset_of(vcpu),
                    affinity(io),
                    affinity(main),
                    affinity(hg.pid()),
                    hg.cpus()
                )
            },
        );
        assert_eq!(affinity(io), rest, "{how}: the VM's other threads on the housekeeping CPUs");
        assert_eq!(affinity(main), rest);
        assert_eq!(affinity(hg.pid()), rest, "{how}: the test's own host group left the shielded CPU");
        assert_eq!(hg.cpus(), rest_text);
        assert_eq!(cpuset_of(vcpu), group, "{how}: the vCPU in its own cpuset group");
        assert_eq!(cpuset_of(io), vcpu_group_before);
        let gdir = format!("/sys/fs/cgroup/cpuset{group}");
        assert_eq!(std::fs::read_to_string(format!("{gdir}/cpuset.cpus")).unwrap().trim(), last.to_string());
        let st = d.vm_status("vm1").unwrap();
        assert!(st["static"]["tuning"].as_str().unwrap().starts_with(&format!("shield {last}")), "{st}");
        let sh = &d.status()["shield"];
        assert_eq!(sh["shielded_cpus"], last.to_string(), "{sh}");
        assert!(
            sh["kthreads_left"].as_array().unwrap().iter().any(|k| k.as_str().unwrap().starts_with("ksoftirqd/")),
            "{sh}"
        );
        // Every IRQ that could move is off the shielded CPU; the others are reported.
        let fixed: Vec<String> =
            sh["irqs_fixed"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
        for (p, aff) in irqs.now() {
            let irq = p.parent().unwrap().file_name().unwrap().to_str().unwrap().to_string();
            let on_shield = cosched_host::shield::parse_cpus(&aff).unwrap().contains(&last);
            assert!(!on_shield || fixed.iter().any(|f| f.starts_with(&format!("{irq}:"))), "{how}: IRQ {irq} at {aff}");
        }
        let d = match how {
            "sigterm" => {
                drop(d);
                None
            }
            "kill -9" => {
                d.signal(libc::SIGKILL);
                assert_eq!(affinity(vcpu), [last], "kill -9 restores nothing by itself");
                let d2 = w.daemon(QUIET_POLICY); // restores what the dead one left, shields nothing
                let log = std::fs::read_to_string(w.p("daemon.log")).unwrap();
                assert!(log.contains("IRQ affinity(ies) and host group(s) a previous daemon's shield left"), "{log}");
                drop(d2);
                None
            }
            _ => {
                let out = d.cli(&["vm", "static", "vm1", "--shield", "off"]);
                assert!(out.status.success(), "{out:?}");
                assert_eq!(d.vm_status("vm1").unwrap()["static"]["tuning"], "none");
                Some(d)
            }
        };
        assert_eq!(affinity(vcpu), all, "{how}: vCPU affinity back");
        assert_eq!(affinity(io), all, "{how}");
        assert_eq!(affinity(main), all, "{how}");
        assert_eq!(cpuset_of(vcpu), vcpu_group_before, "{how}: vCPU back in its group");
        assert!(!Path::new(&gdir).exists(), "{how}: the shield's group is gone");
        assert_eq!(affinity(hg.pid()), all, "{how}: the test process back on every CPU");
        assert_eq!(hg.cpus(), cosched_host::shield::format_cpus(&all.iter().copied().collect()));
        assert_eq!(irqs.now(), irqs.0, "{how}: every IRQ mask exactly as before");
        drop(d);
        assert!(!w.state_dir().join(cosched_host::shield::RECORD_FILE).exists(), "{how}: no shield record left");
    }
}

fn fifo(prio: u32) -> SchedAttr {
    SchedAttr::rt(sched::SCHED_FIFO, prio, SCHED_FLAG_RESET_ON_FORK)
}

/// vCPU FIFO 97, the others 98.
fn static_fifo(vm: &FakeVm) -> bool {
    vm.attrs().iter().all(|(comm, a)| a.same_as(&fifo(if comm.starts_with("CPU ") { 97 } else { 98 })))
}

#[test]
fn static_fifo_97_98_over_a_dynamic_boost_each_undone_exactly() {
    if !have_root() {
        return;
    }
    for order in ["static first", "boost first", "static off while boosted"] {
        let w = World::new();
        let config = if order == "static first" {
            format!("{QUIET_POLICY}[vm.vm1.static]\nfifo = true\n")
        } else {
            QUIET_POLICY.to_string()
        };
        let d = w.daemon(&config);
        let mut vm = w.vm("vm1", "qemu-system-x86_64", &THREADS);
        d.wait_vm("vm1");
        let worker = vm.tid("worker");
        // The worker's own nice, set before anything of ours (under static first, the daemon
        // made it FIFO on finding the VM: a nice set now would be someone else's change).
        let worker_nice = if order == "static first" { 0 } else { -3 };
        if worker_nice != 0 {
            sched::set(worker, &SchedAttr::other(worker_nice, 0)).unwrap();
        }
        let fifo_cmd = |on: &str| {
            let out = d.cli(&["vm", "static", "vm1", "--fifo", on]);
            assert!(out.status.success(), "{out:?}");
        };
        vm.register();
        match order {
            "static first" => {
                let end = Instant::now() + Duration::from_secs(5);
                while !static_fifo(&vm) {
                    let log = std::fs::read_to_string(w.p("daemon.log")).unwrap_or_default();
                    assert!(Instant::now() < end, "static FIFO: {:?}; log:\n{log}", vm.attrs());
                    std::thread::sleep(Duration::from_millis(10));
                }
                assert_eq!(vm.request(Kind::Cpu, 1).kind, Kind::Ack);
                std::thread::sleep(Duration::from_millis(100));
                assert!(static_fifo(&vm), "a boost never lowers the static class: {:?}", vm.attrs());
                vm.request(Kind::Cpu, 0);
                std::thread::sleep(Duration::from_millis(100));
                assert!(static_fifo(&vm), "the deboost leaves the static class: {:?}", vm.attrs());
                fifo_cmd("false");
            }
            "boost first" => {
                vm.request(Kind::Cpu, 1);
                assert!(vm.boosted_soon(1));
                fifo_cmd("true");
                assert!(static_fifo(&vm), "static over the boost: {:?}", vm.attrs());
                vm.request(Kind::Cpu, 0);
                std::thread::sleep(Duration::from_millis(100));
                assert!(static_fifo(&vm), "the deboost leaves the static class: {:?}", vm.attrs());
                fifo_cmd("false");
            }
            _ => {
                vm.request(Kind::Cpu, 1);
                assert!(vm.boosted_soon(1));
                fifo_cmd("true");
                assert!(static_fifo(&vm), "{:?}", vm.attrs());
                fifo_cmd("false");
                assert!(vm.boosted_soon(1), "the boost under way comes back: {:?}", vm.attrs());
                vm.request(Kind::Cpu, 0);
            }
        }
        wait_for("originals", Duration::from_secs(2), || vm.none_realtime().then_some(()));
        assert!(sched::get(worker).unwrap().same_as(&SchedAttr::other(worker_nice, 0)), "{order}: {:?}", vm.attrs());
        assert!(
            vm.attrs().iter().all(|(c, a)| c == "worker" || a.same_as(&SchedAttr::other(0, 0))),
            "{order}: {:?}",
            vm.attrs()
        );
    }
}

/// The calling thread at `SCHED_FIFO` `priority` while this lives, then back to what it had.
struct RealTimeSelf(Option<SchedAttr>);

impl RealTimeSelf {
    fn new(priority: u32) -> RealTimeSelf {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let before = sched::get(me).unwrap();
        match sched::set(me, &SchedAttr::rt(sched::SCHED_FIFO, priority, 0)) {
            Ok(()) => RealTimeSelf(Some(before)),
            Err(e) => {
                eprintln!("sampling at {before}, not SCHED_FIFO {priority}: {e}");
                RealTimeSelf(None)
            }
        }
    }
}

impl Drop for RealTimeSelf {
    fn drop(&mut self) {
        if let Some(before) = &self.0 {
            // SAFETY: gettid has no preconditions.
            let _ = sched::set(unsafe { libc::gettid() }, before);
        }
    }
}

/// The vCPU's attributes sampled every 100 µs for `for_`, from `SCHED_FIFO` 40 (above a boosted
/// vCPU's 30 or less, below the daemon's 99): at `SCHED_OTHER` the sampler, beside the other
/// tests' spinning threads and whatever else loads the 2 CPUs, was seen to miss a whole 2.5 ms
/// boost ("never boosted"). It sleeps between samples, so it takes little from anyone.
fn sample(tid: i32, for_: Duration) -> Vec<(Duration, SchedAttr)> {
    let _rt = RealTimeSelf::new(40);
    sample_since(tid, Instant::now(), for_)
}

/// [`sample`] with the clock started at `t0`, by a caller already at `SCHED_FIFO` 40 (see
/// [`RealTimeSelf`]): one that starts it before sending a frame measures from the send, and a
/// preemption between the send and the first sample cannot make the host look early.
fn sample_since(tid: i32, t0: Instant, for_: Duration) -> Vec<(Duration, SchedAttr)> {
    let mut out = Vec::new();
    while t0.elapsed() < for_ {
        let a = sched::get(tid).unwrap();
        // sched_getattr reads a thread's policy and priority without a lock: a read during the
        // daemon's change can pair the new policy with the old priority (SCHED_FIFO 0, seen
        // once in 13 runs). Such a torn read is neither state: left out.
        let torn = (a.policy == sched::SCHED_FIFO || a.policy == SCHED_RR) && a.priority == 0;
        if !torn {
            out.push((t0.elapsed(), a));
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    out
}

/// The longest gap between two samples: how long the sampler was held off.
fn longest_gap(samples: &[(Duration, SchedAttr)]) -> Duration {
    samples.windows(2).map(|p| p[1].0 - p[0].0).max().unwrap_or_default()
}

#[test]
fn a_guest_priority_boosts_the_vcpu_at_sched_fifo_capped_by_the_ceiling_and_cpu_0_restores_it() {
    // Not beside the event-boosting tests: their detection tells a device from a timer by the
    // waker's context, and was seen to take every wake-up for a timer's while this ran beside it.
    let _heavy = cpu_heavy();
    let Some(Setup { w: _w, d, mut vm }) =
        one_vm(&format!("{QUIET_POLICY}[boost]\nother_threads_priority_offset = 1\n[rt]\nrt_ceiling = 30\n"))
    else {
        return;
    };
    let vcpu = vm.tid("CPU 0/TCG");
    let io = vm.tid("IO iothread0");
    sched::set(vcpu, &SchedAttr::other(5, 0)).unwrap();
    let io_before = sched::get(io).unwrap();
    vm.register();
    // Guest priority 80, `same` map, ceiling 30: the vCPU at FIFO 30, the others one above.
    let need = cosched_proto::cpu::Need { priority: 80, irq: false };
    assert_eq!(vm.request(Kind::Cpu, need.encode()), Frame::ack(2, 1 | 30 << 8));
    let fifo = |tid: i32, p: u32| {
        let a = sched::get(tid).unwrap();
        a.policy == sched::SCHED_FIFO && a.priority == p && a.flags & SCHED_FLAG_RESET_ON_FORK != 0
    };
    wait_for("vCPU at FIFO 30", Duration::from_secs(2), || fifo(vcpu, 30).then_some(()));
    assert!(fifo(io, 31), "{:?}", sched::get(io));
    let st = d.vm_status("vm1").unwrap();
    assert_eq!(st["resources"]["cpu"]["rt"]["host_priority"], 30);
    assert_eq!(st["resources"]["cpu"]["rt"]["guest_priority"], 80);
    // A new priority while boosted re-applies; the operator's ceiling for the VM too.
    let need = cosched_proto::cpu::Need { priority: 20, irq: false };
    assert_eq!(vm.request(Kind::Cpu, need.encode()), Frame::ack(3, 1 | 20 << 8));
    assert!(fifo(vcpu, 20) && fifo(io, 21), "{:?}", vm.attrs());
    let out = d.cli(&["vm", "ceiling", "vm1", "10"]);
    assert!(out.status.success(), "{out:?}");
    wait_for("vCPU at FIFO 10", Duration::from_secs(2), || fifo(vcpu, 10).then_some(()));
    let out = d.cli(&["vm", "ceiling", "vm1", "98"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("below the daemon's own"), "{out:?}");
    // CPU 0 puts back exactly what was there.
    assert_eq!(vm.request(Kind::Cpu, 0), Frame::ack(4, 0));
    assert!(sched::get(vcpu).unwrap().same_as(&SchedAttr::other(5, 0)), "{:?}", sched::get(vcpu));
    assert!(sched::get(io).unwrap().same_as(&io_before));
    assert!(vm.none_realtime(), "{:?}", vm.attrs());
}

/// A standing prediction on the real kernel: after one `WAKE` with a period, the daemon boosts
/// the vCPU every period by itself (a boost and its end per period, with nothing from the guest),
/// and `WAKE 0` stops it.
#[test]
fn a_standing_prediction_boosts_the_vcpu_every_period_until_withdrawn() {
    let _heavy = cpu_heavy();
    let Some(Setup { w: _w, d, mut vm }) =
        one_vm(&format!("{QUIET_POLICY}[rt]\nrt_ceiling = 30\npredict_hold_us = 2000\npredict_lead_min_us = 1500\n"))
    else {
        return;
    };
    let vcpu = vm.tid("CPU 0/TCG");
    let before = sched::get(vcpu).unwrap();
    vm.register();
    let rt = |a: &SchedAttr| a.policy == sched::SCHED_FIFO || a.policy == SCHED_RR;
    // Due in 20 ms, then every 25 ms: boosted 1.5 ms before each, for 3.5 ms.
    let seq = vm.send(Kind::Wake, cosched_proto::wake::encode_standing(20_000, 80, 25_000));
    let reply = vm.recv();
    assert_eq!((reply.kind, reply.seq), (Kind::Ack, seq), "{reply}");
    assert_eq!(cosched_proto::wake::decode_standing_ack(reply.value), (18_500, 2_000), "{reply}");
    // Over 300 ms (12 periods), count the boosts seen start: each a period's, the vCPU back to
    // its own attributes between them.
    let rt_self = RealTimeSelf::new(40);
    let samples = sample_since(vcpu, Instant::now(), Duration::from_millis(300));
    drop(rt_self);
    let mut onsets = 0;
    let mut torn = 0;
    let mut prev = false;
    for (i, (_, a)) in samples.iter().enumerate() {
        let on = rt(a);
        // The other torn read (see `sample_since`): `__sched_setscheduler` sets the thread's
        // RESET_ON_FORK before its policy, so a read during a boost's start can see `before`
        // with the new flag (failed 1 of 2 CI runs; a C loop toggling a spinning thread between
        // SCHED_OTHER and FIFO 30|RESET_ON_FORK read this 3,350 times in 4 million reads, and
        // FIFO 0 15 times). It is one only where the next sample is the boost: a boost's end
        // that left the flag would show it for the rest of the period.
        let mut without_flag = *a;
        without_flag.flags &= !SCHED_FLAG_RESET_ON_FORK;
        let onset_torn = !on
            && a.flags & SCHED_FLAG_RESET_ON_FORK != 0
            && without_flag.same_as(&before)
            && samples.get(i + 1).is_some_and(|(_, n)| rt(n));
        assert!(on || onset_torn || a.same_as(&before), "sample {i} of {}: {a:?}", samples.len());
        torn += onset_torn as u32;
        onsets += (on && !prev) as u32;
        prev = on;
    }
    let st = wait_for("a few standing periods counted", Duration::from_secs(5), || {
        let st = d.vm_status("vm1")?["resources"]["cpu"]["rt"].clone();
        (st["predictions"]["standing"].as_u64()? >= 8).then_some(st)
    });
    eprintln!(
        "{onsets} boosts seen in {} samples over 300 ms ({torn} read torn at a boost's start, longest \
         gap {:?}); rt status {st}",
        samples.len(),
        longest_gap(&samples)
    );
    // 11 or 12 periods; this shared machine's steal time may hide a few 3.5 ms boosts from the
    // sampler, and would not make one look like two.
    assert!((6..=12).contains(&onsets), "{onsets} boosts seen: {st}");
    assert_eq!(st["pending"][1], "standing", "{st}");
    assert_eq!(st["predictions"]["received"].as_u64(), Some(1), "one WAKE: {st}");
    assert_eq!(st["predictions"]["unconfirmed"].as_u64(), Some(0), "{st}");
    // Withdrawn: no boost after.
    let seq = vm.send(Kind::Wake, cosched_proto::wake::encode(0, 0));
    assert_eq!(vm.recv().seq, seq);
    let samples = sample_since(vcpu, Instant::now(), Duration::from_millis(100));
    assert!(samples.iter().all(|(_, a)| a.same_as(&before)), "boosted after WAKE 0");
    assert!(d.vm_status("vm1").unwrap()["resources"]["cpu"]["rt"]["pending"].is_null());
}

#[test]
fn a_predicted_wake_up_boosts_the_vcpu_just_before_it_and_ends_after_the_hold() {
    // Timed, and its sampling loads a CPU: not beside the other timed tests.
    let _heavy = cpu_heavy();
    let Some(Setup { w: _w, d, mut vm }) =
        // A lead of 1.5 ms (the default's 500 µs is within this machine's timer jitter: a
        // FIFO 99 cyclictest here sees 0.3% of wake-ups 0.5 ms late, up to 16 ms): the boost
        // is planned 18.5 ms after the WAKE arrives, so that "before the wake-up" and "not at
        // once" are each 1.5 ms or more from where a broken lead would put it.
        one_vm(&format!(
            "{QUIET_POLICY}[rt]\nrt_ceiling = 30\npredict_hold_us = 2000\npredict_lead_min_us = 1500\n"
        ))
    else {
        return;
    };
    let vcpu = vm.tid("CPU 0/TCG");
    let before = sched::get(vcpu).unwrap();
    vm.register();
    let rt = |a: &SchedAttr| a.policy == sched::SCHED_FIFO || a.policy == SCHED_RR;
    let mut onsets = Vec::new();
    let mut ends = Vec::new();
    // Rounds sent, and those not judged: one whose sampler was held off over 1 ms (a FIFO 40
    // thread) measured the machine, not the daemon. This machine is itself a VM: under the
    // suite's load its hypervisor takes its CPUs away for 1-10 ms at a time (steal time), in some
    // minutes in most rounds, so the test sends up to 60 rounds for 16 clean ones, and judges
    // the timing on what it got if that is at least 4.
    let (mut sent, mut redone) = (0, Vec::new());
    while onsets.len() < 16 && sent < 60 {
        sent += 1;
        // The previous round's boost is over first (its hold ends 22 ms after its WAKE, but a
        // daemon held off by the machine's steal time can end it later: a CI run's round then
        // saw the vCPU at FIFO 5 µs after its WAKE, which replaced the prediction and ended it).
        wait_for_or(
            "the previous round's boost to end",
            Duration::from_secs(2),
            || (!rt(&sched::get(vcpu).unwrap())).then_some(()),
            || format!(": the vCPU is at {:?}", sched::get(vcpu)),
        );
        // Due 20 ms after sending, for a guest task at priority 80: FIFO 30 (the ceiling). The
        // clock starts before the write, from a real-time sampler: started after it, a CI run's
        // sampler was held off 3.7 ms between the two, and the boost looked that much early.
        let rt_self = RealTimeSelf::new(40);
        let t0 = Instant::now();
        let seq = vm.send(Kind::Wake, cosched_proto::wake::encode(20_000, 80));
        let samples = sample_since(vcpu, t0, Duration::from_millis(60));
        drop(rt_self);
        let reply = vm.recv();
        assert_eq!((reply.kind, reply.seq), (Kind::Ack, seq), "{reply}");
        // The ACK says when the boost is planned: 20 ms less the lead, 1.5 ms (more once the
        // guest is seen waking early; none is here).
        assert_eq!(reply.value, 18_500, "boost after {} µs", reply.value);
        let gap = longest_gap(&samples);
        if gap > Duration::from_millis(1) {
            redone.push(gap);
            continue;
        }
        let on = samples.iter().find(|(_, a)| rt(a)).unwrap_or_else(|| {
            let st = d.vm_status("vm1").map(|v| v["resources"]["cpu"]["rt"].clone()).unwrap_or_default();
            panic!(
                "round {sent}: never boosted in {} samples (longest gap {gap:?}); reply {reply}; rt status {st}",
                samples.len()
            )
        });
        assert!(on.1.policy == sched::SCHED_FIFO && on.1.priority == 30, "{:?}", on.1);
        let off = samples.iter().skip_while(|(_, a)| !rt(a)).find(|(_, a)| !rt(a)).expect("deboosted after the hold");
        assert!(off.1.same_as(&before), "{:?}", off.1);
        onsets.push(on.0);
        ends.push(off.0);
    }
    // Judged on at least 4 clean rounds; with fewer (a run here once had none in 60: the sampler
    // held off up to 38 ms at a time) the timing cannot be measured, and the run says so.
    let judged = onsets.len() >= 4;
    if !judged {
        eprintln!(
            "timing not judged: only {} clean rounds of {sent}: the sampler (SCHED_FIFO 40) was held off over 1 ms \
             in the others (steal time: see /proc/stat): {redone:?}",
            onsets.len()
        );
    }
    onsets.sort();
    ends.sort();
    let st = d.vm_status("vm1").unwrap();
    let rt_st = &st["resources"]["cpu"]["rt"];
    let late = &rt_st["predict_apply_late_us"];
    eprintln!(
        "boost seen at {onsets:?}, ended at {ends:?} after sending WAKE 20000 ({} rounds not judged, sampler held \
         off {redone:?}); planned vs applied (µs): {late}",
        redone.len()
    );
    // Seen before the wake-up is due (20 ms after sending; the boost is planned 1.5 ms before it
    // arrives plus 20 ms): a frame's transit here is 50-200 µs per hop, and this one takes two
    // (test -> fake QEMU -> daemon). A few rounds may meet a hiccup of this shared machine
    // (the test suite runs beside it). With no lead the boost would come at 20.1 ms or later.
    assert!(!judged || onsets[onsets.len() * 3 / 4 - 1] < Duration::from_millis(20), "{onsets:?}");
    // Not at once: from the 9th on the daemon acts early by what it measured it takes (the
    // median, ~150 µs here), so the earliest is 18.5 ms less that.
    assert!(!judged || onsets[0] > Duration::from_millis(17), "{onsets:?}");
    // Unconfirmed: ended 20 ms + the 2 ms hold after the WAKE arrived (the clock here starts
    // before the write, so the end can only look later; 500 µs spare for the sampling).
    assert!(!judged || ends[0] >= Duration::from_micros(21_500), "{ends:?}");
    let p = &rt_st["predictions"];
    // Every WAKE received; each applied one unconfirmed (no CPU 1 came). One that the machine's
    // stolen time kept from being applied in time (seen once: 31 of 32) is one of a round not
    // judged.
    let applied = p["applied"].as_u64().unwrap_or(0);
    assert_eq!(p["received"].as_u64(), Some(sent), "{p}");
    assert_eq!(p["unconfirmed"].as_u64(), Some(applied), "{p}");
    assert!(applied + redone.len() as u64 >= sent, "{p}: {} rounds not judged", redone.len());
    assert!(late["p50_us"].as_f64().unwrap() < 300.0, "{late}");

    // Confirmed: the guest's CPU 1 at the wake-up keeps the boost, its CPU 0 ends it. A try
    // whose CPU 1 left 21.5 ms or more after the WAKE (a hiccup of the machine held this thread
    // past its 20 ms sleep) may come after the 2 ms hold ended the prediction: redone, up to 4.
    let need = cosched_proto::cpu::Need { priority: 80, irq: false };
    let mut late_tries = Vec::new();
    let rt_st = loop {
        let late_before =
            d.vm_status("vm1").unwrap()["resources"]["cpu"]["rt"]["predictions"]["late"].as_u64().unwrap_or(0);
        let t0 = Instant::now();
        let seq = vm.send(Kind::Wake, cosched_proto::wake::encode(20_000, 80));
        assert_eq!(vm.recv().seq, seq);
        std::thread::sleep(Duration::from_millis(20).saturating_sub(t0.elapsed()));
        let at = t0.elapsed();
        assert_eq!(vm.request(Kind::Cpu, need.encode()), Frame::ack(seq + 1, 1 | 30 << 8));
        std::thread::sleep(Duration::from_millis(10));
        assert!(sched::get(vcpu).unwrap().policy == sched::SCHED_FIFO, "held past the hold once confirmed");
        assert_eq!(vm.request(Kind::Cpu, 0), Frame::ack(seq + 2, 0));
        assert!(sched::get(vcpu).unwrap().same_as(&before));
        let rt_st = d.vm_status("vm1").unwrap()["resources"]["cpu"]["rt"].clone();
        if rt_st["predictions"]["confirmed"] == 1 {
            break rt_st;
        }
        // Late by the daemon's clock too (the frame held up on its way, e.g. by stolen time, past
        // the end of the prediction's hold): also redone.
        let late_seen = rt_st["predictions"]["late"].as_u64().unwrap_or(0) > late_before;
        assert!(
            at >= Duration::from_micros(21_500) || late_seen,
            "CPU 1 sent {at:?} after the WAKE, not a confirmation: {rt_st}"
        );
        late_tries.push(at);
        assert!(late_tries.len() <= 4, "CPU 1 sent late in every try: {late_tries:?}");
    };
    eprintln!("prediction error (µs): {}; lead {} µs", rt_st["predict_error_us"], rt_st["lead_us"]);
    let metrics = String::from_utf8(d.cli(&["metrics"]).stdout).unwrap();
    assert!(
        metrics.contains("cosched_vm_predictions_total{vm=\"vm1\",resource=\"cpu\",outcome=\"confirmed\"} 1"),
        "{metrics}"
    );
}

#[test]
fn static_fifo_with_the_guard_alternates_the_vcpu_within_its_share_and_is_undone_after_kill_9() {
    if !have_root() {
        return;
    }
    // A short window so the test sees many demotions: FIFO at most 100 ms of every 200 ms.
    let policy = "[policy]\nmax_continuous_boost_ms = 0\nmax_boost_share_permille = 1000\nhost_reserve_cpus = 0\n\
                  rt_guard_window_ms = 200\nrt_guard_max_share_permille = 500\nrt_guard_hysteresis_ms = 20\n";
    let w = World::new();
    let mut d = w.daemon(&format!("{policy}[vm.vm1.static]\nfifo = true\nguard = true\n"));
    let vm = w.vm("vm1", "qemu-system-x86_64", &THREADS);
    d.wait_vm("vm1");
    let (vcpu, io) = (vm.tid("CPU 0/TCG"), vm.tid("IO iothread0"));
    wait_for("vCPU at FIFO 97", Duration::from_secs(5), || sched::get(vcpu).unwrap().same_as(&fifo(97)).then_some(()));
    // Sample for 2 s: the vCPU alternates between FIFO 97 and the guard's nice -20, and is at
    // FIFO for about the share; the other threads stay at FIFO 98 throughout.
    let guarded = SchedAttr::other(-20, SCHED_FLAG_RESET_ON_FORK);
    let s = sample(vcpu, Duration::from_secs(2));
    let at_fifo = s.iter().filter(|(_, a)| a.same_as(&fifo(97))).count();
    let at_guard = s.iter().filter(|(_, a)| a.same_as(&guarded)).count();
    assert_eq!(at_fifo + at_guard, s.len(), "only the two states: {:?}", s.iter().find(|(_, a)| !a.same_as(&guarded)));
    let share = at_fifo as f64 / s.len() as f64;
    assert!((0.35..=0.6).contains(&share), "FIFO share {share:.2} of the samples (the rule: 0.5)");
    let flips = s.windows(2).filter(|p| p[0].1.same_as(&guarded) != p[1].1.same_as(&guarded)).count();
    assert!(flips >= 8, "{flips} changes in 2 s (expected ~20)");
    assert!(sched::get(io).unwrap().same_as(&fifo(98)));
    let st = d.vm_status("vm1").unwrap();
    assert!(st["static"]["guard"]["demotions"].as_u64().unwrap() >= 4, "{st}");
    // No stall: the longest FIFO run is the allowance (100 ms), give or take the loop's 1 ms
    // and the sampling's jitter, never the window.
    let mut longest = Duration::ZERO;
    let mut from = None;
    for (t, a) in &s {
        match (a.same_as(&fifo(97)), from) {
            (true, None) => from = Some(*t),
            (false, Some(f)) => {
                longest = longest.max(*t - f);
                from = None;
            }
            _ => {}
        }
    }
    assert!(longest < Duration::from_millis(150), "longest FIFO run {longest:?}");
    // kill -9 at any moment: a restarted daemon puts every thread back (from FIFO or guarded).
    d.signal(libc::SIGKILL);
    let d2 = w.daemon(QUIET_POLICY);
    wait_for("originals", Duration::from_secs(3), || vm.none_realtime().then_some(()));
    assert!(vm.attrs().iter().all(|(_, a)| a.same_as(&SchedAttr::other(0, 0))), "{:?}", vm.attrs());
    // The operator turns the guard on and off on a running VM.
    drop(d2);
    let d = w.daemon(policy);
    d.wait_vm("vm1");
    let out = d.cli(&["vm", "static", "vm1", "--fifo", "true", "--guard", "true"]);
    assert!(out.status.success(), "{out:?}");
    wait_for("guarded", Duration::from_secs(2), || sched::get(vcpu).unwrap().same_as(&guarded).then_some(()));
    let out = d.cli(&["vm", "static", "vm1", "--guard", "false"]);
    assert!(out.status.success(), "{out:?}");
    assert!(sched::get(vcpu).unwrap().same_as(&fifo(97)), "guard off: FIFO for good");
    let s = sample(vcpu, Duration::from_millis(400));
    assert!(s.iter().all(|(_, a)| a.same_as(&fifo(97))), "no guard any more");
    assert!(d.vm_status("vm1").unwrap()["static"]["guard"].is_null());
    drop(d);
    assert!(vm.attrs().iter().all(|(_, a)| a.same_as(&SchedAttr::other(0, 0))), "{:?}", vm.attrs());
}

// ---- Memory bandwidth ----

/// Run time of a thread so far (ns), from `schedstat`.
fn runtime_ns(tid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{tid}/schedstat")).unwrap_or_default();
    s.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The cgroup freezer a memory-bandwidth test throttles through.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Freezer {
    /// v1 `freezer`: the daemon moves the vCPU thread into a frozen group of its own.
    V1,
    /// v2 `cgroup.freeze` of the VM's own group: every thread of the VM.
    V2,
}

/// The whole host path with the `simulated` backend on the real kernel: the guest's `MEMBW` is
/// admitted (and lowered to what is free); the regulator stops a spinning vCPU through the real
/// cgroup v1 freezer (or the v2 one, where the host has no v1 freezer) once the replayed
/// bandwidth passes its budget, so its real run time drops; the main thread is never touched.
/// Then `kill -9` while the vCPU is frozen: `cosched restore` moves it back (which thaws it)
/// and removes the frozen group.
#[test]
fn membw_throttle_freezes_real_vcpus_and_kill_9_is_restored() {
    if !have_root() {
        return;
    }
    let v1 = cosched_host::cgroup::CgroupFs::default().has_hierarchy("freezer");
    if !v1 {
        eprintln!("no cgroup v1 freezer hierarchy here: the throttle runs through the v2 cgroup.freeze");
    }
    membw_throttle_through(if v1 { Freezer::V1 } else { Freezer::V2 }, "auto");
}

/// The same through the v2 hierarchy's `cgroup.freeze` (on a hybrid host, the one at
/// `/sys/fs/cgroup/unified`, which has no controllers but a real freezer): the fake QEMU alone
/// in a v2 group of the test's, frozen whole by the daemon (`[membw] freezer = "v2"`) and
/// thawed by `cosched restore` after `kill -9`.
#[test]
fn membw_throttle_through_cgroup_v2_freeze_and_kill_9_is_restored() {
    if !have_root() {
        return;
    }
    membw_throttle_through(Freezer::V2, "v2");
}

fn membw_throttle_through(kind: Freezer, choice: &str) {
    // Its vCPU spins for seconds: not beside the timed tests.
    let _heavy = cpu_heavy();
    let cg = cosched_host::cgroup::CgroupFs::default();
    let w = World::new();
    let trace = w.p("membw.trace");
    // 5000 MB/s per second of vCPU run time: 10 MB (a 100‰ share of 1000 MB/s over 100 ms)
    // take 2 ms of run.
    std::fs::write(&trace, "0 * 5000\n").unwrap();
    let config = format!(
        "{QUIET_POLICY}[membw]\nbackend = \"simulated\"\ntrace = {trace:?}\nfreezer = \"{choice}\"\n\
         guaranteed_mbps = 1000\nperiod_ms = 100\nchecks_per_period = 5\nreclaim = false\nbest_effort = false\n\
         [vm.vm1]\nmembw_share = 100\n[vm.other]\nmembw_share = 600\n"
    );
    let exe = w.fake_qemu("vm1", "qemu-system-x86_64");
    let args: Vec<String> = ["--busy", "CPU 0/TCG"].iter().map(|s| s.to_string()).collect();
    let mut vm = w.vm_args(&exe, "vm1", &args, &["CPU 0/TCG"], None);
    // Declared after the VM and before the daemon: dropped after the daemon (whatever
    // happens) and before the VM is killed, its threads thawed and out of every group.
    let group = match kind {
        Freezer::V1 => TestGroup::new("freezer").expect("no cgroup v1 freezer hierarchy at /sys/fs/cgroup/freezer"),
        Freezer::V2 => TestGroup::new("").unwrap_or_else(|| {
            panic!("no cgroup v2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified (mount -t cgroup2)")
        }),
    };
    match kind {
        Freezer::V1 => vm.threads().iter().for_each(|(tid, _)| cg.set(*tid, "freezer", &group.name).unwrap()),
        Freezer::V2 => group.add_process(vm.pid),
    }
    let mut d = w.daemon(&config);
    d.wait_vm("vm1");
    let st = d.status();
    assert_eq!(st["membw"]["backend"], "simulated", "{}", st["membw"]);
    assert!(st["membw"]["warning"].as_str().unwrap().starts_with("SIMULATED"));
    let through = st["membw"]["throttles_through"].as_str().unwrap_or_default().to_string();
    let lever = if kind == Freezer::V1 { "cgroup v1 freezer" } else { "cgroup v2 cgroup.freeze" };
    assert!(through.starts_with(lever), "{kind:?}: {through}");
    let vcpu = vm.tid("CPU 0/TCG");
    // v1: the daemon's frozen group under the test's; v2: the test's group itself.
    let ours = match kind {
        Freezer::V1 => format!("{}/cosched-membw-{}", group.name, vm.pid),
        Freezer::V2 => group.name.clone(),
    };
    // Frozen: v1, the vCPU in the daemon's group and the group FROZEN, not FREEZING (a v1
    // freeze completes after the move, asynchronously); v2, the group's events say frozen 1.
    let hierarchy = if kind == Freezer::V1 { "freezer" } else { "" };
    let in_ours = || cg.get(vcpu, hierarchy).is_ok_and(|g| g == ours);
    let frozen = || match kind {
        Freezer::V1 => in_ours() && group.read(&ours, "freezer.state") == "FROZEN" && in_ours(),
        Freezer::V2 => group.read(&ours, "cgroup.events").lines().any(|l| l == "frozen 1"),
    };
    let seen = |d: &Daemon| {
        // The daemon may be dead (kill -9): its status is then null.
        let membw = d
            .try_status()
            .and_then(|st| st["vms"].as_array()?.iter().find(|v| v["name"] == "vm1").map(|v| v["membw"].clone()));
        let membw = membw.unwrap_or_default();
        let state = match kind {
            Freezer::V1 => format!("freezer.state {:?}", group.read(&ours, "freezer.state")),
            Freezer::V2 => format!(
                "cgroup.freeze {:?}, cgroup.events {:?}",
                group.read(&ours, "cgroup.freeze"),
                group.read(&ours, "cgroup.events")
            ),
        };
        format!(": the vCPU is in {:?}, {ours}: {state}; vm1 membw {membw}", cg.get(vcpu, hierarchy))
    };
    // The guest asks for 500‰: it replaces vm1's own 100‰, and the `other` VM of the config is
    // not running (a share counts while its VM runs), so it fits. (In v2 the fake QEMU's relay
    // threads are frozen with the vCPU: the replies come in the thawed part of each period.)
    vm.register_caps(caps::CPU | caps::MEMBW);
    assert_eq!(vm.request(Kind::Membw, 500), Frame::ack(2, 500));
    assert_eq!(vm.request(Kind::Membw, 1001).deny_reason(), Some(DenyReason::Malformed), "past 1000‰");
    let m = d.vm_status("vm1").unwrap()["membw"].clone();
    assert_eq!((m["effective_permille"].as_u64(), m["guarantee_mbps"].as_f64()), (Some(500), Some(500.0)), "{m}");
    // 50 MB per period = 10 ms of run: the vCPU is stopped for most of each period.
    // 10 s, not the period's 100 ms: the root tests run in parallel on 2 CPUs, and a fresh-clone
    // CI run once timed out at 3 s. On a timeout, say where the vCPU is and what the daemon saw.
    wait_for_or("the vCPU frozen", Duration::from_secs(10), || frozen().then_some(()), || seen(&d));
    // The daemon counts the VM stopped once the freezer says so (not at its decision).
    wait_for_or(
        "the daemon to count vm1 stopped",
        Duration::from_secs(10),
        || (d.vm_status("vm1")?["membw"]["stopped"] == true).then_some(()),
        || seen(&d),
    );
    if kind == Freezer::V1 {
        assert_eq!(cg.get(vm.pid, "freezer").unwrap(), group.name, "the main thread is never stopped");
    }
    // Its run time over 1 s: under half (18-30% here; 10 ms of run per 100 ms period is the
    // budget). Up to 5 windows: one run of the suite saw 56% with most throttles of that
    // second still FREEZING (stopping_ns 633 ms, unconfirmed_throttles 3), once; the next
    // window is the check, and a freezer that never holds fails all five.
    let mut windows = Vec::new();
    let share = loop {
        let (r0, t0) = (runtime_ns(vcpu), Instant::now());
        std::thread::sleep(Duration::from_millis(1000));
        let share = (runtime_ns(vcpu) - r0) as f64 / t0.elapsed().as_nanos() as f64;
        let m = d.vm_status("vm1").unwrap()["membw"].clone();
        eprintln!("membw ({kind:?}): the throttled spinning vCPU ran {:.0}% of 1 s; {}", share * 100.0, m["stats"]);
        windows.push(format!("{:.0}%: {}", share * 100.0, m["stats"]));
        if share < 0.5 || windows.len() == 5 {
            break share;
        }
    };
    let m = d.vm_status("vm1").unwrap()["membw"].clone();
    assert!(share < 0.5, "a throttled spinning vCPU ran over half of each second: {windows:#?}");
    assert!(m["stats"]["throttles"].as_u64().unwrap() >= 5, "{m}");
    assert!(m["stats"]["throttled_ns"].as_u64().unwrap() > 0, "stopped time counted: {m}");
    let metrics = String::from_utf8(d.cli(&["metrics"]).stdout).unwrap();
    assert!(metrics.contains("cosched_vm_membw_throttles_total{vm=\"vm1\"}"), "{metrics}");
    assert!(metrics.contains("cosched_vm_membw_stopping_seconds_total{vm=\"vm1\"}"), "{metrics}");
    assert!(metrics.contains("cosched_membw_period_ms{backend=\"simulated\"} 100"), "{metrics}");
    // The operator's switches, and their checks.
    assert!(d.cli(&["membw", "--period-ms", "50", "--best-effort", "true"]).status.success());
    let st = d.status();
    assert_eq!((st["membw"]["period_ms"].as_u64(), st["membw"]["best_effort"].as_bool()), (Some(50), Some(true)));
    let out = d.cli(&["membw", "--period-ms", "0"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("period_ms must be 1..=10000"), "{out:?}");
    assert!(d.cli(&["membw", "--best-effort", "false"]).status.success());
    let out = d.cli(&["vm", "membw", "nosuchvm", "10"]);
    assert!(!out.status.success());
    // kill -9 with the vCPU frozen. A 10 s period first: its budget (1 s of run) spent, the
    // vCPU stays frozen for the rest of it, seconds, so the kill finds it frozen (in a 100 ms
    // period it would be let run again within 90 ms of being seen frozen).
    assert!(d.cli(&["membw", "--period-ms", "10000"]).status.success());
    wait_for_or("the vCPU frozen again", Duration::from_secs(20), || frozen().then_some(()), || seen(&d));
    d.signal(libc::SIGKILL);
    assert!(frozen(), "kill -9 leaves it frozen{}", seen(&d));
    let r1 = runtime_ns(vcpu);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(runtime_ns(vcpu), r1, "kill -9 leaves it frozen: it does not run");
    let out = w.restore();
    assert!(out.status.success(), "{out:?}");
    match kind {
        Freezer::V1 => {
            assert_eq!(cg.get(vcpu, "freezer").unwrap(), group.name, "back in its group");
            assert!(!cg.dir("freezer", &ours).exists(), "the frozen group is removed");
        }
        Freezer::V2 => {
            assert_eq!(group.read(&ours, "cgroup.freeze"), "0", "cgroup.freeze put back");
            // Thawing completes asynchronously, like freezing.
            wait_for_or(
                "the group thawed",
                Duration::from_secs(10),
                || group.read(&ours, "cgroup.events").lines().any(|l| l == "frozen 0").then_some(()),
                || format!(": cgroup.events {:?}", group.read(&ours, "cgroup.events")),
            );
        }
    }
    let r2 = runtime_ns(vcpu);
    wait_for_or(
        "the vCPU to run 100 ms again",
        Duration::from_secs(10),
        || (runtime_ns(vcpu) - r2 > 100_000_000).then_some(()),
        || format!(": {} ms run", (runtime_ns(vcpu) - r2) / 1_000_000),
    );
    assert!(state_files(&w).is_empty());
}

/// The v1 freezer takes the threads QEMU names vCPUs, and no other: a VM's I/O thread, its
/// worker and its unnamed threads (the fake QEMU's chardev relay) are never moved into the
/// frozen group. A vCPU that loses its name while frozen (SIGUSR2: the fake QEMU renames it
/// from another thread) is moved back at once, not left frozen until the period's end or ever;
/// the throttle, with no named vCPU left, says it is not applied. (An hour's soak saw a VM whose
/// vCPU dropped out of the daemon's list while throttled: every other thread was then frozen as
/// a "vCPU", its chardev relay with them, and stayed frozen.)
#[test]
fn membw_throttle_v1_takes_named_vcpus_only_and_thaws_one_that_loses_its_name() {
    if !have_root() {
        return;
    }
    let cg = cosched_host::cgroup::CgroupFs::default();
    if !cg.has_hierarchy("freezer") {
        eprintln!("no cgroup v1 freezer hierarchy here: the v1 lever is not used on this host");
        return;
    }
    let _heavy = cpu_heavy();
    let w = World::new();
    let trace = w.p("membw.trace");
    // 5000 MB/s per second of vCPU run time; a 100‰ share of 1000 MB/s over a 10 s period is
    // 1000 MB: 200 ms of run, then the vCPU is held frozen for the rest of the period.
    std::fs::write(&trace, "0 * 5000\n").unwrap();
    let config = format!(
        "{QUIET_POLICY}[membw]\nbackend = \"simulated\"\ntrace = {trace:?}\nfreezer = \"v1\"\n\
         guaranteed_mbps = 1000\nperiod_ms = 10000\nchecks_per_period = 50\nreclaim = false\nbest_effort = false\n\
         [vm.vm1]\nmembw_share = 100\n"
    );
    let exe = w.fake_qemu("vm1", "qemu-system-x86_64");
    let args: Vec<String> = ["--busy", "CPU 0/TCG", "--thread", "IO iothread0", "--thread", "worker"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let vm = w.vm_args(&exe, "vm1", &args, &["CPU 0/TCG", "IO iothread0", "worker"], None);
    let group = TestGroup::new("freezer").expect("no cgroup v1 freezer hierarchy at /sys/fs/cgroup/freezer");
    vm.threads().iter().for_each(|(tid, _)| cg.set(*tid, "freezer", &group.name).unwrap());
    let mut d = w.daemon(&config);
    d.wait_vm("vm1");
    let vcpu = vm.tid("CPU 0/TCG");
    let ours = format!("{}/cosched-membw-{}", group.name, vm.pid);
    let members = || group.read(&ours, "tasks").split_whitespace().filter_map(|t| t.parse().ok()).collect::<Vec<i32>>();
    let seen = |d: &Daemon| {
        let membw = d.vm_status("vm1").map(|v| v["membw"].clone()).unwrap_or_default();
        format!(
            ": threads {:?}; {ours}: tasks {:?}, freezer.state {:?}; vm1 membw {membw}",
            vm.threads()
                .iter()
                .map(|(t, c)| (*t, c.clone(), cg.get(*t, "freezer").unwrap_or_default()))
                .collect::<Vec<_>>(),
            members(),
            group.read(&ours, "freezer.state"),
        )
    };
    wait_for_or(
        "the vCPU frozen",
        Duration::from_secs(10),
        || (members() == [vcpu] && group.read(&ours, "freezer.state") == "FROZEN").then_some(()),
        || seen(&d),
    );
    // SIGUSR2: the fake QEMU renames its vCPU, frozen, from another of its threads.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(vm.pid, libc::SIGUSR2) };
    wait_for_or(
        "the renamed vCPU moved back to its group",
        Duration::from_secs(5),
        || (cg.get(vcpu, "freezer").is_ok_and(|g| g == group.name) && members().is_empty()).then_some(()),
        || seen(&d),
    );
    let r = runtime_ns(vcpu);
    wait_for_or(
        "the renamed vCPU to run 100 ms",
        Duration::from_secs(5),
        || (runtime_ns(vcpu) - r > 100_000_000).then_some(()),
        || format!(": {} ms run{}", (runtime_ns(vcpu) - r) / 1_000_000, seen(&d)),
    );
    // The throttle goes on for the rest of the period and beyond: it says it is not applied,
    // and no thread of the VM is moved in meanwhile (checked over 2 s, each 50 ms).
    let why = wait_for_or(
        "vm1's membw throttle reported not applied",
        Duration::from_secs(15),
        || d.vm_status("vm1")?["resources"]["membw"]["not_applied"].as_str().map(str::to_string),
        || seen(&d),
    );
    assert!(why.contains("its QEMU names none"), "{why}{}", seen(&d));
    for _ in 0..40 {
        assert!(members().is_empty(), "a thread moved into the frozen group{}", seen(&d));
        std::thread::sleep(Duration::from_millis(50));
    }
    d.signal(libc::SIGTERM);
    assert!(!cg.dir("freezer", &ours).exists(), "the daemon's group removed at its stop");
    assert!(state_files(&w).is_empty());
}

/// `cosched status --watch`: redrawn live from the running daemon, each VM per resource, with
/// the share of the time boosted since the last redraw.
#[test]
fn status_watch_redraws_each_vm_per_resource_live() {
    let Some(Setup { w: _w, d, mut vm }) = one_vm(QUIET_POLICY) else {
        return;
    };
    vm.register();
    vm.request(Kind::Cpu, 1);
    assert!(vm.boosted_soon(1));
    let out = d.cli(&["status", "--watch", "--count", "2", "--interval-ms", "300"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(!text.contains('\x1b'), "no screen control codes when not on a terminal");
    let frames: Vec<&str> = text.split("cosched: 1 VM(s)").skip(1).collect();
    assert_eq!(frames.len(), 2, "{text}");
    let cpu = |f: &str| {
        f.lines().find(|l| l.starts_with("vm1")).map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
    };
    let first = cpu(frames[0]).unwrap();
    assert_eq!((first[2].as_str(), first[3].as_str(), first[6].as_str()), ("cpu", "boosted", "-"), "{text}");
    // Boosted the whole 0.3 s between the redraws.
    let second = cpu(frames[1]).unwrap();
    let pct: f64 = second[6].trim_end_matches('%').parse().unwrap();
    assert!(pct > 80.0, "{text}");
    let bad = d.cli(&["status", "--watch", "--json"]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("cannot be used with"));
}

/// `capsh` arguments that run what follows as user nobody with exactly `caps` (ambient, so
/// they survive the exec) and no others.
fn as_nobody_with(caps: &str) -> Vec<String> {
    assert!(
        Path::new("/usr/sbin/capsh").exists() || Path::new("/sbin/capsh").exists(),
        "capsh missing: apt-get install libcap2-bin (scripts/setup.sh installs it)"
    );
    vec![
        "capsh".into(),
        format!("--caps={caps}+eip cap_setpcap,cap_setuid,cap_setgid+ep"),
        "--keep=1".into(),
        "--user=nobody".into(),
        format!("--addamb={caps}"),
        "--".into(),
        "-c".into(),
        "exec \"$0\" \"$@\"".into(),
    ]
}

/// Least privilege: the daemon runs as user nobody with only the systemd unit's capabilities,
/// and boosts; without CAP_BPF it says it lost host BPF (thread events, event
/// boosting) and boosts all the same.
#[test]
fn the_daemon_runs_as_nobody_with_the_units_capabilities_and_says_what_it_lost_without_some() {
    if !have_root() {
        return;
    }
    const UNIT: &str =
        "cap_sys_nice,cap_bpf,cap_perfmon,cap_dac_override,cap_dac_read_search,cap_sys_ptrace,cap_ipc_lock";
    const NO_BPF: &str = "cap_sys_nice,cap_perfmon,cap_dac_override,cap_dac_read_search,cap_sys_ptrace,cap_ipc_lock";
    for (caps, bpf) in [(UNIT, true), (NO_BPF, false)] {
        let w = World::new();
        let prefix = as_nobody_with(caps);
        let d = w.daemon_with(QUIET_POLICY, &prefix.iter().map(String::as_str).collect::<Vec<_>>());
        let mut vm = w.vm("vm1", "qemu-system-x86_64", &THREADS);
        d.wait_vm("vm1");
        let st = d.status();
        let p = &st["privileges"];
        assert_eq!(p["uid"], 65534, "{p}");
        let lost: Vec<String> = p["lost"].as_array().unwrap().iter().map(|l| l["feature"].to_string()).collect();
        if bpf {
            assert!(lost.is_empty(), "{lost:?}");
            assert_eq!(st["daemon"]["thread_events"].as_str(), Some("tp_btf"), "{}", st["daemon"]);
        } else {
            assert_eq!(lost.len(), 1, "{lost:?}");
            assert!(lost[0].contains("host BPF"), "{lost:?}");
            assert_ne!(st["daemon"]["thread_events"].as_str(), Some("tp_btf"), "{}", st["daemon"]);
            let log = std::fs::read_to_string(w.p("daemon.log")).unwrap();
            assert!(
                log.contains("privileges: uid 65534 without CAP_BPF + CAP_PERFMON or CAP_SYS_ADMIN: lost host BPF"),
                "{log}"
            );
            let text = String::from_utf8_lossy(&d.cli(&["status"]).stdout).to_string();
            assert!(text.contains("privileges: lost host BPF"), "{text}");
        }
        // The boost works either way, and is undone.
        vm.register();
        assert_eq!(vm.request(Kind::Cpu, 1).kind, Kind::Ack);
        assert!(vm.boosted_soon(1), "{:?}", vm.attrs());
        vm.request(Kind::Cpu, 0);
        wait_for("the deboost", Duration::from_secs(2), || vm.none_realtime().then_some(()));
        drop(vm);
        drop(d);
    }
}

/// Every key path of `v` with its value's JSON type (`.vms[].resources.cpu.level: string`);
/// array elements share one path.
fn json_shape(v: &Value, at: &str, out: &mut std::collections::BTreeSet<String>) {
    let kind = match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    // What depends on what happened: a resource's own counters appear once counted, a reason
    // once denied, a level's run delays once a vCPU waited at it.
    let shared = ["requests", "boosts", "deboosts", "boosted_ns", "budget_exhausted", "denied"];
    let own = at.starts_with(".vms[].resources.")
        && at.rsplit_once(".counters.").is_some_and(|(_, k)| !k.contains('.') && !shared.contains(&k));
    if own || at.contains(".denied.") || at.starts_with(".vms[].run_delay.") {
        return;
    }
    out.insert(format!("{at}: {kind}"));
    match v {
        Value::Array(a) => a.iter().for_each(|e| json_shape(e, &format!("{at}[]"), out)),
        Value::Object(m) => m.iter().for_each(|(k, e)| json_shape(e, &format!("{at}.{k}"), out)),
        _ => {}
    }
}

/// `cosched status --json` keeps the keys, nesting and value types of the status captured
/// before it was typed (testdata/status-v1.json), made the way that sample was: two VMs, one
/// with an agent (a malformed run, a membw request, a boost, a predicted wake-up), one with a
/// static FIFO tuning and its guard, a socket refused, `[membw]` simulated. `schema_version`
/// is the one key added.
#[test]
fn status_json_keeps_the_keys_of_the_captured_sample() {
    if !have_root() {
        return;
    }
    let w = World::new();
    let trace = w.p("membw.trace");
    std::fs::write(&trace, "0 * 50\n").unwrap();
    let config = format!(
        "[policy]\nmax_continuous_boost_ms = 0\nmax_boost_share_permille = 1000\nhost_reserve_cpus = 0\n\
         rt_guard_window_ms = 1000\nrt_guard_max_share_permille = 900\n\
         [membw]\nbackend = \"simulated\"\ntrace = {trace:?}\nguaranteed_mbps = 1000\nperiod_ms = 100\n\
         checks_per_period = 5\nreclaim = false\nbest_effort = false\n\
         [vm.vm1]\nmembw_share = 100\n[vm.vm2.static]\nfifo = true\nguard = true\n"
    );
    let d = w.daemon(&config);
    let mut vm1 = w.vm("vm1", "qemu-system-x86_64", &THREADS);
    let _vm2 = w.vm("vm2", "qemu-system-x86_64", &THREADS);
    let _evil = w.vm("evil", "python3", &THREADS);
    d.wait_vm("vm1");
    d.wait_vm("vm2");
    let mut bytes: Vec<u8> = (0..61u32).map(|i| ((i * 37 + 11) % 256) as u8).collect();
    bytes.extend_from_slice(&Frame::register(1, caps::CPU | caps::MEMBW).encode());
    vm1.write(&bytes);
    assert_eq!(vm1.recv(), Frame::deny(0, DenyReason::Malformed));
    assert_eq!(vm1.recv(), Frame::ack(1, caps::CPU | caps::MEMBW));
    vm1.seq = 1;
    assert_eq!(vm1.request(Kind::Membw, 500).kind, Kind::Ack);
    vm1.request(Kind::Cpu, 1);
    vm1.request(Kind::Cpu, 0);
    vm1.request(Kind::Wake, cosched_proto::wake::encode(5_000, 80));
    vm1.request(Kind::Cpu, 1);
    let st = wait_for(
        "the refused socket, vm2's guard, both VMs' membw, no prediction pending",
        Duration::from_secs(10),
        || {
            let st = d.status();
            let ready = st["unconnected_sockets"].as_array().is_some_and(|a| !a.is_empty())
            && st["vms"].as_array()?.iter().all(|v| v["membw"].is_object())
            && st["vms"].as_array()?.iter().any(|v| v["static"]["guard"].is_object())
            // The predicted wake-up is over (the sample was taken after it).
            && st["vms"].as_array()?.iter().all(|v| v["resources"]["cpu"]["rt"]["pending"].is_null());
            ready.then_some(st)
        },
    );
    assert_eq!(st["schema_version"], 1);
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/status-v1.json");
    let sample: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let (mut live, mut captured) = Default::default();
    json_shape(&st, "", &mut live);
    json_shape(&sample, "", &mut captured);
    assert!(live.remove(".schema_version: integer"));
    // Keys added to schema 1 since the sample was captured (optional in the types).
    live.remove(".vms[].resources.cpu.rt.predictions.standing: integer");
    // Present only while the static guard holds the FIFO vCPUs at its nice (part of each of its
    // windows), so a sample taken then has it and one taken at another instant does not.
    live.remove(".vms[].static.plan.guarded: integer");
    let lost: Vec<_> = captured.difference(&live).collect();
    let added: Vec<_> = live.difference(&captured).collect();
    assert!(lost.is_empty() && added.is_empty(), "lost {lost:#?}\nadded {added:#?}\n{st:#}");
    // What the CLI reads it into writes it back whole (a key the types miss would be lost).
    let typed: cosched_status::Status = serde_json::from_value(st.clone()).unwrap();
    assert_eq!(serde_json::to_value(typed).unwrap(), st);
}

/// The unit's `ExecStopPost=cosched restore` with a config that does not load (a typo made
/// after the daemon started): a SIGKILLed daemon's threads are still put back, from the state
/// directory the broken config still names, or the one given on the command line; a warning
/// says why the config was not used.
#[test]
fn restore_with_a_broken_config_still_restores_a_sigkilled_daemon_s_threads() {
    for how in ["state_dir salvaged from the config", "--state-dir, config not TOML"] {
        let Some(mut s) = one_vm(QUIET_POLICY) else { return };
        let worker = s.vm.tid("worker");
        sched::set(worker, &SchedAttr::other(-3, 0)).unwrap();
        s.boost_then_kill_the_daemon();
        assert!(s.vm.boosted_soon(1), "kill -9 restores nothing by itself");
        assert_eq!(state_files(&s.w).len(), 1, "{how}: the dead daemon's record");
        let cfg = s.w.p("broken.toml");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cosched"));
        cmd.arg("--config").arg(&cfg).arg("restore");
        if how.starts_with("state_dir") {
            std::fs::write(&cfg, format!("state_dir = {:?}\n[policy]\nmax_continous_boost_ms = 5\n", s.w.state_dir()))
                .unwrap();
        } else {
            std::fs::write(&cfg, "[policy\nmax_continuous_boost_ms = 5\n").unwrap();
            cmd.arg("--state-dir").arg(s.w.state_dir());
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{how}: {out:?}");
        assert!(stderr.contains("warning: cannot load the config"), "{how}: {stderr}");
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("restored "), "{how}: {out:?}");
        assert!(s.vm.none_realtime(), "{how}: {:?}", s.vm.attrs());
        assert!(sched::get(worker).unwrap().same_as(&SchedAttr::other(-3, 0)), "{how}: original nice");
        assert!(state_files(&s.w).is_empty(), "{how}: state removed");
    }
}

/// What a script sees: each change says what it changed, every listing has `--json` with a
/// `schema_version`, `status` is compact unless asked for threads, a refused request exits 1, and
/// `disable` reaches the daemon through a config that does not load.
#[test]
fn operator_commands_say_what_they_changed_and_show_json() {
    let Some(s) = one_vm(QUIET_POLICY) else { return };
    let ok = |args: &[&str]| -> String {
        let out = s.d.cli(args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let json = |args: &[&str]| -> Value { serde_json::from_str(&ok(args)).unwrap() };
    assert_eq!(ok(&["vm", "priority", "vm1", "10"]), "vm1: priority 10\n");
    assert_eq!(ok(&["vm", "disable", "vm1", "io"]), "vm1: disabled io\n");
    assert_eq!(ok(&["vm", "enable", "vm1"]), "vm1: enabled every resource\n");
    assert_eq!(ok(&["disable", "io"]), "disabled io for the whole host\n");
    assert_eq!(ok(&["enable"]), "enabled every resource for the whole host\n");
    let change = json(&["vm", "ceiling", "vm1", "30", "--json"]);
    assert_eq!(change["schema_version"], 1);
    assert_eq!(change["changed"], serde_json::json!({"cmd": "ceiling", "vm": "vm1", "ceiling": 30}));
    assert_eq!(change["summary"], "vm1: RT ceiling 30");
    assert_eq!(json(&["enable", "io", "--json"])["summary"], "enabled io for the whole host");

    let list = ok(&["vm", "list"]);
    assert!(list.starts_with("VM ") && list.lines().nth(1).is_some_and(|l| l.starts_with("vm1 ")), "{list}");
    let list = json(&["vm", "list", "--json"]);
    assert_eq!(list["schema_version"], 1);
    assert_eq!(list["vms"][0]["name"], "vm1");
    assert_eq!(list["vms"][0]["pid"], s.vm.pid);
    let pid = s.vm.pid.to_string();
    for key in ["vm1", pid.as_str()] {
        let one = json(&["status", key, "--json"]);
        assert_eq!(one["schema_version"], 1);
        assert_eq!(one["vms"].as_array().map(Vec::len), Some(1), "{key}: {one:#}");
        assert_eq!(one["vms"][0]["name"], "vm1");
    }
    assert_eq!(json(&["status", "--json"])["schema_version"], 1);
    assert_eq!(json(&["membw", "--json"])["schema_version"], 1);
    let metrics = ok(&["metrics"]);
    let build = format!("cosched_build_info{{version=\"{}\",commit=\"", env!("CARGO_PKG_VERSION"));
    assert!(metrics.lines().any(|l| l.starts_with(&build) && l.ends_with("\"} 1")), "{metrics}");

    // Threads only when asked.
    let comm = "IO iothread0";
    let compact = ok(&["status"]);
    assert!(compact.contains("vm1") && !compact.contains(comm), "{compact}");
    let threads = ok(&["status", "--threads"]);
    assert!(threads.contains(comm), "{threads}");
    let one = ok(&["status", "vm1", "--threads"]);
    assert!(one.starts_with("VM ") && one.contains(comm), "{one}");

    // Refused: 1, with the daemon's reason.
    for args in [&["vm", "priority", "nosuch", "10"][..], &["status", "nosuch"]] {
        let out = s.d.cli(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("nosuch"), "{args:?}: {out:?}");
    }

    // A config with a typo still names the control socket: disable reaches the daemon.
    let cfg = s.w.p("broken.toml");
    std::fs::write(&cfg, format!("control_socket = {:?}\nenabeld = false\n", s.w.control())).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cosched")).arg("--config").arg(&cfg).arg("disable").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "disabled every resource for the whole host\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("warning: cannot load the config"), "{out:?}");
    let st = s.d.status();
    assert!(st["resources"].as_object().unwrap().values().all(|r| r["enabled"] == false), "{st:#}");
}

/// A boost the kernel refuses is shown as decided but not applied: in `status` (text and JSON)
/// and `vm list`, not as a boost in force. Real-time group scheduling refuses it here: a v1 `cpu`
/// group with no real-time runtime (`cpu.rt_runtime_us` 0, as libvirt's groups have) cannot hold
/// a real-time thread. A kernel without real-time group scheduling has no such refusal.
#[test]
fn a_boost_the_kernel_refuses_is_shown_as_not_applied() {
    if !have_root() {
        return;
    }
    let Some(group) = TestGroup::new("cpu").filter(|g| g.dir.join("cpu.rt_runtime_us").is_file()) else {
        eprintln!("not applicable: this kernel has no real-time group scheduling (no cpu.rt_runtime_us)");
        return;
    };
    assert_eq!(group.read(&group.name, "cpu.rt_runtime_us"), "0", "a new group has no real-time runtime");
    let w = World::new();
    let d = w.daemon(QUIET_POLICY);
    let mut vm = w.vm("vm1", "qemu-system-x86_64", &THREADS);
    d.wait_vm("vm1");
    group.add_process(vm.pid);
    vm.register();
    vm.request(Kind::Cpu, 1);
    let why = wait_for_or(
        "the refused boost in the status",
        Duration::from_secs(5),
        || d.vm_status("vm1")?["resources"]["cpu"]["not_applied"].as_str().map(str::to_string),
        || format!("; status: {}", d.vm_status("vm1").map(|v| v["resources"]["cpu"].to_string()).unwrap_or_default()),
    );
    assert!(why.contains("rt_runtime_us"), "{why}");
    assert!(vm.none_realtime(), "{:?}", vm.attrs());
    let text = String::from_utf8_lossy(&d.cli(&["status", "vm1"]).stdout).to_string();
    assert!(text.contains("cpu: boosted decided but NOT APPLIED"), "{text}");
    let list = String::from_utf8_lossy(&d.cli(&["vm", "list"]).stdout).to_string();
    assert!(list.contains("boosted!"), "{list}");
    let metrics = String::from_utf8_lossy(&d.cli(&["metrics"]).stdout).to_string();
    assert!(metrics.contains("cosched_vm_not_applied{vm=\"vm1\",resource=\"cpu\"} 1"), "{metrics}");
    // Out of the group, the next boost applies, and the mark goes.
    let root_procs = group.root.join("cgroup.procs");
    std::fs::write(&root_procs, vm.pid.to_string()).unwrap();
    vm.request(Kind::Cpu, 0);
    vm.request(Kind::Cpu, 1);
    assert!(vm.boosted_soon(1), "{:?}", vm.attrs());
    wait_for_or(
        "the mark gone",
        Duration::from_secs(5),
        || d.vm_status("vm1")?["resources"]["cpu"].get("not_applied").is_none().then_some(()),
        || format!("; status: {}", d.vm_status("vm1").map(|v| v["resources"]["cpu"].to_string()).unwrap_or_default()),
    );
}
