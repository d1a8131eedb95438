//! The guest agent's config, `/etc/cosched/guest.toml`, described for docs/configuration.md
//! (`cosched generate config-reference --format markdown` writes it after the host's keys).
//!
//! Everything but "when to change it" comes from the agent's own option definitions, the ones
//! [`guest_config`] reads the file with: the keys, their defaults, what they do (the options'
//! help) and the values they take (found by asking the agent's option parser). [`GUIDE`] holds,
//! per key, when to change it and, for a key without a default, what unset means; the tests fail
//! when it and the agent's options disagree.

use std::fmt::Write as _;

use cosched_host::config_reference::wrap;

use crate::guest_config;

/// What the agent's options cannot say of a key.
struct Guide {
    key: &'static str,
    /// When an operator changes it.
    change: &'static str,
    /// For a key without a default: what leaving it out means.
    unset: Option<&'static str>,
    /// For a key whose values are words rather than numbers or true/false: what it takes.
    values: Option<&'static str>,
}

const fn guide(key: &'static str, change: &'static str) -> Guide {
    Guide { key, change, unset: None, values: None }
}

/// Every key of the guest's config, in the agent's order.
const GUIDE: &[Guide] = &[
    Guide {
        key: "port",
        change: "Only when QEMU names the port otherwise than `org.cosched.0`, or the guest sees it elsewhere.",
        unset: Some("the port named `org.cosched.0`, found in `/sys/class/virtio-ports/*/name`"),
        values: Some("a path (a character device)"),
    },
    guide(
        "min_boost_us",
        "Raise it when boosts end and start again many times a second (each is two frames and, on the host, \
         two changes of every thread of the VM); lower it to give the host back its CPU sooner.",
    ),
    guide(
        "hold_periodic_max_us",
        "Raise it above the period of a slower periodic real-time task that should stay boosted between its \
         activations; 0 when only the predictive boost (`predict`) should cover such tasks.",
    ),
    guide(
        "idle_deboost_ms",
        "Lower it (to 1) with the predictive boost, so that a VM is deboosted between activations; raise it \
         if a busy task that needs a boost is deboosted while it still runs.",
    ),
    guide(
        "watch_count",
        "Only in count mode (`watch_budget_ms = 0`): more switch-ins for applications that take longer to \
         start, 0 to turn the new-task heuristic off.",
    ),
    guide("watch_budget_ms", "Raise it for applications whose start takes more CPU time; 0 for the count mode."),
    guide("watch_refill_us", "Raise it when interactive newcomers that sleep often are released too soon."),
    guide(
        "watch_max",
        "Raise it when many tasks start at once (a build, a shell script) and the ones that matter are not watched.",
    ),
    guide(
        "io_hold_ms",
        "Raise it if `cosched status` on the host shows the VM's I/O boost flipping on and off during one \
         application start; 0 to end it as soon as the guest's BFQ has nothing weight-raised.",
    ),
    guide(
        "predict",
        "false when the host refuses predicted wake-ups anyway, or to send fewer frames; keep true for \
         periodic real-time tasks.",
    ),
    guide(
        "predict_standing",
        "false to tell every wake-up apart (a frame or two per period), e.g. against a host that boosts \
         too early or too late for the guest's window; keep true for periodic real-time tasks.",
    ),
    guide(
        "predict_horizon_ms",
        "Raise it for periodic tasks with a longer period than this, so that their wake-ups are predicted.",
    ),
    guide(
        "probe_frames",
        "Never in use: it only sends frames that change nothing, to measure what the channel costs a \
         real-time guest (the rt-vs-static experiment's dummy-frame variant).",
    ),
    guide(
        "budget_backoff_ms",
        "Raise it when the host's budget ends boosts often (the agent then asks less); lower it to ask again \
         sooner.",
    ),
    guide(
        "rt_priority",
        "Set it (1 to 99) when the guest's own real-time tasks keep the agent from running, so that its \
         frames are late. 0 otherwise.",
    ),
    Guide {
        key: "stats_interval_s",
        change: "To watch the agent's counters in its log (journalctl -u cosched-guest) while tuning it.",
        unset: Some("the counters are printed only when the agent stops"),
        values: None,
    },
    Guide {
        key: "membw_socket",
        change: "Only where `/run/cosched` is not the place for it.",
        unset: None,
        values: Some("a path"),
    },
    Guide {
        key: "membw_group",
        change: "To let the members of a group that is not root ask for memory bandwidth.",
        unset: Some("only root can ask for memory bandwidth"),
        values: Some("a group's name, or its number (gid)"),
    },
    guide(
        "no_membw",
        "true in a guest where nothing asks for memory bandwidth, or on a host that does not regulate it.",
    ),
    guide("verbose", "true while tracing what the agent sends; it logs every boost and deboost."),
];

