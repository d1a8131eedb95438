//! The host daemon's errors: why a socket or process is not coordinated, why an operator
//! command was refused.

use std::io;

use crate::config::ConfigError;
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
    #[error("no VM named {key:?} (connected: {known})")]
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
    /// The daemon refused an operator's setting.
    #[error("{0}")]
    Declined(String),
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
