#!/usr/bin/env bash
# Generate crates/bpfutil/include/vmlinux.h from the BTF of the test guest's kernel.
#
# The host has no usable vmlinux of the guest kernel, so take the guest's vmlinuz
# (xz-compressed, CONFIG_KERNEL_XZ): guest/build.sh finds the xz magic FD 37 7A 58 5A 00
# and decompresses that one stream with Python's lzma (guest/extract-vmlinux.py, trailing
# data ignored) into an ELF vmlinux; this script dumps its BTF with bpftool.
# Output: crates/bpfutil/include/vmlinux.h (override with the first argument).
# The ELF is ${COSCHED_GUEST_DIR:-<repo>/build/guest}/vmlinux.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
out=${COSCHED_GUEST_DIR:-$repo/build/guest}
dest=${1:-$repo/crates/bpfutil/include/vmlinux.h}

command -v bpftool >/dev/null || { echo "gen-vmlinux-h.sh: bpftool not found (apt-get install bpftool)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "gen-vmlinux-h.sh: python3 not found" >&2; exit 1; }

# build.sh is quick when everything is up to date; it also makes $out/vmlinux.
"$here/build.sh" >&2
kver=$(cat "$out/kernel-version")
kpkg=$(cat "$out/kernel-package")
[ -f "$out/vmlinux" ] || { echo "gen-vmlinux-h.sh: $out/vmlinux missing" >&2; exit 1; }

mkdir -p "$(dirname "$dest")"
{
    cat <<EOF
/* SPDX-License-Identifier: GPL-2.0 */
/*
 * GENERATED FILE, do not edit.
 * Kernel types from the BTF of the cosched test guest's kernel $kver
 * (Debian package: $kpkg).
 * Regenerate with: guest/gen-vmlinux-h.sh
 * (= bpftool btf dump file vmlinux format c, vmlinux decompressed from that package's vmlinuz)
 */
EOF
    bpftool btf dump file "$out/vmlinux" format c
} >"$dest.tmp"
if cmp -s "$dest.tmp" "$dest"; then
    rm -f "$dest.tmp"
    echo "gen-vmlinux-h.sh: $dest unchanged (kernel $kver)" >&2
else
    mv "$dest.tmp" "$dest"
    echo "gen-vmlinux-h.sh: wrote $dest ($(wc -l <"$dest") lines, kernel $kver)" >&2
fi
