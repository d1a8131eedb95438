"""results/<name>/manifest.json and `bench/experiment.py status` (unprivileged: no guest, no daemon;
the staleness is judged in a throw-away git repository, not in this one's history)."""

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest
from datetime import datetime
from pathlib import Path
from unittest import mock

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))
import manifest  # noqa: E402

REPO = BENCH.parent


def sh(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=test", "-c", "user.email=test@example.com",
                           *args], check=True, capture_output=True, text=True).stdout.strip()


def put(repo, path, text):
    p = Path(repo) / path
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def commit(repo, message="change"):
    sh(repo, "add", "-A")
    sh(repo, "commit", "-q", "-m", message)
    return sh(repo, "rev-parse", "HEAD")


class OutputManifest(unittest.TestCase):
    """An experiment's Output writes manifest.json with its summary."""

    def setUp(self):
        from experiments import common
        self.common = common
        patch = mock.patch.object(common, "accel_text", lambda: ("TCG", "a test: no guest is asked"))
        patch.start()
        self.addCleanup(patch.stop)
        self.tmp = tempfile.TemporaryDirectory(prefix="cosched-manifest-")
        self.addCleanup(self.tmp.cleanup)
        self.out = Path(self.tmp.name)

    def experiment(self, quick=False, rows=None, **kw):
        """A stand-in for an experiment's main(quick, out, ..., rows=None)."""
        o = self.common.Output("histogram", quick, out=self.out, **kw)
        o.csv(rows or [{"x": 1}], ["x"])
        o.summary("title", "body")
        return json.loads((self.out / "manifest.json").read_text())

    def test_fields(self):
        before = datetime.now().astimezone()
        m = self.experiment()
        self.assertEqual(m["source"], "written by the run")
        self.assertEqual(m["kind"], "measured")
        self.assertEqual(m["name"], "histogram")
        self.assertEqual(m["producer"], "bench/tests/test_manifest.py", "the module that made the Output")
        self.assertEqual(m["commit"], sh(REPO, "rev-parse", "HEAD"))
        self.assertIsInstance(m["dirty"], bool)
        self.assertEqual(m["dirty"], bool(m["dirty_paths"]))
        self.assertFalse([p for p in m["dirty_paths"] if p.startswith("results/")])
        self.assertEqual(m["kernel"], {"release": os.uname().release, "version": os.uname().version})
        self.assertEqual(m["accel"], {"name": "TCG", "reason": "a test: no guest is asked"})
        self.assertEqual(m["cpus"], os.cpu_count())
        started = datetime.fromisoformat(m["started"].replace("Z", "+00:00"))
        ended = datetime.fromisoformat(m["ended"].replace("Z", "+00:00"))
        self.assertTrue(m["started"].endswith("Z"))
        self.assertLessEqual(before.replace(microsecond=0), started)
        self.assertLessEqual(started, ended)
        self.assertEqual(m["argv"], sys.argv)
        self.assertEqual(m["executable"], sys.executable)
        self.assertIs(m["quick"], False)
        self.assertIsNone(m["seeds"], "no seeds declared")
        self.assertIsNone(m["rendered_commit"])
        self.assertTrue((self.out / "summary.md").exists())

    def test_quick_and_seeds(self):
        m = self.experiment(quick=True, seeds={"input": 42, "order": "4 + repeat"})
        self.assertIs(m["quick"], True)
        self.assertEqual(m["seeds"], {"input": 42, "order": "4 + repeat"})

    def test_rendered_keeps_the_measurement(self):
        measured = self.experiment()
        # As if measured at another commit, on another host.
        measured.update(commit="0" * 40, kernel={"release": "measured-kernel", "version": "#1"})
        (self.out / "manifest.json").write_text(json.dumps(measured))
        m = self.experiment(rows=[{"x": 2}])  # main(..., rows=rows): rendered again
        self.assertEqual(m["kind"], "rendered")
        self.assertEqual(m["commit"], "0" * 40)
        self.assertEqual(m["kernel"]["release"], "measured-kernel")
        self.assertEqual(m["started"], measured["started"])
        self.assertEqual(m["rendered_commit"], sh(REPO, "rev-parse", "HEAD"))
        self.assertEqual(m["rendered_argv"], sys.argv)

    def test_rendered_summary_says_when_and_where_it_was_measured(self):
        measured = self.experiment()
        first = (self.out / "summary.md").read_text()
        setup = [l for l in first.splitlines() if l.startswith("Our setup:")][-1]
        measured.update(started="2026-11-01T10:00:00Z", ended="2026-11-01T10:30:00Z", commit="ab" * 20)
        (self.out / "manifest.json").write_text(json.dumps(measured))
        (self.out / "summary.md").write_text(first.replace(setup, "Our setup: the measuring host."))
        self.experiment(rows=[{"x": 2}])
        text = (self.out / "summary.md").read_text()
        self.assertIn("took 30.0 min on 2026-11-01 at ababab", text)
        self.assertIn("rendered again from its data.csv on", text)
        self.assertIn("Our setup: the measuring host.", text, "the measuring run's set-up, not this host's")
        # Rendered twice, with no manifest of the measurement: the first line's measurement, once.
        (self.out / "manifest.json").unlink()
        self.experiment(rows=[{"x": 3}])
        self.experiment(rows=[{"x": 4}])
        first_line = (self.out / "summary.md").read_text().split("Command:")[1].splitlines()[0]
        self.assertIn("took 30.0 min on 2026-11-01 at ababab", first_line)
        self.assertEqual(first_line.count("rendered again"), 1, first_line)

    def test_rendered_without_a_manifest(self):
        m = self.experiment(rows=[{"x": 2}])
        self.assertEqual(m["kind"], "rendered")
        for k in ("commit", "kernel", "accel", "started", "quick"):
            self.assertIsNone(m[k], f"{k}: the measurement's, unknown")
        self.assertEqual(m["rendered_commit"], sh(REPO, "rev-parse", "HEAD"))

    def test_resumed_points_keep_their_commit(self):
        """A run resumed from points.jsonl: each point keeps its session's commit and dirty paths,
        and the manifest lists every commit, "commit" the oldest (old lines without one: null)."""
        head = sh(REPO, "rev-parse", "HEAD")
        old = "1" * 40
        (self.out / "points.jsonl").write_text(
            json.dumps({"key": "a", "row": {"x": 1}, "seconds": 1.0}) + "\n"  # before points kept a commit
            + json.dumps({"key": "b", "row": {"x": 2}, "seconds": 1.0, "commit": old,
                          "dirty_paths": ["bench/harness.py"]}) + "\n"
            + json.dumps({"key": "unused", "row": {"x": 9}, "seconds": 1.0, "commit": "2" * 40, "dirty_paths": []})
            + "\n")
        o = self.common.Output("histogram", False, out=self.out)
        got = [o.point(k, lambda: {"x": 3}) for k in ("a", "b", "c")]  # (a local "rows" would make it a rendering)
        self.assertEqual(got, [{"x": 1}, {"x": 2}, {"x": 3}])
        last = json.loads((self.out / "points.jsonl").read_text().splitlines()[-1])
        self.assertEqual((last["key"], last["commit"], last["dirty_paths"]), ("c", head, o.run.dirty_paths))
        o.csv(got, ["x"])
        o.summary("title", "body")
        m = json.loads((self.out / "manifest.json").read_text())
        self.assertEqual(m["kind"], "measured")
        self.assertEqual(m["commits"], [None, old, head], "oldest first; the unused point's commit is not one")
        self.assertEqual(m["commit"], old, "the oldest known: status judges from it")
        self.assertIn("unknown commit", m["commits_note"])
        self.assertIs(m["dirty"], True, "a session was dirty")
        self.assertIn("bench/harness.py", m["dirty_paths"])
        # Every point from this session's commit: one commit, as before.
        for line in [{"key": "a", "row": {"x": 1}, "seconds": 1.0, "commit": head, "dirty_paths": []}]:
            (self.out / "points.jsonl").write_text(json.dumps(line) + "\n")
        o = self.common.Output("histogram", False, out=self.out)
        o.point("a", lambda: {"x": 3})
        o.csv([{"x": 1}], ["x"])
        o.summary("title", "body")
        m = json.loads((self.out / "manifest.json").read_text())
        self.assertNotIn("commits", m)
        self.assertEqual(m["commit"], head)

    def test_explicit_rendered(self):
        self.assertEqual(self.experiment(rendered=True)["kind"], "rendered")
        self.assertEqual(self.experiment(rows=[{"x": 1}], rendered=False)["kind"], "measured")


