//! Connection failures say what happened and where, and configurations
//! that would send a call the wrong way are refused before anything is
//! sent.

use agentrt_client::{Client, Error};
use tokio::io::AsyncWriteExt as _;

/// A loopback port nothing listens on (bound, then released).
async fn closed_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test]
async fn a_refused_connection_names_the_url_and_the_cause() {
    let url = format!("http://127.0.0.1:{}", closed_port().await);
    let err = Client::connect(url.clone()).await.unwrap_err();
    let Error::Connect { url: named, cause } = &err else {
        panic!("expected Connect, got {err:?}");
    };
    assert_eq!(named, &url);
    assert!(
        cause.to_lowercase().contains("refused"),
        "the cause is named: {cause}"
    );
    let text = err.to_string();
    eprintln!("{text}");
    assert!(text.contains(&url) && text.contains("refused"), "{text}");
    assert_ne!(cause, "transport error");
}

#[tokio::test]
async fn a_url_without_a_scheme_is_refused_with_the_fix() {
    let err = Client::connect("127.0.0.1:50051").await.unwrap_err();
    let Error::Config(message) = &err else {
        panic!("expected Config, got {err:?}");
    };
    assert!(message.contains("no scheme"), "{message}");
    assert!(message.contains("http://127.0.0.1:50051"), "{message}");
    let err = Client::connect("ftp://127.0.0.1:1").await.unwrap_err();
    assert!(
        matches!(&err, Error::Config(m) if m.contains("\"ftp\"")),
        "{err:?}"
    );
}

#[tokio::test]
async fn https_without_system_roots_or_a_ca_is_refused_not_sent_as_plaintext() {
    let err = Client::builder("https://127.0.0.1:1")
        .token("secret")
        .system_roots(false)
        .connect()
        .await
        .unwrap_err();
    let Error::Config(message) = &err else {
        panic!("expected Config, got {err:?}");
    };
    assert!(
        message.contains("https://") && message.contains("--ca"),
        "{message}"
    );
}

#[tokio::test]
async fn a_token_goes_in_plaintext_only_to_loopback() {
    // Refused before any connection is tried (no traffic leaves the host).
    let err = Client::builder("http://10.255.255.1:50051")
        .token("secret")
        .connect()
        .await
        .unwrap_err();
    let Error::Config(message) = &err else {
        panic!("expected Config, got {err:?}");
    };
    assert!(message.contains("plaintext"), "{message}");
    assert!(message.contains("--insecure"), "{message}");
    assert!(!message.contains("secret"), "the token is not echoed");
    // To loopback it is allowed: the error is then about connecting.
    for host in ["127.0.0.1", "localhost"] {
        let url = format!("http://{host}:{}", closed_port().await);
        let err = Client::builder(url)
            .token("secret")
            .connect()
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Connect { .. }), "{host}: {err:?}");
    }
}

#[tokio::test]
async fn a_failed_tls_handshake_is_named() {
    // Not a TLS server: it answers the ClientHello with plain text.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        if let Ok((mut socket, _)) = listener.accept().await {
            let _ = socket.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        }
    });
    let ca = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let url = format!("https://localhost:{port}");
    let err = Client::builder(url.clone())
        .ca_pem(ca.cert.pem())
        .connect()
        .await
        .unwrap_err();
    let Error::Connect { url: named, cause } = &err else {
        panic!("expected Connect, got {err:?}");
    };
    assert_eq!(named, &url);
    eprintln!("{err}");
    assert_ne!(cause, "transport error");
    assert!(
        cause.contains("TLS handshake failed") && cause.contains("corrupt message"),
        "the handshake is named: {cause}"
    );
    server.await.unwrap();
}
