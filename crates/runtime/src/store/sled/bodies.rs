//! Message bodies kept outside sled's trees, one file each, read on demand.
//!
//! # Why
//!
//! sled 0.34.7 writes a log item larger than a quarter of its 512 KiB
//! segment as a separate blob, and its page cache then counts that page by
//! the size of the blob's *pointer* on the log (a few bytes), not by what it
//! holds in memory. Pages of large values are therefore never evicted: every
//! large message written or read stayed resident for the life of the
//! process, whatever `cache_capacity` said (RELIABILITY.md, "Memory on the
//! embedded store"). A record of at most [`INLINE_MAX`] bytes keeps a full
//! leaf (sled splits above 16 entries) well under that size, so every page
//! is counted and the cache bound holds; a larger message keeps its body
//! here and only a small reference in sled.
//!
//! # Layout and durability
//!
//! `<store>/bodies/<first 2 hex>/<32 hex>`: a random name. A file is
//! [`MAGIC`], the length (u32 BE) and bytes of its *reference key*, then the
//! body: the message without its seq, as a version-1 record. The reference
//! key is a sled key of the `messages` tree written in the same transaction
//! as the message record that points at the file, so it exists exactly when
//! the file is in use.
//!
//! A file and its directory are synced before that transaction runs, so a
//! durable message never points at a missing file. A file whose reference
//! key is absent (a crash between the file and its transaction, or in a
//! delete, or a transaction that failed) is an orphan, removed at open. A
//! missing, short or altered file is [`StoreError::Corrupt`].

use std::fs::{self, File};
use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{MESSAGES, decode, printable};
use crate::store::StoreError;
use crate::store::record::{RECORD_VERSION, encode};
use crate::types::{Message, NewMessage};

/// The largest message record kept inside sled; larger bodies go to files.
pub(super) const INLINE_MAX: usize = 4 << 10;

/// The version byte of a message record whose body is in a file.
pub(super) const EXTERNAL_VERSION: u8 = 2;

/// The first bytes of every body file.
const MAGIC: &[u8; 4] = b"AGB1";

/// The directory under the store's.
const DIR: &str = "bodies";

/// Characters of a file name (a random 128-bit value in hex).
const NAME_LEN: usize = 32;

/// The body files of one store.
#[derive(Debug, Clone)]
pub(super) struct Bodies {
    dir: PathBuf,
}

/// What a message record holds in place of its body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct External {
    seq: u64,
    #[serde(default)]
    compacted: bool,
    /// The file's name.
    file: String,
    /// Bytes of the body in the file.
    len: u64,
    /// CRC-32 of those bytes.
    crc32: u32,
}

/// A body written to its file for a message about to be stored. Dropped
/// before [`Pending::keep`] (the transaction failed), it removes the file.
#[derive(Debug)]
pub(super) struct Pending {
    path: PathBuf,
    name: String,
    len: u64,
    crc32: u32,
    kept: bool,
}

impl Pending {
    /// The name the reference key ends with.
    pub(super) fn name(&self) -> &[u8] {
        self.name.as_bytes()
    }

    /// The message record for `seq`, pointing at this file.
    pub(super) fn record(&self, seq: u64) -> Result<Vec<u8>, StoreError> {
        let external = External {
            seq,
            compacted: false,
            file: self.name.clone(),
            len: self.len,
            crc32: self.crc32,
        };
        let mut out = encode(&external)?;
        out[0] = EXTERNAL_VERSION;
        Ok(out)
    }

    /// The transaction that references the file committed: keep it.
    pub(super) fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.kept {
            remove_file(&self.path);
        }
    }
}

/// The message `new` ready for a transaction: its body inline (`None`), or
/// already in a file.
pub(super) type Outgoing<'a> = (&'a NewMessage, Option<Pending>);

impl Bodies {
    /// The body files of the store at `store` (created if need be), with
    /// orphans removed: `in_use` says whether a reference key exists.
    pub(super) fn open(
        store: &Path,
        in_use: impl Fn(&[u8]) -> Result<bool, StoreError>,
    ) -> Result<Self, StoreError> {
        let dir = store.join(DIR);
        let fail = |e: io::Error| StoreError::Backend(format!("{}: {e}", dir.display()));
        if !dir.is_dir() {
            fs::create_dir_all(&dir).map_err(fail)?;
            sync_dir(store).map_err(fail)?;
        }
        let bodies = Self { dir };
        let removed = bodies.remove_orphans(in_use)?;
        if removed > 0 {
            tracing::info!(removed, "removed message body files no message refers to");
        }
        Ok(bodies)
    }

