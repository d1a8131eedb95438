//! The few raw system calls the daemon makes outside the actuators: the state-directory lock,
//! signals as a file descriptor, inotify on the socket directory, the peer of a unix socket.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use anyhow::{bail, Context};

use crate::store::StateDir;

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

pub fn block_signals() -> io::Result<OwnedFd> {
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

pub fn watch_dir(dir: &Path) -> io::Result<OwnedFd> {
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
pub fn drain_fd(fd: RawFd) -> Vec<u8> {
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
pub fn peer_cred(fd: RawFd) -> io::Result<(i32, u32)> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    errno_result(unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len)
    })?;
    Ok((cred.pid, cred.uid))
}
