//! The byte budget of what a task repeats. A `Task` carries the answer in
//! its artifact, again in its history and again in its status message: a
//! long answer three times would be more than a client with gRPC's default
//! 4 MiB limit can read. So the artifact carries the answer (up to
//! [`ARTIFACT_BYTES`]), and the history and the status message carry at
//! most [`MESSAGE_BYTES`] of each message ([`HISTORY_BYTES`] in all),
//! cut at a character boundary and ending with a visible marker that says
//! how much was left out and where to read it all: agentrt.v1
//! `SessionService.GetHistory` of the context's session, which keeps every
//! message whole. A cut message's `metadata` also says so
//! (`agentrt_truncated`, `agentrt_text_bytes`).

use agentrt_proto::a2a::v1 as a2a;
use prost::Message as _;
use prost_types::value::Kind;

/// Most bytes of answer text in a task's artifact: with the history and
/// the status message, a task stays well under 4 MiB.
pub const ARTIFACT_BYTES: usize = 3 << 20;
/// Most bytes of text of one message in a task's history or status.
pub const MESSAGE_BYTES: usize = 16 << 10;
/// Most bytes of text of a task's whole history (the newest messages are
/// kept).
pub const HISTORY_BYTES: usize = 64 << 10;
/// How the marker at the end of a cut text starts.
pub const MARKER: &str = "[truncated by agentrt:";

/// The marker of a text cut to `shown` of `total` bytes.
fn marker(shown: usize, total: usize, context_id: &str) -> String {
    format!(
        "\n\n{MARKER} {shown} of {total} bytes shown; the whole text is in agentrt.v1 \
         SessionService.GetHistory of session {context_id}]"
    )
}

/// `agentrt_truncated: true, agentrt_text_bytes: total`, for a cut
/// message's or artifact's metadata.
pub fn truncated_metadata(total: usize) -> prost_types::Struct {
    let value = |kind| prost_types::Value { kind: Some(kind) };
    prost_types::Struct {
        fields: [
            ("agentrt_truncated".to_owned(), value(Kind::BoolValue(true))),
            (
                "agentrt_text_bytes".to_owned(),
                // Exact below 2^53: any text this server holds.
                value(Kind::NumberValue(total as f64)),
            ),
        ]
        .into(),
    }
}

/// A text kept up to a byte budget as it arrives, counting the rest.
#[derive(Debug, Clone)]
pub struct Clipped {
    text: String,
    total: usize,
    budget: usize,
    cut: bool,
}

impl Clipped {
    /// Empty, keeping at most `budget` bytes.
    pub fn new(budget: usize) -> Self {
        Self {
            text: String::new(),
            total: 0,
            budget,
            cut: false,
        }
    }

    /// `budget` bytes of `text` at most.
    pub fn of(text: &str, budget: usize) -> Self {
        let mut this = Self::new(budget);
        this.push(text);
        this
    }

    /// Appends `more`, as much of it as the budget leaves room for; once a
    /// piece was cut nothing more is kept (the kept text is a prefix).
    pub fn push(&mut self, more: &str) {
        self.total += more.len();
        if self.cut {
            return;
        }
        let room = self.budget - self.text.len();
        if more.len() <= room {
            self.text.push_str(more);
        } else {
            // The longest prefix within `room` that ends on a char boundary
            // (str::floor_char_boundary is newer than the MSRV).
            let end = (0..=room)
                .rev()
                .find(|&i| more.is_char_boundary(i))
                .unwrap_or(0);
            self.text.push_str(&more[..end]);
            self.cut = true;
        }
    }

    /// Nothing was pushed (or only empty text).
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// How many bytes were pushed in all, when more than were kept.
    pub fn cut_from(&self) -> Option<usize> {
        self.cut.then_some(self.total)
    }

    /// The kept text, with the marker when it was cut.
    pub fn finish(self, context_id: &str) -> String {
        let mut text = self.text;
        if self.cut {
            let shown = text.len();
            text.push_str(&marker(shown, self.total, context_id));
        }
        text
    }
}

/// An agent or user message of a task's history or status: its id, role
/// and text, the text within the budget.
#[derive(Debug)]
pub struct Entry {
    /// The stored message id.
    pub id: String,
    /// User or agent.
    pub role: a2a::Role,
    /// The whole text.
    pub text: String,
}

