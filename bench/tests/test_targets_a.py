"""The targets tables of latency-vs-load, histogram, startup, startup-misses, boost-classes,
overhead and scale, rendered from small fabricated rows (main(..., rows=...), no root, no guest,
no daemon): each summary carries the standard "## Targets" table, its verdicts are the data's
(a fabricated run that meets a target and one that misses it), and a run's data.csv read back
with stored() renders the same table."""

import contextlib
import csv
import io
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))

from evaluation import parse_targets  # noqa: E402


class Render(unittest.TestCase):
    """A module's main(False, out=tmp, rows=rows) into a throw-away directory."""

    def setUp(self):
        from experiments import common
        patch = mock.patch.object(common, "accel_text", lambda: ("TCG", "a test: no guest is asked"))
        patch.start()
        self.addCleanup(patch.stop)
        self.tmp = tempfile.TemporaryDirectory(prefix="cosched-targets-")
        self.addCleanup(self.tmp.cleanup)
        self.n = 0

    def render(self, module, rows, files=None):
        """The targets of the summary `module` renders from `rows` (other data files of the run:
        files, {name: [rows]}), and the output directory."""
        self.n += 1
        out = Path(self.tmp.name) / str(self.n)
        out.mkdir()
        for name, frows in (files or {}).items():
            with open(out / name, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(frows[0]))
                w.writeheader()
                w.writerows(frows)
        with contextlib.redirect_stdout(io.StringIO()):
            module.main(False, out=str(out), rows=rows)
        summary = (out / "summary.md").read_text()
        self.assertIn("\n## Targets\n\n| target | measured | spread between repeats | verdict |\n", summary)
        self.assertIn("this summary rendered again", summary.splitlines()[2])
        self.assertTrue((out / "plot.png").stat().st_size > 10_000)
        targets = parse_targets(summary)
        self.assertTrue(targets)
        return targets, out

    def verdicts(self, targets, word):
        """{target: met} of the rows whose target mentions `word`."""
        return {t["target"]: t["met"] for t in targets if word in t["target"]}

    def round_trip(self, module, out, targets, files=()):
        """data.csv (and the run's other files) read back by stored() render the same table."""
        again = Path(self.tmp.name) / f"{self.n}-again"
        again.mkdir()
        for name in ("data.csv", *files):
            (again / name).write_bytes((out / name).read_bytes())
        with contextlib.redirect_stdout(io.StringIO()):
            module.main(False, out=str(again), rows=module.stored(again))
        self.assertEqual(parse_targets((again / "summary.md").read_text()), targets)
        self.assertEqual((again / "data.csv").read_bytes(), (out / "data.csv").read_bytes(),
                         "a rendering keeps data.csv as it was")


