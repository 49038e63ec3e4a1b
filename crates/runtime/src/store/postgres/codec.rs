//! Rows to domain values and back: the one place that knows the column
//! layout of `migrations/*.sql`.
//!
//! Sessions are columns (so they can be indexed, filtered and read by
//! people); messages and turn records are the record encoding of `store/record.rs`
//! (a version byte, then serde_json) in a `bytea`, next to the columns the
//! queries use. A value that does not decode is [`StoreError::Corrupt`],
//! never a panic.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_postgres::GenericClient;
use serde::de::DeserializeOwned;
use tokio_postgres::types::{FromSql, Json, ToSql};
use tokio_postgres::{Row, Statement};

use super::error::pg_error;
use crate::agents::AgentBinding;
use crate::store::record;
use crate::store::{Lease, StoreError};
use crate::types::{Budget, LastTurn, Message, Session, Spent, TurnRecord, TurnStatus};

/// The session columns, in the order [`SessionParams::all`] binds them
/// (a macro so statements can `concat!` it into one literal).
macro_rules! session_cols {
    () => {
        "id, owner, agent_id, project_id, title, model, system_prompt, metadata, \
         created_at_ns, last_active_ns, archived, last_turn, message_count, next_seq, \
         compacted_through, summary_seq, incarnation, budget, spent, agent"
    };
}
pub(super) use session_cols;

/// [`session_cols`] plus the lease, and whether it is live on the
/// database's clock (read by [`locked`]).
macro_rules! locked_cols {
    () => {
        concat!(
            $crate::store::postgres::codec::session_cols!(),
            ", lease_replica, lease_address, lease_turn, lease_expires, \
             lease_expires > clock_timestamp() AS lease_live"
        )
    };
}
pub(super) use locked_cols;

/// The update [`SessionParams::mutable`] binds ($1..$15); a lease clause
/// and the `WHERE` follow (see `write.rs`).
macro_rules! update_session {
    () => {
        "UPDATE sessions SET title = $2, model = $3, system_prompt = $4, metadata = $5, \
         last_active_ns = $6, archived = $7, last_turn = $8, message_count = $9, \
         next_seq = $10, compacted_through = $11, summary_seq = $12, budget = $13, \
         spent = $14, agent = $15"
    };
}
pub(super) use update_session;

/// One row's columns, read with errors that name the row.
struct Columns<'a> {
    row: &'a Row,
    key: String,
}

impl<'a> Columns<'a> {
    fn get<T: FromSql<'a>>(&self, name: &str) -> Result<T, StoreError> {
        self.row
            .try_get(name)
            .map_err(|e| self.corrupt(format!("column {name}: {e}")))
    }

    fn count(&self, name: &str) -> Result<u64, StoreError> {
        let value: i64 = self.get(name)?;
        u64::try_from(value).map_err(|_| self.corrupt(format!("column {name} is negative")))
    }

    fn time(&self, name: &str) -> Result<SystemTime, StoreError> {
        Ok(from_nanos(self.get(name)?))
    }

    fn corrupt(&self, reason: String) -> StoreError {
        StoreError::Corrupt {
            key: self.key.clone(),
            reason,
        }
    }
}

/// A session row (the [`session_cols`], in any query that selects them).
pub(super) fn session(row: &Row) -> Result<Session, StoreError> {
    let id: String = row.try_get("id").map_err(|e| StoreError::Corrupt {
        key: "sessions/?".to_owned(),
        reason: format!("column id: {e}"),
    })?;
    let c = Columns {
        row,
        key: format!("sessions/{}", id.escape_debug()),
    };
    let metadata: Json<BTreeMap<String, String>> = c.get("metadata")?;
    let last_turn: Option<Json<LastTurn>> = c.get("last_turn")?;
    let budget: Json<Budget> = c.get("budget")?;
    let spent: Json<Spent> = c.get("spent")?;
    let agent: Json<AgentBinding> = c.get("agent")?;
    Ok(Session {
        owner: c.get("owner")?,
        agent_id: c.get("agent_id")?,
        project_id: c.get("project_id")?,
        title: c.get("title")?,
        model: c.get("model")?,
        system_prompt: c.get("system_prompt")?,
        metadata: metadata.0,
        created_at: c.time("created_at_ns")?,
        last_active_at: c.time("last_active_ns")?,
        archived: c.get("archived")?,
        last_turn: last_turn.map(|t| t.0),
        message_count: c.count("message_count")?,
        next_seq: c.count("next_seq")?,
        compacted_through: c.count("compacted_through")?,
        summary_seq: c.count("summary_seq")?,
        incarnation: c.get("incarnation")?,
        budget: budget.0,
        spent: spent.0,
        agent: agent.0,
        id,
    })
}

/// A session row locked for a write, with its lease.
#[derive(Debug)]
pub(super) struct Locked {
    pub(super) session: Session,
    /// The lease, live or lapsed, when a turn holds one.
    pub(super) lease: Option<HeldLease>,
}

