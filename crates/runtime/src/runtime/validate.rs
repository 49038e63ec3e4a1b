//! Checks of a turn request made before admission touches anything: a
//! request that fails here is answered `INVALID_ARGUMENT` with no side
//! effect. Also derives the turn's deadline, with checked arithmetic, from
//! the requested timeout, the server's default and maximum, and the caller's
//! transport deadline.

use std::time::{Duration, Instant};

use super::{ChatInput, RuntimeConfig};
use crate::error::{FieldViolation, RuntimeError};
use crate::limits::{self, check_model_name};
use crate::media::{MediaLimits, block_name, check_blob_id, check_inline, check_name};
use crate::types::{ContentBlock, MediaKind};

/// What the checks decided about a valid request.
#[derive(Debug, Clone, Copy)]
pub(super) struct Checked {
    /// Most model steps of the turn's agent loop.
    pub(super) max_steps: u32,
    /// How long the turn may run from admission. Always set: a turn that
    /// asked for none gets the server's default, so no turn (a `CONTINUE`
    /// turn waiting for a caller's tool result, say) holds its session
    /// forever.
    pub(super) timeout: Duration,
    /// The caller is a restricted principal: the turn's runner is
    /// capability-free (set by admission, see `runtime::restricted`).
    pub(super) restricted: bool,
}

impl Checked {
    /// The turn's deadline when admitted at `admitted_at`; `None` only when
    /// it lies beyond what the clock can represent.
    pub(super) fn deadline_from(&self, admitted_at: Instant) -> Option<tokio::time::Instant> {
        admitted_at
            .checked_add(self.timeout)
            .map(tokio::time::Instant::from_std)
    }
}

/// Checks `input` against `config`.
pub(super) fn chat_input(
    input: &ChatInput,
    config: &RuntimeConfig,
) -> Result<Checked, RuntimeError> {
    crate::limits::validate_session_id("session_id", &input.session_id)?;
    validate_content(&input.content, config.max_input_bytes, &config.media)?;
    if let Some(speaker) = &input.speaker {
        let mut violations = Vec::new();
        speaker.check("speaker", &mut violations);
        RuntimeError::check(
            violations
                .into_iter()
                .map(|(field, problem)| crate::error::FieldViolation::new(field, problem))
                .collect(),
        )?;
    }
    if let Some(system) = &input.system_override
        && system.len() > config.max_input_bytes
    {
        return Err(RuntimeError::invalid(
            "system_override",
            format!("is longer than {} bytes", config.max_input_bytes),
        ));
    }
    if let Some(rid) = &input.request_id {
        validate_request_id(rid)?;
    }
    if let Some(model) = &input.model {
        check_model_name("model", model)?;
    }
    let timeout = turn_timeout(input, config)?;
    super::caller_tools::validate_tools(&input.extra_tools, &input.excluded_tools)?;
    super::caller_tools::validate_approvals(&input.require_approval)?;
    let max_steps = match input.max_steps {
        Some(0) => return Err(RuntimeError::invalid("max_steps", "must be at least 1")),
        Some(n) => n.min(config.max_steps.max(1) * 8),
        None => config.max_steps.max(1),
    };
    Ok(Checked {
        max_steps,
        timeout,
        restricted: false,
    })
}

/// The turn's time limit: the requested `timeout` (at most
/// `config.max_turn_timeout`) or the server's default, shortened to end a
/// little before the caller's transport deadline (see [`transport_margin`]).
fn turn_timeout(input: &ChatInput, config: &RuntimeConfig) -> Result<Duration, RuntimeError> {
    let max = config.max_turn_timeout;
    let requested = match input.timeout {
        Some(t) if t.is_zero() => {
            return Err(RuntimeError::invalid("timeout", "must be positive"));
        }
        Some(t) if t > max => {
            return Err(RuntimeError::invalid(
                "timeout",
                format!(
                    "is {}; the maximum is {} ({} s)",
                    humanize(t),
                    humanize(max),
                    max.as_secs()
                ),
            ));
        }
        Some(t) => t,
        None => config.turn_timeout.min(max),
    };
    Ok(match input.transport_deadline {
        Some(d) => requested.min(d.saturating_sub(transport_margin(d))),
        None => requested,
    })
}

