use serde_json::{json, Value};

use super::*;

fn status(pid: u64, boosts: u64, boosted_ns: u64, denied: u64, level: &str) -> Status {
    serde_json::from_value(json!({
        "resources": {"cpu": {"enabled": true}, "io": {"enabled": false}},
        "latency": {"p50_us": 15, "p99_us": 600},
        "vms": [{
            "name": "vm1", "pid": pid,
            "resources": {
                "cpu": {"active": true, "level": level, "boosted_for_ms": 0.0,
                        "counters": {"boosts": boosts, "boosted_ns": boosted_ns, "denied": {"budget": denied}}},
                "io": {"active": false, "level": "normal", "boosted_for_ms": 0.0,
                       "counters": {"boosts": 0, "boosted_ns": 0, "denied": {}}}
            },
            "membw": {"last_period_mbps": 512.4, "guarantee_mbps": 700.0, "throttled": true}
        }]
    }))
    .unwrap()
}

#[test]
fn the_watch_view_shows_each_vm_per_resource_with_rates_since_the_last_redraw() {
    let first = watch_frame(None, &status(7, 10, 1_000_000_000, 1, "normal"));
    assert!(first.contains("1 VM(s); cpu on, io OFF; hint-to-applied p50 15 µs, p99 600 µs"), "{first}");
    assert!(first.contains("rates from the next redraw"), "{first}");
    let row =
        |f: &str, res: &str| f.lines().skip(3).find(|l| l.split_whitespace().any(|w| w == res)).unwrap().to_string();
    let cpu = row(&first, "cpu");
    assert_eq!(cpu.split_whitespace().collect::<Vec<_>>()[..7], ["vm1", "7", "cpu", "normal", "10", "-", "-"]);
    assert!(cpu.ends_with("512 MB/s of 700.0 guaranteed, THROTTLED"), "{cpu}");
    // 2 s later: 10 more boosts, 1 s more boosted, 4 more denials.
    let prev = status(7, 10, 1_000_000_000, 1, "normal");
    let next = watch_frame(Some((&prev, 2.0)), &status(7, 20, 2_000_000_000, 5, "boosted"));
    let cpu = row(&next, "cpu");
    assert_eq!(
        cpu.split_whitespace().collect::<Vec<_>>()[..8],
        ["vm1", "7", "cpu", "boosted", "20", "5.0", "50%", "2.0"]
    );
    assert_eq!(row(&next, "io").split_whitespace().collect::<Vec<_>>()[..2], ["io", "off"]);
    // A VM restarted (another pid) under the same name has no rates yet.
    let restarted = watch_frame(Some((&prev, 2.0)), &status(8, 1, 0, 0, "normal"));
    assert_eq!(row(&restarted, "cpu").split_whitespace().nth(5), Some("-"));
    let none: Status =
        serde_json::from_value(json!({"vms": [], "daemon": {"socket_dir": "/run/cosched/vms"}})).unwrap();
    assert!(watch_frame(None, &none).contains("no VMs (socket directory /run/cosched/vms)"));
}

fn testdata(rel: &str) -> String {
    let path = format!("{}/../../testdata/{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn sample(rel: &str) -> Status {
    let v: Value = serde_json::from_str(&testdata(rel)).unwrap();
    serde_json::from_value(v).unwrap()
}

fn same_text(got: &str, want: &str, what: &str) {
    for (i, (g, w)) in got.lines().zip(want.lines()).enumerate() {
        assert_eq!(g, w, "{what}: line {}", i + 1);
    }
    assert_eq!(got, want, "{what}");
}

/// `cosched status` and `--watch` print from the typed status what they printed from the JSON
/// of the captured samples (testdata/status-v1/expected).
#[test]
fn the_captured_samples_print_as_they_did() {
    for (json, name) in [
        ("status-v1.json", "status"),
        ("status-v1/unprivileged.json", "unprivileged"),
        ("status-v1/events.json", "events"),
    ] {
        let s = sample(json);
        same_text(&text(&s), &testdata(&format!("status-v1/expected/{name}.txt")), name);
        same_text(&watch_frame(None, &s), &testdata(&format!("status-v1/expected/{name}.watch")), name);
    }
    let (before, after) = (sample("status-v1.json"), sample("status-v1/later.json"));
    let frame = watch_frame(Some((&before, 1.25)), &after);
    same_text(&frame, &testdata("status-v1/expected/status-then-later.watch"), "status then later");
}

#[test]
fn membw_prints_the_regulation_or_why_there_is_none() {
    let m = membw_text(&sample("status-v1.json").membw);
    assert!(m.starts_with("membw: *** SIMULATED"), "{m}");
    assert!(m.contains("membw: simulated counters, 1000 MB/s guaranteed, 500‰ committed; period 100 ms"), "{m}");
    let off = membw_text(&sample("status-v1/unprivileged.json").membw);
    assert_eq!(off, "membw: unsupported here: off: [membw] backend = \"off\"\n");
}

fn delays(bucket: usize, n: u64) -> RunDelay {
    let mut counts = vec![0; cosched_status::rundelay::RUN_DELAY_BUCKETS];
    counts[bucket] = n;
    RunDelay { counts, count: n, sum_ns: n << bucket }
}

#[test]
fn the_run_delay_shows_per_level_and_in_the_watch_since_the_last_redraw() {
    let mut s = status(1, 0, 0, 0, "normal");
    s.vms[0].run_delay.insert("normal".into(), delays(20, 100));
    s.vms[0].run_delay.insert("boosted".into(), delays(10, 10));
    let text = text(&s);
    assert!(
        text.contains("    run delay: boosted p50 1.5 µs p99 2.0 µs (n 10); normal p50 1.6 ms p99 2.1 ms (n 100)\n"),
        "{text}"
    );
    // The watch: only what the last interval added.
    let mut later = s.clone();
    later.vms[0].run_delay.insert("boosted".into(), delays(10, 30));
    let frame = watch_frame(Some((&s, 1.0)), &later);
    assert!(frame.contains("run delay since: boosted p50 1.5 µs p99 2.0 µs (n 20)\n"), "{frame}");
    // Nothing measured: no line; not measurable here: why.
    let mut none = status(1, 0, 0, 0, "normal");
    none.run_delay.unsupported = Some("it is measured by event boosting's host BPF, which does not run here".into());
    let text = super::text(&none);
    assert!(!text.contains("    run delay"), "{text}");
    assert!(text.contains("run delay: unsupported here because it is measured by"), "{text}");
}
