//! The reference against the code: its keys are exactly the configuration's, its ranges and
//! choices are the ones the code checks, and the committed files are what the generator writes.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;

use super::*;

/// Tables whose keys are names (a VM's, a resource's) rather than fixed keys, and what their
/// entries are: `None` for a value (`io = false`), else the table of keys each entry holds.
const MAPS: &[(&str, Option<&str>)] = &[
    ("resources", None),
    ("policy.resource", Some("policy.resource.RESOURCE")),
    ("vm", Some("vm.NAME")),
    ("vm.NAME.resources", None),
];

/// Every key path of the default configuration, maps expanded with their placeholders.
fn code_keys() -> BTreeSet<String> {
    fn walk(v: &Value, at: &str, out: &mut BTreeSet<String>) {
        let Value::Object(fields) = v else {
            out.insert(at.to_string());
            return;
        };
        if let Some((_, entry)) = MAPS.iter().find(|(m, _)| *m == at) {
            assert!(fields.is_empty(), "{at}: a map of names is empty by default");
            match entry {
                None => {
                    out.insert(format!("{at}.{RESOURCE}"));
                }
                Some("vm.NAME") => walk(&serde_json::to_value(VmConfig::default()).unwrap(), "vm.NAME", out),
                Some(other) => {
                    walk(&serde_json::to_value(LimitsOverride::default()).unwrap(), other, out);
                }
            }
            return;
        }
        assert!(!fields.is_empty(), "{at}: an empty table in the defaults is a map: name it in MAPS");
        for (k, v) in fields {
            walk(v, &if at.is_empty() { k.clone() } else { format!("{at}.{k}") }, out);
        }
    }
    let mut out = BTreeSet::new();
    walk(&serde_json::to_value(HostConfig::default()).unwrap(), "", &mut out);
    out
}

fn keys() -> Vec<Key> {
    reference().into_iter().flat_map(|t| t.keys).collect()
}

#[test]
fn every_key_of_the_default_config_is_in_the_reference_and_no_other() {
    let code = code_keys();
    let described: BTreeSet<String> = keys().into_iter().map(|k| k.path).collect();
    let missing: Vec<_> = code.difference(&described).collect();
    let unknown: Vec<_> = described.difference(&code).collect();
    assert!(missing.is_empty(), "keys of the config missing from config_reference/keys.rs: {missing:?}");
    assert!(unknown.is_empty(), "keys in config_reference/keys.rs that the config does not have: {unknown:?}");
    assert_eq!(keys().len(), described.len(), "a key described twice");
    // Each key sits in the table its path names.
    for t in reference() {
        for k in &t.keys {
            let parent = k.path.rsplit_once('.').map_or("", |(p, _)| p);
            assert_eq!(parent, t.path, "{} listed under [{}]", k.path, t.path);
        }
    }
}

#[test]
fn unset_keys_say_what_unset_means_and_show_an_example() {
    for k in keys() {
        let unset = k.default_toml().is_none();
        assert_eq!(unset, k.unset.is_some(), "{}: `unset` is for (and only for) keys unset by default", k.path);
        assert_eq!(unset, k.example.is_some(), "{}: an example is for (and only for) keys unset by default", k.path);
        assert!(!k.does.is_empty() && !k.change.is_empty(), "{}", k.path);
    }
}

#[test]
fn units_are_the_ones_names_say() {
    for k in keys() {
        for (suffix, unit) in [("_ms", "ms"), ("_us", "µs"), ("_permille", "‰"), ("_mbps", "MB/s")] {
            if k.name().ends_with(suffix) {
                assert_eq!(k.unit, unit, "{}", k.path);
            }
        }
    }
}

/// A TOML document with `value` at `path` (placeholders as the examples name them) and every
/// other key at its default; loaded and checked as the daemon does.
fn load_with(path: &str, value: &str) -> Result<HostConfig, String> {
    let cfg = parse_with(path, value)?;
    cfg.validate().map_err(|e| e.to_string())?;
    Ok(cfg)
}

/// [`load_with`] without the checks that span keys: only what the key's type accepts.
fn parse_with(path: &str, value: &str) -> Result<HostConfig, String> {
    let concrete = example_path(path);
    let (table, key) = concrete.rsplit_once('.').unwrap_or(("", &concrete));
    let header = if table.is_empty() { String::new() } else { format!("[{table}]\n") };
    toml::from_str(&format!("{header}{key} = {value}\n")).map_err(|e| e.to_string())
}

#[test]
fn ranges_are_what_the_code_accepts() {
    let mut checked = 0;
    for k in keys() {
        let Range::Int { min, max } = k.range else { continue };
        load_with(&k.path, &min.to_string()).unwrap_or_else(|e| panic!("{} = {min} (its minimum): {e}", k.path));
        assert!(load_with(&k.path, &(min - 1).to_string()).is_err(), "{} = {} loads: below its range", k.path, min - 1);
        if let Some(max) = max {
            load_with(&k.path, &max.to_string()).unwrap_or_else(|e| panic!("{} = {max} (its maximum): {e}", k.path));
            assert!(
                load_with(&k.path, &(max + 1).to_string()).is_err(),
                "{} = {} loads: above its range",
                k.path,
                max + 1
            );
        }
        checked += 1;
    }
    assert!(checked >= 40, "{checked}");
}

