#!/bin/bash
# The Debian test guest's command channel (test infrastructure, not part of cosched): reads
# requests from the virtio-serial port org.cosched.test and answers each on the same port.
#   host -> guest:  RUN <id> <base64 of a bash script>
#   guest -> host:  DONE <id> <exit code> <base64 of its stdout and stderr>
# Once the port is open it says "READY <seconds since boot>". Started by systemd
# (cosched-test-driver.service) as soon as the port's device is there.
set -u
port=/dev/virtio-ports/org.cosched.test
exec 3<>"$port"
read -r up _ </proc/uptime
echo "READY $up" >&3
while read -r verb id script <&3; do
    [ "$verb" = RUN ] || continue
    f=$(mktemp)
    echo "$script" | base64 -d >"$f"
    out=$(bash "$f" 2>&1 </dev/null)
    rc=$?
    rm -f "$f"
    echo "DONE $id $rc $(printf '%s' "$out" | base64 -w0)" >&3
done
