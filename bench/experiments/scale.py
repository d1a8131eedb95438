"""Experiment 6: daemon scale.

Synthetic VMs over real sockets: each is a process named qemu-system-x86_64 with 3 real threads
(`CPU 0/TCG`, `call_rcu` and its main thread: what a minimal TCG QEMU has), and is its own guest:
it registers and sends CPU 1 / CPU 0 alternately at a fixed rate (`cosched-fake-qemu --drive`),
and times each frame until its reply (ACK) comes back. For 1 to 256 VMs we measure the daemon's
CPU time per transition, whether it serves every transition, and its hint-to-applied latency
(from reading a frame to the last thread changed, measured inside the daemon; and from the VM's
write to the ACK read, measured by the VM: an upper bound that includes both wake-ups).

In the same run, before and after the VM sweep, `cosched-floor` times the system calls a
transition cannot avoid (epoll_wait + read of the frame, one sched_setattr per thread, the
reply's write), done bare on a socketpair whose peer is a process shaped like a synthetic VM:
the daemon's CPU per transition is reported as a ratio to that floor. At 64 VMs the latency is
measured twice more with the daemon and the VMs pinned: all on the daemon's CPU, and the VMs on
the other CPU.
"""

import csv
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt

import harness
from evaluation import NOT_JUDGED
from experiments.common import Output, log, md_table, read_csv, target

NAME = "scale"
RATE = 200  # transitions per second per VM
FAKE = harness.REPO / "target/release/cosched-fake-qemu"
FLOOR = harness.REPO / "target/release/cosched-floor"
DAEMON_CONFIG = """[policy]
max_continuous_boost_ms = 0
max_boost_share_permille = 1000
rt_guard_max_share_permille = 0
max_boosted_vcpus = 100000
"""
# The targets (issue): CPU per transition at most 1.5 x the floor; 256 VMs x 200/s all served;
# the same-CPU p99 at most 50 µs at 64 VMs.
RATIO_TARGET = 1.5
P99_TARGET_US = 50
LATENCY_VMS = 64
SERVED_VMS = 256
# The CPU target as first stated (% of one core at LATENCY_VMS x RATE), before it was stated against
# the floor: shown beside the floor's share, without a verdict.
FIRST_CPU_TARGET_PCT = 5
COST_KEYS = ["read_ns", "decode_ns", "coordinator_ns", "actuate_ns", "syscall_ns", "encode_ns", "write_ns", "loop_ns"]
COLUMNS = ["vms", "placement", "rate_per_vm", "asked_per_s", "transitions_per_s", "all_served", "sent", "acked",
           "denied", "unanswered", "threads_per_vm", "daemon_cpu_pct", "cpu_us_per_transition", "floor_us",
           "ratio_to_floor", "paced_floor_us", "ratio_to_paced_floor", "p50_us", "p99_us", "max_us", "samples", "e2e_p50_us", "e2e_p99_us", "e2e_max_us",
           *[f"cost_{k[:-3]}_us" for k in COST_KEYS], "cost_loop_other_us", "cost_outside_loop_us"]
FLOOR_COLUMNS = ["when", "placement", "cpu_us_per_transition", "read_us", "sched_setattr_us",
                 "sched_setattr_us_per_call", "write_us", "split_sum_us", "rtt_p50_us", "rtt_p99_us"]


def plan(quick):
    """(VM counts, seconds measured per count, VMs for the pinned latency runs, floor transitions)."""
    return ([1, 8], 2, 8, 3000) if quick else ([1, 4, 16, 64, 128, 256], 10, LATENCY_VMS, 20000)


def probe(counts=(1, 16, 64), seconds=4):
    """The same measurement at a few counts, printed (for working on the daemon's hot path:
    `python3 -c 'import sys; sys.path.insert(0, "bench"); from experiments import scale; scale.probe()'`)."""
    global plan
    plan = lambda quick: (list(counts), seconds, 0, 5000)  # noqa: E731
    return measure(False, floor_ref={})


# ---------------------------------------------------------------------------------------------
# The floor


def cpus():
    """(the daemon's CPU, the other one) for the pinned runs: the first and last allowed CPUs."""
    c = sorted(os.sched_getaffinity(0))
    return c[0], c[-1]


