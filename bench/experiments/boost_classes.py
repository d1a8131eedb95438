"""Experiment 7: which scheduling class should a boost use?

At latency-vs-load's hardest point (2 host hogs, 1 guest hog, cyclictest -p 80 in the guest) we
compare the boost classes `cosched host` offers: SCHED_RR 1 (the Coordinated Task Scheduling paper's, the default),
SCHED_FIFO 1, SCHED_DEADLINE for the vCPU (900 µs every 1 ms, the other threads FIFO), and
nice -20 (no real-time class at all). Besides the guest's latency we measure host fairness: the
CPU time the two host hogs got meanwhile, against what they got with no coordination.
"""

import statistics
from pathlib import Path

import matplotlib.pyplot as plt

import harness
from evaluation import NOT_JUDGED
from experiments.common import Output, log, md_table, read_csv, target

NAME = "boost-classes"
CLASSES = ("rr", "fifo", "deadline", "nice")
LABEL = {"none": "uncoordinated", "rr": "SCHED_RR 1 (default)", "fifo": "SCHED_FIFO 1",
         "deadline": "SCHED_DEADLINE 900/1000 µs", "nice": "nice -20"}
# warnings: the daemon's sched_setattr warnings of the run (why its actuation errors happened).
COLUMNS = ["class", "rep", "avg_us", "p99_us", "max_us", "hog_cpu_share", "boosts", "actuation_errors", "warnings"]
# The default boost class, which another replaces only if it beats it on average and maximum
# latency and leaves the host hogs more CPU.
DEFAULT = "rr"


def plan(quick):
    """(cyclictest loops, repetitions)."""
    return (600, 1) if quick else (5000, 3)


def measure(quick, verbose=False):
    loops, reps = plan(quick)
    rows = []
    for rep in range(reps):
        for cls in ("none", *CLASSES):
            policy = "none" if cls == "none" else "cosched"
            r = harness.run(harness.cyclictest_body("-p 80 -i 1000", loops), host_hogs_n=2, guest_hogs=1,
                            policy=policy, daemon_config=f'[boost]\npolicy = "{cls}"\n' if policy == "cosched" else "",
                            verbose=verbose)
            s = harness.stats(*harness.parse_histogram(r["console"]))
            share = r["hog_cpu_s"] / r["measure_s"] / 2  # of the 2 CPUs the 2 hogs could use
            rows.append(dict(**{"class": cls}, rep=rep, avg_us=s["avg"], p99_us=s["p99"], max_us=s["max"],
                             hog_cpu_share=share, boosts=r.get("daemon", {}).get("boosts", ""),
                             actuation_errors=r.get("actuation_errors", 0),
                             warnings=" | ".join(w for w in r.get("daemon_warnings", []) if "sched_setattr" in w)[:300]))
            log(f"{cls} rep {rep}: avg {s['avg']} p99 {s['p99']} max {s['max']} µs; host hogs got "
                f"{100 * share:.0f}% of 2 CPUs; actuation errors {rows[-1]['actuation_errors']}")
    return rows


def aggregate(rows):
    out = []
    for cls in ("none", *CLASSES):
        rs = [r for r in rows if r["class"] == cls]
        out.append(dict(**{"class": cls}, label=LABEL[cls], avg_us=statistics.mean(r["avg_us"] for r in rs),
                        p99_us=statistics.median(r["p99_us"] for r in rs), max_us=max(r["max_us"] for r in rs),
                        hog_pct=100 * statistics.mean(r["hog_cpu_share"] for r in rs),
                        errors=sum(int(r["actuation_errors"] or 0) for r in rs),
                        # None: the run's data did not keep the daemon's warnings.
                        refused=any("admission control refused" in (r.get("warnings") or "") for r in rs)
                        if any("warnings" in r for r in rs) else None))
    return out


def unjudged(agg):
    """[(class aggregate, why)] of the classes that cannot be judged against the default: their runs
    had actuation errors, so they may measure a VM whose threads stayed at their normal class."""
    out = []
    for a in agg:
        if a["class"] in ("none", DEFAULT) or not a["errors"]:
            continue
        why = (f"{a['errors']} actuation errors: " + (
            "the kernel's admission control refused it" if a["refused"] else
            "why is not in this run's data.csv" if a["refused"] is None else "the daemon's changes to its threads failed")
               + ", so its runs may measure a VM whose threads stayed at their normal class")
        out.append((a, why))
    return out


