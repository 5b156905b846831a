//! The deadline of a KVM vCPU: KVM_RUN blocks until the guest exits, so a helper thread kicks
//! the vCPU thread out of it once the deadline passes.
//!
//! The vCPU thread arms the watchdog right before KVM_RUN and disarms it right after. When the
//! deadline passes while armed, the watchdog (under its lock, so it can never fire after
//! `disarm` returned) first runs `on_fire`, which sets `kvm_run.immediate_exit`, then sends the
//! kick signal to the vCPU thread. If the thread is inside KVM_RUN, the signal (whose handler
//! does nothing and has no SA_RESTART) makes it return EINTR; if it is just about to enter,
//! `immediate_exit` makes KVM_RUN return EINTR at once. Either way the run loop sees EINTR and
//! reports the deadline.

use std::ffi::c_int;
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::sys;

#[derive(Default)]
struct State {
    /// The deadline the thread sleeps towards; cleared once it fired.
    deadline: Option<Instant>,
    /// The vCPU thread to kick, while armed.
    armed_tid: Option<i32>,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent even if a holder panicked: every update is one assignment.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// The signal that kicks vCPU threads (SIGRTMIN), with its do-nothing handler installed once
/// per process.
fn kick_signal() -> io::Result<c_int> {
    static INSTALLED: OnceLock<Result<c_int, i32>> = OnceLock::new();
    let installed = INSTALLED.get_or_init(|| {
        let signal = sys::sigrtmin();
        sys::install_interrupting_handler(signal).map(|()| signal).map_err(|e| e.raw_os_error().unwrap_or(0))
    });
    installed.map_err(io::Error::from_raw_os_error)
}

thread_local! {
    static THREAD_ID: i32 = sys::gettid();
}

impl Watchdog {
    /// Starts the watchdog thread; `on_fire` runs on it when an armed deadline passes, just
    /// before the kick signal is sent.
    pub fn start(on_fire: Box<dyn Fn() + Send>) -> io::Result<Watchdog> {
        let signal = kick_signal()?;
        let shared = Arc::new(Shared { state: Mutex::new(State::default()), wake: Condvar::new() });
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new().name("kvm-vcpu-watchdog".into()).spawn(move || watch(&theirs, signal, on_fire))?;
        Ok(Watchdog { shared, thread: Some(thread) })
    }

    /// Until `disarm`, the calling thread is kicked once `deadline` passes. Returns false (and
    /// arms nothing) if the deadline has already passed.
    pub fn arm(&self, deadline: Instant) -> bool {
        let tid = THREAD_ID.with(|tid| *tid);
        let mut state = self.shared.lock();
        // Checked under the lock: the thread fires only once now >= deadline, so if this check
        // passes, it has not yet seen this deadline expire.
        if Instant::now() >= deadline {
            return false;
        }
        state.armed_tid = Some(tid);
        if state.deadline != Some(deadline) {
            state.deadline = Some(deadline);
            self.shared.wake.notify_one();
        }
        true
    }

    /// After this returns, the watchdog sends no signal until the next `arm`.
    pub fn disarm(&self) {
        self.shared.lock().armed_tid = None;
    }
}

fn watch(shared: &Shared, signal: c_int, on_fire: Box<dyn Fn() + Send>) {
    let mut state = shared.lock();
    loop {
        if state.shutdown {
            return;
        }
        let now = Instant::now();
        state = match (state.deadline, state.armed_tid) {
            (Some(deadline), _) if now < deadline => shared.wake.wait_timeout(state, deadline - now).unwrap_or_else(|p| p.into_inner()).0,
            (Some(_), Some(tid)) => {
                on_fire();
                // The vCPU thread is alive: it cannot get past disarm() while we hold the lock.
                // A failure (it cannot happen for a live thread of ours) would only lose the
                // kick, and immediate_exit still stops the next KVM_RUN.
                let _ = sys::tgkill(tid, signal);
                state.deadline = None;
                state.armed_tid = None;
                state
            }
            // No deadline, or it expired while disarmed (the vCPU thread sees that itself when
            // it next arms): sleep until the state changes.
            _ => shared.wake.wait(state).unwrap_or_else(|p| p.into_inner()),
        };
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            // The thread only sleeps and signals; a panic there leaves nothing to clean up.
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn counting_watchdog() -> (Watchdog, Arc<AtomicUsize>) {
        let fired = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&fired);
        let watchdog = Watchdog::start(Box::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        }))
        .unwrap();
        (watchdog, fired)
    }

    #[test]
    fn deadline_interrupts_a_blocking_system_call() {
        let (watchdog, fired) = counting_watchdog();
        // A pipe nobody writes to: read() blocks until a signal interrupts it.
        let (mut reader, _writer) = std::io::pipe().unwrap();
        let start = Instant::now();
        assert!(watchdog.arm(start + Duration::from_millis(50)));
        let mut buf = [0u8; 1];
        let err = reader.read(&mut buf).unwrap_err();
        watchdog.disarm();
        assert_eq!(err.kind(), std::io::ErrorKind::Interrupted);
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert_eq!(fired.load(Ordering::SeqCst), 1, "on_fire runs once, before the signal");
    }

    #[test]
    fn expired_deadline_is_refused_and_disarmed_watchdog_stays_quiet() {
        let (watchdog, fired) = counting_watchdog();
        assert!(!watchdog.arm(Instant::now()));
        assert!(watchdog.arm(Instant::now() + Duration::from_millis(20)));
        watchdog.disarm();
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(fired.load(Ordering::SeqCst), 0);
        // A later deadline re-arms it.
        let (mut reader, _writer) = std::io::pipe().unwrap();
        assert!(watchdog.arm(Instant::now() + Duration::from_millis(20)));
        assert!(reader.read(&mut [0u8; 1]).is_err());
        watchdog.disarm();
        assert_eq!(fired.load(Ordering::SeqCst), 1);
    }
}
