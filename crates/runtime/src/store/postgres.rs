//! The shared [`Store`]: PostgreSQL, for several replicas on one database.
//!
//! Same contract as the sled store (the store contract suite runs against
//! it unchanged, `crates/runtime/tests/store_contract.rs`), with the domain
//! rules of `types/session.rs` deciding what each write does to a record;
//! this module adds what sharing needs: every mutation is one transaction
//! on the session's locked row (`SELECT … FOR UPDATE`), acknowledged only
//! after `COMMIT`, and each session carries a **lease** naming the replica
//! that runs its live turn.
//!
//! Leases, on the database's clock only (`clock_timestamp()`; no replica's
//! clock is ever compared with another's):
//! - [`Store::begin_turn`] takes the lease with the user message, or fails
//!   with [`StoreError::Busy`] while another replica's lease is live; the
//!   turn of a lapsed lease is interrupted first, in the same transaction
//!   (so is a turn this replica's own lease outlived: within one replica
//!   the runtime's session slots already admit one turn at a time).
//! - A turn's writes (messages and compactions naming a turn of the
//!   session, its final record) go through only while this replica holds
//!   the turn's live lease, else [`StoreError::LeaseLost`] and nothing is
//!   written. The final record releases the lease.
//! - The owner extends its leases ([`Store::renew_leases`]); any replica
//!   sweeps lapsed ones ([`Store::sweep_expired_leases`]).
//!
//! `docs/postgres.md` documents the schema, indexes, migrations and the
//! lease protocol. Connections use TLS as libpq's `sslmode` says
//! ([`PgTls`], or `sslmode=` / `sslrootcert=` in the URL; `prefer` by
//! default), over rustls: see `tls`.
//!
//! Submodules: `schema` (embedded migrations), `codec` (rows ↔ values),
//! `error` (failures → [`StoreError`], password-free names), `tls` (the
//! TLS modes and the connector), `write` (the locked-row write steps),
//! `sessions`, `history`, `turns`, `leases` (the [`Store`] methods, by
//! topic).

use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{
    Hook, HookError, Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime,
};

use super::{
    CreateOutcome, HistoryQuery, Lease, LeaseCursor, LeaseKey, Leases, ListQuery, ListedLease,
    MessagePage, SessionPage, Store, StoreError,
};
use crate::quota::WriteQuota;
use crate::types::{Message, NewMessage, NewSession, Session, SessionUpdate, TurnRecord};

mod agents;
mod cluster;
pub(crate) mod codec;
mod error;
mod history;
mod inbox;
mod leases;
mod offboard;
mod quota;
mod schema;
mod sessions;
mod tls;
mod turns;
mod write;

pub use tls::{PgSslMode, PgTls};

/// How long sent data may stay unacknowledged before the connection is
/// given up (`TCP_USER_TIMEOUT`).
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(20);

/// What every connection sets first. A transaction that holds a session's
/// row lock and then goes silent (its replica stalled or cut off) is ended
/// by the server after the lease time, releasing the lock, and a statement
/// waits at most that long for a row lock (then `Unavailable`): a stuck
/// replica cannot block a session's other writers for longer than it could
/// hold the session's lease. Never below a second.
fn session_settings(lease_ttl: Duration) -> String {
    let ms = lease_ttl.as_millis().max(1_000);
    format!("SET idle_in_transaction_session_timeout = {ms}; SET lock_timeout = {ms}")
}

/// How a [`PostgresStore`] reaches its database and what it writes into
/// the leases it takes.
#[derive(Clone)]
pub struct PgConfig {
    /// `postgresql://user:password@host:port/dbname` (or the key=value
    /// form). Secret: it is never logged, and messages name the database
    /// without its password.
    pub url: String,
    /// Most connections open at once (at least 1).
    pub pool_size: usize,
    /// This replica's id, written into the leases it takes (unique per
    /// running process).
    pub replica_id: String,
    /// Where other replicas reach this one's internal service, written
    /// into its leases.
    pub address: String,
    /// How long a lease lasts unless renewed (its owner renews it every
    /// third of this).
    pub lease_ttl: Duration,
    /// Bounds connecting, waiting for a pooled connection, and [`Store::ping`].
    pub connect_timeout: Duration,
    /// TLS to the database, beside what the URL's `sslmode` and
    /// `sslrootcert` say. Default: the URL's, else `prefer`.
    pub tls: PgTls,
}

