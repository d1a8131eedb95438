//! Runs the memory-bandwidth regulator of the daemon (`cosched_core::membw`) on a model of the
//! memory system (`cosched_core::membw::sim`): a scenario as JSON on stdin (`{"config": ...,
//! "vms": [...]}`), the report as JSON on stdout. The experiment `membw` drives it.

use std::io::Read;

use cosched_core::membw::sim::{self, SimConfig, SimVm};

#[derive(serde::Deserialize)]
struct Scenario {
    config: SimConfig,
    vms: Vec<SimVm>,
}

fn main() {
    let mut text = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut text) {
        eprintln!("cosched-membw-sim: reading stdin: {e}");
        std::process::exit(2);
    }
    let s: Scenario = match serde_json::from_str(&text) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cosched-membw-sim: bad scenario: {e}");
            std::process::exit(2);
        }
    };
    match sim::run(&s.config, &s.vms) {
        Ok(r) => println!("{}", serde_json::to_string(&r).expect("a report serializes")),
        Err(e) => {
            eprintln!("cosched-membw-sim: {e}");
            std::process::exit(1);
        }
    }
}
