"""VM tests in the environments operators run: a Debian 12 guest with systemd and udev
(guest/build-debian.sh) that installs the project's guest package and lives with it as an
operator's VM would. Root; the guest boots under the accelerator guest/accel.sh chooses."""

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import debian_guest  # noqa: E402
import harness  # noqa: E402
from harness import need_root  # noqa: E402

VM = "cosdebian"


def record(env, **values):
    """Appends the measured values of environment `env` to $COSCHED_ENV_RECORD, when set
    (bench/environments.py writes results/environments from them)."""
    path = os.environ.get("COSCHED_ENV_RECORD")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"env": env, **values}) + "\n")


def packages(dest, role="cosched-guest"):
    """scripts/package.sh's cosched and `role` packages, copied into `dest`: their file names."""
    debs = harness.build_packages()
    missing = {"cosched", role} - set(debs)
    if missing:
        raise AssertionError(f"scripts/package.sh did not make {sorted(missing)}: {debs}")
    for name in ("cosched", role):
        shutil.copy(debs[name], dest)
    return [debs[name].name for name in ("cosched", role)]


def vm_status(daemon):
    st = daemon.status() or {}
    return next((v for v in st.get("vms", []) if v["name"] == VM), None)


def wait_host(daemon, pred, what, timeout=60):
    """Waits until pred(the VM's status entry or None) is true; says what it saw last."""
    def entry():
        v = vm_status(daemon)
        return v if v is not None and pred(v) else None
    return harness.wait_until(entry, f"host: {what}", timeout, seen=lambda: json.dumps(vm_status(daemon))[:3000],
                              step=0.2)


