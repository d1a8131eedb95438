#!/usr/bin/python3
"""Manifests for the results written before the runs wrote their own (bench/manifest.py), recovered
from git history and from what the summaries state: "source": "recovered from git history", and
null for whatever neither says (nothing is guessed).

    /usr/bin/python3 bench/backfill_manifests.py [--force] [--dry-run] [DIR ...]

By default: every results/*/ without a manifest, and the run directories nested in them that a
producer wrote with --out (results/scale/redesign/*, results/reliability/soak-sched-other). A
manifest that a run wrote is never replaced; --force replaces recovered ones, but not one whose
kind is "rendered" (a rendering kept the measurement's fields and added its own: recovering again
would lose them) nor one with a part written by a run.

What a recovered manifest holds (besides bench/manifest.py's fields, most of them null):
  data_commit       the last commit that changed the directory's data, with its date and subject:
                    its CSV and JSON files but manifest.json (where it has none: its files but
                    manifest.json and what a rendering rewrites, summary.md and plot.png; where it
                    has nothing else, its files but manifest.json), passing over the commits whose
                    message says that they rendered the result again (they measured nothing);
                    last_commit: the last commit that changed the directory at all (manifest.json
                    aside)
  commit            the measured commit, only where it is stated: in the summary ("commit X"), in
                    the data commit's message ("... at X"; never a rendering commit's: its "at X"
                    is the code that rendered), or in the summary that compares nested runs;
                    commit_stated (as written) and commit_source say where
  date, command, quick, seeds, kernel.release, accel, cpus: as the summary's command paragraph
                    and setup line state them
Status (bench/experiment.py status) judges a manifest without a commit from its data commit, and
never calls it current.
"""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import manifest  # noqa: E402

REPO = manifest.REPO
RESULTS = REPO / "results"

# Nested run directories: (their experiment, and where their measured commit is stated, if it is).
NESTED = {
    "scale/redesign/before-1": ("scale", ("results/scale/redesign/summary.md", r"\*before\* is commit ([0-9a-f]{7,40})")),
    "scale/redesign/before-2": ("scale", ("results/scale/redesign/summary.md", r"\*before\* is commit ([0-9a-f]{7,40})")),
    "scale/redesign/after-2": ("scale", ("results/scale/redesign/summary.md", r"\*after\* is commit ([0-9a-f]{7,40})")),
    "reliability/soak-sched-other": ("reliability", None),
}
# The reliability campaign's parts: their data files and the text that states their command.
PARTS = {
    "crash": (["crash.csv"], ("summary.md", "## Crash cycles")),
    "isolation": (["isolation.md", "isolation.json"], ("isolation.md", None)),
    "soak": (["soak.md", "soak.csv", "soak-probe.csv"], ("soak.md", None)),
    "fuzz": (["fuzz.md"], ("fuzz.md", None)),
}
# What the files say about how they were made, beyond their command (quoted or evident from the
# producer's code at the data commit).
NOTES = {
    "io-startup": "calibration.md: single boots 'with the harness of bench/experiments/io_startup.py'; it says "
                  "'The scripts were throw-away copies of io_startup.main with other cells': no committed script "
                  "writes it",
    "thread-discovery": "bench/thread_discovery_bench.py printed its figures; summary.md was written by hand around "
                        "that output (the script wrote no file)",
    "reliability": "summary.md is assembled from the parts' files; each part below has its own data commit",
}
# Producers whose stated commit also says whether the tree was dirty: boot_vs_snapshot.py writes
# `git describe --always --dirty` (any tracked file).
DIRTY_IN_COMMIT = {"boot-vs-snapshot"}


def git(*args):
    rc, out = manifest.git(REPO, *args)
    return out.strip() if rc == 0 else None


# A commit message that says the commit rendered a result again from stored data: it measured
# nothing, and an "at X" in it is the rendering's code.
RENDERING = re.compile(r"\bre-?render|\brender(?:ed|s|ing)?\s+again\b", re.I)
# What a rendering writes again beside the data (Output.summary, Output.png), and the manifest.
RENDERED_FILES = ("summary.md", "plot.png")


def last_commit(paths, measured=False):
    """(hash, ISO date, subject) of the last commit that changed any of `paths`, or None.
    measured: the last one whose message does not say that it rendered again (RENDERING)."""
    if not paths:
        return None
    out = git("log", *([] if measured else ["-1"]), "--format=%x01%H%x00%aI%x00%s%x00%B", "--", *paths) or ""
    for rec in out.split("\x01")[1:]:
        h, date, subject, body = rec.split("\0", 3)
        if not (measured and RENDERING.search(body)):
            return h, date, subject
    return None


def data_files(files):
    """The files of `files` that hold a result's data: its CSV and JSON files but manifest.json;
    failing those, all but manifest.json and what a rendering rewrites (summary.md, plot.png);
    failing those, all but manifest.json."""
    files = [f for f in files if f.name != manifest.FILE]
    return ([f for f in files if f.suffix in (".csv", ".json")]
            or [f for f in files if f.name not in RENDERED_FILES] or files)


