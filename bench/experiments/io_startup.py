"""Experiment io-startup: cold start-up time of an application in the guest under guest and host
readers (Virtual-BFQ, Fig. 1-3 and 10-11).

The disk is emulated (experiments.slowdisk): a single-threaded FUSE model of a disk (8 ms per
seek beyond 512 KiB, 40 MB/s) under a loop device with direct I/O running BFQ, with an ext4 on it
that holds the host readers' files and the VM's raw image; the host's BFQ idles up to
SLICE_IDLE_MS for a queue (see there). The guest (virtio-blk, cache=none: the host page cache
never serves the image; aio=native: see AIO) runs BFQ on its disk and the cosched agent with its
I/O detector. The application is python3 importing 120 modules from a copy of
the standard library on the guest's disk (PYTHONHOME), with the guest's caches dropped before
each launch; a launch over 60 s is a timeout (X in the plot).

Grid: guest workload none, 1r-seq, 5r-seq, 1r-rand, 5r-rand (long-lived O_DIRECT readers in the
guest) x host workload none, 1 and 5 sequential readers (O_DIRECT, on the same slow disk) x mode:
none (no I/O coordination), ioprio (cosched, real-time I/O class lever), weight (cosched, BFQ
weight lever through a per-VM cgroup). CPU coordination is off in every mode, so that the modes
differ in I/O only. One guest boot per (mode, host workload) measures every guest workload.

Targets (summary.md's table, judged from data.csv): with the most host readers and a sequential
guest workload, coordinated at most 1.3x the idle disk with each lever and uncoordinated at least
3x (a cell's mean counts a timed-out launch as 60 s: a lower bound); the default lever wins over
the cells with host readers. main(..., rows=stored(dir)) renders the summary and plot again from
data.csv without measuring (and puts first-run.csv's figures, an earlier full run of the grid,
beside them as the spread between runs).
"""

import csv
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt

import harness
from experiments import slowdisk
from experiments.common import Output, log, md_table, target

NAME = "io-startup"
MODES = ("none", "ioprio", "weight")
MODE_LABEL = {"none": "BFQ (no coordination)", "ioprio": "V-BFQ, ioprio lever", "weight": "V-BFQ, weight lever"}
GUEST_WORKLOADS = ("none", "1r-seq", "5r-seq", "1r-rand", "5r-rand")
TIMEOUT_S = 60
GUEST_READER_MB = 64
# How QEMU does the disk's I/O: with aio=native the main loop submits every request, so the
# host's BFQ sees the VM as one queue. With aio=threads (QEMU's default) each request goes to one
# of a pool of "worker" threads that exit after 10 s idle: many short-lived queues, each new one
# weight-raised by the host's BFQ as if it were an application starting, and raising them made
# the start-up slower, not faster (results/io-startup/calibration.md).
AIO = "native"
# BFQ's idle window on the host (slice_idle, ms; the kernel's default is 8). BFQ protects a
# queue by waiting for its next request before it serves another one; the TCG guest needs tens
# of ms between two requests, far longer than a KVM guest, so with 8 ms the host's BFQ gives up
# on the VM after each request even when it is raised (calibration.md: timeout at 8 ms,
# 10.0 s at 40 ms, 9.2 s at 100 ms with 5 host readers).
SLICE_IDLE_MS = 100
COLUMNS = ["mode", "host_readers", "guest_workload", "launches", "timeouts", "mean_s", "min_s", "max_s",
           "x_idle", "io_boosts", "io_boosted_s"]
# Virtual-BFQ, Fig. 10/11 (start-up of a large application, seconds): 5 sequential readers on the
# host, 1 sequential reader in the guest.
PAPER = {"idle": 2.2, "bfq": 8.5, "vbfq": 2.8}
# The targets, with the most host readers of the run and a sequential guest workload: coordinated
# at most 1.3x the idle disk (the paper has 1.27x), uncoordinated at least 3x (the set-up
# reproduces the problem).
COORDINATED_X, UNCOORDINATED_X = 1.3, 3
TARGET_WORKLOADS = ("1r-seq", "5r-seq")
# The lever cosched uses by default ([io] lever), chosen by this experiment: the summary checks
# that it still wins.
DEFAULT_LEVER = "ioprio"


