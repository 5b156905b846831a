//! The file-descriptor table: fds point at open file descriptions (shared by dup, carrying the
//! offset and status flags, as in Linux), which point at what was opened.
//!
//! In-memory channels live in the table too: a pipe is one byte queue; a socketpair is two
//! (one per direction), each end reading one and writing the other; an epoll instance is an
//! interest list (process/epoll.rs).

use std::collections::VecDeque;
use std::sync::Arc;

use super::epoll::EpollSet;
use super::locks::{FileLocks, LockOwner};
use super::output::Stream;
use super::terminal::Terminal;
use crate::codec::{DecodeError, Decoder, Encoder};
use crate::errno::Errno;
use crate::fs::Node;
use crate::fs::Vfs;
use crate::net::loopback::Queue;
use crate::net::InetSocket;

/// Linux's default RLIMIT_NOFILE: the guest's fd limit (soft and hard).
pub const FD_LIMIT: u64 = 1024;
/// Linux's SCM_MAX_FD: the most descriptions one message passes.
pub const MAX_PASSED_PER_MESSAGE: usize = 253;
/// Descriptions in flight on sockets at once at most (Linux bounds them by RLIMIT_NOFILE).
const MAX_IN_FLIGHT: usize = FD_LIMIT as usize;
/// Linux's default pipe capacity.
pub const PIPE_CAPACITY: usize = 64 * 1024;
/// The largest capacity F_SETPIPE_SZ grants (Linux's default /proc/sys/fs/pipe-max-size).
pub const MAX_PIPE_CAPACITY: usize = 1 << 20;
/// What all live pipes (and socket directions) may hold at once at their full capacity. The
/// buffers live in the VMM, outside the guest's memory limit, so this bounds them per VM: past
/// it a new pipe holds one page, as Linux's are past pipe-user-pages-soft, and F_SETPIPE_SZ
/// cannot grow one. Pipes then hold at most the budget plus a page per pipe.
const PIPE_BUDGET: usize = 16 << 20;
const PAGE: usize = 4096;
const ETOOMANYREFS: Errno = Errno(109);

// open(2) status flags the table keeps (F_GETFL/F_SETFL).
pub const O_ACCMODE: u32 = 0o3;
pub const O_RDONLY: u32 = 0o0;
pub const O_WRONLY: u32 = 0o1;
pub const O_RDWR: u32 = 0o2;
pub const O_APPEND: u32 = 0o2000;
pub const O_NONBLOCK: u32 = 0o4000;

/// What an open file description refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Object {
    /// The run's stdin bytes (ProcessConfig.stdin); the description's offset is the position.
    Stdin,
    /// A captured output stream.
    Output(Stream),
    /// The read or write end of an in-memory pipe (an index into the pipe table).
    PipeRead(usize),
    PipeWrite(usize),
    /// A file or directory of the guest file system, held open in the Vfs.
    Node(Node),
    /// One end of an AF_UNIX SOCK_STREAM socketpair: it reads pipe `rx` and writes pipe `tx`
    /// (the other end has them swapped). `shut_write` records shutdown(SHUT_WR), which
    /// already let go of this end's hold on `tx`.
    Socket {
        rx: usize,
        tx: usize,
        shut_write: bool,
    },
    /// An epoll instance (an index into the epoll table).
    Epoll(usize),
    /// A socket(2) stream socket not connected yet: unbound, bound or listening (an index into
    /// the endpoint table). connect turns it into a `Socket`.
    Endpoint(usize),
    /// An eventfd: its counter (shared by the description's fds) and EFD_SEMAPHORE.
    EventFd {
        count: u64,
        semaphore: bool,
    },
    /// An Internet socket whose traffic leaves the VM through a host socket (an index into the
    /// table of them; `crate::net`).
    Inet(usize),
    /// An AF_UNIX SOCK_DGRAM socket (one end of a socketpair or one made by socket(2)), or
    /// a connected SOCK_SEQPACKET one (an index into the table of them).
    UnixDatagram(usize),
    /// A pidfd: the process it names, by pid (the tree never gives an id twice, so once that
    /// process is reaped the pidfd names none).
    Pidfd(u64),
    /// The master (/dev/ptmx) or slave (/dev/pts/N) end of a pseudo-terminal (an index into
    /// the table of them, which is also its N).
    TerminalMaster(usize),
    TerminalSlave(usize),
}

/// An AF_UNIX SOCK_DGRAM or connected SOCK_SEQPACKET socket: the datagrams sent to it, each
/// with its sender's address (empty: an unnamed sender), its own address and its peer.
#[derive(Debug, Clone, Default)]
pub struct UnixDatagram {
    /// SOCK_SEQPACKET: connected for good, and once the peer is gone a receive of an empty
    /// queue is end of file and a send EPIPE.
    pub seqpacket: bool,
    pub inbox: Queue<Vec<u8>>,
    /// The socket it sends to without an address (the other end of a socketpair, or the one
    /// it connected to), while that is open.
    pub peer: Option<usize>,
    /// The peer closed and no send has reported it yet (Linux's next send is ECONNREFUSED).
    pub peer_closed: bool,
    /// The address it is bound to (a sockaddr as the program reads it back).
    pub name: Option<Vec<u8>>,
    /// The namespace key of that address (None also for a connection's end, which only
    /// reads its listener's name back).
    key: Option<Vec<u8>>,
}

/// A socket made by socket(2) before it is connected. Its address lives only in this VM's
/// namespace (`FdTable::bind`): nothing ever leaves the VM.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// AF_UNIX, AF_INET or AF_INET6.
    pub family: u16,
    /// An AF_UNIX SOCK_SEQPACKET socket: its connections keep message boundaries.
    pub seqpacket: bool,
    /// The address it is bound to (a sockaddr as the program would read it back).
    pub name: Option<Vec<u8>>,
    /// The namespace key of that address.
    key: Option<Vec<u8>>,
    /// listen(2)'s backlog and the connections waiting for accept (None: not listening).
    pub listening: Option<(usize, VecDeque<Connection>)>,
    /// IPV6_V6ONLY: an AF_INET6 socket bound to the wildcard takes IPv4 connections too
    /// unless it is set (it is not by default, as on Linux).
    pub v6only: bool,
}

/// A connection waiting on a listener: the server's end and its (local, peer) addresses.
#[derive(Debug, Clone)]
pub struct Connection {
    pub object: Object,
    pub names: (Vec<u8>, Vec<u8>),
}

#[derive(Debug, Clone)]
pub struct Description {
    pub object: Object,
    /// Access mode and status flags (O_ACCMODE, O_APPEND, O_NONBLOCK...), as F_GETFL shows them.
    pub flags: u32,
    /// File position (for directories: the index of the next entry getdents64 returns).
    pub offset: u64,
    /// A /proc file's bytes, made when it was opened (reads see that moment, as a Linux
    /// /proc file read in one go does); for a directory, its getdents64 records, made when a
    /// read starts at the first entry.
    pub contents: Option<Arc<[u8]>>,
    /// A socket's SO_LINGER timeout in seconds while it is on: zero makes its close reset an
    /// Internet connection, as TCP's RST (`FdTable::reset_peer`).
    pub linger: Option<u32>,
    /// A socket's boolean options that only read back (SO_REUSEADDR and the like), one bit
    /// each (`syscalls/sockets.rs`).
    pub socket_options: u8,
    refs: u32,
}

impl Description {
    pub fn new(object: Object, flags: u32) -> Description {
        Description {
            object,
            flags,
            offset: 0,
            contents: None,
            linger: None,
            socket_options: 0,
            refs: 0,
        }
    }

    pub fn readable(&self) -> bool {
        self.flags & O_ACCMODE != O_WRONLY
    }

    pub fn writable(&self) -> bool {
        matches!(self.flags & O_ACCMODE, O_WRONLY | O_RDWR)
    }

    pub fn nonblocking(&self) -> bool {
        self.flags & O_NONBLOCK != 0
    }
}

/// Descriptions passed with SCM_RIGHTS, riding on a stretch of a socket direction's bytes:
/// the receive that reads the stretch's first byte takes them, and stops at the stretch's end
/// (as Linux's receive stops after the message that carried them). Each holds a reference.
#[derive(Debug, Clone)]
struct InFlight {
    /// Bytes buffered before the stretch.
    start: usize,
    len: usize,
    descriptions: Vec<usize>,
}

/// Descriptions taken off a socket with the bytes they rode on, each holding a reference until
/// `FdTable::receive` installs it or `FdTable::discard` lets it go.
#[derive(Debug, Default)]
#[must_use]
pub struct Passed(Vec<usize>);

impl Passed {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// An in-memory pipe (also each direction of a socket).
#[derive(Debug, Clone)]
pub struct Pipe {
    buffer: VecDeque<u8>,
    in_flight: VecDeque<InFlight>,
    readers: u32,
    writers: u32,
    /// The reading socket end was shut down (SHUT_RD): it reads end of file, writers get EPIPE.
    shut_read: bool,
    /// Bytes it holds at most (F_SETPIPE_SZ): a power of two of at least a page.
    capacity: usize,
    /// A TCP connection's direction whose reader has not closed yet, or closed and was not
    /// written to since: a write after the reader's close is taken (and dropped) once, as
    /// Linux's first send after the peer's FIN is, before the peer's reset comes back.
    send_after_close: bool,
    /// Bytes written into it and taken out of it since it was made (`PipeMark`).
    moved: u64,
}

/// What the readiness of a pipe end or a socket follows (`FdTable::readiness_mark`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadinessMark([Option<PipeMark>; 2], bool);

/// What a pipe's readiness follows: bytes moved through it, its ends, its capacity. Any change
/// of readiness changes it, so an edge-triggered epoll registration compares it with the one
/// it last reported (`EpollSet`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipeMark {
    moved: u64,
    readers: u32,
    writers: u32,
    shut_read: bool,
    capacity: usize,
}

impl Default for Pipe {
    fn default() -> Pipe {
        Pipe {
            buffer: VecDeque::new(),
            in_flight: VecDeque::new(),
            readers: 0,
            writers: 0,
            shut_read: false,
            capacity: PIPE_CAPACITY,
            send_after_close: false,
            moved: 0,
        }
    }
}

/// Whether a socket name is an Internet address (not AF_UNIX's).
fn is_internet_name(name: &[u8]) -> bool {
    name.len() >= 2 && i32::from(u16::from_le_bytes([name[0], name[1]])) != libc::AF_UNIX
}

/// Why a pipe transfer did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipeError {
    /// Linux would block here; with one thread nothing could ever end the wait.
    WouldBlock,
    /// Writing with no read end left (EPIPE; SIGPIPE is never delivered).
    NoReader,
}

