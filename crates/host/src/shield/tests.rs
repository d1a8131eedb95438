use super::*;

const FIXED: &str = "/proc/sys/kernel/cap_last_cap";

/// The CPU the fixed IRQ 27 reads as.
fn fixed_cpu() -> usize {
    fs::read_to_string(FIXED).unwrap().trim().parse().unwrap()
}

struct Fake {
    _d: tempfile::TempDir,
    irq: PathBuf,
    cg: CgroupFs,
    proc: PathBuf,
    state: PathBuf,
}

fn fake(v1: bool) -> Fake {
    let d = tempfile::tempdir().unwrap();
    let (irq, proc, root, state) =
        (d.path().join("irq"), d.path().join("proc"), d.path().join("cg"), d.path().join("state"));
    for (n, aff) in [(24, "0-3"), (25, "2"), (26, "0-1"), (27, "3")] {
        fs::create_dir_all(irq.join(n.to_string())).unwrap();
        fs::write(irq.join(format!("{n}/smp_affinity_list")), format!("{aff}\n")).unwrap();
    }
    // IRQ 27's affinity is fixed by the kernel: reads give a CPU, writes fail. A read-only
    // sysctl that reads as a number stands in (mode 0444: even root cannot write it).
    fs::remove_file(irq.join("27/smp_affinity_list")).unwrap();
    std::os::unix::fs::symlink(FIXED, irq.join("27/smp_affinity_list")).unwrap();
    if v1 {
        fs::create_dir_all(root.join("cpuset/hostjobs")).unwrap();
        fs::write(root.join("cpuset/tasks"), "").unwrap();
        fs::write(root.join("cpuset/cpuset.effective_cpus"), "0-3\n").unwrap();
        fs::write(root.join("cpuset/hostjobs/cpuset.cpus"), "0-3\n").unwrap();
    } else {
        fs::create_dir_all(root.join("system.slice")).unwrap();
        fs::write(root.join("cgroup.controllers"), "cpuset cpu io\n").unwrap();
        fs::write(root.join("cpuset.cpus.effective"), "0-3\n").unwrap();
        fs::write(root.join("system.slice/cpuset.cpus"), "\n").unwrap();
        fs::write(root.join("system.slice/cpuset.cpus.effective"), "0-3\n").unwrap();
    }
    // Kernel threads: ksoftirqd/2 bound to CPU 2, kthreadd everywhere; a user process on 2.
    for (pid, comm, flags, cpus) in
        [(20, "ksoftirqd/2", 0x208040, "2"), (2, "kthreadd", 0x208040, "0-3"), (300, "job", 0x400100, "2")]
    {
        fs::create_dir_all(proc.join(pid.to_string())).unwrap();
        fs::write(proc.join(format!("{pid}/stat")), format!("{pid} ({comm}) S 2 0 0 0 -1 {flags} 0 0")).unwrap();
        fs::write(proc.join(format!("{pid}/status")), format!("Name:\t{comm}\nCpus_allowed_list:\t{cpus}\n")).unwrap();
    }
    fs::create_dir_all(&state).unwrap();
    Fake { irq, cg: CgroupFs::new(&proc, &root), proc, state, _d: d }
}

fn shield(f: &Fake, groups: &[&str]) -> HostShield {
    let cfg = ShieldConfig {
        host_groups: groups.iter().map(|s| s.to_string()).collect(),
        irq_dir: f.irq.clone(),
        ..Default::default()
    };
    HostShield::new(cfg, f.cg.clone(), &f.proc, &f.state)
}

fn irq(f: &Fake, n: u32) -> String {
    fs::read_to_string(f.irq.join(format!("{n}/smp_affinity_list"))).unwrap().trim().to_string()
}

#[test]
fn cpu_lists_parse_and_format_like_the_kernel() {
    assert_eq!(format_cpus(&parse_cpus("0-2,5,7-8").unwrap()), "0-2,5,7-8");
    assert_eq!(format_cpus(&parse_cpus(" 3 \n").unwrap()), "3");
    assert!(parse_cpus("").unwrap().is_empty());
    assert!(parse_cpus("2-1").is_err());
    assert!(parse_cpus("a").is_err());
}

