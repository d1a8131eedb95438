//! Least privilege: the capabilities each feature of the daemon needs, the ones it runs with
//! (`CapEff` in `/proc/self/status`), and the features it loses without them. The daemon needs
//! neither uid 0 nor `CAP_SYS_ADMIN`: given the capabilities below (the systemd unit's bounding
//! set, the DaemonSet's `add` list) it runs as any user, says at start and in `cosched status`
//! which features it lost, and keeps the rest.

use std::path::Path;

use serde::Serialize;

pub const CAP_DAC_OVERRIDE: u32 = 1;
pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_IPC_LOCK: u32 = 14;
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_SYS_NICE: u32 = 23;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// The name of capability `c` (`CAP_SYS_NICE`), as `capabilities(7)` spells it.
pub fn name(c: u32) -> &'static str {
    match c {
        CAP_DAC_OVERRIDE => "CAP_DAC_OVERRIDE",
        CAP_DAC_READ_SEARCH => "CAP_DAC_READ_SEARCH",
        CAP_IPC_LOCK => "CAP_IPC_LOCK",
        CAP_SYS_PTRACE => "CAP_SYS_PTRACE",
        CAP_SYS_ADMIN => "CAP_SYS_ADMIN",
        CAP_SYS_NICE => "CAP_SYS_NICE",
        CAP_PERFMON => "CAP_PERFMON",
        CAP_BPF => "CAP_BPF",
        _ => "CAP_?",
    }
}

/// Every capability the daemon uses: the systemd unit's `CapabilityBoundingSet` (a test checks
/// that the two lists agree).
pub const USED: [u32; 7] =
    [CAP_SYS_NICE, CAP_BPF, CAP_PERFMON, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE, CAP_IPC_LOCK];

/// A feature and what it needs: every capability of one of `needs` (alternatives), or, with
/// `root_owns`, uid 0 instead (it writes files root owns: the cgroup and resctrl trees, IRQ
/// affinities).
#[derive(Debug, Clone, Copy)]
pub struct Feature {
    pub name: &'static str,
    pub needs: &'static [&'static [u32]],
    pub root_owns: bool,
}

pub const FEATURES: [Feature; 7] = [
    Feature {
        name: "boosting the VMs' threads (cpu, event, static FIFO) and the daemon's own SCHED_FIFO",
        needs: &[&[CAP_SYS_NICE]],
        root_owns: false,
    },
    Feature {
        name: "the io lever ioprio (real-time I/O class)",
        needs: &[&[CAP_SYS_NICE], &[CAP_SYS_ADMIN]],
        root_owns: false,
    },
    Feature {
        name: "host BPF: thread events and event boosting (without: thread lists are re-read, no event boosting)",
        needs: &[&[CAP_BPF, CAP_PERFMON], &[CAP_SYS_ADMIN]],
        root_owns: false,
    },
    Feature {
        name: "PMU counters of the vCPU threads (memory bandwidth)",
        needs: &[&[CAP_PERFMON], &[CAP_SYS_ADMIN]],
        root_owns: false,
    },
    Feature {
        name: "cgroup, resctrl and IRQ levers (io weight, memory-bandwidth throttle, CPU shield)",
        needs: &[&[CAP_DAC_OVERRIDE]],
        root_owns: true,
    },
    Feature {
        name: "VM sockets and QEMU processes of other users (libvirt's qemu user): connecting, finding a socket's QEMU",
        needs: &[&[CAP_DAC_OVERRIDE, CAP_SYS_PTRACE]],
        root_owns: false,
    },
    Feature { name: "BPF maps on kernels before 5.11 (locked memory)", needs: &[&[CAP_IPC_LOCK]], root_owns: false },
];

/// The daemon's privileges: its effective uid and capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub uid: u32,
    pub effective: u64,
}

impl Caps {
    /// From a `/proc/<pid>/status` (the daemon's: `/proc/self/status`).
    pub fn read(status: &Path) -> std::io::Result<Caps> {
        let text = std::fs::read_to_string(status)?;
        Caps::parse(&text).ok_or_else(|| std::io::Error::other(format!("{}: no Uid or CapEff line", status.display())))
    }

