//! The `[auth]` table: bearer keys (where they come from is `keys.rs`), the
//! `[[auth.mtls]]` mappings of client certificates to users, and the
//! access checks that combine them with `[tls]`: the settings that decide
//! who may connect and as whom. They are checked before any port is bound —
//! a key whose file or variable is absent is a start-up error naming the
//! file, variable or user (never a key).

use std::path::PathBuf;

use serde::Deserialize;

use super::{ApiKeyConfig, Config, ConfigError, TlsSettings};

/// The `[auth]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Bearer keys; none (and no `api_keys_file`, no `mtls`) means
    /// loopback-only, single user `local`.
    #[serde(default)]
    pub api_keys: Vec<ApiKeyConfig>,
    /// A TOML file of `[[api_keys]]` entries (same shape as
    /// `[[auth.api_keys]]`), added to them; re-read when it changes and on
    /// SIGHUP, a bad version keeping the previous keys.
    #[serde(default)]
    pub api_keys_file: Option<PathBuf>,
    /// Client-certificate identities → users (mTLS, `[tls] client_ca`).
    #[serde(default)]
    pub mtls: Vec<MtlsConfig>,
}

/// One `[[auth.mtls]]` entry: a verified client certificate with the URI
/// SAN `identity` (a SPIFFE id such as
/// `spiffe://example.org/ns/app/sa/bob`), or with the subject CN `cn`,
/// authenticates as `user`. Exactly one of `identity` and `cn` is set. The
/// two are never mixed: `identity` is compared with URI SANs only, `cn`
/// with the subject CN only, so a certificate whose CN spells a mapped
/// SPIFFE id is not that user. A certificate whose URI SAN maps to no one
/// may still map by its CN when a `cn` entry names it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MtlsConfig {
    /// A URI SAN, compared exactly (it must be a URI: `scheme:…`).
    #[serde(default)]
    pub identity: Option<String>,
    /// A subject CN, compared exactly.
    #[serde(default)]
    pub cn: Option<String>,
    /// The user it authenticates.
    pub user: String,
    /// Whether the user may call RuntimeAdmin.
    #[serde(default)]
    pub admin: bool,
    /// A restricted identity gets a capability-free runner: no server
    /// tools, no per-call overrides, the `[quotas.restricted]` limits,
    /// never admin (with `admin = true` it is a config error). Default
    /// false.
    #[serde(default)]
    pub restricted: bool,
}

impl MtlsConfig {
    /// An entry mapping the URI SAN `identity` (e.g. a SPIFFE id).
    pub fn uri(identity: impl Into<String>, user: impl Into<String>, admin: bool) -> Self {
        Self {
            identity: Some(identity.into()),
            cn: None,
            user: user.into(),
            admin,
            restricted: false,
        }
    }

    /// An entry mapping the subject CN `cn`.
    pub fn common_name(cn: impl Into<String>, user: impl Into<String>, admin: bool) -> Self {
        Self {
            identity: None,
            cn: Some(cn.into()),
            user: user.into(),
            admin,
            restricted: false,
        }
    }

    /// This entry with `restricted = true`.
    #[must_use]
    pub fn as_restricted(mut self) -> Self {
        self.restricted = true;
        self
    }

    fn check(&self, i: usize) -> Result<(), ConfigError> {
        let bad = |why: String| Err(ConfigError(format!("auth.mtls[{i}]: {why}")));
        if self.user.is_empty() {
            return bad("user must be non-empty".to_owned());
        }
        if self.admin && self.restricted {
            return bad(format!(
                "(user {:?}) {}",
                self.user,
                super::keys::RESTRICTED_ADMIN
            ));
        }
        match (&self.identity, &self.cn) {
            (Some(identity), None) if is_uri(identity) => Ok(()),
            (Some(identity), None) => bad(format!(
                "identity {identity:?} is not a URI (a URI SAN such as \"spiffe://…\"); to map a \
                 subject CN write cn = {identity:?}"
            )),
            (None, Some(cn)) if !cn.is_empty() => Ok(()),
            _ => bad(
                "set exactly one of identity (a URI SAN such as \"spiffe://…\") or cn (a \
                 subject CN)"
                    .to_owned(),
            ),
        }
    }
}

/// `scheme:rest` with an RFC 3986 scheme and something after the colon.
fn is_uri(text: &str) -> bool {
    text.split_once(':').is_some_and(|(scheme, rest)| {
        !rest.is_empty()
            && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    })
}

