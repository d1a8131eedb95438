//! Predictive boost, the agent's side: the round-trip estimate of its requests, and `WAKE`, the
//! guest's next RT wake-up told to the host while it is deboosted (see the module above), once
//! or, for a periodic task, standing.

use cosched_proto::{wake, DenyReason, Frame, Kind, Resource};

use super::{AgentCore, Config, Out, Phase};

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
/// estimate's drift: within this they are the same and no new `WAKE` goes out. Also how far from
/// a period two wake-ups may be and still keep a pattern.
const SAME_WAKE_NS: u64 = 50_000;
/// Predictions in a row whose wake-ups kept one period before the next goes out standing.
pub const STANDING_AFTER: u32 = 4;
/// What a standing window leaves at each end, inside the host's boost: the frames' transit
/// estimate's error and the drift of the two clocks.
pub const WINDOW_MARGIN_NS: u64 = 200_000;
/// After the host refused or stopped a standing prediction, tell none for this long.
pub const STANDING_RETRY_NS: u64 = 1_000_000_000;
/// A standing prediction whose windows saw no RT activation for this long (and three periods)
/// is withdrawn: its task stopped, or sleeps on something else.
pub const STANDING_IDLE_NS: u64 = 300_000_000;
/// A standing prediction is told again this often, anchored at its next wake-up: the host's
/// pattern runs on the host's clock and the guest's wake-ups on the guest's, and their rates
/// differ by the guest's clock calibration (100 ppm would be 2.5 ms in 25 s, past the window).
pub const STANDING_REANCHOR_NS: u64 = 1_000_000_000;

/// A standing prediction's window, on the guest's `CLOCK_MONOTONIC` (the CPU detector's clock):
/// an RT activation from `before_ns` before to `after_ns` after `anchor_ns + k * period_ns` (any
/// `k`) finds the host's boost in force, and sends nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StandingWindow {
    pub anchor_ns: u64,
    pub period_ns: u64,
    pub before_ns: u64,
    pub after_ns: u64,
}

impl StandingWindow {
    /// True if an activation at `at_ns` is inside one of the windows (the test `cpu.bpf.c`'s
    /// `standing_covers` makes).
    pub fn covers(&self, at_ns: u64) -> bool {
        if self.period_ns == 0 {
            return false;
        }
        if at_ns < self.anchor_ns {
            return self.anchor_ns - at_ns <= self.before_ns;
        }
        let d = (at_ns - self.anchor_ns) % self.period_ns;
        d <= self.after_ns || self.period_ns - d <= self.before_ns
    }
}

/// A periodic task's predictions and its standing prediction.
#[derive(Debug, Clone, Default)]
pub(super) struct Standing {
    /// Standing predictions go out (the configuration, until the host refuses the form).
    on: bool,
    /// The last predicted wake-up read, the period before it, and how many in a row kept it.
    last_at: Option<u64>,
    period_ns: u64,
    kept: u32,
    /// The pattern told to the host (anchor on the guest's `CLOCK_MONOTONIC`, the detector's
    /// clock; period), from its `WAKE` until it ends, its priority, when it was last told, and
    /// the anchor on the core's clock (the one `now` is on: the agent's own, from its start).
    pub(super) pattern: Option<(u64, u64)>,
    priority: u8,
    told_at: u64,
    anchor_now: u64,
    /// The standing `WAKE` waiting for its reply: its seq and delay (µs).
    told: Option<(u32, u32)>,
    /// The window handed to the detector (the host took the pattern).
    window: Option<StandingWindow>,
    /// No new standing prediction before this (after a refusal or the host's stop).
    retry_at: u64,
    /// The detector's count of silent activations at the last check (`None`: not read since the
    /// window was handed over), and when it last grew.
    seen: Option<u64>,
    progress_at: u64,
}
/// Predictive boost's state.
#[derive(Debug, Clone, Default)]
pub(super) struct PredictState {
    /// Predictions go out (the configuration, until the host refuses them).
    pub(super) on: bool,
    /// A `CPU 0` went out since the last [`AgentCore::predict`].
    pub(super) due: bool,
    /// The last `WAKE` that still stands: the predicted wake-up on the core's clock (without the
    /// transit correction) and its priority.
    pub(super) outstanding: Option<(u64, u8)>,
    /// A prediction right after a `CPU 0` rides on it (one frame, `cpu::deboost_wake`): the
    /// configuration, until the host refuses that form as malformed (a host older than it).
    pub(super) batch: bool,
    /// The seq of the last deboost that carried a prediction, until its reply.
    pub(super) batched: Option<u32>,
    pub(super) standing: Standing,
}

