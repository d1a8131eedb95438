"""libvirt for real: a libvirtd started by the test (no systemd), the test guest
defined as libvirt domains and started with `virsh start`, the daemon beside it as an operator
runs it. Root; needs what scripts/setup.sh installs (libvirt-daemon, its QEMU driver, virsh, the
libvirt-qemu user).

What it changes on the host, and puts back: libvirtd and virtlogd run while it does (it refuses
to start where a libvirtd runs already, rather than share one); libvirt's state directories
(/run/libvirt, /var/lib/libvirt, /var/cache/libvirt, /var/log/libvirt, /etc/libvirt/qemu,
/etc/libvirt/nwfilter, /etc/libvirt/secrets) are removed again if they did not exist before, and
so are its /machine cgroups; and on a kernel with RT group scheduling (a v1 `cpu` hierarchy with cpu.rt_runtime_us), where
/etc/libvirt/qemu.conf does not exist, it writes one that keeps QEMU out of libvirt's `cpu`
groups (which have no real-time runtime: see the README), and removes it again."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness  # noqa: E402


def setUpModule():
    harness.print_accel(__file__)

URI = "qemu:///system"
STATE_DIRS = ["/run/libvirt", "/var/lib/libvirt", "/var/cache/libvirt", "/var/log/libvirt", "/etc/libvirt/qemu",
              "/etc/libvirt/nwfilter", "/etc/libvirt/secrets"]
QEMU_CONF = Path("/etc/libvirt/qemu.conf")
CONF_HEADER = "# written by cosched's bench/tests/test_libvirt.py, removed by it\n"
RT_GROUPS = Path("/sys/fs/cgroup/cpu/cpu.rt_runtime_us")
WITH_CHANNEL = "cosched-lvt-agent"
WITHOUT_CHANNEL = "cosched-lvt-plain"

WORKLOAD = """#!/bin/sh
""" + harness.agent_start('-v', 'registered with the host') + """echo "COSCHED-LVT: REGISTERED"
cyclictest -p 80 -i 1000 -l 3000 -q
echo "COSCHED-LVT: CPU-DONE"
sleep 600
"""
PLAIN_WORKLOAD = """#!/bin/sh
echo "COSCHED-LVT: UP"
sleep 600
"""


def virsh(*args, check=True):
    r = subprocess.run(["virsh", "-c", URI, *args], capture_output=True, text=True, timeout=60)
    if check and r.returncode != 0:
        raise AssertionError(f"virsh {' '.join(args)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def domain_xml(name, kernel, initrd, append, accel, console, sock=None):
    channel = f"""
    <channel type='unix'>
      <source mode='bind' path='{sock}'/>
      <target type='virtio' name='org.cosched.0'/>
    </channel>""" if sock else ""
    cpu = "<cpu mode='host-passthrough'/>" if accel == "kvm" else "<cpu mode='maximum'/>"
    return f"""<domain type='{"kvm" if accel == "kvm" else "qemu"}'>
  <name>{name}</name>
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{kernel}</kernel>
    <initrd>{initrd}</initrd>
    <cmdline>{append}</cmdline>
  </os>
  <features><acpi/></features>
  {cpu}
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <serial type='file'>
      <source path='{console}'/>
      <target port='0'/>
    </serial>{channel}
    <memballoon model='none'/>
  </devices>
