//! Blobs: media bytes stored once per owner and referenced from messages
//! by id (P15, work in progress on branch `p15-blobs`).
//!
//! A blob's id is the sha256 of its bytes (lower-case hex), inside its
//! owner's namespace: the same bytes of two owners are two blobs, so an id
//! never tells one user that another holds the same bytes. Storage is one
//! [`ObjectStore`]: a local directory by default (under `data_dir`), any
//! S3-compatible store by URL for several replicas (credentials from the
//! environment, as the `object_store` crate reads them; never logged).
//!
//! Layout: `o/<sha256(owner)>/b/<id>` for a blob; an upload in progress is
//! its parts, `o/<sha256(owner)>/u/<upload id>/<offset, 20 digits>`, so the
//! committed offset is the sum of the parts stored (`QueryWriteStatus` of
//! ByteStream is the model) and a dropped connection resumes from there.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use sha2::{Digest as _, Sha256};

/// Errors of the blob store.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// No such blob (or upload) for this owner.
    #[error("blob not found")]
    NotFound,
    /// The request cannot be done as asked: a wrong offset, a digest or
    /// size that does not match, a malformed id.
    #[error("{0}")]
    Invalid(String),
    /// The storage failed.
    #[error("blob storage failure: {0}")]
    Backend(String),
}

impl From<object_store::Error> for BlobError {
    fn from(err: object_store::Error) -> Self {
        match err {
            object_store::Error::NotFound { .. } => Self::NotFound,
            other => Self::Backend(other.to_string()),
        }
    }
}

/// What a blob is, kept beside its bytes (`o/<sha256(owner)>/m/<id>`):
/// the first writer's mime type and name (the bytes are the same for every
/// writer; names and types given later do not replace them).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BlobMeta {
    /// Its id (sha256, hex).
    pub id: String,
    /// Mime type.
    pub mime_type: String,
    /// File name, possibly empty.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
}

fn meta_path(owner: &str, id: &str) -> Path {
    Path::from(format!("{}/m/{id}", owner_dir(owner)))
}

/// The bytes of a blob, in the store's chunks.
pub type BlobStream = BoxStream<'static, Result<Bytes, BlobError>>;

/// The blob store.
#[derive(Debug, Clone)]
pub struct Blobs {
    store: Arc<dyn ObjectStore>,
}