impl Pipe {
    /// Takes up to `max` buffered bytes (an empty result means end of file: no writer left)
    /// and the descriptions riding on them; a read reaching passed descriptions stops at the
    /// end of their stretch.
    fn take(&mut self, max: usize) -> Result<(Vec<u8>, Vec<usize>), PipeError> {
        if self.shut_read {
            return Ok((Vec::new(), Vec::new()));
        }
        if self.buffer.is_empty() {
            return if self.writers == 0 {
                Ok((Vec::new(), Vec::new()))
            } else {
                Err(PipeError::WouldBlock)
            };
        }
        let mut n = max.min(self.buffer.len());
        let mut passed = Vec::new();
        if let Some(first) = self.in_flight.front() {
            if first.start < n {
                n = n.min(first.start + first.len);
                passed = self
                    .in_flight
                    .pop_front()
                    .map_or_else(Vec::new, |f| f.descriptions);
            }
        }
        for later in &mut self.in_flight {
            later.start -= n;
        }
        self.moved = self.moved.wrapping_add(n as u64);
        Ok((self.buffer.drain(..n).collect(), passed))
    }

    /// Appends what fits and returns how much that was. Writing nothing succeeds whoever reads,
    /// as on Linux (a pipe, or a socket whose peer is gone but which was not shut down itself).
    pub fn write(&mut self, data: &[u8]) -> Result<usize, PipeError> {
        if data.is_empty() {
            return Ok(0);
        }
        if self.readers == 0 && std::mem::take(&mut self.send_after_close) {
            return Ok(data.len());
        }
        if self.readers == 0 || self.shut_read {
            return Err(PipeError::NoReader);
        }
        let room = self.room();
        if room == 0 {
            return Err(PipeError::WouldBlock);
        }
        let n = room.min(data.len());
        self.buffer.extend(&data[..n]);
        self.moved = self.moved.wrapping_add(n as u64);
        Ok(n)
    }

