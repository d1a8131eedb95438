#!/usr/bin/env bash
# Boot the cosched test guest (see guest/README.md). Run guest/run.sh --help.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
out=${COSCHED_GUEST_DIR:-$repo/build/guest}
qemu=${COSCHED_QEMU:-qemu-system-x86_64}

usage() {
    cat <<EOF
Usage: guest/run.sh [options]

Boots the test guest built by guest/build.sh (from \${COSCHED_GUEST_DIR:-<repo>/build/guest},
now $out; run.sh runs build.sh first, which does nothing when all is up to date). The guest console (kernel and workload output) goes to
stdout. The guest runs /workload.sh if given, prints "COSCHED-GUEST: workload exit <code>"
(or "COSCHED-GUEST: no workload") and powers off. run.sh exits with QEMU's exit code (3 when
a fatal KVM error stopped the guest, 124 on --timeout).

Options:
  --workload FILE        shell script to run in the guest as /workload.sh (root, busybox sh)
  --add HOST:GUEST       put file HOST into the guest at GUEST (repeatable; a GUEST ending
                         in / gets HOST's basename). For a dynamic ELF the libraries ldd
                         lists are added too, at the same paths.
  --layer FILE           append a prebuilt cpio archive to the initramfs (repeatable; e.g.
                         build/guest/python.cpio from guest/build-python-layer.sh); a
                         gzip'd one is decompressed first (the initramfs is uncompressed:
                         under TCG the guest unpacks a plain cpio faster than it gunzips)
  --sock PATH            add a virtio-serial port named org.cosched.0 whose host end is the
                         unix socket PATH (QEMU is the server; wait=off). In the guest:
                         /dev/virtio-ports/org.cosched.0 -> ../vport0p1
  --disk FILE[,iothread][,aio=MODE]
                         add a virtio-blk disk backed by FILE (repeatable; the guest sees
                         /dev/vda, /dev/vdb... in this order): raw format, cache=none
                         (O_DIRECT on the host: the host page cache cannot serve the image).
                         aio=threads (default, QEMU's): a pool of "worker" threads does the
                         I/O; aio=native or io_uring: the disk's own thread (main loop, or
                         its iothread) submits it. ",iothread" gives the disk its own QEMU
                         iothread ("IO iothreadN"). The guest's init loads virtio_blk, bfq
                         and ext4 when it has a disk
  --net tap=IFNAME[,ip=ADDR/PREFIX]
  --net user[,ip=ADDR/PREFIX][,hostfwd=RULE]...
                         add a virtio-net NIC (repeatable; the guest sees eth0, eth1... in
                         this order; its init loads virtio_net when it has one). tap: backed by
                         the existing tap device IFNAME (ip tuntap add dev IFNAME mode tap;
                         script=no, no vhost: QEMU's main loop moves the packets). user:
                         QEMU's user-mode network (slirp; the guest is 10.0.2.15, the host
                         10.0.2.2; hostfwd=tcp::8080-:80 reaches a guest port from the host's
                         localhost; no ICMP from the host). The MAC is 52:54:00 and 3 bytes of
                         the md5 of "NAME/index" (VMs with different --name differ).
                         ip=ADDR/PREFIX configures that NIC in the guest (the first NIC only:
                         cosched.ip=ADDR/PREFIX on the kernel command line, eth0; a user NIC
                         without ip= gets 10.0.2.15/24)
  --accel auto|kvm|tcg   accelerator (default \$COSCHED_ACCEL, else auto: KVM only if
                         guest/accel.sh has booted this guest under KVM, else TCG). run.sh
                         says which on stderr, with the reason. A fatal KVM error at run
                         time ("KVM internal error", "KVM: entry failed", "kvm run failed")
                         stops the boot at once (exit 3) and is recorded, so that the next
                         auto choice is TCG
  --smp N                vCPUs (default 1)
  --mem MB               memory in MiB (default 512)
  --name NAME            VM name (-name NAME,debug-threads=on; default cosched-test)
  --pidfile FILE         QEMU writes its pid there
  --timeout SEC          kill QEMU if the guest has not powered off after SEC seconds
                         (default 300, 0 = never); exit code 124 then
  --append "ARGS"        extra kernel command line arguments
  --snapshot auto|off    auto (default, or \$COSCHED_SNAPSHOT): a boot with a --workload, no
                         --disk and no user --net starts from a snapshot of the guest taken at the
                         end of its boot (its init done, nothing of a workload run), and gets
                         its workload over a virtio-serial port (org.cosched.workload). The
                         first boot of each configuration (kernel, initramfs with its layers
                         and --add files, command line, --smp, --mem, --sock or not, NICs,
                         QEMU, accelerator) boots and saves one, in <guest dir>/snapshots (the
                         newest 16 are kept); a snapshot QEMU cannot load is deleted and the
                         guest booted afresh. Under TCG a restore takes ~0.2 s, a boot ~2 s.
                         off: every boot from the kernel, the workload in the initramfs
  --kernel FILE          kernel to boot (default: the build's ELF vmlinux, booted through its
                         PVH entry, ~2.5 s faster under TCG than the bzImage; the build's
                         vmlinuz if there is no vmlinux). The automatic accelerator choice
                         is the build kernel's: another kernel gets the same one
  --dry-run              print the QEMU command line instead of running it
  --initrd-out FILE      write the initramfs (with the workload and --add files) to FILE,
                         print "kernel=PATH", "initrd=FILE", the kernel command line
                         ("append=...") and the accelerator ("accel=kvm|tcg"), and exit
                         without booting: for another launcher
                         (libvirt's <os><kernel>/<initrd>/<cmdline>)
  -h, --help             this text

QEMU runs with -name NAME,debug-threads=on, so its threads are named ("CPU 0/TCG",
"CPU 0/KVM", ...). Environment: COSCHED_ACCEL (auto|kvm|tcg), COSCHED_SNAPSHOT (auto|off),
COSCHED_GUEST_DIR, COSCHED_QEMU (QEMU binary).
EOF
}

