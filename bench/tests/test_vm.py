"""VM tests: boot the test guest (KVM or TCG) with the real agent inside and the real daemon on
the host, under host load. Needs root and a built tree (`cargo build --release`,
`guest/build.sh`). Without root these tests are skipped, unless COSCHED_REQUIRE_ROOT=1 (set by
the project's test command and CI), which makes that a failure."""

import os
import re
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cosched_bench as cb  # noqa: E402
import harness  # noqa: E402


def setUpModule():
    harness.print_accel(__file__)

BENCH = Path(__file__).resolve().parents[1]

SCHED_DEADLINE = 6


def userspace_rt_threads():
    """(pid, tid, comm) of every thread of a user-space process at a real-time policy."""
    out = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            os.readlink(f"/proc/{pid}/exe")  # kernel threads have no exe
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                # The kernel ORs SCHED_RESET_ON_FORK into the policy, and every thread cosched
                # boosts carries it.
                pol = os.sched_getscheduler(int(tid)) & ~os.SCHED_RESET_ON_FORK
                comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            except OSError:
                continue
            if pol in (os.SCHED_FIFO, os.SCHED_RR, SCHED_DEADLINE):
                out.add((int(pid), int(tid), comm))
    return out


def need_root(test):
    harness.need_root(test)
    for f in (cb.COSCHED, cb.RUN_SH):
        if not Path(f).exists():
            raise AssertionError(f"{f} missing: build first (README)")


# A boost held this long is the real-time task's, not one of the new-task (watch list) boosts the
# guest's shell, `sleep` and cyclictest's own start-up cause: those last a few ms each (under TCG
# they come and go ~10 times in the 0.2-0.5 s cyclictest takes to start its real-time thread).
SETTLED_BOOST_MS = 50


def vm_status(daemon):
    """The daemon's status of its only VM, or None, with its CPU resource's state (level,
    enabled, boosted_for_ms, boost counters: `resources.cpu`) merged into the VM's entry."""
    st = daemon.status()
    if not st or not st["vms"]:
        return None
    vm = st["vms"][0]
    cpu = vm["resources"]["cpu"]
    flat = {**vm, **{k: v for k, v in cpu.items() if k != "counters"}}
    flat["counters"] = {**vm["counters"], **cpu["counters"],
                        "denied": {**vm["counters"].get("denied", {}), **cpu["counters"].get("denied", {})}}
    return flat


def wait_for_vm(daemon, pred, timeout=5.0):
    """Polls the daemon's status until pred(vm) holds: returns (vm, True), or (the last status,
    False) after `timeout` seconds. A state the guest reaches "some time after" a console line
    must be waited for, not sampled at that line."""
    deadline = time.monotonic() + timeout
    while True:
        vm = vm_status(daemon)
        if vm is not None and pred(vm):
            return vm, True
        if time.monotonic() >= deadline:
            return vm, False
        time.sleep(0.02)


def settled_boost(vm):
    return vm["level"] == "boosted" and vm["boosted_for_ms"] >= SETTLED_BOOST_MS


def agent_log(console):
    return "\n".join(l for l in console.splitlines() if l.startswith("COSCHED-AGENT: "))


class RtThreadProbe(unittest.TestCase):
    def test_sees_a_boosted_thread_with_reset_on_fork(self):
        """The leftover check must see exactly what cosched sets: SCHED_RR|RESET_ON_FORK."""
        need_root(self)
        import threading
        ready, done = threading.Event(), threading.Event()
        tid = []

        def body():
            tid.append(threading.get_native_id())
            os.sched_setscheduler(0, os.SCHED_RR | os.SCHED_RESET_ON_FORK, os.sched_param(1))
            ready.set()
            done.wait()
        t = threading.Thread(target=body)
        t.start()
        ready.wait()
        try:
            self.assertIn(tid[0], {x[1] for x in userspace_rt_threads()})
        finally:
            done.set()
            t.join()


class WatchList(unittest.TestCase):
    """The new-task heuristic in the real guest (SCHED_OTHER tasks): an interactive task stays on
    the watch list for as long as it keeps sleeping, a CPU-bound one drops off. Judged by how
    much of the measured window the host kept the VM boosted (idle host: fast, and the boost is
    what is observed, not its effect).

    One boot serves every test here (a boot costs more than most of these windows): the guest
    runs one agent per mode in turn, each with a fresh guest CPU hog started once it is attached
    (a newcomer, as in a boot of its own), and measures that mode's windows under it; stopping
    an agent deregisters the VM (the host restores it) before the next one registers."""

    # The old count mode (8 boosted switch-ins, one more per wake-up).
    COUNT = "--watch-budget-ms 0"
    # Budget mode with a smaller budget: 200 ms of a new task's own run time.
    BUDGET = "--watch-budget-ms 200"
    # Python importing 7 standard modules, as in the start-up experiment.
    APP = f"python3 -c \"{harness.STARTUP_IMPORTS}; print('ready')"
    # The agent's default new-task budget (s of run time), as packaging/guest.toml gives it.
    DEFAULT_BUDGET_S = harness.packaged_default("guest", None, "watch_budget_ms") / 1000
    # The default-cpu-bound window (s): long enough to see the newcomer released (it is boosted for
    # at most its budget of run time and as much of waiting, and starts in under a second).
    CPU_BOUND_S = int(4 + 4 * DEFAULT_BUDGET_S)
    # (agent mode: its arguments and its windows, (name, script) each, in order)
    MODES = {
        "count": (COUNT, [
            ("count-sleeping", "cyclictest -i 1000 -l 12000 -q >/dev/null"),
            ("count-cpu-bound", "timeout 4 sh -c 'while :; do :; done'"),
        ]),
        "budget": (BUDGET, [
            ("budget-sleeping", "cyclictest -i 1000 -l 6000 -q >/dev/null"),
            ("budget-cpu-bound", "timeout 4 sh -c 'while :; do :; done'"),
            ("budget-newcomers", "for i in 1 2 3 4; do timeout 1 sh -c 'while :; do :; done'; done"),
        ]),
        # The default, budget mode: 2 launches to warm the page cache, then 10 measured; then the
        # program turned CPU-bound for CPU_BOUND_S.
        "default": ("", [
            ("default-start-ups", f"cosched-tools launch 2 {APP}\" >/dev/null\n"
                                  f"echo COSCHED-MEASURE-START default-start-ups\n"
                                  f"cosched-tools launch 10 {APP}\""),
            ("default-cpu-bound", f"timeout {CPU_BOUND_S} {APP}; exec('while 1: pass')\""),
        ]),
    }
    boot = None

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            return  # each test says so (need_root)
        body = ""
        for mode, (args, windows) in cls.MODES.items():
            body += harness.agent_start(f"{args} --stats-interval-s 1000") + """(while :; do :; done) &
HOG=$!
"""
            for name, script in windows:
                start = "" if f"COSCHED-MEASURE-START {name}" in script else f"echo COSCHED-MEASURE-START {name}\n"
                body += f"{start}{script}\necho COSCHED-MEASURE-END {name}\n"
            body += "kill $HOG; wait $HOG\n" + harness.agent_stop(mode)
        cls.boot = harness.run(body, policy="cosched", daemon_config=harness.NO_BUDGETS, start_agent=False,
                              layers=[harness.PYTHON_LAYER], tools=True)

    def window(self, mode, name):
        """The boosted share of window `name` and the detector stats of its agent (`mode`)."""
        need_root(self)
        r = self.boot
        self.assertIsNotNone(r, "the shared boot did not run")
        agent = [l for l in r["agent_log"] if l.startswith(f"{mode}: ")]
        w = r["windows"].get(name)
        self.assertIsNotNone(w, f"no window {name}: {r['console'][-2000:]}")
        # The status query at MEASURE-END races the agent's DEREGISTER right after it (a slow guest
        # can be gone from the list by then): the agent's own log says whether it was registered.
        self.assertTrue(w.get("registered") or any("registered with the host" in l for l in agent), agent)
        self.assertGreaterEqual(w["daemon"]["frames"], 2, agent)
        share = w["boosted_share"]
        stats = [l for l in agent if "detector stats" in l]
        print(f"\n  {name}: boosted {100 * share:.0f}% of {w['measure_s']:.1f} s; {stats}", file=sys.stderr)
        return share, stats

    def test_count_mode_keeps_a_sleeping_task_boosted_for_its_whole_run(self):
        """cyclictest (SCHED_OTHER) beside a guest CPU hog for 12 s. Each hint wakes the agent,
        which preempts cyclictest; if that return were charged, cyclictest would leave the list
        within seconds (it did, before the agent's returns were made free)."""
        share, _ = self.window("count", "count-sleeping")
        self.assertGreater(share, 0.8)

    def test_count_mode_drops_a_cpu_bound_new_task(self):
        """A new CPU hog beside the guest's hog: preempted every few ms, it spends its units and
        leaves the list, so the VM is not kept boosted for it."""
        share, _ = self.window("count", "count-cpu-bound")
        self.assertLess(share, 0.3)

    def test_the_default_boosts_a_start_up_and_then_releases_the_program(self):
        """The default, budget mode (DEFAULT_BUDGET_S of a new task's run time): Python starting from a hot
        page cache beside a guest hog, which hardly sleeps, keeps its VM boosted for its whole
        start-up (the old count mode spent its 8 units early: the VM was boosted for 1-17% of the
        launches in the start-up experiment); the same program turned CPU-bound once started is
        released when its budget is spent."""
        share, stats = self.window("default", "default-start-ups")
        # What the budget can cover: a launch that ran R s of CPU keeps its VM boosted for about
        # min(1, budget / R) of its time (more with what its wake-ups earn back). The guest's speed
        # under TCG varies between runs and machines: with the 300 ms budget of before, R was
        # 0.29-0.56 s, and the share within 3 points of that cover (70-89%, 7 runs); one CI run's
        # launches took 1.15 s each, and a share of 56% failed the fixed 60% this test first required.
        budget = self.DEFAULT_BUDGET_S
        cpu = [c for _, c in harness.launches(self.boot["console"].splitlines())]
        self.assertEqual(len(cpu), 10, self.boot["console"][-2000:])
        covered = sum(min(1.0, budget / c) for c in cpu) / len(cpu)
        print(f"  start-up CPU time {min(cpu):.2f}-{max(cpu):.2f} s; the {budget * 1000:.0f} ms budget covers "
              f"{100 * covered:.0f}% of it, boosted {100 * share:.0f}% (count mode: 1-17%)", file=sys.stderr)
        self.assertGreater(covered, 0.4, "the guest is too slow here for the default budget to cover a start-up")
        self.assertGreater(share, 0.75 * covered, stats)
        # Turned CPU-bound beside the guest's hog: boosted for its budget of run time and as much
        # of waiting (each about twice as long on the clock, half the vCPU each), then released:
        # with the budget 1 s, about 2 s of the 8 s window (a newcomer never released: all of it).
        share, stats = self.window("default", "default-cpu-bound")
        self.assertLess(share, (2 * budget + 1) / self.CPU_BOUND_S, stats)
        self.assertTrue(any("watch_spent=" in l and "watch_spent=0 " not in l + " " for l in stats), stats)

    def test_budget_mode_keeps_a_sleeping_task_boosted(self):
        """cyclictest runs a few µs per wake-up and earns 2 ms back with each: it never runs out."""
        share, stats = self.window("budget", "budget-sleeping")
        self.assertGreater(share, 0.8, stats)

    def test_budget_mode_releases_a_cpu_bound_newcomer_within_its_budget(self):
        """A new CPU hog beside the guest's hog gets half the vCPU: its 200 ms of run time last
        about 0.4 s of the 4 s, then it leaves the list (watch_spent), and a newcomer started every
        second costs each time no more than its own budget."""
        share, stats = self.window("budget", "budget-cpu-bound")
        self.assertLess(share, 0.3, stats)
        self.assertTrue(any("watch_spent=" in l and "watch_spent=0 " not in l + " " for l in stats), stats)
        share, stats = self.window("budget", "budget-newcomers")
        # Each newcomer: at most 200 ms of its run time, ~0.4 s of wall time beside the hog.
        self.assertLess(share, 0.6, stats)


