//! Runtime control that persists, on the real kernel: the operator's settings survive a
//! restart of the daemon (SIGTERM and SIGKILL alike) and are shown as the operator's until
//! reset; `cosched reload` and SIGHUP apply a changed config's difference and nothing else,
//! refuse a broken config whole and name the keys that need a restart; `cosched disable --all`
//! takes the static tunings off too. Part of `root.rs` (its `World`, fake QEMU and checks).

use super::*;

/// `cosched ARGS` against `d`, which must succeed: its stdout.
fn ok(d: &Daemon, args: &[&str]) -> String {
    let out = d.cli(args);
    assert!(out.status.success(), "cosched {args:?}: {out:?}\n{}", d.log_tail());
    String::from_utf8(out.stdout).unwrap()
}

/// `cosched ARGS` against `d`, which must fail: its stderr.
fn refused(d: &Daemon, args: &[&str]) -> String {
    let out = d.cli(args);
    assert!(!out.status.success(), "cosched {args:?} passed: {out:?}");
    String::from_utf8(out.stderr).unwrap()
}

/// Whether every setting in `from` (a status's `settings_from`) is the config's: then the
/// status leaves it out.
fn by_config(from: &Value) -> bool {
    from.is_null()
}

fn pid_of(d: &Daemon) -> i32 {
    d.child.as_ref().unwrap().id() as i32
}

/// The VM boosted again by its guest after a new daemon connected to it: the guest's
/// registration is gone with the old daemon.
fn boost_again(vm: &mut FakeVm) {
    while vm.rx.try_recv().is_ok() {}
    assert_eq!(vm.request(Kind::Cpu, 1).deny_reason(), Some(DenyReason::NotRegistered));
    vm.register();
    assert_eq!(vm.request(Kind::Cpu, 1).kind, Kind::Ack);
}

const TWO_VMS: &str = "[vm.vm1]\npriority = 3\n[vm.vm2]\npriority = 4\n";

#[test]
fn operator_settings_survive_a_daemon_restart_and_a_sigkill_until_reset() {
    if !have_root() {
        return;
    }
    let w = World::new();
    let config = format!("{QUIET_POLICY}[vm.vm2]\npriority = 2\n");
    let d = w.daemon(&config);
    let mut vm1 = w.vm("vm1", "qemu-system-x86_64", &THREADS);
    d.wait_vm("vm1");
    vm1.register();
    vm1.request(Kind::Cpu, 1);
    assert!(vm1.boosted_soon(1));
    ok(&d, &["vm", "priority", "vm1", "7"]);
    assert!(vm1.boosted_soon(7));
    // vm2 is configured, not running: its setting is kept by name.
    ok(&d, &["vm", "priority", "vm2", "5"]);
    ok(&d, &["vm", "disable", "vm2", "cpu"]);
    let e = refused(&d, &["vm", "priority", "vm3", "5"]);
    assert!(e.contains("no VM named \"vm3\" (connected: vm1) and no [vm.vm3] in the config"), "{e}");
    ok(&d, &["disable", "io"]);
    let st = d.status();
    assert_eq!(st["settings_from"]["enabled.io"], "operator", "{st:#}");
    assert_eq!(st["settings_from"]["enabled.cpu"], "config");
    assert_eq!(st["settings_waiting"]["vm2"], serde_json::json!({"priority": "5", "enabled.cpu": "off"}));
    let vm = d.vm_status("vm1").unwrap();
    assert_eq!((vm["priority"].as_u64(), &vm["settings_from"]["priority"]), (Some(7), &Value::from("operator")));
    assert_eq!(vm["settings_from"]["enabled.cpu"], "config");
    let text = ok(&d, &["status"]);
    assert!(text.contains("set by the operator (kept until `cosched vm reset vm1`): priority"), "{text}");
    assert!(
        text.contains("vm2 (not running): set by the operator, applies when it appears: enabled.cpu off, priority 5")
    );
    let kept = std::fs::read_to_string(w.state_dir().join(cosched_host::operator::OPERATOR_FILE)).unwrap();
    let kept: Value = serde_json::from_str(&kept).unwrap();
    assert_eq!(kept["version"], 1);
    assert_eq!(kept["vm"]["vm1"]["priority"], 7);

    let mut d = d;
    for how in ["SIGTERM", "SIGKILL"] {
        d.signal(if how == "SIGTERM" { libc::SIGTERM } else { libc::SIGKILL });
        d = w.daemon(&config);
        d.wait_vm("vm1");
        boost_again(&mut vm1);
        assert!(vm1.boosted_soon(7), "{how}: the operator's priority again: {:?}", vm1.attrs());
        let st = d.status();
        assert_eq!(st["resources"]["io"]["enabled"], false, "{how}: {st:#}");
        assert_eq!(d.vm_status("vm1").unwrap()["settings_from"]["priority"], "operator", "{how}");
        assert!(st["settings_waiting"]["vm2"].is_object(), "{how}");
    }
    // vm2 appears: the operator's settings, not the config's.
    let _vm2 = w.vm("vm2", "qemu-system-x86_64", &THREADS);
    let vm = d.wait_vm("vm2");
    assert_eq!(
        (vm["priority"].as_u64(), vm["resources"]["cpu"]["enabled"].as_bool()),
        (Some(5), Some(false)),
        "{vm:#}"
    );
    assert!(d.status()["settings_waiting"].is_null());

    // Back to the config: one VM, then everything.
    let out = ok(&d, &["vm", "reset", "vm1"]);
    assert_eq!(out, "changed: vm1: priority 7 -> 1\n");
    assert!(vm1.boosted_soon(1), "the boost in force at the config's priority: {:?}", vm1.attrs());
    assert!(by_config(&d.vm_status("vm1").unwrap()["settings_from"]));
    let out = ok(&d, &["reset"]);
    assert!(
        out.contains("changed: io: off -> on (whole host)") && out.contains("changed: vm2: priority 5 -> 2"),
        "{out}"
    );
    assert!(out.contains("changed: vm2: cpu off -> on"), "{out}");
    let st = d.status();
    assert!(by_config(&st["settings_from"]) && st["resources"]["io"]["enabled"] == true, "{st:#}");
    assert!(!w.state_dir().join(cosched_host::operator::OPERATOR_FILE).exists(), "nothing kept: no file");
    assert_eq!(ok(&d, &["reset"]), "no change\n");
}

