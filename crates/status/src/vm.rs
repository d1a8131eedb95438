//! One VM's status: its channel and agent, per resource its level and counters, its
//! memory-bandwidth regulation, static tunings, threads and disks.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use cosched_core::Level;
use cosched_procfs::ThreadRole;
use serde::{Deserialize, Serialize};

use crate::metric::{Metrics, Sample};
use crate::{Histogram, LatencySummary};

/// One VM, with or without an agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Metrics)]
#[serde(default)]
pub struct VmStatus {
    pub name: String,
    /// Its QEMU process.
    pub pid: i32,
    /// Its channel's socket, while connected.
    pub socket: Option<PathBuf>,
    pub agent: bool,
    pub priority: u8,
    pub vcpus: u32,
    #[metric(gauge, name = "cosched_vm_registered", help = "1 if the guest agent is registered.")]
    pub registered: bool,
    /// The capabilities granted to its agent (`cpu,membw`, `none`).
    pub caps: String,
    pub counters: VmCounters,
    /// Every resource the host supports, by name.
    pub resources: BTreeMap<String, VmResource>,
    pub actuation_errors: u64,
    pub dropped_replies: u64,
    #[metric(
        counter,
        name = "cosched_vm_read_held_total",
        help = "Times the VM's channel was left unread for sending past [policy] read_rate."
    )]
    pub read_held: u64,
    pub latency: LatencySummary,
    #[metric(
        histogram,
        name = "cosched_hint_to_applied_seconds",
        help = "From reading a guest frame to its threads changed."
    )]
    pub latency_histogram: Histogram,
    /// How long its vCPU threads waited runnable before they ran, per level (`normal`,
    /// `boosted`, `event-boosted`, `static`), while the host measures it.
    #[metric(
        histogram,
        name = "cosched_vcpu_run_delay_seconds",
        help = "How long the VM's vCPU threads waited runnable before they ran (from a wake-up or a preemption \
                to the switch in), by the level the VM was at (host BPF).",
        by = "level"
    )]
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub run_delay: BTreeMap<String, crate::RunDelay>,
    /// Each thread and the settings on it: only in the status `cosched status` asks for (not
    /// built for the metrics).
    pub threads: Vec<ThreadStatus>,
    pub disks: Vec<Disk>,
    /// Event boosting's balance of CPU time (positive: owed; negative: paid in advance), while
    /// events are detected here.
    pub event_balance_ns: Option<i64>,
    /// The CPU share event boosting has measured for the VM's vCPUs at their normal level, in
    /// parts per million (what a pay-back hold is priced at), once measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_share_ppm: Option<u64>,
    /// Its memory-bandwidth regulation, while it runs here.
    pub membw: Option<VmMembw>,
    #[serde(rename = "static")]
    pub statics: VmStatic,
    /// Where each of its settings comes from (`enabled.cpu`, `priority`, `rt_ceiling`,
    /// `membw_share`, `static`): only while one of them is the operator's.
    #[serde(skip_serializing_if = "crate::SettingsFrom::by_config_alone")]
    pub settings_from: crate::SettingsFrom,
}

/// VM-wide counters: the channel and the registration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, Metrics)]
#[serde(default)]
pub struct VmCounters {
    #[metric(counter, name = "cosched_vm_frames_total", help = "Well-formed frames received.")]
    pub frames: u64,
    #[metric(counter, name = "cosched_vm_malformed_total", help = "Malformed frames and garbage runs received.")]
    pub malformed: u64,
    pub garbage_bytes: u64,
    /// Times the VM was deregistered for sending too many malformed frames.
    pub malformed_deregistrations: u64,
    /// Refusals that concern no one resource (`REGISTER`, malformed frames), by reason.
    #[metric(
        counter,
        name = "cosched_vm_denied_total",
        help = "DENY replies by resource and reason.",
        labels = "resource=\"\"",
        by = "reason"
    )]
    pub denied: BTreeMap<String, u64>,
}

