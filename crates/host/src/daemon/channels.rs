//! The VMs' channels: the socket directory (inotify, retries with back-off), connecting to a
//! QEMU chardev socket and checking who is on the other end, and the bytes in and out of each
//! channel. Hands the loop sockets whose QEMU is known ([`Opened`]) and decoded events; knows
//! nothing of coordination or actuators.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read as _, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use cosched_core::window::Bucket;
use cosched_core::NS_PER_MS;
use cosched_procfs::{ProcFs, ProcessInfo};
use cosched_proto::{Event, Frame, StreamDecoder, FRAME_LEN};
use mio::net::UnixStream;
use mio::unix::SourceFd;
use mio::{Interest, Poll, Token};

use super::{discovery, os};
use crate::error::Error;

/// Replies queued for a guest that does not read them are dropped beyond this.
const MAX_OUT: usize = 64 * 1024;
/// First retry of a socket that failed (QEMU binds its socket a moment before it listens).
const FIRST_RETRY_MS: u64 = 50;
const MAX_RETRY_MS: u64 = 30_000;

/// A socket we could not use: when to try again, and whether we said so already.
struct Attempt {
    next_try_ns: u64,
    backoff_ms: u64,
    /// The last failure we logged: a different one is logged again.
    reported: String,
    /// Failed tries so far.
    tries: u32,
}

/// A socket's first failure is logged as information, not a warning: libvirt binds a domain's
/// socket before its QEMU runs (so nothing has accepted yet), and removes it a moment after
/// QEMU exits (connection refused). A failure still there at this try (about 6 s on, with the
/// back-off from 50 ms) is a warning.
const WARN_AT_TRY: u32 = 7;

/// A connected socket whose QEMU process is known, for the loop to attach to a VM.
pub struct Opened {
    pub path: PathBuf,
    /// The VM's name: the socket's file name without `.sock`.
    pub name: String,
    pub process: ProcessInfo,
    stream: UnixStream,
}

/// One VM's channel to its agent.
struct Channel {
    stream: UnixStream,
    path: PathBuf,
    decoder: StreamDecoder,
    out: Vec<u8>,
    /// WRITABLE is registered (replies are waiting).
    want_write: bool,
    dropped_replies: u64,
    /// Frames the daemon may still read from it ([`Channels::read_rate`]).
    budget: Bucket,
    /// Times its reading was held back because it sent past its read rate.
    held: u64,
}

/// What one read of a channel gave.
pub enum Read {
    /// `n` bytes were read; `drained`: fewer than were asked for, so the socket is empty.
    Data { n: usize, drained: bool },
    /// Nothing (more) to read now.
    Empty,
    /// Not read: the VM sent past its read rate. Read again at this time (what it sent waits
    /// in its socket, and it is held back from sending more).
    Held(u64),
    /// The channel is finished: why.
    Closed(String),
}

pub struct Channels {
    dir: PathBuf,
    inotify: OwnedFd,
    open: HashMap<usize, Channel>,
    by_path: HashMap<PathBuf, usize>,
    attempts: HashMap<PathBuf, Attempt>,
    /// Frames per second read from one VM (`[policy] read_rate`), in bursts of up to
    /// `read_burst` frames.
    read_rate: u64,
    read_burst: u64,
}

/// A held VM is read again once it may send this many frames (or its whole burst, if smaller):
/// not one wake-up per frame.
const RESUME_FRAMES: u64 = 256;

impl Channels {
    /// Watches `dir` (created if needed) for sockets; `token` is the inotify fd's.
    pub fn watch(dir: &Path, poll: &Poll, token: Token, read_rate: u64, read_burst: u64) -> anyhow::Result<Channels> {
        use anyhow::Context;
        fs::create_dir_all(dir).with_context(|| format!("creating socket directory {}", dir.display()))?;
        let inotify = os::watch_dir(dir).with_context(|| format!("watching {} with inotify", dir.display()))?;
        poll.registry().register(&mut SourceFd(&inotify.as_raw_fd()), token, Interest::READABLE)?;
        Ok(Channels {
            dir: dir.to_path_buf(),
            inotify,
            open: HashMap::new(),
            by_path: HashMap::new(),
            attempts: HashMap::new(),
            read_rate,
            read_burst,
        })
    }