/// How much earlier than the caller's transport deadline a turn ends, so
/// that its outcome (TIMED_OUT, with the stored NOTICE) is stored and sent
/// before the caller gives up. grpc-core clients (Python, C++, Ruby, ...)
/// round the `grpc-timeout` they send *up* to three significant figures —
/// 10 s becomes up to 10.1 s — and measure it from before the request is
/// written, so a fixed few milliseconds is not enough: 2 % plus 100 ms,
/// never more than a tenth of the deadline.
pub(super) fn transport_margin(deadline: Duration) -> Duration {
    (deadline / 50 + Duration::from_millis(100)).min(deadline / 10)
}

fn humanize(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 3600 && secs.is_multiple_of(3600) {
        format!("{} h", secs / 3600)
    } else if secs >= 60 && secs.is_multiple_of(60) {
        format!("{} min", secs / 60)
    } else {
        format!("{d:?}")
    }
}

/// Request ids are 1–128 printable ASCII characters.
fn validate_request_id(id: &str) -> Result<(), RuntimeError> {
    if id.is_empty() || id.len() > 128 || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(RuntimeError::invalid(
            "request_id",
            "must be 1-128 printable ASCII characters without spaces",
        ));
    }
    Ok(())
}

/// Checks a user message: at most [`limits::MAX_BLOCKS`] blocks, at least one
/// non-empty text, image or file block, only those, media of an accepted
/// type whose bytes match it (a caller cannot pass SVG or HTML off as an
/// image), text within `max_bytes`, media within `media`'s limits.
fn validate_content(
    content: &[ContentBlock],
    max_bytes: usize,
    media: &MediaLimits,
) -> Result<(), RuntimeError> {
    limits::check_block_count("content", content.len())?;
    let mut violations = Vec::new();
    let mut total = 0usize;
    let mut media_bytes = 0u64;
    let mut has_payload = false;
    for (i, block) in content.iter().enumerate() {
        match block {
            ContentBlock::Text { text } => {
                total += text.len();
                has_payload |= !text.trim().is_empty();
            }
            ContentBlock::Image { data, mime_type } => {
                media_bytes += data.len() as u64;
                has_payload = true;
                let field = format!("content[{i}].image");
                check_inline(
                    &field,
                    MediaKind::Image,
                    data,
                    mime_type,
                    media,
                    &mut violations,
                );
            }
            ContentBlock::File {
                data,
                mime_type,
                name,
            } => {
                media_bytes += data.len() as u64;
                has_payload = true;
                let field = format!("content[{i}].file");
                check_inline(
                    &field,
                    MediaKind::File,
                    data,
                    mime_type,
                    media,
                    &mut violations,
                );
                check_name(&field, name, &mut violations);
            }
            ContentBlock::Media(m) => {
                has_payload = true;
                let field = format!("content[{i}].{}", block_name(m.kind));
                check_blob_id(&field, &m.blob_id, &mut violations);
                check_name(&field, &m.name, &mut violations);
            }
            ContentBlock::Thinking { .. }
            | ContentBlock::ToolCall { .. }
            | ContentBlock::ToolResult { .. } => {
                violations.push(FieldViolation::new(
                    format!("content[{i}]"),
                    "a user message may only hold text, image and file blocks",
                ));
            }
        }
    }
    if !has_payload && violations.is_empty() {
        violations.push(FieldViolation::new(
            "content",
            "must hold at least one non-empty text, image or file block",
        ));
    }
    if total > max_bytes {
        violations.push(FieldViolation::new(
            "content",
            format!("holds {total} bytes of text; the limit is {max_bytes}"),
        ));
    }
    if media_bytes > media.max_message_bytes {
        violations.push(FieldViolation::new(
            "content",
            format!(
                "holds {media_bytes} bytes of media; the limit is {} per message",
                media.max_message_bytes
            ),
        ));
    }
    RuntimeError::check(violations)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(timeout: Option<Duration>, transport: Option<Duration>) -> ChatInput {
        ChatInput {
            session_id: "s".to_owned(),
            content: vec![ContentBlock::text("hi")],
            timeout,
            transport_deadline: transport,
            ..ChatInput::default()
        }
    }

    fn image(data: &[u8], mime: &str) -> ContentBlock {
        ContentBlock::Image {
            data: data.to_vec(),
            mime_type: mime.to_owned(),
        }
    }

    fn violations(content: Vec<ContentBlock>) -> Vec<FieldViolation> {
        match validate_content(&content, 1 << 20, &MediaLimits::default()) {
            Ok(()) => Vec::new(),
            Err(RuntimeError::InvalidArgument(v)) => v,
            Err(other) => panic!("{other}"),
        }
    }

    #[test]
    fn images_must_be_an_accepted_type_with_matching_bytes() {
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
        let webp = b"RIFF\x10\0\0\0WEBPVP8 ";
        assert!(violations(vec![image(png, "image/png")]).is_empty());
        assert!(violations(vec![image(b"\xff\xd8\xff\xe0", "image/jpeg")]).is_empty());
        assert!(violations(vec![image(b"GIF89a..", "image/gif")]).is_empty());
        assert!(violations(vec![image(webp, "image/webp")]).is_empty());
        let svg = violations(vec![image(b"<svg/>", "image/svg+xml")]);
        assert_eq!(svg[0].field, "content[0].image.mime_type");
        assert!(
            svg[0].description.contains("image/png, image/jpeg"),
            "{svg:?}"
        );
        let crlf = violations(vec![image(png, "image/png\r\nX-Injected: 1")]);
        assert!(!crlf[0].description.contains(['\r', '\n']), "{crlf:?}");
        let lie = violations(vec![image(b"<svg/>", "image/png")]);
        assert_eq!(lie[0].field, "content[0].image.data");
        let jpeg_as_png = violations(vec![image(b"\xff\xd8\xff\xe0", "image/png")]);
        assert!(
            jpeg_as_png[0].description.contains("image/jpeg"),
            "{jpeg_as_png:?}"
        );
        assert!(!violations(vec![image(b"RIFF\0\0\0\0WAVE", "image/webp")]).is_empty());
    }

    #[test]
    fn a_message_has_at_most_max_blocks_blocks() {
        use crate::limits::MAX_BLOCKS;
        assert!(violations(vec![ContentBlock::text("a"); MAX_BLOCKS]).is_empty());
        let v = violations(vec![ContentBlock::text("a"); MAX_BLOCKS + 1]);
        assert_eq!(v.len(), 1);
        assert!(v[0].description.contains("limit is 256"), "{v:?}");
    }

    #[test]
    fn a_timeout_beyond_the_maximum_is_refused_naming_the_maximum() {
        let config = RuntimeConfig::default();
        let huge = Duration::from_secs(i64::MAX as u64);
        let Err(RuntimeError::InvalidArgument(v)) = chat_input(&input(Some(huge), None), &config)
        else {
            panic!("a timeout of i64::MAX seconds was accepted");
        };
        assert_eq!(v[0].field, "timeout");
        assert!(v[0].description.contains("maximum is 24 h"), "{v:?}");
        let ok = chat_input(&input(Some(config.max_turn_timeout), None), &config).unwrap();
        assert!(ok.deadline_from(Instant::now()).is_some());
    }

    #[test]
    fn a_turn_without_timeout_gets_the_server_default() {
        let config = RuntimeConfig::default();
        let checked = chat_input(&input(None, None), &config).unwrap();
        assert_eq!(checked.timeout, config.turn_timeout);
    }

    #[test]
    fn a_huge_transport_deadline_cannot_overflow_the_clock() {
        let config = RuntimeConfig::default();
        // grpc-timeout allows 99,999,999 hours.
        let transport = Duration::from_secs(99_999_999 * 3600);
        let checked = chat_input(&input(None, Some(transport)), &config).unwrap();
        assert_eq!(checked.timeout, config.turn_timeout);
        assert!(checked.deadline_from(Instant::now()).is_some());
    }

    #[test]
    fn the_turn_ends_before_a_grpc_core_rounded_deadline() {
        // grpc-core sends 10 s as up to 10.1 s: the turn must end before the
        // caller's real 10 s are up.
        let margin = transport_margin(Duration::from_millis(10_100));
        assert!(Duration::from_millis(10_100) - margin < Duration::from_secs(10));
        // Short deadlines keep most of their time.
        assert_eq!(
            transport_margin(Duration::from_millis(500)),
            Duration::from_millis(50)
        );
    }
}
