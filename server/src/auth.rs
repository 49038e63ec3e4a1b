//! Identity: bearer API keys and verified client certificates mapped to
//! principals. With neither configured (allowed only on loopback or with
//! TLS, see [`crate::config::Config::validate`]) every call runs as the
//! single user `local`.
//!
//! Precedence: a call that sends `authorization: Bearer <key>` is that
//! key's user, and an unknown key is `UNAUTHENTICATED` even on a connection
//! with a mapped certificate — the key names the caller more precisely than
//! the connection does (a gateway's certificate may carry many users'
//! keys). A call without the header is the user its connection's client
//! certificate maps to through `[[auth.mtls]]`; a verified certificate that
//! maps to no one is `UNAUTHENTICATED` with a message naming its identity.

use std::collections::HashMap;
use std::sync::Arc;

use agentrt_runtime::types::Principal;
use tonic::{Request, Status};

use crate::config::{AuthConfig, ConfigError};
use crate::tls::ClientCertificate;

/// Maps `authorization: Bearer <key>` or a client certificate's identity
/// to a [`Principal`].
#[derive(Clone)]
pub struct Authenticator {
    keys: Arc<Vec<(Vec<u8>, Principal)>>,
    identities: Arc<HashMap<String, Principal>>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("keys", &self.keys.len())
            .field("identities", &self.identities.len())
            .finish()
    }
}

/// Compares without an early exit, so the time taken does not reveal how
/// much of a guessed key was right.
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Authenticator {
    /// From the `[auth]` config; `key_env` entries are read through `env`
    /// and `key_file` entries from disk (errors name the entry, never a
    /// key).
    pub fn new(
        config: &AuthConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let keys = config
            .resolve_keys(env)?
            .into_iter()
            .map(|k| {
                (
                    k.key.into_bytes(),
                    Principal {
                        user_id: k.user,
                        admin: k.admin,
                    },
                )
            })
            .collect();
        let identities = config
            .mtls
            .iter()
            .map(|m| {
                (
                    m.identity.clone(),
                    Principal {
                        user_id: m.user.clone(),
                        admin: m.admin,
                    },
                )
            })
            .collect();
        Ok(Self {
            keys: Arc::new(keys),
            identities: Arc::new(identities),
        })
    }

    /// The principal of a request's metadata and its connection's client
    /// certificate (mTLS only).
    pub fn authenticate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        client: Option<&ClientCertificate>,
    ) -> Result<Principal, Status> {
        if self.keys.is_empty() && self.identities.is_empty() {
            return Ok(Principal::local());
        }
        let Some(header) = metadata.get("authorization") else {
            return self.by_certificate(client);
        };
        let token = header
            .to_str()
            .ok()
            .and_then(|v| {
                // RFC 7235 §2.1: the auth scheme is case-insensitive.
                let (scheme, token) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then_some(token)
            })
            .map(str::trim)
            .ok_or_else(|| {
                Status::unauthenticated(
                    "malformed credentials: expected `authorization: Bearer <key>`",
                )
            })?;
        let mut found = None;
        for (key, principal) in self.keys.iter() {
            if same_bytes(key, token.as_bytes()) {
                found = Some(principal.clone());
            }
        }
        found.ok_or_else(|| Status::unauthenticated("unknown API key"))
    }

    fn by_certificate(&self, client: Option<&ClientCertificate>) -> Result<Principal, Status> {
        let Some(client) = client else {
            return Err(Status::unauthenticated(
                "missing credentials: send the metadata header `authorization: Bearer <key>`",
            ));
        };
        let Some(identity) = &client.identity else {
            return Err(Status::unauthenticated(
                "the client certificate has neither a URI SAN nor a subject CN, so it cannot map \
                 to a user through [[auth.mtls]]; send `authorization: Bearer <key>` or use a \
                 certificate with an identity",
            ));
        };
        self.identities.get(identity).cloned().ok_or_else(|| {
            Status::unauthenticated(format!(
                "the client certificate's identity {identity:?} maps to no user: add \
                 [[auth.mtls]] identity = {identity:?} to the server's config, or send \
                 `authorization: Bearer <key>`"
            ))
        })
    }

    /// A tonic interceptor that stores the principal in the request
    /// extensions (read back with [`principal`]).
    pub fn interceptor(
        &self,
    ) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone + use<> {
        let this = self.clone();
        move |mut req: Request<()>| {
            let client = req.extensions().get::<Arc<ClientCertificate>>().cloned();
            let who = this.authenticate(req.metadata(), client.as_deref())?;
            req.extensions_mut().insert(who);
            Ok(req)
        }
    }
}

