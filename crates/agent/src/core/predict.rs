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
