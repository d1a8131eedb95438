//! The CPU detector: `src/bpf/cosched.bpf.c` on `sched_switch`, `sched_wakeup` and
//! `sched_wakeup_new`. It decides in the kernel, per CPU, and reports transitions through a ring
//! buffer. Every structure it shares with the BPF program is the one libbpf-cargo generates from
//! `src/bpf/intf.h` (the skeleton's `types` module): no layout or offset is copied here.

#[allow(clippy::all, clippy::undocumented_unsafe_blocks, non_camel_case_types, dead_code)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/cosched.skel.rs"));
}

use std::cell::RefCell;
use std::mem::size_of;
use std::os::fd::RawFd;
use std::rc::Rc;

use anyhow::{ensure, Context};
use cosched_proto::Resource;
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, RingBufferBuilder};

use crate::detector::{read_plain, Detector, DetectorKind, ObjectStorage, Plain, Transition};
use crate::{log, Options};
use skel::types::{self, cosched_reason};
use skel::{CoschedSkel, CoschedSkelBuilder, OpenCoschedSkel};

pub(crate) const KIND: DetectorKind = DetectorKind { resource: Resource::Cpu, probe, attach };

// SAFETY: generated from intf.h by libbpf-cargo as `#[repr(C)]` structs of integers, of the
// `#[repr(transparent)]` u32 newtype `cosched_reason`, and (`cpu_state.timer`) of a byte array;
// any bit pattern is a valid value.
unsafe impl Plain for types::cosched_event {}
// SAFETY: as above (u64 counters only).
unsafe impl Plain for types::cosched_stats {}
// SAFETY: as above (integers and the 16-byte array libbpf-cargo emits for the opaque bpf_timer).
unsafe impl Plain for types::cpu_state {}

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
);

fn reason_name(e: &types::cosched_event) -> &'static str {
    match e.reason {
        cosched_reason::COSCHED_REASON_RT => "rt task",
        cosched_reason::COSCHED_REASON_WATCHED => "watched task",
        cosched_reason::COSCHED_REASON_TIMER => "no-switch timer",
        _ if e.want != 0 => "?",
        _ => "hold elapsed at a switch",
    }
}

/// Opens the BPF object into `storage` and sets its knobs.
///
/// # Safety
///
/// The returned skeleton (and anything made from it) must be dropped before `storage`.
unsafe fn open_skel(storage: &ObjectStorage, opts: &Options) -> anyhow::Result<OpenCoschedSkel<'static>> {
    // SAFETY: called once for this storage; the caller drops the skeleton before `storage`.
    let object = unsafe { storage.object() };
    let mut open = CoschedSkelBuilder::default()
        .open(object)
        .context("opening the BPF object (needs a kernel with BTF: /sys/kernel/btf/vmlinux)")?;
    let ro = open.maps.rodata_data.as_deref_mut().context("BPF rodata missing")?;
    ro.min_boost_ns = opts.min_boost_us * 1_000;
    ro.hold_periodic_max_ns = opts.hold_periodic_max_us * 1_000;
    ro.idle_deboost_ns = opts.idle_deboost_ms * 1_000_000;
    ro.watch_count = opts.watch_count;
    ro.agent_tgid = std::process::id();
    Ok(open)
}

fn load(open: OpenCoschedSkel<'static>) -> anyhow::Result<CoschedSkel<'static>> {
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

fn probe(opts: &Options) -> anyhow::Result<()> {
    let storage = ObjectStorage::new();
    // SAFETY: the skeleton is a temporary of this statement, dropped before `storage`.
    load(unsafe { open_skel(&storage, opts) }?)?;
    Ok(())
}

fn attach(opts: &Options) -> anyhow::Result<Box<dyn Detector>> {
    let storage = ObjectStorage::new();
    // SAFETY: the skeleton is either dropped on an error below, before `storage`, or moved into
    // the `CpuDetector` together with `storage`, declared after it.
    let mut skel = load(unsafe { open_skel(&storage, opts) }?)?;
    skel.attach().context("attaching to sched_switch/sched_wakeup/sched_wakeup_new (tp_btf)")?;
    let events = Rc::new(RefCell::new(Vec::new()));
    let sink = events.clone();
    let mut rb = RingBufferBuilder::new();
    rb.add(&skel.maps.events, move |data: &[u8]| {
        match read_plain::<types::cosched_event>(data) {
            Some(e) => sink.borrow_mut().push(e),
            None => log(&format!("cpu: a {}-byte ring-buffer record is not a struct cosched_event", data.len())),
        }
        0
    })?;
    let ring = rb.build()?;
    let ncpus = libbpf_rs::num_possible_cpus().unwrap_or(1);
    Ok(Box::new(CpuDetector { ring, skel, events, ncpus, _storage: storage }))
}

/// The loaded and attached CPU detector. Fields drop in declaration order: the ring buffer (it
/// uses the map's fd), then the skeleton (it detaches, unloads, and drops the object in the
/// storage), then the storage.
struct CpuDetector {
    ring: libbpf_rs::RingBuffer<'static>,
    skel: CoschedSkel<'static>,
    events: Rc<RefCell<Vec<types::cosched_event>>>,
    ncpus: usize,
    _storage: ObjectStorage,
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
                    "cpu {} {} at {} µs: {} (pid {})",
                    e.cpu,
                    if e.want != 0 { "wants a boost" } else { "done" },
                    e.ts_ns / 1000,
                    reason_name(&e),
                    e.pid
                ));
            }
            into.push(Transition { unit: e.cpu as usize, want: e.want != 0 });
        }
    }

    /// Per-CPU `boosted` flags read from the BPF map.
    fn wants(&self) -> Vec<bool> {
        (0..self.ncpus as u32)
            .map(|cpu| {
                self.skel
                    .maps
                    .cpu_states
                    .lookup(&cpu.to_ne_bytes(), MapFlags::ANY)
                    .ok()
                    .flatten()
                    .and_then(|v| read_plain::<types::cpu_state>(&v))
                    .is_some_and(|st| st.boosted != 0)
            })
            .collect()
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
             events_dropped=5 watch_agent_returns=2"
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
        };
        // SAFETY: viewing a plain `repr(C)` value (no padding: 8 + 4 * 4 bytes) as its bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&e as *const types::cosched_event).cast::<u8>(),
                size_of::<types::cosched_event>(),
            )
        };
        let r = read_plain::<types::cosched_event>(bytes).expect("exact size");
        assert_eq!((r.ts_ns, r.cpu, r.want, r.pid), (42_000, 3, 1, 77));
        assert_eq!(reason_name(&r), "watched task");
        assert_eq!(size_of::<types::cosched_event>(), 24);
        // The timer is opaque but its room is there: 4 u64 + 6 u32 + 16.
        assert_eq!(size_of::<types::cpu_state>(), 72);
    }
}
