"""Experiment 5: the guest agent's overhead (FEAS, Table 2), and the host's run-delay measure's.

In one boot of the guest (host idle, daemon running so the agent registers and attaches), a fixed
CPU-bound job (trial-division prime search, as in the FEAS paper) and a context-switch-heavy job (pipe
ping-pong) run alternately without and with the agent, round after round, so that drifts of this
shared machine hit both sides alike. We report each job's slowdown with the agent.

The run delay (the daemon's host BPF timing each vCPU's waits, `[event] run_delay`) cannot be
switched within a boot: the same jobs run without the agent in two more boots, one with it off and
one on, and we report each job's slowdown with it on.
"""

import statistics
from pathlib import Path

import matplotlib.pyplot as plt

import harness
from experiments.common import Output, log, md_table, read_csv, target

NAME = "overhead"
# part: "agent" (without and with the agent, one boot) or "run-delay" (the daemon's run_delay off
# and on, one boot each, no agent).
COLUMNS = ["part", "round", "agent", "run_delay", "job", "us"]
# The target: the agent slows the CPU-bound job by under this many %.
PRIMES_TARGET_PCT = 0.5
# The paper (FEAS, Table 2, prime search below 10^7): seconds without and with its scheduler.
PAPER = {"with other domains busy": (32.43754, 32.5931), "all idle": (8.78261, 8.80411),
         "in Domain 0": (8.123744, 8.146923)}


def plan(quick):
    """(rounds, primes limit, ping-pong round trips)."""
    return (2, 300_000, 2_000) if quick else (20, 3_000_000, 20_000)


def body(rounds, limit, trips):
    return f"""cosched-tools primes {limit // 10} >/dev/null   # warm up
echo "COSCHED-MEASURE-START"
r=1
while [ $r -le {rounds} ]; do
    echo "ROUND $r off"; cosched-tools primes {limit}; cosched-tools pingpong {trips}
    cosched guest 2>/tmp/agent.$r.log &
    A=$!
    until grep -q "detectors attached" /tmp/agent.$r.log 2>/dev/null; do sleep 0.05; done
    echo "ROUND $r on"; cosched-tools primes {limit}; cosched-tools pingpong {trips}
    kill $A; wait $A
    r=$((r+1))
done
echo "COSCHED-MEASURE-END"
"""


def delay_body(rounds, limit, trips):
    """The jobs alone, `rounds` times (no agent): for the run-delay part."""
    return f"""cosched-tools primes {limit // 10} >/dev/null   # warm up
echo "COSCHED-MEASURE-START"
r=1
while [ $r -le {rounds} ]; do
    echo "ROUND $r off"; cosched-tools primes {limit}; cosched-tools pingpong {trips}
    r=$((r+1))
done
echo "COSCHED-MEASURE-END"
"""


def parse(console):
    rows, cur = [], None
    for line in console.splitlines():
        p = line.strip().split()
        if p[:1] == ["ROUND"]:
            cur = (int(p[1]), p[2] == "on")
        elif p[:1] in (["primes"], ["pingpong"]) and cur:
            rows.append(dict(round=cur[0], agent=int(cur[1]), job=p[0], us=int(p[2])))
    return rows


def slowdowns(rows, key="agent"):
    """Each job's slowdown with `key` (agent, run_delay) on, over rows that differ only in it."""
    out = []
    for job in ("primes", "pingpong"):
        off = [r["us"] for r in rows if r["job"] == job and not r[key]]
        on = [r["us"] for r in rows if r["job"] == job and r[key]]
        # Paired by round: each "on" next to its own "off".
        pairs = [100.0 * (b - a) / a for a, b in zip(off, on)]
        out.append(dict(job=job, runs=len(pairs), off_ms=statistics.mean(off) / 1000,
                        on_ms=statistics.mean(on) / 1000,
                        slowdown_pct=100.0 * (statistics.mean(on) - statistics.mean(off)) / statistics.mean(off),
                        median_pct=statistics.median(pairs),
                        slower=sum(p > 0 for p in pairs),
                        sd_pct=statistics.stdev(pairs) if len(pairs) > 1 else 0.0))
    return out


