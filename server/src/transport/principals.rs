//! [`PerPrincipal`]: the limit on calls one authenticated principal has
//! open at once, across all connections (behind a proxy every caller
//! shares its address and often its connections, so the principal is the
//! one key that stays per caller). It wraps a service inside the
//! authenticator's interceptor, reads the principal the interceptor put in
//! the request extensions, and marks the connection as authenticated
//! (it leaves the pool of connections that never authenticated).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use agentrt_runtime::types::Principal;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

use super::accept::ConnInfo;
use super::limits::HeldResponse;
use crate::config::TransportSettings;

/// Open calls per principal, shared by every service it wraps.
#[derive(Debug, Clone)]
pub struct PrincipalStreams {
    max: usize,
    counts: Arc<Mutex<HashMap<String, usize>>>,
}

/// One open call of a principal, given back on drop.
#[derive(Debug)]
pub struct PrincipalSlot {
    user: String,
    counts: Arc<Mutex<HashMap<String, usize>>>,
}

impl PrincipalStreams {
    /// From `transport.max_streams_per_principal` (0: no cap).
    pub fn new(settings: &TransportSettings) -> Self {
        Self {
            max: settings.max_streams_per_principal,
            counts: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Wraps `inner` (mount the result inside the authenticator).
    pub fn wrap<S>(&self, inner: S) -> PerPrincipal<S> {
        PerPrincipal {
            inner,
            limits: self.clone(),
        }
    }

    fn claim(&self, user: &str) -> Option<PrincipalSlot> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = counts.entry(user.to_owned()).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(PrincipalSlot {
            user: user.to_owned(),
            counts: Arc::clone(&self.counts),
        })
    }

    fn refusal(&self) -> Status {
        let description = format!(
            "this principal already has {} calls open (transport.max_streams_per_principal); \
             end some before starting more",
            self.max
        );
        Status::with_error_details(
            Code::ResourceExhausted,
            description.clone(),
            ErrorDetails::with_quota_failure_violation(
                "transport.max_streams_per_principal",
                description,
            ),
        )
    }
}

impl Drop for PrincipalSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = counts.get_mut(&self.user) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&self.user);
            }
        }
    }
}

/// A service whose calls count against their principal's open calls.
#[derive(Debug, Clone)]
pub struct PerPrincipal<S> {
    inner: S,
    limits: PrincipalStreams,
}

impl<S: NamedService> NamedService for PerPrincipal<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tower::Service<http::Request<Body>> for PerPrincipal<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = futures::future::Either<
        HeldResponse<S::Future, PrincipalSlot>,
        futures::future::Ready<Result<http::Response<Body>, S::Error>>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if let Some(info) = req.extensions().get::<ConnInfo>() {
            info.state.authenticated();
        }
        let user = req
            .extensions()
            .get::<Principal>()
            .map(|p| p.user_id.clone());
        let slot = match user {
            Some(user) if self.limits.max > 0 => match self.limits.claim(&user) {
                Some(slot) => Some(slot),
                None => {
                    tracing::debug!(
                        limit = self.limits.max,
                        "refusing a call over transport.max_streams_per_principal"
                    );
                    return futures::future::Either::Right(futures::future::ready(Ok(self
                        .limits
                        .refusal()
                        .into_http())));
                }
            },
            _ => None,
        };
        futures::future::Either::Left(HeldResponse::new(self.inner.call(req), slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_principal_is_capped_and_its_places_are_given_back() {
        let limits = PrincipalStreams::new(&TransportSettings {
            max_streams_per_principal: 2,
            ..TransportSettings::default()
        });
        let a = limits.claim("alice").unwrap();
        let _b = limits.claim("alice").unwrap();
        assert!(limits.claim("alice").is_none());
        assert!(
            limits.claim("bob").is_some(),
            "another principal is not affected"
        );
        drop(a);
        assert!(limits.claim("alice").is_some());
        let status = limits.refusal();
        assert_eq!(status.code(), Code::ResourceExhausted);
        let quota = status.get_details_quota_failure().expect("QuotaFailure");
        assert_eq!(
            quota.violations[0].subject,
            "transport.max_streams_per_principal"
        );
    }
}
