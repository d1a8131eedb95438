//! The I/O detector (the Virtual-BFQ paper, sec. VII.A): `src/bpf/io.bpf.c` reads the guest BFQ's
//! count of weight-raised busy queues (`bfqd->wr_busy_queues`) after each BFQ operation and
//! reports, per BFQ instance (a disk), when it goes above 0 (an application BFQ deems interactive,
//! e.g. one being started, waits for the disk: `IO 1`) and when it has stayed at 0 for
//! `--io-hold-ms` (`IO 0`). The units are the BFQ instances; the host is asked for help while any
//! of them wants it (the core ORs the units).
//!
//! At attach the agent makes BFQ the scheduler of the guest's virtio disks (`/sys/block/vd*`),
//! and puts back the scheduler each had when it detaches. The probe says why I/O is unsupported
//! when the guest has no virtio disk, no BFQ (the `bfq` module not loaded, not built in), no BTF
//! for it, or the program does not load; the CPU detector works on regardless.

#[allow(clippy::all, clippy::undocumented_unsafe_blocks, non_camel_case_types, dead_code)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/io.skel.rs"));
}

use std::cell::RefCell;
use std::fs;
use std::mem::size_of;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use anyhow::{bail, ensure, Context};
use cosched_proto::cpu::Need;
use cosched_proto::Resource;
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags};

use crate::detector::{event_ring, read_plain, Detector, DetectorKind, Loaded, ObjectStorage, Plain, Transition};
use crate::{log, Options};
use skel::types;
use skel::{IoSkel, IoSkelBuilder, OpenIoSkel};

pub(crate) const KIND: DetectorKind = DetectorKind { resource: Resource::Io, load: load_detector };

// SAFETY: generated from io_intf.h by libbpf-cargo as `#[repr(C)]` structs of integers, arrays
// of integers and (`cosched_io_state.timer`) the 16-byte array it emits for the opaque bpf_timer;
// any bit pattern is a valid value.
unsafe impl Plain for types::cosched_io_event {}
// SAFETY: as above (u64 counters only).
unsafe impl Plain for types::cosched_io_stats {}
// SAFETY: as above.
unsafe impl Plain for types::cosched_io_state {}

crate::stats_fields!(types::cosched_io_stats; samples, raises, lowers, holds, exits, events_dropped);

const SYS_BLOCK: &str = "/sys/block";
const BFQ_BTF: &str = "/sys/kernel/btf/bfq";
const BFQ: &str = "bfq";

// ---- the guest's disks and their schedulers (pure parts, unit-tested) ----------------------

/// A `/sys/block/<disk>/queue/scheduler` file: `mq-deadline [bfq] none`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SchedulerFile {
    /// Every scheduler the kernel has registered (a module's once it is loaded).
    pub available: Vec<String>,
    /// The one in brackets (`none` for a queue without a scheduler); `None` if no bracket.
    pub current: Option<String>,
}

pub(crate) fn parse_scheduler(text: &str) -> SchedulerFile {
    let mut available = Vec::new();
    let mut current = None;
    for word in text.split_whitespace() {
        let name = match word.strip_prefix('[').and_then(|w| w.strip_suffix(']')) {
            Some(inner) => {
                current = Some(inner.to_string());
                inner
            }
            None => word,
        };
        available.push(name.to_string());
    }
    SchedulerFile { available, current }
}

/// A virtio-blk disk's name: `vd` and letters (`vda`, `vdab`; partitions are not in /sys/block).
pub(crate) fn is_virtio_disk(name: &str) -> bool {
    name.strip_prefix("vd").is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_lowercase()))
}

/// The virtio disks among these `/sys/block` entries, in the kernel's order (vda, ..., vdz, vdaa).
pub(crate) fn choose_disks(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut disks: Vec<String> = names.into_iter().filter(|n| is_virtio_disk(n)).collect();
    disks.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
    disks
}

/// What to do with one disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// It runs BFQ already.
    Keep,
    /// Write `bfq`; it runs `from` now.
    Switch { from: String },
    /// It cannot run BFQ: why.
    Cannot(String),
}

