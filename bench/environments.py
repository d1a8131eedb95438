"""Runs the tests of the environments operators run (bench/tests/test_environments.py: a Debian
guest with systemd and udev, the host unit under a real systemd, the container under podman)
and writes results/environments/: data.csv (what each measured, and each test's result),
summary.md (the targets table: each environment's test passed, judged from data.csv; what ran,
its times, what had to change, what is still untested), plot.png (the times), with the commit
and accelerator.

  sudo /usr/bin/python3 bench/environments.py [--out DIR]     (about 3 minutes)
  /usr/bin/python3 bench/environments.py --render [--out DIR]  (no root: summary and plot again
                                                               from data.csv)
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))
import harness  # noqa: E402
import manifest  # noqa: E402

OUT = harness.REPO / "results/environments"
TESTS = {
    "debian-guest": "test_environments.DebianGuestPackage",
    "host-unit": "test_environments.HostUnitUnderSystemd",
    "podman": "test_environments.PodmanContainer",
}
# What each environment is, what had to change for it, and what is still untested: the test's
# findings, kept here with the generator (the figures come from the run).
ABOUT = {
    "debian-guest": dict(
        title="A Debian 12 guest with systemd and udev, the guest package installed with apt",
        ran="guest/build-debian.sh builds Debian 12 (minbase, systemd, udev, rt-tests, and the busybox test "
            "guest's kernel) from Debian's packages with mmdebstrap; the guest boots that kernel with its own "
            "initramfs and 1 vCPU. "
            "In it: `apt-get install ./cosched_*.deb ./cosched-guest_*.deb` (the port org.cosched.0 already "
            "there: the postinst's udev trigger starts the unit), the agent registers with a host daemon, "
            "`cyclictest -p 80` beside a guest hog under 2 host hogs is boosted, `systemctl stop cosched-guest` "
            "deregisters it and the host restores the vCPU, a reboot starts it again through udev at boot and "
            "it registers, `apt-get purge` stops it and leaves no package, file or process.",
        changed="Nothing in the unit, the udev rule or the package. The test harness: `apt-get install "
                "--no-download` with local packages fails with an internal error in Debian 12's apt, so the "
                "test installs as the README says.",
        untested="A KVM guest (this host's KVM cannot run the test guest); other distributions' guests."),
    "host-unit": dict(
        title="cosched-host.service under a real systemd (cgroup v2)",
        ran="In the same Debian guest (1 vCPU; systemd's unified cgroup v2 hierarchy): `apt-get install "
            "./cosched_*.deb ./cosched-host_*.deb` enables and starts the unit with its sandbox "
            "(ProtectSystem=strict, the capability bounding set, NoNewPrivileges, the system-call filter). "
            "Fake QEMU processes (cosched-fake-qemu, in scopes of their own as libvirt's VMs are): a boost "
            "and its undo, an I/O raise of the iothread and its undo, a memory-bandwidth throttle (the "
            "simulated backend: the guest has no counters) through cgroup.freeze of the VM's own scope, "
            "`systemctl kill -s KILL` while boosted (ExecStopPost's restore, then Restart=on-failure), "
            "a static FIFO added by `systemctl reload` without a restart, `systemctl stop` restoring all.",
        changed="Nothing in the unit's sandbox. The test's config sets host_reserve_cpus = 0: the "
                "guest has 1 CPU, and by default the daemon keeps one for the host, so it refused every "
                "boost there (DENY host_reserve), as designed. A 2-vCPU guest under TCG stalled "
                "(soft lockups) in one of the two runs tried here, so the test uses one vCPU.",
        untested="A real QEMU/KVM VM under this unit inside the guest (nested virtualization); "
                 "resctrl and PMU counters (none here)."),
    "podman": dict(
        title="The container image under podman, as the DaemonSet runs it",
        ran="packaging/Containerfile built with `--target prebuilt` on a Debian 12 base imported from "
            "mmdebstrap (docker.io cannot be reached here), run with the host's PID and network namespaces, "
            "not privileged, every capability dropped but the unit's seven, a read-only root, "
            "no-new-privileges, /run/cosched and /sys/fs/cgroup from the host. It found a fake QEMU on the "
            "host, boosted it, served its metrics, and restored it on `podman stop`.",
        changed="The manifest asks for no seccomp filter (seccompProfile Unconfined): under podman's "
                "default profile bpf() was refused and host BPF was unsupported. On this kernel (real-time "
                "group scheduling) the container's cpu group has no real-time runtime, so the daemon's own "
                "SCHED_FIFO was refused and it exited: the test sets daemon_priority = 0, and the manifest "
                "says to there. The Containerfile got BUILD_IMAGE/BASE_IMAGE arguments and a `prebuilt` "
                "target. This host's own limits: podman runs with runc (crun refuses its hybrid cgroup "
                "layout) and explicit ulimits (its root lacks CAP_SYS_RESOURCE).",
        untested="A Kubernetes cluster (none here; the manifest is validated offline); the image's default "
                 "target, whose build stage needs docker.io's Rust image."),
}


def git(*args):
    return subprocess.run(["git", "-C", str(harness.REPO), *args], capture_output=True, text=True).stdout.strip()


# The times each environment's test records (data.csv's measures), for the plot.
TIMES = {"debian-guest": ("boot_s", "uptime_s", "install_s", "reboot_s"),
         "host-unit": ("boot_s", "started_s", "sequence_s"),
         "podman": ("base_s", "build_s", "start_s")}


def stored_rows(out=OUT):
    from experiments.common import read_csv
    return read_csv(Path(out) / "data.csv", text=("environment", "measure"))


def values_of(rows):
    """{environment: {measure: value}}, numbers as floats (data.csv keeps them as text)."""
    out = {}
    for r in rows:
        v = r["value"]
        try:
            v = float(v) if not isinstance(v, (int, float)) else v
        except ValueError:
            pass
        out.setdefault(r["environment"], {})[r["measure"]] = v
    return out


def targets(rows):
    """Each environment's test passes: met or missed by its recorded result; not judged (not a
    failure) where this run's data.csv records none."""
    from evaluation import NOT_JUDGED
    from experiments.common import target
    values = values_of(rows)
    out = []
    for env, about in ABOUT.items():
        result = values.get(env, {}).get("result")
        out.append(target(f"{about['title']}: its test (bench/tests/test_environments.py) passes",
                          result if result is not None else "not measured in this run (no result in its data.csv)",
                          result == "passed" if result is not None else NOT_JUDGED, "one run"))
    return out


