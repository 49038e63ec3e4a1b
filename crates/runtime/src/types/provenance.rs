//! Who wrote a user message, in two independent parts (CONTRACT §8):
//!
//! - the **speaker** ([`Speaker`]): who the caller says is talking, from
//!   `ChatRequest.speaker` — a participant of a group session. It is shown
//!   to the model and returned in history, and nothing else: it never
//!   changes the session's owner or what the call may do.
//! - the **input actor** ([`super::InputActor`]): how the server
//!   authenticated the call that brought the message, from the credentials
//!   only.

use serde::{Deserialize, Serialize};

/// Most bytes of a [`Speaker::id`].
pub const MAX_SPEAKER_ID_BYTES: usize = 128;
/// Most bytes of a [`Speaker::display_name`].
pub const MAX_SPEAKER_NAME_BYTES: usize = 256;
/// Most characters of the OpenAI `name` derived from a speaker (the API's
/// own limit).
const MAX_WIRE_NAME: usize = 64;

/// The author of a user message in a group session, as the caller names
/// them; a label, never an identity the server trusts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Speaker {
    /// The caller's id for the participant (1-128 bytes, no control
    /// characters).
    pub id: String,
    /// How the model is told their name (at most 256 bytes, no control
    /// characters); empty: the id.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub display_name: String,
}

impl Speaker {
    /// A speaker `id` shown as `display_name`.
    pub fn new(id: impl Into<String>, display_name: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            display_name: display_name.into(),
        }
    }

    /// The name the model is shown: the display name, else the id.
    pub fn shown(&self) -> &str {
        if self.display_name.trim().is_empty() {
            &self.id
        } else {
            &self.display_name
        }
    }

    /// `[Alice]: `, the prefix of the message text for a provider without
    /// a name field of its own.
    pub fn prefix(&self) -> String {
        format!("[{}]: ", self.shown())
    }

    /// The speaker as an OpenAI message `name` (`^[a-zA-Z0-9_-]{1,64}$`),
    /// the same for the same speaker every time: the shown name with
    /// spaces and dots as `_` and every other character outside the set
    /// left out; when nothing is left, the id so; when still nothing, a
    /// name made of a hash of the id.
    pub fn wire_name(&self) -> String {
        let from_name = wire_chars(self.shown());
        if !from_name.is_empty() {
            return from_name;
        }
        let from_id = wire_chars(&self.id);
        if !from_id.is_empty() {
            return from_id;
        }
        format!("speaker_{:016x}", fnv1a(self.id.as_bytes()))
    }

    /// The violations of the limits above as (field, problem), fields
    /// named under `field` (`speaker.id`, `speaker.display_name`).
    pub fn check(&self, field: &str, violations: &mut Vec<(String, String)>) {
        let id = format!("{field}.id");
        if self.id.trim().is_empty() {
            violations.push((id, "must not be empty".to_owned()));
        } else {
            check_text(id, &self.id, MAX_SPEAKER_ID_BYTES, violations);
        }
        check_text(
            format!("{field}.display_name"),
            &self.display_name,
            MAX_SPEAKER_NAME_BYTES,
            violations,
        );
    }
}

fn check_text(field: String, text: &str, max: usize, violations: &mut Vec<(String, String)>) {
    if text.len() > max {
        violations.push((
            field,
            format!("is {} bytes; the limit is {max}", text.len()),
        ));
    } else if text.chars().any(char::is_control) {
        violations.push((
            field,
            "must not contain control characters (newlines, tabs, …)".to_owned(),
        ));
    }
}

/// `text` reduced to the characters OpenAI accepts in a name, at most
/// [`MAX_WIRE_NAME`] of them.
fn wire_chars(text: &str) -> String {
    text.trim()
        .chars()
        .filter_map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '-' => Some(c),
            ' ' | '.' => Some('_'),
            _ => None,
        })
        .take(MAX_WIRE_NAME)
        .collect()
}

