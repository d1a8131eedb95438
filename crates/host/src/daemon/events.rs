//! Event boosting (after the FEAS paper) in the daemon: the host BPF's messages ([`FeasWatch`]) and
//! what the BPF side must know of each VM (which of its threads are vCPUs, main-loop and I/O
//! threads or workers; whether the coordinator says to watch it). The policy is the coordinator's
//! `event` resource (`cosched_core::feas`).

use std::collections::{BTreeMap, BTreeSet};

use cosched_core::{FeasConfig, Level, VmId};
use cosched_hostbpf::feas::{monotonic_ns, FeasCounters, FeasMsg, FeasParams, FeasWatch, NetDev, Role, RunLevel};
use cosched_procfs::{ProcFs, ThreadRole};
use cosched_proto::Resource;
use mio::unix::SourceFd;
use mio::{Interest, Poll, Token};

use super::vms::{VmEntry, Vms};
use crate::error::Why;

/// What the BPF side was told of one VM.
#[derive(Debug, Default)]
struct Told {
    /// What the coordinator said.
    wanted: bool,
    /// What the BPF side was told.
    on: bool,
    vcpus: Vec<i32>,
    /// tid -> role, as written in its thread map.
    threads: BTreeMap<i32, Role>,
    /// The generation of the VM's thread list `threads` follows (`None`: not all written).
    generation: Option<u64>,
    /// The level its run delays count at, as the BPF side was told.
    run_level: Option<RunLevel>,
    /// Its tap devices and block devices (`st_rdev`), as written in the device maps.
    netdevs: BTreeSet<NetDev>,
    blkdevs: BTreeSet<u64>,
}

pub struct EventBoost {
    watch: FeasWatch,
    /// `CLOCK_MONOTONIC` ns of the daemon's time zero.
    epoch_ns: u64,
    told: BTreeMap<VmId, Told>,
    msgs: Vec<FeasMsg>,
}

/// The level a VM's vCPU threads are at, as its actuators applied it: a static FIFO tuning
/// (unguarded) over the CPU boost over event boosting. A level decided but refused by the
/// kernel still counts as that level: its run delays are what it delivered.
pub fn run_level(static_fifo: bool, cpu: Level, event: Level) -> RunLevel {
    if static_fifo {
        RunLevel::Static
    } else if cpu == Level::Boosted {
        RunLevel::Boosted
    } else if event == Level::Boosted {
        RunLevel::EventBoosted
    } else {
        RunLevel::Normal
    }
}

fn vm_run_level(vm: &VmEntry) -> RunLevel {
    let t = &vm.threads;
    let plan = t.static_plan();
    run_level(plan.fifo.is_some() && plan.guarded.is_none(), t.level(Resource::Cpu), t.level(Resource::Event))
}

fn role(r: ThreadRole) -> Option<Role> {
    match r {
        ThreadRole::Vcpu => Some(Role::Vcpu),
        ThreadRole::Main | ThreadRole::Io => Some(Role::Event),
        ThreadRole::Worker => Some(Role::Worker),
        _ => None,
    }
}

impl EventBoost {
    /// Loads the event detection (registered with `poll` under `token`); `Err` says why it
    /// cannot run here. `zero`: the daemon's time zero, as `CLOCK_MONOTONIC` ns.
    pub fn open(cfg: &FeasConfig, poll: &Poll, token: Token, zero: u64) -> Result<EventBoost, Why> {
        let params = FeasParams {
            epoch_ns: zero,
            cycle_ns: cfg.cycle_ns(),
            slice_ns: cfg.slice_ns(),
            n_limit: cfg.n_limit,
            run_delay: cfg.run_delay,
            boost_running: cfg.boosts_running(),
        };
        let watch = FeasWatch::open(params)?;
        poll.registry().register(&mut SourceFd(&watch.fd()), token, Interest::READABLE).map_err(Why::FeasRing)?;
        info!(
            "event boosting (FEAS) for {} VMs: {} boost(s) per {} ms cycle, slices of {} µs, charging {}; \
             detection on {}{}",
            cfg.vms.name(),
            cfg.n_limit,
            cfg.cycle_ms,
            cfg.slice_us,
            if cfg.charge { "on" } else { "off" },
            watch.mechanism(),
            if watch.kvm_attached() {
                " and the KVM injection tracepoints"
            } else {
                " (no KVM injection tracepoints here)"
            }
        );
        Ok(EventBoost { watch, epoch_ns: zero, told: BTreeMap::new(), msgs: Vec::new() })
    }