/// The steps both reloads take: a changed `[vm.vm1] priority` while vm1 and vm2 are boosted,
/// and a key that needs a restart. Returns vm1 and vm2.
fn reload_world(w: &World) -> (Daemon, FakeVm, FakeVm) {
    let d = w.daemon(&format!("{QUIET_POLICY}{TWO_VMS}"));
    let mut vm1 = w.vm("vm1", "qemu-system-x86_64", &THREADS);
    let mut vm2 = w.vm("vm2", "qemu-system-x86_64", &THREADS);
    d.wait_vm("vm1");
    d.wait_vm("vm2");
    for vm in [&mut vm1, &mut vm2] {
        vm.register();
        vm.request(Kind::Cpu, 1);
    }
    assert!(vm1.boosted_soon(3) && vm2.boosted_soon(4), "{:?} {:?}", vm1.attrs(), vm2.attrs());
    (d, vm1, vm2)
}

#[test]
fn reload_and_sighup_apply_a_changed_vm_priority_to_a_boosted_vm_and_touch_no_other() {
    if !have_root() {
        return;
    }
    for how in ["cosched reload", "SIGHUP"] {
        let w = World::new();
        let (d, vm1, vm2) = reload_world(&w);
        // vm2's threads as they are, and how often the daemon boosted and deboosted them.
        let vm2_changes = |d: &Daemon| {
            let c = &d.vm_status("vm2").unwrap()["resources"]["cpu"]["counters"];
            (c["boosts"].as_u64(), c["deboosts"].as_u64())
        };
        let (vm2_before, vm2_changes_before) = (vm2.attrs(), vm2_changes(&d));
        // The operator's setting on vm2, which the reload must keep too.
        std::fs::write(
            w.p("host.toml"),
            format!("rescan_ms = 900\n{QUIET_POLICY}[vm.vm1]\npriority = 6\n[vm.vm2]\npriority = 4\n"),
        )
        .unwrap();
        match how {
            "cosched reload" => {
                let out = ok(&d, &["reload"]);
                assert_eq!(out, "changed: vm1: priority 3 -> 6\nneeds a restart: rescan_ms\n", "{how}");
            }
            _ => {
                // SAFETY: signalling our own child.
                unsafe { libc::kill(pid_of(&d), libc::SIGHUP) };
                wait_for_or(
                    "the reload in the log",
                    Duration::from_secs(5),
                    || {
                        let log = std::fs::read_to_string(w.p("daemon.log")).unwrap();
                        (log.contains("reload: vm1: priority 3 -> 6")
                            && log.contains("reload: needs a restart: rescan_ms (left as it runs)"))
                        .then_some(())
                    },
                    || d.log_tail(),
                );
            }
        }
        assert!(vm1.boosted_soon(6), "{how}: vm1 at its new priority: {:?}", vm1.attrs());
        assert_eq!(vm2.attrs(), vm2_before, "{how}: vm2's threads untouched");
        assert!(vm2.all_boosted(4));
        assert_eq!(vm2_changes(&d), vm2_changes_before, "{how}: vm2 neither deboosted nor boosted again");
        let st = d.status();
        assert_eq!(d.vm_status("vm1").unwrap()["priority"], 6);
        assert_eq!(d.vm_status("vm2").unwrap()["priority"], 4);
        assert!(by_config(&st["settings_from"]), "a reload is the config's: {st:#}");
        assert!(by_config(&d.vm_status("vm1").unwrap()["settings_from"]), "{how}");
        // Nothing more to do: a second reload changes nothing (and still names the key).
        assert_eq!(ok(&d, &["reload"]), "needs a restart: rescan_ms\n", "{how}");
        // SIGHUP still rescans the socket directory.
        let log = std::fs::read_to_string(w.p("daemon.log")).unwrap();
        if how == "SIGHUP" {
            assert!(log.contains("SIGHUP: reloading the config, rescanning"), "{log}");
        }
    }
}

