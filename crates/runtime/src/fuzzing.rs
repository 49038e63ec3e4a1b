//! Entry points of the fuzz targets in `fuzz/` (built only with the
//! `fuzzing` cargo feature; not part of the API). Each takes the fuzzer's
//! bytes, drives one decoder of untrusted input, and panics only when an
//! invariant of that decoder breaks — a bad input itself must never panic.

use crate::model::ModelEvent;
use crate::model::anthropic::EventDecoder;
use crate::model::http::SseDecoder;
use crate::model::openai::ChunkDecoder;
use crate::model::sse::{DEFAULT_MAX_EVENT_BYTES, SseError, SseEvent, SseParser};
use crate::store::postgres::codec;
use crate::store::{record, sled};
use crate::types::{LastTurn, Message, Session, TurnRecord};

/// Read-slice sizes from a seed: 1 to 16 bytes, a different pattern per
/// seed, so a boundary may fall anywhere.
fn pieces(seed: u8, mut data: &[u8]) -> Vec<&[u8]> {
    let mut state = u32::from(seed) | 0x100;
    let mut out = Vec::new();
    while !data.is_empty() {
        // xorshift32: any deterministic spread of sizes will do.
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let n = (state % 16 + 1) as usize;
        let (head, tail) = data.split_at(n.min(data.len()));
        out.push(head);
        data = tail;
    }
    out
}

/// Everything a parser makes of a stream fed as `slices`: the events
/// before the first error, then the error or the end-of-input verdict.
fn parse(limit: usize, slices: &[&[u8]]) -> (Vec<SseEvent>, Result<(), SseError>) {
    let mut parser = SseParser::with_limit(limit);
    let mut events = Vec::new();
    for slice in slices {
        match parser.push(slice) {
            Ok(more) => events.extend(more),
            Err(e) => return (events, Err(e)),
        }
    }
    (events, parser.finish())
}

/// The SSE parser: bounded events, and the same result whatever the read
/// boundaries (the events of the whole input, or the same error).
pub fn sse(data: &[u8]) {
    let Some((&control, data)) = data.split_first() else {
        return;
    };
    // A small limit in most runs, so the bound is exercised too.
    let limit = match control & 0x0f {
        0 => DEFAULT_MAX_EVENT_BYTES,
        n => usize::from(n) * 16,
    };
    let (whole_events, whole) = parse(limit, &[data]);
    let (split_events, split) = parse(limit, &pieces(control >> 4, data));
    for event in whole_events.iter().chain(&split_events) {
        assert!(event.data.len() <= limit, "event data beyond the limit");
        assert!(event.event.as_ref().is_none_or(|e| !e.is_empty()));
    }
    assert_eq!(split, whole, "split feed disagrees on the verdict");
    match whole {
        // The one push that failed returned no events.
        Err(SseError::TooLong { .. }) => assert!(whole_events.is_empty()),
        // Every event is out before the end of input is judged.
        Ok(()) | Err(SseError::Incomplete) => {
            assert_eq!(split_events, whole_events, "split feed gives other events");
        }
    }
}

