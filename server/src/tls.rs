//! TLS on the gRPC listener: the rustls server configuration built from the
//! `[tls]` files, reloaded when they change, and the names (URI SANs,
//! subject CN) of a verified client certificate. The internal listener of
//! `[cluster]` gets material of its own from the same certificate
//! ([`ServerTls::for_cluster`]): mTLS against the cluster's CA, with the
//! forwarder's client side built from the same files.
//!
//! The handshake itself runs in our accept loop ([`crate::transport`]),
//! inside its handshake timeout and connection caps, so the HTTP/2 preface
//! check sees the decrypted stream. Each accepted connection asks
//! [`ServerTls::config`] for the material to use: that call compares the
//! files' length, modification time and inode with what was loaded (three
//! `stat`s, negligible next to the handshake itself) and rebuilds the
//! configuration when one changed; SIGHUP forces a rebuild. A rebuild that
//! fails (a half-written file, bad PEM, a key that does not match) keeps
//! the old material and logs a warning naming the file, never its content.
//! Connections already open keep the configuration they were accepted with.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use crate::config::{ConfigError, TlsSettings};

/// The names of a verified client certificate that `[[auth.mtls]]` can map
/// to a user: its URI SANs (e.g. a SPIFFE id) and its subject CN, kept
/// apart so that a CN spelled like a URI is never taken for one. Attached
/// to every request of the connection (see [`crate::transport::ConnInfo`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientCertificate {
    /// The URI SANs, in the certificate's order.
    pub uris: Vec<String>,
    /// The (last, most specific) subject CN, when it is text.
    pub common_name: Option<String>,
}

impl ClientCertificate {
    /// Reads the names of a (verified) end-entity certificate.
    pub fn from_der(cert: &CertificateDer<'_>) -> Self {
        webpki::EndEntityCert::try_from(cert)
            .map(|ee| Self {
                uris: ee.valid_uri_names().map(str::to_owned).collect(),
                common_name: common_name(ee.subject()),
            })
            .unwrap_or_default()
    }
}

/// One DER element: (tag, contents, what follows). Only what certificate
/// names use: single-byte tags, definite lengths up to 4 bytes.
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    if tag & 0x1f == 0x1f {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// The last (most specific) commonName of an X.509 Name's contents (the
/// RDN sequence without its outer SEQUENCE header), when it is text.
fn common_name(mut rdns: &[u8]) -> Option<String> {
    const SET: u8 = 0x31;
    const SEQUENCE: u8 = 0x30;
    const OID: u8 = 0x06;
    const CN: &[u8] = &[0x55, 0x04, 0x03];
    // UTF8String, PrintableString, IA5String.
    const TEXT: [u8; 3] = [0x0c, 0x13, 0x16];
    let mut found = None;
    while !rdns.is_empty() {
        let (tag, mut set, rest) = der_element(rdns)?;
        rdns = rest;
        if tag != SET {
            return None;
        }
        while !set.is_empty() {
            let (tag, attribute, rest) = der_element(set)?;
            set = rest;
            if tag != SEQUENCE {
                return None;
            }
            let (tag, oid, value) = der_element(attribute)?;
            if tag != OID || oid != CN {
                continue;
            }
            let (tag, text, _) = der_element(value)?;
            if TEXT.contains(&tag) {
                found = std::str::from_utf8(text).ok().map(str::to_owned);
            }
        }
    }
    found
}

/// What identifies a file's version without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
    inode: u64,
}

/// The file's length, modification time and inode; `None` when it cannot
/// be looked at.
pub(crate) fn stamp(path: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let inode = 0;
    Some(Stamp {
        len: meta.len(),
        modified: meta.modified().ok(),
        inode,
    })
}

/// What a [`ServerTls`] serves.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Role {
    /// The public gRPC listener: client certificates are required and
    /// verified against `client_ca` when it is set.
    Public,
    /// The internal listener of `[cluster]`: client certificates are
    /// always required, chained to `client_ca` (the cluster's CA); and the
    /// forwarder's side is built from the same files — this replica's
    /// certificate as its client certificate, the cluster's CA as the only
    /// trust root, other replicas' certificates verified for `server_name`
    /// (or the host of their advertised URL).
    Cluster { server_name: Option<String> },
}

