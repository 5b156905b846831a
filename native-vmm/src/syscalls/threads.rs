//! Threads: clone and clone3 for the flag sets pthread_create (glibc) and Node (libuv, V8)
//! use, thread exit, thread ids, per-thread TLS and robust-list setup, and yielding. The
//! scheduling itself is `process::threads` (policy) and `crate::sched` (the vCPU).
//!
//! A clone without CLONE_THREAD makes a new process (fork, vfork, posix_spawn): processes.rs.
//! Beyond the execution's thread limit a clone is EAGAIN, what Linux answers at RLIMIT_NPROC
//! and pthread_create passes on (Python raises "RuntimeError: can't start new thread").

use super::processes::CLONE_PIDFD;
use super::{value, SysResult, SyscallOutcome, UserMemory};
use crate::errno::Errno;
use crate::process::GuestProcess;
use crate::status::RunStatus;

const CLONE_VM: u64 = 0x100;
const CLONE_FS: u64 = 0x200;
const CLONE_FILES: u64 = 0x400;
const CLONE_SIGHAND: u64 = 0x800;
const CLONE_THREAD: u64 = 0x1_0000;
const CLONE_SYSVSEM: u64 = 0x4_0000;
const CLONE_SETTLS: u64 = 0x8_0000;
const CLONE_PARENT_SETTID: u64 = 0x10_0000;
const CLONE_CHILD_CLEARTID: u64 = 0x20_0000;
const CLONE_DETACHED: u64 = 0x40_0000;
const CLONE_CHILD_SETTID: u64 = 0x100_0000;
/// The exit signal in clone's low byte.
const CSIGNAL: u64 = 0xff;
/// What makes a clone a thread of this process.
const THREAD_FLAGS: u64 = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD;
/// What a thread clone may add (CLONE_DETACHED is ignored by Linux too).
const OPTIONAL_FLAGS: u64 = CLONE_SYSVSEM
    | CLONE_SETTLS
    | CLONE_PARENT_SETTID
    | CLONE_CHILD_CLEARTID
    | CLONE_CHILD_SETTID
    | CLONE_DETACHED;
/// struct clone_args: the first version's size, and the size this layer reads (up to cgroup).
const CLONE_ARGS_SIZE_VER0: u64 = 64;
const CLONE_ARGS_SIZE_KNOWN: u64 = 88;
const PAGE: u64 = 4096;

/// The arguments of a thread clone, whichever call made it.
struct CloneArgs {
    flags: u64,
    /// The new thread's stack pointer (0: the caller's, as Linux does).
    stack: u64,
    parent_tid: u64,
    child_tid: u64,
    tls: u64,
}

/// clone(flags, stack, parent_tid, child_tid, tls)
pub(crate) fn clone(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [flags, stack, parent_tid, child_tid, tls, _] = args;
    if flags & CLONE_THREAD == 0 {
        // clone's CLONE_PIDFD writes the pidfd where CLONE_PARENT_SETTID would write the pid.
        if flags & CLONE_PIDFD != 0 {
            if flags & CLONE_PARENT_SETTID != 0 {
                return Err(Errno::EINVAL);
            }
            user.check(parent_tid, 4)?;
        }
        return super::processes::clone_process(
            flags & !CSIGNAL,
            flags & CSIGNAL,
            stack,
            parent_tid,
            child_tid,
            tls,
            parent_tid,
        );
    }
    if flags & !CSIGNAL & THREAD_FLAGS != THREAD_FLAGS {
        return Err(Errno::EINVAL);
    }
    // A thread has no exit signal: Linux ignores clone's for CLONE_THREAD.
    spawn(
        proc,
        user,
        CloneArgs {
            flags: flags & !CSIGNAL,
            stack,
            parent_tid,
            child_tid,
            tls,
        },
    )
}

