//! The host FFI: the few libc calls the VMM makes (through the libc crate), each wrapped in a
//! safe function.
//!
//! The VMM's libc calls live here; the other `unsafe` code is the mappings built on
//! `libc::mmap` and `libc::munmap` (`memory.rs`, `kvm/run_page.rs`), the host sockets of
//! guests' egress (`net/host.rs`) and the test-only ptrace CPU's own calls
//! (`devcpu/ptrace_sys.rs`).
//! Wrappers return `io::Result` with the host errno, so callers never see raw return codes.

// FFI: libc's signed return values and C types are converted to and from Rust's unsigned ones.
#![allow(clippy::cast_sign_loss, clippy::cast_possible_wrap)]

use std::ffi::{c_int, c_ulong, CString};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::Duration;

pub use libc::{sock_filter as SockFilter, SIGINT, SIGTERM};

/// A libc call's int result: the host errno when it is negative.
pub(crate) fn check(ret: c_int) -> io::Result<c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A libc call's length result (read, recv, ...): the host errno when it is negative.
pub(crate) fn check_len(ret: isize) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

/// Creates an anonymous memory file of `size` bytes (guest RAM lives in one).
pub fn memfd(name: &str, size: u64) -> io::Result<OwnedFd> {
    let name = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "memfd name contains NUL"))?;
    // SAFETY: name is NUL-terminated and outlives the call.
    let fd = check(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) })?;
    // SAFETY: fd was just returned by memfd_create and is owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain syscall on a valid fd.
    check(unsafe { libc::ftruncate(fd, size as i64) })?;
    Ok(owned)
}

/// ftruncate(fd, size).
pub fn set_len(fd: c_int, size: u64) -> io::Result<()> {
    let size = i64::try_from(size)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "length too large"))?;
    // SAFETY: plain syscall on integers.
    check(unsafe { libc::ftruncate(fd, size) })?;
    Ok(())
}

/// How many 4 KiB pages of host memory or swap `fd` (a memfd) holds: its block count.
pub fn file_pages(fd: c_int) -> io::Result<u64> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes one `struct stat` to the pointer, which is valid for it.
    check(unsafe { libc::fstat(fd, stat.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so it filled the whole struct.
    let blocks = unsafe { stat.assume_init() }.st_blocks;
    Ok(u64::try_from(blocks).unwrap_or(0) * 512 / 4096)
}

/// pwrite(2) of all of `data` to `fd` at `offset`, continued after short writes.
pub fn write_all_at(fd: c_int, mut data: &[u8], mut offset: u64) -> io::Result<()> {
    while !data.is_empty() {
        // SAFETY: the kernel reads `data.len()` bytes from a live slice.
        let n = unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), offset.cast_signed()) };
        match n {
            n if n > 0 => {
                data = &data[n as usize..];
                offset += n as u64;
            }
            0 => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            _ => match io::Error::last_os_error() {
                e if e.kind() == io::ErrorKind::Interrupted => {}
                e => return Err(e),
            },
        }
    }
    Ok(())
}

/// The first offset at or after `offset` where `fd` holds data; None when only a hole follows.
pub fn seek_data(fd: c_int, offset: u64) -> io::Result<Option<u64>> {
    // SAFETY: lseek takes integers only.
    match unsafe { libc::lseek(fd, offset as i64, libc::SEEK_DATA) } {
        n if n >= 0 => Ok(Some(n as u64)),
        _ => match io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::ENXIO) => Ok(None),
            e => Err(e),
        },
    }
}

/// The first offset at or after `offset` where a hole (or the end of `fd`) begins.
pub fn seek_hole(fd: c_int, offset: u64) -> io::Result<u64> {
    // SAFETY: lseek takes integers only.
    match unsafe { libc::lseek(fd, offset as i64, libc::SEEK_HOLE) } {
        n if n >= 0 => Ok(n as u64),
        _ => Err(io::Error::last_os_error()),
    }
}

/// ioctl with an integer (or no) argument.
pub fn ioctl_val(fd: c_int, request: c_ulong, arg: c_ulong) -> io::Result<c_int> {
    // SAFETY: the kernel reads no memory for value-argument ioctls.
    check(unsafe { libc::ioctl(fd, request, arg) })
}

