//! A database that cannot be reached, or goes away: clear `Unavailable`
//! errors within the connect timeout (never a hang, never a panic, never
//! the password), and nothing acknowledged is lost when it returns.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentrt_runtime::store::{PgConfig, PostgresStore, Store, StoreError};
use agentrt_runtime::types::Role;
use agentrt_testkit::contract::text_message;
use agentrt_testkit::pg;

use super::proxy::{Mode, Proxy};

const SECRET: &str = "hunter2-not-for-logs";
const TIMEOUT: Duration = Duration::from_secs(1);
/// What "within the connect timeout" may take on a loaded machine.
const SLACK: Duration = Duration::from_secs(4);

fn settings(addr: &str, db: &str) -> PgConfig {
    PgConfig {
        connect_timeout: TIMEOUT,
        ..super::config(
            &format!("postgresql://agentrt:{SECRET}@{addr}/{db}"),
            "a",
            Duration::from_secs(10),
        )
    }
}

fn unavailable<T: std::fmt::Debug>(result: Result<T, StoreError>, started: Instant) -> String {
    assert!(
        started.elapsed() < TIMEOUT + SLACK,
        "took {:?}",
        started.elapsed()
    );
    match result {
        Err(e @ StoreError::Unavailable(_)) => {
            let shown = format!("{e} {e:?}");
            assert!(!shown.contains(SECRET), "the password leaked: {shown}");
            shown
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn connecting_to_a_closed_port_is_unavailable_without_the_password() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let started = Instant::now();
    let result = PostgresStore::connect(settings(&format!("127.0.0.1:{port}"), "x")).await;
    let shown = unavailable(result, started);
    assert!(
        shown.contains(&format!("127.0.0.1:{port}")),
        "names the database: {shown}"
    );
}

#[tokio::test]
async fn connecting_to_a_silent_server_gives_up_within_the_timeout() {
    let proxy = Proxy::start("127.0.0.1:9").await;
    proxy.resume(Mode::Blackhole).await;
    let started = Instant::now();
    let result = PostgresStore::connect(settings(&proxy.addr.to_string(), "x")).await;
    unavailable(result, started);
}

/// A store on `db` through `proxy`.
async fn proxied(db: &pg::TestDb, proxy: &Proxy) -> PostgresStore {
    let url = db.url.replace(&db.addr, &proxy.addr.to_string());
    let config = PgConfig {
        connect_timeout: TIMEOUT,
        ..super::config(&url, "a", Duration::from_secs(30))
    };
    PostgresStore::connect(config).await.expect("connect")
}

/// Polls `ping` until the database answers again (within 30 s).
async fn until_reachable(store: &PostgresStore) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.ping().await.is_err() {
        assert!(Instant::now() < deadline, "the database never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn ping_reports_a_database_that_went_away_and_it_recovers() {
    let Some(db) = pg::database().await else {
        return;
    };
    let proxy = Proxy::start(&db.addr).await;
    let store = proxied(&db, &proxy).await;
    store.ping().await.expect("reachable");
    let kept = super::session(&store).await;
    proxy.cut().await;
    let started = Instant::now();
    unavailable(store.ping().await, started);
    proxy.resume(Mode::Blackhole).await;
    let started = Instant::now();
    unavailable(store.ping().await, started);
    let started = Instant::now();
    unavailable(store.get_session(&kept.id).await, started);
    proxy.resume(Mode::Forward).await;
    until_reachable(&store).await;
    assert_eq!(store.get_session(&kept.id).await.expect("get"), Some(kept));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_cut_mid_write_lose_nothing_acknowledged() {
    let Some(db) = pg::database().await else {
        return;
    };
    let proxy = Proxy::start(&db.addr).await;
    let store = Arc::new(proxied(&db, &proxy).await);
    let s = super::session(&*store).await;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<bool>(512);
    let writers: Vec<_> = (0..6)
        .map(|w| {
            let (store, s, tx) = (Arc::clone(&store), s.clone(), tx.clone());
            tokio::spawn(async move {
                let mut acked = Vec::new();
                for i in 0..30 {
                    let message = text_message("t", Role::Assistant, &format!("{w}/{i}"));
                    let outcome = store.append_message(&s.id, &s.incarnation, message).await;
                    let ok = outcome.is_ok();
                    match outcome {
                        Ok(m) => acked.push((m.seq, m.body.id)),
                        Err(StoreError::Unavailable(_)) => {}
                        Err(other) => panic!("a cut connection must be Unavailable: {other:?}"),
                    }
                    let _ = tx.send(ok).await;
                }
                acked
            })
        })
        .collect();
    drop(tx);
    let (mut oks, mut errors, mut cut, mut resumed) = (0, 0, false, false);
    while let Some(ok) = rx.recv().await {
        if ok {
            oks += 1;
        } else {
            errors += 1;
        }
        if !cut && oks >= 20 {
            proxy.cut().await;
            cut = true;
        }
        if cut && !resumed && errors >= 6 {
            proxy.resume(Mode::Forward).await;
            resumed = true;
        }
    }
    assert!(cut, "the writers finished before the cut");
    let mut acked = Vec::new();
    for writer in writers {
        acked.extend(writer.await.expect("no writer panicked"));
    }
    until_reachable(&store).await;
    let history = store
        .history(&s.id, 0, usize::MAX, true)
        .await
        .expect("history");
    assert!(
        history.iter().map(|m| m.seq).eq(1..=history.len() as u64),
        "contiguous"
    );
    for (seq, id) in &acked {
        let stored = history.iter().find(|m| m.seq == *seq);
        assert_eq!(
            stored.map(|m| &m.body.id),
            Some(id),
            "acknowledged seq {seq} is stored"
        );
    }
    assert!(history.len() >= acked.len());
}

/// A transaction elsewhere that holds a session's row and goes quiet (a
/// stalled replica) delays its writers by at most the lease time.
#[tokio::test]
async fn a_session_row_held_by_a_stuck_transaction_is_unavailable_not_a_hang() {
    let Some(db) = pg::database().await else {
        return;
    };
    let ttl = Duration::from_secs(1);
    let store = super::store(&db, "a", ttl).await;
    let s = super::session(&store).await;
    let (mut stuck, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    let conn = tokio::spawn(conn);
    let holder = stuck.transaction().await.expect("begin");
    holder
        .execute("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", &[&s.id])
        .await
        .expect("lock the row");
    let message = || text_message("t", Role::Assistant, "waits");
    let started = Instant::now();
    let shown = unavailable(
        store.append_message(&s.id, &s.incarnation, message()).await,
        started,
    );
    assert!(started.elapsed() >= ttl, "gave up before the lock timeout");
    assert!(shown.contains("lock timeout"), "{shown}");
    holder.rollback().await.expect("release");
    let stored = store.append_message(&s.id, &s.incarnation, message()).await;
    assert_eq!(stored.expect("the row is free again").seq, 1);
    drop(stuck);
    let _ = conn.await;
}
