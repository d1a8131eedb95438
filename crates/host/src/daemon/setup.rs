//! What the daemon finds and sets up at start, and `cosched restore`: the state directory
//! (and what a previous daemon left), its privileges and own priority, which resources this
//! host can act on, and the coordinator for them.

use std::fs;
use std::path::Path;

use anyhow::Context;
use cosched_core::Coordinator;
use cosched_procfs::ProcFs;
use cosched_proto::Resource;
use mio::Poll;

use super::events::EventBoost;
use super::os::lock_state_dir;
use super::FEAS;
use crate::actuator::{weight_hierarchy, IoLever, RealSched, WeightHierarchy};
use crate::config::HostConfig;
use crate::error::{Unavailable, Why};
use crate::operator::Operator;
use crate::sched::{SchedAttr, SCHED_FIFO, SCHED_FLAG_RESET_ON_FORK};
use crate::store::{restore_all, StateDir, ThreadOps};

/// Locks the state directory and puts back what a previous daemon left changed.
pub(super) fn restore_at_start(
    cfg: &HostConfig,
    procfs: &ProcFs,
    sched: &mut dyn ThreadOps,
) -> anyhow::Result<(StateDir, fs::File)> {
    let store = StateDir::open(&cfg.state_dir)
        .with_context(|| format!("creating state directory {}", cfg.state_dir.display()))?;
    let lock = lock_state_dir(&store)?;
    let report =
        restore_all(&store, procfs, sched).with_context(|| format!("restoring from {}", cfg.state_dir.display()))?;
    if report.restored + report.gone + report.untouched > 0 || !report.errors.is_empty() {
        info!(
            "restored {} thread(s) left boosted by a previous daemon ({} gone, {} changed by someone else)",
            report.restored, report.gone, report.untouched
        );
    }
    for e in &report.errors {
        warn!("restore: {e}");
    }
    Ok((store, lock))
}

/// The operator's settings a previous daemon kept in the state directory `dir`, to lay over
/// `cfg`: those that make a valid config with it (the config may have changed since: a VM's
/// settings that no longer fit are left out, and said so); none if the file cannot be read.
pub(super) fn operator_settings(cfg: &HostConfig, dir: &Path) -> Operator {
    let ops = match Operator::load(dir) {
        Ok(o) => o,
        Err(e) => {
            warn!("operator settings: {e}: not applied (the operator's next command replaces the file)");
            return Operator::default();
        }
    };
    let mut kept = Operator { vm: Default::default(), ..ops.clone() };
    if let Err(e) = kept.over(cfg).validate() {
        warn!("operator settings: the host-wide ones do not fit the config, not applied: {e}");
        kept = Operator::default();
    }
    for (name, v) in ops.vm {
        let mut with = kept.clone();
        with.vm.insert(name.clone(), v);
        match with.over(cfg).validate() {
            Ok(()) => kept = with,
            Err(e) => warn!("operator settings of VM {name} do not fit the config, not applied: {e}"),
        }
    }
    if !kept.is_empty() {
        info!(
            "operator settings kept in {} apply over the config (cosched reset goes back to the config)",
            dir.join(crate::operator::OPERATOR_FILE).display()
        );
    }
    kept
}

/// The daemon's privileges, logged: the features it lost for want of a capability (it keeps
/// the rest).
pub(super) fn privileges() -> Option<crate::caps::Caps> {
    match crate::caps::Caps::read(Path::new("/proc/self/status")) {
        Ok(c) => {
            let lost = c.lost();
            if lost.is_empty() {
                info!("privileges: uid {}, {}: every feature available", c.uid, c.used_present().join(" "));
            }
            for l in &lost {
                warn!("privileges: uid {} without {}: lost {}", c.uid, l.needs, l.feature);
            }
            Some(c)
        }
        Err(e) => {
            warn!("privileges: cannot read them: {e}");
            None
        }
    }
}

/// Puts the daemon's own thread at `SCHED_FIFO priority` (0: leaves it), RESET_ON_FORK so
/// nothing it starts inherits it.
pub(super) fn set_own_priority(priority: u8) -> anyhow::Result<()> {
    if priority == 0 {
        return Ok(());
    }
    let me = SchedAttr::rt(SCHED_FIFO, priority as u32, SCHED_FLAG_RESET_ON_FORK);
    crate::sched::set(0, &me)
        .map_err(|e| anyhow::anyhow!(crate::sched::explain_set_error(0, &me, &e)))
        .context("daemon_priority (set it to 0 to run at SCHED_OTHER)")
}

