//! Processes: fork, vfork and clone of a new process, execve, wait4 and waitid, process ids,
//! groups and sessions. Each process of the tree runs in a VM of its own (`crate::sandbox`
//! makes it: a fork copies the caller's memory, an execve loads a program into fresh memory);
//! these handlers check the call and say what to make, and the tree's bookkeeping is
//! `process::tree`.

use super::time::rusage_bytes;
use super::{value, wait_ready, SysResult, SyscallOutcome, UserMemory};
use crate::errno::Errno;
use crate::fs::{FileKind, Node, X_OK};
use crate::process::signals::{ChildNews, JobReport, SIGCHLD};
use crate::process::{GuestProcess, Usage};

const CLONE_VM: u64 = 0x100;
const CLONE_FS: u64 = 0x200;
pub(super) const CLONE_PIDFD: u64 = 0x1000;
const CLONE_VFORK: u64 = 0x4000;
const CLONE_SETTLS: u64 = 0x8_0000;
const CLONE_PARENT_SETTID: u64 = 0x10_0000;
const CLONE_CHILD_CLEARTID: u64 = 0x20_0000;
const CLONE_CHILD_SETTID: u64 = 0x100_0000;
const CSIGNAL: u64 = 0xff;
/// What a clone of a new process may ask for. CLONE_VM goes only with CLONE_VFORK (posix_spawn,
/// vfork): the child runs on the caller's memory while the caller waits for it to exec or
/// exit. CLONE_FS is taken as a copy. CLONE_PIDFD gives the caller a pidfd of the child.
const PROCESS_FLAGS: u64 = CSIGNAL
    | CLONE_VM
    | CLONE_FS
    | CLONE_PIDFD
    | CLONE_VFORK
    | CLONE_SETTLS
    | CLONE_PARENT_SETTID
    | CLONE_CHILD_CLEARTID
    | CLONE_CHILD_SETTID;

/// What the tree makes for a fork: a child whose VM is a copy of the caller's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkRequest {
    /// The signal the parent gets when the child ends (0: none).
    pub exit_signal: u64,
    /// The child's stack pointer (None: the caller's).
    pub stack: Option<u64>,
    /// The child's FS base (CLONE_SETTLS).
    pub tls: Option<u64>,
    /// Where the child's pid is written in the parent's memory (CLONE_PARENT_SETTID).
    pub parent_tid: Option<u64>,
    /// Where it is written in the child's (CLONE_CHILD_SETTID).
    pub child_tid: Option<u64>,
    /// Cleared in the child's memory when it exits (CLONE_CHILD_CLEARTID).
    pub clear_child_tid: Option<u64>,
    /// Where the number of a new close-on-exec pidfd of the child is written in the parent's
    /// memory (CLONE_PIDFD).
    pub pidfd: Option<u64>,
    /// The caller waits until the child execs or exits (CLONE_VFORK).
    pub vfork: bool,
    /// The child runs on the caller's memory, not a copy (CLONE_VM).
    pub share_memory: bool,
}

/// What the tree loads for an execve: the program file (after `#!` lines), and the process's
/// new command line and environment, as bytes (execve takes any encoding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    pub node: Node,
    pub exe: String,
    pub argv: Vec<Vec<u8>>,
    pub envp: Vec<Vec<u8>>,
}

/// fork(): a child with a copy of the caller. It ends with the run, except in a session, where
/// it lives on between cells but runs only during them, and a checkpoint holds it unless it
/// maps memory shared with another process (partly supported: `crate::sandbox::KeptProcesses`,
/// `crate::snapshot::checkpoint`).
pub(crate) fn fork(_proc: &mut GuestProcess, _user: &UserMemory, _args: [u64; 6]) -> SysResult {
    Ok(SyscallOutcome::Fork(plain_fork(false)))
}

/// vfork(): a child on the caller's memory, the caller waiting until it execs or exits.
pub(crate) fn vfork(_proc: &mut GuestProcess, _user: &UserMemory, _args: [u64; 6]) -> SysResult {
    Ok(SyscallOutcome::Fork(plain_fork(true)))
}

