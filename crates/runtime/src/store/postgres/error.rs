//! How PostgreSQL's failures become [`StoreError`]s, and how the database
//! is named in messages — never with its password.
//!
//! The database cannot be reached (pool timeout, refused or dropped
//! connection, server shutting down) → [`StoreError::Unavailable`]: nothing
//! was written and the call may be retried. The server refused a statement
//! → [`StoreError::Backend`] with its message and SQLSTATE. Rows that do not
//! decode are [`StoreError::Corrupt`] (see `codec.rs`).

use deadpool_postgres::{PoolError, TimeoutType};
use tokio_postgres::config::Host;
use tokio_postgres::error::SqlState;

use crate::store::StoreError;

/// `user@host:port/dbname` of `config`: enough to find the database, and
/// no password (the URL's password never leaves [`tokio_postgres::Config`]).
pub(super) fn describe(config: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let host = match host {
                Host::Tcp(name) => name.clone(),
                Host::Unix(path) => path.display().to_string(),
            };
            match config.get_ports().get(i).or(config.get_ports().first()) {
                Some(port) => format!("{host}:{port}"),
                None => host,
            }
        })
        .collect();
    let user = config
        .get_user()
        .map(|u| format!("{u}@"))
        .unwrap_or_default();
    let db = config.get_dbname().unwrap_or("");
    format!("{user}{}/{db}", hosts.join(","))
}

/// A failed statement or connection; `what` says what was being done.
pub(super) fn pg_error(what: &str, e: &tokio_postgres::Error) -> StoreError {
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        let text = format!(
            "postgres {what}: {} (SQLSTATE {})",
            db.message(),
            code.code()
        );
        return if *code == SqlState::DISK_FULL {
            StoreError::DiskFull(text)
        } else if not_now(code) {
            StoreError::Unavailable(text)
        } else {
            StoreError::Backend(text)
        };
    }
    let source = std::error::Error::source(e);
    let transport = e.is_closed()
        || source.is_some_and(|s| s.is::<std::io::Error>())
        || e.to_string().starts_with("timeout")
        || e.to_string().starts_with("error connecting");
    // tokio-postgres's own text is only the kind ("error performing TLS
    // handshake"); the cause says what happened (refused, a certificate
    // that does not verify). Neither holds the password.
    let text = match source {
        Some(cause) => format!("postgres {what}: {e}: {cause}"),
        None => format!("postgres {what}: {e}"),
    };
    if transport {
        StoreError::Unavailable(text)
    } else {
        StoreError::Backend(text)
    }
}

/// The first connection's failure, with a hint when TLS is off and the
/// server refused the login (SQLSTATE 28000: no `pg_hba.conf` line takes
/// it, as when the server accepts TLS connections only).
pub(super) fn tls_hint(e: StoreError, mode: super::PgSslMode) -> StoreError {
    match e {
        StoreError::Backend(why)
            if mode == super::PgSslMode::Disable && why.ends_with("(SQLSTATE 28000)") =>
        {
            StoreError::Backend(format!(
                "{why}; TLS is off (disable): if the server accepts TLS connections only, \
                 set the TLS mode to require or stronger"
            ))
        }
        other => other,
    }
}

/// SQLSTATEs meaning "the server cannot serve this now", not "the
/// statement is wrong": connection exceptions (class 08), the server
/// shutting down or starting, too many connections, a row lock not had
/// within `lock_timeout`, a cancelled statement, a transaction ended for
/// idling. Nothing was written.
fn not_now(code: &SqlState) -> bool {
    code.code().starts_with("08")
        || [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::LOCK_NOT_AVAILABLE,
            SqlState::QUERY_CANCELED,
            SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
        ]
        .contains(code)
}

/// A connection could not be had from the pool for the database `target`
/// (see [`describe`]).
pub(super) fn pool_error(target: &str, e: PoolError) -> StoreError {
    match e {
        PoolError::Timeout(kind) => {
            let phase = match kind {
                TimeoutType::Wait => "waiting for a free connection",
                TimeoutType::Create => "connecting",
                TimeoutType::Recycle => "checking an idle connection",
            };
            StoreError::Unavailable(format!("PostgreSQL at {target}: timed out {phase}"))
        }
        // A refused login is Backend (the server answered), a refused or
        // dropped connection Unavailable.
        PoolError::Backend(e) => pg_error(&format!("connecting to {target}"), &e),
        PoolError::Closed => StoreError::Unavailable(format!(
            "PostgreSQL at {target}: the connection pool is closed"
        )),
        PoolError::NoRuntimeSpecified => {
            StoreError::Backend("the PostgreSQL connection pool has no runtime (a bug)".to_owned())
        }
        PoolError::PostCreateHook(e) => StoreError::Backend(format!(
            "PostgreSQL at {target}: connection set-up failed: {e}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_description_has_no_password() {
        let config: tokio_postgres::Config = "postgresql://agent:s3cret@db.example:6432/agentrt"
            .parse()
            .expect("a URL");
        let text = describe(&config);
        assert_eq!(text, "agent@db.example:6432/agentrt");
        assert!(!text.contains("s3cret"));
    }
}
