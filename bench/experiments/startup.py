"""Experiment 3: application start-up time vs load (Coordinated Task Scheduling, Fig. 4 and Fig. 9), and the new-task
heuristic's candidates: the old watch count, the budget mode, and a forking guest's cost.

The application is the Python interpreter importing a fixed set of standard modules and printing
"ready": a real program with real file and page-cache activity, measured with hot caches (two
warm-up launches first) from fork() to the "ready" line (cosched-tools launch). Same grid of
host/guest hogs and the same QEMU policies as latency-vs-load; "no guest" is the same program on
the host.
"""

import statistics
import subprocess

import matplotlib.pyplot as plt

import harness
from experiments.common import POLICY_LABEL, Output, grid_curve_style, log, md_table

NAME = "startup"
APP = ["python3", "-c", f"{harness.STARTUP_IMPORTS}; print('ready')"]
POLICIES = ("none", "cosched", "static_rr")
# The new-task heuristic's budget mode (the agent's default), beside the old
# default, the count mode (8 switch-ins; its curves have no suffix).
BUDGET_MS = 300
BUDGET = (f"--watch-budget-ms {BUDGET_MS}", f", budget {BUDGET_MS} ms")
COUNT = "--watch-budget-ms 0"
# (QEMU policy, agent arguments, curve suffix) at every grid point.
VARIANTS = [("none", "", ""), ("cosched", COUNT, ""), ("cosched", *BUDGET), ("static_rr", "", "")]
# The forking guest: it starts a CPU-bound program every second; the operator's share.
FORK_SHARE_PERMILLE = 200
COLUMNS = ["curve", "policy", "total_hogs", "host_hogs", "guest_hogs", "launches", "mean_ms", "sd_ms",
           "p50_ms", "max_ms", "boosted_pct", "hog_cpu_s", "measure_s"]


def plan(quick):
    if quick:
        return [2], [1], 4
    return list(range(0, 7)), [0, 1, 2], 100


def app_cmdline():
    return " ".join(a if a.isidentifier() or a.startswith("-") else "\"" + a + "\"" for a in APP)


def body(launches):
    cmd = app_cmdline()
    return f"""cosched-tools launch 2 {cmd} >/dev/null
echo "COSCHED-MEASURE-START"
cosched-tools launch {launches} {cmd} >/tmp/launch.out
echo "COSCHED-MEASURE-END"
echo "COSCHED-LAUNCH-BEGIN"
cat /tmp/launch.out
echo "COSCHED-LAUNCH-END"
"""


def times_ms(lines):
    return [1000 * ready for ready, _ in harness.launches(lines)]


def host_times(total, launches):
    with harness.host_hogs(total):
        cmd = [str(harness.TOOLS), "launch", str(launches + 2), "/usr/bin/python3", *APP[1:]]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()
    return times_ms(out[2:])


def row(curve, policy, total, g, ts):
    return dict(curve=curve, policy=policy, total_hogs=total, host_hogs=total - g, guest_hogs=g, launches=len(ts),
                mean_ms=statistics.mean(ts), sd_ms=statistics.stdev(ts) if len(ts) > 1 else 0.0,
                p50_ms=statistics.median(ts), max_ms=max(ts))


def measure(o, quick, verbose=False):
    totals, guest_counts, launches = plan(quick)
    rows = []

    def vm_point(total, g, policy, agent_args="", curve=None):
        r = harness.run(body(launches), host_hogs_n=total - g, guest_hogs=g, policy=policy, agent_args=agent_args,
                        layers=[harness.PYTHON_LAYER], tools=True, verbose=verbose)
        out = row(curve or f"{g} guest wl", policy, total, g, times_ms(harness.block(r["console"], "LAUNCH")))
        if "boosted_share" in r:
            out["boosted_pct"] = 100 * r["boosted_share"]
        return out

    for total in totals:
        rows.append(o.point(f"{total} no guest", lambda: row("no guest", "", total, 0, host_times(total, launches))))
        log(f"total={total} no guest: {rows[-1]['mean_ms']:.1f} ms")
        for g in guest_counts:
            if g > total:
                continue
            for policy, args, suffix in VARIANTS:
                curve = f"{g} guest wl{suffix}"
                rows.append(o.point(f"{total} {g} {policy}{suffix}", lambda: vm_point(total, g, policy, args, curve)))
                log(f"total={total} {curve} {policy}: {rows[-1]['mean_ms']:.1f} ms (sd {rows[-1]['sd_ms']:.1f})")
    # The other candidates, at one loaded point: a larger budget, and the old heuristic with
    # more switch-ins.
    total, g, candidates = sensitivity(quick)
    for args, suffix in candidates:
        curve = f"{g} guest wl{suffix}"
        rows.append(o.point(f"{total} {g} cosched{suffix}", lambda: vm_point(total, g, "cosched", args, curve)))
        log(f"total={total} {curve}: {rows[-1]['mean_ms']:.1f} ms (sd {rows[-1]['sd_ms']:.1f})")
    rows += forking(o, quick, verbose)
    return rows


