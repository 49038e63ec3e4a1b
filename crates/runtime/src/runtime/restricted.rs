//! Restricted principals (`restricted = true` on an API key or mTLS entry):
//! the capability-free runner, decided in one place.
//!
//! A restricted principal's turns get **no server tools**: no MCP tools, no
//! built-in server tools, no session-scoped tool process started for them
//! (the runner is built without any, see [`super::runners`]). Tools the
//! caller itself executes (`extra_tools`) stay allowed: they run on the
//! caller's side — the server only relays the model's call and the
//! caller's result — so they give the caller nothing it does not have.
//!
//! It makes **no per-call overrides**: every request field that replaces
//! what the server's configuration (or the session) decides is refused with
//! `PERMISSION_DENIED` naming the field, before anything is stored:
//!
//! - Chat: `model`, `thinking`, `system_override`, `excluded_tools`,
//!   `require_approval`, `max_output_tokens`; `timeout` and `max_steps`
//!   only above the server's default (lowering a limit is no capability);
//!   `on_busy = STEER` (a steering message joins a live turn that another
//!   key of the same user may have started with server tools).
//! - CreateSession / UpdateSession: a non-empty `model` or `system_prompt`.
//! - SubmitToolApproval: approvals decide server tool calls.
//!
//! A restricted principal never passes an admin check
//! ([`super::admin::require_admin`]), and its quotas are the policy's
//! restricted limits ([`crate::quota::QuotaPolicy::restricted`]).
//!
//! What stays true: the restriction travels with everything that runs a
//! turn later for the principal — a queued message and a paused turn's
//! record carry it ([`crate::types::QueuedInput::restricted`]), so the
//! turn they run (on any replica, after a restart) is capability-free too.

use super::{ChatInput, OnBusy, RuntimeConfig};
use crate::error::RuntimeError;
use crate::types::{NewSession, Principal, SessionUpdate};

/// The refusal of `field` for a restricted principal. The message names
/// the field (static: every field has its own).
fn refused(field: &'static str) -> RuntimeError {
    RuntimeError::PermissionDenied(field)
}

/// Refuses a restricted `who`'s Chat that overrides anything (see the
/// module docs); a no-op for everyone else.
pub(super) fn check_chat(
    who: &Principal,
    input: &ChatInput,
    config: &RuntimeConfig,
) -> Result<(), RuntimeError> {
    if !who.restricted {
        return Ok(());
    }
    let refusal = if input.model.as_deref().is_some_and(|m| !m.is_empty()) {
        "a restricted principal cannot set model: the server's configuration chooses it"
    } else if input.thinking.is_some() {
        "a restricted principal cannot set thinking: the server's configuration chooses it"
    } else if input.system_override.is_some() {
        "a restricted principal cannot set system_override: the session's system prompt applies"
    } else if !input.excluded_tools.is_empty() {
        "a restricted principal cannot set excluded_tools: its turns have no server tools"
    } else if !input.require_approval.is_empty() {
        "a restricted principal cannot set require_approval: its turns have no server tools"
    } else if input.max_output_tokens.is_some() {
        "a restricted principal cannot set max_output_tokens: the model's default applies"
    } else if input.timeout.is_some_and(|t| t > config.turn_timeout) {
        "a restricted principal cannot set timeout above the server's default turn timeout"
    } else if input.max_steps.is_some_and(|n| n > config.max_steps) {
        "a restricted principal cannot set max_steps above the server's default"
    } else if input.on_busy == OnBusy::Steer {
        "a restricted principal cannot use on_busy = STEER: use ENQUEUE or INTERRUPT"
    } else {
        return Ok(());
    };
    Err(refused(refusal))
}

/// Admission's check of `who`'s turn: [`check_chat`]; whether the turn
/// is restricted (its runner capability-free).
pub(super) fn admit(
    who: &Principal,
    input: &ChatInput,
    config: &RuntimeConfig,
) -> Result<bool, RuntimeError> {
    check_chat(who, input, config)?;
    Ok(who.restricted)
}

/// Refuses a restricted `who`'s new session that sets a model or a system
/// prompt.
pub(super) fn check_new_session(who: &Principal, new: &NewSession) -> Result<(), RuntimeError> {
    check_session_fields(who, Some(&new.model), Some(&new.system_prompt))
}

/// Refuses a restricted `who`'s session update that sets a model or a
/// system prompt (clearing one, back to the server's default, is allowed).
pub(super) fn check_update(who: &Principal, update: &SessionUpdate) -> Result<(), RuntimeError> {
    check_session_fields(who, update.model.as_ref(), update.system_prompt.as_ref())
}