def stored(directory=None, name="data.csv"):
    """A run's rows from results/io-startup/data.csv (or another file of the same columns there,
    first-run.csv), typed as one_boot() returns them: None where a cell has no finished launch."""
    path = Path(directory or harness.REPO / "results" / NAME) / name
    ints, floats = ("host_readers", "launches", "timeouts", "io_boosts"), ("mean_s", "min_s", "max_s", "x_idle",
                                                                            "io_boosted_s")
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            for k in ints:
                r[k] = int(r[k])
            for k in floats:
                r[k] = float(r[k]) if r.get(k, "") != "" else None
            rows.append(r)
    return rows


def plan(quick):
    """(host reader counts, guest workloads, modes, launches per cell)."""
    if quick:
        return [1], ["none"], ["none", "ioprio"], 1
    return [0, 1, 5], list(GUEST_WORKLOADS), list(MODES), 3


def daemon_config(mode):
    io = "false" if mode == "none" else "true"
    lever = "" if mode == "none" else f'[io]\nlever = "{mode}"\n'
    # I/O only; an application start-up in the paper takes up to ~10 s uncoordinated.
    return (f"[resources]\ncpu = false\nio = {io}\n[policy.resource.io]\nmax_continuous_boost_ms = 30000\n"
            f"max_boost_share_permille = 1000\n{lever}")


def guest_body(workloads, launches):
    app = slowdisk.APP_CODE.replace("'", "'\"'\"'")
    cells = " ".join(workloads)
    return f"""mount -t ext4 -o noatime /dev/vda /mnt || {{ echo "COSCHED-IO: mount failed"; exit 1; }}
# BFQ in the guest in every mode (the agent also sets it when the host grants I/O).
echo bfq > /sys/block/vda/queue/scheduler
echo "COSCHED-IO: scheduler $(cat /sys/block/vda/queue/scheduler)"
APP='{app}'
echo "COSCHED-MEASURE-START"
for gw in {cells}; do
    pids=""
    case $gw in
        none) n=0 ;;
        *) n=${{gw%%r-*}} ;;
    esac
    kind=${{gw#*r-}}
    i=0
    while [ "$i" -lt "$n" ]; do
        if [ "$kind" = seq ]; then
            cosched-tools seqread /mnt/readers/g$i.bin 100000 >/dev/null &
        else
            cosched-tools randread /mnt/readers/g$i.bin 100000 >/dev/null &
        fi
        pids="$pids $!"
        i=$((i + 1))
    done
    # BFQ favours a reader that just started (and any that waited > 2 s): let them settle.
    [ "$n" -gt 0 ] && sleep 10
    l=1
    while [ "$l" -le {launches} ]; do
        sync; echo 3 > /proc/sys/vm/drop_caches
        read -r u0 _ </proc/uptime
        PYTHONHOME=/mnt/py PYTHONDONTWRITEBYTECODE=1 timeout {TIMEOUT_S} python3 -s -S -B -c "$APP" >/tmp/app.out 2>&1
        rc=$?
        read -r u1 _ </proc/uptime
        echo "COSCHED-IO-LAUNCH $gw $l $u0 $u1 $rc $(head -c 80 /tmp/app.out | tr '\\n' ' ')"
        # After a timeout the cell is an X: its other launches would time out too.
        [ "$rc" = 0 ] || break
        l=$((l + 1))
        sleep 1
    done
    if [ -n "$pids" ]; then kill $pids 2>/dev/null; wait $pids; fi
done
echo "COSCHED-MEASURE-END"
umount /mnt
"""


