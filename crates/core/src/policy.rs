//! The coordination policy as the operator configures it (`[policy]` in the host config).

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use cosched_proto::Resource;
use serde::{Deserialize, Serialize};

use crate::{ConfigError, NS_PER_MS};

/// Real-time priorities a VM may be boosted at. 99 is left to the kernel's own threads and to the
/// daemon, which must run above every VM it boosts.
pub const VM_PRIORITY: RangeInclusive<u8> = 1..=98;

/// Checks a VM priority; the error names `what` and says the range.
pub fn check_priority(what: &str, p: u8) -> Result<(), ConfigError> {
    if VM_PRIORITY.contains(&p) {
        Ok(())
    } else {
        Err(ConfigError::Priority { key: what.to_string(), value: p })
    }
}

/// The `[policy]` keys a running coordinator takes ([`crate::Coordinator::set_policy`]); the
/// others need a restart ([`Policy::needs_restart`]).
pub const HOT_KEYS: [&str; 4] =
    ["default_priority", "max_continuous_boost_ms", "max_boost_share_permille", "budget_cooldown_ms"];
/// The keys of `[policy.resource.<name>]` a running coordinator takes.
pub const HOT_RESOURCE_KEYS: [&str; 3] = ["max_continuous_boost_ms", "max_boost_share_permille", "budget_cooldown_ms"];

/// Coordination policy. Durations in ms as they appear in the config file. The budget and rate
/// keys are the defaults of every resource; `[policy.resource.<name>]` overrides them for one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// Real-time priority of a VM's threads when boosted, unless set per VM (1..=98).
    pub default_priority: u8,
    /// Longest single boost; 0 = no limit.
    pub max_continuous_boost_ms: u64,
    /// Largest share of `budget_window_ms` a VM may spend boosted, in permille; 1000 = no limit.
    pub max_boost_share_permille: u64,
    pub budget_window_ms: u64,
    /// After a budget is exhausted, boosts are refused for this long.
    pub budget_cooldown_ms: u64,
    /// CPU: largest share of `rt_guard_window_ms` a VM's vCPUs may spend at the real-time class,
    /// in permille; 0 disables the guard. Keep it below `sched_rt_runtime_us / sched_rt_period_us`.
    pub rt_guard_max_share_permille: u64,
    pub rt_guard_window_ms: u64,
    /// CPU: a guarded VM goes back to real time once its share is this far below the maximum.
    pub rt_guard_hysteresis_ms: u64,
    /// CPU: CPUs kept for the host: boosted VMs together hold at most (host CPUs - this) vCPUs.
    pub host_reserve_cpus: u32,
    /// CPU: if > 0, the most vCPUs boosted at once instead of (host CPUs - host_reserve_cpus).
    pub max_boosted_vcpus: u32,
    /// Requests per second a VM may send for one resource (token bucket refill rate); requests
    /// that lower a VM's privilege always pass.
    pub frame_rate: u64,
    pub frame_burst: u64,
    /// Malformed frames per second (burst of the same size) before the VM is deregistered.
    pub malformed_rate: u64,
    /// Frames per second the daemon reads from one VM's channel; what a VM sends beyond waits
    /// in its channel (QEMU and then the guest's writes are held back). 0: twice what a guest
    /// within every rate limit can send ([`Policy::read_rate`]).
    pub read_rate: u64,
    /// Per-resource overrides of the budget and rate keys, by resource name (`cpu`, `io`, ...).
    pub resource: BTreeMap<String, LimitsOverride>,
}

/// `[policy.resource.<name>]`: any of the budget and rate keys, for that resource only.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsOverride {
    pub max_continuous_boost_ms: Option<u64>,
    pub max_boost_share_permille: Option<u64>,
    pub budget_window_ms: Option<u64>,
    pub budget_cooldown_ms: Option<u64>,
    pub frame_rate: Option<u64>,
    pub frame_burst: Option<u64>,
}

/// The budget and rate limits in force for one resource, in ns where they are times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub max_continuous_ns: u64,
    pub max_share_permille: u64,
    pub window_ns: u64,
    pub cooldown_ns: u64,
    pub frame_rate: u64,
    pub frame_burst: u64,
}

