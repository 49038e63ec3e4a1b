//! Blobs: media bytes stored once per owner and referenced from messages
//! by id.
//!
//! A blob's id is the sha256 of its bytes (lower-case hex), inside its
//! owner's namespace: the same bytes of two owners are two blobs, so an id
//! never tells one user that another holds the same bytes. Storage is one
//! [`ObjectStore`]: a local directory by default (under `data_dir`), any
//! S3-compatible store by URL for several replicas (credentials from the
//! environment, as the `object_store` crate reads them; never logged).
//!
//! Layout under `o/<sha256(owner)>/`: `b/<id>` a blob's bytes, `m/<id>` what
//! it is ([`BlobMeta`]); the sessions that refer to it as pairs of empty
//! markers, `s/<S>/<id>` and `r/<id>/<S>` (`S` the sha256 of the session
//! id), so deleting a session finds its blobs and deletes each one no other
//! session refers to. A session's upload in progress is its parts,
//! `u/<S>/<upload id>/<offset, 20 digits>`, so the committed offset is the
//! sum of the parts stored (`QueryWriteStatus` of ByteStream is the model)
//! and a dropped connection resumes from there; on its end the parts are
//! copied into the blob by a multipart write (never all in memory) while
//! their digest is checked.
//!
//! A session's markers are written *before* its blob's bytes, so a delete of
//! another session that sees no marker left and deletes the bytes is always
//! followed by this session's write of them.

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

fn session_key(session_id: &str) -> String {
    digest(session_id.as_bytes())
}

fn upload_dir(owner: &str, session_id: &str, upload_id: &str) -> Path {
    Path::from(format!(
        "{}/u/{}/{upload_id}",
        owner_dir(owner),
        session_key(session_id)
    ))
}

fn session_marker(owner: &str, session_id: &str, id: &str) -> Path {
    Path::from(format!(
        "{}/s/{}/{id}",
        owner_dir(owner),
        session_key(session_id)
    ))
}

fn ref_marker(owner: &str, id: &str, session_key: &str) -> Path {
    Path::from(format!("{}/r/{id}/{session_key}", owner_dir(owner)))
}

/// What an upload is to become: the blob's announced size and sha256, and
/// what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadTarget {
    /// Its size in bytes.
    pub size: u64,
    /// Its sha256, lower-case hex (the blob's id).
    pub sha256: String,
    /// Its mime type.
    pub mime_type: String,
    /// Its file name (may be empty).
    pub name: String,
}

/// The environment variables an `s3://` blob store is configured from.
pub const S3_ENV: [&str; 10] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT",
    "AWS_ENDPOINT_URL",
    "AWS_ALLOW_HTTP",
    "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
    "AWS_S3_EXPRESS",
];

/// The blob store.
#[derive(Debug, Clone)]
pub struct Blobs {
    store: Arc<dyn ObjectStore>,
}

impl Default for Blobs {
    /// Blobs in memory (tests, and a runtime opened without a blob store).
    fn default() -> Self {
        Self::new(Arc::new(object_store::memory::InMemory::new()))
    }
}