    /// Writes `body` (a version-1 record) to a new file whose reference key
    /// is `key_prefix` followed by the file's name, and syncs it.
    pub(super) fn write(&self, key_prefix: &[u8], body: &[u8]) -> Result<Pending, StoreError> {
        let name = uuid::Uuid::new_v4().simple().to_string();
        let key = [key_prefix, name.as_bytes()].concat();
        let fan = self.dir.join(&name[..2]);
        let path = fan.join(&name);
        let fail = |e: io::Error| {
            let what = format!("writing a message body to {}: {e}", path.display());
            // The file is removed and nothing refers to it: nothing stored.
            if super::disk::is_full(&e) {
                StoreError::DiskFull(what)
            } else {
                StoreError::Backend(what)
            }
        };
        if !fan.is_dir() {
            fs::create_dir_all(&fan).map_err(fail)?;
            sync_dir(&self.dir).map_err(fail)?;
        }
        let key_len =
            u32::try_from(key.len()).map_err(|_| fail(io::ErrorKind::InvalidInput.into()))?;
        let pending = Pending {
            path: path.clone(),
            name,
            len: body.len() as u64,
            crc32: crc32fast::hash(body),
            kept: false,
        };
        // From here on, a failure drops `pending`, which removes the file.
        let mut file = File::options()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(fail)?;
        let header = [MAGIC.as_slice(), &key_len.to_be_bytes(), &key].concat();
        file.write_all(&header).map_err(fail)?;
        file.write_all(body).map_err(fail)?;
        file.sync_all().map_err(fail)?;
        sync_dir(&fan).map_err(fail)?;
        Ok(pending)
    }

    /// Decodes a stored message record: inline, or read from its file.
    /// `key` is the record's key, `reference` the key its file must name.
    pub(super) fn load(
        &self,
        key: &[u8],
        raw: &[u8],
        reference: impl FnOnce(&str) -> Vec<u8>,
    ) -> Result<Message, StoreError> {
        if raw.first() != Some(&EXTERNAL_VERSION) {
            return decode(MESSAGES, key, raw);
        }
        let mut record = raw.to_vec();
        record[0] = RECORD_VERSION;
        let external: External = decode(MESSAGES, key, &record)?;
        let corrupt = |reason: String| StoreError::Corrupt {
            key: printable(MESSAGES, key),
            reason,
        };
        if !is_name(&external.file) {
            return Err(corrupt(format!("bad body file name {:?}", external.file)));
        }
        let shown = format!("{DIR}/{}/{}", &external.file[..2], external.file);
        let body = self
            .read(&external, &reference(&external.file))
            .map_err(|why| corrupt(format!("body file {shown}: {why}")))?;
        let new: NewMessage = decode(MESSAGES, key, &body)?;
        Ok(Message {
            seq: external.seq,
            body: new,
            compacted: external.compacted,
        })
    }

