//! The command line's definition: every command, argument and help text (also what the man
//! pages and shell completions are generated from).

use std::path::PathBuf;

use clap::{ArgGroup, CommandFactory, Parser, Subcommand};

use crate::parse::{boolean, whole, ResourceName};

/// What every operator command exits with (`--help` and the man pages say it).
pub const EXIT_STATUS: &str = "Exit status: 0 done; 1 error (a request the daemon refused too); 2 wrong usage; \
    3 the host daemon is not running (its control socket cannot be reached)";

/// Help of every `--control-socket`.
const CONTROL_SOCKET: &str =
    "The host daemon's control socket [default: control_socket from the config, /run/cosched/control.sock]";

#[derive(Parser, Debug)]
#[command(
    name = "cosched",
    version,
    about = "Coordinated host/guest scheduling for QEMU/KVM virtual machines",
    long_about = "Coordinated host/guest scheduling for QEMU/KVM virtual machines.\n\n\
        In the guest, `cosched guest` detects with eBPF when the guest runs work that must not \
        wait (real-time tasks, newly started tasks, urgent disk reads) and tells the host over the \
        virtio-serial port org.cosched.0. On the host, `cosched host` (root, or a user with \
        CAP_SYS_NICE and the other capabilities of its systemd unit) connects to each VM's chardev \
        socket, boosts that VM's QEMU threads (SCHED_RR) for just as long, within budgets, and \
        puts back exactly what it changed. Guests without the agent get event boosting (config \
        [event]): a vCPU waiting behind other threads when a device wakes its VM (a packet, a disk \
        completion) runs SCHED_RR for a short slice, at most once per 10 ms, and pays that CPU time \
        back.\n\n\
        QEMU needs: -name <vm>,debug-threads=on -device virtio-serial \
        -chardev socket,path=/run/cosched/vms/<vm>.sock,server=on,wait=off,id=cosched0 \
        -device virtserialport,chardev=cosched0,name=org.cosched.0\n\n\
        The operator commands (status, enable, disable, reload, reset, vm, membw, metrics) talk to the running \
        daemon through its control socket, which accepts root and the user the daemon runs as. \
        A VM is named by its socket file's name without .sock, its libvirt domain or QEMU's -name, \
        or by its QEMU pid. Switches take true or false.",
    after_help = EXIT_STATUS
)]
pub struct Cli {
    /// The config file [default: /etc/cosched/host.toml; for guest: /etc/cosched/guest.toml]
    ///
    /// The host daemon's config (TOML), or with `guest` the agent's. A default path that does
    /// not exist means the defaults; a path given must exist. The operator
    /// commands read the control socket and state directory from the host's; if it cannot be
    /// read, they say why and go on with the paths they can read from it, and the defaults.
    /// `request-membw` reads none
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Run the host daemon: watch the socket directory, coordinate every VM found there (root,
    /// or a user with CAP_SYS_NICE and the other capabilities of its systemd unit)
    Host(HostArgs),
    /// Run the guest agent inside the VM (root): tell the host when this VM needs its help
    ///
    /// It opens the virtio-serial port org.cosched.0, registers with the host daemon the
    /// resources whose eBPF detector loads here (CPU: real-time and newly started tasks; I/O: the
    /// BFQ scheduler's urgent queues), then tells the host when this VM needs a boost and when it
    /// no longer does. Its options are read from /etc/cosched/guest.toml (or the file --config
    /// names), one key per option without its dashes; options on the command line win. The
    /// package's unit (cosched-guest.service) starts it when the port appears.
    Guest(cosched_agent::Options),
    /// Show the host's coordination and each VM: levels, budgets, counters (their threads with
    /// --threads)
    Status {
        /// Only this VM: its name (socket file name without .sock, libvirt domain or QEMU -name)
        /// or QEMU pid
        vm: Option<String>,
        /// Machine-readable output: the daemon's status as JSON (with every thread; with VM, only
        /// that VM in "vms"); its "schema_version" changes when a key changes meaning
        #[arg(long, conflicts_with = "watch")]
        json: bool,
        /// Also list each VM's threads and the settings on each
        #[arg(long, conflicts_with_all = ["watch", "json"])]
        threads: bool,
        /// Live, like top: each VM per resource, redrawn every --interval-ms, with what changed
        /// since the last redraw (boosts/s, share of the time boosted, denials/s, memory MB/s).
        /// Ctrl-C ends it
        #[arg(long)]
        watch: bool,
        /// With --watch: the redraw interval (100..=3600000)
        #[arg(long, default_value_t = 1000, value_parser = whole::<u64>(100..=3_600_000), value_name = "MS")]
        interval_ms: u64,
        /// With --watch: stop after this many redraws [default: until Ctrl-C]
        #[arg(long, requires = "watch", value_parser = whole::<u64>(1..=u64::MAX), value_name = "N")]
        count: Option<u64>,
        #[arg(long, help = CONTROL_SOCKET, value_name = "PATH")]
        control_socket: Option<PathBuf>,
    },
    /// Turn coordination on for the whole host, for every resource or one (VMs told DISABLE
    /// are told ENABLE); for every resource, the static tunings `disable --all` took off come
    /// back too. Kept in the state directory across daemon restarts, over the config, until
    /// `cosched reset`. Prints what it turned on
    Enable {
        /// cpu, io, membw or event [default: every resource]
        #[arg(value_parser = ResourceName)]
        resource: Option<String>,
        #[arg(long, help = CHANGE_JSON)]
        json: bool,
        #[arg(long, help = CONTROL_SOCKET, value_name = "PATH")]
        control_socket: Option<PathBuf>,
    },
    /// Turn coordination off for the whole host, for every resource or one: every VM is
    /// deboosted on it and its agent told DISABLE. The static tunings ([vm.NAME.static] FIFO,
    /// guard, shield) stay unless --all. Kept in the state directory across daemon restarts (not
    /// a reboot), over the config, until `cosched enable` or `cosched reset`. Prints what it
    /// turned off
    Disable {
        /// cpu, io, membw or event [default: every resource]
        #[arg(value_parser = ResourceName)]
        resource: Option<String>,
        /// Also take every VM's static tunings off (FIFO, guard, CPU shield) until `cosched
        /// enable`: the host runs as if cosched were not there
        #[arg(long, conflicts_with = "resource")]
        all: bool,
        #[arg(long, help = CHANGE_JSON)]
        json: bool,
        #[arg(long, help = CONTROL_SOCKET, value_name = "PATH")]
        control_socket: Option<PathBuf>,
    },
    /// Read the config file again and apply only what changed (also SIGHUP, `systemctl reload
    /// cosched-host`): the [vm.NAME] keys, enabled and [resources], the [policy] budgets and
    /// default_priority, [membw] period_ms, reclaim, best_effort and default_share_permille,
    /// discover_*. Other changed keys are listed as needing a restart and left as they run; a
    /// setting the operator changed stays (`cosched reset`). A config that does not load changes
    /// nothing. Prints what changed
    Reload {
        #[arg(long, help = CHANGE_JSON)]
        json: bool,
        #[arg(long, help = CONTROL_SOCKET, value_name = "PATH")]
        control_socket: Option<PathBuf>,
    },
    /// Drop every setting the operator changed (enable, disable, membw, vm ...), host-wide and
    /// for every VM: back to the config. Prints what changed
    Reset {
        #[arg(long, help = CHANGE_JSON)]
        json: bool,
        #[arg(long, help = CONTROL_SOCKET, value_name = "PATH")]
        control_socket: Option<PathBuf>,
    },
    /// List the VMs, and change one VM's settings (each change prints what it changed). Each
    /// setting is kept by VM name in the state directory, so it survives a restart of the daemon
    /// (not a reboot), and wins over [vm.NAME] in the config, even after a reload, until `cosched
    /// vm reset VM`. A VM that is not running can be named by its [vm.NAME] in the config: it
    /// gets the setting when it appears
    Vm {
        #[command(subcommand)]
        cmd: VmCmd,
        /// Machine-readable output, with a "schema_version": the list, or what was changed
        #[arg(long, global = true)]
        json: bool,
        #[arg(long, global = true, help = CONTROL_SOCKET, value_name = "PATH")]
        control_socket: Option<PathBuf>,
    },
    /// Print the daemon's metrics in the Prometheus text format
    Metrics {
        #[arg(long, help = CONTROL_SOCKET, value_name = "PATH")]
        control_socket: Option<PathBuf>,
    },
    /// Memory-bandwidth regulation for the whole host: the period, reclaim of unused budget and
    /// best effort (config [membw]; per VM: `cosched vm membw`). Without options, shows it; with,
    /// changes it and prints what it changed
    Membw {
        /// The regulation period in ms (budgets are per period; a VM over its budget is stopped,
        /// or with resctrl MBA slowed, until the period ends)
        #[arg(long, value_parser = whole::<u64>(0..=u64::MAX), value_name = "MS")]
        period_ms: Option<u64>,
        /// true: lend what a VM is predicted not to use, and what no share holds, to VMs over
        /// their budget
        #[arg(long, value_parser = boolean(), value_name = "BOOL")]
        reclaim: Option<bool>,
        /// true: once every guarantee is met in a period, let every VM run until it ends
        #[arg(long, value_parser = boolean(), value_name = "BOOL")]
        best_effort: Option<bool>,
        /// Machine-readable output, with a "schema_version": the status's "membw", or what was
        /// changed
        #[arg(long)]
        json: bool,
        #[arg(long, help = CONTROL_SOCKET, value_name = "PATH")]
        control_socket: Option<PathBuf>,
    },
    /// In the guest: ask the host for a guaranteed share of its memory bandwidth, through the
    /// running agent (`cosched guest`); prints the share granted (the host may lower it) or why
    /// it was refused. 0 gives the share back
    RequestMembw {
        /// Permille of the host's guaranteed memory bandwidth (0..=1000)
        #[arg(value_parser = whole::<u64>(0..=1000), value_name = "PERMILLE", allow_negative_numbers = true)]
        share: u64,
        /// The agent's local socket
        #[arg(long, default_value = cosched_agent::MEMBW_SOCKET, value_name = "PATH")]
        socket: PathBuf,
    },
    /// Put back the original scheduling of every thread a dead daemon left changed (a starting
    /// daemon does this too). Refuses while a daemon runs; works whatever the config says
    Restore {
        /// Where the daemon kept the original settings; must exist if given [default: state_dir
        /// from the config, /run/cosched/state]
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// Machine-readable output: what was put back, and each failure, with a "schema_version"
        #[arg(long)]
        json: bool,
    },
    /// Check a host config as the daemon would load it, without starting anything: every key,
    /// value and range, the metrics address, the paths. Lists every error found
    CheckConfig {
        /// The config to check [default: --config, /etc/cosched/host.toml]
        file: Option<PathBuf>,
        /// Machine-readable output, with a "schema_version"
        #[arg(long)]
        json: bool,
    },
    /// For packagers: man pages or shell completions, generated from this command line's
    /// definition
    #[command(subcommand, hide = true)]
    Generate(GenerateCmd),
}

#[derive(Subcommand, Debug)]
pub enum GenerateCmd {
    /// Writes cosched.8 and a page per command (cosched-host.8, cosched-vm-membw.8, ...) into DIR
    Man {
        /// Where to write the pages (created if needed)
        dir: PathBuf,
    },
    /// Prints the completion script for SHELL
    Completions {
        /// bash, zsh, fish, elvish or powershell
        shell: clap_complete::Shell,
    },
    /// Prints the guest agent's config file, every key commented out at its default
    /// (packaging/guest.toml, /etc/cosched/guest.toml)
    GuestConfig,
    /// Prints the reference of every key of the host configuration, from the daemon's own
    /// definitions: docs/configuration.md (markdown, with the guest's keys), packaging/host.toml
    /// (toml) or cosched-host.toml(5) (man)
    ConfigReference {
        /// markdown, toml or man
        #[arg(long, value_enum, default_value_t = ReferenceFormat::Markdown)]
        format: ReferenceFormat,
    },
}

/// What `generate config-reference` renders.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum ReferenceFormat {
    Markdown,
    Toml,
    Man,
}

