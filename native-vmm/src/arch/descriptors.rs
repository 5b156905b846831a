//! GDT, TSS and IDT.
//!
//! GDT order follows the STAR MSR rules for syscall/sysret (kernel CS, kernel SS = CS+8; user
//! SS = base+8, user CS = base+16), even though the stubs return with `iretq` (`sysretq` shuts
//! the VM down on the PVM backend): the MSR stays consistent with the table, and the selectors
//! are the ones Linux programs expect to see.
//!
//! The TSS's I/O permission bitmap allows exactly one port at CPL3, SYSCALL_PORT: on the PVM
//! backend the syscall entry stub runs at CPL3 and its `out` needs it (IOPL stays 0). Any other
//! `in`/`out` at CPL3, EXCEPTION_PORT included, raises #GP. Every exception is delivered on IST1,
//! a stack of its own, so a fault with a bad user stack pointer still reaches its stub.

use std::io;

use super::{stubs, too_small, EXCEPTION_STACK_TOP, GDT_ADDR, IDT_ADDR, SYSCALL_PORT, TSS_ADDR};
use crate::memory::GuestMemory;

pub const KERNEL_CS: u16 = 0x08;
pub const KERNEL_SS: u16 = 0x10;
/// User data (SS, DS, ES, FS, GS) with RPL 3.
pub const USER_SS: u16 = 0x18 | 3;
/// User 64-bit code with RPL 3.
pub const USER_CS: u16 = 0x20 | 3;
pub const TSS_SELECTOR: u16 = 0x28;

/// null, kernel code, kernel data, user data, user code, TSS (two slots).
const GDT_SLOTS: usize = 7;
pub const GDT_LIMIT: u16 = (GDT_SLOTS * 8 - 1) as u16;

/// The architectural 64-bit TSS.
pub const TSS_SIZE: u64 = 104;
/// Bitmap bytes up to and including SYSCALL_PORT's, then the 0xFF byte the CPU may read past it.
const IO_BITMAP_BYTES: u64 = SYSCALL_PORT as u64 / 8 + 2;
/// The TSS as written: the TSS, then its I/O bitmap (all of it within the TSS limit).
pub const TSS_SIZE_WITH_IO_BITMAP: u64 = TSS_SIZE + IO_BITMAP_BYTES;
const TSS_RSP0: usize = 0x04;
const TSS_IST1: usize = 0x24;
const TSS_IOMAP_BASE: usize = 0x66;

pub const IDT_VECTORS: u8 = 32;
pub const IDT_LIMIT: u16 = IDT_VECTORS as u16 * 16 - 1;

// Access byte bits of a segment descriptor.
const ACCESS_PRESENT: u64 = 0x80;
const ACCESS_CODE_DATA: u64 = 0x10; // S: code/data rather than system
const TYPE_CODE_EXEC_READ_ACCESSED: u64 = 0xB;
const TYPE_DATA_READ_WRITE_ACCESSED: u64 = 0x3;
/// 64-bit TSS, marked busy as if `ltr` had loaded it (KVM requires a busy TR).
pub const TYPE_TSS_BUSY: u64 = 0xB;
// Flag nibble bits.
const FLAG_GRANULARITY: u64 = 0x8;
const FLAG_DB: u64 = 0x4;
const FLAG_LONG: u64 = 0x2;

/// A flat code or data descriptor (base 0, limit 4 GiB; both ignored in 64-bit mode but kept
/// canonical so the values KVM sees match the table).
const fn segment_descriptor(dpl: u64, kind: u64, flags: u64) -> u64 {
    let access = ACCESS_PRESENT | dpl << 5 | ACCESS_CODE_DATA | kind;
    0xFFFF | access << 40 | 0xF << 48 | flags << 52
}

pub const KERNEL_CODE_DESCRIPTOR: u64 = segment_descriptor(
    0,
    TYPE_CODE_EXEC_READ_ACCESSED,
    FLAG_GRANULARITY | FLAG_LONG,
);
pub const KERNEL_DATA_DESCRIPTOR: u64 =
    segment_descriptor(0, TYPE_DATA_READ_WRITE_ACCESSED, FLAG_GRANULARITY | FLAG_DB);