die() { echo "run.sh: $*" >&2; exit 2; }

workload=
adds=()
disks=()
nets=()
layers=()
sock=
accel=${COSCHED_ACCEL:-auto}
accel_given=0
smp=1
mem=512
name=cosched-test
pidfile=
timeout_s=300
append=
kernel=
dry=0
initrd_out=
snapshot=${COSCHED_SNAPSHOT:-auto}

need() { [ $# -ge 2 ] || die "$1 needs an argument"; }
while [ $# -gt 0 ]; do
    case $1 in
        --workload) need "$@"; workload=$2; shift ;;
        --add) need "$@"; adds+=("$2"); shift ;;
        --layer) need "$@"; layers+=("$2"); shift ;;
        --sock) need "$@"; sock=$2; shift ;;
        --disk) need "$@"; disks+=("$2"); shift ;;
        --net) need "$@"; nets+=("$2"); shift ;;
        --accel) need "$@"; accel=$2; accel_given=1; shift ;;
        --smp) need "$@"; smp=$2; shift ;;
        --mem) need "$@"; mem=$2; shift ;;
        --name) need "$@"; name=$2; shift ;;
        --pidfile) need "$@"; pidfile=$2; shift ;;
        --timeout) need "$@"; timeout_s=$2; shift ;;
        --append) need "$@"; append=$2; shift ;;
        --kernel) need "$@"; kernel=$2; shift ;;
        --snapshot) need "$@"; snapshot=$2; shift ;;
        --dry-run) dry=1 ;;
        --initrd-out) need "$@"; initrd_out=$2; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
    shift
done

case $accel in auto|kvm|tcg) ;; *) die "--accel (or COSCHED_ACCEL) must be auto, kvm or tcg, not '$accel'" ;; esac
case $snapshot in auto|off) ;; *) die "--snapshot (or COSCHED_SNAPSHOT) must be auto or off, not '$snapshot'" ;; esac
[[ $smp =~ ^[1-9][0-9]*$ ]] || die "--smp must be a positive integer"
[[ $mem =~ ^[1-9][0-9]*$ ]] || die "--mem must be a positive integer (MiB)"
[[ $timeout_s =~ ^[0-9]+$ ]] || die "--timeout must be a number of seconds"
[[ $name != *,* ]] || die "--name must not contain a comma"
[ -z "$workload" ] || [ -f "$workload" ] || die "workload $workload not found"
if [ -n "$sock" ] && [[ $sock == *,* ]]; then die "--sock path must not contain a comma"; fi
# disk_opts SPEC: sets dfile, diothread (0/1) and daio from FILE[,iothread][,aio=MODE].
disk_opts() {
    local opt
    IFS=, read -r dfile opts <<<"$1"
    diothread=0; daio=threads
    IFS=, read -ra opts <<<"$opts"
    for opt in "${opts[@]}"; do
        case $opt in
            iothread) diothread=1 ;;
            aio=threads|aio=native|aio=io_uring) daio=${opt#aio=} ;;
            *) die "--disk $1: unknown option '$opt' (FILE must not contain a comma; options: iothread, aio=threads|native|io_uring)" ;;
        esac
    done
}
for spec in "${disks[@]}"; do
    disk_opts "$spec"
    [ -f "$dfile" ] || [ -b "$dfile" ] || die "--disk $dfile: not found"