    pub fn mark(&self) -> PipeMark {
        PipeMark {
            moved: self.moved,
            readers: self.readers,
            writers: self.writers,
            shut_read: self.shut_read,
            capacity: self.capacity,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// Room left for a write (what a writer may put in without blocking).
    pub fn room(&self) -> usize {
        self.capacity.saturating_sub(self.buffer.len())
    }

    pub fn has_writers(&self) -> bool {
        self.writers > 0
    }

    pub fn has_readers(&self) -> bool {
        self.readers > 0 && !self.shut_read
    }

    /// No more data will come: no writer is left, or the reading end was shut down.
    pub fn input_closed(&self) -> bool {
        self.writers == 0 || self.shut_read
    }

    /// Copies up to `max` buffered bytes without taking them (recv with MSG_PEEK).
    pub fn peek(&self, max: usize) -> Result<Vec<u8>, PipeError> {
        if self.buffer.is_empty() && !self.input_closed() {
            return Err(PipeError::WouldBlock);
        }
        let n = if self.shut_read {
            0
        } else {
            max.min(self.buffer.len())
        };
        Ok(self.buffer.iter().take(n).copied().collect())
    }
}

/// A FIFO of the file system as the tree uses it: its pipe while an end is open (or an opener
/// waits), how many times each end (read, write) was opened, and the threads waiting in a
/// blocking open for the other end. A waiting opener already counts as a reader or writer of
/// the pipe, as on Linux, so the other end's open goes through and its first write is kept.
#[derive(Debug, Clone, Default)]
struct Fifo {
    pipe: Option<usize>,
    opens: [u64; 2],
    waiting: Vec<FifoWaiter>,
}

/// A thread blocked opening a FIFO: which end, and the other end's open count it saw.
#[derive(Debug, Clone, Copy)]
struct FifoWaiter {
    pid: u64,
    tid: u64,
    write: bool,
    seen: u64,
}

/// What opening a FIFO came to.
#[derive(Debug)]
pub enum FifoOpen {
    /// The fd of the end opened.
    Open(u64),
    /// A blocking open with no other end yet: the thread waits (and tries again).
    Wait,
}

/// One process's fd numbers and fd limit, parked while another process of the tree runs.
#[derive(Debug, Clone, Default)]
pub struct FdSlots {
    fds: Vec<Option<Slot>>,
    limit: u64,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    description: usize,
    cloexec: bool,
}

#[derive(Debug, Clone)]
pub struct FdTable {
    fds: Vec<Option<Slot>>,
    descriptions: Vec<Option<Description>>,
    pipes: Vec<Option<Pipe>>,
    epolls: Vec<Option<EpollSet>>,
    endpoints: Vec<Option<Endpoint>>,
    inets: Vec<Option<InetSocket>>,
    unix_datagrams: Vec<Option<UnixDatagram>>,
    /// Bound addresses (namespace key) -> endpoint.
    bound: std::collections::BTreeMap<Vec<u8>, usize>,
    /// Bound AF_UNIX datagram addresses (namespace key) -> the socket bound there.
    datagram_names: std::collections::BTreeMap<Vec<u8>, usize>,
    /// Loopback UDP ports ((IPv6, UDP-Lite, port)) -> the Internet datagram socket bound there.
    datagram_ports: std::collections::BTreeMap<(bool, bool, u16), usize>,
    /// A connected socket's (local, peer) addresses, by the channel it receives on; a
    /// socketpair's ends have none (unnamed).
    socket_names: std::collections::BTreeMap<usize, (Vec<u8>, Vec<u8>)>,
    /// The receive channels of Internet sockets whose peer reset the connection, and whether
    /// the ECONNRESET of a read past the bytes left is still to come (it comes once).
    resets: std::collections::BTreeMap<usize, bool>,
    /// The next ephemeral port tried.
    next_port: u16,
    /// The soft RLIMIT_NOFILE: new fds are below it.
    limit: u64,
    /// See `take_released_nodes`.
    released_nodes: Vec<Node>,
    /// See `take_closed_nodes`.
    closed_nodes: Vec<Node>,
    /// Advisory locks on files (flock, fcntl), held by descriptions of this table or by the
    /// tree's processes.
    pub locks: FileLocks,
    /// The FIFOs in use.
    fifos: std::collections::HashMap<Node, Fifo>,
    /// Pseudo-terminal pairs, while an end is open.
    terminals: Vec<Option<Terminal>>,
    /// See `take_hangups`.
    hangups: Vec<u64>,
}

/// Linux's default ephemeral port range starts here.
const FIRST_EPHEMERAL_PORT: u16 = 32768;

impl FdTable {
    /// fd 0 is the run's stdin, fds 1 and 2 the captured stdout and stderr.
    pub fn new() -> FdTable {
        let mut table = FdTable {
            fds: Vec::new(),
            descriptions: Vec::new(),
            pipes: Vec::new(),
            epolls: Vec::new(),
            endpoints: Vec::new(),
            inets: Vec::new(),
            unix_datagrams: Vec::new(),
            bound: Default::default(),
            datagram_names: Default::default(),
            datagram_ports: Default::default(),
            socket_names: Default::default(),
            resets: Default::default(),
            next_port: FIRST_EPHEMERAL_PORT,
            limit: FD_LIMIT,
            released_nodes: Vec::new(),
            closed_nodes: Vec::new(),
            locks: FileLocks::default(),
            fifos: Default::default(),
            terminals: Vec::new(),
            hangups: Vec::new(),
        };
        for (object, flags) in [
            (Object::Stdin, O_RDONLY),
            (Object::Output(Stream::Stdout), O_WRONLY),
            (Object::Output(Stream::Stderr), O_WRONLY),
        ] {
            // The table is empty and the limit is far above 3: these cannot fail.
            let _ = table.install(Description::new(object, flags), 0, false);
        }
        table
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Lowers (or restores up to FD_LIMIT) the soft fd limit; fds already open stay open.
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit.min(FD_LIMIT);
    }

    fn slot(&self, fd: u64) -> Result<Slot, Errno> {
        usize::try_from(fd)
            .ok()
            .and_then(|i| self.fds.get(i).copied().flatten())
            .ok_or(Errno::EBADF)
    }

    pub fn get(&self, fd: u64) -> Result<&Description, Errno> {
        let slot = self.slot(fd)?;
        self.descriptions[slot.description]
            .as_ref()
            .ok_or(Errno::EBADF)
    }

    pub fn get_mut(&mut self, fd: u64) -> Result<&mut Description, Errno> {
        let slot = self.slot(fd)?;
        self.descriptions[slot.description]
            .as_mut()
            .ok_or(Errno::EBADF)
    }

    /// The open fds in ascending order, with their descriptions.
    pub fn open_fds(&self) -> impl Iterator<Item = (u64, &Description)> + '_ {
        self.fds_of(None).map(|(fd, _, d)| (fd, d))
    }

    /// The open fds of a parked process (`slots`) or of the running one (None) in ascending
    /// order, with their descriptions' ids and the descriptions.
    pub fn fds_of<'a>(
        &'a self,
        slots: Option<&'a FdSlots>,
    ) -> impl Iterator<Item = (u64, usize, &'a Description)> + 'a {
        let fds = slots.map_or(&self.fds, |s| &s.fds);
        fds.iter().enumerate().filter_map(|(fd, slot)| {
            let id = slot.as_ref()?.description;
            Some((fd as u64, id, self.descriptions[id].as_ref()?))
        })
    }

    pub fn cloexec(&self, fd: u64) -> Result<bool, Errno> {
        Ok(self.slot(fd)?.cloexec)
    }

    pub fn set_cloexec(&mut self, fd: u64, cloexec: bool) -> Result<(), Errno> {
        self.slot(fd)?;
        if let Some(Some(slot)) = self.fds.get_mut(fd as usize) {
            slot.cloexec = cloexec;
        }
        Ok(())
    }

    fn lowest_free(&self, min_fd: u64) -> Result<usize, Errno> {
        let min = min_fd as usize;
        if min_fd >= self.limit {
            return Err(Errno::EINVAL);
        }
        let found = (min..self.fds.len())
            .find(|&i| self.fds[i].is_none())
            .unwrap_or(self.fds.len().max(min));
        if found as u64 >= self.limit {
            return Err(Errno::EMFILE);
        }
        Ok(found)
    }

    fn put(&mut self, fd: usize, slot: Slot) {
        if self.fds.len() <= fd {
            self.fds.resize(fd + 1, None);
        }
        self.fds[fd] = Some(slot);
        if let Some(Some(d)) = self.descriptions.get_mut(slot.description) {
            d.refs += 1;
        }
    }

    /// Opens a new description at the lowest free fd ≥ `min_fd`.
    pub fn install(
        &mut self,
        description: Description,
        min_fd: u64,
        cloexec: bool,
    ) -> Result<u64, Errno> {
        self.lowest_free(min_fd)?;
        self.adopt_object(&description.object);
        self.install_adopted(description, min_fd, cloexec)
    }

    /// `install` for a description whose channels already count it (an accepted connection).
    fn install_adopted(
        &mut self,
        description: Description,
        min_fd: u64,
        cloexec: bool,
    ) -> Result<u64, Errno> {
        let fd = self.lowest_free(min_fd)?;
        let index = free_index(&mut self.descriptions, description);
        self.put(
            fd,
            Slot {
                description: index,
                cloexec,
            },
        );
        Ok(fd as u64)
    }

    /// A new fd for the same description (dup, F_DUPFD): the lowest free fd ≥ `min_fd`.
    pub fn duplicate(&mut self, fd: u64, min_fd: u64, cloexec: bool) -> Result<u64, Errno> {
        let slot = self.slot(fd)?;
        let new_fd = self.lowest_free(min_fd)?;
        self.put(
            new_fd,
            Slot {
                description: slot.description,
                cloexec,
            },
        );
        Ok(new_fd as u64)
    }

    /// dup2/dup3: makes `new_fd` refer to `fd`'s description, closing what it held (returned
    /// when that was its last reference, for the caller to release).
    pub fn duplicate_to(
        &mut self,
        fd: u64,
        new_fd: u64,
        cloexec: bool,
    ) -> Result<Option<Object>, Errno> {
        let slot = self.slot(fd)?;
        if new_fd >= self.limit {
            return Err(Errno::EBADF);
        }
        if fd == new_fd {
            return Ok(None);
        }
        let released = self.close(new_fd).unwrap_or(None);
        self.put(
            new_fd as usize,
            Slot {
                description: slot.description,
                cloexec,
            },
        );
        Ok(released)
    }

    /// Closes `fd`. When it held the last reference to its description, the description's
    /// object is returned: pipes are released here, file-system nodes by the caller.
    pub fn close(&mut self, fd: u64) -> Result<Option<Object>, Errno> {
        let slot = self.slot(fd)?;
        self.fds[fd as usize] = None;
        while self.fds.last().is_some_and(|s| s.is_none()) {
            self.fds.pop();
        }
        let last_ref = match self.descriptions[slot.description].as_mut() {
            Some(d) => {
                if let Object::Node(node) = d.object {
                    self.closed_nodes.push(node);
                }
                d.refs -= 1;
                d.refs == 0
            }
            None => false,
        };
        if !last_ref {
            return Ok(None);
        }
        Ok(self.free_description(slot.description).map(|d| d.object))
    }

    /// Takes description `index` out of the table once its last reference went, letting go
    /// of its object's channels, of the locks it held and of its epoll registrations.
    fn free_description(&mut self, index: usize) -> Option<Description> {
        let d = self.descriptions[index].take()?;
        for set in self.epolls.iter_mut().flatten() {
            set.forget(index);
        }
        self.reset_peer(&d);
        self.release_object(&d.object);
        self.locks.release_owner(LockOwner::Description(index));
        Some(d)
    }

    /// The files the running process closed an fd of since the last call: a close lets go of
    /// its record locks on them (`GuestProcess::release`).
    pub fn take_closed_nodes(&mut self) -> Vec<Node> {
        std::mem::take(&mut self.closed_nodes)
    }

    /// The index of the description `fd` refers to: the owner of its flock and OFD locks.
    pub fn description_index(&self, fd: u64) -> Result<usize, Errno> {
        Ok(self.slot(fd)?.description)
    }

    /// close_range(2): closes (or with `only_cloexec` marks close-on-exec) fds first..=last;
    /// returns the objects whose last reference went.
    pub fn close_range(&mut self, first: u64, last: u64, only_cloexec: bool) -> Vec<Object> {
        let end = (last.min(self.fds.len() as u64)).saturating_add(1);
        let mut released = Vec::new();
        for fd in first..end {
            if only_cloexec {
                let _ = self.set_cloexec(fd, true);
            } else if let Ok(Some(object)) = self.close(fd) {
                released.push(object);
            }
        }
        released
    }

    /// Closes every fd marked close-on-exec (execve); returns the objects whose last reference
    /// went.
    pub fn close_on_exec(&mut self) -> Vec<Object> {
        let marked: Vec<u64> = (0..self.fds.len() as u64)
            .filter(|&fd| self.cloexec(fd) == Ok(true))
            .collect();
        marked
            .into_iter()
            .filter_map(|fd| self.close(fd).ok().flatten())
            .collect()
    }

    /// The fd numbers of a forked child: a copy of this process's, each referring to the same
    /// description (which counts the child's reference too).
    pub fn fork_slots(&mut self) -> FdSlots {
        let fds = self.fds.clone();
        for slot in fds.iter().flatten() {
            if let Some(Some(d)) = self.descriptions.get_mut(slot.description) {
                d.refs += 1;
            }
        }
        FdSlots {
            fds,
            limit: self.limit,
        }
    }

    /// A new close-on-exec fd of the running process, at the lowest free number, for the
    /// description another process's `fd` refers to (`slots`: its parked fd numbers;
    /// pidfd_getfd).
    pub fn duplicate_from(&mut self, slots: &FdSlots, fd: u64) -> Result<u64, Errno> {
        let slot = usize::try_from(fd)
            .ok()
            .and_then(|i| slots.fds.get(i).copied().flatten())
            .ok_or(Errno::EBADF)?;
        let new_fd = self.lowest_free(0)?;
        self.put(
            new_fd,
            Slot {
                description: slot.description,
                cloexec: true,
            },
        );
        Ok(new_fd as u64)
    }

    /// The fd an `install` at `min_fd` would take now: EMFILE when none is free.
    pub fn free_fd(&self, min_fd: u64) -> Result<u64, Errno> {
        self.lowest_free(min_fd).map(|fd| fd as u64)
    }

    /// Puts another process's fd numbers in place of the running one's (which `slots` then
    /// holds): the descriptions, pipes and sockets behind them are the tree's, shared.
    pub fn swap_slots(&mut self, slots: &mut FdSlots) {
        std::mem::swap(&mut self.fds, &mut slots.fds);
        std::mem::swap(&mut self.limit, &mut slots.limit);
    }

    /// A new pipe's index: of the default capacity while the budget has room for it, else of
    /// one page.
    fn add_pipe(&mut self) -> usize {
        let held: usize = self.pipes.iter().flatten().map(Pipe::capacity).sum();
        let capacity = if held + PIPE_CAPACITY <= PIPE_BUDGET {
            PIPE_CAPACITY
        } else {
            PAGE
        };
        free_index(
            &mut self.pipes,
            Pipe {
                capacity,
                ..Pipe::default()
            },
        )
    }

    /// Creates a pipe: (read description, write description), not yet installed.
    pub fn new_pipe(&mut self, flags: u32) -> (Description, Description) {
        let index = self.add_pipe();
        let status = flags & O_NONBLOCK;
        (
            Description::new(Object::PipeRead(index), O_RDONLY | status),
            Description::new(Object::PipeWrite(index), O_WRONLY | status),
        )
    }

    /// Opens FIFO `node` for reading or writing (`flags`: O_RDONLY or O_WRONLY and status
    /// flags) for thread `tid` of process `pid`, as Linux does: a reader opens at once when
    /// non-blocking or once a writer is there or came since it started waiting; a writer once
    /// a reader is there or came (ENXIO when non-blocking without one). `waiting` says whether
    /// another thread's registered wait is still going on (one left by a signal or an ended
    /// process is dropped). The fd is close-on-exec with `cloexec`.
    pub fn open_fifo(
        &mut self,
        node: Node,
        (flags, cloexec): (u32, bool),
        (pid, tid): (u64, u64),
        waiting: impl Fn(u64, u64) -> bool,
    ) -> Result<FifoOpen, Errno> {
        let write = flags & O_ACCMODE == O_WRONLY;
        let nonblocking = flags & O_NONBLOCK != 0;
        let mut fifo = self.fifos.remove(&node).unwrap_or_default();
        let stale: Vec<FifoWaiter> = fifo
            .waiting
            .iter()
            .filter(|w| (w.pid, w.tid) != (pid, tid) && !waiting(w.pid, w.tid))
            .copied()
            .collect();
        fifo.waiting
            .retain(|w| (w.pid, w.tid) == (pid, tid) || waiting(w.pid, w.tid));
        let pipe = match fifo
            .pipe
            .filter(|&p| self.pipes.get(p).is_some_and(Option::is_some))
        {
            Some(pipe) => pipe,
            None => self.add_pipe(),
        };
        fifo.pipe = Some(pipe);
        for w in stale {
            self.count_fifo_waiter(pipe, w.write, false);
        }
        let (side, other) = (usize::from(write), usize::from(!write));
        let mine = fifo
            .waiting
            .iter()
            .position(|w| (w.pid, w.tid) == (pid, tid));
        let p = self.pipes[pipe].as_ref().ok_or(Errno::EBADF)?;
        let other_there = if write { p.readers > 0 } else { p.writers > 0 };
        let other_came = mine.is_some_and(|i| fifo.opens[other] != fifo.waiting[i].seen);
        let result = if other_there || other_came || (nonblocking && !write) {
            if let Some(i) = mine {
                let w = fifo.waiting.remove(i);
                self.count_fifo_waiter(pipe, w.write, false);
            } else {
                fifo.opens[side] += 1;
            }
            let object = if write {
                Object::PipeWrite(pipe)
            } else {
                Object::PipeRead(pipe)
            };
            self.install(Description::new(object, flags), 0, cloexec)
                .map(FifoOpen::Open)
        } else if nonblocking {
            Err(Errno::ENXIO)
        } else {
            if mine.is_none() {
                fifo.opens[side] += 1;
                fifo.waiting.push(FifoWaiter {
                    pid,
                    tid,
                    write,
                    seen: fifo.opens[other],
                });
                self.count_fifo_waiter(pipe, write, true);
            }
            Ok(FifoOpen::Wait)
        };
        self.fifos.insert(node, fifo);
        // A pipe nobody holds (a refused open) goes, and with it the FIFO's buffer.
        self.free_unheld_pipe(pipe);
        result
    }

    /// A FIFO opener starts (`add`) or stops waiting: it counts as a reader or writer meanwhile.
    fn count_fifo_waiter(&mut self, pipe: usize, write: bool, add: bool) {
        if let Some(p) = self.pipes[pipe].as_mut() {
            let count = if write {
                &mut p.writers
            } else {
                &mut p.readers
            };
            *count = if add {
                count.saturating_add(1)
            } else {
                count.saturating_sub(1)
            };
        }
    }

    /// Whether any FIFO is open or being opened (a snapshot cannot hold one).
    pub fn has_fifos(&self) -> bool {
        self.fifos.values().any(|f| f.pipe.is_some())
    }

    /// Whether any pidfd is open (a snapshot cannot hold one: a restored tree gives its pids
    /// out again).
    pub fn has_pidfds(&self) -> bool {
        self.descriptions
            .iter()
            .flatten()
            .any(|d| matches!(d.object, Object::Pidfd(_)))
    }

    /// Creates a connected socketpair: two read-write descriptions, not yet installed.
    pub fn new_socketpair(&mut self, flags: u32) -> (Description, Description) {
        let a_to_b = self.add_pipe();
        let b_to_a = self.add_pipe();
        let status = O_RDWR | (flags & O_NONBLOCK);
        (
            Description::new(
                Object::Socket {
                    rx: b_to_a,
                    tx: a_to_b,
                    shut_write: false,
                },
                status,
            ),
            Description::new(
                Object::Socket {
                    rx: a_to_b,
                    tx: b_to_a,
                    shut_write: false,
                },
                status,
            ),
        )
    }

    /// Creates a connected AF_UNIX datagram (or `seqpacket`) socketpair: two read-write
    /// descriptions, not yet installed.
    pub fn new_datagram_pair(&mut self, flags: u32, seqpacket: bool) -> (Description, Description) {
        let end = UnixDatagram {
            seqpacket,
            ..UnixDatagram::default()
        };
        let a = free_index(&mut self.unix_datagrams, end.clone());
        let b = free_index(&mut self.unix_datagrams, end);
        self.unix_datagrams[a]
            .iter_mut()
            .for_each(|s| s.peer = Some(b));
        self.unix_datagrams[b]
            .iter_mut()
            .for_each(|s| s.peer = Some(a));
        let status = O_RDWR | (flags & O_NONBLOCK);
        (
            Description::new(Object::UnixDatagram(a), status),
            Description::new(Object::UnixDatagram(b), status),
        )
    }

    /// Creates an unconnected AF_UNIX datagram socket's description (socket(2)), not yet
    /// installed.
    pub fn new_unix_datagram(&mut self, flags: u32) -> Description {
        let index = free_index(&mut self.unix_datagrams, UnixDatagram::default());
        Description::new(Object::UnixDatagram(index), O_RDWR | (flags & O_NONBLOCK))
    }

    /// Binds AF_UNIX datagram socket `index` to `name` under namespace `key`: EADDRINUSE if
    /// taken, EINVAL if it is bound already.
    pub fn bind_unix_datagram(
        &mut self,
        index: usize,
        key: Vec<u8>,
        name: Vec<u8>,
    ) -> Result<(), Errno> {
        if self.unix_datagram(index)?.key.is_some() {
            return Err(Errno::EINVAL);
        }
        if self.datagram_names.contains_key(&key) {
            return Err(Errno::EADDRINUSE);
        }
        self.datagram_names.insert(key.clone(), index);
        let socket = self.unix_datagram_mut(index)?;
        socket.key = Some(key);
        socket.name = Some(name);
        Ok(())
    }

    /// The AF_UNIX datagram socket bound at `key`.
    pub fn unix_datagram_at(&self, key: &[u8]) -> Option<usize> {
        self.datagram_names.get(key).copied()
    }

    /// Whether a stream socket is bound at `key`.
    pub fn stream_bound(&self, key: &[u8]) -> bool {
        self.bound.contains_key(key)
    }

    pub fn unix_datagram(&self, index: usize) -> Result<&UnixDatagram, Errno> {
        self.unix_datagrams
            .get(index)
            .and_then(|s| s.as_ref())
            .ok_or(Errno::EBADF)
    }

    pub fn unix_datagram_mut(&mut self, index: usize) -> Result<&mut UnixDatagram, Errno> {
        self.unix_datagrams
            .get_mut(index)
            .and_then(|s| s.as_mut())
            .ok_or(Errno::EBADF)
    }

    /// shutdown(2) of the socket at `fd`: SHUT_WR gives the peer end of file (once), SHUT_RD
    /// makes this end read end of file and the peer's writes fail with EPIPE.
    pub fn shutdown_socket(&mut self, fd: u64, read: bool, write: bool) -> Result<(), Errno> {
        let desc = self.get_mut(fd)?;
        let Object::Socket { rx, tx, shut_write } = &mut desc.object else {
            return Err(Errno::ENOTSOCK);
        };
        let (rx, tx) = (*rx, *tx);
        let release_tx = write && !*shut_write;
        if write {
            *shut_write = true;
        }
        if release_tx {
            self.pipes[tx]
                .iter_mut()
                .for_each(|p| p.writers = p.writers.saturating_sub(1));
        }
        if read {
            self.pipes[rx].iter_mut().for_each(|p| p.shut_read = true);
        }
        Ok(())
    }

    /// Creates an unconnected socket's description (socket(2)), not yet installed.
    pub fn new_endpoint(&mut self, family: u16, seqpacket: bool, flags: u32) -> Description {
        let index = free_index(
            &mut self.endpoints,
            Endpoint {
                family,
                seqpacket,
                name: None,
                key: None,
                listening: None,
                v6only: false,
            },
        );
        Description::new(Object::Endpoint(index), O_RDWR | (flags & O_NONBLOCK))
    }

    pub fn endpoint(&self, index: usize) -> Result<&Endpoint, Errno> {
        self.endpoints
            .get(index)
            .and_then(|e| e.as_ref())
            .ok_or(Errno::EBADF)
    }

    pub fn endpoint_mut(&mut self, index: usize) -> Result<&mut Endpoint, Errno> {
        self.endpoints
            .get_mut(index)
            .and_then(|e| e.as_mut())
            .ok_or(Errno::EBADF)
    }

    /// Whether any socket has an address, a connection by address or SO_LINGER set (a
    /// template snapshot cannot hold them).
    pub fn has_addressed_sockets(&self) -> bool {
        self.endpoints.iter().any(Option::is_some)
            || self.inets.iter().any(Option::is_some)
            || self.unix_datagrams.iter().any(Option::is_some)
            || !self.socket_names.is_empty()
            || self
                .descriptions
                .iter()
                .flatten()
                .any(|d| d.linger.is_some() || d.socket_options != 0)
    }

    /// The running process's lowest fd whose description `has_addressed_sockets` counts.
    pub(crate) fn addressed_socket_fd(&self) -> Option<u64> {
        self.addressed_fd_among(&self.fds)
    }

    /// The lowest of `fds` whose description is a socket with an address, a connection by
    /// address or SO_LINGER set.
    fn addressed_fd_among(&self, fds: &[Option<Slot>]) -> Option<u64> {
        let addressed = |d: &Description| {
            d.linger.is_some()
                || d.socket_options != 0
                || match d.object {
                    Object::Endpoint(_) | Object::Inet(_) | Object::UnixDatagram(_) => true,
                    Object::Socket { rx, .. } => self.socket_names.contains_key(&rx),
                    _ => false,
                }
        };
        fds.iter()
            .position(|slot| {
                slot.and_then(|s| self.descriptions.get(s.description)?.as_ref())
                    .is_some_and(addressed)
            })
            .map(|fd| fd as u64)
    }

    /// Creates an Internet socket's description, not yet installed.
    pub fn new_inet(&mut self, socket: InetSocket, flags: u32) -> Description {
        let index = free_index(&mut self.inets, socket);
        Description::new(Object::Inet(index), O_RDWR | (flags & O_NONBLOCK))
    }

    /// Makes the unconnected socket at `fd` the Internet socket `socket` (its connect leaves
    /// the VM); its in-VM address, if bound, is let go of.
    pub fn carry_out(&mut self, fd: u64, socket: InetSocket) -> Result<usize, Errno> {
        let Object::Endpoint(own) = self.get(fd)?.object else {
            return Err(Errno::EISCONN);
        };
        let index = free_index(&mut self.inets, socket);
        self.release_endpoint(own);
        self.get_mut(fd)?.object = Object::Inet(index);
        Ok(index)
    }

    pub fn inet(&self, index: usize) -> Result<&InetSocket, Errno> {
        self.inets
            .get(index)
            .and_then(|s| s.as_ref())
            .ok_or(Errno::EBADF)
    }

    pub fn inet_mut(&mut self, index: usize) -> Result<&mut InetSocket, Errno> {
        self.inets
            .get_mut(index)
            .and_then(|s| s.as_mut())
            .ok_or(Errno::EBADF)
    }

    /// TCP connections open on the host now.
    pub fn host_connections(&self) -> usize {
        self.inets
            .iter()
            .flatten()
            .filter(|s| s.is_connection())
            .count()
    }

    /// Binds endpoint `index` to `name` under namespace `key`: EADDRINUSE if taken, EINVAL if
    /// it is bound already.
    pub fn bind(&mut self, index: usize, key: Vec<u8>, name: Vec<u8>) -> Result<(), Errno> {
        if self.endpoint(index)?.key.is_some() {
            return Err(Errno::EINVAL);
        }
        if self.bound.contains_key(&key) {
            return Err(Errno::EADDRINUSE);
        }
        self.bound.insert(key.clone(), index);
        let endpoint = self.endpoints[index].as_mut().ok_or(Errno::EBADF)?;
        endpoint.key = Some(key);
        endpoint.name = Some(name);
        Ok(())
    }

    /// A free ephemeral port for `family`, given the namespace key of a port (family, port).
    pub fn ephemeral_port(&mut self, key_of: impl Fn(u16) -> Vec<u8>) -> Result<u16, Errno> {
        self.free_port(|table, port| table.bound.contains_key(&key_of(port)))
    }

    /// The next ephemeral port not `taken`: EADDRINUSE when all are.
    fn free_port(&mut self, taken: impl Fn(&FdTable, u16) -> bool) -> Result<u16, Errno> {
        for _ in 0..=(u16::MAX - FIRST_EPHEMERAL_PORT) {
            let port = self.next_port;
            self.next_port = if port == u16::MAX {
                FIRST_EPHEMERAL_PORT
            } else {
                port + 1
            };
            if !taken(self, port) {
                return Ok(port);
            }
        }
        Err(Errno::EADDRINUSE)
    }

    /// Binds Internet datagram socket `index` to loopback UDP `port` of its family (0: an
    /// ephemeral one): the port bound, EADDRINUSE if taken. UDP ports are apart from the
    /// stream sockets' ones, and UDP-Lite ports from UDP's, as on Linux.
    pub fn bind_datagram(&mut self, index: usize, port: u16) -> Result<u16, Errno> {
        let socket = self.inet(index)?;
        let (ipv6, lite) = (socket.ipv6, socket.lite);
        let port = match port {
            0 => self.free_port(|table, p| table.datagram_ports.contains_key(&(ipv6, lite, p)))?,
            port if self.datagram_ports.contains_key(&(ipv6, lite, port)) => {
                return Err(Errno::EADDRINUSE)
            }
            port => port,
        };
        self.datagram_ports.insert((ipv6, lite, port), index);
        Ok(port)
    }

    /// The Internet datagram socket (UDP or UDP-Lite) bound to loopback `port` of IPv6 or
    /// IPv4.
    pub fn datagram_receiver(&self, ipv6: bool, lite: bool, port: u16) -> Option<usize> {
        self.datagram_ports.get(&(ipv6, lite, port)).copied()
    }

    /// listen(2): endpoint `index` (bound) takes connections, at most `backlog` waiting.
    pub fn listen(&mut self, index: usize, backlog: usize) -> Result<(), Errno> {
        let endpoint = self
            .endpoints
            .get_mut(index)
            .and_then(|e| e.as_mut())
            .ok_or(Errno::EBADF)?;
        if endpoint.key.is_none() {
            return Err(Errno::EINVAL);
        }
        match &mut endpoint.listening {
            Some((limit, _)) => *limit = backlog,
            None => endpoint.listening = Some((backlog, VecDeque::new())),
        }
        Ok(())
    }

    /// The listening endpoint bound at `key`.
    pub fn listener(&self, key: &[u8]) -> Option<usize> {
        self.bound.get(key).copied().filter(|&i| {
            self.endpoints[i]
                .as_ref()
                .is_some_and(|e| e.listening.is_some())
        })
    }

    /// connect(2) of the endpoint at `fd` to listener `listener`: a socketpair (a datagram one
    /// for SOCK_SEQPACKET) whose one end replaces the endpoint and whose other waits on the
    /// listener; `names` are the client's (local, peer) addresses, `server_names` the
    /// accepted end's (None: the client's the other way round). EAGAIN when the backlog is
    /// full.
    pub fn connect(
        &mut self,
        fd: u64,
        listener: usize,
        names: (Vec<u8>, Vec<u8>),
        server_names: Option<(Vec<u8>, Vec<u8>)>,
    ) -> Result<(), Errno> {
        let Object::Endpoint(own) = self.get(fd)?.object else {
            return Err(Errno::EISCONN);
        };
        let full = match &self.endpoint(listener)?.listening {
            Some((backlog, queue)) => queue.len() > *backlog,
            None => return Err(Errno::ECONNREFUSED),
        };
        if full {
            return Err(Errno::EAGAIN);
        }
        if self.endpoint(own)?.seqpacket {
            return self.connect_seqpacket(fd, own, listener, names);
        }
        let (client, server) = self.new_socketpair(0);
        self.adopt_object(&client.object);
        self.adopt_object(&server.object);
        let (Object::Socket { rx: client_rx, .. }, Object::Socket { rx: server_rx, .. }) =
            (&client.object, &server.object)
        else {
            unreachable!("new_socketpair makes sockets")
        };
        let (client_rx, server_rx) = (*client_rx, *server_rx);
        if is_internet_name(&names.0) {
            for rx in [client_rx, server_rx] {
                self.pipe_mut(rx)?.send_after_close = true;
            }
        }
        let server_names = server_names.unwrap_or_else(|| (names.1.clone(), names.0.clone()));
        self.socket_names.insert(client_rx, names);
        self.socket_names.insert(server_rx, server_names.clone());
        if let Some(Some(Endpoint {
            listening: Some((_, queue)),
            ..
        })) = self.endpoints.get_mut(listener)
        {
            queue.push_back(Connection {
                object: server.object,
                names: server_names,
            });
        }
        self.release_endpoint(own);
        self.get_mut(fd)?.object = client.object;
        Ok(())
    }

    /// `connect` of SOCK_SEQPACKET endpoint `own` at `fd`: each end reads back its own name.
    fn connect_seqpacket(
        &mut self,
        fd: u64,
        own: usize,
        listener: usize,
        names: (Vec<u8>, Vec<u8>),
    ) -> Result<(), Errno> {
        let (client, server) = self.new_datagram_pair(0, true);
        let named = |name: &Vec<u8>| (name.len() > 2).then(|| name.clone());
        for (end, name) in [(&client, &names.0), (&server, &names.1)] {
            if let Object::UnixDatagram(i) = end.object {
                self.unix_datagram_mut(i)?.name = named(name);
            }
        }
        if let Some(Some(Endpoint {
            listening: Some((_, queue)),
            ..
        })) = self.endpoints.get_mut(listener)
        {
            queue.push_back(Connection {
                object: server.object,
                names: (names.1, names.0),
            });
        }
        self.release_endpoint(own);
        self.get_mut(fd)?.object = client.object;
        Ok(())
    }

    /// accept(2): the next waiting connection of listener `listener`, installed at the lowest
    /// free fd with `flags` (O_NONBLOCK) and `cloexec`; None when none waits.
    pub fn accept(
        &mut self,
        listener: usize,
        flags: u32,
        cloexec: bool,
    ) -> Result<Option<(u64, Vec<u8>)>, Errno> {
        let endpoint = self
            .endpoints
            .get_mut(listener)
            .and_then(|e| e.as_mut())
            .ok_or(Errno::EBADF)?;
        let Some((_, queue)) = &mut endpoint.listening else {
            return Err(Errno::EINVAL);
        };
        let Some(connection) = queue.pop_front() else {
            return Ok(None);
        };
        let peer = connection.names.1.clone();
        let description =
            Description::new(connection.object.clone(), O_RDWR | (flags & O_NONBLOCK));
        match self.install_adopted(description, 0, cloexec) {
            Ok(fd) => Ok(Some((fd, peer))),
            Err(e) => {
                if let Some(Some(Endpoint {
                    listening: Some((_, queue)),
                    ..
                })) = self.endpoints.get_mut(listener)
                {
                    queue.push_front(connection);
                }
                Err(e)
            }
        }
    }

    /// A connected socket's (local, peer) addresses, if it was connected by address.
    pub fn socket_names(&self, rx: usize) -> Option<&(Vec<u8>, Vec<u8>)> {
        self.socket_names.get(&rx)
    }

    /// Whether the peer of the Internet socket receiving on `rx` reset the connection.
    pub fn was_reset(&self, rx: usize) -> bool {
        self.resets.contains_key(&rx)
    }

    /// A connected Internet socket closing with SO_LINGER on and a zero timeout resets its
    /// connection, as TCP's RST: the peer keeps the bytes it has, but is no longer connected.
    fn reset_peer(&mut self, d: &Description) {
        let Object::Socket {
            rx,
            tx,
            shut_write: false,
        } = d.object
        else {
            return;
        };
        let internet = self
            .socket_names
            .get(&rx)
            .is_some_and(|(local, _)| is_internet_name(local));
        let peer_reads = self
            .pipes
            .get(tx)
            .and_then(Option::as_ref)
            .is_some_and(|p| p.readers > 0);
        if d.linger == Some(0) && internet && peer_reads {
            self.resets.insert(tx, true);
            // The peer's sends fail at once: its connection was reset.
            if let Some(Some(incoming)) = self.pipes.get_mut(rx) {
                incoming.send_after_close = false;
            }
        }
    }

    /// Frees endpoint `index`: its address, and the connections still waiting on it.
    fn release_endpoint(&mut self, index: usize) {
        let Some(endpoint) = self.endpoints.get_mut(index).and_then(Option::take) else {
            return;
        };
        if let Some(key) = endpoint.key {
            self.bound.remove(&key);
        }
        for connection in endpoint.listening.map(|(_, q)| q).unwrap_or_default() {
            self.release_object(&connection.object);
        }
    }

    /// Creates an epoll instance's description, not yet installed.
    /// Opens a new pseudo-terminal's master (open of /dev/ptmx) at the lowest free fd.
    pub fn open_terminal(&mut self, flags: u32, cloexec: bool) -> Result<u64, Errno> {
        self.lowest_free(0)?;
        let index = free_index(&mut self.terminals, Terminal::default());
        self.install(
            Description::new(Object::TerminalMaster(index), flags),
            0,
            cloexec,
        )
    }

    pub fn terminal(&self, index: usize) -> Result<&Terminal, Errno> {
        self.terminals
            .get(index)
            .and_then(Option::as_ref)
            .ok_or(Errno::EIO)
    }

    pub fn terminal_mut(&mut self, index: usize) -> Result<&mut Terminal, Errno> {
        self.terminals
            .get_mut(index)
            .and_then(Option::as_mut)
            .ok_or(Errno::EIO)
    }

    /// The pseudo-terminals in use with their numbers (/dev/pts lists them).
    pub fn terminals(&self) -> impl Iterator<Item = (usize, &Terminal)> + '_ {
        self.terminals
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.as_ref().map(|t| (i, t)))
    }

    /// Whether a pseudo-terminal is open (a template snapshot cannot hold one).
    pub fn has_terminals(&self) -> bool {
        self.terminals.iter().any(Option::is_some)
    }

    /// The sessions whose controlling terminal's master was closed since the last call: their
    /// leaders get SIGHUP and SIGCONT (the caller sends them; the table has no processes).
    pub fn take_hangups(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.hangups)
    }

    pub fn new_epoll(&mut self) -> Description {
        Description::new(
            Object::Epoll(free_index(&mut self.epolls, EpollSet::default())),
            O_RDWR,
        )
    }

    pub fn epoll(&self, index: usize) -> Result<&EpollSet, Errno> {
        self.epolls
            .get(index)
            .and_then(|e| e.as_ref())
            .ok_or(Errno::EBADF)
    }

    pub fn epoll_mut(&mut self, index: usize) -> Result<&mut EpollSet, Errno> {
        self.epolls
            .get_mut(index)
            .and_then(|e| e.as_mut())
            .ok_or(Errno::EBADF)
    }

    /// The stream socket description that receives from channel `rx` (a connection's peer).
    pub fn receiver_of(&self, channel: usize) -> Option<&Description> {
        self.descriptions
            .iter()
            .flatten()
            .find(|d| matches!(d.object, Object::Socket { rx, .. } if rx == channel))
    }

    /// What the readiness of the pipe or socket at `fd` follows (its pipes' marks and whether
    /// its write side was shut down); None for other objects.
    pub fn readiness_mark(&self, fd: u64) -> Option<ReadinessMark> {
        let mark = |p: usize| self.pipe(p).ok().map(Pipe::mark);
        match self.get(fd).ok()?.object {
            Object::PipeRead(p) | Object::PipeWrite(p) => {
                Some(ReadinessMark([mark(p), None], false))
            }
            Object::Socket { rx, tx, shut_write } => {
                Some(ReadinessMark([mark(rx), mark(tx)], shut_write))
            }
            _ => None,
        }
    }

    /// Which open file description `fd` refers to now (an epoll registration is tied to it, so
    /// a closed and reused fd number is not mistaken for the one registered).
    pub fn description_id(&self, fd: u64) -> Result<usize, Errno> {
        Ok(self.slot(fd)?.description)
    }

    pub fn pipe_mut(&mut self, index: usize) -> Result<&mut Pipe, Errno> {
        self.pipes
            .get_mut(index)
            .and_then(|p| p.as_mut())
            .ok_or(Errno::EBADF)
    }

    /// F_SETPIPE_SZ: pipe `index` holds at least `size` bytes from now on (rounded up to a power
    /// of two pages), and returns its new capacity. EPERM past MAX_PIPE_CAPACITY or the
    /// table's budget, EBUSY below what it holds now.
    pub fn set_pipe_capacity(&mut self, index: usize, size: u64) -> Result<usize, Errno> {
        if size > 1 << 31 {
            return Err(Errno::EINVAL);
        }
        if size > MAX_PIPE_CAPACITY as u64 {
            return Err(Errno::EPERM);
        }
        let capacity = (size as usize).max(PAGE).next_power_of_two();
        let others: usize = self
            .pipes
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != index)
            .filter_map(|(_, p)| p.as_ref())
            .map(|p| p.capacity)
            .sum();
        let pipe = self.pipe_mut(index)?;
        if capacity < pipe.buffer.len() {
            return Err(Errno::EBUSY);
        }
        if capacity > pipe.capacity && others + capacity > PIPE_BUDGET {
            return Err(Errno::EPERM);
        }
        pipe.capacity = capacity;
        Ok(capacity)
    }

    pub fn pipe(&self, index: usize) -> Result<&Pipe, Errno> {
        self.pipes
            .get(index)
            .and_then(|p| p.as_ref())
            .ok_or(Errno::EBADF)
    }

    /// Takes up to `max` bytes from channel `index` with the descriptions passed on them.
    pub fn read_channel(
        &mut self,
        index: usize,
        max: usize,
    ) -> Result<Result<(Vec<u8>, Passed), PipeError>, Errno> {
        let taken = self.pipe_mut(index)?.take(max);
        if matches!(&taken, Ok((bytes, _)) if bytes.is_empty() && max > 0) {
            if let Some(pending) = self.resets.get_mut(&index) {
                if std::mem::take(pending) {
                    return Err(Errno::ECONNRESET);
                }
            }
        }
        Ok(taken.map(|(bytes, passed)| (bytes, Passed(passed))))
    }

    /// Writes what fits of `data` into channel `index`, passing the descriptions of `fds` with
    /// the bytes written (when any are). EBADF for a closed fd; ETOOMANYREFS past what may be
    /// in flight at once; EINVAL past MAX_PASSED_PER_MESSAGE.
    pub fn write_passing(
        &mut self,
        index: usize,
        data: &[u8],
        fds: &[u64],
    ) -> Result<Result<usize, PipeError>, Errno> {
        if fds.len() > MAX_PASSED_PER_MESSAGE {
            return Err(Errno::EINVAL);
        }
        let descriptions = fds
            .iter()
            .map(|&fd| self.description_id(fd))
            .collect::<Result<Vec<usize>, Errno>>()?;
        if !descriptions.is_empty() {
            let in_flight: usize = self
                .pipes
                .iter()
                .flatten()
                .flat_map(|p| &p.in_flight)
                .map(|f| f.descriptions.len())
                .sum();
            if in_flight + descriptions.len() > MAX_IN_FLIGHT {
                return Err(ETOOMANYREFS);
            }
        }
        let pipe = self.pipe_mut(index)?;
        let start = pipe.buffer.len();
        let written = match pipe.write(data) {
            Ok(n) => n,
            Err(e) => return Ok(Err(e)),
        };
        if written > 0 && !descriptions.is_empty() {
            pipe.in_flight.push_back(InFlight {
                start,
                len: written,
                descriptions: descriptions.clone(),
            });
            for &d in &descriptions {
                if let Some(Some(description)) = self.descriptions.get_mut(d) {
                    description.refs += 1;
                }
            }
        }
        Ok(Ok(written))
    }

    /// Installs passed descriptions at the lowest free fds, at most `room` of them, and lets
    /// the rest go. Returns the new fds; fewer than were passed means the rest were lost
    /// (no room, or the fd limit), which recvmsg reports as MSG_CTRUNC.
    pub fn receive(&mut self, passed: Passed, room: usize, cloexec: bool) -> Vec<u64> {
        let mut installed = Vec::new();
        let mut rest = passed.0.into_iter();
        for description in rest.by_ref().take(room) {
            let Ok(fd) = self.lowest_free(0) else {
                self.unreference(description);
                break;
            };
            self.put(
                fd,
                Slot {
                    description,
                    cloexec,
                },
            );
            // `put` counted the fd; the reference the channel held is the fd's now.
            if let Some(Some(d)) = self.descriptions.get_mut(description) {
                d.refs -= 1;
            }
            installed.push(fd as u64);
        }
        for description in rest {
            self.unreference(description);
        }
        installed
    }

    /// Lets passed descriptions go (a read that does not take them: read(2), splice).
    pub fn discard(&mut self, passed: Passed) {
        for description in passed.0 {
            self.unreference(description);
        }
    }

    /// Whether any description is in flight on a socket (a snapshot cannot hold one).
    pub fn has_passed_descriptions(&self) -> bool {
        self.pipes.iter().flatten().any(|p| !p.in_flight.is_empty())
    }

    /// File-system nodes whose last description went while descriptions in flight were let
    /// go of, for the caller to close in the Vfs (`GuestProcess::release`).
    pub fn take_released_nodes(&mut self) -> Vec<Node> {
        std::mem::take(&mut self.released_nodes)
    }

    /// Drops one reference to description `index` that no fd holds (one in flight), releasing
    /// it with the last.
    fn unreference(&mut self, index: usize) {
        let Some(Some(d)) = self.descriptions.get_mut(index) else {
            return;
        };
        d.refs -= 1;
        if d.refs > 0 {
            return;
        }
        if let Some(d) = self.free_description(index) {
            if let Object::Node(node) = d.object {
                self.released_nodes.push(node);
            }
        }
    }

    fn adopt_object(&mut self, object: &Object) {
        let (read, write) = match *object {
            Object::PipeRead(i) => (Some(i), None),
            Object::PipeWrite(i) => (None, Some(i)),
            Object::Socket { rx, tx, .. } => (Some(rx), Some(tx)),
            Object::TerminalMaster(i) => {
                if let Some(t) = self.terminals[i].as_mut() {
                    t.masters += 1;
                }
                return;
            }
            Object::TerminalSlave(i) => {
                if let Some(t) = self.terminals[i].as_mut() {
                    t.open_slave();
                }
                return;
            }
            _ => return,
        };
        read.and_then(|i| self.pipes[i].as_mut())
            .into_iter()
            .for_each(|p| p.readers += 1);
        write
            .and_then(|i| self.pipes[i].as_mut())
            .into_iter()
            .for_each(|p| p.writers += 1);
    }

    fn release_object(&mut self, object: &Object) {
        let (read, write) = match *object {
            Object::PipeRead(i) => (Some(i), None),
            Object::PipeWrite(i) => (None, Some(i)),
            // A shut-down write side was already let go of.
            Object::Socket { rx, tx, shut_write } => (Some(rx), (!shut_write).then_some(tx)),
            Object::Epoll(i) => {
                self.epolls[i] = None;
                return;
            }
            Object::Endpoint(i) => {
                self.release_endpoint(i);
                return;
            }
            // Its host socket closes with the last reference.
            Object::Inet(i) => {
                self.inets[i] = None;
                self.datagram_ports.retain(|_, &mut bound| bound != i);
                return;
            }
            // Its queue and address go with it; the sockets sending to it learn it closed.
            Object::UnixDatagram(i) => {
                if let Some(key) = self.unix_datagrams[i].take().and_then(|s| s.key) {
                    self.datagram_names.remove(&key);
                }
                for socket in self.unix_datagrams.iter_mut().flatten() {
                    if socket.peer == Some(i) {
                        socket.peer = None;
                        socket.peer_closed = true;
                    }
                }
                return;
            }
            Object::TerminalMaster(i) | Object::TerminalSlave(i) => {
                self.release_terminal(i, matches!(object, Object::TerminalMaster(_)));
                return;
            }
            _ => return,
        };
        read.and_then(|i| self.pipes[i].as_mut())
            .into_iter()
            .for_each(|p| p.readers = p.readers.saturating_sub(1));
        write
            .and_then(|i| self.pipes[i].as_mut())
            .into_iter()
            .for_each(|p| p.writers = p.writers.saturating_sub(1));
        for index in read.into_iter().chain(write) {
            self.free_unheld_pipe(index);
        }
    }

    /// One description of terminal `index`'s master or slave end went. The master's last
    /// hangs the terminal up: its session loses it and the leader is to be told; the
    /// terminal goes with the last description of either end.
    fn release_terminal(&mut self, index: usize, master: bool) {
        let Some(t) = self.terminals[index].as_mut() else {
            return;
        };
        if master {
            t.masters = t.masters.saturating_sub(1);
            if t.masters == 0 {
                self.hangups.extend(t.session.take());
                t.foreground = None;
            }
        } else {
            t.slaves = t.slaves.saturating_sub(1);
        }
        if t.masters == 0 && t.slaves == 0 {
            self.terminals[index] = None;
        }
    }

    /// Frees pipe `index` once no end holds it (a FIFO then has none until opened again).
    fn free_unheld_pipe(&mut self, index: usize) {
        if self.pipes[index]
            .as_ref()
            .is_some_and(|p| p.readers == 0 && p.writers == 0)
        {
            let in_flight = self.pipes[index].take().map(|p| p.in_flight);
            self.socket_names.remove(&index);
            self.resets.remove(&index);
            for fifo in self.fifos.values_mut() {
                if fifo.pipe == Some(index) {
                    fifo.pipe = None;
                }
            }
            self.fifos
                .retain(|_, f| f.pipe.is_some() || !f.waiting.is_empty());
            for stretch in in_flight.into_iter().flatten() {
                for description in stretch.descriptions {
                    self.unreference(description);
                }
            }
        }
    }
}