pub const USER_DATA_DESCRIPTOR: u64 =
    segment_descriptor(3, TYPE_DATA_READ_WRITE_ACCESSED, FLAG_GRANULARITY | FLAG_DB);
pub const USER_CODE_DESCRIPTOR: u64 = segment_descriptor(
    3,
    TYPE_CODE_EXEC_READ_ACCESSED,
    FLAG_GRANULARITY | FLAG_LONG,
);

/// The 16-byte system descriptor of the TSS at `base`.
fn tss_descriptor(base: u64) -> [u64; 2] {
    let limit = TSS_SIZE_WITH_IO_BITMAP - 1;
    let low = (limit & 0xFFFF)
        | (base & 0xFF_FFFF) << 16
        | (ACCESS_PRESENT | TYPE_TSS_BUSY) << 40
        | (limit >> 16 & 0xF) << 48
        | (base >> 24 & 0xFF) << 56;
    [low, base >> 32]
}

pub fn gdt() -> [u64; GDT_SLOTS] {
    let [tss_low, tss_high] = tss_descriptor(TSS_ADDR);
    [
        0,
        KERNEL_CODE_DESCRIPTOR,
        KERNEL_DATA_DESCRIPTOR,
        USER_DATA_DESCRIPTOR,
        USER_CODE_DESCRIPTOR,
        tss_low,
        tss_high,
    ]
}

/// The TSS: IST1 (and RSP0, for completeness: every gate uses IST1) on the exception stack, and
/// right after it the I/O bitmap: a set bit denies its port, so every bit is set but
/// SYSCALL_PORT's.
pub fn tss() -> [u8; TSS_SIZE_WITH_IO_BITMAP as usize] {
    let mut tss = [0xFFu8; TSS_SIZE_WITH_IO_BITMAP as usize];
    tss[..TSS_SIZE as usize].fill(0);
    tss[TSS_RSP0..TSS_RSP0 + 8].copy_from_slice(&EXCEPTION_STACK_TOP.to_le_bytes());
    tss[TSS_IST1..TSS_IST1 + 8].copy_from_slice(&EXCEPTION_STACK_TOP.to_le_bytes());
    tss[TSS_IOMAP_BASE..TSS_IOMAP_BASE + 2].copy_from_slice(&(TSS_SIZE as u16).to_le_bytes());
    let port = SYSCALL_PORT as usize;
    tss[TSS_SIZE as usize + port / 8] &= !(1 << (port % 8));
    tss
}

/// A 64-bit interrupt gate (IF cleared on entry) to `handler` in the kernel code segment, on IST1.
fn interrupt_gate(handler: u64, dpl: u64) -> [u64; 2] {
    const IST: u64 = 1;
    const TYPE_INTERRUPT_GATE: u64 = 0xE;
    let low = (handler & 0xFFFF)
        | u64::from(KERNEL_CS) << 16
        | IST << 32
        | (ACCESS_PRESENT | dpl << 5 | TYPE_INTERRUPT_GATE) << 40
        | (handler >> 16 & 0xFFFF) << 48;
    [low, handler >> 32]
}

/// Gates for vectors 0-31. #BP and #OF get DPL 3, so `int3`/`into` in a program report as
/// themselves (as on Linux); any other `int n` from CPL3 raises #GP.
pub fn idt() -> [[u64; 2]; IDT_VECTORS as usize] {
    let mut idt = [[0u64; 2]; IDT_VECTORS as usize];
    for (vector, gate) in idt.iter_mut().enumerate() {
        let vector = vector as u8;
        let dpl = if vector == 3 || vector == 4 { 3 } else { 0 };
        *gate = interrupt_gate(stubs::exception_stub_addr(vector), dpl);
    }
    idt
}

