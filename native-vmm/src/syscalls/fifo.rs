//! Opening a FIFO (made by mknod, `files.rs`): a blocking open waits for the other end as on
//! Linux (through a readiness wait, tried again as other threads and processes make progress),
//! then the ends are the two ends of one pipe of the tree, shared across fork like any pipe.

use super::{value, wait_ready, SysResult};
use crate::errno::Errno;
use crate::fs::Node;
use crate::process::{FifoOpen, GuestProcess, O_ACCMODE, O_RDWR};

/// The calls a thread can be blocked in while opening a FIFO: open, creat, openat.
const OPEN_CALLS: [u64; 3] = [2, 85, 257];

/// open of FIFO `node` (already opened in the file system, which this releases) with open(2)'s
/// status flags `status`: an fd for its read or write end (close-on-exec with `cloexec`), or a
/// wait for the other end. O_RDWR, which Linux opens as both ends at once, is EINVAL here.
pub(super) fn open(proc: &mut GuestProcess, node: Node, status: u32, cloexec: bool) -> SysResult {
    proc.config.vfs.close(node);
    if status & O_ACCMODE == O_RDWR {
        return Err(Errno::EINVAL);
    }
    let me = (proc.pid, proc.threads.current_tid());
    let (threads, tree) = (&proc.threads, &proc.tree);
    let waiting = |pid: u64, tid: u64| {
        if pid == me.0 {
            threads
                .waiting_call(tid)
                .is_some_and(|call| OPEN_CALLS.contains(&call.nr))
        } else {
            tree.get(pid).is_some_and(|e| e.exit.is_none())
        }
    };
    match proc.fds.open_fifo(node, (status, cloexec), me, waiting)? {
        FifoOpen::Open(fd) => value(fd),
        FifoOpen::Wait => wait_ready(proc, None),
    }
}
