//! The keys of each resource's own table: `[io]`, `[event]`, `[rt]`, `[shield]`, `[membw]`.

use super::keys::{key, table, PATH};
use super::Range::{Bool, Choice, Int, Rule};
use super::Table;
use crate::config::HostConfig;

pub(super) fn io() -> Table {
    table(
        "io",
        "I/O coordination",
        "How the host raises a VM whose guest asks for I/O priority (the guest's BFQ has weight-raised \
                queues, for an application that is starting). The host's disk under the VM's images must run \
                BFQ; `cosched status` shows each disk's scheduler and the daemon warns with the fix.",
        vec![
            key(
                "lever",
                "",
                Choice(&["ioprio", "weight"]),
                "`ioprio`: the VM's I/O threads (main loop, `IO` threads, workers) go to the real-time I/O class. \
                 `weight`: the VM gets a raised BFQ weight through a cgroup (cgroup v1 `blkio`: its I/O threads \
                 move into a group of the daemon's; v2: the `io.bfq.weight` of the VM's own group, which the VM \
                 must have to itself).",
                "Keep `ioprio` (it won the `io-startup` experiment, docs/evaluation.md). While a VM is raised \
                 with it, the host's other I/O on that disk waits; the I/O budgets (`[policy.resource.io]`) bound \
                 how long. `weight` only shifts shares.",
            ),
            key(
                "ioprio_level",
                "",
                Int { min: 0, max: Some(7) },
                "`lever = \"ioprio\"`: the level within the real-time I/O class (0 is served first).",
                "To rank raised VMs below other real-time I/O on the host.",
            ),
            key(
                "weight",
                "",
                Int { min: 1, max: Some(1000) },
                "`lever = \"weight\"`: the BFQ weight of a raised VM's group (a group's default is 100).",
                "Only with `lever = \"weight\"`.",
            ),
        ],
    )
}

