//! The host daemon: one thread and one event loop (`epoll` through mio).
//!
//! The loop owns the coordinator and hands work between parts that each keep their own state:
//! - [`channels`]: the socket directory and the VMs' channels; gives the loop sockets whose
//!   QEMU is known and the frames read, and writes the replies the loop queues;
//! - [`discovery`]: QEMU processes without a channel and the VMs' thread events;
//! - [`vms`]: the VM entries, each with its threads and one actuator per resource
//!   ([`crate::actuator`]); the loop hands them the coordinator's `Apply` actions;
//! - [`clients`]: control and metrics clients; the loop answers their requests from a status
//!   snapshot ([`status`]) or by running the operator's command.

mod channels;
mod clients;
mod discovery;
mod events;
mod membw;
mod os;
mod statics;
mod status;
mod timer;
mod vms;

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use cosched_core::{Action, Coordinator, Level, VmId, NS_PER_MS};
use cosched_hostbpf::feas::FeasMsg;
use cosched_hostbpf::ThreadEvent;
use cosched_procfs::{ProcFs, TaskId};
use cosched_proto::{Event, Resource};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

pub use os::lock_state_dir;

use self::channels::{Channels, Opened, Read};
use self::clients::{Answer, Ask, Clients, FIRST_CLIENT};
use self::discovery::Discovery;
use self::events::EventBoost;
use self::vms::{VmEntry, Vms};
use crate::actuator::{
    actuator_priority, weight_hierarchy, Actuator, CpuActuator, Host, IoLever, KnobActuator, Outcome, RealSched,
    WeightHierarchy,
};
use crate::config::HostConfig;
use crate::control::{Reply, Request};
use crate::error::Error;
use crate::metrics::Latency;
use crate::sched::{SchedAttr, SCHED_FIFO, SCHED_FLAG_RESET_ON_FORK};
use crate::store::{restore_all, StateDir, ThreadOps};

const INOTIFY: Token = Token(0);
const SIGNALS: Token = Token(1);
const CONTROL: Token = Token(2);
const METRICS: Token = Token(3);
const THREADS: Token = Token(4);
const FEAS: Token = Token(5);
const TIMER: Token = Token(6);
/// Reads of 4 KiB from one VM per wake-up: a guest that floods its channel cannot keep the
/// loop from enforcing budgets, the guard, other VMs and signals; the rest is read next round.
const READS_PER_WAKEUP: usize = 8;
/// The most frames one VM's read budget stores ([`cosched_core::Policy::read_rate`]): one
/// turn's share, so that a burst within it is read at once.
const READ_BURST_FRAMES: u64 = (READS_PER_WAKEUP * 4096 / cosched_proto::FRAME_LEN) as u64;

/// Where the daemon's time goes, in total since it started (the `scale` experiment divides by
/// `frames`): reading, decoding, the coordinator, the actuators (of which `syscall_ns` in
/// the system calls making the changes), encoding and writing replies, and the whole of each
/// loop turn but the wait.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Cost {
    pub frames: u64,
    pub read_ns: u64,
    pub decode_ns: u64,
    pub coordinator_ns: u64,
    pub actuate_ns: u64,
    pub syscall_ns: u64,
    pub encode_ns: u64,
    pub write_ns: u64,
    pub loop_ns: u64,
}

fn ns_since(t: Instant) -> u64 {
    t.elapsed().as_nanos() as u64
}

pub struct Daemon {
    cfg: HostConfig,
    /// /proc, the system calls and the state directory: what the actuators use.
    host: Host,
    coord: Coordinator,
    poll: Poll,
    start: Instant,
    vms: Vms,
    channels: Channels,
    discovery: Discovery,
    clients: Clients,
    signals: OwnedFd,
    latency: Latency,
    /// VMs with bytes left to read after their last wake-up's share.
    backlog: Vec<usize>,
    /// VMs that sent past their read rate, and when to read them again.
    held: Vec<(usize, u64)>,
    /// VMs with replies waiting: written once per loop turn, however many frames caused them.
    dirty: Vec<usize>,
    /// Reused for every frame, so the hot path does not allocate.
    scratch_actions: Vec<Action>,
    scratch_events: Vec<Event>,
    thread_events: Vec<ThreadEvent>,
    cost: Cost,
    shutdown: bool,
    next_rescan_ns: u64,
    next_refresh_ns: u64,
    /// Whether I/O coordination can act here: with the `weight` lever, on which cgroup
    /// hierarchy; or why not.
    io: Result<Option<WeightHierarchy>, String>,
    /// Event boosting (FEAS), or why it does not run here.
    events: Result<EventBoost, String>,
    /// Memory-bandwidth regulation, or why it does not run here.
    membw: Result<membw::Membw, String>,
    /// Static tunings per VM name (`[vm.NAME.static]`, then the operator's commands).
    statics: std::collections::BTreeMap<String, crate::config::StaticConfig>,
    /// Memory-bandwidth shares the operator set by command, per VM name.
    membw_shares: std::collections::BTreeMap<String, u64>,
    /// The daemon's uid and capabilities, read at start (`None`: unreadable).
    caps: Option<crate::caps::Caps>,
    /// CPU shielding's host-wide side (IRQs, the operator's host groups).
    shield: crate::shield::HostShield,
    /// Wakes the loop at the coordinator's next deadline to the µs (predicted boosts).
    timer: Option<timer::DeadlineTimer>,
    _lock: fs::File,
}

impl Daemon {
    /// Sets everything up: restores what a previous daemon left, binds the control socket,
    /// watches the socket directory.
    pub fn new(cfg: HostConfig) -> anyhow::Result<Daemon> {
        let cgroups = crate::cgroup::CgroupFs::new("/proc", &cfg.cgroup_root).with_resctrl(&cfg.resctrl_root);
        Daemon::with_sched(cfg, ProcFs::default(), Box::new(RealSched { cgroups }))
    }

