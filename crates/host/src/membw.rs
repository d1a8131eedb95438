//! Memory-bandwidth coordination on the host (DREAMS D2.2.3 §2): where the counters come
//! from, probed at start, and the regulation's checks. The policy is the core's
//! [`cosched_core::Regulator`]; the throttle is [`crate::actuator::LeverActuator::throttle`].
//!
//! Backends, in the order `auto` tries them:
//! - **pmu**: per-thread hardware counters of the vCPU threads (`perf_event_open`, the
//!   generic `cache-misses` event: last-level cache misses), × `bytes_per_miss`, regulated
//!   MemGuard-style: a VM over its budget is held back for the rest of the period, by
//!   - **resctrl MBA** where `/sys/fs/resctrl` offers an `MB` resource ([`Mba`]): its vCPU
//!     threads move into a resctrl group of its own whose `MB` line is the floor
//!     (`min_bandwidth` percent, or under `mba_MBps` that percent of `guaranteed_mbps` in MB/s),
//!     so they keep computing but their memory traffic is slowed;
//!   - else the cgroup freezer, which stops them ([`crate::actuator::membw`]).
//!
//!   `[membw] throttle` chooses (`auto`: MBA where found).
//! - **simulated** (only when the config names it): each VM moves the MB/s a trace gives per
//!   second its vCPUs run (read from `/proc/<pid>/task/<tid>/schedstat`), so the whole path
//!   runs end to end (guest request, admission, regulation, a real throttle that really stops
//!   the vCPUs, whose run time then stops adding bytes) on a host with no counters.
//!   `cosched status` says loudly that the figures are simulated.
//! - otherwise: unsupported, with every reason, and guests asking are told
//!   `DENY(membw: unsupported)`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::{fs, io};

use cosched_core::{ConfigError as CoreError, Regulator, RegulatorConfig, VmId, NS_PER_MS};
use cosched_procfs::TaskId;
use serde::{Deserialize, Serialize};

use crate::config::ConfigError;

/// Which counter source `[membw] backend` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendChoice {
    /// The PMU counters; unsupported without them.
    #[default]
    Auto,
    Pmu,
    /// Counters replayed from `trace`: for tests and demos only.
    Simulated,
    /// No memory-bandwidth coordination.
    Off,
}

/// What holds back a VM over its budget (`[membw] throttle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThrottleChoice {
    /// resctrl MBA where the host has it and the counters are real; the freezer otherwise.
    #[default]
    Auto,
    /// resctrl MBA, or no regulation.
    Mba,
    /// The cgroup freezer (stops the vCPUs).
    Freezer,
}

/// Which cgroup freezer the freezer throttle uses (`[membw] freezer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FreezerChoice {
    /// The v1 `freezer` controller where it is bound (the vCPU threads alone), else v2.
    #[default]
    Auto,
    /// cgroup v1: the vCPU threads move into a frozen group of the daemon's.
    V1,
    /// cgroup v2 `cgroup.freeze` of the VM's own group (every thread of the VM), also on a
    /// hybrid host whose v1 freezer is bound.
    V2,
}

/// `[membw]` in the host config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MembwConfig {
    pub backend: BackendChoice,
    /// What holds a VM over its budget back until the period ends.
    pub throttle: ThrottleChoice,
    /// With the freezer throttle: cgroup v1 or v2.
    pub freezer: FreezerChoice,
    /// The host's guaranteed memory bandwidth in MB/s (what the memory system delivers even
    /// under full contention): what the VMs' shares divide. Must be declared (> 0) for any
    /// backend to run.
    pub guaranteed_mbps: u64,
    /// The regulation period: budgets are per period; a VM over its budget stops until it ends.
    pub period_ms: u64,
    /// Counters are read this many times per period: a VM over budget moves at most one such
    /// interval's worth past it before it is stopped.
    pub checks_per_period: u32,
    /// Lend what a VM is predicted not to use, and the bandwidth no share holds.
    pub reclaim: bool,
    /// Once every guarantee is met in a period, let every VM run until it ends.
    pub best_effort: bool,
    /// The share (permille of `guaranteed_mbps`) of a VM with no `[vm.NAME] membw_share`.
    pub default_share_permille: u64,
    /// `simulated`: the trace (lines `<t_ms> <vm name or *> <MB/s per vCPU-second run>`).
    pub trace: Option<PathBuf>,
    /// `pmu`: bytes moved per last-level cache miss (the cache line).
    pub bytes_per_miss: u64,
}

