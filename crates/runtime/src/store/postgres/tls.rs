//! TLS to PostgreSQL: libpq's `sslmode`s over rustls (ring), with the
//! trust roots of a CA file or of the system.
//!
//! The mode and CA come from [`PgTls`] (the server's `[store] tls` and
//! `ca_file`) or from the URL's own `sslmode=` and `sslrootcert=`, as libpq
//! reads them; tokio-postgres knows only `disable`, `prefer` and `require`,
//! so both parameters are taken out of the URL here before it is parsed.
//! What each mode checks:
//!
//! | mode | TLS | certificate chain | host name |
//! |---|---|---|---|
//! | `disable` | never | – | – |
//! | `prefer` (default) | when the server offers it | no | no |
//! | `require` | always | no (yes with a CA file, as libpq) | no |
//! | `verify-ca` | always | yes | no |
//! | `verify-full` | always | yes | yes: a DNS name or IP address SAN |
//!
//! Without verification (`prefer`, `require`) anyone on the path can pose
//! as the server; the connection is only encrypted. A CA given without a
//! mode means `verify-full`. Verification trusts the CA file's
//! certificates, else the system's roots (`rustls-native-certs`). Names
//! are matched against the certificate's subject alternative names only:
//! unlike libpq, a Common Name alone does not match.
//!
//! Submodules: `url` (the `ssl…` parameters of a URL or key=value
//! string), `verify` (the certificate checks of `prefer`, `require` and
//! `verify-ca`; `verify-full` is rustls's own), `connect`
//! (tokio-postgres's `MakeTlsConnect` over tokio-rustls, with
//! `tls-server-end-point` channel binding).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;

mod connect;
mod url;
mod verify;

pub(super) use connect::Connector;
use verify::NameUnchecked;

/// How the store secures its connections: libpq's `sslmode`, by its
/// names (`disable`, `prefer`, `require`, `verify-ca`, `verify-full`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgSslMode {
    /// Plaintext only.
    Disable,
    /// TLS when the server offers it, else plaintext; never verified
    /// (libpq's default, and this store's).
    Prefer,
    /// TLS always, the server unverified: encrypted, but open to a man in
    /// the middle. With a CA file the chain is verified (as `verify-ca`),
    /// as libpq does.
    Require,
    /// TLS, the certificate chain verified against the CA; any host name.
    VerifyCa,
    /// TLS, the chain verified and the certificate naming the URL's host
    /// (DNS name or IP address).
    VerifyFull,
}

impl PgSslMode {
    /// Every mode, weakest first.
    pub const ALL: [Self; 5] = [
        Self::Disable,
        Self::Prefer,
        Self::Require,
        Self::VerifyCa,
        Self::VerifyFull,
    ];

    /// The mode libpq calls `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.as_str() == name)
    }

    /// libpq's name of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }
}

impl std::fmt::Display for PgSslMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// TLS settings given beside the URL. What they leave unset, the URL's
/// `sslmode=` and `sslrootcert=` may set; set in both places they must
/// agree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PgTls {
    /// The mode. Default: the URL's `sslmode`, else `verify-full` when a
    /// CA is given, else `prefer`.
    pub mode: Option<PgSslMode>,
    /// PEM file of the CA certificates to trust (a bundle is fine).
    /// Default: the URL's `sslrootcert`, else the system's roots. Read
    /// when the store connects.
    pub ca_file: Option<PathBuf>,
}

/// Where trusted roots come from, and under which name messages show it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ca {
    /// The system's trust store.
    System,
    /// A PEM file; `key` is the setting that named it.
    File { path: PathBuf, key: &'static str },
}

/// What connecting needs: the URL without the parameters tokio-postgres
/// does not know, the mode, and the connector (none for `disable`).
pub(super) struct Prepared {
    pub(super) url: String,
    pub(super) mode: PgSslMode,
    pub(super) connector: Option<Connector>,
}

