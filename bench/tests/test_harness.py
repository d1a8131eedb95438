"""Tests of the harness's parsing and arithmetic (no guest; one root test of a real cgroup)."""

import os
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cosched_bench as cb  # noqa: E402
import harness  # noqa: E402

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


class FeasParsing(unittest.TestCase):
    def test_ping_output(self):
        out = "\n".join(["PING 10.77.4.2 (10.77.4.2): 56 data bytes",
                         "64 bytes from 10.77.4.2: seq=0 ttl=64 time=9.851 ms",
                         "64 bytes from 10.77.4.2: icmp_seq=1 ttl=64 time=0.4 ms",
                         "--- 10.77.4.2 ping statistics ---",
                         "round-trip min/avg/max = 0.400/5.125/9.851 ms"])
        self.assertEqual(harness.parse_ping(out), [9851.0, 400.0])

    def test_s_n_is_seed_001s_formula(self):
        from experiments.feas import Throughput
        # 2 VMs, 1024 KiB each, first start at 10.0, last finish at 12.0: 2 * 1024 / 2 s.
        self.assertEqual(Throughput.s_n({4: (10.0, 11.0), 3: (10.5, 12.0)}, 1024), (1024.0, 2.0))

    def test_event_counters_flatten_the_event_resource(self):
        from experiments.feas import counter_delta, event_counters
        st = {"vms": [{"name": "cosfeas4", "resources": {"event": {"level": "normal", "boosted_for_ms": 0,
                                                                  "counters": {"boosts": 5, "boosted_ns": 10,
                                                                               "events": 9}}}},
                      {"name": "other", "resources": {"cpu": {}}}]}
        ev = event_counters(st)
        self.assertEqual(ev, {"cosfeas4": {"boosted_for_ms": 0, "boosts": 5, "boosted_ns": 10, "events": 9}})
        later = {"cosfeas4": {"boosts": 7, "boosted_ns": 30, "events": 9, "boosted_for_ms": 0}}
        self.assertEqual(counter_delta(ev, later, "cosfeas4"),
                         {"boosts": 2, "boosted_ns": 20, "events": 0, "boosted_for_ms": 0})

    def test_event_counters_carry_the_run_delay_by_level(self):
        from experiments.feas import counter_delta, event_counters, run_delay_us
        st = {"vms": [{"name": "cosfeas4", "resources": {"event": {"counters": {}}},
                       "run_delay": {"event-boosted": {"count": 2, "sum_ns": 3000, "counts": []},
                                     "normal": {"count": 1, "sum_ns": 5000, "counts": []}}}]}
        later = {"vms": [{"name": "cosfeas4", "resources": {"event": {"counters": {}}},
                          "run_delay": {"event-boosted": {"count": 4, "sum_ns": 7000, "counts": []},
                                        "normal": {"count": 1, "sum_ns": 5000, "counts": []}}}]}
        ev = counter_delta(event_counters(st), event_counters(later), "cosfeas4")
        self.assertEqual(run_delay_us(ev, "event-boosted"), 2.0)  # (7000 - 3000) ns / 2 waits
        self.assertEqual(run_delay_us(ev, "normal"), "")  # no wait ended at normal meanwhile
        self.assertEqual(run_delay_us({}, "static"), "")

    def test_a_mode_s_event_keys_replace_the_base_config_s(self):
        from experiments.feas import FLOOR_MODE, feas_config
        import tomllib
        conf = tomllib.loads(feas_config(FLOOR_MODE[1]))["event"]
        self.assertEqual((conf["n_limit"], conf["charge"], conf["boost_running"], conf["cycle_ms"]),
                         (1000, False, True, 10))
        self.assertEqual(tomllib.loads(feas_config(""))["event"]["n_limit"], 1)

    def test_fair_share_says_why_without_a_v1_cpu_controller(self):
        from experiments.feas import fair_share
        with tempfile.TemporaryDirectory() as root:
            with fair_share([os.getpid()], 0.25, root=root) as why:
                self.assertIn("no cgroup v1 cpu controller", why)
            self.assertEqual(os.listdir(root), [], "nothing was created")

    def test_fair_share_holds_a_thread_and_puts_it_back(self):
        """Root, the real cgroup v1 cpu controller: a thread of this test moves into a group with
        the quota, and back into its own group afterwards; the group is removed."""
        import threading
        from experiments.feas import fair_share
        harness.need_root(self)
        root = "/sys/fs/cgroup/cpu"
        if not os.path.exists(os.path.join(root, "cpu.cfs_quota_us")):
            self.skipTest(f"no cgroup v1 cpu controller with bandwidth control at {root} on this host")

        def cpu_group(tid):
            with open(f"/proc/{tid}/cgroup") as f:
                return next(line.split(":", 2)[2].strip() for line in f if "cpu" in line.split(":")[1].split(","))
        stop, ready = threading.Event(), threading.Event()
        tids = []

        def sleeper():
            tids.append(threading.get_native_id())
            ready.set()
            stop.wait(30)
        t = threading.Thread(target=sleeper)
        t.start()
        try:
            ready.wait(10)
            tid = tids[0]
            home = cpu_group(tid)
            with fair_share([tid], 0.25, period_us=4000) as why:
                self.assertIsNone(why)
                group = cpu_group(tid)
                self.assertTrue(group.startswith("/cosched-bench-fair-"), group)
                with open(os.path.join(root, group.lstrip("/"), "cpu.cfs_quota_us")) as f:
                    self.assertEqual(f.read().strip(), "1000")
            self.assertEqual(cpu_group(tid), home)
            self.assertFalse(os.path.exists(os.path.join(root, group.lstrip("/"))), "the group is removed")
        finally:
            stop.set()
            t.join()


