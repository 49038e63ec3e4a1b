//! A session's tool workspace: the working directory of its session-scoped
//! tool servers, the files they reported in it, and what becomes of those
//! files when the workspace closes ([`WorkspaceExporter`]).
//!
//! A tool *reports* a file by returning an MCP `resource_link` whose URI is
//! `file://` + a path inside the workspace. Only reported files leave the
//! workspace: at close they are read — bounded per file, in total and in
//! time ([`ExportLimits`]) — and handed to the exporter (the server's
//! [`BlobExporter`] stores them as blobs of the session's owner); then the
//! directory is removed. A path outside the workspace (`..`, a symbolic
//! link that leads out) is never read.

use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::io::AsyncReadExt as _;

use crate::blobs::Blobs;

/// A file a session's tools reported, on its way out of the workspace.
#[derive(Clone, PartialEq, Eq)]
pub struct WorkspaceFile {
    /// Its name: the resource link's name, else the file name.
    pub name: String,
    /// Its mime type: the resource link's, else guessed from the name.
    pub mime_type: String,
    /// Its content.
    pub bytes: Bytes,
}

impl fmt::Debug for WorkspaceFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkspaceFile")
            .field("name", &self.name)
            .field("mime_type", &self.mime_type)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

/// Keeps the files a session's tools reported when their workspace
/// closes. Called once per closing workspace that reported any, within
/// [`ExportLimits::timeout`] (dropped when it takes longer).
#[async_trait]
pub trait WorkspaceExporter: Send + Sync + fmt::Debug {
    /// Keeps `files` of `owner`'s session `session_id` (the session's
    /// stored key). Failures are the exporter's to log.
    async fn export(&self, owner: &str, session_id: &str, files: Vec<WorkspaceFile>);
}

/// The bounds of the export at close.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportLimits {
    /// Longest the export may take: reading the files and the exporter's
    /// call. Default 5 s.
    pub timeout: Duration,
    /// Largest file exported; larger ones are left out. Default 16 MiB.
    pub max_file_bytes: u64,
    /// Most bytes exported per workspace; files past it are left out.
    /// Default 64 MiB.
    pub max_total_bytes: u64,
    /// Most files a workspace remembers as reported; later reports are
    /// ignored. Default 64.
    pub max_files: usize,
}

impl Default for ExportLimits {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(5),
            max_file_bytes: 16 << 20,
            max_total_bytes: 64 << 20,
            max_files: 64,
        }
    }
}

/// A reported file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reported {
    path: PathBuf,
    name: String,
    mime_type: Option<String>,
}

/// One session's workspace (cheap to clone: shared).
#[derive(Clone)]
pub struct Workspace {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    /// `dir` with symbolic links resolved (what a tool's `getcwd` sees),
    /// once created.
    canonical: std::sync::OnceLock<PathBuf>,
    max_files: usize,
    reported: Mutex<Vec<Reported>>,
}