impl PredictState {
    pub(super) fn new(cfg: &Config) -> PredictState {
        PredictState {
            on: cfg.predict,
            batch: cfg.predict_batch,
            standing: Standing { on: cfg.predict_standing, ..Standing::default() },
            ..PredictState::default()
        }
    }
}

impl Standing {
    /// Takes in the next predicted wake-up: the pattern grows if it came a period after the last.
    /// (Ones in the standing pattern are not taken in while it stands: `kept` then counts a new
    /// pattern's.)
    fn track(&mut self, at_ns: u64) {
        if let Some(last) = self.last_at {
            if at_ns.abs_diff(last) <= SAME_WAKE_NS {
                return; // the same wake-up, read again
            }
            let d = at_ns.saturating_sub(last);
            if d != 0 && d.abs_diff(self.period_ns) <= SAME_WAKE_NS {
                self.kept += 1;
            } else {
                self.period_ns = d;
                self.kept = 0;
            }
        }
        self.last_at = Some(at_ns);
    }

    /// True if a wake-up at `at_ns` is one of the told pattern's.
    fn in_pattern(&self, at_ns: u64) -> bool {
        self.pattern.is_some_and(|(anchor, period)| {
            let d = at_ns.abs_diff(anchor) % period;
            d.min(period - d) <= SAME_WAKE_NS
        })
    }

    /// A standing prediction would go out now.
    fn due(&self, now: u64) -> bool {
        self.on
            && self.pattern.is_none()
            && self.kept + 1 >= STANDING_AFTER
            && self.period_ns > 0
            && self.period_ns / 1000 <= wake::MAX_PERIOD_US as u64
            && now >= self.retry_at
    }
}

