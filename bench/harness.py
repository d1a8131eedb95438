"""What every cosched experiment is made of: host load, the host daemon, the test guest, the host
policies the experiments compare, and the parsing of what the guest prints.

One run (`run`) boots the test guest once. The guest starts the agent (policy "cosched"), its CPU
hogs, then the experiment's measurement script (`body`), which prints COSCHED-MEASURE-START and
COSCHED-MEASURE-END around what it measures. The host applies the static policies, starts the
timed host job, and snapshots the daemon at those two lines.

Needs root and a built tree (scripts/setup.sh). Runs on Debian's /usr/bin/python3.
"""

import ctypes
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def dies_with_us(sig):
    """A preexec_fn: the child gets `sig` when this process dies, even by SIGKILL, so an
    interrupted experiment leaves no hog spinning and no daemon running (SIGTERM: it restores)."""
    return lambda: _libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


REPO = Path(__file__).resolve().parents[1]
COSCHED = Path(os.environ.get("COSCHED_BIN", REPO / "target/release/cosched"))
RUN_SH = REPO / "guest/run.sh"
ACCEL_SH = REPO / "guest/accel.sh"
GUEST_DIR = Path(os.environ.get("COSCHED_GUEST_DIR", REPO / "build/guest"))
TOOLS = REPO / "build/guest-tools/cosched-tools"
PYTHON_LAYER = GUEST_DIR / "python.cpio"
# The agent as the guest gets it: the release binary without its debug line tables (6 MB instead
# of 34: each boot under TCG unpacks it about a second sooner), made by guest_cosched().
GUEST_COSCHED = REPO / "build/guest-bin/cosched"
# What the start-up application imports (python3 -c "...; print('ready')"): the start-up experiment
# and the watch-list VM test launch the same program.
STARTUP_IMPORTS = "import json, re, datetime, collections, argparse, decimal, csv"
HIST_US = 30000  # cyclictest histogram range; longer samples count as overflows (max is exact)
CLK_TCK = os.sysconf("SC_CLK_TCK")
NCPUS = os.cpu_count() or 1

# Host policies for the QEMU threads (Coordinated Task Scheduling sec. VI, Performance Tuning
# (KVM real-time) sec. 5.4; docs/references.md).
POLICIES = ("none", "cosched", "static_rr", "static_fifo", "shield", "shield_fifo")
# Daemon configuration without budgets: a run that needs its boost for 20 s or more measures the
# mechanism, not the budget that an operator would set (the defaults cut a boost after 10 s).
NO_BUDGETS = "[policy]\nmax_continuous_boost_ms = 0\nmax_boost_share_permille = 1000\n"


def packaged_default(config, section, key):
    """A key's default as the package ships it: its commented-out line in packaging/host.toml or
    packaging/guest.toml (config: "host" or "guest"), which are generated from the daemon's and
    the agent's own definitions (unit tests keep them in step), so an experiment that runs "the
    default" names the code's value, not a copy of it. section: the [table] (None: top level)."""
    here = None
    for line in (REPO / f"packaging/{config}.toml").read_text().splitlines():
        bare = line.lstrip("#").strip()
        if bare.startswith("[") and bare.endswith("]"):
            here = bare[1:-1]
        elif here == section and line.startswith("#") and bare.replace(" ", "").startswith(key + "="):
            return int(bare.split("=", 1)[1].strip().replace("_", ""))
    raise RuntimeError(f"packaging/{config}.toml has no default for {f'[{section}] ' if section else ''}{key}")


@functools.lru_cache(maxsize=None)
def accel():
    """(accelerator, reason): "kvm" or "tcg", the one guest/run.sh boots the guest with here, and
    why (guest/accel.sh: COSCHED_ACCEL forces it, else its probe boot of the test guest under
    KVM, cached per host kernel, QEMU and guest kernel)."""
    r = subprocess.run([str(ACCEL_SH)], capture_output=True, text=True)
    line = r.stdout.strip()
    name, _, reason = line.partition(" ")
    if name not in ("kvm", "tcg"):
        raise RuntimeError(f"guest/accel.sh gave no verdict (exit {r.returncode}): {r.stderr.strip()}")
    return name, reason


def accel_line():
    """One line for an output: "accelerator: TCG (KVM cannot run the test guest: ...)"."""
    name, reason = accel()
    return f"accelerator: {name.upper()} ({reason})"


