//! How a boosted VM's threads are scheduled (config `[boost]`) and the kernel's limits on it.

use cosched_core::{ConfigError as CoreError, Grant, Level};
use cosched_procfs::ThreadRole;
use serde::{Deserialize, Serialize};

use crate::config::ConfigError;
use crate::sched::{SchedAttr, SCHED_FIFO, SCHED_FLAG_RESET_ON_FORK, SCHED_RR};

/// The scheduling class of a boost (config `[boost] policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BoostPolicy {
    /// Every thread `SCHED_RR` at the VM's priority (as in the Coordinated Task Scheduling paper).
    Rr,
    /// Every thread `SCHED_FIFO` at the VM's priority.
    Fifo,
    /// vCPU threads get a `SCHED_DEADLINE` reservation (`deadline_runtime_us` every
    /// `deadline_period_us`); the other threads `SCHED_FIFO` at the VM's priority.
    Deadline,
    /// Every thread `SCHED_OTHER` at `boost_nice`: no real-time class at all.
    Nice,
}

impl BoostPolicy {
    /// Whether vCPU threads run at an RT class the kernel's RT throttling applies to, and so
    /// need the real-time guard.
    pub fn needs_rt_guard(self) -> bool {
        matches!(self, BoostPolicy::Rr | BoostPolicy::Fifo)
    }
}

/// How a boosted VM's threads are scheduled (config section `[boost]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BoostClass {
    pub policy: BoostPolicy,
    /// Non-vCPU threads (main loop, I/O threads, workers) run this many priority levels above
    /// the vCPUs. Under TCG the main loop delivers the guest's timer interrupts (the Performance
    /// Tuning paper puts the I/O thread above the vCPU).
    pub other_threads_priority_offset: u8,
    /// Nice value of the vCPU threads while the real-time guard holds them off the real-time
    /// class ([`Level::Guarded`]).
    pub guard_nice: i32,
    /// `policy = "deadline"`: each vCPU thread's reservation.
    pub deadline_runtime_us: u64,
    pub deadline_period_us: u64,
    /// `policy = "nice"`: the nice value of every thread.
    pub boost_nice: i32,
}

impl Default for BoostClass {
    fn default() -> Self {
        BoostClass {
            policy: BoostPolicy::Rr,
            other_threads_priority_offset: 0,
            guard_nice: -20,
            deadline_runtime_us: 900,
            deadline_period_us: 1000,
            boost_nice: -20,
        }
    }
}

