//! The `[cluster]` table: the internal service replicas sharing one
//! PostgreSQL store use to forward calls to the replica that owns a
//! session's live turn — its listener, the address other replicas reach it
//! at, and the shared key every call between them carries.
//!
//! The key is a secret: it is read from an environment variable
//! (`key_env`) by `ServerBuilder::prepare`, and never appears in Debug
//! output, logs or errors.
//!
//! With `[tls]` the internal listener speaks mTLS: it serves the `[tls]`
//! certificate and requires a client certificate chained to the cluster's
//! CA (`ca_file`, else `[tls] client_ca`), and the forwarder connects with
//! https, verifying the other replica's certificate against the same CA
//! (for the host of its advertised URL, or `server_name`) and presenting
//! this replica's `[tls]` certificate. The key is then checked as well.
//! Without `[tls]` the internal listener is plaintext (a warning says so at
//! start).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::store::StoreKind;
use super::{Config, ConfigError, TlsSettings};

/// The `[cluster]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSettings {
    /// Where the internal service listens (`HOST:PORT`; port 0 picks one).
    pub listen: SocketAddr,
    /// The URL other replicas use to reach it, e.g.
    /// `http://10.0.0.5:50052` (`https://` with `[tls]`, `http://`
    /// without). Default `http://<bound address>` (`https://` with
    /// `[tls]`) when `listen` is not a wildcard address; required when it
    /// is. The `--cluster-advertise` flag (`AGENTRT_CLUSTER_ADVERTISE`)
    /// overrides it.
    #[serde(default)]
    pub advertise: Option<String>,
    /// The environment variable holding the cluster key all replicas share.
    /// Required.
    pub key_env: Option<String>,
    /// With `[tls]`: PEM CA certificate(s) of the cluster — the internal
    /// listener requires a client certificate chained to them, and the
    /// forwarder trusts only them for other replicas' certificates.
    /// Default `[tls] client_ca`; with `[tls]` one of the two is required.
    /// `--cluster-ca-file` (`AGENTRT_CLUSTER_CA_FILE`) overrides it.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// With `[tls]`: the name every replica's certificate is verified
    /// against when another replica connects to it (a DNS name or an IP
    /// address). Default: the host of the replica's advertised URL, which
    /// its certificate must then name. Set it when replicas advertise
    /// addresses their certificate cannot name (pod IPs) and share a
    /// certificate that names this. `--cluster-server-name`
    /// (`AGENTRT_CLUSTER_SERVER_NAME`) overrides it.
    #[serde(default)]
    pub server_name: Option<String>,
}

/// The shortest cluster key accepted, in bytes: a key is a password every
/// replica's internal service trusts, so it must not be guessable
/// (`openssl rand -hex 32` gives 64).
pub const MIN_CLUSTER_KEY_BYTES: usize = 32;

/// The shared cluster key; its Debug output never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey(String);

impl ClusterKey {
    /// A key from its text (tests and the builder).
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key, to attach to a call or compare with one.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(<redacted>)")
    }
}

