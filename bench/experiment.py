#!/usr/bin/python3
"""cosched experiments: reproduce the papers' figures on this host.

  sudo /usr/bin/python3 bench/experiment.py NAME [--quick] [--out DIR]
  sudo /usr/bin/python3 bench/experiment.py all [--quick]
  /usr/bin/python3 bench/experiment.py status [--check]     (no root needed)
  /usr/bin/python3 bench/experiment.py render [NAME ...]    (no root needed)

Each experiment boots the test guest under controlled host load and writes data.csv, plot.png
and summary.md (our numbers beside the papers') to results/NAME/ (full run) or
build/results-quick/NAME/ (--quick: a few points, to check that everything works, not to judge
the effect). Needs root and a built tree (scripts/setup.sh). An interrupted full run resumes: the
points it finished are kept in results/NAME/points.jsonl and are not measured again. With the
summary, each run writes manifest.json: the commit at its start, whether the tree was dirty, the
host kernel, the accelerator, the CPUs, the start and end, the command, quick or full, the seeds
(bench/manifest.py).

status: one line per results/<name>/: its manifest's commit, date, accelerator, quick or full, and
"current", or "STALE: <groups> changed, N files" if code that it runs changed after that commit
(committed since, or uncommitted now): the crates (crates/, Cargo.lock, Cargo.toml; not the Rust
that only `cargo test` compiles: crates/*/tests/ and `#[cfg(test)] mod` files), the guest
(guest/, bench/guest-tools/, bench/debian_guest.py), the harness (bench/harness.py,
bench/experiments/common.py) or its own script (each result counts the groups it runs: PRODUCERS in
bench/manifest.py); "UNKNOWN" where the manifest gives no measured
commit (a manifest recovered from git history: "~" marks the data's commit, the changes since it
are a lower bound); "no manifest". A result whose summary was rendered again from its data (render,
below) is judged in two parts: the crates, the guest and bench/harness.py since the measured
commit, its own script and bench/experiments/common.py since the rendering's commit (a rendering
vouches that their changes in between are rendering only); a run or a rendering made with
uncommitted changes to what it depends on is UNKNOWN. --check: exit status 1 unless every result
is current.

render: summary.md and plot.png of results/NAME again from the data the run stored (data.csv and
the files beside it), with today's code, without measuring: for a summary's text, targets or plot
changed after the run. The manifest keeps the measurement and records the rendering
(rendered_commit). With no NAME, every result that has stored data; the results written by other
scripts are rendered by them (bench/reliability.py summary, bench/environments.py --render,
bench/boot_vs_snapshot.py --render, bench/thread_discovery_bench.py --render,
bench/experiments/slowdisk.py render).

Experiments (full-run time on the 2-core development machine, TCG guest; the papers are
named as in docs/references.md):
  latency-vs-load  Coordinated Task Scheduling Fig. 1/7: cyclictest vs 0-6 CPU hogs    30 min
  histogram        Coordinated Task Scheduling Fig. 8: latency distribution            2.5 min
  startup          Coordinated Task Scheduling Fig. 4/9: start-up vs load, the bounds  ~2.4 h
  startup-misses   startup's two missed points, 3 runs each of none, static RR, budget  ~70 min
  rt-vs-static     Performance Tuning (KVM RT) Fig. 11/12: host jobs, guest RT latency  ~27 min
  overhead         FEAS Table 2: the agent's cost to CPU- and switch-bound jobs         2.5 min
  scale            daemon CPU and hint-to-applied latency, 1-256 synthetic VMs          3.5 min
  boost-classes    SCHED_RR / FIFO / DEADLINE / nice -20 as the boost                   3.5 min
  io-startup       Virtual-BFQ Fig. 1-3/10-11: guest app start-up, guest/host readers   40 min
  membw            DREAMS D2.2.3 §2: MemGuard regulation, simulated memory system        10 s
                   (--real MBPS: real guests on a host with PMU counters, 5 x 30 s)
  feas-fairness    FEAS Fig. 5: CPU shares of 4 busy agentless VMs, one served          ~5 min
  feas-latency     FEAS Fig. 6: ping a busy VM sharing its CPU with 3 VMs                ~3 min
  feas-throughput  FEAS Fig. 7/8: download speed from busy VMs                           ~5 min
  feas-overhead    FEAS Table 2: prime search with event boosting on and off            ~5 min
  (feas-*: estimated from the quick runs, 25-40 s each)
"""

import argparse
import importlib
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

EXPERIMENTS = {
    "latency-vs-load": "latency_vs_load",
    "histogram": "histogram",
    "startup": "startup",
    "startup-misses": "startup_misses",
    "rt-vs-static": "rt_vs_static",
    "overhead": "overhead",
    "scale": "scale",
    "boost-classes": "boost_classes",
    "io-startup": "io_startup",
    "membw": "membw",
    # Several experiments of one module: "module:NAME" (the module's EXPERIMENTS[NAME]).
    "feas-fairness": "feas:feas-fairness",
    "feas-latency": "feas:feas-latency",
    "feas-throughput": "feas:feas-throughput",
    "feas-overhead": "feas:feas-overhead",
}