/// FNV-1a, 64 bits: stable across builds and platforms (std's hasher is
/// not), so a speaker's fallback name never changes.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn violations(speaker: &Speaker) -> Vec<String> {
        let mut out = Vec::new();
        speaker.check("speaker", &mut out);
        out.into_iter().map(|(field, _)| field).collect()
    }

    #[test]
    fn wire_names_are_valid_and_deterministic() {
        let valid = |n: &str| {
            !n.is_empty()
                && n.len() <= 64
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        for (speaker, expected) in [
            (Speaker::new("u1", "Alice Smith"), "Alice_Smith"),
            (Speaker::new("u1", ""), "u1"),
            (Speaker::new("bob@example.com", "   "), "bobexample_com"),
            (Speaker::new("u-7", "Алиса"), "u-7"),
        ] {
            assert_eq!(speaker.wire_name(), expected);
        }
        let cyrillic = Speaker::new("Ёж", "Алиса");
        assert!(valid(&cyrillic.wire_name()), "{}", cyrillic.wire_name());
        assert_eq!(
            cyrillic.wire_name(),
            Speaker::new("Ёж", "Алиса").wire_name()
        );
        assert_ne!(cyrillic.wire_name(), Speaker::new("Ёжик", "").wire_name());
        let long = Speaker::new("x", "a".repeat(200));
        assert_eq!(long.wire_name().len(), 64);
    }

    #[test]
    fn the_prefix_shows_the_display_name_else_the_id() {
        assert_eq!(Speaker::new("u1", "Alice").prefix(), "[Alice]: ");
        assert_eq!(Speaker::new("u1", "").prefix(), "[u1]: ");
    }

    /// A user message as stored before provenance existed.
    const OLD_MESSAGE: &str = r#"{"seq":3,"id":"m1","turn_id":"t1","role":"user",
        "content":[{"type":"text","text":"hi"}],"model":null,"usage":null,"stop_reason":null,
        "created_at":{"secs_since_epoch":1700000000,"nanos_since_epoch":0},"compacted":false}"#;

    #[test]
    fn records_stored_before_provenance_still_read() {
        let old: crate::types::Message = serde_json::from_str(OLD_MESSAGE).unwrap();
        assert_eq!(old.seq, 3);
        assert_eq!((old.body.speaker, old.body.input_actor), (None, None));
        let body: crate::types::NewMessage = serde_json::from_str(OLD_MESSAGE).unwrap();
        assert_eq!((body.speaker, body.input_actor), (None, None));
        let queued: crate::types::Queued = serde_json::from_str(
            r#"{"id":"q1","session_id":"s1","incarnation":"i1",
            "enqueued_at":{"secs_since_epoch":1700000000,"nanos_since_epoch":0},"admin":true,
            "input":{"content":[{"type":"text","text":"later"}]}}"#,
        )
        .unwrap();
        assert_eq!((queued.actor, queued.input.speaker), (None, None));
        let actor: super::super::InputActor =
            serde_json::from_str(r#"{"kind":"api_key","id":"alice"}"#).unwrap();
        assert!(!actor.admin);
    }

    #[test]
    fn provenance_round_trips_through_the_stored_shape() {
        let mut message: crate::types::Message = serde_json::from_str(OLD_MESSAGE).unwrap();
        message.body.speaker = Some(Speaker::new("u1", "Alice"));
        let mut actor = super::super::InputActor::new(super::super::ActorKind::Mtls, "spiffe://x");
        actor.admin = true;
        message.body.input_actor = Some(actor);
        let json = serde_json::to_string(&message).unwrap();
        let back: crate::types::Message = serde_json::from_str(&json).unwrap();
        assert_eq!(back, message);
    }

    #[test]
    fn speakers_are_bounded_and_free_of_control_characters() {
        assert!(violations(&Speaker::new("u1", "Alice")).is_empty());
        assert!(violations(&Speaker::new("u1", "")).is_empty());
        assert_eq!(violations(&Speaker::new(" ", "Alice")), ["speaker.id"]);
        assert_eq!(
            violations(&Speaker::new("a".repeat(129), "")),
            ["speaker.id"]
        );
        assert!(violations(&Speaker::new("a".repeat(128), "b".repeat(256))).is_empty());
        assert_eq!(
            violations(&Speaker::new("u1", "b".repeat(257))),
            ["speaker.display_name"]
        );
        assert_eq!(
            violations(&Speaker::new("u\n1", "Al\u{7}ice")),
            ["speaker.id", "speaker.display_name"]
        );
    }
}
