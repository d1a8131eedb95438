#!/usr/bin/python3
"""cosched's reliability campaign: figures in results/reliability/summary.md.

  sudo /usr/bin/python3 bench/reliability.py all [--cycles 100] [--runs 10000000]   (~20 min)
  sudo /usr/bin/python3 bench/reliability.py crash [--cycles 100] [--out DIR]

fuzz (in `all`): bench/fuzz.sh, `--runs` executions of each fuzz target (the guest channel's frame
decoder, the control socket's request parser, the config loader), with AddressSanitizer; no
crash, no hang (10 s per input), no memory past 1 GiB.

crash: `kill -9` of the daemon at a random moment, cycle after cycle, while its VMs are boosted
(CPU), raised (I/O, through a cgroup), shielded (a dedicated CPU, IRQs moved off it), run at
static FIFO and throttled (memory bandwidth, through the freezer). After each kill,
`cosched restore` runs and the host is compared with a snapshot taken before the daemon first
touched it: every thread's scheduling policy, priority, nice, I/O priority, CPU affinity and
cgroups, the IRQ affinities, and the daemon's own cgroups (there must be none). Target: 0
differences. The VMs are synthetic (cosched-fake-qemu playing the guest: REGISTER, CPU 1, IO 1,
MEMBW), so a cycle takes about a second.

Needs root and a built tree (scripts/setup.sh). Not yet built: the soak and isolation parts of
the campaign (see the README).
"""

import argparse
import ctypes
import json
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

FAKE = harness.REPO / "target/release/cosched-fake-qemu"
RESULTS = harness.REPO / "results/reliability"
_libc = ctypes.CDLL(None, use_errno=True)
SYS_ioprio_get = 252  # x86_64
IOPRIO_WHO_PROCESS = 1

# The daemon: boosts held without budgets, I/O raised through a weighted blkio group, memory
# bandwidth regulated on simulated counters (the busy vCPU is throttled every period), vm "shield"
# on a dedicated CPU, vm "fifo" at static FIFO.
CONFIG = """daemon_priority = 0
thread_refresh_ms = 50
[policy]
max_continuous_boost_ms = 0
max_boost_share_permille = 1000
rt_guard_max_share_permille = 0
host_reserve_cpus = 0
[io]
lever = "weight"
[membw]
backend = "simulated"
trace = "{trace}"
guaranteed_mbps = 1000
period_ms = 50
[vm.shield.static]
shield = "{cpu}"
[vm.fifo.static]
fifo = true
"""
CAPS = 1 | 2 | 4  # cpu, io, membw
KIND = {"register": 1, "cpu": 3, "io": 4, "membw": 5}


def frame(kind, seq, value):
    """A protocol frame: magic "CS", version 1, kind, seq (u32 LE), value (u64 LE)."""
    return struct.pack("<2sBBIQ", b"CS", 1, KIND[kind], seq, value)


class FakeVm:
    """cosched-fake-qemu relaying the daemon's connection to our pipes: we play its guest."""

    def __init__(self, tmp, name, spin):
        exe = Path(tmp) / f"bin-{name}" / "qemu-system-x86_64"
        exe.parent.mkdir()
        exe.write_bytes(FAKE.read_bytes())
        exe.chmod(0o755)
        args = [str(exe), "--socket", str(Path(tmp) / "d" / "vms" / f"{name}.sock"), "-name", name,
                "--spin" if spin else "--thread", "CPU 0/TCG", "--thread", "IO iothread0", "--thread", "worker"]
        self.name = name
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     preexec_fn=harness.dies_with_us(signal.SIGKILL))
        # Replies are read and dropped, so that the pipe never fills.
        threading.Thread(target=lambda: [None for _ in iter(lambda: self.proc.stdout.read(4096), b"")],
                         daemon=True).start()
        self.seq = 0
        deadline = time.time() + 5
        while len(self.tids()) < 5:
            if time.time() > deadline:
                raise RuntimeError(f"fake VM {name}: its threads did not start")
            time.sleep(0.01)

    def tids(self):
        try:
            return [int(t) for t in os.listdir(f"/proc/{self.proc.pid}/task")]
        except OSError:
            return []

    def send(self, kind, value):
        self.seq += 1
        self.proc.stdin.write(frame(kind, self.seq, value))
        self.proc.stdin.flush()

    def ask_everything(self):
        """As a guest would after the daemon (re)connects: register, then CPU 1, IO 1, MEMBW."""
        self.send("register", CAPS)
        self.send("cpu", 1)
        self.send("io", 1)
        self.send("membw", 300)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


def ioprio(tid):
    r = _libc.syscall(SYS_ioprio_get, IOPRIO_WHO_PROCESS, tid)
    return r if r >= 0 else None