/// Whether I/O coordination can act on this host with the configured lever (and on which
/// cgroup hierarchy), or why not. Logged either way.
pub(super) fn io_support(
    cfg: &HostConfig,
    cgroups: &crate::cgroup::CgroupFs,
) -> Result<Option<WeightHierarchy>, Unavailable> {
    let found = match cfg.io.lever {
        IoLever::Ioprio => Ok(None),
        IoLever::Weight => weight_hierarchy(cgroups).map(Some).map_err(|why| Unavailable::new(Resource::Io, why)),
    };
    match &found {
        Ok(h) => info!(
            "I/O coordination: lever {}{}",
            cfg.io.lever.name(),
            match h {
                None => format!(" (real-time I/O class, level {})", cfg.io.ioprio_level),
                Some(WeightHierarchy::V1) => format!(" (BFQ weight {} through cgroup v1 blkio)", cfg.io.weight),
                Some(WeightHierarchy::V2) => format!(" (BFQ weight {} through cgroup v2 io)", cfg.io.weight),
            }
        ),
        Err(why) => warn!(
            "I/O coordination is unsupported here: the weight lever needs BFQ weights in a cgroup hierarchy, and \
             there are none: {why}; set [io] lever = \"ioprio\" to use the real-time I/O class instead"
        ),
    }
    found
}

/// Event boosting (FEAS) if `[event]` asks for it and the kernel allows its BPF; logged either way.
pub(super) fn event_support(cfg: &HostConfig, poll: &Poll, zero: u64) -> Result<EventBoost, Unavailable> {
    if cfg.event.vms == cosched_core::EventVms::None {
        return Err(Unavailable::new(Resource::Event, Why::Off { setting: "[event] vms = \"none\"" }));
    }
    EventBoost::open(&cfg.event, poll, FEAS, zero).map_err(|why| {
        warn!("event boosting (FEAS) is unsupported here: {why}");
        Unavailable::new(Resource::Event, why)
    })
}

/// The coordinator for `cfg`: the resources this daemon can change, switched as configured.
pub(super) fn coordinator(cfg: &HostConfig, io: bool, events: bool, membw: bool) -> Coordinator {
    let host_cpus = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
    // SCHED_DEADLINE and nice boosts put no vCPU at an RT class: nothing to guard.
    let policy = cfg.coordinator_policy();
    if cfg.boost.policy == crate::actuator::BoostPolicy::Deadline {
        warn!(
            "[boost] policy = \"deadline\" is experimental: on some kernels (seen on Linux 6.18) a \
             thread that leaves SCHED_DEADLINE while asleep never returns its bandwidth, so after a \
             few deboosts no SCHED_DEADLINE reservation is admitted on this host until it reboots"
        );
    }
    let cpu = cosched_core::CpuPolicy::new(&policy, host_cpus);
    if cpu.capacity() == 0 {
        warn!(
            "this host has {host_cpus} CPU(s) and host_reserve_cpus = {}: no VM can be boosted",
            cfg.policy.host_reserve_cpus
        );
    }
    let mut resources: Vec<Box<dyn cosched_core::ResourcePolicy>> = vec![Box::new(cpu)];
    if io {
        resources.push(Box::new(cosched_core::IoPolicy));
    }
    if events {
        resources.push(Box::new(cosched_core::EventPolicy::new(cfg.event.clone())));
    }
    if membw {
        resources.push(Box::new(cosched_core::MembwPolicy::new(cfg.membw.regulator(), cfg.membw.checks_per_period)));
    }
    let mut coord = Coordinator::new(policy, resources);
    let mut rt = cfg.rt();
    if rt.priority_map != cosched_core::PriorityMap::Vm && !cfg.boost.policy.needs_rt_guard() {
        warn!("[rt] priority_map = \"vm\": guest priorities need [boost] policy = \"rr\" or \"fifo\"");
        rt.priority_map = cosched_core::PriorityMap::Vm;
    }
    coord.set_rt(rt);
    for (name, vm) in &cfg.vm {
        coord.set_ceiling(name, vm.rt_ceiling);
    }
    let mut sink = Vec::new();
    for r in Resource::ALL {
        coord.set_enabled(Some(r), cfg.starts_enabled(r), 0, &mut sink);
    }
    coord
}

/// `cosched restore`: puts back every thread recorded in `state_dir`, unless a daemon runs.
/// Also what a dead daemon's shield left (IRQ affinities, host groups' CPUs).
pub fn restore_command(state_dir: &Path, cfg: &HostConfig) -> anyhow::Result<crate::store::RestoreReport> {
    if !state_dir.exists() {
        return Ok(Default::default());
    }
    let store = StateDir::open(state_dir)?;
    let _lock = lock_state_dir(&store)?;
    let cgroups = crate::cgroup::CgroupFs::new("/proc", &cfg.cgroup_root).with_resctrl(&cfg.resctrl_root);
    let mut ops = RealSched { cgroups: cgroups.clone() };
    let mut report = restore_all(&store, &ProcFs::default(), &mut ops)?;
    let mut shield = crate::shield::HostShield::new(cfg.shield.clone(), cgroups, "/proc", store.path());
    match shield.restore_leftover() {
        Ok(n) => report.restored += n as u64,
        Err(e) => report.errors.push(format!("shield: {e}")),
    }
    Ok(report)
}
