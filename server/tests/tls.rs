//! TLS and mTLS on the gRPC listener, through the client crate against an
//! in-process server (certificates generated with rcgen per test; nothing
//! checked in), plus the binary's start-up check of the TLS files.

mod tls {
    pub(crate) mod harness;
    mod reload;
}

use agentrt_client::{Client, proto};
use agentrt_server::config::{ApiKeyConfig, AuthConfig, MtlsConfig};
use rcgen::KeyPair;

use tls::harness::{Ca, Files, connect, create_session, finish, start, status_of};

const ALICE_KEY: &str = "alice-key-0001";
const BOB: &str = "spiffe://agentrt.test/ns/default/sa/bob";

#[tokio::test]
async fn a_chat_over_tls_completes_and_a_plaintext_client_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("agentrt test ca");
    let files = Files::new(dir.path(), &ca.server("server-1"));
    let server = start(
        &dir.path().join("data"),
        files.settings(false),
        AuthConfig::default(),
        None,
    )
    .await;

    let client = connect(&server.https(), &ca.pem, None, None).await.unwrap();
    let session = client
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap();
    let mut events = client.chat(&session.session_id, "hello tls").await.unwrap();
    let (text, outcome) = finish(&mut events).await;
    assert_eq!(outcome, proto::TurnOutcome::Success);
    assert_eq!(text, "You said: hello tls");

    let plaintext = create_session(Client::connect(format!("http://{}", server.addr))).await;
    assert!(
        plaintext.is_err(),
        "a plaintext client got through: {plaintext:?}"
    );
    let stranger = Ca::new("another ca");
    let untrusting = create_session(connect(&server.https(), &stranger.pem, None, None)).await;
    assert!(
        untrusting.is_err(),
        "a client that does not trust the CA got through"
    );
    // The server still serves TLS clients after refusing those.
    create_session(connect(&server.https(), &ca.pem, None, None))
        .await
        .unwrap();
    server.stop().await;
}

