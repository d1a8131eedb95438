//! A reload (`cosched reload`, SIGHUP, the unit's `ExecReload`) and a reset of the operator's
//! settings (`cosched reset`, `cosched vm reset NAME`) in the loop: the difference between the
//! settings in force and the new ones ([`crate::reload::diff`]), carried out whole through the
//! coordinator's operator methods, or undone and refused. The daemon is the reload's
//! [`Target`].

use cosched_core::{MembwPolicy, VmId};

use super::Daemon;
use crate::config::HostConfig;
use crate::error::Error;
use crate::operator::Operator;
use crate::reload::{self, Change, Changes, ReloadError, Step, Target, VmChange};

impl Daemon {
    /// Reads the config file again (with the command line's overrides) and applies what changed:
    /// see [`crate::reload`] for what a running daemon takes. A config that does not load or
    /// validate changes nothing; keys that need a restart are named and left as they run; the
    /// operator's settings stay over the new config.
    pub(super) fn reload(&mut self) -> Result<Changes, ReloadError> {
        let source = self.source.as_ref().ok_or(ReloadError::NoSource)?;
        let loaded = source.load().map_err(ReloadError::Load)?;
        let merged = reload::merge(&self.config, &loaded).map_err(ReloadError::Merge)?;
        merged.config.validate().map_err(ReloadError::Invalid)?;
        let cfg = self.ops.over(&merged.config);
        cfg.validate().map_err(ReloadError::WithOperator)?;
        let running = self.vms.names();
        let steps = reload::diff(&self.cfg, &cfg, &running);
        // What the config changes under a setting of the operator's: the operator's stays.
        let operator_kept: Vec<String> = reload::diff(&self.config, &merged.config, &running)
            .into_iter()
            .filter(|c| !steps.iter().any(|s| s.change.same_setting(&c.change)))
            .map(|c| format!("{} (the operator's setting stays: {})", c.what, reset_hint(&c.change)))
            .collect();
        self.carry_out(&steps, cfg)?;
        self.config = merged.config;
        let mut applied: Vec<String> = steps.iter().map(|s| s.what.clone()).collect();
        applied.extend(merged.rescan);
        let changes = Changes { applied, needs_restart: merged.needs_restart, operator_kept };
        if changes == Changes::default() {
            info!("reload: no change");
        }
        for a in &changes.applied {
            info!("reload: {a}");
        }
        for k in &changes.operator_kept {
            info!("reload: not applied, set by the operator: {k}");
        }
        for k in &changes.needs_restart {
            warn!("reload: needs a restart: {k} (left as it runs)");
        }
        Ok(changes)
    }

    /// SIGHUP: a reload, its errors logged (a daemon given its settings directly has nothing
    /// to reload).
    pub(super) fn sighup_reload(&mut self) {
        match self.reload() {
            Ok(_) | Err(ReloadError::NoSource) => {}
            Err(e) => warn!("reload: {e}"),
        }
    }

    /// Drops the operator's settings of VM `key` (name or QEMU pid) or, with `None`, every one,
    /// and brings what is in force back to the config.
    pub(super) fn reset(&mut self, key: Option<&str>) -> Result<Changes, ReloadError> {
        let mut ops = self.ops.clone();
        let what = match key {
            None => {
                ops = Operator::default();
                "every operator setting".to_string()
            }
            Some(key) => {
                let (name, _) = self.named(key).map_err(ReloadError::Vm)?;
                ops.vm.remove(&name);
                format!("the operator's settings of {name}")
            }
        };
        let cfg = ops.over(&self.config);
        cfg.validate().map_err(ReloadError::WithOperator)?;
        let steps = reload::diff(&self.cfg, &cfg, &self.vms.names());
        ops.save(self.host.store.path()).map_err(ReloadError::Keep)?;
        if let Err(e) = self.carry_out(&steps, cfg) {
            if let Err(e) = self.ops.save(self.host.store.path()) {
                warn!("operator settings: putting the file back: {e}");
            }
            return Err(e);
        }
        self.ops = ops;
        info!("operator: reset {what}: back to the config");
        for s in &steps {
            info!("reset: {s}");
        }
        Ok(Changes { applied: steps.iter().map(|s| s.what.clone()).collect(), ..Default::default() })
    }

