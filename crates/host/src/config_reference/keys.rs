//! Every key of the host configuration: what it does and when to change it. Defaults are not
//! written here (they are read from the code's `Default`s); ranges are, and the tests hold them to
//! the code's checks.

use super::{resource_keys, vm_keys, Key, Range, Table};
use crate::config::HostConfig;

use Range::{Bool, Choice, Int, Rule};

/// A key named `name` in its table (its path is made by [`table`]).
pub(super) fn key(name: &str, unit: &'static str, range: Range, does: &str, change: &str) -> Key {
    Key { path: name.into(), unit, range, does: does.into(), change: change.into(), unset: None, example: None }
}

/// A table, its keys' paths made from its own.
pub(super) fn table(path: &'static str, title: &'static str, about: &'static str, mut keys: Vec<Key>) -> Table {
    if !path.is_empty() {
        for k in &mut keys {
            k.path = format!("{path}.{}", k.path);
        }
    }
    Table { path, title, about, keys }
}

impl Key {
    /// A key unset by default: what unset means, and a value to show.
    pub(super) fn unset(mut self, means: impl Into<String>, example: &'static str) -> Key {
        self.unset = Some(means.into());
        self.example = Some(example);
        self
    }
}

pub(super) const PATH: Range = Rule("a path");
const NEVER: &str = "Only on a host where it lives elsewhere.";

pub(super) fn tables() -> Vec<Table> {
    vec![
        top(),
        table(
            "resources",
            "each resource on or off at start",
            "One resource on or off when the daemon starts, whatever `enabled` says. The keys are resource \
                    names: `cpu` (CPU boosts the guest agent asks for), `io` (I/O priority), `membw` (memory \
                    bandwidth shares) and `event` (event boosting of guests without an agent).",
            vec![key(
                "RESOURCE",
                "",
                Bool,
                "Coordination of this resource on or off at start, for every VM.",
                "To run without one resource from the start, e.g. `io = false` on a host whose disks do not run \
                 BFQ. At run time `cosched enable RESOURCE` and `cosched disable RESOURCE` do the same.",
            )
            .unset("the value of `enabled`", "false")],
        ),
        policy(),
        table(
            "policy.resource.RESOURCE",
            "one resource's own budgets and rate limits",
            "The budget and rate keys of `[policy]`, for one resource only (`[policy.resource.cpu]`, \
                    `[policy.resource.io]`, ...). A key left out takes the `[policy]` value. A memory-bandwidth \
                    share is a standing grant, not a boost: the time budgets apply to `membw` only when its own \
                    table sets them.",
            [
                ("max_continuous_boost_ms", "ms", Int { min: 0, max: None }, "500"),
                ("max_boost_share_permille", "‰", Int { min: 1, max: Some(1000) }, "500"),
                ("budget_window_ms", "ms", Int { min: 1, max: None }, "10000"),
                ("budget_cooldown_ms", "ms", Int { min: 0, max: None }, "2000"),
                ("frame_rate", "requests/s", Int { min: 1, max: None }, "1000"),
                ("frame_burst", "requests", Int { min: 1, max: None }, "100"),
            ]
            .into_iter()
            .map(|(name, unit, range, example)| {
                key(
                    name,
                    unit,
                    range,
                    &format!("`[policy] {name}` for this resource only."),
                    "To bound one resource more tightly than the others, e.g. a shorter longest boost for `io`, \
                     whose real-time I/O class makes the host's other I/O on that disk wait.",
                )
                .unset(format!("`[policy] {name}`"), example)
            })
            .collect(),
        ),
        boost(),
        resource_keys::io(),
        resource_keys::event(),
        resource_keys::rt(),
        resource_keys::shield(),
        resource_keys::membw(),
        vm_keys::vm(),
        table(
            "vm.NAME.resources",
            "one resource on or off for one VM",
            "One resource on or off for this VM only; wins over its `enabled`.",
            vec![key(
                "RESOURCE",
                "",
                Bool,
                "Coordination of this resource on or off for this VM.",
                "To leave one resource of one VM alone, e.g. `io = false` for a VM whose disk shares a device \
                 with the host's own latency-sensitive I/O. At run time: `cosched vm disable NAME RESOURCE`.",
            )
            .unset("the VM's `enabled`, else the host's", "false")],
        ),
        vm_keys::statics(),
    ]
}

