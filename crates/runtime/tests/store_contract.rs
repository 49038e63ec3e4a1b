//! The store contract suite (`agentrt_testkit::contract`) against every
//! store of the core: every check is a test of each.

mod memory {
    use agentrt_runtime::store::MemoryStore;

    agentrt_testkit::store_contract_tests!(MemoryStore::new());
}

mod sled {
    use agentrt_runtime::store::SledStore;

    fn open_temp() -> (SledStore, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        (SledStore::open(dir.path().join("db")).expect("open"), dir)
    }

    agentrt_testkit::store_contract_tests!(guarded: open_temp());
}

/// On a fresh PostgreSQL database per test (`agentrt_testkit::pg`); each
/// test skips, saying so, when there is no PostgreSQL (and fails instead
/// under `CI=true`).
mod postgres {
    use std::time::Duration;

    use agentrt_runtime::store::{PgConfig, PgTls, PostgresStore};
    use agentrt_testkit::pg::{self, TestDb};

    async fn open() -> Option<(PostgresStore, TestDb)> {
        let db = pg::database().await?;
        let config = PgConfig {
            url: db.url.clone(),
            pool_size: 8,
            replica_id: "contract".to_owned(),
            address: "http://127.0.0.1:9".to_owned(),
            lease_ttl: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            tls: PgTls::default(),
        };
        let store = PostgresStore::connect(config).await.expect("connect");
        Some((store, db))
    }

    agentrt_testkit::store_contract_tests!(guarded: match open().await {
        Some(opened) => opened,
        None => return,
    });
}
