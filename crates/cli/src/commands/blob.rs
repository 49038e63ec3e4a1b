//! The `blob` command and the media of `chat`: uploading files, saving
//! blobs.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use agentrt_client::{Client, proto};

use crate::args::BlobCommand;
use crate::failure::{Failure, Outcome};
use crate::output::Out;

/// The media type of a file, from its name, then from its first bytes.
pub(crate) fn guess_mime_type(path: &Path, bytes: &[u8]) -> &'static str {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("png") => return "image/png",
        Some("jpg" | "jpeg") => return "image/jpeg",
        Some("gif") => return "image/gif",
        Some("webp") => return "image/webp",
        Some("pdf") => return "application/pdf",
        Some("md" | "markdown") => return "text/markdown",
        Some("csv") => return "text/csv",
        Some("json") => return "application/json",
        Some("txt" | "log" | "text") => return "text/plain",
        _ => {}
    }
    if bytes.starts_with(b"\x89PNG") {
        "image/png"
    } else if bytes.starts_with(b"\xff\xd8\xff") {
        "image/jpeg"
    } else if bytes.starts_with(b"GIF8") {
        "image/gif"
    } else if bytes.starts_with(b"%PDF-") {
        "application/pdf"
    } else if std::str::from_utf8(bytes).is_ok() {
        "text/plain"
    } else {
        "application/octet-stream"
    }
}

/// Reads `path` and uploads it to `session`.
pub(crate) async fn upload(
    client: &Client,
    session: &str,
    path: &Path,
    mime_type: Option<&str>,
) -> Result<proto::BlobRef, Failure> {
    let bytes = std::fs::read(path)
        .map_err(|e| Failure::new(2, format!("cannot read {}: {e}", path.display())))?;
    let mime = mime_type.unwrap_or_else(|| guess_mime_type(path, &bytes));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    Ok(client.upload_blob(session, mime, name, &bytes).await?)
}

/// A file name for a blob saved in a directory: its own name without any
/// path (or its id), prefixed by the id's first 8 digits so two blobs of
/// one name do not overwrite each other.
fn file_name(blob: &proto::BlobRef) -> String {
    let own: String = blob
        .name
        .chars()
        .filter(|c| !c.is_control() && *c != '/' && *c != '\\')
        .collect();
    let own = own.trim_start_matches('.');
    let prefix = blob.blob_id.get(..8).unwrap_or(&blob.blob_id);
    if own.is_empty() {
        format!("{prefix}.{}", extension(&blob.mime_type))
    } else {
        format!("{prefix}-{own}")
    }
}

fn extension(mime_type: &str) -> &'static str {
    match mime_type {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "application/pdf" => "pdf",
        "application/json" => "json",
        "text/csv" => "csv",
        "text/markdown" => "md",
        m if m.starts_with("text/") => "txt",
        _ => "bin",
    }
}

/// Saves blob `blob` of `session` into `dir`; the path written.
pub(crate) async fn save_into(
    client: &Client,
    session: &str,
    blob: &proto::BlobRef,
    dir: &Path,
) -> Result<PathBuf, Failure> {
    let (_, bytes) = client.get_blob(session, &blob.blob_id).await?;
    std::fs::create_dir_all(dir)
        .map_err(|e| Failure::new(2, format!("cannot create {}: {e}", dir.display())))?;
    let path = dir.join(file_name(blob));
    std::fs::write(&path, bytes)
        .map_err(|e| Failure::new(2, format!("cannot write {}: {e}", path.display())))?;
    Ok(path)
}

pub(crate) async fn blob(client: &Client, out: &Out, cmd: BlobCommand) -> Outcome {
    match cmd {
        BlobCommand::Get {
            session,
            blob,
            out: path,
        } => {
            let (reference, bytes) = client.get_blob(&session, &blob).await?;
            if path.as_deref() == Some(Path::new("-")) {
                std::io::stdout()
                    .write_all(&bytes)
                    .and_then(|()| std::io::stdout().flush())
                    .map_err(|e| Failure::new(1, format!("cannot write to stdout: {e}")))?;
                return Ok(());
            }
            let path = path.unwrap_or_else(|| {
                let name = file_name(&reference);
                PathBuf::from(name)
            });
            std::fs::write(&path, &bytes)
                .map_err(|e| Failure::new(2, format!("cannot write {}: {e}", path.display())))?;
            out.blob_saved(&reference, &path);
            Ok(())
        }
        BlobCommand::List { session } => {
            let blobs = client.list_blobs(&session).await?;
            out.blobs(&blobs);
            Ok(())
        }
        BlobCommand::Put {
            session,
            file,
            mime_type,
        } => {
            let reference = upload(client, &session, &file, mime_type.as_deref()).await?;
            out.blob_uploaded(&reference);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_types_are_safe_guesses() {
        assert_eq!(guess_mime_type(Path::new("a.PNG"), b""), "image/png");
        assert_eq!(
            guess_mime_type(Path::new("x"), b"%PDF-1.7"),
            "application/pdf"
        );
        assert_eq!(guess_mime_type(Path::new("x"), b"hello"), "text/plain");
        assert_eq!(
            guess_mime_type(Path::new("x"), b"\xff\xfe\x00"),
            "application/octet-stream"
        );
        let blob = proto::BlobRef {
            blob_id: "0123456789abcdef".repeat(4),
            name: "../../etc/passwd".into(),
            mime_type: "text/plain".into(),
            ..Default::default()
        };
        assert_eq!(file_name(&blob), "01234567-etcpasswd");
        let unnamed = proto::BlobRef {
            name: String::new(),
            mime_type: "image/png".into(),
            ..blob
        };
        assert_eq!(file_name(&unnamed), "01234567.png");
    }
}
