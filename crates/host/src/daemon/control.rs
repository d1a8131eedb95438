//! The operator's side of the loop: control requests (each answered from a status snapshot or
//! by running the operator's command through the coordinator) and metrics scrapes.

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

    pub(super) fn handle(&mut self, req: Request) -> Reply {
        let mut actions = Vec::new();
        let done = match req {
            Request::Status => return Reply::with(&self.status(status::Detail::Full)),
            Request::Metrics => return Reply::with(&crate::control::MetricsReply { text: self.metrics() }),
            Request::Enable { vm, resource } => self.switch(vm, resource, true, false, &mut actions),
            Request::Disable { vm, resource, all } => self.switch(vm, resource, false, all, &mut actions),
            Request::Reload => {
                return match self.reload() {
                    Ok(changes) => Reply::with(&changes),
                    Err(e) => Reply::err(e.to_string()),
                }
            }
            Request::Reset { vm } => {
                return match self.reset(vm.as_deref()) {
                    Ok(changes) => Reply::with(&changes),
                    Err(e) => Reply::err(e.to_string()),
                }
            }
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
            ops: &self.ops,
        };
        status::snapshot(&view, detail)
    }
}