def run_floor(placement, transitions, hz=0):
    """One `cosched-floor` run (its JSON): placement "unpinned", "same-cpu" or "cross-cpu"; `hz`
    paces the frames (0: back to back)."""
    c0, c1 = cpus()
    warmup = max(500, transitions // 10) if hz == 0 else max(50, transitions // 10)
    args = [str(FLOOR), "--transitions", str(transitions), "--warmup", str(warmup), "--hz", str(hz)]
    if placement == "same-cpu":
        args += ["--same-cpu", "--cpus", f"{c0},{c0}"]
    elif placement == "cross-cpu":
        if c0 == c1:
            return None
        args += ["--cross-cpu", "--cpus", f"{c0},{c1}"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300,
                       preexec_fn=harness.dies_with_us(signal.SIGTERM))
    if r.returncode != 0:
        raise RuntimeError(f"cosched-floor {placement} failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def floors(when, transitions):
    out = {}
    for placement in ("unpinned", "same-cpu", "cross-cpu"):
        f = run_floor(placement, transitions)
        if not f:
            continue
        out[placement] = f
        s = f["split"]
        log(f"floor {when} ({placement}): {f['cpu_us_per_transition']:.1f} µs CPU per transition "
            f"(read incl. epoll_wait {s['read_us']:.1f}, sched_setattr {s['sched_setattr_us']:.1f} = "
            f"{len(f['threads'])} x {s['sched_setattr_us_per_call']:.2f}, write {s['write_us']:.1f}); "
            f"round trip p50 {f['rtt']['p50_us']:.1f} p99 {f['rtt']['p99_us']:.1f} µs")
    return out


# A single sender cannot pace frames faster than its round trip; above this the floor is the
# back-to-back one.
MAX_PACED_HZ = 20000


def paced_floors(rates, quick):
    """The unpinned floor with frames paced at each of `rates` per second (as many as the sweep's
    VMs send together), about 4 s of frames each: at low rates every transition is a wake-up
    from idle, which the back-to-back floor never pays. {rate: µs CPU per transition}."""
    out = {}
    for rate in sorted(set(rates)):
        if rate > MAX_PACED_HZ:
            continue
        n = min(3000 if quick else 20000, max(400 if quick else 800, int(rate * (2 if quick else 4))))
        f = run_floor("unpinned", n, hz=rate)
        out[rate] = f["cpu_us_per_transition"]
        log(f"floor paced at {rate}/s: {out[rate]:.1f} µs CPU per transition ({n} transitions)")
    return out


def floor_rows(before, after):
    rows = []
    for when, fl in (("before", before), ("after", after)):
        for placement, f in fl.items():
            s = f["split"]
            rows.append(dict(when=when, placement=placement, cpu_us_per_transition=f["cpu_us_per_transition"],
                             read_us=s["read_us"], sched_setattr_us=s["sched_setattr_us"],
                             sched_setattr_us_per_call=s["sched_setattr_us_per_call"], write_us=s["write_us"],
                             split_sum_us=s["sum_us"],
                             rtt_p50_us=f["rtt"]["p50_us"], rtt_p99_us=f["rtt"]["p99_us"]))
    return rows


def floor_reference(before, after):
    """Per placement: the floor the daemon is held to, the mean of the runs before and after."""
    ref = {}
    for placement in ("unpinned", "same-cpu", "cross-cpu"):
        xs = [fl[placement]["cpu_us_per_transition"] for fl in (before, after) if placement in fl]
        if xs:
            ref[placement] = statistics.mean(xs)
    return ref


# ---------------------------------------------------------------------------------------------
# The daemon's status (field names have moved before: look in more than one place)


def vm_frames(vm):
    for path in (("counters", "frames"), ("resources", "cpu", "counters", "frames")):
        v = vm
        for k in path:
            v = v.get(k) if isinstance(v, dict) else None
        if isinstance(v, (int, float)):
            return v
    raise RuntimeError(f"no frame counter in the daemon's VM status: {sorted(vm)}")


def frames(st):
    return sum(vm_frames(vm) for vm in st.get("vms", []))


def cost_of(st):
    c = (st.get("daemon") or {}).get("cost")
    return c if isinstance(c, dict) and "frames" in c else None


def proc_cpu_s(pid):
    """CPU time of a process so far, in seconds, from the scheduler's per-thread runtime
    (ns resolution); /proc/PID/stat (ticks) when that is not available."""
    total, found = 0.0, False
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return harness.cpu_time_s(pid)
    for tid in tids:
        try:
            for line in Path(f"/proc/{pid}/task/{tid}/sched").read_text().splitlines():
                if line.startswith("se.sum_exec_runtime"):
                    total += float(line.split(":")[1]) / 1e3
                    found = True
                    break
        except OSError:
            continue
    return total if found else harness.cpu_time_s(pid)


def tids_of(pid):
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def pin_all(pids, cpu, saved):
    """Pins every thread of `pids` (processes this experiment started) to `cpu`; the previous
    masks go to `saved` (tid -> mask) to be put back by unpin()."""
    for pid in pids:
        for tid in tids_of(pid):
            try:
                saved.setdefault(tid, os.sched_getaffinity(tid))
                os.sched_setaffinity(tid, {cpu})
            except OSError:
                pass  # the thread has exited


def unpin(saved):
    for tid, mask in saved.items():
        try:
            os.sched_setaffinity(tid, mask)
        except OSError:
            pass
    saved.clear()


def pct(xs, p):
    return xs[round((len(xs) - 1) * p)] if xs else 0.0


# ---------------------------------------------------------------------------------------------
# The measurement


def tell(procs, cmd):
    for p in procs:
        try:
            p.stdin.write(cmd + "\n")
            p.stdin.flush()
        except OSError:
            pass


def measure_count(d, exe, n, seconds, placement="unpinned", floor_ref=None):
    """n synthetic VMs for `seconds`; placement "unpinned", or "same-cpu" / "cross-cpu" (the
    daemon on the first CPU, the VMs on the same or the other one). Returns the row."""
    c0, c1 = cpus()
    procs = [subprocess.Popen([str(exe), "--socket", str(d.socket_dir / f"vm{i}.sock"), "--drive", str(RATE),
                               "--thread", "CPU 0/TCG", "--thread", "call_rcu"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              preexec_fn=harness.dies_with_us(signal.SIGKILL))
             for i in range(n)]
    saved = {}
    try:
        deadline = time.time() + 60
        while True:
            st = d.status()
            if sum(bool(vm.get("registered")) for vm in st["vms"]) == n:
                break
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"only {len(st['vms'])} of {n} synthetic VMs registered")
            time.sleep(0.2)
        threads = sorted({len(vm.get("threads", [])) for vm in st["vms"]})
        if placement != "unpinned":
            pin_all([d.proc.pid], c0, saved)
            pin_all([p.pid for p in procs], c0 if placement == "same-cpu" else c1, saved)
        time.sleep(1)  # steady state
        tell(procs, "mark")
        st0, cpu0, t0 = d.status(), proc_cpu_s(d.proc.pid), time.monotonic()
        time.sleep(seconds)
        st1, cpu1, t1 = d.status(), proc_cpu_s(d.proc.pid), time.monotonic()
        tell(procs, "stop")
        time.sleep(1)  # the replies still on their way
        reports = []
        for p in procs:
            tell([p], "report")
            line = p.stdout.readline()
            reports.append(json.loads(line) if line else dict(sent=0, acked=0, denied=0, unanswered=0, rtt_us=[]))
    finally:
        unpin(saved)  # the daemon's threads back to what they had; the VMs go anyway
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
            p.stdin.close()
            p.stdout.close()
    # Let the daemon notice and restore them before the next count.
    deadline = time.time() + 30
    while d.status()["vms"] and time.time() < deadline:
        time.sleep(0.2)

    transitions = frames(st1) - frames(st0)
    wall, cpu = t1 - t0, cpu1 - cpu0
    # The frames are counted on the daemon's clock, between its two status snapshots: their
    # window is the daemon's uptime between them, not the time between the two status calls'
    # returns, which differ by how long each waited for the busy daemon (measured that way, the
    # rate at 256 VMs came out 1.4% above what the VMs sent).
    u0, u1 = ((s.get("daemon") or {}).get("uptime_s") for s in (st0, st1))
    window = u1 - u0 if u0 is not None and u1 is not None and u1 > u0 else wall
    lat = st1.get("latency", {})
    sent = sum(r["sent"] for r in reports)
    acked = sum(r["acked"] for r in reports)
    denied = sum(r["denied"] for r in reports)
    unanswered = sum(r["unanswered"] for r in reports)
    rtt = sorted(x for r in reports for x in r["rtt_us"])
    floor_us = (floor_ref or {}).get(placement)
    cpu_us = 1e6 * cpu / max(transitions, 1)
    # Asked: each VM's frames over its own window, from the `mark` to the `stop` it read, by its
    # own clock (the 256 VMs read them up to a few ms apart, and a busy one reads them late).
    asked = sum(r["sent"] / r["window_s"] for r in reports if r.get("window_s"))
    row = dict(vms=n, placement=placement, rate_per_vm=RATE, asked_per_s=asked,
               transitions_per_s=transitions / window, all_served=(sent > 0 and acked == sent),
               sent=sent, acked=acked, denied=denied, unanswered=unanswered,
               threads_per_vm="/".join(map(str, threads)),
               daemon_cpu_pct=100 * cpu / wall, cpu_us_per_transition=cpu_us,
               floor_us=floor_us if floor_us else "", ratio_to_floor=cpu_us / floor_us if floor_us else "",
               p50_us=lat.get("p50_us", 0.0), p99_us=lat.get("p99_us", 0.0),
               # The largest over this count's VMs (each VM's maximum since it connected).
               max_us=max((vm.get("latency", {}).get("max_us", 0.0) for vm in st1["vms"]), default=0.0),
               samples=lat.get("recent", 0),
               e2e_p50_us=pct(rtt, 0.5), e2e_p99_us=pct(rtt, 0.99), e2e_max_us=rtt[-1] if rtt else 0.0)
    c0s, c1s = cost_of(st0), cost_of(st1)
    if c0s and c1s and c1s["frames"] > c0s["frames"]:
        df = c1s["frames"] - c0s["frames"]
        for k in COST_KEYS:
            row[f"cost_{k[:-3]}_us"] = (c1s.get(k, 0) - c0s.get(k, 0)) / df / 1e3
        parts = sum(row[f"cost_{k}_us"] for k in ("read", "decode", "coordinator", "actuate", "encode", "write"))
        row["cost_loop_other_us"] = row["cost_loop_us"] - parts
        # Daemon CPU per transition beyond its loop turns: epoll_wait, status requests, the
        # kernel's wake-up work charged to it.
        row["cost_outside_loop_us"] = cpu_us - row["cost_loop_us"]
    r = row
    log(f"{n} VMs ({placement}): asked {r['asked_per_s']:.0f}/s, served {r['transitions_per_s']:.0f}/s "
        f"({'every transition answered' if r['all_served'] else f'{acked} of {sent} answered, {denied} denied'}), "
        f"{threads} threads/VM; daemon {r['daemon_cpu_pct']:.1f}% CPU, {cpu_us:.1f} µs per transition"
        + (f" = {r['ratio_to_floor']:.2f} x floor before ({floor_us:.1f} µs)" if floor_us else "")
        + f"; hint-to-applied (daemon) p50 {r['p50_us']:.1f} p99 {r['p99_us']:.1f} max {r['max_us']:.0f} µs, "
        f"write-to-ACK (VM) p50 {r['e2e_p50_us']:.1f} p99 {r['e2e_p99_us']:.1f} max {r['e2e_max_us']:.0f} µs")
    log("   breakdown: " + breakdown_line(r))
    return row


def breakdown_line(r):
    if "cost_loop_us" not in r or r.get("cost_loop_us") in ("", None):
        return "not reported by this daemon"
    return (f"per transition (µs): read {r['cost_read_us']:.2f}, decode {r['cost_decode_us']:.2f}, "
            f"coordinator {r['cost_coordinator_us']:.2f}, actuate {r['cost_actuate_us']:.2f} "
            f"(sched_setattr {r['cost_syscall_us']:.2f}), encode {r['cost_encode_us']:.2f}, write {r['cost_write_us']:.2f}; "
            f"whole loop turn {r['cost_loop_us']:.2f} (of which other {r['cost_loop_other_us']:.2f}); "
            f"outside the loop (epoll_wait, wake-ups) {r['cost_outside_loop_us']:.2f}")


def measure(quick, verbose=False, floor_ref=None):
    counts, seconds, latency_vms, _ = plan(quick)
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
                rows.append(measure_count(d, exe, n, seconds, "unpinned", floor_ref))
            if latency_vms and len(set(cpus())) == 2:
                for placement in ("same-cpu", "cross-cpu"):
                    rows.append(measure_count(d, exe, latency_vms, seconds, placement, floor_ref))
        finally:
            d.stop()
    return rows


# ---------------------------------------------------------------------------------------------
# The old numbers and the report


# The last results before the daemon's hot-path work: what "before" means here.
OLD_RESULTS_COMMIT = "5a48982"


def old_rows():
    """The results committed before the daemon's hot-path work, by VM count."""
    try:
        text = subprocess.run(["git", "-C", str(harness.REPO), "show", f"{OLD_RESULTS_COMMIT}:results/scale/data.csv"],
                              capture_output=True, text=True, check=True).stdout
        commit = subprocess.run(["git", "-C", str(harness.REPO), "log", "-1", "--format=%h %cs", OLD_RESULTS_COMMIT],
                                capture_output=True, text=True).stdout.strip()
    except (subprocess.CalledProcessError, OSError):
        return {}, ""
    out = {}
    for r in csv.DictReader(text.splitlines()):
        if r.get("placement", "unpinned") != "unpinned":
            continue
        out[int(r["vms"])] = {k: float(v) for k, v in r.items() if k in (
            "transitions_per_s", "daemon_cpu_pct", "cpu_us_per_transition", "p50_us", "p99_us", "max_us") and v}
    return out, commit


def plot(rows, old, floor_ref):
    sweep = [r for r in rows if r["placement"] == "unpinned"]
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(18, 4.8))
    xs = [r["vms"] for r in sweep]
    a1.plot(xs, [r["p50_us"] for r in sweep], marker="o", label="p50 (daemon: read to applied)")
    a1.plot(xs, [r["p99_us"] for r in sweep], marker="s", label="p99 (daemon: read to applied)")
    a1.plot(xs, [r["e2e_p99_us"] for r in sweep], marker="^", label="p99 (VM: write to ACK)")
    ox = sorted(old)
    if ox:
        a1.plot(ox, [old[x]["p99_us"] for x in ox], marker="s", color="gray", linestyle="--", alpha=0.6,
                label="p99 (daemon), before")
    for r in rows:
        if r["placement"] != "unpinned":
            a1.scatter([r["vms"]], [r["p99_us"]], marker="*" if r["placement"] == "same-cpu" else "x", s=80,
                       zorder=5, label=f"p99 (daemon), {r['placement']}")
    a1.axhline(P99_TARGET_US, color="gray", linestyle=":",
               label=f"target: p99 (daemon) <= {P99_TARGET_US} µs at {LATENCY_VMS} VMs, same CPU and unpinned")
    a1.set_ylabel("hint-to-applied latency (µs)")
    a1.set_yscale("log")
    a2.plot(xs, [r["cpu_us_per_transition"] for r in sweep], marker="o", color="tab:red", label="daemon CPU / transition")
    if ox:
        a2.plot(ox, [old[x]["cpu_us_per_transition"] for x in ox], marker="o", color="gray", linestyle="--",
                alpha=0.6, label="before")
    # The target the summary judges: the floor paced at each count's rate, times RATIO_TARGET.
    paced = [(r["vms"], r["paced_floor_us"]) for r in sweep if r.get("paced_floor_us", "") != ""]
    if paced:
        a2.plot([v for v, _ in paced], [f for _, f in paced], marker=".", color="black",
                label="floor paced at the count's rate (bare system calls)")
        a2.plot([v for v, _ in paced], [RATIO_TARGET * f for _, f in paced], marker=".", color="black", linestyle=":",
                label=f"target: <= {RATIO_TARGET} x the paced floor")
    if "unpinned" in floor_ref:
        a2.axhline(floor_ref["unpinned"], color="gray", linestyle="-", linewidth=0.8, alpha=0.6,
                   label="back-to-back floor (for reference; not the target's)")
    a2.set_ylabel("µs of daemon CPU per transition")
    a2.set_ylim(bottom=0)
    a3.plot(xs, [100 * r["acked"] / r["sent"] if r["sent"] else 0 for r in sweep], marker="o", color="tab:green",
            label="frames answered by an ACK, % of sent")
    a3.plot(xs, [100 * r["transitions_per_s"] / r["asked_per_s"] if r["asked_per_s"] else 0 for r in sweep],
            marker="s", color="tab:blue", label="processed per second, % of asked")
    if ox:
        a3.plot(ox, [100 * old[x]["transitions_per_s"] / (x * RATE) for x in ox], marker="s", color="gray",
                linestyle="--", alpha=0.6, label="processed per second, % of asked, before")
    a3.axhline(100, color="black", linestyle=":", label=f"target: every transition served at {SERVED_VMS} VMs")
    a3.set_ylabel("% of the transitions")
    for a in (a1, a2, a3):
        a.set_xscale("log", base=2)
        ticks = sorted(set(xs) | set(ox))
        a.set_xticks(ticks, [str(x) for x in ticks])
        a.set_xlabel(f"synthetic VMs ({RATE} transitions/s each)")
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=7)
    fig.suptitle("cosched host daemon: cost and latency vs number of VMs")
    return fig


