//! Several replicas on one PostgreSQL store: calls for a live turn on
//! another replica are forwarded to it.
//!
//! When the core answers a public call with
//! [`agentrt_runtime::RuntimeError::Elsewhere`] — the session's live turn
//! runs on another replica, whose lease names its internal address — the
//! handler gives the call to the [`Forwarder`] (through
//! [`crate::call::Call::forward_or`]), which sends the *same public call*
//! (agentrt.v1 or A2A) to that replica's internal listener, with the shared
//! cluster key, the caller's principal and the caller's deadline in
//! metadata, and passes the owner's answer back unchanged (statuses, error
//! details, streamed events and trailers).
//!
//! The internal listener serves the public services themselves behind
//! [`peer_check`] instead of the authenticator: the key must match, and the
//! principal is the one the forwarding replica authenticated. With `[tls]`
//! the listener is mTLS first (a client certificate chained to the
//! cluster's CA, see `config::cluster`) and the forwarder connects over
//! https with this replica's certificate; without, it is plaintext. A call that
//! arrived so is never forwarded again, so a call crosses at most one hop.
//! The public port refuses a call that carries the principal header
//! ([`refuse_peer_headers`]): only a replica may name a caller.
//!
//! - [`forward`]: the [`Forwarder`], its bounded cache of channels and the
//!   one generic forwarding call.
//! - `principal`: the principal header's encoding (versioned, bounded).

use std::sync::Arc;

use agentrt_runtime::types::Principal;
use tonic::metadata::{Ascii, BinaryMetadataValue, MetadataMap, MetadataValue};
use tonic::{Request, Status};

use crate::config::ClusterKey;

mod forward;
mod principal;

pub(crate) use forward::{Forwarded, Forwarder, Peer, To};

/// The metadata key every call between replicas carries the cluster key in.
pub(crate) const KEY_HEADER: &str = "x-agentrt-cluster-key";

/// The address a replica without `[cluster]` writes into its leases: not a
/// URL, so another replica's forwarder says the call cannot be forwarded
/// there instead of trying.
pub(crate) const NO_LISTENER: &str = "none";

/// The cluster key as the metadata value calls carry and the check compares.
#[derive(Clone)]
pub(crate) struct WireKey(Arc<MetadataValue<Ascii>>);

impl std::fmt::Debug for WireKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WireKey(<redacted>)")
    }
}

impl WireKey {
    /// The key as metadata; `None` when it has characters metadata cannot
    /// carry (visible ASCII only).
    pub(crate) fn new(key: &ClusterKey) -> Option<Self> {
        let text = key.expose();
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return None;
        }
        let mut value = MetadataValue::try_from(text).ok()?;
        value.set_sensitive(true);
        Some(Self(Arc::new(value)))
    }

    pub(crate) fn value(&self) -> &MetadataValue<Ascii> {
        &self.0
    }
}

/// The binary metadata key a forwarded call names its principal in: the
/// whole principal, input actor included (layout in `principal`).
pub(crate) const PRINCIPAL_HEADER: &str = "x-agentrt-forwarded-principal-bin";

/// Marks a call that a replica forwarded here (an extension the internal
/// listener's [`peer_check`] sets): it is answered here, never forwarded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ForwardedCall;

/// `who` as the principal header carries it.
fn principal_value(who: &Principal) -> BinaryMetadataValue {
    BinaryMetadataValue::from_bytes(&principal::encode(who))
}

/// The principal a forwarded call names.
fn principal_of(metadata: &MetadataMap) -> Result<Principal, Status> {
    let missing = || Status::invalid_argument("a forwarded call must name its principal");
    let bytes = metadata
        .get_bin(PRINCIPAL_HEADER)
        .ok_or_else(missing)?
        .to_bytes()
        .map_err(|_| missing())?;
    principal::decode(&bytes).ok_or_else(missing)
}

