//! The guest agent's config file, `/etc/cosched/guest.toml`: one key per `cosched guest` option,
//! named as the option without its dashes (`--min-boost-us` is `min_boost_us`), with the same
//! values and checks. Options given on the command line win over the file.
//!
//! The file's keys become the options they name, ahead of the command line's, and the whole is
//! parsed once by the agent's own option parser (later options override earlier ones): a value
//! the command line would refuse is refused in the file too, with the key named.

use std::path::{Path, PathBuf};

use clap::{Args, FromArgMatches};
use cosched_agent::Options;

/// Where the agent's config is read from when `--config` does not say.
pub const DEFAULT_PATH: &str = "/etc/cosched/guest.toml";

#[derive(Debug, thiserror::Error)]
pub enum GuestConfigError {
    #[error("{path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {source}")]
    Toml { path: PathBuf, source: toml::de::Error },
    #[error("{path}: unknown key {key:?} (one of: {known})")]
    UnknownKey { path: PathBuf, key: String, known: String },
    #[error("{path}: {key} = {value}: {why}")]
    Value { path: PathBuf, key: String, value: String, why: String },
    /// A value the agent's options refuse (the command line's were checked before: the file's).
    #[error("{path}: {message}")]
    Options { path: PathBuf, message: String },
}

/// The agent's options as a command of their own.
pub(crate) fn command() -> clap::Command {
    crate::parse::plain_numbers(Options::augment_args(clap::Command::new("cosched guest")))
}

/// The file's keys: the agent's long options, as TOML keys.
pub(crate) fn keys() -> Vec<(String, clap::Arg)> {
    command()
        .get_arguments()
        .filter_map(|a| a.get_long().filter(|l| *l != "help").map(|l| (l.replace('-', "_"), a.clone())))
        .collect()
}

/// The options the file at `path` says, as command-line arguments.
fn args_from(path: &Path, text: &str) -> Result<Vec<String>, GuestConfigError> {
    let table: toml::Table =
        text.parse().map_err(|source| GuestConfigError::Toml { path: path.to_path_buf(), source })?;
    let keys = keys();
    let mut args = Vec::new();
    for (key, value) in table {
        let Some((_, arg)) = keys.iter().find(|(k, _)| *k == key) else {
            let known = keys.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join(", ");
            return Err(GuestConfigError::UnknownKey { path: path.to_path_buf(), key, known });
        };
        let flag = format!("--{}", arg.get_long().expect("long"));
        let bad = |why: &str| GuestConfigError::Value {
            path: path.to_path_buf(),
            key: key.clone(),
            value: value.to_string(),
            why: why.to_string(),
        };
        let takes_value = arg.get_action().takes_values();
        match value {
            // A switch (`no_membw = true`): present or not.
            toml::Value::Boolean(b) if !takes_value => {
                if b {
                    args.push(flag);
                }
            }
            toml::Value::Boolean(b) => args.extend([flag, b.to_string()]),
            toml::Value::Integer(n) if takes_value => args.extend([flag, n.to_string()]),
            toml::Value::String(s) if takes_value => args.extend([flag, s]),
            _ if !takes_value => return Err(bad("this key is true or false")),
            _ => return Err(bad("a number, a string, or true or false")),
        }
    }
    Ok(args)
}

