//! Driving a [`ModelProvider`] directly in a test: a request of one user
//! message, and the whole stream collected under a time guard, so a
//! provider that hangs fails the test instead of stalling it.

use std::time::Duration;

use agentrt_runtime::model::{ModelError, ModelEvent, ModelProvider, ModelRequest};
use agentrt_runtime::types::{ContentBlock, Message, NewMessage, Role};
use futures::StreamExt as _;

/// Guards every wait so a bug fails the test instead of hanging it.
pub const GUARD: Duration = Duration::from_secs(10);

/// One item of a model stream.
pub type Item = Result<ModelEvent, ModelError>;

/// A stored-looking message (seq 1).
pub fn message(role: Role, content: Vec<ContentBlock>) -> Message {
    Message {
        seq: 1,
        body: NewMessage::new("t", role, content),
        compacted: false,
    }
}

/// A request for `model` with the system prompt "be brief" and one user
/// message `text`.
pub fn request(model: &str, text: &str) -> ModelRequest {
    ModelRequest {
        model: model.to_owned(),
        system_prompt: Some("be brief".into()),
        messages: vec![message(Role::User, vec![ContentBlock::text(text)])].into(),
        thinking: None,
        tools: Vec::new(),
        ..Default::default()
    }
}

/// Starts `request` and collects the whole stream, each bounded by
/// [`GUARD`].
pub async fn run(
    provider: &dyn ModelProvider,
    request: ModelRequest,
) -> Result<Vec<Item>, ModelError> {
    let stream = tokio::time::timeout(GUARD, provider.stream(request))
        .await
        .expect("stream() hung")?;
    Ok(tokio::time::timeout(GUARD, stream.collect())
        .await
        .expect("stream hung"))
}