#[test]
fn choices_are_the_codes_variants() {
    for k in keys() {
        let Range::Choice(choices) = k.range else { continue };
        for c in choices {
            parse_with(&k.path, &format!("\"{c}\"")).unwrap_or_else(|e| panic!("{} = {c:?}: {e}", k.path));
        }
        // serde lists the variants it knows: `expected one of `a`, `b`` or `expected `a` or `b``.
        let e = parse_with(&k.path, "\"no such choice\"").unwrap_err();
        let expected = e.split("expected").nth(1).unwrap_or_else(|| panic!("{}: {e}", k.path));
        let known: BTreeSet<&str> = expected.split('`').skip(1).step_by(2).collect();
        assert_eq!(known, choices.iter().copied().collect(), "{}: the code's choices", k.path);
    }
}

#[test]
fn examples_load() {
    for k in keys() {
        if let Some(e) = k.example {
            load_with(&k.path, e).unwrap_or_else(|err| panic!("{} = {e}: {err}", k.path));
        }
    }
}

/// `packaging/host.toml` as the package ships it loads to the defaults; with the lines that
/// show defaults uncommented it is the defaults again, and with every line uncommented (the
/// examples too) it loads and validates.
#[test]
fn the_packaged_config_shows_every_default_and_its_examples_load() {
    let text = render(Format::Toml);
    assert_eq!(toml::from_str::<HostConfig>(&text).unwrap(), HostConfig::default());
    let (mut defaults, mut everything) = (Vec::new(), Vec::new());
    let mut in_example_table = false;
    let mut shown = BTreeSet::new();
    for line in text.lines() {
        let Some(body) = line.strip_prefix('#').filter(|r| r.starts_with(|c: char| c.is_ascii_lowercase() || c == '['))
        else {
            continue;
        };
        let example = line.ends_with("# example");
        if body.starts_with('[') {
            in_example_table = example;
        } else if !example && !in_example_table {
            shown.insert(body.split(" = ").next().unwrap().to_string());
        }
        everything.push(body);
        if !example && !in_example_table {
            defaults.push(body);
        }
    }
    let cfg: HostConfig = toml::from_str(&defaults.join("\n")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cfg, HostConfig::default(), "a line shows something else than the default");
    let cfg: HostConfig = toml::from_str(&everything.join("\n")).unwrap_or_else(|e| panic!("{e}"));
    cfg.validate().unwrap_or_else(|e| panic!("the examples together: {e}"));
    assert_ne!(cfg, HostConfig::default());
    let with_default = keys().iter().filter(|k| k.default_toml().is_some() && !k.path.contains(NAME)).count();
    assert_eq!(shown.len(), with_default, "every key with a default outside the examples' tables is shown");
}

#[test]
fn man_page_is_plain_roff() {
    let page = render(Format::Man);
    assert!(page.starts_with(".TH COSCHED\\-HOST.TOML 5 "), "{}", &page[..80]);
    for line in page.lines() {
        if let Some(req) = line.strip_prefix('.') {
            let name = req.split_whitespace().next().unwrap_or("");
            assert!(["TH", "SH", "PP", "TP", "B", "I", "BR", "br"].contains(&name), "unknown request: {line}");
        }
        assert!(!line.starts_with('\''), "{line}");
        assert!(!line.contains('`'), "a backquote left: {line}");
    }
    for k in keys() {
        assert!(page.contains(&format!("\\fB{}\\fR", roff_inline(k.name()))), "{}", k.path);
    }
}

fn repo(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

/// The committed files are what the generator writes: a change of the config's code, its
/// defaults or the reference that is not carried into them fails here. docs/configuration.md
/// begins with the host's reference (the guest agent's follows, checked by the cosched crate's
/// guest_reference tests). `COSCHED_BLESS=1 cargo test --release -p cosched-host
/// config_reference` writes packaging/host.toml; `cosched generate config-reference --format
/// markdown > docs/configuration.md` writes the page.
#[test]
fn docs_configuration_md_and_packaging_host_toml_are_generated() {
    let toml = render(Format::Toml);
    let path = repo("packaging/host.toml");
    if std::env::var("COSCHED_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &toml).unwrap();
    }
    let got = std::fs::read_to_string(&path).unwrap_or_default();
    if got != toml {
        let line = got
            .lines()
            .zip(toml.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(got.lines().count().min(toml.lines().count()))
            + 1;
        panic!(
            "packaging/host.toml is not what the reference generates (first difference at line {line}): run \
             `cosched generate config-reference --format toml > packaging/host.toml`, or `COSCHED_BLESS=1 cargo \
             test --release -p cosched-host config_reference`"
        );
    }
    let markdown = render(Format::Markdown);
    let got = std::fs::read_to_string(repo("docs/configuration.md")).unwrap_or_default();
    if !got.starts_with(&markdown) {
        let line = got.lines().zip(markdown.lines()).position(|(a, b)| a != b).unwrap_or(got.lines().count()) + 1;
        panic!(
            "docs/configuration.md is not what the reference generates (first difference at line {line}): run \
             `cosched generate config-reference --format markdown > docs/configuration.md`"
        );
    }
}
