//! TLS and mTLS on the gRPC listener, through the client crate against an
//! in-process server (certificates generated with rcgen per test; nothing
//! checked in), plus the binary's start-up check of the TLS files.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentrt_client::{ChatEvent, Client, proto};
use agentrt_runtime::model::{ModelError, ModelEvent, ModelProvider, ModelRequest, ModelStream};
use agentrt_runtime::types::StopReason;
use agentrt_server::config::{ApiKeyConfig, AuthConfig, MtlsConfig, TlsSettings};
use agentrt_server::{Config, ServerBuilder};
use async_trait::async_trait;
use futures::StreamExt as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use tokio::sync::{Semaphore, oneshot};

const ALICE_KEY: &str = "alice-key-0001";
const BOB: &str = "spiffe://agentrt.test/ns/default/sa/bob";

/// A certificate authority made up for one test.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).unwrap();
        Self {
            issuer: Issuer::new(params, key),
            pem: cert.pem(),
        }
    }

    /// (certificate PEM, key PEM) of a leaf for `sans` and `cn`.
    fn leaf(
        &self,
        sans: Vec<SanType>,
        cn: &str,
        usage: ExtendedKeyUsagePurpose,
    ) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = sans;
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn server(&self, cn: &str) -> (String, String) {
        self.leaf(
            vec![
                SanType::DnsName("localhost".try_into().unwrap()),
                SanType::IpAddress([127, 0, 0, 1].into()),
            ],
            cn,
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    fn client_uri(&self, uri: &str) -> (String, String) {
        self.leaf(
            vec![SanType::URI(uri.try_into().unwrap())],
            "ignored-cn",
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    fn client_cn(&self, cn: &str) -> (String, String) {
        self.leaf(Vec::new(), cn, ExtendedKeyUsagePurpose::ClientAuth)
    }
}

/// The server's TLS files in a temporary directory.
struct Files {
    cert: PathBuf,
    key: PathBuf,
    client_ca: PathBuf,
}

impl Files {
    fn new(dir: &Path, (cert, key): &(String, String)) -> Self {
        let files = Self {
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
            client_ca: dir.join("clients-ca.pem"),
        };
        files.replace((cert, key));
        files
    }

    fn replace(&self, (cert, key): (&str, &str)) {
        std::fs::write(&self.cert, cert).unwrap();
        std::fs::write(&self.key, key).unwrap();
    }

    fn settings(&self, mtls: bool) -> TlsSettings {
        TlsSettings {
            cert: Some(self.cert.clone()),
            key: Some(self.key.clone()),
            client_ca: mtls.then(|| self.client_ca.clone()),
        }
    }
}

/// Streams "gated ", waits for a permit, then "answer" and finishes.
#[derive(Debug)]
struct Gate {
    permits: Arc<Semaphore>,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            permits: Arc::new(Semaphore::new(0)),
        }
    }
}

#[async_trait]
impl ModelProvider for Gate {
    async fn stream(&self, _request: ModelRequest) -> Result<ModelStream, ModelError> {
        let permits = Arc::clone(&self.permits);
        let stream = futures::stream::unfold(0u8, move |step| {
            let permits = Arc::clone(&permits);
            async move {
                let item = match step {
                    0 => ModelEvent::TextDelta("gated ".into()),
                    1 => {
                        permits.acquire().await.ok()?.forget();
                        ModelEvent::TextDelta("answer".into())
                    }
                    2 => ModelEvent::Finished(StopReason::Stop),
                    _ => return None,
                };
                Some((Ok(item), step + 1))
            }
        });
        Ok(Box::pin(stream))
    }
}

struct Running {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<Result<(), agentrt_server::ServerError>>,
}

impl Running {
    fn https(&self) -> String {
        format!("https://{}", self.addr)
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.handle).await.unwrap().unwrap();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn start(
    data: &Path,
    tls: TlsSettings,
    auth: AuthConfig,
    gate: Option<Arc<Gate>>,
) -> Running {
    let config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data.to_path_buf(),
        tls,
        auth,
        ..Config::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let mut builder = ServerBuilder::new(config).env_lookup(|_| None);
    if let Some(gate) = gate {
        builder = builder.model_provider("gate", gate);
    }
    let handle = tokio::spawn(builder.serve(listener, async {
        let _ = stopped.await;
    }));
    Running {
        addr,
        stop: Some(stop),
        handle,
    }
}

/// A client of `url` trusting `ca`, with an optional client certificate
/// and bearer key; `Err` when the connection cannot be made.
async fn connect(
    url: &str,
    ca: &str,
    identity: Option<&(String, String)>,
    token: Option<&str>,
) -> Result<Client, agentrt_client::Error> {
    let mut builder = Client::builder(url)
        .ca_pem(ca.as_bytes().to_vec())
        .connect_timeout(Duration::from_secs(10));
    if let Some((cert, key)) = identity {
        builder = builder.identity_pem(cert.as_bytes().to_vec(), key.as_bytes().to_vec());
    }
    if let Some(token) = token {
        builder = builder.token(token);
    }
    builder.connect().await
}

/// Whether any RPC gets through a client built by `client`.
async fn create_session(
    client: impl std::future::Future<Output = Result<Client, agentrt_client::Error>>,
) -> Result<proto::Session, agentrt_client::Error> {
    tokio::time::timeout(Duration::from_secs(30), async {
        client
            .await?
            .create_session(proto::CreateSessionRequest::default())
            .await
    })
    .await
    .expect("the call ended (succeeded or failed) in time")
}

/// The text of a turn and its outcome.
async fn finish(events: &mut agentrt_client::EventStream) -> (String, proto::TurnOutcome) {
    let mut text = String::new();
    while let Some(event) = events.next().await {
        match event.unwrap().kind {
            ChatEvent::Text(t) => text.push_str(&t),
            ChatEvent::TurnFinished { outcome, .. } => return (text, outcome),
            _ => {}
        }
    }
    panic!("the stream ended without turn_finished; text so far {text:?}");
}

fn status_of(err: agentrt_client::Error) -> tonic::Status {
    match err {
        agentrt_client::Error::Status(s) => s,
        other => panic!("expected a status, got {other}"),
    }
}

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
        mtls: vec![
            MtlsConfig {
                identity: BOB.into(),
                user: "bob".into(),
                admin: false,
            },
            MtlsConfig {
                identity: "carol-by-cn".into(),
                user: "carol".into(),
                admin: false,
            },
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
    assert_eq!(listed, [bobs.session_id.clone()]);

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
    server.stop().await;
}

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

    gate.permits.add_permits(1);
    let (text, outcome) = finish(&mut events).await;
    assert_eq!(text, "answer");
    assert_eq!(outcome, proto::TurnOutcome::Success);
    server.stop().await;
}

fn text_request(session_id: &str, text: &str) -> proto::ChatRequest {
    proto::ChatRequest {
        session_id: session_id.to_owned(),
        content: vec![proto::ContentBlock {
            block: Some(proto::content_block::Block::Text(proto::TextBlock {
                text: text.to_owned(),
            })),
        }],
        ..Default::default()
    }
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