def measure_run(quick, verbose=False):
    """The floors before the sweep, the sweep and the pinned runs, the floors after, the paced
    floors: (rows for data.csv, rows for floor.csv)."""
    floor_n = plan(quick)[3]
    before = floors("before", floor_n)
    ref0 = floor_reference(before, {})
    rows = measure(quick, verbose, floor_ref=ref0)
    after = floors("after", floor_n)
    ref = floor_reference(before, after)
    paced = paced_floors([r["vms"] * RATE for r in rows if r["placement"] == "unpinned"], quick)
    for r in rows:  # the ratio to the floor measured before and after, averaged
        f = ref.get(r["placement"])
        if f:
            r["floor_us"], r["ratio_to_floor"] = f, r["cpu_us_per_transition"] / f
        if r["placement"] == "unpinned" and f:
            # Paced at this count's rate; above what one sender can pace, the back-to-back floor.
            pf = paced.get(r["vms"] * RATE, f)
            r["paced_floor_us"], r["ratio_to_paced_floor"] = pf, r["cpu_us_per_transition"] / pf
    return rows, floor_rows(before, after)


def stored(directory):
    """The rows of a run's data.csv (results/scale), as measure_run() returned them (its floor.csv,
    the floors, is read by main() from the same directory)."""
    return read_csv(Path(directory) / "data.csv", text=("placement", "threads_per_vm"))


