//! Hint-to-applied latency (from reading a guest's frame to the last thread changed), kept as a
//! Prometheus histogram and as a ring of recent samples for exact percentiles; and the
//! Prometheus text format of a status.

use std::collections::BTreeMap;

use cosched_status::metric::{Kind, Metrics};
pub use cosched_status::{Histogram, LatencySummary, BUCKETS_US};
use cosched_status::{Status, VmStatus};

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

    /// The histogram, for the status snapshot the metrics are rendered from.
    pub fn histogram(&self) -> Histogram {
        Histogram { counts: self.buckets.to_vec(), count: self.count, sum_ns: self.sum_ns }
    }
}

/// Renders the Prometheus text format from a status (`cosched status --json`): what the metrics
/// show is exactly what the status shows. Each metric is declared on the status field it comes
/// from (`#[metric]` in `cosched_status`); here are the labels of what holds them (`resource`,
/// `backend`, `vm`), and which parts have metrics.
pub fn render(status: &Status) -> String {
    let mut out = Exposition::default();
    // Written even before their first sample, as they always were.
    out.declare_histograms::<VmStatus>();
    out.add(&status.daemon.build, "");
    for (r, res) in &status.resources {
        out.add(res, &format!("resource=\"{r}\""));
    }
    // Labelled by the backend running, or configured where none runs (`off`, `auto`).
    if !status.membw.backend.is_empty() {
        out.add(&status.membw, &format!("backend=\"{}\"", status.membw.backend));
    }
    for vm in &status.vms {
        vm_series(&mut out, vm);
    }
    out.text()
}

/// Every metric family the daemon exports: name, type and help, by name (for its manual).
pub fn families() -> Vec<(&'static str, Kind, &'static str)> {
    fn of<T: Metrics>(out: &mut BTreeMap<&'static str, (Kind, &'static str)>) {
        for m in T::METRICS {
            out.insert(m.name, (m.kind, m.help));
        }
    }
    let mut all = BTreeMap::new();
    of::<cosched_status::Build>(&mut all);
    of::<cosched_status::ResourceStatus>(&mut all);
    of::<cosched_status::MembwStatus>(&mut all);
    of::<VmStatus>(&mut all);
    of::<cosched_status::VmCounters>(&mut all);
    of::<cosched_status::VmMembw>(&mut all);
    of::<cosched_status::VmBwStats>(&mut all);
    of::<cosched_status::VmResource>(&mut all);
    of::<cosched_status::SlotCounters>(&mut all);
    of::<cosched_status::CpuCounters>(&mut all);
    of::<cosched_status::RtStatus>(&mut all);
    of::<cosched_status::EventCounters>(&mut all);
    all.into_iter().map(|(name, (kind, help))| (name, kind, help)).collect()
}

/// A VM's series; every figure of a resource carries a `resource` label.
fn vm_series(out: &mut Exposition, vm: &VmStatus) {
    let l = format!("vm=\"{}\"", vm.name.replace(['"', '\\', '\n'], "_"));
    out.add(vm, &l);
    out.add(&vm.counters, &l);
    if let Some(m) = &vm.membw {
        out.add(m, &l);
        out.add(&m.stats, &l);
    }
    for (r, res) in &vm.resources {
        let lr = format!("{l},resource=\"{r}\"");
        out.add(res, &lr);
        out.add(&res.counters, &lr);
        // The CPU guard's demotions are shown for every resource, 0 where there is no guard.
        out.add(&res.counters.cpu, &lr);
        if let Some(rt) = &res.rt {
            out.add(rt, &lr);
        }
        if r == cosched_proto::Resource::Event.name() {
            out.add(&res.counters.event, &lr);
        }
    }
}

/// Metric families by name, each with its samples in the order they were added.
#[derive(Default)]
struct Exposition {
    families: BTreeMap<&'static str, Family>,
}

struct Family {
    kind: Kind,
    help: &'static str,
    lines: Vec<String>,
}

impl Exposition {
    fn family(&mut self, name: &'static str, kind: Kind, help: &'static str) -> &mut Family {
        let f = self.families.entry(name).or_insert(Family { kind, help, lines: Vec::new() });
        debug_assert!(f.kind == kind && f.help == help, "{name} declared twice, differently");
        f
    }

    fn declare_histograms<T: Metrics>(&mut self) {
        for m in T::METRICS.iter().filter(|m| m.kind == Kind::Histogram) {
            self.family(m.name, m.kind, m.help);
        }
    }

