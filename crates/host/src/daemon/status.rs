//! The status snapshot: what `cosched status` shows and the metrics are made from, built from
//! read-only views of the daemon's parts into the types of [`cosched_status`], which the control
//! socket sends as JSON and the CLI and the metrics read.
//!
//! The daemon's and the core's types are converted here field by field, each destructured
//! whole: a field added to one of them does not compile until the status says what it shows of
//! it.

use std::path::Path;

use cosched_core::{Coordinator, Vm};
use cosched_proto::Resource;
use cosched_status as st;

use super::channels::Channels;
use super::vms::{VmEntry, Vms};
use super::Cost;
use crate::config::HostConfig;
use crate::error::Unavailable;
use crate::metrics::Latency;

/// What the snapshot reads.
pub struct View<'a> {
    pub now: u64,
    pub cfg: &'a HostConfig,
    pub coord: &'a Coordinator,
    pub vms: &'a Vms,
    pub channels: &'a Channels,
    pub thread_events: Option<&'static str>,
    pub metrics_addr: Option<String>,
    pub cost: &'a Cost,
    pub latency: &'a Latency,
    pub io: &'a Result<Option<crate::actuator::WeightHierarchy>, Unavailable>,
    pub events: &'a Result<super::events::EventBoost, Unavailable>,
    pub membw: &'a Result<super::membw::Membw, Unavailable>,
    pub shield: &'a crate::shield::HostShield,
    pub caps: &'a Option<crate::caps::Caps>,
    /// The operator's settings over the config: where each setting comes from.
    pub ops: &'a crate::operator::Operator,
}

/// How much of the status to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// Everything: `cosched status`.
    Full,
    /// Without each thread's view, which no metric reads: a scrape, `cosched metrics`.
    Metrics,
}

pub fn snapshot(v: &View, detail: Detail) -> st::Status {
    let coord = v.coord;
    st::Status {
        schema_version: st::SCHEMA_VERSION,
        daemon: daemon(v),
        resources: coord.resources().map(|r| (r.name().to_string(), resource(coord, r))).collect(),
        policy: coord.policy().clone(),
        boost: boost(&v.cfg.boost),
        io: io_status(v),
        event: event_status(v),
        run_delay: run_delay_status(v),
        membw: super::membw::status(v.cfg, v.membw, v.coord.policy_of::<cosched_core::MembwPolicy>()),
        shield: v.shield.report().clone(),
        privileges: v.caps.as_ref().map(privileges),
        rt: v.cfg.rt(),
        latency: v.latency.summary(),
        vms: v.vms.iter().filter_map(|(token, e)| vm(v, token, e, detail)).collect(),
        unconnected_sockets: v.channels.pending().cloned().collect(),
        settings_from: v.ops.host_origins(coord.resources()),
        settings_waiting: v
            .ops
            .vm
            .iter()
            .filter(|(name, _)| v.vms.named(name).is_empty())
            .map(|(name, o)| (name.clone(), o.describe()))
            .collect(),
    }
}

fn daemon(v: &View) -> st::DaemonInfo {
    st::DaemonInfo {
        pid: std::process::id(),
        uptime_s: v.now as f64 / 1e9,
        socket_dir: v.cfg.socket_dir.clone(),
        state_dir: v.cfg.state_dir.clone(),
        metrics_addr: v.metrics_addr.clone(),
        thread_events: v.thread_events.map(str::to_string),
        cost: v.cost.clone(),
        read_rate_per_vm: v.cfg.policy.read_rate(),
        build: crate::build(),
    }
}

fn resource(coord: &Coordinator, r: Resource) -> st::ResourceStatus {
    let mut figures = st::ResourceFigures::default();
    for (name, n) in coord.figures(r) {
        figures.set(name, n);
    }
    st::ResourceStatus { enabled: coord.enabled(r), limits: coord.limits(r).copied(), figures }
}

fn boost(b: &crate::actuator::class::BoostClass) -> st::BoostConfig {
    use crate::actuator::class::{BoostClass, BoostPolicy as P};
    let BoostClass {
        policy,
        other_threads_priority_offset,
        guard_nice,
        deadline_runtime_us,
        deadline_period_us,
        boost_nice,
    } = *b;
    let policy = match policy {
        P::Rr => st::config::BoostPolicy::Rr,
        P::Fifo => st::config::BoostPolicy::Fifo,
        P::Deadline => st::config::BoostPolicy::Deadline,
        P::Nice => st::config::BoostPolicy::Nice,
    };
    st::BoostConfig {
        policy,
        other_threads_priority_offset,
        guard_nice,
        deadline_runtime_us,
        deadline_period_us,
        boost_nice,
    }
}