/// sha256 of `bytes`, lower-case hex.
pub fn digest(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `id` is a blob id: 64 lower-case hex digits.
pub fn valid_id(id: &str) -> bool {
    id.len() == 64
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `id` may name an upload: 1-64 characters of `A-Z a-z 0-9 - _`.
pub fn valid_upload_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn owner_dir(owner: &str) -> String {
    format!("o/{}", digest(owner.as_bytes()))
}

fn blob_path(owner: &str, id: &str) -> Path {
    Path::from(format!("{}/b/{id}", owner_dir(owner)))
}

fn upload_dir(owner: &str, upload_id: &str) -> Path {
    Path::from(format!("{}/u/{upload_id}", owner_dir(owner)))
}

impl Blobs {
    /// Blobs in `store`.
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }

    /// Blobs in the local directory `dir` (created when missing).
    pub fn local(dir: &std::path::Path) -> Result<Self, BlobError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| BlobError::Backend(format!("creating {}: {e}", dir.display())))?;
        let store = object_store::local::LocalFileSystem::new_with_prefix(dir)?;
        Ok(Self::new(Arc::new(store)))
    }

    /// The blob store `url` names (`[blobs] url`): empty for a `blobs`
    /// directory under `data_dir`, `file:///path` for another directory,
    /// `s3://bucket/prefix` for an S3-compatible store configured from the
    /// environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_REGION`, `AWS_ENDPOINT` for a store other than AWS, …).
    pub fn open(url: &str, data_dir: &std::path::Path) -> Result<Self, BlobError> {
        if url.is_empty() {
            return Self::local(&data_dir.join("blobs"));
        }
        if let Some(path) = url.strip_prefix("file://") {
            return Self::local(std::path::Path::new(path));
        }
        let Some(rest) = url.strip_prefix("s3://") else {
            return Err(BlobError::Invalid(
                "blobs.url must be empty, file:///PATH or s3://BUCKET[/PREFIX]".to_owned(),
            ));
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(BlobError::Invalid("blobs.url names no bucket".to_owned()));
        }
        let s3 = object_store::aws::AmazonS3Builder::from_env()
            .with_url(format!("s3://{bucket}"))
            .build()?;
        let prefix = prefix.trim_matches('/');
        Ok(if prefix.is_empty() {
            Self::new(Arc::new(s3))
        } else {
            Self::new(Arc::new(object_store::prefix::PrefixStore::new(
                s3,
                Path::from(prefix),
            )))
        })
    }

    /// Stores `bytes` for `owner`; its id. Storing the same bytes again is
    /// a no-op returning the same id.
    pub async fn put(&self, owner: &str, bytes: Bytes) -> Result<String, BlobError> {
        let id = digest(&bytes);
        self.store
            .put(&blob_path(owner, &id), PutPayload::from(bytes))
            .await?;
        Ok(id)
    }

    /// Stores `bytes` for `owner` with what they are; their metadata (the
    /// stored one when the same bytes were stored before).
    pub async fn put_with(
        &self,
        owner: &str,
        bytes: Bytes,
        mime_type: &str,
        name: &str,
    ) -> Result<BlobMeta, BlobError> {
        let size = bytes.len() as u64;
        let id = self.put(owner, bytes).await?;
        match self.meta(owner, &id).await {
            Ok(meta) => return Ok(meta),
            Err(BlobError::NotFound) => {}
            Err(e) => return Err(e),
        }
        let meta = BlobMeta {
            id,
            mime_type: mime_type.to_owned(),
            name: name.to_owned(),
            size,
        };
        let json = serde_json::to_vec(&meta).map_err(|e| BlobError::Backend(e.to_string()))?;
        self.store
            .put(&meta_path(owner, &meta.id), PutPayload::from(json))
            .await?;
        Ok(meta)
    }

    /// The metadata of `owner`'s blob `id`.
    pub async fn meta(&self, owner: &str, id: &str) -> Result<BlobMeta, BlobError> {
        if !valid_id(id) {
            return Err(BlobError::NotFound);
        }
        let raw = self.store.get(&meta_path(owner, id)).await?.bytes().await?;
        serde_json::from_slice(&raw)
            .map_err(|e| BlobError::Backend(format!("blob metadata {id}: {e}")))
    }

    /// The size of `owner`'s blob `id`.
    pub async fn size(&self, owner: &str, id: &str) -> Result<u64, BlobError> {
        if !valid_id(id) {
            return Err(BlobError::NotFound);
        }
        Ok(self.store.head(&blob_path(owner, id)).await?.size)
    }

    /// The bytes of `owner`'s blob `id`, streamed.
    pub async fn get(&self, owner: &str, id: &str) -> Result<BlobStream, BlobError> {
        if !valid_id(id) {
            return Err(BlobError::NotFound);
        }
        let got = self.store.get(&blob_path(owner, id)).await?;
        Ok(got
            .into_stream()
            .map(|c| c.map_err(BlobError::from))
            .boxed())
    }

    /// Deletes `owner`'s blob `id` (nothing when it is gone already).
    pub async fn delete(&self, owner: &str, id: &str) -> Result<(), BlobError> {
        if !valid_id(id) {
            return Ok(());
        }
        for path in [meta_path(owner, id), blob_path(owner, id)] {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// How many bytes of `owner`'s upload `upload_id` are committed (0 for
    /// an upload not begun).
    pub async fn upload_offset(&self, owner: &str, upload_id: &str) -> Result<u64, BlobError> {
        Ok(self
            .parts(owner, upload_id)
            .await?
            .iter()
            .map(|(_, size)| size)
            .sum())
    }

    /// Appends `bytes` at `offset` to `owner`'s upload `upload_id`, which
    /// must be its committed offset; the new committed offset.
    pub async fn upload_append(
        &self,
        owner: &str,
        upload_id: &str,
        offset: u64,
        bytes: Bytes,
    ) -> Result<u64, BlobError> {
        let committed = self.upload_offset(owner, upload_id).await?;
        if offset != committed {
            return Err(BlobError::Invalid(format!(
                "write_offset {offset} is not the committed offset {committed}: resume from there"
            )));
        }
        if bytes.is_empty() {
            return Ok(committed);
        }
        let len = bytes.len() as u64;
        let part = upload_dir(owner, upload_id).join(format!("{offset:020}"));
        self.store.put(&part, PutPayload::from(bytes)).await?;
        Ok(committed + len)
    }

    /// Ends `owner`'s upload `upload_id`: its bytes, whose size and sha256
    /// must be `size` and `sha256`, become a blob (its id); the parts are
    /// deleted.
    pub async fn upload_finish(
        &self,
        owner: &str,
        upload_id: &str,
        size: u64,
        sha256: &str,
    ) -> Result<String, BlobError> {
        let parts = self.parts(owner, upload_id).await?;
        let total: u64 = parts.iter().map(|(_, s)| s).sum();
        if total != size {
            return Err(BlobError::Invalid(format!(
                "the upload holds {total} bytes, not the {size} announced"
            )));
        }
        let mut hasher = Sha256::new();
        let mut bytes = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
        for (path, _) in &parts {
            let chunk = self.store.get(path).await?.bytes().await?;
            hasher.update(&chunk);
            bytes.extend_from_slice(&chunk);
        }
        let id = hex(&hasher.finalize());
        if id != sha256 {
            return Err(BlobError::Invalid(format!(
                "the upload's sha256 is {id}, not {sha256}"
            )));
        }
        self.store
            .put(&blob_path(owner, &id), PutPayload::from(bytes))
            .await?;
        for (path, _) in parts {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(id)
    }

    /// An upload's parts in offset order, with their sizes.
    async fn parts(&self, owner: &str, upload_id: &str) -> Result<Vec<(Path, u64)>, BlobError> {
        if !valid_upload_id(upload_id) {
            return Err(BlobError::Invalid(
                "upload_id must be 1-64 characters of A-Z a-z 0-9 - _".to_owned(),
            ));
        }
        let dir = upload_dir(owner, upload_id);
        let mut listed = self.store.list(Some(&dir));
        let mut parts = Vec::new();
        while let Some(meta) = listed.next().await {
            let meta = meta?;
            parts.push((meta.location, meta.size));
        }
        parts.sort_by(|a, b| a.0.as_ref().cmp(b.0.as_ref()));
        Ok(parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read(blobs: &Blobs, owner: &str, id: &str) -> Result<Vec<u8>, BlobError> {
        let mut stream = blobs.get(owner, id).await?;
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            out.extend_from_slice(&chunk?);
        }
        Ok(out)
    }

    #[test]
    fn urls_name_a_directory_or_a_bucket() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Blobs::open("", dir.path()).is_ok());
        assert!(dir.path().join("blobs").is_dir());
        let other = dir.path().join("elsewhere");
        assert!(Blobs::open(&format!("file://{}", other.display()), dir.path()).is_ok());
        assert!(other.is_dir());
        for bad in ["ftp://x", "s3://", "/tmp/x"] {
            assert!(
                matches!(Blobs::open(bad, dir.path()), Err(BlobError::Invalid(_))),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn blobs_are_content_addressed_per_owner() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::local(dir.path()).unwrap();
        let id = blobs
            .put("alice", Bytes::from_static(b"png bytes"))
            .await
            .unwrap();
        assert_eq!(id, digest(b"png bytes"));
        assert_eq!(
            blobs
                .put("alice", Bytes::from_static(b"png bytes"))
                .await
                .unwrap(),
            id
        );
        assert_eq!(read(&blobs, "alice", &id).await.unwrap(), b"png bytes");
        assert_eq!(blobs.size("alice", &id).await.unwrap(), 9);
        // Another owner does not see it, even knowing the digest.
        assert!(matches!(
            read(&blobs, "bob", &id).await,
            Err(BlobError::NotFound)
        ));
        assert!(matches!(
            blobs.get("alice", "../x").await,
            Err(BlobError::NotFound)
        ));
        blobs.delete("alice", &id).await.unwrap();
        assert!(matches!(
            read(&blobs, "alice", &id).await,
            Err(BlobError::NotFound)
        ));
        blobs.delete("alice", &id).await.unwrap();
    }

    #[tokio::test]
    async fn metadata_is_the_first_writers_and_goes_with_the_blob() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::local(dir.path()).unwrap();
        let bytes = Bytes::from_static(b"%PDF-1.7");
        let first = blobs
            .put_with("alice", bytes.clone(), "application/pdf", "a.pdf")
            .await
            .unwrap();
        assert_eq!((first.size, first.name.as_str()), (8, "a.pdf"));
        let again = blobs
            .put_with("alice", bytes, "application/octet-stream", "b.bin")
            .await
            .unwrap();
        assert_eq!(again, first);
        assert!(matches!(
            blobs.meta("bob", &first.id).await,
            Err(BlobError::NotFound)
        ));
        blobs.delete("alice", &first.id).await.unwrap();
        assert!(matches!(
            blobs.meta("alice", &first.id).await,
            Err(BlobError::NotFound)
        ));
    }

    #[tokio::test]
    async fn an_upload_resumes_from_its_committed_offset_and_checks_its_digest() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let blobs = Blobs::local(dir.path()).unwrap();
        assert_eq!(blobs.upload_offset("alice", "up-1").await.unwrap(), 0);
        let half = Bytes::copy_from_slice(&data[..60_000]);
        assert_eq!(
            blobs.upload_append("alice", "up-1", 0, half).await.unwrap(),
            60_000
        );
        // A new process (another replica on a shared store) sees the same
        // committed offset; a write elsewhere is refused.
        let blobs = Blobs::local(dir.path()).unwrap();
        assert_eq!(blobs.upload_offset("alice", "up-1").await.unwrap(), 60_000);
        let wrong = blobs
            .upload_append("alice", "up-1", 0, Bytes::from_static(b"x"))
            .await;
        assert!(matches!(wrong, Err(BlobError::Invalid(_))), "{wrong:?}");
        assert_eq!(blobs.upload_offset("bob", "up-1").await.unwrap(), 0);
        let rest = Bytes::copy_from_slice(&data[60_000..]);
        assert_eq!(
            blobs
                .upload_append("alice", "up-1", 60_000, rest)
                .await
                .unwrap(),
            100_000
        );
        let bad = blobs
            .upload_finish("alice", "up-1", 100_000, &digest(b"other"))
            .await;
        assert!(matches!(bad, Err(BlobError::Invalid(_))), "{bad:?}");
        let id = blobs
            .upload_finish("alice", "up-1", 100_000, &digest(&data))
            .await
            .unwrap();
        assert_eq!(read(&blobs, "alice", &id).await.unwrap(), data);
        assert_eq!(blobs.upload_offset("alice", "up-1").await.unwrap(), 0);
        assert!(matches!(
            blobs.upload_offset("alice", "../up").await,
            Err(BlobError::Invalid(_))
        ));
    }
}
