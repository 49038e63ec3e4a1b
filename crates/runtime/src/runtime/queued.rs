//! A message a busy session got (`OnBusy`), as it is kept from before
//! admission consumed its request: to queue it, to hand it to the live
//! turn, or to admit it later. A leaf: the turn, the slots, the inbox and
//! the busy strategies all use it.

use std::time::Duration;

use tokio::sync::oneshot;

use super::{ChatInput, OnBusy, OnDisconnect};
use crate::events::ErrorCode;
use crate::types::{InputActor, Principal, QueuedInput, QueuedTool};

/// A busy Chat's message, kept from before admission consumed the request.
#[derive(Debug, Clone)]
pub(crate) struct Busy {
    /// Whether the sender is an admin principal.
    pub(crate) admin: bool,
    /// How the sender was authenticated: its turn's user message carries
    /// it, wherever and whenever the message runs.
    pub(crate) actor: InputActor,
    /// The message and its request's options.
    pub(crate) input: QueuedInput,
    /// The caller's transport deadline, for a turn it runs itself.
    pub(crate) transport_deadline: Option<Duration>,
    /// What the caller asked for when it goes away.
    pub(crate) on_disconnect: OnDisconnect,
}

impl Busy {
    /// The message of `input`, sent by `who`.
    pub(crate) fn of(who: &Principal, input: &ChatInput) -> Self {
        Self {
            admin: who.admin,
            actor: who.input_actor(),
            input: QueuedInput {
                content: input.content.clone(),
                model: input.model.clone(),
                thinking: input.thinking,
                system_override: input.system_override.clone(),
                timeout: input.timeout,
                request_id: input.request_id.clone(),
                excluded_tools: input.excluded_tools.clone(),
                extra_tools: input
                    .extra_tools
                    .iter()
                    .map(|t| QueuedTool {
                        name: t.name.clone(),
                        description: t.description.clone(),
                        parameters: t.parameters.clone(),
                    })
                    .collect(),
                max_steps: input.max_steps,
                max_output_tokens: input.max_output_tokens,
                continue_on_disconnect: input.on_disconnect == OnDisconnect::Continue,
                require_approval: input.require_approval.clone(),
                speaker: input.speaker.clone(),
                restricted: who.restricted,
            },
            transport_deadline: input.transport_deadline,
            on_disconnect: input.on_disconnect,
        }
    }
}

/// The request a queued message is admitted with: a queued turn runs on
/// whether or not anyone follows it (the message was accepted durably).
pub(crate) fn chat_input(session_id: String, input: QueuedInput) -> ChatInput {
    ChatInput {
        session_id,
        content: input.content,
        model: input.model,
        thinking: input.thinking,
        system_override: input.system_override,
        timeout: input.timeout,
        transport_deadline: None,
        on_disconnect: OnDisconnect::Continue,
        request_id: input.request_id,
        excluded_tools: input.excluded_tools,
        extra_tools: input
            .extra_tools
            .into_iter()
            .map(|t| crate::model::ToolSpec {
                name: t.name,
                description: t.description,
                parameters: t.parameters,
            })
            .collect(),
        max_steps: input.max_steps,
        max_output_tokens: input.max_output_tokens,
        on_busy: OnBusy::Reject,
        require_approval: input.require_approval,
        speaker: input.speaker,
    }
}

/// A steering message handed to a live turn, and how its Chat learns
/// what became of it.
#[derive(Debug)]
pub(crate) struct Steer {
    pub(crate) busy: Busy,
    pub(crate) reply: oneshot::Sender<Steered>,
}

/// What became of a steering message.
#[derive(Debug)]
pub(crate) enum Steered {
    /// Stored in the live turn as a user message; its `Steered` event has
    /// turn seq `event_seq`.
    Joined { event_seq: u64 },
    /// The turn ended first: the message is queued (its id, its place).
    Queued { id: String, position: u64 },
    /// The turn ended first and queuing the message failed: the code and
    /// why.
    Failed(ErrorCode, String),
}