/// `[io]` as configured, and what it acts through here (or why it cannot).
fn io_status(v: &View) -> st::IoStatus {
    use crate::actuator::{IoBoost, IoLever, WeightHierarchy};
    let IoBoost { lever, ioprio_level, weight } = v.cfg.io;
    let lever = match lever {
        IoLever::Ioprio => st::config::IoLever::Ioprio,
        IoLever::Weight => st::config::IoLever::Weight,
    };
    let acts_through = match v.io {
        Ok(None) => Some("ioprio_set: real-time I/O class"),
        Ok(Some(WeightHierarchy::V1)) => Some("cgroup v1 blkio.bfq.weight"),
        Ok(Some(WeightHierarchy::V2)) => Some("cgroup v2 io.bfq.weight"),
        Err(_) => None,
    };
    st::IoStatus {
        lever,
        ioprio_level,
        weight,
        acts_through: acts_through.map(str::to_string),
        unsupported: v.io.as_ref().err().map(Unavailable::to_string),
    }
}

/// `[event]` as configured, and how events are detected here (or why they are not), with the
/// detection's counters.
fn event_status(v: &View) -> st::EventStatus {
    let mut out = st::EventStatus { config: v.cfg.event.clone(), ..Default::default() };
    match v.events {
        Ok(ev) => {
            let cosched_hostbpf::feas::FeasCounters {
                device,
                timer,
                internal,
                kvm_irq,
                boost,
                postponed,
                limited,
                not_waiting,
                blocked,
                dropped,
                net,
                block,
                deferred,
            } = ev.counters();
            out.detection = Some(ev.mechanism().to_string());
            out.kvm_tracepoints = Some(ev.kvm_attached());
            out.counters = Some(st::DetectionCounters {
                device_wakeups: device,
                timer_wakeups: timer,
                internal_wakeups: internal,
                kvm_injections: kvm_irq,
                boosts_asked: boost,
                postponements: postponed,
                over_limit: limited,
                not_waiting,
                blocked,
                dropped,
                net_packets: net,
                block_completions: block,
                deferred_events: deferred,
            });
        }
        Err(why) => out.unsupported = Some(why.to_string()),
    }
    out
}

/// Whether the vCPUs' run delay is measured: by event boosting's host BPF, which follows them.
fn run_delay_status(v: &View) -> st::RunDelayStatus {
    match v.events {
        Ok(_) if !v.cfg.event.run_delay => {
            st::RunDelayStatus { measured_by: None, unsupported: Some("it is off ([event] run_delay = false)".into()) }
        }
        Ok(ev) => st::RunDelayStatus { measured_by: Some(ev.mechanism().to_string()), unsupported: None },
        Err(why) => st::RunDelayStatus {
            measured_by: None,
            unsupported: Some(format!("it is measured by event boosting's host BPF, which does not run here ({why})")),
        },
    }
}

/// VM `pid`'s vCPUs' run delays per level with any, while they are measured.
fn run_delays(v: &View, pid: i32) -> std::collections::BTreeMap<String, st::RunDelay> {
    let Ok(ev) = v.events else { return Default::default() };
    ev.run_delays(pid)
        .into_iter()
        .map(|(level, d)| {
            let cosched_hostbpf::feas::RunDelays { count, sum_ns, buckets } = d;
            (level.name().to_string(), st::RunDelay { counts: buckets.to_vec(), count, sum_ns })
        })
        .collect()
}

fn privileges(c: &crate::caps::Caps) -> st::Privileges {
    st::Privileges {
        uid: c.uid,
        capabilities: c.used_present().into_iter().map(str::to_string).collect(),
        lost: c.lost().into_iter().map(|l| st::Lost { feature: l.feature.to_string(), needs: l.needs }).collect(),
    }
}

/// VM `token`, if the coordinator knows it.
fn vm(v: &View, token: usize, e: &VmEntry, detail: Detail) -> Option<st::VmStatus> {
    let vm = v.coord.vm(e.id)?;
    let socket = v.channels.path(token).map(Path::to_path_buf);
    let plan = e.threads.static_plan();
    let threads = match detail {
        Detail::Full => e.threads.threads().into_iter().map(thread).collect(),
        Detail::Metrics => Vec::new(),
    };
    // Event boosting's policy, while events are detected here.
    let events = v.events.as_ref().ok().and(v.coord.policy_of::<cosched_core::EventPolicy>());
    Some(st::VmStatus {
        name: vm.name.clone(),
        pid: e.pid(),
        agent: socket.is_some(),
        socket,
        priority: vm.settings.priority,
        vcpus: vm.vcpus,
        registered: vm.registered.is_some(),
        caps: cosched_proto::caps::names(vm.registered.unwrap_or(0)),
        counters: vm_counters(&vm.counters),
        resources: vm.slots.keys().map(|r| (r.name().to_string(), slot(v, e, vm, *r))).collect(),
        actuation_errors: e.actuation_errors,
        dropped_replies: v.channels.dropped_replies(token),
        read_held: v.channels.held(token),
        latency: e.latency.summary(),
        latency_histogram: e.latency.histogram(),
        run_delay: run_delays(v, e.pid()),
        threads,
        disks: e.disks.iter().map(disk).collect(),
        event_balance_ns: events.map(|ev| ev.balance_ns(e.id)),
        event_share_ppm: events.and_then(|ev| ev.share_ppm(e.id)),
        membw: super::membw::vm_status(v.coord.policy_of::<cosched_core::MembwPolicy>(), e.id),
        statics: st::VmStatic {
            tuning: plan.describe(),
            plan: static_plan(plan),
            notes: e.threads.static_notes().to_vec(),
            guard: v.coord.static_guard_status(e.id, v.now),
        },
        settings_from: v.ops.vm_origins(&vm.name, v.coord.resources()),
    })
}