def thread_attrs(tid):
    try:
        policy = os.sched_getscheduler(tid)
        prio = os.sched_getparam(tid).sched_priority
        nice = os.getpriority(os.PRIO_PROCESS, tid)
        aff = sorted(os.sched_getaffinity(tid))
        cg = Path(f"/proc/{tid}/cgroup").read_text()
        comm = Path(f"/proc/{tid}/comm").read_text().strip()
    except OSError:
        return None
    return {"comm": comm, "policy": policy, "prio": prio, "nice": nice, "ioprio": ioprio(tid), "affinity": aff,
            "cgroups": cg}


def own_groups():
    """Cgroups (and resctrl groups) the daemon makes: cosched-* anywhere under the hierarchies."""
    out = []
    for root in ("/sys/fs/cgroup", "/sys/fs/resctrl"):
        if not os.path.isdir(root):
            continue
        for d, dirs, _ in os.walk(root):
            out += [os.path.join(d, x) for x in dirs if x.startswith("cosched-")]
            dirs[:] = [x for x in dirs if not x.startswith("cosched-")]
    return sorted(out)


def snapshot(skip_pids=()):
    """Every thread's attributes (by tid, with its start time so a reused tid is not the same
    thread), the IRQ affinities, and the daemon's groups."""
    threads = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in skip_pids:
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for t in tids:
            try:
                start = Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[19]
            except (OSError, IndexError):
                continue
            a = thread_attrs(int(t))
            if a:
                threads[(int(t), start)] = a
    irqs = {}
    for irq in os.listdir("/proc/irq"):
        try:
            irqs[irq] = Path(f"/proc/irq/{irq}/smp_affinity_list").read_text().strip()
        except OSError:
            pass
    return {"threads": threads, "irqs": irqs, "groups": own_groups()}


def differences(before, after):
    """What differs between two snapshots, for the threads and IRQs present in both."""
    out = []
    for key, a in before["threads"].items():
        b = after["threads"].get(key)
        # The name is not an attribute (a kworker's names its current work queue).
        diff = {k: (a[k], b[k]) for k in a if k != "comm" and b is not None and a[k] != b[k]}
        if diff:
            out.append(f"thread {key[0]} ({a['comm']}): {diff}")
    for irq, a in before["irqs"].items():
        b = after["irqs"].get(irq)
        if b is not None and a != b:
            out.append(f"irq {irq}: {a} -> {b}")
    for g in sorted(set(after["groups"]) - set(before["groups"])):
        out.append(f"group left: {g}")
    return out


def state_at_kill(st):
    """What the daemon had applied when it was killed (from its last status)."""
    out = {"boosted": 0, "raised": 0, "throttles": 0, "shielded": False, "fifo": False}
    for vm in st.get("vms", []):
        r = vm.get("resources", {})
        out["boosted"] += r.get("cpu", {}).get("level") == "boosted"
        out["raised"] += r.get("io", {}).get("level") == "boosted"
        out["throttles"] += (vm.get("membw") or {}).get("stats", {}).get("throttles", 0)
        tuning = vm.get("static", {}).get("tuning", "none")
        out["shielded"] |= "shield" in tuning
        out["fifo"] |= "fifo" in tuning
    return out


def crash(cycles, seed=None, log=print):
    """`cycles` kill -9 cycles; returns one row per cycle."""
    rng = random.Random(seed)
    cpu = max(os.sched_getaffinity(0))
    rows = []
    with tempfile.TemporaryDirectory(prefix="cosched-crash-") as tmp:
        trace = Path(tmp) / "membw.trace"
        trace.write_text("0 * 5000\n")
        (Path(tmp) / "d" / "vms").mkdir(parents=True)
        vms = []
        try:
            vms = [FakeVm(tmp, "shield", spin=True), FakeVm(tmp, "fifo", spin=False), FakeVm(tmp, "plain", spin=False)]
            ours = {v.proc.pid for v in vms}
            base = snapshot()
            for i in range(cycles):
                d = harness.Daemon(Path(tmp) / "d", CONFIG.format(trace=trace, cpu=cpu))
                try:
                    deadline = time.time() + 10
                    while len([v for v in (d.status() or {}).get("vms", []) if v.get("pid") in ours]) < len(vms):
                        if time.time() > deadline:
                            raise RuntimeError(f"cycle {i}: the daemon did not find the VMs:\n"
                                               + (d.dir / "daemon.log").read_text()[-2000:])
                        time.sleep(0.02)
                    for v in vms:
                        v.ask_everything()
                    # A random moment: from just after the requests to well into the boosts.
                    time.sleep(rng.uniform(0.0, 1.5))
                    st = d.status() or {}
                    at_kill = state_at_kill(st)
                    d.proc.kill()
                    d.proc.wait()
                    d.log.close()
                except BaseException:
                    d.stop()
                    raise
                r = subprocess.run([str(harness.COSCHED), "--config", str(d.dir / "host.toml"), "restore",
                                    "--state-dir", str(d.dir / "state")], capture_output=True, text=True)
                after = snapshot(skip_pids={d.proc.pid})
                diffs = differences(base, after)
                if r.returncode != 0:
                    diffs.append(f"cosched restore exited {r.returncode}: {r.stderr.strip()}")
                row = dict(cycle=i, differences=len(diffs), restore=r.stdout.strip(), **at_kill,
                           detail="; ".join(diffs[:5]))
                rows.append(row)
                log(f"cycle {i}: {json.dumps({k: row[k] for k in row if k != 'detail'})}"
                    + (f"\n  {row['detail']}" if diffs else ""))
        finally:
            for v in vms:
                v.stop()
    return rows


