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
//! certificate maps to through `[[auth.mtls]]`: by a URI SAN mapped with
//! `identity`, else by the subject CN mapped with `cn` — a CN is never
//! compared with an `identity`, so a CN spelled like a SPIFFE id is not
//! that user. A verified certificate that maps to no one is
//! `UNAUTHENTICATED` with a message naming its names.
//!
//! Keys are held as SHA-256 digests and a presented key is hashed and
//! compared with every digest without an early exit. The keys of
//! `[auth] api_keys_file` are re-read when the file changes (one `stat` per
//! call, only when the file is configured) and on SIGHUP; a version that
//! cannot be used keeps the previous keys and logs why, naming the file and
//! the entry, never a key.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock, Weak};

use agentrt_runtime::types::{ActorKind, Principal};
use tonic::{Request, Status};

use crate::config::{
    AuthConfig, ConfigError, MtlsConfig, ResolvedKey, key_digest, with_api_keys_file,
};
use crate::tls::{ClientCertificate, Stamp, stamp};

/// Maps `authorization: Bearer <key>` or a client certificate's identity
/// to a [`Principal`]. Clones share the key table.
#[derive(Clone)]
pub struct Authenticator {
    inner: Arc<Inner>,
}

struct Inner {
    /// No credentials configured: everyone is `local`.
    open: bool,
    keys: RwLock<Arc<[ResolvedKey]>>,
    file: Option<KeyFile>,
    uris: HashMap<String, Principal>,
    common_names: HashMap<String, Principal>,
    /// The SIGHUP listener (with a key file, inside a tokio runtime);
    /// stops when the last clone is dropped.
    _sighup: Option<tokio_util::task::AbortOnDropHandle<()>>,
}

/// `[auth] api_keys_file` and what it was last loaded from.
struct KeyFile {
    path: PathBuf,
    /// The keys of `[[auth.api_keys]]`, read once at start-up.
    fixed: Vec<ResolvedKey>,
    /// The file's stamp when last looked at; also serialises reloads.
    seen: Mutex<Option<Stamp>>,
}

impl KeyFile {
    /// Reloads when the file changed since it was last looked at.
    fn check(&self, keys: &RwLock<Arc<[ResolvedKey]>>) {
        // A call arriving while another reloads uses the current keys.
        if let Ok(mut seen) = self.seen.try_lock() {
            let now = stamp(&self.path);
            if *seen != now {
                // Stamped before reading: a change made while reading is
                // seen by the next call.
                *seen = now;
                self.swap(keys, "the file changed");
            }
        }
    }

    /// Re-reads the file now (SIGHUP).
    fn reload(&self, keys: &RwLock<Arc<[ResolvedKey]>>, why: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        *seen = stamp(&self.path);
        self.swap(keys, why);
    }

    fn swap(&self, keys: &RwLock<Arc<[ResolvedKey]>>, why: &str) {
        match with_api_keys_file(self.fixed.clone(), &self.path) {
            Ok(loaded) => {
                let count = loaded.len() - self.fixed.len();
                *keys.write().unwrap_or_else(|e| e.into_inner()) = loaded.into();
                tracing::info!(file = %self.path.display(), keys = count, reason = why,
                    "API key file reloaded; calls from now on use its keys");
            }
            Err(err) => {
                tracing::warn!(file = %self.path.display(), reason = why, error = %err,
                    "API key file reload failed; the previous keys stay in use");
            }
        }
    }
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys = self.inner.keys.read().map_or(0, |k| k.len());
        f.debug_struct("Authenticator")
            .field("keys", &keys)
            .field("key_file", &self.inner.file.as_ref().map(|f| &f.path))
            .field("uris", &self.inner.uris.len())
            .field("common_names", &self.inner.common_names.len())
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

/// Whether `a` and `b` are the same principal, whatever identity each was
/// mapped by.
fn same_but_actor(a: &Principal, b: &Principal) -> bool {
    let b_as_a = Principal {
        actor: a.actor.clone(),
        ..b.clone()
    };
    *a == b_as_a
}

/// At most this many characters of a certificate's name in a message.
const NAME_SHOWN: usize = 256;

fn shown(name: &str) -> String {
    match name.char_indices().nth(NAME_SHOWN) {
        Some((cut, _)) => format!("{:?}…", &name[..cut]),
        None => format!("{name:?}"),
    }
}

impl Authenticator {
    /// From the `[auth]` config; `key_env` entries are read through `env`,
    /// `key_file` entries and `api_keys_file` from disk (errors name the
    /// entry or file, never a key). With an `api_keys_file`, inside a
    /// tokio runtime, a task re-reads it on every SIGHUP for as long as a
    /// clone of the authenticator lives.
    pub fn new(
        config: &AuthConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let fixed = config.resolve_keys(env)?;
        let keys: Arc<[ResolvedKey]> = match &config.api_keys_file {
            Some(path) => with_api_keys_file(fixed.clone(), path)?.into(),
            None => fixed.clone().into(),
        };
        let file = config.api_keys_file.as_ref().map(|path| KeyFile {
            seen: Mutex::new(stamp(path)),
            path: path.clone(),
            fixed,
        });
        // The actor is the certificate identity that mapped the caller: its
        // URI SAN as is, its CN as `CN=<cn>` (a CN may look like a URI).
        let principal = |m: &MtlsConfig, id: &str| Principal {
            restricted: m.restricted,
            ..Principal::new(&m.user, m.admin, ActorKind::Mtls).identified_as(id)
        };
        let uris = config
            .mtls
            .iter()
            .filter_map(|m| {
                let uri = m.identity.clone()?;
                let who = principal(m, &uri);
                Some((uri, who))
            })
            .collect();
        let common_names = config
            .mtls
            .iter()
            .filter_map(|m| {
                let cn = m.cn.clone()?;
                let who = principal(m, &format!("CN={cn}"));
                Some((cn, who))
            })
            .collect();
        let watch = file.is_some();
        let inner = Arc::new_cyclic(|weak: &Weak<Inner>| Inner {
            open: !config.has_credentials(),
            keys: RwLock::new(keys),
            file,
            uris,
            common_names,
            _sighup: if watch {
                reload_on_sighup(weak.clone())
            } else {
                None
            },
        });
        Ok(Self { inner })
    }

