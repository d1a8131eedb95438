"""Whether a guest started from a snapshot measures what a freshly booted one does: the same point
(cyclictest -p 80 -i 1000, 2000 loops, in the 1-vCPU guest beside one guest CPU hog and 2 host
hogs), uncoordinated and with cosched, alternately booted from the kernel (COSCHED_SNAPSHOT=off)
and restored from a snapshot (guest/run.sh --snapshot auto). Prints each run, and writes to OUT
(default results/boot-vs-snapshot) data.csv (each run: round, start, policy, avg / p99 / max µs,
seconds), summary.md (the targets table, judged from data.csv) and plot.png, with manifest.json.
As root, on a built tree:

    /usr/bin/python3 bench/boot_vs_snapshot.py [--rounds N] [--out DIR]
    /usr/bin/python3 bench/boot_vs_snapshot.py --render [--out DIR]   (no root: summary and plot
                                                                       again from data.csv)

Target: for each policy, the average latency from a snapshot is that from a booted kernel within
an equivalence margin of 10% of the booted guest's mean: the difference of the two means, widened
by 2 standard errors of it, at most that margin (|difference| + 2 SE ≤ 10%). The runs' scatter
widens the interval, so noisier runs pass less easily, not more.
"""

import argparse
import csv
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import manifest  # noqa: E402

OUT = harness.REPO / "results/boot-vs-snapshot"
COLUMNS = ["round", "start", "policy", "avg_us", "p99_us", "max_us", "seconds"]
START = {"off": "kernel", "auto": "snapshot"}


def measure(rounds):
    rows = []
    for rnd in range(rounds):
        for boot in ("off", "auto"):
            os.environ["COSCHED_SNAPSHOT"] = boot
            for policy in ("none", "cosched"):
                t = time.monotonic()
                r = harness.run(harness.cyclictest_body("-p 80 -i 1000", 2000), host_hogs_n=2, guest_hogs=1,
                                policy=policy)
                s = harness.stats(*harness.parse_histogram(r["console"]))
                rows.append(dict(round=rnd + 1, start=START[boot], policy=policy, avg_us=s["avg"], p99_us=s["p99"],
                                 max_us=s["max"], seconds=round(time.monotonic() - t, 1)))
                print(f"round {rnd + 1} {START[boot]} {policy}: avg {s['avg']} p99 {s['p99']} max {s['max']} µs "
                      f"({rows[-1]['seconds']:.1f} s)", flush=True)
    return rows


def stored_rows(out=OUT):
    from experiments.common import read_csv
    return read_csv(Path(out) / "data.csv", text=("start", "policy"))


def avgs(rows, start, policy):
    return [r["avg_us"] for r in sorted(rows, key=lambda r: r["round"]) if r["start"] == start and r["policy"] == policy]


def compare(a, b):
    """(difference of the means of b and a, 2 standard errors of it (Welch), or None)."""
    if len(a) < 2 or len(b) < 2:
        return statistics.mean(b) - statistics.mean(a), None
    se = (statistics.variance(a) / len(a) + statistics.variance(b) / len(b)) ** 0.5
    return statistics.mean(b) - statistics.mean(a), 2 * se


MARGIN = 0.10  # the equivalence margin: a share of the booted guest's mean


def targets(rows):
    from experiments.common import target
    out = []
    for policy in ("none", "cosched"):
        k, sn = avgs(rows, "kernel", policy), avgs(rows, "snapshot", policy)
        if not (k and sn):
            continue
        d, two_se = compare(k, sn)
        margin = MARGIN * statistics.mean(k)
        out.append(target(f"{policy}: the average latency from a snapshot is that from a booted kernel, within "
                          f"{100 * MARGIN:.0f}% of the booted guest's mean (equivalence: the means' difference plus "
                          "2 standard errors of it at most that margin)",
                          f"{statistics.mean(sn):.0f} against {statistics.mean(k):.0f} µs: {d:+.0f} µs"
                          + (f"; {abs(d):.0f} + 2 SE {two_se:.0f} = {abs(d) + two_se:.0f} µs against a {margin:.0f} µs "
                             "margin" if two_se is not None else
                             f" (margin {margin:.0f} µs), one run each: no scatter, so no equivalence shown"),
                          two_se is not None and abs(d) + two_se <= margin,
                          f"by run: snapshot {min(sn):.0f}-{max(sn):.0f}, kernel {min(k):.0f}-{max(k):.0f} µs "
                          f"({len(sn)} and {len(k)} runs)"))
    return out


