//! Where a setting in force comes from: the config, or an operator's command (kept until the
//! operator resets it: `cosched vm reset NAME`, `cosched reset`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The config, or the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    Config,
    Operator,
}

/// Each setting's origin, by the setting's name (`enabled.cpu`, `priority`, `static`, ...).
/// In the JSON only while at least one setting is the operator's: a missing key means every
/// setting is the config's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SettingsFrom(pub BTreeMap<String, Origin>);

impl SettingsFrom {
    /// Records `key`'s origin: the operator's if `operator`, else the config's.
    pub fn set(&mut self, key: impl Into<String>, operator: bool) {
        self.0.insert(key.into(), if operator { Origin::Operator } else { Origin::Config });
    }

    /// Whether every setting is the config's (then the JSON leaves the key out).
    pub fn by_config_alone(&self) -> bool {
        self.0.values().all(|o| *o == Origin::Config)
    }

    /// The settings that are the operator's.
    pub fn operator(&self) -> impl Iterator<Item = &str> {
        self.0.iter().filter(|(_, o)| **o == Origin::Operator).map(|(k, _)| k.as_str())
    }
}
