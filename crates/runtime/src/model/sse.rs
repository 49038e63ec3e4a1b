//! An incremental Server-Sent Events parser (the `text/event-stream` format
//! of the WHATWG HTML standard), fed with whatever byte slices the transport
//! hands over.
//!
//! Raw bytes are buffered until a line is complete and only complete lines
//! are decoded, so a read boundary may fall anywhere: inside a field name,
//! between the `\r` and `\n` of a CRLF, or inside a multi-byte UTF-8
//! character. `id:` and `retry:` are ignored because no provider here
//! reconnects.

use std::fmt;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, when one was given and not empty.
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// Why the parser gave up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// A single line, or the data of a single event, exceeded the limit.
    #[error("server-sent event exceeds {limit} bytes")]
    TooLong {
        /// The configured limit in bytes.
        limit: usize,
    },
    /// The input ended in the middle of an event (no terminating blank line).
    #[error("event stream ended in the middle of an event")]
    Incomplete,
}

/// The default bound on one line and on one event's data.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Incremental parser state. Discard it after an error: the stream it was
/// reading is no longer trustworthy.
pub struct SseParser {
    /// Bytes of the current, still unterminated line.
    line: Vec<u8>,
    /// The previous slice ended with `\r`, so a leading `\n` of the next one
    /// is the second half of a CRLF, not an empty line.
    skip_lf: bool,
    /// Only the very first line may carry a byte order mark.
    at_start: bool,
    event: Option<String>,
    /// Joined data lines, each followed by `\n` (the last one is dropped on
    /// dispatch), so "one empty `data:` line" and "no data" stay distinct.
    data: String,
    max_bytes: usize,
}

impl fmt::Debug for SseParser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The buffers can be megabytes of upstream content; sizes suffice.
        f.debug_struct("SseParser")
            .field("buffered_line_bytes", &self.line.len())
            .field("buffered_data_bytes", &self.data.len())
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

impl Default for SseParser {
    fn default() -> Self {
        Self::new()
    }
}

impl SseParser {
    /// A parser bounded by [`DEFAULT_MAX_EVENT_BYTES`].
    pub fn new() -> Self {
        Self::with_limit(DEFAULT_MAX_EVENT_BYTES)
    }

    /// A parser that fails once a line or an event's data grows beyond
    /// `max_bytes`, so a peer cannot make us buffer without bound.
    pub fn with_limit(max_bytes: usize) -> Self {
        Self {
            line: Vec::new(),
            skip_lf: false,
            at_start: true,
            event: None,
            data: String::new(),
            max_bytes,
        }
    }

