//! The sled store's room on disk: a reserve of free space it keeps, and
//! the one failure it cannot come back from.
//!
//! sled 0.34.7 records the first I/O error of a log write as a global
//! error and refuses every later operation until the database is opened
//! again — a full disk, once met, needs a restart even after space
//! returns. So the store does not wait for `ENOSPC`: it reads the free
//! space of the data directory's filesystem (statvfs) before it writes —
//! a reading that showed room is trusted for [`ROOM_FRESH`], so a burst of
//! writes does not make a system call each — and
//!
//! - refuses *new* work — a session, a turn, an import, a session update —
//!   while less than the reserve is free ([`Disk::admit`]);
//! - refuses the writes of turns already running — an answer, a tool
//!   result — only below a quarter of it ([`Disk::running`]), so turns
//!   admitted just before the line still finish, and a turn's record
//!   (small) is always written;
//!
//! each refusal is [`StoreError::DiskFull`] with nothing written, and the
//! store takes writes again as soon as space is back. If the disk fills
//! anyway (another process, a reserve of 0) and sled fails a write, the
//! store is *failed* ([`Disk::fail`]): every later call says so, and
//! [`Disk::admit`] — what the readiness ping asks — reports it, so the server stops
//! claiming liveness and is restarted.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::store::StoreError;

/// The reserve of [`super::SledStore::open`]: 128 MiB.
pub(crate) const DEFAULT_MIN_FREE_BYTES: u64 = 128 << 20;

/// How long a reading of free space that showed room is trusted. What a
/// store can write in that time is far below any useful reserve; a reading
/// without room is never reused, so writes resume as soon as space is back.
pub(super) const ROOM_FRESH: Duration = Duration::from_millis(50);

/// Free space and the failed state of one sled store.
#[derive(Debug)]
pub(super) struct Disk {
    path: PathBuf,
    min_free: u64,
    /// The last reading of free space, in bytes, and when it was taken;
    /// only readings at or above the reserve are kept.
    room: Mutex<Option<(Instant, u64)>>,
    /// Set once, by the first write sled failed: why.
    failed: OnceLock<String>,
}

impl Disk {
    pub(super) fn new(path: PathBuf, min_free: u64) -> Self {
        Self {
            path,
            min_free,
            room: Mutex::new(None),
            failed: OnceLock::new(),
        }
    }

    /// `Ok` when new work may be written: the store has not failed and at
    /// least the reserve is free.
    pub(super) fn admit(&self) -> Result<(), StoreError> {
        self.has(self.min_free, "new sessions and turns are refused")
    }

    /// `Ok` when a running turn's write may go ahead: a quarter of the
    /// reserve is still free.
    pub(super) fn running(&self) -> Result<(), StoreError> {
        self.has(self.min_free / 4, "the turn's output was not stored")
    }

    /// Records that sled failed a write: from now on every call is
    /// refused (see the module docs). `err` becomes [`StoreError::Failed`]:
    /// sled may have written part of its log, so the write may be there
    /// after a restart.
    pub(super) fn fail(&self, err: StoreError) -> StoreError {
        let why = err.to_string();
        if self.failed.set(why.clone()).is_ok() {
            tracing::error!(
                error = %err,
                "the sled store failed a write and refuses every write until the server restarts \
                 (free space on its disk first)"
            );
        }
        StoreError::Failed(why)
    }

    fn has(&self, needed: u64, refused: &str) -> Result<(), StoreError> {
        if let Some(why) = self.failed.get() {
            return Err(StoreError::Failed(why.clone()));
        }
        if needed == 0 {
            return Ok(());
        }
        // A poisoned lock only means a panic elsewhere held it: the reading
        // inside is still a reading.
        if let Some((at, free)) = *self.room.lock().unwrap_or_else(|p| p.into_inner())
            && free >= needed
            && at.elapsed() < ROOM_FRESH
        {
            return Ok(());
        }
        match fs2::available_space(&self.path) {
            Ok(free) if free >= needed => {
                if free >= self.min_free {
                    *self.room.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some((Instant::now(), free));
                }
                Ok(())
            }
            Ok(free) => Err(StoreError::DiskFull(format!(
                "{} MiB free on the data directory's filesystem, under the {} MiB the store keeps \
                 in reserve (store_min_free_mb); {refused}",
                free >> 20,
                self.min_free >> 20,
            ))),
            // Not knowing is not a reason to refuse: the write itself will
            // tell.
            Err(e) => {
                tracing::debug!(error = %e, path = %self.path.display(), "statvfs failed");
                Ok(())
            }
        }
    }
}

