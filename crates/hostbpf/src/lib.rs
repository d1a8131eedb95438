//! Host-side BPF for the cosched host daemon: [`ThreadWatch`] reports, as they happen, the
//! threads of the processes it is told to watch (the QEMU processes of adopted VMs) being created,
//! renamed (QEMU names its threads `CPU 0/KVM`, `IO iothread0`, `worker` just after creating
//! them) and exiting, from the kernel's thread life-cycle tracepoints (`task_newtask`,
//! `task_rename`, `sched_process_exit`; see `src/bpf/threads.bpf.c`), so the daemon no longer
//! rescans `/proc/<pid>/task` on a timer. The filter runs in the kernel, on a BPF hash map of the
//! watched process ids: thread churn anywhere else on the host costs a hash lookup and never wakes
//! the daemon, whose ring buffer fd becomes readable only when one of its VMs changed. When the
//! kernel refuses BPF (no root, no BTF, a locked-down or old kernel), [`ThreadWatch::open`] says
//! why in an operator's words and the daemon falls back to periodic rescans; when the ring buffer
//! was full, [`ThreadWatch::dropped`] grows and the daemon rescans its VMs once. This crate is
//! also the home of the host's FEAS event detection, [`feas::FeasWatch`] (`src/bpf/feas.bpf.c`).

pub mod feas;

#[allow(clippy::all, clippy::undocumented_unsafe_blocks, non_camel_case_types, dead_code, unused_imports)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/threads.skel.rs"));
}

#[allow(clippy::all, clippy::undocumented_unsafe_blocks, non_camel_case_types, dead_code, unused_imports)]
mod skel_feas {
    include!(concat!(env!("OUT_DIR"), "/feas.skel.rs"));
}

use std::fmt;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, PoisonError};

pub(crate) use cosched_bpfutil::{bytes_of, read_prefix, ObjectStorage, Plain};
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, OpenObject, PrintLevel, RingBuffer, RingBufferBuilder};

use skel::types::{thread_event, thread_event_kind, thread_stats};
use skel::{ThreadsSkel, ThreadsSkelBuilder};

/// One change to a thread of a watched process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThreadEvent {
    /// A new thread (it has not run yet; its name is still its creator's).
    Created { tgid: i32, tid: i32 },
    /// The thread took a new name (`prctl(PR_SET_NAME)`, `/proc/.../comm`, exec): at most 15
    /// bytes, as the kernel keeps it.
    Renamed { tgid: i32, tid: i32, comm: String },
    /// The thread exited (for `tid == tgid`: the main thread; the others may live on).
    Exited { tgid: i32, tid: i32 },
}

impl ThreadEvent {
    /// Decodes one `struct thread_event` (src/bpf/intf.h) from the ring buffer; `None` for a
    /// short record or an unknown kind.
    fn decode(data: &[u8]) -> Option<ThreadEvent> {
        let e: thread_event = read_prefix(data)?;
        let (tgid, tid) = (e.tgid, e.tid);
        Some(match e.kind {
            thread_event_kind::THREAD_CREATED => ThreadEvent::Created { tgid, tid },
            thread_event_kind::THREAD_RENAMED => {
                let bytes: Vec<u8> = e.comm.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
                ThreadEvent::Renamed { tgid, tid, comm: String::from_utf8_lossy(&bytes).into_owned() }
            }
            thread_event_kind::THREAD_EXITED => ThreadEvent::Exited { tgid, tid },
            _ => return None,
        })
    }

    /// The process the thread belongs to.
    pub fn tgid(&self) -> i32 {
        match *self {
            ThreadEvent::Created { tgid, .. }
            | ThreadEvent::Renamed { tgid, .. }
            | ThreadEvent::Exited { tgid, .. } => tgid,
        }
    }

    /// The thread.
    pub fn tid(&self) -> i32 {
        match *self {
            ThreadEvent::Created { tid, .. } | ThreadEvent::Renamed { tid, .. } | ThreadEvent::Exited { tid, .. } => {
                tid
            }
        }
    }
}

// SAFETY: generated from intf.h: `#[repr(C)]` of a `#[repr(transparent)]` u32, two i32 and an
// [i8; 16]; any bits are valid.
unsafe impl Plain for thread_event {}
// SAFETY: generated from intf.h: `#[repr(C)]` of three u64.
unsafe impl Plain for thread_stats {}

