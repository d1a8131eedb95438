"""Experiment startup-misses: the two points of the startup experiment where the budget mode missed
its targets (3 host + 2 guest hogs, 5 + 1; issue 33 sec. 5), measured REPEATS times each under
no coordination, static SCHED_RR 1 and cosched's budget mode, so that a point's spread across runs
is known before it is judged. Same program, guest, launches per run and agent arguments as
startup.py; the runs are interleaved (repeat by repeat, point by point, variant by variant).

Optional variant "before": the budget mode of another cosched binary (COSCHED_BIN_BEFORE, e.g. one
built from the commit before a change to the heuristic), measured the same way, interleaved with
the other variants; without COSCHED_BIN_BEFORE its runs already measured are kept.
STARTUP_MISSES_ONLY=VARIANT,... measures only those variants now and writes no summary: the
points stay in points.jsonl, and a later run without it measures the rest and writes the output.
STARTUP_MISSES_MAX=N stops after N runs measured now (the same way), so that a long measurement can
be taken in slices, each under its own hold of a shared measurement lock.
"""

import csv
import os
import statistics
from pathlib import Path

import matplotlib.pyplot as plt

import harness
import manifest
from experiments import startup
from evaluation import NOT_JUDGED
from experiments.common import RESULTS, STYLE, Output, log, md_table, read_csv, target

NAME = "startup-misses"
# binary: the file name of COSCHED_BIN_BEFORE for the "before" variant's runs.
COLUMNS = ["host_hogs", "guest_hogs", "variant", "repeat", "launches", "mean_ms", "sd_ms", "p50_ms", "max_ms",
           "boosted_pct", "binary"]
# (name, QEMU policy, agent arguments, label)
VARIANTS = [
    ("none", "none", "", "uncoordinated"),
    ("static_rr", "static_rr", "", "static SCHED_RR 1"),
    ("budget", "cosched", startup.BUDGET[0], f"cosched, budget {startup.BUDGET_MS} ms"),
    ("before", "cosched", startup.BUDGET[0],
     f"cosched, budget {startup.BUDGET_MS} ms, another commit's binary (before)"),
]
LABEL = {v[0]: v[3] for v in VARIANTS}
# The targets of the budget mode (startup.py), judged on the means of the repeats.
STATIC_TARGET, NONE_TARGET = startup.STATIC_TARGET, startup.NONE_TARGET
TICK = dict(none="none", static_rr="static RR 1", budget=f"budget {startup.BUDGET_MS} ms", before="before")


def plan(quick):
    """(points as (host hogs, guest hogs), repeats, launches per run)."""
    if quick:
        return [(2, 1)], 2, 4
    return [(3, 2), (5, 1)], 3, 100




def measure(o, quick, verbose=False):
    points, repeats, launches = plan(quick)
    only = [v for v in os.environ.get("STARTUP_MISSES_ONLY", "").split(",") if v]
    budget = int(os.environ.get("STARTUP_MISSES_MAX", "0"))
    before = os.environ.get("COSCHED_BIN_BEFORE")
    rows = []
    new = 0
    # Every variant interleaved: "before" with the three variants of the targets (the budget
    # mode's runs and its runs minutes apart, under the same drift of the shared host); without
    # COSCHED_BIN_BEFORE, only the runs of it already measured are kept (skipped below).
    order = [(rep, point, v) for rep in range(1, repeats + 1) for point in points for v in VARIANTS]
    for rep, (host, g), (name, policy, args, _) in order:
        key = f"{host}+{g} {name} r{rep}"
        if name == "before" and not before and key not in o.done:
            continue
        if key not in o.done and ((only and name not in only) or (budget and new >= budget)):
            only = only or ["(a slice)"]
            continue
        new += key not in o.done

        def one():
            saved = harness.COSCHED
            if name == "before":
                harness.COSCHED = Path(os.environ["COSCHED_BIN_BEFORE"]).resolve()
            try:
                r = harness.run(startup.body(launches), host_hogs_n=host, guest_hogs=g, policy=policy,
                                agent_args=args, layers=[harness.PYTHON_LAYER], tools=True, verbose=verbose)
            finally:
                harness.COSCHED = saved
            ts = startup.times_ms(harness.block(r["console"], "LAUNCH"))
            out = dict(host_hogs=host, guest_hogs=g, variant=name, repeat=rep, launches=len(ts),
                       mean_ms=statistics.mean(ts), sd_ms=statistics.stdev(ts) if len(ts) > 1 else 0.0,
                       p50_ms=statistics.median(ts), max_ms=max(ts), boosted_pct="",
                       binary=Path(os.environ["COSCHED_BIN_BEFORE"]).name if name == "before" else "")
            if "boosted_share" in r:
                out["boosted_pct"] = 100 * r["boosted_share"]
            return out

        rows.append(o.point(key, one))
        log(f"{key}: {rows[-1]['mean_ms']:.1f} ms (sd {rows[-1]['sd_ms']:.1f})")
    return rows, only


