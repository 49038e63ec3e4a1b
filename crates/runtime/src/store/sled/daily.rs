//! What each owner's turns spent per UTC day (the `daily_tokens` and
//! `daily_cost` quotas, [`crate::quota`]), on the `usage` tree.
//!
//! Keys: `d` + day (u64 BE) + session id → tokens (u64 BE), cost in
//! nano-USD (u64 BE), then the session's owner. A turn's end adds to its
//! *session's* key for the day, in the transaction that stores the end, so
//! turns of different sessions never conflict (an owner-wide key would
//! make every session of one owner conflict, as `usage.rs` explains). The
//! owner totals of the current day live in memory ([`Daily`]), summed from
//! the day's keys at open and added to after each commit; sled is opened by
//! one process, so nothing else changes them.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use sled::Tree;
use sled::transaction::TransactionalTree;

use super::backend;
use super::tx::TxResult;
use crate::quota::DailySpent;
use crate::store::StoreError;

fn key(day: u64, session_id: &str) -> Vec<u8> {
    [b"d".as_slice(), &day.to_be_bytes(), session_id.as_bytes()].concat()
}

/// The first byte of every daily key.
pub(super) const PREFIX: &[u8] = b"d";

/// The owner a daily key's value names.
pub(super) fn owner_of(raw: &[u8]) -> &[u8] {
    raw.get(16..).unwrap_or_default()
}

fn prefix(day: u64) -> Vec<u8> {
    [b"d".as_slice(), &day.to_be_bytes()].concat()
}

fn encode(spent: DailySpent, owner: &str) -> Vec<u8> {
    [
        spent.tokens.to_be_bytes().as_slice(),
        &spent.cost_nano_usd.to_be_bytes(),
        owner.as_bytes(),
    ]
    .concat()
}

/// A key's value: what the session spent that day, and its owner.
fn decode(raw: &[u8]) -> (DailySpent, String) {
    let word = |i: usize| {
        raw.get(i * 8..i * 8 + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map_or(0, u64::from_be_bytes)
    };
    let owner = raw
        .get(16..)
        .map(|o| String::from_utf8_lossy(o).into_owned())
        .unwrap_or_default();
    (
        DailySpent {
            tokens: word(0),
            cost_nano_usd: word(1),
        },
        owner,
    )
}

/// Adds `spent` to session `session_id`'s key of `day` in the transaction.
pub(super) fn add_tx(
    u: &TransactionalTree,
    day: u64,
    session_id: &str,
    owner: &str,
    spent: DailySpent,
) -> TxResult<()> {
    let key = key(day, session_id);
    let before = u.get(&key)?.map(|raw| decode(&raw).0).unwrap_or_default();
    u.insert(
        key,
        encode(before.plus(spent.tokens, spent.cost_nano_usd), owner),
    )?;
    Ok(())
}

/// The owners' totals of the current day, in memory.
#[derive(Debug, Default)]
pub(super) struct Daily {
    today: Mutex<(u64, HashMap<String, DailySpent>)>,
}

impl Daily {
    /// The totals of `day`, summed from its keys.
    pub(super) fn load(usage: &Tree, day: u64) -> Result<Self, StoreError> {
        let mut owners = HashMap::<String, DailySpent>::new();
        for entry in usage.scan_prefix(prefix(day)) {
            let (_, raw) = entry.map_err(|e| backend("scan", e))?;
            let (spent, owner) = decode(&raw);
            let total = owners.entry(owner).or_default();
            *total = total.plus(spent.tokens, spent.cost_nano_usd);
        }
        Ok(Self {
            today: Mutex::new((day, owners)),
        })
    }

    /// Forgets `owner`'s total of the current day (its keys are removed).
    pub(super) fn forget(&self, owner: &str) {
        let mut today = self.today.lock().unwrap_or_else(PoisonError::into_inner);
        today.1.remove(owner);
    }

    /// Counts a committed `spent` of `owner` on `day`.
    pub(super) fn add(&self, day: u64, owner: &str, spent: DailySpent) {
        let mut today = self.today.lock().unwrap_or_else(PoisonError::into_inner);
        if day > today.0 {
            *today = (day, HashMap::new());
        }
        if day == today.0 {
            let total = today.1.entry(owner.to_owned()).or_default();
            *total = total.plus(spent.tokens, spent.cost_nano_usd);
        }
    }

    /// What `owner` spent on `day`: from memory for the current day (or a
    /// later one: nothing yet), from the day's keys for an earlier one.
    pub(super) fn spent(
        &self,
        usage: &Tree,
        owner: &str,
        day: u64,
    ) -> Result<DailySpent, StoreError> {
        {
            let today = self.today.lock().unwrap_or_else(PoisonError::into_inner);
            if day == today.0 {
                return Ok(today.1.get(owner).copied().unwrap_or_default());
            }
            if day > today.0 {
                return Ok(DailySpent::default());
            }
        }
        let mut total = DailySpent::default();
        for entry in usage.scan_prefix(prefix(day)) {
            let (_, raw) = entry.map_err(|e| backend("scan", e))?;
            let (spent, of) = decode(&raw);
            if of == owner {
                total = total.plus(spent.tokens, spent.cost_nano_usd);
            }
        }
        Ok(total)
    }
}
