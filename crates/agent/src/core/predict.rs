//! Predictive boost, the agent's side: the round-trip estimate of its requests, and `WAKE`, the
//! guest's next RT wake-up told to the host while it is deboosted (see the module above).

use cosched_proto::{DenyReason, Frame, Kind, Resource};

use super::{AgentCore, Out, Phase};

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
        if let (Some(p), Some((at, prio))) = (wanted, self.predict.outstanding) {
            if prio == p.priority && (now + p.in_ns).abs_diff(at) <= SAME_WAKE_NS {
                return;
            }
        }
        // The frame is read by the host about one transit after it is sent: say that much less.
        let transit = self.rtt_ns() / 2;
        let delay_us = wanted.map_or(0, |p| (p.in_ns.saturating_sub(transit) / 1000).min(u32::MAX as u64) as u32);
        if let (Some(p), true) = (wanted, delay_us > 0) {
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
        } else if self.predict.outstanding.take().is_some_and(|(at, _)| at > now) {
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
