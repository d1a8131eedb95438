//! A model of VMs sharing a memory system, regulated by [`Regulator`]: the experiment `membw`
//! and the unit tests drive the daemon's own policy with it.
//!
//! Each check interval (`period / checks_per_period`) every VM that is not throttled offers
//! what it wants to move: a streaming VM as much as it can (`max_mbps`), a VM with a rate as
//! much as it has waiting (work arrives at the rate, and what could not be moved waits, up to
//! `max_mbps`). When the offers add up to more than the memory system delivers
//! (`capacity_mbps`), each VM gets its part in proportion to its offer. The regulator then sees
//! what each VM moved, as the daemon sees counters, and its throttle decisions hold from the
//! next interval on.

use serde::{Deserialize, Serialize};

use super::{Regulator, RegulatorConfig, Throttle};
use crate::{ConfigError, MembwError, VmId, NS_PER_MS, NS_PER_S};

/// Why a scenario does not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// A setting of the model or the regulator out of range.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The regulator refuses a VM's share.
    #[error("{name}: {error}")]
    Share { name: String, error: MembwError },
}

/// What a VM wants from some time on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Demand {
    /// As much as it can (a bandwidth hog, the paper's buffer-copy benchmark).
    Stream,
    /// Work arrives at this many MB/s; what waits is moved as soon as it can be.
    Rate(u64),
    /// Nothing.
    Idle,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimVm {
    pub name: String,
    /// The operator's share, permille of the guaranteed bandwidth.
    pub share: u64,
    /// What it moves at most, alone on the machine (MB/s).
    pub max_mbps: u64,
    /// (from ms, demand), in time order; before the first entry it is idle.
    pub demand: Vec<(u64, Demand)>,
}

