//! The reference of the exported metrics (`docs/metrics.md`), from the declarations on the
//! status fields (`#[metric(...)]` in `cosched-status`): each family's name, type, help and the
//! labels its samples carry. The labels of a family's container are those [`crate::metrics::render`]
//! gives it; a test holds the two together on the captured status samples, another holds the
//! page to the declarations.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use cosched_status::metric::{Kind, Metric, Metrics};
use cosched_status::{
    CpuCounters, EventCounters, MembwStatus, ResourceStatus, RtStatus, SlotCounters, VmBwStats, VmCounters, VmMembw,
    VmResource, VmStatus,
};

/// One metric family as the daemon exports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    /// Every label its samples carry (`le` for a histogram's buckets not included).
    pub labels: Vec<String>,
    /// What it describes: `the host`, `each VM`, ...
    pub scope: &'static str,
}

/// The metrics of `T`, whose container gives them `labels`.
fn of<T: Metrics>(scope: &'static str, labels: &[&str], out: &mut BTreeMap<&'static str, Family>) {
    for m in T::METRICS {
        let mut all: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
        all.extend(own_labels(m));
        let f =
            out.entry(m.name).or_insert(Family { name: m.name, kind: m.kind, help: m.help, labels: Vec::new(), scope });
        // Declared on a VM and on a VM's resource (`cosched_vm_denied_total`): shown per resource.
        if labels.contains(&"resource") {
            f.scope = scope;
        }
        for l in all {
            if !f.labels.contains(&l) {
                f.labels.push(l);
            }
        }
    }
}

/// A metric's own labels: its fixed ones (`resource=""`) and its key's (`reason`).
fn own_labels<T>(m: &Metric<T>) -> Vec<String> {
    let fixed = m.labels.split(',').filter_map(|l| l.split_once('=')).map(|(k, _)| k.to_string());
    fixed.chain((!m.by.is_empty()).then(|| m.by.to_string())).collect()
}

/// Every family, by name. The containers and their labels are those of
/// [`crate::metrics::render`].
pub fn families() -> BTreeMap<&'static str, Family> {
    let mut out = BTreeMap::new();
    // Its labels are its value (version, commit), not a container's.
    of::<cosched_status::Build>("the host", &["version", "commit"], &mut out);
    of::<ResourceStatus>("each resource, host-wide", &["resource"], &mut out);
    of::<MembwStatus>("the host", &["backend"], &mut out);
    of::<VmStatus>("each VM", &["vm"], &mut out);
    of::<VmCounters>("each VM", &["vm"], &mut out);
    of::<VmMembw>("each VM", &["vm"], &mut out);
    of::<VmBwStats>("each VM", &["vm"], &mut out);
    of::<VmResource>("each VM and resource", &["vm", "resource"], &mut out);
    of::<SlotCounters>("each VM and resource", &["vm", "resource"], &mut out);
    of::<CpuCounters>("each VM and resource", &["vm", "resource"], &mut out);
    of::<RtStatus>("each VM and resource", &["vm", "resource"], &mut out);
    of::<EventCounters>("each VM and resource", &["vm", "resource"], &mut out);
    out
}

/// What each label holds.
const LABELS: &[(&str, &str)] = &[
    ("vm", "the VM's name (its socket's file name without `.sock`, its libvirt domain, or QEMU's `-name`)"),
    ("resource", "`cpu`, `io`, `membw` or `event`"),
    ("backend", "the memory-bandwidth counter source running (`pmu`, `simulated`), or as configured where none runs (`auto`, `off`)"),
    ("reason", "why a request was refused: `disabled`, `unsupported`, `budget`, `malformed`, `rate_limited`, `not_registered`, `host_reserve`"),
    ("outcome", "what became of predicted wake-ups: `received`, `applied`, `covered`, `refused`, `confirmed` (of which `early`), `unconfirmed` (of which `late`), `denied`, `cancelled`, `standing` (periods a standing prediction boosted by itself)"),
    ("quantile", "`0.5` or `0.99`, over the recent samples"),
    ("level", "the level a VM's vCPU threads were at: `normal`, `boosted` (the CPU boost), `event-boosted`, `static` (a static FIFO tuning)"),
    ("version", "the daemon's version (`cosched --version`)"),
    ("commit", "the git commit it was built from, empty when not built from a git checkout"),
    ("le", "a histogram bucket's upper bound, in seconds"),
];