def floor_ref_of(frows):
    """Per placement: the floor the daemon is held to, the mean of the runs before and after."""
    out = {}
    for placement in ("unpinned", "same-cpu", "cross-cpu"):
        xs = [r["cpu_us_per_transition"] for r in frows if r["placement"] == placement]
        if xs:
            out[placement] = statistics.mean(xs)
    return out


def targets(rows, ref):
    """The targets table, judged from the rows: CPU per transition against the paced floor, 256 VMs
    all served, the p99 at 64 VMs (same CPU; unpinned); figures without a target beside them."""
    sweep = [r for r in rows if r["placement"] == "unpinned"]
    pinned = {r["placement"]: r for r in rows if r["placement"] != "unpinned"}
    once = "one run"
    out = []
    statement = f"daemon CPU per transition ≤ {RATIO_TARGET}× the floor paced at the same rate, at every VM count"
    paced = [r for r in sweep if r.get("ratio_to_paced_floor", "") != ""]
    if paced:
        bad = [r for r in paced if r["ratio_to_paced_floor"] > RATIO_TARGET]
        out.append(target(statement, "by VM count: " + ", ".join(f"{r['vms']}: {r['ratio_to_paced_floor']:.2f}×"
                                                                 for r in paced)
                          + (f"; over at {', '.join(str(r['vms']) for r in bad)} VM{'s' if len(bad) > 1 or bad[0]['vms'] > 1 else ''}"
                             if bad else ""), not bad, once))
    else:
        out.append(target(statement, "not measured in this run", NOT_JUDGED))
    b2b = [r for r in sweep if r.get("ratio_to_floor", "") != ""]
    if b2b and "unpinned" in ref:
        out.append(target(f"for reference, the same ratio to the back-to-back floor ({ref['unpinned']:.1f} µs: every "
                          "frame already waiting, no wake-up from idle; not the target's floor)",
                          "by VM count: " + ", ".join(f"{r['vms']}: {r['ratio_to_floor']:.2f}×" for r in b2b), None, once))
    at = next((r for r in sweep if r["vms"] == SERVED_VMS), None)
    statement = f"{SERVED_VMS} VMs × {RATE} transitions/s: every transition served"
    out.append(target(statement, f"{at['acked']} of {at['sent']} frames answered by an ACK ({at['denied']} denied, "
                      f"{at['unanswered']} unanswered); {at['transitions_per_s']:.0f} of {at['asked_per_s']:.0f} asked "
                      "per second processed", bool(at["all_served"]), once) if at else
               target(statement, "not measured in this run", NOT_JUDGED))
    same = pinned.get("same-cpu")
    statement = (f"hint-to-applied p99 (inside the daemon) ≤ {P99_TARGET_US} µs at {LATENCY_VMS} VMs, the VMs on the "
                 "daemon's CPU")
    if same and same["vms"] == LATENCY_VMS:
        out.append(target(statement, f"{same['p99_us']:.1f} µs", same["p99_us"] <= P99_TARGET_US, once))
    else:
        out.append(target(statement, "not measured in this run", NOT_JUDGED))
    at = next((r for r in sweep if r["vms"] == LATENCY_VMS), None)
    statement = f"hint-to-applied p99 (inside the daemon) ≤ {P99_TARGET_US} µs at {LATENCY_VMS} VMs, unpinned"
    out.append(target(statement, f"{at['p99_us']:.1f} µs", at["p99_us"] <= P99_TARGET_US, once) if at else
               target(statement, "not measured in this run", NOT_JUDGED))
    if same and same["vms"] == LATENCY_VMS:
        out.append(target(f"for reference, the same-CPU p99 from the VM's write to its ACK (adds the wake-ups of "
                          f"the daemon and of the VM; the target is on the daemon's measure)",
                          f"{same['e2e_p99_us']:.1f} µs", None, once))
    if at:
        pf = at.get("paced_floor_us", "")
        out.append(target(f"the first statement of the CPU target: ≤ {FIRST_CPU_TARGET_PCT}% of one core at "
                          f"{LATENCY_VMS} VMs × {RATE} transitions/s (now judged against the floor, above)",
                          f"{at['daemon_cpu_pct']:.1f}% of a core"
                          + (f"; the bare system calls paced at that rate alone take "
                             f"{pf * at['transitions_per_s'] / 1e4:.1f}%" if pf != "" else ""), None, once))
    return out


