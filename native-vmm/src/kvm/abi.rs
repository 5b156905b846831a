//! The KVM userspace ABI this backend uses: ioctl numbers and `#[repr(C)]` mirrors of the
//! structs in <linux/kvm.h> and <asm/kvm.h> (x86-64). Sizes and offsets are checked in tests
//! against the values the C headers give.

use std::ffi::c_ulong;
use std::mem::size_of;

use crate::cpu::UserRegs;

const KVMIO: c_ulong = 0xAE;

// The _IOC encoding of <asm-generic/ioctl.h>: dir(2) | size(14) | type(8) | nr(8).
const IOC_NONE: c_ulong = 0;
const IOC_WRITE: c_ulong = 1;
const IOC_READ: c_ulong = 2;

const fn ioc(dir: c_ulong, nr: c_ulong, size: usize) -> c_ulong {
    dir << 30 | (size as c_ulong) << 16 | KVMIO << 8 | nr
}
const fn io(nr: c_ulong) -> c_ulong {
    ioc(IOC_NONE, nr, 0)
}
const fn ior<T>(nr: c_ulong) -> c_ulong {
    ioc(IOC_READ, nr, size_of::<T>())
}
const fn iow<T>(nr: c_ulong) -> c_ulong {
    ioc(IOC_WRITE, nr, size_of::<T>())
}
const fn iowr<T>(nr: c_ulong) -> c_ulong {
    ioc(IOC_READ | IOC_WRITE, nr, size_of::<T>())
}

// System ioctls (on /dev/kvm).
pub const KVM_GET_API_VERSION: c_ulong = io(0x00);
pub const KVM_CREATE_VM: c_ulong = io(0x01);
pub const KVM_CHECK_EXTENSION: c_ulong = io(0x03);
pub const KVM_GET_VCPU_MMAP_SIZE: c_ulong = io(0x04);
pub const KVM_GET_SUPPORTED_CPUID: c_ulong = iowr::<KvmCpuid2<0>>(0x05);
// VM ioctls.
pub const KVM_CREATE_VCPU: c_ulong = io(0x41);
pub const KVM_ENABLE_CAP: c_ulong = iow::<KvmEnableCap>(0xA3);
pub const KVM_SET_USER_MEMORY_REGION: c_ulong = iow::<KvmUserspaceMemoryRegion>(0x46);
pub const KVM_GET_DIRTY_LOG: c_ulong = iow::<KvmDirtyLog>(0x42);
// vCPU ioctls.
pub const KVM_RUN: c_ulong = io(0x80);
pub const KVM_GET_REGS: c_ulong = ior::<KvmRegs>(0x81);
pub const KVM_SET_REGS: c_ulong = iow::<KvmRegs>(0x82);
pub const KVM_GET_SREGS: c_ulong = ior::<KvmSregs>(0x83);
pub const KVM_SET_SREGS: c_ulong = iow::<KvmSregs>(0x84);
pub const KVM_SET_MSRS: c_ulong = iow::<KvmMsrs<0>>(0x89);
pub const KVM_SET_CPUID2: c_ulong = iow::<KvmCpuid2<0>>(0x90);
pub const KVM_SET_XCRS: c_ulong = iow::<KvmXcrs>(0xA7);
pub const KVM_GET_XSAVE: c_ulong = ior::<KvmXsave>(0xA4);
pub const KVM_SET_XSAVE: c_ulong = iow::<KvmXsave>(0xA5);
pub const KVM_SET_DEVICE_ATTR: c_ulong = iow::<KvmDeviceAttr>(0xE1);
pub const KVM_GET_DEVICE_ATTR: c_ulong = iow::<KvmDeviceAttr>(0xE2);
/// The vCPU attribute group of the TSC (Linux 5.16+) and its one attribute: the offset added
/// to the host's TSC to give the guest's.
pub const KVM_VCPU_TSC_CTRL: u32 = 0;
pub const KVM_VCPU_TSC_OFFSET: u64 = 0;