fn top() -> Table {
    table(
        "",
        "the daemon's paths, discovery and threads",
        "Where the daemon finds VMs and keeps its records, and how it follows the VMs' threads. These keys \
                come before any `[table]` in the file.",
        vec![
            key(
                "socket_dir",
                "",
                PATH,
                "Directory of the VMs' chardev sockets: every socket in it is one VM, named by its file name \
                 without `.sock` (QEMU: `-chardev socket,path=<dir>/<vm>.sock,server=on,wait=off`). The daemon \
                 creates it if it is missing and watches it with inotify. Only root should be able to create \
                 sockets there.",
                "When QEMU runs as another user and needs a directory it can write to (or `chown` this one to \
                 that user).",
            ),
            key(
                "state_dir",
                "",
                PATH,
                "Where the daemon records each thread's original settings before its first change, one file per \
                 QEMU process, until they are put back. `cosched restore` reads it after a crash. Keep it on a \
                 tmpfs such as `/run`: a record from before a reboot means nothing.",
                "Rarely. `cosched restore` (the unit's `ExecStopPost`) must read the same file to find it.",
            ),
            key(
                "control_socket",
                "",
                PATH,
                "The socket the operator commands (`cosched status`, `enable`, `disable`, `vm`, `metrics`, \
                 `membw`) talk to. The daemon answers only root and its own user (checked by the peer's \
                 credentials, whatever the socket's mode).",
                "Rarely. The commands find it through the same file (`cosched --config FILE ...`).",
            ),
            key(
                "metrics_listen",
                "",
                Rule("an IP address and port (`127.0.0.1:9477`, `[::1]:9477`)"),
                "Also serve the Prometheus metrics over HTTP at this address. The endpoint has no \
                 authentication.",
                "To scrape the metrics with Prometheus. Listen on localhost or a management network only.",
            )
            .unset("no HTTP endpoint (`cosched metrics` prints the same text)", "\"127.0.0.1:9477\""),
            key(
                "discover_processes",
                "",
                Bool,
                "Also adopt QEMU processes that have no socket in `socket_dir` (guests without an agent, libvirt \
                 domains without the channel), found every `rescan_ms` and named by QEMU's `-name`. They get \
                 event boosting and their `[vm.NAME.static]` tunings. Only QEMU binaries owned by root are \
                 adopted.",
                "To reach guests that run no agent and are not libvirt's. On a libvirt host prefer \
                 `discover_libvirt`, which takes libvirt's domains only.",
            ),
            key(
                "discover_libvirt",
                "",
                Bool,
                "Also adopt the domains libvirt runs, channel or not, from the `<domain>.pid` files libvirt \
                 keeps in `libvirt_dir`, every `rescan_ms`, named by the domain.",
                "On a libvirt host with domains that have no cosched channel (guests without an agent).",
            ),
            key("libvirt_dir", "", PATH, "libvirt's run directory for QEMU domains.", NEVER),
            key(
                "rescan_ms",
                "ms",
                Int { min: 1, max: None },
                "How often the daemon rescans `socket_dir` (inotify catches most socket changes at once), looks \
                 for adopted processes and domains, checks that its VMs still run, and moves new IRQs off \
                 shielded CPUs.",
                "Lower it to adopt agentless VMs sooner; raise it to spend less on hosts with very many \
                 processes.",
            ),
            key(
                "thread_refresh_ms",
                "ms",
                Int { min: 1, max: None },
                "Without thread events (below): how often a boosted VM's thread list is read again, to boost the \
                 threads that appeared, and how long a list is trusted before a change.",
                "Only where host BPF is refused (`cosched status` says how thread events are seen): lower it if \
                 new threads of boosted VMs must be boosted sooner.",
            ),
            key(
                "thread_events",
                "",
                Bool,
                "See the VMs' threads created, renamed and exiting as it happens (host BPF on the scheduler's \
                 thread tracepoints, filtered to the VMs' processes), so that a thread born while its VM is \
                 boosted is boosted at once. Where BPF is refused the daemon says why and reads thread lists \
                 every `thread_refresh_ms` instead.",
                "Turn it off only to rule host BPF out while looking for a problem.",
            ),
            key(
                "thread_verify_ms",
                "ms",
                Int { min: 0, max: None },
                "How long the daemon trusts what it knows of a VM's threads' scheduling attributes before a \
                 change reads them again. A change someone else made to a boosted thread is seen (and kept) at \
                 the next read; until then a deboost may put the recorded original over it.",
                "Lower it where other tools change QEMU threads' scheduling while they are boosted; each read \
                 costs system calls on the boost's path.",
            ),
            key(
                "enabled",
                "",
                Bool,
                "Coordination on or off at start, for every resource (`[resources]` sets one). With it off the \
                 daemon still finds VMs, answers commands and puts back what a crashed daemon left.",
                "To start with coordination off and turn it on later with `cosched enable`.",
            ),
            key(
                "daemon_priority",
                "",
                Int { min: 0, max: Some(99) },
                "The daemon runs at `SCHED_FIFO` with this priority, so that the VMs it boosts cannot delay their \
                 own deboost. It must be above every priority a VM's thread can be given (a VM's priority plus \
                 `other_threads_priority_offset`, the `[rt]` ceilings, static FIFO priorities). 0: the daemon \
                 runs at `SCHED_OTHER`.",
                "Lower it only if this priority is reserved on the host (a watchdog, say), keeping it above every \
                 VM. 0 is for tests: at `SCHED_OTHER` a loaded host delays the end of boosts.",
            ),
            key(
                "cgroup_root",
                "",
                PATH,
                "Where the cgroup hierarchies are mounted (v1 controllers at `<dir>/<controller>`, v2 at \
                 `<dir>`): the I/O `weight` lever, the memory-bandwidth freezer and CPU shielding make their \
                 groups there.",
                NEVER,
            ),
            key(
                "resctrl_root",
                "",
                PATH,
                "Where resctrl is mounted: memory-bandwidth allocation (MBA) is looked for there.",
                NEVER,
            ),
        ],
    )
}

