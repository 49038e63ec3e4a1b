//! The runtime's side of the operator hooks ([`crate::hooks`]) before a
//! turn runs: `BeforeTurn` during admission, and the `BeforeModelCall`
//! gate of the first model request, which admission pre-starts (the turn
//! module calls the hooks of later points itself).

use crate::error::RuntimeError;
use crate::hooks::{BeforeModelCallRequest, BeforeTurnRequest, HookPoint, HookStop, TurnContext};
use crate::model::ToolSpec;
use crate::types::{ContentBlock, Session};

use super::{Inner, keys};

/// What every hook call of turn `turn_id` of `session` (running `model`)
/// says about the turn. The session's id is the one its client knows,
/// never the stored key.
pub(crate) fn context(session: &Session, turn_id: &str, model: &str) -> TurnContext {
    TurnContext {
        session_id: keys::client_id(&session.id).to_owned(),
        user_id: session.owner.clone(),
        agent_id: session.agent_id.clone(),
        turn_id: turn_id.to_owned(),
        model: model.to_owned(),
        hook_name: String::new(),
    }
}

/// Runs the `BeforeTurn` hooks for a turn about to begin (its slot held,
/// nothing stored): `system_prompt` becomes a hook's replacement; `Err`
/// when a hook refused the turn or a fail-closed one did not answer.
pub(super) async fn before_turn(
    inner: &Inner,
    turn: TurnContext,
    content: &[ContentBlock],
    system_prompt: &mut Option<String>,
) -> Result<(), RuntimeError> {
    let hooks = &inner.config.hooks;
    if !hooks.serves(HookPoint::BeforeTurn) {
        return Ok(());
    }
    let request = BeforeTurnRequest {
        turn,
        user_text: crate::types::flatten_text(content),
        system_prompt: system_prompt.clone().unwrap_or_default(),
    };
    match hooks.before_turn(request).await {
        Ok(Some(replaced)) => {
            *system_prompt = Some(replaced);
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(stop) => Err(RuntimeError::Hook(stop)),
    }
}

/// Runs the `BeforeModelCall` hooks for model request `step` of a turn,
/// carrying `messages` messages and offering `tools`.
pub(crate) async fn before_model_call(
    inner: &Inner,
    turn: &TurnContext,
    step: u32,
    messages: usize,
    tools: &[ToolSpec],
) -> Result<(), HookStop> {
    let hooks = &inner.config.hooks;
    if !hooks.serves(HookPoint::BeforeModelCall) {
        return Ok(());
    }
    hooks
        .before_model_call(BeforeModelCallRequest {
            turn: turn.clone(),
            step,
            message_count: u32::try_from(messages).unwrap_or(u32::MAX),
            tool_names: tools.iter().map(|t| t.name.clone()).collect(),
        })
        .await
}