def sensitivity(quick):
    """(total hogs, guest hogs, [(agent arguments, curve suffix)]) of the candidates' comparison."""
    if quick:
        return 2, 1, []
    return 3, 1, [("--watch-budget-ms 1000", ", budget 1000 ms"), (f"{COUNT} --watch-count 256", ", --watch-count 256")]


def forking(o, quick, verbose=False):
    """A guest that starts a CPU-bound program every second, beside 2 host hogs: the CPU time the
    host hogs get, uncoordinated and under each heuristic, with the operator's boost share at
    FORK_SHARE_PERMILLE."""
    seconds = 3 if quick else 20
    body = f"""echo "COSCHED-MEASURE-START"
i=0; while [ $i -lt {seconds} ]; do timeout 1 sh -c 'while :; do :; done'; i=$((i+1)); done
echo "COSCHED-MEASURE-END"
"""
    config = f"[policy]\nmax_boost_share_permille = {FORK_SHARE_PERMILLE}\n"
    out = []
    variants = [("none", "", ""), ("cosched", *BUDGET)] if quick else VARIANTS[:3]
    for policy, args, suffix in variants:
        def one():
            r = harness.run(body, host_hogs_n=2, policy=policy, agent_args=args, daemon_config=config,
                            verbose=verbose)
            return dict(curve=f"forking guest{suffix}", policy=policy, total_hogs=2, host_hogs=2, guest_hogs=0,
                        hog_cpu_s=r["hog_cpu_s"], measure_s=r["measure_s"],
                        boosted_pct=100 * r["boosted_share"] if "boosted_share" in r else "")
        out.append(o.point(f"fork {policy}{suffix}", one))
        log(f"forking guest{suffix} {policy}: host hogs {out[-1]['hog_cpu_s']:.1f} CPU s in {out[-1]['measure_s']:.1f} s")
    return out


