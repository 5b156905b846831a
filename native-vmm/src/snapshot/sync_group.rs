//! Group commit of durable files: many writers' files made durable by one flush of their file
//! system (`syncfs`) instead of two flushes each (the file's fdatasync, then its folder's fsync).
//!
//! A writer calls `SyncGroup::sync` once its file is written and renamed into place; it returns
//! once a flush that *started after that call* has finished. Flushes never overlap: callers that
//! arrive while one runs wait for it to end, and then one of them runs the next flush for all
//! of them. So a lone writer pays one flush, and eight writers that finish together pay two at
//! most (the one already running, which may have started before them, and theirs).
//!
//! syncfs writes back and flushes everything on the file system, including what other
//! programs left dirty there: a data folder on a file system of its own keeps each flush to
//! the checkpoints' own bytes.

use std::io;
use std::sync::{Condvar, Mutex, MutexGuard};

/// What a flush does: `syncfs` on the data folder in the daemon; a test's own in unit tests.
pub type Flush = Box<dyn Fn() -> io::Result<()> + Send + Sync>;

pub struct SyncGroup {
    flush: Flush,
    state: Mutex<Flushes>,
    finished: Condvar,
}

#[derive(Default)]
struct Flushes {
    /// Flushes started so far; one is running while it is ahead of `finished`.
    started: u64,
    /// The latest flush that has finished.
    finished: u64,
    /// The latest flush that failed, and how (every caller it covered gets the error).
    failed: Option<(u64, io::ErrorKind, String)>,
}

impl SyncGroup {
    pub fn new(flush: Flush) -> SyncGroup {
        SyncGroup {
            flush,
            state: Mutex::new(Flushes::default()),
            finished: Condvar::new(),
        }
    }

    /// The group of a folder: its flush is `syncfs` on the folder's file system.
    pub fn of_folder(dir: &std::path::Path) -> io::Result<SyncGroup> {
        use std::os::fd::AsRawFd;
        let folder = std::fs::File::open(dir)?;
        Ok(SyncGroup::new(Box::new(move || {
            crate::sys::syncfs(folder.as_raw_fd())
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Flushes> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Returns once a flush that started after this call has finished: everything written
    /// before the call is then durable. Err if that flush (or one after it) failed.
    pub fn sync(&self) -> io::Result<()> {
        let mut state = self.lock();
        // A flush running now may have started before what the caller wrote: the next one counts.
        let needed = state.started + 1;
        while state.finished < needed {
            if state.started > state.finished {
                state = self
                    .finished
                    .wait(state)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                continue;
            }
            state.started += 1;
            let this = state.started;
            drop(state);
            let flushed = (self.flush)();
            state = self.lock();
            state.finished = this;
            if let Err(e) = flushed {
                state.failed = Some((this, e.kind(), e.to_string()));
            }
            self.finished.notify_all();
        }
        match &state.failed {
            Some((flush, kind, why)) if *flush >= needed => Err(io::Error::new(
                *kind,
                format!("flushing the file system: {why}"),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Barrier};
    use std::time::Duration;

    /// A flush that counts itself and records, per flush, the clock ticks at its start and end.
    fn recording_group(
        spans: Arc<Mutex<Vec<(u64, u64)>>>,
        clock: Arc<AtomicU64>,
        fail_flush: Option<usize>,
    ) -> SyncGroup {
        SyncGroup::new(Box::new(move || {
            let start = clock.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(2));
            let end = clock.fetch_add(1, Ordering::SeqCst);
            let mut spans = spans.lock().unwrap();
            spans.push((start, end));
            if fail_flush == Some(spans.len()) {
                return Err(io::Error::other("disk gone"));
            }
            Ok(())
        }))
    }

    #[test]
    fn every_caller_returns_after_a_flush_that_started_after_it_called_and_callers_share_flushes() {
        let (spans, clock) = (
            Arc::new(Mutex::new(Vec::new())),
            Arc::new(AtomicU64::new(0)),
        );
        let group = Arc::new(recording_group(spans.clone(), clock.clone(), None));
        let callers = 16;
        let barrier = Arc::new(Barrier::new(callers));
        let threads: Vec<_> = (0..callers)
            .map(|_| {
                let (group, clock, barrier) = (group.clone(), clock.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let called = clock.fetch_add(1, Ordering::SeqCst);
                    group.sync().unwrap();
                    (called, clock.fetch_add(1, Ordering::SeqCst))
                })
            })
            .collect();
        let calls: Vec<(u64, u64)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let spans = spans.lock().unwrap().clone();
        for (called, returned) in &calls {
            assert!(
                spans
                    .iter()
                    .any(|(start, end)| start > called && end < returned),
                "a caller at {called} returned at {returned} with no flush between: {spans:?}"
            );
        }
        assert!(
            spans.len() < callers,
            "{} flushes for {callers} callers arriving together",
            spans.len()
        );
        for pair in spans.windows(2) {
            assert!(pair[0].1 < pair[1].0, "flushes overlapped: {spans:?}");
        }
    }

    #[test]
    fn a_failed_flush_fails_the_callers_it_covered_and_not_later_ones() {
        let (spans, clock) = (
            Arc::new(Mutex::new(Vec::new())),
            Arc::new(AtomicU64::new(0)),
        );
        let group = recording_group(spans.clone(), clock, Some(2));
        group.sync().unwrap();
        let failed = group.sync().unwrap_err();
        assert!(failed.to_string().contains("disk gone"), "{failed}");
        group.sync().unwrap();
        assert_eq!(
            spans.lock().unwrap().len(),
            3,
            "one flush each for callers one after another"
        );
    }

    #[test]
    fn the_folder_group_flushes_a_real_file_system() {
        let dir = std::env::temp_dir().join(format!("sfsync-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f"), b"bytes").unwrap();
        SyncGroup::of_folder(&dir).unwrap().sync().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