/// One resource of one VM.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Metrics)]
#[serde(default)]
pub struct VmResource {
    /// The operator's switch for this VM.
    pub enabled: bool,
    /// Enabled for the host and for the VM.
    pub active: bool,
    #[metric(
        gauge,
        name = "cosched_vm_boosted",
        help = "1 if the VM is boosted now on the resource.",
        value = Self::changed
    )]
    pub level: Level,
    /// The last value asked for; 0: none.
    pub wants: u64,
    /// The value in force; 0 when not boosted.
    pub granted: u64,
    /// How long the boost under way has lasted.
    #[metric(counter, name = "cosched_vm_boosted_seconds_total", help = "Time spent boosted.", value = Self::boosted_s)]
    pub boosted_for_ms: f64,
    /// Boosted share of the budget window.
    pub boost_share_permille: u64,
    pub in_cooldown: bool,
    pub counters: SlotCounters,
    /// Why the level in force could not be applied to the VM's threads (the last change's first
    /// error, e.g. a real-time class refused); absent when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[metric(
        gauge,
        name = "cosched_vm_not_applied",
        help = "1 if the last change of the VM's level on the resource failed on its threads (the daemon's log and \
                `cosched status` say why): the level shown is decided, not in force.",
        value = Self::failing
    )]
    pub not_applied: Option<String>,
    /// CPU only: RT co-scheduling and predictions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rt: Option<RtStatus>,
}

impl VmResource {
    /// The last change of its level failed on the threads.
    pub fn failing(&self) -> bool {
        self.not_applied.is_some()
    }

    /// Away from normal (boosted, guarded, throttled).
    pub fn changed(&self) -> bool {
        self.level != Level::Normal
    }

    /// Time boosted, closed boosts and the one under way.
    pub fn boosted_ms(&self) -> f64 {
        self.counters.boosted_ns as f64 / 1e6 + self.boosted_for_ms
    }

    fn boosted_s(&self) -> f64 {
        self.counters.boosted_ns as f64 / 1e9 + self.boosted_for_ms / 1e3
    }
}

/// Counters of one resource of one VM: those every resource has, and the resource's own
/// (each there once it was counted).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, Metrics)]
#[serde(default)]
pub struct SlotCounters {
    /// Requests received (guest frames, or host-originated requests).
    #[metric(
        counter,
        name = "cosched_vm_requests_total",
        help = "Requests for the resource (guest frames or host events)."
    )]
    pub requests: u64,
    #[metric(counter, name = "cosched_vm_boosts_total", help = "Boosts started.")]
    pub boosts: u64,
    pub deboosts: u64,
    /// Total time boosted (closed boosts).
    pub boosted_ns: u64,
    #[metric(counter, name = "cosched_vm_budget_exhausted_total", help = "Boosts ended by a budget.")]
    pub budget_exhausted: u64,
    /// Refusals, by reason.
    #[metric(counter, name = "cosched_vm_denied_total", help = "DENY replies by resource and reason.", by = "reason")]
    pub denied: BTreeMap<String, u64>,
    #[serde(flatten)]
    pub cpu: CpuCounters,
    #[serde(flatten)]
    pub event: EventCounters,
    /// A resource's own counters this version does not name.
    #[serde(flatten)]
    pub other: BTreeMap<String, u64>,
}

impl SlotCounters {
    /// Sets the resource's own counter named `name` (as the coordinator counts it): a field
    /// of [`CpuCounters`] or [`EventCounters`], else `other`.
    pub fn set_own(&mut self, name: &str, n: u64) {
        let (c, e) = (&mut self.cpu, &mut self.event);
        let field = match name {
            "guard_demotions" => &mut c.guard_demotions,
            "events" => &mut e.events,
            "ignored" => &mut e.ignored,
            "not_waiting" => &mut e.not_waiting,
            "postponed" => &mut e.postponed,
            "blocked" => &mut e.blocked,
            "boosted_cpu_ns" => &mut e.boosted_cpu_ns,
            "uncharged" => &mut e.uncharged,
            "slices" => &mut e.slices,
            "postponed_boosts" => &mut e.postponed_boosts,
            "repaid_ns" => &mut e.repaid_ns,
            _ => {
                self.other.insert(name.to_string(), n);
                return;
            }
        };
        *field = Some(n);
    }
}

/// The CPU's own counters (the metric is there for every resource, 0 where it never counts).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, Metrics)]
#[serde(default)]
pub struct CpuCounters {
    #[metric(
        counter,
        name = "cosched_vm_guard_demotions_total",
        help = "Times the real-time guard moved vCPUs off the real-time class.",
        absent = 0
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guard_demotions: Option<u64>,
}

