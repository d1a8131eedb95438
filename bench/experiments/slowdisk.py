"""An emulated slow disk for the I/O experiments, and its validation on the host alone.

    sudo /usr/bin/python3 -m bench.experiments.slowdisk validate [--quick] [--out DIR]
    sudo /usr/bin/python3 -m bench.experiments.slowdisk cleanup     # what a killed run left
    /usr/bin/python3 -m bench.experiments.slowdisk render [--out DIR]   # summary and plot again

The disk: bench/slowdisk/slowdisk.c, a single-threaded FUSE
server, exposes one file, disk.img, that costs a seek (8 ms beyond 512 KiB) plus transfer
(40 MB/s) per request, with direct_io (no page cache). A loop device with direct I/O over that
file runs BFQ (or none / mq-deadline), and carries an ext4 file system. Every reader, whatever
its cgroup, ends up in the one queue of the loop device, and the scheduler of the loop device
decides the order, as on a real slow disk.

    with SlowDisk(workdir) as d:          # server, FUSE mount, loop, mkfs, mount (delays off)
        d.populate_readers(5)             # 5 x 120 MB files
        d.copy_tree("/usr/lib/python3.11", d.data / "py/lib/python3.11")
        d.slow()                          # delays on
        d.set_scheduler("bfq")
        with d.start_readers(5, "seq"):   # O_DIRECT readers, one long-lived process each
            d.drop_caches(); ...

Everything it creates is listed in /run/cosched-slowdisk/<pid>.json; SlowDisk() first removes
what a run killed with SIGKILL left (cleanup_stale). Teardown also runs on SIGINT and SIGTERM.

validate: the cold start of `python3 -S -B -c "import <120 modules>"` (about 290 files, 8.7 MB,
from a copy of the standard library on the slow disk, page cache dropped before each launch)
alone and next to 5 sequential readers under bfq, none and mq-deadline. BFQ should keep it near
the time alone; none should not. Writes data.csv, checks.json (the uncached reads, the first
launch's I/O, set-up and teardown, the server's counters), summary.md (its targets judged from
data.csv) and plot.png to build/results-quick/slowdisk (--quick) or results/slowdisk; `render`
writes summary.md and plot.png again from those files. The disk and the validation are stdlib
only; the summary and the plot use experiments.common and matplotlib (/usr/bin/python3). Needs
root, fuse3 and libfuse3-dev (scripts/setup.sh).
"""

import argparse
import csv
import ctypes
import json
import mmap
import re
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "bench/slowdisk/slowdisk.c"
BINARY = REPO / "build/slowdisk/slowdisk"
STATE_DIR = Path(os.environ.get("COSCHED_SLOWDISK_STATE", "/run/cosched-slowdisk"))
FSNAME = "cosched-slowdisk"
SCHEDULERS = ("bfq", "none", "mq-deadline")

_libc = ctypes.CDLL(None, use_errno=True)


class Unsupported(RuntimeError):
    """An experiment that cannot run on this host, and why."""


def host_bfq():
    """None when the host's kernel offers the bfq I/O scheduler (loaded as a module first where
    modprobe can); otherwise why not, with what its block devices offer."""
    if not Path("/sys/module/bfq").exists() and shutil.which("modprobe"):
        subprocess.run(["modprobe", "-q", "bfq"], check=False)
    offered = {f.parent.parent.name: f.read_text().strip() for f in sorted(Path("/sys/block").glob("*/queue/scheduler"))}
    if any("bfq" in s.replace("[", " ").replace("]", " ").split() for s in offered.values()):
        return None
    seen = "; ".join(f"{dev}: {s}" for dev, s in list(offered.items())[:2]) or "no block device"
    return f"the host kernel offers no bfq I/O scheduler ({seen}): it was built without CONFIG_IOSCHED_BFQ"


def require_bfq(what):
    """Raises Unsupported, before anything is set up, where the host has no BFQ."""
    why = host_bfq()
    if why:
        raise Unsupported(f"{what} needs BFQ on the host's disk, and is unsupported here: {why}")


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _die_with_parent():
    _libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG


def _run(*cmd, check=True):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: {r.stderr.strip() or r.stdout.strip()}")
    return r


# ---------------------------------------------------------------------------------------------
# What exists: processes (pid + start time, so that a reused pid is never taken for ours),
# mounts, loop devices.


def _starttime(pid):
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(proc):
    """proc = [pid, starttime]: is that very process still there (zombies count as gone)?"""
    pid, start = proc
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z" and _starttime(pid) == start


