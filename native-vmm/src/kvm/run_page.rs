//! The vCPU's `struct kvm_run`, mmap'd from the vCPU fd: how the kernel reports each exit.
//!
//! The kernel writes the page only inside KVM_RUN on the vCPU thread, and reads
//! `immediate_exit` when KVM_RUN starts; the watchdog thread sets `immediate_exit` through an
//! `ExitFlag`. Fields are read with volatile or atomic accesses, never through references.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::addr_of;
use std::sync::atomic::{AtomicU8, Ordering};

use super::abi::{KvmRegs, KvmRun, MmioExit, EXIT_DATA_SIZE, KVM_SYNC_X86_REGS};

pub struct RunPage {
    run: *mut KvmRun,
    len: usize,
}

// SAFETY: the mapping is owned by this value and lives until drop; the kernel side is the only
// other writer, and only while the owning thread is inside KVM_RUN.
unsafe impl Send for RunPage {}

impl RunPage {
    /// Maps `len` bytes (KVM_GET_VCPU_MMAP_SIZE) of `vcpu`'s run structure.
    pub fn map(vcpu: &OwnedFd, len: usize) -> io::Result<RunPage> {
        if len < size_of::<KvmRun>() {
            return Err(io::Error::other(format!(
                "KVM_GET_VCPU_MMAP_SIZE is {len}, smaller than struct kvm_run ({} bytes)",
                size_of::<KvmRun>()
            )));
        }
        // SAFETY: a fresh shared mapping of the vCPU fd at a kernel-chosen address, as the KVM
        // API prescribes; nothing else refers to that range.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                vcpu.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("mmap of the vCPU run page: {e}"),
            ));
        }
        Ok(RunPage {
            run: addr as *mut KvmRun,
            len,
        })
    }

    pub fn exit_reason(&self) -> u32 {
        // SAFETY: run points at a live mapping at least size_of::<KvmRun>() long (checked in
        // map); the kernel does not write it while we are outside KVM_RUN.
        unsafe { addr_of!((*self.run).exit_reason).read_volatile() }
    }

    /// A copy of the exit union, decoded by the abi types.
    pub fn exit_data(&self) -> [u8; EXIT_DATA_SIZE] {
        // SAFETY: as in exit_reason.
        unsafe { addr_of!((*self.run).exit).read_volatile() }
    }

    /// Answers the MMIO read the last exit reported: `bytes` (at most `MmioExit::MAX_LEN`) go
    /// into the exit's `mmio.data`, which KVM hands to the guest on the next KVM_RUN.
    pub fn set_mmio_data(&self, bytes: &[u8]) {
        let len = bytes.len().min(MmioExit::MAX_LEN);
        // SAFETY: the exit union lies inside the mapping (checked in map) and `mmio.data` (8
        // bytes at DATA_OFFSET) inside the union; the kernel does not touch it outside KVM_RUN.
        unsafe {
            let data = std::ptr::addr_of_mut!((*self.run).exit)
                .cast::<u8>()
                .add(MmioExit::DATA_OFFSET);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), data, len);
        }
    }

    /// Asks KVM to store the general registers into the page at every return from KVM_RUN
    /// (`kvm_valid_regs`, KVM_CAP_SYNC_REGS).
    pub fn keep_regs_synced(&self) {
        // SAFETY: a field inside the mapping (checked in map); the kernel reads it only inside
        // KVM_RUN on this thread.
        unsafe {
            std::ptr::addr_of_mut!((*self.run).kvm_valid_regs).write_volatile(KVM_SYNC_X86_REGS)
        };
    }

    /// The general registers KVM stored at the last return from KVM_RUN, or the ones `put_regs`
    /// left for the next one.
    pub fn regs(&self) -> KvmRegs {
        // SAFETY: `struct kvm_sync_regs` starts with a `struct kvm_regs` at the start of the
        // `sync_regs` area inside the mapping; read unaligned-safe and volatile, outside KVM_RUN.
        unsafe {
            std::ptr::addr_of!((*self.run).sync_regs)
                .cast::<KvmRegs>()
                .read_volatile()
        }
    }

    /// Leaves `regs` for KVM to load at the next KVM_RUN's entry (`kvm_dirty_regs`; KVM clears
    /// the bit once loaded).
    pub fn put_regs(&self, regs: &KvmRegs) {
        // SAFETY: as in `regs`; then a field inside the mapping.
        unsafe {
            std::ptr::addr_of_mut!((*self.run).sync_regs)
                .cast::<KvmRegs>()
                .write_volatile(*regs);
            let dirty = std::ptr::addr_of_mut!((*self.run).kvm_dirty_regs);
            dirty.write_volatile(dirty.read_volatile() | KVM_SYNC_X86_REGS);
        }
    }

    /// A handle that another thread uses to make the next (or current) KVM_RUN return EINTR.
    pub fn exit_flag(&self) -> ExitFlag {
        // SAFETY: only the address is computed; the field lies inside the mapping.
        ExitFlag(unsafe { std::ptr::addr_of_mut!((*self.run).immediate_exit) })
    }

    pub fn clear_immediate_exit(&self) {
        self.exit_flag().store(0);
    }
}

