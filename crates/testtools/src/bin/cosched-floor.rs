//! The floor under the host daemon's cost per transition (for the `scale` experiment): the
//! system calls a transition cannot avoid, done bare, the way the daemon does them, and timed.
//!
//! A *transition* is what the daemon does for one guest `CPU 1` / `CPU 0` frame: `epoll_wait`
//! wakes it, one non-blocking `read` takes the 16-byte frame, one `sched_setattr` per VM thread
//! (`SCHED_RR 1 | RESET_ON_FORK` to boost, `SCHED_OTHER` to deboost) and one 16-byte `write` for
//! the reply. Here the measuring side is this process's main thread (at `SCHED_FIFO 99` like the
//! daemon unless `--priority 0`); the other end of a unix socketpair is a child process shaped
//! like a synthetic VM (`cosched-fake-qemu`): its main thread sends the frames (alternately boost
//! and deboost) and waits for each reply, and two more threads named `CPU 0/TCG` and `call_rcu`
//! sleep. The three threads of that child are the ones changed, unless `--tids` names others.
//!
//! Two passes over the same socket and threads, after `--warmup` transitions: the first
//! (`--transitions`) with nothing but the calls between two `getrusage(RUSAGE_THREAD)`: the CPU
//! time (user + system) per transition. The second (as many transitions) reads the thread's CPU
//! clock (`CLOCK_THREAD_CPUTIME_ID`; `getrusage` only advances at ticks and context switches)
//! between the calls to split the time into read (`epoll_wait` + `read`, with the wake-up and
//! context switch they include), `sched_setattr` and `write`; the cost of one clock read (timed
//! alone, `probe_us`) is taken off each part. The child times each frame's round trip (write to
//! reply read, CLOCK_MONOTONIC) for the wall numbers.
//!
//! Placement: by default the scheduler places both sides; `--same-cpu` pins both to one CPU,
//! `--cross-cpu` to two different ones (`--cpus A,B`: the measuring side on A, the sender on B;
//! default the first and last allowed CPUs).
//!
//! Prints one JSON object on stdout. Every thread it changed is put back before it exits: its
//! own threads to `SCHED_OTHER`, `--tids` threads to the attributes they had (which must be
//! `SCHED_OTHER`, and of a process whose executable is named `qemu-system-*` or
//! `cosched-fake-qemu`, such as the experiment's synthetic VMs: it refuses others).

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const SCHED_OTHER: u32 = 0;
const SCHED_FIFO: u32 = 1;
const SCHED_RR: u32 = 2;
const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;
const SCHED_ATTR_SIZE_VER0: u32 = 48;

/// `struct sched_attr` (VER0), as the daemon passes it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

impl SchedAttr {
    fn new(policy: u32, priority: u32, nice: i32, flags: u64) -> SchedAttr {
        SchedAttr { size: SCHED_ATTR_SIZE_VER0, policy, priority, nice, flags, ..Default::default() }
    }
}