pub const KVM_API_VERSION: i32 = 12;
pub const KVM_CAP_IMMEDIATE_EXIT: c_ulong = 136;
/// The kvm_run page carries registers in and out of KVM_RUN (`kvm_valid_regs`/`kvm_dirty_regs`).
pub const KVM_CAP_SYNC_REGS: c_ulong = 74;
/// KVM_SYNC_X86_REGS: `struct kvm_regs` at the start of `kvm_run.s.regs`.
pub const KVM_SYNC_X86_REGS: u64 = 1;
/// An instruction KVM fails to emulate exits to userspace (KVM_EXIT_INTERNAL_ERROR) instead of
/// being answered with #UD in the guest (Linux 5.15+; what PVM does anyway).
pub const KVM_CAP_EXIT_ON_EMULATION_FAILURE: u32 = 204;

/// struct kvm_device_attr: `addr` points at the attribute's value (a u64 for the TSC offset).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct KvmDeviceAttr {
    pub flags: u32,
    pub group: u32,
    pub attr: u64,
    pub addr: u64,
}

/// struct kvm_enable_cap
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KvmEnableCap {
    pub cap: u32,
    pub flags: u32,
    pub args: [u64; 4],
    pub pad: [u8; 64],
}

impl KvmEnableCap {
    pub fn new(cap: u32, arg0: u64) -> KvmEnableCap {
        KvmEnableCap {
            cap,
            flags: 0,
            args: [arg0, 0, 0, 0],
            pad: [0; 64],
        }
    }
}

pub const KVM_EXIT_UNKNOWN: u32 = 0;
pub const KVM_EXIT_EXCEPTION: u32 = 1;
pub const KVM_EXIT_IO: u32 = 2;
pub const KVM_EXIT_DEBUG: u32 = 4;
pub const KVM_EXIT_HLT: u32 = 5;
pub const KVM_EXIT_MMIO: u32 = 6;
pub const KVM_EXIT_SHUTDOWN: u32 = 8;
pub const KVM_EXIT_FAIL_ENTRY: u32 = 9;
pub const KVM_EXIT_INTR: u32 = 10;
pub const KVM_EXIT_INTERNAL_ERROR: u32 = 17;
pub const KVM_EXIT_SYSTEM_EVENT: u32 = 24;

pub const KVM_EXIT_IO_OUT: u8 = 1;

/// The name of a KVM exit reason, for error messages.
pub fn exit_reason_name(reason: u32) -> &'static str {
    match reason {
        KVM_EXIT_UNKNOWN => "KVM_EXIT_UNKNOWN",
        KVM_EXIT_EXCEPTION => "KVM_EXIT_EXCEPTION",
        KVM_EXIT_IO => "KVM_EXIT_IO",
        KVM_EXIT_DEBUG => "KVM_EXIT_DEBUG",
        KVM_EXIT_HLT => "KVM_EXIT_HLT",
        KVM_EXIT_MMIO => "KVM_EXIT_MMIO",
        KVM_EXIT_SHUTDOWN => "KVM_EXIT_SHUTDOWN",
        KVM_EXIT_FAIL_ENTRY => "KVM_EXIT_FAIL_ENTRY",
        KVM_EXIT_INTR => "KVM_EXIT_INTR",
        KVM_EXIT_INTERNAL_ERROR => "KVM_EXIT_INTERNAL_ERROR",
        KVM_EXIT_SYSTEM_EVENT => "KVM_EXIT_SYSTEM_EVENT",
        _ => "an exit reason this VMM does not handle",
    }
}

/// struct kvm_regs: rax..r15 (in `UserRegs`, which has their layout), rip, rflags.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KvmRegs {
    pub gprs: UserRegs,
    pub rip: u64,
    pub rflags: u64,
}