fn policy() -> Table {
    let read_rate = HostConfig::default().policy.read_rate();
    table(
        "policy",
        "budgets and rate limits of every boost",
        "How long and how much of the time a VM may be boosted, how many requests it may send, and the CPU's \
                own rules (the real-time guard, the host reserve). The budget and rate keys apply to each \
                resource on its own; `[policy.resource.RESOURCE]` changes them for one.",
        vec![
            key(
                "default_priority",
                "",
                Int { min: 1, max: Some(98) },
                "The real-time priority of a VM's threads while boosted, unless the VM has its own (`[vm.NAME] \
                 priority`, `cosched vm priority`). A VM at a higher priority runs before one at a lower \
                 priority when both are boosted. 99 is left to the kernel's own threads and the daemon.",
                "Rarely: give the VMs that matter most a higher priority of their own instead.",
            ),
            key(
                "max_continuous_boost_ms",
                "ms",
                Int { min: 0, max: None },
                "The longest single boost. When it runs out the VM is put back to normal, its agent is told \
                 `DENY(budget)`, and its boosts are refused for `budget_cooldown_ms`. 0: no limit.",
                "Lower it to bound how long one VM may hold a CPU at real-time priority, e.g. `500` where the \
                 guests are interactive rather than real-time. The default lets a real-time guest stay boosted \
                 for long stretches.",
            ),
            key(
                "max_boost_share_permille",
                "‰",
                Int { min: 1, max: Some(1000) },
                "The largest share of any `budget_window_ms` a VM may spend boosted; past it, as above. 1000: no \
                 limit.",
                "Lower it to keep a larger part of the time for the host's own tasks when guests ask for boosts \
                 all the time.",
            ),
            key(
                "budget_window_ms",
                "ms",
                Int { min: 1, max: None },
                "The sliding window `max_boost_share_permille` is measured over.",
                "With `max_boost_share_permille`: a shorter window reacts sooner and allows shorter bursts.",
            ),
            key(
                "budget_cooldown_ms",
                "ms",
                Int { min: 0, max: None },
                "After a budget ran out, the VM's boosts of that resource are refused this long.",
                "Raise it to keep a VM that keeps exhausting its budget off for longer.",
            ),
            key(
                "rt_guard_max_share_permille",
                "‰",
                Int { min: 0, max: Some(1000) },
                "CPU: the real-time guard. A boosted VM's vCPU threads spend at most this share of every \
                 `rt_guard_window_ms` at a real-time class; for the rest of the window only the vCPU threads go \
                 to `SCHED_OTHER` at `[boost] guard_nice`, and its other threads stay real-time. So the kernel's \
                 real-time throttling (`/proc/sys/kernel/sched_rt_runtime_us`), which would stop every real-time \
                 thread on a CPU for the rest of its period, never fires. It also bounds static FIFO tunings with \
                 `guard = true`. 0: no guard. The allowance (window × share) must be above \
                 `rt_guard_hysteresis_ms`.",
                "Keep it below the kernel's `sched_rt_runtime_us / sched_rt_period_us`. 0 leaves busy real-time \
                 VMs to the kernel's throttle.",
            ),
            key(
                "rt_guard_window_ms",
                "ms",
                Rule("more than 0 while the guard is on"),
                "The window of the real-time guard.",
                "Rarely; a shorter window demotes a busy vCPU more often, for less time each.",
            ),
            key(
                "rt_guard_hysteresis_ms",
                "ms",
                Rule("below the guard's allowance, `rt_guard_window_ms` × `rt_guard_max_share_permille` / 1000"),
                "A vCPU the guard demoted goes back to real time once its real-time time in the window is this \
                 much below the allowance, so that it is not switched back and forth at every check.",
                "Rarely.",
            ),
            key(
                "host_reserve_cpus",
                "CPUs",
                Int { min: 0, max: None },
                "CPUs kept for the host: boosted VMs together hold at most (the host's CPUs − this) vCPUs; a boost \
                 past it is refused with `DENY(cpu: host_reserve)` until another VM lets go. Only vCPU threads \
                 count (a VM's main loop and I/O threads, also boosted, mostly wait).",
                "Raise it where the host's own services need more than one CPU under load. 0 lets boosted VMs \
                 take every CPU.",
            ),
            key(
                "max_boosted_vcpus",
                "vCPUs",
                Int { min: 0, max: None },
                "If above 0, the most vCPUs boosted at once, instead of (the host's CPUs − `host_reserve_cpus`).",
                "On hosts whose VMs have many mostly idle vCPUs, where counting CPUs would refuse too much.",
            ),
            key(
                "frame_rate",
                "requests/s",
                Int { min: 1, max: None },
                "Requests per second a VM may send for one resource (a token bucket); beyond it they are refused \
                 with `DENY(rate_limited)`. Requests that lower a VM's privilege (`CPU 0`, `DEREGISTER`) always \
                 pass. The guest agent sends at most one CPU transition per 500 µs: 2000 a second.",
                "Rarely. Lower it to refuse chattier guests sooner.",
            ),
            key(
                "frame_burst",
                "requests",
                Int { min: 1, max: None },
                "The token bucket's size: how many requests a VM may send at once above `frame_rate`.",
                "Rarely.",
            ),
            key(
                "malformed_rate",
                "frames/s",
                Int { min: 1, max: None },
                "Malformed frames a VM may send per second (with a burst of the same size) before the daemon \
                 deregisters it. Each gets `DENY(malformed)`.",
                "Rarely.",
            ),
            key(
                "read_rate",
                "frames/s",
                Int { min: 0, max: None },
                &format!(
                    "Frames per second the daemon reads from one VM's channel. What a VM sends beyond it waits in \
                     its channel (QEMU and then the guest's writes are held back; nothing is lost), so that a \
                     flooding guest cannot keep the daemon busy. 0: twice what a guest within every rate limit \
                     can send, {read_rate} with the other defaults."
                ),
                "Rarely. Lower it to bound what one flooding guest costs the daemon.",
            ),
        ],
    )
}

