//! Turns as records: a session's turns listed newest first, one turn's
//! record, and one turn with the messages it stored (the A2A binding's
//! tasks).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::Runtime;
use super::TurnStream;
use crate::error::RuntimeError;
use crate::limits::{MAX_ID_BYTES, check_short, validate_session_id};
use crate::types::{Message, Principal, TurnRecord, TurnStatus};

/// Most messages read for one turn (a turn's messages are contiguous in
/// history, from its user message on).
const MAX_TURN_MESSAGES: usize = 1_000;

/// ListTurns' page size when the caller sets none.
const LIST_DEFAULT: usize = 50;
/// ListTurns' largest page (a record is a few hundred bytes, so a full
/// page stays far below a client's 4 MiB receive limit).
const LIST_MAX: usize = 500;

/// A page of a session's turns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnList {
    /// Newest first.
    pub turns: Vec<TurnRecord>,
    /// Empty when there are no more pages.
    pub next_page_token: String,
}

/// One turn of a session: its record and its stored messages.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnDetail {
    /// The turn's record (status, times, usage, error).
    pub record: TurnRecord,
    /// The messages the turn stored so far, its user message first
    /// (at most 1,000).
    pub messages: Vec<Message>,
}

impl Runtime {
    /// A page of the turns of one of `who`'s sessions, newest first:
    /// `page_size` of them (0: 50; at most 500), after the turn a previous
    /// page's `next_page_token` names.
    pub async fn list_turns(
        &self,
        who: &Principal,
        session_id: &str,
        page_size: usize,
        page_token: &str,
    ) -> Result<TurnList, RuntimeError> {
        validate_session_id("session_id", session_id)?;
        let before = decode_token(page_token)?;
        let key = self.owned_session(who, session_id).await?.id;
        let limit = match page_size {
            0 => LIST_DEFAULT,
            n => n.min(LIST_MAX),
        };
        // One more than the page tells whether another page follows.
        let mut turns = self
            .inner
            .store
            .list_turns(&key, before.as_deref(), limit + 1)
            .await?;
        let more = turns.len() > limit;
        turns.truncate(limit);
        let next_page_token = match turns.last() {
            Some(last) if more => page_token_after(&last.turn_id),
            Some(_) | None => String::new(),
        };
        Ok(TurnList {
            turns: turns.into_iter().map(for_client).collect(),
            next_page_token,
        })
    }

    /// How many turns one of `who`'s sessions has.
    pub async fn count_turns(
        &self,
        who: &Principal,
        session_id: &str,
    ) -> Result<u64, RuntimeError> {
        validate_session_id("session_id", session_id)?;
        let key = self.owned_session(who, session_id).await?.id;
        Ok(self.inner.store.count_turns(&key).await?)
    }

    /// The record of turn `turn_id` of one of `who`'s sessions; `None`
    /// when the session has no such turn (another user's session is not
    /// found).
    pub async fn turn_record(
        &self,
        who: &Principal,
        session_id: &str,
        turn_id: &str,
    ) -> Result<Option<TurnRecord>, RuntimeError> {
        let owned = self.owned_turn(who, session_id, turn_id).await?;
        Ok(owned.map(|(_, record)| for_client(record)))
    }

    /// The turn `turn_id` of one of `who`'s sessions; `None` when the
    /// session has no such turn (another user's session is not found).
    pub async fn turn(
        &self,
        who: &Principal,
        session_id: &str,
        turn_id: &str,
    ) -> Result<Option<TurnDetail>, RuntimeError> {
        let Some((key, record)) = self.owned_turn(who, session_id, turn_id).await? else {
            return Ok(None);
        };
        let messages = self.messages_of(&key, &record).await?;
        let record = for_client(record);
        Ok(Some(TurnDetail { record, messages }))
    }

    /// A turn [`list_turns`](Self::list_turns) returned, with the messages
    /// it stored (its record is not read again).
    pub async fn turn_detail(
        &self,
        who: &Principal,
        session_id: &str,
        record: TurnRecord,
    ) -> Result<TurnDetail, RuntimeError> {
        validate_session_id("session_id", session_id)?;
        let key = self.owned_session(who, session_id).await?.id;
        let messages = self.messages_of(&key, &record).await?;
        Ok(TurnDetail { record, messages })
    }

