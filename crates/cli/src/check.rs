//! `cosched check-config [FILE]`: every error the daemon would find in its config, and some it
//! would find only once starting, without starting anything.

use std::path::{Path, PathBuf};

use cosched_host::config::check::{check, Finding, Report};
use serde::Serialize;

/// The version of `cosched check-config --json`'s keys.
pub const SCHEMA_VERSION: u32 = 1;

/// A config with errors (each printed).
#[derive(Debug, thiserror::Error)]
#[error("{count} error(s) in {}: the daemon would not start with it", .path.display())]
pub struct Invalid {
    pub count: usize,
    pub path: PathBuf,
}

#[derive(Debug, Serialize)]
struct Out {
    schema_version: u32,
    file: PathBuf,
    /// `false`: the default path is absent (the daemon runs with the defaults).
    found: bool,
    valid: bool,
    errors: Vec<Item>,
    warnings: Vec<Item>,
}

#[derive(Debug, Serialize)]
struct Item {
    key: Option<String>,
    line: Option<usize>,
    column: Option<usize>,
    message: String,
}

impl From<&Finding> for Item {
    fn from(f: &Finding) -> Item {
        Item { key: f.key.clone(), line: f.at.map(|p| p.line), column: f.at.map(|p| p.column), message: f.to_string() }
    }
}

/// `FILE:LINE:COLUMN: what` (or `FILE: what` without a position).
pub fn line(path: &Path, f: &Finding) -> String {
    match f.at {
        Some(p) => format!("{}:{}:{}: {f}", path.display(), p.line, p.column),
        None => format!("{}: {f}", path.display()),
    }
}

/// The first error in the config at `path`, and how many more: why it does not load.
pub fn first_error(path: &Path) -> Option<String> {
    let r = check(Some(path));
    let first = r.errors.first()?;
    let more = match r.errors.len() - 1 {
        0 => String::new(),
        n => format!(" (and {n} more)"),
    };
    Some(format!("{}{more}", line(&r.path, first)))
}

/// `cosched check-config [FILE] [--json]`.
pub fn run(file: Option<&Path>, json: bool) -> anyhow::Result<()> {
    let r: Report = check(file);
    if json {
        let out = Out {
            schema_version: SCHEMA_VERSION,
            file: r.path.clone(),
            found: r.found,
            valid: r.errors.is_empty(),
            errors: r.errors.iter().map(Item::from).collect(),
            warnings: r.warnings.iter().map(Item::from).collect(),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for e in &r.errors {
            println!("{}", line(&r.path, e));
        }
        for w in &r.warnings {
            println!("{}: warning: {w}", r.path.display());
        }
        if r.errors.is_empty() {
            let what = if r.found { "valid" } else { "not there: the daemon runs with the defaults, which are valid" };
            println!("{}: {what}", r.path.display());
        }
    }
    if r.errors.is_empty() {
        Ok(())
    } else {
        Err(Invalid { count: r.errors.len(), path: r.path }.into())
    }
}
