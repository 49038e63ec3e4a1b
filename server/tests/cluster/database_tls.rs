//! Replicas on a PostgreSQL that takes TLS connections only (the
//! testkit's: `hostssl` lines only, a certificate from a test CA): with
//! `[store] tls = "verify-full"` and the CA as `ca_file` they share the
//! database and forward calls as on plaintext; a CA file that is missing
//! or is not the server's stops start-up, naming the key and the file and
//! never the URL's password.

use std::process::Stdio;
use std::time::{Duration, Instant};

use agentrt_client::proto;
use tokio::io::AsyncReadExt as _;
use tokio::process::Command;

use super::harness::{
    Cluster, assert_history_sound, finish, is_text, outcome, read_until, serial, text_request,
};

const A: usize = 0;
const B: usize = 1;

#[tokio::test]
async fn replicas_on_a_tls_only_database_with_verify_full_forward_a_stop() {
    let _serial = serial().await;
    let Some(cluster) = Cluster::start_db_tls(2).await else {
        return;
    };
    let session = cluster.session().await;
    let mut events = cluster
        .client(A)
        .chat_with(text_request(&session, "hold tls 2"))
        .await
        .unwrap();
    read_until(&mut events, Duration::from_secs(10), is_text).await;

    // B learns from the database (over TLS) that A owns the live turn,
    // and forwards the Stop to it.
    let status = cluster.client(B).session_status(&session).await.unwrap();
    assert!(status.live, "B sees A's live turn: {status:?}");
    let sent = Instant::now();
    assert!(
        cluster.client(B).stop_session(&session).await.unwrap(),
        "B's Stop reached the live turn on A"
    );
    let rest = finish(events, Duration::from_secs(5)).await;
    assert_eq!(
        outcome(&rest),
        Some((proto::TurnOutcome::Canceled, proto::CancelReason::Stopped))
    );
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "{:?}",
        sent.elapsed()
    );
    let history = cluster.client(B).history(&session).await.unwrap();
    assert_history_sound(&history, "after stop");
    assert_eq!(history.len(), 2, "the user message and the partial answer");
}

#[tokio::test]
async fn a_missing_or_wrong_ca_file_stops_start_up_naming_it() {
    let Some(db) = agentrt_testkit::pg::tls_database().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing-ca.pem");
    let other = dir.path().join("other-ca.pem");
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    std::fs::write(&other, params.self_signed(&key).unwrap().pem()).unwrap();
    let password = db
        .scram_url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(user, _)| user.split_once(':'))
        .map(|(_, password)| password.to_owned())
        .unwrap();

    for (ca_file, says) in [
        (
            &missing,
            format!("ca_file {}: cannot read it", missing.display()),
        ),
        (
            &other,
            "the server's certificate is not signed by a trusted CA".to_owned(),
        ),
    ] {
        let config = dir.path().join("replica.toml");
        std::fs::write(
            &config,
            format!(
                "default_model = \"fake/m\"\n\
                 [store]\n\
                 kind = \"postgres\"\n\
                 url_env = \"AGENTRT_TLS_TEST_DATABASE_URL\"\n\
                 tls = \"verify-full\"\n\
                 ca_file = {:?}\n\
                 [[providers]]\n\
                 name = \"fake\"\n\
                 kind = \"openai\"\n\
                 base_url = \"http://127.0.0.1:9/v1\"\n",
                ca_file.display().to_string()
            ),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_agentrt-server"))
            .args(["--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .current_dir(dir.path())
            .env("AGENTRT_LOG", "warn")
            .env("AGENTRT_TLS_TEST_DATABASE_URL", &db.scram_url)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .expect("start-up failed within 60 s")
            .unwrap();
        let mut stdout = String::new();
        let mut stderr = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut stdout)
            .await
            .unwrap();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .await
            .unwrap();
        assert!(!status.success(), "{ca_file:?}: started; stderr: {stderr}");
        assert!(
            !stdout.contains("listening"),
            "{ca_file:?}: it listened: {stdout}"
        );
        assert!(stderr.contains(&says), "{ca_file:?}: {stderr}");
        assert!(
            !stderr.contains(&password),
            "{ca_file:?}: the password leaked: {stderr}"
        );
    }
}
