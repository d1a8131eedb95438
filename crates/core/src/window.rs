//! Time accounting over a sliding window, and token buckets. Pure: time is passed in (ns).

use std::collections::VecDeque;

/// Records when something was "on" (a VM boosted, a VM's vCPUs at a real-time class) and answers
/// how long it was on within the last `window_ns`.
#[derive(Debug, Clone, Default)]
pub struct OnTime {
    closed: VecDeque<(u64, u64)>,
    open: Option<u64>,
}

impl OnTime {
    pub fn is_on(&self) -> bool {
        self.open.is_some()
    }

    /// When the current on-period started.
    pub fn on_since(&self) -> Option<u64> {
        self.open
    }

    pub fn start(&mut self, now: u64) {
        self.open.get_or_insert(now);
    }

    /// Ends the current on-period; returns its length.
    pub fn stop(&mut self, now: u64) -> u64 {
        match self.open.take() {
            Some(s) if now > s => {
                self.closed.push_back((s, now));
                now - s
            }
            _ => 0,
        }
    }

    /// Time on within `[now - window_ns, now]`.
    pub fn used(&self, now: u64, window_ns: u64) -> u64 {
        let from = now.saturating_sub(window_ns);
        let overlap = |s: u64, e: u64| e.min(now).saturating_sub(s.max(from));
        self.closed.iter().map(|&(s, e)| overlap(s, e)).sum::<u64>() + self.open.map_or(0, |s| overlap(s, now))
    }

    /// Forgets periods that ended before `now - window_ns`; keeps memory bounded.
    pub fn prune(&mut self, now: u64, window_ns: u64) {
        let from = now.saturating_sub(window_ns);
        while self.closed.front().is_some_and(|&(_, e)| e <= from) {
            self.closed.pop_front();
        }
    }
}

/// A token bucket: `rate_per_s` tokens per second, at most `burst` stored.
#[derive(Debug, Clone)]
pub struct Bucket {
    rate_per_s: u64,
    burst: u64,
    /// Stored tokens, in units of 1e-9 token, so that refills need no floating point.
    nano_tokens: u128,
    last_ns: u64,
}

const NANO: u128 = 1_000_000_000;

impl Bucket {
    pub fn new(rate_per_s: u64, burst: u64, now: u64) -> Bucket {
        Bucket { rate_per_s, burst, nano_tokens: burst as u128 * NANO, last_ns: now }
    }

    /// Takes one token if there is one.
    pub fn take(&mut self, now: u64) -> bool {
        let elapsed = now.saturating_sub(self.last_ns) as u128;
        self.last_ns = self.last_ns.max(now);
        let cap = self.burst as u128 * NANO;
        self.nano_tokens = (self.nano_tokens + elapsed * self.rate_per_s as u128).min(cap);
        if self.nano_tokens >= NANO {
            self.nano_tokens -= NANO;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn on_time_in_window() {
        let mut t = OnTime::default();
        t.start(0);
        t.stop(300 * MS);
        t.start(500 * MS);
        assert_eq!(t.used(600 * MS, 1000 * MS), 400 * MS);
        // Window [700, 1700]: only the open period from 700.
        assert_eq!(t.used(1700 * MS, 1000 * MS), 1000 * MS);
        t.stop(1700 * MS);
        // Window [1200, 2200]: 500 ms of the second period.
        assert_eq!(t.used(2200 * MS, 1000 * MS), 500 * MS);
        t.prune(2200 * MS, 1000 * MS);
        assert_eq!(t.closed.len(), 1);
        t.prune(2800 * MS, 1000 * MS);
        assert!(t.closed.is_empty());
        assert_eq!(t.used(2800 * MS, 1000 * MS), 0);
    }

    #[test]
    fn start_twice_keeps_first_start() {
        let mut t = OnTime::default();
        t.start(10);
        t.start(20);
        assert_eq!(t.on_since(), Some(10));
        assert_eq!(t.stop(30), 20);
        assert_eq!(t.stop(40), 0);
    }

    #[test]
    fn bucket_refills_at_rate() {
        let mut b = Bucket::new(10, 3, 0);
        assert!(b.take(0) && b.take(0) && b.take(0));
        assert!(!b.take(0), "burst exhausted");
        assert!(!b.take(50 * MS), "half a token after 50 ms");
        assert!(b.take(100 * MS), "one token after 100 ms");
        assert!(b.take(10_000 * MS) && b.take(10_000 * MS) && b.take(10_000 * MS));
        assert!(!b.take(10_000 * MS), "refill is capped at burst");
    }
}
