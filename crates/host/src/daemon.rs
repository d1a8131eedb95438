//! The host daemon's event loop: one thread, `epoll` (mio) over the socket directory (inotify),
//! the VM channels, the control socket, signals, and the coordinator's deadlines.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use cosched_core::{Action, Coordinator, Level, VmId, VmSettings, NS_PER_MS};
use cosched_procfs::{ProcFs, ProcessInfo, TaskId};
use cosched_proto::Resource;
use cosched_proto::{Event, StreamDecoder};
use mio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use serde_json::{json, Value};

use crate::actuator::{Host, RealSched, VmCpu};
use crate::config::HostConfig;
use crate::control::{Reply, Request};
use crate::metrics::Latency;
use crate::peer;
use crate::sched::{SchedAttr, SCHED_FIFO, SCHED_FLAG_RESET_ON_FORK};
use crate::store::{restore_all, StateDir};

const INOTIFY: Token = Token(0);
const SIGNALS: Token = Token(1);
const CONTROL: Token = Token(2);
const METRICS: Token = Token(3);
const THREADS: Token = Token(4);
const FIRST_CONN: usize = 16;
/// Replies queued for a guest that does not read them are dropped beyond this.
const MAX_OUT: usize = 64 * 1024;
/// Reads of 4 KiB from one VM per wake-up: a guest that floods its channel cannot keep the
/// loop from enforcing budgets, the guard, other VMs and signals; the rest is read next round.
const READS_PER_WAKEUP: usize = 8;
/// Control and metrics clients at once, and how long one may take.
const MAX_CLIENTS: usize = 64;
const CLIENT_TIMEOUT_NS: u64 = 5_000 * NS_PER_MS;

/// A VM the daemon knows: its QEMU process and threads, and its agent's channel if it has one
/// (a VM found among the host's processes has none until a socket of it appears).
struct VmConn {
    id: VmId,
    stream: Option<UnixStream>,
    path: Option<PathBuf>,
    decoder: StreamDecoder,
    out: Vec<u8>,
    cpu: VmCpu,
    latency: Latency,
    actuation_errors: u64,
    dropped_replies: u64,
    last_warn_ns: Option<u64>,
    /// WRITABLE is registered (replies are waiting).
    want_write: bool,
}

/// A control client (one request line, one reply line) or a metrics scrape (one HTTP request,
/// one response). The reply is written without blocking; the connection closes after it.
struct Client<S> {
    stream: S,
    input: Vec<u8>,
    reply: Vec<u8>,
    written: usize,
    since_ns: u64,
}

impl<S: Read + Write + mio::event::Source> Client<S> {
    fn new(stream: S, since_ns: u64) -> Client<S> {
        Client { stream, input: Vec::new(), reply: Vec::new(), written: 0, since_ns }
    }

    /// Writes what the socket takes of the reply; true once all of it is out (or the client is
    /// gone). Otherwise asks the poller to say when the socket is writable again.
    fn send(&mut self, poll: &Poll, token: usize) -> bool {
        while self.written < self.reply.len() {
            match self.stream.write(&self.reply[self.written..]) {
                Ok(0) => return true,
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let _ = poll.registry().reregister(&mut self.stream, Token(token), Interest::WRITABLE);
                    return false;
                }
                Err(_) => return true,
            }
        }
        true
    }
}

/// Longest request a control or metrics client may send.
const MAX_REQUEST: usize = 64 * 1024;

/// Appends what a non-blocking stream has to `input`. Returns whether the peer closed its end,
/// or why the connection should be dropped.
fn read_available(stream: &mut impl Read, input: &mut Vec<u8>) -> Result<bool, &'static str> {
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Ok(true),
            Ok(n) => {
                input.extend_from_slice(&buf[..n]);
                if input.len() > MAX_REQUEST {
                    return Err("request too long");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err("read error"),
        }
    }
}

enum Conn {
    Vm(Box<VmConn>),
    Control(Client<UnixStream>),
    Http(Client<TcpStream>),
}

/// A socket we could not use: when to try again, and whether we said so already.
struct Attempt {
    next_try_ns: u64,
    backoff_ms: u64,
    /// The last failure we logged: a different one is logged again.
    reported: String,
}

/// First retry of a socket that failed (QEMU binds its socket a moment before it listens).
const FIRST_RETRY_MS: u64 = 50;
const MAX_RETRY_MS: u64 = 30_000;

pub struct Daemon {
    cfg: HostConfig,
    /// /proc, the scheduler, the state directory and the boost class: what the actuator uses.
    host: Host,
    coord: Coordinator,
    poll: Poll,
    start: Instant,
    conns: BTreeMap<usize, Conn>,
    next_token: usize,
    by_path: HashMap<PathBuf, usize>,
    attempts: HashMap<PathBuf, Attempt>,
    /// Operator settings per VM name, kept across reconnects.
    settings: BTreeMap<String, VmSettings>,
    latency: Latency,
    inotify: OwnedFd,
    signals: OwnedFd,
    control: UnixListener,
    metrics: Option<TcpListener>,
    /// VMs with bytes left to read after their last wake-up's share.
    backlog: Vec<usize>,
    /// Thread creation, naming and exit of the VMs' processes, seen as they happen (host BPF);
    /// `None`: thread lists are re-read every `thread_refresh_ms` instead.
    thread_watch: Option<cosched_hostbpf::ThreadWatch>,
    thread_events: Vec<cosched_hostbpf::ThreadEvent>,
    /// QEMU processes refused by the process scan (warned once).
    refused_pids: std::collections::HashSet<i32>,
    /// Ring-buffer drops seen so far: more means a rescan of every VM.
    thread_drops: u64,
    /// QEMU pid -> its VM's token.
    by_pid: HashMap<i32, usize>,
    /// VMs with replies waiting: written once per loop turn, however many frames caused them.
    dirty: Vec<usize>,
    /// Reused for every frame, so the hot path does not allocate.
    scratch_actions: Vec<Action>,
    scratch_events: Vec<Event>,
    cost: Cost,
    shutdown: bool,
    next_rescan_ns: u64,
    next_refresh_ns: u64,
    _lock: fs::File,
}

/// Where the daemon's time goes, in total since it started (the `scale` experiment divides by
/// `frames`): reading, decoding, the coordinator, the actuators (of which `syscall_ns` in
/// `sched_setattr`), encoding and writing replies, and the whole of each loop turn but the wait.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Cost {
    pub frames: u64,
    pub read_ns: u64,
    pub decode_ns: u64,
    pub coordinator_ns: u64,
    pub actuate_ns: u64,
    pub syscall_ns: u64,
    pub encode_ns: u64,
    pub write_ns: u64,
    pub loop_ns: u64,
}

