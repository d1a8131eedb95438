//! Control and metrics clients: the control socket, root and the daemon's user only (one JSON
//! request line, one reply line), and the Prometheus endpoint (one HTTP request, one response).
//! Hands the loop each complete request ([`Ask`]) and writes the answer it gets back without blocking; never
//! sees the daemon's state, only the status snapshot or reply the loop makes.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use cosched_core::NS_PER_MS;
use mio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use mio::{Interest, Poll, Token};

use super::os;
use crate::control::{Reply, Request, RequestError};

/// Control and metrics clients at once, and how long one may take.
const MAX_CLIENTS: usize = 64;
const CLIENT_TIMEOUT_NS: u64 = 5_000 * NS_PER_MS;
/// Longest request a client may send.
const MAX_REQUEST: usize = 64 * 1024;
/// Client tokens start here; below are the daemon's own and the VMs'.
pub const FIRST_CLIENT: usize = 1 << 40;

/// A complete request from a client.
pub enum Ask {
    /// A control request (or why the line is not one).
    Control(Result<Request, RequestError>),
    /// A metrics scrape.
    Metrics,
}

/// The loop's answer to an [`Ask`].
pub enum Answer {
    Control(Reply),
    /// The metrics text.
    Metrics(String),
}

enum Stream {
    Control(UnixStream),
    Http(TcpStream),
}

impl Stream {
    fn source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Stream::Control(s) => s,
            Stream::Http(s) => s,
        }
    }
    fn io(&mut self) -> &mut dyn ReadWrite {
        match self {
            Stream::Control(s) => s,
            Stream::Http(s) => s,
        }
    }
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

struct Client {
    stream: Stream,
    input: Vec<u8>,
    reply: Vec<u8>,
    written: usize,
    since_ns: u64,
}

pub struct Clients {
    control: UnixListener,
    control_path: PathBuf,
    metrics: Option<TcpListener>,
    open: BTreeMap<usize, Client>,
    next_token: usize,
}

