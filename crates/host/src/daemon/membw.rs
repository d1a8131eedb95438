//! Memory-bandwidth regulation in the daemon: the counter source probed at start (what the
//! coordinator's checks read through the sensors), the throttle's lever, the operator's
//! commands and the status. The regulator is the coordinator's (`cosched_core::membw`).

use cosched_core::{MembwPolicy, VmId};
use cosched_procfs::TaskId;
use cosched_proto::Resource;
use cosched_status as st;

use super::vms::Vms;
use super::Daemon;
use crate::actuator::class::is_vcpu;
use crate::actuator::ThrottleLever;
use crate::config::HostConfig;
use crate::error::{Error, Unavailable, Why};
use crate::membw::{BackendChoice, CounterSource};

/// Memory-bandwidth regulation where a backend was found.
pub struct Membw {
    pub name: &'static str,
    source: Box<dyn CounterSource>,
    pub notes: Vec<String>,
    /// What holds back a VM over its budget.
    pub lever: ThrottleLever,
    /// Time spent reading counters for the coordinator's checks.
    pub read_ns_total: u64,
}

impl Membw {
    /// Probes the backend and the throttle (resctrl MBA, else the freezer); logs what it found
    /// or why there is none.
    pub fn open(
        cfg: &HostConfig,
        cgroups: &crate::cgroup::CgroupFs,
        proc_root: &std::path::Path,
    ) -> Result<Membw, Unavailable> {
        let found = crate::membw::probe(&cfg.membw, &cfg.resctrl_root, proc_root).map_err(Why::from).and_then(|p| {
            let lever = match &p.mba {
                Some(m) => ThrottleLever::Mba {
                    schemata: m.schemata(cfg.membw.guaranteed_mbps),
                    describe: m.describe(cfg.membw.guaranteed_mbps),
                },
                None => ThrottleLever::Freezer(crate::actuator::freezer(cgroups, cfg.membw.freezer)?),
            };
            Ok((p, lever))
        });
        match found {
            Ok((p, lever)) => {
                for n in &p.notes {
                    info!("memory bandwidth: {n}");
                }
                if p.name == "simulated" {
                    warn!(
                        "memory bandwidth: SIMULATED counters replayed from {} ([membw] backend = \"simulated\"): \
                         regulation and throttling are real, the bandwidth figures are not measured",
                        cfg.membw.trace.as_ref().map_or(String::new(), |t| t.display().to_string())
                    );
                }
                info!(
                    "memory bandwidth: {} counters, {} MB/s guaranteed, period {} ms ({} checks), reclaim {}, best effort \
                     {}; throttling through the {}",
                    p.name,
                    cfg.membw.guaranteed_mbps,
                    cfg.membw.period_ms,
                    cfg.membw.checks_per_period,
                    cfg.membw.reclaim,
                    cfg.membw.best_effort,
                    lever.describe()
                );
                Ok(Membw { name: p.name, source: p.source, notes: p.notes, lever, read_ns_total: 0 })
            }
            Err(why) => {
                if cfg.membw.backend != BackendChoice::Off {
                    warn!("memory-bandwidth coordination is unsupported here: {why}");
                }
                Err(Unavailable::new(Resource::Membw, why))
            }
        }
    }

    /// Bytes VM `id`'s vCPUs moved since the last read (its counters, through the backend).
    pub fn bytes(&mut self, vms: &Vms, id: VmId, now: u64) -> u64 {
        let Some(vm) = vms.get(id.0 as usize) else { return 0 };
        let started = std::time::Instant::now();
        let t = &vm.threads.threads;
        let known = t.vcpus_known();
        let vcpus: Vec<TaskId> = t.iter().filter(|i| is_vcpu(i.role, known)).map(|i| i.task).collect();
        let n = self.source.read(id, vm.name(), &vcpus, now);
        self.read_ns_total += started.elapsed().as_nanos() as u64;
        n
    }

    pub fn forget(&mut self, id: VmId) {
        self.source.forget(id);
    }
}

impl Daemon {
    /// Operator: VM `key`'s guaranteed share (permille), kept by its name ([`crate::operator`]);
    /// a VM that is not running gets it when it appears.
    pub(super) fn set_membw_share(&mut self, key: &str, share: u64) -> Result<(), Error> {
        if let Err(why) = &self.membw {
            return Err(Error::Unavailable(why.clone()));
        }
        let (name, id) = self.named(key)?;
        let old = self.keep(|o| o.vm_mut(&name).membw_share = Some(share))?;
        if let Some(id) = id {
            if let Err(e) = self.coord.set_membw_share(id, share) {
                self.revert(old);
                return Err(Error::Refused(e));
            }
        }
        info!("operator: {name}: membw share {share}‰");
        Ok(())
    }