def build_image(disk, path, guest_readers):
    """The guest's disk: an ext4 image with the standard library (py/lib/python3.11) and the guest
    readers' files, made on the slow disk (delays off) with mkfs.ext4 -d."""
    with tempfile.TemporaryDirectory(prefix="cosched-iostage-", dir="/var/tmp") as stage:
        stage = Path(stage)
        shutil.copytree(slowdisk.STDLIB, stage / "py/lib/python3.11", symlinks=True,
                        ignore=shutil.ignore_patterns(*slowdisk.NOT_COPIED))
        (stage / "readers").mkdir()
        chunk = bytes(range(256)) * 4096
        for i in range(guest_readers):
            with open(stage / f"readers/g{i}.bin", "wb") as f:
                for _ in range(GUEST_READER_MB):
                    f.write(chunk)
        size_mb = 160 + guest_readers * GUEST_READER_MB
        subprocess.run(["mkfs.ext4", "-q", "-F", "-d", str(stage), "-E",
                                "lazy_itable_init=0,lazy_journal_init=0", str(path), f"{size_mb}M"], check=True)


def dynload_libs():
    """The standard library's C extensions need shared libraries (libsqlite3, libssl, libffi, ...)
    the guest's initramfs lacks: adding each extension to the guest (run.sh --add) brings the
    libraries ldd lists, at their paths. The extensions themselves are read from the guest's disk
    (PYTHONHOME); their libraries come from the initramfs, in memory."""
    dynload = slowdisk.STDLIB / "lib-dynload"
    return [f"{so}:/tmp/dynload/" for so in sorted(dynload.glob("*.so"))]


def parse_launches(console):
    """{guest workload: [seconds or None (timeout)]} from the guest's launch lines."""
    out = {}
    for line in console.splitlines():
        if not line.startswith("COSCHED-IO-LAUNCH "):
            continue
        f = line.split()
        gw, u0, u1, rc = f[1], float(f[3]), float(f[4]), int(f[5])
        if rc == 0 and "ready" not in line:
            raise RuntimeError(f"io-startup: the application failed in the guest: {line}")
        if rc not in (0, 124, 143):
            raise RuntimeError(f"io-startup: the application failed in the guest: {line}")
        out.setdefault(gw, []).append(u1 - u0 if rc == 0 else None)
    return out


def one_boot(disk, image, mode, host_readers, workloads, launches, verbose):
    """Boots the guest once with `host_readers` on the host and `mode`; one row per guest workload."""
    layer = harness.PYTHON_LAYER
    with tempfile.TemporaryDirectory(prefix="cosched-io-") as tmp:
        daemon = harness.Daemon(tmp, daemon_config(mode))
        io_status = {}

        def on_line(line, pid):
            if verbose:
                print("   | " + line, flush=True)
            if line.startswith("COSCHED-IO-LAUNCH") or line.startswith("COSCHED-IO:"):
                log(f"  {mode} {host_readers}r: {line}")
            if line == "COSCHED-MEASURE-END":
                for vm in (daemon.status() or {}).get("vms", []):
                    io_status.update(vm["resources"].get("io", {}))

        readers = disk.start_readers(host_readers, "seq") if host_readers else None
        try:
            console, _ = harness.boot_guest(
                harness.guest_script(guest_body(workloads, launches), agent=True, agent_args="-v"),
                sock=daemon.socket_dir / "bench.sock", on_line=on_line, layers=[layer],
                adds=[f"{harness.TOOLS}:/usr/bin/cosched-tools", *dynload_libs()], disks=[f"{image},aio={AIO}"], timeout=3600)
        finally:
            if readers:
                readers.stop()
            daemon.stop()
    times = parse_launches(console)
    c = io_status.get("counters", {})
    boosted_s = harness.boosted_s(io_status) if c else 0.0
    rows = []
    for gw in workloads:
        ts = times.get(gw, [])
        ok = [t for t in ts if t is not None]
        rows.append(dict(mode=mode, host_readers=host_readers, guest_workload=gw, launches=len(ts),
                         timeouts=len(ts) - len(ok), mean_s=statistics.mean(ok) if ok else None,
                         min_s=min(ok) if ok else None, max_s=max(ok) if ok else None,
                         io_boosts=c.get("boosts", 0), io_boosted_s=boosted_s))
        if len(ts) != launches and not (ts and ts[-1] is None):
            raise RuntimeError(f"io-startup: {len(ts)} launches of {launches} for {gw}:\n" + console[-3000:])
    return rows


