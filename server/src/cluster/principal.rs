//! The principal of a forwarded call as the principal header carries it:
//! the whole [`Principal`] — admin, restricted, and its input actor — so a
//! message stored on the owning replica has the provenance the forwarding
//! replica authenticated.
//!
//! Layout (version 2): `[2, flags, kind, user_len: u32 BE, user, actor_len:
//! u32 BE, actor_id]`; flags bit 0 = admin, bit 1 = restricted, bit 2 = the
//! actor's admin mark, other bits zero. Version 1, a replica from before
//! provenance, is one admin byte (0 or 1) then the user id: read as an API
//! key's user, so a rolling upgrade keeps forwarding. Anything else — an
//! unknown version, kind or flag, a length past the end, bytes left over, an
//! empty or oversized id, text that is not UTF-8 — is refused.

use agentrt_runtime::types::{ActorKind, InputActor, Principal};

/// The version byte of the layout above.
const VERSION: u8 = 2;
/// Most bytes of either id (far beyond any configured user or identity).
const MAX_ID_BYTES: usize = 16 << 10;

const ADMIN: u8 = 1;
const RESTRICTED: u8 = 1 << 1;
const ACTOR_ADMIN: u8 = 1 << 2;

/// `who` in the layout above.
pub(super) fn encode(who: &Principal) -> Vec<u8> {
    let mut flags = 0;
    if who.admin {
        flags |= ADMIN;
    }
    if who.restricted {
        flags |= RESTRICTED;
    }
    if who.actor.admin {
        flags |= ACTOR_ADMIN;
    }
    let mut out = Vec::with_capacity(11 + who.user_id.len() + who.actor.id.len());
    out.extend([VERSION, flags, kind_code(who.actor.kind)]);
    put(&mut out, &who.user_id);
    put(&mut out, &who.actor.id);
    out
}

/// The principal `bytes` name; `None` for anything but the layouts above.
pub(super) fn decode(bytes: &[u8]) -> Option<Principal> {
    let (&version, rest) = bytes.split_first()?;
    match version {
        0 | 1 => {
            let user_id = id(rest)?;
            Some(Principal::new(user_id, version == 1, ActorKind::ApiKey))
        }
        VERSION => {
            let [flags, kind, rest @ ..] = rest else {
                return None;
            };
            if flags & !(ADMIN | RESTRICTED | ACTOR_ADMIN) != 0 {
                return None;
            }
            let (user_id, rest) = take(rest)?;
            let (actor_id, rest) = take(rest)?;
            if !rest.is_empty() {
                return None;
            }
            Some(Principal {
                user_id: user_id.to_owned(),
                admin: flags & ADMIN != 0,
                restricted: flags & RESTRICTED != 0,
                actor: InputActor {
                    kind: kind_of(*kind)?,
                    id: actor_id.to_owned(),
                    admin: flags & ACTOR_ADMIN != 0,
                },
            })
        }
        _ => None,
    }
}

fn put(out: &mut Vec<u8>, text: &str) {
    // A longer id (none is) gets a length the decoder refuses.
    let len = u32::try_from(text.len()).unwrap_or(u32::MAX);
    out.extend(len.to_be_bytes());
    out.extend(text.as_bytes());
}

/// One length-prefixed id and what follows it.
fn take(bytes: &[u8]) -> Option<(&str, &[u8])> {
    let (len, rest) = bytes.split_first_chunk::<4>()?;
    let len = usize::try_from(u32::from_be_bytes(*len)).ok()?;
    if len > rest.len() {
        return None;
    }
    let (text, rest) = rest.split_at(len);
    Some((id(text)?, rest))
}

/// A non-empty, bounded UTF-8 id.
fn id(bytes: &[u8]) -> Option<&str> {
    if bytes.is_empty() || bytes.len() > MAX_ID_BYTES {
        return None;
    }
    std::str::from_utf8(bytes).ok()
}

/// Fixed codes: the wire outlives the enum's order.
fn kind_code(kind: ActorKind) -> u8 {
    match kind {
        ActorKind::Local => 0,
        ActorKind::ApiKey => 1,
        ActorKind::Mtls => 2,
        ActorKind::A2a => 3,
        ActorKind::Delegate => 4,
        ActorKind::System => 5,
    }
}

fn kind_of(code: u8) -> Option<ActorKind> {
    Some(match code {
        0 => ActorKind::Local,
        1 => ActorKind::ApiKey,
        2 => ActorKind::Mtls,
        3 => ActorKind::A2a,
        4 => ActorKind::Delegate,
        5 => ActorKind::System,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_kind() -> [ActorKind; 6] {
        [
            ActorKind::Local,
            ActorKind::ApiKey,
            ActorKind::Mtls,
            ActorKind::A2a,
            ActorKind::Delegate,
            ActorKind::System,
        ]
    }

    #[test]
    fn the_whole_principal_crosses_intact() {
        for kind in every_kind() {
            for (admin, restricted) in [(false, false), (true, false), (false, true)] {
                let mut who = Principal::new("ünïcode user:1", admin, kind)
                    .identified_as("spiffe://example.org/ns/a/sa/b");
                who.restricted = restricted;
                who.actor.admin = admin;
                assert_eq!(decode(&encode(&who)), Some(who));
            }
        }
    }

    #[test]
    fn a_version_1_principal_reads_as_an_api_key_user() {
        assert_eq!(
            decode(b"\x01alice"),
            Some(Principal::new("alice", true, ActorKind::ApiKey))
        );
        assert_eq!(
            decode(b"\x00bob"),
            Some(Principal::new("bob", false, ActorKind::ApiKey))
        );
    }

    #[test]
    fn garbage_is_refused() {
        let good = encode(&Principal::new("alice", false, ActorKind::Mtls));
        let mut cases: Vec<Vec<u8>> = vec![
            Vec::new(),
            vec![0],
            vec![1, 0xff, 0xfe],
            vec![3, 0, 1],
            vec![VERSION],
            vec![VERSION, 0],
            vec![VERSION, 0, 1, 0, 0, 0],
        ];
        // Every cut of a good one, an unknown flag or kind, a byte too many,
        // a length past the end, an empty id.
        cases.extend((1..good.len()).map(|n| good[..n].to_vec()));
        let mut flag = good.clone();
        flag[1] = 1 << 3;
        let mut kind = good.clone();
        kind[2] = 6;
        let mut extra = good.clone();
        extra.push(0);
        let mut long = good.clone();
        long[3..7].copy_from_slice(&u32::MAX.to_be_bytes());
        let empty = encode(&Principal::new("", false, ActorKind::ApiKey));
        cases.extend([flag, kind, extra, long, empty]);
        for case in cases {
            assert_eq!(decode(&case), None, "{case:?}");
        }
        let huge = "x".repeat(MAX_ID_BYTES + 1);
        assert_eq!(
            decode(&encode(&Principal::new(huge, false, ActorKind::ApiKey))),
            None
        );
    }
}