#[test]
fn a_broken_config_is_refused_whole_and_a_config_with_a_setting_of_the_operators_keeps_it() {
    if !have_root() {
        return;
    }
    let w = World::new();
    let (d, vm1, vm2) = reload_world(&w);
    let (vm1_before, vm2_before) = (vm1.attrs(), vm2.attrs());
    let status_before = d.status();
    // A typo, and a value out of range beside a change that alone would apply: refused whole.
    for (bad, why) in [
        (format!("{QUIET_POLICY}[vm.vm1]\npriority = 6\nprioritty = 5\n"), "unknown field `prioritty`"),
        (
            format!("{QUIET_POLICY}[vm.vm1]\npriority = 6\n[vm.vm2]\npriority = 0\n"),
            "[vm.vm2] priority = 0: out of range",
        ),
    ] {
        std::fs::write(w.p("host.toml"), &bad).unwrap();
        let e = refused(&d, &["reload"]);
        assert!(e.contains("refused, nothing changed") && e.contains(why), "{e}");
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid_of(&d), libc::SIGHUP) };
        wait_for_or(
            "SIGHUP's refusal in the log",
            Duration::from_secs(5),
            || {
                let log = std::fs::read_to_string(w.p("daemon.log")).unwrap();
                (log.matches("reload: refused, nothing changed").count() >= 1 && log.contains(why)).then_some(())
            },
            || d.log_tail(),
        );
        assert_eq!((vm1.attrs(), vm2.attrs()), (vm1_before.clone(), vm2_before.clone()), "nothing changed");
        let st = d.status();
        assert_eq!(st["vms"].as_array().unwrap().len(), 2);
        assert_eq!(d.vm_status("vm1").unwrap()["priority"], 3);
        assert_eq!(st["policy"], status_before["policy"]);
    }
    // Valid alone, not with what only a restart changes: the daemon runs at priority 99.
    std::fs::write(
        w.p("host.toml"),
        format!("daemon_priority = 0\n{QUIET_POLICY}{TWO_VMS}[vm.vm1.static]\nfifo = true\nvcpu_priority = 99\n"),
    )
    .unwrap();
    let e = refused(&d, &["reload"]);
    assert!(
        e.contains(
            "with the keys that need a restart as they run: [vm.vm1.static] vcpu_priority = 99 must be below \
                    daemon_priority (99)"
        ),
        "{e}"
    );
    assert!(vm1.all_boosted(3));
    // The operator's priority on vm1 stays over a config that changes it; vm2's applies.
    ok(&d, &["vm", "priority", "vm1", "8"]);
    assert!(vm1.boosted_soon(8));
    std::fs::write(w.p("host.toml"), format!("{QUIET_POLICY}[vm.vm1]\npriority = 6\n[vm.vm2]\npriority = 5\n"))
        .unwrap();
    let out = ok(&d, &["reload"]);
    assert_eq!(
        out,
        "changed: vm2: priority 4 -> 5\nnot applied, set by the operator: vm1: priority 3 -> 6 (the operator's \
         setting stays: cosched vm reset vm1 to follow the config)\n"
    );
    assert!(vm1.all_boosted(8) && vm2.boosted_soon(5), "{:?} {:?}", vm1.attrs(), vm2.attrs());
    assert_eq!(ok(&d, &["vm", "reset", "vm1"]), "changed: vm1: priority 8 -> 6\n");
    assert!(vm1.boosted_soon(6));
}

