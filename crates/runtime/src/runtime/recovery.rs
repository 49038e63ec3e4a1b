//! Start-up recovery: turns a previous process left running are marked
//! INTERRUPTED (counted in `agentrt.turns.interrupted`, reason `restart`),
//! and tool calls they left without a result get an error result, so every
//! tool call in history has exactly one result.

pub(crate) use crate::store::INTERRUPTED_TOOL;
use crate::store::{Store, StoreError, open_call_results, settle_open_calls};
use crate::telemetry::metrics::{self, Interruption};
use crate::types::{TurnRecord, TurnStatus};

/// Messages read per interrupted turn (a turn's messages are contiguous).
const TURN_READ_LIMIT: usize = 10_000;

pub(crate) async fn recover(store: &dyn Store) -> Result<Vec<TurnRecord>, StoreError> {
    let mut interrupted = store.recover_interrupted().await?;
    for turn in &mut interrupted {
        if turn.status == TurnStatus::Paused {
            settle_paused(store, turn).await?;
            continue;
        }
        tracing::warn!(session_id = %turn.session_id, turn_id = %turn.turn_id, "turn interrupted by a previous shutdown");
        metrics::turn_interrupted(Interruption::Restart);
        answer_open_calls(store, turn, INTERRUPTED_TOOL).await?;
    }
    Ok(interrupted)
}

/// A turn the store found paused at start-up: the calls it does not wait
/// for that were left open (server calls running at the crash) get an
/// interrupted result; it stays paused while a call it waits for is open,
/// and is interrupted (its record final) when none is.
async fn settle_paused(store: &dyn Store, turn: &mut TurnRecord) -> Result<(), StoreError> {
    let messages = turn_messages(store, turn).await?;
    let now = std::time::SystemTime::now();
    for result in settle_open_calls(turn, &messages, INTERRUPTED_TOOL, now) {
        store
            .append_message(&turn.session_id, &turn.incarnation, result)
            .await?;
    }
    if turn.status == TurnStatus::Paused {
        tracing::info!(session_id = %turn.session_id, turn_id = %turn.turn_id, "turn paused across the restart: it resumes when its calls are answered");
    } else {
        tracing::warn!(session_id = %turn.session_id, turn_id = %turn.turn_id, "turn interrupted by a previous shutdown");
        metrics::turn_interrupted(Interruption::Restart);
        turn.pause = None;
        store.finish_turn(turn.clone()).await?;
    }
    Ok(())
}

/// The messages of `turn` (and any after it).
async fn turn_messages(
    store: &dyn Store,
    turn: &TurnRecord,
) -> Result<Vec<crate::types::Message>, StoreError> {
    let after = turn.user_message_seq.saturating_sub(1);
    store
        .history(&turn.session_id, after, TURN_READ_LIMIT, true)
        .await
}

/// Gives every tool call of `turn` that has no result an error result
/// saying `why`.
pub(crate) async fn answer_open_calls(
    store: &dyn Store,
    turn: &TurnRecord,
    why: &str,
) -> Result<(), StoreError> {
    let messages = turn_messages(store, turn).await?;
    for result in open_call_results(&turn.turn_id, &messages, why) {
        match store
            .append_message(&turn.session_id, &turn.incarnation, result)
            .await
        {
            // Deleted meanwhile, or (shared store) answered by whoever
            // interrupted the turn: nothing left to do.
            Ok(_) | Err(StoreError::SessionNotFound | StoreError::LeaseLost { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::types::{ContentBlock, NewMessage, Role};

    use super::*;
    use crate::store::MemoryStore;
    use crate::store::testing::{running_turn, text_message};
    use crate::types::{NewSession, TurnStatus};

    #[tokio::test]
    async fn open_tool_calls_of_an_interrupted_turn_get_error_results() {
        let store = Arc::new(MemoryStore::new());
        let session = match store
            .create_session(NewSession {
                owner: "u".into(),
                ..NewSession::default()
            })
            .await
            .unwrap()
        {
            crate::store::CreateOutcome::Created(s) | crate::store::CreateOutcome::Existing(s) => s,
        };
        let turn = running_turn(&session.id, &session.incarnation, "t1");
        store
            .begin_turn(turn.clone(), text_message("t1", Role::User, "go"))
            .await
            .unwrap();
        let calls = NewMessage::new(
            "t1",
            Role::Assistant,
            vec![
                ContentBlock::ToolCall {
                    id: "a".into(),
                    name: "x".into(),
                    arguments_json: "{}".into(),
                },
                ContentBlock::ToolCall {
                    id: "b".into(),
                    name: "y".into(),
                    arguments_json: "{}".into(),
                },
            ],
        );
        store
            .append_message(&session.id, &session.incarnation, calls)
            .await
            .unwrap();
        let answered = NewMessage::new(
            "t1",
            Role::Tool,
            vec![ContentBlock::ToolResult {
                call_id: "a".into(),
                name: "x".into(),
                content: "done".into(),
                is_error: false,
                interrupted: None,
                media: Vec::new(),
            }],
        );
        store
            .append_message(&session.id, &session.incarnation, answered)
            .await
            .unwrap();

        let recovered = recover(store.as_ref()).await.unwrap();
        assert_eq!(recovered.len(), 1);
        assert_eq!(recovered[0].status, TurnStatus::Interrupted);
        let history = store.history(&session.id, 0, 100, true).await.unwrap();
        assert_eq!(history.len(), 4);
        let ContentBlock::ToolResult {
            call_id,
            is_error,
            content,
            ..
        } = &history[3].body.content[0]
        else {
            panic!("not a tool result")
        };
        assert_eq!(call_id, "b");
        assert!(*is_error);
        assert_eq!(content, INTERRUPTED_TOOL);
        // A second start finds nothing left to do.
        assert!(recover(store.as_ref()).await.unwrap().is_empty());
        assert_eq!(
            store
                .history(&session.id, 0, 100, true)
                .await
                .unwrap()
                .len(),
            4
        );
    }
}
