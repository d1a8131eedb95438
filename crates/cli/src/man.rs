//! `cosched generate man DIR`: the manual, section 8 (system administration). `cosched(8)` and a
//! page per command (`cosched-host(8)`, `cosched-guest(8)`, `cosched-vm-membw(8)`, ...), each
//! with NAME, SYNOPSIS, DESCRIPTION and OPTIONS from the command line's definition, then
//! EXAMPLES, FILES, EXIT STATUS, SIGNALS where the command has signals to speak of, METRICS for
//! the daemon, and SEE ALSO, written here.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;

use crate::cli;

/// The manual's section.
const SECTION: &str = "8";

/// Writes every page into `dir` (created if needed).
pub fn generate(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut cmd = without_help(cli::command_for(cli::Role::All));
    cmd.build();
    for (name, text) in pages(&cmd)? {
        let path = dir.join(format!("{name}.{SECTION}"));
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    for (file, text) in extra_pages() {
        let path = dir.join(file);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The pages not generated from the command line, by file name (with its section):
/// cosched-host.toml(5), from the configuration's reference. scripts/package.sh installs every
/// file by its section.
pub fn extra_pages() -> Vec<(String, String)> {
    use cosched_host::config_reference::{render, Format};
    vec![("cosched-host.toml.5".into(), render(Format::Man))]
}

/// No `help` subcommand anywhere: it has no page (`cosched help X` is `cosched X --help`).
fn without_help(cmd: clap::Command) -> clap::Command {
    let names: Vec<String> = cmd.get_subcommands().map(|s| s.get_name().to_string()).collect();
    let cmd = cmd.disable_help_subcommand(true);
    names.iter().fold(cmd, |cmd, n| cmd.mut_subcommand(n, without_help))
}

/// Every page of the built command `cmd` and its visible subcommands: (name, roff text).
fn pages(cmd: &clap::Command) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let name = cmd.get_display_name().unwrap_or(cmd.get_name()).to_string();
    out.push((name.clone(), page(cmd, &name)?));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        out.extend(pages(sub)?);
    }
    Ok(out)
}

/// One page: clap's sections, then ours; backticks as bold.
fn page(cmd: &clap::Command, name: &str) -> anyhow::Result<String> {
    let man = clap_mangen::Man::new(cmd.clone())
        .title(name.to_uppercase())
        .section(SECTION)
        .source(format!("cosched {}", env!("CARGO_PKG_VERSION")))
        .manual("System Manager's Manual");
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut out)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(&mut out)?;
    }
    let mut text = String::from_utf8(out).context("clap_mangen's page")?;
    text += &sections(name);
    Ok(backticks_to_bold(&text))
}