    /// Operator: the period, reclaim and best effort (`None`: unchanged).
    pub(super) fn set_membw(
        &mut self,
        period_ms: Option<u64>,
        reclaim: Option<bool>,
        best_effort: Option<bool>,
    ) -> Result<(), Error> {
        if let Err(why) = &self.membw {
            return Err(Error::Unavailable(why.clone()));
        }
        let reg = self.coord.policy_of::<MembwPolicy>().map(|m| *m.regulator().config());
        let mut c = reg.ok_or(Error::NotRegulated)?;
        if let Some(p) = period_ms {
            c.period_ns = p * cosched_core::NS_PER_MS;
        }
        c.reclaim = reclaim.unwrap_or(c.reclaim);
        c.best_effort = best_effort.unwrap_or(c.best_effort);
        c.validate().map_err(|e| Error::Refused(e.into()))?;
        let old = self.keep(|o| {
            o.membw.period_ms = period_ms.or(o.membw.period_ms);
            o.membw.reclaim = reclaim.or(o.membw.reclaim);
            o.membw.best_effort = best_effort.or(o.membw.best_effort);
        })?;
        if let Err(e) = self.coord.set_membw_config(c) {
            self.revert(old);
            return Err(Error::Refused(e));
        }
        info!(
            "operator: membw period {} ms, reclaim {}, best effort {}",
            c.period_ns / cosched_core::NS_PER_MS,
            c.reclaim,
            c.best_effort
        );
        Ok(())
    }
}

/// `[membw]` and what it runs on here (or why not), host-wide.
pub fn status(cfg: &HostConfig, membw: &Result<Membw, Unavailable>, policy: Option<&MembwPolicy>) -> st::MembwStatus {
    use crate::membw::{FreezerChoice, MembwConfig, ThrottleChoice};
    let MembwConfig {
        backend,
        throttle,
        freezer,
        guaranteed_mbps,
        period_ms,
        checks_per_period,
        reclaim,
        best_effort,
        default_share_permille,
        ref trace,
        bytes_per_miss,
    } = cfg.membw;
    let mut out = st::MembwStatus {
        backend: match backend {
            BackendChoice::Auto => "auto",
            BackendChoice::Pmu => "pmu",
            BackendChoice::Simulated => "simulated",
            BackendChoice::Off => "off",
        }
        .to_string(),
        throttle: match throttle {
            ThrottleChoice::Auto => st::config::ThrottleChoice::Auto,
            ThrottleChoice::Mba => st::config::ThrottleChoice::Mba,
            ThrottleChoice::Freezer => st::config::ThrottleChoice::Freezer,
        },
        freezer: match freezer {
            FreezerChoice::Auto => st::config::FreezerChoice::Auto,
            FreezerChoice::V1 => st::config::FreezerChoice::V1,
            FreezerChoice::V2 => st::config::FreezerChoice::V2,
        },
        guaranteed_mbps,
        period_ms,
        checks_per_period,
        reclaim,
        best_effort,
        default_share_permille,
        trace: trace.clone(),
        bytes_per_miss,
        ..Default::default()
    };
    let (m, p) = match (membw, policy) {
        (Ok(m), Some(p)) => (m, p),
        (Err(why), _) => {
            out.unsupported = Some(why.to_string());
            return out;
        }
        (Ok(_), None) => {
            out.unsupported = Some("the coordinator has no memory-bandwidth policy".into());
            return out;
        }
    };
    let r = p.regulator();
    let c = r.config();
    // The counter source found, and the settings in force (the operator may have changed them).
    out.backend = m.name.to_string();
    out.period_ms = c.period_ns / cosched_core::NS_PER_MS;
    out.reclaim = c.reclaim;
    out.best_effort = c.best_effort;
    out.simulated = Some(m.name == "simulated");
    if m.name == "simulated" {
        out.warning = Some(
            "SIMULATED: bandwidth figures are replayed from the trace, not measured; the regulation and the throttle \
             are real"
                .to_string(),
        );
    }
    out.notes = Some(m.notes.clone());
    out.throttles_through = Some(m.lever.describe());
    out.committed_permille = Some(r.committed());
    out.pool_bytes = Some(r.pool());
    out.in_best_effort = Some(r.in_best_effort());
    let cosched_core::membw::RegulatorStats { periods, best_effort_periods } = r.stats;
    out.counters = Some(st::config::RegulatorCounters { periods, best_effort_periods });
    out.checks = Some(p.checks);
    // The checks' time is mostly reading the counters (the regulation is arithmetic).
    out.check_us_mean = Some(m.read_ns_total as f64 / p.checks.max(1) as f64 / 1000.0);
    out
}

/// One VM's regulation, for its status entry.
pub fn vm_status(policy: Option<&MembwPolicy>, id: VmId) -> Option<st::VmMembw> {
    let r = policy?.regulator();
    let v = r.vm(id)?;
    let c = r.config();
    let period_s = c.period_ns as f64 / 1e9;
    let cosched_core::membw::VmBwStats {
        bytes,
        last_period_bytes,
        throttles,
        throttled_ns,
        stopping_ns,
        unconfirmed_throttles,
        borrowed_bytes,
        lent_bytes,
        taken_back_bytes,
    } = v.stats;
    Some(st::VmMembw {
        share_permille: v.share,
        requested_permille: v.requested,
        effective_permille: v.effective(),
        guarantee_mbps: c.guaranteed_mbps as f64 * v.effective() as f64 / 1000.0,
        last_period_mbps: last_period_bytes as f64 / 1e6 / period_s,
        throttled: v.throttled(),
        stopped: v.stopped(),
        stats: st::VmBwStats {
            bytes,
            last_period_bytes,
            throttles,
            throttled_ns,
            stopping_ns,
            unconfirmed_throttles,
            borrowed_bytes,
            lent_bytes,
            taken_back_bytes,
        },
    })
}
