//! Finding VMs and their threads: QEMU processes without a channel (a scan of the host's
//! processes), which QEMU is behind a socket, whether its binary may be trusted, and the
//! threads of every known QEMU as they are created, renamed and exit (host BPF). Hands the
//! loop processes and thread events; changes nothing.

use std::collections::HashSet;
use std::fs;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use cosched_hostbpf::{ThreadEvent, ThreadWatch};
use cosched_procfs::{ProcFs, ProcessInfo};
use mio::net::UnixStream;
use mio::unix::SourceFd;
use mio::{Interest, Poll, Token};

use crate::error::Error;
use crate::peer;

pub struct Discovery {
    /// Thread creation, naming and exit of the VMs' processes, seen as they happen;
    /// `None`: thread lists are re-read periodically instead.
    watch: Option<ThreadWatch>,
    /// Ring-buffer drops seen so far: more means a rescan of every VM.
    drops: u64,
    /// QEMU processes refused by the process scan (warned once).
    refused: HashSet<i32>,
}

impl Discovery {
    /// With `thread_events`, loads the host BPF that reports thread events (registered with
    /// `poll` under `token`); without, or if it cannot load, says what is used instead.
    pub fn open(thread_events: bool, poll: &Poll, token: Token, refresh_ms: u64) -> anyhow::Result<Discovery> {
        let watch = if thread_events {
            match ThreadWatch::open() {
                Ok(w) => {
                    poll.registry().register(&mut SourceFd(&w.fd()), token, Interest::READABLE)?;
                    info!("seeing VM threads come and go as it happens ({})", w.mechanism());
                    Some(w)
                }
                Err(e) => {
                    warn!(
                        "thread events unavailable ({e}); re-reading boosted VMs' thread lists every {refresh_ms} ms instead"
                    );
                    None
                }
            }
        } else {
            None
        };
        Ok(Discovery { watch, drops: 0, refused: HashSet::new() })
    }

    /// The mechanism reporting thread events, if any.
    pub fn mechanism(&self) -> Option<&'static str> {
        self.watch.as_ref().map(|w| w.mechanism())
    }

    /// Whether thread lists are kept current by events.
    pub fn live(&self) -> bool {
        self.watch.is_some()
    }

    /// Reports the threads of `pid` from now on.
    pub fn watch(&mut self, pid: i32) -> Result<(), Error> {
        match self.watch.as_mut() {
            Some(w) => w.watch(pid).map_err(|source| Error::WatchThreads { pid, source }),
            None => Ok(()),
        }
    }

    pub fn unwatch(&mut self, pid: i32) {
        if let Some(w) = self.watch.as_mut() {
            w.unwatch(pid);
        }
    }

    /// The thread events that arrived; true if some were lost since the last call (every
    /// VM's list must then be read again).
    pub fn drain(&mut self, out: &mut Vec<ThreadEvent>) -> bool {
        let Some(w) = self.watch.as_mut() else { return false };
        w.drain(out);
        let dropped = w.dropped();
        if dropped > self.drops {
            warn!("{} thread event(s) lost (ring buffer full): re-reading every VM's threads", dropped - self.drops);
            self.drops = dropped;
            return true;
        }
        false
    }

    /// QEMU processes that `known` does not know (guests without an agent, libvirt domains
    /// without the channel), with their name: QEMU's `-name` (a libvirt domain's name), or
    /// `qemu-<pid>`. Processes whose binary is not trusted are refused, with one warning.
    pub fn qemu_processes(&mut self, procfs: &ProcFs, known: impl Fn(i32) -> bool) -> Vec<(String, ProcessInfo)> {
        let mut found = Vec::new();
        let Ok(pids) = procfs.pids() else { return found };
        for pid in pids {
            if known(pid) || pid == std::process::id() as i32 {
                continue;
            }
            if let Some(p) = self.trusted_qemu(procfs, pid) {
                let args = procfs.cmdline(pid).unwrap_or_default();
                found.push((cosched_procfs::qemu_name(&args).unwrap_or_else(|| format!("qemu-{pid}")), p));
            }
        }
        self.refused.retain(|pid| procfs.process(*pid).is_ok());
        found
    }

    /// libvirt's running QEMU domains that `known` does not know, named by their domain: the
    /// `<domain>.pid` files libvirt keeps in `dir` (`/run/libvirt/qemu`) while a domain runs.
    /// The same checks as [`Discovery::qemu_processes`]: a QEMU, from a trusted binary.
    pub fn libvirt_domains(
        &mut self,
        procfs: &ProcFs,
        dir: &Path,
        known: impl Fn(i32) -> bool,
    ) -> Vec<(String, ProcessInfo)> {
        let mut found = Vec::new();
        for (domain, pid) in libvirt_pid_files(dir) {
            if known(pid) {
                continue;
            }
            if let Some(p) = self.trusted_qemu(procfs, pid) {
                found.push((domain, p));
            }
        }
        self.refused.retain(|pid| procfs.process(*pid).is_ok());
        found
    }

    /// Process `pid` if it is QEMU from a trusted binary; one warning per refused process.
    fn trusted_qemu(&mut self, procfs: &ProcFs, pid: i32) -> Option<ProcessInfo> {
        let p = procfs.process(pid).ok().filter(|p| p.is_qemu())?;
        match check_binary(procfs, &p) {
            Ok(()) => Some(p),
            Err(e) => {
                if self.refused.insert(pid) {
                    warn!("{e}");
                }
                None
            }
        }
    }
}

