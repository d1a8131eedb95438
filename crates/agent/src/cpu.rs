//! The CPU detector: `src/bpf/cpu.bpf.c` on `sched_switch`, `sched_waking`, `sched_wakeup`,
//! `sched_wakeup_new` and `hrtimer_start`. It decides in the kernel, per CPU, and reports
//! transitions (with the need's RT priority) through a ring buffer. It predicts the guest's next
//! RT wake-up from the timers RT tasks sleep on (the `sleepers` map), or else from the period of
//! a CPU's recurring RT needs. Every structure it shares with the BPF program is the one libbpf-cargo generates from
//! `src/bpf/intf.h` (the skeleton's `types` module): no layout or offset is copied here.

#[allow(clippy::all, clippy::undocumented_unsafe_blocks, non_camel_case_types, dead_code)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/cpu.skel.rs"));
}

use std::cell::RefCell;
use std::mem::size_of;
use std::os::fd::RawFd;
use std::rc::Rc;

use anyhow::{ensure, Context};
use cosched_proto::cpu::{Need, MAX_GUEST_PRIORITY};
use cosched_proto::Resource;
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags};

use crate::core::{Prediction, StandingWindow};
use crate::detector::{
    bytes_of, event_ring, read_plain, Detector, DetectorKind, Loaded, ObjectStorage, Plain, Transition,
};
use crate::{log, Options};
use skel::types::{self, cosched_reason};
use skel::{CpuSkel, CpuSkelBuilder, OpenCpuSkel};

pub(crate) const KIND: DetectorKind = DetectorKind { resource: Resource::Cpu, load: load_detector };

// SAFETY: generated from intf.h by libbpf-cargo as `#[repr(C)]` structs of integers, of the
// `#[repr(transparent)]` u32 newtype `cosched_reason`, and (`cpu_state.timer`) of a byte array;
// any bit pattern is a valid value.
unsafe impl Plain for types::cosched_event {}
// SAFETY: as above (u64 counters only).
unsafe impl Plain for types::cosched_stats {}
// SAFETY: as above (integers and the 16-byte array libbpf-cargo emits for the opaque bpf_timer).
unsafe impl Plain for types::cpu_state {}
// SAFETY: as above (integers and the u32 newtype of an enum).
unsafe impl Plain for types::sleeper {}
// SAFETY: as above (integers only).
unsafe impl Plain for types::cosched_standing {}

crate::stats_fields!(
    types::cosched_stats;
    switches,
    need_rt,
    need_watched,
    boosts,
    deboosts,
    timer_deboosts,
    watch_added,
    events_dropped,
    watch_agent_returns,
    prio_changes,
    irq_wakeups,
    sleeps_predicted,
    withdrawals,
    timer_deboosts_deferred,
    watch_full,
    watch_spent,
    silent_boosts,
    silent_deboosts,
    silent_broken,
);

fn reason_name(e: &types::cosched_event) -> &'static str {
    match e.reason {
        cosched_reason::COSCHED_REASON_RT => "rt task",
        cosched_reason::COSCHED_REASON_WATCHED => "watched task",
        cosched_reason::COSCHED_REASON_TIMER => "no-switch timer",
        cosched_reason::COSCHED_REASON_PRIO => "priority of the need changed",
        cosched_reason::COSCHED_REASON_WITHDRAW => "predicted RT wake-up withdrawn (woken early)",
        cosched_reason::COSCHED_REASON_EPISODE => "rt task on a boosted CPU (channel probe)",
        _ if e.want != 0 => "?",
        _ => "hold elapsed at a switch",
    }
}

