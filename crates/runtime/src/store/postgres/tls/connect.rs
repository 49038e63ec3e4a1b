//! tokio-postgres's TLS hooks over tokio-rustls: [`Connector`] makes one
//! handshake per connection with the store's client configuration, naming
//! the URL's host (or IP address) for verification and SNI, and the
//! stream gives tokio-postgres the `tls-server-end-point` channel binding
//! (RFC 5929), so SCRAM logins can bind to the TLS session
//! (`channel_binding=require` in the URL).
//!
//! Written here rather than taken from `tokio-postgres-rustls`: the modes
//! need their own verifiers anyway (`verify-ca` checks the chain but not
//! the name), and this keeps the crypto provider the workspace chose
//! (ring) with no further dependency.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use sha2::Digest as _;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::Socket;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// Makes the TLS handshakes of a store's connections (cheap to clone).
#[derive(Clone)]
pub(in crate::store::postgres) struct Connector {
    config: Arc<rustls::ClientConfig>,
}

impl Connector {
    pub(super) fn new(config: Arc<rustls::ClientConfig>) -> Self {
        Self { config }
    }
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector").finish_non_exhaustive()
    }
}

/// Why a TLS connection could not be made: a setting to fix, not a
/// network fault (those stay [`io::Error`]s, which the store reports as
/// unavailable).
#[derive(Debug)]
pub(in crate::store::postgres) enum TlsError {
    /// The URL's host is neither a DNS name nor an IP address.
    Name(String),
    /// The handshake was refused, by rustls (a certificate that does not
    /// verify) or by the server (an alert).
    Refused(rustls::Error),
}

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use rustls::CertificateError;
        match self {
            Self::Name(host) => write!(
                f,
                "the host {host:?} cannot be checked against a certificate"
            ),
            Self::Refused(
                e @ rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
            ) => {
                write!(
                    f,
                    "the server's certificate is not signed by a trusted CA ({e})"
                )
            }
            Self::Refused(
                e @ rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                ),
            ) => write!(
                f,
                "the server's certificate does not name the URL's host ({e})"
            ),
            Self::Refused(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for TlsError {}

/// What a handshake fails with: a [`TlsError`] or an [`io::Error`].
type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl MakeTlsConnect<Socket> for Connector {
    type Stream = Tls;
    type TlsConnect = Handshake;
    type Error = TlsError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Handshake, TlsError> {
        let name = ServerName::try_from(domain.to_owned())
            .map_err(|_| TlsError::Name(domain.to_owned()))?;
        Ok(Handshake {
            config: Arc::clone(&self.config),
            name,
        })
    }
}

/// One connection's handshake.
pub(in crate::store::postgres) struct Handshake {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
}

impl TlsConnect<Socket> for Handshake {
    type Stream = Tls;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Tls, BoxError>> + Send>>;

    fn connect(self, socket: Socket) -> Self::Future {
        Box::pin(async move {
            let connector = tokio_rustls::TlsConnector::from(self.config);
            match connector.connect(self.name, socket).await {
                Ok(stream) => Ok(Tls(stream)),
                Err(e) => {
                    let refused = e
                        .get_ref()
                        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                        .cloned();
                    Err(match refused {
                        Some(refused) => BoxError::from(TlsError::Refused(refused)),
                        None => BoxError::from(e),
                    })
                }
            }
        })
    }
}

/// A connection over TLS.
pub(in crate::store::postgres) struct Tls(tokio_rustls::client::TlsStream<Socket>);

impl TlsStream for Tls {
    fn channel_binding(&self) -> ChannelBinding {
        self.0
            .get_ref()
            .1
            .peer_certificates()
            .and_then(<[_]>::first)
            .and_then(|cert| end_point_hash(cert))
            .map_or_else(ChannelBinding::none, ChannelBinding::tls_server_end_point)
    }
}

impl AsyncRead for Tls {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tls {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

/// `tls-server-end-point` of the server's certificate (RFC 5929 §4.1):
/// its hash with the hash function of its signature algorithm, SHA-256
/// for MD5 and SHA-1. `None` for algorithms without one (Ed25519,
/// RSA-PSS): SCRAM then runs without binding, as with libpq.
fn end_point_hash(cert: &[u8]) -> Option<Vec<u8>> {
    // Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm
    // AlgorithmIdentifier ::= SEQUENCE { algorithm OID, … }, signature }
    let (certificate, _) = der(cert, SEQUENCE)?;
    let (_tbs, rest) = der(certificate, SEQUENCE)?;
    let (algorithm, _) = der(rest, SEQUENCE)?;
    let (oid, _) = der(algorithm, OID)?;
    let hash = match oid {
        // md5WithRSA, sha1WithRSA, sha256WithRSA; ecdsa-with-SHA1, -SHA256
        RSA_MD5 | RSA_SHA1 | RSA_SHA256 | ECDSA_SHA1 | ECDSA_SHA256 => {
            sha2::Sha256::digest(cert).to_vec()
        }
        RSA_SHA384 | ECDSA_SHA384 => sha2::Sha384::digest(cert).to_vec(),
        RSA_SHA512 | ECDSA_SHA512 => sha2::Sha512::digest(cert).to_vec(),
        _ => return None,
    };
    Some(hash)
}

const SEQUENCE: u8 = 0x30;
const OID: u8 = 0x06;
// The OIDs' DER contents (1.2.840.113549.1.1.x and 1.2.840.10045.4.x).
const RSA_MD5: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x04];
const RSA_SHA1: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x05];
const RSA_SHA256: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b];
const RSA_SHA384: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c];
const RSA_SHA512: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d];
const ECDSA_SHA1: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01];
const ECDSA_SHA256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];
const ECDSA_SHA384: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03];
const ECDSA_SHA512: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04];

/// The contents of the DER element of tag `tag` at the start of `input`,
/// and what follows it. Definite lengths up to four bytes.
fn der(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&first, rest) = input.split_first()?;
    if first != tag {
        return None;
    }
    let (&len, rest) = rest.split_first()?;
    let (len, rest) = if len < 0x80 {
        (usize::from(len), rest)
    } else {
        let n = usize::from(len & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (bytes, rest) = rest.split_at(n);
        let len = bytes
            .iter()
            .fold(0_usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, rest)
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(alg: &'static rcgen::SignatureAlgorithm) -> Vec<u8> {
        let key = rcgen::KeyPair::generate_for(alg).unwrap();
        rcgen::CertificateParams::new(vec!["db.test".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap()
            .der()
            .to_vec()
    }

    #[test]
    fn the_end_point_hash_follows_the_signature_algorithm() {
        let p256 = cert(&rcgen::PKCS_ECDSA_P256_SHA256);
        assert_eq!(
            end_point_hash(&p256),
            Some(sha2::Sha256::digest(&p256).to_vec())
        );
        let p384 = cert(&rcgen::PKCS_ECDSA_P384_SHA384);
        assert_eq!(
            end_point_hash(&p384),
            Some(sha2::Sha384::digest(&p384).to_vec())
        );
        let ed25519 = cert(&rcgen::PKCS_ED25519);
        assert_eq!(end_point_hash(&ed25519), None);
        assert_eq!(end_point_hash(&p256[..40]), None, "a truncated certificate");
        assert_eq!(end_point_hash(b""), None);
    }
}
