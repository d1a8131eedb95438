#!/usr/bin/env bash
# Build the Debian test guest: Debian 12 with systemd and udev, the test tools (cyclictest) and
# the kernel the busybox test guest boots (the package linux-image-amd64 depends on, as the host's
# apt resolves it), as an ext4 disk image, from Debian's packages (mmdebstrap; bookworm,
# bookworm-updates and bookworm-security). The VM tests boot
# it to run the project's packages as an operator's guest would: the guest package's unit and
# udev rule, and the host unit under a real systemd.
#
# Output (default <repo>/build/guest/debian, override with COSCHED_DEBIAN_DIR):
#   root.img     the root filesystem (ext4, sparse); boot it with snapshot=on, it is never written
#   vmlinuz      the image's own kernel, and
#   initrd.img   its initramfs (initramfs-tools, with virtio-blk and ext4)
#   stamp        the hash of the inputs it was built from
# The guest has no network; its command channel is the virtio-serial port org.cosched.test
# (guest/debian/driver.sh, started by udev when the port appears).
#
# Idempotent: skipped when the stamp matches this script and guest/debian/*. Needs root,
# mmdebstrap and e2fsprogs (guest/DEPS). About 3 minutes and 300 MB of downloads on a first run.
# Usage: guest/build-debian.sh [--force] [--quiet]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
out=${COSCHED_DEBIAN_DIR:-$repo/build/guest/debian}
suite=bookworm
mirror=${COSCHED_DEBIAN_MIRROR:-http://deb.debian.org/debian}
size=2G
force=0
quiet=0
security=${COSCHED_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
# What the tests run in the guest, besides systemd, udev and the kernel.
packages=(systemd-sysv udev kmod initramfs-tools zstd rt-tests procps iproute2 util-linux bash coreutils apt)

log() { [ "$quiet" = 1 ] || echo "build-debian.sh: $*" >&2; }
die() { echo "build-debian.sh: error: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case $1 in
        --force) force=1 ;;
        --quiet) quiet=1 ;;
        -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "usage: guest/build-debian.sh [--force] [--quiet]" >&2; exit 2 ;;
    esac
    shift
done

[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap installs packages into the image as root)"
command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (apt-get install mmdebstrap; see guest/DEPS)"
command -v mkfs.ext4 >/dev/null || die "mkfs.ext4 is not installed (apt-get install e2fsprogs)"

# The kernel: the one the busybox test guest boots (guest/build.sh asks the host's apt the same
# way), from the same suites; apt-cache's answer is in the stamp, so a new kernel rebuilds.
kernel=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }')
kernel_version=$( [ -z "$kernel" ] || apt-cache show --no-all-versions "$kernel" 2>/dev/null \
    | awk '$1 == "Version:" { print $2; exit }')
if [ -n "$kernel" ] && [ -n "$kernel_version" ]; then
    packages+=("$kernel=$kernel_version")
else
    packages+=(linux-image-amd64)
fi
stamp=$( (cat "$0"; cat "$here"/debian/*; echo "${packages[*]} $suite $mirror $security $size") | sha256sum | cut -d' ' -f1)
if [ "$force" = 0 ] && [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ] \
        && [ -f "$out/root.img" ] && [ -f "$out/vmlinuz" ] && [ -f "$out/initrd.img" ]; then
    log "up to date: $out"
    exit 0
fi

mkdir -p "$out"
work=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
t0=$SECONDS
log "mmdebstrap $suite (${packages[*]}) into $rootfs"
# The hooks: before the packages, the initramfs's module list (initramfs-tools reads it when the
# kernel's package builds the initramfs); after them, the guest's identity, its fstab and the
# test driver.
# (The hooks' "$1", the image's root, is mmdebstrap's to expand.)
# shellcheck disable=SC2016
args=(--variant=minbase --include="$(IFS=,; echo "${packages[*]}")"
    --setup-hook='mkdir -p "$1/etc/initramfs-tools/conf.d"'
    --setup-hook='printf "MODULES=list\nCOMPRESS=zstd\n" > "$1/etc/initramfs-tools/conf.d/cosched-test.conf"'
    --customize-hook='printf "virtio_pci\nvirtio_blk\next4\n" >> "$1/etc/initramfs-tools/modules"'
    --customize-hook='chroot "$1" update-initramfs -u -k all'
    --customize-hook='echo cosched-debian > "$1/etc/hostname"'
    --customize-hook='echo "/dev/vda / ext4 rw,errors=remount-ro 0 1" > "$1/etc/fstab"'
    --customize-hook=': > "$1/etc/machine-id"'
    --customize-hook="install -m 0755 '$here/debian/driver.sh' \"\$1/usr/local/sbin/cosched-test-driver\""
    --customize-hook="install -m 0644 '$here/debian/cosched-test-driver.service' \"\$1/etc/systemd/system/\""
    --customize-hook="install -m 0644 '$here/debian/61-cosched-test.rules' \"\$1/etc/udev/rules.d/\""
    --customize-hook='rm -f "$1"/var/cache/apt/archives/*.deb'
    "$suite" "$rootfs" "deb $mirror $suite main" "deb $mirror $suite-updates main"
    "deb $security $suite-security main")
if [ "$quiet" = 1 ]; then
    mmdebstrap "${args[@]}" >"$work/mmdebstrap.log" 2>&1 || { cat "$work/mmdebstrap.log" >&2; die "mmdebstrap failed"; }
else
    mmdebstrap "${args[@]}" >&2
fi

kernels=("$rootfs"/boot/vmlinuz-*)
initrds=("$rootfs"/boot/initrd.img-*)
vmlinuz=${kernels[-1]}
initrd=${initrds[-1]}
if [ ! -f "$vmlinuz" ] || [ ! -f "$initrd" ]; then
    die "no kernel or initramfs in the image's /boot"
fi
cp "$vmlinuz" "$work/vmlinuz"
cp "$initrd" "$work/initrd.img"
log "mkfs.ext4 -d ($size, sparse)"
mkfs.ext4 -q -F -L cosched-root -d "$rootfs" "$work/root.img" "$size"
rm -rf "$rootfs"
mv "$work/vmlinuz" "$work/initrd.img" "$work/root.img" "$out/"
echo "$stamp" >"$out/stamp"
log "built $out in $((SECONDS - t0)) s ($(basename "$vmlinuz"), $(du -h "$out/root.img" | cut -f1) used)"
