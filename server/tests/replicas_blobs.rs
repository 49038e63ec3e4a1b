//! Blobs across replicas: two replicas on one PostgreSQL database and one
//! S3-compatible store (moto's S3 API server, started here on loopback)
//! share every session's blobs — one uploaded through replica A is read
//! through replica B, a turn on B is given it, and deleting the session on
//! B deletes it from the store.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};

#[path = "support/replicas.rs"]
mod support;

use agentrt_client::{ChatOptions, Client, proto};
use support::*;

/// moto's S3 server, stopped (its stdin closed, then killed) on drop.
struct S3Server {
    child: Child,
    port: u16,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the S3 API server with bucket `bucket`; `None` (with a note)
/// when no Python with moto is configured (`AGENTRT_TEST_MOTO_PYTHON`),
/// which under CI is a failure.
fn s3_server(bucket: &str) -> Option<S3Server> {
    let Ok(python) = std::env::var("AGENTRT_TEST_MOTO_PYTHON") else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true needs AGENTRT_TEST_MOTO_PYTHON (a Python with moto[server]; .ci/run installs it)"
        );
        eprintln!(
            "*** SKIPPED: AGENTRT_TEST_MOTO_PYTHON is not set (a Python with moto[server]) ***"
        );
        return None;
    };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/s3_server.py");
    let mut child = Command::new(python)
        .arg(script)
        .arg(bucket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting the S3 API server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("its stdout"))
        .read_line(&mut line)
        .expect("the S3 server prints its port");
    let port = line.trim().parse().unwrap_or_else(|_| {
        let _ = child.kill();
        panic!("the S3 server printed {line:?}, not a port")
    });
    Some(S3Server { child, port })
}

#[tokio::test]
async fn a_blob_uploaded_through_one_replica_is_read_through_another() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let Some(s3) = s3_server("agentrt-blobs") else {
        return;
    };
    let endpoint = format!("http://127.0.0.1:{}", s3.port);
    let edit = |c: &mut agentrt_server::Config| {
        c.blobs.url = "s3://agentrt-blobs/replicas".into();
    };
    let build = |b: agentrt_server::ServerBuilder| {
        let endpoint = endpoint.clone();
        b.env_lookup(move |name| {
            let value = match name {
                KEY_VAR => KEY,
                "AWS_ENDPOINT" => &endpoint,
                "AWS_ALLOW_HTTP" => "true",
                "AWS_REGION" => "us-east-1",
                "AWS_ACCESS_KEY_ID" | "AWS_SECRET_ACCESS_KEY" => "test",
                _ => return None,
            };
            Some(value.to_owned())
        })
    };
    let a = replica_built(&db.url, true, &[], edit, build).await;
    let b = replica_built(&db.url, true, &[], edit, build).await;
    let on_a = Client::connect(a.server.url()).await.unwrap();
    let on_b = Client::connect(b.server.url()).await.unwrap();
    let session = new_session(&a).await;

    let mut doc = b"%PDF-1.7\n".to_vec();
    doc.extend((0..3_000_000u32).map(|i| (i % 253) as u8));
    let blob = on_a
        .upload_blob(&session, "application/pdf", "shared.pdf", &doc)
        .await
        .unwrap();
    assert_eq!(blob.blob_id, agentrt_client::sha256_hex(&doc));
    let (read_ref, read) = on_b.get_blob(&session, &blob.blob_id).await.unwrap();
    assert_eq!(read_ref, blob);
    assert!(read == doc, "replica B reads the bytes replica A stored");

    // A turn on B refers to it (the echo model reads no PDF: a
    // placeholder and a notice, and the turn succeeds).
    let summary = on_b
        .chat(&session, ChatOptions::new("read this").blob(&blob))
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));
    let history = on_a.history(&session).await.unwrap();
    let Some(proto::content_block::Block::File(file)) = &history[0].content[1].block else {
        panic!("{:?}", history[0])
    };
    assert_eq!(
        (file.blob_id.as_str(), file.size),
        (blob.blob_id.as_str(), doc.len() as u64)
    );

    // Deleted through B: gone from the shared store.
    let owner = on_a.get_session(&session).await.unwrap().owner;
    let env = |name: &str| {
        let value = match name {
            "AWS_ENDPOINT" => endpoint.as_str(),
            "AWS_ALLOW_HTTP" => "true",
            "AWS_REGION" => "us-east-1",
            "AWS_ACCESS_KEY_ID" | "AWS_SECRET_ACCESS_KEY" => "test",
            _ => return None,
        };
        Some(value.to_owned())
    };
    let store = agentrt_runtime::blobs::Blobs::open(
        "s3://agentrt-blobs/replicas",
        std::path::Path::new("/nonexistent"),
        &env,
    )
    .unwrap();
    assert_eq!(store.usage(&owner).await.unwrap(), doc.len() as u64);
    assert!(on_b.delete_session(&session).await.unwrap());
    assert_eq!(store.usage(&owner).await.unwrap(), 0);
    drop(s3);
}