#[derive(Subcommand, Debug)]
pub enum VmCmd {
    /// List the VMs: name, QEMU pid, agent, and each resource's level
    List,
    /// Coordinate this VM again, on every resource or one
    Enable {
        #[arg(help = VM)]
        vm: String,
        /// cpu, io, membw or event [default: every resource]
        #[arg(value_parser = ResourceName)]
        resource: Option<String>,
    },
    /// Stop coordinating this VM, on every resource or one: it is deboosted and told DISABLE; a
    /// registration with nothing left on is denied
    Disable {
        #[arg(help = VM)]
        vm: String,
        /// cpu, io, membw or event [default: every resource]
        #[arg(value_parser = ResourceName)]
        resource: Option<String>,
    },
    /// Real-time priority of this VM's threads when boosted (ranks VMs against each other)
    Priority {
        #[arg(help = VM)]
        vm: String,
        /// 1..=98, below the daemon's own priority (daemon_priority)
        #[arg(value_parser = whole::<u8>(1..=98), allow_negative_numbers = true)]
        priority: u8,
    },
    /// Static real-time tunings for as long as the VM runs, kept by VM name until the daemon
    /// stops; undone exactly when turned off, when the VM exits or the daemon stops. Config:
    /// [vm.NAME.static]
    #[command(group(ArgGroup::new("change").required(true).multiple(true).args(["fifo", "shield", "guard"])))]
    Static {
        #[arg(help = VM)]
        vm: String,
        /// true: vCPU threads SCHED_FIFO at vcpu_priority (97), the others at other_priority (98)
        #[arg(long, value_parser = boolean(), value_name = "BOOL")]
        fifo: Option<bool>,
        /// Dedicated host CPUs for the vCPU threads ("1", "2-3"), or "off" for none. The VM's
        /// other threads, the IRQs and [shield] host_groups leave them
        #[arg(long, value_name = "CPUS|off")]
        shield: Option<String>,
        /// true: the real-time guard bounds the FIFO vCPUs ([policy] rt_guard_*: at most 900 ms
        /// of every second, the rest at [boost] guard_nice), so the kernel's RT throttling never
        /// stops the VM; false (the default): the throttle bounds them
        #[arg(long, value_parser = boolean(), value_name = "BOOL")]
        guard: Option<bool>,
    },
    /// Highest host RT priority this VM's guest priorities map to ([rt] priority_map)
    Ceiling {
        #[arg(help = VM)]
        vm: String,
        /// 1..=98, with [boost] other_threads_priority_offset below daemon_priority
        #[arg(value_parser = whole::<u8>(1..=98), allow_negative_numbers = true)]
        ceiling: u8,
    },
    /// Guaranteed memory-bandwidth share of this VM, permille of [membw] guaranteed_mbps (config:
    /// [vm.NAME] membw_share); refused if the shares in force would exceed 1000. A guest's
    /// request replaces it while it stands
    Membw {
        #[arg(help = VM)]
        vm: String,
        /// Permille of the host's guaranteed memory bandwidth (0..=1000)
        #[arg(value_parser = whole::<u64>(0..=1000), value_name = "PERMILLE", allow_negative_numbers = true)]
        share: u64,
    },
    /// Drop every setting the operator changed for this VM: back to its [vm.NAME] in the config.
    /// Prints what changed
    Reset {
        #[arg(help = VM)]
        vm: String,
    },
}

