//! The sled store's quota counts ([`crate::quota`]): the `usage` tree,
//! written in the same transactions as the sessions and messages it
//! counts, so a count never disagrees with what is stored and two writes
//! for one owner conflict on its counter (sled retries one of them, which
//! then sees the other's count).
//!
//! Keys: `o` + owner → sessions (u64 BE) and stored bytes (u64 BE) of the
//! owner; `s` + session id → stored bytes of that session (subtracted
//! from its owner's when it is deleted); [`VERSION_KEY`] once the counts
//! cover every stored session (the first open after an upgrade counts
//! the sessions already stored; their earlier messages are not counted).

use sled::Tree;
use sled::transaction::{ConflictableTransactionError as TxError, TransactionalTree};

use super::{SESSIONS, TxResult, backend, decode};
use crate::quota::{Quota, QuotaLimits};
use crate::store::StoreError;
use crate::types::Session;

/// Set once every stored session is counted.
const VERSION_KEY: &[u8] = b"v1";

/// One owner's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct OwnerUsage {
    pub(super) sessions: u64,
    pub(super) bytes: u64,
}

fn owner_key(owner: &str) -> Vec<u8> {
    [b"o", owner.as_bytes()].concat()
}

fn session_key(id: &str) -> Vec<u8> {
    [b"s", id.as_bytes()].concat()
}

fn decode_usage(raw: &[u8]) -> OwnerUsage {
    let word = |i: usize| {
        raw.get(i * 8..i * 8 + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map_or(0, u64::from_be_bytes)
    };
    OwnerUsage {
        sessions: word(0),
        bytes: word(1),
    }
}

fn encode_usage(usage: OwnerUsage) -> Vec<u8> {
    [usage.sessions.to_be_bytes(), usage.bytes.to_be_bytes()].concat()
}

fn read_tx(u: &TransactionalTree, owner: &str) -> TxResult<OwnerUsage> {
    Ok(u.get(owner_key(owner))?
        .map(|raw| decode_usage(&raw))
        .unwrap_or_default())
}

fn write_tx(u: &TransactionalTree, owner: &str, usage: OwnerUsage) -> TxResult<()> {
    if usage == OwnerUsage::default() {
        u.remove(owner_key(owner))?;
    } else {
        u.insert(owner_key(owner), encode_usage(usage))?;
    }
    Ok(())
}

fn refused(e: crate::quota::QuotaExceeded) -> TxError<StoreError> {
    TxError::Abort(StoreError::QuotaExceeded(e))
}

/// Counts one more session of `owner`, or refuses when that passes
/// `limits.sessions`.
pub(super) fn add_session_tx(
    u: &TransactionalTree,
    owner: &str,
    limits: &QuotaLimits,
) -> TxResult<()> {
    let mut usage = read_tx(u, owner)?;
    QuotaLimits::check(Quota::Sessions, limits.sessions, usage.sessions, 1).map_err(refused)?;
    usage.sessions += 1;
    write_tx(u, owner, usage)
}

/// Counts `bytes` more stored for `owner`'s session `id`, or refuses when
/// that passes `limits.stored_bytes`.
pub(super) fn add_bytes_tx(
    u: &TransactionalTree,
    owner: &str,
    id: &str,
    bytes: u64,
    limits: &QuotaLimits,
) -> TxResult<()> {
    let mut usage = read_tx(u, owner)?;
    QuotaLimits::check(Quota::StoredBytes, limits.stored_bytes, usage.bytes, bytes)
        .map_err(refused)?;
    usage.bytes = usage.bytes.saturating_add(bytes);
    write_tx(u, owner, usage)?;
    let held = u
        .get(session_key(id))?
        .map_or(0, |raw| decode_usage(&raw).sessions);
    u.insert(
        session_key(id),
        held.saturating_add(bytes).to_be_bytes().to_vec(),
    )?;
    Ok(())
}

/// Forgets deleted session `id` of `owner`: one session fewer, and its
/// bytes.
pub(super) fn remove_session_tx(u: &TransactionalTree, owner: &str, id: &str) -> TxResult<()> {
    let bytes = u
        .remove(session_key(id))?
        .map_or(0, |raw| decode_usage(&raw).sessions);
    let mut usage = read_tx(u, owner)?;
    usage.sessions = usage.sessions.saturating_sub(1);
    usage.bytes = usage.bytes.saturating_sub(bytes);
    write_tx(u, owner, usage)
}

/// Counts the sessions stored before the `usage` tree existed (once).
pub(super) fn init(sessions: &Tree, usage: &Tree) -> Result<(), StoreError> {
    if usage
        .contains_key(VERSION_KEY)
        .map_err(|e| backend("read", e))?
    {
        return Ok(());
    }
    let mut owners = std::collections::HashMap::<String, u64>::new();
    for item in sessions.iter() {
        let (key, raw) = item.map_err(|e| backend("scan", e))?;
        // A corrupt record is reported where it is read, not here.
        if let Ok(session) = decode::<Session>(SESSIONS, &key, &raw) {
            *owners.entry(session.owner).or_default() += 1;
        }
    }
    let mut batch = sled::Batch::default();
    for (owner, count) in owners {
        let usage = OwnerUsage {
            sessions: count,
            bytes: 0,
        };
        batch.insert(owner_key(&owner), encode_usage(usage));
    }
    batch.insert(VERSION_KEY, b"".to_vec());
    usage.apply_batch(batch).map_err(|e| backend("write", e))
}

/// `owner`'s counts, outside a transaction.
#[cfg(test)]
pub(super) fn read(usage: &Tree, owner: &str) -> OwnerUsage {
    usage
        .get(owner_key(owner))
        .ok()
        .flatten()
        .map(|raw| decode_usage(&raw))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::super::SledStore;
    use super::*;
    use crate::store::Store as _;
    use crate::store::testing;
    use crate::types::NewSession;

    #[tokio::test]
    async fn sessions_stored_before_the_usage_tree_are_counted_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        {
            let store = SledStore::open(&path).unwrap();
            for owner in ["a", "a", "b"] {
                let new = NewSession {
                    owner: owner.to_owned(),
                    ..NewSession::default()
                };
                store.create_session(new).await.unwrap();
            }
            assert_eq!(read(&store.usage, "a").sessions, 2);
            // As a database written before quotas: no counts.
            store.usage.clear().unwrap();
            store.flush().await.unwrap();
        }
        let store = SledStore::open(&path).unwrap();
        assert_eq!(read(&store.usage, "a").sessions, 2);
        assert_eq!(read(&store.usage, "b").sessions, 1);
        // Bytes counted from now on stay counted: the count runs once.
        let session = store
            .create_session(NewSession {
                owner: "c".to_owned(),
                ..NewSession::default()
            })
            .await
            .unwrap();
        let crate::store::CreateOutcome::Created(session) = session else {
            panic!("created");
        };
        let turn = testing::running_turn(&session.id, &session.incarnation, "t");
        let message = testing::text_message("t", crate::types::Role::User, "hello");
        store.begin_turn(turn, message).await.unwrap();
        let counted = read(&store.usage, "c");
        assert!(counted.bytes > 0);
        store.flush().await.unwrap();
        drop(store);
        let again = SledStore::open(&path).unwrap();
        assert_eq!(read(&again.usage, "c"), counted, "counted once");
    }
}
