//! sendmsg and recvmsg's `struct msghdr` and its control buffer, as Linux lays them out and
//! checks them: the control messages a sendmsg gives are read from guest memory once and
//! walked as CMSG_FIRSTHDR/CMSG_NXTHDR do, each header checked as CMSG_OK does (EINVAL when
//! one is shorter than a header or runs past the buffer); those a recvmsg returns are put one
//! after another as Linux's put_cmsg does, cut short (MSG_CTRUNC) where the buffer ends.

use super::UserMemory;
use crate::errno::Errno;

/// `struct cmsghdr`: cmsg_len (u64), cmsg_level, cmsg_type (i32 each); data follows.
pub(super) const CMSG_HEADER: usize = 16;
/// Control data sendmsg takes at most (Linux's default net.core.optmem_max): ENOBUFS past it.
pub(super) const MAX_CONTROL: u64 = 20480;
const ENOBUFS: Errno = Errno(105);
/// recvmsg's msg_flags bit: control messages did not fit.
pub(super) const MSG_CTRUNC: u32 = 0x8;

/// What sendmsg and recvmsg read of a `struct msghdr`: the name buffer (address 0 or length
/// 0: none), the iovecs and the control buffer.
pub(super) struct MessageHeader {
    pub name: Option<(u64, u32)>,
    pub iovecs: Vec<(u64, u64)>,
    pub control: u64,
    pub controllen: u64,
}

pub(super) fn read_msghdr(user: &UserMemory, msg: u64) -> Result<MessageHeader, Errno> {
    let (name, namelen) = (user.read_u64(msg)?, user.read_u32(msg + 8)?);
    let (iov, iovlen, control, controllen) = (
        user.read_u64(msg + 16)?,
        user.read_u64(msg + 24)?,
        user.read_u64(msg + 32)?,
        user.read_u64(msg + 40)?,
    );
    Ok(MessageHeader {
        name: (name != 0 && namelen != 0).then_some((name, namelen)),
        iovecs: user.read_iovecs(iov, iovlen)?,
        control,
        controllen,
    })
}

/// One control message a sendmsg gave: its level, type and data (cmsg_len less the header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Message<'a> {
    pub level: i32,
    pub kind: i32,
    pub data: &'a [u8],
}

impl Message<'_> {
    /// The data as one int when it is exactly one (cmsg_len == CMSG_LEN(sizeof(int))).
    pub fn int(&self) -> Option<i32> {
        Some(i32::from_le_bytes(self.data.try_into().ok()?))
    }
}

/// The control buffer of a sendmsg, read from guest memory: ENOBUFS past `MAX_CONTROL`.
pub(super) fn read_control(user: &UserMemory, header: &MessageHeader) -> Result<Vec<u8>, Errno> {
    if header.controllen > MAX_CONTROL {
        return Err(ENOBUFS);
    }
    if header.controllen < CMSG_HEADER as u64 {
        return Ok(Vec::new());
    }
    user.read_vec(header.control, header.controllen)
}

/// The control messages in `buffer`, in order: none when it is shorter than a header;
/// EINVAL when a header is shorter than itself or runs past the buffer.
pub(super) fn messages(buffer: &[u8]) -> Result<Vec<Message<'_>>, Errno> {
    let int_at = |at: usize| i32::from_le_bytes([0, 1, 2, 3].map(|i| buffer[at + i]));
    let mut out = Vec::new();
    let mut at = 0;
    while buffer.len() - at >= CMSG_HEADER {
        let len_bytes: [u8; 8] = buffer[at..at + 8].try_into().map_err(|_| Errno::EINVAL)?;
        let len = u64::from_le_bytes(len_bytes);
        if len < CMSG_HEADER as u64 || len > (buffer.len() - at) as u64 {
            return Err(Errno::EINVAL);
        }
        let len = len as usize;
        out.push(Message {
            level: int_at(at + 8),
            kind: int_at(at + 12),
            data: &buffer[at + CMSG_HEADER..at + len],
        });
        // The next header starts at the next 8-byte boundary (CMSG_NXTHDR).
        at += len.next_multiple_of(8).min(buffer.len() - at);
    }
    Ok(out)
}

/// The control messages a recvmsg returns, laid out in a buffer of `room` bytes.
pub(super) struct Reply {
    room: usize,
    /// Each message's offset in the buffer and its bytes (its padding is left untouched).
    pieces: Vec<(usize, Vec<u8>)>,
    used: usize,
    truncated: bool,
}

impl Reply {
    /// A reply into `header`'s control buffer (none when its address is 0).
    pub fn new(header: &MessageHeader) -> Reply {
        let room = if header.control == 0 {
            0
        } else {
            usize::try_from(header.controllen).unwrap_or(usize::MAX)
        };
        Reply {
            room,
            pieces: Vec::new(),
            used: 0,
            truncated: false,
        }
    }

    /// Data bytes a message may still carry whole.
    pub fn data_room(&self) -> usize {
        self.room.saturating_sub(CMSG_HEADER)
    }