fn plain_fork(vfork: bool) -> ForkRequest {
    ForkRequest {
        exit_signal: SIGCHLD,
        stack: None,
        tls: None,
        parent_tid: None,
        child_tid: None,
        clear_child_tid: None,
        pidfd: None,
        vfork,
        share_memory: vfork,
    }
}

/// A clone (or clone3) without CLONE_THREAD: a new process. `pidfd` is where CLONE_PIDFD
/// writes the pidfd's number (checked by the caller).
pub(crate) fn clone_process(
    flags: u64,
    exit_signal: u64,
    stack: u64,
    parent_tid: u64,
    child_tid: u64,
    tls: u64,
    pidfd: u64,
) -> SysResult {
    if flags & !PROCESS_FLAGS != 0 || (flags & CLONE_VM != 0 && flags & CLONE_VFORK == 0) {
        return Err(Errno::EINVAL);
    }
    if exit_signal >= crate::process::SIGNAL_COUNT as u64 {
        return Err(Errno::EINVAL);
    }
    let when = |flag: u64, addr: u64| (flags & flag != 0).then_some(addr);
    Ok(SyscallOutcome::Fork(ForkRequest {
        exit_signal,
        stack: (stack != 0).then_some(stack),
        tls: when(CLONE_SETTLS, tls),
        parent_tid: when(CLONE_PARENT_SETTID, parent_tid),
        child_tid: when(CLONE_CHILD_SETTID, child_tid),
        clear_child_tid: when(CLONE_CHILD_CLEARTID, child_tid),
        pidfd: when(CLONE_PIDFD, pidfd),
        vfork: flags & CLONE_VFORK != 0,
        share_memory: flags & CLONE_VM != 0,
    }))
}

/// Argument and environment strings execve takes at most, in all (Linux's ARG_MAX for the
/// default 8 MiB stack is a quarter of it).
const EXEC_STRINGS_MAX: u64 = 2 << 20;
/// Strings in one vector at most.
const EXEC_VECTOR_MAX: u64 = 1 << 16;
/// `#!` interpreters followed at most (Linux: 4).
const INTERPRETER_DEPTH: usize = 4;

/// A NULL-terminated vector of C strings at `addr` (NULL: none), within `budget` bytes.
fn read_strings(user: &UserMemory, addr: u64, budget: &mut u64) -> Result<Vec<Vec<u8>>, Errno> {
    let mut out = Vec::new();
    if addr == 0 {
        return Ok(out);
    }
    for i in 0..EXEC_VECTOR_MAX {
        let ptr = user.read_u64(addr + i * 8)?;
        if ptr == 0 {
            return Ok(out);
        }
        let bytes = user
            .guest()
            .read_cstr(ptr, (*budget).min(1 << 17) as usize)
            .map_err(|_| Errno::EFAULT)?;
        *budget = budget
            .checked_sub(bytes.len() as u64 + 1)
            .ok_or(Errno::E2BIG)?;
        out.push(bytes);
    }
    Err(Errno::E2BIG)
}

/// execve(path, argv, envp)
pub(crate) fn execve(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let path = user.read_path(args[0])?;
    exec_at(proc, user, proc.cwd, path, args[1], args[2])
}

