//! Session leases between replicas: one live turn per session across
//! stores, writes refused once a lease lapsed, takeover, sweeping, renewal.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use agentrt_runtime::store::{
    INTERRUPTED_TOOL, Lease, LeaseKey, Leases, PostgresStore, Store, StoreError,
};
use agentrt_runtime::types::{
    ContentBlock, Message, NewMessage, Role, Session, TurnRecord, TurnStatus,
};
use agentrt_testkit::contract::text_message;
use agentrt_testkit::pg;

use super::{calling, lease, result, running, seqs, session, store, user, wait_lapsed};

/// Long enough to stay live through a few writes on a loaded machine.
const LIVE: Duration = Duration::from_millis(1500);

fn finished(session: &Session, turn_id: &str, user_seq: u64) -> TurnRecord {
    TurnRecord {
        status: TurnStatus::Success,
        finished_at: Some(SystemTime::now()),
        user_message_seq: user_seq,
        ..running(session, turn_id)
    }
}

fn lost(result: Result<impl std::fmt::Debug, StoreError>, turn: &str) {
    match result {
        Err(StoreError::LeaseLost { turn_id }) if turn_id == turn => {}
        other => panic!("expected LeaseLost of {turn}, got {other:?}"),
    }
}

fn expect_lease(lease: &Lease, replica: &str, turn_id: &str) {
    assert_eq!(
        (lease.replica_id.as_str(), lease.turn_id.as_str()),
        (replica, turn_id)
    );
    assert_eq!(lease.address, format!("http://{replica}.test:50052"));
}

/// Results of `call` in the session's history.
async fn results_of(store: &dyn Store, session_id: &str, call: &str) -> Vec<(String, bool)> {
    let history = store
        .history(session_id, 0, usize::MAX, true)
        .await
        .expect("history");
    history
        .iter()
        .flat_map(|m| &m.body.content)
        .filter_map(|block| match block {
            ContentBlock::ToolResult {
                call_id,
                content,
                is_error,
                ..
            } if call_id == call => Some((content.clone(), *is_error)),
            _ => None,
        })
        .collect()
}