def _kill(procs, sig=signal.SIGKILL, wait_s=10.0):
    """Send `sig` to those of `procs` still alive; wait up to wait_s for them to go."""
    for p in procs:
        if _alive(p):
            try:
                os.kill(p[0], sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        for p in procs:  # reap our own children; others' are reaped by init
            try:
                os.waitpid(p[0], os.WNOHANG)
            except ChildProcessError:
                pass
        if not any(_alive(p) for p in procs):
            return True
        time.sleep(0.02)
    return False


def _mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def _loops_of(backing):
    """The loop devices whose backing file is `backing` (from sysfs: the file is not touched)."""
    out = []
    for d in Path("/sys/block").glob("loop*"):
        try:
            if (d / "loop/backing_file").read_text().strip() == str(backing):
                out.append(f"/dev/{d.name}")
        except OSError:
            continue
    return out


def _users_of(path):
    """Processes with their cwd, root, an open file or a mapping under `path` (our mount)."""
    prefix = str(path).rstrip("/") + "/"
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            links = [os.readlink(p / "cwd"), os.readlink(p / "root")]
            links += [os.readlink(fd) for fd in (p / "fd").iterdir()]
            maps = (p / "maps").read_text()
        except OSError:
            continue
        if any((l + "/").startswith(prefix) for l in links) or prefix in maps:
            found.append([int(p.name), _starttime(int(p.name))])
    return found


def _write_state(path, state):
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, path)


def _teardown(st):
    """Undo what state `st` lists, in reverse order; each step only if it still exists. Returns
    what the server wrote (its counters, at exit)."""
    data, fuse, backing = st["data_mnt"], st["fuse_mnt"], st["backing"]
    _kill(st.get("procs", []))
    if _mounted(data):
        _kill(_users_of(data))
        if _run("umount", data, check=False).returncode != 0:
            _run("umount", "-l", data, check=False)
    for loop in _loops_of(Path(fuse) / "disk.img"):
        _run("losetup", "-d", loop, check=False)
    if _mounted(fuse):
        if _run("fusermount3", "-u", fuse, check=False).returncode != 0:
            _run("umount", "-l", fuse, check=False)
    if st.get("server") and not _kill([st["server"]], signal.SIGTERM, 3.0):
        _kill([st["server"]])
    log_text = ""
    if st.get("log") and Path(st["log"]).exists():
        log_text = Path(st["log"]).read_text().strip()
    for f in (backing, st.get("log")):
        if f:
            Path(f).unlink(missing_ok=True)
    for d in st.get("rmdirs", []):  # those we created; rmdir: only when empty and not mounted
        try:
            os.rmdir(d)
        except OSError:
            pass
    return log_text


def cleanup_stale():
    """Remove what earlier runs left whose process is gone (e.g. killed with SIGKILL).
    Returns the number of runs cleaned up."""
    n = 0
    for f in sorted(STATE_DIR.glob("*.json")) if STATE_DIR.exists() else []:
        try:
            st = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if _alive(st["owner"]):
            continue
        log(f"slowdisk: cleaning up after dead run {st['owner'][0]} ({st['workdir']})")
        _teardown(st)
        f.unlink(missing_ok=True)
        n += 1
    return n


def build():
    """build/slowdisk/slowdisk, rebuilt when older than its source."""
    if BINARY.exists() and BINARY.stat().st_mtime >= SOURCE.stat().st_mtime:
        return BINARY
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True)
    if flags.returncode != 0:
        raise RuntimeError("slowdisk: libfuse3 not found: apt-get install fuse3 libfuse3-dev (scripts/setup.sh)")
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    _run("gcc", "-O2", "-Wall", "-o", BINARY, SOURCE, *flags.stdout.split())
    return BINARY


# ---------------------------------------------------------------------------------------------
# The disk

READER = r"""
import mmap, os, random, sys
path, kind = sys.argv[1], sys.argv[2]
size = os.path.getsize(path)
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 1 << 20)          # page-aligned, as O_DIRECT needs
off = 0
while True:
    if kind == "seq":                 # 1 MiB requests, front to back, again and again
        n = os.preadv(fd, [buf], off)
        off = off + n if n > 0 and off + n < size else 0
    else:                             # 4-64 KiB at random 4 KiB-aligned offsets
        n = random.randrange(1, 17) * 4096
        os.preadv(fd, [memoryview(buf)[:n]], random.randrange(0, (size - n) // 4096) * 4096)
"""