def verdict(agg):
    """The class that beats RR on both latency (avg and max) and host fairness, if any (of the
    classes without actuation errors: unjudged())."""
    by = {a["class"]: a for a in agg}
    rr = by[DEFAULT]
    winners = [a for a in agg if a["class"] not in ("none", DEFAULT) and not a["errors"]
               and a["avg_us"] < rr["avg_us"] and a["max_us"] < rr["max_us"] and a["hog_pct"] > rr["hog_pct"]]
    if not winners:
        return None
    return min(winners, key=lambda a: a["avg_us"])


def plot(agg):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.8))
    xs = range(len(agg))
    labels = [a["label"] + (" (refused)" if a["refused"] else f" ({a['errors']} actuation errors)" if a["errors"] else "")
              for a in agg]
    a1.bar([x - 0.2 for x in xs], [a["avg_us"] for a in agg], width=0.4, label="average", color="tab:green")
    a1.bar([x + 0.2 for x in xs], [a["max_us"] for a in agg], width=0.4, label="maximum", color="tab:red", alpha=0.6)
    # What a class must beat to replace the default: below both of its latencies, above its host CPU.
    rr = next((a for a in agg if a["class"] == DEFAULT), None)
    if rr:
        a1.axhline(rr["avg_us"], color="tab:green", linestyle=":",
                   label=f"{LABEL[DEFAULT]}'s average: to replace it, a class must be below")
        a1.axhline(rr["max_us"], color="tab:red", linestyle=":",
                   label=f"{LABEL[DEFAULT]}'s maximum: and below")
        a2.axhline(rr["hog_pct"], color="black", linestyle=":",
                   label=f"{LABEL[DEFAULT]}'s: to replace it, a class must be above")
        a2.legend(fontsize=7, loc="lower right")
    a1.set_yscale("log")
    a1.set_ylabel("guest wake-up latency (µs, log)")
    a1.set_title("Latency, 2 host hogs + 1 guest hog, cyclictest -p 80", fontsize=10)
    a2.bar(list(xs), [a["hog_pct"] for a in agg], color="tab:gray")
    a2.set_ylabel("CPU the 2 host hogs got (% of 2 CPUs)")
    a2.set_title("Host fairness", fontsize=10)
    for a in (a1, a2):
        a.set_xticks(list(xs), labels, fontsize=7, rotation=15, ha="right")
        a.grid(True, axis="y", alpha=0.3)
    a1.legend(fontsize=8)
    return fig


def stored(directory):
    """The rows of a run's data.csv (results/boost-classes), as measure() returned them."""
    return read_csv(Path(directory) / "data.csv", text=("class", "warnings"))


