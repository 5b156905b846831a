//! The threads that serve the daemon's requests (an execution, a session request), kept between
//! requests. Each request still gets a thread of its own at once, where it may wait (for a
//! running slot, a pooled VM, a checkpoint's disk) without holding up anyone else; but a thread
//! that has answered waits for the next request instead of ending. Starting a thread (its stack
//! mapped, clone, its name set; at its end, the stack unmapped) costs an order of magnitude more
//! than handing a request to a waiting thread, and it was on every execution's path. A thread
//! left idle for `IDLE_LIFETIME` ends, so a burst's threads do not outlive it for long.
//!
//! Each idle thread waits on a channel of its own, listed in `idle`: a request taken off the
//! list goes to exactly one thread, known to be waiting for it. The most recently idle thread
//! is taken first (its stack is the warmest; the others age out).

use std::io;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, ThreadId};
use std::time::Duration;

/// One request's work, run on one of the threads.
pub type Task = Box<dyn FnOnce() + Send>;

/// How long a thread with nothing to do waits for a request before it ends.
const IDLE_LIFETIME: Duration = Duration::from_secs(30);

/// A thread waiting for its next task.
struct Idle {
    thread: ThreadId,
    tasks: Sender<Task>,
}

#[derive(Clone)]
pub struct RequestThreads {
    idle: Arc<Mutex<Vec<Idle>>>,
    idle_lifetime: Duration,
}

impl Default for RequestThreads {
    fn default() -> RequestThreads {
        RequestThreads {
            idle: Arc::default(),
            idle_lifetime: IDLE_LIFETIME,
        }
    }
}

impl RequestThreads {
    /// Runs `task` on an idle thread, or on a new one when none is idle. An error only when no
    /// thread could be started (the task is then dropped unrun).
    pub fn run(&self, task: Task) -> io::Result<()> {
        let waiting = lock(&self.idle).pop();
        let task = match waiting {
            Some(idle) => match idle.tasks.send(task) {
                Ok(()) => return Ok(()),
                // Its thread is gone (only a panic ends one while listed): start another.
                Err(mpsc::SendError(task)) => task,
            },
            None => task,
        };
        let (idle, lifetime) = (self.idle.clone(), self.idle_lifetime);
        thread::Builder::new()
            .name("sandfork-request".into())
            .spawn(move || serve(&idle, lifetime, task))
            .map(drop)
    }

    /// Threads waiting for a task.
    #[cfg(test)]
    fn idle(&self) -> usize {
        lock(&self.idle).len()
    }
}

fn lock(idle: &Mutex<Vec<Idle>>) -> MutexGuard<'_, Vec<Idle>> {
    // Each update of the list is one push, pop or removal: it stays whole if a holder panicked.
    idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A thread's life: its first task, then each one handed to it while it is listed idle. A task
/// that panics ends the thread (as it ended the thread of its own before).
fn serve(idle: &Mutex<Vec<Idle>>, idle_lifetime: Duration, first: Task) {
    let (tasks, received) = mpsc::channel::<Task>();
    let me = thread::current().id();
    let mut task = first;
    loop {
        task();
        lock(idle).push(Idle {
            thread: me,
            tasks: tasks.clone(),
        });
        task = match received.recv_timeout(idle_lifetime) {
            Ok(next) => next,
            Err(RecvTimeoutError::Timeout) => {
                let mut list = lock(idle);
                if let Some(at) = list.iter().position(|i| i.thread == me) {
                    list.swap_remove(at);
                    return;
                }
                drop(list);
                // A request took this thread off the list as it timed out: its task is on the way.
                match received.recv() {
                    Ok(next) => next,
                    Err(_) => return,
                }
            }
            // This thread holds a sender of its own channel: it cannot be disconnected.
            Err(RecvTimeoutError::Disconnected) => return,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    /// The thread each task ran on, in order.
    fn run_in_turn(threads: &RequestThreads, n: usize) -> Vec<ThreadId> {
        let mut ran_on = Vec::new();
        for _ in 0..n {
            let (done, finished) = channel();
            threads
                .run(Box::new(move || done.send(thread::current().id()).unwrap()))
                .unwrap();
            ran_on.push(finished.recv().unwrap());
            // The thread lists itself idle right after its task: wait for it, for a bounded
            // time (a thread with a short idle lifetime may have ended again meanwhile).
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while threads.idle() == 0 && std::time::Instant::now() < deadline {
                thread::yield_now();
            }
        }
        ran_on
    }

    #[test]
    fn a_thread_that_answered_serves_the_next_request() {
        let threads = RequestThreads::default();
        let ran_on = run_in_turn(&threads, 20);
        assert!(
            ran_on.iter().all(|t| *t == ran_on[0]),
            "one thread served all 20 requests made one after another"
        );
        assert_eq!(threads.idle(), 1);
    }

    #[test]
    fn every_request_in_flight_gets_a_thread_of_its_own() {
        let threads = RequestThreads::default();
        run_in_turn(&threads, 1);
        // Four tasks that each wait until all four run: they can only finish on four threads.
        let barrier = Arc::new(std::sync::Barrier::new(4));
        let (done, finished) = channel();
        for _ in 0..4 {
            let (barrier, done) = (barrier.clone(), done.clone());
            threads
                .run(Box::new(move || {
                    barrier.wait();
                    done.send(thread::current().id()).unwrap();
                }))
                .unwrap();
        }
        let mut ran_on: Vec<ThreadId> = (0..4).map(|_| finished.recv().unwrap()).collect();
        ran_on.sort_by_key(|t| format!("{t:?}"));
        ran_on.dedup();
        assert_eq!(ran_on.len(), 4);
    }

    #[test]
    fn a_thread_idle_for_its_lifetime_ends_and_the_next_request_starts_one() {
        let threads = RequestThreads {
            idle_lifetime: Duration::from_millis(20),
            ..RequestThreads::default()
        };
        let first = run_in_turn(&threads, 1);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while threads.idle() != 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the idle thread never ended"
            );
            thread::sleep(Duration::from_millis(5));
        }
        let next = run_in_turn(&threads, 1);
        assert_ne!(first, next);
    }

    #[test]
    fn a_task_that_panics_ends_only_its_thread() {
        let threads = RequestThreads::default();
        run_in_turn(&threads, 1);
        threads.run(Box::new(|| panic!("a task's panic"))).unwrap();
        // The panicking thread was taken off the list before its task ran: the next request
        // starts a thread of its own and is served.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while threads.idle() != 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the idle thread was never taken"
            );
            thread::yield_now();
        }
        assert_eq!(run_in_turn(&threads, 2).len(), 2);
    }
}
