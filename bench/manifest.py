"""Where a result comes from: results/<name>/manifest.json, written by the run that wrote the
result, and whether the code that the result measured has changed since (`bench/experiment.py
status`). Stdlib only: the experiments, bench/reliability.py, bench/environments.py,
bench/boot_vs_snapshot.py, bench/thread_discovery_bench.py and the slow-disk validation all write
their manifest through write() here.

    run = Run()                      # at the start: the commit, the dirty paths, the command, the time
    ...                              # measure, write data.csv, summary.md
    write(out_dir, run, name="histogram", producer="bench/experiments/histogram.py", quick=False,
          accel=("TCG", "KVM cannot run ..."), seeds=None)

manifest.json (one object):
  source        "written by the run", or "recovered from git history" (bench/backfill_manifests.py)
  name          the result's name; producer: the script or module that writes it
  kind          "measured": the run recorded here measured the data; "rendered": the last write
                rendered summary and plot again from stored rows (main(..., rows=rows)): the
                measurement's fields are kept and rendered_commit / rendered_at / rendered_argv
                say when and from what it was rendered (the measurement's are null if no manifest
                of the measurement existed)
  commit        HEAD at the start of the run (40 hex digits)
  dirty         whether files outside results/ had uncommitted changes at the start, or were
                untracked (and not ignored); dirty_paths: those files
  kernel        {"release": uname -r, "version": uname -v} of the host
  accel         {"name": "TCG" or "KVM", "reason": why} (null where the run boots no guest)
  cpus          os.cpu_count()
  started, ended  UTC, ISO 8601
  argv, executable, command   sys.argv as run, the interpreter, and the two as one shell line
  quick         true for a --quick run
  seeds         what the run declared as its seeds ({"name": value}), null if it declared none
  commits       (a run resumed from points that earlier sessions kept in points.jsonl at other
                commits) every commit its points were measured at, oldest first, null for points
                that recorded none (commits_note says so); "commit" is then the oldest known one,
                and dirty / dirty_paths cover every session
  parts         (reliability only) one entry as above per part (crash, isolation, soak, fuzz), each
                written by the run of that part; the top level has name and producer, and
                rendered_* once `reliability.py summary` renders the summary again
A recovered manifest has the same fields, null where git history and the summary do not say, and
data_commit (the commit that last changed the directory's data), commit_stated / commit_source
(where the measured commit is stated, if anywhere) and date (the day the summary states).

status (`bench/experiment.py status`, judge()): a result is stale when code that it runs (GROUPS,
and its own: PRODUCERS) changed after the commit that vouches for it, in a later commit or
uncommitted now. Which commit vouches for which files, the rule its status line names:
  measured      (kind "measured") every group since the measured commit M: "measured at M, all
                since".
  rendered      (kind "rendered", or a parts manifest with rendered_commit) the crates, the guest
                and bench/harness.py since the measured commit M; the result's scripts (scripts():
                its own Python scripts and bench/experiments/common.py) since the rendered commit
                R: a rendering vouches that the changes to those files between M and R are
                rendering only (the summary, its targets, the plot), so that a rendering-only
                change does not make the result stale once it is rendered again. "measured at M,
                rendered at R: <scripts> since R". The result's other own files (the fuzz targets,
                fuzz.sh, the slow disk's C, packaging/) only measure: since M.
A run with uncommitted changes to code the result runs (dirty_paths in its groups; for a
rendering, rendered_dirty_paths in its scripts) is "unknown", never "current": what it measured or
rendered is in no commit. Uncommitted changes elsewhere (docs, results, tests) do not matter.
"""

import json
import os
import platform
import re
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCHEMA = 1
FILE = "manifest.json"

