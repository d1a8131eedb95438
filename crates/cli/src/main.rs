//! `cosched`: one binary for the host daemon, the guest agent and the operator commands.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};
use cosched_host::config::HostConfig;
use cosched_host::control::{request, Request};
use serde_json::Value;

#[derive(Parser, Debug)]
#[command(
    name = "cosched",
    version,
    about = "Coordinated host/guest scheduling for QEMU/KVM virtual machines",
    long_about = "Coordinated host/guest scheduling for QEMU/KVM virtual machines.\n\n\
        In the guest, `cosched guest` detects with eBPF when the guest runs work that must not \
        wait (real-time tasks, newly started tasks) and tells the host over the virtio-serial \
        port org.cosched.0. On the host, `cosched host` (root) connects to each VM's chardev \
        socket, boosts that VM's QEMU threads (SCHED_RR) for just as long, within budgets, and \
        puts back exactly what it changed. Guests without the agent get event boosting (FEAS, \
        config [event]): a vCPU waiting behind other threads when a device wakes its VM (a \
        packet, a disk completion) runs SCHED_RR for a short slice, at most once per 10 ms, and \
        pays that CPU time back.\n\n\
        QEMU needs: -name <vm>,debug-threads=on -device virtio-serial \
        -chardev socket,path=/run/cosched/vms/<vm>.sock,server=on,wait=off,id=cosched0 \
        -device virtserialport,chardev=cosched0,name=org.cosched.0"
)]
struct Cli {
    /// Host configuration (TOML): the daemon's settings, and where the operator commands find
    /// its control socket and state directory [default: /etc/cosched/host.toml if it exists]
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the host daemon (root): watch the socket directory, coordinate every VM found there
    Host(HostArgs),
    /// Run the guest agent (root, inside the VM)
    Guest(cosched_agent::Options),
    /// Show VMs, their threads, boost state and counters
    Status {
        /// Machine-readable output
        #[arg(long, conflicts_with = "watch")]
        json: bool,
        /// Live, like top: each VM per resource, redrawn every --interval-ms, with what changed
        /// since the last redraw (boosts/s, share of the time boosted, denials/s, memory MB/s).
        /// Ctrl-C ends it
        #[arg(long)]
        watch: bool,
        /// --watch: the redraw interval
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
        interval_ms: u64,
        /// --watch: stop after this many redraws (default: until Ctrl-C)
        #[arg(long, requires = "watch")]
        count: Option<u64>,
        /// [default: control_socket from the config, /run/cosched/control.sock]
        #[arg(long)]
        control_socket: Option<PathBuf>,
    },
    /// Turn coordination on for the whole host, for every resource or one (VMs told DISABLE get
    /// ENABLE)
    Enable {
        /// cpu, io, membw or event [default: every resource]
        resource: Option<String>,
        /// [default: control_socket from the config, /run/cosched/control.sock]
        #[arg(long)]
        control_socket: Option<PathBuf>,
    },
    /// Turn coordination off for the whole host, for every resource or one: every VM is deboosted
    /// on it and its agent told DISABLE
    Disable {
        /// cpu, io, membw or event [default: every resource]
        resource: Option<String>,
        /// [default: control_socket from the config, /run/cosched/control.sock]
        #[arg(long)]
        control_socket: Option<PathBuf>,
    },
    /// Per-VM operator settings
    Vm {
        #[command(subcommand)]
        cmd: VmCmd,
        /// [default: control_socket from the config, /run/cosched/control.sock]
        #[arg(long, global = true)]
        control_socket: Option<PathBuf>,
    },
    /// Print the daemon's metrics in the Prometheus text format
    Metrics {
        /// [default: control_socket from the config, /run/cosched/control.sock]
        #[arg(long)]
        control_socket: Option<PathBuf>,
    },
    /// Memory-bandwidth regulation for the whole host: the period, reclaim of unused budget and
    /// best effort (config [membw]; per VM: `cosched vm membw`). Without options, shows it
    Membw {
        /// The regulation period in ms (budgets are per period; a VM over its budget is stopped,
        /// or with resctrl MBA slowed, until the period ends)
        #[arg(long)]
        period_ms: Option<u64>,
        /// on: lend what a VM is predicted not to use, and what no share holds, to VMs over
        /// their budget
        #[arg(long, value_parser = ["on", "off"])]
        reclaim: Option<String>,
        /// on: once every guarantee is met in a period, let every VM run until it ends
        #[arg(long, value_parser = ["on", "off"])]
        best_effort: Option<String>,
        /// [default: control_socket from the config, /run/cosched/control.sock]
        #[arg(long)]
        control_socket: Option<PathBuf>,
    },
    /// In the guest: ask the host for a guaranteed share of its memory bandwidth, through the
    /// running agent (`cosched guest`); prints the share granted (the host may lower it) or why
    /// it was refused. 0 gives the share back
    RequestMembw {
        /// Permille of the host's guaranteed memory bandwidth (0..=1000)
        #[arg(value_parser = clap::value_parser!(u64).range(0..=1000))]
        share: u64,
        /// The agent's local socket
        #[arg(long, default_value = cosched_agent::MEMBW_SOCKET)]
        socket: PathBuf,
    },
    /// Put back the original scheduling of every thread a dead daemon left changed
    /// (a starting daemon does this too). Refuses while a daemon runs.
    Restore {
        /// [default: state_dir from the config, /run/cosched/state]
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
    /// For packagers: man pages or shell completions, generated from this command line's
    /// definition
    #[command(subcommand, hide = true)]
    Generate(GenerateCmd),
}

#[derive(Subcommand, Debug)]
enum GenerateCmd {
    /// Writes cosched.1 and one page per subcommand (cosched-host.1, ...) into DIR
    Man { dir: PathBuf },
    /// Prints the completion script for SHELL
    Completions { shell: clap_complete::Shell },
}

#[derive(Subcommand, Debug)]
enum VmCmd {
    /// Coordinate this VM again, on every resource or one (VM = socket file name without .sock,
    /// or QEMU pid)
    Enable {
        vm: String,
        /// cpu, io, membw or event [default: every resource]
        resource: Option<String>,
    },
    /// Stop coordinating this VM, on every resource or one: it is deboosted and told DISABLE; a
    /// registration with nothing left on is denied
    Disable {
        vm: String,
        /// cpu, io, membw or event [default: every resource]
        resource: Option<String>,
    },
    /// Real-time priority of this VM's threads when boosted (1..=98; ranks VMs against each other)
    Priority { vm: String, priority: u8 },
    /// Static real-time tunings for as long as the VM runs (seed 002), kept by VM name until
    /// the daemon stops; undone exactly when turned off, when the VM exits or the daemon stops.
    /// Config: [vm.NAME.static]
    Static {
        vm: String,
        /// on: vCPU threads SCHED_FIFO at vcpu_priority (97), the others at other_priority (98)
        #[arg(long, value_parser = ["on", "off"])]
        fifo: Option<String>,
        /// Dedicated host CPUs for the vCPU threads ("1", "2-3") or "off". The VM's other
        /// threads, the IRQs and [shield] host_groups leave them
        #[arg(long)]
        shield: Option<String>,
        /// on: the real-time guard bounds the FIFO vCPUs ([policy] rt_guard_*: at most 900 ms of
        /// every second, the rest at [boost] guard_nice), so the kernel's RT throttling never
        /// stops the VM; off (default): the throttle bounds them
        #[arg(long, value_parser = ["on", "off"])]
        guard: Option<String>,
    },
    /// Highest host RT priority this VM's guest priorities map to ([rt] priority_map; 1..=98,
    /// with other_threads_priority_offset below daemon_priority)
    Ceiling { vm: String, ceiling: u8 },
    /// Guaranteed memory-bandwidth share of this VM, permille of [membw] guaranteed_mbps (config:
    /// [vm.NAME] membw_share); refused if the shares in force would exceed 1000. A guest's
    /// request replaces it while it stands
    Membw {
        vm: String,
        #[arg(value_parser = clap::value_parser!(u64).range(0..=1000))]
        share: u64,
    },
}

#[derive(clap::Args, Debug)]
struct HostArgs {
    /// Directory of QEMU chardev sockets, one per VM [default: /run/cosched/vms]
    #[arg(long)]
    socket_dir: Option<PathBuf>,
    /// Where original thread attributes are kept until restored [default: /run/cosched/state]
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Root-only control socket [default: /run/cosched/control.sock]
    #[arg(long)]
    control_socket: Option<PathBuf>,
    /// Serve Prometheus metrics over HTTP at this address, e.g. 127.0.0.1:9477
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Start with coordination disabled (enable later with `cosched enable`)
    #[arg(long)]
    disabled: bool,
    /// Log every frame, boost and deboost
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Log warnings only
    #[arg(short, long, conflicts_with = "verbose")]
    quiet: bool,
}

fn run_host(config: Option<&Path>, a: HostArgs) -> anyhow::Result<()> {
    // Root, or the capabilities the README's "Least privilege" lists: at least CAP_SYS_NICE,
    // without which no boost can change another process's thread.
    let caps = cosched_host::caps::Caps::read(Path::new("/proc/self/status"))?;
    if !caps.has(cosched_host::caps::CAP_SYS_NICE) {
        anyhow::bail!(
            "`cosched host` needs root, or at least CAP_SYS_NICE (it changes the scheduling of QEMU threads); the \
             capabilities each feature needs are in the README, \"Least privilege\""
        );
    }
    let mut cfg = HostConfig::load(config)?;
    if let Some(d) = a.socket_dir {
        cfg.socket_dir = d;
    }
    if let Some(d) = a.state_dir {
        cfg.state_dir = d;
    }
    if let Some(s) = a.control_socket {
        cfg.control_socket = s;
    }
    if a.metrics_listen.is_some() {
        cfg.metrics_listen = a.metrics_listen;
    }
    if a.disabled {
        cfg.enabled = false;
    }
    cosched_host::log::set_verbosity(if a.quiet { 0 } else { 1 + a.verbose });
    cosched_host::daemon::Daemon::new(cfg)?.run()
}

fn fmt_ms(ns_ms: f64) -> String {
    if ns_ms >= 1000.0 {
        format!("{:.1} s", ns_ms / 1000.0)
    } else {
        format!("{ns_ms:.1} ms")
    }
}

/// A status resource entry's time boosted (ms): its closed boosts and the one under way.
fn boosted_ms(res: &Value) -> f64 {
    res["counters"]["boosted_ns"].as_f64().unwrap_or(0.0) / 1e6 + res["boosted_for_ms"].as_f64().unwrap_or(0.0)
}

/// `cosched status --watch`: redraws [`watch_frame`] every `interval_ms` (on a terminal, from the
/// top of a cleared screen), `count` times or until interrupted.
fn watch_status(socket: &Path, interval_ms: u64, count: Option<u64>) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let tty = std::io::stdout().is_terminal();
    let mut prev: Option<(Value, std::time::Instant)> = None;
    let mut n = 0;
    loop {
        let s = request(socket, &Request::Status)?.context("empty status")?;
        let now = std::time::Instant::now();
        let frame = watch_frame(prev.as_ref().map(|(p, t)| (p, now.duration_since(*t).as_secs_f64())), &s);
        print!("{}{frame}", if tty { "\x1b[H\x1b[2J" } else { "" });
        std::io::Write::flush(&mut std::io::stdout())?;
        prev = Some((s, now));
        n += 1;
        if count.is_some_and(|c| n >= c) {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(interval_ms));
    }
}

