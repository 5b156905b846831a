//! Guest-physical layout. Guest-virtual equals guest-physical (identity map), so these are also
//! the addresses the program sees.
//!
//! ```text
//! 0x0000_0000 .. 0x0000_1000   not present: NULL dereferences fault
//! 0x0000_1000 .. 0x000F_D000   system area, supervisor-only (arch/): page tables, GDT, IDT,
//!                              TSS, CPL0 entry stubs and their stacks
//! 0x000F_D000 .. 0x0010_0000   the vDSO (vdso/): its data page and its code, user read-only
//! 0x0010_0000 .. mem_size      user memory (loader, brk, mmap, stack at the top)
//! ```

pub const PAGE_SIZE: u64 = 4096;

/// First byte of the supervisor-only system area.
pub const SYSTEM_AREA_START: u64 = 0x1000;
/// First byte of user memory; everything below it is invisible to CPL3 code (but the vDSO's
/// pages, which it may read and run, never write).
pub const USER_BASE: u64 = 0x10_0000;
/// The vDSO's data page (`vdso::clock`): the VMM's clock parameters, read-only to the guest.
pub const VVAR_ADDR: u64 = VDSO_ADDR - PAGE_SIZE;
/// The vDSO's code (`vdso::IMAGE`, an ELF shared object linked at 0), up to USER_BASE; the
/// auxiliary vector names it (AT_SYSINFO_EHDR).
pub const VDSO_ADDR: u64 = USER_BASE - 2 * PAGE_SIZE;

/// How many pages the page-aligned ranges `[start, end)` hold together.
pub fn pages_in(ranges: &[(u64, u64)]) -> u64 {
    ranges
        .iter()
        .map(|(start, end)| (end - start) / PAGE_SIZE)
        .sum()
}

/// The ranges `[start, end)` sorted, with those that overlap or touch merged into one.
pub fn merge_ranges(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

pub const fn page_align_up(addr: u64) -> u64 {
    (addr + PAGE_SIZE - 1) & !(PAGE_SIZE - 1)
}

pub const fn page_align_down(addr: u64) -> u64 {
    addr & !(PAGE_SIZE - 1)
}