def content_commit(path):
    """(hash, ISO date, subject) of the commit that brought `path`'s present content, following
    renames: older than last_commit() where the file was moved or copied unchanged."""
    blob = git("rev-parse", f"HEAD:{path}")
    out = git("log", "--follow", "--format=%x01%H%x00%aI%x00%s", "--name-only", "--", path) or ""
    found = None
    for rec in out.split("\x01")[1:]:
        head, _, names = rec.partition("\n")
        names = [n for n in names.split("\n") if n.strip()]
        h = head.split("\0")
        if not names or git("rev-parse", f"{h[0]}:{names[-1]}") != blob:
            break
        found = tuple(h)
    return found


def full_hash(short):
    return git("rev-parse", "--verify", "--quiet", short + "^{commit}")


def command_paragraph(text):
    """The paragraph that starts with "Command:" (to the next blank line), or ""."""
    m = re.search(r"^Command:.*?(?=\n\s*\n|\Z)", text, re.S | re.M)
    return m.group(0) if m else ""


def setup_line(text):
    """The last "Our setup:" line (common.setup_line(), at the end of a summary)."""
    lines = re.findall(r"^Our setup:.*$", text, re.M)
    return lines[-1] if lines else ""


def stated(text):
    """What a summary (or a part's text) states: {command, date, commit, dirty, kernel, accel, cpus,
    quick, seeds}, None where it says nothing."""
    para, setup = command_paragraph(text), setup_line(text)
    both = para + "\n" + setup
    s = dict.fromkeys(("command", "date", "commit", "dirty", "kernel", "accel", "cpus", "quick", "seeds"))
    m = re.search(r"`([^`]+)`", para)
    if m:
        s["command"] = m.group(1)
        s["quick"] = "--quick" in s["command"]
        seeds = re.findall(r"--seed (\d+)", s["command"])
        if seeds:
            s["seeds"] = {"seed": int(seeds[0])}
    m = re.search(r"\b(\d{4}-\d\d-\d\d)\b", para)
    if m:
        s["date"] = m.group(1)
    m = re.search(r"\bcommit ([0-9a-f]{7,40})(-dirty)?\b", para)
    if m:
        s["commit"] = m.group(1)
        s["dirty"] = True if m.group(2) else None
    if "(with uncommitted changes)" in para:  # environments.py
        s["dirty"] = True
    kernels = set(re.findall(r"\bLinux (\d+\.\d+(?:\.\d+)?-[\w.+~-]*\w)", both))
    if len(kernels) == 1:
        s["kernel"] = kernels.pop()
    name = reason = None
    m = re.search(r"\b1-vCPU (TCG|KVM) guest", both)
    if m:
        name = m.group(1)
    m = re.search(r"accelerator: (TCG|KVM) \((.*?)\); \d+ CPUs", para)  # boot_vs_snapshot.py
    if m:
        name, reason = m.group(1), m.group(2)
    m = re.search(r"accelerator (tcg|kvm): (.*)\)\.\s*$", para, re.S)  # environments.py
    if m:
        name, reason = m.group(1).upper(), " ".join(m.group(2).split())
    m = re.search(r"\(accelerator: (.*?); (?:a guest|each guest)", setup)  # common.setup_line()
    if m:
        reason = m.group(1)
    if name:
        s["accel"] = {"name": name, "reason": re.sub(r" \(cached\)$", "", reason) if reason else None}
    m = (re.search(r"\b(\d+) x86 cores\b", both) or re.search(r"\b(\d+) CPUs\b", both)
         or re.search(r"\bthis (\d+)-core machine\b", both))
    if m:
        s["cpus"] = int(m.group(1))
    return s


