//! The agent's protocol logic, without I/O, generic over resources: registration with the
//! capabilities of the detectors that can load, attaching exactly the ones the host grants,
//! turning each resource's per-unit transitions into `CPU 1` / `IO 0`... frames (only on
//! change), and reacting to the host's replies, per resource.
//!
//! Each resource has its own state: what it wants, what the host has, the seq of its last
//! request and its backoff. A `DENY` that names a resource, `DISABLE` and `ENABLE` affect only the
//! resources they name; `DENY(not_registered)` and a denial of the `REGISTER` affect all. The
//! agent runs as long as a resource is granted or may be enabled; it exits only when no detector
//! can run or the host supports none of them.
//!
//! The CPU resource's `CPU 1` names the need (`cosched_proto::cpu::Need`): the highest RT priority
//! among the CPUs that want a boost, and whether one of them was woken from an interrupt. A change
//! of that priority while the host has the boost is sent as a new `CPU 1`; the interrupt flag alone
//! never causes a frame, it rides on the next one.
//!
//! Predictive boost: right after a `CPU 0`, the I/O layer hands [`AgentCore::predict`] the guest's
//! next RT wake-up (from the detector); if it is within the horizon the core sends `WAKE` with the
//! delay until then, minus the frame's estimated one-way transit: half the median round trip of
//! the agent's last 16 requests (send to `ACK`/`DENY`, on the guest's clock; it includes the
//! host's handling and the agent's own wake-up to read the reply, so it errs towards an early
//! boost; a median, so that a few replies read late do not move it). A prediction that is withdrawn before it is
//! due is cancelled with `WAKE 0`. Replies to a `WAKE` are told apart from those to `CPU` frames by
//! their seq: `DENY(cpu: unsupported)` to a `WAKE` turns predictions off until the next
//! registration and leaves the CPU boost alone.
//!
//! Standing predictions (`predict.rs`): once [`predict::STANDING_AFTER`] predictions in a row
//! kept one period, the next goes out as a standing `WAKE` (with the period) and the host boosts
//! every period by itself. On its `ACK` the core hands the CPU detector the window around each
//! due wake-up ([`Out::Standing`]): RT activations inside it send nothing. Boosts of the guest's
//! own (another task's need, an activation outside the window) go out as always, layered on the
//! pattern by the host. The pattern ends when the predictions read after `CPU 0`s show a new one
//! (its standing `WAKE` replaces it) or none (`WAKE 0`), with a `DENY(cpu)` with seq 0 (the host
//! stopped it), or with windows left empty (the task is gone: [`AgentCore::standing_check`], then
//! `WAKE 0`). It is told again every second (the two clocks' drift).

use std::collections::VecDeque;

/// Round trips kept for the transit estimate ([`AgentCore::rtt_ns`]).
const RTT_SAMPLES: usize = 16;

use cosched_proto::cpu::Need;
use cosched_proto::{caps, DenyReason, Frame, Kind, Resource};

mod membw;
mod predict;

pub use membw::MembwGrant;
use predict::PredictState;
pub use predict::{Prediction, StandingWindow};

/// What the I/O layer must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    Send(Frame),
    /// Load and attach this resource's detector (fresh state). If that fails, tell
    /// [`AgentCore::on_attach_failed`].
    Attach(Resource),
    /// Detach and unload it: the host does not want to hear about this resource.
    Detach(Resource),
    /// Give up, with this message (nothing is left to coordinate).
    Exit(String),
    Log(String),
    /// The host's answer to a memory-bandwidth request of a local client (`client`): the share
    /// granted, or why not.
    MembwReply {
        client: u64,
        result: Result<MembwGrant, String>,
    },
    /// The CPU detector's standing-prediction window (`None`: none stands any more).
    Standing(Option<StandingWindow>),
}

/// The registration with the host (one for all resources).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// To (re)send at the next tick.
    Unregistered,
    /// REGISTER sent with this seq at this time; waiting for the reply.
    Registering { seq: u32, sent_ns: u64 },
    /// The host granted these capability bits.
    Registered { granted: u64 },
    /// The host denied the registration (`DENY(disabled)`): waiting for `ENABLE`.
    Denied,
    /// Gave up ([`Out::Exit`]).
    Finished,
}

