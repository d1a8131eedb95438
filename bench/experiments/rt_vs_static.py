"""Experiment 4: co-scheduling vs static real-time tunings (Performance Tuning, Fig. 11 and 12).

The guest runs a periodic RT task (`cyclictest -p 80 -i 10000`) beside a CPU hog (its general-
purpose load). The host runs two general-purpose CPU jobs of fixed size at the same time: gzip -6
and bzip2 -9 over a fixed 24 MB text, several passes each. We report each job's completion time
and the guest's latency (cyclictest's timer-interrupt-to-task latency: the paper's PDLT, its
interrupt-latency measure) under these host policies: none, static prioritization (vCPU FIFO 97,
the other QEMU threads FIFO 98), the same with the RT guard, shielding (the vCPU alone on a
dedicated CPU), both (the static ones are the daemon's `[vm.bench.static]`, applied when it finds
the VM, with no agent in the guest), and
coordination in three modes:
  - the paper's co-scheduling: boost while the RT task runs, at the guest task's priority (FIFO,
    capped by the VM's ceiling), deboost right after (`cosched guest --hold-periodic-max-us 0
    --idle-deboost-ms 1 --predict false`), so the host gets the CPU back between two activations;
  - cosched's default: the hold follows the task's period, so the VM stays boosted through it;
  - predictive boost: the paper's mode, and after each deboost the guest tells the host when its
    next RT wake-up is due (`WAKE`); the host boosts just before it. A periodic task's wake-ups
    go out once as a standing prediction, and the host boosts every period by itself.
The paper's and the predictive modes run without the new-task heuristic (`--watch-budget-ms 0
--watch-count 0`): the Performance Tuning paper's co-scheduling knows RT tasks only, and the
heuristic keeps cyclictest's SCHED_OTHER main thread (a 100 Hz sleeper) boosted, a boost and a
deboost every period in a mode deboosted between activations. One more row runs the predictive
mode with it (the agent's defaults), to show what it costs there. Two more run the predictive mode
with a longer least hold (`[rt] predict_hold_us` 1000 and 2000 µs, against the default's 500, which
was 2000 until two full runs showed 500 better): how much of its cost to the host jobs, and of its
average, the boost window's length explains.
All run without budgets (the runs are 25 s long; static prioritization has none either).
A SCHED_OTHER cyclictest pinned to the vCPU's CPU on the host (the last CPU, the shielded one)
stands in for that CPU's per-CPU kernel threads (ksoftirqd, kworkers): what it waits is what
they wait under each policy.
"""

import random
import statistics
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

import harness
from experiments.common import POLICY_LABEL, STYLE, Output, log, md_table, packaged_default, read_csv, target

NAME = "rt-vs-static"
PAPER_RT_ARGS = "--hold-periodic-max-us 0 --idle-deboost-ms 1"
NO_WATCH = " --watch-budget-ms 0 --watch-count 0"
# (name in data.csv, agent arguments or None (no agent), the daemon's [vm.bench.static] or None, label).
# The static tunings are the daemon's (`[vm.NAME.static]`, applied when it finds the VM, at boot),
# with no agent in the guest; "none" runs no daemon.
SHIELD = f'shield = "{harness.NCPUS - 1}"\n'
HELD = "fifo = true\nguard = true\n"
VARIANTS = [
    ("none", None, None, POLICY_LABEL["none"]),
    ("static_fifo", None, "fifo = true\n", "static FIFO 97/98"),
    ("static_fifo_guard", None, HELD, "static FIFO 97/98 + RT guard"),
    ("shield", None, SHIELD, "shielding"),
    ("shield_fifo", None, "fifo = true\n" + SHIELD, "shielding + FIFO 97/98"),
    ("cosched_paper", PAPER_RT_ARGS + NO_WATCH + " --predict false", None, "the paper's co-scheduling (guest priority)"),
    ("cosched", "", None, "cosched, default (hold follows the period)"),
    # The default plus one frame per period that changes nothing (the agent's channel probe, at
    # each RT activation, where the paper's and the predictive modes send CPU 1): what the frames
    # cost, without the class changes.
    ("cosched_probe", "--probe-frames", None, "cosched, default + a dummy frame per period"),
    ("cosched_predict", PAPER_RT_ARGS + NO_WATCH, None, "cosched, predictive boost"),
    ("cosched_predict_watch", PAPER_RT_ARGS, None, "cosched, predictive boost + new-task heuristic"),
    # The predictive mode with a longer least hold (`[rt] predict_hold_us`, 500 by default): how
    # much of the host jobs' loss and of the guest's average the window's length explains.
    ("cosched_predict_hold1000", PAPER_RT_ARGS + NO_WATCH, None, "cosched, predictive boost, hold ≥ 1 ms"),
    ("cosched_predict_hold2000", PAPER_RT_ARGS + NO_WATCH, None, "cosched, predictive boost, hold ≥ 2 ms"),
    # The guest's own work per period, apart from the host's: the host holds the vCPU at FIFO
    # throughout (static FIFO with the RT guard; the CPU actuator never lowers a real-time
    # thread, so the agent's boosts and deboosts change nothing there), with the default's and
    # the predictive mode's agent. No host policy can give the guest more than that.
    ("held_default", "", HELD, "host holds FIFO + RT guard, default agent"),
    ("held_predict", PAPER_RT_ARGS + NO_WATCH, HELD, "host holds FIFO + RT guard, predictive agent"),
]
POLICIES = [v[0] for v in VARIANTS]
# The daemon's config beside the variant's (its least hold, for the hold rows).
DAEMON_EXTRA = {"cosched_predict_hold1000": "[rt]\npredict_hold_us = 1000\n",
                "cosched_predict_hold2000": "[rt]\npredict_hold_us = 2000\n"}