impl Limits {
    /// The most boosted time a window may hold, if the share is limited.
    pub fn share_limit_ns(&self) -> Option<u64> {
        (self.max_share_permille < 1000).then(|| self.window_ns * self.max_share_permille / 1000)
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            default_priority: 1,
            max_continuous_boost_ms: 10_000,
            max_boost_share_permille: 900,
            budget_window_ms: 20_000,
            budget_cooldown_ms: 1_000,
            rt_guard_max_share_permille: 900,
            rt_guard_window_ms: 1_000,
            rt_guard_hysteresis_ms: 50,
            host_reserve_cpus: 1,
            max_boosted_vcpus: 0,
            // The agent sends at most one transition per MIN_BOOST_TIME (500 µs): 2000/s.
            frame_rate: 2_000,
            frame_burst: 200,
            malformed_rate: 20,
            read_rate: 0,
            resource: BTreeMap::new(),
        }
    }
}

impl Policy {
    /// The limits of `resource`: its overrides over the defaults.
    /// A memory-bandwidth grant is a standing share, not a boost: the time budgets apply to it
    /// only when `[policy.resource.membw]` sets them.
    pub fn limits(&self, resource: Resource) -> Limits {
        let o = self.resource.get(resource.name()).cloned().unwrap_or_default();
        let (continuous_ms, share) = if resource == Resource::Membw {
            (0, 1000)
        } else {
            (self.max_continuous_boost_ms, self.max_boost_share_permille)
        };
        Limits {
            max_continuous_ns: o.max_continuous_boost_ms.unwrap_or(continuous_ms) * NS_PER_MS,
            max_share_permille: o.max_boost_share_permille.unwrap_or(share),
            window_ns: o.budget_window_ms.unwrap_or(self.budget_window_ms) * NS_PER_MS,
            cooldown_ns: o.budget_cooldown_ms.unwrap_or(self.budget_cooldown_ms) * NS_PER_MS,
            frame_rate: o.frame_rate.unwrap_or(self.frame_rate),
            frame_burst: o.frame_burst.unwrap_or(self.frame_burst),
        }
    }

