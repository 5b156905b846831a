//! Handler tests through `dispatch`, against real guest memory and a real file image built in
//! a temporary directory by the image writer.

use std::time::{Duration, Instant};

use super::{dispatch, SyscallOutcome, TABLE};
use crate::errno::Errno;
use crate::fs::{Image, Vfs, DEFAULT_OVERLAY_LIMIT};
use crate::image::format::{self, Entry, EntryKind, Index};
use crate::image::testdir::TempDir;
use crate::memory::GuestMemory;
use crate::process::threads::{Call, Wait, WaitOn};
use crate::process::{AddressSpace, GuestProcess, ProcessConfig, Usage};
use crate::status::RunStatus;

const MIB: u64 = 1 << 20;
const MREMAP: u64 = 25;
const MEM: u64 = 16 * MIB;
/// Scratch user memory for arguments (below brk_start: loader-owned, never handed out).
const SCRATCH: u64 = 0x20_0000;
const BUF: u64 = 0x30_0000;
const PASSWD: &[u8] = b"root:x:0:0:root:/root:/bin/sh\n";

// x86-64 numbers used below.
const READ: u64 = 0;
const WRITE: u64 = 1;
const CLOSE: u64 = 3;
const FSTAT: u64 = 5;
const LSEEK: u64 = 8;
const MMAP: u64 = 9;
const MUNMAP: u64 = 11;
const BRK: u64 = 12;
const RT_SIGACTION: u64 = 13;
const RT_SIGPROCMASK: u64 = 14;
const RT_SIGRETURN: u64 = 15;
const IOCTL: u64 = 16;
const WRITEV: u64 = 20;
const DUP: u64 = 32;
const DUP2: u64 = 33;
const NANOSLEEP: u64 = 35;
const SOCKET: u64 = 41;
const CLONE: u64 = 56;
const KILL: u64 = 62;
const UNAME: u64 = 63;
const FCNTL: u64 = 72;
const GETCWD: u64 = 79;
const CHDIR: u64 = 80;
const ARCH_PRCTL: u64 = 158;
const IO_URING_SETUP: u64 = 425;
const GETTID: u64 = 186;
const FUTEX: u64 = 202;
const GETDENTS64: u64 = 217;
const CLOCK_GETTIME: u64 = 228;
const EXIT_GROUP: u64 = 231;
const TGKILL: u64 = 234;
const TKILL: u64 = 200;
const RT_SIGPENDING: u64 = 127;
const OPENAT: u64 = 257;
const MKDIRAT: u64 = 258;
const NEWFSTATAT: u64 = 262;
const UNLINKAT: u64 = 263;
const PIPE2: u64 = 293;
const PRLIMIT64: u64 = 302;
const GETRANDOM: u64 = 318;

const AT_FDCWD: u64 = -100i64 as u64;
const O_WRONLY: u64 = 1;
const O_RDWR: u64 = 2;
const O_CREAT: u64 = 0o100;
const O_NONBLOCK: u64 = 0o4000;
const O_DIRECTORY: u64 = 0o200000;
const O_CLOEXEC: u64 = 0o2000000;

struct Guest {
    proc: GuestProcess,
    mem: GuestMemory,
    /// The image's files, removed when the guest is dropped.
    _dir: TempDir,
}

fn test_image() -> (std::sync::Arc<Image>, TempDir) {
    let dir = TempDir::new("sys-test");
    let entry = |path: &str, mode, kind| Entry {
        path: path.into(),
        mode,
        mtime_sec: 1_600_000_000,
        mtime_nsec: 0,
        kind,
    };
    let file = |size: usize| EntryKind::File {
        offset: 0,
        size: size as u64,
        sha256: [0; 32],
    };
    let mut index = Index {
        name: "sys-test".into(),
        writable_dirs: vec!["/tmp".into(), "/work".into()],
        entries: vec![
            entry("/", 0o755, EntryKind::Dir),
            entry("/etc", 0o755, EntryKind::Dir),
            entry("/etc/passwd", 0o644, file(PASSWD.len())),
            entry(
                "/lib",
                0o777,
                EntryKind::Symlink {
                    target: "usr/lib".into(),
                },
            ),
            entry("/usr", 0o755, EntryKind::Dir),
            entry("/usr/lib", 0o755, EntryKind::Dir),
            entry("/usr/lib/data.bin", 0o644, file(5000)),
        ],
    };
    format::write(&dir.0, &mut index, |e| {
        Ok(if e.path == "/etc/passwd" {
            PASSWD.to_vec()
        } else {
            (0..5000).map(|i| (i % 251) as u8).collect()
        })
    })
    .unwrap();
    (Image::open(&dir.0).unwrap(), dir)
}

fn guest_with(stdin: &[u8], output_cap: u64) -> Guest {
    let (image, dir) = test_image();
    let vfs = Vfs::new(image, DEFAULT_OVERLAY_LIMIT).unwrap();
    let config = ProcessConfig {
        vfs,
        cwd: "/work".into(),
        stdin: stdin.to_vec(),
        output_cap,
        mem_limit: MEM,
        command: Default::default(),
    };
    let space = AddressSpace {
        brk_start: 4 * MIB,
        mmap_low: 4 * MIB,
        mmap_high: 14 * MIB,
    };
    Guest {
        proc: GuestProcess::new(config, space),
        mem: GuestMemory::new(MEM).unwrap(),
        _dir: dir,
    }
}

fn guest() -> Guest {
    guest_with(b"", 1 << 20)
}

impl Guest {
    fn call(&mut self, nr: u64, args: &[u64]) -> SyscallOutcome {
        let mut regs = [0u64; 6];
        regs[..args.len()].copy_from_slice(args);
        dispatch(&mut self.proc, &self.mem, nr, regs)
    }

    /// The call's return value as a signed number (-errno on failure).
    fn ret(&mut self, nr: u64, args: &[u64]) -> i64 {
        match self.call(nr, args) {
            SyscallOutcome::Return(v) => v as i64,
            other => panic!("syscall {nr} did not return: {other:?}"),
        }
    }

    fn cstr(&self, addr: u64, s: &str) -> u64 {
        self.mem.write(addr, s.as_bytes()).unwrap();
        self.mem.write(addr + s.len() as u64, &[0]).unwrap();
        addr
    }

    fn open(&mut self, path: &str, flags: u64) -> i64 {
        let p = self.cstr(SCRATCH, path);
        self.ret(OPENAT, &[AT_FDCWD, p, flags, 0o644])
    }

    fn write_bytes(&mut self, fd: u64, data: &[u8]) -> i64 {
        self.mem.write(SCRATCH + 0x1000, data).unwrap();
        self.ret(WRITE, &[fd, SCRATCH + 0x1000, data.len() as u64])
    }

    fn read_bytes(&mut self, fd: u64, len: u64) -> Result<Vec<u8>, i64> {
        let n = self.ret(READ, &[fd, BUF, len]);
        if n < 0 {
            return Err(n);
        }
        Ok(self.mem.read_vec(BUF, n as u64).unwrap())
    }
}

fn err(e: Errno) -> i64 {
    -i64::from(e.0)
}

/// The wait a call blocked its thread with (the scheduler, not the handler, does the waiting).
fn blocked(outcome: SyscallOutcome) -> Wait {
    match outcome {
        SyscallOutcome::Block(wait) => wait,
        other => panic!("the call did not block: {other:?}"),
    }
}

/// A readiness wait's timeout, checking that it waits for readiness.
fn ready_wait(outcome: SyscallOutcome) -> Option<Instant> {
    let wait = blocked(outcome);
    assert!(matches!(wait.on, WaitOn::Ready { .. }), "{wait:?}");
    wait.until
}

#[test]
fn table_is_sorted_unique_and_named() {
    assert!(TABLE.windows(2).all(|w| w[0].nr < w[1].nr));
    assert!(TABLE.iter().all(|e| !e.name.is_empty()
        && (e.nr < 512
            || e.nr == crate::agent::AWAIT_REQUEST_SYSCALL
            || e.nr == crate::agent::PUBLISH_RESULT_SYSCALL)));
}

