//! `ListReplicas`: the replicas on the store and the live turns' leases
//! they hold, for operators.
//!
//! On a shared store both come from the database, so any replica answers
//! for all of them: every replica with a heartbeat row (a row is removed an
//! hour after its replica's last heartbeat, or when it stops), and the
//! leases page by page in (replica id, session id) order, lapsed ones the
//! sweepers have not released yet included. On a store one process owns
//! the one replica is this process, and its leases are its live turns.

use std::time::SystemTime;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::Runtime;
use super::cluster::{FORGET_AFTER, LIVE_WITHIN};
use super::keys::client_id;
use crate::error::RuntimeError;
use crate::limits::MAX_ID_BYTES;
use crate::store::{LeaseCursor, ListedLease, Replica};
use crate::types::Principal;

/// Leases per page when the request names no page size.
pub const LEASES_DEFAULT_PAGE: usize = 100;
/// Most leases per page.
pub const LEASES_MAX_PAGE: usize = 1000;
/// Most replicas listed (by id); a store holds more only when replicas
/// restart very often (each start is a new replica for an hour).
pub const MAX_LISTED_REPLICAS: usize = 1000;

/// A replica as `ListReplicas` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaStatus {
    /// Its id; empty on a store one process owns (it has none).
    pub id: String,
    /// Where other replicas reach its internal listener (`none` without
    /// `[cluster]`); empty on a store one process owns.
    pub address: String,
    /// When it started.
    pub started_at: SystemTime,
    /// Its last heartbeat (the database's clock); on a store one process
    /// owns, now.
    pub heartbeat_at: SystemTime,
    /// Whether its heartbeat is recent enough for cluster-wide operator
    /// calls to reach it.
    pub live: bool,
    /// Whether it is the replica answering.
    pub this_replica: bool,
}

/// A live turn's lease as `ListReplicas` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnLease {
    /// The replica holding it (empty on a store one process owns).
    pub replica_id: String,
    /// The session, by the id its owner knows (a client-chosen id is
    /// unique per owner only).
    pub session_id: String,
    /// The session's owner.
    pub owner: String,
    /// The live turn.
    pub turn_id: String,
    /// When the turn began: its admission (on a store one process owns,
    /// when it began running here — its resume for a resumed paused turn);
    /// `None` when its record cannot be found.
    pub started_at: Option<SystemTime>,
    /// When the lease lapses unless renewed (the database's clock); `None`
    /// on a store one process owns, where nothing lapses.
    pub expires_at: Option<SystemTime>,
}

/// One page of `ListReplicas`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaList {
    /// Every replica (at most [`MAX_LISTED_REPLICAS`]), on every page.
    pub replicas: Vec<ReplicaStatus>,
    /// This page of the leases.
    pub leases: Vec<TurnLease>,
    /// Where the next page starts; empty after the last.
    pub next_page_token: String,
}

impl Runtime {
    /// The replicas and a page of their leases (admins only; see the
    /// module docs): `page_size` leases (0: [`LEASES_DEFAULT_PAGE`], at
    /// most [`LEASES_MAX_PAGE`]) after `page_token`.
    pub async fn list_replicas(
        &self,
        who: &Principal,
        page_size: usize,
        page_token: &str,
    ) -> Result<ReplicaList, RuntimeError> {
        super::admin::require_admin(who)?;
        let after = decode_token(page_token)?;
        let limit = match page_size {
            0 => LEASES_DEFAULT_PAGE,
            n => n.min(LEASES_MAX_PAGE),
        };
        // Each lease with its session's stored key, which orders them.
        let (replicas, mut leases) = match self.inner.store.leases() {
            Some(store) => {
                // One more than the page tells whether another follows.
                let listed = store.list_leases(after.as_ref(), limit + 1).await?;
                let me = store.replica_id();
                (
                    self.replica_rows(me).await?,
                    listed.into_iter().map(keyed).collect(),
                )
            }
            None => (vec![self.single_node()], self.own_leases(after.as_ref())),
        };
        let more = leases.len() > limit;
        leases.truncate(limit);
        let next_page_token = match leases.last() {
            Some((key, last)) if more => encode_token(&last.replica_id, key),
            Some(_) | None => String::new(),
        };
        Ok(ReplicaList {
            replicas,
            leases: leases.into_iter().map(|(_, lease)| lease).collect(),
            next_page_token,
        })
    }