/// How the BPF programs are attached to the tracepoints, in order of preference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// BTF-typed raw tracepoints (`tp_btf`, a tracing program): direct reads of the task.
    TpBtf,
    /// Raw tracepoints (`raw_tp`): task fields read with CO-RE probe reads.
    RawTracepoint,
    /// Classic tracepoints (`tp`): the trace records only; needs tracefs mounted.
    Tracepoint,
}

impl Mechanism {
    /// Every mechanism, best first: what [`ThreadWatch::open`] tries.
    pub const ALL: [Mechanism; 3] = [Mechanism::TpBtf, Mechanism::RawTracepoint, Mechanism::Tracepoint];

    /// The name for logs.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::TpBtf => "tp_btf",
            Mechanism::RawTracepoint => "raw_tracepoint",
            Mechanism::Tracepoint => "tracepoint",
        }
    }
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One refused attempt to load and attach the programs.
#[derive(Debug)]
pub struct Attempt {
    pub mechanism: Mechanism,
    /// "opening", "loading" or "attaching".
    pub step: &'static str,
    pub error: libbpf_rs::Error,
    /// libbpf's last warnings about it, if any.
    pub detail: Vec<String>,
}

impl Attempt {
    /// "loading: EPERM, Operation not permitted (os error 1)"
    fn failure(&self) -> String {
        match errno_name(&self.error) {
            Some(name) => format!("{}: {name}, {:#}", self.step, self.error),
            None => format!("{}: {:#}", self.step, self.error),
        }
    }

    /// What an operator can do about it, when that is clear from the error.
    fn hint(&self) -> Option<&'static str> {
        match (self.mechanism, self.step, errno_name(&self.error)) {
            (_, _, Some("EPERM")) => Some("run the daemon as root, or with CAP_BPF and CAP_PERFMON"),
            (Mechanism::Tracepoint, "attaching", Some("ENOENT")) => Some("is tracefs mounted on /sys/kernel/tracing?"),
            (_, "opening" | "loading", Some("ENOENT" | "ESRCH")) => {
                Some("does the kernel have BTF (/sys/kernel/btf/vmlinux)?")
            }
            _ => None,
        }
    }
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}", self.mechanism, self.failure())?;
        if let Some(h) = self.hint() {
            write!(f, "; {h}")?;
        }
        for d in &self.detail {
            write!(f, "; {d}")?;
        }
        f.write_str(")")
    }
}

