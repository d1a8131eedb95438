//! The agent's protocol logic, without I/O: registration, turning per-CPU transitions from BPF
//! into `CPU 1` / `CPU 0` frames (only on change), and reacting to the host's replies.

use cosched_proto::{caps, DenyReason, Frame, Kind};

/// What the I/O layer must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    Send(Frame),
    /// Load and attach the BPF detectors (fresh state).
    Attach,
    /// Detach and unload them: the host does not want to hear from us.
    Detach,
    /// Give up, with this message (the host does not support CPU coordination).
    Exit(String),
    Log(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Registration to (re)send at the next tick.
    Unregistered,
    /// REGISTER sent with this seq at this time; waiting for the reply.
    Registering { seq: u32, sent_ns: u64 },
    /// Registered, detectors attached.
    Active,
    /// The operator disabled coordination: detached, waiting for ENABLE.
    Disabled,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// Resend REGISTER when no reply came within this time.
    pub register_retry_ns: u64,
    /// After the host ended a boost for budget reasons, ask again no sooner than this.
    pub budget_backoff_ns: u64,
    /// After `DENY(rate_limited)`, wait this long.
    pub rate_backoff_ns: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config { register_retry_ns: 1_000_000_000, budget_backoff_ns: 100_000_000, rate_backoff_ns: 10_000_000 }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub boosts_sent: u64,
    pub deboosts_sent: u64,
    pub acks: u64,
    pub budget_denials: u64,
    pub other_denials: u64,
    pub registrations: u64,
}

#[derive(Debug, Clone)]
pub struct AgentCore {
    cfg: Config,
    pub phase: Phase,
    seq: u32,
    cpu_wants: Vec<bool>,
    /// What the host has applied as far as we know (`None`: unknown, e.g. after registering).
    sent: Option<bool>,
    /// Seq of the last `CPU` frame sent: only a denial of that one changes what the host has.
    last_cpu_seq: u32,
    backoff_until_ns: u64,
    pub counters: Counters,
}