    /// The daemon's time of a BPF timestamp.
    pub fn time_of(&self, ts: u64) -> u64 {
        ts.saturating_sub(self.epoch_ns)
    }

    pub fn mechanism(&self) -> &'static str {
        self.watch.mechanism()
    }

    pub fn kvm_attached(&self) -> bool {
        self.watch.kvm_attached()
    }

    pub fn counters(&self) -> FeasCounters {
        self.watch.counters()
    }

    /// Takes the waiting messages.
    pub fn drain(&mut self) -> Vec<FeasMsg> {
        let mut out = std::mem::take(&mut self.msgs);
        self.watch.drain(&mut out);
        out
    }

    /// Gives back the message buffer for reuse.
    pub fn recycle(&mut self, mut msgs: Vec<FeasMsg>) {
        msgs.clear();
        self.msgs = msgs;
    }

    /// The coordinator says whether to watch `vm` for events ([`cosched_core::Action::WatchEvents`]):
    /// its threads and its devices (found in `procfs`).
    pub fn watch_vm(&mut self, vm: &VmEntry, on: bool, procfs: &ProcFs) {
        self.told.entry(vm.id).or_default().wanted = on;
        self.sync(vm);
        self.devices(vm, procfs);
    }

    /// Finds the devices of `vm` again (a NIC or disk may have been hot-plugged or removed) and
    /// tells the BPF side of those that changed: packets queued to its taps and completions on
    /// block devices it holds are its events while it is watched. A VM not watched has none in
    /// the maps (every packet on the host is looked up in them). Disk images on a filesystem are
    /// not attributed (`ProcessDevices`).
    pub fn devices(&mut self, vm: &VmEntry, procfs: &ProcFs) {
        let pid = vm.pid();
        let Some(told) = self.told.get_mut(&vm.id) else { return };
        let (net, blk): (BTreeSet<NetDev>, BTreeSet<u64>) = if told.wanted {
            match procfs.devices(pid) {
                Ok(d) => {
                    // The taps are taken to be in QEMU's namespace: where it opened them.
                    let netns = d.netns.and_then(|n| u32::try_from(n).ok());
                    let net = netns
                        .map(|netns| d.taps.into_iter().map(|name| NetDev { netns, name }).collect())
                        .unwrap_or_default();
                    (net, d.block_devices.into_iter().collect())
                }
                Err(e) => {
                    if !e.is_gone() {
                        warn!("{}: finding its devices: {e}", vm.name());
                    }
                    return;
                }
            }
        } else {
            Default::default()
        };
        for dev in told.netdevs.difference(&net) {
            self.watch.remove_netdev(dev);
        }
        for dev in told.blkdevs.difference(&blk) {
            self.watch.remove_blkdev(*dev);
        }
        let mut netdevs = BTreeSet::new();
        for dev in net {
            if told.netdevs.contains(&dev) {
                netdevs.insert(dev);
                continue;
            }
            match self.watch.set_netdev(&dev, pid) {
                Ok(()) => {
                    debug!("{}: packets to its tap {} are events", vm.name(), dev.name);
                    netdevs.insert(dev);
                }
                Err(e) => warn!("{}: {e}", vm.name()),
            }
        }
        let mut blkdevs = BTreeSet::new();
        for dev in blk {
            if told.blkdevs.contains(&dev) {
                blkdevs.insert(dev);
                continue;
            }
            match self.watch.set_blkdev(dev, pid) {
                Ok(()) => {
                    debug!("{}: completions on its block device {dev:#x} are events", vm.name());
                    blkdevs.insert(dev);
                }
                Err(e) => warn!("{}: {e}", vm.name()),
            }
        }
        told.netdevs = netdevs;
        told.blkdevs = blkdevs;
    }

    /// Tells the BPF side what changed of `vm`: its threads' roles, and whether to watch it.
    pub fn sync(&mut self, vm: &VmEntry) {
        let pid = vm.pid();
        let told = self.told.entry(vm.id).or_default();
        let on = told.wanted;
        // Called after every read from the VM's channel: the thread maps are rewritten only
        // when the thread list moved.
        let generation = vm.threads.threads.generation();
        if told.generation != Some(generation) {
            let now: BTreeMap<i32, Role> =
                vm.threads.threads.iter().filter_map(|t| role(t.role).map(|r| (t.task.id, r))).collect();
            let mut complete = true;
            for (tid, r) in &now {
                if told.threads.get(tid) != Some(r) {
                    if let Err(e) = self.watch.set_thread(*tid, pid, *r) {
                        warn!("{}: {e}", vm.name());
                        complete = false;
                        continue;
                    }
                    told.threads.insert(*tid, *r);
                }
            }
            told.threads.retain(|tid, _| {
                let keep = now.contains_key(tid);
                if !keep {
                    self.watch.remove_thread(*tid);
                }
                keep
            });
            told.generation = complete.then_some(generation);
        }
        let level = vm_run_level(vm);
        if told.run_level != Some(level) {
            match self.watch.set_run_level(pid, level) {
                Ok(()) => told.run_level = Some(level),
                Err(e) => warn!("{}: {e}", vm.name()),
            }
        }
        let vcpus = || told.threads.iter().filter(|(_, r)| **r == Role::Vcpu).map(|(t, _)| *t);
        if told.on != on || !told.vcpus.iter().copied().eq(vcpus()) {
            let vcpus: Vec<i32> = vcpus().collect();
            match self.watch.set_vm(pid, on, &vcpus) {
                Ok(()) => {
                    told.on = on;
                    told.vcpus = vcpus;
                }
                Err(e) => warn!("{}: {e}", vm.name()),
            }
        }
    }

    /// Forgets a VM that is gone.
    pub fn forget(&mut self, id: VmId, pid: i32) {
        if let Some(told) = self.told.remove(&id) {
            for tid in told.threads.keys() {
                self.watch.remove_thread(*tid);
            }
            for dev in &told.netdevs {
                self.watch.remove_netdev(dev);
            }
            for dev in &told.blkdevs {
                self.watch.remove_blkdev(*dev);
            }
        }
        self.watch.remove_vm(pid);
    }

    /// VM `pid`'s vCPUs' run delays, per level with any.
    pub fn run_delays(&self, pid: i32) -> Vec<(RunLevel, cosched_hostbpf::feas::RunDelays)> {
        let all = self.watch.run_delays(pid);
        RunLevel::ALL.into_iter().zip(all).filter(|(_, d)| d.count > 0).collect()
    }

    /// What the BPF side sees of the scheduler: a VM's vCPUs' run time, sleep and waiting.
    pub fn watch(&self) -> &FeasWatch {
        &self.watch
    }
}