class RtHold(unittest.TestCase):
    """The guest's hold in the real guest, under 2 host hogs: a periodic real-time task keeps its
    VM boosted. Judged by the daemon's counters between two lines the guest prints once the
    task runs (HOLD-START NAME, HOLD-END NAME), with the daemon's default budgets (a 10 s boost
    and the guard do not end these 2-3 s ones; the guard moves the vCPU, it does not deboost).
    One boot serves both tests: one task, then the other, under the same agent."""

    # Predictions off: this host refuses WAKE (a denial the test would count), and the hold is
    # what is tested.
    AGENT = harness.agent_start("-v --predict false") + """(while :; do :; done) &
"""
    STOP_AGENT = harness.agent_stop()
    # cyclictest -p 80 -i 1000 beside the guest's CPU hog (the workload of the daemon-restart
    # test), measured over 2 s from 0.2 s after its real-time thread appeared: the new-task boosts
    # of its start-up (a few ms each) are over by then.
    CYCLICTEST = """cyclictest -p 80 -i 1000 -l 3500 -q >/dev/null &
C=$!
i=0
until [ "$(ls /proc/$C/task 2>/dev/null | wc -l)" -ge 2 ]; do
    i=$((i+1)); [ $i -gt 100 ] && { echo "COSCHED-GUEST: no real-time thread"; break; }
    sleep 0.05
done
sleep 0.2
echo "HOLD-START cyclictest"
sleep 2
echo "HOLD-END cyclictest"
wait $C
"""
    # A 2 ms periodic task whose every 25th activation runs 6 ms.
    LONG = """cat >/tmp/rt.py <<'EOF'
import os, time
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
P, LONG, EVERY = 0.002, 0.006, 25
nxt = time.monotonic()
for i in range(1900):
    if i == 250:
        print("HOLD-START long", flush=True)
    elif i == 1750:
        print("HOLD-END long", flush=True)
    nxt += P
    d = nxt - time.monotonic()
    if d > 0:
        time.sleep(d)
    else:
        nxt = time.monotonic()
    if i % EVERY == EVERY - 1:
        end = time.monotonic() + LONG
        while time.monotonic() < end:
            pass
EOF
python3 /tmp/rt.py
"""
    marks = None
    console = ""

    @classmethod
    def setUpClass(cls):
        """Boots the guest with the agent, a guest hog and both tasks under 2 host hogs, and keeps
        the daemon's status of the VM at each HOLD line (with the host's clock)."""
        if os.geteuid() != 0:
            return  # each test says so (need_root)
        cls.marks = {}
        with tempfile.TemporaryDirectory(prefix="cosched-vmtest-") as tmp, cb.host_hogs(2):
            d = cb.Daemon(tmp)

            def on_line(line, pid):
                if line.startswith(("HOLD-START ", "HOLD-END ")):
                    cls.marks[line] = (time.monotonic(), vm_status(d))
            try:
                cls.console, _ = cb.boot_guest("#!/bin/sh\n" + cls.AGENT + cls.CYCLICTEST + cls.LONG + cls.STOP_AGENT,
                                               sock=d.socket_dir / "e2e.sock", on_line=on_line,
                                               layers=[harness.PYTHON_LAYER])
            finally:
                d.stop()

    def hold_window(self, name):
        """The deboosts and the boosted share between HOLD-START and HOLD-END of task `name`, and
        a failure message (both statuses and the agent's log)."""
        need_root(self)
        self.assertIsNotNone(self.marks, "the shared boot did not run")
        agent = agent_log(self.console)
        start, end = f"HOLD-START {name}", f"HOLD-END {name}"
        self.assertIn(start, self.marks, self.console[-2000:])
        self.assertIn(end, self.marks, self.console[-2000:])
        (t0, s0), (t1, s1) = self.marks[start], self.marks[end]
        self.assertTrue(s0 and s1 and s0["registered"], (s0, s1, agent))
        deboosts = s1["counters"]["deboosts"] - s0["counters"]["deboosts"]
        share = (harness.boosted_s(s1) - harness.boosted_s(s0)) / (t1 - t0)
        print(f"\n  {t1 - t0:.2f} s with the real-time task running: {deboosts} deboost(s), "
              f"boosted {100 * share:.0f}%, level {s0['level']} -> {s1['level']}, "
              f"guard demotions {s1['counters'].get('guard_demotions', 0) - s0['counters'].get('guard_demotions', 0)}",
              file=sys.stderr)
        # Denials so far (the counter is cumulative: the first task's too, for the second).
        self.assertEqual(s1["counters"]["denied"], {}, (s1, agent))
        why = (f"over {t1 - t0:.2f} s: {deboosts} deboost(s), boosted {100 * share:.0f}%\n"
               f"at start: {s0}\nat end: {s1}\nagent:\n{agent}")
        return deboosts, share, why

    def test_a_1ms_rt_task_keeps_its_vm_boosted_under_host_load(self):
        """cyclictest -p 80 -i 1000 beside a guest CPU hog (CYCLICTEST)."""
        deboosts, share, why = self.hold_window("cyclictest")
        # A few stray deboosts are tolerated: a host stall longer than the hold (2.5 ms here)
        # still ends it, and this machine is shared (0-5 in 2 s were seen at a load of 4-7). A
        # hold that does not work deboosts at nearly every activation: with the paper's fixed
        # 500 µs (`--hold-periodic-max-us 0`), 248-377 deboosts in 2 s and 55% boosted.
        self.assertLessEqual(deboosts, 4, why)
        self.assertGreaterEqual(share, 0.9, why)

    def test_a_long_activation_does_not_end_the_boost(self):
        """A periodic real-time task (2 ms period) whose every 25th activation runs 6 ms, longer
        than its hold (2 periods + MIN_BOOST_TIME = 4.5 ms). The hold bridges the gap after an
        activation, so it must count from the task's switch-out: counted from its switch-in,
        every long activation deboosts the VM the moment it ends (~20 deboosts a second). A
        guest's activation also gets that long when the host stalls its vCPU mid-activation
        (seen under host load: 3.4 ms for one of cyclictest's 1 ms activations), and under TCG
        the agent's own run after each hint (~1 ms) did the same to the new-task boosts."""
        deboosts, share, why = self.hold_window("long")
        self.assertLessEqual(deboosts, 4, why)
        self.assertGreaterEqual(share, 0.9, why)

    def test_the_guests_vcpu_run_delay_is_in_the_status(self):
        """The host measures how long the guest's vCPUs wait to run (host BPF), per level the VM
        was at: by the end of the boosted cyclictest window, under 2 host hogs, its waits
        boosted are in the status."""
        need_root(self)
        self.assertIsNotNone(self.marks, "the shared boot did not run")
        end = "HOLD-END cyclictest"
        self.assertIn(end, self.marks, self.console[-2000:])
        _, s = self.marks[end]
        rd = s.get("run_delay", {})

        def p(d, q):
            """Quantile q of a log2 histogram (ns), at the upper bound of its bucket."""
            total, below = sum(d["counts"]), 0
            for i, n in enumerate(d["counts"]):
                below += n
                if below >= q * total:
                    return 2 ** (i + 1)
            return None
        print("\n  run delay: " + "; ".join(f"{level} n {d['count']} p50 <= {p(d, 0.5) / 1e3:.0f} µs "
                                             f"p99 <= {p(d, 0.99) / 1e3:.0f} µs" for level, d in rd.items()),
              file=sys.stderr)
        self.assertIn("boosted", rd, s)
        self.assertGreater(rd["boosted"]["count"], 0, rd)


