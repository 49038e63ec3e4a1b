//! Media in a turn: a user message's inline images and files become blobs
//! at admission (history refers to them), a tool's media become blobs and
//! events, and each model request is given what its model can read of the
//! context — the bytes, loaded from the blob store for that request only,
//! or a placeholder (and a `notice`).

use std::sync::Arc;

use bytes::Bytes;

use super::Inner;
use crate::blobs::{BlobError, BlobMeta, Blobs};
use crate::error::RuntimeError;
use crate::events::{EventKind, MediaEvent, Reference};
use crate::media::{MediaLimits, MediaSupport, block_name, is_pdf, is_text};
use crate::quota::QuotaExceeded;
use crate::toolbox::ToolMedia;
use crate::types::{ContentBlock, MediaKind, MediaRef, Message, human_size};

/// A reference to the blob `meta` describes, named `name` when this use
/// gives it one (the same bytes may be "photo.png" in one message and
/// "dot.png" in another), else by the blob's first name.
pub(crate) fn media_ref(kind: MediaKind, meta: BlobMeta, name: &str) -> MediaRef {
    MediaRef {
        kind,
        blob_id: meta.id,
        mime_type: meta.mime_type,
        size: meta.size,
        name: if name.is_empty() {
            meta.name
        } else {
            name.to_owned()
        },
    }
}

fn unavailable(err: &BlobError) -> RuntimeError {
    tracing::error!(error = %err, "the blob store failed");
    RuntimeError::Unavailable("the blob store is unavailable; retry later")
}

/// Refuses `adding` more bytes for `owner` past the blob quota.
pub(crate) async fn check_quota(
    blobs: &Blobs,
    limits: &MediaLimits,
    owner: &str,
    adding: u64,
) -> Result<(), RuntimeError> {
    let Some(quota) = limits.quota_bytes else {
        return Ok(());
    };
    let used = blobs.usage(owner).await.map_err(|e| unavailable(&e))?;
    if used.saturating_add(adding) > quota {
        return Err(RuntimeError::QuotaExceeded(QuotaExceeded::blob_bytes(
            quota,
        )));
    }
    Ok(())
}

/// A user message's media as blobs of session `session_id` of `owner`:
/// inline images and files are stored (within the quota), references to
/// uploaded blobs checked and completed (type, size, name from the blob
/// store). A reference to a blob the session does not hold is an invalid
/// argument naming the block.
pub(crate) async fn store_user_media(
    inner: &Inner,
    owner: &str,
    session_id: &str,
    content: Vec<ContentBlock>,
) -> Result<Vec<ContentBlock>, RuntimeError> {
    let has_media = content.iter().any(|b| {
        matches!(
            b,
            ContentBlock::Image { .. } | ContentBlock::File { .. } | ContentBlock::Media(_)
        )
    });
    if !has_media {
        return Ok(content);
    }
    let blobs = &inner.config.blobs;
    let limits = &inner.config.media;
    let inline: u64 = content
        .iter()
        .map(|b| match b {
            ContentBlock::Image { data, .. } | ContentBlock::File { data, .. } => data.len() as u64,
            _ => 0,
        })
        .sum();
    if inline > 0 {
        check_quota(blobs, limits, owner, inline).await?;
    }
    let mut total = 0u64;
    let mut out = Vec::with_capacity(content.len());
    for (i, block) in content.into_iter().enumerate() {
        let stored = match block {
            ContentBlock::Image { data, mime_type } => {
                let meta = blobs
                    .put_with(owner, session_id, Bytes::from(data), &mime_type, "")
                    .await
                    .map_err(|e| unavailable(&e))?;
                media_ref(MediaKind::Image, meta, "")
            }
            ContentBlock::File {
                data,
                mime_type,
                name,
            } => {
                let meta = blobs
                    .put_with(owner, session_id, Bytes::from(data), &mime_type, &name)
                    .await
                    .map_err(|e| unavailable(&e))?;
                media_ref(MediaKind::File, meta, &name)
            }
            ContentBlock::Media(m) => {
                let field = format!("content[{i}].{}", block_name(m.kind));
                let meta = match blobs.in_session(owner, session_id, &m.blob_id).await {
                    Ok(meta) => meta,
                    Err(BlobError::NotFound) => {
                        return Err(RuntimeError::invalid(
                            format!("{field}.blob_id"),
                            "names no blob of this session: upload it to the session with \
                             UploadBlob first",
                        ));
                    }
                    Err(e) => return Err(unavailable(&e)),
                };
                let found = media_ref(m.kind, meta, &m.name);
                check_referenced(&field, &found, limits)?;
                found
            }
            other => {
                out.push(other);
                continue;
            }
        };
        total = total.saturating_add(stored.size);
        out.push(ContentBlock::Media(stored));
    }
    if total > limits.max_message_bytes {
        return Err(RuntimeError::invalid(
            "content",
            format!(
                "holds {total} bytes of media; the limit is {} per message",
                limits.max_message_bytes
            ),
        ));
    }
    Ok(out)
}

