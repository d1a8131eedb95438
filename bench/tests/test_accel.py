"""The accelerator choice (guest/accel.sh, guest/run.sh): its decisions against fake QEMU binaries
that behave as the failures met on real hosts do (a KVM internal error, a guest that never prints,
a QEMU that refuses -cpu host), its cache, and run.sh stopping at once on a KVM internal error
at run time. Each fake is its own binary, so each has its own cache key; the verdicts go to a
file of the test's own (COSCHED_ACCEL_VERDICT), never to the build's.

The probe's first step opens /dev/kvm and creates a VM and a vCPU for real; on a host where that
fails, every automatic verdict is TCG for that reason, and the tests check that instead."""

import os
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness  # noqa: E402

ACCEL = harness.ACCEL_SH
FAKE = r"""#!/bin/bash
# A fake qemu-system-x86_64: MODE behaves as one of the outcomes the probe must tell apart.
MODE=%s
[ "$1" = --version ] && { echo "QEMU emulator version 0.0.0 (fake $MODE)"; exit 0; }
# The probe (and run.sh under KVM) must ask for what it tests: KVM, with the host's CPU.
case " $* " in *" -accel kvm -cpu host "*) ;; *) echo "fake qemu: not -accel kvm -cpu host: $*" >&2; exit 99 ;; esac
case $MODE in
    boots) sleep 0.3; echo "COSCHED-KVM-PROBE-OK"; echo "COSCHED-GUEST: workload exit 0"; exit 0 ;;
    interr) sleep 0.3; echo "KVM internal error. Suberror: 1" >&2; echo "emulation failure" >&2; exec -a "$0" sleep 600 ;;
    silent) exec -a "$0" sleep 600 ;;
    refuses) echo "$0: can't apply global host-x86_64-cpu.foo=on" >&2; exit 1 ;;
    late) echo "COSCHED-GUEST: init started"; sleep 0.5
          echo "KVM internal error. Suberror: 1" >&2; exec -a "$0" sleep 600 ;;
    entry) echo "COSCHED-GUEST: init started"; sleep 0.5
           echo "KVM: entry failed, hardware error 0x80000021" >&2; exec -a "$0" sleep 600 ;;
esac
"""