/// execveat(dirfd, path, argv, envp, flags): relative to a directory fd, or AT_FDCWD; with
/// AT_EMPTY_PATH and an empty path, the program dirfd is open on (fexecve).
pub(crate) fn execveat(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const AT_FDCWD: i32 = -100;
    const AT_EMPTY_PATH: u64 = 0x1000;
    const AT_SYMLINK_NOFOLLOW: u64 = 0x100;
    if args[4] & !(AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0 {
        return Err(Errno::EINVAL);
    }
    let base = if args[0] as i32 == AT_FDCWD {
        proc.cwd
    } else {
        match proc.fds.get(args[0])?.object {
            crate::process::Object::Node(node) => node,
            _ => return Err(Errno::ENOTDIR),
        }
    };
    let path = user.read_path(args[1])?;
    if path.is_empty() && args[4] & AT_EMPTY_PATH == 0 {
        return Err(Errno::ENOENT);
    }
    exec_at(proc, user, base, path, args[2], args[3])
}

fn exec_at(
    proc: &mut GuestProcess,
    user: &UserMemory,
    base: Node,
    path: Vec<u8>,
    argv: u64,
    envp: u64,
) -> SysResult {
    let mut budget = EXEC_STRINGS_MAX;
    let mut argv = read_strings(user, argv, &mut budget)?;
    let envp = read_strings(user, envp, &mut budget)?;
    let vfs = &proc.config.vfs;
    let (mut exe, mut node) = if path.is_empty() {
        (vfs.path_of(base)?, base)
    } else {
        let node = vfs.resolve(base, &path, true)?;
        (path, node)
    };
    for _ in 0..=INTERPRETER_DEPTH {
        if vfs.kind(node)? != FileKind::Regular {
            return Err(Errno::EACCES);
        }
        vfs.access(node, X_OK)?;
        let contents = vfs.contents(node)?;
        if contents.starts_with(b"\x7fELF") {
            return Ok(SyscallOutcome::Exec(ExecRequest {
                node,
                exe: String::from_utf8_lossy(&exe).into_owned(),
                argv,
                envp,
            }));
        }
        let Some(line) = contents.strip_prefix(b"#!") else {
            return Err(Errno::ENOEXEC);
        };
        // `#!interpreter [one argument]`, as Linux reads it (the first 255 bytes).
        let line = &line[..line.len().min(255)];
        let line = &line[..line.iter().position(|&b| b == b'\n').unwrap_or(line.len())];
        let line = line.trim_ascii();
        let (interpreter, argument) = match line.iter().position(|&b| b == b' ' || b == b'\t') {
            Some(i) => (
                line[..i].to_vec(),
                Some(line[i + 1..].trim_ascii().to_vec()),
            ),
            None => (line.to_vec(), None),
        };
        if interpreter.is_empty() {
            return Err(Errno::ENOEXEC);
        }
        node = vfs.resolve(base, &interpreter, true)?;
        // argv becomes: interpreter [argument] script original-argv[1..].
        let mut script_argv = vec![interpreter.clone()];
        script_argv.extend(argument);
        script_argv.push(std::mem::replace(&mut exe, interpreter));
        script_argv.extend(argv.into_iter().skip(1));
        argv = script_argv;
    }
    Err(Errno::ELOOP)
}

const WNOHANG: u64 = 1;
const WUNTRACED: u64 = 2;
const WEXITED: u64 = 4;
const WCONTINUED: u64 = 8;
const WNOWAIT: u64 = 0x0100_0000;
const WNOTHREAD: u64 = 0x2000_0000;
const WALL: u64 = 0x4000_0000;
const WCLONE: u64 = 0x8000_0000;

/// Which children a wait takes.
#[derive(Clone, Copy)]
enum Which {
    Any,
    Pid(u64),
    Group(u64),
}

/// What a wait reports of a child.
#[derive(Clone, Copy)]
enum Event {
    /// It ended, with this wait status: the wait reaps it.
    Ended(u32),
    /// It stopped, by this signal (WUNTRACED).
    Stopped(u64),
    /// SIGCONT continued it (WCONTINUED).
    Continued,
}

impl Event {
    /// wait4's status word.
    fn status(self) -> u32 {
        match self {
            Event::Ended(status) => status,
            Event::Stopped(sig) => 0x7f | (sig as u32) << 8,
            Event::Continued => 0xffff,
        }
    }
}

/// The first child of the caller that `which` names with something to report that `options`
/// ask for (an end with WEXITED, a stop with WUNTRACED, a continue with WCONTINUED), as Linux
/// looks at each child in turn. Err(ECHILD) when `which` names no child at all.
fn child_event(
    proc: &GuestProcess,
    which: Which,
    options: u64,
) -> Result<Option<(u64, Event)>, Errno> {
    let me = proc.pid;
    let mut any = false;
    for (pid, entry) in proc.tree.pids() {
        let named = entry.ppid == me
            && match which {
                Which::Any => true,
                Which::Pid(p) => pid == p,
                Which::Group(g) => entry.pgid == g,
            };
        if !named {
            continue;
        }
        any = true;
        let event = match (entry.exit, entry.job_report) {
            (Some(status), _) if options & WEXITED != 0 => Event::Ended(status),
            (None, Some(JobReport::Stopped(sig))) if options & WUNTRACED != 0 => {
                Event::Stopped(sig)
            }
            (None, Some(JobReport::Continued)) if options & WCONTINUED != 0 => Event::Continued,
            _ => continue,
        };
        return Ok(Some((pid, event)));
    }
    if any {
        Ok(None)
    } else {
        Err(Errno::ECHILD)
    }
}

/// A wait took `event` of `child`: an end reaps it, a stop or continue is reported once.
fn consume(proc: &mut GuestProcess, child: u64, event: Event) {
    match event {
        Event::Ended(_) => {
            proc.tree.reap(child);
        }
        Event::Stopped(_) | Event::Continued => {
            if let Some(entry) = proc.tree.get_mut(child) {
                entry.job_report = None;
            }
        }
    }
}

/// What a wait reports `child` used (Linux's RUSAGE_BOTH): its own usage and its reaped
/// children's; a child that has not ended (a stop or continue reported) is asked now.
fn waited_usage(proc: &mut GuestProcess, child: u64) -> Usage {
    let Some(entry) = proc.tree.get(child) else {
        return Usage::default();
    };
    let (children, ended) = (entry.children_used, entry.exit.is_some());
    let own = if ended {
        entry.used
    } else {
        proc.as_process(child, |p| p.process_usage())
            .unwrap_or_default()
    };
    own.with(children)
}

fn which_of_wait4(proc: &GuestProcess, pid: i64) -> Which {
    match pid {
        -1 => Which::Any,
        0 => Which::Group(proc.tree.get(proc.pid).map_or(proc.pid, |e| e.pgid)),
        p if p > 0 => Which::Pid(p as u64),
        p => Which::Group(p.unsigned_abs()),
    }
}

/// wait4(pid, wstatus, options, rusage): reaps an ended child (its status written), or
/// reports a stopped one with WUNTRACED or a continued one with WCONTINUED; 0 with WNOHANG
/// while none has anything to report, else waits.
pub(crate) fn wait4(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [pid, wstatus, options, rusage, ..] = args;
    if options & !(WNOHANG | WUNTRACED | WCONTINUED | WNOTHREAD | WALL | WCLONE) != 0 {
        return Err(Errno::EINVAL);
    }
    let which = which_of_wait4(proc, i64::from(pid as i32));
    match child_event(proc, which, options | WEXITED)? {
        Some((child, event)) => {
            if wstatus != 0 {
                user.write_u32(wstatus, event.status())?;
            }
            if rusage != 0 {
                user.write(rusage, &rusage_bytes(waited_usage(proc, child)))?;
            }
            consume(proc, child, event);
            value(child)
        }
        None if options & WNOHANG != 0 => value(0),
        None => wait_ready(proc, None),
    }
}

/// waitid(idtype, id, infop, options, rusage): as wait4, reporting in a siginfo. P_PIDFD
/// names the child by a pidfd (EBADF for another fd); on a non-blocking one a wait that would
/// block is EAGAIN.
pub(crate) fn waitid(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const P_ALL: u64 = 0;
    const P_PID: u64 = 1;
    const P_PGID: u64 = 2;
    const P_PIDFD: u64 = 3;
    let [idtype, id, infop, options, rusage, _] = args;
    if options & !(WNOHANG | WUNTRACED | WEXITED | WCONTINUED | WNOWAIT | WNOTHREAD | WALL | WCLONE)
        != 0
        || options & (WEXITED | WUNTRACED | WCONTINUED) == 0
    {
        return Err(Errno::EINVAL);
    }
    let mut nonblocking = false;
    let which = match idtype {
        P_ALL => Which::Any,
        P_PID if id as i32 > 0 => Which::Pid(id),
        P_PGID if id == 0 => Which::Group(proc.tree.get(proc.pid).map_or(proc.pid, |e| e.pgid)),
        P_PGID if id as i32 > 0 => Which::Group(id),
        P_PIDFD if id as i32 >= 0 => {
            let (pid, pidfd_nonblocking) = super::pidfd::pid_of(proc, id)?;
            nonblocking = pidfd_nonblocking;
            Which::Pid(pid)
        }
        _ => return Err(Errno::EINVAL),
    };
    match child_event(proc, which, options)? {
        Some((child, event)) => {
            let news = match event {
                Event::Ended(status) => ChildNews::ended(child, status),
                Event::Stopped(sig) => ChildNews::job(child, JobReport::Stopped(sig)),
                Event::Continued => ChildNews::job(child, JobReport::Continued),
            };
            let info = news.siginfo();
            if infop != 0 {
                user.write(infop, &info)?;
            }
            if rusage != 0 {
                user.write(rusage, &rusage_bytes(waited_usage(proc, child)))?;
            }
            if options & WNOWAIT == 0 {
                consume(proc, child, event);
            }
            value(0)
        }
        None if options & WNOHANG != 0 => {
            // Linux zeroes si_pid (the whole siginfo here) when no child is ready.
            if infop != 0 {
                user.write(infop, &[0u8; 128])?;
            }
            value(0)
        }
        None if nonblocking => Err(Errno::EAGAIN),
        None => wait_ready(proc, None),
    }
}

/// getpid(): the running process's id.
pub(crate) fn getpid(proc: &mut GuestProcess, _user: &UserMemory, _args: [u64; 6]) -> SysResult {
    value(proc.pid)
}

/// prctl(option, arg2, ...): the process-control options programs use. PDEATHSIG is kept per
/// process and sent when its parent ends; the name reads as /proc's comm (setting it is
/// accepted and not kept); the sandbox's fixed facts read as they are (dumpable, no new
/// privileges, no capabilities, no seccomp mode of the guest's own). Others: EINVAL.
pub(crate) fn prctl(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const PR_SET_PDEATHSIG: u64 = 1;
    const PR_GET_PDEATHSIG: u64 = 2;
    const PR_GET_DUMPABLE: u64 = 3;
    const PR_SET_DUMPABLE: u64 = 4;
    const PR_SET_NAME: u64 = 15;
    const PR_GET_NAME: u64 = 16;
    const PR_GET_SECCOMP: u64 = 21;
    const PR_CAPBSET_READ: u64 = 23;
    const PR_GET_TIMERSLACK: u64 = 30;
    const PR_SET_NO_NEW_PRIVS: u64 = 38;
    const PR_GET_NO_NEW_PRIVS: u64 = 39;
    const CAP_LAST_CAP: u64 = 40;
    let [option, arg2, arg3, arg4, arg5, _] = args;
    let entry = proc.tree.get_mut(proc.pid).ok_or(Errno::ESRCH)?;
    match option {
        PR_SET_PDEATHSIG if arg2 <= 64 => {
            entry.death_signal = arg2;
            value(0)
        }
        PR_GET_PDEATHSIG => {
            let signal = entry.death_signal as u32;
            user.write_u32(arg2, signal)?;
            value(0)
        }
        PR_GET_DUMPABLE => value(1),
        PR_SET_DUMPABLE if arg2 <= 1 => value(0),
        PR_SET_NAME => {
            user.read_vec(arg2, 1)?;
            value(0)
        }
        PR_GET_NAME => {
            let mut name = proc.config.command.comm().into_bytes();
            name.push(0);
            user.write(arg2, &name)?;
            value(0)
        }
        PR_GET_SECCOMP => value(0),
        PR_CAPBSET_READ if arg2 <= CAP_LAST_CAP => value(0),
        PR_GET_TIMERSLACK => value(50_000),
        PR_SET_NO_NEW_PRIVS if arg2 == 1 && arg3 == 0 && arg4 == 0 && arg5 == 0 => value(0),
        PR_GET_NO_NEW_PRIVS => value(1),
        _ => Err(Errno::EINVAL),
    }
}

/// getppid(): its parent's (0 for the tree's first process, whose parent is outside).
pub(crate) fn getppid(proc: &mut GuestProcess, _user: &UserMemory, _args: [u64; 6]) -> SysResult {
    value(proc.tree.get(proc.pid).map_or(0, |e| e.ppid))
}

/// getpgrp(): the running process's group.
pub(crate) fn getpgrp(proc: &mut GuestProcess, _user: &UserMemory, _args: [u64; 6]) -> SysResult {
    value(proc.tree.get(proc.pid).map_or(proc.pid, |e| e.pgid))
}

fn target(proc: &GuestProcess, pid: u64) -> Result<u64, Errno> {
    match pid as i32 {
        0 => Ok(proc.pid),
        p if p > 0 && proc.tree.get(p as u64).is_some() => Ok(p as u64),
        _ => Err(Errno::ESRCH),
    }
}

/// getpgid(pid)
pub(crate) fn getpgid(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let pid = target(proc, args[0])?;
    value(proc.tree.get(pid).map_or(pid, |e| e.pgid))
}

/// getsid(pid)
pub(crate) fn getsid(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let pid = target(proc, args[0])?;
    value(proc.tree.get(pid).map_or(pid, |e| e.sid))
}

/// setpgid(pid, pgid): the caller or one of its children into a group of its session (a new
/// one named by the process's own pid, or one that exists).
pub(crate) fn setpgid(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let me = proc.pid;
    let pid = target(proc, args[0])?;
    if (args[1] as i32) < 0 {
        return Err(Errno::EINVAL);
    }
    let pgid = if args[1] as i32 == 0 { pid } else { args[1] };
    let (my_sid, entry) = match (proc.tree.get(me), proc.tree.get(pid)) {
        (Some(mine), Some(entry)) => (mine.sid, entry.clone()),
        _ => return Err(Errno::ESRCH),
    };
    if pid != me && entry.ppid != me {
        return Err(Errno::ESRCH);
    }
    if entry.sid != my_sid || entry.sid == pid {
        return Err(Errno::EPERM);
    }
    let group_exists = proc
        .tree
        .pids()
        .any(|(_, e)| e.pgid == pgid && e.sid == my_sid);
    if pgid != pid && !group_exists {
        return Err(Errno::EPERM);
    }
    if let Some(entry) = proc.tree.get_mut(pid) {
        entry.pgid = pgid;
    }
    value(0)
}

/// setsid(): a new session and group led by the caller, unless it leads a group already.
pub(crate) fn setsid(proc: &mut GuestProcess, _user: &UserMemory, _args: [u64; 6]) -> SysResult {
    let me = proc.pid;
    if proc.tree.pids().any(|(_, e)| e.pgid == me) {
        return Err(Errno::EPERM);
    }
    let entry = proc.tree.get_mut(me).ok_or(Errno::ESRCH)?;
    entry.pgid = me;
    entry.sid = me;
    value(me)
}

/// kill(pid, sig): to a process, to a group (0: the caller's, -g: group g), or to every
/// process but the tree's first (-1). The running process gets it at once; another one when
/// it next runs.
pub(crate) fn kill(proc: &mut GuestProcess, _user: &UserMemory, args: [u64; 6]) -> SysResult {
    let pid = i64::from(args[0] as i32);
    let sig = super::signals::signal_or_probe(args[1])?;
    let my_group = proc.tree.get(proc.pid).map_or(proc.pid, |e| e.pgid);
    let targets: Vec<u64> = proc
        .tree
        .pids()
        .filter(|(p, e)| match pid {
            -1 => *p != 1 && *p != proc.pid,
            0 => e.pgid == my_group,
            target if target > 0 => *p as i64 == target,
            g => e.pgid == g.unsigned_abs(),
        })
        .map(|(p, _)| p)
        .collect();
    if targets.is_empty() {
        return Err(Errno::ESRCH);
    }
    let Some(sig) = sig else {
        return value(0);
    };
    for target in targets {
        crate::process::signals::send(proc, target, sig);
    }
    value(0)
}
