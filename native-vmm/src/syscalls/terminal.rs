//! Pseudo-terminals: opening /dev/ptmx (a new pair's master), /dev/pts/N (its slave) and
//! /dev/tty (the caller's controlling terminal); reads, writes and readiness of both ends; and
//! the terminal ioctls: termios (TCGETS/TCSETS*, their termios2 forms), the window size, the
//! master's TIOCGPTN/TIOCSPTLCK/TIOCGPTPEER, and the controlling terminal of a session
//! (TIOCSCTTY, TIOCNOTTY, TIOCGPGRP/TIOCSPGRP, TIOCGSID). The pair and its line discipline
//! are `process::terminal`; a terminal is the controlling terminal of at most one session, and
//! a session's processes share it. The input's signal characters reach the foreground
//! process group (^Z's SIGTSTP stops it). A process of a background group reading its
//! controlling terminal, or writing it under TOSTOP, stops its group with SIGTTIN or SIGTTOU
//! and makes its call again once continued, as Linux's `tty_check_change` has it.

use super::{value, wait_ready, SysResult, UserMemory};
use super::{POLLERR, POLLHUP, POLLIN, POLLNVAL, POLLOUT, POLLRDNORM, POLLWRNORM};
use crate::errno::Errno;
use crate::fs::Device;
use crate::process::signals;
use crate::process::terminal::{SlaveRead, Termios, TERMIOS2_BYTES, TERMIOS_BYTES};
use crate::process::{Description, GuestProcess, Object, O_ACCMODE, O_NONBLOCK};

const O_NOCTTY: u64 = 0o400;
const O_CLOEXEC: u64 = 0o2000000;

/// Opens the terminal end `device` or /dev/pts/`pts` names for the caller.
pub(super) fn open(
    proc: &mut GuestProcess,
    device: Option<Device>,
    pts: Option<u32>,
    flags: u64,
    status: u32,
) -> SysResult {
    let cloexec = flags & O_CLOEXEC != 0;
    let index = match (device, pts) {
        (Some(Device::Ptmx), _) => return value(proc.fds.open_terminal(status, cloexec)?),
        (Some(Device::Tty), _) => controlling(proc).ok_or(Errno::ENXIO)?,
        (_, Some(n)) => n as usize,
        _ => return Err(Errno::ENXIO),
    };
    let fd = open_slave(proc, index, status, cloexec)?;
    if flags & O_NOCTTY == 0 {
        let _ = acquire(proc, index, false);
    }
    value(fd)
}

/// A new slave description of terminal `index` at the lowest free fd: EIO while the master
/// keeps it locked or once the master is gone.
fn open_slave(
    proc: &mut GuestProcess,
    index: usize,
    status: u32,
    cloexec: bool,
) -> Result<u64, Errno> {
    let t = proc.fds.terminal(index)?;
    if t.locked || t.hung_up() {
        return Err(Errno::EIO);
    }
    proc.fds.install(
        Description::new(Object::TerminalSlave(index), status),
        0,
        cloexec,
    )
}

/// The caller's session and process group.
fn ids(proc: &GuestProcess) -> (u64, u64) {
    proc.tree
        .get(proc.pid)
        .map_or((proc.pid, proc.pid), |e| (e.sid, e.pgid))
}

/// The caller's controlling terminal: the one its session holds.
fn controlling(proc: &GuestProcess) -> Option<usize> {
    let (sid, _) = ids(proc);
    proc.fds
        .terminals()
        .find(|(_, t)| t.session == Some(sid))
        .map(|(i, _)| i)
}

/// Makes terminal `index` the controlling terminal of the caller's session (TIOCSCTTY, or an
/// open without O_NOCTTY): only a session leader without one may, and only a terminal no
/// other session holds.
fn acquire(proc: &mut GuestProcess, index: usize, explicit: bool) -> Result<(), Errno> {
    let (sid, pgid) = ids(proc);
    let held = controlling(proc);
    if held == Some(index) {
        return Ok(());
    }
    let t = proc.fds.terminal_mut(index)?;
    if sid != proc.pid || held.is_some() || t.session.is_some() {
        return Err(if explicit {
            Errno::EPERM
        } else {
            Errno::ENOTTY
        });
    }
    t.session = Some(sid);
    t.foreground = Some(pgid);
    Ok(())
}

