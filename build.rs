//! Generates the agentrt.v1 protobuf and gRPC code with protox (a pure-Rust
//! protobuf compiler), so no system `protoc` is needed.

use std::{env, fs, path::PathBuf};

use prost::Message as _;

const PROTOS: &[&str] = &[
    "proto/agentrt/v1/common.proto",
    "proto/agentrt/v1/sessions.proto",
    "proto/agentrt/v1/runtime.proto",
    "proto/agentrt/v1/admin.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(PROTOS, ["proto"])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    // The descriptor set feeds server reflection (v1 and v1alpha).
    fs::write(out_dir.join("agentrt_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // prost with a 1 KiB encode buffer per stream (see src/codec.rs).
        .codec_path("crate::codec::SmallBufferCodec")
        .compile_fds(fds)?;
    Ok(())
}