    pub fn parse(status: &str) -> Option<Caps> {
        let field = |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).map(str::trim);
        // "Uid:\treal\teffective\tsaved\tfs"
        let uid = field("Uid:")?.split_whitespace().nth(1)?.parse().ok()?;
        let effective = u64::from_str_radix(field("CapEff:")?, 16).ok()?;
        Some(Caps { uid, effective })
    }

    pub fn has(&self, c: u32) -> bool {
        self.effective >> c & 1 == 1
    }

    fn meets(&self, f: &Feature) -> bool {
        (f.root_owns && self.uid == 0) || f.needs.iter().any(|set| set.iter().all(|c| self.has(*c)))
    }

    /// The features it cannot use, each with what it needs.
    pub fn lost(&self) -> Vec<Lost> {
        FEATURES
            .iter()
            .filter(|f| !self.meets(f))
            .map(|f| {
                let mut needs: Vec<String> =
                    f.needs.iter().map(|set| set.iter().map(|c| name(*c)).collect::<Vec<_>>().join(" + ")).collect();
                if f.root_owns {
                    needs.push("uid 0".into());
                }
                Lost { feature: f.name, needs: needs.join(" or ") }
            })
            .collect()
    }

    /// Of the capabilities the daemon uses, those it has.
    pub fn used_present(&self) -> Vec<&'static str> {
        USED.iter().filter(|c| self.has(**c)).map(|c| name(*c)).collect()
    }
}

/// A feature lost for want of a privilege.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lost {
    pub feature: &'static str,
    pub needs: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(uid: u32, caps: &[u32]) -> String {
        let eff: u64 = caps.iter().map(|c| 1u64 << c).sum();
        format!("Name:\tcosched\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nCapInh:\t0000000000000000\nCapEff:\t{eff:016x}\n")
    }

    #[test]
    fn root_with_every_capability_loses_nothing() {
        let root = Caps::parse(&status(0, &(0..41).collect::<Vec<_>>())).unwrap();
        assert!(root.lost().is_empty());
        assert_eq!(root.used_present().len(), USED.len());
    }

    #[test]
    fn the_units_capabilities_are_enough_as_any_user() {
        let svc = Caps::parse(&status(998, &USED)).unwrap();
        assert_eq!(svc.lost(), vec![]);
        // Without BPF: the host BPF feature only, and it says what it needs.
        let no_bpf =
            Caps::parse(&status(998, &[CAP_SYS_NICE, CAP_PERFMON, CAP_DAC_OVERRIDE, CAP_SYS_PTRACE, CAP_IPC_LOCK]))
                .unwrap();
        let lost = no_bpf.lost();
        assert_eq!(lost.len(), 1, "{lost:?}");
        assert!(lost[0].feature.starts_with("host BPF"));
        assert_eq!(lost[0].needs, "CAP_BPF + CAP_PERFMON or CAP_SYS_ADMIN");
        // Root's files need no DAC_OVERRIDE as root; others' sockets do.
        let root_bounded = Caps::parse(&status(0, &[CAP_SYS_NICE, CAP_BPF, CAP_PERFMON, CAP_IPC_LOCK])).unwrap();
        let names: Vec<&str> = root_bounded.lost().iter().map(|l| l.feature).collect();
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(names[0].starts_with("VM sockets and QEMU processes of other users"));
        let nobody = Caps::parse(&status(65534, &[])).unwrap();
        assert_eq!(nobody.lost().len(), FEATURES.len());
        assert!(nobody.lost()[4].needs.ends_with("CAP_DAC_OVERRIDE or uid 0"), "{:?}", nobody.lost()[4]);
        assert!(Caps::parse("Name:\tx\n").is_none());
    }

    #[test]
    fn the_systemd_unit_bounds_exactly_the_capabilities_used() {
        let unit = include_str!("../../../packaging/cosched-host.service");
        let line = unit.lines().find_map(|l| l.strip_prefix("CapabilityBoundingSet=")).unwrap();
        let mut bounding: Vec<&str> = line.split_whitespace().collect();
        let mut used: Vec<&str> = USED.iter().map(|c| name(*c)).collect();
        bounding.sort();
        used.sort();
        assert_eq!(bounding, used);
    }
}