</domain>
"""


def hides_kvm():
    return harness.accel()[0] == "tcg" and os.path.exists("/dev/kvm")


def hide_kvm(cmd, tmp):
    """`cmd` as it runs libvirtd. Where the guest runs under TCG and /dev/kvm exists, libvirtd runs
    in a mount namespace of its own with /dev/kvm covered by an empty file no one may open (the
    host's /dev/kvm is untouched): libvirt checks /dev/kvm as QEMU's user (libvirt-qemu, which
    cannot open a root-only /dev/kvm) while its capability probe's QEMU opens it with
    CAP_DAC_OVERRIDE and enables KVM, so with this host's /dev/kvm (kvm_pvm, 0600 root) each
    `virsh define` found its capabilities "KVM was enabled when probing, but it is not available
    now" and probed QEMU again: 40-48 s per define. Covered, both see no KVM and the cache holds
    (QEMU then runs in libvirtd's mount namespace: qemu.conf namespaces = [])."""
    cover = Path(tmp) / "no-kvm"
    cover.touch()
    cover.chmod(0)
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount --bind "$0" /dev/kvm && exec "$@"', str(cover), *cmd]


@contextlib.contextmanager
def libvirtd(log):
    """virtlogd and libvirtd in the foreground (they die with us), libvirt's state directories
    and qemu.conf removed again if this made them."""
    missing = [p for p in ("libvirtd", "virtlogd", "virsh") if shutil.which(p) is None]
    if missing:
        raise AssertionError(f"{', '.join(missing)} not installed: scripts/setup.sh installs libvirt")
    if subprocess.run(["getent", "passwd", "libvirt-qemu"], capture_output=True).returncode != 0:
        raise AssertionError("no libvirt-qemu user (libvirt runs QEMU as it): scripts/setup.sh adds it")
    running = subprocess.run(["pgrep", "-x", "libvirtd|virtqemud"], capture_output=True, text=True).stdout.split()
    if running:
        raise AssertionError(f"a libvirt daemon runs already (pid {', '.join(running)}); this test starts its own")
    made = [Path(p) for p in STATE_DIRS if not os.path.exists(p)]
    partitions = set(Path("/sys/fs/cgroup").glob("*/machine"))
    wrote_conf = False
    procs = []
    try:
        Path("/var/log/libvirt").mkdir(exist_ok=True)
        libvirtd = ["libvirtd"]
        # A qemu.conf with our header is one an interrupted run of this test left: ours to replace.
        if QEMU_CONF.exists() and QEMU_CONF.read_text().startswith(CONF_HEADER):
            QEMU_CONF.unlink()
        if not QEMU_CONF.exists():
            conf = []
            if RT_GROUPS.exists():
                conf.append('cgroup_controllers = [ "devices", "memory", "blkio", "cpuset", "cpuacct" ]')
            if hides_kvm():
                # QEMU in libvirtd's namespace: libvirt cannot move the cover into a private /dev.
                conf.append("namespaces = [ ]")
                libvirtd = hide_kvm(libvirtd, Path(log.name).parent)
            if conf:
                QEMU_CONF.write_text(CONF_HEADER + "\n".join(conf) + "\n")
                wrote_conf = True
        for cmd in (["virtlogd"], libvirtd):
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=log,
                                          preexec_fn=harness.dies_with_us(signal.SIGTERM)))
        deadline = time.time() + 30
        while subprocess.run(["virsh", "-c", URI, "version"], capture_output=True).returncode != 0:
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                raise AssertionError("libvirtd did not come up: " + Path(log.name).read_text()[-3000:])
            time.sleep(0.2)
        yield
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if wrote_conf:
            QEMU_CONF.unlink()
        # libvirt's partition (/machine in each hierarchy) outlives its domains.
        for g in set(Path("/sys/fs/cgroup").glob("*/machine")) - partitions:
            with contextlib.suppress(OSError):
                g.rmdir()
        for p in made:
            shutil.rmtree(p, ignore_errors=True)


def wait_for(pred, timeout, what):
    return harness.wait_until(pred, f"waiting for {what}", timeout, step=0.05)


def vm_named(d, name):
    return next((v for v in (d.status() or {}).get("vms", []) if v.get("name") == name), None)


def libvirt_groups(name):
    """libvirt's cgroups of domain `name`, in every v1 hierarchy and in v2."""
    found = []
    for top in Path("/sys/fs/cgroup").iterdir():
        for base in (top / "machine", top / "machine.slice"):
            if base.is_dir():
                found += [str(g) for g in base.iterdir() if name in g.name]
    return found


def own_groups(pid):
    """The daemon's groups for QEMU `pid` (cosched-io-PID, cosched-membw-PID...)."""
    return [str(g) for g in Path("/sys/fs/cgroup").glob(f"**/cosched-*-{pid}")]


