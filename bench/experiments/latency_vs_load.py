"""Experiment 1: timer latency vs load (Coordinated Task Scheduling, Fig. 1 and Fig. 7).

The total number of CPU hogs runs from 0 to 6, split between the host and a 1-vCPU guest (0, 1
or 2 in the guest). cyclictest runs in the guest (or on the host: "no guest"), once as the paper
ran it (SCHED_OTHER, exercising the new/woken-task heuristic) and once at -p 80 (RT). Each guest
point is measured with the QEMU threads left alone, coordinated by cosched, and statically at
SCHED_RR 1. One boot measures a guest point's two cyclictest runs, one after the other
(SCHED_OTHER first), under the same hogs and policy.
"""

from pathlib import Path

import matplotlib.pyplot as plt

import harness
from evaluation import NOT_JUDGED
from experiments.common import POLICY_LABEL, Output, grid_curve_style, log, md_table, read_csv, target

NAME = "latency-vs-load"
CYCLICTEST = {"other": "-i 1000", "rt": "-p 80 -i 1000"}
CYCLICTEST_LABEL = {"other": "cyclictest (SCHED_OTHER, as in the paper)", "rt": "cyclictest -p 80 (RT)"}
POLICIES = ("none", "cosched", "static_rr")
COLUMNS = ["cyclictest", "curve", "policy", "total_hogs", "host_hogs", "guest_hogs",
           "avg_us", "p50_us", "p99_us", "max_us", "samples", "boosts"]
# The benchmark's targets (bench/cosched_bench.py, docs/evaluation.md), judged here on the same
# scenarios: the guest runs 1 CPU hog and cyclictest -p 80 -i 1000; "idle" is that guest on an idle
# host, uncoordinated; the others add 2 host hogs.
AVG_TARGET, P99_TARGET, UNCOORD_TARGET = 1.15, 2.0, 5.0
# The RT throttle stops a VM at SCHED_RR for ~50 ms (of every second, by default); a maximum this
# long is counted as a throttle's stall where the summary counts them.
THROTTLE_US = 40_000
# The paper (Coordinated Task Scheduling, Fig. 7/8, CFS, SCHED_OTHER cyclictest, 2 host + 1 guest workloads).
PAPER_AVG_US = {"none": 1921, "cosched": 87.5}


def plan(quick):
    """(totals, guest hog counts, loops per point)."""
    if quick:
        return [0, 2], [1], 400
    return list(range(0, 7)), [0, 1, 2], 5000


def measure(o, quick, verbose=False):
    totals, guest_counts, loops = plan(quick)
    rows = []

    def host_point(cm, args, total):
        s = harness.host_cyclictest(total, args, loops)
        return dict(cyclictest=cm, curve="no guest", policy="", total_hogs=total, host_hogs=total, guest_hogs=0,
                    avg_us=s["avg"], p50_us=s["p50"], p99_us=s["p99"], max_us=s["max"], samples=s["n"])

    def vm_point(total, g, policy):
        """One boot: both cyclictest runs, {cyclictest: row}."""
        body = "".join(harness.cyclictest_body(args, loops, cm) for cm, args in CYCLICTEST.items())
        r = harness.run(body, host_hogs_n=total - g, guest_hogs=g, policy=policy, verbose=verbose)
        out = {}
        for cm in CYCLICTEST:
            s = harness.stats(*harness.parse_histogram(r["console"], cm))
            out[cm] = dict(cyclictest=cm, curve=f"{g} guest wl", policy=policy, total_hogs=total,
                           host_hogs=total - g, guest_hogs=g, avg_us=s["avg"], p50_us=s["p50"], p99_us=s["p99"],
                           max_us=s["max"], samples=s["n"],
                           boosts=r["windows"][cm].get("daemon", {}).get("boosts", ""))
        return out

    for total in totals:
        for cm, args in CYCLICTEST.items():
            rows.append(o.point(f"{cm} {total} no guest", lambda: host_point(cm, args, total)))
            s = rows[-1]
            log(f"{cm} total={total} no guest: avg {s['avg_us']} p99 {s['p99_us']} max {s['max_us']}")
        for g in guest_counts:
            if g > total:
                continue
            for policy in POLICIES:
                both = o.point(f"{total} {g} {policy}", lambda: vm_point(total, g, policy))
                for cm in CYCLICTEST:
                    rows.append(s := both[cm])
                    log(f"{cm} total={total} {g} guest wl {policy}: avg {s['avg_us']} p99 {s['p99_us']} "
                        f"max {s['max_us']}")
    # data.csv as before: every SCHED_OTHER row, then every -p 80 one.
    rows.sort(key=lambda r: list(CYCLICTEST).index(r["cyclictest"]))
    return rows