    pub fn with_sched(cfg: HostConfig, procfs: ProcFs, mut sched: Box<dyn ThreadOps>) -> anyhow::Result<Daemon> {
        cfg.validate()?;
        let (store, lock) = restore_at_start(&cfg, &procfs, sched.as_mut())?;
        let mut shield =
            crate::shield::HostShield::new(cfg.shield.clone(), sched.cgroups().clone(), procfs.root(), store.path());
        match shield.restore_leftover() {
            Ok(0) => {}
            Ok(n) => info!("restored {n} IRQ affinity(ies) and host group(s) a previous daemon's shield left"),
            Err(e) => warn!("restore: shield: {e}"),
        }
        let signals = os::block_signals().context("blocking SIGTERM/SIGINT/SIGHUP")?;
        let poll = Poll::new()?;
        poll.registry().register(&mut SourceFd(&signals.as_raw_fd()), SIGNALS, Interest::READABLE)?;
        let channels = Channels::watch(&cfg.socket_dir, &poll, INOTIFY, cfg.policy.read_rate(), READ_BURST_FRAMES)?;
        let clients = Clients::bind(&cfg.control_socket, cfg.metrics_listen.as_deref(), &poll, CONTROL, METRICS)?;
        let caps = privileges();
        set_own_priority(cfg.daemon_priority)?;
        let io = io_support(&cfg, sched.cgroups());
        // The daemon's time zero, in the clock of the BPF side's timestamps too.
        let (zero, start) = (cosched_hostbpf::feas::monotonic_ns(), Instant::now());
        let events = event_support(&cfg, &poll, zero);
        let membw = membw::Membw::open(&cfg, sched.cgroups(), procfs.root());
        let coord = coordinator(&cfg, io.is_ok(), events.is_ok(), membw.as_ref().ok().map(|m| m.regulator.clone()));
        let timer = timer::DeadlineTimer::open(&poll, TIMER, zero)
            .map_err(|e| warn!("timerfd: {e}: deadlines fall back to epoll's 1 ms resolution"))
            .ok();
        info!(
            "watching {} for VM sockets; control socket {}; coordination {}",
            cfg.socket_dir.display(),
            cfg.control_socket.display(),
            if cfg.enabled { "enabled" } else { "disabled" }
        );
        let discovery = Discovery::open(cfg.thread_events, &poll, THREADS, cfg.thread_refresh_ms)?;
        // With thread events, membership is known as it changes: a listing is redone only as a
        // safety net, once per rescan.
        let fresh = if discovery.live() { cfg.rescan_ms } else { cfg.thread_refresh_ms };
        let host = Host {
            procfs,
            sched,
            store,
            fresh: Duration::from_millis(fresh),
            verify: Duration::from_millis(cfg.thread_verify_ms),
            syscall_ns: 0,
        };
        let vms = Vms::new(cfg.vm.keys().map(|name| (name.clone(), cfg.vm_settings(name))).collect());
        let cfg_statics = cfg.vm.iter().map(|(name, v)| (name.clone(), v.statics.clone())).collect();
        Ok(Daemon {
            cfg,
            host,
            coord,
            poll,
            start,
            vms,
            channels,
            discovery,
            clients,
            signals,
            latency: Latency::default(),
            backlog: Vec::new(),
            held: Vec::new(),
            dirty: Vec::new(),
            scratch_actions: Vec::new(),
            scratch_events: Vec::new(),
            thread_events: Vec::new(),
            cost: Cost::default(),
            shutdown: false,
            next_rescan_ns: 0,
            next_refresh_ns: 0,
            io,
            events,
            membw,
            statics: cfg_statics,
            membw_shares: Default::default(),
            caps,
            shield,
            timer,
            _lock: lock,
        })
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// The actuators every VM gets: one per resource this daemon can change.
    fn actuators(&self) -> Vec<Box<dyn Actuator>> {
        let mut acts: Vec<Box<dyn Actuator>> = vec![Box::new(CpuActuator::new(self.cfg.boost.clone()))];
        if let Ok(hierarchy) = self.io {
            acts.push(Box::new(KnobActuator::io(&self.cfg.io, hierarchy)));
        }
        if self.events.is_ok() {
            acts.push(Box::new(CpuActuator::event()));
        }
        if let Ok(m) = &self.membw {
            acts.push(Box::new(KnobActuator::throttle(&m.lever)));
        }
        acts
    }

    /// When the loop must wake up at the latest.
    fn next_wakeup(&mut self) -> u64 {
        let mut next = self.next_rescan_ns;
        if !self.discovery.live() {
            next = next.min(self.next_refresh_ns);
        }
        if let Some(retry) = self.channels.next_retry() {
            next = next.min(retry);
        }
        if let Some(d) = self.coord.next_deadline() {
            next = next.min(d);
        }
        if let Some(d) = self.events.as_ref().ok().and_then(|e| e.feas.next_deadline()) {
            next = next.min(d);
        }
        if let Some(d) = self.next_static_guard() {
            next = next.min(d);
        }
        if let Ok(m) = &self.membw {
            next = next.min(m.next_check_ns);
        }
        if let Some(&(_, resume)) = self.held.iter().min_by_key(|(_, resume)| *resume) {
            next = next.min(resume);
        }
        next
    }

    /// Runs until SIGTERM or SIGINT, then puts every thread back and returns.
    pub fn run(mut self) -> anyhow::Result<()> {
        let mut events = Events::with_capacity(256);
        while !self.shutdown {
            let wait = self.next_wakeup().saturating_sub(self.now());
            let timeout = if self.backlog.is_empty() { Duration::from_nanos(wait) } else { Duration::ZERO };
            if let Some(t) = self.timer.as_mut() {
                t.arm(self.coord.next_deadline());
            }
            match self.poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Whatever went wrong, nothing we changed may outlive us.
                    self.restore_everything();
                    return Err(e).context("epoll");
                }
            }
            let turn = Instant::now();
            // VMs left with bytes to read by the last turn (they used their whole share). A VM
            // is read at most once a turn (READS_PER_WAKEUP reads), and these after every other:
            // a VM that floods its channel delays another's frame by at most one share.
            let mut backlog = std::mem::take(&mut self.backlog);
            // VMs held back for sending past their read rate are read when their budget is back,
            // with the backlog; until then their wake-ups are ignored (they are edge-triggered:
            // what waits is read when they are due).
            let due = self.now();
            self.held.retain(|&(token, resume)| {
                if resume <= due {
                    backlog.push(token);
                }
                resume > due
            });
            // Thread exits first: no change goes to a thread id that is no longer the VM's.
            // Only when the ring buffer said so: reading its drop counter is a system call,
            // and a drop can only happen while it holds events, so it has said so then.
            if events.iter().any(|e| e.token() == THREADS) {
                self.on_thread_events();
            }
            let now = self.now();
            for ev in events.iter() {
                match ev.token() {
                    THREADS => {}
                    TIMER => self.timer.iter_mut().for_each(timer::DeadlineTimer::fired),
                    FEAS => self.on_feas(),
                    INOTIFY => {
                        let opened = self.channels.on_inotify(now, &self.host.procfs);
                        self.open(opened);
                    }
                    SIGNALS => self.on_signal(),
                    CONTROL => self.clients.accept_control(&self.poll, now),
                    METRICS => self.clients.accept_metrics(&self.poll, now),
                    Token(t) if t >= FIRST_CLIENT => self.on_client(t),
                    Token(t) => {
                        if ev.is_readable() && !backlog.contains(&t) && !self.held.iter().any(|h| h.0 == t) {
                            self.read_vm(t);
                        }
                        if ev.is_writable() {
                            self.channels.flush(t, &self.poll);
                        }
                    }
                }
            }
            for token in backlog {
                self.read_vm(token);
            }
            let mut actions = std::mem::take(&mut self.scratch_actions);
            let now = self.now();
            self.coord.tick(now, &mut actions);
            self.tick_static_guards(now);
            if let Ok(ev) = self.events.as_mut() {
                if ev.feas.next_deadline().is_some_and(|d| d <= now) {
                    let (feas, mut probe) = ev.parts(&self.vms);
                    feas.tick(now, &mut self.coord, &mut probe, &mut actions);
                }
            }
            self.execute(&mut actions, None);
            self.scratch_actions = actions;
            self.tick_membw(now);
            self.housekeeping();
            self.flush_dirty();
            self.cost.loop_ns += ns_since(turn);
        }
        self.restore_everything();
        Ok(())
    }

    /// What is due by the clock: the periodic rescan (VMs gone, thread lists, sockets,
    /// processes, slow clients), socket retries, and thread lists without thread events.
    fn housekeeping(&mut self) {
        let now = self.now();
        if now >= self.next_rescan_ns {
            self.next_rescan_ns = now + self.cfg.rescan_ms * NS_PER_MS;
            self.on_thread_events(); // a safety net: nothing waits in the ring buffer unseen
            self.check_vms_alive();
            self.update_host_shield();
            if !self.discovery.live() {
                self.refresh_threads(true);
            }
            let opened = self.channels.scan(now, &self.host.procfs);
            self.open(opened);
            if self.cfg.discover_processes || self.cfg.discover_libvirt {
                self.discover_processes();
            }
            self.clients.expire(now, &self.poll);
        } else if self.channels.next_retry().is_some_and(|t| now >= t) {
            let opened = self.channels.scan(now, &self.host.procfs);
            self.open(opened);
        }
        if !self.discovery.live() && now >= self.next_refresh_ns {
            self.next_refresh_ns = now + self.cfg.thread_refresh_ms * NS_PER_MS;
            self.refresh_threads(false);
        }
    }

    fn on_signal(&mut self) {
        let bytes = os::drain_fd(self.signals.as_raw_fd());
        for chunk in bytes.chunks(std::mem::size_of::<libc::signalfd_siginfo>()) {
            let signo = u32::from_ne_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]) as i32;
            if signo == libc::SIGHUP {
                info!("SIGHUP: rescanning {}", self.cfg.socket_dir.display());
                self.channels.retry_all();
                let opened = self.channels.scan(self.now(), &self.host.procfs);
                self.open(opened);
            } else {
                info!("signal {signo}: restoring every thread and exiting");
                self.shutdown = true;
            }
        }
    }

    /// Puts every thread of every VM back (shutdown).
    fn restore_everything(&mut self) {
        for token in self.vms.tokens() {
            self.drop_vm(token, "daemon exiting");
        }
        self.clients.unbind();
    }

    /// Sockets whose QEMU is known: each becomes the channel of its VM, which is found or made.
    fn open(&mut self, opened: Vec<Opened>) {
        for o in opened {
            let (path, name, pid) = (o.path.clone(), o.name.clone(), o.process.task.id);
            let token = match self.vms.by_pid(pid) {
                Some(token) => {
                    // Found among the processes before: its agent's channel joins the entry.
                    let Some(vm) = self.vms.get_mut(token) else { continue };
                    info!("{}: its agent channel {} connected; now named {name}", vm.name(), path.display());
                    vm.threads.name = name.clone();
                    self.coord.rename(vm.id, &name);
                    token
                }
                None => match self.adopt(&name, o.process.task) {
                    Ok(token) => token,
                    Err(e) => {
                        self.channels.failed(&path, &e, self.now());
                        continue;
                    }
                },
            };
            let threads = self.vms.get(token).map_or(0, |vm| vm.threads.threads.len());
            match self.channels.attach(token, o, &self.poll, self.now()) {
                Ok(()) => info!("{name}: connected to QEMU pid {pid} ({threads} threads) via {}", path.display()),
                Err(e) => self.channels.failed(&path, &e, self.now()),
            }
        }
    }

    /// Makes an entry for the VM of QEMU process `process`, named `name`, with no channel yet:
    /// its threads are read and watched, the coordinator knows it. Returns its token.
    fn adopt(&mut self, name: &str, process: TaskId) -> Result<usize, Error> {
        // Watch before listing: a thread born in between is seen either way.
        self.discovery.watch(process.id)?;
        let actuators = self.actuators();
        let token = match self.vms.add(name, process, &mut self.host, actuators) {
            Ok(t) => t,
            Err(e) => {
                self.discovery.unwatch(process.id);
                return Err(e);
            }
        };
        let now = self.now();
        let settings = *self.vms.settings.entry(name.to_string()).or_insert_with(|| self.coord.default_settings());
        if self.io.is_ok() {
            let images = crate::blockdev::images(&self.host.procfs.cmdline(process.id).unwrap_or_default());
            let disks = crate::blockdev::disks(Path::new("/sys"), &images);
            for w in disks.iter().filter_map(|d| d.warning()) {
                warn!("{name}: {w}");
            }
            for w in images.iter().filter_map(crate::blockdev::aio_warning) {
                warn!("{name}: {w}");
            }
            self.vms.get_mut(token).expect("just added").disks = disks;
        }
        let vm = self.vms.get(token).expect("just added");
        self.coord.vm_found(vm.id, name, settings, now);
        if let Ok(m) = &self.membw {
            let share = self.membw_shares.get(name).copied().unwrap_or_else(|| self.cfg.membw_share(name));
            if let Err(e) = m.add(vm.id, share) {
                warn!("{name}: {e}; it is regulated with no guaranteed share");
            }
        }
        self.coord.set_vm_vcpus(vm.id, vm.threads.vcpu_count());
        self.sync_events(token);
        let _ = self.apply_statics(token); // told in the log; the VM is coordinated either way
        Ok(token)
    }

    /// Makes entries of QEMU processes that have no channel to us (guests without an agent,
    /// libvirt domains without the channel): config `[vm.NAME]` applies to them by QEMU's
    /// `-name` or their libvirt domain, and host-side features act on them.
    fn discover_processes(&mut self) {
        let vms = &self.vms;
        let mut found = Vec::new();
        if self.cfg.discover_libvirt {
            found = self
                .discovery
                .libvirt_domains(&self.host.procfs, &self.cfg.libvirt_dir, |pid| vms.by_pid(pid).is_some());
        }
        if self.cfg.discover_processes {
            let libvirts: Vec<i32> = found.iter().map(|(_, p)| p.task.id).collect();
            found.extend(
                self.discovery
                    .qemu_processes(&self.host.procfs, |pid| vms.by_pid(pid).is_some() || libvirts.contains(&pid)),
            );
        }
        for (name, p) in found {
            let pid = p.task.id;
            match self.adopt(&name, p.task) {
                Ok(_) => info!("{name}: found QEMU pid {pid} with no agent channel"),
                Err(e) => debug!("QEMU pid {pid}: {e}"),
            }
        }
    }

    fn read_vm(&mut self, token: usize) {
        let Some(id) = self.vms.get(token).map(|vm| vm.id) else { return };
        let mut buf = [0u8; 4096];
        let mut events = std::mem::take(&mut self.scratch_events);
        let mut actions = std::mem::take(&mut self.scratch_actions);
        let mut full_reads = 0;
        for _ in 0..READS_PER_WAKEUP {
            let t = Instant::now();
            let read = self.channels.read(token, &mut buf, self.now());
            self.cost.read_ns += ns_since(t);
            let (n, drained) = match read {
                Read::Data { n, drained } => (n, drained),
                Read::Empty => break,
                Read::Held(resume) => {
                    if !self.held.iter().any(|h| h.0 == token) {
                        self.held.push((token, resume));
                    }
                    let rate = self.cfg.policy.read_rate();
                    self.warn_vm(token, &format!("sends faster than {rate} frames/s ([policy] read_rate): read at that rate, the rest waits in its channel"));
                    break;
                }
                Read::Closed(why) => {
                    self.drop_vm(token, &why);
                    break;
                }
            };
            let rx_ns = self.now();
            let t = Instant::now();
            events.clear();
            self.channels.decode(token, &buf[..n], &mut events);
            self.cost.decode_ns += ns_since(t);
            for ev in events.drain(..) {
                let t = Instant::now();
                match ev {
                    Event::Frame(f) => {
                        debug!("{}: <- {f}", self.vm_label(token));
                        self.cost.frames += 1;
                        self.coord.frame(id, f, rx_ns, &mut actions);
                    }
                    Event::Malformed(e) => {
                        self.warn_vm(token, &format!("malformed frame: {e}"));
                        self.coord.malformed(id, e.seq(), 0, rx_ns, &mut actions);
                    }
                    Event::Garbage { skipped } => {
                        self.warn_vm(token, &format!("{skipped} byte(s) of garbage skipped"));
                        self.coord.malformed(id, None, skipped as u64, rx_ns, &mut actions);
                    }
                }
                self.cost.coordinator_ns += ns_since(t);
                self.execute(&mut actions, Some(rx_ns));
            }
            if drained {
                // A short read drained the socket; bytes arriving later raise a new edge. This
                // spares the read that would only say EAGAIN.
                break;
            }
            full_reads += 1;
        }
        if full_reads == READS_PER_WAKEUP && !self.backlog.contains(&token) {
            // Edge-triggered: no new wake-up comes for bytes already waiting; read them next round.
            self.backlog.push(token);
        }
        self.scratch_events = events;
        self.scratch_actions = actions;
        // A registration or a CPU boost may have changed whether event boosting applies.
        self.sync_events(token);
        // One write per VM per wake-up, however many frames it sent.
        let t = Instant::now();
        self.channels.flush(token, &self.poll);
        self.dirty.retain(|d| *d != token);
        self.cost.write_ns += ns_since(t);
    }

    fn vm_label(&self, token: usize) -> String {
        self.vms.get(token).map_or_else(|| format!("VM {token}"), |vm| vm.name().to_string())
    }

    fn warn_vm(&mut self, token: usize, msg: &str) {
        let now = self.now();
        if let Some(vm) = self.vms.get_mut(token) {
            vm.warn(msg, now);
        }
    }

    /// Carries out the coordinator's actions, leaving `actions` empty for reuse: replies are
    /// queued (written at the end of the loop turn, [`Daemon::flush_dirty`]), changes go to
    /// the VM's actuator of their resource. `rx_ns`: when the frame that caused them was read.
    fn execute(&mut self, actions: &mut Vec<Action>, rx_ns: Option<u64>) {
        for a in actions.drain(..) {
            let t = Instant::now();
            match a {
                Action::Send { vm, frame } => {
                    let token = vm.0 as usize;
                    debug!("{}: -> {frame}", self.vm_label(token));
                    if self.channels.queue(token, &frame) && !self.dirty.contains(&token) {
                        self.dirty.push(token);
                    }
                    self.cost.encode_ns += ns_since(t);
                }
                Action::Apply { vm, resource: Resource::Membw, value, .. } => {
                    // A guest's share, admitted by the regulator itself (`MembwPolicy`): no
                    // thread changes until the regulator stops the VM.
                    debug!("{}: membw share in force: {value}‰", self.vm_label(vm.0 as usize));
                }
                Action::Apply { vm, resource, level, value, priority } => {
                    // An RT co-scheduling grant carries its own priority (`actuator::class`).
                    let priority =
                        if resource == Resource::Cpu { actuator_priority(value, priority) } else { priority };
                    self.apply(vm.0 as usize, resource, level, priority, rx_ns);
                    self.cost.actuate_ns += ns_since(t);
                }
            }
        }
        if self.coord.has_predicted_starts() {
            let now = self.now();
            note_applied(&mut self.coord, now);
        }
    }

    fn apply(&mut self, token: usize, resource: Resource, level: Level, priority: u8, rx_ns: Option<u64>) {
        if resource == Resource::Cpu && level.is_changed() {
            // An agent's CPU boost takes over the vCPUs: event boosting lets go of them first.
            self.events_off(token);
        }
        let now = self.now();
        let Some(vm) = self.vms.get_mut(token) else { return };
        let was = vm.threads.level(resource);
        let syscalls = self.host.syscall_ns;
        let out = vm.threads.set_level(&mut self.host, resource, level, priority);
        self.cost.syscall_ns += self.host.syscall_ns - syscalls;
        if let Some(rx) = rx_ns {
            let ns = (self.start.elapsed().as_nanos() as u64).saturating_sub(rx);
            vm.latency.record(ns);
            self.latency.record(ns);
        }
        debug!(
            "{}: {resource} {} -> {} ({} thread(s) changed, {} gone, {} left as someone else set them)",
            vm.name(),
            was.name(),
            level.name(),
            out.changed,
            out.gone,
            out.foreign
        );
        vm.note(&out, now);
    }

    /// Writes the replies queued during this loop turn: one write per VM however many frames
    /// it sent.
    fn flush_dirty(&mut self) {
        let t = Instant::now();
        for token in std::mem::take(&mut self.dirty) {
            self.channels.flush(token, &self.poll);
        }
        self.cost.write_ns += ns_since(t);
    }

    /// Thread life-cycle events of the VMs' processes: newcomers are tracked (and brought to
    /// their VM's levels at once), renamed threads get their role, exited ones are dropped.
    fn on_thread_events(&mut self) {
        let mut evs = std::mem::take(&mut self.thread_events);
        let lost = self.discovery.drain(&mut evs);
        let mut touched: Vec<usize> = Vec::new();
        for ev in evs.drain(..) {
            let Some(token) = self.vms.by_pid(ev.tgid()) else { continue };
            let Some(vm) = self.vms.get_mut(token) else { continue };
            if vm.threads.thread_event(&mut self.host, &ev) && !touched.contains(&token) {
                touched.push(token);
            }
        }
        self.thread_events = evs;
        let now = self.now();
        for token in touched {
            let Some(vm) = self.vms.get_mut(token) else { continue };
            self.coord.set_vm_vcpus(vm.id, vm.threads.vcpu_count());
            if vm.threads.raised() {
                let out = vm.threads.reapply(&mut self.host);
                note_new_threads(vm, &out, now);
            }
            self.sync_events(token);
        }
        if lost {
            self.refresh_threads(true);
        }
    }

    /// Re-reads the thread lists (of raised VMs only, unless `all`) and brings threads that
    /// appeared since to the VM's levels. For VMs at normal level this only updates what
    /// `cosched status` shows (QEMU names a thread a moment after creating it).
    fn refresh_threads(&mut self, all: bool) {
        let now = self.now();
        for token in self.vms.tokens() {
            let Some(vm) = self.vms.get_mut(token) else { continue };
            if !all && !vm.threads.raised() {
                continue;
            }
            let out = vm.threads.refresh(&mut self.host);
            self.coord.set_vm_vcpus(vm.id, vm.threads.vcpu_count());
            note_new_threads(vm, &out, now);
        }
    }

    /// Forgets a VM: everything changed on its threads is put back, its channel closed.
    fn drop_vm(&mut self, token: usize, why: &str) {
        let Some(mut vm) = self.vms.remove(token) else { return };
        let mut actions = Vec::new();
        self.coord.vm_gone(vm.id, self.now(), &mut actions);
        if let Ok(m) = self.membw.as_mut() {
            m.forget(vm.id);
        }
        let out = vm.threads.restore(&mut self.host);
        for e in &out.errors {
            warn!("{}: restoring: {e}", vm.name());
        }
        self.channels.close(token, &self.poll);
        self.discovery.unwatch(vm.pid());
        if let Ok(ev) = self.events.as_mut() {
            ev.forget(vm.id, vm.pid());
        }
        self.backlog.retain(|t| *t != token);
        self.held.retain(|h| h.0 != token);
        self.dirty.retain(|t| *t != token);
        info!("{}: {why}; {} setting(s) restored", vm.name(), out.restored);
        self.update_host_shield();
    }

    /// Forgets VMs whose QEMU process is gone (or whose pid now names another process).
    fn check_vms_alive(&mut self) {
        let gone: Vec<usize> = self
            .vms
            .iter()
            .filter(|(_, vm)| match self.host.procfs.process(vm.pid()) {
                Ok(p) => p.task != vm.threads.process(), // the pid names another process now
                Err(e) => e.is_gone(),                   // EMFILE and the like are not an exit
            })
            .map(|(t, _)| t)
            .collect();
        for t in gone {
            self.drop_vm(t, "QEMU process exited");
        }
    }

    /// A control or metrics client has sent its request: answer it.
    fn on_client(&mut self, token: usize) {
        let Some(ask) = self.clients.on_event(token, &self.poll) else { return };
        let answer = match ask {
            Ask::Control(Ok(req)) => Answer::Control(self.handle(req)),
            Ask::Control(Err(e)) => Answer::Control(Reply::err(e)),
            Ask::Metrics => Answer::Metrics(self.metrics()),
        };
        self.clients.answer(token, answer, &self.poll);
    }

    /// Runs an operator command on the VM named `key`; the settings it returns are kept for the
    /// VM's name, so they survive a reconnect.
    fn vm_command(
        &mut self,
        key: &str,
        actions: &mut Vec<Action>,
        f: impl FnOnce(&mut Coordinator, VmId, &mut Vec<Action>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let id = self.vms.find(key)?;
        f(&mut self.coord, id, actions)?;
        let vm = self.coord.vm(id).expect("found");
        let off: Vec<&str> = Resource::ALL.iter().filter(|r| !vm.settings.enabled(**r)).map(|r| r.name()).collect();
        info!("operator: {}: disabled resources [{}], priority {}", vm.name, off.join(", "), vm.settings.priority);
        self.vms.settings.insert(vm.name.clone(), vm.settings);
        Ok(())
    }

    fn handle(&mut self, req: Request) -> Reply {
        let mut actions = Vec::new();
        let done = match req {
            Request::Status => return Reply::with(&self.status(status::Detail::Full)),
            Request::Metrics => return Reply::with(&crate::control::MetricsReply { text: self.metrics() }),
            Request::Enable { vm, resource } => self.switch(vm, resource, true, &mut actions),
            Request::Disable { vm, resource } => self.switch(vm, resource, false, &mut actions),
            Request::Priority { vm, priority } => self.set_priority(&vm, priority, &mut actions),
            Request::Static { vm, fifo, shield, guard } => self.set_static(&vm, fifo, shield, guard),
            Request::Ceiling { vm, ceiling } => self.set_ceiling(&vm, ceiling, &mut actions),
            Request::MembwShare { vm, share } => self.set_membw_share(&vm, share),
            Request::Membw { period_ms, reclaim, best_effort } => self.set_membw(period_ms, reclaim, best_effort),
        };
        self.execute(&mut actions, None);
        for token in self.vms.tokens() {
            self.sync_events(token);
        }
        match done {
            Ok(()) => Reply::ok(None),
            Err(e) => Reply::err(e.to_string()),
        }
    }

    /// Enables or disables one resource (or all) for the host or for one VM.
    fn switch(
        &mut self,
        vm: Option<String>,
        resource: Option<String>,
        on: bool,
        actions: &mut Vec<Action>,
    ) -> Result<(), Error> {
        let resource = resource.as_deref().map(|n| self.resource_named(n)).transpose()?;
        let now = self.now();
        match vm {
            None => {
                self.coord.set_enabled(resource, on, now, actions);
                let what = resource.map_or("every resource".to_string(), |r| r.name().to_string());
                info!("operator: {what} {} for the whole host", if on { "enabled" } else { "disabled" });
                Ok(())
            }
            Some(key) => self.vm_command(&key, actions, |coord, id, actions| {
                coord.set_vm_enabled(id, resource, on, now, actions);
                Ok(())
            }),
        }
    }

    fn set_priority(&mut self, key: &str, priority: u8, actions: &mut Vec<Action>) -> Result<(), Error> {
        let ceiling = self.cfg.daemon_priority;
        let offset = self.cfg.boost.other_threads_priority_offset;
        if cosched_core::VM_PRIORITY.contains(&priority) && ceiling != 0 && priority + offset >= ceiling {
            return Err(Error::AboveDaemon { priority, ceiling });
        }
        self.vm_command(key, actions, |coord, id, actions| {
            coord.set_vm_priority(id, priority, actions).map_err(Error::Refused)
        })
    }

    /// Operator: the highest host priority VM `key`'s guest priorities map to (`[rt]`).
    fn set_ceiling(&mut self, key: &str, ceiling: u8, actions: &mut Vec<Action>) -> Result<(), Error> {
        let daemon = self.cfg.daemon_priority;
        if daemon != 0 && ceiling.saturating_add(self.cfg.boost.other_threads_priority_offset) >= daemon {
            return Err(Error::AboveDaemon { priority: ceiling, ceiling: daemon });
        }
        self.vm_command(key, actions, |coord, id, actions| {
            coord.set_vm_ceiling(id, ceiling, actions).map_err(Error::Refused)
        })?;
        info!("operator: {key}: RT ceiling {ceiling}");
        Ok(())
    }

    /// A resource this host supports, by name.
    fn resource_named(&self, name: &str) -> Result<Resource, Error> {
        let supported = self.coord.resources().map(|r| r.name()).collect::<Vec<_>>().join(", ");
        match Resource::from_name(name) {
            Some(r) if self.coord.resources().any(|s| s == r) => Ok(r),
            Some(resource) => Err(Error::Unsupported { resource, supported }),
            None => Err(Error::UnknownResource { name: name.to_string(), supported }),
        }
    }

    /// The Prometheus text, from a status without the threads' views.
    fn metrics(&self) -> String {
        crate::metrics::render(&self.status(status::Detail::Metrics))
    }

    fn status(&self, detail: status::Detail) -> cosched_status::Status {
        let view = status::View {
            now: self.now(),
            cfg: &self.cfg,
            coord: &self.coord,
            vms: &self.vms,
            channels: &self.channels,
            thread_events: self.discovery.mechanism(),
            metrics_addr: self.clients.metrics_addr(),
            cost: &self.cost,
            latency: &self.latency,
            io: &self.io,
            events: &self.events,
            membw: &self.membw,
            shield: &self.shield,
            caps: &self.caps,
        };
        status::snapshot(&view, detail)
    }

    /// Tells the event detection what changed of VM `token` (its threads, whether event
    /// boosting applies to it) and lets go of its vCPUs if it no longer does.
    fn sync_events(&mut self, token: usize) {
        let Ok(ev) = self.events.as_mut() else { return };
        let Some(vm) = self.vms.get(token) else { return };
        if !ev.sync(vm, &self.coord) {
            self.events_off(token);
        }
    }

    /// Ends what event boosting holds on VM `token`.
    fn events_off(&mut self, token: usize) {
        let now = self.now();
        let Ok(ev) = self.events.as_mut() else { return };
        let id = VmId(token as u64);
        if !self.coord.vm(id).is_some_and(|v| v.level(Resource::Event).is_changed()) {
            return;
        }
        let mut actions = Vec::new();
        ev.off(id, now, &mut self.coord, &mut actions);
        self.execute(&mut actions, None);
    }

    /// Messages of the event detection: events for VMs, boosted vCPUs that blocked.
    fn on_feas(&mut self) {
        let Ok(ev) = self.events.as_mut() else { return };
        let msgs = ev.drain();
        let mut actions = std::mem::take(&mut self.scratch_actions);
        for m in &msgs {
            let (tgid, ts, blocked) = match *m {
                FeasMsg::Boost { tgid, ts } | FeasMsg::Postponed { tgid, ts } => (tgid, ts, false),
                FeasMsg::Blocked { tgid, ts } => (tgid, ts, true),
            };
            let Some(token) = self.vms.by_pid(tgid) else { continue };
            let id = VmId(token as u64);
            let now = ev.time_of(ts);
            let (feas, mut probe) = ev.parts(&self.vms);
            if blocked {
                feas.blocked(id, now, &mut self.coord, &mut probe, &mut actions);
            } else {
                feas.event(id, now, &mut self.coord, &mut probe, &mut actions);
            }
        }
        ev.recycle(msgs);
        self.execute(&mut actions, None);
        self.scratch_actions = actions;
    }
}