pub(super) fn event() -> Table {
    table(
        "event",
        "event boosting, for guests without an agent",
        "When a device wakes a VM's main loop or I/O thread (a packet on its tap, a disk completion) while \
                one of its vCPUs is runnable but waiting behind other threads, the host boosts the vCPUs for a \
                short slice on its own, with no agent in the guest. Needs host BPF (`raw_tracepoint`, Linux 5.5 \
                or later with BTF); without it the daemon says why and runs without.",
        vec![
            key(
                "vms",
                "",
                Choice(&["no-agent", "all", "none"]),
                "Which VMs get event boosting: `no-agent`, those whose guest runs no registered agent; `all`, \
                 every VM (not while an agent's CPU boost holds it); `none`, no VM.",
                "`none` to turn event boosting off. Agentless VMs without a socket need `discover_processes` or \
                 `discover_libvirt` to be found at all.",
            ),
            key(
                "n_limit",
                "boosts per cycle",
                Int { min: 1, max: None },
                "Event boosts per VM per counting cycle; later events wait for the next cycle.",
                "Rarely.",
            ),
            key("cycle_ms", "ms", Int { min: 1, max: None }, "The counting cycle of `n_limit`.", "Rarely."),
            key(
                "slice_us",
                "µs",
                Rule("at least 100, at most one cycle (`cycle_ms` × 1000)"),
                "The longest event boost: a boosted vCPU runs `SCHED_RR` until it has run `run_us` (or, with \
                 `run_us = 0`, until it blocks) or the slice ends. Slices end on the daemon's timer (a timerfd; \
                 where none can be made, epoll's 1 ms resolution).",
                "Rarely.",
            ),
            key(
                "charge",
                "",
                Bool,
                "Pay the boosted CPU time back: after a boost the VM's vCPUs are held at `repay_nice` until \
                 they have missed as much CPU time as they got, and a VM still paying back is not boosted. So boosting \
                 does not change CPU shares.",
                "Off only if the VMs' CPU shares need not stay fair: every boost is then a gift.",
            ),
            key(
                "run_us",
                "µs",
                Rule("0, or at least 50 (above `slice_us`, the slice ends a boost first)"),
                "A boost ends once the VM's vCPUs have run this long since it started: the woken vCPU had its \
                 turn, and the boost costs (and is paid back for) what it used. A vCPU that blocks before that \
                 (on a lock of its own VM's, while it handles the event) stays boosted. 0: a boost lasts until a \
                 vCPU blocks or the slice ends.",
                "Raise it if a guest needs longer than this to handle one event (its answers then come late); \
                 lower it to make each boost cheaper.",
            ),
            key(
                "boost_running",
                "",
                Bool,
                "With `run_us` set: an event that finds a vCPU of the VM running (none waiting) boosts it \
                 too, so it is not preempted before it has handled the event. Off: only a waiting vCPU is \
                 boosted, and an event that finds none waiting fires if a vCPU is preempted within a cycle.",
                "On to cut the latency of VMs that are busy when their events come (measured: a busy VM's \
                 ping average 1843 -> 648 µs beside 3 busy VMs); it costs a lightly loaded VM that streams \
                 (a download), which is then boosted on its packets and pays that back (measured: less than \
                 half the download speed beside 3 busy VMs). See docs/evaluation.md.",
            ),
            key(
                "repay_nice",
                "nice",
                Int { min: 1, max: Some(19) },
                "The nice level a VM's vCPUs are held at while they pay a boost back (with `charge`). 19 pays \
                 fastest and holds hardest; a milder level pays over more cycles, and an event arriving \
                 meanwhile waits for less. The default, 10, measured fair (every VM within ±5% of an equal \
                 share) with a lower ping latency than 19, which overcharged a pinged VM on a noisy host.",
                "See the trade-off measured in docs/evaluation.md (event boosting).",
            ),
            key(
                "run_delay",
                "",
                Bool,
                "Measure how long each VM's vCPU threads wait runnable before they run, per level \
                 (`cosched_vcpu_run_delay_seconds`, `cosched status`), with this table's host BPF. It is \
                 loaded unless `vms = \"none\"`, and measures every VM, boosted by events or not.",
                "Off to save its cost (a map update per vCPU switch in) on a host that switches vCPUs very often.",
            ),
        ],
    )
}

