#!/usr/bin/env python3
"""guest/run.sh's helper for booting from a snapshot: hands the guest its workload over the
virtio-serial port org.cosched.workload, and takes the snapshot on a boot that has none yet.

The guest's init, once booted (modules loaded, ports named, nothing of a workload run), writes
"READY" on the port and blocks reading its workload: a line "LEN EPOCH" (the script's length in
bytes, the host's clock in seconds), then the LEN bytes of the script. It answers "GOT" and
runs the script as it runs one from the initramfs.

  save:    waits for READY, saves the running guest into SNAPSHOT through QEMU's monitor (QMP
           "migrate" to a file, the guest blocked in its read), lets it go on, then hands it
           the workload;
  restore: QEMU was started with -incoming from SNAPSHOT, the guest is blocked in that read:
           hands it the workload.

Exits 0 once the guest said GOT; 3 if it never did (a restore QEMU could not load, a guest that
never answered): then nothing of the workload ran, and run.sh boots afresh.
"""

import argparse
import json
import os
import socket
import sys
import time


def log(msg):
    print(f"run.sh: {msg}", file=sys.stderr, flush=True)


def connect(path, deadline, alive):
    """A connection to the unix socket QEMU listens on, once it exists."""
    while True:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            return s
        except OSError:
            s.close()
            if time.monotonic() > deadline or not alive():
                return None
            time.sleep(0.01)


def read_line(sock, deadline, alive):
    """One line from `sock` (without its newline), or None at the deadline or at its end."""
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not alive():
            return None
        sock.settimeout(min(left, 0.5))
        try:
            chunk = sock.recv(4096)
        except socket.timeout:
            continue
        if not chunk:
            return None
        buf += chunk
    return buf.split(b"\n", 1)[0].decode(errors="replace").strip()


class Qmp:
    def __init__(self, sock):
        self.sock = sock
        self.file = sock.makefile("rb")
        json.loads(self.file.readline())  # the greeting
        self.call("qmp_capabilities")

    def call(self, cmd, **args):
        msg = {"execute": cmd, **({"arguments": args} if args else {})}
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            r = json.loads(self.file.readline())
            if "error" in r:
                raise RuntimeError(f"QMP {cmd}: {r['error'].get('desc', r['error'])}")
            if "return" in r:
                return r["return"]


def save(qmp_path, snapshot, deadline, alive):
    """Saves the guest into `snapshot` (atomically: a partial file is never left under its
    name) and resumes it. Returns an error message, or None."""
    q = connect(qmp_path, deadline, alive)
    if q is None:
        return "no QMP monitor"
    tmp = f"{snapshot}.{os.getpid()}.tmp"
    qmp = None
    try:
        qmp = Qmp(q)
        t0 = time.monotonic()
        qmp.call("migrate", uri="exec:cat > '" + tmp.replace("'", "'\\''") + "'")
        while True:
            st = qmp.call("query-migrate")
            status = st.get("status")
            if status == "completed":
                break
            if status in ("failed", "cancelled") or time.monotonic() > deadline:
                return f"saving failed ({status}: {st.get('error-desc', '')})"
            time.sleep(0.02)
        os.replace(tmp, snapshot)
        log(f"saved a snapshot of the booted guest ({os.path.getsize(snapshot) >> 20} MiB, "
            f"{time.monotonic() - t0:.1f} s): {snapshot}")
        return None
    except (OSError, RuntimeError, ValueError) as e:
        return f"saving failed: {e}"
    finally:
        # A completed save leaves the guest paused; a failed one may too.
        if qmp is not None:
            try:
                qmp.call("cont")
            except (OSError, RuntimeError, ValueError):
                pass
        q.close()
        if os.path.exists(tmp):
            os.unlink(tmp)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("save", "restore"))
    ap.add_argument("--port", required=True, help="the unix socket of the guest's org.cosched.workload port")
    ap.add_argument("--workload", required=True, help="the script to hand the guest")
    ap.add_argument("--qmp", help="save: QEMU's QMP socket")
    ap.add_argument("--snapshot", help="save: the file to save the guest into")
    ap.add_argument("--qemu-pid-file", help="a file with QEMU's pid: gives up as soon as QEMU is gone")
    ap.add_argument("--timeout", type=float, default=120, help="seconds to wait for the guest (default 120)")
    a = ap.parse_args()
    deadline = time.monotonic() + a.timeout

    def alive():
        if not a.qemu_pid_file:
            return True
        try:
            pid = int(open(a.qemu_pid_file).read().strip())
        except (OSError, ValueError):
            return True  # not started yet
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    def fail(msg):
        # When QEMU is gone, run.sh says why; this would only be noise before it.
        if alive():
            log(msg)
        return 3

    script = open(a.workload, "rb").read()
    port = connect(a.port, deadline, alive)
    if port is None:
        return fail("the guest's workload port never opened")
    if a.mode == "save":
        if read_line(port, deadline, alive) != "READY":
            return fail("the guest never said READY on its workload port")
        err = save(a.qmp, a.snapshot, deadline, alive)
        if err:
            # The guest goes on (or never stopped): this boot still runs its workload.
            log(f"{err}; this boot goes on without one")
    port.sendall(f"{len(script)} {int(time.time())}\n".encode() + script)
    if read_line(port, deadline, alive) != "GOT":
        return fail("the guest did not take its workload")
    return 0


if __name__ == "__main__":
    sys.exit(main())