class Libvirt(unittest.TestCase):

    def test_domains_are_coordinated_and_leave_nothing_behind(self):
        """A domain with the org.cosched.0 channel: the daemon finds it behind the socket libvirt
        made, its agent registers, its vCPU is boosted (real time) while cyclictest runs in it
        beside two host CPU hogs, and `virsh destroy` leaves no VM in the daemon, no record, no
        group of ours or libvirt's. A domain without the channel: found through libvirt's state
        (`discover_libvirt`: its /run/libvirt/qemu/NAME.pid) and given its [vm.NAME] static tuning (FIFO vCPU);
        `virsh destroy` leaves nothing either."""
        harness.need_root(self)
        with tempfile.TemporaryDirectory(prefix="cosched-libvirt-") as tmp:
            tmp = Path(tmp)
            os.chmod(tmp, 0o755)  # libvirt's QEMU runs as libvirt-qemu and reads the kernel from here
            d = None
            with open(tmp / "libvirtd.log", "w") as log, libvirtd(log):
                try:
                    (tmp / "d").mkdir()
                    d = harness.Daemon(tmp / "d", f"""discover_libvirt = true
rescan_ms = 200
[vm.{WITHOUT_CHANNEL}.static]
fifo = true
""", args=["-v"])
                    self.with_channel(tmp, d)
                    self.without_channel(tmp, d)
                finally:
                    for name in (WITH_CHANNEL, WITHOUT_CHANNEL):
                        virsh("destroy", name, check=False)
                        virsh("undefine", name, check=False)
                    if d:
                        d.stop()

    def boot(self, tmp, name, workload, sock=None):
        """Defines domain `name` with `workload` (and the agent) and starts it with virsh."""
        wl = tmp / f"{name}.sh"
        wl.write_text(workload)
        out = subprocess.run([str(harness.RUN_SH), "--workload", str(wl), "--add", f"{harness.guest_cosched()}:/bin/cosched",
                              "--initrd-out", str(tmp / f"{name}.initrd")],
                             capture_output=True, text=True, check=True).stdout
        info = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        kernel = tmp / "vmlinux"  # a copy: libvirt relabels (chowns) the files a domain boots
        if not kernel.exists():
            shutil.copy(info["kernel"], kernel)
        console = tmp / f"{name}.console"
        xml = tmp / f"{name}.xml"
        xml.write_text(domain_xml(name, kernel, info["initrd"], info["append"], info["accel"], console, sock))
        virsh("define", str(xml))
        virsh("start", name)
        return console

    def with_channel(self, tmp, d):
        sock = d.socket_dir / f"{WITH_CHANNEL}.sock"
        console = self.boot(tmp, WITH_CHANNEL, WORKLOAD, sock=sock)
        text = lambda: console.read_text(errors="replace") if console.exists() else ""  # noqa: E731
        wait_for(lambda: "COSCHED-LVT: REGISTERED" in text(), 120, "the agent to register:\n" + text())
        vm = wait_for(lambda: vm_named(d, WITH_CHANNEL), 5, "the daemon to list the domain")
        pid = vm["pid"]
        vcpus = [t for t, comm in harness.qemu_threads(pid) if harness.is_vcpu(comm)]
        self.assertTrue(vcpus, harness.qemu_threads(pid))
        seen = set()
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                for t in vcpus:
                    with contextlib.suppress(OSError):
                        seen.add(harness.policy(t))
                time.sleep(0.001)
        sampler = threading.Thread(target=sample)
        with harness.host_hogs(2):
            sampler.start()
            try:
                wait_for(lambda: "COSCHED-LVT: CPU-DONE" in text(), 120, "cyclictest in the guest:\n" + text()[-3000:])
            finally:
                stop.set()
                sampler.join()
        vm = vm_named(d, WITH_CHANNEL)
        log = (d.dir / "daemon.log").read_text()
        summary = [line for line in text().splitlines() if "Max:" in line]
        cpu = vm["resources"]["cpu"]["counters"]
        print(f"\n  {WITH_CHANNEL}: qemu pid {pid}, registered {vm['registered']}, cpu counters {cpu}, "
              f"vCPU policies seen {sorted(seen)}; cyclictest beside 2 host hogs: {summary}", file=sys.stderr)
        self.assertTrue(vm["registered"], vm)
        self.assertGreaterEqual(cpu["boosts"], 1, vm)
        self.assertTrue(seen & {os.SCHED_FIFO, os.SCHED_RR}, f"the vCPU never ran real-time: {seen}\n{log[-3000:]}")
        self.assertNotIn("sched_setattr", log, "no boost refused")
        # The socket libvirt binds before its QEMU runs is waited for quietly.
        self.assertNotIn(f"warning: {sock}", log)
        self.destroyed(d, WITH_CHANNEL, pid)
        self.assertFalse(sock.exists(), "libvirt removed its socket")

    def without_channel(self, tmp, d):
        console = self.boot(tmp, WITHOUT_CHANNEL, PLAIN_WORKLOAD)
        wait_for(lambda: console.exists() and "COSCHED-LVT: UP" in console.read_text(errors="replace"), 120,
                 "the plain domain to boot")
        vm = wait_for(lambda: vm_named(d, WITHOUT_CHANNEL), 5, "the daemon to find the plain domain's QEMU")
        pid = vm["pid"]
        self.assertFalse(vm["registered"], vm)
        vcpus = [t for t, comm in harness.qemu_threads(pid) if harness.is_vcpu(comm)]
        wait_for(lambda: all(harness.policy(t) == os.SCHED_FIFO for t in vcpus), 5,
                 "the static tuning (FIFO vCPUs) of the plain domain")
        # The vCPUs at the default vcpu_priority (97), the others at SCHED_FIFO other_priority (98).
        prio = {t: os.sched_getparam(t).sched_priority for t, _ in harness.qemu_threads(pid)}
        others = [t for t in prio if t not in vcpus]
        self.assertTrue(others and all(harness.policy(t) == os.SCHED_FIFO for t in others), prio)
        self.assertEqual(({prio[t] for t in vcpus}, {prio[t] for t in others}), ({97}, {98}), prio)
        print(f"  {WITHOUT_CHANNEL}: qemu pid {pid} found without a channel; static FIFO priorities {prio} "
              f"(vCPUs {vcpus})", file=sys.stderr)
        self.destroyed(d, WITHOUT_CHANNEL, pid)

    def destroyed(self, d, name, pid):
        """`virsh destroy`: QEMU gone, the daemon forgets the VM and keeps no record of it, and
        neither it nor libvirt leaves a group."""
        virsh("destroy", name)
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), 10, "QEMU to exit")
        wait_for(lambda: vm_named(d, name) is None, 5, f"the daemon to forget {name}")
        state = d.dir / "state"
        records = [p.name for p in state.iterdir()] if state.is_dir() else []
        self.assertFalse([r for r in records if str(pid) in r or name in r], records)
        self.assertEqual(libvirt_groups(name), [])
        self.assertEqual(own_groups(pid), [])
        virsh("undefine", name)


if __name__ == "__main__":
    unittest.main()