HOLD_ROWS = ("cosched_predict_hold1000", "cosched_predict_hold2000")

# The daemon's default least hold (`[rt] predict_hold_us`), which the predictive row runs with.
DEFAULT_HOLD_MS = packaged_default("host", "rt", "predict_hold_us") / 1000
# The agent's default new-task budget, which the predictive mode with the heuristic runs with.
WATCH_BUDGET_MS = packaged_default("guest", None, "watch_budget_ms")
LABEL = {v[0]: v[3] for v in VARIANTS}
# The daemon's IRQ moves stay inside the run: it puts them back when it stops (SIGTERM).
STATIC_CONFIG = harness.NO_BUDGETS + "[shield]\nirqs = true\n[vm.bench.static]\n"
COLUMNS = ["policy", "rep", "gzip_s", "bzip2_s", "avg_us", "p99_us", "max_us", "samples", "kthread_avg_us",
           "kthread_max_us", "wakes", "predicted", "confirmed", "unconfirmed", "late", "lead_us", "hold_us",
           "error_p50_us",
           "error_p99_us", "late_p50_us", "late_p99_us", "standing"]


def plan(quick):
    """(gzip passes, bzip2 passes, cyclictest loops at 10 ms, repetitions, the text's MB)."""
    return (1, 1, 150, 1, 8) if quick else (8, 4, 2500, 5, 24)


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


def jobs_command(inp, times, gz, bz, probe):
    """Both jobs at once; each writes its wall time (ns) to `times`. Meanwhile a SCHED_OTHER
    cyclictest pinned to the last CPU (a per-CPU kernel thread's stand-in) writes its summary to
    `probe` when the jobs are done."""
    one = "s=$(date +%s%N); i=0; while [ $i -lt {n} ]; do {cmd} -c {inp} >/dev/null; i=$((i+1)); done; " \
          "echo {name} $(( $(date +%s%N) - s )) >> {times}"
    last = harness.NCPUS - 1
    return ["sh", "-c",
            f"cyclictest -q -m -a {last} -i 10000 --policy=other > {probe} 2>&1 & c=$!; "
            f"({one.format(n=gz, cmd='gzip -6', inp=inp, name='gzip', times=times)}) & g=$!; "
            f"({one.format(n=bz, cmd='bzip2 -9', inp=inp, name='bzip2', times=times)}) & b=$!; "
            # cyclictest prints its summary on SIGINT once its handler is in place; until then
            # SIGINT is ignored (sh starts background commands so), and it can start late (pinned
            # to the CPU a FIFO vCPU holds) or the jobs end early (a quick run's): one SIGINT sent
            # then was lost and `wait` hung for ever. So SIGINT again until it has exited (a
            # zombie: kill(2) still succeeds on one).
            f"wait $g $b; while [ -e /proc/$c ] && ! grep -q '^State:.Z' /proc/$c/status; do kill -INT $c; sleep 0.2; done; "
            f"wait $c; true"]


def parse_probe(text):
    """(avg, max) µs from cyclictest -q's summary line ("... Min: 3 Act: 5 Avg: 7 Max: 90")."""
    import re
    m = re.search(r"Avg:\s*(\d+)\s+Max:\s*(\d+)", text)
    if not m:
        raise RuntimeError(f"no cyclictest summary in {text!r}")
    return int(m.group(1)), int(m.group(2))


def predictions(r):
    """The daemon's prediction figures for the VM (`resources.cpu.rt` of its status; zeros without)."""
    p = (r.get("daemon_cpu") or {}).get("rt") or {}
    c = p.get("predictions") or {}
    err, late = p.get("predict_error_us") or {}, p.get("predict_apply_late_us") or {}
    return dict(wakes=c.get("received", 0), predicted=c.get("applied", 0) + c.get("covered", 0),
                confirmed=c.get("confirmed", 0), unconfirmed=c.get("unconfirmed", 0), late=c.get("late", 0),
                lead_us=round(p.get("lead_us", 0)), hold_us=round(p.get("hold_us", 0)), error_p50_us=round(err.get("p50_us", 0)),
                error_p99_us=round(err.get("p99_us", 0)), late_p50_us=round(late.get("p50_us", 0)),
                standing=c.get("standing", 0),
                late_p99_us=round(late.get("p99_us", 0)))


def check_static(r, static):
    """The daemon applied the static tuning asked for (else the run measured something else)."""
    tuning = (r.get("daemon_static") or {}).get("tuning", "none")
    want = [w for w in ("fifo", "shield") if w in static]
    if not all(w in tuning for w in want):
        raise RuntimeError(f"the daemon's static tuning is {tuning!r}, not {static!r}: {r.get('daemon_warnings')}")


def stored(directory):
    """The rows of a run's data.csv (results/rt-vs-static), as measure() returned them."""
    return read_csv(Path(directory) / "data.csv", text=("policy",))


