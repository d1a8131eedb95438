#!/usr/bin/env bash
# Which accelerator boots the test guest on this host, and why: prints one line,
# "kvm REASON" or "tcg REASON". guest/run.sh, the demo, the experiments and the VM tests ask it.
#
# /dev/kvm opening is not enough (a kvm_pvm host runs a BIOS-level probe, then the Linux guest
# dies at its first cmpxchg16b or xrstor), so the probe boots the real thing: the test guest's
# own kernel and initramfs under QEMU -accel kvm -cpu host (run.sh's options), with a workload
# that prints a marker. KVM is used only if the marker comes within PROBE_S seconds; a QEMU
# "KVM internal error", a QEMU that fails, or no marker in time means TCG, with the reason.
#
# The verdict is cached in $COSCHED_GUEST_DIR/accel.verdict (or $COSCHED_ACCEL_VERDICT), keyed
# by the host kernel, /dev/kvm (mode, owner, whether this user may open it), the KVM modules and
# their parameters, the QEMU binary (path, size, time), the host CPU and the guest build (kernel
# and base initramfs): a boot
# does not pay for the probe again (~20 ms to check the key). An outcome that may be passing (no
# marker in time, QEMU killed by a signal) holds until the host reboots. run.sh records a fatal
# KVM error it meets at run time there too (--record-failure), so the next automatic choice is TCG.
# Run guest/accel.sh --help.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
out=${COSCHED_GUEST_DIR:-$repo/build/guest}
qemu=${COSCHED_QEMU:-qemu-system-x86_64}
cache=${COSCHED_ACCEL_VERDICT:-$out/accel.verdict}
# A working KVM boots the test guest to its workload in about a second; TCG takes 3.4 s on a
# 2-CPU VM. A KVM that needs more than this is of no use to the guest anyway.
PROBE_S=${COSCHED_ACCEL_PROBE_S:-20}
MARKER=COSCHED-KVM-PROBE-OK
# What QEMU prints when KVM fails to run the guest (it then pauses the guest and keeps running).
KVM_FATAL='KVM internal error|KVM: entry failed|kvm run failed'

usage() {
    cat <<EOF
Usage: guest/accel.sh [--accel auto|kvm|tcg] [--reprobe] [--record-failure REASON] [-q]

Prints the accelerator guest/run.sh uses on this host and why, as one line: "kvm REASON" or
"tcg REASON" (-q: prints nothing; the exit code is 0 for kvm, 1 for tcg).

  --accel auto|kvm|tcg     the choice (default: \$COSCHED_ACCEL, else auto). kvm or tcg is
                           taken as it is; auto probes (or reads the cached verdict).
  --reprobe                ignore the cached verdict and boot the probe again (implies
                           --accel auto)
  --record-failure REASON  record that KVM failed at run time (run.sh does, on a QEMU
                           "KVM internal error"): the cached verdict becomes tcg
  -h, --help               this text

auto: KVM if /dev/kvm opens, creates a VM and a vCPU, and QEMU -accel kvm -cpu host boots the
test guest's own kernel and initramfs (build/guest, from guest/build.sh) to a workload that
prints a marker within ${PROBE_S} s (COSCHED_ACCEL_PROBE_S); else TCG. The verdict is cached in
$cache per host kernel, /dev/kvm, KVM modules, QEMU binary, host CPU and guest
build (kernel, base initramfs) (no marker in time: until the host reboots).
Environment: COSCHED_ACCEL, COSCHED_GUEST_DIR, COSCHED_QEMU, COSCHED_ACCEL_PROBE_S,
COSCHED_ACCEL_VERDICT (the cache file).
EOF
}

die() { echo "accel.sh: $*" >&2; exit 2; }

accel=${COSCHED_ACCEL:-auto}
accel_from="COSCHED_ACCEL"
reprobe=0
record=
quiet=0
while [ $# -gt 0 ]; do
    case $1 in
        --accel) [ $# -ge 2 ] || die "--accel needs an argument"; accel=$2; accel_from="--accel"; shift ;;
        --reprobe) reprobe=1; accel=auto; accel_from="--reprobe" ;;
        --record-failure) [ $# -ge 2 ] || die "--record-failure needs a reason"; record=$2; shift ;;
        -q) quiet=1 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
    shift
done
case $accel in
    auto|kvm|tcg) ;;
    *) die "$accel_from must be auto, kvm or tcg (got '$accel')" ;;
esac

say() {
    [ "$quiet" = 1 ] || echo "$1 $2"
    [ "$1" = kvm ]
}

if [ "$accel" != auto ] && [ -z "$record" ]; then
    say "$accel" "chosen by $accel_from=$accel"
    exit $?
fi

