#!/usr/bin/env bash
# The demo: installs and builds everything (scripts/setup.sh), then boots the test guest three
# times -- idle host, 2 host CPU hogs without coordination, 2 host CPU hogs with cosched -- and
# prints the guest's cyclictest latency side by side. Run as root on Debian 12. ~2 minutes after
# the first build.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Root is needed (packages, the daemon, QEMU threads). A root shell runs it as it is; otherwise
# it re-runs itself with sudo, where sudo is installed (a fresh Debian root shell has none).
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null; then
        exec sudo -E env "PATH=$PATH" bash "${BASH_SOURCE[0]}" "$@"
    fi
    echo "$(basename "$0"): needs root, and sudo is not installed: run it from a root shell (su -)" >&2
    exit 1
fi
"$repo/scripts/setup.sh"
exec /usr/bin/python3 "$repo/bench/cosched_bench.py" demo "$@"