impl BoostClass {
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, value) in [("guard_nice", self.guard_nice), ("boost_nice", self.boost_nice)] {
            if !(-20..=19).contains(&value) {
                return Err(ConfigError::Nice { key, value });
            }
        }
        if self.other_threads_priority_offset > 10 {
            return Err(CoreError::range("other_threads_priority_offset", "0..=10").into());
        }
        // The running kernel's sysctls only matter when the reservation is used; the fixed
        // limits always do (a value that can never work is a typo).
        let limits = match self.policy {
            BoostPolicy::Deadline => DeadlineLimits::of_running_kernel(),
            _ => DeadlineLimits { period_min_us: 1, period_max_us: u64::MAX / 1000, max_bandwidth: None },
        };
        Ok(self.validate_deadline(&limits)?)
    }

    /// The checks `sched_setattr(2)` makes on a `SCHED_DEADLINE` reservation
    /// (`__checkparam_dl()` and the admission test in kernel/sched/deadline.c), so that a
    /// reservation the kernel would always refuse is an error at config load, not at every boost.
    pub fn validate_deadline(&self, k: &DeadlineLimits) -> Result<(), CoreError> {
        let (runtime_us, period_us) = (self.deadline_runtime_us, self.deadline_period_us);
        if runtime_us * 1000 < DL_MIN_RUNTIME_NS {
            return Err(CoreError::invalid(
                "deadline_runtime_us",
                runtime_us,
                format!(
                    "below the kernel's minimum SCHED_DEADLINE runtime of {DL_MIN_RUNTIME_NS} ns (2^DL_SCALE); use \
                     at least {} µs",
                    DL_MIN_RUNTIME_NS.div_ceil(1000)
                ),
            ));
        }
        if period_us < k.period_min_us || period_us > k.period_max_us {
            return Err(CoreError::invalid(
                "deadline_period_us",
                period_us,
                format!(
                    "outside the kernel's {}..={} µs (/proc/sys/kernel/sched_deadline_period_min_us, _max_us)",
                    k.period_min_us, k.period_max_us
                ),
            ));
        }
        if runtime_us > period_us {
            let rule = format!("at most deadline_period_us = {period_us}");
            return Err(CoreError::conflict("deadline_runtime_us", runtime_us, rule));
        }
        if let Some((rt_runtime_us, rt_period_us)) = k.max_bandwidth {
            // One reservation may use at most sched_rt_runtime_us / sched_rt_period_us of a CPU.
            if runtime_us as u128 * rt_period_us as u128 > rt_runtime_us as u128 * period_us as u128 {
                return Err(CoreError::invalid(
                    "deadline_runtime_us / deadline_period_us",
                    format!("{runtime_us}/{period_us}"),
                    format!(
                        "above the kernel's admission limit of {rt_runtime_us}/{rt_period_us} of a CPU \
                         (sched_rt_runtime_us / sched_rt_period_us)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Target attributes of a thread, or `None` for its original ones. `vcpus_known` is false
    /// when QEMU runs without `debug-threads=on`: then every thread but the main one is treated
    /// as a vCPU.
    ///
    /// An RT co-scheduling grant ([`Grant::Rt`]: the guest named its priority) is `SCHED_FIFO`
    /// at its priority instead of `policy = "rr"` (the other classes stay as they are).
    pub fn target(
        &self,
        level: Level,
        role: ThreadRole,
        vcpus_known: bool,
        grant: impl Into<Grant>,
    ) -> Option<SchedAttr> {
        let (priority, policy) = match grant.into() {
            Grant::Rt { priority } if self.policy == BoostPolicy::Rr => (priority, BoostPolicy::Fifo),
            g => (g.priority(), self.policy),
        };
        let is_vcpu = is_vcpu(role, vcpus_known);
        let rt = |policy: u32, offset: u8| {
            let prio = (priority as u32 + offset as u32).min(*cosched_core::VM_PRIORITY.end() as u32);
            SchedAttr::rt(policy, prio, SCHED_FLAG_RESET_ON_FORK)
        };
        let offset = if is_vcpu { 0 } else { self.other_threads_priority_offset };
        if level == Level::Normal {
            return None;
        }
        Some(match policy {
            BoostPolicy::Rr | BoostPolicy::Fifo if level == Level::Guarded && is_vcpu => {
                SchedAttr::other(self.guard_nice, SCHED_FLAG_RESET_ON_FORK)
            }
            BoostPolicy::Rr => rt(SCHED_RR, offset),
            BoostPolicy::Fifo => rt(SCHED_FIFO, offset),
            BoostPolicy::Deadline if is_vcpu => SchedAttr::deadline(
                self.deadline_runtime_us * 1000,
                self.deadline_period_us * 1000,
                SCHED_FLAG_RESET_ON_FORK,
            ),
            BoostPolicy::Deadline => rt(SCHED_FIFO, offset),
            BoostPolicy::Nice => SchedAttr::other(self.boost_nice, SCHED_FLAG_RESET_ON_FORK),
        })
    }
}

/// `sched_runtime` below 2^DL_SCALE ns is refused by `__checkparam_dl()`.
pub const DL_MIN_RUNTIME_NS: u64 = 1 << 10;

/// The running kernel's limits on a `SCHED_DEADLINE` reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadlineLimits {
    pub period_min_us: u64,
    pub period_max_us: u64,
    /// (`sched_rt_runtime_us`, `sched_rt_period_us`), `None` when unlimited (runtime -1).
    pub max_bandwidth: Option<(u64, u64)>,
}

impl Default for DeadlineLimits {
    /// The kernel's defaults.
    fn default() -> Self {
        DeadlineLimits { period_min_us: 100, period_max_us: 1 << 22, max_bandwidth: Some((950_000, 1_000_000)) }
    }
}

impl DeadlineLimits {
    /// Read from `/proc/sys/kernel`; a value that cannot be read keeps the kernel's default.
    pub fn of_running_kernel() -> DeadlineLimits {
        DeadlineLimits::read(std::path::Path::new("/proc/sys/kernel"))
    }

    pub fn read(dir: &std::path::Path) -> DeadlineLimits {
        let num = |f: &str| std::fs::read_to_string(dir.join(f)).ok().and_then(|s| s.trim().parse::<i64>().ok());
        let d = DeadlineLimits::default();
        let (rt_runtime, rt_period) = d.max_bandwidth.unwrap();
        DeadlineLimits {
            period_min_us: num("sched_deadline_period_min_us").map_or(d.period_min_us, |v| v.max(0) as u64),
            period_max_us: num("sched_deadline_period_max_us").map_or(d.period_max_us, |v| v.max(0) as u64),
            max_bandwidth: match num("sched_rt_runtime_us") {
                Some(-1) => None,
                r => Some((
                    r.map_or(rt_runtime, |v| v.max(0) as u64),
                    num("sched_rt_period_us").map_or(rt_period, |v| v.max(1) as u64),
                )),
            },
        }
    }
}

/// Whether a thread of `role` runs guest code: a vCPU thread, or, when QEMU does not name its
/// threads (`vcpus_known` false), any thread but the main one.
pub fn is_vcpu(role: ThreadRole, vcpus_known: bool) -> bool {
    role == ThreadRole::Vcpu || (!vcpus_known && role != ThreadRole::Main)
}