class EndToEnd(unittest.TestCase):
    def test_coordination_under_host_load(self):
        """Registered, boosted, and helps a lot: the coordinated guest's average wake-up latency
        is under half the uncoordinated one's, in the median of up to 3 interleaved pairs of runs
        (it stops once 2 pairs agree). The effect is ~4-6x here; one 2 s pair is at the mercy of
        the host's own stalls (an idle cyclictest at FIFO 95 has seen 1.85 ms on this machine),
        and a fresh-clone CI once saw a single pair miss. A broken boost misses in every pair."""
        need_root(self)
        passed, missed, pairs = 0, 0, []
        while passed < 2 and missed < 2:
            unc = cb.run_scenario("uncoordinated", loops=2000)
            co = cb.run_scenario("coordinated", loops=2000)
            print(f"\n  pair {len(pairs) + 1}: uncoordinated avg {unc['avg']} p50 {unc['p50']} max {unc['max']} µs; "
                  f"coordinated avg {co['avg']} p50 {co['p50']} max {co['max']} µs, {co['daemon']}", file=sys.stderr)
            self.assertTrue(co["registered"], co.get("agent_log"))
            self.assertGreaterEqual(co["daemon"]["boosts"], 1, co.get("agent_log"))
            self.assertEqual(co["daemon"]["malformed"], 0)
            pairs.append({k: (unc[k], co[k]) for k in ("avg", "p50", "p99", "max")})
            if 2 * co["avg"] < unc["avg"]:
                passed += 1
            else:
                missed += 1
        self.assertEqual(passed, 2, f"(uncoordinated, coordinated) per pair: {pairs}")

    def test_operator_disable_and_enable_reach_the_real_agent(self):
        """DISABLE detaches the guest's detectors and deboosts; ENABLE brings them back."""
        need_root(self)
        workload = """#!/bin/sh
""" + harness.agent_start() + """(while :; do :; done) &
for r in 1 2 3 4 5 6; do
    echo "ROUND $r"
    cyclictest -p 80 -i 1000 -l 700 -q >/dev/null
done
""" + harness.agent_stop()
        events = {}
        with tempfile.TemporaryDirectory(prefix="cosched-vmtest-") as tmp, cb.host_hogs(2):
            d = cb.Daemon(tmp)

            def ctl(*args):
                subprocess.run([str(cb.COSCHED), *args, "--control-socket", str(d.control)], check=True)

            def frames_settled(quiet_s=0.5, timeout=5.0):
                """The status once the frame count has not moved for quiet_s: frames the agent
                sent before it got DISABLE may still be on their way when the command returns."""
                last, since = vm_status(d), time.monotonic()
                deadline = since + timeout
                while time.monotonic() < deadline:
                    time.sleep(0.05)
                    cur = vm_status(d)
                    if cur is None or last is None or cur["counters"]["frames"] != last["counters"]["frames"]:
                        last, since = cur, time.monotonic()
                    elif time.monotonic() - since >= quiet_s:
                        return cur, True
                return last, False

            def on_line(line, pid):
                if line == "ROUND 2":
                    # Round 1 has run by now: the agent registered and was boosted at least once.
                    events["before_disable"], _ = wait_for_vm(d, lambda v: v["registered"] and v["counters"]["boosts"] >= 1)
                    ctl("vm", "disable", "e2e")
                    events["after_disable"], events["deboosted"] = wait_for_vm(
                        d, lambda v: v["level"] == "normal" and not v["enabled"])
                    events["settled"], events["quiet"] = frames_settled()
                elif line == "ROUND 4":
                    events["while_disabled"] = vm_status(d)
                    ctl("vm", "enable", "e2e")
                elif line == "ROUND 6":
                    # Re-registered (ENABLE at ROUND 4) and boosted again by rounds 4 and 5.
                    events["after_enable"], _ = wait_for_vm(
                        d, lambda v: v["registered"] and v["counters"]["boosts"] > events["while_disabled"]["counters"]["boosts"])
            try:
                console, _ = cb.boot_guest(workload, sock=d.socket_dir / "e2e.sock", on_line=on_line)
            finally:
                d.stop()
        agent = agent_log(console)
        b, a, s, w, e = (events.get(k) for k in ("before_disable", "after_disable", "settled", "while_disabled",
                                                 "after_enable"))
        self.assertTrue(b and b["registered"] and b["counters"]["boosts"] >= 1, (b, agent))
        self.assertEqual(a["level"], "normal", a)
        self.assertFalse(a["enabled"])
        self.assertTrue(events["quiet"], f"the agent kept sending frames after DISABLE: {s}\n{agent}")
        # While disabled the detached agent sends nothing: no new frames (counted from when the
        # frames it sent before it got DISABLE had arrived).
        self.assertEqual(w["counters"]["frames"], s["counters"]["frames"], agent)
        self.assertEqual(w["counters"]["boosts"], a["counters"]["boosts"])
        self.assertIn("disabled coordination; detaching", agent)
        self.assertIn("enabled coordination; registering", agent)
        self.assertEqual(agent.count("detectors attached"), 2, agent)
        self.assertTrue(e["registered"] and e["counters"]["boosts"] > w["counters"]["boosts"], (e, agent))