/// One redraw of `status --watch`: the host's resources, then a line per VM and resource with
/// its level and, against `prev` (the last status and the seconds since), boosts/s, the share
/// of the time boosted, denials/s, and the memory bandwidth.
fn watch_frame(prev: Option<(&Value, f64)>, s: &Value) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let res: Vec<String> = s["resources"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(r, v)| format!("{r} {}", if v["enabled"].as_bool() == Some(true) { "on" } else { "OFF" }))
        .collect();
    let l = &s["latency"];
    let _ = writeln!(
        out,
        "cosched: {} VM(s); {}; hint-to-applied p50 {} µs, p99 {} µs{}",
        s["vms"].as_array().map_or(0, |v| v.len()),
        res.join(", "),
        l["p50_us"],
        l["p99_us"],
        prev.map_or("; rates from the next redraw".to_string(), |(_, dt)| format!("; rates over {dt:.1} s"))
    );
    let _ = writeln!(
        out,
        "\n{:<16} {:>7} {:<6} {:<9} {:>8} {:>8} {:>8} {:>8}  MEMBW",
        "VM", "PID", "RES", "LEVEL", "BOOSTS", "BOOST/S", "BOOSTED", "DENY/S"
    );
    // The same VM in the last status: same name, same QEMU process.
    let find = |p: &Value, vm: &Value| -> Option<Value> {
        p["vms"].as_array()?.iter().find(|v| v["name"] == vm["name"] && v["pid"] == vm["pid"]).cloned()
    };
    let denied =
        |c: &Value| -> f64 { c["denied"].as_object().map_or(0.0, |m| m.values().filter_map(Value::as_f64).sum()) };
    for vm in s["vms"].as_array().cloned().unwrap_or_default() {
        let before = prev.and_then(|(p, dt)| find(p, &vm).map(|b| (b, dt)));
        for (i, (r, res)) in vm["resources"].as_object().into_iter().flatten().enumerate() {
            let c = &res["counters"];
            let rates = before.as_ref().map(|(b, dt)| {
                let br = &b["resources"][r];
                let d = |k: &str| c[k].as_f64().unwrap_or(0.0) - br["counters"][k].as_f64().unwrap_or(0.0);
                (
                    d("boosts") / dt,
                    0.1 * (boosted_ms(res) - boosted_ms(br)) / dt,
                    (denied(c) - denied(&br["counters"])) / dt,
                )
            });
            let membw = if i == 0 && vm["membw"].is_object() {
                let m = &vm["membw"];
                format!(
                    "{:.0} MB/s of {} guaranteed{}",
                    m["last_period_mbps"].as_f64().unwrap_or(0.0),
                    m["guarantee_mbps"],
                    if m["throttled"].as_bool() == Some(true) { ", THROTTLED" } else { "" }
                )
            } else {
                String::new()
            };
            let first = i == 0;
            let _ = writeln!(
                out,
                "{:<16} {:>7} {:<6} {:<9} {:>8} {:>8} {:>8} {:>8}  {membw}",
                if first { vm["name"].as_str().unwrap_or("?") } else { "" },
                if first { vm["pid"].to_string() } else { String::new() },
                r,
                if res["active"].as_bool() == Some(false) { "off" } else { res["level"].as_str().unwrap_or("?") },
                c["boosts"],
                rates.map_or("-".into(), |r| format!("{:.1}", r.0)),
                rates.map_or("-".into(), |r| format!("{:.0}%", r.1)),
                rates.map_or("-".into(), |r| format!("{:.1}", r.2)),
            );
        }
    }
    if s["vms"].as_array().is_none_or(|v| v.is_empty()) {
        let _ = writeln!(out, "no VMs (socket directory {})", s["daemon"]["socket_dir"].as_str().unwrap_or("?"));
    }
    out
}