impl Default for MembwConfig {
    fn default() -> Self {
        MembwConfig {
            backend: BackendChoice::Auto,
            throttle: ThrottleChoice::Auto,
            freezer: FreezerChoice::Auto,
            guaranteed_mbps: 0,
            period_ms: 10,
            checks_per_period: 5,
            reclaim: true,
            best_effort: true,
            default_share_permille: 0,
            trace: None,
            bytes_per_miss: 64,
        }
    }
}

impl MembwConfig {
    pub fn regulator(&self) -> RegulatorConfig {
        RegulatorConfig {
            guaranteed_mbps: self.guaranteed_mbps,
            period_ns: self.period_ms * NS_PER_MS,
            reclaim: self.reclaim,
            best_effort: self.best_effort,
        }
    }

    /// Checks what can be checked without probing the host.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=10_000).contains(&self.period_ms) {
            return Err(CoreError::invalid("[membw] period_ms", self.period_ms, "must be 1..=10000").into());
        }
        if !(1..=100).contains(&self.checks_per_period) {
            let rule = "must be 1..=100";
            return Err(CoreError::invalid("[membw] checks_per_period", self.checks_per_period, rule).into());
        }
        if self.default_share_permille > 1000 {
            let rule = "at most 1000";
            return Err(CoreError::invalid("[membw] default_share_permille", self.default_share_permille, rule).into());
        }
        if self.backend == BackendChoice::Simulated && self.trace.is_none() {
            return Err(ConfigError::SimulatedWithoutTrace);
        }
        if self.backend == BackendChoice::Simulated && self.throttle == ThrottleChoice::Mba {
            return Err(ConfigError::SimulatedWithMba);
        }
        if self.bytes_per_miss == 0 {
            return Err(CoreError::range("[membw] bytes_per_miss", "> 0").into());
        }
        Ok(())
    }

    /// How often counters are read (ns).
    pub fn check_ns(&self) -> u64 {
        (self.period_ms * NS_PER_MS / self.checks_per_period as u64).max(1)
    }
}

/// A trace of simulated bandwidth: per VM name (`*`: any other), (from ms, MB/s per second of
/// vCPU run time), in time order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    rows: BTreeMap<String, Vec<(u64, u64)>>,
}

impl Trace {
    pub fn parse(text: &str) -> Result<Trace, TraceError> {
        let mut t = Trace::default();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            let bad = || TraceError::Line { line: n + 1, text: line.to_string() };
            if f.len() != 3 {
                return Err(bad());
            }
            let ms: u64 = f[0].parse().map_err(|_| bad())?;
            let mbps: u64 = f[2].parse().map_err(|_| bad())?;
            let rows = t.rows.entry(f[1].to_string()).or_default();
            if rows.last().is_some_and(|(last, _)| *last > ms) {
                return Err(TraceError::Backwards { line: n + 1 });
            }
            rows.push((ms, mbps));
        }
        if t.rows.is_empty() {
            return Err(TraceError::Empty);
        }
        Ok(t)
    }

    pub fn load(path: &Path) -> Result<Trace, TraceError> {
        let text = fs::read_to_string(path).map_err(|error| TraceError::Read { path: path.into(), error })?;
        Trace::parse(&text).map_err(|error| TraceError::Parse { path: path.into(), error: Box::new(error) })
    }

    /// MB/s per second of vCPU run time of VM `name` at `t_ms` (0 before its first row).
    pub fn rate(&self, name: &str, t_ms: u64) -> u64 {
        let rows = self.rows.get(name).or_else(|| self.rows.get("*"));
        rows.and_then(|r| r.iter().take_while(|(from, _)| *from <= t_ms).last()).map_or(0, |(_, mbps)| *mbps)
    }
}

/// A trace that cannot be replayed: where, and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("line {line}: {text:?}: expected <t_ms> <vm name or *> <MB/s>")]
    Line { line: usize, text: String },
    #[error("line {line}: times must not go back")]
    Backwards { line: usize },
    #[error("no rows")]
    Empty,
    #[error("reading trace {}: {error}", .path.display())]
    Read { path: PathBuf, error: io::Error },
    #[error("trace {}: {error}", .path.display())]
    Parse { path: PathBuf, error: Box<TraceError> },
}

