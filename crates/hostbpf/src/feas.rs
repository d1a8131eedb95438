//! FEAS event detection on the host (the FEAS paper; `src/bpf/feas.bpf.c`): [`FeasWatch`] tells the
//! daemon when a VM it watches received an event (its main-loop or I/O thread woken by a device, or
//! a KVM interrupt injection) while one of its vCPU threads was runnable but waiting for a CPU,
//! within `n_limit` per counting cycle ([`FeasMsg::Boost`]), beyond it once per cycle
//! ([`FeasMsg::Postponed`]), and when a boosted vCPU went to sleep ([`FeasMsg::Blocked`]).
//! Everything else (timer wake-ups, a VM's own threads waking each other, events while no vCPU
//! waits) is decided and counted in the kernel ([`FeasCounters`]) and never wakes the daemon.
//!
//! The same programs time how long each watched vCPU thread waits runnable before it runs, per
//! VM and level ([`FeasWatch::run_delays`], [`FeasWatch::set_run_level`]).
//!
//! The daemon says which threads are which ([`FeasWatch::set_thread`]) and which VMs get event
//! boosting ([`FeasWatch::set_vm`]); thread ids are checked against the task's process in the
//! kernel, so a recycled id is never taken for a VM's thread.

use std::fmt;
use std::os::fd::RawFd;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject};

use crate::skel_feas::types::{
    feas_conf, feas_msg, feas_msg_kind, feas_netdev, feas_stats, feas_thread, feas_vm, rd_hist, rd_key,
};
use crate::skel_feas::{FeasSkel, FeasSkelBuilder};
use crate::{bytes_of, probe, read_prefix, Error, Mechanism, ObjectStorage, Plain, Ring};

/// vCPU threads of one VM the kernel side looks at.
pub const MAX_VCPUS: usize = 32;

/// Buckets of a run-delay histogram: bucket `i` counts delays in `[2^i, 2^(i+1))` ns, the last
/// also everything longer.
pub const RD_BUCKETS: usize = 40;

/// The level a VM's vCPU threads are at, as the daemon applied it: the run delays are kept per
/// level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RunLevel {
    Normal = 0,
    /// The CPU boost.
    Boosted = 1,
    /// Event boosting (FEAS).
    EventBoosted = 2,
    /// A static FIFO tuning.
    Static = 3,
}

impl RunLevel {
    pub const ALL: [RunLevel; 4] = [RunLevel::Normal, RunLevel::Boosted, RunLevel::EventBoosted, RunLevel::Static];

    pub fn name(self) -> &'static str {
        match self {
            RunLevel::Normal => "normal",
            RunLevel::Boosted => "boosted",
            RunLevel::EventBoosted => "event-boosted",
            RunLevel::Static => "static",
        }
    }
}

/// How long a VM's vCPU threads waited runnable before they ran, at one level: woken ones from
/// their wake-up, preempted ones from their switch-out, to their switch-in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunDelays {
    pub count: u64,
    pub sum_ns: u64,
    /// See [`RD_BUCKETS`].
    pub buckets: [u64; RD_BUCKETS],
}

impl Default for RunDelays {
    fn default() -> Self {
        RunDelays { count: 0, sum_ns: 0, buckets: [0; RD_BUCKETS] }
    }
}

impl RunDelays {
    fn add(&mut self, h: &rd_hist) {
        self.count += h.count;
        self.sum_ns += h.sum_ns;
        for (d, s) in self.buckets.iter_mut().zip(h.buckets.iter()) {
            *d += s;
        }
    }
}

/// What the kernel side needs of the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeasParams {
    /// `CLOCK_MONOTONIC` ns at which counting cycle 0 starts (the daemon's clock's zero).
    pub epoch_ns: u64,
    pub cycle_ns: u64,
    /// How long after a [`FeasMsg::Boost`] a vCPU going to sleep sends [`FeasMsg::Blocked`].
    pub slice_ns: u64,
    pub n_limit: u32,
    /// Measure the vCPUs' run delay ([`FeasWatch::run_delays`]).
    pub run_delay: bool,
    /// An event while one of the VM's vCPUs runs (and none waits) is a [`FeasMsg::Boost`] too.
    pub boost_running: bool,
}

/// What a thread is to its VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A vCPU thread: boosted.
    Vcpu,
    /// The main loop or an I/O thread: a device waking it is an event.
    Event,
    /// A thread-pool worker (aio=threads): its wake-ups of the VM's other threads are disk
    /// completions.
    Worker,
}