pub(super) fn rt() -> Table {
    let ceiling = HostConfig::default().rt().ceiling();
    table(
        "rt",
        "the guest's real-time priorities, and predictive boost",
        "A guest agent names in each CPU request the highest real-time priority it must run, and, ahead of \
                time, when its next real-time task wakes (`WAKE`). This table says how the host uses both.",
        vec![
            key(
                "priority_map",
                "",
                Choice(&["vm", "same", "linear"]),
                "How a guest's real-time priority becomes the host's: `same`, the guest's own, capped at the \
                 ceiling; `linear`, 1..99 scaled onto 1..ceiling (keeps the guest's order); `vm`, ignored (the \
                 VM's own priority and `[boost]` class). Never below the VM's own priority. The vCPUs then run \
                 `SCHED_FIFO` at it.",
                "`vm` to boost every VM at its own priority whatever its guest runs.",
            ),
            key(
                "rt_ceiling",
                "",
                Int { min: 1, max: Some(98) },
                "The highest host priority a guest's priority maps to, unless the VM has its own (`[vm.NAME] \
                 rt_ceiling`, `cosched vm ceiling`). With `other_threads_priority_offset` it must stay below \
                 `daemon_priority`.",
                "Raise it for a trusted real-time guest that must preempt the kernel's interrupt threads; keep \
                 it low for guests you do not control.",
            )
            .unset(
                format!(
                    "{ceiling}, below the kernel's threaded interrupt handlers (`SCHED_FIFO` 50), so that a guest \
                     cannot hold off the host's interrupts; lower if `daemon_priority` is lower"
                ),
                "40",
            ),
            key(
                "predict",
                "",
                Bool,
                "Honour `WAKE`: boost a VM just before its guest's predicted real-time wake-up. Off: every `WAKE` \
                 gets `DENY(cpu: unsupported)`, and the agent stops sending them until it registers again.",
                "Off to rule predictive boost out, or where unconfirmed predicted boosts cost the host too much.",
            ),
            key(
                "predict_lead_min_us",
                "µs",
                Rule("at most `predict_lead_max_us`"),
                "The least time a predicted boost starts before the predicted wake-up. It must cover the `WAKE` \
                 frame's own transit; the lead grows from it by how early guests were seen to wake.",
                "Raise it where the host's wake-ups are slow.",
            ),
            key(
                "predict_lead_max_us",
                "µs",
                Rule("at least `predict_lead_min_us`"),
                "The most time a predicted boost starts before the predicted wake-up, however early guests wake.",
                "Rarely.",
            ),
            key(
                "predict_hold_us",
                "µs",
                Rule("at most `predict_hold_max_us`"),
                "A predicted boost that the guest does not confirm (with its `CPU 1`) this long after the \
                 predicted wake-up ends by itself and counts as unconfirmed. The hold grows from it to how late \
                 confirmations came in the last 10 s (their 99th percentile), and comes back down when \
                 they are on time again. A standing prediction's hold is at most half its period less the \
                 lead; a period shorter than twice the lead plus this least hold is refused.",
                "Rarely.",
            ),
            key(
                "predict_hold_max_us",
                "µs",
                Rule("at least `predict_hold_us`"),
                "The longest hold of an unconfirmed predicted boost.",
                "Rarely.",
            ),
            key(
                "predict_max_delay_ms",
                "ms",
                Int { min: 1, max: Some(4_294_967) },
                "A `WAKE` further ahead than this is refused (`DENY(cpu: budget)`).",
                "Rarely.",
            ),
            key(
                "predict_max_share_permille",
                "‰",
                Int { min: 1, max: Some(1000) },
                "Unconfirmed predicted boost time a VM may hold per CPU budget window (`budget_window_ms`); a \
                 `WAKE` that would go past it is refused (`DENY(cpu: budget)`).",
                "Lower it if guests predict wake-ups that do not come.",
            ),
        ],
    )
}

pub(super) fn shield() -> Table {
    table(
        "shield",
        "CPU shielding, the host's side",
        "What the host gives up while a VM's vCPUs have CPUs of their own (`[vm.NAME.static] shield`).",
        vec![
            key(
                "housekeeping_cpus",
                "",
                Rule("a CPU list: `\"1\"`, `\"2-3\"`, `\"0,4-5\"`"),
                "The CPUs everything that leaves a shield goes to: the shielded VMs' other threads, the \
                 `host_groups`, the IRQs.",
                "To keep the host's own work on chosen CPUs while VMs are shielded.",
            )
            .unset("every CPU of the host that no VM is shielded on", "\"0\""),
            key(
                "host_groups",
                "",
                Rule("a list of cpuset groups, e.g. `[\"/system.slice\", \"/user.slice\"]`"),
                "cpuset groups (v1: under `<cgroup_root>/cpuset`, v2: under `<cgroup_root>`) whose CPUs are \
                 narrowed to the housekeeping CPUs while any VM is shielded, as systemd's `AllowedCPUs=` would. \
                 Empty: no host task is moved.",
                "To move the host's services off the shielded CPUs too.",
            ),
            key(
                "irqs",
                "",
                Bool,
                "Move every IRQ's affinity off the shielded CPUs (new IRQs too, every `rescan_ms`). An IRQ whose \
                 affinity the kernel fixes is reported in `cosched status`.",
                "Off where `/proc/irq` is read-only (an unprivileged container) or IRQs are placed by another \
                 tool.",
            ),
            key("irq_dir", "", PATH, "Where the IRQ affinities are.", "Never on a real host (tests give a fake tree)."),
        ],
    )
}