# ---- step 1: /dev/kvm (cheap; its verdict is not cached) ----------------------------------
# Opens /dev/kvm, KVM_GET_API_VERSION, KVM_CREATE_VM, KVM_CREATE_VCPU.
kvm_ioctls() {
    command -v python3 >/dev/null || { echo "python3 not found, cannot probe /dev/kvm"; return 1; }
    python3 - <<'EOF'
import fcntl, os, sys
def fail(what, e):
    print(f"{what}: {os.strerror(e.errno) if e.errno else e}")
    sys.exit(1)
try:
    kvm = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
except OSError as e:
    fail("open /dev/kvm", e)
try:
    api = fcntl.ioctl(kvm, 0xAE00, 0)  # KVM_GET_API_VERSION
    if api != 12:
        print(f"KVM_GET_API_VERSION: unexpected version {api}")
        sys.exit(1)
    vm = fcntl.ioctl(kvm, 0xAE01, 0)  # KVM_CREATE_VM
    vcpu = fcntl.ioctl(vm, 0xAE41, 0)  # KVM_CREATE_VCPU
except OSError as e:
    fail("KVM ioctl", e)
EOF
}

# ---- the cache key -------------------------------------------------------------------------
# Runs nothing heavier than stat, find and grep (~20 ms): every boot reads it. The QEMU binary by
# path, size and time (a new QEMU version is a new binary); /dev/kvm by mode, owner, device number
# and whether this user may open it; the KVM modules with their parameters; the host CPU's model,
# flags and microcode; the guest kernel and base initramfs (init.sh is in it) by size and time.
key() {
    local qpath kmods access cpu
    qpath=$(command -v "$qemu" || echo "$qemu")
    kmods=$(find /sys/module -maxdepth 1 -name 'kvm*' -printf '%f\n' 2>/dev/null | sort | tr '\n' ' ')
    kmods="$kmods$(grep -rs . /sys/module/kvm*/parameters 2>/dev/null | md5sum | cut -c1-12)"
    access=noaccess
    if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then access=rw; fi
    cpu=$(grep -m3 -E '^(model name|flags|microcode)' /proc/cpuinfo 2>/dev/null | md5sum | cut -c1-12)
    printf 'host %s %s cpu %s; /dev/kvm %s %s; kvm modules %s; qemu %s %s; guest %s %s' \
        "$(uname -r)" "$(cat /proc/sys/kernel/version 2>/dev/null)" "$cpu" \
        "$(stat -L -c '%a %u:%g %t:%T' /dev/kvm 2>/dev/null || echo absent)" "$access" "$kmods" \
        "$qpath" "$(stat -L -c '%s %Y' "$qpath" 2>/dev/null || echo "not found")" \
        "$(cat "$out/kernel-package" 2>/dev/null)" \
        "$(cd "$out" 2>/dev/null && stat -c '%n %s %Y' vmlinux vmlinuz base.cpio 2>/dev/null | tr '\n' ' ')"
}
boot_id() { cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo unknown; }

# write_verdict ACCEL REASON [until-reboot]: a verdict a user may not write (another user's
# cache) is only not cached.
write_verdict() {
    local tmpf
    mkdir -p "$(dirname "$cache")" 2>/dev/null || return 0
    tmpf=$(mktemp "$cache.XXXXXX" 2>/dev/null) || return 0
    chmod 644 "$tmpf"
    {
        printf 'key %s\nverdict %s\nreason %s\n' "$(key)" "$1" "$2"
        if [ -n "${3:-}" ]; then printf 'boot %s\n' "$(boot_id)"; fi
    } >"$tmpf"
    mv -f "$tmpf" "$cache" 2>/dev/null || rm -f "$tmpf"
}

mkdir -p "$(dirname "$cache")" 2>/dev/null || true
# One probe at a time: guests started together wait for the first one's verdict (the probe's
# QEMU cannot outlive its bound, so neither can the lock). A lock file of another user's is
# opened read-only, which flock takes as well; none at all: no lock.
if { exec 9<>"$cache.lock"; } 2>/dev/null || { exec 9<"$cache.lock"; } 2>/dev/null; then
    flock -w $((PROBE_S + 30)) 9 || die "$cache.lock held for $((PROBE_S + 30)) s: is a probe stuck?"
fi

if [ -n "$record" ]; then
    write_verdict tcg "KVM failed at run time: $record (guest/accel.sh --reprobe tries again)"
    [ "$quiet" = 1 ] || echo "tcg recorded: $record"
    exit 0
fi

# The guest build to probe with (build.sh is quick when it is up to date).
if [ ! -f "$out/base.cpio" ] || { [ ! -f "$out/vmlinux" ] && [ ! -f "$out/vmlinuz" ]; }; then
    "$here/build.sh" --quiet >&2 || die "guest/build.sh failed: no test guest to probe KVM with"
fi

