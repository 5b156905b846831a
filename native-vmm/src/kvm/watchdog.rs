//! The deadlines of KVM vCPUs: KVM_RUN blocks until the guest exits, so a helper thread kicks
//! a vCPU thread out of it once its deadline passes.
//!
//! One thread per process serves every vCPU (starting and joining a thread per VM would cost
//! tens of microseconds on every fork); each vCPU holds a `Watchdog`, its entry in that thread's
//! table. The vCPU thread arms its watchdog right before KVM_RUN and disarms it right after.
//! When an armed deadline passes, the thread (under the table's lock, so it can never fire after
//! `disarm` returned or after the `Watchdog` was dropped) first runs that vCPU's `on_fire`, which
//! sets `kvm_run.immediate_exit`, then sends the kick signal to the vCPU thread. If the thread
//! is inside KVM_RUN, the signal (whose handler does nothing and has no SA_RESTART) makes it
//! return EINTR; if it is just about to enter, `immediate_exit` makes KVM_RUN return EINTR at
//! once. Either way the run loop sees EINTR and reports the deadline.

use std::collections::HashMap;
use std::ffi::c_int;
use std::io;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use crate::sys;

/// One vCPU's entry in the watchdog thread's table.
struct Entry {
    /// The deadline to enforce; cleared once it fired.
    deadline: Option<Instant>,
    /// The vCPU thread to kick, while armed.
    armed_tid: Option<i32>,
    on_fire: Box<dyn Fn() + Send>,
}

#[derive(Default)]
struct Table {
    entries: HashMap<u64, Entry>,
    next_id: u64,
}

/// The process-wide watchdog thread's state.
struct Service {
    table: Mutex<Table>,
    wake: Condvar,
    signal: c_int,
}

impl Service {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // The table stays consistent even if a holder panicked: every update is one assignment.
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The process-wide service, its thread started on first use. A failed start is not cached.
fn service() -> io::Result<&'static Service> {
    static SERVICE: Mutex<Option<&'static Service>> = Mutex::new(None);
    let mut service = SERVICE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(started) = *service {
        return Ok(started);
    }
    let signal = kick_signal()?;
    // Lives as long as the process, as its thread does.
    let started: &'static Service = Box::leak(Box::new(Service {
        table: Mutex::new(Table::default()),
        wake: Condvar::new(),
        signal,
    }));
    std::thread::Builder::new()
        .name("kvm-vcpu-watchdog".into())
        .spawn(move || watch(started))?;
    *service = Some(started);
    Ok(started)
}

/// A vCPU's deadline, enforced by the process-wide watchdog thread.
pub struct Watchdog {
    service: &'static Service,
    id: u64,
}

/// The signal that kicks vCPU threads (SIGRTMIN), with its do-nothing handler installed once
/// per process.
fn kick_signal() -> io::Result<c_int> {
    static INSTALLED: OnceLock<Result<c_int, i32>> = OnceLock::new();
    let installed = INSTALLED.get_or_init(|| {
        let signal = sys::sigrtmin();
        sys::install_interrupting_handler(signal)
            .map(|()| signal)
            .map_err(|e| e.raw_os_error().unwrap_or(0))
    });
    installed.map_err(io::Error::from_raw_os_error)
}

thread_local! {
    static THREAD_ID: i32 = sys::gettid();
}

impl Watchdog {
    /// Registers a vCPU with the watchdog thread (starting it if this is the first); `on_fire`
    /// runs on that thread when an armed deadline passes, just before the kick signal is sent.
    pub fn start(on_fire: Box<dyn Fn() + Send>) -> io::Result<Watchdog> {
        let service = service()?;
        let mut table = service.lock();
        let id = table.next_id;
        table.next_id += 1;
        table.entries.insert(
            id,
            Entry {
                deadline: None,
                armed_tid: None,
                on_fire,
            },
        );
        Ok(Watchdog { service, id })
    }

    /// Until `disarm`, the calling thread is kicked once `deadline` passes. Returns false (and
    /// arms nothing) if the deadline has already passed.
    pub fn arm(&self, deadline: Instant) -> bool {
        let tid = THREAD_ID.with(|tid| *tid);
        let mut table = self.service.lock();
        // Checked under the lock: the thread fires only once now >= deadline, so if this check
        // passes, it has not yet seen this deadline expire.
        if Instant::now() >= deadline {
            return false;
        }
        let Some(entry) = table.entries.get_mut(&self.id) else {
            return false;
        };
        entry.armed_tid = Some(tid);
        if entry.deadline != Some(deadline) {
            entry.deadline = Some(deadline);
            self.service.wake.notify_one();
        }
        true
    }

    /// After this returns, the watchdog sends no signal until the next `arm`.
    pub fn disarm(&self) {
        if let Some(entry) = self.service.lock().entries.get_mut(&self.id) {
            entry.armed_tid = None;
        }
    }
}

fn watch(service: &Service) {
    let mut table = service.lock();
    loop {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for entry in table.entries.values_mut() {
            match (entry.deadline, entry.armed_tid) {
                (Some(deadline), _) if now < deadline => {
                    next = Some(next.map_or(deadline, |n| n.min(deadline)))
                }
                (Some(_), Some(tid)) => {
                    (entry.on_fire)();
                    // The vCPU thread is alive: it cannot get past disarm() while we hold the
                    // lock. A failure (it cannot happen for a live thread of ours) would only
                    // lose the kick, and immediate_exit still stops the next KVM_RUN.
                    let _ = sys::tgkill(tid, service.signal);
                    entry.deadline = None;
                    entry.armed_tid = None;
                }
                // No deadline, or it expired while disarmed (the vCPU thread sees that itself
                // when it next arms).
                _ => {}
            }
        }
        table = match next {
            Some(deadline) => {
                service
                    .wake
                    .wait_timeout(table, deadline - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            }
            None => service.wake.wait(table).unwrap_or_else(|p| p.into_inner()),
        };
    }
}

impl Drop for Watchdog {
    /// Removes the entry: from now on `on_fire` never runs (it may point into the vCPU's run
    /// page, which is unmapped after this).
    fn drop(&mut self) {
        // Bound first, so the closure is dropped after the lock is released.
        let entry = self.service.lock().entries.remove(&self.id);
        drop(entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
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
        assert_eq!(
            fired.load(Ordering::SeqCst),
            1,
            "on_fire runs once, before the signal"
        );
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

    #[test]
    fn each_watchdog_fires_for_its_own_deadline_and_a_dropped_one_never_does() {
        let (early, early_fired) = counting_watchdog();
        let (late, late_fired) = counting_watchdog();
        let (dropped, dropped_fired) = counting_watchdog();
        let start = Instant::now();
        assert!(late.arm(start + Duration::from_millis(60)));
        assert!(early.arm(start + Duration::from_millis(20)));
        assert!(dropped.arm(start + Duration::from_millis(20)));
        drop(dropped);
        // Sleeping in slices: the kick signals may cut a sleep short.
        let until = start + Duration::from_secs(5);
        while late_fired.load(Ordering::SeqCst) == 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            start.elapsed() >= Duration::from_millis(60),
            "the later deadline is not cut short by the earlier one"
        );
        std::thread::sleep(Duration::from_millis(30));
        early.disarm();
        late.disarm();
        assert_eq!(
            (
                early_fired.load(Ordering::SeqCst),
                late_fired.load(Ordering::SeqCst),
                dropped_fired.load(Ordering::SeqCst)
            ),
            (1, 1, 0)
        );
    }
}