def spread(xs):
    """'mean ± sd (min-max)' of a few numbers."""
    m = statistics.mean(xs)
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return m, sd, f"{m:.2f} ± {sd:.2f} ({min(xs):.2f}-{max(xs):.2f})"


def committed_run():
    """The committed full startup run, in a few words: its date and commit (its manifest)."""
    m = manifest.read(RESULTS / "startup") or {}
    when = (m.get("started") or m.get("date") or "")[:10]
    commit = (m.get("commit") or "")[:7]
    return ", ".join(x for x in (when, f"at {commit}" if commit else "") if x) or "date unknown"


def committed(host, g):
    """The committed full startup run's means at this point (results/startup/data.csv), by variant."""
    path = RESULTS / "startup" / "data.csv"
    out = {}
    if not path.exists():
        return out
    with open(path) as f:
        for r in csv.DictReader(f):
            if int(r["host_hogs"]) != host or int(r["guest_hogs"]) != g:
                continue
            if r["curve"] == f"{g} guest wl" and r["policy"] in ("none", "static_rr"):
                out[r["policy"]] = float(r["mean_ms"])
            elif r["curve"] == f"{g} guest wl{startup.BUDGET[1]}":
                out["budget"] = float(r["mean_ms"])
    return out


def tables(rows, points):
    by = {}
    for r in rows:
        by.setdefault((r["host_hogs"], r["guest_hogs"], r["variant"]), []).append(r)
    names = [v[0] for v in VARIANTS if any(k[2] == v[0] for k in by)]
    per = []
    for host, g in points:
        c = committed(host, g)
        for name in names:
            rs = sorted(by.get((host, g, name), []), key=lambda r: r["repeat"])
            if not rs:
                continue
            means = [r["mean_ms"] for r in rs]
            m = statistics.mean(means)
            sd = statistics.stdev(means) if len(means) > 1 else 0.0
            boosted = [r["boosted_pct"] for r in rs if r["boosted_pct"] != ""]
            per.append(dict(point=f"{host} + {g}", variant=LABEL[name], n=len(rs), mean=m, sd=sd,
                            runs=", ".join(f"{x:.0f}" for x in means),
                            within=statistics.mean(r["sd_ms"] for r in rs),
                            boosted=f"{statistics.mean(boosted):.0f}" if boosted else "-",
                            full=f"{c[name]:.0f}" if name in c else "-"))
    lines = [f"| host + guest hogs | budget variant | ÷ static RR 1, per repeat: mean ± sd (min-max) | target ≤ {STATIC_TARGET}× "
             f"| ÷ none, per repeat | target ≤ {NONE_TARGET}× | ratio of the means (static, none) | `startup`'s committed run "
             f"(one run, {committed_run()}) |",
             "|---|---|---|---|---|---|---|---|"]
    for host, g in points:
        def means(name):
            return [r["mean_ms"] for r in sorted(by.get((host, g, name), []), key=lambda r: r["repeat"])]
        static, none = means("static_rr"), means("none")
        c = committed(host, g)
        old = (f"{c['budget'] / c['static_rr']:.2f}×, {c['budget'] / c['none']:.2f}×"
               if {"budget", "static_rr", "none"} <= c.keys() else "-")
        for name in ("budget", "before"):
            b = means(name)
            if not b or not static or not none:
                continue
            n_s, n_n = min(len(b), len(static)), min(len(b), len(none))
            rs_, _, s_text = spread([b[i] / static[i] for i in range(n_s)])
            rn_, _, n_text = spread([b[i] / none[i] for i in range(n_n)])
            rs_all = [b[i] / static[i] for i in range(n_s)]
            rn_all = [b[i] / none[i] for i in range(n_n)]
            ms = statistics.mean(b) / statistics.mean(static)
            mn = statistics.mean(b) / statistics.mean(none)
            lines.append(f"| {host} + {g} | {LABEL[name]} | {s_text} | {verdict(ms, rs_all, STATIC_TARGET)} | {n_text} | "
                         f"{verdict(mn, rn_all, NONE_TARGET)} | {ms:.2f}×, {mn:.2f}× | {old if name == 'budget' else '-'} |")
    return per, "\n".join(lines)