def fuzz(runs, out):
    """bench/fuzz.sh with `runs` executions per target; returns (its table, whether all passed)."""
    out.mkdir(parents=True, exist_ok=True)
    table = out / "fuzz.md"
    r = subprocess.run(["bash", str(harness.REPO / "bench/fuzz.sh"), "--runs", str(runs), "--report", str(table)])
    return table.read_text(), r.returncode == 0


def write_summary(rows, out, fuzz_table=None, fuzz_runs=None):
    out.mkdir(parents=True, exist_ok=True)
    import csv
    with open(out / "crash.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    n = len(rows)
    bad = [r for r in rows if r["differences"]]
    count = lambda k: sum(1 for r in rows if r[k])  # noqa: E731
    command = f"all --cycles {n} --runs {fuzz_runs}" if fuzz_table else f"crash --cycles {n}"
    fuzz_text = "Not run (`reliability.py all` runs it)." if not fuzz_table else f"""`bench/fuzz.sh --runs {fuzz_runs}`:
coverage-guided (cargo-fuzz, libFuzzer, AddressSanitizer, nightly toolchain), each target from
the committed corpus (`fuzz/corpus`). A crash, a hang (over 10 s on one input) or memory past
1 GiB fails a target. The peak RSS is the fuzzing process's, sanitizer quarantine included.

{fuzz_table}"""
    text = f"""# Reliability campaign

Command: `sudo /usr/bin/python3 bench/reliability.py {command}` ({time.strftime('%Y-%m-%d')}).

## Fuzzing

{fuzz_text}

## Crash cycles

{n} cycles of `kill -9` on the daemon at a random moment (0-1.5 s after three synthetic VMs
asked for everything), then `cosched restore`, then the host compared with a snapshot taken before
the daemon first touched it: every thread's policy, priority, nice, I/O priority, affinity and
cgroups, the IRQ affinities, and the daemon's own groups. What was applied at the kill, from the
daemon's last status: a VM CPU-boosted in {count('boosted')} cycles, I/O raised (weighted blkio
group) in {count('raised')}, shielded in {count('shielded')}, at static FIFO in {count('fifo')},
memory-bandwidth throttled (frozen) at least once in {count('throttles')}.

Target: 0 differences. **{"met" if not bad else "NOT met"}**: {sum(r['differences'] for r in rows)} differences
in {len(bad)} of {n} cycles.{"" if not bad else chr(10) + chr(10) + chr(10).join(f"- cycle {r['cycle']}: {r['detail']}" for r in bad[:10])}

Not yet built: the 1-hour soak and the isolation test (see the README).
"""
    (out / "summary.md").write_text(text)
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("crash", help="kill -9 cycles, each checked against a snapshot")
    c.add_argument("--cycles", type=int, default=100)
    c.add_argument("--seed", type=int, help="for the random kill moments (default: random)")
    c.add_argument("--out", type=Path, default=RESULTS, help=f"default {RESULTS}")
    al = sub.add_parser("all", help="crash cycles and fuzzing, one summary")
    al.add_argument("--cycles", type=int, default=100)
    al.add_argument("--runs", type=int, default=10_000_000, help="executions per fuzz target")
    al.add_argument("--seed", type=int)
    al.add_argument("--out", type=Path, default=RESULTS, help=f"default {RESULTS}")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("reliability.py: must run as root (the daemon)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    rows = crash(a.cycles, a.seed)
    table, fuzz_ok = fuzz(a.runs, a.out) if a.cmd == "all" else (None, True)
    print(write_summary(rows, a.out, table, getattr(a, "runs", None)))
    sys.exit(1 if any(r["differences"] for r in rows) or not fuzz_ok else 0)


if __name__ == "__main__":
    main()