fn print_status(s: &Value) {
    let p = &s["policy"];
    let on = |v: &Value| if v.as_bool() == Some(true) { "enabled" } else { "DISABLED" };
    for (r, v) in s["resources"].as_object().into_iter().flatten() {
        let l = &v["limits"];
        let ms = |k: &str| l[k].as_u64().unwrap_or(0) / 1_000_000;
        print!(
            "{r}: {}   (budgets: boost <= {} ms at a time, <= {}‰ of {} ms",
            on(&v["enabled"]),
            ms("max_continuous_ns"),
            l["max_share_permille"],
            ms("window_ns")
        );
        if r == "io" {
            let io = &s["io"];
            print!(
                "; lever {} through {}",
                io["lever"].as_str().unwrap_or("?"),
                io["acts_through"].as_str().unwrap_or("?")
            );
        }
        if r == "event" {
            let e = &s["event"];
            let c = &e["counters"];
            print!(
                "; FEAS for {} VMs, {} per {} ms, slices {} µs, charging {}, detection {}: {} device / {} timer / {} \
                 internal wake-ups",
                e["vms"].as_str().unwrap_or("?"),
                e["n_limit"],
                e["cycle_ms"],
                e["slice_us"],
                if e["charge"].as_bool() == Some(true) { "on" } else { "off" },
                e["detection"].as_str().unwrap_or("?"),
                c["device_wakeups"],
                c["timer_wakeups"],
                c["internal_wakeups"]
            );
        }
        if r == "cpu" {
            print!(
                "; real-time guard {}‰ of {} ms; host reserve: {} of at most {} vCPU(s) boosted",
                p["rt_guard_max_share_permille"],
                p["rt_guard_window_ms"],
                v["boosted_vcpus"],
                v["boost_capacity_vcpus"]
            );
        }
        println!(")");
    }
    if let Some(why) = s["io"]["unsupported"].as_str() {
        println!("io: unsupported here: {why}");
    }
    if let Some(why) = s["event"]["unsupported"].as_str() {
        println!("event: unsupported here: {why}");
    }
    print_membw(s);
    let sh = &s["shield"];
    if sh["shielded_cpus"].as_str().is_some_and(|c| !c.is_empty()) {
        let list = |k: &str| {
            sh[k]
                .as_array()
                .map(|a| a.iter().map(|v| v.to_string().trim_matches('"').to_string()).collect::<Vec<_>>().join(", "))
                .unwrap_or_default()
        };
        println!(
            "shield: CPUs {} for shielded vCPUs, housekeeping {}; IRQs moved [{}], fixed [{}]; host groups moved [{}]; \
             per-CPU kernel threads left [{}]",
            sh["shielded_cpus"].as_str().unwrap_or("?"),
            sh["housekeeping_cpus"].as_str().unwrap_or("?"),
            list("irqs_moved"),
            list("irqs_fixed"),
            list("groups_moved"),
            list("kthreads_left")
        );
    }
    for e in s["shield"]["errors"].as_array().cloned().unwrap_or_default() {
        println!("shield: {}", e.as_str().unwrap_or("?"));
    }
    for l in s["privileges"]["lost"].as_array().cloned().unwrap_or_default() {
        println!(
            "privileges: lost {} (needs {})",
            l["feature"].as_str().unwrap_or("?"),
            l["needs"].as_str().unwrap_or("?")
        );
    }
    let l = &s["latency"];
    println!(
        "hint-to-applied latency: {} boosts/deboosts, p50 {} µs, p99 {} µs, max {} µs",
        l["count"], l["p50_us"], l["p99_us"], l["max_us"]
    );
    let vms = s["vms"].as_array().cloned().unwrap_or_default();
    if vms.is_empty() {
        println!("no VMs connected (socket directory {})", s["daemon"]["socket_dir"].as_str().unwrap_or("?"));
    } else {
        println!(
            "\n{:<16} {:>7} {:>4} {:>4} {:<6} {:>3} {:<8} {:>7} {:>9} {:>7} {:>9}  denied",
            "VM", "PID", "REG", "PRIO", "RES", "ON", "LEVEL", "BOOSTS", "BOOSTED", "BUDGET", "MALFORMED"
        );
    }
    for vm in &vms {
        let yes = |v: &Value| if v.as_bool() == Some(true) { "yes" } else { "no" };
        let denied = |d: &Value| -> Vec<String> {
            d.as_object().map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect()).unwrap_or_default()
        };
        let mut vm_denied = denied(&vm["counters"]["denied"]);
        for (i, (r, res)) in vm["resources"].as_object().into_iter().flatten().enumerate() {
            let c = &res["counters"];
            let boosted_ms = boosted_ms(res);
            let mut d = denied(&c["denied"]);
            if i == 0 {
                d.append(&mut vm_denied);
            }
            let first = i == 0;
            println!(
                "{:<16} {:>7} {:>4} {:>4} {:<6} {:>3} {:<8} {:>7} {:>9} {:>7} {:>9}  {}",
                if first { vm["name"].as_str().unwrap_or("?") } else { "" },
                if first { vm["pid"].to_string() } else { String::new() },
                if first { yes(&vm["registered"]) } else { "" },
                if first { vm["priority"].to_string() } else { String::new() },
                r,
                yes(&res["active"]),
                res["level"].as_str().unwrap_or("?"),
                c["boosts"],
                fmt_ms(boosted_ms),
                c["budget_exhausted"],
                if first { vm["counters"]["malformed"].to_string() } else { String::new() },
                if d.is_empty() { "-".into() } else { d.join(" ") }
            );
        }
        print_rt(&vm["resources"]["cpu"]["rt"]);
        let m = &vm["membw"];
        if m.is_object() {
            let st = &m["stats"];
            println!(
                "    membw: share {}‰{} = {} MB/s guaranteed; last period {:.0} MB/s; {}; throttled {} time(s), {}; \
                 borrowed {:.1} MB, lent {:.1} MB",
                m["effective_permille"],
                m["requested_permille"].as_u64().map_or(String::new(), |r| format!(" (asked by the guest: {r}‰)")),
                m["guarantee_mbps"],
                m["last_period_mbps"].as_f64().unwrap_or(0.0),
                match (m["throttled"].as_bool(), m["stopped"].as_bool()) {
                    (Some(true), Some(true)) => "THROTTLED now",
                    // Decided, but the freezer has not stopped every vCPU yet (FREEZING).
                    (Some(true), _) => "THROTTLED now, still stopping",
                    _ => "running",
                },
                st["throttles"],
                fmt_ms(st["throttled_ns"].as_f64().unwrap_or(0.0) / 1e6),
                st["borrowed_bytes"].as_f64().unwrap_or(0.0) / 1e6,
                st["lent_bytes"].as_f64().unwrap_or(0.0) / 1e6
            );
        }
        for t in vm["threads"].as_array().cloned().unwrap_or_default() {
            // The I/O lever's setting on the thread, if it has one.
            let io = ["ioprio", "blkio", "io_weight"]
                .iter()
                .find_map(|k| t[*k].as_str().map(|v| format!("  {k} {v}")))
                .unwrap_or_default();
            let stat = t["static"].as_str().map(|v| format!("  static: {v}")).unwrap_or_default();
            println!(
                "    {:>7} {:<7} {:<18} {}{io}{stat}",
                t["tid"],
                t["role"].as_str().unwrap_or("?"),
                t["comm"].as_str().unwrap_or("?"),
                t["sched"].as_str().unwrap_or("?")
            );
        }
        let st = &vm["static"];
        if st["tuning"].as_str().is_some_and(|t| t != "none") {
            println!("    static tuning: {}", st["tuning"].as_str().unwrap_or("?"));
        }
        if let Some(g) = st["guard"].as_object() {
            println!(
                "    static guard: {} ms at FIFO of {} ms allowed per {} ms, {} demotion(s){}",
                g["rt_ms"].as_f64().unwrap_or(0.0).round(),
                g["max_ms"].as_f64().unwrap_or(0.0),
                g["window_ms"].as_f64().unwrap_or(0.0),
                g["demotions"],
                if g["guarded"].as_bool() == Some(true) { ", guarding now" } else { "" }
            );
        }
        for n in st["notes"].as_array().cloned().unwrap_or_default() {
            println!("    static tuning: {}", n.as_str().unwrap_or("?"));
        }
        for d in vm["disks"].as_array().cloned().unwrap_or_default() {
            println!(
                "    disk {} on /dev/{}: scheduler {}{}",
                d["image"].as_str().unwrap_or("?"),
                d["device"].as_str().unwrap_or("?"),
                d["scheduler"].as_str().unwrap_or("?"),
                if d["scheduler"] == "bfq" { "" } else { " (not bfq: I/O coordination cannot help this VM there)" }
            );
        }
    }
    if let Some(p) = s["unconnected_sockets"].as_array().filter(|a| !a.is_empty()) {
        println!(
            "\nsockets not connected (see the daemon's log): {}",
            p.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ")
        );
    }
}

