//! mTLS between replicas: with `[tls]`, calls for a live turn reach its
//! owner over https with the replicas' own certificates, and the internal
//! listener refuses a plaintext client, a client without a certificate and
//! one whose certificate another CA issued — before the cluster key is
//! even looked at.

use std::path::Path;
use std::time::Duration;

use agentrt_client::proto;
use agentrt_proto::v1::runtime_admin_client::RuntimeAdminClient;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use super::harness::{
    Cluster, Tls, finish, is_text, outcome, read_until, scrape, serial, series, text_request,
};

const A: usize = 0;
const B: usize = 1;

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

    /// (certificate PEM, key PEM) of a replica's certificate for `sans`:
    /// server and client use, as a cert-manager Certificate with both
    /// usages gives.
    fn replica(&self, sans: Vec<SanType>) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = sans;
        params
            .distinguished_name
            .push(DnType::CommonName, "agentrt");
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn loopback() -> SanType {
    SanType::IpAddress([127, 0, 0, 1].into())
}

/// The replicas' `[tls]` files in `dir`: one certificate for `sans`.
fn files(dir: &Path, ca: &Ca, sans: Vec<SanType>) -> Tls {
    let (cert, key) = ca.replica(sans);
    let tls = Tls {
        cert: dir.join("replica.pem"),
        key: dir.join("replica.key"),
        ca: dir.join("ca.pem"),
        ca_pem: ca.pem.clone(),
        server_name: None,
        client_domain: None,
    };
    std::fs::write(&tls.cert, cert).unwrap();
    std::fs::write(&tls.key, key).unwrap();
    std::fs::write(&tls.ca, &ca.pem).unwrap();
    tls
}

/// A's live turn seen and stopped through B (both forwarded to A), and B
/// counted the forwarded calls.
async fn stop_through_the_other_replica(cluster: &Cluster) {
    let session = cluster.session().await;
    let mut events = cluster
        .client(A)
        .chat_with(text_request(&session, "hold mtls 2"))
        .await
        .unwrap();
    read_until(&mut events, Duration::from_secs(10), is_text).await;
    let status = cluster.client(B).session_status(&session).await.unwrap();
    assert!(status.live, "B sees A's live turn: {status:?}");
    assert!(
        cluster.client(B).stop_session(&session).await.unwrap(),
        "B's Stop reached the live turn on A"
    );
    let rest = finish(events, Duration::from_secs(10)).await;
    assert_eq!(
        outcome(&rest),
        Some((proto::TurnOutcome::Canceled, proto::CancelReason::Stopped))
    );
    let metrics = scrape(&cluster.replica(B).metrics_addr).await;
    let forwarded = series(&metrics, "agentrt_cluster_forwarded_total{outcome=\"ok\"}");
    assert!(
        forwarded.is_some_and(|n| n >= 2.0),
        "B forwarded the status and the stop: {forwarded:?}"
    );
}

#[tokio::test]
async fn two_replicas_with_tls_forward_a_live_turns_calls_over_mtls() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("agentrt cluster test ca");
    // The certificate names the host of the advertised URL.
    let tls = files(dir.path(), &ca, vec![loopback()]);
    let Some(cluster) = Cluster::start_tls(2, tls).await else {
        return;
    };
    stop_through_the_other_replica(&cluster).await;
}

#[tokio::test]
async fn replicas_sharing_a_certificate_for_one_name_forward_with_server_name() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("agentrt cluster test ca");
    // Not the advertised host (127.0.0.1): only the name every replica's
    // certificate carries, as pods advertising their IPs do.
    let name = "replicas.agentrt.test";
    let mut tls = files(
        dir.path(),
        &ca,
        vec![SanType::DnsName(name.try_into().unwrap())],
    );
    tls.server_name = Some(name.to_owned());
    tls.client_domain = Some(name.to_owned());
    let Some(cluster) = Cluster::start_tls(2, tls).await else {
        return;
    };
    stop_through_the_other_replica(&cluster).await;
}

/// What a call on an internal listener gets over `endpoint` (no cluster
/// key, no principal): its status code, whether this side's transport
/// made the status (the connection failed) rather than the server, and
/// all of it for messages.
async fn internal_call(endpoint: Endpoint) -> (tonic::Code, bool, String) {
    let channel = endpoint
        .connect_timeout(Duration::from_secs(10))
        .connect_lazy();
    let mut admin = RuntimeAdminClient::new(channel);
    let call = admin.get_runtime_stats(proto::GetRuntimeStatsRequest {});
    let status = tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("the call ended in time")
        .expect_err("no call without the cluster key gets through");
    let transport = std::error::Error::source(&status).is_some();
    (status.code(), transport, format!("{status:?}"))
}

fn https(addr: &str, tls: ClientTlsConfig) -> Endpoint {
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
}

#[tokio::test]
async fn the_replica_port_refuses_plaintext_certificateless_and_foreign_clients() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("agentrt cluster test ca");
    let tls = files(dir.path(), &ca, vec![loopback()]);
    let Some(cluster) = Cluster::start_tls(1, tls.clone()).await else {
        return;
    };
    let addr = cluster.replica(A).cluster_addr.clone();
    let trusting = || ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca.pem));

    // With the replicas' own certificate the connection is made and the
    // key check answers: what the others get must come before it.
    let replica = Identity::from_pem(
        std::fs::read(&tls.cert).unwrap(),
        std::fs::read(&tls.key).unwrap(),
    );
    let (code, transport, said) = internal_call(https(&addr, trusting().identity(replica))).await;
    assert_eq!(code, tonic::Code::Unauthenticated, "{said}");
    assert!(!transport && said.contains("cluster key"), "{said}");

    let stranger = Ca::new("another ca").replica(vec![loopback()]);
    let foreign = Identity::from_pem(stranger.0, stranger.1);
    for (what, endpoint) in [
        (
            "plaintext",
            Endpoint::from_shared(format!("http://{addr}")).unwrap(),
        ),
        ("TLS without a client certificate", https(&addr, trusting())),
        (
            "a client certificate of another CA",
            https(&addr, trusting().identity(foreign)),
        ),
    ] {
        let (code, transport, said) = internal_call(endpoint).await;
        // The connection fails (how it looks depends on when the client
        // notices: a handshake alert, a broken pipe, a TLS record read as
        // a bad HTTP/2 frame); the server never answers a call.
        assert!(
            transport,
            "{what}: refused by the transport, not answered ({code:?}): {said}"
        );
        assert!(!said.contains("cluster key"), "{what}: {said}");
    }
    // The listener still serves replicas after refusing those.
    let replica = Identity::from_pem(
        std::fs::read(&tls.cert).unwrap(),
        std::fs::read(&tls.key).unwrap(),
    );
    let (code, _, _) = internal_call(https(&addr, trusting().identity(replica))).await;
    assert_eq!(code, tonic::Code::Unauthenticated);
}