class LatencyVsLoad(Render):
    def rows(self, cosched):
        from experiments import latency_vs_load as m
        out = []
        for cm in m.CYCLICTEST:
            out.append(dict(cyclictest=cm, curve="no guest", policy="", total_hogs=0, host_hogs=0, guest_hogs=0,
                            avg_us=20, p50_us=18, p99_us=40, max_us=900, samples=5000, boosts=""))
            for total, policy, (avg, p99, mx) in ((1, "none", (100, 200, 5000)), (3, "none", (600, 5000, 12000)),
                                                  (3, "cosched", cosched), (3, "static_rr", (110, 180, 50000))):
                out.append(dict(cyclictest=cm, curve="1 guest wl", policy=policy, total_hogs=total,
                                host_hogs=total - 1, guest_hogs=1, avg_us=avg, p50_us=avg, p99_us=p99, max_us=mx,
                                samples=5000, boosts=7 if policy == "cosched" else ""))
        return out

    def test_verdicts_follow_the_data(self):
        from experiments import latency_vs_load as m
        good, out = self.render(m, self.rows((105, 250, 8000)))
        judged = [t for t in good if t["met"] is not None]
        self.assertEqual(len(judged), 4, good)
        self.assertTrue(all(t["met"] for t in judged), good)
        self.assertIn("1.05× (105 against 100 µs)", judged[0]["measured"])
        bad, _ = self.render(m, self.rows((200, 500, 60000)))
        self.assertEqual([t["met"] for t in bad if t["met"] is not None], [False] * 4, bad)
        self.assertTrue(any("paper" in t["target"] and t["met"] is None for t in good))
        self.round_trip(m, out, good)

    def test_the_uncoordinated_maximum_beside_the_static_target(self):
        from experiments import latency_vs_load as m
        # The uncoordinated max (12 ms) is below static RR's (50 ms) too: the target is met by a
        # cosched no better than no coordination, and a row without a target says so.
        targets, _ = self.render(m, self.rows((105, 250, 20000)))
        self.assertIs(self.verdicts(targets, "static SCHED_RR 1's")["cosched's maximum below static SCHED_RR 1's "
                                                                   "(cyclictest -p 80 beside 1 guest hog; 2 host hogs)"],
                      True)
        ref = [t for t in targets if "the uncoordinated maximum" in t["target"]]
        self.assertEqual(len(ref), 1, targets)
        self.assertIsNone(ref[0]["met"])
        self.assertEqual(ref[0]["measured"], "uncoordinated 12000 µs, static SCHED_RR 1 50000 µs; cosched's 20000 µs "
                                             "is not below the uncoordinated maximum")
        targets, _ = self.render(m, self.rows((105, 250, 8000)))
        self.assertIn("cosched's 8000 µs is below the uncoordinated maximum",
                      next(t["measured"] for t in targets if "the uncoordinated maximum" in t["target"]))

    def test_the_maxima_and_points_are_counted_from_the_data(self):
        from experiments import latency_vs_load as m
        _, out = self.render(m, self.rows((105, 250, 8000)))
        summary = (out / "summary.md").read_text()
        self.assertIn("2 guest points with SCHED_OTHER cyclictest and 2 guest points with -p 80", summary)
        self.assertIn("| static SCHED_RR 1 | 1 | 50.0-50.0 | 1 of 1 | 50.0-50.0 | 1 of 1 |", summary)


class Histogram(Render):
    def rows(self, tail):
        out = []
        for cm in ("other", "rt"):
            for policy, (b, c) in (("none", (5000, tail)), ("cosched", (5000, 1))):
                out += [dict(cyclictest=cm, policy=policy, latency_us=100, samples=1000 - c),
                        dict(cyclictest=cm, policy=policy, latency_us=b, samples=c)]
        return out

    def test_the_papers_figures_beside_the_data(self):
        from experiments import histogram as m
        targets, out = self.render(m, self.rows(100))
        self.assertEqual([t["met"] for t in targets], [None, None], "the paper's figures: no target of ours")
        high = next(t for t in targets if "high range" in t["target"])
        self.assertIn("SCHED_OTHER 10.0% → 0.10%", high["measured"])
        targets2, _ = self.render(m, self.rows(300))
        self.assertIn("SCHED_OTHER 30.0% → 0.10%", next(t for t in targets2 if "high range" in t["target"])["measured"])
        summary = (out / "summary.md").read_text()
        self.assertIn("This run wrote no `stats.csv`", summary)
        self.assertIn("not recorded", summary)
        self.round_trip(m, out, targets)

    def test_stats_csv_gives_cyclictests_own_figures(self):
        from experiments import histogram as m
        stats = [dict(cyclictest=cm, policy=p, samples=1000, avg_us=avg, max_us=40000, overflows=1, boosted_pct=bp)
                 for cm in ("other", "rt") for p, avg, bp in (("none", 777, ""), ("cosched", 111, 98))]
        targets, out = self.render(m, self.rows(100), files={"stats.csv": stats})
        self.assertIn("SCHED_OTHER 777 → 111 µs", targets[0]["measured"])
        summary = (out / "summary.md").read_text()
        self.assertIn("| 40000 | 1000 | 98 |", summary)
        self.round_trip(m, out, targets, files=("stats.csv",))


