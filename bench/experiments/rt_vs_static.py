"""Experiment 4: co-scheduling vs static real-time prioritization (seed 002, Fig. 11 and 12).

The guest runs a periodic RT task (`cyclictest -p 80 -i 10000`) beside a CPU hog (its general-
purpose load). The host runs two general-purpose CPU jobs of fixed size at the same time: gzip -6
and bzip2 -9 over a fixed 24 MB text, several passes each. We report each job's completion time
and the guest's latency under these host policies: none, static prioritization (vCPU FIFO 97, the
other QEMU threads FIFO 98), shielding (the vCPU alone on a dedicated CPU), and coordination in
two modes:
  - seed 002's: boost while the RT task runs, deboost right after (`cosched guest
    --hold-periodic-max-us 0 --idle-deboost-ms 1`), so the host gets the CPU back between two
    activations;
  - cosched's default: the hold follows the task's period, so the VM stays boosted through it.
Both run without budgets (the runs are 25 s long; static prioritization has none either).
"""

import random
import statistics
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

import harness
from experiments.common import POLICY_LABEL, STYLE, Output, log, md_table

NAME = "rt-vs-static"
SEED002_ARGS = "--hold-periodic-max-us 0 --idle-deboost-ms 1"
# (name in data.csv, harness policy, agent arguments, label)
VARIANTS = [
    ("none", "none", "", POLICY_LABEL["none"]),
    ("static_fifo", "static_fifo", "", POLICY_LABEL["static_fifo"]),
    ("shield", "shield", "", POLICY_LABEL["shield"]),
    ("cosched_seed002", "cosched", SEED002_ARGS, "cosched, deboost at once (seed 002)"),
    ("cosched", "cosched", "", "cosched, default (hold follows the period)"),
]
POLICIES = [v[0] for v in VARIANTS]
LABEL = {v[0]: v[3] for v in VARIANTS}
COLUMNS = ["policy", "rep", "gzip_s", "bzip2_s", "avg_us", "p99_us", "max_us", "samples"]


def plan(quick):
    """(gzip passes, bzip2 passes, cyclictest loops at 10 ms, repetitions)."""
    return (1, 1, 300, 1) if quick else (8, 4, 2500, 3)


def make_input(path, size=24 * 1024 * 1024):
    """A fixed, compressible text: the same bytes on every run (seeded)."""
    r = random.Random(42)
    words = ["".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randint(2, 9))) for _ in range(5000)]
    with open(path, "w") as f:
        n = 0
        while n < size:
            line = " ".join(r.choice(words) for _ in range(12)) + "\n"
            f.write(line)
            n += len(line)


def jobs_command(inp, times, gz, bz):
    """Both jobs at once; each writes its wall time (ns) to `times`."""
    one = "s=$(date +%s%N); i=0; while [ $i -lt {n} ]; do {cmd} -c {inp} >/dev/null; i=$((i+1)); done; " \
          "echo {name} $(( $(date +%s%N) - s )) >> {times}"
    return ["sh", "-c",
            f"({one.format(n=gz, cmd='gzip -6', inp=inp, name='gzip', times=times)}) & "
            f"({one.format(n=bz, cmd='bzip2 -9', inp=inp, name='bzip2', times=times)}) & wait"]


def measure(quick, verbose=False):
    gz, bz, loops, reps = plan(quick)
    rows = []
    with tempfile.TemporaryDirectory(prefix="cosched-jobs-") as tmp:
        inp = Path(tmp) / "input.txt"
        make_input(inp)
        for rep in range(reps):
            for policy, harness_policy, agent_args, _ in VARIANTS:
                times = Path(tmp) / f"times-{policy}-{rep}"
                r = harness.run(harness.cyclictest_body("-p 80 -i 10000", loops), guest_hogs=1,
                                policy=harness_policy, agent_args=agent_args, daemon_config=harness.NO_BUDGETS,
                                host_job=jobs_command(inp, times, gz, bz), verbose=verbose)
                t = {l.split()[0]: int(l.split()[1]) / 1e9 for l in times.read_text().splitlines()}
                s = harness.stats(*harness.parse_histogram(r["console"]))
                rows.append(dict(policy=policy, rep=rep, gzip_s=t["gzip"], bzip2_s=t["bzip2"], avg_us=s["avg"],
                                 p99_us=s["p99"], max_us=s["max"], samples=s["n"]))
                log(f"{policy} rep {rep}: gzip {t['gzip']:.2f} s bzip2 {t['bzip2']:.2f} s; "
                    f"guest avg {s['avg']} max {s['max']} µs")
    return rows


def aggregate(rows):
    out = []
    for policy in POLICIES:
        rs = [r for r in rows if r["policy"] == policy]
        out.append(dict(policy=policy, label=LABEL[policy],
                        gzip_s=statistics.mean(r["gzip_s"] for r in rs),
                        bzip2_s=statistics.mean(r["bzip2_s"] for r in rs),
                        avg_us=statistics.mean(r["avg_us"] for r in rs),
                        p99_us=statistics.median(r["p99_us"] for r in rs),
                        max_us=max(r["max_us"] for r in rs)))
    return out


