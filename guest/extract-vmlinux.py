#!/usr/bin/env python3
"""Decompress an xz-compressed x86 bzImage (vmlinuz, CONFIG_KERNEL_XZ) into its ELF vmlinux.

Usage: extract-vmlinux.py VMLINUZ OUT

Finds the xz magic FD 37 7A 58 5A 00, decompresses that one stream (data after the end of
the stream is ignored) and checks that the result is an ELF image; tries the next magic if not.
"""
import lzma
import os
import sys


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, "rb") as f:
        data = f.read()
    magic = b"\xfd7zXZ\x00"
    pos = data.find(magic)
    while pos >= 0:
        dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        try:
            elf = dec.decompress(data[pos:])
        except lzma.LZMAError:
            elf = b""
        # dec.eof: the stream ended; what follows it (dec.unused_data) is ignored.
        if dec.eof and elf[:4] == b"\x7fELF":
            tmp = dst + ".tmp"
            with open(tmp, "wb") as f:
                f.write(elf)
            os.replace(tmp, dst)
            print(f"extract-vmlinux.py: {dst}: {len(elf)} bytes from the xz stream at {pos:#x}",
                  file=sys.stderr)
            return 0
        pos = data.find(magic, pos + 1)
    print(f"extract-vmlinux.py: no xz stream holding an ELF image in {src}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
