//! The real-time guard's rule (README "The real-time guard"), shared by the CPU boosts
//! ([`crate::cpu`]) and the static FIFO tuning ([`StaticGuard`]): a VM's vCPU threads spend at
//! most `max` of every window at a real-time class, and are then held at a fair class until
//! their share is back to `resume`, so that the kernel's RT throttling (`sched_rt_runtime_us`),
//! which stops every RT task of a CPU for the rest of its period (~50 ms), never fires.
//!
//! Time at the real-time class is wall time, not the threads' run time: a vCPU that is RT and
//! idle is counted as if it ran (what the guard bounds is what the VM could take).

use crate::window::OnTime;
use crate::{Policy, NS_PER_MS};

/// `max` and `resume` in ns, over a window of `window_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuardRule {
    pub max: u64,
    pub resume: u64,
    pub window_ns: u64,
}

impl GuardRule {
    /// `[policy] rt_guard_*`; `None` when the guard is off.
    pub fn from_policy(policy: &Policy) -> Option<GuardRule> {
        policy.rt_guard().map(|(max, resume)| GuardRule {
            max,
            resume,
            window_ns: policy.rt_guard_window_ms.max(1) * NS_PER_MS,
        })
    }

    /// The time accounting this rule needs.
    pub fn on_time(&self) -> OnTime {
        OnTime::new(self.window_ns)
    }

    /// A real-time period is to begin: whether it may (`false`: it begins guarded).
    pub fn may_start(&self, on: &mut OnTime, now: u64) -> bool {
        if on.used(now) >= self.max {
            false
        } else {
            on.start(now);
            true
        }
    }

    /// What is due at `now` for threads that are `guarded` or not: `Some(true)` guard them,
    /// `Some(false)` let them be real-time again, `None` nothing.
    pub fn step(&self, on: &mut OnTime, guarded: bool, now: u64) -> Option<bool> {
        let used = on.used(now);
        match guarded {
            false if used >= self.max => {
                on.stop(now);
                Some(true)
            }
            true if used <= self.resume => {
                on.start(now);
                Some(false)
            }
            _ => None,
        }
    }

    /// When [`GuardRule::step`] may next have something to do.
    pub fn deadline(&self, on: &mut OnTime, guarded: bool, now: u64) -> u64 {
        let used = on.used(now);
        match guarded {
            false => now + self.max.saturating_sub(used),
            // The share falls by at most 1 ns per ns, so this is the earliest resume time.
            true => now + used.saturating_sub(self.resume),
        }
    }
}

/// The guard of one VM's static FIFO tuning: the vCPU threads are real-time from `new` on,
/// guarded when the rule says so, until the tuning ends (the guard is dropped).
#[derive(Debug, Clone)]
pub struct StaticGuard {
    rule: GuardRule,
    on: OnTime,
    guarded: bool,
    demotions: u64,
}

/// What `cosched status` shows of a static guard.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StaticGuardStatus {
    pub guarded: bool,
    /// Time at the real-time class in the last window, and the most the rule allows.
    pub rt_ms: f64,
    pub max_ms: f64,
    pub window_ms: f64,
    pub demotions: u64,
}

impl StaticGuard {
    pub fn new(rule: GuardRule, now: u64) -> StaticGuard {
        let mut on = rule.on_time();
        on.start(now);
        StaticGuard { rule, on, guarded: false, demotions: 0 }
    }

    pub fn guarded(&self) -> bool {
        self.guarded
    }

    pub fn rule(&self) -> GuardRule {
        self.rule
    }

    /// Moves to what is due at `now`; returns the new state when it changed.
    pub fn tick(&mut self, now: u64) -> Option<bool> {
        let next = self.rule.step(&mut self.on, self.guarded, now)?;
        self.guarded = next;
        self.demotions += next as u64;
        Some(next)
    }

    pub fn next_deadline(&mut self, now: u64) -> u64 {
        self.rule.deadline(&mut self.on, self.guarded, now)
    }

    pub fn status(&mut self, now: u64) -> StaticGuardStatus {
        let ms = |ns: u64| ns as f64 / NS_PER_MS as f64;
        StaticGuardStatus {
            guarded: self.guarded,
            rt_ms: ms(self.on.used(now)),
            max_ms: ms(self.rule.max),
            window_ms: ms(self.rule.window_ns),
            demotions: self.demotions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = NS_PER_MS;

    fn rule() -> GuardRule {
        // 900 ms of every 1000, resume at 850: the defaults.
        GuardRule::from_policy(&Policy::default()).unwrap()
    }

    #[test]
    fn the_defaults_are_900_of_1000_resuming_at_850() {
        assert_eq!(rule(), GuardRule { max: 900 * MS, resume: 850 * MS, window_ns: 1000 * MS });
        let off = Policy { rt_guard_max_share_permille: 0, ..Policy::default() };
        assert_eq!(GuardRule::from_policy(&off), None);
    }

    /// A static FIFO VM on a fake clock stepped at each deadline: at most 900 ms RT in any
    /// 1000 ms window, guarded in between, and at RT most of the time.
    #[test]
    fn a_static_guard_holds_the_share_in_every_window_and_no_more() {
        let t0 = 5_000 * MS;
        let mut g = StaticGuard::new(rule(), t0);
        assert!(!g.guarded());
        assert_eq!(g.next_deadline(t0), t0 + 900 * MS);
        assert_eq!(g.tick(t0 + 899 * MS), None);
        assert_eq!(g.tick(t0 + 900 * MS), Some(true), "demoted at the share");
        // Guarded: it resumes once the window's RT time is back to 850 ms, not before.
        let resume = g.next_deadline(t0 + 900 * MS);
        assert!(resume >= t0 + 950 * MS, "{}", (resume - t0) / MS);
        assert_eq!(g.tick(resume - MS), None);
        // Run for 20 s, stepping at each deadline, and record the states.
        let mut now = resume;
        let mut changes = vec![(t0, false), (t0 + 900 * MS, true)];
        while now < t0 + 20_000 * MS {
            if let Some(s) = g.tick(now) {
                changes.push((now, s));
            }
            now = g.next_deadline(now).max(now + 1);
        }
        // RT time in every 1000 ms window (sampled every 10 ms) is at most the share plus one
        // accounting slot (4 ms), and the guarded share over the run is about 10%.
        let rt_between = |a: u64, b: u64| -> u64 {
            let mut sum = 0;
            for (i, &(t, s)) in changes.iter().enumerate() {
                let end = changes.get(i + 1).map_or(b, |c| c.0);
                if !s {
                    sum += end.min(b).saturating_sub(t.max(a));
                }
            }
            sum
        };
        let mut w = t0;
        while w + 1000 * MS <= now {
            assert!(rt_between(w, w + 1000 * MS) <= 904 * MS, "window at {} ms", (w - t0) / MS);
            w += 10 * MS;
        }
        let share = rt_between(t0, now) as f64 / (now - t0) as f64;
        assert!((0.84..=0.91).contains(&share), "{share}");
        assert!(g.status(now).demotions >= 19, "{:?}", g.status(now));
    }
}
