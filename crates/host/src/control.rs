//! The control socket: one JSON request per connection, one JSON reply, both a single line.
//!
//! The socket is created mode 0600 and the daemon also checks the peer's uid (root, or the user
//! the daemon runs as: see [`crate::caps`]): the operator interface must not be reachable by a
//! guest or an unprivileged user.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    Status,
    Metrics,
    /// Coordination on, for the whole host (`vm: None`) or one VM (name or QEMU pid), for every
    /// resource (`resource: None`) or one (`cpu`, `io`, `membw`, `event`).
    Enable {
        vm: Option<String>,
        #[serde(default)]
        resource: Option<String>,
    },
    /// With `all` (host-wide only): every VM's static tunings off too, until `Enable` of every
    /// resource.
    Disable {
        vm: Option<String>,
        #[serde(default)]
        resource: Option<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        all: bool,
    },
    /// Read the config file again and apply what changed (`cosched reload`, SIGHUP); the reply
    /// is a `cosched_host::reload::Changes`.
    Reload,
    /// Drop the operator's settings of one VM (name or QEMU pid) or, without `vm`, every one,
    /// host-wide too: back to the config. The reply is a `cosched_host::reload::Changes`.
    Reset {
        #[serde(default)]
        vm: Option<String>,
    },
    Priority {
        vm: String,
        priority: u8,
    },
    /// Static tunings of one VM: `fifo` on/off, `shield` a CPU list or `off` (`None`: unchanged).
    Static {
        vm: String,
        #[serde(default)]
        fifo: Option<bool>,
        #[serde(default)]
        shield: Option<String>,
        /// The real-time guard on the static FIFO vCPUs.
        #[serde(default)]
        guard: Option<bool>,
    },
    /// The highest host priority the VM's guest priorities map to (`[rt]`).
    Ceiling {
        vm: String,
        ceiling: u8,
    },
    /// One VM's guaranteed memory-bandwidth share, permille of the host's guaranteed bandwidth.
    MembwShare {
        vm: String,
        share: u64,
    },
    /// The memory-bandwidth regulation's period, reclaim and best effort (`None`: unchanged).
    Membw {
        #[serde(default)]
        period_ms: Option<u64>,
        #[serde(default)]
        reclaim: Option<bool>,
        #[serde(default)]
        best_effort: Option<bool>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

impl Reply {
    pub fn ok(data: Option<serde_json::Value>) -> Reply {
        Reply { ok: true, error: None, data }
    }
    pub fn err(msg: impl Into<String>) -> Reply {
        Reply { ok: false, error: Some(msg.into()), data: None }
    }
    /// A success carrying `data` as JSON.
    pub fn with(data: &impl Serialize) -> Reply {
        match serde_json::to_value(data) {
            Ok(v) => Reply::ok(Some(v)),
            Err(e) => Reply::err(format!("writing the reply: {e}")),
        }
    }
}

/// The reply to [`Request::Metrics`]: the Prometheus text (the reply to [`Request::Status`] is a
/// `cosched_status::Status`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsReply {
    pub text: String,
}

/// The request in a control client's input so far: `None` until a whole line is in; the line
/// parsed, or why it is not a request. What the daemon does with every control connection (and
/// what the fuzzer feeds).
pub fn parse_request(input: &[u8]) -> Option<Result<Request, RequestError>> {
    let nl = input.iter().position(|b| *b == b'\n')?;
    let line = String::from_utf8_lossy(&input[..nl]);
    Some(serde_json::from_str::<Request>(&line).map_err(RequestError))
}

/// A control line that is not a request: the JSON parser's error (what and where in the line).
#[derive(Debug, thiserror::Error)]
#[error("bad request: {0}")]
pub struct RequestError(pub serde_json::Error);

/// Why a control request got no answer, or what the daemon said against it.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Nothing listens at the socket (no file, or no daemon behind it): the daemon is not
    /// running (`cosched` exits 3 for it, as systemctl does for a unit that is not active).
    #[error("the cosched host daemon is not running: nothing listens at {} ({error}); start it with `systemctl start cosched-host` (without systemd: `cosched host`)", .socket.display())]
    NotRunning { socket: PathBuf, error: io::Error },
    /// The socket is there but this user may not connect (root and the daemon's own user may).
    #[error("cannot connect to the cosched host daemon at {}: {error} (the control socket accepts root and the user the daemon runs as)", .socket.display())]
    Connect { socket: PathBuf, error: io::Error },
    /// The exchange broke off (a write, a read or the 10 s timeout).
    #[error("talking to the cosched host daemon at {}: {error}", .socket.display())]
    Io { socket: PathBuf, error: io::Error },
    /// The reply is not the protocol's.
    #[error("bad reply from the daemon: {reply:?}: {error}")]
    BadReply { reply: String, error: serde_json::Error },
    /// The daemon refused the request, saying why.
    #[error("{0}")]
    Refused(String),
}

impl ControlError {
    /// Whether it means that no daemon is running.
    pub fn not_running(&self) -> bool {
        matches!(self, ControlError::NotRunning { .. })
    }
}

/// Sends `req` to the daemon at `socket` and returns its data, or its error as an error.
pub fn request(socket: &Path, req: &Request) -> Result<Option<serde_json::Value>, ControlError> {
    let io = |error| ControlError::Io { socket: socket.to_path_buf(), error };
    let mut s = UnixStream::connect(socket).map_err(|error| match error.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
            ControlError::NotRunning { socket: socket.to_path_buf(), error }
        }
        _ => ControlError::Connect { socket: socket.to_path_buf(), error },
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(io)?;
    let mut line = serde_json::to_string(req).expect("a request is plain JSON");
    line.push('\n');
    s.write_all(line.as_bytes()).map_err(io)?;
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply).map_err(io)?;
    let parsed: Reply =
        serde_json::from_str(&reply).map_err(|error| ControlError::BadReply { reply: reply.clone(), error })?;
    if !parsed.ok {
        return Err(ControlError::Refused(parsed.error.unwrap_or_else(|| "request failed".into())));
    }
    Ok(parsed.data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_one_json_line() {
        let r = Request::Priority { vm: "web1".into(), priority: 5 };
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(s, r#"{"cmd":"priority","vm":"web1","priority":5}"#);
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"enable","vm":null}"#).unwrap(),
            Request::Enable { vm: None, resource: None }
        );
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"reboot"}"#).is_err());
    }

    #[test]
    fn a_request_is_parsed_once_its_line_is_whole() {
        assert!(parse_request(br#"{"cmd":"sta"#).is_none());
        assert_eq!(
            parse_request(b"{\"cmd\":\"status\"}\n{\"cmd\":\"metrics\"}").map(Result::ok),
            Some(Some(Request::Status))
        );
        assert!(parse_request(b"\xff\xfe\n").unwrap().unwrap_err().to_string().starts_with("bad request: "));
    }
}
