//! The coordinator's errors: a setting out of its range ([`ConfigError`], with the key and the
//! value), a memory-bandwidth share the regulator refuses ([`MembwError`], with the numbers),
//! and an operator's command it cannot carry out ([`Error`]).
//!
//! Each message is whole (it says the cause too), so no error here has a `source()`: anyhow's
//! `{:#}` at the top would otherwise say the cause twice.

use cosched_proto::Resource;

use crate::VmId;

/// A setting that cannot be: which key, its value, and the rule it breaks. The messages are
/// the ones `cosched host` has always printed (users and tests match on them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The value breaks a rule of its own.
    #[error("{key} = {value}: {rule}")]
    Invalid { key: String, value: String, rule: String },
    /// The value does not go with another setting (`rule` names it).
    #[error("{key} = {value} must be {rule}")]
    Conflict { key: String, value: String, rule: String },
    /// The key must be within `rule` (its value is plain from the rule: `> 0`, `1..=1000`).
    #[error("{key} must be {rule}")]
    Range { key: String, rule: String },
    /// A VM priority outside [`crate::VM_PRIORITY`].
    #[error(
        "{key} = {value}: out of range {}..={} (99 is left to the kernel's own threads)",
        crate::VM_PRIORITY.start(),
        crate::VM_PRIORITY.end()
    )]
    Priority { key: String, value: u8 },
    /// `[policy.resource.<name>]` with a name that is no resource.
    #[error("[policy.resource.{name}]: unknown resource (known: {})", known_resources())]
    UnknownResource { name: String },
}

impl ConfigError {
    /// `key = value: rule`.
    pub fn invalid(key: impl Into<String>, value: impl ToString, rule: impl Into<String>) -> ConfigError {
        ConfigError::Invalid { key: key.into(), value: value.to_string(), rule: rule.into() }
    }

    /// `key = value must be rule`.
    pub fn conflict(key: impl Into<String>, value: impl ToString, rule: impl Into<String>) -> ConfigError {
        ConfigError::Conflict { key: key.into(), value: value.to_string(), rule: rule.into() }
    }

    /// `key must be rule`.
    pub fn range(key: impl Into<String>, rule: impl Into<String>) -> ConfigError {
        ConfigError::Range { key: key.into(), rule: rule.into() }
    }
}

/// The resources' names, as a config error lists them.
pub fn known_resources() -> String {
    Resource::ALL.map(|r| r.name()).join(", ")
}

/// A memory-bandwidth share the regulator refuses; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembwError {
    /// The VM is not regulated (not added, or removed).
    #[error("VM not regulated")]
    NotRegulated(VmId),
    /// The shares in force would add up to more than the guaranteed bandwidth.
    #[error("membw share {share}‰ does not fit: the other VMs hold {held}‰ of the guaranteed bandwidth")]
    DoesNotFit { share: u64, held: u64 },
    /// A share above the whole guaranteed bandwidth.
    #[error("membw share {share}‰: at most 1000")]
    TooLarge { share: u64 },
}

/// An operator's (or the config's) setting the coordinator refuses; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Membw(#[from] MembwError),
    /// The coordinator does not know the VM.
    #[error("no such VM")]
    NoSuchVm(VmId),
    /// No CPU policy among the coordinator's resources.
    #[error("no CPU coordination here")]
    NoCpuPolicy,
    /// No memory-bandwidth policy among the coordinator's resources.
    #[error("memory bandwidth is not regulated here")]
    NoMembwPolicy,
    /// Policy keys a running coordinator cannot take ([`crate::Policy::needs_restart`]).
    #[error("needs a restart: {}", .keys.join(", "))]
    NeedsRestart { keys: Vec<String> },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{check_priority, FeasConfig, Policy, RegulatorConfig, RtConfig};

    /// The messages are the ones users and tests have always matched on, word for word.
    #[test]
    fn messages_are_the_ones_users_know() {
        let text = |e: ConfigError| e.to_string();
        assert_eq!(
            text(check_priority("[vm.x] priority", 0).unwrap_err()),
            "[vm.x] priority = 0: out of range 1..=98 (99 is left to the kernel's own threads)"
        );
        let policy = |f: fn(&mut Policy)| {
            let mut p = Policy::default();
            f(&mut p);
            text(p.validate().unwrap_err())
        };
        assert_eq!(
            policy(|p| {
                p.resource.insert("disk".into(), Default::default());
            }),
            "[policy.resource.disk]: unknown resource (known: cpu, io, membw, event)"
        );
        assert_eq!(policy(|p| p.max_boost_share_permille = 0), "max_boost_share_permille must be 1..=1000");
        assert_eq!(
            policy(|p| {
                p.resource.insert("io".into(), crate::LimitsOverride { frame_rate: Some(0), ..Default::default() });
            }),
            "[policy.resource.io] frame_rate and frame_burst must be > 0"
        );
        assert_eq!(
            policy(|p| p.rt_guard_hysteresis_ms = 900),
            "rt_guard_hysteresis_ms = 900 must be below the guard's real-time allowance (900 ms)"
        );
        assert_eq!(policy(|p| p.malformed_rate = 0), "malformed_rate must be > 0");
        let rt = RtConfig { predict_lead_min_us: 3000, predict_lead_max_us: 2000, ..RtConfig::default() };
        assert_eq!(
            text(rt.validate().unwrap_err()),
            "[rt] predict_lead_min_us = 3000 must be at most predict_lead_max_us = 2000"
        );
        let feas = FeasConfig { slice_us: 50, ..FeasConfig::default() };
        assert_eq!(
            text(feas.validate().unwrap_err()),
            "[event] slice_us = 50: must be 100..=10000 (at least 100 µs, at most one cycle)"
        );
        let reg = RegulatorConfig { guaranteed_mbps: 1000, period_ns: 0, reclaim: true, best_effort: true };
        assert_eq!(text(reg.validate().unwrap_err()), "period_ms must be 1..=10000");
        assert_eq!(
            MembwError::DoesNotFit { share: 300, held: 800 }.to_string(),
            "membw share 300‰ does not fit: the other VMs hold 800‰ of the guaranteed bandwidth"
        );
        assert_eq!(Error::from(MembwError::TooLarge { share: 1001 }).to_string(), "membw share 1001‰: at most 1000");
        assert_eq!(Error::NoSuchVm(VmId(1)).to_string(), "no such VM");
    }
}
