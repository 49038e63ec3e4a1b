//! Certificates made up per test (rcgen), the server's TLS files, an
//! in-process server, and clients of it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentrt_client::{ChatEvent, Client, proto};
use agentrt_server::config::{AuthConfig, TlsSettings};
use agentrt_server::{Config, ServerBuilder};
pub(crate) use agentrt_testkit::gate::GateProvider as Gate;
use agentrt_testkit::server::InProcessServer;
use futures::StreamExt as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A certificate authority made up for one test.
pub(crate) struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pub(crate) pem: String,
}

impl Ca {
    pub(crate) fn new(name: &str) -> Self {
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
    pub(crate) fn leaf(
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

    pub(crate) fn server(&self, cn: &str) -> (String, String) {
        self.leaf(
            vec![
                SanType::DnsName("localhost".try_into().unwrap()),
                SanType::IpAddress([127, 0, 0, 1].into()),
            ],
            cn,
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    pub(crate) fn client_uri(&self, uri: &str) -> (String, String) {
        self.leaf(
            vec![SanType::URI(uri.try_into().unwrap())],
            "ignored-cn",
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    pub(crate) fn client_cn(&self, cn: &str) -> (String, String) {
        self.leaf(Vec::new(), cn, ExtendedKeyUsagePurpose::ClientAuth)
    }
}

/// The server's TLS files in a temporary directory.
pub(crate) struct Files {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
    pub(crate) client_ca: PathBuf,
}

impl Files {
    pub(crate) fn new(dir: &Path, (cert, key): &(String, String)) -> Self {
        let files = Self {
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
            client_ca: dir.join("clients-ca.pem"),
        };
        files.replace((cert, key));
        files
    }

    pub(crate) fn replace(&self, (cert, key): (&str, &str)) {
        std::fs::write(&self.cert, cert).unwrap();
        std::fs::write(&self.key, key).unwrap();
    }

    pub(crate) fn settings(&self, mtls: bool) -> TlsSettings {
        TlsSettings {
            cert: Some(self.cert.clone()),
            key: Some(self.key.clone()),
            client_ca: mtls.then(|| self.client_ca.clone()),
        }
    }
}

/// The in-process server of a test, serving TLS.
pub(crate) struct Running {
    pub(crate) addr: SocketAddr,
    server: InProcessServer,
}

impl Running {
    pub(crate) fn https(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub(crate) async fn stop(self) {
        self.server.stop().await;
    }
}

pub(crate) async fn start(
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
    let mut builder = ServerBuilder::new(config).env_lookup(|_| None);
    if let Some(gate) = gate {
        builder = builder.model_provider("gate", gate);
    }
    let server = InProcessServer::start(builder).await;
    Running {
        addr: server.addr(),
        server,
    }
}

/// A client of `url` trusting `ca`, with an optional client certificate
/// and bearer key; `Err` when the connection cannot be made.
pub(crate) async fn connect(
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
pub(crate) async fn create_session(
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
pub(crate) async fn finish(
    events: &mut agentrt_client::EventStream,
) -> (String, proto::TurnOutcome) {
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

pub(crate) fn status_of(err: agentrt_client::Error) -> tonic::Status {
    match err {
        other if other.status().is_some() => other.status().cloned().expect("a status"),
        other => panic!("expected a status, got {other}"),
    }
}

pub(crate) fn text_request(session_id: &str, text: &str) -> proto::ChatRequest {
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
