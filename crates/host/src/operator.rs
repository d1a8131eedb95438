//! The operator's settings: what `cosched enable|disable`, `cosched membw --...` and
//! `cosched vm ...` changed, laid over the config ([`Operator::over`]) and kept in the state
//! directory (`<state_dir>/operator.state`), so that a restarted daemon (after a stop, a crash
//! or an upgrade) applies them again after the config. The state directory is on `/run`: a
//! reboot starts from the config alone.
//!
//! The rule: **the operator's setting wins over the config's until it is reset** (`cosched vm
//! reset NAME`, `cosched reset`): a reload that changes a key the operator also set leaves the
//! operator's value in force and says so. Each setting is kept by itself (the CPU switch of one
//! VM, its priority, each of its static tuning's keys...), by VM name: a VM that is not running
//! gets it when it appears.
//!
//! The file is JSON, written atomically (a temporary file, then a rename) and only while there
//! is something in it:
//!
//! ```json
//! { "version": 1,
//!   "resources": { "io": false },
//!   "static": false,
//!   "membw": { "period_ms": 50 },
//!   "vm": { "web1": { "resources": { "cpu": false }, "priority": 7,
//!                     "static": { "fifo": true, "shield": "3" } } } }
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use cosched_proto::Resource;
use cosched_status::SettingsFrom;
use serde::{Deserialize, Serialize};

use crate::config::{HostConfig, StaticConfig};

/// The operator's settings' file in the state directory. Not `*.json`: those are the VMs'
/// records, which a restore reads.
pub const OPERATOR_FILE: &str = "operator.state";

/// The format of [`OPERATOR_FILE`].
pub const OPERATOR_VERSION: u64 = 1;

/// Every setting the operator changed, host-wide and per VM name (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Operator {
    /// One resource on or off for the whole host (`cosched enable|disable [RESOURCE]`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, bool>,
    /// `false`: every VM's static tunings off (`cosched disable --all`), until `cosched enable`.
    #[serde(rename = "static", skip_serializing_if = "Option::is_none")]
    pub statics: Option<bool>,
    /// The memory-bandwidth regulation (`cosched membw --...`).
    #[serde(skip_serializing_if = "MembwOverride::is_empty")]
    pub membw: MembwOverride,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub vm: BTreeMap<String, VmOverride>,
}

/// `cosched membw --period-ms --reclaim --best-effort`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MembwOverride {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reclaim: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_effort: Option<bool>,
}

impl MembwOverride {
    pub fn is_empty(&self) -> bool {
        *self == MembwOverride::default()
    }
}

/// One VM's settings, as `cosched vm ...` left them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VmOverride {
    /// One resource on or off (`cosched vm enable|disable NAME [RESOURCE]`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rt_ceiling: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub membw_share: Option<u64>,
    #[serde(rename = "static", skip_serializing_if = "StaticOverride::is_empty")]
    pub statics: StaticOverride,
}

/// `cosched vm static NAME --fifo --shield --guard`: each key by itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StaticOverride {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fifo: Option<bool>,
    /// A CPU list, or `off`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shield: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guard: Option<bool>,
}

impl StaticOverride {
    pub fn is_empty(&self) -> bool {
        *self == StaticOverride::default()
    }

    /// `cfg` with these keys over it.
    pub fn over(&self, cfg: &mut StaticConfig) {
        if let Some(f) = self.fifo {
            cfg.fifo = f;
        }
        if let Some(s) = &self.shield {
            cfg.shield = shield_value(s);
        }
        if let Some(g) = self.guard {
            cfg.guard = g;
        }
    }
}

/// An operator's shield: a CPU list, or `off` (also `none`, or nothing) for no shield.
pub fn shield_value(s: &str) -> Option<String> {
    match s.trim() {
        "" | "off" | "none" => None,
        list => Some(list.to_string()),
    }
}

impl VmOverride {
    pub fn is_empty(&self) -> bool {
        *self == VmOverride::default()
    }

    /// Each setting and its value, as `cosched status` lists those of a VM that is not running.
    pub fn describe(&self) -> BTreeMap<String, String> {
        let on_off = |on: bool| if on { "on" } else { "off" }.to_string();
        let mut out = BTreeMap::new();
        for (r, on) in &self.resources {
            out.insert(format!("enabled.{r}"), on_off(*on));
        }
        if let Some(p) = self.priority {
            out.insert("priority".into(), p.to_string());
        }
        if let Some(c) = self.rt_ceiling {
            out.insert("rt_ceiling".into(), c.to_string());
        }
        if let Some(s) = self.membw_share {
            out.insert("membw_share".into(), s.to_string());
        }
        let StaticOverride { fifo, shield, guard } = &self.statics;
        if let Some(f) = fifo {
            out.insert("static.fifo".into(), on_off(*f));
        }
        if let Some(s) = shield {
            out.insert("static.shield".into(), s.clone());
        }
        if let Some(g) = guard {
            out.insert("static.guard".into(), on_off(*g));
        }
        out
    }
}

impl Operator {
    pub fn is_empty(&self) -> bool {
        *self == Operator::default()
    }

