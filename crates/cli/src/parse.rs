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
    fn range(&self) -> String {
        if self.hi == u64::MAX {
            format!("{} or more", self.lo)
        } else {
            format!("{}..={}", self.lo, self.hi)
        }
    }

    /// The number, or why not.
    fn read(&self, s: &str) -> Result<u64, String> {
        let negative = s.strip_prefix('-').is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
        match s.parse::<u64>() {
            Ok(n) if (self.lo..=self.hi).contains(&n) => Ok(n),
            Ok(_) => Err(format!("{s} is out of range {}", self.range())),
            Err(_) if negative => Err(format!("{s} is out of range {}", self.range())),
            Err(_) => Err(format!("{s:?} is not a whole number ({})", self.range())),
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
                Err(_) => format!("{s} is out of range {}", self.range()),
            },
            Err(why) => why,
        };
        Err(invalid(cmd, arg, &s, &why))
    }
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
        assert_eq!(p.read("-5"), Err("-5 is out of range 1..=98".into()));
        assert_eq!(p.read("99"), Err("99 is out of range 1..=98".into()));
        assert_eq!(p.read("x"), Err("\"x\" is not a whole number (1..=98)".into()));
        assert_eq!(whole::<u64>(0..=u64::MAX).read("1.5"), Err("\"1.5\" is not a whole number (0 or more)".into()));
    }
}