# What the results depend on, by group: `status` reports a result stale when one of its groups
# changed after the commit it measured.
GROUPS = {
    "crates": ["crates", "Cargo.lock", "Cargo.toml"],
    "guest": ["guest", "bench/guest-tools", "bench/debian_guest.py"],
    "harness": ["bench/harness.py", "bench/experiments/common.py"],
}
_EXP = "bench/experiments/"
_ALL = ("crates", "guest", "harness")
# results/<name> -> (its own code: the producer first, then what only it uses; the groups it runs).
# Synthetic VMs (scale, reliability, thread-discovery) and the simulated membw boot no guest; the
# slow-disk validation runs neither the daemon nor a guest; the scripts outside bench/experiments
# do not use common.py.
_SCRIPT = ("crates", "guest", "bench/harness.py")
PRODUCERS = {
    "latency-vs-load": ([_EXP + "latency_vs_load.py"], _ALL),
    "histogram": ([_EXP + "histogram.py"], _ALL),
    "startup": ([_EXP + "startup.py"], _ALL),
    "startup-misses": ([_EXP + "startup_misses.py", _EXP + "startup.py"], _ALL),
    "rt-vs-static": ([_EXP + "rt_vs_static.py"], _ALL),
    "overhead": ([_EXP + "overhead.py"], _ALL),
    "scale": ([_EXP + "scale.py"], ("crates", "harness")),
    "boost-classes": ([_EXP + "boost_classes.py"], _ALL),
    "io-startup": ([_EXP + "io_startup.py", _EXP + "slowdisk.py", "bench/slowdisk"], _ALL),
    "membw": ([_EXP + "membw.py"], ("crates", "harness")),
    "membw-real": ([_EXP + "membw.py"], _ALL),
    "feas-fairness": ([_EXP + "feas.py"], _ALL),
    "feas-latency": ([_EXP + "feas.py"], _ALL),
    "feas-throughput": ([_EXP + "feas.py"], _ALL),
    "feas-overhead": ([_EXP + "feas.py"], _ALL),
    "slowdisk": ([_EXP + "slowdisk.py", "bench/slowdisk"], ()),
    "reliability": (["bench/reliability.py", "bench/fuzz.sh", "fuzz"], ("crates", "bench/harness.py")),
    "environments": (["bench/environments.py", "bench/tests/test_environments.py", "packaging", "scripts/package.sh"],
                     _SCRIPT),
    "boot-vs-snapshot": (["bench/boot_vs_snapshot.py"], _SCRIPT),
    "thread-discovery": (["bench/thread_discovery_bench.py"], ("crates", "bench/harness.py")),
}


def git(repo, *args):
    """(exit status, stdout) of git in `repo`."""
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    return r.returncode, r.stdout


def utc_now():
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def head(repo=REPO):
    rc, out = git(repo, "rev-parse", "--verify", "HEAD")
    return out.strip() if rc == 0 else None


