//! The deadline of the ptrace development CPU: a thread that stops the guest when time is up.
//!
//! The tracer blocks in waitpid while the guest runs, and waitpid has no timeout, so a helper
//! thread sends SIGSTOP to the tracee once the armed deadline passes. The tracer sees that as a
//! signal-delivery stop and, if the deadline has really passed, reports `DeadlineReached`; a
//! SIGSTOP that lands while the tracer is busy stays pending and is seen on the next resume.

use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use super::ptrace_sys;

#[derive(Default)]
struct State {
    /// The deadline to enforce; cleared once the SIGSTOP has been sent.
    deadline: Option<Instant>,
    shutdown: bool,
}

pub struct DeadlineWatchdog {
    shared: Arc<(Mutex<State>, Condvar)>,
    /// The last deadline armed, so re-arming the same one (every run of one request) is free.
    armed: Option<Instant>,
    thread: Option<JoinHandle<()>>,
}

impl DeadlineWatchdog {
    /// Starts the watchdog thread for tracee `pid`. It must be dropped before the tracee is
    /// reaped, so that it never signals a recycled pid.
    pub fn start(pid: i32) -> io::Result<Self> {
        let shared = Arc::new((Mutex::new(State::default()), Condvar::new()));
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("devcpu-watchdog-{pid}"))
            .spawn(move || watch(pid, &theirs))?;
        Ok(DeadlineWatchdog {
            shared,
            armed: None,
            thread: Some(thread),
        })
    }

    /// Makes sure the tracee is stopped at `deadline` at the latest.
    pub fn arm(&mut self, deadline: Instant) {
        if self.armed == Some(deadline) {
            return;
        }
        self.armed = Some(deadline);
        let (lock, wake) = &*self.shared;
        lock.lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .deadline = Some(deadline);
        wake.notify_one();
    }
}

fn watch(pid: i32, shared: &(Mutex<State>, Condvar)) {
    let (lock, wake) = shared;
    let mut state = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    loop {
        if state.shutdown {
            return;
        }
        state = match state.deadline {
            None => wake
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
            Some(deadline) => {
                let now = Instant::now();
                if now >= deadline {
                    // The tracee is a zombie at worst (it is reaped only after this thread is
                    // joined), so the pid cannot have been recycled; an error is harmless.
                    let _ = ptrace_sys::send_signal(pid, ptrace_sys::SIGSTOP);
                    state.deadline = None;
                    state
                } else {
                    wake.wait_timeout(state, deadline - now)
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .0
                }
            }
        };
    }
}

impl Drop for DeadlineWatchdog {
    fn drop(&mut self) {
        let (lock, wake) = &*self.shared;
        lock.lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .shutdown = true;
        wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
