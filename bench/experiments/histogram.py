"""Experiment 2: the latency histogram (Coordinated Task Scheduling, Fig. 8): 2 host hogs and 1 guest hog,
uncoordinated vs coordinated, log-log, from cyclictest's -h histogram."""

import csv
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import harness
from experiments.common import POLICY_LABEL, STYLE, Output, log, md_table, read_csv, target

NAME = "histogram"
CYCLICTEST = {"other": "-i 1000", "rt": "-p 80 -i 1000"}
POLICIES = ("none", "cosched")
COLUMNS = ["cyclictest", "policy", "latency_us", "samples"]
# stats.csv: cyclictest's own summary of each curve (avg and max count the samples beyond the
# histogram) and the share of the run the VM was boosted.
STATS_COLUMNS = ["cyclictest", "policy", "samples", "avg_us", "max_us", "overflows", "boosted_pct"]
CYCLICTEST_LABEL = {"other": "SCHED_OTHER", "rt": "-p 80"}
# The paper's "high range": samples of this many µs or more.
HIGH_US = 1000
# The paper (Coordinated Task Scheduling, Fig. 8, CFS, SCHED_OTHER cyclictest).
PAPER_AVG_US = {"none": 1921, "cosched": 87.5}


def measure(quick, verbose=False):
    """One boot per policy measures both cyclictest runs, one after the other (SCHED_OTHER first)."""
    loops = 1000 if quick else 20000
    hists, summaries = {}, {}
    body = "".join(harness.cyclictest_body(args, loops, cm) for cm, args in CYCLICTEST.items())
    # Coordinated first: a run stopped early (the VM tests' Interrupted) has had its daemon up.
    for policy in reversed(POLICIES):
        r = harness.run(body, host_hogs_n=2, guest_hogs=1, policy=policy, daemon_config=harness.NO_BUDGETS,
                        verbose=verbose)
        for cm in CYCLICTEST:
            hist, summary = harness.parse_histogram(r["console"], cm)
            hists[(cm, policy)] = hist
            summaries[(cm, policy)] = s = harness.stats(hist, summary)
            # How much of the run the host kept the VM boosted: a curve that does not improve
            # shows here whether the guest stopped asking.
            w = r["windows"][cm]
            s["boosted_pct"] = f"{100 * w['boosted_share']:.0f}" if "boosted_share" in w else "-"
            log(f"{cm} {policy}: avg {s['avg']} p99 {s['p99']} max {s['max']} overflows {s['overflows']}")
    # In the order of CYCLICTEST, then POLICIES, as the table and data.csv had them.
    order = [(cm, p) for cm in CYCLICTEST for p in POLICIES]
    return ({k: hists[k] for k in order}, {k: summaries[k] for k in order}, loops)


