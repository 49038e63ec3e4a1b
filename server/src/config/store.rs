//! The `[store]` table: which store keeps sessions and history — sled in
//! the data directory (the default; one process per directory), or a
//! PostgreSQL database several replicas share.
//!
//! The database URL may carry a password, so it is a secret: it never
//! appears in Debug output, logs or errors — [`redact_url`] is what every
//! message shows instead.

use std::time::Duration;

use agentrt_runtime::store::PgSslMode;
use serde::Deserialize;

use super::{Config, ConfigError};

/// Which store (`[store] kind`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// sled in `data_dir` (with `store_cache_mb`): one process.
    #[default]
    Sled,
    /// A PostgreSQL database (`url`, `url_env` or `url_file`), shareable by
    /// replicas.
    Postgres,
}

/// The `[store]` table.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSettings {
    /// `"sled"` (default) or `"postgres"`.
    #[serde(default)]
    pub kind: StoreKind,
    /// The PostgreSQL URL (`postgres://user:password@host:port/db`), inline.
    /// Exactly one of `url`, `url_env` and `url_file` with
    /// `kind = "postgres"`.
    #[serde(default)]
    pub url: Option<String>,
    /// An environment variable holding the URL (keeps the password out of
    /// the TOML, e.g. from a Kubernetes Secret).
    #[serde(default)]
    pub url_env: Option<String>,
    /// A file holding the URL (surrounding whitespace ignored), e.g. a
    /// Kubernetes Secret mounted as a volume; read at start-up.
    #[serde(default)]
    pub url_file: Option<std::path::PathBuf>,
    /// TLS to the database, by libpq's `sslmode` names: `"disable"`,
    /// `"prefer"` (TLS if the server offers it, unverified), `"require"`
    /// (TLS, unverified: no defence against a man in the middle),
    /// `"verify-ca"` (the chain verified), `"verify-full"` (the chain and
    /// the URL's host name or IP). Default: the URL's `sslmode`, else
    /// `"verify-full"` with a CA (`ca_file` or the URL's `sslrootcert`),
    /// else `"prefer"`.
    #[serde(default, deserialize_with = "de_tls")]
    pub tls: Option<PgSslMode>,
    /// PEM file of the CA certificate(s) that verify the database's
    /// certificate, read at start-up. Default: the URL's `sslrootcert`,
    /// else the system's trust roots.
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
    /// Most connections to the database. Default 16; 1 to 1024.
    #[serde(default)]
    pub pool_size: Option<usize>,
    /// How long a session's lease lasts unless renewed, in milliseconds
    /// (renewed every third of it). Default 10000; 1000 to 600000.
    #[serde(default)]
    pub lease_ttl_ms: Option<u64>,
}

impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSettings")
            .field("kind", &self.kind)
            .field("url", &self.url.as_deref().map(redact_url))
            .field("url_env", &self.url_env)
            .field("url_file", &self.url_file)
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("pool_size", &self.pool_size)
            .field("lease_ttl_ms", &self.lease_ttl_ms)
            .finish()
    }
}

/// Default `pool_size`.
const DEFAULT_POOL_SIZE: usize = 16;
/// Default `lease_ttl_ms`.
const DEFAULT_LEASE_TTL_MS: u64 = 10_000;

impl StoreSettings {
    /// The pool size, default applied.
    pub fn pool_size(&self) -> usize {
        self.pool_size.unwrap_or(DEFAULT_POOL_SIZE)
    }