class Startup(Render):
    def setUp(self):
        super().setUp()
        from experiments import startup
        empty = tempfile.TemporaryDirectory(prefix="cosched-targets-results-")
        self.addCleanup(empty.cleanup)
        patch = mock.patch.object(startup, "RESULTS", Path(empty.name))  # no startup-misses to quote
        patch.start()
        self.addCleanup(patch.stop)

    def rows(self, budget_loaded, budget_idle, hogs_with_budget):
        from experiments import startup as m
        out = []

        def row(curve, policy, total, g, mean, boosted=""):
            return dict(curve=curve, policy=policy, total_hogs=total, host_hogs=total - g, guest_hogs=g,
                        launches=100, mean_ms=mean, sd_ms=mean / 10, p50_ms=mean, max_ms=2 * mean,
                        boosted_pct=boosted, hog_cpu_s="", measure_s="")
        for total, g, none, static, budget in ((0, 0, 100.0, 100.0, budget_idle), (3, 1, 1000.0, 400.0, budget_loaded)):
            out.append(row("no guest", "", total, 0, 20.0))
            # The point with no hogs repeated: its ratios are the means of the runs' means.
            for rep, wobble in ((1, 0.9), (2, 1.1)) if total == 0 else ((1, 1.0),):
                out.append(dict(row(f"{g} guest wl", "none", total, g, none * wobble), repeat=rep))
                out.append(dict(row(f"{g} guest wl{m.BUDGET[1]}", "cosched", total, g, budget * wobble, 90.0),
                                repeat=rep))
                out.append(dict(row(f"{g} guest wl", "static_rr", total, g, static * wobble), repeat=rep))
                if total == 0:
                    out.append(dict(row(f"{g} guest wl{m.REFUSED[2]}", "cosched", total, g, 1.2 * none * wobble, 0.1),
                                    repeat=rep))
            if total - g >= 2:
                out.append(row(f"{g} guest wl{m.LIFTED[2]}", "cosched", total, g, 440.0, 99.0))
        for curve, policy, hogs in (("forking guest", "none", 20.0), ("forking guest", "cosched", 19.0),
                                    (f"forking guest{m.BUDGET[1]}", "cosched", hogs_with_budget)):
            out.append(dict(row(curve, policy, 2, 0, 0), launches="", mean_ms="", sd_ms="", p50_ms="", max_ms="",
                            boosted_pct=20.0 if policy == "cosched" else "", hog_cpu_s=hogs, measure_s=10.0))
        return out

    def test_verdicts_follow_the_data(self):
        from experiments import startup as m
        good, out = self.render(m, self.rows(420.0, 101.0, 19.0))
        self.assertEqual([t["met"] for t in good], [True, True, None, True, None, True, None], good)
        self.assertIn("1 of 1 points within (1.05-1.05×)", good[0]["measured"])
        # The bounds of the same run: the share cap lifted (440 against static's 400 ms), the
        # default share's cap alone (90% at static's rate, 10% at none's: 1/(.9/400+.1/1000)/400),
        # and the agent alone with no hogs (1.2× none's, in each of the two repeats).
        self.assertIn("cap lifted: 1 of 1 points within 1.2× (1.10-1.10×)", good[2]["measured"])
        self.assertIn(f"the default share's cap alone: {1 / (0.9 / 400 + 0.1 / 1000) / 400:.2f}", good[2]["measured"])
        self.assertIn("1.01× (101 against 100 ms, the means of 2 runs)", good[3]["measured"])
        self.assertIn("1.01/1.01 by repeat", good[3]["spread"])
        self.assertIn("1.20× (120 against 100 ms, the means of 2 runs): above the 1.05× target", good[4]["measured"])
        self.assertIn("5% lost against uncoordinated", good[5]["measured"])
        bad, _ = self.render(m, self.rows(800.0, 110.0, 10.0))
        self.assertEqual([t["met"] for t in bad], [False, False, None, False, None, False, None], bad)
        self.assertIn(f"over at 2 + 1 hogs (2.00×; the default share's bound {1 / (0.9 / 400 + 0.1 / 1000) / 400:.2f}×, share cap lifted 1.10×)",
                      bad[0]["measured"])
        self.round_trip(m, out, good)


