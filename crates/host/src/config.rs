//! The daemon's TOML configuration (`/etc/cosched/host.toml` by default).
//!
//! Every key has a default; a missing default config file means defaults, a missing file given
//! with `--config` is an error, and unknown keys are errors (a typo must not silently fall back).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use cosched_core::Policy;
use serde::{Deserialize, Serialize};

use crate::actuator::BoostClass;

pub const DEFAULT_CONFIG: &str = "/etc/cosched/host.toml";
pub const DEFAULT_SOCKET_DIR: &str = "/run/cosched/vms";
pub const DEFAULT_STATE_DIR: &str = "/run/cosched/state";
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/cosched/control.sock";

/// Operator settings for one VM, by name (`[vm.<name>]`; the name is the socket file's name
/// without `.sock`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VmConfig {
    pub enabled: Option<bool>,
    pub priority: Option<u8>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HostConfig {
    /// Where QEMU's chardev sockets for cosched live; every socket in it is a VM.
    pub socket_dir: PathBuf,
    /// Where original thread attributes are kept until restored (a tmpfs: `/run`).
    pub state_dir: PathBuf,
    /// The root-only control socket used by `cosched status`, `cosched vm ...`.
    pub control_socket: PathBuf,
    /// Also serve Prometheus metrics over HTTP at this address (e.g. `127.0.0.1:9477`).
    pub metrics_listen: Option<String>,
    /// How often the socket directory is rescanned (inotify catches most changes at once).
    pub rescan_ms: u64,
    /// How often a boosted VM's thread list is re-read to boost threads that appeared.
    pub thread_refresh_ms: u64,
    /// Coordination on at start (`cosched enable` / `disable` change it at run time).
    pub enabled: bool,
    /// The daemon runs at `SCHED_FIFO` with this priority, above every VM it boosts, so that
    /// boosted VMs cannot delay their own deboost; 0 leaves it at `SCHED_OTHER`.
    pub daemon_priority: u8,
    pub policy: Policy,
    pub boost: BoostClass,
    pub vm: BTreeMap<String, VmConfig>,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            socket_dir: DEFAULT_SOCKET_DIR.into(),
            state_dir: DEFAULT_STATE_DIR.into(),
            control_socket: DEFAULT_CONTROL_SOCKET.into(),
            metrics_listen: None,
            rescan_ms: 1000,
            thread_refresh_ms: 100,
            enabled: true,
            daemon_priority: 99,
            policy: Policy::default(),
            boost: BoostClass::default(),
            vm: BTreeMap::new(),
        }
    }
}

impl HostConfig {
    /// Loads `path`; `None` means the default path, which may be absent.
    pub fn load(path: Option<&Path>) -> anyhow::Result<HostConfig> {
        let (path, explicit) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => return Ok(HostConfig::default()),
            Err(e) => return Err(e).with_context(|| format!("reading config {}", path.display())),
        };
        let cfg: HostConfig = toml::from_str(&text).with_context(|| format!("parsing config {}", path.display()))?;
        cfg.validate().with_context(|| format!("in config {}", path.display()))?;
        Ok(cfg)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        self.policy.validate().map_err(anyhow::Error::msg).context("[policy]")?;
        self.boost.validate().map_err(anyhow::Error::msg).context("[boost]")?;
        for (name, vm) in &self.vm {
            if let Some(p) = vm.priority {
                if !(1..=98).contains(&p) {
                    bail!("[vm.{name}] priority = {p}: must be 1..=98");
                }
            }
        }
        if self.daemon_priority > 99 {
            bail!("daemon_priority = {}: must be 0 (SCHED_OTHER) or 1..=99", self.daemon_priority);
        }
        let highest_vm =
            self.vm.values().filter_map(|v| v.priority).max().unwrap_or(0).max(self.policy.default_priority)
                + self.boost.other_threads_priority_offset;
        if self.daemon_priority != 0 && self.daemon_priority <= highest_vm {
            bail!(
                "daemon_priority = {} must be above every boosted thread's priority ({highest_vm}), or 0",
                self.daemon_priority
            );
        }
        if self.rescan_ms == 0 || self.thread_refresh_ms == 0 {
            bail!("rescan_ms and thread_refresh_ms must be > 0");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_example_parses() {
        let cfg: HostConfig = toml::from_str(
            r#"
            socket_dir = "/tmp/vms"
            [policy]
            max_continuous_boost_ms = 500
            [boost]
            policy = "fifo"
            [vm.web1]
            enabled = false
            [vm.rt]
            priority = 10
            "#,
        )
        .unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.socket_dir, PathBuf::from("/tmp/vms"));
        assert_eq!(cfg.policy.max_continuous_boost_ms, 500);
        assert_eq!(cfg.vm["web1"].enabled, Some(false));
        assert_eq!(cfg.vm["rt"].priority, Some(10));
    }

    #[test]
    fn missing_default_is_defaults_but_missing_explicit_is_an_error() {
        let err = HostConfig::load(Some(Path::new("/nonexistent/host.toml"))).unwrap_err();
        assert!(format!("{err:#}").contains("/nonexistent/host.toml"));
    }

    #[test]
    fn bad_values_name_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "[vm.x]\npriority = 0\n").unwrap();
        assert!(format!("{:#}", HostConfig::load(Some(&p)).unwrap_err()).contains("[vm.x] priority"));
        std::fs::write(&p, "[policy]\ndefault_priority = 99\n").unwrap();
        assert!(format!("{:#}", HostConfig::load(Some(&p)).unwrap_err()).contains("default_priority"));
        std::fs::write(&p, "[boost]\npolicy = \"deadline\"\ndeadline_runtime_us = 1\n").unwrap();
        let e = format!("{:#}", HostConfig::load(Some(&p)).unwrap_err());
        assert!(e.contains("[boost]") && e.contains("deadline_runtime_us = 1") && e.contains("1024 ns"), "{e}");
        std::fs::write(&p, "sockt_dir = \"/x\"\n").unwrap();
        assert!(format!("{:#}", HostConfig::load(Some(&p)).unwrap_err()).contains("unknown field"));
    }
}