/// Sends `sig` to every live process of group `pgid`.
fn signal_group(proc: &mut GuestProcess, pgid: u64, sig: u64) {
    let members: Vec<u64> = proc
        .tree
        .pids()
        .filter(|(_, e)| e.pgid == pgid && e.exit.is_none())
        .map(|(pid, _)| pid)
        .collect();
    for pid in members {
        signals::send(proc, pid, sig);
    }
}

/// A read (`sig` SIGTTIN) or a TOSTOP write (SIGTTOU) of terminal `index`'s slave by a
/// process of a background group of the session it controls: the group gets `sig` and the
/// call waits, so the stop interrupts it and it is made again when the group is continued
/// (Some). A caller that ignores or blocks `sig` reads EIO and writes on (None); an orphaned
/// group, which a stop would not stop, gets EIO.
fn from_background(
    proc: &mut GuestProcess,
    index: usize,
    sig: u64,
) -> Result<Option<SysResult>, Errno> {
    let (sid, pgid) = ids(proc);
    let t = proc.fds.terminal(index)?;
    if t.session != Some(sid) || t.foreground.is_none_or(|f| f == pgid) {
        return Ok(None);
    }
    let ignored = proc.signals.actions[sig as usize].handler == signals::SIG_IGN
        || proc.threads.current().blocked_signals & signals::bit(sig) != 0;
    if ignored {
        return if sig == signals::SIGTTIN {
            Err(Errno::EIO)
        } else {
            Ok(None)
        };
    }
    if proc.tree.group_orphaned(pgid) {
        return Err(Errno::EIO);
    }
    signal_group(proc, pgid, sig);
    Ok(Some(wait_ready(proc, None)))
}

/// Reads up to `len` bytes of terminal `index`'s master (the slave's output) or slave (its
/// input) into guest memory at `buf`.
pub(super) fn read(
    proc: &mut GuestProcess,
    user: &UserMemory,
    (index, master): (usize, bool),
    buf: u64,
    len: u64,
    nonblocking: bool,
) -> SysResult {
    user.check(buf, len)?;
    let max = usize::try_from(len).unwrap_or(usize::MAX);
    if !master {
        if let Some(stopped) = from_background(proc, index, signals::SIGTTIN)? {
            return stopped;
        }
    }
    let t = proc.fds.terminal_mut(index)?;
    let bytes = if master {
        match t.read_master(max) {
            Some(bytes) => bytes,
            None if t.master_eio() => return Err(Errno::EIO),
            None if nonblocking => return Err(Errno::EAGAIN),
            None => return wait_ready(proc, None),
        }
    } else {
        let (vmin, vtime) = t.termios.min_time();
        let canonical = t.termios.canonical();
        match t.read_slave(max) {
            SlaveRead::Bytes(bytes) => bytes,
            SlaveRead::EndOfFile => return value(0),
            // VMIN 0: a read returns what there is, after VTIME tenths of a second at most.
            SlaveRead::Empty if !canonical && vmin == 0 && vtime == 0 => return value(0),
            SlaveRead::Empty if nonblocking => return Err(Errno::EAGAIN),
            SlaveRead::Empty if !canonical && vmin == 0 => {
                let timeout = std::time::Duration::from_millis(u64::from(vtime) * 100);
                return wait_ready(proc, Some(timeout));
            }
            SlaveRead::Empty => return wait_ready(proc, None),
        }
    };
    user.write(buf, &bytes)?;
    value(bytes.len() as u64)
}

/// Writes `data` to terminal `index`'s master (input for the slave, its signal characters
/// sent to the foreground group) or slave (output for the master): what fits is taken.
pub(super) fn write(
    proc: &mut GuestProcess,
    (index, master): (usize, bool),
    data: &[u8],
    nonblocking: bool,
) -> SysResult {
    if data.is_empty() {
        return value(0);
    }
    if !master && proc.fds.terminal(index)?.termios.stops_background_writes() {
        if let Some(stopped) = from_background(proc, index, signals::SIGTTOU)? {
            return stopped;
        }
    }
    let t = proc.fds.terminal_mut(index)?;
    let (taken, raised) = if master {
        t.write_master(data)
    } else if t.hung_up() {
        return Err(Errno::EIO);
    } else {
        (t.write_slave(data), Vec::new())
    };
    let foreground = t.foreground;
    if let Some(pgid) = foreground {
        for sig in raised {
            signal_group(proc, pgid, sig);
        }
    }
    match taken {
        0 if nonblocking => Err(Errno::EAGAIN),
        0 => wait_ready(proc, None),
        n => value(n as u64),
    }
}