def boot_text():
    """How guest/run.sh starts a guest here (COSCHED_SNAPSHOT): from a snapshot, or from the kernel."""
    if os.environ.get("COSCHED_SNAPSHOT", "auto") == "off":
        return "each guest boots from its kernel (COSCHED_SNAPSHOT=off)"
    return ("a guest without a disk starts from a snapshot of the test guest taken at the end of its boot, "
            "then gets its workload (guest/run.sh --snapshot; COSCHED_SNAPSHOT=off boots each from its kernel)")


def print_accel(test_file):
    """A VM test module's setUpModule: its output says which accelerator boots the guest, and why,
    and whether from a snapshot (as root, once the tree is built)."""
    if os.geteuid() == 0 and RUN_SH.exists():
        print(f"\n{Path(test_file).name}: {accel_line()}; {boot_text()}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# What the guest prints


def launches(lines):
    """`cosched-tools launch` lines ("launch <i> <us> <cpu_us>") as [(ready s, CPU s)]."""
    return [(int(w[2]) / 1e6, int(w[3]) / 1e6) for w in (l.split() for l in lines)
            if len(w) == 4 and w[0] == "launch"]


def block(console, name):
    """The lines between COSCHED-<name>-BEGIN and COSCHED-<name>-END."""
    lines = [l.rstrip("\r") for l in console.splitlines()]
    try:
        start = lines.index(f"COSCHED-{name}-BEGIN")
        end = lines.index(f"COSCHED-{name}-END", start)
    except ValueError:
        raise RuntimeError(f"no {name} block in the guest's output:\n" + "\n".join(lines[-30:]))
    return lines[start + 1:end]


def parse_histogram(console, window=""):
    """cyclictest's histogram as the guest prints it (`hist_dump`): one line of `bucket_us count`
    pairs (non-zero buckets), then cyclictest's summary lines. Zero-padded numbers are decimal.
    window: the measurement window's name, for a boot that measured several (cyclictest_body)."""
    lines = block(console, f"HIST-{window}" if window else "HIST")
    nums = lines[0].split()
    hist = {int(nums[i], 10): int(nums[i + 1], 10) for i in range(0, len(nums) - 1, 2)}
    summary = {}
    for l in lines[1:]:
        if l.startswith("# ") and ":" in l:
            k, v = l[2:].split(":", 1)
            v = v.split()
            if v:
                summary[k.strip()] = int(v[0], 10)
    return hist, summary


def stats(hist, summary):
    """avg / p50 / p99 / p99.9 / max in µs. avg and max are cyclictest's own (they include the
    samples beyond the histogram range); percentiles come from the histogram."""
    total = summary.get("Total", sum(hist.values()))
    if total == 0:
        raise RuntimeError("cyclictest recorded no samples")

    def pct(p):
        need = p * total
        seen = 0
        for b in sorted(hist):
            seen += hist[b]
            if seen >= need:
                return b
        return HIST_US  # in the overflow
    return {
        "n": total,
        "avg": summary.get("Avg Latencies", 0),
        "p50": pct(0.50),
        "p99": pct(0.99),
        "p999": pct(0.999),
        "max": summary.get("Max Latencies", max(hist) if hist else 0),
        "overflows": summary.get("Histogram Overflows", 0),
    }


def tool_lines(console, word):
    """Lines `word ...` printed by cosched-tools, split into ints after the word."""
    out = []
    for l in console.splitlines():
        parts = l.strip().split()
        if parts and parts[0] == word:
            out.append([int(x) for x in parts[1:]])
    return out


# The guest script's pieces. busybox sh.
# The empty buckets (most of the HIST_US lines) dropped in one pass first: three passes over the
# whole file took about a second of the guest's time under TCG, in every measured boot.
def hist_dump(window=""):
    """Guest shell that prints /tmp/hist (parse_histogram reads it back)."""
    name = f"HIST-{window}" if window else "HIST"
    return f"""grep -v ' 000000$' /tmp/hist > /tmp/hist.nz
echo "COSCHED-{name}-BEGIN"
grep -v '^#' /tmp/hist.nz | tr '\\n' ' '; echo
grep -E '^# (Total|Min Latencies|Avg Latencies|Max Latencies|Histogram Overflows):' /tmp/hist.nz
echo "COSCHED-{name}-END"
"""


def cyclictest_body(args, loops, window=""):
    """Measures with cyclictest (`args`, e.g. "-p 80 -i 1000") and prints its histogram. window:
    a name for this measurement, when one boot makes several (their bodies one after the other):
    run() returns its figures in result["windows"][window], parse_histogram(console, window) its
    histogram."""
    mark = f" {window}" if window else ""
    return f"""echo "COSCHED-MEASURE-START{mark}"
cyclictest {args} -l {loops} -q -m -h {HIST_US} --histfile=/tmp/hist >/dev/null
echo "COSCHED-MEASURE-END{mark}"
{hist_dump(window)}"""


AGENT_LOG = "/tmp/agent.log"


def agent_start(args="", until="detectors attached", bound_s=30):
    """Guest shell: starts the agent (`cosched guest ARGS`) in the background as $AGENT, its log
    in AGENT_LOG, and waits until the log has a line matching `until` (grep -E), the agent exits,
    or `bound_s` passes (then a COSCHED-GUEST line says so). The log is emptied by this shell
    before the agent starts: a redirection is made in the child, which may run only after the
    wait has read the log, and a previous agent's "detectors attached" was read as this one's
    (its new tasks then started before its detector was attached: never watched)."""
    return f""": >{AGENT_LOG}
cosched guest {args} 2>>{AGENT_LOG} &
AGENT=$!
i=0
until grep -qE "{until}" {AGENT_LOG} 2>/dev/null || ! kill -0 $AGENT 2>/dev/null; do
    i=$((i+1)); [ $i -gt {int(bound_s / 0.05)} ] && {{ echo "COSCHED-GUEST: the agent did not log '{until}' in {bound_s} s"; cat {AGENT_LOG}; break; }}
    sleep 0.05
done
"""


def agent_stop(tag=""):
    """Guest shell: stops the agent started by agent_start (SIGTERM: it deregisters) and prints
    its log, each line as "COSCHED-AGENT: [TAG: ]LINE" (result["agent_log"] without the prefix)."""
    prefix = f"COSCHED-AGENT: {tag}: " if tag else "COSCHED-AGENT: "
    return f"kill $AGENT; wait $AGENT\nsed 's/^/{prefix}/' {AGENT_LOG}\n"


def guest_script(body, agent=False, guest_hogs=0, agent_args=""):
    # Attached, refused (a daemon with every resource off: the agent waits for an ENABLE that a
    # measurement does not send; the wait used to run out its 30 s then), or gone (the host
    # granted none of what it detects, or nothing can attach here).
    start_agent = agent_start(agent_args, until="detectors attached|waiting for ENABLE") if agent else ""
    stop_agent = agent_stop() if agent else ""
    return f"""#!/bin/sh
{start_agent}i=0; while [ $i -lt {guest_hogs} ]; do (while :; do :; done) & i=$((i+1)); done
{body}
{stop_agent}"""


# ---------------------------------------------------------------------------------------------
# Host side


def wait_until(pred, what, timeout, seen=None, step=0.1):
    """Polls pred() until it returns something true, and returns that; after `timeout` seconds
    raises AssertionError naming `what` and, if given, seen() (the state it saw last)."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s" + (f"; saw {seen()}" if seen else ""))
        time.sleep(step)


def build_packages():
    """Builds the Debian packages (scripts/package.sh): {package name: path of its .deb}."""
    r = subprocess.run(["bash", str(REPO / "scripts/package.sh")], capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise AssertionError(f"scripts/package.sh: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    debs = {}
    for line in r.stdout.splitlines():
        if line.startswith("package.sh: "):
            deb = REPO / line.split(": ", 1)[1]
            debs[deb.name.split("_")[0]] = deb
    return debs


def cpu_time_s(pid):
    """CPU time (user + system) of a process so far, in seconds; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def boosted_s(resource):
    """Seconds a VM's resource has spent boosted so far: its closed boosts plus the one under way.
    `resource` is a status `resources.<name>` entry (or a VM entry with one merged in)."""
    return resource["counters"]["boosted_ns"] / 1e9 + resource.get("boosted_for_ms", 0) / 1e3


@contextmanager
def host_hogs(n, cpus=None):
    """n CPU hogs on the host (a shell busy loop: no system calls, no memory traffic),
    optionally confined to `cpus`."""
    procs = [subprocess.Popen(["sh", "-c", "while :; do :; done"], preexec_fn=dies_with_us(signal.SIGKILL))
             for _ in range(n)]
    try:
        if cpus:
            for p in procs:
                os.sched_setaffinity(p.pid, cpus)
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


class Daemon:
    """`cosched host` in a private directory; stopped with SIGTERM (restores every thread)."""

    def __init__(self, workdir, config="", args=()):
        """args: more `cosched host` options (e.g. "-v": every frame in daemon.log)."""
        self.dir = Path(workdir)
        self.socket_dir = self.dir / "vms"
        self.control = self.dir / "control.sock"
        (self.dir / "host.toml").write_text(config)
        self.log = open(self.dir / "daemon.log", "w")
        self.proc = subprocess.Popen(
            [str(COSCHED), "--config", str(self.dir / "host.toml"), "host",
             "--socket-dir", str(self.socket_dir), "--state-dir", str(self.dir / "state"),
             "--control-socket", str(self.control), *args],
            stderr=self.log, preexec_fn=dies_with_us(signal.SIGTERM))
        # Wait until this daemon answers (a socket file left by a killed one proves nothing).
        deadline = time.time() + 10
        while self.status() is None:
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("cosched host did not start:\n" + (self.dir / "daemon.log").read_text())
            time.sleep(0.02)

    def status(self):
        out = subprocess.run([str(COSCHED), "status", "--json", "--control-socket", str(self.control)],
                             capture_output=True, text=True)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def stop(self):
        """SIGTERM and wait (idempotent)."""
        if self.log.closed:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError("cosched host did not exit on SIGTERM")
        self.log.close()
        if self.proc.returncode != 0:
            raise RuntimeError(f"cosched host exited {self.proc.returncode}:\n" + (self.dir / "daemon.log").read_text())


def qemu_threads(pid):
    """(tid, comm) of every thread of QEMU process `pid`."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out.append((int(tid), Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()))
        except OSError:
            pass
    return out


def policy(tid):
    """A thread's scheduling policy, without SCHED_RESET_ON_FORK (the daemon's boosts set it)."""
    return os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK


def need_root(test):
    """In a unittest: skip without root, or fail where COSCHED_REQUIRE_ROOT=1 (CI)."""
    if os.geteuid() != 0:
        if os.environ.get("COSCHED_REQUIRE_ROOT") == "1":
            raise AssertionError("COSCHED_REQUIRE_ROOT=1 but not root")
        test.skipTest("needs root (set COSCHED_REQUIRE_ROOT=1 to make this a failure)")


def is_vcpu(comm):
    return comm.startswith("CPU ") and (comm.endswith("/TCG") or comm.endswith("/KVM"))


def apply_static(pid, policy):
    """The static host policies, applied to every QEMU thread:
    static_rr   all SCHED_RR 1 (Coordinated Task Scheduling sec. VI.A);
    static_fifo vCPU SCHED_FIFO 97, the other threads 98 (Performance Tuning sec. 5.4; under TCG the main
                loop delivers the guest's timer interrupts, it is the "I/O thread");
    shield      vCPU threads pinned to the last CPU, every other QEMU thread to the others (the host
                load is confined to those too, see `run`);
    shield_fifo both.
    The daemon's `[vm.NAME.static]` sets the same values (tested in crates/cli/tests/root.rs)."""
    for tid, comm in qemu_threads(pid):
        try:
            if policy == "static_rr":
                os.sched_setscheduler(tid, os.SCHED_RR, os.sched_param(1))
            if policy in ("static_fifo", "shield_fifo"):
                os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(97 if is_vcpu(comm) else 98))
            if policy in ("shield", "shield_fifo"):
                os.sched_setaffinity(tid, shield_cpus()[1] if is_vcpu(comm) else shield_cpus()[0])
        except ProcessLookupError:
            pass


