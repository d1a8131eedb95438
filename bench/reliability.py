#!/usr/bin/python3
"""cosched's reliability campaign: figures in results/reliability/summary.md.

  sudo /usr/bin/python3 bench/reliability.py all [--cycles 100] [--runs 10000000] [--soak-minutes 0]
  sudo /usr/bin/python3 bench/reliability.py crash [--cycles 100] [--restore-by alternate|command|restart] [--seed N]
  sudo /usr/bin/python3 bench/reliability.py isolation [--seconds 20] [--seed N]
  sudo /usr/bin/python3 bench/reliability.py soak [--minutes 60] [--vms 16] [--seed N]
  /usr/bin/python3 bench/reliability.py fuzz [--runs 10000000]   (~40 min with AddressSanitizer; needs no root)
  /usr/bin/python3 bench/reliability.py summary   (summary.md and plot.png again from the files of the last runs)
  (each takes --out DIR, default results/reliability; `all` is ~20 min without the soak; crash,
  isolation, soak and fuzz write summary.md again too)

summary.md opens with a targets table (experiments.common.targets_md), each target judged from the
part's files: fuzz.md (bench/fuzz.sh --report: the date, commit, toolchain and command of its run,
and each target's executions, RSS after 10 s and peak), crash.csv, isolation.json, and the soak's
soak.csv, soak-probe.csv and soak.json (the daemon before the first VM and after the last, the
frame totals, the windows); plot.png draws each part against its target.

fuzz (in `all`): bench/fuzz.sh, `--runs` executions of each fuzz target (the guest channel's frame
decoder, the control socket's request parser, the config loader), with AddressSanitizer; no
crash, no hang (10 s per input), no memory past 1 GiB.

crash: `kill -9` of the daemon at a random moment, cycle after cycle, while its VMs are boosted
(CPU), raised (I/O, through a BFQ-weighted cgroup, or the real-time I/O class on a host without
BFQ), shielded (a dedicated CPU, IRQs moved off it), run at
static FIFO and throttled (memory bandwidth, through the freezer). After each kill the host is
put back, and compared with a snapshot taken before the daemon first touched it: every thread's
scheduling policy, priority, nice, I/O priority, CPU affinity and cgroups (cpu, cpuset, blkio,
freezer and v2: those the daemon moves threads in), the IRQ affinities, and
the daemon's own cgroups (there must be none). Other QEMU processes on the host are left out of
the comparison (another daemon, a libvirt test's, may coordinate them meanwhile). Target: 0
differences. What puts the host back (--restore-by; `alternate`, the default, takes turns):
  command  `cosched restore`, as an operator runs it after a crash. Proves that the record the
           dead daemon kept is complete and that the command undoes it exactly.
  restart  the daemon started again on the same state directory, as systemd restarts it. The
           VMs are stopped first (SIGSTOP: nothing of theirs reaches the new daemon), and the new
           daemon has nothing that acts without a request (no static tunings, no event
           boosting, no memory-bandwidth regulation; RESTART_CONFIG), so the only change it may
           make is its restore at start. Once it answers (its restore is done before it binds its
           control socket) and has attached every VM, the host is compared while it runs; then it
           stops and the VMs resume. Proves that a restarted daemon first puts back everything
           the dead one left, before it acts again, and that attaching to running VMs changes
           nothing by itself. (With static tunings or guests asking, a restarted daemon applies
           them again at once: there would be no quiet moment to compare.)
The VMs are synthetic (cosched-fake-qemu playing the guest: REGISTER, CPU 1, IO 1, MEMBW), so a
cycle takes about a second.

isolation (results/reliability/isolation.md): a hostile VM floods its channel beside a victim;
nothing of the host's or the victim's threads may change, and the victim's boost latency is
measured against the daemon's per-turn read bound.

soak (results/reliability/soak.md, soak.csv): one daemon, `--vms` synthetic VMs sending random
valid and invalid frames at random rates up to the daemon's rate limit (frame_rate, 2000 a
second), VMs leaving (channel closed, or killed) and new ones coming, operator commands at random
through the CLI, and a probe VM in a process of its own that asks for a CPU boost every 0.5 s.
Every ~10 s: the daemon's RSS, fds and threads, the host's load average, the probe's
hint-to-applied latency. Targets: every frame answered (each frame whose 5 s reply window was
observed while its VM was there got exactly one ACK or DENY with its seq; frames in flight when
their VM was killed are counted apart); RSS growth at most 1 MiB after the warm-up (5 min, or a
sixth of a shorter run); the daemon's fds and threads, once the last VM has gone, as before the
first; the probe's p99 in the last 10 min within 1.2x of the first 10 (a third of a shorter run).
Everything it starts stops on Ctrl-C or SIGTERM (the daemon restores; children die with it).

Needs root and a built tree (scripts/setup.sh).
"""

import argparse
import contextlib
import csv
import ctypes
import json
import multiprocessing
import os
import random
import select
import shutil
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
import manifest  # noqa: E402

FAKE = harness.REPO / "target/release/cosched-fake-qemu"
RESULTS = harness.REPO / "results/reliability"
_libc = ctypes.CDLL(None, use_errno=True)
SYS_ioprio_get = 252  # x86_64
IOPRIO_WHO_PROCESS = 1

# The daemon: boosts held without budgets, I/O raised through a weighted blkio group (the
# real-time I/O class on a host without BFQ: io_lever()), memory
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
lever = "{io_lever}"
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
KIND = {"register": 1, "deregister": 2, "cpu": 3, "io": 4, "membw": 5, "wake": 6}
ACK, DENY, DISABLE, ENABLE = 0x80, 0x81, 0x82, 0x83
# DENY's reason (its value's low byte; crates/proto DenyReason).
DENY_REASONS = {1: "disabled", 2: "unsupported", 3: "budget", 4: "malformed", 5: "rate_limited",
                6: "not_registered", 7: "host_reserve"}


# A protocol frame: magic "CS", version, kind, seq (u32 LE), value (u64 LE): 16 bytes.
FRAME = struct.Struct("<2sBBIQ")


def frame(kind, seq, value):
    """A protocol frame of version 1."""
    return FRAME.pack(b"CS", 1, KIND[kind], seq, value)