/// Logs what bringing a VM's new threads to its levels did, and counts its errors.
fn note_new_threads(vm: &mut VmEntry, out: &Outcome, now: u64) {
    if out.changed > 0 {
        debug!("{}: changed {} new thread(s)", vm.name(), out.changed);
    }
    vm.note(out, now);
}

/// Locks the state directory and puts back what a previous daemon left changed.
fn restore_at_start(
    cfg: &HostConfig,
    procfs: &ProcFs,
    sched: &mut dyn ThreadOps,
) -> anyhow::Result<(StateDir, fs::File)> {
    let store = StateDir::open(&cfg.state_dir)
        .with_context(|| format!("creating state directory {}", cfg.state_dir.display()))?;
    let lock = lock_state_dir(&store)?;
    let report =
        restore_all(&store, procfs, sched).with_context(|| format!("restoring from {}", cfg.state_dir.display()))?;
    if report.restored + report.gone + report.untouched > 0 || !report.errors.is_empty() {
        info!(
            "restored {} thread(s) left boosted by a previous daemon ({} gone, {} changed by someone else)",
            report.restored, report.gone, report.untouched
        );
    }
    for e in &report.errors {
        warn!("restore: {e}");
    }
    Ok((store, lock))
}

/// The daemon's privileges, logged: the features it lost for want of a capability (it keeps
/// the rest).
fn privileges() -> Option<crate::caps::Caps> {
    match crate::caps::Caps::read(Path::new("/proc/self/status")) {
        Ok(c) => {
            let lost = c.lost();
            if lost.is_empty() {
                info!("privileges: uid {}, {}: every feature available", c.uid, c.used_present().join(" "));
            }
            for l in &lost {
                warn!("privileges: uid {} without {}: lost {}", c.uid, l.needs, l.feature);
            }
            Some(c)
        }
        Err(e) => {
            warn!("privileges: cannot read them: {e}");
            None
        }
    }
}

