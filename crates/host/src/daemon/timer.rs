//! The loop's timer for the coordinator's deadlines, precise enough for predictive boost
//! (`cosched_core::rt`), whose boosts are planned to the µs.
//!
//! The loop's `epoll` timeout has a resolution of 1 ms (mio rounds it up), so a boost planned
//! for a given µs would land up to 1 ms late. A `timerfd` (`CLOCK_MONOTONIC`, absolute) armed at
//! the coordinator's next deadline wakes the loop at that time; the daemon runs at `SCHED_FIFO`,
//! whose timer slack is 0.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use mio::unix::SourceFd;
use mio::{Interest, Poll, Token};

/// A `timerfd` armed at an absolute daemon time (ns since the daemon's time zero).
pub struct DeadlineTimer {
    fd: OwnedFd,
    /// `CLOCK_MONOTONIC` at the daemon's time zero.
    zero: u64,
    armed: Option<u64>,
}

impl DeadlineTimer {
    pub fn open(poll: &Poll, token: Token, zero: u64) -> io::Result<DeadlineTimer> {
        // SAFETY: timerfd_create takes no pointers; the fd it returns is owned here.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just created and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        poll.registry().register(&mut SourceFd(&fd.as_raw_fd()), token, Interest::READABLE)?;
        Ok(DeadlineTimer { fd, zero, armed: None })
    }

    /// Arms the timer at `at` (daemon ns), or disarms it; a system call only when it changes.
    pub fn arm(&mut self, at: Option<u64>) {
        if at == self.armed {
            return;
        }
        let abs = at.map_or(0, |t| self.zero + t.max(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec {
                tv_sec: (abs / 1_000_000_000) as libc::time_t,
                tv_nsec: (abs % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: a valid timerfd and a valid itimerspec; the old value is not asked for.
        let rc =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), libc::TFD_TIMER_ABSTIME, &spec, std::ptr::null_mut()) };
        if rc == 0 {
            self.armed = at;
        } else {
            warn!("timerfd_settime: {}", io::Error::last_os_error());
        }
    }

    /// The timer fired: reads its count (so that the next expiry raises a new edge).
    pub fn fired(&mut self) {
        let mut n = [0u8; 8];
        // SAFETY: reads at most 8 bytes into an 8-byte buffer.
        unsafe { libc::read(self.fd.as_raw_fd(), n.as_mut_ptr().cast(), n.len()) };
        self.armed = None;
    }
}