class FakeVm:
    """cosched-fake-qemu relaying the daemon's connection to our pipes: we play its guest.

    replies: "drop" (a thread reads them and drops them, so that the pipe never fills), "keep"
    (a thread keeps the ACK/DENY of each seq: `reply(seq)`), or "caller" (nothing reads them: the
    caller reads proc.stdout itself, e.g. many VMs from one loop)."""

    def __init__(self, tmp, name, spin, replies="drop"):
        exe = Path(tmp) / f"bin-{name}" / "qemu-system-x86_64"
        exe.parent.mkdir()
        exe.write_bytes(FAKE.read_bytes())
        exe.chmod(0o755)
        args = [str(exe), "--socket", str(Path(tmp) / "d" / "vms" / f"{name}.sock"), "-name", name,
                "--spin" if spin else "--thread", "CPU 0/TCG", "--thread", "IO iothread0", "--thread", "worker"]
        self.name = name
        self.bin = exe.parent
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     preexec_fn=harness.dies_with_us(signal.SIGKILL))
        self.replies, self.cond, self.reader = {}, threading.Condition(), None
        if replies != "caller":
            self.reader = threading.Thread(target=self._read, args=(replies == "keep",), daemon=True)
            self.reader.start()
        self.seq = 0
        deadline = time.time() + 5
        while len(self.tids()) < 5:
            if time.time() > deadline:
                self.stop()
                raise RuntimeError(f"fake VM {name}: its threads did not start")
            time.sleep(0.01)

    def _read(self, keep):
        fd, buf = self.proc.stdout.fileno(), b""
        while True:
            try:
                data = os.read(fd, 4096)
            except OSError:
                return
            if not data:
                return
            if keep:
                buf += data
                whole = len(buf) // FRAME.size * FRAME.size
                with self.cond:
                    for _, _, kind, seq, value in FRAME.iter_unpack(buf[:whole]):
                        if seq:
                            self.replies[seq] = (kind, value)
                    self.cond.notify_all()
                buf = buf[whole:]

    def reply(self, seq, timeout):
        """("ack", value) or ("deny", reason name) for frame `seq` (replies="keep"), None if none
        came within `timeout` s."""
        with self.cond:
            self.cond.wait_for(lambda: seq in self.replies, timeout)
            r = self.replies.pop(seq, None)
        return None if r is None else ("ack", r[1]) if r[0] == ACK else ("deny", DENY_REASONS.get(r[1] & 0xff, "?"))

    def threads(self):
        """(tid, comm) of its threads ([] once it is gone)."""
        try:
            return harness.qemu_threads(self.proc.pid)
        except OSError:
            return []

    def tids(self):
        return [t for t, _ in self.threads()]

    def send(self, kind, value):
        """Sends one frame; returns its seq."""
        self.seq += 1
        self.proc.stdin.write(frame(kind, self.seq, value))
        self.proc.stdin.flush()
        return self.seq

    def ask_everything(self):
        """As a guest would after the daemon (re)connects: register, then CPU 1, IO 1, MEMBW."""
        self.send("register", CAPS)
        self.send("cpu", 1)
        self.send("io", 1)
        self.send("membw", 300)

    def stop(self):
        """Kills it (idempotent); its reader thread ends on the pipe's end before it is closed."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.reader is not None:
            self.reader.join(2)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:  # a write the fake never read (it is gone)
                pass
        shutil.rmtree(self.bin, ignore_errors=True)


def ioprio(tid):
    r = _libc.syscall(SYS_ioprio_get, IOPRIO_WHO_PROCESS, tid)
    return r if r >= 0 else None


# The v1 controllers the daemon moves threads in (the CPU shield's cpuset, the I/O weight's blkio,
# the throttle's freezer, and cpu beside cpuset where they are bound together); the v2 hierarchy
# (empty controllers) is compared whole.
TOUCHED_CONTROLLERS = {"cpu", "cpuset", "blkio", "freezer"}


def touched_cgroups(text):
    """The lines of a /proc/TID/cgroup that the daemon may change: another program moving a
    thread between, say, memory groups meanwhile is not a difference the daemon made."""
    keep = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and (not parts[1] or TOUCHED_CONTROLLERS & set(parts[1].split(","))):
            keep.append(line)
    return "\n".join(keep)


def thread_attrs(tid):
    try:
        policy = os.sched_getscheduler(tid)
        prio = os.sched_getparam(tid).sched_priority
        nice = os.getpriority(os.PRIO_PROCESS, tid)
        aff = sorted(os.sched_getaffinity(tid))
        cg = touched_cgroups(Path(f"/proc/{tid}/cgroup").read_text())
        comm = Path(f"/proc/{tid}/comm").read_text().strip()
    except OSError:
        return None
    return {"comm": comm, "policy": policy, "prio": prio, "nice": nice, "ioprio": ioprio(tid), "affinity": aff,
            "cgroups": cg}


def own_groups(foreign=()):
    """Cgroups (and resctrl groups) the daemon makes: cosched-* anywhere under the hierarchies,
    but those of the `foreign` processes (`cosched-io-<pid>`: another daemon's VM)."""
    out = []
    for root in ("/sys/fs/cgroup", "/sys/fs/resctrl"):
        if not os.path.isdir(root):
            continue
        for d, dirs, _ in os.walk(root):
            out += [os.path.join(d, x) for x in dirs
                    if x.startswith("cosched-") and x.rsplit("-", 1)[-1] not in {str(p) for p in foreign}]
            dirs[:] = [x for x in dirs if not x.startswith("cosched-")]
    return sorted(out)


def remove_groups(groups):
    """Removes the cosched-* groups `groups` (a run's leftovers, once what it reports has counted
    them), deepest first; a v1 freezer group is thawed first. What cannot be removed is reported
    on stderr, not raised: this runs on the way out of a run, also a failing one."""
    for g in sorted(groups, key=lambda g: -g.count("/")):
        try:
            if os.path.exists(os.path.join(g, "freezer.state")):
                Path(g, "freezer.state").write_text("THAWED")
            os.rmdir(g)
        except OSError as e:
            print(f"reliability.py: could not remove {g}: {e}", file=sys.stderr)


def snapshot(skip_pids=(), ours=None):
    """Every thread's attributes (by tid, with its start time so a reused tid is not the same
    thread), the IRQ affinities, and the daemon's groups.
    ours: the pids of our (fake) QEMUs; then every other QEMU process on the host is left out,
    threads and groups, since another daemon (a libvirt test's) may coordinate it meanwhile."""
    foreign = set(harness.foreign_qemus(set(ours))) if ours is not None else set()
    skip = set(skip_pids) | foreign
    threads = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in skip:
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
    return {"threads": threads, "irqs": irqs, "groups": own_groups(foreign), "foreign": sorted(foreign)}


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


# The daemon a `restart` cycle starts after the kill: the same directories (state, sockets), and
# nothing that acts without a guest's request: no static tunings, no event boosting (it would
# boost a VM without an agent on its own), no memory-bandwidth regulation (it would throttle one).
RESTART_CONFIG = """daemon_priority = 0
[event]
vms = "none"
[membw]
backend = "off"
"""
RESTORE_BY = ("command", "restart")


def restart_restore(d, vms, ours):
    """After the kill of daemon `d`: the VMs stopped (SIGSTOP: no frame of theirs reaches anyone),
    a daemon started with RESTART_CONFIG on the same directories, which restores the record at
    start; once it has found every VM, the host compared while it runs. Returns (what it logged
    it restored, the snapshot taken, the restarted daemon's pid)."""
    for v in vms:
        os.kill(v.proc.pid, signal.SIGSTOP)
    d2 = None
    try:
        # The daemon answers its control socket only after its restore at start.
        d2 = harness.Daemon(d.dir, RESTART_CONFIG)
        deadline = time.time() + 10
        while len([v for v in (d2.status() or {}).get("vms", []) if v.get("pid") in ours]) < len(vms):
            if time.time() > deadline:
                raise RuntimeError("the restarted daemon did not find the VMs:\n"
                                   + (d2.dir / "daemon.log").read_text()[-2000:])
            time.sleep(0.02)
        time.sleep(0.2)  # a few loop turns with the VMs attached
        after = snapshot(skip_pids={d.proc.pid, d2.proc.pid}, ours=ours)
        log = (d2.dir / "daemon.log").read_text()
        restored = "; ".join(l.split("cosched-host: ", 1)[-1] for l in log.splitlines()
                             if "restored" in l or "restore:" in l) or "nothing restored"
        pid = d2.proc.pid
        d2.stop()
        return restored, after, pid
    finally:
        if d2 is not None:
            try:
                d2.stop()
            except RuntimeError:
                pass
        for v in vms:
            try:
                os.kill(v.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def io_lever():
    """The I/O lever the crash cycles raise: BFQ's weight (threads moved into a blkio group of the
    daemon's) where the host has BFQ's cgroup files, else the real-time I/O class (ioprio_set),
    on a kernel built without BFQ."""
    blkio = Path("/sys/fs/cgroup/blkio")
    if blkio.is_dir():
        return "weight" if any(f.name.startswith("blkio.bfq.") for f in blkio.iterdir()) else "ioprio"
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    return "weight" if v2.is_file() and "io" in v2.read_text().split() else "ioprio"


def crash(cycles, seed=None, log=print, restore_by="alternate"):
    """`cycles` kill -9 cycles; returns one row per cycle.
    restore_by: "command" (`cosched restore` after the kill), "restart" (a daemon started again
    restores at start: see restart_restore), or "alternate" (command, restart, command...)."""
    rng = random.Random(seed)
    cpu = max(os.sched_getaffinity(0))
    lever = io_lever()
    rows = []
    groups0 = own_groups()
    with tempfile.TemporaryDirectory(prefix="cosched-crash-") as tmp:
        trace = Path(tmp) / "membw.trace"
        trace.write_text("0 * 5000\n")
        (Path(tmp) / "d" / "vms").mkdir(parents=True)
        vms = []
        try:
            vms = [FakeVm(tmp, "shield", spin=True), FakeVm(tmp, "fifo", spin=False), FakeVm(tmp, "plain", spin=False)]
            ours = {v.proc.pid for v in vms}
            base = snapshot(ours=ours)
            for i in range(cycles):
                mode = RESTORE_BY[i % 2] if restore_by == "alternate" else restore_by
                d = harness.Daemon(Path(tmp) / "d", CONFIG.format(trace=trace, cpu=cpu, io_lever=lever))
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
                diffs = []
                if mode == "command":
                    r = subprocess.run([str(harness.COSCHED), "--config", str(d.dir / "host.toml"), "restore",
                                        "--state-dir", str(d.dir / "state")], capture_output=True, text=True)
                    after = snapshot(skip_pids={d.proc.pid}, ours=ours)
                    restored = r.stdout.strip()
                    if r.returncode != 0:
                        diffs.append(f"cosched restore exited {r.returncode}: {r.stderr.strip()}")
                else:
                    restored, after, _ = restart_restore(d, vms, ours)
                diffs = differences(base, after) + diffs
                row = dict(cycle=i, restore_by=mode, io_lever=lever, differences=len(diffs), restore=restored, **at_kill,
                           foreign_qemus=len(after["foreign"]), detail="; ".join(diffs[:5]))
                rows.append(row)
                log(f"cycle {i}: {json.dumps({k: row[k] for k in row if k != 'detail'})}"
                    + (f"\n  {row['detail']}" if diffs else ""))
        finally:
            for v in vms:
                v.stop()
            # A cycle that failed (a difference counted above, or an error) leaves nothing.
            remove_groups(set(own_groups()) - set(groups0))
    return rows


ISOLATION_CONFIG = """daemon_priority = 99
[policy]
max_continuous_boost_ms = 0
max_boost_share_permille = 1000
rt_guard_max_share_permille = 0
host_reserve_cpus = 0
"""
# The daemon reads at most 8 reads of 4 KiB from one VM per loop turn (READS_PER_WAKEUP in
# crates/host/src/daemon/mod.rs): 2048 frames.
FRAMES_PER_TURN = 8 * 4096 // FRAME.size


def vcpu_of(vm):
    for t, comm in vm.threads():
        if harness.is_vcpu(comm):
            return t
    raise RuntimeError(f"{vm.name}: no vCPU thread")


def boost_latencies(vm, rounds, rng):
    """`rounds` times: CPU 1, then the time until its vCPU is SCHED_RR (polled every 20 µs, so
    that the poll leaves the CPU to the relay that carries the frame); CPU 0 and back to
    SCHED_OTHER. Returns the latencies in µs (None for a boost not seen within 1 s)."""
    tid, out = vcpu_of(vm), []
    for _ in range(rounds):
        t0 = time.perf_counter()
        vm.send("cpu", 1)
        while harness.policy(tid) != os.SCHED_RR and time.perf_counter() - t0 < 1.0:
            time.sleep(0.00002)
        out.append((time.perf_counter() - t0) * 1e6 if harness.policy(tid) == os.SCHED_RR else None)
        vm.send("cpu", 0)
        t1 = time.perf_counter()
        while harness.policy(tid) != os.SCHED_OTHER and time.perf_counter() - t1 < 1.0:
            time.sleep(0.0002)
        time.sleep(rng.uniform(0.005, 0.02))
    return out


class Hostile:
    """Writes into its VM's channel as fast as the socket takes it: valid frames of every kind
    (CPU at the highest guest priority, IO, MEMBW 1000, WAKE, REGISTER again), with some
    malformed frames and garbage (under the malformed rate that would deregister it). It runs in
    a process of its own (forked), which also drains the replies, so that neither the flood nor
    its millions of DENYs take the measuring process's interpreter lock (its `vm` is a FakeVm
    with replies="caller")."""

    def __init__(self, vm, seed):
        ctx = multiprocessing.get_context("fork")
        self.vm, self.sent, self.stop_ = vm, ctx.Value("q", 0), ctx.Event()
        self.proc = ctx.Process(target=self._run, args=(seed,), daemon=True)

    def start(self):
        self.proc.start()

    def stop(self, timeout):
        self.stop_.set()
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()

    @property
    def bytes(self):
        return self.sent.value

    def _run(self, seed):
        rng, out, inp = random.Random(seed), self.vm.proc.stdin.fileno(), self.vm.proc.stdout.fileno()

        def drain():
            while True:
                try:
                    if not os.read(inp, 65536):
                        return
                except OSError:
                    return
        threading.Thread(target=drain, daemon=True).start()
        seq, chunk, sent = 1000, [], 0
        while not self.stop_.is_set():
            for _ in range(256):
                seq += 1
                r = rng.random()
                if r < 0.70:
                    chunk.append(frame("cpu", seq, (1 | 99 << 8) if seq % 2 else 0))
                elif r < 0.80:
                    chunk.append(frame("io", seq, seq % 2))
                elif r < 0.88:
                    chunk.append(frame("membw", seq, 1000))
                elif r < 0.96:
                    chunk.append(frame("wake", seq, 500 | 99 << 32))
                else:
                    chunk.append(frame("register", seq, CAPS))
            # A few malformed frames and garbage a second (the limit is 20).
            if rng.random() < 0.01:
                chunk.append(FRAME.pack(b"CS", 7, 3, seq, 1) + b"garbage!")  # version 7
            data = memoryview(b"".join(chunk))
            chunk.clear()
            try:
                while data:
                    data = data[os.write(out, data):]
                    sent += FRAME.size * 256
            except OSError:
                break
            self.sent.value = sent


@contextlib.contextmanager
def realtime(tids, priority=50):
    """SCHED_FIFO `priority` for threads `tids` (ours), put back as they were afterwards; with
    SCHED_RESET_ON_FORK, so that what they start (`cosched status`, the flood's process) is not."""
    before = {}
    try:
        for t in tids:
            before[t] = (os.sched_getscheduler(t), os.sched_getparam(t))
            os.sched_setscheduler(t, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(priority))
        yield
    finally:
        for t, (pol, param) in before.items():
            with contextlib.suppress(OSError):
                os.sched_setscheduler(t, pol, param)


def isolation(seconds, rounds=200, seed=None, log=print):
    """Two VMs, one hostile. Returns the figures: the victim's boost latency quiet and under the
    flood, what the flood did, the per-turn read bound, and every difference found on the threads
    of the host and of the victim."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="cosched-isolation-") as tmp:
        (Path(tmp) / "d" / "vms").mkdir(parents=True)
        vms = []
        d = rt = None
        try:
            victim, hostile = FakeVm(tmp, "victim", spin=False), FakeVm(tmp, "hostile", spin=False, replies="caller")
            vms = [victim, hostile]
            hostile_tids = set(hostile.tids())
            # The victim's side runs real-time below the daemon: its relay (the fake QEMU's main
            # thread) at SCHED_FIFO 50, this measuring thread at 40 (it polls; the relay must
            # preempt it). Else what is measured is how the flood's writer and relay
            # (SCHED_OTHER) delay them, not how the daemon does.
            rt = contextlib.ExitStack()
            rt.enter_context(realtime([victim.proc.pid], 50))
            rt.enter_context(realtime([threading.get_native_id()], 40))
            base = snapshot(skip_pids={hostile.proc.pid})
            d = harness.Daemon(Path(tmp) / "d", ISOLATION_CONFIG)
            deadline = time.time() + 10
            while len((d.status() or {}).get("vms", [])) < 2:
                if time.time() > deadline:
                    raise RuntimeError("the daemon did not find both VMs")
                time.sleep(0.02)
            victim.send("register", 1)
            hostile.send("register", CAPS)
            time.sleep(0.2)
            quiet = boost_latencies(victim, rounds, rng)
            st0, st0_at = d.status(), time.monotonic()
            flood = Hostile(hostile, rng.randrange(1 << 32))
            flood.start()
            t0 = time.monotonic()
            time.sleep(0.2)  # the flood under way
            under = boost_latencies(victim, rounds, rng)
            while time.monotonic() - t0 < seconds:
                time.sleep(0.1)
            flood.stop(5)
            flood_s = time.monotonic() - t0
            st1, st1_at = d.status(), time.monotonic()
            time.sleep(0.3)
            # The victim deboosted: the host and the victim exactly as before the daemon.
            after = snapshot(skip_pids={hostile.proc.pid, d.proc.pid})
            diffs = differences(base, after)
        finally:
            if d is not None:
                d.stop()
            for v in vms:
                v.stop()
            if rt is not None:
                rt.close()
    c0, c1 = st0["daemon"]["cost"], st1["daemon"]["cost"]
    frames = c1["frames"] - c0["frames"]
    loop_busy_pct = round((c1["loop_ns"] - c0["loop_ns"]) / 1e9 / max(st1_at - st0_at, 1e-9) * 100, 1)
    # What one more frame read costs the loop: reading, decoding, the coordinator, actuation and
    # the replies, over the frames processed during the flood. (The loop's whole time over the
    # frames counts its idle turns too once the flood no longer keeps it busy.)
    path_ns = sum(c1[k] - c0[k] for k in ("read_ns", "decode_ns", "coordinator_ns", "actuate_ns",
                                           "encode_ns", "write_ns"))
    per_frame_us = path_ns / max(frames, 1) / 1000
    hv = next(v for v in st1["vms"] if v["name"] == "hostile")
    vv = next(v for v in st1["vms"] if v["name"] == "victim")

    def denied(v):
        """DENY replies by reason: the VM's own (registration, malformed) and its resources'."""
        out = dict(v["counters"].get("denied", {}))
        for res in v.get("resources", {}).values():
            for reason, n in res.get("counters", {}).get("denied", {}).items():
                out[reason] = out.get(reason, 0) + n
        return dict(sorted(out.items()))

    return {
        "quiet_p50_us": pct(quiet, 50), "quiet_p99_us": pct(quiet, 99), "quiet_max_us": pct(quiet, 100),
        "flood_p50_us": pct(under, 50), "flood_p99_us": pct(under, 99), "flood_max_us": pct(under, 100),
        "victim_missed": sum(x is None for x in quiet + under),
        "victim_denied": denied(vv),
        "flood_mb": round(flood.bytes / 1e6, 1), "flood_frames_per_s": round(frames / flood_s),
        "hostile_registered_at_end": hv.get("registered"), "hostile_malformed": hv["counters"].get("malformed"),
        "hostile_denied": denied(hv), "hostile_read_held": hv.get("read_held"),
        "hostile_sent_frames_per_s": round(flood.bytes / FRAME.size / flood_s),
        "read_rate": st1["daemon"].get("read_rate_per_vm"),
        "per_frame_us": round(per_frame_us, 2), "turn_bound_us": round(FRAMES_PER_TURN * per_frame_us),
        "differences": diffs, "hostile_threads": len(hostile_tids), "rounds": rounds, "loop_busy_pct": loop_busy_pct,
        "cost_ms": {k: round((c1[k] - c0[k]) / 1e6, 1) for k in c1 if k.endswith("_ns") and isinstance(c1[k], int)},
        "cost_counts": {k: c1[k] - c0[k] for k in c1 if not k.endswith("_ns") and isinstance(c1[k], int)},
    }


def isolation_text(r, seconds):
    delay = None if r["flood_p99_us"] is None else round(r["flood_p99_us"] - r["quiet_p50_us"])
    bound_met = delay is not None and delay <= r["turn_bound_us"]
    return f"""## Isolation

Command: `sudo /usr/bin/python3 bench/reliability.py isolation --seconds {seconds:g}`.
Two synthetic VMs under the daemon (default `daemon_priority` 99). "hostile" floods its channel
as fast as the socket takes it, from a process of its own: CPU 1 at the highest guest priority
and CPU 0, IO, MEMBW 1000, WAKE, REGISTER again, and a few malformed frames and garbage (under
the rate that would deregister it). "victim" asks for a boost {r['rounds']} times before and {r['rounds']} times during
the flood, and the time from its CPU 1 to its vCPU seen at SCHED_RR (polled every 20 µs) is
measured. The victim's side runs real-time below the daemon: its fake QEMU's relay thread at
SCHED_FIFO 50, the measuring thread at 40. So the delay measured is the daemon's, not the
SCHED_OTHER flood's scheduling of the victim's own processes on this 2-CPU host.

- The flood: {r['flood_mb']} MB written, {r['hostile_sent_frames_per_s']} frames/s: as fast as its channel took them, which
  is as fast as the daemon read them: at most `read_rate` = {r['read_rate']} frames/s per VM (twice what
  a guest within every rate limit can send), what is sent beyond waiting in the channel. The
  hostile VM was held back {r['hostile_read_held']} times; {r['flood_frames_per_s']} frames/s processed; answered
  `DENY` {sum(r['hostile_denied'].values())} times ({', '.join(f"{k} {v}" for k, v in r['hostile_denied'].items())}).
- Threads of the host and of the victim changed by it: **{len(r['differences'])}** (every thread
  compared with a snapshot from before the daemon, once the victim was deboosted){': ' + '; '.join(r['differences'][:5]) if r['differences'] else ''}.
- The victim's boosts: {r['victim_missed']} missed, denials {r['victim_denied'] or 'none'}.
- The per-turn read bound: the daemon reads at most {FRAMES_PER_TURN} frames (8 × 4 KiB) from one VM
  per loop turn (its read budget stores no more), and a VM that used its whole share is read
  after the others in the next turn. A victim's frame so waits at most for one share. At
  {r['per_frame_us']} µs a frame (reading, decoding, the coordinator, actuation and the replies during the
  flood, over the frames processed) that is **{r['turn_bound_us']} µs**. The flood kept the
  daemon's loop busy {r['loop_busy_pct']}% of the time.
- The victim's boost latency, quiet: p50 {r['quiet_p50_us']} µs, p99 {r['quiet_p99_us']} µs, max {r['quiet_max_us']} µs;
  under the flood: p50 {r['flood_p50_us']} µs, p99 {r['flood_p99_us']} µs, max {r['flood_max_us']} µs.

Target: the hostile VM delays the victim's boost by no more than the per-turn bound:
**{"met" if bound_met else "NOT met"}** (p99 under the flood {r['flood_p99_us']} µs less the quiet p50 {r['quiet_p50_us']} µs:
{delay} µs, against the bound of {r['turn_bound_us']} µs).
"""


# ---------------------------------------------------------------------------------------------
# Soak

# The daemon of the soak: the defaults (FIFO 99, budgets, the RT guard, the ioprio I/O lever,
# event boosting for VMs without an agent, predictive boost), but every VM may be boosted at once
# (no host reserve: on 2 CPUs it would let one vCPU be boosted at a time, and the probe's boosts
# would be denied whenever a flood VM holds one), and memory bandwidth regulated on simulated
# counters (there are no PMU counters here). The paths are in it so that operator commands find
# the daemon with `cosched --config <dir>/host.toml`.
SOAK_CONFIG = """socket_dir = "{d}/vms"
state_dir = "{d}/state"
control_socket = "{d}/control.sock"
[policy]
host_reserve_cpus = 0
max_boosted_vcpus = 64
[membw]
backend = "simulated"
trace = "{trace}"
guaranteed_mbps = 1000
"""
# The daemon's rate limit (crates/core/src/policy.rs, Policy::default): frame_rate = 2000
# requests a second per VM and resource (token bucket, burst frame_burst = 200), REGISTER on a
# bucket of the same size; malformed frames: malformed_rate = 20 a second (burst 20), past which
# a registered VM is deregistered. A flood VM sends at most FRAME_RATE frames a second in all.
FRAME_RATE = 2000
MALFORMED_RATE = 20
REPLY_WINDOW_S = 5.0  # a frame not answered within this is unanswered
TICK_S = 0.01
PROBE_PERIOD_S = 0.5


def valid_frame(rng, seq):
    """(kind name, 16 bytes): a random well-formed guest frame."""
    r = rng.random()
    if r < 0.52:
        c = rng.random()
        v = 0 if c < 0.45 else 1 if c < 0.65 else (1 | rng.randint(1, 99) << 8) if c < 0.9 else (1 | 1 << 16)
        return "cpu", frame("cpu", seq, v)
    if r < 0.70:
        return "io", frame("io", seq, rng.randint(0, 1))
    if r < 0.82:
        return "membw", frame("membw", seq, rng.choice((0, rng.randint(1, 300))))
    if r < 0.99:
        delay = 0 if rng.random() < 0.2 else rng.randint(100, 20000)
        return "wake", frame("wake", seq, delay | rng.randint(0, 99) << 32)
    if r < 0.999:
        return "register", frame("register", seq, rng.choice((CAPS, CAPS, 1, 1 | 2, 8 | CAPS)))
    return "deregister", frame("deregister", seq, 0)


def invalid_frame(rng, seq):
    """(kind name, bytes): a frame with a readable header (answered DENY(malformed) with its seq),
    or (garbage, bytes) that does not start a frame (answered DENY(malformed) seq 0)."""
    r = rng.random()
    pack = lambda kind, value: FRAME.pack(b"CS", 1, kind, seq, value)  # noqa: E731
    if r < 0.25:
        return "unknown_type", pack(rng.choice((0, 7, 0x30, 0x7f, 0x84, 0xff)), rng.getrandbits(64))
    if r < 0.55:
        kind, value = rng.choice(((3, 2), (3, 1 | 100 << 8), (4, 2), (5, 1001), (2, 1), (6, 1 << 40)))
        return "invalid_value", pack(kind, value)
    if r < 0.80:
        # Host-to-guest kinds from a guest (ACK, DENY, DISABLE, ENABLE) are a protocol violation.
        return "wrong_direction", pack(rng.choice((ACK, DISABLE, ENABLE)), rng.randint(0, 7))
    # Bytes below 0x43 ("C") never start a frame header.
    return "garbage", bytes(rng.randrange(0, 0x43) for _ in range(rng.randint(5, 40)))


class SoakVm:
    """A flood VM of the soak: its fake QEMU (replies read by the soak's loop), its rates, and
    what became of each frame it sent: answered (ACK or DENY with its seq), unanswered (its
    reply window, REPLY_WINDOW_S, passed while the VM was there), or in flight when it was
    killed (its window not fully observed: not counted either way)."""

    def __init__(self, tmp, name, rng):
        self.vm = FakeVm(tmp, name, spin=False, replies="caller")
        self.name, self.rng = name, rng
        self.rate = rng.uniform(100, FRAME_RATE)
        self.invalid_rate = rng.uniform(0.5, 15)
        self.wfd, self.rfd = self.vm.proc.stdin.fileno(), self.vm.proc.stdout.fileno()
        os.set_blocking(self.wfd, False)
        os.set_blocking(self.rfd, False)
        self.state = "arriving"  # active, draining (no more frames), dying (killed), gone
        self.seq = 0
        self.pending = {}  # seq -> (sent at, kind)
        self.outbuf, self.inbuf = bytearray(), b""
        self.carry = self.invalid_carry = 0.0
        self.need_register, self.registering = True, None
        self.sent = {}  # by kind (garbage: runs)
        self.answered = self.unanswered = self.lost = self.extra = 0
        self.replies = {}  # "ack", "deny:<reason>"
        self.unsolicited = {}  # seq 0: "deny:<reason>", "disable", "enable"
        self.examples = []  # the first unanswered frames
        self.drain_until = None

    def pid(self):
        return self.vm.proc.pid

    def _count(self, d, k, n=1):
        d[k] = d.get(k, 0) + n

    def _frame(self, kind, data, now):
        self.outbuf += data
        self._count(self.sent, kind)
        if kind != "garbage":
            self.pending[self.seq] = (now, kind)

    def generate(self, dt, now, malformed_burst=False):
        """The frames of `dt` seconds at its rates (a late tick does not catch up: never faster
        than the rate)."""
        dt = min(dt, 5 * TICK_S)
        self.carry += self.rate * dt
        self.invalid_carry += self.invalid_rate * dt
        rng = self.rng
        n, self.carry = int(self.carry), self.carry % 1
        for _ in range(n):
            self.seq += 1
            if self.need_register and self.registering is None:
                self.registering = self.seq
                self._frame("register", frame("register", self.seq, CAPS), now)
                continue
            kind, data = valid_frame(rng, self.seq)
            if kind == "deregister":
                self.need_register = True
            self._frame(kind, data, now)
        k, self.invalid_carry = int(self.invalid_carry), self.invalid_carry % 1
        for _ in range(k + (MALFORMED_RATE + 5 if malformed_burst else 0)):
            self.seq += 1
            kind, data = invalid_frame(rng, self.seq)
            self._frame(kind, data, now)

    def flush(self):
        """Writes what the pipe takes now; the rest waits for the next turn."""
        if not self.outbuf or self.state in ("dying", "gone"):
            return
        try:
            n = os.write(self.wfd, self.outbuf)
            del self.outbuf[:n]
        except BlockingIOError:
            pass
        except (BrokenPipeError, OSError):
            self.outbuf.clear()

    def read(self, now):
        """Reads the replies there are; False at the pipe's end (the fake exited)."""
        try:
            data = os.read(self.rfd, 1 << 16)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            return False
        buf = self.inbuf + data
        whole = len(buf) // FRAME.size * FRAME.size
        for _, _, kind, seq, value in FRAME.iter_unpack(buf[:whole]):
            what = "ack" if kind == ACK else f"deny:{DENY_REASONS.get(value & 0xff, value)}" if kind == DENY \
                else {DISABLE: "disable", ENABLE: "enable"}.get(kind, f"kind {kind:#x}")
            if seq == 0:
                self._count(self.unsolicited, what)
                continue
            if self.pending.pop(seq, None) is None:
                self.extra += 1  # a second reply, or one to no frame of ours
                continue
            self.answered += 1
            self._count(self.replies, what)
            if seq == self.registering:
                self.registering = None
                self.need_register = what != "ack"
            elif what == "deny:not_registered" and self.registering is None:
                self.need_register = True
        self.inbuf = buf[whole:]
        return True

    def expire(self, now):
        """Frames whose reply window has passed unanswered."""
        while self.pending:
            seq = next(iter(self.pending))
            t, kind = self.pending[seq]
            if now - t < REPLY_WINDOW_S:
                break
            del self.pending[seq]
            self.unanswered += 1
            if seq == self.registering:
                self.registering = None
            if len(self.examples) < 5:
                self.examples.append(f"{self.name} seq {seq} ({kind})")

    def leave(self, graceful, now):
        """Departs: gracefully (stops sending, waits for its replies, then its stdin closes and it
        exits as QEMU would) or killed at once (SIGKILL, a QEMU crash)."""
        if graceful:
            self.state = "draining"
            self.drain_until = now + REPLY_WINDOW_S
        else:
            self.expire(now)
            self.state = "dying"
            self.outbuf.clear()
            self.vm.proc.kill()

    def close_input(self):
        self.outbuf.clear()
        try:
            self.vm.proc.stdin.close()
        except OSError:
            pass

    def finish(self):
        """At the pipe's end: what is still pending was in flight when it went."""
        self.lost += len(self.pending)
        self.pending.clear()
        self.state = "gone"
        self.vm.stop()


def _probe_main(tmp, name, seed, conn, rt=True):
    """The probe VM, in a process of its own (so that the soak's loop does not delay its
    polling): registers for the CPU, then every PROBE_PERIOD_S asks for a boost and measures as
    boost_latencies does, the time from its CPU 1 to its vCPU seen at SCHED_RR. Sends the parent
    (t, µs or None, reply) per round. With `rt`, as in `isolation`, its relay runs at SCHED_FIFO
    50 and its polling thread at 40, below the daemon: what is measured is then the daemon's
    delay, not how the fake QEMUs and the soak's loop (SCHED_OTHER) delay the probe."""
    harness.dies_with_us(signal.SIGKILL)()
    rng = random.Random(seed)
    vm = FakeVm(tmp, name, spin=False, replies="keep")
    stack = contextlib.ExitStack()
    try:
        if rt:
            stack.enter_context(realtime([vm.proc.pid], 50))
            stack.enter_context(realtime([threading.get_native_id()], 40))
        conn.send(("pid", vm.proc.pid))
        if conn.recv() != "go":
            return
        tid = vcpu_of(vm)
        registered = False
        while not conn.poll(0):
            if not registered:
                registered = vm.reply(vm.send("register", 1), 2.0) == ("ack", 1)
                if not registered:
                    time.sleep(0.2)
                    continue
            t0 = time.perf_counter()
            seq = vm.send("cpu", 1)
            while harness.policy(tid) != os.SCHED_RR and time.perf_counter() - t0 < 1.0:
                pass
            lat = (time.perf_counter() - t0) * 1e6 if harness.policy(tid) == os.SCHED_RR else None
            reply = vm.reply(seq, 1.0)
            vm.reply(vm.send("cpu", 0), 1.0)
            t1 = time.perf_counter()
            while harness.policy(tid) != os.SCHED_OTHER and time.perf_counter() - t1 < 1.0:
                time.sleep(0.0002)
            conn.send((time.monotonic(), lat, reply and "/".join(map(str, reply))))
            if reply == ("deny", "not_registered"):
                registered = False
            time.sleep(max(0.0, PROBE_PERIOD_S * rng.uniform(0.8, 1.2) - (time.perf_counter() - t0)))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass
    finally:
        stack.close()
        vm.stop()


def pct(xs, p):
    """The p-th percentile (nearest rank) of the numbers in xs (None left out); None if none."""
    xs = sorted(x for x in xs if x is not None)
    return round(xs[min(len(xs) - 1, int(p / 100 * len(xs)))], 1) if xs else None


def proc_sample(pid):
    """(RSS in KiB, open fds, threads, CPU seconds) of process `pid`."""
    rss = next(int(l.split()[1]) for l in Path(f"/proc/{pid}/status").read_text().splitlines()
               if l.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task")), harness.cpu_time_s(pid)


class Operator:
    """Operator commands at random, through the CLI as an operator types them
    (`cosched --config <dir>/host.toml ...`); what they turn off is turned back on a few
    seconds later. Never aimed at the probe VM (its boosts are the latency measured); the
    host-wide `disable` reaches it too, and its denied boosts are counted apart."""

    def __init__(self, config, rng):
        self.config, self.rng = config, rng
        self.later = []  # (when, args): the undo of an earlier command
        self.counts, self.failures, self.errors = {}, {}, {}

    def run(self, args):
        name = " ".join(a for a in args[:2] if not a[0].isdigit() and not a.startswith("-")
                        and not a.startswith("flood-"))
        self.counts[name] = self.counts.get(name, 0) + 1
        try:
            r = subprocess.run([str(harness.COSCHED), "--config", str(self.config), *args], capture_output=True,
                               text=True, timeout=10)
            ok, err = r.returncode == 0, (r.stderr.strip().splitlines() or [""])[-1]
        except subprocess.TimeoutExpired:
            ok, err = False, "timed out (10 s)"
        if not ok:
            self.failures[name] = self.failures.get(name, 0) + 1
            # One example per kind of error, numbers and VM names left out.
            key = " ".join("N" if w.strip(",.:;()").isdigit() else "VM" if "flood-" in w else w
                           for w in err.split(" (connected:")[0].split())[:160]
            self.errors[key] = self.errors.get(key, 0) + 1
        return ok

    def random_command(self, vms, now):
        rng = self.rng
        res = rng.choice(("cpu", "io", "membw", None))
        vm = rng.choice(vms) if vms else None
        r = rng.random()
        if r < 0.12 or vm is None:
            return self.run(["status"])
        if r < 0.22:
            return self.run(["status", "--json"])
        if r < 0.30:
            return self.run(["metrics"])
        if r < 0.38:
            self.later.append((now + rng.uniform(1, 5), ["enable"] + ([res] if res else [])))
            return self.run(["disable"] + ([res] if res else []))
        if r < 0.50:
            self.later.append((now + rng.uniform(1, 10), ["vm", "enable", vm] + ([res] if res else [])))
            return self.run(["vm", "disable", vm] + ([res] if res else []))
        if r < 0.60:
            return self.run(["vm", "priority", vm, str(rng.randint(1, 40))])
        if r < 0.67:
            return self.run(["vm", "ceiling", vm, str(rng.randint(2, 49))])
        if r < 0.80:
            guard = rng.choice(("true", "false"))
            self.later.append((now + rng.uniform(2, 20), ["vm", "static", vm, "--fifo", "false", "--guard", "false"]))
            return self.run(["vm", "static", vm, "--fifo", "true", "--guard", guard])
        if r < 0.90:
            return self.run(["vm", "membw", vm, str(rng.randint(0, 300))])
        return self.run(["membw", "--period-ms", str(rng.choice((10, 20, 50))), "--reclaim",
                         rng.choice(("true", "false")), "--best-effort", rng.choice(("true", "false"))])

    def due(self, now):
        for item in [x for x in self.later if x[0] <= now]:
            self.later.remove(item)
            self.run(item[1])


def soak(minutes, nvms, seed=None, log=print, csv_path=None, probe_rt=True):
    """`nvms` flood VMs and a probe VM under one daemon for `minutes`; returns the figures (see
    soak_text). Samples every ~10 s (csv_path: written as they come). probe_rt: the probe's side
    real-time below the daemon (else SCHED_OTHER, as the soak's first runs had it)."""
    import multiprocessing
    if seed is None:
        seed = random.randrange(1 << 32)  # recorded, so that a run can be repeated
    rng = random.Random(seed)
    duration = minutes * 60
    warmup = min(300.0, duration / 6)
    window = min(600.0, duration / 3)
    sample_every = min(10.0, duration / 10)
    churn_mean = min(30.0, duration / 8)
    op_mean = min(10.0, duration / 12)
    res = {"minutes": minutes, "vms": nvms, "seed": seed, "warmup_s": warmup, "window_s": window,
           "probe_rt": probe_rt, "samples": [], "probe": [], "arrivals": 0, "graceful": 0, "killed": 0, "malformed_bursts": 0}
    with tempfile.TemporaryDirectory(prefix="cosched-soak-") as tmp:
        dd = Path(tmp) / "d"
        (dd / "vms").mkdir(parents=True)
        trace = Path(tmp) / "membw.trace"
        trace.write_text("0 * 1000\n")
        # The binaries under test, copied: a rebuild of target/ during the soak changes nothing here.
        global FAKE
        exe, fake = Path(tmp) / "cosched", Path(tmp) / "cosched-fake-qemu"
        shutil.copy2(harness.COSCHED, exe)
        shutil.copy2(FAKE, fake)
        res["binary_sha256"] = subprocess.run(["sha256sum", str(exe)], capture_output=True,
                                              text=True).stdout.split()[0]
        old_cosched, harness.COSCHED = harness.COSCHED, exe
        old_fake, FAKE = FAKE, fake
        d, probe, conn, flood = None, None, None, []
        csv_file = open(csv_path, "w", newline="") if csv_path else None
        writer = None
        try:
            ours = set()
            base = snapshot(ours=ours)
            groups0 = own_groups()
            d = harness.Daemon(dd, SOAK_CONFIG.format(d=dd, trace=trace))
            dpid = d.proc.pid
            time.sleep(1)
            res["baseline"] = dict(zip(("rss_kib", "fds", "threads", "cpu_s"), proc_sample(dpid)))
            op = Operator(dd / "host.toml", random.Random(rng.random()))
            # The probe.
            ctx = multiprocessing.get_context("spawn")
            conn, child = ctx.Pipe()
            probe = ctx.Process(target=_probe_main, args=(tmp, "probe", rng.random(), child, probe_rt), daemon=True)
            probe.start()
            child.close()
            if not conn.poll(30):
                raise RuntimeError("the probe VM did not start")
            probe_pid = conn.recv()[1]
            ours.add(probe_pid)
            counter = [0]

            def arrive():
                counter[0] += 1
                v = SoakVm(tmp, f"flood-{counter[0]}", random.Random(rng.random()))
                flood.append(v)
                ours.add(v.pid())
                res["arrivals"] += 1
                return v

            for _ in range(nvms):
                arrive()
            deadline = time.time() + 20
            while True:
                listed = {v.get("pid") for v in (d.status() or {}).get("vms", [])}
                if probe_pid in listed and all(v.pid() in listed for v in flood):
                    break
                if time.time() > deadline:
                    raise RuntimeError("the daemon did not find the VMs:\n" + (dd / "daemon.log").read_text()[-2000:])
                time.sleep(0.05)
            for v in flood:
                v.state = "active"
            conn.send("go")
            log(f"soak: {nvms} flood VMs at {', '.join(f'{v.rate:.0f}' for v in flood)} frames/s, and the probe; "
                f"{minutes:g} min, warm-up {warmup:.0f} s, samples every {sample_every:.0f} s")

            t0 = time.monotonic()
            end = t0 + duration
            now = t0
            last_tick = next_tick = t0
            next_sample = t0 + sample_every
            next_churn = t0 + rng.expovariate(1 / churn_mean)
            next_op = t0 + rng.expovariate(1 / op_mean)
            next_expire = t0 + 1
            next_arrival_check = t0
            to_arrive = []  # when a replacement VM starts
            prev = {"t": 0.0, "sent": 0, "answered": 0, "probe": 0}
            gone = []

            def totals():
                vs = flood + gone
                return {"sent": sum(sum(v.sent.values()) for v in vs),
                        "answered": sum(v.answered for v in vs),
                        "unanswered": sum(v.unanswered for v in vs), "lost": sum(v.lost for v in vs),
                        "extra": sum(v.extra for v in vs)}

            def take_sample(t):
                rss, fds, threads, cpu_s = proc_sample(dpid)
                st = d.status() or {}
                tot = totals()
                live = [v for v in st.get("vms", []) if v.get("pid") in ours]
                lat = [p[1] for p in res["probe"][prev["probe"]:] if p[1] is not None and (p[2] or "").startswith("ack")]
                row = {"t_s": round(t, 1), "rss_kib": rss, "fds": fds, "threads": threads,
                       "cpu_s": round(cpu_s, 2), "load1": os.getloadavg()[0],
                       "foreign_qemus": len(harness.foreign_qemus(ours)), "vms": len(live),
                       "frames_per_s": round((tot["sent"] - prev["sent"]) / max(t - prev["t"], 1e-9)),
                       "sent": tot["sent"], "answered": tot["answered"], "unanswered": tot["unanswered"],
                       "lost_at_kill": tot["lost"], "extra_replies": tot["extra"],
                       "dropped_replies": sum(v.get("dropped_replies", 0) for v in live),
                       "probe_rounds": len(res["probe"]) - prev["probe"], "probe_p50_us": pct(lat, 50),
                       "probe_p99_us": pct(lat, 99), "probe_max_us": pct(lat, 100)}
                prev.update(t=t, sent=tot["sent"], answered=tot["answered"], probe=len(res["probe"]))
                res["samples"].append(row)
                nonlocal writer
                if csv_file:
                    if writer is None:
                        writer = csv.DictWriter(csv_file, fieldnames=list(row))
                        writer.writeheader()
                    writer.writerow(row)
                    csv_file.flush()
                log(f"soak {t:6.0f} s: rss {rss} KiB, fds {fds}, threads {threads}, load {row['load1']:.2f}, "
                    f"vms {row['vms']}, {row['frames_per_s']} frames/s, unanswered {tot['unanswered']}, "
                    f"probe p99 {row['probe_p99_us']} µs")

            while True:
                now = time.monotonic()
                if now >= end:
                    break
                live = [v for v in flood if v.state not in ("gone",)]
                rfds = [v.rfd for v in live] + [conn]
                wfds = [v.wfd for v in live if v.outbuf and v.state in ("active", "draining")]
                wait = max(0.0, min(next_tick, next_sample, next_churn, next_op, end) - now)
                r, w, _ = select.select(rfds, wfds, [], wait)
                now = time.monotonic()
                by_fd = {v.rfd: v for v in live}
                for fd in r:
                    if fd is conn:
                        try:
                            while conn.poll(0):
                                res["probe"].append(conn.recv())
                        except EOFError:
                            raise RuntimeError("the probe VM's process died")
                        continue
                    v = by_fd[fd]
                    if not v.read(now):
                        v.finish()
                wby = {v.wfd: v for v in live}
                for fd in w:
                    wby[fd].flush()
                if now >= next_tick:
                    dt = now - last_tick
                    last_tick = now
                    next_tick = max(next_tick + TICK_S, now)
                    for v in flood:
                        if v.state == "active":
                            burst = rng.random() < dt / 600  # once in ~10 minutes per VM
                            res["malformed_bursts"] += burst
                            v.generate(dt, now, burst)
                            v.flush()
                        elif v.state == "draining" and (not v.pending or now >= v.drain_until):
                            v.expire(now + REPLY_WINDOW_S)  # what is left is unanswered
                            v.close_input()
                            v.state = "closing"
                if now >= next_expire:
                    next_expire = now + 1
                    for v in flood:
                        if v.state in ("active", "draining"):
                            v.expire(now)
                    # Gone VMs: their totals kept, their processes reaped.
                    for v in [v for v in flood if v.state == "gone"]:
                        flood.remove(v)
                        gone.append(v)
                if now >= next_churn:
                    next_churn = now + rng.expovariate(1 / churn_mean)
                    active = [v for v in flood if v.state == "active"]
                    if active:
                        graceful = rng.random() < 0.7
                        rng.choice(active).leave(graceful, now)
                        res["graceful" if graceful else "killed"] += 1
                        to_arrive.append(now + rng.uniform(0, 5))
                for when in [x for x in to_arrive if x <= now]:
                    to_arrive.remove(when)
                    arrive()
                if now >= next_arrival_check and any(v.state == "arriving" for v in flood):
                    next_arrival_check = now + 0.5
                    listed = {v.get("pid") for v in (d.status() or {}).get("vms", [])}
                    for v in flood:
                        if v.state == "arriving" and v.pid() in listed:
                            v.state = "active"
                if now >= next_op:
                    next_op = now + rng.expovariate(1 / op_mean)
                    op.random_command([v.name for v in flood if v.state == "active"], now)
                op.due(now)
                if now >= next_sample:
                    next_sample += sample_every
                    take_sample(now - t0)
            # The end: the operator's changes undone, every VM drained and gone, the probe stopped;
            # then the daemon's fds and threads against its baseline without VMs.
            for _, args in op.later:
                op.run(args)
            op.later.clear()
            take_sample(time.monotonic() - t0)
            res["at_end_with_vms"] = res["samples"][-1]
            drain_end = time.monotonic() + REPLY_WINDOW_S
            for v in flood:
                if v.state in ("active", "arriving"):
                    v.state = "draining"
            while any(v.state == "draining" and v.pending for v in flood) and time.monotonic() < drain_end:
                r, _, _ = select.select([v.rfd for v in flood if v.state == "draining"], [], [], 0.05)
                for v in flood:
                    if v.rfd in r and not v.read(time.monotonic()):
                        v.finish()
            for v in flood:
                if v.state == "draining":
                    v.expire(time.monotonic() + REPLY_WINDOW_S)
                if v.state != "gone":
                    v.close_input()
                    v.vm.proc.wait(10)
                    os.set_blocking(v.rfd, True)
                    while v.read(time.monotonic()):
                        pass
                    v.finish()
            gone += flood
            flood.clear()
            conn.send("stop")
            deadline = time.time() + 10
            while time.time() < deadline:
                try:
                    if conn.poll(0.1):
                        msg = conn.recv()
                        if isinstance(msg, tuple) and len(msg) == 3:
                            res["probe"].append(msg)
                    elif not probe.is_alive():
                        break
                except (EOFError, OSError):
                    break
            probe.join(5)
            deadline = time.time() + 10
            while [v for v in (d.status() or {}).get("vms", []) if v.get("pid") in ours]:
                if time.time() > deadline:
                    raise RuntimeError("VMs still listed by the daemon after they all exited")
                time.sleep(0.1)
            time.sleep(1)
            res["final"] = dict(zip(("rss_kib", "fds", "threads", "cpu_s"), proc_sample(dpid)))
            res["daemon_log"] = (dd / "daemon.log").read_text()
            d.stop()
            time.sleep(0.3)
            res["differences"] = differences(base, snapshot(skip_pids={dpid}, ours=set()))
            res["groups_left"] = sorted(set(own_groups()) - set(groups0))
            res["daemon_left"] = Path(f"/proc/{dpid}").exists()
        finally:
            if conn is not None:
                try:
                    conn.send("stop")
                except (OSError, ValueError):
                    pass
            if probe is not None:
                probe.join(5)
                if probe.is_alive():
                    probe.kill()
                    probe.join()
            for v in flood:
                v.vm.stop()
            if d is not None:
                d.stop()
                # groups_left counted them; a failing soak leaves nothing either.
                remove_groups(set(own_groups()) - set(groups0))
            harness.COSCHED, FAKE = old_cosched, old_fake
            if csv_file:
                csv_file.close()
    vs = gone
    res.update(sent={}, replies={}, unsolicited={}, examples=[], operator=op.counts, operator_failures=op.failures,
               operator_errors=op.errors)
    for v in vs:
        for src, dst in ((v.sent, "sent"), (v.replies, "replies"), (v.unsolicited, "unsolicited")):
            for k, n in src.items():
                res[dst][k] = res[dst].get(k, 0) + n
        res["examples"] += v.examples
    res.update(totals={"sent": sum(sum(v.sent.values()) for v in vs), "answered": sum(v.answered for v in vs),
                       "unanswered": sum(v.unanswered for v in vs), "lost_at_kill": sum(v.lost for v in vs),
                       "extra": sum(v.extra for v in vs)})
    res["rates"] = sorted(round(v.rate) for v in vs)
    res["duration_s"] = duration
    res["probe"] = [(round(t - t0, 3), lat, reply) for t, lat, reply in res["probe"]]
    return res


def soak_verdicts(r):
    """Each target of the soak: (key, name, met, the figures)."""
    s, tot = r["samples"], r["totals"]
    during = [x for x in s if x["t_s"] >= r["warmup_s"]] or s[-1:]
    warm = during[0]
    end = r["at_end_with_vms"]
    growth = (end["rss_kib"] - warm["rss_kib"]) / 1024
    peak = (max(x["rss_kib"] for x in during) - warm["rss_kib"]) / 1024
    if len(during) > 2:
        ts, ys = [x["t_s"] for x in during], [x["rss_kib"] for x in during]
        mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
        slope = sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / max(sum((t - mt) ** 2 for t in ts), 1e-9)
    else:
        slope = 0.0
    dropped = max((x["dropped_replies"] for x in s), default=0)
    b, f = r["baseline"] or {}, r["final"] or {}
    first = [lat for t, lat, rep in r["probe"] if t < r["window_s"] and lat is not None and (rep or "").startswith("ack")]
    last = [lat for t, lat, rep in r["probe"]
            if t >= r["duration_s"] - r["window_s"] and lat is not None and (rep or "").startswith("ack")]
    p1, p2 = pct(first, 99), pct(last, 99)
    ratio = p2 / p1 if p1 and p2 else None
    return [
        ("answered", "every frame answered", tot["unanswered"] == 0 and tot["extra"] == 0 and dropped == 0,
         f"{tot['unanswered']} unanswered of {tot['answered'] + tot['unanswered']} frames whose reply window was "
         f"observed, {tot['extra']} second replies, {dropped} replies dropped by the daemon"),
        ("rss", "RSS growth after warm-up ≤ 1 MiB", growth <= 1.0,
         f"{warm['rss_kib'] / 1024:.2f} MiB at {warm['t_s']:.0f} s, {end['rss_kib'] / 1024:.2f} MiB at the end "
         f"({growth:+.2f} MiB; highest {peak:+.2f} MiB; trend {slope * 3600 / 1024:+.2f} MiB/h)"),
        # None where the run's files do not say (a soak that wrote no soak.json).
        ("fds", "no fd leak", f["fds"] == b["fds"] if b and f else None,
         f"{b.get('fds')} fds before the first VM, {f.get('fds')} after the last had gone"),
        ("threads", "no thread leak", f["threads"] == b["threads"] if b and f else None,
         f"{b.get('threads')} thread(s) before the first VM, {f.get('threads')} after the last had gone"),
        ("latency", "probe p99 last window ≤ 1.2 × first", ratio is not None and ratio <= 1.2,
         f"p99 {p1} µs in the first {r['window_s'] / 60:.2g} min ({len(first)} boosts), {p2} µs in the last "
         f"({len(last)} boosts): × {ratio:.2f}" if ratio else f"not enough boosts ({len(first)}, {len(last)})"),
    ]


def soak_text(r, command):
    s, tot = r["samples"], r["totals"]
    verdicts = soak_verdicts(r)
    table = "\n".join(f"| {n} | {'met' if ok else '**NOT met**'} | {why} |" for _, n, ok, why in verdicts)
    sent = r["sent"]
    framed = sum(n for k, n in sent.items() if k != "garbage")
    invalid = sum(sent.get(k, 0) for k in ("unknown_type", "invalid_value", "wrong_direction"))
    dur = r["duration_s"]
    acks = r["replies"].get("ack", 0)
    denies = ", ".join(f"{k[5:]} {n}" for k, n in sorted(r["replies"].items(), key=lambda x: -x[1])
                       if k.startswith("deny:"))
    unsolicited = ", ".join(f"{k} {n}" for k, n in sorted(r["unsolicited"].items(), key=lambda x: -x[1]))
    probe_side = (": its relay at SCHED_FIFO 50, its polling at 40, below the daemon" if r.get("probe_rt", True) else
                  ", but at SCHED_OTHER: it shares the CPUs with the fake QEMUs\nand this loop")
    loads = sorted(x["load1"] for x in s)
    foreign = sum(1 for x in s if x["foreign_qemus"])
    probe = r["probe"]
    pr_lat = [lat for _, lat, rep in probe if lat is not None and (rep or "").startswith("ack")]
    pr_missed = sum(1 for _, lat, rep in probe if lat is None and (rep or "").startswith("ack"))
    pr_denied = {}
    for _, _, rep in probe:
        if rep and rep.startswith("deny"):
            pr_denied[rep[5:]] = pr_denied.get(rep[5:], 0) + 1
    pr_noreply = sum(1 for _, _, rep in probe if rep is None)
    ops = ", ".join(f"`{k}` {n}" for k, n in sorted(r["operator"].items(), key=lambda x: -x[1]))
    fails = "; ".join(f"{n}× {e or '(no message)'}" for e, n in sorted(r["operator_errors"].items(),
                                                                       key=lambda x: -x[1]))
    warnings = {}
    for l in r["daemon_log"].splitlines():
        if "warning:" in l:
            key = " ".join("N" if w.strip(",.:;()").isdigit() else "VM:" if w.startswith("flood-") else w
                           for w in l.split("warning:", 1)[1].split())
            key = " ".join("<path>" if "/" in w else w for w in key.split())[:140]
            warnings[key] = warnings.get(key, 0) + 1
    warn_text = "; ".join(f"{n}× {w}" for w, n in sorted(warnings.items(), key=lambda x: -x[1])[:6]) or "none"
    # The samples, a row per twelfth of the run.
    step = dur / 12
    rows = []
    for i in range(12):
        part = [x for x in s if i * step <= x["t_s"] < (i + 1) * step + 1e-6]
        if not part:
            continue
        lat = [lat for t, lat, rep in probe if i * step <= t < (i + 1) * step and lat is not None
               and (rep or "").startswith("ack")]
        x = part[-1]
        rows.append(f"| {x['t_s'] / 60:.1f} | {x['rss_kib'] / 1024:.2f} | {x['fds']} | {x['threads']} | {x['vms']} | "
                    f"{round(sum(p['frames_per_s'] for p in part) / len(part))} | "
                    f"{max(p['load1'] for p in part):.2f} | {max(p['foreign_qemus'] for p in part)} | "
                    f"{pct(lat, 50)} | {pct(lat, 99)} |")
    b, f = r["baseline"], r["final"]
    diffs = r["differences"]
    return f"""## Soak

Command: `{command}` ({time.strftime('%Y-%m-%d')}), {dur / 60:.1f} min, binary sha256
`{r['binary_sha256'][:16]}…` (copied at the start, so a rebuild during the run changes nothing).

One daemon (the defaults: FIFO 99, budgets, the RT guard, the ioprio I/O lever, event boosting,
predictive boost; no host reserve and up to 64 vCPUs boosted at once, so that every VM may be
boosted; memory bandwidth on simulated counters) and {r['vms']} synthetic VMs (`cosched-fake-qemu`,
the soak playing their guests), each sending at a rate drawn once between 100 and 2000 frames/s
(the daemon's `frame_rate`, per VM and resource; here {min(r['rates'])}-{max(r['rates'])}, median
{r['rates'][len(r['rates']) // 2]}): CPU (boost with or without a guest priority or the interrupt bit,
and deboost), IO, MEMBW, WAKE, REGISTER and DEREGISTER, plus 0.5-15 invalid frames a second
(unknown type, invalid value, host-to-guest kinds, garbage), and about once in 10 minutes a burst
over `malformed_rate` (deregistered, the VM registers again). VMs come and go (about every
{min(30, dur / 8):.0f} s one leaves, 70% closing its channel as QEMU exits, 30% killed, and a new one
comes within 5 s): {r['arrivals']} VMs in all, {r['graceful']} left, {r['killed']} killed. Operator
commands at random (about every {min(10, dur / 12):.0f} s) through the CLI, `cosched --config
<dir>/host.toml ...`, each `disable` undone 1-10 s later and each static FIFO 2-20 s later: {ops}.
A probe VM, in its own process, asks for a CPU boost every 0.5 s and measures the time to its vCPU
seen at SCHED_RR (as `isolation` does{probe_side}); operator commands never name it. Every
{r['samples'][1]['t_s'] - r['samples'][0]['t_s'] if len(s) > 1 else 10:.0f} s: the daemon's RSS, fds
and threads, the host's load average (`soak.csv`). Warm-up: the first {r['warmup_s'] / 60:.2g} min.

| target | result | figures |
|---|---|---|
{table}

- Frames: {framed} with a header sent ({invalid} invalid), {sent.get('garbage', 0)} runs of garbage;
  {tot['answered']} answered ({acks} ACK; DENY: {denies}); {tot['unanswered']} unanswered (a reply
  window of {REPLY_WINDOW_S:g} s, counted only where it was fully observed: a VM leaving gracefully
  waits for its replies); {tot['lost_at_kill']} in flight when their VM was killed (not counted).
  {r['malformed_bursts']} malformed bursts. Unsolicited (seq 0): {unsolicited or 'none'}{'' if not r['examples'] else
  '. First unanswered: ' + ', '.join(r['examples'][:5])}.
- The daemon: {b['rss_kib'] / 1024:.2f} MiB, {b['fds']} fds and {b['threads']} thread(s) before the first VM;
  {f['rss_kib'] / 1024:.2f} MiB, {f['fds']} fds, {f['threads']} thread(s) once the last had gone; {f['cpu_s']:.0f} s of
  CPU in all. Warnings in its log: {warn_text}.
- The probe: {len(probe)} boosts asked, {len(pr_lat)} applied (p50 {pct(pr_lat, 50)} µs, p99
  {pct(pr_lat, 99)} µs, max {pct(pr_lat, 100)} µs), {pr_missed} acknowledged but not applied within 1 s,
  {pr_noreply} without a reply within 1 s, denied: {', '.join(f'{k} {n}' for k, n in pr_denied.items()) or 'none'}
  (`disabled`: the operator's host-wide `disable`).
- Operator commands that failed: {sum(r['operator_failures'].values())} of {sum(r['operator'].values())}
  ({fails or 'none'}).
- The host: load average (1 min) {loads[0]:.2f} to {loads[-1]:.2f}, median {loads[len(loads) // 2]:.2f}, on
  {harness.NCPUS} CPUs; other QEMU processes (another engineer's TCG guests) present in {foreign} of
  {len(s)} samples. The soak's own processes (the fake QEMUs' relays, its Python loop, the probe's
  polling) share the CPUs with the daemon.
- After the daemon stopped: {len(diffs)} thread(s) or IRQ(s) of the host differing from before it
  started{': ' + '; '.join(diffs[:3]) if diffs else ''}; {len(r['groups_left'])} cosched group(s) left; daemon
  process {'still there' if r['daemon_left'] else 'gone'}.

| min | RSS (MiB) | fds | threads | VMs | frames/s | load (max) | other QEMUs | probe p50 (µs) | probe p99 (µs) |
|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}
"""


# soak.json: the figures of a soak run that soak_verdicts() needs besides its CSV files.
SOAK_KEPT = ("minutes", "vms", "seed", "warmup_s", "window_s", "duration_s", "probe_rt", "baseline", "final",
             "at_end_with_vms", "totals", "binary_sha256", "differences", "groups_left", "daemon_left")


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(v):
    """A CSV or table value as a number: None for "" and for fuzz.md's "-" (a run shorter than 10 s
    has no RSS after 10 s) and "?" (libFuzzer did not report it)."""
    if v in ("", None, "-", "?"):
        return None
    f = float(v)
    return int(f) if f.is_integer() and "." not in str(v) else f


def soak_from_files(out):
    """A soak run as soak_verdicts() takes it, from its files: soak.csv (the samples),
    soak-probe.csv (every probe boost) and soak.json (the rest; a soak before it was written has
    none: then the windows are the code's for the run's length, the end is the last sample, the
    totals the last sample's counts, and the daemon before the first VM and after the last is
    unknown). None without soak.csv."""
    if not (out / "soak.csv").exists():
        return None
    samples = [{k: num(v) for k, v in x.items()} for x in read_csv(out / "soak.csv")]
    probe = [(float(x["t_s"]), num(x["latency_us"]), x["reply"] or None) for x in read_csv(out / "soak-probe.csv")] \
        if (out / "soak-probe.csv").exists() else []
    if (out / "soak.json").exists():
        r = json.loads((out / "soak.json").read_text())
    else:
        duration = samples[-1]["t_s"]
        last = samples[-1]
        r = {"duration_s": duration, "warmup_s": min(300.0, duration / 6), "window_s": min(600.0, duration / 3),
             "at_end_with_vms": last, "baseline": None, "final": None,
             "totals": {"unanswered": last["unanswered"], "answered": last["answered"], "extra": last["extra_replies"]}}
    r.update(samples=samples, probe=probe)
    return r


def fuzz_report(out):
    """fuzz.md as (its header lines, its table's rows as {column: cell}); ([], []) without it."""
    path = out / "fuzz.md"
    if not path.exists():
        return [], []
    head, rows, columns = [], [], None
    for line in path.read_text().splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if columns is None:
                columns = cells
            elif not set(line) <= set("|-: "):
                rows.append(dict(zip(columns, cells)))
        elif line.strip() and columns is None:
            head.append(line)
    return head, rows


def targets(out, rows):
    """The campaign's targets, judged from each part's files: fuzz.md, crash.csv, isolation.json,
    the soak's files."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from evaluation import NOT_JUDGED
    from experiments.common import target
    t = []
    _, fz = fuzz_report(out)
    for f in fz:
        execs = num(f.get("executions", "").replace("?", ""))
        rss = f.get("peak RSS (MB)", "?")
        t.append(target(f"fuzzing {f['target']}: ≥ 10 million executions, no crash, hang (10 s on one input) or memory "
                        "past 1 GiB", f"{execs if execs is not None else '?'} executions, {f.get('result')}, peak RSS "
                        f"{rss} MB", execs is not None and execs >= 10_000_000 and f.get("result") == "ok",
                        "one run per target"))
    if fz:
        if all("RSS at 10 s (MB)" in f for f in fz):
            t.append(target("fuzzing: memory growth, each target's RSS after 10 s against its peak",
                            ", ".join(f"{f['target']} {rss_text(f['RSS at 10 s (MB)'])} -> {f['peak RSS (MB)']} MB"
                                      for f in fz),
                            None))
        else:
            t.append(target("fuzzing: memory growth, each target's RSS after 10 s against its peak",
                            "RSS after 10 s: not measured in this run (fuzz.md has only the peak; bench/fuzz.sh "
                            "--report now records it)", None))
    if rows:
        diffs = sum(r["differences"] for r in rows)
        by = "; ".join(f"{m}: {sum(1 for r in rows if r['restore_by'] == m)} cycles, "
                       f"{sum(r['differences'] for r in rows if r['restore_by'] == m)} differences"
                       for m in RESTORE_BY if any(r["restore_by"] == m for r in rows))
        t.append(target("crash cycles: 0 differences from the host before the daemon, after each kill -9 and "
                        "restore", f"{diffs} differences in {len(rows)} cycles ({sum(1 for r in rows if r['differences'])} "
                        "with one)", diffs == 0, by))
    if (out / "isolation.json").exists():
        iso = json.loads((out / "isolation.json").read_text())
        t.append(target("isolation: no thread of the host or of the victim changed by the hostile VM",
                        f"{len(iso['differences'])} changed", not iso["differences"], "one run"))
        t.append(target("isolation: the victim's boosts all applied, none denied",
                        f"{iso['victim_missed']} missed of {iso['rounds']} under the flood, denials "
                        f"{iso['victim_denied'] or 'none'}", not iso["victim_missed"] and not iso["victim_denied"],
                        "one run"))
        delay = None if iso["flood_p99_us"] is None else round(iso["flood_p99_us"] - iso["quiet_p50_us"])
        t.append(target("isolation: the flood delays the victim's boost by no more than the daemon's per-turn read "
                        "bound", f"p99 under the flood {iso['flood_p99_us']} µs less the quiet p50 "
                        f"{iso['quiet_p50_us']} µs: {delay} µs, against {iso['turn_bound_us']} µs",
                        delay is not None and delay <= iso["turn_bound_us"],
                        f"{iso['rounds']} boosts quiet and {iso['rounds']} under the flood, one run"))
    r = soak_from_files(out)
    if r:
        md = {}
        if (out / "soak.md").exists():
            for line in (out / "soak.md").read_text().splitlines():
                c = [x.strip() for x in line.strip().strip("|").split("|")]
                if line.startswith("|") and len(c) == 3 and c[1] in ("met", "**NOT met**"):
                    md[c[0]] = (c[1] == "met", c[2])
        for key, name, ok, figures in soak_verdicts(r):
            if ok is None:
                if name in md:
                    ok, figures = md[name][0], (f"{md[name][1]} (as the run wrote it in soak.md: the daemon before "
                                                "the first VM and after the last is in no data file of that run)")
                else:
                    ok, figures = NOT_JUDGED, "not measured in this run"
            t.append(target(f"soak: {name}", figures, ok, "one run"))
    return t


def rss_text(cell):
    """fuzz.md's "RSS at 10 s" cell for the targets table."""
    return {"-": "none (ran under 10 s)", "?": "not reported"}.get(cell, cell)


def plot(out, rows):
    """plot.png: each part against its target (fuzz executions and memory, crash differences per
    cycle, the victim's boost latency and the per-turn bound, the soak's RSS and probe p99)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5), layout="constrained")
    (fx, fm, cx), (ix, sx, px) = axes
    _, fz = fuzz_report(out)
    if fz:
        names = [f["target"] for f in fz]
        fx.bar(names, [num(f.get("executions", "").replace("?", "")) or 0 for f in fz], color="tab:blue")
        fx.axhline(10_000_000, color="black", linestyle="--", linewidth=1, label="target: ≥ 10 million")
        fx.set_ylabel("executions")
        fx.legend(fontsize=8)
        w = 0.38
        xs = range(len(fz))
        fm.bar([x - w / 2 for x in xs], [num(f.get("RSS at 10 s (MB)", "")) or 0 for f in fz], w, color="tab:gray",
               label="after 10 s" + ("" if all("RSS at 10 s (MB)" in f for f in fz) else " (not measured in this run)"))
        fm.bar([x + w / 2 for x in xs], [num(f.get("peak RSS (MB)", "").replace("?", "")) or 0 for f in fz], w,
               color="tab:blue", label="peak")
        fm.axhline(1024, color="black", linestyle="--", linewidth=1, label="limit: 1 GiB (a failure past it)")
        fm.set_xticks(list(xs), names)
        fm.set_ylabel("fuzzing process RSS (MB)")
        fm.legend(fontsize=8)
    for ax, title in ((fx, "fuzzing: executions per target"), (fm, "fuzzing: memory")):
        ax.set_title(title, fontsize=10)
        if not fz:
            ax.text(0.5, 0.5, "not run", ha="center", transform=ax.transAxes)
    if rows:
        for m, c in zip(RESTORE_BY, ("tab:blue", "tab:green")):
            rs = [r for r in rows if r["restore_by"] == m]
            cx.plot([r["cycle"] for r in rs], [r["differences"] for r in rs], "o", markersize=3, color=c,
                    label=f"restored by {m}")
        cx.axhline(0, color="black", linestyle="--", linewidth=1, label="target: 0")
        cx.set_ylim(-0.5, max(3, max(r["differences"] for r in rows) + 1))
        cx.legend(fontsize=8)
    cx.set_xlabel("cycle")
    cx.set_ylabel("differences from the host before")
    cx.set_title("crash cycles: kill -9, then restore", fontsize=10)
    if (out / "isolation.json").exists():
        iso = json.loads((out / "isolation.json").read_text())
        ks = ("p50", "p99", "max")
        ix.bar([x - 0.2 for x in range(3)], [iso[f"quiet_{k}_us"] for k in ks], 0.4, color="tab:gray", label="quiet")
        ix.bar([x + 0.2 for x in range(3)], [iso[f"flood_{k}_us"] for k in ks], 0.4, color="tab:red",
               label="under the flood")
        ix.axhline(iso["quiet_p50_us"] + iso["turn_bound_us"], color="black", linestyle="--", linewidth=1,
                   label="target: flood p99 ≤ quiet p50 + per-turn bound")
        ix.set_xticks(range(3), ks)
        ix.legend(fontsize=8)
    ix.set_ylabel("victim's boost latency (µs)")
    ix.set_title("isolation: a hostile VM's flood", fontsize=10)
    r = soak_from_files(out)
    if r:
        s = r["samples"]
        sx.plot([x["t_s"] / 60 for x in s], [x["rss_kib"] / 1024 for x in s], color="tab:blue", label="daemon RSS")
        warm = next((x for x in s if x["t_s"] >= r["warmup_s"]), s[-1])
        sx.axvline(r["warmup_s"] / 60, color="grey", linestyle=":", linewidth=1, label="end of warm-up")
        sx.axhline(warm["rss_kib"] / 1024 + 1, color="black", linestyle="--", linewidth=1,
                   label="target: ≤ 1 MiB above the warm-up's")
        sx.set_xlabel("minutes")
        sx.set_ylabel("MiB")
        sx.legend(fontsize=8)
        win = 300.0 if r["duration_s"] >= 1800 else r["duration_s"] / 6
        edges = [i * win for i in range(int(r["duration_s"] // win) + 1)]
        p99 = [pct([lat for t, lat, rep in r["probe"] if a <= t < b and (rep or "").startswith("ack")], 99)
               for a, b in zip(edges, edges[1:])]
        px.plot([b / 60 for b in edges[1:]], p99, "o-", color="tab:purple", label=f"p99 per {win / 60:g} min")
        first = [lat for t, lat, rep in r["probe"] if t < r["window_s"] and (rep or "").startswith("ack")]
        last = [lat for t, lat, rep in r["probe"] if t >= r["duration_s"] - r["window_s"] and (rep or "").startswith("ack")]
        if pct(first, 99):
            wm = r["window_s"] / 60
            px.plot([0, wm], [pct(first, 99)] * 2, color="tab:purple", linewidth=3, alpha=0.5,
                    label=f"p99 of the first and the last {wm:g} min")
            if pct(last, 99):
                px.plot([r["duration_s"] / 60 - wm, r["duration_s"] / 60], [pct(last, 99)] * 2, color="tab:purple",
                        linewidth=3, alpha=0.5)
            px.axhline(1.2 * pct(first, 99), color="black", linestyle="--", linewidth=1,
                       label=f"target: last {wm:g} min's p99 ≤ 1.2 × the first's")
        px.set_yscale("log")
        px.set_xlabel("minutes")
        px.set_ylabel("probe: boost latency p99 (µs)")
        px.legend(fontsize=8)
    sx.set_title("soak: the daemon's memory", fontsize=10)
    px.set_title("soak: the probe VM's boosts", fontsize=10)
    fig.suptitle("Reliability campaign: each part against its target")
    fig.savefig(out / "plot.png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def fuzz(runs, out):
    """bench/fuzz.sh with `runs` executions per target; returns (its table, whether all passed)."""
    out.mkdir(parents=True, exist_ok=True)
    table = out / "fuzz.md"
    if table.exists():  # kept, so that the summary shows the figures beside the run before
        shutil.copyfile(table, out / "fuzz-previous.md")
    # The report names its command: a path inside the repository as the repository's.
    report = table.resolve()
    report = report.relative_to(harness.REPO) if report.is_relative_to(harness.REPO) else report
    r = subprocess.run(["bash", "bench/fuzz.sh", "--runs", str(runs), "--report", str(report)], cwd=harness.REPO)
    return table.read_text(), r.returncode == 0


def load_crash_rows(path):
    """The rows of a crash.csv, typed as crash() returns them."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            for k in ("cycle", "differences", "boosted", "raised", "throttles", "foreign_qemus"):
                if k in r:
                    r[k] = int(r[k])
            for k in ("shielded", "fifo"):
                r[k] = r[k] == "True"
            r.setdefault("restore_by", "command")  # before the restart variant
            r.setdefault("io_lever", "weight")  # before the lever followed the host's BFQ
            rows.append(r)
    return rows


def write_summary(rows, out, fuzz_table=None, fuzz_runs=None, command=None):
    """crash.csv (unless `rows` is None: then read from it), and summary.md: the fuzzing (this
    run's, else the last fuzz.md), the crash cycles, and the isolation and soak sections as their
    last runs wrote them (isolation.md, soak.md)."""
    out.mkdir(parents=True, exist_ok=True)
    if rows is None:
        rows = load_crash_rows(out / "crash.csv")
    else:
        with open(out / "crash.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    n = len(rows)
    bad = [r for r in rows if r["differences"]]
    count = lambda k: sum(1 for r in rows if r[k])  # noqa: E731
    levers = sorted({r.get("io_lever", "weight") for r in rows})
    io_levers = " and ".join({"weight": "weighted blkio group", "ioprio": "real-time I/O class"}.get(x, x)
                             for x in levers)
    if not command:
        modes = {r["restore_by"] for r in rows}
        command = f"crash --cycles {n}" + (f" --restore-by {modes.pop()}" if len(modes) == 1 else "")
        seed = ((((manifest.read(out) or {}).get("parts") or {}).get("crash") or {}).get("seeds") or {}).get("seed")
        if seed is not None:  # the crash run's, recorded in its manifest entry
            command += f" --seed {seed}"
    fuzz_intro = """Coverage-guided (cargo-fuzz, libFuzzer; AddressSanitizer on the nightly toolchain, none on
stable: the table's toolchain column, or fuzz.md's first line, says which ran), each target from
the committed corpus (`fuzz/corpus`). A crash, a hang (over 10 s on one input) or memory past
1 GiB fails a target. The RSS is the fuzzing process's, sanitizer quarantine included: after
10 s of fuzzing (the last libFuzzer reported by then) and at its peak."""
    head, _ = fuzz_report(out)
    undated = ("" if head else "\n\nThis fuzz.md does not say when it ran, at which commit or with which toolchain, nor "
               "the RSS after 10 s: it predates bench/fuzz.sh --report recording them (the next run does).")
    if fuzz_table:
        fuzz_text = f"`bench/fuzz.sh --runs {fuzz_runs}`:\n{fuzz_intro}\n\n{fuzz_table}"
    elif (out / "fuzz.md").exists():
        fuzz_text = f"Not run by this command: the last `bench/fuzz.sh` run's table (fuzz.md).\n{fuzz_intro}{undated}\n\n" \
            + (out / "fuzz.md").read_text()
    else:
        fuzz_text = "Not run (`reliability.py all` runs it)."
    if (out / "fuzz-previous.md").exists() and (out / "fuzz.md").exists():
        before = (out / "fuzz-previous.md").read_text()
        fuzz_text = fuzz_text.rstrip("\n") + "\n\nThe run before it, for comparison (fuzz-previous.md, which the fuzzing keeps" \
            + ("" if before.startswith("Fuzzed ") else "; undated: it predates bench/fuzz.sh --report recording the date, "
               "commit and toolchain") + "):\n\n" + before
    by_mode = []
    for mode in RESTORE_BY:
        m = [r for r in rows if r["restore_by"] == mode]
        if m:
            by_mode.append(f"| {mode} | {len(m)} | {sum(r['differences'] for r in m)} | "
                           f"{sum(1 for r in m if r['differences'])} |")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from experiments.common import targets_md
    sections = [f"""# Reliability campaign

Written by `bench/reliability.py` ({time.strftime('%Y-%m-%d')}) from the last run of each part; each
section says its command. Measured: {measured_text(out)}.

{targets_md(targets(out, rows))}

## Fuzzing

{fuzz_text}

## Crash cycles

Command: `sudo /usr/bin/python3 bench/reliability.py {command}`.
{n} cycles of `kill -9` on the daemon at a random moment (0-1.5 s after three synthetic VMs
asked for everything), then the host compared with a snapshot taken before the daemon first
touched it: every thread's policy, priority, nice, I/O priority, affinity and cgroups (cpu, cpuset,
blkio, freezer and v2), the IRQ
affinities, and the daemon's own groups (other QEMU processes, which another daemon may
coordinate, are left out). What puts the host back after the kill (`--restore-by`; by default
they alternate):
- `command`: `cosched restore`, then the comparison;
- `restart`: the VMs stopped (SIGSTOP), a daemon started again on the same state directory with
  nothing that acts without a request (no static tunings, no event boosting, no memory-bandwidth
  regulation); it restores the record at start, finds the VMs, and the host is compared while it
  runs; then it stops and the VMs resume.

What was applied at the kill, from the daemon's last status: a VM CPU-boosted in {count('boosted')}
cycles, I/O raised ({io_levers}) in {count('raised')}, shielded in {count('shielded')}, at static
FIFO in {count('fifo')}, memory-bandwidth throttled (frozen) at least once in {count('throttles')}.

| restored by | cycles | differences | cycles with a difference |
|---|---|---|---|
{chr(10).join(by_mode)}

Target: 0 differences. **{"met" if not bad else "NOT met"}**: {sum(r['differences'] for r in rows)} differences
in {len(bad)} of {n} cycles.{"" if not bad else chr(10) + chr(10) + chr(10).join(f"- cycle {r['cycle']} ({r['restore_by']}): {r['detail']}" for r in bad[:10])}
"""]
    for name, what in (("isolation.md", "isolation"), ("soak.md", "soak")):
        if (out / name).exists():
            sections.append((out / name).read_text().strip() + "\n")
        else:
            sections.append(f"## {what.capitalize()}\n\nNot run yet (`reliability.py {what}`).\n")
    text = "\n".join(sections)
    (out / "summary.md").write_text(text)
    plot(out, rows)
    return text


def measured_text(out):
    """When and at which commit each part measured, from the manifest ("~": the commit that
    committed the data, where the measured one was not recorded)."""
    m = manifest.read(out) or {}
    parts = []
    for part in ("fuzz", "crash", "isolation", "soak"):
        e = (m.get("parts") or {}).get(part)
        if not e:
            continue
        commit = (e.get("commit") or "")[:7] or ("~" + e["data_commit"][:7] if e.get("data_commit") else "commit unknown")
        date = (e.get("started") or e.get("date") or "")[:10] or (
            "~" + e["data_commit_date"][:10] if e.get("data_commit_date") else "date unknown")
        parts.append(f"{part} {date} at {commit}")
    return "; ".join(parts) + (" (~: the commit that committed the data, and its date; the measured ones were not "
                               "recorded)"
                               if any("~" in x for x in parts) else "") if parts else "no manifest"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("crash", help="kill -9 cycles, each checked against a snapshot")
    c.add_argument("--cycles", type=int, default=100)
    c.add_argument("--restore-by", choices=("alternate",) + RESTORE_BY, default="alternate",
                   help="what puts the host back after a kill (default: alternate, command first)")
    c.add_argument("--seed", type=int, help="for the random kill moments (default: drawn at random; either way "
                                            "recorded in the manifest and the summary's command)")
    c.add_argument("--out", type=Path, default=RESULTS, help=f"default {RESULTS}")
    iso = sub.add_parser("isolation", help="a hostile VM floods its channel beside a victim")
    iso.add_argument("--seconds", type=float, default=20)
    iso.add_argument("--seed", type=int, help="default: drawn at random; either way recorded in the manifest")
    iso.add_argument("--out", type=Path, default=RESULTS, help=f"default {RESULTS} (isolation.md)")
    so = sub.add_parser("soak", help="many VMs flooding within their rate limit, coming and going, for an hour")
    so.add_argument("--minutes", type=float, default=60)
    so.add_argument("--vms", type=int, default=16, help="flood VMs (the probe VM is one more)")
    so.add_argument("--seed", type=int)
    so.add_argument("--out", type=Path, default=RESULTS, help=f"default {RESULTS} (soak.md, soak.csv)")
    so.add_argument("--probe-sched-other", action="store_true",
                    help="the probe at SCHED_OTHER, sharing the CPUs with the fake QEMUs (default: real-time below "
                         "the daemon, so that its latency is the daemon's)")
    fz = sub.add_parser("fuzz", help="the fuzzing part alone: bench/fuzz.sh --runs N --report OUT/fuzz.md, its "
                        "manifest entry, summary.md again")
    fz.add_argument("--runs", type=int, default=10_000_000, help="executions per fuzz target")
    fz.add_argument("--out", type=Path, default=RESULTS, help=f"default {RESULTS} (fuzz.md)")
    sm = sub.add_parser("summary", help="summary.md again from the last runs' files (crash.csv, fuzz.md, ...)")
    sm.add_argument("--out", type=Path, default=RESULTS, help=f"default {RESULTS}")
    al = sub.add_parser("all", help="crash cycles and fuzzing (and the soak if asked), one summary")
    al.add_argument("--cycles", type=int, default=100)
    al.add_argument("--runs", type=int, default=10_000_000, help="executions per fuzz target")
    al.add_argument("--soak-minutes", type=float, default=0, help="run the soak this long first (default 0: not)")
    al.add_argument("--vms", type=int, default=16, help="the soak's flood VMs")
    al.add_argument("--seed", type=int)
    al.add_argument("--out", type=Path, default=RESULTS, help=f"default {RESULTS}")
    a = ap.parse_args()
    run = manifest.Run()

    def record(part, seed, started=run):
        """The part's entry in OUT/manifest.json (each part keeps the commit of its own run)."""
        manifest.write(a.out, started, name="reliability", producer="bench/reliability.py", quick=False,
                       seeds=None if seed is None else {"seed": seed}, part=part)

    if a.cmd == "summary":
        print(write_summary(None, a.out))
        manifest.write(a.out, run, name="reliability", producer="bench/reliability.py", quick=False, rendered=True)
        return
    if a.cmd == "fuzz":  # (no daemon: needs no root)
        _, fuzz_ok = fuzz(a.runs, a.out)
        record("fuzz", None)
        if (a.out / "crash.csv").exists():
            write_summary(None, a.out)
        sys.exit(0 if fuzz_ok else 1)
    if os.geteuid() != 0:
        sys.exit("reliability.py: must run as root (the daemon)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    if a.cmd == "isolation":
        seed = a.seed if a.seed is not None else random.randrange(1 << 32)  # recorded, so that a run can be repeated
        r = isolation(a.seconds, seed=seed)
        a.out.mkdir(parents=True, exist_ok=True)
        text = isolation_text(r, a.seconds)
        (a.out / "isolation.md").write_text(text)
        (a.out / "isolation.json").write_text(json.dumps(r, indent=1) + "\n")
        record("isolation", seed)
        print(text)
        if (a.out / "crash.csv").exists():
            write_summary(None, a.out)
        sys.exit(1 if r["differences"] or r["victim_missed"] else 0)
    soak_ok = True
    if a.cmd == "soak" or (a.cmd == "all" and a.soak_minutes > 0):
        minutes = a.minutes if a.cmd == "soak" else a.soak_minutes
        a.out.mkdir(parents=True, exist_ok=True)
        other = a.cmd == "soak" and a.probe_sched_other
        r = soak(minutes, a.vms, seed=a.seed, csv_path=a.out / "soak.csv", probe_rt=not other)
        text = soak_text(r, f"sudo /usr/bin/python3 bench/reliability.py soak --minutes {minutes:g} --vms {a.vms}"
                            f" --seed {r['seed']}" + ("" if r["probe_rt"] else " --probe-sched-other"))
        (a.out / "soak.md").write_text(text)
        # The probe's every boost (seconds since the start, latency in µs, the reply), so that
        # its windows can be recomputed.
        with open(a.out / "soak-probe.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["t_s", "latency_us", "reply"])
            w.writerows([t, "" if lat is None else round(lat, 1), rep or ""] for t, lat, rep in r["probe"])
        # What the soak's targets are judged on besides soak.csv and soak-probe.csv (the daemon
        # before the first VM and after the last, the frame totals, the windows), so that the
        # summary judges them again from the run's files.
        (a.out / "soak.json").write_text(json.dumps({k: r[k] for k in SOAK_KEPT if k in r}, indent=1) + "\n")
        record("soak", r["seed"])
        print(text)
        if a.cmd == "soak" and (a.out / "crash.csv").exists():
            write_summary(None, a.out)
        soak_ok = all(ok for _, _, ok, _ in soak_verdicts(r))
        if a.cmd == "soak":
            sys.exit(0 if soak_ok else 1)
    seed = a.seed if a.seed is not None else random.randrange(1 << 32)  # recorded, so that a run can be repeated
    run_crash = manifest.Run()
    rows = crash(a.cycles, seed, restore_by=getattr(a, "restore_by", "alternate"))
    run_fuzz = manifest.Run()
    table, fuzz_ok = fuzz(a.runs, a.out) if a.cmd == "all" else (None, True)
    if a.cmd == "all":
        command = f"all --cycles {a.cycles} --runs {a.runs}" + (f" --soak-minutes {a.soak_minutes:g}"
                                                                 if a.soak_minutes else "")
    else:
        command = f"crash --cycles {a.cycles}" + (f" --restore-by {a.restore_by}" if a.restore_by != "alternate" else "")
    command += f" --seed {seed}"
    # The parts' manifest entries first: the summary's "Measured:" line reads them.
    record("crash", seed, run_crash)
    if a.cmd == "all":
        record("fuzz", None, run_fuzz)
    print(write_summary(rows, a.out, table, getattr(a, "runs", None), command))
    sys.exit(1 if any(r["differences"] for r in rows) or not fuzz_ok or not soak_ok else 0)


if __name__ == "__main__":
    main()