/// `docs/metrics.md`.
pub fn markdown() -> String {
    let fams = families();
    let mut out = String::from("# Metrics\n\n");
    out += "<!-- Generated from the #[metric(...)] declarations in crates/status/src/ by \
            crates/host/src/metrics_reference.rs (its test writes it with COSCHED_BLESS=1): edit the \
            declarations, not this page. -->\n\n";
    for p in [
        "The host daemon exports its status as Prometheus metrics: `cosched metrics` prints them, and with \
         `metrics_listen` set (docs/configuration.md) the daemon serves the same text over HTTP. They are \
         taken from the same status as `cosched status --json`, so both always agree. \
         `packaging/grafana/cosched.json` is a Grafana dashboard of them.",
        "A family without a sample is not written: a VM's families appear with the VM, a resource's own \
         counters once the resource has counted something. Times are in seconds.",
    ] {
        out += &crate::config_reference::wrap(p, 100, "");
        out.push('\n');
    }
    let _ = writeln!(out, "{} families.\n\n## Labels\n\n| label | holds |\n|---|---|", fams.len());
    for (l, what) in LABELS {
        let _ = writeln!(out, "| `{l}` | {what} |");
    }
    for scope in ["the host", "each resource, host-wide", "each VM", "each VM and resource"] {
        let _ = write!(out, "\n## Of {scope}\n\n| metric | type | labels | what it counts |\n|---|---|---|---|\n");
        for f in fams.values().filter(|f| f.scope == scope) {
            let mut labels: Vec<String> = f.labels.iter().map(|l| format!("`{l}`")).collect();
            if f.kind == Kind::Histogram {
                labels.push("`le`".into());
            }
            let _ = writeln!(out, "| `{}` | {} | {} | {} |", f.name, f.kind.name(), labels.join(", "), f.help);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::PathBuf;

    use super::*;

    fn repo(rel: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
    }

    /// Every metric declared in the status crate's source is a family here: a new struct with
    /// metrics that `families` does not list fails (as long as its metrics are not already
    /// declared elsewhere).
    #[test]
    fn every_declared_metric_is_a_family() {
        let mut declared = BTreeSet::new();
        for entry in std::fs::read_dir(repo("crates/status/src")).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            for (i, _) in text.match_indices("name = \"cosched_") {
                let name = &text[i + 8..];
                declared.insert(name[..name.find('"').unwrap()].to_string());
            }
        }
        let listed: BTreeSet<String> = families().keys().map(|n| n.to_string()).collect();
        let missing: Vec<_> = declared.difference(&listed).collect();
        let gone: Vec<_> = listed.difference(&declared).collect();
        assert!(
            missing.is_empty() && gone.is_empty(),
            "declared in crates/status/src but not documented: {missing:?} (add the struct that declares them to \
             families() in crates/host/src/metrics_reference.rs, with the labels crate::metrics::render gives it); \
             documented but not declared: {gone:?}"
        );
        assert!(listed.len() >= 30, "{}", listed.len());
    }

    /// The exposition of the captured status samples names only these families, with their type
    /// and exactly their labels.
    #[test]
    fn the_exposition_has_these_families_and_labels() {
        let fams = families();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        for sample in ["status-v1.json", "status-v1/unprivileged.json", "status-v1/events.json"] {
            let text = std::fs::read_to_string(repo(&format!("testdata/{sample}"))).unwrap();
            let status: cosched_status::Status = serde_json::from_str(&text).unwrap();
            let exposition = crate::metrics::render(&status);
            for line in exposition.lines() {
                if let Some(rest) = line.strip_prefix("# TYPE ") {
                    let (name, kind) = rest.split_once(' ').unwrap();
                    assert_eq!(fams[name].kind.name(), kind, "{name}");
                    continue;
                }
                if line.starts_with('#') {
                    continue;
                }
                let (series, labels) = line.split_once('{').unwrap();
                let name = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| {
                        series.strip_suffix(s).filter(|n| fams.get(n).is_some_and(|f| f.kind == Kind::Histogram))
                    })
                    .unwrap_or(series);
                let f = fams.get(name).unwrap_or_else(|| panic!("{name}: exported, not in families()"));
                let keys: BTreeSet<&str> = labels
                    .split(',')
                    .filter_map(|l| l.split_once('='))
                    .map(|(k, _)| k)
                    .filter(|k| *k != "le")
                    .collect();
                let want: BTreeSet<&str> = f.labels.iter().map(String::as_str).collect();
                assert!(keys.is_subset(&want), "{line}: labels {keys:?}, documented {want:?}");
                seen.insert(name.to_string());
            }
        }
        assert!(seen.len() >= 25, "the samples show {} families", seen.len());
    }

    /// `docs/metrics.md` is what the declarations generate (`COSCHED_BLESS=1 cargo test --release
    /// -p cosched-host metrics_reference` writes it).
    #[test]
    fn docs_metrics_md_is_generated() {
        let want = markdown();
        let path = repo("docs/metrics.md");
        if std::env::var("COSCHED_BLESS").is_ok_and(|v| v == "1") {
            std::fs::write(&path, &want).unwrap();
        }
        let got = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            got == want,
            "docs/metrics.md is not what the #[metric] declarations generate: run `COSCHED_BLESS=1 cargo test \
             --release -p cosched-host metrics_reference`"
        );
    }
}
