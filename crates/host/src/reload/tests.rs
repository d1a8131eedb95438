//! The reload's logic with fakes: which keys need a restart, the steps between two configs and
//! their order, and carrying them out whole or not at all.

use super::*;
use crate::operator::Operator;

fn config(text: &str) -> HostConfig {
    let cfg: HostConfig = toml::from_str(text).unwrap_or_else(|e| panic!("{e}"));
    cfg.validate().unwrap_or_else(|e| panic!("{e}"));
    cfg
}

fn whats(steps: &[Step]) -> Vec<&str> {
    steps.iter().map(|s| s.what.as_str()).collect()
}

#[test]
fn keys_that_need_a_restart_are_named_and_kept_as_they_run() {
    let running = config("socket_dir = \"/a\"\n[policy]\nmax_continuous_boost_ms = 100\n[vm.x]\npriority = 2\n");
    let same = merge(&running, &running.clone()).unwrap();
    assert_eq!((same.config, same.needs_restart.len(), same.rescan.len()), (running.clone(), 0, 0));
    let loaded = config(
        "socket_dir = \"/b\"\nmetrics_listen = \"127.0.0.1:9477\"\ndiscover_processes = true\nenabled = false\n\
         [policy]\nmax_continuous_boost_ms = 50\nframe_rate = 10\n[policy.resource.io]\nframe_burst = 5\n\
         budget_cooldown_ms = 7\n[boost]\npolicy = \"fifo\"\n[membw]\nperiod_ms = 20\nbackend = \"off\"\n\
         [vm.x]\npriority = 3\n[vm.y.static]\nfifo = true\n",
    );
    let m = merge(&running, &loaded).unwrap();
    assert_eq!(
        m.needs_restart,
        [
            "[boost] policy",
            "[membw] backend",
            "[policy.resource.io] frame_burst",
            "[policy] frame_rate",
            "metrics_listen",
            "socket_dir"
        ]
    );
    assert_eq!(m.rescan, ["discover_processes: false -> true (from the next rescan)"]);
    let c = &m.config;
    // Kept as they run.
    assert_eq!((c.socket_dir.to_str(), &c.metrics_listen), (Some("/a"), &None));
    assert_eq!((c.policy.frame_rate, c.boost.policy), (running.policy.frame_rate, running.boost.policy));
    assert_eq!(c.membw.backend, running.membw.backend);
    assert_eq!(c.policy.resource["io"].frame_burst, None);
    // Taken.
    assert!(c.discover_processes && !c.enabled);
    assert_eq!((c.policy.max_continuous_boost_ms, c.policy.resource["io"].budget_cooldown_ms), (50, Some(7)));
    assert_eq!((c.membw.period_ms, c.vm["x"].priority, c.vm["y"].statics.fifo), (20, Some(3), true));
    // What the daemon runs and what the coordinator runs agree on what needs a restart.
    assert!(running.coordinator_policy().needs_restart(&c.coordinator_policy()).is_empty());
    // A section that only needed a restart goes away with it.
    let m = merge(&running, &config("socket_dir = \"/a\"\n[policy]\nmax_continuous_boost_ms = 100\n[vm.x]\npriority = 2\n[policy.resource.io]\nframe_rate = 3\n")).unwrap();
    assert_eq!((m.config, m.needs_restart), (running, vec!["[policy.resource.io] frame_rate".to_string()]));
}

/// Every key of the packaged config goes through a merge unchanged (the config's JSON reads
/// back whole), and the `[policy]` keys the daemon takes are those the coordinator takes.
#[test]
fn every_key_reads_back_and_policy_keys_agree_with_the_coordinator() {
    let text = include_str!("../../../../packaging/host.toml");
    let uncommented: Vec<&str> = text
        .lines()
        .map(|l| match l.strip_prefix('#') {
            Some(r) if r.starts_with(|c: char| c.is_ascii_lowercase() || c == '[') => r,
            _ => l,
        })
        .collect();
    let full = config(&uncommented.join("\n"));
    let m = merge(&HostConfig::default(), &full).unwrap();
    let back = merge(&full, &full).unwrap();
    assert_eq!((back.config, back.needs_restart.len()), (full.clone(), 0));
    assert!(m.needs_restart.contains(&"metrics_listen".to_string()), "{:?}", m.needs_restart);
    let base = Policy::default();
    let serde_json::Value::Object(keys) = serde_json::to_value(&base).unwrap() else { panic!() };
    for key in keys.keys().filter(|k| *k != "resource") {
        let mut v = serde_json::to_value(&base).unwrap();
        v[key] = (v[key].as_u64().unwrap() + 1).into();
        let changed: Policy = serde_json::from_value(v).unwrap();
        let daemon_hot = hot(&["policy".to_string(), key.clone()]);
        assert_eq!(daemon_hot, base.needs_restart(&changed).is_empty(), "{key}");
    }
}