class DaemonStops(unittest.TestCase):
    """The daemon stopped while its VM runs boosted: by kill -9, then restarted; then by SIGTERM.
    One boot serves both tests: the second daemon, once it has restored what the first left and
    boosted the VM again, is the one SIGTERM stops."""

    WORKLOAD = """#!/bin/sh
""" + harness.agent_start('-v') + """(while :; do :; done) &
for r in 1 2 3 4 5; do
    cyclictest -p 80 -i 1000 -l 800 -q >/dev/null &
    C=$!
    sleep 0.3
    echo "ROUND $r"   # the real-time thread may not have started yet: the host waits for the boost
    wait $C
done
cyclictest -p 80 -i 1000 -l 3000 -q >/dev/null &
C=$!
sleep 0.3
echo "CYCLICTEST STARTED"
wait $C
""" + harness.agent_stop()
    seen = None
    console = ""
    before = set()

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            return  # each test says so (need_root)
        cls.before = userspace_rt_threads()
        seen = cls.seen = {}

        def qemu_rt_threads(pid):
            return [t for t in userspace_rt_threads() if t[0] == pid]

        with tempfile.TemporaryDirectory(prefix="cosched-vmtest-") as tmp, cb.host_hogs(2):
            daemons = [cb.Daemon(tmp)]

            def on_line(line, pid):
                if line == "ROUND 2":
                    # cyclictest's real-time thread may start after this line (0.2-0.5 s after
                    # cyclictest under TCG; before it, the VM is only boosted for ms at a time
                    # for new tasks): wait for its boost, then kill.
                    seen["first"], boosted = wait_for_vm(daemons[0], settled_boost)
                    if not boosted:
                        return  # reported by the tests, with the agent's log
                    daemons[0].proc.kill()
                    daemons[0].proc.wait()
                    seen["rt_after_kill"] = len(qemu_rt_threads(pid))
                    daemons.append(cb.Daemon(tmp))  # restores, then reconnects
                    seen["restore_log"] = (Path(tmp) / "daemon.log").read_text()
                    seen["rt_after_restart"] = len(qemu_rt_threads(pid))
                elif line == "ROUND 5" and len(daemons) == 2:
                    seen["second"], _ = wait_for_vm(
                        daemons[1], lambda v: v["registered"] and v["counters"]["boosts"] >= 1)
                elif line == "CYCLICTEST STARTED" and len(daemons) == 2:
                    # cyclictest's real-time thread starts some time later (0.2-0.5 s under TCG):
                    # wait for its boost instead of sampling one instant.
                    seen["vm"], seen["boosted"] = wait_for_vm(daemons[1], settled_boost)
                    seen["before"] = qemu_rt_threads(pid)
                    daemons[1].stop()  # SIGTERM
                    seen["after"] = qemu_rt_threads(pid)
                    seen["alive"] = os.path.exists(f"/proc/{pid}")
            try:
                cls.console, _ = cb.boot_guest(cls.WORKLOAD, sock=Path(tmp) / "vms" / "e2e.sock", on_line=on_line)
            finally:
                daemons[-1].stop()
                daemons[0].log.close()
        seen["left"] = userspace_rt_threads() - cls.before

    def test_daemon_killed_with_sigkill_and_restarted_while_the_guest_runs(self):
        """kill -9 leaves the VM boosted; the next daemon restores it, reconnects, and the real
        agent registers again and is boosted again."""
        need_root(self)
        self.assertIsNotNone(self.seen, "the shared boot did not run")
        seen, agent = self.seen, agent_log(self.console)
        first = seen.get("first")
        self.assertTrue(first and first["level"] == "boosted",
                        f"the VM never held a boost for {SETTLED_BOOST_MS} ms within 5 s of ROUND 2; "
                        f"last status: {first}\nagent:\n{agent}")
        self.assertGreater(seen["rt_after_kill"], 0, "kill -9 restores nothing by itself")
        restored = re.search(r"restored (\d+) thread\(s\) left boosted by a previous daemon", seen["restore_log"])
        self.assertTrue(restored and int(restored.group(1)) >= 1, seen["restore_log"])
        self.assertTrue(seen["second"] and seen["second"]["registered"], (seen.get("second"), agent))
        self.assertGreaterEqual(seen["second"]["counters"]["boosts"], 1, agent)
        # The agent registered again, by either path: the new daemon told it it was not
        # registered, or its own write failed while no daemon listened and it found the channel
        # back (a fresh-clone CI run took the second).
        self.assertTrue("registering again" in agent or "the host channel is back" in agent, agent)
        self.assertGreaterEqual(agent.count("registered with the host"), 2, agent)
        self.assertEqual(seen["left"], set(), "threads left at a real-time policy")

    def test_sigterm_restores_a_boosted_vm_that_keeps_running(self):
        """The daemon stopped (SIGTERM) while the guest is boosted: the running QEMU's threads go
        back."""
        need_root(self)
        self.assertIsNotNone(self.seen, "the shared boot did not run")
        seen = self.seen
        self.assertIn("second", seen, "no daemon was restarted to stop (see the kill -9 test)")
        self.assertTrue(seen.get("boosted"), f"the VM never held a boost for {SETTLED_BOOST_MS} ms within 5 s "
                        f"of cyclictest's start; last status: {seen.get('vm')}\nagent:\n{agent_log(self.console)}")
        self.assertTrue(seen["alive"], "QEMU still running when checked")
        self.assertGreater(len(seen["before"]), 0, "the VM was boosted: its threads were real-time")
        self.assertEqual(seen["after"], [], "SIGTERM put every thread back")


def make_disk_image(path, big_mb=48, small_files=400, small_kb=12):
    """An ext4 image for a guest disk (mkfs.ext4 -d, no mount, no root needed): /big1 and /big2
    (random, `big_mb` MiB each: the sequential readers' files) and `small_files` random files of
    `small_kb` KiB under /small/dNN/ (the "application" to start)."""
    stage = Path(str(path) + ".stage")
    (stage / "small").mkdir(parents=True)
    for name in ("big1", "big2"):
        with open(stage / name, "wb") as f:
            for _ in range(big_mb):
                f.write(os.urandom(1 << 20))
    for i in range(small_files):
        d = stage / "small" / f"d{i // 40:02d}"
        d.mkdir(exist_ok=True)
        (d / f"f{i % 40:02d}").write_bytes(os.urandom(small_kb << 10))
    size_mb = 2 * big_mb + small_files * (small_kb + 4) // 1024 + 64
    subprocess.run(["mkfs.ext4", "-q", "-F", "-d", str(stage), str(path), f"{size_mb}M"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["rm", "-rf", str(stage)], check=True)


def uptime_marks(console, word):
    """Guest uptimes (s) printed as `<word> <uptime>` lines."""
    out = []
    for l in console.splitlines():
        parts = l.strip().split()
        if len(parts) == 2 and parts[0] == word:
            out.append(float(parts[1]))
    return out


def io_transitions(console):
    """The agent's I/O transitions from its verbose log: [(guest time in s, want)]."""
    out = []
    for l in console.splitlines():
        m = re.search(r"io vd[a-z]+ (wants a boost|done) at (\d+) µs", l)
        if m and l.startswith("COSCHED-AGENT: "):
            out.append((int(m.group(2)) / 1e6, m.group(1) == "wants a boost"))
    return out


def io_episodes(transitions):
    """The agent's I/O transitions paired into episodes [(IO 1 time, IO 0 time or None if still
    raised)]; None if they do not alternate, beginning with IO 1."""
    out = []
    for t, want in transitions:
        if want == bool(out and out[-1][1] is None):
            return None
        if want:
            out.append((t, None))
        else:
            out[-1] = (out[-1][0], t)
    return out


class IoCoordination(unittest.TestCase):
    """The guest side of I/O coordination (Virtual-BFQ) with the real daemon: a guest with a disk (ext4,
    BFQ, cache=none on the host) runs two sequential readers, then "starts an application" (reads
    400 cold small files). The agent's I/O detector must send IO 1 when the application starts
    under the readers and IO 0 once it has started, and the daemon must raise and lower the VM's
    I/O for it, its own iothread included."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="cosched-iotest-")
        cls.image = Path(cls.tmp.name) / "disk.img"
        if os.geteuid() == 0:
            make_disk_image(cls.image)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    WORKLOAD = r"""#!/bin/sh
up() { read -r u _ </proc/uptime; echo "$u"; }
mkdir -p /mnt/d && mount -t ext4 -o noatime /dev/vda /mnt/d || { echo "COSCHED-GUEST: mount failed"; exit 1; }
# --predict false: this host refuses WAKE, and the test counts denials.
""" + harness.agent_start('-v --predict false', 'detectors attached: io|unsupported') + """sleep 0.2
echo 3 >/proc/sys/vm/drop_caches
echo "READERS $(up)"
cosched-tools seqread /mnt/d/big1 60 >/dev/null &
R1=$!
cosched-tools seqread /mnt/d/big2 60 >/dev/null &
R2=$!
# New queues are weight-raised too: wait until the readers' own raising is over: the agent's
# last I/O line says "done" and no I/O line came for 1 s (at most 30 s: BFQ raises a new queue
# for 3 to 25 s, longer the slower it measured the disk). The raising comes as many short
# episodes (70 ms, every 190 ms): the count of lines must not change, since a sample of the last
# line alone nearly always reads "done" (a run took the readers' raising for quiet that way).
i=0; since=; seen=-1
while [ $i -lt 300 ]; do
    sleep 0.1; i=$((i+1))
    n=$(grep -c "io vd[a-z]* " /tmp/agent.log)
    case $(grep "io vd[a-z]* " /tmp/agent.log | tail -1) in
        *" done "*) if [ "$n" = "$seen" ] && [ -n "$since" ]; then
                        [ $((i - since)) -ge 10 ] && break
                    else since=$i; seen=$n; fi ;;
        *) since=; seen=$n ;;
    esac
