//! The control socket: one JSON request per connection, one JSON reply, both a single line.
//!
//! The socket is created mode 0600 and the daemon also checks the peer's uid (root, or the user
//! the daemon runs as: see [`crate::caps`]): the operator interface must not be reachable by a
//! guest or an unprivileged user.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
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

/// Sends `req` to the daemon at `socket` and returns its data, or its error as an error.
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

pub fn request(socket: &Path, req: &Request) -> anyhow::Result<Option<serde_json::Value>> {
    let mut s = UnixStream::connect(socket).with_context(|| {
        format!(
            "cannot reach the cosched host daemon at {} (is `cosched host` running? are you root?)",
            socket.display()
        )
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut line = serde_json::to_string(req)?;
    line.push('\n');
    s.write_all(line.as_bytes())?;
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply).context("reading the daemon's reply")?;
    let reply: Reply = serde_json::from_str(&reply).with_context(|| format!("bad reply from daemon: {reply:?}"))?;
    if !reply.ok {
        bail!("{}", reply.error.unwrap_or_else(|| "request failed".into()));
    }
    Ok(reply.data)
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