    /// The heartbeat rows of a shared store, `me` marked.
    async fn replica_rows(&self, me: &str) -> Result<Vec<ReplicaStatus>, RuntimeError> {
        let Some(cluster) = self.inner.store.cluster() else {
            return Ok(Vec::new());
        };
        // Every row is younger than FORGET_AFTER (older ones are removed);
        // the live ones as the operator calls count them, on the
        // database's clock.
        let mut rows = cluster.live_replicas(FORGET_AFTER).await?;
        let live: Vec<String> = cluster
            .live_replicas(LIVE_WITHIN)
            .await?
            .into_iter()
            .map(|r| r.id)
            .collect();
        rows.truncate(MAX_LISTED_REPLICAS);
        Ok(rows
            .into_iter()
            .map(
                |Replica {
                     id,
                     address,
                     started_at,
                     heartbeat_at,
                 }| ReplicaStatus {
                    live: live.contains(&id),
                    this_replica: id == me,
                    id,
                    address,
                    started_at,
                    heartbeat_at,
                },
            )
            .collect())
    }

    /// This process, on a store it owns.
    fn single_node(&self) -> ReplicaStatus {
        let now = SystemTime::now();
        ReplicaStatus {
            id: String::new(),
            address: String::new(),
            started_at: now.checked_sub(self.uptime()).unwrap_or(now),
            heartbeat_at: now,
            live: true,
            this_replica: true,
        }
    }

    /// This process's live turns after `after`, by stored key, at most
    /// one more than the longest page.
    fn own_leases(&self, after: Option<&LeaseCursor>) -> Vec<(String, TurnLease)> {
        let mut live = self.inner.slots.live_with_sessions();
        live.sort_by(|a, b| a.0.cmp(&b.0));
        live.into_iter()
            .filter(|(key, _)| after.is_none_or(|c| key.as_str() > c.session_id.as_str()))
            .take(LEASES_MAX_PAGE + 1)
            .map(|(key, turn)| {
                let lease = TurnLease {
                    replica_id: String::new(),
                    session_id: client_id(&key).to_owned(),
                    owner: turn.owner.clone(),
                    turn_id: turn.turn_id.clone(),
                    started_at: Some(turn.started_at),
                    expires_at: None,
                };
                (key, lease)
            })
            .collect()
    }
}

/// A listed lease with its session's stored key; the lease names the
/// session by the id its owner knows.
fn keyed(listed: ListedLease) -> (String, TurnLease) {
    let lease = TurnLease {
        replica_id: listed.lease.replica_id,
        session_id: client_id(&listed.session_id).to_owned(),
        owner: listed.owner,
        turn_id: listed.lease.turn_id,
        started_at: listed.turn_started_at,
        expires_at: Some(listed.lease.expires_at),
    };
    (listed.session_id, lease)
}

/// The page token after the lease of `replica_id` on `session_id`.
fn encode_token(replica_id: &str, session_id: &str) -> String {
    let pair = serde_json::json!([replica_id, session_id]);
    URL_SAFE_NO_PAD.encode(pair.to_string())
}

/// Where a page token says to go on (`None` for the first page).
fn decode_token(token: &str) -> Result<Option<LeaseCursor>, RuntimeError> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || RuntimeError::invalid("page_token", "is not a token returned by ListReplicas");
    // Base64 of a JSON pair of ids of at most MAX_ID_BYTES each (escaped,
    // each byte at most six).
    if token.len() > (2 * 6 * MAX_ID_BYTES + 8).div_ceil(3) * 4 {
        return Err(bad());
    }
    let raw = URL_SAFE_NO_PAD.decode(token).map_err(|_| bad())?;
    let (replica_id, session_id): (String, String) =
        serde_json::from_slice(&raw).map_err(|_| bad())?;
    if session_id.is_empty() || replica_id.len() > MAX_ID_BYTES || session_id.len() > MAX_ID_BYTES {
        return Err(bad());
    }
    Ok(Some(LeaseCursor {
        replica_id,
        session_id,
    }))
}

#[cfg(test)]
mod tests;
