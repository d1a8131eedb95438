#!/usr/bin/env bash
# Builds ${COSCHED_GUEST_DIR:-build/guest}/python.cpio (uncompressed): the host's Debian Python 3
# (/usr/bin/python3.11 and its shared libraries) with its standard library, minus the parts no
# experiment imports (tests, Tk, IDLE, the 25 MB static library). The precompiled bytecode
# (__pycache__) is kept, so imports in the guest start hot. Boot with
#   guest/run.sh --layer build/guest/python.cpio ...
# Idempotent: does nothing when the layer is newer than the interpreter.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
out=${COSCHED_GUEST_DIR:-$repo/build/guest}
py=/usr/bin/python3.11
layer=$out/python.cpio
# python.cpio.gz: the compressed layer of earlier builds.
rm -f "$out/python.cpio.gz"

[ -x "$py" ] || { echo "build-python-layer.sh: $py missing (apt-get install python3)" >&2; exit 1; }
if [ -f "$layer" ] && [ "$layer" -nt "$py" ] && [ "$layer" -nt "${BASH_SOURCE[0]}" ]; then
    exit 0
fi
mkdir -p "$out"
stage=$(mktemp -d "${TMPDIR:-/tmp}/cosched-pylayer.XXXXXX")
trap 'rm -rf "$stage"' EXIT

mkdir -p "$stage/usr/bin" "$stage/usr/lib"
cp -L "$py" "$stage/usr/bin/python3.11"
ln -s python3.11 "$stage/usr/bin/python3"
ldd "$py" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | while read -r lib; do
    mkdir -p "$stage$(dirname "$lib")"
    cp -L "$lib" "$stage$lib"
done
# -a keeps the bytecode's timestamps valid against the sources.
(cd /usr/lib && tar -cf - \
    --exclude='python3.11/test' --exclude='python3.11/idlelib' --exclude='python3.11/tkinter' \
    --exclude='python3.11/lib2to3' --exclude='python3.11/ensurepip' --exclude='python3.11/pydoc_data' \
    --exclude='python3.11/config-3.11-*' --exclude='python3.11/dist-packages' --exclude='python3.11/site-packages' \
    python3.11) | (cd "$stage/usr/lib" && tar -xf -)
# Uncompressed: under TCG the guest kernel unpacks the 35 MB about 1 s faster than their gzip.
(cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) >"$layer.tmp"
mv "$layer.tmp" "$layer"
echo "build-python-layer.sh: $layer ($(du -h "$layer" | cut -f1))"
