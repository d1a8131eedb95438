//! Test helper: a process that poses as a QEMU VM for the root integration tests.
//!
//! Copied to a file named `qemu-system-x86_64` (the daemon only talks to QEMU processes), it
//! starts real threads named like QEMU's (`CPU 0/TCG`, `IO iothread0`, `worker`), listens on
//! a unix socket like QEMU's chardev (`server=on,wait=off`), and relays bytes between the
//! daemon's connection and its stdin/stdout, so a test plays the guest through the pipes.
//! SIGUSR1 starts one more `worker` thread, SIGUSR2 renames each `CPU ...` thread `renamed`
//! (from another thread, through `/proc/self/task/TID/comm`: one frozen cannot rename itself);
//! the process exits when stdin closes. With
//! `--listen-fd N` it uses an inherited listening socket, as QEMU does under libvirt.
//! For event boosting: `--busy NAME` is a thread that spins without pause (a vCPU running a
//! CPU hog in its guest), and `--event-socket PATH` an `IO event0` thread that blocks reading a
//! unix datagram socket bound at PATH (a device: a test's datagram wakes it) and busy-works
//! 50 µs per datagram, as QEMU's main loop hands a packet to its guest. `--tap NAME` moves the
//! process to a network namespace of its own first and opens a tap device NAME there through
//! `/dev/net/tun` (up, never read: a main loop too busy to sleep), held until it exits, which
//! removes both.
//!
//! With `--drive HZ` it is its own guest instead (for the daemon scale experiment): once the
//! daemon connects it registers, then sends `CPU 1` and `CPU 0` alternately, HZ frames a second,
//! until killed or its stdin closes, all from its main thread (no reader thread: a process with
//! the `--thread`s and its main thread only). It times each frame from its write to the reply
//! (ACK or DENY with its seq) read. Commands on stdin, one a line: `mark` starts a
//! measurement window (counters and samples from zero), `stop` stops sending (the connection
//! stays), `report` prints one JSON line on stdout: `{"sent": N, "acked": N, "denied": N,
//! "unanswered": N, "window_s": S, "rtt_us": [...]}` over the frames sent since `mark`, S being
//! the time from `mark` to `stop` by its own clock. In this mode its idle
//! threads block (as a real QEMU's idle threads do) instead of waking every 5 ms, and there is no
//! SIGUSR1 thread (256 synthetic VMs would otherwise wake 230 000 times a second between them).

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static SPAWN: AtomicBool = AtomicBool::new(false);
static RENAME: AtomicBool = AtomicBool::new(false);

extern "C" fn on_usr1(_: libc::c_int) {
    SPAWN.store(true, Ordering::Relaxed);
}

extern "C" fn on_usr2(_: libc::c_int) {
    RENAME.store(true, Ordering::Relaxed);
}

/// Renames each thread of this process whose name starts `CPU ` to `renamed`.
fn rename_vcpus() {
    for e in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let comm = e.path().join("comm");
        if std::fs::read_to_string(&comm).is_ok_and(|c| c.starts_with("CPU ")) {
            let _ = std::fs::write(&comm, "renamed");
        }
    }
}

fn named_thread(name: String, spin: bool) {
    named_thread_idle(name, spin, false)
}

