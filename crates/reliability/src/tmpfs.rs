//! The disk battery's small filesystem: a size-limited tmpfs mounted for
//! the run ([`Tmpfs`], unmounted when dropped), its free space as `df`
//! reports it ([`avail`]), and the file that fills it ([`Filler`], removed
//! when dropped), so a failed or aborted run leaves neither a mount nor a
//! full disk behind.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// One MiB.
pub(crate) const MIB: u64 = 1 << 20;

/// A mounted tmpfs; dropping it unmounts it.
#[derive(Debug)]
pub(crate) struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size_mb` MiB on `dir` (created). Needs root
    /// (CAP_SYS_ADMIN): the error says so.
    pub(crate) fn mount(dir: &Path, size_mb: u64) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mb}m"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| {
                format!("the disk battery mounts a tmpfs and could not run `mount`: {e}")
            })?;
        if !out.status.success() {
            return Err(format!(
                "the disk battery needs CAP_SYS_ADMIN (root) to mount a {size_mb} MiB tmpfs on {}: \
                 mount said {:?}; run it as root, or leave it out with --only crash,races,abuse",
                dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // The server may still be exiting (kill_on_drop does not wait):
        // EBUSY for a moment. A lazy unmount detaches it regardless.
        for _ in 0..50 {
            let done = Command::new("umount")
                .arg(&self.dir)
                .output()
                .is_ok_and(|o| o.status.success());
            if done {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let lazy = Command::new("umount").arg("-l").arg(&self.dir).output();
        if !lazy.is_ok_and(|o| o.status.success()) {
            eprintln!(
                "agentrt-reliability: could not unmount {} (umount it by hand)",
                self.dir.display()
            );
        }
    }
}

/// Bytes available to an unprivileged writer on `path`'s filesystem
/// (`df --output=avail -B1`, which is statvfs's `f_bavail * f_frsize`).
pub(crate) fn avail(path: &Path) -> Result<u64, String> {
    let out = Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path)
        .output()
        .map_err(|e| format!("df {}: {e}", path.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| {
            format!(
                "df {}: unexpected output {text:?} {:?}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// A file that takes a filesystem's free space; dropping it removes it.
#[derive(Debug)]
pub(crate) struct Filler {
    path: PathBuf,
    file: File,
    /// Bytes written so far.
    pub(crate) bytes: u64,
}

const CHUNK: usize = 1 << 20;

impl Filler {
    /// Creates (or truncates) the file at `path`.
    pub(crate) fn create(path: &Path) -> Result<Self, String> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(path)
            .map_err(|e| format!("create {}: {e}", path.display()))?;
        Ok(Self {
            path: path.to_owned(),
            file,
            bytes: 0,
        })
    }

    /// Grows the file until at most `leave` bytes are free (a page or so
    /// below, as tmpfs counts whole pages). Data, not a hole: tmpfs
    /// allocates what is written.
    pub(crate) fn fill_leaving(&mut self, leave: u64) -> Result<(), String> {
        let dir = self.path.parent().unwrap_or(Path::new("/")).to_owned();
        let chunk = vec![0x5a_u8; CHUNK];
        loop {
            let free = avail(&dir)?;
            if free <= leave {
                return Ok(());
            }
            let n = (free - leave).min(CHUNK as u64) as usize;
            self.file
                .write_all(&chunk[..n])
                .map_err(|e| format!("fill {}: {e}", self.path.display()))?;
            self.bytes += n as u64;
        }
    }

    /// Grows the file until a write fails (ENOSPC): nothing is left.
    pub(crate) fn fill_completely(&mut self) {
        let chunk = vec![0x5a_u8; CHUNK];
        // write_all stops at the first error; a short write before it
        // took the last pages.
        for size in [CHUNK, 4096] {
            while self.file.write_all(&chunk[..size]).is_ok() {
                self.bytes += size as u64;
            }
        }
    }

    /// Keeps the filesystem full until the [`Keeper`] is stopped (or
    /// dropped): every 20 ms whatever was freed (a file the server removed)
    /// is taken again, on a blocking thread.
    pub(crate) fn keep_full(&mut self) -> Result<Keeper, String> {
        let mut file = self
            .file
            .try_clone()
            .map_err(|e| format!("clone {}: {e}", self.path.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = tokio::task::spawn_blocking(move || {
            let chunk = vec![0x5a_u8; 64 << 10];
            while !flag.load(Ordering::SeqCst) {
                while file.write_all(&chunk).is_ok() {}
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Ok(Keeper { stop, thread })
    }
}

/// The thread of [`Filler::keep_full`]; dropping it tells the thread to
/// stop, [`Keeper::stop`] also waits for it (and its copy of the file's
/// descriptor, which holds the space).
#[derive(Debug)]
pub(crate) struct Keeper {
    stop: Arc<AtomicBool>,
    thread: tokio::task::JoinHandle<()>,
}

impl Keeper {
    pub(crate) async fn stop(mut self) -> Result<(), String> {
        self.stop.store(true, Ordering::SeqCst);
        (&mut self.thread)
            .await
            .map_err(|e| format!("the filler's keeper: {e}"))
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        // The space returns when the file's last descriptor closes: this
        // one, right after (and keep_full's clone, joined before).
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("agentrt-reliability: remove {}: {e}", self.path.display());
        }
    }
}
