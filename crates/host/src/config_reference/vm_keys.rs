//! The keys of one VM's tables: `[vm.NAME]` and `[vm.NAME.static]`.

use super::keys::{key, table};
use super::Range::{Bool, Int, Rule};
use super::Table;

pub(super) fn vm() -> Table {
    table(
        "vm.NAME",
        "one VM's settings",
        "Settings of the VM named `NAME`: its socket's file name without `.sock`, its libvirt domain, or \
                QEMU's `-name`. A table for a VM that is not running does nothing until it appears.",
        vec![
            key(
                "enabled",
                "",
                Bool,
                "Coordination of this VM on or off, every resource (`[vm.NAME.resources]` sets one).",
                "To leave one VM alone. At run time: `cosched vm disable NAME`.",
            )
            .unset("on, as the host's switches say", "false"),
            key(
                "priority",
                "",
                Int { min: 1, max: Some(98) },
                "The real-time priority of this VM's threads while boosted: a VM at a higher priority runs \
                 before one at a lower priority when both are boosted.",
                "To rank VMs. At run time: `cosched vm priority NAME P`.",
            )
            .unset("`[policy] default_priority`", "5"),
            key(
                "rt_ceiling",
                "",
                Int { min: 1, max: Some(98) },
                "This VM's `[rt] rt_ceiling`: the highest host priority its guest's priorities map to.",
                "To trust one real-time guest more or less than the others. At run time: `cosched vm ceiling`.",
            )
            .unset("`[rt] rt_ceiling`", "30"),
            key(
                "membw_share",
                "‰",
                Int { min: 0, max: Some(1000) },
                "This VM's guaranteed share of `[membw] guaranteed_mbps`. The shares named in the file must add \
                 up to at most 1000. A guest's own request replaces it while it stands.",
                "To guarantee this VM memory bandwidth. At run time: `cosched vm membw NAME SHARE`.",
            )
            .unset("`[membw] default_share_permille`", "300"),
        ],
    )
}

pub(super) fn statics() -> Table {
    table(
        "vm.NAME.static",
        "one VM's static real-time tunings",
        "Tunings that hold for as long as the VM runs, whatever its guest asks: real-time priorities and CPUs \
                of its own. They are applied when the VM is found and undone exactly when it exits, when the \
                daemon stops, and after a crash (`cosched restore`). At run time: `cosched vm static NAME`.",
        vec![
            key(
                "fifo",
                "",
                Bool,
                "Every thread of the VM at `SCHED_FIFO`: its vCPUs at `vcpu_priority`, its other threads at \
                 `other_priority`. A boost on top changes nothing; the kernel's real-time throttling bounds a \
                 busy VM unless `guard` is on.",
                "For a real-time VM that must win over the host's tasks all the time, at the cost of the CPU \
                 time it leaves unused.",
            ),
            key(
                "vcpu_priority",
                "",
                Rule("1 to 99; with `fifo = true`, below `daemon_priority`"),
                "The vCPU threads' `SCHED_FIFO` priority.",
                "Rarely.",
            ),
            key(
                "other_priority",
                "",
                Rule("1 to 99; with `fifo = true`, below `daemon_priority`"),
                "The other threads' (main loop, I/O threads) `SCHED_FIFO` priority: above the vCPUs by default, \
                 so that the thread that delivers their interrupts is not held off by them.",
                "Rarely.",
            ),
            key(
                "shield",
                "",
                Rule("a CPU list: `\"1\"`, `\"2-3\"`; no CPU in two VMs' shields"),
                "Host CPUs of the VM's vCPU threads alone: the vCPUs are placed there, and the VM's other \
                 threads, the IRQs and `[shield] host_groups` leave them.",
                "For a real-time VM whose vCPUs must never share a CPU.",
            )
            .unset("no shield", "\"1\""),
            key(
                "guard",
                "",
                Bool,
                "The real-time guard on the FIFO vCPUs (`[policy] rt_guard_*`): at `SCHED_FIFO` for at most that \
                 share of every window, at `[boost] guard_nice` for the rest, so that the kernel's real-time \
                 throttling never stops the VM. Needs `[policy] rt_guard_max_share_permille` above 0.",
                "With `fifo = true` on a VM that may be busy for long: it trades the throttle's long stops for \
                 short, frequent demotions.",
            ),
        ],
    )
}
