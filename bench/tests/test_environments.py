"""VM tests in the environments operators run: a Debian 12 guest with systemd and udev
(guest/build-debian.sh) that installs the project's guest package and lives with it as an
operator's VM would. Root; the guest boots under the accelerator guest/accel.sh chooses."""

import json
import os
import shutil
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


def packages(dest):
    """scripts/package.sh's cosched and cosched-guest packages, copied into `dest`."""
    r = subprocess.run(["bash", str(harness.REPO / "scripts/package.sh")], capture_output=True, text=True,
                       timeout=1800)
    if r.returncode != 0:
        raise AssertionError(f"scripts/package.sh failed:\n{r.stdout}\n{r.stderr}")
    names = []
    for line in r.stdout.splitlines():
        if line.startswith("package.sh: "):
            deb = Path(line.split(": ", 1)[1])
            if deb.name.split("_")[0] in ("cosched", "cosched-guest"):
                shutil.copy(harness.REPO / deb, dest)
                names.append(deb.name)
    if len(names) != 2:
        raise AssertionError(f"scripts/package.sh did not make cosched and cosched-guest:\n{r.stdout}")
    return names


def vm_status(daemon):
    st = daemon.status() or {}
    return next((v for v in st.get("vms", []) if v["name"] == VM), None)


def wait_host(daemon, pred, what, timeout=60):
    """Waits until pred(the VM's status entry or None) is true; says what it saw last."""
    deadline = time.monotonic() + timeout
    while True:
        v = vm_status(daemon)
        if pred(v):
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"host: {what} not within {timeout} s; the VM's status: {json.dumps(v)[:3000]}")
        time.sleep(0.2)


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


if __name__ == "__main__":
    unittest.main()