pub(crate) fn plan(sched: &SchedulerFile) -> Plan {
    match &sched.current {
        Some(c) if c == BFQ => Plan::Keep,
        _ if !sched.available.iter().any(|s| s == BFQ) => Plan::Cannot(format!(
            "its scheduler file offers no bfq ({}): the bfq module is not loaded (modprobe bfq)",
            sched.available.join(" ")
        )),
        Some(c) => Plan::Switch { from: c.clone() },
        None => Plan::Cannot("its scheduler file names no current scheduler".into()),
    }
}

fn scheduler_path(sys_block: &Path, disk: &str) -> PathBuf {
    sys_block.join(disk).join("queue/scheduler")
}

fn read_scheduler(sys_block: &Path, disk: &str) -> anyhow::Result<SchedulerFile> {
    let path = scheduler_path(sys_block, disk);
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(parse_scheduler(&text))
}

/// The virtio disks of `sys_block` (a `/sys/block`).
fn virtio_disks(sys_block: &Path) -> anyhow::Result<Vec<String>> {
    let entries = fs::read_dir(sys_block).with_context(|| format!("reading {}", sys_block.display()))?;
    Ok(choose_disks(entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned())))
}

/// The disks switched to BFQ, with the scheduler each ran before; dropping it puts those back.
#[derive(Debug)]
pub(crate) struct BfqDisks {
    sys_block: PathBuf,
    /// Every disk running BFQ now (switched or not).
    pub on_bfq: Vec<String>,
    /// (disk, scheduler it ran before) for those switched here.
    pub switched: Vec<(String, String)>,
    /// (disk, why it does not run BFQ).
    pub failed: Vec<(String, String)>,
}

impl BfqDisks {
    /// Makes BFQ the scheduler of every virtio disk of `sys_block` that can run it, writing the
    /// scheduler file with `write` and reading it back to check. Fails if no disk runs BFQ.
    pub(crate) fn setup(
        sys_block: &Path,
        write: impl Fn(&Path, &str) -> std::io::Result<()>,
    ) -> anyhow::Result<BfqDisks> {
        let disks = virtio_disks(sys_block)?;
        if disks.is_empty() {
            bail!("the guest has no virtio disk ({}/vd*)", sys_block.display());
        }
        let mut out = BfqDisks {
            sys_block: sys_block.to_path_buf(),
            on_bfq: Vec::new(),
            switched: Vec::new(),
            failed: Vec::new(),
        };
        for disk in disks {
            match Self::setup_one(sys_block, &disk, &write) {
                Ok(None) => out.on_bfq.push(disk),
                Ok(Some(from)) => {
                    out.on_bfq.push(disk.clone());
                    out.switched.push((disk, from));
                }
                Err(e) => out.failed.push((disk, format!("{e:#}"))),
            }
        }
        if out.on_bfq.is_empty() {
            let why: Vec<String> = out.failed.iter().map(|(d, e)| format!("{d}: {e}")).collect();
            // Nothing was switched: nothing to put back.
            bail!("no virtio disk can run BFQ ({})", why.join("; "));
        }
        Ok(out)
    }

    /// `Some(previous scheduler)` if it switched the disk.
    fn setup_one(
        sys_block: &Path,
        disk: &str,
        write: &impl Fn(&Path, &str) -> std::io::Result<()>,
    ) -> anyhow::Result<Option<String>> {
        let from = match plan(&read_scheduler(sys_block, disk)?) {
            Plan::Keep => return Ok(None),
            Plan::Cannot(why) => bail!("{why}"),
            Plan::Switch { from } => from,
        };
        let path = scheduler_path(sys_block, disk);
        write(&path, BFQ).with_context(|| format!("writing {BFQ} to {}", path.display()))?;
        let now = read_scheduler(sys_block, disk)?;
        ensure!(
            now.current.as_deref() == Some(BFQ),
            "wrote {BFQ} to {} but it runs {}",
            path.display(),
            now.current.as_deref().unwrap_or("?")
        );
        Ok(Some(from))
    }

    fn describe(&self) -> String {
        let mut s = self.on_bfq.join(", ");
        if !self.switched.is_empty() {
            let sw: Vec<String> = self.switched.iter().map(|(d, f)| format!("{d} from {f}")).collect();
            s += &format!("; switched {}", sw.join(", "));
        }
        s
    }
}