/// Opens the BPF object into `storage` and sets its knobs.
///
/// # Safety
///
/// The returned skeleton (and anything made from it) must be dropped before `storage`.
unsafe fn open_skel(storage: &ObjectStorage, opts: &Options) -> anyhow::Result<OpenCpuSkel<'static>> {
    // SAFETY: called once for this storage; the caller drops the skeleton before `storage`.
    let object = unsafe { storage.lend() };
    let mut open = CpuSkelBuilder::default()
        .open(object)
        .context("opening the BPF object (needs a kernel with BTF: /sys/kernel/btf/vmlinux)")?;
    let ro = open.maps.rodata_data.as_deref_mut().context("BPF rodata missing")?;
    ro.min_boost_ns = opts.min_boost_us * 1_000;
    ro.hold_periodic_max_ns = opts.hold_periodic_max_us * 1_000;
    ro.idle_deboost_ns = opts.idle_deboost_ms * 1_000_000;
    ro.watch_count = opts.watch_count;
    ro.watch_budget_ns = opts.watch_budget_ms * 1_000_000;
    ro.watch_refill_ns = opts.watch_refill_us * 1_000;
    if opts.watch_budget_ms > 0 {
        // The map's room is the cap on tasks watched at once.
        open.maps.watch.set_max_entries(opts.watch_max).context("sizing the watch map")?;
    }
    ro.agent_tgid = std::process::id();
    ro.report_episodes = opts.probe_frames as u32;
    ro.hrtimer_wakeup_addr = if opts.predict { hrtimer_wakeup_addr() } else { 0 };
    Ok(open)
}

/// The address of `hrtimer_wakeup` (every timed sleep's timer function) from /proc/kallsyms; 0
/// if it cannot be read (then predictions come from the period of recurring needs only).
fn hrtimer_wakeup_addr() -> u64 {
    let Ok(syms) = std::fs::read_to_string("/proc/kallsyms") else { return 0 };
    kallsyms_addr(&syms, "hrtimer_wakeup")
}

/// The address of text symbol `name` in a /proc/kallsyms listing (0: absent, or hidden by
/// kptr_restrict).
fn kallsyms_addr(syms: &str, name: &str) -> u64 {
    syms.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (addr, kind, sym) = (f.next()?, f.next()?, f.next()?);
            (sym == name && kind.eq_ignore_ascii_case("t") && f.next().is_none())
                .then(|| u64::from_str_radix(addr, 16).ok())
                .flatten()
        })
        .next()
        .unwrap_or(0)
}

/// `CLOCK_MONOTONIC` in ns: the clock of `bpf_ktime_get_ns()` and of hrtimer expiries.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The need a CPU's boosted state names.
fn need_of(prio: u32, irq: u32) -> Need {
    Need { priority: prio.min(MAX_GUEST_PRIORITY as u32) as u8, irq: irq != 0 }
}

/// The earliest prediction, at monotonic time `now`: the sleepers' timers (`(wake_ns, prio)`,
/// asleep ones only) first; only if none is known, the CPUs' recurring RT needs (the start of the
/// last episode plus the measured period, if still ahead).
fn earliest(
    now: u64,
    sleepers: impl IntoIterator<Item = types::sleeper>,
    cpus: impl IntoIterator<Item = types::cpu_state>,
) -> Option<Prediction> {
    let at = |wake_ns: u64, prio: u32| {
        (wake_ns > now).then(|| Prediction {
            in_ns: wake_ns - now,
            at_ns: wake_ns,
            priority: need_of(prio, 0).priority,
        })
    };
    let min = |a: Option<Prediction>, b: Option<Prediction>| match (a, b) {
        (Some(a), Some(b)) => Some(if b.in_ns < a.in_ns { b } else { a }),
        (a, b) => a.or(b),
    };
    let timers = sleepers
        .into_iter()
        .filter(|s| s.state == types::cosched_sleeper_state::COSCHED_SLEEPER_ASLEEP)
        .fold(None, |m, s| min(m, at(s.wake_ns, s.prio)));
    timers.or_else(|| {
        cpus.into_iter()
            .filter(|c| c.episode_prio > 0 && c.period_ns > 0 && c.episode_start_ns > 0)
            .fold(None, |m, c| min(m, at(c.episode_start_ns + c.period_ns, c.episode_prio)))
    })
}