/// struct kvm_segment
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KvmSegment {
    pub base: u64,
    pub limit: u32,
    pub selector: u16,
    pub type_: u8,
    pub present: u8,
    pub dpl: u8,
    pub db: u8,
    pub s: u8,
    pub l: u8,
    pub g: u8,
    pub avl: u8,
    pub unusable: u8,
    pub padding: u8,
}

/// struct kvm_dtable
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KvmDtable {
    pub base: u64,
    pub limit: u16,
    pub padding: [u16; 3],
}

/// struct kvm_sregs
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KvmSregs {
    pub cs: KvmSegment,
    pub ds: KvmSegment,
    pub es: KvmSegment,
    pub fs: KvmSegment,
    pub gs: KvmSegment,
    pub ss: KvmSegment,
    pub tr: KvmSegment,
    pub ldt: KvmSegment,
    pub gdt: KvmDtable,
    pub idt: KvmDtable,
    pub cr0: u64,
    pub cr2: u64,
    pub cr3: u64,
    pub cr4: u64,
    pub cr8: u64,
    pub efer: u64,
    pub apic_base: u64,
    pub interrupt_bitmap: [u64; 4],
}

/// struct kvm_msr_entry
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KvmMsrEntry {
    pub index: u32,
    pub reserved: u32,
    pub data: u64,
}

/// struct kvm_msrs with room for N entries (the kernel struct ends in a flexible array).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvmMsrs<const N: usize> {
    pub nmsrs: u32,
    pub pad: u32,
    pub entries: [KvmMsrEntry; N],
}

/// struct kvm_xcr
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KvmXcr {
    pub xcr: u32,
    pub reserved: u32,
    pub value: u64,
}

/// struct kvm_xcrs
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KvmXcrs {
    pub nr_xcrs: u32,
    pub flags: u32,
    pub xcrs: [KvmXcr; 16],
    pub padding: [u64; 16],
}

/// struct kvm_xsave: the vCPU's XSAVE area in the standard (non-compacted) layout. Its size
/// bounds the components (x87, SSE and AVX fit; this backend enables no more, see XCR0).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvmXsave {
    pub region: [u32; 1024],
}

impl KvmXsave {
    pub const BYTES: usize = 4096;

    pub fn zeroed() -> KvmXsave {
        KvmXsave { region: [0; 1024] }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        self.region.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// The area from bytes (longer input is cut at 4096 bytes, shorter is zero-padded).
    pub fn from_bytes(bytes: &[u8]) -> KvmXsave {
        let mut area = KvmXsave::zeroed();
        for (word, chunk) in area.region.iter_mut().zip(bytes.chunks(4)) {
            let mut b = [0u8; 4];
            b[..chunk.len()].copy_from_slice(chunk);
            *word = u32::from_le_bytes(b);
        }
        area
    }
}

/// struct kvm_cpuid_entry2
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KvmCpuidEntry2 {
    pub function: u32,
    pub index: u32,
    pub flags: u32,
    pub eax: u32,
    pub ebx: u32,
    pub ecx: u32,
    pub edx: u32,
    pub padding: [u32; 3],
}

/// struct kvm_cpuid2 with room for N entries.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvmCpuid2<const N: usize> {
    pub nent: u32,
    pub padding: u32,
    pub entries: [KvmCpuidEntry2; N],
}

/// KVM_MAX_CPUID_ENTRIES: the most entries KVM_GET_SUPPORTED_CPUID returns.
pub const MAX_CPUID_ENTRIES: usize = 256;

impl<const N: usize> KvmCpuid2<N> {
    pub fn with_capacity() -> Self {
        KvmCpuid2 {
            nent: N as u32,
            padding: 0,
            entries: [KvmCpuidEntry2::default(); N],
        }
    }

    /// The entries the kernel filled in.
    pub fn filled(&self) -> &[KvmCpuidEntry2] {
        &self.entries[..(self.nent as usize).min(N)]
    }

