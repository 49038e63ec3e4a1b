//! The SSE parser: bounded events, the same result whatever the read boundaries.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| agentrt_runtime::fuzzing::sse(data));