    /// Re-reads `api_keys_file` now, as SIGHUP does; a no-op without one.
    pub fn reload_keys(&self, why: &str) {
        if let Some(file) = &self.inner.file {
            file.reload(&self.inner.keys, why);
        }
    }

    /// The principal of a request's metadata and its connection's client
    /// certificate (mTLS only).
    pub fn authenticate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        client: Option<&ClientCertificate>,
    ) -> Result<Principal, Status> {
        if self.inner.open {
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
        if let Some(file) = &self.inner.file {
            file.check(&self.inner.keys);
        }
        let keys = Arc::clone(&self.inner.keys.read().unwrap_or_else(|e| e.into_inner()));
        let digest = key_digest(token);
        let mut found = None;
        for key in keys.iter() {
            if same_bytes(&key.sha256, &digest) {
                found = Some(Principal {
                    restricted: key.restricted,
                    ..Principal::new(key.user.clone(), key.admin, ActorKind::ApiKey)
                });
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
        let mut found: Option<&Principal> = None;
        for uri in &client.uris {
            if let Some(p) = self.inner.uris.get(uri) {
                // Two SANs mapping to one principal are fine (the first
                // one's identity is the actor); to two are not.
                if found.is_some_and(|f| !same_but_actor(f, p)) {
                    return Err(Status::unauthenticated(
                        "the client certificate's URI SANs map to different users through                          [[auth.mtls]]; send `authorization: Bearer <key>`",
                    ));
                }
                found.get_or_insert(p);
            }
        }
        if found.is_none()
            && let Some(cn) = &client.common_name
        {
            found = self.inner.common_names.get(cn);
        }
        if let Some(p) = found {
            return Ok(p.clone());
        }
        let mut names: Vec<String> = client
            .uris
            .iter()
            .map(|u| format!("URI SAN {}", shown(u)))
            .collect();
        if let Some(cn) = &client.common_name {
            names.push(format!("subject CN {}", shown(cn)));
        }
        if names.is_empty() {
            return Err(Status::unauthenticated(
                "the client certificate has neither a URI SAN nor a subject CN, so it cannot map \
                 to a user through [[auth.mtls]]; send `authorization: Bearer <key>` or use a \
                 certificate with an identity",
            ));
        }
        Err(Status::unauthenticated(format!(
            "the client certificate ({}) maps to no user: add [[auth.mtls]] with identity = \
             \"<URI SAN>\" or cn = \"<subject CN>\" to the server's config, or send \
             `authorization: Bearer <key>`",
            names.join(", ")
        )))
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

/// Re-reads the key file on every SIGHUP while `inner` lives; `None`
/// outside a tokio runtime or where SIGHUP cannot be listened for.
#[cfg(unix)]
fn reload_on_sighup(inner: Weak<Inner>) -> Option<tokio_util::task::AbortOnDropHandle<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let _entered = runtime.enter();
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(err) => {
            tracing::warn!(error = %err,
                "cannot listen for SIGHUP; the API key file is still reloaded when it changes");
            return None;
        }
    };
    Some(tokio_util::task::AbortOnDropHandle::new(runtime.spawn(
        async move {
            while hangups.recv().await.is_some() {
                let Some(inner) = inner.upgrade() else {
                    break;
                };
                if let Some(file) = &inner.file {
                    file.reload(&inner.keys, "SIGHUP");
                }
            }
        },
    )))
}

#[cfg(not(unix))]
fn reload_on_sighup(_: Weak<Inner>) -> Option<tokio_util::task::AbortOnDropHandle<()>> {
    None
}

/// The principal the interceptor attached to `req`.
pub fn principal<T>(req: &Request<T>) -> Result<Principal, Status> {
    req.extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| Status::internal("request reached a handler without authentication"))
}

#[cfg(test)]
mod tests;
