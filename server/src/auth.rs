//! Identity: bearer API keys mapped to principals. With no keys configured
//! (allowed only on loopback, see [`crate::config::Config::validate`]) every
//! call runs as the single user `local`.

use std::sync::Arc;

use agentrt_runtime::types::Principal;
use tonic::{Request, Status};

use crate::config::AuthConfig;

/// Maps `authorization: Bearer <key>` to a [`Principal`].
#[derive(Clone)]
pub struct Authenticator {
    keys: Arc<Vec<(Vec<u8>, Principal)>>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("keys", &self.keys.len())
            .finish()
    }
}

/// Compares without an early exit, so the time taken does not reveal how
/// much of a guessed key was right.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Authenticator {
    /// From the `[auth]` config.
    pub fn new(config: &AuthConfig) -> Self {
        let keys = config
            .api_keys
            .iter()
            .map(|k| {
                (
                    k.key.as_bytes().to_vec(),
                    Principal {
                        user_id: k.user.clone(),
                        admin: k.admin,
                    },
                )
            })
            .collect();
        Self {
            keys: Arc::new(keys),
        }
    }

    /// The principal of a request's metadata.
    pub fn authenticate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Principal, Status> {
        if self.keys.is_empty() {
            return Ok(Principal::local());
        }
        let header = metadata.get("authorization").ok_or_else(|| {
            Status::unauthenticated(
                "missing credentials: send the metadata header `authorization: Bearer <key>`",
            )
        })?;
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

    /// A tonic interceptor that stores the principal in the request
    /// extensions (read back with [`principal`]).
    pub fn interceptor(
        &self,
    ) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone + use<> {
        let this = self.clone();
        move |mut req: Request<()>| {
            let who = this.authenticate(req.metadata())?;
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
    use crate::config::ApiKeyConfig;

    fn auth() -> Authenticator {
        Authenticator::new(&AuthConfig {
            api_keys: vec![ApiKeyConfig {
                key: "secret-a".into(),
                user: "alice".into(),
                admin: false,
            }],
        })
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
        let who = auth().authenticate(&md(Some("Bearer secret-a"))).unwrap();
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
            let err = auth().authenticate(&md(value)).unwrap_err();
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
            let who = auth().authenticate(&md(Some(value))).unwrap();
            assert_eq!(who.user_id, "alice", "{value}");
        }
        for value in ["BEARER nope", "Basic secret-a", "Bearersecret-a"] {
            let err = auth().authenticate(&md(Some(value))).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{value}");
        }
    }

    #[test]
    fn no_keys_means_the_local_user() {
        let who = Authenticator::new(&AuthConfig::default())
            .authenticate(&md(None))
            .unwrap();
        assert_eq!(who.user_id, "local");
    }
}