fn load(open: OpenCpuSkel<'static>) -> anyhow::Result<CpuSkel<'static>> {
    let skel = open.load().context("loading the BPF detectors (root, BTF, bpf_timer: Linux >= 5.15)")?;
    for (map, size) in [
        (&skel.maps.cpu_states as &dyn MapCore, size_of::<types::cpu_state>()),
        (&skel.maps.stats, size_of::<types::cosched_stats>()),
    ] {
        ensure!(
            map.value_size() as usize == size,
            "BPF map {} has {}-byte values, the generated type {size} bytes",
            map.name().to_string_lossy(),
            map.value_size()
        );
    }
    Ok(skel)
}

/// The CPU detector loaded, not attached. Fields drop in declaration order: the skeleton (it
/// unloads, and drops the object in the storage), then the storage.
struct LoadedCpu {
    skel: CpuSkel<'static>,
    storage: ObjectStorage,
}

fn load_detector(opts: &Options) -> anyhow::Result<Box<dyn Loaded>> {
    let storage = ObjectStorage::new();
    // SAFETY: the skeleton is either dropped on an error below, before `storage`, or moved into
    // a `LoadedCpu` together with `storage`, declared after it.
    let skel = load(unsafe { open_skel(&storage, opts) }?)?;
    Ok(Box::new(LoadedCpu { skel, storage }))
}

impl Loaded for LoadedCpu {
    fn attach(self: Box<Self>) -> anyhow::Result<Box<dyn Detector>> {
        // On an error below `me` drops whole: the skeleton, then the storage.
        let mut me = *self;
        me.skel.attach().context("attaching to sched_switch/sched_wakeup/sched_wakeup_new (tp_btf)")?;
        let (ring, events) = event_ring::<types::cosched_event>(&me.skel.maps.events, "cpu", "struct cosched_event")?;
        let ncpus = libbpf_rs::num_possible_cpus().unwrap_or(1);
        let LoadedCpu { skel, storage } = me;
        Ok(Box::new(CpuDetector { ring, skel, events, ncpus, withdrawn: false, episodes: 0, _storage: storage }))
    }
}

/// The loaded and attached CPU detector. Fields drop in declaration order: the ring buffer (it
/// uses the map's fd), then the skeleton (it detaches, unloads, and drops the object in the
/// storage), then the storage.
struct CpuDetector {
    ring: libbpf_rs::RingBuffer<'static>,
    skel: CpuSkel<'static>,
    events: Rc<RefCell<Vec<types::cosched_event>>>,
    ncpus: usize,
    /// A prediction was withdrawn (an event said so) since the agent last asked.
    withdrawn: bool,
    /// RT episodes on boosted CPUs reported since the agent last asked (`--probe-frames` only).
    episodes: u64,
    _storage: ObjectStorage,
}

impl CpuDetector {
    fn cpu_states(&self) -> Vec<types::cpu_state> {
        (0..self.ncpus as u32)
            .map(|cpu| {
                self.skel
                    .maps
                    .cpu_states
                    .lookup(&cpu.to_ne_bytes(), MapFlags::ANY)
                    .ok()
                    .flatten()
                    .and_then(|v| read_plain::<types::cpu_state>(&v))
                    .unwrap_or_default()
            })
            .collect()
    }
}

impl Detector for CpuDetector {
    fn resource(&self) -> Resource {
        Resource::Cpu
    }

    fn units(&self) -> String {
        format!("{} CPU{}", self.ncpus, if self.ncpus == 1 { "" } else { "s" })
    }

    fn poll_fd(&self) -> RawFd {
        self.ring.epoll_fd()
    }

    fn drain(&mut self, verbose: bool, into: &mut Vec<Transition>) {
        let _ = self.ring.consume();
        for e in self.events.borrow_mut().drain(..) {
            if verbose {
                log(&format!(
                    "cpu {} {} at {} µs: {} (pid {}{})",
                    e.cpu,
                    if e.reason == cosched_reason::COSCHED_REASON_WITHDRAW {
                        "prediction"
                    } else if e.want != 0 {
                        "wants a boost"
                    } else {
                        "done"
                    },
                    e.ts_ns / 1000,
                    reason_name(&e),
                    e.pid,
                    if e.want != 0 {
                        format!(", priority {}{}", e.prio, if e.irq != 0 { ", irq" } else { "" })
                    } else {
                        String::new()
                    }
                ));
            }
            if e.reason == cosched_reason::COSCHED_REASON_WITHDRAW {
                self.withdrawn = true;
                continue;
            }
            if e.reason == cosched_reason::COSCHED_REASON_EPISODE {
                self.episodes += 1;
                continue;
            }
            into.push(Transition { unit: e.cpu as usize, want: (e.want != 0).then(|| need_of(e.prio, e.irq)) });
        }
    }

    /// Per-CPU `boosted` flags and needs read from the BPF map; a CPU boosted silently (by a
    /// standing prediction, which the host keeps by itself) wants nothing from the agent.
    fn wants(&self) -> Vec<Option<Need>> {
        self.cpu_states()
            .into_iter()
            .map(|st| (st.boosted != 0 && st.silent == 0).then(|| need_of(st.prio, st.irq)))
            .collect()
    }

    fn set_standing(&mut self, window: Option<StandingWindow>) {
        let w = window.unwrap_or(StandingWindow { anchor_ns: 0, period_ns: 0, before_ns: 0, after_ns: 0 });
        let value = types::cosched_standing {
            anchor_ns: w.anchor_ns,
            period_ns: w.period_ns,
            before_ns: w.before_ns,
            after_ns: w.after_ns,
        };
        if let Err(e) = self.skel.maps.standing.update(&0u32.to_ne_bytes(), bytes_of(&value), MapFlags::ANY) {
            log(&format!("cpu: cannot write the standing window: {e}"));
        }
    }

    fn silent_activations(&self) -> u64 {
        let per_cpu = match self.skel.maps.stats.lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY) {
            Ok(Some(per_cpu)) => per_cpu,
            _ => return 0,
        };
        per_cpu.iter().filter_map(|v| read_plain::<types::cosched_stats>(v)).map(|s| s.silent_boosts).sum()
    }

    /// The earliest RT wake-up the sleepers map (asleep RT tasks' timers) or, failing that, the
    /// CPUs' measured periods predict.
    fn next_wake(&self) -> Option<Prediction> {
        let map = &self.skel.maps.sleepers;
        let sleepers: Vec<types::sleeper> = map
            .keys()
            .filter_map(|k| map.lookup(&k, MapFlags::ANY).ok().flatten())
            .filter_map(|v| read_plain::<types::sleeper>(&v))
            .collect();
        earliest(monotonic_ns(), sleepers, self.cpu_states())
    }

    fn take_withdrawn(&mut self) -> bool {
        std::mem::take(&mut self.withdrawn)
    }

    fn take_episodes(&mut self) -> u64 {
        std::mem::take(&mut self.episodes)
    }

    /// The detectors' counters summed over CPUs.
    fn stats(&self) -> String {
        let per_cpu = match self.skel.maps.stats.lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY) {
            Ok(Some(per_cpu)) => per_cpu,
            _ => Vec::new(),
        };
        format_stats(&sum_stats(per_cpu.iter().filter_map(|v| read_plain::<types::cosched_stats>(v))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_are_summed_and_named_by_the_generated_fields() {
        let a = types::cosched_stats { switches: 3, boosts: 1, watch_agent_returns: 2, ..Default::default() };
        let b = types::cosched_stats { switches: 4, events_dropped: 5, ..Default::default() };
        let s = format_stats(&sum_stats([a, b]));
        assert_eq!(
            s,
            "switches=7 need_rt=0 need_watched=0 boosts=1 deboosts=0 timer_deboosts=0 watch_added=0 \
             events_dropped=5 watch_agent_returns=2 prio_changes=0 irq_wakeups=0 sleeps_predicted=0 withdrawals=0 \
             timer_deboosts_deferred=0 watch_full=0 watch_spent=0 silent_boosts=0 silent_deboosts=0 silent_broken=0"
        );
    }

    #[test]
    fn events_are_read_into_the_generated_struct() {
        let e = types::cosched_event {
            ts_ns: 42_000,
            cpu: 3,
            want: 1,
            reason: cosched_reason::COSCHED_REASON_WATCHED,
            pid: 77,
            prio: 80,
            irq: 1,
        };
        // SAFETY: viewing a plain `repr(C)` value (no padding: 8 + 6 * 4 bytes) as its bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&e as *const types::cosched_event).cast::<u8>(),
                size_of::<types::cosched_event>(),
            )
        };
        let r = read_plain::<types::cosched_event>(bytes).expect("exact size");
        assert_eq!((r.ts_ns, r.cpu, r.want, r.pid, r.prio, r.irq), (42_000, 3, 1, 77, 80, 1));
        assert_eq!(reason_name(&r), "watched task");
        assert_eq!(size_of::<types::cosched_event>(), 32);
        // The timer is opaque but its room is there: 6 u64 + 12 u32 + 16.
        assert_eq!(size_of::<types::cpu_state>(), 112);
        assert_eq!(size_of::<types::cosched_standing>(), 32);
        assert_eq!(size_of::<types::sleeper>(), 24);
    }

    #[test]
    fn needs_are_capped_at_the_protocol_maximum() {
        assert_eq!(need_of(80, 1), Need { priority: 80, irq: true });
        assert_eq!(need_of(140, 0), Need { priority: 99, irq: false });
    }

    #[test]
    fn kallsyms_gives_the_text_symbol_only() {
        let syms = "ffffffff81100000 T hrtimer_wakeup_x\n\
                    ffffffff81123450 t hrtimer_wakeup\n\
                    ffffffffc0001000 t hrtimer_wakeup\t[some_module]\n";
        assert_eq!(kallsyms_addr(syms, "hrtimer_wakeup"), 0xffff_ffff_8112_3450);
        assert_eq!(kallsyms_addr("0000000000000000 t hrtimer_wakeup\n", "hrtimer_wakeup"), 0, "kptr_restrict");
        assert_eq!(kallsyms_addr("", "hrtimer_wakeup"), 0);
    }

    fn sleeper(wake_ns: u64, prio: u32, asleep: bool) -> types::sleeper {
        types::sleeper {
            wake_ns,
            prio,
            state: if asleep {
                types::cosched_sleeper_state::COSCHED_SLEEPER_ASLEEP
            } else {
                types::cosched_sleeper_state::COSCHED_SLEEPER_ARMED
            },
            ..Default::default()
        }
    }

    #[test]
    fn the_earliest_asleep_timer_wins_over_periods() {
        let cpu = types::cpu_state { episode_start_ns: 1_000, period_ns: 500, episode_prio: 50, ..Default::default() };
        let s = [sleeper(3_000, 80, true), sleeper(1_200, 90, false), sleeper(2_000, 70, true), sleeper(900, 99, true)];
        // Armed (not asleep) and past timers do not count; the CPU's period is not used.
        assert_eq!(earliest(1_000, s, [cpu]), Some(Prediction { in_ns: 1_000, at_ns: 2_000, priority: 70 }));
        // No timer: the period of recurring RT needs (start of the last episode + period).
        assert_eq!(earliest(1_100, [], [cpu]), Some(Prediction { in_ns: 400, at_ns: 1_500, priority: 50 }));
        // A period already past, or needs of watched tasks only (priority 0), predict nothing.
        assert_eq!(earliest(1_600, [], [cpu]), None);
        let watched = types::cpu_state { episode_prio: 0, ..cpu };
        assert_eq!(earliest(1_100, [], [watched]), None);
    }
}
