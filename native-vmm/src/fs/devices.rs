//! The character devices every VM has at /dev, served by the VMM (never host device files):
//! null (reads end of file, writes vanish), zero (reads zeros), random and urandom (reads fresh
//! bytes from the host CSPRNG on every read, so forks of one template never share a stream;
//! writes, which would feed entropy on Linux, are accepted and dropped).

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
}

impl Device {
    /// Every device, in /dev listing order.
    pub const ALL: [Device; 4] = [Device::Null, Device::Random, Device::Urandom, Device::Zero];

    pub fn name(self) -> &'static [u8] {
        match self {
            Device::Null => b"null",
            Device::Zero => b"zero",
            Device::Random => b"random",
            Device::Urandom => b"urandom",
        }
    }

    pub fn by_name(name: &[u8]) -> Option<Device> {
        Device::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Linux's device number (major 1, "mem" devices), as st_rdev encodes it.
    pub fn rdev(self) -> u64 {
        let minor = match self {
            Device::Null => 3,
            Device::Zero => 5,
            Device::Random => 8,
            Device::Urandom => 9,
        };
        (1 << 8) | minor
    }

    /// A small stable number for snapshots and inode numbers.
    pub fn index(self) -> u8 {
        match self {
            Device::Null => 0,
            Device::Zero => 1,
            Device::Random => 2,
            Device::Urandom => 3,
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
        }
    }
}