def run_order(rep):
    """The variants in the order repeat `rep` runs them: the first in VARIANTS' order, the
    others shuffled (a fixed seed per repeat, chosen so that the default, the dummy frame's and
    the predictive runs change places), so that no variant always runs in the same place in a
    repeat (the predictive mode had always run last, right after the dummy frame's run)."""
    order = list(VARIANTS)
    if rep > 0:
        random.Random(4 + rep).shuffle(order)
    return order


def measure(quick, verbose=False):
    gz, bz, loops, reps, mb = plan(quick)
    rows = []
    with tempfile.TemporaryDirectory(prefix="cosched-jobs-") as tmp:
        inp = Path(tmp) / "input.txt"
        make_input(inp, mb * 1024 * 1024)
        for rep in range(reps):
            for policy, agent_args, static, _ in run_order(rep):
                times, probe = Path(tmp) / f"times-{policy}-{rep}", Path(tmp) / f"probe-{policy}-{rep}"
                r = harness.run(harness.cyclictest_body("-p 80 -i 10000", loops), guest_hogs=1,
                                policy="none" if policy == "none" else "cosched", agent_args=agent_args or "",
                                start_agent=agent_args is not None,
                                daemon_config=(STATIC_CONFIG + static if static else harness.NO_BUDGETS)
                                + DAEMON_EXTRA.get(policy, ""),
                                pin_host=bool(static and "shield" in static),
                                host_job=jobs_command(inp, times, gz, bz, probe), verbose=verbose)
                if static and policy != "none":
                    check_static(r, static)
                t = {l.split()[0]: int(l.split()[1]) / 1e9 for l in times.read_text().splitlines()}
                s = harness.stats(*harness.parse_histogram(r["console"]))
                k_avg, k_max = parse_probe(probe.read_text())
                pr = predictions(r)
                rows.append(dict(policy=policy, rep=rep, gzip_s=t["gzip"], bzip2_s=t["bzip2"], avg_us=s["avg"],
                                 p99_us=s["p99"], max_us=s["max"], samples=s["n"], kthread_avg_us=k_avg,
                                 kthread_max_us=k_max, **pr))
                log(f"{policy} rep {rep}: gzip {t['gzip']:.2f} s bzip2 {t['bzip2']:.2f} s; "
                    f"guest avg {s['avg']} max {s['max']} µs; per-CPU kthread stand-in avg {k_avg} max {k_max} µs"
                    + (f"; WAKE {pr['wakes']} predicted {pr['predicted']} confirmed {pr['confirmed']} "
                       f"unconfirmed {pr['unconfirmed']} (late {pr['late']}) lead {pr['lead_us']} µs "
                       f"hold {pr['hold_us']} µs error p50 {pr['error_p50_us']} µs "
                       f"late p50/p99 {pr['late_p50_us']}/{pr['late_p99_us']} µs" if pr["wakes"] else ""))
    return rows


def aggregate(rows):
    out = []
    for policy in POLICIES:
        rs = [r for r in rows if r["policy"] == policy]
        if not rs:
            continue  # a variant added after the run (its data.csv rendered again)
        out.append(dict(policy=policy, label=LABEL[policy],
                        gzip_s=statistics.mean(r["gzip_s"] for r in rs),
                        bzip2_s=statistics.mean(r["bzip2_s"] for r in rs),
                        avg_us=statistics.mean(r["avg_us"] for r in rs),
                        p99_us=statistics.median(r["p99_us"] for r in rs),
                        max_us=max(r["max_us"] for r in rs),
                        kthread_avg_us=statistics.mean(r["kthread_avg_us"] for r in rs),
                        kthread_max_us=max(r["kthread_max_us"] for r in rs),
                        wakes=sum(r["wakes"] for r in rs), predicted=sum(r["predicted"] for r in rs),
                        confirmed=sum(r["confirmed"] for r in rs), unconfirmed=sum(r["unconfirmed"] for r in rs),
                        error_p50_us=statistics.median(r["error_p50_us"] for r in rs),
                        late_p50_us=statistics.median(r["late_p50_us"] for r in rs),
                        late_p99_us=max(r["late_p99_us"] for r in rs),
                        lead_us=statistics.median(r["lead_us"] for r in rs),
                        late=sum(r["late"] for r in rs), hold_us=statistics.median(r["hold_us"] for r in rs),
                        standing=sum(r.get("standing", 0) for r in rs)))
    return out


def color(policy):
    return {"cosched_paper": "tab:olive", "cosched_predict": "tab:cyan", "cosched_probe": "tab:gray", "shield_fifo": "tab:pink",
            "static_fifo_guard": "tab:purple", "held_default": "tab:blue", "held_predict": "tab:green",
            "cosched_predict_watch": "tab:olive", "cosched_predict_hold1000": "tab:cyan",
            "cosched_predict_hold2000": "tab:cyan"}.get(
        policy) or STYLE[policy]["color"]


