#!/usr/bin/env bash
# Build the cosched test guest: Debian's kernel (the one package linux-image-amd64
# depends on) and a busybox initramfs with the virtio-serial modules, the modules of a
# virtio-blk disk (virtio_blk, bfq, ext4), of a virtio-net NIC (virtio_net) and cyclictest.
#
# Output (default <repo>/build/guest, override with COSCHED_GUEST_DIR):
#   vmlinuz          the guest kernel (bzImage, as packaged)
#   vmlinux          the same kernel as an ELF image (decompressed; run.sh boots this)
#   base.cpio        the base initramfs, uncompressed (run.sh appends a per-boot archive to
#                    it; under TCG the guest kernel unpacks a plain cpio ~1 s faster than gzip)
#   kernel-version   e.g. 6.1.0-56-amd64
#   kernel-package   "<package> <version>"
#   cache/           downloaded .deb, extracted kernel tree, rootfs staging
#
# Idempotent: every step is skipped when its outputs exist and are newer than its inputs.
# Needs: apt-get, apt-cache, dpkg-deb, busybox-static, rt-tests, cpio, gzip, xz/zstd if
# modules are compressed.  Usage: guest/build.sh [--force] [--quiet]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
out=${COSCHED_GUEST_DIR:-$repo/build/guest}
cache=$out/cache
force=0
quiet=0

# Modules for the virtio-serial port, in load order (loaded at every boot).
virtio_modules=(virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_console)
# Modules for virtio-blk disks, in load order, loaded by init.sh only when the guest has a
# virtio block device (a boot without disks does not pay for ext4's 2 MB): the disk driver,
# the BFQ I/O scheduler (the agent's I/O detector watches it), and ext4 with its dependencies
# (crc32c_generic: ext4 and jbd2 ask the crypto API for crc32c, a soft dependency, for
# metadata_csum, which mkfs.ext4 turns on by default).
disk_modules=(virtio_blk bfq crc16 mbcache crc32c_generic jbd2 ext4)
# Modules for a virtio-net NIC (run.sh --net), in load order, loaded by init.sh only when the
# guest has a virtio network device.
net_modules=(failover net_failover virtio_net)
# Shipped but not loaded.
extra_modules=()

log() { echo "build.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
    cat <<EOF
Usage: guest/build.sh [--force] [--quiet]
Builds the test guest into \${COSCHED_GUEST_DIR:-<repo>/build/guest} (now: $out).
  --force   rebuild base.cpio and re-extract the kernel even if up to date
  --quiet   say nothing when everything is up to date
EOF
}

while [ $# -gt 0 ]; do
    case $1 in
        --force) force=1 ;;
        --quiet) quiet=1 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
    shift
done

# stale OUTPUT INPUT... : true when OUTPUT is missing or older than any INPUT.
stale() {
    local o=$1 i
    shift
    [ "$force" = 1 ] && return 0
    [ -e "$o" ] || return 0
    for i in "$@"; do
        [ "$i" -nt "$o" ] && return 0
    done
    return 1
}

for tool in apt-cache apt-get dpkg-deb cpio gzip ldd; do
    command -v "$tool" >/dev/null || die "$tool not found"
done
busybox=/bin/busybox
[ -x "$busybox" ] || die "$busybox missing (apt-get install busybox-static)"
if ldd "$busybox" >/dev/null 2>&1; then
    die "$busybox is not statically linked (apt-get install busybox-static)"
fi
cyclictest=$(command -v cyclictest || true)
[ -n "$cyclictest" ] || die "cyclictest missing (apt-get install rt-tests)"

mkdir -p "$cache"

# ---- 1. kernel package ------------------------------------------------------
kernel_dep() {
    apt-cache depends linux-image-amd64 2>/dev/null \
        | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }'
}
# Asking apt takes ~1 s here; remember the answer until the package lists change.
resolved=$cache/apt-resolved
if stale "$resolved" /var/lib/apt/lists "$here/build.sh"; then
    kpkg=$(kernel_dep)
    if [ -z "$kpkg" ]; then
        log "apt-cache knows no linux-image-amd64; running apt-get update"
        apt-get update -qq >&2 || die "apt-get update failed"
        kpkg=$(kernel_dep)
    fi
    [ -n "$kpkg" ] || die "cannot find the kernel package linux-image-amd64 depends on"
    # The candidate version names the file, so a new upload of the same ABI is fetched.
    kpkg_version=$(apt-cache show --no-all-versions "$kpkg" 2>/dev/null \
        | awk '$1 == "Version:" { print $2; exit }')
    [ -n "$kpkg_version" ] || die "apt-cache show $kpkg gave no version"
    echo "$kpkg $kpkg_version" >"$resolved"