/// Settles the mode and CA of `settings` and the URL, and builds the
/// connector, reading the CA file or the system's roots. Errors say which
/// setting is wrong (`tls`, `ca_file`, or the URL's `sslmode` /
/// `sslrootcert`) and name files, never the URL.
pub(super) fn prepare(url: &str, settings: &PgTls) -> Result<Prepared, String> {
    let (url, in_url) = url::take_ssl_params(url)?;
    let url_mode = match in_url.sslmode.as_deref() {
        None => None,
        Some("allow") => {
            return Err(
                "sslmode=allow in the URL is not supported; use disable, prefer, \
                 require, verify-ca or verify-full"
                    .to_owned(),
            );
        }
        Some(name) => Some(PgSslMode::parse(name).ok_or_else(|| {
            format!(
                "sslmode={name} in the URL is not a TLS mode; use disable, prefer, require, \
                 verify-ca or verify-full"
            )
        })?),
    };
    let mode = match (settings.mode, url_mode) {
        (Some(a), Some(b)) if a != b => {
            return Err(format!(
                "tls = \"{a}\" and sslmode={b} in the URL disagree; set one of them"
            ));
        }
        (a, b) => a.or(b),
    };
    let url_ca = in_url.sslrootcert.map(|root| match root.as_str() {
        "system" => Ca::System,
        _ => Ca::File {
            path: PathBuf::from(root),
            key: "sslrootcert (in the URL)",
        },
    });
    let ca = match (&settings.ca_file, url_ca) {
        (Some(file), Some(Ca::File { path, .. })) if *file != path => {
            return Err(format!(
                "ca_file {} and sslrootcert={} in the URL disagree; set one of them",
                file.display(),
                path.display()
            ));
        }
        (Some(_), Some(Ca::System)) => {
            return Err(
                "ca_file and sslrootcert=system in the URL disagree; set one of them".to_owned(),
            );
        }
        (Some(path), _) => Some(Ca::File {
            path: path.clone(),
            key: "ca_file",
        }),
        (None, url_ca) => url_ca,
    };
    let mode = mode.unwrap_or(if ca.is_some() {
        PgSslMode::VerifyFull
    } else {
        PgSslMode::Prefer
    });
    match (&ca, mode) {
        (Some(Ca::System), PgSslMode::VerifyFull) | (None, _) => {}
        (Some(Ca::System), weaker) => {
            return Err(format!(
                "sslrootcert=system in the URL needs verify-full, not {weaker}"
            ));
        }
        (Some(Ca::File { key, .. }), PgSslMode::Disable | PgSslMode::Prefer) => {
            return Err(format!(
                "{key} applies only to require, verify-ca and verify-full (the TLS mode is {mode})"
            ));
        }
        (Some(Ca::File { .. }), _) => {}
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        PgSslMode::Disable => {
            return Ok(Prepared {
                url,
                mode,
                connector: None,
            });
        }
        // A CA file with prefer was refused above.
        PgSslMode::Prefer => Arc::new(NameUnchecked::unverified(&provider)),
        PgSslMode::Require => match &ca {
            None => Arc::new(NameUnchecked::unverified(&provider)),
            Some(ca) => Arc::new(NameUnchecked::chain_only(roots(Some(ca))?, &provider)),
        },
        PgSslMode::VerifyCa => Arc::new(NameUnchecked::chain_only(roots(ca.as_ref())?, &provider)),
        PgSslMode::VerifyFull => rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots(ca.as_ref())?),
            Arc::clone(&provider),
        )
        .build()
        .map_err(|e| format!("TLS: {e}"))?,
    };
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    // PostgreSQL 17's direct TLS (`sslnegotiation=direct`) requires it;
    // earlier servers ignore it.
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(Prepared {
        url,
        mode,
        connector: Some(Connector::new(Arc::new(config))),
    })
}

/// The roots `ca` names; the system's when `None`.
fn roots(ca: Option<&Ca>) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    match ca.unwrap_or(&Ca::System) {
        Ca::System => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _ignored) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let why = found
                    .errors
                    .first()
                    .map_or_else(|| "none installed".to_owned(), ToString::to_string);
                return Err(format!(
                    "verifying the server needs CA certificates: the system has none usable \
                     ({why}); set ca_file"
                ));
            }
        }
        Ca::File { path, key } => {
            for cert in read_pem(path, key)? {
                roots.add(cert).map_err(|e| {
                    format!(
                        "{key} {}: a certificate is not usable as a CA: {e}",
                        path.display()
                    )
                })?;
            }
        }
    }
    Ok(roots)
}

