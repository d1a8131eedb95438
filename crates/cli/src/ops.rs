//! The operator commands that talk to the running daemon through its control socket, and where
//! they find it: each state-changing command prints one line saying what it changed.

use std::path::{Path, PathBuf};

use anyhow::Context;
use cosched_host::config::{HostConfig, DEFAULT_CONFIG};
use cosched_host::control::{request, MetricsReply, Request};
use serde::Serialize;

use crate::cli::VmCmd;
use crate::status;

/// The config as an operator command reads it: loaded whole, or, where it cannot be, the paths
/// it still gives and the defaults for the rest, with a warning saying why. A broken config
/// must not keep an operator from turning coordination off or restoring threads.
pub fn host_config(config: Option<&Path>) -> HostConfig {
    let error = match HostConfig::load(config) {
        Ok(cfg) => return cfg,
        Err(e) => e,
    };
    let path = config.unwrap_or(Path::new(DEFAULT_CONFIG));
    let (cfg, taken) = match std::fs::read_to_string(path) {
        Ok(text) => cosched_host::config::check::salvage(&text),
        Err(_) => (HostConfig::default(), Vec::new()),
    };
    let why = crate::check::first_error(path).unwrap_or_else(|| format!("{error:#}"));
    let using = if taken.is_empty() {
        "the defaults".to_string()
    } else {
        format!("{} from it and the defaults for the rest", taken.join(", "))
    };
    eprintln!(
        "cosched: warning: cannot load the config: {why}; going on with {using} (`cosched check-config` lists every \
         error)"
    );
    cfg
}

/// The control socket: given on the command line, or the config's.
pub fn socket(config: Option<&Path>, explicit: Option<PathBuf>) -> PathBuf {
    explicit.unwrap_or_else(|| host_config(config).control_socket)
}

/// "every resource", or the one named.
fn what(resource: &Option<String>) -> &str {
    resource.as_deref().unwrap_or("every resource")
}

/// The version of the JSON a change prints with `--json`.
pub const CHANGE_SCHEMA_VERSION: u32 = 1;

/// What a change prints with `--json`.
#[derive(Debug, Serialize)]
struct Change<'a> {
    schema_version: u32,
    /// The request the daemon carried out, as the control socket carries it.
    changed: &'a Request,
    /// The line printed without `--json`.
    summary: &'a str,
}

/// Sends `req`, then says what it changed: `line`, or with `json` a [`Change`].
fn change(socket: &Path, req: &Request, line: &str, json: bool) -> anyhow::Result<()> {
    request(socket, req)?;
    if json {
        let out = Change { schema_version: CHANGE_SCHEMA_VERSION, changed: req, summary: line };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("{line}");
    }
    Ok(())
}

/// `cosched enable [RESOURCE]`, `cosched disable [RESOURCE | --all]`: for the whole host.
pub fn switch_host(socket: &Path, resource: Option<String>, on: bool, all: bool, json: bool) -> anyhow::Result<()> {
    let line = match (on, all) {
        (false, true) => "disabled every resource and the static tunings for the whole host".to_string(),
        _ => format!("{} {} for the whole host", if on { "enabled" } else { "disabled" }, what(&resource)),
    };
    let req = if on { Request::Enable { vm: None, resource } } else { Request::Disable { vm: None, resource, all } };
    change(socket, &req, &line, json)
}

/// `cosched vm ...`.
pub fn vm(socket: &Path, cmd: VmCmd, json: bool) -> anyhow::Result<()> {
    let (req, line) = match cmd {
        VmCmd::List => return list(socket, json),
        VmCmd::Reset { vm } => return crate::runtime::reset(socket, Some(vm), json),
        VmCmd::Enable { vm, resource } => {
            let line = format!("{vm}: enabled {}", what(&resource));
            (Request::Enable { vm: Some(vm), resource }, line)
        }
        VmCmd::Disable { vm, resource } => {
            let line = format!("{vm}: disabled {}", what(&resource));
            (Request::Disable { vm: Some(vm), resource, all: false }, line)
        }
        VmCmd::Priority { vm, priority } => {
            let line = format!("{vm}: priority {priority}");
            (Request::Priority { vm, priority }, line)
        }
        VmCmd::Static { vm, fifo, shield, guard } => {
            let mut changed = Vec::new();
            if let Some(f) = fifo {
                changed.push(format!("fifo {f}"));
            }
            if let Some(g) = guard {
                changed.push(format!("guard {g}"));
            }
            if let Some(s) = &shield {
                changed.push(format!("shield {s}"));
            }
            let line = format!("{vm}: static {}", changed.join(", "));
            (Request::Static { vm, fifo, shield, guard }, line)
        }
        VmCmd::Ceiling { vm, ceiling } => {
            let line = format!("{vm}: RT ceiling {ceiling}");
            (Request::Ceiling { vm, ceiling }, line)
        }
        VmCmd::Membw { vm, share } => {
            let line = format!("{vm}: memory-bandwidth share {share}‰");
            (Request::MembwShare { vm, share }, line)
        }
    };
    change(socket, &req, &line, json)
}

