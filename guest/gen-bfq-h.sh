#!/usr/bin/env bash
# Generate crates/agent/src/bpf/bfq.h: the types of the test guest's BFQ module (struct
# bfq_data, struct bfq_queue, ...), which live in bfq.ko's BTF (/sys/kernel/btf/bfq in the
# guest), not in vmlinux's.
#
# bfq.ko's BTF is split BTF on top of vmlinux's: `bpftool -B vmlinux btf dump file bfq.ko
# format c` dumps the base types too (all of vmlinux.h), followed by the module's own. This
# script dumps vmlinux alone with the same bpftool, checks that the module's dump is that dump
# with one block inserted, and keeps that block, under its own include guard and the same
# preserve_access_index pragma as vmlinux.h (every field access is a CO-RE relocation). Include
# it after vmlinux.h. (bpftool 7.1, Debian 12's, takes the base as -B; newer ones also accept
# `btf dump file bfq.ko base vmlinux`.)
# Output: crates/agent/src/bpf/bfq.h (override with the first argument).
# Inputs: ${COSCHED_GUEST_DIR:-<repo>/build/guest}/vmlinux and the kernel tree build.sh
# extracted into cache/kernel.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
out=${COSCHED_GUEST_DIR:-$repo/build/guest}
dest=${1:-$repo/crates/agent/src/bpf/bfq.h}

command -v bpftool >/dev/null || { echo "gen-bfq-h.sh: bpftool not found (apt-get install bpftool)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "gen-bfq-h.sh: python3 not found" >&2; exit 1; }

"$here/build.sh" --quiet >&2
kver=$(cat "$out/kernel-version")
kpkg=$(cat "$out/kernel-package")
[ -f "$out/vmlinux" ] || { echo "gen-bfq-h.sh: $out/vmlinux missing" >&2; exit 1; }
ko=$(find "$out/cache/kernel/lib/modules/$kver/kernel/block" \( -name bfq.ko -o -name bfq.ko.xz -o -name bfq.ko.zst \) -print -quit)
[ -n "$ko" ] || { echo "gen-bfq-h.sh: no bfq.ko for $kver (is BFQ built in? then its types are in vmlinux.h)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
case $ko in
    *.xz) xz -dc "$ko" >"$tmp/bfq.ko" ;;
    *.zst) zstd -qdc "$ko" >"$tmp/bfq.ko" ;;
    *) cp "$ko" "$tmp/bfq.ko" ;;
esac
bpftool btf dump file "$out/vmlinux" format c >"$tmp/base.h"
bpftool -B "$out/vmlinux" btf dump file "$tmp/bfq.ko" format c >"$tmp/split.h"

python3 - "$tmp/base.h" "$tmp/split.h" "$tmp/types.h" <<'PY'
import sys
base = open(sys.argv[1]).read().splitlines()
split = open(sys.argv[2]).read().splitlines()
pre = 0
while pre < min(len(base), len(split)) and base[pre] == split[pre]:
    pre += 1
suf = 0
while suf < min(len(base), len(split)) - pre and base[-1 - suf] == split[-1 - suf]:
    suf += 1
if pre + suf != len(base) or len(split) <= len(base):
    sys.exit(f"gen-bfq-h.sh: the module's dump is not vmlinux's plus one block "
             f"(common prefix {pre}, suffix {suf} lines of {len(base)})")
block = split[pre:len(split) - suf]
if not any(l.startswith("struct bfq_data {") for l in block):
    sys.exit("gen-bfq-h.sh: no struct bfq_data in the module's types")
open(sys.argv[3], "w").write("\n".join(block).strip("\n") + "\n")
PY

{
    cat <<HDR
/* SPDX-License-Identifier: GPL-2.0 */
/*
 * GENERATED FILE, do not edit.
 * The BFQ module's own types, from the BTF of bfq.ko of the cosched test guest's kernel $kver
 * (Debian package: $kpkg); the guest kernel has them in /sys/kernel/btf/bfq.
 * Regenerate with: guest/gen-bfq-h.sh
 * (= what bpftool -B vmlinux btf dump file bfq.ko format c adds to vmlinux.h).
 * Include after vmlinux.h.
 */
#ifndef __COSCHED_BFQ_H__
#define __COSCHED_BFQ_H__

#ifndef BPF_NO_PRESERVE_ACCESS_INDEX
#pragma clang attribute push (__attribute__((preserve_access_index)), apply_to = record)
#endif

HDR
    cat "$tmp/types.h"
    cat <<'FTR'

#ifndef BPF_NO_PRESERVE_ACCESS_INDEX
#pragma clang attribute pop
#endif

#endif /* __COSCHED_BFQ_H__ */
FTR
} >"$tmp/bfq.h"
if cmp -s "$tmp/bfq.h" "$dest"; then
    echo "gen-bfq-h.sh: $dest unchanged (kernel $kver)" >&2
else
    mkdir -p "$(dirname "$dest")"
    cp "$tmp/bfq.h" "$dest"
    echo "gen-bfq-h.sh: wrote $dest ($(wc -l <"$dest") lines, kernel $kver)" >&2
fi