def pick(rows, cm, total, g, policy):
    """The guest point (cyclictest mode, total hogs, guest hogs, QEMU policy), or None."""
    for r in rows:
        if (r["cyclictest"], r["total_hogs"], r["guest_hogs"], r["policy"]) == (cm, total, g, policy) \
                and r["curve"] != "no guest":
            return r
    return None


def scenarios(rows, cm="rt"):
    """The benchmark's scenarios in this run's grid: {"idle", "none", "cosched", "static_rr"} -> row
    (or None): 1 guest hog; idle: no host hog, uncoordinated; the others at the point with 1 guest
    hog measured closest to the paper's hardest (2 host hogs + 1 guest hog)."""
    total = 3 if pick(rows, cm, 3, 1, "cosched") else 2
    out = {p: pick(rows, cm, total, 1, p) for p in POLICIES}
    out["idle"] = pick(rows, cm, 1, 1, "none")
    return out


def targets(rows):
    """The targets table: the benchmark's four targets on its scenarios (cyclictest -p 80), and
    the paper's figures (no target of ours)."""
    sc = scenarios(rows, "rt")
    idle, unc, coord, static = sc["idle"], sc["none"], sc["cosched"], sc["static_rr"]
    host = f"{coord['host_hogs']} host hog{'s' if coord['host_hogs'] != 1 else ''}" if coord else "2 host hogs"
    where = f"cyclictest -p 80 beside 1 guest hog; {host}"
    once = "one run (the benchmark repeats it)"
    out = []

    def ratio(statement, a, b, key, limit, ok):
        if not (a and b):
            out.append(target(statement, "not measured in this run", NOT_JUDGED))
            return
        x = a[key] / b[key]
        out.append(target(statement, f"{x:.2f}× ({a[key]:.0f} against {b[key]:.0f} µs)", ok(x, limit), once))

    ratio(f"cosched's average ≤ {AVG_TARGET}× the idle host's ({where}; idle: no host hog)", coord, idle, "avg_us",
          AVG_TARGET, lambda x, t: x <= t)
    ratio(f"cosched's p99 ≤ {P99_TARGET:g}× the idle host's ({where})", coord, idle, "p99_us", P99_TARGET,
          lambda x, t: x <= t)
    ratio(f"uncoordinated average ≥ {UNCOORD_TARGET:g}× cosched's ({where})", unc, coord, "avg_us", UNCOORD_TARGET,
          lambda x, t: x >= t)
    if coord and static:
        out.append(target(f"cosched's maximum below static SCHED_RR 1's ({where})",
                          f"{coord['max_us']:.0f} against {static['max_us']:.0f} µs",
                          coord["max_us"] < static["max_us"], once))
    else:
        out.append(target(f"cosched's maximum below static SCHED_RR 1's ({where})", "not measured in this run",
                          NOT_JUDGED))
    # The target above is the benchmark's (bench/cosched_bench.py), kept as it states it; but static
    # SCHED_RR 1's maximum can be the kernel's RT throttle, which no coordination stays below too:
    # the uncoordinated maximum beside it shows how much the verdict says.
    if coord and unc:
        where_unc = "below" if coord["max_us"] < unc["max_us"] else "not below"
        out.append(target(f"for reference, beside the target above: the uncoordinated maximum ({where}; a verdict "
                          "against static SCHED_RR 1 says little where no coordination stays below it too)",
                          f"uncoordinated {unc['max_us']:.0f} µs"
                          + (f", static SCHED_RR 1 {static['max_us']:.0f} µs" if static else "")
                          + f"; cosched's {coord['max_us']:.0f} µs is {where_unc} the uncoordinated maximum", None, once))
    other = scenarios(rows, "other")
    if other["none"] and other["cosched"]:
        u, c = other["none"]["avg_us"], other["cosched"]["avg_us"]
        measured = f"SCHED_OTHER here: {u:.0f} → {c:.0f} µs ({u / c:.1f}×)"
    else:
        measured = "not measured in this run"
    out.append(target(f"the paper (SCHED_OTHER cyclictest, 2 host + 1 guest workloads): average "
                      f"{PAPER_AVG_US['none']:g} µs uncoordinated, {PAPER_AVG_US['cosched']:g} µs coordinated "
                      f"({PAPER_AVG_US['none'] / PAPER_AVG_US['cosched']:.0f}×)", measured, None))
    spans = []
    for policy in ("cosched", "none"):
        for cm in CYCLICTEST:
            xs = [r["avg_us"] for r in guest_rows(rows, cm) if r["policy"] == policy]
            if xs:
                spans.append(f"{POLICY_LABEL[policy]} {'SCHED_OTHER' if cm == 'other' else '-p 80'} "
                             f"{min(xs):.0f}-{max(xs):.0f} µs")
    out.append(target('the paper: with co-scheduling the curves "are now almost completely horizontal"',
                      "averages over the guest points: " + ", ".join(spans), None))
    return out