/// Puts `value` in the first free slot of `table` (growing it when none is free).
fn free_index<T>(table: &mut Vec<Option<T>>, value: T) -> usize {
    match table.iter().position(Option::is_none) {
        Some(i) => {
            table[i] = Some(value);
            i
        }
        None => {
            table.push(Some(value));
            table.len() - 1
        }
    }
}

impl Default for FdTable {
    fn default() -> FdTable {
        FdTable::new()
    }
}

// ---- template snapshots (crate::snapshot): the table's state, encoded and checked ----

/// Encodes a table of optional slots: its length, then per slot 0 (free) or 1 and the item.
fn encode_slots<T>(e: &mut Encoder, slots: &[Option<T>], mut item: impl FnMut(&mut Encoder, &T)) {
    e.len(slots.len());
    for slot in slots {
        match slot {
            None => e.u8(0),
            Some(value) => {
                e.u8(1);
                item(e, value);
            }
        }
    }
}

/// Decodes what `encode_slots` wrote.
fn decode_slots<'a, T>(
    d: &mut Decoder<'a>,
    what: &str,
    mut item: impl FnMut(&mut Decoder<'a>) -> Result<T, DecodeError>,
) -> Result<Vec<Option<T>>, DecodeError> {
    let n = d.count(1, what)?;
    let mut slots = Vec::with_capacity(n);
    for _ in 0..n {
        slots.push(match d.u8(what)? {
            0 => None,
            1 => Some(item(d)?),
            t => return Err(DecodeError::new(format!("{what}: slot tag {t}"))),
        });
    }
    Ok(slots)
}