/// An uploaded blob used as a `kind` block must be of a type that kind
/// takes.
fn check_referenced(field: &str, m: &MediaRef, limits: &MediaLimits) -> Result<(), RuntimeError> {
    let mut violations = Vec::new();
    crate::media::check_type(field, m.kind, &m.mime_type, limits, &mut violations);
    RuntimeError::check(violations)
}

/// What a tool's media became: the blobs (for the stored result), the
/// references (for its `tool_use` DONE) and notes for the result text
/// about media that could not be kept.
#[derive(Debug, Default)]
pub(crate) struct ToolMediaStored {
    pub(crate) media: Vec<MediaRef>,
    pub(crate) references: Vec<Reference>,
    pub(crate) notes: Vec<String>,
}

impl ToolMediaStored {
    /// Keeps `blob` (stored) for the result: its `image` / `file` event
    /// (with `data` inline when small; `uri` where the tool said it is),
    /// its reference.
    fn keep(
        &mut self,
        blob: MediaRef,
        data: Option<Bytes>,
        (call_id, uri): (&str, String),
        events: &mut Vec<EventKind>,
    ) {
        let event = Box::new(MediaEvent {
            blob: blob.clone(),
            data,
            call_id: call_id.to_owned(),
            uri,
        });
        events.push(match blob.kind {
            MediaKind::Image => EventKind::Image(event),
            MediaKind::File => EventKind::File(event),
        });
        self.references.push(Reference::Blob {
            blob: blob.clone(),
            intent: "result",
        });
        self.media.push(blob);
    }
}

/// Stores the media call `call_id` returned as blobs of the session and
/// announces them (`image` / `file` events; a `references` event for the
/// links). Media over the limits or the quota, or that the store refused,
/// are left out with a note (the tool's result stands).
pub(crate) async fn store_tool_media(
    inner: &Inner,
    (owner, session_id): (&str, &str),
    call_id: &str,
    media: Vec<ToolMedia>,
    events: &mut Vec<EventKind>,
) -> ToolMediaStored {
    let blobs = &inner.config.blobs;
    let limits = &inner.config.media;
    let mut out = ToolMediaStored::default();
    let mut links = Vec::new();
    // Room left under the owner's quota, listed once for the whole result
    // (None: no quota).
    let mut room = match limits.quota_bytes {
        Some(quota) if media.iter().any(|m| matches!(m, ToolMedia::Bytes { .. })) => {
            match blobs.usage(owner).await {
                Ok(used) => Some(quota.saturating_sub(used)),
                Err(e) => {
                    tracing::error!(error = %e, "the blob store failed");
                    Some(0)
                }
            }
        }
        Some(_) | None => None,
    };
    for item in media {
        match item {
            ToolMedia::Bytes {
                kind,
                data,
                mime_type,
                name,
                uri,
            } => {
                let size = data.len() as u64;
                let what = format!("{} ({mime_type}, {})", block_name(kind), human_size(size));
                if size > limits.max_upload_bytes {
                    out.notes.push(format!(
                        "[the tool returned {what}, larger than the {} limit: not kept]",
                        human_size(limits.max_upload_bytes)
                    ));
                    continue;
                }
                if let Some(left) = &mut room {
                    if size > *left {
                        tracing::warn!(size, "tool media over the owner's blob quota");
                        out.notes.push(format!(
                            "[the tool returned {what}: not kept, the user's storage quota is full]"
                        ));
                        continue;
                    }
                    *left -= size;
                }
                let inline = (size <= limits.event_inline_bytes).then(|| data.clone());
                let meta = match blobs
                    .put_with(owner, session_id, data, &mime_type, &name)
                    .await
                {
                    Ok(meta) => meta,
                    Err(e) => {
                        tracing::error!(error = %e, "storing a tool's media failed");
                        out.notes.push(format!(
                            "[the tool returned {what}: it could not be stored]"
                        ));
                        continue;
                    }
                };
                let blob = media_ref(kind, meta, &name);
                out.keep(blob, inline, (call_id, uri), events);
            }
            ToolMedia::Blob(named) => {
                let blobs = &inner.config.blobs;
                let meta = match blobs.in_session(owner, session_id, &named.blob_id).await {
                    Ok(meta) => meta,
                    Err(e) => {
                        tracing::warn!(error = %e, "a tool result named a blob the session lacks");
                        out.notes.push(format!(
                            "[the tool named blob {}, which this session does not hold: not kept]",
                            crate::limits::display_clip(&named.blob_id, 64)
                        ));
                        continue;
                    }
                };
                let blob = media_ref(named.kind, meta, &named.name);
                out.keep(blob, None, (call_id, String::new()), events);
            }
            ToolMedia::Link {
                uri,
                name,
                description,
                mime_type,
            } => {
                out.notes.push(format!("[resource link: {name} <{uri}>]"));
                links.push(Reference::Uri {
                    uri,
                    title: name,
                    preview: description,
                    mime_type,
                });
            }
        }
    }
    if !links.is_empty() {
        out.references.extend(links.iter().cloned());
        events.push(EventKind::References {
            call_id: call_id.to_owned(),
            references: links,
        });
    }
    out
}

