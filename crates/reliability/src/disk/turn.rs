//! What a client saw of one turn, and the requests the phases send.

use std::time::Duration;

use agentrt_client::{ChatEvent, Event, EventStream, proto};
use futures::StreamExt as _;

use crate::fake::{Mode, directive};

/// What a client saw of one turn.
#[derive(Debug, Default)]
pub(super) struct Turn {
    pub(super) turn_id: String,
    pub(super) acks: Vec<(u64, String, proto::Role)>,
    pub(super) outcome: Option<proto::TurnOutcome>,
    pub(super) errors: Vec<(proto::ErrorCode, String)>,
    /// The stream failed or did not end in time.
    pub(super) broken: Option<String>,
    /// A text delta arrived (the answer started).
    pub(super) text: bool,
}

impl Turn {
    pub(super) fn absorb(&mut self, event: Event) {
        if self.turn_id.is_empty() {
            self.turn_id.clone_from(&event.turn_id);
        }
        match event.kind {
            ChatEvent::Text(_) => self.text = true,
            ChatEvent::MessageStored { seq, id, role } => self.acks.push((seq, id, role)),
            ChatEvent::Error { code, message } => self.errors.push((code, message)),
            ChatEvent::TurnFinished { outcome, .. } => self.outcome = Some(outcome),
            _ => {}
        }
    }

    /// Reads until the first text delta, or the end.
    pub(super) async fn until_text(&mut self, stream: &mut EventStream) {
        while !self.text {
            match stream.next().await {
                Some(Ok(e)) => self.absorb(e),
                Some(Err(e)) => {
                    self.broken = Some(e.to_string());
                    return;
                }
                None => return,
            }
        }
    }

    /// Reads to the end, for at most `limit`.
    pub(super) async fn finish(&mut self, stream: &mut EventStream, limit: Duration) {
        let drain = async {
            while let Some(item) = stream.next().await {
                match item {
                    Ok(e) => self.absorb(e),
                    Err(e) => {
                        self.broken = Some(e.to_string());
                        return;
                    }
                }
            }
        };
        if tokio::time::timeout(limit, drain).await.is_err() {
            self.broken = Some(format!("no end within {limit:?}"));
        }
    }

    pub(super) fn succeeded(&self) -> bool {
        self.outcome == Some(proto::TurnOutcome::Success) && self.broken.is_none()
    }

    /// What the caller was told went wrong: `None` when it succeeded.
    pub(super) fn told(&self) -> Option<String> {
        if self.succeeded() {
            return None;
        }
        let said = self
            .errors
            .first()
            .map(|(c, m)| format!("error event {c:?}: {m}"));
        Some(
            said.or_else(|| self.broken.clone())
                .unwrap_or_else(|| format!("{:?}", self.outcome)),
        )
    }

    pub(super) fn ended_disk_full(&self) -> bool {
        self.errors
            .iter()
            .any(|(c, m)| *c == proto::ErrorCode::Unavailable && m.contains("disk is full"))
    }
}

/// A refusal at admission for the full disk.
pub(super) fn disk_full(e: &agentrt_client::Error) -> bool {
    e.code() == Some(tonic::Code::Unavailable)
        && e.status()
            .is_some_and(|s| s.message().contains("disk is full"))
}

pub(super) fn request(sid: &str, text: String) -> proto::ChatRequest {
    proto::ChatRequest {
        session_id: sid.to_owned(),
        content: vec![proto::ContentBlock {
            block: Some(proto::content_block::Block::Text(proto::TextBlock { text })),
        }],
        ..Default::default()
    }
}

/// A `bytes`-long user message asking the fake for a short answer.
pub(super) fn big_text(key: &str, bytes: u64) -> String {
    let mut s = directive(Mode::Text, 3, key);
    while (s.len() as u64) < bytes {
        s.push_str(" padding");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_ended_disk_full_only_with_the_unavailable_error_event() {
        let mut t = Turn {
            outcome: Some(proto::TurnOutcome::Error),
            ..Turn::default()
        };
        assert!(!t.ended_disk_full());
        t.errors
            .push((proto::ErrorCode::Internal, "disk is full".into()));
        assert!(!t.ended_disk_full(), "the code must be UNAVAILABLE");
        t.errors.push((
            proto::ErrorCode::Unavailable,
            "the server's disk is full: retry".into(),
        ));
        assert!(t.ended_disk_full());
        assert_eq!(
            t.told().as_deref(),
            Some("error event Internal: disk is full")
        );
        let ok = Turn {
            outcome: Some(proto::TurnOutcome::Success),
            ..Turn::default()
        };
        assert!(ok.succeeded() && ok.told().is_none());
    }

    #[test]
    fn a_big_text_is_a_directive_of_the_size_asked() {
        let t = big_text("k1", 10_000);
        assert!(t.starts_with(&directive(Mode::Text, 3, "k1")));
        assert!((10_000..10_010).contains(&t.len()));
    }
}