/// Help of `--json` on the commands that change something.
const CHANGE_JSON: &str =
    "Say what was changed as JSON, with a \"schema_version\": the request the daemon carried out, \
    and the line printed without --json";

/// Help of every VM argument.
const VM: &str = "The VM: its name (socket file name without .sock, libvirt domain or QEMU -name) or QEMU pid";

#[derive(clap::Args, Debug)]
pub struct HostArgs {
    /// Directory of QEMU chardev sockets, one per VM [default: socket_dir from the config,
    /// /run/cosched/vms]
    #[arg(long, value_name = "DIR")]
    pub socket_dir: Option<PathBuf>,
    /// Where original thread attributes are kept until restored [default: state_dir from the
    /// config, /run/cosched/state]
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// The control socket the operator commands use; it accepts root and the user the daemon
    /// runs as [default: control_socket from the config, /run/cosched/control.sock]
    #[arg(long, value_name = "PATH")]
    pub control_socket: Option<PathBuf>,
    /// Serve Prometheus metrics over HTTP at this IP address and port, e.g. 127.0.0.1:9477
    /// [default: metrics_listen from the config; none]
    #[arg(long, value_name = "IP:PORT")]
    pub metrics_listen: Option<String>,
    /// Start with coordination disabled (enable later with `cosched enable`)
    #[arg(long)]
    pub disabled: bool,
    /// Log every frame, boost and deboost
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Log warnings only
    #[arg(short, long, conflicts_with = "verbose")]
    pub quiet: bool,
}

