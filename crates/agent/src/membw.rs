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

/// The listening socket and the clients waiting for the host.
pub struct Api {
    listener: UnixListener,
    path: PathBuf,
    waiting: Vec<(u64, UnixStream, Instant)>,
    next_client: u64,
}

impl Api {
    pub fn bind(path: &Path) -> anyhow::Result<Api> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        // A socket left by an agent that died; a live agent would hold the port anyway.
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
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
        let mut api = Api::bind(&path).unwrap();
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
}