/// `cosched membw`: with options, changes the regulation and says what; without, shows it.
pub fn membw(
    socket: &Path,
    period_ms: Option<u64>,
    reclaim: Option<bool>,
    best_effort: Option<bool>,
    json: bool,
) -> anyhow::Result<()> {
    if period_ms.is_none() && reclaim.is_none() && best_effort.is_none() {
        let s = status::get(socket)?;
        if json {
            #[derive(Serialize)]
            struct Out {
                schema_version: u32,
                #[serde(flatten)]
                membw: cosched_status::MembwStatus,
            }
            println!("{}", serde_json::to_string_pretty(&Out { schema_version: s.schema_version, membw: s.membw })?);
        } else {
            print!("{}", status::membw_text(&s.membw));
        }
        return Ok(());
    }
    let mut changed = Vec::new();
    if let Some(p) = period_ms {
        changed.push(format!("period {p} ms"));
    }
    if let Some(r) = reclaim {
        changed.push(format!("reclaim {r}"));
    }
    if let Some(b) = best_effort {
        changed.push(format!("best effort {b}"));
    }
    let line = format!("membw: {}", changed.join(", "));
    change(socket, &Request::Membw { period_ms, reclaim, best_effort }, &line, json)
}

/// `cosched metrics`.
pub fn metrics(socket: &Path) -> anyhow::Result<()> {
    let m = request(socket, &Request::Metrics)?.context("empty reply")?;
    let m: MetricsReply = serde_json::from_value(m).context("reading the daemon's metrics")?;
    print!("{}", m.text);
    Ok(())
}

/// The version of `cosched vm list --json`'s keys.
pub const VM_LIST_SCHEMA_VERSION: u32 = 1;

/// `cosched vm list --json`.
#[derive(Debug, Serialize)]
struct VmList {
    schema_version: u32,
    vms: Vec<VmEntry>,
}

#[derive(Debug, Serialize)]
struct VmEntry {
    name: String,
    pid: i32,
    /// Its channel is connected to an agent.
    agent: bool,
    /// The agent has registered.
    registered: bool,
    /// Per resource: its level (`normal`, `boosted`, ...), or `off` where not active.
    levels: std::collections::BTreeMap<String, String>,
    /// Per resource whose last change of level failed on the threads: why.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    not_applied: std::collections::BTreeMap<String, String>,
}

/// `cosched vm list`.
fn list(socket: &Path, json: bool) -> anyhow::Result<()> {
    let s = status::get(socket)?;
    let vms: Vec<VmEntry> = s
        .vms
        .iter()
        .map(|vm| VmEntry {
            name: vm.name.clone(),
            pid: vm.pid,
            agent: vm.agent,
            registered: vm.registered,
            levels: vm
                .resources
                .iter()
                .map(|(r, res)| (r.clone(), if res.active { res.level.name() } else { "off" }.to_string()))
                .collect(),
            not_applied: vm
                .resources
                .iter()
                .filter_map(|(r, res)| Some((r.clone(), res.not_applied.clone()?)))
                .collect(),
        })
        .collect();
    if json {
        println!("{}", serde_json::to_string_pretty(&VmList { schema_version: VM_LIST_SCHEMA_VERSION, vms })?);
        return Ok(());
    }
    print!("{}", list_text(s.resources.keys(), &vms));
    Ok(())
}

fn list_text<'a>(resources: impl Iterator<Item = &'a String>, vms: &[VmEntry]) -> String {
    use std::fmt::Write;
    let resources: Vec<&String> = resources.collect();
    let mut out = format!("{:<16} {:>8} {:<10}", "VM", "PID", "AGENT");
    for r in &resources {
        let _ = write!(out, " {:<9}", r.to_uppercase());
    }
    out = out.trim_end().to_string() + "\n";
    for vm in vms {
        let agent = match (vm.agent, vm.registered) {
            (_, true) => "registered",
            (true, false) => "connected",
            _ => "none",
        };
        let mut line = format!("{:<16} {:>8} {:<10}", vm.name, vm.pid, agent);
        for r in &resources {
            let level = vm.levels.get(*r).map_or("-", String::as_str);
            // A level decided but not in force on the threads: marked, `cosched status` says why.
            let mark = if vm.not_applied.contains_key(*r) { "!" } else { "" };
            let _ = write!(line, " {:<9}", format!("{level}{mark}"));
        }
        out += line.trim_end();
        out.push('\n');
    }
    if vms.is_empty() {
        out += "no VMs\n";
    }
    if vms.iter().any(|v| !v.not_applied.is_empty()) {
        out += "!: decided but not applied to the VM's threads (`cosched status VM` says why)\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_has_a_column_per_resource() {
        let vms = [VmEntry {
            name: "vm1".into(),
            pid: 42,
            agent: true,
            registered: true,
            levels: [("cpu".to_string(), "boosted".to_string()), ("io".to_string(), "off".to_string())].into(),
            not_applied: Default::default(),
        }];
        let resources = ["cpu".to_string(), "io".to_string(), "membw".to_string()];
        let text = list_text(resources.iter(), &vms);
        let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(lines[0], ["VM", "PID", "AGENT", "CPU", "IO", "MEMBW"]);
        assert_eq!(lines[1], ["vm1", "42", "registered", "boosted", "off", "-"]);
        assert_eq!(list_text(resources.iter(), &[]).lines().last(), Some("no VMs"));
    }
}
