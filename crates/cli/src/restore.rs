//! `cosched restore`: puts back what a dead daemon left changed, whatever the config says (it
//! runs after every stop of the unit and in the package's prerm, where a config with a typo
//! must not leave threads boosted).

use std::path::{Path, PathBuf};

use crate::ops::host_config;

/// Why `cosched restore` did not put everything back.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// A state directory named on the command line that is not there: a mistyped path must not
    /// pass for "nothing to restore".
    #[error("state directory {} does not exist (or is not a directory): nothing restored", .0.display())]
    NoStateDir(PathBuf),
    /// Some settings could not be put back (each was printed); their records stay.
    #[error("{count} setting(s) could not be restored (see above); their records are kept in {}", .dir.display())]
    Partial { count: usize, dir: PathBuf },
}

/// The version of `cosched restore --json`'s keys.
pub const SCHEMA_VERSION: u32 = 1;

/// `cosched restore --json`.
#[derive(Debug, serde::Serialize)]
struct Out<'a> {
    schema_version: u32,
    state_dir: &'a Path,
    restored: u64,
    gone: u64,
    untouched: u64,
    /// Each setting or record not put back (its record is kept).
    errors: &'a [String],
}

/// `cosched restore [--state-dir DIR] [--json]`.
pub fn restore(config: Option<&Path>, state_dir: Option<PathBuf>, json: bool) -> anyhow::Result<()> {
    // The config names the state directory, the cgroup hierarchy the weight lever's groups were
    // made in and the shield's host groups; what cannot be read of it is the default.
    let cfg = host_config(config);
    let state_dir = match state_dir {
        Some(dir) if !dir.is_dir() => return Err(RestoreError::NoStateDir(dir).into()),
        Some(dir) => dir,
        None => cfg.state_dir.clone(),
    };
    let r = cosched_host::daemon::restore_command(&state_dir, &cfg)?;
    if json {
        let out = Out {
            schema_version: SCHEMA_VERSION,
            state_dir: &state_dir,
            restored: r.restored,
            gone: r.gone,
            untouched: r.untouched,
            errors: &r.errors,
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "restored {} thread(s); {} gone; {} left as they were (changed by someone else or never changed)",
            r.restored, r.gone, r.untouched
        );
    }
    for e in &r.errors {
        eprintln!("cosched: restore: {e}");
    }
    if r.errors.is_empty() {
        Ok(())
    } else {
        Err(RestoreError::Partial { count: r.errors.len(), dir: state_dir }.into())
    }
}
