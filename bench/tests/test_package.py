"""The Debian packages (scripts/package.sh), installed for real: cosched (the binary) with either
role, cosched-host or cosched-guest. The host role: install, upgrade, its unit verified by
systemd-analyze, and a purge that leaves no thread changed, even one a daemon killed with SIGKILL
left boosted. The guest role: its unit, udev rule and config, nothing of the host daemon. And the
upgrade from 0.1's single package, keeping an operator's edited config. Root; it installs
/usr/bin/cosched and /etc/cosched, and purges them again (it refuses to run where a cosched is
installed already, rather than touch it)."""

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
HOST_UNIT = "/lib/systemd/system/cosched-host.service"
GUEST_UNIT = "/lib/systemd/system/cosched-guest.service"
UDEV_RULE = "/lib/udev/rules.d/60-cosched.rules"
PACKAGES = ["cosched", "cosched-host", "cosched-guest"]
COMMON = ["/usr/bin/cosched", "/usr/share/bash-completion/completions/cosched",
          "/usr/share/zsh/vendor-completions/_cosched", "/usr/share/fish/vendor_completions.d/cosched.fish"]


def run(*cmd, check=True, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def installed(package="cosched"):
    r = run("dpkg-query", "-W", "-f=${Status}", package, check=False)
    return r.returncode == 0 and "installed" in r.stdout and "not-installed" not in r.stdout


def man_pages():
    """The installed man pages' names (cosched, cosched-host, ...), whatever their section."""
    return {p.name.split(".")[0] for p in Path("/usr/share/man").glob("man*/cosched*.gz")}


class Package(unittest.TestCase):
    def setUp(self):
        harness.need_root(self)
        # Never replace what an operator installed: fail, saying why.
        for package in PACKAGES:
            self.assertFalse(installed(package), f"{package} is installed on this machine: the package test "
                             f"would replace and purge it; remove it first (dpkg --purge {package})")
        for p in ["/usr/bin/cosched", "/etc/cosched", "/run/cosched"]:
            self.assertFalse(os.path.exists(p), f"{p} exists: the package test would take it over; remove it first")
        self.procs = []
        self.addCleanup(self.cleanup)

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        if any(installed(p) for p in PACKAGES) or Path("/usr/bin/cosched").exists():
            run("dpkg", "--purge", *PACKAGES, check=False)
        shutil.rmtree("/run/cosched", ignore_errors=True)
        # setUp saw no /etc/cosched: a failed install can leave it empty.
        if os.path.isdir("/etc/cosched") and not os.listdir("/etc/cosched"):
            os.rmdir("/etc/cosched")

    def build(self):
        """The three packages, by name."""
        debs = harness.build_packages()
        for deb in debs.values():
            self.assertTrue(deb.is_file(), debs)
        self.assertEqual(sorted(debs), sorted(PACKAGES), debs)
        return debs

    def bumped(self, deb, tmp):
        """The same package with a higher version, and its dependencies on cosched bumped too:
        an upgrade."""
        root = Path(tmp) / deb.name
        run("dpkg-deb", "-R", deb, root)
        control = root / "DEBIAN/control"
        text = control.read_text()
        version = next(line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("Version: "))
        text = text.replace(f"Version: {version}", f"Version: {version}+1")
        control.write_text(text.replace(f"cosched (= {version})", f"cosched (= {version}+1)"))
        out = Path(tmp) / f"up-{deb.name}"
        run("dpkg-deb", "--root-owner-group", "--build", root, out)
        return out, f"{version}+1"

    def test_guest_role_installs_the_agent_and_nothing_of_the_host(self):
        debs = self.build()
        run("dpkg", "-i", debs["cosched"], debs["cosched-guest"])
        for f in COMMON + [GUEST_UNIT, UDEV_RULE, "/etc/cosched/guest.toml"]:
            self.assertTrue(Path(f).is_file(), f)
        for f in [HOST_UNIT, "/etc/cosched/host.toml", "/usr/share/cosched/grafana/cosched.json"]:
            self.assertFalse(os.path.exists(f), f"the guest role installed {f}, a part of the host daemon")
        self.assertFalse(installed("cosched-host"))
        self.assertIn("cosched-guest", man_pages())
        self.assertEqual(run("dpkg-query", "-W", "-f=${Conffiles}", "cosched-guest").stdout.split()[0],
                         "/etc/cosched/guest.toml")
        r = run("systemd-analyze", "verify", GUEST_UNIT, check=False)
        self.assertEqual((r.returncode, r.stdout + r.stderr), (0, ""))
        # The agent reads the shipped config (every key commented out: it fails only on the
        # port, absent here), and an operator's typo in it is an error that names the file.
        r = run("/usr/bin/cosched", "guest", "--port", "/nonexistent/port", check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("/nonexistent/port", r.stderr)
        with open("/etc/cosched/guest.toml", "a") as f:
            f.write("min_boost_usec = 300\n")
        r = run("/usr/bin/cosched", "guest", check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn('/etc/cosched/guest.toml: unknown key "min_boost_usec"', r.stderr)
        run("dpkg", "--purge", "cosched-guest", "cosched")
        for f in COMMON + [GUEST_UNIT, UDEV_RULE, "/etc/cosched"]:
            self.assertFalse(os.path.exists(f), f)

    def test_upgrade_from_the_single_package_keeps_the_edited_config(self):
        """0.1 shipped one package, cosched, with the units and host.toml; 0.2's roles take them
        over (Breaks/Replaces). Built here as 0.1 was laid out: the binary with the host role's
        files and scripts, host.toml its conffile."""
        debs = self.build()
        # Without these, dpkg refuses to unpack a role before cosched 0.2 ("trying to overwrite
        # '/etc/cosched/host.toml', which is also in package cosched 0.1.0"); apt happens to
        # order around it.
        for role in ["cosched-host", "cosched-guest"]:
            for field in ["Breaks", "Replaces"]:
                self.assertEqual(run("dpkg-deb", "-f", debs[role], field).stdout.strip(), "cosched (<< 0.2.0)")
        with tempfile.TemporaryDirectory(prefix="cosched-pkg-") as tmp:
            root = Path(tmp) / "old"
            run("dpkg-deb", "-R", debs["cosched"], root)
            host = Path(tmp) / "host"
            run("dpkg-deb", "-R", debs["cosched-host"], host)
            run("cp", "-a", f"{host}/.", root)
            guest = Path(tmp) / "guest"
            run("dpkg-deb", "-x", debs["cosched-guest"], guest)
            for f in [GUEST_UNIT, UDEV_RULE]:
                (root / f[1:]).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(guest / f[1:], root / f[1:])
            fields = {f: run("dpkg-deb", "-f", debs["cosched"], f).stdout.strip()
                      for f in ["Architecture", "Maintainer", "Depends"]}
            (root / "DEBIAN/control").write_text(
                f"Package: cosched\nVersion: 0.1.0\nArchitecture: {fields['Architecture']}\n"
                f"Maintainer: {fields['Maintainer']}\nDepends: {fields['Depends']}\n"
                "Description: cosched as 0.1 packaged it\n")
            old = Path(tmp) / "cosched_0.1.0.deb"
            run("dpkg-deb", "--root-owner-group", "--build", root, old)
            run("dpkg", "-i", old)
            edited = Path("/etc/cosched/host.toml").read_text() + "\n# the operator's edit\n"
            Path("/etc/cosched/host.toml").write_text(edited)
            # As an operator upgrades: apt, which orders the unpacks the Breaks ask for; and
            # non-interactive, as from a script: no conffile prompt.
            r = run("apt-get", "install", "-y", debs["cosched-host"].resolve(),
                    debs["cosched"].resolve(), stdin=subprocess.DEVNULL,
                    env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
            self.assertNotIn("Configuration file", r.stdout + r.stderr)
            for package in ["cosched", "cosched-host"]:
                self.assertTrue(installed(package), package)
            self.assertEqual(Path("/etc/cosched/host.toml").read_text(), edited, "the upgrade lost the edit")
            self.assertIn("/etc/cosched/host.toml", run("dpkg-query", "-W", "-f=${Conffiles}", "cosched-host").stdout)
            self.assertEqual(run("dpkg-query", "-S", HOST_UNIT).stdout.split(":")[0], "cosched-host")
            self.assertTrue(Path(HOST_UNIT).is_file())
            # 0.1 shipped the guest's files too: the host role drops them.
            for f in [GUEST_UNIT, UDEV_RULE]:
                self.assertFalse(os.path.exists(f), f"{f} left by the old package")

    def test_host_role_install_upgrade_verify_and_purge_leave_nothing_changed(self):
        debs = self.build()
        run("dpkg", "-i", debs["cosched"], debs["cosched-host"])
        version = run("/usr/bin/cosched", "--version").stdout.split()
        self.assertEqual(version[0], "cosched")
        self.assertTrue(debs["cosched"].name.startswith(f"cosched_{version[1]}_"), (debs, version))
        for f in COMMON + [HOST_UNIT, "/etc/cosched/host.toml", "/usr/share/cosched/grafana/cosched.json"]:
            self.assertTrue(Path(f).is_file(), f)
        for f in [GUEST_UNIT, UDEV_RULE, "/etc/cosched/guest.toml"]:
            self.assertFalse(os.path.exists(f), f"the host role installed {f}, a part of the guest agent")
        self.assertLessEqual({"cosched", "cosched-host", "cosched-vm-membw"}, man_pages())
        self.assertTrue(Path("/usr/share/man/man5/cosched-host.toml.5.gz").is_file(), "cosched-host.toml(5)")
        self.assertIn("/etc/cosched/host.toml", run("dpkg-query", "-W", "-f=${Conffiles}", "cosched-host").stdout)
        # The unit, against the installed binary and man page.
        r = run("systemd-analyze", "verify", HOST_UNIT, check=False)
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
            upgrades = [self.bumped(debs[p], tmp) for p in ["cosched", "cosched-host"]]
            run("dpkg", "-i", *(deb for deb, _ in upgrades))  # prerm upgrade, then postinst configure
            new_version = upgrades[0][1]
            for package in ["cosched", "cosched-host"]:
                self.assertEqual(run("dpkg-query", "-W", "-f=${Version}", package).stdout, new_version)
            run("/usr/bin/cosched", "--version")
            self.assertEqual(harness.policy(vcpu), os.SCHED_RR, "an upgrade alone does not restore")
            # A typo in the config must not keep the package's prerm from restoring.
            with open("/etc/cosched/host.toml", "a") as f:
                f.write("\nenabeld = true\n")
            r = run("dpkg", "--purge", "cosched-host", "cosched")
            self.assertIn("cannot load the config", r.stdout + r.stderr)
            self.assertRegex(r.stdout + r.stderr, r"restored [1-9]\d* thread\(s\)")
            self.assertEqual(harness.policy(vcpu), os.SCHED_OTHER, "the purge restored the vCPU")
            for p in self.procs:
                p.kill()
        # /run/cosched/vms still holds the fake VM's socket (a VM's, not the package's).
        for f in COMMON + [HOST_UNIT, "/etc/cosched", "/run/cosched/state", "/run/cosched/control.sock"]:
            self.assertFalse(os.path.exists(f), f)
        for package in PACKAGES:
            self.assertFalse(installed(package), package)

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