class Parts(unittest.TestCase):
    def test_parts_keep_their_own_run(self):
        with tempfile.TemporaryDirectory(prefix="cosched-manifest-") as d:
            a = manifest.Run(argv=["reliability.py", "crash"])
            manifest.write(d, a, name="reliability", producer="bench/reliability.py", quick=False,
                           seeds={"seed": 7}, part="crash")
            b = manifest.Run(argv=["reliability.py", "soak"])
            m = manifest.write(d, b, name="reliability", producer="bench/reliability.py", quick=False, part="soak")
            self.assertEqual(set(m["parts"]), {"crash", "soak"})
            self.assertEqual(m["parts"]["crash"]["argv"], ["reliability.py", "crash"])
            self.assertEqual(m["parts"]["crash"]["seeds"], {"seed": 7})
            m = manifest.write(d, manifest.Run(argv=["reliability.py", "summary"]), name="reliability",
                               producer="bench/reliability.py", quick=False, rendered=True)
            self.assertEqual(set(m["parts"]), {"crash", "soak"}, "rendering keeps the parts")
            self.assertEqual(m["rendered_argv"], ["reliability.py", "summary"])


CRASH_ROWS = [dict(cycle=i, restore_by=("command", "restart")[i % 2], differences=0, restore="restored", boosted=1,
                   raised=1, throttles=1, shielded=True, fifo=True, foreign_qemus=0, detail="") for i in range(2)]


