//! The `[blobs]` table: where images and files are stored and the limits on
//! them (`agentrt_runtime::media`).
//!
//! ```toml
//! [blobs]
//! url = ""                      # "" = <data_dir>/blobs; file:///PATH; s3://BUCKET/PREFIX
//! max_inline_bytes = 3145728    # an image or file inline in a ChatRequest (3 MiB)
//! max_message_bytes = 67108864  # media in one message, inline and uploaded (64 MiB)
//! max_upload_bytes = 67108864   # one UploadBlob (64 MiB)
//! mime_types = ["image/png", "image/jpeg", "image/gif", "image/webp",
//!               "application/pdf", "text/plain", "text/markdown", "text/csv",
//!               "application/json"]          # "type/*" accepts a whole type
//! quota_bytes = 1073741824      # blobs per user (1 GiB); 0 = no limit
//! event_inline_bytes = 65536    # image/file events carry the bytes up to this
//! max_media_per_request = 16    # the newest media sent with one model request
//! max_request_media_bytes = 25165824  # and at most these bytes of them (24 MiB)
//! max_text_file_bytes = 262144  # a text file shown to a model as text, cut beyond
//! ```
//!
//! An `s3://` store takes its credentials and endpoint from the environment
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//! `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`), never from this file, and never logs
//! them.

use agentrt_runtime::media::MediaLimits;
use serde::Deserialize;

use super::ConfigError;

/// The `[blobs]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BlobSettings {
    /// The blob store: empty for `<data_dir>/blobs`.
    pub url: String,
    /// See the module docs.
    pub max_inline_bytes: u64,
    /// See the module docs.
    pub max_message_bytes: u64,
    /// See the module docs.
    pub max_upload_bytes: u64,
    /// See the module docs.
    pub mime_types: Vec<String>,
    /// See the module docs; 0 is no limit.
    pub quota_bytes: u64,
    /// See the module docs.
    pub event_inline_bytes: u64,
    /// See the module docs.
    pub max_media_per_request: usize,
    /// See the module docs.
    pub max_text_file_bytes: u64,
    /// See the module docs.
    pub max_request_media_bytes: u64,
}

impl Default for BlobSettings {
    fn default() -> Self {
        let d = MediaLimits::default();
        Self {
            url: String::new(),
            max_inline_bytes: d.max_inline_bytes,
            max_message_bytes: d.max_message_bytes,
            max_upload_bytes: d.max_upload_bytes,
            mime_types: d.mime_types,
            quota_bytes: d.quota_bytes.unwrap_or(0),
            event_inline_bytes: d.event_inline_bytes,
            max_media_per_request: d.max_media_per_request,
            max_text_file_bytes: d.max_text_file_bytes,
            max_request_media_bytes: d.max_request_media_bytes,
        }
    }
}

/// The largest upload or message of media (16 GiB).
const MAX_BYTES: u64 = 16 << 30;

impl BlobSettings {
    /// Rejects values that cannot work.
    pub fn validate(&self, max_request_bytes: usize) -> Result<(), ConfigError> {
        let url = &self.url;
        if !(url.is_empty() || url.starts_with("file:///") || url.starts_with("s3://")) {
            return Err(ConfigError(
                "blobs.url must be empty (<data_dir>/blobs), file:///PATH or s3://BUCKET[/PREFIX]"
                    .to_owned(),
            ));
        }
        if self.max_inline_bytes == 0 {
            return Err(ConfigError(
                "blobs.max_inline_bytes must be positive".to_owned(),
            ));
        }
        if self.max_inline_bytes >= max_request_bytes as u64 {
            // The transport refuses such requests first (naming its own
            // limit): worth a word, not a refusal to start.
            tracing::warn!(
                max_inline_bytes = self.max_inline_bytes,
                max_request_bytes,
                "blobs.max_inline_bytes is not below transport.max_request_bytes: inline media \
                 are bounded by the request limit"
            );
        }
        for (name, value) in [
            ("max_message_bytes", self.max_message_bytes),
            ("max_upload_bytes", self.max_upload_bytes),
        ] {
            if value == 0 || value > MAX_BYTES {
                return Err(ConfigError(format!(
                    "blobs.{name} is {value}; it must be between 1 and {MAX_BYTES} (16 GiB)"
                )));
            }
        }
        if self.mime_types.is_empty() {
            return Err(ConfigError(
                "blobs.mime_types is empty; list the media types to accept".to_owned(),
            ));
        }
        for m in &self.mime_types {
            let ok = m.split_once('/').is_some_and(|(t, s)| {
                !t.is_empty()
                    && !s.is_empty()
                    && m.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"/*.+-_".contains(&b))
            });
            if !ok {
                return Err(ConfigError(format!(
                    "blobs.mime_types: {m:?} is not a media type (type/subtype or type/*)"
                )));
            }
        }
        if !(1..=256).contains(&self.max_media_per_request) {
            return Err(ConfigError(format!(
                "blobs.max_media_per_request is {}; it must be between 1 and 256",
                self.max_media_per_request
            )));
        }
        Ok(())
    }

    /// The runtime's limits.
    pub fn limits(&self) -> MediaLimits {
        MediaLimits {
            max_inline_bytes: self.max_inline_bytes,
            max_message_bytes: self.max_message_bytes,
            max_upload_bytes: self.max_upload_bytes,
            mime_types: self.mime_types.clone(),
            quota_bytes: (self.quota_bytes > 0).then_some(self.quota_bytes),
            event_inline_bytes: self.event_inline_bytes,
            max_media_per_request: self.max_media_per_request,
            max_text_file_bytes: self.max_text_file_bytes,
            max_request_media_bytes: self.max_request_media_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_hold_and_bad_values_are_named() {
        let d = BlobSettings::default();
        d.validate(4 << 20).unwrap();
        assert_eq!(d.limits(), MediaLimits::default());
        let no_inline = BlobSettings {
            max_inline_bytes: 0,
            ..d.clone()
        };
        let err = no_inline.validate(4 << 20).unwrap_err().0;
        assert!(err.contains("max_inline_bytes"), "{err}");
        let url = BlobSettings {
            url: "ftp://x".to_owned(),
            ..d.clone()
        };
        assert!(url.validate(4 << 20).unwrap_err().0.contains("blobs.url"));
        let mime = BlobSettings {
            mime_types: vec!["pdf".to_owned()],
            ..d
        };
        assert!(mime.validate(4 << 20).unwrap_err().0.contains("pdf"));
    }
}
