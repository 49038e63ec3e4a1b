//! The `[tls]` table and its `--tls-*` flags (who may connect as whom is
//! `auth.rs`). Checked before any port is bound — a missing certificate or
//! key file is a start-up error naming the file.

use std::path::PathBuf;

use serde::Deserialize;

use super::ConfigError;

/// The `[tls]` table: TLS on the gRPC listener, and mTLS when `client_ca`
/// is set. The files are re-read when they change (checked as each
/// connection is accepted) and on SIGHUP; a new connection uses the new
/// material, open ones keep theirs. Relative paths are relative to the
/// working directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// PEM certificate chain (leaf first). With `key`, turns TLS on.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `cert`.
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// PEM CA certificate(s): a client certificate is then required and
    /// verified against them, and its URI SAN or subject CN can map to a
    /// user through `[[auth.mtls]]`.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
}

impl TlsSettings {
    /// Whether the listener speaks TLS.
    pub fn enabled(&self) -> bool {
        self.cert.is_some()
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        match (&self.cert, &self.key) {
            (Some(_), None) | (None, Some(_)) => {
                return Err(ConfigError(
                    "TLS needs both a certificate and its key: set [tls] cert and key \
                     (--tls-cert and --tls-key)"
                        .to_owned(),
                ));
            }
            (None, None) if self.client_ca.is_some() => {
                return Err(ConfigError(
                    "tls.client_ca (--tls-client-ca) needs TLS itself: set [tls] cert and key \
                     (--tls-cert and --tls-key) too"
                        .to_owned(),
                ));
            }
            _ => {}
        }
        Ok(())
    }
}

/// `--tls-cert`, `--tls-key`, `--tls-client-ca` (each also
/// `AGENTRT_TLS_CERT`, …); they override `[tls]`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// PEM certificate chain for TLS on the gRPC listener.
    #[arg(long = "tls-cert", env = "AGENTRT_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long = "tls-key", env = "AGENTRT_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA: require client certificates signed by it (mTLS).
    #[arg(long = "tls-client-ca", env = "AGENTRT_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
}

impl TlsArgs {
    pub(super) fn apply(&self, tls: &mut TlsSettings) {
        if let Some(v) = &self.tls_cert {
            tls.cert = Some(v.clone());
        }
        if let Some(v) = &self.tls_key {
            tls.key = Some(v.clone());
        }
        if let Some(v) = &self.tls_client_ca {
            tls.client_ca = Some(v.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    #[test]
    fn tls_settings_come_from_the_file_and_flags_override_them() {
        let c = Config::parse_toml("[tls]\ncert = \"file.pem\"\nkey = \"file.key\"").unwrap();
        assert_eq!(c.tls.cert.as_deref(), Some(Path::new("file.pem")));
        let cli = super::super::Cli {
            tls: TlsArgs {
                tls_cert: Some("flag.pem".into()),
                tls_key: None,
                tls_client_ca: Some("ca.pem".into()),
            },
            ..Default::default()
        };
        let c = c.with_overrides(&cli);
        assert_eq!(c.tls.cert.as_deref(), Some(Path::new("flag.pem")));
        assert_eq!(c.tls.key.as_deref(), Some(Path::new("file.key")));
        assert_eq!(c.tls.client_ca.as_deref(), Some(Path::new("ca.pem")));
        assert!(Config::parse_toml("[tls]\ncertificate = \"x\"").is_err());
    }

    #[test]
    fn half_configured_tls_and_mtls_are_refused() {
        for (toml, named) in [
            ("[tls]\ncert = \"c.pem\"", "both a certificate and its key"),
            ("[tls]\nclient_ca = \"ca.pem\"", "needs TLS itself"),
            (
                "[tls]\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"ca\"",
                "add [[auth.mtls]]",
            ),
            (
                "[[auth.mtls]]\nidentity = \"spiffe://t/x\"\nuser = \"bob\"",
                "set [tls] client_ca",
            ),
            (
                "[tls]\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"ca\"\n\
                 [[auth.mtls]]\nidentity = \"spiffe://t/x\"\nuser = \"a\"\n\
                 [[auth.mtls]]\nidentity = \"spiffe://t/x\"\nuser = \"b\"",
                "identity \"spiffe://t/x\" is mapped twice",
            ),
            (
                "[tls]\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"ca\"\n\
                 [[auth.mtls]]\ncn = \"x\"\nuser = \"a\"\n\
                 [[auth.mtls]]\ncn = \"x\"\nuser = \"b\"",
                "cn \"x\" is mapped twice",
            ),
            (
                "[tls]\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"ca\"\n\
                 [[auth.mtls]]\nidentity = \"bob-cn\"\nuser = \"a\"",
                "write cn = \"bob-cn\"",
            ),
            (
                "[tls]\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"ca\"\n\
                 [[auth.mtls]]\nidentity = \"spiffe://t/x\"\ncn = \"x\"\nuser = \"a\"",
                "exactly one of identity",
            ),
            (
                "[tls]\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"ca\"\n\
                 [[auth.mtls]]\nuser = \"a\"",
                "exactly one of identity",
            ),
        ] {
            let err = Config::parse_toml(toml).unwrap().validate().unwrap_err().0;
            assert!(err.contains(named), "{toml}: {err}");
        }
    }
}
