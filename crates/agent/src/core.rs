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

use std::collections::VecDeque;

/// Round trips kept for the transit estimate ([`AgentCore::rtt_ns`]).
const RTT_SAMPLES: usize = 16;

use cosched_proto::cpu::Need;
use cosched_proto::{caps, DenyReason, Frame, Kind, Resource};

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
}

/// What the host granted a `MEMBW` request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MembwGrant {
    pub asked: u64,
    pub granted: u64,
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
            membw: false,
        }
    }
}

/// The guest's next predicted wake-up that needs a boost: due `in_ns` from when it was read, for a
/// task of RT priority `priority`; `at_ns` is that time on the guest's `CLOCK_MONOTONIC` (the
/// clock of the detector's event timestamps: for logs, the core uses `in_ns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prediction {
    pub in_ns: u64,
    pub at_ns: u64,
    pub priority: u8,
}

/// Two predictions of one wake-up, read at different times, differ by rounding and the transit
/// estimate's drift: within this they are the same and no new `WAKE` goes out.
const SAME_WAKE_NS: u64 = 50_000;
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
}

/// Predictive boost's state.
#[derive(Debug, Clone, Default)]
struct PredictState {
    /// Predictions go out (the configuration, until the host refuses them).
    on: bool,
    /// A `CPU 0` went out since the last [`AgentCore::predict`].
    due: bool,
    /// The last `WAKE` that still stands: the predicted wake-up on the core's clock (without the
    /// transit correction) and its priority.
    outstanding: Option<(u64, u8)>,
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
        let predict = PredictState { on: cfg.predict, ..PredictState::default() };
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

    /// A local client asks for a memory-bandwidth share (permille; 0 gives it back). The host's
    /// answer comes back as [`Out::MembwReply`]; without a registration the client is told at once.
    pub fn membw_request(&mut self, share: u64, client: u64, now: u64, out: &mut Vec<Out>) {
        if !self.cfg.membw {
            let result = Err("the memory-bandwidth API is off in this agent".to_string());
            return out.push(Out::MembwReply { client, result });
        }
        if !self.is_registered() {
            let result = Err("the agent is not registered with the host (yet): try again".to_string());
            return out.push(Out::MembwReply { client, result });
        }
        self.membw_wanted = share;
        self.send_membw(share, Some(client), now, out);
    }

    fn send_membw(&mut self, share: u64, client: Option<u64>, now: u64, out: &mut Vec<Out>) {
        let seq = self.next_seq();
        if self.membw_pending.len() == INFLIGHT {
            self.membw_pending.remove(0);
        }
        self.membw_pending.push((seq, client, share));
        self.send_request(Frame::new(Kind::Membw, seq, share), now, out);
    }

    /// The host's reply to a `MEMBW`.
    fn on_membw_reply(&mut self, f: Frame, now: u64, out: &mut Vec<Out>) {
        let Some(i) = self.membw_pending.iter().position(|p| p.0 == f.seq) else { return };
        let (_, client, asked) = self.membw_pending.remove(i);
        let result = if f.kind == Kind::Ack {
            self.membw_granted = f.value;
            out.push(Out::Log(format!("membw: asked {asked}‰, the host granted {}‰", f.value)));
            Ok(MembwGrant { asked, granted: f.value })
        } else {
            let reason = f.deny_reason();
            if asked == self.membw_wanted {
                self.membw_granted = 0;
            }
            out.push(Out::Log(format!("membw: asked {asked}‰, the host replied {f}")));
            let why = match reason {
                Some(DenyReason::Unsupported) => {
                    "unsupported: the host cannot regulate memory bandwidth (its `cosched status` says why)".to_string()
                }
                Some(DenyReason::Budget) => "budget: the host's guaranteed bandwidth is all given out".to_string(),
                Some(DenyReason::Disabled) => "disabled: the host's operator turned membw off".to_string(),
                Some(r) => r.name().to_string(),
                None => format!("{f}"),
            };
            if reason == Some(DenyReason::NotRegistered) {
                self.on_deny(f, now, out);
            }
            Err(why)
        };
        if let Some(client) = client {
            out.push(Out::MembwReply { client, result });
        }
    }

    /// The round trip of the agent's requests, in ns (0: none measured yet): the median (the
    /// lower one of an even count) of the last [`RTT_SAMPLES`]. A median, not a mean: a reply read
    /// late because the agent or the whole guest was not running (the first ones after start-up,
    /// say, or a TCG guest's stall) says nothing about the channel, and would make every `WAKE`
    /// that follows that much early; a lasting change wins within half the window.
    pub fn rtt_ns(&self) -> u64 {
        let mut v: Vec<u64> = self.rtts.iter().copied().collect();
        v.sort_unstable();
        v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
    }

    /// Predictions are on (configured, and not refused by the host since the registration).
    pub fn predicting(&self) -> bool {
        self.predict.on
    }

