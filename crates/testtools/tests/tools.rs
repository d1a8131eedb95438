//! The test tools do what the root tests and the experiments rely on (unprivileged; this file
//! also makes `cargo test` build the tools' binaries, which the root tests of the CLI run).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Waits up to 10 s for `f` to give a value; panics with `what` and the last value seen.
fn wait_for<T: std::fmt::Debug>(what: &str, mut f: impl FnMut() -> (Option<T>, String)) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (v, seen) = f();
        if let Some(v) = v {
            return v;
        }
        assert!(Instant::now() < deadline, "no {what} within 10 s; saw {seen}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn fake_qemu_names_its_threads_and_relays_between_its_socket_and_its_pipes() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("vm.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_cosched-fake-qemu"))
        .args(["--socket", sock.to_str().unwrap(), "--thread", "CPU 0/TCG", "--thread", "IO iothread0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let comms = || -> Vec<String> {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| {
                d.flatten()
                    .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                    .map(|c| c.trim_end().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    wait_for("the named threads", || {
        let c = comms();
        ((c.iter().any(|n| n == "CPU 0/TCG") && c.iter().any(|n| n == "IO iothread0")).then_some(()), format!("{c:?}"))
    });
    let mut conn = wait_for("the socket", || (UnixStream::connect(&sock).ok(), sock.display().to_string()));
    // The daemon's side to the test's pipe...
    conn.write_all(b"from the daemon").unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut got = [0u8; 15];
    out.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"from the daemon");
    // ... and the test's pipe (the guest) to the daemon.
    child.stdin.as_mut().unwrap().write_all(b"from the guest").unwrap();
    let mut got = [0u8; 14];
    conn.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"from the guest");
    // It exits when its stdin closes, and removes its socket.
    drop(child.stdin.take());
    let status = wait_for("the exit", || (child.try_wait().unwrap(), "still running".into()));
    assert!(status.success(), "{status}");
    assert!(!sock.exists());
}

#[test]
fn membw_sim_refuses_a_bad_scenario_with_exit_2() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cosched-membw-sim"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"{\"config\": 1}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cosched-membw-sim: bad scenario"), "{out:?}");
}