/// Where one resource stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Its detector can run; waiting for a registration to grant it.
    Idle,
    /// Granted; its detector is attached.
    Active,
    /// Granted, then the operator disabled it: detached, waiting for `ENABLE`.
    Disabled,
    /// The registration stands without it: the host does not support it, or the operator turned
    /// it off (the host then sends `ENABLE` for it when it is back on).
    NotGranted,
    /// Its detector cannot run here: left out of every registration from now on.
    Failed,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// Resend REGISTER when no reply came within this time.
    pub register_retry_ns: u64,
    /// After the host ended a boost for budget reasons, ask again no sooner than this.
    pub budget_backoff_ns: u64,
    /// After `DENY(rate_limited)`, wait this long.
    pub rate_backoff_ns: u64,
    /// Send `WAKE` predictions (until the host refuses them as unsupported).
    pub predict: bool,
    /// Predict only wake-ups due within this time.
    pub predict_horizon_ns: u64,
    /// A prediction right after a `CPU 0` rides on it (one frame instead of two), until the host
    /// refuses that form (an older host).
    pub predict_batch: bool,
    /// A periodic RT task's wake-ups go out once as a standing prediction (see the module), until
    /// the host refuses that form (an older host).
    pub predict_standing: bool,
    /// The local memory-bandwidth API is on: `MEMBW` is offered at registration and requests
    /// are relayed.
    pub membw: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            register_retry_ns: 1_000_000_000,
            budget_backoff_ns: 100_000_000,
            rate_backoff_ns: 10_000_000,
            predict: true,
            predict_horizon_ns: 1_000_000_000,
            predict_batch: true,
            predict_standing: true,
            membw: false,
        }
    }
}

/// Requests remembered for their round trip (and to tell a reply to a `WAKE` apart).
const INFLIGHT: usize = 32;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub boosts_sent: u64,
    pub deboosts_sent: u64,
    /// `CPU 1` sent again while boosted because the need's priority changed.
    pub priority_changes: u64,
    pub acks: u64,
    pub budget_denials: u64,
    pub other_denials: u64,
    pub registrations: u64,
    /// `WAKE` with a delay (a prediction).
    pub wakes_sent: u64,
    /// `WAKE 0` (a prediction withdrawn).
    pub wake_withdrawals: u64,
    pub wakes_acked: u64,
    pub wakes_denied: u64,
    /// ... of `wakes_sent`, those that rode on their `CPU 0` (one frame).
    pub wakes_batched: u64,
    /// Channel probes (`WAKE 0` at an RT activation on a boosted CPU; `--probe-frames`).
    pub probes_sent: u64,
    /// ... of `wakes_sent`, standing predictions (with a period).
    pub standing_sent: u64,
    /// Standing predictions the host took (their windows handed to the detector).
    pub standing_acked: u64,
    /// ... and ended: a prediction out of the pattern, the host, or empty windows.
    pub standing_ended: u64,
    /// Standing predictions told again, anchored at their next wake-up (the clocks' drift).
    pub standing_reanchored: u64,
}

/// The state of one resource.
#[derive(Debug, Clone)]
pub struct ResourceState {
    pub resource: Resource,
    pub phase: Phase,
    /// What each unit (a CPU, a device) wants, and its need.
    wants: Vec<Option<Need>>,
    /// What the host has applied as far as we know (`None`: unknown, e.g. just attached).
    sent: Option<bool>,
    /// The need the last boost request named.
    sent_need: Need,
    /// Seq of the last request for this resource: only a denial of that one changes what the
    /// host has.
    last_seq: u32,
    backoff_until_ns: u64,
}

impl ResourceState {
    fn new(resource: Resource) -> ResourceState {
        ResourceState {
            resource,
            phase: Phase::Idle,
            wants: Vec::new(),
            sent: None,
            sent_need: Need::default(),
            last_seq: 0,
            backoff_until_ns: 0,
        }
    }

    /// True if any unit wants a boost.
    pub fn desired(&self) -> bool {
        self.wants.iter().any(|w| w.is_some())
    }

    /// The need of the units that want a boost: the highest priority, and an interrupt if any.
    pub fn need(&self) -> Need {
        self.wants
            .iter()
            .flatten()
            .fold(Need::default(), |a, n| Need { priority: a.priority.max(n.priority), irq: a.irq || n.irq })
    }