class Readers:
    """Running readers: `stop()` (or leave the `with`) kills them."""

    def __init__(self, disk, procs):
        self.disk, self.procs = disk, procs

    def rchar(self):
        """Bytes read so far by all readers (/proc/PID/io)."""
        total = 0
        for p in self.procs:
            try:
                total += int(Path(f"/proc/{p.pid}/io").read_text().split("rchar:")[1].split()[0])
            except (OSError, IndexError):
                pass
        return total

    def stop(self):
        self.disk._forget([[p.pid, _starttime(p.pid)] for p in self.procs])
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        self.procs = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class SlowDisk:
    """The slow disk, set up on __enter__ (or start()) and torn down on __exit__ (or close())."""

    def __init__(self, workdir, size_mb=1024, seek_ms=8.0, seek_kib=512, mbps=40.0, rotational=True):
        self.workdir = Path(workdir).resolve()
        self.size_mb, self.seek_ms, self.seek_kib, self.mbps = size_mb, seek_ms, seek_kib, mbps
        self.rotational = rotational
        self.backing = self.workdir / "backing.img"
        self.fuse = self.workdir / "fuse"
        self.data = self.workdir / "data"
        self.server = None
        self.loop = None
        self.server_stats = ""
        self.is_fast = True
        self.state_file = STATE_DIR / f"{os.getpid()}.json"
        self.state = None
        self.old_handlers = {}

    # --- setup and teardown

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()

    def start(self):
        if os.geteuid() != 0:
            raise RuntimeError("slowdisk: must run as root (FUSE, loop devices, mount, drop_caches)")
        t0 = time.monotonic()
        cleanup_stale()
        # SIGTERM interrupts like Ctrl-C, so that __exit__ tears down.
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                self.old_handlers[sig] = signal.signal(sig, _interrupted)
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        self.setup_s = time.monotonic() - t0

    def _start(self):
        binary = build()
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        # The state lists what may exist before it is created: a SIGKILL at any point leaves
        # nothing that cleanup_stale() does not know about.
        self.state = dict(owner=[os.getpid(), _starttime(os.getpid())], workdir=str(self.workdir),
                          backing=str(self.backing), fuse_mnt=str(self.fuse), data_mnt=str(self.data),
                          log=str(self.workdir / "server.log"), server=None, procs=[], rmdirs=[])
        _write_state(self.state_file, self.state)
        for d in (self.workdir, self.fuse, self.data):
            if not d.exists():
                d.mkdir(parents=True)
                self.state["rmdirs"].insert(0, str(d))
                _write_state(self.state_file, self.state)
        for d in (self.fuse, self.data):
            if _mounted(d):
                raise RuntimeError(f"slowdisk: {d} is already a mount point")
        with open(self.backing, "wb") as f:  # sparse
            f.truncate(self.size_mb << 20)
        with open(self.state["log"], "wb") as logf:
            self.server = subprocess.Popen(
                [binary, f"--backing={self.backing}", f"--seek-ms={self.seek_ms}", f"--seek-kib={self.seek_kib}",
                 f"--mbps={self.mbps}", "--fast", "-f", "-s", "-o", f"fsname={FSNAME}", self.fuse],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True)
        self.state["server"] = [self.server.pid, _starttime(self.server.pid)]
        _write_state(self.state_file, self.state)
        deadline = time.monotonic() + 10
        while not (_mounted(self.fuse) and (self.fuse / "disk.img").exists()):
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"slowdisk: the FUSE server did not come up: "
                                   f"{Path(self.state['log']).read_text().strip()}")
            time.sleep(0.02)
        self.loop = _run("losetup", "--direct-io=on", "--find", "--show", self.fuse / "disk.img").stdout.strip()
        sysfs = self.sysfs()
        if (sysfs / "loop/dio").read_text().strip() != "1":
            raise RuntimeError(f"slowdisk: {self.loop} has no direct I/O: the page cache would hide the model")
        if self.rotational:
            (sysfs / "queue/rotational").write_text("1")  # before BFQ starts: it picks its references then
        self.set_scheduler("bfq")
        _run("mkfs.ext4", "-q", "-F", "-L", "slowdisk", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0",
             self.loop)
        _run("mount", "-o", "noatime", self.loop, self.data)

    def close(self):
        """Tear down in reverse order; safe to call twice and from a half-done start()."""
        if self.state is None:
            return
        ignored = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            t0 = time.monotonic()
            self.server_stats = _teardown(self.state)
            if self.server:
                self.server.wait()
            self.state_file.unlink(missing_ok=True)
            self.state = None
            self.teardown_s = time.monotonic() - t0
        finally:
            for s, h in ignored.items():
                signal.signal(s, h)
            for s, h in self.old_handlers.items():
                signal.signal(s, h)

    def _remember(self, procs):
        self.state["procs"] += procs
        _write_state(self.state_file, self.state)

    def _forget(self, procs):
        self.state["procs"] = [p for p in self.state["procs"] if p not in procs]
        _write_state(self.state_file, self.state)

    # --- knobs

    def sysfs(self):
        return Path("/sys/block") / Path(self.loop).name

    def set_scheduler(self, name):
        f = self.sysfs() / "queue/scheduler"
        f.write_text(name)
        if f"[{name}]" not in f.read_text():
            raise RuntimeError(f"slowdisk: {self.loop} did not take scheduler {name}: {f.read_text().strip()}")

    def io_stat(self):
        """(read requests, MB read) of the loop device so far."""
        f = self.sysfs().joinpath("stat").read_text().split()
        return int(f[0]), int(f[2]) * 512 / 1e6

    def scheduler(self):
        return self.sysfs().joinpath("queue/scheduler").read_text().split("[")[1].split("]")[0]

    def fast(self):
        """Delays off (SIGUSR1 to the server): for mkfs, populating, copying. The disk starts so."""
        self.server.send_signal(signal.SIGUSR1)
        self.is_fast = True

    def slow(self):
        """Delays on (SIGUSR2), after writing back what is dirty so that it is not written slowly."""
        os.sync()
        self.server.send_signal(signal.SIGUSR2)
        self.is_fast = False

    @contextmanager
    def _fast_for_a_while(self):
        was_fast = self.is_fast
        self.fast()
        try:
            yield
        finally:
            if not was_fast:
                self.slow()

    # --- contents

    def populate_readers(self, n, mb=120):
        """Files readers/r0.bin ... for sequential or random readers (written with the delays off);
        returns their paths."""
        d = self.data / "readers"
        d.mkdir(exist_ok=True)
        chunk = os.urandom(1 << 20)
        paths = []
        with self._fast_for_a_while():
            for i in range(n):
                p = d / f"r{i}.bin"
                if not p.exists() or p.stat().st_size != mb << 20:
                    with open(p, "wb") as f:
                        for _ in range(mb):
                            f.write(chunk)
                paths.append(p)
            os.sync()
        return paths

    def copy_tree(self, src, dst, ignore=()):
        """A copy of `src` at `dst` (under the data mount, written with the delays off), with
        mtimes kept (so that the .pyc files of a Python library stay valid)."""
        with self._fast_for_a_while():
            shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns(*ignore), dirs_exist_ok=True)
            os.sync()

    @staticmethod
    def drop_caches():
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3")

    def start_readers(self, n, kind="seq"):
        """n reader processes, one long-lived process each (a new process would be a new, weight-
        raised queue for BFQ), O_DIRECT so that they always reach the disk. seq: 1 MiB requests
        through readers/r<i>.bin; rand: 4-64 KiB at random offsets. Killed with us even by SIGKILL."""
        assert kind in ("seq", "rand")
        paths = sorted((self.data / "readers").glob("r*.bin"))
        if len(paths) < n:
            raise RuntimeError(f"slowdisk: {n} readers need populate_readers({n}) first")
        procs = [subprocess.Popen(["/usr/bin/python3", "-S", "-c", READER, str(p), kind], cwd="/",
                                  stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent, start_new_session=True)
                 for p in paths[:n]]
        self._remember([[p.pid, _starttime(p.pid)] for p in procs])
        return Readers(self, procs)

    def timed_read(self, path, mb=20, direct=True):
        """Seconds to read the first `mb` MB of `path` (O_DIRECT, or buffered)."""
        buf = mmap.mmap(-1, 1 << 20)
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        try:
            t = time.monotonic()
            for i in range(mb):
                os.preadv(fd, [buf], i << 20)
            return time.monotonic() - t
        finally:
            os.close(fd)


