#!/usr/bin/env bash
# Exit 0 if KVM can really run a vCPU here, 1 otherwise; prints the reason on stdout.
# /dev/kvm existing is not enough, so:
#  1. open /dev/kvm, KVM_CREATE_VM (0xAE01), KVM_CREATE_VCPU (0xAE41) on the VM fd;
#  2. then let QEMU run real guest code with the options run.sh uses (-accel kvm -cpu host):
#     a 64 KiB BIOS whose reset vector writes to an isa-debug-exit port. Step 2 catches
#     hosts where the ioctls work but QEMU cannot set up the vCPU (seen with a kvm_pvm-only
#     kernel: "failed to set MSR 0x10a", QEMU aborts).
# Usage: guest/kvm-usable.sh [-q]   (-q: print nothing). QEMU binary: $COSCHED_QEMU.
set -euo pipefail

quiet=0
[ "${1:-}" = "-q" ] && quiet=1

py=$(command -v python3 || true)
if [ -z "$py" ]; then
    reason="python3 not found, cannot probe /dev/kvm"
    rc=1
else
    set +e
    reason=$("$py" - <<'EOF'
import errno, fcntl, os, sys

KVM_GET_API_VERSION = 0xAE00
KVM_CREATE_VM = 0xAE01
KVM_CREATE_VCPU = 0xAE41

def fail(what, e):
    text = os.strerror(e.errno) if e.errno else str(e)
    print(f"{what}: {text}")
    sys.exit(1)

try:
    kvm = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
except OSError as e:
    fail("open /dev/kvm", e)
try:
    api = fcntl.ioctl(kvm, KVM_GET_API_VERSION, 0)
except OSError as e:
    fail("KVM_GET_API_VERSION", e)
if api != 12:
    print(f"KVM_GET_API_VERSION: unexpected version {api}")
    sys.exit(1)
try:
    vm = fcntl.ioctl(kvm, KVM_CREATE_VM, 0)
except OSError as e:
    fail("KVM_CREATE_VM", e)
try:
    vcpu = fcntl.ioctl(vm, KVM_CREATE_VCPU, 0)
except OSError as e:
    fail("KVM_CREATE_VCPU", e)
os.close(vcpu)
os.close(vm)
os.close(kvm)

import shutil, subprocess, tempfile
qemu = os.environ.get("COSCHED_QEMU") or "qemu-system-x86_64"
if not shutil.which(qemu):
    print(f"{qemu} not found")
    sys.exit(1)
# Real mode at the reset vector: mov al,1; out 0xf4,al; hlt; jmp $-1
bios = bytearray(65536)
code = bytes([0xB0, 0x01, 0xE6, 0xF4, 0xF4, 0xEB, 0xFD])
bios[-16:-16 + len(code)] = code
with tempfile.NamedTemporaryFile(prefix="cosched-kvmprobe-", suffix=".bin") as f:
    f.write(bios)
    f.flush()
    cmd = [qemu, "-accel", "kvm", "-cpu", "host", "-machine", "pc", "-m", "16",
           "-nodefaults", "-display", "none", "-no-reboot", "-bios", f.name,
           "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"]
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        print("QEMU -accel kvm -cpu host: probe guest did not exit within 20 s")
        sys.exit(1)
# isa-debug-exit: exit code (1 << 1) | 1 = 3
if p.returncode != 3:
    err = [l for l in p.stderr.splitlines() if l.strip()]
    msg = err[0] if err else f"exit code {p.returncode}"
    msg = msg.replace(qemu + ": ", "")
    print(f"QEMU -accel kvm -cpu host: {msg}")
    sys.exit(1)
print("KVM usable")
EOF
)
    rc=$?
    set -e
fi
[ "$quiet" = 1 ] || echo "$reason"
exit "$rc"