fn ns_since(t: Instant) -> u64 {
    t.elapsed().as_nanos() as u64
}

fn errno_result(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Takes an exclusive lock on `<state_dir>/.lock`; fails if another daemon holds it.
pub fn lock_state_dir(store: &StateDir) -> anyhow::Result<fs::File> {
    let path = store.path().join(".lock");
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on a file descriptor we own.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        bail!("another cosched host daemon is running (it holds {}); stop it first", path.display());
    }
    Ok(f)
}

fn block_signals() -> io::Result<OwnedFd> {
    // SAFETY: plain libc calls on a local sigset; the returned fd is owned by us.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        let fd = errno_result(libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC))?;
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

fn watch_dir(dir: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: inotify_init1 returns a new fd we own; add_watch reads the C string only.
    unsafe {
        let fd = OwnedFd::from_raw_fd(errno_result(libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC))?);
        errno_result(libc::inotify_add_watch(
            fd.as_raw_fd(),
            c.as_ptr(),
            libc::IN_CREATE | libc::IN_MOVED_TO | libc::IN_ATTRIB,
        ))?;
        Ok(fd)
    }
}

/// Drains a non-blocking fd; returns what was read.
fn drain_fd(fd: RawFd) -> Vec<u8> {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: reading into a local buffer of the given length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            return all;
        }
        all.extend_from_slice(&buf[..n as usize]);
    }
}

/// Process id and uid of the peer of a connected unix socket.
fn peer_cred(fd: RawFd) -> io::Result<(i32, u32)> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    errno_result(unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len)
    })?;
    Ok((cred.pid, cred.uid))
}

fn vm_name(path: &Path) -> String {
    let file = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    file.strip_suffix(".sock").map(str::to_string).unwrap_or(file)
}

impl Daemon {
    /// Sets everything up: restores what a previous daemon left, binds the control socket,
    /// watches the socket directory.
    pub fn new(cfg: HostConfig) -> anyhow::Result<Daemon> {
        Daemon::with_sched(cfg, ProcFs::default(), Box::new(RealSched))
    }

