//! Event boosting (FEAS) sees the packets queued to a VM's tap device although its main loop is
//! never woken for them (a bulk transfer keeps it busy): a fake QEMU holds a real tap in a
//! network namespace of its own, its vCPU spins beside a CPU hog (so it waits about half the
//! time), and frames sent to the tap make the daemon count tap packets and boost the vCPU. Part
//! of `root.rs`.

use super::*;

const TAP: &str = "cosfeasnet0";

/// `struct ifreq` with a name.
fn ifreq(name: &str) -> [u8; 40] {
    let mut r = [0u8; 40];
    r[..name.len()].copy_from_slice(name.as_bytes());
    r
}

/// Sends `n` Ethernet frames, `every` apart, out of tap `name` in the network namespace of
/// process `pid` (as the host's stack sends a guest its packets), from a thread that joins that
/// namespace (a thread's `setns` moves only itself). Returns how many were sent.
fn send_frames(pid: i32, name: &str, n: usize, every: Duration) -> usize {
    let (pid, name) = (pid, name.to_string());
    std::thread::spawn(move || {
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).expect("the VM's netns");
        // SAFETY: plain system calls on buffers owned here; every result is checked.
        unsafe {
            assert_eq!(
                libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET),
                0,
                "setns: {}",
                std::io::Error::last_os_error()
            );
            let packet = libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0);
            assert!(packet >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
            let mut r = ifreq(&name);
            assert_eq!(libc::ioctl(packet, libc::SIOCGIFINDEX, r.as_mut_ptr()), 0, "no {name} in the VM's netns");
            let mut ll: libc::sockaddr_ll = std::mem::zeroed();
            ll.sll_family = libc::AF_PACKET as u16;
            ll.sll_ifindex = i32::from_ne_bytes([r[16], r[17], r[18], r[19]]);
            let rc = libc::bind(
                packet,
                (&ll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
            let mut frame = [0u8; 60];
            frame[..6].copy_from_slice(&[0x52, 0x54, 0, 0x12, 0x34, 0x56]);
            frame[6..12].copy_from_slice(&[0x52, 0x54, 0, 0xab, 0xcd, 0xef]);
            frame[12..14].copy_from_slice(&[0x88, 0xb5]); // local experimental EtherType
            let mut sent = 0;
            for _ in 0..n {
                if libc::send(packet, frame.as_ptr().cast(), frame.len(), 0) == frame.len() as isize {
                    sent += 1;
                }
                std::thread::sleep(every);
            }
            libc::close(packet);
            sent
        }
    })
    .join()
    .unwrap()
}

#[test]
fn packets_queued_to_a_vms_tap_boost_its_waiting_vcpu() {
    if !have_root() {
        return;
    }
    if !Path::new("/dev/net/tun").exists() {
        panic!("/dev/net/tun is missing: this test needs tap devices");
    }
    let _heavy = cpu_heavy();
    let w = World::new();
    let d = w.daemon(FEAS_CONFIG);
    let exe = w.fake_qemu("tapvm", "qemu-system-x86_64");
    let args: Vec<String> = ["--busy", "CPU 0/TCG", "--tap", TAP].iter().map(|s| s.to_string()).collect();
    let vm = w.vm_args(&exe, "tapvm", &args, &["CPU 0/TCG"], None);
    d.wait_vm("tapvm");
    let vcpu = vm.tid("CPU 0/TCG");
    sched::set_affinity(vcpu, &[1]).unwrap();
    let _hogs = rundelay_hog(1);
    sched::set_affinity(0, &[0]).unwrap();
    let net = |d: &Daemon| d.status()["event"]["counters"]["net_packets"].as_u64().unwrap_or(0);
    let boosts =
        |d: &Daemon| d.vm_status("tapvm").unwrap()["resources"]["event"]["counters"]["boosts"].as_u64().unwrap_or(0);
    // The daemon finds the tap when it starts watching the VM: wait until a frame counts.
    let deadline = Instant::now() + Duration::from_secs(10);
    let start = net(&d);
    while net(&d) == start {
        assert!(
            Instant::now() < deadline,
            "no tap packet counted in 10 s; detection {}; VM {}",
            d.status()["event"],
            d.vm_status("tapvm").unwrap()["resources"]["event"]
        );
        send_frames(vm.pid, TAP, 1, Duration::from_millis(50));
    }
    let (n0, b0) = (net(&d), boosts(&d));
    // 600 frames 3.3 ms apart: 2 s when the sleeps are on time, longer on a loaded host, so the
    // bound below is taken from the time the frames really took.
    let t0 = Instant::now();
    let sent = send_frames(vm.pid, TAP, 600, Duration::from_micros(3333));
    let run = t0.elapsed();
    // The daemon's counters as they settle (the last messages in flight).
    std::thread::sleep(Duration::from_millis(100));
    let (n1, b1) = (net(&d), boosts(&d));
    let st = d.status();
    eprintln!(
        "{sent} frames to the tap in {run:?}: {} tap packets, {} boosts; detection {}; VM {}",
        n1 - n0,
        b1 - b0,
        st["event"]["counters"],
        d.vm_status("tapvm").unwrap()["resources"]["event"]["counters"]
    );
    assert!(n1 - n0 >= sent as u64, "{sent} frames sent, {} tap packets counted: {}", n1 - n0, st["event"]);
    // A vCPU waiting about half the time, a frame every 3.3 ms, one boost per 10 ms cycle.
    assert!(b1 - b0 >= 30, "{} boosts from {sent} frames in {run:?}: {}", b1 - b0, st["event"]);
    assert!(
        b1 - b0 <= run.as_millis() as u64 / 10 + 20,
        "{} boosts in {run:?}: more than one per 10 ms cycle",
        b1 - b0
    );
    drop(vm);
    // Its tap and namespace went with it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while d.vm_status("tapvm").is_some() {
        assert!(Instant::now() < deadline, "the daemon still lists the VM 10 s after it exited");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One CPU hog on `cpu`, killed when dropped.
fn rundelay_hog(cpu: usize) -> impl Drop {
    struct Hog(Child);
    impl Drop for Hog {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    Hog(Command::new("taskset").args(["-c", &cpu.to_string(), "sh", "-c", "while :; do :; done"]).spawn().unwrap())
}
