//! Every echo bounded: the one place that decides how much of a caller's
//! string an error, a log line or an event may carry back. The three error
//! maps ([`crate::status`], [`crate::a2a::errors`] and the cluster's
//! forwarding errors) quote caller values through [`quoted`] / [`id`] and
//! pass what they build through [`status`], so however long the input —
//! a 4 MiB task id, a header, a field violation — `grpc-message` stays
//! under [`MAX_MESSAGE_WIRE_BYTES`] on the wire and the whole trailer block
//! a few KiB at most.
//!
//! The bounds on field violations themselves (how many, how long each) are
//! the core's ([`agentrt_runtime::limits`]); [`violations`] adds a byte
//! budget over all of them.

use std::borrow::Cow;

use agentrt_runtime::error::{FieldViolation, capped_violations};
use agentrt_runtime::limits::display_clip;
use prost::Message as _;
use tonic::Status;
use tonic_types::pb;

/// Longest `grpc-message`, in bytes as tonic writes it (percent-encoded:
/// a space or a non-ASCII byte costs three).
pub const MAX_MESSAGE_WIRE_BYTES: usize = 768;
/// Most characters of a caller's id (or other short value) quoted in a
/// message, a log field or ErrorInfo metadata.
pub const MAX_ID_CHARS: usize = 64;
/// Most `grpc-message` bytes of a caller's value quoted in a message (an
/// ASCII id of [`MAX_ID_CHARS`] fits; a non-ASCII one is cut sooner).
pub const MAX_QUOTE_WIRE_BYTES: usize = 128;
/// Most bytes of the field paths and descriptions of the violations one
/// `BadRequest` carries.
pub const MAX_VIOLATION_BYTES: usize = 1024;

/// Bytes tonic writes for `c` in `grpc-message` (its percent-encoding set:
/// controls, non-ASCII, space and `"#%<>` `` ` `` `?{}`).
fn wire_cost(c: char) -> usize {
    match c {
        ' ' | '"' | '#' | '%' | '<' | '>' | '`' | '?' | '{' | '}' => 3,
        c if c.is_ascii() && !c.is_ascii_control() => 1,
        c => 3 * c.len_utf8(),
    }
}

/// How many bytes `text` takes as a `grpc-message`.
pub fn wire_len(text: &str) -> usize {
    text.chars().map(wire_cost).sum()
}

/// `value` (an id, a header, a name a caller chose) as a log field or
/// metadata value may carry it: at most [`MAX_ID_CHARS`] characters, `…`
/// when cut, control characters escaped. Borrowed when already fine.
pub fn id(value: &str) -> Cow<'_, str> {
    let fine = value.len() <= MAX_ID_CHARS && !value.chars().any(char::is_control);
    if fine {
        Cow::Borrowed(value)
    } else {
        Cow::Owned(display_clip(value, MAX_ID_CHARS))
    }
}

/// `value` quoted for a message (`"…"`, escapes as Rust's `{:?}`): at
/// most [`MAX_ID_CHARS`] characters of it and at most [`MAX_QUOTE_WIRE_BYTES`]
/// of `grpc-message`, with `…` inside the quotes when cut.
pub fn quoted(value: &str) -> String {
    let mut used = 0;
    for (n, (i, c)) in value.char_indices().enumerate() {
        used += wire_cost(c);
        if n == MAX_ID_CHARS || used > MAX_QUOTE_WIRE_BYTES {
            return format!("{:?}", format!("{}…", &value[..i]));
        }
    }
    format!("{value:?}")
}

/// `text` cut so that it takes at most [`MAX_MESSAGE_WIRE_BYTES`] as a
/// `grpc-message`, with `…` when cut.
pub fn message(text: String) -> String {
    if wire_len(&text) <= MAX_MESSAGE_WIRE_BYTES {
        return text;
    }
    let room = MAX_MESSAGE_WIRE_BYTES - wire_cost('…');
    let mut used = 0;
    let mut end = 0;
    for (i, c) in text.char_indices() {
        used += wire_cost(c);
        if used > room {
            break;
        }
        end = i + c.len_utf8();
    }
    let mut out = text;
    out.truncate(end);
    out.push('…');
    out
}