/// The certificates of the PEM file `path` (at least one). Messages name
/// the file and `key`, never its content.
fn read_pem(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::Error;
    let shown = path.display();
    let pem = std::fs::read(path).map_err(|e| format!("{key} {shown}: cannot read it: {e}"))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            let why = match e {
                Error::MissingSectionEnd { .. } => "a PEM section has no END line",
                Error::IllegalSectionStart { .. } => "a PEM BEGIN line is malformed",
                Error::Base64Decode(_) => "a PEM section is not valid base64",
                _ => "it is not valid PEM",
            };
            format!("{key} {shown}: {why}")
        })?;
    if certs.is_empty() {
        return Err(format!("{key} {shown} holds no PEM CERTIFICATE"));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settle(
        url: &str,
        mode: Option<PgSslMode>,
        ca_file: Option<&str>,
    ) -> Result<PgSslMode, String> {
        let settings = PgTls {
            mode,
            ca_file: ca_file.map(PathBuf::from),
        };
        prepare(url, &settings).map(|p| p.mode)
    }

    #[test]
    fn modes_have_libpq_names() {
        for mode in PgSslMode::ALL {
            assert_eq!(PgSslMode::parse(mode.as_str()), Some(mode));
        }
        assert_eq!(PgSslMode::parse("verify_full"), None);
    }

    #[test]
    fn the_mode_comes_from_the_settings_or_the_url_and_defaults_to_prefer() {
        let url = "postgres://u@h/db";
        assert_eq!(settle(url, None, None), Ok(PgSslMode::Prefer));
        assert_eq!(
            settle(url, Some(PgSslMode::Require), None),
            Ok(PgSslMode::Require)
        );
        assert_eq!(
            settle("postgres://u@h/db?sslmode=disable", None, None),
            Ok(PgSslMode::Disable)
        );
        assert_eq!(
            settle(
                "postgres://u@h/db?sslmode=require",
                Some(PgSslMode::Require),
                None
            ),
            Ok(PgSslMode::Require)
        );
        let err = settle(
            "postgres://u@h/db?sslmode=require",
            Some(PgSslMode::VerifyFull),
            None,
        )
        .unwrap_err();
        assert!(err.contains("disagree"), "{err}");
        let err = settle("postgres://u@h/db?sslmode=verify", None, None).unwrap_err();
        assert!(
            err.contains("sslmode=verify") && err.contains("verify-full"),
            "{err}"
        );
        let err = settle("postgres://u@h/db?sslmode=allow", None, None).unwrap_err();
        assert!(err.contains("not supported"), "{err}");
    }

    #[test]
    fn a_ca_means_verify_full_unless_a_mode_says_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        let pem = rcgen::generate_simple_self_signed(vec!["ca.test".to_owned()])
            .unwrap()
            .cert
            .pem();
        std::fs::write(&ca, pem).unwrap();
        let ca = ca.to_str().unwrap();
        assert_eq!(
            settle("postgres://u@h/db", None, Some(ca)),
            Ok(PgSslMode::VerifyFull)
        );
        let in_url = format!("postgres://u@h/db?sslrootcert={}", ca.replace('/', "%2F"));
        assert_eq!(settle(&in_url, None, None), Ok(PgSslMode::VerifyFull));
        assert_eq!(settle(&in_url, None, Some(ca)), Ok(PgSslMode::VerifyFull));
        assert_eq!(
            settle("postgres://u@h/db", Some(PgSslMode::VerifyCa), Some(ca)),
            Ok(PgSslMode::VerifyCa)
        );
        assert_eq!(
            settle("postgres://u@h/db", Some(PgSslMode::Require), Some(ca)),
            Ok(PgSslMode::Require)
        );
        let err = settle("postgres://u@h/db", Some(PgSslMode::Prefer), Some(ca)).unwrap_err();
        assert!(err.contains("ca_file applies only"), "{err}");
        let err = settle(&in_url, Some(PgSslMode::Disable), None).unwrap_err();
        assert!(
            err.contains("sslrootcert (in the URL) applies only"),
            "{err}"
        );
        let err = settle(&in_url, None, Some("/elsewhere.pem")).unwrap_err();
        assert!(err.contains("disagree"), "{err}");
        let err = settle(
            "postgres://u@h/db?sslrootcert=system&sslmode=require",
            None,
            None,
        )
        .unwrap_err();
        assert!(err.contains("needs verify-full"), "{err}");
    }

    #[test]
    fn ca_file_problems_name_the_setting_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ca.pem");
        let shown = file.display().to_string();
        let err = settle("postgres://u@h/db", None, Some(&shown)).unwrap_err();
        assert!(
            err.starts_with(&format!("ca_file {shown}: cannot read it")),
            "{err}"
        );
        std::fs::write(&file, "not a certificate\n").unwrap();
        let err = settle("postgres://u@h/db", None, Some(&shown)).unwrap_err();
        assert_eq!(err, format!("ca_file {shown} holds no PEM CERTIFICATE"));
        std::fs::write(
            &file,
            "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let err = settle("postgres://u@h/db", None, Some(&shown)).unwrap_err();
        assert!(err.contains("not valid base64"), "{err}");
        std::fs::write(
            &file,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let err = settle("postgres://u@h/db", None, Some(&shown)).unwrap_err();
        assert!(err.contains("not usable as a CA"), "{err}");
    }
}