def plot(rows):
    fig, ax = plt.subplots(figsize=(9, 6))
    curves = {}
    for r in rows:
        if r["curve"].startswith("forking"):
            continue
        curves.setdefault((r["curve"], r["policy"]), []).append((r["total_hogs"], r["mean_ms"] / 1000, r["sd_ms"] / 1000))
    for (curve, policy), pts in sorted(curves.items()):
        pts.sort()
        style, label = grid_curve_style(curve, policy)
        if curve.endswith(BUDGET[1]):
            style.update(color="tab:purple", linestyle="--")
            label = f"{curve}, cosched (budget mode, the default)"
        elif policy == "cosched" and curve.endswith(" guest wl"):
            label += " (count 8, the old default)"
        elif "--watch-count" in curve or "budget" in curve:
            style.update(marker="*" if "256" in curve else "P", markersize=11, linestyle="none")
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], capsize=2, label=label,
                    **style)
    ax.set_xlabel("total number of CPU hogs (host + guest)")
    ax.set_ylabel("start-up time (s), mean ± sd")
    ax.set_title("Start-up time of python3 importing 7 standard modules (Coordinated Task Scheduling, Fig. 4 / Fig. 9)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return fig


def main(quick, out=None, verbose=False, fresh=False):
    o = Output(NAME, quick, out, fresh)
    rows = measure(o, quick, verbose)
    o.csv(rows, COLUMNS)
    o.png(plot(rows))
    def labelled(rs):
        return [dict(r, policy=POLICY_LABEL.get(r["policy"], "-")) for r in rs]

    hard = labelled(r for r in rows
                    if r["total_hogs"] == max(x["total_hogs"] for x in rows if x["guest_hogs"] == 1) and
                    (r["guest_hogs"] == 1 or r["curve"] == "no guest"))
    cols = ["curve", "policy", "host_hogs", "guest_hogs", "mean_ms", "sd_ms", "max_ms", "boosted_pct"]
    heads = ["curve", "QEMU threads", "host hogs", "guest hogs", "mean ms", "sd ms", "max ms",
             "VM boosted, % of the launches"]
    table = md_table(hard, cols, heads)
    st, sg, _ = sensitivity(quick)
    sens = labelled(r for r in rows if r["total_hogs"] == st and r["guest_hogs"] == sg)
    targets, fork = targets_table(rows)
    o.summary("Application start-up time vs load (Coordinated Task Scheduling, Fig. 4 and 9)", f"""
Start-up time of `{app_cmdline()}` (Python {'3.11'}, from fork() to its "ready" line, hot caches,
{plan(quick)[2]} launches per point), as the total number of CPU hogs grows, split between host and
guest, under no coordination, cosched with the old new-task heuristic (the count mode,
`{COUNT}`: 8 boosted switch-ins plus one per sleep), cosched with the budget mode
(`--watch-budget-ms {BUDGET_MS}`, the agent's default since this run: a new task keeps its VM
boosted for {BUDGET_MS} ms of its own run time plus 2 ms per wake-up from a sleep, at most 16 at
once) and static `SCHED_RR` 1. All points are in `data.csv`; `plot.png` shows mean ± standard
deviation. "VM boosted" is the daemon's boosted time within the measured window (from its start,
not from the VM's registration), over the window.

The most loaded point with 1 guest hog:

{table}

The candidates at {st - sg} host hog(s) and {sg} guest hog(s):

{md_table(sens, cols, heads)}

Targets for the budget mode against static `SCHED_RR` 1 and no coordination at each point:

{targets}

**A guest that starts a CPU-bound program every second** (a 1 s busy loop, again and again), beside
2 host hogs, with the operator's boost share at {FORK_SHARE_PERMILLE / 10:.0f}% (`max_boost_share_permille =
{FORK_SHARE_PERMILLE}`): the CPU time the host hogs got, and what they lost against no coordination.

{fork}

The run before (2026-11-24, with the budget mode's need kept only while the new task ran): 10 of
the 12 points with 2 or more host hogs met both targets; 3 + 2 hogs missed both (1.57× static,
0.71× none) and 5 + 1 missed the first (1.21×). Repeated 3 times each since (`startup-misses`,
with the need also kept while the task waits), 3 + 2 ranged 1.18-1.40× static across runs and
5 + 1 1.03-1.29×: one run per point does not settle a point that close to 1.2×.

The old heuristic's first full run (2026-11-21, 100 launches per point): cosched was slower than
uncoordinated at 13 of the 18 guest points (+1 to +24%), the VM boosted for 1-17% of the launches;
at 5 host hogs + 1 guest hog 3640 ms against 3146 uncoordinated and 721 static; at 2 host + 1 guest
hog, `--watch-count 256` gave 912 ms against 1432 with 8, 1257 uncoordinated and 898 static.

**The paper** (Coordinated Task Scheduling, Fig. 4 and 9, CFS, xterm, 100 launches per point): with a workload in
both host and guest, "the start-up time increases significantly" once the host holds more
workloads than CPUs; with coordination "the curves ... have a lower slope, and the difference with
the no guest curve is almost constant" (start-up times up to about 1 s on their axis).
""")
    return o.dir


def targets_table(rows):
    """The issue's targets per point, and the forking guest's table (markdown)."""
    by = {(r["curve"], r["policy"], r["total_hogs"], r["guest_hogs"]): r for r in rows}
    lines = ["| host + guest hogs | budget ms | static RR 1 ms | none ms | ≤ 1.2× static (≥ 2 host hogs) | "
             "≤ 0.7× none (≥ 2 host hogs), ≤ 1.05× none (no load) |", "|---|---|---|---|---|---|"]
    for (curve, policy, total, g), r in sorted(by.items(), key=lambda kv: (kv[0][2], kv[0][3])):
        if policy != "cosched" or curve != f"{g} guest wl{BUDGET[1]}":
            continue
        static = by.get((f"{g} guest wl", "static_rr", total, g), {}).get("mean_ms")
        none = by.get((f"{g} guest wl", "none", total, g), {}).get("mean_ms")
        if not static or not none:
            continue
        b = r["mean_ms"]
        host = total - g
        vs_static = ("met" if b <= 1.2 * static else "missed") if host >= 2 else "-"
        vs_none = ("met" if b <= 0.7 * none else "missed") if host >= 2 else \
            ("met" if b <= 1.05 * none else "missed") if total == 0 else "-"
        lines.append(f"| {total - g} + {g} | {b:.0f} | {static:.0f} | {none:.0f} | {vs_static} ({b / static:.2f}×) | "
                     f"{vs_none} ({b / none:.2f}×) |")
    fork = [r for r in rows if r["curve"].startswith("forking")]
    base = next((r for r in fork if r["policy"] == "none"), None)
    flines = ["| heuristic | host hogs' CPU s / s | lost against none | VM boosted | within the share |",
              "|---|---|---|---|---|"]
    for r in fork:
        rate = r["hog_cpu_s"] / r["measure_s"]
        lost = 1 - rate / (base["hog_cpu_s"] / base["measure_s"]) if base else 0.0
        name = "uncoordinated" if r["policy"] == "none" else r["curve"].replace("forking guest", "cosched") or "cosched"
        boosted = f"{r['boosted_pct']:.0f}%" if r.get("boosted_pct") != "" else "-"
        ok = "-" if r["policy"] == "none" else ("met" if lost <= FORK_SHARE_PERMILLE / 1000 else "missed")
        flines.append(f"| {name} | {rate:.2f} | {100 * lost:.0f}% | {boosted} | {ok} |")
    return "\n".join(lines), "\n".join(flines)