#[test]
fn irqs_and_named_groups_leave_the_shield_and_come_back_exactly() {
    let f = fake(true);
    let mut s = shield(&f, &["/hostjobs"]);
    let mut shielded = parse_cpus("2-3").unwrap();
    shielded.insert(fixed_cpu());
    let r = s.apply(&shielded).clone();
    assert_eq!(r.housekeeping_cpus, "0-1");
    assert_eq!((irq(&f, 24), irq(&f, 25), irq(&f, 26)), ("0-1".into(), "0-1".into(), "0-1".into()));
    assert_eq!(r.irqs_moved, vec![24, 25], "26 was not on the shield");
    assert_eq!(r.irqs_fixed.len(), 1, "{r:?}");
    assert!(r.irqs_fixed[0].starts_with("27:"), "{r:?}");
    assert_eq!(f.cg.read("cpuset", "/hostjobs", "cpuset.cpus").unwrap(), "0-1");
    assert_eq!(r.groups_moved, vec!["/hostjobs".to_string()]);
    assert_eq!(r.kthreads_left, vec!["ksoftirqd/2".to_string()], "only kernel threads bound to a shielded CPU");
    assert!(f.state.join(RECORD_FILE).is_file(), "originals on disk");
    // Someone else moves IRQ 25 afterwards: theirs stays.
    fs::write(f.irq.join("25/smp_affinity_list"), "1").unwrap();
    assert!(s.apply(&Cpus::new()).errors.is_empty());
    assert_eq!((irq(&f, 24), irq(&f, 25), irq(&f, 26)), ("0-3".into(), "1".into(), "0-1".into()));
    assert_eq!(f.cg.read("cpuset", "/hostjobs", "cpuset.cpus").unwrap(), "0-3");
    assert!(!f.state.join(RECORD_FILE).exists(), "nothing left to restore");
}

#[test]
fn a_restarted_daemon_puts_back_what_a_killed_one_left() {
    let f = fake(true);
    let mut s = shield(&f, &["/hostjobs"]);
    s.apply(&parse_cpus("3").unwrap());
    assert_eq!(irq(&f, 24), "0-2");
    drop(s); // kill -9: nothing restored
    let mut again = shield(&f, &["/hostjobs"]);
    assert_eq!(again.restore_leftover().map_err(|e| e.to_string()), Ok(2));
    assert_eq!(irq(&f, 24), "0-3");
    assert_eq!(f.cg.read("cpuset", "/hostjobs", "cpuset.cpus").unwrap(), "0-3");
    assert_eq!(again.restore_leftover().map_err(|e| e.to_string()), Ok(0));
}

#[test]
fn v2_groups_with_inherited_cpus_are_narrowed_and_inherit_again() {
    let f = fake(false);
    let mut s = shield(&f, &["/system.slice"]);
    let r = s.apply(&parse_cpus("3").unwrap()).clone();
    assert!(r.errors.is_empty(), "{r:?}");
    assert_eq!(f.cg.read("", "/system.slice", "cpuset.cpus").unwrap(), "0-2");
    s.apply(&Cpus::new());
    assert_eq!(f.cg.read("", "/system.slice", "cpuset.cpus").unwrap(), "", "back to inheriting the parent's");
}

#[test]
fn a_shield_that_leaves_no_housekeeping_cpu_is_refused_and_changes_nothing() {
    let f = fake(true);
    let mut s = shield(&f, &["/hostjobs"]);
    let r = s.apply(&parse_cpus("0-3").unwrap()).clone();
    assert!(r.errors[0].contains("no CPU"), "{r:?}");
    assert_eq!(irq(&f, 24), "0-3");
    assert!(!f.state.join(RECORD_FILE).exists());
}

/// The typed errors say what the strings said, word for word (the status and the log show them).
#[test]
fn errors_say_what_and_where() {
    let f = fake(true);
    assert_eq!(parse_cpus("2-1").unwrap_err().to_string(), r#""2-1" is not a CPU list like "1", "2-3" or "0,4-5""#);
    let s = shield(&f, &[]);
    assert_eq!(
        s.housekeeping(&parse_cpus("0-3").unwrap()).unwrap_err().to_string(),
        "shielding CPUs 0-3 would leave the host no CPU for everything else"
    );
    let mut cfg = ShieldConfig { housekeeping_cpus: Some("1-2".into()), ..Default::default() };
    let s = HostShield::new(cfg.clone(), f.cg.clone(), &f.proc, &f.state);
    assert_eq!(
        s.housekeeping(&parse_cpus("2").unwrap()).unwrap_err().to_string(),
        "housekeeping CPU 2 is also shielded"
    );
    cfg.housekeeping_cpus = Some("x".into());
    let s = HostShield::new(cfg, f.cg.clone(), &f.proc, &f.state);
    assert_eq!(
        s.housekeeping(&parse_cpus("2").unwrap()).unwrap_err().to_string(),
        r#"[shield] housekeeping_cpus: "x" is not a CPU list like "1", "2-3" or "0,4-5""#
    );
    let record = f.state.join(RECORD_FILE);
    fs::write(&record, r#"{"version": 7, "changed": []}"#).unwrap();
    let mut s = shield(&f, &[]);
    let e = s.restore_leftover().unwrap_err().to_string();
    assert_eq!(e, format!("{}: format 7 (this cosched reads 1), kept", record.display()));
    fs::write(&record, "{").unwrap();
    let e = s.restore_leftover().unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}: corrupt, kept for you: ", record.display())), "{e}");
    let two = ShieldError::NotRestored(vec![
        ShieldError::HousekeepingShielded { cpu: 1 },
        ShieldError::HousekeepingShielded { cpu: 2 },
    ]);
    assert_eq!(two.to_string(), "housekeeping CPU 1 is also shielded; housekeeping CPU 2 is also shielded");
}