/// After a check's decisions: asks `in_force` about each VM the regulator has throttled whose
/// stop is not confirmed yet (one read of its freezer group, never a wait), and confirms those
/// whose throttle is in force. A VM whose group still reads `FREEZING` (a vCPU in
/// uninterruptible sleep) stays throttled but not stopped, and is asked again at the next
/// check; the period's end lets it run whether or not it ever stopped.
pub fn confirm_stops(reg: &mut Regulator, now: u64, mut in_force: impl FnMut(VmId) -> Option<bool>) {
    let stopping: Vec<VmId> = reg.stopping().collect();
    for id in stopping {
        if in_force(id) == Some(true) {
            reg.confirm_stop(id, now);
        }
    }
}

/// The counters of one VM's vCPU threads.
pub trait CounterSource {
    /// Bytes the VM moved since the last call for it (0 at the first), from its vCPU threads
    /// `vcpus`; `name` and `now` (ns since the daemon started) for a trace.
    fn read(&mut self, vm: VmId, name: &str, vcpus: &[TaskId], now: u64) -> u64;
    fn forget(&mut self, vm: VmId);
}

/// `simulated`: a trace's rate × the vCPUs' run time.
pub struct Simulated {
    pub trace: Trace,
    proc_root: PathBuf,
    /// Per VM, per vCPU thread: its run time at the last read.
    last: BTreeMap<VmId, BTreeMap<TaskId, u64>>,
}

impl Simulated {
    pub fn new(trace: Trace, proc_root: impl Into<PathBuf>) -> Simulated {
        Simulated { trace, proc_root: proc_root.into(), last: BTreeMap::new() }
    }

    /// The run time of a thread (`schedstat`'s first field, ns).
    fn runtime(&self, t: TaskId) -> Option<u64> {
        let p = self.proc_root.join(t.id.to_string()).join("schedstat");
        fs::read_to_string(p).ok()?.split_whitespace().next()?.parse().ok()
    }
}

impl CounterSource for Simulated {
    fn read(&mut self, vm: VmId, name: &str, vcpus: &[TaskId], now: u64) -> u64 {
        let rate = self.trace.rate(name, now / NS_PER_MS);
        let now_run: BTreeMap<TaskId, u64> = vcpus.iter().filter_map(|t| self.runtime(*t).map(|r| (*t, r))).collect();
        let ran: u64 = match self.last.get(&vm) {
            Some(last) => now_run.iter().filter_map(|(t, r)| last.get(t).map(|l| r.saturating_sub(*l))).sum(),
            None => 0,
        };
        self.last.insert(vm, now_run);
        // MB/s × ns of run time: bytes.
        (rate as u128 * ran as u128 / 1000) as u64
    }

    fn forget(&mut self, vm: VmId) {
        self.last.remove(&vm);
    }
}

/// `perf_event_attr` up to `config1` (`PERF_ATTR_SIZE_VER1`, 72 bytes).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

const PERF_TYPE_HARDWARE: u32 = 0;
const PERF_COUNT_HW_CACHE_MISSES: u64 = 3;
/// `exclude_hv`: the hypervisor's own misses are not the guest's.
const PERF_FLAG_EXCLUDE_HV: u64 = 1 << 6;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// Opens the `cache-misses` counter of thread `tid` (0: the caller) on any CPU.
fn perf_open(tid: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let attr = PerfEventAttr {
        kind: PERF_TYPE_HARDWARE,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: PERF_COUNT_HW_CACHE_MISSES,
        flags: PERF_FLAG_EXCLUDE_HV,
        ..Default::default()
    };
    // SAFETY: `attr` is a valid perf_event_attr of the size it says, alive for the call.
    let fd = unsafe {
        libc::syscall(libc::SYS_perf_event_open, &attr as *const PerfEventAttr, tid, -1i32, -1i32, PERF_FLAG_FD_CLOEXEC)
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// The kernel refuses the PMU counter the `pmu` backend reads.
#[derive(Debug, thiserror::Error)]
#[error(
    "perf_event_open(cache-misses) is refused: {0} (no hardware PMU events on this host, or perf_event_paranoid \
     forbids them)"
)]
pub struct PmuRefused(pub io::Error);

