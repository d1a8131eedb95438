"""What the experiments share: where results go, CSV/PNG/markdown writing, the setup line."""

import csv
import inspect
import json
import os
import platform
import re
import statistics
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import harness  # noqa: E402
import manifest  # noqa: E402
from harness import REPO, accel, stats, parse_histogram  # noqa: E402,F401

RESULTS = REPO / "results"
QUICK_RESULTS = REPO / "build/results-quick"

# How each curve is drawn, the same in every plot.
STYLE = {
    "no guest": dict(color="black", marker="o", linestyle="-"),
    "none": dict(color="tab:red", marker="s", linestyle="-"),
    "cosched": dict(color="tab:green", marker="^", linestyle="-"),
    "static_rr": dict(color="tab:blue", marker="v", linestyle="--"),
    "static_fifo": dict(color="tab:blue", marker="v", linestyle="--"),
    "shield": dict(color="tab:purple", marker="D", linestyle=":"),
}
POLICY_LABEL = {
    "none": "uncoordinated",
    "cosched": "cosched",
    "static_rr": "static SCHED_RR 1",
    "static_fifo": "static FIFO 97/98",
    "shield": "shielding",
}


def grid_curve_style(curve, policy):
    """How a curve of the host/guest load grid (latency-vs-load, startup) is drawn, and its
    legend label: colour by QEMU policy, guest hog count by line width and marker fill."""
    style = dict(STYLE["no guest" if curve == "no guest" else policy])
    g = 0 if curve == "no guest" else int(curve.split()[0])
    style["linewidth"] = 1 + g * 0.6
    style["markerfacecolor"] = "none" if g == 0 and curve != "no guest" else style["color"]
    label = curve if curve == "no guest" else f"{curve}, {POLICY_LABEL[policy]}"
    return style, label


def accel_text():
    """(name, reason) of the accelerator for a summary: the reason without what changes from one
    run to the next (the probe's boot time, whether the verdict was cached)."""
    try:
        name, reason = accel()
    except RuntimeError as e:
        return "unknown", str(e)
    reason = re.sub(r" \(cached\)$", "", reason)
    reason = re.sub(r" to its workload in [0-9.]+ s", "", reason)
    return name.upper(), reason


def setup_line():
    name, reason = accel_text()
    return (f"Our setup: {os.cpu_count()} x86 cores ({platform.processor() or platform.machine()}, "
            f"Linux {platform.release()}, a shared VM), a 1-vCPU {name} guest running Debian's "
            f"Linux 6.1, QEMU 7.2 (accelerator: {reason}; {harness.boot_text()}); the papers used a 2-core Cortex-A15 (Samsung Chromebook) with "
            "KVM/ARM and Linux 3.17 (Coordinated Task Scheduling), Xen (FEAS) or a Core i5 with KVM (Performance Tuning).")


class Output:
    """One experiment's output directory: data.csv, plot.png, summary.md, and manifest.json
    (bench/manifest.py: the commit at the start of the run, the host, the command; written with
    the summary).

    A full run that takes hours keeps each finished point in points.jsonl (see point()): run the
    same command again after an interruption and it measures only the missing points. The file is
    removed once the summary is written; --fresh discards it first."""

    def __init__(self, name, quick, out=None, fresh=False, args="", dir_name=None, seeds=None, rendered=None):
        """args: the command's options after the name; dir_name: results/<dir_name> instead of
        results/<name>. seeds: the run's random seeds for the manifest, {name: value} (or set
        self.seeds before summary()); none declared: null. rendered: this run renders stored rows
        again instead of measuring them (the manifest keeps the measurement's commit and adds
        rendered_commit); by default, whether the caller (an experiment's main()) was given
        rows=... ."""
        self.run = manifest.Run()  # the commit and the tree as this run starts
        caller = inspect.currentframe().f_back
        self.rendered = caller.f_locals.get("rows") is not None if rendered is None else rendered
        try:
            self.producer = str(Path(caller.f_code.co_filename).resolve().relative_to(REPO))
        except ValueError:
            self.producer = caller.f_code.co_filename
        self.seeds = seeds
        self.name = name
        self.quick = quick
        self.args = args
        self.dir = Path(out) if out else (QUICK_RESULTS if quick else RESULTS) / (dir_name or name)
        self.dir_name = dir_name or name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time()
        self.points_file = self.dir / "points.jsonl"
        self.done = {}
        self.resumed_s = 0.0
        if fresh or quick:
            self.points_file.unlink(missing_ok=True)
        elif self.points_file.exists():
            for line in self.points_file.read_text().splitlines():
                try:
                    p = json.loads(line)
                    self.done[p["key"]] = p
                except (ValueError, KeyError):
                    continue  # a line cut by the interruption: that point is measured again
            self.resumed_s = sum(p.get("seconds", 0.0) for p in self.done.values())
            if self.done:
                log(f"{name}: resuming, {len(self.done)} points already measured in {self.points_file}")

    def point(self, key, measure):
        """The row for point `key`: from an interrupted earlier run if it finished there,
        otherwise measure() now (its row is recorded before it is returned)."""
        if key in self.done:
            return self.done[key]["row"]
        t = time.time()
        row = measure()
        with open(self.points_file, "a") as f:
            f.write(json.dumps({"key": key, "row": row, "seconds": time.time() - t}) + "\n")
        return row

    def minutes(self):
        return (time.time() - self.t0 + self.resumed_s) / 60

    def csv(self, rows, columns):
        with open(self.dir / "data.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow(r)

    def png(self, fig):
        fig.savefig(self.dir / "plot.png", dpi=110, bbox_inches="tight")
        plt.close(fig)

    def summary(self, title, body):
        took = self.minutes()
        text = (f"# {title}\n\n"
                f"Command: `sudo /usr/bin/python3 bench/experiment.py {self.name}{self.args}{' --quick' if self.quick else ''}`"
                f" ({'quick mode: too short to judge the effect' if self.quick else 'full run'}, "
                f"took {took:.1f} min{' over several sessions' if self.resumed_s else ''} on {time.strftime('%Y-%m-%d')}).\n\n"
                f"{body.strip()}\n\n{setup_line()}\n")
        (self.dir / "summary.md").write_text(text)
        self.points_file.unlink(missing_ok=True)
        self.manifest()

    def manifest(self):
        """manifest.json: what this run measured (or rendered again) and where."""
        return manifest.write(self.dir, self.run, name=self.dir_name, producer=self.producer, quick=self.quick,
                              accel=accel_text(), seeds=self.seeds, rendered=self.rendered)


def md_table(rows, columns, headers=None):
    headers = headers or columns
    assert len(headers) == len(columns), f"{len(headers)} headers for {len(columns)} columns"
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        out.append("| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |")
    return "\n".join(out)


def fmt(v):
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def mean_sd(xs):
    xs = list(xs)
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)