/// `status` with its message within [`MAX_MESSAGE_WIRE_BYTES`] — and the
/// copy of it inside `grpc-status-details-bin` the same — every other
/// detail and its metadata kept. The last step of every error map.
pub fn status(status: Status) -> Status {
    if wire_len(status.message()) <= MAX_MESSAGE_WIRE_BYTES {
        return status;
    }
    let text = message(status.message().to_owned());
    let details = if status.details().is_empty() {
        bytes::Bytes::new()
    } else {
        match pb::Status::decode(status.details()) {
            Ok(mut rpc) => {
                rpc.message.clone_from(&text);
                rpc.encode_to_vec().into()
            }
            // Not ours to read: left out rather than sent unbounded.
            Err(_) => bytes::Bytes::new(),
        }
    };
    Status::with_details_and_metadata(status.code(), text, details, status.metadata().clone())
}

/// What a `BadRequest` reports of `violations`: the core's cap
/// ([`capped_violations`]), then only as many as fit
/// [`MAX_VIOLATION_BYTES`], and a last one counting those left out.
pub fn violations(violations: Vec<FieldViolation>) -> Vec<FieldViolation> {
    let total = violations.len();
    let mut used = 0;
    let mut shown = Vec::new();
    for v in capped_violations(violations) {
        used += v.field.len() + v.description.len();
        if used > MAX_VIOLATION_BYTES && !shown.is_empty() {
            break;
        }
        shown.push(v);
    }
    // capped_violations may already end with its own count: recount.
    if shown.len() < total {
        let counted = shown
            .last()
            .is_some_and(|v| v.field.is_empty() && v.description.contains("more invalid"));
        if counted {
            shown.pop();
        }
        let more = total - shown.len();
        shown.push(FieldViolation::new(
            "",
            format!("{more} more invalid fields not listed; fix the ones above first"),
        ));
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;
    use tonic_types::{ErrorDetails, StatusExt as _};

    #[test]
    fn ids_are_clipped_and_escaped() {
        assert_eq!(id("s-1"), "s-1");
        let long = "x".repeat(4 << 20);
        assert_eq!(id(&long).chars().count(), MAX_ID_CHARS + 1);
        assert_eq!(id("a\r\nb"), "a\\r\\nb");
        assert_eq!(quoted("s/t"), "\"s/t\"");
        let q = quoted(&long);
        assert!(q.len() < MAX_ID_CHARS + 8, "{q}");
        assert!(q.ends_with("…\""));
        // The quotes and the `…` cost 15 wire bytes more.
        let wide = quoted(&"é".repeat(1000));
        assert!(wire_len(&wide) <= MAX_QUOTE_WIRE_BYTES + 15, "{wide}");
        assert_eq!(quoted("a\"\n"), "\"a\\\"\\n\"");
    }

    #[test]
    fn messages_fit_the_wire_budget_whatever_they_hold() {
        for text in [
            "x".repeat(1 << 20),
            " ".repeat(1 << 20),
            "é".repeat(1 << 20),
            "\u{1F600}".repeat(100_000),
        ] {
            let out = message(text.clone());
            assert!(
                wire_len(&out) <= MAX_MESSAGE_WIRE_BYTES,
                "{}",
                wire_len(&out)
            );
            assert!(out.ends_with('…'));
            assert!(text.starts_with(out.trim_end_matches('…')));
        }
        assert_eq!(message("short".into()), "short");
    }

    #[test]
    fn a_long_status_is_clipped_in_its_details_too() {
        let long = format!("task {} not found", "y".repeat(1 << 20));
        let status = Status::with_error_details(
            Code::NotFound,
            long,
            ErrorDetails::with_error_info("R", "d", [("k".to_owned(), "v".to_owned())]),
        );
        let status = super::status(status);
        assert_eq!(status.code(), Code::NotFound);
        assert!(wire_len(status.message()) <= MAX_MESSAGE_WIRE_BYTES);
        let rpc = pb::Status::decode(status.details()).unwrap();
        assert_eq!(rpc.message, status.message());
        assert_eq!(status.get_error_details().error_info().unwrap().reason, "R");
    }

    #[test]
    fn violations_fit_their_byte_budget_and_count_the_rest() {
        let many: Vec<_> = (0..1000)
            .map(|i| FieldViolation::new(format!("f{i}"), "z".repeat(10_000)))
            .collect();
        let shown = violations(many);
        let bytes: usize = shown
            .iter()
            .map(|v| v.field.len() + v.description.len())
            .sum();
        assert!(bytes <= MAX_VIOLATION_BYTES + 200, "{bytes}");
        let last = shown.last().unwrap();
        let listed = shown.len() - 1;
        assert!(
            last.description
                .starts_with(&format!("{} more", 1000 - listed)),
            "{}",
            last.description
        );
        let few = violations(vec![FieldViolation::new("a", "b")]);
        assert_eq!(few.len(), 1);
    }
}