/// What a model was not shown of a request's context.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct NotShown {
    /// Media it cannot read.
    pub(crate) unreadable: Vec<MediaRef>,
    /// Media left out as older than the newest `max_media_per_request`.
    pub(crate) older: usize,
    /// Media whose bytes could not be read.
    pub(crate) missing: usize,
}

impl NotShown {
    fn is_empty(&self) -> bool {
        self.unreadable.is_empty() && self.older == 0 && self.missing == 0
    }

    /// The `notice` event for model `model`, when something was not shown.
    pub(crate) fn notice(&self, model: &str) -> Option<EventKind> {
        if self.is_empty() {
            return None;
        }
        let mut parts = Vec::new();
        if !self.unreadable.is_empty() {
            let items: Vec<String> = self
                .unreadable
                .iter()
                .take(5)
                .map(MediaRef::describe)
                .collect();
            let more = self.unreadable.len().saturating_sub(5);
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            parts.push(format!(
                "{model} cannot read {}{more}: it was given a placeholder instead",
                items.join(", ")
            ));
        }
        if self.older > 0 {
            parts.push(format!(
                "{} older images or files were left out of the request (the request's media \
                 limits)",
                self.older
            ));
        }
        if self.missing > 0 {
            parts.push(format!(
                "{} images or files could not be read from storage",
                self.missing
            ));
        }
        Some(EventKind::Notice {
            code: "MEDIA_NOT_SHOWN",
            message: parts.join("; "),
        })
    }
}

/// Whether `messages` refer to any media (the common text-only context
/// is passed on as it is).
fn has_media(messages: &[Message]) -> bool {
    messages.iter().any(|m| {
        m.body.content.iter().any(|b| match b {
            ContentBlock::Media(_) => true,
            ContentBlock::ToolResult { media, .. } => !media.is_empty(),
            ContentBlock::Text { .. }
            | ContentBlock::Thinking { .. }
            | ContentBlock::Image { .. }
            | ContentBlock::File { .. }
            | ContentBlock::ToolCall { .. } => false,
        })
    })
}

/// `messages` as a model that reads `support` is shown them: media it reads
/// (the newest `max_media_per_request`) with their bytes (text files as
/// text), the others as placeholders; and what was not shown.
pub(crate) async fn for_model(
    inner: &Inner,
    owner: &str,
    support: MediaSupport,
    messages: Arc<Vec<Message>>,
) -> (Arc<Vec<Message>>, NotShown) {
    shown_to(
        (&inner.config.blobs, &inner.config.media),
        owner,
        support,
        messages,
    )
    .await
}

/// [`for_model`] over `blobs` and `limits`.
async fn shown_to(
    (blobs, limits): (&Blobs, &MediaLimits),
    owner: &str,
    support: MediaSupport,
    messages: Arc<Vec<Message>>,
) -> (Arc<Vec<Message>>, NotShown) {
    if !has_media(&messages) {
        return (messages, NotShown::default());
    }
    let mut shown = Shown {
        blobs,
        owner,
        support,
        limits,
        budget: limits.max_media_per_request,
        bytes_budget: limits.max_request_media_bytes,
        not_shown: NotShown::default(),
    };
    let mut out: Vec<Message> = messages.as_ref().clone();
    // Newest first, so the budget goes to the newest media.
    for message in out.iter_mut().rev() {
        let content = std::mem::take(&mut message.body.content);
        let mut blocks = Vec::with_capacity(content.len());
        for block in content {
            match block {
                ContentBlock::Media(m) => blocks.push(shown.block(&m).await),
                ContentBlock::ToolResult {
                    call_id,
                    name,
                    mut content,
                    is_error,
                    interrupted,
                    media,
                } => {
                    let mut extra = Vec::new();
                    for m in &media {
                        match shown.block(m).await {
                            ContentBlock::Text { text } => {
                                content.push('\n');
                                content.push_str(&text);
                            }
                            other => extra.push(other),
                        }
                    }
                    blocks.push(ContentBlock::ToolResult {
                        call_id,
                        name,
                        content,
                        is_error,
                        interrupted,
                        media: Vec::new(),
                    });
                    blocks.extend(extra);
                }
                other => blocks.push(other),
            }
        }
        message.body.content = blocks;
    }
    (Arc::new(out), shown.not_shown)
}

