//! The pieces every multi-tree transaction is made of: reading a session
//! (as an incarnation), appending a message under the next seq, moving the
//! listing index entry, writing the session back.

use std::time::SystemTime;

use sled::IVec;
use sled::Tree;
use sled::transaction::{ConflictableTransactionError as TxError, TransactionalTree};

use super::bodies::Outgoing;
use super::keys::{activity_key, body_key_prefix, message_key};
use super::{SESSIONS, backend, decode};
use crate::store::record::encode;
use crate::store::{StoreError, seq_exhausted};
use crate::types::{Message, Session};

pub(super) type TxResult<T> = Result<T, TxError<StoreError>>;

/// Stores `new` under the next seq; the caller writes the returned session
/// (possibly changed further) in the same transaction. With `incarnation`
/// the session must be that incarnation (every write but a bulk import).
pub(super) fn append_tx(
    s: &TransactionalTree,
    a: &TransactionalTree,
    m: &TransactionalTree,
    session_id: &str,
    incarnation: Option<&str>,
    (new, body): &Outgoing<'_>,
    now: SystemTime,
) -> TxResult<(Session, Message)> {
    let mut session = match incarnation {
        Some(incarnation) => session_as_tx(s, session_id, incarnation)?,
        None => session_tx(s, session_id)?.ok_or_else(not_found)?,
    };
    let old_index = activity_key(&session);
    let message = session
        .append((*new).clone(), now)
        .ok_or_else(|| TxError::Abort(seq_exhausted()))?;
    let key = message_key(session_id, message.seq);
    match body {
        None => m.insert(key, encode(&message).map_err(TxError::Abort)?)?,
        Some(file) => {
            // The file's reference key, in the same transaction.
            let reference = [body_key_prefix(session_id).as_slice(), file.name()].concat();
            m.insert(reference, &message.seq.to_be_bytes()[..])?;
            m.insert(key, file.record(message.seq).map_err(TxError::Abort)?)?
        }
    };
    reindex_tx(a, &session, old_index)?;
    Ok((session, message))
}

/// Moves the session's listing index entry from `old_index` to where its
/// (touched) `last_active_at` puts it.
pub(super) fn reindex_tx(
    a: &TransactionalTree,
    session: &Session,
    old_index: Vec<u8>,
) -> TxResult<()> {
    a.remove(old_index)?;
    a.insert(activity_key(session), IVec::default())?;
    Ok(())
}

pub(super) fn session_tx(s: &TransactionalTree, id: &str) -> TxResult<Option<Session>> {
    match s.get(id.as_bytes())? {
        None => Ok(None),
        Some(raw) => decode(SESSIONS, id.as_bytes(), &raw)
            .map(Some)
            .map_err(TxError::Abort),
    }
}

/// The session `id` if it exists as `incarnation`; not found otherwise.
pub(super) fn session_as_tx(
    s: &TransactionalTree,
    id: &str,
    incarnation: &str,
) -> TxResult<Session> {
    session_tx(s, id)?
        .filter(|session| session.is_incarnation(incarnation))
        .ok_or_else(not_found)
}

pub(super) fn write_session_tx(s: &TransactionalTree, session: &Session) -> TxResult<()> {
    s.insert(
        session.id.as_bytes(),
        encode(session).map_err(TxError::Abort)?,
    )?;
    Ok(())
}

pub(super) fn load_session(sessions: &Tree, id: &str) -> Result<Option<Session>, StoreError> {
    match sessions
        .get(id.as_bytes())
        .map_err(|e| backend("read", e))?
    {
        None => Ok(None),
        Some(raw) => decode(SESSIONS, id.as_bytes(), &raw).map(Some),
    }
}

pub(super) fn not_found() -> TxError<StoreError> {
    TxError::Abort(StoreError::SessionNotFound)
}
