//! epoll over the fds that exist: pipes, socketpair ends, stdin and the captured output
//! (Python's selectors.DefaultSelector, and so asyncio, use epoll).
//!
//! Readiness is what poll reports (poll.rs, `ready_bits`), level-triggered. An edge-triggered
//! registration (EPOLLET) of a pipe end or a socket of the VM's reports its events once, and
//! again only after something happened on the file: bytes went in or out, an end closed or
//! was shut down (`FdTable::readiness_mark`), as Linux reports each wakeup once. Anything that
//! happens reports it again, so a program never misses an edge; it may see one more than on
//! Linux (a read that left data behind reports it anew). Other files (a host socket, a
//! listener, stdin) stay level-triggered under EPOLLET. EPOLLONESHOT disarms a registration
//! after it was reported. Waiting follows poll's rule (poll.rs): with nothing ready the thread
//! waits for another thread's progress or its timeout, then looks again.
//!
//! Regular files and directories cannot be registered (EPERM, as on Linux); nor can another
//! epoll instance here (EPERM: nesting is not supported).

use std::time::Duration;

use super::files::fd_arg;
use super::poll::{ready_bits, timeout_ms};
use super::{value, wait_ready_on, SysResult, UserMemory};
use super::{POLLERR, POLLHUP};
use crate::errno::Errno;
use crate::process::{Edge, GuestProcess, Interest, Object};

const EPOLL_CTL_ADD: u64 = 1;
const EPOLL_CTL_DEL: u64 = 2;
const EPOLL_CTL_MOD: u64 = 3;
const EPOLLEXCLUSIVE: u32 = 1 << 28;
const EPOLLONESHOT: u32 = 1 << 30;
const EPOLLET: u32 = 1 << 31;
/// Flags of a registration that are not events.
const EPOLL_FLAGS: u32 = EPOLLEXCLUSIVE | (1 << 29) | EPOLLONESHOT | EPOLLET;
const O_CLOEXEC: u64 = 0o2000000;
/// `struct epoll_event` is packed on x86-64: u32 events, u64 data.
const EVENT_SIZE: u64 = 12;

/// The epoll instance at `epfd`: EBADF when not open, EINVAL when not an epoll fd.
fn epoll_index(proc: &GuestProcess, epfd: u64) -> Result<usize, Errno> {
    match proc.fds.get(fd_arg(epfd))?.object {
        Object::Epoll(i) => Ok(i),
        _ => Err(Errno::EINVAL),
    }
}

fn create(proc: &mut GuestProcess, cloexec: bool) -> SysResult {
    let description = proc.fds.new_epoll();
    value(proc.fds.install(description, 0, cloexec)?)
}

/// epoll_create(size): size must be positive (and is otherwise ignored, as on Linux).
pub(crate) fn epoll_create(
    proc: &mut GuestProcess,
    _user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    if args[0] as u32 as i32 <= 0 {
        return Err(Errno::EINVAL);
    }
    create(proc, false)
}

/// epoll_create1(flags): EPOLL_CLOEXEC is the only flag.
pub(crate) fn epoll_create1(
    proc: &mut GuestProcess,
    _user: &UserMemory,
    args: [u64; 6],
) -> SysResult {
    let flags = u64::from(args[0] as u32);
    if flags & !O_CLOEXEC != 0 {
        return Err(Errno::EINVAL);
    }
    create(proc, flags != 0)
}

/// epoll_ctl(epfd, op, fd, event)
pub(crate) fn epoll_ctl(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    let [epfd, op, fd, event, ..] = args;
    let (epfd, fd) = (fd_arg(epfd), fd_arg(fd));
    let index = epoll_index(proc, epfd)?;
    let target = proc.fds.get(fd)?;
    if fd == epfd {
        return Err(Errno::EINVAL);
    }
    if matches!(target.object, Object::Node(_) | Object::Epoll(_)) {
        return Err(Errno::EPERM);
    }
    let description = proc.fds.description_id(fd)?;
    let interest = |user: &UserMemory| -> Result<Interest, Errno> {
        let events = user.read_u32(event)?;
        Ok(Interest {
            events,
            data: user.read_u64(event + 4)?,
            description,
        })
    };
    let set = proc.fds.epoll_mut(index)?;
    match u64::from(op as u32) {
        EPOLL_CTL_ADD => set.add(fd, interest(user)?)?,
        EPOLL_CTL_MOD => {
            let interest = interest(user)?;
            if interest.events & EPOLLEXCLUSIVE != 0 {
                return Err(Errno::EINVAL);
            }
            set.modify(fd, interest)?
        }
        EPOLL_CTL_DEL => set.remove(fd, description)?,
        _ => return Err(Errno::EINVAL),
    }
    value(0)
}