def verdict(of_means, per_repeat, target):
    """met / missed by the ratio of the means, and whether the per-repeat ratios straddle the target."""
    v = "met" if of_means <= target else "missed"
    if min(per_repeat) <= target < max(per_repeat):
        v += " (the repeats straddle it)"
    return v


def point_ratios(rows, host, g, name="budget"):
    """(budget ÷ static RR 1 by repeat, ÷ none by repeat, the means of budget, static, none) at a point."""
    def means(v):
        return [r["mean_ms"] for r in sorted(rows, key=lambda r: r["repeat"])
                if (r["host_hogs"], r["guest_hogs"], r["variant"]) == (host, g, v)]
    b, s, n = means(name), means("static_rr"), means("none")
    if not (b and s and n):
        return None
    return ([x / y for x, y in zip(b, s)], [x / y for x, y in zip(b, n)],
            statistics.mean(b), statistics.mean(s), statistics.mean(n))


def targets(rows, points):
    """The targets table: the budget mode at each point, by the ratio of the means, with the
    ratios repeat by repeat as the spread."""
    out = []
    for host, g in points:
        r = point_ratios(rows, host, g)
        for i, (limit, what) in enumerate(((STATIC_TARGET, "static SCHED_RR 1's"), (NONE_TARGET, "uncoordinated"))):
            statement = f"{host} host + {g} guest hogs: budget mode ≤ {limit}× {what} mean start-up"
            if not r:
                out.append(target(statement, "not measured in this run", NOT_JUDGED))
                continue
            per, mean_b, other = r[i], r[2], r[3 + i]
            x = mean_b / other
            m, sd, _ = spread(per)
            out.append(target(statement, f"{x:.2f}× ({mean_b:.0f} against {other:.0f} ms, the means of {len(per)} runs)",
                              x <= limit, f"{'/'.join(f'{v:.2f}' for v in per)} by repeat ({m:.2f} ± {sd:.2f})"))
    return out


def plot(rows, points):
    """Each run's mean start-up time (dots) and the mean ± sd across the runs, per point and variant;
    the targets the summary judges the budget mode's mean by (1.2x static's mean, 0.7x none's)."""
    fig, axes = plt.subplots(1, len(points), figsize=(5 * len(points), 5), squeeze=False)
    colour = dict(none=STYLE["none"]["color"], static_rr=STYLE["static_rr"]["color"],
                  budget=STYLE["cosched"]["color"], before="tab:purple")
    for ax, (host, g) in zip(axes[0], points):
        names = [v[0] for v in VARIANTS if any(r["variant"] == v[0] for r in rows)]
        for i, name in enumerate(names):
            ms = [r["mean_ms"] / 1000 for r in rows if (r["host_hogs"], r["guest_hogs"], r["variant"]) == (host, g, name)]
            ax.plot([i] * len(ms), ms, "o", color=colour[name], alpha=0.5)
            sd = statistics.stdev(ms) if len(ms) > 1 else 0.0
            ax.errorbar([i + 0.15], [statistics.mean(ms)], yerr=[sd], fmt="s", capsize=4, color=colour[name])
        r = point_ratios(rows, host, g)
        if r:
            ax.axhline(STATIC_TARGET * r[3] / 1000, color=colour["static_rr"], linestyle=":",
                       label=f"target for the budget mode's mean: ≤ {STATIC_TARGET}× static's")
            ax.axhline(NONE_TARGET * r[4] / 1000, color=colour["none"], linestyle=":",
                       label=f"target for the budget mode's mean: ≤ {NONE_TARGET}× none's")
            ax.legend(fontsize=7, loc="upper right")
        ax.set_xticks(range(len(names)), [TICK[n] for n in names], fontsize=8)
        ax.set_title(f"{host} host + {g} guest hogs", fontsize=10)
        ax.set_ylabel("start-up time (s): runs' means (dots), mean ± sd across runs")
        ax.set_ylim(bottom=0)
        ax.grid(True, axis="y", alpha=0.3)
    return fig