def shield_cpus():
    """(CPUs for everything else, CPUs for the vCPU) under the shield policy."""
    return set(range(NCPUS - 1)) or {0}, {NCPUS - 1}


def guest_cosched():
    """GUEST_COSCHED: COSCHED stripped of its debug information (symbols kept, for backtraces),
    made again whenever COSCHED is another file or has changed (its path, size and time are
    recorded beside the copy); returns its path."""
    if not COSCHED.exists():
        raise RuntimeError(f"{COSCHED} missing: build first (scripts/setup.sh, or cargo build --release)")
    st = COSCHED.stat()
    source = f"{COSCHED.resolve()} {st.st_size} {st.st_mtime_ns}\n"
    stamp = GUEST_COSCHED.with_name("cosched.source")
    try:
        fresh = GUEST_COSCHED.exists() and stamp.read_text() == source
    except OSError:
        fresh = False
    if not fresh:
        GUEST_COSCHED.parent.mkdir(parents=True, exist_ok=True)
        tmp = GUEST_COSCHED.with_name(f".cosched.{os.getpid()}")
        subprocess.run(["strip", "--strip-debug", "-o", str(tmp), str(COSCHED)], check=True)
        os.replace(tmp, GUEST_COSCHED)
        stamp.write_text(source)
    return GUEST_COSCHED


