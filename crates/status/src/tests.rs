use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::*;
use crate::metric::{Kind, Metric};

fn sample(rel: &str) -> Value {
    let path = format!("{}/../../testdata/{rel}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))).unwrap()
}

/// Every key path of `v` with its value's JSON type (`vms[].resources.cpu.level: string`);
/// array elements share one path.
fn shape(v: &Value, at: &str, out: &mut BTreeSet<String>) {
    let kind = match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    out.insert(format!("{at}: {kind}"));
    match v {
        Value::Array(a) => a.iter().for_each(|e| shape(e, &format!("{at}[]"), out)),
        Value::Object(m) => m.iter().for_each(|(k, e)| shape(e, &format!("{at}.{k}"), out)),
        _ => {}
    }
}

fn shape_of(v: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    shape(v, "", &mut out);
    out
}

/// The samples of `cosched status --json` captured before the status was typed read into
/// [`Status`] and write back the same keys, nesting, value types and values; the one key added
/// since is `schema_version`.
#[test]
fn the_captured_samples_read_and_write_back_unchanged() {
    for rel in ["status-v1.json", "status-v1/later.json", "status-v1/unprivileged.json", "status-v1/events.json"] {
        let mut captured = sample(rel);
        let typed: Status = serde_json::from_value(captured.clone()).unwrap_or_else(|e| panic!("{rel}: {e}"));
        assert_eq!(typed.schema_version, 0, "{rel}: captured before the key existed");
        let mut written = serde_json::to_value(Status { schema_version: SCHEMA_VERSION, ..typed }).unwrap();
        assert_eq!(written.as_object_mut().unwrap().remove("schema_version"), Some(Value::from(1)));
        let (before, after) = (shape_of(&captured), shape_of(&written));
        let lost: Vec<_> = before.difference(&after).collect();
        let added: Vec<_> = after.difference(&before).collect();
        assert!(lost.is_empty() && added.is_empty(), "{rel}: lost {lost:#?}, added {added:#?}");
        // Values too: floats go through f64 and back exactly.
        captured.as_object_mut().unwrap().remove("schema_version");
        assert_eq!(written, captured, "{rel}");
    }
}

/// The figures and counters named by type land in their fields, not in the catch-alls.
#[test]
fn named_figures_and_counters_are_typed() {
    let s: Status = serde_json::from_value(sample("status-v1.json")).unwrap();
    let cpu = &s.resources["cpu"].figures;
    assert_eq!((cpu.boost_capacity_vcpus, cpu.boosted_vcpus), (Some(2), Some(1)));
    assert_eq!(s.resources["membw"].figures.committed_permille, Some(500));
    assert!(s.resources.values().all(|r| r.figures.other.is_empty()));
    let e: Status = serde_json::from_value(sample("status-v1/events.json")).unwrap();
    let ev = &e.vms[0].resources["event"].counters;
    assert_eq!((ev.event.events, ev.event.repaid_ns, ev.other.len()), (Some(84), Some(102159847), 0));
    let vm1 = s.vms.iter().find(|v| v.name == "vm1").unwrap();
    assert_eq!(vm1.threads[0].sched(), Some("SCHED_OTHER nice 0"));
    assert_eq!(vm1.threads[0].io(), Some(("ioprio", "0x0")));
    assert_eq!(vm1.threads[1].settings["freezer"], "/");
}

/// Every typed figure and own counter is set by its JSON name (the names the coordinator
/// gives them), none lands in the catch-all.
#[test]
fn each_field_is_set_by_its_name() {
    let all = |v: Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
    let names = all(serde_json::to_value(ResourceFigures {
        boost_capacity_vcpus: Some(1),
        boosted_vcpus: Some(1),
        guaranteed_mbps: Some(1),
        period_ms: Some(1),
        committed_permille: Some(1),
        reclaim: Some(1),
        best_effort: Some(1),
        periods: Some(1),
        best_effort_periods: Some(1),
        other: BTreeMap::new(),
    })
    .unwrap());
    let mut f = ResourceFigures::default();
    names.iter().for_each(|n| f.set(n, 7));
    assert!(f.other.is_empty() && serde_json::to_value(&f).unwrap().as_object().unwrap().len() == names.len());
    let some = EventCounters {
        events: Some(1),
        ignored: Some(1),
        not_waiting: Some(1),
        postponed: Some(1),
        blocked: Some(1),
        boosted_cpu_ns: Some(1),
        uncharged: Some(1),
        slices: Some(1),
        postponed_boosts: Some(1),
        repaid_ns: Some(1),
    };
    let mut names = all(serde_json::to_value(some).unwrap());
    names.extend(all(serde_json::to_value(CpuCounters { guard_demotions: Some(1) }).unwrap()));
    let mut c = SlotCounters::default();
    names.iter().for_each(|n| c.set_own(n, 7));
    assert!(c.other.is_empty(), "{:?}", c.other);
    assert_eq!((c.cpu.guard_demotions, c.event.repaid_ns), (Some(7), Some(7)));
    c.set_own("new_one", 3);
    assert_eq!(c.other["new_one"], 3);
}

/// A CLI reads a daemon's status with keys missing (older) or unknown (newer).
#[test]
fn missing_keys_read_as_defaults() {
    let s: Status = serde_json::from_value(serde_json::json!({
        "vms": [{"name": "vm1", "resources": {"cpu": {"level": "boosted"}}, "new_key": 1}],
        "new_section": {}
    }))
    .unwrap();
    assert_eq!(s.vms[0].resources["cpu"].level, cosched_core::Level::Boosted);
    assert_eq!(s.schema_version, 0);
}

fn declared<T: metric::Metrics>(out: &mut BTreeMap<&'static str, Vec<(Kind, &'static str)>>) {
    for m in T::METRICS {
        let Metric { name, kind, help, .. } = m;
        out.entry(name).or_default().push((*kind, help));
    }
}

/// A metric declared on two fields (the VM's denials and a resource's) says the same of
/// itself in both; Prometheus takes one HELP and TYPE per name.
#[test]
fn a_metric_has_one_type_and_help() {
    let mut all = BTreeMap::new();
    declared::<ResourceStatus>(&mut all);
    declared::<MembwStatus>(&mut all);
    declared::<VmStatus>(&mut all);
    declared::<VmCounters>(&mut all);
    declared::<VmResource>(&mut all);
    declared::<SlotCounters>(&mut all);
    declared::<CpuCounters>(&mut all);
    declared::<EventCounters>(&mut all);
    declared::<RtStatus>(&mut all);
    declared::<VmMembw>(&mut all);
    declared::<VmBwStats>(&mut all);
    assert_eq!(all.len(), 40, "{:#?}", all.keys());
    for (name, decls) in &all {
        assert!(decls.windows(2).all(|w| w[0] == w[1]), "{name}: {decls:?}");
        assert!(name.starts_with("cosched_") && !decls[0].1.is_empty());
    }
    assert_eq!(all["cosched_vm_denied_total"].len(), 2);
}
