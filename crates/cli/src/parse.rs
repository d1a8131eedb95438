//! How the command line's values are read: booleans spelt as in the config (`true`, `false`),
//! whole numbers in a range, resources by name; each refusal in plain words (no Rust type).

use std::ffi::OsStr;
use std::marker::PhantomData;
use std::ops::RangeInclusive;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::error::ErrorKind;
use cosched_proto::Resource;

/// A switch's value: `true` or `false`, as the config's booleans are spelt. `on` and `off`, the
/// spelling of earlier versions, are still read (and not offered).
pub fn boolean() -> impl TypedValueParser<Value = bool> {
    PossibleValuesParser::new([PossibleValue::new("true").alias("on"), PossibleValue::new("false").alias("off")])
        .map(|s| s == "true" || s == "on")
}

/// A whole number in a range, read into `T` (which holds the whole range).
#[derive(Debug, Clone, Copy)]
pub struct Whole<T> {
    lo: u64,
    hi: u64,
    into: PhantomData<fn() -> T>,
}

/// A whole number in `range`.
pub fn whole<T>(range: RangeInclusive<u64>) -> Whole<T> {
    Whole { lo: *range.start(), hi: *range.end(), into: PhantomData }
}

impl<T> Whole<T> {
    /// "must be a whole number from 1 to 98" (or "0 or more").
    fn must(&self) -> String {
        if self.hi == u64::MAX {
            format!("must be a whole number, {} or more", self.lo)
        } else {
            format!("must be a whole number from {} to {}", self.lo, self.hi)
        }
    }

    /// The number, or why not.
    fn read(&self, s: &str) -> Result<u64, String> {
        match s.parse::<u64>() {
            Ok(n) if (self.lo..=self.hi).contains(&n) => Ok(n),
            _ => Err(self.must()),
        }
    }
}

impl<T: TryFrom<u64> + Clone + Send + Sync + 'static> TypedValueParser for Whole<T> {
    type Value = T;

    fn parse_ref(&self, cmd: &clap::Command, arg: Option<&clap::Arg>, value: &OsStr) -> Result<T, clap::Error> {
        let s = value.to_string_lossy();
        let why = match self.read(&s) {
            Ok(n) => match T::try_from(n) {
                Ok(v) => return Ok(v),
                Err(_) => self.must(),
            },
            Err(why) => why,
        };
        Err(invalid(cmd, arg, &s, &why))
    }
}

/// `cmd` (and its subcommands) with every whole-number argument read by [`whole`] over its
/// type's whole range (clap's own parsers are meant: a [`whole`] already there is replaced too), so that a refusal says "must be a whole number from 0 to
/// 255", not clap's "invalid digit found in string". The agent's `--watch-max` keeps its range.
pub fn plain_numbers(mut cmd: clap::Command) -> clap::Command {
    use clap::builder::ValueParser;
    let is = |t, p: ValueParser| p.type_id() == t;
    let ids: Vec<String> = cmd.get_arguments().map(|a| a.get_id().to_string()).collect();
    // Every argument, in order: each is put last, so that the order (of --help, of guest.toml's
    // keys) stays.
    for id in ids {
        cmd = cmd.mut_arg(&id, |a| {
            if !a.get_action().takes_values() {
                return a;
            }
            let t = a.get_value_parser().type_id();
            let replace: Option<ValueParser> = if id == "watch_max" {
                Some(whole::<u32>(1..=65536).into())
            } else if is(t, clap::value_parser!(u64).into()) {
                Some(whole::<u64>(0..=u64::MAX).into())
            } else if is(t, clap::value_parser!(u32).into()) {
                Some(whole::<u32>(0..=u64::from(u32::MAX)).into())
            } else if is(t, clap::value_parser!(u8).into()) {
                Some(whole::<u8>(0..=255).into())
            } else {
                None
            };
            match replace {
                Some(p) => a.value_parser(p).allow_negative_numbers(true),
                None => a,
            }
        });
    }
    let subs: Vec<String> = cmd.get_subcommands().map(|s| s.get_name().to_string()).collect();
    subs.iter().fold(cmd, |cmd, s| cmd.mut_subcommand(s, plain_numbers))
}

/// A resource by name (`cpu`, `io`, `membw`, `event`); a name the daemon does not know is
/// refused as it refuses it ("unknown resource ...").
#[derive(Debug, Clone, Copy)]
pub struct ResourceName;

impl TypedValueParser for ResourceName {
    type Value = String;

    fn parse_ref(&self, cmd: &clap::Command, arg: Option<&clap::Arg>, value: &OsStr) -> Result<String, clap::Error> {
        let s = value.to_string_lossy();
        match Resource::from_name(&s) {
            Some(r) => Ok(r.name().to_string()),
            None => Err(invalid(
                cmd,
                arg,
                &s,
                &format!("unknown resource {s:?} (known: {})", cosched_core::error::known_resources()),
            )),
        }
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(Resource::ALL.iter().map(|r| PossibleValue::new(r.name()))))
    }
}

/// clap's usage error for a value refused: `invalid value 'X' for 'ARG': why`.
fn invalid(cmd: &clap::Command, arg: Option<&clap::Arg>, value: &str, why: &str) -> clap::Error {
    let arg = arg.map_or_else(|| "...".to_string(), ToString::to_string);
    let mut cmd = cmd.clone();
    cmd.error(ErrorKind::ValueValidation, format!("invalid value '{value}' for '{arg}': {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_refused_in_plain_words() {
        let p = whole::<u8>(1..=98);
        assert_eq!(p.read("7"), Ok(7));
        for bad in ["-5", "99", "x", "1.5"] {
            assert_eq!(p.read(bad), Err("must be a whole number from 1 to 98".into()), "{bad}");
        }
        assert_eq!(whole::<u64>(0..=u64::MAX).read("-1"), Err("must be a whole number, 0 or more".into()));
        assert_eq!(
            plain_numbers_of(&["--min-boost-us", "-5"]),
            "invalid value '-5' for '--min-boost-us <MIN_BOOST_US>': must be a whole number, 0 or more"
        );
        assert_eq!(
            plain_numbers_of(&["--watch-max", "0"]),
            "invalid value '0' for '--watch-max <WATCH_MAX>': must be a whole number from 1 to 65536"
        );
        assert_eq!(
            plain_numbers_of(&["--rt-priority", "x"]),
            "invalid value 'x' for '--rt-priority <RT_PRIORITY>': must be a whole number from 0 to 4294967295"
        );
    }

    /// The agent's error for `args`, its first line without "error: ".
    fn plain_numbers_of(args: &[&str]) -> String {
        use clap::Args;
        let cmd = plain_numbers(cosched_agent::Options::augment_args(clap::Command::new("guest")));
        let e = cmd.try_get_matches_from(std::iter::once("guest").chain(args.iter().copied())).unwrap_err();
        e.to_string().lines().next().unwrap().trim_start_matches("error: ").to_string()
    }
}