/// (domain, pid) of each `<domain>.pid` file in libvirt's run directory for QEMU; files that
/// are not a pid are skipped (libvirt writes them whole, but a domain may be starting).
pub fn libvirt_pid_files(dir: &Path) -> Vec<(String, i32)> {
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<(String, i32)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.strip_suffix(".pid")?.to_string();
            let pid = fs::read_to_string(e.path()).ok()?.trim().parse::<i32>().ok().filter(|p| *p > 0)?;
            (!name.is_empty()).then_some((name, pid))
        })
        .collect();
    out.sort();
    out
}

/// The socket was listened on by a process that is not QEMU (libvirt passes the listening
/// fd to QEMU): the VM is the QEMU process holding the socket that accepted us.
pub fn qemu_behind(procfs: &ProcFs, stream: &UnixStream, listener: &ProcessInfo) -> Result<ProcessInfo, Error> {
    let refuse = |why: String| Error::NotQemu {
        pid: listener.task.id,
        comm: listener.comm.clone(),
        exe: listener.exe.clone(),
        why,
    };
    let peer = peer::unix_peer_inode(stream.as_raw_fd()).map_err(|e| refuse(format!("and sock_diag failed: {e}")))?;
    // QEMU accepts from its main loop, a moment after our connect() returned.
    let deadline = Instant::now() + Duration::from_millis(200);
    loop {
        let qemus: Vec<ProcessInfo> = procfs
            .socket_holders(peer)
            .into_iter()
            .filter_map(|pid| procfs.process(pid).ok())
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
pub fn check_binary(procfs: &ProcFs, p: &ProcessInfo) -> Result<(), Error> {
    use std::os::unix::fs::MetadataExt;
    let pid = p.task.id;
    let exe = procfs.root().join(pid.to_string()).join("exe");
    let m = fs::metadata(&exe).map_err(|source| Error::Executable { pid, source })?;
    if m.uid() != 0 || m.mode() & 0o022 != 0 {
        return Err(Error::UnsafeBinary {
            pid,
            comm: p.comm.clone(),
            exe: p.exe.clone(),
            uid: m.uid(),
            mode: m.mode() & 0o7777,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libvirts_pid_files() {
        let dir = tempfile::tempdir().unwrap();
        for (file, text) in [
            ("web.pid", "4242\n"),
            ("db.pid", "17"),
            ("starting.pid", ""),
            ("bad.pid", "x"),
            ("zero.pid", "0"),
            ("web.xml", "<domstatus/>"),
            (".pid", "5"),
        ] {
            fs::write(dir.path().join(file), text).unwrap();
        }
        assert_eq!(libvirt_pid_files(dir.path()), vec![("db".into(), 17), ("web".into(), 4242)]);
        assert_eq!(libvirt_pid_files(&dir.path().join("none")), vec![]);
    }
}
