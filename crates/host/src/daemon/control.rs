//! The operator's side of the loop: control requests (each answered from a status snapshot or
//! by running the operator's command through the coordinator) and metrics scrapes.

use cosched_core::{Action, Coordinator, VmId};
use cosched_proto::Resource;

use super::clients::{Answer, Ask};
use super::{status, Daemon};
use crate::control::{Reply, Request};
use crate::error::Error;

impl Daemon {
    /// A control or metrics client has sent its request: answer it.
    pub(super) fn on_client(&mut self, token: usize) {
        let Some(ask) = self.clients.on_event(token, &self.poll) else { return };
        let answer = match ask {
            Ask::Control(Ok(req)) => Answer::Control(self.handle(req)),
            Ask::Control(Err(e)) => Answer::Control(Reply::err(e.to_string())),
            Ask::Metrics => Answer::Metrics(self.metrics()),
        };
        self.clients.answer(token, answer, &self.poll);
    }

    /// Runs an operator command on the VM named `key`; the settings it returns are kept for the
    /// VM's name, so they survive a reconnect.
    pub(super) fn vm_command(
        &mut self,
        key: &str,
        actions: &mut Vec<Action>,
        f: impl FnOnce(&mut Coordinator, VmId, &mut Vec<Action>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let id = self.vms.find(key)?;
        f(&mut self.coord, id, actions)?;
        let vm = self.coord.vm(id).expect("found");
        let off: Vec<&str> = Resource::ALL.iter().filter(|r| !vm.settings.enabled(**r)).map(|r| r.name()).collect();
        info!("operator: {}: disabled resources [{}], priority {}", vm.name, off.join(", "), vm.settings.priority);
        self.vms.settings.insert(vm.name.clone(), vm.settings);
        Ok(())
    }

    pub(super) fn handle(&mut self, req: Request) -> Reply {
        let mut actions = Vec::new();
        let done = match req {
            Request::Status => return Reply::with(&self.status(status::Detail::Full)),
            Request::Metrics => return Reply::with(&crate::control::MetricsReply { text: self.metrics() }),
            Request::Enable { vm, resource } => self.switch(vm, resource, true, &mut actions),
            Request::Disable { vm, resource } => self.switch(vm, resource, false, &mut actions),
            Request::Priority { vm, priority } => self.set_priority(&vm, priority, &mut actions),
            Request::Static { vm, fifo, shield, guard } => self.set_static(&vm, fifo, shield, guard),
            Request::Ceiling { vm, ceiling } => self.set_ceiling(&vm, ceiling, &mut actions),
            Request::MembwShare { vm, share } => self.set_membw_share(&vm, share),
            Request::Membw { period_ms, reclaim, best_effort } => self.set_membw(period_ms, reclaim, best_effort),
        };
        self.execute(&mut actions, None);
        match done {
            Ok(()) => Reply::ok(None),
            Err(e) => Reply::err(e.to_string()),
        }
    }

    /// Enables or disables one resource (or all) for the host or for one VM.
    pub(super) fn switch(
        &mut self,
        vm: Option<String>,
        resource: Option<String>,
        on: bool,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
        let resource = resource.as_deref().map(|n| self.resource_named(n)).transpose()?;
        let now = self.now();
        match vm {
            None => {
                self.coord.set_enabled(resource, on, now, actions);
                let what = resource.map_or("every resource".to_string(), |r| r.name().to_string());
                info!("operator: {what} {} for the whole host", if on { "enabled" } else { "disabled" });
                Ok(())
            }
            Some(key) => self.vm_command(&key, actions, |coord, id, actions| {
                coord.set_vm_enabled(id, resource, on, now, actions);
                Ok(())
            }),
        }
    }

    pub(super) fn set_priority(&mut self, key: &str, priority: u8, actions: &mut Vec<Action>) -> Result<(), Error> {
        let ceiling = self.cfg.daemon_priority;
        let offset = self.cfg.boost.other_threads_priority_offset;
        if cosched_core::VM_PRIORITY.contains(&priority) && ceiling != 0 && priority + offset >= ceiling {
            return Err(Error::AboveDaemon { priority, ceiling });
        }
        self.vm_command(key, actions, |coord, id, actions| {
            coord.set_vm_priority(id, priority, actions).map_err(Error::Refused)
        })
    }

    /// Operator: the highest host priority VM `key`'s guest priorities map to (`[rt]`).
    pub(super) fn set_ceiling(&mut self, key: &str, ceiling: u8, actions: &mut Vec<Action>) -> Result<(), Error> {
        let daemon = self.cfg.daemon_priority;
        if daemon != 0 && ceiling.saturating_add(self.cfg.boost.other_threads_priority_offset) >= daemon {
            return Err(Error::AboveDaemon { priority: ceiling, ceiling: daemon });
        }
        self.vm_command(key, actions, |coord, id, actions| {
            coord.set_vm_ceiling(id, ceiling, actions).map_err(Error::Refused)
        })?;
        info!("operator: {key}: RT ceiling {ceiling}");
        Ok(())
    }

    /// A resource this host supports, by name.
    pub(super) fn resource_named(&self, name: &str) -> Result<Resource, Error> {
        let supported = self.coord.resources().map(|r| r.name()).collect::<Vec<_>>().join(", ");
        match Resource::from_name(name) {
            Some(r) if self.coord.resources().any(|s| s == r) => Ok(r),
            Some(resource) => Err(Error::Unsupported { resource, supported }),
            None => Err(Error::UnknownResource { name: name.to_string(), supported }),
        }
    }

    /// The Prometheus text of the status (a scrape builds no thread views).
    pub(super) fn metrics(&self) -> String {
        crate::metrics::render(&self.status(status::Detail::Metrics))
    }

    pub(super) fn status(&self, detail: status::Detail) -> cosched_status::Status {
        let view = status::View {
            now: self.now(),
            cfg: &self.cfg,
            coord: &self.coord,
            vms: &self.vms,
            channels: &self.channels,
            thread_events: self.discovery.mechanism(),
            metrics_addr: self.clients.metrics_addr(),
            cost: &self.cost,
            latency: &self.latency,
            io: &self.io,
            events: &self.events,
            membw: &self.membw,
            shield: &self.shield,
            caps: &self.caps,
        };
        status::snapshot(&view, detail)
    }
}