/// The operator commands: those whose `--help` ends with the exit status.
const OPERATOR: [&str; 10] =
    ["status", "enable", "disable", "reload", "reset", "vm", "metrics", "membw", "restore", "check-config"];

/// The commands of the host role: the daemon and what talks to it or cleans up after it.
const HOST_ONLY: [&str; 11] =
    ["host", "status", "enable", "disable", "reload", "reset", "vm", "metrics", "membw", "restore", "check-config"];
/// The commands of the guest role.
const GUEST_ONLY: [&str; 2] = ["guest", "request-membw"];

/// Which commands `--help` offers: a host's, a guest's, or all. Hidden commands still run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Host,
    Guest,
    All,
}

/// The variable that overrides the role inferred from the installed configs.
pub const ROLE_ENV: &str = "COSCHED_ROLE";

impl Role {
    /// `COSCHED_ROLE` (host, guest or all) if set, else inferred: a guest has
    /// /etc/cosched/guest.toml and no /etc/cosched/host.toml (the guest role package); anything
    /// else is a host. An unknown value is warned of and ignored.
    pub fn of_this_system() -> Role {
        let exists = |p: &str| std::path::Path::new(p).exists();
        let env = std::env::var(ROLE_ENV).ok();
        Role::infer(
            env.as_deref(),
            exists(crate::guest_config::DEFAULT_PATH),
            exists(cosched_host::config::DEFAULT_CONFIG),
        )
    }

