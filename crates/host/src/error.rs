//! The host daemon's errors: why a socket or process is not coordinated, why an operator
//! command was refused ([`Error`]), why a resource's coordination does not run here
//! ([`Unavailable`]), why a VM's static tuning is not had ([`StaticError`]).
//!
//! The messages of [`Unavailable`] and [`StaticError`] are whole (they say the cause too, as
//! the status and the log show them), so they have no `source()`: anyhow's `{:#}` would
//! otherwise say the cause twice.

use std::io;
use std::sync::Arc;

use cosched_proto::Resource;

use crate::actuator::{FreezerUnsupported, WeightUnsupported};
use crate::config::ConfigError;
use crate::membw::ProbeError;
use crate::shield::{format_cpus, CpuListError, Cpus, ShieldError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("connect: {0}")]
    Connect(#[source] io::Error),
    #[error("SO_PEERCRED: {0}")]
    PeerCred(#[source] io::Error),
    #[error("peer pid {pid}: {source}")]
    Peer { pid: i32, source: cosched_procfs::Error },
    /// The socket's listener is not QEMU, and no single QEMU process holds the connection.
    #[error("refusing peer pid {pid} ({comm}): not a QEMU process (exe {exe:?}), {why}")]
    NotQemu { pid: i32, comm: String, exe: String, why: String },
    #[error("pid {pid}: reading its executable: {source}")]
    Executable { pid: i32, source: io::Error },
    /// A QEMU binary anyone but root could have put there.
    #[error(
        "refusing pid {pid} ({comm}): its executable {exe:?} is not root-owned and protected (uid {uid}, mode {mode:o})"
    )]
    UnsafeBinary { pid: i32, comm: String, exe: String, uid: u32, mode: u32 },
    #[cfg(feature = "bpf")]
    #[error("watching the threads of pid {pid}: {source}")]
    WatchThreads { pid: i32, source: cosched_hostbpf::Error },
    #[error("reading threads of pid {pid}: {source}")]
    Threads { pid: i32, source: io::Error },
    #[error("epoll: {0}")]
    Poll(#[source] io::Error),
    #[error("no VM named {key:?} (connected: {known}) and no [vm.{key}] in the config")]
    NoVm { key: String, known: String },
    #[error("unknown resource {name:?} (supported: {supported})")]
    UnknownResource { name: String, supported: String },
    #[error("{resource} coordination is not supported by this daemon (supported: {supported})")]
    Unsupported { resource: cosched_proto::Resource, supported: String },
    #[error("priority {priority} would not stay below the daemon's own (daemon_priority = {ceiling})")]
    AboveDaemon { priority: u8, ceiling: u8 },
    /// The coordinator refused an operator's setting.
    #[error(transparent)]
    Refused(#[from] cosched_core::Error),
    /// The operator's command is for a resource that does not run here.
    #[error("{}: {}", .0.resource.name(), .0.why)]
    Unavailable(Unavailable),
    /// Memory bandwidth runs here, but the coordinator does not regulate it.
    #[error("membw: not regulated")]
    NotRegulated,
    /// An operator's static tuning does not pass the config's checks.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A static guard asked for with the guard's rule off.
    #[error("the guard's rule is off: [policy] rt_guard_max_share_permille = 0")]
    NoGuardRule,
    /// An operator's shield for VM `vm` cannot be had (refused before anything changed).
    #[error("vm {vm}: {error} ({list})")]
    Shield { vm: String, list: String, error: StaticError },
    /// A static tuning was applied in part.
    #[error(transparent)]
    Static(#[from] StaticError),
    /// The operator's settings could not be written to the state directory: nothing changed.
    #[error("keeping the operator's settings: {0}; nothing changed")]
    Keep(#[source] crate::operator::OperatorError),
    /// A VM's static tuning while `cosched disable --all` holds every one off.
    #[error("static tunings are off for the whole host (cosched disable --all): cosched enable first")]
    StaticsOff,
    /// `--all` for one VM.
    #[error("--all is for the whole host (cosched disable --all)")]
    AllForVm,
}

/// Why a resource's coordination does not run on this host: the resource, and the reason
/// (shared: the status shows it, and an operator's command for the resource is refused with it).
/// Its message is the reason's.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{why}")]
pub struct Unavailable {
    pub resource: Resource,
    pub why: Arc<Why>,
}

impl Unavailable {
    pub fn new(resource: Resource, why: impl Into<Why>) -> Unavailable {
        Unavailable { resource, why: Arc::new(why.into()) }
    }
}

/// The reasons a resource's coordination does not run here.
#[derive(Debug, thiserror::Error)]
pub enum Why {
    /// The config turns it off.
    #[error("off: {setting}")]
    Off { setting: &'static str },
    /// The I/O `weight` lever has no hierarchy to act on.
    #[error(transparent)]
    Weight(#[from] WeightUnsupported),
    /// The kernel refuses the event detection's BPF.
    #[cfg(feature = "bpf")]
    #[error(transparent)]
    Feas(#[from] cosched_hostbpf::Error),
    /// The event detection's ring buffer cannot be polled.
    #[error("registering the FEAS ring buffer: {0}")]
    FeasRing(io::Error),
    /// No memory-bandwidth counters (or the configured ones are missing).
    #[error(transparent)]
    Probe(#[from] ProbeError),
    /// No freezer for the memory-bandwidth throttle.
    #[error(transparent)]
    Freezer(#[from] FreezerUnsupported),
}

/// Why a VM's static tuning is not had, or not wholly.
#[derive(Debug, thiserror::Error)]
pub enum StaticError {
    #[error(transparent)]
    CpuList(#[from] CpuListError),
    /// The shield names CPUs this host does not have.
    #[error("shield {list}: this host has CPUs {}", format_cpus(.host))]
    NotOnHost { list: String, host: Cpus },
    /// The shield names a CPU another VM is shielded on.
    #[error("shield {list}: CPU {cpu} is already shielded for VM {other}")]
    Taken { list: String, cpu: usize, other: String },
    /// The host's side of the shield cannot be had.
    #[error(transparent)]
    Shield(#[from] ShieldError),
    /// What the actuator could not do, each.
    #[error("{}", .0.join("; "))]
    Apply(Vec<String>),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The status shows the reason alone; a command refused for it names the resource first.
    #[test]
    fn an_unavailable_resource_says_why() {
        let off = Unavailable::new(Resource::Membw, ProbeError::Off);
        assert_eq!(off.to_string(), "off: [membw] backend = \"off\"");
        assert_eq!(Error::Unavailable(off).to_string(), "membw: off: [membw] backend = \"off\"");
        let events = Unavailable::new(Resource::Event, Why::Off { setting: "[event] vms = \"none\"" });
        assert_eq!(events.to_string(), "off: [event] vms = \"none\"");
        let core = cosched_core::Error::NoSuchVm(cosched_core::VmId(1));
        assert_eq!(Error::from(core).to_string(), "no such VM");
    }
}