    /// eax, ebx, ecx, edx of leaf `function` (sub-leaf `index`).
    pub fn leaf(&self, function: u32, index: u32) -> Option<[u32; 4]> {
        self.filled()
            .iter()
            .find(|e| e.function == function && e.index == index)
            .map(|e| [e.eax, e.ebx, e.ecx, e.edx])
    }

    /// The table as a guest is shown it: no hypervisor leaves (0x4000_0000 up: KVM's
    /// signature and paravirtual features) and `brand` (at most 48 bytes) in place of the
    /// host's processor brand string (leaves 0x8000_0002 to 0x8000_0004).
    pub fn for_guest(&mut self, brand: &[u8]) {
        let mut text = [0u8; 48];
        let len = brand.len().min(47);
        text[..len].copy_from_slice(&brand[..len]);
        let filled = (self.nent as usize).min(N);
        let mut kept = 0;
        for i in 0..filled {
            let mut entry = self.entries[i];
            if (0x4000_0000..0x5000_0000).contains(&entry.function) {
                continue;
            }
            if let Some(part) = entry.function.checked_sub(0x8000_0002).filter(|&p| p < 3) {
                let words: Vec<u32> = text[part as usize * 16..][..16]
                    .chunks_exact(4)
                    .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
                    .collect();
                [entry.eax, entry.ebx, entry.ecx, entry.edx] =
                    [words[0], words[1], words[2], words[3]];
            }
            self.entries[kept] = entry;
            kept += 1;
        }
        self.nent = kept as u32;
    }
}

/// struct kvm_userspace_memory_region
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KvmUserspaceMemoryRegion {
    pub slot: u32,
    pub flags: u32,
    pub guest_phys_addr: u64,
    pub memory_size: u64,
    pub userspace_addr: u64,
}

/// `KvmUserspaceMemoryRegion::flags`: KVM records the pages the guest writes (KVM_GET_DIRTY_LOG).
pub const KVM_MEM_LOG_DIRTY_PAGES: u32 = 1;

/// struct kvm_dirty_log: a slot and where KVM puts its bitmap (a bit per page, in u64 words).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KvmDirtyLog {
    pub slot: u32,
    pub padding: u32,
    pub dirty_bitmap: u64,
}

/// The size of struct kvm_run's exit union.
pub const EXIT_DATA_SIZE: usize = 256;

/// struct kvm_run, the page shared with the kernel for each vCPU. The exit union is kept as
/// bytes and decoded by `IoExit` and friends; the sync-regs union is not used.
#[repr(C)]
pub struct KvmRun {
    pub request_interrupt_window: u8,
    pub immediate_exit: u8,
    pub padding1: [u8; 6],
    pub exit_reason: u32,
    pub ready_for_interrupt_injection: u8,
    pub if_flag: u8,
    pub flags: u16,
    pub cr8: u64,
    pub apic_base: u64,
    pub exit: [u8; EXIT_DATA_SIZE],
    pub kvm_valid_regs: u64,
    pub kvm_dirty_regs: u64,
    pub sync_regs: [u8; 2048],
}

fn u16_at(data: &[u8; EXIT_DATA_SIZE], at: usize) -> u16 {
    u16::from_le_bytes([data[at], data[at + 1]])
}

fn u32_at(data: &[u8; EXIT_DATA_SIZE], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&data[at..at + 4]);
    u32::from_le_bytes(b)
}

fn u64_at(data: &[u8; EXIT_DATA_SIZE], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&data[at..at + 8]);
    u64::from_le_bytes(b)
}

/// The `io` member of the exit union (KVM_EXIT_IO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoExit {
    pub direction: u8,
    pub size: u8,
    pub port: u16,
    pub count: u32,
    pub data_offset: u64,
}

impl IoExit {
    pub fn decode(data: &[u8; EXIT_DATA_SIZE]) -> IoExit {
        IoExit {
            direction: data[0],
            size: data[1],
            port: u16_at(data, 2),
            count: u32_at(data, 4),
            data_offset: u64_at(data, 8),
        }
    }
}

