//! An A2A SendMessageRequest (protobuf bytes) through every conversion the
//! binding applies before it reaches the runtime: the user's text, the
//! caller's tools, a tool result, the task id, and the not-found error
//! that echoes it.
#![no_main]

use agentrt_proto::a2a::v1 as a2a;
use agentrt_server::a2a::{caller_tools, errors, ids, tasks};
use libfuzzer_sys::fuzz_target;
use prost::Message as _;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = a2a::SendMessageRequest::decode(data) else {
        return;
    };
    let _ = caller_tools::extra_tools(request.metadata.as_ref());
    let Some(message) = request.message else {
        return;
    };
    let _ = agentrt_server::fuzzing::a2a_user_content(&message);
    let _ = caller_tools::extra_tools(message.metadata.as_ref());
    let _ = caller_tools::tool_result(&message);
    if let Some((session, turn)) = ids::parse_task_id(&message.task_id) {
        assert_eq!(tasks::task_id(session, turn), message.task_id);
    }
    let _ = errors::task_not_found(&message.task_id);
});
