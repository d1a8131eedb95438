//! `cosched reload`, `cosched reset` and `cosched vm reset`: the daemon applies the difference
//! (docs/runtime-control.md) and answers what changed, printed one line each.

use std::path::Path;

use anyhow::Context;
use cosched_host::control::{request, Request};
use cosched_host::reload::Changes;

/// `cosched reload`: the daemon reads its config file again and applies what changed.
pub fn reload(socket: &Path) -> anyhow::Result<()> {
    changes(socket, &Request::Reload)
}

/// `cosched reset` (`vm`: `None`) or `cosched vm reset VM`: the operator's settings dropped,
/// back to the config.
pub fn reset(socket: &Path, vm: Option<String>) -> anyhow::Result<()> {
    changes(socket, &Request::Reset { vm })
}

/// Sends `req`, prints the changes the daemon answers.
fn changes(socket: &Path, req: &Request) -> anyhow::Result<()> {
    let data = request(socket, req)?.context("empty reply")?;
    let c: Changes = serde_json::from_value(data).context("reading the daemon's reply")?;
    print!("{}", crate::status::changes_text(&c));
    Ok(())
}
