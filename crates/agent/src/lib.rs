//! The cosched guest agent (`cosched guest`).
//!
//! It opens the virtio-serial port `org.cosched.0`, probes its detectors (one per resource, see
//! `detector.rs`: CPU, `src/bpf/cpu.bpf.c` on `sched_switch`, `sched_wakeup`,
//! `sched_wakeup_new`; I/O, `src/bpf/io.bpf.c` on the guest BFQ's count of weight-raised busy
//! queues, see `io.rs`), registers with the host the resources whose detector can load, and
//! attaches the detectors of the resources the host grants. The detectors decide in the kernel;
//! the agent wakes only when a unit's need changes and sends the host the VM's transitions
//! (`CPU 1` / `CPU 0`, `IO 1` / `IO 0`). The protocol logic is in [`core`], per resource: if the host denies the
//! registration, or the operator disables a resource, its detector is detached and the agent
//! waits for `ENABLE`.
//!
//! The loop (`Agent::run`): carry out what the core asked for, wait for the port, the
//! detectors or the next deadline (`ppoll`), read the host's frames, drain the detectors into the
//! core, tick.

pub mod core;
mod cpu;
mod detector;
mod io;
pub mod membw;
#[cfg(test)]
mod watch_model;

pub use membw::{membw_request, MEMBW_SOCKET};

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use cosched_proto::{Event, Frame, Resource, StreamDecoder};

use crate::core::{AgentCore, Config, Out};
use crate::detector::{Detector, Loaded, Transition, DETECTORS};

/// The port name the host side is configured with (`virtserialport,name=org.cosched.0`).
pub const PORT_NAME: &str = "org.cosched.0";