/// How a key's values are read: asked of the agent's option parser.
#[derive(Debug, PartialEq, Eq)]
enum Values {
    /// `true` or `false` (a switch, or an option that takes either).
    Bool,
    /// A whole number from `min` to `max`.
    Int { min: u64, max: u64 },
    /// Words: `Guide::values` says which.
    Words,
}

/// Whether `cosched guest --OPTION value` parses.
fn accepts(arg: &clap::Arg, value: &str) -> bool {
    let flag = format!("--{}", arg.get_long().expect("a long option"));
    guest_config::command().try_get_matches_from(["cosched guest", &flag, value]).is_ok()
}

fn values(arg: &clap::Arg) -> Values {
    if !arg.get_action().takes_values() || (accepts(arg, "true") && accepts(arg, "false") && !accepts(arg, "2")) {
        return Values::Bool;
    }
    if accepts(arg, "words") || !(accepts(arg, "0") || accepts(arg, "1")) {
        return Values::Words;
    }
    let min = if accepts(arg, "0") { 0 } else { 1 };
    // The largest value it takes: its type's, or a range's.
    let (mut lo, mut hi) = (min, u64::MAX);
    if !accepts(arg, &hi.to_string()) {
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if accepts(arg, &mid.to_string()) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        hi = lo;
    }
    Values::Int { min, max: hi }
}

/// A key's unit, from its name.
fn unit(key: &str) -> &'static str {
    [("_us", "µs"), ("_ms", "ms"), ("_s", "s")].iter().find(|(s, _)| key.ends_with(s)).map_or("", |(_, u)| u)
}

