"""Every experiment in quick mode (VM tier: needs root and a built tree, boots the guest): the
outputs must be well formed. Judging the effects is what the full runs are for (results/)."""

import csv
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiment import EXPERIMENTS, load  # noqa: E402
import harness  # noqa: E402


def setUpModule():
    harness.print_accel(__file__)


def need_root(test):
    if os.geteuid() != 0:
        if os.environ.get("COSCHED_REQUIRE_ROOT") == "1":
            raise AssertionError("COSCHED_REQUIRE_ROOT=1 but not root")
        test.skipTest("needs root (set COSCHED_REQUIRE_ROOT=1 to make this a failure)")


def png_size(path):
    data = Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise AssertionError(f"{path} is not a PNG")
    return struct.unpack(">II", data[16:24])


# The experiments that run BFQ on the host's (emulated) disk: on a host whose kernel has no
# BFQ they must refuse with the reason (slowdisk.Unsupported) instead of measuring.
NEEDS_HOST_BFQ = ("io-startup",)


class QuickExperiments(unittest.TestCase):
    def check(self, name):
        need_root(self)
        mod = load(name)
        from experiments import slowdisk
        with tempfile.TemporaryDirectory(prefix=f"cosched-{name}-") as out:
            if name in NEEDS_HOST_BFQ and slowdisk.host_bfq():
                # Not a skip: the experiment must refuse at once, saying why, and leave nothing.
                t0 = time.time()
                with self.assertRaises(slowdisk.Unsupported) as cm:
                    mod.main(True, out=out)
                self.assertIn("unsupported here: the host kernel offers no bfq I/O scheduler", str(cm.exception))
                self.assertLess(time.time() - t0, 10, "refused before anything was set up")
                self.assertFalse((Path(out) / "data.csv").exists())
                print(f"\n  {name}: refused on this host: {cm.exception}", file=sys.stderr)
                return
            t0 = time.time()
            mod.main(True, out=out)
            took = time.time() - t0
            self.assertLess(took, 180, f"{name} --quick must run in under 3 minutes")
            with open(Path(out) / "data.csv") as f:
                rows = list(csv.DictReader(f))
            self.assertGreater(len(rows), 0, "data.csv has rows")
            self.assertEqual(list(rows[0].keys())[:len(mod.COLUMNS)], mod.COLUMNS)
            numeric = [c for c in mod.COLUMNS if c.endswith(("_us", "_ms", "_s", "_pct", "_share")) or c in ("samples",)]
            for r in rows:
                for c in numeric:
                    if r.get(c, "") != "":
                        for x in r[c].split("/"):  # one figure, or one per round / download ("/"-joined)
                            float(x)  # raises if not a number
            w, h = png_size(Path(out) / "plot.png")
            self.assertTrue(w > 400 and h > 250, (w, h))
            self.assertGreater((Path(out) / "plot.png").stat().st_size, 10_000)
            summary = (Path(out) / "summary.md").read_text()
            for part in ("# ", "|---", "**The paper", "Our setup:", f"experiment.py {name} --quick"):
                self.assertIn(part, summary, f"{name} summary.md")
            print(f"\n  {name}: {len(rows)} rows in {took:.0f} s", file=sys.stderr)


class Resume(unittest.TestCase):
    """An interrupted full run keeps its finished points and measures only the missing ones
    (unprivileged: no guest is booted)."""

    def test_interrupted_run_resumes(self):
        from experiments.common import Output
        with tempfile.TemporaryDirectory(prefix="cosched-resume-") as out:
            measured = []

            def run(fail_at=None, fresh=False):
                o = Output("resume", quick=False, out=out, fresh=fresh)
                rows = []
                for k in range(4):
                    def m(k=k):
                        if k == fail_at:
                            raise KeyboardInterrupt
                        measured.append(k)
                        return {"k": k, "v": k * 10}
                    rows.append(o.point(str(k), m))
                o.summary("t", "body")
                return rows

            with self.assertRaises(KeyboardInterrupt):
                run(fail_at=2)
            self.assertEqual(measured, [0, 1])
            # A line cut in the middle of a write is measured again, not trusted.
            with open(Path(out) / "points.jsonl", "a") as f:
                f.write('{"key": "2", "row": {"k"')
            rows = run()
            self.assertEqual(measured, [0, 1, 2, 3], "only the missing points are measured")
            self.assertEqual(rows, [{"k": k, "v": k * 10} for k in range(4)])
            self.assertFalse((Path(out) / "points.jsonl").exists(), "the checkpoint goes once the summary is written")
            run()
            self.assertEqual(measured, [0, 1, 2, 3, 0, 1, 2, 3], "a finished run starts over")
            with self.assertRaises(KeyboardInterrupt):
                run(fail_at=1)
            run(fresh=True)
            self.assertEqual(measured[-4:], [0, 1, 2, 3], "--fresh discards the checkpoint")


def stat_fields(pid):
    """The fields of /proc/PID/stat after the command name (state, ppid, ...), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def alive(pid):
    """pid exists and is not a zombie."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def descendants(pid):
    """Every live (non-zombie) process below `pid`."""
    children = {}
    for d in os.listdir("/proc"):
        fields = stat_fields(d) if d.isdigit() else None
        if fields and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(d))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


class Interrupted(unittest.TestCase):
    """An experiment killed mid-run (SIGTERM like `kill`, or SIGKILL) leaves nothing behind: no
    QEMU, no host hog, no daemon (VM tier: boots the guest)."""

    def check(self, sig):
        need_root(self)
        with tempfile.TemporaryDirectory(prefix="cosched-interrupt-") as out:
            p = subprocess.Popen([sys.executable, str(Path(__file__).resolve().parents[1] / "experiment.py"),
                                  "histogram", "--quick", "--out", out],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                # Wait for the first run (cosched): the guest, the daemon and 2 hogs all up.
                deadline = time.time() + 120
                seen = set()
                while time.time() < deadline:
                    now = descendants(p.pid)
                    seen |= now
                    comms = []
                    for d in now:
                        try:
                            comms.append(Path(f"/proc/{d}/comm").read_text().strip())
                        except OSError:
                            pass
                    if "cosched" in comms and any(c.startswith("qemu-system") for c in comms) and comms.count("sh") >= 2:
                        break
                    time.sleep(0.2)
                else:
                    self.fail(f"the experiment never had its guest, daemon and hogs up at once ({comms})")
                time.sleep(1)
                seen |= descendants(p.pid)
                p.send_signal(sig)
                p.wait(timeout=30)
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            deadline = time.time() + 20
            while time.time() < deadline and any(alive(d) for d in seen):
                time.sleep(0.2)
            left = [(d, Path(f"/proc/{d}/cmdline").read_text().replace("\0", " ")[:80]) for d in seen if alive(d)]
            self.assertEqual(left, [], f"left running after {sig.name}")

    def test_sigterm(self):
        self.check(signal.SIGTERM)

    def test_sigkill(self):
        self.check(signal.SIGKILL)


for _name in EXPERIMENTS:
    setattr(QuickExperiments, "test_" + _name.replace("-", "_"), lambda self, n=_name: self.check(n))

if __name__ == "__main__":
    unittest.main()