def cell_time(r):
    """What the plot and the ratios use: the cell's mean with each launch that timed out counted
    as TIMEOUT_S, a lower bound of the mean where any launch timed out."""
    ok = r["launches"] - r["timeouts"]
    return ((r["mean_s"] or 0.0) * ok + TIMEOUT_S * r["timeouts"]) / r["launches"]


def x_text(r, idle):
    """The cell against the idle disk: "1.35×", or "≥ 4.04×" where a launch timed out."""
    return f"{'≥ ' if r['timeouts'] else ''}{cell_time(r) / idle:.2f}×"


def launches_text(r, idle):
    """What a cell's launches took, from its row (data.csv keeps the finished launches' mean, min
    and max, and how many timed out): "3 launches, 6.87-9.39 s (1.20-1.64× idle)", "1 of 3
    launches timed out (> 60 s); the 2 finished took 4.44/4.73 s (0.78/0.83× idle)"."""
    ok = r["launches"] - r["timeouts"]

    def x(*vs):
        return f" ({'/'.join(f'{v / idle:.2f}' for v in vs)}× idle)" if idle else ""
    if ok == 1:
        done = f"{r['mean_s']:.2f} s{x(r['mean_s'])}"
    elif ok == 2:
        done = f"{r['min_s']:.2f}/{r['max_s']:.2f} s{x(r['min_s'], r['max_s'])}"
    elif ok > 2:
        done = (f"{r['min_s']:.2f}-{r['max_s']:.2f} s" + (f" ({r['min_s'] / idle:.2f}-{r['max_s'] / idle:.2f}× idle)"
                                                           if idle else ""))
    if not r["timeouts"]:
        return f"{ok} launches, {done}"
    if r["launches"] == 1:
        return f"its one launch timed out (> {TIMEOUT_S} s; a cell stops at its first timeout)"
    text = f"{r['timeouts']} of {r['launches']} launches timed out (> {TIMEOUT_S} s)"
    return text + (f"; the {ok} finished took {done}" if ok else "")


def range_text(r, idle):
    """The spread of a cell's launches: "launches 6.87-9.39 s (1.20-1.64× idle)", "launches
    4.44/4.73 s and 1 > 60 s", "one launch"."""
    ok = r["launches"] - r["timeouts"]
    if ok >= 2:
        sep = "/" if ok == 2 else "-"
        text = f"launches {r['min_s']:.2f}{sep}{r['max_s']:.2f} s" + (
            f" ({r['min_s'] / idle:.2f}{sep}{r['max_s'] / idle:.2f}× idle)" if idle else "")
    elif ok == 1:
        text = f"launch {r['mean_s']:.2f} s"
    else:
        return f"one launch, > {TIMEOUT_S} s" if r["launches"] == 1 else f"{r['launches']} launches, all > {TIMEOUT_S} s"
    if r["timeouts"]:
        text += f" and {r['timeouts']} > {TIMEOUT_S} s"
    return text if r["launches"] > 1 else f"one {text}"


