//! The run delay the daemon delivers, as the host measures it (host BPF): how long each VM's
//! vCPU threads wait runnable before they run, from a wake-up or a preemption to the switch in,
//! per level the VM was at.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::metric::Sample;

/// Buckets of a [`RunDelay`]: bucket `i` counts delays in `[2^i, 2^(i+1))` ns, the last also
/// everything longer (as the host BPF keeps them).
pub const RUN_DELAY_BUCKETS: usize = 40;

/// The Prometheus buckets written: upper bounds `2^(i+1)` ns for `i` in this range (1 µs to
/// 17 s); the lower ones are counted in the first.
const PROM_BUCKETS: std::ops::RangeInclusive<usize> = 9..=33;

/// Whether the run delay is measured here, and why not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunDelayStatus {
    /// How it is measured (`tp_btf`, `raw_tracepoint`), while it is.
    pub measured_by: Option<String>,
    /// Why it is not measured here.
    pub unsupported: Option<String>,
}

impl RunDelayStatus {
    /// Neither measured nor said why not: a status from a daemon without the measure.
    pub fn is_unknown(&self) -> bool {
        self.measured_by.is_none() && self.unsupported.is_none()
    }
}

/// One VM's run delays at one level: counts per log2 bucket (not cumulative).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunDelay {
    pub counts: Vec<u64>,
    pub count: u64,
    pub sum_ns: u64,
}

impl RunDelay {
    /// Adds `other`'s delays.
    pub fn merge(&mut self, other: &RunDelay) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (d, s) in self.counts.iter_mut().zip(&other.counts) {
            *d += s;
        }
        self.count += other.count;
        self.sum_ns += other.sum_ns;
    }

    /// The `q` quantile (0 to 1) in ns, interpolated within its bucket as Prometheus does;
    /// `None` without delays.
    pub fn quantile_ns(&self, q: f64) -> Option<f64> {
        let total: u64 = self.counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * total as f64).max(1.0);
        let mut below = 0u64;
        for (i, n) in self.counts.iter().enumerate() {
            if *n > 0 && (below + n) as f64 >= rank {
                let (lo, hi) = (if i == 0 { 0.0 } else { (1u64 << i) as f64 }, (1u64 << (i + 1)) as f64);
                return Some(lo + (hi - lo) * (rank - below as f64) / *n as f64);
            }
            below += n;
        }
        Some((1u64 << self.counts.len()) as f64)
    }

    pub fn mean_ns(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_ns as f64 / self.count as f64)
    }
}

/// The run delays of every level of a VM, together.
pub fn all_levels(by_level: &BTreeMap<String, RunDelay>) -> RunDelay {
    let mut all = RunDelay::default();
    for d in by_level.values() {
        all.merge(d);
    }
    all
}

/// A Prometheus histogram in seconds per level: cumulative `_bucket`s, `_sum`, `_count`.
impl Sample for BTreeMap<String, RunDelay> {
    fn each(&self, by: &str, out: &mut dyn FnMut(&str, &str, f64)) {
        for (level, d) in self {
            let mut cumulative: u64 = d.counts.iter().take(*PROM_BUCKETS.start()).sum();
            for i in PROM_BUCKETS {
                cumulative += d.counts.get(i).copied().unwrap_or(0);
                let le = (1u64 << (i + 1)) as f64 / 1e9;
                out("_bucket", &format!("{by}=\"{level}\",le=\"{le}\""), cumulative as f64);
            }
            out("_bucket", &format!("{by}=\"{level}\",le=\"+Inf\""), d.count as f64);
            out("_sum", &format!("{by}=\"{level}\""), d.sum_ns as f64 / 1e9);
            out("_count", &format!("{by}=\"{level}\""), d.count as f64);
        }
    }
}

/// `p50 12 µs, p99 3.1 ms`-style durations.
pub fn human_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.1} ms", ns / 1e6)
    } else if ns >= 10e3 {
        format!("{:.0} µs", ns / 1e3)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delay(buckets: &[(usize, u64)]) -> RunDelay {
        let mut d = RunDelay { counts: vec![0; RUN_DELAY_BUCKETS], ..Default::default() };
        for (i, n) in buckets {
            d.counts[*i] += n;
            d.count += n;
            d.sum_ns += n << i;
        }
        d
    }

    #[test]
    fn quantiles_interpolate_within_a_bucket() {
        assert_eq!(RunDelay::default().quantile_ns(0.5), None);
        // 100 delays in [1024, 2048) ns: the median is half way.
        let d = delay(&[(10, 100)]);
        assert_eq!(d.quantile_ns(0.5), Some(1536.0));
        // 99 short, 1 long: p50 among the short, p99 still among them, p100 the long one's bucket.
        let d = delay(&[(10, 99), (20, 1)]);
        assert!(d.quantile_ns(0.5).unwrap() < 2048.0);
        assert!(d.quantile_ns(0.99).unwrap() <= 2048.0);
        assert_eq!(d.quantile_ns(1.0), Some((1u64 << 21) as f64));
        // Bucket 0 starts at 0.
        assert_eq!(delay(&[(0, 2)]).quantile_ns(0.5), Some(1.0));
    }

    #[test]
    fn levels_merge() {
        let mut m = BTreeMap::new();
        m.insert("normal".to_string(), delay(&[(10, 3)]));
        m.insert("boosted".to_string(), delay(&[(12, 1)]));
        let all = all_levels(&m);
        assert_eq!((all.count, all.counts[10], all.counts[12]), (4, 3, 1));
        assert_eq!(all.mean_ns(), Some((3.0 * 1024.0 + 4096.0) / 4.0));
    }

    #[test]
    fn prometheus_buckets_are_cumulative_from_one_microsecond() {
        let mut m = BTreeMap::new();
        m.insert("normal".to_string(), delay(&[(3, 1), (10, 2), (39, 1)]));
        let mut lines = Vec::new();
        m.each("level", &mut |suffix, labels, v| lines.push(format!("{suffix}{{{labels}}} {v}")));
        assert_eq!(lines[0], "_bucket{level=\"normal\",le=\"0.000001024\"} 1");
        assert_eq!(lines[1], "_bucket{level=\"normal\",le=\"0.000002048\"} 3");
        assert!(lines.contains(&"_bucket{level=\"normal\",le=\"17.179869184\"} 3".to_string()), "{lines:?}");
        assert!(lines.contains(&"_bucket{level=\"normal\",le=\"+Inf\"} 4".to_string()), "{lines:?}");
        assert!(lines.contains(&"_count{level=\"normal\"} 4".to_string()), "{lines:?}");
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human_ns(512.0), "512 ns");
        assert_eq!(human_ns(12_300.0), "12 µs");
        assert_eq!(human_ns(1_536.0), "1.5 µs");
        assert_eq!(human_ns(3_100_000.0), "3.1 ms");
    }
}