impl SimVm {
    fn demand_at(&self, t_ms: u64) -> Demand {
        self.demand.iter().take_while(|(from, _)| *from <= t_ms).last().map_or(Demand::Idle, |d| d.1)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimConfig {
    /// `None`: unregulated (the baseline).
    pub regulator: Option<RegulatorConfig>,
    /// What the memory system delivers in total (MB/s), at least the guaranteed bandwidth.
    pub capacity_mbps: u64,
    pub checks_per_period: u32,
    pub duration_ms: u64,
    /// The period of the output when unregulated (else the regulation period).
    pub report_ms: u64,
}

/// One VM in one reported period.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VmPeriod {
    pub name: String,
    /// What it moved, MB/s over the period.
    pub mbps: f64,
    /// Its guarantee in force (MB/s).
    pub guarantee_mbps: f64,
    /// What it would have moved alone, unregulated (MB/s): its demand.
    pub demand_mbps: f64,
    /// Time throttled in the period (ms).
    pub throttled_ms: f64,
    /// Bytes borrowed from the pool so far (MB).
    pub borrowed_mb: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Period {
    pub t_ms: f64,
    pub best_effort: bool,
    pub vms: Vec<VmPeriod>,
}

/// A VM stopped for reaching its limit: how long after it reached it (ms).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stop {
    pub name: String,
    pub t_ms: f64,
    pub latency_ms: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    pub periods: Vec<Period>,
    pub stops: Vec<Stop>,
}

struct State {
    backlog: f64,
    throttled: bool,
    moved: f64,
    wanted: f64,
    throttled_ns: u64,
}

/// Runs the model; see the module documentation.
pub fn run(cfg: &SimConfig, vms: &[SimVm]) -> Result<Report, SimError> {
    if cfg.capacity_mbps == 0 || cfg.duration_ms == 0 || cfg.checks_per_period == 0 {
        return Err(ConfigError::range("capacity_mbps, duration_ms and checks_per_period", "> 0").into());
    }
    let period_ns = match &cfg.regulator {
        Some(r) => {
            r.validate()?;
            r.period_ns
        }
        None => cfg.report_ms.max(1) * NS_PER_MS,
    };
    let dt = (period_ns / cfg.checks_per_period as u64).max(1);
    let mut reg = cfg.regulator.map(|r| Regulator::new(r, 0));
    if let Some(reg) = reg.as_mut() {
        for (i, v) in vms.iter().enumerate() {
            reg.add(VmId(i as u64), v.share).map_err(|error| SimError::Share { name: v.name.clone(), error })?;
        }
    }
    let mut st: Vec<State> = vms
        .iter()
        .map(|_| State { backlog: 0.0, throttled: false, moved: 0.0, wanted: 0.0, throttled_ns: 0 })
        .collect();
    let mut report = Report::default();
    let (mut t, mut period_start, mut best_effort_before) = (0u64, 0u64, 0u64);
    let mut usage = Vec::with_capacity(vms.len());
    let mut decisions: Vec<Throttle> = Vec::new();
    let secs = dt as f64 / NS_PER_S as f64;
    while t < cfg.duration_ms * NS_PER_MS {
        let t_ms = t / NS_PER_MS;
        // What each VM offers in this interval (bytes).
        let mut offers = Vec::with_capacity(vms.len());
        for (v, s) in vms.iter().zip(st.iter_mut()) {
            let max = v.max_mbps as f64 * 1e6 * secs;
            let (offer, alone) = match v.demand_at(t_ms) {
                Demand::Stream => (max, max),
                Demand::Rate(r) => {
                    let arriving = r as f64 * 1e6 * secs;
                    s.backlog += arriving;
                    (s.backlog.min(max), arriving.min(max))
                }
                Demand::Idle => (0.0, 0.0),
            };
            s.wanted += alone;
            offers.push(if s.throttled { 0.0 } else { offer });
        }
        let total: f64 = offers.iter().sum();
        let capacity = cfg.capacity_mbps as f64 * 1e6 * secs;
        let scale = if total > capacity { capacity / total } else { 1.0 };
        usage.clear();
        for (i, (s, offer)) in st.iter_mut().zip(&offers).enumerate() {
            let moved = offer * scale;
            s.backlog = (s.backlog - moved).max(0.0);
            s.moved += moved;
            usage.push((VmId(i as u64), moved.round() as u64));
        }
        // Where each VM stood against its limit before this interval, to time its stop.
        let before: Vec<Option<(u64, u64)>> = (0..vms.len())
            .map(|i| reg.as_ref().and_then(|r| r.vm(VmId(i as u64))).map(|b| (b.used, b.budget + b.borrowed)))
            .collect();
        t += dt;
        decisions.clear();
        if let Some(reg) = reg.as_mut() {
            reg.step(t, &usage, &mut decisions);
            for &(id, stop) in &decisions {
                let i = id.0 as usize;
                if stop {
                    if let Some((used, limit)) = before[i] {
                        // The limit was crossed part-way through this interval.
                        let moved = usage[i].1.max(1) as f64;
                        let into = (limit.saturating_sub(used) as f64 / moved).min(1.0);
                        let latency = (1.0 - into) * dt as f64;
                        report.stops.push(Stop {
                            name: vms[i].name.clone(),
                            t_ms: t as f64 / NS_PER_MS as f64,
                            latency_ms: latency / NS_PER_MS as f64,
                        });
                    }
                }
                st[i].throttled = stop;
            }
        }
        for s in st.iter_mut().filter(|s| s.throttled) {
            s.throttled_ns += dt;
        }
        if t - period_start >= period_ns {
            let span = (t - period_start) as f64 / NS_PER_S as f64;
            let mut p = Period { t_ms: period_start as f64 / NS_PER_MS as f64, best_effort: false, vms: Vec::new() };
            for (i, (v, s)) in vms.iter().zip(st.iter_mut()).enumerate() {
                let b = reg.as_ref().and_then(|r| r.vm(VmId(i as u64)));
                let guarantee = match (&cfg.regulator, b) {
                    (Some(r), Some(b)) => r.guaranteed_mbps as f64 * b.effective() as f64 / 1000.0,
                    _ => 0.0,
                };
                p.vms.push(VmPeriod {
                    name: v.name.clone(),
                    mbps: s.moved / 1e6 / span,
                    guarantee_mbps: guarantee,
                    demand_mbps: s.wanted / 1e6 / span,
                    throttled_ms: s.throttled_ns as f64 / NS_PER_MS as f64,
                    borrowed_mb: b.map_or(0.0, |b| b.stats.borrowed_bytes as f64 / 1e6),
                });
                s.moved = 0.0;
                s.wanted = 0.0;
                s.throttled_ns = 0;
            }
            let be = reg.as_ref().map_or(0, |r| r.stats.best_effort_periods);
            p.best_effort = be > best_effort_before;
            best_effort_before = be;
            report.periods.push(p);
            period_start = t;
        }
    }
    Ok(report)
}
