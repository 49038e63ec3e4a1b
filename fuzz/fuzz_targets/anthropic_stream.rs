//! The Anthropic Messages event decoder behind the SSE parser.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| agentrt_runtime::fuzzing::anthropic_stream(data));