/// ioctl whose argument is a pointer to `T` that the kernel reads.
pub fn ioctl_ref<T>(fd: c_int, request: c_ulong, arg: &T) -> io::Result<c_int> {
    // SAFETY: arg is a valid, initialised T for the duration of the call.
    check(unsafe { libc::ioctl(fd, request, arg as *const T) })
}

/// ioctl whose argument is a pointer to `T` that the kernel writes (and may read).
pub fn ioctl_mut<T>(fd: c_int, request: c_ulong, arg: &mut T) -> io::Result<c_int> {
    // SAFETY: arg is a valid, exclusively borrowed T for the duration of the call.
    check(unsafe { libc::ioctl(fd, request, arg as *mut T) })
}

// PAGEMAP_SCAN (Linux 6.7) is newer than Debian's libc crate (0.2.139): its constants and
// structs are declared here from linux/fs.h.

/// `PAGE_IS_*` page categories of the PAGEMAP_SCAN ioctl (linux/fs.h).
pub const PAGE_IS_FILE: u64 = 1 << 2;
pub const PAGE_IS_PRESENT: u64 = 1 << 3;
pub const PAGE_IS_PFNZERO: u64 = 1 << 5;
/// `_IOWR('f', 16, struct pm_scan_arg)`.
pub const PAGEMAP_SCAN: c_ulong = 0xC060_6610;

/// `struct pm_scan_arg` (linux/fs.h, Linux 6.7+).
#[repr(C)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// One `struct page_region` the scan reports: the pages in `start..end` (addresses) share
/// `categories`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PageRegion {
    pub start: u64,
    pub end: u64,
    pub categories: u64,
}

/// PAGEMAP_SCAN on a /proc/PID/pagemap descriptor: fills `regions` with the ranges of
/// `start..end` whose pages have every category in `mask`, reading the ones in `inverted` as
/// "has not" (e.g. present and not a file page). Returns how many regions were filled and
/// where the walk stopped (before `end` when `regions` filled up: scan again from there).
/// Kernels before 6.7 fail it with ENOTTY.
pub fn pagemap_scan(
    pagemap: c_int,
    start: u64,
    end: u64,
    mask: u64,
    inverted: u64,
    regions: &mut [PageRegion],
) -> io::Result<(usize, u64)> {
    let mut arg = PmScanArg {
        size: std::mem::size_of::<PmScanArg>() as u64,
        flags: 0,
        start,
        end,
        walk_end: 0,
        vec: regions.as_mut_ptr() as u64,
        vec_len: regions.len() as u64,
        max_pages: 0,
        category_inverted: inverted,
        category_mask: mask,
        category_anyof_mask: 0,
        return_mask: mask,
    };
    // SAFETY: arg is a valid pm_scan_arg; the kernel writes at most vec_len regions to vec,
    // which is `regions`, exclusively borrowed for the call.
    let filled = check(unsafe { libc::ioctl(pagemap, PAGEMAP_SCAN, &mut arg as *mut PmScanArg) })?;
    Ok((filled as usize, arg.walk_end))
}

/// Fills `buf` from the host CSPRNG (getrandom(2), blocking until seeded).
pub fn fill_random(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: the pointer and length describe the unfilled tail of buf.
        let n = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        done += n as usize;
    }
    Ok(())
}

/// The calling thread's kernel thread id (for signalling a vCPU thread).
pub fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// The TSC, read after every earlier load and before every later one (`lfence; rdtsc;
/// lfence`, as the guest's vDSO reads it).
pub fn rdtsc_ordered() -> u64 {
    use std::arch::x86_64::{_mm_lfence, _rdtsc};
    // SAFETY: lfence (SSE2, part of x86-64) and rdtsc have no memory operands or preconditions.
    unsafe {
        _mm_lfence();
        let tsc = _rdtsc();
        _mm_lfence();
        tsc
    }
}

/// Reads host clock `clock` (a Linux clock id) as (seconds, nanoseconds).
pub fn clock_time(clock: c_int) -> io::Result<(i64, i64)> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, exclusively borrowed timespec for the duration of the call.
    check(unsafe { libc::clock_gettime(clock, &mut ts) })?;
    Ok((ts.tv_sec, ts.tv_nsec))
}

