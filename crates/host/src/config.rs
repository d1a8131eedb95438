//! The daemon's TOML configuration (`/etc/cosched/host.toml` by default).
//!
//! Every key has a default; a missing default config file means defaults, a missing file given
//! with `--config` is an error, and unknown keys are errors (a typo must not silently fall back).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use cosched_core::{check_priority, ConfigError as CoreError, FeasConfig, Policy, RtConfig, VmSettings};
use cosched_proto::Resource;
use serde::{Deserialize, Serialize};

use crate::actuator::{BoostClass, IoBoost};
use crate::shield::CpuListError;

pub mod check;

pub const DEFAULT_CONFIG: &str = "/etc/cosched/host.toml";
pub const DEFAULT_SOCKET_DIR: &str = "/run/cosched/vms";
pub const DEFAULT_STATE_DIR: &str = "/run/cosched/state";
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/cosched/control.sock";

/// Operator settings for one VM, by name (`[vm.<name>]`; the name is the socket file's name
/// without `.sock`, or QEMU's `-name`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VmConfig {
    /// Every resource on or off for this VM.
    pub enabled: Option<bool>,
    pub priority: Option<u8>,
    /// The highest host priority this VM's guest priorities map to (`[rt] rt_ceiling` if unset).
    pub rt_ceiling: Option<u8>,
    /// One resource on or off for this VM (`[vm.<name>.resources] io = false`); wins over `enabled`.
    pub resources: BTreeMap<String, bool>,
    /// Its guaranteed share of the host's memory bandwidth (permille of `[membw]
    /// guaranteed_mbps`; `[membw] default_share_permille` if unset). A guest's `MEMBW` request
    /// replaces it while it stands.
    pub membw_share: Option<u64>,
    /// Static real-time tunings for as long as the VM runs (`[vm.<name>.static]`).
    #[serde(rename = "static")]
    pub statics: StaticConfig,
}

/// `[vm.<name>.static]`: the static real-time tunings of one VM (Performance Tuning, docs/references.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StaticConfig {
    /// `SCHED_FIFO` for every thread of the VM: the vCPUs at `vcpu_priority`, the others (main
    /// loop, I/O threads) at `other_priority`.
    pub fifo: bool,
    pub vcpu_priority: u8,
    pub other_priority: u8,
    /// Dedicated host CPUs for the vCPU threads (a CPU list: `"1"`, `"2-3"`); the VM's other
    /// threads, IRQs and `[shield] host_groups` leave them.
    pub shield: Option<String>,
    /// The real-time guard on the static FIFO vCPUs (`[policy] rt_guard_*`): at most that share
    /// of every window at `SCHED_FIFO`, the rest at `[boost] guard_nice`, so that the kernel's RT
    /// throttling never stops the VM. Off: the throttle bounds them (the Performance Tuning paper's tuning as is).
    pub guard: bool,
}

impl Default for StaticConfig {
    fn default() -> Self {
        StaticConfig { fifo: false, vcpu_priority: 97, other_priority: 98, shield: None, guard: false }
    }
}

impl StaticConfig {
    pub fn is_empty(&self) -> bool {
        !self.fifo && self.shield.is_none()
    }

    /// Checks the priorities (below the daemon's own) and the CPU list; `at` begins the
    /// error's key (`[vm.NAME.static]`, or `vm NAME:` for an operator's command).
    pub fn validate(&self, at: &str, daemon_priority: u8) -> Result<(), ConfigError> {
        for (key, p) in [("vcpu_priority", self.vcpu_priority), ("other_priority", self.other_priority)] {
            if !(1..=99).contains(&p) {
                return Err(CoreError::invalid(format!("{at} {key}"), p, "a SCHED_FIFO priority is 1..=99").into());
            }
            if self.fifo && daemon_priority != 0 && p >= daemon_priority {
                return Err(CoreError::conflict(
                    format!("{at} {key}"),
                    p,
                    format!("below daemon_priority ({daemon_priority}), which must stay above every VM"),
                )
                .into());
            }
        }
        if let Some(cpus) = &self.shield {
            let set = crate::shield::parse_cpus(cpus)
                .map_err(|error| ConfigError::CpuList { key: format!("{at} shield"), error })?;
            if set.is_empty() {
                let rule = "names no CPU (leave it out for no shield)";
                return Err(CoreError::invalid(format!("{at} shield"), format!("{cpus:?}"), rule).into());
            }
        }
        Ok(())
    }
}