def kvm_opens():
    """The probe's first step's verdict here: None if /dev/kvm opens (and the fakes decide), else
    the reason it gives."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, COSCHED_ACCEL="auto", COSCHED_QEMU="/nonexistent-qemu",
                   COSCHED_ACCEL_VERDICT=f"{tmp}/v")
        out = subprocess.run([str(ACCEL)], env=env, capture_output=True, text=True).stdout.strip()
        return None if out.endswith("/nonexistent-qemu not found") else out


class AccelChoice(unittest.TestCase):
    def setUp(self):
        harness.need_root(self)
        for f in ("vmlinux", "base.cpio"):
            if not (harness.GUEST_DIR / f).exists():
                raise AssertionError(f"{harness.GUEST_DIR / f} missing: build first (scripts/setup.sh)")
        self.tmp = tempfile.TemporaryDirectory(prefix="cosched-accel-")
        self.dir = Path(self.tmp.name)
        self.verdict = self.dir / "accel.verdict"
        self.kvm_fails = kvm_opens()

    def tearDown(self):
        self.tmp.cleanup()

    def fake(self, mode):
        p = self.dir / f"qemu-{mode}"
        if not p.exists():  # written once: the cache key holds the binary's size and time
            p.write_text(FAKE % mode)
            p.chmod(0o755)
        return p

    def env(self, qemu, **kw):
        return {**os.environ, "COSCHED_ACCEL": "auto", "COSCHED_QEMU": str(qemu),
                "COSCHED_ACCEL_VERDICT": str(self.verdict), "COSCHED_ACCEL_PROBE_S": "3", **kw}

    def probe(self, mode, *args):
        t0 = time.monotonic()
        r = subprocess.run([str(ACCEL), *args], env=self.env(self.fake(mode)), capture_output=True,
                           text=True, timeout=60)
        return r, time.monotonic() - t0

    def expect_auto(self, r, accel, words):
        if self.kvm_fails:
            self.assertEqual(r.stdout.strip(), self.kvm_fails, r)
            self.assertEqual(r.returncode, 1, r)
            return False
        self.assertTrue(r.stdout.startswith(accel + " "), r)
        self.assertEqual(r.returncode, 0 if accel == "kvm" else 1, r)
        for w in words:
            self.assertIn(w, r.stdout, r)
        return True

    def test_a_guest_that_prints_the_marker_means_kvm_and_the_verdict_is_cached(self):
        r, _ = self.probe("boots")
        if self.expect_auto(r, "kvm", ["booted under KVM (QEMU emulator version 0.0.0 (fake boots)) to its workload in"]):
            self.assertNotIn("(cached)", r.stdout)
            r2, _ = self.probe("boots")
            self.assertEqual(r2.stdout.strip(), r.stdout.strip() + " (cached)", r2)
            r3, _ = self.probe("boots", "--reprobe")
            self.assertNotIn("(cached)", r3.stdout, r3)

    def test_a_kvm_internal_error_means_tcg_at_once(self):
        r, took = self.probe("interr")
        if self.expect_auto(r, "tcg", ["KVM cannot run the test guest: QEMU: KVM internal error. Suberror: 1"]):
            self.assertLess(took, 2.5, f"the probe waited {took:.1f} s past the error")
            self.assertFalse(subprocess.run(["pgrep", "-f", str(self.dir / "qemu-interr")]).returncode == 0,
                             "the probe's QEMU is stopped")

    def test_a_guest_that_prints_nothing_means_tcg_after_the_bound(self):
        r, took = self.probe("silent")
        if self.expect_auto(r, "tcg", ["printed no marker within 3 s", "console: nothing"]):
            self.assertGreaterEqual(took, 3)
            # Maybe a passing state (a loaded host): the verdict holds until the host reboots.
            boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
            self.assertIn(f"boot {boot}\n", self.verdict.read_text())

    def test_a_qemu_that_refuses_the_cpu_means_tcg_with_its_message(self):
        r, _ = self.probe("refuses")
        self.expect_auto(r, "tcg", ["exited 1: can't apply global host-x86_64-cpu.foo=on"])

    def test_the_operator_forces_the_choice(self):
        for how, args, env in (("--accel", ["--accel", "kvm"], {}), ("COSCHED_ACCEL", [], {"COSCHED_ACCEL": "kvm"})):
            e = self.env(self.fake("silent"))
            e.update(env)
            r = subprocess.run([str(ACCEL), *args], env=e, capture_output=True, text=True, timeout=10)
            self.assertEqual((r.returncode, r.stdout.strip()), (0, f"kvm chosen by {how}=kvm"), r)
        e = self.env(self.fake("silent"), COSCHED_ACCEL="kvn")
        r = subprocess.run([str(ACCEL)], env=e, capture_output=True, text=True, timeout=10)
        self.assertEqual(r.returncode, 2, r)
        self.assertIn("COSCHED_ACCEL must be auto, kvm or tcg (got 'kvn')", r.stderr)
        r = subprocess.run([str(harness.RUN_SH), "--dry-run"], env=e, capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r)
        self.assertIn("must be auto, kvm or tcg, not 'kvn'", r.stderr)

    def test_run_sh_stops_at_once_on_a_fatal_kvm_error_and_the_next_auto_choice_is_tcg(self):
        wl = self.dir / "w.sh"
        wl.write_text("echo hello\n")
        for mode, msg, how in (("late", "KVM internal error. Suberror: 1", ["--accel", "kvm"]),
                               ("entry", "KVM: entry failed, hardware error 0x80000021", [])):
            qemu = self.fake(mode)
            t0 = time.monotonic()
            r = subprocess.run([str(harness.RUN_SH), *how, "--workload", str(wl), "--timeout", "120"],
                               env=self.env(qemu, COSCHED_ACCEL="kvm"), capture_output=True, text=True, timeout=100)
            took = time.monotonic() - t0
            self.assertEqual(r.returncode, 3, r)
            self.assertLess(took, 10, f"run.sh took {took:.1f} s to stop")
            chosen = "--accel=kvm" if how else "COSCHED_ACCEL=kvm"
            self.assertIn(f"run.sh: accelerator kvm: chosen by {chosen}\n{msg}\n"
                          f"run.sh: QEMU stopped: the guest hit a fatal KVM error ({msg})", r.stderr)
            self.assertIn("COSCHED-GUEST: init started", r.stdout)
            self.assertNotEqual(subprocess.run(["pgrep", "-f", str(qemu)]).returncode, 0, "QEMU is gone")
            # The recorded verdict answers before /dev/kvm is looked at.
            r, _ = self.probe(mode)
            self.assertEqual(r.returncode, 1, r)
            self.assertTrue(r.stdout.startswith(f"tcg KVM failed at run time: QEMU: {msg}"), r)
            self.assertTrue(r.stdout.strip().endswith("(cached)"), r)


if __name__ == "__main__":
    unittest.main()