impl AuthConfig {
    /// Whether any credentials are configured (keys, a key file or mTLS
    /// mappings); without them every call runs as the single user `local`.
    /// A key file counts even while it lists no key: then no key works.
    pub fn has_credentials(&self) -> bool {
        !self.api_keys.is_empty() || self.api_keys_file.is_some() || !self.mtls.is_empty()
    }

    fn validate(&self, tls: &TlsSettings) -> Result<(), ConfigError> {
        for (i, k) in self.api_keys.iter().enumerate() {
            k.check(&k.describe(i))?;
        }
        let mut inline = std::collections::BTreeSet::new();
        if !self
            .api_keys
            .iter()
            .filter_map(|k| k.key.as_deref())
            .all(|k| inline.insert(k))
        {
            return Err(ConfigError(
                "auth.api_keys holds the same key twice".to_owned(),
            ));
        }
        let mut mapped = std::collections::BTreeSet::new();
        for (i, m) in self.mtls.iter().enumerate() {
            m.check(i)?;
            let name = match (&m.identity, &m.cn) {
                (Some(identity), _) => ("identity", identity.as_str()),
                (None, cn) => ("cn", cn.as_deref().unwrap_or_default()),
            };
            if !mapped.insert(name) {
                return Err(ConfigError(format!(
                    "auth.mtls[{i}]: {} {:?} is mapped twice",
                    name.0, name.1
                )));
            }
        }
        if !self.mtls.is_empty() && tls.client_ca.is_none() {
            return Err(ConfigError(
                "[[auth.mtls]] maps client certificates, but none are asked for: set [tls] \
                 client_ca (--tls-client-ca) to the CA that signs them"
                    .to_owned(),
            ));
        }
        if tls.client_ca.is_some() && !self.has_credentials() {
            return Err(ConfigError(
                "tls.client_ca (--tls-client-ca) is set but no certificate identity maps to a \
                 user: add [[auth.mtls]] entries (identity = \"spiffe://…\" or cn = \"…\", \
                 user = \"…\"), or [[auth.api_keys]]"
                    .to_owned(),
            ));
        }
        Ok(())
    }
}

impl Config {
    /// The `[tls]`/`[auth]` part of [`Config::validate`]: refuses a
    /// non-loopback address without credentials or TLS, and checks the
    /// shape of keys and mappings (not yet the files they name).
    pub(super) fn validate_access(&self) -> Result<(), ConfigError> {
        if !self.listen.ip().is_loopback() && !self.auth.has_credentials() && !self.tls.enabled() {
            return Err(ConfigError(format!(
                "refusing to listen on {} without credentials or TLS: configure [[auth.api_keys]] \
                 (bearer keys; key, key_file or key_env) in the config file, or TLS with [tls] cert \
                 and key (--tls-cert/--tls-key), adding client_ca (--tls-client-ca) and \
                 [[auth.mtls]] to map client certificates to users; or listen on a loopback \
                 address such as 127.0.0.1",
                self.listen
            )));
        }
        self.tls.validate()?;
        self.auth.validate(&self.tls)
    }

