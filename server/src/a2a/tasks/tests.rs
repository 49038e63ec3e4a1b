use super::*;
use agentrt_runtime::types::Usage;
use std::time::Duration;

fn ev(kind: EventKind) -> TurnEvent {
    TurnEvent {
        seq: 0,
        at: SystemTime::now(),
        kind,
    }
}

#[test]
fn a_turn_streams_task_working_chunks_and_the_terminal_status() {
    let mut out = VecDeque::new();
    let user = a2a::Message::default();
    let mut t = Translator::for_send("s/t".into(), "s".into(), user);
    t.on_event(
        &ev(EventKind::TurnStarted {
            model: "m".into(),
            thinking: None,
            user_message_seq: 1,
            system_overridden: false,
        }),
        &mut out,
    );
    for delta in ["echo", ": ", "hi"] {
        t.on_event(&ev(EventKind::Text(delta.into())), &mut out);
    }
    t.on_event(
        &ev(EventKind::TurnFinished {
            outcome: TurnOutcome::Success,
            cancel_reason: None,
            usage: Usage::default(),
            duration: Duration::ZERO,
        }),
        &mut out,
    );
    assert!(t.finished());
    let kinds: Vec<_> = out.iter().map(|r| r.payload.clone().unwrap()).collect();
    assert!(
        matches!(&kinds[0], a2a::stream_response::Payload::Task(t) if t.status.as_ref().unwrap().state == a2a::TaskState::Submitted as i32 && t.history.len() == 1)
    );
    assert!(
        matches!(&kinds[1], a2a::stream_response::Payload::StatusUpdate(s) if s.status.as_ref().unwrap().state == a2a::TaskState::Working as i32)
    );
    let chunks: Vec<(String, bool, bool)> = kinds[2..6]
        .iter()
        .map(|k| match k {
            a2a::stream_response::Payload::ArtifactUpdate(a) => {
                let part = &a.artifact.as_ref().unwrap().parts[0];
                let Some(a2a::part::Content::Text(text)) = &part.content else {
                    panic!("a text part")
                };
                (text.clone(), a.append, a.last_chunk)
            }
            other => panic!("an artifact update, got {other:?}"),
        })
        .collect();
    assert_eq!(
        chunks,
        [
            ("echo".to_owned(), false, false),
            (": ".to_owned(), true, false),
            ("hi".to_owned(), true, false),
            (String::new(), true, true)
        ]
    );
    let a2a::stream_response::Payload::StatusUpdate(last) = &kinds[6] else {
        panic!("the terminal status")
    };
    let status = last.status.as_ref().unwrap();
    assert_eq!(status.state, a2a::TaskState::Completed as i32);
    let text = &status.message.as_ref().unwrap().parts[0].content;
    assert_eq!(text, &Some(a2a::part::Content::Text("echo: hi".into())));
    assert_eq!(out.len(), 7);
}

#[test]
fn a_failed_turn_ends_failed_with_its_error() {
    let mut out = VecDeque::new();
    let mut t = Translator::for_subscribe("s/t".into(), "s".into(), &mut out);
    t.on_event(
        &ev(EventKind::Error {
            code: agentrt_runtime::events::ErrorCode::Unavailable,
            message: "upstream said no".into(),
        }),
        &mut out,
    );
    t.on_event(
        &ev(EventKind::TurnFinished {
            outcome: TurnOutcome::Error,
            cancel_reason: None,
            usage: Usage::default(),
            duration: Duration::ZERO,
        }),
        &mut out,
    );
    assert_eq!(out.len(), 2);
    let Some(a2a::stream_response::Payload::StatusUpdate(s)) = &out[1].payload else {
        panic!("a status update")
    };
    let status = s.status.as_ref().unwrap();
    assert_eq!(status.state, a2a::TaskState::Failed as i32);
    assert_eq!(
        status.message.as_ref().unwrap().parts[0].content,
        Some(a2a::part::Content::Text("upstream said no".into()))
    );
}

fn finished(outcome: TurnOutcome) -> TurnEvent {
    ev(EventKind::TurnFinished {
        outcome,
        cancel_reason: None,
        usage: Usage::default(),
        duration: Duration::ZERO,
    })
}

#[test]
fn a_long_answer_streams_whole_but_ends_with_a_clipped_status_message() {
    use prost::Message as _;
    let mut out = VecDeque::new();
    let mut t = Translator::for_subscribe("s/t".into(), "s".into(), &mut out);
    let delta = "0123456789abcdef".repeat(4096); // 64 KiB
    for _ in 0..32 {
        t.on_event(&ev(EventKind::Text(delta.clone())), &mut out);
    }
    t.on_event(&finished(TurnOutcome::Success), &mut out);
    let streamed: usize = out
        .iter()
        .filter_map(|r| match &r.payload {
            Some(a2a::stream_response::Payload::ArtifactUpdate(a)) => {
                match &a.artifact.as_ref()?.parts[0].content {
                    Some(a2a::part::Content::Text(text)) => Some(text.len()),
                    _ => None,
                }
            }
            _ => None,
        })
        .sum();
    assert_eq!(streamed, 32 * delta.len(), "every chunk is sent whole");
    let last = out.back().unwrap();
    assert!(
        last.encoded_len() < 2 * budget::MESSAGE_BYTES,
        "{}",
        last.encoded_len()
    );
    let Some(a2a::stream_response::Payload::StatusUpdate(s)) = &last.payload else {
        panic!("the terminal status")
    };
    let message = s.status.as_ref().unwrap().message.as_ref().unwrap();
    let Some(a2a::part::Content::Text(text)) = &message.parts[0].content else {
        panic!("a text part")
    };
    assert!(text.starts_with(&delta[..1000]));
    assert!(
        text.contains(budget::MARKER),
        "{}",
        &text[text.len() - 200..]
    );
    assert!(text.contains(&format!("of {} bytes", 32 * delta.len())));
    assert!(message.metadata.is_some());
}