// The URL holds the password.
impl std::fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConfig")
            .field("url", &"<redacted>")
            .field("pool_size", &self.pool_size)
            .field("replica_id", &self.replica_id)
            .field("address", &self.address)
            .field("lease_ttl", &self.lease_ttl)
            .field("connect_timeout", &self.connect_timeout)
            .field("tls", &self.tls)
            .finish()
    }
}

/// The PostgreSQL-backed [`Store`]. Cloning is cheap and shares the pool.
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    /// `user@host:port/db`, for messages (no password).
    target: String,
    replica_id: String,
    address: String,
    /// The lease time in microseconds, as the lease statements bind it.
    lease_ttl_us: i64,
    connect_timeout: Duration,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("database", &self.target)
            .field("replica_id", &self.replica_id)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects (within `connect_timeout`) and brings the schema up to date
    /// (see `docs/postgres.md`). An unreachable database is
    /// [`StoreError::Unavailable`]; a bad URL or setting, a refused login or
    /// a failed migration is [`StoreError::Backend`]. No message holds the
    /// URL's password.
    pub async fn connect(config: PgConfig) -> Result<Self, StoreError> {
        let invalid =
            |why: &str| StoreError::Backend(format!("invalid PostgreSQL settings: {why}"));
        if config.pool_size == 0 {
            return Err(invalid("pool_size must be at least 1"));
        }
        if config.replica_id.is_empty() || config.address.is_empty() {
            return Err(invalid("the replica id and address must not be empty"));
        }
        codec::check_text(
            "the replica id and address",
            [config.replica_id.as_str(), config.address.as_str()],
        )?;
        let lease_ttl_us = i64::try_from(config.lease_ttl.as_micros())
            .ok()
            .filter(|&us| us >= 1_000)
            .ok_or_else(|| invalid("lease_ttl must be between 1 ms and 290,000 years"))?;
        if config.connect_timeout.is_zero() {
            return Err(invalid("connect_timeout must not be zero"));
        }
        let prepared = tls::prepare(&config.url, &config.tls).map_err(|why| invalid(&why))?;
        // The parser's messages (the cause; its own text is only "invalid
        // connection string") name the offending option, never its value.
        let mut pg: tokio_postgres::Config = prepared.url.parse().map_err(|e| {
            let cause = std::error::Error::source(&e)
                .map(|cause| format!(": {cause}"))
                .unwrap_or_default();
            StoreError::Backend(format!("the PostgreSQL URL is invalid: {e}{cause}"))
        })?;
        // A database that goes silent mid-statement (a partition, no RST)
        // is found by TCP keepalive within about 25 s, and unacknowledged
        // writes give up after `TCP_USER_TIMEOUT`, instead of waiting out
        // the kernel's defaults (hours).
        pg.connect_timeout(config.connect_timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3)
            .tcp_user_timeout(TCP_USER_TIMEOUT)
            .application_name("agentrt")
            .ssl_mode(match prepared.mode {
                PgSslMode::Disable => tokio_postgres::config::SslMode::Disable,
                PgSslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
                PgSslMode::Require | PgSslMode::VerifyCa | PgSslMode::VerifyFull => {
                    tokio_postgres::config::SslMode::Require
                }
            });
        let target = error::describe(&pg);
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match prepared.connector {
            Some(connector) => Manager::from_config(pg, connector, manager_config),
            None => Manager::from_config(pg, tokio_postgres::NoTls, manager_config),
        };
        let session_settings = session_settings(config.lease_ttl);
        let pool = Pool::builder(manager)
            .post_create(Hook::async_fn(move |client, _| {
                let sql = session_settings.clone();
                Box::pin(
                    async move { client.batch_execute(&sql).await.map_err(HookError::Backend) },
                )
            }))
            .max_size(config.pool_size)
            .wait_timeout(Some(config.connect_timeout))
            .create_timeout(Some(config.connect_timeout))
            .recycle_timeout(Some(config.connect_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| invalid(&format!("connection pool: {e}")))?;
        pool_gauges(&pool);
        let store = Self {
            pool,
            target,
            replica_id: config.replica_id,
            address: config.address,
            lease_ttl_us,
            connect_timeout: config.connect_timeout,
        };
        let mut client = store
            .client()
            .await
            .map_err(|e| error::tls_hint(e, prepared.mode))?;
        let applied = schema::migrate(&mut client).await?;
        if !applied.is_empty() {
            tracing::info!(database = %store.target, versions = ?applied, "applied schema migrations");
        }
        Ok(store)
    }

    /// A pooled connection, or [`StoreError::Unavailable`] within the
    /// connect timeout.
    async fn client(&self) -> Result<Object, StoreError> {
        self.pool
            .get()
            .await
            .map_err(|e| error::pool_error(&self.target, e))
    }
}