    /// Forgets what the detector and the host had: a detector attaches with fresh state.
    fn reset(&mut self) {
        self.wants.clear();
        self.sent = None;
        self.sent_need = Need::default();
        self.last_seq = 0;
        self.backoff_until_ns = 0;
    }

    /// Moves to `phase`, detaching the detector if it was attached.
    fn leave(&mut self, phase: Phase, out: &mut Vec<Out>) {
        if self.phase == Phase::Active {
            out.push(Out::Detach(self.resource));
        }
        self.phase = phase;
        self.reset();
    }

    fn activate(&mut self, out: &mut Vec<Out>) {
        self.phase = Phase::Active;
        self.reset();
        out.push(Out::Attach(self.resource));
    }

    fn is(&self, bits: u64) -> bool {
        bits & self.resource.cap() != 0
    }
}

#[derive(Debug, Clone)]
pub struct AgentCore {
    cfg: Config,
    pub registration: Registration,
    seq: u32,
    resources: Vec<ResourceState>,
    pub counters: Counters,
    /// Requests sent and not answered yet: (seq, kind, sent at).
    inflight: VecDeque<(u32, Kind, u64)>,
    /// The last [`RTT_SAMPLES`] round trips of requests, oldest first.
    rtts: VecDeque<u64>,
    predict: PredictState,
    /// Memory-bandwidth requests sent and not answered: (seq, client, share asked).
    membw_pending: Vec<(u32, Option<u64>, u64)>,
    /// The share the guest last asked for (sent again after a new registration), and the one
    /// the host granted.
    pub membw_wanted: u64,
    pub membw_granted: u64,
}

/// Capability bits of these resources.
fn bits<'a>(rs: impl IntoIterator<Item = &'a ResourceState>) -> u64 {
    rs.into_iter().fold(0, |b, s| b | s.resource.cap())
}

impl AgentCore {
    /// `detectors`: the resources whose detector can run here (probed by the I/O layer).
    pub fn new(cfg: Config, detectors: &[Resource]) -> AgentCore {
        let mut resources: Vec<ResourceState> = Vec::new();
        for r in detectors {
            if resources.iter().all(|s| s.resource != *r) {
                resources.push(ResourceState::new(*r));
            }
        }
        let predict = PredictState::new(&cfg);
        AgentCore {
            cfg,
            registration: Registration::Unregistered,
            seq: 0,
            resources,
            counters: Counters::default(),
            inflight: VecDeque::new(),
            rtts: VecDeque::with_capacity(RTT_SAMPLES),
            predict,
            membw_pending: Vec::new(),
            membw_wanted: 0,
            membw_granted: 0,
        }
    }

    /// The agent's counters, as `name=value` pairs.
    pub fn stats(&self) -> String {
        let c = &self.counters;
        format!(
            "boosts_sent={} deboosts_sent={} priority_changes={} acks={} budget_denials={} other_denials={} \
             registrations={} wakes_sent={} wake_withdrawals={} wakes_batched={} wakes_acked={} wakes_denied={} \
             probes_sent={} standing_sent={} standing_acked={} standing_ended={} standing_reanchored={} predicting={} \
             rtt_us={}",
            c.boosts_sent,
            c.deboosts_sent,
            c.priority_changes,
            c.acks,
            c.budget_denials,
            c.other_denials,
            c.registrations,
            c.wakes_sent,
            c.wake_withdrawals,
            c.wakes_batched,
            c.wakes_acked,
            c.wakes_denied,
            c.probes_sent,
            c.standing_sent,
            c.standing_acked,
            c.standing_ended,
            c.standing_reanchored,
            self.predict.on,
            self.rtt_ns() / 1000
        )
    }

    /// Sends a request and remembers it for its reply's round trip.
    fn send_request(&mut self, f: Frame, now: u64, out: &mut Vec<Out>) {
        if self.inflight.len() == INFLIGHT {
            self.inflight.pop_front();
        }
        self.inflight.push_back((f.seq, f.kind, now));
        out.push(Out::Send(f));
    }

