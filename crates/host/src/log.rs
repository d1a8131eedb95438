//! Minimal leveled logging to stderr (journald adds the timestamps when run as a service).

use std::sync::atomic::{AtomicU8, Ordering};

static LEVEL: AtomicU8 = AtomicU8::new(1);

/// 0 = warnings only, 1 = info (default), 2 = debug (every boost and deboost).
pub fn set_verbosity(v: u8) {
    LEVEL.store(v, Ordering::Relaxed);
}

pub fn enabled(level: u8) -> bool {
    LEVEL.load(Ordering::Relaxed) >= level
}

#[macro_export]
macro_rules! warn {
    ($($t:tt)*) => { eprintln!("cosched-host: warning: {}", format_args!($($t)*)) };
}

#[macro_export]
macro_rules! info {
    ($($t:tt)*) => { if $crate::log::enabled(1) { eprintln!("cosched-host: {}", format_args!($($t)*)) } };
}

#[macro_export]
macro_rules! debug {
    ($($t:tt)*) => { if $crate::log::enabled(2) { eprintln!("cosched-host: debug: {}", format_args!($($t)*)) } };
}