    /// Sockets that appeared (inotify): each gets a fresh try at once.
    pub fn on_inotify(&mut self, now: u64, procfs: &ProcFs) -> Vec<Opened> {
        use std::os::unix::ffi::OsStrExt;
        let bytes = os::drain_fd(self.inotify.as_raw_fd());
        // struct inotify_event { int wd; u32 mask, cookie, len; char name[len]; }
        let mut off = 0;
        while off + 16 <= bytes.len() {
            let len = u32::from_ne_bytes(bytes[off + 12..off + 16].try_into().unwrap()) as usize;
            let name = &bytes[off + 16..(off + 16 + len).min(bytes.len())];
            let name = name.split(|b| *b == 0).next().unwrap_or_default();
            if !name.is_empty() {
                self.attempts.remove(&self.dir.join(std::ffi::OsStr::from_bytes(name)));
            }
            off += 16 + len;
        }
        self.scan(now, procfs)
    }

    /// Forgets every back-off (SIGHUP): every socket not connected is tried at the next scan.
    pub fn retry_all(&mut self) {
        self.attempts.clear();
    }

    /// When the next retry is due.
    pub fn next_retry(&self) -> Option<u64> {
        self.attempts.values().map(|a| a.next_try_ns).min()
    }

    /// Sockets present and not connected.
    pub fn pending(&self) -> impl Iterator<Item = &PathBuf> {
        self.attempts.keys()
    }