/// The files the material is read from.
#[derive(Debug)]
struct Files {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
    role: Role,
}

/// The files' contents, read once per build so that both sides of the
/// cluster's material come from the same version of them.
struct Pems {
    chain: Vec<CertificateDer<'static>>,
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<(Vec<u8>, Vec<CertificateDer<'static>>)>,
}

impl Files {
    fn stamps(&self) -> Vec<Option<Stamp>> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(|p| stamp(p))
            .collect()
    }

    /// What the CA file is called in errors.
    fn ca_name(&self) -> &'static str {
        match self.role {
            Role::Public => "TLS client CA file",
            Role::Cluster { .. } => "cluster CA file",
        }
    }

    fn read(&self) -> Result<Pems, ConfigError> {
        let cert = read_file(&self.cert, "TLS certificate file")?;
        let chain = parse_certs(&cert, &self.cert, "TLS certificate file")?;
        let key = read_file(&self.key, "TLS key file")?;
        let client_ca = match &self.client_ca {
            Some(path) => {
                let pem = read_file(path, self.ca_name())?;
                let certs = parse_certs(&pem, path, self.ca_name())?;
                Some((pem, certs))
            }
            None => None,
        };
        Ok(Pems {
            chain,
            cert,
            key,
            client_ca,
        })
    }

    fn build(&self) -> Result<Material, ConfigError> {
        let pems = self.read()?;
        let server = Arc::new(self.server_config(&pems)?);
        let client = match &self.role {
            Role::Public => None,
            Role::Cluster { server_name } => {
                let (ca, _) = pems.client_ca.as_ref().ok_or_else(|| {
                    ConfigError("the cluster's TLS needs the cluster's CA file".to_owned())
                })?;
                let mut client = tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(ca))
                    .identity(tonic::transport::Identity::from_pem(&pems.cert, &pems.key));
                if let Some(name) = server_name {
                    client = client.domain_name(name.clone());
                }
                Some(client)
            }
        };
        Ok(Material { server, client })
    }

    fn server_config(&self, pems: &Pems) -> Result<rustls::ServerConfig, ConfigError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let private = PrivateKeyDer::from_pem_slice(&pems.key).map_err(|e| {
            ConfigError(format!(
                "TLS key file {} {} (expected PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)",
                self.key.display(),
                pem_problem(&e)
            ))
        })?;
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| ConfigError(format!("TLS: {e}")))?;
        let builder = match (&self.client_ca, &pems.client_ca) {
            (Some(path), Some((_, certs))) => {
                let what = self.ca_name();
                let mut roots = RootCertStore::empty();
                for ca in certs.iter().cloned() {
                    roots.add(ca).map_err(|e| {
                        ConfigError(format!(
                            "{what} {}: not a usable CA certificate: {e}",
                            path.display()
                        ))
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| ConfigError(format!("{what} {}: {e}", path.display())))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(pems.chain.clone(), private)
            .map_err(|e| {
                ConfigError(format!(
                    "TLS certificate {} and key {} cannot be used together: {e}",
                    self.cert.display(),
                    self.key.display()
                ))
            })?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }
}

/// The material of a [`ServerTls`] as built from one version of its files.
#[derive(Debug)]
pub struct Material {
    server: Arc<rustls::ServerConfig>,
    /// The forwarder's side (the internal listener's material only).
    client: Option<tonic::transport::ClientTlsConfig>,
}

impl Material {
    /// How the forwarder connects to other replicas: https with this
    /// replica's certificate, trusting the cluster's CA only. `None` for
    /// the public listener's material.
    pub fn client(&self) -> Option<&tonic::transport::ClientTlsConfig> {
        self.client.as_ref()
    }
}

/// The TLS material of a listener, reloaded when its files change.
#[derive(Debug)]
pub struct ServerTls {
    files: Files,
    current: RwLock<Arc<Material>>,
    /// The files' stamps when last looked at (loaded or failed to load);
    /// also serialises reloads.
    seen: Mutex<Vec<Option<Stamp>>>,
}

fn read_file(path: &Path, what: &str) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path)
        .map_err(|e| ConfigError(format!("cannot read {what} {}: {e}", path.display())))
}

