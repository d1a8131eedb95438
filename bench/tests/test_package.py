"""The Debian package (scripts/package.sh), installed for real: install, upgrade, the units
verified by systemd-analyze, and a purge that leaves no thread changed, even one a daemon killed
with SIGKILL left boosted. Root; it installs /usr/bin/cosched and /etc/cosched, and purges them
again (it refuses to run where a cosched is installed already, rather than touch it)."""

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
import harness  # noqa: E402

REPO = harness.REPO
FAKE = REPO / "target/release/cosched-fake-qemu"
UNITS = ["/lib/systemd/system/cosched-host.service", "/lib/systemd/system/cosched-guest.service"]


def run(*cmd, check=True, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def installed():
    r = run("dpkg-query", "-W", "-f=${Status}", "cosched", check=False)
    return r.returncode == 0 and "installed" in r.stdout and "not-installed" not in r.stdout


class Package(unittest.TestCase):
    def setUp(self):
        harness.need_root(self)
        # Never replace what an operator installed: fail, saying why.
        self.assertFalse(installed(), "a cosched package is installed on this machine: the package test would "
                                      "replace and purge it; remove it first (dpkg --purge cosched)")
        for p in ["/usr/bin/cosched", "/etc/cosched", "/run/cosched"]:
            self.assertFalse(os.path.exists(p), f"{p} exists: the package test would take it over; remove it first")
        self.procs = []
        self.addCleanup(self.cleanup)

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        if installed() or Path("/usr/bin/cosched").exists():
            run("dpkg", "--purge", "cosched", check=False)
        shutil.rmtree("/run/cosched", ignore_errors=True)

    def build(self):
        r = run("bash", REPO / "scripts/package.sh", timeout=1800)
        deb = Path(r.stdout.strip().splitlines()[-1].split(": ", 1)[1])
        self.assertTrue(deb.is_file(), r.stdout)
        return deb

    def bumped(self, deb, tmp):
        """The same package with a higher version: an upgrade."""
        root = Path(tmp) / "x"
        run("dpkg-deb", "-R", deb, root)
        control = root / "DEBIAN/control"
        text = control.read_text()
        version = next(line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("Version: "))
        control.write_text(text.replace(f"Version: {version}", f"Version: {version}+1"))
        out = Path(tmp) / "cosched-upgrade.deb"
        run("dpkg-deb", "--root-owner-group", "--build", root, out)
        return out, f"{version}+1"

    def test_install_upgrade_verify_and_purge_leave_nothing_changed(self):
        deb = self.build()
        run("dpkg", "-i", deb)
        version = run("/usr/bin/cosched", "--version").stdout.split()
        self.assertEqual(version[0], "cosched")
        self.assertTrue(deb.name.startswith(f"cosched_{version[1]}_"), (deb, version))
        for f in UNITS + ["/lib/udev/rules.d/60-cosched.rules", "/etc/cosched/host.toml",
                          "/usr/share/man/man1/cosched.1.gz", "/usr/share/man/man1/cosched-host.1.gz",
                          "/usr/share/man/man1/cosched-vm-membw.1.gz",
                          "/usr/share/bash-completion/completions/cosched",
                          "/usr/share/zsh/vendor-completions/_cosched",
                          "/usr/share/fish/vendor_completions.d/cosched.fish"]:
            self.assertTrue(Path(f).is_file(), f)
        self.assertIn("/etc/cosched/host.toml", run("dpkg-query", "-W", "-f=${Conffiles}", "cosched").stdout)
        # The units, against the installed binary and man page.
        r = run("systemd-analyze", "verify", *UNITS, check=False)
        self.assertEqual((r.returncode, r.stdout + r.stderr), (0, ""))
        # The shipped config is what the daemon loads by default.
        self.assertIn("restored 0 thread(s)", run("/usr/bin/cosched", "restore").stdout)

        # The daemon as the unit runs it, a VM it boosts, then SIGKILL at a moment the vCPU is
        # boosted: the thread stays SCHED_RR, and the purge puts it back.
        with tempfile.TemporaryDirectory(prefix="cosched-pkg-") as tmp:
            qemu = Path(tmp) / "qemu-system-x86_64"
            shutil.copy(FAKE, qemu)
            vcpu = self.boosted_then_killed(qemu)
            self.assertEqual(harness.policy(vcpu), os.SCHED_RR, "left boosted by the killed daemon")
            upgrade, new_version = self.bumped(deb, tmp)
            run("dpkg", "-i", upgrade)  # prerm upgrade, then postinst configure
            self.assertEqual(run("dpkg-query", "-W", "-f=${Version}", "cosched").stdout, new_version)
            run("/usr/bin/cosched", "--version")
            self.assertEqual(harness.policy(vcpu), os.SCHED_RR, "an upgrade alone does not restore")
            r = run("dpkg", "--purge", "cosched")
            self.assertRegex(r.stdout + r.stderr, r"restored [1-9]\d* thread\(s\)")
            self.assertEqual(harness.policy(vcpu), os.SCHED_OTHER, "the purge restored the vCPU")
            for p in self.procs:
                p.kill()
        for f in UNITS + ["/usr/bin/cosched", "/etc/cosched", "/lib/udev/rules.d/60-cosched.rules"]:
            self.assertFalse(os.path.exists(f), f)
        self.assertFalse(installed())

    def boosted_then_killed(self, qemu):
        """Starts the installed daemon as the unit does and a fake QEMU at
        /run/cosched/vms/pkg.sock, plays its guest (REGISTER, then CPU 1: the daemon boosts the
        vCPU and holds it), and kills the daemon with SIGKILL once the vCPU is SCHED_RR. The
        fake QEMU lives on, like a VM whose daemon crashed. Returns the vCPU's tid."""
        daemon = subprocess.Popen(["/usr/bin/cosched", "host"], stderr=subprocess.DEVNULL,
                                  preexec_fn=harness.dies_with_us(signal.SIGKILL))
        self.procs.append(daemon)
        deadline = time.time() + 10
        while not Path("/run/cosched/control.sock").exists():
            self.assertLess(time.time(), deadline, "the installed daemon did not start")
            time.sleep(0.02)
        vm = subprocess.Popen([qemu, "--socket", "/run/cosched/vms/pkg.sock", "--thread", "CPU 0/TCG"],
                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              preexec_fn=harness.dies_with_us(signal.SIGKILL))
        self.procs.append(vm)
        # Frames: magic "CS", version 1, kind, seq (u32 LE), value (u64 LE).
        vm.stdin.write(struct.pack("<2sBBIQ", b"CS", 1, 1, 1, 1))  # REGISTER cpu
        vm.stdin.write(struct.pack("<2sBBIQ", b"CS", 1, 3, 2, 1))  # CPU 1
        vm.stdin.flush()
        while True:
            tids = [t for t, comm in harness.qemu_threads(vm.pid) if harness.is_vcpu(comm)]
            if tids and harness.policy(tids[0]) == os.SCHED_RR:
                break
            self.assertLess(time.time(), deadline, "the installed daemon never boosted the fake VM")
            time.sleep(0.01)
        daemon.kill()
        daemon.wait()
        return tids[0]


if __name__ == "__main__":
    unittest.main()