#[test]
fn keys_that_need_a_restart_are_named_and_left_as_they_run_while_the_rest_applies() {
    if !have_root() {
        return;
    }
    let w = World::new();
    let (d, vm1, _vm2) = reload_world(&w);
    std::fs::write(
        w.p("host.toml"),
        format!(
            "daemon_priority = 90\n{QUIET_POLICY}[boost]\npolicy = \"fifo\"\n[vm.vm1]\npriority = 5\n[vm.vm2]\n\
             priority = 4\n[policy.resource.cpu]\nmax_continuous_boost_ms = 60000\nframe_rate = 10\n"
        ),
    )
    .unwrap();
    let out = ok(&d, &["reload"]);
    assert_eq!(
        out,
        "changed: [policy] cpu: boost <= 60000 ms at a time, <= 1000‰ of the window, cooldown 1000 ms\n\
         changed: vm1: priority 3 -> 5\n\
         needs a restart: [boost] policy\n\
         needs a restart: [policy.resource.cpu] frame_rate\n\
         needs a restart: daemon_priority\n"
    );
    assert!(vm1.boosted_soon(5), "still SCHED_RR, at the new priority: {:?}", vm1.attrs());
    let st = d.status();
    assert_eq!(st["boost"]["policy"], "rr");
    assert_eq!(st["resources"]["cpu"]["limits"]["max_continuous_ns"], 60_000_000_000u64);
    assert_eq!(st["resources"]["cpu"]["limits"]["frame_rate"], 2000);
    let me = sched::get(pid_of(&d)).unwrap();
    assert_eq!(me.priority, 99, "the daemon's own priority as it runs");
}

#[test]
fn disable_leaves_the_static_tunings_and_disable_all_takes_them_off_across_a_restart() {
    if !have_root() {
        return;
    }
    let w = World::new();
    let config = format!("{QUIET_POLICY}[vm.vm1.static]\nfifo = true\n");
    let mut d = w.daemon(&config);
    let vm = w.vm("vm1", "qemu-system-x86_64", &THREADS);
    d.wait_vm("vm1");
    wait_for("static FIFO", Duration::from_secs(5), || static_fifo(&vm).then_some(()));
    ok(&d, &["disable"]);
    assert!(static_fifo(&vm), "disable: the dynamic resources only: {:?}", vm.attrs());
    ok(&d, &["disable", "--all"]);
    assert!(vm.none_realtime(), "disable --all: the static tuning off: {:?}", vm.attrs());
    let e = refused(&d, &["vm", "static", "vm1", "--fifo", "on"]);
    assert!(e.contains("static tunings are off for the whole host (cosched disable --all)"), "{e}");
    d.signal(libc::SIGKILL);
    d = w.daemon(&config);
    // The static tunings are applied (or not) as the VM is adopted, before it is in the status.
    let st = d.wait_vm("vm1");
    assert_eq!(st["static"]["tuning"], "none", "{st:#}");
    assert!(vm.none_realtime(), "still off after a restart: {:?}", vm.attrs());
    let st = d.status();
    assert_eq!(
        (&st["settings_from"]["static"], &st["resources"]["cpu"]["enabled"]),
        (&Value::from("operator"), &Value::from(false))
    );
    assert_eq!(d.vm_status("vm1").unwrap()["settings_from"]["static"], "operator");
    ok(&d, &["enable"]);
    wait_for("static FIFO again", Duration::from_secs(5), || static_fifo(&vm).then_some(()));
    assert_eq!(d.status()["resources"]["cpu"]["enabled"], true);
}

