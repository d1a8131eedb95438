//! The status the host daemon reports: what `cosched status --json` writes, what the CLI prints
//! and what the Prometheus metrics are made from, as one set of types. The daemon fills them;
//! the control socket sends them as JSON; the CLI reads them back with the same types. The
//! metrics are declared on the fields they come from (`#[metric(...)]`, [`metric`]).
//!
//! The JSON is a contract (the Python harness, users' scripts): keys, nesting and value types
//! are those of `testdata/status-v1.json`. `schema_version` changes when they change in a way
//! a reader must know about; a key added is not such a change. Every struct but a thread's
//! reads with defaults for what is missing and ignores keys it does not know, so a CLI can read
//! a daemon that is a little older or newer.

// The derive names this crate by its path, from inside it too.
extern crate self as cosched_status;

pub mod config;
pub mod metric;
pub mod origin;
pub mod rundelay;
pub mod vm;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use config::{BoostConfig, DetectionCounters, EventStatus, IoStatus, MembwStatus};
use metric::{Metrics, Sample};
pub use origin::{Origin, SettingsFrom};
pub use rundelay::{RunDelay, RunDelayStatus};
pub use vm::{
    CpuCounters, Disk, EventCounters, PredictCounters, PriorityMap, RtStatus, SamplesSummary, ShieldPlan, SlotCounters,
    StaticPlan, ThreadStatus, VmBwStats, VmCounters, VmMembw, VmResource, VmStatic, VmStatus,
};

/// What `schema_version` says: see the crate documentation.
pub const SCHEMA_VERSION: u32 = 1;

/// Upper bounds of the hint-to-applied histogram's buckets, in µs.
pub const BUCKETS_US: [u64; 14] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 100_000];

/// The whole status (`cosched status --json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Status {
    pub schema_version: u32,
    pub daemon: DaemonInfo,
    /// Every resource the daemon supports, by name.
    pub resources: BTreeMap<String, ResourceStatus>,
    /// `[policy]` as configured.
    pub policy: cosched_core::Policy,
    /// `[boost]` as configured.
    pub boost: BoostConfig,
    pub io: IoStatus,
    pub event: EventStatus,
    pub membw: MembwStatus,
    /// Whether the vCPUs' run delay is measured here (absent from a daemon that did not say).
    #[serde(skip_serializing_if = "RunDelayStatus::is_unknown")]
    pub run_delay: RunDelayStatus,
    pub shield: ShieldReport,
    /// `None` when the daemon could not read its own capabilities.
    pub privileges: Option<Privileges>,
    /// `[rt]` as in force.
    pub rt: cosched_core::RtConfig,
    /// Hint-to-applied latency over every VM.
    pub latency: LatencySummary,
    pub vms: Vec<VmStatus>,
    /// Sockets of the socket directory not connected (refused, or not answering).
    pub unconnected_sockets: Vec<PathBuf>,
    /// Where each host-wide setting comes from (`enabled.cpu`, `static`, `membw.period_ms`):
    /// only while one of them is the operator's.
    #[serde(skip_serializing_if = "SettingsFrom::by_config_alone")]
    pub settings_from: SettingsFrom,
    /// The operator's settings kept for VMs that are not running, by VM name (setting: value):
    /// they apply when the VM appears.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub settings_waiting: BTreeMap<String, BTreeMap<String, String>>,
}

/// The daemon itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DaemonInfo {
    pub pid: u32,
    pub uptime_s: f64,
    pub socket_dir: PathBuf,
    pub state_dir: PathBuf,
    /// Where the Prometheus endpoint listens, if it does.
    pub metrics_addr: Option<String>,
    /// How thread creation and exit are seen (`tp_btf`, ...); `None`: by re-reading thread lists.
    pub thread_events: Option<String>,
    pub cost: Cost,
    /// Frames per second read from one VM's channel (`[policy] read_rate` in force).
    pub read_rate_per_vm: u64,
    /// The daemon's build: in its metrics, not in the JSON (whose keys stay those of
    /// `schema_version` 1).
    #[serde(skip)]
    pub build: Build,
}

/// A build of the daemon: its version, and the git commit it was built from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Metrics)]
pub struct Build {
    #[metric(
        gauge,
        name = "cosched_build_info",
        help = "Always 1: the labels say the daemon's version and the git commit it was built from (empty if not \
                known).",
        value = Self::info
    )]
    pub version: String,
    /// Empty where the build did not know it (not built from a git checkout).
    pub commit: String,
}

impl Build {
    /// The one sample, labelled; none for a build not known (a status read back from JSON).
    fn info(&self) -> Option<BuildLabels> {
        let clean = |s: &str| s.replace(['"', '\\', '\n'], "_");
        (!self.version.is_empty())
            .then(|| BuildLabels(format!("version=\"{}\",commit=\"{}\"", clean(&self.version), clean(&self.commit))))
    }
}

/// `cosched_build_info`'s labels.
pub struct BuildLabels(String);