def plot(rows, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    for ax, policy in zip(axes, ("none", "cosched")):
        for i, (start, color) in enumerate((("kernel", "tab:blue"), ("snapshot", "tab:orange"))):
            ys = avgs(rows, start, policy)
            ax.plot([i] * len(ys), ys, "o", color=color, alpha=0.6)
            if len(ys) > 1:
                m, se = statistics.mean(ys), statistics.stdev(ys) / len(ys) ** 0.5
                ax.errorbar([i + 0.15], [m], yerr=[2 * se], fmt="s", color="black", capsize=4,
                            label="mean ± 2 SE" if i == 0 else None)
        k, sn = avgs(rows, "kernel", policy), avgs(rows, "snapshot", policy)
        if k:
            mk = statistics.mean(k)
            ax.axhspan(mk * (1 - MARGIN), mk * (1 + MARGIN), color="tab:blue", alpha=0.1,
                       label=f"target: the difference ± 2 SE within ±{100 * MARGIN:.0f}% of the booted mean")
        ax.set_xticks([0, 1], ["from its kernel", "from a snapshot"])
        ax.set_xlim(-0.5, 1.5)
        ax.set_ylabel("cyclictest average (µs)")
        ax.set_title("uncoordinated" if policy == "none" else "cosched", fontsize=10)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("A guest started from a snapshot against one booted from its kernel (each run's average)")
    fig.savefig(Path(out) / "plot.png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def write_summary(rows, out, header):
    from experiments.common import targets_md
    table = "| guest started | policy | avg µs, mean | median | each run | s per run (boot included) |\n|---|---|---|---|---|---|\n"
    for start in ("snapshot", "kernel"):
        for policy in ("cosched", "none"):
            v = avgs(rows, start, policy)
            secs = [r["seconds"] for r in rows if r["start"] == start and r["policy"] == policy]
            if v:
                table += (f"| {'from a snapshot' if start == 'snapshot' else 'from its kernel'} | {policy} | "
                          f"{statistics.mean(v):.0f} | {statistics.median(v):.0f} | {', '.join(f'{x:g}' for x in v)} | "
                          f"{statistics.mean(secs):.1f} |\n")
    text = ("# A guest started from a snapshot against one booted from its kernel\n\n" + header + "\n\n"
            + targets_md(targets(rows)) + "\n\n"
            "Each run: cyclictest -p 80 -i 1000 -l 2000 in the 1-vCPU guest beside one guest CPU hog and "
            "2 host CPU hogs (started before QEMU), uncoordinated (none) and with cosched; the four kinds "
            "alternate, round after round. Figures: data.csv.\n\n" + table)
    (Path(out) / "summary.md").write_text(text)
    plot(rows, out)
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6, help="runs of each of the four (default 6)")
    ap.add_argument("--out", default=str(OUT), help="where data.csv, summary.md and plot.png go")
    ap.add_argument("--render", action="store_true", help="summary.md and plot.png again from data.csv, no measuring")
    a = ap.parse_args()
    out = Path(a.out)
    run = manifest.Run()
    if a.render:
        header = manifest.rendered_header(out, "sudo /usr/bin/python3 bench/boot_vs_snapshot.py")
        print(write_summary(stored_rows(out), out, header))
        manifest.write(out, run, name="boot-vs-snapshot", producer="bench/boot_vs_snapshot.py", quick=False,
                       rendered=True)
        return
    if os.geteuid() != 0:
        sys.exit("boot_vs_snapshot.py: must run as root")
    print(harness.accel_line(), flush=True)
    t0 = time.monotonic()
    rows = measure(a.rounds)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "data.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    dirty = " (with uncommitted changes)" if run.dirty_paths else ""
    header = (f"Command: `sudo /usr/bin/python3 bench/boot_vs_snapshot.py --rounds {a.rounds}` "
              f"(took {(time.monotonic() - t0) / 60:.1f} min on {time.strftime('%Y-%m-%d')}, commit "
              f"{(run.commit or 'unknown')[:7]}{dirty}; {harness.accel_line()}; "
              f"{os.cpu_count()} CPUs, Linux {platform.release()}).")
    print(write_summary(rows, out, header))
    name, reason = harness.accel()
    manifest.write(out, run, name="boot-vs-snapshot", producer="bench/boot_vs_snapshot.py", quick=False,
                   accel=(name.upper(), reason))


if __name__ == "__main__":
    main()