def plot(out, rows, hosts, workloads, modes, idle):
    fig, axes = plt.subplots(1, len(hosts), figsize=(5.5 * len(hosts), 4.2), sharey=True, squeeze=False)
    width = 0.8 / len(modes)
    colors = {"none": "#c44e52", "ioprio": "#4c72b0", "weight": "#55a868"}
    for ax, h in zip(axes[0], hosts):
        for j, m in enumerate(modes):
            for i, gw in enumerate(workloads):
                r = next((r for r in rows if r["mode"] == m and r["host_readers"] == h and r["guest_workload"] == gw),
                         None)
                if not r:
                    continue
                x = i + (j - (len(modes) - 1) / 2) * width
                ax.bar(x, cell_time(r), width, color=colors[m], label=MODE_LABEL[m] if i == 0 else None)
                if r["launches"] > r["timeouts"] and r["min_s"] is not None:
                    # The finished launches, fastest to slowest.
                    ax.plot([x, x], [r["min_s"], r["max_s"]], color="black", linewidth=1, marker="_",
                            label="finished launches (min-max)")
                if r["timeouts"]:
                    ax.text(x, TIMEOUT_S, "X", ha="center", va="bottom", fontsize=12, fontweight="bold")
        if idle:
            ax.axhline(idle, color="black", linestyle=":", linewidth=1, label="idle disk" if h == hosts[0] else None)
            if h == max(hosts) and h > 0:
                # The targets, judged in this panel for the sequential guest workloads.
                ax.axhline(COORDINATED_X * idle, color="#4c72b0", linestyle="--", linewidth=1,
                           label=f"target ({h} host readers; {', '.join(TARGET_WORKLOADS)}): coordinated ≤ "
                                 f"{COORDINATED_X}× idle")
                ax.axhline(UNCOORDINATED_X * idle, color="#c44e52", linestyle="--", linewidth=1,
                           label=f"target ({h} host readers; {', '.join(TARGET_WORKLOADS)}): uncoordinated ≥ "
                                 f"{UNCOORDINATED_X}× idle")
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_title(f"{h} sequential reader(s) on the host")
        ax.set_xlabel("readers in the guest")
        ax.set_ylim(0, TIMEOUT_S * 1.12)
    axes[0][0].set_ylabel("start-up time (s)")
    handles, labels = [], []
    for ax in axes[0]:
        for hd, lb in zip(*ax.get_legend_handles_labels()):
            if lb not in labels:
                handles.append(hd)
                labels.append(lb)
    fig.legend(handles, labels, fontsize=8, loc="upper center", ncol=3, bbox_to_anchor=(0.5, 0.02))
    fig.suptitle("python3 cold start in the guest (120 modules from its virtio disk), slow emulated disk; bar: "
                 f"the mean, a timed-out launch (X) counted as {TIMEOUT_S} s")
    return fig


def main(quick, out=None, verbose=False, fresh=False, rows=None):
    """rows: a run's data.csv rows (stored(dir)), to render its plot and summary again without
    measuring (data.csv is left as measured)."""
    o = Output(NAME, quick, out, fresh)
    if rows is None:
        hosts, workloads, modes, launches = plan(quick)
        rows = measure(o, hosts, workloads, modes, launches, verbose)
        other = None
    else:
        hosts = sorted({r["host_readers"] for r in rows})
        workloads = [w for w in GUEST_WORKLOADS if any(r["guest_workload"] == w for r in rows)]
        modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
        # An earlier full run of the same grid kept beside it (first-run.csv): its figures go
        # beside this run's as the spread between runs.
        other = stored(o.dir, "first-run.csv") if (o.dir / "first-run.csv").exists() else None
    idle = idle_of(rows)
    stored_x = [r.get("x_idle") for r in rows]
    for r in rows:
        r["x_idle"] = cell_time(r) / idle if idle else None
    x_changed = o.rendered and any(a is not None and b is not None and abs(a - b) > 1e-9
                                   for a, b in zip(stored_x, (r["x_idle"] for r in rows)))
    if not o.rendered:
        o.csv(rows, COLUMNS)
    o.png(plot(o.dir, rows, hosts, workloads, modes, idle))
    o.summary(f"{NAME}: application start-up under guest and host readers",
              summary(rows, hosts, idle, quick, x_changed), targets=targets(rows, hosts, idle, other))
    return o.dir


def measure(o, hosts, workloads, modes, launches, verbose):
    slowdisk.require_bfq(NAME)
    guest_readers = max((int(w.split("r-")[0]) for w in workloads if w != "none"), default=0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="cosched-io-disk-", dir="/var/tmp") as work:
        size = 200 + max(hosts) * 120 + 160 + guest_readers * GUEST_READER_MB
        with slowdisk.SlowDisk(work, size_mb=size) as disk:
            t = time.monotonic()
            if max(hosts):
                disk.populate_readers(max(hosts))
            image = disk.data / "vm.img"
            build_image(disk, image, guest_readers)
            disk.slow()
            disk.set_scheduler("bfq")
            (disk.sysfs() / "queue/iosched/slice_idle").write_text(str(SLICE_IDLE_MS))
            log(f"{NAME}: slow disk {disk.loop} ready in {time.monotonic() - t:.0f} s")
            for h in hosts:
                for m in modes:
                    key = f"{m}/{h}"
                    point = o.point(key, lambda: {"rows": one_boot(disk, image, m, h, workloads, launches, verbose)})
                    rows.extend(point["rows"])
    return rows


