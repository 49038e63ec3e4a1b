//! The schema's versioned migrations, embedded in the binary and applied
//! by [`PostgresStore::connect`](super::PostgresStore::connect).
//!
//! Each migration is a numbered `.sql` file under `migrations/`, applied
//! once, in order, and recorded in `schema_migrations`. All pending ones run
//! in one transaction that first takes a transaction-scoped advisory lock,
//! so replicas starting together apply each exactly once (the others wait,
//! then find nothing to do) and a failed migration leaves nothing behind.
//! Migrations only add: a replica older than the schema keeps working
//! during a rolling upgrade (it says so in a warning).

use deadpool_postgres::Object;

use super::error::pg_error;
use crate::store::StoreError;

/// The migrations, in the order they apply: (version, SQL).
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("migrations/0001_initial.sql")),
    (2, include_str!("migrations/0002_quotas.sql")),
    (3, include_str!("migrations/0003_replicas.sql")),
    (4, include_str!("migrations/0004_turn_listing.sql")),
    (5, include_str!("migrations/0005_budgets.sql")),
    (6, include_str!("migrations/0006_inbox.sql")),
    (7, include_str!("migrations/0007_daily_spent.sql")),
    (8, include_str!("migrations/0008_agents.sql")),
];

/// The advisory lock key held while migrating ("agentrt\0" as a number).
const MIGRATION_LOCK: i64 = 0x6167_656e_7472_7400;

/// Applies the migrations `client`'s database lacks; the versions applied.
pub(super) async fn migrate(client: &mut Object) -> Result<Vec<i32>, StoreError> {
    let tx = client
        .transaction()
        .await
        .map_err(|e| pg_error("begin migration", &e))?;
    // Another replica may be migrating: wait for it however long it takes
    // (the connection's lock_timeout is for session rows).
    // `CREATE TABLE IF NOT EXISTS` of an existing table sends a NOTICE that
    // looks like an error in the log on every start: warnings and up only.
    tx.batch_execute("SET LOCAL lock_timeout = 0; SET LOCAL client_min_messages = warning")
        .await
        .map_err(|e| pg_error("begin migration", &e))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(|e| pg_error("take the migration lock", &e))?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version    integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await
    .map_err(|e| pg_error("create schema_migrations", &e))?;
    let done: Vec<i32> = tx
        .query("SELECT version FROM schema_migrations", &[])
        .await
        .map_err(|e| pg_error("read schema_migrations", &e))?
        .iter()
        .map(|row| row.try_get::<_, i32>(0))
        .collect::<Result<_, _>>()
        .map_err(|e| pg_error("read schema_migrations", &e))?;
    let mut applied = Vec::new();
    for &(version, sql) in MIGRATIONS {
        if done.contains(&version) {
            continue;
        }
        tx.batch_execute(sql)
            .await
            .map_err(|e| pg_error(&format!("apply migration {version}"), &e))?;
        tx.execute(
            "INSERT INTO schema_migrations (version) VALUES ($1)",
            &[&version],
        )
        .await
        .map_err(|e| pg_error(&format!("record migration {version}"), &e))?;
        applied.push(version);
    }
    tx.commit()
        .await
        .map_err(|e| pg_error("commit migrations", &e))?;
    let known = MIGRATIONS.last().map_or(0, |&(v, _)| v);
    if let Some(newest) = done.iter().copied().max().filter(|&v| v > known) {
        tracing::warn!(
            schema_version = newest,
            known_version = known,
            "the database schema is newer than this binary; continuing (migrations only add)"
        );
    }
    Ok(applied)
}