pub(super) fn membw() -> Table {
    table(
        "membw",
        "memory-bandwidth regulation",
        "Each VM may move its share of the host's guaranteed memory bandwidth per period; a VM past its \
                budget is held back until the period ends. Shares come from `[vm.NAME] membw_share`, `cosched vm \
                membw` and the guests' own requests (`cosched request-membw` in the guest). Nothing runs until \
                `guaranteed_mbps` is declared and a backend is found; `cosched status` says which, or why none.",
        vec![
            key(
                "backend",
                "",
                Choice(&["auto", "pmu", "simulated", "off"]),
                "Where the VMs' memory traffic is counted. `auto` and `pmu`: the vCPU threads' last-level cache \
                 misses through `perf_event_open` (× `bytes_per_miss`), or unsupported with every reason. \
                 `simulated`: replayed from `trace`, for tests and demos only (`cosched status` says SIMULATED). \
                 `off`: no regulation.",
                "`off` to turn regulation off for good; `simulated` never on a production host.",
            ),
            key(
                "throttle",
                "",
                Choice(&["auto", "mba", "freezer"]),
                "What holds back a VM past its budget: `mba`, resctrl memory-bandwidth allocation, which slows \
                 the vCPUs' memory traffic; `freezer`, the cgroup freezer, which stops the vCPUs; `auto`, MBA \
                 where `resctrl_root` has it and the counters are real, else the freezer.",
                "`freezer` if MBA's floor lets a VM past its budget move too much.",
            ),
            key(
                "freezer",
                "",
                Choice(&["auto", "v1", "v2"]),
                "Which cgroup freezer: `v1`, the vCPU threads move into a frozen group of the daemon's; `v2`, \
                 `cgroup.freeze` of the VM's own group, which stops every thread of the VM and must be the VM's \
                 alone; `auto`, v1 where its freezer is mounted, else v2.",
                "`v2` on a host whose VMs each have a group of their own (libvirt's `machine-*.scope`).",
            ),
            key(
                "guaranteed_mbps",
                "MB/s",
                Int { min: 0, max: None },
                "The host's guaranteed memory bandwidth: what its memory system delivers even under full \
                 contention. The VMs' shares divide it. 0: not declared, and no backend runs.",
                "Declare it, measured on this host, to turn regulation on.",
            ),
            key(
                "period_ms",
                "ms",
                Int { min: 1, max: Some(10000) },
                "The regulation period: budgets are per period, and a VM past its budget is held back until the \
                 period ends. `cosched membw --period-ms` changes it at run time.",
                "Shorter periods hold a VM back for less time each, at more cost.",
            ),
            key(
                "checks_per_period",
                "",
                Int { min: 1, max: Some(100) },
                "How many times per period the counters are read. A VM moves up to one check's worth past its \
                 budget before it is held back.",
                "Raise it for tighter budgets, at more cost.",
            ),
            key(
                "reclaim",
                "",
                Bool,
                "Lend what a VM did not use in the last period, and the bandwidth no share holds, to VMs past \
                 their budget; a lender that needs it takes it back at once.",
                "Set it to false for strict budgets. At run time: `cosched membw --reclaim true|false`.",
            ),
            key(
                "best_effort",
                "",
                Bool,
                "Once the VMs together have used the guaranteed bandwidth of a period, let every VM run until \
                 it ends.",
                "Set it to false for strict budgets. At run time: `cosched membw --best-effort true|false`.",
            ),
            key(
                "default_share_permille",
                "‰",
                Int { min: 0, max: Some(1000) },
                "The share of a VM with no `[vm.NAME] membw_share`.",
                "To give every VM a guarantee without naming each.",
            ),
            key(
                "trace",
                "",
                PATH,
                "`backend = \"simulated\"`: the trace it replays, lines of `<t_ms> <vm name or *> <MB/s per \
                 second of vCPU run time>`.",
                "Only for tests and demos.",
            )
            .unset("none (needed by `backend = \"simulated\"`)", "\"/etc/cosched/membw.trace\""),
            key(
                "bytes_per_miss",
                "bytes",
                Int { min: 1, max: None },
                "The PMU backend: bytes moved per last-level cache miss (the cache line).",
                "Only on a CPU whose cache line is not 64 bytes.",
            ),
        ],
    )
}