/// Bytes a write to the terminal end copies from guest memory at most.
pub(super) fn write_room(proc: &GuestProcess, (index, master): (usize, bool)) -> usize {
    proc.fds.terminal(index).map_or(0, |t| {
        if master {
            t.input_room()
        } else {
            t.output_room()
        }
    })
}

/// The poll bits of terminal `index`'s master or slave, as Linux's pty reports them.
pub(super) fn ready_bits(proc: &GuestProcess, (index, master): (usize, bool)) -> u16 {
    const READABLE: u16 = POLLIN | POLLRDNORM;
    const WRITABLE: u16 = POLLOUT | POLLWRNORM;
    let Ok(t) = proc.fds.terminal(index) else {
        return POLLNVAL;
    };
    let mut bits = 0;
    if master {
        if t.output_buffered() > 0 {
            bits |= READABLE;
        }
        if t.master_eio() {
            bits |= POLLHUP;
        }
        if t.input_room() > 0 {
            bits |= WRITABLE;
        }
    } else if t.hung_up() {
        bits = READABLE | WRITABLE | POLLERR | POLLHUP;
    } else {
        if t.slave_readable() {
            bits |= READABLE;
        }
        if t.output_room() > 0 {
            bits |= WRITABLE;
        }
    }
    bits
}

/// FIONREAD of a terminal end: the bytes its next reads could take.
pub(super) fn available(proc: &GuestProcess, (index, master): (usize, bool)) -> Result<u64, Errno> {
    let t = proc.fds.terminal(index)?;
    Ok(if master {
        t.output_buffered()
    } else {
        t.input_buffered()
    } as u64)
}

