"""Thread discovery: what seeing threads come and go with host BPF (`thread_events = true`) costs
and buys against re-reading boosted VMs' thread lists every 100 ms (`thread_events = false`), in one
run: the daemon's CPU with N boosted, idle synthetic VMs (3 named threads each), and how long a
thread born in a boosted VM waits before it is boosted too (the fake QEMU starts it within ~2 ms
of the signal: that is part of the figure).

Run as root from the repository:
    /usr/bin/python3 bench/thread_discovery_bench.py [N ...] [--out DIR]     (default N: 16 64)
    /usr/bin/python3 bench/thread_discovery_bench.py --render [--out DIR]    (no root: summary and
                                                                              plot again from data.csv)
Writes to results/thread-discovery (or DIR): data.csv (one row per new thread timed: the VM
count, the mechanism, the daemon's CPU over 10 s, the delay), output.txt (what it printed),
summary.md (the targets table, judged from data.csv), plot.png, and manifest.json
(bench/manifest.py).

Targets, judged only where the daemon reported host BPF (tp_btf, raw_tracepoint or tracepoint) for
its thread events: where BPF was refused it falls back to the rescans silently, and the rescans
would meet both (a rescan boosts a new thread within ~100 ms; the CPU comparison would be rescans
against rescans), so such a run misses them. With host BPF the daemon costs less CPU than with
100 ms rescans (what moving to host BPF was for), and a thread born in a boosted VM is boosted
within the rescan period (100 ms, thread_refresh_ms's default): sooner than a rescan could promise
(the root test asserts 300 ms; the 1 s rescan is only the safety net).
"""
import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import manifest  # noqa: E402

FAKE = harness.REPO / "target/release/cosched-fake-qemu"
OUT = harness.REPO / "results/thread-discovery"
COLUMNS = ["n_vms", "thread_events", "mechanism", "daemon_cpu_pct", "probe", "new_thread_ms"]
SECONDS = 10  # the daemon's CPU is measured over this
PROBES = 5  # VMs in which a thread is started
GIVE_UP_MS = 2000  # a new thread not boosted by then: "" in data.csv
RESCAN_MS = 100  # thread_events = false: a boosted VM's threads read again this often (thread_refresh_ms's default)
BOUND_MS = RESCAN_MS  # the target: a new thread boosted by host BPF within the rescan period
# What the daemon's status reports for thread events seen with host BPF (crates/hostbpf: Mechanism);
# without them data.csv's mechanism is "rescans".
BPF_MECHANISMS = ("tp_btf", "raw_tracepoint", "tracepoint")


def frame(kind, seq, value):
    return bytes([0x43, 0x53, 1, kind]) + seq.to_bytes(4, "little") + value.to_bytes(8, "little")


