//! A session's blobs through the API: resumable uploads (`UploadBlob`,
//! `GetUploadStatus`) and reads (`GetBlob`), for the session's owner only.

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt as _};

use super::Runtime;
use super::media::{check_quota, media_ref};
use crate::blobs::{BlobError, BlobMeta, BlobStream, UploadTarget};
use crate::error::{FieldViolation, RuntimeError};
use crate::limits::validate_session_id;
use crate::media::{check_name, check_type};
use crate::types::{MediaKind, MediaRef, Principal};

/// Bytes an upload gathers before it commits them as one part: the
/// committed offset advances in steps of this (or at the stream's end), so
/// a client sending tiny chunks cannot make millions of parts.
const PART_BYTES: usize = 1 << 20;

/// The first message of an upload.
#[derive(Debug, Clone, Default)]
pub struct UploadStart {
    /// The session the blob is for.
    pub session_id: String,
    /// The caller's id of the upload (1-64 characters of `A-Z a-z 0-9 - _`).
    pub upload_id: String,
    /// The blob's total size.
    pub size: u64,
    /// Its sha256, lower-case hex.
    pub sha256: String,
    /// Its media type.
    pub mime_type: String,
    /// Its file name (may be empty).
    pub name: String,
    /// Where this stream's data starts: the committed size.
    pub write_offset: u64,
}

/// Where an upload is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadStatus {
    /// Bytes committed.
    pub committed: u64,
    /// The blob, once the upload is complete.
    pub blob: Option<MediaRef>,
}

/// A blob being read: what it is, and its bytes from the offset asked.
pub struct BlobRead {
    /// The blob.
    pub blob: MediaRef,
    /// Its bytes.
    pub bytes: BlobStream,
}

impl std::fmt::Debug for BlobRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobRead")
            .field("blob", &self.blob)
            .finish_non_exhaustive()
    }
}

/// The kind of media a blob of `mime_type` is shown as.
pub fn kind_of(mime_type: &str) -> MediaKind {
    if crate::media::is_image(mime_type) {
        MediaKind::Image
    } else {
        MediaKind::File
    }
}

fn reference(meta: BlobMeta) -> MediaRef {
    media_ref(kind_of(&meta.mime_type), meta, "")
}

fn blob_failure(err: BlobError) -> RuntimeError {
    match err {
        BlobError::Invalid(why) => {
            RuntimeError::InvalidArgument(vec![FieldViolation::new("data", why)])
        }
        BlobError::NotFound | BlobError::Backend(_) => {
            tracing::error!(error = %err, "the blob store failed");
            RuntimeError::Unavailable("the blob store is unavailable; retry later")
        }
    }
}

impl Runtime {
    fn check_upload(&self, start: &UploadStart) -> Result<(), RuntimeError> {
        validate_session_id("session_id", &start.session_id)?;
        let limits = &self.inner.config.media;
        let mut violations = Vec::new();
        if !crate::blobs::valid_upload_id(&start.upload_id) {
            violations.push(FieldViolation::new(
                "upload_id",
                "must be 1-64 characters of A-Z a-z 0-9 - _ (e.g. a UUID)",
            ));
        }
        if !crate::blobs::valid_id(&start.sha256) {
            violations.push(FieldViolation::new(
                "sha256",
                "must be the blob's sha256 as 64 lower-case hex digits",
            ));
        }
        if start.size == 0 || start.size > limits.max_upload_bytes {
            violations.push(FieldViolation::new(
                "size",
                format!(
                    "is {}; it must be between 1 and {} bytes (the upload limit)",
                    start.size, limits.max_upload_bytes
                ),
            ));
        }
        if start.write_offset > start.size {
            violations.push(FieldViolation::new(
                "write_offset",
                "is beyond the announced size",
            ));
        }
        check_type(
            "upload",
            kind_of(&start.mime_type),
            &start.mime_type,
            limits,
            &mut violations,
        );
        check_name("upload", &start.name, &mut violations);
        // The fields are top-level in the request.
        for v in &mut violations {
            if let Some(field) = v.field.strip_prefix("upload.") {
                v.field = field.to_owned();
            }
        }
        RuntimeError::check(violations)
    }

