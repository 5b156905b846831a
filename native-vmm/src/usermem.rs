//! Guest memory as a system call (or the signal frame it delivers) may touch it: user memory
//! only.
//!
//! The system area below USER_BASE (page tables, GDT/IDT, CPL0 stubs) is guest memory too,
//! but the program cannot reach it, so a pointer into it is as bad as one outside memory:
//! EFAULT. Every handler goes through this view, never through GuestMemory directly.

// The guest's structs (timespec, timeval, iovec) hold C signed values in 64-bit words.
#![allow(clippy::cast_sign_loss, clippy::cast_possible_wrap)]

use crate::abi::PATH_MAX;
use crate::errno::Errno;
use crate::layout::USER_BASE;
use crate::memory::GuestMemory;
use std::time::Duration;

/// Most elements an iovec array may have (Linux UIO_MAXIOV).
pub const IOV_MAX: u64 = 1024;

pub struct UserMemory<'a> {
    mem: &'a GuestMemory,
}

impl<'a> UserMemory<'a> {
    pub fn new(mem: &'a GuestMemory) -> UserMemory<'a> {
        UserMemory { mem }
    }

    /// The whole guest memory, for the memory map (which checks its own ranges).
    pub fn guest(&self) -> &'a GuestMemory {
        self.mem
    }

    /// Checks that [addr, addr+len) is user memory (an empty range anywhere is).
    pub fn check(&self, addr: u64, len: u64) -> Result<(), Errno> {
        // Nothing is touched: Linux takes any pointer with a length of 0 (a write of no bytes).
        if len == 0 {
            return Ok(());
        }
        if addr < USER_BASE {
            return Err(Errno::EFAULT);
        }
        self.mem.check(addr, len)?;
        Ok(())
    }

    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Errno> {
        self.check(addr, buf.len() as u64)?;
        Ok(self.mem.read(addr, buf)?)
    }

    pub fn read_vec(&self, addr: u64, len: u64) -> Result<Vec<u8>, Errno> {
        self.check(addr, len)?;
        Ok(self.mem.read_vec(addr, len)?)
    }

    pub fn write(&self, addr: u64, data: &[u8]) -> Result<(), Errno> {
        self.check(addr, data.len() as u64)?;
        Ok(self.mem.write(addr, data)?)
    }

    pub fn read_u32(&self, addr: u64) -> Result<u32, Errno> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    pub fn read_u64(&self, addr: u64) -> Result<u64, Errno> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    pub fn write_u32(&self, addr: u64, value: u32) -> Result<(), Errno> {
        self.write(addr, &value.to_le_bytes())
    }

    pub fn write_u64(&self, addr: u64, value: u64) -> Result<(), Errno> {
        self.write(addr, &value.to_le_bytes())
    }

    /// Reads a NUL-terminated path: EFAULT when it leaves user memory, ENAMETOOLONG when no
    /// NUL comes within PATH_MAX bytes.
    pub fn read_path(&self, addr: u64) -> Result<Vec<u8>, Errno> {
        self.read_cstr(addr, PATH_MAX - 1, Errno::ENAMETOOLONG)
    }

    /// Reads a NUL-terminated string of at most `max` bytes: EFAULT when it leaves user
    /// memory first, `too_long` when its first `max` + 1 bytes hold no NUL.
    pub fn read_cstr(&self, addr: u64, max: usize, too_long: Errno) -> Result<Vec<u8>, Errno> {
        if addr < USER_BASE {
            return Err(Errno::EFAULT);
        }
        match self.mem.read_cstr(addr, max) {
            Ok(s) => Ok(s),
            Err(_) if self.mem.check(addr, max as u64 + 1).is_ok() => Err(too_long),
            Err(_) => Err(Errno::EFAULT),
        }
    }

