"""Every experiment in quick mode (VM tier: needs root and a built tree, boots the guest): the
outputs must be well formed. Judging the effects is what the full runs are for (results/)."""

import csv
import importlib
import os
import struct
import sys
import tempfile
import time
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from experiment import EXPERIMENTS  # noqa: E402


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


class QuickExperiments(unittest.TestCase):
    def check(self, name):
        need_root(self)
        mod = importlib.import_module(f"experiments.{EXPERIMENTS[name]}")
        with tempfile.TemporaryDirectory(prefix=f"cosched-{name}-") as out:
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
                        float(r[c])  # raises if not a number
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


for _name in EXPERIMENTS:
    setattr(QuickExperiments, "test_" + _name.replace("-", "_"), lambda self, n=_name: self.check(n))

if __name__ == "__main__":
    unittest.main()
