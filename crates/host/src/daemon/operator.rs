//! The operator's commands in the loop: each is checked, kept by name in the state directory
//! ([`crate::operator`]: the operator's setting wins over the config's until reset), then
//! carried out through the coordinator's operator methods if its VM runs. A VM that is not
//! running is named by its `[vm.NAME]` in the config (or by the operator's settings already
//! kept for it); it gets the setting when it appears.

use cosched_core::{Action, VmId};
use cosched_proto::Resource;

use super::Daemon;
use crate::error::Error;
use crate::operator::Operator;

impl Daemon {
    /// The VM `key` names: a running VM by name or QEMU pid (its name and id), else a VM that is
    /// not running but configured (`[vm.KEY]`) or with operator settings kept (its name alone).
    pub(super) fn named(&self, key: &str) -> Result<(String, Option<VmId>), Error> {
        match self.vms.find(key) {
            Ok(id) => Ok((self.vms.get(id.0 as usize).map(|v| v.name().to_string()).unwrap_or_default(), Some(id))),
            Err(_) if self.config.vm.contains_key(key) || self.ops.vm.contains_key(key) => Ok((key.to_string(), None)),
            Err(e) => Err(e),
        }
    }

    /// Changes the operator's settings with `f`: checked as a config (the config with every
    /// operator setting over it), kept on disk, in force in `self.cfg`. Returns the settings
    /// before, for [`Daemon::revert`] if carrying the change out fails.
    pub(super) fn keep(&mut self, f: impl FnOnce(&mut Operator)) -> Result<Operator, Error> {
        let mut ops = self.ops.clone();
        f(&mut ops);
        ops.tidy();
        let cfg = ops.over(&self.config);
        cfg.validate()?;
        ops.save(self.host.store.path()).map_err(Error::Keep)?;
        self.cfg = cfg;
        Ok(std::mem::replace(&mut self.ops, ops))
    }

    /// The operator's settings back to `old` (a change the coordinator refused).
    pub(super) fn revert(&mut self, old: Operator) {
        if let Err(e) = old.save(self.host.store.path()) {
            warn!("operator settings: putting the file back: {e}");
        }
        self.cfg = old.over(&self.config);
        self.ops = old;
    }

    /// Enables or disables one resource (or all) for the host or for one VM; with `all`
    /// (`cosched disable --all`, host-wide), every VM's static tunings too. `cosched enable`
    /// of every resource puts the static tunings back as well.
    pub(super) fn switch(
        &mut self,
        vm: Option<String>,
        resource: Option<String>,
        on: bool,
        all: bool,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
        let resource = resource.as_deref().map(|n| self.resource_named(n)).transpose()?;
        let names: Vec<&str> = resource.map_or_else(|| Resource::ALL.map(Resource::name).to_vec(), |r| vec![r.name()]);
        let now = self.now();
        let Some(key) = vm else {
            let statics_before = self.ops.statics;
            self.keep(|o| {
                o.resources.extend(names.iter().map(|n| (n.to_string(), on)));
                if resource.is_none() && on {
                    o.statics = None;
                } else if all {
                    o.statics = Some(false);
                }
            })?;
            self.coord.set_enabled(resource, on, now, actions);
            let what = resource.map_or("every resource".to_string(), |r| r.name().to_string());
            let statics = if all { " and every static tuning" } else { "" };
            info!("operator: {what}{statics} {} for the whole host", if on { "enabled" } else { "disabled" });
            if self.ops.statics != statics_before {
                for token in self.vms.tokens() {
                    if let Err(e) = self.apply_statics(token) {
                        warn!("{}: static tuning: {e}", self.vm_label(token));
                    }
                }
            }
            return Ok(());
        };
        if all {
            return Err(Error::AllForVm);
        }
        let (name, id) = self.named(&key)?;
        self.keep(|o| o.vm_mut(&name).resources.extend(names.iter().map(|n| (n.to_string(), on))))?;
        if let Some(id) = id {
            self.coord.set_vm_enabled(id, resource, on, now, actions);
        }
        let off: Vec<&str> =
            Resource::ALL.iter().filter(|r| !self.cfg.vm_settings(&name).enabled(**r)).map(|r| r.name()).collect();
        info!("operator: {name}: disabled resources [{}]{}", off.join(", "), not_running(id));
        Ok(())
    }

    pub(super) fn set_priority(&mut self, key: &str, priority: u8, actions: &mut Vec<Action>) -> Result<(), Error> {
        let ceiling = self.cfg.daemon_priority;
        let offset = self.cfg.boost.other_threads_priority_offset;
        if cosched_core::VM_PRIORITY.contains(&priority) && ceiling != 0 && priority + offset >= ceiling {
            return Err(Error::AboveDaemon { priority, ceiling });
        }
        cosched_core::check_priority("priority", priority).map_err(|e| Error::Refused(e.into()))?;
        let (name, id) = self.named(key)?;
        let old = self.keep(|o| o.vm_mut(&name).priority = Some(priority))?;
        if let Some(id) = id {
            if let Err(e) = self.coord.set_vm_priority(id, priority, actions) {
                self.revert(old);
                return Err(Error::Refused(e));
            }
        }
        info!("operator: {name}: priority {priority}{}", not_running(id));
        Ok(())
    }

    /// Operator: the highest host priority VM `key`'s guest priorities map to (`[rt]`).
    pub(super) fn set_ceiling(&mut self, key: &str, ceiling: u8, actions: &mut Vec<Action>) -> Result<(), Error> {
        let daemon = self.cfg.daemon_priority;
        if daemon != 0 && ceiling.saturating_add(self.cfg.boost.other_threads_priority_offset) >= daemon {
            return Err(Error::AboveDaemon { priority: ceiling, ceiling: daemon });
        }
        cosched_core::check_priority("ceiling", ceiling).map_err(|e| Error::Refused(e.into()))?;
        let (name, id) = self.named(key)?;
        let old = self.keep(|o| o.vm_mut(&name).rt_ceiling = Some(ceiling))?;
        match id {
            Some(id) => {
                if let Err(e) = self.coord.set_vm_ceiling(id, ceiling, actions) {
                    self.revert(old);
                    return Err(Error::Refused(e));
                }
            }
            // The coordinator keeps ceilings by name: the VM finds its own when it appears.
            None => self.coord.set_ceiling(&name, Some(ceiling)),
        }
        info!("operator: {key}: RT ceiling {ceiling}{}", not_running(id));
        Ok(())
    }
}

fn not_running(id: Option<VmId>) -> &'static str {
    if id.is_some() {
        ""
    } else {
        " (not running: when it appears)"
    }
}
