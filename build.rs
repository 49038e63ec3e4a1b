//! Generates the agentrt.v1 protobuf and gRPC code — the operator hooks'
//! `agentrt.hooks.v1`, and the A2A protocol's `lf.a2a.v1` (the vendored
//! normative file, proto/lf/a2a/v1) — with protox
//! (a pure-Rust protobuf compiler), so no system `protoc` is needed.

use std::{env, fs, path::PathBuf};

const PROTOS: &[&str] = &[
    "proto/agentrt/v1/common.proto",
    "proto/agentrt/v1/sessions.proto",
    "proto/agentrt/v1/runtime.proto",
    "proto/agentrt/v1/admin.proto",
    "proto/agentrt/v1/agents.proto",
];

/// The service operators implement (`agentrt.hooks.v1.HookService`):
/// agentrt calls it, so it is not served (nor listed by reflection); its
/// server stubs are for operators writing one in Rust, and for tests.
const HOOK_PROTOS: &[&str] = &["proto/agentrt/hooks/v1/hooks.proto"];

/// The A2A protocol's service (served on the public port beside
/// agentrt.v1, and listed by its reflection).
const A2A_PROTOS: &[&str] = &["proto/lf/a2a/v1/a2a.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    // The descriptor set feeds server reflection (v1 and v1alpha). Encoded
    // by protox itself so that extension options (the A2A file's
    // `google.api.field_behavior`, `google.api.http`) are kept: a
    // prost_types round trip would drop them.
    let public = protox::Compiler::new(["proto"])?
        .include_imports(true)
        .include_source_info(true)
        .open_files(PROTOS.iter().chain(A2A_PROTOS))?
        .encode_file_descriptor_set();
    fs::write(out_dir.join("agentrt_descriptor.bin"), public)?;
    let all = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // prost with a 1 KiB encode buffer per stream (see src/codec.rs).
        .codec_path("crate::codec::SmallBufferCodec")
        .compile_fds(all)?;
    // lf.a2a.v1 apart: it shares no types with agentrt.v1, and its
    // google.api imports only carry options (no code is used from them).
    let a2a = protox::compile(A2A_PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::codec::SmallBufferCodec")
        .compile_fds(a2a)?;
    let hooks = protox::compile(HOOK_PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::codec::SmallBufferCodec")
        .compile_fds(hooks)?;
    Ok(())
}