#[test]
fn a_corrupt_operator_file_is_reported_and_ignored_and_blocks_neither_restore_nor_start() {
    if !have_root() {
        return;
    }
    let w = World::new();
    let config = format!("{QUIET_POLICY}{TWO_VMS}");
    let mut d = w.daemon(&config);
    let mut vm1 = w.vm("vm1", "qemu-system-x86_64", &THREADS);
    d.wait_vm("vm1");
    vm1.register();
    vm1.request(Kind::Cpu, 1);
    assert!(vm1.boosted_soon(3));
    ok(&d, &["vm", "priority", "vm1", "7"]);
    assert!(vm1.boosted_soon(7));
    d.signal(libc::SIGKILL);
    let file = w.state_dir().join(cosched_host::operator::OPERATOR_FILE);
    std::fs::write(&file, "{\"version\": 1, \"vm\": {").unwrap();
    // The restore after a crash puts every thread back, whatever the file says.
    let out = w.restore();
    assert!(out.status.success(), "restore with a corrupt operator file: {out:?}");
    assert!(vm1.none_realtime(), "restored: {:?}", vm1.attrs());
    // A new daemon says so, runs by the config alone, and the operator's next command replaces it.
    let d = w.daemon(&config);
    let vm = d.wait_vm("vm1");
    assert!(by_config(&vm["settings_from"]) && vm["priority"] == 3, "{vm:#}");
    let log = std::fs::read_to_string(w.p("daemon.log")).unwrap();
    assert!(log.contains("operator.state: corrupt") && log.contains("not applied"), "{log}");
    boost_again(&mut vm1);
    assert!(vm1.boosted_soon(3), "the config's priority: {:?}", vm1.attrs());
    ok(&d, &["vm", "priority", "vm1", "5"]);
    let kept: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!((&kept["version"], &kept["vm"]["vm1"]["priority"]), (&Value::from(1), &Value::from(5)));
}

#[test]
fn the_units_exec_reload_finds_the_daemon_through_the_config_and_applies_it() {
    if !have_root() {
        return;
    }
    // The unit's own line, run here with this test's config in place of /etc/cosched/host.toml.
    let unit = include_str!("../../../../packaging/cosched-host.service");
    assert!(unit.contains("\nExecReload=/usr/bin/cosched --config /etc/cosched/host.toml reload\n"), "{unit}");
    let w = World::new();
    let cfg = w.p("only.toml");
    let base = format!(
        "socket_dir = {:?}\nstate_dir = {:?}\ncontrol_socket = {:?}\n{QUIET_POLICY}",
        w.socket_dir(),
        w.state_dir(),
        w.control()
    );
    std::fs::write(&cfg, format!("{base}[vm.vm1]\npriority = 3\n")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_cosched"))
        .arg("--config")
        .arg(&cfg)
        .args(["host", "-v"])
        .stderr(Stdio::from(std::fs::File::create(w.p("daemon.log")).unwrap()))
        .spawn()
        .unwrap();
    let d = Daemon { child: Some(child), control: w.control(), log: w.p("daemon.log") };
    wait_for("the daemon's control socket", Duration::from_secs(10), || d.try_status());
    let mut vm1 = w.vm("vm1", "qemu-system-x86_64", &THREADS);
    d.wait_vm("vm1");
    vm1.register();
    vm1.request(Kind::Cpu, 1);
    assert!(vm1.boosted_soon(3), "{:?}", vm1.attrs());
    std::fs::write(&cfg, format!("{base}[vm.vm1]\npriority = 6\n")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cosched")).arg("--config").arg(&cfg).arg("reload").output().unwrap();
    assert!(out.status.success(), "{out:?}\n{}", d.log_tail());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "changed: vm1: priority 3 -> 6\n");
    assert!(vm1.boosted_soon(6), "{:?}", vm1.attrs());
}
