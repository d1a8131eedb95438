//! Static per-VM tunings in the loop: resolved from `[vm.NAME.static]` with the operator's
//! `cosched vm static` over it (kept by name, [`crate::operator`]), applied when the VM is
//! found, undone with it; the host-wide shield follows the union of the shielded VMs' CPUs.

use std::collections::BTreeMap;

use cosched_core::{GuardRule, VmId};

use crate::actuator::{ShieldPlan, StaticPlan};
use crate::config::StaticConfig;
use crate::error::{Error, StaticError};
use crate::shield::{parse_cpus, Cpus};

use super::Daemon;

impl Daemon {
    /// The CPUs shielded for every VM but `except`.
    fn shielded_except(&self, except: &str) -> BTreeMap<usize, String> {
        let mut out = BTreeMap::new();
        for (_, vm) in self.vms.iter().filter(|(_, vm)| vm.name() != except) {
            if let Some(s) = &vm.threads.static_plan().shield {
                for c in &s.vcpus {
                    out.insert(*c, vm.name().to_string());
                }
            }
        }
        out
    }

    /// `cfg` resolved for VM `name`: CPUs checked against the host and the other VMs' shields.
    pub(super) fn resolve_static(&self, name: &str, cfg: &StaticConfig) -> Result<StaticPlan, StaticError> {
        let mut plan = fifo_plan(cfg);
        let Some(list) = &cfg.shield else { return Ok(plan) };
        let vcpus = parse_cpus(list)?;
        let host = crate::shield::host_cpus(self.host.sched.cgroups());
        if !host.is_empty() && !vcpus.is_subset(&host) {
            return Err(StaticError::NotOnHost { list: list.clone(), host });
        }
        let others = self.shielded_except(name);
        if let Some(&cpu) = vcpus.iter().find(|c| others.contains_key(c)) {
            return Err(StaticError::Taken { list: list.clone(), cpu, other: others[&cpu].clone() });
        }
        let mut all: Cpus = others.keys().copied().collect();
        all.extend(vcpus.iter().copied());
        let housekeeping = self.shield.housekeeping(&all)?;
        plan.shield = Some(ShieldPlan { vcpus, housekeeping });
        Ok(plan)
    }

    /// Applies VM `token`'s static tunings in force (at adoption, and when the operator changes
    /// them).
    pub(super) fn apply_statics(&mut self, token: usize) -> Result<(), StaticError> {
        let Some(vm) = self.vms.get(token) else { return Ok(()) };
        let cfg = self.cfg.vm.get(vm.name()).map(|v| v.statics.clone()).unwrap_or_default();
        self.apply_static(token, &cfg)
    }

    /// Brings VM `token`'s static tunings to `cfg`.
    pub(super) fn apply_static(&mut self, token: usize, cfg: &StaticConfig) -> Result<(), StaticError> {
        let Some(vm) = self.vms.get(token) else { return Ok(()) };
        let name = vm.name().to_string();
        if cfg.is_empty() && vm.threads.static_plan().is_empty() {
            return Ok(());
        }
        let plan = self.resolve_static(&name, cfg);
        // A shield that cannot be had: the rest (FIFO) still applies, and the error is told.
        let (plan, err) = match plan {
            Ok(p) => (p, None),
            Err(e) => (fifo_plan(cfg), Some(e)),
        };
        if let Some(sh) = &plan.shield {
            // The host leaves the CPUs before the VM's vCPU group claims them (v1 refuses an
            // exclusive cpuset that overlaps a sibling).
            let mut all: Cpus = self.shielded_except(&name).into_keys().collect();
            all.extend(sh.vcpus.iter().copied());
            self.shield.apply(&all);
        }
        let (mut plan, now) = (plan, self.now());
        // The guard is the coordinator's; its state carries over a change of the rest (a new
        // shield keeps its window).
        let rule = GuardRule::from_policy(&self.cfg.policy).filter(|_| cfg.fifo && cfg.guard);
        let guarded = self.coord.set_static_guard(VmId(token as u64), rule, now);
        plan.guarded = guarded.then_some(self.cfg.boost.guard_nice);
        let vm = self.vms.get_mut(token).expect("checked");
        let out = vm.threads.set_static(&mut self.host, &plan);
        vm.note(&out, now);
        info!("{name}: static tuning {}", plan.describe());
        for n in vm.threads.static_notes() {
            warn!("{name}: {n}");
        }
        self.sync_events(token);
        self.update_host_shield();
        match err {
            Some(e) => {
                warn!("{name}: not shielded: {e}");
                Err(e)
            }
            None if !out.errors.is_empty() => Err(StaticError::Apply(out.errors)),
            None => Ok(()),
        }
    }

