"""The Debian test guest (guest/build-debian.sh): Debian 12 with systemd and udev, booted from
its own kernel and initramfs with its disk image under snapshot=on (the image is never written;
the guest's changes go to a temporary file QEMU deletes). The host drives it over the
virtio-serial port org.cosched.test (guest/debian/driver.sh): run() sends a bash script and
returns its exit code and output. The port org.cosched.0 is the cosched channel, as an
operator's VM has it; a read-only 9p share (mount tag "host") brings files in."""

import base64
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import harness

BUILD_SH = harness.REPO / "guest/build-debian.sh"
DEBIAN_DIR = Path(os.environ.get("COSCHED_DEBIAN_DIR", harness.REPO / "build/guest/debian"))


def build(quiet=True):
    """Builds the image if it is not up to date (guest/build-debian.sh; minutes the first time)."""
    subprocess.run([str(BUILD_SH)] + (["--quiet"] if quiet else []), check=True)


class DebianGuest(harness.ConsoleReader):
    """One boot of the Debian test guest. `sock`: the host end of org.cosched.0 (QEMU is the
    server, as for an operator's VM); `share`: a directory the guest can mount read-only
    (`mount -t 9p -o trans=virtio host /mnt`). QEMU dies with this process."""

    def __init__(self, name="cosdebian", sock=None, share=None, mem_mb=1024, cpus=1, verbose=False):
        self.name = name
        self.verbose = verbose
        self._tmp = tempfile.TemporaryDirectory(prefix="cosched-debian-")
        tmp = Path(self._tmp.name)
        self.driver_sock = tmp / "driver.sock"
        self.pidfile = tmp / "qemu.pid"
        self.accel, self.accel_reason = harness.accel()
        accel = ["-accel", "kvm", "-cpu", "host"] if self.accel == "kvm" else ["-accel", "tcg", "-cpu", "max"]
        cmd = ["qemu-system-x86_64", "-name", f"{name},debug-threads=on", *accel, "-machine", "pc", "-smp", str(cpus),
               "-m", str(mem_mb), "-display", "none", "-nodefaults", "-serial", "stdio",
               "-kernel", str(DEBIAN_DIR / "vmlinuz"), "-initrd", str(DEBIAN_DIR / "initrd.img"),
               "-append", "root=/dev/vda rw console=ttyS0 quiet cryptomgr.notests systemd.show_status=false",
               "-drive", f"file={DEBIAN_DIR / 'root.img'},if=virtio,format=raw,snapshot=on,cache=unsafe",
               "-pidfile", str(self.pidfile), "-device", "virtio-serial",
               "-chardev", f"socket,path={self.driver_sock},server=on,wait=off,id=drv",
               "-device", "virtserialport,chardev=drv,name=org.cosched.test"]
        if sock:
            cmd += ["-chardev", f"socket,path={sock},server=on,wait=off,id=cosched0",
                    "-device", "virtserialport,chardev=cosched0,name=org.cosched.0"]
        if share:
            cmd += ["-virtfs", f"local,path={share},mount_tag=host,security_model=none,readonly=on"]
        self.replies = []
        self._seq = 0
        self.t0 = time.monotonic()
        self._follow(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      text=True, errors="replace", preexec_fn=harness.dies_with_us(signal.SIGKILL)))
        self._driver = None
        self._driver_thread = None

    # ---- the command channel ------------------------------------------------------------------

    def _read_driver(self, conn):
        buf = b""
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                with self._cond:
                    self.replies.append((time.monotonic(), line.decode(errors="replace")))
                    self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _connect(self, deadline):
        while self._driver is None:
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(str(self.driver_sock))
                self._driver = s
            except OSError:
                s.close()
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name}: QEMU exited {self.proc.returncode}:\n{self.console()[-3000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name}: no driver socket {self.driver_sock}")
                time.sleep(0.05)
        self._driver_thread = threading.Thread(target=self._read_driver, args=(self._driver,), daemon=True)
        self._driver_thread.start()

    def _wait(self, pred, timeout, what):
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                got = pred()
                if got is not None:
                    return got
                if self.proc.poll() is not None and not self._reader.is_alive():
                    why = f"QEMU exited {self.proc.returncode}"
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    why = f"not within {timeout} s"
                    break
                self._cond.wait(min(left, 0.5))
        raise RuntimeError(f"{self.name}: {what}: {why}; last console lines:\n" + "\n".join(self.lines[-40:]))

    def wait_ready(self, timeout=300, after=0):
        """Waits for the driver's READY line (the n-th after `after` earlier ones: a reboot says it
        again). Returns (seconds from QEMU's start or `since`, the guest's uptime then)."""
        if self._driver is None:
            self._connect(time.monotonic() + 30)
        line = self._wait(lambda: next(((t, l) for t, l in [r for r in self.replies if r[1].startswith("READY ")]
                                        [after:]), None), timeout, "the test driver never said READY")
        return line[0] - self.t0, float(line[1].split()[1])

    def readies(self):
        with self._cond:
            return sum(1 for _, l in self.replies if l.startswith("READY "))

    def send(self, script):
        """Starts `script` (bash) in the guest and returns its request id, without waiting (for
        a script that takes the driver down with it: a reboot)."""
        self._seq += 1
        rid = str(self._seq)
        self._driver.sendall(f"RUN {rid} {base64.b64encode(script.encode()).decode()}\n".encode())
        return rid

    def run(self, script, timeout=120, check=True):
        """Runs `script` (bash) in the guest as root: (exit code, stdout and stderr). With
        `check`, a non-zero exit raises, with the output."""
        rid = self.send(script)
        line = self._wait(lambda: next((l for _, l in self.replies if l.split(" ", 2)[:2] == ["DONE", rid]), None),
                          timeout, f"no answer to script {script[:200]!r}")
        parts = line.split(" ")
        rc = int(parts[2])
        out = base64.b64decode(parts[3]).decode(errors="replace") if len(parts) > 3 else ""
        if check and rc != 0:
            raise AssertionError(f"{self.name}: exit {rc} from script:\n{script}\noutput:\n{out}")
        return rc, out

    # ---- QEMU -----------------------------------------------------------------------------------

    @property
    def pid(self):
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None

    def vcpu_tids(self):
        return [tid for tid, comm in harness.qemu_threads(self.pid) if harness.is_vcpu(comm)] if self.pid else []

    def stop(self):
        """Stops QEMU (SIGTERM, then SIGKILL after 10 s) and removes everything it made (idempotent)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._driver is not None:
            self._driver.close()
        self._reader.join(5)
        self.proc.stdout.close()
        self._tmp.cleanup()