/// A message from the kernel side; `ts` is `CLOCK_MONOTONIC` ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeasMsg {
    Boost { tgid: i32, ts: u64 },
    Postponed { tgid: i32, ts: u64 },
    Blocked { tgid: i32, ts: u64 },
}

impl FeasMsg {
    fn decode(data: &[u8]) -> Option<FeasMsg> {
        let m: feas_msg = read_prefix(data)?;
        let (tgid, ts) = (m.tgid, m.ts);
        Some(match m.kind {
            feas_msg_kind::FEAS_BOOST => FeasMsg::Boost { tgid, ts },
            feas_msg_kind::FEAS_POSTPONED => FeasMsg::Postponed { tgid, ts },
            feas_msg_kind::FEAS_BLOCKED => FeasMsg::Blocked { tgid, ts },
            _ => return None,
        })
    }
}

// SAFETY: generated from feas_intf.h: `#[repr(C)]` structs of integers and arrays of them, with
// no padding between fields (checked by `record_layouts_match_feas_intf_h`); any bits are valid.
unsafe impl Plain for feas_msg {}
// SAFETY: as above.
unsafe impl Plain for feas_thread {}
// SAFETY: as above.
unsafe impl Plain for feas_vm {}
// SAFETY: as above.
unsafe impl Plain for feas_conf {}
// SAFETY: as above: thirteen u64.
unsafe impl Plain for feas_stats {}
// SAFETY: as above: a u32 and 16 bytes.
unsafe impl Plain for feas_netdev {}
// SAFETY: as above: an i32 and two u16.
unsafe impl Plain for rd_key {}
// SAFETY: as above: u64s.
unsafe impl Plain for rd_hist {}

/// The kernel side's counters, summed over CPUs (see `struct feas_stats` in feas_intf.h).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeasCounters {
    pub device: u64,
    pub timer: u64,
    pub internal: u64,
    pub kvm_irq: u64,
    pub boost: u64,
    pub postponed: u64,
    pub limited: u64,
    pub not_waiting: u64,
    pub blocked: u64,
    pub dropped: u64,
    /// Packets queued to a watched VM's tap device: events.
    pub net: u64,
    /// Requests completed on a block device a watched VM holds: events.
    pub block: u64,
    /// Events that found no vCPU waiting, fired when a vCPU of the VM was preempted soon after.
    pub deferred: u64,
}

impl FeasCounters {
    /// (name, value) of every counter, for status and metrics.
    pub fn fields(&self) -> [(&'static str, u64); 13] {
        [
            ("device_wakeups", self.device),
            ("timer_wakeups", self.timer),
            ("internal_wakeups", self.internal),
            ("kvm_injections", self.kvm_irq),
            ("boosts_asked", self.boost),
            ("postponements", self.postponed),
            ("over_limit", self.limited),
            ("not_waiting", self.not_waiting),
            ("blocked", self.blocked),
            ("dropped", self.dropped),
            ("net_packets", self.net),
            ("block_completions", self.block),
            ("deferred", self.deferred),
        ]
    }
}

/// The loaded and attached FEAS programs and their ring buffer. Register [`FeasWatch::fd`]
/// with mio and [`FeasWatch::drain`] on readiness.
pub struct FeasWatch {
    /// Declared first so it drops first: it reads the `feas_msgs` map of `skel`.
    ring: Ring<FeasMsg>,
    /// Dropped before `skel`: detaches the programs.
    links: Vec<Link>,
    skel: FeasSkel<'static>,
    /// Declared after `skel`, which lives in it. Held only to be dropped.
    #[allow(dead_code)]
    storage: ObjectStorage,
    mechanism: Mechanism,
    kvm: bool,
}

impl fmt::Debug for FeasWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FeasWatch").field("mechanism", &self.mechanism).field("kvm", &self.kvm).finish_non_exhaustive()
    }
}

const WHAT: &str = "FEAS event tracepoints (sched_waking, sched_switch, timer and interrupt entry/exit, \
                    net_dev_queue, block_rq_complete)";

/// Linux's name length limit for a network device, with its NUL.
pub const IFNAMSIZ: usize = 16;

/// A network device as the kernel side tells them apart: its network namespace (the inode of
/// `/proc/<pid>/ns/net` of a process in it) and its name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NetDev {
    pub netns: u32,
    pub name: String,
}

