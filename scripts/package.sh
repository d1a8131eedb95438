#!/usr/bin/env bash
# Builds the Debian packages, in target/debian:
#   cosched_<version>_<arch>.deb        the binary, man pages, shell completions (bash, zsh, fish)
#   cosched-host_<version>_<arch>.deb   the host role: cosched-host.service (enabled and started
#                                       where systemd runs), a commented /etc/cosched/host.toml,
#                                       the Grafana dashboard
#   cosched-guest_<version>_<arch>.deb  the guest role: cosched-guest.service, the udev rule that
#                                       starts it when the host's port appears, a commented
#                                       /etc/cosched/guest.toml; nothing of the host daemon
#   bash scripts/package.sh            (builds the release binary first if needed)
# Install on a host: apt install ./target/debian/cosched_*.deb ./target/debian/cosched-host_*.deb
# In a guest:        apt install ./target/debian/cosched_*.deb ./target/debian/cosched-guest_*.deb
# Needs only cargo and dpkg-deb (Debian's base system has it); no root. Prints a line
# "package.sh: PATH" per package.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
if ! command -v cargo >/dev/null && [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
cargo build --release --locked -p cosched --quiet
bin=target/release/cosched
version=$("$bin" --version | awk '{print $2}')
arch=$(dpkg --print-architecture)
out=target/debian
mkdir -p "$out"
# The binary links only libc and libgcc (libbpf, libelf and zlib are static).
libc=$(dpkg-query -W -f='${Version}' libc6 | sed 's/-.*//')

# build NAME DEPENDS SUMMARY DESCRIPTION [FIELDS]: DEBIAN/control for the stage in $stage, then
# the .deb.
build() {
    local name=$1 depends=$2 summary=$3 description=$4 fields=${5:-} size deb
    size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
    cat > "$stage/DEBIAN/control" <<CONTROL
Package: $name
Version: $version
Architecture: $arch
Maintainer: cosched developers <root@localhost>
Installed-Size: $size
Depends: $depends
${fields}Section: admin
Priority: optional
Description: $summary
$description
CONTROL
    deb="$out/${name}_${version}_${arch}.deb"
    dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
    rm -rf "$stage"
    echo "package.sh: $deb"
}
about=" The guest agent detects with eBPF when the guest runs work that must not
 wait (real-time tasks, newly started applications, urgent disk reads) and
 tells the host over a virtio-serial port; the host daemon then privileges
 that VM's threads (CPU priority, I/O priority, memory bandwidth) for just
 that long, within operator budgets, and puts back every change it made."

# cosched: the binary and what documents it.
stage=$out/stage-cosched
rm -rf "$stage"
mkdir -p "$stage/DEBIAN"
install -Dm755 "$bin" "$stage/usr/bin/cosched"
strip --strip-unneeded "$stage/usr/bin/cosched"
install -Dm644 README.md "$stage/usr/share/doc/cosched/README.md"
gzip -9n "$stage/usr/share/doc/cosched/README.md"
# Each page into the directory of its section (cosched.8, cosched-host.toml.5, ...).
pages=$(mktemp -d)
"$bin" generate man "$pages"
for page in "$pages"/*; do
    install -Dm644 "$page" "$stage/usr/share/man/man${page##*.}/${page##*/}"
    gzip -9n "$stage/usr/share/man/man${page##*.}/${page##*/}"
done
rm -rf "$pages"
install -d "$stage/usr/share/bash-completion/completions" "$stage/usr/share/zsh/vendor-completions" \
    "$stage/usr/share/fish/vendor_completions.d"
"$bin" generate completions bash > "$stage/usr/share/bash-completion/completions/cosched"
"$bin" generate completions zsh > "$stage/usr/share/zsh/vendor-completions/_cosched"
"$bin" generate completions fish > "$stage/usr/share/fish/vendor_completions.d/cosched.fish"
build cosched "libc6 (>= $libc), libgcc-s1" \
    "coordinated host/guest scheduling for QEMU/KVM virtual machines" \
    "$about
 .
 This package holds the cosched command. Install cosched-host on a host
 and cosched-guest in a guest."

# cosched-host: the daemon's unit and config.
stage=$out/stage-host
rm -rf "$stage"
mkdir -p "$stage/DEBIAN"
install -Dm644 packaging/cosched-host.service "$stage/lib/systemd/system/cosched-host.service"
install -Dm644 packaging/host.toml "$stage/etc/cosched/host.toml"
install -Dm644 packaging/grafana/cosched.json "$stage/usr/share/cosched/grafana/cosched.json"
install -m755 packaging/debian/host/postinst packaging/debian/host/prerm packaging/debian/host/postrm "$stage/DEBIAN/"
echo /etc/cosched/host.toml > "$stage/DEBIAN/conffiles"
# Before 0.2 one package "cosched" shipped the units and the config: the roles take them over.
takeover="Breaks: cosched (<< 0.2.0)
Replaces: cosched (<< 0.2.0)
"
build cosched-host "cosched (= $version)" \
    "cosched host role: the daemon that boosts VMs' threads" \
    "$about
 .
 This package runs the host daemon (cosched-host.service), enabled and
 started where systemd runs, with its config /etc/cosched/host.toml." "$takeover"

# cosched-guest: the agent's unit, its udev rule and config.
stage=$out/stage-guest
rm -rf "$stage"
mkdir -p "$stage/DEBIAN"
install -Dm644 packaging/cosched-guest.service "$stage/lib/systemd/system/cosched-guest.service"
install -Dm644 packaging/60-cosched.rules "$stage/lib/udev/rules.d/60-cosched.rules"
install -Dm644 packaging/guest.toml "$stage/etc/cosched/guest.toml"
install -m755 packaging/debian/guest/postinst packaging/debian/guest/prerm packaging/debian/guest/postrm "$stage/DEBIAN/"
echo /etc/cosched/guest.toml > "$stage/DEBIAN/conffiles"
build cosched-guest "cosched (= $version)" \
    "cosched guest role: the agent that tells the host when the VM needs help" \
    "$about
 .
 This package runs the guest agent (cosched-guest.service), started by udev
 when the host's virtio-serial port org.cosched.0 appears, with its config
 /etc/cosched/guest.toml. It installs nothing of the host daemon." "$takeover"
