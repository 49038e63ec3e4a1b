//! The PostgreSQL store's record and timestamp codec.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| agentrt_runtime::fuzzing::pg_record(data));