impl NetDev {
    /// The map key; `None` for a name the kernel cannot have (empty, or too long).
    fn key(&self) -> Option<feas_netdev> {
        let b = self.name.as_bytes();
        if b.is_empty() || b.len() >= IFNAMSIZ {
            return None;
        }
        let mut k = feas_netdev { netns: self.netns, ..Default::default() };
        for (d, s) in k.name.iter_mut().zip(b) {
            *d = *s as _;
        }
        Some(k)
    }
}

/// A block device number as the kernel keeps it (`major << 20 | minor`), from a `st_rdev`.
pub fn kernel_dev(rdev: u64) -> u32 {
    let (major, minor) = (libc::major(rdev as libc::dev_t), libc::minor(rdev as libc::dev_t));
    (major << 20) | (minor & 0xfffff)
}

impl FeasWatch {
    /// Loads and attaches the programs with the best mechanism this kernel allows (tp_btf, then
    /// raw_tracepoint); the KVM injection tracepoints are attached if the kernel has them.
    pub fn open(params: FeasParams) -> Result<FeasWatch, Error> {
        FeasWatch::open_with(params, &[Mechanism::TpBtf, Mechanism::RawTracepoint])
    }

    /// Like [`FeasWatch::open`], trying only `mechanisms` (tp_btf, raw_tracepoint), in order.
    pub fn open_with(params: FeasParams, mechanisms: &[Mechanism]) -> Result<FeasWatch, Error> {
        let storage = ObjectStorage::new();
        let mechanisms: Vec<Mechanism> = mechanisms.iter().copied().filter(|m| *m != Mechanism::Tracepoint).collect();
        let ((skel, links, kvm), mechanism) = probe(&storage, &mechanisms, WHAT, load)?;
        let conf = feas_conf {
            epoch_ns: params.epoch_ns,
            cycle_ns: params.cycle_ns.max(1),
            slice_ns: params.slice_ns,
            n_limit: params.n_limit,
            run_delay: params.run_delay as u32,
            boost_running: params.boost_running as u32,
            pad: 0,
        };
        skel.maps
            .feas_conf
            .update(&0u32.to_ne_bytes(), bytes_of(&conf), MapFlags::ANY)
            .map_err(|source| Error::Map { what: "setting the FEAS parameters".into(), source })?;
        let ring = Ring::new(&skel.maps.feas_msgs, FeasMsg::decode)?;
        Ok(FeasWatch { ring, links, skel, storage, mechanism, kvm })
    }

    /// VM `tgid` (QEMU's pid) gets event boosting (`on`) or not, with these vCPU threads (at
    /// most [`MAX_VCPUS`] are looked at). Its counting cycle's state is kept.
    pub fn set_vm(&mut self, tgid: i32, on: bool, vcpus: &[i32]) -> Result<(), Error> {
        let key = tgid.to_ne_bytes();
        let mut v = self
            .skel
            .maps
            .feas_vms
            .lookup(&key, MapFlags::ANY)
            .ok()
            .flatten()
            .and_then(|b| read_prefix::<feas_vm>(&b))
            .unwrap_or_default();
        v.on = on as u32;
        v.nr_vcpus = vcpus.len().min(MAX_VCPUS) as u32;
        v.vcpus = [0; MAX_VCPUS];
        for (d, s) in v.vcpus.iter_mut().zip(vcpus) {
            *d = *s;
        }
        self.skel
            .maps
            .feas_vms
            .update(&key, bytes_of(&v), MapFlags::ANY)
            .map_err(|source| Error::Map { what: format!("watching VM process {tgid} for events"), source })
    }

    /// Forgets VM `tgid`, and its run delays.
    pub fn remove_vm(&mut self, tgid: i32) {
        let _ = self.skel.maps.feas_vms.delete(&tgid.to_ne_bytes());
        let _ = self.skel.maps.rd_levels.delete(&tgid.to_ne_bytes());
        for key in rd_keys(tgid) {
            let _ = self.skel.maps.rd_hists.delete(bytes_of(&key));
        }
    }

    /// VM `tgid`'s vCPU threads are at `level` from now on: their run delays count there.
    pub fn set_run_level(&mut self, tgid: i32, level: RunLevel) -> Result<(), Error> {
        let v = level as u32;
        self.skel
            .maps
            .rd_levels
            .update(&tgid.to_ne_bytes(), &v.to_ne_bytes(), MapFlags::ANY)
            .map_err(|source| Error::Map { what: format!("setting the run-delay level of VM process {tgid}"), source })
    }