/// `pmu`: last-level cache misses of each vCPU thread.
pub struct Pmu {
    bytes_per_miss: u64,
    counters: BTreeMap<VmId, BTreeMap<TaskId, (std::os::fd::OwnedFd, u64)>>,
}

impl Pmu {
    /// Probes: the counter must open on the daemon's own thread.
    pub fn probe(bytes_per_miss: u64) -> Result<Pmu, PmuRefused> {
        perf_open(0).map_err(PmuRefused)?;
        Ok(Pmu { bytes_per_miss, counters: BTreeMap::new() })
    }

    fn count(fd: &std::os::fd::OwnedFd) -> Option<u64> {
        use std::os::fd::AsRawFd;
        let mut v = 0u64;
        // SAFETY: reading 8 bytes into a u64 from a perf event descriptor we own.
        let n = unsafe { libc::read(fd.as_raw_fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
        (n == 8).then_some(v)
    }
}

impl CounterSource for Pmu {
    fn read(&mut self, vm: VmId, _name: &str, vcpus: &[TaskId], _now: u64) -> u64 {
        let per_vm = self.counters.entry(vm).or_default();
        per_vm.retain(|t, _| vcpus.contains(t));
        let mut misses = 0;
        for t in vcpus {
            match per_vm.get_mut(t) {
                Some((fd, last)) => {
                    if let Some(v) = Pmu::count(fd) {
                        misses += v.saturating_sub(*last);
                        *last = v;
                    }
                }
                None => {
                    if let Ok(fd) = perf_open(t.id) {
                        let v = Pmu::count(&fd).unwrap_or(0);
                        per_vm.insert(*t, (fd, v));
                    }
                }
            }
        }
        misses * self.bytes_per_miss
    }

    fn forget(&mut self, vm: VmId) {
        self.counters.remove(&vm);
    }
}

/// What the probe found: the source, the throttle, and how it is described in `cosched status`.
pub struct Probed {
    pub name: &'static str,
    pub source: Box<dyn CounterSource>,
    /// resctrl MBA, when it is the throttle; the cgroup freezer otherwise.
    pub mba: Option<Mba>,
    /// What else the probe saw (a resctrl it does not use, and why).
    pub notes: Vec<String>,
}

/// Why resctrl's MBA at `root` cannot be the throttle.
#[derive(Debug, thiserror::Error)]
pub enum MbaError {
    #[error("no resctrl at {} (not mounted, or no Intel RDT / AMD PQoS)", .root.display())]
    NoResctrl { root: PathBuf },
    #[error("resctrl at {} has no MB resource (no memory-bandwidth allocation)", .root.display())]
    NoMb { root: PathBuf },
    #[error("resctrl at {}: info/MB/min_bandwidth is missing", .root.display())]
    NoMinBandwidth { root: PathBuf },
    /// AMD's `MB` values are bandwidths in 1/8 GB/s with a minimum of 0.
    #[error(
        "resctrl at {}: MB values here are not percents (min_bandwidth {min_bandwidth}; AMD's are in 1/8 GB/s), \
         which this version does not drive",
        .root.display()
    )]
    NotPercent { root: PathBuf, min_bandwidth: u64 },
    #[error("resctrl at {}: reading schemata: {error}", .root.display())]
    Schemata { root: PathBuf, error: io::Error },
    #[error("resctrl at {}: the default group's schemata has no MB line", .root.display())]
    NoMbLine { root: PathBuf },
    #[error("resctrl at {}: no domain in the MB line {line:?}", .root.display())]
    NoDomain { root: PathBuf, line: String },
}

/// resctrl's memory-bandwidth allocation (Intel RDT MBA, AMD PQoS), as the kernel offers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mba {
    pub root: PathBuf,
    /// Mounted with `mba_MBps`: `MB` values are MB/s (the kernel's software controller holds
    /// each group to them from its MBM counts) rather than percent of the peak.
    pub mbps: bool,
    /// The domains (memory controllers, L3 ids) of the default group's `MB` line.
    pub domains: Vec<String>,
    /// `info/MB/min_bandwidth`: the lowest percent a group may get.
    pub min_percent: u64,
    /// `info/MB/num_closids`: how many groups (the default one included) the hardware has.
    pub closids: Option<u64>,
}

