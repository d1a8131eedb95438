//! VMs found and gone: a socket whose QEMU is known becomes its VM's channel, a QEMU process
//! without one an entry of its own; thread events and re-reads keep each VM's thread list (and
//! its levels on newcomers) current; a VM whose process exited is forgotten, everything put back.

use std::path::Path;

use cosched_procfs::TaskId;

use super::channels::Opened;
use super::vms::VmEntry;
use super::Daemon;
use crate::actuator::Outcome;
use crate::error::Error;

impl Daemon {
    /// Sockets whose QEMU is known: each becomes the channel of its VM, which is found or made.
    pub(super) fn open(&mut self, opened: Vec<Opened>) {
        for o in opened {
            let (path, name, pid) = (o.path.clone(), o.name.clone(), o.process.task.id);
            let token = match self.vms.by_pid(pid) {
                Some(token) => {
                    // Found among the processes before: its agent's channel joins the entry.
                    let Some(vm) = self.vms.get_mut(token) else { continue };
                    info!("{}: its agent channel {} connected; now named {name}", vm.name(), path.display());
                    vm.threads.name = name.clone();
                    self.coord.rename(vm.id, &name);
                    token
                }
                None => match self.adopt(&name, o.process.task) {
                    Ok(token) => token,
                    Err(e) => {
                        self.channels.failed(&path, &e, self.now());
                        continue;
                    }
                },
            };
            let threads = self.vms.get(token).map_or(0, |vm| vm.threads.threads.len());
            match self.channels.attach(token, o, &self.poll, self.now()) {
                Ok(()) => info!("{name}: connected to QEMU pid {pid} ({threads} threads) via {}", path.display()),
                Err(e) => self.channels.failed(&path, &e, self.now()),
            }
        }
    }

    /// Makes an entry for the VM of QEMU process `process`, named `name`, with no channel yet:
    /// its threads are read and watched, the coordinator knows it. Returns its token.
    pub(super) fn adopt(&mut self, name: &str, process: TaskId) -> Result<usize, Error> {
        // Watch before listing: a thread born in between is seen either way.
        self.discovery.watch(process.id)?;
        let actuators = self.actuators();
        let token = match self.vms.add(name, process, &mut self.host, actuators) {
            Ok(t) => t,
            Err(e) => {
                self.discovery.unwatch(process.id);
                return Err(e);
            }
        };
        let now = self.now();
        // Its settings by name: the config's, with the operator's over them.
        let settings = self.cfg.vm_settings(name);
        if self.io.is_ok() {
            let images = crate::blockdev::images(&self.host.procfs.cmdline(process.id).unwrap_or_default());
            let disks = crate::blockdev::disks(Path::new("/sys"), &images);
            for w in disks.iter().filter_map(|d| d.warning()) {
                warn!("{name}: {w}");
            }
            for w in images.iter().filter_map(crate::blockdev::aio_warning) {
                warn!("{name}: {w}");
            }
            self.vms.get_mut(token).expect("just added").disks = disks;
        }
        let vm = self.vms.get(token).expect("just added");
        let (id, vcpus) = (vm.id, vm.threads.vcpu_count());
        self.coord.vm_found(id, name, settings, now);
        if self.membw.is_ok() {
            let share = self.cfg.membw_share(name);
            if let Err(e) = self.coord.set_membw_share(id, share) {
                warn!("{name}: {e}; it is regulated with no guaranteed share");
            }
        }
        self.coord.set_vm_vcpus(id, vcpus);
        let mut actions = Vec::new();
        self.coord.follow_vm(id, now, &mut actions);
        self.execute(&mut actions, None);
        let _ = self.apply_statics(token); // told in the log; the VM is coordinated either way
        Ok(token)
    }

    /// Makes entries of QEMU processes that have no channel to us (guests without an agent,
    /// libvirt domains without the channel): config `[vm.NAME]` applies to them by QEMU's
    /// `-name` or their libvirt domain, and host-side features act on them.
    pub(super) fn discover_processes(&mut self) {
        let vms = &self.vms;
        let mut found = Vec::new();
        if self.cfg.discover_libvirt {
            found = self
                .discovery
                .libvirt_domains(&self.host.procfs, &self.cfg.libvirt_dir, |pid| vms.by_pid(pid).is_some());
        }
        if self.cfg.discover_processes {
            let libvirts: Vec<i32> = found.iter().map(|(_, p)| p.task.id).collect();
            found.extend(
                self.discovery
                    .qemu_processes(&self.host.procfs, |pid| vms.by_pid(pid).is_some() || libvirts.contains(&pid)),
            );
        }
        for (name, p) in found {
            let pid = p.task.id;
            match self.adopt(&name, p.task) {
                Ok(_) => info!("{name}: found QEMU pid {pid} with no agent channel"),
                Err(e) => debug!("QEMU pid {pid}: {e}"),
            }
        }
    }