impl Object {
    fn encode_state(&self, e: &mut Encoder) {
        match self {
            Object::Stdin => e.u8(0),
            Object::Output(Stream::Stdout) => e.u8(1),
            Object::Output(Stream::Stderr) => e.u8(2),
            Object::PipeRead(i) => {
                e.u8(3);
                e.len(*i);
            }
            Object::PipeWrite(i) => {
                e.u8(4);
                e.len(*i);
            }
            Object::Node(node) => {
                e.u8(5);
                node.encode_state(e);
            }
            Object::Socket { rx, tx, shut_write } => {
                e.u8(6);
                e.len(*rx);
                e.len(*tx);
                e.bool(*shut_write);
            }
            Object::Epoll(i) => {
                e.u8(7);
                e.len(*i);
            }
            Object::EventFd { count, semaphore } => {
                e.u8(8);
                e.u64(*count);
                e.bool(*semaphore);
            }
            // GuestProcess::encode_state refuses a process with endpoints, Internet sockets,
            // datagram socketpairs or pidfds; these tags are never read back.
            Object::Endpoint(i) => {
                e.u8(9);
                e.len(*i);
            }
            Object::Inet(i) => {
                e.u8(10);
                e.len(*i);
            }
            Object::UnixDatagram(i) => {
                e.u8(11);
                e.len(*i);
            }
            Object::Pidfd(pid) => {
                e.u8(12);
                e.u64(*pid);
            }
            // Refused too (a terminal is open): never read back.
            Object::TerminalMaster(i) => {
                e.u8(13);
                e.len(*i);
            }
            Object::TerminalSlave(i) => {
                e.u8(14);
                e.len(*i);
            }
        }
    }