#[test]
fn the_steps_between_two_configs_lower_first_and_raise_last() {
    let old = config(
        "[resources]\nio = true\n[vm.a]\nmembw_share = 600\n[vm.a.static]\nshield = \"1\"\n\
         [vm.b]\nmembw_share = 100\npriority = 2\n",
    );
    let new = config(
        "[resources]\nio = false\ncpu = true\n[vm.a]\nmembw_share = 100\n[vm.b]\nmembw_share = 600\npriority = 5\n\
         rt_ceiling = 30\n[vm.b.static]\nshield = \"1\"\n[vm.c.resources]\ncpu = false\n[policy]\nmax_continuous_boost_ms = 500\n",
    );
    let running = ["a".to_string(), "b".to_string()];
    let steps = diff(&old, &new, &running);
    assert_eq!(
        whats(&steps),
        [
            "io: on -> off (whole host)",
            "a: membw_share 600 -> 100",
            "a: static shield 1 -> none",
            "c: cpu on -> off (not running: when it appears)",
            "[policy] cpu: boost <= 500 ms at a time, <= 900‰ of the window, cooldown 1000 ms; io: boost <= 500 ms \
             at a time, <= 900‰ of the window, cooldown 1000 ms; event: boost <= 500 ms at a time, <= 900‰ of the \
             window, cooldown 1000 ms",
            "b: priority 2 -> 5",
            "b: rt_ceiling [rt]'s -> 30",
            "b: membw_share 100 -> 600",
            "b: static none -> shield 1",
        ]
    );
    // Each step's undo is the way back.
    let back = diff(&new, &old, &running);
    for s in &steps {
        assert!(back.iter().any(|b| b.change == s.undo && b.undo == s.change), "{}", s.what);
    }
    assert!(diff(&new, &new, &running).is_empty());
    // The default priority reaches the running VMs that have none of their own.
    let steps = diff(&old, &config("[policy]\ndefault_priority = 4\n[vm.a]\nmembw_share = 600\n[vm.a.static]\nshield = \"1\"\n[vm.b]\nmembw_share = 100\npriority = 2\n[resources]\nio = true\n"), &running);
    assert_eq!(whats(&steps), ["[policy] default_priority 4", "a: priority 1 -> 4"]);
}

#[test]
fn the_operators_settings_in_force_make_a_config_change_no_step() {
    let old = config("[vm.a]\npriority = 2\n");
    let new = config("[vm.a]\npriority = 6\n");
    let mut op = Operator::default();
    op.vm_mut("a").priority = Some(9);
    let running = ["a".to_string()];
    assert_eq!(whats(&diff(&old, &new, &running)), ["a: priority 2 -> 6"], "the config alone");
    assert!(diff(&op.over(&old), &op.over(&new), &running).is_empty(), "the operator's 9 stays");
    let mut reset = op.clone();
    reset.vm.clear();
    assert_eq!(whats(&diff(&op.over(&new), &reset.over(&new), &running)), ["a: priority 9 -> 6"]);
}

/// Records what it is asked to do; refuses the changes in `refuse`.
#[derive(Default)]
struct Fake {
    done: Vec<Change>,
    refuse: Vec<Change>,
}

impl Target for Fake {
    fn apply(&mut self, change: &Change) -> Result<(), Error> {
        if self.refuse.contains(change) {
            return Err(Error::NoGuardRule);
        }
        self.done.push(change.clone());
        Ok(())
    }
}

fn priority(vm: &str, p: u8) -> Change {
    Change::Vm { vm: vm.into(), set: VmChange::Priority(p) }
}

fn steps() -> Vec<Step> {
    (1..=3)
        .map(|i| Step {
            change: priority(&format!("v{i}"), 10),
            undo: priority(&format!("v{i}"), 1),
            what: format!("v{i}"),
        })
        .collect()
}

#[test]
fn steps_apply_whole_or_are_undone_last_first() {
    let mut t = Fake::default();
    apply(&mut t, &steps()).unwrap();
    assert_eq!(t.done, [priority("v1", 10), priority("v2", 10), priority("v3", 10)]);
    let mut t = Fake { refuse: vec![priority("v3", 10)], ..Default::default() };
    let e = apply(&mut t, &steps()).unwrap_err();
    assert_eq!(
        t.done,
        [priority("v1", 10), priority("v2", 10), priority("v3", 1), priority("v2", 1), priority("v1", 1)],
        "the failed step and every one before it undone, last first"
    );
    assert_eq!(e.to_string(), "v3: the guard's rule is off: [policy] rt_guard_max_share_permille = 0; nothing changed");
    // An undo that fails too is named.
    let mut t = Fake { refuse: vec![priority("v2", 10), priority("v1", 1)], ..Default::default() };
    let e = apply(&mut t, &steps()).unwrap_err();
    assert_eq!(t.done, [priority("v1", 10), priority("v2", 1)]);
    assert!(
        e.to_string().ends_with(
            "the rest was put back, but not: v1: the guard's rule is off: [policy] rt_guard_max_share_permille = 0"
        ),
        "{e}"
    );
}

#[test]
fn the_command_lines_overrides_stay_over_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.toml");
    std::fs::write(&path, "socket_dir = \"/from/file\"\nenabled = true\n").unwrap();
    let src =
        Source { path: Some(path.clone()), state_dir: Some("/cli/state".into()), disabled: true, ..Default::default() };
    let cfg = src.load().unwrap();
    assert_eq!(
        (cfg.socket_dir.to_str(), cfg.state_dir.to_str(), cfg.enabled),
        (Some("/from/file"), Some("/cli/state"), false)
    );
    std::fs::write(&path, "socket_dir = 5\n").unwrap();
    assert!(format!("{:#}", src.load().unwrap_err()).contains("parsing config"));
}

#[test]
fn a_config_that_does_not_load_is_refused_with_every_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.toml");
    std::fs::write(&path, "enabeld = true\n[policy]\nmax_continous_boost_ms = 5\n").unwrap();
    let source = Source {
        path: Some(path),
        socket_dir: None,
        state_dir: None,
        control_socket: None,
        metrics_listen: None,
        disabled: false,
    };
    let e = format!("{:#}", source.load().unwrap_err());
    assert!(e.contains("2 errors") && e.contains("enabeld") && e.contains("max_continous_boost_ms"), "{e}");
    assert!(e.contains("line 1, column 1:") && e.contains("line 3, column 1:"), "{e}");
}
