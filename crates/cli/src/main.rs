//! `cosched`: one binary for the host daemon, the guest agent and the operator commands.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};
use cosched_host::config::HostConfig;
use cosched_host::control::{request, MetricsReply, Request};

mod status;

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
            status::watch(&control(config, control_socket)?, interval_ms, count)
        }
        Cmd::Status { json: true, control_socket, .. } => {
            // The daemon's JSON as it sent it.
            let s = status::json(&control(config, control_socket)?)?;
            println!("{}", serde_json::to_string_pretty(&s)?);
            Ok(())
        }
        Cmd::Status { control_socket, .. } => {
            print!("{}", status::text(&status::get(&control(config, control_socket)?)?));
            Ok(())
        }
        Cmd::Enable { resource, control_socket } => {
            request(&control(config, control_socket)?, &Request::Enable { vm: None, resource }).map(drop).map_err(Into::into)
        }
        Cmd::Disable { resource, control_socket } => {
            request(&control(config, control_socket)?, &Request::Disable { vm: None, resource }).map(drop).map_err(Into::into)
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
            request(&control(config, control_socket)?, &req).map(drop).map_err(Into::into)
        }
        Cmd::Membw { period_ms, reclaim, best_effort, control_socket } => {
            let socket = control(config, control_socket)?;
            if period_ms.is_some() || reclaim.is_some() || best_effort.is_some() {
                let on = |v: Option<String>| v.map(|v| v == "on");
                let req = Request::Membw { period_ms, reclaim: on(reclaim), best_effort: on(best_effort) };
                request(&socket, &req)?;
            }
            print!("{}", status::membw_text(&status::get(&socket)?.membw));
            Ok(())
        }
        Cmd::RequestMembw { share, socket } => {
            let reply = cosched_agent::membw_request(&socket, share)?;
            println!("{reply}");
            Ok(())
        }
        Cmd::Metrics { control_socket } => {
            let m = request(&control(config, control_socket)?, &Request::Metrics)?.context("empty reply")?;
            let m: MetricsReply = serde_json::from_value(m).context("reading the daemon's metrics")?;
            print!("{}", m.text);
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