    /// The metrics of `item`'s fields, with `labels` (`k="v",...`) before their own.
    fn add<T: Metrics>(&mut self, item: &T, labels: &str) {
        for m in T::METRICS {
            let mut lines = Vec::new();
            (m.samples)(item, &mut |suffix, own, value| {
                lines.push(line(m.name, suffix, &[labels, m.labels, own], value))
            });
            // A family without samples is not written (an absent figure is not a 0).
            if !lines.is_empty() {
                self.family(m.name, m.kind, m.help).lines.append(&mut lines);
            }
        }
    }

    /// Histograms after the other families.
    fn text(self) -> String {
        let mut out = String::new();
        let (hist, other): (Vec<_>, Vec<_>) = self.families.into_iter().partition(|(_, f)| f.kind == Kind::Histogram);
        for (name, f) in other.into_iter().chain(hist) {
            out += &format!("# HELP {name} {}\n# TYPE {name} {}\n", f.help, f.kind.name());
            for l in f.lines {
                out += &l;
                out.push('\n');
            }
        }
        out
    }
}

/// One sample line: `name{labels} value`, the non-empty labels joined.
fn line(name: &str, suffix: &str, labels: &[&str], value: f64) -> String {
    let labels: Vec<&str> = labels.iter().copied().filter(|l| !l.is_empty()).collect();
    format!("{name}{suffix}{{{}}} {value}", labels.join(","))
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
        let mut text = String::new();
        cosched_status::metric::Sample::each(&l.histogram(), "", &mut |suffix, own, v| {
            text += &line("lat_seconds", suffix, &["vm=\"a\"", own], v);
            text.push('\n');
        });
        assert!(text.contains("lat_seconds_bucket{vm=\"a\",le=\"0.00001\"} 9\n"), "{text}");
        assert!(text.contains("lat_seconds_bucket{vm=\"a\",le=\"+Inf\"} 100\n"));
        assert!(text.contains("lat_seconds_count{vm=\"a\"} 100\n"));
    }

    fn testdata(rel: &str) -> String {
        let path = format!("{}/../../testdata/{rel}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// The exposition of the captured status samples is what the metrics were before they were
    /// declared on the status fields: names, labels, HELP and TYPE, values, order. A metric added
    /// on purpose: `COSCHED_BLESS=1 cargo test --release -p cosched-host metrics`, and review.
    #[test]
    fn the_exposition_of_the_captured_samples_is_unchanged() {
        for (sample, expected) in [
            ("status-v1.json", "status-v1/expected/status.metrics"),
            ("status-v1/unprivileged.json", "status-v1/expected/unprivileged.metrics"),
            ("status-v1/events.json", "status-v1/expected/events.metrics"),
        ] {
            let status: Status = serde_json::from_str(&testdata(sample)).unwrap();
            if std::env::var("COSCHED_BLESS").is_ok_and(|v| v == "1") {
                // A metric added on purpose: write what it renders now, then review the diff.
                let path = format!("{}/../../testdata/{expected}", env!("CARGO_MANIFEST_DIR"));
                std::fs::write(&path, render(&status)).unwrap();
            }
            let (text, want) = (render(&status), testdata(expected));
            for (i, (got, want)) in text.lines().zip(want.lines()).enumerate() {
                assert_eq!(got, want, "{sample}: line {}", i + 1);
            }
            assert_eq!(text, want, "{sample}");
        }
        let empty = render(&Status::default());
        assert!(empty.starts_with("# HELP cosched_hint_to_applied_seconds From reading a guest frame"), "{empty}");
    }

    /// The daemon's own build is a metric (a status read from JSON knows no build: none).
    #[test]
    fn the_build_is_a_metric() {
        let mut status = Status::default();
        status.daemon.build = crate::build();
        let text = render(&status);
        let line = text.lines().find(|l| l.starts_with("cosched_build_info{")).unwrap_or_else(|| panic!("{text}"));
        assert!(line.starts_with(&format!("cosched_build_info{{version=\"{}\",commit=\"", env!("CARGO_PKG_VERSION"))));
        assert!(line.ends_with("\"} 1"), "{line}");
        assert!(text.contains("# TYPE cosched_build_info gauge\n"), "{text}");
        let names: Vec<&str> = families().iter().map(|f| f.0).collect();
        assert!(names.contains(&"cosched_build_info") && names.contains(&"cosched_vm_boosts_total"), "{names:?}");
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
