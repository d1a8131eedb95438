//! The guest's memory-bandwidth API: a local socket where an application or a resource manager
//! asks for the share of the host's guaranteed memory bandwidth it needs (`cosched
//! request-membw <permille>`, or any client: one line with the permille, one line back).
//!
//! Replies, one line: `granted <g>` (what was asked), `lowered <g> asked <a>` (the host
//! granted less), `denied <reason>` (`unsupported: ...`, `budget: ...`, ...), or `error <what>`.
//! The socket is root-only (mode 0600).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::core::MembwGrant;

/// Where the agent listens by default.
pub const MEMBW_SOCKET: &str = "/run/cosched/membw.sock";
/// A client waits this long for the host's answer.
const REPLY_TIMEOUT: Duration = Duration::from_secs(3);

/// The reply line for a result.
pub fn reply_line(result: &Result<MembwGrant, String>) -> String {
    match result {
        Ok(g) if g.granted == g.asked => format!("granted {}", g.granted),
        Ok(g) => format!("lowered {} asked {}", g.granted, g.asked),
        Err(why) if why.starts_with("the agent") || why.starts_with("no reply") => format!("error {why}"),
        Err(why) => format!("denied {why}"),
    }
}

/// Parses a request line: a permille, 0..=1000.
pub fn parse_request(line: &str) -> Result<u64, String> {
    let t = line.trim();
    match t.parse::<u64>() {
        Ok(v) if v <= 1000 => Ok(v),
        _ => Err(format!("expected a share in permille 0..=1000, got {t:?}")),
    }
}

/// The id of group `name` (or a number).
fn group_id(name: &str) -> anyhow::Result<u32> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    let c = std::ffi::CString::new(name).map_err(|_| anyhow::anyhow!("group name {name:?} has a NUL byte"))?;
    // SAFETY: `c` is a valid C string; the returned entry is read at once, before any other
    // call that could overwrite it (the agent is single-threaded when it binds).
    let gr = unsafe { libc::getgrnam(c.as_ptr()) };
    if gr.is_null() {
        anyhow::bail!("--membw-group {name}: no such group");
    }
    // SAFETY: non-null, a valid `struct group`.
    Ok(unsafe { (*gr).gr_gid })
}

/// The listening socket and the clients waiting for the host.
pub struct Api {
    listener: UnixListener,
    path: PathBuf,
    waiting: Vec<(u64, UnixStream, Instant)>,
    next_client: u64,
}

impl Api {
    /// Listens at `path`, for root only (0600), or also for the members of `group` (a name or
    /// a number: the socket is then that group's, 0660).
    pub fn bind(path: &Path, group: Option<&str>) -> anyhow::Result<Api> {
        let gid = group.map(group_id).transpose()?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        // A socket left by an agent that died; a live agent would hold the port anyway.
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        if let Some(gid) = gid {
            std::os::unix::fs::chown(path, None, Some(gid))
                .with_context(|| format!("giving {} to group {gid}", path.display()))?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
        }
        listener.set_nonblocking(true)?;
        Ok(Api { listener, path: path.to_path_buf(), waiting: Vec::new(), next_client: 1 })
    }

