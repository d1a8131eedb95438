//! The cosched host daemon (`cosched host`) and the pieces it is made of.
//!
//! - [`sched`]: `sched_getattr` / `sched_setattr` and the other calls on a thread ([`ThreadOps`]);
//! - [`settings`]: each kind of setting the daemon changes, read, set and recorded;
//! - [`store`]: original settings on disk, and restoring them after a crash;
//! - [`actuator`]: a VM's threads to a [`cosched_core::Level`] and back;
//! - `daemon`: the event loop (channels, inotify, signals, control socket, metrics; with the
//!   default feature `bpf`);
//! - [`control`]: the operator protocol and its client;
//! - [`peer`]: which QEMU process is at the other end of a chardev socket;
//! - [`config`]: the TOML configuration, and [`config_reference`], every key of it described
//!   (docs/configuration.md, packaging/host.toml and cosched-host.toml(5) are generated from it);
//! - [`operator`]: the operator's settings over it, kept in the state directory;
//! - [`reload`]: a new config or operator's setting while running: what changes, and what needs
//!   a restart.

#[macro_use]
pub mod log;
pub mod actuator;
pub mod blockdev;
pub mod caps;
pub mod cgroup;
pub mod config;
pub mod config_reference;
pub mod control;
#[cfg(feature = "bpf")]
pub mod daemon;
pub mod error;
pub mod membw;
pub mod metrics;
pub mod metrics_reference;
pub mod operator;
pub mod peer;
pub mod reload;
pub mod sched;
pub mod settings;
pub mod shield;
pub mod store;

pub use sched::{SchedOps, ThreadOps};

/// This binary's build: its version, and the git commit it was built from (the build script's
/// `COSCHED_GIT_COMMIT`: the environment's, else `git rev-parse` of the checkout; empty if
/// neither).
pub fn build() -> cosched_status::Build {
    cosched_status::Build { version: env!("CARGO_PKG_VERSION").into(), commit: env!("COSCHED_GIT_COMMIT").into() }
}