    /// The body in `external`'s file, checked against its header and the
    /// record.
    fn read(&self, external: &External, reference: &[u8]) -> Result<Vec<u8>, String> {
        let path = self.path(&external.file);
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err("missing".to_owned()),
            Err(e) => return Err(e.to_string()),
        };
        match read_header(&mut file).map_err(|e| e.to_string())? {
            None => return Err("cut short in its header".to_owned()),
            Some(key) if key != reference => return Err("it belongs to another message".to_owned()),
            Some(_) => {}
        }
        let mut body = Vec::new();
        // One byte more than expected shows a longer file.
        (&mut file)
            .take(external.len.saturating_add(1))
            .read_to_end(&mut body)
            .map_err(|e| e.to_string())?;
        if body.len() as u64 != external.len {
            return Err(format!("{} bytes, expected {}", body.len(), external.len));
        }
        if crc32fast::hash(&body) != external.crc32 {
            return Err("checksum mismatch".to_owned());
        }
        Ok(body)
    }

    /// Removes the files of the reference keys among `keys` (keys of the
    /// messages tree under `prefix`, already deleted). Best effort: a file
    /// left behind is an orphan, removed at the next open.
    pub(super) fn forget(&self, prefix: &[u8], keys: &[sled::IVec]) {
        for key in keys {
            let Some(name) = key.strip_prefix(prefix).and_then(|rest| rest.get(8..)) else {
                continue;
            };
            if let Ok(name) = std::str::from_utf8(name)
                && is_name(name)
            {
                remove_file(&self.path(name));
            }
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(&name[..2]).join(name)
    }

    /// Removes every file whose reference key is absent (or that has no
    /// complete header: it was never referenced). Returns how many.
    fn remove_orphans(
        &self,
        in_use: impl Fn(&[u8]) -> Result<bool, StoreError>,
    ) -> Result<usize, StoreError> {
        let fail = |e: io::Error| StoreError::Backend(format!("{}: {e}", self.dir.display()));
        let mut removed = 0;
        for fan in fs::read_dir(&self.dir).map_err(fail)? {
            let fan = fan.map_err(fail)?;
            if !fan.file_type().map_err(fail)?.is_dir() {
                continue;
            }
            for entry in fs::read_dir(fan.path()).map_err(fail)? {
                let entry = entry.map_err(fail)?;
                if !entry.file_name().to_str().is_some_and(is_name) {
                    continue;
                }
                let header = File::open(entry.path()).and_then(|mut f| read_header(&mut f));
                let used = match header {
                    Ok(Some(key)) => in_use(&key)?,
                    Ok(None) => false,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(fail(e)),
                };
                if !used {
                    fs::remove_file(entry.path()).map_err(fail)?;
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }
}

/// Whether a message record is larger than [`INLINE_MAX`] and its body
/// should go to a file: returns the body's record if so.
pub(super) fn external_body(new: &NewMessage) -> Result<Option<Vec<u8>>, StoreError> {
    let body = encode(new)?;
    Ok((body.len() > INLINE_MAX).then_some(body))
}

/// The reference key in a file's header; `None` when the header is cut
/// short (a crash while it was written).
fn read_header(file: &mut File) -> io::Result<Option<Vec<u8>>> {
    let mut fixed = [0; 8];
    if !read_full(file, &mut fixed)? || fixed[..4] != MAGIC[..] {
        return Ok(None);
    }
    let len = u32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]);
    // Reference keys are message keys: far below this.
    if len > 64 << 10 {
        return Ok(None);
    }
    let mut key = vec![0; len as usize];
    Ok(read_full(file, &mut key)?.then_some(key))
}

/// Fills `buf`; false when the file ends first.
fn read_full(file: &mut File, buf: &mut [u8]) -> io::Result<bool> {
    match file.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

fn is_name(name: &str) -> bool {
    name.len() == NAME_LEN && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn remove_file(path: &Path) {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "removing a message body file")
        }
    }
}