done
# net_opts SPEC: sets nkind (tap|user), nif (tap name), nip (guest address or empty) and
# nextra (user: the hostfwd options, each with its leading comma) from --net SPEC.
net_opts() {
    local opt kind rest
    IFS=, read -r kind rest <<<"$1"
    nif=; nip=; nextra=
    case $kind in
        tap=*) nkind=tap; nif=${kind#tap=}; [ -n "$nif" ] || die "--net $1: tap needs a device name" ;;
        user) nkind=user ;;
        *) die "--net $1: tap=IFNAME or user" ;;
    esac
    IFS=, read -ra opts <<<"$rest"
    for opt in "${opts[@]}"; do
        case $opt in
            ip=*/*) nip=${opt#ip=} ;;
            hostfwd=*) [ "$nkind" = user ] || die "--net $1: hostfwd= is for user networks"
                       nextra="$nextra,$opt" ;;
            *) die "--net $1: unknown option '$opt' (ip=ADDR/PREFIX, hostfwd=RULE)" ;;
        esac
    done
    if [ "$nkind" = user ] && [ -z "$nip" ]; then nip=10.0.2.15/24; fi
}
for spec in "${nets[@]}"; do
    net_opts "$spec"
    # ip asks the kernel about this network namespace (/sys/class/net shows the one sysfs was
    # mounted in).
    if [ "$nkind" = tap ] && [ "$dry" = 0 ] && ! ip link show dev "$nif" >/dev/null 2>&1; then
        die "--net $spec: no network device $nif here (ip tuntap add dev $nif mode tap)"
    fi
done

# build.sh takes ~40 ms when everything is up to date (it rebuilds base.cpio after an
# edit of guest/init.sh or guest/build.sh).
if ! "$here/build.sh" --quiet >&2; then
    if [ -f "$out/vmlinuz" ] && [ -f "$out/base.cpio" ]; then
        echo "run.sh: warning: guest/build.sh failed, booting the existing build" >&2
    else
        die "guest/build.sh failed"
    fi
fi

if [ -z "$kernel" ]; then
    kernel=$out/vmlinux
    [ -f "$kernel" ] || kernel=$out/vmlinuz
fi
[ -f "$kernel" ] || die "kernel $kernel not found"

# ---- per-boot archive: workload and --add files ------------------------------------
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cosched-run.XXXXXX")
qpid=
# shellcheck disable=SC2317  # called from traps
cleanup() { rm -rf "$tmp"; }
trap cleanup EXIT
# shellcheck disable=SC2317  # called from traps
on_signal() {
    local sig=$1
    trap - INT TERM HUP
    [ -z "${hpid:-}" ] || kill -TERM "$hpid" 2>/dev/null || true
    if [ -n "$qpid" ]; then
        kill -TERM "$qpid" 2>/dev/null || true
        wait "$qpid" 2>/dev/null || true
    fi
    cleanup
    case $sig in INT) exit 130 ;; HUP) exit 129 ;; *) exit 143 ;; esac
}
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
trap 'on_signal HUP' HUP

stage=$tmp/extra
mkdir -p "$stage"

# ELF shared objects as ldd prints them (absolute paths, dynamic loader included).
elf_libs() {
    ldd "$1" 2>/dev/null | awk '
        $2 == "=>" && $3 ~ /^\// { print $3; next }
        $1 ~ /^\// { print $1 }' || true
}
is_elf() { [ "$(head -c 4 "$1" 2>/dev/null)" = $'\x7fELF' ]; }

# From a snapshot: the workload comes over the port, and the initramfs is the same for every
# workload (it is part of what the snapshot is keyed by).
# Not with a disk (its image may differ from the one the snapshot's guest read) nor with a user
# NIC (slirp's state); a tap NIC is the guest's own device and address, in the key.
use_snap=0
if [ "$snapshot" = auto ] && [ -n "$workload" ] && [ ${#disks[@]} = 0 ] \
    && [ -z "$initrd_out" ] && [ "$dry" = 0 ] && command -v python3 >/dev/null; then
    use_snap=1
    for spec in "${nets[@]}"; do
        [[ $spec == tap=* ]] || use_snap=0
    done
fi
if [ -n "$workload" ] && [ "$use_snap" = 0 ]; then
    install -m 0755 "$workload" "$stage/workload.sh"
fi
for spec in "${adds[@]}"; do
    [[ $spec == *:* ]] || die "--add needs HOSTPATH:GUESTPATH, got '$spec'"
    hpath=${spec%:*}
    gpath=${spec##*:}
    [[ $gpath == /* ]] || die "--add: guest path must be absolute in '$spec'"
    [ -e "$hpath" ] || die "--add: $hpath not found"
    [[ $gpath == */ ]] && gpath=$gpath$(basename "$hpath")
    mkdir -p "$stage$(dirname "$gpath")"
    if [ -d "$hpath" ]; then
        cp -rL "$hpath" "$stage$gpath"
        continue
    fi
    cp -L "$hpath" "$stage$gpath"
    chmod u+w "$stage$gpath"
    if is_elf "$hpath"; then
        while read -r lib; do
            [ -n "$lib" ] || continue
            [ -e "$stage$lib" ] && continue
            mkdir -p "$stage$(dirname "$lib")"
            cp -L "$lib" "$stage$lib"
        done < <(elf_libs "$hpath")
    fi
