//! The host config loader on arbitrary text: parse, validate, and derive what the daemon
//! derives from it; no panic, whatever the values.
#![no_main]

use cosched_host::config::HostConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(cfg) = toml::from_str::<HostConfig>(text) else { return };
    if cfg.validate().is_ok() {
        let _ = cfg.rt();
        let _ = cfg.membw.regulator();
        let _ = cfg.membw.check_ns();
        for name in cfg.vm.keys() {
            let _ = cfg.membw_share(name);
        }
    }
});