    /// The VM named `name`'s settings, made if it has none.
    pub fn vm_mut(&mut self, name: &str) -> &mut VmOverride {
        self.vm.entry(name.to_string()).or_default()
    }

    /// Drops what is left empty (a VM whose every setting was reset).
    pub fn tidy(&mut self) {
        self.vm.retain(|_, v| !v.is_empty());
    }

    /// `cfg` with the operator's settings over it: what is in force.
    pub fn over(&self, cfg: &HostConfig) -> HostConfig {
        let mut eff = cfg.clone();
        eff.resources.extend(self.resources.iter().map(|(r, on)| (r.clone(), *on)));
        let MembwOverride { period_ms, reclaim, best_effort } = self.membw;
        eff.membw.period_ms = period_ms.unwrap_or(eff.membw.period_ms);
        eff.membw.reclaim = reclaim.unwrap_or(eff.membw.reclaim);
        eff.membw.best_effort = best_effort.unwrap_or(eff.membw.best_effort);
        for (name, o) in &self.vm {
            let v = eff.vm.entry(name.clone()).or_default();
            v.resources.extend(o.resources.iter().map(|(r, on)| (r.clone(), *on)));
            v.priority = o.priority.or(v.priority);
            v.rt_ceiling = o.rt_ceiling.or(v.rt_ceiling);
            v.membw_share = o.membw_share.or(v.membw_share);
            o.statics.over(&mut v.statics);
        }
        if self.statics == Some(false) {
            for v in eff.vm.values_mut() {
                v.statics = StaticConfig { fifo: false, shield: None, guard: false, ..v.statics.clone() };
            }
        }
        eff
    }

    /// Where each host-wide setting comes from: the switch of each resource in `resources`
    /// (`enabled.cpu`), the static tunings, the memory-bandwidth regulation's keys.
    pub fn host_origins(&self, resources: impl Iterator<Item = Resource>) -> SettingsFrom {
        let mut out = SettingsFrom::default();
        for r in resources {
            out.set(format!("enabled.{}", r.name()), self.resources.contains_key(r.name()));
        }
        out.set("static", self.statics.is_some());
        let MembwOverride { period_ms, reclaim, best_effort } = &self.membw;
        out.set("membw.period_ms", period_ms.is_some());
        out.set("membw.reclaim", reclaim.is_some());
        out.set("membw.best_effort", best_effort.is_some());
        out
    }

    /// Where each setting of the VM named `name` comes from: the switch of each resource in
    /// `resources`, its priority, RT ceiling, memory-bandwidth share and static tunings (the
    /// operator's also when `cosched disable --all` took them off).
    pub fn vm_origins(&self, name: &str, resources: impl Iterator<Item = Resource>) -> SettingsFrom {
        let none = VmOverride::default();
        let o = self.vm.get(name).unwrap_or(&none);
        let mut out = SettingsFrom::default();
        for r in resources {
            out.set(format!("enabled.{}", r.name()), o.resources.contains_key(r.name()));
        }
        out.set("priority", o.priority.is_some());
        out.set("rt_ceiling", o.rt_ceiling.is_some());
        out.set("membw_share", o.membw_share.is_some());
        out.set("static", !o.statics.is_empty() || self.statics.is_some());
        out
    }

    /// Reads `<dir>/operator.state`: none is no setting.
    pub fn load(dir: &Path) -> Result<Operator, OperatorError> {
        let path = dir.join(OPERATOR_FILE);
        let at = |error| OperatorError::File { path: path.clone(), error: Box::new(error) };
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Operator::default()),
            Err(e) => return Err(at(OperatorError::Io(e))),
        };
        let mut v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| at(OperatorError::Corrupt(e)))?;
        let version = v.as_object_mut().and_then(|o| o.remove("version")).and_then(|n| n.as_u64());
        match version {
            Some(OPERATOR_VERSION) => serde_json::from_value(v).map_err(|e| at(OperatorError::Corrupt(e))),
            other => Err(at(OperatorError::Version(other))),
        }
    }

    /// Writes `<dir>/operator.state` atomically, or removes it when there is nothing to keep.
    pub fn save(&self, dir: &Path) -> Result<(), OperatorError> {
        let path = dir.join(OPERATOR_FILE);
        let at = |error| OperatorError::File { path: path.clone(), error: Box::new(error) };
        if self.is_empty() {
            return match fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(at(OperatorError::Io(e))),
                _ => Ok(()),
            };
        }
        let mut v = serde_json::to_value(self).map_err(|e| at(OperatorError::Corrupt(e)))?;
        if let Some(o) = v.as_object_mut() {
            o.insert("version".into(), OPERATOR_VERSION.into());
        }
        let text = serde_json::to_vec_pretty(&v).map_err(|e| at(OperatorError::Corrupt(e)))?;
        let tmp = path.with_extension("state.tmp");
        let write = || -> io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&text)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)
        };
        write().map_err(|e| at(OperatorError::Io(e)))
    }
}

