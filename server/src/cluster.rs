//! Several replicas on one PostgreSQL store: the internal `agentrt.cluster.v1`
//! service (`proto/agentrt/cluster/v1/cluster.proto`, not part of the public
//! contract) and the client that forwards calls to it.
//!
//! When the core answers a public call with
//! [`agentrt_runtime::RuntimeError::Elsewhere`] — the session's live turn
//! runs on another replica, whose lease names its address — the public
//! handler hands the call to the [`Forwarder`], which sends it to that
//! replica's internal listener with the caller's principal, the caller's
//! deadline and the shared cluster key, and passes the owner's answer back
//! unchanged (statuses, error details, streamed events and trailers). The
//! owner's [`ClusterHandler`] calls the same core methods and never forwards
//! again, so a call crosses at most one hop.
//!
//! - [`forward`]: the [`Forwarder`] and its bounded cache of channels.
//! - [`service`]: the [`ClusterHandler`] and the key check in front of it.

use std::sync::Arc;

use agentrt_runtime::types::Principal;
use tonic::Status;
use tonic::metadata::{Ascii, MetadataValue};

use crate::config::ClusterKey;

mod forward;
mod service;

pub(crate) use forward::{Forwarder, owner_status};
pub(crate) use service::{ClusterHandler, key_check};

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

/// A core principal as the internal service carries it.
pub(crate) fn principal_to_pb(who: &Principal) -> agentrt_proto::cluster::v1::Principal {
    agentrt_proto::cluster::v1::Principal {
        user_id: who.user_id.clone(),
        admin: who.admin,
    }
}

/// The principal a forwarded call carries.
pub(crate) fn principal_from_pb(
    who: Option<agentrt_proto::cluster::v1::Principal>,
) -> Result<Principal, Status> {
    match who {
        Some(p) if !p.user_id.is_empty() => Ok(Principal {
            user_id: p.user_id,
            admin: p.admin,
        }),
        _ => Err(Status::invalid_argument(
            "a forwarded call must name its principal",
        )),
    }
}
