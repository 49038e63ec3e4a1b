//! `--output json`: results in the protobuf JSON mapping, the form
//! grpcurl prints — every field (defaults included), timestamps and
//! durations as RFC 3339 / `"1.5s"` strings, enums by name — with two
//! choices the mapping allows or scripts want: the `.proto` field names
//! (`session_id`, as in the protos and the rest of the CLI's JSON), and
//! 64-bit integers as JSON numbers (every count here is far below 2^53).
//!
//! The mapping is done generically from the API's descriptors
//! ([`agentrt_proto::FILE_DESCRIPTOR_SET`]) with prost-reflect: a message
//! is re-read as a dynamic message of its type and serialized. (pbjson's
//! generated serde impls would need the well-known types of pbjson-types
//! in place of prost-types in every crate that shares the generated code.)

use std::sync::LazyLock;

use agentrt_client::proto;
use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use serde_json::Value;

static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(agentrt_proto::FILE_DESCRIPTOR_SET)
        .expect("the API's descriptors, built with this binary, decode")
});

/// A generated message and its protobuf type name.
pub(crate) trait Proto: prost::Message + Sized {
    /// `agentrt.v1.Session`, ...
    const NAME: &'static str;
}

macro_rules! names {
    ($($ty:ident),* $(,)?) => {
        $(impl Proto for proto::$ty {
            const NAME: &'static str = concat!("agentrt.v1.", stringify!($ty));
        })*
        /// Every type name above (checked by a test).
        #[cfg(test)]
        const NAMES: &[&str] = &[$(concat!("agentrt.v1.", stringify!($ty))),*];
    };
}

names!(
    Session,
    Message,
    Turn,
    SessionStatus,
    ChatEvent,
    RuntimeStats,
    UserUsage,
    Agent,
    BlobRef,
    CompactSessionResponse,
    DrainResponse,
    UndrainResponse,
    SetDefaultModelResponse,
    InvalidateRunnersResponse,
    ResetRunnersResponse,
    DeleteSessionsResponse,
    Replica,
    ReplicaLease,
);

/// `m` in the protobuf JSON mapping (see the module docs).
pub(crate) fn of<M: Proto>(m: &M) -> Value {
    let descriptor = POOL
        .get_message_by_name(M::NAME)
        .expect("every Proto type is in the API's descriptors");
    let dynamic = DynamicMessage::decode(descriptor, m.encode_to_vec().as_slice())
        .expect("a message re-reads as its own type");
    let options = SerializeOptions::new()
        .skip_default_fields(false)
        .use_proto_field_name(true)
        .stringify_64_bit_integers(false);
    dynamic
        .serialize_with_options(serde_json::value::Serializer, &options)
        .expect("a dynamic message serializes to a JSON value")
}

/// Each of `items` in the mapping.
pub(crate) fn list<M: Proto>(items: &[M]) -> Value {
    Value::Array(items.iter().map(of).collect())
}

/// An event in the mapping, with `type` naming its kind (the set field of
/// the `kind` oneof, e.g. `text`, `turn_finished`) so scripts can switch
/// on it.
pub(crate) fn event(e: &proto::ChatEvent) -> Value {
    let mut value = of(e);
    let kind = POOL
        .get_message_by_name(proto::ChatEvent::NAME)
        .and_then(|d| d.oneofs().find(|o| o.name() == "kind"))
        .and_then(|oneof| {
            oneof
                .fields()
                .map(|f| f.name().to_owned())
                .find(|name| value.get(name).is_some())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    if let Value::Object(map) = &mut value {
        map.insert("type".to_owned(), Value::String(kind));
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_is_in_the_descriptors() {
        for name in NAMES {
            assert!(POOL.get_message_by_name(name).is_some(), "{name}");
        }
    }

    #[test]
    fn a_message_maps_with_every_field_rfc3339_times_and_enum_names() {
        let m = proto::Message {
            seq: 3,
            role: proto::Role::Assistant as i32,
            created_at: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 0,
            }),
            usage: Some(proto::Usage {
                input_tokens: 7,
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = of(&m);
        assert_eq!(v["seq"], 3, "{v}");
        assert_eq!(v["role"], "ROLE_ASSISTANT", "{v}");
        assert_eq!(v["created_at"], "2023-11-14T22:13:20Z", "{v}");
        assert_eq!(v["usage"]["input_tokens"], 7, "{v}");
        assert_eq!(v["usage"]["output_tokens"], 0, "defaults are printed: {v}");
        assert_eq!(v["model"], "", "{v}");
    }

    #[test]
    fn an_event_names_its_kind() {
        let e = proto::ChatEvent {
            seq: 1,
            kind: Some(proto::chat_event::Kind::Text(proto::TextDelta {
                text: "hi".into(),
            })),
            ..Default::default()
        };
        let v = event(&e);
        assert_eq!(v["type"], "text", "{v}");
        assert_eq!(v["text"]["text"], "hi", "{v}");
    }
}