/// The principal the interceptor attached to `req`.
pub fn principal<T>(req: &Request<T>) -> Result<Principal, Status> {
    req.extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| Status::internal("request reached a handler without authentication"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ApiKeyConfig, MtlsConfig};

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn auth() -> Authenticator {
        Authenticator::new(
            &AuthConfig {
                api_keys: vec![ApiKeyConfig::inline("secret-a", "alice", false)],
                mtls: vec![MtlsConfig {
                    identity: "spiffe://test/bob".into(),
                    user: "bob".into(),
                    admin: true,
                }],
            },
            &no_env,
        )
        .unwrap()
    }

    fn cert(identity: Option<&str>) -> ClientCertificate {
        ClientCertificate {
            identity: identity.map(str::to_owned),
        }
    }

    fn md(value: Option<&str>) -> tonic::metadata::MetadataMap {
        let mut m = tonic::metadata::MetadataMap::new();
        if let Some(v) = value {
            m.insert("authorization", v.parse().unwrap());
        }
        m
    }

    #[test]
    fn a_known_key_maps_to_its_user() {
        let who = auth()
            .authenticate(&md(Some("Bearer secret-a")), None)
            .unwrap();
        assert_eq!(who.user_id, "alice");
        assert!(!who.admin);
    }

    #[test]
    fn missing_malformed_and_unknown_keys_are_unauthenticated() {
        for value in [
            None,
            Some("secret-a"),
            Some("Bearer nope"),
            Some("Bearer secret-"),
        ] {
            let err = auth().authenticate(&md(value), None).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{value:?}");
        }
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for value in [
            "Bearer secret-a",
            "bearer secret-a",
            "BEARER secret-a",
            "bEaReR secret-a",
        ] {
            let who = auth().authenticate(&md(Some(value)), None).unwrap();
            assert_eq!(who.user_id, "alice", "{value}");
        }
        for value in ["BEARER nope", "Basic secret-a", "Bearersecret-a"] {
            let err = auth().authenticate(&md(Some(value)), None).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{value}");
        }
    }

    #[test]
    fn no_keys_means_the_local_user() {
        let who = Authenticator::new(&AuthConfig::default(), &no_env)
            .unwrap()
            .authenticate(&md(None), Some(&cert(Some("spiffe://test/bob"))))
            .unwrap();
        assert_eq!(who.user_id, "local");
    }

    #[test]
    fn a_mapped_certificate_is_its_user_when_no_key_is_sent() {
        let who = auth()
            .authenticate(&md(None), Some(&cert(Some("spiffe://test/bob"))))
            .unwrap();
        assert_eq!((who.user_id.as_str(), who.admin), ("bob", true));
    }

    #[test]
    fn a_bearer_key_takes_precedence_over_the_certificate() {
        let bob = cert(Some("spiffe://test/bob"));
        let who = auth()
            .authenticate(&md(Some("Bearer secret-a")), Some(&bob))
            .unwrap();
        assert_eq!(who.user_id, "alice");
        let err = auth()
            .authenticate(&md(Some("Bearer wrong-key")), Some(&bob))
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn an_unmapped_certificate_is_unauthenticated_naming_its_identity() {
        let err = auth()
            .authenticate(&md(None), Some(&cert(Some("spiffe://test/mallory"))))
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        assert!(
            err.message().contains("spiffe://test/mallory")
                && err.message().contains("[[auth.mtls]]"),
            "{}",
            err.message()
        );
        let err = auth()
            .authenticate(&md(None), Some(&cert(None)))
            .unwrap_err();
        assert!(
            err.message().contains("neither a URI SAN nor a subject CN"),
            "{}",
            err.message()
        );
        let who = auth()
            .authenticate(
                &md(Some("Bearer secret-a")),
                Some(&cert(Some("spiffe://test/mallory"))),
            )
            .unwrap();
        assert_eq!(who.user_id, "alice");
    }

    #[test]
    fn keys_come_from_files_and_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        std::fs::write(&file, "from-the-file-key\n").unwrap();
        let config = AuthConfig {
            api_keys: vec![
                ApiKeyConfig {
                    key: None,
                    key_file: Some(file),
                    key_env: None,
                    user: "filed".into(),
                    admin: false,
                },
                ApiKeyConfig {
                    key: None,
                    key_file: None,
                    key_env: Some("AGENTRT_TEST_KEY".into()),
                    user: "envy".into(),
                    admin: false,
                },
            ],
            mtls: Vec::new(),
        };
        let env = |name: &str| (name == "AGENTRT_TEST_KEY").then(|| "from-the-env-key".to_owned());
        let auth = Authenticator::new(&config, &env).unwrap();
        let who = auth
            .authenticate(&md(Some("Bearer from-the-file-key")), None)
            .unwrap();
        assert_eq!(who.user_id, "filed");
        let who = auth
            .authenticate(&md(Some("Bearer from-the-env-key")), None)
            .unwrap();
        assert_eq!(who.user_id, "envy");
    }
}