#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// The virtio-serial port to the host [default: the port named org.cosched.0, found in
    /// /sys/class/virtio-ports/*/name]
    #[arg(long)]
    pub port: Option<PathBuf>,
    /// MIN_BOOST_TIME: a boost lasts at least this long after the last task that needed it
    #[arg(long, default_value_t = 500)]
    pub min_boost_us: u64,
    /// When needs recur with a period below this, hold the boost for 2 periods + MIN_BOOST_TIME
    /// instead of MIN_BOOST_TIME, so a periodic RT task keeps its VM boosted between activations,
    /// even past one late activation (0: off, every boost ends MIN_BOOST_TIME after the need). The default covers the
    /// common 1 to 20 ms control periods with room for jitter: a bound equal to a task's period
    /// would flip between holding and not holding from one activation to the next
    #[arg(long, default_value_t = 25_000)]
    pub hold_periodic_max_us: u64,
    /// Deboost a CPU that runs a task needing no boost for this long without a context switch
    /// (a lone CPU hog); must be well above MIN_BOOST_TIME
    #[arg(long, default_value_t = 20)]
    pub idle_deboost_ms: u64,
    /// The new-task heuristic's count mode (with --watch-budget-ms 0, the design's original): a
    /// new task gets this many boosted switch-ins, plus one per wake-up from a sleep. With
    /// --watch-budget-ms 0, 0 turns the new-task heuristic off
    #[arg(long, default_value_t = 8)]
    pub watch_count: u32,
    /// The new-task heuristic (budget mode, the default): a new task keeps its VM boosted for
    /// this much of its own run time, and as much again of waiting runnable while the guest runs
    /// other tasks, plus what its sleeps earn back (--watch-refill-us each), and at most
    /// --watch-max tasks are watched at once; a CPU-bound newcomer is released once it has run
    /// this long. 0: the count mode (--watch-count) instead
    #[arg(long, default_value_t = 1_000)]
    pub watch_budget_ms: u64,
    /// Budget mode: run time, and waiting, a watched task earns back with each wake-up from a
    /// sleep (up to its whole budget)
    #[arg(long, default_value_t = 2_000)]
    pub watch_refill_us: u64,
    /// Budget mode: the most tasks watched at once; newcomers past it are not watched
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub watch_max: u32,
    /// I/O: report that the guest's BFQ has no weight-raised busy queue left (`IO 0`) only once
    /// none has been seen for this long (0: at once). An application's queue
    /// empties between its reads while other queues are served, so without a hold one
    /// application start flips `IO 1` / `IO 0` at nearly every read
    #[arg(long, default_value_t = 50)]
    pub io_hold_ms: u64,
    /// Predictive boost: right after each `CPU 0`, tell the host when the guest's next RT wake-up
    /// is due (`WAKE`), from the timer an RT task sleeps on (else from the period of recurring RT
    /// needs), so that it can boost the VM just before. Meant for `--hold-periodic-max-us 0
    /// --idle-deboost-ms 1` (deboosted between activations). Stops by itself when the
    /// host refuses `WAKE` as unsupported, until the next registration
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub predict: bool,
    /// Standing predictions: once 4 predicted wake-ups in a row each came one period after the
    /// one before (a periodic RT task), tell the host the period with the next (one `WAKE`): it
    /// then boosts every period by itself, and the guest sends nothing while its RT wake-ups fall
    /// inside the host's boost (an activation outside it is boosted as any other). A new period
    /// replaces it; the host's budget or the task's end stops it. Stops by itself when the host
    /// refuses the form, until the next registration
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub predict_standing: bool,
    /// Predict only wake-ups due within this many ms; a later one is not sent (and a standing one
    /// is withdrawn)
    #[arg(long, default_value_t = 1000)]
    pub predict_horizon_ms: u64,
    /// For measuring the channel's cost, not for use: at every RT activation that finds its CPU
    /// boosted already (so no `CPU 1` goes out), send the host a frame it acknowledges and that
    /// changes nothing (`WAKE 0` while no prediction stands), as a `CPU 1` would go out at that
    /// moment on a CPU not boosted. With the default hold, it adds one frame (and its reply) per
    /// period of a periodic RT task, and no class change on the host
    #[arg(long)]
    pub probe_frames: bool,
    /// After the host ends a boost for budget reasons, wait this long before asking again
    #[arg(long, default_value_t = 100)]
    pub budget_backoff_ms: u64,
    /// Run the agent itself at SCHED_FIFO with this priority (0: leave it at SCHED_OTHER)
    #[arg(long, default_value_t = 0)]
    pub rt_priority: u32,
    /// Print the agent's and the detectors' counters every N seconds (and at exit): frames sent
    /// (boosts, deboosts, priority changes, WAKEs sent / withdrawn / acked / denied), the measured
    /// round trip
    #[arg(long)]
    pub stats_interval_s: Option<u64>,
    /// The local memory-bandwidth API (root only, unless --membw-group): an application asks for a
    /// share of the host's guaranteed memory bandwidth with `cosched request-membw <permille>`,
    /// the agent relays it (`MEMBW`) and answers with what the host granted
    #[arg(long, default_value = MEMBW_SOCKET)]
    pub membw_socket: PathBuf,
    /// Also let the members of this group (a name or a gid) ask: the socket becomes theirs, 0660
    #[arg(long, value_name = "GROUP")]
    pub membw_group: Option<String>,
    /// No memory-bandwidth API (MEMBW is then not offered to the host)
    #[arg(long)]
    pub no_membw: bool,
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
        // SA_RESTART so that ppoll() returns EINTR and the loop sees STOP.
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

pub(crate) fn log(msg: &str) {
    eprintln!("cosched-guest: {msg}");
}

fn set_rt_priority(prio: u32) -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: prio as i32 };
    // SAFETY: sched_setscheduler on ourselves with a valid param.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// How often each attached detector's own state is compared with what the agent believes.
const RECONCILE_EVERY: Duration = Duration::from_millis(100);
/// The longest wait with the host connected and nothing due.
const IDLE_WAIT: Duration = Duration::from_millis(100);
/// How often a closed channel is checked for the host's return.
const DISCONNECTED_WAIT: Duration = Duration::from_millis(500);