def run(n, events, seconds=SECONDS):
    """(daemon CPU % of a core over `seconds`, the mechanism the daemon reports, the delays in ms
    until a thread started in each of PROBES boosted VMs was boosted, None where not by GIVE_UP_MS)."""
    with tempfile.TemporaryDirectory(prefix="cosched-tdisc-") as tmp:
        exe = Path(tmp) / "bin" / "qemu-system-x86_64"
        exe.parent.mkdir()
        shutil.copy(FAKE, exe)
        os.chmod(exe, 0o755)
        (Path(tmp) / "d").mkdir()
        cfg = harness.NO_BUDGETS + "rt_guard_max_share_permille = 0\nmax_boosted_vcpus = 100000\n"
        cfg = f"thread_events = {'true' if events else 'false'}\n" + cfg
        d = harness.Daemon(Path(tmp) / "d", cfg)
        procs = []
        try:
            for i in range(n):
                p = subprocess.Popen([str(exe), "--socket", str(d.socket_dir / f"vm{i}.sock"), "--thread", "CPU 0/TCG",
                                      "--thread", "IO iothread0", "--thread", "worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=harness.dies_with_us(9))
                procs.append(p)
            deadline = time.time() + 30
            while len(d.status()["vms"]) < n and time.time() < deadline:
                time.sleep(0.1)
            for p in procs:
                p.stdin.write(frame(1, 1, 1) + frame(3, 2, 1))
                p.stdin.flush()
            while time.time() < deadline:
                st = d.status()
                if sum(v["resources"]["cpu"]["level"] != "normal" for v in st["vms"]) == n:
                    break
                time.sleep(0.1)
            time.sleep(1)
            c0, t0 = harness.cpu_time_s(d.proc.pid), time.monotonic()
            time.sleep(seconds)
            c1, t1 = harness.cpu_time_s(d.proc.pid), time.monotonic()
            # A new thread in one boosted VM: how long until it is boosted?
            lat = []
            for p in procs[:PROBES]:
                before = set(os.listdir(f"/proc/{p.pid}/task"))
                t = time.monotonic()
                os.kill(p.pid, 10)
                while True:
                    new = set(os.listdir(f"/proc/{p.pid}/task")) - before
                    if new and all(os.sched_getscheduler(int(x)) & 0xff == os.SCHED_RR for x in new):
                        lat.append(1e3 * (time.monotonic() - t))
                        break
                    if time.monotonic() - t > GIVE_UP_MS / 1000:
                        lat.append(None)
                        break
                    time.sleep(0.0005)
            return 100 * (c1 - c0) / (t1 - t0), d.status()["daemon"].get("thread_events"), lat
        finally:
            for p in procs:
                p.kill()
                p.wait()
            d.stop()


def measure(counts, say=print):
    rows = []
    for n in counts:
        for ev in (True, False):
            cpu, mech, lat = run(n, ev)
            rows += [dict(n_vms=n, thread_events=int(ev), mechanism=mech or "rescans", daemon_cpu_pct=cpu, probe=i + 1,
                          new_thread_ms="" if x is None else x) for i, x in enumerate(lat)]
            say(f"{n} boosted idle VMs, thread_events={ev} ({mech or 'rescans'}): daemon {cpu:.2f}% of a core; "
                f"new thread boosted after {', '.join('-' if x is None else f'{x:.1f}' for x in lat)} ms")
    return rows


def stored_rows(out=OUT):
    from experiments.common import read_csv
    return read_csv(Path(out) / "data.csv", text=("mechanism",))


def cells(rows):
    """{(n, events): (daemon CPU %, [delays ms, None where not boosted in time], mechanism)}."""
    out = {}
    for r in rows:
        c = out.setdefault((r["n_vms"], bool(r["thread_events"])), (r["daemon_cpu_pct"], [], r["mechanism"]))
        c[1].append(None if r["new_thread_ms"] == "" else r["new_thread_ms"])
    return out


def delays_text(xs):
    done = sorted(x for x in xs if x is not None)
    text = (f"median {statistics.median(done):.1f} ms, {done[0]:.1f}-{done[-1]:.1f} ms over {len(done)} threads"
            if done else "none boosted")
    missing = len(xs) - len(done)
    return text + (f"; {missing} not boosted within {GIVE_UP_MS} ms" if missing else "")


def targets(rows):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from experiments.common import target
    c = cells(rows)
    out = []
    for n in sorted({k[0] for k in c}):
        ev, re = c.get((n, True)), c.get((n, False))
        # Only host BPF can meet the targets of thread events: the daemon falls back to the rescans
        # where BPF is refused, and the rescans would meet them too.
        bpf = bool(ev) and ev[2] in BPF_MECHANISMS
        fell_back = "" if bpf else f"; the daemon reported {ev[2] if ev else '?'}, not host BPF: what the target is on did not run"
        if ev and re:
            out.append(target(f"{n} boosted idle VMs: thread events seen with host BPF cost the daemon less CPU than "
                              f"{RESCAN_MS} ms rescans",
                              f"{ev[0]:.2f}% of a core ({ev[2]}) against {re[0]:.2f}%" + fell_back,
                              bpf and ev[0] < re[0], f"one {SECONDS} s measurement each"))
        if ev:
            ok = bpf and all(x is not None and x <= BOUND_MS for x in ev[1])
            out.append(target(f"{n} boosted idle VMs, thread events: a thread born in a boosted VM is boosted by host "
                              f"BPF within {BOUND_MS} ms, the rescan period (sooner than a rescan can promise)",
                              delays_text(ev[1]) + f" ({ev[2]})" + fell_back, ok, " / ".join(
                                  "-" if x is None else f"{x:.1f}" for x in ev[1]) + " ms"))
        if re:
            out.append(target(f"{n} boosted idle VMs, {RESCAN_MS} ms rescans, for reference: a new thread's wait",
                              delays_text(re[1]), None, " / ".join("-" if x is None else f"{x:.1f}" for x in re[1])
                              + " ms"))
    return out


def plot(rows, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    c = cells(rows)
    ns = sorted({k[0] for k in c})
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    w = 0.38
    for j, (ev, label, color) in enumerate(((True, "thread events (host BPF)", "tab:green"),
                                            (False, "rescans every 100 ms", "tab:red"))):
        xs = [i + (j - 0.5) * w for i in range(len(ns))]
        a1.bar(xs, [c[(n, ev)][0] if (n, ev) in c else 0 for n in ns], w, color=color, label=label)
        for i, n in enumerate(ns):
            ys = [x if x is not None else GIVE_UP_MS for x in c.get((n, ev), (0, []))[1]]
            a2.plot([i + (j - 0.5) * w] * len(ys), ys, "o", color=color, label=label if i == 0 else None)
    a1.set_xticks(range(len(ns)), [f"{n} VMs" for n in ns])
    a1.set_ylabel("daemon CPU (% of a core)")
    a1.set_title("the daemon's CPU, boosted idle VMs (target: events below rescans)", fontsize=10)
    a1.legend(fontsize=8)
    a2.axhline(BOUND_MS, color="black", linestyle="--", linewidth=1,
               label=f"target (thread events, host BPF): ≤ {BOUND_MS} ms, the rescan period")
    a2.set_xticks(range(len(ns)), [f"{n} VMs" for n in ns])
    a2.set_yscale("log")
    a2.set_ylabel(f"new thread boosted after (ms; {GIVE_UP_MS}: not by then)")
    a2.set_title("a thread born in a boosted VM", fontsize=10)
    a2.legend(fontsize=8)
    fig.suptitle("Thread discovery: host BPF events against periodic rescans")
    fig.savefig(Path(out) / "plot.png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def write_summary(rows, out, command, when):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from experiments.common import targets_md
    c = cells(rows)
    lines = []
    for (n, ev), (cpu, lat, mech) in sorted(c.items(), key=lambda kv: (kv[0][0], not kv[0][1])):
        lines.append(f"| {n} | {'events (' + mech + ')' if ev else 'rescans every 100 ms'} | {cpu:.2f} | "
                     + " / ".join("-" if x is None else f"{x:.1f}" for x in lat) + " |")
    text = f"""# Thread discovery: host BPF events vs periodic rescans

Command: `{command}` (as root; {when}).

{targets_md(targets(rows))}

N boosted, idle synthetic VMs (`cosched-fake-qemu`, 3 named threads each); the daemon's CPU over
{SECONDS} s; then a thread is started in {PROBES} boosted VMs and the time until it is boosted is read with
`sched_getscheduler` (the fake QEMU starts the thread up to ~2 ms after the signal; "-": not boosted
within {GIVE_UP_MS} ms). Figures: data.csv; what the run printed: output.txt.

| VMs | discovery | daemon CPU (% of a core) | new thread boosted after (ms) |
|---|---|---|---|
{chr(10).join(lines)}
"""
    (Path(out) / "summary.md").write_text(text)
    plot(rows, out)
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("counts", nargs="*", type=int, help="boosted idle VM counts (default 16 64)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"default {OUT}")
    ap.add_argument("--render", action="store_true", help="summary.md and plot.png again from data.csv, no measuring")
    a = ap.parse_args()
    started = manifest.Run()
    if a.render:
        m = manifest.read(a.out) or {}
        when = (f"measured {(m.get('started') or m.get('date') or '?')[:10]}"
                + (f" at {m['commit'][:7]}" if m.get("commit") else "")
                + f"; this summary rendered again from its data.csv on {time.strftime('%Y-%m-%d')}")
        command = m.get("command") or "/usr/bin/python3 bench/thread_discovery_bench.py"
        print(write_summary(stored_rows(a.out), a.out, command, when))
        manifest.write(a.out, started, name="thread-discovery", producer="bench/thread_discovery_bench.py",
                       quick=False, rendered=True)
        return 0
    if os.geteuid() != 0:
        sys.exit("thread_discovery_bench.py: must run as root (the daemon)")
    lines = []

    def say(text):
        print(text, flush=True)
        lines.append(text)
    t0 = time.monotonic()
    rows = measure(a.counts or [16, 64], say)
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "data.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    (a.out / "output.txt").write_text("\n".join(lines) + "\n")
    when = (f"took {(time.monotonic() - t0) / 60:.1f} min on {time.strftime('%Y-%m-%d')} at "
            f"{(started.commit or 'unknown')[:7]}, {os.cpu_count()} CPUs, Linux {os.uname().release}")
    write_summary(rows, a.out, "/usr/bin/python3 bench/thread_discovery_bench.py " + " ".join(map(str, a.counts or [16, 64])),
                  when)
    manifest.write(a.out, started, name="thread-discovery", producer="bench/thread_discovery_bench.py", quick=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