    fn infer(env: Option<&str>, guest_config: bool, host_config: bool) -> Role {
        match env.map(str::trim).filter(|v| !v.is_empty()) {
            Some("host") => return Role::Host,
            Some("guest") => return Role::Guest,
            Some("all") => return Role::All,
            Some(other) => eprintln!("cosched: warning: {ROLE_ENV}={other:?} is not host, guest or all: ignored"),
            None => {}
        }
        if guest_config && !host_config {
            Role::Guest
        } else {
            Role::Host
        }
    }

    /// The commands this role does not offer.
    fn hidden(self) -> &'static [&'static str] {
        match self {
            Role::Host => &GUEST_ONLY,
            Role::Guest => &HOST_ONLY,
            Role::All => &[],
        }
    }
}

/// The command line as this system's role offers it (see [`Role`]), with the exit status under
/// each operator command's help.
pub fn command() -> clap::Command {
    command_for(Role::of_this_system())
}

/// `--version`: the version, and the git commit built from where known (as
/// `cosched_build_info` says them).
fn version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| {
        let b = cosched_host::build();
        if b.commit.is_empty() {
            b.version
        } else {
            format!("{} (commit {})", b.version, b.commit)
        }
    })
}

/// The command line offering `role`'s commands (the man pages and completions: [`Role::All`]).
pub fn command_for(role: Role) -> clap::Command {
    let mut cmd = Cli::command().version(version());
    for name in OPERATOR {
        cmd = cmd.mut_subcommand(name, |c| {
            let subs: Vec<String> = c.get_subcommands().map(|s| s.get_name().to_string()).collect();
            subs.iter().fold(c.after_help(EXIT_STATUS), |c, s| c.mut_subcommand(s, |s| s.after_help(EXIT_STATUS)))
        });
    }
    for name in role.hidden() {
        cmd = cmd.mut_subcommand(name, |c| c.hide(true));
    }
    // The agent's options are clap's own: their numbers refused in plain words too.
    cmd.mut_subcommand("guest", crate::parse::plain_numbers)
}

/// Parses the process's arguments (exits 2 on wrong usage, 0 for --help and --version).
pub fn parse() -> Cli {
    use clap::FromArgMatches;
    let mut cmd = command();
    let cli = Cli::from_arg_matches(&cmd.get_matches_mut()).unwrap_or_else(|e| e.exit());
    if let Some(why) = cli.misuse() {
        cmd.error(clap::error::ErrorKind::ArgumentConflict, why).exit();
    }
    cli
}

impl Cli {
    /// What clap cannot say: `--config` is the host's config, or with `guest` the agent's, and
    /// means nothing to `request-membw` (which talks to the agent's socket).
    fn misuse(&self) -> Option<&'static str> {
        match (&self.cmd, &self.config) {
            (Cmd::RequestMembw { .. }, Some(_)) => Some(
                "--config means nothing to request-membw: it reads no config, it asks the running agent (cosched \
                 guest, which reads /etc/cosched/guest.toml) through --socket",
            ),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_definition_is_consistent() {
        command().debug_assert();
    }

    /// Every argument says what it is; no help text names a Rust type or the papers.
    #[test]
    fn every_argument_has_help_in_plain_words() {
        fn walk(cmd: &clap::Command, at: &str, out: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let help = a.get_help().map(ToString::to_string).unwrap_or_default();
                if help.trim().is_empty() && !["help", "version"].contains(&a.get_id().as_str()) {
                    out.push(format!("{at} {}: no help", a.get_id()));
                }
                for word in ["seed 0", "paper", "u8", "u64", "Option<"] {
                    if help.contains(word) {
                        out.push(format!("{at} {}: {word:?} in {help:?}", a.get_id()));
                    }
                }
            }
            for s in cmd.get_subcommands() {
                walk(s, &format!("{at} {}", s.get_name()), out);
            }
        }
        let mut bad = Vec::new();
        walk(&command(), "cosched", &mut bad);
        assert!(bad.is_empty(), "{bad:#?}");
    }

