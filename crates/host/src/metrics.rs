//! Hint-to-applied latency (from reading a guest's frame to the last thread changed), kept as a
//! Prometheus histogram and as a ring of recent samples for exact percentiles.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

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

    /// The histogram, for the status snapshot the metrics are rendered from.
    pub fn histogram(&self) -> Histogram {
        Histogram { counts: self.buckets.to_vec(), count: self.count, sum_ns: self.sum_ns }
    }
}

/// A latency histogram as it appears in the status snapshot: counts per bucket of [`BUCKETS_US`]
/// (not cumulative; one more for +Inf).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Histogram {
    pub counts: Vec<u64>,
    pub count: u64,
    pub sum_ns: u64,
}

impl Histogram {
    /// Prometheus text lines for a histogram named `name` with extra `labels` (`k="v",...`).
    pub fn prometheus(&self, name: &str, labels: &str) -> String {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut out = String::new();
        let mut cumulative = 0;
        for (i, b) in BUCKETS_US.iter().enumerate() {
            cumulative += self.counts.get(i).copied().unwrap_or(0);
            out += &format!("{name}_bucket{{{labels}{sep}le=\"{}\"}} {cumulative}\n", *b as f64 / 1e6);
        }
        out += &format!("{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}\n", self.count);
        out += &format!("{name}_sum{{{labels}}} {}\n", self.sum_ns as f64 / 1e9);
        out += &format!("{name}_count{{{labels}}} {}\n", self.count);
        out
    }
}