impl Sample for BuildLabels {
    fn each(&self, _by: &str, out: &mut dyn FnMut(&str, &str, f64)) {
        out("", &self.0, 1.0)
    }
}

/// Where the daemon's time goes, in total since it started (the `scale` experiment divides by
/// `frames`): reading, decoding, the coordinator, the actuators (of which `syscall_ns` in the
/// system calls making the changes), encoding and writing replies, and each whole loop turn
/// but the wait.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Cost {
    pub frames: u64,
    pub read_ns: u64,
    pub decode_ns: u64,
    pub coordinator_ns: u64,
    pub actuate_ns: u64,
    pub syscall_ns: u64,
    pub encode_ns: u64,
    pub write_ns: u64,
    pub loop_ns: u64,
}

/// One resource, host-wide.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Metrics)]
#[serde(default)]
pub struct ResourceStatus {
    #[metric(gauge, name = "cosched_enabled", help = "Coordination of the resource enabled for the host.")]
    pub enabled: bool,
    /// The budget and rate limits in force.
    pub limits: Option<cosched_core::Limits>,
    #[serde(flatten)]
    pub figures: ResourceFigures,
}

/// A resource's own figures, beside its switch and limits in its object (the coordinator's
/// `ResourcePolicy::figures`); each is there only for the resource that has it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ResourceFigures {
    /// CPU: the most vCPUs boosted at once (the host reserve).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boost_capacity_vcpus: Option<u64>,
    /// CPU: vCPUs boosted now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boosted_vcpus: Option<u64>,
    /// Memory bandwidth: the regulator's settings and periods (as in `membw`, as numbers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guaranteed_mbps: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub committed_permille: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reclaim: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_effort: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub periods: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_effort_periods: Option<u64>,
    /// Figures of a resource this version does not name.
    #[serde(flatten)]
    pub other: BTreeMap<String, u64>,
}

impl ResourceFigures {
    /// Sets the figure named `name` (as the coordinator names it): a field here, else `other`.
    pub fn set(&mut self, name: &str, n: u64) {
        let field = match name {
            "boost_capacity_vcpus" => &mut self.boost_capacity_vcpus,
            "boosted_vcpus" => &mut self.boosted_vcpus,
            "guaranteed_mbps" => &mut self.guaranteed_mbps,
            "period_ms" => &mut self.period_ms,
            "committed_permille" => &mut self.committed_permille,
            "reclaim" => &mut self.reclaim,
            "best_effort" => &mut self.best_effort,
            "periods" => &mut self.periods,
            "best_effort_periods" => &mut self.best_effort_periods,
            _ => {
                self.other.insert(name.to_string(), n);
                return;
            }
        };
        *field = Some(n);
    }
}

/// The daemon's privileges, when it runs with less than root's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Privileges {
    pub uid: u32,
    /// Of the capabilities the daemon uses, those it has (`CAP_SYS_NICE`, ...).
    pub capabilities: Vec<String>,
    pub lost: Vec<Lost>,
}

/// A feature lost for want of a privilege.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Lost {
    pub feature: String,
    /// What it needs (`CAP_BPF + CAP_PERFMON or CAP_SYS_ADMIN`).
    pub needs: String,
}

/// What the host's shield moved and what it could not do.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ShieldReport {
    /// Empty while no VM is shielded.
    pub shielded_cpus: String,
    pub housekeeping_cpus: String,
    /// IRQs moved off the shielded CPUs.
    pub irqs_moved: Vec<u32>,
    /// IRQs whose affinity could not be changed, with why (managed or per-CPU IRQs).
    pub irqs_fixed: Vec<String>,
    /// Host groups narrowed to the housekeeping CPUs.
    pub groups_moved: Vec<String>,
    pub errors: Vec<String>,
    /// Per-CPU kernel threads bound to a shielded CPU (ksoftirqd, kworkers, migration, ...):
    /// nothing can move them.
    pub kthreads_left: Vec<String>,
}

/// Hint-to-applied latency: from reading a guest's frame to the last thread changed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LatencySummary {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// Over the most recent samples (up to 8192), for the percentiles.
    pub recent: usize,
}

/// A latency histogram: counts per bucket of [`BUCKETS_US`] (not cumulative; one more for
/// +Inf).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Histogram {
    pub counts: Vec<u64>,
    pub count: u64,
    pub sum_ns: u64,
}

/// A Prometheus histogram in seconds: cumulative `_bucket`s, `_sum`, `_count`.
impl Sample for Histogram {
    fn each(&self, _by: &str, out: &mut dyn FnMut(&str, &str, f64)) {
        let mut cumulative = 0;
        for (i, b) in BUCKETS_US.iter().enumerate() {
            cumulative += self.counts.get(i).copied().unwrap_or(0);
            out("_bucket", &format!("le=\"{}\"", *b as f64 / 1e6), cumulative as f64);
        }
        out("_bucket", "le=\"+Inf\"", self.count as f64);
        out("_sum", "", self.sum_ns as f64 / 1e9);
        out("_count", "", self.count as f64);
    }
}

#[cfg(test)]
mod tests;