def sign_test_threshold(n, alpha=0.05):
    """The fewest of n paired rounds that must be slower for a two-sided sign test at alpha."""
    from math import comb
    for k in range(n // 2 + 1, n + 1):
        if sum(comb(n, i) for i in range(k, n + 1)) / 2 ** n <= alpha / 2:
            return k
    return n + 1


def measure(quick, verbose=False):
    """The agent part (one boot, without and with the agent, round by round) and the run-delay part
    (one boot each with the daemon's run_delay off and on): rows as data.csv has them."""
    rounds, limit, trips = plan(quick)
    r = harness.run(body(rounds, limit, trips), policy="cosched", start_agent=False, tools=True, verbose=verbose)
    rows = [dict(x, part="agent", run_delay=1) for x in parse(r["console"])]
    if len(rows) != rounds * 4:
        raise RuntimeError(f"expected {rounds * 4} measurements, got {len(rows)}:\n" + r["console"][-2000:])
    delay_rows = []
    for on in (0, 1):
        r = harness.run(delay_body(rounds, limit, trips), policy="cosched", start_agent=False, tools=True,
                        daemon_config=f"[event]\nrun_delay = {'true' if on else 'false'}\n", verbose=verbose)
        got = [dict(x, part="run-delay", run_delay=on) for x in parse(r["console"])]
        if len(got) != rounds * 2:
            raise RuntimeError(f"expected {rounds * 2} measurements, got {len(got)}:\n" + r["console"][-2000:])
        delay_rows += got
    return rows + delay_rows


def stored(directory):
    """The rows of a run's data.csv (results/overhead), as measure() returned them. A run from
    before the run-delay part has only the agent part's columns (round, agent, job, us)."""
    return read_csv(Path(directory) / "data.csv", text=("part", "job"))


def paired(rows, job, key="agent"):
    """Each round's slowdown in % with `key` on, against the same round's run with it off."""
    off = {r["round"]: r["us"] for r in rows if r["job"] == job and not r[key]}
    on = {r["round"]: r["us"] for r in rows if r["job"] == job and r[key]}
    return [(n, 100.0 * (on[n] - off[n]) / off[n]) for n in sorted(off) if n in on]


def resolution(s):
    """What this run can resolve of a slowdown: 2 standard errors of the paired differences, in %."""
    return 2 * s["sd_pct"] / max(1, s["runs"]) ** 0.5


def targets(sd, rd):
    """The targets table: the CPU-bound job's slowdown under 0.5% (met only if the run shows it:
    the slowdown plus its 2 standard errors under the target), the rest as figures without a target."""
    primes, ping = sd[0], sd[1]
    res = resolution(primes)
    shown = primes["slowdown_pct"] + res < PRIMES_TARGET_PCT

    def spread(s):
        return (f"paired rounds: median {s['median_pct']:+.1f}%, sd {s['sd_pct']:.1f}%, {s['slower']} of {s['runs']} "
                "slower")
    out = [
        target(f"the agent slows a CPU-bound job (prime search) by under {PRIMES_TARGET_PCT}%, as this run can show it "
               "(the slowdown plus 2 standard errors of the paired rounds under the target)",
               f"{primes['slowdown_pct']:+.2f}% (ratio of the means), ± {res:.1f}%"
               + ("" if shown else f": this run cannot show it under {PRIMES_TARGET_PCT}%"), shown, spread(primes)),
        target("a context-switch-heavy job (pipe ping-pong) with the agent: reported as it is",
               f"{ping['slowdown_pct']:+.2f}% (ratio of the means)", None, spread(ping)),
    ]
    for s in rd:
        out.append(target(f"the host's run-delay measure, on against off: {s['job']} (one boot each, unpaired)",
                          f"{s['slowdown_pct']:+.2f}% (ratio of the means)", None,
                          f"round by round: median {s['median_pct']:+.1f}%, sd {s['sd_pct']:.1f}%"))
    out.append(target("the paper (FEAS, Table 2, prime search below 10^7): " + ", ".join(
        f"{a:.2f} → {b:.2f} s ({100 * (b - a) / a:+.2f}%) {where}" for where, (a, b) in PAPER.items())
        + ': "less than 1%"', f"{primes['slowdown_pct']:+.2f}% here, host idle", None))
    return out


def plot(rows):
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.5))
    for ax, job in zip(axes, ("primes", "pingpong")):
        for agent, color in ((0, "tab:gray"), (1, "tab:green")):
            rs = [r for r in rows if r["job"] == job and r["agent"] == agent]
            ax.plot([r["round"] for r in rs], [r["us"] / 1000 for r in rs], marker="o", color=color,
                    label="with the agent" if agent else "without")
        ax.set_xlabel("round")
        ax.set_ylabel("job time (ms)")
        ax.set_title("prime search (CPU-bound)" if job == "primes" else "pipe ping-pong (context switches)",
                     fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    # The target the summary judges: the prime search's slowdown, round by round, its mean and
    # the band this run resolves, against the 0.5% line.
    ax = axes[2]
    for job, color in (("primes", "tab:green"), ("pingpong", "tab:orange")):
        pts = paired(rows, job)
        ax.plot([n for n, _ in pts], [p for _, p in pts], marker="o", linestyle="none", color=color,
                label=f"{'prime search' if job == 'primes' else 'ping-pong'}, each round")
    primes = slowdowns(rows)[0]
    res = resolution(primes)
    ax.axhspan(primes["slowdown_pct"] - res, primes["slowdown_pct"] + res, color="tab:green", alpha=0.15,
               label=f"prime search: ratio of the means {primes['slowdown_pct']:+.2f}% ± {res:.1f}% (2 standard errors)")
    ax.axhline(primes["slowdown_pct"], color="tab:green")
    ax.axhline(PRIMES_TARGET_PCT, color="black", linestyle=":", label=f"target: prime search under {PRIMES_TARGET_PCT}%")
    ax.axhline(0, color="gray", linewidth=0.8)
    ax.set_xlabel("round")
    ax.set_ylabel("slowdown with the agent, % (paired by round)")
    ax.set_title("Slowdown against the target", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    fig.suptitle("Guest agent overhead (FEAS, Table 2)")
    return fig


def main(quick, out=None, verbose=False, fresh=False, rows=None):
    """Measures, or (rows: stored() of an earlier run) renders summary and plot again from its data."""
    o = Output(NAME, quick, out, fresh)
    if rows is None:
        rows = measure(quick, verbose)
    agent_rows = [r for r in rows if r.get("part", "agent") == "agent"]
    delay_rows = [r for r in rows if r.get("part") == "run-delay"]
    if not (o.rendered and (o.dir / "data.csv").exists()):  # a rendering keeps the data as measured
        o.csv(rows, COLUMNS)
    o.png(plot(agent_rows))
    rounds = max(r["round"] for r in agent_rows)
    limit, trips = plan(quick)[1:]
    sd = slowdowns(agent_rows)
    rd = slowdowns(delay_rows, "run_delay") if delay_rows else []
    for s in rd:
        log(f"run delay {s['job']}: {s['off_ms']:.1f} ms -> {s['on_ms']:.1f} ms ({s['slowdown_pct']:+.2f}%)")
    for s in sd:
        log(f"{s['job']}: {s['off_ms']:.1f} ms -> {s['on_ms']:.1f} ms ({s['slowdown_pct']:+.2f}%)")
    primes = sd[0]
    # The resolution of this measurement: 2 standard errors of the paired differences.
    res = resolution(primes)
    if primes["slowdown_pct"] + res < PRIMES_TARGET_PCT:
        verdict = f"under the {PRIMES_TARGET_PCT}% target"
    elif abs(primes["slowdown_pct"]) <= res:
        verdict = (f"within this machine's noise (2 standard errors of the paired differences: ±{res:.1f}%), so "
                   f"this run cannot show it under the {PRIMES_TARGET_PCT}% target, nor over it")
    else:
        verdict = f"NOT under the {PRIMES_TARGET_PCT}% target (beyond the ±{res:.1f}% noise of 2 standard errors)"
    k = sign_test_threshold(primes["runs"])
    sign = (f"a sign test needs {k} of {primes['runs']} to call that a slowdown at 5%, "
            + ("and it does" if primes["slower"] >= k else "so it does not settle it either"))
    delay_text = (f"""The host's run-delay measure (`[event] run_delay`, on by default: a map lookup and a per-CPU
histogram update at each switch in of a vCPU thread), off and on, the same jobs without the agent
in one boot each (so unpaired: between boots the machine may drift more than within one):

{md_table(rd, ["job", "runs", "off_ms", "on_ms", "slowdown_pct", "median_pct", "sd_pct"],
          ["job", "rounds", "run delay off ms", "on ms", "slowdown %", "median of round-by-round %",
           "sd of round-by-round %"])}

Its cost is per switch of a vCPU thread on the host, so it grows with how often the vCPUs block
and wake (a guest that idles, sleeps or waits for I/O), not with what they compute.""" if rd else
                  "The host's run-delay measure (`[event] run_delay`) off and on: not measured in this run "
                  "(its data.csv has the agent part only).")
    o.summary("Guest agent overhead (FEAS, Table 2)", f"""
A prime search below {limit} by trial division (CPU-bound, as in the FEAS paper) and {trips} pipe
ping-pong round trips (2 context switches each), alternately without and with `cosched guest`
attached, {rounds} rounds in one boot, host idle:

{md_table(sd, ["job", "runs", "off_ms", "on_ms", "slowdown_pct", "median_pct", "sd_pct", "slower"],
          ["job", "rounds", "without ms", "with ms", "slowdown %", "median of paired %", "sd of paired %",
           "rounds slower with the agent"])}

The CPU-bound job's slowdown is {primes['slowdown_pct']:+.2f}% (ratio of the means), {verdict}. The
robust view: the median of the paired differences is {primes['median_pct']:+.1f}%, and
{primes['slower']} of {primes['runs']} rounds were slower with the agent; {sign}. One round differs from the
next by ±{primes['sd_pct']:.0f}% here (a TCG guest on a shared machine). The context-switch-heavy
job pays for the BPF programs on every switch and wake-up: {sd[1]['slowdown_pct']:+.2f}%.

{delay_text}

**The paper** (FEAS, Table 2, prime search below 10^7): {", ".join(f"{a:.2f} -> {b:.2f} s ({100 * (b - a) / a:+.2f}%) {where}" for where, (a, b) in PAPER.items())}: "less than 1%".
""", targets=targets(sd, rd))
    return o.dir
