"""Two runs of one experiment side by side: the rows both have (matched on KEY columns) and, for
each VALUE column, the first run's value, the second's, and their ratio (second / first).
Writes a markdown table, with where each run came from, to OUT (stdout by default).

    /usr/bin/python3 bench/compare_runs.py A/data.csv B/data.csv --labels "before" "after" \\
        --key vms placement --values cpu_us_per_transition ratio_to_floor --title "..." [--out FILE]
"""

import argparse
import csv
import sys
from pathlib import Path


def read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def fmt(v):
    n = num(v)
    if n is None:
        return v if v not in (None, "") else "-"
    return f"{n:.3g}" if abs(n) < 100 else f"{n:.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="the first run's data.csv")
    ap.add_argument("b", help="the second run's data.csv")
    ap.add_argument("--labels", nargs=2, default=("A", "B"), help="what to call the two runs")
    ap.add_argument("--key", nargs="+", required=True, help="columns that identify a row")
    ap.add_argument("--values", nargs="+", required=True, help="columns to compare")
    ap.add_argument("--title", default="Two runs compared")
    ap.add_argument("--note", action="append", default=[], help="a line of text under the title (repeatable)")
    ap.add_argument("--out", help="write here instead of stdout")
    a = ap.parse_args()
    ra, rb = read(a.a), read(a.b)
    index = {tuple(r[k] for k in a.key): r for r in rb}
    head = list(a.key)
    for v in a.values:
        head += [f"{v} ({a.labels[0]})", f"{v} ({a.labels[1]})", f"{v} {a.labels[1]}/{a.labels[0]}"]
    lines = [f"# {a.title}", ""] + [f"{n}" for n in a.note] + ([""] if a.note else [])
    lines += [f"- {a.labels[0]}: `{a.a}`", f"- {a.labels[1]}: `{a.b}`", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in ra:
        key = tuple(r[k] for k in a.key)
        other = index.get(key)
        if other is None:
            continue
        cells = list(key)
        for v in a.values:
            x, y = num(r.get(v)), num(other.get(v))
            ratio = f"{y / x:.2f}" if x and y is not None else "-"
            cells += [fmt(r.get(v)), fmt(other.get(v)), ratio]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    if a.out:
        Path(a.out).write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