impl AgentCore {
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
        if let Some(p) = wanted.filter(|p| !self.predict.standing.in_pattern(p.at_ns)) {
            self.predict.standing.track(p.at_ns);
        }
        let mut left_pattern = false;
        if self.predict.standing.pattern.is_some() {
            let st = &self.predict.standing;
            if wanted.is_some_and(|p| st.in_pattern(p.at_ns)) {
                return; // the standing prediction has it
            }
            // Out of the pattern: another RT task's wake-up came first (the guest's stopper, say),
            // or the task changed its period. The pattern stands until the predictions show a new
            // one (then the standing WAKE below replaces it), no RT task sleeps on a timer any
            // more (WAKE 0), or its windows stay empty ([`AgentCore::standing_check`]).
            if wanted.is_some() && st.kept + 1 < STANDING_AFTER {
                return;
            }
            self.end_standing(out);
            left_pattern = true;
        }
        if let (Some(p), Some((at, prio))) = (wanted, self.predict.outstanding) {
            if prio == p.priority && (now + p.in_ns).abs_diff(at) <= SAME_WAKE_NS {
                return;
            }
        }
        // The frame is read by the host about one transit after it is sent: say that much less.
        let transit = self.rtt_ns() / 2;
        let delay_us = wanted.map_or(0, |p| (p.in_ns.saturating_sub(transit) / 1000).min(u32::MAX as u64) as u32);
        if let (Some(p), true) = (wanted, delay_us > 0) {
            if self.predict.standing.due(now) {
                let st = &mut self.predict.standing;
                let period_us = (st.period_ns / 1000) as u32;
                st.pattern = Some((p.at_ns, st.period_ns));
                st.priority = p.priority;
                st.told_at = now;
                st.anchor_now = now + p.in_ns;
                // From now on `kept` counts a new pattern's predictions (see `track`).
                st.kept = 0;
                st.last_at = None;
                let seq = self.next_seq();
                self.predict.standing.told = Some((seq, delay_us));
                self.predict.outstanding = Some((now + p.in_ns, p.priority));
                self.counters.wakes_sent += 1;
                self.counters.standing_sent += 1;
                self.send_request(Frame::wake_standing(seq, delay_us, p.priority, period_us), now, out);
                return;
            }
            if self.batch(delay_us, p.priority, out) {
                self.predict.outstanding = Some((now + p.in_ns, p.priority));
                self.counters.wakes_sent += 1;
                self.counters.wakes_batched += 1;
                return;
            }
            let seq = self.next_seq();
            self.predict.outstanding = Some((now + p.in_ns, p.priority));
            self.counters.wakes_sent += 1;
            self.send_request(Frame::wake(seq, delay_us, p.priority), now, out);
        } else if self.predict.outstanding.take().is_some_and(|(at, _)| at > now) || left_pattern {
            let seq = self.next_seq();
            self.counters.wake_withdrawals += 1;
            self.send_request(Frame::wake(seq, 0, 0), now, out);
        }
    }

    /// Puts the prediction on the `CPU 0` that has just gone out, if it is still waiting in `out`
    /// (the I/O layer carries `out` out after the detector's prediction is read): one frame
    /// through the channel instead of two. Returns false if there is none, or batching is off.
    fn batch(&mut self, delay_us: u32, priority: u8, out: &mut [Out]) -> bool {
        let Some(last) = self.state(Resource::Cpu).map(|c| c.last_seq) else { return false };
        if !self.predict.batch {
            return false;
        }
        let pending = out.iter_mut().rev().find_map(|o| match o {
            Out::Send(f) if f.kind == Kind::Cpu && f.seq == last && f.value == 0 => Some(f),
            _ => None,
        });
        let Some(f) = pending else { return false };
        *f = Frame::cpu_deboost_wake(f.seq, delay_us, priority);
        self.predict.batched = Some(f.seq);
        true
    }

    /// The host's reply to a deboost that carried a prediction: it answers the prediction (the
    /// deboost is done whatever the answer), except `DENY(malformed)` from a host that does not
    /// know the form: it did not deboost, so `CPU 0` goes out again, alone, and the prediction
    /// after it as `WAKE`; no more batching until the next registration.
    pub(super) fn on_batched_reply(&mut self, f: Frame, now: u64, out: &mut Vec<Out>) {
        self.predict.batched = None;
        if f.kind == Kind::Ack {
            self.counters.acks += 1;
            self.counters.wakes_acked += 1;
            return;
        }
        if f.deny_reason() != Some(DenyReason::Malformed) || f.deny_resource().is_some() {
            return self.on_wake_reply(f, now, out);
        }
        self.counters.other_denials += 1;
        self.predict.batch = false;
        self.predict.outstanding = None;
        out.push(Out::Log(format!(
            "the host refused a deboost carrying the next wake-up ({f}): sending CPU 0 and WAKE apart until the \
             next registration"
        )));
        let Some(i) = self.resources.iter().position(|s| s.resource == Resource::Cpu) else { return };
        let st = &mut self.resources[i];
        if st.phase == Phase::Active && st.sent == Some(false) {
            st.sent = Some(true); // the host did not deboost
            self.sync(i, now, out);
        }
    }

    /// The channel probe (`--probe-frames`, for measuring what a frame costs): an RT activation
    /// found its CPU boosted already. While the host has the CPU boost and no prediction of ours
    /// stands, send `WAKE 0`: the host acknowledges it and changes nothing (it withdraws no
    /// prediction; a WAKE is not rate-limited when it withdraws). Its reply is handled as any
    /// `WAKE`'s.
    pub fn probe(&mut self, now: u64, out: &mut Vec<Out>) {
        if !self.is_registered() || self.predict.outstanding.is_some() {
            return;
        }
        let Some(cpu) = self.state(Resource::Cpu) else { return };
        if cpu.phase != Phase::Active || cpu.sent != Some(true) {
            return;
        }
        let seq = self.next_seq();
        self.counters.probes_sent += 1;
        self.send_request(Frame::wake(seq, 0, 0), now, out);
    }

    /// The host's reply to a `WAKE`: it concerns the prediction only, never the CPU boost.
    pub(super) fn on_wake_reply(&mut self, f: Frame, now: u64, out: &mut Vec<Out>) {
        if let Some((_, delay_us)) = self.predict.standing.told.filter(|(seq, _)| *seq == f.seq) {
            self.predict.standing.told = None;
            if f.kind == Kind::Ack {
                return self.on_standing_ack(f, delay_us, now, out);
            }
            // Refused (told again, too: the window goes).
            self.end_standing(out);
            let st = &mut self.predict.standing;
            st.kept = 0;
            st.retry_at = now + STANDING_RETRY_NS;
            if f.deny_reason() == Some(DenyReason::Malformed) && f.deny_resource().is_none() {
                // A host older than the form: no standing predictions until the next registration.
                st.on = false;
                self.counters.wakes_denied += 1;
                self.predict.outstanding = None;
                out.push(Out::Log(format!(
                    "the host refused a standing prediction ({f}): predicting each wake-up apart until the next \
                     registration"
                )));
                return;
            }
        }
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
}

impl AgentCore {
    /// The host took the standing prediction: its window goes to the detector, inside the host's
    /// boost (its lead, `delay_us` less the ACK's start, and its hold, from the ACK) by
    /// [`WINDOW_MARGIN_NS`] at each end.
    fn on_standing_ack(&mut self, f: Frame, delay_us: u32, now: u64, out: &mut Vec<Out>) {
        self.counters.wakes_acked += 1;
        let st = &mut self.predict.standing;
        let Some((anchor_ns, period_ns)) = st.pattern else { return };
        let (after_us, hold_us) = wake::decode_standing_ack(f.value);
        let lead_ns = delay_us.saturating_sub(after_us) as u64 * 1000;
        let w = StandingWindow {
            anchor_ns,
            period_ns,
            before_ns: lead_ns.saturating_sub(WINDOW_MARGIN_NS),
            after_ns: (hold_us as u64 * 1000).saturating_sub(WINDOW_MARGIN_NS),
        };
        st.window = Some(w);
        st.seen = None;
        st.progress_at = now;
        self.counters.standing_acked += 1;
        out.push(Out::Standing(Some(w)));
    }