/// Event boosting's (FEAS) own counters of a VM.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, Metrics)]
#[serde(default)]
pub struct EventCounters {
    #[metric(
        counter,
        name = "cosched_vm_events_total",
        help = "Device events for the VM (event boosting).",
        absent = 0
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<u64>,
    /// Events for a VM event boosting does not apply to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ignored: Option<u64>,
    /// Events whose vCPU was not waiting to run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_waiting: Option<u64>,
    #[metric(
        counter,
        name = "cosched_vm_events_postponed_total",
        help = "Events postponed past n_limit or a debt.",
        absent = 0
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postponed: Option<u64>,
    #[metric(
        counter,
        name = "cosched_vm_event_blocked_total",
        help = "Event boosts ended by the vCPU blocking.",
        absent = 0
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked: Option<u64>,
    #[metric(
        counter,
        name = "cosched_vm_event_boosted_cpu_seconds_total",
        help = "CPU time the vCPUs ran while event-boosted.",
        unit = "ns",
        absent = 0
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boosted_cpu_ns: Option<u64>,
    /// Boosts whose CPU time could not be charged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uncharged: Option<u64>,
    #[metric(counter, name = "cosched_vm_event_slices_total", help = "Event boosts ended by their slice.", absent = 0)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slices: Option<u64>,
    /// Boosts put off to a later cycle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postponed_boosts: Option<u64>,
    #[metric(
        counter,
        name = "cosched_vm_event_repaid_seconds_total",
        help = "Boosted CPU time paid back.",
        unit = "ns",
        absent = 0
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repaid_ns: Option<u64>,
}

/// A VM's RT co-scheduling and predictions (`cosched_core::rt`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Metrics)]
#[serde(default)]
pub struct RtStatus {
    pub priority_map: PriorityMap,
    pub ceiling: u8,
    /// The guest's priority in its last `CPU 1` (0: none given).
    pub guest_priority: u8,
    /// The host priority of the vCPUs now, while an RT co-scheduling grant is in force.
    #[metric(
        gauge,
        name = "cosched_vm_rt_host_priority",
        help = "Host SCHED_FIFO priority of an RT co-scheduling grant."
    )]
    pub host_priority: Option<u8>,
    #[metric(
        counter,
        name = "cosched_vm_predictions_total",
        help = "Predicted RT wake-ups (WAKE) by outcome.",
        by = "outcome"
    )]
    pub predictions: PredictCounters,
    #[metric(
        gauge,
        name = "cosched_vm_predict_lead_seconds",
        help = "How long before a predicted wake-up its boost comes.",
        unit = "us"
    )]
    pub lead_us: f64,
    /// How long an applied prediction now waits for its confirmation after the wake-up.
    pub hold_us: f64,
    /// Arrival of the confirming `CPU 1` minus the predicted wake-up.
    #[metric(
        gauge,
        name = "cosched_vm_predict_error_seconds",
        help = "Arrival of the confirming CPU 1 minus the predicted wake-up (recent quantiles).",
        by = "quantile",
        unit = "us"
    )]
    pub predict_error_us: SamplesSummary,
    /// Planned against applied start of predicted boosts, measured after the actuators ran.
    #[metric(
        gauge,
        name = "cosched_vm_predict_apply_late_seconds",
        help = "Predicted boosts: applied minus planned time (recent quantiles).",
        by = "quantile",
        unit = "us"
    )]
    pub predict_apply_late_us: SamplesSummary,
    /// Unconfirmed predicted boost time in the budget window.
    pub unconfirmed_ms: f64,
    /// The pending prediction: its wake-up from now in µs (negative: past), and its state
    /// (`planned`, `applied`, `covered`).
    pub pending: Option<(f64, String)>,
}

impl Default for RtStatus {
    fn default() -> Self {
        RtStatus {
            priority_map: PriorityMap::Same,
            ceiling: 0,
            guest_priority: 0,
            host_priority: None,
            predictions: PredictCounters::default(),
            lead_us: 0.0,
            hold_us: 0.0,
            predict_error_us: SamplesSummary::default(),
            predict_apply_late_us: SamplesSummary::default(),
            unconfirmed_ms: 0.0,
            pending: None,
        }
    }
}

