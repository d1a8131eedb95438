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


for _name in EXPERIMENTS:
    setattr(QuickExperiments, "test_" + _name.replace("-", "_"), lambda self, n=_name: self.check(n))

if __name__ == "__main__":
    unittest.main()