class DebianGuestPackage(unittest.TestCase):
    def test_the_guest_package_under_systemd_and_udev(self):
        """apt install starts the agent (udev, the port is there), it registers and is boosted
        under host load; systemctl stop deregisters it; a reboot registers it again (udev at
        boot); apt purge removes it and everything it installed."""
        need_root(self)
        t_build = time.monotonic()
        debian_guest.build()
        build_s = time.monotonic() - t_build
        with tempfile.TemporaryDirectory(prefix="cosched-env-") as tmp:
            share = Path(tmp) / "share"
            share.mkdir()
            debs = packages(share)
            (Path(tmp) / "host").mkdir()
            daemon = harness.Daemon(Path(tmp) / "host", harness.NO_BUDGETS)
            self.addCleanup(daemon.stop)
            daemon.socket_dir.mkdir(exist_ok=True)
            guest = debian_guest.DebianGuest(VM, sock=daemon.socket_dir / f"{VM}.sock", share=share)
            self.addCleanup(guest.stop)
            boot_s, uptime = guest.wait_ready(timeout=600)
            print(f"\n  Debian guest ({guest.accel}): image up to date in {build_s:.1f} s, booted to its test "
                  f"driver in {boot_s:.1f} s (guest uptime {uptime:.1f} s)", file=sys.stderr)
            _, kernel = guest.run("uname -r")
            # Nothing of cosched in the image; the port is there before the package is.
            guest.run("! command -v cosched && test -e /dev/virtio-ports/org.cosched.0")
            guest.run("mkdir -p /mnt/host && mount -t 9p -o trans=virtio,version=9p2000.L,ro host /mnt/host")
            t = time.monotonic()
            # As the README says (the guest has no network: the packages need nothing it lacks).
            guest.run("cd /mnt/host && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                      + " ".join(f"./{d}" for d in debs), timeout=300)
            install_s = time.monotonic() - t
            # udev (the postinst's trigger) starts the unit, because the port exists.
            guest.run("for i in $(seq 100); do systemctl is-active -q cosched-guest && exit 0; sleep 0.2; done; "
                      "systemctl status cosched-guest --no-pager; exit 1")
            wait_host(daemon, lambda v: v and v["registered"], "the agent registered")

            # Boosted under host load: an RT task in the guest beside a guest hog.
            with harness.host_hogs(2):
                before = vm_status(daemon)["resources"]["cpu"]["counters"]["boosts"]
                guest.run("(while :; do :; done) & H=$!; cyclictest -q -p 80 -i 1000 -l 3000 -m; kill $H", timeout=300)
                v = wait_host(daemon, lambda v: v["resources"]["cpu"]["counters"]["boosts"] > before,
                              "a CPU boost during the guest's cyclictest")
            boosts = v["resources"]["cpu"]["counters"]["boosts"] - before

            # systemctl stop: the agent deregisters, the host restores.
            guest.run("systemctl stop cosched-guest")
            wait_host(daemon, lambda v: v and not v["registered"], "DEREGISTER after systemctl stop")
            for tid in guest.vcpu_tids():
                self.assertEqual(harness.policy(tid), os.SCHED_OTHER, f"vCPU {tid} restored after the stop")

            # A reboot: udev starts the agent at boot, and it registers again.
            readies = guest.readies()
            guest.send("systemctl reboot")
            t = time.monotonic()
            guest.wait_ready(timeout=600, after=readies)
            reboot_s = time.monotonic() - t
            wait_host(daemon, lambda v: v and v["registered"], "the agent registered again after the reboot",
                      timeout=120)
            guest.run("systemctl is-active -q cosched-guest")

            # apt purge: the agent stops (the host sees it go) and nothing is left.
            guest.run("DEBIAN_FRONTEND=noninteractive apt-get purge -y -q cosched cosched-guest", timeout=300)
            wait_host(daemon, lambda v: v and not v["registered"], "DEREGISTER after the purge")
            _, left = guest.run("dpkg-query -W -f='${Status} ${Package}\\n' 'cosched*' 2>/dev/null | "
                                "grep -v not-installed; ls -d /etc/cosched /usr/bin/cosched /run/cosched "
                                "/lib/systemd/system/cosched-guest.service /lib/udev/rules.d/60-cosched.rules "
                                "2>/dev/null; pgrep -a -x cosched", check=False)
            self.assertEqual(left.strip(), "", "the purge left these behind")
            print(f"  install {install_s:.1f} s, {boosts} boost(s) under host load, reboot to the driver "
                  f"{reboot_s:.1f} s", file=sys.stderr)
            record("debian-guest", accel=guest.accel, kernel=kernel.strip(), boot_s=boot_s, uptime_s=uptime, install_s=install_s,
                   boosts=boosts, reboot_s=reboot_s)



# ---- the host unit under systemd, in the Debian guest ---------------------------------------------

FAKE_QEMU = "/usr/local/lib/cosched-test/qemu-system-x86_64"
# Bash functions the host-unit test's guest scripts use: the fake VM's threads by name, a wait
# that says what it saw, a frame written to a fake VM's stdin (its guest).
GUEST_LIB = r"""
tid() { local p; p=$(pgrep -f "$FAKE_QEMU --socket /run/cosched/vms/$1.sock" | head -1); [ -n "$p" ] || return 1
        for t in /proc/$p/task/*; do [ "$(cat "$t/comm")" = "$2" ] && { basename "$t"; return 0; }; done; return 1; }
policy() { chrt -p "$(tid "$1" "$2")" | head -1 | sed 's/.*policy: //'; }
ioclass() { ionice -p "$(tid "$1" "$2")"; }
until_() { local end=$(($(date +%s) + 90)); while [ "$(date +%s)" -lt "$end" ]; do
             eval "$2" >/dev/null 2>&1 && return 0; sleep 0.1; done
           echo "not within 90 s: $1"; return 1; }
"""


def frame(kind, seq, value):
    """printf's escapes for one frame: magic "CS", version 1, kind, seq (u32 LE), value (u64 LE)."""
    return "".join(f"\\x{b:02x}" for b in struct.pack("<2sBBIQ", b"CS", 1, kind, seq, value))


REGISTER, CPU, IO = 1, 3, 4


class HostUnitUnderSystemd(unittest.TestCase):
    def test_the_host_unit_as_systemd_runs_it(self):
        """cosched-host.service under systemd with its own sandbox (in the Debian test guest, a
        cgroup v2 host): a fake VM's boost and its undo, an I/O raise, a memory-bandwidth throttle
        through cgroup.freeze, a static FIFO put in by `systemctl reload`, a SIGKILL that the unit's
        ExecStopPost restores before the restart, and `systemctl stop` restoring the rest."""
        need_root(self)
        debian_guest.build()
        with tempfile.TemporaryDirectory(prefix="cosched-env-") as tmp:
            share = Path(tmp) / "share"
            share.mkdir()
            debs = packages(share, "cosched-host")
            shutil.copy(harness.REPO / "target/release/cosched-fake-qemu", share)
            guest = debian_guest.DebianGuest("coshostunit", share=share)
            self.addCleanup(guest.stop)
            boot_s, _ = guest.wait_ready(timeout=600)
            t0 = time.monotonic()
            lib = f"FAKE_QEMU={FAKE_QEMU}\n{GUEST_LIB}\n"

            def g(script, **kw):
                # Each script waits for its states itself (until_: 90 s by the guest's clock, then
                # it says what it saw), longer than guest.run's 120 s once a script waits twice.
                kw.setdefault("timeout", 360)
                return guest.run(lib + script, **kw)

            def send(vm, *frames):
                g("".join(f"printf '{frame(*f)}' > /run/{vm}.in\n" for f in frames))

            g("mkdir -p /mnt/host && mount -t 9p -o trans=virtio,version=9p2000.L,ro host /mnt/host && "
              f"install -D -m 0755 /mnt/host/cosched-fake-qemu {FAKE_QEMU}")
            _, v2 = g("stat -fc %T /sys/fs/cgroup")
            self.assertEqual(v2.strip(), "cgroup2fs", "systemd's hierarchy is cgroup v2 here")
            # The simulated memory-bandwidth backend (the guest has no counters): VM "bw" moves
            # 4000 MB/s per second it runs, against a 10% share of 1000 MB/s.
            g("mkdir -p /etc/cosched && printf '0 bw 4000\n' > /etc/cosched/membw.trace")
            g("cd /mnt/host && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
              + " ".join(f"./{d}" for d in debs), timeout=300)
            g("until_ 'cosched-host.service active' 'systemctl is-active -q cosched-host'")
            started_s = time.monotonic() - t0
            # The guest has 1 CPU: by default the daemon keeps one for the host (host_reserve_cpus),
            # and on a 1-CPU host it would refuse every boost (DENY host_reserve). A boost here
            # lasts as long as this slow emulated guest takes to see it and send the next frame,
            # which can pass the default budgets (10 s at a time, 18 s of 20): no limit, so that
            # a check never races the budget's end of a boost.
            g("cat >> /etc/cosched/host.toml <<'EOF'\n[policy]\nhost_reserve_cpus = 0\nmax_continuous_boost_ms = 0\nmax_boost_share_permille = 1000\n[membw]\nbackend = \"simulated\"\n"
              "trace = \"/etc/cosched/membw.trace\"\nthrottle = \"freezer\"\nfreezer = \"v2\"\n"
              "guaranteed_mbps = 1000\nreclaim = false\nbest_effort = false\n[vm.bw]\nmembw_share = 100\nEOF\n"
              "systemctl restart cosched-host && until_ 'active again' 'systemctl is-active -q cosched-host'")

            # A fake VM "vm1" (its own stdin a FIFO: this test is its guest; a scope of its own, as a
            # VM has under libvirt), then boost and undo.
            g(f"mkfifo /run/vm1.in; systemd-run --scope --unit=cosched-test-vm1 {FAKE_QEMU} "
              "--socket /run/cosched/vms/vm1.sock --thread 'CPU 0/TCG' --thread 'IO iothread0' 0<>/run/vm1.in >/dev/null 2>/run/vm1.err &\n"
              "until_ 'the daemon has vm1' 'cosched vm list | grep -qw vm1' || { cosched vm list; cat /run/vm1.err; "
              "journalctl -u cosched-host --no-pager | tail -20; exit 1; }")
            send("vm1", (REGISTER, 1, 3), (CPU, 2, 1))
            g("until_ 'vCPU SCHED_RR' 'policy vm1 \"CPU 0/TCG\" | grep -q SCHED_RR' || "
              "{ policy vm1 'CPU 0/TCG'; journalctl -u cosched-host --no-pager | tail -20; exit 1; }")
            send("vm1", (CPU, 3, 0))
            g("until_ 'vCPU back to SCHED_OTHER' 'policy vm1 \"CPU 0/TCG\" | grep -q SCHED_OTHER'")
            # The I/O raise: the iothread at the real-time I/O class, and back.
            g("until_ 'iothread not realtime before' '! ioclass vm1 \"IO iothread0\" | grep -q realtime'")
            send("vm1", (IO, 4, 1))
            g("until_ 'iothread realtime' 'ioclass vm1 \"IO iothread0\" | grep -q realtime' || "
              "{ ioclass vm1 'IO iothread0'; exit 1; }")
            send("vm1", (IO, 5, 0))
            g("until_ 'iothread back' '! ioclass vm1 \"IO iothread0\" | grep -q realtime'")

            # Memory bandwidth: VM "bw" in a scope of its own (its cgroup v2 group, the VM's
            # alone), its vCPU spinning; the daemon freezes the group when it is past its budget.
            g(f"mkfifo /run/bw.in; systemd-run --scope --unit=cosched-test-bw {FAKE_QEMU} "
              "--socket /run/cosched/vms/bw.sock --busy 'CPU 0/TCG' 0<>/run/bw.in >/dev/null 2>&1 &\n"
              "until_ 'the daemon has bw' 'cosched vm list | grep -qw bw' || { cosched vm list; exit 1; }")
            _, out = g("until_ 'a throttle of bw' 'cosched status bw | grep -qE throttled.[1-9]' && "
                       "until_ 'the scope of bw frozen' 'grep -q \"frozen 1\" "
                       "/sys/fs/cgroup/system.slice/cosched-test-bw.scope/cgroup.events' || "
                       "{ cosched status bw; cosched membw; exit 1; }; cosched membw")
            self.assertIn("cgroup v2 cgroup.freeze (the VM's own group)", out)

            # SIGKILL while boosted: ExecStopPost restores, Restart=on-failure restarts.
            send("vm1", (CPU, 6, 1))
            g("until_ 'vCPU SCHED_RR again' 'policy vm1 \"CPU 0/TCG\" | grep -q SCHED_RR' || "
              "{ policy vm1 'CPU 0/TCG'; cosched status vm1; journalctl -u cosched-host --no-pager | tail -30; exit 1; }")
            g("systemctl kill -s KILL cosched-host")
            g("until_ 'restarted once' 'systemctl show -p NRestarts cosched-host | grep -q NRestarts=1' && "
              "until_ 'active after the restart' 'systemctl is-active -q cosched-host' && "
              "until_ 'vCPU restored after the kill' 'policy vm1 \"CPU 0/TCG\" | grep -q SCHED_OTHER' || "
              "{ journalctl -u cosched-host --no-pager | tail -30; exit 1; }")

            # systemctl reload: a static FIFO for vm1 put in without a restart.
            g("printf '[vm.vm1.static]\\nfifo = true\\n' >> /etc/cosched/host.toml && systemctl reload cosched-host")
            g("until_ 'vm1 static FIFO after the reload' 'policy vm1 \"CPU 0/TCG\" | grep -q SCHED_FIFO' || "
              "{ policy vm1 'CPU 0/TCG'; journalctl -u cosched-host --no-pager | tail -30; exit 1; }")
            g("systemctl show -p NRestarts cosched-host | grep -q NRestarts=1")  # not restarted

            # systemctl stop: everything put back.
            g("systemctl stop cosched-host")
            g("until_ 'vm1 SCHED_OTHER after the stop' 'policy vm1 \"CPU 0/TCG\" | grep -q SCHED_OTHER' && "
              "until_ 'bw thawed' 'grep -q 0 /sys/fs/cgroup/system.slice/cosched-test-bw.scope/cgroup.freeze' && "
              "! ioclass vm1 'IO iothread0' | grep -q realtime")
            seq_s = time.monotonic() - t0
            print(f"\n  Debian guest ({guest.accel}): booted in {boot_s:.1f} s; the packages installed and "
                  f"the unit active in {started_s:.1f} s; the whole sequence {seq_s:.1f} s", file=sys.stderr)
            record("host-unit", accel=guest.accel, boot_s=boot_s, started_s=started_s, sequence_s=seq_s)



# ---- the container under podman ------------------------------------------------------------------

CAPS = ["SYS_NICE", "BPF", "PERFMON", "DAC_OVERRIDE", "DAC_READ_SEARCH", "SYS_PTRACE", "IPC_LOCK"]


def podman(*args, check=True, timeout=600, input=None):
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, input=input)
    if check and r.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r