impl Drop for BfqDisks {
    fn drop(&mut self) {
        for (disk, from) in self.switched.drain(..) {
            let path = scheduler_path(&self.sys_block, &disk);
            if let Err(e) = fs::write(&path, &from) {
                log(&format!("io: could not put {from} back as the scheduler of {disk}: {e}"));
            }
        }
    }
}

fn write_sysfs(path: &Path, value: &str) -> std::io::Result<()> {
    fs::write(path, value)
}

/// Is BFQ there, with BTF? `Err` says why not.
fn check_bfq(sys_block: &Path, btf: &Path) -> anyhow::Result<Vec<String>> {
    let disks = virtio_disks(sys_block)?;
    if disks.is_empty() {
        bail!("the guest has no virtio disk ({}/vd*)", sys_block.display());
    }
    let scheds: Vec<(String, anyhow::Result<SchedulerFile>)> =
        disks.iter().map(|d| (d.clone(), read_scheduler(sys_block, d))).collect();
    let listed = scheds.iter().any(|(_, s)| s.as_ref().is_ok_and(|s| s.available.iter().any(|a| a == BFQ)));
    if !listed {
        bail!(
            "BFQ is not available: no virtio disk offers bfq in {}/vd*/queue/scheduler (load it: modprobe bfq)",
            sys_block.display()
        );
    }
    if !btf.exists() && Path::new("/sys/module/bfq/initstate").exists() {
        // A loaded module (built-in ones have no initstate) without its BTF.
        bail!("the bfq module has no BTF ({} missing: a kernel without CONFIG_DEBUG_INFO_BTF_MODULES)", btf.display());
    }
    Ok(disks)
}

// ---- the BPF side ----------------------------------------------------------------------------

/// Opens the BPF object into `storage` and sets its knob.
///
/// # Safety
///
/// The returned skeleton (and anything made from it) must be dropped before `storage`.
unsafe fn open_skel(storage: &ObjectStorage, opts: &Options) -> anyhow::Result<OpenIoSkel<'static>> {
    // SAFETY: called once for this storage; the caller drops the skeleton before `storage`.
    let object = unsafe { storage.lend() };
    let mut open = IoSkelBuilder::default().open(object).context("opening the BPF object of the I/O detector")?;
    let ro = open.maps.rodata_data.as_deref_mut().context("BPF rodata missing")?;
    ro.io_hold_ns = opts.io_hold_ms * 1_000_000;
    Ok(open)
}

