#!/usr/bin/env bash
# All tests, three tiers: unprivileged unit tests, root tests on the real kernel (the daemon,
# fake QEMU processes with real threads, sched_getattr), and VM tests that boot the test guest
# with the real agent under host load; between them, 60 s of fuzzing per target (bench/fuzz.sh).
# Installs and builds first (scripts/setup.sh). Run as root.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Root is needed (packages, the daemon, QEMU threads). A root shell runs it as it is; otherwise
# it re-runs itself with sudo, where sudo is installed (a fresh Debian root shell has none).
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null; then
        exec sudo -E env "PATH=$PATH" bash "${BASH_SOURCE[0]}" "$@"
    fi
    echo "$(basename "$0"): needs root, and sudo is not installed: run it from a root shell (su -)" >&2
    exit 1
fi
cd "$repo"
scripts/setup.sh
# User-space threads at a real-time policy (kernel threads have no exe).
rt_threads() {
    ps -eLo pid=,tid=,cls=,comm= | awk '$3=="FF" || $3=="RR" || $3=="DLN"' | while read -r pid tid cls comm; do
        readlink "/proc/$pid/exe" >/dev/null 2>&1 && echo "$pid $tid $cls $comm"
    done | sort || true
}
before=$(rt_threads)
# Missing root or a missing built piece is a failure here, never a silent skip.
export COSCHED_REQUIRE_ROOT=1
echo "== unit and root tests (cargo test)"
cargo test --release --locked --workspace
echo "== fuzzing: the frame decoder, the control request parser, the config loader (60 s each)"
bash bench/fuzz.sh --seconds 60
echo "== harness and VM tests (bench/tests)"
/usr/bin/python3 -m unittest discover -s bench/tests -v
echo "== no thread left at a real-time policy by the tests"
left=$(comm -13 <(echo "$before") <(rt_threads))
if [ -n "$left" ]; then
    echo "FAIL: user-space threads left at a real-time policy:"
    echo "$left"
    exit 1
fi
echo "all tests passed"
