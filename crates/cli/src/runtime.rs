//! `cosched reload`, `cosched reset` and `cosched vm reset`: the daemon applies the difference
//! (docs/runtime-control.md) and answers what changed, printed one line each.

use std::path::Path;

use anyhow::Context;
use cosched_host::control::{request, Request};
use cosched_host::reload::Changes;

/// `cosched reload`: the daemon reads its config file again and applies what changed.
pub fn reload(socket: &Path, json: bool) -> anyhow::Result<()> {
    changes(socket, &Request::Reload, json)
}

/// `cosched reset` (`vm`: `None`) or `cosched vm reset VM`: the operator's settings dropped,
/// back to the config.
pub fn reset(socket: &Path, vm: Option<String>, json: bool) -> anyhow::Result<()> {
    changes(socket, &Request::Reset { vm }, json)
}

/// Sends `req`, prints the changes the daemon answers (with `json`, as JSON with a
/// "schema_version").
fn changes(socket: &Path, req: &Request, json: bool) -> anyhow::Result<()> {
    let data = request(socket, req)?.context("empty reply")?;
    let c: Changes = serde_json::from_value(data).context("reading the daemon's reply")?;
    if json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            schema_version: u32,
            #[serde(flatten)]
            changes: &'a Changes,
        }
        let out = Out { schema_version: crate::ops::CHANGE_SCHEMA_VERSION, changes: &c };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", crate::status::changes_text(&c));
    }
    Ok(())
}