/// clone3(cl_args, size)
pub(crate) fn clone3(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [addr, size, ..] = args;
    if size < CLONE_ARGS_SIZE_VER0 {
        return Err(Errno::EINVAL);
    }
    if size > PAGE {
        return Err(Errno::E2BIG);
    }
    let bytes = user.read_vec(addr, size)?;
    // Fields this layer does not know must be zero, as Linux requires of newer callers.
    if bytes
        .iter()
        .skip(CLONE_ARGS_SIZE_KNOWN as usize)
        .any(|&b| b != 0)
    {
        return Err(Errno::E2BIG);
    }
    let field = |i: usize| {
        bytes
            .get(i * 8..i * 8 + 8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    let [flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, _set_tid, set_tid_size, cgroup] =
        std::array::from_fn(field);
    if set_tid_size != 0 || cgroup != 0 || (stack == 0) != (stack_size == 0) {
        return Err(Errno::EINVAL);
    }
    if flags & CLONE_THREAD == 0 {
        if flags & CLONE_PIDFD != 0 {
            user.check(pidfd, 4)?;
        }
        return super::processes::clone_process(
            flags,
            exit_signal,
            stack.wrapping_add(stack_size),
            parent_tid,
            child_tid,
            tls,
            pidfd,
        );
    }
    if flags & THREAD_FLAGS != THREAD_FLAGS || exit_signal != 0 {
        return Err(Errno::EINVAL);
    }
    spawn(
        proc,
        user,
        CloneArgs {
            flags,
            stack: stack.wrapping_add(stack_size),
            parent_tid,
            child_tid,
            tls,
        },
    )
}

/// Makes a thread: checks the flags and addresses, takes a tid (or EAGAIN at the limit) and
/// writes it where the flags ask.
fn spawn(proc: &mut GuestProcess, user: &UserMemory, args: CloneArgs) -> SysResult {
    if args.flags & !(THREAD_FLAGS | OPTIONAL_FLAGS) != 0 {
        return Err(Errno::EINVAL);
    }
    if !proc.threads.switching {
        return Err(Errno::ENOSYS);
    }
    let wants = |flag: u64| args.flags & flag != 0;
    for (flag, addr) in [
        (CLONE_PARENT_SETTID, args.parent_tid),
        (CLONE_CHILD_SETTID, args.child_tid),
        (CLONE_CHILD_CLEARTID, args.child_tid),
    ] {
        if wants(flag) {
            user.check(addr, 4)?;
        }
    }
    let tls = wants(CLONE_SETTLS).then_some(args.tls);
    if tls.is_some_and(|base| base >= crate::abi::TASK_SIZE) {
        return Err(Errno::EPERM);
    }
    let Some(start) = proc.threads.spawn(args.stack, tls) else {
        return Err(Errno::EAGAIN);
    };
    for (flag, addr) in [
        (CLONE_PARENT_SETTID, args.parent_tid),
        (CLONE_CHILD_SETTID, args.child_tid),
    ] {
        if wants(flag) {
            user.write_u32(addr, start.tid as u32)?;
        }
    }
    if wants(CLONE_CHILD_CLEARTID) {
        proc.threads
            .get_mut(start.tid)
            .expect("just spawned")
            .clear_child_tid = args.child_tid;
    }
    Ok(SyscallOutcome::Spawned(start))
}

/// exit(code): ends the calling thread. Its clear_child_tid word is zeroed and one futex
/// waiter on it woken (pthread_join waits there). The last thread's exit ends the process
/// with `code`, as on Linux.
pub(crate) fn exit(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    if proc.threads.alive() == 1 {
        return exit_group(proc, user, args);
    }
    let word = proc.threads.current().clear_child_tid;
    // A bad address is ignored, as Linux does at thread exit.
    if word != 0 && user.write_u32(word, 0).is_ok() {
        proc.threads.futex_wake(word, 1, u32::MAX);
    }
    proc.threads.exit_current();
    Ok(SyscallOutcome::ThreadExited)
}

/// exit_group(code): ends every thread; the process exits with `code`.
pub(crate) fn exit_group(
    _proc: &mut GuestProcess,
    _user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    // Linux keeps the low 8 bits of the status.
    Ok(SyscallOutcome::Stop(RunStatus::Exited {
        code: (args[0] & 0xff) as i32,
    }))
}

/// gettid()
pub(crate) fn gettid(proc: &mut GuestProcess, _user: &UserMemory, _args: [u64; 6]) -> SysResult {
    value(proc.threads.current_tid())
}

/// Whether `pid` (as a pid_t argument) names a thread of the guest: 0 (the caller) or a live
/// tid (the main thread's is the pid).
pub(crate) fn names_a_thread(proc: &GuestProcess, pid: u64) -> bool {
    let pid = i64::from(pid as u32 as i32);
    pid == 0 || (pid > 0 && proc.threads.get(pid as u64).is_some())
}

/// set_tid_address(tidptr): the calling thread's clear_child_tid; returns its tid.
pub(crate) fn set_tid_address(
    proc: &mut GuestProcess,
    _user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    proc.threads.current_mut().clear_child_tid = args[0];
    value(proc.threads.current_tid())
}

/// set_robust_list(head, len): recorded for the calling thread. A thread that dies holding a
/// robust mutex does not have it marked OWNER_DIED (no program here relies on it).
pub(crate) fn set_robust_list(
    proc: &mut GuestProcess,
    _user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    const ROBUST_LIST_HEAD_SIZE: u64 = 24;
    if args[1] != ROBUST_LIST_HEAD_SIZE {
        return Err(Errno::EINVAL);
    }
    proc.threads.current_mut().robust_list = args[0];
    value(0)
}

/// The XSAVE components a program may use: those every switch and snapshot keeps (x87, SSE,
/// AVX). AMX tile data is not among them (it does not fit the state KVM_GET_XSAVE returns),
/// so asking for it is refused and programs fall back, as on a CPU without AMX.
const XCOMP_KEPT: u64 = 0b111;
/// Linux's XFEATURE_MAX: higher component numbers are EINVAL.
const XFEATURE_MAX: u64 = 19;

/// arch_prctl(code, addr): the calling thread's FS base (TLS), and the XSAVE components a
/// program may use (`XCOMP_KEPT`: asking for AMX is EOPNOTSUPP); everything else is EINVAL.
pub(crate) fn arch_prctl(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    const ARCH_SET_FS: u64 = 0x1002;
    const ARCH_GET_FS: u64 = 0x1003;
    const ARCH_GET_XCOMP_SUPP: u64 = 0x1021;
    const ARCH_GET_XCOMP_PERM: u64 = 0x1022;
    const ARCH_REQ_XCOMP_PERM: u64 = 0x1023;
    match args[0] {
        ARCH_GET_XCOMP_SUPP | ARCH_GET_XCOMP_PERM => {
            user.write_u64(args[1], XCOMP_KEPT)?;
            value(0)
        }
        ARCH_REQ_XCOMP_PERM if args[1] >= XFEATURE_MAX => Err(Errno::EINVAL),
        ARCH_REQ_XCOMP_PERM if XCOMP_KEPT & (1 << args[1]) != 0 => value(0),
        ARCH_REQ_XCOMP_PERM => Err(Errno::EOPNOTSUPP),
        ARCH_SET_FS if args[1] >= crate::abi::TASK_SIZE => Err(Errno::EPERM),
        ARCH_SET_FS => {
            proc.threads.current_mut().fs_base = args[1];
            Ok(SyscallOutcome::SetFsBase(args[1]))
        }
        ARCH_GET_FS => {
            user.write_u64(args[1], proc.threads.current().fs_base)?;
            value(0)
        }
        _ => Err(Errno::EINVAL),
    }
}

/// sched_yield(): another runnable thread, if any, runs first.
pub(crate) fn sched_yield(
    _proc: &mut GuestProcess,
    _user: &UserMemory,
    _args: [u64; 6],
) -> SysResult {
    Ok(SyscallOutcome::Yield)
}
