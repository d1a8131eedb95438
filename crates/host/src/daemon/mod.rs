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
mod control;
mod discovery;
mod events;
mod lifecycle;
mod membw;
mod operator;
mod os;
mod reload;
mod setup;
mod statics;
mod status;
mod timer;
mod vms;

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::Context;
use cosched_core::{Action, Coordinator, Grant, HostEvent, Level, Sensors, VmId, NS_PER_MS};
use cosched_hostbpf::feas::{FeasMsg, FeasWatch};
use cosched_hostbpf::ThreadEvent;
use cosched_procfs::ProcFs;
use cosched_proto::{Event, Resource};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

pub use os::lock_state_dir;
pub use setup::restore_command;
use setup::{coordinator, event_support, io_support, privileges, restore_at_start, set_own_priority};

use self::channels::{Channels, Read};
use self::clients::{Clients, FIRST_CLIENT};
use self::discovery::Discovery;
use self::events::EventBoost;
use self::vms::Vms;
use crate::actuator::{Actuator, CpuActuator, Host, KnobActuator, RealSched, WeightHierarchy};
use crate::config::HostConfig;
use crate::error::Unavailable;
use crate::metrics::Latency;
use crate::store::ThreadOps;

/// The sensors over the daemon's parts (borrowed field by field, beside the coordinator).
macro_rules! sensors {
    ($d:expr) => {
        HostSensors {
            events: $d.events.as_ref().ok().map(|e| e.watch()),
            vms: &$d.vms,
            membw: $d.membw.as_mut().ok(),
            host: &mut $d.host,
        }
    };
}
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

/// Where the daemon's time goes (what `cosched status` shows as `daemon.cost`).
pub use cosched_status::Cost;

fn ns_since(t: Instant) -> u64 {
    t.elapsed().as_nanos() as u64
}

