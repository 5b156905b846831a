//! The guest's page tables: a 4-level identity map of all guest memory.
//!
//! - page 0 is not present, so NULL dereferences fault;
//! - the system area `[SYSTEM_AREA_START, USER_BASE)` is present but supervisor-only (U/S=0),
//!   except the two pages the syscall entry needs at CPL3 on the PVM backend (where the LSTAR
//!   target runs at guest CPL3): its code page, user read-only, and its stack page, user
//!   writable (it holds nothing but the iretq frame, rewritten on every entry);
//! - the vDSO's pages `[VVAR_ADDR, USER_BASE)` (its data page and code) are user read-only;
//! - user memory `[USER_BASE, size)` is user, writable and executable;
//! - nothing above `size` is mapped, so a stray access faults instead of leaving the VM as MMIO.
//!
//! 2 MiB pages everywhere except the first 2 MiB (which mixes absent, supervisor and user pages)
//! and a last partial 2 MiB region; those two use 4 KiB page tables. Accessed and Dirty bits are
//! preset so the CPU never writes to the tables.

use std::io;

use super::{
    too_small, CODE_ADDR, FIRST_PD_ADDR, LOW_PT_ADDR, PDPT_ADDR, PML4_ADDR, SYSCALL_STACK_TOP,
    TAIL_PT_ADDR,
};
use crate::layout::{PAGE_SIZE, SYSTEM_AREA_START, USER_BASE, VVAR_ADDR};
use crate::memory::GuestMemory;

pub const PTE_PRESENT: u64 = 1 << 0;
pub const PTE_WRITABLE: u64 = 1 << 1;
pub const PTE_USER: u64 = 1 << 2;
pub const PTE_ACCESSED: u64 = 1 << 5;
pub const PTE_DIRTY: u64 = 1 << 6;
/// In a page-directory entry: the entry maps a 2 MiB page instead of pointing to a page table.
pub const PTE_LARGE: u64 = 1 << 7;

/// The physical-address bits of an entry (bits 12..51).
pub const PTE_ADDR_MASK: u64 = 0x000F_FFFF_FFFF_F000;

const ENTRIES: usize = 512;
pub const LARGE_PAGE_SIZE: u64 = 2 << 20;
const GIB: u64 = 1 << 30;

/// The largest guest memory the layout has page directories for (one 4 KiB directory per GiB
/// between FIRST_PD_ADDR and the vDSO's pages).
pub const MAX_MEMORY: u64 = (VVAR_ADDR - FIRST_PD_ADDR) / PAGE_SIZE * GIB;

/// Non-leaf entries allow everything; the leaf decides (effective rights are the AND of levels).
const TABLE: u64 = PTE_PRESENT | PTE_WRITABLE | PTE_USER | PTE_ACCESSED;
const SYSTEM_PAGE: u64 = PTE_PRESENT | PTE_WRITABLE | PTE_ACCESSED | PTE_DIRTY;
const USER_PAGE: u64 = PTE_PRESENT | PTE_WRITABLE | PTE_USER | PTE_ACCESSED | PTE_DIRTY;
/// The stub code page and the vDSO's pages: CPL3 may execute and read them, nobody may write
/// them.
const USER_READ_ONLY_PAGE: u64 = PTE_PRESENT | PTE_USER | PTE_ACCESSED | PTE_DIRTY;
/// The syscall stack page, written by the stub (at CPL3 on PVM).
const SYSCALL_STACK_PAGE: u64 = USER_PAGE;
const SYSCALL_STACK_PAGE_ADDR: u64 = SYSCALL_STACK_TOP - PAGE_SIZE;

/// Guest memory sizes the page tables can map: page-aligned, with some user memory, at most
/// MAX_MEMORY.
pub fn check_memory_size(size: u64) -> io::Result<()> {
    if !size.is_multiple_of(PAGE_SIZE) || size <= USER_BASE || size > MAX_MEMORY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("guest memory of {size:#x} bytes: must be page-aligned, above {USER_BASE:#x} and at most {MAX_MEMORY:#x}"),
        ));
    }
    Ok(())
}