/// The registrations of epoll instance `index` that are ready now: (fd, events to report,
/// data). Stale registrations (the fd now refers to another description) and disarmed ones are
/// skipped, and so are an edge-triggered one's events already reported while nothing happened
/// on its file since; registered epoll instances cannot exist (refused by epoll_ctl).
pub(super) fn ready_list(proc: &GuestProcess, index: usize) -> Result<Vec<(u64, u32, u64)>, Errno> {
    let set = proc.fds.epoll(index)?;
    let mut ready = Vec::new();
    for (fd, interest) in set.interests() {
        if proc.fds.description_id(fd) != Ok(interest.description)
            || interest.events & !EPOLL_FLAGS == 0
        {
            continue;
        }
        let wanted = interest.events | u32::from(POLLERR | POLLHUP);
        let mut events = u32::from(ready_bits(proc, fd)) & wanted & !EPOLL_FLAGS;
        if let Some(edge) = set.edge(fd) {
            if interest.events & EPOLLET != 0 && proc.fds.readiness_mark(fd) == Some(edge.mark) {
                events &= !edge.reported;
            }
        }
        if events != 0 {
            ready.push((fd, events, interest.data));
        }
    }
    Ok(ready)
}

/// Epoll instance `index` reported `events` of `fd`: a one-shot registration is disarmed, an
/// edge-triggered one of a file with a readiness mark remembers them with the mark.
fn note_reported(proc: &mut GuestProcess, index: usize, fd: u64, events: u32) -> Result<(), Errno> {
    let mark = proc.fds.readiness_mark(fd);
    let set = proc.fds.epoll_mut(index)?;
    let Some((_, interest)) = set.interests().find(|&(f, _)| f == fd) else {
        return Ok(());
    };
    if interest.events & EPOLLONESHOT != 0 {
        set.disarm(fd, EPOLL_FLAGS);
    }
    if let (true, Some(mark)) = (interest.events & EPOLLET != 0, mark) {
        let earlier = set
            .edge(fd)
            .filter(|edge| edge.mark == mark)
            .map_or(0, |edge| edge.reported);
        set.reported(
            fd,
            Edge {
                reported: earlier | events,
                mark,
            },
        );
    }
    Ok(())
}

fn wait_common(
    proc: &mut GuestProcess,
    user: &UserMemory,
    args: [u64; 6],
    timeout: Option<Duration>,
) -> SysResult {
    let [epfd, events, maxevents, ..] = args;
    let index = epoll_index(proc, epfd)?;
    let max = maxevents as u32 as i32;
    if max <= 0 || max as u64 > i32::MAX as u64 / EVENT_SIZE {
        return Err(Errno::EINVAL);
    }
    user.check(events, max as u64 * EVENT_SIZE)?;
    let mut ready = ready_list(proc, index)?;
    ready.truncate(max as usize);
    if ready.is_empty() {
        if timeout == Some(Duration::ZERO) {
            return value(0);
        }
        let host = proc
            .fds
            .epoll(index)?
            .interests()
            .flat_map(|(fd, interest)| super::inet::host_interest(proc, fd, interest.events as u16))
            .collect();
        return wait_ready_on(proc, timeout, host);
    }
    let mut out = Vec::with_capacity(ready.len() * EVENT_SIZE as usize);
    for &(_, events, data) in &ready {
        out.extend_from_slice(&events.to_le_bytes());
        out.extend_from_slice(&data.to_le_bytes());
    }
    user.write(events, &out)?;
    for &(fd, events, _) in &ready {
        note_reported(proc, index, fd, events)?;
    }
    value(ready.len() as u64)
}

/// epoll_wait(epfd, events, maxevents, timeout_ms)
pub(crate) fn epoll_wait(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    wait_common(proc, user, args, timeout_ms(args[3]))
}

/// epoll_pwait(epfd, events, maxevents, timeout_ms, sigmask, sigsetsize): the temporary signal
/// mask changes nothing since no signal is delivered.
pub(crate) fn epoll_pwait(proc: &mut GuestProcess, user: &UserMemory, args: [u64; 6]) -> SysResult {
    wait_common(proc, user, args, timeout_ms(args[3]))
}
