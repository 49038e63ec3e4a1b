//! A user message's provenance: the speaker a Chat names (decoded here, its
//! limits checked by the core) and the input actor the server derived from
//! the credentials (only ever encoded: no request carries one).

use agentrt_proto::v1 as pb;
use agentrt_runtime::types::{ActorKind, InputActor, Speaker};

/// `ChatRequest.speaker`: unset names no one.
pub(super) fn speaker_from_pb(s: Option<pb::Speaker>) -> Option<Speaker> {
    s.map(|s| Speaker::new(s.id, s.display_name))
}

/// A stored message's speaker.
pub(crate) fn speaker_to_pb(s: Speaker) -> pb::Speaker {
    pb::Speaker {
        id: s.id,
        display_name: s.display_name,
    }
}

/// A stored message's input actor.
pub(crate) fn actor_to_pb(a: InputActor) -> pb::InputActor {
    let kind = match a.kind {
        ActorKind::Local => pb::InputActorKind::Local,
        ActorKind::ApiKey => pb::InputActorKind::ApiKey,
        ActorKind::Mtls => pb::InputActorKind::Mtls,
        ActorKind::A2a => pb::InputActorKind::A2a,
        ActorKind::Delegate => pb::InputActorKind::Delegate,
        ActorKind::System => pb::InputActorKind::System,
    };
    pb::InputActor {
        kind: kind.into(),
        id: a.id,
        admin: a.admin,
    }
}