    /// VM `tgid`'s vCPU threads' run delays, per level (woken and preempted together, summed
    /// over CPUs), since it was first watched.
    pub fn run_delays(&self, tgid: i32) -> [RunDelays; 4] {
        let mut out = [RunDelays::default(); 4];
        for key in rd_keys(tgid) {
            let Ok(Some(per_cpu)) = self.skel.maps.rd_hists.lookup_percpu(bytes_of(&key), MapFlags::ANY) else {
                continue;
            };
            for h in per_cpu.iter().filter_map(|v| read_prefix::<rd_hist>(v)) {
                out[key.level as usize].add(&h);
            }
        }
        out
    }

    /// Thread `tid` of VM `tgid` has `role`. A thread already known with the same process and
    /// role keeps the state the kernel side saw.
    pub fn set_thread(&mut self, tid: i32, tgid: i32, role: Role) -> Result<(), Error> {
        let role = match role {
            Role::Vcpu => 1,
            Role::Event => 2,
            Role::Worker => 3,
        };
        let key = tid.to_ne_bytes();
        let known = self.thread(tid);
        if known.is_some_and(|t| t.tgid == tgid && t.role == role) {
            return Ok(());
        }
        let t = feas_thread { tgid, role, ..Default::default() };
        self.skel.maps.feas_threads.update(&key, bytes_of(&t), MapFlags::ANY).map_err(|source| Error::Map {
            what: format!("watching thread {tid} of process {tgid} for events"),
            source,
        })
    }

    /// Packets queued to network device `dev` are events of VM `tgid`.
    pub fn set_netdev(&mut self, dev: &NetDev, tgid: i32) -> Result<(), Error> {
        let what = || format!("watching network device {} (netns {}) for VM process {tgid}", dev.name, dev.netns);
        let key = dev.key().ok_or_else(|| Error::Map {
            what: format!("{}: not a network device name", what()),
            source: libbpf_rs::Error::from_raw_os_error(libc::EINVAL),
        })?;
        self.skel
            .maps
            .feas_netdevs
            .update(bytes_of(&key), &tgid.to_ne_bytes(), MapFlags::ANY)
            .map_err(|source| Error::Map { what: what(), source })
    }

    /// Forgets network device `dev`.
    pub fn remove_netdev(&mut self, dev: &NetDev) {
        if let Some(key) = dev.key() {
            let _ = self.skel.maps.feas_netdevs.delete(bytes_of(&key));
        }
    }

    /// Requests completed on block device `rdev` (a `st_rdev`) are events of VM `tgid`.
    pub fn set_blkdev(&mut self, rdev: u64, tgid: i32) -> Result<(), Error> {
        self.skel.maps.feas_blkdevs.update(&kernel_dev(rdev).to_ne_bytes(), &tgid.to_ne_bytes(), MapFlags::ANY).map_err(
            |source| Error::Map {
                what: format!(
                    "watching block device {}:{} for VM process {tgid}",
                    libc::major(rdev as libc::dev_t),
                    libc::minor(rdev as libc::dev_t)
                ),
                source,
            },
        )
    }

    /// Forgets block device `rdev`.
    pub fn remove_blkdev(&mut self, rdev: u64) {
        let _ = self.skel.maps.feas_blkdevs.delete(&kernel_dev(rdev).to_ne_bytes());
    }

    /// Forgets thread `tid`.
    pub fn remove_thread(&mut self, tid: i32) {
        let _ = self.skel.maps.feas_threads.delete(&tid.to_ne_bytes());
    }

    fn thread(&self, tid: i32) -> Option<feas_thread> {
        let b = self.skel.maps.feas_threads.lookup(&tid.to_ne_bytes(), MapFlags::ANY).ok()??;
        read_prefix(&b)
    }

    /// Whether vCPU thread `tid` is runnable but not running, as the kernel side last saw it.
    pub fn waiting(&self, tid: i32) -> bool {
        self.thread(tid).is_some_and(|t| t.state == 2)
    }

    /// Whether vCPU thread `tid` is running, as the kernel side last saw it.
    pub fn running(&self, tid: i32) -> bool {
        self.thread(tid).is_some_and(|t| t.state == 3)
    }

