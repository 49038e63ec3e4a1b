//! The quota checks of the stores a process owns (memory, sled); the
//! PostgreSQL store's are tested through gRPC across replicas
//! (`server/tests/quotas_pg.rs`).

use super::testing::{running_turn, text_message};
use super::{CreateOutcome, MemoryStore, SledStore, Store, StoreError};
use crate::quota::{Quota, QuotaLimits, WriteQuota};
use crate::store::stored_bytes;
use crate::types::{NewSession, Role};

fn quota(limits: QuotaLimits) -> WriteQuota {
    WriteQuota {
        limits,
        count_turns: false,
    }
}

fn new(owner: &str, id: Option<&str>) -> NewSession {
    NewSession {
        owner: owner.to_owned(),
        id: id.map(str::to_owned),
        ..NewSession::default()
    }
}

fn refused<T: std::fmt::Debug>(result: Result<T, StoreError>, which: Quota, limit: u64) {
    match result {
        Err(StoreError::QuotaExceeded(e)) => {
            assert_eq!((e.quota, e.limit), (which, limit));
        }
        other => panic!("expected a {which:?} refusal, got {other:?}"),
    }
}

async fn sessions_quota(store: &dyn Store) {
    let q = quota(QuotaLimits {
        sessions: Some(2),
        ..QuotaLimits::NONE
    });
    let first = match store.create_session_within(new("a", Some("s1")), &q).await {
        Ok(CreateOutcome::Created(s)) => s,
        other => panic!("{other:?}"),
    };
    store
        .create_session_within(new("a", None), &q)
        .await
        .unwrap();
    refused(
        store.create_session_within(new("a", None), &q).await,
        Quota::Sessions,
        2,
    );
    assert_eq!(store.count_sessions().await.unwrap(), 2, "nothing stored");
    // An existing session is returned whatever the quota; others' count
    // apart.
    assert!(matches!(
        store.create_session_within(new("a", Some("s1")), &q).await,
        Ok(CreateOutcome::Existing(_))
    ));
    store
        .create_session_within(new("b", None), &q)
        .await
        .unwrap();
    assert!(store.delete_session(&first.id, None).await.unwrap());
    store
        .create_session_within(new("a", None), &q)
        .await
        .unwrap();
}

async fn bytes_quota(store: &dyn Store) {
    let message = text_message("t", Role::User, &"x".repeat(500));
    let each = stored_bytes(&message);
    let q = quota(QuotaLimits {
        stored_bytes: Some(2 * each),
        ..QuotaLimits::NONE
    });
    let CreateOutcome::Created(s) = store.create_session(new("a", None)).await.unwrap() else {
        panic!("created");
    };
    for turn in ["t1", "t2"] {
        let record = running_turn(&s.id, &s.incarnation, turn);
        store
            .begin_turn_within(record, message.clone(), &q)
            .await
            .unwrap();
    }
    let record = running_turn(&s.id, &s.incarnation, "t3");
    refused(
        store.begin_turn_within(record, message.clone(), &q).await,
        Quota::StoredBytes,
        2 * each,
    );
    let after = store.get_session(&s.id).await.unwrap().unwrap();
    assert_eq!(after.next_seq, 3, "the refused turn stored nothing");
    assert!(store.get_turn(&s.id, "t3").await.unwrap().is_none());
    // Deleting the session gives its bytes back.
    assert!(store.delete_session(&s.id, None).await.unwrap());
    let CreateOutcome::Created(s) = store.create_session(new("a", None)).await.unwrap() else {
        panic!("created");
    };
    let record = running_turn(&s.id, &s.incarnation, "t4");
    store.begin_turn_within(record, message, &q).await.unwrap();
}

#[tokio::test]
async fn memory_store_checks_sessions_and_bytes() {
    sessions_quota(&MemoryStore::new()).await;
    bytes_quota(&MemoryStore::new()).await;
}

#[tokio::test]
async fn sled_store_checks_sessions_and_bytes() {
    let dir = tempfile::tempdir().unwrap();
    sessions_quota(&SledStore::open(dir.path().join("a")).unwrap()).await;
    bytes_quota(&SledStore::open(dir.path().join("b")).unwrap()).await;
}