impl fmt::Debug for Workspace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workspace")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Workspace {
    /// A workspace in `dir` (an absolute path; created by
    /// [`Workspace::create`]) remembering at most `max_files` reports.
    pub fn new(dir: PathBuf, max_files: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                dir,
                canonical: std::sync::OnceLock::new(),
                max_files,
                reported: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Creates its directory (readable by the server's user only).
    pub async fn create(&self) -> std::io::Result<()> {
        let mut builder = tokio::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        builder.mode(0o700);
        builder.create(&self.inner.dir).await?;
        let canonical = tokio::fs::canonicalize(&self.inner.dir).await?;
        let _ = self.inner.canonical.set(canonical);
        Ok(())
    }

    /// Notes the file a tool reported with a resource link to `uri` (named
    /// `name`, of type `mime_type` when given). Anything but a `file://`
    /// URI of a path inside the workspace is ignored.
    pub fn report(&self, uri: &str, name: &str, mime_type: Option<&str>) {
        let inside = |p: &PathBuf| {
            p.starts_with(&self.inner.dir)
                || self.inner.canonical.get().is_some_and(|c| p.starts_with(c))
        };
        let Some(path) = file_path(uri).filter(inside) else {
            tracing::debug!(
                uri,
                "a reported resource outside the workspace is not exported"
            );
            return;
        };
        let mut reported = lock(&self.inner.reported);
        if reported.iter().any(|r| r.path == path) {
            return;
        }
        if reported.len() >= self.inner.max_files {
            tracing::warn!(
                max_files = self.inner.max_files,
                "a workspace reported more files than are exported; later ones are left out"
            );
            return;
        }
        reported.push(Reported {
            path,
            name: name.to_owned(),
            mime_type: mime_type.filter(|m| !m.is_empty()).map(str::to_owned),
        });
    }

    /// How many files were reported.
    pub fn reported(&self) -> usize {
        lock(&self.inner.reported).len()
    }

    /// Reads the reported files, within `limits` (except the timeout,
    /// which the caller applies): a file gone, not a regular file, outside
    /// the workspace once symbolic links are followed, or too large is
    /// left out.
    pub(crate) async fn collect(&self, limits: &ExportLimits) -> Vec<WorkspaceFile> {
        let reported = lock(&self.inner.reported).clone();
        let Ok(root) = tokio::fs::canonicalize(&self.inner.dir).await else {
            return Vec::new();
        };
        let mut files = Vec::new();
        let mut total = 0u64;
        for file in reported {
            let left = limits.max_total_bytes.saturating_sub(total);
            match read_inside(&root, &file.path, limits.max_file_bytes.min(left)).await {
                Ok(bytes) => {
                    total += bytes.len() as u64;
                    let name = if file.name.is_empty() {
                        file_name(&file.path)
                    } else {
                        file.name
                    };
                    let mime_type = file
                        .mime_type
                        .unwrap_or_else(|| guess_mime(&name).to_owned());
                    files.push(WorkspaceFile {
                        name,
                        mime_type,
                        bytes: Bytes::from(bytes),
                    });
                }
                Err(why) => {
                    tracing::warn!(path = %file.path.display(), why, "a reported file is not exported");
                }
            }
        }
        files
    }
}

/// Reads `path` when it is a regular file inside `root` (canonical) of at
/// most `max` bytes.
async fn read_inside(root: &Path, path: &Path, max: u64) -> Result<Vec<u8>, &'static str> {
    let real = tokio::fs::canonicalize(path)
        .await
        .map_err(|_| "it is gone")?;
    if !real.starts_with(root) {
        return Err("it leads out of the workspace");
    }
    let file = tokio::fs::File::open(&real)
        .await
        .map_err(|_| "it cannot be opened")?;
    let meta = file.metadata().await.map_err(|_| "it cannot be read")?;
    if !meta.is_file() {
        return Err("it is not a regular file");
    }
    if meta.len() > max {
        return Err("it is larger than the export allows");
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    // It may have grown since: never more than `max + 1` bytes.
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .await
        .map_err(|_| "it cannot be read")?;
    if bytes.len() as u64 > max {
        return Err("it is larger than the export allows");
    }
    Ok(bytes)
}

/// The absolute, normalised path of a `file://` URI (`file:///p` or
/// `file://localhost/p`, percent-decoded); `None` for anything else or a
/// path with `..`.
fn file_path(uri: &str) -> Option<PathBuf> {
    let rest = uri.strip_prefix("file://")?;
    let rest = rest.strip_prefix("localhost").unwrap_or(rest);
    if !rest.starts_with('/') {
        return None;
    }
    let decoded = percent_decode(rest.split(['?', '#']).next()?)?;
    let path = PathBuf::from(decoded);
    let mut clean = PathBuf::new();
    for part in path.components() {
        match part {
            Component::RootDir | Component::Normal(_) => clean.push(part),
            Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(clean)
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().filter(|s| !s.contains('\0'))
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The mime type of a file named `name`, by its extension.
fn guess_mime(name: &str) -> &'static str {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "html" | "htm" => "text/html",
        "json" => "application/json",
        "pdf" => "application/pdf",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "zip" => "application/zip",
        _ => "application/octet-stream",
    }
}

/// The [`WorkspaceExporter`] that stores each file as a blob of the
/// session ([`Blobs::put_with`], with its mime type and name): readable
/// with `GetBlob` by its sha256, deleted with the session.
#[derive(Debug, Clone)]
pub struct BlobExporter {
    blobs: Arc<Blobs>,
}

impl BlobExporter {
    /// Exports into `blobs`.
    pub fn new(blobs: Arc<Blobs>) -> Self {
        Self { blobs }
    }
}

#[async_trait]
impl WorkspaceExporter for BlobExporter {
    async fn export(&self, owner: &str, session_id: &str, files: Vec<WorkspaceFile>) {
        for file in files {
            let size = file.bytes.len();
            match self
                .blobs
                .put_with(owner, session_id, file.bytes, &file.mime_type, &file.name)
                .await
            {
                Ok(meta) => tracing::info!(
                    session_id, blob_id = %meta.id, name = %file.name, size,
                    "workspace file exported as a blob"
                ),
                Err(err) => tracing::warn!(
                    session_id, name = %file.name, error = %err,
                    "a workspace file could not be exported"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_file_uris_inside_the_workspace_are_reported() {
        let ws = Workspace::new(PathBuf::from("/w/s"), 2);
        ws.report("file:///w/s/out.txt", "out.txt", None);
        ws.report("file:///w/s/out.txt", "again", None);
        ws.report("file:///w/s/../t/secret", "x", None);
        ws.report("file:///w/other", "x", None);
        ws.report("https://example.invalid/w/s/x", "x", None);
        ws.report("file://host/w/s/x", "x", None);
        assert_eq!(ws.reported(), 1);
        ws.report("file://localhost/w/s/a%20b.csv", "", Some("text/csv"));
        ws.report("file:///w/s/third", "", None);
        assert_eq!(ws.reported(), 2, "at most max_files");
        assert_eq!(
            file_path("file:///w/s/./a%20b"),
            Some(PathBuf::from("/w/s/a b"))
        );
        assert_eq!(file_path("file:///w/%zz"), None);
        assert_eq!(file_path("file:///w/%00"), None);
    }

    #[tokio::test]
    async fn collecting_reads_reported_files_within_the_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        let ws = Workspace::new(root.clone(), 10);
        ws.create().await.unwrap();
        std::fs::write(root.join("a.txt"), b"hello").unwrap();
        std::fs::write(root.join("big.bin"), vec![0u8; 100]).unwrap();
        std::fs::write(dir.path().join("outside"), b"secret").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(dir.path().join("outside"), root.join("link")).unwrap();
        for name in ["a.txt", "big.bin", "link", "missing"] {
            ws.report(&format!("file://{}", root.join(name).display()), "", None);
        }
        let limits = ExportLimits {
            max_file_bytes: 50,
            ..ExportLimits::default()
        };
        let files = ws.collect(&limits).await;
        assert_eq!(files.len(), 1, "{files:?}");
        assert_eq!(files[0].name, "a.txt");
        assert_eq!(files[0].mime_type, "text/plain");
        assert_eq!(files[0].bytes, Bytes::from_static(b"hello"));
        let tight = ExportLimits {
            max_total_bytes: 3,
            ..ExportLimits::default()
        };
        assert!(ws.collect(&tight).await.is_empty());
    }
}
