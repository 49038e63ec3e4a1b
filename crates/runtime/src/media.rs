//! Images and files: the limits a user message's media are checked
//! against, what each model can read, and the checks of media blocks.
//!
//! Media bytes live in the blob store ([`crate::blobs`]); messages refer to
//! them ([`crate::types::MediaRef`]). A user message may carry media inline (small ones,
//! stored as blobs at admission) or by the id of a blob uploaded to its
//! session. What a model is shown of them is decided per request by
//! [`MediaSupport`]: what it cannot read becomes a short placeholder and a
//! `notice` event, never a request its upstream rejects.

use crate::error::FieldViolation;
use crate::limits;
use crate::types::MediaKind;
pub use crate::types::{MediaSupport, is_pdf, is_text};

/// Limits on media, each refused with a `BadRequest` naming the field and
/// the limit (`[blobs]` in the server's configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaLimits {
    /// Largest image or file given inline in a request. Default 3 MiB
    /// (requests themselves are bounded by the transport's limit).
    pub max_inline_bytes: u64,
    /// Most bytes of media one message may carry, inline and by reference
    /// together. Default 64 MiB.
    pub max_message_bytes: u64,
    /// Largest blob an upload may make. Default 64 MiB.
    pub max_upload_bytes: u64,
    /// Media types accepted (`type/subtype`, or `type/*`). Default: PNG,
    /// JPEG, GIF and WebP images, PDF, plain text, Markdown, CSV, JSON.
    pub mime_types: Vec<String>,
    /// Bytes of blobs (and uploads in progress) one user may hold; `None`
    /// for no limit. Default 1 GiB.
    pub quota_bytes: Option<u64>,
    /// `image` / `file` events carry the bytes inline up to this size (a
    /// reference alone above it). Default 64 KiB.
    pub event_inline_bytes: u64,
    /// Most media items sent with one model request: the newest ones; older
    /// ones become placeholders. Default 16.
    pub max_media_per_request: usize,
    /// Most bytes of media sent with one model request (before base64),
    /// newest first; past it, placeholders. Keeps requests within what the
    /// upstreams take (Anthropic: 32 MB a request) and what one turn holds
    /// in memory. Default 24 MiB.
    pub max_request_media_bytes: u64,
    /// A text file is shown to the model as text up to this size, cut
    /// beyond (with a note). Default 256 KiB.
    pub max_text_file_bytes: u64,
}

impl Default for MediaLimits {
    fn default() -> Self {
        Self {
            max_inline_bytes: 3 << 20,
            max_message_bytes: 64 << 20,
            max_upload_bytes: 64 << 20,
            mime_types: DEFAULT_MIME_TYPES.iter().map(|&m| m.to_owned()).collect(),
            quota_bytes: Some(1 << 30),
            event_inline_bytes: 64 << 10,
            max_media_per_request: 16,
            max_request_media_bytes: 24 << 20,
            max_text_file_bytes: 256 << 10,
        }
    }
}

/// The media types accepted unless configured otherwise.
pub const DEFAULT_MIME_TYPES: [&str; 9] = [
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "application/pdf",
    "text/plain",
    "text/markdown",
    "text/csv",
    "application/json",
];

impl MediaLimits {
    /// Whether `mime_type` is on the allow-list.
    pub fn allows(&self, mime_type: &str) -> bool {
        let (kind, _) = mime_type.split_once('/').unwrap_or((mime_type, ""));
        self.mime_types.iter().any(|allowed| {
            allowed == mime_type
                || allowed
                    .strip_suffix("/*")
                    .is_some_and(|prefix| prefix == kind)
        })
    }

    /// The allow-list, for messages.
    fn allowed(&self) -> String {
        self.mime_types.join(", ")
    }
}

/// Image types and the signature their bytes start with.
const IMAGE_TYPES: [(&str, &[u8]); 4] = [
    ("image/png", b"\x89PNG\r\n\x1a\n"),
    ("image/jpeg", b"\xff\xd8\xff"),
    ("image/gif", b"GIF8"),
    ("image/webp", b"RIFF"),
];

/// The image type whose signature `data` starts with.
pub fn sniff_image(data: &[u8]) -> Option<&'static str> {
    let webp = data.len() >= 12 && &data[8..12] == b"WEBP";
    IMAGE_TYPES
        .iter()
        .find(|(mime, magic)| data.starts_with(magic) && (*mime != "image/webp" || webp))
        .map(|(mime, _)| *mime)
}

/// Whether `mime_type` is an image type agentrt shows models.
pub fn is_image(mime_type: &str) -> bool {
    IMAGE_TYPES.iter().any(|(mime, _)| *mime == mime_type)
}