    #[test]
    fn switches_read_true_and_false_and_still_on_and_off() {
        for (word, want) in [("true", true), ("false", false), ("on", true), ("off", false)] {
            let cli = Cli::try_parse_from(["cosched", "membw", "--reclaim", word]).unwrap();
            assert!(matches!(cli.cmd, Cmd::Membw { reclaim: Some(r), .. } if r == want), "{word}");
        }
        let e = Cli::try_parse_from(["cosched", "membw", "--reclaim", "yes"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("[possible values: true, false]"), "{e}");
    }

    #[test]
    fn numbers_out_of_range_are_usage_errors_in_plain_words() {
        let e = Cli::try_parse_from(["cosched", "vm", "priority", "vm1", "-5"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let text = e.to_string();
        assert!(text.contains("invalid value '-5' for '<PRIORITY>': must be a whole number from 1 to 98"), "{text}");
        assert!(!text.contains("u8"), "{text}");
        let e = Cli::try_parse_from(["cosched", "disable", "disk"]).unwrap_err();
        assert!(e.to_string().contains("unknown resource \"disk\" (known: cpu, io, membw, event)"), "{e}");
        let e = Cli::try_parse_from(["cosched", "vm", "static", "vm1"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--fifo <BOOL>"), "{e}");
    }

    #[test]
    fn the_role_is_inferred_from_the_configs_unless_told() {
        assert_eq!(Role::infer(None, true, false), Role::Guest);
        assert_eq!(Role::infer(None, true, true), Role::Host);
        assert_eq!(Role::infer(None, false, false), Role::Host);
        assert_eq!(Role::infer(Some("all"), true, false), Role::All);
        assert_eq!(Role::infer(Some("guest"), false, true), Role::Guest);
        assert_eq!(Role::infer(Some("bogus"), true, false), Role::Guest);
    }

    /// Each role's `--help` offers its own commands; the others still run.
    #[test]
    fn each_role_offers_its_commands() {
        let offered = |role| -> Vec<String> {
            command_for(role).get_subcommands().filter(|c| !c.is_hide_set()).map(|c| c.get_name().to_string()).collect()
        };
        let guest = offered(Role::Guest);
        assert!(guest.contains(&"guest".into()) && guest.contains(&"request-membw".into()), "{guest:?}");
        assert!(!guest.iter().any(|c| HOST_ONLY.contains(&c.as_str())), "{guest:?}");
        let host = offered(Role::Host);
        assert!(host.contains(&"status".into()) && host.contains(&"check-config".into()), "{host:?}");
        assert!(!host.iter().any(|c| GUEST_ONLY.contains(&c.as_str())), "{host:?}");
        assert!(offered(Role::All).len() >= HOST_ONLY.len() + GUEST_ONLY.len());
        let help = command_for(Role::Guest).render_help().to_string();
        assert!(!help.contains("check-config") && help.contains("request-membw"), "{help}");
        // Hidden, and still parsed.
        use clap::FromArgMatches;
        let m = command_for(Role::Guest).try_get_matches_from(["cosched", "status", "--json"]).unwrap();
        assert!(matches!(Cli::from_arg_matches(&m).unwrap().cmd, Cmd::Status { json: true, .. }));
    }

    #[test]
    fn config_is_refused_where_it_means_nothing() {
        let cli = Cli::try_parse_from(["cosched", "--config", "/x.toml", "request-membw", "100"]).unwrap();
        assert!(cli.misuse().unwrap().contains("--config means nothing to request-membw"));
        let cli = Cli::try_parse_from(["cosched", "--config", "/x.toml", "guest"]).unwrap();
        assert_eq!(cli.misuse(), None, "guest reads it: its guest.toml");
    }
}