class ReliabilitySummary(unittest.TestCase):
    """bench/reliability.py's summary and manifest (no root: the parts' runs are stand-ins)."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="cosched-reliability-")
        self.addCleanup(self.tmp.cleanup)
        self.out = Path(self.tmp.name)

    def test_a_short_fuzz_run_has_no_rss_after_10_s(self):
        """fuzz.sh writes "-" (a run shorter than 10 s) or "?" in the "RSS at 10 s" column: no value,
        not an error in `reliability.py summary` or `all`."""
        import reliability
        (self.out / "fuzz.md").write_text(
            "Fuzzed 2026-12-01T00:00:00Z at commit 0000000 with rustc x and cargo-fuzz y, sanitizer none: `z`.\n\n"
            "| target | toolchain, sanitizer | executions | exec/s | corpus | RSS at 10 s (MB) | peak RSS (MB) | seconds "
            "| result |\n|---|---|---|---|---|---|---|---|---|\n"
            "| frame_decoder | stable, none | 1000 | 1 | 1 | - | 45 | 3 | ok |\n"
            "| config_loader | stable, none | ? | ? | 1 | ? | ? | 1 | FAILED |\n")
        text = reliability.write_summary(CRASH_ROWS, self.out)
        self.assertTrue((self.out / "plot.png").exists())
        self.assertIn("frame_decoder none (ran under 10 s) -> 45 MB", text)
        self.assertIn("config_loader not reported -> ? MB", text)
        self.assertEqual([reliability.num(v) for v in ("-", "?", "", "12", "1.5")], [None, None, None, 12, 1.5])


    def main(self, *args, **fakes):
        """reliability.main() with the parts' runs replaced by `fakes` (no root, no daemon)."""
        import reliability
        import signal
        self.addCleanup(signal.signal, signal.SIGTERM, signal.getsignal(signal.SIGTERM))
        with contextlib.ExitStack() as stack:
            for k, v in fakes.items():
                stack.enter_context(mock.patch.object(reliability, k, v))
            stack.enter_context(mock.patch.object(os, "geteuid", return_value=0))
            stack.enter_context(mock.patch.object(sys, "argv", ["reliability.py", *args, "--out", str(self.out)]))
            stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
            with self.assertRaises(SystemExit) as e:
                reliability.main()
        return e.exception.code

    def test_the_summary_names_this_run_and_its_seed(self):
        """The summary's "Measured:" line names the crash and fuzz runs that wrote it, not the ones
        before (the parts' manifest entries are recorded first); the crash and isolation runs draw
        a seed when none is given and record it."""
        old = {"commit": "0" * 40, "started": "2026-11-01T10:00:00Z", "kind": "measured"}
        put(self.out, "manifest.json", json.dumps({"schema": 1, "name": "reliability", "parts": {
            "crash": old, "fuzz": old, "isolation": old}}))
        seeds = []

        def crash(cycles, seed=None, log=print, restore_by="alternate"):
            seeds.append(seed)
            return [dict(r) for r in CRASH_ROWS]

        def fuzz(runs, out):
            table = "| target | toolchain, sanitizer | executions | exec/s | corpus | RSS at 10 s (MB) | peak RSS (MB) " \
                    "| seconds | result |\n|---|---|---|---|---|---|---|---|---|\n| t | s, none | 5 | 1 | 1 | - | 4 | 1 | ok |\n"
            (out / "fuzz.md").write_text("Fuzzed now.\n\n" + table)
            return table, True

        head = sh(REPO, "rev-parse", "HEAD")
        self.assertEqual(self.main("all", "--cycles", "2", "--runs", "5", crash=crash, fuzz=fuzz), 0)
        measured = re.search(r"Measured: (.*)\.", (self.out / "summary.md").read_text()).group(1)
        for part in ("fuzz", "crash"):
            self.assertRegex(measured, rf"{part} \d{{4}}-\d\d-\d\d at {head[:7]}")
        self.assertIn("isolation 2026-11-01 at 0000000", measured, "not run: the earlier run's")
        m = manifest.read(self.out)
        self.assertIsInstance(seeds[0], int, "a seed drawn")
        self.assertEqual(m["parts"]["crash"]["seeds"], {"seed": seeds[0]})
        self.assertIn(f"reliability.py all --cycles 2 --runs 5 --seed {seeds[0]}`", (self.out / "summary.md").read_text())
        self.assertEqual(self.main("crash", "--cycles", "2", "--seed", "7", crash=crash), 0)
        self.assertEqual((seeds[1], manifest.read(self.out)["parts"]["crash"]["seeds"]), (7, {"seed": 7}))
        self.assertIn("reliability.py crash --cycles 2 --seed 7`", (self.out / "summary.md").read_text())

        got = {}

        def isolation(seconds, rounds=200, seed=None, log=print):
            got["seed"] = seed
            return dict(quiet_p50_us=100.0, quiet_p99_us=200.0, quiet_max_us=300.0, flood_p50_us=110.0,
                        flood_p99_us=300.0, flood_max_us=400.0, victim_missed=0, victim_denied={}, rounds=50,
                        turn_bound_us=1000, differences=[])

        self.assertEqual(self.main("isolation", isolation=isolation, isolation_text=lambda r, s: "## Isolation\n"), 0)
        self.assertIsInstance(got["seed"], int, "a seed drawn")
        self.assertEqual(manifest.read(self.out)["parts"]["isolation"]["seeds"], {"seed": got["seed"]})
        # The summary rendered again (`reliability.py summary`) keeps the crash run's seed in its command.
        self.assertIn("reliability.py crash --cycles 2 --seed 7`", (self.out / "summary.md").read_text())