/// `block`: an idle thread that never wakes (parked) rather than one that sleeps 5 ms at a time.
fn named_thread_idle(name: String, spin: bool, block: bool) {
    std::thread::spawn(move || {
        let c = std::ffi::CString::new(name).unwrap();
        // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
        unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr()) };
        loop {
            if block && !spin {
                std::thread::park();
                continue;
            }
            if spin {
                let t = std::time::Instant::now();
                while t.elapsed() < Duration::from_millis(5) {
                    std::hint::spin_loop();
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
}

fn set_name(name: &str) {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr()) };
}

/// A thread that never sleeps.
fn busy_thread(name: String) {
    std::thread::spawn(move || {
        set_name(&name);
        loop {
            std::hint::spin_loop();
        }
    });
}

/// `IO event0`: blocks on a datagram socket at `path`; 50 µs of work per datagram.
fn event_thread(path: String) {
    let _ = std::fs::remove_file(&path);
    let sock = std::os::unix::net::UnixDatagram::bind(&path).expect("--event-socket: bind");
    std::thread::spawn(move || {
        set_name("IO event0");
        let mut buf = [0u8; 64];
        while sock.recv(&mut buf).is_ok() {
            let t = std::time::Instant::now();
            while t.elapsed() < Duration::from_micros(50) {
                std::hint::spin_loop();
            }
        }
    });
}

const TUNSETIFF: libc::c_ulong = 0x400454ca;

/// `struct ifreq` with a name and flags.
fn ifreq(name: &str, flags: i16) -> [u8; 40] {
    let mut r = [0u8; 40];
    r[..name.len()].copy_from_slice(name.as_bytes());
    r[16..18].copy_from_slice(&flags.to_ne_bytes());
    r
}

/// A new network namespace for this (still single-threaded) process, and tap `name` in it, up;
/// its fd stays open (leaked) for the life of the process.
fn open_tap(name: &str) {
    let err = || std::io::Error::last_os_error();
    assert!(name.len() < 16, "--tap: name too long");
    // SAFETY: plain system calls on buffers owned here; every result is checked.
    unsafe {
        assert_eq!(libc::unshare(libc::CLONE_NEWNET), 0, "--tap: unshare: {}", err());
        let fd = libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        assert!(fd >= 0, "--tap: /dev/net/tun: {}", err());
        let mut r = ifreq(name, (libc::IFF_TAP | libc::IFF_NO_PI) as i16);
        assert_eq!(libc::ioctl(fd, TUNSETIFF, r.as_mut_ptr()), 0, "--tap: TUNSETIFF: {}", err());
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        let mut up = ifreq(name, (libc::IFF_UP | libc::IFF_RUNNING) as i16);
        assert_eq!(libc::ioctl(s, libc::SIOCSIFFLAGS, up.as_mut_ptr()), 0, "--tap: up: {}", err());
        libc::close(s);
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut socket = None;
    let mut listen_fd = None;
    let mut drive_hz: Option<u32> = None;
    let mut threads = Vec::new();
    let mut busy = Vec::new();
    let mut event_socket = None;
    let mut tap = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--socket" => socket = args.next(),
            // QEMU's VM name: ignored here, the daemon reads it from /proc/<pid>/cmdline.
            "-name" => {
                args.next();
            }
            // Like QEMU under libvirt (`-chardev socket,fd=N`): the listening socket is inherited.
            "--listen-fd" => listen_fd = args.next().map(|n| n.parse::<i32>().expect("--listen-fd N")),
            "--thread" => threads.push((args.next().expect("--thread NAME"), false)),
            "--drive" => drive_hz = args.next().and_then(|n| n.parse().ok()),
            "--spin" => threads.push((args.next().expect("--spin NAME"), true)),
            "--busy" => busy.push(args.next().expect("--busy NAME")),
            "--event-socket" => event_socket = args.next(),
            "--tap" => tap = args.next(),
            other => panic!("unknown argument {other}"),
        }
    }
    let socket = socket.expect("--socket PATH");
    if let Some(name) = tap {
        open_tap(&name);
    }
    for (name, spin) in threads {
        named_thread_idle(name, spin, drive_hz.is_some());
    }
    for name in busy {
        busy_thread(name);
    }
    if let Some(path) = event_socket {
        event_thread(path);
    }
    if let Some(hz) = drive_hz {
        let listener = listen(&socket, listen_fd);
        drive(listener, hz);
    }
    // SAFETY: installing an async-signal-safe handler that only stores to an atomic.
    unsafe { libc::signal(libc::SIGUSR1, on_usr1 as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    // SAFETY: the same, for SIGUSR2.
    unsafe { libc::signal(libc::SIGUSR2, on_usr2 as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    std::thread::spawn(|| loop {
        if SPAWN.swap(false, Ordering::Relaxed) {
            named_thread("worker".into(), false);
        }
        if RENAME.swap(false, Ordering::Relaxed) {
            rename_vcpus();
        }
        std::thread::sleep(Duration::from_millis(2));
    });

    let listener = listen(&socket, listen_fd);
    std::thread::spawn(move || {
        // Like QEMU's chardev: one client at a time, the next one after it leaves.
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let mut from_daemon = conn.try_clone().unwrap();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut out = std::io::stdout();
                while let Ok(n) = from_daemon.read(&mut buf) {
                    if n == 0 || out.write_all(&buf[..n]).and_then(|_| out.flush()).is_err() {
                        break;
                    }
                }
            });
            *CURRENT.lock().unwrap() = Some(conn);
        }
    });
    // stdin -> current connection
    let mut buf = [0u8; 4096];
    let mut stdin = std::io::stdin();
    loop {
        let n = stdin.read(&mut buf).unwrap_or(0);
        if n == 0 {
            break;
        }
        // Wait (briefly) for the daemon to connect if it has not yet, or to connect again: a
        // write to the connection of a daemon that is gone fails (EPIPE), and the bytes go to the
        // next one, not nowhere (a test that restarts the daemon writes as soon as the new one
        // lists the VM, which can be before this accepts its connection).
        for _ in 0..500 {
            let mut current = CURRENT.lock().unwrap();
            if let Some(c) = current.as_mut() {
                if c.write_all(&buf[..n]).is_ok() {
                    break;
                }
                *current = None;
            }
            drop(current);
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let _ = std::fs::remove_file(&socket);
}

static CURRENT: std::sync::Mutex<Option<std::os::unix::net::UnixStream>> = std::sync::Mutex::new(None);

fn listen(socket: &str, listen_fd: Option<i32>) -> UnixListener {
    let listener = match listen_fd {
        // SAFETY: the fd was handed to us by our parent for exactly this purpose.
        Some(fd) => unsafe { <UnixListener as std::os::fd::FromRawFd>::from_raw_fd(fd) },
        None => {
            let _ = std::fs::remove_file(socket);
            UnixListener::bind(socket).expect("bind")
        }
    };
    eprintln!("fake-qemu: listening on {socket} (pid {})", std::process::id());
    listener
}

/// What `--drive` measures: frames sent since `mark` and what became of them.
#[derive(Default)]
struct DriveStats {
    /// Sent, not yet answered: seq -> (sent at, sent since mark).
    pending: std::collections::HashMap<u32, (std::time::Instant, bool)>,
    sent: u64,
    acked: u64,
    denied: u64,
    rtt_ns: Vec<u64>,
    /// When `mark` and `stop` came, by this process's clock: the window the counts are over.
    marked: Option<std::time::Instant>,
    stopped_at: Option<std::time::Instant>,
}

impl DriveStats {
    /// One command line from stdin; the answer to print, if any.
    fn command(&mut self, cmd: &str, stopped: &mut bool) -> Option<String> {
        match cmd {
            "mark" => {
                self.sent = 0;
                self.acked = 0;
                self.denied = 0;
                self.rtt_ns.clear();
                for v in self.pending.values_mut() {
                    v.1 = false;
                }
                self.marked = Some(std::time::Instant::now());
                self.stopped_at = None;
            }
            "stop" => {
                *stopped = true;
                self.stopped_at.get_or_insert_with(std::time::Instant::now);
            }
            "report" => {
                let unanswered = self.pending.values().filter(|v| v.1).count();
                let rtt: Vec<String> = self.rtt_ns.iter().map(|n| format!("{:.1}", *n as f64 / 1e3)).collect();
                // The window the counts are over: from `mark` to `stop` (or to now), by this
                // process's own clock, so that sent / window_s is the rate this VM really asked.
                let window_s = match self.marked {
                    Some(m) => self.stopped_at.unwrap_or_else(std::time::Instant::now).duration_since(m).as_secs_f64(),
                    None => 0.0,
                };
                return Some(format!(
                    "{{\"sent\": {}, \"acked\": {}, \"denied\": {}, \"unanswered\": {unanswered}, \"window_s\": {window_s:.6}, \"rtt_us\": [{}]}}\n",
                    self.sent,
                    self.acked,
                    self.denied,
                    rtt.join(",")
                ));
            }
            _ => {}
        }
        None
    }

    /// Replies read at `now`: ACKs and DENYs answer the frame with their seq.
    fn replies(&mut self, bytes: &[u8], now: std::time::Instant) {
        use cosched_proto::{Frame, Kind};
        for f in bytes.chunks_exact(16) {
            let Ok(f) = Frame::decode(f.try_into().unwrap()) else { continue };
            if !matches!(f.kind, Kind::Ack | Kind::Deny) {
                continue;
            }
            let Some((sent, in_window)) = self.pending.remove(&f.seq) else { continue };
            if !in_window {
                continue;
            }
            if f.kind == Kind::Ack {
                self.acked += 1;
                self.rtt_ns.push(now.duration_since(sent).as_nanos() as u64);
            } else {
                self.denied += 1;
            }
        }
    }
}

/// Plays the guest: register, then alternate CPU 1 / CPU 0 at `hz` frames a second. One thread
/// (the main one, as a guest's frames come through QEMU's main loop): it sends on time, reads
/// the replies as they come (poll) and the experiment's commands from stdin.
fn drive(listener: UnixListener, hz: u32) -> ! {
    use cosched_proto::{caps, Frame};
    use std::os::fd::AsRawFd;
    use std::time::Instant;
    let (mut conn, _) = listener.accept().expect("accept");
    drop(listener);
    conn.write_all(&Frame::register(1, caps::CPU).encode()).expect("register");
    conn.set_nonblocking(true).expect("non-blocking");
    let mut stats = DriveStats::default();
    let mut stopped = false;
    let (mut have, mut cmds) = (Vec::new(), Vec::new());
    let mut buf = [0u8; 4096];
    let period = Duration::from_secs(1) / hz.max(1);
    let mut next = Instant::now() + period;
    let mut seq = 2u32;
    loop {
        let wait = next.saturating_duration_since(Instant::now());
        let mut fds = [
            libc::pollfd { fd: conn.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: 0, events: libc::POLLIN, revents: 0 },
        ];
        let ts =
            libc::timespec { tv_sec: wait.as_secs() as libc::time_t, tv_nsec: wait.subsec_nanos() as libc::c_long };
        // SAFETY: ppoll on two pollfds we own, with a timeout we own.
        let n = unsafe { libc::ppoll(fds.as_mut_ptr(), 2, &ts, std::ptr::null()) };
        if n > 0 && fds[0].revents != 0 {
            let now = Instant::now();
            loop {
                match conn.read(&mut buf) {
                    Ok(0) => std::process::exit(0),
                    Ok(k) => have.extend_from_slice(&buf[..k]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => std::process::exit(0),
                }
            }
            let whole = have.len() / 16 * 16;
            stats.replies(&have[..whole], now);
            have.drain(..whole);
        }
        if n > 0 && fds[1].revents != 0 {
            // SAFETY: read from stdin into our buffer.
            let k = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
            if k <= 0 {
                std::process::exit(0); // the experiment has gone
            }
            cmds.extend_from_slice(&buf[..k as usize]);
            while let Some(nl) = cmds.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = cmds.drain(..=nl).collect();
                let cmd = String::from_utf8_lossy(&line).trim().to_string();
                if let Some(out) = stats.command(&cmd, &mut stopped) {
                    let mut o = std::io::stdout();
                    let _ = o.write_all(out.as_bytes()).and_then(|_| o.flush());
                }
            }
        }
        if Instant::now() < next {
            continue;
        }
        next += period;
        if stopped {
            continue;
        }
        stats.sent += 1;
        stats.pending.insert(seq, (Instant::now(), true));
        if stats.pending.len() > 100_000 {
            // Never answered: no longer counted.
            stats.pending.retain(|&q, _| seq.wrapping_sub(q) < 50_000);
        }
        if conn.write_all(&Frame::cpu(seq, seq & 1 == 0).encode()).is_err() {
            std::process::exit(0);
        }
        seq = seq.wrapping_add(1);
    }
}