/// Checks media bytes given inline, `field` naming the block
/// (`content[2].image`): an accepted type, the size limit, and bytes that
/// are what the type says (an image of that type, a PDF, UTF-8 text).
pub fn check_inline(
    field: &str,
    kind: MediaKind,
    data: &[u8],
    mime_type: &str,
    limits: &MediaLimits,
    violations: &mut Vec<FieldViolation>,
) {
    if !check_type(field, kind, mime_type, limits, violations) {
        return;
    }
    if data.is_empty() {
        violations.push(FieldViolation::new(format!("{field}.data"), "is empty"));
        return;
    }
    let size = data.len() as u64;
    if size > limits.max_inline_bytes {
        violations.push(FieldViolation::new(
            format!("{field}.data"),
            format!(
                "is {size} bytes; the limit for inline media is {} bytes: upload larger files \
                 with UploadBlob and refer to them by blob_id",
                limits.max_inline_bytes
            ),
        ));
        return;
    }
    let wrong = if kind == MediaKind::Image || is_image(mime_type) {
        match sniff_image(data) {
            Some(found) if found == mime_type => None,
            Some(other) => Some(format!("the bytes are {other}")),
            None => Some("the bytes are not an image of an accepted type".to_owned()),
        }
    } else if is_pdf(mime_type) {
        (!data.starts_with(b"%PDF-")).then(|| "the bytes are not a PDF".to_owned())
    } else if is_text(mime_type) {
        std::str::from_utf8(data)
            .is_err()
            .then(|| "text must be UTF-8".to_owned())
    } else {
        None
    };
    if let Some(what) = wrong {
        violations.push(FieldViolation::new(
            format!("{field}.data"),
            format!("does not match mime_type {mime_type}: {what}"),
        ));
    }
}

/// Checks `mime_type` of a `kind` block: on the allow-list, and an image
/// type for an image. False when it is not.
pub fn check_type(
    field: &str,
    kind: MediaKind,
    mime_type: &str,
    limits: &MediaLimits,
    violations: &mut Vec<FieldViolation>,
) -> bool {
    let shown = limits::display_clip(mime_type, limits::MAX_ECHO_CHARS);
    let problem = if kind == MediaKind::Image && !is_image(mime_type) {
        Some(format!(
            "{shown:?} is not an accepted image type; use image/png, image/jpeg, image/gif or \
             image/webp"
        ))
    } else if !limits.allows(mime_type) {
        Some(format!(
            "{shown:?} is not an accepted media type; accepted: {}",
            limits.allowed()
        ))
    } else {
        None
    };
    match problem {
        Some(problem) => {
            violations.push(FieldViolation::new(format!("{field}.mime_type"), problem));
            false
        }
        None => true,
    }
}

/// Checks a file name: at most 255 bytes, no path separators or control
/// characters (it names a download, never a path).
pub fn check_name(field: &str, name: &str, violations: &mut Vec<FieldViolation>) {
    if name.len() > 255
        || name
            .chars()
            .any(|c| c.is_control() || c == '/' || c == '\\')
    {
        violations.push(FieldViolation::new(
            format!("{field}.name"),
            "must be at most 255 bytes, without '/', '\\' or control characters",
        ));
    }
}

/// Checks a blob id given in a request.
pub fn check_blob_id(field: &str, id: &str, violations: &mut Vec<FieldViolation>) {
    if !crate::blobs::valid_id(id) {
        violations.push(FieldViolation::new(
            format!("{field}.blob_id"),
            "must be a blob id: the 64 lower-case hex digits of the blob's sha256",
        ));
    }
}

/// The API's name of a `kind` block (`image`, `file`).
pub fn block_name(kind: MediaKind) -> &'static str {
    match kind {
        MediaKind::Image => "image",
        MediaKind::File => "file",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::MediaRef;

    #[test]
    fn the_allow_list_takes_wildcards() {
        let mut limits = MediaLimits::default();
        assert!(limits.allows("application/pdf"));
        assert!(!limits.allows("application/zip"));
        limits.mime_types.push("audio/*".to_owned());
        assert!(limits.allows("audio/wav"));
        assert!(!limits.allows("audiox/wav"));
    }

    #[test]
    fn inline_media_must_be_what_it_says_and_within_the_limit() {
        let limits = MediaLimits {
            max_inline_bytes: 16,
            ..MediaLimits::default()
        };
        let check = |kind, data: &[u8], mime: &str| {
            let mut v = Vec::new();
            check_inline("content[0].file", kind, data, mime, &limits, &mut v);
            v
        };
        assert!(check(MediaKind::File, b"%PDF-1.7", "application/pdf").is_empty());
        assert!(check(MediaKind::File, b"hello", "text/plain").is_empty());
        let zip = check(MediaKind::File, b"PK..", "application/zip");
        assert_eq!(zip[0].field, "content[0].file.mime_type");
        let fake = check(MediaKind::File, b"<html>", "application/pdf");
        assert_eq!(fake[0].field, "content[0].file.data");
        let big = check(MediaKind::File, &[b'a'; 17], "text/plain");
        assert!(big[0].description.contains("UploadBlob"), "{big:?}");
        assert!(!check(MediaKind::File, b"\xff\xfe", "text/plain").is_empty());
        let svg = check(MediaKind::Image, b"<svg/>", "text/plain");
        assert_eq!(svg[0].field, "content[0].file.mime_type");
    }

    #[test]
    fn models_read_what_their_support_says() {
        let image = MediaRef {
            kind: MediaKind::Image,
            blob_id: String::new(),
            mime_type: "image/png".to_owned(),
            size: 1,
            name: String::new(),
        };
        let pdf = MediaRef {
            kind: MediaKind::File,
            mime_type: "application/pdf".to_owned(),
            ..image.clone()
        };
        let text = MediaRef {
            kind: MediaKind::File,
            mime_type: "text/csv".to_owned(),
            ..image.clone()
        };
        assert!(!MediaSupport::TEXT.reads(&image));
        assert!(!MediaSupport::TEXT.reads(&pdf));
        assert!(MediaSupport::TEXT.reads(&text));
        let vision = MediaSupport {
            images: true,
            pdf: false,
        };
        assert!(vision.reads(&image) && !vision.reads(&pdf));
    }
}