def targets(rows, agg):
    """The targets table: whether the default is a class no other beats (judged), and each class
    against it (figures without a target)."""
    by = {a["class"]: a for a in agg}
    rr = by.get(DEFAULT)
    name = LABEL[DEFAULT].replace(" (default)", "")
    if not rr:
        return [target(f"{name} stays the default only while no class beats it", "not measured in this run", NOT_JUDGED)]
    reps = len({r["rep"] for r in rows})

    def per(cls, key, fmt="{:.0f}"):
        return "/".join(fmt.format(r[key]) for r in sorted((r for r in rows if r["class"] == cls), key=lambda r: r["rep"]))

    spread = (f"{name} by repeat: average {per(DEFAULT, 'avg_us')} µs, maximum {per(DEFAULT, 'max_us')} µs"
              if reps > 1 else "one run")
    best = verdict(agg)
    # A class with actuation errors is not judged: where one is left out, "no class beats it" is not
    # shown, only "no class judged beats it".
    left_out = unjudged(agg)
    not_judged = "; not judged: " + "; ".join(f"{a['label']} ({why})" for a, why in left_out) if left_out else ""
    out = [target(f"{name} stays the default only while no class beats it on average latency, maximum latency "
                  "and the host hogs' CPU at once (cyclictest -p 80, 2 host hogs + 1 guest hog)",
                  (f"{best['label']} beats it" if best else
                   "no class judged beats it" if left_out else "no class beats it") + not_judged,
                  False if best else NOT_JUDGED if left_out else True, spread)]
    for cls in CLASSES:
        a = by.get(cls)
        if not a or cls == DEFAULT:
            continue

        def cmp(x, y, lower="lower", higher="higher"):
            return lower if x < y else higher if x > y else "equal"
        measured = (f"average {a['avg_us']:.0f} against {rr['avg_us']:.0f} µs ({cmp(a['avg_us'], rr['avg_us'])}), "
                    f"maximum {a['max_us']:.0f} against {rr['max_us']:.0f} µs ({cmp(a['max_us'], rr['max_us'])}), "
                    f"host hogs {a['hog_pct']:.1f}% against {rr['hog_pct']:.1f}% of 2 CPUs "
                    f"({cmp(a['hog_pct'], rr['hog_pct'], 'less', 'more')})"
                    + (f"; {a['errors']} actuation errors" if a["errors"] else ""))
        out.append(target(f"{a['label']} against {name}", measured, None,
                          f"by repeat: average {per(cls, 'avg_us')} µs, maximum {per(cls, 'max_us')} µs"
                          if reps > 1 else "one run"))
    return out


def main(quick, out=None, verbose=False, fresh=False, rows=None):
    """Measures, or (rows: stored() of an earlier run) renders summary and plot again from its data."""
    o = Output(NAME, quick, out, fresh)
    if rows is None:
        rows = measure(quick, verbose)
    agg = aggregate(rows)
    if not (o.rendered and (o.dir / "data.csv").exists()):  # a rendering keeps the data as measured
        o.csv(rows, COLUMNS)
    o.png(plot(agg))
    best = verdict(agg)
    refused = [a["label"] for a in agg if a["refused"]]
    unknown = [a for a in agg if a["errors"] and a["refused"] is None]
    left_out = [a["label"] for a, _ in unjudged(agg)]
    decision = (f"**{best['label']}** beats SCHED_RR 1 on average and maximum latency and leaves the host more CPU."
                if best else
                "No class beats SCHED_RR 1 on latency (average and maximum) and host fairness at once, so the "
                "default stays `policy = \"rr\"`." if not left_out else
                f"No class judged beats SCHED_RR 1 on latency (average and maximum) and host fairness at once, so the "
                f"default stays `policy = \"rr\"`; {' and '.join(left_out)} had actuation errors and "
                f"{'is' if len(left_out) == 1 else 'are'} not judged (below).")
    reps = len({r["rep"] for r in rows})
    loops = plan(quick)[0]
    o.summary("Boost class comparison", f"""
2 host CPU hogs, 1 guest CPU hog, `cyclictest -p 80 -i 1000 -l {loops}` in the guest, {reps} run(s) per
class (mean average, median p99, max of max; host fairness = CPU time the 2 host hogs got during
the measurement, as a share of the 2 CPUs):

{md_table(agg, ["label", "avg_us", "p99_us", "max_us", "hog_pct", "errors"],
          ["boost class", "avg µs", "p99 µs", "max µs", "host hogs' CPU %", "actuation errors"])}

{decision}
{"The kernel refused SCHED_DEADLINE here (" + ", ".join(refused) + "): its admission control said busy, so those runs measure a VM whose vCPU stayed at its normal class (see docs/limitations.md on SCHED_DEADLINE on Linux 6.18)." if refused else ""}
{" ".join(f"{a['label']} had {a['errors']} actuation errors (the daemon's changes to the VM's threads failed); why is not in this run's data.csv, which did not keep the daemon's warnings, so its runs may measure a VM whose threads stayed at their normal class." for a in unknown)}

**The papers** boost with SCHED_RR priority 1 (Coordinated Task Scheduling) or set SCHED_FIFO 97/98 statically
(Performance Tuning).
""", targets=targets(rows, agg))
    return o.dir