/// How a guest's RT priority becomes the host's (`[rt] priority_map`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PriorityMap {
    Vm,
    #[default]
    Same,
    Linear,
}

impl PriorityMap {
    pub fn name(self) -> &'static str {
        match self {
            PriorityMap::Vm => "vm",
            PriorityMap::Same => "same",
            PriorityMap::Linear => "linear",
        }
    }
}

/// Predictions of one VM, by outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PredictCounters {
    /// `WAKE` frames with a delay.
    pub received: u64,
    /// Predicted boosts applied at their time.
    pub applied: u64,
    /// Predictions whose wake-up found the VM already boosted by its guest.
    pub covered: u64,
    /// Predicted boosts the CPU's rules refused at their time.
    pub refused: u64,
    /// Confirmed by the guest's `CPU 1`.
    pub confirmed: u64,
    /// ... of which the `CPU 1` came before the boost was applied.
    pub early: u64,
    /// Ended by themselves after the hold.
    pub unconfirmed: u64,
    /// ... of which the guest's `CPU 1` came after the hold.
    pub late: u64,
    /// `WAKE` refused.
    pub denied: u64,
    /// Withdrawn by `WAKE 0` or replaced by a new `WAKE`.
    pub cancelled: u64,
    /// Periods a standing prediction boosted by itself (absent from statuses written before
    /// standing predictions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standing: Option<u64>,
}

/// One sample per outcome, in the order of their names.
impl Sample for PredictCounters {
    fn each(&self, by: &str, out: &mut dyn FnMut(&str, &str, f64)) {
        let c = self;
        for (outcome, n) in [
            ("applied", Some(c.applied)),
            ("cancelled", Some(c.cancelled)),
            ("confirmed", Some(c.confirmed)),
            ("covered", Some(c.covered)),
            ("denied", Some(c.denied)),
            ("early", Some(c.early)),
            ("late", Some(c.late)),
            ("received", Some(c.received)),
            ("refused", Some(c.refused)),
            ("standing", c.standing),
            ("unconfirmed", Some(c.unconfirmed)),
        ] {
            if let Some(n) = n {
                out("", &format!("{by}=\"{outcome}\""), n as f64);
            }
        }
    }
}

/// Recent samples' count and percentiles, in µs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplesSummary {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// The median and the 99th percentile.
impl Sample for SamplesSummary {
    fn each(&self, by: &str, out: &mut dyn FnMut(&str, &str, f64)) {
        out("", &format!("{by}=\"0.5\""), self.p50_us);
        out("", &format!("{by}=\"0.99\""), self.p99_us);
    }
}

/// One VM's memory-bandwidth regulation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, Metrics)]
#[serde(default)]
pub struct VmMembw {
    /// The operator's share, permille of the guaranteed bandwidth.
    pub share_permille: u64,
    /// The guest's admitted request, which replaces the operator's share while it stands.
    pub requested_permille: Option<u64>,
    #[metric(
        gauge,
        name = "cosched_vm_membw_share_permille",
        help = "Memory-bandwidth share in force (permille of the guaranteed bandwidth)."
    )]
    pub effective_permille: u64,
    pub guarantee_mbps: f64,
    pub last_period_mbps: f64,
    /// Held back by the regulator (decided; perhaps not in force yet).
    #[metric(
        gauge,
        name = "cosched_vm_membw_stopping",
        help = "1 if the VM is to be held back for memory bandwidth but its freezer group is not frozen yet \
                (a vCPU in uninterruptible sleep keeps a v1 group FREEZING).",
        value = Self::stopping
    )]
    pub throttled: bool,
    /// Held back, and the lever said so.
    #[metric(
        gauge,
        name = "cosched_vm_membw_throttled",
        help = "1 if the VM's vCPUs are held back (frozen, or slowed by resctrl MBA) for memory bandwidth now."
    )]
    pub stopped: bool,
    pub stats: VmBwStats,
}

impl VmMembw {
    /// Held back by decision, not yet by the lever (a v1 freezer group still `FREEZING`).
    pub fn stopping(&self) -> bool {
        self.throttled && !self.stopped
    }
}

