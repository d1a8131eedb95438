"""Experiment `membw` (DREAMS D2.2.3 §2, MemGuard for VMs): the daemon's memory-bandwidth regulator
(`cosched_core::membw`, the same code `cosched host` runs) driven by a model of the memory system
(`cosched-membw-sim`), since this host has neither resctrl nor PMU counters.

A guaranteed VM ("rt", 70% of the guaranteed bandwidth, as the paper's first guest) streams beside
two bandwidth hogs (20% and no share); it is idle from 1.0 to 1.5 s. Five policies: unregulated,
regulated without reclaim or best effort, with reclaim, with best effort, with both. The same with
an rt whose work arrives at exactly its guarantee (700 MB/s) instead of streaming.

`--real G` (a host with PMU counters, and resctrl MBA or the cgroup freezer to hold VMs back):
the same three VMs as real guests running a memory-streaming program under the daemon's `pmu`
backend, G MB/s declared guaranteed; each VM's bandwidth is the daemon's own measure
(`last_period_mbps` in `cosched status`). Only a run on such a host writes results/membw-real:
this one has no PMU counters, so that result does not exist here. On a host without counters the
run stops at once with the daemon's reason and writes nothing.

main(..., rows=stored(dir)) renders the simulated run's summary and plot again from its data.csv
(and stops.csv) without simulating."""

import csv
import json
import subprocess
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt

import harness
from evaluation import NOT_JUDGED
from experiments.common import Output, log, md_table, target

NAME = "membw"
COLUMNS = ["demand", "mode", "t_ms", "vm", "mbps", "guarantee_mbps", "throttled_ms"]
SIM = harness.COSCHED.parent / "cosched-membw-sim"
G, CAPACITY, PERIOD_MS, CHECKS, DURATION_MS = 1000, 1250, 10, 10, 2000
IDLE = (1000, 1500)
MODES = {
    "unregulated": None,
    "guarantees only": (False, False),
    "reclaim": (True, False),
    "best effort": (False, True),
    "reclaim + best effort": (True, True),
}
COLORS = {"rt": "tab:blue", "hog1": "tab:red", "hog2": "tab:orange"}
# Each stop of a VM that reached its limit: how long after it reached it (the regulator's check).
STOP_COLUMNS = ["demand", "mode", "vm", "t_ms", "latency_ms"]
# The targets: the guaranteed VM gets at least this share of its guarantee whatever its neighbours
# do; unused budget is lent, and a VM over budget stopped, within one period.
GUARANTEE_PCT = 95


def stored(directory=None):
    """The simulated run's rows (data.csv), typed as main() makes them: main(quick, out=directory,
    rows=stored(directory)) renders them again (with stops.csv from the same directory, where the
    run kept one)."""
    d = Path(directory or harness.REPO / "results" / NAME)
    with open(d / "data.csv", newline="") as f:
        return [dict(r, t_ms=float(r["t_ms"]), mbps=float(r["mbps"]), guarantee_mbps=float(r["guarantee_mbps"]),
                     throttled_ms=float(r["throttled_ms"])) for r in csv.DictReader(f)]


def stored_stops(directory):
    """stops.csv of a simulated run, None where it kept none."""
    path = Path(directory) / "stops.csv"
    if not path.exists():
        return None
    with open(path, newline="") as f:
        return [dict(r, t_ms=float(r["t_ms"]), latency_ms=float(r["latency_ms"])) for r in csv.DictReader(f)]


def reports_of(rows, stops):
    """{(demand, mode): the simulator's report} rebuilt from data.csv's rows and stops.csv ("stops"
    None where they were not kept)."""
    reports = {}
    for r in rows:
        rep = reports.setdefault((r["demand"], r["mode"]), {"periods": [], "stops": None if stops is None else []})
        if not rep["periods"] or rep["periods"][-1]["t_ms"] != r["t_ms"]:
            rep["periods"].append({"t_ms": r["t_ms"], "vms": []})
        rep["periods"][-1]["vms"].append({"name": r["vm"], "mbps": r["mbps"], "guarantee_mbps": r["guarantee_mbps"],
                                          "throttled_ms": r["throttled_ms"]})
    for st in stops or []:
        reports[(st["demand"], st["mode"])]["stops"].append({"name": st["vm"], "t_ms": st["t_ms"],
                                                             "latency_ms": st["latency_ms"]})
    return reports