impl Drop for RunPage {
    fn drop(&mut self) {
        // SAFETY: run/len describe the mapping made in map(); every ExitFlag has been dropped
        // (KvmCpu drops its watchdog, which owns the only long-lived one, before the page).
        unsafe { libc::munmap(self.run.cast(), self.len) };
    }
}

/// `kvm_run.immediate_exit` of one vCPU, writable from any thread.
pub struct ExitFlag(*mut u8);

// SAFETY: the byte is only accessed atomically; the owner of the RunPage keeps the mapping alive
// for as long as any ExitFlag exists (see RunPage's Drop).
unsafe impl Send for ExitFlag {}

impl ExitFlag {
    /// Makes KVM_RUN return EINTR at once (if it is about to start) instead of entering the guest.
    pub fn raise(&self) {
        self.store(1);
    }

    fn store(&self, value: u8) {
        // SAFETY: the pointer is into the live run mapping (see above); AtomicU8 has the
        // alignment and size of u8.
        unsafe { AtomicU8::from_ptr(self.0) }.store(value, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvm::watchdog::Watchdog;
    use crate::sys;
    use std::fs::File;
    use std::os::unix::fs::FileExt;
    use std::time::{Duration, Instant};

    /// A memfd stands in for the vCPU fd: the kernel's side of the page becomes file writes.
    fn fake_run_page() -> (RunPage, File) {
        let fd = sys::memfd("fake-kvm-run", 3 * 4096).unwrap();
        let page = RunPage::map(&fd, 3 * 4096).unwrap();
        (page, File::from(fd))
    }

    #[test]
    fn reads_what_the_kernel_side_wrote() {
        let (page, kernel) = fake_run_page();
        kernel.write_at(&2u32.to_le_bytes(), 8).unwrap(); // exit_reason = KVM_EXIT_IO
        kernel.write_at(&[1, 1, 0xE0, 0x00], 0x20).unwrap(); // io: out, size 1, port 0xE0
        assert_eq!(page.exit_reason(), super::super::abi::KVM_EXIT_IO);
        let io = super::super::abi::IoExit::decode(&page.exit_data());
        assert_eq!((io.direction, io.size, io.port), (1, 1, 0xE0));
    }

    #[test]
    fn mmio_data_lands_in_the_exit_union_and_is_cut_at_eight_bytes() {
        let (page, kernel) = fake_run_page();
        page.set_mmio_data(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        let mut b = [0u8; 10];
        kernel.read_at(&mut b, 0x20 + 8).unwrap(); // exit union at 0x20, mmio.data at 8
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8, 0, 0]);
    }

    #[test]
    fn synced_registers_sit_at_the_start_of_the_sync_area_and_are_marked_dirty() {
        let (page, kernel) = fake_run_page();
        page.keep_regs_synced();
        let regs = KvmRegs {
            rip: 0x40_1000,
            rflags: 0x202,
            ..Default::default()
        };
        page.put_regs(&regs);
        let word = |at: u64| {
            let mut b = [0u8; 8];
            kernel.read_at(&mut b, at).unwrap();
            u64::from_le_bytes(b)
        };
        assert_eq!(
            (word(0x120), word(0x128)),
            (KVM_SYNC_X86_REGS, KVM_SYNC_X86_REGS),
            "kvm_valid_regs, kvm_dirty_regs"
        );
        assert_eq!(
            (word(0x130 + 0x80), word(0x130 + 0x88)),
            (0x40_1000, 0x202),
            "rip and rflags of struct kvm_regs"
        );
        kernel.write_at(&7u64.to_le_bytes(), 0x130).unwrap(); // what KVM stores at an exit: rax
        assert_eq!(page.regs().gprs.rax, 7);
    }

    #[test]
    fn exit_flag_sets_and_clears_immediate_exit() {
        let (page, kernel) = fake_run_page();
        let immediate_exit = || {
            let mut b = [0u8; 1];
            kernel.read_at(&mut b, 1).unwrap();
            b[0]
        };
        page.exit_flag().raise();
        assert_eq!(immediate_exit(), 1);
        page.clear_immediate_exit();
        assert_eq!(immediate_exit(), 0);

        // The watchdog raises it when an armed deadline passes.
        let flag = page.exit_flag();
        let watchdog = Watchdog::start(Box::new(move || flag.raise())).unwrap();
        assert!(watchdog.arm(Instant::now() + Duration::from_millis(10)));
        // Sleeping in slices: the kick signal may cut a sleep short.
        let until = Instant::now() + Duration::from_secs(5);
        while immediate_exit() == 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        watchdog.disarm();
        assert_eq!(immediate_exit(), 1);
    }

    #[test]
    fn refuses_a_mapping_smaller_than_kvm_run() {
        let fd = sys::memfd("fake-kvm-run", 4096).unwrap();
        assert!(RunPage::map(&fd, 1024).is_err());
    }
}