fn load(open: OpenIoSkel<'static>) -> anyhow::Result<IoSkel<'static>> {
    let skel =
        open.load().context("loading the I/O detector (BFQ's BTF: /sys/kernel/btf/bfq; bpf_timer: Linux >= 5.15)")?;
    for (map, size) in [
        (&skel.maps.io_states as &dyn MapCore, size_of::<types::cosched_io_state>()),
        (&skel.maps.io_stats, size_of::<types::cosched_io_stats>()),
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

/// The I/O detector loaded, not attached. Fields drop in declaration order: the skeleton (it
/// unloads, and drops the object in the storage), then the storage.
struct LoadedIo {
    skel: IoSkel<'static>,
    storage: ObjectStorage,
    hold_ms: u64,
}

fn load_detector(opts: &Options) -> anyhow::Result<Box<dyn Loaded>> {
    check_bfq(Path::new(SYS_BLOCK), Path::new(BFQ_BTF))?;
    let storage = ObjectStorage::new();
    // SAFETY: the skeleton is either dropped on an error below, before `storage`, or moved into
    // a `LoadedIo` together with `storage`, declared after it.
    let skel = load(unsafe { open_skel(&storage, opts) }?)?;
    Ok(Box::new(LoadedIo { skel, storage, hold_ms: opts.io_hold_ms }))
}

impl Loaded for LoadedIo {
    fn attach(self: Box<Self>) -> anyhow::Result<Box<dyn Detector>> {
        // On an error below `me` drops whole: the skeleton, then the storage.
        let mut me = *self;
        me.skel.attach().context("attaching to BFQ (fexit on bfq_insert_requests, bfq_dispatch_request, ...)")?;
        let disks = BfqDisks::setup(Path::new(SYS_BLOCK), write_sysfs)?;
        for (disk, why) in &disks.failed {
            log(&format!("io: {disk} stays off BFQ, its I/O is not watched: {why}"));
        }
        let (ring, events) =
            event_ring::<types::cosched_io_event>(&me.skel.maps.io_events, "io", "struct cosched_io_event")?;
        let LoadedIo { skel, storage, hold_ms } = me;
        Ok(Box::new(IoDetector {
            ring,
            skel,
            events,
            units: RefCell::new(Vec::new()),
            hold_ms,
            _storage: storage,
            disks,
        }))
    }
}

/// A C `char` array as text, up to its NUL.
fn c_name(bytes: &[i8]) -> String {
    let b: Vec<u8> = bytes.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
    String::from_utf8_lossy(&b).into_owned()
}

/// The units (BFQ instances) in the order first seen, by their `struct bfq_data` address.
fn unit_of(units: &mut Vec<u64>, key: u64) -> usize {
    match units.iter().position(|k| *k == key) {
        Some(i) => i,
        None => {
            units.push(key);
            units.len() - 1
        }
    }
}

/// The loaded and attached I/O detector. Fields drop in declaration order: the ring buffer (it
/// uses the map's fd), the skeleton (it detaches, unloads, and drops the object in the storage),
/// the storage, then the disks (their schedulers are put back).
struct IoDetector {
    ring: libbpf_rs::RingBuffer<'static>,
    skel: IoSkel<'static>,
    events: Rc<RefCell<Vec<types::cosched_io_event>>>,
    units: RefCell<Vec<u64>>,
    hold_ms: u64,
    _storage: ObjectStorage,
    disks: BfqDisks,
}

impl Detector for IoDetector {
    fn resource(&self) -> Resource {
        Resource::Io
    }

    fn units(&self) -> String {
        format!("BFQ on {}", self.disks.describe())
    }

    fn poll_fd(&self) -> RawFd {
        self.ring.epoll_fd()
    }

    fn drain(&mut self, verbose: bool, into: &mut Vec<Transition>) {
        let _ = self.ring.consume();
        for e in self.events.borrow_mut().drain(..) {
            let unit = unit_of(&mut self.units.borrow_mut(), e.bfqd);
            if verbose {
                log(&format!(
                    "io {} {} at {} µs: {}",
                    c_name(&e.disk),
                    if e.want != 0 { "wants a boost" } else { "done" },
                    e.ts_ns / 1000,
                    if e.want != 0 {
                        format!("{} weight-raised busy queue(s)", e.wr_busy_queues)
                    } else {
                        format!("no weight-raised busy queue for {} ms", self.hold_ms)
                    }
                ));
            }
            into.push(Transition { unit, want: (e.want != 0).then_some(Need::default()) });
        }
    }

    /// Per-instance `raised` flags read from the BPF map (an instance gone from the map wants
    /// nothing).
    fn wants(&self) -> Vec<Option<Need>> {
        let map = &self.skel.maps.io_states;
        let mut units = self.units.borrow_mut();
        let mut raised = Vec::new();
        for key in map.keys() {
            let Ok(k) = <[u8; 8]>::try_from(key.as_slice()) else { continue };
            let Some(st) =
                map.lookup(&k, MapFlags::ANY).ok().flatten().and_then(|v| read_plain::<types::cosched_io_state>(&v))
            else {
                continue;
            };
            raised.push((unit_of(&mut units, u64::from_ne_bytes(k)), st.raised != 0));
        }
        let mut wants = vec![false; units.len()];
        for (unit, r) in raised {
            wants[unit] = r;
        }
        wants.into_iter().map(|r| r.then_some(Need::default())).collect()
    }

    /// The detector's counters summed over CPUs.
    fn stats(&self) -> String {
        let per_cpu = match self.skel.maps.io_stats.lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY) {
            Ok(Some(per_cpu)) => per_cpu,
            _ => Vec::new(),
        };
        format_stats(&sum_stats(per_cpu.iter().filter_map(|v| read_plain::<types::cosched_io_stats>(v))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_scheduler_files() {
        assert_eq!(
            parse_scheduler("[mq-deadline] bfq none\n"),
            SchedulerFile {
                available: vec!["mq-deadline".into(), "bfq".into(), "none".into()],
                current: Some("mq-deadline".into())
            }
        );
        assert_eq!(parse_scheduler("mq-deadline kyber [bfq] none").current.as_deref(), Some("bfq"));
        let none = parse_scheduler("[none] mq-deadline\n");
        assert_eq!(none.current.as_deref(), Some("none"));
        assert_eq!(parse_scheduler("none\n").current, None);
        assert_eq!(parse_scheduler(""), SchedulerFile { available: vec![], current: None });
    }

    #[test]
    fn plans_each_disk() {
        assert_eq!(plan(&parse_scheduler("mq-deadline [bfq] none")), Plan::Keep);
        assert_eq!(plan(&parse_scheduler("[mq-deadline] bfq none")), Plan::Switch { from: "mq-deadline".into() });
        assert_eq!(plan(&parse_scheduler("mq-deadline bfq [none]")), Plan::Switch { from: "none".into() });
        // BFQ not loaded: says so, with the fix.
        match plan(&parse_scheduler("[mq-deadline] kyber none")) {
            Plan::Cannot(why) => {
                assert!(why.contains("modprobe bfq") && why.contains("mq-deadline kyber none"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(plan(&parse_scheduler("mq-deadline bfq none")), Plan::Cannot(_)));
    }

    #[test]
    fn chooses_the_virtio_disks() {
        let names = ["sda", "vdb", "loop0", "vda", "vdaa", "nvme0n1", "vd", "vd1", "vdz", "sr0"];
        assert_eq!(choose_disks(names.iter().map(|s| s.to_string())), vec!["vda", "vdb", "vdz", "vdaa"]);
        assert!(choose_disks(["sda".to_string(), "loop0".to_string()]).is_empty());
    }

    fn fake_sys(disks: &[(&str, &str)]) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "cosched-io-test-{}-{}",
            std::process::id(),
            disks.iter().map(|(n, _)| *n).collect::<Vec<_>>().join("-")
        ));
        let _ = fs::remove_dir_all(&d);
        for (name, sched) in disks {
            fs::create_dir_all(d.join(name).join("queue")).unwrap();
            fs::write(d.join(name).join("queue/scheduler"), sched).unwrap();
        }
        d
    }

    /// Writes to a fake scheduler file the way the kernel shows the result.
    fn fake_write(path: &Path, value: &str) -> std::io::Result<()> {
        let text = fs::read_to_string(path)?;
        let f = parse_scheduler(&text);
        if !f.available.iter().any(|a| a == value) {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let shown: Vec<String> =
            f.available.iter().map(|a| if a == value { format!("[{a}]") } else { a.clone() }).collect();
        fs::write(path, shown.join(" ") + "\n")
    }

    #[test]
    fn switches_the_virtio_disks_to_bfq_and_puts_them_back() {
        let sys = fake_sys(&[
            ("vda", "[mq-deadline] bfq none\n"),
            ("vdb", "mq-deadline [bfq] none\n"),
            ("sda", "[mq-deadline] bfq none\n"),
        ]);
        let disks = BfqDisks::setup(&sys, fake_write).unwrap();
        assert_eq!(disks.on_bfq, vec!["vda", "vdb"]);
        assert_eq!(disks.switched, vec![("vda".to_string(), "mq-deadline".to_string())]);
        assert!(disks.failed.is_empty());
        assert_eq!(disks.describe(), "vda, vdb; switched vda from mq-deadline");
        assert_eq!(fs::read_to_string(sys.join("vda/queue/scheduler")).unwrap(), "mq-deadline [bfq] none\n");
        assert_eq!(fs::read_to_string(sys.join("sda/queue/scheduler")).unwrap(), "[mq-deadline] bfq none\n");
        drop(disks);
        // The real kernel shows "[mq-deadline] bfq none" again; the fake file keeps what was written.
        assert_eq!(fs::read_to_string(sys.join("vda/queue/scheduler")).unwrap(), "mq-deadline");
        fs::remove_dir_all(&sys).unwrap();
    }

    #[test]
    fn says_why_no_disk_can_run_bfq() {
        // No BFQ registered (module not loaded): unsupported, with the reason per disk.
        let sys = fake_sys(&[("vda", "[mq-deadline] kyber none\n"), ("sdb", "[mq-deadline] bfq none\n")]);
        let err = BfqDisks::setup(&sys, fake_write).unwrap_err().to_string();
        assert!(
            err.contains("no virtio disk can run BFQ") && err.contains("vda:") && err.contains("modprobe bfq"),
            "{err}"
        );
        let err = check_bfq(&sys, &sys.join("no-btf")).unwrap_err().to_string();
        assert!(err.contains("BFQ is not available") && err.contains("modprobe bfq"), "{err}");
        fs::remove_dir_all(&sys).unwrap();
        // No virtio disk at all.
        let sys = fake_sys(&[("sda", "[mq-deadline] bfq none\n")]);
        let err = BfqDisks::setup(&sys, fake_write).unwrap_err().to_string();
        assert!(err.contains("no virtio disk"), "{err}");
        assert!(check_bfq(&sys, &sys.join("no-btf")).unwrap_err().to_string().contains("no virtio disk"));
        fs::remove_dir_all(&sys).unwrap();
        // A write the kernel refuses, or that does not take: that disk is left out, the others run BFQ.
        let sys = fake_sys(&[("vda", "[mq-deadline] bfq none\n"), ("vdb", "[none] bfq\n")]);
        let refuse_vdb = |p: &Path, v: &str| {
            if p.to_string_lossy().contains("/vdb/") {
                Err(std::io::Error::from_raw_os_error(libc::EBUSY))
            } else {
                fake_write(p, v)
            }
        };
        let disks = BfqDisks::setup(&sys, refuse_vdb).unwrap();
        assert_eq!(disks.on_bfq, vec!["vda"]);
        assert_eq!(disks.failed.len(), 1);
        assert!(disks.failed[0].1.contains("writing bfq"), "{:?}", disks.failed);
        drop(disks);
        fs::write(sys.join("vda/queue/scheduler"), "[mq-deadline] bfq none\n").unwrap();
        let ignore = |_: &Path, _: &str| Ok(());
        let err = BfqDisks::setup(&sys, ignore).unwrap_err().to_string();
        assert!(err.contains("wrote bfq to") && err.contains("but it runs mq-deadline"), "{err}");
        assert!(check_bfq(&sys, &sys.join("no-btf")).is_ok());
        fs::remove_dir_all(&sys).unwrap();
    }

    #[test]
    fn units_are_numbered_in_the_order_first_seen() {
        let mut units = Vec::new();
        assert_eq!(unit_of(&mut units, 0xffff_8880_0000_1000), 0);
        assert_eq!(unit_of(&mut units, 0xffff_8880_0000_2000), 1);
        assert_eq!(unit_of(&mut units, 0xffff_8880_0000_1000), 0);
        assert_eq!(units.len(), 2);
    }

    #[test]
    fn stats_and_events_use_the_generated_types() {
        let a = types::cosched_io_stats { samples: 3, raises: 1, ..Default::default() };
        let b = types::cosched_io_stats { samples: 4, events_dropped: 2, ..Default::default() };
        assert_eq!(format_stats(&sum_stats([a, b])), "samples=7 raises=1 lowers=0 holds=0 exits=0 events_dropped=2");
        let mut disk = [0i8; 32];
        for (i, c) in b"vdb".iter().enumerate() {
            disk[i] = *c as i8;
        }
        let e = types::cosched_io_event { ts_ns: 5_000, bfqd: 0xffff_8880_0000_1000, want: 1, wr_busy_queues: 2, disk };
        // SAFETY: viewing a plain `repr(C)` value (no padding: 8 + 8 + 4 + 4 + 32 bytes) as its bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&e as *const types::cosched_io_event).cast::<u8>(),
                size_of::<types::cosched_io_event>(),
            )
        };
        let r = read_plain::<types::cosched_io_event>(bytes).expect("exact size");
        assert_eq!((r.bfqd, r.want, r.wr_busy_queues), (0xffff_8880_0000_1000, 1, 2));
        assert_eq!(c_name(&r.disk), "vdb");
        assert_eq!(size_of::<types::cosched_io_event>(), 56);
        // 8 + 4 * 4 + 32 + 16 (the opaque timer).
        assert_eq!(size_of::<types::cosched_io_state>(), 72);
    }
}