def idle_of(rows):
    """The idle disk's start-up time (no readers, no coordination); quick mode has no idle point:
    the no-load launch of the first boot stands in."""
    idle_row = next((r for r in rows if r["mode"] == "none" and r["host_readers"] == 0
                     and r["guest_workload"] == "none"), None)
    if idle_row and not idle_row["timeouts"]:
        return idle_row["mean_s"]
    first = next((r for r in rows if r["guest_workload"] == "none" and r["mode"] == "none"), None)
    return first and cell_time(first)


def targets(rows, hosts, idle, other=None):
    """The summary's targets, judged from the rows; `other`: the rows of another full run of the
    same grid, whose figures go into the spread."""
    def get(rs, m, h, gw):
        return next((r for r in rs if r["mode"] == m and r["host_readers"] == h and r["guest_workload"] == gw), None)

    other_idle = idle_of(other) if other else None
    out = []
    idle_row = get(rows, "none", 0, "none")
    if idle_row and idle:
        out.append(target("idle disk: no readers, no coordination (what the ratios divide by)", f"{idle:.2f} s", None,
                          range_text(idle_row, None)
                          + (f"; the other full run (first-run.csv): {other_idle:.2f} s" if other_idle else "")))
    h = max(hosts)
    for gw in TARGET_WORKLOADS:
        for m in ("none", "ioprio", "weight"):
            r = get(rows, m, h, gw)
            if not (r and idle and h > 0):
                continue
            x = cell_time(r) / idle
            o = get(other, m, h, gw) if other else None
            spread = range_text(r, idle) + (f"; the other full run (first-run.csv): {x_text(o, other_idle)} idle"
                                            if o and other_idle else "")
            if m == "none":
                measured = (f"{launches_text(r, idle)}; mean ≥ {cell_time(r):.1f} s = {x_text(r, idle)} idle (a "
                            f"timed-out launch counted as {TIMEOUT_S} s)" if r["timeouts"] else
                            f"{cell_time(r):.2f} s = {x:.2f}× idle")
                out.append(target(f"{h} host readers, guest {gw}: uncoordinated ≥ {UNCOORDINATED_X}× idle (the "
                                  "set-up reproduces the problem)", measured, x >= UNCOORDINATED_X, spread))
            else:
                measured = f"{r['mean_s']:.2f} s = {x:.2f}× idle" if not r["timeouts"] else launches_text(r, idle)
                out.append(target(f"{h} host readers, guest {gw}: coordinated, {m} lever, ≤ {COORDINATED_X}× idle",
                                  measured, not r["timeouts"] and x <= COORDINATED_X, spread))
    loaded = [x for x in hosts if x > 0]
    levers = {m: lever_mean(rows, m, loaded) for m in ("ioprio", "weight")}
    if all(levers.values()):
        best = min(levers, key=levers.get)
        n = sum(1 for r in rows if r["mode"] == DEFAULT_LEVER and r["host_readers"] in loaded)
        # The other full run's figures where it has the lever's loaded cells (first-run.csv may lack some).
        theirs = {m: lever_mean(other, m, loaded, other_idle) if other_idle else None for m in levers}
        out.append(target(f"the default lever ({DEFAULT_LEVER}) wins: the lowest mean start-up (× idle) over the "
                          f"cells with host readers", f"ioprio {levers['ioprio']:.2f}×, weight {levers['weight']:.2f}× "
                          f"(mean of {n} cells each)", best == DEFAULT_LEVER,
                          ("the other full run: " + ", ".join(
                              f"{m} {x:.2f}×" if x is not None else f"{m} not measured there"
                              for m, x in theirs.items())) if other_idle else ""))
    out.append(target("Virtual-BFQ, Fig. 10/11, 5 host readers, guest 1r-seq (the paper's figures)",
                      f"BFQ {PAPER['bfq']} s = {PAPER['bfq'] / PAPER['idle']:.1f}× idle, V-BFQ {PAPER['vbfq']} s = "
                      f"{PAPER['vbfq'] / PAPER['idle']:.2f}×, idle {PAPER['idle']} s", None))
    return out


