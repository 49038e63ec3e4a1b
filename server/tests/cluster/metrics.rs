//! `/metrics` of replicas on PostgreSQL: the pool's connections, the
//! leases a replica holds, the calls it forwarded, the store's
//! reachability, and the turn a killed replica left behind counted as
//! interrupted by the replica that swept it.

use std::time::{Duration, Instant};

use super::harness::{
    Cluster, LEASE_TTL, is_text, read_until, scrape, serial, series, text_request,
};

const A: usize = 0;
const B: usize = 1;
const POOL: &str = "db_client_connection_pool_name=\"store\"";

#[tokio::test]
async fn replicas_show_pool_lease_forwarding_reachability_and_interrupted_turn_series() {
    let _serial = serial().await;
    let Some(mut cluster) = Cluster::start(2).await else {
        return;
    };
    let session = cluster.session().await;
    let mut events = cluster
        .client(A)
        .chat_with(text_request(&session, "hold metrics 2"))
        .await
        .unwrap();
    read_until(&mut events, Duration::from_secs(10), is_text).await;
    // Asked of B, answered by A, which runs the turn.
    let status = cluster.client(B).session_status(&session).await.unwrap();
    assert!(status.live, "{status:?}");

    let a = scrape(&cluster.replica(A).metrics_addr).await;
    assert_eq!(series(&a, "agentrt_leases_held"), Some(1.0), "{a}");
    assert_eq!(series(&a, "agentrt_store_reachable"), Some(1.0), "{a}");
    assert_eq!(series(&a, "agentrt_store_writable"), Some(1.0), "{a}");
    assert_eq!(
        series(&a, &format!("db_client_connection_max{{{POOL}}}")),
        Some(4.0),
        "pool_size of the harness: {a}"
    );
    let connections = |state: &str| {
        series(
            &a,
            &format!("db_client_connection_count{{{POOL},db_client_connection_state=\"{state}\"}}"),
        )
        .unwrap_or_else(|| panic!("no {state} connection series in {a}"))
    };
    let open = connections("idle") + connections("used");
    assert!((1.0..=4.0).contains(&open), "{open} connections: {a}");
    assert_eq!(
        series(
            &a,
            &format!("db_client_connection_pending_requests{{{POOL}}}")
        ),
        Some(0.0),
        "{a}"
    );
    for reason in ["restart", "lease_expired", "lease_lost"] {
        assert_eq!(
            series(
                &a,
                &format!("agentrt_turns_interrupted_total{{agentrt_reason=\"{reason}\"}}")
            ),
            Some(0.0),
            "{reason}: {a}"
        );
    }
    let b = scrape(&cluster.replica(B).metrics_addr).await;
    assert!(
        series(&b, "agentrt_cluster_forwarded_total{outcome=\"ok\"}").is_some_and(|n| n >= 1.0),
        "{b}"
    );
    assert_eq!(series(&b, "agentrt_leases_held"), Some(0.0), "{b}");
    assert!(
        b.contains("agentrt_build_info{") && b.contains("process_resident_memory_bytes "),
        "{b}"
    );

    // A dies holding the lease; B's sweeper interrupts the turn once the
    // lease has expired.
    cluster.kill(A).await;
    drop(events);
    let deadline = Instant::now() + LEASE_TTL * 4 + Duration::from_secs(5);
    let interrupted = "agentrt_turns_interrupted_total{agentrt_reason=\"lease_expired\"}";
    loop {
        let b = scrape(&cluster.replica(B).metrics_addr).await;
        if series(&b, interrupted) == Some(1.0) {
            assert_eq!(
                series(
                    &b,
                    "agentrt_turns_total{agentrt_turn_outcome=\"interrupted\"}"
                ),
                Some(1.0),
                "{b}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "B never counted the swept turn: {b}"
        );
        tokio::time::sleep(LEASE_TTL / 4).await;
    }
}
