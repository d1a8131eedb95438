"""Two sets of runs of one experiment side by side: the rows both have (matched on KEY columns)
and, for each VALUE column, the first set's mean, the second's, and their ratio (second / first).
A set is one data.csv or several, comma-separated (repeated runs of one build: their mean, and
each run's value in brackets). Writes a markdown table, with where each run came from, to OUT
(stdout by default).

    /usr/bin/python3 bench/compare_runs.py A1/data.csv,A2/data.csv B/data.csv --labels before after \\
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
    sa, sb = [read(p) for p in a.a.split(",")], [read(p) for p in a.b.split(",")]
    ra = sa[0]
    index_b = [{tuple(r[k] for k in a.key): r for r in run} for run in sb]
    index_a = [{tuple(r[k] for k in a.key): r for r in run} for run in sa]
    head = list(a.key)
    for v in a.values:
        head += [f"{v} ({a.labels[0]})", f"{v} ({a.labels[1]})", f"{v} {a.labels[1]}/{a.labels[0]}"]
    lines = [f"# {a.title}", ""] + [f"{n}" for n in a.note] + ([""] if a.note else [])
    lines += [f"- {a.labels[0]}: " + ", ".join(f"`{p}`" for p in a.a.split(",")),
              f"- {a.labels[1]}: " + ", ".join(f"`{p}`" for p in a.b.split(",")), ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    def mean(indexes, key, col):
        xs = [num(ix[key].get(col)) for ix in indexes if key in ix]
        xs = [x for x in xs if x is not None]
        return (sum(xs) / len(xs) if xs else None), xs

    def show(m, xs):
        if m is None:
            return "-"
        return fmt(m) + (" (" + ", ".join(fmt(x) for x in xs) + ")" if len(xs) > 1 else "")

    for r in ra:
        key = tuple(r[k] for k in a.key)
        if not any(key in ix for ix in index_b):
            continue
        cells = list(key)
        for v in a.values:
            (x, xs), (y, ys) = mean(index_a, key, v), mean(index_b, key, v)
            ratio = f"{y / x:.2f}" if x and y is not None else "-"
            cells += [show(x, xs), show(y, ys), ratio]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    if a.out:
        Path(a.out).write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
