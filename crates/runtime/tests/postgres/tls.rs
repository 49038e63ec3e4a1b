//! TLS to PostgreSQL, against the testkit's TLS-only server (`hostssl`
//! lines only, a certificate for `localhost` and `127.0.0.1` from a test
//! CA): each mode connects or fails as it promises, and says why.

use std::path::Path;
use std::time::Duration;

use agentrt_runtime::store::{PgConfig, PgSslMode, PgTls, PostgresStore, Store, StoreError};
use agentrt_testkit::contract;
use agentrt_testkit::pg::{self, TlsTestDb};

/// Settings for `url` with TLS `mode` and `ca_file`.
fn tls_config(url: &str, mode: Option<PgSslMode>, ca_file: Option<&Path>) -> PgConfig {
    PgConfig {
        tls: PgTls {
            mode,
            ca_file: ca_file.map(Path::to_path_buf),
        },
        ..super::config(url, "a", Duration::from_secs(30))
    }
}

/// `url` with its host (`127.0.0.1`) replaced by `host`, still connecting
/// to 127.0.0.1 (`hostaddr`): the certificate is checked against `host`.
fn as_host(db: &TlsTestDb, host: &str) -> String {
    let port = db.db.addr.rsplit_once(':').map(|(_, p)| p).unwrap();
    format!(
        "postgresql://agentrt@{host}:{port}/{}?hostaddr=127.0.0.1",
        db.db.name
    )
}

/// The error of connecting with `config`.
async fn refused(config: PgConfig) -> StoreError {
    match PostgresStore::connect(config).await {
        Ok(_) => panic!("connected, but should have been refused"),
        Err(e) => e,
    }
}

/// A PEM file of a CA that did not issue the server's certificate.
fn other_ca(dir: &Path) -> std::path::PathBuf {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "another CA");
    let path = dir.join("other-ca.pem");
    std::fs::write(&path, params.self_signed(&key).unwrap().pem()).unwrap();
    path
}

#[tokio::test]
async fn verify_full_with_the_ca_file_connects_and_the_store_works() {
    let Some(db) = pg::tls_database().await else {
        return;
    };
    let config = tls_config(&db.db.url, Some(PgSslMode::VerifyFull), Some(&db.ca_file));
    let store = PostgresStore::connect(config).await.expect("connect");
    contract::create_get_round_trip(&store).await;
    contract::begin_turn_stores_message_and_turn(&store).await;
    contract::append_assigns_increasing_seqs(&store).await;
    store.ping().await.expect("ping");

    // The same through libpq's URL parameters, by host name this time.
    let port = db.db.addr.rsplit_once(':').map(|(_, p)| p).unwrap();
    let root = db.ca_file.display().to_string().replace('/', "%2F");
    let url = format!(
        "postgresql://agentrt@localhost:{port}/{}?sslmode=verify-full&sslrootcert={root}",
        db.db.name
    );
    let store = PostgresStore::connect(tls_config(&url, None, None))
        .await
        .expect("connect with sslmode and sslrootcert in the URL");
    let session = super::session(&store).await;
    assert!(store.get_session(&session.id).await.unwrap().is_some());
}

#[tokio::test]
async fn verify_full_refuses_a_certificate_from_another_ca() {
    let Some(db) = pg::tls_database().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let wrong = other_ca(dir.path());
    for mode in [PgSslMode::VerifyFull, PgSslMode::VerifyCa] {
        let err = refused(tls_config(&db.db.url, Some(mode), Some(&wrong))).await;
        let text = err.to_string();
        assert!(matches!(err, StoreError::Backend(_)), "{mode}: {err:?}");
        assert!(
            text.contains("the server's certificate is not signed by a trusted CA"),
            "{mode}: {text}"
        );
    }
    // Without a CA file the system's roots are used (if it has any), and
    // they do not know the test CA either.
    let err = refused(tls_config(&db.db.url, Some(PgSslMode::VerifyFull), None))
        .await
        .to_string();
    assert!(
        err.contains("not signed by a trusted CA") || err.contains("the system has none usable"),
        "{err}"
    );
}