/// Puts the daemon's own thread at `SCHED_FIFO priority` (0: leaves it), RESET_ON_FORK so
/// nothing it starts inherits it.
fn set_own_priority(priority: u8) -> anyhow::Result<()> {
    if priority == 0 {
        return Ok(());
    }
    let me = SchedAttr::rt(SCHED_FIFO, priority as u32, SCHED_FLAG_RESET_ON_FORK);
    crate::sched::set(0, &me)
        .map_err(|e| anyhow::anyhow!(crate::sched::explain_set_error(0, &me, &e)))
        .context("daemon_priority (set it to 0 to run at SCHED_OTHER)")
}

/// Whether I/O coordination can act on this host with the configured lever (and on which
/// cgroup hierarchy), or why not. Logged either way.
fn io_support(cfg: &HostConfig, cgroups: &crate::cgroup::CgroupFs) -> Result<Option<WeightHierarchy>, String> {
    let found = match cfg.io.lever {
        IoLever::Ioprio => Ok(None),
        IoLever::Weight => weight_hierarchy(cgroups).map(Some),
    };
    match &found {
        Ok(h) => info!(
            "I/O coordination: lever {}{}",
            cfg.io.lever.name(),
            match h {
                None => format!(" (real-time I/O class, level {})", cfg.io.ioprio_level),
                Some(WeightHierarchy::V1) => format!(" (BFQ weight {} through cgroup v1 blkio)", cfg.io.weight),
                Some(WeightHierarchy::V2) => format!(" (BFQ weight {} through cgroup v2 io)", cfg.io.weight),
            }
        ),
        Err(why) => warn!(
            "I/O coordination is unsupported here: the weight lever needs BFQ weights in a cgroup hierarchy, and \
             there are none: {why}; set [io] lever = \"ioprio\" to use the real-time I/O class instead"
        ),
    }
    found
}