def stored(directory):
    """The rows of a run's data.csv (results/startup-misses), as measure() returned them."""
    return read_csv(Path(directory) / "data.csv", text=("variant",))


def main(quick, out=None, verbose=False, fresh=False, rows=None):
    """Measures, or (rows: stored() of an earlier run) renders summary and plot again from its data."""
    o = Output(NAME, quick, out, fresh)
    points, repeats, launches = plan(quick)
    if rows is None:
        rows, only = measure(o, quick, verbose)
    else:
        only = []
        points = sorted({(r["host_hogs"], r["guest_hogs"]) for r in rows}, key=lambda p: (p[0] + p[1], p))
        repeats = max(r["repeat"] for r in rows)
        launches = max(r["launches"] for r in rows)
    if only:
        log(f"{NAME}: measured {','.join(only)} only; run again (without STARTUP_MISSES_ONLY/_MAX) for the rest and the summary")
        return o.dir
    if not (o.rendered and (o.dir / "data.csv").exists()):  # a rendering keeps the data as measured
        o.csv(rows, COLUMNS)
    o.png(plot(rows, points))
    per, ratios = tables(rows, points)
    cols = ["point", "variant", "n", "mean", "sd", "runs", "within", "boosted", "full"]
    heads = ["host + guest hogs", "variant", "runs", "mean of the runs' means, ms", "sd across the runs, ms",
             "each run's mean, ms", "mean sd within a run, ms", startup.BOOSTED_HEAD,
             f"`startup`'s committed run (one run, {committed_run()}), ms"]
    before = any(r["variant"] == "before" for r in rows)
    binaries = sorted({r.get("binary") for r in rows if r["variant"] == "before" and r.get("binary")})
    binary = (f"this run: {', '.join(binaries)}, a copy of `target/release/cosched` built at an earlier commit"
              if binaries else "which binary is not recorded in this run's data.csv")
    o.summary("Start-up time at the startup experiment's two missed points, repeated", f"""
The two points where the budget mode missed its targets in an earlier full `startup` run:
{', '.join(f'{h} host + {g} guest hogs' for h, g in points)}. Each is measured {repeats} times
(separate boots, interleaved) under no coordination, static `SCHED_RR` 1 and cosched's budget mode
(`{startup.BUDGET[0]}`, the agent's default){', and the budget mode of an earlier binary' if before else ''};
{launches} launches of `{startup.app_cmdline()}` per run, hot caches, from fork() to its "ready"
line, as in `startup`. All runs are in `data.csv`; `plot.png` shows each run's mean and the
mean ± sd across the runs. The machine is shared: other work outside the measurement lock
(builds) loads it at times, and the runs of one repeat are minutes apart, which is why the
ratios are taken repeat by repeat and their spread is shown.
{'''
"Before" is the budget mode of `COSCHED_BIN_BEFORE` (''' + binary + '''): the agent and daemon of
another commit, measured the same way and interleaved with this run's commit's (the manifest's);
`git log` between the two says what differs.
''' if before else ''}
{md_table(per, cols, heads)}

The targets (budget mode ≤ {STATIC_TARGET}× static RR 1 and ≤ {NONE_TARGET}× none), as ratios of each repeat's budget
run to the same repeat's static and none runs (mean ± sd (min-max) over the repeats), the ratio of
the means (the verdict), and the committed `startup` run's single-run ratios at the same point:

{ratios}

**The paper** (Coordinated Task Scheduling, Fig. 4 and 9, CFS, xterm, 100 launches per point): with a
workload in both host and guest, "the start-up time increases significantly" once the host holds
more workloads than CPUs; with coordination "the curves ... have a lower slope, and the difference
with the no guest curve is almost constant" (start-up times up to about 1 s on their axis). It
reports one run per point, no spread across runs.
""", targets=targets(rows, points))
    return o.dir