/// The `mmio` member of the exit union (KVM_EXIT_MMIO): phys_addr, data[8], len, is_write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmioExit {
    pub phys_addr: u64,
    pub len: u32,
    pub is_write: bool,
}

impl MmioExit {
    /// Where the access's bytes are (`data`) within the exit union.
    pub const DATA_OFFSET: usize = 8;
    pub const MAX_LEN: usize = 8;

    pub fn decode(data: &[u8; EXIT_DATA_SIZE]) -> MmioExit {
        MmioExit {
            phys_addr: u64_at(data, 0),
            len: u32_at(data, 16),
            is_write: data[20] != 0,
        }
    }
}

/// The `internal` member (KVM_EXIT_INTERNAL_ERROR): a suberror and up to 16 words of data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternalError {
    pub suberror: u32,
    pub data: Vec<u64>,
}

impl InternalError {
    pub fn decode(data: &[u8; EXIT_DATA_SIZE]) -> InternalError {
        let ndata = (u32_at(data, 4) as usize).min(16);
        InternalError {
            suberror: u32_at(data, 0),
            data: (0..ndata).map(|i| u64_at(data, 8 + 8 * i)).collect(),
        }
    }

    pub fn suberror_name(&self) -> &'static str {
        match self.suberror {
            1 => "instruction emulation failed",
            2 => "simultaneous exceptions",
            3 => "delivery event via an exit",
            4 => "unexpected exit reason",
            _ => "unknown suberror",
        }
    }
}

/// The `fail_entry` member (KVM_EXIT_FAIL_ENTRY).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailEntry {
    pub hardware_entry_failure_reason: u64,
    pub cpu: u32,
}