    /// The lease time, default applied.
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms.unwrap_or(DEFAULT_LEASE_TTL_MS))
    }

    /// How many of `url`, `url_env` and `url_file` are set.
    fn url_sources(&self) -> usize {
        usize::from(self.url.is_some())
            + usize::from(self.url_env.is_some())
            + usize::from(self.url_file.is_some())
    }

    /// The database URL, read from `url`, through `env` for `url_env`, or
    /// from the file `url_file` names. Errors name the key, variable or
    /// file, never the URL.
    pub fn resolve_url(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<String, ConfigError> {
        if self.url_sources() != 1 {
            return Err(ConfigError(
                "store: kind = \"postgres\" needs exactly one of url, url_env and url_file"
                    .to_owned(),
            ));
        }
        if let Some(url) = &self.url {
            return Ok(url.clone());
        }
        if let Some(var) = &self.url_env {
            return match env(var) {
                Some(url) if !url.trim().is_empty() => Ok(url.trim().to_owned()),
                Some(_) => Err(ConfigError(format!(
                    "store.url_env: environment variable {var} is empty"
                ))),
                None => Err(ConfigError(format!(
                    "store.url_env: environment variable {var} is not set"
                ))),
            };
        }
        let path = self.url_file.as_deref().unwrap_or(std::path::Path::new(""));
        let shown = path.display();
        match std::fs::read_to_string(path) {
            Ok(url) if is_postgres_url(url.trim()) => Ok(url.trim().to_owned()),
            Ok(url) if url.trim().is_empty() => {
                Err(ConfigError(format!("store.url_file: {shown} is empty")))
            }
            Ok(_) => Err(ConfigError(format!(
                "store.url_file: {shown} does not hold a postgres:// or postgresql:// URL"
            ))),
            Err(e) => Err(ConfigError(format!(
                "store.url_file: cannot read {shown}: {e}"
            ))),
        }
    }

    fn check(&self) -> Result<(), String> {
        if let Some(n) = self.pool_size
            && !(1..=1024).contains(&n)
        {
            return Err(format!("pool_size is {n}; it must be between 1 and 1024"));
        }
        if let Some(ms) = self.lease_ttl_ms
            && !(1_000..=600_000).contains(&ms)
        {
            return Err(format!(
                "lease_ttl_ms is {ms}; it must be between 1000 and 600000"
            ));
        }
        match self.kind {
            StoreKind::Sled => {
                if self.url_sources() > 0 || self.tls.is_some() || self.ca_file.is_some() {
                    return Err(
                        "url, url_env, url_file, tls and ca_file apply only to kind = \"postgres\" (kind is \"sled\")"
                            .to_owned(),
                    );
                }
            }
            StoreKind::Postgres => match self.url_sources() {
                0 => return Err("kind = \"postgres\" needs url, url_env or url_file".to_owned()),
                1 => {
                    if let Some(url) = &self.url
                        && !is_postgres_url(url)
                    {
                        return Err(format!(
                            "url {} must start with postgres:// or postgresql://",
                            redact_url(url)
                        ));
                    }
                    if self.url_env.as_ref().is_some_and(String::is_empty) {
                        return Err("url_env must name an environment variable".to_owned());
                    }
                    if self
                        .url_file
                        .as_ref()
                        .is_some_and(|p| p.as_os_str().is_empty())
                    {
                        return Err("url_file must name a file".to_owned());
                    }
                    if self
                        .ca_file
                        .as_ref()
                        .is_some_and(|p| p.as_os_str().is_empty())
                    {
                        return Err("ca_file must name a file".to_owned());
                    }
                }
                _ => {
                    return Err("set one of url, url_env and url_file, not several".to_owned());
                }
            },
        }
        Ok(())
    }
}

/// `tls`, by libpq's names; a wrong one is an error naming the key.
fn de_tls<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<PgSslMode>, D::Error> {
    let name = String::deserialize(d)?;
    PgSslMode::parse(&name).map(Some).ok_or_else(|| {
        serde::de::Error::custom(
            "store.tls must be \"disable\", \"prefer\", \"require\", \"verify-ca\" or \"verify-full\"",
        )
    })
}

/// Whether `url` looks like a PostgreSQL connection URL.
fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// `url` with its password (if any) replaced by `***`, for messages.
/// Anything that is not a `scheme://user:password@…` URL is shown as
/// `<the database URL>`, in case it hides a password some other way.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<the database URL>".to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    // A `password=` parameter would be in the query: drop the query.
    let tail = tail.split_once('?').map_or(tail, |(path, _)| path);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => format!("{scheme}://{userinfo}@{host}{tail}"),
        },
        None => format!("{scheme}://{authority}{tail}"),
    }
}