/// Renders the Prometheus text format from a status snapshot (`cosched status --json`): what
/// the metrics show is exactly what the status shows. Every per-VM figure of a resource carries
/// a `resource` label.
pub fn render(status: &Value) -> String {
    // name -> (type, help, lines)
    let mut series: BTreeMap<&str, (&str, &str, Vec<String>)> = BTreeMap::new();
    let mut add = |name: &'static str, kind: &'static str, help: &'static str, labels: &str, value: f64| {
        let line = format!("{name}{{{labels}}} {value}");
        series.entry(name).or_insert((kind, help, Vec::new())).2.push(line);
    };
    let num = |v: &Value| v.as_f64().unwrap_or(0.0);
    let esc = |s: &str| s.replace(['"', '\\', '\n'], "_");
    if let Some(res) = status["resources"].as_object() {
        for (r, v) in res {
            let on = v["enabled"].as_bool() == Some(true);
            add(
                "cosched_enabled",
                "gauge",
                "Coordination of the resource enabled for the host.",
                &format!("resource=\"{r}\""),
                on as u8 as f64,
            );
        }
    }
    let mw = &status["membw"];
    if let Some(b) = mw["backend"].as_str() {
        let l = format!("backend=\"{b}\"");
        add(
            "cosched_membw_guaranteed_mbps",
            "gauge",
            "The host's declared guaranteed memory bandwidth.",
            &l,
            num(&mw["guaranteed_mbps"]),
        );
        add("cosched_membw_period_ms", "gauge", "The memory-bandwidth regulation period.", &l, num(&mw["period_ms"]));
        add(
            "cosched_membw_best_effort",
            "gauge",
            "1 if best effort is on.",
            &l,
            (mw["best_effort"].as_bool() == Some(true)) as u8 as f64,
        );
        add(
            "cosched_membw_reclaim",
            "gauge",
            "1 if reclaim is on.",
            &l,
            (mw["reclaim"].as_bool() == Some(true)) as u8 as f64,
        );
        add(
            "cosched_membw_committed_permille",
            "gauge",
            "Memory-bandwidth shares in force, in total.",
            &l,
            num(&mw["committed_permille"]),
        );
    }
    let mut hist = String::new();
    for vm in status["vms"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let l = format!("vm=\"{}\"", esc(vm["name"].as_str().unwrap_or("?")));
        let k = &vm["counters"];
        add(
            "cosched_vm_registered",
            "gauge",
            "1 if the guest agent is registered.",
            &l,
            (vm["registered"].as_bool() == Some(true)) as u8 as f64,
        );
        add("cosched_vm_frames_total", "counter", "Well-formed frames received.", &l, num(&k["frames"]));
        add(
            "cosched_vm_malformed_total",
            "counter",
            "Malformed frames and garbage runs received.",
            &l,
            num(&k["malformed"]),
        );
        add(
            "cosched_vm_read_held_total",
            "counter",
            "Times the VM's channel was left unread for sending past [policy] read_rate.",
            &l,
            num(&vm["read_held"]),
        );
        for (reason, n) in k["denied"].as_object().into_iter().flatten() {
            add(
                "cosched_vm_denied_total",
                "counter",
                "DENY replies by resource and reason.",
                &format!("{l},resource=\"\",reason=\"{reason}\""),
                num(n),
            );
        }
        let m = &vm["membw"];
        if m.is_object() {
            let st = &m["stats"];
            add(
                "cosched_vm_membw_share_permille",
                "gauge",
                "Memory-bandwidth share in force (permille of the guaranteed bandwidth).",
                &l,
                num(&m["effective_permille"]),
            );
            add(
                "cosched_vm_membw_throttled",
                "gauge",
                "1 if the VM's vCPUs are held back (frozen, or slowed by resctrl MBA) for memory bandwidth now.",
                &l,
                (m["stopped"].as_bool() == Some(true)) as u8 as f64,
            );
            add(
                "cosched_vm_membw_stopping",
                "gauge",
                "1 if the VM is to be held back for memory bandwidth but its freezer group is not frozen yet \
                 (a vCPU in uninterruptible sleep keeps a v1 group FREEZING).",
                &l,
                (m["throttled"].as_bool() == Some(true) && m["stopped"].as_bool() != Some(true)) as u8 as f64,
            );
            add(
                "cosched_vm_membw_bytes_total",
                "counter",
                "Memory bytes moved, as the backend counts them.",
                &l,
                num(&st["bytes"]),
            );
            add(
                "cosched_vm_membw_throttles_total",
                "counter",
                "Times the daemon decided to hold the VM back for memory bandwidth (a stop not yet confirmed by the \
                 freezer counts too; cosched_vm_membw_unconfirmed_throttles_total counts those never confirmed).",
                &l,
                num(&st["throttles"]),
            );
            add(
                "cosched_vm_membw_throttled_seconds_total",
                "counter",
                "Time held back for memory bandwidth, from the freezer's confirmation (or the MBA change) to the \
                 release.",
                &l,
                num(&st["throttled_ns"]) / 1e9,
            );
            add(
                "cosched_vm_membw_stopping_seconds_total",
                "counter",
                "Time between a decision to hold the VM back and the freezer's confirmation that it is stopped.",
                &l,
                num(&st["stopping_ns"]) / 1e9,
            );
            add(
                "cosched_vm_membw_unconfirmed_throttles_total",
                "counter",
                "Decisions to hold the VM back that ended before the freezer confirmed the stop.",
                &l,
                num(&st["unconfirmed_throttles"]),
            );
            add(
                "cosched_vm_membw_borrowed_bytes_total",
                "counter",
                "Bytes borrowed from other VMs' unused budget.",
                &l,
                num(&st["borrowed_bytes"]),
            );
        }
        for (r, s) in vm["resources"].as_object().into_iter().flatten() {
            let lr = format!("{l},resource=\"{r}\"");
            let c = &s["counters"];
            let boosted_s = num(&c["boosted_ns"]) / 1e9 + num(&s["boosted_for_ms"]) / 1e3;
            add(
                "cosched_vm_boosted",
                "gauge",
                "1 if the VM is boosted now on the resource.",
                &lr,
                (s["level"].as_str() != Some("normal")) as u8 as f64,
            );
            add("cosched_vm_boosts_total", "counter", "Boosts started.", &lr, num(&c["boosts"]));
            add("cosched_vm_boosted_seconds_total", "counter", "Time spent boosted.", &lr, boosted_s);
            add(
                "cosched_vm_requests_total",
                "counter",
                "Requests for the resource (guest frames or host events).",
                &lr,
                num(&c["requests"]),
            );
            add(
                "cosched_vm_budget_exhausted_total",
                "counter",
                "Boosts ended by a budget.",
                &lr,
                num(&c["budget_exhausted"]),
            );
            add(
                "cosched_vm_guard_demotions_total",
                "counter",
                "Times the real-time guard moved vCPUs off the real-time class.",
                &lr,
                num(&c["guard_demotions"]),
            );
            if r == "cpu" {
                rt_series(&mut add, &lr, &s["rt"]);
            }
            if r == "event" {
                for (key, name, help, scale) in [
                    ("events", "cosched_vm_events_total", "Device events for the VM (FEAS).", 1.0),
                    ("postponed", "cosched_vm_events_postponed_total", "Events postponed past n_limit or a debt.", 1.0),
                    ("slices", "cosched_vm_event_slices_total", "Event boosts ended by their slice.", 1.0),
                    ("blocked", "cosched_vm_event_blocked_total", "Event boosts ended by the vCPU blocking.", 1.0),
                    (
                        "boosted_cpu_ns",
                        "cosched_vm_event_boosted_cpu_seconds_total",
                        "CPU time the vCPUs ran while event-boosted.",
                        1e-9,
                    ),
                    ("repaid_ns", "cosched_vm_event_repaid_seconds_total", "Boosted CPU time paid back.", 1e-9),
                ] {
                    add(name, "counter", help, &lr, num(&c[key]) * scale);
                }
            }
            for (reason, n) in c["denied"].as_object().into_iter().flatten() {
                add(
                    "cosched_vm_denied_total",
                    "counter",
                    "DENY replies by resource and reason.",
                    &format!("{lr},reason=\"{reason}\""),
                    num(n),
                );
            }
        }
        if let Ok(h) = serde_json::from_value::<Histogram>(vm["latency_histogram"].clone()) {
            hist += &h.prometheus("cosched_hint_to_applied_seconds", &l);
        }
    }
    let mut out = String::new();
    for (name, (kind, help, lines)) in series {
        out += &format!("# HELP {name} {help}\n# TYPE {name} {kind}\n");
        for l in lines {
            out += &l;
            out.push('\n');
        }
    }
    out += "# HELP cosched_hint_to_applied_seconds From reading a guest frame to its threads changed.\n# TYPE cosched_hint_to_applied_seconds histogram\n";
    out += &hist;
    out
}

