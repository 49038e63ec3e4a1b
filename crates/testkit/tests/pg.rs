//! The PostgreSQL harness starts a server and hands out separate databases.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_databases_are_separate_and_usable() {
    let Some(a) = agentrt_testkit::pg::database().await else {
        return;
    };
    let b = agentrt_testkit::pg::database()
        .await
        .expect("the second database on the same server");
    assert_ne!(a.name, b.name);
    for (db, value) in [(&a, 1_i32), (&b, 2)] {
        let (client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        let task = tokio::spawn(conn);
        client
            .batch_execute(&format!(
                "CREATE TABLE t (v int); INSERT INTO t VALUES ({value})"
            ))
            .await
            .expect("create a table");
        let row = client
            .query_one("SELECT v FROM t", &[])
            .await
            .expect("read");
        assert_eq!(row.get::<_, i32>(0), value);
        drop(client);
        let _ = task.await;
    }
}