def plot(agg):
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.8))
    xs = range(len(agg))
    by = {a["policy"]: a for a in agg}
    total = {p: a["gzip_s"] + a["bzip2_s"] for p, a in by.items()}
    a1.bar(list(xs), [a["gzip_s"] for a in agg], width=0.6, label="gzip -6", color="tab:orange")
    a1.bar(list(xs), [a["bzip2_s"] for a in agg], width=0.6, bottom=[a["gzip_s"] for a in agg], label="bzip2 -9",
           color="tab:brown")
    # The targets the summary judges by: the predictive mode's jobs ≤ 1.1× the paper's mode's, and
    # the paper's mode ≥ 1.5× as fast as static FIFO.
    a1.axhline(1.1 * total["cosched_paper"], color="tab:cyan", linestyle="--", linewidth=1,
               label="target: predictive ≤ 1.1× the paper's mode")
    a1.axhline(total["static_fifo"] / 1.5, color="tab:olive", linestyle=":", linewidth=1,
               label="target: the paper's mode ≥ 1.5× as fast as static FIFO")
    a1.set_xticks(list(xs), [a["label"] for a in agg], fontsize=7, rotation=15, ha="right")
    a1.set_ylabel("both jobs' completion times, stacked (s)")
    a1.set_ylim(0, 1.4 * max(total.values()))  # room for the legend above the bars
    a1.set_title("Host general-purpose jobs (Performance Tuning, Fig. 11)", fontsize=10)
    a1.legend(fontsize=7)
    a2.bar([x - 0.2 for x in xs], [a["avg_us"] for a in agg], width=0.4, label="average",
           color=[color(a["policy"]) for a in agg], alpha=0.5)
    a2.bar([x + 0.2 for x in xs], [a["max_us"] for a in agg], width=0.4, label="maximum",
           color=[color(a["policy"]) for a in agg])
    a2.axhline(1.2 * by["cosched"]["avg_us"], color="tab:cyan", linestyle="--", linewidth=1,
               label="target: predictive average ≤ 1.2× cosched's default")
    a2.set_yscale("log")
    a2.set_ylim(top=10 * max(a["max_us"] for a in agg))
    a2.legend(fontsize=7)
    a2.set_xticks(list(xs), [a["label"] for a in agg], fontsize=7, rotation=15, ha="right")
    a2.set_ylabel("guest RT task latency (µs, log)")
    a2.set_title("Guest cyclictest -p 80 -i 10000: average (light) and max (Fig. 12)", fontsize=10)
    for a in (a1, a2):
        a.grid(True, axis="y", alpha=0.3)
    return fig


