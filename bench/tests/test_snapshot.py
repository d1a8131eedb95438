"""Boots from a snapshot (guest/run.sh --snapshot auto, guest/snapshot.py), on the real test guest
(VM tier: root, a built tree): the first boot of a configuration saves one, later boots restore
it and each runs its own workload; a snapshot QEMU cannot load is replaced by a fresh boot;
COSCHED_SNAPSHOT=off boots from the kernel. Each test has a configuration of its own (a kernel
argument only it uses), so its snapshot is its own, and removed at the end."""

import os
import re
import subprocess
import sys
import tempfile
import time
import unittest
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness  # noqa: E402


def setUpModule():
    harness.print_accel(__file__)


class Snapshot(unittest.TestCase):
    def setUp(self):
        harness.need_root(self)
        self.tmp = tempfile.TemporaryDirectory(prefix="cosched-snaptest-")
        self.dir = Path(self.tmp.name)
        # A configuration no other boot has: the key includes the kernel command line.
        self.append = f"cosched.test={uuid.uuid4().hex[:12]}"
        self.saved = set()

    def tearDown(self):
        for f in self.saved:
            Path(f).unlink(missing_ok=True)
        self.tmp.cleanup()

    def boot(self, text, env=None):
        """(console, run.sh's stderr) of a boot running `echo TEXT`, the guest's clock and its
        ports."""
        wl = self.dir / "wl.sh"
        wl.write_text(f"#!/bin/sh\necho \"WORKLOAD {text}\"\necho \"CLOCK $(date +%s)\"\n"
                      "ls /dev/virtio-ports/ | sed 's/^/PORT /'\n")
        r = subprocess.run([str(harness.RUN_SH), "--workload", str(wl), "--append", self.append, "--timeout", "120"],
                           capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=180)
        self.assertEqual(r.returncode, 0, r.stderr)
        for m in re.finditer(r"saved a snapshot of the booted guest .*: (\S+\.img)", r.stderr):
            self.saved.add(m.group(1))
        return r.stdout, r.stderr

    def lines(self, console, word):
        return [l.split(" ", 1)[1] for l in console.splitlines() if l.startswith(word + " ")]

    def test_the_first_boot_saves_the_next_restore_and_each_runs_its_own_workload(self):
        t0 = time.monotonic()
        console, err = self.boot("one")
        first_s = time.monotonic() - t0
        self.assertIn("saved a snapshot of the booted guest", err)
        self.assertEqual(self.lines(console, "WORKLOAD"), ["one"], console)
        (snap,) = self.saved
        self.assertTrue(Path(snap).exists())
        t0 = time.monotonic()
        console, err = self.boot("two")
        restored_s = time.monotonic() - t0
        self.assertIn(f"from the snapshot {snap}", err)
        self.assertNotIn("saved a snapshot", err)
        self.assertEqual(self.lines(console, "WORKLOAD"), ["two"], console)
        self.assertEqual(self.lines(console, "PORT"), ["org.cosched.workload"], console)
        # The restored guest's clock is the host's, not the snapshot's.
        (clock,) = self.lines(console, "CLOCK")
        self.assertLess(abs(int(clock) - time.time()), 5, console)
        print(f"\n  boot and save {first_s:.1f} s, restore {restored_s:.1f} s", file=sys.stderr)

    def test_a_snapshot_qemu_cannot_load_is_replaced_by_a_fresh_boot(self):
        self.boot("one")
        (snap,) = self.saved
        with open(snap, "r+b") as f:
            f.truncate(4096)
        console, err = self.boot("two")
        self.assertIn("the snapshot did not start", err)
        self.assertIn("booting afresh", err)
        self.assertEqual(self.lines(console, "WORKLOAD"), ["two"], console)
        self.assertGreater(Path(snap).stat().st_size, 4096, "saved again")
        console, err = self.boot("three")
        self.assertIn(f"from the snapshot {snap}", err)
        self.assertEqual(self.lines(console, "WORKLOAD"), ["three"], console)

    def test_off_boots_from_the_kernel_with_the_workload_in_the_initramfs(self):
        console, err = self.boot("plain", env={"COSCHED_SNAPSHOT": "off"})
        self.assertNotIn("snapshot", err)
        self.assertEqual(self.lines(console, "WORKLOAD"), ["plain"], console)
        self.assertEqual(self.lines(console, "PORT"), [], "no workload port")
        self.assertEqual(self.saved, set())


if __name__ == "__main__":
    unittest.main()