/// The texts of `entries` within [`HISTORY_BYTES`] in all and
/// [`MESSAGE_BYTES`] each, newest first in the budget: each kept entry's
/// text, cut (with the marker) where needed, and its whole length when cut.
/// Entries the budget has no room left for are left out, oldest first.
pub fn history(entries: Vec<Entry>, context_id: &str) -> Vec<(Entry, Option<usize>)> {
    let mut left = HISTORY_BYTES;
    let mut kept = Vec::new();
    for mut entry in entries.into_iter().rev() {
        if left == 0 {
            break;
        }
        let clipped = Clipped::of(&entry.text, left.min(MESSAGE_BYTES));
        left -= clipped.text.len();
        let cut = clipped.cut_from();
        if cut.is_some() {
            entry.text = clipped.finish(context_id);
        }
        kept.push((entry, cut));
    }
    kept.reverse();
    kept
}

/// The caller's `message` as a task's history echoes it: its text parts
/// within [`MESSAGE_BYTES`] (the first cut one ends with the marker, the
/// parts after it are left out), and its metadata, extensions and
/// referenced task ids only while the whole stays within twice that.
pub fn clip_message(message: &mut a2a::Message) {
    let total: usize = message.parts.iter().map(text_len).sum();
    if total > MESSAGE_BYTES {
        let mut left = MESSAGE_BYTES;
        let mut keep = message.parts.len();
        for (i, part) in message.parts.iter_mut().enumerate() {
            let Some(a2a::part::Content::Text(text)) = &mut part.content else {
                continue;
            };
            if text.len() <= left {
                left -= text.len();
                continue;
            }
            let mut clipped = Clipped::of(text, left);
            // The marker counts the whole message's text.
            clipped.total = total;
            *text = clipped.finish(&message.context_id);
            keep = i + 1;
            break;
        }
        message.parts.truncate(keep);
        message.metadata = Some(truncated_metadata(total));
    }
    if message.encoded_len() > 2 * MESSAGE_BYTES {
        message.metadata = (total > MESSAGE_BYTES).then(|| truncated_metadata(total));
        message.extensions.clear();
        message.reference_task_ids.clear();
    }
}

fn text_len(part: &a2a::Part) -> usize {
    match &part.content {
        Some(a2a::part::Content::Text(text)) => text.len(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clipped_text_is_a_prefix_with_the_marker_and_counts_the_rest() {
        let mut c = Clipped::new(10);
        for piece in ["abc", "défgh", "ijklmnop", "q"] {
            c.push(piece);
        }
        assert_eq!(c.cut_from(), Some(18));
        let text = c.finish("s-1");
        assert!(text.starts_with("abcdéfgh"), "{text}");
        assert!(text.contains(MARKER));
        assert!(text.contains("of 18 bytes"));
        assert!(text.contains("GetHistory of session s-1"));
        let whole = Clipped::of("short", 10);
        assert_eq!(whole.cut_from(), None);
        assert_eq!(whole.finish("s"), "short");
        // A cut inside a multi-byte character backs off to its start.
        let c = Clipped::of("ééé", 3);
        assert!(c.finish("s").starts_with("é\n\n"));
    }

    #[test]
    fn the_history_keeps_its_budget_newest_first() {
        let entry = |n: usize| Entry {
            id: format!("m{n}"),
            role: a2a::Role::Agent,
            text: "x".repeat(40 << 10),
        };
        let kept = history((0..10).map(entry).collect(), "s");
        let total: usize = kept.iter().map(|(e, _)| e.text.len()).sum();
        assert!(total <= HISTORY_BYTES + 4 * 200, "{total}");
        assert_eq!(kept.last().unwrap().0.id, "m9");
        assert!(
            kept.iter()
                .all(|(e, cut)| cut == &Some(40 << 10) && e.text.contains(MARKER))
        );
        assert_eq!(kept.len(), 4);
        let small = history(
            vec![Entry {
                id: "m".into(),
                role: a2a::Role::User,
                text: "hi".into(),
            }],
            "s",
        );
        assert_eq!(small[0].0.text, "hi");
        assert_eq!(small[0].1, None);
    }

    #[test]
    fn an_echoed_user_message_is_clipped() {
        let part = |t: &str| a2a::Part {
            content: Some(a2a::part::Content::Text(t.to_owned())),
            ..Default::default()
        };
        let mut m = a2a::Message {
            context_id: "s".into(),
            parts: vec![part(&"a".repeat(1 << 20)), part("b")],
            extensions: vec!["e".repeat(1 << 20)],
            ..Default::default()
        };
        clip_message(&mut m);
        assert_eq!(m.parts.len(), 1);
        assert!(m.encoded_len() < 2 * MESSAGE_BYTES);
        assert!(m.metadata.is_some());
        let mut small = a2a::Message {
            parts: vec![part("hi")],
            ..Default::default()
        };
        clip_message(&mut small);
        assert_eq!(small.parts.len(), 1);
        assert!(small.metadata.is_none());
    }
}