    /// CPU time vCPU thread `tid` has run since the kernel side first saw it switch, in ns,
    /// up to `now` (`CLOCK_MONOTONIC` ns): exact for a thread that is running right now, which
    /// `/proc/<pid>/task/<tid>/schedstat` is not (it lags by up to a tick).
    pub fn run_ns(&self, tid: i32, now: u64) -> u64 {
        self.thread(tid).map_or(0, |t| {
            let running = if t.state == 3 && t.since > 0 { now.saturating_sub(t.since) } else { 0 };
            t.run_ns + running
        })
    }

    /// Time vCPU thread `tid` has spent asleep since the kernel side first saw it switch, in
    /// ns, up to `now` (`CLOCK_MONOTONIC` ns).
    pub fn sleep_ns(&self, tid: i32, now: u64) -> u64 {
        self.thread(tid).map_or(0, |t| {
            let asleep = if t.state == 1 && t.since > 0 { now.saturating_sub(t.since) } else { 0 };
            t.sleep_ns + asleep
        })
    }

    /// An fd that becomes readable when messages wait (the ring buffer's epoll fd).
    pub fn fd(&self) -> RawFd {
        self.ring.fd()
    }

    /// Appends every waiting message, in order, without blocking.
    pub fn drain(&mut self, out: &mut Vec<FeasMsg>) {
        self.ring.drain(out);
    }

    /// The kernel side's counters.
    pub fn counters(&self) -> FeasCounters {
        let mut c = FeasCounters::default();
        if let Ok(Some(per_cpu)) = self.skel.maps.feas_stats.lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY) {
            for s in per_cpu.iter().filter_map(|v| read_prefix::<feas_stats>(v)) {
                c.device += s.device;
                c.timer += s.timer;
                c.internal += s.internal;
                c.kvm_irq += s.kvm_irq;
                c.boost += s.boost;
                c.postponed += s.postponed;
                c.limited += s.limited;
                c.not_waiting += s.not_waiting;
                c.blocked += s.blocked;
                c.dropped += s.dropped;
                c.net += s.net;
                c.block += s.block;
                c.deferred += s.deferred;
            }
        }
        c
    }

    /// How the programs are attached ("tp_btf" or "raw_tracepoint").
    pub fn mechanism(&self) -> &'static str {
        self.mechanism.name()
    }

    /// Whether the KVM interrupt-injection tracepoints are attached.
    pub fn kvm_attached(&self) -> bool {
        self.kvm
    }

    /// Attached programs (for tests).
    pub fn attached(&self) -> usize {
        self.links.len()
    }
}

/// The keys of VM `tgid`'s run-delay histograms: every level, both kinds.
fn rd_keys(tgid: i32) -> impl Iterator<Item = rd_key> {
    RunLevel::ALL.into_iter().flat_map(move |l| (0..2u16).map(move |kind| rd_key { tgid, level: l as u16, kind }))
}

/// `CLOCK_MONOTONIC` now, in ns: the clock of [`FeasMsg`] timestamps and [`FeasParams::epoch_ns`].
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