    fn decode_state(d: &mut Decoder, vfs: &Vfs) -> Result<Object, DecodeError> {
        Ok(match d.u8("description object")? {
            0 => Object::Stdin,
            1 => Object::Output(Stream::Stdout),
            2 => Object::Output(Stream::Stderr),
            3 => Object::PipeRead(d.index(usize::MAX, "pipe index")?),
            4 => Object::PipeWrite(d.index(usize::MAX, "pipe index")?),
            5 => Object::Node(vfs.decode_node(d)?),
            6 => Object::Socket {
                rx: d.index(usize::MAX, "socket pipe")?,
                tx: d.index(usize::MAX, "socket pipe")?,
                shut_write: d.bool("socket shutdown")?,
            },
            7 => Object::Epoll(d.index(usize::MAX, "epoll index")?),
            8 => match d.u64("eventfd count")? {
                count if count <= crate::abi::EVENTFD_MAX_COUNT => Object::EventFd {
                    count,
                    semaphore: d.bool("eventfd semaphore")?,
                },
                count => {
                    return Err(DecodeError::new(format!(
                        "eventfd count {count} past its maximum"
                    )))
                }
            },
            t => return Err(DecodeError::new(format!("description object tag {t}"))),
        })
    }
}

/// A process's fd numbers: each its description's index and close-on-exec flag.
fn encode_fd_numbers(e: &mut Encoder, fds: &[Option<Slot>]) {
    encode_slots(e, fds, |e, slot| {
        e.len(slot.description);
        e.bool(slot.cloexec);
    });
}