def scenario(mode, demand):
    flags = MODES[mode]
    regulator = None if flags is None else {
        "guaranteed_mbps": G, "period_ns": PERIOD_MS * 1_000_000, "reclaim": flags[0], "best_effort": flags[1]}
    rt = "stream" if demand == "stream" else {"rate": 700}

    def vm(name, share, demand):
        return {"name": name, "share": share, "max_mbps": 1500, "demand": demand}
    return {
        "config": {"regulator": regulator, "capacity_mbps": CAPACITY, "checks_per_period": CHECKS,
                   "duration_ms": DURATION_MS, "report_ms": PERIOD_MS},
        "vms": [vm("rt", 700, [[0, rt], [IDLE[0], "idle"], [IDLE[1], rt]]),
                vm("hog1", 200, [[0, "stream"]]), vm("hog2", 0, [[0, "stream"]])],
    }


def simulate(mode, demand):
    out = subprocess.run([str(SIM)], input=json.dumps(scenario(mode, demand)), capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def mean(report, vm, lo, hi):
    xs = [v["mbps"] for p in report["periods"] if lo <= p["t_ms"] < hi for v in p["vms"] if v["name"] == vm]
    return sum(xs) / len(xs)


def over_budget(report, strict):
    """The VMs that went over their budget in a regulated run: held back in some period (the
    regulator stopped them at their limit), or, `strict` (no lending, no best effort: the budget is
    the guarantee), moved more than their guarantee in some period."""
    return sorted({v["name"] for p in report["periods"] for v in p["vms"]
                   if v["throttled_ms"] > 0 or (strict and v["mbps"] > v["guarantee_mbps"] + 0.5)})


def figures(report, regulated, strict=False):
    """What the targets are judged on (the first 100 ms and the first period after each change
    are the transition). strict: guarantees only (a VM's budget is its guarantee)."""
    rt_on = (mean(report, "rt", 100, IDLE[0]) * 9 + mean(report, "rt", IDLE[1] + PERIOD_MS, DURATION_MS) * 4.9) / 13.9
    lent = next((p["t_ms"] - IDLE[0] for p in report["periods"] if regulated and p["t_ms"] >= IDLE[0]
                 and any(v["name"] == "hog1" and v["mbps"] > 2 * v["guarantee_mbps"] for v in p["vms"])), None)
    stops = [s["latency_ms"] for s in report["stops"] or []]
    return {
        "rt_mbps": round(rt_on), "rt_pct": round(100 * rt_on / 700, 1) if regulated else "",
        "hog1_mbps": round(mean(report, "hog1", 100, IDLE[0])), "hog2_mbps": round(mean(report, "hog2", 100, IDLE[0])),
        "hog1_idle_mbps": round(mean(report, "hog1", IDLE[0] + PERIOD_MS, IDLE[1])),
        "total_mbps": round(sum(mean(report, v, 100, IDLE[0]) for v in ("rt", "hog1", "hog2"))),
        "lent_after_ms": "" if lent is None else round(lent, 1),
        "stops": len(stops) if report["stops"] is not None else "", "max_stop_ms": round(max(stops), 2) if stops else "",
        # The VMs over their budget that no stop was recorded for ([] where the stops were not kept).
        "unstopped": [] if report["stops"] is None or not regulated else
        [vm for vm in over_budget(report, strict) if vm not in {st["name"] for st in report["stops"]}],
    }


def plot(reports):
    fig, axes = plt.subplots(len(MODES), 2, figsize=(14, 2.6 * len(MODES)), sharex=True, sharey=True)
    for col, demand in enumerate(("stream", "rate")):
        for row, mode in enumerate(MODES):
            ax = axes[row][col]
            r = reports[(demand, mode)]
            for vm in ("rt", "hog1", "hog2"):
                t = [p["t_ms"] / 1000 for p in r["periods"]]
                y = [next(v["mbps"] for v in p["vms"] if v["name"] == vm) for p in r["periods"]]
                ax.plot(t, y, color=COLORS[vm], linewidth=0.8, label=vm)
                if MODES[mode] is not None:
                    g = [next(v["guarantee_mbps"] for v in p["vms"] if v["name"] == vm) for p in r["periods"]]
                    ax.plot(t, g, color=COLORS[vm], linestyle="--", linewidth=0.8)
                    if vm == "rt":
                        # The target: rt at GUARANTEE_PCT of its guarantee while it runs.
                        ax.plot(t, [x * GUARANTEE_PCT / 100 for x in g], color="black", linestyle=":",
                                linewidth=0.8, label=f"target: rt ≥ {GUARANTEE_PCT}% of its guarantee"
                                if (row, col) == (1, 0) else None)
            ax.set_title(f"{mode}, rt {'streams' if demand == 'stream' else 'needs 700 MB/s'}", fontsize=9)
            ax.set_ylabel("MB/s")
            ax.grid(True, alpha=0.3)
            if (row, col) in ((0, 0), (1, 0)):
                ax.legend(fontsize=7, loc="upper right")
    for ax in axes[-1]:
        ax.set_xlabel("time (s); dashed: guarantee")
    fig.suptitle(f"Memory bandwidth per 10 ms period; G = {G} MB/s guaranteed, {CAPACITY} MB/s deliverable; "
                 f"dotted: {GUARANTEE_PCT}% of rt's guarantee (the target)")
    fig.tight_layout()
    return fig


def main(quick, out=None, verbose=False, fresh=False, real_mbps=None, rows=None, stops=None):
    """rows: a simulated run's data.csv rows (stored(dir)), to render its summary and plot again
    without simulating (its files are left as they are); stops: its stops, by default stops.csv of
    the output directory where there is one."""
    if real_mbps is not None:
        return real(real_mbps, quick, out, verbose, fresh)
    o = Output(NAME, quick, out, fresh)
    if rows is None:
        reports, rows, stops = {}, [], []
        for demand in ("stream", "rate"):
            for mode in MODES:
                r = simulate(mode, demand)
                reports[(demand, mode)] = r
                for p in r["periods"]:
                    for v in p["vms"]:
                        rows.append(dict(demand=demand, mode=mode, t_ms=p["t_ms"], vm=v["name"],
                                         mbps=round(v["mbps"], 1), guarantee_mbps=v["guarantee_mbps"],
                                         throttled_ms=v["throttled_ms"]))
                stops += [dict(demand=demand, mode=mode, vm=st["name"], t_ms=st["t_ms"], latency_ms=st["latency_ms"])
                          for st in r["stops"]]
        o.csv(rows, COLUMNS)
        o.csv(stops, STOP_COLUMNS, "stops.csv")
    else:
        stops = stops if stops is not None else stored_stops(o.dir)
        reports = reports_of(rows, stops)
    table = []
    for (demand, mode), r in reports.items():
        f = figures(r, MODES[mode] is not None, MODES[mode] == (False, False))
        table.append(dict(demand="streams" if demand == "stream" else "700 MB/s", mode=mode, **f))
        log(f"membw {demand} {mode}: {f}")
    o.png(plot(reports))
    md = md_table(table, ["demand", "mode", "rt_mbps", "rt_pct", "hog1_mbps", "hog2_mbps", "hog1_idle_mbps",
                          "total_mbps", "lent_after_ms", "stops", "max_stop_ms"],
                  ["rt wants", "policy", "rt MB/s", "rt % of 700", "hog1 (20%)", "hog2 (0%)",
                   "hog1 while rt idle", "total", "lent after (ms)", "stops", "max stop latency (ms)"])
    by = {(t["demand"], t["mode"]): t for t in table}
    stream = {m: by[("streams", m)] for m in MODES if ("streams", m) in by}
    stops_note = ("" if stops is not None else
                  "\n\nThe stops (each VM stopped at its limit, and how long after it reached it) are not in this "
                  "run's data files: the run that made them kept only the bandwidth per period (data.csv), so the "
                  "target that a VM over its budget is stopped within one period is not judged here (the stops "
                  "columns are empty). A run now writes them to stops.csv.")
    o.summary("Memory-bandwidth regulation (DREAMS D2.2.3 §2, MemGuard for VMs), simulated", f"""
The daemon's regulator, on a model of the memory system: {G} MB/s guaranteed (the shares divide
it), {CAPACITY} MB/s deliverable, a {PERIOD_MS} ms period read {CHECKS} times. "rt" holds 70%,
"hog1" 20%, "hog2" nothing; rt is idle from {IDLE[0] / 1000} to {IDLE[1] / 1000} s. Each VM moves
at most 1500 MB/s alone; contending VMs share the memory system in proportion to what they ask.
rt either streams (as the paper's buffer-copy benchmark) or has 700 MB/s of work arriving, which it
catches up on when it can. Judged from 100 ms on, leaving out the first period after rt returns.

Our setup: this host has neither resctrl nor PMU counters, so the counters are the model's; the
policy code is the daemon's own (`cosched-membw-sim` runs `cosched_core::membw::sim`). Command:
`/usr/bin/python3 bench/experiment.py membw` (the same with `--quick`: it is fast). On a host with
PMU counters, `bench/experiment.py membw --real G` measures real guests and writes
results/membw-real; it has never run here, so there is no such result.

{md}

A VM moves up to one check's worth past its budget before it is stopped (up to
{CAPACITY * PERIOD_MS / CHECKS / 1000:.2f} MB at the {CAPACITY} MB/s the model delivers, checked every
{PERIOD_MS / CHECKS:g} ms).{stops_note}

**The paper** (DREAMS D2.2.3 §2.4 and §2.7, Juno board, real MemGuard): a reclaim experiment where a
task limited to 240 MB/s reaches 590 MB/s with reclaim; two guests at 70% and 20% of the
guaranteed bandwidth, each held to its share (Fig. 7, no numbers given); mplayer decoding with a
correct reservation for its core and best effort for the others: 59.9 s vs 60.3 s unregulated, and
95.6 s instead of 276.0 s for the best-effort core (Table 1).
""", targets=targets(table, stops is not None, stream))
    return o.dir


def targets(table, stops_known, stream):
    """The simulation's targets, judged from its per-mode figures (figures())."""
    regulated = [t for t in table if t["rt_pct"] != ""]
    out = []
    if regulated:
        worst = min(regulated, key=lambda t: t["rt_pct"])
        out.append(target(f"the guaranteed VM (rt, 700 MB/s) gets ≥ {GUARANTEE_PCT}% of its guarantee in every "
                          "regulated mode, whatever its neighbours do",
                          f"worst {worst['rt_pct']}% ({worst['mode']}, rt {worst['demand']}); "
                          f"{min(t['rt_pct'] for t in regulated)}-{max(t['rt_pct'] for t in regulated)}% over the "
                          f"{len(regulated)} regulated runs", worst["rt_pct"] >= GUARANTEE_PCT,
                          "a deterministic simulation: no repeats"))
    lends = [t for t in regulated if "reclaim" in t["mode"]]
    if lends:
        ok = all(t["lent_after_ms"] != "" and t["lent_after_ms"] <= PERIOD_MS for t in lends)
        out.append(target(f"unused budget is lent within one period ({PERIOD_MS} ms): hog1 above twice its guarantee "
                          "after rt goes idle, with reclaim",
                          ", ".join(f"{t['lent_after_ms'] if t['lent_after_ms'] != '' else 'never'}"
                                    + (" ms" if t["lent_after_ms"] != "" else "") for t in lends)
                          + f" ({len(lends)} runs with reclaim)", ok, ""))
    statement = f"a VM over its budget is stopped within one period ({PERIOD_MS} ms)"
    if not stops_known:
        out.append(target(statement, "not measured in this run (its data files keep no stops: no stops.csv)",
                          NOT_JUDGED))
    elif regulated:
        with_stops = [t for t in regulated if t["max_stop_ms"] != ""]
        worst = max((t["max_stop_ms"] for t in with_stops), default=None)
        # Met only by recorded stops, all within a period, and a stop for every VM over its budget.
        unstopped = [f"{vm} ({t['mode']}, rt {t['demand']})" for t in regulated for vm in t["unstopped"]]
        measured = (f"worst {worst} ms after it reached its limit, {sum(t['stops'] for t in regulated)} stops"
                    if worst is not None else "no stop recorded")
        if unstopped:
            measured += "; over its budget with no stop recorded: " + ", ".join(unstopped)
        if worst is None and not unstopped:
            out.append(target(statement, "no stop recorded, and no VM over its budget: nothing to judge", NOT_JUDGED))
        else:
            out.append(target(statement, measured, worst is not None and worst <= PERIOD_MS and not unstopped, ""))
    un = stream.get("unregulated")
    if un:
        out.append(target("unregulated, for reference: rt streaming beside the two hogs",
                          f"rt {un['rt_mbps']} MB/s = {100 * un['rt_mbps'] / 700:.1f}% of 700", None))
    rec = stream.get("reclaim")
    if rec:
        out.append(target("DREAMS D2.2.3 §2.4 (the paper's figure): a task limited to 240 MB/s reaches 590 MB/s "
                          "with reclaim", f"here, with reclaim: hog1 (200 MB/s guaranteed) at {rec['hog1_idle_mbps']} "
                          "MB/s while rt idles", None))
    be, go = stream.get("best effort"), stream.get("guarantees only")
    if be and go:
        out.append(target("DREAMS D2.2.3 §2.7, Table 1 (the paper's figure): best effort lets the cores without a "
                          "correct reservation finish in 95.6 s instead of 276.0 s",
                          f"here, best effort lifts the hogs from {go['hog1_mbps']} and {go['hog2_mbps']} MB/s to "
                          f"{be['hog1_mbps']} and {be['hog2_mbps']} MB/s (rt {be['rt_pct']}% of its guarantee)", None))
    return out


# ---------------------------------------------------------------------------------------------
# --real: guests streaming memory under the daemon's pmu backend

REAL_SHARES = {"rt": 700, "hog1": 200, "hog2": 0}
# rt streams STREAM_S seconds, then idles IDLE_S seconds, over and over; the hogs always stream.
STREAM_S, IDLE_S = 4, 2
SAMPLE_S = 0.05
REAL_COLUMNS = ["mode", "t_s", "vm", "mbps", "guarantee_mbps", "throttled", "throttles"]

# One `dd` of 32 MiB from /dev/zero: the kernel clears the buffer (a write stream far larger than
# any cache); 4 of them per run keep the tail after a kill short.
REAL_WORKLOAD = """#!/bin/sh
stream() {{ while :; do dd if=/dev/zero of=/dev/null bs=32M count=4 2>/dev/null; done; }}
echo "COSCHED-MEMBW-READY"
if [ {rt} = 1 ]; then
    while :; do stream & S=$!; sleep {stream_s}; kill $S; wait $S 2>/dev/null; sleep {idle_s}; done
else
    stream
fi
"""


def real_config(guaranteed_mbps, regulated):
    """The daemon's config: pmu counters; `unregulated` declares a bandwidth no VM reaches, so
    the daemon measures without ever holding one back."""
    g = guaranteed_mbps if regulated else 10**9
    vms = "".join(f"[vm.{n}]\nmembw_share = {s}\n" for n, s in REAL_SHARES.items())
    return (f"discover_processes = true\n[membw]\nbackend = \"pmu\"\nguaranteed_mbps = {g}\n"
            f"period_ms = {PERIOD_MS}\n{vms}")


def real_samples(status, mode, t_s, names=REAL_SHARES):
    """Rows of one `cosched status --json` sample: each of our VMs' last period."""
    rows = []
    for vm in status.get("vms", []):
        m = vm.get("membw")
        if vm.get("name") in names and m:
            rows.append(dict(mode=mode, t_s=round(t_s, 3), vm=vm["name"], mbps=round(m["last_period_mbps"], 1),
                             guarantee_mbps=round(m["guarantee_mbps"], 1), throttled=int(bool(m["throttled"])),
                             throttles=m["stats"]["throttles"]))
    return rows


def real_figures(rows, regulated, guaranteed_mbps):
    """Per mode: rt's bandwidth while it streams (its samples above 5% of its guarantee) against
    its guarantee, the hogs', and hog1's while rt idles."""
    def mean(xs):
        return round(sum(xs) / len(xs), 1) if xs else ""
    by = {}
    for r in rows:
        by.setdefault(r["t_s"], {})[r["vm"]] = r
    g_rt = guaranteed_mbps * REAL_SHARES["rt"] / 1000
    busy = [s for s in by.values() if "rt" in s and s["rt"]["mbps"] > 0.05 * g_rt]
    idle = [s for s in by.values() if "rt" in s and s["rt"]["mbps"] <= 0.05 * g_rt]
    rt = mean([s["rt"]["mbps"] for s in busy])
    return {
        "rt_mbps": rt, "rt_pct": round(100 * rt / g_rt, 1) if regulated and rt != "" else "",
        "hog1_mbps": mean([s["hog1"]["mbps"] for s in busy if "hog1" in s]),
        "hog2_mbps": mean([s["hog2"]["mbps"] for s in busy if "hog2" in s]),
        "hog1_idle_mbps": mean([s["hog1"]["mbps"] for s in idle if "hog1" in s]),
        "throttles": max((r["throttles"] for r in rows), default=0),
    }


def real(guaranteed_mbps, quick, out, verbose, fresh):
    import harness
    phase_s = (STREAM_S + IDLE_S) * (1 if quick else 5)
    with tempfile.TemporaryDirectory(prefix="cosched-membw-real-") as tmp:
        # The daemon's own probe first: on a host without counters, stop here with its reason.
        d = harness.Daemon(tmp, real_config(guaranteed_mbps, True))
        try:
            why = (d.status() or {}).get("membw", {}).get("unsupported")
        finally:
            d.stop()
        if why:
            raise SystemExit(f"membw --real: the daemon cannot regulate memory bandwidth on this host: {why}")
        foreign = harness.foreign_qemus(set())
        if foreign:
            raise SystemExit(f"membw --real: QEMU processes this run did not start are running (pids {foreign}): the "
                             "daemon (discover_processes) would regulate them too; stop them first")
        # Only now the output directory: a host that cannot run this leaves no results/membw-real.
        o = Output(NAME, quick, out, fresh, args=f" --real {guaranteed_mbps}", dir_name=NAME + "-real",
                   rendered=False)
        vms = [harness.GuestVM(REAL_WORKLOAD.format(rt=int(n == "rt"), stream_s=STREAM_S, idle_s=IDLE_S), n,
                               verbose=verbose) for n in REAL_SHARES]
        rows, table = [], []
        try:
            for vm in vms:
                vm.wait_for("COSCHED-MEMBW-READY", timeout=300)
            throttle = ""
            for mode, flags in MODES.items():
                d = harness.Daemon(tmp, real_config(guaranteed_mbps, flags is not None))
                try:
                    st = d.status()
                    throttle = throttle or st["membw"].get("throttles_through", "")
                    if flags is not None:
                        subprocess.run([str(harness.COSCHED), "membw", "--control-socket", str(d.control),
                                        "--reclaim", "on" if flags[0] else "off",
                                        "--best-effort", "on" if flags[1] else "off"], check=True)
                    mine, t0 = [], time.monotonic()
                    while time.monotonic() - t0 < phase_s:
                        mine += real_samples(d.status() or {}, mode, time.monotonic() - t0)
                        time.sleep(SAMPLE_S)
                finally:
                    d.stop()
                rows += mine
                f = real_figures(mine, flags is not None, guaranteed_mbps)
                table.append(dict(mode=mode, **f))
                log(f"membw --real {mode}: {f}")
        finally:
            for vm in vms:
                vm.stop()
    o.csv(rows, REAL_COLUMNS)
    fig, axes = plt.subplots(len(MODES), 1, figsize=(10, 2.4 * len(MODES)), sharex=True)
    for ax, mode in zip(axes, MODES):
        for vm in REAL_SHARES:
            pts = [r for r in rows if r["mode"] == mode and r["vm"] == vm]
            ax.plot([r["t_s"] for r in pts], [r["mbps"] for r in pts], color=COLORS[vm], linewidth=0.8, label=vm)
            if MODES[mode] is not None:
                ax.plot([r["t_s"] for r in pts], [r["guarantee_mbps"] for r in pts], color=COLORS[vm],
                        linestyle="--", linewidth=0.8)
        ax.set_title(mode, fontsize=9)
        ax.set_ylabel("MB/s")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("time (s); dashed: guarantee")
    fig.suptitle(f"Memory bandwidth per {PERIOD_MS} ms period (daemon's pmu counters), {guaranteed_mbps} MB/s guaranteed")
    fig.tight_layout()
    o.png(fig)
    md = md_table(table, ["mode", "rt_mbps", "rt_pct", "hog1_mbps", "hog2_mbps", "hog1_idle_mbps", "throttles"],
                  ["policy", "rt MB/s (streaming)", "rt % of guarantee", "hog1 (20%)", "hog2 (0%)",
                   "hog1 while rt idle", "throttles"])
    regulated = [t for t in table if t["rt_pct"] != ""]
    worst = min((t["rt_pct"] for t in regulated), default="")
    o.summary("Memory-bandwidth regulation (DREAMS D2.2.3 §2), real guests", f"""
Three guests stream memory (`dd` from /dev/zero, 32 MiB buffers); "rt" holds 70% of the
{guaranteed_mbps} MB/s declared guaranteed, "hog1" 20%, "hog2" nothing; rt streams {STREAM_S} s and
idles {IDLE_S} s in turn. Each mode runs {phase_s} s under a fresh daemon (`pmu` backend; the
unregulated mode declares a bandwidth no VM reaches, so it measures without holding anyone back).
Bandwidth is the daemon's own: `last_period_mbps` (last-level cache misses × bytes_per_miss) sampled
every {SAMPLE_S * 1000:.0f} ms. The throttle: {throttle}.

{md}

Target: rt gets at least 95% of its guarantee in every regulated mode: **{"met" if worst != "" and worst >= 95 else "NOT met"}**
(worst {worst}%). Last-level cache misses count reads that reach memory; writebacks and
prefetches are not in them, so compare the modes with each other rather than with a STREAM figure.
""")
    return o.dir