def lever_mean(rows, m, hosts, idle=None):
    """The mean of the cells' start-up (× idle) of mode `m` with host readers `hosts`."""
    idle = idle or idle_of(rows)
    xs = [cell_time(r) / idle for r in rows if r["mode"] == m and r["host_readers"] in hosts]
    return statistics.mean(xs) if xs and idle else None


def summary(rows, hosts, idle, quick, x_changed=False):
    loaded = [h for h in hosts if h > 0]
    lines = []
    if loaded and idle and lever_mean(rows, "none", loaded):
        # A quick run measures only some of the modes: say what it has.
        means = {m: lever_mean(rows, m, loaded) for m in ("ioprio", "weight")}
        levers = "".join(f"{v:.2f}× idle with the {m} lever, " for m, v in means.items() if v is not None)
        lines.append(f"Over every cell with host readers ({', '.join(map(str, loaded))}), the start-up is on average "
                     f"{levers or 'not measured with either lever, and '}"
                     f"{'≥ ' if any(r['timeouts'] for r in rows if r['mode'] == 'none' and r['host_readers'] in loaded) else ''}"
                     f"{lever_mean(rows, 'none', loaded):.2f}× uncoordinated.")
    shown = []
    for r in rows:
        ok = r["launches"] - r["timeouts"]
        mean = (r["mean_s"] if not r["timeouts"] else
                f"X: {r['timeouts']} of {r['launches']} > {TIMEOUT_S} s" + (f"; {ok} finished, mean {r['mean_s']:.1f}"
                                                                           if ok else ""))
        shown.append({**r, "mean_s": mean, "min_s": r["min_s"] if ok else "-", "max_s": r["max_s"] if ok else "-",
                      "x_idle": x_text(r, idle) if idle else "-"})
    table = md_table(shown, ["host_readers", "guest_workload", "mode", "launches", "mean_s", "min_s", "max_s",
                             "x_idle", "io_boosts"],
                     ["host readers", "guest", "mode", "launches", "mean s", "min s", "max s", "× idle", "IO boosts"])
    note = (" data.csv's x_idle column, as that run wrote it, counts a whole cell with a timeout as "
            f"{TIMEOUT_S} s; the table and the targets count each launch." if x_changed else "")
    return f"""Idle disk (no readers anywhere, no coordination): {idle and f"{idle:.2f} s" or "not measured"}.
{chr(10) + chr(10).join(lines) + chr(10) if lines else ""}
**The paper** (Virtual-BFQ, Fig. 10/11, 5 sequential readers on the host, 1 in the guest): BFQ
{PAPER['bfq']} s, V-BFQ {PAPER['vbfq']} s, idle {PAPER['idle']} s ({PAPER['vbfq'] / PAPER['idle']:.2f}× idle).

{table}

A launch over {TIMEOUT_S} s is a timeout; a cell stops at its first timeout (X in the plot), and
its mean counts each timed-out launch as {TIMEOUT_S} s, so that it is a lower bound (≥).{note} The
disk is emulated: see results/slowdisk for the model and its validation on the host alone.
Set-up: the VM's disk is `cache=none,aio={AIO}` (QEMU's main loop submits its I/O: one queue for
the host's BFQ), and the host's BFQ has `slice_idle` = {SLICE_IDLE_MS} ms instead of 8, because the
TCG guest's time between two requests is longer than 8 ms; calibration.md has the runs behind both
choices, including QEMU's default aio=threads, where raising the VM made its start-up slower.
"""