def _interrupted(signum, frame):
    raise KeyboardInterrupt


# ---------------------------------------------------------------------------------------------
# Validation: the cold start of an application on the host, alone and next to readers

MODULES = ("json re datetime collections argparse decimal csv asyncio email.mime.multipart http.server "
           "logging.handlers unittest.mock xml.etree.ElementTree sqlite3 multiprocessing.pool concurrent.futures "
           "urllib.request xmlrpc.client smtplib tarfile zipfile configparser difflib inspect dataclasses typing "
           "statistics fractions shelve tomllib wsgiref.simple_server ctypes plistlib mailbox pdb cProfile pstats "
           "timeit uuid secrets ipaddress gettext calendar pprint shlex glob tempfile shutil queue socketserver ssl "
           "venv zipapp xml.dom.minidom html.parser imaplib ftplib poplib nntplib telnetlib optparse getopt sched "
           "graphlib mimetypes netrc pickletools filecmp fileinput string operator heapq bisect array copy weakref "
           "contextvars codecs unicodedata zlib gzip bz2 lzma base64 binascii quopri uu hashlib textwrap colorsys "
           "wave chunk sndhdr imghdr modulefinder pkgutil runpy importlib.metadata compileall py_compile dis "
           "tokenize tabnanny pyclbr symtable ast code codeop faulthandler tracemalloc gc atexit traceback warnings "
           "abc enum numbers cmath random logging.config").split()
STDLIB = Path("/usr/lib/python3.11")
NOT_COPIED = ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "dist-packages",
              "site-packages", "config-3.11-*")
APP_CODE = ("import sys, warnings; warnings.simplefilter('ignore')\n"
            f"import {', '.join(MODULES)}\n"
            "files = {getattr(m, '__spec__', None) and m.__spec__.cached or getattr(m, '__file__', None) "
            "for m in list(sys.modules.values())} - {None}\n"
            "print('ready', len(files), sum(__import__('os').path.getsize(f) for f in files), "
            "all(f.startswith(sys.prefix) for f in files))")
TIMEOUT_S = 60
COLUMNS = ["readers", "kind", "scheduler", "launches", "mean_s", "min_s", "max_s", "timeouts", "reader_mbps"]


class App:
    """The starting application: /usr/bin/python3 importing MODULES from the copy of the standard
    library on the slow disk (PYTHONHOME), -S (no site), -B (no .pyc written)."""

    def __init__(self, disk):
        self.home = disk.data / "py"
        self.disk = disk

    def install(self):
        self.disk.copy_tree(STDLIB, self.home / "lib/python3.11", NOT_COPIED)

    def launch(self, timeout=TIMEOUT_S):
        """(seconds, output) of one cold launch; seconds is None after `timeout`."""
        self.disk.drop_caches()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env.update(PYTHONHOME=str(self.home), PYTHONDONTWRITEBYTECODE="1")
        t = time.monotonic()
        p = subprocess.Popen(["/usr/bin/python3", "-s", "-S", "-B", "-c", APP_CODE], cwd=self.home, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             preexec_fn=_die_with_parent)
        try:
            out = p.communicate(timeout=timeout)[0]
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            return None, "timeout"
        took = time.monotonic() - t
        if p.returncode != 0 or not out.startswith("ready"):
            raise RuntimeError(f"slowdisk: the application failed: {out.strip()[-500:]}")
        return took, out.strip()


