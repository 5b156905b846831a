//! The character devices every VM has at /dev, served by the VMM (never host device files):
//! null (reads end of file, writes vanish), zero (reads zeros), random and urandom (reads fresh
//! bytes from the host CSPRNG on every read, so forks of one template never share a stream;
//! writes, which would feed entropy on Linux, are accepted and dropped); ptmx and tty, which
//! the syscall layer opens as pseudo-terminal ends (`syscalls::terminal`), never read here;
//! the /dev/pts directory of the pseudo-terminals' slaves; and the links fd, stdin, stdout and
//! stderr into /proc/self/fd.

use crate::errno::Errno;
use crate::sys;

/// The synthetic directory's name under the root.
pub(crate) const DEV_DIR: &[u8] = b"dev";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    Null,
    Zero,
    Random,
    Urandom,
    /// Opening it makes a new pseudo-terminal and gives its master.
    Ptmx,
    /// The caller's controlling terminal.
    Tty,
}

/// The symbolic links of /dev into the caller's fds, as Linux systems make them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DevLink {
    Fd,
    Stdin,
    Stdout,
    Stderr,
}

impl DevLink {
    /// Every link, in /dev listing order.
    pub const ALL: [DevLink; 4] = [
        DevLink::Fd,
        DevLink::Stderr,
        DevLink::Stdin,
        DevLink::Stdout,
    ];

    pub fn name(self) -> &'static [u8] {
        match self {
            DevLink::Fd => b"fd",
            DevLink::Stdin => b"stdin",
            DevLink::Stdout => b"stdout",
            DevLink::Stderr => b"stderr",
        }
    }

    pub fn by_name(name: &[u8]) -> Option<DevLink> {
        DevLink::ALL.into_iter().find(|l| l.name() == name)
    }

    pub fn target(self) -> &'static [u8] {
        match self {
            DevLink::Fd => b"/proc/self/fd",
            DevLink::Stdin => b"/proc/self/fd/0",
            DevLink::Stdout => b"/proc/self/fd/1",
            DevLink::Stderr => b"/proc/self/fd/2",
        }
    }

    /// A small stable number for snapshots and inode numbers (after the devices').
    pub fn index(self) -> u8 {
        match self {
            DevLink::Fd => 0,
            DevLink::Stdin => 1,
            DevLink::Stdout => 2,
            DevLink::Stderr => 3,
        }
    }

    pub fn from_index(i: u8) -> Option<DevLink> {
        DevLink::ALL.into_iter().find(|l| l.index() == i)
    }
}

/// The directory of pseudo-terminal slaves under /dev.
pub(crate) const PTS_DIR: &[u8] = b"pts";
/// Linux's major number of pseudo-terminal slaves (Unix98 ptys).
const PTS_MAJOR: u64 = 136;

/// st_rdev of /dev/pts/`n` (Linux's new_encode_dev).
pub fn pts_rdev(n: u32) -> u64 {
    let minor = u64::from(n);
    (minor & 0xff) | (PTS_MAJOR << 8) | ((minor & !0xff) << 12)
}

impl Device {
    /// Every device, in /dev listing order.
    pub const ALL: [Device; 6] = [
        Device::Null,
        Device::Ptmx,
        Device::Random,
        Device::Tty,
        Device::Urandom,
        Device::Zero,
    ];

    pub fn name(self) -> &'static [u8] {
        match self {
            Device::Null => b"null",
            Device::Zero => b"zero",
            Device::Random => b"random",
            Device::Urandom => b"urandom",
            Device::Ptmx => b"ptmx",
            Device::Tty => b"tty",
        }
    }

    pub fn by_name(name: &[u8]) -> Option<Device> {
        Device::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Linux's device number (major 1 for the "mem" devices, 5 for tty and ptmx), as
    /// st_rdev encodes it.
    pub fn rdev(self) -> u64 {
        let (major, minor) = match self {
            Device::Null => (1, 3),
            Device::Zero => (1, 5),
            Device::Random => (1, 8),
            Device::Urandom => (1, 9),
            Device::Tty => (5, 0),
            Device::Ptmx => (5, 2),
        };
        (major << 8) | minor
    }

    /// A small stable number for snapshots and inode numbers.
    pub fn index(self) -> u8 {
        match self {
            Device::Null => 0,
            Device::Zero => 1,
            Device::Random => 2,
            Device::Urandom => 3,
            Device::Ptmx => 4,
            Device::Tty => 5,
        }
    }

    pub fn from_index(i: u8) -> Option<Device> {
        Device::ALL.into_iter().find(|d| d.index() == i)
    }

    /// Fills `buf` as a read of the device does; returns the byte count (0: end of file).
    pub fn read(self, buf: &mut [u8]) -> Result<usize, Errno> {
        match self {
            Device::Null => Ok(0),
            Device::Zero => {
                buf.fill(0);
                Ok(buf.len())
            }
            Device::Random | Device::Urandom => {
                sys::fill_random(buf).map_err(|_| Errno::EIO)?;
                Ok(buf.len())
            }
            // Opened as terminal ends, never as files.
            Device::Ptmx | Device::Tty => Err(Errno::ENXIO),
        }
    }
}