def dirty_paths(repo=REPO):
    """Files with uncommitted changes (staged or not) and untracked files that git does not ignore,
    outside results/ (what `status` counts as uncommitted: uncommitted()); None outside git."""
    rc, out = git(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all")
    if rc != 0:
        return None
    paths, entries = set(), out.split("\0")
    i = 0
    while i < len(entries):
        e = entries[i]
        i += 1
        if len(e) < 4:
            continue
        paths.add(e[3:])
        if "R" in e[:2] or "C" in e[:2]:  # a rename or copy: the next entry is where it came from
            paths.add(entries[i])
            i += 1
    return sorted(p for p in paths if p and not p.startswith("results/"))


class Run:
    """What one run is, taken at its start: the commit, the dirty paths, the command, the time."""

    def __init__(self, repo=REPO, argv=None):
        self.repo = Path(repo)
        self.commit = head(self.repo)
        self.dirty_paths = dirty_paths(self.repo)
        self.started = utc_now()
        self.argv = list(sys.argv if argv is None else argv)
        self.executable = sys.executable

    def fields(self, quick, accel=None, seeds=None):
        """The manifest's fields of a measurement by this run, ending now."""
        u = os.uname()
        return {
            "commit": self.commit,
            "dirty": None if self.dirty_paths is None else bool(self.dirty_paths),
            "dirty_paths": self.dirty_paths,
            "kernel": {"release": u.release, "version": u.version},
            "accel": {"name": accel[0], "reason": accel[1]} if accel else None,
            "cpus": os.cpu_count(),
            "started": self.started,
            "ended": utc_now(),
            "argv": self.argv,
            "executable": self.executable,
            "command": shlex.join([self.executable, *self.argv]),
            "quick": bool(quick),
            "seeds": seeds or None,
        }


# The measurement's fields, null in a manifest of a rendering whose measurement had none.
MEASURED = ("commit", "dirty", "dirty_paths", "kernel", "accel", "cpus", "started", "ended", "argv",
            "executable", "command", "quick", "seeds")


def rendered_header(directory, command):
    """The first line of a summary rendered again from stored data by a script that writes its own
    summary (boot_vs_snapshot.py, environments.py): when the data was measured (its manifest), and
    that the summary was rendered today."""
    m = read(directory) or {}
    return (f"Command: `{m.get('command') or command}` (measured {(m.get('started') or m.get('date') or '?')[:10]}"
            + (f" at {m['commit'][:7]}" if m.get("commit") else "")
            + f"; this summary rendered again from its data.csv on {datetime.now(timezone.utc):%Y-%m-%d}).")


def read(directory):
    """The manifest of `directory`, or None (none, or not JSON)."""
    try:
        return json.loads((Path(directory) / FILE).read_text())
    except (OSError, ValueError):
        return None


def write(directory, run, *, name, producer, quick, accel=None, seeds=None, rendered=False, part=None,
          sessions=None):
    """Writes directory/manifest.json for `run` (a Run taken at the start) and returns it.

    rendered: the run rendered stored rows again instead of measuring: an existing manifest keeps
    its measurement and gains rendered_commit. part: a part of a result made of several (the
    reliability campaign's crash, isolation, soak, fuzz): the other parts' entries are kept.
    sessions: [(commit, dirty_paths)] of the earlier sessions whose points (points.jsonl) this
    run resumed, oldest first; None for what a point did not record (see resumed())."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    old = read(directory) or {}
    if part is not None:
        parts = old.get("parts") if isinstance(old.get("parts"), dict) else {}
        parts[part] = _entry(parts.get(part) or {}, run, quick, accel, seeds, rendered, sessions)
        m = {"schema": SCHEMA, "name": name, "producer": producer, "parts": parts}
    elif rendered and isinstance(old.get("parts"), dict):
        # The summary of several parts rendered again: each part keeps its measurement.
        m = {**old, **_rendering(run)}
    else:
        m = {"schema": SCHEMA, "name": name, "producer": producer,
             **_entry(old, run, quick, accel, seeds, rendered, sessions)}
    (directory / FILE).write_text(json.dumps(m, indent=1) + "\n")
    return m


def _entry(old, run, quick, accel, seeds, rendered, sessions=None):
    if not rendered:
        return {"source": "written by the run", "kind": "measured",
                **resumed(run.fields(quick, accel, seeds), sessions), "rendered_commit": None}
    if old.get("commit") or old.get("data_commit"):
        e = {k: v for k, v in old.items() if k not in ("schema", "name", "producer", "parts")}
    else:
        e = {"source": "written by the run", **{k: None for k in MEASURED},
             "note": "rendered from stored rows; no manifest of their measurement existed"}
    e["kind"] = "rendered"
    e.update(_rendering(run))
    return e


UNKNOWN_COMMIT_NOTE = ("null: points that an earlier session kept in points.jsonl without their commit (written "
                       "before points recorded it): measured at an unknown commit")


def resumed(fields, sessions):
    """A measurement's fields with the earlier sessions of its resumed points: "commits" (every
    commit, oldest first, null for a point that recorded none) and "commit" the oldest known one,
    where there are several; "dirty" true if any session was dirty, "dirty_paths" all of theirs
    ("dirty" null if none was dirty as far as recorded but some session's state is unknown)."""
    if not sessions:
        return fields
    fields = dict(fields)
    commits = []
    for c in [c for c, _ in sessions] + [fields["commit"]]:
        if c not in commits:
            commits.append(c)
    if len(commits) > 1:
        fields["commits"] = commits
        fields["commit"] = next((c for c in commits if c), None)
        if None in commits:
            fields["commits_note"] = UNKNOWN_COMMIT_NOTE
    known = [p for _, p in sessions + [(None, fields["dirty_paths"])] if p is not None]
    paths = sorted({x for p in known for x in p})
    unknown = len(known) < len(sessions) + 1
    fields["dirty"] = True if paths else (None if unknown else False)
    fields["dirty_paths"] = paths if paths or not unknown else None
    return fields


def _rendering(run):
    return {"rendered_commit": run.commit, "rendered_dirty": None if run.dirty_paths is None else bool(run.dirty_paths),
            "rendered_dirty_paths": run.dirty_paths, "rendered_at": utc_now(), "rendered_argv": run.argv}


# ---------------------------------------------------------------------------------------------
# status: is a result still the code's?


def entries(m):
    """The measurement entries of a manifest: its parts, or itself."""
    if isinstance(m.get("parts"), dict) and m["parts"]:
        return list(m["parts"].items())
    return [(None, m)]


def _paths(name):
    """{group: paths} of what results/<name> runs ("own": its producer's code). An unknown name
    depends on every group."""
    own, groups = PRODUCERS.get(name, ([], _ALL))
    out = {}
    for g in groups:
        if g in GROUPS:
            out[g] = GROUPS[g]
        else:  # one path of a group: "bench/harness.py" for the scripts outside bench/experiments
            out[next(k for k, ps in GROUPS.items() if g in ps)] = [g]
    out["own"] = own
    return out


_CFG_TEST_MOD = r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+{}\s*;"


def test_only(repo, path):
    """Whether `path` is Rust that only `cargo test` compiles, so no measured binary holds it: an
    integration test (crates/<crate>/tests/...), or a file under a crate's src/ whose parent module
    declares it `#[cfg(test)] mod <name>;` (as the parent reads now in `repo`)."""
    parts = path.split("/")
    if len(parts) < 4 or parts[0] != "crates" or not path.endswith(".rs"):
        return False
    if parts[2] == "tests":
        return True
    if parts[2] != "src":
        return False
    d, stem = "/".join(parts[:-1]), parts[-1][:-3]
    if stem in ("mod", "lib", "main"):
        return False
    parents = [d + "/lib.rs", d + "/main.rs"] if len(parts) == 4 else [d + ".rs", d + "/mod.rs"]
    pattern = re.compile(_CFG_TEST_MOD.format(re.escape(stem)))
    for parent in parents:
        try:
            text = (Path(repo) / parent).read_text()
        except OSError:
            continue
        return bool(pattern.search(text))
    return False


def _group_of(path, groups, repo=None):
    """The group of `groups` that `path` is in, or None (also for the crates' test-only files,
    test_only(), when `repo` is given)."""
    if repo is not None and "crates" in groups and test_only(repo, path):
        return None
    for g, paths in groups.items():
        if any(path == p or path.startswith(p.rstrip("/") + "/") for p in paths):
            return g
    return None


def uncommitted(repo, paths):
    """Files under `paths` that differ from HEAD in the working tree (staged or not) or are untracked."""
    if not paths:
        return set()
    _, a = git(repo, "diff", "--name-only", "HEAD", "--", *paths)
    _, b = git(repo, "ls-files", "--others", "--exclude-standard", "--", *paths)
    return set(a.split()) | set(b.split())


def _dirty(flag, paths, groups, what="measured", repo=None):
    """Why a run with uncommitted changes (flag, paths: its dirty and dirty_paths) cannot vouch for
    the code in `groups`, or None: it was clean, or its changes were outside them (docs, results,
    tests)."""
    if not flag:
        return None
    if not isinstance(paths, list):
        return f"{what} with uncommitted changes (which files is not recorded)"
    mine = [p for p in paths if _group_of(p, groups, repo)]
    if not mine:
        return None
    return (f"{what} with uncommitted changes to {', '.join(mine[:3])}"
            + (f" and {len(mine) - 3} more" if len(mine) > 3 else ""))


COMMON = "bench/experiments/common.py"


def scripts(name):
    """The code of results/<name> that a rendering runs: its own Python scripts (its producer and
    the modules of its own that it imports; not bench/tests/, and not its other own files: the slow
    disk's C, fuzz.sh and the fuzz targets, packaging/, scripts/package.sh, which only measure) and
    bench/experiments/common.py where the result runs it."""
    groups = _paths(name)
    own = [p for p in groups["own"] if p.endswith(".py") and not p.startswith("bench/tests/")]
    return own + [p for p in groups.get("harness", []) if p == COMMON]


def _commit_ok(repo, c):
    return bool(c) and git(repo, "rev-parse", "--verify", "--quiet", c + "^{commit}")[0] == 0


def _since(repo, c, paths):
    """The files under `paths` that changed from commit `c` to HEAD."""
    if not paths:
        return set()
    _, out = git(repo, "diff", "--name-only", c, "HEAD", "--", *paths)
    return set(out.split())


def judge(repo, name, m, pending=None):
    """What changed since manifest `m` of results/<name> in the code it runs:
    {"verdict": "current" | "stale" | "unknown", "groups": {group: [files]}, "commit", "entry",
    "why", "rule", "rendered_commit", "scripts"}. pending: uncommitted() of every path, if already
    known. A run resumed at several commits is judged from the oldest ("commit"), and is "unknown"
    if some of its points recorded no commit.

    rule "measured": every group is judged since the measured commit. rule "rendered" (kind
    "rendered", or a parts manifest rendered again: rendered_commit R beside the measured commit M):
    the crates, the guest and bench/harness.py are judged since M, the result's scripts (scripts():
    its own Python scripts and bench/experiments/common.py) since R: the rendering vouches that
    their changes from M to R were rendering only. A run with uncommitted changes to the code the
    result runs (dirty_paths in its groups; for a rendering, rendered_dirty_paths in its scripts)
    is "unknown", never "current": what it measured or rendered is in no commit."""
    groups = _paths(name)
    paths = sorted({p for ps in groups.values() for p in ps})
    mine = scripts(name)
    if pending is None:
        pending = uncommitted(repo, paths)
    worst = None
    for part, e in entries(m):
        base = e.get("commit")
        approx = False
        if not base and e.get("data_commit"):  # recovered: the data's commit (or where it was moved from)
            base, approx = e.get("data_moved_from_commit") or e["data_commit"], True
        rendering = e if e.get("kind") == "rendered" else (m if part and m.get("rendered_commit") else None)
        rendered = rendering.get("rendered_commit") if rendering else None
        files = set(pending)
        whys = []
        base_ok = _commit_ok(repo, base)
        if not base:
            whys.append("no commit recorded")
        elif not base_ok:
            whys.append(f"commit {base[:7]} is not in this repository")
        rule = "measured"
        if rendered and _commit_ok(repo, rendered):
            rule = "rendered"
            files |= _since(repo, rendered, mine)
            if base_ok:
                files |= _since(repo, base, [p for p in paths if p not in mine])
        else:
            if rendered:
                whys.append(f"rendered commit {rendered[:7]} is not in this repository: all judged since the "
                            "measured commit")
            if base_ok:
                files |= _since(repo, base, paths)
        changed = {}
        for f in sorted(files):
            g = _group_of(f, groups, repo)
            if g:
                changed.setdefault(g, []).append(f)
        changed = {g: changed[g] for g in groups if g in changed}  # crates, guest, harness, own
        if approx and base_ok:
            whys.append(f"the measured commit is unknown: changes since the data's commit {base[:7]}")
        if None in (e.get("commits") or []):
            whys.append("points resumed from an earlier session at an unknown commit"
                        + (f": judged from the oldest known, {base[:7]}" if base else ""))
        whys.append(_dirty(e.get("dirty"), e.get("dirty_paths"), groups, repo=repo))
        if rule == "rendered":
            whys.append(_dirty(rendering.get("rendered_dirty"), rendering.get("rendered_dirty_paths", None),
                               {"scripts": mine}, "rendered"))
        whys = [w for w in whys if w]
        verdict = "stale" if changed else ("unknown" if whys or approx else "current")
        r = {"verdict": verdict, "groups": changed, "commit": base, "entry": e, "part": part,
             "why": "; ".join(whys) or None, "rule": rule, "rendered_commit": rendered if rule == "rendered" else None,
             "scripts": mine}
        rank = {"current": 0, "unknown": 1, "stale": 2}
        if worst is None or (rank[verdict], sum(map(len, changed.values()))) > \
                (rank[worst["verdict"]], sum(map(len, worst["groups"].values()))):
            worst = r
    return worst


def status(repo=REPO, results=None):
    """One dict per results/<name>/ (sorted): name, manifest (or None), and judge()'s verdict."""
    repo = Path(repo)
    results = Path(results) if results else repo / "results"
    all_paths = sorted({p for n in PRODUCERS for ps in _paths(n).values() for p in ps} |
                       {p for ps in GROUPS.values() for p in ps})
    pending = uncommitted(repo, all_paths)
    out = []
    for d in sorted(p for p in results.iterdir() if p.is_dir()):
        m = read(d)
        r = {"name": d.name, "manifest": m}
        if m is not None:
            r.update(judge(repo, d.name, m, pending))
        out.append(r)
    return out


def rule_text(r):
    """Which rule judged a status() entry, for its line: "measured at M, all since" (every group
    since the measured commit) or "measured at M, rendered at R: <its scripts> since R"."""
    e = r["entry"]
    m = (r["commit"] or "?")[:7]
    if not e.get("commit") and e.get("data_commit"):
        m = "~" + m
    at = m
    if len(e.get("commits") or []) > 1:  # a run resumed at several commits: judged from the oldest
        at = ", ".join((c or "?")[:7] for c in e["commits"])
        if r.get("rule") != "rendered":
            return f"measured at {at}, all since {m}"
    if r.get("rule") != "rendered":
        return f"measured at {at}, all since"
    names = ", ".join(p.rsplit("/", 1)[-1] for p in r["scripts"]) or "no script"
    return f"measured at {at}, rendered at {r['rendered_commit'][:7]}: {names} since {r['rendered_commit'][:7]}"


def line(r):
    """One line of `experiment.py status` for a status() entry."""
    if r["manifest"] is None:
        return f"{r['name']:<17} no manifest"
    e = r["entry"]
    commit = (r["commit"] or "?")[:7]
    if not e.get("commit") and e.get("data_commit"):
        commit = "~" + commit  # the data's commit: the measured one is unknown
    date = (e.get("started") or e.get("date") or "?")[:10]
    accel = (e.get("accel") or {}).get("name") or "?"
    mode = {True: "quick", False: "full"}.get(e.get("quick"), "?")
    if r["verdict"] == "current":
        verdict = "current"
    elif r["verdict"] == "stale":
        n = len({f for fs in r["groups"].values() for f in fs})
        verdict = f"STALE: {', '.join(r['groups'])} changed, {n} file{'s' if n != 1 else ''}"
    else:
        verdict = "UNKNOWN"
    if r["verdict"] == "unknown" and r["why"]:
        verdict += f": {r['why']} ({rule_text(r)})"
    else:
        verdict += f" ({rule_text(r)}" + (f"; {r['why']}" if r["why"] else "") + ")"
    if r["part"]:
        verdict += f" [part {r['part']}" + (f" of {len(r['manifest']['parts'])}]")
    if e.get("dirty") and "uncommitted" not in (r["why"] or ""):
        verdict += " [measured with uncommitted changes outside its code]"
    return f"{r['name']:<17} {commit:<8} {date:<10} {accel:<4} {mode:<5} {verdict}"