def plot(rows, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    values = values_of(rows)
    fig, ax = plt.subplots(figsize=(9, 4), layout="constrained")
    x, ticks, labels = 0, [], []
    for env, keys in TIMES.items():
        for k in keys:
            v = values.get(env, {}).get(k)
            if isinstance(v, float):
                ax.bar(x, v, color="tab:blue")
                ax.text(x, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
            ticks.append(x)
            labels.append(f"{env}\n{k[:-2]}")
            x += 1
        x += 0.5
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_ylabel("seconds")
    accel = values.get("debian-guest", {}).get("accel")
    ax.set_title(f"The environments operators run: how long each step took ({str(accel).upper() if accel else 'the'} "
                 "guest); no time target: the targets are the tests passing", fontsize=9)
    fig.savefig(Path(out) / "plot.png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def write_summary(rows, out, header):
    """summary.md (the targets table, then each environment: what ran, its times, what had to
    change, what is still untested) and plot.png, from data.csv's rows."""
    from experiments.common import targets_md
    values = values_of(rows)

    def fig(env, key, fmt="{:.1f} s"):
        v = values.get(env, {}).get(key)
        return fmt.format(v) if isinstance(v, (int, float)) else (str(v) if v is not None else "not measured")
    times = {
        "debian-guest": f"kernel {fig('debian-guest', 'kernel', '{}')}; boot to the test driver "
                        f"{fig('debian-guest', 'boot_s')} (guest uptime "
                        f"{fig('debian-guest', 'uptime_s')}), install {fig('debian-guest', 'install_s')}, "
                        f"{fig('debian-guest', 'boosts', '{:.0f}')} boost(s) under host load, reboot "
                        f"{fig('debian-guest', 'reboot_s')}",
        "host-unit": f"boot {fig('host-unit', 'boot_s')}, packages installed and the unit active "
                     f"{fig('host-unit', 'started_s')}, the whole sequence {fig('host-unit', 'sequence_s')}",
        "podman": f"{fig('podman', 'podman', '{}')}: base image {fig('podman', 'base_s')}, image built "
                  f"{fig('podman', 'build_s')}, the daemon up with the VM found {fig('podman', 'start_s')}",
    }
    parts = []
    for env, about in ABOUT.items():
        result = values.get(env, {}).get("result", "result not recorded")
        parts.append(f"## {about['title']}: {result}\n\n- **What ran:** {about['ran']}\n"
                     f"- **Times:** {times[env]}.\n- **What had to change:** {about['changed']}\n"
                     f"- **Still untested:** {about['untested']}\n")
    summary = (f"# The environments operators run\n\n{header}\n\n{targets_md(targets(rows))}\n\n"
               "The tests are bench/tests/test_environments.py; CI runs all three. Figures: data.csv; the times: "
               "plot.png.\n\n" + "\n".join(parts))
    (Path(out) / "summary.md").write_text(summary)
    plot(rows, out)
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(OUT), help="output directory (default results/environments)")
    ap.add_argument("--render", action="store_true", help="summary.md and plot.png again from data.csv, no tests")
    a = ap.parse_args()
    run = manifest.Run()
    out = Path(a.out)
    if a.render:
        header = manifest.rendered_header(out, "sudo /usr/bin/python3 bench/environments.py")
        print(write_summary(stored_rows(out), out, header))
        manifest.write(out, run, name="environments", producer="bench/environments.py", quick=False, rendered=True)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    results = {}
    with tempfile.NamedTemporaryFile(prefix="cosched-env-", suffix=".jsonl") as rec:
        os.environ["COSCHED_ENV_RECORD"] = rec.name
        for env, name in TESTS.items():
            suite = unittest.defaultTestLoader.loadTestsFromName(name)
            r = unittest.TextTestRunner(verbosity=2).run(suite)
            results[env] = ("passed" if r.wasSuccessful() and not r.skipped else
                            "skipped: " + "; ".join(why for _, why in r.skipped) if r.wasSuccessful() else "FAILED")
        records = [json.loads(line) for line in Path(rec.name).read_text().splitlines() if line.strip()]
    rows = []
    for rcd in records:
        for k, v in rcd.items():
            if k != "env":
                rows.append({"environment": rcd["env"], "measure": k, "value": v})
    rows += [{"environment": env, "measure": "result", "value": res} for env, res in results.items()]
    with open(out / "data.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["environment", "measure", "value"])
        w.writeheader()
        w.writerows(rows)
    accel, reason = harness.accel()
    commit = git("rev-parse", "--short", "HEAD")
    # Dirty: uncommitted changes to what the tests run (not to the documentation).
    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no", "--", "crates",
                                                 "bench", "guest", "packaging", "scripts", "Cargo.toml",
                                                 "Cargo.lock") else ""
    header = (f"Command: `sudo /usr/bin/python3 bench/environments.py` (took {(time.time() - t0) / 60:.1f} min on "
              f"{time.strftime('%Y-%m-%d')}, commit {commit}{dirty}, {os.cpu_count()} CPUs, Linux "
              f"{os.uname().release}, accelerator {accel}: {reason}).")
    write_summary(rows, out, header)
    manifest.write(out, run, name="environments", producer="bench/environments.py", quick=False,
                   accel=(accel.upper(), reason))
    print(f"environments: {out}")
    return 0 if all(v == "passed" for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