/// The message of [`Error::Refused`]: one failure said once when every mechanism failed alike.
fn refused_message(what: &str, attempts: &[Attempt]) -> String {
    let head = format!("BPF {what} refused by this kernel");
    match attempts {
        [] => format!("{head}: no attach mechanism was tried"),
        [first, rest @ ..] if !rest.is_empty() && rest.iter().all(|a| a.failure() == first.failure()) => {
            let names: Vec<&str> = attempts.iter().map(|a| a.mechanism.name()).collect();
            let mut m = format!("{head}: {} ({})", first.failure(), names.join(", "));
            if let Some(h) = first.hint() {
                m += &format!("; {h}");
            }
            for d in &first.detail {
                m += &format!("; {d}");
            }
            m
        }
        _ => format!("{head}: {}", attempts.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ")),
    }
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No mechanism could be loaded and attached: the caller falls back to rescanning /proc.
    #[error("{}", refused_message(.what, .attempts))]
    Refused { what: &'static str, attempts: Vec<Attempt> },
    /// The ring buffer could not be set up.
    #[error("setting up the BPF ring buffer: {0:#}")]
    RingBuffer(#[source] libbpf_rs::Error),
    /// A BPF map could not be updated (FEAS: a VM or thread to watch).
    #[error("{what}: {source:#}")]
    Map {
        what: String,
        #[source]
        source: libbpf_rs::Error,
    },
    /// A process could not be added to the watched set (e.g. E2BIG: 4096 processes watched).
    #[error("watching the threads of process {tgid}: {source:#}")]
    Watch {
        tgid: i32,
        #[source]
        source: libbpf_rs::Error,
    },
}

/// The symbolic errno in a libbpf error's text ("... (os error 1)" -> "EPERM"), if known.
pub(crate) fn errno_name(e: &libbpf_rs::Error) -> Option<&'static str> {
    let text = format!("{e:#}");
    let code: i32 = text.rsplit_once("(os error ")?.1.split(')').next()?.parse().ok()?;
    Some(match code {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EIO => "EIO",
        libc::E2BIG => "E2BIG",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EINVAL => "EINVAL",
        libc::ENOSPC => "ENOSPC",
        libc::ENOSYS => "ENOSYS",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        524 => "ENOTSUPP",
        _ => return None,
    })
}

/// Event and loss counters of the BPF side, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Events put in the ring buffer since open.
    pub sent: u64,
    /// Events lost because the ring buffer was full since open.
    pub dropped: u64,
    /// Watched processes dropped from the watched set because their last thread exited.
    pub forgotten: u64,
}

/// A BPF ring buffer whose records are decoded into `T`s as they are consumed.
pub(crate) struct Ring<T> {
    ring: RingBuffer<'static>,
    /// Records decoded by the ring buffer callback, waiting for [`Ring::drain`].
    pending: Arc<Mutex<Vec<T>>>,
}

impl<T: Send + 'static> Ring<T> {
    /// Reads the ring buffer `map`; records `decode` refuses are skipped.
    pub(crate) fn new<M: MapCore>(map: &M, decode: fn(&[u8]) -> Option<T>) -> Result<Ring<T>, Error> {
        let pending = Arc::new(Mutex::new(Vec::new()));
        let sink = pending.clone();
        let mut builder = RingBufferBuilder::new();
        builder
            .add(map, move |data: &[u8]| {
                if let Some(e) = decode(data) {
                    sink.lock().unwrap_or_else(PoisonError::into_inner).push(e);
                }
                0
            })
            .map_err(Error::RingBuffer)?;
        let ring = builder.build().map_err(Error::RingBuffer)?;
        Ok(Ring { ring, pending })
    }

    /// An fd that becomes readable when records wait (the ring buffer's epoll fd).
    pub(crate) fn fd(&self) -> RawFd {
        self.ring.epoll_fd()
    }

    /// Appends every waiting record, in order, without blocking.
    pub(crate) fn drain(&mut self, out: &mut Vec<T>) {
        // The callback never fails; an epoll error would only delay records to the next drain.
        let _ = self.ring.consume();
        out.append(&mut self.pending.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

/// What [`ThreadWatch`] loads, for its errors.
const THREADS_WHAT: &str = "thread tracepoints";

/// The loaded and attached thread life-cycle programs of one mechanism and their ring buffer.
///
/// Use: [`ThreadWatch::watch`] a QEMU pid *before* listing `/proc/<pid>/task` once (a thread
/// created in between is then both listed and reported: a `Created` for a known thread is a
/// no-op), register [`ThreadWatch::fd`] with mio and [`ThreadWatch::drain`] on readiness (it takes
/// every waiting event, so an edge-triggered poller is fine). The events of one thread come in
/// order: `Created`, any `Renamed`, `Exited`. The kernel side forgets a process when its last
/// thread exits, so a recycled pid is never watched by accident. Not reported: when a thread of
/// a multi-threaded process execs, it takes the process id as its thread id (QEMU does not exec).
pub struct ThreadWatch {
    /// Declared first so it drops first: it reads the `events` map of `skel`.
    ring: Ring<ThreadEvent>,
    /// Borrows `storage` (hence the `'static` that is not: the borrow is this struct's own).
    skel: ThreadsSkel<'static>,
    /// Declared after `skel`: fields drop in declaration order, so the object storage outlives
    /// the skeleton that lives in it. Held only to be dropped.
    #[allow(dead_code)]
    storage: ObjectStorage,
    mechanism: Mechanism,
}

impl fmt::Debug for ThreadWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadWatch").field("mechanism", &self.mechanism).finish_non_exhaustive()
    }
}

/// libbpf's warnings while [`ThreadWatch::open_with`] probes, instead of stderr.
pub(crate) static LIBBPF_LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

pub(crate) fn capture_libbpf(_level: PrintLevel, msg: String) {
    LIBBPF_LOG.lock().unwrap_or_else(PoisonError::into_inner).push(msg);
}

/// The last two of libbpf's telling warning lines (not the verifier's log, not the generic
/// "failed to load" ones), emptying the capture.
pub(crate) fn take_libbpf_log() -> Vec<String> {
    let mut log = LIBBPF_LOG.lock().unwrap_or_else(PoisonError::into_inner);
    let lines: Vec<String> = log
        .drain(..)
        .flat_map(|m| m.lines().map(str::to_owned).collect::<Vec<_>>())
        .filter(|l| l.starts_with("libbpf: "))
        .filter(|l| {
            !["-- BEGIN", "-- END", "failed to load BPF skeleton", "failed to load object", "RLIMIT_MEMLOCK"]
                .iter()
                .any(|noise| l.contains(noise))
        })
        .map(|l| {
            let l = l.trim_end();
            match l.char_indices().nth(160) {
                Some((cut, _)) => format!("{}...", &l[..cut]),
                None => l.to_owned(),
            }
        })
        .collect();
    lines[lines.len().saturating_sub(2)..].to_vec()
}

/// Loads and attaches one program set with the first of `mechanisms` the kernel allows, its
/// skeleton living in `storage`; `Err` says, per mechanism, what `what` met. While it probes,
/// libbpf's messages go into the error instead of stderr (through `libbpf_rs::set_print`, which
/// is process-wide; the previous printer is put back).
pub(crate) fn probe<T>(
    storage: &ObjectStorage,
    mechanisms: &[Mechanism],
    what: &'static str,
    load: impl Fn(&'static mut MaybeUninit<OpenObject>, Mechanism) -> Result<T, (&'static str, libbpf_rs::Error)>,
) -> Result<(T, Mechanism), Error> {
    let mut attempts = Vec::new();
    let previous = libbpf_rs::set_print(Some((PrintLevel::Warn, capture_libbpf)));
    let mut loaded = None;
    for &m in mechanisms {
        take_libbpf_log();
        // SAFETY: one skeleton at a time: a failed attempt's skeleton is dropped inside `load`
        // before the next attempt; the caller stores the one that succeeds next to `storage`
        // and drops it first.
        match load(unsafe { storage.lend() }, m) {
            Ok(skel) => {
                loaded = Some((skel, m));
                break;
            }
            Err((step, error)) => attempts.push(Attempt { mechanism: m, step, error, detail: take_libbpf_log() }),
        }
    }
    take_libbpf_log();
    libbpf_rs::set_print(previous);
    loaded.ok_or(Error::Refused { what, attempts })
}

impl ThreadWatch {
    /// Loads and attaches the programs with the best mechanism this kernel allows (tp_btf, then
    /// raw_tracepoint, then tracepoint). An `Err` says, for each, what was refused and why (e.g.
    /// "raw_tracepoint (loading: EPERM, Operation not permitted ...)"), for the daemon to log
    /// before it falls back to rescanning /proc.
    pub fn open() -> Result<ThreadWatch, Error> {
        ThreadWatch::open_with(&Mechanism::ALL)
    }

    /// Like [`ThreadWatch::open`], trying only `mechanisms`, in that order.
    ///
    /// While it probes, libbpf's messages go into the error instead of stderr (through
    /// `libbpf_rs::set_print`, which is process-wide; the previous printer is put back).
    pub fn open_with(mechanisms: &[Mechanism]) -> Result<ThreadWatch, Error> {
        let storage = ObjectStorage::new();
        let (skel, mechanism) = probe(&storage, mechanisms, THREADS_WHAT, load)?;

        let ring = Ring::new(&skel.maps.events, ThreadEvent::decode)?;
        Ok(ThreadWatch { ring, skel, storage, mechanism })
    }

    /// Reports the threads of process `tgid` from now on (until [`ThreadWatch::unwatch`] or its
    /// last thread exits).
    pub fn watch(&mut self, tgid: i32) -> Result<(), Error> {
        if tgid <= 0 {
            return Err(Error::Watch { tgid, source: libbpf_rs::Error::from_raw_os_error(libc::EINVAL) });
        }
        self.skel
            .maps
            .watched
            .update(&(tgid as u32).to_ne_bytes(), &1u32.to_ne_bytes(), MapFlags::ANY)
            .map_err(|source| Error::Watch { tgid, source })
    }

    /// Stops reporting the threads of `tgid` (events already in the ring buffer still come).
    /// Not watched (or already forgotten after its exit): nothing to do.
    pub fn unwatch(&mut self, tgid: i32) {
        let _ = self.skel.maps.watched.delete(&(tgid as u32).to_ne_bytes());
    }

    /// An fd that becomes readable when events are waiting (the ring buffer's epoll fd), to
    /// register with mio (`SourceFd`, readable).
    pub fn fd(&self) -> RawFd {
        self.ring.fd()
    }

    /// Appends every waiting event, in order, without blocking.
    pub fn drain(&mut self, out: &mut Vec<ThreadEvent>) {
        self.ring.drain(out);
    }

    /// Events lost because the ring buffer was full since open: when it grows, rescan.
    pub fn dropped(&self) -> u64 {
        self.counters().dropped
    }

    /// The BPF side's counters.
    pub fn counters(&self) -> Counters {
        let mut c = Counters::default();
        if let Ok(Some(per_cpu)) = self.skel.maps.stats.lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY) {
            for s in per_cpu.iter().filter_map(|v| read_prefix::<thread_stats>(v)) {
                c.sent += s.sent;
                c.dropped += s.dropped;
                c.forgotten += s.forgotten;
            }
        }
        c
    }

    /// How the programs are attached ("tp_btf", "raw_tracepoint" or "tracepoint"), for logs.
    pub fn mechanism(&self) -> &'static str {
        self.mechanism.name()
    }
}