impl Clients {
    /// Binds the control socket at `path` (mode 0600; a stale one is removed: the caller
    /// holds the state lock, so no daemon runs) and, if asked, the metrics endpoint.
    pub fn bind(
        path: &Path,
        metrics_listen: Option<&str>,
        poll: &Poll,
        control_token: Token,
        metrics_token: Token,
    ) -> anyhow::Result<Clients> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        if path.exists() {
            fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))?;
        }
        let mut control =
            UnixListener::bind(path).with_context(|| format!("binding control socket {}", path.display()))?;
        fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
        poll.registry().register(&mut control, control_token, Interest::READABLE)?;
        let metrics = match metrics_listen {
            Some(addr) => {
                let a = addr.parse().with_context(|| format!("metrics_listen = {addr:?}: not an ip:port"))?;
                let mut l = TcpListener::bind(a).with_context(|| format!("binding metrics on {addr}"))?;
                poll.registry().register(&mut l, metrics_token, Interest::READABLE)?;
                Some(l)
            }
            None => None,
        };
        Ok(Clients {
            control,
            control_path: path.to_path_buf(),
            metrics,
            open: BTreeMap::new(),
            next_token: FIRST_CLIENT,
        })
    }

    pub fn metrics_addr(&self) -> Option<String> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok()).map(|a| a.to_string())
    }

    /// Accepts control clients: root and the daemon's own user only, whatever the socket's
    /// mode says.
    pub fn accept_control(&mut self, poll: &Poll, now: u64) {
        loop {
            let (mut stream, _) = match self.control.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    warn!("control accept: {e}");
                    return;
                }
            };
            match os::peer_cred(stream.as_raw_fd()) {
                // Root, or the user the daemon runs as (a daemon given capabilities, not uid 0).
                // SAFETY: geteuid has no preconditions.
                Ok((_, uid)) if uid == 0 || uid == unsafe { libc::geteuid() } => {
                    self.add(Stream::Control(stream), poll, now)
                }
                Ok((pid, uid)) => {
                    warn!("control: refusing pid {pid} uid {uid} (root or the daemon's user only)");
                    let _ = stream.write_all(b"{\"ok\":false,\"error\":\"root or the daemon's user only\"}\n");
                }
                Err(e) => warn!("control: SO_PEERCRED: {e}"),
            }
        }
    }

    pub fn accept_metrics(&mut self, poll: &Poll, now: u64) {
        while let Some(Ok((stream, _))) = self.metrics.as_ref().map(|l| l.accept()) {
            let _ = stream.set_nodelay(true);
            self.add(Stream::Http(stream), poll, now);
        }
    }

    /// Registers a client with the poller; beyond MAX_CLIENTS it is closed.
    fn add(&mut self, mut stream: Stream, poll: &Poll, now: u64) {
        if self.open.len() >= MAX_CLIENTS {
            warn!("more than {MAX_CLIENTS} control/metrics clients at once: closing a new one");
            return;
        }
        let token = self.next_token;
        self.next_token += 1;
        if poll.registry().register(stream.source(), Token(token), Interest::READABLE).is_ok() {
            self.open.insert(token, Client { stream, input: Vec::new(), reply: Vec::new(), written: 0, since_ns: now });
        }
    }

    /// The client of `token` is readable or writable. Returns its request once it is whole
    /// (answer it with [`Clients::answer`]).
    pub fn on_event(&mut self, token: usize, poll: &Poll) -> Option<Ask> {
        let c = self.open.get_mut(&token)?;
        if !c.reply.is_empty() {
            self.send(token, poll);
            return None;
        }
        let closed = match read_available(c.stream.io(), &mut c.input) {
            Ok(closed) => closed,
            Err(why) => {
                self.close(token, why, poll);
                return None;
            }
        };
        match c.stream {
            Stream::Control(_) => crate::control::parse_request(&c.input).map(Ask::Control),
            // Any request gets the metrics; answer once its headers are in.
            Stream::Http(_) if closed || c.input.windows(4).any(|w| w == b"\r\n\r\n") => Some(Ask::Metrics),
            Stream::Http(_) => None,
        }
    }

    /// Answers the request of `token`: a control reply, or the metrics text.
    pub fn answer(&mut self, token: usize, answer: Answer, poll: &Poll) {
        let Some(c) = self.open.get_mut(&token) else { return };
        c.reply = match (&c.stream, answer) {
            (Stream::Control(_), Answer::Control(r)) => {
                let mut v = serde_json::to_vec(&r).unwrap_or_default();
                v.push(b'\n');
                v
            }
            (Stream::Http(_), Answer::Metrics(body)) => format!(
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes(),
            _ => return self.close(token, "internal: answer of the wrong kind", poll),
        };
        self.send(token, poll);
    }

    /// Writes what the socket takes of the reply; closes the client once all of it is out (or
    /// the client is gone), else waits for WRITABLE.
    fn send(&mut self, token: usize, poll: &Poll) {
        let Some(c) = self.open.get_mut(&token) else { return };
        while c.written < c.reply.len() {
            match c.stream.io().write(&c.reply[c.written..]) {
                Ok(0) => break,
                Ok(n) => c.written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let _ = poll.registry().reregister(c.stream.source(), Token(token), Interest::WRITABLE);
                    return;
                }
                Err(_) => break,
            }
        }
        self.close(token, "answered", poll);
    }

    /// Closes clients that have taken longer than CLIENT_TIMEOUT_NS.
    pub fn expire(&mut self, now: u64, poll: &Poll) {
        let old: Vec<usize> =
            self.open.iter().filter(|(_, c)| now >= c.since_ns + CLIENT_TIMEOUT_NS).map(|(t, _)| *t).collect();
        for t in old {
            self.close(t, "client timed out", poll);
        }
    }

    fn close(&mut self, token: usize, why: &str, poll: &Poll) {
        if let Some(mut c) = self.open.remove(&token) {
            let _ = poll.registry().deregister(c.stream.source());
            debug!("client {token}: {why}");
        }
    }

    /// Removes the control socket (shutdown).
    pub fn unbind(&mut self) {
        let _ = fs::remove_file(&self.control_path);
    }
}

/// Appends what a non-blocking stream has to `input`. Returns whether the peer closed its end,
/// or why the connection should be dropped.
fn read_available(stream: &mut dyn Read, input: &mut Vec<u8>) -> Result<bool, &'static str> {
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Ok(true),
            Ok(n) => {
                input.extend_from_slice(&buf[..n]);
                if input.len() > MAX_REQUEST {
                    return Err("request too long");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err("read error"),
        }
    }
}