/// Event boosting (FEAS) if `[event]` asks for it and the kernel allows its BPF; logged either way.
fn event_support(cfg: &HostConfig, poll: &Poll, zero: u64) -> Result<EventBoost, String> {
    if cfg.event.vms == cosched_core::EventVms::None {
        return Err("off: [event] vms = \"none\"".into());
    }
    EventBoost::open(&cfg.event, poll, FEAS, zero).map_err(|e| {
        warn!("event boosting (FEAS) is unsupported here: {e}");
        e
    })
}

/// The coordinator for `cfg`: the resources this daemon can change, switched as configured.
fn coordinator(
    cfg: &HostConfig,
    io: bool,
    events: bool,
    membw: Option<std::sync::Arc<std::sync::Mutex<cosched_core::Regulator>>>,
) -> Coordinator {
    let host_cpus = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
    let mut policy = cfg.policy.clone();
    if cfg.boost.policy == crate::actuator::BoostPolicy::Deadline {
        warn!(
            "[boost] policy = \"deadline\" is experimental: on some kernels (seen on Linux 6.18) a \
             thread that leaves SCHED_DEADLINE while asleep never returns its bandwidth, so after a \
             few deboosts no SCHED_DEADLINE reservation is admitted on this host until it reboots"
        );
    }
    if !cfg.boost.policy.needs_rt_guard() {
        // SCHED_DEADLINE and nice boosts put no vCPU at an RT class: nothing to guard.
        policy.rt_guard_max_share_permille = 0;
    }
    let cpu = cosched_core::CpuPolicy::new(&policy, host_cpus);
    if cpu.capacity() == 0 {
        warn!(
            "this host has {host_cpus} CPU(s) and host_reserve_cpus = {}: no VM can be boosted",
            cfg.policy.host_reserve_cpus
        );
    }
    let mut resources: Vec<Box<dyn cosched_core::ResourcePolicy>> = vec![Box::new(cpu)];
    if io {
        resources.push(Box::new(cosched_core::IoPolicy));
    }
    if events {
        resources.push(Box::new(cosched_core::EventPolicy));
    }
    if let Some(regulator) = membw {
        resources.push(Box::new(cosched_core::MembwPolicy::new(regulator)));
    }
    let mut coord = Coordinator::new(policy, resources);
    let mut rt = cfg.rt();
    if rt.priority_map != cosched_core::PriorityMap::Vm && !cfg.boost.policy.needs_rt_guard() {
        warn!("[rt] priority_map = \"vm\": guest priorities need [boost] policy = \"rr\" or \"fifo\"");
        rt.priority_map = cosched_core::PriorityMap::Vm;
    }
    coord.set_rt(rt);
    for (name, vm) in &cfg.vm {
        coord.set_ceiling(name, vm.rt_ceiling);
    }
    let mut sink = Vec::new();
    for r in Resource::ALL {
        coord.set_enabled(Some(r), cfg.starts_enabled(r), 0, &mut sink);
    }
    coord
}