/// The state of one [`for_model`] pass.
struct Shown<'a> {
    blobs: &'a Blobs,
    owner: &'a str,
    support: MediaSupport,
    limits: &'a MediaLimits,
    /// Media that may still be sent with their bytes.
    budget: usize,
    /// Bytes of media that may still be sent.
    bytes_budget: u64,
    not_shown: NotShown,
}

impl Shown<'_> {
    /// What the model is shown of `m`: its bytes as an image or file block,
    /// a text file as text, or a placeholder.
    async fn block(&mut self, m: &MediaRef) -> ContentBlock {
        if !self.support.reads(m) {
            self.not_shown.unreadable.push(m.clone());
            return placeholder(m, "this model cannot read it");
        }
        if self.budget == 0 || m.size > self.bytes_budget {
            self.not_shown.older += 1;
            return placeholder(
                m,
                "left out: only the newest media that fit one request are sent",
            );
        }
        self.budget -= 1;
        self.bytes_budget -= m.size;
        let bytes = match self.blobs.read(self.owner, &m.blob_id).await {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!(blob_id = %m.blob_id, error = %e, "a blob of the context could not be read");
                self.not_shown.missing += 1;
                return placeholder(m, "it could not be read");
            }
        };
        if m.kind == MediaKind::File && is_text(&m.mime_type) {
            return text_file(m, &bytes, self.limits.max_text_file_bytes);
        }
        match m.kind {
            MediaKind::Image => ContentBlock::Image {
                data: bytes.to_vec(),
                mime_type: m.mime_type.clone(),
            },
            MediaKind::File if is_pdf(&m.mime_type) => ContentBlock::File {
                data: bytes.to_vec(),
                mime_type: m.mime_type.clone(),
                name: m.name.clone(),
            },
            MediaKind::File => placeholder(m, "this model cannot read it"),
        }
    }
}

fn placeholder(m: &MediaRef, why: &str) -> ContentBlock {
    ContentBlock::text(format!("[{} was attached here; {why}]", m.describe()))
}