    /// Uploads (part of) a blob to one of `who`'s sessions: `data` from
    /// `start.write_offset`, which must be the upload's committed size. The
    /// bytes are committed in parts as they come; when all `start.size`
    /// are committed and their sha256 is `start.sha256` the blob is made
    /// (and the upload's parts deleted). A stream that ends early (or
    /// breaks) leaves what it sent committed: the upload resumes from
    /// there. A blob the session holds already is complete at once.
    pub async fn upload_blob<S>(
        &self,
        who: &Principal,
        start: UploadStart,
        mut data: S,
    ) -> Result<UploadStatus, RuntimeError>
    where
        S: Stream<Item = Result<Bytes, RuntimeError>> + Unpin + Send,
    {
        self.check_upload(&start)?;
        let session = self.owned_session(who, &start.session_id).await?;
        let blobs = &self.inner.config.blobs;
        let owner = session.owner.as_str();
        let upload = (owner, session.id.as_str(), start.upload_id.as_str());
        if let Ok(meta) = blobs.in_session(owner, &session.id, &start.sha256).await {
            return Ok(UploadStatus {
                committed: meta.size,
                blob: Some(reference(meta)),
            });
        }
        let mut committed = blobs
            .upload_offset(owner, &session.id, &start.upload_id)
            .await
            .map_err(blob_failure)?;
        if start.write_offset != committed {
            return Err(RuntimeError::invalid(
                "write_offset",
                format!(
                    "is {}; the upload's committed size is {committed}: resume from there \
                     (GetUploadStatus)",
                    start.write_offset
                ),
            ));
        }
        check_quota(
            blobs,
            &self.inner.config.media,
            owner,
            start.size - committed,
        )
        .await?;
        let mut pending = BytesMut::new();
        let broke = loop {
            let chunk = match data.next().await {
                Some(Ok(chunk)) => chunk,
                Some(Err(e)) => break Some(e),
                None => break None,
            };
            let after = committed + pending.len() as u64 + chunk.len() as u64;
            if after > start.size {
                return Err(RuntimeError::invalid(
                    "data",
                    format!(
                        "the upload's bytes pass its announced size of {} bytes",
                        start.size
                    ),
                ));
            }
            pending.extend_from_slice(&chunk);
            if pending.len() >= PART_BYTES {
                let part = pending.split().freeze();
                committed = blobs
                    .upload_append(upload, committed, part)
                    .await
                    .map_err(blob_failure)?;
            }
        };
        // What arrived whole is kept, even when the stream broke after it.
        if !pending.is_empty() {
            committed = blobs
                .upload_append(upload, committed, pending.freeze())
                .await
                .map_err(blob_failure)?;
        }
        if let Some(broken) = broke {
            return Err(broken);
        }
        if committed < start.size {
            return Ok(UploadStatus {
                committed,
                blob: None,
            });
        }
        let target = UploadTarget {
            size: start.size,
            sha256: start.sha256,
            mime_type: start.mime_type,
            name: start.name,
        };
        let meta = match blobs.upload_finish(upload, &target).await {
            Ok(meta) => meta,
            Err(BlobError::Invalid(why)) => {
                // The parts are kept (they are what was sent): the caller
                // starts over under a new upload id.
                return Err(RuntimeError::invalid("sha256", why));
            }
            Err(e) => return Err(blob_failure(e)),
        };
        Ok(UploadStatus {
            committed: meta.size,
            blob: Some(reference(meta)),
        })
    }

    /// How much of an upload to one of `who`'s sessions is committed; with
    /// `sha256`, a blob the session holds already (the upload completed)
    /// is returned.
    pub async fn upload_status(
        &self,
        who: &Principal,
        session_id: &str,
        upload_id: &str,
        sha256: Option<&str>,
    ) -> Result<UploadStatus, RuntimeError> {
        validate_session_id("session_id", session_id)?;
        if !crate::blobs::valid_upload_id(upload_id) {
            return Err(RuntimeError::invalid(
                "upload_id",
                "must be 1-64 characters of A-Z a-z 0-9 - _",
            ));
        }
        let session = self.owned_session(who, session_id).await?;
        let blobs = &self.inner.config.blobs;
        if let Some(sha256) = sha256 {
            if !crate::blobs::valid_id(sha256) {
                return Err(RuntimeError::invalid(
                    "sha256",
                    "must be 64 lower-case hex digits",
                ));
            }
            if let Ok(meta) = blobs.in_session(&session.owner, &session.id, sha256).await {
                return Ok(UploadStatus {
                    committed: meta.size,
                    blob: Some(reference(meta)),
                });
            }
        }
        let committed = blobs
            .upload_offset(&session.owner, &session.id, upload_id)
            .await
            .map_err(blob_failure)?;
        Ok(UploadStatus {
            committed,
            blob: None,
        })
    }

    /// A page of the blobs one of `who`'s sessions holds (its messages'
    /// and tools' images and files, its uploads, the files its tool
    /// workspaces kept), in id order: at most `page_size` (1-1000, default
    /// 100) after `page_token` (the last id of the previous page).
    pub async fn list_blobs(
        &self,
        who: &Principal,
        session_id: &str,
        page_size: usize,
        page_token: &str,
    ) -> Result<(Vec<MediaRef>, String), RuntimeError> {
        validate_session_id("session_id", session_id)?;
        if !page_token.is_empty() && !crate::blobs::valid_id(page_token) {
            return Err(RuntimeError::invalid(
                "page_token",
                "is not a token of a previous page",
            ));
        }
        let size = match page_size {
            0 => 100,
            n => n.min(1000),
        };
        let session = self.owned_session(who, session_id).await?;
        let found = self
            .inner
            .config
            .blobs
            .session_blobs(&session.owner, &session.id, page_token, size)
            .await
            .map_err(blob_failure)?;
        let next = if found.len() == size {
            found.last().map(|m| m.id.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok((found.into_iter().map(reference).collect(), next))
    }

    /// Blob `blob_id` of one of `who`'s sessions, read from `offset`;
    /// `None` when the session holds no such blob (another user's session
    /// is not found).
    pub async fn get_blob(
        &self,
        who: &Principal,
        session_id: &str,
        blob_id: &str,
        offset: u64,
    ) -> Result<Option<BlobRead>, RuntimeError> {
        validate_session_id("session_id", session_id)?;
        if !crate::blobs::valid_id(blob_id) {
            return Err(RuntimeError::invalid(
                "blob_id",
                "must be 64 lower-case hex digits (a blob's sha256)",
            ));
        }
        let session = self.owned_session(who, session_id).await?;
        let blobs = &self.inner.config.blobs;
        let meta = match blobs.in_session(&session.owner, &session.id, blob_id).await {
            Ok(meta) => meta,
            Err(BlobError::NotFound) => return Ok(None),
            Err(e) => return Err(blob_failure(e)),
        };
        if offset > meta.size {
            return Err(RuntimeError::invalid(
                "read_offset",
                format!("is beyond the blob's {} bytes", meta.size),
            ));
        }
        let bytes = match blobs.get_from(&session.owner, blob_id, offset).await {
            Ok(bytes) => bytes,
            Err(BlobError::NotFound) => return Ok(None),
            Err(e) => return Err(blob_failure(e)),
        };
        Ok(Some(BlobRead {
            blob: reference(meta),
            bytes,
        }))
    }
}