    /// Reads an iovec array: (base, len) pairs. More than IOV_MAX entries is EINVAL, as is a
    /// total length that does not fit in ssize_t.
    pub fn read_iovecs(&self, iov: u64, count: u64) -> Result<Vec<(u64, u64)>, Errno> {
        if count > IOV_MAX {
            return Err(Errno::EINVAL);
        }
        let raw = self.read_vec(iov, count * 16)?;
        let mut total: u64 = 0;
        let mut out = Vec::with_capacity(count as usize);
        for entry in raw.chunks_exact(16) {
            let base = u64::from_le_bytes(entry[..8].try_into().map_err(|_| Errno::EFAULT)?);
            let len = u64::from_le_bytes(entry[8..].try_into().map_err(|_| Errno::EFAULT)?);
            total = total
                .checked_add(len)
                .filter(|&t| t <= i64::MAX as u64)
                .ok_or(Errno::EINVAL)?;
            out.push((base, len));
        }
        Ok(out)
    }

    /// Reads a `struct timespec`; a negative field or nanoseconds ≥ 1e9 is EINVAL.
    pub fn read_timespec(&self, addr: u64) -> Result<(u64, u32), Errno> {
        let sec = self.read_u64(addr)? as i64;
        let nsec = self.read_u64(addr + 8)? as i64;
        if sec < 0 || !(0..1_000_000_000).contains(&nsec) {
            return Err(Errno::EINVAL);
        }
        Ok((sec as u64, nsec as u32))
    }

    /// A struct timeval as a duration: EINVAL for a negative time or microseconds out of range.
    pub fn read_timeval(&self, addr: u64) -> Result<Duration, Errno> {
        let (sec, usec) = (self.read_u64(addr)? as i64, self.read_u64(addr + 8)? as i64);
        if sec < 0 || !(0..1_000_000).contains(&usec) {
            return Err(Errno::EINVAL);
        }
        Ok(Duration::new(sec as u64, usec as u32 * 1000))
    }

    pub fn write_timespec(&self, addr: u64, sec: u64, nsec: u64) -> Result<(), Errno> {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&sec.to_le_bytes());
        b[8..].copy_from_slice(&nsec.to_le_bytes());
        self.write(addr, &b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_area_and_outside_memory_are_efault() {
        let mem = GuestMemory::new(2 << 20).unwrap();
        let user = UserMemory::new(&mem);
        assert_eq!(user.write_u64(0x1000, 1), Err(Errno::EFAULT));
        assert_eq!(user.write_u64(USER_BASE - 4, 1), Err(Errno::EFAULT));
        assert_eq!(user.read_u64(2 << 20), Err(Errno::EFAULT));
        assert_eq!(user.read_path(0), Err(Errno::EFAULT));
        user.write_u64(USER_BASE, 7).unwrap();
        assert_eq!(mem.read_u64(USER_BASE).unwrap(), 7);
    }

    #[test]
    fn paths_are_bounded() {
        let mem = GuestMemory::new(2 << 20).unwrap();
        let user = UserMemory::new(&mem);
        mem.fill(USER_BASE, PATH_MAX as u64 + 10, b'a').unwrap();
        assert_eq!(user.read_path(USER_BASE), Err(Errno::ENAMETOOLONG));
        mem.write(USER_BASE, b"/tmp/x\0").unwrap();
        assert_eq!(user.read_path(USER_BASE).unwrap(), b"/tmp/x");
        // A string running off the end of memory is EFAULT.
        mem.fill((2 << 20) - 8, 8, b'a').unwrap();
        assert_eq!(user.read_path((2 << 20) - 8), Err(Errno::EFAULT));
    }

    #[test]
    fn iovecs_are_limited() {
        let mem = GuestMemory::new(2 << 20).unwrap();
        let user = UserMemory::new(&mem);
        assert_eq!(user.read_iovecs(USER_BASE, IOV_MAX + 1), Err(Errno::EINVAL));
        mem.write_u64(USER_BASE, 0x2000).unwrap();
        mem.write_u64(USER_BASE + 8, u64::MAX).unwrap();
        assert_eq!(user.read_iovecs(USER_BASE, 1), Err(Errno::EINVAL));
        mem.write_u64(USER_BASE + 8, 5).unwrap();
        assert_eq!(user.read_iovecs(USER_BASE, 1).unwrap(), vec![(0x2000, 5)]);
    }
}
