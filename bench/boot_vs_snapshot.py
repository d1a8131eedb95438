"""Whether a guest started from a snapshot measures what a freshly booted one does: the same point
(cyclictest -p 80 -i 1000, 2000 loops, in the 1-vCPU guest beside one guest CPU hog and 2 host
hogs), uncoordinated and with cosched, alternately booted from the kernel (COSCHED_SNAPSHOT=off)
and restored from a snapshot (guest/run.sh --snapshot auto). Prints each run and the mean and
median average latency of each of the four, and writes them with the commit and the accelerator
to OUT/summary.md (default results/boot-vs-snapshot). As root, on a built tree:

    /usr/bin/python3 bench/boot_vs_snapshot.py [--rounds N] [--out DIR]
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import manifest  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6, help="runs of each of the four (default 6)")
    ap.add_argument("--out", default=str(harness.REPO / "results/boot-vs-snapshot"), help="where summary.md goes")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("boot_vs_snapshot.py: must run as root")
    run = manifest.Run()
    print(harness.accel_line(), flush=True)
    avgs, took = {}, {}
    for rnd in range(a.rounds):
        for boot in ("off", "auto"):
            os.environ["COSCHED_SNAPSHOT"] = boot
            for policy in ("none", "cosched"):
                t = time.monotonic()
                r = harness.run(harness.cyclictest_body("-p 80 -i 1000", 2000), host_hogs_n=2, guest_hogs=1,
                                policy=policy)
                s = harness.stats(*harness.parse_histogram(r["console"]))
                avgs.setdefault((boot, policy), []).append(s["avg"])
                took.setdefault((boot, policy), []).append(time.monotonic() - t)
                print(f"round {rnd + 1} {'snapshot' if boot == 'auto' else 'kernel'} {policy}: avg {s['avg']} "
                      f"p99 {s['p99']} max {s['max']} µs ({took[(boot, policy)][-1]:.1f} s)", flush=True)
    table = "| guest started | policy | avg µs, mean | median | each run | s per run (boot included) |\n|---|---|---|---|---|---|\n"
    for (boot, policy), v in sorted(avgs.items()):
        table += (f"| {'from a snapshot' if boot == 'auto' else 'from its kernel'} | {policy} | "
                  f"{statistics.mean(v):.0f} | {statistics.median(v):.0f} | {', '.join(map(str, v))} | "
                  f"{statistics.mean(took[(boot, policy)]):.1f} |\n")
    print("\n" + table)
    commit = subprocess.run(["git", "-C", str(harness.REPO), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(
        "# A guest started from a snapshot against one booted from its kernel\n\n"
        f"Command: `sudo /usr/bin/python3 bench/boot_vs_snapshot.py --rounds {a.rounds}` "
        f"(commit {commit}, {time.strftime('%Y-%m-%d')}; {harness.accel_line()}; "
        f"{os.cpu_count()} CPUs, Linux {platform.release()}).\n\n"
        "Each run: cyclictest -p 80 -i 1000 -l 2000 in the 1-vCPU guest beside one guest CPU hog and "
        "2 host CPU hogs (started before QEMU), uncoordinated (none) and with cosched; the four kinds "
        "alternate, round after round.\n\n" + table)
    name, reason = harness.accel()
    manifest.write(out, run, name="boot-vs-snapshot", producer="bench/boot_vs_snapshot.py", quick=False,
                   accel=(name.upper(), reason))


if __name__ == "__main__":
    main()
