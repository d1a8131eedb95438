"""Experiment 6: daemon scale.

Synthetic VMs over real sockets: each is a process named qemu-system-x86_64 with real threads
(`CPU 0/TCG`, `call_rcu` and its main thread: what a minimal TCG QEMU has), and is its own guest:
it registers and sends CPU 1 / CPU 0 alternately at a fixed rate (`cosched-fake-qemu --drive`).
For 1 to 256 VMs we measure the daemon's CPU time per transition and its hint-to-applied latency
(from reading a frame to the last thread changed, measured inside the daemon).
"""

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt

import harness
from experiments.common import Output, log, md_table

NAME = "scale"
RATE = 200  # transitions per second per VM
FAKE = harness.REPO / "target/release/cosched-fake-qemu"
DAEMON_CONFIG = """[policy]
max_continuous_boost_ms = 0
max_boost_share_permille = 1000
rt_guard_max_share_permille = 0
max_boosted_vcpus = 100000
"""
COLUMNS = ["vms", "rate_per_vm", "transitions_per_s", "daemon_cpu_pct", "cpu_us_per_transition",
           "p50_us", "p99_us", "max_us", "samples"]


def plan(quick):
    """(VM counts, seconds measured per count)."""
    return ([1, 8], 2) if quick else ([1, 4, 16, 64, 128, 256], 10)


def probe(counts=(1, 16, 64), seconds=4):
    """The same measurement at a few counts, printed (for working on the daemon's hot path:
    `python3 -c 'import sys; sys.path.insert(0, "bench"); from experiments import scale; scale.probe()'`)."""
    global plan
    plan = lambda quick: (list(counts), seconds)  # noqa: E731
    return measure(False)


def machine_floor(n=3000):
    """What the kernel operations on a transition's path cost on this machine, measured the same
    way the daemon uses them: a frame that wakes a process on the other CPU and its answer, the
    same on one CPU, and one sched_setscheduler on a sleeping thread (Python's overhead, about
    0.2 µs a call here, included)."""
    import socket
    import threading

    def round_trip(cpus):
        a, b = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            os.sched_setaffinity(0, {cpus[1]})
            for _ in range(n):
                b.recv(16)
                b.send(b"x" * 16)
            os._exit(0)
        old = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {cpus[0]})
        try:
            t0 = time.perf_counter()
            for _ in range(n):
                a.send(b"y" * 16)
                a.recv(16)
            return 1e6 * (time.perf_counter() - t0) / n
        finally:
            os.sched_setaffinity(0, old)
            os.waitpid(pid, 0)
            a.close()
            b.close()

    done, tid = threading.Event(), []
    t = threading.Thread(target=lambda: (tid.append(threading.get_native_id()), done.wait()))
    t.start()
    while not tid:
        time.sleep(0.01)
    t0 = time.perf_counter()
    for _ in range(n):
        os.sched_setscheduler(tid[0], os.SCHED_RR, os.sched_param(1))
        os.sched_setscheduler(tid[0], os.SCHED_OTHER, os.sched_param(0))
    setsched = 1e6 * (time.perf_counter() - t0) / (2 * n)
    done.set()
    t.join()
    cpus = sorted(os.sched_getaffinity(0))
    return dict(cross_cpu_rt_us=round_trip((cpus[0], cpus[-1])), same_cpu_rt_us=round_trip((cpus[0], cpus[0])),
                setscheduler_us=setsched)


def frames(st):
    return sum(vm["counters"]["frames"] for vm in st["vms"])