/// What `encode_fd_numbers` wrote: at most `FD_LIMIT` of them (their descriptions are checked
/// against the table by `check_fd_numbers`).
fn decode_fd_numbers(d: &mut Decoder) -> Result<Vec<Option<Slot>>, DecodeError> {
    let fds = decode_slots(d, "fd slot", |d| {
        Ok(Slot {
            description: d.index(usize::MAX, "fd description")?,
            cloexec: d.bool("fd cloexec")?,
        })
    })?;
    if fds.len() as u64 > FD_LIMIT {
        return Err(DecodeError::new(format!(
            "{} fds, more than {FD_LIMIT}",
            fds.len()
        )));
    }
    Ok(fds)
}

/// Refuses fd numbers that refer to a description `descriptions` does not hold.
fn check_fd_numbers(
    fds: &[Option<Slot>],
    descriptions: &[Option<Description>],
) -> Result<(), DecodeError> {
    for slot in fds.iter().flatten() {
        if !descriptions
            .get(slot.description)
            .is_some_and(Option::is_some)
        {
            return Err(DecodeError::new(format!(
                "an fd refers to missing description {}",
                slot.description
            )));
        }
    }
    Ok(())
}

impl FdSlots {
    /// Another process's fd numbers and fd limit, for a session checkpoint.
    pub(crate) fn encode_state(&self, e: &mut Encoder) {
        encode_fd_numbers(e, &self.fds);
        e.u64(self.limit);
    }

    /// What `encode_state` wrote, each fd's description checked against `table` (the tree's).
    pub(crate) fn decode_state(d: &mut Decoder, table: &FdTable) -> Result<FdSlots, DecodeError> {
        let fds = decode_fd_numbers(d)?;
        check_fd_numbers(&fds, &table.descriptions)?;
        Ok(FdSlots {
            fds,
            limit: d.u64("fd limit")?.min(FD_LIMIT),
        })
    }

    /// The lowest fd that refers to a socket with an address (`FdTable::addressed_socket_fd`).
    pub(crate) fn addressed_socket_fd(&self, table: &FdTable) -> Option<u64> {
        table.addressed_fd_among(&self.fds)
    }
}

impl FdTable {
    pub(crate) fn encode_state(&self, e: &mut Encoder) {
        encode_fd_numbers(e, &self.fds);
        encode_slots(e, &self.descriptions, |e, d| {
            d.object.encode_state(e);
            e.u32(d.flags);
            e.u64(d.offset);
            match &d.contents {
                None => e.u8(0),
                Some(contents) => {
                    e.u8(1);
                    e.bytes(contents);
                }
            }
            e.u32(d.refs);
        });
        encode_slots(e, &self.pipes, |e, p| {
            let (front, back) = p.buffer.as_slices();
            e.len(front.len() + back.len());
            e.raw(front);
            e.raw(back);
            e.u32(p.readers);
            e.u32(p.writers);
            e.bool(p.shut_read);
            e.len(p.capacity);
        });
        encode_slots(e, &self.epolls, |e, set| set.encode_state(e));
        e.u64(self.limit);
    }