def guest_rows(rows, cm):
    return [r for r in rows if r["cyclictest"] == cm and r["curve"] != "no guest"]


def plot(rows):
    fig, axes = plt.subplots(2, 3, figsize=(16, 9), sharex=True)
    for i, cm in enumerate(CYCLICTEST):
        for j, (metric, label) in enumerate([("avg_us", "average"), ("p99_us", "99th percentile"),
                                             ("max_us", "maximum")]):
            ax = axes[i][j]
            curves = {}
            for r in rows:
                if r["cyclictest"] != cm:
                    continue
                key = (r["curve"], r["policy"])
                curves.setdefault(key, []).append((r["total_hogs"], r[metric]))
            for (curve, policy), pts in sorted(curves.items()):
                pts.sort()
                style, name = grid_curve_style(curve, policy)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, **style)
            ax.set_yscale("log")
            ax.set_title(f"{CYCLICTEST_LABEL[cm]}: {label}", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            if i == 1:
                ax.set_xlabel("total number of CPU hogs (host + guest)")
            if j == 0:
                ax.set_ylabel("wake-up latency (µs, log)")
    # The targets the summary judges, at the point they are judged (cyclictest -p 80, 1 guest hog):
    # where cosched's point there must lie.
    sc = scenarios(rows, "rt")
    idle, unc, coord, static = sc["idle"], sc["none"], sc["cosched"], sc["static_rr"]
    if coord:
        x = coord["total_hogs"]
        seg = dict(xmin=x - 0.45, xmax=x + 0.45, linewidth=3)
        ax_avg, ax_p99, ax_max = axes[1]
        if idle:
            ax_avg.hlines(AVG_TARGET * idle["avg_us"], colors="black", linestyles=":",
                          label=f"target for cosched, 1 guest hog: ≤ {AVG_TARGET}× idle avg", **seg)
            ax_p99.hlines(P99_TARGET * idle["p99_us"], colors="black", linestyles=":",
                          label=f"target for cosched, 1 guest hog: ≤ {P99_TARGET:g}× idle p99", **seg)
        if unc:
            ax_avg.hlines(unc["avg_us"] / UNCOORD_TARGET, colors="tab:red", linestyles=":",
                          label=f"target for cosched, 1 guest hog: ≤ uncoordinated avg / {UNCOORD_TARGET:g}", **seg)
        if static:
            ax_max.hlines(static["max_us"], colors="tab:blue", linestyles=":",
                          label="target for cosched, 1 guest hog: below static SCHED_RR 1's max", **seg)
        for ax, where in ((ax_avg, "upper left"), (ax_p99, "upper left"), (ax_max, "lower right")):
            ax.scatter([x], [coord[{ax_avg: "avg_us", ax_p99: "p99_us", ax_max: "max_us"}[ax]]], s=160,
                       facecolors="none", edgecolors="black", zorder=5, label="target: judged here (cosched)")
            ax.legend(handles=[h for h, lab in zip(*ax.get_legend_handles_labels()) if lab.startswith("target")],
                      fontsize=7, loc=where)
    axes[0][2].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle("Guest timer latency vs load (Coordinated Task Scheduling, Fig. 1 / Fig. 7)")
    return fig


def maxima(rows):
    """The maxima by QEMU policy and guest hogs over the grid's totals, per cyclictest mode: a
    table (markdown) and the count of guest points per mode."""
    lines = ["| QEMU threads | guest hogs | " + " | ".join(
        f"{'SCHED_OTHER' if cm == 'other' else '-p 80'}: max, ms (lowest-highest) | points ≥ {THROTTLE_US / 1000:.0f} ms"
        for cm in CYCLICTEST) + " |", "|---|---|" + "---|---|" * len(CYCLICTEST)]
    for policy in POLICIES:
        for g in sorted({r["guest_hogs"] for r in rows if r["curve"] != "no guest"}):
            cells = []
            for cm in CYCLICTEST:
                xs = sorted(r["max_us"] for r in guest_rows(rows, cm) if r["policy"] == policy and r["guest_hogs"] == g)
                if not xs:
                    cells += ["-", "-"]
                    continue
                cells += [f"{xs[0] / 1000:.1f}-{xs[-1] / 1000:.1f}",
                          f"{sum(x >= THROTTLE_US for x in xs)} of {len(xs)}"]
            lines.append(f"| {POLICY_LABEL[policy]} | {g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summarize(rows, quick):
    hardest = []
    for cm in CYCLICTEST:
        sc = scenarios(rows, cm)
        for policy in POLICIES:
            r = sc[policy]
            if r:
                hardest.append(dict(cyclictest=cm, policy=POLICY_LABEL[policy], host_hogs=r["host_hogs"],
                                    guest_hogs=r["guest_hogs"], avg=r["avg_us"], p99=r["p99_us"], max=r["max_us"]))
    table = md_table(hardest, ["cyclictest", "policy", "host_hogs", "guest_hogs", "avg", "p99", "max"],
                     ["cyclictest", "QEMU threads", "host hogs", "guest hogs", "avg µs", "p99 µs", "max µs"])
    worst_cosched = max((r["avg_us"] for r in rows if r["policy"] == "cosched"), default=0)
    worst_none = max((r["avg_us"] for r in rows if r["policy"] == "none"), default=0)
    totals = sorted({r["total_hogs"] for r in rows})
    samples = sorted({r["samples"] for r in rows})
    per_mode = {cm: len({(r["total_hogs"], r["guest_hogs"]) for r in guest_rows(rows, cm)}) for cm in CYCLICTEST}
    hosts = len({r["total_hogs"] for r in rows if r["curve"] == "no guest" and r["cyclictest"] == "other"})
    cos = [r["max_us"] for r in rows if r["policy"] == "cosched"]
    static = [r["max_us"] for r in rows if r["policy"] == "static_rr"]
    return f"""
Guest wake-up latency (cyclictest, {samples[0]}-{samples[-1]} samples per point) as the total number of CPU
hogs grows from {totals[0]} to {totals[-1]}, split between host and guest:
{" and ".join(f"{n} guest points with {'SCHED_OTHER' if cm == 'other' else '-p 80'} cyclictest" for cm, n in per_mode.items())},
each under the {len(POLICIES)} QEMU policies, and {hosts} "no guest" points per mode (cyclictest on the host). All
points are in `data.csv`; `plot.png` shows avg, p99 and max on a log scale, as the paper's figures
do, and the benchmark's targets at the point where the table above judges them.

The paper's hardest case is 2 host hogs and 1 guest hog (3 total); the table shows the point
measured closest to it:

{table}

Across all points the worst cosched average is {worst_cosched} µs, against {worst_none} µs
uncoordinated.

**The maxima** by QEMU policy and guest hogs, over the totals measured. The kernel's RT throttle
(by default RT threads get at most 950 ms of every second) stops a VM at an RT policy for about
50 ms at a time, so a maximum of {THROTTLE_US / 1000:.0f} ms or more under static `SCHED_RR` 1 is
likely the throttle; the data do not say which stall a maximum was. Cosched's maxima range from {min(cos) / 1000:.1f} to {max(cos) / 1000:.1f} ms, static `SCHED_RR` 1's
from {min(static) / 1000:.1f} to {max(static) / 1000:.1f} ms:

{maxima(rows)}

**The papers** (Coordinated Task Scheduling, CFS, Fig. 7/8): with 2 host and 1 guest workloads the guest's average
latency was {PAPER_AVG_US['none']:g} µs without and {PAPER_AVG_US['cosched']:g} µs with coordinated scheduling; with co-scheduling the
curves "are now almost completely horizontal". Their curves come from `cyclictest -q -n -l 100000
-h 5000`, i.e. SCHED_OTHER, 2 x 100 000 samples per point.
"""


def stored(directory):
    """The rows of a run's data.csv (results/latency-vs-load), as measure() returned them."""
    return read_csv(Path(directory) / "data.csv", text=("cyclictest", "curve", "policy"))


def main(quick, out=None, verbose=False, fresh=False, rows=None):
    """Measures, or (rows: stored() of an earlier run) renders summary and plot again from its data."""
    o = Output(NAME, quick, out, fresh)
    if rows is None:
        rows = measure(o, quick, verbose)
    if not (o.rendered and (o.dir / "data.csv").exists()):  # a rendering keeps the data as measured
        o.csv(rows, COLUMNS)
    o.png(plot(rows))
    o.summary("Latency vs load (Coordinated Task Scheduling, Fig. 1 and 7)", summarize(rows, quick),
              targets=targets(rows))
    return o.dir