impl FailEntry {
    pub fn decode(data: &[u8; EXIT_DATA_SIZE]) -> FailEntry {
        FailEntry {
            hardware_entry_failure_reason: u64_at(data, 0),
            cpu: u32_at(data, 8),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn ioctl_numbers_match_linux_kvm_h() {
        // Values of the macros in /usr/include/linux/kvm.h (Linux 6.1 UAPI) on x86-64.
        assert_eq!(KVM_GET_API_VERSION, 0xAE00);
        assert_eq!(KVM_CREATE_VM, 0xAE01);
        assert_eq!(KVM_ENABLE_CAP, 0x4068_AEA3);
        assert_eq!(KVM_CHECK_EXTENSION, 0xAE03);
        assert_eq!(KVM_GET_VCPU_MMAP_SIZE, 0xAE04);
        assert_eq!(KVM_GET_SUPPORTED_CPUID, 0xC008_AE05);
        assert_eq!(KVM_CREATE_VCPU, 0xAE41);
        assert_eq!(KVM_SET_USER_MEMORY_REGION, 0x4020_AE46);
        assert_eq!(KVM_GET_DIRTY_LOG, 0x4010_AE42);
        assert_eq!(KVM_RUN, 0xAE80);
        assert_eq!(KVM_GET_REGS, 0x8090_AE81);
        assert_eq!(KVM_SET_REGS, 0x4090_AE82);
        assert_eq!(KVM_GET_SREGS, 0x8138_AE83);
        assert_eq!(KVM_SET_SREGS, 0x4138_AE84);
        assert_eq!(KVM_SET_MSRS, 0x4008_AE89);
        assert_eq!(KVM_SET_CPUID2, 0x4008_AE90);
        assert_eq!(KVM_SET_XCRS, 0x4188_AEA7);
        assert_eq!(KVM_GET_XSAVE, 0x9000_AEA4);
        assert_eq!(KVM_SET_XSAVE, 0x5000_AEA5);
        assert_eq!(
            (KVM_SET_DEVICE_ATTR, KVM_GET_DEVICE_ATTR),
            (0x4018_AEE1, 0x4018_AEE2)
        );
    }

    #[test]
    fn struct_sizes_match_the_kernel_abi() {
        assert_eq!(size_of::<KvmRegs>(), 144);
        assert_eq!(
            (
                offset_of!(KvmRegs, gprs) + offset_of!(UserRegs, rsp),
                offset_of!(KvmRegs, gprs) + offset_of!(UserRegs, r15)
            ),
            (0x30, 0x78)
        );
        assert_eq!(
            (offset_of!(KvmRegs, rip), offset_of!(KvmRegs, rflags)),
            (0x80, 0x88)
        );
        assert_eq!(size_of::<KvmSegment>(), 24);
        assert_eq!(size_of::<KvmDtable>(), 16);
        assert_eq!(size_of::<KvmEnableCap>(), 104);
        assert_eq!(size_of::<KvmDeviceAttr>(), 24);
        assert_eq!(size_of::<KvmSregs>(), 312);
        assert_eq!(offset_of!(KvmSregs, gdt), 0xC0);
        assert_eq!(offset_of!(KvmSregs, cr0), 0xE0);
        assert_eq!(offset_of!(KvmSregs, interrupt_bitmap), 0x118);
        assert_eq!(size_of::<KvmMsrEntry>(), 16);
        assert_eq!(size_of::<KvmMsrs<0>>(), 8);
        assert_eq!(size_of::<KvmMsrs<3>>(), 8 + 3 * 16);
        assert_eq!(size_of::<KvmXcr>(), 16);
        assert_eq!(size_of::<KvmXcrs>(), 392);
        assert_eq!(size_of::<KvmXsave>(), KvmXsave::BYTES);
        assert_eq!(size_of::<KvmCpuidEntry2>(), 40);
        assert_eq!(size_of::<KvmCpuid2<0>>(), 8);
        assert_eq!(offset_of!(KvmCpuid2<4>, entries), 8);
        assert_eq!(size_of::<KvmUserspaceMemoryRegion>(), 32);
    }

    #[test]
    fn kvm_run_layout_matches_the_kernel_abi() {
        assert_eq!(size_of::<KvmRun>(), 2352);
        assert_eq!(offset_of!(KvmRun, immediate_exit), 1);
        assert_eq!(offset_of!(KvmRun, exit_reason), 8);
        assert_eq!(offset_of!(KvmRun, exit), 0x20);
        assert_eq!(offset_of!(KvmRun, kvm_valid_regs), 0x120);
        assert_eq!(offset_of!(KvmRun, sync_regs), 0x130);
    }

    #[test]
    fn exit_union_members_decode_at_their_kernel_offsets() {
        // io: direction@0 size@1 port@2 count@4 data_offset@8 (offsets within the union).
        let mut data = [0u8; EXIT_DATA_SIZE];
        data[0] = KVM_EXIT_IO_OUT;
        data[1] = 1;
        data[2..4].copy_from_slice(&0xE1u16.to_le_bytes());
        data[4..8].copy_from_slice(&1u32.to_le_bytes());
        data[8..16].copy_from_slice(&0x1000u64.to_le_bytes());
        assert_eq!(
            IoExit::decode(&data),
            IoExit {
                direction: KVM_EXIT_IO_OUT,
                size: 1,
                port: 0xE1,
                count: 1,
                data_offset: 0x1000
            }
        );

        // internal: suberror@0 ndata@4 data@8; ndata is clamped to the 16 words there are.
        let mut data = [0u8; EXIT_DATA_SIZE];
        data[0..4].copy_from_slice(&1u32.to_le_bytes());
        data[4..8].copy_from_slice(&2u32.to_le_bytes());
        data[8..16].copy_from_slice(&0xAAu64.to_le_bytes());
        data[16..24].copy_from_slice(&0xBBu64.to_le_bytes());
        let internal = InternalError::decode(&data);
        assert_eq!(
            internal,
            InternalError {
                suberror: 1,
                data: vec![0xAA, 0xBB]
            }
        );
        assert_eq!(internal.suberror_name(), "instruction emulation failed");
        data[4..8].copy_from_slice(&1000u32.to_le_bytes());
        assert_eq!(InternalError::decode(&data).data.len(), 16);

        // fail_entry: hardware_entry_failure_reason@0 cpu@8.
        let mut data = [0u8; EXIT_DATA_SIZE];
        data[0..8].copy_from_slice(&0x21u64.to_le_bytes());
        data[8..12].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(
            FailEntry::decode(&data),
            FailEntry {
                hardware_entry_failure_reason: 0x21,
                cpu: 3
            }
        );
    }

    #[test]
    fn xsave_bytes_round_trip_and_are_cut_or_padded() {
        let bytes: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let area = KvmXsave::from_bytes(&bytes);
        assert_eq!(area.to_bytes(), bytes[..KvmXsave::BYTES]);
        assert_eq!(area.region[1], u32::from_le_bytes([4, 5, 6, 7]));
        let short = KvmXsave::from_bytes(&[1, 2, 3, 4, 5]);
        assert_eq!(
            (short.region[0], short.region[1], short.region[2]),
            (0x0403_0201, 5, 0)
        );
    }

    #[test]
    fn cpuid_lookup_uses_only_filled_entries() {
        let mut cpuid = KvmCpuid2::<4>::with_capacity();
        cpuid.entries[0] = KvmCpuidEntry2 {
            function: 7,
            index: 0,
            ebx: 1,
            ..Default::default()
        };
        cpuid.entries[1] = KvmCpuidEntry2 {
            function: 7,
            index: 1,
            ebx: 2,
            ..Default::default()
        };
        cpuid.entries[2] = KvmCpuidEntry2 {
            function: 0xD,
            index: 0,
            eax: 7,
            ..Default::default()
        };
        cpuid.nent = 2;
        assert_eq!(cpuid.leaf(7, 0), Some([0, 1, 0, 0]));
        assert_eq!(cpuid.leaf(7, 1), Some([0, 2, 0, 0]));
        assert_eq!(cpuid.leaf(0xD, 0), None, "entry 2 is beyond nent");
    }
}

#[cfg(test)]
mod cpuid_tests {
    use super::{KvmCpuid2, KvmCpuidEntry2};

    fn entry(function: u32, eax: u32) -> KvmCpuidEntry2 {
        KvmCpuidEntry2 {
            function,
            eax,
            ..KvmCpuidEntry2::default()
        }
    }

    #[test]
    fn a_guest_sees_no_hypervisor_leaves_and_not_the_hosts_brand() {
        let mut table = KvmCpuid2::<8>::with_capacity();
        let leaves = [
            entry(0, 0x1f),
            entry(0x4000_0000, 0x4000_0001),
            entry(0x4000_0001, 7),
            entry(0x8000_0002, 0x6c65_746e),
            entry(0x8000_0003, 1),
            entry(0x8000_0004, 2),
        ];
        table.entries[..leaves.len()].copy_from_slice(&leaves);
        table.nent = leaves.len() as u32;
        table.for_guest(b"Sandfork virtual CPU");
        let functions: Vec<u32> = table.filled().iter().map(|e| e.function).collect();
        assert_eq!(functions, [0, 0x8000_0002, 0x8000_0003, 0x8000_0004]);
        let brand: Vec<u8> = (0x8000_0002..=0x8000_0004)
            .flat_map(|f| table.leaf(f, 0).unwrap())
            .flat_map(u32::to_le_bytes)
            .collect();
        assert_eq!(&brand[..20], b"Sandfork virtual CPU");
        assert!(brand[20..].iter().all(|&b| b == 0));
        assert_eq!(table.leaf(0, 0), Some([0x1f, 0, 0, 0]));
    }
}
