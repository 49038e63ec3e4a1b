//! A ChatRequest as the server receives it (protobuf bytes) converted to
//! the runtime's input, with a `grpc-timeout` header in front: the first
//! byte is that header's length (0: none).
#![no_main]

use agentrt_proto::v1 as pb;
use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use tonic::metadata::{MetadataMap, MetadataValue};

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let (header, body) = rest.split_at(usize::from(n % 32).min(rest.len()));
    let mut deadline = None;
    if !header.is_empty() {
        let mut metadata = MetadataMap::new();
        if let Ok(value) = MetadataValue::try_from(header) {
            metadata.insert("grpc-timeout", value);
            deadline = agentrt_server::convert::grpc_deadline(&metadata);
        }
    }
    let Ok(request) = pb::ChatRequest::decode(body) else {
        return;
    };
    let _ = agentrt_server::convert::chat_input(request, deadline);
});