def main(quick, out=None, verbose=False, fresh=False, rows=None):
    """rows: a run's data.csv rows, to render its plot and summary again without measuring."""
    o = Output(NAME, quick, out, fresh)
    rows = rows if rows is not None else measure(quick, verbose)
    agg = aggregate(rows)
    o.csv(rows, COLUMNS)
    o.png(plot(agg))
    by = {a["policy"]: a for a in agg}
    total = {p: by[p]["gzip_s"] + by[p]["bzip2_s"] for p in by}
    gz, bz, loops, _, mb = plan(quick)
    reps = len({r["rep"] for r in rows})
    pred, seed, dflt, fifo = by["cosched_predict"], by["cosched_paper"], by["cosched"], by["static_fifo"]
    unc = by["none"]
    guard = by["static_fifo_guard"]
    t_jobs = total["cosched_predict"] / total["cosched_paper"]
    t_avg = pred["avg_us"] / dflt["avg_us"]
    t_seed = total["static_fifo"] / total["cosched_paper"]
    # The separation: how far one dummy frame per period (no class change) moves the default's
    # average towards the predictive mode's (its share of the gap between the two).
    probe = by["cosched_probe"]
    t_probe = probe["avg_us"] / dflt["avg_us"]
    gap = pred["avg_us"] - dflt["avg_us"]
    share = (probe["avg_us"] - dflt["avg_us"]) / gap if gap > 0 else float("nan")
    # Each run of the policies that matter here, in order: one run's ratios are noisy on a shared host.
    def runs(policy, f):
        return "/".join(f"{f(r):.0f}" for r in sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["rep"]))

    def jobs(r):
        return r["gzip_s"] + r["bzip2_s"]

    # The target's ratio within each repeat (the two ran in the same repeat, minutes apart): its spread.
    rep_ratios = "/".join(
        f"{a['avg_us'] / b['avg_us']:.2f}" for a, b in zip(
            sorted((r for r in rows if r["policy"] == "cosched_predict"), key=lambda r: r["rep"]),
            sorted((r for r in rows if r["policy"] == "cosched"), key=lambda r: r["rep"])))
    shares = []
    for rep in sorted({r["rep"] for r in rows}):
        one = {r["policy"]: r["avg_us"] for r in rows if r["rep"] == rep}
        if one["cosched_predict"] > one["cosched"]:
            shares.append(f"{(one['cosched_probe'] - one['cosched']) / (one['cosched_predict'] - one['cosched']):.0%}")
    spread = max((max(jobs(r) for r in rows if r["policy"] == p) / min(jobs(r) for r in rows if r["policy"] == p), p)
                 for p in POLICIES if p in by)
    per_run = (f"Per run, in order: guest average µs: the default {runs('cosched', lambda r: r['avg_us'])}, "
               f"with the dummy frame {runs('cosched_probe', lambda r: r['avg_us'])}, predictive "
               f"{runs('cosched_predict', lambda r: r['avg_us'])}, the paper's mode "
               f"{runs('cosched_paper', lambda r: r['avg_us'])}; host jobs s: the default {runs('cosched', jobs)}, "
               f"with the dummy frame {runs('cosched_probe', jobs)}, predictive {runs('cosched_predict', jobs)}, "
               f"the paper's mode {runs('cosched_paper', jobs)}; with the host holding FIFO, guest average µs: "
               f"no agent {runs('static_fifo_guard', lambda r: r['avg_us'])}, the default's agent "
               f"{runs('held_default', lambda r: r['avg_us'])}, the predictive mode's "
               f"{runs('held_predict', lambda r: r['avg_us'])}. The dummy frame's share of the gap, run by run: "
               f"{', '.join(shares) or 'none (no gap)'}. The host jobs of one policy varied up to "
               f"{spread[0]:.1f}× between its runs ({LABEL[spread[1]]})"
               + (": the host was noisy, and one run's ratios say little." if spread[0] > 1.5 else "."))
    # The guest's side against the host's: with the host holding the vCPU at FIFO throughout, what
    # is left of the predictive mode's average is the guest's own work; what the predictive mode
    # has above that is the host's side (its class changes, its time deboosted).
    held0, held_d, held_p = guard["avg_us"], by["held_default"]["avg_us"], by["held_predict"]["avg_us"]
    host_side, guest_side = pred["avg_us"] - held_p, held_p - held_d
    t_bound = held_p / dflt["avg_us"]
    if gap <= 0:
        cause = ("the predictive mode's average is not above the default's in this run: there is no gap to "
                 "explain")
    elif share >= 1:
        cause = (f"not the frames any more: one dummy frame per period costs the default {probe['avg_us'] - dflt['avg_us']:+.0f} µs, "
                 f"more than the whole gap left ({gap:.0f} µs), and the predictive mode sends none per period (its "
                 f"prediction stands). What is left: the host's side (its two class changes per period, the time "
                 f"deboosted) {host_side:+.0f} µs over the predictive agent with the host holding FIFO ({held_p:.0f} µs)")
    elif host_side <= 0.25 * gap:
        cause = (f"the guest's side: with the host holding the vCPU at FIFO throughout, the predictive "
                 f"mode's agent still gives {held_p:.0f} µs against the default agent's {held_d:.0f} µs, "
                 f"{guest_side:+.0f} µs; the host's side (its two class changes per period, the time "
                 f"deboosted) adds {host_side:+.0f} µs to that ({pred['avg_us']:.0f} µs). One dummy frame per "
                 f"period covers {share:.0%} of the gap")
    else:
        cause = (f"both sides: the host's (its two class changes per period, the time deboosted) adds "
                 f"{host_side:+.0f} µs over the predictive agent with the host holding FIFO ({held_p:.0f} µs), "
                 f"and the predictive agent's own work {guest_side:+.0f} µs over the default agent's "
                 f"({held_d:.0f} µs). One dummy frame per period covers {share:.0%} of the gap")

    verdict = (f"So the predictive mode cannot come within 1.2× of the default's average on this host, "
               f"whatever the host does ({t_bound:.2f}× with the host holding FIFO): its agent's own work costs "
               "more than that." if t_bound > 1.2 else
               f"The predictive agent's own work leaves room for the 1.2× target in this run ({t_bound:.2f}× with the "
               "host holding FIFO): what the predictive mode has above that is the host's side.")
    watch = by["cosched_predict_watch"]
    hd = by["held_default"]
    held_default_note = (
        f"With the default's agent the same host tuning gave {held_d:.0f} µs, max {hd['max_us'] / 1000:.1f} ms "
        f"(the kernel's RT throttle), where the guard alone kept it to {guard['max_us'] / 1000:.1f} ms: that agent "
        "holds its CPU boost through the period, and the boost and the static guard's relief (nice -20 for "
        "100 ms of every second) appear to work against each other; not investigated here. That row is no "
        "floor."
        if hd["max_us"] > 20_000 else
        f"With the default's agent the same host tuning gave {held_d:.0f} µs ({held_d - held0:+.0f} µs over no "
        "agent).")

    jobs_ratio = "/".join(f"{a:.2f}" for a in (
        (ja["gzip_s"] + ja["bzip2_s"]) / (jb["gzip_s"] + jb["bzip2_s"]) for ja, jb in zip(
            sorted((r for r in rows if r["policy"] == "cosched_predict"), key=lambda r: r["rep"]),
            sorted((r for r in rows if r["policy"] == "cosched_paper"), key=lambda r: r["rep"]))))
    seed_ratio = "/".join(f"{a:.2f}" for a in (
        (ja["gzip_s"] + ja["bzip2_s"]) / (jb["gzip_s"] + jb["bzip2_s"]) for ja, jb in zip(
            sorted((r for r in rows if r["policy"] == "static_fifo"), key=lambda r: r["rep"]),
            sorted((r for r in rows if r["policy"] == "cosched_paper"), key=lambda r: r["rep"]))))
    targets = [
        target("predictive: host jobs ≤ 1.1× the paper's mode",
               f"{t_jobs:.2f}× ({total['cosched_predict']:.1f} against {total['cosched_paper']:.1f} s)", t_jobs <= 1.1,
               jobs_ratio),
        target("predictive: guest average ≤ 1.2× cosched's default",
               f"{t_avg:.2f}× ({pred['avg_us']:.0f} against {dflt['avg_us']:.0f} µs)", t_avg <= 1.2, rep_ratios),
        # Static FIFO's maximum can be the kernel's RT throttle, which the uncoordinated runs stay
        # below too: only below the uncoordinated maximum as well does the predictive mode show something.
        target("predictive: guest max below both the uncoordinated max and static FIFO's (static FIFO's alone "
               "proves little: it can be the kernel's RT throttle, which no coordination stays below too)",
               f"{pred['max_us']:.0f} against {unc['max_us']:.0f} µs uncoordinated and {fifo['max_us']:.0f} µs "
               "static FIFO", pred["max_us"] < unc["max_us"] and pred["max_us"] < fifo["max_us"],
               f"predictive {runs('cosched_predict', lambda r: r['max_us'])}; uncoordinated "
               f"{runs('none', lambda r: r['max_us'])}; static FIFO {runs('static_fifo', lambda r: r['max_us'])} µs"),
        target("the paper's co-scheduling: host jobs ≥ 1.5× as fast as static FIFO (the paper: \"even more than two "
               "times\")", f"{t_seed:.2f}×", t_seed >= 1.5, seed_ratio),
        target("separation: the default + a dummy frame per period, against the default",
               f"{t_probe:.2f}× ({probe['avg_us']:.0f} against {dflt['avg_us']:.0f} µs; predictive {pred['avg_us']:.0f} µs): "
               + (f"{share:.0%} of the gap to the predictive mode" if gap > 0 else
                  "no gap to separate (the predictive mode's average is not above the default's)"), None,
               f"dummy frame {runs('cosched_probe', lambda r: r['avg_us'])}; default "
               f"{runs('cosched', lambda r: r['avg_us'])} µs"),
        target("bound of the predictive mode as built: its agent with the host holding FIFO throughout, against "
               "cosched's default", f"{t_bound:.2f}× ({held_p:.0f} against {dflt['avg_us']:.0f} µs): "
               + ("the 1.2× target is out of reach for this agent on this host" if t_bound > 1.2 else
                  "does not bound the target"), None,
               f"held {runs('held_predict', lambda r: r['avg_us'])} µs"),
        *[target(f"the predictive mode with a longer least hold: {LABEL[h].split(', ')[-1]} ({DEFAULT_HOLD_MS:g} ms by "
                 "default), "
                 "against the default's average and the paper's host jobs",
                 f"guest average {by[h]['avg_us'] / dflt['avg_us']:.2f}× ({by[h]['avg_us']:.0f} µs; the default hold "
                 f"{t_avg:.2f}×); host jobs {total[h] / total['cosched_paper']:.2f}× ({total[h]:.1f} s; the default hold "
                 f"{t_jobs:.2f}×); final adapted hold {by[h]['hold_us']:.0f} µs (median), {by[h]['wakes']} WAKE "
                 f"frames (the default hold {pred['wakes']})", None,
                 f"average {runs(h, lambda r: r['avg_us'])} µs; jobs {runs(h, jobs)} s")
          for h in HOLD_ROWS if h in by],
        target("the paper's average and worst case (VxWorks guest): unchanged average, worst case 112 → 130 µs "
               "with co-scheduling", f"the paper's mode here {seed['avg_us']:.0f} µs average, {seed['max_us']:.0f} µs "
               "max; static FIFO " f"{fifo['avg_us']:.0f} / {fifo['max_us']:.0f} µs", None,
               f"{runs('cosched_paper', lambda r: r['avg_us'])} µs average"),
    ]

    o.summary("Co-scheduling vs static real-time tunings (Performance Tuning, Fig. 11 and 12)", f"""
The guest runs `cyclictest -p 80 -i 10000` (the timer-interrupt-to-task latency: the paper's PDLT,
the interrupt latency we can measure in this guest) and a CPU hog; the host runs gzip -6 ({gz}
passes) and bzip2 -9 ({bz} passes) over the same {mb} MB text at the same time, and a SCHED_OTHER
cyclictest pinned to the vCPU's (shielded) CPU stands in for that CPU's per-CPU kernel threads.
{reps} run(s) per policy (mean job times and averages, median p99, max of max); each repeat
runs every policy once, the first in the table's order, the others in a shuffled order (a fixed
seed per repeat), so that no policy always runs in the same place:

{md_table(agg, ["label", "gzip_s", "bzip2_s", "avg_us", "p99_us", "max_us", "kthread_avg_us", "kthread_max_us"],
          ["host policy", "gzip s", "bzip2 s", "guest avg µs", "guest p99 µs", "guest max µs",
           "kthread stand-in avg µs", "kthread stand-in max µs"])}

Both jobs together: no policy {total["none"]:.1f} s, static FIFO {total["static_fifo"]:.1f} s, static FIFO
with the RT guard {total["static_fifo_guard"]:.1f} s, shielding
{total["shield"]:.1f} s, shielding + FIFO {total["shield_fifo"]:.1f} s, the paper's co-scheduling
{total["cosched_paper"]:.1f} s, cosched's default {total["cosched"]:.1f} s (with a dummy frame per period
{total["cosched_probe"]:.1f} s), predictive boost {total["cosched_predict"]:.1f} s.

**Which cause the separation showed:** {cause}. The dummy frame (`cosched guest --probe-frames`:
at each RT activation that finds its CPU boosted already, `WAKE 0`, which the host acknowledges
and which changes nothing) goes where the paper's and the predictive modes send `CPU 1`, with its
detector event, the agent's wake-up, the write, the host's `ACK` and its read; host jobs with it
{total["cosched_probe"]:.1f} s against {total["cosched"]:.1f} s without.

**The guest's side, apart from the host's.** With the host holding the vCPU at FIFO throughout
(static FIFO 97/98 with the RT guard: FIFO 900 ms of every second, nice -20 the rest), the guest's average
is {held0:.0f} µs with no agent and {held_p:.0f} µs with the predictive mode's ({held_p - held0:+.0f} µs: its
detector programs, which run at every switch of the guest, emulated by TCG; its prediction stands,
so no frame goes out per period). The predictive mode with the host's own class changes:
{pred["avg_us"]:.0f} µs ({host_side:+.0f} µs: the host's side). {verdict} Host jobs: {total["held_predict"]:.1f} s
in that row. {held_default_note}

{per_run}

**The new-task heuristic in the predictive mode** (the agent's defaults, `--watch-budget-ms {WATCH_BUDGET_MS}`):
guest average {watch["avg_us"]:.0f} µs ({watch["avg_us"] / dflt["avg_us"]:.2f}× the default's), host jobs
{total["cosched_predict_watch"]:.1f} s. It keeps cyclictest's main thread (SCHED_OTHER, a 100 Hz
sleeper: each wake-up earns back more run time than it uses) watched, so every period has its
`CPU 1` and `CPU 0` again, at the main thread's wake-up; {watch["standing"]} periods were boosted by a
standing prediction there, against {pred["standing"]} without the heuristic.

Predictions (all runs of the predictive mode): {pred["wakes"]} predicted wake-ups told (each carried by
its `CPU 0`, as `WAKE` when that had gone out already, or standing), {pred["standing"]} periods boosted by a
standing prediction with no frame from the guest, {pred["predicted"]} predicted
boosts applied, {pred["confirmed"]} confirmed by the guest's `CPU 1`, {pred["unconfirmed"]} unconfirmed
(ended after the hold, charged to the prediction budget; the guest's `CPU 1` came after the hold
for {pred["late"]} of them); lead {pred["lead_us"]:.0f} µs and hold {pred["hold_us"]:.0f} µs (medians of the
runs' final adapted values); the guest's `CPU 1` came {pred["error_p50_us"]:.0f} µs after the predicted
time (median of the runs' p50); a planned boost was applied {pred["late_p50_us"]:.0f} µs late at the
median, {pred["late_p99_us"]:.0f} µs at the worst run's p99.

**Per-CPU kernel threads.** The stand-in waits longest under a static FIFO vCPU that shares its CPU
(max {fifo["kthread_max_us"]:.0f} µs; by run {runs('static_fifo', lambda r: r['kthread_max_us'])} µs: it runs
only when the vCPU sleeps or the kernel's RT throttle stops the vCPU) and under shielding + FIFO
({by["shield_fifo"]["kthread_max_us"]:.0f} µs; by run {runs('shield_fifo', lambda r: r['kthread_max_us'])}); with no
policy it waits {by["none"]["kthread_max_us"]:.0f} µs at most. Under cosched's default it waited up to
{dflt["kthread_max_us"]:.0f} µs (by run {runs('cosched', lambda r: r['kthread_max_us'])}; average
{dflt["kthread_avg_us"]:.0f} µs), under the predictive mode up to {pred["kthread_max_us"]:.0f} µs (by run
{runs('cosched_predict', lambda r: r['kthread_max_us'])}): a boosted vCPU at FIFO holds its CPU through its
boost. The daemon does not reprioritise kernel threads; it lists
those on shielded CPUs in `cosched status` and leaves the kernel's RT throttling on, which is what
bounds their wait under a static FIFO vCPU.

**The RT guard on static FIFO** (`[vm.NAME.static] guard = true`: the vCPUs at FIFO for at most
900 ms of every second, the rest at nice -20). What it saves: the guest's max goes from
{fifo["max_us"]:.0f} µs (the kernel's RT throttle stops the vCPU for up to 50 ms) to
{guard["max_us"]:.0f} µs, average {fifo["avg_us"]:.0f} → {guard["avg_us"]:.0f} µs. What it costs: the host
jobs take {total["static_fifo_guard"]:.1f} s against {total["static_fifo"]:.1f} s
({total["static_fifo_guard"] / total["static_fifo"]:.2f}×), and the kthread stand-in waits up to
{guard["kthread_max_us"]:.0f} µs (average {guard["kthread_avg_us"]:.0f}) against {fifo["kthread_max_us"]:.0f} µs
(average {fifo["kthread_avg_us"]:.0f}) under the throttle.

**Across machines.** The runs from 2026-12-01 on ran on a freshly set-up development machine (the
test guest built again by the same scripts). Their guest averages are higher than the earlier
runs' figures quoted below, so compare ratios within one run, not figures across runs: the figures
below from before that date are from the earlier set-up.

**The least hold's default** (`[rt] predict_hold_us`) was 2000 µs until two full runs of this
experiment on 2026-12-02, at b830a99 and 2b2ede8 (5 repeats each), ran the predictive mode with
2000, 1000 and 500 µs. Guest average against the default mode: 2000 µs 1.62× and 0.99×, 1000 µs
1.14× and 1.33×, 500 µs 1.00× and 1.04× (pooled over the 10 repeats: 630, 581 and 482 against
473 µs). Host jobs against the paper's mode: 1.05×/1.04×, 0.97×/1.05×, 0.99×/1.06×. Guest maximum:
2000 µs 30.3 and 45.7 ms, 500 µs 12.8 and 15.9 ms, against 21.8 and 26.9 ms uncoordinated: only
500 µs met all three predictive targets in both runs. The repeats' medians favour it less (450
against the default mode's 358 µs, pooled). The hold still grows past its least with late
confirmations, as before.

**The predictive mode's frames.** Since 2026-11-28 a periodic task's prediction stands (a `WAKE`
with its period, see docs/architecture.md): the host boosts every period by itself, and the guest
sends nothing while the activations fall inside the host's boost, where it sent two frames per
period before (`CPU 1` at the wake-up, `CPU 0` with the next wake-up after the hold). Separate
probe runs of one repeat each, same load (2026-11-28, before this run): with two frames per period
the predictive mode averaged 190-207 µs; the host holding FIFO with that agent 191 µs (the host's
side added nothing); standing, 129 µs against the default's 104 µs in the same probe. Full runs
the same day: at cf1b46f (two frames per period) predictive 206 µs against the default's 105 µs
(1.96×), host jobs 1.15× the paper's mode's; at 6b14115 (standing, never told again) 131 against
102 µs (1.29×; by repeat 136/132/124 against 99/101/105), host jobs 1.02×; at fbfc5a4 (told again
every second, but anchored on the wrong clock, which put the host's boosts off the wake-ups) 268
against 125 µs; at 7d36335 (anchored on the core's clock, 3 repeats) 152 against 121 µs (1.26×; by
repeat 193/138/125 against 102/125/135, so 1.89/1.10/0.93), host jobs 0.97×, which is why this run
has 5 repeats. A standing prediction's lead stays at its least (`predict_lead_min_us`, 500 µs):
the lead adapts to confirmations, and a standing prediction has none; probes with 1500 and 2000
µs gave the same averages (124-126 µs against 125 µs at 500).

Earlier: since 2026-11-28 a deboost carries the next wake-up (`CPU 0` with bit 17): two frames
per period where there were three (`CPU 1`, `CPU 0`, `WAKE`). In the
full run before (2026-11-24, three frames per period) the predictive mode's average was 424 µs
against the default's 234 µs (1.81×), host jobs 16.0 s against the paper's mode's 16.4 s, the
predicted boosts applied a median of -2 µs from their plan and 98-99% confirmed. A longer lead
did not help there: with `predict_lead_min_us = 2000` (a separate probe, 2 runs each, same load)
the guest average was 300-321 µs against 291-318 µs with 500 µs, and the host jobs took
16.7-19.0 s against 15.6-16.0 s; cosched's default gave 133-204 µs there.

The run before this one (2026-11-28 at 0c90a83), whose repeats all ran the policies in one order
(the default, then the dummy frame, then the predictive mode, last): predictive 262 µs against
the default's 173 µs (1.51×), host jobs 17.3 against 14.6 s (1.18×); the dummy frame 250 µs,
87% of the gap (77%, 66%, 135% by repeat). With the order shuffled, the dummy frame's share fell
to the 35-42% of the run at cf1b46f, the same in every repeat: the frame costs, but it is not most of the
gap.

A full run earlier on 2026-11-24 (before the hold adapted to late confirmations): no policy 16.2 s,
static FIFO 24.6 s (guest 721 µs avg, 52.8 ms max), static FIFO + guard 21.8 s (307 µs, 5.0 ms),
the paper's mode 19.5 s (1.26× as fast as static FIFO; guest 1059 µs avg), cosched's default
25.5 s (389 µs), predictive 21.5 s (681 µs avg, 7.8 ms max, 900 of 7244 predictions unconfirmed).

**The paper** (Performance Tuning, sec. 5.5, VxWorks guest with CPU load, SPEC2000 jobs on the host): with
co-scheduling the general-purpose jobs ran "much faster (even more than two times)" than with
static prioritization (vCPU FIFO 97, I/O thread 98); the RT task's average latency did not change,
its worst case rose from 112 to 130 µs. Shielding and prioritization each brought the maximum down
to about 100 µs (Fig. 9, 10), with averages unchanged. Ours: static FIFO {fifo["avg_us"]:.0f} µs
average, {fifo["max_us"]:.0f} µs max; shielding {by["shield"]["avg_us"]:.0f} / {by["shield"]["max_us"]:.0f} µs;
the paper's co-scheduling {seed["avg_us"]:.0f} / {seed["max_us"]:.0f} µs with host jobs {t_seed:.2f}× as fast
as under static FIFO.

Earlier run (2026-11-21, before the guest's priority, shielding + FIFO and prediction): no policy
16.6 s, static FIFO 21.7 s, shielding 22.6 s, the paper's mode 16.9 s (1.28× as fast as static),
cosched's default 25.0 s with guest average 275 µs and max 9.4 ms (static FIFO: 52 ms max).
""", targets=targets)
    return o.dir
