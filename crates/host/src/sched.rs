//! `sched_getattr(2)` / `sched_setattr(2)`: the only calls that change a thread's CPU scheduling;
//! `ioprio_get/set(2)`, `sched_get/setaffinity(2)`; and [`ThreadOps`], every access to a thread's
//! settings in one trait, so that tests run the actuators and the restore on a fake.

use std::fmt;
use std::io;

use serde::{Deserialize, Serialize};

use crate::cgroup::CgroupFs;

pub const SCHED_OTHER: u32 = 0;
pub const SCHED_FIFO: u32 = 1;
pub const SCHED_RR: u32 = 2;
pub const SCHED_BATCH: u32 = 3;
pub const SCHED_IDLE: u32 = 5;
pub const SCHED_DEADLINE: u32 = 6;
pub const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

/// `struct sched_attr`, version 0 (48 bytes): utilization clamps are neither read nor touched.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SchedAttr {
    #[serde(skip)]
    size: u32,
    pub policy: u32,
    pub flags: u64,
    pub nice: i32,
    pub priority: u32,
    pub runtime_ns: u64,
    pub deadline_ns: u64,
    pub period_ns: u64,
}

const SCHED_ATTR_SIZE_VER0: u32 = 48;

impl SchedAttr {
    pub fn other(nice: i32, flags: u64) -> SchedAttr {
        SchedAttr { policy: SCHED_OTHER, nice, flags, ..Default::default() }
    }

    pub fn rt(policy: u32, priority: u32, flags: u64) -> SchedAttr {
        SchedAttr { policy, priority, flags, ..Default::default() }
    }

    /// A `SCHED_DEADLINE` reservation: `runtime_ns` every `period_ns` (deadline = period).
    pub fn deadline(runtime_ns: u64, period_ns: u64, flags: u64) -> SchedAttr {
        SchedAttr { policy: SCHED_DEADLINE, flags, runtime_ns, deadline_ns: period_ns, period_ns, ..Default::default() }
    }

    pub fn is_realtime(&self) -> bool {
        matches!(self.policy, SCHED_FIFO | SCHED_RR | SCHED_DEADLINE)
    }

    /// Same scheduling, ignoring fields the policy does not use (the kernel reports a nice
    /// value for real-time threads too, and a slice for fair ones).
    pub fn same_as(&self, other: &SchedAttr) -> bool {
        self.policy == other.policy
            && self.flags & SCHED_FLAG_RESET_ON_FORK == other.flags & SCHED_FLAG_RESET_ON_FORK
            && match self.policy {
                SCHED_FIFO | SCHED_RR => self.priority == other.priority,
                SCHED_DEADLINE => {
                    (self.runtime_ns, self.deadline_ns, self.period_ns)
                        == (other.runtime_ns, other.deadline_ns, other.period_ns)
                }
                _ => self.nice == other.nice,
            }
    }
}

pub fn policy_name(policy: u32) -> &'static str {
    match policy {
        SCHED_OTHER => "SCHED_OTHER",
        SCHED_FIFO => "SCHED_FIFO",
        SCHED_RR => "SCHED_RR",
        SCHED_BATCH => "SCHED_BATCH",
        SCHED_IDLE => "SCHED_IDLE",
        SCHED_DEADLINE => "SCHED_DEADLINE",
        _ => "unknown",
    }
}

impl fmt::Display for SchedAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rof = if self.flags & SCHED_FLAG_RESET_ON_FORK != 0 { "|RESET_ON_FORK" } else { "" };
        match self.policy {
            SCHED_FIFO | SCHED_RR => write!(f, "{} {}{rof}", policy_name(self.policy), self.priority),
            SCHED_DEADLINE => write!(
                f,
                "SCHED_DEADLINE {}/{}/{} us{rof}",
                self.runtime_ns / 1000,
                self.deadline_ns / 1000,
                self.period_ns / 1000
            ),
            p => write!(f, "{} nice {}{rof}", policy_name(p), self.nice),
        }
    }
}

