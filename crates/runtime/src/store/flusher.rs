//! Group commit for [`SledStore`](super::SledStore): one thread flushes for
//! every waiter that queued while the previous flush ran.
//!
//! Each sled flush writes the log on sled's own threadpool, which wakes all
//! of its idle threads for every job (sled 0.34.7), and each flush on a
//! tokio blocking thread kept that thread (its stack, its allocator arena)
//! for the device write. With one flusher, N concurrent turns cost one
//! flush and one thread. A waiter's writes are applied before it queues,
//! and a flush starts only after it took the waiters queued so far, so it
//! covers all of them.

use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use sled::Db;
use tokio::sync::oneshot;

use super::StoreError;

type Waiter = oneshot::Sender<Result<(), String>>;

/// The handle to the flusher thread. When the last clone is dropped the
/// thread is told to stop and joined, so the database is closed (and its
/// lock released) by then.
#[derive(Debug, Clone)]
pub(super) struct Flusher {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    queue: Option<mpsc::Sender<Waiter>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            // At most the flush in progress, then the thread drops the Db.
            let _ = thread.join();
        }
    }
}

impl Flusher {
    /// Starts the flusher thread of `db`.
    pub(super) fn start(db: Db) -> Result<Self, StoreError> {
        let (queue, waiting) = mpsc::channel::<Waiter>();
        let thread = std::thread::Builder::new()
            .name("agentrt-flush".to_owned())
            .spawn(move || run(&db, &waiting))
            .map_err(|e| StoreError::Backend(format!("starting the flush thread: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                queue: Some(queue),
                thread: Some(thread),
            }),
        })
    }

    /// Returns once everything written before the call is durable.
    pub(super) async fn flush(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        let queued = self.inner.queue.as_ref().map(|q| q.send(tx));
        if !matches!(queued, Some(Ok(()))) {
            return Err(StoreError::Backend(
                "the flush thread has stopped".to_owned(),
            ));
        }
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(StoreError::Backend(format!("sled flush: {e}"))),
            Err(_) => Err(StoreError::Backend(
                "the flush thread stopped before flushing".to_owned(),
            )),
        }
    }
}

fn run(db: &Db, waiting: &mpsc::Receiver<Waiter>) {
    while let Ok(first) = waiting.recv() {
        let mut batch = vec![first];
        batch.extend(waiting.try_iter());
        let started = std::time::Instant::now();
        let result = db.flush().map(drop).map_err(|e| e.to_string());
        crate::telemetry::metrics::timed(
            &crate::telemetry::metrics::get().store_flush,
            started.elapsed(),
        );
        for waiter in batch {
            // A waiter that went away (its turn was dropped) needs no answer.
            let _ = waiter.send(result.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_flushes_all_return_and_dropping_closes_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        let flusher = Flusher::start(db).unwrap();
        let writers: Vec<_> = (0..64u32)
            .map(|i| {
                let (flusher, tree) = (flusher.clone(), tree.clone());
                tokio::spawn(async move {
                    tree.insert(i.to_be_bytes(), &b"v"[..]).unwrap();
                    flusher.flush().await
                })
            })
            .collect();
        for writer in writers {
            writer.await.unwrap().unwrap();
        }
        drop((flusher, tree));
        // The flusher thread was joined with the last handle: the database
        // is closed, so it opens again at once, with every write.
        let db = sled::Config::new().path(dir.path()).open().unwrap();
        assert_eq!(db.open_tree("t").unwrap().len(), 64);
    }
}