    /// Puts one message: dropped when not even its header fits, its data cut to the room
    /// left otherwise (both MSG_CTRUNC), as put_cmsg does.
    pub fn put(&mut self, level: i32, kind: i32, data: &[u8]) {
        if self.room < CMSG_HEADER {
            self.truncated = true;
            return;
        }
        let mut len = CMSG_HEADER + data.len();
        if self.room < len {
            self.truncated = true;
            len = self.room;
        }
        let mut bytes = Vec::with_capacity(len);
        bytes.extend_from_slice(&(len as u64).to_le_bytes());
        bytes.extend_from_slice(&level.to_le_bytes());
        bytes.extend_from_slice(&kind.to_le_bytes());
        bytes.extend_from_slice(&data[..len - CMSG_HEADER]);
        self.pieces.push((self.used, bytes));
        let space = (CMSG_HEADER + data.len())
            .next_multiple_of(8)
            .min(self.room);
        self.used += space;
        self.room -= space;
    }

    #[cfg(test)]
    pub fn pieces(&self) -> &[(usize, Vec<u8>)] {
        &self.pieces
    }

    #[cfg(test)]
    pub fn used(&self) -> usize {
        self.used
    }

    /// Marks the reply cut short (something did not fit that `put` did not see).
    pub fn truncate(&mut self) {
        self.truncated = true;
    }

    /// Writes the messages to `header`'s control buffer, and msg_controllen and msg_flags
    /// (`flags` and MSG_CTRUNC) to the msghdr at `msg`.
    pub fn write(
        &self,
        user: &UserMemory,
        header: &MessageHeader,
        msg: u64,
        flags: u32,
    ) -> Result<(), Errno> {
        for (at, bytes) in &self.pieces {
            user.write(header.control + *at as u64, bytes)?;
        }
        user.write_u64(msg + 40, self.used as u64)?;
        let ctrunc = if self.truncated { MSG_CTRUNC } else { 0 };
        user.write_u32(msg + 48, flags | ctrunc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmsg(len: u64, level: i32, kind: i32, data: &[u8]) -> Vec<u8> {
        let mut out = len.to_le_bytes().to_vec();
        out.extend_from_slice(&level.to_le_bytes());
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn messages_are_walked_at_aligned_offsets() {
        let mut buffer = cmsg(20, 41, 67, &7i32.to_le_bytes());
        buffer.extend_from_slice(&[0xaa; 4]);
        buffer.extend(cmsg(21, 41, 52, &[1, 2, 3, 4, 5]));
        let found = messages(&buffer).unwrap();
        assert_eq!(found.len(), 2);
        assert_eq!(
            (found[0].level, found[0].kind, found[0].int()),
            (41, 67, Some(7))
        );
        assert_eq!((found[1].kind, found[1].data), (52, &[1, 2, 3, 4, 5][..]));
        assert_eq!(found[1].int(), None);
        // Fewer bytes than a header after the last: no more messages.
        buffer.extend_from_slice(&[0; 15]);
        assert_eq!(messages(&buffer).unwrap().len(), 2);
        assert!(messages(&[0; 15]).unwrap().is_empty());
    }

    #[test]
    fn a_bad_length_is_einval() {
        assert_eq!(messages(&cmsg(15, 41, 67, &[0; 8])), Err(Errno::EINVAL));
        assert_eq!(messages(&cmsg(25, 41, 67, &[0; 8])), Err(Errno::EINVAL));
        assert_eq!(
            messages(&cmsg(u64::MAX, 41, 67, &[0; 8])),
            Err(Errno::EINVAL)
        );
        let mut second_bad = cmsg(20, 41, 67, &[0; 4]);
        second_bad.extend_from_slice(&[0; 4]);
        second_bad.extend(cmsg(0, 41, 52, &[0; 4]));
        assert_eq!(messages(&second_bad), Err(Errno::EINVAL));
    }

    fn reply(room: u64) -> Reply {
        Reply::new(&MessageHeader {
            name: None,
            iovecs: Vec::new(),
            control: 0x1000,
            controllen: room,
        })
    }

    #[test]
    fn replies_are_cut_as_put_cmsg_cuts_them() {
        let int = 64i32.to_le_bytes();
        // Two whole ones: each takes CMSG_SPACE(4) = 24 bytes.
        let mut r = reply(48);
        r.put(41, 52, &int);
        r.put(41, 67, &int);
        assert_eq!((r.used, r.truncated), (48, false));
        assert_eq!(r.pieces[1].0, 24);
        assert_eq!(r.pieces[1].1, cmsg(20, 41, 67, &int));
        // The second's data cut: its cmsg_len is what was left.
        let mut r = reply(24 + 19);
        r.put(41, 52, &int);
        r.put(41, 67, &int);
        assert_eq!((r.used, r.truncated), (43, true));
        assert_eq!(r.pieces[1].1, cmsg(19, 41, 67, &int[..3]));
        // No room for the second's header: only the first.
        let mut r = reply(24 + 15);
        r.put(41, 52, &int);
        r.put(41, 67, &int);
        assert_eq!((r.pieces.len(), r.used, r.truncated), (1, 24, true));
        // CMSG_LEN(4) without the padding: whole, the space taken is what there was.
        let mut r = reply(20);
        r.put(41, 52, &int);
        assert_eq!((r.used, r.truncated), (20, false));
        // No buffer at all.
        let mut r = Reply::new(&MessageHeader {
            name: None,
            iovecs: Vec::new(),
            control: 0,
            controllen: 100,
        });
        r.put(41, 52, &int);
        assert_eq!((r.used, r.truncated, r.pieces.len()), (0, true, 0));
    }
}
