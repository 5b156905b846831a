//! Destroying KVM VMs off the path that made them: closing a VM's last fd destroys it in the
//! kernel (its debugfs entries, memory slots, MMU state), a large share of a fork's cost on
//! PVM. The thread that drops a vCPU only queues its handles (`Reaped`); one thread per
//! process closes them, in order, so a worker that retires a VM forks the next one at once and
//! a request served on a fresh fork is answered before its VM is torn down.
//!
//! Nothing of a queued VM can run again (its fds are owned by the queue, never handed out),
//! so deferring the close changes only when the kernel frees it. `flush` waits until everything
//! queued so far is gone (benchmarks measuring memory call it first).

use std::ops::Deref;
use std::sync::mpsc::{self, Sender};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

type Remains = Box<dyn Send>;

/// The process-wide queue: the reaper thread's sender, and how many queued items it has not
/// dropped yet.
struct Queue {
    sender: Sender<Remains>,
    pending: Mutex<u64>,
    drained: Condvar,
}

impl Queue {
    fn pending(&self) -> MutexGuard<'_, u64> {
        // A count stays meaningful even if a holder panicked: every update is one assignment.
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The queue, its thread started on first use; None if the thread could not be started (the
/// caller then drops in place).
fn queue() -> Option<&'static Queue> {
    static QUEUE: OnceLock<Option<Queue>> = OnceLock::new();
    QUEUE
        .get_or_init(|| {
            let (sender, receiver) = mpsc::channel::<Remains>();
            let spawned = std::thread::Builder::new()
                .name("kvm-vm-reaper".into())
                .spawn(move || {
                    for remains in receiver {
                        drop(remains);
                        let queue = queue().expect("the reaper runs only once its queue exists");
                        let mut pending = queue.pending();
                        *pending -= 1;
                        if *pending == 0 {
                            queue.drained.notify_all();
                        }
                    }
                });
            spawned.ok().map(|_| Queue {
                sender,
                pending: Mutex::new(0),
                drained: Condvar::new(),
            })
        })
        .as_ref()
}

/// Starts the reaper thread now (a confined daemon may still start threads, but its first VM
/// is made before confinement: starting it there keeps thread creation out of request paths).
pub fn start() {
    queue();
}

/// Queues `remains` to be dropped on the reaper thread (dropped here if it cannot be started).
fn dispose(remains: Remains) {
    let Some(queue) = queue() else {
        return drop(remains);
    };
    *queue.pending() += 1;
    if let Err(unsent) = queue.sender.send(remains) {
        *queue.pending() -= 1;
        drop(unsent.0);
    }
}

/// Returns once everything queued before the call has been dropped.
pub fn flush() {
    let Some(queue) = queue() else { return };
    let mut pending = queue.pending();
    while *pending > 0 {
        pending = queue
            .drained
            .wait(pending)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
    }
}

/// A value whose drop happens on the reaper thread. Derefs to the value.
pub struct Reaped<T: Send + 'static>(Option<T>);

impl<T: Send + 'static> Reaped<T> {
    pub fn new(value: T) -> Reaped<T> {
        Reaped(Some(value))
    }
}

impl<T: Send + 'static> Deref for Reaped<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("only drop takes the value")
    }
}

impl<T: Send + 'static> Drop for Reaped<T> {
    fn drop(&mut self) {
        if let Some(value) = self.0.take() {
            dispose(Box::new(value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Records the thread it is dropped on.
    struct Marker {
        dropped_on: Arc<Mutex<Vec<std::thread::ThreadId>>>,
        count: Arc<AtomicUsize>,
    }

    impl Drop for Marker {
        fn drop(&mut self) {
            self.dropped_on
                .lock()
                .unwrap()
                .push(std::thread::current().id());
            self.count.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn reaped_values_are_dropped_on_the_reaper_thread_and_flush_waits_for_them() {
        let dropped_on = Arc::new(Mutex::new(Vec::new()));
        let count = Arc::new(AtomicUsize::new(0));
        for _ in 0..50 {
            let reaped = Reaped::new(Marker {
                dropped_on: dropped_on.clone(),
                count: count.clone(),
            });
            assert!(Arc::strong_count(&reaped.count) >= 2, "derefs to the value");
            drop(reaped);
        }
        flush();
        assert_eq!(
            count.load(Ordering::SeqCst),
            50,
            "flush returns only once all are dropped"
        );
        let threads = dropped_on.lock().unwrap();
        assert!(
            threads.iter().all(|&t| t != std::thread::current().id()),
            "none dropped in place"
        );
    }
}