done
echo "QUIET $(up)"
echo 3 >/proc/sys/vm/drop_caches
sleep 0.5
echo "APP-START $(up)"
cat /mnt/d/small/*/* >/dev/null
echo "APP-END $(up)"
kill -0 $R1 && kill -0 $R2 && echo "READERS-ALIVE"
sleep 1.5
echo "AFTER $(up)"
kill $R1 $R2; wait $R1 $R2
""" + harness.agent_stop() + """umount /mnt/d
"""

    def io_state(self, daemon):
        st = daemon.status()
        if not st or not st["vms"]:
            return None
        vm = st["vms"][0]
        return {"registered": vm["registered"], "threads": vm["threads"], **vm["resources"]["io"]}

    @staticmethod
    def io_why(console, seen, daemon_log):
        """A failure's context, short enough to survive a CI excerpt: the daemon's view at each
        mark (level, counters, raised threads), the guest's marks and I/O transitions relative to
        APP-START, the agent's lines without its per-frame and CPU lines, the daemon log's end."""
        def brief(s):
            if not s:
                return repr(s)
            raised = {t["comm"]: t.get("ioprio") for t in s["threads"] if "io" in t["changed_by"]}
            return f"level={s['level']} registered={s['registered']} counters={s['counters']} raised={raised}"
        marks = {w: uptime_marks(console, w) for w in ("READERS", "QUIET", "APP-START", "APP-END", "AFTER")}
        zero = (marks["APP-START"] or [0.0])[0]
        rel = lambda t: f"{1000 * (t - zero):+.0f}"
        agent = "\n".join(l for l in agent_log(console).splitlines()
                          if " seq=" not in l and not re.search(r"cpu \d+ (wants a boost|done) at", l))
        return ("\n".join(f"daemon at {k}: {brief(seen.get(k))}" for k in ("quiet", "start", "end"))
                + f"\nflags: raised={seen.get('raised')} lowered={seen.get('lowered')}"
                + "\nguest marks (ms from APP-START): "
                + ", ".join(f"{w} {' '.join(rel(t) for t in ts)}" for w, ts in marks.items())
                + "\nguest I/O transitions (ms from APP-START): "
                + " ".join(f"{'IO1' if want else 'IO0'}@{rel(t)}" for t, want in io_transitions(console))
                + f"\nagent (frames and CPU lines left out):\n{agent}\ndaemon log end:\n{daemon_log[-2000:]}")

    def test_io_1_when_an_application_starts_under_readers_and_io_0_after(self):
        need_root(self)
        seen = {}
        with tempfile.TemporaryDirectory(prefix="cosched-vmtest-") as tmp:
            d = cb.Daemon(tmp, "[resources]\nio = true\n")

            def wait_io(pred, timeout):
                deadline = time.monotonic() + timeout
                while True:
                    s = self.io_state(d)
                    if s is not None and pred(s):
                        return s, True
                    if time.monotonic() >= deadline:
                        return s, False
                    time.sleep(0.01)

            def on_line(line, pid):
                word = line.split(" ", 1)[0]
                if word == "QUIET":
                    seen["quiet"] = self.io_state(d)
                elif word == "APP-START":
                    # Raised while the application starts (the guest's IO 1 may have arrived
                    # already: counted from QUIET).
                    seen["start"], seen["raised"] = wait_io(lambda s: s["level"] == "boosted", 5.0)
                elif word == "APP-END":
                    # Lowered once it has started (the guest holds IO 1 for 50 ms after its last
                    # weight-raised busy queue).
                    seen["end"], seen["lowered"] = wait_io(
                        lambda s: s["level"] == "normal" and s["counters"]["deboosts"] == s["counters"]["boosts"], 3.0)
            try:
                # The disk has its own iothread, which the daemon must raise (with the worker
                # threads: aio=threads; with aio=native the episode split in two once in 3 runs).
                console, _ = cb.boot_guest(self.WORKLOAD, sock=d.socket_dir / "io.sock", on_line=on_line,
                                           adds=[f"{harness.TOOLS}:/usr/bin/cosched-tools"],
                                           disks=[f"{self.image},iothread"])
            finally:
                d.stop()
            daemon_log = (Path(tmp) / "daemon.log").read_text()
        agent = agent_log(console)
        why = self.io_why(console, seen, daemon_log)
        # assertTrue, not assertIn: assertIn's first line would be the whole log.
        self.assertTrue("detectors attached: io (BFQ on vda; switched vda from mq-deadline)" in agent,
                        "the agent did not attach its I/O detector to BFQ on vda\n" + why)
        self.assertTrue("granted cpu,io" in agent, "the host did not grant cpu,io\n" + why)
        self.assertTrue("READERS-ALIVE" in console, "the readers ran for the whole start-up\n" + why)
        q = seen.get("quiet")
        self.assertTrue(q and q["registered"], why)
        self.assertEqual(q["level"], "normal", "the readers' own raising was over before the start\n" + why)
        self.assertTrue(seen.get("raised"), "the daemon never raised the VM's I/O for the start\n" + why)
        raised = {t["comm"]: t for t in seen["start"]["threads"] if "io" in t["changed_by"]}
        self.assertIn("IO iothread0", raised, "the disk's iothread is raised\n" + why)
        self.assertEqual(raised["IO iothread0"].get("ioprio"), "0x2000", why)  # RT class, level 0
        self.assertFalse([c for c in raised if c.startswith("CPU ")], "vCPU threads are not raised\n" + why)
        self.assertTrue(seen.get("lowered"), "the daemon did not lower it after the start\n" + why)
        self.assertEqual(seen["end"]["counters"]["denied"], {}, why)
        # The guest's own view: IO 1 at the start, IO 0 after its end (the hold is 50 ms), raised
        # in between. The episodes judged are those after QUIET that overlap the start:
        # - one may begin in the 0.5 s between QUIET and APP-START (seen once in CI: IO 1 more than
        #   50 ms before APP-START, after the drop_caches there); it must then cover the start;
        # - what the workload does after the start (the readers going on for 1.5 s, stopping
        #   them, powering off) may start an episode of its own (seen 1.2 s and once 0.22 s after
        #   IO 0), which begins after APP-END and is left out;
        # - the start may split: under TCG, cat can spend more than the 50 ms hold on the CPU
        #   between two reads (seen: IO 0 72 ms into a 390 ms start, IO 1 again 32 ms later). The
        #   gaps inside the start must stay under a quarter of it.
        (readers,), (quiet,), (app_start,), (app_end,) = (
            uptime_marks(console, w) for w in ("READERS", "QUIET", "APP-START", "APP-END"))
        episodes = io_episodes([(t, w) for t, w in io_transitions(console) if quiet <= t])
        self.assertTrue(episodes is not None, "the agent's IO 1 and IO 0 after QUIET do not alternate\n" + why)
        start = [(a, b) for a, b in episodes if a < app_end and (b is None or b > app_start)]
        self.assertTrue(start, "no I/O episode overlaps the application's start\n" + why)
        t1, t0 = start[0][0], start[-1][1]
        self.assertIsNotNone(t0, "no IO 0 after the start\n" + why)
        gaps = sum(max(0.0, min(a, app_end) - max(b, app_start)) for (_, b), (a, _) in zip(start, start[1:]))
        print(f"\n  readers' own raising over after {quiet - readers:.1f} s (1 s of it quiet); "
              f"app start {app_end - app_start:.3f} s under 2 readers; IO 1 {1000 * (t1 - app_start):+.0f} ms "
              f"after its start, IO 0 {1000 * (t0 - app_end):+.0f} ms after its end ({len(start)} episode(s), "
              f"gaps {1000 * gaps:.0f} ms); daemon io counters {seen['end']['counters']}", file=sys.stderr)
        self.assertLess(t1 - app_start, 0.5, "IO 1 within 0.5 s of the start\n" + why)
        self.assertGreaterEqual(t0, app_end - 0.05, "IO 0 only once it has started\n" + why)
        self.assertLess(t0 - app_end, 1.0, "IO 0 within 1 s of its end\n" + why)
        self.assertLessEqual(gaps, 0.25 * (app_end - app_start), "raised for most of the start\n" + why)

    def test_no_bfq_in_the_guest_io_unsupported_cpu_works(self):
        """A guest with a disk but without BFQ (its module not loaded): the agent says I/O is
        unsupported and why, registers the CPU only, and the CPU coordination works."""
        need_root(self)
        workload = """#!/bin/sh
""" + harness.agent_start() + """cyclictest -p 80 -i 1000 -l 500 -q >/dev/null
echo "CPU-DONE"
# The host reads the daemon's status on that line: the agent must still be registered then.
sleep 1
""" + harness.agent_stop()
        seen = {}
        with tempfile.TemporaryDirectory(prefix="cosched-vmtest-") as tmp:
            d = cb.Daemon(tmp, "[resources]\nio = true\n")

            def on_line(line, pid):
                if line == "CPU-DONE":
                    seen["vm"], _ = wait_for_vm(d, lambda v: v["registered"] and v["counters"]["boosts"] >= 1,
                                                timeout=3.0)
                    seen["io"] = self.io_state(d)
            try:
                console, _ = cb.boot_guest(workload, sock=d.socket_dir / "nobfq.sock", on_line=on_line,
                                           disks=[self.image], append="cosched.skip_modules=bfq")
            finally:
                d.stop()
        agent = agent_log(console)
        self.assertIn("bfq not loaded (cosched.skip_modules)", console)
        self.assertIn("unsupported here, the other detectors keep working: io: BFQ is not available", agent)
        self.assertIn("modprobe bfq", agent)
        self.assertRegex(agent, r"(?m)registered with the host; granted cpu$")
        vm = seen.get("vm")
        self.assertTrue(vm and vm["registered"] and vm["counters"]["boosts"] >= 1, (vm, agent))
        self.assertEqual(seen["io"]["counters"]["requests"], 0, seen["io"])


def netns_names():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {l.split()[0] for l in out.splitlines() if l.split()}


class GuestNetwork(unittest.TestCase):
    """Guests on tap devices (run.sh --net) in the experiments' private network namespace, without
    an agent (the FEAS set-up, bench/experiments/feas.py)."""

    def test_a_guest_on_a_tap_answers_pings_and_serves_files(self):
        """virtio_net is loaded, eth0 gets cosched.ip, busybox httpd serves a file whole, and
        the network namespace with its taps is gone afterwards."""
        need_root(self)
        from experiments import feas
        with feas.Testbed(n_vms=2, sizes_kb=(64, 1024)) as tb:
            ns = tb.net.name
            self.assertIn(ns, netns_names())
            tb.boot([1, 2])
            macs = {i: tb.vms[i].wait_for("COSCHED-FEAS-READY").split()[1] for i in (1, 2)}
            self.assertNotEqual(macs[1], macs[2], "MACs derive from the VM names")
            rtts, lost = tb.ping(2, 5, interval=0.1)
            self.assertEqual(lost, 0)
            self.assertEqual(tb.ctl(1, "hog=1"), "hog on")
            self.assertGreater(tb.download(1, 1024), 0)
            # The vCPUs are on the vCPU CPU, QEMU's other threads on the client's.
            for vm in tb.vms.values():
                for tid, comm in vm.threads():
                    want = feas.VCPU_CPUS if harness.is_vcpu(comm) else feas.CLIENT_CPUS
                    self.assertEqual(os.sched_getaffinity(tid), want, comm)
        self.assertNotIn(ns, netns_names(), "the namespace (and its taps) is removed")
        print(f"\n  ping {sum(rtts) / len(rtts):.0f} µs avg to an idle guest", file=sys.stderr)

    def test_the_network_namespace_goes_on_sigterm_and_after_sigkill(self):
        need_root(self)
        code = ("import sys, time; sys.path.insert(0, %r); import harness\n"
                "with harness.TapNet(2) as n:\n    print(n.name, flush=True)\n    time.sleep(60)\n"
                % str(Path(__file__).resolve().parents[1]))
        for sig in ("TERM", "KILL"):
            p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 text=True)
            name = p.stdout.readline().strip()
            self.assertIn(name, netns_names())
            p.send_signal(getattr(__import__("signal"), "SIG" + sig))
            p.wait(10)
            p.stdout.close()
            if sig == "KILL":
                self.assertIn(name, netns_names(), "SIGKILL leaves it ...")
                harness.TapNet.remove_stale()
            self.assertNotIn(name, netns_names(), f"after SIG{sig}")


class EventBoost(unittest.TestCase):
    """Event boosting (FEAS): the daemon boosts an agentless VM's runnable vCPU when its device threads
    are woken by an event."""

    def test_a_busy_guest_without_an_agent_answers_pings_faster_with_feas(self):
        """A guest with a CPU hog and no agent, its vCPU on one CPU with 2 host hogs, is pinged
        over its tap: 4 alternating rounds of 60 pings, 20 ms apart, without and with the daemon
        (bench/experiments/feas.py FEAS_CONFIG). Uncoordinated, each ping waits for the vCPU's
        turn behind the hogs; boosted, it is answered at once. A loose ratio here; the numbers
        are in feas-latency."""
        need_root(self)
        from experiments import feas
        rtts = {"none": [], "feas": []}
        boosts = 0
        with feas.Testbed(n_vms=1, sizes_kb=(64,)) as tb, cb.host_hogs(2, cpus=feas.VCPU_CPUS):
            tb.boot([1])
            tb.set_busy({1})
            for mode in ("none", "feas", "feas", "none"):
                with tb.mode(mode) as counters:
                    c0 = counters()
                    got, _ = tb.ping(1, 60)
                    if mode == "feas":
                        boosts += feas.counter_delta(c0, counters(), 1).get("boosts", 0)
                rtts[mode] += got
        avg = {m: sum(v) / len(v) for m, v in rtts.items()}
        why = f"avg µs {avg}, {boosts} boosts"
        print(f"\n  {why}", file=sys.stderr)
        self.assertGreaterEqual(len(rtts["feas"]), 110, why)
        self.assertGreater(boosts, 0, why)
        self.assertLess(avg["feas"], 0.8 * avg["none"], why)


if __name__ == "__main__":
    unittest.main()


def daemon_frames(log, name="e2e"):
    """(kind, value) of every frame the daemon received from VM `name`, in order (its `-v` log:
    `debug: NAME: <- KIND(value) seq=N`)."""
    import re
    return [(m.group(1), int(m.group(2)))
            for m in re.finditer(rf"debug: {re.escape(name)}: <- ([A-Z]+)\((\d+)\) seq=\d+", log)]


def prediction_errors_us(agent):
    """From the agent's -v log: each prediction made at a CPU 0 ("next RT wake-up in D µs at A µs,
    priority P") paired with the next real-time boost of a task of that priority ("cpu N wants a
    boost at T µs: rt task (..., priority P"): T - A in µs, on the guest's monotonic clock. The
    boost's time is the task's switch-in, so the error includes the guest's own wake-up latency."""
    import re
    errors, pending = [], None
    for line in agent.splitlines():
        m = re.search(r"next RT wake-up in \d+ µs at (\d+) µs, priority (\d+)", line)
        if m:
            pending = (int(m.group(1)), int(m.group(2)))
            continue
        m = re.search(r"wants a boost at (\d+) µs: rt task \(pid \d+, priority (\d+)", line)
        if m and pending and int(m.group(2)) == pending[1]:
            errors.append(int(m.group(1)) - pending[0])
            pending = None
    return errors


CARRIES_WAKE = 1 << 17  # a CPU 0 that carries the next wake-up (cosched_proto::cpu::WAKE)


def predicted_wake(kind, v):
    """(delay µs, priority) of a prediction a frame carries: a `WAKE` (bits 0-31 the delay, 32-39
    the priority) or a deboost that carries it (`CPU` with bit 0 clear and bit 17 set: bits 8-15
    the priority, 32-63 the delay); None for any other frame."""
    if kind == "WAKE":
        return v & 0xffffffff, v >> 32 & 0xff
    if kind == "CPU" and not v & 1 and v & CARRIES_WAKE:
        return v >> 32, v >> 8 & 0xff
    return None


def wake_predictions(agent):
    """(predicted µs ahead, delay µs, priority) of each prediction sent in the agent's -v log
    (logged just before the frame that carries it: the deboost's CPU 0, or a WAKE)."""
    import re
    out, ahead = [], None
    for line in agent.splitlines():
        m = re.search(r"next RT wake-up in (\d+) µs at \d+ µs", line)
        if m:
            ahead = int(m.group(1))
            continue
        m = re.search(r"-> (WAKE|CPU)\((\d+)\)", line)
        w = m and predicted_wake(m.group(1), int(m.group(2)))
        if w and ahead is not None:
            out.append((ahead, *w))
            ahead = None
    return out


class PredictiveBoost(unittest.TestCase):
    """Predictive boost in the real guest, both sides: cyclictest -p 80 -i 10000 (the Performance
    Tuning paper's workload) with the agent in that paper's mode (`--hold-periodic-max-us 0
    --idle-deboost-ms 1`: deboosted between activations) and predictions on. Judged by what the daemon received (its `-v` log):
    CPU 1 frames naming priority 80, and WAKE frames predicting the next activation; and by what
    it did with them (its status, read while the guest still runs): predicted boosts applied and
    confirmed by the guest's CPU 1 at its wake-up, at the guest's priority capped by the ceiling.
    Each wake-up told apart (`--predict-standing false`); StandingPrediction tests the standing
    form."""

    LOOPS = 200

    def test_the_guests_priority_and_predicted_wake_ups_are_boosted_and_confirmed(self):
        need_root(self)
        workload = f"""#!/bin/sh
""" + harness.agent_start('-v --hold-periodic-max-us 0 --idle-deboost-ms 1 --predict-horizon-ms 1000 '
                         '--predict-standing false') + f"""cyclictest -p 80 -i 10000 -l {self.LOOPS} -q >/dev/null
echo COSCHED-PREDICT-DONE
sleep 1
""" + harness.agent_stop()
        with tempfile.TemporaryDirectory(prefix="cosched-vmtest-") as tmp:
            d = cb.Daemon(tmp, args=["-v"])
            seen = {}

            def on_line(line, _pid):
                if line.strip() == "COSCHED-PREDICT-DONE":
                    vms = (d.status() or {}).get("vms", [])
                    seen["rt"] = vms[0]["resources"]["cpu"].get("rt") if vms else None

            try:
                console, _ = cb.boot_guest(workload, sock=d.socket_dir / "e2e.sock", on_line=on_line)
            finally:
                d.stop()
            log = (Path(tmp) / "daemon.log").read_text()
        agent = agent_log(console)
        frames = daemon_frames(log)
        boosts = [v for k, v in frames if k == "CPU" and v & 1]
        prio = [v >> 8 & 0xff for v in boosts]
        irq = [v for v in boosts if v >> 8 & 0xff == 80 and v & (1 << 16)]
        wakes = [w for w in (predicted_wake(k, v) for k, v in frames) if w]
        errors = sorted(prediction_errors_us(agent))
        rt = seen.get("rt") or {}
        pr = rt.get("predictions") or {}
        why = (f"CPU 1 priorities {prio}\nWAKEs {wakes[:20]}...\nhost rt status {rt}\n"
               f"agent:\n{agent[-6000:]}")
        print(f"\n  {len(boosts)} CPU 1: {prio.count(80)} at priority 80 ({len(irq)} woken from an interrupt); "
              f"{len(wakes)} WAKEs; host: {pr}, lead {rt.get('lead_us')} µs, hold {rt.get('hold_us')} µs, "
              f"error {rt.get('predict_error_us')}, applied late {rt.get('predict_apply_late_us')}; agent's "
              f"prediction - boost over {len(errors)} activations: median "
              f"{errors[len(errors) // 2] if errors else None} µs", file=sys.stderr)
        # cyclictest's activations each boost the VM (it is deboosted between them)...
        self.assertGreaterEqual(prio.count(80), self.LOOPS // 2, why)
        # ... its thread woken by its timer's interrupt.
        self.assertGreaterEqual(len(irq), prio.count(80) // 2, why)
        self.assertTrue(set(prio) <= {0, 80, 99}, why)  # 99: the guest's migration/N (stopper)
        # A prediction after (about) every activation (carried by the deboost, or a WAKE), each
        # the one the agent logged (D µs ahead) less the transit estimate, for priority 80 and
        # the activation that follows.
        self.assertGreaterEqual(len(wakes), self.LOOPS // 2, why)
        sent = wake_predictions(agent)
        self.assertGreaterEqual(sum(p == 80 for _, _, p in sent), len(sent) * 9 // 10, why)
        self.assertEqual([(w, p) for _, w, p in sent], wakes, why)
        for ahead_us, delay_us, p in sent:
            # cyclictest's 80; or, seen once in a run whose host lost 10% of its CPU time to its
            # hypervisor, the guest's migration/N stopper (99), as in the CPU 1 set above.
            self.assertIn(p, (80, 99), why)
            # cyclictest's next activation is at most its period (10 ms) ahead; the stopper's,
            # whose wake-ups have no period, at most the horizon (--predict-horizon-ms 1000).
            self.assertLessEqual(ahead_us, 10_000 if p == 80 else 1_000_000, why)
            self.assertTrue(0 < delay_us <= ahead_us <= delay_us + 5_000,
                            f"predicted {ahead_us} µs ahead, WAKE in {delay_us} µs\n{why}")
        self.assertNotIn("the host does not support WAKE", agent, why)
        self.assertNotIn("-> DENY(cpu: unsupported)", log)
        # The host planned them, boosted the VM ahead of the wake-ups (or found it boosted), and
        # the guest's CPU 1 at its wake-up confirmed most of them.
        self.assertGreaterEqual(pr.get("received", 0), self.LOOPS // 2, why)
        # A WAKE replaced by a newer one (or withdrawn) has nothing left to apply. The agent sends
        # one after every deboost, and cyclictest's main thread (SCHED_OTHER, which sleeps far
        # more than it runs, so the default budget mode keeps it watched) boosts and deboosts the
        # VM between activations: some 100 of 300 WAKEs were replaced in a run.
        left = pr["received"] - pr.get("cancelled", 0)
        self.assertGreaterEqual(left, self.LOOPS // 2, why)
        done = pr.get("applied", 0) + pr.get("covered", 0)
        self.assertGreaterEqual(done, left * 8 // 10, why)
        self.assertGreaterEqual(pr.get("confirmed", 0), done * 8 // 10, why)
        self.assertEqual(pr.get("denied", 0) + pr.get("refused", 0), 0, why)
        # The guest's confirmation comes within a few ms of the predicted wake-up (a prediction
        # off by a period, 10 ms, would be a wrong one).
        self.assertLess(abs(rt["predict_error_us"]["p50_us"]), 5_000, why)
        # The agent's own view: each prediction is for the activation that follows.
        self.assertGreaterEqual(len(errors), self.LOOPS // 2, why)
        self.assertLess(abs(errors[len(errors) // 2]), 2_000, errors)


class StandingPrediction(unittest.TestCase):
    """A periodic RT task's prediction stands, both sides: cyclictest -p 80 -i 10000 in the
    paper's mode (deboosted between activations), without the new-task heuristic (it would boost
    cyclictest's SCHED_OTHER main thread every period). After a few periods the agent tells the
    host the period once (a `WAKE` with bits 40-63); the host then boosts every period by itself
    (its status counts standing periods) and the guest's detector keeps the activations inside
    the host's boost silent (few `CPU 1` at priority 80 reach the daemon). Once cyclictest ends,
    the agent sees the windows stay empty and withdraws the prediction (`WAKE 0`): the host
    boosts no more."""

    LOOPS = 300

    def test_the_host_boosts_every_period_by_itself_and_stops_when_the_task_does(self):
        need_root(self)
        workload = "#!/bin/sh\n" + harness.agent_start(
            "-v --hold-periodic-max-us 0 --idle-deboost-ms 1 --watch-budget-ms 0 --watch-count 0") + f"""\
cyclictest -p 80 -i 10000 -l {self.LOOPS} -q >/dev/null
echo COSCHED-STANDING-DONE
sleep 2
echo COSCHED-STANDING-AFTER
sleep 0.5
""" + harness.agent_stop()
        with tempfile.TemporaryDirectory(prefix="cosched-vmtest-") as tmp:
            d = cb.Daemon(tmp, args=["-v"])
            seen = {}

            def on_line(line, _pid):
                mark = line.strip()
                if mark in ("COSCHED-STANDING-DONE", "COSCHED-STANDING-AFTER"):
                    vms = (d.status() or {}).get("vms", [])
                    seen[mark] = vms[0]["resources"]["cpu"].get("rt") if vms else None

            try:
                console, _ = cb.boot_guest(workload, sock=d.socket_dir / "e2e.sock", on_line=on_line)
            finally:
                d.stop()
            log = (Path(tmp) / "daemon.log").read_text()
        agent = agent_log(console)
        frames = daemon_frames(log)
        standing = [v for k, v in frames if k == "WAKE" and v >> 40]
        withdrawals = [i for i, (k, v) in enumerate(frames) if k == "WAKE" and v == 0]
        rt80 = [v for k, v in frames if k == "CPU" and v & 1 and v >> 8 & 0xff == 80]
        done, after = seen.get("COSCHED-STANDING-DONE") or {}, seen.get("COSCHED-STANDING-AFTER") or {}
        n_done = (done.get("predictions") or {}).get("standing", 0)
        n_after = (after.get("predictions") or {}).get("standing", 0)
        silent = [int(m) for m in re.findall(r"silent_boosts=(\d+)", agent)]
        why = (f"standing WAKEs {[(v & 0xffffffff, v >> 40) for v in standing]}, WAKE 0 at {withdrawals} of "
               f"{len(frames)} frames, {len(rt80)} CPU 1 at 80\nhost at the end {done}\nhost 2 s later {after}\n"
               f"agent:\n{agent[-6000:]}")
        print(f"\n  {len(standing)} standing WAKE(s), {len(rt80)} CPU 1 at priority 80 in {self.LOOPS} periods; host: "
              f"{n_done} standing periods at the end, {n_after} 2 s later; detector: {silent[-1:] } silent "
              f"activations", file=sys.stderr)
        # Told once (or a few times: a pattern re-anchored), for a 10 ms period.
        self.assertTrue(1 <= len(standing) <= 5, why)
        self.assertTrue(all(9_900 <= v >> 40 <= 10_100 for v in standing), why)
        # The host boosted most periods by itself, and the guest said nothing for them.
        self.assertGreaterEqual(n_done, self.LOOPS * 6 // 10, why)
        self.assertEqual((done.get("pending") or [None, None])[1], "standing", why)
        self.assertLessEqual(len(rt80), self.LOOPS // 5, why)
        self.assertTrue(silent and silent[-1] >= self.LOOPS * 6 // 10, why)
        # The task ended: withdrawn (WAKE 0), nothing pending. Either by the idle bound (300 ms,
        # 3 periods, "standing prediction withdrawn"), or sooner: cyclictest's exit can wake the
        # agent once more, and its CPU 0 then finds no prediction and withdraws the one standing
        # ("none predicted"; a CI run here took that path).
        self.assertTrue("standing prediction withdrawn" in agent or "next RT wake-up: none predicted" in agent, why)
        self.assertTrue(withdrawals, why)
        self.assertIsNone(after.get("pending"), why)
        self.assertLessEqual(n_after - n_done, 60, why)


class MemoryBandwidth(unittest.TestCase):
    """The guest's memory-bandwidth API end to end: an application in the guest asks with
    `cosched request-membw`, the agent relays `MEMBW`, the host admits it and answers, the
    application prints the answer. With the `simulated` backend the regulator then stops the
    busy vCPU through the freezer; with this host's default (no resctrl, no PMU) the answer is
    `unsupported`, and the host's status says why."""

    WORKLOAD = """#!/bin/sh
""" + harness.agent_start() + """(while :; do :; done) &
HOG=$!
echo "ASK 500"; cosched request-membw 500; echo "RC $?"
sleep 2
# The hog goes first: the rest runs on an idle vCPU, which the regulator leaves alone.
kill $HOG
echo "ASK 0"; cosched request-membw 0; echo "RC $?"
""" + harness.agent_stop()

    def run_guest(self, config):
        events = {}
        with tempfile.TemporaryDirectory(prefix="cosched-vmtest-") as tmp:
            trace = Path(tmp) / "membw.trace"
            # A busy vCPU moves 900 MB/s: within the VM's own share of 1000 MB/s (membw_share
            # 1000), so that its boot and its agent's start run at full speed (a share of 100
            # throttled them to a tenth: 45 s to reach the request), and twice a 500 grant.
            trace.write_text("0 * 900\n")
            d = cb.Daemon(tmp, config.replace("TRACE", str(trace)))

            def on_line(line, pid):
                if line == "ASK 0":
                    events["before_release"] = d.status()
                elif line.startswith("RC ") and "before_release" in events:
                    events["after_release"] = d.status()
            try:
                console, _ = cb.boot_guest(self.WORKLOAD, sock=d.socket_dir / "mb.sock", on_line=on_line)
            finally:
                d.stop()
        return console, events

    def test_a_guest_request_is_granted_and_the_simulated_regulator_throttles(self):
        need_root(self)
        console, ev = self.run_guest(
            "[membw]\nbackend = \"simulated\"\ntrace = \"TRACE\"\nguaranteed_mbps = 1000\nperiod_ms = 100\n"
            "reclaim = false\nbest_effort = false\n[vm.mb]\nmembw_share = 1000\n")
        lines = console.splitlines()
        self.assertIn("granted 500", lines, console)
        self.assertEqual(lines[lines.index("granted 500") + 1], "RC 0", console)
        st = ev["before_release"]
        self.assertEqual(st["membw"]["backend"], "simulated")
        self.assertTrue(st["membw"]["warning"].startswith("SIMULATED"), st["membw"])
        m = st["vms"][0]["membw"]
        self.assertEqual((m["effective_permille"], m["requested_permille"]), (500, 500), m)
        # 900 MB/s per vCPU-second against 50 MB per 100 ms: the busy vCPU is stopped after 56 ms
        # of run in every period.
        self.assertGreaterEqual(m["stats"]["throttles"], 5, m)
        # ...and stopped for real: the freezer confirmed the stops (a decision alone is not).
        self.assertGreater(m["stats"]["throttled_ns"], 0, m)
        self.assertIn("granted 0", lines, console)
        m = ev["after_release"]["vms"][0]["membw"]
        self.assertEqual((m["effective_permille"], m["requested_permille"]), (1000, None), m)
        self.assertIn("membw: asked 500‰, the host granted 500‰", agent_log(console))
        # The membw experiment's --real mode reads this status the same way.
        from experiments import membw as membw_exp
        rows = membw_exp.real_samples(st, "m", 1.0, names={"mb"})
        self.assertEqual(len(rows), 1, st)
        self.assertEqual((rows[0]["guarantee_mbps"], rows[0]["throttles"] >= 5), (500.0, True), rows)

    def test_with_this_hosts_default_backend_the_guest_is_told_unsupported(self):
        need_root(self)
        console, ev = self.run_guest("[membw]\nguaranteed_mbps = 1000\n")
        lines = console.splitlines()
        i = lines.index("ASK 500")
        self.assertTrue(lines[i + 1].startswith("cosched: error: denied unsupported: the host cannot regulate memory "
                                                "bandwidth"), console)
        self.assertEqual(lines[i + 2], "RC 1", console)
        why = ev["before_release"]["membw"]["unsupported"]
        self.assertIn("unsupported here because no resctrl at /sys/fs/resctrl", why)
        self.assertIn("perf_event_open(cache-misses) is refused", why)
        self.assertIsNone(ev["before_release"]["vms"][0]["membw"])

    def test_the_experiments_real_mode_stops_with_the_daemons_reason_without_counters(self):
        """`experiment.py membw --real`: here (no PMU) it stops at once with the daemon's reason;
        on a host with counters it runs (quick) and writes its summary."""
        need_root(self)
        with tempfile.TemporaryDirectory(prefix="cosched-vmtest-") as tmp:
            r = subprocess.run([sys.executable, str(BENCH / "experiment.py"), "membw", "--real", "5000", "--quick",
                                "--out", tmp], capture_output=True, text=True, timeout=1200)
            if r.returncode == 0:
                self.assertIn("real guests", (Path(tmp) / "summary.md").read_text())
            else:
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertIn("membw --real: the daemon cannot regulate memory bandwidth on this host: ", r.stderr)
                self.assertIn("perf_event_open(cache-misses) is refused", r.stderr)