/// The memory-bandwidth regulation, host-wide.
fn print_membw(s: &Value) {
    let m = &s["membw"];
    if let Some(why) = m["unsupported"].as_str() {
        println!("membw: unsupported here: {why}");
        return;
    }
    if let Some(w) = m["warning"].as_str() {
        println!("membw: *** {w} ***");
    }
    println!(
        "membw: {} counters, {} MB/s guaranteed, {}‰ committed; period {} ms, reclaim {}, best effort {}; throttling \
         through the {}; {} periods, {} with best effort",
        m["backend"].as_str().unwrap_or("?"),
        m["guaranteed_mbps"],
        m["committed_permille"],
        m["period_ms"],
        if m["reclaim"].as_bool() == Some(true) { "on" } else { "off" },
        if m["best_effort"].as_bool() == Some(true) { "on" } else { "off" },
        m["throttles_through"].as_str().unwrap_or("?"),
        m["counters"]["periods"],
        m["counters"]["best_effort_periods"]
    );
    for n in m["notes"].as_array().cloned().unwrap_or_default() {
        println!("membw: {}", n.as_str().unwrap_or("?"));
    }
}

/// A VM's RT co-scheduling and predictive boost, when it has used them.
fn print_rt(rt: &Value) {
    let p = &rt["predictions"];
    if rt["guest_priority"].as_u64().unwrap_or(0) != 0 || p["received"].as_u64().unwrap_or(0) != 0 {
        let host = rt["host_priority"].as_u64().map_or("-".to_string(), |h| format!("FIFO {h}"));
        println!(
            "    rt: guest priority {} -> host {host} (map {}, ceiling {})",
            rt["guest_priority"],
            rt["priority_map"].as_str().unwrap_or("?"),
            rt["ceiling"]
        );
    }
    if p["received"].as_u64().unwrap_or(0) != 0 {
        let (e, l) = (&rt["predict_error_us"], &rt["predict_apply_late_us"]);
        println!(
            "    predictions: {} received, {} applied, {} covered, {} confirmed ({} early), {} unconfirmed, {} refused, \
             {} denied, {} cancelled; lead {} µs; error p50 {} / p99 {} µs; applied late p50 {} / p99 {} / max {} µs",
            p["received"],
            p["applied"],
            p["covered"],
            p["confirmed"],
            p["early"],
            p["unconfirmed"],
            p["refused"],
            p["denied"],
            p["cancelled"],
            rt["lead_us"],
            e["p50_us"],
            e["p99_us"],
            l["p50_us"],
            l["p99_us"],
            l["max_us"]
        );
    }
}