def measure_point(app, readers, launches, label, gap_s=0.0):
    """Launch `launches` times, `gap_s` apart (stop after the first timeout); one row."""
    times, timeouts = [], 0
    r0, t0 = (readers.rchar() if readers else 0), time.monotonic()
    for i in range(launches):
        if i:
            time.sleep(gap_s)
        s, _ = app.launch()
        if s is None:
            timeouts += 1
            break
        times.append(s)
    mbps = (readers.rchar() - r0) / (time.monotonic() - t0) / 1e6 if readers else 0.0
    row = dict(launches=len(times) + timeouts, mean_s=statistics.mean(times) if times else None,
               min_s=min(times) if times else None, max_s=max(times) if times else None,
               timeouts=timeouts, reader_mbps=mbps)
    shown = f"{row['mean_s']:.2f} s (min {row['min_s']:.2f}, max {row['max_s']:.2f})" if times else ""
    log(f"{label}: {shown}{' ' if times and timeouts else ''}{f'timeout (> {TIMEOUT_S} s)' if timeouts else ''}"
        f"{f', readers {mbps:.1f} MB/s' if readers else ''}")
    return row


def _manifest():
    """bench/manifest.py (this module runs as bench.experiments.slowdisk too, without bench/ on the path)."""
    if str(REPO / "bench") not in sys.path:
        sys.path.insert(0, str(REPO / "bench"))
    import manifest
    return manifest


def validate(quick=False, out=None, n_readers=5, warmup_s=None):
    require_bfq("slowdisk (BFQ against none and mq-deadline)")
    run = _manifest().Run()
    out = Path(out) if out else (REPO / "build/results-quick/slowdisk" if quick else REPO / "results/slowdisk")
    out.mkdir(parents=True, exist_ok=True)
    launches = 2 if quick else 5
    # BFQ weight-raises every new queue, readers too, until it has served them ~60 MB
    # (max_service_from_wr) or for its raising time: measure after that, as an application that
    # starts next to readers that have run for a while.
    warmup_s = warmup_s if warmup_s is not None else 12
    # A launch starves the readers for its whole length under BFQ; a queue that waited more than
    # 2 s (bfq_wr_min_idle_time) counts as interactive when it gets I/O again and is raised too.
    # Launches spaced by less than that raising (~60 MB of service per reader) meet raised
    # readers: keep them apart.
    gap_s = 8
    t_all = time.monotonic()
    rows, checks = [], {"warmup_s": warmup_s, "gap_s": gap_s}
    with SlowDisk(REPO / "build/slowdisk/run") as d:
        app = App(d)
        t = time.monotonic()
        d.populate_readers(n_readers)
        app.install()
        d.slow()
        checks["populate_s"] = time.monotonic() - t
        checks["setup_s"] = d.setup_s + checks["populate_s"]
        log(f"slowdisk: {d.loop} (dio, {d.scheduler()}) over {d.fuse}/disk.img, {d.seek_ms:g} ms seek beyond "
            f"{d.seek_kib} KiB, {d.mbps:g} MB/s; set up in {checks['setup_s']:.1f} s")
        # The host page cache must not serve the disk: two reads of the same 20 MB take as long.
        r = d.data / "readers/r0.bin"
        checks["direct_read_s"] = [d.timed_read(r), d.timed_read(r)]
        d.drop_caches()
        b1 = d.timed_read(r, direct=False)
        d.drop_caches()
        checks["buffered_read_s"] = [b1, d.timed_read(r, direct=False)]
        model_s = 20 * 1.048576 / d.mbps
        checks["no_cache"] = all(t > 0.8 * model_s for t in checks["direct_read_s"] + checks["buffered_read_s"])
        if not checks["no_cache"]:
            log("WARNING: a read was faster than the model: something caches the disk")
        log(f"20 MB read twice, O_DIRECT: {checks['direct_read_s'][0]:.2f} s, {checks['direct_read_s'][1]:.2f} s; "
            f"buffered after drop_caches: {b1:.2f} s, {checks['buffered_read_s'][1]:.2f} s "
            f"(model: {20 * 1.048576 / d.mbps:.2f} s)")
        io0 = d.io_stat()
        s, info = app.launch()
        io1 = d.io_stat()
        checks["app"] = info
        checks["app_io"] = (io1[0] - io0[0], io1[1] - io0[1])
        log(f"application: {info.split()[1]} files, {int(info.split()[2]) / 1e6:.1f} MB, "
            f"all from the slow disk: {info.split()[3]}; first cold launch {s:.2f} s, "
            f"{checks['app_io'][0]} read requests, {checks['app_io'][1]:.1f} MB")

        for sched in (("bfq",) if quick else SCHEDULERS):
            d.set_scheduler(sched)
            row = measure_point(app, None, launches, f"0 readers, {sched}")
            rows.append(dict(row, readers=0, kind="-", scheduler=sched))
        kinds = ("seq",) if quick else ("seq", "rand")
        for kind in kinds:
            d.set_scheduler("bfq")
            with d.start_readers(n_readers, kind) as readers:
                log(f"{n_readers} {kind} readers started; {warmup_s} s warm-up")
                time.sleep(warmup_s)
                for sched in SCHEDULERS:
                    d.set_scheduler(sched)  # the readers keep running
                    time.sleep(2)
                    row = measure_point(app, readers, 1 if (quick and sched != "bfq") else launches,
                                        f"{n_readers} {kind} readers, {sched}", gap_s)
                    rows.append(dict(row, readers=n_readers, kind=kind, scheduler=sched))
    checks["teardown_s"] = d.teardown_s
    checks["server"] = d.server_stats
    checks["disk"] = {"seek_ms": d.seek_ms, "seek_kib": d.seek_kib, "mbps": d.mbps}
    checks["took_s"] = time.monotonic() - t_all
    checks["date"] = time.strftime("%Y-%m-%d")
    log(f"torn down in {d.teardown_s:.1f} s; {d.server_stats}")
    write_results(out, rows, checks, quick, run)
    return out