class Status(unittest.TestCase):
    """status() in a throw-away repository shaped like this one."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="cosched-status-")
        self.addCleanup(self.tmp.cleanup)
        self.repo = Path(self.tmp.name)
        sh(self.repo, "init", "-q")
        for path in ("crates/host/src/lib.rs", "Cargo.lock", "guest/run.sh", "bench/harness.py",
                     "bench/experiments/common.py", "bench/experiments/histogram.py", "bench/experiments/scale.py",
                     "docs/evaluation.md", "README.md", "results/histogram/data.csv", "results/scale/data.csv",
                     "results/startup/summary.md"):
            put(self.repo, path, "1\n")
        commit(self.repo, "the tree")
        for name, producer in (("histogram", "bench/experiments/histogram.py"), ("scale", "bench/experiments/scale.py")):
            manifest.write(self.repo / "results" / name, manifest.Run(self.repo, argv=["x"]), name=name,
                           producer=producer, quick=False, accel=("TCG", "test"))
        commit(self.repo, "the results")

    def status(self):
        return {r["name"]: r for r in manifest.status(self.repo)}

    def test_current_when_only_results_or_docs_change(self):
        put(self.repo, "docs/evaluation.md", "2\n")
        put(self.repo, "README.md", "2\n")
        put(self.repo, "results/histogram/data.csv", "2\n")
        commit(self.repo)
        put(self.repo, "docs/evaluation.md", "3\n")  # uncommitted, too
        st = self.status()
        self.assertEqual(st["histogram"]["verdict"], "current", st["histogram"])
        self.assertEqual(st["scale"]["verdict"], "current")
        self.assertIsNone(st["startup"]["manifest"])
        self.assertIn("no manifest", manifest.line(st["startup"]))
        self.assertRegex(manifest.line(st["histogram"]),
                         r"^histogram +[0-9a-f]{7} +\d{4}-\d\d-\d\d TCG +full +current \(measured at [0-9a-f]{7}, all since\)$")

    def test_stale_when_a_crate_changed(self):
        put(self.repo, "crates/host/src/lib.rs", "2\n")
        commit(self.repo)
        st = self.status()
        for name in ("histogram", "scale"):
            self.assertEqual(st[name]["verdict"], "stale")
            self.assertEqual(st[name]["groups"], {"crates": ["crates/host/src/lib.rs"]})
        self.assertIn("STALE: crates changed, 1 file", manifest.line(st["histogram"]))

    def test_rust_that_only_cargo_test_compiles_does_not_count(self):
        put(self.repo, "crates/host/src/lib.rs", "mod policy;\n#[cfg(test)]\nmod tests;\n")
        put(self.repo, "crates/host/src/policy.rs", "#[cfg(test)]\n#[path = \"x.rs\"]\nmod t;\n#[cfg(test)]\nmod tests;\n")
        commit(self.repo)
        manifest.write(self.repo / "results" / "scale", manifest.Run(self.repo, argv=["x"]), name="scale",
                       producer="bench/experiments/scale.py", quick=False, accel=("TCG", "test"))
        commit(self.repo, "measured")
        put(self.repo, "crates/cli/tests/root.rs", "2\n")  # an integration test
        put(self.repo, "crates/host/src/tests.rs", "2\n")  # #[cfg(test)] mod tests; in lib.rs
        put(self.repo, "crates/host/src/policy/tests.rs", "2\n")  # ... in policy.rs
        commit(self.repo)
        self.assertEqual(self.status()["scale"]["verdict"], "current", self.status()["scale"])
        put(self.repo, "crates/host/src/policy/t.rs", "3\n")  # `#[path] mod t;` is not recognised: it counts
        put(self.repo, "crates/host/src/policy.rs",
            "#[cfg(test)]\n#[path = \"x.rs\"]\nmod t;\n#[cfg(test)]\nmod tests;\nfn f() {}\n")
        commit(self.repo)
        self.assertEqual(self.status()["scale"]["groups"],
                         {"crates": ["crates/host/src/policy.rs", "crates/host/src/policy/t.rs"]})

    def test_groups_and_own_code(self):
        put(self.repo, "guest/run.sh", "2\n")  # scale boots no guest
        put(self.repo, "bench/experiments/histogram.py", "2\n")
        commit(self.repo)
        put(self.repo, "bench/experiments/common.py", "2\n")  # uncommitted
        put(self.repo, "crates/host/src/new.rs", "new\n")  # untracked
        st = self.status()
        self.assertEqual(st["histogram"]["groups"], {
            "crates": ["crates/host/src/new.rs"], "guest": ["guest/run.sh"],
            "harness": ["bench/experiments/common.py"], "own": ["bench/experiments/histogram.py"]})
        self.assertEqual(st["scale"]["groups"], {"crates": ["crates/host/src/new.rs"],
                                                  "harness": ["bench/experiments/common.py"]})
        self.assertIn("STALE: crates, guest, harness, own changed, 4 files", manifest.line(st["histogram"]))

    def test_dirty_run(self):
        put(self.repo, "bench/harness.py", "dirty\n")
        put(self.repo, "results/histogram/data.csv", "new rows\n")
        run = manifest.Run(self.repo)
        self.assertEqual(run.dirty_paths, ["bench/harness.py"], "results/ does not count")
        m = manifest.write(self.repo / "results/scale", run, name="scale", producer="p", quick=False)
        self.assertIs(m["dirty"], True)
        sh(self.repo, "checkout", "--", "bench/harness.py", "results/histogram/data.csv")
        self.assertEqual(manifest.Run(self.repo).dirty_paths, [])

    def measure(self, name="histogram", producer="bench/experiments/histogram.py"):
        """A run of results/<name> now (with the tree as it is), its manifest committed."""
        m = manifest.write(self.repo / "results" / name, manifest.Run(self.repo, argv=["x"]), name=name,
                           producer=producer, quick=False, accel=("TCG", "test"))
        sh(self.repo, "add", "results")
        sh(self.repo, "commit", "-q", "-m", "measured")
        return m

    def test_a_run_with_uncommitted_changes_to_its_code_is_unknown(self):
        put(self.repo, "bench/harness.py", "dirty\n")
        put(self.repo, "crates/host/src/new.rs", "untracked\n")
        m = self.measure()
        self.assertEqual(m["dirty_paths"], ["bench/harness.py", "crates/host/src/new.rs"],
                         "untracked files too: status counts them")
        sh(self.repo, "checkout", "--", "bench/harness.py")
        (self.repo / "crates/host/src/new.rs").unlink()
        r = self.status()["histogram"]
        self.assertEqual(r["verdict"], "unknown", "what it measured is in no commit")
        self.assertIn("UNKNOWN: measured with uncommitted changes to bench/harness.py, crates/host/src/new.rs",
                      manifest.line(r))
        # Changes that no result runs (docs, results, tests) do not matter.
        put(self.repo, "docs/evaluation.md", "dirty\n")
        put(self.repo, "bench/tests/test_new.py", "untracked\n")
        m = self.measure()
        self.assertEqual(m["dirty_paths"], ["bench/tests/test_new.py", "docs/evaluation.md"])
        r = self.status()["histogram"]
        self.assertEqual(r["verdict"], "current")
        self.assertIn("[measured with uncommitted changes outside its code]", manifest.line(r))
        # scale does not run the guest: a dirty guest does not matter to it, it does to histogram.
        put(self.repo, "guest/run.sh", "dirty\n")
        self.measure("scale", "bench/experiments/scale.py")
        self.measure()
        sh(self.repo, "checkout", "--", "guest/run.sh")
        st = self.status()
        self.assertEqual((st["scale"]["verdict"], st["histogram"]["verdict"]), ("current", "unknown"))
        # A recovered manifest that says dirty but not which files.
        m = manifest.read(self.repo / "results/scale")
        m.update(dirty=True, dirty_paths=None)
        put(self.repo, "results/scale/manifest.json", json.dumps(m))
        self.assertIn("which files is not recorded", manifest.line(self.status()["scale"]))

    def render(self, name="histogram", producer="bench/experiments/histogram.py", **kw):
        """results/<name> rendered again from its stored rows now (main(..., rows=...)), committed."""
        m = manifest.write(self.repo / "results" / name, manifest.Run(self.repo, argv=["render"]), name=name,
                           producer=producer, quick=False, rendered=True, **kw)
        sh(self.repo, "add", "results")
        sh(self.repo, "commit", "-q", "-m", "rendered again")
        return m

    def test_a_rendering_vouches_for_its_scripts_only(self):
        measured = manifest.read(self.repo / "results/histogram")["commit"]
        # The summary's code changes after the measurement (the experiment's module, common.py).
        put(self.repo, "bench/experiments/histogram.py", "summary code\n")
        put(self.repo, "bench/experiments/common.py", "summary code\n")
        commit(self.repo)
        r = self.status()["histogram"]
        self.assertEqual(r["groups"], {"harness": ["bench/experiments/common.py"],
                                       "own": ["bench/experiments/histogram.py"]}, "a measured manifest: all since M")
        self.assertIn("(measured at %s, all since)" % measured[:7], manifest.line(r))
        # Rendered again: those changes were rendering only; nothing measured changed.
        rendered = self.render()["rendered_commit"]
        r = self.status()["histogram"]
        self.assertEqual((r["verdict"], r["rule"]), ("current", "rendered"), r)
        self.assertTrue(manifest.line(r).endswith(
            f"current (measured at {measured[:7]}, rendered at {rendered[:7]}: histogram.py, common.py since "
            f"{rendered[:7]})"), manifest.line(r))
        # After the rendering, its scripts count again; the crates, guest and harness.py count since M.
        put(self.repo, "bench/experiments/common.py", "changed after the rendering\n")
        commit(self.repo)
        self.assertEqual(self.status()["histogram"]["groups"], {"harness": ["bench/experiments/common.py"]})
        put(self.repo, "bench/experiments/common.py", "summary code\n")
        put(self.repo, "bench/harness.py", "measuring code\n")
        put(self.repo, "guest/run.sh", "measuring code\n")
        commit(self.repo)
        rendered = self.render()["rendered_commit"]
        r = self.status()["histogram"]
        self.assertEqual(r["groups"], {"guest": ["guest/run.sh"], "harness": ["bench/harness.py"]},
                         "a rendering does not vouch for what it does not run")
        self.assertIn(f"STALE: guest, harness changed, 2 files (measured at {measured[:7]}, rendered at "
                      f"{rendered[:7]}", manifest.line(r))

    def test_a_rendering_with_uncommitted_changes_to_its_scripts(self):
        put(self.repo, "bench/experiments/histogram.py", "uncommitted summary code\n")
        put(self.repo, "docs/evaluation.md", "uncommitted\n")
        m = self.render()
        self.assertEqual(m["rendered_dirty_paths"], ["bench/experiments/histogram.py", "docs/evaluation.md"])
        sh(self.repo, "checkout", "--", "bench/experiments/histogram.py")
        r = self.status()["histogram"]
        self.assertEqual(r["verdict"], "unknown")
        self.assertIn("UNKNOWN: rendered with uncommitted changes to bench/experiments/histogram.py", manifest.line(r))
        self.render()  # docs only: no matter
        self.assertEqual(self.status()["histogram"]["verdict"], "current")

    def test_a_parts_manifest_rendered_again(self):
        """reliability.py summary renders every part again: the parts' script (bench/reliability.py)
        is judged since the rendering; fuzz.sh and the fuzz targets, which only measure, since each
        part's commit."""
        for path in ("bench/reliability.py", "bench/fuzz.sh", "fuzz/targets.rs"):
            put(self.repo, path, "1\n")
        commit(self.repo)
        for part in ("crash", "fuzz"):
            manifest.write(self.repo / "results/reliability", manifest.Run(self.repo), name="reliability",
                           producer="bench/reliability.py", quick=False, part=part)
        commit(self.repo)
        put(self.repo, "bench/reliability.py", "summary code\n")
        put(self.repo, "fuzz/targets.rs", "2\n")
        commit(self.repo)
        self.render("reliability", "bench/reliability.py")
        r = self.status()["reliability"]
        self.assertEqual(r["groups"], {"own": ["fuzz/targets.rs"]})
        self.assertIn("reliability.py since", manifest.line(r))
        self.assertEqual(manifest.scripts("reliability"), ["bench/reliability.py"])
        self.assertEqual(manifest.scripts("environments"), ["bench/environments.py"])
        self.assertEqual(manifest.scripts("histogram"),
                         ["bench/experiments/histogram.py", "bench/experiments/common.py"])

    def test_a_resumed_run_is_judged_from_its_oldest_commit(self):
        old = sh(self.repo, "rev-parse", "HEAD")
        put(self.repo, "crates/host/src/lib.rs", "2\n")
        new = commit(self.repo)
        d = self.repo / "results/histogram"
        m = manifest.write(d, manifest.Run(self.repo), name="histogram", producer="bench/experiments/histogram.py",
                           quick=False, sessions=[(old, []), (new, [])])
        self.assertEqual((m["commits"], m["commit"], m["dirty"]), ([old, new], old, False))
        commit(self.repo)
        r = self.status()["histogram"]
        self.assertEqual(r["groups"], {"crates": ["crates/host/src/lib.rs"]}, "the points measured at the old commit")
        self.assertIn(f"(measured at {old[:7]}, {new[:7]}, all since {old[:7]})", manifest.line(r))
        # Points that recorded no commit (points.jsonl lines of before): unknown, never current.
        manifest.write(d, manifest.Run(self.repo), name="histogram", producer="bench/experiments/histogram.py",
                       quick=False, sessions=[(None, None)])
        commit(self.repo)
        r = self.status()["histogram"]
        self.assertEqual(r["verdict"], "unknown")
        self.assertIn("points resumed from an earlier session at an unknown commit", manifest.line(r))
        self.assertIsNone(r["entry"]["dirty"], "the earlier session's tree is unknown")

    def test_recovered_manifest_without_a_commit(self):
        data = sh(self.repo, "rev-parse", "HEAD")
        put(self.repo, "results/startup/manifest.json", json.dumps({
            "source": "recovered from git history", "name": "startup", "commit": None, "data_commit": data,
            "date": "2026-11-21", "accel": None, "quick": False}))
        st = self.status()
        self.assertEqual(st["startup"]["verdict"], "unknown", "no measured commit: never current")
        self.assertIn("~" + data[:7], manifest.line(st["startup"]))
        put(self.repo, "crates/host/src/lib.rs", "2\n")
        commit(self.repo)
        self.assertEqual(self.status()["startup"]["verdict"], "stale")

    def test_unknown_commit(self):
        m = manifest.read(self.repo / "results/histogram")
        m["commit"] = "f" * 40
        put(self.repo, "results/histogram/manifest.json", json.dumps(m))
        r = self.status()["histogram"]
        self.assertEqual(r["verdict"], "unknown")
        self.assertIn("not in this repository", manifest.line(r))