/// Writes the GDT, TSS and IDT at their system-area addresses.
pub fn write_tables(mem: &GuestMemory) -> io::Result<()> {
    let gdt: Vec<u8> = gdt().iter().flat_map(|d| d.to_le_bytes()).collect();
    mem.write(GDT_ADDR, &gdt).map_err(too_small)?;
    mem.write(TSS_ADDR, &tss()).map_err(too_small)?;
    let idt: Vec<u8> = idt()
        .iter()
        .flatten()
        .flat_map(|d| d.to_le_bytes())
        .collect();
    mem.write(IDT_ADDR, &idt).map_err(too_small)
}

/// A segment register as the vCPU holds it (the hidden part loaded from a descriptor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub selector: u16,
    pub base: u64,
    /// Byte-granular limit (the descriptor's limit scaled by its granularity bit).
    pub limit: u32,
    pub kind: u8,
    pub present: bool,
    pub dpl: u8,
    pub db: bool,
    /// S bit: code/data (true) or system (false).
    pub code_data: bool,
    pub long: bool,
    pub granularity: bool,
}

impl Segment {
    /// What loading `selector` with the 8-byte `descriptor` (and, for system descriptors, the
    /// upper base half `base_high`) puts into a segment register.
    pub fn from_descriptor(selector: u16, descriptor: u64, base_high: u64) -> Segment {
        let raw_limit = (descriptor & 0xFFFF) | (descriptor >> 48 & 0xF) << 16;
        let granularity = descriptor >> 55 & 1 != 0;
        let limit = if granularity {
            raw_limit << 12 | 0xFFF
        } else {
            raw_limit
        };
        let code_data = descriptor >> 44 & 1 != 0;
        let base_low = (descriptor >> 16 & 0xFF_FFFF) | (descriptor >> 56 & 0xFF) << 24;
        Segment {
            selector,
            base: if code_data {
                base_low
            } else {
                base_low | base_high << 32
            },
            limit: limit as u32,
            kind: (descriptor >> 40 & 0xF) as u8,
            present: descriptor >> 47 & 1 != 0,
            dpl: (descriptor >> 45 & 3) as u8,
            db: descriptor >> 54 & 1 != 0,
            code_data,
            long: descriptor >> 53 & 1 != 0,
            granularity,
        }
    }