def plot(hists, summaries):
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, cm in zip(axes, CYCLICTEST):
        top = max(max(hists[(cm, p)] or [1]) for p in POLICIES)
        low = max(1, min(min(hists[(cm, p)] or [1]) for p in POLICIES))
        edges = np.unique(np.logspace(np.log10(low), np.log10(top + 2), 50).astype(int))
        for policy in POLICIES:
            h = hists[(cm, policy)]
            s = summaries[(cm, policy)]
            # Log-spaced bins, as in the paper's figure: 1 µs buckets are too sparse in the tail.
            counts, _ = np.histogram(list(h), bins=edges, weights=list(h.values()))
            ax.stairs(np.where(counts > 0, counts, np.nan), edges, color=STYLE[policy]["color"], linewidth=1.5,
                      label=f"{POLICY_LABEL[policy]} (average {s['avg']} µs)")
        ax.axvline(HIGH_US, color="gray", linestyle=":",
                   label=f"{HIGH_US / 1000:g} ms: the high range counted from here (no target)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("latency (µs)")
        ax.set_ylabel("number of samples per bin")
        ax.set_title("cyclictest " + ("(SCHED_OTHER, as in the paper)" if cm == "other" else "-p 80"), fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Latency with 2 host hogs and 1 guest hog (Coordinated Task Scheduling, Fig. 8)")
    return fig


def stored(directory):
    """The rows of a run's data.csv (results/histogram): its histogram buckets."""
    return read_csv(Path(directory) / "data.csv", text=("cyclictest", "policy"))


def summaries_of(hists, stats_rows=None):
    """{(cyclictest, policy): stats} from the run's stats.csv rows (cyclictest's own avg and max,
    which count the samples beyond the histogram, and the boosted share), or, for a run that
    did not write one, from its histogram alone (avg: the mean of the 1 µs buckets; max: the
    highest bucket; exact only if no sample overflowed the histogram)."""
    by = {(r["cyclictest"], r["policy"]): r for r in stats_rows or []}
    out = {}
    for key, h in hists.items():
        s = harness.stats(h, {})
        st = by.get(key)
        if st:
            s.update(n=st["samples"], avg=st["avg_us"], max=st["max_us"], overflows=st["overflows"],
                     boosted_pct=st["boosted_pct"] if st["boosted_pct"] != "" else "-")
        else:
            s.update(avg=round(sum(b * c for b, c in h.items()) / max(1, s["n"]), 1), max=max(h) if h else 0,
                     overflows="not recorded", boosted_pct="not recorded")
        out[key] = s
    return out


def high_share(h, us=HIGH_US):
    """The share of a histogram's samples at `us` or more."""
    n = sum(h.values())
    return sum(c for b, c in h.items() if b >= us) / n if n else 0.0


def targets(hists, summaries):
    """No target of ours: the paper's two statements of Fig. 8, beside this run's figures."""
    avg, high = [], []
    for cm in CYCLICTEST:
        if all((cm, p) in summaries for p in POLICIES):
            u, c = (summaries[(cm, p)]["avg"] for p in POLICIES)
            avg.append(f"{CYCLICTEST_LABEL[cm]} {u:.0f} → {c:.0f} µs ({u / c:.1f}×)")
            hu, hc = (high_share(hists[(cm, p)]) for p in POLICIES)
            high.append(f"{CYCLICTEST_LABEL[cm]} {100 * hu:.1f}% → {100 * hc:.2f}%")
    return [
        target(f"the paper (SCHED_OTHER cyclictest, 2 host + 1 guest workloads): average {PAPER_AVG_US['none']:g} µs "
               f"uncoordinated, {PAPER_AVG_US['cosched']:g} µs coordinated", "here, uncoordinated → cosched: "
               + "; ".join(avg), None, "one run"),
        target('the paper: with coordination "there are less overall values in the high range"',
               f"samples of {HIGH_US / 1000:g} ms or more, uncoordinated → cosched: " + "; ".join(high), None,
               "one run"),
    ]


def main(quick, out=None, verbose=False, fresh=False, rows=None):
    """Measures, or (rows: stored() of an earlier run) renders summary and plot again from its data
    (data.csv, and stats.csv where the run wrote one)."""
    o = Output(NAME, quick, out, fresh)
    if rows is None:
        hists, summaries, loops = measure(quick, verbose)
        rows = [dict(cyclictest=cm, policy=p, latency_us=b, samples=c)
                for (cm, p), h in hists.items() for b, c in sorted(h.items())]
        stats_rows = [dict(cyclictest=cm, policy=p, samples=s["n"], avg_us=s["avg"], max_us=s["max"],
                           overflows=s["overflows"], boosted_pct=s["boosted_pct"] if s["boosted_pct"] != "-" else "")
                      for (cm, p), s in summaries.items()]
        with open(o.dir / "stats.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=STATS_COLUMNS)
            w.writeheader()
            w.writerows(stats_rows)
    else:
        stats_rows = read_csv(o.dir / "stats.csv", text=("cyclictest", "policy")) if (o.dir / "stats.csv").exists() else None
    hists = {}
    for r in rows:
        hists.setdefault((r["cyclictest"], r["policy"]), {})[r["latency_us"]] = r["samples"]
    summaries = summaries_of(hists, stats_rows)
    if not (o.rendered and (o.dir / "data.csv").exists()):  # a rendering keeps the data as measured
        o.csv(rows, COLUMNS)
    o.png(plot(hists, summaries))
    table = md_table([dict(cyclictest=cm, policy=POLICY_LABEL[p], **summaries[(cm, p)]) for cm, p in summaries],
                     ["cyclictest", "policy", "avg", "p50", "p99", "p999", "max", "n", "boosted_pct"],
                     ["cyclictest", "QEMU threads", "avg µs", "p50 µs", "p99 µs", "p99.9 µs", "max µs", "samples",
                      "VM boosted, % of the run"])
    samples = sorted({s["n"] for s in summaries.values()})
    source = ("`stats.csv` holds cyclictest's own average and maximum (they count the samples beyond the "
              "histogram too) and how much of the run the host kept the VM boosted."
              if stats_rows else
              "This run wrote no `stats.csv`: the averages and maxima here are computed from the histogram "
              f"(every one of its {' or '.join(map(str, samples))} samples per curve is in it), and the VM's "
              "boosted share was not recorded.")
    o.summary("Latency histogram, 2 host hogs + 1 guest hog (Coordinated Task Scheduling, Fig. 8)", f"""
The distribution of {' or '.join(map(str, samples))} wake-up latencies per curve, 2 host CPU hogs and 1 guest CPU hog.
The daemon runs without budgets (`max_continuous_boost_ms = 0`, `max_boost_share_permille =
1000`): with the defaults (10 s at a time, 90% of 20 s) a run this long is cut by the budget, which
is what budgets are for but not what this figure measures.
`data.csv` holds every non-empty 1 µs bucket (samples above {harness.HIST_US} µs count in `max` only).
{source}

{table}

**The paper** (Coordinated Task Scheduling, Fig. 8, CFS, SCHED_OTHER cyclictest): average {PAPER_AVG_US['none']:g} µs without and {PAPER_AVG_US['cosched']:g} µs
with coordinated scheduling; "there are less overall values in the high range".
""", targets=targets(hists, summaries))
    return o.dir
