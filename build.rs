//! Generates the agentrt.v1 protobuf and gRPC code — and the replicas'
//! internal agentrt.cluster.v1 service — with protox (a pure-Rust protobuf
//! compiler), so no system `protoc` is needed.

use std::{env, fs, path::PathBuf};

use prost::Message as _;

const PROTOS: &[&str] = &[
    "proto/agentrt/v1/common.proto",
    "proto/agentrt/v1/sessions.proto",
    "proto/agentrt/v1/runtime.proto",
    "proto/agentrt/v1/admin.proto",
];

/// The internal service between replicas: compiled into its own descriptor
/// set, so the public port's reflection never lists it.
const CLUSTER_PROTOS: &[&str] = &["proto/agentrt/cluster/v1/cluster.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(PROTOS, ["proto"])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    // The descriptor set feeds server reflection (v1 and v1alpha).
    fs::write(out_dir.join("agentrt_descriptor.bin"), fds.encode_to_vec())?;
    let cluster = protox::compile(CLUSTER_PROTOS, ["proto"])?;
    fs::write(
        out_dir.join("cluster_descriptor.bin"),
        cluster.encode_to_vec(),
    )?;
    // One code generation for both (the cluster set includes the agentrt.v1
    // files it imports), so each message type is generated once.
    let all = protox::compile(PROTOS.iter().chain(CLUSTER_PROTOS), ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // prost with a 1 KiB encode buffer per stream (see src/codec.rs).
        .codec_path("crate::codec::SmallBufferCodec")
        .compile_fds(all)?;
    Ok(())
}
