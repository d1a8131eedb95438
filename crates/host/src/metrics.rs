//! Hint-to-applied latency (from reading a guest's frame to the last thread changed), kept as a
//! Prometheus histogram and as a ring of recent samples for exact percentiles.

use serde::Serialize;

/// Upper bounds of the histogram buckets, in µs.
pub const BUCKETS_US: [u64; 14] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 100_000];
const RING: usize = 8192;

#[derive(Debug, Clone)]
pub struct Latency {
    /// Count per bucket (not cumulative); the last one is +Inf.
    buckets: [u64; BUCKETS_US.len() + 1],
    count: u64,
    sum_ns: u64,
    max_ns: u64,
    recent: Vec<u64>,
    next: usize,
}

impl Default for Latency {
    fn default() -> Self {
        Latency { buckets: [0; BUCKETS_US.len() + 1], count: 0, sum_ns: 0, max_ns: 0, recent: Vec::new(), next: 0 }
    }
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// Over the most recent samples (up to 8192), for the percentiles.
    pub recent: usize,
}

impl Latency {
    pub fn record(&mut self, ns: u64) {
        let us = ns / 1000;
        let i = BUCKETS_US.iter().position(|&b| us < b).unwrap_or(BUCKETS_US.len());
        self.buckets[i] += 1;
        self.count += 1;
        self.sum_ns += ns;
        self.max_ns = self.max_ns.max(ns);
        if self.recent.len() < RING {
            self.recent.push(ns);
        } else {
            self.recent[self.next] = ns;
        }
        self.next = (self.next + 1) % RING;
    }

    pub fn summary(&self) -> LatencySummary {
        let mut v = self.recent.clone();
        v.sort_unstable();
        let pct = |p: f64| {
            if v.is_empty() {
                0.0
            } else {
                v[((v.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
            }
        };
        LatencySummary {
            count: self.count,
            p50_us: pct(0.50),
            p99_us: pct(0.99),
            max_us: self.max_ns as f64 / 1000.0,
            recent: v.len(),
        }
    }

    /// Prometheus text lines for a histogram named `name` with extra `labels` (`k="v",...`).
    pub fn prometheus(&self, name: &str, labels: &str) -> String {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut out = String::new();
        let mut cumulative = 0;
        for (i, b) in BUCKETS_US.iter().enumerate() {
            cumulative += self.buckets[i];
            out += &format!("{name}_bucket{{{labels}{sep}le=\"{}\"}} {cumulative}\n", *b as f64 / 1e6);
        }
        out += &format!("{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}\n", self.count);
        out += &format!("{name}_sum{{{labels}}} {}\n", self.sum_ns as f64 / 1e9);
        out += &format!("{name}_count{{{labels}}} {}\n", self.count);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_buckets() {
        let mut l = Latency::default();
        for us in 1..=100u64 {
            l.record(us * 1000);
        }
        let s = l.summary();
        assert_eq!((s.count, s.recent), (100, 100));
        assert!((s.p50_us - 50.0).abs() <= 1.0, "{s:?}");
        assert!((s.p99_us - 99.0).abs() <= 1.0, "{s:?}");
        assert_eq!(s.max_us, 100.0);
        let text = l.prometheus("lat_seconds", "vm=\"a\"");
        assert!(text.contains("lat_seconds_bucket{vm=\"a\",le=\"0.00001\"} 9\n"), "{text}");
        assert!(text.contains("lat_seconds_bucket{vm=\"a\",le=\"+Inf\"} 100\n"));
        assert!(text.contains("lat_seconds_count{vm=\"a\"} 100\n"));
    }

    #[test]
    fn ring_keeps_the_most_recent() {
        let mut l = Latency::default();
        for _ in 0..RING {
            l.record(1_000_000);
        }
        for _ in 0..RING {
            l.record(1_000);
        }
        assert_eq!(l.summary().p99_us, 1.0);
        assert_eq!(l.summary().max_us, 1000.0);
    }
}