    /// Brings IRQs and the operator's host groups to the union of the shielded VMs' CPUs (none:
    /// everything back). Also run on every rescan: IRQs that appeared since are moved too.
    pub(super) fn update_host_shield(&mut self) {
        let all: Cpus = self.shielded_except("").into_keys().collect();
        if all.is_empty() && self.shield.shielded().is_empty() {
            return;
        }
        let before = self.shield.report().clone();
        let r = self.shield.apply(&all);
        if *r != before {
            if !all.is_empty() {
                info!(
                    "shield: CPUs {} for vCPUs only; housekeeping {}; {} IRQ(s) moved, host groups moved: [{}]",
                    r.shielded_cpus,
                    r.housekeeping_cpus,
                    r.irqs_moved.len(),
                    r.groups_moved.join(", ")
                );
                if !r.irqs_fixed.is_empty() {
                    warn!(
                        "shield: IRQs left on shielded CPUs (the kernel fixes their affinity): {}",
                        r.irqs_fixed.join("; ")
                    );
                }
                if !r.kthreads_left.is_empty() {
                    info!("shield: per-CPU kernel threads stay on the shielded CPUs: {}", r.kthreads_left.join(", "));
                }
            } else {
                info!("shield: no VM shielded any more; IRQs and host groups put back");
            }
            for e in &r.errors {
                warn!("shield: {e}");
            }
        }
    }

    /// `cosched vm static NAME ...`: changes what was set (`None`: kept), applies it to the VM if
    /// it runs, and keeps it by name ([`crate::operator`]). Refused whole before anything
    /// changes, as far as can be known; threads that could not be changed are told, and the
    /// setting stays.
    pub(super) fn set_static(
        &mut self,
        key: &str,
        fifo: Option<bool>,
        shield: Option<String>,
        guard: Option<bool>,
    ) -> Result<(), Error> {
        if self.ops.statics == Some(false) {
            return Err(Error::StaticsOff);
        }
        let (name, id) = self.named(key)?;
        let mut over = self.ops.vm.get(&name).map(|v| v.statics.clone()).unwrap_or_default();
        over.fifo = fifo.or(over.fifo);
        over.shield = shield.or(over.shield);
        if let Some(g) = guard {
            if g && self.cfg.policy.rt_guard().is_none() {
                return Err(Error::NoGuardRule);
            }
            over.guard = Some(g);
        }
        let mut cfg = self.config.vm.get(&name).map(|v| v.statics.clone()).unwrap_or_default();
        over.over(&mut cfg);
        cfg.validate(&format!("vm {name}:"), self.cfg.daemon_priority)?;
        if let (Some(list), Some(_)) = (&cfg.shield, id) {
            // Refuse before changing anything: the whole request or nothing.
            self.resolve_static(&name, &cfg).map_err(|error| Error::Shield {
                vm: name.clone(),
                list: list.clone(),
                error,
            })?;
        }
        self.keep(|o| o.vm_mut(&name).statics = over)?;
        info!(
            "operator: {name}: static tuning fifo {} guard {} shield {}{}",
            cfg.fifo,
            cfg.guard,
            cfg.shield.as_deref().unwrap_or("off"),
            if id.is_some() { "" } else { " (not running: when it appears)" }
        );
        match id {
            Some(id) => Ok(self.apply_statics(id.0 as usize)?),
            None => Ok(()),
        }
    }
}

impl Daemon {
    /// The coordinator's static guard of VM `token`: its vCPUs to the guard's class, or back
    /// at FIFO.
    pub(super) fn static_guard(&mut self, token: usize, guarded: bool) {
        let (nice, now) = (self.cfg.boost.guard_nice, self.now());
        let Some(vm) = self.vms.get_mut(token) else { return };
        let mut plan = vm.threads.static_plan().clone();
        plan.guarded = guarded.then_some(nice);
        debug!("{}: static guard: vCPUs {}", vm.name(), if guarded { "guarded" } else { "back at FIFO" });
        let out = vm.threads.set_static(&mut self.host, &plan);
        vm.note(&out, now);
        self.sync_events(token);
    }
}

/// The plan of `cfg`'s FIFO alone (no guard, no shield): what a VM gets before its shield is
/// resolved, or when its shield cannot be had.
fn fifo_plan(cfg: &StaticConfig) -> StaticPlan {
    StaticPlan { fifo: cfg.fifo.then_some((cfg.vcpu_priority, cfg.other_priority)), guarded: None, shield: None }
}