    /// The request a reply answers, if remembered; its round trip is a sample for
    /// [`AgentCore::rtt_ns`]. A `REGISTER`'s is not: the host lists the VM's threads before it
    /// answers, and the agent is still starting.
    fn answered(&mut self, seq: u32, now: u64) -> Option<Kind> {
        if seq == 0 {
            return None;
        }
        let i = self.inflight.iter().position(|(s, _, _)| *s == seq)?;
        let (_, kind, sent) = self.inflight.remove(i)?;
        if kind != Kind::Register {
            if self.rtts.len() == RTT_SAMPLES {
                self.rtts.pop_front();
            }
            self.rtts.push_back(now.saturating_sub(sent).max(1));
        }
        Some(kind)
    }

    /// Where `resource` stands (`None`: this agent has no detector for it).
    pub fn phase(&self, resource: Resource) -> Option<Phase> {
        self.state(resource).map(|s| s.phase)
    }

    pub fn state(&self, resource: Resource) -> Option<&ResourceState> {
        self.resources.iter().find(|s| s.resource == resource)
    }

    fn state_mut(&mut self, resource: Resource) -> Option<&mut ResourceState> {
        self.resources.iter_mut().find(|s| s.resource == resource)
    }

    pub fn is_registered(&self) -> bool {
        matches!(self.registration, Registration::Registered { .. })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1).max(1);
        self.seq
    }

    /// What a registration offers: every resource whose detector can run.
    fn offered(&self) -> u64 {
        let membw = if self.cfg.membw { caps::MEMBW } else { 0 };
        bits(self.resources.iter().filter(|s| s.phase != Phase::Failed)) | membw
    }

    /// A detector reports a transition of one unit (a CPU) of its resource, with no need named.
    pub fn on_transition(&mut self, resource: Resource, unit: usize, want: bool, now: u64, out: &mut Vec<Out>) {
        self.on_need(resource, unit, want.then_some(Need::default()), now, out)
    }

    /// A detector reports what one unit (a CPU) of its resource needs now (`None`: nothing).
    pub fn on_need(&mut self, resource: Resource, unit: usize, want: Option<Need>, now: u64, out: &mut Vec<Out>) {
        let Some(i) = self.resources.iter().position(|s| s.resource == resource && s.phase == Phase::Active) else {
            return;
        };
        let st = &mut self.resources[i];
        if unit >= st.wants.len() {
            st.wants.resize(unit + 1, None);
        }
        st.wants[unit] = want;
        self.sync(i, now, out);
    }

    /// Replaces a resource's per-unit state wholesale (reconciliation with the detector's own),
    /// with no need named.
    pub fn reconcile(&mut self, resource: Resource, wants: &[bool], now: u64, out: &mut Vec<Out>) {
        let needs: Vec<Option<Need>> = wants.iter().map(|w| w.then_some(Need::default())).collect();
        self.reconcile_needs(resource, &needs, now, out)
    }

    /// Replaces a resource's per-unit needs wholesale (reconciliation with the detector's own).
    pub fn reconcile_needs(&mut self, resource: Resource, wants: &[Option<Need>], now: u64, out: &mut Vec<Out>) {
        let Some(i) = self.resources.iter().position(|s| s.resource == resource && s.phase == Phase::Active) else {
            return;
        };
        self.resources[i].wants = wants.to_vec();
        self.sync(i, now, out);
    }

    /// Sends a request for resource `i` if what it wants differs from what the host has (for the
    /// CPU, also if the priority of its need changed while the host has the boost).
    fn sync(&mut self, i: usize, now: u64, out: &mut Vec<Out>) {
        let st = &self.resources[i];
        let want = st.desired();
        let is_cpu = st.resource == Resource::Cpu;
        let need = st.need();
        let new_priority = is_cpu && want && st.sent == Some(true) && need.priority != st.sent_need.priority;
        // A deboost is always sent at once; a boost waits out a backoff.
        if (st.sent == Some(want) && !new_priority) || (want && now < st.backoff_until_ns) {
            return;
        }
        let Some(kind) = st.resource.request_kind() else { return };
        if st.sent.is_none() && !want {
            self.resources[i].sent = Some(false); // just attached: the host starts deboosted
            return;
        }
        let seq = self.next_seq();
        let st = &mut self.resources[i];
        st.last_seq = seq;
        st.sent = Some(want);
        let frame = if is_cpu && want {
            st.sent_need = need;
            Frame::cpu_rt(seq, need)
        } else {
            Frame::new(kind, seq, want as u64)
        };
        self.send_request(frame, now, out);
        if new_priority {
            self.counters.priority_changes += 1;
        } else if want {
            self.counters.boosts_sent += 1;
        } else {
            self.counters.deboosts_sent += 1;
        }
        if is_cpu {
            // Boosted: a standing prediction has nothing left to do. Deboosted: one is due.
            self.predict.due = !want;
            if want {
                // A standing prediction is not outstanding: the host keeps it through the boost.
                if self.predict.standing.pattern.is_none() {
                    self.predict.outstanding = None;
                }
            }
        }
    }

    /// Sends REGISTER with every resource that can still run; all start over.
    fn register(&mut self, now: u64, out: &mut Vec<Out>) {
        let offered = self.offered();
        if offered == 0 {
            return self.finish("no detector can run here".into(), out);
        }
        for st in self.resources.iter_mut().filter(|s| s.phase != Phase::Failed) {
            st.leave(Phase::Idle, out);
        }
        let seq = self.next_seq();
        self.registration = Registration::Registering { seq, sent_ns: now };
        self.counters.registrations += 1;
        // A new registration may find a host that supports predictions.
        self.predict = PredictState::new(&self.cfg);
        self.send_request(Frame::register(seq, offered), now, out);
    }

    /// Gives up: detaches everything, deregisters if registered, and exits.
    fn finish(&mut self, msg: String, out: &mut Vec<Out>) {
        for st in &mut self.resources {
            let phase = if st.phase == Phase::Failed { Phase::Failed } else { Phase::NotGranted };
            st.leave(phase, out);
        }
        if self.is_registered() {
            let seq = self.next_seq();
            out.push(Out::Send(Frame::deregister(seq)));
        }
        self.registration = Registration::Finished;
        out.push(Out::Exit(msg));
    }

    /// Exits once no detector can run: every one failed to attach. (A resource the host did not
    /// grant, or disabled, may still be enabled.)
    fn exit_if_nothing_left(&mut self, out: &mut Vec<Out>) {
        if self.offered() != 0 {
            return;
        }
        let names = caps::names(bits(&self.resources));
        self.finish(format!("nothing left to coordinate: no detector can run here ({names})"), out);
    }

    /// The I/O layer could not attach `resource`'s detector: that resource is unsupported here
    /// from now on; the others keep working.
    pub fn on_attach_failed(&mut self, resource: Resource, why: &str, out: &mut Vec<Out>) {
        let Some(st) = self.state_mut(resource) else { return };
        // Nothing was attached: no Detach.
        st.phase = Phase::Failed;
        st.reset();
        out.push(Out::Log(format!(
            "{resource}: unsupported: its detector cannot be attached ({why}); the other resources keep working"
        )));
        self.exit_if_nothing_left(out);
    }

    /// Time passes: (re)registration and the end of a backoff.
    pub fn tick(&mut self, now: u64, out: &mut Vec<Out>) {
        match self.registration {
            Registration::Unregistered => self.register(now, out),
            Registration::Registering { sent_ns, .. } if now >= sent_ns + self.cfg.register_retry_ns => {
                self.register(now, out)
            }
            Registration::Registered { .. } => {
                for i in 0..self.resources.len() {
                    if self.resources[i].phase == Phase::Active {
                        self.sync(i, now, out);
                    }
                }
            }
            _ => {}
        }
    }

    /// When [`AgentCore::tick`] next has something to do.
    pub fn next_tick(&self, now: u64) -> Option<u64> {
        match self.registration {
            Registration::Unregistered => Some(now),
            Registration::Registering { sent_ns, .. } => Some(sent_ns + self.cfg.register_retry_ns),
            Registration::Registered { .. } => self
                .resources
                .iter()
                .filter(|s| s.phase == Phase::Active && s.desired() && s.sent != Some(true))
                .map(|s| s.backoff_until_ns.max(now))
                .min(),
            _ => None,
        }
    }

    /// The channel to the host went away (or came back): start over.
    pub fn on_disconnected(&mut self, out: &mut Vec<Out>) {
        for st in self.resources.iter_mut().filter(|s| s.phase != Phase::Failed) {
            st.leave(Phase::Idle, out);
        }
        if self.registration != Registration::Finished {
            self.registration = Registration::Unregistered;
        }
    }

    /// The agent stops: detach everything and deregister if registered.
    pub fn stop(&mut self, out: &mut Vec<Out>) {
        for st in self.resources.iter_mut().filter(|s| s.phase == Phase::Active) {
            st.leave(Phase::Idle, out);
        }
        if self.is_registered() {
            let seq = self.next_seq();
            out.push(Out::Send(Frame::deregister(seq)));
        }
        self.registration = Registration::Finished;
    }

    /// A frame from the host.
    pub fn on_frame(&mut self, f: Frame, now: u64, out: &mut Vec<Out>) {
        let request = match f.kind {
            Kind::Ack | Kind::Deny => self.answered(f.seq, now),
            _ => None,
        };
        if request == Some(Kind::Wake) {
            return self.on_wake_reply(f, now, out);
        }
        if request == Some(Kind::Cpu) && self.predict.batched == Some(f.seq) {
            return self.on_batched_reply(f, now, out);
        }
        if request == Some(Kind::Membw) {
            return self.on_membw_reply(f, now, out);
        }
        match f.kind {
            Kind::Ack => match self.registration {
                Registration::Registering { seq, .. } if f.seq == seq => self.on_registered(f.value, now, out),
                // The value of an ACK to a request is what the host granted; what it has is
                // tracked from what we sent and its denials.
                _ => self.counters.acks += 1,
            },
            Kind::Deny => self.on_deny(f, now, out),
            Kind::Disable => self.on_disable(f.value, out),
            Kind::Enable => self.on_enable(f.value, now, out),
            _ => {}
        }
    }

    fn on_registered(&mut self, granted: u64, now: u64, out: &mut Vec<Out>) {
        let offered = self.offered();
        self.registration = Registration::Registered { granted };
        let ours = granted & offered;
        if ours == 0 {
            return self.finish(
                format!(
                    "the host grants none of what this guest can detect (offered {}, granted {})",
                    caps::names(offered),
                    caps::names(granted)
                ),
                out,
            );
        }
        out.push(Out::Log(format!("registered with the host; granted {}", caps::names(ours))));
        if self.membw_wanted > 0 {
            // A new registration (the host restarted): the guest's share is asked for again.
            let share = self.membw_wanted;
            self.send_membw(share, None, now, out);
        }
        for st in self.resources.iter_mut().filter(|s| s.phase != Phase::Failed) {
            if !st.is(granted) {
                st.leave(Phase::NotGranted, out);
                out.push(Out::Log(format!(
                    "{}: not granted: the host does not support it or has it turned off (it is attached if the \
                     host enables it)",
                    st.resource
                )));
            } else if st.phase == Phase::Disabled {
                // The operator disabled it while the registration was on its way: wait for ENABLE.
            } else {
                st.activate(out);
            }
        }
    }

    fn on_register_denied(&mut self, f: Frame, out: &mut Vec<Out>) {
        match f.deny_reason() {
            Some(DenyReason::Disabled) => {
                out.push(Out::Log("the host operator disabled coordination; waiting for ENABLE".into()));
                for st in self.resources.iter_mut().filter(|s| s.phase != Phase::Failed) {
                    st.leave(Phase::Idle, out);
                }
                self.registration = Registration::Denied;
            }
            Some(DenyReason::Unsupported) => {
                let offered = self.offered();
                self.finish(format!("the host does not support {} coordination", caps::names(offered)), out)
            }
            _ => {
                // Rate limited, or a reply we do not expect: the registration is retried.
                self.counters.other_denials += 1;
                out.push(Out::Log(format!("host replied {f} to our registration; will retry")));
            }
        }
    }

    fn on_deny(&mut self, f: Frame, now: u64, out: &mut Vec<Out>) {
        if matches!(self.registration, Registration::Registering { seq, .. } if seq == f.seq) {
            return self.on_register_denied(f, out);
        }
        if f.seq == 0 && f.deny_resource().is_none_or(|r| r == Resource::Cpu) {
            // The host stopped boosting by itself: a standing prediction it held is over.
            self.standing_stopped(f, now, out);
        }
        let reason = f.deny_reason();
        if reason == Some(DenyReason::NotRegistered) {
            // The host restarted or deregistered us: register again, every resource.
            out.push(Out::Log("the host says we are not registered; registering again".into()));
            return self.register(now, out);
        }
        // A denial that names a resource concerns that resource only; one that names none (an
        // older host, seq 0 or a reply) concerns all, and each resource checks the seq.
        let named = f.deny_resource();
        let concerned = |st: &ResourceState| named.is_none_or(|r| r == st.resource);
        // The host's own end of a boost (seq 0), or a refusal of this resource's latest request;
        // a refusal of an older one says nothing about what the host has now.
        let about_now = |st: &ResourceState| f.seq == 0 || f.seq == st.last_seq;
        match reason {
            Some(DenyReason::Disabled) => {
                if self.resources.iter().any(|s| concerned(s) && s.phase == Phase::Active) {
                    out.push(Out::Log("the host operator disabled coordination; waiting for ENABLE".into()));
                }
                for st in self.resources.iter_mut().filter(|s| concerned(s) && s.phase == Phase::Active) {
                    st.leave(Phase::Disabled, out);
                }
            }
            Some(DenyReason::Unsupported) => {
                self.counters.other_denials += 1;
                let mut any = false;
                for st in self
                    .resources
                    .iter_mut()
                    .filter(|s| concerned(s) && s.phase == Phase::Active && (named.is_some() || f.seq == s.last_seq))
                {
                    out.push(Out::Log(format!("{}: the host no longer supports it ({f}); detaching", st.resource)));
                    st.leave(Phase::NotGranted, out);
                    any = true;
                }
                if !any {
                    out.push(Out::Log(format!("host replied {f}")));
                }
            }
            Some(DenyReason::Malformed) | None => {
                self.counters.other_denials += 1;
                out.push(Out::Log(format!("host replied {f}")));
            }
            // Budget, rate, and any other refusal (e.g. a share the host keeps for itself): only
            // boosts are refused that way, so the host does not have this one.
            Some(r) => {
                let backoff = match r {
                    DenyReason::Budget => {
                        self.counters.budget_denials += 1;
                        self.cfg.budget_backoff_ns
                    }
                    DenyReason::RateLimited => {
                        self.counters.other_denials += 1;
                        self.cfg.rate_backoff_ns
                    }
                    _ => {
                        self.counters.other_denials += 1;
                        self.cfg.budget_backoff_ns
                    }
                };
                for st in self.resources.iter_mut().filter(|s| concerned(s) && s.phase == Phase::Active && about_now(s))
                {
                    // The host ended (or refused) a boost: it is deboosted now.
                    st.sent = Some(false);
                    st.backoff_until_ns = now + backoff;
                }
            }
        }
    }

    fn on_disable(&mut self, disabled: u64, out: &mut Vec<Out>) {
        let registering = matches!(self.registration, Registration::Registering { .. });
        if self.resources.iter().any(|s| s.is(disabled) && s.phase == Phase::Active) {
            out.push(Out::Log("the host operator disabled coordination; detaching".into()));
        }
        for st in self.resources.iter_mut().filter(|s| s.is(disabled)) {
            match st.phase {
                Phase::Active => st.leave(Phase::Disabled, out),
                // Not attached yet: once granted, it waits for ENABLE.
                Phase::Idle if registering => st.phase = Phase::Disabled,
                _ => {}
            }
        }
    }

    fn on_enable(&mut self, enabled: u64, now: u64, out: &mut Vec<Out>) {
        match self.registration {
            Registration::Denied if enabled & self.offered() != 0 => {
                out.push(Out::Log("the host operator enabled coordination; registering".into()));
                self.register(now, out);
            }
            Registration::Registered { .. } => {
                // The registration stands: attach what the operator had turned off (disabled at
                // run time, or granted but off at registration).
                let again: Vec<usize> = (0..self.resources.len())
                    .filter(|&i| {
                        let st = &self.resources[i];
                        st.is(enabled) && matches!(st.phase, Phase::Disabled | Phase::NotGranted)
                    })
                    .collect();
                if again.is_empty() {
                    return;
                }
                // Attaching a detector registers its hooks with the kernel (tracepoint probes);
                // the registration with the host is kept.
                let names = caps::names(bits(again.iter().map(|&i| &self.resources[i])));
                out.push(Out::Log(format!(
                    "the host operator enabled coordination; registering the {names} detector's hooks again \
                     (the registration with the host stands)"
                )));
                for i in again {
                    self.resources[i].activate(out);
                }
            }
            Registration::Registering { .. } => {
                for st in self.resources.iter_mut().filter(|s| s.is(enabled) && s.phase == Phase::Disabled) {
                    st.phase = Phase::Idle;
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