/// The pool's gauges, read when metrics are collected, per the database
/// client conventions (pool name `store`): `db.client.connection.count` by
/// `db.client.connection.state` (`idle`, `used`), `db.client.connection.max`
/// (`pool_size`) and `db.client.connection.pending_requests` (calls
/// waiting for a connection). A weak reference: a dropped store reports
/// nothing.
fn pool_gauges(pool: &Pool) {
    use crate::telemetry::semconv::{DB_CLIENT_CONNECTION_POOL_NAME, DB_CLIENT_CONNECTION_STATE};
    use opentelemetry::KeyValue;

    let meter = opentelemetry::global::meter(crate::telemetry::metrics::METER);
    let name = || KeyValue::new(DB_CLIENT_CONNECTION_POOL_NAME, "store");
    let to_i64 = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let weak = pool.weak();
    let _count = meter
        .i64_observable_up_down_counter("db.client.connection.count")
        .with_unit("{connection}")
        .with_description("Connections to PostgreSQL in the pool, by state")
        .with_callback(move |observer| {
            if let Some(pool) = weak.upgrade() {
                let status = pool.status();
                let idle = status.available.min(status.size);
                for (state, n) in [("idle", idle), ("used", status.size - idle)] {
                    observer.observe(
                        to_i64(n),
                        &[name(), KeyValue::new(DB_CLIENT_CONNECTION_STATE, state)],
                    );
                }
            }
        })
        .build();
    let weak = pool.weak();
    let _max = meter
        .i64_observable_up_down_counter("db.client.connection.max")
        .with_unit("{connection}")
        .with_description("Most connections the pool opens (pool_size)")
        .with_callback(move |observer| {
            if let Some(pool) = weak.upgrade() {
                observer.observe(to_i64(pool.status().max_size), &[name()]);
            }
        })
        .build();
    let weak = pool.weak();
    let _pending = meter
        .i64_observable_up_down_counter("db.client.connection.pending_requests")
        .with_unit("{request}")
        .with_description("Calls waiting for a pooled connection")
        .with_callback(move |observer| {
            if let Some(pool) = weak.upgrade() {
                observer.observe(to_i64(pool.status().waiting), &[name()]);
            }
        })
        .build();
}

#[async_trait]
impl Store for PostgresStore {
    async fn create_session(&self, new: NewSession) -> Result<CreateOutcome, StoreError> {
        self.create(new, &WriteQuota::default()).await
    }

    async fn create_session_within(
        &self,
        new: NewSession,
        quota: &WriteQuota,
    ) -> Result<CreateOutcome, StoreError> {
        self.create(new, quota).await
    }

    async fn get_session(&self, id: &str) -> Result<Option<Session>, StoreError> {
        self.get(id).await
    }

    async fn list_sessions(
        &self,
        owner: &str,
        query: &ListQuery,
    ) -> Result<SessionPage, StoreError> {
        self.list(owner, query).await
    }

    async fn update_session(&self, id: &str, update: SessionUpdate) -> Result<Session, StoreError> {
        self.update(id, update).await
    }

    async fn delete_session(
        &self,
        id: &str,
        incarnation: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.delete(id, incarnation).await
    }

    async fn begin_turn(
        &self,
        turn: TurnRecord,
        user_message: NewMessage,
    ) -> Result<Message, StoreError> {
        self.begin(turn, user_message, &WriteQuota::default()).await
    }

    async fn begin_turn_within(
        &self,
        turn: TurnRecord,
        user_message: NewMessage,
        quota: &WriteQuota,
    ) -> Result<Message, StoreError> {
        self.begin(turn, user_message, quota).await
    }

    async fn append_message(
        &self,
        session_id: &str,
        incarnation: &str,
        message: NewMessage,
    ) -> Result<Message, StoreError> {
        self.append(session_id, incarnation, message).await
    }

    async fn finish_turn(&self, turn: TurnRecord) -> Result<(), StoreError> {
        self.finish(turn, None).await.map(drop)
    }

    async fn finish_turn_with(
        &self,
        turn: TurnRecord,
        last: Option<NewMessage>,
    ) -> Result<Option<Message>, StoreError> {
        self.finish(turn, last).await
    }

    async fn get_turn(
        &self,
        session_id: &str,
        turn_id: &str,
    ) -> Result<Option<TurnRecord>, StoreError> {
        self.turn(session_id, turn_id).await
    }