impl AgentCore {
    pub fn new(cfg: Config) -> AgentCore {
        AgentCore {
            cfg,
            phase: Phase::Unregistered,
            seq: 0,
            cpu_wants: Vec::new(),
            sent: None,
            last_cpu_seq: 0,
            backoff_until_ns: 0,
            counters: Counters::default(),
        }
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1).max(1);
        self.seq
    }

    /// True if any CPU wants a boost.
    pub fn desired(&self) -> bool {
        self.cpu_wants.iter().any(|w| *w)
    }

    /// The BPF detectors report a transition of one CPU.
    pub fn on_transition(&mut self, cpu: usize, want: bool, now: u64, out: &mut Vec<Out>) {
        if self.phase != Phase::Active {
            return;
        }
        if cpu >= self.cpu_wants.len() {
            self.cpu_wants.resize(cpu + 1, false);
        }
        self.cpu_wants[cpu] = want;
        self.sync(now, out);
    }

    /// Replaces the per-CPU state wholesale (reconciliation with the BPF maps).
    pub fn reconcile(&mut self, wants: &[bool], now: u64, out: &mut Vec<Out>) {
        if self.phase != Phase::Active {
            return;
        }
        self.cpu_wants = wants.to_vec();
        self.sync(now, out);
    }

    /// Sends `CPU x` if what we want differs from what the host has.
    fn sync(&mut self, now: u64, out: &mut Vec<Out>) {
        let want = self.desired();
        // A deboost is always sent at once; a boost waits out a backoff.
        if self.sent == Some(want) || (want && now < self.backoff_until_ns) {
            return;
        }
        if self.sent.is_none() && !want {
            self.sent = Some(false); // just registered: the host starts deboosted
            return;
        }
        let seq = self.next_seq();
        self.last_cpu_seq = seq;
        out.push(Out::Send(Frame::cpu(seq, want)));
        if want {
            self.counters.boosts_sent += 1;
        } else {
            self.counters.deboosts_sent += 1;
        }
        self.sent = Some(want);
    }

    fn register(&mut self, now: u64, out: &mut Vec<Out>) {
        let seq = self.next_seq();
        self.phase = Phase::Registering { seq, sent_ns: now };
        self.counters.registrations += 1;
        out.push(Out::Send(Frame::register(seq, caps::CPU)));
    }

    fn deactivate(&mut self, phase: Phase, out: &mut Vec<Out>) {
        if self.phase == Phase::Active {
            out.push(Out::Detach);
        }
        self.phase = phase;
        self.sent = None;
        self.cpu_wants.clear();
    }

    /// Time passes: (re)registration and the end of a backoff.
    pub fn tick(&mut self, now: u64, out: &mut Vec<Out>) {
        match self.phase {
            Phase::Unregistered => self.register(now, out),
            Phase::Registering { sent_ns, .. } if now >= sent_ns + self.cfg.register_retry_ns => {
                self.register(now, out)
            }
            Phase::Active => self.sync(now, out),
            _ => {}
        }
    }

    /// When [`AgentCore::tick`] next has something to do.
    pub fn next_tick(&self, now: u64) -> Option<u64> {
        match self.phase {
            Phase::Unregistered => Some(now),
            Phase::Registering { sent_ns, .. } => Some(sent_ns + self.cfg.register_retry_ns),
            Phase::Active if self.desired() && self.sent != Some(true) => Some(self.backoff_until_ns.max(now)),
            _ => None,
        }
    }

    /// The channel to the host went away (or came back): start over.
    pub fn on_disconnected(&mut self, out: &mut Vec<Out>) {
        self.deactivate(Phase::Unregistered, out);
    }

    /// A frame from the host.
    pub fn on_frame(&mut self, f: Frame, now: u64, out: &mut Vec<Out>) {
        match (f.kind, self.phase) {
            (Kind::Ack, Phase::Registering { seq, .. }) if f.seq == seq => {
                if f.value & caps::CPU == 0 {
                    self.phase = Phase::Disabled;
                    out.push(Out::Exit("the host did not grant CPU coordination".into()));
                    return;
                }
                self.phase = Phase::Active;
                self.sent = None;
                self.backoff_until_ns = 0;
                out.push(Out::Log("registered with the host".into()));
                out.push(Out::Attach);
            }
            (Kind::Ack, _) => self.counters.acks += 1,
            (Kind::Deny, phase) => {
                let reason = f.deny_reason();
                let is_reply_to_register = matches!(phase, Phase::Registering { seq, .. } if seq == f.seq);
                // The host's own end of a boost (seq 0), or a refusal of our latest request; a
                // refusal of an older one says nothing about what the host has now.
                let about_now = f.seq == 0 || f.seq == self.last_cpu_seq;
                match reason {
                    Some(DenyReason::Disabled) => {
                        out.push(Out::Log("the host operator disabled coordination; waiting for ENABLE".into()));
                        self.deactivate(Phase::Disabled, out);
                    }
                    Some(DenyReason::Unsupported) if is_reply_to_register => {
                        self.phase = Phase::Disabled;
                        out.push(Out::Exit("the host does not support CPU coordination".into()));
                    }
                    Some(DenyReason::NotRegistered) => {
                        // The host restarted or deregistered us: register again.
                        out.push(Out::Log("the host says we are not registered; registering again".into()));
                        self.deactivate(Phase::Unregistered, out);
                        self.register(now, out);
                    }
                    Some(DenyReason::Budget) => {
                        self.counters.budget_denials += 1;
                        if about_now {
                            // The host ended (or refused) a boost: it is deboosted now.
                            self.sent = Some(false);
                            self.backoff_until_ns = now + self.cfg.budget_backoff_ns;
                        }
                    }
                    Some(DenyReason::RateLimited) => {
                        self.counters.other_denials += 1;
                        if about_now {
                            // Only boosts are refused for rate: the host is deboosted.
                            self.sent = Some(false);
                            self.backoff_until_ns = now + self.cfg.rate_backoff_ns;
                        }
                    }
                    _ => {
                        self.counters.other_denials += 1;
                        out.push(Out::Log(format!("host replied {f}")));
                    }
                }
            }
            (Kind::Disable, _) if f.value & caps::CPU != 0 => {
                out.push(Out::Log("the host operator disabled coordination; detaching".into()));
                self.deactivate(Phase::Disabled, out);
            }
            (Kind::Enable, Phase::Disabled) if f.value & caps::CPU != 0 => {
                out.push(Out::Log("the host operator enabled coordination; registering".into()));
                self.register(now, out);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registered() -> (AgentCore, u32) {
        let mut a = AgentCore::new(Config::default());
        let mut out = Vec::new();
        a.tick(0, &mut out);
        assert_eq!(out, vec![Out::Send(Frame::register(1, caps::CPU))]);
        out.clear();
        a.on_frame(Frame::ack(1, caps::CPU), 1, &mut out);
        assert!(out.contains(&Out::Attach));
        assert_eq!(a.phase, Phase::Active);
        (a, 1)
    }

    fn sent(out: &[Out]) -> Vec<Frame> {
        out.iter().filter_map(|o| if let Out::Send(f) = o { Some(*f) } else { None }).collect()
    }

    #[test]
    fn sends_only_transitions_of_the_whole_vm() {
        let (mut a, _) = registered();
        let mut out = Vec::new();
        a.on_transition(0, true, 10, &mut out);
        a.on_transition(1, true, 11, &mut out); // another CPU: still boosted, nothing new
        a.on_transition(0, false, 12, &mut out);
        a.on_transition(1, false, 13, &mut out);
        a.on_transition(1, false, 14, &mut out);
        assert_eq!(sent(&out), vec![Frame::cpu(2, true), Frame::cpu(3, false)]);
    }

    #[test]
    fn register_is_retried_until_answered() {
        let mut a = AgentCore::new(Config::default());
        let mut out = Vec::new();
        a.tick(0, &mut out);
        assert_eq!(a.next_tick(0), Some(1_000_000_000));
        a.tick(999_999_999, &mut out);
        a.tick(1_000_000_000, &mut out);
        assert_eq!(sent(&out), vec![Frame::register(1, caps::CPU), Frame::register(2, caps::CPU)]);
        // A late ACK to the first one is not taken as the answer.
        out.clear();
        a.on_frame(Frame::ack(1, caps::CPU), 5, &mut out);
        assert!(!out.contains(&Out::Attach));
        a.on_frame(Frame::ack(2, caps::CPU), 5, &mut out);
        assert!(out.contains(&Out::Attach));
    }

    #[test]
    fn denied_registration_detaches_and_waits_for_enable() {
        let mut a = AgentCore::new(Config::default());
        let mut out = Vec::new();
        a.tick(0, &mut out);
        a.on_frame(Frame::deny(1, DenyReason::Disabled), 1, &mut out);
        assert_eq!(a.phase, Phase::Disabled);
        assert!(!out.contains(&Out::Attach));
        a.tick(10_000_000_000, &mut out);
        assert_eq!(sent(&out).len(), 1, "no retries while disabled");
        out.clear();
        a.on_frame(Frame::enable(caps::CPU), 2, &mut out);
        assert_eq!(sent(&out), vec![Frame::register(2, caps::CPU)]);
    }

    #[test]
    fn disable_at_run_time_detaches() {
        let (mut a, _) = registered();
        let mut out = Vec::new();
        a.on_transition(0, true, 10, &mut out);
        out.clear();
        a.on_frame(Frame::disable(caps::CPU), 11, &mut out);
        assert!(out.contains(&Out::Detach));
        a.on_transition(0, false, 12, &mut out);
        assert!(sent(&out).is_empty(), "detached: nothing sent");
    }

    #[test]
    fn unsupported_exits() {
        let mut a = AgentCore::new(Config::default());
        let mut out = Vec::new();
        a.tick(0, &mut out);
        a.on_frame(Frame::deny(1, DenyReason::Unsupported), 1, &mut out);
        assert!(matches!(out.last(), Some(Out::Exit(_))));
    }

    #[test]
    fn budget_denial_backs_off_then_asks_again() {
        let (mut a, _) = registered();
        let mut out = Vec::new();
        a.on_transition(0, true, 0, &mut out);
        // The host ends the boost (unsolicited DENY(budget)).
        a.on_frame(Frame::deny(0, DenyReason::Budget), 1_000, &mut out);
        out.clear();
        a.tick(50_000_000, &mut out);
        assert!(sent(&out).is_empty(), "within the backoff");
        assert_eq!(a.next_tick(50_000_000), Some(100_001_000));
        a.tick(100_001_000, &mut out);
        assert_eq!(sent(&out), vec![Frame::cpu(3, true)]);
        // If the guest no longer wants it by then, nothing is sent.
        let (mut a, _) = registered();
        a.on_transition(0, true, 0, &mut out);
        a.on_frame(Frame::deny(0, DenyReason::Budget), 1_000, &mut out);
        out.clear();
        a.on_transition(0, false, 2_000, &mut out);
        a.tick(200_000_000, &mut out);
        assert!(sent(&out).is_empty(), "{out:?}");
    }

    #[test]
    fn a_denial_of_an_older_frame_does_not_change_what_the_host_has() {
        let (mut a, _) = registered();
        let mut out = Vec::new();
        a.on_transition(0, true, 0, &mut out); // CPU 1, seq 2
        a.on_transition(0, false, 1, &mut out); // CPU 0, seq 3
        a.on_transition(0, true, 2, &mut out); // CPU 1, seq 4
        assert_eq!(sent(&out), vec![Frame::cpu(2, true), Frame::cpu(3, false), Frame::cpu(4, true)]);
        out.clear();
        // seq 2 was refused for rate, but seq 3 and 4 went through: the host is boosted.
        a.on_frame(Frame::deny(2, DenyReason::RateLimited), 3, &mut out);
        a.on_frame(Frame::ack(3, 0), 3, &mut out);
        a.on_frame(Frame::ack(4, 0), 3, &mut out);
        a.on_transition(0, false, 4, &mut out);
        assert_eq!(sent(&out), vec![Frame::cpu(5, false)], "the deboost must go out");
        // A refusal of the latest request does count.
        out.clear();
        a.on_transition(0, true, 5, &mut out); // seq 6
        a.on_frame(Frame::deny(6, DenyReason::Budget), 6, &mut out);
        a.on_transition(0, false, 7, &mut out);
        assert_eq!(sent(&out), vec![Frame::cpu(6, true)], "host already deboosted: no CPU 0");
    }

    #[test]
    fn not_registered_reregisters() {
        let (mut a, _) = registered();
        let mut out = Vec::new();
        a.on_transition(0, true, 0, &mut out);
        out.clear();
        a.on_frame(Frame::deny(2, DenyReason::NotRegistered), 5, &mut out);
        assert_eq!(out[1], Out::Detach);
        assert_eq!(sent(&out), vec![Frame::register(3, caps::CPU)]);
        out.clear();
        a.on_frame(Frame::ack(3, caps::CPU), 6, &mut out);
        assert!(out.contains(&Out::Attach));
        // Fresh detectors report the CPU still wants a boost: it is asked for again.
        a.reconcile(&[true], 7, &mut out);
        assert_eq!(sent(&out), vec![Frame::cpu(4, true)]);
    }

    #[test]
    fn fresh_registration_does_not_send_a_useless_deboost() {
        let (mut a, _) = registered();
        let mut out = Vec::new();
        a.reconcile(&[false, false], 5, &mut out);
        a.on_transition(1, false, 6, &mut out);
        assert!(sent(&out).is_empty());
    }
}
