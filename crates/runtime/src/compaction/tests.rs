use super::*;
use crate::types::{NewMessage, StopReason};

fn msg(seq: u64, role: Role, text: &str) -> Message {
    Message {
        seq,
        body: NewMessage::new("t", role, vec![ContentBlock::text(text)]),
        compacted: false,
    }
}

fn tool_pair(seq: u64) -> [Message; 2] {
    let call = Message {
        seq,
        body: NewMessage::new(
            "t",
            Role::Assistant,
            vec![ContentBlock::ToolCall {
                id: format!("c{seq}"),
                name: "lookup".into(),
                arguments_json: "{}".into(),
            }],
        ),
        compacted: false,
    };
    let result = Message {
        seq: seq + 1,
        body: NewMessage::new(
            "t",
            Role::Tool,
            vec![ContentBlock::ToolResult {
                call_id: format!("c{seq}"),
                name: "lookup".into(),
                content: "found".into(),
                is_error: false,
                interrupted: None,
                media: Vec::new(),
            }],
        ),
        compacted: false,
    };
    [call, result]
}

/// user, assistant(call), tool, assistant per turn.
fn turns(n: u64) -> Vec<Message> {
    let mut out = Vec::new();
    for t in 0..n {
        let base = t * 4 + 1;
        out.push(msg(base, Role::User, &format!("question {t}")));
        out.extend(tool_pair(base + 1));
        out.push(msg(base + 3, Role::Assistant, &format!("answer {t}")));
    }
    out
}

#[test]
fn split_keeps_the_last_user_turns_and_never_splits_tool_pairs() {
    let tail = turns(10);
    let cut = split_point(&tail, 6).unwrap();
    assert_eq!(tail[cut].body.role, Role::User);
    assert_eq!(
        tail[cut..]
            .iter()
            .filter(|m| m.body.role == Role::User)
            .count(),
        6
    );
    // Every tool result kept has its call kept too.
    for (i, m) in tail[cut..].iter().enumerate() {
        if m.body.role == Role::Tool {
            assert!(i > 0 && tail[cut + i - 1].body.role == Role::Assistant);
        }
    }
}

#[test]
fn split_keeps_fewer_turns_when_needed_and_none_for_one_turn() {
    let tail = turns(3);
    let cut = split_point(&tail, 6).unwrap();
    assert_eq!(tail[cut].seq, 5, "two turns kept, the first summarised");
    assert_eq!(split_point(&turns(1), 6), None);
    assert_eq!(split_point(&[], 6), None);
    let cut = split_point(&turns(2), 0).unwrap();
    assert_eq!(tail[cut].seq, 5, "at least the newest turn is kept");
}

#[test]
fn truncation_cuts_at_user_messages_and_keeps_the_newest_turn() {
    let mut tail = turns(5);
    let per_turn: u64 = tail[..4].iter().map(estimate_message).sum();
    let cut = truncation_point(&tail, 0, per_turn * 2);
    assert_eq!(tail[cut].body.role, Role::User);
    assert_eq!(tail.len() - cut, 8, "two turns fit");
    // The newest turn is kept even when it alone is too big.
    tail.push(msg(21, Role::User, &"x".repeat(10_000)));
    let cut = truncation_point(&tail, 0, 10);
    assert_eq!(cut, tail.len() - 1);
    assert_eq!(truncation_point(&tail, 0, u64::MAX), 0);
}

#[test]
fn estimates_use_reported_usage_after_the_summary() {
    let mut tail = turns(2);
    let heuristic = estimate_context(None, None, &tail);
    assert!(heuristic > 0);
    tail[3].body.usage = Some(Usage {
        input_tokens: 50_000,
        output_tokens: 100,
        ..Usage::default()
    });
    tail[3].body.stop_reason = Some(StopReason::Stop);
    let after: u64 = tail[4..].iter().map(estimate_message).sum();
    assert_eq!(estimate_context(None, None, &tail), 50_100 + after);
    // Usage measured before the latest summary does not count.
    let summary = msg(100, Role::Summary, "short");
    let with_summary = estimate_context(Some("system"), Some(&summary), &tail);
    assert!(with_summary < 1_000, "{with_summary}");
}

#[test]
fn transcript_holds_the_previous_summary_and_leaves_out_the_oldest() {
    let summary = msg(9, Role::Summary, "earlier facts");
    let tail = turns(3);
    let full = transcript(Some(&summary), &tail, usize::MAX);
    assert!(full.starts_with("Summary of the conversation before this transcript:\nearlier facts"));
    assert!(full.contains("[user] question 0"));
    assert!(full.contains("[assistant] called tool lookup with {}"));
    assert!(full.contains("[tool lookup result] found"));
    let short = transcript(None, &tail, 40);
    assert!(short.contains("[older messages left out]"));
    assert!(short.contains("answer 2"));
    assert!(!short.contains("question 0"));
}

#[test]
fn transcript_names_the_speaker_of_a_user_message() {
    let mut said = msg(1, Role::User, "hello");
    said.body.speaker = Some(crate::types::Speaker::new("u1", "Alice"));
    let out = transcript(None, &[said, msg(2, Role::User, "anonymous")], usize::MAX);
    assert!(out.contains("[user Alice] hello"), "{out}");
    assert!(out.contains("[user] anonymous"), "{out}");
}

#[test]
fn clip_respects_char_boundaries() {
    assert_eq!(clip("héllo", 2), "hé…");
    assert_eq!(clip("hi", 5), "hi");
}

/// A summariser that streams 64 KiB deltas without end; only the output
/// bound can stop it (the timeout is far away).
#[derive(Debug)]
struct Rambler;

#[async_trait::async_trait]
impl crate::model::ModelProvider for Rambler {
    async fn stream(
        &self,
        _request: crate::model::ModelRequest,
    ) -> Result<crate::model::ModelStream, crate::model::ModelError> {
        // "é" is two bytes: the cut must land on a character boundary.
        let delta = format!("a{}", "é".repeat(32 * 1024));
        Ok(Box::pin(futures::stream::repeat_with(move || {
            Ok(crate::model::ModelEvent::TextDelta(delta.clone()))
        })))
    }

    fn max_step_output_bytes(&self, _model: &str) -> usize {
        200_000
    }
}

#[tokio::test]
async fn a_summariser_that_never_stops_is_cut_at_the_output_bound() {
    let (text, _usage) = summarise(
        &Rambler,
        "m",
        "transcript".to_owned(),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert!(text.len() <= 200_000, "{} bytes kept", text.len());
    assert!(text.len() > 199_990, "{} bytes kept", text.len());
}
