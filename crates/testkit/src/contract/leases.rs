//! The leases of a shared store as operators list them
//! (`RuntimeAdmin.ListReplicas`).

use std::time::{Duration, SystemTime};

use agentrt_runtime::store::{LeaseCursor, Store};
use agentrt_runtime::types::{TurnRecord, TurnStatus};

use super::{begin, create, running_turn};

/// A store with leases lists every held lease — the session's owner, the
/// turn and when it began, the holder and the expiry — in (replica,
/// session) order from a cursor, a page at a time; a released lease is
/// listed no more. A store without leases (one process owns it) has no
/// replicas to list either.
pub async fn listed_leases_page_by_replica_then_session(store: &dyn Store) {
    let Some(leases) = store.leases() else {
        assert!(
            store.cluster().is_none(),
            "a store with heartbeats but no leases"
        );
        return;
    };
    let me = leases.replica_id().to_owned();
    let idle = create(store, "carol", "agent").await;
    let mut want = Vec::new();
    for (owner, turn_id) in [("alice", "t-a"), ("bob", "t-b")] {
        let s = create(store, owner, "agent").await;
        let began = SystemTime::now();
        begin(store, &s.id, turn_id).await;
        want.push((s, owner, turn_id, began));
    }
    want.sort_by(|a, b| a.0.id.cmp(&b.0.id));

    let first = leases.list_leases(None, 1).await.expect("list_leases");
    assert_eq!(first.len(), 1, "{first:?}");
    let mut seen = first.clone();
    let cursor = LeaseCursor {
        replica_id: first[0].lease.replica_id.clone(),
        session_id: first[0].session_id.clone(),
    };
    let rest = leases
        .list_leases(Some(&cursor), 10)
        .await
        .expect("list_leases");
    seen.extend(rest);
    assert_eq!(seen.len(), 2, "each lease once: {seen:?}");
    let now = SystemTime::now();
    for (listed, (s, owner, turn_id, began)) in seen.iter().zip(&want) {
        assert_eq!(
            (
                listed.session_id.as_str(),
                listed.owner.as_str(),
                listed.lease.turn_id.as_str(),
                listed.lease.replica_id.as_str()
            ),
            (s.id.as_str(), *owner, *turn_id, me.as_str())
        );
        let started = listed.turn_started_at.expect("the turn's start");
        let slack = Duration::from_secs(5);
        assert!(
            started + slack >= *began && started <= now + slack,
            "{listed:?}"
        );
        assert!(listed.lease.expires_at > now, "a fresh lease: {listed:?}");
    }
    assert!(seen.iter().all(|l| l.session_id != idle.id));
    let last = LeaseCursor {
        replica_id: me.clone(),
        session_id: seen[1].session_id.clone(),
    };
    assert!(
        leases
            .list_leases(Some(&last), 10)
            .await
            .expect("list_leases")
            .is_empty()
    );

    // The first turn ends: its lease goes with it.
    let (s, _, turn_id, _) = &want[0];
    let finished = TurnRecord {
        status: TurnStatus::Success,
        finished_at: Some(SystemTime::now()),
        user_message_seq: 1,
        ..running_turn(&s.id, &s.incarnation, turn_id)
    };
    store.finish_turn(finished).await.expect("finish_turn");
    let left = leases.list_leases(None, 10).await.expect("list_leases");
    let left: Vec<&str> = left.iter().map(|l| l.session_id.as_str()).collect();
    assert_eq!(left, [want[1].0.id.as_str()]);
}