impl ClusterSettings {
    /// The cluster key, read through `env`: at least
    /// [`MIN_CLUSTER_KEY_BYTES`] bytes. Errors name the variable only.
    pub fn resolve_key(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ClusterKey, ConfigError> {
        let var = self.key_env.as_deref().unwrap_or_default();
        match env(var) {
            Some(key) if key.trim().len() >= MIN_CLUSTER_KEY_BYTES => {
                Ok(ClusterKey(key.trim().to_owned()))
            }
            Some(key) if !key.trim().is_empty() => Err(ConfigError(format!(
                "cluster.key_env: the key in environment variable {var} must be at least \
                 {MIN_CLUSTER_KEY_BYTES} bytes (e.g. `openssl rand -hex 32`)"
            ))),
            Some(_) => Err(ConfigError(format!(
                "cluster.key_env: environment variable {var} is empty; set it to the key all \
                 replicas share"
            ))),
            None => Err(ConfigError(format!(
                "cluster.key_env: environment variable {var} is not set; set it to the key all \
                 replicas share"
            ))),
        }
    }

    /// The advertised URL for the listener bound at `bound` (`https://`
    /// by default when `tls`).
    pub fn advertise_for(&self, bound: SocketAddr, tls: bool) -> Result<String, ConfigError> {
        match &self.advertise {
            Some(url) => Ok(url.clone()),
            None if bound.ip().is_unspecified() => Err(ConfigError(format!(
                "cluster.listen {} is a wildcard address: set cluster.advertise (or \
                 --cluster-advertise) to the URL other replicas reach this one at",
                self.listen
            ))),
            None if tls => Ok(format!("https://{bound}")),
            None => Ok(format!("http://{bound}")),
        }
    }

    /// The cluster's CA file with `[tls]`: `ca_file`, else `client_ca`.
    pub fn ca_for<'a>(&'a self, tls: &'a TlsSettings) -> Option<&'a Path> {
        self.ca_file.as_deref().or(tls.client_ca.as_deref())
    }

    /// The checks that depend on whether `[tls]` is on.
    fn check_tls(&self, tls: &TlsSettings) -> Result<(), String> {
        let https = self
            .advertise
            .as_deref()
            .is_some_and(|url| url.starts_with("https://"));
        if !tls.enabled() {
            if https {
                return Err(
                    "advertise is an https:// URL, but the internal listener serves TLS only \
                     with [tls]: set [tls] cert and key, or advertise http://"
                        .to_owned(),
                );
            }
            if self.ca_file.is_some() || self.server_name.is_some() {
                return Err(
                    "ca_file and server_name apply to the mTLS of the internal listener, which \
                     needs [tls]: set [tls] cert and key, or remove them"
                        .to_owned(),
                );
            }
            return Ok(());
        }
        if self.advertise.is_some() && !https {
            return Err(
                "with [tls] the internal listener serves TLS: advertise an https:// URL \
                 (--cluster-advertise)"
                    .to_owned(),
            );
        }
        if self.ca_for(tls).is_none() {
            return Err(
                "with [tls] the internal listener requires other replicas' client \
                 certificates: set ca_file (--cluster-ca-file) to the CA that issued the \
                 replicas' certificates, or [tls] client_ca"
                    .to_owned(),
            );
        }
        if let Some(name) = &self.server_name
            && rustls::pki_types::ServerName::try_from(name.as_str()).is_err()
        {
            return Err(format!(
                "server_name {name:?} is neither a DNS name nor an IP address"
            ));
        }
        Ok(())
    }

    fn check(&self) -> Result<(), String> {
        match self.key_env.as_deref() {
            None => {
                return Err(
                    "key_env is required: name the environment variable holding the key all \
                     replicas share"
                        .to_owned(),
                );
            }
            Some("") => return Err("key_env must name an environment variable".to_owned()),
            Some(_) => {}
        }
        match &self.advertise {
            Some(url) if !(url.starts_with("http://") || url.starts_with("https://")) => {
                return Err(format!(
                    "advertise {url:?} must be a URL starting with http:// or https://"
                ));
            }
            Some(_) => {}
            None if self.listen.ip().is_unspecified() => {
                return Err(format!(
                    "listen {} is a wildcard address: set advertise (or --cluster-advertise) to \
                     the URL other replicas reach this one at",
                    self.listen
                ));
            }
            None => {}
        }
        Ok(())
    }
}

impl Config {
    pub(super) fn validate_cluster(&self) -> Result<(), ConfigError> {
        let Some(cluster) = &self.cluster else {
            return Ok(());
        };
        if self.store.kind != StoreKind::Postgres {
            return Err(ConfigError(
                "cluster: replicas share a PostgreSQL store; set [store] kind = \"postgres\""
                    .to_owned(),
            ));
        }
        cluster
            .check()
            .and_then(|()| cluster.check_tls(&self.tls))
            .map_err(|why| ConfigError(format!("cluster: {why}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cli;

    const PG: &str = "[store]\nkind = \"postgres\"\nurl_env = \"PG\"\n";

    fn parse(toml: &str) -> Result<Config, ConfigError> {
        let c = Config::parse_toml(toml)?;
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn cluster_needs_a_key_and_an_address_others_can_reach() {
        let c = parse(&format!(
            "{PG}[cluster]\nlisten = \"127.0.0.1:0\"\nkey_env = \"K\""
        ))
        .unwrap();
        let cluster = c.cluster.as_ref().unwrap();
        assert_eq!(
            cluster
                .advertise_for("127.0.0.1:4000".parse().unwrap(), false)
                .unwrap(),
            "http://127.0.0.1:4000"
        );
        for (toml, says) in [
            (
                "[cluster]\nlisten = \"127.0.0.1:0\"\nkey_env = \"K\"",
                "postgres",
            ),
            (
                &format!("{PG}[cluster]\nlisten = \"127.0.0.1:0\""),
                "key_env is required",
            ),
            (
                &format!("{PG}[cluster]\nlisten = \"0.0.0.0:50052\"\nkey_env = \"K\""),
                "wildcard",
            ),
            (
                &format!(
                    "{PG}[cluster]\nlisten = \"0.0.0.0:50052\"\nkey_env = \"K\"\nadvertise = \"10.0.0.5:50052\""
                ),
                "http://",
            ),
        ] {
            let err = parse(toml).unwrap_err().0;
            assert!(err.contains(says), "{toml}: {err}");
        }
    }

    #[test]
    fn with_tls_the_listener_needs_the_clusters_ca_and_an_https_address() {
        const TLS: &str = "[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\n";
        const CLUSTER: &str = "[cluster]\nlisten = \"127.0.0.1:0\"\nkey_env = \"K\"\n";
        let c = parse(&format!("{PG}{TLS}{CLUSTER}ca_file = \"ca.pem\"")).unwrap();
        let cluster = c.cluster.as_ref().unwrap();
        assert_eq!(cluster.ca_for(&c.tls), Some(std::path::Path::new("ca.pem")));
        assert_eq!(
            cluster
                .advertise_for("127.0.0.1:4000".parse().unwrap(), true)
                .unwrap(),
            "https://127.0.0.1:4000"
        );
        // The public port's client CA is the default.
        let c = parse(&format!(
            "{PG}{TLS}client_ca = \"clients.pem\"\n\
             [[auth.mtls]]\ncn = \"x\"\nuser = \"x\"\n{CLUSTER}server_name = \"replicas.test\""
        ))
        .unwrap();
        let cluster = c.cluster.as_ref().unwrap();
        assert_eq!(
            cluster.ca_for(&c.tls),
            Some(std::path::Path::new("clients.pem"))
        );
        for (toml, says) in [
            (format!("{PG}{TLS}{CLUSTER}"), "set ca_file"),
            (
                format!(
                    "{PG}{TLS}{CLUSTER}ca_file = \"ca.pem\"\nadvertise = \"http://10.0.0.5:1\""
                ),
                "advertise an https:// URL",
            ),
            (
                format!("{PG}{TLS}{CLUSTER}ca_file = \"ca.pem\"\nserver_name = \"not a name\""),
                "neither a DNS name nor an IP address",
            ),
            (
                format!("{PG}{CLUSTER}advertise = \"https://10.0.0.5:1\""),
                "only with [tls]",
            ),
            (format!("{PG}{CLUSTER}ca_file = \"ca.pem\""), "needs [tls]"),
            (
                format!("{PG}{CLUSTER}server_name = \"r.test\""),
                "needs [tls]",
            ),
        ] {
            let err = parse(&toml).unwrap_err().0;
            assert!(
                err.contains(says) && err.starts_with("cluster: "),
                "{toml}: {err}"
            );
        }
    }

    #[test]
    fn the_cluster_flags_override_the_file_and_need_a_cluster_table() {
        let c = Config::parse_toml(&format!(
            "{PG}[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\n\
             [cluster]\nlisten = \"127.0.0.1:0\"\nkey_env = \"K\"\nca_file = \"file.pem\""
        ))
        .unwrap();
        let cli = Cli {
            cluster_ca_file: Some("flag.pem".into()),
            cluster_server_name: Some("agentrt.agentrt.svc".to_owned()),
            ..Cli::default()
        };
        let c = c.with_overrides(&cli);
        c.validate().unwrap();
        let cluster = c.cluster.as_ref().unwrap();
        assert_eq!(
            cluster.ca_file.as_deref(),
            Some(std::path::Path::new("flag.pem"))
        );
        assert_eq!(cluster.server_name.as_deref(), Some("agentrt.agentrt.svc"));
        for (cli, flag) in [
            (
                Cli {
                    cluster_ca_file: Some("ca.pem".into()),
                    ..Cli::default()
                },
                "--cluster-ca-file (AGENTRT_CLUSTER_CA_FILE) is set but the config has no \
                 [cluster] table",
            ),
            (
                Cli {
                    cluster_server_name: Some("r.test".into()),
                    ..Cli::default()
                },
                "--cluster-server-name",
            ),
        ] {
            let err = Config::load(&cli).unwrap_err().0;
            assert!(err.contains(flag), "{err}");
        }
    }

    #[test]
    fn the_flag_overrides_advertise_and_the_key_is_never_shown() {
        let c = Config::parse_toml(&format!(
            "{PG}[cluster]\nlisten = \"0.0.0.0:50052\"\nkey_env = \"K\""
        ))
        .unwrap();
        let cli = Cli {
            cluster_advertise: Some("http://10.0.0.5:50052".to_owned()),
            ..Cli::default()
        };
        let c = c.with_overrides(&cli);
        c.validate().unwrap();
        let cluster = c.cluster.as_ref().unwrap();
        assert_eq!(cluster.advertise.as_deref(), Some("http://10.0.0.5:50052"));
        let long = "hunter2-hunter2-hunter2-hunter2-";
        let key = cluster
            .resolve_key(&|name| (name == "K").then(|| format!(" {long}\n")))
            .unwrap();
        assert_eq!(key.expose(), long);
        assert!(!format!("{key:?}").contains("hunter2"));
        // One byte short (after trimming) is refused, naming the field and
        // the minimum but not the key.
        for short in ["x", "hunter2", &long[..31], &format!(" {} ", &long[..31])] {
            let err = cluster
                .resolve_key(&|_| Some(short.to_owned()))
                .unwrap_err()
                .0;
            assert!(
                err.contains("cluster.key_env") && err.contains("at least 32 bytes"),
                "{err}"
            );
            assert!(!err.contains("hunter2"), "the key leaked: {err}");
        }
        let err = cluster
            .resolve_key(&|_| Some(" ".to_owned()))
            .unwrap_err()
            .0;
        assert!(err.contains("empty"), "{err}");
        let err = cluster.resolve_key(&|_| None).unwrap_err().0;
        assert!(err.contains("K") && err.contains("not set"), "{err}");
        // The flag without a [cluster] table is a mistake worth saying.
        let err = Config::load(&cli).unwrap_err().0;
        assert!(err.contains("--cluster-advertise"), "{err}");
    }
}