fn begin_on(
    store: &Arc<PostgresStore>,
    session: &Session,
    turn_id: &str,
) -> tokio::task::JoinHandle<Result<Message, StoreError>> {
    let (store, turn, message) = (Arc::clone(store), running(session, turn_id), user(turn_id));
    tokio::spawn(async move { store.begin_turn(turn, message).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_admissions_on_two_replicas_admit_exactly_one() {
    let Some(db) = pg::database().await else {
        return;
    };
    let ttl = Duration::from_secs(30);
    let replicas = [
        Arc::new(store(&db, "a", ttl).await),
        Arc::new(store(&db, "b", ttl).await),
    ];
    let s = session(&*replicas[0]).await;
    let mut admitted = Vec::new();
    for round in 0..200 {
        let ids = [format!("a-{round}"), format!("b-{round}")];
        let tasks = [
            begin_on(&replicas[0], &s, &ids[0]),
            begin_on(&replicas[1], &s, &ids[1]),
        ];
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.expect("task"));
        }
        let (winner, message, busy) = match (outcomes.remove(0), outcomes.remove(0)) {
            (Ok(m), Err(StoreError::Busy(lease))) => (0, m, lease),
            (Err(StoreError::Busy(lease)), Ok(m)) => (1, m, lease),
            other => panic!("round {round}: expected one admission and one Busy, got {other:?}"),
        };
        expect_lease(&busy, ["a", "b"][winner], &ids[winner]);
        assert_eq!(message.body.turn_id, ids[winner]);
        replicas[winner]
            .finish_turn(finished(&s, &ids[winner], message.seq))
            .await
            .expect("the winner finishes");
        admitted.push(message.seq);
    }
    assert_eq!(admitted, (1..=200).collect::<Vec<_>>());
    assert_eq!(
        seqs(&*replicas[1], &s.id).await,
        admitted,
        "no gap, no duplicate"
    );
    let count = replicas[0].get_session(&s.id).await.expect("get");
    assert_eq!(count.map(|s| s.message_count), Some(200));
}

#[tokio::test]
async fn a_turn_stores_nothing_once_its_lease_lapsed() {
    let Some(db) = pg::database().await else {
        return;
    };
    let a = store(&db, "a", LIVE).await;
    let s = session(&a).await;
    let begun = a
        .begin_turn(running(&s, "t1"), user("t1"))
        .await
        .expect("begin");
    a.append_message(&s.id, &s.incarnation, calling("t1", &["c1"]))
        .await
        .expect("a write while the lease is live");
    wait_lapsed(&a, &s.id).await;
    let answer = text_message("t1", Role::Assistant, "late answer");
    lost(
        a.append_message(&s.id, &s.incarnation, answer.clone())
            .await,
        "t1",
    );
    let done = finished(&s, "t1", begun.seq);
    lost(a.finish_turn(done.clone()).await, "t1");
    lost(a.finish_turn_with(done, Some(answer)).await, "t1");
    let summary = NewMessage::new("t1", Role::Summary, vec![ContentBlock::text("sum")]);
    lost(
        a.store_compaction(&s.id, &s.incarnation, summary, 1).await,
        "t1",
    );
    assert_eq!(
        seqs(&a, &s.id).await,
        [1, 2],
        "nothing stored after the lapse"
    );
    let record = a.get_turn(&s.id, "t1").await.expect("get_turn");
    assert_eq!(record.map(|t| t.status), Some(TurnStatus::Running));
    let session = a.get_session(&s.id).await.expect("get").expect("exists");
    assert_eq!((session.message_count, session.next_seq), (2, 3));
    // A message of no recorded turn is no turn's write.
    let notice = text_message("compaction", Role::Notice, "n");
    let stored = a.append_message(&s.id, &s.incarnation, notice).await;
    assert_eq!(stored.expect("not lease-checked").seq, 3);
}

#[tokio::test]
async fn the_next_admission_takes_over_a_lapsed_lease() {
    let Some(db) = pg::database().await else {
        return;
    };
    let (a, b) = (
        store(&db, "a", LIVE).await,
        store(&db, "b", LIVE * 20).await,
    );
    let s = session(&a).await;
    a.begin_turn(running(&s, "t1"), user("t1"))
        .await
        .expect("begin");
    for message in [calling("t1", &["c1", "c2"]), result("t1", "c2")] {
        a.append_message(&s.id, &s.incarnation, message)
            .await
            .expect("while live");
    }
    match b.begin_turn(running(&s, "t2"), user("t2")).await {
        Err(StoreError::Busy(held)) => expect_lease(&held, "a", "t1"),
        other => panic!("expected Busy while a's lease is live, got {other:?}"),
    }
    wait_lapsed(&b, &s.id).await;
    let second = b
        .begin_turn(running(&s, "t2"), user("t2"))
        .await
        .expect("takeover");
    assert_eq!(
        second.seq, 5,
        "user, calls, c2's result, c1's interrupted result, user"
    );
    assert_eq!(
        results_of(&b, &s.id, "c1").await,
        [(INTERRUPTED_TOOL.to_owned(), true)],
        "the open call is answered exactly once"
    );
    assert_eq!(results_of(&b, &s.id, "c2").await.len(), 1);
    let old = b.get_turn(&s.id, "t1").await.expect("get").expect("t1");
    assert_eq!(old.status, TurnStatus::Interrupted);
    assert!(old.finished_at.is_some());
    let last = b
        .get_session(&s.id)
        .await
        .expect("get")
        .expect("exists")
        .last_turn;
    assert_eq!(
        last.map(|t| (t.turn_id, t.status)),
        Some(("t2".to_owned(), TurnStatus::Running))
    );
    expect_lease(&lease(&a, &s.id).await.expect("b's lease"), "b", "t2");
    // The old owner's writes are refused; nobody else touches the new turn.
    lost(
        a.append_message(&s.id, &s.incarnation, result("t1", "c1"))
            .await,
        "t1",
    );
    lost(a.finish_turn(finished(&s, "t1", 1)).await, "t1");
    assert!(a.recover_interrupted().await.expect("recover").is_empty());
    assert!(a.sweep_expired_leases().await.expect("sweep").is_empty());
    assert_eq!(seqs(&a, &s.id).await, [1, 2, 3, 4, 5]);
    b.finish_turn(finished(&s, "t2", second.seq))
        .await
        .expect("finish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sweepers_on_two_replicas_interrupt_each_turn_once() {
    let Some(db) = pg::database().await else {
        return;
    };
    let a = Arc::new(store(&db, "a", LIVE).await);
    let b = Arc::new(store(&db, "b", LIVE).await);
    for round in 0..3 {
        let mut sessions = Vec::new();
        for i in 0..8 {
            let s = session(&*a).await;
            let turn_id = format!("t{round}-{i}");
            a.begin_turn(running(&s, &turn_id), user(&turn_id))
                .await
                .expect("begin");
            a.append_message(&s.id, &s.incarnation, calling(&turn_id, &["c"]))
                .await
                .expect("while live");
            sessions.push((s, turn_id));
        }
        for (s, _) in &sessions {
            wait_lapsed(&*b, &s.id).await;
        }
        let sweeps = [Arc::clone(&a), Arc::clone(&b)]
            .map(|store| tokio::spawn(async move { store.sweep_expired_leases().await }));
        let mut swept = Vec::new();
        for sweep in sweeps {
            swept.extend(sweep.await.expect("task").expect("sweep"));
        }
        let mut ids: Vec<&str> = swept.iter().map(|t| t.turn_id.as_str()).collect();
        ids.sort_unstable();
        let mut want: Vec<&str> = sessions.iter().map(|(_, t)| t.as_str()).collect();
        want.sort_unstable();
        assert_eq!(ids, want, "every lapsed turn swept, none twice");
        assert!(swept.iter().all(|t| t.status == TurnStatus::Interrupted));
        for (s, turn_id) in &sessions {
            assert_eq!(
                results_of(&*a, &s.id, "c").await,
                [(INTERRUPTED_TOOL.to_owned(), true)]
            );
            let record = a
                .get_turn(&s.id, turn_id)
                .await
                .expect("get")
                .expect("turn");
            assert_eq!(record.status, TurnStatus::Interrupted);
            assert_eq!(lease(&*a, &s.id).await, None);
        }
        assert!(a.sweep_expired_leases().await.expect("sweep").is_empty());
        assert!(b.sweep_expired_leases().await.expect("sweep").is_empty());
    }
}

#[tokio::test]
async fn renewal_keeps_a_lease_and_reports_a_taken_over_turn() {
    let Some(db) = pg::database().await else {
        return;
    };
    let ttl = Duration::from_millis(1500);
    let (a, b) = (store(&db, "a", ttl).await, store(&db, "b", ttl * 30).await);
    let (s, other) = (session(&a).await, session(&a).await);
    a.begin_turn(running(&s, "t1"), user("t1"))
        .await
        .expect("begin");
    b.begin_turn(running(&other, "o1"), user("o1"))
        .await
        .expect("begin");
    let first = lease(&a, &s.id).await.expect("a's lease");
    let keys = [LeaseKey {
        session_id: s.id.clone(),
        turn_id: "t1".to_owned(),
    }];
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while started.elapsed() < ttl * 5 / 2 {
        tick.tick().await;
        assert!(a.renew_leases(&keys).await.expect("renew").is_empty());
        let live = lease(&a, &s.id).await.expect("renewed past its ttl");
        expect_lease(&live, "a", "t1");
    }
    assert!(lease(&a, &s.id).await.expect("live").expires_at > first.expires_at + ttl);
    a.append_message(&s.id, &s.incarnation, calling("t1", &["c"]))
        .await
        .expect("still the owner");
    // Another replica's lease is not this one's to renew.
    let theirs = [LeaseKey {
        session_id: other.id.clone(),
        turn_id: "o1".to_owned(),
    }];
    let before = lease(&b, &other.id).await.expect("b's lease");
    assert_eq!(a.renew_leases(&theirs).await.expect("renew"), ["o1"]);
    assert_eq!(lease(&b, &other.id).await, Some(before));
    // Unrenewed, it lapses; once taken over, renewing reports it lost.
    wait_lapsed(&b, &s.id).await;
    b.begin_turn(running(&s, "t2"), user("t2"))
        .await
        .expect("takeover");
    let both = [keys[0].clone(), theirs[0].clone()];
    assert_eq!(a.renew_leases(&both).await.expect("renew"), ["t1", "o1"]);
    assert_eq!(
        b.renew_leases(&theirs).await.expect("renew"),
        Vec::<String>::new()
    );
    assert!(a.renew_leases(&[]).await.expect("nothing").is_empty());
}

#[tokio::test]
async fn finishing_releases_the_lease() {
    let Some(db) = pg::database().await else {
        return;
    };
    let ttl = Duration::from_secs(30);
    let (a, b) = (store(&db, "a", ttl).await, store(&db, "b", ttl).await);
    let s = session(&a).await;
    let before = SystemTime::now();
    let begun = a
        .begin_turn(running(&s, "t1"), user("t1"))
        .await
        .expect("begin");
    let held = lease(&b, &s.id).await.expect("a's lease, seen from b");
    expect_lease(&held, "a", "t1");
    assert!(held.expires_at > before + ttl / 2, "{held:?}");
    a.finish_turn_with(
        finished(&s, "t1", begun.seq),
        Some(text_message("t1", Role::Assistant, "answer")),
    )
    .await
    .expect("finish");
    assert_eq!(lease(&b, &s.id).await, None);
    let second = b
        .begin_turn(running(&s, "t2"), user("t2"))
        .await
        .expect("free again");
    assert_eq!(second.seq, 3);
    expect_lease(&lease(&a, &s.id).await.expect("b's lease"), "b", "t2");
    let first = a.get_turn(&s.id, "t1").await.expect("get").expect("t1");
    assert_eq!(first.status, TurnStatus::Success);
}

/// A replica's own lease outliving its turn (its final write failed) is
/// no obstacle to its next admission there, which interrupts that turn;
/// elsewhere it is busy until it lapses.
#[tokio::test]
async fn a_replica_takes_over_its_own_leftover_lease() {
    let Some(db) = pg::database().await else {
        return;
    };
    let ttl = Duration::from_secs(30);
    let (a, b) = (store(&db, "a", ttl).await, store(&db, "b", ttl).await);
    let s = session(&a).await;
    a.begin_turn(running(&s, "t1"), user("t1"))
        .await
        .expect("begin");
    assert!(matches!(
        b.begin_turn(running(&s, "x"), user("x")).await,
        Err(StoreError::Busy(_))
    ));
    a.begin_turn(running(&s, "t2"), user("t2"))
        .await
        .expect("own leftover");
    let old = a.get_turn(&s.id, "t1").await.expect("get").expect("t1");
    assert_eq!(old.status, TurnStatus::Interrupted);
    expect_lease(&lease(&b, &s.id).await.expect("lease"), "a", "t2");
    assert_eq!(seqs(&a, &s.id).await, [1, 2]);
}