    /// The events of finished turn `turn_id` of one of `who`'s sessions,
    /// rebuilt from the store (as a retried request's are); `None` while
    /// it still runs, or when there is no such turn. For a watcher that
    /// followed a turn to another replica and arrived after its end.
    pub async fn replay_finished(
        &self,
        who: &Principal,
        session_id: &str,
        turn_id: &str,
    ) -> Result<Option<TurnStream>, RuntimeError> {
        match self.owned_turn(who, session_id, turn_id).await? {
            Some((_, record)) if record.status != TurnStatus::Running => {
                let store = self.inner.store.as_ref();
                Ok(Some(super::replay::replay_turn(store, record).await?))
            }
            Some(_) | None => Ok(None),
        }
    }

    /// The stored key of one of `who`'s sessions and its turn `turn_id`'s
    /// record as stored; `None` when the session has no such turn.
    async fn owned_turn(
        &self,
        who: &Principal,
        session_id: &str,
        turn_id: &str,
    ) -> Result<Option<(String, TurnRecord)>, RuntimeError> {
        validate_session_id("session_id", session_id)?;
        check_short("turn_id", turn_id, MAX_ID_BYTES)?;
        let key = self.owned_session(who, session_id).await?.id;
        let record = self.inner.store.get_turn(&key, turn_id).await?;
        Ok(record.map(|record| (key, record)))
    }

    /// The messages `record`'s turn stored in session `key`, its user
    /// message first (contiguous in history).
    async fn messages_of(
        &self,
        key: &str,
        record: &TurnRecord,
    ) -> Result<Vec<Message>, RuntimeError> {
        let after = record.user_message_seq.saturating_sub(1);
        let history = self
            .inner
            .store
            .history(key, after, MAX_TURN_MESSAGES, true);
        Ok(history
            .await?
            .into_iter()
            .take_while(|m| m.body.turn_id == record.turn_id)
            .collect())
    }
}

/// A stored record as its client knows it (the session's client id).
fn for_client(mut record: TurnRecord) -> TurnRecord {
    record.session_id = super::keys::client_id(&record.session_id).to_owned();
    record
}

/// The page token of the turns listed after (older than) turn `turn_id`,
/// for a caller that ends a page early (a byte budget, a filter).
pub fn page_token_after(turn_id: &str) -> String {
    URL_SAFE_NO_PAD.encode(turn_id)
}

/// The turn id a ListTurns page token names (`None` for the first page).
fn decode_token(token: &str) -> Result<Option<String>, RuntimeError> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || RuntimeError::invalid("page_token", "is not a token returned by ListTurns");
    // Base64 of an id of at most MAX_ID_BYTES.
    if token.len() > MAX_ID_BYTES.div_ceil(3) * 4 {
        return Err(bad());
    }
    let raw = URL_SAFE_NO_PAD.decode(token).map_err(|_| bad())?;
    let id = String::from_utf8(raw).map_err(|_| bad())?;
    if id.is_empty() {
        return Err(bad());
    }
    Ok(Some(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_token_is_a_turn_id_and_anything_else_is_refused() {
        let token = URL_SAFE_NO_PAD.encode("0193-turn");
        assert_eq!(
            decode_token(&token).ok().flatten().as_deref(),
            Some("0193-turn")
        );
        assert_eq!(decode_token("").ok(), Some(None));
        for bad in [
            "***",
            &"A".repeat(1_000),
            &URL_SAFE_NO_PAD.encode([0xff, 0xfe]),
        ] {
            match decode_token(bad) {
                Err(RuntimeError::InvalidArgument(violations)) => {
                    let text = format!("{violations:?}");
                    assert!(text.contains("page_token"), "{text}");
                    assert!(text.contains("ListTurns"), "{text}");
                }
                other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
            }
        }
    }
}