done

for layer in "${layers[@]}"; do
    [ -f "$layer" ] || die "--layer: $layer not found"
    # A plain cpio (newc) archive, or a gzip'd one (decompressed below); nothing else unpacks.
    case $(head -c 6 "$layer") in
        070701) ;;
        *) [ "$(head -c 2 "$layer" | od -An -tx1 | tr -d ' ')" = 1f8b ] \
               || die "--layer $layer: neither a cpio (newc) archive nor a gzip'd one" ;;
    esac
done
initrd=$out/base.cpio
if [ -n "$(ls -A "$stage")" ] || [ ${#layers[@]} -gt 0 ]; then
    # The kernel unpacks concatenated cpio archives one after the other; later files replace
    # earlier ones. All of them plain: a plain archive after a gzip'd one fails to unpack.
    {
        cat "$out/base.cpio"
        for layer in "${layers[@]}"; do
            case $(head -c 6 "$layer") in
                070701) cat "$layer" ;;
                *) gzip -dc "$layer" ;;
            esac
        done
        if [ -n "$(ls -A "$stage")" ]; then
            # The same bytes for the same files (times, inode numbers): a snapshot's key.
            find "$stage" -mindepth 1 -exec touch -h -d @0 {} +
            (cd "$stage" && find . -mindepth 1 | LC_ALL=C sort \
                | cpio --quiet -o -H newc -R 0:0 --renumber-inodes --ignore-devno)
        fi
    } >"$tmp/initrd.cpio"
    initrd=$tmp/initrd.cpio
fi

# ---- accelerator ----------------------------------------------------------------
# accel.sh answers "kvm REASON" or "tcg REASON" (auto: from its cached probe boot).
# --accel only when given here: otherwise accel.sh reads COSCHED_ACCEL itself, and says so.
if [ "$accel_given" = 1 ]; then
    verdict=$("$here/accel.sh" --accel "$accel") || true
else
    verdict=$("$here/accel.sh") || true
fi
case $verdict in
    kvm\ *|tcg\ *) ;;
    *) die "guest/accel.sh gave no verdict" ;;
esac
accel=${verdict%% *}
[ -n "$initrd_out" ] || [ "$dry" = 1 ] || echo "run.sh: accelerator $accel: ${verdict#* }" >&2
if [ "$accel" = kvm ]; then
    accel_args=(-accel kvm -cpu host)
else
    accel_args=(-accel tcg -cpu max)
fi