    /// Carries `steps` out with `cfg` in force; if one fails, every one is undone and the
    /// settings in force stay as they were.
    fn carry_out(&mut self, steps: &[Step], cfg: HostConfig) -> Result<(), ReloadError> {
        let old = std::mem::replace(&mut self.cfg, cfg);
        if let Err(f) = reload::apply(self, steps) {
            self.cfg = old;
            warn!("{f}");
            return Err(f.into());
        }
        Ok(())
    }

    /// The memory-bandwidth regulation's period, reclaim and best effort (nothing while it does
    /// not run here).
    fn membw_settings(&mut self, period_ms: u64, reclaim: bool, best_effort: bool) -> Result<(), Error> {
        if self.membw.is_err() {
            return Ok(());
        }
        let reg = self.coord.policy_of::<MembwPolicy>().map(|m| *m.regulator().config());
        let mut c = reg.ok_or(Error::NotRegulated)?;
        c.period_ns = period_ms * cosched_core::NS_PER_MS;
        c.reclaim = reclaim;
        c.best_effort = best_effort;
        self.coord.set_membw_config(c).map_err(Error::Refused)
    }

    /// A setting of the running VMs named `vm` (none: what the coordinator keeps by name).
    fn vm_change(&mut self, vm: &str, set: &VmChange, actions: &mut Vec<cosched_core::Action>) -> Result<(), Error> {
        let now = self.now();
        let running: Vec<(usize, VmId)> =
            self.vms.named(vm).into_iter().filter_map(|t| self.vms.get(t).map(|e| (t, e.id))).collect();
        for &(token, id) in &running {
            match set {
                VmChange::Enabled { resource, on } => {
                    self.coord.set_vm_enabled(id, Some(*resource), *on, now, actions);
                }
                VmChange::Priority(p) => self.coord.set_vm_priority(id, *p, actions)?,
                VmChange::Ceiling(c) => {
                    // Back to [rt]'s: re-granted at it, then the VM's own forgotten.
                    let ceiling = c.unwrap_or_else(|| self.cfg.rt().ceiling());
                    self.coord.set_vm_ceiling(id, ceiling, actions)?;
                }
                VmChange::MembwShare(share) => {
                    if self.membw.is_ok() {
                        self.coord.set_membw_share(id, *share)?;
                    }
                }
                VmChange::Static(cfg) => {
                    if let Some(list) = &cfg.shield {
                        self.resolve_static(vm, cfg).map_err(|error| Error::Shield {
                            vm: vm.to_string(),
                            list: list.clone(),
                            error,
                        })?;
                    }
                    self.apply_static(token, cfg)?;
                }
            }
        }
        if let VmChange::Ceiling(c) = set {
            if c.is_none() || running.is_empty() {
                // The coordinator keeps ceilings by name: a VM that appears finds its own.
                self.coord.set_ceiling(vm, *c);
            }
        }
        Ok(())
    }
}

impl Target for Daemon {
    fn apply(&mut self, change: &Change) -> Result<(), Error> {
        let (now, mut actions) = (self.now(), Vec::new());
        let done = match change {
            Change::Policy(p) => self.coord.set_policy((**p).clone(), now).map_err(Error::Refused),
            Change::Host { resource, on } => {
                if self.coord.resources().any(|r| r == *resource) {
                    self.coord.set_enabled(Some(*resource), *on, now, &mut actions);
                }
                Ok(())
            }
            Change::Membw { period_ms, reclaim, best_effort } => {
                self.membw_settings(*period_ms, *reclaim, *best_effort)
            }
            Change::Vm { vm, set } => self.vm_change(vm, set, &mut actions),
        };
        self.execute(&mut actions, None);
        done
    }
}

/// How the operator goes back to the config for the setting `c` changes.
fn reset_hint(c: &Change) -> String {
    match c {
        Change::Vm { vm, .. } => format!("cosched vm reset {vm} to follow the config"),
        _ => "cosched reset to follow the config".to_string(),
    }
}
