//! The vCPU's control registers, MSRs, XCR0 and initial user state for long mode at CPL3.

use super::descriptors::{Segment, KERNEL_CS, TSS_SELECTOR, USER_CS, USER_SS};
use super::stubs::SYSCALL_ENTRY_ADDR;
use super::PML4_ADDR;

pub const CR0_PE: u64 = 1 << 0;
pub const CR0_MP: u64 = 1 << 1;
pub const CR0_ET: u64 = 1 << 4;
pub const CR0_NE: u64 = 1 << 5;
pub const CR0_WP: u64 = 1 << 16;
pub const CR0_PG: u64 = 1 << 31;
/// Protected mode with paging; x87 errors as exceptions; WP so CPL0 honours read-only pages.
pub const CR0: u64 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;

pub const CR3: u64 = PML4_ADDR;

pub const CR4_PAE: u64 = 1 << 5;
pub const CR4_OSFXSR: u64 = 1 << 9;
pub const CR4_OSXMMEXCPT: u64 = 1 << 10;
pub const CR4_FSGSBASE: u64 = 1 << 16;
pub const CR4_OSXSAVE: u64 = 1 << 18;

pub const EFER_SCE: u64 = 1 << 0;
pub const EFER_LME: u64 = 1 << 8;
pub const EFER_LMA: u64 = 1 << 10;
pub const EFER_NXE: u64 = 1 << 11;
/// Long mode active, `syscall` enabled, NX bit usable.
pub const EFER: u64 = EFER_SCE | EFER_LME | EFER_LMA | EFER_NXE;

pub const MSR_STAR: u32 = 0xC000_0081;
pub const MSR_LSTAR: u32 = 0xC000_0082;
pub const MSR_SFMASK: u32 = 0xC000_0084;
pub const MSR_TSC_AUX: u32 = 0xC000_0103;

/// syscall loads CS = KERNEL_CS, SS = KERNEL_CS + 8; sysret would load SS = base + 8 and
/// CS = base + 16 (RPL 3), with base = USER_SS - 8.
pub const STAR: u64 = ((USER_SS as u64 & !3) - 8) << 48 | (KERNEL_CS as u64) << 32;

pub const RFLAGS_RESERVED: u64 = 1 << 1;
pub const RFLAGS_TF: u64 = 1 << 8;
pub const RFLAGS_IF: u64 = 1 << 9;
pub const RFLAGS_DF: u64 = 1 << 10;
pub const RFLAGS_NT: u64 = 1 << 14;
pub const RFLAGS_AC: u64 = 1 << 18;
/// Cleared on `syscall`: no single-stepping, interrupts or alignment checks in the stub, a
/// forward string direction, and no NT (with NT set, `iretq` would raise #GP).
pub const SFMASK: u64 = RFLAGS_TF | RFLAGS_IF | RFLAGS_DF | RFLAGS_NT | RFLAGS_AC;

/// The program starts with IF set, as a Linux process does. No interrupt controller is created,
/// so nothing is ever delivered; the stubs run with IF clear (SFMASK, interrupt gates) and
/// `iretq` restores the program's own flags.
pub const USER_RFLAGS: u64 = RFLAGS_RESERVED | RFLAGS_IF;

pub const XCR0_X87: u64 = 1 << 0;
pub const XCR0_SSE: u64 = 1 << 1;
pub const XCR0_AVX: u64 = 1 << 2;

/// The MSRs to set, with their values.
pub const MSRS: [(u32, u64); 3] = [
    (MSR_STAR, STAR),
    (MSR_LSTAR, SYSCALL_ENTRY_ADDR),
    (MSR_SFMASK, SFMASK),
];

/// The CPU features the setup depends on, from the CPUID the vCPU will report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuFeatures {
    /// CPUID.1:ECX.XSAVE: XSAVE/XGETBV and CR4.OSXSAVE exist.
    pub xsave: bool,
    /// CPUID.(7,0):EBX.FSGSBASE.
    pub fsgsbase: bool,
    /// XCR0 bits the CPU supports (CPUID.(0xD,0):EDX:EAX), read even when leaf 1 denies XSAVE:
    /// the PVM backend reports no XSAVE there, yet its guests run at CPL3 with the host's XCR0
    /// (AVX, AVX-512...) and KVM_GET_XSAVE returns those components.
    pub supported_xcr0: u64,
}

impl CpuFeatures {
    /// Reads the features from CPUID leaves; `leaf(function, index)` gives eax, ebx, ecx, edx,
    /// or None for a leaf the CPUID table does not have.
    pub fn from_cpuid(leaf: impl Fn(u32, u32) -> Option<[u32; 4]>) -> CpuFeatures {
        let xsave = leaf(1, 0).is_some_and(|[_, _, ecx, _]| ecx & (1 << 26) != 0);
        let fsgsbase = leaf(7, 0).is_some_and(|[_, ebx, _, _]| ebx & 1 != 0);
        let supported_xcr0 =
            leaf(0xD, 0).map_or(0, |[eax, _, _, edx]| u64::from(edx) << 32 | u64::from(eax));
        CpuFeatures {
            xsave,
            fsgsbase,
            supported_xcr0,
        }
    }