    /// A warning for the operator when the listener is open to anyone who
    /// can reach it: a non-loopback address with TLS but no credentials,
    /// where every caller is the single user `local`.
    pub fn open_access_warning(&self) -> Option<String> {
        (!self.listen.ip().is_loopback() && !self.auth.has_credentials()).then(|| {
            format!(
                "listening on {} with TLS but without credentials: every caller that can connect \
                 is the single user \"local\"; add [[auth.api_keys]] or [tls] client_ca with \
                 [[auth.mtls]] to tell callers apart",
                self.listen
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn public(extra: &str) -> Result<Config, ConfigError> {
        let c = Config::parse_toml(&format!("listen = \"0.0.0.0:50051\"\n{extra}"))?;
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn a_public_address_without_credentials_or_tls_names_both_ways_out() {
        let err = public("").unwrap_err().0;
        for named in [
            "0.0.0.0:50051",
            "[[auth.api_keys]]",
            "key_file",
            "[tls]",
            "--tls-cert",
            "--tls-client-ca",
            "[[auth.mtls]]",
            "loopback",
        ] {
            assert!(err.contains(named), "{named:?} missing from: {err}");
        }
    }

    #[test]
    fn a_public_address_is_allowed_with_keys_or_tls() {
        public("[[auth.api_keys]]\nkey = \"secret-a1\"\nuser = \"alice\"").unwrap();
        public("[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"").unwrap();
        public(
            "[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\nclient_ca = \"ca.pem\"\n\
             [[auth.mtls]]\nidentity = \"spiffe://t/bob\"\nuser = \"bob\"",
        )
        .unwrap();
    }

    #[test]
    fn tls_without_credentials_on_a_public_address_is_warned_about() {
        let open = public("[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"").unwrap();
        let warning = open.open_access_warning().unwrap();
        assert!(
            warning.contains("\"local\"") && warning.contains("[[auth.api_keys]]"),
            "{warning}"
        );
        let keyed = public("[[auth.api_keys]]\nkey = \"secret-a1\"\nuser = \"alice\"").unwrap();
        assert_eq!(keyed.open_access_warning(), None);
        assert_eq!(Config::default().open_access_warning(), None);
    }

    #[test]
    fn an_api_key_has_exactly_one_source() {
        for keys in [
            "user = \"alice\"",
            "key = \"secret-a1\"\nkey_env = \"K\"\nuser = \"alice\"",
            "key_file = \"f\"\nkey_env = \"K\"\nuser = \"alice\"",
        ] {
            let err = Config::parse_toml(&format!("[[auth.api_keys]]\n{keys}"))
                .unwrap()
                .validate()
                .unwrap_err()
                .0;
            assert!(
                err.contains("exactly one of key, key_sha256"),
                "{keys}: {err}"
            );
            assert!(err.contains("\"alice\""), "{err}");
        }
        let c = Config::parse_toml("[[auth.api_keys]]\nkey_env = \"K\"\nuser = \"alice\"").unwrap();
        c.validate().unwrap();
    }

    #[test]
    fn a_missing_key_file_or_variable_names_the_user_and_the_source_but_no_key() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent-key");
        let short = dir.path().join("short-key");
        std::fs::write(&short, "tiny\n").unwrap();
        let toml = format!(
            "[[auth.api_keys]]\nkey_file = {missing:?}\nuser = \"alice\"\n\
             [[auth.api_keys]]\nkey_env = \"AGENTRT_ABSENT\"\nuser = \"bob\"\n\
             [[auth.api_keys]]\nkey_file = {short:?}\nuser = \"carol\"\n"
        );
        let c = Config::parse_toml(&toml).unwrap();
        c.validate().unwrap();
        let err = c.auth.resolve_keys(&|_| None).unwrap_err().0;
        assert!(
            err.contains("\"alice\"") && err.contains("absent-key"),
            "{err}"
        );
        std::fs::write(&missing, "filed-key-1\n").unwrap();
        let err = c.auth.resolve_keys(&|_| None).unwrap_err().0;
        assert!(
            err.contains("\"bob\"") && err.contains("AGENTRT_ABSENT"),
            "{err}"
        );
        let err = c
            .auth
            .resolve_keys(&|_| Some("envied-key-1".to_owned()))
            .unwrap_err()
            .0;
        assert!(
            err.contains("\"carol\"") && err.contains("at least 8"),
            "{err}"
        );
        assert!(!err.contains("tiny"), "the key leaked: {err}");
        std::fs::write(&short, "filed-key-1").unwrap();
        let err = c
            .auth
            .resolve_keys(&|_| Some("envied-key-1".to_owned()))
            .unwrap_err()
            .0;
        assert!(
            err.contains("same key twice") && !err.contains("filed-key-1"),
            "{err}"
        );
        std::fs::write(&short, "carols-key-1\r\n").unwrap();
        let keys = c
            .auth
            .resolve_keys(&|_| Some("envied-key-1".to_owned()))
            .unwrap();
        let keys: Vec<_> = keys.iter().map(|k| (k.sha256, k.user.as_str())).collect();
        assert_eq!(
            keys,
            [
                (super::super::key_digest("filed-key-1"), "alice"),
                (super::super::key_digest("envied-key-1"), "bob"),
                (super::super::key_digest("carols-key-1"), "carol")
            ]
        );
        assert!(!format!("{c:?}").contains("key-1"));
    }

    #[test]
    fn restricted_and_admin_together_are_refused_before_start() {
        for entry in [
            "[[auth.api_keys]]\nkey = \"secret-a1\"\nuser = \"guest\"\nrestricted = true\nadmin = true",
            "[tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\nclient_ca = \"ca.pem\"\n\
             [[auth.mtls]]\ncn = \"kiosk\"\nuser = \"guest\"\nrestricted = true\nadmin = true",
        ] {
            let err = public(entry).unwrap_err().0;
            assert!(
                err.contains("restricted = true and admin = true") && err.contains("guest"),
                "{err}"
            );
        }
        let c =
            public("[[auth.api_keys]]\nkey = \"secret-a1\"\nuser = \"guest\"\nrestricted = true")
                .unwrap();
        assert!(c.auth.api_keys[0].restricted && !c.auth.api_keys[0].admin);
        let keys = c.auth.resolve_keys(&|_| None).unwrap();
        assert!(keys[0].restricted);
    }
}
