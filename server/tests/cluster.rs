//! Several `agentrt-server` processes sharing one PostgreSQL (P10): one
//! live turn per session cluster-wide, calls routed to the replica owning
//! the live turn, takeover of a killed replica's turns by lease expiry, a
//! drain that touches only its own turns, and readiness that follows the
//! database. Each test starts its own replicas on a fresh database from
//! `agentrt_testkit::pg` (the tests skip without PostgreSQL and fail under
//! `CI=true`), on loopback, with a model upstream the test controls.
//!
//! Modules: `harness` (the replica processes and what every test checks of
//! a history), `upstream` (the fake model), and one module per behaviour;
//! the outage test cuts one replica off the database with the testkit's
//! `TcpProxy`; `database_tls` runs replicas on a TLS-only PostgreSQL;
//! `mtls` runs replicas with `[tls]`, mTLS between them.

mod cluster {
    pub(crate) mod harness;
    pub(crate) mod upstream;

    mod a2a;
    mod admission;
    mod database_tls;
    mod drain;
    mod failover;
    mod metrics;
    mod mtls;
    mod operator;
    mod outage;
    mod routing;
}