def load(name):
    """The experiment `name`: an object with main(quick, out, verbose, fresh) and COLUMNS."""
    module, _, attr = EXPERIMENTS[name].partition(":")
    mod = importlib.import_module(f"experiments.{module}")
    return mod.EXPERIMENTS[attr] if attr else mod


def interrupted(signum, frame):
    raise KeyboardInterrupt


def status(check=False):
    """`status`: each result's manifest and whether the code it runs changed since (no root)."""
    import manifest
    rows = manifest.status()
    for r in rows:
        print(manifest.line(r))
    bad = [r["name"] for r in rows if r["manifest"] is None or r["verdict"] != "current"]
    print(f"{len(rows) - len(bad)} of {len(rows)} results current")
    return 1 if check and bad else 0


# The results that scripts other than this one write, and the command that renders each again.
OTHER_RENDERERS = {
    "reliability": ["bench/reliability.py", "summary"],
    "environments": ["bench/environments.py", "--render"],
    "boot-vs-snapshot": ["bench/boot_vs_snapshot.py", "--render"],
    "thread-discovery": ["bench/thread_discovery_bench.py", "--render"],
    "slowdisk": ["bench/experiments/slowdisk.py", "render"],
}


def render(names):
    """`render`: the named results (default: every one with stored data) rendered again from what
    their run stored, without measuring (no root)."""
    import subprocess
    from experiments.common import RESULTS
    repo = RESULTS.parent
    names = names or [n for n in [*EXPERIMENTS, *OTHER_RENDERERS] if (RESULTS / n / "data.csv").exists()
                      or (n == "reliability" and (RESULTS / n).is_dir())]
    failed = []
    for name in names:
        if name in OTHER_RENDERERS:
            script, *args = OTHER_RENDERERS[name]
            rc = subprocess.run([sys.executable, str(repo / script), *args], cwd=repo).returncode
        elif name in EXPERIMENTS:
            mod = load(name)
            d = RESULTS / name
            if not (d / "data.csv").exists():
                print(f"render: {name}: no stored data in {d}", file=sys.stderr)
                rc = 1
            else:
                mod.main(False, out=d, rows=mod.stored(d))
                rc = 0
        else:
            print(f"render: {name}: no such result (one of: {', '.join([*EXPERIMENTS, *OTHER_RENDERERS])})",
                  file=sys.stderr)
            rc = 2
        print(f"render: {name}: {'rendered' if rc == 0 else f'failed ({rc})'}", flush=True)
        if rc:
            failed.append(name)
    return 1 if failed else 0


def main():
    if sys.argv[1:2] == ["render"]:
        return render(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", choices=[*EXPERIMENTS, "all", "status", "render"])
    ap.add_argument("--quick", action="store_true", help="a few short points (CI)")
    ap.add_argument("--out", help="output directory (default results/NAME or build/results-quick/NAME)")
    ap.add_argument("--fresh", action="store_true",
                    help="discard the points an interrupted full run left in points.jsonl (by default a "
                         "full run measures only the points still missing)")
    ap.add_argument("-v", "--verbose", action="store_true", help="echo the guest console")
    ap.add_argument("--check", action="store_true",
                    help="status only: exit status 1 if a result is stale, unknown or has no manifest")
    ap.add_argument("--real", type=int, metavar="MBPS",
                    help="membw only: measure real guests streaming memory under the daemon's pmu backend, MBPS "
                         "declared guaranteed; writes results/membw-real only when run on a host with PMU counters "
                         "(never run on the development host, which has none: no such result exists there)")
    a = ap.parse_args()
    if a.name == "status":
        return status(a.check)
    if a.check:
        ap.error("--check is for status only")
    if a.real is not None and a.name != "membw":
        ap.error("--real is for membw only")
    if a.real is not None and a.real <= 0:
        ap.error("--real MBPS must be > 0")
    if os.geteuid() != 0:
        sys.exit("experiment.py: must run as root (daemon, real-time policies, QEMU)")
    # `kill PID` interrupts like Ctrl-C: the harness stops its guest, daemon and hogs on the way
    # out, and the finished points stay in points.jsonl for the next run.
    signal.signal(signal.SIGTERM, interrupted)
    names = list(EXPERIMENTS) if a.name == "all" else [a.name]
    from experiments.slowdisk import Unsupported
    unsupported = []
    for name in names:
        mod = load(name)
        t0 = time.time()
        out = Path(a.out) / name if (a.out and len(names) > 1) else a.out
        extra = {"real_mbps": a.real} if a.real is not None else {}
        try:
            d = mod.main(a.quick, out=out, verbose=a.verbose, fresh=a.fresh, **extra)
        except Unsupported as e:
            # Said before anything was set up; `all` goes on with the next experiment.
            print(f"{name}: not run: {e}", flush=True)
            unsupported.append(name)
            continue
        print(f"{name}: {d} ({(time.time() - t0) / 60:.1f} min)", flush=True)
    if unsupported:
        return f"experiment.py: unsupported on this host: {', '.join(unsupported)}"


if __name__ == "__main__":
    sys.exit(main())