impl Mba {
    /// resctrl's MBA at `root`, if the kernel offers it; `mounts` is `/proc/mounts`.
    pub fn probe(root: &Path, mounts: &str) -> Result<Mba, MbaError> {
        let root_buf = || root.to_path_buf();
        if !root.join("info").is_dir() {
            return Err(MbaError::NoResctrl { root: root_buf() });
        }
        if !root.join("info/MB").is_dir() {
            return Err(MbaError::NoMb { root: root_buf() });
        }
        let read = |f: &str| fs::read_to_string(root.join(f)).map(|s| s.trim().to_string());
        let min_percent = read("info/MB/min_bandwidth")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| MbaError::NoMinBandwidth { root: root_buf() })?;
        if !(1..=100).contains(&min_percent) {
            // AMD's MB values are bandwidths in 1/8 GB/s with a minimum of 0, not percents.
            return Err(MbaError::NotPercent { root: root_buf(), min_bandwidth: min_percent });
        }
        let schemata = read("schemata").map_err(|error| MbaError::Schemata { root: root_buf(), error })?;
        let line = schemata
            .lines()
            .find_map(|l| l.trim().strip_prefix("MB:"))
            .ok_or_else(|| MbaError::NoMbLine { root: root_buf() })?;
        let domains: Vec<String> =
            line.split(';').filter_map(|d| d.split_once('=')).map(|(id, _)| id.trim().to_string()).collect();
        if domains.is_empty() {
            return Err(MbaError::NoDomain { root: root_buf(), line: line.to_string() });
        }
        let mbps = mounts.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[2] == "resctrl" && Path::new(f[1]) == root && f[3].split(',').any(|o| o == "mba_MBps")
        });
        let closids = read("info/MB/num_closids").ok().and_then(|v| v.parse().ok());
        Ok(Mba { root: root.to_path_buf(), mbps, domains, min_percent, closids })
    }

    /// The `MB` value of a VM held back: the lowest percent, or under `mba_MBps` that share
    /// of the guaranteed bandwidth in MB/s (at least 1).
    pub fn floor(&self, guaranteed_mbps: u64) -> u64 {
        if self.mbps {
            (guaranteed_mbps * self.min_percent / 100).max(1)
        } else {
            self.min_percent
        }
    }

    /// The `schemata` a held-back VM's group gets: the floor in every domain.
    pub fn schemata(&self, guaranteed_mbps: u64) -> String {
        let v = self.floor(guaranteed_mbps);
        let domains: Vec<String> = self.domains.iter().map(|d| format!("{d}={v}")).collect();
        format!("MB:{}\n", domains.join(";"))
    }

    pub fn describe(&self, guaranteed_mbps: u64) -> String {
        format!(
            "resctrl MBA at {} ({}, {} domain(s), {}): a VM over its budget is slowed to MB {}{} in a resctrl group \
             of its own",
            self.root.display(),
            if self.mbps { "mba_MBps" } else { "percent" },
            self.domains.len(),
            self.closids.map_or("CLOSIDs unknown".to_string(), |c| format!("{c} CLOSIDs, one per VM held back")),
            self.floor(guaranteed_mbps),
            if self.mbps { " MB/s" } else { "%" },
        )
    }
}

/// Why memory-bandwidth coordination is unsupported here, with every reason.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("off: [membw] backend = \"off\"")]
    Off,
    #[error(
        "[membw] guaranteed_mbps is not declared: set it to the memory bandwidth (MB/s) this host guarantees under \
         contention, which the VMs' shares divide"
    )]
    NoGuarantee,
    #[error("[membw] backend = \"simulated\" needs trace")]
    NoTrace,
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// `[membw] throttle = "mba"`, and there is none.
    #[error("[membw] throttle = \"mba\" but {0}")]
    NoMba(MbaError),
    /// `[membw] backend = "pmu"`, and there is none.
    #[error(transparent)]
    Pmu(#[from] PmuRefused),
    /// `auto` found no counters: what it saw of MBA too, then the PMU's refusal.
    #[error("unsupported here because {}{pmu}", .mba.as_ref().map_or(String::new(), |m| format!("{m}; and ")))]
    NoCounters { mba: Option<MbaSeen>, pmu: PmuRefused },
}