#[test]
fn publish_result_keeps_a_scripts_result_and_refuses_anything_else() {
    use crate::agent::{MAX_RESULT_BYTES, PUBLISH_RESULT_SYSCALL};
    let mut g = guest();
    let publish = |g: &mut Guest, text: &[u8]| {
        g.mem.write(BUF, text).unwrap();
        g.ret(PUBLISH_RESULT_SYSCALL, &[BUF, text.len() as u64])
    };
    let first = br#"{"value": "1", "results": [{"type": "text/html", "data": "<b>1</b>"}]}"#;
    assert_eq!(publish(&mut g, first), 0);
    let kept = g.proc.published_result.clone().unwrap();
    assert_eq!(kept.value.as_deref(), Some("1"));
    assert_eq!(kept.results[0].mime, "text/html");
    assert_eq!(publish(&mut g, br#"{"value": null}"#), 0);
    assert_eq!(
        g.proc.published_result.clone().unwrap().value,
        None,
        "a later one replaces it"
    );
    assert_eq!(publish(&mut g, b"not json"), err(Errno::EINVAL));
    assert_eq!(
        publish(&mut g, br#"{"value": 1, "results": []}"#),
        err(Errno::EINVAL),
        "a value is text"
    );
    assert_eq!(
        g.ret(PUBLISH_RESULT_SYSCALL, &[BUF, MAX_RESULT_BYTES + 1]),
        err(Errno::E2BIG)
    );
    assert_eq!(
        g.ret(PUBLISH_RESULT_SYSCALL, &[MEM - 8, 64]),
        err(Errno::EFAULT)
    );
    assert_eq!(
        g.proc.published_result.unwrap().value,
        None,
        "refusals keep the last one"
    );
}

#[test]
fn unknown_calls_are_enosys_and_counted() {
    let mut g = guest();
    assert_eq!(g.ret(500, &[]), err(Errno::ENOSYS));
    assert_eq!(g.ret(500, &[]), err(Errno::ENOSYS));
    assert_eq!(g.ret(1 << 40, &[]), err(Errno::ENOSYS));
    assert_eq!(g.ret(IO_URING_SETUP, &[]), err(Errno::ENOSYS));
    assert_eq!(g.ret(SOCKET, &[17, 3, 0]), err(Errno::EAFNOSUPPORT));
    assert_eq!(g.ret(GETTID, &[]), 1);
    let unsupported = g.proc.unsupported_counts();
    assert!(unsupported
        .iter()
        .any(|c| c.nr == Some(500) && c.count == 2 && c.name.is_none()));
    assert!(unsupported
        .iter()
        .any(|c| c.nr == Some(IO_URING_SETUP) && c.name == Some("io_uring_setup")));
    assert!(unsupported.iter().any(|c| c.nr.is_none() && c.count == 1));
    // A refusal by policy other than ENOSYS is answered, not unsupported.
    assert!(!unsupported.iter().any(|c| c.nr == Some(SOCKET)));
    assert!(g
        .proc
        .syscall_counts()
        .iter()
        .any(|c| c.nr == Some(GETTID) && c.name == Some("gettid") && c.count == 1));
    assert_eq!(g.proc.total_syscalls(), 6);
}

#[test]
fn calls_the_scheduler_carries_out() {
    let mut g = guest();
    assert_eq!(g.call(RT_SIGRETURN, &[]), SyscallOutcome::SigReturn);
    assert_eq!(
        g.call(EXIT_GROUP, &[0x1_03]),
        SyscallOutcome::Stop(RunStatus::Exited { code: 3 })
    );
}

#[test]
fn bad_pointers_are_efault() {
    let mut g = guest();
    // System area (supervisor-only), outside memory, and a range running off the end.
    for addr in [0u64, 0x1000, 0xf_f000, MEM, MEM - 2, u64::MAX - 4] {
        assert_eq!(
            g.ret(WRITE, &[1, addr, 5]),
            err(Errno::EFAULT),
            "write from {addr:#x}"
        );
        assert_eq!(g.ret(CLOCK_GETTIME, &[0, addr]), err(Errno::EFAULT));
        assert_eq!(g.ret(UNAME, &[addr]), err(Errno::EFAULT));
        assert_eq!(g.ret(GETRANDOM, &[addr, 16, 0]), err(Errno::EFAULT));
    }
    for addr in [0u64, 0x1000, 0xf_f000, MEM, u64::MAX - 4] {
        assert_eq!(g.ret(OPENAT, &[AT_FDCWD, addr, 0]), err(Errno::EFAULT));
    }
    // A path with no NUL before the end of memory.
    g.mem.fill(MEM - 8, 8, b'a').unwrap();
    assert_eq!(g.ret(OPENAT, &[AT_FDCWD, MEM - 8, 0]), err(Errno::EFAULT));
    assert!(
        g.mem.read_vec(0, 0x2000).unwrap().iter().all(|&b| b == 0),
        "the system area was written"
    );
    assert_eq!(g.ret(WRITEV, &[1, SCRATCH, 2000]), err(Errno::EINVAL));
    assert_eq!(g.proc.stdout(), b"");
}

#[test]
fn mmap_munmap_brk_accounting_and_out_of_memory() {
    let mut g = guest();
    let brk0 = g.ret(BRK, &[0]) as u64;
    assert_eq!(brk0, 4 * MIB);
    assert_eq!(g.ret(BRK, &[brk0 + 10_000]) as u64, brk0 + 10_000);
    let a = g.ret(MMAP, &[0, 3 * 4096, 3, 0x22, u64::MAX, 0]) as u64;
    assert_eq!(a, 14 * MIB - 3 * 4096);
    assert_eq!(g.proc.memory_in_use(), 3 * 4096 + 3 * 4096);
    g.mem.fill(a, 3 * 4096, 0xee).unwrap();
    assert_eq!(g.ret(MUNMAP, &[a, 3 * 4096]), 0);
    assert_eq!(g.proc.memory_in_use(), 3 * 4096);
    assert_eq!(g.proc.peak_memory(), 6 * 4096);
    // Reused memory comes back zeroed.
    let b = g.ret(MMAP, &[0, 4096, 3, 0x22, u64::MAX, 0]) as u64;
    assert!(g.mem.read_vec(b, 4096).unwrap().iter().all(|&x| x == 0));
    assert_eq!(
        g.ret(MMAP, &[0, 0, 3, 0x22, u64::MAX, 0]),
        err(Errno::EINVAL)
    );
    assert_eq!(
        g.ret(MMAP, &[0, 4096, 3, 0x20, u64::MAX, 0]),
        err(Errno::EINVAL)
    );
    // More than is left: the run stops as out of memory; more than the guest holds at all
    // could never fit and is ENOMEM, as is growing a mapping past it.
    assert_eq!(
        g.ret(MMAP, &[0, MEM + 4096, 3, 0x22, u64::MAX, 0]),
        err(Errno::ENOMEM)
    );
    assert_eq!(
        g.ret(MREMAP, &[b, 4096, MEM + 4096, 1, 0]),
        err(Errno::ENOMEM)
    );
    assert_eq!(
        g.call(MMAP, &[0, 11 * MIB, 3, 0x22, u64::MAX, 0]),
        SyscallOutcome::Stop(RunStatus::OutOfMemory { limit_bytes: MEM })
    );
}

#[test]
fn file_mappings_copy_the_file() {
    let mut g = guest();
    let fd = g.open("/lib/data.bin", 0) as u64;
    let a = g.ret(MMAP, &[0, 8192, 1, 2, fd, 4096]) as u64;
    let got = g.mem.read_vec(a, 8192).unwrap();
    let expected: Vec<u8> = (4096..5000).map(|i| (i % 251) as u8).collect();
    assert_eq!(&got[..904], &expected[..]);
    assert!(got[904..].iter().all(|&b| b == 0));
    // A shared writable mapping could never write back: refused.
    assert_eq!(g.ret(MMAP, &[0, 4096, 3, 1, fd, 0]), err(Errno::EACCES));
    assert_eq!(g.ret(MMAP, &[0, 4096, 1, 2, 1, 0]), err(Errno::ENODEV));
}

#[test]
fn output_cap_truncates_and_stops() {
    let mut g = guest_with(b"", 10);
    assert_eq!(g.write_bytes(1, b"hello"), 5);
    assert_eq!(g.write_bytes(2, b"wor"), 3);
    g.mem.write(SCRATCH + 0x1000, b"ld and more").unwrap();
    assert_eq!(
        g.call(WRITE, &[1, SCRATCH + 0x1000, 11]),
        SyscallOutcome::Stop(RunStatus::OutputLimit { cap_bytes: 10 })
    );
    assert_eq!(g.proc.stdout(), b"hellold");
    assert_eq!(g.proc.stderr(), b"wor");
}

#[test]
fn stdin_pipes_dup_and_fcntl() {
    let mut g = guest_with(b"input!", 1 << 20);
    assert_eq!(g.read_bytes(0, 4).unwrap(), b"inpu");
    assert_eq!(g.read_bytes(0, 100).unwrap(), b"t!");
    assert_eq!(g.read_bytes(0, 100).unwrap(), b"");
    assert_eq!(g.ret(LSEEK, &[0, 0, 0]), err(Errno::ESPIPE));
    assert_eq!(g.read_bytes(1, 1), Err(err(Errno::EBADF)));
    assert_eq!(g.write_bytes(0, b"x"), err(Errno::EBADF));
    assert_eq!(g.ret(IOCTL, &[1, 0x5401, BUF]), err(Errno::ENOTTY));

    assert_eq!(g.ret(PIPE2, &[SCRATCH, O_CLOEXEC]), 0);
    let (r, w) = (
        u64::from(g.mem.read_u32(SCRATCH).unwrap()),
        u64::from(g.mem.read_u32(SCRATCH + 4).unwrap()),
    );
    assert_eq!((r, w), (3, 4));
    assert_eq!(g.ret(FCNTL, &[r, 1]), 1); // F_GETFD: FD_CLOEXEC
    assert_eq!(g.ret(FCNTL, &[r, 2, 0]), 0);
    assert_eq!(g.ret(FCNTL, &[r, 1]), 0);
    assert_eq!(g.write_bytes(w, b"through the pipe"), 16);
    let w2 = g.ret(DUP, &[w]) as u64;
    assert_eq!(w2, 5);
    assert_eq!(g.ret(FCNTL, &[w2, 1]), 0, "dup clears close-on-exec");
    assert_eq!(g.read_bytes(r, 7).unwrap(), b"through");
    assert_eq!(g.read_bytes(r, 100).unwrap(), b" the pipe");
    // Empty pipe, writer open: nonblocking gives EAGAIN, blocking can never finish.
    assert_eq!(g.ret(FCNTL, &[r, 4, O_NONBLOCK]), 0);
    assert_eq!(g.ret(FCNTL, &[r, 3]) as u64 & O_NONBLOCK, O_NONBLOCK);
    assert_eq!(g.read_bytes(r, 1), Err(err(Errno::EAGAIN)));
    assert_eq!(g.ret(FCNTL, &[r, 4, 0]), 0);
    assert_eq!(
        blocked(g.call(READ, &[r, BUF, 1])),
        Wait {
            on: WaitOn::Ready {
                epoch: 0,
                call: Call {
                    nr: READ,
                    args: [r, BUF, 1, 0, 0, 0]
                },
                host: Vec::new(),
            },
            until: None
        }
    );
    // Both write ends closed: end of file.
    assert_eq!(g.ret(CLOSE, &[w]), 0);
    assert_eq!(g.ret(CLOSE, &[w2]), 0);
    assert_eq!(g.read_bytes(r, 1).unwrap(), b"");
    assert_eq!(g.ret(CLOSE, &[w]), err(Errno::EBADF));
    // dup2 onto stdout sends output into a file.
    let f = g.open("/tmp/out.txt", O_CREAT | O_RDWR) as u64;
    assert_eq!(g.ret(DUP2, &[f, 1]), 1);
    assert_eq!(g.write_bytes(1, b"redirected"), 10);
    assert_eq!(g.proc.stdout(), b"");
    assert_eq!(g.ret(LSEEK, &[f, 0, 0]), 0);
    assert_eq!(g.read_bytes(f, 100).unwrap(), b"redirected");
}

#[test]
fn getrandom_gives_fresh_bytes() {
    let mut g = guest();
    assert_eq!(g.ret(GETRANDOM, &[BUF, 32, 0]), 32);
    assert_eq!(g.ret(GETRANDOM, &[BUF + 32, 32, 1]), 32);
    let bytes = g.mem.read_vec(BUF, 64).unwrap();
    assert_ne!(bytes[..32], bytes[32..]);
    assert_ne!(bytes[..32], [0u8; 32]);
    assert_eq!(g.ret(GETRANDOM, &[BUF, 32, 0x80]), err(Errno::EINVAL));
}

#[test]
fn files_from_the_image_and_the_overlay() {
    let mut g = guest();
    assert_eq!(g.open("/etc/shadow", 0), err(Errno::ENOENT));
    assert_eq!(g.open("/etc/passwd", O_WRONLY), err(Errno::EROFS));
    assert_eq!(g.open("/etc/new", O_CREAT | O_WRONLY), err(Errno::EROFS));
    let fd = g.open("/etc/passwd", 0) as u64;
    assert_eq!(fd, 3);
    assert_eq!(g.read_bytes(fd, 4096).unwrap(), PASSWD);
    assert_eq!(g.ret(FSTAT, &[fd, BUF]), 0);
    assert_eq!(g.mem.read_u64(BUF + 48).unwrap(), PASSWD.len() as u64);
    assert_eq!(g.mem.read_u32(BUF + 24).unwrap() & 0o170000, 0o100000);
    assert_eq!(g.write_bytes(fd, b"x"), err(Errno::EBADF));

    // The working directory is writable; relative paths resolve from it.
    let f = g.open("notes.txt", O_CREAT | O_RDWR) as u64;
    assert_eq!(g.write_bytes(f, b"abc"), 3);
    let p = g.cstr(SCRATCH, "/work/notes.txt");
    assert_eq!(g.ret(NEWFSTATAT, &[AT_FDCWD, p, BUF, 0]), 0);
    assert_eq!(g.mem.read_u64(BUF + 48).unwrap(), 3);
    assert_eq!(g.ret(GETCWD, &[BUF, 100]), 6);
    assert_eq!(g.mem.read_vec(BUF, 6).unwrap(), b"/work\0");
    assert_eq!(g.ret(GETCWD, &[BUF, 3]), err(Errno::ERANGE));

    let d = g.cstr(SCRATCH + 0x200, "/tmp/d");
    assert_eq!(g.ret(MKDIRAT, &[AT_FDCWD, d, 0o755]), 0);
    assert_eq!(g.ret(MKDIRAT, &[AT_FDCWD, d, 0o755]), err(Errno::EEXIST));
    let etc = g.cstr(SCRATCH, "/etc/d");
    assert_eq!(g.ret(MKDIRAT, &[AT_FDCWD, etc, 0o755]), err(Errno::EROFS));
    let x = g.open("/tmp/d/x", O_CREAT | O_WRONLY) as u64;
    assert_eq!(g.ret(CLOSE, &[x]), 0);
    let dfd = g.open("/tmp/d", O_DIRECTORY) as u64;
    let n = g.ret(GETDENTS64, &[dfd, BUF, 4096]);
    assert!(n > 0);
    let names = dirent_names(&g.mem.read_vec(BUF, n as u64).unwrap());
    assert_eq!(names, vec![b".".to_vec(), b"..".to_vec(), b"x".to_vec()]);
    assert_eq!(g.ret(GETDENTS64, &[dfd, BUF, 4096]), 0);
    assert_eq!(g.ret(LSEEK, &[dfd, 0, 0]), 0);
    assert_eq!(g.ret(GETDENTS64, &[dfd, BUF, 10]), err(Errno::EINVAL));

    let xp = g.cstr(SCRATCH, "/tmp/d/x");
    assert_eq!(g.ret(UNLINKAT, &[AT_FDCWD, xp, 0]), 0);
    assert_eq!(g.ret(UNLINKAT, &[AT_FDCWD, d, 0x200]), 0);
    let pw = g.cstr(SCRATCH + 0x300, "/etc/passwd");
    assert_eq!(g.ret(UNLINKAT, &[AT_FDCWD, pw, 0]), err(Errno::EROFS));

    let usr = g.cstr(SCRATCH, "/usr");
    assert_eq!(g.ret(CHDIR, &[usr]), 0);
    assert_eq!(g.open("lib/data.bin", 0), 6);
    assert_eq!(g.ret(CHDIR, &[pw]), err(Errno::ENOTDIR));
}

fn dirent_names(buf: &[u8]) -> Vec<Vec<u8>> {
    let mut names = Vec::new();
    let mut off = 0;
    while off < buf.len() {
        let reclen = u16::from_le_bytes([buf[off + 16], buf[off + 17]]) as usize;
        let name = &buf[off + 19..off + reclen];
        names.push(name[..name.iter().position(|&b| b == 0).unwrap()].to_vec());
        off += reclen;
    }
    names
}

#[test]
fn futex_waits_block_and_wakes_count_waiters() {
    const FUTEX_WAIT_PRIVATE: u64 = 128;
    const FUTEX_WAKE_PRIVATE: u64 = 129;
    const FUTEX_WAIT_BITSET_REALTIME: u64 = 9 | 256;
    let mut g = guest();
    g.mem.write_u32(BUF, 7).unwrap();
    assert_eq!(
        g.ret(FUTEX, &[BUF, FUTEX_WAIT_PRIVATE, 8, 0]),
        err(Errno::EAGAIN)
    );
    assert_eq!(
        g.ret(FUTEX, &[BUF, FUTEX_WAKE_PRIVATE, 1]),
        0,
        "nobody waits"
    );
    assert_eq!(
        blocked(g.call(FUTEX, &[BUF, FUTEX_WAIT_PRIVATE, 7, 0])),
        Wait {
            on: WaitOn::Futex {
                addr: BUF,
                bitset: u32::MAX
            },
            until: None
        }
    );
    // A relative timeout of 1 ms; an absolute CLOCK_REALTIME one a second from now.
    g.mem.write_u64(SCRATCH, 0).unwrap();
    g.mem.write_u64(SCRATCH + 8, 1_000_000).unwrap();
    let until = blocked(g.call(FUTEX, &[BUF, FUTEX_WAIT_PRIVATE, 7, SCRATCH]))
        .until
        .unwrap();
    assert!(until <= Instant::now() + Duration::from_millis(1));
    let now = super::time::now_ns(super::time::CLOCK_REALTIME).unwrap();
    g.mem.write_u64(SCRATCH, now / 1_000_000_000 + 1).unwrap();
    g.mem.write_u64(SCRATCH + 8, now % 1_000_000_000).unwrap();
    let wait = blocked(g.call(
        FUTEX,
        &[BUF, FUTEX_WAIT_BITSET_REALTIME, 7, SCRATCH, 0, 0b10],
    ));
    assert_eq!(
        wait.on,
        WaitOn::Futex {
            addr: BUF,
            bitset: 0b10
        }
    );
    let left = wait.until.unwrap() - Instant::now();
    assert!(
        left > Duration::from_millis(900) && left <= Duration::from_secs(1),
        "{left:?}"
    );
    assert_eq!(
        g.ret(FUTEX, &[BUF, 9, 7, 0, 0, 0]),
        err(Errno::EINVAL),
        "an empty bitset"
    );
    assert_eq!(
        g.ret(FUTEX, &[BUF + 1, FUTEX_WAKE_PRIVATE, 1]),
        err(Errno::EINVAL)
    );
    assert_eq!(
        g.ret(FUTEX, &[BUF, 6, 1]),
        err(Errno::ENOSYS),
        "FUTEX_LOCK_PI"
    );
    // CMP_REQUEUE compares the word; WAKE_OP updates the second word.
    assert_eq!(
        g.ret(FUTEX, &[BUF, 4, 1, 1, BUF + 8, 8]),
        err(Errno::EAGAIN)
    );
    assert_eq!(g.ret(FUTEX, &[BUF, 4, 1, 1, BUF + 8, 7]), 0);
    g.mem.write_u32(BUF + 8, 5).unwrap();
    let add_2 = (1 << 28) | (2 << 12);
    assert_eq!(g.ret(FUTEX, &[BUF, 5, 1, 1, BUF + 8, add_2]), 0);
    assert_eq!(g.mem.read_u32(BUF + 8).unwrap(), 7);
}

#[test]
fn clone_makes_threads_of_pthreads_flag_set_only() {
    const CLONE3: u64 = 435;
    const EXIT: u64 = 60;
    const SET_TID_ADDRESS: u64 = 218;
    const PTHREAD_FLAGS: u64 = 0x3d0f00;
    let mut g = guest();
    assert_eq!(
        g.ret(CLONE, &[PTHREAD_FLAGS, 0x100_0000, BUF, BUF + 4, 0x20_0000]),
        err(Errno::ENOSYS),
        "a vCPU that cannot switch threads: none"
    );
    g.proc.threads.switching = true;
    g.proc.set_thread_limit(3);
    assert!(
        matches!(
            g.call(CLONE, &[0x1200011, 0, 0, BUF, 0]),
            SyscallOutcome::Fork(ref fork) if fork.exit_signal == 17 && fork.child_tid == Some(BUF)
        ),
        "fork's flags: a new process"
    );
    assert_eq!(
        g.ret(CLONE, &[0x100 | 17, 0, 0, 0, 0]),
        err(Errno::EINVAL),
        "shared memory without vfork"
    );
    assert_eq!(
        g.ret(CLONE, &[PTHREAD_FLAGS | 0x4000, 0, 0, 0, 0]),
        err(Errno::EINVAL),
        "CLONE_VFORK with a thread"
    );
    assert_eq!(
        g.ret(CLONE, &[PTHREAD_FLAGS, 0x100_0000, 0, BUF + 4, 0x20_0000]),
        err(Errno::EFAULT),
        "CLONE_PARENT_SETTID at NULL"
    );
    // clone(): the parent's tid word is written, the child's clear_child_tid recorded.
    let SyscallOutcome::Spawned(start) =
        g.call(CLONE, &[PTHREAD_FLAGS, 0x100_0000, BUF, BUF + 4, 0x20_0000])
    else {
        panic!("no thread")
    };
    assert_eq!(
        (start.tid, start.stack, start.tls),
        (2, 0x100_0000, Some(0x20_0000))
    );
    assert_eq!(g.mem.read_u32(BUF).unwrap(), 2);
    assert_eq!(g.proc.threads.get(2).unwrap().clear_child_tid, BUF + 4);
    // clone3(): the stack pointer is stack + stack_size; unknown trailing fields must be zero.
    let args = SCRATCH + 0x800;
    let fields = [
        PTHREAD_FLAGS,
        0,
        BUF + 12,
        BUF + 8,
        0,
        0x200_0000,
        0x1_0000,
        0x30_0000,
        0,
        0,
        0,
    ];
    for (i, v) in fields.iter().enumerate() {
        g.mem.write_u64(args + 8 * i as u64, *v).unwrap();
    }
    g.mem.write_u64(args + 88, 1).unwrap();
    assert_eq!(g.ret(CLONE3, &[args, 96]), err(Errno::E2BIG));
    assert_eq!(g.ret(CLONE3, &[args, 32]), err(Errno::EINVAL));
    let SyscallOutcome::Spawned(start) = g.call(CLONE3, &[args, 88]) else {
        panic!("no thread")
    };
    assert_eq!((start.tid, start.stack), (3, 0x201_0000));
    assert_eq!(
        g.ret(CLONE3, &[args, 88]),
        err(Errno::EAGAIN),
        "the limit of 3"
    );
    assert_eq!(g.proc.threads.counters.refused, 1);
    // Thread 2 runs: its own tid; its exit zeroes its clear_child_tid word and wakes a joiner.
    g.proc.threads.block_current(Wait {
        on: WaitOn::Futex {
            addr: BUF + 4,
            bitset: u32::MAX,
        },
        until: None,
    });
    assert!(matches!(
        g.proc.threads.next(Instant::now()),
        crate::process::threads::Next::Run { tid: 2, .. }
    ));
    assert_eq!(g.ret(GETTID, &[]), 2);
    assert_eq!(g.ret(SET_TID_ADDRESS, &[BUF + 4]), 2);
    g.mem.write_u32(BUF + 4, 2).unwrap();
    assert_eq!(g.call(EXIT, &[0]), SyscallOutcome::ThreadExited);
    assert_eq!(g.mem.read_u32(BUF + 4).unwrap(), 0);
    assert_eq!(
        g.proc.threads.get(1).unwrap().state,
        crate::process::threads::ThreadState::Runnable(crate::process::threads::Resume::Return(0))
    );
    assert_eq!(g.proc.threads.alive(), 2);
}

#[test]
fn sleeps_block_the_thread_until_their_time() {
    let mut g = guest();
    g.mem.write_u64(SCRATCH, 30).unwrap();
    g.mem.write_u64(SCRATCH + 8, 0).unwrap();
    let wait = blocked(g.call(NANOSLEEP, &[SCRATCH, 0]));
    assert_eq!(wait.on, WaitOn::Sleep);
    let left = wait.until.unwrap() - Instant::now();
    assert!(
        left > Duration::from_secs(29) && left <= Duration::from_secs(30),
        "{left:?}"
    );
    g.mem.write_u64(SCRATCH + 8, 1_000_000_000).unwrap();
    assert_eq!(g.ret(NANOSLEEP, &[SCRATCH, 0]), err(Errno::EINVAL));
}

#[test]
fn signals_sent_to_self() {
    use crate::process::signals::{self, Taken};
    let mut g = guest();
    // SIGCHLD's default is to ignore; SIGTERM's is to terminate.
    assert_eq!(g.ret(KILL, &[1, 17]), 0);
    assert!(signals::take(&mut g.proc, 1).is_none());
    assert_eq!(g.ret(KILL, &[2, 15]), err(Errno::ESRCH));
    assert_eq!(g.ret(KILL, &[-1i64 as u64, 15]), err(Errno::ESRCH));
    assert_eq!(g.ret(KILL, &[1, 0]), 0);
    assert_eq!(g.ret(KILL, &[1, 65]), err(Errno::EINVAL));
    assert_eq!(signals::ready_for(&g.proc, 1), 0);
    // raise(): all signals blocked around tgkill, then the mask is restored and it is taken.
    g.mem.write_u64(SCRATCH, u64::MAX).unwrap();
    assert_eq!(g.ret(RT_SIGPROCMASK, &[0, SCRATCH, 0, 8]), 0);
    assert_eq!(g.ret(TGKILL, &[1, 1, 6]), 0);
    assert_eq!(signals::ready_for(&g.proc, 1), 0);
    assert_eq!(g.ret(RT_SIGPENDING, &[BUF, 8]), 0);
    assert_eq!(g.mem.read_u64(BUF).unwrap(), 1 << 5);
    g.mem.write_u64(SCRATCH, 0).unwrap();
    assert_eq!(g.ret(RT_SIGPROCMASK, &[2, SCRATCH, 0, 8]), 0);
    assert!(matches!(
        signals::take(&mut g.proc, 1),
        Some(Taken::End(RunStatus::Exited { code: 134 }))
    ));
    // An installed handler is what the next signal runs, with its flags and mask.
    let mut g = guest();
    let act = [0x40_1000u64, 0x0400_0000, 0x40_2000, 1 << 1];
    for (i, v) in act.iter().enumerate() {
        g.mem.write_u64(SCRATCH + 8 * i as u64, *v).unwrap();
    }
    assert_eq!(g.ret(RT_SIGACTION, &[10, SCRATCH, 0, 8]), 0);
    assert_eq!(g.ret(RT_SIGACTION, &[10, 0, BUF, 8]), 0);
    assert_eq!(g.mem.read_u64(BUF).unwrap(), 0x40_1000);
    assert_eq!(g.ret(RT_SIGACTION, &[9, SCRATCH, 0, 8]), err(Errno::EINVAL));
    assert_eq!(g.ret(KILL, &[0, 10]), 0);
    match signals::take(&mut g.proc, 1) {
        Some(Taken::Handler {
            sig: 10,
            action,
            info,
        }) => {
            assert_eq!((action.handler, action.mask), (0x40_1000, 1 << 1));
            assert_eq!(info[8..12], signals::SI_USER.to_le_bytes());
        }
        _ => panic!("SIGUSR1 should run its handler"),
    }
    // A signal to the thread itself is SI_TKILL; to a thread that does not exist, ESRCH.
    assert_eq!(g.ret(TKILL, &[1, 10]), 0);
    match signals::take(&mut g.proc, 1) {
        Some(Taken::Handler { sig: 10, info, .. }) => {
            assert_eq!(info[8..12], signals::SI_TKILL.to_le_bytes())
        }
        _ => panic!("SIGUSR1 should run its handler"),
    }
    assert_eq!(g.ret(TKILL, &[7, 10]), err(Errno::ESRCH));
}

#[test]
fn job_control_signals_stop_continue_and_discard_each_other() {
    use crate::process::signals::JobReport;
    use crate::process::signals::{self, Taken, SIGCONT, SIGSTOP, SIGTSTP};
    let mut g = guest();
    let entry = |g: &Guest| g.proc.tree.get(1).cloned().unwrap();
    // SIGSTOP stops the process: its entry says so for the parent's wait.
    assert_eq!(g.ret(KILL, &[1, SIGSTOP]), 0);
    assert!(matches!(signals::take(&mut g.proc, 1), Some(Taken::Stop)));
    assert_eq!(entry(&g).stopped, Some(SIGSTOP));
    assert_eq!(entry(&g).job_report, Some(JobReport::Stopped(SIGSTOP)));
    // SIGCONT continues it even when ignored, and is then not queued.
    g.mem.write_u64(SCRATCH, signals::SIG_IGN).unwrap();
    for i in 1..4 {
        g.mem.write_u64(SCRATCH + 8 * i, 0).unwrap();
    }
    assert_eq!(g.ret(RT_SIGACTION, &[SIGCONT, SCRATCH, 0, 8]), 0);
    assert_eq!(g.ret(KILL, &[1, SIGCONT]), 0);
    assert_eq!(entry(&g).stopped, None);
    assert_eq!(entry(&g).job_report, Some(JobReport::Continued));
    assert_eq!(signals::ready_for(&g.proc, 1), 0);
    // Blocked, a stop and SIGCONT stay pending, and each discards the other.
    g.mem.write_u64(SCRATCH, u64::MAX).unwrap();
    assert_eq!(g.ret(RT_SIGPROCMASK, &[0, SCRATCH, 0, 8]), 0);
    assert_eq!(g.ret(KILL, &[1, SIGTSTP]), 0);
    assert_eq!(g.ret(RT_SIGPENDING, &[BUF, 8]), 0);
    assert_eq!(g.mem.read_u64(BUF).unwrap(), signals::bit(SIGTSTP));
    assert_eq!(g.ret(KILL, &[1, SIGCONT]), 0);
    assert_eq!(g.ret(RT_SIGPENDING, &[BUF, 8]), 0);
    assert_eq!(g.mem.read_u64(BUF).unwrap(), signals::bit(SIGCONT));
    assert_eq!(g.ret(KILL, &[1, SIGTSTP]), 0);
    assert_eq!(g.ret(RT_SIGPENDING, &[BUF, 8]), 0);
    assert_eq!(g.mem.read_u64(BUF).unwrap(), signals::bit(SIGTSTP));
    // The first process's group is orphaned (its parent is outside): a terminal's stop
    // signal is discarded there, as Linux discards it.
    g.mem.write_u64(SCRATCH, 0).unwrap();
    assert_eq!(g.ret(RT_SIGPROCMASK, &[2, SCRATCH, 0, 8]), 0);
    assert!(signals::take(&mut g.proc, 1).is_none());
    assert_eq!(entry(&g).stopped, None);
}

#[test]
fn interval_timer() {
    const GETITIMER: u64 = 36;
    const ALARM: u64 = 37;
    const SETITIMER: u64 = 38;
    let mut g = guest();
    assert_eq!(g.ret(ALARM, &[5]), 0);
    assert_eq!(g.ret(ALARM, &[0]), 5);
    assert!(g.proc.signals.timer.is_none());
    // 50 ms once, then every 10 ms.
    for (i, v) in [0u64, 10_000, 0, 50_000].iter().enumerate() {
        g.mem.write_u64(SCRATCH + 8 * i as u64, *v).unwrap();
    }
    assert_eq!(g.ret(SETITIMER, &[0, SCRATCH, 0]), 0);
    assert_eq!(g.ret(GETITIMER, &[0, BUF]), 0);
    assert_eq!(g.mem.read_u64(BUF + 8).unwrap(), 10_000);
    assert!((40_000..=50_000).contains(&g.mem.read_u64(BUF + 24).unwrap()));
    assert_eq!(g.ret(SETITIMER, &[3, SCRATCH, 0]), err(Errno::EINVAL));
    g.mem.write_u64(SCRATCH + 8, 1_000_000).unwrap();
    assert_eq!(g.ret(SETITIMER, &[0, SCRATCH, 0]), err(Errno::EINVAL));
    let due = g.proc.signals.timer.unwrap().next;
    crate::process::signals::fire_timers(&mut g.proc, due);
    assert_eq!(g.proc.signals.pending, 1 << 13);
    assert_eq!(
        g.proc.signals.timer.unwrap().next,
        due + std::time::Duration::from_millis(10)
    );
}

#[test]
fn cpu_time_interval_timers_count_the_process_cpu_time() {
    const GETITIMER: u64 = 36;
    const SETITIMER: u64 = 38;
    const ITIMER_VIRTUAL: u64 = 1;
    const ITIMER_PROF: u64 = 2;
    let mut g = guest();
    // ITIMER_VIRTUAL: 50 ms of CPU time once, then every 10 ms.
    for (i, v) in [0u64, 10_000, 0, 50_000].iter().enumerate() {
        g.mem.write_u64(SCRATCH + 8 * i as u64, *v).unwrap();
    }
    assert_eq!(g.ret(SETITIMER, &[ITIMER_VIRTUAL, SCRATCH, 0]), 0);
    assert_eq!(g.ret(GETITIMER, &[ITIMER_VIRTUAL, BUF]), 0);
    assert_eq!(g.mem.read_u64(BUF + 8).unwrap(), 10_000);
    assert_eq!(
        g.mem.read_u64(BUF + 24).unwrap(),
        50_000,
        "no CPU time used yet"
    );
    assert_eq!(g.ret(GETITIMER, &[ITIMER_PROF, BUF]), 0);
    assert_eq!(
        g.mem.read_u64(BUF + 24).unwrap(),
        0,
        "the other stays disarmed"
    );
    let now = std::time::Instant::now();
    g.proc.threads.current_mut().cpu_ns = 49_000_000;
    crate::process::signals::fire_timers(&mut g.proc, now);
    assert_eq!(
        g.proc.signals.pending, 0,
        "not due before 50 ms of CPU time"
    );
    g.proc.threads.current_mut().cpu_ns = 51_000_000;
    crate::process::signals::fire_timers(&mut g.proc, now);
    assert_eq!(g.proc.signals.pending, 1 << 25, "SIGVTALRM");
    assert_eq!(
        g.proc.signals.cpu_timers[0].map(|t| t.next_ns),
        Some(61_000_000),
        "re-armed an interval on"
    );
    // Disarming reads back zero.
    g.mem.write_u64(SCRATCH + 24, 0).unwrap();
    g.mem.write_u64(SCRATCH + 8, 0).unwrap();
    assert_eq!(g.ret(SETITIMER, &[ITIMER_VIRTUAL, SCRATCH, BUF]), 0);
    assert_eq!(g.mem.read_u64(BUF + 24).unwrap(), 10_000, "the old value");
    assert!(g.proc.signals.cpu_timers[0].is_none());
}

#[test]
fn sigtimedwait_takes_a_pending_signal_without_its_handler() {
    const RT_SIGTIMEDWAIT: u64 = 128;
    const SIGUSR1: u64 = 10;
    let mut g = guest();
    g.mem.write_u64(SCRATCH, 1 << (SIGUSR1 - 1)).unwrap();
    // A zero timeout polls: nothing pending is EAGAIN.
    g.mem.write_u64(SCRATCH + 16, 0).unwrap();
    g.mem.write_u64(SCRATCH + 24, 0).unwrap();
    assert_eq!(
        g.ret(RT_SIGTIMEDWAIT, &[SCRATCH, BUF, SCRATCH + 16, 8]),
        err(Errno::EAGAIN)
    );
    assert_eq!(
        g.ret(RT_SIGTIMEDWAIT, &[SCRATCH, BUF, SCRATCH + 16, 4]),
        err(Errno::EINVAL)
    );
    g.proc.signals.pending |= 1 << (SIGUSR1 - 1);
    assert_eq!(
        g.ret(RT_SIGTIMEDWAIT, &[SCRATCH, BUF, 0, 8]),
        SIGUSR1 as i64
    );
    assert_eq!(g.mem.read_u32(BUF).unwrap(), SIGUSR1 as u32, "si_signo");
    assert_eq!(g.mem.read_u32(BUF + 8).unwrap(), 0, "si_code SI_USER");
    assert_eq!(g.proc.signals.pending, 0, "taken");
    // With nothing pending and no timeout it waits.
    assert!(matches!(
        g.call(RT_SIGTIMEDWAIT, &[SCRATCH, 0, 0, 8]),
        SyscallOutcome::Block(_)
    ));
}

#[test]
fn fs_base_and_limits() {
    let mut g = guest();
    assert_eq!(
        g.call(ARCH_PRCTL, &[0x1002, 0x7000_1234]),
        SyscallOutcome::SetFsBase(0x7000_1234)
    );
    assert_eq!(g.ret(ARCH_PRCTL, &[0x1003, BUF]), 0);
    assert_eq!(g.mem.read_u64(BUF).unwrap(), 0x7000_1234);
    assert_eq!(g.ret(ARCH_PRCTL, &[0x1001, 0]), err(Errno::EINVAL));
    // AMX tile data (component 18) is refused, so programs fall back; AVX is granted.
    assert_eq!(g.ret(ARCH_PRCTL, &[0x1023, 18]), err(Errno::EOPNOTSUPP));
    assert_eq!(g.ret(ARCH_PRCTL, &[0x1023, 2]), 0);
    assert_eq!(g.ret(ARCH_PRCTL, &[0x1023, 64]), err(Errno::EINVAL));
    assert_eq!(g.ret(ARCH_PRCTL, &[0x1022, BUF]), 0);
    assert_eq!(g.mem.read_u64(BUF).unwrap() & (1 << 18), 0);
    // RLIMIT_AS is the guest memory; RLIMIT_NOFILE can be lowered and is enforced.
    assert_eq!(g.ret(PRLIMIT64, &[0, 9, 0, BUF]), 0);
    assert_eq!(g.mem.read_u64(BUF).unwrap(), MEM);
    g.mem.write_u64(SCRATCH, 4).unwrap();
    g.mem.write_u64(SCRATCH + 8, 4).unwrap();
    assert_eq!(g.ret(PRLIMIT64, &[0, 7, SCRATCH, 0]), 0);
    assert_eq!(g.ret(DUP, &[1]), 3);
    assert_eq!(g.ret(DUP, &[1]), err(Errno::EMFILE));
    g.mem.write_u64(SCRATCH + 8, 1 << 20).unwrap();
    assert_eq!(g.ret(PRLIMIT64, &[0, 7, SCRATCH, 0]), err(Errno::EPERM));
    assert_eq!(g.ret(PRLIMIT64, &[0, 9, SCRATCH, 0]), err(Errno::EPERM));
    // RLIMIT_NPROC is the sandbox's process limit.
    g.proc.set_process_limit(5);
    assert_eq!(g.ret(PRLIMIT64, &[0, 6, 0, BUF]), 0);
    assert_eq!(g.mem.read_u64(BUF).unwrap(), 5);
    assert_eq!(g.mem.read_u64(BUF + 8).unwrap(), 5);
    // It can be lowered (soft up to hard, hard never up) and bounds forks.
    let nproc = |g: &mut Guest, soft: u64, hard: u64| {
        g.mem.write_u64(SCRATCH, soft).unwrap();
        g.mem.write_u64(SCRATCH + 8, hard).unwrap();
        g.ret(PRLIMIT64, &[0, 6, SCRATCH, 0])
    };
    assert_eq!(nproc(&mut g, 5, 6), err(Errno::EPERM));
    assert_eq!(nproc(&mut g, 4, 3), err(Errno::EINVAL));
    assert_eq!(nproc(&mut g, 1, 3), 0);
    assert!(matches!(
        g.call(CLONE, &[17, 0, 0, 0, 0]),
        SyscallOutcome::Fork(_)
    ));
    assert_eq!(
        g.proc.tree.add_child(1, 0, 17),
        None,
        "one process: at the soft limit"
    );
    assert_eq!(nproc(&mut g, 3, 3), 0);
    assert_eq!(g.ret(PRLIMIT64, &[0, 6, 0, BUF]), 0);
    assert_eq!(
        g.mem.read_vec(BUF, 16).unwrap(),
        [3u64.to_le_bytes(), 3u64.to_le_bytes()].concat()
    );
    assert_eq!(nproc(&mut g, 3, 4), err(Errno::EPERM));
    assert_eq!(g.ret(UNAME, &[BUF]), 0);
    assert_eq!(g.mem.read_vec(BUF, 6).unwrap(), b"Linux\0");
    assert_eq!(g.mem.read_vec(BUF + 65, 9).unwrap(), b"sandfork\0");
}

#[test]
fn a_pidfd_turns_readable_when_its_process_ends_and_names_none_once_reaped() {
    const WAITID: u64 = 247;
    const PIDFD_SEND_SIGNAL: u64 = 424;
    const PIDFD_OPEN: u64 = 434;
    const PIDFD_GETFD: u64 = 438;
    const P_PIDFD: u64 = 3;
    const WEXITED: u64 = 4;
    let mut g = guest();
    assert_eq!(g.ret(PIDFD_OPEN, &[u64::MAX, 0]), err(Errno::EINVAL));
    assert_eq!(g.ret(PIDFD_OPEN, &[1, 1]), err(Errno::EINVAL));
    assert_eq!(g.ret(PIDFD_OPEN, &[9999, 0]), err(Errno::ESRCH));
    let child = g.proc.tree.add_child(1, 0, 17).unwrap();
    let fd = g.ret(PIDFD_OPEN, &[child, O_NONBLOCK]) as u64;
    assert_eq!(g.proc.fds.cloexec(fd), Ok(true));
    let poll = |g: &mut Guest| {
        g.mem
            .write(SCRATCH, &[fd as u8, 0, 0, 0, 1, 0, 0, 0])
            .unwrap();
        g.ret(POLL, &[SCRATCH, 1, 0]);
        u16::from_le_bytes(g.mem.read_vec(SCRATCH + 6, 2).unwrap().try_into().unwrap())
    };
    assert_eq!(poll(&mut g), 0, "alive");
    assert_eq!(
        g.ret(WAITID, &[P_PIDFD, fd, BUF, WEXITED, 0]),
        err(Errno::EAGAIN)
    );
    assert_eq!(g.ret(PIDFD_SEND_SIGNAL, &[fd, 15, 0, 0]), 0);
    assert_eq!(g.proc.tree.get(child).unwrap().signals, 1 << 14);
    assert_eq!(
        g.ret(PIDFD_SEND_SIGNAL, &[fd, 15, 0, 1]),
        err(Errno::EINVAL)
    );
    assert_eq!(g.ret(PIDFD_SEND_SIGNAL, &[1, 15, 0, 0]), err(Errno::EBADF));
    assert_eq!(
        g.ret(WAITID, &[P_PIDFD, 1, BUF, WEXITED, 0]),
        err(Errno::EBADF)
    );
    assert_eq!(g.ret(READ, &[fd, BUF, 8]), err(Errno::EINVAL));
    g.proc.tree.ended(child, 3 << 8, 1);
    assert_eq!(poll(&mut g), 1, "ended: POLLIN");
    assert_eq!(g.ret(WAITID, &[P_PIDFD, fd, BUF, WEXITED, 0]), 0);
    assert_eq!(
        u64::from(g.mem.read_u32(BUF + 16).unwrap()),
        child,
        "si_pid"
    );
    assert_eq!(poll(&mut g), 1 | 0x10, "reaped: POLLIN | POLLHUP");
    assert_eq!(g.ret(PIDFD_SEND_SIGNAL, &[fd, 15, 0, 0]), err(Errno::ESRCH));
    assert_eq!(g.ret(PIDFD_GETFD, &[fd, 1, 0]), err(Errno::ESRCH));
    let next = g.proc.tree.add_child(1, 0, 17).unwrap();
    assert_ne!(next, child, "a reaped process's pid is not given again");
    // The caller's own pidfd copies its own fds.
    let own = g.ret(PIDFD_OPEN, &[1, 0]) as u64;
    let copy = g.ret(PIDFD_GETFD, &[own, 1, 0]) as u64;
    assert_eq!(g.write_bytes(copy, b"out"), 3);
    assert_eq!(g.proc.fds.cloexec(copy), Ok(true));
    assert_eq!(g.ret(PIDFD_GETFD, &[own, 99, 0]), err(Errno::EBADF));
}

#[test]
fn poll_and_select_report_readiness() {
    const POLL: u64 = 7;
    const SELECT: u64 = 23;
    let mut g = guest();
    assert_eq!(g.ret(PIPE2, &[SCRATCH, 0]), 0);
    let (r, w) = (3u64, 4u64);
    let pollfds = SCRATCH + 0x100;
    let entries: [(i32, u16); 4] = [(r as i32, 1), (w as i32, 4), (99, 1), (-1, 1)];
    for (i, (fd, events)) in entries.iter().enumerate() {
        g.mem
            .write(pollfds + 8 * i as u64, &fd.to_le_bytes())
            .unwrap();
        g.mem
            .write(pollfds + 8 * i as u64 + 4, &events.to_le_bytes())
            .unwrap();
        g.mem
            .write(pollfds + 8 * i as u64 + 6, &0xffffu16.to_le_bytes())
            .unwrap();
    }
    let revents = |g: &Guest, i: u64| {
        u16::from_le_bytes(
            g.mem
                .read_vec(pollfds + 8 * i + 6, 2)
                .unwrap()
                .try_into()
                .unwrap(),
        )
    };
    assert_eq!(g.ret(POLL, &[pollfds, 4, 0]), 2);
    assert_eq!(
        (
            revents(&g, 0),
            revents(&g, 1),
            revents(&g, 2),
            revents(&g, 3)
        ),
        (0, 4, 0x20, 0)
    );
    assert_eq!(g.write_bytes(w, b"x"), 1);
    assert_eq!(g.ret(POLL, &[pollfds, 2, u64::MAX]), 2);
    assert_eq!(revents(&g, 0), 1);
    assert_eq!(g.read_bytes(r, 1).unwrap(), b"x");
    // Only the empty read end: the thread waits (20 ms, or without a timeout), and the attempt
    // after the timeout reports nothing.
    let until = ready_wait(g.call(POLL, &[pollfds, 1, 20])).unwrap();
    assert!(until <= Instant::now() + Duration::from_millis(20));
    assert_eq!(ready_wait(g.call(POLL, &[pollfds, 1, u64::MAX])), None);
    g.proc.threads.current_mut().last_attempt = true;
    assert_eq!(g.ret(POLL, &[pollfds, 1, 20]), 0);
    g.proc.threads.current_mut().last_attempt = false;
    // A retry (after another thread's progress) waits until its first attempt's timer.
    g.proc.threads.current_mut().retry_until = Some(until);
    assert_eq!(ready_wait(g.call(POLL, &[pollfds, 1, 20])), Some(until));
    g.proc.threads.current_mut().retry_until = None;

    // select: fd 3 readable once data is in; an unopened fd in a set is EBADF.
    let readfds = SCRATCH + 0x200;
    g.mem.write_u64(readfds, 1 << r).unwrap();
    g.mem.write_u64(SCRATCH + 0x300, 0).unwrap();
    g.mem.write_u64(SCRATCH + 0x308, 0).unwrap();
    assert_eq!(g.ret(SELECT, &[5, readfds, 0, 0, SCRATCH + 0x300]), 0);
    assert_eq!(g.mem.read_u64(readfds).unwrap(), 0);
    assert_eq!(g.write_bytes(w, b"y"), 1);
    g.mem.write_u64(readfds, (1 << r) | 1).unwrap();
    assert_eq!(g.ret(SELECT, &[5, readfds, 0, 0, 0]), 2);
    assert_eq!(g.mem.read_u64(readfds).unwrap(), (1 << r) | 1);
    g.mem.write_u64(readfds, 1 << 7).unwrap();
    assert_eq!(g.ret(SELECT, &[8, readfds, 0, 0, 0]), err(Errno::EBADF));
}

#[test]
fn chmod_changes_overlay_modes_only() {
    const CHMOD: u64 = 90;
    let mut g = guest();
    let f = g.open("/tmp/f", O_CREAT | O_WRONLY) as u64;
    let p = g.cstr(SCRATCH + 0x400, "/tmp/f");
    assert_eq!(g.ret(CHMOD, &[p, 0o600]), 0);
    assert_eq!(g.ret(FSTAT, &[f, BUF]), 0);
    assert_eq!(g.mem.read_u32(BUF + 24).unwrap() & 0o7777, 0o600);
    let pw = g.cstr(SCRATCH + 0x400, "/etc/passwd");
    assert_eq!(g.ret(CHMOD, &[pw, 0o600]), err(Errno::EROFS));
}

#[test]
fn utimensat_sets_overlay_mtime() {
    const UTIMENSAT: u64 = 280;
    let mut g = guest();
    let f = g.open("/tmp/t", O_CREAT | O_WRONLY) as u64;
    let p = g.cstr(SCRATCH + 0x400, "/tmp/t");
    let times = SCRATCH + 0x500;
    for (i, v) in [1u64, 0, 1_700_000_000, 5].iter().enumerate() {
        g.mem.write_u64(times + 8 * i as u64, *v).unwrap();
    }
    assert_eq!(g.ret(UTIMENSAT, &[AT_FDCWD, p, times, 0]), 0);
    assert_eq!(g.ret(FSTAT, &[f, BUF]), 0);
    assert_eq!(
        (
            g.mem.read_u64(BUF + 88).unwrap(),
            g.mem.read_u64(BUF + 96).unwrap()
        ),
        (1_700_000_000, 5)
    );
    // NULL times: now.
    assert_eq!(g.ret(UTIMENSAT, &[f, 0, 0, 0]), 0);
    assert_eq!(g.ret(FSTAT, &[f, BUF]), 0);
    assert!(g.mem.read_u64(BUF + 88).unwrap() > 1_700_000_000);
    g.mem.write_u64(times + 24, 1_000_000_000).unwrap();
    assert_eq!(
        g.ret(UTIMENSAT, &[AT_FDCWD, p, times, 0]),
        err(Errno::EINVAL)
    );
    let lib = g.cstr(SCRATCH + 0x400, "/usr/lib/data.bin");
    assert_eq!(g.ret(UTIMENSAT, &[AT_FDCWD, lib, 0, 0]), err(Errno::EROFS));
}

#[test]
fn vectored_and_positioned_io_and_tree_changes() {
    const PREAD64: u64 = 17;
    const PWRITE64: u64 = 18;
    const READV: u64 = 19;
    const FTRUNCATE: u64 = 77;
    const RENAME: u64 = 82;
    const SYMLINK: u64 = 88;
    const READLINK: u64 = 89;
    let mut g = guest();
    let f = g.open("/tmp/v", O_CREAT | O_RDWR) as u64;
    // writev gathers two buffers in order.
    g.mem.write(SCRATCH + 0x1000, b"hello ").unwrap();
    g.mem.write(SCRATCH + 0x1100, b"world").unwrap();
    let iov = SCRATCH + 0x2000;
    for (i, (base, len)) in [(SCRATCH + 0x1000, 6u64), (SCRATCH + 0x1100, 5)]
        .iter()
        .enumerate()
    {
        g.mem.write_u64(iov + 16 * i as u64, *base).unwrap();
        g.mem.write_u64(iov + 16 * i as u64 + 8, *len).unwrap();
    }
    assert_eq!(g.ret(WRITEV, &[f, iov, 2]), 11);
    // pwrite/pread do not move the offset; readv scatters.
    g.mem.write(SCRATCH + 0x1200, b"W").unwrap();
    assert_eq!(g.ret(PWRITE64, &[f, SCRATCH + 0x1200, 1, 6]), 1);
    assert_eq!(g.ret(PREAD64, &[f, BUF, 100, 0]), 11);
    assert_eq!(g.mem.read_vec(BUF, 11).unwrap(), b"hello World");
    assert_eq!(g.ret(PREAD64, &[f, BUF, 1, u64::MAX]), err(Errno::EINVAL));
    assert_eq!(g.ret(LSEEK, &[f, 0, 1]), 11);
    assert_eq!(g.ret(LSEEK, &[f, -5i64 as u64, 2]), 6);
    assert_eq!(g.ret(LSEEK, &[f, -20i64 as u64, 1]), err(Errno::EINVAL));
    assert_eq!(g.ret(LSEEK, &[f, 0, 0]), 0);
    g.mem.write_u64(iov + 8, 3).unwrap();
    g.mem.write_u64(iov + 16, BUF + 0x100).unwrap();
    g.mem.write_u64(iov + 24, 100).unwrap();
    g.mem.write_u64(iov, BUF).unwrap();
    assert_eq!(g.ret(READV, &[f, iov, 2]), 11);
    assert_eq!(g.mem.read_vec(BUF, 3).unwrap(), b"hel");
    assert_eq!(g.mem.read_vec(BUF + 0x100, 8).unwrap(), b"lo World");
    assert_eq!(g.ret(FTRUNCATE, &[f, 5]), 0);
    assert_eq!(g.ret(FSTAT, &[f, BUF]), 0);
    assert_eq!(g.mem.read_u64(BUF + 48).unwrap(), 5);
    assert_eq!(g.ret(FTRUNCATE, &[0, 5]), err(Errno::EINVAL));

    let (old, new, link) = (
        g.cstr(SCRATCH, "/tmp/v"),
        g.cstr(SCRATCH + 0x100, "/work/w"),
        g.cstr(SCRATCH + 0x200, "/tmp/l"),
    );
    assert_eq!(g.ret(RENAME, &[old, new]), 0);
    assert_eq!(g.ret(SYMLINK, &[new, link]), 0);
    assert_eq!(g.ret(READLINK, &[link, BUF, 100]), 7);
    assert_eq!(g.mem.read_vec(BUF, 7).unwrap(), b"/work/w");
    assert_eq!(g.ret(READLINK, &[link, BUF, 3]), 3);
    assert_eq!(g.ret(READLINK, &[new, BUF, 100]), err(Errno::EINVAL));
    assert_eq!(g.ret(NEWFSTATAT, &[AT_FDCWD, link, BUF, 0]), 0);
    assert_eq!(
        g.mem.read_u64(BUF + 48).unwrap(),
        5,
        "stat follows the link"
    );
    assert_eq!(g.ret(NEWFSTATAT, &[AT_FDCWD, link, BUF, 0x100]), 0);
    assert_eq!(
        g.mem.read_u32(BUF + 24).unwrap() & 0o170000,
        0o120000,
        "AT_SYMLINK_NOFOLLOW"
    );
    assert_eq!(
        g.ret(NEWFSTATAT, &[AT_FDCWD, old, BUF, 0]),
        err(Errno::ENOENT)
    );
}

#[test]
fn a_wait_reports_the_childs_usage_and_getrusage_sums_the_reaped_children() {
    const WAIT4: u64 = 61;
    const GETRUSAGE: u64 = 98;
    const TIMES: u64 = 100;
    const RUSAGE_CHILDREN: u64 = -1i64 as u64;
    let mut g = guest();
    let read_usage = |g: &Guest| {
        let seconds = g.mem.read_u64(BUF).unwrap();
        let micros = g.mem.read_u64(BUF + 8).unwrap();
        let max_rss_kib = g.mem.read_u64(BUF + 32).unwrap();
        (seconds, micros, max_rss_kib)
    };
    let child = g.proc.tree.add_child(1, 0, 17).unwrap();
    g.proc.tree.note_usage(
        child,
        Usage {
            cpu_ns: 2_250_000_000,
            peak_memory: 8 << 20,
        },
    );
    g.proc.tree.get_mut(child).unwrap().children_used = Usage {
        cpu_ns: 500_000_000,
        peak_memory: 16 << 20,
    };
    g.proc.tree.ended(child, 0, 1);
    assert_eq!(g.ret(GETRUSAGE, &[RUSAGE_CHILDREN, BUF]), 0);
    assert_eq!(read_usage(&g), (0, 0, 0), "nothing reaped yet");
    g.mem.fill(BUF, 144, 0xff).unwrap();
    assert_eq!(g.ret(WAIT4, &[child, 0, 0, BUF]), child as i64);
    assert_eq!(
        read_usage(&g),
        (2, 750_000, 16 << 10),
        "its own time and its reaped children's; the larger peak"
    );
    assert_eq!(g.mem.read_u64(BUF + 16).unwrap(), 0, "no system time");
    assert_eq!(g.ret(GETRUSAGE, &[RUSAGE_CHILDREN, BUF]), 0);
    assert_eq!(read_usage(&g), (2, 750_000, 16 << 10));
    g.ret(TIMES, &[BUF]);
    assert_eq!(
        g.mem.read_u64(BUF + 16).unwrap(),
        275,
        "tms_cutime in ticks"
    );
}

#[test]
fn system_information_matches_the_guest() {
    const SYSINFO: u64 = 99;
    const SCHED_GETAFFINITY: u64 = 204;
    const GETRUSAGE: u64 = 98;
    let mut g = guest();
    assert_eq!(
        g.ret(MMAP, &[0, 8192, 3, 0x22, u64::MAX, 0]) as u64,
        14 * MIB - 8192
    );
    assert_eq!(g.ret(SYSINFO, &[BUF]), 0);
    assert_eq!(g.mem.read_u64(BUF + 32).unwrap(), MEM);
    assert_eq!(g.mem.read_u64(BUF + 40).unwrap(), MEM - 8192);
    assert_eq!(g.mem.read_u32(BUF + 104).unwrap(), 1);
    g.mem.fill(BUF, 128, 0xff).unwrap();
    assert_eq!(g.ret(SCHED_GETAFFINITY, &[0, 128, BUF]), 8);
    assert_eq!(g.mem.read_u64(BUF).unwrap(), 1);
    assert_eq!(g.ret(SCHED_GETAFFINITY, &[0, 4, BUF]), err(Errno::EINVAL));
    assert_eq!(g.ret(SCHED_GETAFFINITY, &[7, 8, BUF]), err(Errno::ESRCH));
    assert_eq!(g.ret(GETRUSAGE, &[0, BUF]), 0);
    assert_eq!(
        g.mem.read_u64(BUF + 32).unwrap(),
        8,
        "ru_maxrss: the 8 KiB peak"
    );
    assert_eq!(g.ret(GETRUSAGE, &[5, BUF]), err(Errno::EINVAL));
    assert_eq!(g.ret(CLOCK_GETTIME, &[1, BUF]), 0);
    let first = g.mem.read_u64(BUF).unwrap() * 1_000_000_000 + g.mem.read_u64(BUF + 8).unwrap();
    assert_eq!(g.ret(CLOCK_GETTIME, &[1, BUF]), 0);
    let second = g.mem.read_u64(BUF).unwrap() * 1_000_000_000 + g.mem.read_u64(BUF + 8).unwrap();
    assert!(second >= first);
    assert_eq!(g.ret(CLOCK_GETTIME, &[99, BUF]), err(Errno::EINVAL));
}

const SENDTO: u64 = 44;
const RECVFROM: u64 = 45;
const SENDMSG: u64 = 46;
const RECVMSG: u64 = 47;
const SHUTDOWN: u64 = 48;
const BIND: u64 = 49;
const GETSOCKNAME: u64 = 51;
const SOCKETPAIR: u64 = 53;
const SETSOCKOPT: u64 = 54;
const GETSOCKOPT: u64 = 55;
const POLL: u64 = 7;
const STATFS: u64 = 137;
const FSTATFS: u64 = 138;
const EPOLL_WAIT: u64 = 232;
const EPOLL_CTL: u64 = 233;
const EPOLL_CREATE1: u64 = 291;
const AF_UNIX: u64 = 1;
const SOCK_STREAM: u64 = 1;
const MSG_PEEK: u64 = 2;
const MSG_DONTWAIT: u64 = 0x40;
const EPOLLIN: u32 = 1;
const EPOLLOUT: u32 = 4;
const EPOLLHUP: u32 = 0x10;
const EPOLLONESHOT: u32 = 1 << 30;

impl Guest {
    /// A stream socketpair's two fds.
    fn socketpair(&mut self, flags: u64) -> (u64, u64) {
        self.socketpair_of(SOCK_STREAM | flags)
    }

    /// The two fds of a socketpair of type `kind` (with its flags).
    fn socketpair_of(&mut self, kind: u64) -> (u64, u64) {
        assert_eq!(
            self.ret(SOCKETPAIR, &[AF_UNIX, kind, 0, SCRATCH + 0x800]),
            0
        );
        (
            u64::from(self.mem.read_u32(SCRATCH + 0x800).unwrap()),
            u64::from(self.mem.read_u32(SCRATCH + 0x804).unwrap()),
        )
    }

    /// Writes a `sockaddr_un` for `path` at `addr` (a leading NUL: an abstract name); its
    /// length as a program passes it.
    fn unix_address(&mut self, addr: u64, path: &str) -> u64 {
        self.mem
            .write(addr, &(AF_UNIX as u16).to_le_bytes())
            .unwrap();
        self.mem.write(addr + 2, path.as_bytes()).unwrap();
        2 + path.len() as u64
    }

    fn epoll_add(&mut self, epfd: u64, fd: u64, events: u32, data: u64) -> i64 {
        self.mem.write_u32(SCRATCH + 0x900, events).unwrap();
        self.mem.write_u64(SCRATCH + 0x904, data).unwrap();
        self.ret(EPOLL_CTL, &[epfd, 1, fd, SCRATCH + 0x900])
    }

    /// epoll_wait with a zero timeout: the (events, data) pairs reported.
    fn epoll_ready(&mut self, epfd: u64) -> Vec<(u32, u64)> {
        let n = self.ret(EPOLL_WAIT, &[epfd, BUF, 8, 0]);
        assert!(n >= 0, "epoll_wait: {n}");
        (0..n as u64)
            .map(|i| {
                (
                    self.mem.read_u32(BUF + i * 12).unwrap(),
                    self.mem.read_u64(BUF + i * 12 + 4).unwrap(),
                )
            })
            .collect()
    }
}

#[test]
fn an_edge_triggered_registration_reports_what_happened_once() {
    const EPOLLET: u32 = 1 << 31;
    let mut g = guest();
    let (a, b) = g.socketpair(0);
    let epfd = g.ret(EPOLL_CREATE1, &[0]) as u64;
    assert_eq!(g.epoll_add(epfd, a, EPOLLIN | EPOLLOUT | EPOLLET, 1), 0);
    assert_eq!(g.epoll_add(epfd, b, EPOLLIN | EPOLLOUT, 2), 0);
    assert_eq!(g.epoll_ready(epfd), vec![(EPOLLOUT, 1), (EPOLLOUT, 2)]);
    assert_eq!(
        g.epoll_ready(epfd),
        vec![(EPOLLOUT, 2)],
        "a's edge was reported; b is level-triggered"
    );
    assert_eq!(g.write_bytes(b, b"x"), 1);
    assert_eq!(
        g.epoll_ready(epfd),
        vec![(EPOLLIN | EPOLLOUT, 1), (EPOLLOUT, 2)]
    );
    assert_eq!(g.epoll_ready(epfd), vec![(EPOLLOUT, 2)]);
    // More bytes while it is still readable are another edge.
    assert_eq!(g.write_bytes(b, b"y"), 1);
    assert_eq!(g.epoll_ready(epfd)[0], (EPOLLIN | EPOLLOUT, 1));
    // Read to empty, then written again: reported again, never missed.
    assert_eq!(g.read_bytes(a, 10).unwrap(), b"xy");
    g.epoll_ready(epfd);
    assert_eq!(g.epoll_ready(epfd), vec![(EPOLLOUT, 2)]);
    assert_eq!(g.write_bytes(b, b"z"), 1);
    assert_eq!(g.epoll_ready(epfd)[0], (EPOLLIN | EPOLLOUT, 1));
    // The peer's close is an edge; EPOLL_CTL_MOD arms the registration again.
    assert_eq!(g.ret(CLOSE, &[b]), 0);
    assert_eq!(g.epoll_ready(epfd)[0].1, 1);
    assert_eq!(g.epoll_ready(epfd), vec![]);
    g.mem.write_u32(SCRATCH + 0x900, EPOLLIN | EPOLLET).unwrap();
    assert_eq!(g.ret(EPOLL_CTL, &[epfd, 3, a, SCRATCH + 0x900]), 0);
    assert_eq!(g.epoll_ready(epfd).len(), 1);
    assert_eq!(g.epoll_ready(epfd), vec![]);
    // A pipe's ends too. Its read end takes b's fd number and description slot: b's
    // registration went with b, so the pipe's is a new one.
    assert_eq!(g.ret(PIPE2, &[SCRATCH + 0x800, 0]), 0);
    let r = u64::from(g.mem.read_u32(SCRATCH + 0x800).unwrap());
    let w = u64::from(g.mem.read_u32(SCRATCH + 0x804).unwrap());
    assert_eq!(r, b);
    assert_eq!(g.epoll_add(epfd, r, EPOLLIN | EPOLLET, 3), 0);
    assert_eq!(g.epoll_ready(epfd), vec![]);
    assert_eq!(g.write_bytes(w, b"p"), 1);
    assert_eq!(g.epoll_ready(epfd), vec![(EPOLLIN, 3)]);
    assert_eq!(g.epoll_ready(epfd), vec![]);
}

#[test]
fn socketpair_is_a_bidirectional_bounded_channel() {
    let mut g = guest();
    // Only AF_UNIX stream and datagram pairs.
    assert_eq!(
        g.ret(SOCKETPAIR, &[2, SOCK_STREAM, 0, SCRATCH]),
        err(Errno::EOPNOTSUPP)
    );
    assert_eq!(
        g.ret(SOCKETPAIR, &[AF_UNIX, 3, 0, SCRATCH]),
        -94,
        "SOCK_RAW"
    );
    assert_eq!(
        g.ret(SOCKETPAIR, &[AF_UNIX, SOCK_STREAM | 0x100, 0, SCRATCH]),
        err(Errno::EINVAL)
    );
    assert_eq!(
        g.ret(SOCKETPAIR, &[AF_UNIX, SOCK_STREAM, 0, 0x1000]),
        err(Errno::EFAULT)
    );
    assert_eq!(g.ret(SOCKET, &[AF_UNIX, 3, 0]), -94, "ESOCKTNOSUPPORT");
    let (a, b) = g.socketpair(O_CLOEXEC);
    assert_eq!((a, b), (3, 4));
    assert_eq!(g.write_bytes(a, b"ping"), 4);
    g.mem.write(SCRATCH + 0x1000, b"pong").unwrap();
    assert_eq!(g.ret(SENDTO, &[b, SCRATCH + 0x1000, 4, 0, 0, 0]), 4);
    assert_eq!(
        g.ret(SENDTO, &[b, SCRATCH + 0x1000, 4, 0, SCRATCH, 16]),
        -106,
        "EISCONN"
    );
    assert_eq!(g.ret(RECVFROM, &[b, BUF, 2, MSG_PEEK, 0, 0]), 2);
    assert_eq!(g.read_bytes(b, 10).unwrap(), b"ping");
    // recvfrom reports no peer address (length 0).
    g.mem.write_u32(SCRATCH + 0x10, 16).unwrap();
    assert_eq!(
        g.ret(RECVFROM, &[a, BUF, 10, 0, SCRATCH + 0x20, SCRATCH + 0x10]),
        4
    );
    assert_eq!(g.mem.read_vec(BUF, 4).unwrap(), b"pong");
    assert_eq!(g.mem.read_u32(SCRATCH + 0x10).unwrap(), 0);
    // Empty: MSG_DONTWAIT gives EAGAIN; a blocking receive waits for another thread.
    assert_eq!(
        g.ret(RECVFROM, &[a, BUF, 10, MSG_DONTWAIT, 0, 0]),
        err(Errno::EAGAIN)
    );
    assert_eq!(ready_wait(g.call(READ, &[a, BUF, 10])), None);
    // Bounded like a pipe.
    let big = vec![7u8; 70_000];
    g.mem.write(BUF, &big).unwrap();
    assert_eq!(g.ret(WRITE, &[a, BUF, big.len() as u64]), 65536);
    assert_eq!(
        g.ret(SENDTO, &[a, BUF, 1, MSG_DONTWAIT, 0, 0]),
        err(Errno::EAGAIN)
    );
    // Socket options, names and calls that need an address.
    g.mem.write_u32(SCRATCH + 0x10, 4).unwrap();
    assert_eq!(
        g.ret(GETSOCKOPT, &[a, 1, 4, SCRATCH + 0x20, SCRATCH + 0x10]),
        0
    );
    assert_eq!(g.mem.read_u32(SCRATCH + 0x20).unwrap(), 0, "SO_ERROR");
    assert_eq!(
        g.ret(GETSOCKOPT, &[a, 1, 3, SCRATCH + 0x20, SCRATCH + 0x10]),
        0
    );
    assert_eq!(g.mem.read_u32(SCRATCH + 0x20).unwrap(), 1, "SO_TYPE");
    assert_eq!(
        g.ret(GETSOCKOPT, &[a, 1, 4, 0x1000, SCRATCH + 0x10]),
        err(Errno::EFAULT)
    );
    assert_eq!(
        g.ret(GETSOCKOPT, &[a, 6, 1, SCRATCH + 0x20, SCRATCH + 0x10]),
        -92,
        "ENOPROTOOPT"
    );
    assert_eq!(g.ret(SETSOCKOPT, &[a, 1, 8, SCRATCH + 0x20, 4]), 0);
    assert_eq!(
        g.ret(SETSOCKOPT, &[a, 1, 20, SCRATCH + 0x20, 16]),
        -92,
        "SO_RCVTIMEO is not honoured"
    );
    g.mem.write_u32(SCRATCH + 0x10, 110).unwrap();
    assert_eq!(g.ret(GETSOCKNAME, &[a, SCRATCH + 0x20, SCRATCH + 0x10]), 0);
    assert_eq!(g.mem.read_u32(SCRATCH + 0x10).unwrap(), 2);
    assert_eq!(g.ret(BIND, &[a, SCRATCH, 16]), err(Errno::EINVAL));
    assert_eq!(g.ret(SENDTO, &[1, BUF, 1, 0, 0, 0]), err(Errno::ENOTSOCK));
    assert_eq!(g.ret(SHUTDOWN, &[0, 1]), err(Errno::ENOTSOCK));
    assert_eq!(g.ret(SHUTDOWN, &[99, 1]), err(Errno::EBADF));
    // fstat says socket.
    assert_eq!(g.ret(FSTAT, &[a, BUF]), 0);
    assert_eq!(g.mem.read_u32(BUF + 24).unwrap() & 0o170000, 0o140000);
}

/// A one-iovec message at `msg` sending or receiving one byte at `data`, with `control_len`
/// bytes of control buffer at `control`.
fn one_byte_message(g: &mut Guest, msg: u64, data: u64, control: u64, control_len: u64) {
    g.mem.write(msg, &[0u8; 56]).unwrap();
    g.mem.write_u64(msg + 16, msg + 64).unwrap();
    g.mem.write_u64(msg + 24, 1).unwrap();
    g.mem.write_u64(msg + 32, control).unwrap();
    g.mem.write_u64(msg + 40, control_len).unwrap();
    g.mem.write_u64(msg + 64, data).unwrap();
    g.mem.write_u64(msg + 72, 1).unwrap();
}

#[test]
fn recvmsg_peeks_at_a_stream_sockets_bytes() {
    let mut g = guest();
    let (a, b) = g.socketpair(O_NONBLOCK);
    let msg = SCRATCH + 0x400;
    one_byte_message(&mut g, msg, BUF, 0, 0);
    g.mem.write_u64(msg + 72, 3).unwrap();
    assert_eq!(g.ret(RECVMSG, &[b, msg, MSG_PEEK]), err(Errno::EAGAIN));
    assert_eq!(g.write_bytes(a, b"hello"), 5);
    assert_eq!(g.ret(RECVMSG, &[b, msg, MSG_PEEK]), 3);
    assert_eq!(g.mem.read_vec(BUF, 3).unwrap(), b"hel");
    assert_eq!(g.mem.read_u32(msg + 48).unwrap(), 0);
    assert_eq!(g.read_bytes(b, 10).unwrap(), b"hello");
}

/// Writes one control message header (cmsg_len, level, type) and its fds at `at`.
fn write_cmsg(g: &mut Guest, at: u64, len: u64, level: u32, kind: u32, fds: &[u32]) {
    g.mem.write_u64(at, len).unwrap();
    g.mem.write_u32(at + 8, level).unwrap();
    g.mem.write_u32(at + 12, kind).unwrap();
    for (i, fd) in fds.iter().enumerate() {
        g.mem.write_u32(at + 16 + 4 * i as u64, *fd).unwrap();
    }
}

#[test]
fn scm_rights_pass_descriptions_and_hostile_control_data_is_refused() {
    const SOL_SOCKET: u32 = 1;
    const SCM_RIGHTS: u32 = 1;
    const MSG_CTRUNC: u32 = 8;
    const MSG_CMSG_CLOEXEC: u64 = 0x4000_0000;
    let mut g = guest();
    let (a, b) = g.socketpair(O_NONBLOCK);
    let (c, d) = g.socketpair(O_NONBLOCK);
    let (msg, control) = (SCRATCH + 0x300, SCRATCH + 0x400);
    g.mem.write(BUF, b"x").unwrap();
    one_byte_message(&mut g, msg, BUF, control, 24);
    // Hostile headers: too short, past the buffer, absurd, bad fds, unknown types.
    for (len, level, kind, fds, expected) in [
        (15, SOL_SOCKET, SCM_RIGHTS, vec![], Errno::EINVAL),
        (32, SOL_SOCKET, SCM_RIGHTS, vec![c as u32], Errno::EINVAL),
        (
            u64::MAX,
            SOL_SOCKET,
            SCM_RIGHTS,
            vec![c as u32],
            Errno::EINVAL,
        ),
        (20, SOL_SOCKET, SCM_RIGHTS, vec![999], Errno::EBADF),
        (20, SOL_SOCKET, SCM_RIGHTS, vec![u32::MAX], Errno::EBADF),
        (20, SOL_SOCKET, 99, vec![c as u32], Errno::EINVAL),
        (24, SOL_SOCKET, 2, vec![1, 0], Errno::EOPNOTSUPP),
    ] {
        write_cmsg(&mut g, control, len, level, kind, &fds);
        assert_eq!(
            g.ret(SENDMSG, &[a, msg, 0]),
            err(expected),
            "{len} {kind} {fds:?}"
        );
    }
    g.mem.write_u64(msg + 40, 20481).unwrap();
    assert_eq!(g.ret(SENDMSG, &[a, msg, 0]), -105, "ENOBUFS");
    g.mem.write_u64(msg + 32, 0x1000).unwrap();
    g.mem.write_u64(msg + 40, 24).unwrap();
    assert_eq!(g.ret(SENDMSG, &[a, msg, 0]), err(Errno::EFAULT));
    // More than SCM_MAX_FD fds in one message.
    let many = vec![c as u32; 254];
    one_byte_message(&mut g, msg, BUF, control, 16 + 4 * 254);
    write_cmsg(&mut g, control, 16 + 4 * 254, SOL_SOCKET, SCM_RIGHTS, &many);
    assert_eq!(g.ret(SENDMSG, &[a, msg, 0]), err(Errno::EINVAL));
    assert_eq!(
        g.read_bytes(b, 10),
        Err(err(Errno::EAGAIN)),
        "nothing was sent"
    );
    // Another level's message is ignored; SCM_RIGHTS passes c's description.
    one_byte_message(&mut g, msg, BUF, control, 40);
    write_cmsg(&mut g, control, 16, 6, 1, &[]);
    write_cmsg(
        &mut g,
        control + 16,
        20,
        SOL_SOCKET,
        SCM_RIGHTS,
        &[c as u32],
    );
    assert_eq!(g.ret(SENDMSG, &[a, msg, 0]), 1);
    assert_eq!(g.ret(CLOSE, &[c]), 0);
    // recvmsg installs it: cmsg_len 20, msg_controllen CMSG_SPACE(4), no flags; a buffer for
    // the sender's name gets none.
    one_byte_message(&mut g, msg, BUF + 16, control, 64);
    g.mem.write_u64(msg, SCRATCH + 0x500).unwrap();
    g.mem.write_u32(msg + 8, 110).unwrap();
    assert_eq!(g.ret(RECVMSG, &[b, msg, 0]), 1);
    assert_eq!(g.mem.read_u32(msg + 8).unwrap(), 0);
    assert_eq!(g.mem.read_vec(BUF + 16, 1).unwrap(), b"x");
    assert_eq!(g.mem.read_u64(msg + 40).unwrap(), 24);
    assert_eq!(g.mem.read_u32(msg + 48).unwrap(), 0);
    assert_eq!(g.mem.read_u64(control).unwrap(), 20);
    assert_eq!(g.mem.read_u32(control + 8).unwrap(), SOL_SOCKET);
    assert_eq!(g.mem.read_u32(control + 12).unwrap(), SCM_RIGHTS);
    let received = u64::from(g.mem.read_u32(control + 16).unwrap());
    assert_eq!(g.ret(FCNTL, &[received, 1]), 0, "not close-on-exec");
    assert_eq!(g.write_bytes(received, b"via"), 3);
    assert_eq!(g.read_bytes(d, 10).unwrap(), b"via");
    // Two fds and room for one: one installed (close-on-exec as asked), MSG_CTRUNC.
    one_byte_message(&mut g, msg, BUF, control, 24);
    write_cmsg(
        &mut g,
        control,
        24,
        SOL_SOCKET,
        SCM_RIGHTS,
        &[d as u32, d as u32],
    );
    assert_eq!(g.ret(SENDMSG, &[a, msg, 0]), 1);
    one_byte_message(&mut g, msg, BUF + 16, control, 20);
    assert_eq!(g.ret(RECVMSG, &[b, msg, MSG_CMSG_CLOEXEC]), 1);
    assert_eq!(g.mem.read_u32(msg + 48).unwrap(), MSG_CTRUNC);
    assert_eq!(g.mem.read_u64(msg + 40).unwrap(), 20);
    let cloexec = u64::from(g.mem.read_u32(control + 16).unwrap());
    assert_eq!(g.ret(FCNTL, &[cloexec, 1]), 1, "FD_CLOEXEC");
    // No control buffer: the fds are closed, MSG_CTRUNC; a plain read drops them too.
    g.mem.write(BUF, b"x").unwrap();
    one_byte_message(&mut g, msg, BUF, control, 20);
    write_cmsg(&mut g, control, 20, SOL_SOCKET, SCM_RIGHTS, &[d as u32]);
    assert_eq!(g.ret(SENDMSG, &[a, msg, 0]), 1);
    assert_eq!(g.ret(SENDMSG, &[a, msg, 0]), 1);
    one_byte_message(&mut g, msg, BUF, 0, 0);
    assert_eq!(g.ret(RECVMSG, &[b, msg, 0]), 1);
    assert_eq!(g.mem.read_u32(msg + 48).unwrap(), MSG_CTRUNC);
    assert_eq!(g.mem.read_u64(msg + 40).unwrap(), 0);
    assert_eq!(g.read_bytes(b, 10).unwrap(), b"x");
    assert!(!g.proc.fds.has_passed_descriptions());
    // A receive's bytes stop at the end of the stretch that carried fds.
    g.mem.write(BUF, b"abc").unwrap();
    assert_eq!(g.write_bytes(a, b"12"), 2);
    one_byte_message(&mut g, msg, BUF, control, 20);
    g.mem.write_u64(msg + 72, 3).unwrap();
    assert_eq!(g.ret(SENDMSG, &[a, msg, 0]), 3);
    assert_eq!(g.write_bytes(a, b"34"), 2);
    one_byte_message(&mut g, msg, BUF + 16, control, 24);
    g.mem.write_u64(msg + 72, 10).unwrap();
    assert_eq!(g.ret(RECVMSG, &[b, msg, 0]), 5);
    assert_eq!(g.mem.read_vec(BUF + 16, 5).unwrap(), b"12abc");
    assert_eq!(g.mem.read_u64(msg + 40).unwrap(), 24);
    assert_eq!(g.read_bytes(b, 10).unwrap(), b"34");
}

#[test]
fn datagram_socketpairs_keep_boundaries_and_report_a_closed_peer() {
    const SOCK_DGRAM: u64 = 2;
    const MSG_TRUNC: u64 = 0x20;
    const FIONREAD: u64 = 0x541b;
    let mut g = guest();
    let (a, b) = g.socketpair_of(SOCK_DGRAM | O_NONBLOCK);
    g.mem.write_u32(SCRATCH + 0x880, 4).unwrap();
    assert_eq!(g.ret(GETSOCKOPT, &[a, 1, 3, BUF, SCRATCH + 0x880]), 0);
    assert_eq!(g.mem.read_u32(BUF).unwrap(), SOCK_DGRAM as u32);
    assert_eq!(g.read_bytes(b, 10), Err(err(Errno::EAGAIN)));
    assert_eq!(g.write_bytes(a, b"hello"), 5);
    assert_eq!(g.write_bytes(a, b""), 0);
    assert_eq!(g.write_bytes(a, b"abcdef"), 6);
    assert_eq!(g.ret(IOCTL, &[b, FIONREAD, SCRATCH + 0x880]), 0);
    assert_eq!(g.mem.read_u32(SCRATCH + 0x880).unwrap(), 5);
    // A peek leaves the datagram; a short buffer takes its start and drops the rest.
    assert_eq!(g.ret(RECVFROM, &[b, BUF, 2, MSG_PEEK, 0, 0]), 2);
    assert_eq!(g.read_bytes(b, 100).unwrap(), b"hello");
    assert_eq!(g.read_bytes(b, 100).unwrap(), b"");
    assert_eq!(g.ret(RECVFROM, &[b, BUF, 2, MSG_TRUNC, 0, 0]), 6);
    assert_eq!(g.mem.read_vec(BUF, 2).unwrap(), b"ab");
    assert_eq!(g.read_bytes(b, 100), Err(err(Errno::EAGAIN)));
    // Too large for one datagram; a full queue is EAGAIN until the peer reads.
    let huge = super::unix_datagram::MAX_DATAGRAM as u64 + 1;
    assert_eq!(g.ret(SENDTO, &[a, BUF, huge, 0, 0, 0]), -90, "EMSGSIZE");
    let mut sent = 0;
    while g.ret(SENDTO, &[a, BUF, 1000, 0, 0, 0]) == 1000 {
        sent += 1;
        assert!(sent < 1000);
    }
    assert_eq!(g.ret(SENDTO, &[a, BUF, 1000, 0, 0, 0]), err(Errno::EAGAIN));
    assert!(sent > 100);
    assert_eq!(g.read_bytes(b, 2000).unwrap().len(), 1000);
    assert_eq!(g.ret(SENDTO, &[a, BUF, 1000, 0, 0, 0]), 1000);
    // A send to an address nobody is bound at.
    let missing = g.unix_address(SCRATCH, "/tmp/missing.sock");
    assert_eq!(
        g.ret(SENDTO, &[a, BUF, 1, 0, SCRATCH, missing]),
        err(Errno::ENOENT)
    );
    // The peer closes: its queue goes, the next send is refused, later ones not connected.
    assert_eq!(g.ret(CLOSE, &[b]), 0);
    assert_eq!(
        g.ret(SENDTO, &[a, BUF, 1, 0, 0, 0]),
        err(Errno::ECONNREFUSED)
    );
    assert_eq!(g.ret(SENDTO, &[a, BUF, 1, 0, 0, 0]), err(Errno::ENOTCONN));
    assert_eq!(g.read_bytes(a, 10), Err(err(Errno::EAGAIN)));
    // A blocking receive waits for readiness.
    let (c, _d) = g.socketpair_of(SOCK_DGRAM);
    assert_eq!(ready_wait(g.call(READ, &[c, BUF, 10])), None);
}

#[test]
fn unix_datagram_sockets_bind_and_send_by_address() {
    const SOCK_DGRAM: u64 = 2;
    const CONNECT: u64 = 42;
    const GETPEERNAME: u64 = 52;
    const LISTEN: u64 = 50;
    let mut g = guest();
    let server = g.ret(SOCKET, &[AF_UNIX, SOCK_DGRAM | O_NONBLOCK, 0]) as u64;
    let client = g.ret(SOCKET, &[AF_UNIX, SOCK_DGRAM | O_NONBLOCK, 0]) as u64;
    let (at, client_at) = (SCRATCH, SCRATCH + 0x100);
    let len = g.unix_address(at, "/tmp/server.sock");
    let client_len = g.unix_address(client_at, "/tmp/client.sock");
    // Nobody bound yet: no file is ENOENT; a file with no datagram socket ECONNREFUSED.
    assert_eq!(
        g.ret(SENDTO, &[client, BUF, 1, 0, at, len]),
        err(Errno::ENOENT)
    );
    assert_eq!(g.ret(BIND, &[server, at, len]), 0);
    assert_eq!(g.ret(BIND, &[client, at, len]), err(Errno::EADDRINUSE));
    assert_eq!(
        g.ret(BIND, &[server, client_at, client_len]),
        err(Errno::EINVAL)
    );
    assert_eq!(g.ret(LISTEN, &[server, 1]), err(Errno::EOPNOTSUPP));
    // An unbound sender is unnamed: the source length is 0.
    g.mem.write(BUF, b"hi").unwrap();
    assert_eq!(g.ret(SENDTO, &[client, BUF, 2, 0, at, len]), 2);
    g.mem.write_u32(SCRATCH + 0x300, 110).unwrap();
    let (from, from_len) = (SCRATCH + 0x200, SCRATCH + 0x300);
    assert_eq!(g.ret(RECVFROM, &[server, BUF, 10, 0, from, from_len]), 2);
    assert_eq!(g.mem.read_u32(from_len).unwrap(), 0);
    // A bound sender's path comes back, ended by its NUL as Linux gives it.
    assert_eq!(g.ret(BIND, &[client, client_at, client_len]), 0);
    assert_eq!(g.ret(SENDTO, &[client, BUF, 2, 0, at, len]), 2);
    g.mem.write_u32(from_len, 110).unwrap();
    assert_eq!(g.ret(RECVFROM, &[server, BUF, 10, 0, from, from_len]), 2);
    assert_eq!(u64::from(g.mem.read_u32(from_len).unwrap()), client_len + 1);
    assert_eq!(
        g.mem.read_vec(from + 2, client_len - 1).unwrap(),
        b"/tmp/client.sock\0"
    );
    // connect: sends go to the peer, getpeername names it, others get EPERM.
    assert_eq!(g.ret(CONNECT, &[server, client_at, client_len]), 0);
    g.mem.write_u32(from_len, 110).unwrap();
    assert_eq!(g.ret(GETPEERNAME, &[server, from, from_len]), 0);
    assert_eq!(u64::from(g.mem.read_u32(from_len).unwrap()), client_len + 1);
    assert_eq!(g.ret(SENDTO, &[server, BUF, 1, 0, 0, 0]), 1);
    assert_eq!(g.read_bytes(client, 10).unwrap(), b"h");
    let other = g.ret(SOCKET, &[AF_UNIX, SOCK_DGRAM, 0]) as u64;
    assert_eq!(
        g.ret(SENDTO, &[other, BUF, 1, 0, at, len]),
        err(Errno::EPERM)
    );
    assert_eq!(
        g.ret(SENDTO, &[other, BUF, 1, 0, 0, 0]),
        err(Errno::ENOTCONN)
    );
    // The server closes: its file stays and is refused; the peer's next send too, once.
    assert_eq!(g.ret(CLOSE, &[server]), 0);
    assert_eq!(
        g.ret(SENDTO, &[other, BUF, 1, 0, at, len]),
        err(Errno::ECONNREFUSED)
    );
    assert_eq!(g.ret(CONNECT, &[other, client_at, client_len]), 0);
    assert_eq!(g.ret(CLOSE, &[client]), 0);
    assert_eq!(
        g.ret(SENDTO, &[other, BUF, 1, 0, 0, 0]),
        err(Errno::ECONNREFUSED)
    );
    assert_eq!(
        g.ret(SENDTO, &[other, BUF, 1, 0, 0, 0]),
        err(Errno::ENOTCONN)
    );
    // An abstract name makes no file; one nobody holds is refused.
    let abstract_len = g.unix_address(at, "\0sandfork");
    assert_eq!(g.ret(BIND, &[other, at, abstract_len]), 0);
    assert_eq!(g.ret(SENDTO, &[other, BUF, 2, 0, at, abstract_len]), 2);
    assert_eq!(g.read_bytes(other, 10).unwrap(), b"hi");
    let nobody_len = g.unix_address(at, "\0nobody");
    assert_eq!(
        g.ret(SENDTO, &[other, BUF, 1, 0, at, nobody_len]),
        err(Errno::ECONNREFUSED)
    );
    // Another family's address is EINVAL.
    g.mem.write(at, &2u16.to_le_bytes()).unwrap();
    assert_eq!(
        g.ret(SENDTO, &[other, BUF, 1, 0, at, 16]),
        err(Errno::EINVAL)
    );
}

#[test]
fn seqpacket_socketpairs_keep_boundaries_and_end_with_the_peer() {
    const SOCK_SEQPACKET: u64 = 5;
    let mut g = guest();
    let (a, b) = g.socketpair_of(SOCK_SEQPACKET | O_NONBLOCK);
    g.mem.write_u32(SCRATCH + 0x880, 4).unwrap();
    assert_eq!(g.ret(GETSOCKOPT, &[a, 1, 3, BUF, SCRATCH + 0x880]), 0);
    assert_eq!(g.mem.read_u32(BUF).unwrap(), SOCK_SEQPACKET as u32);
    assert_eq!(g.write_bytes(a, b"one"), 3);
    assert_eq!(g.write_bytes(a, b"two"), 3);
    // An address is ignored: the message goes to the peer.
    let len = g.unix_address(SCRATCH, "/tmp/nowhere.sock");
    assert_eq!(g.ret(SENDTO, &[a, BUF, 1, 0, SCRATCH, len]), 1);
    assert_eq!(g.read_bytes(b, 100).unwrap(), b"one");
    assert_eq!(g.read_bytes(b, 100).unwrap(), b"two");
    assert_eq!(g.read_bytes(b, 100).unwrap().len(), 1);
    assert_eq!(g.read_bytes(b, 100), Err(err(Errno::EAGAIN)));
    // The peer closes: what is queued comes first, then end of file; sends are EPIPE.
    assert_eq!(g.write_bytes(b, b"last"), 4);
    assert_eq!(g.ret(CLOSE, &[b]), 0);
    assert_eq!(g.read_bytes(a, 100).unwrap(), b"last");
    assert_eq!(g.read_bytes(a, 100).unwrap(), b"");
    assert_eq!(g.write_bytes(a, b"x"), err(Errno::EPIPE));
    assert_eq!(g.write_bytes(a, b"x"), err(Errno::EPIPE));
    // struct pollfd asking for POLLIN and POLLRDHUP.
    g.mem.write_u32(BUF, a as u32).unwrap();
    g.mem.write_u32(BUF + 4, 0x2001).unwrap();
    assert_eq!(g.ret(POLL, &[BUF, 1, 0]), 1);
    assert_eq!(
        g.mem.read_u32(BUF + 4).unwrap() >> 16,
        0x2011,
        "POLLIN, POLLRDHUP, POLLHUP"
    );
}

#[test]
fn socketpair_shutdown_close_and_messages() {
    let mut g = guest();
    let (a, b) = g.socketpair(O_NONBLOCK);
    // sendmsg/recvmsg over two iovecs; a control buffer shorter than a header holds nothing.
    g.mem.write(SCRATCH + 0x100, b"hello world").unwrap();
    for (i, (base, len)) in [(SCRATCH + 0x100, 6u64), (SCRATCH + 0x106, 5)]
        .iter()
        .enumerate()
    {
        g.mem
            .write_u64(SCRATCH + 0x200 + i as u64 * 16, *base)
            .unwrap();
        g.mem
            .write_u64(SCRATCH + 0x208 + i as u64 * 16, *len)
            .unwrap();
    }
    let msg = SCRATCH + 0x300;
    g.mem.write(msg, &[0u8; 56]).unwrap();
    g.mem.write_u64(msg + 16, SCRATCH + 0x200).unwrap();
    g.mem.write_u64(msg + 24, 2).unwrap();
    g.mem.write_u64(msg + 32, 0x1000).unwrap();
    g.mem.write_u64(msg + 40, 8).unwrap();
    assert_eq!(g.ret(SENDMSG, &[a, msg, 0]), 11);
    g.mem.write_u64(msg + 40, 0).unwrap();
    g.mem.write_u64(SCRATCH + 0x200, BUF).unwrap();
    g.mem.write_u64(SCRATCH + 0x210, BUF + 100).unwrap();
    assert_eq!(g.ret(RECVMSG, &[b, msg, 0]), 11);
    assert_eq!(g.mem.read_vec(BUF, 6).unwrap(), b"hello ");
    assert_eq!(g.mem.read_vec(BUF + 100, 5).unwrap(), b"world");
    assert_eq!(g.ret(RECVMSG, &[b, 0x1000, 0]), err(Errno::EFAULT));
    // SHUT_WR: the peer reads end of file, this end can no longer write, but still reads.
    assert_eq!(g.ret(SHUTDOWN, &[a, 1]), 0);
    assert_eq!(g.ret(SHUTDOWN, &[a, 1]), 0);
    assert_eq!(g.read_bytes(b, 10).unwrap(), b"");
    assert_eq!(g.write_bytes(a, b"x"), err(Errno::EPIPE));
    assert_eq!(g.write_bytes(b, b"back"), 4);
    assert_eq!(g.read_bytes(a, 10).unwrap(), b"back");
    assert_eq!(g.ret(SHUTDOWN, &[a, 3]), err(Errno::EINVAL));
    // Closing a (after its SHUT_WR) releases the rest; b then sees both directions closed.
    g.mem.write(BUF, &[0u8; 8]).unwrap();
    g.mem.write_u32(BUF, b as u32).unwrap();
    g.mem.write_u32(BUF + 4, 0x2000 | 1 | 4).unwrap();
    assert_eq!(g.ret(CLOSE, &[a]), 0);
    assert_eq!(g.ret(POLL, &[BUF, 1, 0]), 1);
    let revents = u16::from_le_bytes(g.mem.read_vec(BUF + 6, 2).unwrap().try_into().unwrap());
    assert_eq!(
        revents & (0x2000 | 0x10 | 1),
        0x2000 | 0x10 | 1,
        "RDHUP, HUP, IN: {revents:#x}"
    );
    assert_eq!(g.write_bytes(b, b"x"), err(Errno::EPIPE));
    assert_eq!(g.ret(CLOSE, &[b]), 0);
    // Both channels were freed: a new pair reuses them and starts empty.
    let (c, d) = g.socketpair(O_NONBLOCK);
    assert_eq!(g.read_bytes(c, 10), Err(err(Errno::EAGAIN)));
    // The end that shut its writes down and stays open, after its peer closes: its outgoing
    // channel is gone, and it polls as both directions closed (not as a bad fd).
    assert_eq!(g.ret(SHUTDOWN, &[c, 1]), 0);
    assert_eq!(g.ret(CLOSE, &[d]), 0);
    g.mem.write(BUF, &[0u8; 8]).unwrap();
    g.mem.write_u32(BUF, c as u32).unwrap();
    g.mem.write_u32(BUF + 4, 0x2000 | 1 | 4).unwrap();
    assert_eq!(g.ret(POLL, &[BUF, 1, 0]), 1);
    let revents = u16::from_le_bytes(g.mem.read_vec(BUF + 6, 2).unwrap().try_into().unwrap());
    assert_eq!(
        revents,
        0x2000 | 0x10 | 4 | 1,
        "RDHUP, HUP, OUT, IN: {revents:#x}"
    );
    assert_eq!(g.read_bytes(c, 10).unwrap(), b"");
    assert_eq!(g.write_bytes(c, b"x"), err(Errno::EPIPE));
}

#[test]
fn epoll_reports_readiness_of_pipes_and_sockets() {
    let mut g = guest();
    assert_eq!(g.ret(EPOLL_CREATE1, &[1]), err(Errno::EINVAL));
    let ep = g.ret(EPOLL_CREATE1, &[O_CLOEXEC]) as u64;
    let (a, b) = g.socketpair(0);
    assert_eq!(g.ret(PIPE2, &[SCRATCH + 0x700, 0]), 0);
    let (r, w) = (
        u64::from(g.mem.read_u32(SCRATCH + 0x700).unwrap()),
        u64::from(g.mem.read_u32(SCRATCH + 0x704).unwrap()),
    );
    assert_eq!(g.epoll_add(ep, a, EPOLLIN, 0xa), 0);
    assert_eq!(g.epoll_add(ep, a, EPOLLIN, 0xa), err(Errno::EEXIST));
    assert_eq!(g.epoll_add(ep, r, EPOLLIN | EPOLLONESHOT, 0x7), 0);
    assert_eq!(g.epoll_add(ep, b, EPOLLOUT, 0xb), 0);
    // Errors: not an epoll fd, itself, a regular file, a bad event pointer, a bad op.
    assert_eq!(g.epoll_add(a, b, EPOLLIN, 0), err(Errno::EINVAL));
    assert_eq!(g.epoll_add(ep, ep, EPOLLIN, 0), err(Errno::EINVAL));
    let file = g.open("/etc/passwd", 0) as u64;
    assert_eq!(g.epoll_add(ep, file, EPOLLIN, 0), err(Errno::EPERM));
    assert_eq!(g.ret(EPOLL_CTL, &[ep, 1, w, 0x1000]), err(Errno::EFAULT));
    assert_eq!(
        g.ret(EPOLL_CTL, &[ep, 9, a, SCRATCH + 0x900]),
        err(Errno::EINVAL)
    );
    assert_eq!(g.ret(EPOLL_CTL, &[ep, 2, w, 0]), err(Errno::ENOENT));
    // Only b is writable so far.
    assert_eq!(g.epoll_ready(ep), vec![(EPOLLOUT, 0xb)]);
    assert_eq!(g.write_bytes(b, b"x"), 1);
    assert_eq!(g.write_bytes(w, b"y"), 1);
    assert_eq!(
        g.epoll_ready(ep),
        vec![(EPOLLIN, 0xa), (EPOLLOUT, 0xb), (EPOLLIN, 0x7)]
    );
    // The one-shot pipe registration is disarmed after one report.
    assert_eq!(g.epoll_ready(ep), vec![(EPOLLIN, 0xa), (EPOLLOUT, 0xb)]);
    assert_eq!(g.ret(EPOLL_CTL, &[ep, 2, b, 0]), 0);
    assert_eq!(g.read_bytes(a, 1).unwrap(), b"x");
    assert_eq!(g.epoll_ready(ep), vec![]);
    // maxevents and the events buffer are checked.
    assert_eq!(g.ret(EPOLL_WAIT, &[ep, BUF, 0, 0]), err(Errno::EINVAL));
    assert_eq!(g.ret(EPOLL_WAIT, &[ep, MEM - 12, 2, 0]), err(Errno::EFAULT));
    // Nothing ready: the thread waits, with the timeout or without one.
    assert!(ready_wait(g.call(EPOLL_WAIT, &[ep, BUF, 8, 30])).is_some());
    assert_eq!(
        ready_wait(g.call(EPOLL_WAIT, &[ep, BUF, 8, -1i64 as u64])),
        None
    );
    // Closing the peer makes a report HUP; a registration whose fd was closed and reused by
    // another description is dropped.
    assert_eq!(g.ret(CLOSE, &[b]), 0);
    assert_eq!(g.epoll_ready(ep), vec![(EPOLLIN | EPOLLHUP, 0xa)]);
    assert_eq!(g.ret(CLOSE, &[a]), 0);
    assert_eq!(g.ret(DUP2, &[w, a]), a as i64);
    assert_eq!(g.epoll_ready(ep), vec![]);
    assert_eq!(g.epoll_add(ep, a, EPOLLOUT, 0xc), 0);
    assert_eq!(g.epoll_ready(ep), vec![(EPOLLOUT, 0xc)]);
}

#[test]
fn pseudo_terminal_opens_locked_and_answers_its_ioctls() {
    const TIOCGPTN: u64 = 0x8004_5430;
    const TIOCSPTLCK: u64 = 0x4004_5431;
    const TIOCGPTPEER: u64 = 0x5441;
    const TCGETS: u64 = 0x5401;
    const TIOCGPGRP: u64 = 0x540f;
    const TIOCSCTTY: u64 = 0x540e;
    const O_NOCTTY: u64 = 0o400;
    let mut g = guest();
    let master = g.open("/dev/ptmx", O_RDWR | O_NOCTTY) as u64;
    assert_eq!(g.ret(IOCTL, &[master, TIOCGPTN, BUF]), 0);
    assert_eq!(
        g.mem.read_u32(BUF).unwrap(),
        0,
        "the first terminal is /dev/pts/0"
    );
    assert_eq!(g.open("/dev/pts/0", O_RDWR), err(Errno::EIO), "locked");
    assert_eq!(g.open("/dev/pts/1", O_RDWR), err(Errno::ENOENT));
    assert_eq!(g.open("/dev/pts/00", O_RDWR), err(Errno::ENOENT));
    assert_eq!(
        g.ret(IOCTL, &[master, TIOCGPTPEER, O_RDWR]),
        err(Errno::EIO),
        "a peer of a locked terminal"
    );
    g.mem.write(BUF, &0u32.to_le_bytes()).unwrap();
    assert_eq!(g.ret(IOCTL, &[master, TIOCSPTLCK, BUF]), 0);
    assert_eq!(
        g.ret(IOCTL, &[master, TIOCGPTPEER, 0xdead_0000]),
        err(Errno::EINVAL)
    );
    let slave = g.open("/dev/pts/0", O_RDWR) as u64;
    // Process 1 leads its session: opening the slave without O_NOCTTY made it its terminal.
    assert_eq!(g.ret(IOCTL, &[slave, TIOCGPGRP, BUF]), 0);
    assert_eq!(g.mem.read_u32(BUF).unwrap(), 1);
    assert_eq!(g.ret(IOCTL, &[slave, TIOCSCTTY, 0]), 0, "already its own");
    let tty = g.open("/dev/tty", O_RDWR) as u64;
    assert_eq!(g.write_bytes(tty, b"a\n"), 2);
    assert_eq!(g.read_bytes(master, 100).unwrap(), b"a\r\n");
    assert_eq!(
        g.ret(IOCTL, &[slave, TCGETS, u64::MAX - 8]),
        err(Errno::EFAULT)
    );
    assert_eq!(g.ret(IOCTL, &[slave, TIOCGPTN, BUF]), err(Errno::ENOTTY));
    assert_eq!(g.ret(LSEEK, &[slave, 0, 0]), err(Errno::ESPIPE));
    g.mem.write(BUF, &[0u8; 16]).unwrap();
    assert_eq!(g.ret(FSTAT, &[slave, BUF]), 0);
    assert_eq!(
        g.mem.read_u64(BUF + 40).unwrap(),
        136 << 8,
        "st_rdev of /dev/pts/0"
    );
    for fd in [slave, tty] {
        assert_eq!(g.ret(CLOSE, &[fd]), 0);
    }
    assert_eq!(
        g.read_bytes(master, 10),
        Err(err(Errno::EIO)),
        "no slave left"
    );
    assert_eq!(g.ret(CLOSE, &[master]), 0);
    assert_eq!(
        g.open("/dev/pts/0", O_RDWR),
        err(Errno::ENOENT),
        "gone with its ends"
    );
}

#[test]
fn dev_nodes_and_statfs() {
    let mut g = guest();
    let null = g.open("/dev/null", O_RDWR) as u64;
    assert_eq!(g.write_bytes(null, b"gone"), 4);
    assert_eq!(g.read_bytes(null, 10).unwrap(), b"");
    let zero = g.open("/dev/zero", 0) as u64;
    g.mem.write(BUF, &[9u8; 8]).unwrap();
    assert_eq!(g.read_bytes(zero, 8).unwrap(), vec![0u8; 8]);
    assert_eq!(g.ret(READ, &[zero, 0x1000, 8]), err(Errno::EFAULT));
    let urandom = g.open("/dev/urandom", 0) as u64;
    let (x, y) = (
        g.read_bytes(urandom, 32).unwrap(),
        g.read_bytes(urandom, 32).unwrap(),
    );
    assert_eq!(x.len(), 32);
    assert_ne!(x, y);
    assert_eq!(g.ret(FSTAT, &[urandom, BUF]), 0);
    assert_eq!(g.mem.read_u32(BUF + 24).unwrap(), 0o020666);
    assert_eq!(g.mem.read_u64(BUF + 40).unwrap(), (1 << 8) | 9);
    // mmap of a device is not a file mapping.
    assert_eq!(g.ret(MMAP, &[0, 4096, 1, 2, zero, 0]), err(Errno::ENODEV));
    assert_eq!(
        g.open("/dev/tty", 0),
        err(Errno::ENXIO),
        "no controlling terminal"
    );
    assert_eq!(g.open("/dev/new", O_WRONLY | O_CREAT), err(Errno::EROFS));
    assert_eq!(g.open("/dev/null/x", 0), err(Errno::ENOTDIR));
    let dev = g.open("/dev", O_DIRECTORY) as u64;
    let n = g.ret(GETDENTS64, &[dev, BUF, 4096]);
    let mut names = dirent_names(&g.mem.read_vec(BUF, n as u64).unwrap());
    names.sort();
    assert_eq!(
        names,
        [
            &b"."[..],
            b"..",
            b"fd",
            b"null",
            b"ptmx",
            b"pts",
            b"random",
            b"shm",
            b"stderr",
            b"stdin",
            b"stdout",
            b"tty",
            b"urandom",
            b"zero"
        ]
    );
    let p = g.cstr(SCRATCH, "/dev/../dev/null");
    assert_eq!(g.ret(UNLINKAT, &[AT_FDCWD, p, 0]), err(Errno::EROFS));
    // statfs: the overlay's limit and usage, the image read-only and full.
    let p = g.cstr(SCRATCH, "/tmp");
    assert_eq!(g.ret(STATFS, &[p, BUF]), 0);
    let field = |g: &Guest, i: u64| g.mem.read_u64(BUF + i * 8).unwrap();
    assert_eq!(field(&g, 0), 0x0102_1994);
    assert_eq!(field(&g, 2), DEFAULT_OVERLAY_LIMIT / 4096);
    let free_before = field(&g, 3);
    let f = g.open("/tmp/f", O_WRONLY | O_CREAT) as u64;
    g.mem.write(BUF + 0x1000, &[1u8; 40_000]).unwrap();
    assert_eq!(g.ret(WRITE, &[f, BUF + 0x1000, 40_000]), 40_000);
    assert_eq!(g.ret(FSTATFS, &[f, BUF]), 0);
    assert!(
        free_before - field(&g, 3) >= 40_000 / 4096,
        "free blocks went from {free_before} to {}",
        field(&g, 3)
    );
    assert_eq!(field(&g, 10) & 1, 0, "writable");
    let p = g.cstr(SCRATCH, "/etc/passwd");
    assert_eq!(g.ret(STATFS, &[p, BUF]), 0);
    assert_eq!((field(&g, 3), field(&g, 4), field(&g, 10) & 1), (0, 0, 1));
    assert_eq!(g.ret(STATFS, &[p, 0x1000]), err(Errno::EFAULT));
    assert_eq!(g.ret(FSTATFS, &[77, BUF]), err(Errno::EBADF));
}

#[test]
fn sockets_epoll_and_devices_survive_a_template_snapshot() {
    use crate::codec::{Decoder, Encoder};
    let mut g = guest();
    let (a, b) = g.socketpair(O_NONBLOCK);
    assert_eq!(g.write_bytes(a, b"kept"), 4);
    assert_eq!(g.ret(SHUTDOWN, &[a, 1]), 0);
    let ep = g.ret(EPOLL_CREATE1, &[0]) as u64;
    assert_eq!(g.epoll_add(ep, b, EPOLLIN, 0x55), 0);
    let null = g.open("/dev/null", O_WRONLY) as u64;
    let mut e = Encoder::new();
    g.proc.encode_state(&mut e).unwrap();
    let bytes = e.into_bytes();
    let mut d = Decoder::new(&bytes);
    g.proc =
        GuestProcess::decode_state(&mut d, g.proc.config.vfs.image().clone(), 1 << 20).unwrap();
    d.finish("process").unwrap();
    assert_eq!(g.epoll_ready(ep), vec![(EPOLLIN, 0x55)]);
    assert_eq!(g.read_bytes(b, 10).unwrap(), b"kept");
    assert_eq!(g.read_bytes(b, 10).unwrap(), b"", "a's SHUT_WR is kept");
    assert_eq!(g.write_bytes(a, b"x"), err(Errno::EPIPE));
    assert_eq!(g.write_bytes(null, b"x"), 1);
}

const CAPGET: u64 = 125;
const EVENTFD2: u64 = 290;
const EFD_SEMAPHORE: u64 = 1;

impl Guest {
    fn write_u64_to(&mut self, fd: u64, value: u64) -> i64 {
        self.mem.write_u64(SCRATCH + 0x1000, value).unwrap();
        self.ret(WRITE, &[fd, SCRATCH + 0x1000, 8])
    }

    fn read_u64_from(&mut self, fd: u64) -> Result<u64, i64> {
        self.read_bytes(fd, 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    }
}

#[test]
fn eventfd_counts_and_reports_readiness() {
    let mut g = guest();
    assert_eq!(g.ret(EVENTFD2, &[0, 0x10]), err(Errno::EINVAL));
    let fd = g.ret(EVENTFD2, &[3, O_NONBLOCK | O_CLOEXEC]) as u64;
    let ep = g.ret(EPOLL_CREATE1, &[0]) as u64;
    assert_eq!(g.epoll_add(ep, fd, EPOLLIN | EPOLLOUT, 0xe), 0);
    assert_eq!(g.epoll_ready(ep), vec![(EPOLLIN | EPOLLOUT, 0xe)]);
    // A read takes the whole count; a dup shares it; short buffers and u64::MAX are EINVAL.
    assert_eq!(g.ret(READ, &[fd, BUF, 7]), err(Errno::EINVAL));
    assert_eq!(g.read_u64_from(fd), Ok(3));
    assert_eq!(g.read_u64_from(fd), Err(err(Errno::EAGAIN)));
    assert_eq!(g.epoll_ready(ep), vec![(EPOLLOUT, 0xe)]);
    let copy = g.ret(DUP, &[fd]) as u64;
    assert_eq!(g.write_u64_to(copy, 5), 8);
    assert_eq!(g.write_u64_to(fd, u64::MAX), err(Errno::EINVAL));
    assert_eq!(g.read_u64_from(fd), Ok(5));
    // Full at 2^64-2: a further write would block (EAGAIN), and the fd is not writable.
    assert_eq!(g.write_u64_to(fd, u64::MAX - 1), 8);
    assert_eq!(g.write_u64_to(fd, 1), err(Errno::EAGAIN));
    assert_eq!(g.epoll_ready(ep), vec![(EPOLLIN, 0xe)]);
    // Semaphore mode reads one at a time; a blocking read of zero waits for another thread.
    let sem = g.ret(EVENTFD2, &[2, EFD_SEMAPHORE]) as u64;
    assert_eq!(g.read_u64_from(sem), Ok(1));
    assert_eq!(g.read_u64_from(sem), Ok(1));
    assert_eq!(ready_wait(g.call(READ, &[sem, BUF, 8])), None);
    assert_eq!(g.ret(FSTAT, &[sem, BUF]), 0);
}

#[test]
fn capget_reports_no_capabilities() {
    let mut g = guest();
    let (header, data) = (SCRATCH + 0xa00, SCRATCH + 0xa10);
    g.mem.write(data, &[0xff; 24]).unwrap();
    g.mem.write_u32(header, 0x2008_0522).unwrap();
    g.mem.write_u32(header + 4, 0).unwrap();
    assert_eq!(g.ret(CAPGET, &[header, data]), 0);
    assert_eq!(g.mem.read_vec(data, 24).unwrap(), vec![0; 24]);
    g.mem.write_u32(header + 4, 7).unwrap();
    assert_eq!(g.ret(CAPGET, &[header, data]), err(Errno::ESRCH));
    // An unknown version learns the preferred one.
    g.mem.write_u32(header, 1).unwrap();
    assert_eq!(g.ret(CAPGET, &[header, 0]), err(Errno::EINVAL));
    assert_eq!(g.mem.read_u32(header).unwrap(), 0x2008_0522);
}

#[test]
fn positioned_vectored_io_keeps_the_offset() {
    const PREADV: u64 = 295;
    const PWRITEV: u64 = 296;
    const PREADV2: u64 = 327;
    const PWRITEV2: u64 = 328;
    const RWF_HIPRI: u64 = 1;
    const RWF_NOWAIT: u64 = 8;
    let mut g = guest();
    let f = g.open("/tmp/pv", O_CREAT | O_RDWR) as u64;
    assert_eq!(g.write_bytes(f, b"0123456789"), 10);
    let iov = SCRATCH + 0x2000;
    let set_iov = |g: &mut Guest, bufs: &[(u64, u64)]| {
        for (i, (base, len)) in bufs.iter().enumerate() {
            g.mem.write_u64(iov + 16 * i as u64, *base).unwrap();
            g.mem.write_u64(iov + 16 * i as u64 + 8, *len).unwrap();
        }
    };
    // pwritev gathers at the offset, each buffer after the one before.
    g.mem.write(SCRATCH + 0x1000, b"ab").unwrap();
    g.mem.write(SCRATCH + 0x1100, b"cd").unwrap();
    set_iov(&mut g, &[(SCRATCH + 0x1000, 2), (SCRATCH + 0x1100, 2)]);
    assert_eq!(g.ret(PWRITEV, &[f, iov, 2, 3, 0]), 4);
    assert_eq!(g.ret(LSEEK, &[f, 0, 1]), 10, "the offset stays");
    // preadv scatters from the offset.
    set_iov(&mut g, &[(BUF, 3), (BUF + 0x100, 4)]);
    assert_eq!(g.ret(PREADV, &[f, iov, 2, 1, 0]), 7);
    assert_eq!(g.mem.read_vec(BUF, 3).unwrap(), b"12a");
    assert_eq!(g.mem.read_vec(BUF + 0x100, 4).unwrap(), b"bcd7");
    assert_eq!(g.ret(LSEEK, &[f, 0, 1]), 10);
    assert_eq!(
        g.ret(PREADV, &[f, iov, 2, -1i64 as u64, 0]),
        err(Errno::EINVAL)
    );
    // The v2 forms: offset -1 is the descriptor's own and moves it; the hints are accepted.
    assert_eq!(g.ret(LSEEK, &[f, 8, 0]), 8);
    assert_eq!(g.ret(PREADV2, &[f, iov, 2, -1i64 as u64, 0, RWF_HIPRI]), 2);
    assert_eq!(g.mem.read_vec(BUF, 2).unwrap(), b"89");
    assert_eq!(g.ret(LSEEK, &[f, 0, 1]), 10);
    assert_eq!(g.ret(PREADV2, &[f, iov, 2, 0, 0, 0]), 7);
    assert_eq!(g.ret(LSEEK, &[f, 0, 1]), 10);
    assert_eq!(
        g.ret(PWRITEV2, &[f, iov, 2, 0, 0, RWF_NOWAIT]),
        err(Errno::EOPNOTSUPP)
    );
    // A pipe has no offset.
    let fds = SCRATCH + 0x3000;
    assert_eq!(g.ret(PIPE2, &[fds, 0]), 0);
    let read_end = u64::from(g.mem.read_u32(fds).unwrap());
    assert_eq!(g.ret(PREADV, &[read_end, iov, 2, 0, 0]), err(Errno::ESPIPE));
    assert_eq!(g.ret(PREADV, &[99, iov, 2, 0, 0]), err(Errno::EBADF));
}

#[test]
fn fallocate_and_fadvise_check_their_file() {
    const FADVISE64: u64 = 221;
    const FALLOCATE: u64 = 285;
    const FALLOC_FL_KEEP_SIZE: u64 = 1;
    const POSIX_FADV_DONTNEED: u64 = 4;
    let mut g = guest();
    let f = g.open("/tmp/fa", O_CREAT | O_RDWR) as u64;
    assert_eq!(g.write_bytes(f, b"abc"), 3);
    // Mode 0 grows the file with zeros, never shrinks it.
    assert_eq!(g.ret(FALLOCATE, &[f, 0, 2, 8]), 0);
    assert_eq!(g.ret(FSTAT, &[f, BUF]), 0);
    assert_eq!(g.mem.read_u64(BUF + 48).unwrap(), 10);
    assert_eq!(g.ret(FALLOCATE, &[f, 0, 0, 1]), 0);
    assert_eq!(g.ret(FSTAT, &[f, BUF]), 0);
    assert_eq!(g.mem.read_u64(BUF + 48).unwrap(), 10);
    assert_eq!(g.ret(LSEEK, &[f, 0, 0]), 0);
    assert_eq!(g.read_bytes(f, 20).unwrap(), b"abc\0\0\0\0\0\0\0");
    assert_eq!(
        g.ret(FALLOCATE, &[f, FALLOC_FL_KEEP_SIZE, 0, 100]),
        err(Errno::EOPNOTSUPP)
    );
    assert_eq!(g.ret(FALLOCATE, &[f, 0, 0, 0]), err(Errno::EINVAL));
    assert_eq!(
        g.ret(FALLOCATE, &[f, 0, -1i64 as u64, 1]),
        err(Errno::EINVAL)
    );
    assert_eq!(
        g.ret(FALLOCATE, &[f, 0, i64::MAX as u64, 1]),
        err(Errno::EFBIG)
    );
    assert_eq!(g.ret(FALLOCATE, &[99, 0, 0, 1]), err(Errno::EBADF));
    let ro = g.open("/tmp/fa", 0) as u64;
    assert_eq!(g.ret(FALLOCATE, &[ro, 0, 0, 1]), err(Errno::EBADF));
    let dir = g.open("/tmp", O_DIRECTORY) as u64;
    assert_eq!(g.ret(FADVISE64, &[dir, 0, 0, POSIX_FADV_DONTNEED]), 0);
    let fds = SCRATCH + 0x3000;
    assert_eq!(g.ret(PIPE2, &[fds, 0]), 0);
    let write_end = u64::from(g.mem.read_u32(fds + 4).unwrap());
    assert_eq!(g.ret(FALLOCATE, &[write_end, 0, 0, 1]), err(Errno::ESPIPE));
    // fadvise: a valid hint on a file is accepted; the rest is checked.
    assert_eq!(g.ret(FADVISE64, &[f, 0, 0, POSIX_FADV_DONTNEED]), 0);
    assert_eq!(g.ret(FADVISE64, &[f, 0, 0, 6]), err(Errno::EINVAL));
    assert_eq!(
        g.ret(FADVISE64, &[f, 0, -1i64 as u64, 0]),
        err(Errno::EINVAL)
    );
    assert_eq!(g.ret(FADVISE64, &[write_end, 0, 0, 0]), err(Errno::ESPIPE));
    assert_eq!(g.ret(FADVISE64, &[99, 0, 0, 0]), err(Errno::EBADF));
}

#[test]
fn scheduling_policy_is_sched_other() {
    const SCHED_SETPARAM: u64 = 142;
    const SCHED_GETPARAM: u64 = 143;
    const SCHED_SETSCHEDULER: u64 = 144;
    const SCHED_GETSCHEDULER: u64 = 145;
    const SCHED_GET_PRIORITY_MAX: u64 = 146;
    const SCHED_GET_PRIORITY_MIN: u64 = 147;
    const SCHED_RR_GET_INTERVAL: u64 = 148;
    const SCHED_FIFO: u64 = 1;
    const SCHED_BATCH: u64 = 3;
    let mut g = guest();
    assert_eq!(g.ret(SCHED_GETSCHEDULER, &[0]), 0);
    assert_eq!(g.ret(SCHED_GETSCHEDULER, &[1]), 0);
    assert_eq!(
        g.ret(SCHED_GETSCHEDULER, &[-1i64 as u64]),
        err(Errno::EINVAL)
    );
    assert_eq!(g.ret(SCHED_GETSCHEDULER, &[4242]), err(Errno::ESRCH));
    g.mem.write_u32(BUF, 7).unwrap();
    assert_eq!(g.ret(SCHED_GETPARAM, &[0, BUF]), 0);
    assert_eq!(g.mem.read_u32(BUF).unwrap(), 0);
    assert_eq!(g.ret(SCHED_GETPARAM, &[0, 0]), err(Errno::EINVAL));
    assert_eq!(g.ret(SCHED_GET_PRIORITY_MAX, &[SCHED_FIFO]), 99);
    assert_eq!(g.ret(SCHED_GET_PRIORITY_MIN, &[SCHED_FIFO]), 1);
    assert_eq!(g.ret(SCHED_GET_PRIORITY_MAX, &[0]), 0);
    assert_eq!(g.ret(SCHED_GET_PRIORITY_MAX, &[4]), err(Errno::EINVAL));
    // SCHED_OTHER at priority 0 is kept; a priority out of range is EINVAL, another policy
    // EPERM (unprivileged).
    assert_eq!(g.ret(SCHED_SETSCHEDULER, &[0, 0, BUF]), 0);
    assert_eq!(g.ret(SCHED_SETPARAM, &[0, BUF]), 0);
    g.mem.write_u32(BUF, -1i32 as u32).unwrap();
    assert_eq!(g.ret(SCHED_SETPARAM, &[0, BUF]), err(Errno::EINVAL));
    assert_eq!(g.ret(SCHED_SETSCHEDULER, &[0, 0, BUF]), err(Errno::EINVAL));
    g.mem.write_u32(BUF, 10).unwrap();
    assert_eq!(
        g.ret(SCHED_SETSCHEDULER, &[0, SCHED_FIFO, BUF]),
        err(Errno::EPERM)
    );
    assert_eq!(
        g.ret(SCHED_SETSCHEDULER, &[0, -1i64 as u64, BUF]),
        err(Errno::EINVAL)
    );
    g.mem.write_u32(BUF, 0).unwrap();
    assert_eq!(
        g.ret(SCHED_SETSCHEDULER, &[0, SCHED_BATCH, BUF]),
        err(Errno::EPERM)
    );
    assert_eq!(g.ret(SCHED_GETSCHEDULER, &[0]), 0);
    assert_eq!(g.ret(SCHED_RR_GET_INTERVAL, &[0, BUF]), 0);
    let slice = crate::process::threads::QUANTUM;
    assert_eq!(g.mem.read_u64(BUF).unwrap(), slice.as_secs());
    assert_eq!(
        g.mem.read_u64(BUF + 8).unwrap(),
        u64::from(slice.subsec_nanos())
    );
}

#[test]
fn set_ids_read_only_their_own_arguments() {
    const SETUID: u64 = 105;
    const SETREUID: u64 = 113;
    const SETREGID: u64 = 114;
    const SETRESUID: u64 = 117;
    let mut g = guest();
    let keep = u64::from(u32::MAX);
    let own_uid = crate::abi::GUEST_UID;
    // The registers past a call's arguments hold whatever the caller left there.
    assert_eq!(g.ret(SETREUID, &[keep, keep, 12345]), 0);
    assert_eq!(g.ret(SETREGID, &[keep, keep, 12345]), 0);
    assert_eq!(g.ret(SETUID, &[own_uid, 12345, 12345]), 0);
    assert_eq!(g.ret(SETREUID, &[keep, 0]), err(Errno::EPERM));
    assert_eq!(g.ret(SETRESUID, &[keep, keep, 0]), err(Errno::EPERM));
    assert_eq!(g.ret(SETRESUID, &[own_uid, keep, own_uid]), 0);
}

#[test]
fn a_folder_emptied_while_it_is_read_yields_every_entry_once() {
    let mut g = guest();
    let dir = g.cstr(SCRATCH, "/tmp/many");
    assert_eq!(g.ret(MKDIRAT, &[AT_FDCWD, dir, 0o755]), 0);
    let mut made = Vec::new();
    for i in 0..20 {
        let name = format!("/tmp/many/f{i}");
        let fd = g.open(&name, O_CREAT | O_WRONLY) as u64;
        assert_eq!(g.ret(CLOSE, &[fd]), 0);
        made.push(format!("f{i}").into_bytes());
    }
    let dfd = g.open("/tmp/many", O_DIRECTORY) as u64;
    // Small reads, each name removed as soon as it is read (rmtree's order).
    let mut seen = Vec::new();
    loop {
        let n = g.ret(GETDENTS64, &[dfd, BUF, 64]);
        assert!(n >= 0, "getdents64: {n}");
        if n == 0 {
            break;
        }
        for name in dirent_names(&g.mem.read_vec(BUF, n as u64).unwrap()) {
            if name != b"." && name != b".." {
                let path = g.cstr(
                    SCRATCH,
                    &format!("/tmp/many/{}", String::from_utf8_lossy(&name)),
                );
                assert_eq!(g.ret(UNLINKAT, &[AT_FDCWD, path, 0]), 0);
                seen.push(name);
            }
        }
    }
    seen.sort();
    made.sort();
    assert_eq!(seen, made);
    // Back at the first entry, the folder is listed afresh: empty now.
    assert_eq!(g.ret(LSEEK, &[dfd, 0, 0]), 0);
    let n = g.ret(GETDENTS64, &[dfd, BUF, 4096]);
    let names = dirent_names(&g.mem.read_vec(BUF, n as u64).unwrap());
    assert!(names.iter().all(|n| n == b"." || n == b".."), "{names:?}");
}

#[test]
fn mknod_makes_fifos_and_files_but_no_devices() {
    const MKNODAT: u64 = 259;
    const S_IFIFO: u64 = 0o010000;
    const S_IFCHR: u64 = 0o020000;
    let mut g = guest();
    let fifo = g.cstr(SCRATCH, "/tmp/fifo");
    assert_eq!(g.ret(MKNODAT, &[AT_FDCWD, fifo, S_IFIFO | 0o644, 0]), 0);
    assert_eq!(g.ret(NEWFSTATAT, &[AT_FDCWD, fifo, BUF, 0]), 0);
    assert_eq!(g.mem.read_u32(BUF + 24).unwrap(), (S_IFIFO | 0o644) as u32);
    assert_eq!(
        g.ret(MKNODAT, &[AT_FDCWD, fifo, S_IFIFO | 0o644, 0]),
        err(Errno::EEXIST)
    );
    // With no writer, a non-blocking reader opens and a non-blocking writer is ENXIO.
    let r = g.ret(OPENAT, &[AT_FDCWD, fifo, O_NONBLOCK, 0]);
    assert!(r >= 0, "{r}");
    assert_eq!(
        g.ret(OPENAT, &[AT_FDCWD, fifo, 1 | O_NONBLOCK, 0]),
        r + 1,
        "a writer opens once a reader is there"
    );
    assert_eq!(g.ret(OPENAT, &[AT_FDCWD, fifo, 2, 0]), err(Errno::EINVAL));
    let dev = g.cstr(SCRATCH, "/tmp/null");
    assert_eq!(
        g.ret(MKNODAT, &[AT_FDCWD, dev, S_IFCHR | 0o666, 0x103]),
        err(Errno::EPERM)
    );
    assert_eq!(
        g.ret(MKNODAT, &[AT_FDCWD, dev, 0o170000, 0]),
        err(Errno::EINVAL)
    );
    let lone = g.cstr(SCRATCH, "/tmp/lone");
    assert_eq!(g.ret(MKNODAT, &[AT_FDCWD, lone, S_IFIFO | 0o600, 0]), 0);
    assert_eq!(
        g.ret(OPENAT, &[AT_FDCWD, lone, 1 | O_NONBLOCK, 0]),
        err(Errno::ENXIO)
    );
}
