//! The `cosched` binary as an operator or a script meets it, without a daemon and without root:
//! exit codes (0 done, 1 error, 2 usage, 3 daemon not running), `check-config`, and the safety
//! commands with a broken config.

use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Output};

fn cosched(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cosched")).args(args).env_remove("COSCHED_ROLE").output().unwrap()
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `out`'s exit code, with its output in the message if it is not `want`.
fn assert_exit(out: &Output, want: i32) {
    let (o, e) = text(out);
    assert_eq!(out.status.code(), Some(want), "stdout:\n{o}\nstderr:\n{e}");
}

fn p(dir: &Path, rel: &str) -> String {
    dir.join(rel).to_str().unwrap().to_string()
}

#[test]
fn check_config_lists_every_error_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let file = p(dir.path(), "host.toml");
    std::fs::write(
        &file,
        format!(
            "sockt_dir = \"/x\"\nmetrics_listen = \"localhost:abc\"\nstate_dir = {:?}\nsocket_dir = {:?}\n\
             control_socket = {:?}\n[policy]\ndefault_priority = 0\n[vm.a]\npriority = -5\n",
            p(dir.path(), "host.toml/state"),
            p(dir.path(), "vms"),
            p(dir.path(), "control.sock"),
        ),
    )
    .unwrap();
    let out = cosched(&["check-config", &file]);
    assert_exit(&out, 1);
    let (stdout, stderr) = text(&out);
    for want in [
        format!("{file}:1:1: unknown field `sockt_dir`"),
        format!("{file}: metrics_listen = \"localhost:abc\": not an IP address and port"),
        format!("{file}: [policy]: default_priority = 0: out of range 1..=98"),
        format!("{file}:9:12: [vm.a] priority: invalid value: integer `-5`, expected a whole number from 0 to 255"),
        format!("{file}: state_dir = "),
    ] {
        assert!(stdout.lines().any(|l| l.starts_with(&want)), "no line {want:?} in:\n{stdout}");
    }
    assert!(stderr.contains("5 error(s) in"), "{stderr}");

    // The same as JSON, for a script.
    let out = cosched(&["check-config", "--json", &file]);
    assert_exit(&out, 1);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["valid"], false);
    assert_eq!(v["errors"].as_array().unwrap().len(), 5, "{v:#}");
    assert_eq!(v["errors"][0]["line"], 1);

    // A valid one, through the global --config too.
    let paths = ["state_dir", "socket_dir", "control_socket"].map(|k| format!("{k} = {:?}\n", p(dir.path(), k)));
    std::fs::write(&file, paths.concat()).unwrap();
    let out = cosched(&["--config", &file, "check-config"]);
    assert_exit(&out, 0);
    assert!(text(&out).0.ends_with(&format!("{file}: valid\n")), "{:?}", text(&out));
    // A file named that is not there is an error, not the defaults.
    assert_exit(&cosched(&["check-config", &p(dir.path(), "absent.toml")]), 1);
}

#[test]
fn usage_errors_exit_2_in_plain_words() {
    let out = cosched(&["vm", "priority", "vm1", "-5"]);
    assert_exit(&out, 2);
    assert!(
        text(&out).1.contains("invalid value '-5' for '<PRIORITY>': must be a whole number from 1 to 98"),
        "{out:?}"
    );
    let out = cosched(&["guest", "--min-boost-us", "-5"]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains("must be a whole number, 0 or more"), "{out:?}");
    assert_exit(&cosched(&["no-such-command"]), 2);
    assert_exit(&cosched(&["membw", "--reclaim", "yes"]), 2);
    let out = cosched(&["--config", "/etc/cosched/guest.toml", "request-membw", "100"]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains("--config means nothing to request-membw"), "{out:?}");
}

/// Nothing at the socket, or a socket with nothing behind it: 3, as systemctl exits for a unit
/// that is not active; every command that needs the daemon.
#[test]
fn the_daemon_not_running_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let absent = p(dir.path(), "absent.sock");
    let dead = p(dir.path(), "dead.sock");
    drop(UnixListener::bind(&dead).unwrap());
    for socket in [&absent, &dead] {
        for args in [
            &["status"][..],
            &["status", "--json"],
            &["status", "vm1"],
            &["enable"],
            &["disable", "cpu"],
            &["vm", "list"],
            &["vm", "disable", "vm1"],
            &["membw"],
            &["metrics"],
        ] {
            let mut all = args.to_vec();
            all.extend(["--control-socket", socket.as_str()]);
            let out = cosched(&all);
            assert_exit(&out, 3);
            assert!(text(&out).1.contains("not running"), "{all:?}: {out:?}");
        }
    }
}

#[test]
fn restore_of_a_state_dir_not_there_is_an_error() {
    let out = cosched(&["restore", "--state-dir", "/nonexistent/cosched-state"]);
    assert_exit(&out, 1);
    assert!(text(&out).1.contains("state directory /nonexistent/cosched-state does not exist"), "{out:?}");
}

