//! The `[cluster]` table: the internal service replicas sharing one
//! PostgreSQL store use to forward calls to the replica that owns a
//! session's live turn — its listener, the address other replicas reach it
//! at, and the shared key every call between them carries.
//!
//! The key is a secret: it is read from an environment variable
//! (`key_env`) by `ServerBuilder::prepare`, and never appears in Debug
//! output, logs or errors.

use std::net::SocketAddr;

use serde::Deserialize;

use super::store::StoreKind;
use super::{Config, ConfigError};

/// The `[cluster]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSettings {
    /// Where the internal service listens (`HOST:PORT`; port 0 picks one).
    pub listen: SocketAddr,
    /// The URL other replicas use to reach it, e.g.
    /// `http://10.0.0.5:50052`. Default `http://<bound address>` when
    /// `listen` is not a wildcard address; required when it is. The
    /// `--cluster-advertise` flag (`AGENTRT_CLUSTER_ADVERTISE`) overrides it.
    #[serde(default)]
    pub advertise: Option<String>,
    /// The environment variable holding the cluster key all replicas share.
    /// Required.
    pub key_env: Option<String>,
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

    /// The advertised URL for the listener bound at `bound`.
    pub fn advertise_for(&self, bound: SocketAddr) -> Result<String, ConfigError> {
        match &self.advertise {
            Some(url) => Ok(url.clone()),
            None if bound.ip().is_unspecified() => Err(ConfigError(format!(
                "cluster.listen {} is a wildcard address: set cluster.advertise (or \
                 --cluster-advertise) to the URL other replicas reach this one at",
                self.listen
            ))),
            None => Ok(format!("http://{bound}")),
        }
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
                .advertise_for("127.0.0.1:4000".parse().unwrap())
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
