//! `cosched`: one binary for the host daemon, the guest agent and the operator commands.
//!
//! - [`cli`]: the command line's definition (and [`parse`]: how its values are read);
//! - [`ops`]: the operator commands that talk to the daemon, and where they find it;
//! - [`status`]: the daemon's status for people;
//! - [`restore`], [`check`]: the commands that work without a daemon;
//! - [`man`]: the man pages.
//!
//! Exit status: 0 done, 1 error, 2 wrong usage (clap's), 3 the daemon is not running.

use std::path::Path;

use anyhow::Context;
use cosched_host::control::ControlError;

mod check;
mod cli;
mod guest_config;
mod guest_reference;
mod man;
mod ops;
mod parse;
mod restore;
mod runtime;
mod status;

use cli::{Cmd, GenerateCmd, HostArgs, ReferenceFormat};

/// The exit status for an error: 3 if the daemon is not running, else 1.
fn exit_code(e: &anyhow::Error) -> i32 {
    let not_running = e.chain().any(|c| c.downcast_ref::<ControlError>().is_some_and(ControlError::not_running));
    if not_running {
        3
    } else {
        1
    }
}

fn run_host(config: Option<&Path>, a: HostArgs) -> anyhow::Result<()> {
    // Root, or the capabilities cosched-host(8) lists under PRIVILEGES: at least CAP_SYS_NICE,
    // without which no boost can change another process's thread.
    let caps = cosched_host::caps::Caps::read(Path::new("/proc/self/status"))?;
    if !caps.has(cosched_host::caps::CAP_SYS_NICE) {
        anyhow::bail!(
            "`cosched host` needs root, or at least CAP_SYS_NICE (it changes the scheduling of QEMU threads); the \
             capabilities each feature needs are in `man cosched-host`, PRIVILEGES"
        );
    }
    // The file and the command line's overrides: what a reload reads again.
    let source = cosched_host::reload::Source {
        path: config.map(Path::to_path_buf),
        socket_dir: a.socket_dir,
        state_dir: a.state_dir,
        control_socket: a.control_socket,
        metrics_listen: a.metrics_listen,
        disabled: a.disabled,
    };
    let cfg = source.load()?;
    cosched_host::log::set_verbosity(if a.quiet { 0 } else { 1 + a.verbose });
    cosched_host::daemon::Daemon::new(cfg)?.with_source(source).run()
}

fn run(cli: cli::Cli) -> anyhow::Result<()> {
    let config = cli.config.as_deref();
    let socket = |explicit| ops::socket(config, explicit);
    match cli.cmd {
        Cmd::Host(a) => run_host(config, a),
        Cmd::Guest(_) => {
            // The config file's options, then the command line's (which win).
            let argv: Vec<String> = std::env::args().collect();
            let opts = guest_config::options(config, &guest_config::guest_args(&argv))?;
            cosched_agent::run(opts)
        }
        Cmd::Status { vm, watch: true, interval_ms, count, control_socket, .. } => {
            status::watch(&socket(control_socket), interval_ms, count, vm.as_deref())
        }
        Cmd::Status { vm, json: true, control_socket, .. } => {
            // The daemon's JSON as it sent it; with a VM, only that VM in "vms".
            let socket = socket(control_socket);
            let out = match vm {
                None => status::json(&socket)?,
                Some(key) => serde_json::to_value(status::only(status::get(&socket)?, &key)?)?,
            };
            println!("{}", serde_json::to_string_pretty(&out)?);
            Ok(())
        }
        Cmd::Status { vm, threads, control_socket, .. } => {
            let s = status::get(&socket(control_socket))?;
            match vm {
                None => print!("{}", status::text_with(&s, threads)),
                Some(key) => print!("{}", status::vm_text(&status::only(s, &key)?.vms[0], threads)),
            }
            Ok(())
        }
        Cmd::Enable { resource, json, control_socket } => {
            ops::switch_host(&socket(control_socket), resource, true, false, json)
        }
        Cmd::Disable { resource, all, json, control_socket } => {
            ops::switch_host(&socket(control_socket), resource, false, all, json)
        }
        Cmd::Reload { json, control_socket } => runtime::reload(&socket(control_socket), json),
        Cmd::Reset { json, control_socket } => runtime::reset(&socket(control_socket), None, json),
        Cmd::Vm { cmd, json, control_socket } => ops::vm(&socket(control_socket), cmd, json),
        Cmd::Membw { period_ms, reclaim, best_effort, json, control_socket } => {
            ops::membw(&socket(control_socket), period_ms, reclaim, best_effort, json)
        }
        Cmd::Metrics { control_socket } => ops::metrics(&socket(control_socket)),
        Cmd::RequestMembw { share, socket } => {
            let reply = cosched_agent::membw_request(&socket, share)?;
            println!("{reply}");
            Ok(())
        }
        Cmd::Restore { state_dir, json } => restore::restore(config, state_dir, json),
        Cmd::CheckConfig { file, json } => check::run(file.as_deref().or(config), json),
        Cmd::Generate(GenerateCmd::Man { dir }) => man::generate(&dir),
        Cmd::Generate(GenerateCmd::GuestConfig) => {
            print!("{}", guest_config::commented_default());
            Ok(())
        }
        Cmd::Generate(GenerateCmd::ConfigReference { format }) => {
            use cosched_host::config_reference::{render, Format};
            print!(
                "{}",
                match format {
                    // The host's keys, then the guest agent's.
                    ReferenceFormat::Markdown => guest_reference::configuration_md(),
                    ReferenceFormat::Toml => render(Format::Toml),
                    ReferenceFormat::Man => render(Format::Man),
                }
            );
            Ok(())
        }
        Cmd::Generate(GenerateCmd::Completions { shell }) => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cli::command_for(cli::Role::All), "cosched", &mut script);
            std::io::Write::write_all(&mut std::io::stdout(), &script).context("writing the completion script")
        }
    }
}

fn main() {
    let cli = cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("cosched: error: {e:#}");
        std::process::exit(exit_code(&e));
    }
}
