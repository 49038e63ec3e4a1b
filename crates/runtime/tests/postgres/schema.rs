//! Migrations: applied once, whoever connects first, however many at once.

use std::time::Duration;

use agentrt_runtime::store::Store;
use agentrt_testkit::pg;

async fn versions(url: &str) -> Vec<i32> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    let conn = tokio::spawn(conn);
    let rows = client
        .query(
            "SELECT version FROM schema_migrations ORDER BY version",
            &[],
        )
        .await
        .expect("read schema_migrations");
    drop(client);
    let _ = conn.await;
    rows.iter().map(|r| r.get(0)).collect()
}

#[tokio::test]
async fn connecting_again_applies_nothing_twice() {
    let Some(db) = pg::database().await else {
        return;
    };
    let ttl = Duration::from_secs(10);
    let first = super::store(&db, "a", ttl).await;
    let s = super::session(&first).await;
    let again = super::store(&db, "b", ttl).await;
    assert_eq!(versions(&db.url).await, [1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(
        again.get_session(&s.id).await.expect("get"),
        Some(s),
        "the second connect kept the data"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_starting_together_both_connect() {
    for _ in 0..3 {
        let Some(db) = pg::database().await else {
            return;
        };
        let connects: Vec<_> = (0..4)
            .map(|i| {
                let url = db.url.clone();
                tokio::spawn(async move {
                    let config = super::config(&url, &format!("r{i}"), Duration::from_secs(10));
                    agentrt_runtime::store::PostgresStore::connect(config).await
                })
            })
            .collect();
        for connect in connects {
            let store = connect
                .await
                .expect("task")
                .expect("every replica connects");
            assert_eq!(store.count_sessions().await.expect("count"), 0);
        }
        assert_eq!(versions(&db.url).await, [1, 2, 3, 4, 5, 6, 7, 8]);
    }
}