fn boost() -> Table {
    table(
        "boost",
        "how a boosted VM's threads are scheduled",
        "The scheduling class a CPU boost gives a VM's QEMU threads.",
        vec![
            key(
                "policy",
                "",
                Choice(&["rr", "fifo", "deadline", "nice"]),
                "`rr`: every thread of the VM `SCHED_RR` at the VM's priority. `fifo`: `SCHED_FIFO` instead. \
                 `deadline` (experimental): each vCPU thread gets a `SCHED_DEADLINE` reservation of \
                 `deadline_runtime_us` every `deadline_period_us`, the other threads `SCHED_FIFO`. `nice`: every \
                 thread `SCHED_OTHER` at `boost_nice`, no real-time class at all. A guest's own real-time \
                 priorities (`[rt]`) need `rr` or `fifo`.",
                "Keep `rr`. `deadline` is experimental: on some kernels a thread that leaves `SCHED_DEADLINE` \
                 while asleep never gives its bandwidth back, and after a few boosts no reservation is admitted \
                 until the host reboots; the daemon warns at start.",
            ),
            key(
                "other_threads_priority_offset",
                "priority levels",
                Int { min: 0, max: Some(10) },
                "A VM's threads other than its vCPUs (main loop, I/O threads, workers) run this many priority \
                 levels above its vCPUs while boosted.",
                "Set 1 when the main loop or an I/O thread must preempt the VM's own vCPUs (under TCG the main \
                 loop delivers the guest's timer interrupts).",
            ),
            key(
                "guard_nice",
                "nice",
                Int { min: -20, max: Some(19) },
                "The nice value of vCPU threads while the real-time guard holds them off the real-time class (at \
                 -20 a vCPU still gets nearly all of its CPU against threads at nice 0).",
                "Raise it to give the host's own tasks more of a guarded vCPU's CPU.",
            ),
            key(
                "deadline_runtime_us",
                "µs",
                Rule("at least 2 (the kernel's minimum runtime, 1024 ns), at most `deadline_period_us`"),
                "`policy = \"deadline\"`: each vCPU thread's runtime per period. With that policy it must also \
                 fit the kernel's admission limit (`sched_rt_runtime_us / sched_rt_period_us` of a CPU).",
                "Only with `policy = \"deadline\"`.",
            ),
            key(
                "deadline_period_us",
                "µs",
                Rule(
                    "with `policy = \"deadline\"`, within the kernel's \
                     `/proc/sys/kernel/sched_deadline_period_min_us` and `_max_us`",
                ),
                "`policy = \"deadline\"`: the period of each vCPU thread's reservation.",
                "Only with `policy = \"deadline\"`.",
            ),
            key(
                "boost_nice",
                "nice",
                Int { min: -20, max: Some(19) },
                "`policy = \"nice\"`: the nice value of every thread of a boosted VM.",
                "Only with `policy = \"nice\"`.",
            ),
        ],
    )
}
