//! The sled store's record codec: decode, and re-encode what decodes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| agentrt_runtime::fuzzing::sled_record(data));