class PodmanContainer(unittest.TestCase):
    """The image of packaging/Containerfile, built and run by podman as the DaemonSet of
    packaging/kubernetes/cosched.yaml runs it: the host's PID and network namespaces, not
    privileged, every capability dropped but the unit's seven, a read-only root, /run/cosched and
    /sys/fs/cgroup from the host. Root, no guest; skipped only where podman cannot run a
    container here (it says why)."""

    # This host's own limits, not the image's: its root lacks CAP_SYS_RESOURCE (podman's default
    # ulimits are refused), and crun refuses its hybrid cgroup layout (runc takes it).
    RUNTIME = ["--runtime", "runc"]
    LIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]

    def setUp(self):
        need_root(self)
        if shutil.which("podman") is None:
            self.skipTest("podman is not installed (scripts/setup.sh installs it)")
        self.tag = f"{os.getpid()}-{int(time.time())}"
        self.base = f"localhost/cosched-test-base:{self.tag}"
        self.image = f"localhost/cosched-test:{self.tag}"
        self.name = f"cosched-test-{self.tag}"
        self.addCleanup(self.cleanup)

    def cleanup(self):
        podman("rm", "-f", "-t", "0", self.name, check=False)
        podman("rmi", "-f", self.image, self.base, check=False)

    def test_the_image_as_the_daemonset_runs_it(self):
        """Built from a local Debian base (--target prebuilt), it finds a fake QEMU on the host
        and boosts it, serves its metrics, and restores on `podman stop`."""
        t0 = time.monotonic()
        base = subprocess.run("mmdebstrap --quiet --variant=minbase --format=tar bookworm - | "
                              f"podman import - {self.base}", shell=True, capture_output=True, text=True,
                              timeout=900)
        if base.returncode != 0:
            raise AssertionError(f"the base image: {base.stderr[-3000:]}")
        probe = podman(*self.RUNTIME, "run", "--rm", *self.LIMITS, self.base, "true", check=False)
        if probe.returncode != 0:
            self.skipTest(f"podman cannot run a container here: {probe.stderr.strip()[-500:]}")
        base_s = time.monotonic() - t0
        t = time.monotonic()
        podman("build", "-q", "-f", "packaging/Containerfile", "--target", "prebuilt", "--build-arg",
               f"BASE_IMAGE={self.base}", "-t", self.image, str(harness.REPO))
        build_s = time.monotonic() - t
        with tempfile.TemporaryDirectory(prefix="cosched-ctr-") as tmp:
            etc, run = Path(tmp) / "etc", Path(tmp) / "run"
            etc.mkdir()
            (run / "vms").mkdir(parents=True)
            port = 19477 + os.getpid() % 500
            # The DaemonSet's ConfigMap (metrics on the node, IRQs left alone), on a local port,
            # and daemon_priority = 0: this kernel has RT group scheduling, and a container's cpu
            # group has no real-time runtime (SCHED_FIFO for the daemon itself is refused).
            (etc / "host.toml").write_text(f'daemon_priority = 0\ndiscover_processes = true\n'
                                           f'metrics_listen = "127.0.0.1:{port}"\n[shield]\nirqs = false\n')
            qemu = Path(tmp) / "qemu-system-x86_64"
            shutil.copy(harness.REPO / "target/release/cosched-fake-qemu", qemu)
            vm = subprocess.Popen([qemu, "--socket", run / "vms/ctr.sock", "--thread", "CPU 0/TCG"],
                                  stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  preexec_fn=harness.dies_with_us(signal.SIGKILL))
            self.addCleanup(lambda: (vm.kill(), vm.wait()))
            t = time.monotonic()
            podman(*self.RUNTIME, "run", "-d", "--name", self.name, "--pid=host", "--network=host",
                   "--cap-drop=ALL", f"--cap-add={','.join(CAPS)}", "--read-only",
                   "--security-opt", "no-new-privileges", "--security-opt", "seccomp=unconfined", *self.LIMITS,
                   "-v", f"{etc}:/etc/cosched:ro", "-v", f"{run}:/run/cosched", "-v", "/sys/fs/cgroup:/sys/fs/cgroup",
                   self.image, "--config", "/etc/cosched/host.toml", "host")
            control = ["--control-socket", str(run / "control.sock")]

            def status():
                r = subprocess.run([str(harness.COSCHED), "status", "--json", *control], capture_output=True,
                                   text=True)
                return json.loads(r.stdout) if r.returncode == 0 else None

            def seen():
                logs = podman("logs", self.name, check=False)
                return (f"status {json.dumps(status())[:2000]}; container log:\n"
                        f"{logs.stdout[-2000:]}{logs.stderr[-2000:]}")

            def wait(pred, what):
                return harness.wait_until(pred, what, 30, seen=seen)
            st = wait(lambda: (s := status()) and any(v["name"] == "ctr" for v in s["vms"]) and s,
                      "the containerized daemon finds the fake VM")
            start_s = time.monotonic() - t
            self.assertIsNone(st["run_delay"]["unsupported"], "host BPF works in the container")
            vcpu = next(tid for tid, comm in harness.qemu_threads(vm.pid) if harness.is_vcpu(comm))
            vm.stdin.write(struct.pack("<2sBBIQ", b"CS", 1, REGISTER, 1, 1))
            vm.stdin.write(struct.pack("<2sBBIQ", b"CS", 1, CPU, 2, 1))
            vm.stdin.flush()
            wait(lambda: harness.policy(vcpu) == os.SCHED_RR, "the fake VM's vCPU boosted (SCHED_RR)")
            metrics = subprocess.run(["curl", "-sS", "--max-time", "10", f"http://127.0.0.1:{port}/metrics"],
                                     capture_output=True, text=True)
            self.assertIn("cosched_build_info", metrics.stdout, metrics.stderr)
            self.assertIn('vm="ctr"', metrics.stdout)
            podman("stop", "-t", "30", self.name)
            self.assertEqual(harness.policy(vcpu), os.SCHED_OTHER, "podman stop (SIGTERM) restored the vCPU")
            state = podman("inspect", "-f", "{{.State.ExitCode}}", self.name).stdout.strip()
            self.assertEqual(state, "0", "the daemon exited cleanly on SIGTERM")
            print(f"\n  podman: base image {base_s:.1f} s, image built in {build_s:.1f} s, the daemon up and "
                  f"the VM found in {start_s:.1f} s", file=sys.stderr)
            record("podman", podman=podman("--version").stdout.strip(), base_s=base_s, build_s=build_s,
                   start_s=start_s)


if __name__ == "__main__":
    unittest.main()
