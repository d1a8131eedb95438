#!/usr/bin/env bash
# All tests, three tiers: unprivileged unit tests, root tests on the real kernel (the daemon,
# fake QEMU processes with real threads, sched_getattr), and VM tests that boot the test guest
# with the real agent under host load; between them, fuzzing (bench/fuzz.sh: the three targets at
# once for 90 s, about 60 s of CPU each on 2 CPUs).
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
# Each stage's wall time, printed at the end of the run (also when a stage fails).
stages=()
stage_name=
stage_t0=
run_t0=$SECONDS
stage() {
    local now=$SECONDS
    [ -z "$stage_name" ] || stages+=("$(printf '%-58s %4d:%02d' "$stage_name" $(((now - stage_t0) / 60)) $(((now - stage_t0) % 60)))")
    stage_name=$1
    stage_t0=$now
    [ -z "$stage_name" ] || echo "== $stage_name"
}
report() {
    local rc=$?
    stage ""
    echo "== stage times ($([ "$rc" = 0 ] && echo passed || echo "FAILED, exit $rc"))"
    printf '%s\n' "${stages[@]}"
    printf '%-58s %4d:%02d\n' total $(((SECONDS - run_t0) / 60)) $(((SECONDS - run_t0) % 60))
}
trap report EXIT
# Each stage's command runs as a child the script waits for: a signal to the script is then
# handled at once (bash runs a trap only between commands, and `wait` is interrupted by one).
# The trap sends the stage SIGTERM (a background child of a script ignores SIGINT, so a Ctrl-C
# is passed on as SIGTERM), waits for it to clean up after itself (its guests, daemons, groups)
# and ends the run with 128 + the signal, so that the times say FAILED.
child=
run() {
    "$@" &
    child=$!
    wait "$child"
}
on_signal() {
    trap - TERM INT HUP
    if [ -n "$child" ]; then
        kill -TERM "$child" 2>/dev/null || true
        wait "$child" 2>/dev/null || true
    fi
    exit "$1"
}
trap 'on_signal 143' TERM
trap 'on_signal 130' INT
trap 'on_signal 129' HUP
stage "setup: packages, build (with the test binaries), test guest (scripts/setup.sh)"
COSCHED_SETUP_TESTS=1 run scripts/setup.sh
# User-space threads at a real-time policy (kernel threads have no exe).
rt_threads() {
    ps -eLo pid=,tid=,cls=,comm= | awk '$3=="FF" || $3=="RR" || $3=="DLN"' | while read -r pid tid cls comm; do
        readlink "/proc/$pid/exe" >/dev/null 2>&1 && echo "$pid $tid $cls $comm"
    done | sort || true
}
before=$(rt_threads)
# Missing root or a missing built piece is a failure here, never a silent skip.
export COSCHED_REQUIRE_ROOT=1
stage "unit and root tests (cargo test)"
run cargo test --release --locked --workspace
stage "fuzzing: frame decoder, control requests, config (90 s, at once)"
run bash bench/fuzz.sh --parallel --seconds 90
stage "harness and VM tests (bench/tests)"
# (unittest discover, and each test's time at the end, slowest first)
run /usr/bin/python3 bench/run_tests.py
stage "no thread left at a real-time policy by the tests"
left=$(comm -13 <(echo "$before") <(rt_threads))
if [ -n "$left" ]; then
    echo "FAIL: user-space threads left at a real-time policy:"
    echo "$left"
    exit 1
fi
echo "all tests passed"
