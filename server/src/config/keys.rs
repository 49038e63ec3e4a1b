//! Where API keys come from: an entry's `key`, `key_sha256`, `key_file` or
//! `key_env`, and `[auth] api_keys_file`, a TOML file of `[[api_keys]]`
//! entries of the same shape that the server re-reads when it changes and
//! on SIGHUP (see [`crate::auth`]). Every key is kept as its SHA-256 only;
//! errors name the entry, file or variable, never a key.

use std::path::Path;

use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use super::{ApiKeyConfig, AuthConfig, ConfigError, diagnostics};

/// An API key read from wherever its entry says, as its SHA-256.
#[derive(Clone, PartialEq, Eq)]
pub struct ResolvedKey {
    /// The SHA-256 of the bearer token.
    pub sha256: [u8; 32],
    /// The user it authenticates.
    pub user: String,
    /// Whether the user may call RuntimeAdmin.
    pub admin: bool,
    /// Whether the key is restricted (a capability-free runner).
    pub restricted: bool,
}

impl std::fmt::Debug for ResolvedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedKey")
            .field("sha256", &"<redacted>")
            .field("user", &self.user)
            .field("admin", &self.admin)
            .field("restricted", &self.restricted)
            .finish()
    }
}

/// The SHA-256 of a bearer token.
pub fn key_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Why an entry may not be both: a restricted principal never passes an
/// admin check, so the combination would be a silent no-op.
pub(super) const RESTRICTED_ADMIN: &str = "restricted = true and admin = true cannot be combined: a restricted principal never \
     passes an admin check; remove one of them";

/// The shortest API key accepted.
pub(super) const MIN_KEY_LEN: usize = 8;

/// `key_sha256`: 64 hex digits, either case.
fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let digit = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        *byte = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

/// The shape of an `api_keys_file`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    #[serde(default)]
    api_keys: Vec<ApiKeyConfig>,
}

impl ApiKeyConfig {
    /// An entry with the key inline.
    pub fn inline(key: impl Into<String>, user: impl Into<String>, admin: bool) -> Self {
        Self {
            key: Some(key.into()),
            key_sha256: None,
            key_file: None,
            key_env: None,
            user: user.into(),
            admin,
            restricted: false,
        }
    }

    /// An entry with the key's SHA-256 (64 hex digits) instead of the key.
    pub fn hashed(sha256: impl Into<String>, user: impl Into<String>, admin: bool) -> Self {
        Self {
            key_sha256: Some(sha256.into()),
            key: None,
            key_file: None,
            key_env: None,
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

    pub(super) fn describe(&self, i: usize) -> String {
        format!("auth.api_keys[{i}] (user {:?})", self.user)
    }

    /// The entry's shape, before any file or variable is read.
    pub(super) fn check(&self, entry: &str) -> Result<(), ConfigError> {
        let bad = |why: &str| Err(ConfigError(format!("{entry}: {why}")));
        if self.user.is_empty() {
            return bad("user must be non-empty");
        }
        if self.admin && self.restricted {
            return bad(RESTRICTED_ADMIN);
        }
        let sources = [
            self.key.is_some(),
            self.key_sha256.is_some(),
            self.key_file.is_some(),
            self.key_env.is_some(),
        ];
        if sources.iter().filter(|s| **s).count() != 1 {
            return bad(
                "set exactly one of key, key_sha256 (the key's SHA-256 in hex), key_file (a \
                 file holding the key) or key_env (an environment variable holding it)",
            );
        }
        if self.key.as_ref().is_some_and(|key| key.len() < MIN_KEY_LEN) {
            return bad(&format!("key must be at least {MIN_KEY_LEN} characters"));
        }
        if self
            .key_sha256
            .as_deref()
            .is_some_and(|h| parse_sha256(h).is_none())
        {
            return bad("key_sha256 must be 64 hex digits (`printf %s KEY | sha256sum`)");
        }
        Ok(())
    }

    /// Reads the key from its source; errors name `entry` and the file or
    /// variable, never the key.
    fn resolve(
        &self,
        entry: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ResolvedKey, ConfigError> {
        self.check(entry)?;
        let resolved = |sha256| {
            Ok(ResolvedKey {
                sha256,
                user: self.user.clone(),
                admin: self.admin,
                restricted: self.restricted,
            })
        };
        let (key, from) = match (&self.key, &self.key_sha256, &self.key_file, &self.key_env) {
            (_, Some(hex), _, _) => {
                // Checked above.
                return resolved(parse_sha256(hex).unwrap_or_default());
            }
            (Some(key), ..) => (key.clone(), "key".to_owned()),
            (None, None, Some(path), _) => (
                read_key_file(path, entry)?,
                format!("key_file {}", path.display()),
            ),
            (None, None, None, var) => {
                let var = var.as_deref().unwrap_or_default();
                let value = env(var).ok_or_else(|| {
                    ConfigError(format!(
                        "{entry}: environment variable {var} (key_env) is not set"
                    ))
                })?;
                (value.trim_end().to_owned(), format!("key_env {var}"))
            }
        };
        if key.len() < MIN_KEY_LEN {
            return Err(ConfigError(format!(
                "{entry}: the key from {from} must be at least {MIN_KEY_LEN} characters"
            )));
        }
        resolved(key_digest(&key))
    }
}

/// A mounted Secret's file; its trailing newline (and other trailing
/// whitespace, which a bearer token never carries) is not part of the key.
fn read_key_file(path: &Path, entry: &str) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError(format!(
            "{entry}: cannot read key_file {}: {e}",
            path.display()
        ))
    })?;
    Ok(text.trim_end().to_owned())
}