class Backfill(unittest.TestCase):
    """What bench/backfill_manifests.py reads from a summary: what it states, and nothing else."""

    def test_experiment_summary(self):
        import backfill_manifests as bf
        s = bf.stated("# T\n\nCommand: `sudo /usr/bin/python3 bench/experiment.py scale` (full run, took 2.5 min on "
                      "2026-11-28).\n\nbody, committed at 5a48982 2026-11-21\n\n"
                      "Our setup: this host has no counters.\n\n"
                      "Our setup: 2 x86 cores (x86_64, Linux 6.18.44-fc-v657, a shared VM), a 1-vCPU TCG guest running "
                      "Debian's Linux 6.1, QEMU 7.2 (accelerator: KVM cannot run the test guest: exited 134; a guest "
                      "without a disk starts from a snapshot); the papers used Linux 3.17.\n")
        self.assertEqual(s, {"command": "sudo /usr/bin/python3 bench/experiment.py scale", "date": "2026-11-28",
                             "commit": None, "dirty": None, "kernel": "6.18.44-fc-v657",
                             "accel": {"name": "TCG", "reason": "KVM cannot run the test guest: exited 134"},
                             "cpus": 2, "quick": False, "seeds": None})

    def test_script_summaries(self):
        import backfill_manifests as bf
        s = bf.stated("Command: `sudo /usr/bin/python3 bench/boot_vs_snapshot.py --rounds 8` (commit e0f38b8-dirty, "
                      "2026-11-28; accelerator: TCG (KVM cannot run it (cached)); 2 CPUs, Linux 6.18.44-fc-v657).\n")
        self.assertEqual((s["commit"], s["dirty"], s["accel"], s["cpus"]),
                         ("e0f38b8", True, {"name": "TCG", "reason": "KVM cannot run it"}, 2))
        s = bf.stated("Command: `sudo /usr/bin/python3 bench/reliability.py soak --minutes 60 --seed 28` (2026-11-25)\n")
        self.assertEqual((s["seeds"], s["kernel"], s["accel"], s["commit"]), ({"seed": 28}, None, None, None))
        self.assertEqual(set(bf.stated("no command here").values()), {None})