/// A config that does not load: restore warns, and goes on with the state directory it is given
/// (else the config's, else the default); a record it cannot put back makes it exit 1, naming it.
#[test]
fn restore_works_with_a_broken_config_and_names_each_failure() {
    let dir = tempfile::tempdir().unwrap();
    let state = p(dir.path(), "state");
    std::fs::create_dir(&state).unwrap();
    let cfg = p(dir.path(), "host.toml");
    std::fs::write(&cfg, format!("state_dir = {state:?}\nsockt_dir = \"/x\"\n")).unwrap();
    for args in [vec!["--config", &cfg, "restore"], vec!["--config", &cfg, "restore", "--state-dir", &state]] {
        let out = cosched(&args);
        assert_exit(&out, 0);
        let (stdout, stderr) = text(&out);
        assert!(stdout.starts_with("restored 0 thread(s)"), "{stdout}");
        assert!(stderr.contains("warning: cannot load the config:") && stderr.contains("unknown field"), "{stderr}");
    }
    // Its state directory is read from what the config still says.
    let out = cosched(&["--config", &cfg, "restore"]);
    assert!(text(&out).1.contains("going on with state_dir from it"), "{out:?}");
    // Not TOML at all: the defaults, or what the command line says.
    std::fs::write(&cfg, "this is [[[ not TOML\n").unwrap();
    for (name, body) in [("1-2.json", "{garbage"), ("3-4.json", "{\"version\": 9}")] {
        std::fs::write(p(dir.path(), &format!("state/{name}")), body).unwrap();
    }
    let out = cosched(&["--config", &cfg, "restore", "--state-dir", &state]);
    assert_exit(&out, 1);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("going on with the defaults"), "{stderr}");
    for name in ["1-2.json", "3-4.json"] {
        assert!(
            stderr.lines().any(|l| l.starts_with("cosched: restore: ") && l.contains(name)),
            "{name} not named in:\n{stderr}"
        );
    }
    assert!(stderr.contains("2 setting(s) could not be restored"), "{stderr}");
    let out = cosched(&["--config", &cfg, "restore", "--state-dir", &state, "--json"]);
    assert_exit(&out, 1);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["schema_version"].as_u64(), v["restored"].as_u64()), (Some(1), Some(0)), "{v:#}");
    assert_eq!(v["errors"].as_array().map(Vec::len), Some(2), "{v:#}");
}

/// The safety commands reach the daemon whatever the config says: `disable` with a config that
/// does not load uses the control socket it still names (here: not running, so 3, not 1).
#[test]
fn disable_with_a_broken_config_uses_the_socket_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = p(dir.path(), "host.toml");
    let socket = p(dir.path(), "control.sock");
    std::fs::write(&cfg, format!("control_socket = {socket:?}\n[policy]\nno_such_key = 1\n")).unwrap();
    let out = cosched(&["--config", &cfg, "disable"]);
    assert_exit(&out, 3);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("warning: cannot load the config") && stderr.contains(&socket), "{stderr}");
}

/// The role decides what `--help` offers; every command still runs when named.
#[test]
fn each_role_s_help_offers_its_commands() {
    let help = |role: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_cosched")).arg("--help").env("COSCHED_ROLE", role).output().unwrap();
        assert_exit(&out, 0);
        // The list of commands.
        let all = text(&out).0;
        all[all.find("Commands:").unwrap()..all.find("Options:").unwrap()].to_string()
    };
    let guest = help("guest");
    assert!(guest.contains("request-membw") && !guest.contains("check-config"), "{guest}");
    let host = help("host");
    assert!(host.contains("check-config") && !host.contains("request-membw"), "{host}");
    let all = help("all");
    assert!(all.contains("check-config") && all.contains("request-membw"), "{all}");
    // Hidden in the guest's help, and still there.
    let out = Command::new(env!("CARGO_BIN_EXE_cosched"))
        .args(["check-config", "--help"])
        .env("COSCHED_ROLE", "guest")
        .output()
        .unwrap();
    assert_exit(&out, 0);
}

#[test]
fn the_man_pages_are_section_8_with_their_sections() {
    let dir = tempfile::tempdir().unwrap();
    assert_exit(&cosched(&["generate", "man", dir.path().to_str().unwrap()]), 0);
    let mut names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    for want in ["cosched.8", "cosched-guest.8", "cosched-host.8", "cosched-check-config.8", "cosched-vm-list.8"] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    assert!(!names.iter().any(|n| n.contains("help") || n.ends_with(".1")), "{names:?}");
    let top = std::fs::read_to_string(dir.path().join("cosched.8")).unwrap();
    for s in ["EXAMPLES", "FILES", "EXIT STATUS", "SIGNALS", "ENVIRONMENT", "\"SEE ALSO\""] {
        assert!(top.contains(&format!("\n.SH {s}\n")), "no {s}");
    }
}