def write_results(out, rows, checks, quick, run):
    """data.csv and checks.json (what the summary's checks paragraph is made of: the uncached
    reads, the first launch's I/O, set-up and teardown, the server's counters), then the summary,
    the plot and the manifest."""
    with open(out / "data.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    (out / "checks.json").write_text(json.dumps(checks, indent=1) + "\n")
    text = render_results(out, rows, checks, quick, run, when=f"took {checks['took_s'] / 60:.1f} min on {checks['date']}")
    print(text, flush=True)
    print(f"{out}/summary.md", flush=True)


def stored(out=None):
    """The rows of a validation's data.csv, typed as measure_point() makes them (None where no
    launch finished)."""
    rows = []
    with open(Path(out or REPO / "results/slowdisk") / "data.csv", newline="") as f:
        for r in csv.DictReader(f):
            for k in ("readers", "launches", "timeouts"):
                r[k] = int(r[k])
            for k in ("mean_s", "min_s", "max_s", "reader_mbps"):
                r[k] = float(r[k]) if r.get(k, "") != "" else None
            rows.append(r)
    return rows


def render(out=None, quick=False, rows=None):
    """summary.md and plot.png again from a validation's data.csv (or `rows`, typed as
    stored() returns them) and checks.json where the run wrote one, without measuring;
    data.csv stays as measured, the manifest keeps the measurement."""
    out = Path(out) if out else REPO / "results/slowdisk"
    run = _manifest().Run()
    checks = json.loads((out / "checks.json").read_text()) if (out / "checks.json").exists() else None
    old = (out / "summary.md").read_text() if (out / "summary.md").exists() else ""
    m = _manifest().read(out) or {}
    found = re.search(r"took [0-9.]+ min on \d{4}-\d{2}-\d{2}", old)
    when = (f"took {checks['took_s'] / 60:.1f} min on {checks['date']}" if checks and "took_s" in checks else
            found.group(0) if found else f"measured on {m.get('date') or (m.get('started') or '?')[:10]}")
    return render_results(out, stored(out) if rows is None else rows, checks, quick, run, rendered=True,
                          when=f"{when}; this summary rendered again from its data.csv on {time.strftime('%Y-%m-%d')}")


def targets(rows, checks=None):
    """The validation's targets, judged from its rows: with the readers, BFQ keeps the start near
    its time alone (within PROTECTS_X) and `none` does not (over NOT_PROTECTED_X BFQ's time, or a
    timeout); where checks.json exists, that no page cache serves the disk."""
    sys.path.insert(0, str(REPO / "bench"))
    from experiments.common import target
    by = {(r["readers"], r["kind"], r["scheduler"]): r for r in rows}
    alone = by.get((0, "-", "bfq"))
    out = []
    if alone and alone["mean_s"]:
        out.append(target("the start alone (no readers, bfq): what BFQ's ratio divides by",
                          f"{alone['mean_s']:.2f} s", None, spread_text(alone)))
    for kind in ("seq", "rand"):
        n = max((r["readers"] for r in rows if r["kind"] == kind), default=0)
        bfq, none = by.get((n, kind, "bfq")), by.get((n, kind, "none"))
        if not (alone and alone["mean_s"] and bfq):
            continue
        x = bfq["mean_s"] / alone["mean_s"] if bfq["mean_s"] is not None and not bfq["timeouts"] else None
        out.append(target(f"{n} {kind} readers: BFQ protects the start, within {PROTECTS_X}× its time alone",
                          f"{bfq['mean_s']:.2f} s = {x:.2f}× alone" if x is not None else mean_text(bfq),
                          x is not None and x <= PROTECTS_X, spread_text(bfq)))
        if none:
            slow = none["timeouts"] > 0 or (none["mean_s"] or 0) > NOT_PROTECTED_X * (bfq["mean_s"] or alone["mean_s"])
            ratio = (f" = {none['mean_s'] / bfq['mean_s']:.1f}× BFQ's" if none["mean_s"] and bfq["mean_s"]
                     and not none["timeouts"] else "")
            out.append(target(f"{n} {kind} readers: `none` does not protect it (over {NOT_PROTECTED_X}× BFQ's time, "
                              "or a timeout)", mean_text(none) + ratio, slow, spread_text(none)))
    if checks and "no_cache" in checks:
        reads = checks["direct_read_s"] + checks["buffered_read_s"]
        model = 20 * 1.048576 / checks.get("disk", {}).get("mbps", 40.0)
        out.append(target("no page cache serves the disk: 20 MB reads take at least 0.8× the model's time",
                          f"{min(reads):.2f}-{max(reads):.2f} s against the model's {model:.2f} s",
                          bool(checks["no_cache"]), f"{len(reads)} reads"))
    return out


# The targets' thresholds (the validation's own criteria of "protects" and "does not").
PROTECTS_X, NOT_PROTECTED_X = 3, 5


def mean_text(r):
    if r["timeouts"] and not r["launches"] - r["timeouts"]:
        return f"timeout (> {TIMEOUT_S} s)"
    text = f"{r['mean_s']:.2f} s"
    return text + (f", {r['timeouts']} of {r['launches']} launches > {TIMEOUT_S} s" if r["timeouts"] else "")


def spread_text(r):
    ok = r["launches"] - r["timeouts"]
    if ok >= 2:
        text = f"{ok} launches {r['min_s']:.2f}-{r['max_s']:.2f} s"
    elif ok == 1:
        text = f"1 launch {r['mean_s']:.2f} s"
    else:
        return "one launch, stopped at its timeout" if r["launches"] == 1 else f"{r['launches']} launches, all timed out"
    return text + (f"; {r['timeouts']} > {TIMEOUT_S} s" if r["timeouts"] else "")


def plot(rows):
    """Each scheduler's start-up, alone and next to each kind of readers, with the targets: BFQ
    within PROTECTS_X its time alone; `none` above NOT_PROTECTED_X BFQ's."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = sorted({(r["readers"], r["kind"]) for r in rows}, key=lambda g: (g[0], g[1] != "seq"))
    colors = {"bfq": "#4c72b0", "none": "#c44e52", "mq-deadline": "#8c8c8c"}
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    width = 0.8 / len(SCHEDULERS)
    by = {(r["readers"], r["kind"], r["scheduler"]): r for r in rows}
    alone = by.get((0, "-", "bfq"))
    for i, g in enumerate(groups):
        for j, sched in enumerate(SCHEDULERS):
            r = by.get((*g, sched))
            if not r:
                continue
            x = i + (j - (len(SCHEDULERS) - 1) / 2) * width
            t = TIMEOUT_S if r["timeouts"] else r["mean_s"]
            ax.bar(x, t, width, color=colors[sched], label=sched if i == 0 else None)
            if r["launches"] - r["timeouts"] >= 2:
                ax.plot([x, x], [r["min_s"], r["max_s"]], color="black", linewidth=1, marker="_")
            if r["timeouts"]:
                ax.text(x, TIMEOUT_S, "X", ha="center", va="bottom", fontsize=12, fontweight="bold")
        bfq = by.get((*g, "bfq"))
        if g[0] and bfq and bfq["mean_s"]:
            ax.plot([i - 0.45, i + 0.45], [NOT_PROTECTED_X * bfq["mean_s"]] * 2, color="#c44e52", linestyle="--",
                    linewidth=1, label=f"target: `none` above {NOT_PROTECTED_X}× BFQ's time" if i == len(groups) - 1
                    else None)
    if alone and alone["mean_s"]:
        ax.axhline(PROTECTS_X * alone["mean_s"], color="#4c72b0", linestyle="--", linewidth=1,
                   label=f"target: BFQ within {PROTECTS_X}× its time alone")
    ax.set_xticks(range(len(groups)), [f"{n} {k} readers" if n else "alone" for n, k in groups])
    ax.set_ylabel(f"cold start (s); X: timeout (> {TIMEOUT_S} s)")
    ax.set_ylim(0, TIMEOUT_S * 1.15)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("python3 cold start on the emulated slow disk, on the host (mean, min-max)", fontsize=10)
    return fig


def render_results(out, rows, checks, quick, run, rendered=False, when=""):
    """summary.md (the targets table, the rows, the checks where known), plot.png and the manifest."""
    sys.path.insert(0, str(REPO / "bench"))
    from experiments.common import targets_md

    def cell(r, c):
        v = r.get(c)
        if c == "mean_s" and r["timeouts"] and not r["launches"] - r["timeouts"]:
            return f"timeout (> {TIMEOUT_S} s)"
        return f"{v:.2f}" if isinstance(v, float) else ("-" if v is None else str(v))

    heads = ["readers", "kind", "scheduler", "launches", "mean s", "min s", "max s", "timeouts", "readers MB/s"]
    table = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    table += ["| " + " | ".join(cell(r, c) for c in COLUMNS) + " |" for r in rows]
    table = "\n".join(table)
    disk = (checks or {}).get("disk") or {"seek_ms": 8.0, "seek_kib": 512, "mbps": 40.0}
    if checks:
        app = checks["app"].split()
        app_text = f": {app[1]} files, {int(app[2]) / 1e6:.1f} MB"
        first = (f" The first cold launch read {checks['app_io'][0]} requests, {checks['app_io'][1]:.1f} MB from the "
                 "loop device.")
        warm, gap = checks["warmup_s"], checks["gap_s"]
        check_text = f"""Checks: 20 MB read twice with O_DIRECT {checks['direct_read_s'][0]:.2f} s / {checks['direct_read_s'][1]:.2f} s,
buffered after drop_caches {checks['buffered_read_s'][0]:.2f} s / {checks['buffered_read_s'][1]:.2f} s
(the model says {20 * 1.048576 / disk['mbps']:.2f} s: {"no page cache serves the disk" if checks["no_cache"]
else "FASTER THAN THE MODEL: something caches the disk"}). Setup (server, loop, mkfs,
mount, populating with the delays off) {checks['setup_s']:.1f} s; teardown {checks['teardown_s']:.1f} s.
Server: {checks['server']}"""
    else:
        m = _manifest().read(out) or {}
        where = f" (git history: results/slowdisk/summary.md at {m['data_commit'][:7]})" if m.get("data_commit") else ""
        app_text, first, warm, gap = "", "", 12, 8
        check_text = ("Checks (uncached reads against the model, the first launch's I/O, set-up and teardown, the "
                      "server's counters): not in this run's data files; the run wrote them only into the summary "
                      f"this one replaces{where}. A run now keeps them in checks.json.")
    text = f"""# Slow disk: application cold start on the host, alone and next to readers

Command: `sudo /usr/bin/python3 -m bench.experiments.slowdisk validate{' --quick' if quick else ''}`
({when}).

{targets_md(targets(rows, checks))}

Disk: ext4 on `losetup --direct-io=on` over `disk.img` of bench/slowdisk/slowdisk.c (single-threaded FUSE,
`direct_io`, {disk['seek_ms']:g} ms per seek beyond {disk['seek_kib']} KiB, {disk['mbps']:g} MB/s), `rotational` = 1.
Application: `/usr/bin/python3 -s -S -B -c "import <{len(MODULES)} modules>"` with PYTHONHOME on a copy of
{STDLIB} on the slow disk{app_text}; caches dropped before each launch; timeout {TIMEOUT_S} s.
Readers: one long-lived process each, O_DIRECT, seq = 1 MiB requests through a 120 MB file, rand =
4-64 KiB at random offsets; started under bfq, {warm:g} s warm-up, then the scheduler is switched
under them (2 s settle); launches {gap:g} s apart.{first}

{table}

Why the warm-up and the gap: BFQ weight-raises new queues (the readers too, until each has had about
60 MB of service) and queues that waited more than 2 s, which every reader does during a launch. A
launch right after the readers start, or a few seconds after the previous one, meets raised readers.

{check_text}
"""
    (out / "summary.md").write_text(text)
    fig = plot(rows)
    fig.savefig(out / "plot.png", dpi=110, bbox_inches="tight")
    _manifest().write(out, run, name="slowdisk", producer="bench/experiments/slowdisk.py", quick=quick,
                      rendered=rendered)
    return text


def main(quick=False, out=None, verbose=False, fresh=False, rows=None):
    """bench/experiment.py's entry point (NAME = slowdisk). rows: a validation's rows
    (stored()), to render its summary and plot again without measuring."""
    if rows is not None:
        render(out, quick, rows)
        return Path(out) if out else REPO / "results/slowdisk"
    return validate(quick, out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["validate", "cleanup", "render"],
                    help="render: summary.md and plot.png again from data.csv (and checks.json), no root needed")
    ap.add_argument("--quick", action="store_true", help="bfq, none and mq-deadline with seq readers only (~3 min)")
    ap.add_argument("--out", help="output directory (default results/slowdisk or build/results-quick/slowdisk)")
    ap.add_argument("--warmup", type=float, help="seconds the readers run before the first measurement (12)")
    a = ap.parse_args()
    if a.command == "render":
        render(a.out, a.quick)
        sys.exit(0)
    if os.geteuid() != 0:
        sys.exit("slowdisk: must run as root")
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started with SIGINT ignored
    if a.command == "cleanup":
        print(f"slowdisk: cleaned up {cleanup_stale()} dead run(s)")
    else:
        try:
            validate(a.quick, a.out, warmup_s=a.warmup)
        except Unsupported as e:
            sys.exit(f"slowdisk: {e}")
        except KeyboardInterrupt:
            sys.exit("slowdisk: interrupted (torn down)")
