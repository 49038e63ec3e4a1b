//! The paused turns of the sled store, in memory: sled has no index by a
//! turn's state, and the runtime looks for paused turns past their bound
//! every few seconds. Loaded at open from the sessions whose latest turn
//! is paused; kept up to date by every write that pauses, resumes or ends
//! a turn (sled is opened by one process, so nothing else writes).

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

use sled::Tree;

use super::{SESSIONS, backend, decode};
use crate::store::StoreError;
use crate::types::{Session, TurnRecord, TurnStatus};

/// (session id, turn id) of every paused turn.
#[derive(Debug, Default)]
pub(super) struct Paused {
    turns: Mutex<BTreeSet<(String, String)>>,
}

impl Paused {
    /// The paused turns, from the sessions' latest turns.
    pub(super) fn load(sessions: &Tree) -> Result<Self, StoreError> {
        let mut turns = BTreeSet::new();
        for entry in sessions.iter() {
            let (key, raw) = entry.map_err(|e| backend("scan", e))?;
            let session: Session = decode(SESSIONS, &key, &raw)?;
            if let Some(turn_id) = session.paused_turn() {
                turns.insert((session.id.clone(), turn_id.to_owned()));
            }
        }
        Ok(Self {
            turns: Mutex::new(turns),
        })
    }

    /// Notes `turn`'s state as just stored.
    pub(super) fn note(&self, turn: &TurnRecord) {
        let key = (turn.session_id.clone(), turn.turn_id.clone());
        let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        if turn.status == TurnStatus::Paused {
            turns.insert(key);
        } else {
            turns.remove(&key);
        }
    }

    /// Forgets a turn found gone (its session deleted).
    pub(super) fn forget(&self, session_id: &str, turn_id: &str) {
        let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        turns.remove(&(session_id.to_owned(), turn_id.to_owned()));
    }

    /// At most `limit` of them.
    pub(super) fn list(&self, limit: usize) -> Vec<(String, String)> {
        let turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        turns.iter().take(limit).cloned().collect()
    }
}