/// Refuses the same key twice (compared by digest).
fn no_duplicates(keys: &[ResolvedKey], what: &str) -> Result<(), ConfigError> {
    let mut seen = std::collections::BTreeSet::new();
    if keys.iter().all(|k| seen.insert(k.sha256)) {
        Ok(())
    } else {
        Err(ConfigError(format!("{what} holds the same key twice")))
    }
}

impl AuthConfig {
    /// Every API key of `[[auth.api_keys]]`, read from its source (through
    /// `env`), checked for length and duplicates. `api_keys_file` is read
    /// by [`AuthConfig::resolve_all_keys`].
    pub fn resolve_keys(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Vec<ResolvedKey>, ConfigError> {
        let keys = self
            .api_keys
            .iter()
            .enumerate()
            .map(|(i, k)| k.resolve(&k.describe(i), env))
            .collect::<Result<Vec<_>, _>>()?;
        no_duplicates(&keys, "auth.api_keys")?;
        Ok(keys)
    }

    /// The keys of `[[auth.api_keys]]` followed by those of
    /// `api_keys_file` (when set), with no key twice across both.
    pub fn resolve_all_keys(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Vec<ResolvedKey>, ConfigError> {
        let keys = self.resolve_keys(env)?;
        match &self.api_keys_file {
            Some(path) => with_api_keys_file(keys, path),
            None => Ok(keys),
        }
    }
}

/// `fixed` (the keys of `[[auth.api_keys]]`) followed by the keys of the
/// `api_keys_file` at `path`, with no key twice across both.
pub fn with_api_keys_file(
    mut fixed: Vec<ResolvedKey>,
    path: &Path,
) -> Result<Vec<ResolvedKey>, ConfigError> {
    fixed.extend(read_api_keys_file(path)?);
    no_duplicates(&fixed, "auth.api_keys with auth.api_keys_file")?;
    Ok(fixed)
}

/// The keys of an `api_keys_file`: TOML `[[api_keys]]` entries shaped like
/// `[[auth.api_keys]]` (`key`, `key_sha256` or `key_file`; not `key_env`,
/// which would be read only at start-up). Errors name the file, the entry
/// and the position, never a key or a line of the file.
pub fn read_api_keys_file(path: &Path) -> Result<Vec<ResolvedKey>, ConfigError> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("cannot read auth.api_keys_file {shown}: {e}")))?;
    let file: KeyFile = toml::from_str(&text).map_err(|e| {
        ConfigError(format!(
            "auth.api_keys_file {shown}: {}",
            diagnostics::toml_error(&text, &e)
        ))
    })?;
    let keys = file
        .api_keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let entry = format!(
                "auth.api_keys_file {shown}: api_keys[{i}] (user {:?})",
                k.user
            );
            if k.key_env.is_some() {
                return Err(ConfigError(format!(
                    "{entry}: key_env cannot be used in a key file (use key, key_sha256 or \
                     key_file)"
                )));
            }
            k.resolve(&entry, &|_| None)
        })
        .collect::<Result<Vec<_>, _>>()?;
    no_duplicates(&keys, &format!("auth.api_keys_file {shown}"))?;
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_digests_parse_in_either_case_and_nothing_else_does() {
        let digest = key_digest("secret-a1");
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(parse_sha256(&hex), Some(digest));
        assert_eq!(parse_sha256(&hex.to_uppercase()), Some(digest));
        assert_eq!(parse_sha256(&hex[..62]), None);
        assert_eq!(parse_sha256(&format!("{}zz", &hex[..62])), None);
        assert_eq!(parse_sha256(&format!("{}é", &hex[..62])), None);
    }

    #[test]
    fn a_key_file_lists_entries_and_its_errors_show_no_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.toml");
        let hex: String = key_digest("hashed-key-1")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        std::fs::write(
            &path,
            format!(
                "[[api_keys]]\nkey = \"plain-key-1\"\nuser = \"a\"\n\
                 [[api_keys]]\nkey_sha256 = \"{hex}\"\nuser = \"b\"\nadmin = true\n"
            ),
        )
        .unwrap();
        let keys = read_api_keys_file(&path).unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].sha256, key_digest("plain-key-1"));
        assert_eq!(
            (keys[1].sha256, keys[1].user.as_str(), keys[1].admin),
            (key_digest("hashed-key-1"), "b", true)
        );
        for (text, says) in [
            (
                "[[api_keys]]\nkey = \"sk-leaky-secret\" user = \"a\"\n",
                "line 2",
            ),
            (
                "[[api_keys]]\nkey = \"sk-leaky-secret\"\nusr = \"a\"\n",
                "line 3",
            ),
            (
                "[[api_keys]]\nkey = \"sk-leaky\"\nuser = \"a\"\n[[api_keys]]\nkey = \"sk-leaky\"\nuser = \"b\"\n",
                "same key twice",
            ),
            (
                "[[api_keys]]\nkey_sha256 = \"sk-leaky-secret\"\nuser = \"a\"\n",
                "64 hex digits",
            ),
            (
                "[[api_keys]]\nkey_env = \"SK_LEAKY\"\nuser = \"a\"\n",
                "key_env cannot",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = read_api_keys_file(&path).unwrap_err().0;
            assert!(err.contains("keys.toml") && err.contains(says), "{err}");
            assert!(!err.contains("sk-leaky"), "a key leaked: {err}");
        }
    }

    #[test]
    fn a_key_file_carries_restricted_and_refuses_it_with_admin() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.toml");
        std::fs::write(
            &path,
            "[[api_keys]]\nkey = \"guest-key-1\"\nuser = \"g\"\nrestricted = true\n\
             [[api_keys]]\nkey = \"staff-key-1\"\nuser = \"s\"\n",
        )
        .unwrap();
        let keys = read_api_keys_file(&path).unwrap();
        assert_eq!(
            keys.iter().map(|k| k.restricted).collect::<Vec<_>>(),
            [true, false]
        );
        std::fs::write(
            &path,
            "[[api_keys]]\nkey = \"guest-key-1\"\nuser = \"g\"\nrestricted = true\nadmin = true\n",
        )
        .unwrap();
        let err = read_api_keys_file(&path).unwrap_err().0;
        assert!(
            err.contains("keys.toml") && err.contains("cannot be combined"),
            "{err}"
        );
        assert!(!err.contains("guest-key-1"), "a key leaked: {err}");
    }
}