/// Feeds `data` as an SSE stream to `decoder` and checks what a provider
/// stream promises: deltas and tool calls are never empty, `Finished`
/// comes last and only when the decoder says the stream is complete.
fn decode_stream<D: SseDecoder>(mut decoder: D, data: &[u8]) {
    let Some((&seed, data)) = data.split_first() else {
        return;
    };
    let mut parser = SseParser::with_limit(64 * 1024);
    let mut out = Vec::new();
    let mut complete = false;
    'feed: for slice in pieces(seed, data) {
        let Ok(events) = parser.push(slice) else {
            break;
        };
        for event in events {
            let done = decoder.decode(event);
            while let Some(item) = decoder.next_decoded() {
                out.push(item);
            }
            match done {
                Ok(false) => {}
                Ok(true) => {
                    complete = true;
                    break 'feed;
                }
                Err(_) => break 'feed,
            }
        }
    }
    for (i, item) in out.iter().enumerate() {
        match item {
            ModelEvent::TextDelta(t) | ModelEvent::ReasoningDelta(t) => {
                assert!(!t.is_empty(), "an empty delta");
            }
            ModelEvent::ThinkingSignature(s) => assert!(!s.is_empty(), "an empty signature"),
            ModelEvent::ToolCall {
                id,
                name,
                arguments_json,
            } => {
                assert!(
                    !id.is_empty() && !name.is_empty(),
                    "a tool call without id or name"
                );
                assert!(!arguments_json.is_empty(), "a tool call without arguments");
            }
            ModelEvent::Usage(_) => {}
            ModelEvent::Finished(_) => {
                assert!(complete, "Finished on a stream that is not complete");
                assert_eq!(i + 1, out.len(), "items after Finished");
            }
        }
    }
    if complete {
        assert!(
            matches!(out.last(), Some(ModelEvent::Finished(_))),
            "a complete stream without Finished"
        );
    }
}

/// The OpenAI-compatible chunk decoder behind the SSE parser.
pub fn openai_stream(data: &[u8]) {
    decode_stream(ChunkDecoder::default(), data);
}

/// The Anthropic Messages event decoder behind the SSE parser.
pub fn anthropic_stream(data: &[u8]) {
    decode_stream(EventDecoder::default(), data);
}

/// Decodes `raw` as a `T` with `decode`; when it decodes, its encoding
/// must decode to the same value.
fn round_trip<T, E: std::fmt::Debug>(
    raw: &[u8],
    decode: impl Fn(&[u8]) -> Result<T, E>,
    encode: impl Fn(&T) -> Vec<u8>,
) where
    T: PartialEq + std::fmt::Debug,
{
    let Ok(value) = decode(raw) else {
        return;
    };
    let again = decode(&encode(&value)).expect("a re-encoded record does not decode");
    assert_eq!(again, value, "a record changes through encode and decode");
}

/// One stored record, its kind chosen by the first byte, decoded and
/// re-encoded with the store's own functions.
macro_rules! record_kinds {
    ($data:expr, $decode:ident, $encode:ident) => {{
        let Some((&kind, raw)) = $data.split_first() else {
            return;
        };
        match kind % 4 {
            0 => {
                round_trip::<Session, _>(raw, $decode, $encode);
            }
            1 => {
                round_trip::<Message, _>(raw, $decode, $encode);
            }
            2 => {
                round_trip::<TurnRecord, _>(raw, $decode, $encode);
            }
            _ => {
                round_trip::<LastTurn, _>(raw, $decode, $encode);
            }
        }
    }};
}

/// The sled store's record codec (version byte, then JSON).
pub fn sled_record(data: &[u8]) {
    fn decode<T: serde::de::DeserializeOwned>(raw: &[u8]) -> Result<T, crate::store::StoreError> {
        sled::decode("fuzz", b"key", raw)
    }
    fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
        record::encode(value).expect("a decoded record does not encode")
    }
    record_kinds!(data, decode, encode);
}

/// The PostgreSQL store's codec: the `record` column and the nanosecond
/// timestamps (first byte odd: eight bytes of a time).
pub fn pg_record(data: &[u8]) {
    fn decode<T: serde::de::DeserializeOwned>(raw: &[u8]) -> Result<T, String> {
        record::decode(raw)
    }
    fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
        record::encode(value).expect("a decoded record does not encode")
    }
    if let Some((&0xff, rest)) = data.split_first() {
        let mut bytes = [0u8; 8];
        let n = rest.len().min(8);
        bytes[..n].copy_from_slice(&rest[..n]);
        let nanos = i64::from_le_bytes(bytes);
        let at = codec::from_nanos(nanos);
        assert_eq!(
            codec::nanos(at).ok(),
            Some(nanos),
            "a time does not round-trip"
        );
        return;
    }
    record_kinds!(data, decode, encode);
}