    /// Thread life-cycle events of the VMs' processes: newcomers are tracked (and brought to
    /// their VM's levels at once), renamed threads get their role, exited ones are dropped.
    pub(super) fn on_thread_events(&mut self) {
        let mut evs = std::mem::take(&mut self.thread_events);
        let lost = self.discovery.drain(&mut evs);
        let mut touched: Vec<usize> = Vec::new();
        for ev in evs.drain(..) {
            let Some(token) = self.vms.by_pid(ev.tgid()) else { continue };
            let Some(vm) = self.vms.get_mut(token) else { continue };
            if vm.threads.thread_event(&mut self.host, &ev) && !touched.contains(&token) {
                touched.push(token);
            }
        }
        self.thread_events = evs;
        let now = self.now();
        for token in touched {
            let Some(vm) = self.vms.get_mut(token) else { continue };
            self.coord.set_vm_vcpus(vm.id, vm.threads.vcpu_count());
            if vm.threads.raised() {
                let out = vm.threads.reapply(&mut self.host);
                note_new_threads(vm, &out, now);
            }
            self.sync_events(token);
        }
        if lost {
            self.refresh_threads(true);
        }
    }

    /// Re-reads the thread lists (of raised VMs only, unless `all`) and brings threads that
    /// appeared since to the VM's levels. For VMs at normal level this only updates what
    /// `cosched status` shows (QEMU names a thread a moment after creating it).
    pub(super) fn refresh_threads(&mut self, all: bool) {
        let now = self.now();
        for token in self.vms.tokens() {
            let Some(vm) = self.vms.get_mut(token) else { continue };
            if !all && !vm.threads.raised() {
                continue;
            }
            let out = vm.threads.refresh(&mut self.host);
            self.coord.set_vm_vcpus(vm.id, vm.threads.vcpu_count());
            note_new_threads(vm, &out, now);
        }
    }

    /// Forgets a VM: everything changed on its threads is put back, its channel closed.
    pub(super) fn drop_vm(&mut self, token: usize, why: &str) {
        let Some(mut vm) = self.vms.remove(token) else { return };
        let mut actions = Vec::new();
        self.coord.vm_gone(vm.id, self.now(), &mut actions);
        let out = vm.threads.restore(&mut self.host);
        for e in &out.errors {
            warn!("{}: restoring: {e}", vm.name());
        }
        self.channels.close(token, &self.poll);
        self.discovery.unwatch(vm.pid());
        if let Ok(ev) = self.events.as_mut() {
            ev.forget(vm.id, vm.pid());
        }
        if let Ok(m) = self.membw.as_mut() {
            m.forget(vm.id);
        }
        self.backlog.retain(|t| *t != token);
        self.held.retain(|h| h.0 != token);
        self.dirty.retain(|t| *t != token);
        info!("{}: {why}; {} setting(s) restored", vm.name(), out.restored);
        self.update_host_shield();
    }

    /// Forgets VMs whose QEMU process is gone (or whose pid now names another process).
    pub(super) fn check_vms_alive(&mut self) {
        let gone: Vec<usize> = self
            .vms
            .iter()
            .filter(|(_, vm)| match self.host.procfs.process(vm.pid()) {
                Ok(p) => p.task != vm.threads.process(), // the pid names another process now
                Err(e) => e.is_gone(),                   // EMFILE and the like are not an exit
            })
            .map(|(t, _)| t)
            .collect();
        for t in gone {
            self.drop_vm(t, "QEMU process exited");
        }
    }
}

/// Logs what bringing a VM's new threads to its levels did, and counts its errors.
pub(super) fn note_new_threads(vm: &mut VmEntry, out: &Outcome, now: u64) {
    if out.changed > 0 {
        debug!("{}: changed {} new thread(s)", vm.name(), out.changed);
    }
    vm.note(out, now);
}