/// The option's help, with options named as the file's keys (`--watch-max` is `watch_max`, and
/// `--watch-budget-ms 0` is `watch_budget_ms = 0`), without the `[default: ...]` the meta line says.
fn help(arg: &clap::Arg, keys: &[String]) -> String {
    let mut text = arg.get_long_help().or(arg.get_help()).map(|h| h.to_string()).unwrap_or_default();
    if let Some(i) = text.find(" [default: ") {
        text.truncate(i);
    }
    let mut out: Vec<String> = Vec::new();
    let mut tokens = text.split_whitespace().peekable();
    // Whether the last token written ends a `key = N`.
    let mut after_pair = false;
    while let Some(t) = tokens.next() {
        let lead = t.find("--").filter(|&i| t[..i].chars().all(|c| c == '(' || c == '`'));
        let option = lead.and_then(|i| {
            let name: String = t[i + 2..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
            keys.iter().find(|k| **k == name.replace('-', "_")).map(|k| (i, name.len(), k))
        });
        let Some((i, len, key)) = option else {
            out.push(t.to_string());
            after_pair = false;
            continue;
        };
        let rest = &t[i + 2 + len..];
        let number = tokens.peek().filter(|n| rest.is_empty() && n.starts_with(|c: char| c.is_ascii_digit()));
        if let Some(n) = number.map(|n| n.to_string()) {
            tokens.next();
            if after_pair {
                if let Some(last) = out.last_mut() {
                    last.push(',');
                }
            }
            out.push(format!("{}{key}", &t[..i]));
            out.push("=".into());
            out.push(n);
            after_pair = true;
        } else {
            out.push(format!("{}{key}{rest}", &t[..i]));
            after_pair = false;
        }
    }
    let mut text = out.join(" ");
    if !text.ends_with('.') {
        text.push('.');
    }
    text
}

/// The section of docs/configuration.md on the guest's config.
pub fn markdown() -> String {
    let keys = guest_config::keys();
    let names: Vec<String> = keys.iter().map(|(k, _)| k.clone()).collect();
    let mut out = String::from("\n## Guest agent: `/etc/cosched/guest.toml`\n\n");
    for p in [
        "The guest agent (`cosched guest`, run by `cosched-guest.service` in the VM) reads \
         `/etc/cosched/guest.toml`, or the file named with `--config`. Every key is optional: a key left out \
         takes its default, and a missing `/etc/cosched/guest.toml` means every default. A file named with \
         `--config` that does not exist is an error, and so is an unknown key or a value the agent does not \
         take: the message names the key.",
        "Each key is one of the agent's options without its leading dashes, `-` written `_` (`--min-boost-us` \
         is `min_boost_us`); an option given on the command line wins over the file. A key that is a switch \
         (`no_membw`, `verbose`) is `true` or `false`. The package `cosched-guest` installs every key, \
         commented out at its default, as `/etc/cosched/guest.toml` (`packaging/guest.toml`, from `cosched \
         generate guest-config`). After a change: `systemctl restart cosched-guest`.",
    ] {
        out += &wrap(p, 100, "");
        out.push('\n');
    }
    out.pop();
    for (key, arg) in &keys {
        let g = GUIDE.iter().find(|g| g.key == key).unwrap_or_else(|| panic!("{key}: not in GUIDE"));
        let default = arg.get_default_values().first().map(|d| d.to_string_lossy().into_owned());
        let values = values(arg);
        let default = match (&values, default, g.unset) {
            (Values::Bool, None, _) => "`false`".to_string(),
            (Values::Words, Some(d), _) => format!("`{}`", toml::Value::String(d)),
            (_, Some(d), _) => format!("`{d}`"),
            (_, None, Some(u)) => format!("unset: {u}"),
            (_, None, None) => panic!("{key}: no default, and GUIDE does not say what unset means"),
        };
        let mut meta = format!("Default: {default}");
        if !unit(key).is_empty() {
            let _ = write!(meta, " · Unit: {}", unit(key));
        }
        let described = match values {
            Values::Bool => "true or false".to_string(),
            Values::Int { min, max: u64::MAX } => format!("{min} or more"),
            Values::Int { min, max } => format!("{min} to {max}"),
            Values::Words => g.values.unwrap_or_else(|| panic!("{key}: GUIDE does not say its values")).to_string(),
        };
        let _ = write!(out, "\n### `{key}`\n\n{meta} · Values: {described}\n\n");
        out += &wrap(&help(arg, &names), 100, "");
        out.push('\n');
        out += &wrap(&format!("**When to change it.** {}", g.change), 100, "");
    }
    out
}

/// docs/configuration.md: the host's keys, then the guest's.
pub fn configuration_md() -> String {
    cosched_host::config_reference::render(cosched_host::config_reference::Format::Markdown) + &markdown()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guide_has_every_key_of_the_agent_and_no_other() {
        let keys: Vec<String> = guest_config::keys().into_iter().map(|(k, _)| k).collect();
        let guided: Vec<String> = GUIDE.iter().map(|g| g.key.to_string()).collect();
        assert_eq!(guided, keys, "GUIDE against the agent's options (cosched_agent::Options), in their order");
        assert!(keys.len() >= 18, "{keys:?}");
    }

    /// `unset` is for the keys without a default, `values` for those that take words: what the
    /// agent's parser says, not what the guide believes.
    #[test]
    fn the_guide_says_unset_and_values_exactly_where_the_options_need_it() {
        for (key, arg) in guest_config::keys() {
            let g = GUIDE.iter().find(|g| g.key == key).unwrap();
            let v = values(&arg);
            let no_default = arg.get_default_values().is_empty() && v != Values::Bool;
            assert_eq!(g.unset.is_some(), no_default, "{key}: `unset` is for (and only for) keys without a default");
            assert_eq!(g.values.is_some(), v == Values::Words, "{key}: `values` is for (and only for) words");
        }
    }

    #[test]
    fn values_are_what_the_parser_takes() {
        let arg = |name: &str| guest_config::keys().into_iter().find(|(k, _)| k == name).unwrap().1;
        assert_eq!(values(&arg("watch_max")), Values::Int { min: 1, max: 65536 });
        assert_eq!(values(&arg("min_boost_us")), Values::Int { min: 0, max: u64::MAX });
        assert_eq!(values(&arg("predict")), Values::Bool);
        assert_eq!(values(&arg("no_membw")), Values::Bool);
        assert_eq!(values(&arg("port")), Values::Words);
    }

    #[test]
    fn options_are_named_as_keys() {
        let page = markdown();
        assert!(!page.contains("--watch-budget-ms") && page.contains("(with watch_budget_ms = 0,"), "{page}");
        assert!(page.contains("`hold_periodic_max_us = 0, idle_deboost_ms = 1`"), "{page}");
        assert!(page.contains("(watch_refill_us each)") && !page.contains("[default:"), "{page}");
    }

    /// The committed page is what the generator writes: a change of the agent's options or of the
    /// host's configuration that is not carried into it fails here (and, for the host's part, in
    /// cosched-host's config_reference tests).
    #[test]
    fn docs_configuration_md_is_generated() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");
        let want = configuration_md();
        if std::env::var("COSCHED_BLESS").is_ok_and(|v| v == "1") {
            std::fs::write(path, &want).unwrap();
        }
        let got = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            got == want,
            "docs/configuration.md is not what the reference generates: run `cosched generate config-reference \
             --format markdown > docs/configuration.md` (or COSCHED_BLESS=1 cargo test --release -p cosched \
             guest_reference)"
        );
    }
}