impl VmConfig {
    /// The coordinator's settings for this VM.
    pub fn settings(&self, default_priority: u8) -> VmSettings {
        let mut s = VmSettings { disabled: 0, priority: self.priority.unwrap_or(default_priority) };
        if self.enabled == Some(false) {
            s.disabled = !0;
        }
        for (name, on) in &self.resources {
            if let Some(r) = Resource::from_name(name) {
                s.set_enabled(r, *on);
            }
        }
        s
    }
}

/// Checks that every key of a `resources` table names a resource.
fn check_resource_names<'a>(at: &str, names: impl Iterator<Item = &'a String>) -> Result<(), ConfigError> {
    for name in names {
        if Resource::from_name(name).is_none() {
            return Err(ConfigError::UnknownResource { at: at.to_string(), name: name.clone() });
        }
    }
    Ok(())
}

/// A host setting that cannot be: the core's shapes (the key, the value and the rule broken)
/// and the host's own. The messages are the ones `cosched host` has always printed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Core(#[from] CoreError),
    /// A section's own check failed: the section (`[policy]`, `[boost]`), then why.
    #[error("{section}: {error}")]
    In { section: &'static str, error: Box<ConfigError> },
    /// A nice value outside the kernel's range.
    #[error("{key} = {value} out of range -20..=19")]
    Nice { key: &'static str, value: i32 },
    /// A `resources` table (`at`) names no resource.
    #[error("{at}: unknown resource {name:?} (known: {})", cosched_core::error::known_resources())]
    UnknownResource { at: String, name: String },
    /// A CPU list that does not parse.
    #[error("{key}: {error}")]
    CpuList { key: String, error: CpuListError },
    /// Two VMs shielded on one CPU.
    #[error("[vm.{vm}.static] shield: CPU {cpu} is already shielded for VM {other}")]
    SharedCpu { vm: String, cpu: usize, other: String },
    /// A static guard without the guard's rule.
    #[error("[vm.{vm}.static] guard = true needs the guard's rule: [policy] rt_guard_max_share_permille > 0")]
    GuardWithoutRule { vm: String },
    /// The VMs' memory-bandwidth shares together are more than can be guaranteed.
    #[error(
        "[vm.*] membw_share add up to {total}‰: more than the host's guaranteed bandwidth (1000‰) can be guaranteed"
    )]
    SharesOver { total: u64 },
    /// An address the metrics endpoint cannot listen on (the daemon binds an IP and a port; it
    /// does not resolve host names).
    #[error(
        "metrics_listen = {value:?}: not an IP address and port like \"127.0.0.1:9477\" or \"[::1]:9477\" \
         ({error}; host names are not resolved)"
    )]
    Listen { value: String, error: std::net::AddrParseError },
    /// Simulated memory bandwidth without the trace it replays.
    #[error("[membw] backend = \"simulated\" needs trace = \"<file>\"")]
    SimulatedWithoutTrace,
    /// Simulated memory bandwidth with MBA, which cannot slow what it counts.
    #[error(
        "[membw] throttle = \"mba\" needs real counters: simulated bandwidth follows the vCPUs' run time, which MBA \
         does not stop (use throttle = \"freezer\" or \"auto\")"
    )]
    SimulatedWithMba,
}