class MembwReal(unittest.TestCase):
    """The membw experiment's --real mode, which this host cannot run: its figures from samples
    shaped as the daemon's status (the VM test checks the parser on a real status)."""

    def test_figures_split_rt_streaming_from_idle(self):
        from experiments import membw
        rows = []
        for t, rt, hog1 in [(0.1, 700, 200), (0.2, 660, 210), (0.3, 0, 900), (0.4, 0, 950)]:
            st = {"vms": [{"name": n, "membw": {"last_period_mbps": v, "guarantee_mbps": g, "throttled": n == "hog1",
                                                "stats": {"throttles": 3}}}
                          for n, v, g in [("rt", rt, 700), ("hog1", hog1, 200), ("hog2", 50, 0)]]
                  + [{"name": "other", "membw": None}]}
            rows += membw.real_samples(st, "reclaim", t)
        self.assertEqual(len(rows), 12)
        f = membw.real_figures(rows, True, 1000)
        self.assertEqual((f["rt_mbps"], f["rt_pct"], f["hog1_mbps"], f["hog1_idle_mbps"], f["hog2_mbps"]),
                         (680.0, 97.1, 205.0, 925.0, 50.0))
        self.assertEqual(membw.real_figures(rows, False, 1000)["rt_pct"], "", "no guarantee unregulated")

    def test_config_declares_the_shares_and_an_unreachable_bandwidth_unregulated(self):
        from experiments import membw
        self.assertIn("guaranteed_mbps = 5000\n", membw.real_config(5000, True))
        self.assertIn("guaranteed_mbps = 1000000000\n", membw.real_config(5000, False))
        self.assertIn("[vm.rt]\nmembw_share = 700\n", membw.real_config(5000, True))
        self.assertIn('backend = "pmu"', membw.real_config(5000, True))


if __name__ == "__main__":
    unittest.main()


class AgentStart(unittest.TestCase):
    """The guest's agent start, run by the host's sh with a stand-in `cosched` on PATH."""

    def test_a_previous_agents_log_is_never_read_as_this_ones(self):
        with tempfile.TemporaryDirectory(prefix="cosched-agentstart-") as tmp:
            stub = Path(tmp) / "cosched"
            # Attaches 0.5 s after it starts, then stays up until stopped.
            stub.write_text("#!/bin/sh\nsleep 0.5\necho 'detectors attached: cpu' >&2\nexec sleep 30\n")
            stub.chmod(0o755)
            log = Path(tmp) / "agent.log"
            log.write_text("detectors attached: cpu\n")  # what the agent before it wrote
            script = (harness.agent_start("--x").replace(harness.AGENT_LOG, str(log)) + "echo WAITED\n"
                      + harness.agent_stop("m").replace(harness.AGENT_LOG, str(log)))
            t0 = time.monotonic()
            out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=20,
                                 env={**os.environ, "PATH": f"{tmp}:{os.environ['PATH']}"})
            took = time.monotonic() - t0
            self.assertEqual(out.returncode, 0, out)
            self.assertGreaterEqual(took, 0.5, "waited for this agent's own line")
            self.assertEqual(out.stdout.splitlines(), ["WAITED", "COSCHED-AGENT: m: detectors attached: cpu"], out)

    def test_an_agent_that_exits_ends_the_wait(self):
        with tempfile.TemporaryDirectory(prefix="cosched-agentstart-") as tmp:
            stub = Path(tmp) / "cosched"
            stub.write_text("#!/bin/sh\necho 'error: no BPF here' >&2\nexit 1\n")
            stub.chmod(0o755)
            log = Path(tmp) / "agent.log"
            script = harness.agent_start().replace(harness.AGENT_LOG, str(log)) + "echo WAITED\n"
            t0 = time.monotonic()
            out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=40,
                                 env={**os.environ, "PATH": f"{tmp}:{os.environ['PATH']}"})
            self.assertLess(time.monotonic() - t0, 10, "not the 30 s bound")
            self.assertEqual(out.stdout.strip(), "WAITED", out)
