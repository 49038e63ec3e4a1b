//! Replicas on one PostgreSQL database coming and going: a drain on one
//! leaves the others' turns alone and keeps serving forwarded calls for its
//! own until they end; a forwarded stream dropped by its caller is dropped
//! on the owner; a replica without `[cluster]` cannot be forwarded to, and
//! says so.

use std::sync::Arc;
use std::time::Duration;

#[path = "support/replicas.rs"]
mod support;

use agentrt_client::proto;
use agentrt_testkit::gate::GateProvider;
use support::*;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

async fn status(r: &Replica, session: &str) -> Result<proto::SessionStatus, tonic::Status> {
    runtime(r)
        .await
        .get_session_status(proto::GetSessionStatusRequest {
            session_id: session.to_owned(),
        })
        .await
        .map(tonic::Response::into_inner)
}

/// Waits until `check` holds of the owner's status (re-read every 20 ms,
/// bounded by [`WAIT`]).
async fn until_status(r: &Replica, session: &str, check: impl Fn(&proto::SessionStatus) -> bool) {
    tokio::time::timeout(WAIT, async {
        loop {
            if check(&status(r, session).await.unwrap()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the owner's status got there");
}

#[tokio::test]
async fn a_forwarded_subscribe_dropped_by_its_caller_is_dropped_on_the_owner() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let gate = Arc::new(GateProvider::default());
    let a = replica(&db.url, true, &gate_models(&gate)).await;
    let b = replica(&db.url, true, &gate_models(&gate)).await;
    let session = new_session(&a).await;
    let mut owner = live_gate_turn(&a, &session).await;
    let mut watcher = runtime(&b)
        .await
        .subscribe(proto::SubscribeRequest {
            session_id: session.clone(),
            after_seq: 0,
            wait_for_turn: false,
        })
        .await
        .unwrap()
        .into_inner();
    until(&mut watcher, is_text).await;
    until_status(&a, &session, |s| s.watcher_count == 1).await;
    drop(watcher);
    until_status(&a, &session, |s| s.watcher_count == 0).await;
    assert!(status(&a, &session).await.unwrap().live, "the turn runs on");
    gate.release(1);
    let (events, _) = drain(&mut owner).await;
    assert_eq!(outcome(&events), Some(proto::TurnOutcome::Success));
    a.server.stop().await;
    b.server.stop().await;
}

#[tokio::test]
async fn a_draining_replica_serves_forwarded_calls_for_its_turns_and_leaves_the_others_alone() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let gate = Arc::new(GateProvider::default());
    let a = replica_with(&db.url, true, &gate_models(&gate), |c| {
        c.shutdown_grace = Duration::from_secs(15);
    })
    .await;
    let b = replica(&db.url, true, &gate_models(&gate)).await;
    let (on_a, on_b) = (new_session(&a).await, new_session(&b).await);
    let mut a_turn = runtime(&a)
        .await
        .chat(chat(&on_a, "gate/x", ""))
        .await
        .unwrap()
        .into_inner();
    until(&mut a_turn, is_text).await;
    let mut b_turn = runtime(&b)
        .await
        .chat(chat(&on_b, "gate/x", ""))
        .await
        .unwrap()
        .into_inner();
    until(&mut b_turn, is_text).await;
    // B watches A's turn through A's internal listener.
    let mut watcher = runtime(&b)
        .await
        .subscribe(proto::SubscribeRequest {
            session_id: on_a.clone(),
            after_seq: 0,
            wait_for_turn: false,
        })
        .await
        .unwrap()
        .into_inner();
    until(&mut watcher, is_text).await;

    let Replica {
        server: a_server,
        _dir: _a_dir,
    } = a;
    let a_url = a_server.url();
    let stopping = tokio::spawn(a_server.stop());
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel(a_url).await);
    tokio::time::timeout(WAIT, async {
        loop {
            let now = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: "readiness".to_owned(),
                })
                .await
                .unwrap()
                .into_inner()
                .status();
            if now == ServingStatus::NotServing {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("A reports NOT_SERVING while it drains");

    // A drains: a call for its turn sent to B still reaches it, and B's own
    // turn is untouched.
    let seen = status(&b, &on_a).await.unwrap();
    assert!(
        seen.live,
        "A's turn is live and answered through A's listener"
    );
    assert!(status(&b, &on_b).await.unwrap().live);
    assert_eq!(readiness(&b).await, ServingStatus::Serving);

    gate.release(2);
    let (events, trailer) = drain(&mut watcher).await;
    assert!(trailer.is_none(), "{trailer:?}");
    assert_eq!(outcome(&events), Some(proto::TurnOutcome::Success));
    let (events, _) = drain(&mut b_turn).await;
    assert_eq!(outcome(&events), Some(proto::TurnOutcome::Success));
    let (events, _) = drain(&mut a_turn).await;
    assert_eq!(outcome(&events), Some(proto::TurnOutcome::Success));
    tokio::time::timeout(WAIT, stopping)
        .await
        .expect("A stops once its turn ended")
        .unwrap();
    b.server.stop().await;
}

#[tokio::test]
async fn without_a_cluster_listener_calls_for_another_replicas_turn_are_unavailable() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let gate = Arc::new(GateProvider::default());
    let clustered = replica(&db.url, true, &gate_models(&gate)).await;
    let alone = replica(&db.url, false, &gate_models(&gate)).await;

    // A turn on the replica without [cluster]: nobody can forward to it.
    let session = new_session(&alone).await;
    let mut turn = live_gate_turn(&alone, &session).await;
    let err = status(&clustered, &session).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(
        err.message().contains("no cluster listener"),
        "{}",
        err.message()
    );
    gate.release(1);
    drain(&mut turn).await;

    // A turn on the clustered replica: the lone one cannot forward.
    let session = new_session(&clustered).await;
    let mut turn = live_gate_turn(&clustered, &session).await;
    let err = status(&alone, &session).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(
        err.message().contains("cannot be reached from here"),
        "{}",
        err.message()
    );
    gate.release(1);
    drain(&mut turn).await;
    clustered.server.stop().await;
    alone.server.stop().await;
}

#[tokio::test]
async fn a_turn_whose_replica_cannot_renew_its_lease_stops_and_the_session_moves_on() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let proxy = agentrt_testkit::tcp_proxy::TcpProxy::start(&db.addr).await;
    let via_proxy = db.url.replace(&db.addr, &proxy.addr().to_string());
    let gate = Arc::new(GateProvider::default());
    let a = replica_with(&via_proxy, true, &gate_models(&gate), |c| {
        c.store.lease_ttl_ms = Some(1_000);
    })
    .await;
    let session = new_session(&a).await;
    let mut turn = live_gate_turn(&a, &session).await;

    // No renewal can succeed: within about a lease time the turn stops,
    // telling its caller why, and stores nothing more.
    proxy.cut();
    let (events, trailer) = drain(&mut turn).await;
    assert_eq!(outcome(&events), Some(proto::TurnOutcome::Error));
    let error = events
        .iter()
        .find_map(|e| match &e.kind {
            Some(proto::chat_event::Kind::Error(e)) => Some(e.message.clone()),
            _ => None,
        })
        .expect("an error event");
    assert!(error.contains("lost the session's lease"), "{error}");
    assert_eq!(trailer.map(|s| s.code()), Some(Code::Unavailable));

    proxy.restore();
    wait_readiness(&a, ServingStatus::Serving).await;
    gate.release(1);
    // The lapsed lease does not hold the session: the next turn is
    // admitted, and history has the first turn's user message only.
    let (events, trailer) = drain(
        &mut runtime(&a)
            .await
            .chat(chat(&session, "gate/x", ""))
            .await
            .unwrap()
            .into_inner(),
    )
    .await;
    assert!(trailer.is_none(), "{trailer:?}");
    assert_eq!(outcome(&events), Some(proto::TurnOutcome::Success));
    let history = agentrt_client::proto::session_service_client::SessionServiceClient::new(
        channel(a.server.url()).await,
    )
    .get_history(proto::GetHistoryRequest {
        session_id: session.clone(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .messages;
    let roles: Vec<(u64, i32)> = history.iter().map(|m| (m.seq, m.role)).collect();
    assert_eq!(
        roles,
        [
            (1, proto::Role::User as i32),
            (2, proto::Role::User as i32),
            (3, proto::Role::Assistant as i32)
        ],
        "{history:?}"
    );
    a.server.stop().await;
}