k=$(key)
if [ "$reprobe" = 0 ] && [ -f "$cache" ] && [ "$(sed -n 's/^key //p' "$cache")" = "$k" ] &&
    { ! grep -q '^boot ' "$cache" || [ "$(sed -n 's/^boot //p' "$cache")" = "$(boot_id)" ]; }; then
    v=$(sed -n 's/^verdict //p' "$cache")
    r=$(sed -n 's/^reason //p' "$cache")
    if [ "$v" = kvm ] || [ "$v" = tcg ]; then
        say "$v" "$r (cached)"
        exit $?
    fi
fi

if ! why=$(kvm_ioctls); then
    say tcg "KVM unusable: $why"
    exit $?
fi

# ---- step 2: boot the test guest under KVM ----------------------------------------------
command -v "$qemu" >/dev/null || { say tcg "KVM unusable: $qemu not found"; exit $?; }
kernel=$out/vmlinux
[ -f "$kernel" ] || kernel=$out/vmlinuz
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cosched-accel.XXXXXX")
qpid=
cleanup() {
    if [ -n "$qpid" ]; then
        kill -KILL "$qpid" 2>/dev/null || true
        { wait "$qpid"; } 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p "$tmp/stage"
printf '#!/bin/sh\necho %s\n' "$MARKER" >"$tmp/stage/workload.sh"
chmod 755 "$tmp/stage/workload.sh"
{ cat "$out/base.cpio"; (cd "$tmp/stage" && echo ./workload.sh | cpio --quiet -o -H newc -R 0:0); } >"$tmp/initrd.cpio"

start=$(date +%s%N)
# bash reports a background job that died by a signal ("Aborted": QEMU aborts when it cannot
# set up the vCPU) on its own stderr: that is in the verdict, so not on the terminal too.
# Bounded on its own: QEMU dies with its parent, timeout (pdeathsig, set by setpriv right before
# it execs QEMU), and timeout kills it at the bound even if this script was SIGKILLed. In this
# script's process group (--foreground), so that a Ctrl-C reaches it. Without the lock (fd 9)
# and this script's stderr (fd 7).
exec 7>&2 2>/dev/null
bound=(timeout --foreground -s KILL $((PROBE_S + 5)))
if command -v setpriv >/dev/null; then bound+=(setpriv --pdeathsig KILL --); fi
"${bound[@]}" "$qemu" -name cosched-kvm-probe -accel kvm -cpu host -machine pc -smp 1 -m 256 \
    -display none -nodefaults -serial stdio -no-reboot \
    -kernel "$kernel" -initrd "$tmp/initrd.cpio" \
    -append "console=ttyS0 quiet loglevel=1 panic=-1 cryptomgr.notests" \
    </dev/null >"$tmp/console" 2>"$tmp/err" 7>&- 9>&- &
qpid=$!
verdict=
passing=
while :; do
    elapsed_ms=$((($(date +%s%N) - start) / 1000000))
    if grep -q "$MARKER" "$tmp/console" 2>/dev/null; then
        verdict=kvm
        reason="the test guest ($(cat "$out/kernel-version" 2>/dev/null || echo "its kernel")) booted under KVM ($("$qemu" --version 2>/dev/null | head -n1 || true)) to its workload in $(awk -v m="$elapsed_ms" 'BEGIN { printf "%.1f", m / 1000 }') s"
        break
    fi
    if line=$(grep -m1 -E "$KVM_FATAL" "$tmp/err" 2>/dev/null); then
        verdict=tcg
        reason="KVM cannot run the test guest: QEMU: $line"
        break
    fi
    if ! kill -0 "$qpid" 2>/dev/null; then
        rc=0
        { wait "$qpid"; } 2>/dev/null || rc=$?
        qpid=
        if grep -q "$MARKER" "$tmp/console"; then continue; fi
        err=$(grep -v '^[[:space:]]*$' "$tmp/err" | head -n1 | sed "s|^$qemu: ||" || true)
        verdict=tcg
        reason="KVM cannot run the test guest: QEMU -accel kvm -cpu host exited $rc: ${err:-no message}"
        # Killed by a signal other than its own abort (SIGABRT: it could not set up the vCPU),
        # e.g. by the OOM killer: maybe passing.
        if [ "$rc" -gt 128 ] && [ "$rc" != 134 ]; then passing=1; fi
        break
    fi
    if [ "$elapsed_ms" -ge $((PROBE_S * 1000)) ]; then
        last=$(tr -d '\r' <"$tmp/console" | grep -v '^[[:space:]]*$' | tail -n1 | cut -c1-100 || true)
        verdict=tcg
        reason="KVM cannot run the test guest: it printed no marker within ${PROBE_S} s under QEMU -accel kvm -cpu host (console: ${last:-nothing})"
        passing=1
        break
    fi
    sleep 0.1
done
if [ -n "$qpid" ]; then
    kill -TERM "$qpid" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$qpid" 2>/dev/null || break; sleep 0.1; done
fi
exec 2>&7 7>&-
write_verdict "$verdict" "$reason" "$passing"
say "$verdict" "$reason"