impl ConfigError {
    /// `error` in `section`.
    pub fn within(section: &'static str) -> impl FnOnce(ConfigError) -> ConfigError {
        move |error| ConfigError::In { section, error: Box::new(error) }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HostConfig {
    /// Where QEMU's chardev sockets for cosched live; every socket in it is a VM.
    pub socket_dir: PathBuf,
    /// Where original thread attributes are kept until restored (a tmpfs: `/run`).
    pub state_dir: PathBuf,
    /// The control socket used by `cosched status`, `cosched vm ...`: root and the daemon's own
    /// user only (checked by the peer's credentials, whatever the socket's mode).
    pub control_socket: PathBuf,
    /// Also serve Prometheus metrics over HTTP at this address (e.g. `127.0.0.1:9477`).
    pub metrics_listen: Option<String>,
    /// Also find QEMU processes that have no socket in `socket_dir` (guests without an agent,
    /// libvirt domains without the channel), every `rescan_ms`, so that `[vm.NAME]` (by QEMU's
    /// `-name`) and host-side features reach them. Only root-owned QEMU binaries are adopted.
    pub discover_processes: bool,
    /// Also find the domains libvirt runs (their `<domain>.pid` in `libvirt_dir`), channel or
    /// not, every `rescan_ms`, named by the domain: libvirt's domains only, where
    /// `discover_processes` takes every QEMU on the host.
    pub discover_libvirt: bool,
    /// libvirt's run directory for QEMU domains.
    pub libvirt_dir: PathBuf,
    /// How often the socket directory (and the processes) are rescanned (inotify catches most
    /// socket changes at once).
    pub rescan_ms: u64,
    /// Without thread events (see `thread_events`): how often a boosted VM's thread list is
    /// re-read to boost threads that appeared, and how long a listing is trusted before a change.
    pub thread_refresh_ms: u64,
    /// See threads being created, renamed and exiting as it happens (host BPF on the scheduler's
    /// thread tracepoints, filtered to the VMs' processes) instead of re-reading thread lists
    /// every `thread_refresh_ms`. Falls back to re-reading, with a warning, where BPF is refused.
    pub thread_events: bool,
    /// How long the attributes of a VM's threads as the daemon knows them are trusted before a
    /// change reads them again (to take in what someone else changed); between two reads a
    /// transition costs one sched_setattr per thread that changes and nothing else.
    pub thread_verify_ms: u64,
    /// Coordination on at start, every resource (`cosched enable` / `disable` change it at run time).
    pub enabled: bool,
    /// One resource on or off at start (`[resources] io = false`); wins over `enabled`.
    pub resources: BTreeMap<String, bool>,
    /// The daemon runs at `SCHED_FIFO` with this priority, above every VM it boosts, so that
    /// boosted VMs cannot delay their own deboost; 0 leaves it at `SCHED_OTHER`.
    pub daemon_priority: u8,
    pub policy: Policy,
    pub boost: BoostClass,
    /// I/O coordination (Virtual-BFQ): how a VM whose guest BFQ weight-raises is raised here.
    pub io: IoBoost,
    /// Event boosting (FEAS) for guests without an agent: which VMs, `n_limit` per cycle, the
    /// slice, the charging.
    pub event: FeasConfig,
    /// RT co-scheduling with the guest's priority and predictive boost.
    pub rt: RtConfig,
    /// Where cgroup hierarchies are mounted (v1 controllers at `<dir>/<controller>`, or v2 at
    /// `<dir>`): the `weight` I/O lever makes and weights groups there.
    pub cgroup_root: PathBuf,
    /// CPU shielding's host-wide side: what leaves the VMs' dedicated CPUs.
    pub shield: crate::shield::ShieldConfig,
    /// Memory-bandwidth regulation: the backend, the host's guaranteed bandwidth, the period,
    /// reclaim and best effort.
    pub membw: crate::membw::MembwConfig,
    /// Where resctrl is mounted (its memory-bandwidth allocation is probed there).
    pub resctrl_root: PathBuf,
    pub vm: BTreeMap<String, VmConfig>,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            socket_dir: DEFAULT_SOCKET_DIR.into(),
            state_dir: DEFAULT_STATE_DIR.into(),
            control_socket: DEFAULT_CONTROL_SOCKET.into(),
            metrics_listen: None,
            discover_processes: false,
            discover_libvirt: false,
            libvirt_dir: "/run/libvirt/qemu".into(),
            rescan_ms: 1000,
            thread_refresh_ms: 100,
            thread_events: true,
            thread_verify_ms: 1000,
            enabled: true,
            resources: BTreeMap::new(),
            daemon_priority: 99,
            policy: Policy::default(),
            boost: BoostClass::default(),
            io: IoBoost::default(),
            event: FeasConfig::default(),
            rt: RtConfig::default(),
            cgroup_root: "/sys/fs/cgroup".into(),
            shield: crate::shield::ShieldConfig::default(),
            membw: crate::membw::MembwConfig::default(),
            resctrl_root: "/sys/fs/resctrl".into(),
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

    /// Whether `r` is on at start.
    pub fn starts_enabled(&self, r: Resource) -> bool {
        self.resources.get(r.name()).copied().unwrap_or(self.enabled)
    }

    /// `[policy]` as the coordinator gets it: no real-time guard where the boost class puts no
    /// vCPU at a real-time class (`SCHED_DEADLINE`, nice).
    pub fn coordinator_policy(&self) -> Policy {
        let mut policy = self.policy.clone();
        if !self.boost.policy.needs_rt_guard() {
            policy.rt_guard_max_share_permille = 0;
        }
        policy
    }

    /// The settings of the VM named `name` (its `[vm.<name>]`, or the defaults).
    pub fn vm_settings(&self, name: &str) -> VmSettings {
        self.vm.get(name).cloned().unwrap_or_default().settings(self.policy.default_priority)
    }

    /// The first of [`HostConfig::problems`], if any: what the daemon refuses to start with.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.problems().into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Every check of the settings that fails, in the order the daemon checks them (a section's
    /// own checks stop at its first error): what `cosched check-config` lists.
    pub fn problems(&self) -> Vec<ConfigError> {
        let mut out = Vec::new();
        let mut check = |r: Result<(), ConfigError>| out.extend(r.err());
        check(self.policy.validate().map_err(ConfigError::from).map_err(ConfigError::within("[policy]")));
        check(self.boost.validate().map_err(ConfigError::within("[boost]")));
        check(self.io.validate().map_err(ConfigError::from));
        check(self.event.validate().map_err(ConfigError::from));
        check(self.membw.validate());
        check(self.validate_membw_shares());
        check(check_resource_names("[resources]", self.resources.keys()));
        for (name, vm) in &self.vm {
            if let Some(p) = vm.priority {
                check(check_priority(&format!("[vm.{name}] priority"), p).map_err(ConfigError::from));
            }
            check(check_resource_names(&format!("[vm.{name}.resources]"), vm.resources.keys()));
            check(vm.statics.validate(&format!("[vm.{name}.static]"), self.daemon_priority));
            if vm.statics.guard && self.policy.rt_guard().is_none() {
                check(Err(ConfigError::GuardWithoutRule { vm: name.clone() }));
            }
        }
        if let Some(hk) = &self.shield.housekeeping_cpus {
            check(
                crate::shield::parse_cpus(hk)
                    .map(drop)
                    .map_err(|error| ConfigError::CpuList { key: "[shield] housekeeping_cpus".into(), error }),
            );
        }
        let mut taken: BTreeMap<usize, &str> = BTreeMap::new();
        for (name, vm) in &self.vm {
            let cpus = vm.statics.shield.as_deref().map(crate::shield::parse_cpus).transpose().ok().flatten();
            for c in cpus.unwrap_or_default() {
                if let Some(other) = taken.insert(c, name) {
                    check(Err(ConfigError::SharedCpu { vm: name.clone(), cpu: c, other: other.to_string() }));
                    break;
                }
            }
        }
        check(self.validate_daemon_priority());
        check(self.validate_rt());
        if self.rescan_ms == 0 || self.thread_refresh_ms == 0 {
            check(Err(CoreError::range("rescan_ms and thread_refresh_ms", "> 0").into()));
        }
        if let Some(addr) = &self.metrics_listen {
            if let Err(error) = addr.parse::<std::net::SocketAddr>() {
                check(Err(ConfigError::Listen { value: addr.clone(), error }));
            }
        }
        out
    }

    fn validate_daemon_priority(&self) -> Result<(), ConfigError> {
        if self.daemon_priority > 99 {
            let rule = "must be 0 (SCHED_OTHER) or 1..=99";
            return Err(CoreError::invalid("daemon_priority", self.daemon_priority, rule).into());
        }
        let highest_vm =
            self.vm.values().filter_map(|v| v.priority).max().unwrap_or(0).max(self.policy.default_priority)
                + self.boost.other_threads_priority_offset;
        if self.daemon_priority != 0 && self.daemon_priority <= highest_vm {
            let rule = format!("above every boosted thread's priority ({highest_vm}), or 0");
            return Err(CoreError::conflict("daemon_priority", self.daemon_priority, rule).into());
        }
        Ok(())
    }
}

impl HostConfig {
    /// A VM's memory-bandwidth share from the config (permille).
    pub fn membw_share(&self, name: &str) -> u64 {
        self.vm.get(name).and_then(|v| v.membw_share).unwrap_or(self.membw.default_share_permille)
    }

    /// The configured shares fit in the guaranteed bandwidth (1000‰), each VM alone and the
    /// named ones together (the default share is checked as VMs come, by admission).
    fn validate_membw_shares(&self) -> Result<(), ConfigError> {
        let mut total = 0;
        for (name, vm) in &self.vm {
            if let Some(s) = vm.membw_share {
                if s > 1000 {
                    let rule = "at most 1000 (permille of [membw] guaranteed_mbps)";
                    return Err(CoreError::invalid(format!("[vm.{name}] membw_share"), s, rule).into());
                }
                total += s;
            }
        }
        if total > 1000 {
            return Err(ConfigError::SharesOver { total });
        }
        Ok(())
    }

    /// `[rt]` as the coordinator gets it: an unset `rt_ceiling` is the default (49) or, if the
    /// daemon's priority is lower, just below it and the other threads' offset.
    pub fn rt(&self) -> RtConfig {
        let mut rt = self.rt.clone();
        if rt.rt_ceiling.is_none() && self.daemon_priority != 0 {
            let below = self.daemon_priority.saturating_sub(1 + self.boost.other_threads_priority_offset).max(1);
            rt.rt_ceiling = Some(rt.ceiling().min(below));
        }
        rt
    }

    /// `[rt]` and the per-VM ceilings: in range, and with the other threads' offset below the
    /// daemon's own priority.
    fn validate_rt(&self) -> Result<(), ConfigError> {
        self.rt.validate()?;
        // An unset [rt] rt_ceiling is lowered below the daemon's priority (`HostConfig::rt`).
        let mut highest = ("[rt] rt_ceiling".to_string(), self.rt().ceiling());
        for (name, vm) in &self.vm {
            if let Some(c) = vm.rt_ceiling {
                let at = format!("[vm.{name}] rt_ceiling");
                check_priority(&at, c)?;
                if c > highest.1 {
                    highest = (at, c);
                }
            }
        }
        let top = highest.1 + self.boost.other_threads_priority_offset;
        if self.daemon_priority != 0 && self.daemon_priority <= top {
            let rule = format!(
                "with other_threads_priority_offset = {} it reaches {top}, not below daemon_priority = {}",
                self.boost.other_threads_priority_offset, self.daemon_priority
            );
            return Err(CoreError::invalid(highest.0, highest.1, rule).into());
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
    fn a_static_guard_needs_the_guards_rule() {
        let cfg: HostConfig = toml::from_str("[vm.a.static]\nfifo = true\nguard = true\n").unwrap();
        cfg.validate().unwrap();
        assert!(cfg.vm["a"].statics.guard);
        let cfg: HostConfig =
            toml::from_str("[policy]\nrt_guard_max_share_permille = 0\n[vm.a.static]\nfifo = true\nguard = true\n")
                .unwrap();
        let e = format!("{:#}", cfg.validate().unwrap_err());
        assert!(e.contains("guard = true needs") && e.contains("rt_guard_max_share_permille"), "{e}");
    }

    #[test]
    fn per_resource_switches_globally_and_per_vm() {
        let cfg: HostConfig = toml::from_str(
            "enabled = false\n[resources]\ncpu = true\n[vm.a]\nenabled = false\n[vm.a.resources]\nio = true\n\
             [vm.b.resources]\ncpu = false\n[policy.resource.io]\nmax_continuous_boost_ms = 50\n",
        )
        .unwrap();
        cfg.validate().unwrap();
        assert!(cfg.starts_enabled(Resource::Cpu) && !cfg.starts_enabled(Resource::Io));
        let a = cfg.vm_settings("a");
        assert!(a.enabled(Resource::Io) && !a.enabled(Resource::Cpu));
        let b = cfg.vm_settings("b");
        assert!(!b.enabled(Resource::Cpu) && b.enabled(Resource::Io) && b.priority == 1);
        assert!(cfg.vm_settings("other").enabled(Resource::Cpu));
        assert_eq!(cfg.policy.limits(Resource::Io).max_continuous_ns, 50_000_000);
        assert_eq!(cfg.policy.limits(Resource::Cpu).max_continuous_ns, 10_000_000_000);
    }

    #[test]
    fn rt_section_and_per_vm_ceilings() {
        let cfg: HostConfig = toml::from_str(
            "[rt]\npriority_map = \"linear\"\nrt_ceiling = 60\npredict_hold_us = 500\n[vm.a]\nrt_ceiling = 70\n",
        )
        .unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.rt.priority_map, cosched_core::PriorityMap::Linear);
        assert_eq!((cfg.rt.rt_ceiling, cfg.rt.predict_hold_us, cfg.vm["a"].rt_ceiling), (Some(60), 500, Some(70)));
        let bad = |text: &str| format!("{:#}", toml::from_str::<HostConfig>(text).unwrap().validate().unwrap_err());
        let e = bad("daemon_priority = 50\n[rt]\nrt_ceiling = 50\n");
        assert!(e.contains("[rt] rt_ceiling = 50") && e.contains("not below daemon_priority = 50"), "{e}");
        let e = bad("[boost]\nother_threads_priority_offset = 2\n[vm.x]\nrt_ceiling = 97\n");
        assert!(e.contains("[vm.x] rt_ceiling = 97: with other_threads_priority_offset = 2 it reaches 99"), "{e}");
        assert!(bad("[vm.x]\nrt_ceiling = 0\n").contains("[vm.x] rt_ceiling = 0: out of range"));
        // Unset, the ceiling stays below a low daemon priority.
        let low: HostConfig =
            toml::from_str("daemon_priority = 20\n[boost]\nother_threads_priority_offset = 1\n").unwrap();
        low.validate().unwrap();
        assert_eq!(low.rt().ceiling(), 18);
        assert_eq!(HostConfig::default().rt().ceiling(), 49);
        assert!(bad("[rt]\npredict_lead_min_us = 3000\n").contains("predict_lead_min_us = 3000 must be at most"));
        assert!(toml::from_str::<HostConfig>("[rt]\npriority_map = \"fast\"\n").is_err());
        assert!(toml::from_str::<HostConfig>("[rt]\nceiling = 5\n").is_err(), "unknown keys are errors");
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
        std::fs::write(&p, "[vm.x.resources]\ndisk = false\n").unwrap();
        let e = format!("{:#}", HostConfig::load(Some(&p)).unwrap_err());
        assert!(e.contains("[vm.x.resources]: unknown resource \"disk\" (known: cpu, io, membw, event)"), "{e}");
        std::fs::write(&p, "[io]\nlever = \"weight\"\nweight = 2000\n").unwrap();
        let e = format!("{:#}", HostConfig::load(Some(&p)).unwrap_err());
        assert!(e.contains("[io] weight = 2000: must be 1..=1000"), "{e}");
        std::fs::write(&p, "[io]\nlever = \"nice\"\n").unwrap();
        let e = format!("{:#}", HostConfig::load(Some(&p)).unwrap_err());
        assert!(e.contains("unknown variant `nice`, expected `ioprio` or `weight`"), "{e}");
        std::fs::write(&p, "sockt_dir = \"/x\"\n").unwrap();
        assert!(format!("{:#}", HostConfig::load(Some(&p)).unwrap_err()).contains("unknown field"));
    }

    /// The typed errors say what the strings said, word for word (users and tests match them).
    #[test]
    fn errors_keep_their_words() {
        let bad = |text: &str| toml::from_str::<HostConfig>(text).unwrap().validate().unwrap_err().to_string();
        assert_eq!(
            bad("[policy]\ndefault_priority = 99\n"),
            "[policy]: default_priority = 99: out of range 1..=98 (99 is left to the kernel's own threads)"
        );
        assert_eq!(bad("[boost]\nguard_nice = 30\n"), "[boost]: guard_nice = 30 out of range -20..=19");
        assert_eq!(
            bad("[boost]\nother_threads_priority_offset = 11\n"),
            "[boost]: other_threads_priority_offset must be 0..=10"
        );
        assert_eq!(bad("[event]\ncycle_ms = 0\n"), "[event] cycle_ms must be > 0");
        assert_eq!(bad("[membw]\nperiod_ms = 0\n"), "[membw] period_ms = 0: must be 1..=10000");
        assert_eq!(
            bad("[membw]\nbackend = \"simulated\"\n"),
            "[membw] backend = \"simulated\" needs trace = \"<file>\""
        );
        assert_eq!(
            bad("[membw]\nbackend = \"simulated\"\nthrottle = \"mba\"\ntrace = \"t\"\n"),
            "[membw] throttle = \"mba\" needs real counters: simulated bandwidth follows the vCPUs' run time, which MBA \
             does not stop (use throttle = \"freezer\" or \"auto\")"
        );
        assert_eq!(
            bad("[vm.a]\nmembw_share = 600\n[vm.b]\nmembw_share = 600\n"),
            "[vm.*] membw_share add up to 1200‰: more than the host's guaranteed bandwidth (1000‰) can be guaranteed"
        );
        assert_eq!(
            bad("[vm.a]\nmembw_share = 1001\n"),
            "[vm.a] membw_share = 1001: at most 1000 (permille of [membw] guaranteed_mbps)"
        );
        assert_eq!(
            bad("[resources]\ndisk = true\n"),
            "[resources]: unknown resource \"disk\" (known: cpu, io, membw, event)"
        );
        assert_eq!(
            bad("[shield]\nhousekeeping_cpus = \"x\"\n"),
            "[shield] housekeeping_cpus: \"x\" is not a CPU list like \"1\", \"2-3\" or \"0,4-5\""
        );
        assert_eq!(
            bad("[vm.a.static]\nshield = \"2\"\n[vm.b.static]\nshield = \"1-2\"\n"),
            "[vm.b.static] shield: CPU 2 is already shielded for VM a"
        );
        assert_eq!(
            bad("[vm.a.static]\nshield = \",\"\n"),
            "[vm.a.static] shield = \",\": names no CPU (leave it out for no shield)"
        );
        assert_eq!(
            bad("[vm.a.static]\nvcpu_priority = 0\n"),
            "[vm.a.static] vcpu_priority = 0: a SCHED_FIFO priority is 1..=99"
        );
        assert_eq!(
            bad("daemon_priority = 50\n[vm.a.static]\nfifo = true\nvcpu_priority = 50\n"),
            "[vm.a.static] vcpu_priority = 50 must be below daemon_priority (50), which must stay above every VM"
        );
        assert_eq!(bad("daemon_priority = 100\n"), "daemon_priority = 100: must be 0 (SCHED_OTHER) or 1..=99");
        assert_eq!(
            bad("daemon_priority = 5\n[policy]\ndefault_priority = 5\n"),
            "daemon_priority = 5 must be above every boosted thread's priority (5), or 0"
        );
        assert_eq!(bad("rescan_ms = 0\n"), "rescan_ms and thread_refresh_ms must be > 0");
    }
}
