#!/usr/bin/env bash
# The demo: installs and builds everything (scripts/setup.sh), then boots the test guest three
# times -- idle host, 2 host CPU hogs without coordination, 2 host CPU hogs with cosched -- and
# prints the guest's cyclictest latency side by side. Run as root on Debian 12. ~2 minutes after
# the first build.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then
    exec sudo -E env "PATH=$PATH" bash "${BASH_SOURCE[0]}" "$@"
fi
"$repo/scripts/setup.sh"
exec /usr/bin/python3 "$repo/bench/cosched_bench.py" demo "$@"
