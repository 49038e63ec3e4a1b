//! The keys of the trees (the layout is in the module doc of
//! `sled.rs`). NUL separates key parts.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::types::Session;

/// `parent \0`: the prefix of every key below `parent`.
pub(super) fn child(parent: &str) -> Vec<u8> {
    [parent.as_bytes(), b"\0"].concat()
}

/// The first key after every key below `parent` (`parent \x01`: NUL is
/// the separator, so nothing below `parent` reaches it).
pub(super) fn child_end(parent: &str) -> Vec<u8> {
    [parent.as_bytes(), b"\x01"].concat()
}

pub(super) fn message_key(session_id: &str, seq: u64) -> Vec<u8> {
    [child(session_id).as_slice(), &seq.to_be_bytes()].concat()
}

/// What the reference keys of a session's body files begin with: after
/// every message key of the session (`u64::MAX` is the largest seq, and a
/// reference key is longer), so history scans never reach them, and under
/// its prefix, so purging the session removes them.
pub(super) fn body_key_prefix(session_id: &str) -> Vec<u8> {
    message_key(session_id, u64::MAX)
}

pub(super) fn inbox_key(session_id: &str, queued_id: &str) -> Vec<u8> {
    [child(session_id).as_slice(), queued_id.as_bytes()].concat()
}

pub(super) fn turn_key(session_id: &str, turn_id: &str) -> Vec<u8> {
    [child(session_id).as_slice(), turn_id.as_bytes()].concat()
}

pub(super) fn activity_key(session: &Session) -> Vec<u8> {
    index_key(
        &session.owner,
        index_nanos(session.last_active_at),
        &session.id,
    )
}

pub(super) fn index_key(owner: &str, nanos: u64, id: &str) -> Vec<u8> {
    [child(owner).as_slice(), &nanos.to_be_bytes(), id.as_bytes()].concat()
}

/// Saturating: stored times come from the local clock, which only leaves
/// u64 nanoseconds in the year 2554.
pub(super) fn index_nanos(at: SystemTime) -> u64 {
    let since = at.duration_since(UNIX_EPOCH);
    since.map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
