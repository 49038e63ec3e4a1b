//! A session's blobs: resumable uploads and reads.

use futures::StreamExt as _;
use sha2::{Digest as _, Sha256};

use crate::{Client, Error, proto};

/// Bytes per `UploadBlob` message.
const UPLOAD_CHUNK: usize = 256 << 10;
/// Streams an upload attempts before it gives up (each resumes where the
/// last one's committed bytes end).
const UPLOAD_ATTEMPTS: usize = 4;

/// The sha256 of `data`, lower-case hex (a blob's id).
pub fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Client {
    /// Uploads `data` to session `session_id` as a blob: in chunks,
    /// resuming from the committed size after a broken stream (asked with
    /// `GetUploadStatus`). The upload's id is derived from the bytes, so a
    /// second call with the same bytes — even from another process —
    /// resumes (or finds the blob already there). Attach the result to a
    /// turn with [`crate::ChatOptions::blob`].
    pub async fn upload_blob(
        &self,
        session_id: &str,
        mime_type: &str,
        name: &str,
        data: &[u8],
    ) -> Result<proto::BlobRef, Error> {
        let sha256 = sha256_hex(data);
        let upload_id = format!("sha256-{}", &sha256[..32]);
        let mut last_error = None;
        for _ in 0..UPLOAD_ATTEMPTS {
            let status = self
                .upload_status(session_id, &upload_id, Some(&sha256))
                .await?;
            if let Some(blob) = status.blob {
                return Ok(blob);
            }
            let offset = usize::try_from(status.committed_size)
                .unwrap_or(usize::MAX)
                .min(data.len());
            let first = proto::UploadBlobRequest {
                session_id: session_id.to_owned(),
                upload_id: upload_id.clone(),
                size: data.len() as u64,
                sha256: sha256.clone(),
                mime_type: mime_type.to_owned(),
                name: name.to_owned(),
                write_offset: offset as u64,
                data: Vec::new(),
            };
            let chunks: Vec<proto::UploadBlobRequest> = std::iter::once(first)
                .chain(
                    data[offset..]
                        .chunks(UPLOAD_CHUNK)
                        .map(|c| proto::UploadBlobRequest {
                            data: c.to_vec(),
                            ..proto::UploadBlobRequest::default()
                        }),
                )
                .collect();
            let mut stub = self.sessions.clone();
            let sent = self
                .call(
                    Some(session_id),
                    futures::stream::iter(chunks),
                    |r| async move { stub.upload_blob(r).await },
                )
                .await;
            match sent {
                Ok(proto::UploadBlobResponse {
                    blob: Some(blob), ..
                }) => return Ok(blob),
                // The stream ended before all bytes were committed: go on.
                Ok(_) => {}
                Err(e @ (Error::Unavailable { .. } | Error::Disconnected { .. })) => {
                    last_error = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| {
            Error::Protocol("the upload did not complete after several attempts".to_owned())
        }))
    }

    /// How much of upload `upload_id` is committed; with `sha256`, the
    /// blob when the upload already completed.
    pub async fn upload_status(
        &self,
        session_id: &str,
        upload_id: &str,
        sha256: Option<&str>,
    ) -> Result<proto::GetUploadStatusResponse, Error> {
        let req = proto::GetUploadStatusRequest {
            session_id: session_id.to_owned(),
            upload_id: upload_id.to_owned(),
            sha256: sha256.unwrap_or_default().to_owned(),
        };
        let mut stub = self.sessions.clone();
        self.call(Some(session_id), req, |r| async move {
            stub.get_upload_status(r).await
        })
        .await
    }

    /// Every blob session `session_id` holds (all pages), in id order.
    pub async fn list_blobs(&self, session_id: &str) -> Result<Vec<proto::BlobRef>, Error> {
        let mut out = Vec::new();
        let mut page_token = String::new();
        loop {
            let req = proto::ListBlobsRequest {
                session_id: session_id.to_owned(),
                page_size: 1000,
                page_token: std::mem::take(&mut page_token),
            };
            let mut stub = self.sessions.clone();
            let page = self
                .call(Some(session_id), req, |r| async move {
                    stub.list_blobs(r).await
                })
                .await?;
            out.extend(page.blobs);
            if page.next_page_token.is_empty() {
                return Ok(out);
            }
            page_token = page.next_page_token;
        }
    }

    /// Blob `blob_id` of session `session_id`: its reference and its bytes.
    pub async fn get_blob(
        &self,
        session_id: &str,
        blob_id: &str,
    ) -> Result<(proto::BlobRef, Vec<u8>), Error> {
        let req = proto::GetBlobRequest {
            session_id: session_id.to_owned(),
            blob_id: blob_id.to_owned(),
            read_offset: 0,
        };
        let mut stub = self.sessions.clone();
        let mut chunks = self
            .call(
                Some(session_id),
                req,
                |r| async move { stub.get_blob(r).await },
            )
            .await?;
        let mut blob = None;
        let mut bytes = Vec::new();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(self.fail(session_id))?;
            if blob.is_none() {
                blob = chunk.blob;
            }
            bytes.extend_from_slice(&chunk.data);
        }
        let blob =
            blob.ok_or_else(|| Error::Protocol("GetBlob sent no blob reference".to_owned()))?;
        Ok((blob, bytes))
    }
}