/// Whether `e` is the filesystem saying it has no room (ENOSPC, EDQUOT).
pub(super) fn is_full(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::StorageFull
        || e.kind() == std::io::ErrorKind::QuotaExceeded
        || matches!(e.raw_os_error(), Some(28 | 122))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_larger_than_any_disk_refuses_new_work_and_running_writes_by_their_own_lines() {
        let dir = tempfile::tempdir().unwrap();
        let free = fs2::available_space(dir.path()).unwrap();
        // A reserve of twice what is free: its quarter is half of it.
        let disk = Disk::new(dir.path().to_owned(), free.saturating_mul(2));
        let err = disk.admit().unwrap_err();
        assert!(matches!(err, StoreError::DiskFull(_)), "{err:?}");
        assert!(err.to_string().contains("store_min_free_mb"), "{err}");
        disk.running().unwrap();
        let none = Disk::new(dir.path().to_owned(), 0);
        none.admit().unwrap();
        none.running().unwrap();
    }

    #[test]
    fn a_failed_store_refuses_everything_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let disk = Disk::new(dir.path().to_owned(), 0);
        let err = disk.fail(StoreError::DiskFull("No space left on device".into()));
        assert!(matches!(err, StoreError::Failed(_)), "{err:?}");
        for refused in [disk.admit(), disk.running()] {
            let err = refused.unwrap_err();
            assert!(matches!(err, StoreError::Failed(_)), "{err:?}");
            assert!(err.to_string().contains("No space left"), "{err}");
        }
    }

    #[tokio::test]
    async fn under_the_reserve_the_store_refuses_new_work_then_running_writes_and_stores_nothing() {
        use crate::store::Store;
        use crate::store::testing::{self, running_turn, text_message};
        use crate::types::Role;

        let dir = tempfile::tempdir().unwrap();
        let store = super::super::SledStore::open(dir.path().join("db"))
            .unwrap()
            .with_min_free(0);
        let id = testing::seed_history(&store, 1).await;
        let incarnation = testing::incarnation(&store, &id).await;
        let free = fs2::available_space(dir.path()).unwrap();
        // New work refused, running writes still go ahead.
        let tight = store.clone().with_min_free(free.saturating_mul(2));
        let full = |r: Result<_, StoreError>| matches!(r, Err(StoreError::DiskFull(_)));
        assert!(full(tight.ping().await));
        assert!(full(
            tight.create_session(Default::default()).await.map(drop)
        ));
        let turn = running_turn(&id, &incarnation, "t1");
        let user = text_message("t1", Role::User, "hello");
        assert!(full(
            tight.begin_turn(turn.clone(), user.clone()).await.map(drop)
        ));
        assert_eq!(store.history(&id, 0, 10, true).await.unwrap().len(), 1);
        assert_eq!(store.count_sessions().await.unwrap(), 1);
        store.begin_turn(turn.clone(), user).await.unwrap();
        let answer = text_message("t1", Role::Assistant, "part");
        tight
            .append_message(&id, &incarnation, answer.clone())
            .await
            .unwrap();
        // Under a quarter: running writes refused too, the record is not.
        let full_up = store.clone().with_min_free(free.saturating_mul(8));
        assert!(full(
            full_up
                .append_message(&id, &incarnation, answer.clone())
                .await
                .map(drop)
        ));
        let done = crate::types::TurnRecord {
            status: crate::types::TurnStatus::Error,
            ..turn
        };
        assert!(full(
            full_up
                .finish_turn_with(done.clone(), Some(answer))
                .await
                .map(drop)
        ));
        full_up.finish_turn(done).await.unwrap();
        let seqs: Vec<u64> = store
            .history(&id, 0, 10, true)
            .await
            .unwrap()
            .iter()
            .map(|m| m.seq)
            .collect();
        assert_eq!(seqs, [1, 2, 3]);
        store.ping().await.unwrap();
    }

    #[test]
    fn enospc_and_edquot_are_full_other_errors_are_not() {
        assert!(is_full(&std::io::Error::from_raw_os_error(28)));
        assert!(is_full(&std::io::Error::from_raw_os_error(122)));
        assert!(is_full(&std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            "x"
        )));
        assert!(!is_full(&std::io::Error::from_raw_os_error(5)));
    }
}
