"""Unprivileged tests of the harness's parsing and arithmetic (no guest, no root)."""

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cosched_bench as cb  # noqa: E402

CONSOLE = "\r\n".join([
    "COSCHED-GUEST: workload start uptime=2.01s",
    "COSCHED-MEASURE-START",
    "COSCHED-MEASURE-END",
    "COSCHED-HIST-BEGIN",
    "000050 000090 000100 000009 020000 000001 ",
    "# Total: 000000100",
    "# Min Latencies: 00050",
    "# Avg Latencies: 00255",
    "# Max Latencies: 40000",
    "# Histogram Overflows: 00000",
    "COSCHED-HIST-END",
])


class Parse(unittest.TestCase):
    def test_histogram_and_summary_in_decimal(self):
        hist, summary = cb.parse_histogram(CONSOLE)
        # Zero-padded numbers are decimal, not octal (000090 is 90).
        self.assertEqual(hist, {50: 90, 100: 9, 20000: 1})
        self.assertEqual(summary["Total"], 100)
        self.assertEqual(summary["Max Latencies"], 40000)

    def test_stats(self):
        s = cb.stats(*cb.parse_histogram(CONSOLE))
        self.assertEqual((s["n"], s["avg"], s["p50"], s["p99"], s["max"]), (100, 255, 50, 100, 40000))
        self.assertEqual(s["p999"], 20000)

    def test_missing_histogram_is_a_clear_error(self):
        with self.assertRaisesRegex(RuntimeError, "no HIST block in the guest.s output"):
            cb.parse_histogram("kernel panic")

    def test_targets(self):
        m = {"idle": {"avg": 100, "p99": 300, "max": 4000},
             "uncoordinated": {"avg": 600, "p99": 5000, "max": 9000},
             "coordinated": {"avg": 110, "p99": 500, "max": 6000},
             "static": {"avg": 150, "p99": 250, "max": 54000}}
        t = {d: ok for d, _, _, ok in cb.targets(m)}
        self.assertEqual(t, {"coordinated avg / idle avg": True, "coordinated p99 / idle p99": True,
                             "uncoordinated avg / coordinated avg": True,
                             "coordinated max / static RR 1 max": True})
        m["coordinated"]["avg"] = 130
        t = {d: ok for d, _, _, ok in cb.targets(m)}
        self.assertFalse(t["coordinated avg / idle avg"])
        self.assertFalse(t["uncoordinated avg / coordinated avg"])


if __name__ == "__main__":
    unittest.main()