/// The 4 KiB leaf entry for the page at `addr` in a memory of `size` bytes.
fn small_page_entry(addr: u64, size: u64) -> u64 {
    if addr < SYSTEM_AREA_START || addr >= size {
        0
    } else if addr == CODE_ADDR || (VVAR_ADDR..USER_BASE).contains(&addr) {
        addr | USER_READ_ONLY_PAGE
    } else if addr == SYSCALL_STACK_PAGE_ADDR {
        addr | SYSCALL_STACK_PAGE
    } else if addr < USER_BASE {
        addr | SYSTEM_PAGE
    } else {
        addr | USER_PAGE
    }
}

/// A 4 KiB page table for the 2 MiB region starting at `region`.
fn page_table(region: u64, size: u64) -> [u64; ENTRIES] {
    let mut table = [0u64; ENTRIES];
    for (i, entry) in table.iter_mut().enumerate() {
        *entry = small_page_entry(region + i as u64 * PAGE_SIZE, size);
    }
    table
}

/// The page-directory entry for the 2 MiB region starting at `region`.
fn directory_entry(region: u64, size: u64) -> u64 {
    if region >= size {
        0
    } else if region == 0 {
        LOW_PT_ADDR | TABLE
    } else if region + LARGE_PAGE_SIZE > size {
        TAIL_PT_ADDR | TABLE
    } else {
        region | USER_PAGE | PTE_LARGE
    }
}

fn write_table(mem: &GuestMemory, addr: u64, table: &[u64; ENTRIES]) -> io::Result<()> {
    let mut bytes = [0u8; ENTRIES * 8];
    for (chunk, entry) in bytes.chunks_exact_mut(8).zip(table) {
        chunk.copy_from_slice(&entry.to_le_bytes());
    }
    mem.write(addr, &bytes).map_err(too_small)
}

