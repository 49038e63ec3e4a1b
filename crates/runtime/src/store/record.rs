//! The record encoding both engines store messages and turn records in:
//! one version byte ([`RECORD_VERSION`]), then serde_json. sled keeps every
//! value so (sessions and usage too); PostgreSQL keeps messages and turn
//! records so in a `bytea` column beside the columns its queries use. A
//! value with another version byte, or one that does not decode, is
//! reported by each engine as [`StoreError::Corrupt`] with its own key.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::StoreError;

/// The version byte in front of every record.
pub(crate) const RECORD_VERSION: u8 = 1;

/// `record` as [`RECORD_VERSION`], then JSON.
pub(crate) fn encode<T: Serialize>(record: &T) -> Result<Vec<u8>, StoreError> {
    let mut out = vec![RECORD_VERSION];
    serde_json::to_writer(&mut out, record)
        .map_err(|e| StoreError::Backend(format!("encoding a record: {e}")))?;
    Ok(out)
}

/// A record's value, or why it cannot be read (for the engine to report
/// with the key it read it under).
pub(crate) fn decode<T: DeserializeOwned>(raw: &[u8]) -> Result<T, String> {
    match raw.split_first() {
        None => Err("empty record".to_owned()),
        Some((&RECORD_VERSION, json)) => serde_json::from_slice(json)
            .map_err(|e| format!("undecodable version {RECORD_VERSION} record: {e}")),
        Some((version, _)) => Err(format!("unknown record version {version}")),
    }
}
