//! The status snapshot: what `cosched status` shows and the metrics are made from, built from
//! read-only views of the daemon's parts.

use cosched_core::Coordinator;
use serde_json::{json, Value};

use super::channels::Channels;
use super::vms::Vms;
use super::Cost;
use crate::config::HostConfig;
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
    pub io: &'a Result<Option<crate::actuator::WeightHierarchy>, String>,
    pub events: &'a Result<super::events::EventBoost, String>,
    pub membw: &'a Result<super::membw::Membw, String>,
    pub shield: &'a crate::shield::HostShield,
    pub caps: &'a Option<crate::caps::Caps>,
}

pub fn snapshot(v: &View) -> Value {
    let (now, coord) = (v.now, v.coord);
    let policy = coord.policy();
    let vms: Vec<Value> = v
        .vms
        .iter()
        .filter_map(|(token, e)| coord.vm(e.id).map(|vm| (token, e, vm)))
        .map(|(token, e, vm)| {
            let resources: serde_json::Map<String, Value> = vm
                .slots
                .iter()
                .map(|(r, s)| {
                    // Every slot is of a resource the coordinator supports, so it has limits.
                    let limits = coord.limits(*r).copied().unwrap_or_else(|| policy.limits(*r));
                    let mut v = json!({
                        "enabled": vm.settings.enabled(*r),
                        "active": coord.enabled(*r) && vm.settings.enabled(*r),
                        "level": s.level.name(),
                        "wants": s.wants,
                        "granted": s.granted,
                        "boosted_for_ms": s.boosted_for_ns(now) as f64 / 1e6,
                        "boost_share_permille": s.boost_share_permille(now, &limits),
                        "in_cooldown": s.in_cooldown(now),
                        "counters": s.counters,
                    });
                    if *r == cosched_proto::Resource::Cpu {
                        // RT co-scheduling and predictions (`cosched_core::rt`).
                        v["rt"] = json!(coord.rt_status(e.id, now));
                    }
                    (r.name().to_string(), v)
                })
                .collect();
            let socket = v.channels.path(token);
            json!({
                "name": vm.name,
                "pid": e.pid(),
                "socket": socket,
                "agent": socket.is_some(),
                "priority": vm.settings.priority,
                "vcpus": vm.vcpus,
                "registered": vm.registered.is_some(),
                "caps": cosched_proto::caps::names(vm.registered.unwrap_or(0)),
                "counters": vm.counters,
                "resources": resources,
                "actuation_errors": e.actuation_errors,
                "dropped_replies": v.channels.dropped_replies(token),
                "read_held": v.channels.held(token),
                "latency": e.latency.summary(),
                "latency_histogram": e.latency.histogram(),
                "threads": e.threads.threads(),
                "disks": e.disks,
                "event_balance_ns": v.events.as_ref().ok().and(coord.policy_of::<cosched_core::EventPolicy>()).map(|ev| ev.balance_ns(e.id)),
                "membw": super::membw::vm_status(coord.policy_of::<cosched_core::MembwPolicy>(), e.id),
                "static": {
                    "tuning": e.threads.static_plan().describe(),
                    "plan": e.threads.static_plan(),
                    "notes": e.threads.static_notes(),
                    "guard": coord.static_guard_status(e.id, now),
                },
            })
        })
        .collect();
    let resources: serde_json::Map<String, Value> = coord
        .resources()
        .map(|r| {
            let mut v = json!({
                "enabled": coord.enabled(r),
                "limits": coord.limits(r),
            });
            for (k, n) in coord.figures(r) {
                v[k] = json!(n);
            }
            (r.name().to_string(), v)
        })
        .collect();
    let pending: Vec<Value> = v.channels.pending().map(|p| json!(p)).collect();
    json!({
        "daemon": {
            "pid": std::process::id(),
            "uptime_s": now as f64 / 1e9,
            "socket_dir": v.cfg.socket_dir,
            "state_dir": v.cfg.state_dir,
            "metrics_addr": v.metrics_addr,
            "thread_events": v.thread_events,
            "cost": v.cost,
            "read_rate_per_vm": v.cfg.policy.read_rate(),
        },
        "resources": resources,
        "policy": policy,
        "boost": v.cfg.boost,
        "io": io_status(v),
        "event": event_status(v),
        "membw": super::membw::status(v.cfg, v.membw, coord.policy_of::<cosched_core::MembwPolicy>()),
        "shield": v.shield.report(),
        "privileges": v.caps.map(|c| json!({
            "uid": c.uid,
            "capabilities": c.used_present(),
            "lost": c.lost(),
        })),
        "rt": v.cfg.rt(),
        "latency": v.latency.summary(),
        "vms": vms,
        "unconnected_sockets": pending,
    })
}

/// `[event]` as configured, and how events are detected here (or why they are not), with the
/// detection's counters.
fn event_status(v: &View) -> Value {
    let mut out = json!(v.cfg.event);
    match v.events {
        Ok(ev) => {
            out["detection"] = json!(ev.mechanism());
            out["kvm_tracepoints"] = json!(ev.kvm_attached());
            let counters: serde_json::Map<String, Value> =
                ev.counters().fields().iter().map(|(k, n)| (k.to_string(), json!(n))).collect();
            out["counters"] = Value::Object(counters);
        }
        Err(why) => out["unsupported"] = json!(why),
    }
    out
}

/// `[io]` as configured, and what it acts through here (or why it cannot).
fn io_status(v: &View) -> Value {
    let mut out = json!(v.cfg.io);
    match v.io {
        Ok(None) => out["acts_through"] = json!("ioprio_set: real-time I/O class"),
        Ok(Some(crate::actuator::WeightHierarchy::V1)) => out["acts_through"] = json!("cgroup v1 blkio.bfq.weight"),
        Ok(Some(crate::actuator::WeightHierarchy::V2)) => out["acts_through"] = json!("cgroup v2 io.bfq.weight"),
        Err(why) => out["unsupported"] = json!(why),
    }
    out
}
