//! The sled store's quota counts ([`crate::quota`]): the `usage` tree,
//! written in the same transactions as the sessions and messages it
//! counts, so a count never disagrees with what is stored and two writes
//! for one owner conflict on its counter (sled retries one of them, which
//! then sees the other's count).
//!
//! Keys: `o` + owner → sessions (u64 BE) of the owner (and a second word,
//! stored bytes, no longer kept up to date); `s` + session id → stored
//! bytes of that session (u64 BE) then its owner; [`VERSION_KEY`] once the
//! counts cover every stored session (the first open after an upgrade
//! counts the sessions already stored; their earlier messages are not
//! counted).
//!
//! An owner's stored bytes are *not* a key written by every turn: all the
//! sessions of one owner would conflict on it (sled retries a conflicting
//! transaction; with it, `agentrt-bench --only s6` alternated on one
//! machine gave 1,176 and 1,217 durable turns/s with 8 sessions of one
//! user, without it 1,221, 1,271 and 1,278). sled is opened by one
//! process, so the owner totals live in
//! memory ([`Owners`]), summed from the session keys at open; a turn
//! reserves its bytes there before its transaction commits (so two turns
//! cannot both pass the limit) and gives them back if it does not.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sled::Tree;
use sled::transaction::{ConflictableTransactionError as TxError, TransactionalTree};

use super::tx::TxResult;
use super::{SESSIONS, backend, decode};
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

/// Counts `bytes` more stored for `owner`'s session `id` (the owner's
/// total is reserved in [`Owners`] first).
pub(super) fn add_bytes_tx(
    u: &TransactionalTree,
    owner: &str,
    id: &str,
    bytes: u64,
) -> TxResult<()> {
    let held = u
        .get(session_key(id))?
        .map_or(0, |raw| decode_usage(&raw).sessions);
    let value = [
        &held.saturating_add(bytes).to_be_bytes()[..],
        owner.as_bytes(),
    ]
    .concat();
    u.insert(session_key(id), value)?;
    Ok(())
}

/// Forgets deleted session `id` of `owner`: one session fewer. Returns its
/// bytes, for [`Owners::forget`] once the transaction committed.
pub(super) fn remove_session_tx(u: &TransactionalTree, owner: &str, id: &str) -> TxResult<u64> {
    let bytes = u
        .remove(session_key(id))?
        .map_or(0, |raw| decode_usage(&raw).sessions);
    let mut usage = read_tx(u, owner)?;
    usage.sessions = usage.sessions.saturating_sub(1);
    write_tx(u, owner, usage)?;
    Ok(bytes)
}

/// The stored bytes of every owner, in memory (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Owners {
    bytes: Mutex<HashMap<String, u64>>,
}

impl Owners {
    /// Sums the session keys of `usage` by owner; a key written before the
    /// owner was kept beside the count finds it in the session record.
    pub(super) fn load(sessions: &Tree, usage: &Tree) -> Result<Self, StoreError> {
        let mut bytes = HashMap::<String, u64>::new();
        for item in usage.scan_prefix(b"s") {
            let (key, raw) = item.map_err(|e| backend("scan", e))?;
            let count = decode_usage(&raw).sessions;
            let owner = match raw.get(8..) {
                Some(owner) if !owner.is_empty() => String::from_utf8_lossy(owner).into_owned(),
                _ => {
                    let id = key.get(1..).unwrap_or_default();
                    match sessions.get(id).map_err(|e| backend("read", e))? {
                        Some(raw) => match decode::<Session>(SESSIONS, id, &raw) {
                            Ok(session) => session.owner,
                            Err(_) => continue,
                        },
                        None => continue,
                    }
                }
            };
            let total = bytes.entry(owner).or_default();
            *total = total.saturating_add(count);
        }
        Ok(Self {
            bytes: Mutex::new(bytes),
        })
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.bytes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `bytes` to `owner`'s total, or refuses when that passes
    /// `limits.stored_bytes`. Given back unless [`Reserved::commit`]ted.
    pub(super) fn reserve(
        self: &Arc<Self>,
        owner: &str,
        bytes: u64,
        limits: &QuotaLimits,
    ) -> TxResult<Reserved> {
        let mut map = self.map();
        let used = map.get(owner).copied().unwrap_or(0);
        QuotaLimits::check(Quota::StoredBytes, limits.stored_bytes, used, bytes)
            .map_err(refused)?;
        map.insert(owner.to_owned(), used.saturating_add(bytes));
        Ok(Reserved {
            owners: Arc::clone(self),
            owner: owner.to_owned(),
            bytes,
        })
    }

    /// Takes a deleted session's `bytes` off `owner`'s total.
    pub(super) fn forget(&self, owner: &str, bytes: u64) {
        let mut map = self.map();
        if let Some(total) = map.get_mut(owner) {
            *total = total.saturating_sub(bytes);
            if *total == 0 {
                map.remove(owner);
            }
        }
    }

    /// `owner`'s stored bytes.
    #[cfg(test)]
    pub(super) fn of(&self, owner: &str) -> u64 {
        self.map().get(owner).copied().unwrap_or(0)
    }
}

/// Bytes reserved by [`Owners::reserve`]: given back when dropped, unless
/// committed.
#[derive(Debug)]
pub(super) struct Reserved {
    owners: Arc<Owners>,
    owner: String,
    bytes: u64,
}

impl Reserved {
    /// The write committed: the bytes stay counted.
    pub(super) fn commit(mut self) {
        self.bytes = 0;
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.owners.forget(&self.owner, self.bytes);
        }
    }
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
        let counted = store.owners.of("c");
        assert!(counted > 0);
        assert_eq!(read(&store.usage, "c").sessions, 1);
        store.flush().await.unwrap();
        drop(store);
        let again = SledStore::open(&path).unwrap();
        assert_eq!(again.owners.of("c"), counted, "counted once");
        assert_eq!(read(&again.usage, "c").sessions, 1);
    }
}