/// Opens, loads and attaches the programs of `mechanism` only; on failure, which step failed.
fn load(
    storage: &'static mut MaybeUninit<OpenObject>,
    mechanism: Mechanism,
) -> Result<ThreadsSkel<'static>, (&'static str, libbpf_rs::Error)> {
    let mut open = ThreadsSkelBuilder::default().open(storage).map_err(|e| ("opening", e))?;
    let p = &mut open.progs;
    for (prog, m) in [
        (&mut p.btf_newtask, Mechanism::TpBtf),
        (&mut p.btf_rename, Mechanism::TpBtf),
        (&mut p.btf_exit, Mechanism::TpBtf),
        (&mut p.raw_newtask, Mechanism::RawTracepoint),
        (&mut p.raw_rename, Mechanism::RawTracepoint),
        (&mut p.raw_exit, Mechanism::RawTracepoint),
        (&mut p.tp_newtask, Mechanism::Tracepoint),
        (&mut p.tp_rename, Mechanism::Tracepoint),
        (&mut p.tp_exit, Mechanism::Tracepoint),
    ] {
        prog.set_autoload(m == mechanism);
    }
    let mut skel = open.load().map_err(|e| ("loading", e))?;
    skel.attach().map_err(|e| ("attaching", e))?;
    Ok(skel)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: thread_event_kind, tgid: i32, tid: i32, comm: &[u8]) -> Vec<u8> {
        let mut e = thread_event { kind, tgid, tid, ..Default::default() };
        for (d, s) in e.comm.iter_mut().zip(comm) {
            *d = *s as i8;
        }
        bytes_of(&e).to_vec()
    }

    #[test]
    fn a_thread_watch_can_move_to_another_thread() {
        fn send<T: Send>() {}
        send::<ThreadWatch>();
    }

    #[test]
    fn record_layout_matches_intf_h() {
        assert_eq!(size_of::<thread_event>(), 28);
        assert_eq!(size_of::<thread_stats>(), 24);
    }

    #[test]
    fn decodes_each_kind() {
        assert_eq!(
            ThreadEvent::decode(&record(thread_event_kind::THREAD_CREATED, 100, 101, b"")),
            Some(ThreadEvent::Created { tgid: 100, tid: 101 })
        );
        assert_eq!(
            ThreadEvent::decode(&record(thread_event_kind::THREAD_RENAMED, 100, 101, b"CPU 0/KVM\0junk")),
            Some(ThreadEvent::Renamed { tgid: 100, tid: 101, comm: "CPU 0/KVM".into() })
        );
        assert_eq!(
            ThreadEvent::decode(&record(thread_event_kind::THREAD_EXITED, 100, 101, b"")),
            Some(ThreadEvent::Exited { tgid: 100, tid: 101 })
        );
    }

    #[test]
    fn decodes_a_full_length_name_and_bad_bytes() {
        let e = ThreadEvent::decode(&record(thread_event_kind::THREAD_RENAMED, 1, 2, b"0123456789abcdef"));
        assert_eq!(e, Some(ThreadEvent::Renamed { tgid: 1, tid: 2, comm: "0123456789abcdef".into() }));
        let e = ThreadEvent::decode(&record(thread_event_kind::THREAD_RENAMED, 1, 2, b"io\xffx\0"));
        assert_eq!(e, Some(ThreadEvent::Renamed { tgid: 1, tid: 2, comm: "io\u{fffd}x".into() }));
    }

    #[test]
    fn rejects_short_records_and_unknown_kinds() {
        let r = record(thread_event_kind::THREAD_CREATED, 1, 2, b"");
        assert_eq!(ThreadEvent::decode(&r[..r.len() - 1]), None);
        assert_eq!(ThreadEvent::decode(&[]), None);
        assert_eq!(ThreadEvent::decode(&record(thread_event_kind(0), 1, 2, b"")), None);
        assert_eq!(ThreadEvent::decode(&record(thread_event_kind(4), 1, 2, b"")), None);
        // The ring buffer pads records to 8 bytes: extra bytes are fine.
        let mut padded = record(thread_event_kind::THREAD_EXITED, 1, 2, b"");
        padded.extend_from_slice(&[0xaa; 4]);
        assert_eq!(ThreadEvent::decode(&padded), Some(ThreadEvent::Exited { tgid: 1, tid: 2 }));
    }

    #[test]
    fn decodes_per_cpu_counters() {
        let s = thread_stats { sent: 5, dropped: 2, forgotten: 1 };
        let bytes = bytes_of(&s);
        let back: thread_stats = read_prefix(bytes).expect("24 bytes");
        assert_eq!((back.sent, back.dropped, back.forgotten), (5, 2, 1));
        assert!(read_prefix::<thread_stats>(&bytes[..23]).is_none());
    }

    #[test]
    fn errors_name_the_errno() {
        let e = libbpf_rs::Error::from_raw_os_error(libc::EPERM);
        assert_eq!(errno_name(&e), Some("EPERM"));
        let a = Attempt { mechanism: Mechanism::RawTracepoint, step: "loading", error: e, detail: vec![] };
        let text = Error::Refused { what: THREADS_WHAT, attempts: vec![a] }.to_string();
        assert_eq!(
            text,
            "BPF thread tracepoints refused by this kernel: raw_tracepoint (loading: EPERM, Operation not \
             permitted (os error 1); run the daemon as root, or with CAP_BPF and CAP_PERFMON)"
        );
        let same = |m| Attempt {
            mechanism: m,
            step: "loading",
            error: libbpf_rs::Error::from_raw_os_error(libc::EPERM),
            detail: vec!["libbpf: why".into()],
        };
        let text = Error::Refused { what: THREADS_WHAT, attempts: Mechanism::ALL.map(same).into() }.to_string();
        assert_eq!(
            text,
            "BPF thread tracepoints refused by this kernel: loading: EPERM, Operation not permitted (os error 1) \
             (tp_btf, raw_tracepoint, tracepoint); run the daemon as root, or with CAP_BPF and CAP_PERFMON; \
             libbpf: why"
        );
        let differ = vec![
            Attempt {
                mechanism: Mechanism::TpBtf,
                step: "loading",
                error: libbpf_rs::Error::from_raw_os_error(libc::EINVAL),
                detail: vec![],
            },
            Attempt {
                mechanism: Mechanism::Tracepoint,
                step: "attaching",
                error: libbpf_rs::Error::from_raw_os_error(libc::ENOENT),
                detail: vec![],
            },
        ];
        let text = Error::Refused { what: THREADS_WHAT, attempts: differ }.to_string();
        assert!(
            text.contains("tp_btf (loading: EINVAL, Invalid argument (os error 22)), tracepoint (attaching: ENOENT")
        );
        assert!(text.ends_with("is tracefs mounted on /sys/kernel/tracing?)"), "{text}");
        let w = Error::Watch { tgid: 42, source: libbpf_rs::Error::from_raw_os_error(libc::E2BIG) };
        assert!(w.to_string().starts_with("watching the threads of process 42: "), "{w}");
    }
}