    pub fn fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.listener.as_raw_fd()
    }

    /// Accepts the clients that connected: each one's request, as (client, share). A request
    /// that cannot be read or parsed is answered at once.
    pub fn accept(&mut self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        while let Ok((stream, _)) = self.listener.accept() {
            let _ = stream.set_nonblocking(false);
            let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
            let _ = stream.set_write_timeout(Some(Duration::from_millis(500)));
            let mut line = String::new();
            let read = BufReader::new(&stream).read_line(&mut line);
            let mut stream = stream;
            match read.map_err(|e| e.to_string()).and_then(|_| parse_request(&line)) {
                Ok(share) => {
                    let client = self.next_client;
                    self.next_client += 1;
                    self.waiting.push((client, stream, Instant::now()));
                    out.push((client, share));
                }
                Err(e) => {
                    let _ = writeln!(stream, "error {e}");
                }
            }
        }
        out
    }

    /// Answers a client.
    pub fn reply(&mut self, client: u64, result: &Result<MembwGrant, String>) {
        if let Some(i) = self.waiting.iter().position(|w| w.0 == client) {
            let (_, mut stream, _) = self.waiting.remove(i);
            let _ = writeln!(stream, "{}", reply_line(result));
        }
    }

    /// Answers the clients the host left without a reply.
    pub fn expire(&mut self) {
        let now = Instant::now();
        let (old, keep): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.waiting).into_iter().partition(|w| now.duration_since(w.2) >= REPLY_TIMEOUT);
        self.waiting = keep;
        for (_, mut stream, _) in old {
            let _ = writeln!(stream, "error no reply from the host within {} s", REPLY_TIMEOUT.as_secs());
        }
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `cosched request-membw`: asks the agent at `socket`; returns its reply line. A denial or an
/// error is an error (exit status 1) with the agent's words.
pub fn membw_request(socket: &Path, share: u64) -> anyhow::Result<String> {
    let mut s = UnixStream::connect(socket).with_context(|| {
        format!(
            "cannot reach the cosched guest agent at {} (is `cosched guest` running? are you root?)",
            socket.display()
        )
    })?;
    s.set_read_timeout(Some(REPLY_TIMEOUT + Duration::from_secs(2)))?;
    writeln!(s, "{share}")?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).context("reading the agent's reply")?;
    let line = line.trim().to_string();
    if line.starts_with("granted") || line.starts_with("lowered") {
        Ok(line)
    } else if line.is_empty() {
        anyhow::bail!("the agent closed the connection without a reply")
    } else {
        anyhow::bail!("{line}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_are_one_line() {
        assert_eq!(parse_request("300\n"), Ok(300));
        assert!(parse_request("1001").is_err() && parse_request("lots").is_err());
        assert_eq!(reply_line(&Ok(MembwGrant { asked: 300, granted: 300 })), "granted 300");
        assert_eq!(reply_line(&Ok(MembwGrant { asked: 500, granted: 200 })), "lowered 200 asked 500");
        assert_eq!(reply_line(&Err("budget: none left".into())), "denied budget: none left");
        assert_eq!(reply_line(&Err("the agent is not registered".into())), "error the agent is not registered");
    }

    #[test]
    fn a_client_gets_the_reply_through_the_socket() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("sub/membw.sock");
        let mut api = Api::bind(&path, None).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let p = path.clone();
        let client = std::thread::spawn(move || membw_request(&p, 400));
        let got = loop {
            let got = api.accept();
            if !got.is_empty() {
                break got;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1, 400);
        api.reply(got[0].0, &Ok(MembwGrant { asked: 400, granted: 250 }));
        assert_eq!(client.join().unwrap().unwrap(), "lowered 250 asked 400");
        let p = path.clone();
        let client = std::thread::spawn(move || membw_request(&p, 10));
        let c = loop {
            let got = api.accept();
            if let Some(c) = got.first() {
                break c.0;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        api.reply(c, &Err("unsupported: no backend".into()));
        let e = client.join().unwrap().unwrap_err().to_string();
        assert_eq!(e, "denied unsupported: no backend");
        drop(api);
        assert!(!path.exists(), "the socket goes with the agent");
    }

    #[test]
    fn a_group_may_be_let_in() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("membw.sock");
        // Our own group (chown to it needs no privilege), by number and by name.
        // SAFETY: getegid cannot fail.
        let gid = unsafe { libc::getegid() };
        let _api = Api::bind(&path, Some(&gid.to_string())).unwrap();
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!((m.permissions().mode() & 0o777, m.gid()), (0o660, gid));
        if gid == 0 {
            let _api = Api::bind(&path, Some("root")).unwrap();
            assert_eq!(std::fs::metadata(&path).unwrap().gid(), 0);
        }
        let e = Api::bind(&d.path().join("other.sock"), Some("no-such-group-cosched")).err().unwrap();
        assert!(e.to_string().contains("no such group"), "{e}");
        assert!(!d.path().join("other.sock").exists(), "nothing is bound for a bad group");
    }
}