/// CPU time of the calling thread (under KVM the guest runs inside this thread's KVM_RUN);
/// zero when the clock cannot be read.
pub fn thread_cpu_time() -> Duration {
    match clock_time(libc::CLOCK_THREAD_CPUTIME_ID) {
        Ok((secs, nanos)) => Duration::new(
            u64::try_from(secs).unwrap_or(0),
            u32::try_from(nanos.clamp(0, 999_999_999)).unwrap_or(0),
        ),
        Err(_) => Duration::ZERO,
    }
}

/// Page faults (minor and major) the calling thread has taken (getrusage RUSAGE_THREAD).
/// Faults that KVM takes on the guest's behalf while this thread runs its vCPU count too (its
/// get_user_pages faults are accounted to the calling task; with no in-kernel LAPIC, KVM never
/// hands a fault to another thread as an async page fault).
pub fn thread_page_faults() -> io::Result<u64> {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: usage is a valid, exclusively borrowed rusage for the duration of the call.
    check(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) })?;
    Ok(usage.ru_minflt as u64 + usage.ru_majflt as u64)
}

// Kicking a vCPU thread out of KVM_RUN (kvm/): a thread-directed signal whose handler does
// nothing, installed without SA_RESTART so the blocked ioctl returns EINTR.

extern "C" fn ignore_signal(_signo: c_int) {}

/// The first real-time signal the C library leaves to applications (SIGRTMIN).
pub fn sigrtmin() -> c_int {
    libc::SIGRTMIN()
}

/// An empty signal set.
fn empty_signal_set() -> io::Result<libc::sigset_t> {
    // SAFETY: sigset_t is a plain bit array, valid when zeroed; sigemptyset then makes it the
    // C library's empty set.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a valid, exclusively borrowed sigset_t.
    check(unsafe { libc::sigemptyset(&mut set) })?;
    Ok(set)
}

/// Installs a do-nothing handler for `signo` without SA_RESTART: a blocking system call in a
/// thread that receives `signo` then returns EINTR instead of being restarted.
pub fn install_interrupting_handler(signo: c_int) -> io::Result<()> {
    // SAFETY: an all-zero sigaction is valid (default handler, no flags, no restorer).
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = ignore_signal as extern "C" fn(c_int) as libc::sighandler_t;
    act.sa_mask = empty_signal_set()?;
    // SAFETY: act is a valid sigaction that outlives the call; the handler does nothing, so it
    // is async-signal-safe; no old action is requested.
    check(unsafe { libc::sigaction(signo, &act, std::ptr::null_mut()) })?;
    Ok(())
}

/// Sends `signo` to thread `tid` of this process.
pub fn tgkill(tid: i32, signo: c_int) -> io::Result<()> {
    let pid = libc::c_long::from(std::process::id());
    // SAFETY: tgkill takes three integers and touches no memory of ours.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_tgkill,
            pid,
            libc::c_long::from(tid),
            libc::c_long::from(signo),
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// ioctl with an integer argument that returns a new file descriptor (KVM_CREATE_VM, ...).
pub fn ioctl_new_fd(fd: c_int, request: c_ulong, arg: c_ulong) -> io::Result<OwnedFd> {
    let new_fd = ioctl_val(fd, request, arg)?;
    // SAFETY: the kernel just returned new_fd as a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(new_fd) })
}

// Termination signals for the daemon (`serve`): blocked in every thread and taken by one
// thread with sigwait, so shutdown runs as ordinary code instead of in a signal handler.

/// A set of signals blocked by `block_signals`, for `wait_for_signal`.
#[derive(Clone, Copy)]
pub struct SignalSet(libc::sigset_t);

/// Blocks `signals` in the calling thread (threads it starts later inherit the mask) and
/// returns them as a set for `wait_for_signal`.
pub fn block_signals(signals: &[c_int]) -> io::Result<SignalSet> {
    let mut set = empty_signal_set()?;
    for &signum in signals {
        // SAFETY: set is a valid, exclusively borrowed sigset_t; an invalid signal number is
        // reported as EINVAL.
        check(unsafe { libc::sigaddset(&mut set, signum) })?;
    }
    // SAFETY: set is initialised; no old mask is requested. Returns an errno value, not -1.
    match unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) } {
        0 => Ok(SignalSet(set)),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

/// Waits until one of the (blocked) signals in `set` is pending and takes it; returns its number.
pub fn wait_for_signal(set: &SignalSet) -> io::Result<c_int> {
    let mut signum: c_int = 0;
    // SAFETY: set is an initialised sigset_t and signum a valid int, both outliving the call.
    match unsafe { libc::sigwait(&set.0, &mut signum) } {
        0 => Ok(signum),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

/// prctl(PR_SET_NO_NEW_PRIVS): neither this process nor anything it could exec gains privileges.
pub fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }).map(drop)
}

/// seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, program): the filter applies to
/// every thread of the process (and to the threads they start).
pub fn install_seccomp_filter(program: &[SockFilter]) -> io::Result<()> {
    let len = u16::try_from(program.len()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a seccomp filter holds at most 65535 instructions",
        )
    })?;
    let fprog = libc::sock_fprog {
        len,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at `program`, which outlives the call; the kernel copies it.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_TSYNC,
            &fprog as *const libc::sock_fprog,
        )
    };
    match ret {
        0 => Ok(()),
        r if r < 0 => Err(io::Error::last_os_error()),
        // With TSYNC, a positive answer is the id of a thread that could not take the filter.
        tid => Err(io::Error::other(format!(
            "thread {tid} could not be confined"
        ))),
    }
}

/// seccomp(2)'s operation (linux/seccomp.h; not in Debian's libc crate).
const SECCOMP_SET_MODE_FILTER: libc::c_ulong = 1;

/// shutdown(fd, SHUT_RD): on a listening socket, makes a blocked accept fail (EINVAL).
pub fn shutdown_read(fd: c_int) -> io::Result<()> {
    // SAFETY: shutdown takes integers only.
    check(unsafe { libc::shutdown(fd, libc::SHUT_RD) }).map(drop)
}

/// syncfs(fd): writes back and flushes everything of the file system holding `fd` (data and
/// metadata), and reports a writeback error on it since this descriptor's last call.
pub fn syncfs(fd: c_int) -> io::Result<()> {
    // SAFETY: syncfs takes an integer only.
    check(unsafe { libc::syncfs(fd) }).map(drop)
}

/// preadv(fd, slices, offset): reads the file from `offset` into the slices in order; returns
/// how many bytes it read (fewer at the end of the file).
pub fn preadv(fd: c_int, slices: &mut [std::io::IoSliceMut<'_>], offset: u64) -> io::Result<usize> {
    let count = c_int::try_from(slices.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too many slices"))?;
    // SAFETY: IoSliceMut is ABI-compatible with struct iovec on Unix (std documents it); every
    // slice is a live, exclusively borrowed buffer for the duration of the call.
    check_len(unsafe {
        libc::preadv(
            fd,
            slices.as_mut_ptr() as *const libc::iovec,
            count,
            offset as libc::off_t,
        )
    })
}

/// mallopt(M_ARENA_MAX, arenas): glibc's default limit (8 per core) set explicitly, so that
/// malloc never needs to count the CPUs (by opening /sys/devices/system/cpu/online).
pub fn limit_malloc_arenas(arenas: usize) -> io::Result<()> {
    const M_ARENA_MAX: c_int = -8;
    let arenas = c_int::try_from(arenas).unwrap_or(c_int::MAX);
    // SAFETY: mallopt takes integers only.
    match unsafe { libc::mallopt(M_ARENA_MAX, arenas) } {
        1 => Ok(()),
        _ => Err(io::Error::other("mallopt(M_ARENA_MAX) failed")),
    }
}

/// This process's open-file limits (RLIMIT_NOFILE): (soft, hard).
pub fn open_file_limits() -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit, which `limit` is.
    check(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) })?;
    Ok((limit.rlim_cur, limit.rlim_max))
}

/// Sets this process's open-file limits (RLIMIT_NOFILE) to `soft` and `hard` (raising the hard
/// limit needs CAP_SYS_RESOURCE, and at most /proc/sys/fs/nr_open).
pub fn set_open_file_limits(soft: u64, hard: u64) -> io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads one rlimit, which `limit` is.
    check(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }).map(drop)
}