impl Config {
    pub(super) fn validate_store(&self) -> Result<(), ConfigError> {
        self.store
            .check()
            .map_err(|why| ConfigError(format!("store: {why}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml: &str) -> Result<Config, ConfigError> {
        let c = Config::parse_toml(toml)?;
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn sled_is_the_default_and_postgres_needs_one_url() {
        let c = parse("").unwrap();
        assert_eq!(c.store.kind, StoreKind::Sled);
        let c = parse("[store]\nkind = \"postgres\"\nurl = \"postgres://a:b@h/db\"").unwrap();
        assert_eq!(c.store.pool_size(), 16);
        assert_eq!(c.store.lease_ttl(), Duration::from_secs(10));
        for (toml, says) in [
            (
                "[store]\nkind = \"postgres\"",
                "needs url, url_env or url_file",
            ),
            (
                "[store]\nkind = \"postgres\"\nurl = \"postgres://h/db\"\nurl_env = \"X\"",
                "not several",
            ),
            (
                "[store]\nkind = \"postgres\"\nurl_env = \"X\"\nurl_file = \"/run/url\"",
                "not several",
            ),
            (
                "[store]\nkind = \"postgres\"\nurl_file = \"\"",
                "must name a file",
            ),
            (
                "[store]\nurl_file = \"/run/url\"",
                "only to kind = \"postgres\"",
            ),
            (
                "[store]\nkind = \"postgres\"\nurl = \"mysql://h/db\"",
                "postgres://",
            ),
            (
                "[store]\nurl = \"postgres://h/db\"",
                "only to kind = \"postgres\"",
            ),
            (
                "[store]\nkind = \"postgres\"\nurl_env = \"X\"\npool_size = 0",
                "pool_size",
            ),
            (
                "[store]\nkind = \"postgres\"\nurl_env = \"X\"\nlease_ttl_ms = 10",
                "lease_ttl_ms",
            ),
        ] {
            let err = parse(toml).unwrap_err().0;
            assert!(err.contains(says), "{toml}: {err}");
        }
        let err = Config::parse_toml("[store]\nkind = \"mongo\"")
            .unwrap_err()
            .0;
        assert!(err.contains("unknown variant"), "{err}");
    }

    #[test]
    fn tls_takes_libpq_mode_names_and_a_ca_file() {
        let c = parse(
            "[store]\nkind = \"postgres\"\nurl_env = \"X\"\ntls = \"verify-full\"\nca_file = \"/run/db-ca/ca.crt\"",
        )
        .unwrap();
        assert_eq!(c.store.tls, Some(PgSslMode::VerifyFull));
        assert_eq!(
            c.store.ca_file.as_deref(),
            Some(std::path::Path::new("/run/db-ca/ca.crt"))
        );
        for mode in PgSslMode::ALL {
            let toml = format!("[store]\nkind = \"postgres\"\nurl_env = \"X\"\ntls = \"{mode}\"");
            assert_eq!(parse(&toml).unwrap().store.tls, Some(mode));
        }
        let err = Config::parse_toml("[store]\nkind = \"postgres\"\ntls = \"verify_full\"")
            .unwrap_err()
            .0;
        assert_eq!(
            err,
            "line 3, column 7: store.tls must be \"disable\", \"prefer\", \"require\", \
             \"verify-ca\" or \"verify-full\""
        );
        for (toml, says) in [
            (
                "[store]\ntls = \"require\"",
                "tls and ca_file apply only to kind = \"postgres\"",
            ),
            (
                "[store]\nca_file = \"/ca.pem\"",
                "tls and ca_file apply only to kind = \"postgres\"",
            ),
            (
                "[store]\nkind = \"postgres\"\nurl_env = \"X\"\nca_file = \"\"",
                "ca_file must name a file",
            ),
        ] {
            let err = parse(toml).unwrap_err().0;
            assert!(err.contains(says), "{toml}: {err}");
        }
    }

    #[test]
    fn url_env_is_read_and_a_missing_variable_is_named() {
        let c = parse("[store]\nkind = \"postgres\"\nurl_env = \"PG_URL\"").unwrap();
        let url = c
            .store
            .resolve_url(&|name| (name == "PG_URL").then(|| "postgres://u:pw@h/db".to_owned()))
            .unwrap();
        assert_eq!(url, "postgres://u:pw@h/db");
        let err = c.store.resolve_url(&|_| None).unwrap_err().0;
        assert!(err.contains("PG_URL") && err.contains("not set"), "{err}");
    }

    #[test]
    fn url_file_is_read_trimmed_and_its_problems_never_show_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("db-url");
        std::fs::write(&file, "  postgres://u:s3cret@h/db\n").unwrap();
        let toml = format!(
            "[store]\nkind = \"postgres\"\nurl_file = {:?}",
            file.display().to_string()
        );
        let c = parse(&toml).unwrap();
        let url = c.store.resolve_url(&|_| None).unwrap();
        assert_eq!(url, "postgres://u:s3cret@h/db");
        std::fs::write(&file, "mysql://u:s3cret@h/db").unwrap();
        let err = c.store.resolve_url(&|_| None).unwrap_err().0;
        assert!(err.contains("does not hold a postgres://"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
        std::fs::write(&file, "\n").unwrap();
        let err = c.store.resolve_url(&|_| None).unwrap_err().0;
        assert!(err.contains("is empty"), "{err}");
        std::fs::remove_file(&file).unwrap();
        let err = c.store.resolve_url(&|_| None).unwrap_err().0;
        assert!(err.contains("cannot read"), "{err}");
    }

    #[test]
    fn the_password_never_shows() {
        assert_eq!(
            redact_url("postgres://agent:s3cret@db.internal:5432/agentrt?sslmode=require"),
            "postgres://agent:***@db.internal:5432/agentrt"
        );
        assert_eq!(
            redact_url("postgres://h/db?password=s3cret"),
            "postgres://h/db"
        );
        assert_eq!(redact_url("host=h password=s3cret"), "<the database URL>");
        let c = parse("[store]\nkind = \"postgres\"\nurl = \"postgres://a:s3cret@h/db\"").unwrap();
        assert!(!format!("{c:?}").contains("s3cret"));
        let err = parse("[store]\nkind = \"postgres\"\nurl = \"postgre://a:s3cret@h/db\"")
            .unwrap_err()
            .0;
        assert!(!err.contains("s3cret"), "{err}");
    }
}
