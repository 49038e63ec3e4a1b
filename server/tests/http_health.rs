//! `/readyz` and `/livez` on the metrics listener (docs/contract.md §8):
//! the binary serving TLS on its gRPC port, where kubelet's gRPC probes
//! cannot reach it, and plain HTTP on its metrics port, where HTTP probes
//! can. Readiness follows an admin Drain as the gRPC `readiness` service
//! does; liveness stays up through it.

use std::process::Stdio;
use std::time::{Duration, Instant};

use agentrt_client::Client;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::process::Command;

const WAIT: Duration = Duration::from_secs(60);
const ADMIN_KEY: &str = "admin-key-http-health-01";

/// (CA PEM, server certificate PEM, server key PEM) for 127.0.0.1.
fn certificates() -> (String, String, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "health ca");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf.subject_alt_names = vec![SanType::IpAddress([127, 0, 0, 1].into())];
    leaf.distinguished_name.push(DnType::CommonName, "server");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    (ca_pem, cert.pem(), key.serialize_pem())
}

/// The status code and body of `GET url`.
async fn get(http: &reqwest::Client, url: &str) -> (u16, String) {
    let answer = http.get(url).send().await.unwrap();
    let status = answer.status().as_u16();
    (status, answer.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_turns_503_on_an_admin_drain_under_tls_while_livez_stays_200() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates();
    std::fs::write(dir.path().join("server.pem"), &cert).unwrap();
    std::fs::write(dir.path().join("server.key"), &key).unwrap();
    let config = dir.path().join("agentrt.toml");
    std::fs::write(
        &config,
        format!(
            "default_model = \"builtin/echo\"\n\
             [[auth.api_keys]]\nkey = \"{ADMIN_KEY}\"\nuser = \"ops\"\nadmin = true\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentrt-server"))
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--config")
        .arg(&config)
        .arg("--tls-cert")
        .arg(dir.path().join("server.pem"))
        .arg("--tls-key")
        .arg(dir.path().join("server.key"))
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_METRICS_EXPORTER")
        .env_remove("OTEL_TRACES_EXPORTER")
        .env("AGENTRT_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let stderr = tokio::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        text
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = async || {
        tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("a line on stdout in time")
            .unwrap()
            .expect("a line on stdout")
    };
    let line = next().await;
    let grpc = line
        .strip_prefix("agentrt-server listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    let line = next().await;
    let metrics = line
        .strip_prefix("agentrt-server metrics on http://")
        .and_then(|l| l.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("unexpected second line {line:?}"))
        .to_owned();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let readyz = format!("http://{metrics}/readyz");
    let livez = format!("http://{metrics}/livez");

    // The listening line comes before serving begins: readiness turns
    // SERVING right after it.
    let deadline = Instant::now() + WAIT;
    let mut ready = get(&http, &readyz).await;
    while ready.0 != 200 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        ready = get(&http, &readyz).await;
    }
    assert_eq!(ready, (200, "ready\n".to_owned()));
    assert_eq!(get(&http, &livez).await, (200, "live\n".to_owned()));
    // The gRPC port speaks TLS only; the probe routes are plain HTTP.
    let plaintext = http.get(format!("http://{grpc}/readyz")).send().await;
    assert!(
        !plaintext.is_ok_and(|r| r.status().is_success()),
        "the TLS port answered plaintext HTTP"
    );

    let admin = Client::builder(format!("https://{grpc}"))
        .ca_pem(ca.into_bytes())
        .token(ADMIN_KEY)
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    assert_eq!(admin.drain(Some(Duration::from_secs(5))).await.unwrap(), 0);
    // The gRPC health service and the HTTP route read the same phase,
    // which a watcher of the drain sets just after the call returns.
    let deadline = Instant::now() + WAIT;
    let mut ready = get(&http, &readyz).await;
    while ready.0 == 200 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        ready = get(&http, &readyz).await;
    }
    assert_eq!(ready, (503, "not ready\n".to_owned()));
    assert_eq!(get(&http, &livez).await, (200, "live\n".to_owned()));
    let (status, _) = get(&http, &format!("http://{metrics}/metrics")).await;
    assert_eq!(status, 200);

    child.start_kill().unwrap();
    let _ = child.wait().await;
    let stderr = stderr.await.unwrap();
    assert!(!stderr.contains("panicked"), "{stderr}");
}