    pub fn with_sched(
        cfg: HostConfig,
        procfs: ProcFs,
        mut sched: Box<dyn crate::store::ThreadOps>,
    ) -> anyhow::Result<Daemon> {
        cfg.validate()?;
        let store = StateDir::open(&cfg.state_dir)
            .with_context(|| format!("creating state directory {}", cfg.state_dir.display()))?;
        let lock = lock_state_dir(&store)?;
        let report = restore_all(&store, &procfs, sched.as_mut())
            .with_context(|| format!("restoring from {}", cfg.state_dir.display()))?;
        if report.restored + report.gone + report.untouched > 0 || !report.errors.is_empty() {
            info!(
                "restored {} thread(s) left boosted by a previous daemon ({} gone, {} changed by someone else)",
                report.restored, report.gone, report.untouched
            );
        }
        for e in &report.errors {
            warn!("restore: {e}");
        }

        fs::create_dir_all(&cfg.socket_dir)
            .with_context(|| format!("creating socket directory {}", cfg.socket_dir.display()))?;
        let signals = block_signals().context("blocking SIGTERM/SIGINT/SIGHUP")?;
        let inotify = watch_dir(&cfg.socket_dir)
            .with_context(|| format!("watching {} with inotify", cfg.socket_dir.display()))?;

        if let Some(dir) = cfg.control_socket.parent() {
            fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        if cfg.control_socket.exists() {
            // The lock says no daemon runs, so this is a leftover of one that was killed.
            fs::remove_file(&cfg.control_socket)
                .with_context(|| format!("removing stale {}", cfg.control_socket.display()))?;
        }
        let mut control = UnixListener::bind(&cfg.control_socket)
            .with_context(|| format!("binding control socket {}", cfg.control_socket.display()))?;
        fs::set_permissions(&cfg.control_socket, fs::Permissions::from_mode(0o600))?;

        let poll = Poll::new()?;
        poll.registry().register(&mut SourceFd(&inotify.as_raw_fd()), INOTIFY, Interest::READABLE)?;
        poll.registry().register(&mut SourceFd(&signals.as_raw_fd()), SIGNALS, Interest::READABLE)?;
        poll.registry().register(&mut control, CONTROL, Interest::READABLE)?;
        let metrics = match &cfg.metrics_listen {
            Some(addr) => {
                let a = addr.parse().with_context(|| format!("metrics_listen = {addr:?}: not an ip:port"))?;
                let mut l = TcpListener::bind(a).with_context(|| format!("binding metrics on {addr}"))?;
                poll.registry().register(&mut l, METRICS, Interest::READABLE)?;
                Some(l)
            }
            None => None,
        };
        if cfg.daemon_priority > 0 {
            // Only the daemon's own thread; RESET_ON_FORK so nothing it starts inherits it.
            let me = SchedAttr::rt(SCHED_FIFO, cfg.daemon_priority as u32, SCHED_FLAG_RESET_ON_FORK);
            crate::sched::set(0, &me)
                .map_err(|e| anyhow::anyhow!(crate::sched::explain_set_error(0, &me, &e)))
                .context("daemon_priority (set it to 0 to run at SCHED_OTHER)")?;
        }
        let host_cpus = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
        let mut policy = cfg.policy.clone();
        if cfg.boost.policy == crate::actuator::BoostPolicy::Deadline {
            warn!(
                "[boost] policy = \"deadline\" is experimental: on some kernels (seen on Linux 6.18) a \
                 thread that leaves SCHED_DEADLINE while asleep never returns its bandwidth, so after a \
                 few deboosts no SCHED_DEADLINE reservation is admitted on this host until it reboots"
            );
        }
        if !cfg.boost.policy.needs_rt_guard() && policy.rt_guard_max_share_permille != 0 {
            // SCHED_DEADLINE and nice boosts put no vCPU at an RT class: nothing to guard.
            policy.rt_guard_max_share_permille = 0;
        }
        let cpu = cosched_core::CpuPolicy::new(&policy, host_cpus);
        let capacity = cpu.capacity();
        let mut coord = Coordinator::new(policy, vec![Box::new(cpu)]);
        if capacity == 0 {
            warn!(
                "this host has {host_cpus} CPU(s) and host_reserve_cpus = {}: no VM can be boosted",
                cfg.policy.host_reserve_cpus
            );
        }
        let mut sink = Vec::new();
        for r in Resource::ALL {
            coord.set_enabled(Some(r), cfg.starts_enabled(r), 0, &mut sink);
        }
        let settings = cfg.vm.keys().map(|name| (name.clone(), cfg.vm_settings(name))).collect();
        info!(
            "watching {} for VM sockets; control socket {}; coordination {}",
            cfg.socket_dir.display(),
            cfg.control_socket.display(),
            if cfg.enabled { "enabled" } else { "disabled" }
        );
        let thread_watch = if cfg.thread_events {
            match cosched_hostbpf::ThreadWatch::open() {
                Ok(w) => {
                    poll.registry().register(&mut SourceFd(&w.fd()), THREADS, Interest::READABLE)?;
                    info!("seeing VM threads come and go as it happens ({})", w.mechanism());
                    Some(w)
                }
                Err(e) => {
                    warn!(
                        "thread events unavailable ({e}); re-reading boosted VMs' thread lists every {} ms instead",
                        cfg.thread_refresh_ms
                    );
                    None
                }
            }
        } else {
            None
        };
        // With thread events, membership is known as it changes: a listing is redone only as a
        // safety net, once per rescan.
        let fresh = Duration::from_millis(if thread_watch.is_some() { cfg.rescan_ms } else { cfg.thread_refresh_ms });
        let verify = Duration::from_millis(cfg.thread_verify_ms);
        let host = Host { procfs, sched, store, class: cfg.boost.clone(), fresh, verify, syscall_ns: 0 };
        Ok(Daemon {
            cfg,
            host,
            coord,
            poll,
            start: Instant::now(),
            conns: BTreeMap::new(),
            next_token: FIRST_CONN,
            by_path: HashMap::new(),
            attempts: HashMap::new(),
            settings,
            latency: Latency::default(),
            inotify,
            signals,
            control,
            metrics,
            backlog: Vec::new(),
            thread_watch,
            thread_events: Vec::new(),
            thread_drops: 0,
            refused_pids: Default::default(),
            by_pid: HashMap::new(),
            dirty: Vec::new(),
            scratch_actions: Vec::new(),
            scratch_events: Vec::new(),
            cost: Cost::default(),
            shutdown: false,
            next_rescan_ns: 0,
            next_refresh_ns: 0,
            _lock: lock,
        })
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Runs until SIGTERM or SIGINT, then puts every thread back and returns.
    pub fn run(mut self) -> anyhow::Result<()> {
        let mut events = Events::with_capacity(256);
        while !self.shutdown {
            let now = self.now();
            let mut next = self.next_rescan_ns;
            if self.thread_watch.is_none() {
                next = next.min(self.next_refresh_ns);
            }
            if let Some(retry) = self.attempts.values().map(|a| a.next_try_ns).min() {
                next = next.min(retry);
            }
            if let Some(d) = self.coord.next_deadline() {
                next = next.min(d);
            }
            let timeout =
                if self.backlog.is_empty() { Duration::from_nanos(next.saturating_sub(now)) } else { Duration::ZERO };
            match self.poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Whatever went wrong, nothing we changed may outlive us.
                    self.restore_everything();
                    return Err(e).context("epoll");
                }
            }
            let turn = Instant::now();
            // Thread exits first: no change goes to a thread id that is no longer the VM's.
            self.on_thread_events();
            for ev in events.iter() {
                match ev.token() {
                    THREADS => {}
                    INOTIFY => self.on_inotify(),
                    SIGNALS => self.on_signal(),
                    CONTROL => self.accept_control(),
                    METRICS => self.accept_metrics(),
                    Token(t) => self.on_conn(t, ev.is_readable(), ev.is_writable()),
                }
            }
            for token in std::mem::take(&mut self.backlog) {
                self.read_vm(token);
            }
            let now = self.now();
            let mut actions = Vec::new();
            self.coord.tick(now, &mut actions);
            self.execute(actions, None);
            if now >= self.next_rescan_ns {
                self.next_rescan_ns = now + self.cfg.rescan_ms * NS_PER_MS;
                self.check_vms_alive();
                if self.thread_watch.is_none() {
                    self.refresh_threads(true);
                }
                self.scan_socket_dir();
                if self.cfg.discover_processes {
                    self.scan_processes();
                }
                self.expire_clients(now);
            } else if self.attempts.values().any(|a| now >= a.next_try_ns) {
                self.scan_socket_dir();
            }
            if self.thread_watch.is_none() && now >= self.next_refresh_ns {
                self.next_refresh_ns = now + self.cfg.thread_refresh_ms * NS_PER_MS;
                self.refresh_threads(false);
            }
            self.flush_dirty();
            self.cost.loop_ns += ns_since(turn);
        }
        self.restore_everything();
        Ok(())
    }

