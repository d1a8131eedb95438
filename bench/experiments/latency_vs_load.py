"""Experiment 1: timer latency vs load (Coordinated Task Scheduling, Fig. 1 and Fig. 7).

The total number of CPU hogs runs from 0 to 6, split between the host and a 1-vCPU guest (0, 1
or 2 in the guest). cyclictest runs in the guest (or on the host: "no guest"), once as the paper
ran it (SCHED_OTHER, exercising the new/woken-task heuristic) and once at -p 80 (RT). Each guest
point is measured with the QEMU threads left alone, coordinated by cosched, and statically at
SCHED_RR 1. One boot measures a guest point's two cyclictest runs, one after the other
(SCHED_OTHER first), under the same hogs and policy.
"""

import matplotlib.pyplot as plt

import harness
from experiments.common import POLICY_LABEL, Output, grid_curve_style, log, md_table

NAME = "latency-vs-load"
CYCLICTEST = {"other": "-i 1000", "rt": "-p 80 -i 1000"}
CYCLICTEST_LABEL = {"other": "cyclictest (SCHED_OTHER, as in the paper)", "rt": "cyclictest -p 80 (RT)"}
POLICIES = ("none", "cosched", "static_rr")
COLUMNS = ["cyclictest", "curve", "policy", "total_hogs", "host_hogs", "guest_hogs",
           "avg_us", "p50_us", "p99_us", "max_us", "samples", "boosts"]


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
    axes[0][2].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle("Guest timer latency vs load (Coordinated Task Scheduling, Fig. 1 / Fig. 7)")
    return fig


def summarize(rows, quick):
    def pick(cm, total, g, policy):
        for r in rows:
            if (r["cyclictest"], r["total_hogs"], r["guest_hogs"], r["policy"]) == (cm, total, g, policy) \
                    and r["curve"] != "no guest":
                return r
        return None
    hardest = []
    for cm in CYCLICTEST:
        for policy in POLICIES:
            r = pick(cm, 3, 1, policy) or pick(cm, 2, 1, policy)
            if r:
                hardest.append(dict(cyclictest=cm, policy=POLICY_LABEL[policy], host_hogs=r["host_hogs"],
                                    guest_hogs=r["guest_hogs"], avg=r["avg_us"], p99=r["p99_us"], max=r["max_us"]))
    table = md_table(hardest, ["cyclictest", "policy", "host_hogs", "guest_hogs", "avg", "p99", "max"],
                     ["cyclictest", "QEMU threads", "host hogs", "guest hogs", "avg µs", "p99 µs", "max µs"])
    worst_cosched = max((r["avg_us"] for r in rows if r["policy"] == "cosched"), default=0)
    worst_none = max((r["avg_us"] for r in rows if r["policy"] == "none"), default=0)
    return f"""
Guest wake-up latency (cyclictest, {plan(quick)[2]} samples per point) as the total number of CPU
hogs grows from {plan(quick)[0][0]} to {plan(quick)[0][-1]}, split between host and guest. All points are in
`data.csv`; `plot.png` shows avg, p99 and max on a log scale, as the paper's figures do.

The paper's hardest case is 2 host hogs and 1 guest hog (3 total); the table shows the point
measured closest to it:

{table}

Across all points the worst cosched average is {worst_cosched} µs, against {worst_none} µs
uncoordinated.

**The papers** (Coordinated Task Scheduling, CFS, Fig. 7/8): with 2 host and 1 guest workloads the guest's average
latency was 1921 µs without and 87.5 µs with coordinated scheduling; with co-scheduling the
curves "are now almost completely horizontal". Their curves come from `cyclictest -q -n -l 100000
-h 5000`, i.e. SCHED_OTHER, 2 x 100 000 samples per point.
"""


def main(quick, out=None, verbose=False, fresh=False):
    o = Output(NAME, quick, out, fresh)
    rows = measure(o, quick, verbose)
    o.csv(rows, COLUMNS)
    o.png(plot(rows))
    o.summary("Latency vs load (Coordinated Task Scheduling, Fig. 1 and 7)", summarize(rows, quick))
    return o.dir
