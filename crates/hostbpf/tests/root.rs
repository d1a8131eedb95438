//! Root tests on the real kernel: this test process forks a child that makes named threads on
//! command (a pipe byte), the child is watched, and the events are read the way the daemon reads
//! them (the ring buffer's fd in an edge-triggered mio poll).
//!
//! Needs root. Without root these tests say so and pass, unless `COSCHED_REQUIRE_ROOT=1` (set by
//! the project's test command and CI), which makes a missing root a failure.
//!
//! Latencies and costs are printed, not asserted: `cargo test --release -p cosched-hostbpf --
//! --nocapture` shows them.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use cosched_hostbpf::{Mechanism, ThreadEvent, ThreadWatch};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

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

const THREAD_NAME: &[u8] = b"hb-worker\0";
const BURST_THREADS: usize = 4000;

/// CLOCK_MONOTONIC in ns: shared by this process and the child.
fn now_ns() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec to a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

fn pipe() -> (RawFd, RawFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into a valid array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2");
    (fds[0], fds[1])
}

fn write_all(fd: RawFd, buf: &[u8]) {
    // SAFETY: writes from a valid buffer of that length.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    assert_eq!(n, buf.len() as isize, "write to a pipe");
}

/// Reads exactly `buf.len()` bytes (pipes of small records: one read each in practice).
fn read_exact(fd: RawFd, buf: &mut [u8]) -> bool {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reads into the unfilled tail of a valid buffer.
        let n = unsafe { libc::read(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        if n <= 0 {
            return false;
        }
        got += n as usize;
    }
    true
}

// ---- The child: only raw libc calls after fork (the test harness has other threads). ----

/// The two fds a waiting thread uses, in its pthread argument: report (high half), end (low).
fn thread_arg(report_w: RawFd, end_r: RawFd) -> *mut libc::c_void {
    (((report_w as u64) << 32) | end_r as u32 as u64) as usize as *mut libc::c_void
}

/// A thread made on 'c': names itself, reports {tid, time before naming}, waits for an end byte.
extern "C" fn waiting_thread(arg: *mut libc::c_void) -> *mut libc::c_void {
    let (report_w, end_r) = ((arg as usize as u64 >> 32) as RawFd, arg as usize as u64 as u32 as RawFd);
    let t_rename = now_ns();
    // SAFETY: PR_SET_NAME reads a NUL-terminated string.
    unsafe { libc::prctl(libc::PR_SET_NAME, THREAD_NAME.as_ptr()) };
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    let mut rec = [0u8; 12];
    rec[..4].copy_from_slice(&tid.to_ne_bytes());
    rec[4..].copy_from_slice(&t_rename.to_ne_bytes());
    // SAFETY: writes from a valid buffer; the fds live as long as the child.
    unsafe {
        libc::write(report_w, rec.as_ptr().cast(), rec.len());
        let mut b = 0u8;
        libc::read(end_r, (&mut b as *mut u8).cast(), 1);
    }
    std::ptr::null_mut()
}

/// A thread of a burst: names itself and ends.
extern "C" fn short_thread(_: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string.
    unsafe { libc::prctl(libc::PR_SET_NAME, THREAD_NAME.as_ptr()) };
    std::ptr::null_mut()
}

/// The child's main loop: 'c' makes a waiting thread (after reporting the time just before
/// pthread_create), 'b' makes and joins BURST_THREADS short threads then reports 'd', 'q' exits.
fn child_main(cmd_r: RawFd, report_w: RawFd, end_r: RawFd) -> ! {
    loop {
        let mut b = 0u8;
        // SAFETY: reads one byte into a valid buffer.
        if unsafe { libc::read(cmd_r, (&mut b as *mut u8).cast(), 1) } != 1 {
            b = b'q';
        }
        // SAFETY: plain libc calls on valid buffers and fds; pthread_t out-pointers are valid.
        unsafe {
            match b {
                b'c' => {
                    let t = now_ns().to_ne_bytes();
                    libc::write(report_w, t.as_ptr().cast(), t.len());
                    let mut th: libc::pthread_t = 0;
                    if libc::pthread_create(&mut th, std::ptr::null(), waiting_thread, thread_arg(report_w, end_r)) == 0
                    {
                        libc::pthread_detach(th);
                    }
                }
                b'b' => {
                    for _ in 0..BURST_THREADS {
                        let mut th: libc::pthread_t = 0;
                        if libc::pthread_create(&mut th, std::ptr::null(), short_thread, std::ptr::null_mut()) == 0 {
                            libc::pthread_join(th, std::ptr::null_mut());
                        }
                    }
                    libc::write(report_w, b"d".as_ptr().cast(), 1);
                }
                _ => libc::_exit(0),
            }
        }
    }
}

/// The forked child and the pipes to it.
struct Child {
    pid: i32,
    cmd_w: RawFd,
    report_r: RawFd,
    end_w: RawFd,
}

impl Child {
    fn spawn() -> Child {
        let (cmd_r, cmd_w) = pipe();
        let (report_r, report_w) = pipe();
        let (end_r, end_w) = pipe();
        // SAFETY: the child runs only child_main: raw libc calls (read, write, prctl,
        // clock_gettime, pthread_create/join/detach, which glibc supports after fork) and never
        // returns into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            child_main(cmd_r, report_w, end_r);
        }
        // SAFETY: closing the child's ends of the pipes in this process.
        unsafe {
            libc::close(cmd_r);
            libc::close(report_w);
            libc::close(end_r);
        }
        Child { pid, cmd_w, report_r, end_w }
    }

    /// Asks for a waiting thread.
    fn make_thread(&self) {
        write_all(self.cmd_w, b"c");
    }

    /// The time just before the child's pthread_create for the last make_thread.
    fn creation_report(&self) -> i64 {
        let mut t = [0u8; 8];
        assert!(read_exact(self.report_r, &mut t), "child report");
        i64::from_ne_bytes(t)
    }

    /// The waiting thread's report: its tid and the time just before it named itself.
    fn thread_report(&self) -> (i32, i64) {
        let mut rec = [0u8; 12];
        assert!(read_exact(self.report_r, &mut rec), "thread report");
        (i32::from_ne_bytes(rec[..4].try_into().unwrap()), i64::from_ne_bytes(rec[4..].try_into().unwrap()))
    }

    /// Ends one waiting thread.
    fn end_thread(&self) {
        write_all(self.end_w, b"e");
    }

    fn burst(&self) {
        write_all(self.cmd_w, b"b");
        let mut d = [0u8; 1];
        assert!(read_exact(self.report_r, &mut d) && d[0] == b'd', "burst done");
    }

    /// Ends the child and reaps it.
    fn quit(&mut self) {
        if self.pid > 0 {
            write_all(self.cmd_w, b"q");
            let mut status = 0;
            // SAFETY: waits for our own child.
            unsafe { libc::waitpid(self.pid, &mut status, 0) };
            self.pid = 0;
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // SAFETY: kills and reaps our own child (if still there), closes our fds.
        unsafe {
            if self.pid > 0 {
                libc::kill(self.pid, libc::SIGKILL);
                libc::waitpid(self.pid, std::ptr::null_mut(), 0);
            }
            libc::close(self.cmd_w);
            libc::close(self.report_r);
            libc::close(self.end_w);
        }
    }
}

// ---- Reading events the way the daemon does. ----

struct Reader {
    poll: Poll,
    events: Events,
    /// Each event with the CLOCK_MONOTONIC time its drain returned.
    got: Vec<(ThreadEvent, i64)>,
    drain_ns: Vec<(u64, usize)>,
}

impl Reader {
    fn new(w: &ThreadWatch) -> Reader {
        let poll = Poll::new().expect("mio poll");
        poll.registry().register(&mut SourceFd(&w.fd()), Token(0), Interest::READABLE).expect("register fd");
        Reader { poll, events: Events::with_capacity(8), got: Vec::new(), drain_ns: Vec::new() }
    }

    /// Waits on the fd and drains until `done(all events so far)` or the timeout.
    fn until(&mut self, w: &mut ThreadWatch, timeout: Duration, done: impl Fn(&[(ThreadEvent, i64)]) -> bool) -> bool {
        let end = Instant::now() + timeout;
        let mut out = Vec::new();
        while !done(&self.got) {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.poll.poll(&mut self.events, Some(left)).expect("poll");
            let t0 = now_ns();
            w.drain(&mut out);
            let t1 = now_ns();
            if !out.is_empty() {
                self.drain_ns.push(((t1 - t0) as u64, out.len()));
            }
            self.got.extend(out.drain(..).map(|e| (e, t1)));
        }
        true
    }

    /// What arrives within `wait` (no condition).
    fn settle(&mut self, w: &mut ThreadWatch, wait: Duration) {
        self.until(w, wait, |_| false);
    }
}

fn find(got: &[(ThreadEvent, i64)], want: &ThreadEvent) -> Option<(usize, i64)> {
    got.iter().position(|(e, _)| e == want).map(|i| (i, got[i].1))
}

fn stats(name: &str, mut v: Vec<i64>) {
    v.sort_unstable();
    let us = |ns: i64| ns as f64 / 1000.0;
    eprintln!("  {name}: median {:.1} µs, max {:.1} µs (n = {})", us(v[v.len() / 2]), us(v[v.len() - 1]), v.len());
}

/// The mechanisms that load here (each refused one is printed).
fn loadable() -> Vec<Mechanism> {
    Mechanism::ALL
        .into_iter()
        .filter(|&m| match ThreadWatch::open_with(&[m]) {
            Ok(_) => true,
            Err(e) => {
                eprintln!("{m}: not available here: {e}");
                false
            }
        })
        .collect()
}

#[test]
fn open_picks_the_best_mechanism_that_loads() {
    if !have_root() {
        return;
    }
    let w = ThreadWatch::open().unwrap_or_else(|e| panic!("{e}"));
    let first = loadable()[0];
    assert_eq!(w.mechanism(), first.name());
    eprintln!("ThreadWatch::open() attached with {}", w.mechanism());
}

#[test]
fn a_watched_childs_threads_are_created_renamed_and_exit() {
    if !have_root() {
        return;
    }
    const CYCLES: usize = 20;
    for m in loadable() {
        let mut w = ThreadWatch::open_with(&[m]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.mechanism(), m.name());
        let mut r = Reader::new(&w);
        let mut child = Child::spawn();
        w.watch(child.pid).expect("watch");
        let (mut created, mut renamed, mut exited) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..CYCLES {
            r.got.clear();
            // Wait for the events the way the daemon would, while the thread is being made;
            // read what the child says only then.
            child.make_thread();
            let tgid = child.pid;
            assert!(
                r.until(&mut w, Duration::from_secs(5), |g| {
                    g.iter().any(|(e, _)| matches!(e, ThreadEvent::Created { .. }))
                        && g.iter().any(|(e, _)| matches!(e, ThreadEvent::Renamed { .. }))
                }),
                "{m}: no Created + Renamed: {:?}",
                r.got
            );
            let t_create = child.creation_report();
            let (tid, t_rename) = child.thread_report();
            let c = ThreadEvent::Created { tgid, tid };
            let n = ThreadEvent::Renamed { tgid, tid, comm: "hb-worker".to_string() };
            assert!(find(&r.got, &c).is_some() && find(&r.got, &n).is_some(), "{m}: tid {tid}: {:?}", r.got);
            let (ci, ct) = find(&r.got, &c).unwrap();
            let (ni, nt) = find(&r.got, &n).unwrap();
            assert!(ci < ni, "{m}: Renamed before Created: {:?}", r.got);
            created.push(ct - t_create);
            renamed.push(nt - t_rename);

            let t_end = now_ns();
            child.end_thread();
            let x = ThreadEvent::Exited { tgid, tid };
            assert!(r.until(&mut w, Duration::from_secs(5), |g| find(g, &x).is_some()), "{m}: no Exited: {:?}", r.got);
            exited.push(find(&r.got, &x).unwrap().1 - t_end);
            assert!(r.got.iter().all(|(e, _)| e.tgid() == tgid && e.tid() == tid), "{m}: stray events: {:?}", r.got);
            assert_eq!(r.got.len(), 3, "{m}: {:?}", r.got);
        }

        // The whole process ends: its main thread's exit comes, and the kernel forgets it.
        let pid = child.pid;
        r.got.clear();
        child.quit();
        let x = ThreadEvent::Exited { tgid: pid, tid: pid };
        assert!(r.until(&mut w, Duration::from_secs(5), |g| find(g, &x).is_some()), "{m}: {:?}", r.got);
        let c = w.counters();
        assert_eq!((c.sent, c.dropped, c.forgotten), (3 * CYCLES as u64 + 1, 0, 1), "{m}: {c:?}");

        // Draining an empty ring buffer (the daemon's spurious wake-ups).
        let mut out = Vec::new();
        let t0 = Instant::now();
        for _ in 0..10_000 {
            w.drain(&mut out);
        }
        let empty_ns = t0.elapsed().as_nanos() / 10_000;
        assert!(out.is_empty());

        eprintln!("{m}: {CYCLES} threads of a watched process, time until the event was drained (mio poll):");
        stats("created (just before pthread_create) -> Created", created);
        stats("renamed (just before prctl) -> Renamed", renamed);
        stats("end byte written (the thread wakes and exits) -> Exited", exited);
        let per_event: Vec<i64> = r.drain_ns.iter().map(|&(ns, n)| (ns / n as u64) as i64).collect();
        eprintln!("  drain: {empty_ns} ns when empty; per event when not:");
        stats("drain cost per event", per_event);
    }
}

#[test]
fn threads_of_unwatched_processes_make_no_events() {
    if !have_root() {
        return;
    }
    let mut w = ThreadWatch::open().unwrap_or_else(|e| panic!("{e}"));
    let mut r = Reader::new(&w);
    // This test process: named threads come and go.
    for i in 0..20 {
        std::thread::Builder::new()
            .name(format!("hb-unwatched-{i}"))
            .spawn(|| ())
            .expect("spawn")
            .join()
            .expect("join");
    }
    // Another process, not watched either.
    let child = Child::spawn();
    child.make_thread();
    child.creation_report();
    child.thread_report();
    child.end_thread();
    r.settle(&mut w, Duration::from_millis(300));
    assert!(r.got.is_empty(), "{:?}", r.got);
    assert_eq!(w.counters().sent, 0);
}

#[test]
fn after_unwatch_no_more_events() {
    if !have_root() {
        return;
    }
    let mut w = ThreadWatch::open().unwrap_or_else(|e| panic!("{e}"));
    let mut r = Reader::new(&w);
    let child = Child::spawn();
    w.watch(child.pid).expect("watch");
    child.make_thread();
    child.creation_report();
    let (tid, _) = child.thread_report();
    let c = ThreadEvent::Created { tgid: child.pid, tid };
    assert!(r.until(&mut w, Duration::from_secs(5), |g| find(g, &c).is_some()), "{:?}", r.got);
    r.settle(&mut w, Duration::from_millis(50));
    r.got.clear();

    w.unwatch(child.pid);
    w.unwatch(child.pid); // twice: no harm
    child.end_thread(); // no Exited
    child.make_thread(); // no Created, Renamed
    child.creation_report();
    child.thread_report();
    r.settle(&mut w, Duration::from_millis(300));
    assert!(r.got.is_empty(), "{:?}", r.got);

    // Watching again works.
    w.watch(child.pid).expect("watch again");
    child.end_thread();
    r.until(&mut w, Duration::from_secs(5), |g| g.iter().any(|(e, _)| matches!(e, ThreadEvent::Exited { .. })));
}

#[test]
fn a_full_ring_buffer_counts_what_it_drops() {
    if !have_root() {
        return;
    }
    let mut w = ThreadWatch::open().unwrap_or_else(|e| panic!("{e}"));
    let child = Child::spawn();
    w.watch(child.pid).expect("watch");
    // 3 events per thread, not drained meanwhile: more than the 256 KiB ring buffer holds.
    let t0 = Instant::now();
    child.burst();
    let burst = t0.elapsed();
    let mut out = Vec::new();
    let t0 = Instant::now();
    w.drain(&mut out);
    let drain = t0.elapsed();
    let c = w.counters();
    let expected = 3 * BURST_THREADS as u64;
    assert!(c.dropped > 0, "{c:?}");
    assert_eq!(c.sent + c.dropped, expected, "{c:?}");
    assert_eq!(out.len() as u64, c.sent, "{c:?}");
    assert_eq!(w.dropped(), c.dropped);
    assert!(out.iter().all(|e| e.tgid() == child.pid));
    // The ring keeps the oldest: a prefix of whole threads' lives, in order.
    assert!(matches!(out[0], ThreadEvent::Created { .. }), "{:?}", &out[..3]);
    eprintln!(
        "burst of {BURST_THREADS} threads in {:.0} ms: {} events kept, {} dropped; draining the full \
         ring took {:.2} ms ({:.0} ns per event)",
        burst.as_secs_f64() * 1e3,
        c.sent,
        c.dropped,
        drain.as_secs_f64() * 1e3,
        drain.as_nanos() as f64 / out.len() as f64
    );
    // After the drain, events flow again.
    out.clear();
    let mut r = Reader::new(&w);
    child.make_thread();
    child.creation_report();
    let (tid, _) = child.thread_report();
    let n = ThreadEvent::Renamed { tgid: child.pid, tid, comm: "hb-worker".into() };
    assert!(r.until(&mut w, Duration::from_secs(5), |g| find(g, &n).is_some()), "{:?}", r.got);
    child.end_thread();
}

#[test]
fn watch_rejects_a_bad_pid() {
    if !have_root() {
        return;
    }
    let mut w = ThreadWatch::open().unwrap_or_else(|e| panic!("{e}"));
    let e = w.watch(0).unwrap_err().to_string();
    assert!(e.contains("process 0") && e.contains("Invalid argument"), "{e}");
}

// ---- FEAS event detection: a device wake-up is told from a timer's and from the VM's own ----

mod feas {
    use std::os::unix::net::UnixDatagram;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    use cosched_hostbpf::feas::{monotonic_ns, FeasCounters, FeasParams, FeasWatch, Role};

    use super::have_root;

    fn gettid() -> i32 {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::syscall(libc::SYS_gettid) as i32 }
    }

    /// The FEAS programs with the FEAS paper's parameters (1 boost per 10 ms cycle, 1 ms slices),
    /// only waiting vCPUs boosted.
    fn open_watch() -> FeasWatch {
        FeasWatch::open(FeasParams {
            epoch_ns: monotonic_ns(),
            cycle_ns: 10_000_000,
            slice_ns: 1_000_000,
            n_limit: 1,
            run_delay: true,
            boost_running: false,
        })
        .expect("FEAS programs load and attach")
    }

    fn delta(a: FeasCounters, b: FeasCounters) -> FeasCounters {
        FeasCounters {
            device: b.device - a.device,
            timer: b.timer - a.timer,
            internal: b.internal - a.internal,
            ..Default::default()
        }
    }

    /// This process plays the VM: an "I/O thread" blocked on a datagram socket and another that
    /// sleeps on a timer, both watched as event threads. Datagrams from a forked child (another
    /// process: a device) must count as device wake-ups; the sleeper's as timer wake-ups; and
    /// datagrams from a thread of this process (the VM itself) as internal ones.
    #[test]
    fn device_timer_and_internal_wake_ups_are_told_apart() {
        if !have_root() {
            return;
        }
        let mut w = open_watch();
        eprintln!("FEAS detection on {}, KVM tracepoints {}", w.mechanism(), w.kvm_attached());
        let pid = std::process::id() as i32;
        let dir = tempfile_dir();
        let path = dir.join("io.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        let (tx, rx) = channel();
        let reader = std::thread::spawn(move || {
            tx.send(gettid()).unwrap();
            let mut buf = [0u8; 16];
            while let Ok(n) = sock.recv(&mut buf) {
                if &buf[..n] == b"end" {
                    break;
                }
            }
        });
        let (ttx, trx) = channel();
        let sleeper = std::thread::spawn(move || {
            ttx.send(gettid()).unwrap();
            for _ in 0..100 {
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let (io_tid, timer_tid) = (rx.recv().unwrap(), trx.recv().unwrap());
        w.set_thread(io_tid, pid, Role::Event).unwrap();
        w.set_thread(timer_tid, pid, Role::Event).unwrap();
        let before = w.counters();
        // 50 datagrams from another process.
        let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: sockaddr_un is plain data; all zeroes is a valid (empty) address.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as u16;
        for (d, s) in addr.sun_path.iter_mut().zip(c_path.as_bytes()) {
            *d = *s as libc::c_char;
        }
        // SAFETY: the child only calls async-signal-safe functions (socket, sendto, nanosleep,
        // _exit) on memory prepared before the fork.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: as above; `addr` and the buffers are valid for the calls.
            unsafe {
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0);
                let ts = libc::timespec { tv_sec: 0, tv_nsec: 3_000_000 };
                for _ in 0..50 {
                    libc::sendto(
                        fd,
                        b"pkt".as_ptr().cast(),
                        3,
                        0,
                        (&addr as *const libc::sockaddr_un).cast(),
                        std::mem::size_of::<libc::sockaddr_un>() as u32,
                    );
                    libc::nanosleep(&ts, std::ptr::null_mut());
                }
                libc::_exit(0);
            }
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(child, &mut status, 0) };
        let after_device = w.counters();
        // 30 datagrams from a thread of this process.
        let tx_sock = UnixDatagram::unbound().unwrap();
        for _ in 0..30 {
            tx_sock.send_to(b"own", &path).unwrap();
            std::thread::sleep(Duration::from_millis(3));
        }
        sleeper.join().unwrap();
        tx_sock.send_to(b"end", &path).unwrap();
        reader.join().unwrap();
        let after = w.counters();
        let d1 = delta(before, after_device);
        let d2 = delta(after_device, after);
        let total = delta(before, after);
        eprintln!("device phase {d1:?}; internal phase {d2:?}");
        assert!(d1.device >= 45 && d1.device <= 50 + 5, "50 datagrams from another process: {d1:?}");
        assert!(d2.internal >= 27, "30 datagrams from a thread of the process: {d2:?}");
        assert!(d2.device <= 3, "the process's own datagrams are not device events: {d2:?}");
        assert!(total.timer >= 80, "100 timed sleeps: {total:?}");
        w.remove_thread(io_tid);
        w.remove_thread(timer_tid);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A tap device in a network namespace of its own, made by the calling thread (a thread's
    /// `unshare(CLONE_NEWNET)` moves only that thread), held open by this fd: closing it (or the
    /// process ending) removes the tap, and the namespace with its last user.
    struct Tap {
        fd: i32,
        packet: i32,
        netns: u32,
    }

    const TUNSETIFF: libc::c_ulong = 0x400454ca;

    fn ifreq(name: &str, flags: i16) -> [u8; 40] {
        let mut r = [0u8; 40];
        r[..name.len()].copy_from_slice(name.as_bytes());
        r[16..18].copy_from_slice(&flags.to_ne_bytes());
        r
    }

    impl Tap {
        /// On the calling thread, which is moved to a new network namespace.
        fn new(name: &str) -> Tap {
            // SAFETY: plain system calls on memory owned here; every result is checked.
            unsafe {
                assert_eq!(libc::unshare(libc::CLONE_NEWNET), 0, "unshare: {}", std::io::Error::last_os_error());
                let fd = libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
                assert!(fd >= 0, "/dev/net/tun: {}", std::io::Error::last_os_error());
                let mut r = ifreq(name, (libc::IFF_TAP | libc::IFF_NO_PI) as i16);
                assert_eq!(
                    libc::ioctl(fd, TUNSETIFF, r.as_mut_ptr()),
                    0,
                    "TUNSETIFF: {}",
                    std::io::Error::last_os_error()
                );
                let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
                let mut up = ifreq(name, (libc::IFF_UP | libc::IFF_RUNNING) as i16);
                assert_eq!(
                    libc::ioctl(s, libc::SIOCSIFFLAGS, up.as_mut_ptr()),
                    0,
                    "up: {}",
                    std::io::Error::last_os_error()
                );
                libc::close(s);
                let packet = libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0);
                assert!(packet >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
                let cname = std::ffi::CString::new(name).unwrap();
                let mut ll: libc::sockaddr_ll = std::mem::zeroed();
                ll.sll_family = libc::AF_PACKET as u16;
                ll.sll_ifindex = libc::if_nametoindex(cname.as_ptr()) as i32;
                assert!(ll.sll_ifindex > 0, "{name} has no index");
                let rc = libc::bind(
                    packet,
                    (&ll as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                );
                assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
                let mut st: libc::stat = std::mem::zeroed();
                let path = std::ffi::CString::new(format!("/proc/self/task/{}/ns/net", gettid())).unwrap();
                assert_eq!(libc::stat(path.as_ptr(), &mut st), 0);
                Tap { fd, packet, netns: st.st_ino as u32 }
            }
        }

        /// One Ethernet frame out of the tap (host -> guest: what QEMU would read).
        fn send(&self) {
            let mut frame = [0u8; 60];
            frame[..6].copy_from_slice(&[0x52, 0x54, 0, 0x12, 0x34, 0x56]);
            frame[6..12].copy_from_slice(&[0x52, 0x54, 0, 0xab, 0xcd, 0xef]);
            frame[12..14].copy_from_slice(&[0x88, 0xb5]); // local experimental EtherType
                                                          // SAFETY: sending a buffer owned here on our socket.
            let n = unsafe { libc::send(self.packet, frame.as_ptr().cast(), frame.len(), 0) };
            assert_eq!(n, frame.len() as isize, "send: {}", std::io::Error::last_os_error());
        }
    }

    impl Drop for Tap {
        fn drop(&mut self) {
            // SAFETY: closing our own fds.
            unsafe {
                libc::close(self.packet);
                libc::close(self.fd);
            }
        }
    }

    /// Packets queued to a VM's tap are events although no thread of the VM is woken (a busy
    /// main loop): counted as `net`, and with a vCPU of the VM waiting they ask for boosts
    /// (n_limit per cycle). Unwatched, the same packets count nothing.
    #[test]
    fn packets_to_a_watched_tap_are_events() {
        if !have_root() {
            return;
        }
        let mut w = open_watch();
        let pid = std::process::id() as i32;
        // Two "vCPUs" spinning on one CPU: one of them is always runnable and waiting.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tx, rx) = channel();
        let spinners: Vec<_> = (0..2)
            .map(|_| {
                let (stop, tx) = (stop.clone(), tx.clone());
                std::thread::spawn(move || {
                    // SAFETY: a CPU set on the stack, for this thread.
                    unsafe {
                        let mut set: libc::cpu_set_t = std::mem::zeroed();
                        libc::CPU_SET(0, &mut set);
                        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                    }
                    tx.send(gettid()).unwrap();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let vcpus: Vec<i32> = (0..2).map(|_| rx.recv().unwrap()).collect();
        for t in &vcpus {
            w.set_thread(*t, pid, Role::Vcpu).unwrap();
        }
        w.set_vm(pid, true, &vcpus).unwrap();
        let name = format!("cosft{}", pid % 100_000);
        let (cmd_tx, cmd_rx) = channel::<bool>();
        let (ack_tx, ack_rx) = channel::<u32>();
        // The tap's thread: makes it in its own namespace and sends a frame per command.
        let tap_name = name.clone();
        let tap_thread = std::thread::spawn(move || {
            let tap = Tap::new(&tap_name);
            ack_tx.send(tap.netns).unwrap();
            while let Ok(send) = cmd_rx.recv() {
                if send {
                    tap.send();
                }
                ack_tx.send(0).unwrap();
            }
        });
        let netns = ack_rx.recv_timeout(Duration::from_secs(10)).expect("the tap is made");
        let burst = |n: usize| {
            for _ in 0..n {
                cmd_tx.send(true).unwrap();
                ack_rx.recv_timeout(Duration::from_secs(5)).expect("the frame is sent");
                std::thread::sleep(Duration::from_millis(3));
            }
        };
        // Not watched yet: nothing.
        let c0 = w.counters();
        burst(20);
        let c1 = w.counters();
        assert_eq!(c1.net - c0.net, 0, "packets to a tap not watched: {c0:?} -> {c1:?}");
        let dev = cosched_hostbpf::feas::NetDev { netns, name: name.clone() };
        w.set_netdev(&dev, pid).unwrap();
        // Another namespace's device of the same name is not it.
        let other = cosched_hostbpf::feas::NetDev { netns: netns.wrapping_add(1), name: name.clone() };
        w.set_netdev(&other, pid + 1).unwrap();
        let mut msgs = Vec::new();
        burst(100);
        let c2 = w.counters();
        w.drain(&mut msgs);
        let asked = msgs
            .iter()
            .filter(|m| matches!(m, cosched_hostbpf::feas::FeasMsg::Boost { tgid, .. } if *tgid == pid))
            .count();
        eprintln!(
            "100 packets to the watched tap: {:?}, {asked} boost message(s)",
            FeasCounters {
                net: c2.net - c1.net,
                boost: c2.boost - c1.boost,
                postponed: c2.postponed - c1.postponed,
                not_waiting: c2.not_waiting - c1.not_waiting,
                ..Default::default()
            }
        );
        // One of the two as the VM's only vCPU: the packets that come while it runs find no vCPU
        // waiting, and fire when the other spinner preempts it (deferred).
        w.set_vm(pid, true, &vcpus[..1]).unwrap();
        let c4 = w.counters();
        burst(100);
        let c5 = w.counters();
        eprintln!(
            "one vCPU: not waiting {}, deferred {}, boosts {}",
            c5.not_waiting - c4.not_waiting,
            c5.deferred - c4.deferred,
            c5.boost - c4.boost
        );
        w.remove_netdev(&dev);
        w.remove_netdev(&other);
        burst(20);
        let c3 = w.counters();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for s in spinners {
            s.join().unwrap();
        }
        drop(cmd_tx);
        tap_thread.join().unwrap();
        for t in &vcpus {
            w.remove_thread(*t);
        }
        w.remove_vm(pid);
        // At least 100 (IPv6 router solicitations and the like may add a few of their own).
        assert!(c2.net - c1.net >= 100, "100 packets to the watched tap: {c1:?} -> {c2:?}");
        assert!(asked >= 20, "a vCPU waits all along, 100 packets 3 ms apart: {asked} boosts; {c1:?} -> {c2:?}");
        assert_eq!(c3.net - c5.net, 0, "packets after the tap was removed: {c5:?} -> {c3:?}");
        assert!(c5.not_waiting - c4.not_waiting >= 10, "one vCPU, running about half the time: {c4:?} -> {c5:?}");
        assert!(c5.deferred - c4.deferred >= 5, "packets while it ran, then preempted: {c4:?} -> {c5:?}");
    }

    /// A loop device over a temp file (`losetup`), detached when dropped.
    struct Loop {
        dev: String,
        file: std::path::PathBuf,
    }

    impl Drop for Loop {
        fn drop(&mut self) {
            let _ = std::process::Command::new("losetup").args(["-d", &self.dev]).status();
            let _ = std::fs::remove_file(&self.file);
        }
    }

    /// Requests completed on a block device the VM holds are events (`block`); on a device not
    /// watched, nothing.
    #[test]
    fn completions_on_a_watched_block_device_are_events() {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        if !have_root() {
            return;
        }
        let dir = tempfile_dir();
        let file = dir.join("disk.img");
        std::fs::write(&file, vec![0u8; 4 << 20]).unwrap();
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show", file.to_str().unwrap()])
            .output()
            .expect("losetup runs");
        assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
        let lo = Loop { dev: String::from_utf8(out.stdout).unwrap().trim().to_string(), file };
        let mut w = open_watch();
        let pid = std::process::id() as i32;
        let disk = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&lo.dev).unwrap();
        let rdev = disk.metadata().unwrap().rdev();
        let read_all = || {
            let layout = std::alloc::Layout::from_size_align(4096, 4096).unwrap();
            // SAFETY: a 4 KiB aligned buffer, freed below; pread writes within it.
            unsafe {
                let buf = std::alloc::alloc(layout);
                for i in 0..64 {
                    let n = libc::pread(disk.as_raw_fd(), buf.cast(), 4096, i * 4096);
                    assert_eq!(n, 4096, "O_DIRECT read of {}: {}", lo.dev, std::io::Error::last_os_error());
                }
                std::alloc::dealloc(buf, layout);
            }
        };
        use std::os::fd::AsRawFd;
        w.set_vm(pid, true, &[]).unwrap();
        let c0 = w.counters();
        read_all();
        let c1 = w.counters();
        w.set_blkdev(rdev, pid).unwrap();
        read_all();
        let c2 = w.counters();
        w.remove_blkdev(rdev);
        // Counted from the removal: a completion between c2 and it (udev probing the new loop
        // device, say) is still the watched device's.
        let removed = w.counters();
        read_all();
        let c3 = w.counters();
        w.remove_vm(pid);
        drop(disk);
        drop(lo); // detaches it and removes its file (the directory is shared with other tests)
        eprintln!(
            "64 direct reads each: block {} unwatched, {} watched, {} removed",
            c1.block - c0.block,
            c2.block - c1.block,
            c3.block - removed.block
        );
        assert_eq!(c1.block - c0.block, 0, "not watched yet");
        assert!(c2.block - c1.block >= 64, "64 reads of the watched device: {c1:?} -> {c2:?}");
        // No vCPU: each one is an event with no one waiting.
        assert!(c2.not_waiting - c1.not_waiting >= 64, "{c1:?} -> {c2:?}");
        assert_eq!(c3.block - removed.block, 0, "after it was removed");
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("cosched-feas-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
