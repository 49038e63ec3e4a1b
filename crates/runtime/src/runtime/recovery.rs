//! Start-up recovery: turns a previous process left running are marked
//! INTERRUPTED, and tool calls they left without a result get an error
//! result, so every tool call in history has exactly one result.

pub(crate) use crate::store::INTERRUPTED_TOOL;
use crate::store::{Store, StoreError, open_call_results};
use crate::types::TurnRecord;

/// Messages read per interrupted turn (a turn's messages are contiguous).
const TURN_READ_LIMIT: usize = 10_000;

pub(crate) async fn recover(store: &dyn Store) -> Result<Vec<TurnRecord>, StoreError> {
    let interrupted = store.recover_interrupted().await?;
    for turn in &interrupted {
        tracing::warn!(session_id = %turn.session_id, turn_id = %turn.turn_id, "turn interrupted by a previous shutdown");
        answer_open_calls(store, turn, INTERRUPTED_TOOL).await?;
    }
    Ok(interrupted)
}

/// Gives every tool call of `turn` that has no result an error result
/// saying `why`.
pub(crate) async fn answer_open_calls(
    store: &dyn Store,
    turn: &TurnRecord,
    why: &str,
) -> Result<(), StoreError> {
    let after = turn.user_message_seq.saturating_sub(1);
    let messages = store
        .history(&turn.session_id, after, TURN_READ_LIMIT, true)
        .await?;
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