/// Runs the agent until SIGTERM/SIGINT (then deregisters), or until nothing is left to
/// coordinate: no detector can load here, or the host grants none of them.
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
    let port = Port::open(&path, opts.verbose)?;
    log(&format!("using {}", path.display()));
    let loaded = probe_detectors(&opts)?;
    let loadable: Vec<Resource> = loaded.keys().copied().collect();
    let api = if opts.no_membw {
        None
    } else {
        match membw::Api::bind(&opts.membw_socket, opts.membw_group.as_deref()) {
            Ok(api) => {
                log(&format!("memory-bandwidth API at {}", opts.membw_socket.display()));
                Some(api)
            }
            // Asked for by name: a group that cannot be given the socket is an error.
            Err(e) if opts.membw_group.is_some() => return Err(e),
            Err(e) => {
                log(&format!("no memory-bandwidth API: {e:#}"));
                None
            }
        }
    };
    let core = AgentCore::new(
        Config {
            budget_backoff_ns: opts.budget_backoff_ms * 1_000_000,
            predict: opts.predict,
            predict_standing: opts.predict_standing,
            predict_horizon_ns: opts.predict_horizon_ms * 1_000_000,
            membw: api.is_some(),
            ..Config::default()
        },
        &loadable,
    );
    let stats_every = opts.stats_interval_s.map(|s| Duration::from_secs(s.max(1)));
    let start = Instant::now();
    let mut agent = Agent {
        start,
        port,
        core,
        detectors: BTreeMap::new(),
        loaded,
        out: Vec::new(),
        transitions: Vec::new(),
        next_reconcile: start,
        stats_every,
        stats_due: stats_every.map(|d| start + d),
        api,
        opts,
    };
    agent.run()
}

/// Probes every detector by loading it: the resources whose detector can load here, with what
/// they loaded (for their first attach). Those that cannot are reported once, with why; if none
/// can, there is nothing to do.
fn probe_detectors(opts: &Options) -> anyhow::Result<BTreeMap<Resource, Box<dyn Loaded>>> {
    let mut loadable = BTreeMap::new();
    let mut failed = Vec::new();
    for d in DETECTORS {
        match (d.load)(opts) {
            Ok(l) => {
                loadable.insert(d.resource, l);
            }
            Err(e) => failed.push(format!("{}: {e:#}", d.resource)),
        }
    }
    if loadable.is_empty() {
        bail!("no detector can load here ({})", failed.join("; "));
    }
    for why in failed {
        log(&format!("unsupported here, the other detectors keep working: {why}"));
    }
    Ok(loadable)
}

/// The virtio-serial port to the host.
struct Port {
    file: fs::File,
    /// False while the host's end is closed (the port reports POLLHUP) or a write failed.
    connected: bool,
    decoder: StreamDecoder,
    verbose: bool,
}

impl Port {
    fn open(path: &Path, verbose: bool) -> anyhow::Result<Port> {
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(Port { file, connected: true, decoder: StreamDecoder::new(), verbose })
    }

    fn send(&mut self, f: Frame) {
        if self.verbose {
            log(&format!("-> {f}"));
        }
        if let Err(e) = self.file.write_all(&f.encode()) {
            if self.verbose || self.connected {
                log(&format!("host not reachable ({e}); will retry"));
            }
            self.connected = false;
        }
    }