    /// PAE for long mode, FXSR/SSE exceptions, OSXSAVE (so programs see AVX as usable) and
    /// FSGSBASE when the CPU has them.
    pub fn cr4(&self) -> u64 {
        let mut cr4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
        if self.xsave {
            cr4 |= CR4_OSXSAVE;
        }
        if self.fsgsbase {
            cr4 |= CR4_FSGSBASE;
        }
        cr4
    }

    /// x87|SSE|AVX as far as supported (XCR0=7 on any AVX machine); None without XSAVE.
    /// AVX-512 and AMX state stay off: their state would grow every XSAVE area for little gain.
    pub fn xcr0(&self) -> Option<u64> {
        self.xsave
            .then_some(self.supported_xcr0 & (XCR0_X87 | XCR0_SSE | XCR0_AVX) | XCR0_X87)
    }

    /// The XSAVE components a snapshot's state is restored for: every one KVM can hold. Not
    /// just `xcr0()`: on PVM the guest's real XCR0 is the host's, whatever KVM_SET_XCRS says,
    /// so its AVX (and AVX-512) registers are live and must come back in a fork. A component
    /// the guest cannot enable was never dirtied, so restoring it is a no-op.
    pub fn restored_state(&self) -> u64 {
        self.supported_xcr0 | XCR0_X87 | XCR0_SSE
    }
}

/// Segment registers of the program at its first instruction (and after every `iretq`).
pub struct UserSegments {
    pub cs: Segment,
    /// SS, DS, ES, FS and GS: user data, DPL 3, so `iretq` to CPL3 never nulls them.
    pub data: Segment,
    pub tr: Segment,
}

pub fn user_segments() -> UserSegments {
    UserSegments {
        cs: Segment::from_gdt(USER_CS),
        data: Segment::from_gdt(USER_SS),
        tr: Segment::from_gdt(TSS_SELECTOR),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_register_values() {
        assert_eq!(CR0, 0x8001_0033);
        assert_eq!(EFER, 0xD01);
        assert_eq!(STAR, 0x0010_0008_0000_0000);
        assert_eq!(SFMASK, 0x4_4700);
        assert_eq!(USER_RFLAGS, 0x202);
        assert_eq!(
            SFMASK & USER_RFLAGS,
            RFLAGS_IF,
            "the stub runs with interrupts off"
        );
    }

    #[test]
    fn lstar_is_the_syscall_entry() {
        assert!(MSRS.contains(&(MSR_LSTAR, SYSCALL_ENTRY_ADDR)));
        assert!(MSRS.contains(&(MSR_STAR, STAR)));
        assert!(MSRS.contains(&(MSR_SFMASK, SFMASK)));
    }

    fn cpuid(xsave: bool, fsgsbase: bool, xcr0: u64) -> impl Fn(u32, u32) -> Option<[u32; 4]> {
        move |function, index| match (function, index) {
            (1, 0) => Some([0, 0, if xsave { 1 << 26 } else { 0 }, 0]),
            (7, 0) => Some([0, u32::from(fsgsbase), 0, 0]),
            (0xD, 0) => Some([xcr0 as u32, 0, 0, (xcr0 >> 32) as u32]),
            _ => None,
        }
    }

    #[test]
    fn avx_machine_gets_xcr0_7_and_osxsave() {
        let features = CpuFeatures::from_cpuid(cpuid(true, true, 0x2E7));
        assert_eq!(features.xcr0(), Some(7));
        assert_eq!(
            features.cr4(),
            CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT | CR4_OSXSAVE | CR4_FSGSBASE
        );
    }

    #[test]
    fn features_follow_cpuid() {
        let no_avx = CpuFeatures::from_cpuid(cpuid(true, false, 0x3));
        assert_eq!(no_avx.xcr0(), Some(3));
        assert_eq!(no_avx.cr4() & CR4_FSGSBASE, 0);
        let no_xsave = CpuFeatures::from_cpuid(cpuid(false, false, 0x7));
        assert_eq!(no_xsave.xcr0(), None);
        assert_eq!(no_xsave.cr4() & CR4_OSXSAVE, 0);
        // PVM: no XSAVE in leaf 1, but leaf 0xD lists what the guest really runs with.
        let pvm = CpuFeatures::from_cpuid(cpuid(false, false, 0xE7));
        assert_eq!((pvm.xcr0(), pvm.restored_state()), (None, 0xE7));
        assert_eq!(
            CpuFeatures::from_cpuid(cpuid(true, true, 0x7)).restored_state(),
            7
        );
        assert_eq!(
            CpuFeatures::from_cpuid(|_, _| None).restored_state(),
            XCR0_X87 | XCR0_SSE
        );
        assert_eq!(CpuFeatures::from_cpuid(|_, _| None), CpuFeatures::default());
    }

    #[test]
    fn user_segments_are_cpl3_long_mode() {
        let segments = user_segments();
        assert_eq!(
            (segments.cs.selector, segments.cs.dpl, segments.cs.long),
            (USER_CS, 3, true)
        );
        assert_eq!((segments.data.selector, segments.data.dpl), (USER_SS, 3));
        assert_eq!(segments.tr.selector, TSS_SELECTOR);
    }
}