/// Writes the identity map of `mem`; CR3 is `PML4_ADDR`.
pub fn write_page_tables(mem: &GuestMemory) -> io::Result<()> {
    let size = mem.size();
    check_memory_size(size)?;
    let directories = size.div_ceil(GIB);

    let mut pml4 = [0u64; ENTRIES];
    pml4[0] = PDPT_ADDR | TABLE;
    write_table(mem, PML4_ADDR, &pml4)?;

    let mut pdpt = [0u64; ENTRIES];
    for (g, entry) in pdpt.iter_mut().take(directories as usize).enumerate() {
        let pd_addr = FIRST_PD_ADDR + g as u64 * PAGE_SIZE;
        *entry = pd_addr | TABLE;
        let mut pd = [0u64; ENTRIES];
        for (r, pde) in pd.iter_mut().enumerate() {
            *pde = directory_entry(g as u64 * GIB + r as u64 * LARGE_PAGE_SIZE, size);
        }
        write_table(mem, pd_addr, &pd)?;
    }
    write_table(mem, PDPT_ADDR, &pdpt)?;

    write_table(mem, LOW_PT_ADDR, &page_table(0, size))?;
    let tail = size % LARGE_PAGE_SIZE;
    if tail != 0 && size > LARGE_PAGE_SIZE {
        write_table(mem, TAIL_PT_ADDR, &page_table(size - tail, size))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a 4-level walk finds for a virtual address: physical address and effective rights.
    #[derive(Debug, PartialEq, Eq)]
    struct Translation {
        phys: u64,
        user: bool,
        writable: bool,
    }

    /// An independent page walk as the CPU does it (4-level paging, 2 MiB pages allowed).
    fn walk(mem: &GuestMemory, virt: u64) -> Option<Translation> {
        let mut table = PML4_ADDR;
        let mut user = true;
        let mut writable = true;
        for level in 0..4 {
            let shift = 39 - 9 * level;
            let index = (virt >> shift) & 0x1FF;
            let entry = mem.read_u64(table + index * 8).unwrap();
            if entry & PTE_PRESENT == 0 {
                return None;
            }
            user &= entry & PTE_USER != 0;
            writable &= entry & PTE_WRITABLE != 0;
            let base = entry & PTE_ADDR_MASK;
            if level == 2 && entry & PTE_LARGE != 0 {
                return Some(Translation {
                    phys: base + (virt & (LARGE_PAGE_SIZE - 1)),
                    user,
                    writable,
                });
            }
            if level == 3 {
                return Some(Translation {
                    phys: base + (virt & (PAGE_SIZE - 1)),
                    user,
                    writable,
                });
            }
            table = base;
        }
        unreachable!("the walk ends at level 3")
    }

    fn check_layout(size: u64) {
        let mem = GuestMemory::new(size).unwrap();
        write_page_tables(&mem).unwrap();
        let user = |phys| {
            Some(Translation {
                phys,
                user: true,
                writable: true,
            })
        };
        let system = |phys| {
            Some(Translation {
                phys,
                user: false,
                writable: true,
            })
        };

        assert_eq!(walk(&mem, 0), None, "page 0 must be absent");
        assert_eq!(walk(&mem, 0xFFF), None);
        assert_eq!(walk(&mem, SYSTEM_AREA_START), system(SYSTEM_AREA_START));
        assert_eq!(walk(&mem, CODE_ADDR - 1), system(CODE_ADDR - 1));
        assert_eq!(
            walk(&mem, CODE_ADDR + 0x123),
            Some(Translation {
                phys: CODE_ADDR + 0x123,
                user: true,
                writable: false
            }),
            "stub code: user read-only"
        );
        assert_eq!(
            walk(&mem, SYSCALL_STACK_TOP - 8),
            user(SYSCALL_STACK_TOP - 8),
            "syscall stack: user writable"
        );
        assert_eq!(
            walk(&mem, SYSCALL_STACK_TOP - PAGE_SIZE),
            user(SYSCALL_STACK_TOP - PAGE_SIZE)
        );
        assert_eq!(
            walk(&mem, SYSCALL_STACK_TOP),
            system(SYSCALL_STACK_TOP),
            "the exception stack stays supervisor-only"
        );
        assert_eq!(walk(&mem, PML4_ADDR + 8), system(PML4_ADDR + 8));
        assert_eq!(walk(&mem, VVAR_ADDR - 1), system(VVAR_ADDR - 1));
        let read_only = |phys| {
            Some(Translation {
                phys,
                user: true,
                writable: false,
            })
        };
        assert_eq!(
            walk(&mem, VVAR_ADDR),
            read_only(VVAR_ADDR),
            "the vDSO's data page: user read-only"
        );
        assert_eq!(
            walk(&mem, crate::layout::VDSO_ADDR + 8),
            read_only(crate::layout::VDSO_ADDR + 8),
            "the vDSO: user read-only"
        );
        assert_eq!(walk(&mem, USER_BASE - 1), read_only(USER_BASE - 1));
        assert_eq!(walk(&mem, USER_BASE), user(USER_BASE));
        assert_eq!(walk(&mem, LARGE_PAGE_SIZE - 8), user(LARGE_PAGE_SIZE - 8));
        assert_eq!(
            walk(&mem, LARGE_PAGE_SIZE + 0x1234),
            user(LARGE_PAGE_SIZE + 0x1234)
        );
        assert_eq!(walk(&mem, size / 2 + 0x10), user(size / 2 + 0x10));
        assert_eq!(walk(&mem, size - 1), user(size - 1));
        assert_eq!(walk(&mem, size), None, "nothing above guest memory");
        assert_eq!(walk(&mem, size + LARGE_PAGE_SIZE), None);
        assert_eq!(walk(&mem, 1 << 39), None, "only PML4 entry 0 is used");
        // Every 2 MiB region of user memory translates to itself.
        let mut addr = LARGE_PAGE_SIZE;
        while addr < size {
            assert_eq!(
                walk(&mem, addr + 0x42),
                user(addr + 0x42),
                "region {addr:#x}"
            );
            addr += LARGE_PAGE_SIZE;
        }
    }

    #[test]
    fn tables_live_in_the_system_area() {
        let mem = GuestMemory::new(3 << 30).unwrap();
        write_page_tables(&mem).unwrap();
        let mut tables = vec![PML4_ADDR];
        while let Some(table) = tables.pop() {
            for i in 0..ENTRIES as u64 {
                let entry = mem.read_u64(table + i * 8).unwrap();
                let is_table = entry & PTE_PRESENT != 0
                    && entry & PTE_LARGE == 0
                    && table != LOW_PT_ADDR
                    && table != TAIL_PT_ADDR;
                if is_table {
                    let next = entry & PTE_ADDR_MASK;
                    assert!(
                        (SYSTEM_AREA_START..USER_BASE).contains(&next),
                        "table {next:#x}"
                    );
                    tables.push(next);
                }
            }
        }
    }

    #[test]
    fn identity_map_16_mib() {
        check_layout(16 << 20);
    }

    #[test]
    fn identity_map_256_mib() {
        check_layout(256 << 20);
    }

    #[test]
    fn identity_map_2_gib_spans_two_directories() {
        check_layout(2 << 30);
        let mem = GuestMemory::new(2 << 30).unwrap();
        write_page_tables(&mem).unwrap();
        assert_eq!(
            mem.read_u64(PDPT_ADDR + 8).unwrap() & PTE_ADDR_MASK,
            FIRST_PD_ADDR + PAGE_SIZE
        );
        assert_eq!(mem.read_u64(PDPT_ADDR + 16).unwrap(), 0);
    }

    #[test]
    fn large_pages_everywhere_but_the_first_region() {
        let mem = GuestMemory::new(64 << 20).unwrap();
        write_page_tables(&mem).unwrap();
        assert_eq!(mem.read_u64(FIRST_PD_ADDR).unwrap() & PTE_LARGE, 0);
        for r in 1..32 {
            let pde = mem.read_u64(FIRST_PD_ADDR + r * 8).unwrap();
            assert_eq!(
                pde,
                (r * LARGE_PAGE_SIZE) | USER_PAGE | PTE_LARGE,
                "region {r}"
            );
        }
        assert_eq!(mem.read_u64(FIRST_PD_ADDR + 32 * 8).unwrap(), 0);
    }

    #[test]
    fn unaligned_tail_uses_a_page_table() {
        let size = (8 << 20) + 5 * PAGE_SIZE;
        check_layout(size);
        let mem = GuestMemory::new(size).unwrap();
        write_page_tables(&mem).unwrap();
        assert_eq!(
            mem.read_u64(FIRST_PD_ADDR + 4 * 8).unwrap(),
            TAIL_PT_ADDR | TABLE
        );
        assert!(walk(&mem, size - PAGE_SIZE).is_some());
        assert_eq!(walk(&mem, size), None);
    }

    #[test]
    fn memory_smaller_than_one_large_page() {
        let size = USER_BASE + 3 * PAGE_SIZE;
        let mem = GuestMemory::new(size).unwrap();
        write_page_tables(&mem).unwrap();
        assert_eq!(
            walk(&mem, USER_BASE + 2 * PAGE_SIZE).map(|t| t.user),
            Some(true)
        );
        assert_eq!(walk(&mem, size), None);
    }

    #[test]
    fn rejects_sizes_the_layout_cannot_map() {
        assert!(check_memory_size(USER_BASE).is_err());
        assert!(check_memory_size(MAX_MEMORY + PAGE_SIZE).is_err());
        assert!(check_memory_size(USER_BASE + 100).is_err());
        assert!(check_memory_size(MAX_MEMORY).is_ok());
    }
}