class BackfillHistory(unittest.TestCase):
    """bench/backfill_manifests.py on a throw-away repository's history: the data commit is the last
    one that changed the data, not the manifest nor a rendering; no measured commit is read from a
    rendering commit's message; --force leaves a rendered manifest and a run's alone."""

    def setUp(self):
        import backfill_manifests as bf
        self.bf = bf
        self.tmp = tempfile.TemporaryDirectory(prefix="cosched-backfill-")
        self.addCleanup(self.tmp.cleanup)
        self.repo = Path(self.tmp.name).resolve()
        sh(self.repo, "init", "-q")
        for k, v in (("REPO", self.repo), ("RESULTS", self.repo / "results")):
            patch = mock.patch.object(bf, k, v)
            patch.start()
            self.addCleanup(patch.stop)
        self.dir = self.repo / "results/io-startup"
        put(self.repo, "bench/experiments/io_startup.py", "1\n")
        self.code = commit(self.repo, "the code")
        put(self.dir, "data.csv", "a\n1\n")
        put(self.dir, "summary.md", "# io\n\nCommand: `sudo /usr/bin/python3 bench/experiment.py io-startup` (full run, "
                                    "took 39 min on 2026-11-23).\n")
        put(self.dir, "plot.png", "png")
        self.measured = commit(self.repo, "io-startup full run (39 min): the figures")
        put(self.dir, "manifest.json", json.dumps(bf.recover(self.dir)))
        commit(self.repo, "Recovered manifests for every result")
        put(self.repo, "bench/experiments/io_startup.py", "2\n")
        self.render_code = commit(self.repo, "io_startup.py: the summary's targets table")
        # The rendering rewrites the summary, the plot and the manifest (not the data), and its
        # message names the code that rendered.
        put(self.dir, "summary.md", "# io again\n\nCommand: `sudo /usr/bin/python3 bench/experiment.py io-startup` (full "
                                    "run, took 39 min on 2026-11-23; this summary rendered again on 2026-12-01).\n")
        put(self.dir, "plot.png", "png 2")
        m = json.loads((self.dir / "manifest.json").read_text())
        m.update(kind="rendered", rendered_commit=self.render_code)
        put(self.dir, "manifest.json", json.dumps(m))
        commit(self.repo, f"results: io-startup rendered again from its committed data at {self.render_code[:7]} "
                          "(no measurement)")

    def test_the_data_commit_is_the_measurement(self):
        m = self.bf.recover(self.dir)
        self.assertEqual(m["data_commit"], self.measured)
        self.assertIsNone(m["commit"], "no measured commit stated")
        self.assertIsNone(m["data_moved_from_commit"])
        # A rendering that rewrote data.csv too (a relabelling, its plot re-rendered) measured nothing either.
        put(self.dir, "data.csv", "a\n1.0\n")
        commit(self.repo, f"io-startup: the column relabelled at {self.render_code[:7]}, plot re-rendered from data.csv")
        m = self.bf.recover(self.dir)
        self.assertEqual((m["data_commit"], m["commit"], m["data_moved_from_commit"]), (self.measured, None, None))
        # A measurement's message that states its commit still gives it.
        put(self.dir, "data.csv", "a\n2\n")
        new = commit(self.repo, f"results/io-startup: full run at {self.code[:7]}")
        m = self.bf.recover(self.dir)
        self.assertEqual((m["data_commit"], m["commit"]), (new, self.code))

    def main(self, *args):
        with mock.patch.object(sys, "argv", ["backfill_manifests.py", *args]), \
                contextlib.redirect_stdout(io.StringIO()) as out:
            self.bf.main()
        return out.getvalue()

    def test_force_keeps_a_rendering_and_a_run(self):
        before = (self.dir / "manifest.json").read_text()
        out = self.main("--force", str(self.dir))
        self.assertIn("kind rendered", out)
        self.assertEqual((self.dir / "manifest.json").read_text(), before)
        for m in ({"source": "written by the run", "kind": "measured", "commit": self.code},
                  {"name": "reliability", "parts": {"crash": {"source": "written by the run", "kind": "measured"}}}):
            put(self.dir, "manifest.json", json.dumps(m))
            self.assertIn("left as it is", self.main("--force", str(self.dir)))
            self.assertEqual(json.loads((self.dir / "manifest.json").read_text()), m)
        # A recovered, measured manifest: replaced with --force only.
        put(self.dir, "manifest.json", json.dumps({"source": "recovered from git history", "kind": "measured"}))
        self.assertIn("left as it is", self.main(str(self.dir)))
        self.assertIn("data " + self.measured[:7], self.main("--force", str(self.dir)))
        self.assertEqual(manifest.read(self.dir)["data_commit"], self.measured)