/// The vCPU threads of `vm`, as the thread list has them.
fn vcpus(vms: &Vms, vm: VmId) -> impl Iterator<Item = i32> + '_ {
    vms.get(vm.0 as usize)
        .into_iter()
        .flat_map(|e| e.threads.threads.iter().filter(|t| t.role == ThreadRole::Vcpu).map(|t| t.task.id))
}

/// A VM's vCPUs' run time (ns), from the BPF side's view of the scheduler.
pub fn vcpu_run_ns(watch: &FeasWatch, vms: &Vms, vm: VmId) -> u64 {
    let now = monotonic_ns();
    vcpus(vms, vm).map(|tid| watch.run_ns(tid, now)).sum()
}

/// A VM's vCPUs' time asleep (ns).
pub fn vcpu_asleep_ns(watch: &FeasWatch, vms: &Vms, vm: VmId) -> u64 {
    let now = monotonic_ns();
    vcpus(vms, vm).map(|tid| watch.sleep_ns(tid, now)).sum()
}

/// Whether one of a VM's vCPUs is runnable but not running.
pub fn vcpu_waiting(watch: &FeasWatch, vms: &Vms, vm: VmId) -> bool {
    vcpus(vms, vm).any(|tid| watch.waiting(tid))
}

/// Whether one of a VM's vCPUs is running.
pub fn vcpu_running(watch: &FeasWatch, vms: &Vms, vm: VmId) -> bool {
    vcpus(vms, vm).any(|tid| watch.running(tid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_level_is_the_strongest_applied() {
        use Level::*;
        assert_eq!(run_level(false, Normal, Normal), RunLevel::Normal);
        assert_eq!(run_level(false, Boosted, Normal), RunLevel::Boosted);
        assert_eq!(run_level(false, Boosted, Boosted), RunLevel::Boosted);
        assert_eq!(run_level(false, Normal, Boosted), RunLevel::EventBoosted);
        // A guarded CPU boost runs at the fair class: its delays are not the boost's.
        assert_eq!(run_level(false, Guarded, Normal), RunLevel::Normal);
        assert_eq!(run_level(true, Boosted, Boosted), RunLevel::Static);
    }
}
