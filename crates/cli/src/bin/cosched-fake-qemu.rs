//! Test helper: a process that poses as a QEMU VM for the root integration tests.
//!
//! Copied to a file named `qemu-system-x86_64` (the daemon only talks to QEMU processes), it
//! starts real threads named like QEMU's (`CPU 0/TCG`, `IO iothread0`, `worker`), listens on
//! a unix socket like QEMU's chardev (`server=on,wait=off`), and relays bytes between the
//! daemon's connection and its stdin/stdout, so a test plays the guest through the pipes.
//! SIGUSR1 starts one more `worker` thread; the process exits when stdin closes. With
//! `--listen-fd N` it uses an inherited listening socket, as QEMU does under libvirt.
//!
//! With `--drive HZ` it is its own guest instead (for the daemon scale experiment): once the
//! daemon connects it registers, then sends `CPU 1` and `CPU 0` alternately, HZ frames a second,
//! discarding the replies, until killed.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static SPAWN: AtomicBool = AtomicBool::new(false);

extern "C" fn on_usr1(_: libc::c_int) {
    SPAWN.store(true, Ordering::Relaxed);
}

fn named_thread(name: String, spin: bool) {
    std::thread::spawn(move || {
        let c = std::ffi::CString::new(name).unwrap();
        // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
        unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr()) };
        loop {
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

fn main() {
    let mut args = std::env::args().skip(1);
    let mut socket = None;
    let mut listen_fd = None;
    let mut drive_hz: Option<u32> = None;
    let mut threads = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--socket" => socket = args.next(),
            // Like QEMU under libvirt (`-chardev socket,fd=N`): the listening socket is inherited.
            "--listen-fd" => listen_fd = args.next().map(|n| n.parse::<i32>().expect("--listen-fd N")),
            "--thread" => threads.push((args.next().expect("--thread NAME"), false)),
            "--drive" => drive_hz = args.next().and_then(|n| n.parse().ok()),
            "--spin" => threads.push((args.next().expect("--spin NAME"), true)),
            other => panic!("unknown argument {other}"),
        }
    }
    let socket = socket.expect("--socket PATH");
    for (name, spin) in threads {
        named_thread(name, spin);
    }
    // SAFETY: installing an async-signal-safe handler that only stores to an atomic.
    unsafe { libc::signal(libc::SIGUSR1, on_usr1 as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    std::thread::spawn(|| loop {
        if SPAWN.swap(false, Ordering::Relaxed) {
            named_thread("worker".into(), false);
        }
        std::thread::sleep(Duration::from_millis(2));
    });

    let listener = match listen_fd {
        // SAFETY: the fd was handed to us by our parent for exactly this purpose.
        Some(fd) => unsafe { <UnixListener as std::os::fd::FromRawFd>::from_raw_fd(fd) },
        None => {
            let _ = std::fs::remove_file(&socket);
            UnixListener::bind(&socket).expect("bind")
        }
    };
    eprintln!("fake-qemu: listening on {socket} (pid {})", std::process::id());
    if let Some(hz) = drive_hz {
        drive(listener, hz);
    }
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
        // Wait (briefly) for the daemon to connect if it has not yet.
        for _ in 0..500 {
            if let Some(c) = CURRENT.lock().unwrap().as_mut() {
                let _ = c.write_all(&buf[..n]);
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let _ = std::fs::remove_file(&socket);
}

static CURRENT: std::sync::Mutex<Option<std::os::unix::net::UnixStream>> = std::sync::Mutex::new(None);

/// Plays the guest: register, then alternate CPU 1 / CPU 0 at `hz` frames a second.
fn drive(listener: UnixListener, hz: u32) -> ! {
    use cosched_proto::{caps, Frame};
    let (conn, _) = listener.accept().expect("accept");
    let mut reader = conn.try_clone().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while matches!(reader.read(&mut buf), Ok(n) if n > 0) {}
    });
    let mut w = conn;
    w.write_all(&Frame::register(1, caps::CPU).encode()).expect("register");
    let period = Duration::from_secs(1) / hz.max(1);
    let mut next = std::time::Instant::now() + period;
    for seq in 2u32.. {
        std::thread::sleep(next.saturating_duration_since(std::time::Instant::now()));
        next += period;
        if w.write_all(&Frame::cpu(seq, seq % 2 == 0).encode()).is_err() {
            std::process::exit(0);
        }
    }
    unreachable!()
}