/// Makes the entries of `dir` durable.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::super::SledStore;
    use super::*;
    use crate::store::Store;
    use crate::store::testing::{self, text_message};
    use crate::types::Role;

    fn open(dir: &Path) -> SledStore {
        SledStore::open(dir.join("db")).expect("open")
    }

    /// Every body file of the store under `dir`.
    fn files(dir: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for fan in fs::read_dir(dir.join("db").join(DIR)).expect("bodies dir") {
            for file in fs::read_dir(fan.expect("entry").path()).expect("fan dir") {
                out.push(file.expect("entry").path());
            }
        }
        out.sort();
        out
    }

    /// A session with a small, a large and a small message; the large
    /// message's text.
    async fn seed(store: &SledStore) -> (String, String) {
        let id = testing::seed_history(store, 1).await;
        let large = "x".repeat(INLINE_MAX * 3);
        for text in [large.as_str(), "small"] {
            let incarnation = testing::incarnation(store, &id).await;
            store
                .append_message(&id, &incarnation, text_message("t", Role::User, text))
                .await
                .expect("append");
        }
        (id, large)
    }

    fn text_of(message: &Message) -> String {
        crate::types::flatten_text(&message.body.content)
    }

    #[tokio::test]
    async fn a_large_body_lives_in_a_file_and_reads_back_after_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let (id, large) = seed(&store).await;
        assert_eq!(files(dir.path()).len(), 1);
        let raw = store
            .messages
            .get(super::super::keys::message_key(&id, 2))
            .expect("get")
            .expect("record");
        assert_eq!(raw[0], EXTERNAL_VERSION);
        assert!(raw.len() < 256, "the record in sled is {} bytes", raw.len());
        drop(store);

        let store = open(dir.path());
        let history = store.history(&id, 0, 10, true).await.expect("history");
        let seqs: Vec<u64> = history.iter().map(|m| m.seq).collect();
        assert_eq!(seqs, [1, 2, 3]);
        assert_eq!(text_of(&history[1]), large);
        assert_eq!(text_of(&history[2]), "small");
        assert_eq!(files(dir.path()).len(), 1, "a referenced file stays");
    }

    #[tokio::test]
    async fn a_missing_short_or_altered_file_is_corrupt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let (id, _) = seed(&store).await;
        let path = files(dir.path()).remove(0);
        let intact = fs::read(&path).expect("read");
        let mut altered = intact.clone();
        *altered.last_mut().expect("not empty") ^= 1;
        let longer = [intact.as_slice(), b"!"].concat();
        let mut foreign = intact.clone();
        // The reference key's last byte (the file name's last hex digit).
        let key_len = u32::from_be_bytes([intact[4], intact[5], intact[6], intact[7]]);
        foreign[8 + key_len as usize - 1] ^= 1;
        for (contents, reason) in [
            (None, "missing"),
            (
                Some(intact[..intact.len() - 10].to_vec()),
                "bytes, expected",
            ),
            (Some(intact[..6].to_vec()), "cut short"),
            (Some(longer), "bytes, expected"),
            (Some(altered), "checksum mismatch"),
            (Some(foreign), "another message"),
        ] {
            match contents {
                None => fs::remove_file(&path).expect("remove"),
                Some(bytes) => fs::write(&path, bytes).expect("write"),
            }
            match store.history(&id, 0, 10, true).await {
                Err(StoreError::Corrupt { key, reason: got }) => {
                    assert!(got.contains(reason), "{got}");
                    assert!(key.starts_with("messages/"), "{key}");
                }
                other => panic!("expected Corrupt ({reason}), got {other:?}"),
            }
            // The messages before it are still readable.
            assert_eq!(
                store.history(&id, 0, 1, true).await.expect("first").len(),
                1
            );
        }
        fs::write(&path, &intact).expect("write");
        assert_eq!(
            store
                .history(&id, 0, 10, true)
                .await
                .expect("history")
                .len(),
            3
        );
    }

    #[tokio::test]
    async fn orphans_are_removed_at_open_and_a_failed_write_leaves_no_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let (id, large) = seed(&store).await;
        let kept = files(dir.path());
        // A body written but never referenced (a crash before its
        // transaction), and a file cut short in its header.
        store
            .bodies
            .write(&super::super::keys::body_key_prefix(&id), b"\x01{}")
            .expect("write")
            .keep();
        let cut = store.bodies.write(b"k", b"").expect("write");
        let cut_path = cut.path.clone();
        cut.keep();
        fs::write(&cut_path, b"AGB1\0\0").expect("cut short");
        assert_eq!(files(dir.path()).len(), 3);
        // A transaction that fails removes its file.
        let refused = store
            .append_message(
                &id,
                "not-the-incarnation",
                text_message("t", Role::User, &large),
            )
            .await;
        assert!(
            matches!(refused, Err(StoreError::SessionNotFound)),
            "{refused:?}"
        );
        assert_eq!(files(dir.path()).len(), 3);
        drop(store);

        let store = open(dir.path());
        assert_eq!(files(dir.path()), kept);
        assert_eq!(
            store
                .history(&id, 0, 10, true)
                .await
                .expect("history")
                .len(),
            3
        );
    }

    #[tokio::test]
    async fn deleting_the_session_removes_its_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let (doomed, _) = seed(&store).await;
        let (other, large) = seed(&store).await;
        assert_eq!(files(dir.path()).len(), 2);
        assert!(store.delete_session(&doomed, None).await.expect("delete"));
        assert_eq!(files(dir.path()).len(), 1);
        let history = store.history(&other, 0, 10, true).await.expect("history");
        assert_eq!(text_of(&history[1]), large);
    }
}
