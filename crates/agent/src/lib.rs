//! The cosched guest agent (`cosched guest`).
//!
//! It opens the virtio-serial port `org.cosched.0`, registers with the host, and loads the BPF
//! detectors (`src/bpf/cosched.bpf.c`, on `sched_switch`, `sched_wakeup`, `sched_wakeup_new`).
//! The detectors decide in the kernel; the agent wakes only when a CPU's need changes and sends
//! the host the VM's transitions (`CPU 1` / `CPU 0`). If the host denies registration or the
//! operator disables coordination, the detectors are detached and the agent waits for `ENABLE`.

pub mod core;

#[allow(clippy::all, clippy::undocumented_unsafe_blocks, non_camel_case_types, dead_code)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/cosched.skel.rs"));
}

use std::cell::RefCell;
use std::fs;
use std::io::{self, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use cosched_proto::{Event, StreamDecoder};
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{MapCore, MapFlags, RingBufferBuilder};

use crate::core::{AgentCore, Config, Out, Phase};
use skel::{CoschedSkel, CoschedSkelBuilder};

/// The port name the host side is configured with (`virtserialport,name=org.cosched.0`).
pub const PORT_NAME: &str = "org.cosched.0";

#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// The virtio-serial port to the host [default: the port named org.cosched.0, found in
    /// /sys/class/virtio-ports/*/name]
    #[arg(long)]
    pub port: Option<PathBuf>,
    /// MIN_BOOST_TIME: a boost lasts at least this long after the last task that needed it
    /// (seed 000 sec. VIII uses 500 µs)
    #[arg(long, default_value_t = 500)]
    pub min_boost_us: u64,
    /// When needs recur with a period below this, hold the boost for 2 periods + MIN_BOOST_TIME
    /// instead of MIN_BOOST_TIME, so a periodic RT task keeps its VM boosted between activations,
    /// even past one late activation (0 = off: the paper's behaviour). The default covers the
    /// common 1 to 20 ms control periods with room for jitter: a bound equal to a task's period
    /// would flip between holding and not holding from one activation to the next
    #[arg(long, default_value_t = 25_000)]
    pub hold_periodic_max_us: u64,
    /// Deboost a CPU that runs a task needing no boost for this long without a context switch
    /// (a lone CPU hog); must be well above MIN_BOOST_TIME
    #[arg(long, default_value_t = 20)]
    pub idle_deboost_ms: u64,
    /// A new task gets this many boosted switch-ins (plus one per wake-up from sleep); 0 turns
    /// the new-task heuristic off
    #[arg(long, default_value_t = 8)]
    pub watch_count: u32,
    /// After the host ends a boost for budget reasons, wait this long before asking again
    #[arg(long, default_value_t = 100)]
    pub budget_backoff_ms: u64,
    /// Run the agent itself at SCHED_FIFO with this priority (0: leave it at SCHED_OTHER)
    #[arg(long, default_value_t = 0)]
    pub rt_priority: u32,
    /// Print the detectors' counters every N seconds (and at exit)
    #[arg(long)]
    pub stats_interval_s: Option<u64>,
    /// Log every transition sent
    #[arg(short, long)]
    pub verbose: bool,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn install_signal_handlers() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: installing an async-signal-safe handler (it only stores to an atomic); no
        // SA_RESTART so that poll() returns EINTR and the loop sees STOP.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Finds the port named `name` the way udev would: `/sys/class/virtio-ports/*/name`.
pub fn find_port(sys_root: &Path, dev_root: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let by_name = dev_root.join("virtio-ports").join(name);
    if by_name.exists() {
        return Ok(by_name);
    }
    let class = sys_root.join("class/virtio-ports");
    let entries = fs::read_dir(&class).with_context(|| {
        format!("no virtio-serial ports ({} unreadable): is the virtio_console module loaded?", class.display())
    })?;
    let mut seen = Vec::new();
    for e in entries.flatten() {
        let port = e.file_name();
        let pname = fs::read_to_string(e.path().join("name")).unwrap_or_default();
        if pname.trim() == name {
            return Ok(dev_root.join(&port));
        }
        seen.push(format!("{} ({})", port.to_string_lossy(), pname.trim()));
    }
    bail!(
        "no virtio-serial port named {name} (ports: {}); start QEMU with \
         -device virtserialport,chardev=...,name={name}",
        if seen.is_empty() { "none".into() } else { seen.join(", ") }
    )
}

/// The loaded and attached detectors.
struct Detectors {
    /// Declared before `skel`: fields drop in order, and the ring buffer uses the map's fd.
    ring: libbpf_rs::RingBuffer<'static>,
    skel: CoschedSkel<'static>,
    events: Rc<RefCell<Vec<Transition>>>,
    ncpus: usize,
}

/// One `struct cosched_event` from the ring buffer.
#[derive(Debug, Clone, Copy)]
struct Transition {
    ts_ns: u64,
    cpu: usize,
    want: bool,
    reason: u32,
    pid: u32,
}

impl Transition {
    fn parse(data: &[u8]) -> Option<Transition> {
        let u32_at = |o: usize| Some(u32::from_ne_bytes(data.get(o..o + 4)?.try_into().ok()?));
        Some(Transition {
            ts_ns: u64::from_ne_bytes(data.get(0..8)?.try_into().ok()?),
            cpu: u32_at(8)? as usize,
            want: u32_at(12)? != 0,
            reason: u32_at(16)?,
            pid: u32_at(20)?,
        })
    }

    fn reason_name(&self) -> &'static str {
        match self.reason {
            1 => "rt task",
            2 => "watched task",
            3 => "no-switch timer",
            _ if self.want => "?",
            _ => "hold elapsed at a switch",
        }
    }
}