/// Counters of one VM's regulation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, Metrics)]
#[serde(default)]
pub struct VmBwStats {
    #[metric(counter, name = "cosched_vm_membw_bytes_total", help = "Memory bytes moved, as the backend counts them.")]
    pub bytes: u64,
    pub last_period_bytes: u64,
    #[metric(
        counter,
        name = "cosched_vm_membw_throttles_total",
        help = "Times the daemon decided to hold the VM back for memory bandwidth (a stop not yet confirmed by the \
                freezer counts too; cosched_vm_membw_unconfirmed_throttles_total counts those never confirmed)."
    )]
    pub throttles: u64,
    #[metric(
        counter,
        name = "cosched_vm_membw_throttled_seconds_total",
        help = "Time held back for memory bandwidth, from the freezer's confirmation (or the MBA change) to the \
                release.",
        unit = "ns"
    )]
    pub throttled_ns: u64,
    #[metric(
        counter,
        name = "cosched_vm_membw_stopping_seconds_total",
        help = "Time between a decision to hold the VM back and the freezer's confirmation that it is stopped.",
        unit = "ns"
    )]
    pub stopping_ns: u64,
    #[metric(
        counter,
        name = "cosched_vm_membw_unconfirmed_throttles_total",
        help = "Decisions to hold the VM back that ended before the freezer confirmed the stop."
    )]
    pub unconfirmed_throttles: u64,
    #[metric(
        counter,
        name = "cosched_vm_membw_borrowed_bytes_total",
        help = "Bytes borrowed from other VMs' unused budget."
    )]
    pub borrowed_bytes: u64,
    pub lent_bytes: u64,
    pub taken_back_bytes: u64,
}

/// A VM's static tunings (`cosched vm static`, `[vm.NAME.static]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct VmStatic {
    /// `fifo 97/98, shield 1 (housekeeping 0)`, or `none`.
    pub tuning: String,
    pub plan: StaticPlan,
    /// What the kernel refused of its shield.
    pub notes: Vec<String>,
    /// The real-time guard of its FIFO vCPUs, while it has one.
    pub guard: Option<cosched_core::guard::StaticGuardStatus>,
}

/// The static tunings in force, resolved against the host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StaticPlan {
    /// (vCPU priority, other threads' priority) at `SCHED_FIFO`.
    pub fifo: Option<(u8, u8)>,
    /// The static guard holds the vCPU threads at this nice instead of FIFO.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guarded: Option<i32>,
    pub shield: Option<ShieldPlan>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ShieldPlan {
    /// The vCPU threads' dedicated CPUs.
    pub vcpus: BTreeSet<usize>,
    /// Where the VM's other threads go.
    pub housekeeping: BTreeSet<usize>,
}

/// A thread: each actuator's setting on it (`sched`, `ioprio`, ..., `static`) and the
/// resources whose boost it carries now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadStatus {
    pub tid: i32,
    #[serde(default)]
    pub comm: String,
    pub role: ThreadRole,
    /// By setting: the names are the actuators' (see [`ThreadStatus::IO_SETTINGS`]).
    #[serde(flatten)]
    pub settings: BTreeMap<String, String>,
    #[serde(default)]
    pub changed_by: Vec<String>,
}

impl ThreadStatus {
    /// The CPU actuator's setting: the scheduling attributes.
    pub const SCHED: &str = "sched";
    /// The I/O lever's settings, one per lever (I/O priority, v1 group, v2 weight).
    pub const IO_SETTINGS: [&str; 3] = ["ioprio", "blkio", "io_weight"];
    /// The static tunings' layer.
    pub const STATIC: &str = "static";

    pub fn sched(&self) -> Option<&str> {
        self.settings.get(Self::SCHED).map(String::as_str)
    }

    /// The I/O lever's setting on the thread, if it has one: (setting, value).
    pub fn io(&self) -> Option<(&'static str, &str)> {
        Self::IO_SETTINGS.iter().find_map(|k| self.settings.get(*k).map(|v| (*k, v.as_str())))
    }

    pub fn statics(&self) -> Option<&str> {
        self.settings.get(Self::STATIC).map(String::as_str)
    }
}

/// One device under a VM's disk image.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Disk {
    pub image: PathBuf,
    /// The kernel's name (`sda`, `loop0`, `nvme0n1`).
    pub device: String,
    /// The scheduler in use (`bfq`, `mq-deadline`, `none`, ...).
    pub scheduler: String,
    /// Whether the kernel offers BFQ for this device.
    pub bfq_available: bool,
}