/// The internal listener's check in front of the public services: refuses
/// calls without the cluster key (UNAUTHENTICATED; compared in constant
/// time; the key is never logged, and the refusal is counted by the RPC
/// metrics under its status code), and takes the principal the forwarding
/// replica authenticated.
pub(crate) fn peer_check(
    key: WireKey,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |mut req: Request<()>| {
        let given = req.metadata().get(KEY_HEADER).map(|v| v.as_bytes());
        match given {
            Some(given) if crate::auth::same_bytes(given, key.value().as_bytes()) => {}
            Some(_) => {
                tracing::warn!("internal call refused: wrong cluster key");
                return Err(Status::unauthenticated("wrong cluster key"));
            }
            None => {
                tracing::warn!("internal call refused: no cluster key");
                return Err(Status::unauthenticated(format!(
                    "internal calls must carry the cluster key ({KEY_HEADER})"
                )));
            }
        }
        let who = principal_of(req.metadata())?;
        req.extensions_mut().insert(who);
        req.extensions_mut().insert(ForwardedCall);
        Ok(req)
    }
}

/// The public port's refusal of a call that names a forwarded principal:
/// only a replica, on the internal listener, may say who a caller is.
pub(crate) fn refuse_peer_headers(metadata: &MetadataMap) -> Result<(), Status> {
    if metadata.contains_key(PRINCIPAL_HEADER) {
        tracing::warn!("call refused: a forwarded principal on the public port");
        return Err(Status::unauthenticated(format!(
            "{PRINCIPAL_HEADER} is only accepted between replicas, on the cluster listener; \
             authenticate with your own credentials"
        )));
    }
    Ok(())
}

/// Sets the key and `who` on a call to another replica.
pub(crate) fn sign<T>(req: &mut Request<T>, key: &WireKey, who: &Principal) {
    let metadata = req.metadata_mut();
    metadata.insert(KEY_HEADER, key.value().clone());
    metadata.insert_bin(PRINCIPAL_HEADER, principal_value(who));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(who: &Principal) -> Request<()> {
        let key = WireKey::new(&ClusterKey::new("k-1")).unwrap();
        let mut req = Request::new(());
        sign(&mut req, &key, who);
        req
    }

    #[test]
    fn a_signed_call_passes_with_its_principal_and_is_marked_forwarded() {
        use agentrt_runtime::types::ActorKind;
        let mut who = Principal::new("ünïcode user:1", true, ActorKind::Mtls)
            .identified_as("spiffe://example.org/alice");
        who.restricted = true;
        let mut check = peer_check(WireKey::new(&ClusterKey::new("k-1")).unwrap());
        let req = check(signed(&who)).unwrap();
        assert_eq!(req.extensions().get::<Principal>(), Some(&who));
        assert!(req.extensions().get::<ForwardedCall>().is_some());
    }

    #[test]
    fn a_wrong_key_or_no_principal_is_refused() {
        let who = Principal::local();
        let mut other = peer_check(WireKey::new(&ClusterKey::new("k-2")).unwrap());
        let err = other(signed(&who)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        assert!(!err.message().contains("k-1"), "{}", err.message());
        let mut check = peer_check(WireKey::new(&ClusterKey::new("k-1")).unwrap());
        let mut req = signed(&who);
        req.metadata_mut().remove_bin(PRINCIPAL_HEADER);
        assert_eq!(check(req).unwrap_err().code(), tonic::Code::InvalidArgument);
        let mut req = Request::new(());
        req.metadata_mut().insert_bin(
            PRINCIPAL_HEADER,
            BinaryMetadataValue::from_bytes(&[7, b'x']),
        );
        req.metadata_mut()
            .insert(KEY_HEADER, MetadataValue::try_from("k-1").unwrap());
        assert_eq!(check(req).unwrap_err().code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn the_public_port_refuses_a_forwarded_principal() {
        let req = signed(&Principal::local());
        let err = refuse_peer_headers(req.metadata()).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        assert!(refuse_peer_headers(&MetadataMap::new()).is_ok());
    }
}