#[tokio::test]
async fn verify_full_refuses_a_certificate_for_another_host() {
    let Some(db) = pg::tls_database().await else {
        return;
    };
    for host in ["db.example", "127.0.0.2"] {
        let url = as_host(&db, host);
        let err = refused(tls_config(
            &url,
            Some(PgSslMode::VerifyFull),
            Some(&db.ca_file),
        ))
        .await;
        let text = err.to_string();
        assert!(matches!(err, StoreError::Backend(_)), "{host}: {err:?}");
        assert!(
            text.contains("the server's certificate does not name the URL's host"),
            "{host}: {text}"
        );
        assert!(text.contains(host), "{host}: {text}");
        // verify-ca checks the chain only.
        let store = PostgresStore::connect(tls_config(
            &url,
            Some(PgSslMode::VerifyCa),
            Some(&db.ca_file),
        ))
        .await
        .expect("verify-ca ignores the name");
        store.ping().await.expect("ping");
    }
}

#[tokio::test]
async fn require_and_prefer_connect_without_a_ca() {
    let Some(db) = pg::tls_database().await else {
        return;
    };
    for mode in [Some(PgSslMode::Require), None] {
        let store = PostgresStore::connect(tls_config(&db.db.url, mode, None))
            .await
            .unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        let session = super::session(&store).await;
        assert!(store.get_session(&session.id).await.unwrap().is_some());
    }
    // Whatever the host name: nothing is verified.
    let url = as_host(&db, "db.example");
    let store = PostgresStore::connect(tls_config(&url, Some(PgSslMode::Require), None))
        .await
        .expect("require ignores the name");
    store.ping().await.expect("ping");
}

#[tokio::test]
async fn a_password_login_binds_to_the_tls_channel() {
    let Some(db) = pg::tls_database().await else {
        return;
    };
    // SCRAM-SHA-256-PLUS: the server checks the client's hash of the
    // certificate it saw, so a wrong hash is a failed login.
    for mode in [PgSslMode::Require, PgSslMode::VerifyFull] {
        let url = format!("{}?channel_binding=require", db.scram_url);
        let store = PostgresStore::connect(tls_config(&url, Some(mode), Some(&db.ca_file)))
            .await
            .unwrap_or_else(|e| panic!("{mode}: {e}"));
        store.ping().await.expect("ping");
    }
}

#[tokio::test]
async fn plaintext_to_a_tls_only_server_is_refused_with_a_hint() {
    let Some(db) = pg::tls_database().await else {
        return;
    };
    let url = format!("{}?sslmode=disable", db.db.url);
    for config in [
        tls_config(&db.db.url, Some(PgSslMode::Disable), None),
        tls_config(&url, None, None),
    ] {
        let err = refused(config).await;
        let text = err.to_string();
        assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
        assert!(text.contains("(SQLSTATE 28000)"), "{text}");
        assert!(
            text.contains("TLS is off (disable): if the server accepts TLS connections only"),
            "{text}"
        );
    }
}

#[tokio::test]
async fn tls_settings_that_contradict_the_url_are_refused_before_connecting() {
    let Some(db) = pg::tls_database().await else {
        return;
    };
    let url = format!("{}?sslmode=require", db.db.url);
    let err = refused(tls_config(&url, Some(PgSslMode::VerifyFull), None)).await;
    assert!(
        err.to_string()
            .contains("tls = \"verify-full\" and sslmode=require in the URL disagree"),
        "{err}"
    );
    // Client certificates are not supported: tokio-postgres names the
    // option, and nothing shows the password.
    let url = format!("{}?sslcert=%2Fclient.crt", db.scram_url);
    let err = refused(tls_config(&url, Some(PgSslMode::Require), None))
        .await
        .to_string();
    assert!(err.contains("unknown option `sslcert`"), "{err}");
    let config: tokio_postgres::Config = db.scram_url.parse().unwrap();
    let password = String::from_utf8(config.get_password().unwrap().to_vec()).unwrap();
    assert!(!err.contains(&password), "{err}");
    let missing = db.ca_file.with_file_name("missing.pem");
    let err = refused(tls_config(&db.db.url, None, Some(&missing))).await;
    assert!(
        err.to_string()
            .contains(&format!("ca_file {}: cannot read it", missing.display())),
        "{err}"
    );
}