    /// The agent's counters, as `name=value` pairs.
    pub fn stats(&self) -> String {
        let c = &self.counters;
        format!(
            "boosts_sent={} deboosts_sent={} priority_changes={} acks={} budget_denials={} other_denials={} \
             registrations={} wakes_sent={} wake_withdrawals={} wakes_acked={} wakes_denied={} predicting={} \
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
            c.wakes_acked,
            c.wakes_denied,
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

    /// True if a `CPU 0` went out since the last [`AgentCore::predict`]: the I/O layer then reads
    /// the detector's prediction and hands it over.
    pub fn prediction_due(&self) -> bool {
        self.predict.due && self.predict.on
    }

    /// The guest's next wake-up that needs the CPU (`None`: none known), read now; called right
    /// after a `CPU 0` ([`AgentCore::prediction_due`]) and when the detector withdraws a
    /// prediction. While the host is deboosted: a prediction within the horizon goes out as
    /// `WAKE`, unless the same one already stands; one that stands and is no longer predicted (or
    /// is beyond the horizon) is withdrawn with `WAKE 0`.
    pub fn predict(&mut self, p: Option<Prediction>, now: u64, out: &mut Vec<Out>) {
        self.predict.due = false;
        if !self.predict.on || !self.is_registered() {
            return;
        }
        let Some(cpu) = self.state(Resource::Cpu) else { return };
        if cpu.phase != Phase::Active || cpu.sent != Some(false) {
            return; // boosted (the host needs no prediction), or not coordinating the CPU
        }
        let wanted = p.filter(|p| p.in_ns <= self.cfg.predict_horizon_ns);
        if let (Some(p), Some((at, prio))) = (wanted, self.predict.outstanding) {
            if prio == p.priority && (now + p.in_ns).abs_diff(at) <= SAME_WAKE_NS {
                return;
            }
        }
        // The frame is read by the host about one transit after it is sent: say that much less.
        let transit = self.rtt_ns() / 2;
        let delay_us = wanted.map_or(0, |p| (p.in_ns.saturating_sub(transit) / 1000).min(u32::MAX as u64) as u32);
        if let (Some(p), true) = (wanted, delay_us > 0) {
            let seq = self.next_seq();
            self.predict.outstanding = Some((now + p.in_ns, p.priority));
            self.counters.wakes_sent += 1;
            self.send_request(Frame::wake(seq, delay_us, p.priority), now, out);
        } else if self.predict.outstanding.take().is_some_and(|(at, _)| at > now) {
            let seq = self.next_seq();
            self.counters.wake_withdrawals += 1;
            self.send_request(Frame::wake(seq, 0, 0), now, out);
        }
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
                self.predict.outstanding = None;
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
        self.predict = PredictState { on: self.cfg.predict, ..PredictState::default() };
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

    /// The host's reply to a `WAKE`: it concerns the prediction only, never the CPU boost.
    fn on_wake_reply(&mut self, f: Frame, now: u64, out: &mut Vec<Out>) {
        if f.kind == Kind::Ack {
            self.counters.wakes_acked += 1;
            return;
        }
        match f.deny_reason() {
            // The host lost our registration: that concerns everything.
            Some(DenyReason::NotRegistered) => self.on_deny(f, now, out),
            reason => {
                self.counters.wakes_denied += 1;
                self.predict.outstanding = None;
                if reason == Some(DenyReason::Unsupported) && self.predict.on {
                    self.predict.on = false;
                    out.push(Out::Log(format!(
                        "predictive boost: the host does not support WAKE ({f}); no more predictions until the \
                         next registration"
                    )));
                }
            }
        }
    }

    fn on_deny(&mut self, f: Frame, now: u64, out: &mut Vec<Out>) {
        if matches!(self.registration, Registration::Registering { seq, .. } if seq == f.seq) {
            return self.on_register_denied(f, out);
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
mod tests {
    use super::*;
    use cosched_proto::Resource::{Cpu, Io};

    fn io(seq: u32, boost: bool) -> Frame {
        Frame::new(Kind::Io, seq, boost as u64)
    }

    fn registered() -> (AgentCore, u32) {
        let mut a = AgentCore::new(Config::default(), &[Cpu]);
        let mut out = Vec::new();
        a.tick(0, &mut out);
        assert_eq!(out, vec![Out::Send(Frame::register(1, caps::CPU))]);
        out.clear();
        a.on_frame(Frame::ack(1, caps::CPU), 1, &mut out);
        assert!(out.contains(&Out::Attach(Cpu)));
        assert_eq!(a.phase(Cpu), Some(Phase::Active));
        (a, 1)
    }

    /// Registered with CPU and I/O detectors, the host granting both.
    fn registered_both() -> AgentCore {
        let mut a = AgentCore::new(Config::default(), &[Cpu, Io]);
        let mut out = Vec::new();
        a.tick(0, &mut out);
        assert_eq!(sent(&out), vec![Frame::register(1, caps::CPU | caps::IO)]);
        out.clear();
        a.on_frame(Frame::ack(1, caps::CPU | caps::IO), 1, &mut out);
        assert_eq!(attached(&out), vec![Out::Attach(Cpu), Out::Attach(Io)]);
        a
    }

    fn sent(out: &[Out]) -> Vec<Frame> {
        out.iter().filter_map(|o| if let Out::Send(f) = o { Some(*f) } else { None }).collect()
    }

    fn attached(out: &[Out]) -> Vec<Out> {
        out.iter().filter(|o| matches!(o, Out::Attach(_) | Out::Detach(_))).cloned().collect()
    }

    fn exited(out: &[Out]) -> bool {
        out.iter().any(|o| matches!(o, Out::Exit(_)))
    }

    #[test]
    fn sends_only_transitions_of_the_whole_vm() {
        let (mut a, _) = registered();
        let mut out = Vec::new();
        a.on_transition(Cpu, 0, true, 10, &mut out);
        a.on_transition(Cpu, 1, true, 11, &mut out); // another CPU: still boosted, nothing new
        a.on_transition(Cpu, 0, false, 12, &mut out);
        a.on_transition(Cpu, 1, false, 13, &mut out);
        a.on_transition(Cpu, 1, false, 14, &mut out);
        assert_eq!(sent(&out), vec![Frame::cpu(2, true), Frame::cpu(3, false)]);
    }

    #[test]
    fn register_is_retried_until_answered() {
        let mut a = AgentCore::new(Config::default(), &[Cpu]);
        let mut out = Vec::new();
        a.tick(0, &mut out);
        assert_eq!(a.next_tick(0), Some(1_000_000_000));
        a.tick(999_999_999, &mut out);
        a.tick(1_000_000_000, &mut out);
        assert_eq!(sent(&out), vec![Frame::register(1, caps::CPU), Frame::register(2, caps::CPU)]);
        // A late ACK to the first one is not taken as the answer.
        out.clear();
        a.on_frame(Frame::ack(1, caps::CPU), 5, &mut out);
        assert!(!out.contains(&Out::Attach(Cpu)));
        a.on_frame(Frame::ack(2, caps::CPU), 5, &mut out);
        assert!(out.contains(&Out::Attach(Cpu)));
    }

    #[test]
    fn denied_registration_detaches_and_waits_for_enable() {
        let mut a = AgentCore::new(Config::default(), &[Cpu]);
        let mut out = Vec::new();
        a.tick(0, &mut out);
        a.on_frame(Frame::deny(1, DenyReason::Disabled), 1, &mut out);
        assert_eq!(a.registration, Registration::Denied);
        assert!(!out.contains(&Out::Attach(Cpu)));
        a.tick(10_000_000_000, &mut out);
        assert_eq!(sent(&out).len(), 1, "no retries while disabled");
        assert!(!exited(&out));
        out.clear();
        a.on_frame(Frame::enable(caps::CPU), 2, &mut out);
        assert_eq!(sent(&out), vec![Frame::register(2, caps::CPU)]);
        assert!(out.contains(&Out::Log("the host operator enabled coordination; registering".into())));
    }

    #[test]
    fn disable_at_run_time_detaches() {
        let (mut a, _) = registered();
        let mut out = Vec::new();
        a.on_transition(Cpu, 0, true, 10, &mut out);
        out.clear();
        a.on_frame(Frame::disable(caps::CPU), 11, &mut out);
        assert!(out.contains(&Out::Detach(Cpu)));
        assert!(out.contains(&Out::Log("the host operator disabled coordination; detaching".into())));
        assert!(!exited(&out), "disabled, not gone: it may be enabled again");
        a.on_transition(Cpu, 0, false, 12, &mut out);
        assert!(sent(&out).is_empty(), "detached: nothing sent");
        // ENABLE: the registration stands, so the detector is attached again (fresh state)
        // without registering again.
        out.clear();
        a.on_frame(Frame::enable(caps::CPU), 13, &mut out);
        assert_eq!(attached(&out), vec![Out::Attach(Cpu)]);
        assert!(out.iter().any(|o| matches!(o, Out::Log(m) if m.contains("enabled coordination; registering"))));
        assert!(sent(&out).is_empty(), "{out:?}");
        a.reconcile(Cpu, &[true], 14, &mut out);
        assert_eq!(sent(&out), vec![Frame::cpu(3, true)]);
    }

    #[test]
    fn unsupported_exits() {
        let mut a = AgentCore::new(Config::default(), &[Cpu]);
        let mut out = Vec::new();
        a.tick(0, &mut out);
        a.on_frame(Frame::deny(1, DenyReason::Unsupported), 1, &mut out);
        assert!(matches!(out.last(), Some(Out::Exit(_))));
        assert_eq!(sent(&out), vec![Frame::register(1, caps::CPU)], "not registered: no DEREGISTER");
    }

    #[test]
    fn budget_denial_backs_off_then_asks_again() {
        // Both the named denial (this protocol) and one naming no resource (an older host).
        for deny in [Frame::deny_for(0, Cpu, DenyReason::Budget), Frame::deny(0, DenyReason::Budget)] {
            let (mut a, _) = registered();
            let mut out = Vec::new();
            a.on_transition(Cpu, 0, true, 0, &mut out);
            // The host ends the boost (unsolicited DENY(budget)).
            a.on_frame(deny, 1_000, &mut out);
            out.clear();
            a.tick(50_000_000, &mut out);
            assert!(sent(&out).is_empty(), "within the backoff");
            assert_eq!(a.next_tick(50_000_000), Some(100_001_000));
            a.tick(100_001_000, &mut out);
            assert_eq!(sent(&out), vec![Frame::cpu(3, true)]);
            // If the guest no longer wants it by then, nothing is sent.
            let (mut a, _) = registered();
            a.on_transition(Cpu, 0, true, 0, &mut out);
            a.on_frame(deny, 1_000, &mut out);
            out.clear();
            a.on_transition(Cpu, 0, false, 2_000, &mut out);
            a.tick(200_000_000, &mut out);
            assert!(sent(&out).is_empty(), "{out:?}");
        }
    }

    #[test]
    fn a_denial_of_an_older_frame_does_not_change_what_the_host_has() {
        let (mut a, _) = registered();
        let mut out = Vec::new();
        a.on_transition(Cpu, 0, true, 0, &mut out); // CPU 1, seq 2
        a.on_transition(Cpu, 0, false, 1, &mut out); // CPU 0, seq 3
        a.on_transition(Cpu, 0, true, 2, &mut out); // CPU 1, seq 4
        assert_eq!(sent(&out), vec![Frame::cpu(2, true), Frame::cpu(3, false), Frame::cpu(4, true)]);
        out.clear();
        // seq 2 was refused for rate, but seq 3 and 4 went through: the host is boosted.
        a.on_frame(Frame::deny_for(2, Cpu, DenyReason::RateLimited), 3, &mut out);
        a.on_frame(Frame::ack(3, 0), 3, &mut out);
        a.on_frame(Frame::ack(4, 1), 3, &mut out);
        a.on_transition(Cpu, 0, false, 4, &mut out);
        assert_eq!(sent(&out), vec![Frame::cpu(5, false)], "the deboost must go out");
        // A refusal of the latest request does count.
        out.clear();
        a.on_transition(Cpu, 0, true, 5, &mut out); // seq 6
        a.on_frame(Frame::deny_for(6, Cpu, DenyReason::Budget), 6, &mut out);
        a.on_transition(Cpu, 0, false, 7, &mut out);
        assert_eq!(sent(&out), vec![Frame::cpu(6, true)], "host already deboosted: no CPU 0");
    }

    #[test]
    fn not_registered_reregisters() {
        let (mut a, _) = registered();
        let mut out = Vec::new();
        a.on_transition(Cpu, 0, true, 0, &mut out);
        out.clear();
        a.on_frame(Frame::deny(2, DenyReason::NotRegistered), 5, &mut out);
        assert_eq!(out[1], Out::Detach(Cpu));
        assert_eq!(sent(&out), vec![Frame::register(3, caps::CPU)]);
        out.clear();
        a.on_frame(Frame::ack(3, caps::CPU), 6, &mut out);
        assert!(out.contains(&Out::Attach(Cpu)));
        // Fresh detectors report the CPU still wants a boost: it is asked for again.
        a.reconcile(Cpu, &[true], 7, &mut out);
        assert_eq!(sent(&out), vec![Frame::cpu(4, true)]);
    }

    #[test]
    fn fresh_registration_does_not_send_a_useless_deboost() {
        let (mut a, _) = registered();
        let mut out = Vec::new();
        a.reconcile(Cpu, &[false, false], 5, &mut out);
        a.on_transition(Cpu, 1, false, 6, &mut out);
        assert!(sent(&out).is_empty());
    }

    #[test]
    fn exits_at_once_when_no_detector_can_run() {
        let mut a = AgentCore::new(Config::default(), &[]);
        let mut out = Vec::new();
        a.tick(0, &mut out);
        assert!(sent(&out).is_empty(), "nothing to register");
        assert!(exited(&out));
    }

    #[test]
    fn attaches_exactly_what_the_host_grants() {
        let mut a = AgentCore::new(Config::default(), &[Cpu, Io]);
        let mut out = Vec::new();
        a.tick(0, &mut out);
        assert_eq!(sent(&out), vec![Frame::register(1, caps::CPU | caps::IO)], "both detectors can run");
        out.clear();
        a.on_frame(Frame::ack(1, caps::IO), 1, &mut out);
        assert_eq!(attached(&out), vec![Out::Attach(Io)]);
        assert_eq!((a.phase(Cpu), a.phase(Io)), (Some(Phase::NotGranted), Some(Phase::Active)));
        assert!(!exited(&out));
        // The I/O detector reports; the CPU one is not attached, so nothing of it goes out.
        out.clear();
        a.on_transition(Io, 0, true, 2, &mut out);
        a.on_transition(Cpu, 0, true, 3, &mut out);
        assert_eq!(sent(&out), vec![io(2, true)]);
        // A host granting none of ours: deregister and exit.
        let mut a = AgentCore::new(Config::default(), &[Cpu, Io]);
        out.clear();
        a.tick(0, &mut out);
        a.on_frame(Frame::ack(1, caps::MEMBW), 1, &mut out);
        assert_eq!(sent(&out)[1..], [Frame::deregister(2)]);
        assert!(exited(&out));
        assert!(attached(&out).is_empty());
    }

    #[test]
    fn resources_keep_their_own_state() {
        let mut a = registered_both();
        let mut out = Vec::new();
        a.on_transition(Cpu, 0, true, 10, &mut out);
        a.on_transition(Io, 0, true, 11, &mut out);
        a.on_transition(Io, 1, true, 12, &mut out); // another device: still wanted
        a.on_transition(Cpu, 0, false, 13, &mut out);
        assert_eq!(sent(&out), vec![Frame::cpu(2, true), io(3, true), Frame::cpu(4, false)]);
    }

    #[test]
    fn a_denial_naming_one_resource_leaves_the_other_alone() {
        let mut a = registered_both();
        let mut out = Vec::new();
        a.on_transition(Cpu, 0, true, 0, &mut out); // CPU 1, seq 2
        a.on_transition(Io, 0, true, 0, &mut out); // IO 1, seq 3
        out.clear();
        // The host ends the I/O boost for budget.
        a.on_frame(Frame::deny_for(0, Io, DenyReason::Budget), 1_000, &mut out);
        assert_eq!(a.next_tick(1_000), Some(100_001_000), "I/O waits out its backoff");
        // CPU still has its boost: its deboost goes out; it can boost again at once.
        a.on_transition(Cpu, 0, false, 2_000, &mut out);
        a.on_transition(Cpu, 0, true, 3_000, &mut out);
        a.tick(4_000, &mut out);
        assert_eq!(sent(&out), vec![Frame::cpu(4, false), Frame::cpu(5, true)]);
        // I/O asks again once its backoff is over.
        out.clear();
        a.tick(100_001_000, &mut out);
        assert_eq!(sent(&out), vec![io(6, true)]);
        // A denial naming no resource but answering one request concerns that request's resource.
        out.clear();
        a.on_transition(Io, 0, false, 100_002_000, &mut out); // IO 0, seq 7
        a.on_transition(Io, 0, true, 100_003_000, &mut out); // IO 1, seq 8
        a.on_frame(Frame::deny(8, DenyReason::RateLimited), 100_004_000, &mut out);
        a.on_transition(Cpu, 0, false, 100_005_000, &mut out); // CPU still boosted: CPU 0, seq 9
        a.on_transition(Io, 0, false, 100_006_000, &mut out); // the host has no I/O boost: nothing
        assert_eq!(sent(&out), vec![io(7, false), io(8, true), Frame::cpu(9, false)]);
        // The operator disabling one resource through a DENY detaches only that one.
        out.clear();
        a.on_frame(Frame::deny_for(0, Io, DenyReason::Disabled), 100_007_000, &mut out);
        assert_eq!(attached(&out), vec![Out::Detach(Io)]);
        assert_eq!((a.phase(Cpu), a.phase(Io)), (Some(Phase::Active), Some(Phase::Disabled)));
        // And the host dropping support of one: the other keeps working.
        out.clear();
        a.on_frame(Frame::deny_for(0, Cpu, DenyReason::Unsupported), 100_008_000, &mut out);
        assert_eq!(attached(&out), vec![Out::Detach(Cpu)]);
        assert!(!exited(&out), "I/O may still be enabled again");
    }

    #[test]
    fn not_registered_and_a_denied_registration_concern_every_resource() {
        let mut a = registered_both();
        let mut out = Vec::new();
        a.on_frame(Frame::deny(0, DenyReason::NotRegistered), 5, &mut out);
        assert_eq!(attached(&out), vec![Out::Detach(Cpu), Out::Detach(Io)]);
        assert_eq!(sent(&out), vec![Frame::register(2, caps::CPU | caps::IO)]);
        out.clear();
        a.on_frame(Frame::deny(2, DenyReason::Disabled), 6, &mut out);
        assert_eq!(a.registration, Registration::Denied);
        assert!(attached(&out).is_empty());
        out.clear();
        a.on_frame(Frame::enable(caps::IO), 7, &mut out);
        assert_eq!(sent(&out), vec![Frame::register(3, caps::CPU | caps::IO)], "registers every resource");
        a.on_frame(Frame::ack(3, caps::CPU | caps::IO), 8, &mut out);
        assert_eq!(attached(&out), vec![Out::Attach(Cpu), Out::Attach(Io)]);
    }

    #[test]
    fn disable_and_enable_of_one_resource() {
        let mut a = registered_both();
        let mut out = Vec::new();
        a.on_transition(Io, 0, true, 10, &mut out); // IO 1, seq 2
        out.clear();
        a.on_frame(Frame::disable(caps::IO), 11, &mut out);
        assert_eq!(attached(&out), vec![Out::Detach(Io)]);
        assert!(sent(&out).is_empty(), "the host deboosts a disabled resource itself");
        // CPU keeps working; I/O reports nothing while detached.
        a.on_transition(Cpu, 0, true, 12, &mut out);
        a.on_transition(Io, 0, false, 13, &mut out);
        assert_eq!(sent(&out), vec![Frame::cpu(3, true)]);
        // ENABLE of I/O: attached again with fresh state, no new registration.
        out.clear();
        a.on_frame(Frame::enable(caps::IO), 14, &mut out);
        assert_eq!(attached(&out), vec![Out::Attach(Io)]);
        assert!(sent(&out).is_empty());
        a.reconcile(Io, &[false], 15, &mut out);
        assert!(sent(&out).is_empty(), "fresh state: the host starts deboosted");
        a.reconcile(Io, &[true], 16, &mut out);
        assert_eq!(sent(&out), vec![io(4, true)]);
        // ENABLE of something already attached changes nothing.
        out.clear();
        a.on_frame(Frame::enable(caps::CPU | caps::IO), 17, &mut out);
        assert!(out.is_empty(), "{out:?}");
        // Disabling everything: the agent waits, it does not exit.
        a.on_frame(Frame::disable(caps::ALL), 18, &mut out);
        assert_eq!(attached(&out), vec![Out::Detach(Cpu), Out::Detach(Io)]);
        assert!(!exited(&out));
        assert_eq!(a.next_tick(19), None);
    }

    #[test]
    fn an_attach_failure_leaves_the_others_working() {
        let mut a = registered_both();
        let mut out = Vec::new();
        a.on_attach_failed(Io, "no BFQ here", &mut out);
        assert_eq!(a.phase(Io), Some(Phase::Failed));
        assert!(attached(&out).is_empty(), "nothing to detach: it never attached");
        assert!(!exited(&out));
        assert!(matches!(&out[0], Out::Log(m) if m.contains("io: unsupported") && m.contains("no BFQ here")));
        a.on_transition(Cpu, 0, true, 10, &mut out);
        a.on_transition(Io, 0, true, 11, &mut out);
        assert_eq!(sent(&out), vec![Frame::cpu(2, true)]);
        // A later registration leaves the failed detector out.
        out.clear();
        a.on_frame(Frame::deny(0, DenyReason::NotRegistered), 12, &mut out);
        assert_eq!(sent(&out), vec![Frame::register(3, caps::CPU)]);
        out.clear();
        a.on_frame(Frame::ack(3, caps::CPU | caps::IO), 13, &mut out);
        assert_eq!(attached(&out), vec![Out::Attach(Cpu)]);
        // The last one failing too: nothing is left, so deregister and exit.
        out.clear();
        a.on_attach_failed(Cpu, "verifier", &mut out);
        assert_eq!(sent(&out), vec![Frame::deregister(4)]);
        assert!(matches!(out.last(), Some(Out::Exit(m)) if m.contains("no detector can run here")));
    }

    #[test]
    fn exits_only_when_nothing_is_left() {
        // The host grants CPU only (it does not support I/O, or has it turned off), then stops
        // supporting CPU: either may come back with ENABLE, so the agent waits.
        let mut a = AgentCore::new(Config::default(), &[Cpu, Io]);
        let mut out = Vec::new();
        a.tick(0, &mut out);
        a.on_frame(Frame::ack(1, caps::CPU), 1, &mut out);
        assert_eq!(a.phase(Io), Some(Phase::NotGranted));
        a.on_frame(Frame::deny_for(0, Cpu, DenyReason::Unsupported), 2, &mut out);
        assert_eq!(attached(&out), vec![Out::Attach(Cpu), Out::Detach(Cpu)]);
        assert!(!exited(&out));
        // The operator turns I/O on: the host says ENABLE, and the registration stands.
        out.clear();
        a.on_frame(Frame::enable(caps::IO), 3, &mut out);
        assert_eq!(attached(&out), vec![Out::Attach(Io)]);
        assert!(sent(&out).is_empty(), "no new registration");
        // One disabled, the other failing: the disabled one may come back, so it waits.
        let mut a = registered_both();
        out.clear();
        a.on_frame(Frame::disable(caps::CPU), 2, &mut out);
        a.on_attach_failed(Io, "gone", &mut out);
        assert!(!exited(&out));
        a.on_frame(Frame::enable(caps::CPU), 3, &mut out);
        assert!(out.contains(&Out::Attach(Cpu)));
        // No detector left that can run: deregister and exit.
        out.clear();
        a.on_attach_failed(Cpu, "gone too", &mut out);
        assert_eq!(sent(&out), vec![Frame::deregister(2)]);
        assert!(exited(&out));
    }

    #[test]
    fn other_refusals_of_a_boost_back_off_like_a_budget() {
        // A reason this agent does not know by name (e.g. the host's own reserve): the host does
        // not have the boost; ask again after the budget backoff.
        let (mut a, _) = registered();
        let mut out = Vec::new();
        a.on_transition(Cpu, 0, true, 0, &mut out); // seq 2
        use DenyReason::*;
        let Some(other) = DenyReason::ALL
            .into_iter()
            .find(|r| !matches!(r, Disabled | Unsupported | Budget | Malformed | RateLimited | NotRegistered))
        else {
            return; // this protocol version has no other reason
        };
        a.on_frame(Frame::deny_for(2, Cpu, other), 1_000, &mut out);
        assert_eq!(a.next_tick(1_000), Some(100_001_000));
        // A malformed-frame reply says nothing about the boost.
        a.on_frame(Frame::deny(9, DenyReason::Malformed), 2_000, &mut out);
        assert_eq!(a.next_tick(2_000), Some(100_001_000));
    }

    #[test]
    fn stop_detaches_and_deregisters() {
        let mut a = registered_both();
        let mut out = Vec::new();
        a.on_frame(Frame::disable(caps::IO), 2, &mut out);
        out.clear();
        a.stop(&mut out);
        assert_eq!(attached(&out), vec![Out::Detach(Cpu)]);
        assert_eq!(sent(&out), vec![Frame::deregister(2)]);
        // Not registered: nothing to deregister.
        let mut a = AgentCore::new(Config::default(), &[Cpu]);
        out.clear();
        a.tick(0, &mut out);
        out.clear();
        a.stop(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn disconnection_starts_over_with_every_resource() {
        let mut a = registered_both();
        let mut out = Vec::new();
        a.on_frame(Frame::disable(caps::IO), 2, &mut out);
        out.clear();
        a.on_disconnected(&mut out);
        assert_eq!(attached(&out), vec![Out::Detach(Cpu)]);
        a.tick(3, &mut out);
        assert_eq!(sent(&out), vec![Frame::register(2, caps::CPU | caps::IO)]);
    }

    fn need(priority: u8, irq: bool) -> Need {
        Need { priority, irq }
    }

    #[test]
    fn cpu_1_names_the_highest_priority_and_a_change_while_boosted_sends_a_new_one() {
        let (mut a, _) = registered();
        let mut out = Vec::new();
        a.on_need(Cpu, 0, Some(need(80, true)), 10, &mut out);
        a.on_need(Cpu, 1, Some(need(50, false)), 11, &mut out); // lower, on another CPU: nothing
        a.on_need(Cpu, 1, Some(need(90, false)), 12, &mut out); // higher: sent
        a.on_need(Cpu, 0, Some(need(80, false)), 13, &mut out); // only the interrupt flag: nothing
        a.on_need(Cpu, 1, None, 14, &mut out); // the 90 is done: back to 80
        a.on_need(Cpu, 1, Some(need(0, false)), 15, &mut out); // a watched task: 0 adds nothing
        a.on_need(Cpu, 0, None, 16, &mut out); // only the watched task: priority 0
        a.on_need(Cpu, 1, None, 17, &mut out);
        assert_eq!(
            sent(&out),
            vec![
                Frame::cpu_rt(2, need(80, true)),
                Frame::cpu_rt(3, need(90, true)),
                Frame::cpu_rt(4, need(80, false)),
                Frame::cpu_rt(5, need(0, false)),
                Frame::cpu(6, false),
            ]
        );
        assert_eq!(Frame::cpu_rt(5, need(0, false)), Frame::cpu(5, true), "no need named: plain CPU 1");
        assert_eq!((a.counters.boosts_sent, a.counters.priority_changes, a.counters.deboosts_sent), (1, 3, 1));
        // Reconciliation with the detector's own state names the need too, and is quiet when
        // nothing changed.
        out.clear();
        a.reconcile_needs(Cpu, &[Some(need(70, false)), None], 18, &mut out);
        a.reconcile_needs(Cpu, &[Some(need(70, false)), None], 19, &mut out);
        assert_eq!(sent(&out), vec![Frame::cpu_rt(7, need(70, false))]);
        // I/O requests carry no need.
        let mut a = registered_both();
        out.clear();
        a.on_need(Io, 0, Some(need(0, false)), 1, &mut out);
        assert_eq!(sent(&out), vec![io(2, true)]);
    }

    /// Registered (the REGISTER's round trip, 500 µs, is no sample), CPU boosted at 1 ms (seq 2,
    /// answered after 200 µs) and deboosted at 1.5 ms (seq 3, answered after 100 µs: the lower
    /// median of the two is 100 µs).
    fn deboosted_with_a_round_trip() -> AgentCore {
        let mut a = AgentCore::new(Config::default(), &[Cpu]);
        let mut out = Vec::new();
        a.tick(0, &mut out);
        a.on_frame(Frame::ack(1, caps::CPU), 500_000, &mut out);
        assert_eq!(a.rtt_ns(), 0);
        a.on_need(Cpu, 0, Some(need(80, true)), 1_000_000, &mut out);
        a.on_frame(Frame::ack(2, 1), 1_200_000, &mut out);
        assert_eq!(a.rtt_ns(), 200_000);
        assert!(!a.prediction_due());
        a.on_need(Cpu, 0, None, 1_500_000, &mut out);
        assert!(a.prediction_due(), "a CPU 0 went out");
        a.on_frame(Frame::ack(3, 0), 1_600_000, &mut out);
        assert_eq!(a.rtt_ns(), 100_000);
        assert_eq!(sent(&out)[1..], [Frame::cpu_rt(2, need(80, true)), Frame::cpu(3, false)]);
        a
    }

    fn predicted(in_ns: u64, priority: u8) -> Option<Prediction> {
        Some(Prediction { in_ns, at_ns: 0, priority })
    }

    #[test]
    fn replies_read_late_do_not_move_the_transit_estimate() {
        let mut a = deboosted_with_a_round_trip(); // 200 and 100 µs: 100 µs
        let mut out = Vec::new();
        // A reply read 120 ms late (the guest was not running), then one after 150 µs: the
        // median of 100, 150, 200 µs and 120 ms is 150 µs (the lower of the middle two).
        a.on_need(Cpu, 0, Some(need(80, true)), 2_000_000, &mut out); // seq 4
        a.on_frame(Frame::ack(4, 1), 122_000_000, &mut out);
        a.on_need(Cpu, 0, None, 123_000_000, &mut out); // seq 5
        a.on_frame(Frame::ack(5, 0), 123_150_000, &mut out);
        assert_eq!(a.rtt_ns(), 150_000);
        // So the next WAKE is early by 75 µs, not by half a mean that the 120 ms dominates.
        out.clear();
        a.predict(predicted(8_000_000, 80), 124_000_000, &mut out);
        assert_eq!(sent(&out), vec![Frame::wake(6, 7_925, 80)]);
        // A lasting rise (every reply now 2 ms) wins once it fills half the window.
        let mut now = 130_000_000;
        for i in 0..(RTT_SAMPLES as u32 / 4 + 1) {
            let seq = 7 + 2 * i;
            a.on_need(Cpu, 0, Some(need(80, true)), now, &mut out);
            a.on_frame(Frame::ack(seq, 1), now + 2_000_000, &mut out);
            a.on_need(Cpu, 0, None, now + 3_000_000, &mut out);
            a.on_frame(Frame::ack(seq + 1, 0), now + 5_000_000, &mut out);
            now += 10_000_000;
        }
        assert_eq!(a.rtt_ns(), 2_000_000);
    }

    #[test]
    fn a_slow_first_reply_does_not_set_the_transit_estimate() {
        // The host's first boost of a VM is its slowest (and the agent has just started): 10 ms.
        let mut a = AgentCore::new(Config::default(), &[Cpu]);
        let mut out = Vec::new();
        a.tick(0, &mut out);
        a.on_frame(Frame::ack(1, caps::CPU), 500_000, &mut out);
        a.on_need(Cpu, 0, Some(need(80, true)), 1_000_000, &mut out);
        a.on_frame(Frame::ack(2, 1), 11_000_000, &mut out);
        assert_eq!(a.rtt_ns(), 10_000_000);
        a.on_need(Cpu, 0, None, 12_000_000, &mut out);
        a.on_frame(Frame::ack(3, 0), 12_200_000, &mut out);
        assert_eq!(a.rtt_ns(), 200_000, "the lower of two");
        out.clear();
        a.predict(predicted(8_000_000, 80), 12_300_000, &mut out);
        assert_eq!(sent(&out), vec![Frame::wake(4, 7_900, 80)]);
    }

    #[test]
    fn a_wake_goes_out_at_the_deboost_less_the_transit() {
        let mut a = deboosted_with_a_round_trip();
        let mut out = Vec::new();
        // Next wake-up in 8 ms: the host reads the frame half a round trip (50 µs) later.
        a.predict(predicted(8_000_000, 80), 2_000_000, &mut out);
        assert_eq!(sent(&out), vec![Frame::wake(4, 7_950, 80)]);
        assert!(!a.prediction_due());
        // The same wake-up read again (a withdrawal elsewhere, say): nothing new.
        out.clear();
        a.predict(predicted(7_990_000, 80), 2_010_000, &mut out);
        assert!(sent(&out).is_empty(), "{out:?}");
        // The host acknowledges it: counted, and it says nothing about the CPU boost.
        a.on_frame(Frame::ack(4, 7_950), 2_300_000, &mut out);
        assert_eq!(
            (a.counters.wakes_sent, a.counters.wakes_acked, a.counters.acks),
            (1, 1, 2),
            "the CPU frames' ACKs only"
        );
        // Its round trip (300 µs) is a sample too: the median of 100, 200 and 300 µs.
        assert_eq!(a.rtt_ns(), 200_000);
        // The wake-up comes: CPU 1; the prediction is used up, and the next deboost brings the next.
        a.on_need(Cpu, 0, Some(need(80, true)), 10_000_000, &mut out);
        a.on_need(Cpu, 0, None, 10_500_000, &mut out);
        assert!(a.prediction_due());
        a.predict(predicted(9_500_000, 80), 10_500_000, &mut out);
        let transit = a.rtt_ns() / 2;
        assert_eq!(
            sent(&out),
            vec![
                Frame::cpu_rt(5, need(80, true)),
                Frame::cpu(6, false),
                Frame::wake(7, ((9_500_000 - transit) / 1000) as u32, 80)
            ]
        );
        // A wake-up beyond the horizon (1 s), or closer than the transit, is not predicted.
        let mut a = deboosted_with_a_round_trip();
        out.clear();
        a.predict(predicted(1_000_000_001, 80), 2_000_000, &mut out);
        a.predict(predicted(40_000, 80), 2_000_000, &mut out);
        assert!(sent(&out).is_empty(), "{out:?}");
        // While boosted nothing is predicted.
        let mut a = deboosted_with_a_round_trip();
        a.on_need(Cpu, 0, Some(need(80, false)), 2_100_000, &mut out);
        out.clear();
        a.predict(predicted(5_000_000, 80), 2_200_000, &mut out);
        assert!(sent(&out).is_empty(), "{out:?}");
        // With --predict false, never.
        let mut a = AgentCore::new(Config { predict: false, ..Config::default() }, &[Cpu]);
        a.tick(0, &mut out);
        a.on_frame(Frame::ack(1, caps::CPU), 1, &mut out);
        a.on_transition(Cpu, 0, true, 2, &mut out);
        a.on_transition(Cpu, 0, false, 3, &mut out);
        assert!(!a.prediction_due());
        out.clear();
        a.predict(predicted(5_000_000, 80), 4, &mut out);
        assert!(sent(&out).is_empty());
    }

    #[test]
    fn a_wake_denied_as_unsupported_stops_predictions_and_leaves_the_cpu_alone() {
        let mut a = deboosted_with_a_round_trip();
        let mut out = Vec::new();
        a.predict(predicted(8_000_000, 80), 2_000_000, &mut out); // WAKE seq 4
        a.on_need(Cpu, 0, Some(need(80, true)), 2_050_000, &mut out); // CPU 1 seq 5, before the reply
        out.clear();
        a.on_frame(Frame::deny_for(4, Cpu, DenyReason::Unsupported), 2_100_000, &mut out);
        assert!(attached(&out).is_empty(), "the CPU detector stays: {out:?}");
        assert_eq!(a.phase(Cpu), Some(Phase::Active));
        assert!(out.iter().any(|o| matches!(o, Out::Log(m) if m.contains("does not support WAKE"))), "{out:?}");
        assert!(!a.predicting());
        assert_eq!((a.counters.wakes_denied, a.counters.other_denials), (1, 0));
        // The host still has the boost of seq 5: the deboost goes out, and no prediction after it.
        a.on_need(Cpu, 0, None, 3_000_000, &mut out);
        assert!(!a.prediction_due());
        a.predict(predicted(7_000_000, 80), 3_000_000, &mut out);
        assert_eq!(sent(&out), vec![Frame::cpu(6, false)]);
        // Other refusals of a WAKE drop that prediction only: no backoff of the CPU.
        let mut a = deboosted_with_a_round_trip();
        a.predict(predicted(8_000_000, 80), 2_000_000, &mut out); // WAKE seq 4
        out.clear();
        a.on_frame(Frame::deny_for(4, Cpu, DenyReason::RateLimited), 2_100_000, &mut out);
        a.on_need(Cpu, 0, Some(need(80, true)), 2_200_000, &mut out);
        assert_eq!(sent(&out), vec![Frame::cpu_rt(5, need(80, true))], "no backoff");
        assert!(a.predicting());
        // A DENY(cpu: unsupported) of a CPU frame still means the host dropped the CPU.
        out.clear();
        a.on_frame(Frame::deny_for(5, Cpu, DenyReason::Unsupported), 2_300_000, &mut out);
        assert_eq!(attached(&out), vec![Out::Detach(Cpu)]);
        // A new registration tries predictions again.
        let mut a = deboosted_with_a_round_trip();
        a.predict(predicted(8_000_000, 80), 2_000_000, &mut out);
        a.on_frame(Frame::deny_for(4, Cpu, DenyReason::Unsupported), 2_100_000, &mut out);
        assert!(!a.predicting());
        a.on_frame(Frame::deny(0, DenyReason::NotRegistered), 2_200_000, &mut out);
        assert!(a.predicting());
    }

    #[test]
    fn a_withdrawn_prediction_sends_wake_0() {
        let mut a = deboosted_with_a_round_trip();
        let mut out = Vec::new();
        // WAKE seq 4, due at 10 ms; then the task is woken early (a signal): no wake-up is
        // predicted any more.
        a.predict(predicted(8_000_000, 80), 2_000_000, &mut out);
        a.predict(None, 3_000_000, &mut out);
        a.predict(None, 3_100_000, &mut out); // nothing stands: nothing more
        assert_eq!(sent(&out), vec![Frame::wake(4, 7_950, 80), Frame::wake(5, 0, 0)]);
        assert_eq!((a.counters.wakes_sent, a.counters.wake_withdrawals), (1, 1));
        // A later wake-up of another task replaces the standing one (one WAKE, no WAKE 0).
        let mut a = deboosted_with_a_round_trip();
        out.clear();
        a.predict(predicted(8_000_000, 80), 2_000_000, &mut out); // seq 4
        a.predict(predicted(20_000_000, 60), 3_000_000, &mut out); // seq 5
        assert_eq!(sent(&out), vec![Frame::wake(4, 7_950, 80), Frame::wake(5, 19_950, 60)]);
        // A prediction already due needs no withdrawal; one moved beyond the horizon does.
        let mut a = deboosted_with_a_round_trip();
        out.clear();
        a.predict(predicted(1_000_000, 80), 2_000_000, &mut out); // seq 4, due at 3 ms
        a.predict(None, 3_500_000, &mut out);
        a.predict(predicted(8_000_000, 80), 3_600_000, &mut out); // seq 5
        a.predict(predicted(2_000_000_000, 80), 3_700_000, &mut out); // seq 6: WAKE 0
        assert_eq!(sent(&out), vec![Frame::wake(4, 950, 80), Frame::wake(5, 7_950, 80), Frame::wake(6, 0, 0)]);
    }

    #[test]
    fn membw_requests_are_relayed_and_asked_again_after_a_new_registration() {
        let cfg = Config { membw: true, ..Config::default() };
        let mut a = AgentCore::new(cfg, &[Resource::Cpu]);
        let mut out = Vec::new();
        a.membw_request(300, 7, 0, &mut out);
        assert!(matches!(&out[..], [Out::MembwReply { client: 7, result: Err(e) }] if e.contains("not registered")));
        out.clear();
        a.tick(0, &mut out);
        assert_eq!(sent(&out), vec![Frame::register(1, caps::CPU | caps::MEMBW)], "MEMBW is offered");
        out.clear();
        a.on_frame(Frame::ack(1, caps::CPU | caps::MEMBW), 1, &mut out);
        out.clear();
        a.membw_request(500, 8, 2, &mut out);
        assert_eq!(sent(&out), vec![Frame::new(Kind::Membw, 2, 500)]);
        out.clear();
        a.on_frame(Frame::ack(2, 300), 3, &mut out);
        let grant = MembwGrant { asked: 500, granted: 300 };
        assert!(out.contains(&Out::MembwReply { client: 8, result: Ok(grant) }), "{out:?}");
        assert_eq!(a.membw_granted, 300);
        out.clear();
        // A host without a backend: the reason reaches the client; the CPU is left alone.
        a.membw_request(100, 9, 4, &mut out);
        out.clear();
        a.on_frame(Frame::deny_for(3, Resource::Membw, DenyReason::Unsupported), 5, &mut out);
        assert!(
            out.iter()
                .any(|o| matches!(o, Out::MembwReply { client: 9, result: Err(e) } if e.starts_with("unsupported"))),
            "{out:?}"
        );
        assert!(out.iter().all(|o| !matches!(o, Out::Detach(_))), "{out:?}");
        // The host restarts: after the new registration the last share is asked for again.
        out.clear();
        a.on_frame(Frame::deny(0, DenyReason::NotRegistered), 6, &mut out);
        let reg = sent(&out).into_iter().find(|f| f.kind == Kind::Register).expect("registers again");
        out.clear();
        a.on_frame(Frame::ack(reg.seq, caps::CPU | caps::MEMBW), 7, &mut out);
        assert!(sent(&out).iter().any(|f| f.kind == Kind::Membw && f.value == 100), "{out:?}");
    }
}