/// A VM's predictive boost (`cosched_core::rt`): predictions by outcome, the lead, the error and
/// how late planned boosts were applied (their recent median and 99th percentile).
fn rt_series(add: &mut impl FnMut(&'static str, &'static str, &'static str, &str, f64), lr: &str, rt: &Value) {
    let num = |v: &Value| v.as_f64().unwrap_or(0.0);
    for (outcome, n) in rt["predictions"].as_object().into_iter().flatten() {
        add(
            "cosched_vm_predictions_total",
            "counter",
            "Predicted RT wake-ups (WAKE) by outcome.",
            &format!("{lr},outcome=\"{outcome}\""),
            num(n),
        );
    }
    add(
        "cosched_vm_predict_lead_seconds",
        "gauge",
        "How long before a predicted wake-up its boost comes.",
        lr,
        num(&rt["lead_us"]) / 1e6,
    );
    for (q, key) in [("0.5", "p50_us"), ("0.99", "p99_us")] {
        add(
            "cosched_vm_predict_error_seconds",
            "gauge",
            "Arrival of the confirming CPU 1 minus the predicted wake-up (recent quantiles).",
            &format!("{lr},quantile=\"{q}\""),
            num(&rt["predict_error_us"][key]) / 1e6,
        );
        add(
            "cosched_vm_predict_apply_late_seconds",
            "gauge",
            "Predicted boosts: applied minus planned time (recent quantiles).",
            &format!("{lr},quantile=\"{q}\""),
            num(&rt["predict_apply_late_us"][key]) / 1e6,
        );
    }
    if let Some(h) = rt["host_priority"].as_u64() {
        add(
            "cosched_vm_rt_host_priority",
            "gauge",
            "Host SCHED_FIFO priority of an RT co-scheduling grant.",
            lr,
            h as f64,
        );
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
        let text = l.histogram().prometheus("lat_seconds", "vm=\"a\"");
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