/// A terminal ioctl on an end of terminal `index` (ENOTTY: not a terminal request).
pub(super) fn ioctl(
    proc: &mut GuestProcess,
    user: &UserMemory,
    (index, master): (usize, bool),
    request: u64,
    arg: u64,
) -> SysResult {
    const TCGETS: u64 = 0x5401;
    const TCSETS: u64 = 0x5402;
    const TCSETSW: u64 = 0x5403;
    const TCSETSF: u64 = 0x5404;
    const TCSBRK: u64 = 0x5409;
    const TCXONC: u64 = 0x540a;
    const TCFLSH: u64 = 0x540b;
    const TIOCSCTTY: u64 = 0x540e;
    const TIOCGPGRP: u64 = 0x540f;
    const TIOCSPGRP: u64 = 0x5410;
    const TIOCOUTQ: u64 = 0x5411;
    const TIOCGWINSZ: u64 = 0x5413;
    const TIOCSWINSZ: u64 = 0x5414;
    const TIOCNOTTY: u64 = 0x5422;
    const TCSBRKP: u64 = 0x5425;
    const TIOCGSID: u64 = 0x5429;
    const TCGETS2: u64 = 0x802c_542a;
    const TCSETS2: u64 = 0x402c_542b;
    const TCSETSW2: u64 = 0x402c_542c;
    const TCSETSF2: u64 = 0x402c_542d;
    const TIOCGPTN: u64 = 0x8004_5430;
    const TIOCSPTLCK: u64 = 0x4004_5431;
    const TIOCGPTLCK: u64 = 0x8004_5439;
    const TIOCGPTPEER: u64 = 0x5441;
    let t = proc.fds.terminal_mut(index)?;
    match request {
        TCGETS | TCGETS2 => {
            user.write(arg, &t.termios.to_bytes(request == TCGETS2))?;
            value(0)
        }
        TCSETS | TCSETSW | TCSETSF | TCSETS2 | TCSETSW2 | TCSETSF2 => {
            let size = if request > 0xffff {
                TERMIOS2_BYTES
            } else {
                TERMIOS_BYTES
            };
            let bytes = user.read_vec(arg, size as u64)?;
            let t = proc.fds.terminal_mut(index)?;
            if matches!(request, TCSETSF | TCSETSF2) {
                t.flush(true, false);
            }
            let termios = Termios::from_bytes(&bytes, &t.termios);
            t.set_termios(termios);
            value(0)
        }
        // Output leaves at once: draining, breaks and flow control have nothing to wait for.
        TCSBRK | TCSBRKP | TCXONC => value(0),
        TCFLSH => match arg {
            0..=2 => {
                t.flush(arg != 1, arg != 0);
                value(0)
            }
            _ => Err(Errno::EINVAL),
        },
        TIOCOUTQ => {
            user.write_u32(arg, 0)?;
            value(0)
        }
        TIOCGWINSZ => {
            let bytes: Vec<u8> = t.winsize.iter().flat_map(|v| v.to_le_bytes()).collect();
            user.write(arg, &bytes)?;
            value(0)
        }
        TIOCSWINSZ => {
            let bytes = user.read_vec(arg, 8)?;
            let size: [u16; 4] =
                std::array::from_fn(|i| u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]));
            let t = proc.fds.terminal_mut(index)?;
            let changed = t.winsize != size;
            t.winsize = size;
            if let (true, Some(pgid)) = (changed, t.foreground) {
                signal_group(proc, pgid, signals::SIGWINCH);
            }
            value(0)
        }
        TIOCGPTN if master => {
            user.write_u32(arg, index as u32)?;
            value(0)
        }
        TIOCSPTLCK if master => {
            let lock = user.read_u32(arg)? != 0;
            proc.fds.terminal_mut(index)?.locked = lock;
            value(0)
        }
        TIOCGPTLCK if master => {
            user.write_u32(arg, u32::from(t.locked))?;
            value(0)
        }
        TIOCGPTPEER if master => {
            if arg & !(u64::from(O_ACCMODE) | O_NOCTTY | u64::from(O_NONBLOCK) | O_CLOEXEC) != 0 {
                return Err(Errno::EINVAL);
            }
            let status = arg as u32 & (O_ACCMODE | O_NONBLOCK);
            value(open_slave(proc, index, status, arg & O_CLOEXEC != 0)?)
        }
        TIOCSCTTY => {
            acquire(proc, index, true)?;
            value(0)
        }
        TIOCNOTTY => {
            if master || controlling(proc) != Some(index) {
                return Err(Errno::ENOTTY);
            }
            // The session leader gives it up for the session: its foreground group is told.
            if ids(proc).0 == proc.pid {
                let t = proc.fds.terminal_mut(index)?;
                let foreground = t.foreground.take();
                t.session = None;
                if let Some(pgid) = foreground {
                    signal_group(proc, pgid, signals::SIGHUP);
                    signal_group(proc, pgid, signals::SIGCONT);
                }
            }
            value(0)
        }
        TIOCGPGRP | TIOCGSID => {
            // On the slave only the caller's controlling terminal answers.
            if !master && controlling(proc) != Some(index) {
                return Err(Errno::ENOTTY);
            }
            let t = proc.fds.terminal(index)?;
            let id = if request == TIOCGSID {
                t.session.ok_or(Errno::ENOTTY)?
            } else {
                t.foreground.unwrap_or(0)
            };
            user.write_u32(arg, id as u32)?;
            value(0)
        }
        TIOCSPGRP => set_foreground(proc, user, index, arg),
        _ => Err(Errno::ENOTTY),
    }
}

/// TIOCSPGRP: the caller's controlling terminal's foreground group becomes a group of the
/// caller's session.
fn set_foreground(proc: &mut GuestProcess, user: &UserMemory, index: usize, arg: u64) -> SysResult {
    if controlling(proc) != Some(index) {
        return Err(Errno::ENOTTY);
    }
    let pgid = user.read_u32(arg)? as i32;
    if pgid < 0 {
        return Err(Errno::EINVAL);
    }
    let pgid = pgid as u64;
    let (sid, _) = ids(proc);
    let mut members = proc
        .tree
        .pids()
        .filter(|(_, e)| e.pgid == pgid && e.exit.is_none());
    match members.next() {
        None => return Err(Errno::ESRCH),
        Some((_, e)) if e.sid != sid => return Err(Errno::EPERM),
        Some(_) => {}
    }
    proc.fds.terminal_mut(index)?.foreground = Some(pgid);
    value(0)
}

/// Whether `object` is a terminal end: its terminal and whether it is the master.
pub(super) fn end_of(object: &Object) -> Option<(usize, bool)> {
    match *object {
        Object::TerminalMaster(i) => Some((i, true)),
        Object::TerminalSlave(i) => Some((i, false)),
        _ => None,
    }
}