def color(policy):
    return "tab:olive" if policy == "cosched_seed002" else STYLE[policy]["color"]


def plot(agg):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.8))
    xs = range(len(agg))
    a1.bar([x - 0.2 for x in xs], [a["gzip_s"] for a in agg], width=0.4, label="gzip -6", color="tab:orange")
    a1.bar([x + 0.2 for x in xs], [a["bzip2_s"] for a in agg], width=0.4, label="bzip2 -9", color="tab:brown")
    a1.set_xticks(list(xs), [a["label"] for a in agg], fontsize=7, rotation=15, ha="right")
    a1.set_ylabel("job completion time (s)")
    a1.set_title("Host general-purpose jobs (seed 002 Fig. 11)", fontsize=10)
    a1.legend(fontsize=8)
    a2.bar([x - 0.2 for x in xs], [a["avg_us"] for a in agg], width=0.4, label="average",
           color=[color(a["policy"]) for a in agg], alpha=0.5)
    a2.bar([x + 0.2 for x in xs], [a["max_us"] for a in agg], width=0.4, label="maximum",
           color=[color(a["policy"]) for a in agg])
    a2.set_yscale("log")
    a2.set_xticks(list(xs), [a["label"] for a in agg], fontsize=7, rotation=15, ha="right")
    a2.set_ylabel("guest RT task latency (µs, log)")
    a2.set_title("Guest cyclictest -p 80 -i 10000: average (light) and max (Fig. 12)", fontsize=10)
    for a in (a1, a2):
        a.grid(True, axis="y", alpha=0.3)
    return fig


def main(quick, out=None, verbose=False, fresh=False):
    o = Output(NAME, quick, out, fresh)
    rows = measure(quick, verbose)
    agg = aggregate(rows)
    o.csv(rows, COLUMNS)
    o.png(plot(agg))
    by = {a["policy"]: a for a in agg}
    total = {p: by[p]["gzip_s"] + by[p]["bzip2_s"] for p in by}
    gz, bz, loops, reps = plan(quick)
    o.summary("Co-scheduling vs static real-time prioritization (seed 002 Fig. 11 and 12)", f"""
The guest runs `cyclictest -p 80 -i 10000` and a CPU hog; the host runs gzip -6 ({gz} passes) and
bzip2 -9 ({bz} passes) over the same 24 MB text at the same time. {reps} run(s) per policy
(mean job times and average latency, median p99, max of max):

{md_table(agg, ["label", "gzip_s", "bzip2_s", "avg_us", "p99_us", "max_us"],
          ["host policy", "gzip s", "bzip2 s", "guest avg µs", "guest p99 µs", "guest max µs"])}

Both jobs together: no policy {total["none"]:.1f} s, static prioritization {total["static_fifo"]:.1f} s,
shielding {total["shield"]:.1f} s, seed 002's co-scheduling {total["cosched_seed002"]:.1f} s
({total["static_fifo"] / total["cosched_seed002"]:.2f}x as fast as static), cosched's default
{total["cosched"]:.1f} s ({total["static_fifo"] / total["cosched"]:.2f}x as fast as static).

Two modes of coordination, and a trade-off between them. Seed 002's (`cosched guest
{SEED002_ARGS}`) boosts while the RT task runs and deboosts 1 ms after it stops, so the host jobs
keep the CPU between activations ({total["cosched_seed002"]:.1f} s, close to no policy). But the
guest's latency is no better than with no policy at all (average {by["cosched_seed002"]["avg_us"]:.0f}
against {by["none"]["avg_us"]:.0f} µs): a guest can only ask once it runs, the timer that wakes the
RT task fires while the VM is deboosted, the wake-up waits behind the host jobs, and the boost
comes after the latency it should have prevented. cosched's default holds the boost for 2 periods +
MIN_BOOST_TIME while the needs recur (every 10 ms here), so the VM stays boosted and the wake-up
finds its vCPU privileged: average {by["cosched"]["avg_us"]:.0f} µs, p99 {by["cosched"]["p99_us"]:.0f} µs,
maximum {by["cosched"]["max_us"]:.0f} µs, against {by["static_fifo"]["max_us"]:.0f} µs for static
prioritization, whose maximum is the kernel's RT throttle, which cosched's real-time guard keeps
from firing. Its price is the host jobs
({total["cosched"]:.1f} s): the boosted vCPU, kept busy by the guest's hog, holds its CPU nearly
all the time (in the guard's phase it runs at nice -20, still ~99% of a CPU), where the throttle
takes 5% of every second from static prioritization. On this host the two goals trade against
each other, and `--hold-periodic-max-us` chooses. Both modes run without budgets
(`max_continuous_boost_ms = 0`, `max_boost_share_permille = 1000`): a run is {loops / 100:.0f} s of
continuous need, and static prioritization has no budget either; with the default budgets the
host would cut the held boost after 10 s.

**The paper** (seed 002 sec. 5.5, VxWorks guest with CPU load, SPEC2000 jobs on the host): with
co-scheduling the general-purpose jobs ran "much faster (even more than two times)" than with
static prioritization (vCPU FIFO 97, I/O thread 98); the RT task's average latency did not change,
its worst case rose from 112 to 130 µs.
""")
    return o.dir
