//! The host-wide sections that are a part of the host config as configured (`[boost]`, `[io]`,
//! `[event]`, `[membw]`), each with what it runs on here, or why it cannot run. The host's
//! config types stay the host's; these are what the status shows of them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::metric::Metrics;

/// `[boost]`: how a boosted VM's threads are scheduled.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BoostConfig {
    pub policy: BoostPolicy,
    pub other_threads_priority_offset: u8,
    pub guard_nice: i32,
    pub deadline_runtime_us: u64,
    pub deadline_period_us: u64,
    pub boost_nice: i32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BoostPolicy {
    #[default]
    Rr,
    Fifo,
    Deadline,
    Nice,
}

/// `[io]`, and what it acts through here (or why it cannot).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IoStatus {
    pub lever: IoLever,
    pub ioprio_level: u8,
    pub weight: u32,
    /// `ioprio_set: real-time I/O class`, `cgroup v2 io.bfq.weight`, ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acts_through: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsupported: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoLever {
    #[default]
    Ioprio,
    Weight,
}

impl IoLever {
    pub fn name(self) -> &'static str {
        match self {
            IoLever::Ioprio => "ioprio",
            IoLever::Weight => "weight",
        }
    }
}

/// `[event]` as configured, and how events are detected here (or why they are not).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EventStatus {
    #[serde(flatten)]
    pub config: cosched_core::FeasConfig,
    /// The tracepoints' attachment (`tp_btf`, `raw_tracepoint`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detection: Option<String>,
    /// Whether KVM's interrupt-injection tracepoints are attached too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kvm_tracepoints: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counters: Option<DetectionCounters>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsupported: Option<String>,
}

/// The host BPF side of event detection, host-wide.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DetectionCounters {
    pub device_wakeups: u64,
    pub timer_wakeups: u64,
    pub internal_wakeups: u64,
    pub kvm_injections: u64,
    pub boosts_asked: u64,
    pub postponements: u64,
    pub over_limit: u64,
    pub not_waiting: u64,
    pub blocked: u64,
    pub dropped: u64,
    /// Packets queued to a watched VM's tap device (each an event).
    pub net_packets: u64,
    /// Requests completed on a block device a watched VM holds (each an event).
    pub block_completions: u64,
    /// Events that found no vCPU waiting, fired when one of the VM's vCPUs was preempted within
    /// a cycle of them.
    pub deferred_events: u64,
}

/// `[membw]` and what it runs on here (or why not), host-wide. While the regulation runs,
/// `period_ms`, `reclaim` and `best_effort` are those in force (the operator may have changed
/// them) and `backend` is the counter source found. Its metrics are labelled with `backend`,
/// also where the regulation does not run (`backend="off"`, 0 committed).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Metrics)]
#[serde(default)]
pub struct MembwStatus {
    /// As configured (`auto`, `pmu`, `simulated`, `off`), or the counter source running.
    pub backend: String,
    pub throttle: ThrottleChoice,
    pub freezer: FreezerChoice,
    #[metric(gauge, name = "cosched_membw_guaranteed_mbps", help = "The host's declared guaranteed memory bandwidth.")]
    pub guaranteed_mbps: u64,
    #[metric(gauge, name = "cosched_membw_period_ms", help = "The memory-bandwidth regulation period.")]
    pub period_ms: u64,
    pub checks_per_period: u32,
    #[metric(gauge, name = "cosched_membw_reclaim", help = "1 if reclaim is on.")]
    pub reclaim: bool,
    #[metric(gauge, name = "cosched_membw_best_effort", help = "1 if best effort is on.")]
    pub best_effort: bool,
    pub default_share_permille: u64,
    pub trace: Option<PathBuf>,
    pub bytes_per_miss: u64,
    /// The rest is there while the regulation runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simulated: Option<bool>,
    /// Said loud when the counters are simulated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notes: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttles_through: Option<String>,
    #[metric(
        gauge,
        name = "cosched_membw_committed_permille",
        help = "Memory-bandwidth shares in force, in total.",
        absent = 0
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub committed_permille: Option<u64>,
    /// Bytes left to lend this period.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_best_effort: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counters: Option<RegulatorCounters>,
    /// Checks run, and their mean time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checks: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check_us_mean: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsupported: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThrottleChoice {
    #[default]
    Auto,
    Mba,
    Freezer,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FreezerChoice {
    #[default]
    Auto,
    V1,
    V2,
}

/// The regulator's periods.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RegulatorCounters {
    pub periods: u64,
    /// Periods in which best effort started (every guarantee met before the end).
    pub best_effort_periods: u64,
}