/// The agent's options: the config file's (`explicit`, else [`DEFAULT_PATH`] if it exists),
/// then `cli`, the arguments after `guest` on the command line, which win.
pub fn options(explicit: Option<&Path>, cli: &[String]) -> Result<Options, GuestConfigError> {
    let path = explicit.map_or_else(|| PathBuf::from(DEFAULT_PATH), Path::to_path_buf);
    let mut argv = vec!["cosched guest".to_string()];
    match std::fs::read_to_string(&path) {
        Ok(text) => argv.extend(args_from(&path, &text)?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && explicit.is_none() => {}
        Err(source) => return Err(GuestConfigError::Read { path, source }),
    }
    argv.extend(cli.iter().cloned());
    let refused = |e: clap::Error| GuestConfigError::Options { path: path.clone(), message: as_key(&e) };
    let matches = command().args_override_self(true).try_get_matches_from(argv).map_err(refused)?;
    Options::from_arg_matches(&matches).map_err(refused)
}

/// clap's "invalid value 'V' for '--long-name <NAME>': why" as the file says it:
/// "long_name = V: why".
fn as_key(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default().trim_start_matches("error: ");
    let parts = first.strip_prefix("invalid value '").and_then(|r| r.split_once("' for '--")).and_then(|(value, r)| {
        let (arg, why) = r.split_once("': ")?;
        Some((value, arg.split(' ').next()?.replace('-', "_"), why))
    });
    match parts {
        Some((value, key, why)) => format!("{key} = {value}: {why}"),
        None => first.to_string(),
    }
}

/// The arguments of `guest` on this process's command line: after the `guest` subcommand, less
/// the global `--config` (the top-level parser took it).
pub fn guest_args(argv: &[String]) -> Vec<String> {
    let Some(i) = argv.iter().position(|a| a == "guest") else { return Vec::new() };
    let mut out = Vec::new();
    let mut it = argv[i + 1..].iter();
    while let Some(a) = it.next() {
        if a == "--config" {
            it.next();
        } else if !a.starts_with("--config=") {
            out.push(a.clone());
        }
    }
    out
}

/// `/etc/cosched/guest.toml` as the package installs it: every key, commented out at its
/// default, with what it does (from the option's help).
pub fn commented_default() -> String {
    let mut out = String::from(
        "# cosched guest agent: /etc/cosched/guest.toml\n\
         #\n\
         # Every key is a `cosched guest` option without its dashes (--min-boost-us is min_boost_us),\n\
         # shown commented out at its default. Options on the command line win over this file; the\n\
         # unit (cosched-guest.service) passes none. `man cosched-guest` says more of each.\n",
    );
    for (key, arg) in keys() {
        out.push('\n');
        let help = arg.get_long_help().or(arg.get_help()).map(|h| h.to_string()).unwrap_or_default();
        for line in textwrap(&help, 94) {
            out.push_str(&format!("# {line}\n"));
        }
        let takes_value = arg.get_action().takes_values();
        let default = arg.get_default_values().first().map(|d| d.to_string_lossy().into_owned());
        let value = match (takes_value, default) {
            (false, _) => "false".to_string(),
            (true, Some(d)) if d == "true" || d == "false" || d.parse::<i64>().is_ok() => d,
            (true, Some(d)) => format!("{d:?}"),
            (true, None) => {
                out.push_str(&format!("# (no default) {key} = ...\n"));
                continue;
            }
        };
        out.push_str(&format!("#{key} = {value}\n"));
    }
    out
}

/// `text` in lines of at most `width` characters, broken at spaces.
fn textwrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    for para in text.lines() {
        let mut line = String::new();
        for word in para.split_whitespace() {
            if !line.is_empty() && line.len() + 1 + word.len() > width {
                lines.push(std::mem::take(&mut line));
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("guest.toml");
        std::fs::write(&p, text).unwrap();
        (dir, p)
    }

    #[test]
    fn the_file_sets_options_and_the_command_line_wins() {
        let (_d, p) = write("min_boost_us = 800\npredict = false\nno_membw = true\nport = \"/dev/vport9p1\"\n");
        let o = options(Some(&p), &[]).unwrap();
        assert_eq!((o.min_boost_us, o.predict, o.no_membw), (800, false, true));
        assert_eq!(o.port.as_deref(), Some(Path::new("/dev/vport9p1")));
        assert_eq!(o.watch_budget_ms, 1_000, "a key not in the file keeps its default");
        let o = options(Some(&p), &["--min-boost-us".into(), "900".into(), "--predict".into(), "true".into()]).unwrap();
        assert_eq!((o.min_boost_us, o.predict), (900, true));
    }

    #[test]
    fn a_bad_key_or_value_is_refused_with_the_key_named() {
        let (_d, p) = write("min_boost = 800\n");
        let e = options(Some(&p), &[]).unwrap_err().to_string();
        assert!(e.contains("unknown key \"min_boost\"") && e.contains("min_boost_us"), "{e}");
        let (_d, p) = write("watch_max = 0\n");
        let e = options(Some(&p), &[]).unwrap_err().to_string();
        assert_eq!(e, format!("{}: watch_max = 0: must be a whole number from 1 to 65536", p.display()));
        let (_d, p) = write("min_boost_us = -5\n");
        let e = options(Some(&p), &[]).unwrap_err().to_string();
        assert_eq!(e, format!("{}: min_boost_us = -5: must be a whole number, 0 or more", p.display()));
        let (_d, p) = write("no_membw = 3\n");
        let e = options(Some(&p), &[]).unwrap_err().to_string();
        assert!(e.contains("no_membw = 3: this key is true or false"), "{e}");
        let (_d, p) = write("min_boost_us = \n");
        assert!(matches!(options(Some(&p), &[]), Err(GuestConfigError::Toml { .. })));
    }

    #[test]
    fn an_explicit_file_must_exist_and_the_default_may_not() {
        let e = options(Some(Path::new("/nonexistent/guest.toml")), &[]).unwrap_err();
        assert!(matches!(e, GuestConfigError::Read { .. }), "{e}");
    }

    #[test]
    fn the_guest_args_are_those_after_guest_without_the_global_config() {
        let argv: Vec<String> = ["cosched", "--config", "/x.toml", "guest", "-v", "--config=/y", "--min-boost-us", "1"]
            .map(String::from)
            .into();
        assert_eq!(guest_args(&argv), ["-v", "--min-boost-us", "1"]);
    }

    /// The packaged file is what this agent generates, and loads as it is (every key commented out:
    /// the defaults).
    #[test]
    fn the_packaged_guest_toml_is_generated_and_loads() {
        let packaged = concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/guest.toml");
        let text = std::fs::read_to_string(packaged).unwrap();
        assert_eq!(
            text,
            commented_default(),
            "packaging/guest.toml: run `cosched generate guest-config > packaging/guest.toml`"
        );
        let o = options(Some(Path::new(packaged)), &[]).unwrap();
        assert_eq!(o.min_boost_us, 500);
        // Uncommenting every key gives the defaults too.
        let active: String = text
            .lines()
            .filter(|l| l.starts_with('#') && l.contains(" = ") && !l.starts_with("# "))
            .map(|l| format!("{}\n", &l[1..]))
            .collect();
        let (_d, p) = write(&active);
        let o = options(Some(&p), &[]).unwrap();
        assert_eq!((o.min_boost_us, o.watch_budget_ms, o.predict), (500, 1_000, true));
    }
}