/// A lease as stored, and whether it was live when the row was locked.
#[derive(Debug)]
pub(super) struct HeldLease {
    pub(super) lease: Lease,
    /// `lease_expires > clock_timestamp()` on the database.
    pub(super) live: bool,
}

/// A row of [`locked_cols`].
pub(super) fn locked(row: &Row) -> Result<Locked, StoreError> {
    let session = session(row)?;
    let c = Columns {
        row,
        key: format!("sessions/{}", session.id.escape_debug()),
    };
    let turn: Option<String> = c.get("lease_turn")?;
    let lease = match turn {
        None => None,
        Some(turn_id) => Some(HeldLease {
            lease: Lease {
                replica_id: c.get("lease_replica")?,
                address: c.get("lease_address")?,
                turn_id,
                expires_at: c.get("lease_expires")?,
            },
            live: c.get::<Option<bool>>("lease_live")?.unwrap_or(false),
        }),
    };
    Ok(Locked { session, lease })
}

/// A lease row: `lease_replica, lease_address, lease_turn, lease_expires`.
pub(super) fn lease(session_id: &str, row: &Row) -> Result<Lease, StoreError> {
    let c = Columns {
        row,
        key: format!("sessions/{}", session_id.escape_debug()),
    };
    Ok(Lease {
        replica_id: c.get("lease_replica")?,
        address: c.get("lease_address")?,
        turn_id: c.get("lease_turn")?,
        expires_at: c.get("lease_expires")?,
    })
}

/// A message row (`seq, record`).
pub(super) fn message(session_id: &str, row: &Row) -> Result<Message, StoreError> {
    let seq: i64 = row.try_get("seq").map_err(|e| StoreError::Corrupt {
        key: format!("messages/{}", session_id.escape_debug()),
        reason: format!("column seq: {e}"),
    })?;
    let c = Columns {
        row,
        key: format!("messages/{}/{seq}", session_id.escape_debug()),
    };
    let message: Message = decode(&c, c.get("record")?)?;
    if i64::try_from(message.seq).ok() != Some(seq) {
        return Err(c.corrupt(format!("the record is seq {}", message.seq)));
    }
    Ok(message)
}

/// A turn row (`turn_id, record`).
pub(super) fn turn(session_id: &str, row: &Row) -> Result<TurnRecord, StoreError> {
    let c = Columns {
        row,
        key: format!("turns/{}", session_id.escape_debug()),
    };
    let turn_id: String = c.get("turn_id")?;
    let c = Columns {
        key: format!("{}/{}", c.key, turn_id.escape_debug()),
        ..c
    };
    decode(&c, c.get("record")?)
}

fn decode<T: DeserializeOwned>(c: &Columns<'_>, raw: &[u8]) -> Result<T, StoreError> {
    record::decode(raw).map_err(|reason| c.corrupt(reason))
}

/// The `status` column of a turn.
pub(super) fn status(status: TurnStatus) -> &'static str {
    match status {
        TurnStatus::Running => "running",
        TurnStatus::Success => "success",
        TurnStatus::Error => "error",
        TurnStatus::Canceled => "canceled",
        TurnStatus::TimedOut => "timed_out",
        TurnStatus::Interrupted => "interrupted",
        TurnStatus::BudgetExceeded => "budget_exceeded",
        TurnStatus::Paused => "paused",
    }
}

/// Nanoseconds since the epoch (negative before it), or an error past the
/// year 2262 — bigint's range.
pub(crate) fn nanos(at: SystemTime) -> Result<i64, StoreError> {
    let out_of_range = || StoreError::Backend(format!("time {at:?} is out of range"));
    match at.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_nanos()).map_err(|_| out_of_range()),
        Err(before) => i64::try_from(before.duration().as_nanos())
            .map(|n| -n)
            .map_err(|_| out_of_range()),
    }
}

pub(crate) fn from_nanos(nanos: i64) -> SystemTime {
    let magnitude = Duration::from_nanos(nanos.unsigned_abs());
    if nanos >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

/// A count or seq as bigint.
pub(super) fn big(value: u64) -> Result<i64, StoreError> {
    i64::try_from(value)
        .map_err(|_| StoreError::Backend(format!("{value} is beyond PostgreSQL's bigint")))
}

/// PostgreSQL's `text` cannot hold NUL; refuse it with a clear message
/// instead of the server's encoding error.
pub(super) fn check_text<'a>(
    what: &str,
    values: impl IntoIterator<Item = &'a str>,
) -> Result<(), StoreError> {
    if values.into_iter().any(|v| v.contains('\0')) {
        return Err(StoreError::Backend(format!(
            "{what} must not contain NUL characters"
        )));
    }
    Ok(())
}