/// Byte offset of `boosted` in `struct cpu_state` (4 u64 fields before it).
const CPU_STATE_BOOSTED_OFFSET: usize = 32;

impl Detectors {
    fn load(opts: &Options) -> anyhow::Result<Detectors> {
        // The skeleton borrows its object storage for its whole life. Detectors are loaded once
        // per registration (a handful of times in an agent's life), so the few bytes leaked each
        // time are the simplest correct owner.
        let storage: &'static mut MaybeUninit<libbpf_rs::OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open = CoschedSkelBuilder::default()
            .open(storage)
            .context("opening the BPF object (needs a kernel with BTF: /sys/kernel/btf/vmlinux)")?;
        let ro = open.maps.rodata_data.as_deref_mut().context("BPF rodata missing")?;
        ro.min_boost_ns = opts.min_boost_us * 1_000;
        ro.hold_periodic_max_ns = opts.hold_periodic_max_us * 1_000;
        ro.idle_deboost_ns = opts.idle_deboost_ms * 1_000_000;
        ro.watch_count = opts.watch_count;
        ro.agent_tgid = std::process::id();
        let mut skel = open.load().context("loading the BPF detectors (root, BTF, bpf_timer: Linux >= 5.15)")?;
        skel.attach().context("attaching to sched_switch/sched_wakeup/sched_wakeup_new (tp_btf)")?;
        let events = Rc::new(RefCell::new(Vec::new()));
        let sink = events.clone();
        let mut rb = RingBufferBuilder::new();
        rb.add(&skel.maps.events, move |data: &[u8]| {
            if let Some(t) = Transition::parse(data) {
                sink.borrow_mut().push(t);
            }
            0
        })?;
        let ring = rb.build()?;
        let ncpus = libbpf_rs::num_possible_cpus().unwrap_or(1);
        Ok(Detectors { ring, skel, events, ncpus })
    }

    /// Per-CPU `boosted` flags read from the BPF map (the ground truth).
    fn wants(&self) -> Vec<bool> {
        (0..self.ncpus as u32)
            .map(|cpu| {
                self.skel
                    .maps
                    .cpu_states
                    .lookup(&cpu.to_ne_bytes(), MapFlags::ANY)
                    .ok()
                    .flatten()
                    .and_then(|v| v.get(CPU_STATE_BOOSTED_OFFSET..CPU_STATE_BOOSTED_OFFSET + 4).map(|b| b != [0; 4]))
                    .unwrap_or(false)
            })
            .collect()
    }