/// The control socket: given on the command line, or the config's.
fn control(config: Option<&Path>, explicit: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    Ok(match explicit {
        Some(p) => p,
        None => HostConfig::load(config)?.control_socket,
    })
}

/// `cosched generate man DIR`: the top page and one per visible subcommand, nested ones too
/// (`cosched-vm-membw.1`).
fn generate_man(dir: &Path) -> anyhow::Result<()> {
    use clap::CommandFactory;
    fn page(cmd: clap::Command, name: &str, dir: &Path) -> anyhow::Result<()> {
        // A one-shot generator: the few page names may live as long as the process.
        let cmd = cmd.name(&*name.to_string().leak());
        let mut out = Vec::new();
        clap_mangen::Man::new(cmd.clone()).render(&mut out)?;
        let path = dir.join(format!("{name}.1"));
        std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
            page(sub.clone(), &format!("{name}-{}", sub.get_name()), dir)?;
        }
        Ok(())
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut cmd = Cli::command();
    cmd.build();
    page(cmd, "cosched", dir)
}

fn main() {
    let cli = Cli::parse();
    let config = cli.config.as_deref();
    let result: anyhow::Result<()> = (|| match cli.cmd {
        Cmd::Host(a) => run_host(config, a),
        Cmd::Guest(opts) => cosched_agent::run(opts),
        Cmd::Status { watch: true, interval_ms, count, control_socket, .. } => {
            watch_status(&control(config, control_socket)?, interval_ms, count)
        }
        Cmd::Status { json, control_socket, .. } => {
            let s = request(&control(config, control_socket)?, &Request::Status)?.context("empty status")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                print_status(&s);
            }
            Ok(())
        }
        Cmd::Enable { resource, control_socket } => {
            request(&control(config, control_socket)?, &Request::Enable { vm: None, resource }).map(drop)
        }
        Cmd::Disable { resource, control_socket } => {
            request(&control(config, control_socket)?, &Request::Disable { vm: None, resource }).map(drop)
        }
        Cmd::Vm { cmd, control_socket } => {
            let req = match cmd {
                VmCmd::Enable { vm, resource } => Request::Enable { vm: Some(vm), resource },
                VmCmd::Disable { vm, resource } => Request::Disable { vm: Some(vm), resource },
                VmCmd::Priority { vm, priority } => Request::Priority { vm, priority },
                VmCmd::Static { vm, fifo, shield, guard } => {
                    if fifo.is_none() && shield.is_none() && guard.is_none() {
                        anyhow::bail!("say what to change: --fifo on|off, --guard on|off and/or --shield CPUS|off");
                    }
                    Request::Static { vm, fifo: fifo.map(|f| f == "on"), shield, guard: guard.map(|g| g == "on") }
                }
                VmCmd::Ceiling { vm, ceiling } => Request::Ceiling { vm, ceiling },
                VmCmd::Membw { vm, share } => Request::MembwShare { vm, share },
            };
            request(&control(config, control_socket)?, &req).map(drop)
        }
        Cmd::Membw { period_ms, reclaim, best_effort, control_socket } => {
            let socket = control(config, control_socket)?;
            if period_ms.is_some() || reclaim.is_some() || best_effort.is_some() {
                let on = |v: Option<String>| v.map(|v| v == "on");
                let req = Request::Membw { period_ms, reclaim: on(reclaim), best_effort: on(best_effort) };
                request(&socket, &req)?;
            }
            let s = request(&socket, &Request::Status)?.context("empty status")?;
            print_membw(&s);
            Ok(())
        }
        Cmd::RequestMembw { share, socket } => {
            let reply = cosched_agent::membw_request(&socket, share)?;
            println!("{reply}");
            Ok(())
        }
        Cmd::Metrics { control_socket } => {
            let m = request(&control(config, control_socket)?, &Request::Metrics)?.context("empty reply")?;
            print!("{}", m["text"].as_str().unwrap_or_default());
            Ok(())
        }
        Cmd::Generate(GenerateCmd::Man { dir }) => generate_man(&dir),
        Cmd::Generate(GenerateCmd::Completions { shell }) => {
            use clap::CommandFactory;
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "cosched", &mut script);
            std::io::Write::write_all(&mut std::io::stdout(), &script).context("writing the completion script")
        }
        Cmd::Restore { state_dir } => {
            // The config names the cgroup hierarchy the weight lever's groups were made in.
            let cfg = HostConfig::load(config)?;
            let state_dir = state_dir.unwrap_or_else(|| cfg.state_dir.clone());
            let r = cosched_host::daemon::restore_command(&state_dir, &cfg)?;
            println!(
                "restored {} thread(s); {} gone; {} left as they were (changed by someone else or never changed)",
                r.restored, r.gone, r.untouched
            );
            for e in &r.errors {
                eprintln!("error: {e}");
            }
            if r.errors.is_empty() {
                Ok(())
            } else {
                anyhow::bail!(
                    "{} thread(s) could not be restored; their records are kept in {}",
                    r.errors.len(),
                    state_dir.display()
                )
            }
        }
    })();
    if let Err(e) = result {
        eprintln!("cosched: error: {e:#}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(pid: u64, boosts: u64, boosted_ns: u64, denied: u64, level: &str) -> Value {
        json!({
            "resources": {"cpu": {"enabled": true}, "io": {"enabled": false}},
            "latency": {"p50_us": 15, "p99_us": 600},
            "vms": [{
                "name": "vm1", "pid": pid,
                "resources": {
                    "cpu": {"active": true, "level": level, "boosted_for_ms": 0.0,
                            "counters": {"boosts": boosts, "boosted_ns": boosted_ns, "denied": {"budget": denied}}},
                    "io": {"active": false, "level": "normal", "boosted_for_ms": 0.0,
                           "counters": {"boosts": 0, "boosted_ns": 0, "denied": {}}}
                },
                "membw": {"last_period_mbps": 512.4, "guarantee_mbps": 700.0, "throttled": true}
            }]
        })
    }

    #[test]
    fn the_watch_view_shows_each_vm_per_resource_with_rates_since_the_last_redraw() {
        let first = watch_frame(None, &status(7, 10, 1_000_000_000, 1, "normal"));
        assert!(first.contains("1 VM(s); cpu on, io OFF; hint-to-applied p50 15 µs, p99 600 µs"), "{first}");
        assert!(first.contains("rates from the next redraw"), "{first}");
        let row = |f: &str, res: &str| {
            f.lines().skip(3).find(|l| l.split_whitespace().any(|w| w == res)).unwrap().to_string()
        };
        let cpu = row(&first, "cpu");
        assert_eq!(cpu.split_whitespace().collect::<Vec<_>>()[..7], ["vm1", "7", "cpu", "normal", "10", "-", "-"]);
        assert!(cpu.ends_with("512 MB/s of 700.0 guaranteed, THROTTLED"), "{cpu}");
        // 2 s later: 10 more boosts, 1 s more boosted, 4 more denials.
        let prev = status(7, 10, 1_000_000_000, 1, "normal");
        let next = watch_frame(Some((&prev, 2.0)), &status(7, 20, 2_000_000_000, 5, "boosted"));
        let cpu = row(&next, "cpu");
        assert_eq!(
            cpu.split_whitespace().collect::<Vec<_>>()[..8],
            ["vm1", "7", "cpu", "boosted", "20", "5.0", "50%", "2.0"]
        );
        assert_eq!(row(&next, "io").split_whitespace().collect::<Vec<_>>()[..2], ["io", "off"]);
        // A VM restarted (another pid) under the same name has no rates yet.
        let restarted = watch_frame(Some((&prev, 2.0)), &status(8, 1, 0, 0, "normal"));
        assert_eq!(row(&restarted, "cpu").split_whitespace().nth(5), Some("-"));
        assert!(watch_frame(None, &json!({"vms": [], "daemon": {"socket_dir": "/run/cosched/vms"}}))
            .contains("no VMs (socket directory /run/cosched/vms)"));
    }
}
