//! Time accounting over a sliding window, and token buckets. Pure: time is passed in (ns).

/// Slots per window: the resolution of [`OnTime`] is the window / this.
const SLOTS: usize = 250;

/// Records when something was "on" (a VM boosted, a VM's vCPUs at a real-time class) and answers
/// how long it was on within the last window.
///
/// Memory and cost are fixed whatever the guest does: on-time is kept per slot (window / 250) in
/// a ring with a running total, so a guest that flaps a thousand times a second costs the same
/// as one that never does. The oldest slot counts whole, so [`OnTime::used`] can be up to one
/// slot too high: budgets and the guard err on the safe side.
#[derive(Debug, Clone)]
pub struct OnTime {
    slot_ns: u64,
    /// On-time per slot; slot `i` of absolute index `a` (= time / slot_ns) is `slots[a % len]`.
    slots: Vec<u64>,
    total: u64,
    /// Absolute index of the newest slot the ring holds.
    head: u64,
    open: Option<u64>,
}

impl OnTime {
    pub fn new(window_ns: u64) -> OnTime {
        let slot_ns = (window_ns / SLOTS as u64).max(1);
        OnTime { slot_ns, slots: vec![0; SLOTS + 1], total: 0, head: 0, open: None }
    }

    fn len(&self) -> u64 {
        self.slots.len() as u64
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
                self.add(s, now);
                now - s
            }
            _ => 0,
        }
    }

    /// Adds an on-period `[from, to)` after the fact (not while one is open).
    pub fn charge(&mut self, from: u64, to: u64) {
        if to > from {
            self.add(from, to);
        }
    }

    /// On-time within the last window, ending at `now`.
    pub fn used(&mut self, now: u64) -> u64 {
        self.advance(now);
        let window = (self.len() - 1) * self.slot_ns;
        let from = now.saturating_sub(window);
        self.total + self.open.map_or(0, |s| now.saturating_sub(s.max(from)))
    }

    /// Moves the ring forward to `now`, dropping the slots that left the window.
    fn advance(&mut self, now: u64) {
        let cur = now / self.slot_ns;
        if cur <= self.head {
            return;
        }
        for k in 1..=(cur - self.head).min(self.len()) {
            let i = ((self.head + k) % self.len()) as usize;
            self.total -= self.slots[i];
            self.slots[i] = 0;
        }
        self.head = cur;
    }

    /// Adds the on-period `[from, to)`, as far as it falls inside the ring.
    fn add(&mut self, from: u64, to: u64) {
        self.advance(to);
        let oldest = (self.head + 1).saturating_sub(self.len()) * self.slot_ns;
        let mut t = from.max(oldest);
        while t < to {
            let slot = t / self.slot_ns;
            let end = ((slot + 1) * self.slot_ns).min(to);
            let i = (slot % self.len()) as usize;
            self.slots[i] += end - t;
            self.total += end - t;
            t = end;
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
        if self.available(now) >= 1 {
            self.spend(1);
            true
        } else {
            false
        }
    }

    /// The whole tokens stored at `now` (after the refill since the last call).
    pub fn available(&mut self, now: u64) -> u64 {
        let elapsed = now.saturating_sub(self.last_ns) as u128;
        self.last_ns = self.last_ns.max(now);
        let cap = self.burst as u128 * NANO;
        self.nano_tokens = (self.nano_tokens + elapsed * self.rate_per_s as u128).min(cap);
        (self.nano_tokens / NANO) as u64
    }

    /// Spends `n` tokens, or all there are if fewer (a read that took more than was counted).
    pub fn spend(&mut self, n: u64) {
        self.nano_tokens = self.nano_tokens.saturating_sub(n as u128 * NANO);
    }

    /// How long after the last call until `n` tokens are stored (`n` capped at the burst).
    pub fn wait_ns(&self, n: u64) -> u64 {
        let want = n.min(self.burst) as u128 * NANO;
        let missing = want.saturating_sub(self.nano_tokens);
        if self.rate_per_s == 0 {
            return u64::MAX;
        }
        missing.div_ceil(self.rate_per_s as u128).min(u64::MAX as u128) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Exact on-time of `periods` within `[now - window, now]`.
    fn exact(periods: &[(u64, u64)], now: u64, window: u64) -> u64 {
        let from = now.saturating_sub(window);
        periods.iter().map(|&(s, e)| e.min(now).saturating_sub(s.max(from))).sum()
    }

    #[test]
    fn bucket_counts_whole_tokens_and_says_when_more_come() {
        let mut b = Bucket::new(1000, 100, 0); // 1 token/ms, 100 stored
        assert_eq!(b.available(0), 100);
        b.spend(90);
        assert_eq!(b.available(0), 10);
        // 5.5 ms later: 15 whole tokens (and half of one).
        assert_eq!(b.available(5_500_000), 15);
        assert_eq!(b.wait_ns(16), 500_000);
        assert_eq!(b.wait_ns(15), 0);
        // Never past the burst, and wait_ns of more than the burst is the wait for the burst.
        assert_eq!(b.available(1_000_000_000), 100);
        b.spend(1000);
        assert_eq!(b.available(1_000_000_000), 0);
        assert_eq!(b.wait_ns(500), 100 * MS);
        // take() is one token of the same bucket.
        assert!(!b.take(1_000_000_000));
        assert!(b.take(1_001_000_000));
        assert!(!b.take(1_001_000_000));
    }

    #[test]
    fn on_time_in_window() {
        let mut t = OnTime::new(1000 * MS); // 4 ms slots
        t.start(0);
        t.stop(300 * MS);
        t.start(500 * MS);
        assert_eq!(t.used(600 * MS), 400 * MS);
        // Window [700, 1700]: only the open period from 700.
        assert_eq!(t.used(1700 * MS), 1000 * MS);
        t.stop(1700 * MS);
        // Window [1200, 2200]: 500 ms of the second period.
        assert_eq!(t.used(2200 * MS), 500 * MS);
        assert_eq!(t.used(3000 * MS), 0);
    }

    #[test]
    fn start_twice_keeps_first_start() {
        let mut t = OnTime::new(1000 * MS);
        t.start(10);
        t.start(20);
        assert_eq!(t.on_since(), Some(10));
        assert_eq!(t.stop(30), 20);
        assert_eq!(t.stop(40), 0);
    }

    #[test]
    fn flapping_is_counted_within_one_slot_and_never_under() {
        let window = 1000 * MS;
        let mut t = OnTime::new(window);
        let slot = window / SLOTS as u64;
        let mut periods = Vec::new();
        // 0.3 ms on every 0.7 ms, for 5 s: 7000 periods in a fixed 251-slot ring.
        let mut now = 0;
        while now < 5000 * MS {
            t.start(now);
            t.stop(now + 300_000);
            periods.push((now, now + 300_000));
            now += 700_000;
            if periods.len() % 97 == 0 {
                let got = t.used(now);
                let want = exact(&periods, now, window);
                assert!(got >= want && got <= want + slot, "at {now}: {got} vs {want}");
            }
        }
        assert_eq!(t.slots.len(), SLOTS + 1);
    }

    #[test]
    fn a_long_period_covers_the_whole_window() {
        let mut t = OnTime::new(1000 * MS);
        t.start(0);
        t.stop(100_000 * MS);
        assert!(t.used(100_000 * MS) >= 1000 * MS && t.used(100_000 * MS) <= 1004 * MS);
        assert_eq!(t.used(200_000 * MS), 0);
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