    /// The detectors' counters summed over CPUs, as `name value` pairs.
    fn stats(&self) -> Vec<(&'static str, u64)> {
        const NAMES: [&str; 9] = [
            "switches",
            "need_rt",
            "need_watched",
            "boosts",
            "deboosts",
            "timer_deboosts",
            "watch_added",
            "events_dropped",
            "watch_agent_returns",
        ];
        let mut sums = [0u64; NAMES.len()];
        if let Ok(Some(per_cpu)) = self.skel.maps.stats.lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY) {
            for v in per_cpu {
                for (i, s) in sums.iter_mut().enumerate() {
                    if let Some(b) = v.get(i * 8..i * 8 + 8) {
                        *s += u64::from_ne_bytes(b.try_into().unwrap());
                    }
                }
            }
        }
        NAMES.into_iter().zip(sums).collect()
    }
}

fn log(msg: &str) {
    eprintln!("cosched-guest: {msg}");
}

fn set_rt_priority(prio: u32) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: prio as i32 };
    // SAFETY: sched_setscheduler on ourselves with a valid param.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs the agent until SIGTERM/SIGINT (then deregisters) or until the host refuses CPU
/// coordination for good.
pub fn run(opts: Options) -> anyhow::Result<()> {
    if opts.min_boost_us == 0 || opts.idle_deboost_ms * 1000 <= opts.min_boost_us {
        bail!("--idle-deboost-ms must be well above --min-boost-us (and both > 0)");
    }
    install_signal_handlers();
    if opts.rt_priority > 0 {
        set_rt_priority(opts.rt_priority).context("--rt-priority")?;
    }
    let path = match &opts.port {
        Some(p) => p.clone(),
        None => find_port(Path::new("/sys"), Path::new("/dev"), PORT_NAME)?,
    };
    let mut port = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    log(&format!("using {}", path.display()));

    let start = Instant::now();
    let now = || start.elapsed().as_nanos() as u64;
    let mut core =
        AgentCore::new(Config { budget_backoff_ns: opts.budget_backoff_ms * 1_000_000, ..Config::default() });
    let mut decoder = StreamDecoder::new();
    let mut detectors: Option<Detectors> = None;
    let mut connected = true;
    let mut next_stats = opts.stats_interval_s.map(|s| Duration::from_secs(s.max(1)));
    let mut stats_due = next_stats.map(|d| start + d);
    let mut next_reconcile = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 256];

    while !STOP.load(Ordering::Relaxed) {
        // Carry out what the core asked for.
        for o in out.drain(..) {
            match o {
                Out::Send(f) => {
                    if opts.verbose {
                        log(&format!("-> {f}"));
                    }
                    if let Err(e) = port.write_all(&f.encode()) {
                        if opts.verbose || connected {
                            log(&format!("host not reachable ({e}); will retry"));
                        }
                        connected = false;
                    }
                }
                Out::Attach => match Detectors::load(&opts) {
                    Ok(d) => {
                        log(&format!("detectors attached ({} CPUs)", d.ncpus));
                        detectors = Some(d);
                    }
                    Err(e) => {
                        // Tell the host we stop; it deboosts us.
                        let _ = port.write_all(&cosched_proto::Frame::deregister(0).encode());
                        return Err(e);
                    }
                },
                Out::Detach => {
                    if let Some(d) = detectors.take() {
                        print_stats(&d);
                    }
                    log("detectors detached");
                }
                Out::Exit(msg) => bail!("{msg}"),
                Out::Log(msg) => log(&msg),
            }
        }

        // Wait for the port, the detectors or the next deadline.
        let t = now();
        let mut timeout = Duration::from_millis(if connected { 100 } else { 500 });
        if let Some(n) = core.next_tick(t) {
            if connected {
                timeout = timeout.min(Duration::from_nanos(n.saturating_sub(t)));
            }
        }
        let mut fds = vec![libc::pollfd { fd: port.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        if let Some(d) = &detectors {
            fds.push(libc::pollfd { fd: d.ring.epoll_fd(), events: libc::POLLIN, revents: 0 });
        }
        if !connected {
            fds[0].events = 0; // a disconnected port reports POLLHUP without end: just wait
        }
        // SAFETY: `fds` is a valid array of pollfd of the given length.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout.as_millis() as i32) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("poll");
        }
        let t = now();

        if connected && fds[0].revents & libc::POLLIN != 0 {
            match port.read(&mut buf) {
                Ok(0) => {}
                Ok(n) => {
                    decoder.push(&buf[..n]);
                    while let Some(ev) = decoder.next_event() {
                        match ev {
                            Event::Frame(f) => {
                                if opts.verbose {
                                    log(&format!("<- {f}"));
                                }
                                core.on_frame(f, t, &mut out);
                            }
                            other => log(&format!("unexpected bytes from the host: {other:?}")),
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => log(&format!("reading the port: {e}")),
            }
        }
        if connected && fds[0].revents & libc::POLLHUP != 0 && fds[0].revents & libc::POLLIN == 0 {
            log("the host closed the channel; waiting for it to come back");
            connected = false;
            core.on_disconnected(&mut out);
            continue;
        }
        if !connected {
            // Probe: once the host is back the port stops reporting POLLHUP.
            let mut p = libc::pollfd { fd: port.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut p, 1, 0) };
            if p.revents & libc::POLLHUP == 0 && p.revents & libc::POLLOUT != 0 {
                log("the host channel is back");
                connected = true;
                core.on_disconnected(&mut out);
            }
            continue;
        }

        if let Some(d) = &detectors {
            let _ = d.ring.consume();
            let events: Vec<Transition> = d.events.borrow_mut().drain(..).collect();
            for e in events {
                if opts.verbose {
                    log(&format!(
                        "cpu {} {} at {} µs: {} (pid {})",
                        e.cpu,
                        if e.want { "wants a boost" } else { "done" },
                        e.ts_ns / 1000,
                        e.reason_name(),
                        e.pid
                    ));
                }
                core.on_transition(e.cpu, e.want, t, &mut out);
            }
            // Events can be lost when the ring is full; the map is the truth.
            if Instant::now() >= next_reconcile {
                next_reconcile = Instant::now() + Duration::from_millis(100);
                core.reconcile(&d.wants(), t, &mut out);
            }
            if let (Some(due), Some(every)) = (stats_due, next_stats.as_mut()) {
                if Instant::now() >= due {
                    print_stats(d);
                    stats_due = Some(due + *every);
                }
            }
        }
        core.tick(t, &mut out);
    }

    log("stopping: deregistering");
    if core.phase == Phase::Active {
        let _ = port.write_all(&cosched_proto::Frame::deregister(0).encode());
    }
    if let Some(d) = detectors.take() {
        print_stats(&d);
    }
    let c = &core.counters;
    log(&format!(
        "sent {} boost(s), {} deboost(s); {} budget denial(s)",
        c.boosts_sent, c.deboosts_sent, c.budget_denials
    ));
    Ok(())
}

fn print_stats(d: &Detectors) {
    let s: Vec<String> = d.stats().into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    log(&format!("detector stats: {}", s.join(" ")));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_port_by_name_in_sysfs() {
        let d = tempfile_dir();
        let sys = d.join("sys");
        let dev = d.join("dev");
        for (port, name) in [("vport0p1", "org.qemu.guest_agent.0"), ("vport1p1", PORT_NAME)] {
            fs::create_dir_all(sys.join("class/virtio-ports").join(port)).unwrap();
            fs::write(sys.join("class/virtio-ports").join(port).join("name"), format!("{name}\n")).unwrap();
        }
        assert_eq!(find_port(&sys, &dev, PORT_NAME).unwrap(), dev.join("vport1p1"));
        let err = find_port(&sys, &dev, "org.other").unwrap_err().to_string();
        assert!(err.contains("vport0p1 (org.qemu.guest_agent.0)"), "{err}");
        fs::create_dir_all(dev.join("virtio-ports")).unwrap();
        fs::write(dev.join("virtio-ports").join(PORT_NAME), b"").unwrap();
        assert_eq!(find_port(&sys, &dev, PORT_NAME).unwrap(), dev.join("virtio-ports").join(PORT_NAME));
        fs::remove_dir_all(&d).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("cosched-agent-test-{}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        d
    }
}