def entry(directory, files, text, name, commit_elsewhere=None, nested=False):
    """A recovered manifest entry for the files `files` of `directory`, whose command and setup
    `text` states. nested: a run directory inside another result's, whose data commit's message
    speaks of the outer result."""
    rel = lambda p: str(p.relative_to(REPO))  # noqa: E731
    data = data_files(files)
    dc = last_commit([rel(f) for f in data], measured=True)
    lc = last_commit([rel(f) for f in files if f.name != manifest.FILE])
    # Data moved here unchanged: the commit that brought its content, the newest of its files'
    # (if older than the data commit: not a rendering's rewrite that the data commit passed over).
    origins = [content_commit(rel(f)) for f in data]
    origin = None
    if dc and all(origins):
        newest = max(origins, key=lambda o: o[1])
        if newest[0] != dc[0] and manifest.git(REPO, "merge-base", "--is-ancestor", newest[0], dc[0])[0] == 0:
            origin = newest
    s = stated(text)
    commit, commit_source, commit_text = None, None, None
    if s["commit"]:
        commit, commit_text = full_hash(s["commit"]), s["commit"]
        commit_source = "the command line of the summary"
    elif commit_elsewhere:
        path, pattern = commit_elsewhere
        m = re.search(pattern, (REPO / path).read_text())
        if m:
            commit, commit_text, commit_source = full_hash(m.group(1)), m.group(1), f"{path}: '{m.group(0)}'"
    elif dc and not nested and not RENDERING.search(git("log", "-1", "--format=%B", dc[0]) or ""):
        m = re.search(r"\bat ([0-9a-f]{7,40})\b", dc[2])
        if m and full_hash(m.group(1)):
            commit, commit_text = full_hash(m.group(1)), m.group(1)
            commit_source = f"the message of the data commit {dc[0][:7]}: '{dc[2][:m.end() + 20].strip()}...'"
    dirty = s["dirty"]
    if dirty is None and s["commit"] and name in DIRTY_IN_COMMIT:
        dirty = False  # `git describe --dirty` would have said -dirty
    e = {
        "source": "recovered from git history",
        "kind": "measured",
        "commit": commit,
        "commit_stated": commit_text,
        "commit_source": commit_source,
        "data_commit": dc[0] if dc else None,
        "data_commit_date": dc[1] if dc else None,
        "data_commit_subject": dc[2] if dc else None,
        "data_moved_from_commit": origin[0] if origin else None,
        "last_commit": lc[0] if lc else None,
        "dirty": dirty,
        "dirty_paths": None,
        "kernel": {"release": s["kernel"], "version": None} if s["kernel"] else None,
        "accel": s["accel"],
        "cpus": s["cpus"],
        "started": None,
        "ended": None,
        "date": s["date"],
        "argv": None,
        "executable": None,
        "command": s["command"],
        "quick": s["quick"],
        "seeds": s["seeds"],
        "rendered_commit": None,
    }
    return e


def tracked(directory):
    """The tracked files directly in `directory` (not in its subdirectories)."""
    out = git("ls-files", "--", str(directory.relative_to(REPO))) or ""
    return sorted(REPO / f for f in out.splitlines() if (REPO / f).parent == directory)


def recover(directory):
    """The recovered manifest of results/<...> `directory` (not written)."""
    rel = str(directory.relative_to(RESULTS))
    name, elsewhere = NESTED.get(rel, (rel, None))
    producer = manifest.PRODUCERS.get(name, ([None], ()))[0][0]
    m = {"schema": manifest.SCHEMA, "name": name, "producer": producer}
    files = tracked(directory)
    if name == "reliability":
        parts = {}
        for part, (data, (textfile, section)) in PARTS.items():
            present = [directory / f for f in data if (directory / f) in files]
            if not present:
                continue
            text = (directory / textfile).read_text() if (directory / textfile).exists() else ""
            if section and section in text:
                text = text[text.index(section):]
                text = text[:text.find("\n## ", 1)] if "\n## " in text[1:] else text
            parts[part] = entry(directory, present, text, name, nested=rel in NESTED)
        m.update(source="recovered from git history", parts=parts)
    else:
        summary = directory / "summary.md"
        m.update(entry(directory, files, summary.read_text() if summary.exists() else "", name, elsewhere,
                       nested=rel in NESTED))
    if rel in NOTES:
        m["note"] = NOTES[rel]
    return m


def targets():
    dirs = sorted(p for p in RESULTS.iterdir() if p.is_dir())
    dirs += [RESULTS / n for n in NESTED if (RESULTS / n).is_dir()]
    return dirs


def kept(old, force):
    """Why manifest `old` stays as it is (None: it may be recovered again): any manifest without
    --force; with it, one that a run wrote (or a part of it), one of a rendering (kind "rendered":
    it keeps the measurement's fields and adds the rendering's), one not recovered."""
    if old is None:
        return None
    entries = [old] + [e for e in (old.get("parts") or {}).values() if isinstance(e, dict)]
    if not force:
        return f"{old.get('source')}; --force replaces a recovered one"
    if any(e.get("source") == "written by the run" for e in entries):
        return "written by the run: never replaced"
    if any(e.get("kind") == "rendered" for e in entries) or old.get("rendered_commit"):
        return f"{old.get('source')}, kind rendered: never replaced, the rendering's fields would be lost"
    if old.get("source") != "recovered from git history":
        return f"{old.get('source')}: never replaced"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="*", type=Path, help="results directories (default: all, see above)")
    ap.add_argument("--force", action="store_true",
                    help="replace recovered manifests (never a run's, nor a rendered one)")
    ap.add_argument("--dry-run", action="store_true", help="print the manifests, write nothing")
    a = ap.parse_args()
    for d in [p.resolve() for p in a.dirs] or targets():
        old = manifest.read(d)
        why = kept(old, a.force)
        if why:
            print(f"{d.relative_to(REPO)}: has a manifest ({why}), left as it is")
            continue
        m = recover(d)
        text = json.dumps(m, indent=1, ensure_ascii=False) + "\n"
        if a.dry_run:
            print(f"== {d.relative_to(REPO)}\n{text}")
        else:
            (d / manifest.FILE).write_text(text)
            e = next(iter(m["parts"].values())) if "parts" in m else m
            print(f"{d.relative_to(REPO)}: commit {(e['commit'] or '-')[:7]}, data {(e['data_commit'] or '-')[:7]}")


if __name__ == "__main__":
    main()