#[tokio::test]
async fn mtls_maps_certificates_to_users_and_refuses_clients_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("agentrt test ca");
    let clients = Ca::new("agentrt client ca");
    let files = Files::new(dir.path(), &ca.server("server-1"));
    std::fs::write(&files.client_ca, &clients.pem).unwrap();
    let auth = AuthConfig {
        api_keys: vec![ApiKeyConfig::inline(ALICE_KEY, "alice", false)],
        api_keys_file: None,
        mtls: vec![
            MtlsConfig::uri(BOB, "bob", false),
            MtlsConfig::common_name("carol-by-cn", "carol", false),
        ],
    };
    let server = start(&dir.path().join("data"), files.settings(true), auth, None).await;
    let url = server.https();

    let without = create_session(connect(&url, &ca.pem, None, Some(ALICE_KEY))).await;
    assert!(
        without.is_err(),
        "a client without a certificate got through: {without:?}"
    );
    let outsider = ca.client_uri(BOB);
    let foreign = create_session(connect(&url, &ca.pem, Some(&outsider), None)).await;
    assert!(
        foreign.is_err(),
        "a certificate from another CA got through: {foreign:?}"
    );

    let bob = connect(&url, &ca.pem, Some(&clients.client_uri(BOB)), None)
        .await
        .unwrap();
    let bobs = bob.create_session(Default::default()).await.unwrap();
    assert_eq!(bobs.owner, "bob");
    // Alice's laptop certificate maps to no one; her key says who she is.
    let laptop = clients.client_uri("spiffe://agentrt.test/laptop/alice");
    let alice = connect(&url, &ca.pem, Some(&laptop), Some(ALICE_KEY))
        .await
        .unwrap();
    let alices = alice.create_session(Default::default()).await.unwrap();
    assert_eq!(alices.owner, "alice");
    let mut events = alice.chat(&alices.session_id, "mine").await.unwrap();
    assert_eq!(finish(&mut events).await.1, proto::TurnOutcome::Success);

    let err = status_of(bob.get_session(&alices.session_id).await.unwrap_err());
    assert_eq!(err.code(), tonic::Code::NotFound);
    let err = status_of(bob.chat(&alices.session_id, "theirs").await.unwrap_err());
    assert_eq!(err.code(), tonic::Code::NotFound);
    let listed: Vec<_> = bob
        .list_sessions(Default::default())
        .await
        .unwrap()
        .sessions
        .into_iter()
        .map(|s| s.session_id)
        .collect();
    assert_eq!(listed, [bobs.session_id]);

    let unmapped = connect(&url, &ca.pem, Some(&laptop), None).await.unwrap();
    let err = status_of(
        unmapped
            .create_session(Default::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert!(
        err.message().contains("spiffe://agentrt.test/laptop/alice")
            && err.message().contains("[[auth.mtls]]"),
        "{}",
        err.message()
    );
    let carol = connect(&url, &ca.pem, Some(&clients.client_cn("carol-by-cn")), None)
        .await
        .unwrap();
    assert_eq!(
        carol
            .create_session(Default::default())
            .await
            .unwrap()
            .owner,
        "carol"
    );
    // A certificate from the trusted CA whose subject CN spells Bob's
    // SPIFFE id, with no URI SAN, is not Bob (nor anyone).
    let spoof = connect(&url, &ca.pem, Some(&clients.client_cn(BOB)), None)
        .await
        .unwrap();
    let err = status_of(spoof.create_session(Default::default()).await.unwrap_err());
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    assert!(
        err.message().contains(&format!("subject CN {BOB:?}")),
        "{}",
        err.message()
    );
    // Nor is a certificate with Carol's CN as a URI SAN ("carol-by-cn:x").
    let uri_carol = connect(
        &url,
        &ca.pem,
        Some(&clients.client_uri("carol-by-cn:x")),
        None,
    )
    .await
    .unwrap();
    let err = status_of(
        uri_carol
            .create_session(Default::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    server.stop().await;
}

#[tokio::test]
async fn each_message_carries_the_credential_it_came_with() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("agentrt test ca");
    let clients = Ca::new("agentrt client ca");
    let files = Files::new(dir.path(), &ca.server("server-1"));
    std::fs::write(&files.client_ca, &clients.pem).unwrap();
    let auth = AuthConfig {
        api_keys: vec![ApiKeyConfig::inline(ALICE_KEY, "alice", false)],
        api_keys_file: None,
        mtls: vec![
            MtlsConfig::uri("spiffe://agentrt.test/laptop/alice", "alice", false),
            MtlsConfig::common_name("alice-desk", "alice", false),
        ],
    };
    let server = start(&dir.path().join("data"), files.settings(true), auth, None).await;
    let url = server.https();
    let laptop = clients.client_uri("spiffe://agentrt.test/laptop/alice");
    let by_uri = connect(&url, &ca.pem, Some(&laptop), None).await.unwrap();
    let by_cn = connect(&url, &ca.pem, Some(&clients.client_cn("alice-desk")), None)
        .await
        .unwrap();
    // A key names the caller even on a connection with a mapped certificate.
    let by_key = connect(&url, &ca.pem, Some(&laptop), Some(ALICE_KEY))
        .await
        .unwrap();
    let session = by_uri
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;
    for client in [&by_uri, &by_cn, &by_key] {
        let mut events = client.chat(&session, "hi").await.unwrap();
        assert_eq!(finish(&mut events).await.1, proto::TurnOutcome::Success);
    }
    let actors: Vec<_> = by_key
        .history(&session)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.role() == proto::Role::User)
        .map(|m| {
            let a = m.input_actor.expect("an input actor");
            (a.kind(), a.id)
        })
        .collect();
    use proto::InputActorKind::{ApiKey, Mtls};
    assert_eq!(
        actors,
        [
            (Mtls, "spiffe://agentrt.test/laptop/alice".to_owned()),
            (Mtls, "CN=alice-desk".to_owned()),
            (ApiKey, "alice".to_owned()),
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn the_binary_refuses_to_start_with_a_missing_certificate_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&key, KeyPair::generate().unwrap().serialize_pem()).unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentrt-server"))
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--tls-cert")
        .arg(&missing)
        .arg("--tls-key")
        .arg(&key)
        .env("AGENTRT_LOG", "error")
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "stdout {stdout}\nstderr {stderr}"
    );
    assert!(
        !stdout.contains("listening"),
        "it bound a port first: {stdout}"
    );
    assert!(stderr.contains("no-such-cert.pem"), "{stderr}");
    assert!(!stderr.contains("PRIVATE KEY"), "{stderr}");
}

#[tokio::test]
async fn the_binary_refuses_to_start_when_a_key_variable_is_missing_naming_user_and_variable() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agentrt.toml");
    std::fs::write(
        &config,
        "[[auth.api_keys]]\nkey_env = \"AGENTRT_TEST_ABSENT_KEY\"\nuser = \"ops\"\n\
         [[auth.api_keys]]\nkey = \"inline-secret-1\"\nuser = \"alice\"\n",
    )
    .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentrt-server"))
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--config")
        .arg(&config)
        .env_remove("AGENTRT_TEST_ABSENT_KEY")
        .env("AGENTRT_LOG", "error")
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "stdout {stdout}\nstderr {stderr}"
    );
    assert!(
        !stdout.contains("listening"),
        "it bound a port first: {stdout}"
    );
    assert!(
        stderr.contains("AGENTRT_TEST_ABSENT_KEY") && stderr.contains("\"ops\""),
        "{stderr}"
    );
    assert!(
        !stderr.contains("inline-secret-1"),
        "a key leaked: {stderr}"
    );
}