/// A PEM error described without the file's content.
fn pem_problem(err: &rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error;
    match err {
        Error::NoItemsFound => "holds no such PEM section".to_owned(),
        Error::MissingSectionEnd { .. } => "has a PEM section without its END line".to_owned(),
        Error::IllegalSectionStart { .. } => "has a malformed PEM BEGIN line".to_owned(),
        Error::Base64Decode(_) => "has a PEM section that is not valid base64".to_owned(),
        Error::SectionTooLarge => "has a PEM section over 256 MB".to_owned(),
        Error::Io(e) => format!("cannot be read: {e}"),
        _ => "is not valid PEM".to_owned(),
    }
}

fn parse_certs(
    pem: &[u8],
    path: &Path,
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ConfigError(format!("{what} {} {}", path.display(), pem_problem(&e))))?;
    if certs.is_empty() {
        return Err(ConfigError(format!(
            "{what} {} holds no PEM CERTIFICATE",
            path.display()
        )));
    }
    Ok(certs)
}

impl ServerTls {
    /// Loads the files of `settings`; `None` when TLS is off. Errors name
    /// the file.
    pub fn from_settings(settings: &TlsSettings) -> Result<Option<Self>, ConfigError> {
        let (Some(cert), Some(key)) = (&settings.cert, &settings.key) else {
            return Ok(None);
        };
        Self::load(Files {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: settings.client_ca.clone(),
            role: Role::Public,
        })
        .map(Some)
    }

    /// The material of the internal listener of `[cluster]` (see the
    /// module docs of `config::cluster`): the certificate and key of
    /// `settings`, client certificates required and chained to `ca`, and
    /// the forwarder's side ([`Material::client`]) verifying other
    /// replicas for `server_name` (default: the host of their advertised
    /// URL). `None` when TLS is off. Errors name the file.
    pub fn for_cluster(
        settings: &TlsSettings,
        ca: &Path,
        server_name: Option<&str>,
    ) -> Result<Option<Self>, ConfigError> {
        let (Some(cert), Some(key)) = (&settings.cert, &settings.key) else {
            return Ok(None);
        };
        Self::load(Files {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: Some(ca.to_path_buf()),
            role: Role::Cluster {
                server_name: server_name.map(str::to_owned),
            },
        })
        .map(Some)
    }

    fn load(files: Files) -> Result<Self, ConfigError> {
        // Stamped before reading, like every reload.
        let seen = Mutex::new(files.stamps());
        let current = RwLock::new(Arc::new(files.build()?));
        Ok(Self {
            files,
            current,
            seen,
        })
    }

    /// Whether client certificates are required (mTLS).
    pub fn requires_client_certificates(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// The configuration for a new connection, reloaded first when a file
    /// changed since it was last looked at.
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        Arc::clone(&self.material().server)
    }