class StartupMisses(Render):
    def setUp(self):
        super().setUp()
        from experiments import startup_misses
        empty = tempfile.TemporaryDirectory(prefix="cosched-targets-results-")
        self.addCleanup(empty.cleanup)
        patch = mock.patch.object(startup_misses, "RESULTS", Path(empty.name))  # no committed startup run
        patch.start()
        self.addCleanup(patch.stop)

    def rows(self, budget_of_static):
        out = []
        for rep in (1, 2, 3):
            for host, g in ((3, 2), (5, 1)):
                static = 500.0 + 10 * rep
                for variant, mean in (("none", 3 * static), ("static_rr", static),
                                      ("budget", budget_of_static * static)):
                    out.append(dict(host_hogs=host, guest_hogs=g, variant=variant, repeat=rep, launches=100,
                                    mean_ms=mean, sd_ms=50.0, p50_ms=mean, max_ms=2 * mean,
                                    boosted_pct=80.0 if variant == "budget" else "", binary=""))
        return out

    def test_verdicts_follow_the_data(self):
        from experiments import startup_misses as m
        good, out = self.render(m, self.rows(1.1))
        self.assertEqual([t["met"] for t in good], [True] * 4, good)
        self.assertEqual(good[0]["spread"], "1.10/1.10/1.10 by repeat (1.10 ± 0.00)")
        bad, _ = self.render(m, self.rows(1.3))
        self.assertEqual([t["met"] for t in bad], [False, True, False, True], bad)
        self.round_trip(m, out, good)


class BoostClasses(Render):
    def rows(self, fifo_avg, deadline_errors=0):
        out = []
        for rep in (0, 1):
            for cls, avg, mx, share in (("none", 600, 16000, 0.65), ("rr", 130, 12000, 0.45), ("fifo", fifo_avg, 9000, 0.46),
                                        ("deadline", 550, 15000, 0.62), ("nice", 140, 9700, 0.44)):
                out.append({"class": cls, "rep": rep, "avg_us": avg + rep, "p99_us": 3 * avg, "max_us": mx,
                            "hog_cpu_share": share, "boosts": 5 if cls != "none" else "",
                            "actuation_errors": deadline_errors if cls == "deadline" else 0,
                            "warnings": "sched_setattr: admission control refused"
                            if cls == "deadline" and deadline_errors else ""})
        return out

    def test_verdicts_follow_the_data(self):
        from experiments import boost_classes as m
        good, out = self.render(m, self.rows(150))
        self.assertEqual(good[0]["met"], True, good)
        self.assertEqual(good[0]["measured"], "no class beats it")
        self.assertEqual({t["met"] for t in good[1:]}, {None})
        bad, _ = self.render(m, self.rows(100))
        self.assertEqual(bad[0]["met"], False, bad)
        self.assertEqual(bad[0]["measured"], "SCHED_FIFO 1 beats it")
        self.round_trip(m, out, good)

    def test_a_class_with_actuation_errors_is_named_not_judged(self):
        from experiments import boost_classes as m
        from evaluation import NOT_JUDGED
        # SCHED_DEADLINE refused 100 times a run: no class judged beats RR, but that is not "met".
        targets, out = self.render(m, self.rows(150, deadline_errors=100))
        self.round_trip(m, out, targets)
        self.assertEqual(targets[0]["met"], NOT_JUDGED, targets)
        self.assertEqual(targets[0]["measured"], "no class judged beats it; not judged: SCHED_DEADLINE 900/1000 µs "
                         "(200 actuation errors: the kernel's admission control refused it, so its runs may measure "
                         "a VM whose threads stayed at their normal class)")
        text = (out / "summary.md").read_text()
        self.assertIn("The kernel refused SCHED_DEADLINE here", text)
        self.assertIn("SCHED_DEADLINE 900/1000 µs had actuation errors and is not judged", text)
        # A class that beats RR is a verdict whatever was left out.
        targets, _ = self.render(m, self.rows(100, deadline_errors=100))
        self.assertEqual(targets[0]["met"], False, targets)


