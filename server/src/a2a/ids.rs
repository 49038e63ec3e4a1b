//! The ids an A2A caller chooses, checked for size and charset before they
//! are used, logged or echoed: a task id names a task only if it could be
//! one this server returned (`<session id>/<turn id>`), and a message's
//! `context_id` and `message_id` (the turn's idempotency key) are refused,
//! naming the field and the limit, when they could never be valid.

use agentrt_runtime::error::FieldViolation;
use tonic::Status;

use super::errors::invalid_params;

/// Longest context id: a session id (1–128 characters of
/// `A-Z a-z 0-9 . _ : -`).
pub const MAX_CONTEXT_ID: usize = 128;
/// Longest turn id inside a task id (the server's are 36-character UUIDs).
pub const MAX_TURN_ID: usize = 256;
/// Longest task id: `<context id>/<turn id>`.
pub const MAX_TASK_ID: usize = MAX_CONTEXT_ID + 1 + MAX_TURN_ID;
/// Longest `message_id` (it is the turn's `request_id`): 1–128 printable
/// ASCII characters without spaces.
pub const MAX_MESSAGE_ID: usize = 128;

/// A character of a session (context) or turn id.
fn id_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-')
}

/// `id` is a context id agentrt could have made or accepted.
pub fn context_id_ok(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_CONTEXT_ID && id.bytes().all(id_byte)
}

/// The (context id, turn id) a task id names; `None` for an id this server
/// never returned — too long, the wrong characters, not two parts. Checked
/// before anything looks the id up or logs it.
pub fn parse_task_id(id: &str) -> Option<(&str, &str)> {
    if id.len() > MAX_TASK_ID {
        return None;
    }
    let (session, turn) = id.split_once('/')?;
    let turn_ok = !turn.is_empty() && turn.len() <= MAX_TURN_ID && turn.bytes().all(id_byte);
    (context_id_ok(session) && turn_ok).then_some((session, turn))
}

/// Refuses a message whose `context_id` or `message_id` could never be
/// valid, with `InvalidParamsError` naming the field and the limit. An
/// empty one is fine (a new context; no idempotency key).
pub fn check_message(message: &agentrt_proto::a2a::v1::Message) -> Result<(), Status> {
    let mut violations = Vec::new();
    let context = &message.context_id;
    if !context.is_empty() && !context_id_ok(context) {
        violations.push(FieldViolation::new(
            "message.context_id",
            format!(
                "is {} bytes; a context id is 1-{MAX_CONTEXT_ID} characters of A-Z a-z 0-9 . _ : - \
                 (send the context_id this server returned, or none for a new context)",
                context.len()
            ),
        ));
    }
    let mid = &message.message_id;
    let mid_ok = mid.len() <= MAX_MESSAGE_ID && mid.bytes().all(|b| b.is_ascii_graphic());
    if !mid_ok {
        violations.push(FieldViolation::new(
            "message.message_id",
            format!(
                "is {} bytes; the limit is {MAX_MESSAGE_ID} printable ASCII characters without \
                 spaces (it is the message's idempotency key)",
                mid.len()
            ),
        ));
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(invalid_params(violations))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentrt_proto::a2a::v1 as a2a;
    use tonic::Code;
    use tonic_types::StatusExt as _;

    #[test]
    fn task_ids_round_trip_and_others_are_refused() {
        let id = super::super::tasks::task_id("s-1", "0190-abc");
        assert_eq!(parse_task_id(&id), Some(("s-1", "0190-abc")));
        let long_session = format!("{}/t", "s".repeat(MAX_CONTEXT_ID + 1));
        let long_turn = format!("s/{}", "t".repeat(MAX_TURN_ID + 1));
        let huge = format!("s/{}", "t".repeat(4 << 20));
        for bad in [
            "",
            "nope",
            "/t",
            "s/",
            "a/b/c",
            "s\n/t",
            "s/t\r",
            "s p/t",
            "s/t\u{e9}",
            &long_session,
            &long_turn,
            &huge,
        ] {
            assert_eq!(parse_task_id(bad), None, "{:?}", bad.get(..20));
        }
        let longest = format!("{}/{}", "s".repeat(MAX_CONTEXT_ID), "t".repeat(MAX_TURN_ID));
        assert!(parse_task_id(&longest).is_some());
    }

    fn message(context_id: &str, message_id: &str) -> a2a::Message {
        a2a::Message {
            context_id: context_id.to_owned(),
            message_id: message_id.to_owned(),
            ..Default::default()
        }
    }

    #[test]
    fn oversized_or_odd_message_ids_are_invalid_params_naming_the_field_and_limit() {
        assert!(check_message(&message("", "")).is_ok());
        assert!(check_message(&message("ctx-1", "7f3c-uuid")).is_ok());
        let status = check_message(&message("", &"m".repeat(4 << 20))).unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("message.message_id"));
        assert!(status.message().contains("128"), "{}", status.message());
        let bad = status.get_error_details().bad_request().cloned().unwrap();
        assert_eq!(bad.field_violations[0].field, "message.message_id");
        assert!(status.details().len() < 1024);
        for (ctx, mid, field) in [
            ("a b", "m", "message.context_id"),
            (&*"c".repeat(129), "m", "message.context_id"),
            ("c", "with space", "message.message_id"),
            ("c", "ctl\n", "message.message_id"),
        ] {
            let status = check_message(&message(ctx, mid)).unwrap_err();
            assert!(status.message().contains(field), "{}", status.message());
        }
    }
}
