//! Certificate reload: changed files serve the next connection, open
//! streams keep theirs, a broken file is not loaded, SIGHUP forces a
//! re-read.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agentrt_client::{ChatEvent, proto};
use agentrt_server::config::AuthConfig;
use futures::StreamExt as _;

use super::harness::{Ca, Files, Gate, connect, create_session, finish, start, text_request};

#[tokio::test]
async fn replaced_certificate_files_serve_the_next_connection_while_an_open_stream_streams_on() {
    let dir = tempfile::tempdir().unwrap();
    let old_ca = Ca::new("old ca");
    let new_ca = Ca::new("new ca");
    let files = Files::new(dir.path(), &old_ca.server("old"));
    let gate = Arc::new(Gate::default());
    let server = start(
        &dir.path().join("data"),
        files.settings(false),
        AuthConfig::default(),
        Some(Arc::clone(&gate)),
    )
    .await;
    let url = server.https();

    let open = connect(&url, &old_ca.pem, None, None).await.unwrap();
    let session = open.create_session(Default::default()).await.unwrap();
    let mut events = open
        .chat_with(proto::ChatRequest {
            model: "gate/m".into(),
            ..text_request(&session.session_id, "wait")
        })
        .await
        .unwrap();
    loop {
        if let ChatEvent::Text(t) = events.next().await.unwrap().unwrap().kind {
            assert_eq!(t, "gated ");
            break;
        }
    }

    let (cert, key) = new_ca.server("new");
    files.replace((&cert, &key));
    create_session(connect(&url, &new_ca.pem, None, None))
        .await
        .expect("a client trusting only the new CA connects once the files changed");
    let stale = create_session(connect(&url, &old_ca.pem, None, None)).await;
    assert!(
        stale.is_err(),
        "a new connection still got the old certificate"
    );

    // A broken file is not loaded: the last good certificate stays.
    std::fs::write(&files.cert, "-----BEGIN CERTIFICATE-----\nhalf").unwrap();
    create_session(connect(&url, &new_ca.pem, None, None))
        .await
        .expect("the last good certificate is kept after a failed reload");

    gate.release(1);
    let (text, outcome) = finish(&mut events).await;
    assert_eq!(text, "answer");
    assert_eq!(outcome, proto::TurnOutcome::Success);
    server.stop().await;
}

/// `pem` followed by newlines up to `len` bytes (PEM allows text around
/// its sections), so two different certificates can have the same size.
fn padded(pem: &str, len: usize) -> Vec<u8> {
    assert!(
        pem.len() <= len,
        "a PEM of {} bytes does not fit {len}",
        pem.len()
    );
    let mut bytes = pem.as_bytes().to_vec();
    bytes.resize(len, b'\n');
    bytes
}

/// Overwrites `path` in place (same inode) with `content` of the same
/// length and puts its modification time back: a change only SIGHUP can
/// reveal.
fn overwrite_unnoticed(path: &Path, content: &[u8]) {
    let before = std::fs::metadata(path).unwrap();
    assert_eq!(before.len(), content.len() as u64);
    std::fs::write(path, content).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.set_modified(before.modified().unwrap()).unwrap();
    let after = std::fs::metadata(path).unwrap();
    assert_eq!(after.modified().unwrap(), before.modified().unwrap());
    #[cfg(unix)]
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&after),
        std::os::unix::fs::MetadataExt::ino(&before)
    );
}

#[cfg(unix)]
#[tokio::test]
async fn sighup_reloads_files_whose_size_time_and_inode_did_not_change() {
    const CERT_LEN: usize = 2048;
    const KEY_LEN: usize = 1024;
    let dir = tempfile::tempdir().unwrap();
    let old_ca = Ca::new("old ca");
    let new_ca = Ca::new("new ca");
    let (cert, key) = old_ca.server("old");
    let files = Files::new(dir.path(), &(cert, key));
    std::fs::write(
        &files.cert,
        padded(&std::fs::read_to_string(&files.cert).unwrap(), CERT_LEN),
    )
    .unwrap();
    std::fs::write(
        &files.key,
        padded(&std::fs::read_to_string(&files.key).unwrap(), KEY_LEN),
    )
    .unwrap();
    let server = start(
        &dir.path().join("data"),
        files.settings(false),
        AuthConfig::default(),
        None,
    )
    .await;
    let url = server.https();
    // Served, so its SIGHUP handler is installed.
    create_session(connect(&url, &old_ca.pem, None, None))
        .await
        .unwrap();

    let (cert, key) = new_ca.server("new");
    overwrite_unnoticed(&files.cert, &padded(&cert, CERT_LEN));
    overwrite_unnoticed(&files.key, &padded(&key, KEY_LEN));
    let missed = create_session(connect(&url, &new_ca.pem, None, None)).await;
    assert!(missed.is_err(), "the change was noticed without SIGHUP");

    nix::sys::signal::raise(nix::sys::signal::Signal::SIGHUP).unwrap();
    // The reload runs on the server's own task: wait (bounded) until a
    // client trusting only the new CA gets through.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while create_session(connect(&url, &new_ca.pem, None, None))
        .await
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "SIGHUP did not reload the certificate within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stale = create_session(connect(&url, &old_ca.pem, None, None)).await;
    assert!(
        stale.is_err(),
        "the old certificate is still served after SIGHUP"
    );
    server.stop().await;
}