/// `cosched restore`: puts back every thread recorded in `state_dir`, unless a daemon runs.
/// Also what a dead daemon's shield left (IRQ affinities, host groups' CPUs).
pub fn restore_command(state_dir: &Path, cfg: &HostConfig) -> anyhow::Result<crate::store::RestoreReport> {
    if !state_dir.exists() {
        return Ok(Default::default());
    }
    let store = StateDir::open(state_dir)?;
    let _lock = lock_state_dir(&store)?;
    let cgroups = crate::cgroup::CgroupFs::new("/proc", &cfg.cgroup_root).with_resctrl(&cfg.resctrl_root);
    let mut ops = RealSched { cgroups: cgroups.clone() };
    let mut report = restore_all(&store, &ProcFs::default(), &mut ops)?;
    let mut shield = crate::shield::HostShield::new(cfg.shield.clone(), cgroups, "/proc", store.path());
    match shield.restore_leftover() {
        Ok(n) => report.restored += n as u64,
        Err(e) => report.errors.push(format!("shield: {e}")),
    }
    Ok(report)
}

/// After the actuators ran: tells the coordinator when the predicted boosts it started were
/// applied (`now`), against when they were planned.
fn note_applied(coord: &mut Coordinator, now: u64) {
    for (id, target, start) in coord.predicted_starts() {
        coord.predict_applied(id, target, start, now);
        debug!(
            "VM {}: predicted boost applied {} µs after its target ({} µs after the deadline set for it)",
            id.0,
            (now as i64 - target as i64) / 1000,
            (now as i64 - start as i64) / 1000
        );
    }
}
