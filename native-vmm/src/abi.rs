//! The guest ABI's fixed values that more than one layer needs: the identity the guest sees
//! and the Linux limits its process state keeps. Plain data; it imports nothing from the crate,
//! so both the process state (`process`) and the system calls (`syscalls`) build on it.

/// The guest is process 1 of its own one-process system (its main thread's tid too).
pub const GUEST_PID: u64 = 1;
/// The main thread's tid: the process id.
pub const MAIN_TID: u64 = GUEST_PID;
/// The unprivileged user the guest runs as, in its auxiliary vector and from getuid and friends.
pub const GUEST_UID: u64 = 1000;
pub const GUEST_GID: u64 = 1000;

/// The largest value an eventfd counter holds (Linux: 0xffff_ffff_ffff_fffe).
pub const EVENTFD_MAX_COUNT: u64 = u64::MAX - 1;

/// The longest path, with its terminating NUL (Linux PATH_MAX).
pub const PATH_MAX: usize = 4096;
/// The longest file name (Linux NAME_MAX).
pub const NAME_MAX: usize = 255;

/// Linux refuses FS bases at or above the end of the user half of the address space.
pub const TASK_SIZE: u64 = (1 << 47) - 4096;
