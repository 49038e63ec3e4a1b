//! The certificate checks rustls does not have built in: `verify-ca`
//! (the chain, not the name) and none at all (`prefer`, `require`). Both
//! still check the handshake's signature with the certificate's key.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

/// A verifier that never checks the name: with roots (`verify-ca`) the
/// chain must lead to one of them; without (`prefer`, `require`) any
/// certificate is accepted. The handshake's signature is checked either
/// way, so the server holds the key of the certificate it showed (which
/// channel binding relies on).
#[derive(Debug)]
pub(super) struct NameUnchecked {
    roots: Option<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl NameUnchecked {
    /// `verify-ca`: the chain must lead to one of `roots`.
    pub(super) fn chain_only(roots: RootCertStore, provider: &CryptoProvider) -> Self {
        Self {
            roots: Some(roots),
            algorithms: provider.signature_verification_algorithms,
        }
    }

    /// `prefer` and `require`: any certificate.
    pub(super) fn unverified(provider: &CryptoProvider) -> Self {
        Self {
            roots: None,
            algorithms: provider.signature_verification_algorithms,
        }
    }
}

impl ServerCertVerifier for NameUnchecked {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &cert,
                roots,
                intermediates,
                now,
                self.algorithms.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
