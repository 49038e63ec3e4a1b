//! Upper bounds of how many bytes a stored value takes on the wire, so a
//! page can be cut by bytes while it is read (the runtime core knows no
//! protobuf, so this is an estimate — never below the real encoding).
//!
//! Every field is counted as its payload plus [`FIELD`] bytes (a tag of at
//! most 2 bytes — field numbers stay below 2048 — and a length or varint of
//! at most 10), every nested message as its fields plus [`FIELD`] (which
//! also covers the repeated-element framing of the page itself).

use crate::types::{ContentBlock, Message, NewMessage, Session};

/// Tag plus the largest varint: what any field adds beyond its payload.
const FIELD: usize = 12;
/// A `google.protobuf.Timestamp`: two varints in a nested message.
const TIMESTAMP: usize = FIELD + 2 * FIELD;

fn string(len: usize) -> usize {
    FIELD + len
}

/// Bytes `block` takes as an `agentrt.v1.ContentBlock`, at most.
fn block(b: &ContentBlock) -> usize {
    // The ContentBlock message and the oneof's own message.
    let framing = 2 * FIELD;
    framing
        + match b {
            ContentBlock::Text { text } => string(text.len()),
            ContentBlock::Thinking {
                thinking,
                signature,
            } => string(thinking.len()) + string(signature.len()),
            ContentBlock::Image { data, mime_type } => string(data.len()) + string(mime_type.len()),
            ContentBlock::File {
                data,
                mime_type,
                name,
            } => string(data.len()) + string(mime_type.len()) + string(name.len()),
            ContentBlock::Media(media) => media_ref(media),
            ContentBlock::ToolCall {
                id,
                name,
                arguments_json,
            } => string(id.len()) + string(name.len()) + string(arguments_json.len()),
            ContentBlock::ToolResult {
                call_id,
                name,
                content,
                media,
                ..
            } => {
                string(call_id.len())
                    + string(name.len())
                    + string(content.len())
                    + FIELD
                    + media.iter().map(|m| FIELD + media_ref(m)).sum::<usize>()
            }
        }
}

/// Bytes of a blob reference (id, mime type, size, name, digest), at most.
fn media_ref(m: &crate::types::MediaRef) -> usize {
    string(m.blob_id.len()) * 2 + string(m.mime_type.len()) + string(m.name.len()) + 2 * FIELD
}

/// Bytes `m` takes as an `agentrt.v1.Message` inside a page, at most.
pub fn message_wire_bytes(m: &Message) -> usize {
    new_message_wire_bytes(&m.body)
}

/// [`message_wire_bytes`] of `body` once stored (its seq does not change
/// the bound).
pub(crate) fn new_message_wire_bytes(body: &NewMessage) -> usize {
    let fixed = FIELD // the element's own framing in the page
        + FIELD // seq
        + FIELD // role
        + (FIELD + 4 * FIELD) // usage
        + string(16) // stop_reason: the longest name is 11 bytes
        + TIMESTAMP // created_at
        + FIELD; // compacted
    fixed
        + string(body.id.len())
        + string(body.turn_id.len())
        + string(body.model.as_ref().map_or(0, String::len))
        + body.content.iter().map(block).sum::<usize>()
}

/// The bytes a user message counts for the `stored_bytes` quota
/// ([`QuotaLimits::stored_bytes`](crate::quota::QuotaLimits::stored_bytes)):
/// what [`message_wire_bytes`] counts for it once stored (an upper bound of
/// its encoding; its seq does not change it).
pub fn stored_bytes(new: &NewMessage) -> u64 {
    new_message_wire_bytes(new) as u64
}

/// Bytes `s` takes as an `agentrt.v1.Session` inside a page, at most.
pub fn session_wire_bytes(s: &Session) -> usize {
    let fixed = FIELD // the element's own framing in the page
        + 2 * TIMESTAMP // created_at, last_active_at
        + FIELD // archived
        + FIELD; // message_count
    let last_turn = s.last_turn.as_ref().map_or(0, |t| {
        FIELD + string(t.turn_id.len()) + FIELD + 2 * TIMESTAMP
    });
    let metadata: usize = s
        .metadata
        .iter()
        .map(|(k, v)| FIELD + string(k.len()) + string(v.len()))
        .sum();
    fixed
        + last_turn
        + metadata
        + [
            &s.id,
            &s.owner,
            &s.agent_id,
            &s.project_id,
            &s.title,
            &s.model,
            &s.system_prompt,
        ]
        .iter()
        .map(|f| string(f.len()))
        .sum::<usize>()
}

/// Takes items while their running size stays within `max_bytes`, but
/// always the first (a page always makes progress). Reports through
/// [`Budget::admit`] whether an item still fits.
#[derive(Debug)]
pub(crate) struct Budget {
    left: usize,
    taken: usize,
}

impl Budget {
    pub(crate) fn new(max_bytes: usize) -> Self {
        Self {
            left: max_bytes,
            taken: 0,
        }
    }

    /// Whether an item of `bytes` joins the page; once one does not, the
    /// page is full.
    pub(crate) fn admit(&mut self, bytes: usize) -> bool {
        if self.taken > 0 && bytes > self.left {
            return false;
        }
        self.left = self.left.saturating_sub(bytes);
        self.taken += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_item_is_taken_whatever_its_size() {
        let mut budget = Budget::new(10);
        assert!(budget.admit(100));
        assert!(!budget.admit(1));
        let mut budget = Budget::new(10);
        assert!(budget.admit(4) && budget.admit(6));
        assert!(!budget.admit(1));
    }
}