    /// Reads what the host sent and appends its frames to `into`.
    fn read_frames(&mut self, into: &mut Vec<Frame>) {
        let mut buf = [0u8; 256];
        match self.file.read(&mut buf) {
            Ok(0) => {}
            Ok(n) => {
                self.decoder.push(&buf[..n]);
                while let Some(ev) = self.decoder.next_event() {
                    match ev {
                        Event::Frame(f) => {
                            if self.verbose {
                                log(&format!("<- {f}"));
                            }
                            into.push(f);
                        }
                        other => log(&format!("unexpected bytes from the host: {other:?}")),
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => log(&format!("reading the port: {e}")),
        }
    }

    /// While disconnected: whether the host's end is open again (the port stops reporting
    /// POLLHUP).
    fn is_back(&self) -> bool {
        let mut p = [libc::pollfd { fd: self.file.as_raw_fd(), events: libc::POLLOUT, revents: 0 }];
        ppoll(&mut p, Duration::ZERO).is_ok() && p[0].revents & libc::POLLHUP == 0 && p[0].revents & libc::POLLOUT != 0
    }
}

/// `ppoll(2)`: unlike `poll(2)` the timeout has nanosecond resolution, so a deadline under a
/// millisecond away is waited for, not spun on.
fn ppoll(fds: &mut [libc::pollfd], timeout: Duration) -> std::io::Result<()> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `fds` is a valid, writable array of `fds.len()` pollfd; `ts` is a valid timespec
    // that outlives the call; a null signal mask keeps ours (ppoll then behaves like poll).
    let rc = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, std::ptr::null()) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// What woke the agent up.
struct Ready {
    port_in: bool,
    port_hup: bool,
    api: bool,
}

/// The agent: the port, the pure protocol logic, and the attached detectors.
struct Agent {
    opts: Options,
    start: Instant,
    port: Port,
    core: AgentCore,
    detectors: BTreeMap<Resource, Box<dyn Detector>>,
    /// The detectors the probe loaded, until the host's grant is known: the first attach of each
    /// uses its load (a second load cost as much again: under TCG about 0.8 s per detector).
    loaded: BTreeMap<Resource, Box<dyn Loaded>>,
    /// What the core asked for and the agent has not carried out yet.
    out: Vec<Out>,
    transitions: Vec<Transition>,
    next_reconcile: Instant,
    stats_every: Option<Duration>,
    stats_due: Option<Instant>,
    /// The local memory-bandwidth API, if on.
    api: Option<membw::Api>,
}

impl Agent {
    /// The core's clock: nanoseconds since the start.
    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// The main loop, until SIGTERM/SIGINT or [`Out::Exit`].
    fn run(&mut self) -> anyhow::Result<()> {
        while !STOP.load(Ordering::Relaxed) {
            self.carry_out()?;
            let Some(ready) = self.wait()? else { continue };
            let t = self.now();
            if let Some(api) = self.api.as_mut() {
                if ready.api {
                    for (client, share) in api.accept() {
                        self.core.membw_request(share, client, t, &mut self.out);
                    }
                }
                api.expire();
            }
            if self.port.connected && ready.port_in {
                let mut frames = Vec::new();
                self.port.read_frames(&mut frames);
                for f in frames {
                    self.core.on_frame(f, t, &mut self.out);
                }
            }
            if self.port.connected && ready.port_hup && !ready.port_in {
                log("the host closed the channel; waiting for it to come back");
                self.port.connected = false;
                self.core.on_disconnected(&mut self.out);
                continue;
            }
            if !self.port.connected {
                if self.port.is_back() {
                    log("the host channel is back");
                    self.port.connected = true;
                    self.core.on_disconnected(&mut self.out);
                }
                continue;
            }
            self.drain_detectors(t);
            self.core.tick(t, &mut self.out);
        }
        self.stop()
    }

    /// Carries out what the core asked for, including what it asks while this runs (an attach
    /// that fails is reported back to it).
    fn carry_out(&mut self) -> anyhow::Result<()> {
        while !self.out.is_empty() {
            let mut decided = false;
            for o in std::mem::take(&mut self.out) {
                match o {
                    Out::Send(f) => self.port.send(f),
                    Out::Attach(r) => {
                        self.attach(r);
                        decided = true;
                    }
                    Out::Detach(r) => {
                        self.detach(r);
                        decided = true;
                    }
                    Out::Exit(msg) => {
                        for r in self.detectors.keys().copied().collect::<Vec<_>>() {
                            self.detach(r);
                        }
                        bail!("{msg}");
                    }
                    Out::Log(msg) => log(&msg),
                    Out::Standing(w) => {
                        if let Some(d) = self.detectors.get_mut(&Resource::Cpu) {
                            d.set_standing(w);
                        }
                    }
                    Out::MembwReply { client, result } => {
                        if let Some(api) = self.api.as_mut() {
                            api.reply(client, &result);
                        }
                    }
                }
            }
            // The host's grant is known (one ACK answers for every resource): what it did not
            // grant is unloaded, not kept for a later attach (which loads afresh).
            if decided {
                self.loaded.clear();
            }
        }
        Ok(())
    }

    fn attach(&mut self, r: Resource) {
        let Some(kind) = DETECTORS.iter().find(|d| d.resource == r) else {
            return self.core.on_attach_failed(r, "this agent has no detector for it", &mut self.out);
        };
        let loaded = match self.loaded.remove(&r) {
            Some(l) => Ok(l),
            None => (kind.load)(&self.opts),
        };
        match loaded.and_then(|l| l.attach()) {
            Ok(d) => {
                log(&format!("detectors attached: {r} ({})", d.units()));
                self.detectors.insert(r, d);
            }
            Err(e) => self.core.on_attach_failed(r, &format!("{e:#}"), &mut self.out),
        }
    }

    fn detach(&mut self, r: Resource) {
        if let Some(d) = self.detectors.remove(&r) {
            print_stats(&*d);
            drop(d);
            log(&format!("detectors detached: {r}"));
        }
    }

    /// Waits for the port, the detectors or the core's next deadline; `None` if a signal came.
    fn wait(&self) -> anyhow::Result<Option<Ready>> {
        let t = self.now();
        let mut timeout = if self.port.connected { IDLE_WAIT } else { DISCONNECTED_WAIT };
        if let (true, Some(n)) = (self.port.connected, self.core.next_tick(t)) {
            timeout = timeout.min(Duration::from_nanos(n.saturating_sub(t)));
        }
        // A closed port reports POLLHUP without end: then only wait, and probe it after.
        let port_events = if self.port.connected { libc::POLLIN } else { 0 };
        let mut fds = vec![libc::pollfd { fd: self.port.file.as_raw_fd(), events: port_events, revents: 0 }];
        if let Some(api) = &self.api {
            fds.push(libc::pollfd { fd: api.fd(), events: libc::POLLIN, revents: 0 });
        }
        fds.extend(self.detectors.values().map(|d| libc::pollfd { fd: d.poll_fd(), events: libc::POLLIN, revents: 0 }));
        match ppoll(&mut fds, timeout) {
            Ok(()) => Ok(Some(Ready {
                port_in: fds[0].revents & libc::POLLIN != 0,
                port_hup: fds[0].revents & libc::POLLHUP != 0,
                api: self.api.is_some() && fds[1].revents & libc::POLLIN != 0,
            })),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(None),
            Err(e) => Err(e).context("ppoll"),
        }
    }

    /// Hands each detector's transitions to the core, reconciles with the detectors' own state
    /// now and then (events can be lost when a ring buffer is full), and prints the counters
    /// when due.
    fn drain_detectors(&mut self, t: u64) {
        let now = Instant::now();
        let reconcile = now >= self.next_reconcile;
        if reconcile {
            self.next_reconcile = now + RECONCILE_EVERY;
        }
        let print = match (self.stats_due, self.stats_every) {
            (Some(due), Some(every)) if now >= due => {
                self.stats_due = Some(due + every);
                true
            }
            _ => false,
        };
        if print {
            log(&format!("agent stats: {}", self.core.stats()));
        }
        for (r, d) in &mut self.detectors {
            let deboosts = self.core.counters.deboosts_sent;
            self.transitions.clear();
            d.drain(self.opts.verbose, &mut self.transitions);
            for tr in &self.transitions {
                self.core.on_need(*r, tr.unit, tr.want, t, &mut self.out);
            }
            if reconcile {
                self.core.reconcile_needs(*r, &d.wants(), t, &mut self.out);
                if *r == Resource::Cpu && self.core.standing().is_some() {
                    self.core.standing_check(d.silent_activations(), t, &mut self.out);
                }
            }
            // Right after a CPU 0, or when a prediction was withdrawn: the next wake-up. With
            // --verbose it is logged at every CPU 0, predicting or not, so that predictions can be
            // compared with the boosts that follow (the same clock as the events' timestamps).
            let deboosted = *r == Resource::Cpu && self.core.counters.deboosts_sent != deboosts;
            if d.take_withdrawn()
                || (*r == Resource::Cpu && self.core.prediction_due())
                || (deboosted && self.opts.verbose)
            {
                let p = d.next_wake();
                if self.opts.verbose {
                    log(&match p {
                        Some(p) => format!(
                            "next RT wake-up in {} µs at {} µs, priority {}",
                            p.in_ns / 1000,
                            p.at_ns / 1000,
                            p.priority
                        ),
                        None => "next RT wake-up: none predicted".into(),
                    });
                }
                self.core.predict(p, t, &mut self.out);
            }
            for _ in 0..d.take_episodes() {
                self.core.probe(t, &mut self.out);
            }
            if print {
                print_stats(&**d);
            }
        }
    }

    /// SIGTERM/SIGINT: detach everything and deregister.
    fn stop(&mut self) -> anyhow::Result<()> {
        log("stopping: deregistering");
        self.core.stop(&mut self.out);
        self.carry_out()?;
        let c = &self.core.counters;
        log(&format!(
            "sent {} boost(s), {} deboost(s), {} priority change(s), {} WAKE(s) ({} acked, {} denied) and {} WAKE 0; \
             {} budget denial(s)",
            c.boosts_sent,
            c.deboosts_sent,
            c.priority_changes,
            c.wakes_sent,
            c.wakes_acked,
            c.wakes_denied,
            c.wake_withdrawals,
            c.budget_denials
        ));
        log(&format!("agent stats: {}", self.core.stats()));
        Ok(())
    }
}

fn print_stats(d: &dyn Detector) {
    log(&format!("{} detector stats: {}", d.resource(), d.stats()));
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