type Loaded = (FeasSkel<'static>, Vec<Link>, bool);

/// Opens, loads and attaches the programs of `mechanism` (and the optional KVM ones).
fn load(
    storage: &'static mut std::mem::MaybeUninit<OpenObject>,
    mechanism: Mechanism,
) -> Result<Loaded, (&'static str, libbpf_rs::Error)> {
    let mut open = FeasSkelBuilder::default().open(storage).map_err(|e| ("opening", e))?;
    let btf = mechanism == Mechanism::TpBtf;
    {
        let p = &mut open.progs;
        for prog in [
            &mut p.btf_waking,
            &mut p.btf_switch,
            &mut p.btf_hrtimer_entry,
            &mut p.btf_hrtimer_exit,
            &mut p.btf_timer_entry,
            &mut p.btf_timer_exit,
            &mut p.btf_softirq_entry,
            &mut p.btf_softirq_exit,
            &mut p.btf_irq_entry,
            &mut p.btf_irq_exit,
            &mut p.btf_net_queue,
            &mut p.btf_block_complete,
        ] {
            prog.set_autoload(btf);
        }
        for prog in [
            &mut p.raw_waking,
            &mut p.raw_switch,
            &mut p.raw_hrtimer_entry,
            &mut p.raw_hrtimer_exit,
            &mut p.raw_timer_entry,
            &mut p.raw_timer_exit,
            &mut p.raw_softirq_entry,
            &mut p.raw_softirq_exit,
            &mut p.raw_irq_entry,
            &mut p.raw_irq_exit,
            &mut p.raw_net_queue,
            &mut p.raw_block_complete,
        ] {
            prog.set_autoload(!btf);
        }
    }
    let skel = open.load().map_err(|e| ("loading", e))?;
    let mut links = Vec::new();
    {
        let p = &skel.progs;
        // The context programs first: no event is classified before they follow the CPU's state.
        let main = if btf {
            [
                &p.btf_hrtimer_entry,
                &p.btf_hrtimer_exit,
                &p.btf_timer_entry,
                &p.btf_timer_exit,
                &p.btf_softirq_entry,
                &p.btf_softirq_exit,
                &p.btf_irq_entry,
                &p.btf_irq_exit,
                &p.btf_switch,
                &p.btf_waking,
                &p.btf_net_queue,
                &p.btf_block_complete,
            ]
        } else {
            [
                &p.raw_hrtimer_entry,
                &p.raw_hrtimer_exit,
                &p.raw_timer_entry,
                &p.raw_timer_exit,
                &p.raw_softirq_entry,
                &p.raw_softirq_exit,
                &p.raw_irq_entry,
                &p.raw_irq_exit,
                &p.raw_switch,
                &p.raw_waking,
                &p.raw_net_queue,
                &p.raw_block_complete,
            ]
        };
        for prog in main {
            links.push(prog.attach().map_err(|e| ("attaching", e))?);
        }
    }
    let mut kvm = true;
    for prog in [&skel.progs.raw_kvm_set_irq, &skel.progs.raw_kvm_msi_set_irq] {
        match prog.attach() {
            Ok(l) => links.push(l),
            Err(_) => kvm = false,
        }
    }
    Ok((skel, links, kvm))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_layouts_match_feas_intf_h() {
        assert_eq!(size_of::<feas_msg>(), 16);
        assert_eq!(size_of::<feas_thread>(), 48);
        assert_eq!(size_of::<rd_key>(), 8);
        assert_eq!(size_of::<rd_hist>(), 16 + 8 * RD_BUCKETS);
        assert_eq!(size_of::<feas_vm>(), 4 + 4 + 4 * MAX_VCPUS + 8 + 4 + 4 + 8 + 8);
        assert_eq!(size_of::<feas_conf>(), 40);
        assert_eq!(size_of::<feas_stats>(), 104);
        assert_eq!(size_of::<feas_netdev>(), 4 + IFNAMSIZ);
    }

    #[test]
    fn device_keys() {
        let k = NetDev { netns: 7, name: "tap0".into() }.key().unwrap();
        assert_eq!(k.netns, 7);
        assert_eq!(&k.name[..5], &[b't' as _, b'a' as _, b'p' as _, b'0' as _, 0]);
        assert!(NetDev { netns: 7, name: "".into() }.key().is_none());
        assert!(NetDev { netns: 7, name: "a-name-too-long!".into() }.key().is_none());
        assert!(NetDev { netns: 7, name: "fifteen-chars-x".into() }.key().is_some());
        // /dev/loop0 is 7:0, /dev/sdb1 8:17; a minor above 255 is split in st_rdev.
        assert_eq!(kernel_dev(libc::makedev(7, 0)), 7 << 20);
        assert_eq!(kernel_dev(libc::makedev(8, 17)), (8 << 20) | 17);
        assert_eq!(kernel_dev(libc::makedev(259, 70000)), (259 << 20) | 70000);
    }

    #[test]
    fn decodes_messages() {
        let m = feas_msg { kind: feas_msg_kind::FEAS_BLOCKED, tgid: 42, ts: 7 };
        assert_eq!(FeasMsg::decode(bytes_of(&m)), Some(FeasMsg::Blocked { tgid: 42, ts: 7 }));
        let m = feas_msg { kind: feas_msg_kind::FEAS_BOOST, tgid: 1, ts: 2 };
        assert_eq!(FeasMsg::decode(bytes_of(&m)), Some(FeasMsg::Boost { tgid: 1, ts: 2 }));
        let m = feas_msg { kind: feas_msg_kind(9), tgid: 1, ts: 2 };
        assert_eq!(FeasMsg::decode(bytes_of(&m)), None);
        assert_eq!(FeasMsg::decode(&bytes_of(&m)[..15]), None);
    }
}