fn sched_set(tid: i32, a: &SchedAttr) -> io::Result<()> {
    // SAFETY: sched_setattr reads a sched_attr of a.size bytes.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, tid, a as *const SchedAttr, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn sched_get(tid: i32) -> io::Result<SchedAttr> {
    let mut a = SchedAttr { size: SCHED_ATTR_SIZE_VER0, ..Default::default() };
    // SAFETY: sched_getattr writes at most SCHED_ATTR_SIZE_VER0 bytes into `a`.
    let rc = unsafe { libc::syscall(libc::SYS_sched_getattr, tid, &mut a as *mut SchedAttr, SCHED_ATTR_SIZE_VER0, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // What sched_getattr reports for a fair thread's slice must not be passed back.
    if a.policy != SCHED_FIFO && a.policy != SCHED_RR {
        a.runtime = 0;
        a.deadline = 0;
        a.period = 0;
    }
    Ok(a)
}

fn gettid() -> i32 {
    // SAFETY: no arguments.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

fn pin(tid: i32, cpu: usize) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t with one bit set, passed with its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity fills the zeroed set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![0];
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// This thread's CPU time so far (user + system), in ns (`getrusage` has µs resolution).
#[inline(always)]
fn thread_cpu_ns() -> (u64, u64) {
    // SAFETY: rusage is plain data, valid all-zero.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct we pass.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    (us(ru.ru_utime), us(ru.ru_stime))
}

/// This thread's CPU time so far, in ns, up to date (`getrusage` only sees the time up to the
/// last tick or context switch, too coarse to split a transition; this clock reads the runtime
/// of the running thread as of now).
#[inline(always)]
fn cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime fills `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

#[derive(Clone, Copy, PartialEq)]
enum Placement {
    Free,
    Same,
    Cross,
}

struct Args {
    transitions: u64,
    warmup: u64,
    placement: Placement,
    cpus: Option<(usize, usize)>,
    tids: Vec<i32>,
    priority: u32,
    hz: u32,
}

fn usage() -> ! {
    eprintln!(
        "usage: cosched-floor [--transitions N (5000)] [--warmup N (500)] [--same-cpu | --cross-cpu] \
         [--cpus A,B] [--tids T1,T2,...] [--priority P (99; 0 = SCHED_OTHER)] [--hz H (0 = ping-pong)]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        transitions: 5000,
        warmup: 500,
        placement: Placement::Free,
        cpus: None,
        tids: Vec::new(),
        priority: 99,
        hz: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--transitions" => a.transitions = val().parse().unwrap_or_else(|_| usage()),
            "--warmup" => a.warmup = val().parse().unwrap_or_else(|_| usage()),
            "--same-cpu" => a.placement = Placement::Same,
            "--cross-cpu" => a.placement = Placement::Cross,
            "--cpus" => {
                let v = val();
                let (x, y) = v.split_once(',').unwrap_or_else(|| usage());
                a.cpus = Some((x.parse().unwrap_or_else(|_| usage()), y.parse().unwrap_or_else(|_| usage())));
            }
            "--tids" => {
                a.tids = val().split(',').map(|t| t.parse().unwrap_or_else(|_| usage())).collect();
            }
            "--priority" => a.priority = val().parse().unwrap_or_else(|_| usage()),
            "--hz" => a.hz = val().parse().unwrap_or_else(|_| usage()),
            "-h" | "--help" => usage(),
            _ => usage(),
        }
    }
    if a.transitions == 0 || a.priority > 99 {
        usage();
    }
    a
}

/// Percentiles of the child's round trips, per pass: (count, mean, p50, p99, max) in ns.
const PASSES: usize = 3;
const STAT_WORDS: usize = 5;

/// The sender: this process's main thread plus `CPU 0/TCG` and `call_rcu`, asleep.
/// Sends its three tids, then a frame, waits for the reply, and again, until the socket closes;
/// then writes the round-trip statistics (per pass, named by the reply's value) to `result`.
fn child(sock: OwnedFd, result: OwnedFd, cpu: Option<usize>, hz: u32) -> ! {
    // SAFETY: the parent may die by SIGKILL; this process must not outlive it.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    if let Some(c) = cpu {
        if let Err(e) = pin(0, c) {
            eprintln!("cosched-floor: pinning the sender to CPU {c}: {e}");
            std::process::exit(1);
        }
    }
    let mut tids = vec![gettid()];
    for name in ["CPU 0/TCG", "call_rcu"] {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let c = std::ffi::CString::new(name).unwrap();
            // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
            unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr()) };
            tx.send(gettid()).unwrap();
            loop {
                std::thread::park();
            }
        });
        tids.push(rx.recv().unwrap());
    }
    let mut s = std::os::unix::net::UnixStream::from(sock);
    let mut hello = Vec::new();
    for t in &tids {
        hello.extend_from_slice(&t.to_le_bytes());
    }
    s.write_all(&hello).expect("sending the tids");
    let mut rtt: [Vec<u64>; PASSES] = Default::default();
    let period = (hz > 0).then(|| Duration::from_secs(1) / hz);
    let mut next = Instant::now();
    let mut reply = [0u8; 16];
    for seq in 0u32.. {
        if let Some(p) = period {
            next += p;
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        let frame = cosched_proto::Frame::cpu(seq, seq & 1 == 0).encode();
        let t = Instant::now();
        if s.write_all(&frame).is_err() || s.read_exact(&mut reply).is_err() {
            break;
        }
        let ns = t.elapsed().as_nanos() as u64;
        let pass = (reply[8] as usize).min(PASSES - 1);
        rtt[pass].push(ns);
    }
    let mut out = Vec::new();
    for v in rtt.iter_mut() {
        v.sort_unstable();
        let n = v.len() as u64;
        let pct = |p: f64| if v.is_empty() { 0 } else { v[((v.len() - 1) as f64 * p).round() as usize] };
        let mean = v.iter().sum::<u64>().checked_div(n).unwrap_or(0);
        for w in [n, mean, pct(0.5), pct(0.99), v.last().copied().unwrap_or(0)] {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }
    let mut r = std::fs::File::from(result);
    let _ = r.write_all(&out);
    std::process::exit(0)
}

/// One pass's accumulated CPU time, in ns.
#[derive(Default)]
struct Split {
    read: u64,
    setattr: u64,
    write: u64,
}

struct Measurer {
    fd: i32,
    ep: i32,
    tids: Vec<i32>,
    boost: SchedAttr,
    deboost: SchedAttr,
    buf: [u8; 4096],
    reply: [u8; 16],
}

impl Measurer {
    /// Waits for a frame and reads it like the daemon (edge-triggered epoll, one non-blocking
    /// read). Returns whether it asks for a boost; None when the peer has gone.
    #[inline(always)]
    fn read_frame(&mut self) -> io::Result<bool> {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
        loop {
            // SAFETY: epoll_wait writes at most 8 events into `evs`.
            let n = unsafe { libc::epoll_wait(self.ep, evs.as_mut_ptr(), 8, -1) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted && !STOP.load(Ordering::Relaxed) {
                    continue;
                }
                return Err(e);
            }
            // SAFETY: read into our buffer of buf.len() bytes.
            let r = unsafe { libc::read(self.fd, self.buf.as_mut_ptr().cast(), self.buf.len()) };
            if r == 16 {
                return Ok(self.buf[8] != 0);
            }
            if r == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the sender closed the socket"));
            }
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock {
                    continue;
                }
                return Err(e);
            }
            return Err(io::Error::other(format!("read {r} bytes, expected one 16-byte frame")));
        }
    }

    #[inline(always)]
    fn set_all(&self, boost: bool) -> io::Result<()> {
        let a = if boost { &self.boost } else { &self.deboost };
        for &t in &self.tids {
            sched_set(t, a).map_err(|e| io::Error::new(e.kind(), format!("sched_setattr({t}): {e}")))?;
        }
        Ok(())
    }

    #[inline(always)]
    fn write_reply(&mut self, pass: u8) -> io::Result<()> {
        self.reply[8] = pass;
        // SAFETY: write 16 bytes from our buffer.
        let w = unsafe { libc::write(self.fd, self.reply.as_ptr().cast(), 16) };
        if w != 16 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Bare transitions; returns the CPU time (ns) and wall time they took.
    fn run_bare(&mut self, n: u64, pass: u8) -> io::Result<(u64, u64, Duration)> {
        let t = Instant::now();
        let (u0, s0) = thread_cpu_ns();
        for _ in 0..n {
            let boost = self.read_frame()?;
            self.set_all(boost)?;
            self.write_reply(pass)?;
            if STOP.load(Ordering::Relaxed) {
                return Err(io::Error::new(io::ErrorKind::Interrupted, "interrupted"));
            }
        }
        let (u1, s1) = thread_cpu_ns();
        Ok((u1 - u0, s1 - s0, t.elapsed()))
    }

    /// Transitions with the thread's CPU clock read between the calls.
    fn run_split(&mut self, n: u64, pass: u8) -> io::Result<Split> {
        let mut s = Split::default();
        let mut t0 = cpu_ns();
        for _ in 0..n {
            let boost = self.read_frame()?;
            let t1 = cpu_ns();
            self.set_all(boost)?;
            let t2 = cpu_ns();
            self.write_reply(pass)?;
            let t3 = cpu_ns();
            s.read += t1 - t0;
            s.setattr += t2 - t1;
            s.write += t3 - t2;
            t0 = t3;
            if STOP.load(Ordering::Relaxed) {
                return Err(io::Error::new(io::ErrorKind::Interrupted, "interrupted"));
            }
        }
        Ok(s)
    }
}

fn json_stats(w: &[u64]) -> String {
    let us = |ns: u64| ns as f64 / 1000.0;
    format!(
        "{{\"n\": {}, \"mean_us\": {:.2}, \"p50_us\": {:.2}, \"p99_us\": {:.2}, \"max_us\": {:.2}}}",
        w[0],
        us(w[1]),
        us(w[2]),
        us(w[3]),
        us(w[4])
    )
}

fn main() {
    let a = parse_args();
    if let Err(e) = run(&a) {
        eprintln!("cosched-floor: {e}");
        std::process::exit(1);
    }
}

fn run(a: &Args) -> io::Result<()> {
    // SAFETY: the handler only stores to an atomic; no SA_RESTART so epoll_wait returns EINTR.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaction(s, &sa, std::ptr::null_mut());
        }
    }
    let cpus = allowed_cpus();
    let (me_cpu, peer_cpu) = match a.placement {
        Placement::Free => (None, None),
        Placement::Same => {
            let c = a.cpus.map(|c| c.0).unwrap_or(cpus[0]);
            (Some(c), Some(c))
        }
        Placement::Cross => {
            let (x, y) = a.cpus.unwrap_or((cpus[0], *cpus.last().unwrap()));
            if x == y {
                return Err(io::Error::other("--cross-cpu needs two different CPUs"));
            }
            (Some(x), Some(y))
        }
    };
    // --tids: check them before anything changes.
    let mut originals = Vec::new();
    for &t in &a.tids {
        // Only a synthetic VM's threads (a `cosched-fake-qemu`, under its own name or copied to
        // `qemu-system-*`): never an arbitrary process's.
        let tgid = std::fs::read_to_string(format!("/proc/{t}/status"))
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Tgid:").map(|v| v.trim().to_string())))
            .ok_or_else(|| io::Error::other(format!("thread {t}: no such thread")))?;
        let exe = std::fs::read_link(format!("/proc/{tgid}/exe")).unwrap_or_default();
        let name = exe.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if tgid == "1" || !(name.starts_with("qemu-system-") || name.starts_with("cosched-fake-qemu")) {
            return Err(io::Error::other(format!(
                "thread {t} belongs to {} (pid {tgid}), not a synthetic VM (qemu-system-*, cosched-fake-qemu): not touching it",
                exe.display()
            )));
        }
        let attr = sched_get(t).map_err(|e| io::Error::new(e.kind(), format!("sched_getattr({t}): {e}")))?;
        if attr.policy != SCHED_OTHER {
            return Err(io::Error::other(format!(
                "thread {t} is not SCHED_OTHER (policy {}): not touching it",
                attr.policy
            )));
        }
        originals.push((t, attr));
    }

    let mut sv = [0i32; 2];
    let mut pipe = [0i32; 2];
    // SAFETY: plain fd-creating calls into local arrays.
    unsafe {
        if libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, sv.as_mut_ptr()) != 0
            || libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: fork while this process has one thread; the child only uses its own fds.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: closing the parent's ends, adopting ours.
        unsafe {
            libc::close(sv[0]);
            libc::close(pipe[0]);
            child(OwnedFd::from_raw_fd(sv[1]), OwnedFd::from_raw_fd(pipe[1]), peer_cpu, a.hz);
        }
    }
    // SAFETY: the parent's ends.
    let (sock, result) = unsafe {
        libc::close(sv[1]);
        libc::close(pipe[1]);
        (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(pipe[0]))
    };
    let me = gettid();
    let mut sock = std::os::unix::net::UnixStream::from(sock);
    let mut hello = [0u8; 12];
    sock.read_exact(&mut hello)?;
    let own: Vec<i32> = hello.chunks(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let tids = if a.tids.is_empty() { own.clone() } else { a.tids.clone() };
    if let Some(c) = me_cpu {
        pin(0, c)?;
    }
    let own_attr = sched_get(0)?;
    let mut changed_self = false;
    if a.priority > 0 {
        sched_set(0, &SchedAttr::new(SCHED_FIFO, a.priority, 0, SCHED_FLAG_RESET_ON_FORK))?;
        changed_self = true;
    }
    sock.set_nonblocking(true)?;
    let fd = sock.as_raw_fd();
    // SAFETY: a new epoll fd, owned below.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ep is ours.
    let _ep_owned = unsafe { OwnedFd::from_raw_fd(ep) };
    let mut ev = libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLET) as u32, u64: 0 };
    // SAFETY: registering our socket.
    if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut m = Measurer {
        fd,
        ep,
        tids: tids.clone(),
        boost: SchedAttr::new(SCHED_RR, 1, 0, SCHED_FLAG_RESET_ON_FORK),
        deboost: SchedAttr::new(SCHED_OTHER, 0, 0, 0),
        buf: [0; 4096],
        reply: cosched_proto::Frame::ack(0, 0).encode(),
    };

    // The cost of one clock read, to take off each timed part of the split pass.
    let probes = 20_000u64;
    let p0 = cpu_ns();
    for _ in 0..probes {
        std::hint::black_box(cpu_ns());
    }
    let probe_ns = (cpu_ns() - p0) as f64 / probes as f64;

    let outcome = (|| -> io::Result<_> {
        m.run_bare(a.warmup, 0)?;
        let bare = m.run_bare(a.transitions, 1)?;
        let split = m.run_split(a.transitions, 2)?;
        Ok((bare, split))
    })();

    // Put back every thread we changed, whatever happened.
    let mut restore_errors = Vec::new();
    if a.tids.is_empty() {
        for &t in &own {
            if let Err(e) = sched_set(t, &SchedAttr::new(SCHED_OTHER, 0, 0, 0)) {
                restore_errors.push(format!("{t}: {e}"));
            }
        }
    } else {
        for (t, attr) in &originals {
            if let Err(e) = sched_set(*t, attr) {
                if e.raw_os_error() != Some(libc::ESRCH) {
                    restore_errors.push(format!("{t}: {e}"));
                }
            }
        }
    }
    if changed_self {
        if let Err(e) = sched_set(0, &own_attr) {
            restore_errors.push(format!("{me}: {e}"));
        }
    }
    drop(_ep_owned);
    drop(sock); // the sender sees EOF and reports
    let mut words = Vec::new();
    std::fs::File::from(result).read_to_end(&mut words)?;
    let mut status = 0;
    // SAFETY: reaping our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if !restore_errors.is_empty() {
        return Err(io::Error::other(format!("could not restore: {}", restore_errors.join("; "))));
    }
    let ((user, sys, wall), split) = outcome?;
    let words: Vec<u64> = words.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
    if words.len() != PASSES * STAT_WORDS {
        return Err(io::Error::other("the sender did not report its round trips"));
    }

    let n = a.transitions as f64;
    let per = |ns: u64| ns as f64 / n / 1000.0;
    let probe_us = probe_ns / 1000.0;
    let fix = |ns: u64| (per(ns) - probe_us).max(0.0);
    let (r, s, w) = (fix(split.read), fix(split.setattr), fix(split.write));
    let calls = tids.len() as f64;
    let placement = match a.placement {
        Placement::Free => "unpinned",
        Placement::Same => "same-cpu",
        Placement::Cross => "cross-cpu",
    };
    let cpus_json = match (me_cpu, peer_cpu) {
        (Some(x), Some(y)) => format!("[{x}, {y}]"),
        _ => "null".into(),
    };
    let tids_json = tids.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ");
    println!(
        "{{\"placement\": \"{placement}\", \"cpus\": {cpus_json}, \"transitions\": {}, \"warmup\": {}, \
         \"hz\": {}, \"priority\": {}, \"threads\": [{tids_json}], \"threads_own\": {}, \
         \"cpu_us_per_transition\": {:.3}, \"user_us_per_transition\": {:.3}, \"sys_us_per_transition\": {:.3}, \
         \"wall_us_per_transition\": {:.3}, \
         \"split\": {{\"read_us\": {r:.3}, \"sched_setattr_us\": {s:.3}, \"sched_setattr_us_per_call\": {:.3}, \
         \"write_us\": {w:.3}, \"sum_us\": {:.3}, \"probe_us\": {probe_us:.3}}}, \
         \"rtt\": {}, \"rtt_split_pass\": {}, \"restored\": true}}",
        a.transitions,
        a.warmup,
        a.hz,
        a.priority,
        a.tids.is_empty(),
        per(user + sys),
        per(user),
        per(sys),
        wall.as_nanos() as f64 / n / 1000.0,
        s / calls,
        r + s + w,
        json_stats(&words[STAT_WORDS..2 * STAT_WORDS]),
        json_stats(&words[2 * STAT_WORDS..]),
    );
    Ok(())
}
