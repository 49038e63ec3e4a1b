//! Operator calls on several replicas: `SetDefaultModel` sent to one
//! replica is stored and reaches every other (and outlives restarts);
//! `ResetRunners` and `InvalidateRunners` act on every live replica and
//! name them; `Drain` names the one it drained; `ListReplicas` on any
//! replica lists them all with the leases of their live turns.

use std::time::{Duration, Instant};

use agentrt_client::{ChatEvent, proto};

use super::harness::{Cluster, finish, read_until, serial, text_request};

const A: usize = 0;
const B: usize = 1;

/// The model of the next turn `cluster`'s replica `i` admits on a new
/// session.
async fn model_of_next_turn(cluster: &Cluster, i: usize) -> String {
    let session = cluster.session().await;
    let mut events = cluster
        .client(i)
        .chat_with(text_request(&session, "which model"))
        .await
        .unwrap();
    let seen = read_until(&mut events, Duration::from_secs(10), |e| {
        matches!(e.kind, ChatEvent::TurnStarted(_))
    })
    .await;
    let model = match &seen.last().unwrap().kind {
        ChatEvent::TurnStarted(started) => started.model.clone(),
        other => unreachable!("read_until stops at TurnStarted, got {other:?}"),
    };
    finish(events, Duration::from_secs(10)).await;
    model
}

/// Waits (at most `within`) until replica `i` reports `model` as its
/// default; how long it took.
async fn until_default(cluster: &Cluster, i: usize, model: &str, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let stats = cluster.client(i).runtime_stats().await.unwrap();
        if stats.default_model == model {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "replica {i} still has default {:?} after {within:?}",
            stats.default_model
        );
        // The replicas apply it with their heartbeat (once a second):
        // poll a few times per heartbeat.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_default_model_set_on_one_replica_reaches_another_and_outlives_restarts() {
    let _serial = serial().await;
    let Some(mut cluster) = Cluster::start(2).await else {
        return;
    };
    assert_eq!(model_of_next_turn(&cluster, B).await, "fake/m");
    let answer = cluster
        .client(A)
        .admin()
        .set_default_model(proto::SetDefaultModelRequest {
            model: "fake/other".to_owned(),
            thinking: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.previous_model, "fake/m");
    assert_eq!(answer.replica_ids.len(), 2, "{answer:?}");
    let took = until_default(&cluster, B, "fake/other", Duration::from_secs(5)).await;
    println!("B applied A's SetDefaultModel after {took:?}");
    assert_eq!(model_of_next_turn(&cluster, B).await, "fake/other");

    // Both replicas stop; the setting is in the database, not in them.
    let url = cluster.db_url(A);
    cluster.kill(A).await;
    cluster.kill(B).await;
    cluster.restart(B, &url).await;
    cluster.restart(A, &url).await;
    for i in [A, B] {
        let stats = cluster.client(i).runtime_stats().await.unwrap();
        assert_eq!(
            stats.default_model, "fake/other",
            "replica {i} after restart"
        );
        assert_eq!(model_of_next_turn(&cluster, i).await, "fake/other");
    }
}

#[tokio::test]
async fn runner_resets_reach_every_live_replica_and_name_them() {
    let _serial = serial().await;
    let Some(cluster) = Cluster::start(2).await else {
        return;
    };
    // A runner cached on each replica.
    model_of_next_turn(&cluster, A).await;
    model_of_next_turn(&cluster, B).await;
    let reset = cluster
        .client(A)
        .admin()
        .reset_runners(proto::ResetRunnersRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut ids = reset.replica_ids.clone();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 2, "both replicas named once: {reset:?}");
    assert_eq!(reset.count, 2, "one runner closed on each: {reset:?}");
    for i in [A, B] {
        let stats = cluster.client(i).runtime_stats().await.unwrap();
        assert_eq!(stats.cached_runners, 0, "replica {i}: {stats:?}");
    }
    let invalidated = cluster
        .client(B)
        .admin()
        .invalidate_runners(proto::InvalidateRunnersRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut again = invalidated.replica_ids.clone();
    again.sort();
    assert_eq!(again, ids, "{invalidated:?}");

    let drained = cluster
        .client(B)
        .admin()
        .drain(proto::DrainRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(drained.replica_ids.len(), 1, "only B drains: {drained:?}");
    assert!(ids.contains(&drained.replica_ids[0]));
    // A still admits turns.
    assert_eq!(model_of_next_turn(&cluster, A).await, "fake/m");
}

/// `ListReplicas` (every lease on one page) asked of replica `i`.
async fn list_replicas(cluster: &Cluster, i: usize) -> proto::ListReplicasResponse {
    cluster
        .client(i)
        .admin()
        .list_replicas(proto::ListReplicasRequest::default())
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn list_replicas_shows_both_replicas_and_the_lease_of_the_one_running_a_turn() {
    let _serial = serial().await;
    let Some(cluster) = Cluster::start(2).await else {
        return;
    };
    let session = cluster.session().await;
    let mut events = cluster
        .client(A)
        .chat_with(text_request(&session, "hold listed 2"))
        .await
        .unwrap();
    let seen = read_until(&mut events, Duration::from_secs(10), |e| {
        matches!(e.kind, ChatEvent::Text(_))
    })
    .await;
    let turn_id = seen.last().unwrap().turn_id.clone();
    // Each replica marks itself.
    let from_a = list_replicas(&cluster, A).await;
    let a_id = from_a
        .replicas
        .iter()
        .find(|r| r.this_replica)
        .map(|r| r.replica_id.clone())
        .expect("A marks itself");

    // Asked of B, which runs nothing: the store answers for both.
    let listed = list_replicas(&cluster, B).await;
    assert_eq!(listed.replicas.len(), 2, "{listed:?}");
    assert!(
        listed
            .replicas
            .iter()
            .all(|r| r.live && r.address.starts_with("http://"))
    );
    let this: Vec<&proto::Replica> = listed.replicas.iter().filter(|r| r.this_replica).collect();
    assert_eq!(this.len(), 1, "one replica answered: {listed:?}");
    assert_ne!(this[0].replica_id, a_id, "B answered");
    assert_eq!(listed.leases.len(), 1, "{listed:?}");
    let lease = &listed.leases[0];
    assert_eq!(
        (
            lease.replica_id.as_str(),
            lease.session_id.as_str(),
            lease.turn_id.as_str()
        ),
        (a_id.as_str(), session.as_str(), turn_id.as_str())
    );
    assert!(
        lease.expires_at.is_some() && lease.started_at.is_some(),
        "{lease:?}"
    );
    assert!(listed.next_page_token.is_empty());

    cluster.upstream.release("listed");
    finish(events, Duration::from_secs(10)).await;
    let after = list_replicas(&cluster, A).await;
    assert!(
        after.leases.is_empty(),
        "the lease went with the turn: {after:?}"
    );
    assert_eq!(after.replicas.len(), 2);
}
