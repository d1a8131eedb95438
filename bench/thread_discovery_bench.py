"""Thread discovery: what seeing threads come and go with host BPF (`thread_events = true`) costs
and buys against re-reading boosted VMs' thread lists every 100 ms (`thread_events = false`), in one
run: the daemon's CPU with N boosted, idle synthetic VMs (3 named threads each), and how long a
thread born in a boosted VM waits before it is boosted too (the fake QEMU starts it within ~2 ms
of the signal: that is part of the figure).

Run as root from the repository: /usr/bin/python3 bench/thread_discovery_bench.py [N ...]
Writes what it prints to results/thread-discovery/output.txt, with manifest.json (bench/manifest.py);
summary.md there is written by hand from that output.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
import manifest
FAKE = harness.REPO / "target/release/cosched-fake-qemu"

def frame(kind, seq, value):
    return bytes([0x43, 0x53, 1, kind]) + seq.to_bytes(4, "little") + value.to_bytes(8, "little")

def run(n, events, seconds=10):
    with tempfile.TemporaryDirectory(prefix="cosched-tdisc-") as tmp:
        exe = Path(tmp) / "bin" / "qemu-system-x86_64"
        exe.parent.mkdir(); shutil.copy(FAKE, exe); os.chmod(exe, 0o755)
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
                p.stdin.write(frame(1, 1, 1) + frame(3, 2, 1)); p.stdin.flush()
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
            for p in procs[:5]:
                before = set(os.listdir(f"/proc/{p.pid}/task"))
                t = time.monotonic(); os.kill(p.pid, 10)
                while True:
                    new = set(os.listdir(f"/proc/{p.pid}/task")) - before
                    if new and all(os.sched_getscheduler(int(x)) & 0xff == os.SCHED_RR for x in new):
                        lat.append(1e3 * (time.monotonic() - t)); break
                    if time.monotonic() - t > 2: lat.append(float("nan")); break
                    time.sleep(0.0005)
            return 100 * (c1 - c0) / (t1 - t0), d.status()["daemon"].get("thread_events"), lat
        finally:
            for p in procs:
                p.kill(); p.wait()
            d.stop()

OUT = harness.REPO / "results/thread-discovery"
started = manifest.Run()
lines = []

def say(text):
    print(text, flush=True)
    lines.append(text)

counts = [int(a) for a in sys.argv[1:]] or [16, 64]
for n in counts:
    rows = {}
    for ev in (True, False):
        cpu, mech, lat = run(n, ev)
        rows[ev] = (cpu, lat)
        say(f"{n} boosted idle VMs, thread_events={ev} ({mech or 'rescans'}): daemon {cpu:.2f}% of a core; "
            f"new thread boosted after {', '.join(f'{x:.1f}' for x in lat)} ms")
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    say(f"{n} VMs: daemon CPU rescans / events = {rows[False][0]:.2f} / {rows[True][0]:.2f} %; "
        f"median new-thread delay rescans / events = {med(rows[False][1]):.1f} / {med(rows[True][1]):.1f} ms")
OUT.mkdir(parents=True, exist_ok=True)
(OUT / "output.txt").write_text("\n".join(lines) + "\n")
manifest.write(OUT, started, name="thread-discovery", producer="bench/thread_discovery_bench.py", quick=False)