    /// The segment for a selector of the GDT built here.
    pub fn from_gdt(selector: u16) -> Segment {
        let gdt = gdt();
        let slot = (selector >> 3) as usize;
        Segment::from_descriptor(selector, gdt[slot], gdt.get(slot + 1).copied().unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::cpu_state;

    #[test]
    fn star_selectors_match_the_gdt() {
        let star = cpu_state::STAR;
        let syscall_cs = (star >> 32 & 0xFFFF) as u16;
        let sysret_base = (star >> 48 & 0xFFFF) as u16;
        assert_eq!(syscall_cs, KERNEL_CS);
        assert_eq!(syscall_cs + 8, KERNEL_SS);
        assert_eq!((sysret_base + 8) | 3, USER_SS);
        assert_eq!((sysret_base + 16) | 3, USER_CS);
    }

    #[test]
    fn segments_have_the_expected_privilege_and_mode() {
        let kernel_cs = Segment::from_gdt(KERNEL_CS);
        assert!(kernel_cs.present && kernel_cs.long && kernel_cs.code_data && !kernel_cs.db);
        assert_eq!((kernel_cs.dpl, kernel_cs.kind), (0, 0xB));
        let kernel_ss = Segment::from_gdt(KERNEL_SS);
        assert_eq!(
            (kernel_ss.dpl, kernel_ss.kind, kernel_ss.long),
            (0, 0x3, false)
        );
        let user_cs = Segment::from_gdt(USER_CS);
        assert!(user_cs.present && user_cs.long && !user_cs.db);
        assert_eq!(
            (user_cs.dpl, user_cs.kind, user_cs.selector & 3),
            (3, 0xB, 3)
        );
        let user_ss = Segment::from_gdt(USER_SS);
        assert!(user_ss.present && user_ss.db && !user_ss.long);
        assert_eq!(
            (user_ss.dpl, user_ss.kind, user_ss.limit),
            (3, 0x3, 0xFFFF_FFFF)
        );
    }

    #[test]
    fn tss_descriptor_points_at_the_tss() {
        let tr = Segment::from_gdt(TSS_SELECTOR);
        assert_eq!(tr.base, TSS_ADDR);
        assert_eq!(
            u64::from(tr.limit),
            TSS_SIZE_WITH_IO_BITMAP - 1,
            "the limit covers the I/O bitmap"
        );
        assert_eq!(u64::from(tr.kind), TYPE_TSS_BUSY);
        assert!(tr.present && !tr.code_data);
        // A base above 4 GiB would need the upper half: check the split too.
        let high = 0x1234_5678_9ABC_D000;
        let [low, upper] = tss_descriptor(high);
        assert_eq!(
            Segment::from_descriptor(TSS_SELECTOR, low, upper).base,
            high
        );
    }

    /// The CPU's check of a one-byte `in`/`out` at CPL3 with IOPL 0: it reads the two bytes of
    /// the bitmap holding the port's bit (both must lie within the TSS limit) and allows the
    /// access when the bit is clear.
    fn io_allowed(tss: &[u8], limit: usize, port: u16) -> bool {
        let base = u16::from_le_bytes([tss[TSS_IOMAP_BASE], tss[TSS_IOMAP_BASE + 1]]) as usize;
        let byte = base + port as usize / 8;
        if byte + 1 > limit {
            return false;
        }
        tss[byte] & (1 << (port % 8)) == 0
    }

    #[test]
    fn tss_has_ist1_and_an_io_bitmap_allowing_only_the_syscall_port() {
        let tss = tss();
        let word = |at: usize| u64::from_le_bytes(tss[at..at + 8].try_into().unwrap());
        assert_eq!(word(TSS_IST1), EXCEPTION_STACK_TOP);
        assert_eq!(
            EXCEPTION_STACK_TOP % 16,
            0,
            "the CPU aligns IST stacks to 16 bytes"
        );
        let limit = Segment::from_gdt(TSS_SELECTOR).limit as usize;
        assert_eq!(limit + 1, tss.len());
        let allowed: Vec<u16> = (0..=u16::MAX)
            .filter(|&port| io_allowed(&tss, limit, port))
            .collect();
        assert_eq!(allowed, [SYSCALL_PORT]);
        assert!(!io_allowed(&tss, limit, super::super::EXCEPTION_PORT));
    }

    #[test]
    fn idt_gates_point_at_their_stubs_on_ist1() {
        for (vector, gate) in idt().iter().enumerate() {
            let [low, high] = *gate;
            let offset = (low & 0xFFFF) | (low >> 48 & 0xFFFF) << 16 | high << 32;
            assert_eq!(offset, stubs::exception_stub_addr(vector as u8));
            assert_eq!((low >> 16 & 0xFFFF) as u16, KERNEL_CS);
            assert_eq!(low >> 32 & 7, 1, "IST1");
            assert_eq!(low >> 40 & 0xF, 0xE, "interrupt gate");
            assert_eq!(low >> 47 & 1, 1, "present");
            let dpl = low >> 45 & 3;
            assert_eq!(dpl, if vector == 3 || vector == 4 { 3 } else { 0 });
        }
    }

    #[test]
    fn write_tables_puts_them_at_their_addresses() {
        let mem = GuestMemory::new(4 << 20).unwrap();
        write_tables(&mem).unwrap();
        assert_eq!(
            mem.read_u64(GDT_ADDR + u64::from(KERNEL_CS)).unwrap(),
            KERNEL_CODE_DESCRIPTOR
        );
        assert_eq!(
            mem.read_u64(GDT_ADDR + u64::from(USER_CS & !3)).unwrap(),
            USER_CODE_DESCRIPTOR
        );
        assert_eq!(
            mem.read_u64(TSS_ADDR + TSS_IST1 as u64).unwrap(),
            EXCEPTION_STACK_TOP
        );
        assert_eq!(mem.read_u64(IDT_ADDR + 14 * 16).unwrap(), idt()[14][0]);
    }
}
