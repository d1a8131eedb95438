//! The VMs the daemon knows, with or without an agent: each one's threads and actuators, its
//! latency and error counts. (Their settings are kept by name in the daemon's config in force.)

use std::collections::{BTreeMap, HashMap};

use cosched_core::{VmId, NS_PER_MS};
use cosched_procfs::TaskId;

use crate::actuator::{Actuator, Host, Outcome, VmThreads};
use crate::error::Error;
use crate::metrics::Latency;

/// VM tokens start here; below are the daemon's own.
pub const FIRST_VM: usize = 16;

/// A VM: its QEMU process and threads, and what the daemon measured of it. Its channel, if
/// it has one, is in [`super::channels::Channels`] under the same token.
pub struct VmEntry {
    pub id: VmId,
    pub threads: VmThreads,
    pub latency: Latency,
    pub actuation_errors: u64,
    /// The devices under its disk images and their schedulers (found when I/O coordination
    /// is supported here).
    pub disks: Vec<crate::blockdev::Disk>,
    /// Per resource: the first error of its last change of level, while that change failed.
    pub not_applied: HashMap<cosched_proto::Resource, String>,
    /// The last warning logged, and when.
    last_warn: Option<(u64, String)>,
}

impl VmEntry {
    pub fn name(&self) -> &str {
        &self.threads.name
    }

    pub fn pid(&self) -> i32 {
        self.threads.process().id
    }

    /// Logs and counts what a change did: each error counted, warned at most once per second.
    pub fn note(&mut self, out: &Outcome, now: u64) {
        if out.errors.is_empty() {
            return;
        }
        self.actuation_errors += out.errors.len() as u64;
        self.warn(&out.errors.join("; "), now);
    }

    /// What a change of `resource`'s level did: its errors counted and warned of, and kept for
    /// the status until a change of that resource succeeds.
    pub fn note_level(&mut self, resource: cosched_proto::Resource, out: &Outcome, now: u64) {
        match out.errors.first() {
            Some(e) => self.not_applied.insert(resource, e.clone()),
            None => self.not_applied.remove(&resource),
        };
        self.note(out, now);
    }

    /// Warns about this VM at most once per second, and the same message again at most once a
    /// minute (a refused boost fails the same way at every boost).
    pub fn warn(&mut self, msg: &str, now: u64) {
        let quiet = match &self.last_warn {
            Some((t, last)) if last == msg => now < t + 60_000 * NS_PER_MS,
            Some((t, _)) => now < t + 1_000 * NS_PER_MS,
            None => false,
        };
        if !quiet {
            self.last_warn = Some((now, msg.to_string()));
            warn!("{}: {msg} (the same again is logged at most once a minute)", self.threads.name);
        }
    }
}

pub struct Vms {
    map: BTreeMap<usize, VmEntry>,
    /// QEMU pid -> its VM's token.
    by_pid: HashMap<i32, usize>,
    next_token: usize,
}

impl Default for Vms {
    fn default() -> Vms {
        Vms { map: BTreeMap::new(), by_pid: HashMap::new(), next_token: FIRST_VM }
    }
}

impl Vms {
    pub fn get(&self, token: usize) -> Option<&VmEntry> {
        self.map.get(&token)
    }

    pub fn get_mut(&mut self, token: usize) -> Option<&mut VmEntry> {
        self.map.get_mut(&token)
    }

    pub fn iter(&self) -> impl Iterator<Item = (usize, &VmEntry)> {
        self.map.iter().map(|(t, v)| (*t, v))
    }

    pub fn tokens(&self) -> Vec<usize> {
        self.map.keys().copied().collect()
    }

    pub fn by_pid(&self, pid: i32) -> Option<usize> {
        self.by_pid.get(&pid).copied()
    }

    /// Makes an entry for the VM of QEMU process `process`, named `name`: its threads are read
    /// (nothing is changed). Returns its token; its id is `VmId(token)`.
    pub fn add(
        &mut self,
        name: &str,
        process: TaskId,
        host: &mut Host,
        actuators: Vec<Box<dyn Actuator>>,
    ) -> Result<usize, Error> {
        let threads = VmThreads::new(name, process, host, actuators)
            .map_err(|source| Error::Threads { pid: process.id, source })?;
        let token = self.next_token;
        self.next_token += 1;
        self.by_pid.insert(process.id, token);
        let entry = VmEntry {
            id: VmId(token as u64),
            threads,
            latency: Latency::default(),
            actuation_errors: 0,
            not_applied: HashMap::new(),
            disks: Vec::new(),
            last_warn: None,
        };
        self.map.insert(token, entry);
        Ok(token)
    }

    pub fn remove(&mut self, token: usize) -> Option<VmEntry> {
        let vm = self.map.remove(&token)?;
        self.by_pid.remove(&vm.pid());
        Some(vm)
    }

    /// The tokens of the running VMs named `name`.
    pub fn named(&self, name: &str) -> Vec<usize> {
        self.map.iter().filter(|(_, vm)| vm.name() == name).map(|(t, _)| *t).collect()
    }

    /// The names of the running VMs.
    pub fn names(&self) -> Vec<String> {
        let names: std::collections::BTreeSet<&str> = self.map.values().map(|vm| vm.name()).collect();
        names.into_iter().map(str::to_string).collect()
    }

    /// Finds a VM by name or QEMU pid.
    pub fn find(&self, key: &str) -> Result<VmId, Error> {
        let pid: Option<i32> = key.parse().ok();
        self.map.values().find(|vm| vm.name() == key || Some(vm.pid()) == pid).map(|vm| vm.id).ok_or_else(|| {
            let known: Vec<&str> = self.map.values().map(|vm| vm.name()).collect();
            Error::NoVm { key: key.to_string(), known: if known.is_empty() { "none".into() } else { known.join(", ") } }
        })
    }
}
