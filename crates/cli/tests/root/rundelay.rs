//! The run delay the daemon delivers, measured by the host (host BPF), on the real kernel: a
//! fake vCPU that spins 5 ms and sleeps 5 ms, pinned beside two CPU hogs, waits longer to run
//! at normal than boosted (its mean and p99), in the metric and in `cosched status`. Part of `root.rs`.

use cosched_status::RunDelay;

use super::*;

/// CPU hogs pinned on one CPU; killed when dropped.
struct Hogs(Vec<Child>);

impl Hogs {
    fn on(cpu: usize, n: usize) -> Hogs {
        let cpu = cpu.to_string();
        Hogs(
            (0..n)
                .map(|_| Command::new("taskset").args(["-c", &cpu, "sh", "-c", "while :; do :; done"]).spawn().unwrap())
                .collect(),
        )
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for h in &mut self.0 {
            let _ = h.kill();
            let _ = h.wait();
        }
    }
}

/// VM `vm`'s run delays at `level`, from the status.
fn delays(d: &Daemon, vm: &str, level: &str) -> RunDelay {
    d.vm_status(vm).and_then(|v| serde_json::from_value(v["run_delay"][level].clone()).ok()).unwrap_or_default()
}

/// `cosched_vcpu_run_delay_seconds` of `vm` at `level` from `cosched metrics`: (sum in s,
/// count).
fn metric(d: &Daemon, vm: &str, level: &str) -> (f64, f64) {
    let text = String::from_utf8(d.cli(&["metrics"]).stdout).unwrap();
    let labels = format!("{{vm=\"{vm}\",level=\"{level}\"}} ");
    let value = |suffix: &str| {
        let head = format!("cosched_vcpu_run_delay_seconds{suffix}{labels}");
        text.lines()
            .find_map(|l| l.strip_prefix(&head))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {head} in the metrics:\n{text}"))
    };
    (value("_sum"), value("_count"))
}

#[test]
fn the_run_delay_beside_two_hogs_is_larger_at_normal_than_boosted_in_the_metric_and_in_status() {
    if !have_root() {
        return;
    }
    let _heavy = cpu_heavy();
    let w = World::new();
    let d = w.daemon(QUIET_POLICY);
    if d.status()["run_delay"]["measured_by"].is_null() {
        panic!("the run delay is not measured on this host: {}", d.status()["run_delay"]);
    }
    let exe = w.fake_qemu("rd", "qemu-system-x86_64");
    let args: Vec<String> = ["--spin", "CPU 0/TCG"].iter().map(|s| s.to_string()).collect();
    let mut vm = w.vm_args(&exe, "rd", &args, &["CPU 0/TCG"], None);
    d.wait_vm("rd");
    // An agent: no event boosting for this VM ([event] vms = "no-agent"), so only the two
    // levels the test sets.
    vm.register();
    let vcpu = vm.tid("CPU 0/TCG");
    sched::set_affinity(vcpu, &[1]).unwrap();
    // This test's own threads stay off the contended CPU.
    sched::set_affinity(0, &[0]).unwrap();
    let _hogs = Hogs::on(1, 2);
    let enough = 200;
    let seen = |level: &str| {
        let d = &d;
        let level = level.to_string();
        move || format!("; {level}: {:?}; the VM's status: {}", delays(d, "rd", &level), d.vm_status("rd").unwrap())
    };
    let normal = wait_for_or(
        &format!("{enough} run delays at normal"),
        Duration::from_secs(15),
        || Some(delays(&d, "rd", "normal")).filter(|r| r.count >= enough),
        seen("normal"),
    );
    let metric_normal = metric(&d, "rd", "normal");

    assert_eq!(vm.request(Kind::Cpu, 1), Frame::ack(2, 1));
    assert!(vm.boosted_soon(1), "{:?}", vm.attrs());
    let boosted = wait_for_or(
        &format!("{enough} run delays boosted"),
        Duration::from_secs(15),
        || Some(delays(&d, "rd", "boosted")).filter(|r| r.count >= enough),
        seen("boosted"),
    );
    let metric_boosted = metric(&d, "rd", "boosted");
    let text = String::from_utf8(d.cli(&["status", "rd"]).stdout).unwrap();
    assert_eq!(vm.request(Kind::Cpu, 0), Frame::ack(3, 0));
    assert!(vm.none_realtime(), "{:?}", vm.attrs());

    let q = |r: &RunDelay, p: f64| r.quantile_ns(p).unwrap() / 1e3;
    eprintln!(
        "run delay beside two hogs (µs): normal p50 {:.1} p99 {:.1} mean {:.1} (n {}); boosted p50 {:.1} p99 {:.1} \
         mean {:.1} (n {}); metric means {:.1} / {:.1}",
        q(&normal, 0.5),
        q(&normal, 0.99),
        normal.mean_ns().unwrap() / 1e3,
        normal.count,
        q(&boosted, 0.5),
        q(&boosted, 0.99),
        boosted.mean_ns().unwrap() / 1e3,
        boosted.count,
        metric_normal.0 / metric_normal.1 * 1e6,
        metric_boosted.0 / metric_boosted.1 * 1e6,
    );
    // The effect is large (SCHED_RR against two SCHED_OTHER hogs), in the tail and the mean:
    // seen 130-170x in the mean, 250-500x at p99. Not at p50: at normal most waits are
    // wake-ups, which EEVDF runs at once (a sleeper's lag), as fast as boosted (6-8 µs); the
    // long ones are the spinning vCPU preempted by the hogs (2-4 ms).
    assert!(q(&normal, 0.99) > 10.0 * q(&boosted, 0.99), "p99: normal {normal:?}, boosted {boosted:?}");
    let (mean_normal, mean_boosted) = (metric_normal.0 / metric_normal.1, metric_boosted.0 / metric_boosted.1);
    assert!(
        metric_normal.1 >= enough as f64 && metric_boosted.1 >= enough as f64,
        "metric counts {metric_normal:?} {metric_boosted:?}"
    );
    assert!(mean_normal > 10.0 * mean_boosted, "metric means: normal {mean_normal} s, boosted {mean_boosted} s");
    // Status shows both levels on the VM's run-delay line.
    let line = text.lines().find(|l| l.trim_start().starts_with("run delay:")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("boosted p50 ") && line.contains("normal p50 "), "{line}");
}

#[test]
fn with_run_delay_off_nothing_is_measured_and_status_says_why() {
    if !have_root() {
        return;
    }
    let w = World::new();
    let d = w.daemon(&format!("{QUIET_POLICY}[event]\nrun_delay = false\n"));
    let exe = w.fake_qemu("rd", "qemu-system-x86_64");
    let args: Vec<String> = ["--spin", "CPU 0/TCG"].iter().map(|s| s.to_string()).collect();
    let _vm = w.vm_args(&exe, "rd", &args, &["CPU 0/TCG"], None);
    d.wait_vm("rd");
    // The vCPU spins 5 ms and sleeps 5 ms: 100 ms is 10 wake-ups that would have counted.
    std::thread::sleep(Duration::from_millis(100));
    let st = d.status();
    assert_eq!(st["run_delay"]["unsupported"], "it is off ([event] run_delay = false)", "{}", st["run_delay"]);
    assert!(d.vm_status("rd").unwrap()["run_delay"].is_null(), "{}", d.vm_status("rd").unwrap());
    let text = String::from_utf8(d.cli(&["status"]).stdout).unwrap();
    assert!(text.contains("run delay: unsupported here because it is off ([event] run_delay = false)\n"), "{text}");
}