/// Why the operator's settings cannot be read or kept.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("{0}")]
    Io(#[source] io::Error),
    #[error("corrupt: {0}")]
    Corrupt(#[source] serde_json::Error),
    #[error("format version {}, this cosched reads version {OPERATOR_VERSION}", .0.map_or("none".to_string(), |v| v.to_string()))]
    Version(Option<u64>),
    #[error("{}: {error}", path.display())]
    File { path: PathBuf, error: Box<OperatorError> },
}

#[cfg(test)]
mod tests {
    use cosched_status::Origin;

    use super::*;

    fn config(text: &str) -> HostConfig {
        let cfg: HostConfig = toml::from_str(text).unwrap();
        cfg.validate().unwrap();
        cfg
    }

    #[test]
    fn the_operators_settings_win_over_the_configs_key_by_key() {
        let cfg = config(
            "enabled = false\n[resources]\ncpu = true\n[membw]\nreclaim = true\n\
             [vm.a]\npriority = 3\nrt_ceiling = 20\n[vm.a.resources]\nio = false\n\
             [vm.a.static]\nfifo = true\nshield = \"1\"\n[vm.b]\nmembw_share = 100\n",
        );
        let mut op = Operator::default();
        assert_eq!(op.over(&cfg), cfg, "nothing set: the config");
        op.resources.insert("io".into(), true);
        op.membw.period_ms = Some(50);
        let a = op.vm_mut("a");
        a.priority = Some(7);
        a.resources.insert("cpu".into(), false);
        a.statics.shield = Some("off".into());
        op.vm_mut("c").membw_share = Some(300);
        let eff = op.over(&cfg);
        assert!(eff.starts_enabled(Resource::Cpu) && eff.starts_enabled(Resource::Io));
        assert!(!eff.starts_enabled(Resource::Membw), "the config's enabled = false for the rest");
        assert_eq!((eff.membw.period_ms, eff.membw.reclaim), (50, true));
        let s = eff.vm_settings("a");
        assert_eq!(s.priority, 7);
        assert!(!s.enabled(Resource::Cpu) && !s.enabled(Resource::Io), "the operator's cpu, the config's io");
        assert_eq!(eff.vm["a"].rt_ceiling, Some(20), "a key the operator did not set: the config's");
        assert!(eff.vm["a"].statics.fifo && eff.vm["a"].statics.shield.is_none(), "the shield alone is off");
        assert_eq!((eff.membw_share("b"), eff.membw_share("c")), (100, 300));
        eff.validate().unwrap();
        // `disable --all`: every static tuning off, the rest stays.
        op.statics = Some(false);
        let eff = op.over(&cfg);
        assert!(eff.vm["a"].statics.is_empty() && eff.vm_settings("a").priority == 7);
    }

    #[test]
    fn origins_say_config_or_operator_for_each_setting() {
        let mut op = Operator::default();
        op.resources.insert("cpu".into(), false);
        op.vm_mut("a").priority = Some(5);
        let rs = || [Resource::Cpu, Resource::Io].into_iter();
        let host = op.host_origins(rs());
        assert_eq!(host.0["enabled.cpu"], Origin::Operator);
        assert_eq!(host.0["enabled.io"], Origin::Config);
        assert_eq!(host.0["static"], Origin::Config);
        let a = op.vm_origins("a", rs());
        assert_eq!(
            (a.0["priority"], a.0["enabled.cpu"], a.0["static"]),
            (Origin::Operator, Origin::Config, Origin::Config)
        );
        assert!(op.vm_origins("b", rs()).by_config_alone());
        op.statics = Some(false);
        assert_eq!(op.vm_origins("b", rs()).0["static"], Origin::Operator);
        assert_eq!(op.vm["a"].describe(), BTreeMap::from([("priority".to_string(), "5".to_string())]));
    }

    #[test]
    fn the_file_is_versioned_json_written_atomically_and_removed_when_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Operator::load(dir.path()).unwrap(), Operator::default(), "no file: nothing set");
        let mut op = Operator { statics: Some(false), ..Default::default() };
        let v = op.vm_mut("web1");
        v.resources.insert("cpu".into(), false);
        v.statics.fifo = Some(true);
        op.save(dir.path()).unwrap();
        let path = dir.path().join(OPERATOR_FILE);
        let text = fs::read_to_string(&path).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"version": 1, "static": false,
                               "vm": {"web1": {"resources": {"cpu": false}, "static": {"fifo": true}}}})
        );
        assert_eq!(Operator::load(dir.path()).unwrap(), op);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left");
        Operator::default().save(dir.path()).unwrap();
        assert!(!path.exists(), "nothing to keep: no file");
        let bad = |text: &str| {
            fs::write(&path, text).unwrap();
            Operator::load(dir.path()).unwrap_err().to_string()
        };
        assert!(bad("{").contains("operator.state: corrupt"));
        assert!(bad(r#"{"version": 2}"#).ends_with("format version 2, this cosched reads version 1"));
        assert!(bad(r#"{"resources": {}}"#).ends_with("format version none, this cosched reads version 1"));
        assert!(bad(r#"{"version": 1, "vm": {"a": {"prio": 3}}}"#).contains("unknown field `prio`"));
    }
}