class Cli(unittest.TestCase):
    def test_every_result_has_a_producer(self):
        from experiment import EXPERIMENTS
        names = set(EXPERIMENTS) | {p.name for p in (REPO / "results").iterdir() if p.is_dir()}
        self.assertEqual(sorted(names - set(manifest.PRODUCERS)), [])
        for name, (own, groups) in manifest.PRODUCERS.items():
            for path in own:
                self.assertTrue((REPO / path).exists(), f"{name}: {path}")

    def test_environments_own_the_packaging_script(self):
        """The environments' test builds the packages with harness.build_packages(): the script that
        it runs (scripts/package.sh) is the result's own code."""
        import inspect
        import harness
        self.assertIn("harness.build_packages()", (REPO / "bench/tests/test_environments.py").read_text())
        scripts = set(re.findall(r"scripts/[\w.-]+\.sh", inspect.getsource(harness.build_packages)))
        self.assertEqual(scripts, {"scripts/package.sh"})
        self.assertLessEqual(scripts, set(manifest.PRODUCERS["environments"][0]))

    def test_status_needs_no_root(self):
        import experiment
        with mock.patch.object(os, "geteuid", return_value=1000), \
                mock.patch.object(sys, "argv", ["experiment.py", "status"]), \
                contextlib.redirect_stdout(io.StringIO()) as out:
            self.assertEqual(experiment.main(), 0)
        self.assertIn("results current", out.getvalue())
        with mock.patch.object(os, "geteuid", return_value=1000), \
                mock.patch.object(sys, "argv", ["experiment.py", "histogram", "--quick"]), \
                self.assertRaisesRegex(SystemExit, "must run as root"):
            experiment.main()

    def test_status_command(self):
        """`experiment.py status` prints one line per result; --check says whether all are current (its
        exit status matches the count; which it is depends on this repository's results)."""
        r = subprocess.run([sys.executable, str(BENCH / "experiment.py"), "status"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        names = sorted(p.name for p in (REPO / "results").iterdir() if p.is_dir())
        lines = r.stdout.splitlines()
        self.assertEqual([ln.split()[0] for ln in lines[:-1]], names)
        self.assertRegex(lines[-1], r"^\d+ of \d+ results current$")
        r = subprocess.run([sys.executable, str(BENCH / "experiment.py"), "status", "--check"],
                           capture_output=True, text=True)
        self.assertIn(r.returncode, (0, 1))
        self.assertEqual(r.returncode == 0, lines[-1].split()[0] == lines[-1].split()[2])
        r = subprocess.run([sys.executable, str(BENCH / "experiment.py"), "histogram", "--check"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2, "--check is for status only")


if __name__ == "__main__":
    unittest.main()


class TargetsTable(unittest.TestCase):
    """A summary's targets table (common.targets_md) reads back as the rows it was written from:
    bench/evaluation.py collects them into docs/evaluation.md."""

    def test_round_trip(self):
        from evaluation import parse_targets
        from experiments.common import target, targets_md
        rows = [target("a ≤ 1.2× b", "1.26× (152 | 121 µs)", False, "1.89/1.10/0.93"),
                target("a bound", "1.09×", None), target("c", "3", True)]
        text = "# Title\n\nCommand: ...\n\n" + targets_md(rows) + "\n\nThe body.\n"
        self.assertEqual(parse_targets(text), rows)
        self.assertIn("**missed**", text)
        self.assertEqual(parse_targets("# no table\n"), [])
