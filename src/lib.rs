//! Generated protobuf messages and gRPC stubs of the `agentrt.v1` API.
//!
//! This crate owns the generated code so that the server, the client crate and
//! any Rust caller share one set of types. The `.proto` files under `proto/`
//! are the contract; other languages generate their own stubs from them.
//!
//! - [`v1`]: messages, `*_server` and `*_client` modules for
//!   `SessionService` and `AgentRuntime`.
//! - [`hooks::v1`]: the operator hooks' `agentrt.hooks.v1` — the
//!   `HookService` an operator implements and agentrt calls
//!   (`hook_service_client` / `hook_service_server`).
//! - [`a2a::v1`]: the A2A protocol's `lf.a2a.v1` (messages and the
//!   `A2AService` stubs), generated from the vendored normative
//!   `proto/lf/a2a/v1/a2a.proto`.
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors (agentrt.v1 and
//!   lf.a2a.v1), for server reflection.
//! - [`codec`]: the codec the stubs use (prost, with a small encode buffer).

pub mod codec;

/// The `agentrt.v1` package.
#[allow(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    clippy::all
)]
pub mod v1 {
    tonic::include_proto!("agentrt.v1");
}

/// The operator hooks (`agentrt.hooks.v1`): agentrt is the client of a
/// `HookService` the operator runs.
pub mod hooks {
    /// Version 1 of the hook service.
    #[allow(
        missing_docs,
        missing_debug_implementations,
        unreachable_pub,
        clippy::all
    )]
    pub mod v1 {
        tonic::include_proto!("agentrt.hooks.v1");
    }
}

/// The A2A protocol (`lf.a2a.v1`), served beside `agentrt.v1`.
pub mod a2a {
    /// Version 1 of the A2A protocol's gRPC binding.
    #[allow(
        missing_docs,
        missing_debug_implementations,
        unreachable_pub,
        clippy::all
    )]
    pub mod v1 {
        tonic::include_proto!("lf.a2a.v1");
    }
}

/// Encoded `FileDescriptorSet` of every `agentrt.v1` proto file, the A2A
/// protocol's `lf.a2a.v1` (and the well-known and `google.api` files they
/// import), for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/agentrt_descriptor.bin"));

#[cfg(test)]
mod tests {
    use prost::Message as _;

    #[test]
    fn descriptor_set_decodes_and_names_the_services() {
        let fds = prost_types::FileDescriptorSet::decode(super::FILE_DESCRIPTOR_SET)
            .expect("descriptor set decodes");
        let services: Vec<String> = fds
            .file
            .iter()
            .filter(|f| f.package() == "agentrt.v1")
            .flat_map(|f| f.service.iter().map(|s| s.name().to_owned()))
            .collect();
        assert!(services.contains(&"SessionService".to_owned()));
        assert!(services.contains(&"AgentRuntime".to_owned()));
        let a2a: Vec<&str> = fds
            .file
            .iter()
            .filter(|f| f.package() == "lf.a2a.v1")
            .flat_map(|f| f.service.iter().map(|s| s.name()))
            .collect();
        assert_eq!(a2a, ["A2AService"]);
    }
}
