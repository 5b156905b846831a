//! The x86-64 machine state a kernel-less guest needs, as plain data: everything the VMM writes
//! into the supervisor-only system area `[layout::SYSTEM_AREA_START, layout::USER_BASE)` of guest
//! memory before the first run, and the control-register, MSR and segment values of the vCPU.
//!
//! Pure Rust, no KVM: every table and stub here is unit-tested on machines without /dev/kvm
//! (page-table walks for several memory sizes, descriptor decoding, stub bytes checked against
//! a copy assembled with GNU `as`, a symbolic run of the syscall entry stub). `qemu_check/` runs
//! the same tables and stubs on QEMU's x86-64 CPU model (a manual check, not part of `cargo
//! test`: syscalls round-trip with registers intact, faults reach the VMM with the right vector,
//! error code and CR2). Whether KVM accepts them is checked only when `kvm::KvmCpu` runs on a
//! machine with /dev/kvm.
//!
//! System area layout (all below `USER_BASE`; supervisor-only but for the two syscall-entry
//! pages, which the PVM backend runs at CPL3, see `paging`):
//!
//! ```text
//! 0x1000   PML4
//! 0x2000   PDPT (covers 512 GiB)
//! 0x3000   page table for [0, 2 MiB): page 0 absent, system area supervisor-only, rest user
//! 0x4000   page table for the last, partial 2 MiB of memory (when the size is not 2 MiB aligned)
//! 0x5000   GDT; the TSS (with an I/O bitmap allowing SYSCALL_PORT only) at 0x5080
//! 0x6000   IDT (vectors 0-31)
//! 0x7000   stub code: the syscall entry, the exception stubs (user read-only)
//! 0x8000   syscall stack page; its top holds the iretq frame back to CPL3 (user writable)
//! 0x9000   exception stack page (TSS IST1)
//! 0x10000  page directories, one per GiB of guest memory (up to VVAR_ADDR: 237 GiB)
//! 0xFD000  the vDSO's data page and code (layout::VVAR_ADDR, VDSO_ADDR; user read-only)
//! ```
//!
//! The tables are written once, before the first run, and never changed: on the PVM backend a
//! present page-table entry changed from the host is not seen by the guest (DESIGN.md).

pub mod cpu_state;
pub mod descriptors;
pub mod paging;
pub mod stubs;

use std::io;

use crate::memory::GuestMemory;

pub const PML4_ADDR: u64 = 0x1000;
pub const PDPT_ADDR: u64 = 0x2000;
/// The 4 KiB page table for the first 2 MiB (page 0, the system area, the start of user memory).
pub const LOW_PT_ADDR: u64 = 0x3000;
/// The 4 KiB page table for the last 2 MiB region when memory ends inside it.
pub const TAIL_PT_ADDR: u64 = 0x4000;
pub const GDT_ADDR: u64 = 0x5000;
pub const TSS_ADDR: u64 = 0x5080;
pub const IDT_ADDR: u64 = 0x6000;
pub const CODE_ADDR: u64 = 0x7000;
/// Top of the stack the syscall entry switches to (the stack is the page below it).
pub const SYSCALL_STACK_TOP: u64 = 0x9000;
/// Top of the IST1 stack every exception is delivered on (the page below it).
pub const EXCEPTION_STACK_TOP: u64 = 0xA000;
/// The two stub stacks: the only system-area memory the guest writes, so what a vCPU stopped
/// in a stub keeps of its own there (its iretq frame) while another VM runs on the same memory.
pub const STUB_STACKS: std::ops::Range<u64> = SYSCALL_STACK_TOP - 0x1000..EXCEPTION_STACK_TOP;
/// First page directory; one 4 KiB directory maps 1 GiB.
pub const FIRST_PD_ADDR: u64 = 0x10000;

/// The I/O port the syscall entry stub writes to: the VMM answers a system call.
pub const SYSCALL_PORT: u16 = 0xE0;
/// The I/O port the exception stubs write to: the guest faulted.
pub const EXCEPTION_PORT: u16 = 0xE1;

/// Writes the page tables, GDT, TSS, IDT and the stub code into the system area of `mem`.
/// Only the system area is written.
pub fn install(mem: &GuestMemory) -> io::Result<()> {
    paging::write_page_tables(mem)?;
    descriptors::write_tables(mem)?;
    stubs::write_code(mem)
}

/// A guest write of the system area failed: guest memory is smaller than the layout needs.
fn too_small(e: crate::memory::OutOfBounds) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("writing the guest system area: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{SYSTEM_AREA_START, USER_BASE};

    #[test]
    fn system_area_objects_do_not_overlap_and_stay_below_user_memory() {
        let objects = [
            (PML4_ADDR, 0x1000),
            (PDPT_ADDR, 0x1000),
            (LOW_PT_ADDR, 0x1000),
            (TAIL_PT_ADDR, 0x1000),
            (GDT_ADDR, u64::from(descriptors::GDT_LIMIT) + 1),
            (TSS_ADDR, descriptors::TSS_SIZE_WITH_IO_BITMAP),
            (IDT_ADDR, u64::from(descriptors::IDT_LIMIT) + 1),
            (CODE_ADDR, stubs::code_image().len() as u64),
            (SYSCALL_STACK_TOP - 0x1000, 0x1000),
            (EXCEPTION_STACK_TOP - 0x1000, 0x1000),
            (FIRST_PD_ADDR, crate::layout::VVAR_ADDR - FIRST_PD_ADDR),
            (
                crate::layout::VVAR_ADDR,
                USER_BASE - crate::layout::VVAR_ADDR,
            ),
        ];
        for (i, &(start, len)) in objects.iter().enumerate() {
            assert!(
                start >= SYSTEM_AREA_START && start + len <= USER_BASE,
                "object {i} at {start:#x}"
            );
            for &(other, other_len) in &objects[i + 1..] {
                assert!(
                    start + len <= other || other + other_len <= start,
                    "{start:#x} overlaps {other:#x}"
                );
            }
        }
    }

    #[test]
    fn install_writes_only_the_system_area() {
        let mem = GuestMemory::new(16 << 20).unwrap();
        mem.fill(0, 16 << 20, 0xAA).unwrap();
        install(&mem).unwrap();
        assert_eq!(
            mem.read_vec(0, SYSTEM_AREA_START).unwrap(),
            vec![0xAA; SYSTEM_AREA_START as usize]
        );
        assert_eq!(
            mem.read_vec(USER_BASE, 1 << 20).unwrap(),
            vec![0xAA; 1 << 20]
        );
    }

    #[test]
    fn install_rejects_memory_too_small_for_user_space() {
        let mem = GuestMemory::new(USER_BASE).unwrap();
        assert!(install(&mem).is_err());
    }
}
