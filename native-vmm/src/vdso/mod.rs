//! The guest's vDSO: clock_gettime, gettimeofday, time, clock_getres and getcpu answered inside
//! the VM, without a system call, as Linux's vDSO does (and gVisor's). A guest system call is a
//! VM exit; Node makes hundreds of clock_gettime calls per pooled `console.log(1+1)`, Python's
//! GIL waits and timeouts many more.
//!
//! - The code (`vdso/vdso.c`, `vdso/vdso.lds`, built by build.rs with the system C compiler) is
//!   an ELF shared object linked at 0, placed by the loader at `layout::VDSO_ADDR` in the system
//!   area and named in the auxiliary vector (AT_SYSINFO_EHDR); glibc finds `__vdso_*` there by
//!   name and version (LINUX_2.6). A template snapshot carries it in its memory, with glibc's
//!   pointers into it, so every fork has the same code at the same address.
//! - Its data page (`layout::VVAR_ADDR`, just below) is `clock`'s page, one per VMM process,
//!   shared read-only by every VM whose TSC reads the host's (`kvm`), so it costs no memory per
//!   VM and a fork reads the current time at once. Elsewhere the page reads as zeros (a VM
//!   whose memory never showed it, the ptrace development CPU), which tells the vDSO to make
//!   the system call.
//! - The CPU-time clocks, and any clock the page does not serve, are system calls: the VMM
//!   accounts CPU time per guest thread (`syscalls::time`), which no page shared by all VMs
//!   can hold, and programs read them rarely (Node and Python: never per execution).
//!
//! Page permissions (`arch::paging`): both pages are user read-only, so a guest can neither
//! change the clock other VMs read nor its own code's copy (a guest that jumps into the vDSO
//! anywhere only runs its own code, at CPL3).

// The clock page holds the kernel's vDSO data layout: signed time values stored in u64 words.
#![allow(clippy::cast_sign_loss, clippy::cast_possible_wrap)]

pub mod clock;

use crate::layout::{USER_BASE, VDSO_ADDR};
use crate::memory::{GuestMemory, OutOfBounds};

/// The vDSO's ELF image, built by build.rs.
pub const IMAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/vdso.so"));

const _: () = assert!(
    IMAGE.len() as u64 <= USER_BASE - VDSO_ADDR,
    "the vDSO outgrew its pages below USER_BASE"
);

/// Writes the vDSO into guest memory at `VDSO_ADDR` (a fresh program's memory; a fork has it
/// from its template).
pub fn install(mem: &GuestMemory) -> Result<(), OutOfBounds> {
    mem.write(VDSO_ADDR, IMAGE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::{Elf, ElfKind};

    fn u64_at(bytes: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
    }

    /// The dynamic section's (tag, value) pairs up to DT_NULL.
    fn dynamic_entries() -> Vec<(u64, u64)> {
        const PT_DYNAMIC: u32 = 2;
        let (phoff, phnum) = (
            u64_at(IMAGE, 32) as usize,
            u16::from_le_bytes([IMAGE[56], IMAGE[57]]) as usize,
        );
        let dynamic = (0..phnum)
            .map(|i| phoff + i * 56)
            .find(|&ph| u32::from_le_bytes(IMAGE[ph..ph + 4].try_into().unwrap()) == PT_DYNAMIC)
            .expect("a PT_DYNAMIC");
        let (offset, size) = (
            u64_at(IMAGE, dynamic + 8) as usize,
            u64_at(IMAGE, dynamic + 32) as usize,
        );
        IMAGE[offset..offset + size]
            .chunks_exact(16)
            .map(|e| (u64_at(e, 0), u64_at(e, 8)))
            .take_while(|&(tag, _)| tag != 0)
            .collect()
    }

    #[test]
    fn the_image_is_one_segment_at_zero_that_needs_no_relocation() {
        let elf = Elf::parse(IMAGE).unwrap();
        assert_eq!(elf.kind, ElfKind::SharedObject);
        let segments: Vec<_> = elf.load_segments().collect();
        assert_eq!(segments.len(), 1, "one PT_LOAD");
        assert_eq!(
            (segments[0].vaddr, segments[0].offset),
            (0, 0),
            "linked at 0, headers included: glibc reads them at AT_SYSINFO_EHDR"
        );
        assert!(segments[0].memsz <= USER_BASE - VDSO_ADDR);
        // glibc never relocates a vDSO, so it may have no relocations and need no library.
        const DT_NEEDED: u64 = 1;
        const DT_RELA: u64 = 7;
        const DT_REL: u64 = 17;
        const DT_TEXTREL: u64 = 22;
        const DT_JMPREL: u64 = 23;
        for (tag, _) in dynamic_entries() {
            assert!(
                ![DT_NEEDED, DT_RELA, DT_REL, DT_TEXTREL, DT_JMPREL].contains(&tag),
                "dynamic tag {tag}"
            );
        }
    }

    #[test]
    fn the_image_exports_what_glibc_looks_up_with_linux_version() {
        const DT_STRTAB: u64 = 5;
        const DT_STRSZ: u64 = 10;
        const DT_VERDEF: u64 = 0x6fff_fffc;
        let entries = dynamic_entries();
        let tag = |t| {
            entries
                .iter()
                .find(|&&(tag, _)| tag == t)
                .map(|&(_, v)| v as usize)
                .unwrap_or_else(|| panic!("dynamic tag {t:#x}"))
        };
        let strings = &IMAGE[tag(DT_STRTAB)..tag(DT_STRTAB) + tag(DT_STRSZ)];
        let names: Vec<&[u8]> = strings.split(|&b| b == 0).collect();
        for name in [
            "__vdso_clock_gettime",
            "__vdso_gettimeofday",
            "__vdso_time",
            "__vdso_clock_getres",
            "__vdso_getcpu",
            "LINUX_2.6",
            "linux-vdso.so.1",
        ] {
            assert!(
                names.contains(&name.as_bytes()),
                "{name} is not in the vDSO's dynamic strings"
            );
        }
        tag(DT_VERDEF);
    }

    #[test]
    fn install_writes_the_image_below_user_memory() {
        let mem = GuestMemory::new(4 << 20).unwrap();
        install(&mem).unwrap();
        assert_eq!(mem.read_vec(VDSO_ADDR, IMAGE.len() as u64).unwrap(), IMAGE);
        assert_eq!(mem.read_vec(USER_BASE, 16).unwrap(), vec![0; 16]);
    }
}