    /// Feeds the next slice of the stream and returns the events it
    /// completed, in order.
    pub fn push(&mut self, mut bytes: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        let mut events = Vec::new();
        if self.skip_lf && !bytes.is_empty() {
            self.skip_lf = false;
            if bytes[0] == b'\n' {
                bytes = &bytes[1..];
            }
        }
        // Only the new bytes are scanned, so feeding one byte at a time
        // stays linear in the stream length.
        while let Some(end) = bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
            let tail = &bytes[..end];
            if self.line.is_empty() {
                self.check_len(tail.len())?;
                self.process_line(tail, &mut events)?;
            } else {
                self.check_len(self.line.len() + tail.len())?;
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(tail);
                self.process_line(&line, &mut events)?;
                // Keep the allocation for the next long line.
                line.clear();
                self.line = line;
            }
            let mut next = end + 1;
            if bytes[end] == b'\r' {
                match bytes.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.skip_lf = true,
                }
            }
            bytes = &bytes[next..];
        }
        self.check_len(self.line.len() + bytes.len())?;
        self.line.extend_from_slice(bytes);
        Ok(events)
    }

    /// Declares the end of input. Per the standard a trailing event without
    /// its blank line is not dispatched; this reports whether one was cut.
    pub fn finish(self) -> Result<(), SseError> {
        let only_bom = self.at_start && self.line == BOM;
        if !(self.line.is_empty() || only_bom) || !self.data.is_empty() {
            Err(SseError::Incomplete)
        } else {
            Ok(())
        }
    }

    fn check_len(&self, len: usize) -> Result<(), SseError> {
        if len > self.max_bytes {
            Err(SseError::TooLong {
                limit: self.max_bytes,
            })
        } else {
            Ok(())
        }
    }

    fn process_line(
        &mut self,
        mut line: &[u8],
        events: &mut Vec<SseEvent>,
    ) -> Result<(), SseError> {
        if self.at_start {
            self.at_start = false;
            line = line.strip_prefix(BOM).unwrap_or(line);
        }
        if line.is_empty() {
            self.dispatch(events);
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(());
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        match field {
            b"data" => {
                // Bounded after decoding: each invalid byte becomes a
                // three-byte U+FFFD, so the raw length understates it.
                let value = String::from_utf8_lossy(value);
                self.check_len(self.data.len() + value.len() + 1)?;
                self.data.push_str(&value);
                self.data.push('\n');
            }
            b"event" => {
                self.event =
                    (!value.is_empty()).then(|| String::from_utf8_lossy(value).into_owned());
            }
            // `id`, `retry` and unknown fields carry nothing we use.
            _ => {}
        }
        Ok(())
    }

    fn dispatch(&mut self, events: &mut Vec<SseEvent>) {
        let event = self.event.take();
        if self.data.is_empty() {
            return;
        }
        let mut data = std::mem::take(&mut self.data);
        data.pop();
        events.push(SseEvent { event, data });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\u{FEFF}: keep-alive comment\r\n\
        event: greeting\r\n\
        data: héllo wörld 🎉\r\n\
        id: 7\r\n\
        retry: 1000\r\n\
        \r\n\
        data:first\n\
        data:  second with a leading space\n\
        data\n\
        \n\
        data: cr only\r\r\
        \n\n\
        event: done\n\
        unknown: field\n\
        data: [DONE]\n\n";

    fn expected() -> Vec<SseEvent> {
        vec![
            SseEvent {
                event: Some("greeting".into()),
                data: "héllo wörld 🎉".into(),
            },
            SseEvent {
                event: None,
                data: "first\n second with a leading space\n".into(),
            },
            SseEvent {
                event: None,
                data: "cr only".into(),
            },
            SseEvent {
                event: Some("done".into()),
                data: "[DONE]".into(),
            },
        ]
    }

    fn parse_pieces<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> Vec<SseEvent> {
        let mut parser = SseParser::new();
        let mut events = Vec::new();
        for piece in pieces {
            events.extend(parser.push(piece).unwrap());
        }
        parser.finish().unwrap();
        events
    }

    #[test]
    fn whole_sample_parses_to_the_expected_events() {
        assert_eq!(parse_pieces([SAMPLE.as_bytes()]), expected());
    }

    #[test]
    fn one_byte_slices_give_the_same_events_as_the_whole() {
        assert_eq!(parse_pieces(SAMPLE.as_bytes().chunks(1)), expected());
    }

    #[test]
    fn every_two_way_split_gives_the_same_events_as_the_whole() {
        let bytes = SAMPLE.as_bytes();
        for split in 0..=bytes.len() {
            let (a, b) = bytes.split_at(split);
            assert_eq!(parse_pieces([a, b]), expected(), "split at byte {split}");
        }
    }

    #[test]
    fn utf8_character_split_across_pushes_is_decoded_intact() {
        let bytes = "data: €\n\n".as_bytes();
        // '€' is three bytes starting at offset 6: cut after each of them.
        for split in 7..=8 {
            let (a, b) = bytes.split_at(split);
            let events = parse_pieces([a, b]);
            assert_eq!(events.len(), 1);
            assert_eq!(events[0].data, "€");
        }
    }

    #[test]
    fn crlf_split_between_cr_and_lf_is_one_line_ending() {
        let events = parse_pieces([&b"data: a\r"[..], b"\ndata: b\r\n", b"\r", b"\n"]);
        assert_eq!(
            events,
            vec![SseEvent {
                event: None,
                data: "a\nb".into()
            }]
        );
    }

    #[test]
    fn comments_and_blank_lines_without_data_dispatch_nothing() {
        let events = parse_pieces([&b":comment\n\n: another\n\n\n"[..]]);
        assert!(events.is_empty());
    }

    #[test]
    fn event_type_does_not_leak_into_the_next_event() {
        let events = parse_pieces([&b"event: a\n\ndata: x\n\n"[..]]);
        assert_eq!(
            events,
            vec![SseEvent {
                event: None,
                data: "x".into()
            }]
        );
    }

    #[test]
    fn multiple_data_lines_are_joined_with_newlines() {
        let events = parse_pieces([&b"data: {\"a\":\ndata: 1}\n\n"[..]]);
        assert_eq!(events[0].data, "{\"a\":\n1}");
    }

    #[test]
    fn overlong_line_is_an_error_even_when_fed_byte_by_byte() {
        let mut parser = SseParser::with_limit(16);
        let line = [b'x'; 17];
        let err = line
            .chunks(1)
            .map(|b| parser.push(b))
            .find_map(Result::err)
            .expect("the limit must trip");
        assert_eq!(err, SseError::TooLong { limit: 16 });

        let mut parser = SseParser::with_limit(16);
        assert!(parser.push(b"data: 0123456789abcdef\n").is_err());
    }

    #[test]
    fn overlong_event_data_is_an_error() {
        let mut parser = SseParser::with_limit(16);
        parser.push(b"data: 01234567\n").unwrap();
        assert!(parser.push(b"data: 01234567\n").is_err());
    }

    #[test]
    fn invalid_utf8_counts_against_the_limit_as_decoded() {
        // Found by fuzz/fuzz_targets/sse.rs: ten invalid bytes within a
        // 16-byte bound became 30 bytes of U+FFFD.
        let mut parser = SseParser::with_limit(16);
        let line = [b"data:".as_slice(), &[0xff; 10], b"\n\n"].concat();
        assert_eq!(parser.push(&line), Err(SseError::TooLong { limit: 16 }));
        let mut parser = SseParser::with_limit(16);
        let events = parser.push(b"data:\xff\xff\xff\xff\n\n").unwrap();
        assert_eq!(events[0].data, "\u{fffd}".repeat(4));
    }

    #[test]
    fn finish_reports_a_cut_event() {
        let mut parser = SseParser::new();
        parser.push(b"data: partial\n").unwrap();
        assert_eq!(parser.finish(), Err(SseError::Incomplete));

        let mut parser = SseParser::new();
        parser.push(b"data: partial").unwrap();
        assert_eq!(parser.finish(), Err(SseError::Incomplete));

        let mut parser = SseParser::new();
        parser.push(b"data: whole\n\n").unwrap();
        assert_eq!(parser.finish(), Ok(()));
    }
}