def measure(quick, verbose=False):
    counts, seconds = plan(quick)
    rows = []
    with tempfile.TemporaryDirectory(prefix="cosched-scale-") as tmp:
        exe = Path(tmp) / "bin" / "qemu-system-x86_64"  # root-owned, 0755: a trusted QEMU
        exe.parent.mkdir()
        shutil.copy(FAKE, exe)
        os.chmod(exe, 0o755)
        (Path(tmp) / "daemon").mkdir()
        d = harness.Daemon(Path(tmp) / "daemon", DAEMON_CONFIG)
        try:
            for n in counts:
                procs = [subprocess.Popen([str(exe), "--socket", str(d.socket_dir / f"vm{i}.sock"), "--drive", str(RATE),
                                           "--thread", "CPU 0/TCG", "--thread", "call_rcu"],
                                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                         for i in range(n)]
                try:
                    deadline = time.time() + 60
                    while True:
                        st = d.status()
                        if sum(vm["registered"] for vm in st["vms"]) == n:
                            break
                        if time.time() > deadline:
                            raise RuntimeError(f"only {len(st['vms'])} of {n} synthetic VMs registered")
                        time.sleep(0.2)
                    time.sleep(1)  # steady state
                    st0, cpu0, t0 = d.status(), harness.cpu_time_s(d.proc.pid), time.monotonic()
                    time.sleep(seconds)
                    st1, cpu1, t1 = d.status(), harness.cpu_time_s(d.proc.pid), time.monotonic()
                finally:
                    for p in procs:
                        p.kill()
                    for p in procs:
                        p.wait()
                        p.stdin.close()
                # Let the daemon notice and restore them before the next count.
                deadline = time.time() + 30
                while d.status()["vms"] and time.time() < deadline:
                    time.sleep(0.2)
                transitions = frames(st1) - frames(st0)
                wall = t1 - t0
                cpu = cpu1 - cpu0
                lat = st1["latency"]
                rows.append(dict(vms=n, rate_per_vm=RATE, transitions_per_s=transitions / wall,
                                 daemon_cpu_pct=100 * cpu / wall,
                                 cpu_us_per_transition=1e6 * cpu / max(transitions, 1),
                                 p50_us=lat["p50_us"], p99_us=lat["p99_us"], max_us=lat["max_us"],
                                 samples=lat["recent"]))
                r = rows[-1]
                log(f"{n} VMs: {r['transitions_per_s']:.0f} transitions/s, daemon {r['daemon_cpu_pct']:.1f}% CPU "
                    f"({r['cpu_us_per_transition']:.1f} µs each), hint-to-applied p50 {r['p50_us']:.1f} "
                    f"p99 {r['p99_us']:.1f} µs")
        finally:
            d.stop()
    return rows


def plot(rows):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    xs = [r["vms"] for r in rows]
    a1.plot(xs, [r["p50_us"] for r in rows], marker="o", label="p50")
    a1.plot(xs, [r["p99_us"] for r in rows], marker="s", label="p99")
    a1.axhline(50, color="gray", linestyle=":", label="target: p99 <= 50 µs at 64 VMs")
    a1.set_ylabel("hint-to-applied latency (µs)")
    a2.plot(xs, [r["daemon_cpu_pct"] for r in rows], marker="o", color="tab:red", label="daemon CPU")
    a2.axhline(5, color="gray", linestyle=":", label="target: <= 5% at 64 VMs")
    a2.set_ylabel("% of one core")
    a1.set_yscale("log")
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.set_xticks(xs, [str(x) for x in xs])
        a.set_xlabel(f"synthetic VMs ({RATE} transitions/s each)")
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=8)
    fig.suptitle("cosched host daemon: cost and latency vs number of VMs")
    return fig


def main(quick, out=None, verbose=False, fresh=False):
    o = Output(NAME, quick, out, fresh)
    floor = machine_floor()
    log(f"machine floor: cross-CPU round trip {floor['cross_cpu_rt_us']:.1f} µs, same CPU "
        f"{floor['same_cpu_rt_us']:.1f} µs, sched_setscheduler {floor['setscheduler_us']:.2f} µs")
    rows = measure(quick, verbose)
    o.csv(rows, COLUMNS)
    o.png(plot(rows))
    at64 = next((r for r in rows if r["vms"] == 64), None)
    verdict = "64 VMs not measured in quick mode."
    if at64:
        verdict = (f"At 64 VMs: p99 {at64['p99_us']:.1f} µs (target <= 50: "
                   f"{'met' if at64['p99_us'] <= 50 else 'NOT met'}), daemon CPU {at64['daemon_cpu_pct']:.1f}% of one "
                   f"core (target <= 5%: {'met' if at64['daemon_cpu_pct'] <= 5 else 'NOT met'}).")
    last = rows[-1]
    o.summary("Host daemon scale", f"""
Synthetic VMs (processes with 3 real threads, over real sockets) each send {RATE} boost/deboost
transitions per second; every transition changes all 3 threads with `sched_setattr`.
Hint-to-applied is measured inside the daemon (from reading the frame to the last thread changed;
percentiles over its most recent 8192 transitions); CPU is the daemon's user + system time.

{md_table(rows, COLUMNS[:-1], ["VMs", "per VM /s", "transitions /s", "daemon CPU %", "µs CPU / transition",
                               "p50 µs", "p99 µs", "max µs"])}

{verdict}

Why, on this machine. The CPU target allows {1e6 * 0.05 / (64 * RATE):.1f} µs of daemon CPU per
transition. Measured at the start of this run, with the same kernel operations a transition
uses: one sched_setscheduler on a sleeping thread costs {floor['setscheduler_us']:.2f} µs (3 per
transition here), a 16-byte frame and its answer between two processes on different CPUs
{floor['cross_cpu_rt_us']:.1f} µs, on the same CPU {floor['same_cpu_rt_us']:.1f} µs. Each transition
is a frame that wakes the daemon from another CPU and an ACK that wakes the sender back, so the
wake-ups alone exceed the budget: this host is itself a VM (KVM_PVM), where a cross-CPU wake-up
(an IPI and an idle exit) costs tens of µs instead of a few. The CPU time per transition falls as
the VMs grow (from 1 to 64), most likely because one wake-up then often serves several frames. Past 64 VMs the
daemon nears saturation: at {last['vms']} VMs it uses {last['daemon_cpu_pct']:.0f}% of a core and serves
{last['transitions_per_s']:.0f} of the {last['vms'] * RATE} transitions/s asked, and its latency is queueing
(p50 {last['p50_us']:.0f} µs). Reaching the targets would
take a host where a wake-up costs ~5 µs, or a daemon that batches (one wake-up for many frames,
and one cgroup-level change instead of one call per thread).

**The papers** have no such measurement: their host side is a hypercall handled in the kernel.
""")
    return o.dir