/// `` `x` `` in running text as bold `x`: clap's help is plain text, where backticks mark
/// commands and keys.
fn backticks_to_bold(roff: &str) -> String {
    roff.lines()
        .map(|line| {
            let parts: Vec<&str> = line.split('`').collect();
            if parts.len() < 3 || line.starts_with('.') && !line.starts_with(".IP") {
                return line.replace('`', "\\(aq");
            }
            let mut s = String::new();
            for (i, p) in parts.iter().enumerate() {
                if i > 0 {
                    // Odd pieces are inside backticks; a last unpaired one stays a quote.
                    let closing = i % 2 == 0;
                    s += if closing {
                        "\\fR"
                    } else if i == parts.len() - 1 {
                        "\\(aq"
                    } else {
                        "\\fB"
                    };
                }
                s += p;
            }
            s
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// Text for roff: backslashes and dashes escaped, no line starting with a control character.
fn esc(text: &str) -> String {
    let t = text.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with('.') || t.starts_with('\'') {
        format!("\\&{t}")
    } else {
        t
    }
}

/// A section of paragraphs.
fn section(out: &mut String, title: &str, paragraphs: &[&str]) {
    let _ = writeln!(out, ".SH {title}");
    for (i, p) in paragraphs.iter().enumerate() {
        if i > 0 {
            out.push_str(".PP\n");
        }
        let _ = writeln!(out, "{}", esc(p));
    }
}

/// A section of tagged paragraphs: (tag in bold, text).
fn tagged(out: &mut String, title: &str, items: &[(&str, &str)]) {
    if items.is_empty() {
        return;
    }
    let _ = writeln!(out, ".SH {title}");
    for (tag, text) in items {
        let _ = writeln!(out, ".TP\n\\fB{}\\fR\n{}", esc(tag), esc(text));
    }
}

/// EXAMPLES: each a comment and its command line, verbatim.
fn examples(out: &mut String, items: &[(&str, &str)]) {
    if items.is_empty() {
        return;
    }
    out.push_str(".SH EXAMPLES\n");
    for (what, command) in items {
        let _ = writeln!(out, ".PP\n{}\n.PP\n.RS 4\n.nf\n\\fB{}\\fR\n.fi\n.RE", esc(what), esc(command));
    }
}

const CONFIG: (&str, &str) = (
    "/etc/cosched/host.toml",
    "The host daemon's config (TOML; every key optional, an unknown key an error). Check it with `cosched \
     check-config`. The operator commands read control_socket and state_dir from it; when it cannot be read they \
     warn, and go on with what can be read of it and the defaults.",
);
const SOCKETS: (&str, &str) = (
    "/run/cosched/vms/VM.sock",
    "A VM's chardev socket (config socket_dir): every socket there is a VM, named by the file's name without .sock.",
);
const CONTROL: (&str, &str) = (
    "/run/cosched/control.sock",
    "The control socket of the operator commands (config control_socket): root and the user the daemon runs as may \
     connect.",
);
const STATE: (&str, &str) = (
    "/run/cosched/state",
    "The original settings of every thread, group and IRQ the daemon changed, until restored (config state_dir; a \
     tmpfs, so a reboot forgets them with the changes), and operator.state: the settings the operator changed at run \
     time (enable, disable, vm ..., membw), given back at the next start until `cosched reset`.",
);
const HOST_UNIT: (&str, &str) = (
    "/lib/systemd/system/cosched-host.service",
    "The host daemon's unit: `cosched restore` runs after every stop of it (ExecStopPost).",
);
const PORT: (&str, &str) = (
    "/dev/virtio-ports/org.cosched.0",
    "In the guest: the virtio-serial port to the host (found by its name in /sys/class/virtio-ports/*/name).",
);
const GUEST_CONFIG: (&str, &str) = (
    "/etc/cosched/guest.toml",
    "In the guest: the agent's config, one key per option of `cosched guest` without its dashes (--min-boost-us is \
     min_boost_us); options on the command line win. `cosched --config FILE guest` reads FILE instead.",
);
const MEMBW_SOCKET: (&str, &str) =
    ("/run/cosched/membw.sock", "In the guest: the agent's local socket for `cosched request-membw`.");
const GUEST_UNIT: (&str, &str) = (
    "/lib/systemd/system/cosched-guest.service",
    "The guest agent's unit, started by udev (/lib/udev/rules.d/60-cosched.rules) when the port appears.",
);

/// The role variable, in ENVIRONMENT.
const ROLE: (&str, &str) = (
    "COSCHED_ROLE",
    "Which commands --help offers: host (the daemon, the operator commands, restore and check-config), guest \
     (guest and request-membw) or all. Unset, a system with /etc/cosched/guest.toml and without \
     /etc/cosched/host.toml (the cosched-guest package) is a guest, any other a host. The commands not offered \
     still run when named.",
);

/// EXIT STATUS of the operator commands.
const OPERATOR_EXIT: [(&str, &str); 4] = [
    ("0", "Done (a change printed what it changed)."),
    ("1", "An error, a request the daemon refused included (the reason is printed on standard error)."),
    ("2", "Wrong usage: an unknown option, a value out of its range."),
    ("3", "The host daemon is not running: nothing listens at its control socket (as systemctl(1) exits 3 for a unit that is not active)."),
];

/// SIGNALS of the host daemon (what it does at this version).
const HOST_SIGNALS: [(&str, &str); 3] = [
    (
        "SIGTERM, SIGINT",
        "Put back every thread, group and IRQ the daemon changed, remove its control socket, and exit 0.",
    ),
    (
        "SIGHUP",
        "Read the config file again and apply only what changed, as `cosched reload` does (systemctl reload \
         cosched-host sends it): a file that does not load changes nothing, and changed keys that need a restart are \
         logged and left as they run. Also rescan the socket directory at once, retrying every socket not connected \
         without waiting for its back-off.",
    ),
    (
        "SIGKILL",
        "Nothing is put back by the daemon itself: its records stay in the state directory, and `cosched restore` (the \
         unit's ExecStopPost) or the next start puts everything back.",
    ),
];

/// The page's own sections, by its name.
fn sections(name: &str) -> String {
    let mut out = String::new();
    let op = |out: &mut String, ex: &[(&str, &str)], files: &[(&str, &str)], see: &[&str]| {
        examples(out, ex);
        tagged(out, "FILES", files);
        tagged(out, "EXIT STATUS", &OPERATOR_EXIT);
        see_also(out, see);
    };
    match name {
        "cosched" => {
            examples(
                &mut out,
                &[
                    ("Check the config before (re)starting the daemon:", "cosched check-config"),
                    (
                        "What the daemon does, then one VM with its threads:",
                        "cosched status\ncosched status vm1 --threads",
                    ),
                    ("The VMs and their levels, for a script:", "cosched vm list --json"),
                    ("Turn coordination off for the whole host, then on again:", "cosched disable\ncosched enable"),
                    ("Stop coordinating one VM's CPU:", "cosched vm disable vm1 cpu"),
                    ("After a crash of the daemon, put every thread back:", "cosched restore"),
                ],
            );
            tagged(
                &mut out,
                "FILES",
                &[CONFIG, SOCKETS, CONTROL, STATE, HOST_UNIT, GUEST_CONFIG, PORT, MEMBW_SOCKET, GUEST_UNIT],
            );
            tagged(&mut out, "EXIT STATUS", &OPERATOR_EXIT);
            tagged(&mut out, "SIGNALS", &HOST_SIGNALS);
            tagged(&mut out, "ENVIRONMENT", &[ROLE]);
            section(
                &mut out,
                "METRICS",
                &["`cosched metrics`, and with metrics_listen HTTP, export the daemon's figures in the Prometheus text \
                   format; cosched-metrics(8) lists every family. cosched_build_info{version,commit} is 1, labelled \
                   with the daemon's version and the git commit it was built from."],
            );
            see_also(
                &mut out,
                &[
                    "cosched-host",
                    "cosched-guest",
                    "cosched-status",
                    "cosched-vm",
                    "cosched-check-config",
                    "cosched-restore",
                ],
            );
            see_also(&mut out, &["cosched-host.toml(5)", "systemctl(1)", "sched(7)"]);
        }
        "cosched-host" => {
            examples(
                &mut out,
                &[
                    ("As the package runs it:", "systemctl start cosched-host"),
                    ("By hand, logging every boost:", "cosched --config /etc/cosched/host.toml host -v"),
                    (
                        "Check a changed config, then apply it:",
                        "cosched check-config && cosched reload  # or systemctl reload cosched-host",
                    ),
                ],
            );
            tagged(&mut out, "FILES", &[CONFIG, SOCKETS, CONTROL, STATE, HOST_UNIT]);
            privileges(&mut out);
            tagged(
                &mut out,
                "EXIT STATUS",
                &[
                    ("0", "Stopped by SIGTERM or SIGINT, with every change put back."),
                    ("1", "Could not start: the config, the privileges, another daemon on the same state directory."),
                    ("2", "Wrong usage."),
                ],
            );
            tagged(&mut out, "SIGNALS", &HOST_SIGNALS);
            section(
                &mut out,
                "METRICS",
                &["With metrics_listen (or --metrics-listen), the daemon serves its metrics over HTTP; cosched-metrics(8) \
                   lists them, cosched_build_info among them."],
            );
            see_also(
                &mut out,
                &["cosched", "cosched-restore", "cosched-check-config", "cosched-status", "cosched-metrics"],
            );
            see_also(&mut out, &["cosched-host.toml(5)"]);
        }
        "cosched-guest" => {
            examples(
                &mut out,
                &[
                    (
                        "As the package runs it (started by udev when the port appears):",
                        "systemctl status cosched-guest",
                    ),
                    ("By hand, with its counters every 10 s:", "cosched guest -v --stats-interval-s 10"),
                    (
                        "Keep boosts at least 800 µs: in /etc/cosched/guest.toml, then restart the agent:",
                        "min_boost_us = 800\nsystemctl restart cosched-guest",
                    ),
                    (
                        "An application asks for 20% of the host's guaranteed memory bandwidth:",
                        "cosched request-membw 200",
                    ),
                ],
            );
            tagged(&mut out, "FILES", &[GUEST_CONFIG, PORT, MEMBW_SOCKET, GUEST_UNIT]);
            tagged(
                &mut out,
                "EXIT STATUS",
                &[
                    ("0", "Stopped by SIGTERM or SIGINT, or the port went away."),
                    ("1", "Could not start: no port, no privileges for its eBPF detectors."),
                    ("2", "Wrong usage."),
                ],
            );
            tagged(
                &mut out,
                "SIGNALS",
                &[(
                    "SIGTERM, SIGINT",
                    "Detach the detectors, deregister (the host deboosts the VM at once) and exit 0.",
                )],
            );
            see_also(&mut out, &["cosched", "cosched-request-membw", "cosched-host"]);
        }
        "cosched-request-membw" => {
            examples(
                &mut out,
                &[("Ask for 20%, then give it back:", "cosched request-membw 200\ncosched request-membw 0")],
            );
            tagged(&mut out, "FILES", &[MEMBW_SOCKET]);
            tagged(
                &mut out,
                "EXIT STATUS",
                &[
                    ("0", "Granted (maybe lowered)."),
                    ("1", "Refused, or the agent cannot be reached."),
                    ("2", "Wrong usage."),
                ],
            );
            see_also(&mut out, &["cosched-guest", "cosched-vm-membw", "cosched-membw"]);
        }
        "cosched-status" => op(
            &mut out,
            &[
                ("The host and every VM:", "cosched status"),
                ("One VM, by name or QEMU pid, with each thread's settings:", "cosched status vm1 --threads"),
                ("Live, redrawn every second:", "cosched status --watch"),
                ("For a script (schema_version says the keys' version):", "cosched status --json"),
            ],
            &[CONTROL, CONFIG],
            &["cosched", "cosched-vm-list", "cosched-metrics"],
        ),
        "cosched-enable" => op(
            &mut out,
            &[
                ("Every resource, for the whole host:", "cosched enable"),
                ("Only memory bandwidth:", "cosched enable membw"),
            ],
            &[CONTROL, CONFIG],
            &["cosched", "cosched-disable", "cosched-vm-enable"],
        ),
        "cosched-disable" => op(
            &mut out,
            &[
                ("Every resource, for the whole host:", "cosched disable"),
                ("Only memory bandwidth:", "cosched disable membw"),
                (
                    "The static tunings stay through `cosched disable`; take them off too, for every VM:",
                    "cosched disable --all",
                ),
                ("Or only one VM's:", "cosched vm static vm1 --fifo false --guard false --shield off"),
            ],
            &[CONTROL, CONFIG],
            &["cosched", "cosched-enable", "cosched-vm-disable", "cosched-vm-static"],
        ),
        "cosched-reload" => op(
            &mut out,
            &[
                ("Check the edited config, then apply it:", "cosched check-config && cosched reload"),
                ("The same through systemd:", "systemctl reload cosched-host"),
            ],
            &[CONTROL, CONFIG],
            &["cosched", "cosched-check-config", "cosched-reset", "cosched-host.toml(5)"],
        ),
        "cosched-reset" | "cosched-vm-reset" => op(
            &mut out,
            &[
                ("Every setting the operator changed, back to the config:", "cosched reset"),
                ("Only vm1's:", "cosched vm reset vm1"),
            ],
            &[CONTROL, CONFIG, STATE],
            &["cosched", "cosched-reload", "cosched-vm"],
        ),
        "cosched-vm" | "cosched-vm-list" => op(
            &mut out,
            &[
                ("The VMs, their agents and levels:", "cosched vm list"),
                ("Rank vm1 above the others when boosted:", "cosched vm priority vm1 10"),
            ],
            &[CONTROL, CONFIG],
            &["cosched", "cosched-status"],
        ),
        "cosched-vm-enable" | "cosched-vm-disable" => op(
            &mut out,
            &[
                (
                    "One resource of one VM (by name or QEMU pid):",
                    if name.ends_with("enable") { "cosched vm enable vm1 cpu" } else { "cosched vm disable vm1 cpu" },
                ),
                (
                    "Every resource of it:",
                    if name.ends_with("enable") { "cosched vm enable vm1" } else { "cosched vm disable vm1" },
                ),
            ],
            &[CONTROL, CONFIG],
            &["cosched-vm", "cosched-enable", "cosched-disable", "cosched-status"],
        ),
        "cosched-vm-priority" => op(
            &mut out,
            &[("Boost vm1 at SCHED_RR 10:", "cosched vm priority vm1 10")],
            &[CONTROL, CONFIG],
            &["cosched-vm", "cosched-vm-ceiling"],
        ),
        "cosched-vm-ceiling" => op(
            &mut out,
            &[("Map vm1's guest priorities at most to FIFO 30:", "cosched vm ceiling vm1 30")],
            &[CONTROL, CONFIG],
            &["cosched-vm", "cosched-vm-priority"],
        ),
        "cosched-vm-static" => op(
            &mut out,
            &[
                (
                    "vm1's vCPUs at SCHED_FIFO on their own host CPU 3, bounded by the real-time guard:",
                    "cosched vm static vm1 --fifo true --guard true --shield 3",
                ),
                ("Undo it:", "cosched vm static vm1 --fifo false --guard false --shield off"),
            ],
            &[CONTROL, CONFIG, STATE],
            &["cosched-vm", "cosched-disable"],
        ),
        "cosched-vm-membw" => op(
            &mut out,
            &[("Guarantee vm1 30% of the host's memory bandwidth:", "cosched vm membw vm1 300")],
            &[CONTROL, CONFIG],
            &["cosched-vm", "cosched-membw", "cosched-request-membw"],
        ),
        "cosched-membw" => op(
            &mut out,
            &[
                ("Show the regulation:", "cosched membw"),
                (
                    "A 50 ms period, with reclaim and without best effort:",
                    "cosched membw --period-ms 50 --reclaim true --best-effort false",
                ),
            ],
            &[CONTROL, CONFIG],
            &["cosched-vm-membw", "cosched-request-membw", "cosched-status"],
        ),
        "cosched-metrics" => {
            examples(
                &mut out,
                &[
                    ("Through the control socket:", "cosched metrics"),
                    ("Over HTTP, with metrics_listen = \"127.0.0.1:9477\":", "curl -s http://127.0.0.1:9477/metrics"),
                ],
            );
            metrics(&mut out);
            tagged(&mut out, "FILES", &[CONTROL, CONFIG]);
            tagged(&mut out, "EXIT STATUS", &OPERATOR_EXIT);
            see_also(&mut out, &["cosched", "cosched-status", "cosched-host"]);
        }
        "cosched-restore" => {
            examples(
                &mut out,
                &[
                    ("After the daemon was killed (the unit does this itself):", "cosched restore"),
                    ("Another daemon's state directory:", "cosched restore --state-dir /run/cosched-test/state"),
                ],
            );
            tagged(&mut out, "FILES", &[STATE, CONFIG]);
            tagged(
                &mut out,
                "EXIT STATUS",
                &[
                    ("0", "Everything recorded was put back (or was gone, or changed by someone else since)."),
                    ("1", "A daemon runs; a state directory given does not exist; or a setting could not be put back (each is named; its record is kept)."),
                    ("2", "Wrong usage."),
                ],
            );
            see_also(&mut out, &["cosched", "cosched-host"]);
        }
        "cosched-check-config" => {
            examples(
                &mut out,
                &[
                    ("The installed config:", "cosched check-config"),
                    ("A new one, before installing it:", "cosched check-config ./host.toml"),
                    ("For a script:", "cosched check-config --json"),
                ],
            );
            tagged(&mut out, "FILES", &[CONFIG]);
            tagged(
                &mut out,
                "EXIT STATUS",
                &[
                    ("0", "The daemon would start with it (warnings are printed)."),
                    ("1", "Errors: each is printed with its line and key where known."),
                    ("2", "Wrong usage."),
                ],
            );
            see_also(&mut out, &["cosched", "cosched-host"]);
            see_also(&mut out, &["cosched-host.toml(5)"]);
        }
        _ => {
            tagged(&mut out, "EXIT STATUS", &OPERATOR_EXIT);
            see_also(&mut out, &["cosched"]);
        }
    }
    out
}

/// SEE ALSO: these pages, of section 8 unless named with theirs ("systemctl(1)"). A second
/// call adds to the first's list.
fn see_also(out: &mut String, pages: &[&str]) {
    if out.ends_with(")\n") && out.contains(".SH \"SEE ALSO\"\n") {
        out.insert(out.len() - 1, ',');
    } else if !out.ends_with(".SH \"SEE ALSO\"\n") {
        out.push_str(".SH \"SEE ALSO\"\n");
    }
    let refs: Vec<String> = pages
        .iter()
        .map(|p| match p.split_once('(') {
            Some((name, section)) => format!(".BR {} ({section}", esc(name)),
            None => format!(".BR {} ({SECTION})", esc(p)),
        })
        .collect();
    out.push_str(&refs.join(",\n"));
    out.push('\n');
}

/// PRIVILEGES: what each feature needs, from the daemon's own list.
fn privileges(out: &mut String) {
    use cosched_host::caps::{name, FEATURES, USED};
    let used: Vec<&str> = USED.iter().map(|c| name(*c)).collect();
    section(
        out,
        "PRIVILEGES",
        &[&format!(
            "The daemon needs neither uid 0 nor CAP_SYS_ADMIN: it runs as root, or as any user with the capabilities \
             below (the unit's CapabilityBoundingSet: {}). CAP_SYS_NICE is required; without another, the features \
             it serves are off, and the daemon says which at start. Its control socket accepts root and the user \
             the daemon runs as.",
            used.join(", ")
        )],
    );
    for f in FEATURES {
        let needs: Vec<String> =
            f.needs.iter().map(|all| all.iter().map(|c| name(*c)).collect::<Vec<_>>().join(" and ")).collect();
        let mut needs = needs.join(", or ");
        if f.root_owns {
            needs += ", or uid 0 (it writes files root owns)";
        }
        let _ = writeln!(out, ".TP\n{}\n{}", esc(f.name), esc(&needs));
    }
}

/// METRICS: every family the daemon exports.
fn metrics(out: &mut String) {
    out.push_str(".SH METRICS\n");
    out.push_str(&esc(
        "Each family with its type. Per-VM series carry a vm label, per-resource ones a resource label (cpu, io, membw, \
         event); cosched_build_info is labelled version and commit.",
    ));
    out.push('\n');
    for (name, kind, help) in cosched_host::metrics::families() {
        let _ = writeln!(out, ".TP\n\\fB{}\\fR ({})\n{}", esc(name), kind.name(), esc(help));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<(String, String)> {
        let mut cmd = without_help(cli::command_for(cli::Role::All));
        cmd.build();
        pages(&cmd).unwrap()
    }

    #[test]
    fn every_page_has_the_sections_and_no_backticks_nor_help_page() {
        let pages = all();
        let names: Vec<&str> = pages.iter().map(|p| p.0.as_str()).collect();
        for want in ["cosched", "cosched-host", "cosched-guest", "cosched-vm-membw", "cosched-check-config"] {
            assert!(names.contains(&want), "{names:?}");
        }
        assert!(!names.iter().any(|n| n.ends_with("-help") || n.contains("generate")), "{names:?}");
        for (name, text) in &pages {
            for s in ["NAME", "SYNOPSIS", "DESCRIPTION", "EXIT STATUS", "\"SEE ALSO\""] {
                assert!(text.contains(&format!("\n.SH {s}\n")), "{name}: no {s}");
            }
            assert!(text.contains(&format!("\n.TH {} 8 ", name.to_uppercase())), "{name}: {}", &text[..200]);
            assert!(!text.contains('`'), "{name}: a backtick shows");
            assert!(!text.contains("cosched-help"), "{name}");
        }
        let top = &pages.iter().find(|p| p.0 == "cosched").unwrap().1;
        for s in ["EXAMPLES", "FILES", "SIGNALS", "METRICS", "ENVIRONMENT"] {
            assert!(top.contains(&format!("\n.SH {s}\n")), "cosched: no {s}");
        }
        assert!(top.contains("cosched_build_info") && top.contains("COSCHED_ROLE"));
        for page in ["cosched", "cosched-host", "cosched-check-config"] {
            let text = &pages.iter().find(|p| p.0 == page).unwrap().1;
            assert!(text.contains(".BR cosched\\-host.toml (5)"), "{page}: no cosched-host.toml(5) in SEE ALSO");
        }
        let host = &pages.iter().find(|p| p.0 == "cosched-host").unwrap().1;
        assert!(host.contains("\n.SH PRIVILEGES\n") && host.contains("CAP_SYS_NICE"), "{host}");
        let metrics = &pages.iter().find(|p| p.0 == "cosched-metrics").unwrap().1;
        assert!(metrics.contains("\\fBcosched_vm_boosts_total\\fR (counter)"), "{metrics}");
    }

    #[test]
    fn backticks_become_bold() {
        assert_eq!(backticks_to_bold("run `cosched restore` now\n"), "run \\fBcosched restore\\fR now\n");
        assert_eq!(backticks_to_bold("a lone ` here\n"), "a lone \\(aq here\n");
    }
}
