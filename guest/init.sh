#!/bin/sh
# /init of the cosched test guest (busybox sh, PID 1). Installed by guest/build.sh.
# Mounts the pseudo file systems, loads the virtio-serial modules (and, with a virtio-blk
# disk, virtio_blk, bfq and ext4; with a virtio-net NIC, virtio_net), creates
# /dev/virtio-ports/<name> links, brings up lo and, with cosched.ip=ADDR/PREFIX on the kernel
# command line, eth0, runs /workload.sh if present, then powers off.
# Never exits: PID 1 exiting would panic the kernel.
# (busybox sh does not support pipefail; this is the only script that runs inside the guest.)
set -u

export PATH=/bin:/sbin:/usr/bin:/usr/sbin
export HOME=/root
export TERM=dumb

mkdir -p /proc /sys /dev /tmp /run /root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null || true
# If the kernel could not open an initial console, get one now.
[ -c /dev/console ] && exec </dev/console >/dev/console 2>&1
mkdir -p /dev/pts /dev/shm
debug=0
case " $(cat /proc/cmdline) " in *" cosched.debug "*|*" cosched.debug=1 "*) debug=1 ;; esac
# stage TEXT: with cosched.debug on the kernel command line, print uptime and TEXT.
stage() {
    [ "$debug" = 1 ] || return 0
    read -r up _ </proc/uptime
    echo "COSCHED-GUEST: [${up}] $*"
}
stage "init started"
mount -t devpts devpts /dev/pts 2>/dev/null || true
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || echo "COSCHED-GUEST: debugfs mount failed"
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || echo "COSCHED-GUEST: tracefs mount failed"
mkdir -p /sys/fs/bpf 2>/dev/null || true
mount -t bpf bpf /sys/fs/bpf 2>/dev/null || echo "COSCHED-GUEST: bpffs mount failed"

stage "mounted"
# cosched.skip_modules=a,b on the kernel command line: modules not to load (e.g. bfq, to see
# a guest without BFQ). cosched.ip=ADDR/PREFIX: eth0's address (run.sh --net).
skip=","
ipaddr=
read -r cmdline </proc/cmdline
for arg in $cmdline; do
    case $arg in
        cosched.skip_modules=*) skip=",${arg#cosched.skip_modules=}," ;;
        cosched.ip=*) ipaddr=${arg#cosched.ip=} ;;
    esac
done
# load_modules LIST: the modules of /lib/modules/LIST (written by build.sh; one name per
# line, in load order, file /lib/modules/<name>.ko).
load_modules() {
    [ -f "/lib/modules/$1" ] || return 0
    while read -r mod; do
        [ -n "$mod" ] || continue
        case $skip in *",$mod,"*) echo "COSCHED-GUEST: $mod not loaded (cosched.skip_modules)"; continue ;; esac
        insmod "/lib/modules/$mod.ko" || echo "COSCHED-GUEST: insmod $mod failed"
    done <"/lib/modules/$1"
}
load_modules load-order
# Virtio device ids: 1 network, 2 block, 3 console (virtio-serial).
have_vnet=0
have_vblk=0
have_vserial=0
for d in /sys/bus/virtio/devices/*; do
    [ -r "$d/device" ] || continue
    case $(cat "$d/device") in
        0x0001) have_vnet=1 ;;
        0x0002) have_vblk=1 ;;
        0x0003) have_vserial=1 ;;
    esac
done
# The disk modules (virtio_blk, bfq, ext4...) only for a guest with a virtio-blk disk, the
# network ones (virtio_net and its failover helpers) only for one with a virtio-net NIC.
[ "$have_vblk" = 1 ] && load_modules load-order-disk
[ "$have_vnet" = 1 ] && load_modules load-order-net

stage "modules loaded"
# Port names arrive asynchronously from the host; wait (up to ~3 s) until every
# port has one.
if [ "$have_vserial" = 1 ]; then
    i=0
    while [ "$i" -lt 300 ]; do
        ready=0
        for p in /sys/class/virtio-ports/*; do
            [ -r "$p/name" ] || continue
            ready=1
            [ -n "$(cat "$p/name")" ] || { ready=0; break; }
        done
        [ "$ready" = 1 ] && break
        usleep 10000
        i=$((i + 1))
    done
fi

stage "ports named"
mdev -s
stage "mdev done"

# Same links as udev's rule: /dev/virtio-ports/<name> -> ../vportXpY
for p in /sys/class/virtio-ports/*; do
    [ -r "$p/name" ] || continue
    name=$(cat "$p/name")
    [ -n "$name" ] || continue
    mkdir -p /dev/virtio-ports
    ln -sf "../${p##*/}" "/dev/virtio-ports/$name"
done

ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up 2>/dev/null || true
if [ -n "$ipaddr" ]; then
    if [ -e /sys/class/net/eth0 ]; then
        ip addr add "$ipaddr" dev eth0 && ip link set eth0 up \
            || echo "COSCHED-GUEST: eth0: cannot set $ipaddr"
        stage "eth0 $ipaddr"
    else
        echo "COSCHED-GUEST: cosched.ip=$ipaddr but no eth0 (boot with run.sh --net)"
    fi
fi
hostname cosched-guest 2>/dev/null || true

cd /
# A boot from a snapshot (run.sh, guest/snapshot.py): the workload comes over the port
# org.cosched.workload. Everything above is what the snapshot holds; run.sh saves it while
# this read waits, and each restored copy goes on from here with its own workload. The
# header is "LEN EPOCH": the script's length and the host's clock (a restored guest's clock
# is the snapshot's).
if [ ! -f /workload.sh ] && [ -e /dev/virtio-ports/org.cosched.workload ]; then
    exec 3<>/dev/virtio-ports/org.cosched.workload
    echo READY >&3
    # A restored guest finds the host end closed until run.sh's helper connects to the new
    # QEMU: a read then ends at once (end of file); so try again, for up to 60 s.
    i=0
    until read -r len epoch <&3; do
        i=$((i + 1))
        [ "$i" -le 6000 ] || break
        usleep 10000
    done
    if [ -n "${len:-}" ] && head -c "$len" <&3 >/workload.sh; then
        date -s "@$epoch" >/dev/null 2>&1 || echo "COSCHED-GUEST: cannot set the clock to $epoch"
        echo GOT >&3
    else
        echo "COSCHED-GUEST: no workload on org.cosched.workload"
        rm -f /workload.sh
    fi
    exec 3<&-
fi
if [ -f /workload.sh ]; then
    read -r up _ </proc/uptime
    echo "COSCHED-GUEST: workload start uptime=${up}s"
    sh /workload.sh </dev/null >/dev/console 2>&1
    rc=$?
    echo "COSCHED-GUEST: workload exit $rc"
else
    echo "COSCHED-GUEST: no workload"
fi

sync
poweroff -f
# Only reached if poweroff failed.
echo o >/proc/sysrq-trigger
while :; do sleep 1; done