    /// The current material, reloaded first when a file changed since it
    /// was last looked at. A reload makes a new [`Material`]: the same one
    /// (`Arc::ptr_eq`) means the same files.
    pub fn material(&self) -> Arc<Material> {
        // A connection accepted while another one reloads uses what is
        // loaded; the next one sees the result.
        if let Ok(mut seen) = self.seen.try_lock() {
            let now = self.files.stamps();
            if *seen != now {
                // Stamped before reading: a change made while reading is
                // seen by the next connection.
                *seen = now;
                self.swap("a file changed");
            }
        }
        Arc::clone(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Re-reads the files now (SIGHUP).
    pub fn reload(&self, why: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        *seen = self.files.stamps();
        self.swap(why);
    }

    fn swap(&self, why: &str) {
        let Files {
            cert,
            key,
            client_ca,
            role,
        } = &self.files;
        let listener = match role {
            Role::Public => "public",
            Role::Cluster { .. } => "cluster",
        };
        match self.files.build() {
            Ok(material) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(material);
                tracing::info!(cert = %cert.display(), key = %key.display(),
                    client_ca = ?client_ca, reason = why, listener,
                    "TLS certificate reloaded; new connections use it");
            }
            Err(err) => {
                tracing::warn!(reason = why, error = %err, listener,
                    "TLS certificate reload failed; new connections keep the previous certificate");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_with(sans: Vec<rcgen::SanType>, cn: Option<&str>) -> CertificateDer<'static> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = sans;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "agentrt tests");
        if let Some(cn) = cn {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
        }
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn uri_sans_and_the_common_name_are_read_apart() {
        let spiffe = rcgen::SanType::URI("spiffe://example.org/sa/bob".try_into().unwrap());
        let other = rcgen::SanType::URI("https://example.org/bob".try_into().unwrap());
        let dns = rcgen::SanType::DnsName("bob.example.org".try_into().unwrap());
        let both = cert_with(vec![dns.clone(), spiffe, other], Some("bob-cn"));
        assert_eq!(
            ClientCertificate::from_der(&both),
            ClientCertificate {
                uris: vec![
                    "spiffe://example.org/sa/bob".to_owned(),
                    "https://example.org/bob".to_owned()
                ],
                common_name: Some("bob-cn".to_owned()),
            }
        );
        // A CN spelled like a SPIFFE id is still only a CN.
        let spoof = cert_with(vec![dns], Some("spiffe://example.org/sa/bob"));
        let spoof = ClientCertificate::from_der(&spoof);
        assert!(spoof.uris.is_empty());
        assert_eq!(
            spoof.common_name.as_deref(),
            Some("spiffe://example.org/sa/bob")
        );
        let neither = cert_with(Vec::new(), None);
        assert_eq!(
            ClientCertificate::from_der(&neither),
            ClientCertificate::default()
        );
    }

    #[test]
    fn malformed_names_yield_no_identity_and_never_panic() {
        assert_eq!(common_name(&[]), None);
        for bad in [
            &[0x31][..],
            &[0x31, 0x05, 0x30],
            &[0x31, 0x84, 0xff, 0xff, 0xff, 0xff],
            &[0x1f, 0x00],
            &[0x30, 0x00],
            &[0x31, 0x02, 0x30, 0x7f],
        ] {
            assert_eq!(common_name(bad), None, "{bad:?}");
        }
        let garbage = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x00]);
        assert_eq!(
            ClientCertificate::from_der(&garbage),
            ClientCertificate::default()
        );
    }

    #[test]
    fn bad_files_are_named_in_the_error_without_their_content() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        let settings = TlsSettings {
            cert: Some(cert.clone()),
            key: Some(key.clone()),
            client_ca: None,
        };
        let err = ServerTls::from_settings(&settings).unwrap_err().0;
        assert!(
            err.contains("cert.pem") && err.contains("cannot read"),
            "{err}"
        );
        std::fs::write(&cert, "not a certificate").unwrap();
        let err = ServerTls::from_settings(&settings).unwrap_err().0;
        assert!(
            err.contains("cert.pem") && err.contains("no PEM CERTIFICATE"),
            "{err}"
        );
        let pair = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        std::fs::write(&cert, pair.cert.pem()).unwrap();
        let secret = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1tYXRlcmlhbA!!\n-----END PRIVATE KEY-----\n";
        std::fs::write(&key, secret).unwrap();
        let err = ServerTls::from_settings(&settings).unwrap_err().0;
        assert!(err.contains("key.pem"), "{err}");
        assert!(!err.contains("c2VjcmV0"), "the key's content leaked: {err}");
        let other = rcgen::KeyPair::generate().unwrap();
        std::fs::write(&key, other.serialize_pem()).unwrap();
        let err = ServerTls::from_settings(&settings).unwrap_err().0;
        assert!(err.contains("cannot be used together"), "{err}");
        std::fs::write(&key, pair.signing_key.serialize_pem()).unwrap();
        assert!(ServerTls::from_settings(&settings).unwrap().is_some());

        // The cluster's material: its CA file is named as such.
        let ca = dir.path().join("cluster-ca.pem");
        let err = ServerTls::for_cluster(&settings, &ca, None).unwrap_err().0;
        assert!(
            err.contains("cluster CA file") && err.contains("cluster-ca.pem"),
            "{err}"
        );
        std::fs::write(&ca, pair.cert.pem()).unwrap();
        let cluster = ServerTls::for_cluster(&settings, &ca, Some("replica.test"))
            .unwrap()
            .expect("TLS is on");
        assert!(cluster.requires_client_certificates());
        assert!(cluster.material().client().is_some());
        let public = ServerTls::from_settings(&settings).unwrap().unwrap();
        assert!(public.material().client().is_none());
    }
}
