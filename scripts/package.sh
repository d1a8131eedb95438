#!/usr/bin/env bash
# Builds the Debian package: target/debian/cosched_<version>_<arch>.deb, holding the cosched
# binary, the systemd units (cosched-host.service, cosched-guest.service), the udev rule that
# starts the guest agent when its port appears, a commented /etc/cosched/host.toml, the man
# pages and shell completions (bash, zsh, fish) generated from the CLI definition.
#   bash scripts/package.sh            (builds the release binary first if needed)
# Install with: apt install ./target/debian/cosched_*.deb   (or dpkg -i)
# Needs only cargo and dpkg-deb (Debian's base system has it); no root.
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
stage=$out/stage
rm -rf "$stage"
mkdir -p "$stage/DEBIAN"

install -Dm755 "$bin" "$stage/usr/bin/cosched"
strip --strip-unneeded "$stage/usr/bin/cosched"
install -Dm644 packaging/cosched-host.service "$stage/lib/systemd/system/cosched-host.service"
install -Dm644 packaging/cosched-guest.service "$stage/lib/systemd/system/cosched-guest.service"
install -Dm644 packaging/60-cosched.rules "$stage/lib/udev/rules.d/60-cosched.rules"
install -Dm644 packaging/host.toml "$stage/etc/cosched/host.toml"
install -Dm644 README.md "$stage/usr/share/doc/cosched/README.md"
install -Dm644 packaging/grafana/cosched.json "$stage/usr/share/cosched/grafana/cosched.json"
gzip -9n "$stage/usr/share/doc/cosched/README.md"
mkdir -p "$stage/usr/share/man/man1"
"$bin" generate man "$stage/usr/share/man/man1"
gzip -9n "$stage"/usr/share/man/man1/*.1
install -d "$stage/usr/share/bash-completion/completions" "$stage/usr/share/zsh/vendor-completions" \
    "$stage/usr/share/fish/vendor_completions.d"
"$bin" generate completions bash > "$stage/usr/share/bash-completion/completions/cosched"
"$bin" generate completions zsh > "$stage/usr/share/zsh/vendor-completions/_cosched"
"$bin" generate completions fish > "$stage/usr/share/fish/vendor_completions.d/cosched.fish"
install -m755 packaging/debian/postinst packaging/debian/prerm packaging/debian/postrm "$stage/DEBIAN/"
echo /etc/cosched/host.toml > "$stage/DEBIAN/conffiles"

# The binary links only libc and libgcc (libbpf, libelf and zlib are static).
libc=$(dpkg-query -W -f='${Version}' libc6 | sed 's/-.*//')
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat > "$stage/DEBIAN/control" <<CONTROL
Package: cosched
Version: $version
Architecture: $arch
Maintainer: cosched developers <root@localhost>
Installed-Size: $size
Depends: libc6 (>= $libc), libgcc-s1
Suggests: qemu-system-x86, libvirt-daemon-system
Section: admin
Priority: optional
Description: coordinated host/guest scheduling for QEMU/KVM virtual machines
 The guest agent detects with eBPF when the guest runs work that must not
 wait (real-time tasks, newly started applications, urgent disk reads) and
 tells the host over a virtio-serial port; the host daemon then privileges
 that VM's threads (CPU priority, I/O priority, memory bandwidth) for just
 that long, within operator budgets, and puts back every change it made.
 Guests without the agent get event boosting on their I/O events.
CONTROL
deb="$out/cosched_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
rm -rf "$stage"
echo "package.sh: $deb"
