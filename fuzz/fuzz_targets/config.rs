//! The TOML configuration: parsed over the defaults, then validated, as
//! `Config::load` does with a file; and the duration syntax it uses.
#![no_main]

use agentrt_server::Config;
use agentrt_server::config::parse_duration;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = parse_duration(text);
    if let Ok(config) = Config::parse_toml(text) {
        let _ = config.validate();
    }
});