/// Reads the scheduling attributes of thread `tid`.
pub fn get(tid: i32) -> io::Result<SchedAttr> {
    let mut attr = SchedAttr { size: SCHED_ATTR_SIZE_VER0, ..Default::default() };
    // SAFETY: `attr` is a valid, writable `struct sched_attr` of the size we pass; the kernel
    // writes at most that many bytes.
    let rc =
        unsafe { libc::syscall(libc::SYS_sched_getattr, tid, &mut attr as *mut SchedAttr, SCHED_ATTR_SIZE_VER0, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(attr)
}

/// The slice of a fair thread that never asked for one. Since Linux 6.12 `sched_getattr`
/// reports a fair thread's slice in `sched_runtime`, and passing it back to `sched_setattr` would
/// mark the slice as the thread's own ("custom"); restoring the default means passing 0.
/// Read from our own thread, which never sets a slice (debugfs has the same number, but reading
/// it under kernel lockdown logs a warning each time).
fn default_fair_slice_ns() -> u64 {
    static SLICE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SLICE.get_or_init(|| get(0).ok().filter(|a| !a.is_realtime()).map(|a| a.runtime_ns).unwrap_or(0))
}

/// Sets the scheduling attributes of thread `tid`.
pub fn set(tid: i32, attr: &SchedAttr) -> io::Result<()> {
    // First call in a process: learn the default slice while this thread is still fair.
    let default_slice = default_fair_slice_ns();
    let mut a = *attr;
    a.size = SCHED_ATTR_SIZE_VER0;
    if !a.is_realtime() {
        a.priority = 0;
        a.deadline_ns = 0;
        a.period_ns = 0;
        if a.runtime_ns == default_slice {
            a.runtime_ns = 0;
        }
    }
    // SAFETY: `a` is a valid `struct sched_attr` with `size` set; the kernel only reads it.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, tid, &a as *const SchedAttr, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A clear explanation for the errors `sched_setattr` gives when the host cannot grant a class.
pub fn explain_set_error(tid: i32, attr: &SchedAttr, err: &io::Error) -> String {
    let hint = match err.raw_os_error() {
        Some(libc::EPERM) if attr.is_realtime() => {
            " (needs root/CAP_SYS_NICE; with CONFIG_RT_GROUP_SCHED the thread's cpu cgroup must \
             have cpu.rt_runtime_us > 0)"
        }
        Some(libc::EBUSY) if attr.policy == SCHED_DEADLINE => {
            " (SCHED_DEADLINE admission control refused the bandwidth)"
        }
        Some(libc::ESRCH) => " (thread exited)",
        _ => "",
    };
    format!("sched_setattr({tid}, {attr}): {err}{hint}")
}

/// The I/O priority of thread `tid` (`ioprio_get(IOPRIO_WHO_PROCESS)`: class << 13 | data).
pub fn get_ioprio(tid: i32) -> io::Result<u16> {
    // SAFETY: ioprio_get takes two integers and returns an integer.
    let rc = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, tid) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as u16)
}

/// Sets the I/O priority of thread `tid`.
pub fn set_ioprio(tid: i32, ioprio: u16) -> io::Result<()> {
    // SAFETY: ioprio_set takes three integers.
    let rc = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, tid, ioprio as libc::c_int) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

const IOPRIO_WHO_PROCESS: libc::c_int = 1;

/// The CPUs thread `tid` may run on, sorted.
pub fn get_affinity(tid: i32) -> io::Result<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: passing the set's true size.
    if unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: CPU_ISSET reads the set within its bounds (i < CPU_SETSIZE).
    Ok((0..libc::CPU_SETSIZE as usize).filter(|i| unsafe { libc::CPU_ISSET(*i, &set) }).collect())
}

/// Sets the CPUs thread `tid` may run on.
pub fn set_affinity(tid: i32, cpus: &[usize]) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|c| **c < libc::CPU_SETSIZE as usize) {
        // SAFETY: c is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: passing the set's true size; the kernel only reads it.
    if unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Access to the scheduler: the real syscalls, or a fake in tests.
pub trait SchedOps {
    fn get(&mut self, tid: i32) -> io::Result<SchedAttr>;
    fn set(&mut self, tid: i32, attr: &SchedAttr) -> io::Result<()>;
}

/// Access to a thread's settings: the real system calls, or a fake in tests.
pub trait ThreadOps: SchedOps {
    fn get_ioprio(&mut self, tid: i32) -> io::Result<u16>;
    fn set_ioprio(&mut self, tid: i32, ioprio: u16) -> io::Result<()>;
    fn get_affinity(&mut self, tid: i32) -> io::Result<Vec<usize>>;
    fn set_affinity(&mut self, tid: i32, cpus: &[usize]) -> io::Result<()>;
    fn get_cgroup(&mut self, tid: i32, hierarchy: &str) -> io::Result<String>;
    fn set_cgroup(&mut self, tid: i32, hierarchy: &str, group: &str) -> io::Result<()>;
    /// The cgroup tree these operations work on (groups are created, weighted and removed
    /// through it).
    fn cgroups(&self) -> &CgroupFs;
}

/// The system calls on the running kernel, and its cgroups (`/sys/fs/cgroup` unless a test
/// gives a fake tree).
#[derive(Debug, Default, Clone)]
pub struct RealSched {
    pub cgroups: CgroupFs,
}

impl SchedOps for RealSched {
    fn get(&mut self, tid: i32) -> io::Result<SchedAttr> {
        get(tid)
    }
    fn set(&mut self, tid: i32, attr: &SchedAttr) -> io::Result<()> {
        set(tid, attr)
    }
}

impl ThreadOps for RealSched {
    fn get_ioprio(&mut self, tid: i32) -> io::Result<u16> {
        get_ioprio(tid)
    }
    fn set_ioprio(&mut self, tid: i32, ioprio: u16) -> io::Result<()> {
        set_ioprio(tid, ioprio)
    }
    fn get_affinity(&mut self, tid: i32) -> io::Result<Vec<usize>> {
        get_affinity(tid)
    }
    fn set_affinity(&mut self, tid: i32, cpus: &[usize]) -> io::Result<()> {
        set_affinity(tid, cpus)
    }
    fn get_cgroup(&mut self, tid: i32, hierarchy: &str) -> io::Result<String> {
        self.cgroups.get(tid, hierarchy)
    }
    fn set_cgroup(&mut self, tid: i32, hierarchy: &str, group: &str) -> io::Result<()> {
        self.cgroups.set(tid, hierarchy, group)
    }
    fn cgroups(&self) -> &CgroupFs {
        &self.cgroups
    }
}
