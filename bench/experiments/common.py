"""What the experiments share: where results go, CSV/PNG/markdown writing, the setup line."""

import csv
import inspect
import json
import os
import platform
import re
import statistics
import time
from datetime import datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import evaluation  # noqa: E402
import harness  # noqa: E402
import manifest  # noqa: E402
from harness import REPO, accel, packaged_default, stats, parse_histogram  # noqa: E402,F401

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
    removed once the summary is written; --fresh discards it first. Each point keeps the commit
    and the dirty paths of the session that measured it: a manifest of points from sessions at
    several commits lists them all ("commits") and gives the oldest as "commit"."""

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
        self.resumed = []  # the points of earlier sessions that this run uses, in their order
        self.resumed_s = 0.0
        if fresh or quick:
            self.points_file.unlink(missing_ok=True)
        elif self.points_file.exists():
            for i, line in enumerate(self.points_file.read_text().splitlines()):
                try:
                    p = json.loads(line)
                    self.done[p["key"]] = dict(p, order=i)
                except (ValueError, KeyError):
                    continue  # a line cut by the interruption: that point is measured again
            self.resumed_s = sum(p.get("seconds", 0.0) for p in self.done.values())
            if self.done:
                log(f"{name}: resuming, {len(self.done)} points already measured in {self.points_file}")

    def point(self, key, measure):
        """The row for point `key`: from an interrupted earlier run if it finished there,
        otherwise measure() now (its row is recorded before it is returned)."""
        if key in self.done:
            if key not in {p["key"] for p in self.resumed}:
                self.resumed.append(self.done[key])
            return self.done[key]["row"]
        t = time.time()
        row = measure()
        # With the session's commit and dirty paths (its code, taken when it started): a run
        # resumed at another commit records both in its manifest.
        with open(self.points_file, "a") as f:
            f.write(json.dumps({"key": key, "row": row, "seconds": time.time() - t, "commit": self.run.commit,
                                "dirty_paths": self.run.dirty_paths}) + "\n")
        return row

    def minutes(self):
        return (time.time() - self.t0 + self.resumed_s) / 60

    def csv(self, rows, columns, name="data.csv"):
        """Writes rows to name (data.csv, or another file the run stores beside it) in the
        output directory."""
        with open(self.dir / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow(r)

    def png(self, fig):
        fig.savefig(self.dir / "plot.png", dpi=110, bbox_inches="tight")
        plt.close(fig)

    def when(self):
        """How long the run took and when, for the summary's first line. A rendering of stored rows
        says when they were measured (its manifest, or the summary it replaces) and that the
        summary was rendered again today."""
        today = time.strftime('%Y-%m-%d')
        if not self.rendered:
            return (f"took {self.minutes():.1f} min{' over several sessions' if self.resumed_s else ''} "
                    f"on {today}")
        m = manifest.read(self.dir) or {}
        measured = None
        if m.get("started") and m.get("ended"):
            t0, t1 = (datetime.fromisoformat(m[k].replace("Z", "+00:00")) for k in ("started", "ended"))
            measured = f"took {(t1 - t0).total_seconds() / 60:.1f} min on {m['started'][:10]}"
            if m.get("commit"):
                measured += f" at {m['commit'][:7]}"
        else:
            old = self.dir / "summary.md"
            found = re.search(r"took [^);]* on \d{4}-\d{2}-\d{2}(?: at [0-9a-f]+)?", old.read_text()) if old.exists() else None
            measured = found.group(0) if found else "measured earlier"
        return f"{measured}; this summary rendered again from its data.csv on {today}"

    def setup(self):
        """The summary's set-up line: this host's, or, for a rendering of stored rows, the one the
        measuring run wrote (the summary it replaces; failing that, its manifest's host), never
        the rendering host's, and without probing the accelerator again."""
        if not self.rendered:
            return setup_line()
        old = self.dir / "summary.md"
        lines = [l for l in old.read_text().splitlines() if l.startswith("Our setup:")] if old.exists() else []
        if lines:
            return lines[-1]
        m = manifest.read(self.dir) or {}
        accel, kernel = m.get("accel") or {}, (m.get("kernel") or {}).get("release") or "unknown"
        return (f"Our setup (from the run's manifest): {m.get('cpus') or '?'} CPUs, Linux {kernel}, accelerator "
                f"{accel.get('name') or 'unknown'} ({accel.get('reason') or 'reason not recorded'}).")

    def summary(self, title, body, targets=None):
        """summary.md: the title, the command, the targets table (targets: target() rows, judged
        from the data by the caller; bench/evaluation.py collects them into docs/evaluation.md),
        the body and the set-up."""
        text = (f"# {title}\n\n"
                f"Command: `sudo /usr/bin/python3 bench/experiment.py {self.name}{self.args}{' --quick' if self.quick else ''}`"
                f" ({'quick mode: too short to judge the effect' if self.quick else 'full run'}, "
                f"{self.when()}).\n\n"
                + (targets_md(targets) + "\n\n" if targets else "")
                + f"{body.strip()}\n\n{self.setup()}\n")
        (self.dir / "summary.md").write_text(text)
        self.points_file.unlink(missing_ok=True)
        self.manifest()

    def manifest(self):
        """manifest.json: what this run measured (or rendered again) and where."""
        # The earlier sessions of the points resumed from points.jsonl (a line written before points
        # kept their commit: unknown, None).
        sessions = [(p.get("commit"), p.get("dirty_paths")) for p in sorted(self.resumed, key=lambda p: p["order"])]
        return manifest.write(self.dir, self.run, name=self.dir_name, producer=self.producer, quick=self.quick,
                              accel=None if self.rendered else accel_text(), seeds=self.seeds,
                              rendered=self.rendered, sessions=sessions or None)


def target(statement, measured, met, spread=""):
    """One row of a summary's targets table: the target as stated, what this run measured (text,
    from its data), met True or False as the data judge it (None: a figure that has no target of
    its own, a bound, a reference, the paper's; evaluation.NOT_JUDGED: a target this run's data
    cannot judge), and the spread between repeats where there are repeats. bench/evaluation.py
    reads the table back (parse_targets) into docs/evaluation.md."""
    return {"target": statement, "measured": measured, "met": met, "spread": spread}


def targets_md(targets):
    """The targets table as a summary carries it."""
    out = [evaluation.TARGETS_HEADING, "", "| target | measured | spread between repeats | verdict |",
           "|---|---|---|---|"]
    for t in targets:
        cells = [str(t["target"]), str(t["measured"]), str(t["spread"] or "-"), evaluation.VERDICT[t["met"]]]
        out.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(out)


def number(v):
    """A CSV cell as the row had it: int, float, True / False, or the text ("" for none)."""
    if v in ("True", "False"):
        return v == "True"
    for t in (int, float):
        try:
            return t(v)
        except ValueError:
            pass
    return v


def read_csv(path, text=()):
    """The rows of a CSV file a run wrote, as its measure() returned them: each cell a number where
    it reads as one (number()), the columns in `text` kept as text."""
    with open(path) as f:
        return [{k: (v if k in text else number(v)) for k, v in r.items()} for r in csv.DictReader(f)]


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
