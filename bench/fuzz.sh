#!/usr/bin/env bash
# Coverage-guided fuzzing of the inputs a guest or an operator controls: the guest channel's
# frame decoder, the control socket's request parser, the host config loader (fuzz/, cargo-fuzz
# and libFuzzer on the nightly toolchain, with AddressSanitizer). Each target starts from the
# committed corpus (fuzz/corpus/<target>) and adds what it finds there.
#   bash bench/fuzz.sh --seconds 60          (60 s per target, one after another)
#   bash bench/fuzz.sh --parallel --seconds 90
#                                            (CI: the three at once on 2 CPUs, ~60 s of CPU each)
#   bash bench/fuzz.sh --runs 10000000       (the campaign: 10 million executions per target)
# A crash, a hang (an input taking over 10 s) or memory past 1 GiB fails the target and leaves
# the input in fuzz/artifacts/<target>/. With --report FILE, a markdown table of what ran, after
# a line saying when (UTC), at which commit (and whether the tree had uncommitted changes), with
# which rustc and cargo-fuzz, and the command; the table has each target's RSS after 10 s of
# fuzzing (the last libFuzzer reported by then) beside its peak, so that growth can be judged.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
command_line="bash bench/fuzz.sh $*"
limit=(-max_total_time=60)
report=
parallel=0
while [ $# -gt 0 ]; do
    case $1 in
        --seconds) limit=(-max_total_time="$2"); shift 2 ;;
        --runs) limit=(-runs="$2"); shift 2 ;;
        --report) report=$2; shift 2 ;;
        --parallel) parallel=1; shift ;;
        *) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
if ! command -v cargo >/dev/null && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
command -v cargo-fuzz >/dev/null || { echo "fuzz.sh: cargo-fuzz missing: scripts/setup.sh installs it" >&2; exit 1; }
# AddressSanitizer needs the nightly toolchain; without one (or with FUZZ_TOOLCHAIN=stable) the
# same targets run coverage-guided on stable, without the sanitizer.
toolchain=${FUZZ_TOOLCHAIN:-nightly}
if [ "$toolchain" = nightly ] && ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz.sh: no nightly toolchain: fuzzing on stable, without AddressSanitizer" >&2
    toolchain=stable
fi
sanitizer=address
[ "$toolchain" = nightly ] || sanitizer=none
fuzz=(cargo "+$toolchain" fuzz)
export CC=clang CXX=clang++
targets=(frame_decoder control_request config_loader)
"${fuzz[@]}" build -O -s "$sanitizer"
if [ -n "$report" ]; then
    commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    dirty=$(git status --porcelain --untracked-files=no -- . ':!results' 2>/dev/null | head -1)
    rustc_version=$(rustc "+$toolchain" --version 2>/dev/null || echo "rustc: unknown")
    fuzz_version=$(cargo fuzz --version 2>/dev/null || echo "cargo-fuzz: unknown")
    # shellcheck disable=SC2016  # the backquotes are Markdown's
    printf 'Fuzzed %s at commit %s%s with %s and %s, sanitizer %s: `%s`.\n\n' \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$commit" "${dirty:+ (with uncommitted changes)}" "$rustc_version" \
        "$fuzz_version" "$sanitizer" "$command_line" > "$report"
    printf '| target | toolchain, sanitizer | executions | exec/s | corpus | RSS at 10 s (MB) | peak RSS (MB) | seconds | result |\n|---|---|---|---|---|---|---|---|---|\n' >> "$report"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# rss_after LOG OUT SECONDS: after SECONDS, the last RSS (MB) libFuzzer reported in LOG
# ("... rss: 422Mb"), into OUT.
rss_after() {
    sleep "$3"
    { grep -o 'rss: [0-9]*Mb' "$1" 2>/dev/null || true; } | tail -1 | tr -dc '0-9' >"$2"
}
# run_target T: fuzzes T; its line of the summary in $work/T.line, its table row in $work/T.row,
# "FAILED" in $work/T.failed when it failed (with the end of its log on stderr).
run_target() {
    local t=$1 log=$work/$1.log start result secs execs rate rss rss10 corpus sampler
    start=$(date +%s)
    mkdir -p "fuzz/corpus/$t"
    : >"$log"
    rss_after "$log" "$work/$t.rss10" 10 &
    sampler=$!
    if "${fuzz[@]}" run -O -s "$sanitizer" "$t" "fuzz/corpus/$t" -- "${limit[@]}" -timeout=10 -rss_limit_mb=1024 \
        -print_final_stats=1 >"$log" 2>&1; then
        result=ok
    else
        result=FAILED
        echo FAILED >"$work/$t.failed"
        { echo "fuzz.sh: $t failed; the end of its log:"; tail -40 "$log"; } >&2
    fi
    secs=$(( $(date +%s) - start ))
    # A run shorter than 10 s has no RSS after 10 s.
    if kill -0 "$sampler" 2>/dev/null; then kill_tree "$sampler"; wait "$sampler" 2>/dev/null || true; rss10="-"
    else wait "$sampler" 2>/dev/null || true; rss10=$(cat "$work/$t.rss10" 2>/dev/null); fi
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
    corpus=$(find "fuzz/corpus/$t" -type f | wc -l)
    echo "fuzz.sh: $t ($toolchain, sanitizer $sanitizer$([ "$parallel" = 1 ] && echo ", ${#targets[@]} at once")): $result, ${execs:-?} executions (${rate:-?}/s), corpus $corpus, RSS ${rss10:-?} MB after 10 s, peak ${rss:-?} MB, ${secs} s" >"$work/$t.line"
    echo "| $t | $toolchain, $sanitizer | ${execs:-?} | ${rate:-?} | $corpus | ${rss10:-?} | ${rss:-?} | $secs | $result |" >"$work/$t.row"
}
# Each target runs as a child this script waits for, so that SIGINT or SIGTERM stops the
# fuzzers (cargo-fuzz and libFuzzer under it) at once instead of leaving them to run on.
pids=()
# shellcheck disable=SC2317  # called from the traps
kill_tree() {
    local child
    for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
    kill -TERM "$1" 2>/dev/null || true
}
# shellcheck disable=SC2317  # called from the traps
on_signal() {
    trap - INT TERM
    local pid
    for pid in "${pids[@]}"; do kill_tree "$pid"; done
    wait
    exit "$1"
}
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
if [ "$parallel" = 1 ]; then
    # libFuzzer runs one process per target: on 2 CPUs, three at once for 90 s get about the CPU
    # time each that 60 s one after another gave, in half the wall time.
    for t in "${targets[@]}"; do
        run_target "$t" &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || true; done
else
    for t in "${targets[@]}"; do
        run_target "$t" &
        pids=($!)
        wait "${pids[0]}" || true
    done
fi
failed=0
for t in "${targets[@]}"; do
    cat "$work/$t.line"
    [ -z "$report" ] || cat "$work/$t.row" >>"$report"
    [ ! -e "$work/$t.failed" ] || failed=1
done
exit $failed