def guest_cmd(workload_file, pidfile, timeout=900, sock=None, layers=(), adds=(), disks=(), append="",
              name=None, nets=()):
    """guest/run.sh's command line for one boot (the agent binary is always added as /bin/cosched).
    nets: NICs as run.sh --net takes them ("tap=IFNAME,ip=ADDR/PREFIX", "user,...")."""
    cmd = [str(RUN_SH), "--workload", str(workload_file), "--add", f"{guest_cosched()}:/bin/cosched",
           "--pidfile", str(pidfile), "--timeout", str(timeout)]
    if name:
        cmd += ["--name", name]
    for layer in layers:
        cmd += ["--layer", str(layer)]
    for a in adds:
        cmd += ["--add", a]
    if sock:
        cmd += ["--sock", str(sock)]
    for d in disks:
        cmd += ["--disk", str(d)]
    for n in nets:
        cmd += ["--net", n]
    if append:
        cmd += ["--append", append]
    return cmd


def boot_guest(workload, sock=None, on_line=None, timeout=900, layers=(), adds=(), disks=(), append=""):
    """Boots the test guest with `workload`; returns (console output, QEMU pid).
    on_line(line, pid) is called for every console line as it arrives.
    disks: virtio-blk disks (/dev/vda, /dev/vdb... in order), each as run.sh --disk takes it: an
    image path, optionally with ",iothread" and ",aio=threads|native|io_uring" (raw, cache=none).
    append: extra kernel command line (e.g. "cosched.skip_modules=bfq")."""
    with tempfile.TemporaryDirectory(prefix="cosched-guest-") as tmp:
        wl = Path(tmp) / "workload.sh"
        wl.write_text(workload)
        pidfile = Path(tmp) / "qemu.pid"
        cmd = guest_cmd(wl, pidfile, timeout=timeout, sock=sock, layers=layers, adds=adds, disks=disks,
                        append=append)
        out = []
        pid = None
        errfile = Path(tmp) / "run.err"
        with open(errfile, "w") as errf, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, text=True,
                                                          errors="replace",
                                                          preexec_fn=dies_with_us(signal.SIGTERM)) as proc:
            try:
                for line in proc.stdout:
                    line = line.rstrip("\r\n")
                    out.append(line)
                    if pid is None and pidfile.exists():
                        try:
                            pid = int(pidfile.read_text().strip())
                        except ValueError:
                            pass
                    if on_line:
                        on_line(line, pid)
            except BaseException:
                # Interrupted (SIGTERM, Ctrl-C, a failed measurement): QEMU goes with us.
                try:
                    os.kill(pid or int(pidfile.read_text().strip()), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
                proc.kill()
                raise
        err = errfile.read_text()
        console = "\n".join(out)
        if proc.returncode != 0 or "COSCHED-GUEST: workload exit 0" not in console:
            raise RuntimeError(f"guest run failed (exit {proc.returncode}):\n{err}\n" + "\n".join(out[-40:]))
        return console, pid


# ---------------------------------------------------------------------------------------------
# Several guests at once, on a private network (the FEAS experiments)

NETNS_PREFIX = "cosfeas-"


def _netns_owner_alive(name):
    try:
        pid = int(name[len(NETNS_PREFIX):])
    except ValueError:
        return True  # not ours by name: leave it
    return Path(f"/proc/{pid}").exists()


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class TapNet:
    """A private network namespace (cosfeas-<our pid>) holding tap devices cosfeas1..cosfeasN,
    tap i with the host address 10.77.i.1/24 (guest i is 10.77.i.2), and lo up. The guests' QEMU
    and the clients run inside it (`prefix` before their command: QEMU opens its tap there), so
    that no test traffic goes to a private address of the host's own network. Removed on exit,
    also on SIGINT, SIGTERM (made an exception while it exists, if nobody handles it) and
    exceptions; a namespace a SIGKILLed run left (its owner pid gone) is removed by the next one.
    Deleting the namespace deletes its taps."""

    def __init__(self, n):
        self.n = n
        self.name = f"{NETNS_PREFIX}{os.getpid()}"
        self.prefix = ["nsenter", f"--net=/run/netns/{self.name}"]
        self._old_term = None

    @staticmethod
    def tap(i):
        return f"cosfeas{i}"

    @staticmethod
    def guest_ip(i):
        return f"10.77.{i}.2"

    def net_arg(self, i):
        """run.sh --net for guest i."""
        return f"tap={self.tap(i)},ip={self.guest_ip(i)}/24"

    @staticmethod
    def remove_stale():
        """Namespaces of earlier runs whose process is gone (SIGKILL)."""
        out = _ip("netns", "list", check=False).stdout
        for line in out.splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith(NETNS_PREFIX) and not _netns_owner_alive(name):
                _ip("netns", "del", name, check=False)

    def __enter__(self):
        self.remove_stale()
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            def term(signum, frame):
                raise KeyboardInterrupt
            self._old_term = signal.signal(signal.SIGTERM, term)
        try:
            _ip("netns", "add", self.name)
            _ip("-n", self.name, "link", "set", "lo", "up")
            for i in range(1, self.n + 1):
                _ip("-n", self.name, "tuntap", "add", "dev", self.tap(i), "mode", "tap")
                _ip("-n", self.name, "addr", "add", f"10.77.{i}.1/24", "dev", self.tap(i))
                _ip("-n", self.name, "link", "set", self.tap(i), "up")
        except BaseException:
            self.close()
            raise
        return self

    def close(self):
        for i in range(1, self.n + 1):
            _ip("-n", self.name, "link", "del", self.tap(i), check=False)
        _ip("netns", "del", self.name, check=False)
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None

    def __exit__(self, *exc):
        self.close()
        return False

    def client(self, cmd, cpus=None, **kw):
        """subprocess.run of `cmd` inside the namespace (on `cpus` if given), output captured."""
        return subprocess.run(self.prefix + list(cmd), capture_output=True, text=True,
                              preexec_fn=_client_preexec(cpus), **kw)

    def client_popen(self, cmd, cpus=None, **kw):
        """subprocess.Popen of `cmd` inside the namespace (on `cpus` if given)."""
        return subprocess.Popen(self.prefix + list(cmd), preexec_fn=_client_preexec(cpus), **kw)


def _client_preexec(cpus):
    def pre():
        dies_with_us(signal.SIGKILL)()
        if cpus:
            os.sched_setaffinity(0, cpus)
    return pre


def foreign_qemus(ours):
    """Pids of QEMU processes on this host that are not in `ours`."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in ours:
            continue
        try:
            comm = Path(f"/proc/{d}/comm").read_text().strip()
        except OSError:
            continue
        if comm.startswith("qemu-system"):
            out.append(int(d))
    return out


class ConsoleReader:
    """A guest's process whose stdout is the guest's console: a thread reads it into `lines`
    (echoed with `verbose`), under `_cond`, which is notified at each line and at the end.
    The class sets `name`, `verbose` and calls _follow(proc); it stops the guest in stop()."""

    def _follow(self, proc):
        import threading
        self.proc = proc
        self.lines = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            line = line.rstrip("\r\n")
            if self.verbose:
                print(f"   {self.name} | {line}", flush=True)
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def console(self):
        with self._cond:
            return "\n".join(self.lines)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


class GuestVM(ConsoleReader):
    """One test guest booted in the background (guest/run.sh), its console read by a thread.
    wait_for() waits for a console line; stop() stops it (SIGTERM to run.sh, which stops QEMU).
    `prefix` goes before run.sh's command (TapNet.prefix: QEMU in that network namespace)."""

    def __init__(self, workload, name, nets=(), adds=(), layers=(), append="", timeout=3600, prefix=(),
                 verbose=False):
        self.name = name
        self.verbose = verbose
        self._tmp = tempfile.TemporaryDirectory(prefix="cosched-vm-")
        tmp = Path(self._tmp.name)
        (tmp / "workload.sh").write_text(workload)
        self.pidfile = tmp / "qemu.pid"
        self.errfile = tmp / "run.err"
        cmd = list(prefix) + guest_cmd(tmp / "workload.sh", self.pidfile, timeout=timeout, layers=layers,
                                       adds=adds, append=append, name=name, nets=nets)
        self._pid = None
        with open(self.errfile, "w") as errf:
            self._follow(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, text=True, errors="replace",
                                          preexec_fn=dies_with_us(signal.SIGTERM)))

    @property
    def pid(self):
        """QEMU's pid (once it has written its pidfile), else None."""
        if self._pid is None:
            try:
                self._pid = int(self.pidfile.read_text().strip())
            except (OSError, ValueError):
                pass
        return self._pid

    def wait_for(self, prefix, timeout=120):
        """The first console line starting with `prefix`; RuntimeError if the guest exits or
        `timeout` seconds pass first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line
                left = deadline - time.monotonic()
                if self.proc.poll() is not None and not self._reader.is_alive():
                    why = f"exited {self.proc.returncode}"
                    break
                if left <= 0:
                    why = f"no {prefix!r} within {timeout} s"
                    break
                self._cond.wait(min(left, 0.5))
        raise RuntimeError(f"guest {self.name}: {why}:\n{self.errfile.read_text()}\n" + "\n".join(self.lines[-30:]))

    def threads(self):
        """(tid, comm) of QEMU's threads ([] before QEMU is up)."""
        try:
            return qemu_threads(self.pid) if self.pid else []
        except OSError:
            return []

    def vcpu_tids(self):
        return [tid for tid, comm in self.threads() if is_vcpu(comm)]

    def pin(self, vcpu_cpus, other_cpus):
        """vCPU threads to `vcpu_cpus`, every other QEMU thread to `other_cpus` (threads QEMU
        creates later inherit their creator's: the main loop's)."""
        n = 0
        for tid, comm in self.threads():
            try:
                os.sched_setaffinity(tid, vcpu_cpus if is_vcpu(comm) else other_cpus)
                n += is_vcpu(comm)
            except ProcessLookupError:
                pass
        if n == 0:
            raise RuntimeError(f"guest {self.name}: no vCPU thread found in QEMU pid {self.pid}")

    def stop(self):
        """Stops the guest (idempotent): SIGTERM to run.sh, which stops QEMU; SIGKILL to both
        after 20 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                if self.pid:
                    try:
                        os.kill(self.pid, signal.SIGKILL)
                    except OSError:
                        pass
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        self.proc.stdout.close()
        self._tmp.cleanup()


def schedstat_ns(tid):
    """Time thread `tid` has spent on a CPU (ns; /proc/<tid>/schedstat), 0 once it is gone."""
    try:
        return int(Path(f"/proc/{tid}/schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def parse_ping(out):
    """Round-trip times in µs from ping's output ("... time=0.862 ms" lines; busybox or iputils)."""
    rtts = []
    for line in out.splitlines():
        i = line.find("time=")
        if i >= 0 and "bytes from" in line:
            rtts.append(float(line[i + 5:].split()[0].rstrip("ms")) * 1000.0)
    return rtts