pub struct Daemon {
    /// The settings in force: the config with the operator's settings over it.
    cfg: HostConfig,
    /// The config as loaded (file and command line), with the keys that need a restart as
    /// they run: what a reset goes back to.
    config: HostConfig,
    /// The operator's settings, kept in the state directory ([`crate::operator`]).
    ops: crate::operator::Operator,
    /// Where a reload reads the config again (`None`: given directly, nothing to reload).
    source: Option<crate::reload::Source>,
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
    io: Result<Option<WeightHierarchy>, Unavailable>,
    /// Event boosting (FEAS), or why it does not run here.
    events: Result<EventBoost, Unavailable>,
    /// Memory-bandwidth regulation, or why it does not run here.
    membw: Result<membw::Membw, Unavailable>,
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
        // The operator's settings a previous daemon kept, over the config.
        let ops = setup::operator_settings(&cfg, store.path());
        let (config, cfg) = (cfg.clone(), ops.over(&cfg));
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
        let coord = coordinator(&cfg, io.is_ok(), events.is_ok(), membw.is_ok());
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
        Ok(Daemon {
            cfg,
            config,
            ops,
            source: None,
            host,
            coord,
            poll,
            start,
            vms: Vms::default(),
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
            caps,
            shield,
            timer,
            _lock: lock,
        })
    }

    /// A reload (`cosched reload`, SIGHUP) reads the config again from `source`.
    pub fn with_source(mut self, source: crate::reload::Source) -> Daemon {
        self.source = Some(source);
        self
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
            acts.push(Box::new(CpuActuator::event(self.cfg.event.repay_nice)));
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
        // Budgets, guards, predictions, event slices, membw checks: one ordered set.
        if let Some(d) = self.coord.next_deadline() {
            next = next.min(d);
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
            if self.coord.next_deadline().is_some_and(|d| d <= now) {
                let mut sensors = sensors!(self);
                self.coord.tick_sensed(now, &mut sensors, &mut actions);
            }
            self.execute(&mut actions, None);
            self.scratch_actions = actions;
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
            self.rescan_devices();
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
                info!("SIGHUP: reloading the config, rescanning {}", self.cfg.socket_dir.display());
                self.sighup_reload();
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
        let mut throttles = Vec::new();
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
                Action::Apply { vm, resource, level, grant } => {
                    self.apply(vm.0 as usize, resource, level, grant, rx_ns);
                    self.cost.actuate_ns += ns_since(t);
                    if resource == Resource::Membw && level == Level::Throttled {
                        throttles.push(vm);
                    }
                }
                Action::WatchEvents { vm, on } => {
                    if let (Ok(ev), Some(e)) = (self.events.as_mut(), self.vms.get(vm.0 as usize)) {
                        ev.watch_vm(e, on, &self.host.procfs);
                    }
                }
                Action::StaticGuard { vm, guarded } => self.static_guard(vm.0 as usize, guarded),
            }
        }
        // A stop counts once the lever says it is in force: looked at once, right after.
        for vm in throttles {
            let now = self.now();
            let mut sensors = sensors!(self);
            self.coord.host_event(Resource::Membw, vm, HostEvent::Applied, now, &mut sensors, actions);
        }
        if self.coord.has_predicted_starts() {
            let now = self.now();
            note_applied(&mut self.coord, now);
        }
    }

    fn apply(&mut self, token: usize, resource: Resource, level: Level, grant: Grant, rx_ns: Option<u64>) {
        let now = self.now();
        let Some(vm) = self.vms.get_mut(token) else { return };
        let was = vm.threads.level(resource);
        let syscalls = self.host.syscall_ns;
        let out = vm.threads.set_level(&mut self.host, resource, level, grant);
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
        vm.note_level(resource, &out, now);
        // The run delays count at the level now applied.
        self.sync_events(token);
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

    /// Tells the event detection what changed of VM `token` (its threads, whether event
    /// boosting applies to it, the level its run delays count at) and lets go of its vCPUs if it no longer does.
    fn sync_events(&mut self, token: usize) {
        let Ok(ev) = self.events.as_mut() else { return };
        let Some(vm) = self.vms.get(token) else { return };
        ev.sync(vm);
    }

    /// Finds the VMs' devices again for the event detection (a NIC or disk hot-plugged).
    fn rescan_devices(&mut self) {
        let Ok(ev) = self.events.as_mut() else { return };
        for (_, vm) in self.vms.iter() {
            ev.devices(vm, &self.host.procfs);
        }
    }

    /// Messages of the event detection: events for VMs, boosted vCPUs that blocked.
    fn on_feas(&mut self) {
        let Ok(ev) = self.events.as_mut() else { return };
        let msgs = ev.drain();
        let mut actions = std::mem::take(&mut self.scratch_actions);
        for m in &msgs {
            let (tgid, ts, what) = match *m {
                FeasMsg::Boost { tgid, ts } | FeasMsg::Postponed { tgid, ts } => (tgid, ts, HostEvent::Device),
                FeasMsg::Blocked { tgid, ts } => (tgid, ts, HostEvent::VcpuBlocked),
            };
            let Some(token) = self.vms.by_pid(tgid) else { continue };
            let now = self.events.as_ref().map_or(0, |ev| ev.time_of(ts));
            let mut sensors = sensors!(self);
            self.coord.host_event(Resource::Event, VmId(token as u64), what, now, &mut sensors, &mut actions);
        }
        if let Ok(ev) = self.events.as_mut() {
            ev.recycle(msgs);
        }
        self.execute(&mut actions, None);
        self.scratch_actions = actions;
    }
}

/// What the coordinator reads of the host when it decides: the vCPUs' run time, sleep and
/// waiting from the event detection's BPF maps, memory traffic from the bandwidth counters,
/// whether a throttle is in force from its lever.
struct HostSensors<'a> {
    events: Option<&'a FeasWatch>,
    vms: &'a Vms,
    membw: Option<&'a mut membw::Membw>,
    host: &'a mut Host,
}

impl Sensors for HostSensors<'_> {
    fn vcpu_run_ns(&mut self, vm: VmId) -> u64 {
        self.events.map_or(0, |w| events::vcpu_run_ns(w, self.vms, vm))
    }
    fn vcpu_asleep_ns(&mut self, vm: VmId) -> u64 {
        self.events.map_or(0, |w| events::vcpu_asleep_ns(w, self.vms, vm))
    }
    fn vcpu_waiting(&mut self, vm: VmId) -> bool {
        self.events.is_some_and(|w| events::vcpu_waiting(w, self.vms, vm))
    }
    fn vcpu_running(&mut self, vm: VmId) -> bool {
        self.events.is_some_and(|w| events::vcpu_running(w, self.vms, vm))
    }
    fn membw_bytes(&mut self, vm: VmId, now: u64) -> u64 {
        let vms = self.vms;
        self.membw.as_mut().map_or(0, |m| m.bytes(vms, vm, now))
    }
    fn in_force(&mut self, vm: VmId, r: Resource) -> Option<bool> {
        self.vms.get(vm.0 as usize)?.threads.in_force(self.host, r)
    }
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