# ---- QEMU command line ---------------------------------------------------------------
# cryptomgr.notests: no self-tests of the kernel's crypto algorithms at boot (under TCG they
# took ~0.4 s of the 2 s to init; nothing here measures the crypto API).
cmdline="console=ttyS0 quiet loglevel=1 panic=-1 cryptomgr.notests"
if [ ${#nets[@]} -gt 0 ]; then
    net_opts "${nets[0]}"
    [ -z "$nip" ] || cmdline="$cmdline cosched.ip=$nip"
fi
[ -z "$append" ] || cmdline="$cmdline $append"

if [ -n "$initrd_out" ]; then
    cp "$initrd" "$initrd_out"
    printf 'kernel=%s\ninitrd=%s\nappend=%s\naccel=%s\n' "$kernel" "$initrd_out" "$cmdline" "$accel"
    exit 0
fi

args=(
    "$qemu"
    -name "$name,debug-threads=on"
    "${accel_args[@]}"
    -machine pc
    -smp "$smp"
    -m "$mem"
    -display none -nodefaults -serial stdio
    -no-reboot
    -kernel "$kernel"
    -initrd "$initrd"
    -append "$cmdline"
)
[ -z "$pidfile" ] || args+=(-pidfile "$pidfile")
if [ -n "$sock" ] || [ "$use_snap" = 1 ]; then
    args+=(-device virtio-serial)
fi
if [ -n "$sock" ]; then
    # shellcheck disable=SC2054  # commas belong to QEMU's option syntax
    args+=(
        -chardev "socket,path=$sock,server=on,wait=off,id=cosched0"
        -device virtserialport,chardev=cosched0,name=org.cosched.0
    )
fi
if [ "$use_snap" = 1 ]; then
    # The workload's way in (guest/snapshot.py), after the cosched port (vport0p1 stays it).
    # shellcheck disable=SC2054
    args+=(
        -chardev "socket,path=$tmp/workload.sock,server=on,wait=off,id=workload"
        -device virtserialport,chardev=workload,name=org.cosched.workload
    )
fi

n=0
for spec in "${disks[@]}"; do
    disk_opts "$spec"
    dev=virtio-blk-pci,drive=disk$n
    if [ "$diothread" = 1 ]; then
        args+=(-object "iothread,id=iothread$n")
        dev=$dev,iothread=iothread$n
    fi
    args+=(-drive "file=$dfile,if=none,id=disk$n,format=raw,cache=none,aio=$daio" -device "$dev")
    n=$((n + 1))
done

n=0
nics=()
for spec in "${nets[@]}"; do
    net_opts "$spec"
    mac=$(printf '%s/%s' "$name" "$n" | md5sum | sed -E 's/^(..)(..)(..).*/52:54:00:\1:\2:\3/')
    if [ "$nkind" = tap ]; then
        args+=(-netdev "tap,id=n$n,ifname=$nif,script=no,downscript=no")
    else
        args+=(-netdev "user,id=n$n$nextra")
    fi
    args+=(-device "virtio-net-pci,netdev=n$n,mac=$mac")
    nics+=("nic $n $nkind $mac")
    n=$((n + 1))
done

if [ "$use_snap" = 1 ]; then
    # The key: everything that makes the guest's memory and devices what they are at the
    # snapshot point (a NIC's address is in the command line). The workload is not in it; it
    # arrives after.
    snapdir=$out/snapshots
    mkdir -p "$snapdir"
    key=$({
        echo "format 1"
        command -v "$qemu" | xargs stat -Lc '%n %s %Y'
        "$qemu" --version | head -1
        stat -Lc '%n %s %Y' "$kernel" "$here/snapshot.py"
        printf '%s\n' "$accel" "$cmdline" "smp $smp" "mem $mem" "sock ${sock:+1}" "${nics[@]}"
        sha256sum <"$initrd"
    } | sha256sum | cut -c1-20)
    snapfile=$snapdir/$key.img
fi

if [ "$dry" = 1 ]; then
    printf '%q ' "${args[@]}"
    echo
    exit 0
fi

# QEMU gets SIGTERM if run.sh dies, even by SIGKILL (setpriv --pdeathsig, kept across
# the exec of timeout, which forwards it to QEMU).
wrap=()
if command -v setpriv >/dev/null; then wrap+=(setpriv --pdeathsig TERM --); fi
if [ "$timeout_s" != 0 ]; then wrap+=(timeout --foreground -k 10 "$timeout_s"); fi


start=$SECONDS
# QEMU's stderr passes through a watcher: with KVM, a "KVM internal error" (or a failed entry
# or run) leaves QEMU alive with the guest stopped until the timeout, so the watcher stops it at
# once. The pid reaches the watcher through a file (it starts before QEMU's pid is known).
watch_err() {
    local line
    while IFS= read -r line || [ -n "$line" ]; do
        printf '%s\n' "$line" >&2
        case $line in
            *"KVM internal error"*|*"KVM: entry failed"*|*"kvm run failed"*)
                if [ "$accel" = kvm ] && [ ! -e "$tmp/kvm-error" ]; then
                    printf '%s\n' "$line" >"$tmp/kvm-error"
                    for _ in $(seq 50); do [ -s "$tmp/qpid" ] && break; sleep 0.02; done
                    kill -TERM "$(cat "$tmp/qpid" 2>/dev/null)" 2>/dev/null || true
                fi ;;
        esac
    done
}
# launch [EXTRA QEMU ARGS]: runs QEMU (and, from a snapshot, guest/snapshot.py beside it) until
# it exits; sets rc (QEMU's exit code) and hrc (the helper's: 3 when the guest never took its
# workload). QEMU reads the guest console from /dev/null: the guest needs no input, and QEMU
# then leaves the terminal alone (no raw mode, no SIGTTOU when run.sh is in the background).
launch() {
    local mode=$1
    shift
    rm -f "$tmp/qpid" "$tmp/workload.sock" "$tmp/qmp.sock"
    exec {errfd}> >(watch_err)
    wpid=$!
    "${wrap[@]}" "${args[@]}" "$@" </dev/null 2>&"$errfd" &
    qpid=$!
    exec {errfd}>&-
    echo "$qpid" >"$tmp/qpid"
    hrc=0
    if [ -n "$mode" ]; then
        python3 "$here/snapshot.py" "$mode" --port "$tmp/workload.sock" --workload "$workload" \
            --qmp "$tmp/qmp.sock" --snapshot "$snapfile" --qemu-pid-file "$tmp/qpid" \
            --timeout "$helper_timeout" &
        hpid=$!
        wait "$hpid" || hrc=$?
        hpid=
        # A guest that never took its workload will not run one: QEMU goes.
        [ "$hrc" = 0 ] || kill -TERM "$qpid" 2>/dev/null || true
    fi
    rc=0
    wait "$qpid" || rc=$?
    qpid=
    # The watcher prints the last of QEMU's stderr before run.sh says anything more.
    wait "$wpid" 2>/dev/null || true
}
# How long the helper waits for the guest's answer: a boot under load takes tens of seconds
# under TCG, and never longer than --timeout.
helper_timeout=180
if [ "$timeout_s" != 0 ] && [ "$timeout_s" -lt "$helper_timeout" ]; then helper_timeout=$timeout_s; fi
hpid=
if [ "$use_snap" = 0 ]; then
    launch ""
elif [ -f "$snapfile" ]; then
    echo "run.sh: from the snapshot $snapfile" >&2
    launch restore -incoming "exec:cat '$snapfile'"
    if [ "$hrc" = 3 ] && [ ! -e "$tmp/kvm-error" ]; then
        # Nothing of the workload ran: QEMU could not load it (or the guest never answered).
        echo "run.sh: the snapshot did not start (QEMU exited $rc): deleted, booting afresh" >&2
        rm -f "$snapfile"
        launch save -qmp "unix:$tmp/qmp.sock,server=on,wait=off"
    fi
else
    launch save -qmp "unix:$tmp/qmp.sock,server=on,wait=off"
    # The newest 16 stay (not ls: with no snapshot yet its glob fails the pipeline).
    find "$snapdir" -maxdepth 1 -name '*.img' -printf '%T@ %p\n' | sort -rn | tail -n +17 | cut -d' ' -f2- \
        | xargs -r rm -f
fi
if [ -e "$tmp/kvm-error" ]; then
    err=$(cat "$tmp/kvm-error")
    "$here/accel.sh" --record-failure "QEMU: $err" -q || true
    echo "run.sh: QEMU stopped: the guest hit a fatal KVM error ($err): this host's KVM cannot run it; recorded, so the next automatic choice is TCG (--accel tcg or COSCHED_ACCEL=tcg forces it)" >&2
    exit 3
fi
if [ "$timeout_s" != 0 ] && { [ "$rc" = 124 ] || { [ "$rc" = 137 ] && [ $((SECONDS - start)) -ge "$timeout_s" ]; }; }; then
    echo "run.sh: guest did not power off within ${timeout_s}s, QEMU killed" >&2
    exit 124
fi
exit "$rc"