async fn delete_quietly(store: &dyn ObjectStore, path: &Path) -> Result<(), BlobError> {
    match store.delete(path).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
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
    /// environment as `env` reads it (the `AWS_*` variables of
    /// [`S3_ENV`]: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_REGION`, `AWS_ENDPOINT` for a store other than AWS,
    /// `AWS_ALLOW_HTTP=true` for one on plain HTTP, ...).
    pub fn open(
        url: &str,
        data_dir: &std::path::Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, BlobError> {
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
        let mut builder = object_store::aws::AmazonS3Builder::new();
        for name in S3_ENV {
            if let Some(value) = env(name)
                && let Ok(key) = name
                    .to_ascii_lowercase()
                    .parse::<object_store::aws::AmazonS3ConfigKey>()
            {
                builder = builder.with_config(key, value);
            }
        }
        let s3 = builder.with_url(format!("s3://{bucket}")).build()?;
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

    /// Marks blob `id` of `owner` as referred to by session `session_id`.
    async fn link(&self, owner: &str, session_id: &str, id: &str) -> Result<(), BlobError> {
        let key = session_key(session_id);
        self.store
            .put(&ref_marker(owner, id, &key), PutPayload::default())
            .await?;
        self.store
            .put(
                &session_marker(owner, session_id, id),
                PutPayload::default(),
            )
            .await?;
        Ok(())
    }

    /// Stores `bytes` as a blob of `owner` referred to by session
    /// `session_id`, with what they are; its metadata (the stored one when
    /// the same bytes were stored before: the first writer's type and name).
    pub async fn put_with(
        &self,
        owner: &str,
        session_id: &str,
        bytes: Bytes,
        mime_type: &str,
        name: &str,
    ) -> Result<BlobMeta, BlobError> {
        let size = bytes.len() as u64;
        let id = digest(&bytes);
        self.link(owner, session_id, &id).await?;
        self.store
            .put(&blob_path(owner, &id), PutPayload::from(bytes))
            .await?;
        self.meta_or(
            owner,
            BlobMeta {
                id,
                mime_type: mime_type.to_owned(),
                name: name.to_owned(),
                size,
            },
        )
        .await
    }

    /// The stored metadata of `meta.id`, or `meta` stored as it.
    async fn meta_or(&self, owner: &str, meta: BlobMeta) -> Result<BlobMeta, BlobError> {
        match self.meta(owner, &meta.id).await {
            Ok(stored) => return Ok(stored),
            Err(BlobError::NotFound) => {}
            Err(e) => return Err(e),
        }
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

    /// The metadata of `owner`'s blob `id` when session `session_id`
    /// refers to it; [`BlobError::NotFound`] otherwise.
    pub async fn in_session(
        &self,
        owner: &str,
        session_id: &str,
        id: &str,
    ) -> Result<BlobMeta, BlobError> {
        if !valid_id(id) {
            return Err(BlobError::NotFound);
        }
        self.store
            .head(&session_marker(owner, session_id, id))
            .await?;
        self.meta(owner, id).await
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

    /// The bytes of `owner`'s blob `id` from `offset` on, streamed.
    pub async fn get_from(
        &self,
        owner: &str,
        id: &str,
        offset: u64,
    ) -> Result<BlobStream, BlobError> {
        if offset == 0 {
            return self.get(owner, id).await;
        }
        if !valid_id(id) {
            return Err(BlobError::NotFound);
        }
        let path = blob_path(owner, id);
        let size = self.store.head(&path).await?.size;
        if offset >= size {
            return Ok(futures::stream::empty().boxed());
        }
        let options = object_store::GetOptions {
            range: Some(object_store::GetRange::Offset(offset)),
            ..object_store::GetOptions::default()
        };
        let got = self.store.get_opts(&path, options).await?;
        Ok(got
            .into_stream()
            .map(|c| c.map_err(BlobError::from))
            .boxed())
    }

    /// All the bytes of `owner`'s blob `id` (for a model request: the
    /// caller bounds what it reads this way).
    pub async fn read(&self, owner: &str, id: &str) -> Result<Bytes, BlobError> {
        if !valid_id(id) {
            return Err(BlobError::NotFound);
        }
        Ok(self.store.get(&blob_path(owner, id)).await?.bytes().await?)
    }

    /// The blobs session `session_id` of `owner` refers to, in id order:
    /// at most `limit` after `after` (an id; "" for the first page).
    pub async fn session_blobs(
        &self,
        owner: &str,
        session_id: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<BlobMeta>, BlobError> {
        let dir = Path::from(format!(
            "{}/s/{}",
            owner_dir(owner),
            session_key(session_id)
        ));
        let mut ids: Vec<String> = self
            .list(&dir)
            .await?
            .into_iter()
            .filter_map(|(marker, _)| marker.filename().map(str::to_owned))
            .filter(|id| valid_id(id) && id.as_str() > after)
            .collect();
        ids.truncate(limit);
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            match self.meta(owner, &id).await {
                Ok(meta) => out.push(meta),
                // Being deleted (with another session): not listed.
                Err(BlobError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Deletes what session `session_id` of `owner` left: its uploads in
    /// progress, its markers, and each of its blobs no other session refers
    /// to. The number of blobs deleted.
    pub async fn delete_session(&self, owner: &str, session_id: &str) -> Result<u64, BlobError> {
        let key = session_key(session_id);
        let dir = owner_dir(owner);
        for path in self.list(&Path::from(format!("{dir}/u/{key}"))).await? {
            delete_quietly(self.store.as_ref(), &path.0).await?;
        }
        let mut deleted = 0;
        for (marker, _) in self.list(&Path::from(format!("{dir}/s/{key}"))).await? {
            let Some(id) = marker.filename().map(str::to_owned) else {
                continue;
            };
            delete_quietly(self.store.as_ref(), &ref_marker(owner, &id, &key)).await?;
            let others = self.list(&Path::from(format!("{dir}/r/{id}"))).await?;
            if others.is_empty() {
                delete_quietly(self.store.as_ref(), &meta_path(owner, &id)).await?;
                delete_quietly(self.store.as_ref(), &blob_path(owner, &id)).await?;
                deleted += 1;
            }
            delete_quietly(self.store.as_ref(), &marker).await?;
        }
        Ok(deleted)
    }

    /// Bytes `owner` holds: blobs and uploads in progress (what the blob
    /// quota bounds).
    pub async fn usage(&self, owner: &str) -> Result<u64, BlobError> {
        let dir = owner_dir(owner);
        let mut total = 0u64;
        for sub in ["b", "u"] {
            let mut listed = self.store.list(Some(&Path::from(format!("{dir}/{sub}"))));
            while let Some(meta) = listed.next().await {
                total = total.saturating_add(meta?.size);
            }
        }
        Ok(total)
    }

    /// How many bytes of session `session_id`'s upload `upload_id` (of
    /// `owner`) are committed (0 for an upload not begun).
    pub async fn upload_offset(
        &self,
        owner: &str,
        session_id: &str,
        upload_id: &str,
    ) -> Result<u64, BlobError> {
        Ok(self
            .parts(owner, session_id, upload_id)
            .await?
            .iter()
            .map(|(_, size)| size)
            .sum())
    }

    /// Appends `bytes` at `offset` to the upload, which must be its
    /// committed offset; the new committed offset.
    pub async fn upload_append(
        &self,
        (owner, session_id, upload_id): (&str, &str, &str),
        offset: u64,
        bytes: Bytes,
    ) -> Result<u64, BlobError> {
        let committed = self.upload_offset(owner, session_id, upload_id).await?;
        if offset != committed {
            return Err(BlobError::Invalid(format!(
                "write_offset {offset} is not the committed offset {committed}: resume from there"
            )));
        }
        if bytes.is_empty() {
            return Ok(committed);
        }
        let len = bytes.len() as u64;
        let part = upload_dir(owner, session_id, upload_id).join(format!("{offset:020}"));
        self.store.put(&part, PutPayload::from(bytes)).await?;
        Ok(committed + len)
    }

    /// Ends the upload: its bytes, whose size and sha256 must be the
    /// target's, become a blob referred to by the session (its metadata);
    /// the parts are deleted. The parts are copied, never held in memory
    /// all at once.
    pub async fn upload_finish(
        &self,
        (owner, session_id, upload_id): (&str, &str, &str),
        target: &UploadTarget,
    ) -> Result<BlobMeta, BlobError> {
        if !valid_id(&target.sha256) {
            return Err(BlobError::Invalid(
                "sha256 must be 64 lower-case hex digits".to_owned(),
            ));
        }
        let parts = self.parts(owner, session_id, upload_id).await?;
        let total: u64 = parts.iter().map(|(_, s)| s).sum();
        if total != target.size {
            return Err(BlobError::Invalid(format!(
                "the upload holds {total} bytes, not the {} announced",
                target.size
            )));
        }
        let id = target.sha256.clone();
        let was_linked = self.in_session(owner, session_id, &id).await.is_ok();
        self.link(owner, session_id, &id).await?;
        let copied = self.copy_parts(&parts, &blob_path(owner, &id), &id).await;
        if let Err(e) = copied {
            if !was_linked {
                let key = session_key(session_id);
                delete_quietly(self.store.as_ref(), &session_marker(owner, session_id, &id))
                    .await?;
                delete_quietly(self.store.as_ref(), &ref_marker(owner, &id, &key)).await?;
            }
            return Err(e);
        }
        let meta = self
            .meta_or(
                owner,
                BlobMeta {
                    id,
                    mime_type: target.mime_type.clone(),
                    name: target.name.clone(),
                    size: total,
                },
            )
            .await?;
        for (path, _) in parts {
            delete_quietly(self.store.as_ref(), &path).await?;
        }
        Ok(meta)
    }

    /// Writes `parts` in order to `to` by a multipart write, checking that
    /// their sha256 is `id`; nothing is written at `to` when it is not.
    async fn copy_parts(
        &self,
        parts: &[(Path, u64)],
        to: &Path,
        id: &str,
    ) -> Result<(), BlobError> {
        let upload = self.store.put_multipart(to).await?;
        let mut writer = object_store::WriteMultipart::new(upload);
        let mut hasher = Sha256::new();
        for (path, _) in parts {
            let chunk = match self.store.get(path).await {
                Ok(got) => got.bytes().await,
                Err(e) => Err(e),
            };
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(e) => {
                    let _ = writer.abort().await;
                    return Err(e.into());
                }
            };
            hasher.update(&chunk);
            if let Err(e) = writer.wait_for_capacity(2).await {
                let _ = writer.abort().await;
                return Err(e.into());
            }
            writer.put(chunk);
        }
        let got = hex(&hasher.finalize());
        if got != id {
            let _ = writer.abort().await;
            return Err(BlobError::Invalid(format!(
                "the upload's sha256 is {got}, not {id}"
            )));
        }
        writer.finish().await?;
        Ok(())
    }

    /// An upload's parts in offset order, with their sizes.
    async fn parts(
        &self,
        owner: &str,
        session_id: &str,
        upload_id: &str,
    ) -> Result<Vec<(Path, u64)>, BlobError> {
        if !valid_upload_id(upload_id) {
            return Err(BlobError::Invalid(
                "upload_id must be 1-64 characters of A-Z a-z 0-9 - _".to_owned(),
            ));
        }
        self.list(&upload_dir(owner, session_id, upload_id)).await
    }

    /// The objects under `dir`, sorted, with their sizes.
    async fn list(&self, dir: &Path) -> Result<Vec<(Path, u64)>, BlobError> {
        let mut listed = self.store.list(Some(dir));
        let mut found = Vec::new();
        while let Some(meta) = listed.next().await {
            let meta = meta?;
            found.push((meta.location, meta.size));
        }
        found.sort_by(|a, b| a.0.as_ref().cmp(b.0.as_ref()));
        Ok(found)
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
        assert!(Blobs::open("", dir.path(), &|_| None).is_ok());
        assert!(dir.path().join("blobs").is_dir());
        let other = dir.path().join("elsewhere");
        assert!(
            Blobs::open(&format!("file://{}", other.display()), dir.path(), &|_| {
                None
            })
            .is_ok()
        );
        assert!(other.is_dir());
        // An S3-compatible store takes its settings from the environment
        // given (nothing is contacted until the first call).
        let env = |name: &str| match name {
            "AWS_ENDPOINT" => Some("http://127.0.0.1:9".to_owned()),
            "AWS_ALLOW_HTTP" => Some("true".to_owned()),
            "AWS_REGION" => Some("us-east-1".to_owned()),
            "AWS_ACCESS_KEY_ID" | "AWS_SECRET_ACCESS_KEY" => Some("test".to_owned()),
            _ => None,
        };
        assert!(Blobs::open("s3://bucket/some/prefix", dir.path(), &env).is_ok());
        for bad in ["ftp://x", "s3://", "/tmp/x"] {
            assert!(
                matches!(
                    Blobs::open(bad, dir.path(), &|_| None),
                    Err(BlobError::Invalid(_))
                ),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn blobs_are_content_addressed_per_owner_and_scoped_to_sessions() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::local(dir.path()).unwrap();
        let bytes = Bytes::from_static(b"%PDF-1.7");
        let first = blobs
            .put_with("alice", "s1", bytes.clone(), "application/pdf", "a.pdf")
            .await
            .unwrap();
        assert_eq!(first.id, digest(b"%PDF-1.7"));
        assert_eq!((first.size, first.name.as_str()), (8, "a.pdf"));
        // The same bytes again (another session of hers): one blob, the
        // first writer's metadata.
        let again = blobs
            .put_with("alice", "s2", bytes, "application/octet-stream", "b.bin")
            .await
            .unwrap();
        assert_eq!(again, first);
        assert_eq!(read(&blobs, "alice", &first.id).await.unwrap(), b"%PDF-1.7");
        assert_eq!(blobs.usage("alice").await.unwrap(), 8);
        assert!(blobs.in_session("alice", "s1", &first.id).await.is_ok());
        assert!(matches!(
            blobs.in_session("alice", "s3", &first.id).await,
            Err(BlobError::NotFound)
        ));
        // Another owner does not see it, even knowing the digest.
        assert!(matches!(
            read(&blobs, "bob", &first.id).await,
            Err(BlobError::NotFound)
        ));
        assert!(matches!(
            blobs.in_session("bob", "s1", &first.id).await,
            Err(BlobError::NotFound)
        ));
        assert!(matches!(
            blobs.get("alice", "../x").await,
            Err(BlobError::NotFound)
        ));
        // Deleting one session keeps the blob the other refers to; deleting
        // the last one deletes it.
        assert_eq!(blobs.delete_session("alice", "s1").await.unwrap(), 0);
        assert!(blobs.in_session("alice", "s2", &first.id).await.is_ok());
        assert_eq!(blobs.delete_session("alice", "s2").await.unwrap(), 1);
        assert!(matches!(
            read(&blobs, "alice", &first.id).await,
            Err(BlobError::NotFound)
        ));
        assert_eq!(blobs.usage("alice").await.unwrap(), 0);
    }

    #[tokio::test]
    async fn an_upload_resumes_from_its_committed_offset_and_checks_its_digest() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let blobs = Blobs::local(dir.path()).unwrap();
        let up = ("alice", "s1", "up-1");
        assert_eq!(blobs.upload_offset("alice", "s1", "up-1").await.unwrap(), 0);
        let half = Bytes::copy_from_slice(&data[..60_000]);
        assert_eq!(blobs.upload_append(up, 0, half).await.unwrap(), 60_000);
        // A new process (another replica on a shared store) sees the same
        // committed offset; a write elsewhere is refused.
        let blobs = Blobs::local(dir.path()).unwrap();
        assert_eq!(
            blobs.upload_offset("alice", "s1", "up-1").await.unwrap(),
            60_000
        );
        assert_eq!(blobs.usage("alice").await.unwrap(), 60_000);
        let wrong = blobs.upload_append(up, 0, Bytes::from_static(b"x")).await;
        assert!(matches!(wrong, Err(BlobError::Invalid(_))), "{wrong:?}");
        assert_eq!(blobs.upload_offset("bob", "s1", "up-1").await.unwrap(), 0);
        assert_eq!(blobs.upload_offset("alice", "s2", "up-1").await.unwrap(), 0);
        let rest = Bytes::copy_from_slice(&data[60_000..]);
        assert_eq!(
            blobs.upload_append(up, 60_000, rest).await.unwrap(),
            100_000
        );
        let target = |sha256: String| UploadTarget {
            size: 100_000,
            sha256,
            mime_type: "application/pdf".to_owned(),
            name: "big.pdf".to_owned(),
        };
        let bad = blobs.upload_finish(up, &target(digest(b"other"))).await;
        assert!(matches!(bad, Err(BlobError::Invalid(_))), "{bad:?}");
        assert!(matches!(
            blobs.in_session("alice", "s1", &digest(b"other")).await,
            Err(BlobError::NotFound)
        ));
        let meta = blobs
            .upload_finish(up, &target(digest(&data)))
            .await
            .unwrap();
        assert_eq!((meta.size, meta.name.as_str()), (100_000, "big.pdf"));
        assert_eq!(read(&blobs, "alice", &meta.id).await.unwrap(), data);
        assert!(blobs.in_session("alice", "s1", &meta.id).await.is_ok());
        assert_eq!(blobs.upload_offset("alice", "s1", "up-1").await.unwrap(), 0);
        assert!(matches!(
            blobs.upload_offset("alice", "s1", "../up").await,
            Err(BlobError::Invalid(_))
        ));
        // An abandoned upload goes with its session.
        let other = ("alice", "s1", "up-2");
        blobs
            .upload_append(other, 0, Bytes::from_static(b"abc"))
            .await
            .unwrap();
        blobs.delete_session("alice", "s1").await.unwrap();
        assert_eq!(blobs.usage("alice").await.unwrap(), 0);
    }
}