/// What the `auto` probe saw of resctrl MBA when it found no counters.
#[derive(Debug, thiserror::Error)]
pub enum MbaSeen {
    #[error(transparent)]
    Absent(MbaError),
    #[error("resctrl MBA at {} can slow a VM but gives no per-VM counts to regulate on", .0.display())]
    NoCounts(PathBuf),
}

/// Probes the backend `cfg` asks for, and the throttle. `Err` says why memory-bandwidth
/// coordination is unsupported here, with every reason.
pub fn probe(cfg: &MembwConfig, resctrl: &Path, proc_root: &Path) -> Result<Probed, ProbeError> {
    if cfg.backend == BackendChoice::Off {
        return Err(ProbeError::Off);
    }
    if cfg.guaranteed_mbps == 0 {
        return Err(ProbeError::NoGuarantee);
    }
    if cfg.backend == BackendChoice::Simulated {
        let path = cfg.trace.as_ref().ok_or(ProbeError::NoTrace)?;
        let trace = Trace::load(path)?;
        let source = Box::new(Simulated::new(trace, proc_root));
        return Ok(Probed { name: "simulated", source, mba: None, notes: Vec::new() });
    }
    let mounts = fs::read_to_string(proc_root.join("mounts")).unwrap_or_default();
    // Without MBA under `auto`, the reason is a note (the freezer throttles instead).
    let (mba, absent) = match (cfg.throttle, Mba::probe(resctrl, &mounts)) {
        (ThrottleChoice::Freezer, _) => (None, None),
        (_, Ok(m)) => (Some(m), None),
        (ThrottleChoice::Mba, Err(why)) => return Err(ProbeError::NoMba(why)),
        (ThrottleChoice::Auto, Err(why)) => (None, Some(why)),
    };
    match Pmu::probe(cfg.bytes_per_miss) {
        Ok(pmu) => {
            let notes = absent.iter().map(MbaError::to_string).collect();
            Ok(Probed { name: "pmu", source: Box::new(pmu), mba, notes })
        }
        Err(pmu) if cfg.backend == BackendChoice::Auto => {
            let seen = match (absent, &mba) {
                (Some(why), _) => Some(MbaSeen::Absent(why)),
                (None, Some(m)) => Some(MbaSeen::NoCounts(m.root.clone())),
                (None, None) => None,
            };
            Err(ProbeError::NoCounters { mba: seen, pmu })
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_gives_each_vm_its_rate_over_time() {
        let t = Trace::parse("# t_ms vm MB/s\n0 * 100\n0 rt 500\n1000 rt 0 # idle\n2000 rt 800\n").unwrap();
        assert_eq!((t.rate("rt", 0), t.rate("rt", 999), t.rate("rt", 1500), t.rate("rt", 5000)), (500, 500, 0, 800));
        assert_eq!(t.rate("other", 10), 100);
        for bad in ["", "0 a", "x a 1", "10 a 1\n5 a 2"] {
            assert!(Trace::parse(bad).is_err(), "{bad:?}");
        }
    }

    /// The typed errors say what the strings said, word for word (the status shows them).
    #[test]
    fn errors_say_what_was_missing_and_where() {
        assert_eq!(
            Trace::parse("0 a\n").unwrap_err().to_string(),
            r#"line 1: "0 a": expected <t_ms> <vm name or *> <MB/s>"#
        );
        assert_eq!(Trace::parse("10 a 1\n5 a 2").unwrap_err().to_string(), "line 2: times must not go back");
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("t");
        fs::write(&t, "# nothing\n").unwrap();
        assert_eq!(Trace::load(&t).unwrap_err().to_string(), format!("trace {}: no rows", t.display()));
        let pmu = || PmuRefused(io::Error::from_raw_os_error(libc::ENOENT));
        let refused = "perf_event_open(cache-misses) is refused: No such file or directory (os error 2) (no hardware \
                       PMU events on this host, or perf_event_paranoid forbids them)";
        assert_eq!(pmu().to_string(), refused);
        let e = ProbeError::NoCounters { mba: Some(MbaSeen::NoCounts("/rc".into())), pmu: pmu() };
        assert_eq!(
            e.to_string(),
            format!(
                "unsupported here because resctrl MBA at /rc can slow a VM but gives no per-VM counts to regulate on; \
                 and {refused}"
            )
        );
        let e = ProbeError::NoCounters {
            mba: Some(MbaSeen::Absent(MbaError::NoResctrl { root: "/rc".into() })),
            pmu: pmu(),
        };
        assert_eq!(
            e.to_string(),
            format!(
                "unsupported here because no resctrl at /rc (not mounted, or no Intel RDT / AMD PQoS); and {refused}"
            )
        );
        assert_eq!(
            ProbeError::NoCounters { mba: None, pmu: pmu() }.to_string(),
            format!("unsupported here because {refused}")
        );
        assert_eq!(
            ProbeError::NoMba(MbaError::NoMb { root: "/rc".into() }).to_string(),
            "[membw] throttle = \"mba\" but resctrl at /rc has no MB resource (no memory-bandwidth allocation)"
        );
        assert_eq!(
            MbaError::NotPercent { root: "/rc".into(), min_bandwidth: 0 }.to_string(),
            "resctrl at /rc: MB values here are not percents (min_bandwidth 0; AMD's are in 1/8 GB/s), which this \
             version does not drive"
        );
        assert_eq!(
            ProbeError::NoGuarantee.to_string(),
            "[membw] guaranteed_mbps is not declared: set it to the memory bandwidth (MB/s) this host guarantees \
             under contention, which the VMs' shares divide"
        );
    }

    #[test]
    fn simulated_bytes_are_the_rate_times_the_vcpus_run_time() {
        let d = tempfile::tempdir().unwrap();
        let write = |tid: i32, ns: u64| {
            fs::create_dir_all(d.path().join(tid.to_string())).unwrap();
            fs::write(d.path().join(format!("{tid}/schedstat")), format!("{ns} 5 7\n")).unwrap();
        };
        write(11, 1_000_000_000);
        write(12, 0);
        let vcpus = [TaskId { id: 11, start_time: 1 }, TaskId { id: 12, start_time: 1 }];
        let mut s = Simulated::new(Trace::parse("0 vm 1000\n").unwrap(), d.path());
        assert_eq!(s.read(VmId(1), "vm", &vcpus, 0), 0, "the first read is the baseline");
        write(11, 1_500_000_000); // 0.5 s run
        write(12, 250_000_000); // 0.25 s
        assert_eq!(s.read(VmId(1), "vm", &vcpus, 10), 750_000_000, "1000 MB/s × 0.75 s");
        assert_eq!(s.read(VmId(1), "vm", &vcpus, 20), 0, "a stopped vCPU moves nothing");
        assert_eq!(s.read(VmId(2), "other", &vcpus, 20), 0);
    }

    #[test]
    fn the_probe_names_every_reason_and_simulated_only_when_asked() {
        let d = tempfile::tempdir().unwrap();
        let declared = MembwConfig { guaranteed_mbps: 5000, ..MembwConfig::default() };
        let undeclared = probe(&MembwConfig::default(), d.path(), d.path()).err().unwrap().to_string();
        assert!(undeclared.contains("guaranteed_mbps is not declared"), "{undeclared}");
        // No resctrl in an empty tree; a PMU if this host has one.
        match probe(&declared, &d.path().join("resctrl"), d.path()) {
            Ok(p) => assert_eq!((p.name, p.notes.len()), ("pmu", 1)),
            Err(e) => assert!(
                e.to_string().starts_with("unsupported here because no resctrl at")
                    && e.to_string().contains("perf_event_open(cache-misses)"),
                "{e}"
            ),
        }
        // A resctrl with MBA is the throttle where the counters are real (here: no PMU, so
        // still unsupported, and the reason says MBA alone cannot regulate).
        let rc = d.path().join("rc");
        fs::create_dir_all(rc.join("info/MB")).unwrap();
        fs::write(rc.join("info/MB/min_bandwidth"), "10\n").unwrap();
        fs::write(rc.join("info/MB/num_closids"), "8\n").unwrap();
        fs::write(rc.join("schemata"), "    L3:0=7ff;1=7ff\n    MB:0=100;1=100\n").unwrap();
        match probe(&declared, &rc, d.path()) {
            Ok(p) => assert_eq!((p.name, p.mba.map(|m| m.domains.len())), ("pmu", Some(2))),
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("resctrl MBA at") && e.contains("gives no per-VM counts"), "{e}")
            }
        }
        let freezer = MembwConfig { throttle: ThrottleChoice::Freezer, ..declared.clone() };
        if let Ok(p) = probe(&freezer, &rc, d.path()) {
            assert!(p.mba.is_none(), "throttle = freezer never uses MBA");
        }
        fs::remove_dir_all(rc.join("info/MB")).unwrap();
        let e = probe(&declared, &rc, d.path()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.is_empty() || e.contains("has no MB resource"), "{e}");
        let mba = MembwConfig { throttle: ThrottleChoice::Mba, ..declared.clone() };
        let e = probe(&mba, &rc, d.path()).err().unwrap().to_string();
        assert!(e.starts_with("[membw] throttle = \"mba\" but resctrl at") && e.contains("no MB resource"), "{e}");
        // Simulated is used only when named, and needs its trace.
        let trace = d.path().join("t");
        fs::write(&trace, "0 * 100\n").unwrap();
        let sim = MembwConfig { backend: BackendChoice::Simulated, trace: Some(trace), ..declared.clone() };
        assert_eq!(probe(&sim, d.path(), d.path()).ok().unwrap().name, "simulated");
        let missing = MembwConfig { trace: Some(d.path().join("none")), ..sim.clone() };
        assert!(probe(&missing, d.path(), d.path()).err().unwrap().to_string().contains("reading trace"));
        assert!(MembwConfig { trace: None, ..sim }.validate().unwrap_err().to_string().contains("needs trace"));
        let off = MembwConfig { backend: BackendChoice::Off, ..declared };
        assert!(probe(&off, d.path(), d.path()).err().unwrap().to_string().starts_with("off"));
    }

    #[test]
    fn mba_is_probed_from_resctrl_and_its_floor_is_percent_or_mbps() {
        let d = tempfile::tempdir().unwrap();
        let rc = d.path().join("resctrl");
        assert!(Mba::probe(&rc, "").unwrap_err().to_string().starts_with("no resctrl at"));
        fs::create_dir_all(rc.join("info/MB")).unwrap();
        assert!(Mba::probe(&rc, "").unwrap_err().to_string().contains("min_bandwidth is missing"));
        fs::write(rc.join("info/MB/min_bandwidth"), "0\n").unwrap();
        assert!(Mba::probe(&rc, "").unwrap_err().to_string().contains("not percents (min_bandwidth 0"));
        fs::write(rc.join("info/MB/min_bandwidth"), "10\n").unwrap();
        assert!(Mba::probe(&rc, "").unwrap_err().to_string().contains("reading schemata"));
        fs::write(rc.join("schemata"), "    L3:0=fff\n").unwrap();
        assert!(Mba::probe(&rc, "").unwrap_err().to_string().contains("no MB line"));
        fs::write(rc.join("schemata"), "    L3:0=fff;1=fff\n    MB:0=100;1=100\n").unwrap();
        let m = Mba::probe(&rc, "").unwrap();
        assert_eq!(
            (m.mbps, m.domains.clone(), m.min_percent, m.closids),
            (false, vec!["0".into(), "1".into()], 10, None)
        );
        assert_eq!(m.schemata(5000), "MB:0=10;1=10\n", "percent: the lowest the hardware allows");
        // Mounted with mba_MBps (at this root, not another): MB/s, the lowest percent of the
        // guaranteed bandwidth.
        let other = "resctrl /mnt/other resctrl rw,mba_MBps 0 0\n";
        assert!(!Mba::probe(&rc, other).unwrap().mbps);
        let mounts = format!("sysfs /sys sysfs rw 0 0\nresctrl {} resctrl rw,relatime,mba_MBps 0 0\n", rc.display());
        fs::write(rc.join("info/MB/num_closids"), "16\n").unwrap();
        let m = Mba::probe(&rc, &mounts).unwrap();
        assert_eq!((m.mbps, m.closids), (true, Some(16)));
        assert_eq!((m.schemata(5000), m.floor(3)), ("MB:0=500;1=500\n".to_string(), 1));
        assert!(m.describe(5000).contains("mba_MBps, 2 domain(s), 16 CLOSIDs"), "{}", m.describe(5000));
        // MBA cannot slow what the simulated source counts (vCPU run time).
        let sim = MembwConfig {
            backend: BackendChoice::Simulated,
            throttle: ThrottleChoice::Mba,
            trace: Some("t".into()),
            ..MembwConfig::default()
        };
        assert!(sim.validate().unwrap_err().to_string().contains("needs real counters"));
    }
}