fi
read -r kpkg kpkg_version <"$resolved"
kver=${kpkg#linux-image-}

deb=$cache/${kpkg}_${kpkg_version//:/%3a}_amd64.deb
if [ ! -f "$deb" ]; then
    log "downloading $kpkg $kpkg_version"
    apt_opts=(-q)
    # Downloading into a root-owned directory: keep apt from trying its _apt sandbox user.
    [ "$(id -u)" = 0 ] && apt_opts+=(-o APT::Sandbox::User=root)
    (cd "$cache" && apt-get download "${apt_opts[@]}" "$kpkg=$kpkg_version" >&2) \
        || die "apt-get download $kpkg=$kpkg_version failed"
    [ -f "$deb" ] || die "apt-get download left no $(basename "$deb") in $cache"
fi

kroot=$cache/kernel
kstamp=$cache/kernel.stamp
if stale "$kstamp" "$deb"; then
    log "extracting $(basename "$deb")"
    rm -rf "$kroot"
    mkdir -p "$kroot"
    dpkg-deb -x "$deb" "$kroot"
    echo "$kpkg $kpkg_version" >"$kstamp"
fi
[ -f "$kroot/boot/vmlinuz-$kver" ] || die "no boot/vmlinuz-$kver in $deb"
moddir=$kroot/lib/modules/$kver
[ -d "$moddir" ] || die "no lib/modules/$kver in $deb"

if stale "$out/vmlinuz" "$kstamp"; then
    cp "$kroot/boot/vmlinuz-$kver" "$out/vmlinuz.tmp"
    mv "$out/vmlinuz.tmp" "$out/vmlinuz"
fi
# Uncompressed ELF kernel: BTF source for gen-vmlinux-h.sh, and run.sh boots it directly
# (PVH entry), which skips SeaBIOS' real-mode loader and the in-guest xz decompression:
# ~1.9 s instead of ~4.6 s to power-off under TCG.
if stale "$out/vmlinux" "$out/vmlinuz" "$here/extract-vmlinux.py"; then
    command -v python3 >/dev/null || die "python3 not found"
    python3 "$here/extract-vmlinux.py" "$out/vmlinuz" "$out/vmlinux"
fi
[ "$(cat "$out/kernel-version" 2>/dev/null || true)" = "$kver" ] || echo "$kver" >"$out/kernel-version"
[ "$(cat "$out/kernel-package" 2>/dev/null || true)" = "$kpkg $kpkg_version" ] \
    || echo "$kpkg $kpkg_version" >"$out/kernel-package"

# ---- 2. base initramfs --------------------------------------------------------
# find_module NAME: path of NAME.ko[.xz|.zst] under the kernel tree, or nothing.
find_module() {
    local alt=${1//_/-}
    find "$moddir/kernel" \( -name "$1.ko" -o -name "$1.ko.xz" -o -name "$1.ko.zst" \
        -o -name "$alt.ko" -o -name "$alt.ko.xz" -o -name "$alt.ko.zst" \) -print -quit
}
is_builtin() {
    grep -qE "/($1|${1//_/-})\.ko$" "$moddir/modules.builtin" 2>/dev/null
}

# Shared objects of an ELF file, as ldd prints them (absolute paths, loader included).
elf_libs() {
    ldd "$1" 2>/dev/null | awk '
        $2 == "=>" && $3 ~ /^\// { print $3; next }
        $1 ~ /^\// { print $1 }'
}

inputs=("$here/build.sh" "$here/init.sh" "$busybox" "$cyclictest" "$kstamp")
mapfile -t cyclic_libs < <(elf_libs "$cyclictest")
[ ${#cyclic_libs[@]} -gt 0 ] || die "ldd found no libraries for $cyclictest"
inputs+=("${cyclic_libs[@]}")

# base.cpio.gz: the compressed initramfs of earlier builds.
rm -f "$out/base.cpio.gz"
if stale "$out/base.cpio" "${inputs[@]}"; then
    log "building base.cpio (kernel $kver)"
    root=$cache/rootfs
    rm -rf "$root"
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,lib/modules,dev,proc,sys,tmp,run,root,etc,mnt}
    chmod 1777 "$root/tmp"

    # busybox and its applet links
    cp "$busybox" "$root/bin/busybox"
    while read -r applet; do
        [ -n "$applet" ] || continue
        if [ -e "$root/$applet" ] || [ -L "$root/$applet" ]; then continue; fi
        mkdir -p "$root/$(dirname "$applet")"
        ln -s /bin/busybox "$root/$applet"
    done < <("$busybox" --list-full)

    # init
    install -m 0755 "$here/init.sh" "$root/init"

    # modules (decompressed: busybox insmod takes plain .ko)
    : >"$root/lib/modules/load-order"
    : >"$root/lib/modules/load-order-disk"
    : >"$root/lib/modules/load-order-net"
    have=()
    add_module() { # NAME LIST(load-order|load-order-disk|load-order-net|-)
        local name=$1 list=$2 src
        src=$(find_module "$name")
        if [ -z "$src" ]; then
            if is_builtin "$name"; then
                log "module $name is built into $kver; skipped"
            else
                log "warning: module $name not found for $kver; skipped"
            fi
            return 0
        fi
        case $src in
            *.ko.xz) xz -dc "$src" >"$root/lib/modules/$name.ko" ;;
            *.ko.zst) zstd -qdc "$src" >"$root/lib/modules/$name.ko" ;;
            *) cp "$src" "$root/lib/modules/$name.ko" ;;
        esac
        if [ "$list" != - ]; then
            echo "$name" >>"$root/lib/modules/$list"
            have+=("$name")
        fi
    }
    for m in "${virtio_modules[@]}"; do add_module "$m" load-order; done
    for m in "${disk_modules[@]}"; do add_module "$m" load-order-disk; done
    for m in "${net_modules[@]}"; do add_module "$m" load-order-net; done
    for m in "${extra_modules[@]}"; do add_module "$m" -; done

    # Check that every module's dependencies (its .modinfo "depends=") are loaded
    # before it (load-order-disk and load-order-net come after load-order; neither needs the
    # other's). The .deb ships no modules.dep (depmod makes it at install time).
    loaded=" "
    for m in "${have[@]}"; do
        deps=$(tr '\0' '\n' <"$root/lib/modules/$m.ko" | grep -a -m1 '^depends=' || true)
        deps=${deps#depends=}
        for d in ${deps//,/ }; do
            d=${d//-/_}
            case $loaded in
                *" $d "*) ;;
                *) is_builtin "$d" || die "module $m needs $d, which is not loaded before it" ;;
            esac
        done
        loaded="$loaded$m "
    done

    # cyclictest and its libraries, at the paths ldd names
    install -m 0755 "$cyclictest" "$root/usr/bin/cyclictest"
    for lib in "${cyclic_libs[@]}"; do
        mkdir -p "$root/$(dirname "$lib")"
        cp -L "$lib" "$root/$lib"
    done

    # minimal /etc
    echo "root:x:0:0:root:/root:/bin/sh" >"$root/etc/passwd"
    echo "root:x:0:" >"$root/etc/group"
    echo "cosched-guest" >"$root/etc/hostname"
    echo "$kpkg $kpkg_version" >"$root/etc/cosched-kernel"

    # /dev/console so the kernel can give init its stdio (init copes without it).
    if [ "$(id -u)" = 0 ]; then
        mknod -m 600 "$root/dev/console" c 5 1
        mknod -m 666 "$root/dev/null" c 1 3
    fi

    (cd "$root" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) \
        >"$out/base.cpio.tmp"
    mv "$out/base.cpio.tmp" "$out/base.cpio"
    log "base.cpio: $(du -h "$out/base.cpio" | cut -f1)"
else
    [ "$quiet" = 1 ] || log "up to date: $out (kernel $kver)"
fi
