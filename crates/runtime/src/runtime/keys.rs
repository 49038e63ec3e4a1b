//! Session ids scoped to their owner: a client-chosen id is unique per
//! owner, so the same id from two users names two sessions, and another
//! user's id is neither an error nor an oracle.
//!
//! The store keys sessions by one string. A session created with a
//! client-chosen id is stored under [`scoped_key`] — the id, `~` (never a
//! character of a client id, see `validate_session_id`) and a tag of the
//! owner — and every key maps back to the id its client knows with
//! [`client_id`]. The runtime's public calls resolve a caller's id to the
//! stored key on entry ([`crate::Runtime`]'s `owned_session`) and hand back
//! client ids only, so everything between (slots, hub, leases, replay,
//! runners, the store) keys by the stored key and knows nothing of this.
//!
//! Ids the server generated (UUIDs) are stored as they are, and so are
//! sessions created with a client-chosen id before ids were scoped: a
//! caller's id names the session stored under it when that session is the
//! caller's, else the caller's scoped one. Existing data dirs keep working.

/// Separates a client-chosen id from its owner's tag in a stored key.
const SEPARATOR: char = '~';

/// The stored key of `owner`'s session whose client chose `id`.
pub(crate) fn scoped_key(owner: &str, id: &str) -> String {
    format!("{id}{SEPARATOR}{:032x}", fnv1a_128(owner.as_bytes()))
}

/// The session id a client knows for stored key `key` (the key itself for
/// a server-generated or pre-scoping id).
pub(crate) fn client_id(key: &str) -> &str {
    key.split(SEPARATOR).next().unwrap_or(key)
}

/// FNV-1a, 128 bits: a stable tag (the same in every build and release,
/// unlike std's hasher), wide enough that two owners never share one in
/// practice — and a shared tag would still not cross owners: every read
/// checks the stored owner.
fn fnv1a_128(bytes: &[u8]) -> u128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    bytes.iter().fold(OFFSET, |hash, b| {
        (hash ^ u128::from(*b)).wrapping_mul(PRIME)
    })
}

#[cfg(test)]
mod tests;
