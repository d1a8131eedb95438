//! The control socket's request parser, as the daemon runs it on a client's input: no panic;
//! a request that parses serialises and parses back to itself.
#![no_main]

use cosched_host::control::parse_request;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(Ok(req)) = parse_request(data) {
        let line = serde_json::to_string(&req).unwrap() + "\n";
        assert_eq!(parse_request(line.as_bytes()).map(Result::ok), Some(Some(req)));
    }
});