def run(body, host_hogs_n=0, guest_hogs=0, policy="none", daemon_config="", agent_args="",
        host_job=None, layers=(), tools=False, start_agent=True, pin_host=False, verbose=False):
    """One boot of the test guest under a host load and a host policy (see POLICIES).

    body        the guest's measurement script (see cyclictest_body); prints COSCHED-MEASURE-START/END
                around what it measures. It may measure several windows in one boot, each between
                "COSCHED-MEASURE-START NAME" and "COSCHED-MEASURE-END NAME": the window's figures
                are then in result["windows"][NAME] (the unnamed window's are the result's own)
    host_job    a command run on the host from MEASURE-START until it exits; its wall time is
                returned as job_s
    start_agent with policy "cosched": start the guest agent before `body` (False: `body` does, or
                no agent: the daemon finds the VM by its channel, e.g. for `[vm.bench.static]`)
    pin_host    keep the host hogs and `host_job` off the last CPU, as the shield policies do (for a
                shield the daemon makes: it moves only the VM's threads and IRQs)
    tools       add cosched-tools to the guest (/usr/bin/cosched-tools)
    Returns a dict: console, job_s, measure_s (host clock between the two lines), hog_cpu_s (CPU
    time the host hogs got meanwhile), and for "cosched" the daemon's counters and hint-to-applied
    latency at MEASURE-END, boosted_share (the VM's boosted time over measure_s), and whether the
    VM was registered during the run."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (one of {POLICIES})")
    result = {"policy": policy, "host_hogs": host_hogs_n, "guest_hogs": guest_hogs}
    others = shield_cpus()[0] if policy in ("shield", "shield_fifo") or pin_host else None
    with tempfile.TemporaryDirectory(prefix="cosched-run-") as tmp, host_hogs(host_hogs_n, cpus=others) as hogs:
        daemon = Daemon(tmp, daemon_config) if policy == "cosched" else None
        # Each window's marks, by name ("" for the unnamed one), in the order they began.
        marks = {}
        job = {}

        def on_line(line, pid):
            if verbose:
                print("   | " + line, flush=True)
            word, _, name = line.partition(" ")
            if word == "COSCHED-MEASURE-START":
                w = marks[name] = {"start": time.monotonic(), "hog_cpu0": sum(cpu_time_s(h.pid) for h in hogs)}
                if daemon:
                    # The VM's boosted time so far (boot, warm-up), left out of boosted_share.
                    for vm in (daemon.status() or {}).get("vms", []):
                        w["boosted0_s"] = boosted_s(vm["resources"]["cpu"])
                if len(marks) > 1:
                    return
                if pid and policy in ("static_rr", "static_fifo", "shield", "shield_fifo"):
                    apply_static(pid, policy)
                if host_job:
                    job["proc"] = subprocess.Popen(host_job, stdout=subprocess.DEVNULL,
                                                   preexec_fn=dies_with_us(signal.SIGKILL))
                    job["t0"] = time.monotonic()
                    if others:
                        os.sched_setaffinity(job["proc"].pid, others)
            elif word == "COSCHED-MEASURE-END" and name in marks:
                w = marks[name]
                w["end"] = time.monotonic()
                w["hog_cpu1"] = sum(cpu_time_s(h.pid) for h in hogs)
                if daemon:
                    st = daemon.status() or {}
                    for vm in st.get("vms", []):
                        cpu = vm["resources"]["cpu"]
                        w["registered"] = vm["registered"]
                        # The VM's channel counters and its CPU resource's, in one dict.
                        w["daemon"] = {**vm["counters"], **cpu["counters"]}
                        w["daemon_cpu"] = cpu
                        w["daemon_static"] = vm.get("static")
                        w["hint_to_applied_us"] = vm["latency"]
                        w["actuation_errors"] = vm["actuation_errors"]
                        w["boosted_for_ms"] = cpu.get("boosted_for_ms", 0)
                        w["boosted1_s"] = boosted_s(cpu)
                    log = (Path(tmp) / "daemon.log").read_text()
                    w["daemon_warnings"] = [l for l in log.splitlines() if "warning:" in l]
        try:
            console, _ = boot_guest(
                guest_script(body, agent=daemon is not None and start_agent, guest_hogs=guest_hogs,
                             agent_args=agent_args),
                sock=daemon.socket_dir / "bench.sock" if daemon else None,
                on_line=on_line, layers=layers, adds=[f"{TOOLS}:/usr/bin/cosched-tools"] if tools else ())
            if "proc" in job:
                job["proc"].wait()
                result["job_s"] = time.monotonic() - job["t0"]
                if job["proc"].returncode != 0:
                    raise RuntimeError(f"host job {host_job} exited {job['proc'].returncode}")
        finally:
            if "proc" in job and job["proc"].poll() is None:
                job["proc"].kill()
                job["proc"].wait()
            if daemon:
                daemon.stop()
        if not marks or any("end" not in w for w in marks.values()):
            raise RuntimeError("the guest did not print COSCHED-MEASURE-START/END:\n" + console[-2000:])
        windows = {}
        for name, w in marks.items():
            out = windows[name] = {k: v for k, v in w.items() if k not in (
                "start", "end", "hog_cpu0", "hog_cpu1", "boosted0_s", "boosted1_s")}
            out["measure_s"] = w["end"] - w["start"]
            out["hog_cpu_s"] = w["hog_cpu1"] - w["hog_cpu0"]
            if "boosted1_s" in w:
                # Boosted time in the measured window (finished boosts plus the one under way,
                # less the same at its start) over the window.
                out["boosted_share"] = (w["boosted1_s"] - w.get("boosted0_s", 0.0)) / out["measure_s"]
        result.update(windows.get("", {}))
        result["windows"] = windows
        result["console"] = console
        if daemon:
            result["agent_log"] = [l[len("COSCHED-AGENT: "):] for l in console.splitlines()
                                   if l.startswith("COSCHED-AGENT: ")]
            # The guest stops its agent (DEREGISTER) right after MEASURE-END, racing the status
            # query made on that line: the agent's own log says whether it was registered.
            if start_agent:
                result["registered"] = bool(result.get("registered")) or any(
                    "registered with the host" in l for l in result["agent_log"])
    return result


def host_cyclictest(host_hogs_n, args, loops):
    """cyclictest on the host itself ("no guest" in Coordinated Task Scheduling's figures), under `host_hogs_n` hogs."""
    with tempfile.TemporaryDirectory(prefix="cosched-hostcyc-") as tmp, host_hogs(host_hogs_n):
        hist = Path(tmp) / "hist"
        subprocess.run(["cyclictest", *args.split(), "-l", str(loops), "-q", "-m", "-h", str(HIST_US),
                        f"--histfile={hist}"], check=True, stdout=subprocess.DEVNULL)
        lines = hist.read_text().splitlines()
    console = "COSCHED-HIST-BEGIN\n" + " ".join(
        " ".join(l.split()) for l in lines if l and not l.startswith("#") and int(l.split()[1], 10) > 0)
    console += "\n" + "\n".join(l for l in lines if l.startswith("# ")) + "\nCOSCHED-HIST-END"
    return stats(*parse_histogram(console))