/// A text file as a text block, cut at `max` bytes (on a character
/// boundary) with a note.
fn text_file(m: &MediaRef, bytes: &[u8], max: u64) -> ContentBlock {
    let text = String::from_utf8_lossy(bytes);
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    let name = if m.name.is_empty() { "file" } else { &m.name };
    if text.len() <= max {
        return ContentBlock::text(format!("[file {name}]\n{text}"));
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    ContentBlock::text(format!(
        "[file {name}, the first {end} of {} bytes]\n{}",
        text.len(),
        &text[..end]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{NewMessage, Role};

    fn message(seq: u64, content: Vec<ContentBlock>) -> Message {
        Message {
            seq,
            body: NewMessage::new("t", Role::User, content),
            compacted: false,
        }
    }

    async fn stored(
        blobs: &Blobs,
        kind: MediaKind,
        bytes: &[u8],
        mime: &str,
        name: &str,
    ) -> MediaRef {
        let meta = blobs
            .put_with("alice", "s", Bytes::copy_from_slice(bytes), mime, name)
            .await
            .unwrap();
        media_ref(kind, meta, "")
    }

    const VISION: MediaSupport = MediaSupport {
        images: true,
        pdf: false,
    };

    #[tokio::test]
    async fn a_text_only_context_is_passed_on_as_it_is() {
        let blobs = Blobs::default();
        let limits = MediaLimits::default();
        let messages = Arc::new(vec![message(0, vec![ContentBlock::text("hi")])]);
        let (shown, not_shown) =
            shown_to((&blobs, &limits), "alice", VISION, Arc::clone(&messages)).await;
        assert!(Arc::ptr_eq(&shown, &messages));
        assert_eq!(not_shown, NotShown::default());
    }

    #[tokio::test]
    async fn models_get_what_they_read_and_placeholders_for_the_rest() {
        let blobs = Blobs::default();
        let limits = MediaLimits {
            max_text_file_bytes: 9,
            ..MediaLimits::default()
        };
        let png = stored(
            &blobs,
            MediaKind::Image,
            b"\x89PNG....",
            "image/png",
            "a.png",
        )
        .await;
        let pdf = stored(
            &blobs,
            MediaKind::File,
            b"%PDF-1.7",
            "application/pdf",
            "r.pdf",
        )
        .await;
        let text = stored(
            &blobs,
            MediaKind::File,
            "héllo wörld".as_bytes(),
            "text/plain",
            "t.txt",
        )
        .await;
        let messages = Arc::new(vec![message(
            0,
            vec![
                ContentBlock::text("look"),
                ContentBlock::Media(png.clone()),
                ContentBlock::Media(pdf.clone()),
                ContentBlock::Media(text),
            ],
        )]);
        let (shown, not_shown) =
            shown_to((&blobs, &limits), "alice", VISION, Arc::clone(&messages)).await;
        let content = &shown[0].body.content;
        assert_eq!(
            content[1],
            ContentBlock::Image {
                data: b"\x89PNG....".to_vec(),
                mime_type: "image/png".into()
            }
        );
        let ContentBlock::Text { text: placeholder } = &content[2] else {
            panic!("{content:?}")
        };
        assert!(
            placeholder.contains("a file \"r.pdf\" (application/pdf, 8 B)"),
            "{placeholder}"
        );
        // Cut at 9 bytes, back to a character boundary.
        assert_eq!(
            content[3],
            ContentBlock::text("[file t.txt, the first 8 of 13 bytes]\nhéllo w")
        );
        assert_eq!(not_shown.unreadable, vec![pdf]);
        let notice = not_shown.notice("m/vision").unwrap();
        let EventKind::Notice { code, message } = notice else {
            panic!()
        };
        assert_eq!(code, "MEDIA_NOT_SHOWN");
        assert!(
            message.starts_with("m/vision cannot read a file \"r.pdf\""),
            "{message}"
        );
        // The stored context is untouched.
        assert_eq!(messages[0].body.content[1], ContentBlock::Media(png));
    }

    #[tokio::test]
    async fn only_the_newest_media_that_fit_one_request_are_sent() {
        let blobs = Blobs::default();
        let limits = MediaLimits {
            max_media_per_request: 2,
            max_request_media_bytes: 25,
            ..MediaLimits::default()
        };
        let mut images = Vec::new();
        for i in 0..3u8 {
            let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
            bytes.extend([i; 4]);
            images.push(stored(&blobs, MediaKind::Image, &bytes, "image/png", "").await);
        }
        let messages = Arc::new(
            images
                .iter()
                .enumerate()
                .map(|(i, m)| message(i as u64, vec![ContentBlock::Media(m.clone())]))
                .collect::<Vec<_>>(),
        );
        let (shown, not_shown) = shown_to((&blobs, &limits), "alice", VISION, messages).await;
        let sent: Vec<bool> = shown
            .iter()
            .map(|m| matches!(m.body.content[0], ContentBlock::Image { .. }))
            .collect();
        assert_eq!(sent, [false, true, true]);
        assert_eq!(not_shown.older, 1);
        // A byte budget smaller than one image: none goes.
        let tight = MediaLimits {
            max_request_media_bytes: 11,
            ..limits
        };
        let messages = Arc::new(vec![message(
            0,
            vec![ContentBlock::Media(images[0].clone())],
        )]);
        let (shown, _) = shown_to((&blobs, &tight), "alice", VISION, messages).await;
        assert!(matches!(
            shown[0].body.content[0],
            ContentBlock::Text { .. }
        ));
    }

    #[tokio::test]
    async fn a_blob_gone_from_the_store_is_a_placeholder_not_a_failure() {
        let blobs = Blobs::default();
        let limits = MediaLimits::default();
        let png = stored(&blobs, MediaKind::Image, b"\x89PNG....", "image/png", "").await;
        blobs.delete_session("alice", "s").await.unwrap();
        let messages = Arc::new(vec![message(0, vec![ContentBlock::Media(png)])]);
        let (shown, not_shown) = shown_to((&blobs, &limits), "alice", VISION, messages).await;
        assert!(matches!(
            shown[0].body.content[0],
            ContentBlock::Text { .. }
        ));
        assert_eq!(not_shown.missing, 1);
    }
}
