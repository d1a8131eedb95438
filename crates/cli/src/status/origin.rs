//! Where the settings in force come from (the config, or the operator until reset), and what
//! a reload or a reset changed.

use std::fmt::Write;

use cosched_host::reload::Changes;
use cosched_status::{Status, VmStatus};

/// The host-wide settings the operator set, and those kept for VMs that are not running.
pub fn host(out: &mut String, s: &Status) {
    let set: Vec<&str> = s.settings_from.operator().collect();
    if !set.is_empty() {
        let _ = writeln!(out, "set by the operator (kept until `cosched reset`): {}", set.join(", "));
    }
    for (vm, settings) in &s.settings_waiting {
        let each: Vec<String> = settings.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(out, "{vm} (not running): set by the operator, applies when it appears: {}", each.join(", "));
    }
}

/// Under a VM's rows: its settings the operator set.
pub fn vm(out: &mut String, vm: &VmStatus) {
    let set: Vec<&str> = vm.settings_from.operator().collect();
    if !set.is_empty() {
        let _ =
            writeln!(out, "    set by the operator (kept until `cosched vm reset {}`): {}", vm.name, set.join(", "));
    }
}

/// `cosched reload`, `cosched reset`, `cosched vm reset`: one line per change, then what needs
/// a restart and what the operator's settings hold.
pub fn changes_text(c: &Changes) -> String {
    let mut out = String::new();
    if *c == Changes::default() {
        out.push_str("no change\n");
    }
    for a in &c.applied {
        let _ = writeln!(out, "changed: {a}");
    }
    for k in &c.operator_kept {
        let _ = writeln!(out, "not applied, set by the operator: {k}");
    }
    for k in &c.needs_restart {
        let _ = writeln!(out, "needs a restart: {k}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_one_line_each() {
        assert_eq!(changes_text(&Changes::default()), "no change\n");
        let c = Changes {
            applied: vec!["vm1: priority 1 -> 5".into()],
            needs_restart: vec!["socket_dir".into()],
            operator_kept: vec!["vm2: priority 2 -> 3 (the operator's setting stays: cosched vm reset vm2)".into()],
        };
        assert_eq!(
            changes_text(&c),
            "changed: vm1: priority 1 -> 5\nnot applied, set by the operator: vm2: priority 2 -> 3 (the operator's \
             setting stays: cosched vm reset vm2)\nneeds a restart: socket_dir\n"
        );
    }

    #[test]
    fn the_operators_settings_are_shown_only_when_there_are_some() {
        let mut s = Status::default();
        let mut out = String::new();
        host(&mut out, &s);
        assert_eq!(out, "");
        s.settings_from.set("enabled.cpu", true);
        s.settings_from.set("enabled.io", false);
        s.settings_waiting.insert("vm2".into(), [("priority".to_string(), "5".to_string())].into());
        host(&mut out, &s);
        assert_eq!(
            out,
            "set by the operator (kept until `cosched reset`): enabled.cpu\nvm2 (not running): set by the operator, \
             applies when it appears: priority 5\n"
        );
    }
}
