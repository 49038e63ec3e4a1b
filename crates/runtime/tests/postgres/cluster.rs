//! The replicas table and the cluster-wide settings (migration 3).

use std::time::Duration;

use agentrt_runtime::store::{Leases as _, Store as _};
use agentrt_runtime::types::ThinkingLevel;
use agentrt_testkit::pg;

#[tokio::test]
async fn heartbeats_list_the_live_replicas_and_leaving_removes_one() {
    let Some(db) = pg::database().await else {
        return;
    };
    let ttl = Duration::from_secs(10);
    let a = super::store(&db, "a", ttl).await;
    let b = super::store(&db, "b", ttl).await;
    let (ca, cb) = (a.cluster().expect("shared"), b.cluster().expect("shared"));
    let within = Duration::from_secs(5);
    assert!(ca.live_replicas(within).await.unwrap().is_empty());
    ca.heartbeat(Duration::from_secs(3600)).await.unwrap();
    cb.heartbeat(Duration::from_secs(3600)).await.unwrap();
    ca.heartbeat(Duration::from_secs(3600)).await.unwrap();
    let live = cb.live_replicas(within).await.unwrap();
    let ids: Vec<&str> = live.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(live[0].address, "http://a.test:50052");
    assert!(live[0].heartbeat_at >= live[0].started_at);
    // A heartbeat older than `within` is not live; `forget_after` removes it.
    assert!(ca.live_replicas(Duration::ZERO).await.unwrap().is_empty());
    cb.heartbeat(Duration::ZERO).await.unwrap();
    let ids: Vec<String> = ca
        .live_replicas(within)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert!(ids.len() <= 1, "a's row is forgotten: {ids:?}");
    cb.leave().await.unwrap();
    assert!(
        !ca.live_replicas(within)
            .await
            .unwrap()
            .iter()
            .any(|r| r.id == b.replica_id()),
        "b left"
    );
}

#[tokio::test]
async fn the_default_model_is_shared_and_versioned() {
    let Some(db) = pg::database().await else {
        return;
    };
    let ttl = Duration::from_secs(10);
    let a = super::store(&db, "a", ttl).await;
    let b = super::store(&db, "b", ttl).await;
    let (ca, cb) = (a.cluster().expect("shared"), b.cluster().expect("shared"));
    assert_eq!(cb.default_model().await.unwrap(), None);
    let first = ca
        .set_default_model("p/one", Some(ThinkingLevel::High))
        .await
        .unwrap();
    assert_eq!(first.version, 1);
    assert_eq!(cb.default_model().await.unwrap(), Some(first.clone()));
    let second = cb.set_default_model("p/two", None).await.unwrap();
    assert_eq!(second.version, 2);
    assert_eq!(second.model, "p/two");
    assert_eq!(second.thinking, None);
    // A new connection (a restarted replica) reads the same.
    let c = super::store(&db, "c", ttl).await;
    assert_eq!(
        c.cluster().unwrap().default_model().await.unwrap(),
        Some(second)
    );
}