    fn on_signal(&mut self) {
        let bytes = drain_fd(self.signals.as_raw_fd());
        for chunk in bytes.chunks(std::mem::size_of::<libc::signalfd_siginfo>()) {
            let signo = u32::from_ne_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]) as i32;
            if signo == libc::SIGHUP {
                info!("SIGHUP: rescanning {}", self.cfg.socket_dir.display());
                self.attempts.clear();
                self.scan_socket_dir();
            } else {
                info!("signal {signo}: restoring every thread and exiting");
                self.shutdown = true;
            }
        }
    }

    /// Puts every thread of every VM back (shutdown).
    fn restore_everything(&mut self) {
        let tokens: Vec<usize> = self.conns.keys().copied().collect();
        for t in tokens {
            self.drop_conn(t, "daemon exiting");
        }
        let _ = fs::remove_file(&self.cfg.control_socket);
    }

    fn on_inotify(&mut self) {
        use std::os::unix::ffi::OsStrExt;
        let bytes = drain_fd(self.inotify.as_raw_fd());
        // struct inotify_event { int wd; u32 mask, cookie, len; char name[len]; }
        let mut off = 0;
        while off + 16 <= bytes.len() {
            let len = u32::from_ne_bytes(bytes[off + 12..off + 16].try_into().unwrap()) as usize;
            let name = &bytes[off + 16..(off + 16 + len).min(bytes.len())];
            let name = name.split(|b| *b == 0).next().unwrap_or_default();
            if !name.is_empty() {
                let path = self.cfg.socket_dir.join(std::ffi::OsStr::from_bytes(name));
                self.attempts.remove(&path); // a new socket deserves a fresh try
            }
            off += 16 + len;
        }
        self.scan_socket_dir();
    }

    fn scan_socket_dir(&mut self) {
        let entries = match fs::read_dir(&self.cfg.socket_dir) {
            Ok(e) => e,
            Err(e) => {
                warn!("reading {}: {e}", self.cfg.socket_dir.display());
                return;
            }
        };
        let now = self.now();
        let mut present = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if !entry.file_type().is_ok_and(|t| t.is_socket()) {
                continue;
            }
            present.push(path.clone());
            if self.by_path.contains_key(&path) {
                continue;
            }
            if self.attempts.get(&path).is_some_and(|a| now < a.next_try_ns) {
                continue;
            }
            if let Err(msg) = self.connect(&path) {
                let a = self.attempts.entry(path.clone()).or_insert(Attempt {
                    next_try_ns: 0,
                    backoff_ms: FIRST_RETRY_MS,
                    reported: String::new(),
                });
                if a.reported != msg {
                    warn!("{}: {msg}; will retry", path.display());
                    a.reported = msg;
                } else {
                    debug!("{}: {msg}", path.display());
                }
                a.next_try_ns = now + a.backoff_ms * NS_PER_MS;
                a.backoff_ms = (a.backoff_ms * 2).min(MAX_RETRY_MS);
            }
        }
        self.attempts.retain(|p, _| present.contains(p));
    }

    /// Connects to a QEMU chardev socket and checks who is on the other end.
    fn connect(&mut self, path: &Path) -> Result<(), String> {
        let mut stream = UnixStream::connect(path).map_err(|e| format!("connect: {e}"))?;
        let (pid, _uid) = peer_cred(stream.as_raw_fd()).map_err(|e| format!("SO_PEERCRED: {e}"))?;
        let listener = self.host.procfs.process(pid).map_err(|e| format!("peer pid {pid}: {e}"))?;
        let process = if listener.is_qemu() { listener } else { self.qemu_behind(&stream, &listener)? };
        let pid = process.task.id;
        self.check_binary(&process)?;
        let name = vm_name(path);
        if let Some(&token) = self.by_pid.get(&pid) {
            // Found among the processes before: its agent's channel joins the same entry.
            self.poll
                .registry()
                .register(&mut stream, Token(token), Interest::READABLE)
                .map_err(|e| format!("epoll: {e}"))?;
            let Some(Conn::Vm(c)) = self.conns.get_mut(&token) else { return Err("internal: lost VM".into()) };
            info!("{}: its agent channel {} connected; now named {name}", c.cpu.name, path.display());
            c.stream = Some(stream);
            c.path = Some(path.to_path_buf());
            c.cpu.name = name.clone();
            self.coord.rename(c.id, &name);
            self.by_path.insert(path.to_path_buf(), token);
            self.attempts.remove(path);
            return Ok(());
        }
        let token = self.adopt(&name, process.task)?;
        self.poll
            .registry()
            .register(&mut stream, Token(token), Interest::READABLE)
            .map_err(|e| format!("epoll: {e}"))?;
        let Some(Conn::Vm(c)) = self.conns.get_mut(&token) else { return Err("internal: lost VM".into()) };
        info!("{name}: connected to QEMU pid {pid} ({} threads) via {}", c.cpu.thread_count(), path.display());
        c.stream = Some(stream);
        c.path = Some(path.to_path_buf());
        self.by_path.insert(path.to_path_buf(), token);
        self.attempts.remove(path);
        Ok(())
    }

    /// Makes an entry for the VM of QEMU process `process`, named `name`, with no channel yet:
    /// its threads are tracked and watched, the coordinator knows it. Returns its token.
    fn adopt(&mut self, name: &str, process: TaskId) -> Result<usize, String> {
        let pid = process.id;
        // Watch before listing: a thread born in between is seen either way.
        if let Some(w) = self.thread_watch.as_mut() {
            w.watch(pid).map_err(|e| format!("watching the threads of pid {pid}: {e}"))?;
        }
        let cpu = match VmCpu::new(name, process, &mut self.host) {
            Ok(c) => c,
            Err(e) => {
                if let Some(w) = self.thread_watch.as_mut() {
                    w.unwatch(pid);
                }
                return Err(format!("reading threads of pid {pid}: {e}"));
            }
        };
        let token = self.next_token;
        self.next_token += 1;
        let id = VmId(token as u64);
        let settings = *self.settings.entry(name.to_string()).or_insert_with(|| self.coord.default_settings());
        self.coord.vm_found(id, name, settings, self.now());
        self.coord.set_vm_vcpus(id, cpu.vcpu_count());
        self.by_pid.insert(pid, token);
        self.conns.insert(
            token,
            Conn::Vm(Box::new(VmConn {
                id,
                stream: None,
                path: None,
                decoder: StreamDecoder::new(),
                out: Vec::new(),
                cpu,
                latency: Latency::default(),
                actuation_errors: 0,
                dropped_replies: 0,
                last_warn_ns: None,
                want_write: false,
            })),
        );
        Ok(token)
    }

    /// Finds QEMU processes that have no channel to us (guests without an agent, libvirt
    /// domains without the channel) and makes them entries: config `[vm.NAME]` applies to them
    /// by QEMU's `-name` (a libvirt domain's name), and host-side features act on them.
    fn scan_processes(&mut self) {
        let Ok(pids) = self.host.procfs.pids() else { return };
        for pid in pids {
            if self.by_pid.contains_key(&pid) || pid == std::process::id() as i32 {
                continue;
            }
            let Ok(p) = self.host.procfs.process(pid) else { continue };
            if !p.is_qemu() {
                continue;
            }
            if let Err(e) = self.check_binary(&p) {
                if self.refused_pids.insert(pid) {
                    warn!("{e}");
                }
                continue;
            }
            let args = self.host.procfs.cmdline(pid).unwrap_or_default();
            let name = cosched_procfs::qemu_name(&args).unwrap_or_else(|| format!("qemu-{pid}"));
            match self.adopt(&name, p.task) {
                Ok(_) => info!("{name}: found QEMU pid {pid} with no agent channel"),
                Err(e) => debug!("QEMU pid {pid}: {e}"),
            }
        }
        self.refused_pids.retain(|pid| self.host.procfs.process(*pid).is_ok());
    }

    /// The socket was listened on by a process that is not QEMU (libvirt passes the listening
    /// fd to QEMU): the VM is the QEMU process holding the socket that accepted us.
    fn qemu_behind(&self, stream: &UnixStream, listener: &ProcessInfo) -> Result<ProcessInfo, String> {
        let refuse = |why: String| {
            format!(
                "refusing peer pid {} ({}): not a QEMU process (exe {:?}), {why}",
                listener.task.id, listener.comm, listener.exe
            )
        };
        let peer =
            peer::unix_peer_inode(stream.as_raw_fd()).map_err(|e| refuse(format!("and sock_diag failed: {e}")))?;
        // QEMU accepts from its main loop, a moment after our connect() returned.
        let deadline = Instant::now() + Duration::from_millis(200);
        loop {
            let qemus: Vec<ProcessInfo> = self
                .host
                .procfs
                .socket_holders(peer)
                .into_iter()
                .filter_map(|pid| self.host.procfs.process(pid).ok())
                .filter(|p| p.is_qemu())
                .collect();
            match qemus.as_slice() {
                [one] => return Ok(one.clone()),
                [] if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                [] => return Err(refuse("and no QEMU process has accepted the connection (yet)".into())),
                many => {
                    let pids: Vec<i32> = many.iter().map(|p| p.task.id).collect();
                    return Err(refuse(format!("and several QEMU processes hold the connection ({pids:?})")));
                }
            }
        }
    }

    /// The QEMU binary must be one only root could have put there: owned by root and writable
    /// by nobody else. A file named qemu-system-* that any user can create is not enough.
    fn check_binary(&self, p: &ProcessInfo) -> Result<(), String> {
        use std::os::unix::fs::MetadataExt;
        let exe = self.host.procfs.root().join(p.task.id.to_string()).join("exe");
        let m = fs::metadata(&exe).map_err(|e| format!("pid {}: reading its executable: {e}", p.task.id))?;
        if m.uid() != 0 || m.mode() & 0o022 != 0 {
            return Err(format!(
                "refusing pid {} ({}): its executable {:?} is not root-owned and protected (uid {}, mode {:o})",
                p.task.id,
                p.comm,
                p.exe,
                m.uid(),
                m.mode() & 0o7777
            ));
        }
        Ok(())
    }

    fn on_conn(&mut self, token: usize, readable: bool, writable: bool) {
        match self.conns.get(&token) {
            Some(Conn::Vm(_)) => {
                if readable {
                    self.read_vm(token);
                }
                if writable {
                    self.flush_vm(token);
                }
            }
            Some(Conn::Control(_)) => self.on_control(token),
            Some(Conn::Http(_)) => self.on_http(token),
            None => {}
        }
    }

    fn read_vm(&mut self, token: usize) {
        let mut buf = [0u8; 4096];
        let mut events = std::mem::take(&mut self.scratch_events);
        let mut actions = std::mem::take(&mut self.scratch_actions);
        let mut full_reads = 0;
        for _ in 0..READS_PER_WAKEUP {
            let Some(Conn::Vm(vm)) = self.conns.get_mut(&token) else { break };
            let t = Instant::now();
            let Some(stream) = vm.stream.as_mut() else { break };
            let read = stream.read(&mut buf);
            self.cost.read_ns += ns_since(t);
            let n = match read {
                Ok(0) => {
                    self.drop_conn(token, "channel closed (QEMU exited?)");
                    break;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.drop_conn(token, &format!("read error: {e}"));
                    break;
                }
            };
            let rx_ns = self.start.elapsed().as_nanos() as u64;
            let t = Instant::now();
            vm.decoder.push(&buf[..n]);
            let id = vm.id;
            events.clear();
            while let Some(ev) = vm.decoder.next_event() {
                events.push(ev);
            }
            self.cost.decode_ns += ns_since(t);
            for ev in events.drain(..) {
                let t = Instant::now();
                match ev {
                    Event::Frame(f) => {
                        debug!("{}: <- {f}", self.vm_label(token));
                        self.cost.frames += 1;
                        self.coord.frame(id, f, rx_ns, &mut actions);
                    }
                    Event::Malformed(e) => {
                        self.warn_vm(token, &format!("malformed frame: {e}"));
                        self.coord.malformed(id, e.seq(), 0, rx_ns, &mut actions);
                    }
                    Event::Garbage { skipped } => {
                        self.warn_vm(token, &format!("{skipped} byte(s) of garbage skipped"));
                        self.coord.malformed(id, None, skipped as u64, rx_ns, &mut actions);
                    }
                }
                self.cost.coordinator_ns += ns_since(t);
                self.execute_into(&mut actions, Some(rx_ns));
            }
            if n < buf.len() {
                // A short read drained the socket; bytes arriving later raise a new edge. This
                // spares the read that would only say EAGAIN.
                break;
            }
            full_reads += 1;
        }
        if full_reads == READS_PER_WAKEUP && !self.backlog.contains(&token) {
            // Edge-triggered: no new wake-up comes for bytes already waiting; read them next round.
            self.backlog.push(token);
        }
        self.scratch_events = events;
        self.scratch_actions = actions;
        // One write per VM per wake-up, however many frames it sent.
        let t = Instant::now();
        self.flush_vm(token);
        self.dirty.retain(|d| *d != token);
        self.cost.write_ns += ns_since(t);
    }

    fn vm_label(&self, token: usize) -> String {
        match self.conns.get(&token) {
            Some(Conn::Vm(vm)) => vm.cpu.name.clone(),
            _ => format!("conn {token}"),
        }
    }

    /// Warns about a VM at most once per second.
    fn warn_vm(&mut self, token: usize, msg: &str) {
        let now = self.now();
        if let Some(Conn::Vm(vm)) = self.conns.get_mut(&token) {
            if vm.last_warn_ns.is_none_or(|t| now >= t + 1_000 * NS_PER_MS) {
                vm.last_warn_ns = Some(now);
                warn!("{}: {msg}", vm.cpu.name);
            }
        }
    }

    /// Carries out the coordinator's actions. `rx_ns`: when the frame that caused them was read.
    fn execute(&mut self, mut actions: Vec<Action>, rx_ns: Option<u64>) {
        self.execute_into(&mut actions, rx_ns);
    }

    /// Like [`Daemon::execute`], leaving `actions` empty for reuse. Replies are queued; they are
    /// written at the end of the loop turn ([`Daemon::flush_dirty`]).
    fn execute_into(&mut self, actions: &mut Vec<Action>, rx_ns: Option<u64>) {
        for a in actions.drain(..) {
            match a {
                Action::Send { vm, frame } => {
                    let t = Instant::now();
                    let token = vm.0 as usize;
                    if let Some(Conn::Vm(c)) = self.conns.get_mut(&token) {
                        debug!("{}: -> {frame}", c.cpu.name);
                        if c.out.len() + 16 > MAX_OUT {
                            c.dropped_replies += 1;
                        } else {
                            c.out.extend_from_slice(&frame.encode());
                        }
                        if !self.dirty.contains(&token) {
                            self.dirty.push(token);
                        }
                    }
                    self.cost.encode_ns += ns_since(t);
                }
                Action::Apply { vm, resource: Resource::Cpu, level, priority, .. } => {
                    let t = Instant::now();
                    self.set_cpu(vm.0 as usize, level, priority, rx_ns);
                    self.cost.actuate_ns += ns_since(t);
                }
                Action::Apply { vm, resource, .. } => {
                    // The coordinator only grants what an actuator was registered for.
                    warn!("no actuator for {resource} (VM {vm:?})");
                }
            }
        }
    }

    /// Writes the replies queued during this loop turn: one write per VM however many frames
    /// it sent.
    fn flush_dirty(&mut self) {
        let t = Instant::now();
        for token in std::mem::take(&mut self.dirty) {
            self.flush_vm(token);
        }
        self.cost.write_ns += ns_since(t);
    }

    /// Thread life-cycle events of the VMs' processes: newcomers are tracked (and brought to
    /// their VM's level at once), renamed threads get their role, exited ones are dropped.
    fn on_thread_events(&mut self) {
        let Some(w) = self.thread_watch.as_mut() else { return };
        let mut evs = std::mem::take(&mut self.thread_events);
        w.drain(&mut evs);
        let dropped = w.dropped();
        let mut touched: Vec<usize> = Vec::new();
        for ev in evs.drain(..) {
            let Some(&token) = self.by_pid.get(&ev.tgid()) else { continue };
            let Some(Conn::Vm(c)) = self.conns.get_mut(&token) else { continue };
            if c.cpu.thread_event(&mut self.host, &ev) && !touched.contains(&token) {
                touched.push(token);
            }
        }
        self.thread_events = evs;
        for token in touched {
            let Some(Conn::Vm(c)) = self.conns.get_mut(&token) else { continue };
            self.coord.set_vm_vcpus(c.id, c.cpu.vcpu_count());
            if c.cpu.level() == Level::Normal {
                continue;
            }
            let (level, priority) = (c.cpu.level(), c.cpu.priority());
            let out = c.cpu.set_level(&mut self.host, level, priority, false);
            self.note_new_threads(token, out);
        }
        if dropped > self.thread_drops {
            warn!(
                "{} thread event(s) lost (ring buffer full): re-reading every VM's threads",
                dropped - self.thread_drops
            );
            self.thread_drops = dropped;
            self.refresh_threads(true);
        }
    }

    fn set_cpu(&mut self, token: usize, level: Level, priority: u8, rx_ns: Option<u64>) {
        let Some(Conn::Vm(c)) = self.conns.get_mut(&token) else { return };
        let was = c.cpu.level();
        let syscalls = self.host.syscall_ns;
        let out = c.cpu.set_level(&mut self.host, level, priority, false);
        self.cost.syscall_ns += self.host.syscall_ns - syscalls;
        let done = self.start.elapsed().as_nanos() as u64;
        if let Some(rx) = rx_ns {
            let ns = done.saturating_sub(rx);
            c.latency.record(ns);
            self.latency.record(ns);
        }
        debug!(
            "{}: {} -> {} ({} thread(s) changed, {} gone, {} left as someone else set them)",
            c.cpu.name,
            was.name(),
            level.name(),
            out.changed,
            out.gone,
            out.foreign
        );
        if !out.errors.is_empty() {
            c.actuation_errors += out.errors.len() as u64;
            let msg = out.errors.join("; ");
            self.warn_vm(token, &msg);
        }
    }

    fn flush_vm(&mut self, token: usize) {
        let Some(Conn::Vm(c)) = self.conns.get_mut(&token) else { return };
        let Some(stream) = c.stream.as_mut() else {
            c.out.clear(); // no agent: nobody to tell
            return;
        };
        while !c.out.is_empty() {
            match stream.write(&c.out) {
                Ok(n) => {
                    c.out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break, // WouldBlock: wait for WRITABLE; other errors show up on read
            }
        }
        let want_write = !c.out.is_empty();
        if want_write != c.want_write {
            let interest = if want_write { Interest::READABLE | Interest::WRITABLE } else { Interest::READABLE };
            let _ = self.poll.registry().reregister(stream, Token(token), interest);
            c.want_write = want_write;
        }
    }

    fn drop_conn(&mut self, token: usize, why: &str) {
        let Some(conn) = self.conns.remove(&token) else { return };
        match conn {
            Conn::Vm(mut c) => {
                let mut actions = Vec::new();
                self.coord.vm_gone(c.id, self.now(), &mut actions);
                let out = c.cpu.restore(&mut self.host);
                for e in &out.errors {
                    warn!("{}: restoring: {e}", c.cpu.name);
                }
                if let Some(stream) = c.stream.as_mut() {
                    let _ = self.poll.registry().deregister(stream);
                }
                if let Some(path) = &c.path {
                    self.by_path.remove(path);
                }
                self.by_pid.remove(&c.cpu.process.id);
                if let Some(w) = self.thread_watch.as_mut() {
                    w.unwatch(c.cpu.process.id);
                }
                info!("{}: {why}; {} setting(s) restored", c.cpu.name, out.restored);
            }
            Conn::Control(mut c) => {
                let _ = self.poll.registry().deregister(&mut c.stream);
                debug!("control client: {why}");
            }
            Conn::Http(mut c) => {
                let _ = self.poll.registry().deregister(&mut c.stream);
                debug!("metrics client: {why}");
            }
        }
    }

    /// Forgets VMs whose QEMU process is gone (or whose pid now names another process).
    fn check_vms_alive(&mut self) {
        let gone: Vec<usize> = self
            .conns
            .iter()
            .filter_map(|(t, c)| match c {
                Conn::Vm(vm) => {
                    let gone = match self.host.procfs.process(vm.cpu.process.id) {
                        Ok(p) => p.task != vm.cpu.process, // the pid names another process now
                        Err(e) => e.is_gone(),             // EMFILE and the like are not an exit
                    };
                    gone.then_some(*t)
                }
                _ => None,
            })
            .collect();
        for t in gone {
            self.drop_conn(t, "QEMU process exited");
        }
    }

    /// Re-reads the thread lists (of boosted VMs only, unless `all`) and brings threads that
    /// appeared since to the VM's level. For VMs at normal level this only updates what
    /// `cosched status` shows (QEMU names a thread a moment after creating it).
    fn refresh_threads(&mut self, all: bool) {
        let tokens: Vec<usize> = self
            .conns
            .iter()
            .filter_map(|(t, c)| matches!(c, Conn::Vm(vm) if all || vm.cpu.level() != Level::Normal).then_some(*t))
            .collect();
        for token in tokens {
            let Some(Conn::Vm(c)) = self.conns.get_mut(&token) else { continue };
            let out = c.cpu.refresh(&mut self.host);
            self.coord.set_vm_vcpus(c.id, c.cpu.vcpu_count());
            self.note_new_threads(token, out);
        }
    }

    /// Logs what bringing a VM's new threads to its level did, and counts its errors.
    fn note_new_threads(&mut self, token: usize, out: crate::actuator::Outcome) {
        let Some(Conn::Vm(c)) = self.conns.get_mut(&token) else { return };
        if out.changed > 0 {
            debug!("{}: boosted {} new thread(s)", c.cpu.name, out.changed);
        }
        if !out.errors.is_empty() {
            c.actuation_errors += out.errors.len() as u64;
            let msg = out.errors.join("; ");
            self.warn_vm(token, &msg);
        }
    }

    fn accept_control(&mut self) {
        loop {
            let (mut stream, _) = match self.control.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    warn!("control accept: {e}");
                    return;
                }
            };
            // Root only, whatever the socket's mode says.
            match peer_cred(stream.as_raw_fd()) {
                Ok((_, 0)) => {}
                Ok((pid, uid)) => {
                    warn!("control: refusing pid {pid} uid {uid} (root only)");
                    let _ = stream.write_all(b"{\"ok\":false,\"error\":\"root only\"}\n");
                    continue;
                }
                Err(e) => {
                    warn!("control: SO_PEERCRED: {e}");
                    continue;
                }
            }
            self.add_client(stream, Conn::Control);
        }
    }

    /// Registers a control or metrics client with the poller; beyond MAX_CLIENTS it is closed.
    fn add_client<S: Read + Write + mio::event::Source>(&mut self, mut stream: S, conn: fn(Client<S>) -> Conn) {
        let clients = self.conns.values().filter(|c| !matches!(c, Conn::Vm(_))).count();
        if clients >= MAX_CLIENTS {
            warn!("more than {MAX_CLIENTS} control/metrics clients at once: closing a new one");
            return;
        }
        let token = self.next_token;
        self.next_token += 1;
        if self.poll.registry().register(&mut stream, Token(token), Interest::READABLE).is_ok() {
            self.conns.insert(token, conn(Client::new(stream, self.now())));
        }
    }

    /// Closes control and metrics clients that have taken longer than CLIENT_TIMEOUT_NS.
    fn expire_clients(&mut self, now: u64) {
        let old: Vec<usize> = self
            .conns
            .iter()
            .filter_map(|(t, c)| {
                let since = match c {
                    Conn::Control(c) => c.since_ns,
                    Conn::Http(c) => c.since_ns,
                    Conn::Vm(_) => return None,
                };
                (now >= since + CLIENT_TIMEOUT_NS).then_some(*t)
            })
            .collect();
        for t in old {
            self.drop_conn(t, "client timed out");
        }
    }

    fn on_control(&mut self, token: usize) {
        let Some(Conn::Control(c)) = self.conns.get_mut(&token) else { return };
        if c.reply.is_empty() {
            if let Err(why) = read_available(&mut c.stream, &mut c.input) {
                return self.drop_conn(token, why);
            }
            let Some(nl) = c.input.iter().position(|b| *b == b'\n') else { return };
            let line = String::from_utf8_lossy(&c.input[..nl]).into_owned();
            let reply = match serde_json::from_str::<Request>(&line) {
                Ok(req) => self.handle(req),
                Err(e) => Reply::err(format!("bad request: {e}")),
            };
            let Some(Conn::Control(c)) = self.conns.get_mut(&token) else { return };
            c.reply = serde_json::to_vec(&reply).unwrap_or_default();
            c.reply.push(b'\n');
        }
        let Some(Conn::Control(c)) = self.conns.get_mut(&token) else { return };
        if c.send(&self.poll, token) {
            self.drop_conn(token, "control request done");
        }
    }

    fn accept_metrics(&mut self) {
        while let Some(Ok((stream, _))) = self.metrics.as_ref().map(|l| l.accept()) {
            let _ = stream.set_nodelay(true);
            self.add_client(stream, Conn::Http);
        }
    }

    fn on_http(&mut self, token: usize) {
        let Some(Conn::Http(c)) = self.conns.get_mut(&token) else { return };
        if c.reply.is_empty() {
            let closed = match read_available(&mut c.stream, &mut c.input) {
                Ok(closed) => closed,
                Err(why) => return self.drop_conn(token, why),
            };
            // Any request gets the metrics; answer once its headers are in.
            if !closed && !c.input.windows(4).any(|w| w == b"\r\n\r\n") {
                return;
            }
            let body = crate::metrics::render(&self.status());
            let Some(Conn::Http(c)) = self.conns.get_mut(&token) else { return };
            c.reply = format!(
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes();
        }
        let Some(Conn::Http(c)) = self.conns.get_mut(&token) else { return };
        if c.send(&self.poll, token) {
            self.drop_conn(token, "metrics served");
        }
    }

    /// Finds a VM by name or QEMU pid.
    fn find_vm(&self, key: &str) -> Result<VmId, String> {
        let pid: Option<i32> = key.parse().ok();
        self.conns
            .values()
            .find_map(|c| match c {
                Conn::Vm(vm) if vm.cpu.name == key || Some(vm.cpu.process.id) == pid => Some(vm.id),
                _ => None,
            })
            .ok_or_else(|| {
                let known: Vec<&str> = self
                    .conns
                    .values()
                    .filter_map(|c| if let Conn::Vm(vm) = c { Some(vm.cpu.name.as_str()) } else { None })
                    .collect();
                format!(
                    "no VM named {key:?} (connected: {})",
                    if known.is_empty() { "none".into() } else { known.join(", ") }
                )
            })
    }

    /// Runs an operator command on the VM named `key`; the settings it returns are kept for the
    /// VM's name, so they survive a reconnect.
    fn vm_command(
        &mut self,
        key: &str,
        actions: &mut Vec<Action>,
        f: impl FnOnce(&mut Self, VmId, &mut Vec<Action>) -> Result<VmSettings, String>,
    ) -> Reply {
        let id = match self.find_vm(key) {
            Ok(id) => id,
            Err(e) => return Reply::err(e),
        };
        match f(self, id, actions) {
            Ok(settings) => {
                let name = self.coord.vm(id).map(|v| v.name.clone()).unwrap_or_default();
                let off: Vec<&str> =
                    Resource::ALL.iter().filter(|r| !settings.enabled(**r)).map(|r| r.name()).collect();
                info!("operator: {name}: disabled resources [{}], priority {}", off.join(", "), settings.priority);
                self.settings.insert(name, settings);
                Reply::ok(None)
            }
            Err(e) => Reply::err(e),
        }
    }

    fn handle(&mut self, req: Request) -> Reply {
        let now = self.now();
        let mut actions = Vec::new();
        let reply = match req {
            Request::Status => Reply::ok(Some(self.status())),
            Request::Metrics => Reply::ok(Some(json!({ "text": crate::metrics::render(&self.status()) }))),
            Request::Enable { ref vm, ref resource } | Request::Disable { ref vm, ref resource } => {
                let on = matches!(req, Request::Enable { .. });
                let resource = match resource.as_deref().map(|n| self.resource_named(n)).transpose() {
                    Ok(r) => r,
                    Err(e) => return Reply::err(e),
                };
                let what = resource.map_or("every resource".to_string(), |r| r.name().to_string());
                match vm {
                    None => {
                        self.coord.set_enabled(resource, on, now, &mut actions);
                        info!("operator: {what} {} for the whole host", if on { "enabled" } else { "disabled" });
                        Reply::ok(None)
                    }
                    Some(key) => self.vm_command(key, &mut actions, |d, id, actions| {
                        d.coord.set_vm_enabled(id, resource, on, now, actions);
                        Ok(d.coord.vm(id).expect("found").settings)
                    }),
                }
            }
            Request::Priority { vm: ref key, priority } => {
                let ceiling = self.cfg.daemon_priority;
                let offset = self.cfg.boost.other_threads_priority_offset;
                if cosched_core::VM_PRIORITY.contains(&priority) && ceiling != 0 && priority + offset >= ceiling {
                    Reply::err(format!(
                        "priority {priority} would not stay below the daemon's own (daemon_priority = {ceiling})"
                    ))
                } else {
                    self.vm_command(key, &mut actions, |d, id, actions| {
                        d.coord.set_vm_priority(id, priority, actions)?;
                        Ok(d.coord.vm(id).expect("found").settings)
                    })
                }
            }
        };
        self.execute(actions, None);
        reply
    }

    /// A resource this host supports, by name.
    fn resource_named(&self, name: &str) -> Result<Resource, String> {
        let supported: Vec<&str> = self.coord.resources().map(|r| r.name()).collect();
        match Resource::from_name(name) {
            Some(r) if self.coord.resources().any(|s| s == r) => Ok(r),
            Some(r) => {
                Err(format!("{r} coordination is not supported by this daemon (supported: {})", supported.join(", ")))
            }
            None => Err(format!("unknown resource {name:?} (supported: {})", supported.join(", "))),
        }
    }

    fn status(&self) -> Value {
        let now = self.now();
        let policy = self.coord.policy();
        let vms: Vec<Value> = self
            .conns
            .values()
            .filter_map(|c| match c {
                Conn::Vm(c) => Some(c),
                _ => None,
            })
            .filter_map(|c| self.coord.vm(c.id).map(|vm| (c, vm)))
            .map(|(c, vm)| {
                let resources: serde_json::Map<String, Value> = vm
                    .slots
                    .iter()
                    .map(|(r, s)| {
                        // Every slot is of a resource the coordinator supports, so it has limits.
                        let limits = self.coord.limits(*r).copied().unwrap_or_else(|| policy.limits(*r));
                        let v = json!({
                            "enabled": vm.settings.enabled(*r),
                            "active": self.coord.enabled(*r) && vm.settings.enabled(*r),
                            "level": s.level.name(),
                            "wants": s.wants,
                            "granted": s.granted,
                            "boosted_for_ms": s.boosted_for_ns(now) as f64 / 1e6,
                            "boost_share_permille": s.boost_share_permille(now, &limits),
                            "in_cooldown": s.in_cooldown(now),
                            "counters": s.counters,
                        });
                        (r.name().to_string(), v)
                    })
                    .collect();
                json!({
                    "name": vm.name,
                    "pid": c.cpu.process.id,
                    "socket": c.path,
                    "agent": c.stream.is_some(),
                    "priority": vm.settings.priority,
                    "vcpus": vm.vcpus,
                    "registered": vm.registered.is_some(),
                    "caps": cosched_proto::caps::names(vm.registered.unwrap_or(0)),
                    "counters": vm.counters,
                    "resources": resources,
                    "actuation_errors": c.actuation_errors,
                    "dropped_replies": c.dropped_replies,
                    "latency": c.latency.summary(),
                    "latency_histogram": c.latency.histogram(),
                    "threads": c.cpu.threads(),
                })
            })
            .collect();
        let resources: serde_json::Map<String, Value> = self
            .coord
            .resources()
            .map(|r| {
                let mut v = json!({
                    "enabled": self.coord.enabled(r),
                    "limits": self.coord.limits(r),
                });
                for (k, n) in self.coord.figures(r) {
                    v[k] = json!(n);
                }
                (r.name().to_string(), v)
            })
            .collect();
        let pending: Vec<Value> = self.attempts.keys().map(|p| json!(p)).collect();
        json!({
            "daemon": {
                "pid": std::process::id(),
                "uptime_s": now as f64 / 1e9,
                "socket_dir": self.cfg.socket_dir,
                "state_dir": self.cfg.state_dir,
                "metrics_addr": self.metrics.as_ref().and_then(|l| l.local_addr().ok()).map(|a| a.to_string()),
                "thread_events": self.thread_watch.as_ref().map(|w| w.mechanism()),
                "cost": self.cost,
            },
            "resources": resources,
            "policy": policy,
            "boost": self.cfg.boost,
            "latency": self.latency.summary(),
            "vms": vms,
            "unconnected_sockets": pending,
        })
    }
}

/// `cosched restore`: puts back every thread recorded in `state_dir`, unless a daemon runs.
pub fn restore_command(state_dir: &Path) -> anyhow::Result<crate::store::RestoreReport> {
    if !state_dir.exists() {
        return Ok(Default::default());
    }
    let store = StateDir::open(state_dir)?;
    let _lock = lock_state_dir(&store)?;
    Ok(restore_all(&store, &ProcFs::default(), &mut RealSched)?)
}