/// Refuses sessions with a field PostgreSQL cannot store.
pub(super) fn check_session(s: &Session) -> Result<(), StoreError> {
    let fields = [
        &s.id,
        &s.owner,
        &s.agent_id,
        &s.project_id,
        &s.title,
        &s.model,
        &s.system_prompt,
        &s.incarnation,
    ];
    let metadata = s.metadata.iter().flat_map(|(k, v)| [k, v]);
    check_text(
        "session fields",
        fields.into_iter().chain(metadata).map(String::as_str),
    )
}

/// A session's values as statement parameters.
pub(super) struct SessionParams<'a> {
    s: &'a Session,
    metadata: Json<&'a BTreeMap<String, String>>,
    created_at_ns: i64,
    last_active_ns: i64,
    last_turn: Option<Json<&'a LastTurn>>,
    message_count: i64,
    next_seq: i64,
    compacted_through: i64,
    summary_seq: i64,
    budget: Json<&'a Budget>,
    spent: Json<&'a Spent>,
    agent: Json<&'a AgentBinding>,
}

impl<'a> SessionParams<'a> {
    pub(super) fn new(s: &'a Session) -> Result<Self, StoreError> {
        check_session(s)?;
        Ok(Self {
            s,
            metadata: Json(&s.metadata),
            created_at_ns: nanos(s.created_at)?,
            last_active_ns: nanos(s.last_active_at)?,
            last_turn: s.last_turn.as_ref().map(Json),
            message_count: big(s.message_count)?,
            next_seq: big(s.next_seq)?,
            compacted_through: big(s.compacted_through)?,
            summary_seq: big(s.summary_seq)?,
            budget: Json(&s.budget),
            spent: Json(&s.spent),
            agent: Json(&s.agent),
        })
    }

    /// Every column of [`session_cols`], in order ($1..$20).
    pub(super) fn all(&self) -> [&(dyn ToSql + Sync); 20] {
        let s = self.s;
        [
            &s.id,
            &s.owner,
            &s.agent_id,
            &s.project_id,
            &s.title,
            &s.model,
            &s.system_prompt,
            &self.metadata,
            &self.created_at_ns,
            &self.last_active_ns,
            &s.archived,
            &self.last_turn,
            &self.message_count,
            &self.next_seq,
            &self.compacted_through,
            &self.summary_seq,
            &s.incarnation,
            &self.budget,
            &self.spent,
            &self.agent,
        ]
    }

    /// The id and the columns a write may change, for [`update_session`]
    /// ($1..$14).
    pub(super) fn mutable(&self) -> [&(dyn ToSql + Sync); 15] {
        let s = self.s;
        [
            &s.id,
            &s.title,
            &s.model,
            &s.system_prompt,
            &self.metadata,
            &self.last_active_ns,
            &s.archived,
            &self.last_turn,
            &self.message_count,
            &self.next_seq,
            &self.compacted_through,
            &self.summary_seq,
            &self.budget,
            &self.spent,
            &self.agent,
        ]
    }
}

/// `sql` prepared on `client` (once per connection: the statement cache).
async fn prepared<C: GenericClient>(client: &C, sql: &str) -> Result<Statement, StoreError> {
    client
        .prepare_cached(sql)
        .await
        .map_err(|e| pg_error("prepare", &e))
}

/// Runs `sql` (prepared once per connection) and returns its rows.
pub(super) async fn rows<C: GenericClient>(
    client: &C,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, StoreError> {
    let statement = prepared(client, sql).await?;
    client
        .query(&statement, params)
        .await
        .map_err(|e| pg_error("query", &e))
}

/// [`rows`] for at most one row.
pub(super) async fn row<C: GenericClient>(
    client: &C,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Option<Row>, StoreError> {
    let statement = prepared(client, sql).await?;
    client
        .query_opt(&statement, params)
        .await
        .map_err(|e| pg_error("query", &e))
}

/// Runs a statement; the number of rows it changed.
pub(super) async fn execute<C: GenericClient>(
    client: &C,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64, StoreError> {
    let statement = prepared(client, sql).await?;
    client
        .execute(&statement, params)
        .await
        .map_err(|e| pg_error("execute", &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_to_the_nanosecond() {
        for at in [
            UNIX_EPOCH,
            UNIX_EPOCH + Duration::new(1_764_000_000, 123_456_789),
            UNIX_EPOCH - Duration::new(5, 1),
        ] {
            assert_eq!(from_nanos(nanos(at).expect("in range")), at);
        }
        let far = UNIX_EPOCH + Duration::from_secs(400 * 365 * 86_400);
        assert!(matches!(nanos(far), Err(StoreError::Backend(_))));
    }

    #[test]
    fn nul_is_refused_by_name() {
        let err = check_text("session fields", ["ok", "a\0b"]).expect_err("NUL");
        assert!(err.to_string().contains("NUL"), "{err}");
        assert!(check_text("x", ["fine ✓"]).is_ok());
    }
}
