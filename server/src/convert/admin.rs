//! The operator calls' answers that carry more than a count.

use agentrt_proto::v1 as pb;
use agentrt_runtime::runtime::{ReplicaList, ReplicaStatus, TurnLease};

use super::timestamp;

/// A page of `ListReplicas`.
pub fn replica_list(list: ReplicaList) -> pb::ListReplicasResponse {
    pb::ListReplicasResponse {
        replicas: list.replicas.into_iter().map(replica).collect(),
        leases: list.leases.into_iter().map(lease).collect(),
        next_page_token: list.next_page_token,
    }
}

fn replica(r: ReplicaStatus) -> pb::Replica {
    pb::Replica {
        replica_id: r.id,
        address: r.address,
        started_at: Some(timestamp(r.started_at)),
        heartbeat_at: Some(timestamp(r.heartbeat_at)),
        live: r.live,
        this_replica: r.this_replica,
    }
}

fn lease(l: TurnLease) -> pb::ReplicaLease {
    pb::ReplicaLease {
        replica_id: l.replica_id,
        session_id: l.session_id,
        owner: l.owner,
        turn_id: l.turn_id,
        started_at: l.started_at.map(timestamp),
        expires_at: l.expires_at.map(timestamp),
    }
}