class Overhead(Render):
    def rows(self, slowdown):
        out = []
        for n in range(1, 11):
            base = 1_000_000 + 20_000 * (n % 3)
            for agent in (0, 1):
                for job, extra in (("primes", slowdown), ("pingpong", 0.15)):
                    out.append(dict(part="agent", round=n, agent=agent, run_delay=1, job=job,
                                    us=round(base * (1 + extra * agent))))
        for on in (0, 1):
            for n in range(1, 11):
                for job in ("primes", "pingpong"):
                    out.append(dict(part="run-delay", round=n, agent=0, run_delay=on, job=job,
                                    us=1_000_000 + 1000 * on))
        return out

    def test_verdicts_follow_the_data(self):
        from experiments import overhead as m
        good, out = self.render(m, self.rows(0.001))
        self.assertEqual(good[0]["met"], True, good)
        self.assertIn("+0.10%", good[0]["measured"])
        self.assertEqual([t["met"] for t in good[1:]], [None] * 4, "ping-pong, run delay (2 jobs), the paper")
        bad, _ = self.render(m, self.rows(0.02))
        self.assertEqual(bad[0]["met"], False, bad)
        self.assertIn("+2.00%", bad[0]["measured"])
        self.round_trip(m, out, good)

    def test_a_run_without_the_run_delay_part(self):
        from experiments import overhead as m
        rows = [{k: r[k] for k in ("round", "agent", "job", "us")} for r in self.rows(0.001) if r["part"] == "agent"]
        targets, out = self.render(m, rows)
        self.assertEqual(len(targets), 3, "no run-delay rows")
        self.assertIn("not measured in this run", (out / "summary.md").read_text())


class Scale(Render):
    def setUp(self):
        super().setUp()
        from experiments import scale
        patch = mock.patch.object(scale, "old_rows", lambda: ({}, ""))
        patch.start()
        self.addCleanup(patch.stop)

    def rows(self, ratio, served, p99):
        out = []
        for vms, placement in ((1, "unpinned"), (64, "unpinned"), (256, "unpinned"), (64, "same-cpu")):
            asked = 200.0 * vms
            sent = int(asked * 10)
            paced = 30.0 if placement == "unpinned" else ""
            cpu = ratio * (paced or 10.0)
            out.append(dict(vms=vms, placement=placement, rate_per_vm=200, asked_per_s=asked, transitions_per_s=asked,
                            all_served=served, sent=sent, acked=sent if served else sent - 5, denied=0,
                            unanswered=0 if served else 5, threads_per_vm="3", daemon_cpu_pct=cpu * asked / 1e4,
                            cpu_us_per_transition=cpu, floor_us=20.0, ratio_to_floor=cpu / 20.0,
                            paced_floor_us=paced, ratio_to_paced_floor=cpu / paced if paced else "", p50_us=5.0,
                            p99_us=p99, max_us=900.0, samples=8192, e2e_p50_us=50.0, e2e_p99_us=300.0,
                            e2e_max_us=3000.0))
        return out

    FLOOR = [dict(when=w, placement=p, cpu_us_per_transition=20.0, read_us=15.0, sched_setattr_us=3.0,
                  sched_setattr_us_per_call=1.0, write_us=1.2, split_sum_us=19.2, rtt_p50_us=45.0, rtt_p99_us=60.0)
             for w in ("before", "after") for p in ("unpinned", "same-cpu", "cross-cpu")]

    def test_verdicts_follow_the_data(self):
        from experiments import scale as m
        good, out = self.render(m, self.rows(1.0, True, 30.0), files={"floor.csv": self.FLOOR})
        judged = [t for t in good if t["met"] is not None]
        self.assertEqual([t["met"] for t in judged], [True] * 4, good)
        self.assertTrue(judged[0]["target"].startswith("daemon CPU per transition ≤ 1.5× the floor paced"))
        bad, _ = self.render(m, self.rows(2.0, False, 60.0), files={"floor.csv": self.FLOOR})
        self.assertEqual([t["met"] for t in bad if t["met"] is not None], [False] * 4, bad)
        self.assertIn("over at 1, 64, 256 VMs", bad[0]["measured"])
        b2b = next(t for t in good if "back-to-back" in t["target"])
        self.assertIsNone(b2b["met"], "the back-to-back floor is not the target's")
        self.assertIn("(20.0 µs", b2b["target"])
        self.round_trip(m, out, good, files=("floor.csv",))


if __name__ == "__main__":
    unittest.main()