fn vm_counters(c: &cosched_core::VmCounters) -> st::VmCounters {
    let cosched_core::VmCounters { frames, malformed, garbage_bytes, malformed_deregistrations, denied } = c;
    st::VmCounters {
        frames: *frames,
        malformed: *malformed,
        garbage_bytes: *garbage_bytes,
        malformed_deregistrations: *malformed_deregistrations,
        denied: denied.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
    }
}

/// VM `vm`'s resource `r`.
fn slot(v: &View, e: &VmEntry, vm: &Vm, r: Resource) -> st::VmResource {
    let (coord, now) = (v.coord, v.now);
    let s = &vm.slots[&r];
    // Every slot is of a resource the coordinator supports, so it has limits.
    let limits = coord.limits(r).copied().unwrap_or_else(|| coord.policy().limits(r));
    st::VmResource {
        enabled: vm.settings.enabled(r),
        active: coord.enabled(r) && vm.settings.enabled(r),
        level: s.level,
        wants: s.wants,
        granted: s.granted,
        boosted_for_ms: s.boosted_for_ns(now) as f64 / 1e6,
        boost_share_permille: s.boost_share_permille(now, &limits),
        in_cooldown: s.in_cooldown(now),
        counters: slot_counters(&s.counters),
        not_applied: e.not_applied.get(&r).cloned(),
        // RT co-scheduling and predictions (`cosched_core::rt`).
        rt: if r == Resource::Cpu { coord.rt_status(e.id, now).map(rt_status) } else { None },
    }
}

fn slot_counters(c: &cosched_core::Counters) -> st::SlotCounters {
    let cosched_core::Counters { requests, boosts, deboosts, boosted_ns, budget_exhausted, denied, events } = c;
    let mut out = st::SlotCounters {
        requests: *requests,
        boosts: *boosts,
        deboosts: *deboosts,
        boosted_ns: *boosted_ns,
        budget_exhausted: *budget_exhausted,
        denied: denied.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
        ..Default::default()
    };
    for (name, n) in events {
        out.set_own(name, *n);
    }
    out
}

fn rt_status(s: cosched_core::RtStatus) -> st::RtStatus {
    let cosched_core::RtStatus {
        priority_map,
        ceiling,
        guest_priority,
        host_priority,
        predictions,
        lead_us,
        hold_us,
        predict_error_us,
        predict_apply_late_us,
        unconfirmed_ms,
        pending,
    } = s;
    let cosched_core::rt::PredictCounters {
        received,
        applied,
        covered,
        refused,
        confirmed,
        early,
        unconfirmed,
        late,
        denied,
        cancelled,
        standing,
    } = predictions;
    st::RtStatus {
        priority_map: match priority_map {
            cosched_core::PriorityMap::Vm => st::PriorityMap::Vm,
            cosched_core::PriorityMap::Same => st::PriorityMap::Same,
            cosched_core::PriorityMap::Linear => st::PriorityMap::Linear,
        },
        ceiling,
        guest_priority,
        host_priority,
        predictions: st::PredictCounters {
            received,
            applied,
            covered,
            refused,
            confirmed,
            early,
            unconfirmed,
            late,
            denied,
            cancelled,
            standing: Some(standing),
        },
        lead_us,
        hold_us,
        predict_error_us: samples(predict_error_us),
        predict_apply_late_us: samples(predict_apply_late_us),
        unconfirmed_ms,
        pending: pending.map(|(at, state)| (at, state.to_string())),
    }
}

fn samples(s: cosched_core::rt::SamplesSummary) -> st::SamplesSummary {
    let cosched_core::rt::SamplesSummary { count, p50_us, p99_us, max_us } = s;
    st::SamplesSummary { count, p50_us, p99_us, max_us }
}

fn static_plan(p: &crate::actuator::StaticPlan) -> st::StaticPlan {
    let crate::actuator::StaticPlan { fifo, guarded, shield } = p;
    st::StaticPlan {
        fifo: *fifo,
        guarded: *guarded,
        shield: shield
            .as_ref()
            .map(|s| st::ShieldPlan { vcpus: s.vcpus.clone(), housekeeping: s.housekeeping.clone() }),
    }
}

fn thread(t: crate::actuator::ThreadView) -> st::ThreadStatus {
    let crate::actuator::ThreadView { tid, comm, role, settings, changed_by } = t;
    st::ThreadStatus {
        tid,
        comm,
        role,
        settings: settings.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        changed_by: changed_by.into_iter().map(str::to_string).collect(),
    }
}

fn disk(d: &crate::blockdev::Disk) -> st::Disk {
    let crate::blockdev::Disk { image, device, scheduler, bfq_available } = d;
    st::Disk {
        image: image.clone(),
        device: device.clone(),
        scheduler: scheduler.clone(),
        bfq_available: *bfq_available,
    }
}
