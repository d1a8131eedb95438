#!/usr/bin/env bash
# Installs what cosched needs on Debian 12 and builds it: the release binary
# (target/release/cosched) and the test guest (build/guest). Run as root; safe to rerun.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
[ "$(id -u)" = 0 ] || { echo "setup.sh: run as root (it installs packages; the daemon and tests need root too)" >&2; exit 1; }

# Build: clang for the BPF programs, libelf/zlib (static) for libbpf; gcc and libc6-dev for the
# static guest tools. Guest: guest/DEPS. Experiments: Debian's python3 with matplotlib, gzip and
# bzip2 as host jobs, fuse3 and libfuse3-dev for the emulated slow disk (bench/slowdisk), iproute2
# (tap devices, network namespaces) and curl (the download client) for the feas-* experiments;
# systemd (systemd-analyze verifies the units) and binutils (strip) for the package; python3-venv
# for kubernetes-validate; libcap2-bin (capsh) to run the daemon as another user in a test;
# libvirt's daemon, QEMU driver and virsh for the libvirt test (bench/tests/test_libvirt.py; not
# libvirt-daemon-system, which would pull in systemd as init); podman and runc for the container
# test (bench/tests/test_environments.py; runc: crun refuses a hybrid cgroup v1/v2 layout).
pkgs=(clang llvm libelf-dev zlib1g-dev pkg-config gcc libc6-dev make seabios python3 python3-matplotlib gzip bzip2 fuse3 libfuse3-dev iproute2 curl systemd binutils python3-venv libcap2-bin
      libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients podman runc)
while read -r p; do pkgs+=("$p"); done < <(sed 's/#.*//' guest/DEPS | tr -s ' \t' '\n' | grep -v '^$')

if ! command -v cargo >/dev/null; then
    # shellcheck disable=SC1091
    [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
fi
command -v cargo >/dev/null || { echo "setup.sh: cargo not found: install Rust (rustup, 1.85 or newer)" >&2; exit 1; }

# Steps that do not need what another step makes run beside it, each with its log: a failure
# stops setup with that log. On a fresh machine: cargo-fuzz builds while apt installs, the venv
# and the test guest (downloads, unpacking) while cosched builds.
bg_pids=()
bg_names=()
bg_logs=()
background() {
    local name=$1 log
    shift
    log=$(mktemp "${TMPDIR:-/tmp}/cosched-setup.XXXXXX")
    "$@" >"$log" 2>&1 &
    bg_pids+=($!)
    bg_names+=("$name")
    bg_logs+=("$log")
}
wait_background() {
    local i failed=0
    for i in "${!bg_pids[@]}"; do
        if wait "${bg_pids[$i]}"; then
            cat "${bg_logs[$i]}"
        else
            echo "setup.sh: ${bg_names[$i]} failed:" >&2
            cat "${bg_logs[$i]}" >&2
            failed=1
        fi
        rm -f "${bg_logs[$i]}"
    done
    bg_pids=()
    bg_names=()
    bg_logs=()
    [ "$failed" = 0 ] || exit 1
}
# A process and its descendants, SIGTERM, children first.
kill_tree() {
    local child
    for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
    kill -TERM "$1" 2>/dev/null || true
}
# On the way out (a step failed, or setup was stopped): steps still running beside it are
# stopped, not left to run on unseen, and their logs shown; then the logs go.
# shellcheck disable=SC2317  # called from the trap
on_exit() {
    local i
    for i in "${!bg_pids[@]}"; do
        kill_tree "${bg_pids[$i]}"
        wait "${bg_pids[$i]}" 2>/dev/null || true
        echo "setup.sh: stopped ${bg_names[$i]}; the end of its log:" >&2
        tail -n 20 "${bg_logs[$i]}" >&2 || true
    done
    for i in "${bg_logs[@]}"; do rm -f "$i"; done
}
trap on_exit EXIT

# cargo-fuzz for the fuzz targets (fuzz/, bench/fuzz.sh), on the nightly toolchain. It needs only
# cargo, a C compiler and libc's development files; without them yet, it waits for apt.
install_cargo_fuzz() {
    echo "setup.sh: installing cargo-fuzz (cargo install)"
    cargo install --locked --quiet cargo-fuzz
}
fuzz_later=0
if ! command -v cargo-fuzz >/dev/null; then
    if command -v cc >/dev/null && dpkg-query -W -f='${Status}' libc6-dev 2>/dev/null | grep -q "install ok installed"; then
        background "cargo install cargo-fuzz" install_cargo_fuzz
    else
        fuzz_later=1
    fi
fi

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup.sh: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# libvirt's QEMU runs as libvirt-qemu (Debian's build default), a user libvirt-daemon-system's
# postinst would create.
if ! getent passwd libvirt-qemu >/dev/null; then
    echo "setup.sh: adding the system user libvirt-qemu (libvirt runs QEMU as it)"
    getent group libvirt-qemu >/dev/null || groupadd --system libvirt-qemu
    useradd --system --gid libvirt-qemu --home-dir /var/lib/libvirt --no-create-home \
        --shell /usr/sbin/nologin libvirt-qemu
fi

[ "$fuzz_later" = 0 ] || install_cargo_fuzz

# kubernetes-validate (PyPI, with the Kubernetes schemas) checks the DaemonSet manifest offline.
install_validator() {
    echo "setup.sh: installing kubernetes-validate into build/venv"
    python3 -m venv build/venv
    build/venv/bin/pip install --quiet --disable-pip-version-check kubernetes-validate
}
[ -x build/venv/bin/kubernetes-validate ] || background "installing kubernetes-validate" install_validator

build_guest() {
    echo "setup.sh: building the test guest (guest/build.sh, guest/build-python-layer.sh)"
    guest/build.sh --quiet
    guest/build-python-layer.sh >/dev/null
    mkdir -p build/guest-tools
    if [ ! build/guest-tools/cosched-tools -nt bench/guest-tools/cosched-tools.c ]; then
        gcc -O2 -Wall -static -o build/guest-tools/cosched-tools bench/guest-tools/cosched-tools.c
    fi
}
background "building the test guest" build_guest
# The Debian test guest (systemd, udev; the VM tests of bench/tests/test_environments.py), for the
# tests only: about 30 s and 150 MB of Debian packages the first time.
if [ "${COSCHED_SETUP_TESTS:-0}" = 1 ]; then
    background "building the Debian test guest" guest/build-debian.sh --quiet
fi

# COSCHED_SETUP_TESTS=1 (scripts/test.sh): the test binaries too, in the same cargo run, while
# the guest builds beside it (the binaries are the same either way).
if [ "${COSCHED_SETUP_TESTS:-0}" = 1 ]; then
    echo "setup.sh: building cosched and its tests (cargo test --release --no-run)"
    cargo test --release --locked --workspace --no-run --quiet
else
    echo "setup.sh: building cosched (cargo build --release)"
    cargo build --release --locked --workspace --quiet
fi
wait_background
echo "setup.sh: ready: $repo/target/release/cosched"