    /// The standing prediction ends on the guest's side (the host's ends with the frame that
    /// made it end here: a `CPU 1`, a new `WAKE`, `WAKE 0`, or its own `DENY`): the detector's
    /// window goes, and the pattern must be seen again before the next.
    pub(super) fn end_standing(&mut self, out: &mut Vec<Out>) {
        let st = &mut self.predict.standing;
        if st.pattern.is_none() && st.window.is_none() {
            return;
        }
        st.pattern = None;
        st.told = None;
        if st.window.take().is_some() {
            out.push(Out::Standing(None));
        }
        self.counters.standing_ended += 1;
    }

    /// The host stopped a boost by itself (`DENY(cpu)`, seq 0): a standing prediction is over.
    pub(super) fn standing_stopped(&mut self, f: Frame, now: u64, out: &mut Vec<Out>) {
        if self.predict.standing.pattern.is_none() {
            return;
        }
        self.end_standing(out);
        self.predict.outstanding = None;
        self.predict.standing.kept = 0;
        self.predict.standing.retry_at = now + STANDING_RETRY_NS;
        out.push(Out::Log(format!("the host stopped the standing prediction ({f})")));
    }

    /// True while the detector holds a standing window (the I/O layer then reads its count of
    /// silent activations for [`AgentCore::standing_check`]).
    pub fn standing(&self) -> Option<StandingWindow> {
        self.predict.standing.window
    }

    /// Now and then, with the detector's count of activations it kept silent: a standing
    /// prediction whose windows saw none for [`STANDING_IDLE_NS`] (and three periods) is
    /// withdrawn (`WAKE 0`): its task is gone, and the host would boost for nothing.
    pub fn standing_check(&mut self, silent: u64, now: u64, out: &mut Vec<Out>) {
        let st = &mut self.predict.standing;
        let Some(w) = st.window else { return };
        if st.seen != Some(silent) {
            // (The first reading since the window was handed over counts from then.)
            if st.seen.is_some() {
                st.progress_at = now;
            }
            st.seen = Some(silent);
        }
        let idle = now.saturating_sub(st.progress_at);
        if idle < STANDING_IDLE_NS.max(3 * w.period_ns) {
            return self.reanchor(w, now, out);
        }
        self.end_standing(out);
        self.predict.standing.kept = 0;
        out.push(Out::Log(format!(
            "standing prediction withdrawn: no RT activation in its windows for {} ms",
            idle / 1_000_000
        )));
        if self.predict.outstanding.take().is_some() && self.is_registered() {
            let seq = self.next_seq();
            self.counters.wake_withdrawals += 1;
            self.send_request(Frame::wake(seq, 0, 0), now, out);
        }
    }
}

impl AgentCore {
    /// Tells the standing prediction again (see [`STANDING_REANCHOR_NS`]), anchored at its next
    /// due wake-up on the guest's clock less the transit, as the first one was. Only between two
    /// periods' boosts: the host's new plan replaces the old one, and must not cut a boost short.
    fn reanchor(&mut self, w: StandingWindow, now: u64, out: &mut Vec<Out>) {
        let st = &self.predict.standing;
        // On the core's clock: the window's anchor is on the detector's.
        if st.told.is_some() || now < st.told_at + STANDING_REANCHOR_NS || now < st.anchor_now {
            return;
        }
        let (p, since) = (w.period_ns, (now - st.anchor_now) % w.period_ns);
        let next = now - since + p;
        let periods = (next - st.anchor_now) / p;
        // The last period's boost is over (its hold, and the margins), and the next one's lead
        // is still ahead, with room for the frame's travel.
        let gap = 2 * WINDOW_MARGIN_NS;
        if since < w.after_ns + gap || next - now < w.before_ns + gap + self.rtt_ns() {
            return;
        }
        let delay_us = ((next - now).saturating_sub(self.rtt_ns() / 2) / 1000) as u32;
        let (priority, period_us) = (st.priority, (p / 1000) as u32);
        let seq = self.next_seq();
        let st = &mut self.predict.standing;
        st.pattern = Some((w.anchor_ns + periods * p, p));
        st.anchor_now = next;
        st.told_at = now;
        st.told = Some((seq, delay_us));
        self.counters.standing_reanchored += 1;
        self.send_request(Frame::wake_standing(seq, delay_us, priority, period_us), now, out);
    }
}