    /// Checks ranges; the error says which setting is wrong and why.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_priority("default_priority", self.default_priority)?;
        for name in self.resource.keys() {
            if Resource::from_name(name).is_none() {
                return Err(ConfigError::UnknownResource { name: name.clone() });
            }
        }
        for r in Resource::ALL {
            let l = self.limits(r);
            let at = |key: &str| {
                if self.resource.contains_key(r.name()) {
                    format!("[policy.resource.{}] {key}", r.name())
                } else {
                    key.to_string()
                }
            };
            if l.max_share_permille == 0 || l.max_share_permille > 1000 {
                return Err(ConfigError::range(at("max_boost_share_permille"), "1..=1000"));
            }
            if l.window_ns == 0 {
                return Err(ConfigError::range(at("budget_window_ms"), "> 0"));
            }
            if l.frame_rate == 0 || l.frame_burst == 0 {
                return Err(ConfigError::range(format!("{} and frame_burst", at("frame_rate")), "> 0"));
            }
        }
        if self.rt_guard_max_share_permille > 1000 {
            return Err(ConfigError::range("rt_guard_max_share_permille", "0..=1000 (0 = off)"));
        }
        if self.rt_guard_max_share_permille > 0 {
            if self.rt_guard_window_ms == 0 {
                return Err(ConfigError::range("rt_guard_window_ms", "> 0 when the guard is on"));
            }
            let max_ms = self.rt_guard_window_ms * self.rt_guard_max_share_permille / 1000;
            if self.rt_guard_hysteresis_ms >= max_ms {
                return Err(ConfigError::conflict(
                    "rt_guard_hysteresis_ms",
                    self.rt_guard_hysteresis_ms,
                    format!("below the guard's real-time allowance ({max_ms} ms)"),
                ));
            }
        }
        if self.malformed_rate == 0 {
            return Err(ConfigError::range("malformed_rate", "> 0"));
        }
        Ok(())
    }

    /// Frames per second the daemon reads from one VM: `read_rate` if set, else twice what a
    /// guest within every limit can send: a request and the request that ends it for each
    /// resource at its `frame_rate`, registrations at `frame_rate`, and `malformed_rate`.
    /// With the defaults: 2 × (2 × 4 × 2000 + 2000 + 20) = 36 040.
    pub fn read_rate(&self) -> u64 {
        if self.read_rate > 0 {
            return self.read_rate;
        }
        let requests: u64 = Resource::ALL.iter().map(|r| self.limits(*r).frame_rate).sum();
        2 * (2 * requests + self.frame_rate + self.malformed_rate)
    }

    /// The keys of `self` (in force) and `new` that differ and that a running coordinator
    /// cannot take ([`crate::Coordinator::set_policy`]): the budget windows and rates are
    /// built into every VM's slots, the guard and the host reserve into the CPU's policy. Named
    /// as in the config (`[policy] frame_rate`, `[policy.resource.io] budget_window_ms`).
    pub fn needs_restart(&self, new: &Policy) -> Vec<String> {
        // Whole, so that a key added to `Policy` says here whether it can change at run time.
        let Policy {
            default_priority: _,
            max_continuous_boost_ms: _,
            max_boost_share_permille: _,
            budget_window_ms,
            budget_cooldown_ms: _,
            rt_guard_max_share_permille,
            rt_guard_window_ms,
            rt_guard_hysteresis_ms,
            host_reserve_cpus,
            max_boosted_vcpus,
            frame_rate,
            frame_burst,
            malformed_rate,
            read_rate,
            resource,
        } = self;
        let mut out = Vec::new();
        let mut key = |name: &str, differs: bool| {
            if differs {
                out.push(format!("[policy] {name}"));
            }
        };
        key("budget_window_ms", *budget_window_ms != new.budget_window_ms);
        key("rt_guard_max_share_permille", *rt_guard_max_share_permille != new.rt_guard_max_share_permille);
        key("rt_guard_window_ms", *rt_guard_window_ms != new.rt_guard_window_ms);
        key("rt_guard_hysteresis_ms", *rt_guard_hysteresis_ms != new.rt_guard_hysteresis_ms);
        key("host_reserve_cpus", *host_reserve_cpus != new.host_reserve_cpus);
        key("max_boosted_vcpus", *max_boosted_vcpus != new.max_boosted_vcpus);
        key("frame_rate", *frame_rate != new.frame_rate);
        key("frame_burst", *frame_burst != new.frame_burst);
        key("malformed_rate", *malformed_rate != new.malformed_rate);
        key("read_rate", *read_rate != new.read_rate);
        let names: std::collections::BTreeSet<&String> = resource.keys().chain(new.resource.keys()).collect();
        for name in names {
            let (old, new) =
                (resource.get(name).cloned().unwrap_or_default(), new.resource.get(name).cloned().unwrap_or_default());
            let LimitsOverride {
                max_continuous_boost_ms: _,
                max_boost_share_permille: _,
                budget_window_ms,
                budget_cooldown_ms: _,
                frame_rate,
                frame_burst,
            } = old;
            for (k, differs) in [
                ("budget_window_ms", budget_window_ms != new.budget_window_ms),
                ("frame_rate", frame_rate != new.frame_rate),
                ("frame_burst", frame_burst != new.frame_burst),
            ] {
                if differs {
                    out.push(format!("[policy.resource.{name}] {k}"));
                }
            }
        }
        out
    }

    /// With the guard on: (real-time allowance per window, share to fall back to before
    /// resuming), in ns.
    pub fn rt_guard(&self) -> Option<(u64, u64)> {
        (self.rt_guard_max_share_permille > 0).then(|| {
            let max = self.rt_guard_window_ms * NS_PER_MS * self.rt_guard_max_share_permille / 1000;
            (max, max.saturating_sub(self.rt_guard_hysteresis_ms * NS_PER_MS))
        })
    }
}