def main(quick, out=None, verbose=False, fresh=False, rows=None):
    """Measures, or (rows: stored() of an earlier run) renders summary and plot again from its data
    (data.csv, and the floors of floor.csv in the same directory)."""
    o = Output(NAME, quick, out, fresh)
    counts, seconds, latency_vms, floor_n = plan(quick)
    if rows is None:
        rows, frows = measure_run(quick, verbose)
        o.csv(rows, COLUMNS)
        o.csv(frows, FLOOR_COLUMNS, "floor.csv")
    else:
        frows = read_csv(o.dir / "floor.csv", text=("when", "placement")) if (o.dir / "floor.csv").exists() else []
        if not (o.dir / "data.csv").exists():
            o.csv(rows, COLUMNS)
    ref = floor_ref_of(frows)
    old, old_commit = old_rows()
    o.png(plot(rows, old, ref))

    sweep = [r for r in rows if r["placement"] == "unpinned"]
    pinned = {r["placement"]: r for r in rows if r["placement"] != "unpinned"}

    # Old and new side by side.
    table = []
    for r in sweep:
        b = old.get(r["vms"], {})
        ob = lambda k: b.get(k, "")  # noqa: E731
        table.append({
            "vms": r["vms"], "asked": r["asked_per_s"], "served_old": ob("transitions_per_s"),
            "served": r["transitions_per_s"], "all": "yes" if r["all_served"] else f"no ({r['acked']}/{r['sent']})",
            "cpu_old": ob("daemon_cpu_pct"), "cpu": r["daemon_cpu_pct"],
            "us_old": ob("cpu_us_per_transition"), "us": r["cpu_us_per_transition"],
            "ratio": r["ratio_to_floor"], "paced": r.get("paced_floor_us", ""),
            "ratio_paced": r.get("ratio_to_paced_floor", ""), "p50_old": ob("p50_us"), "p50": r["p50_us"],
            "p99_old": ob("p99_us"), "p99": r["p99_us"], "max_old": ob("max_us"), "max": r["max_us"],
            "e2e50": r["e2e_p50_us"], "e2e99": r["e2e_p99_us"],
        })
    main_table = md_table(table, ["vms", "asked", "served_old", "served", "all", "cpu_old", "cpu", "us_old", "us",
                                  "ratio", "paced", "ratio_paced", "p50_old", "p50", "p99_old", "p99", "max_old",
                                  "max", "e2e50", "e2e99"],
                          ["VMs", "asked /s", "served /s before", "served /s", "all served", "CPU % before",
                           "CPU %", "µs / tr. before", "µs / tr.", "x floor", "paced floor µs", "x paced floor",
                           "p50 before", "p50", "p99 before",
                           "p99", "max before", "max", "VM p50", "VM p99"])
    pin_table = md_table([dict(r, all="yes" if r["all_served"] else f"no ({r['acked']}/{r['sent']})") for r in pinned.values()],
                         ["placement", "vms", "transitions_per_s", "all", "daemon_cpu_pct", "cpu_us_per_transition",
                          "floor_us", "ratio_to_floor", "p50_us", "p99_us", "max_us", "e2e_p50_us", "e2e_p99_us",
                          "e2e_max_us"],
                         ["placement", "VMs", "served /s", "all served", "CPU %", "µs / tr.", "floor µs", "x floor",
                          "p50", "p99", "max", "VM p50", "VM p99", "VM max"]) if pinned else "(not measured)"
    fl_table = md_table(frows, FLOOR_COLUMNS,
                        ["when", "placement", "µs CPU / transition", "epoll_wait + read", "sched_setattr",
                         "per call", "write", "sum of the split", "round trip p50 µs", "p99 µs"])
    have_cost = any("cost_loop_us" in r for r in rows)
    if have_cost:
        cost_rows = [r for r in rows if "cost_loop_us" in r]
        cost_table = md_table(cost_rows, ["vms", "placement", "cpu_us_per_transition", "cost_read_us", "cost_decode_us",
                                          "cost_coordinator_us", "cost_actuate_us", "cost_syscall_us", "cost_encode_us",
                                          "cost_write_us", "cost_loop_us", "cost_loop_other_us", "cost_outside_loop_us"],
                              ["VMs", "placement", "CPU µs / tr.", "read", "decode", "coordinator", "actuate",
                               "of which sched_setattr", "encode", "write", "loop turn", "loop other",
                               "outside the loop"])
        cost_text = f"""The daemon's own accounting (`status.daemon.cost`, deltas over the window divided by the
frames; wall time inside its single thread, which runs at `SCHED_FIFO 99` and is seldom
preempted, so close to CPU time), in µs per transition. *Read* and *write* are the `read` and
`write` calls on the VMs' sockets, *actuate* the thread changes (of which the `sched_setattr`
calls themselves), *decode* / *encode* the frames. *Loop turn* is the whole of each turn of its
event loop but the wait: it contains the columns before it; *loop other* is what of it no
column names (timers, rescans, bookkeeping). *Outside the loop* is the CPU per transition minus
the loop turn: `epoll_wait` and the kernel work of being woken, plus the two status requests of
the window.

{cost_table}"""
    else:
        cost_text = "The per-transition cost breakdown: not reported by this daemon (no `status.daemon.cost`)."
    floor_cross = ref.get("cross-cpu")
    floor_same = ref.get("same-cpu")
    def floor_of(placement, when="before"):
        return next((r for r in frows if (r["when"], r["placement"]) == (when, placement)), {})
    fb = floor_of("unpinned")
    old_note = (f"*Before*: the results committed at {old_commit}, before the daemon's hot-path work. Their synthetic VMs had 5 "
                "threads, not 3 as that summary said (main, `CPU 0/TCG`, `call_rcu`, a thread polling for SIGUSR1 "
                "and one reading the replies; the current daemon changes all 5 on each transition), and their idle "
                "threads woke every few milliseconds. Now a synthetic VM is its main "
                "thread (frames, replies, commands) and 2 threads that block: 3 `sched_setattr` calls per "
                "transition instead of 5. Their *max* was the daemon's maximum since it started, not per VM count."
                if old else "*Before*: no committed results to compare with.")
    last = sweep[-1]
    o.summary("Host daemon scale", f"""
Synthetic VMs (processes with 3 real threads, over real sockets) each send {RATE} boost/deboost
transitions per second; every transition changes all 3 threads with `sched_setattr`
(threads per VM seen by the daemon: {', '.join(sorted({str(r['threads_per_vm']) for r in rows}))}).
*Hint-to-applied* is measured inside the daemon (from reading the frame to the last thread
changed; percentiles over its most recent 8192 transitions; *max*: the largest of the count's
VMs' maxima, each since the VM connected); *VM*
columns are measured by each synthetic VM, from writing a frame to reading its ACK (written
once the threads are changed): an upper bound that adds the wake-up of the daemon and of the VM.
CPU is the daemon's user + system time (the scheduler's runtime of its threads), per frame it
processed. *Asked* is what the VMs sent per second (the sum of each VM's frames over its own
window, from the `mark` to the `stop` it read, by its own clock),
*served* what the daemon processed per second between its two status snapshots, on its own
clock; *all served* means every frame sent in the window got its ACK (within 1 s of the end).

{main_table}

{old_note}

### The floor

`target/release/cosched-floor`, run before and after the sweep: the system calls a transition
cannot avoid, bare, the way the daemon makes them. A thread at `SCHED_FIFO 99` (like the daemon)
waits in `epoll_wait` (edge-triggered) on one end of a unix socketpair, reads the 16-byte frame
with one non-blocking `read`, makes one `sched_setattr` per thread (`SCHED_RR 1|RESET_ON_FORK` or
`SCHED_OTHER`) on the 3 threads of the peer process (shaped like a synthetic VM: its main thread
sends the frame and waits for the reply, `CPU 0/TCG` and `call_rcu` sleep) and writes a
16-byte reply. CPU time is that thread's `getrusage(RUSAGE_THREAD)` user + system over
{floor_n} transitions; the split comes from a second pass with the thread's CPU clock read between the
calls (its own cost taken off; *epoll_wait + read* includes the context switch of being woken;
a separate pass, so its sum differs from the total by this host's run-to-run noise). The round
trip is the peer's, from its write to the reply read.

{fl_table}

The daemon's CPU per transition is held to the mean of the floors before and after for the
same placement (unpinned for the sweep: {ref.get('unpinned', 0):.1f} µs; same CPU
{(floor_same or 0):.1f} µs; across CPUs {(floor_cross or 0):.1f} µs).
Back to back, every frame is already waiting when the last reply is written: the floor never
wakes from idle. At the sweep's low rates the daemon does, for nearly every frame. So the sweep is
also held to the *paced floor*: the same unpinned run with `--hz` set to the rate the count's VMs
send together ({RATE} x VMs per second, about 4 s of frames; above {MAX_PACED_HZ}/s, which one
sender cannot pace, the back-to-back floor). The target is judged on the floor at the same rate,
and both ratios are printed.

### Latency with the daemon and the VMs pinned ({latency_vms} VMs)

The daemon's threads on the first CPU it may use; the VMs' threads on the same CPU (*same-cpu*: every frame
wakes the daemon, which preempts its sender) or on the last (*cross-cpu*: every frame and
every ACK is a wake-up across CPUs). The affinities are put back after each run.

{pin_table}

### Where the daemon's time goes

{cost_text}

### Why, on this machine

The floor's *epoll_wait + read* part ({fb.get('read_us', 0):.1f} µs unpinned, before) is mostly the
kernel work of a wake-up: this host is itself a VM (KVM_PVM), where a cross-CPU wake-up (an IPI
and an idle exit) costs tens of µs of wall time instead of a few, and a system call or a context
switch costs more than on bare metal. The round trips above show it: a 16-byte frame and its
reply take {floor_of('cross-cpu').get('rtt_p50_us', 0):.1f} µs across CPUs and
{floor_of('same-cpu').get('rtt_p50_us', 0):.1f} µs on one CPU (p50). A daemon that serves
several frames per wake-up can go under the one-frame-per-wake-up floor; the `sched_setattr`
calls ({fb.get('sched_setattr_us_per_call', 0):.2f} µs each here) it cannot batch. At {last['vms']} VMs the
daemon uses {last['daemon_cpu_pct']:.0f}% of a core and serves {last['transitions_per_s']:.0f} of the
{last['asked_per_s']:.0f} transitions/s asked (p50 {last['p50_us']:.0f} µs inside the daemon).

**The papers** have no such measurement: their host side is a hypercall handled in the kernel.
""", targets=targets(rows, ref))
    return o.dir