fn check_session_fields(
    who: &Principal,
    model: Option<&String>,
    system_prompt: Option<&String>,
) -> Result<(), RuntimeError> {
    if !who.restricted {
        return Ok(());
    }
    if model.is_some_and(|m| !m.is_empty()) {
        return Err(refused(
            "a restricted principal cannot set model: the server's configuration chooses it",
        ));
    }
    if system_prompt.is_some_and(|s| !s.is_empty()) {
        return Err(refused(
            "a restricted principal cannot set system_prompt: the server's configuration chooses it",
        ));
    }
    Ok(())
}

/// Refuses a restricted `who`'s tool approval: approvals decide server
/// tool calls, which a restricted principal has none of.
pub(super) fn check_approval(who: &Principal) -> Result<(), RuntimeError> {
    if who.restricted {
        return Err(refused(
            "a restricted principal cannot answer tool approvals: they decide server tool calls",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::types::{ActorKind, ContentBlock};

    fn guest() -> Principal {
        Principal {
            restricted: true,
            ..Principal::new("guest", false, ActorKind::ApiKey)
        }
    }

    fn plain() -> ChatInput {
        ChatInput {
            session_id: "s".into(),
            content: vec![ContentBlock::text("hi")],
            ..ChatInput::default()
        }
    }

    fn refusal(input: &ChatInput) -> Option<&'static str> {
        match check_chat(&guest(), input, &RuntimeConfig::default()) {
            Ok(()) => None,
            Err(RuntimeError::PermissionDenied(why)) => Some(why),
            Err(other) => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn every_override_is_refused_naming_its_field() {
        let config = RuntimeConfig::default();
        let cases: Vec<(&str, ChatInput)> = vec![
            (
                "model",
                ChatInput {
                    model: Some("builtin/echo".into()),
                    ..plain()
                },
            ),
            (
                "thinking",
                ChatInput {
                    thinking: Some(crate::types::ThinkingLevel::High),
                    ..plain()
                },
            ),
            (
                "system_override",
                ChatInput {
                    system_override: Some(String::new()),
                    ..plain()
                },
            ),
            (
                "excluded_tools",
                ChatInput {
                    excluded_tools: vec!["x".into()],
                    ..plain()
                },
            ),
            (
                "require_approval",
                ChatInput {
                    require_approval: vec!["*".into()],
                    ..plain()
                },
            ),
            (
                "max_output_tokens",
                ChatInput {
                    max_output_tokens: Some(10),
                    ..plain()
                },
            ),
            (
                "timeout",
                ChatInput {
                    timeout: Some(config.turn_timeout * 2),
                    ..plain()
                },
            ),
            (
                "max_steps",
                ChatInput {
                    max_steps: Some(config.max_steps + 1),
                    ..plain()
                },
            ),
            (
                "STEER",
                ChatInput {
                    on_busy: OnBusy::Steer,
                    ..plain()
                },
            ),
        ];
        for (field, input) in cases {
            let why = refusal(&input).unwrap_or_else(|| panic!("{field} was allowed"));
            assert!(why.contains(field), "{field}: {why}");
            let who = Principal::new("staff", false, ActorKind::ApiKey);
            assert!(
                check_chat(&who, &input, &config).is_ok(),
                "{field} refused for staff"
            );
        }
    }

    #[test]
    fn caller_tools_and_lower_limits_are_no_override() {
        let config = RuntimeConfig::default();
        let input = ChatInput {
            extra_tools: vec![crate::model::ToolSpec {
                name: "client_side".into(),
                description: String::new(),
                parameters: serde_json::json!({"type": "object"}),
            }],
            timeout: Some(Duration::from_secs(5)),
            max_steps: Some(config.max_steps),
            on_busy: OnBusy::Enqueue,
            request_id: Some("r1".into()),
            ..plain()
        };
        assert_eq!(refusal(&input), None);
    }

    #[test]
    fn session_fields_that_override_are_refused() {
        let new = NewSession {
            model: "builtin/echo".into(),
            ..NewSession::default()
        };
        assert!(matches!(
            check_new_session(&guest(), &new),
            Err(RuntimeError::PermissionDenied(why)) if why.contains("model")
        ));
        let update = SessionUpdate {
            system_prompt: Some("be evil".into()),
            ..SessionUpdate::default()
        };
        assert!(matches!(
            check_update(&guest(), &update),
            Err(RuntimeError::PermissionDenied(why)) if why.contains("system_prompt")
        ));
        let clearing = SessionUpdate {
            model: Some(String::new()),
            title: Some("t".into()),
            ..SessionUpdate::default()
        };
        assert!(check_update(&guest(), &clearing).is_ok());
        assert!(check_new_session(&guest(), &NewSession::default()).is_ok());
        assert!(check_approval(&guest()).is_err());
        assert!(check_approval(&Principal::local()).is_ok());
    }
}