    /// The table `encode_state` wrote; nodes are checked against `vfs`, every fd's description,
    /// every channel a pipe end or socket uses and every epoll instance must exist.
    pub(crate) fn decode_state(d: &mut Decoder, vfs: &Vfs) -> Result<FdTable, DecodeError> {
        let fds = decode_fd_numbers(d)?;
        let descriptions = decode_slots(d, "description", |d| {
            let object = Object::decode_state(d, vfs)?;
            let (flags, offset) = (d.u32("description flags")?, d.u64("description offset")?);
            let contents = match d.u8("description contents")? {
                0 => None,
                1 => Some(d.bytes("description contents")?.into()),
                t => return Err(DecodeError::new(format!("description contents tag {t}"))),
            };
            Ok(Description {
                object,
                flags,
                offset,
                contents,
                linger: None,
                socket_options: 0,
                refs: d.u32("description refs")?,
            })
        })?;
        let pipes = decode_slots(d, "pipe", |d| {
            let len = d.count(1, "pipe buffer")?;
            let buffer = d.raw(len, "pipe buffer")?.iter().copied().collect();
            let (readers, writers, shut_read) = (
                d.u32("pipe readers")?,
                d.u32("pipe writers")?,
                d.bool("pipe shutdown")?,
            );
            let capacity = d.index(MAX_PIPE_CAPACITY + 1, "pipe capacity")?;
            if !capacity.is_power_of_two() || capacity < PAGE || len > capacity {
                return Err(DecodeError::new(format!(
                    "pipe of capacity {capacity} holding {len} bytes"
                )));
            }
            Ok(Pipe {
                buffer,
                in_flight: VecDeque::new(),
                readers,
                writers,
                shut_read,
                capacity,
                // Internet connections are never in a snapshot (`has_addressed_sockets`).
                send_after_close: false,
                // Edge-triggered epoll marks are not kept either: they start again.
                moved: 0,
            })
        })?;
        let held: usize = pipes.iter().flatten().map(Pipe::capacity).sum();
        if held > PIPE_BUDGET + PAGE * pipes.iter().flatten().count() {
            return Err(DecodeError::new(
                "the pipes hold more than their budget".to_owned(),
            ));
        }
        let epolls = decode_slots(d, "epoll", |d| EpollSet::decode_state(d, FD_LIMIT))?;
        let limit = d.u64("fd limit")?.min(FD_LIMIT);
        check_fd_numbers(&fds, &descriptions)?;
        for description in descriptions.iter().flatten() {
            let (channels, epoll) = match description.object {
                Object::PipeRead(i) | Object::PipeWrite(i) => ([Some(i), None], None),
                // A shut-down write side's channel may be gone with the peer.
                Object::Socket { rx, tx, shut_write } => {
                    ([Some(rx), (!shut_write).then_some(tx)], None)
                }
                Object::Epoll(i) => ([None, None], Some(i)),
                Object::Stdin | Object::Output(_) | Object::Node(_) | Object::EventFd { .. } => {
                    ([None, None], None)
                }
                Object::Endpoint(_)
                | Object::Inet(_)
                | Object::UnixDatagram(_)
                | Object::Pidfd(_) => {
                    return Err(DecodeError::new(
                        "a template snapshot holds no unconnected or Internet socket, no pidfd"
                            .to_owned(),
                    ))
                }
                Object::TerminalMaster(_) | Object::TerminalSlave(_) => {
                    return Err(DecodeError::new(
                        "a template snapshot holds no pseudo-terminal".to_owned(),
                    ))
                }
            };
            for i in channels.into_iter().flatten() {
                if !pipes.get(i).is_some_and(Option::is_some) {
                    return Err(DecodeError::new(format!(
                        "a description refers to missing pipe {i}"
                    )));
                }
            }
            if let Some(i) = epoll {
                if !epolls.get(i).is_some_and(Option::is_some) {
                    return Err(DecodeError::new(format!(
                        "a description refers to missing epoll instance {i}"
                    )));
                }
            }
        }
        Ok(FdTable {
            fds,
            descriptions,
            pipes,
            epolls,
            endpoints: Vec::new(),
            inets: Vec::new(),
            unix_datagrams: Vec::new(),
            bound: Default::default(),
            datagram_names: Default::default(),
            datagram_ports: Default::default(),
            socket_names: Default::default(),
            resets: Default::default(),
            next_port: FIRST_EPHEMERAL_PORT,
            limit,
            released_nodes: Vec::new(),
            closed_nodes: Vec::new(),
            locks: FileLocks::default(),
            fifos: Default::default(),
            terminals: Vec::new(),
            hangups: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads channel `p` where no descriptions are in flight.
    fn read_bytes(t: &mut FdTable, p: usize, max: usize) -> Result<Vec<u8>, PipeError> {
        t.read_channel(p, max).unwrap().map(|(bytes, passed)| {
            assert!(passed.is_empty());
            bytes
        })
    }

    /// A socketpair's two fds and the channel each one sends on.
    fn socketpair(t: &mut FdTable) -> ((u64, usize), (u64, usize)) {
        let (a, b) = t.new_socketpair(0);
        let ends = [a, b].map(|end| {
            let Object::Socket { tx, .. } = end.object else {
                panic!("not a socket")
            };
            (t.install(end, 0, false).unwrap(), tx)
        });
        (ends[0], ends[1])
    }

    /// A pipe's write end installed (its read end too, left open) and the pipe's index.
    fn pipe_write_end(t: &mut FdTable) -> (u64, usize) {
        let (r, w) = t.new_pipe(0);
        let Object::PipeRead(pipe) = r.object else {
            panic!("not a pipe")
        };
        t.install(r, 0, false).unwrap();
        (t.install(w, 0, false).unwrap(), pipe)
    }

    #[test]
    fn passed_descriptions_ride_on_their_bytes_and_outlive_the_senders_fd() {
        let mut t = FdTable::new();
        let ((_, a_tx), (_, _)) = socketpair(&mut t);
        let (wfd, pipe) = pipe_write_end(&mut t);
        assert_eq!(t.write_passing(a_tx, b"ab", &[]).unwrap(), Ok(2));
        assert_eq!(t.write_passing(a_tx, b"cd", &[wfd, wfd]).unwrap(), Ok(2));
        assert_eq!(t.write_passing(a_tx, b"ef", &[]).unwrap(), Ok(2));
        assert_eq!(
            t.write_passing(a_tx, b"x", &[99]).unwrap_err(),
            Errno::EBADF
        );
        assert!(t.has_passed_descriptions());
        // The write end stays open while it is in flight.
        t.close(wfd).unwrap();
        assert!(t.pipe(pipe).unwrap().has_writers());
        // A read reaching the stretch takes its descriptions and stops at its end.
        let (bytes, passed) = t.read_channel(a_tx, 10).unwrap().unwrap();
        assert_eq!((bytes.as_slice(), passed.len()), (&b"abcd"[..], 2));
        // One fd of room: one installed, the other let go of.
        let fds = t.receive(passed, 1, true);
        assert_eq!(fds.len(), 1);
        assert!(t.cloexec(fds[0]).unwrap());
        assert!(matches!(t.get(fds[0]).unwrap().object, Object::PipeWrite(p) if p == pipe));
        assert_eq!(read_bytes(&mut t, a_tx, 10), Ok(b"ef".to_vec()));
        assert!(!t.has_passed_descriptions());
        t.close(fds[0]).unwrap();
        assert!(!t.pipe(pipe).unwrap().has_writers());
    }

    #[test]
    fn descriptions_in_flight_go_with_a_discarding_read_or_the_closed_socket() {
        let mut t = FdTable::new();
        let ((a, a_tx), (b, _)) = socketpair(&mut t);
        let (wfd, pipe) = pipe_write_end(&mut t);
        assert_eq!(t.write_passing(a_tx, b"1", &[wfd]).unwrap(), Ok(1));
        let (_, passed) = t.read_channel(a_tx, 1).unwrap().unwrap();
        t.discard(passed);
        assert_eq!(t.write_passing(a_tx, b"2", &[wfd]).unwrap(), Ok(1));
        t.close(wfd).unwrap();
        assert!(t.pipe(pipe).unwrap().has_writers());
        t.close(a).unwrap();
        t.close(b).unwrap();
        // The socket's channels went, and with them the write end they carried.
        assert!(!t.pipe(pipe).unwrap().has_writers());
        assert!(!t.has_passed_descriptions());
    }

    #[test]
    fn passing_is_bounded_per_message_and_in_flight() {
        let mut t = FdTable::new();
        let ((a, a_tx), _) = socketpair(&mut t);
        let many = vec![a; MAX_PASSED_PER_MESSAGE + 1];
        assert_eq!(
            t.write_passing(a_tx, b"x", &many).unwrap_err(),
            Errno::EINVAL
        );
        let most = &many[..MAX_PASSED_PER_MESSAGE];
        for _ in 0..MAX_IN_FLIGHT / MAX_PASSED_PER_MESSAGE {
            assert_eq!(t.write_passing(a_tx, b"x", most).unwrap(), Ok(1));
        }
        assert_eq!(t.write_passing(a_tx, b"x", most).unwrap_err(), ETOOMANYREFS);
    }

    #[test]
    fn lowest_free_fd_and_dup_share_the_description() {
        let mut t = FdTable::new();
        let (r, w) = t.new_pipe(0);
        assert_eq!(t.install(r, 0, true).unwrap(), 3);
        assert_eq!(t.install(w, 0, false).unwrap(), 4);
        assert!(t.cloexec(3).unwrap());
        t.close(0).unwrap();
        assert_eq!(t.duplicate(4, 0, false).unwrap(), 0);
        t.get_mut(0).unwrap().offset = 7;
        assert_eq!(t.get(4).unwrap().offset, 7);
        assert_eq!(t.duplicate(4, 10, true).unwrap(), 10);
        assert!(t.get(5).is_err());
        assert_eq!(t.close(5), Err(Errno::EBADF));
    }

    #[test]
    fn pipe_end_closes_give_eof_and_epipe() {
        let mut t = FdTable::new();
        let (r, w) = t.new_pipe(0);
        let rfd = t.install(r, 0, false).unwrap();
        let wfd = t.install(w, 0, false).unwrap();
        let extra = t.duplicate(wfd, 0, false).unwrap();
        let Object::PipeRead(p) = t.get(rfd).unwrap().object else {
            panic!("not a pipe")
        };
        assert_eq!(t.pipe_mut(p).unwrap().write(b"abc"), Ok(3));
        t.close(wfd).unwrap();
        // A dup of the write end still holds it open: an empty pipe would block.
        assert_eq!(read_bytes(&mut t, p, 10), Ok(b"abc".to_vec()));
        assert_eq!(read_bytes(&mut t, p, 10), Err(PipeError::WouldBlock));
        t.close(extra).unwrap();
        assert_eq!(read_bytes(&mut t, p, 10), Ok(Vec::new()));
        t.close(rfd).unwrap();
        assert!(t.pipe(p).is_err());
    }

    #[test]
    fn pipe_capacity_and_no_reader() {
        let mut t = FdTable::new();
        let (r, w) = t.new_pipe(0);
        let rfd = t.install(r, 0, false).unwrap();
        let wfd = t.install(w, 0, false).unwrap();
        let Object::PipeWrite(p) = t.get(wfd).unwrap().object else {
            panic!("not a pipe")
        };
        let big = vec![1u8; PIPE_CAPACITY + 10];
        assert_eq!(t.pipe_mut(p).unwrap().write(&big), Ok(PIPE_CAPACITY));
        assert_eq!(
            t.pipe_mut(p).unwrap().write(b"x"),
            Err(PipeError::WouldBlock)
        );
        assert_eq!(t.pipe_mut(p).unwrap().write(b""), Ok(0));
        t.close(rfd).unwrap();
        assert_eq!(t.pipe_mut(p).unwrap().write(b"x"), Err(PipeError::NoReader));
        assert_eq!(t.pipe_mut(p).unwrap().write(b""), Ok(0));
    }

    #[test]
    fn pipes_past_the_budget_hold_a_page_so_filled_pipes_stay_bounded() {
        let mut t = FdTable::new();
        let mut pipes = Vec::new();
        for _ in 0..FD_LIMIT / 2 - 2 {
            let (r, w) = t.new_pipe(0);
            let Object::PipeWrite(p) = w.object else {
                panic!("not a pipe")
            };
            t.install(r, 0, false).unwrap();
            t.install(w, 0, false).unwrap();
            pipes.push(p);
        }
        let filled: usize = pipes
            .iter()
            .map(|&p| t.pipe_mut(p).unwrap().write(&[7u8; PIPE_CAPACITY]).unwrap())
            .sum();
        let full = PIPE_BUDGET / PIPE_CAPACITY;
        assert_eq!(filled, full * PIPE_CAPACITY + (pipes.len() - full) * PAGE);
        assert!(filled <= PIPE_BUDGET + pipes.len() * PAGE);
        assert_eq!(t.pipe(pipes[full - 1]).unwrap().capacity(), PIPE_CAPACITY);
        assert_eq!(t.pipe(pipes[full]).unwrap().capacity(), PAGE);
        // No room to grow a pipe past the budget; a socketpair made now holds a page each way.
        assert_eq!(
            t.set_pipe_capacity(pipes[full], 2 * PAGE as u64),
            Err(Errno::EPERM)
        );
        let (a, _b) = t.new_socketpair(0);
        let Object::Socket { tx, .. } = a.object else {
            panic!("not a socket")
        };
        assert_eq!(t.pipe(tx).unwrap().capacity(), PAGE);
    }

    #[test]
    fn pipe_capacity_is_set_in_pages_within_the_budget() {
        let mut t = FdTable::new();
        let pipes: Vec<usize> = (0..40)
            .map(|_| {
                let (r, w) = t.new_pipe(0);
                t.install(r, 0, false).unwrap();
                let Object::PipeWrite(p) = w.object else {
                    panic!("not a pipe")
                };
                t.install(w, 0, false).unwrap();
                p
            })
            .collect();
        let p = pipes[0];
        assert_eq!(t.set_pipe_capacity(p, 0), Ok(4096));
        assert_eq!(t.set_pipe_capacity(p, 5000), Ok(8192));
        assert_eq!(t.pipe_mut(p).unwrap().write(&[1u8; 9000]), Ok(8192));
        assert_eq!(t.set_pipe_capacity(p, 4096), Err(Errno::EBUSY));
        assert_eq!(
            t.set_pipe_capacity(p, (MAX_PIPE_CAPACITY + 1) as u64),
            Err(Errno::EPERM)
        );
        assert_eq!(t.set_pipe_capacity(p, 1 << 32), Err(Errno::EINVAL));
        // Every pipe at the maximum would hold more than the budget.
        let granted = pipes
            .iter()
            .take_while(|&&p| t.set_pipe_capacity(p, MAX_PIPE_CAPACITY as u64).is_ok())
            .count();
        assert!(granted > 10 && granted < pipes.len(), "{granted}");
        assert_eq!(
            t.set_pipe_capacity(pipes[granted], MAX_PIPE_CAPACITY as u64),
            Err(Errno::EPERM)
        );
        assert!(t.pipes.iter().flatten().map(Pipe::capacity).sum::<usize>() <= PIPE_BUDGET);
        assert_eq!(
            t.set_pipe_capacity(pipes[granted], 4096),
            Ok(4096),
            "shrinking is always allowed"
        );
    }

    #[test]
    fn fd_limit_gives_emfile_and_dup2_replaces() {
        let mut t = FdTable::new();
        t.set_limit(5);
        assert_eq!(t.duplicate(1, 0, false).unwrap(), 3);
        assert_eq!(t.duplicate(1, 0, false).unwrap(), 4);
        assert_eq!(t.duplicate(1, 0, false), Err(Errno::EMFILE));
        assert_eq!(t.duplicate_to(2, 9, false), Err(Errno::EBADF));
        assert!(t.duplicate_to(2, 3, true).unwrap().is_none());
        assert!(matches!(
            t.get(3).unwrap().object,
            Object::Output(Stream::Stderr)
        ));
        assert!(t.cloexec(3).unwrap());
        t.close_range(3, u64::MAX, false);
        assert!(t.get(3).is_err() && t.get(4).is_err() && t.get(2).is_ok());
    }
}