    async fn list_turns(
        &self,
        session_id: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<TurnRecord>, StoreError> {
        self.turns_before(session_id, before, limit).await
    }

    async fn count_turns(&self, session_id: &str) -> Result<u64, StoreError> {
        self.turn_count(session_id).await
    }

    async fn find_turn_by_request(
        &self,
        session_id: &str,
        request_id: &str,
    ) -> Result<Option<TurnRecord>, StoreError> {
        self.turn_by_request(session_id, request_id).await
    }

    async fn history_page(
        &self,
        session_id: &str,
        query: &HistoryQuery,
    ) -> Result<MessagePage, StoreError> {
        self.page(session_id, query).await
    }

    async fn store_compaction(
        &self,
        session_id: &str,
        incarnation: &str,
        summary: NewMessage,
        through_seq: u64,
    ) -> Result<Message, StoreError> {
        self.compaction(session_id, incarnation, summary, through_seq)
            .await
    }

    async fn set_title_if_empty(
        &self,
        session_id: &str,
        incarnation: &str,
        title: &str,
    ) -> Result<bool, StoreError> {
        self.title_if_empty(session_id, incarnation, title).await
    }

    /// On a shared database: interrupts the running turns no live replica
    /// owns — lapsed leases, turns without the lease, and turns leased to
    /// this replica id (a previous process under the same id: this is
    /// called at start-up, before this process runs any turn). Another
    /// replica's live turn is never touched. Their open tool calls are
    /// answered in the same transaction.
    async fn update_turn(&self, turn: TurnRecord) -> Result<(), StoreError> {
        self.put_running(turn).await
    }

    async fn resume_turn(
        &self,
        session_id: &str,
        incarnation: &str,
        turn_id: &str,
    ) -> Result<TurnRecord, StoreError> {
        self.resume(session_id, incarnation, turn_id).await
    }

    async fn expired_pauses(
        &self,
        now: std::time::SystemTime,
        limit: usize,
    ) -> Result<Vec<TurnRecord>, StoreError> {
        self.expired(now, limit).await
    }

    async fn daily_spent(
        &self,
        owner: &str,
        day: u64,
    ) -> Result<crate::quota::DailySpent, StoreError> {
        turns::daily_spent(&self.client().await?, owner, day).await
    }

    async fn recover_interrupted(&self) -> Result<Vec<TurnRecord>, StoreError> {
        self.recover().await
    }

    async fn count_sessions(&self) -> Result<u64, StoreError> {
        self.count().await
    }

    async fn sessions_of_agent(
        &self,
        agent_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<super::AgentSessions, StoreError> {
        self.of_agent(agent_id, after, limit).await
    }

    async fn forget_owner(&self, owner: &str) -> Result<(), StoreError> {
        self.forget(owner).await
    }

    /// Nothing to do: every `Ok` came after its `COMMIT`, which PostgreSQL
    /// makes durable (`synchronous_commit` on).
    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn leases(&self) -> Option<&dyn Leases> {
        Some(self)
    }

    fn inbox(&self) -> &dyn crate::store::Inbox {
        self
    }

    fn agents(&self) -> &dyn crate::store::AgentStore {
        self
    }

    fn cluster(&self) -> Option<&dyn super::cluster::Cluster> {
        Some(self)
    }

    /// `SELECT 1` within the connect timeout.
    async fn ping(&self) -> Result<(), StoreError> {
        let probe = async {
            let client = self.client().await?;
            codec::row(&client, "SELECT 1", &[]).await.map(drop)
        };
        match tokio::time::timeout(self.connect_timeout, probe).await {
            Ok(answer) => answer,
            Err(_) => Err(StoreError::Unavailable(format!(
                "PostgreSQL at {} did not answer within {:?}",
                self.target, self.connect_timeout
            ))),
        }
    }
}

#[async_trait]
impl Leases for PostgresStore {
    fn replica_id(&self) -> &str {
        &self.replica_id
    }

    async fn lease(&self, session_id: &str) -> Result<Option<Lease>, StoreError> {
        self.live_lease(session_id).await
    }

    async fn leases_of(&self, session_ids: &[String]) -> Result<Vec<(String, Lease)>, StoreError> {
        self.live_leases(session_ids).await
    }

    async fn renew_leases(&self, turns: &[LeaseKey]) -> Result<Vec<String>, StoreError> {
        self.renew(turns).await
    }

    async fn sweep_expired_leases(&self) -> Result<Vec<TurnRecord>, StoreError> {
        self.sweep().await
    }

    async fn list_leases(
        &self,
        after: Option<&LeaseCursor>,
        limit: usize,
    ) -> Result<Vec<ListedLease>, StoreError> {
        self.listed_leases(after, limit).await
    }
}