    /// Tries every socket of the directory that is not connected and whose retry is due.
    pub fn scan(&mut self, now: u64, procfs: &ProcFs) -> Vec<Opened> {
        let mut opened = Vec::new();
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) => {
                warn!("reading {}: {e}", self.dir.display());
                return opened;
            }
        };
        let mut present = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if !entry.file_type().is_ok_and(|t| t.is_socket()) {
                continue;
            }
            present.push(path.clone());
            if self.by_path.contains_key(&path) || self.attempts.get(&path).is_some_and(|a| now < a.next_try_ns) {
                continue;
            }
            match connect(&path, procfs) {
                Ok(o) => opened.push(o),
                Err(e) => self.failed(&path, &e, now),
            }
        }
        self.attempts.retain(|p, _| present.contains(p));
        opened
    }

    /// A socket could not be used: retried later, with back-off; each new reason is logged.
    pub fn failed(&mut self, path: &Path, e: &Error, now: u64) {
        let msg = e.to_string();
        let a = self.attempts.entry(path.to_path_buf()).or_insert(Attempt {
            next_try_ns: 0,
            backoff_ms: FIRST_RETRY_MS,
            reported: String::new(),
            tries: 0,
        });
        a.tries += 1;
        if a.tries == 1 {
            info!("{}: not ready yet: {msg}; will retry", path.display());
            a.reported = msg;
        } else if a.reported != msg || a.tries == WARN_AT_TRY {
            warn!("{}: {msg}; will retry", path.display());
            a.reported = msg;
        } else {
            debug!("{}: {msg}", path.display());
        }
        a.next_try_ns = now + a.backoff_ms * NS_PER_MS;
        a.backoff_ms = (a.backoff_ms * 2).min(MAX_RETRY_MS);
    }

    /// Makes `opened` the channel of the VM with `token`.
    pub fn attach(&mut self, token: usize, opened: Opened, poll: &Poll, now: u64) -> Result<(), Error> {
        let Opened { path, mut stream, .. } = opened;
        poll.registry().register(&mut stream, Token(token), Interest::READABLE).map_err(Error::Poll)?;
        self.attempts.remove(&path);
        self.by_path.insert(path.clone(), token);
        let ch = Channel {
            stream,
            path,
            decoder: StreamDecoder::new(),
            out: Vec::new(),
            want_write: false,
            dropped_replies: 0,
            budget: Bucket::new(self.read_rate, self.read_burst, now),
            held: 0,
        };
        self.open.insert(token, ch);
        Ok(())
    }

    pub fn path(&self, token: usize) -> Option<&Path> {
        self.open.get(&token).map(|c| c.path.as_path())
    }

    pub fn dropped_replies(&self, token: usize) -> u64 {
        self.open.get(&token).map_or(0, |c| c.dropped_replies)
    }

    /// Times the channel of `token` was held back for sending past its read rate.
    pub fn held(&self, token: usize) -> u64 {
        self.open.get(&token).map_or(0, |c| c.held)
    }

    /// One non-blocking read of the channel: of as many whole frames' bytes as its read budget
    /// has left, up to `buf`'s length.
    pub fn read(&mut self, token: usize, buf: &mut [u8], now: u64) -> Read {
        let Some(c) = self.open.get_mut(&token) else { return Read::Empty };
        let frames = c.budget.available(now);
        if frames == 0 {
            c.held += 1;
            return Read::Held(now + c.budget.wait_ns(RESUME_FRAMES));
        }
        let len = buf.len().min(usize::try_from(frames).unwrap_or(usize::MAX).saturating_mul(FRAME_LEN));
        loop {
            return match c.stream.read(&mut buf[..len]) {
                Ok(0) => Read::Closed("channel closed (QEMU exited?)".into()),
                Ok(n) => {
                    c.budget.spend(n.div_ceil(FRAME_LEN) as u64);
                    Read::Data { n, drained: n < len }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Read::Empty,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Read::Closed(format!("read error: {e}")),
            };
        }
    }

    /// Decodes bytes read from the channel into `events` (frames, malformed frames, garbage).
    pub fn decode(&mut self, token: usize, bytes: &[u8], events: &mut Vec<Event>) {
        let Some(c) = self.open.get_mut(&token) else { return };
        c.decoder.push(bytes);
        while let Some(ev) = c.decoder.next_event() {
            events.push(ev);
        }
    }

    /// Queues a reply; written by [`Channels::flush`]. False if the channel is gone.
    pub fn queue(&mut self, token: usize, frame: &Frame) -> bool {
        let Some(c) = self.open.get_mut(&token) else { return false };
        if c.out.len() + 16 > MAX_OUT {
            c.dropped_replies += 1;
        } else {
            c.out.extend_from_slice(&frame.encode());
        }
        true
    }

    /// Writes what is queued for the channel; what the socket does not take waits for
    /// WRITABLE.
    pub fn flush(&mut self, token: usize, poll: &Poll) {
        let Some(c) = self.open.get_mut(&token) else { return };
        while !c.out.is_empty() {
            match c.stream.write(&c.out) {
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
            let _ = poll.registry().reregister(&mut c.stream, Token(token), interest);
            c.want_write = want_write;
        }
    }

    /// Closes the channel of `token`, if it has one.
    pub fn close(&mut self, token: usize, poll: &Poll) {
        if let Some(mut c) = self.open.remove(&token) {
            let _ = poll.registry().deregister(&mut c.stream);
            self.by_path.remove(&c.path);
        }
    }
}

/// Connects to a QEMU chardev socket and checks who is on the other end.
fn connect(path: &Path, procfs: &ProcFs) -> Result<Opened, Error> {
    let stream = UnixStream::connect(path).map_err(Error::Connect)?;
    let (pid, _uid) = os::peer_cred(stream.as_raw_fd()).map_err(Error::PeerCred)?;
    let listener = procfs.process(pid).map_err(|source| Error::Peer { pid, source })?;
    let process = if listener.is_qemu() { listener } else { discovery::qemu_behind(procfs, &stream, &listener)? };
    discovery::check_binary(procfs, &process)?;
    Ok(Opened { path: path.to_path_buf(), name: vm_name(path), process, stream })
}

fn vm_name(path: &Path) -> String {
    let file = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    file.strip_suffix(".sock").map(str::to_string).unwrap_or(file)
}
