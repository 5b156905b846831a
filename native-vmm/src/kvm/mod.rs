//! The KVM backend: /dev/kvm, one VM (memory slots for the memory the program was handed, made
//! on first touch) and one vCPU in long mode at CPL3, implementing `GuestCpu` (`KvmCpu`); VMs
//! are made ahead on a thread of their own (`spare`) and destroyed on another (`reaper`).
//!
//! Run by the KVM test tier on every machine (natively on a /dev/kvm that can create a VM,
//! else inside a QEMU guest with nested SVM). Unit-tested without a VM: the ioctl numbers
//! (against <linux/kvm.h>), the sizes and field offsets of every `#[repr(C)]` struct and of
//! `struct kvm_run`, decoding of the exit union, the CPUID lookup, the run-page mapping, the
//! deadline watchdog, the mapping of exception registers to `GuestFault`, and the clear error
//! when /dev/kvm is missing.
//!
//! Written for any KVM (VT-x, SVM, PVM): no in-kernel irqchip, no PVM-specific calls (what PVM
//! needs is in the `arch` tables: see `arch::stubs`); the exit path is tuned for PVM's expensive exits and ioctls (every vCPU ioctl
//! loads the vCPU, reading host MSRs: the general registers pass through the run page, so a
//! system call costs no ioctl besides KVM_RUN).
//!
//! `unsafe` lives only in `run_page.rs` (the mmap'd kvm_run); ioctls go through `sys`.

pub mod abi;
pub mod capacity;
pub mod reaper;
mod run_page;
mod spare;
mod vcpu;
mod watchdog;

use std::fmt;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::OnceLock;

use crate::arch::cpu_state::CpuFeatures;
use crate::cpu::{CpuSnapshot, GuestCpu};
use crate::loader::LoadedProgram;
use crate::memory::GuestMemory;
use crate::sys;
use abi::{
    KvmCpuid2, KvmSregs, KVM_API_VERSION, KVM_CAP_EXIT_ON_EMULATION_FAILURE,
    KVM_CAP_IMMEDIATE_EXIT, KVM_CAP_SYNC_REGS, KVM_CHECK_EXTENSION, KVM_CREATE_VM,
    KVM_GET_API_VERSION, KVM_GET_DEVICE_ATTR, KVM_GET_SUPPORTED_CPUID, KVM_GET_VCPU_MMAP_SIZE,
    KVM_SET_DEVICE_ATTR, KVM_SYNC_X86_REGS, MAX_CPUID_ENTRIES,
};
pub use vcpu::{slot_ranges as reachable_memory, KvmCpu};

pub const KVM_DEVICE: &str = "/dev/kvm";

/// Why this host cannot run KVM guests.
#[derive(Debug)]
pub enum KvmUnavailable {
    /// /dev/kvm does not exist.
    Missing,
    /// /dev/kvm exists but has no driver behind it (ENODEV/ENXIO).
    NoDriver(io::Error),
    PermissionDenied,
    OpenFailed(io::Error),
    /// KVM_GET_API_VERSION failed or returned something other than 12.
    ApiVersion(io::Result<i32>),
    /// A capability this backend relies on is absent.
    MissingCapability(&'static str),
    /// A query every VM needs (vCPU mmap size, supported CPUID) failed.
    Query {
        ioctl: &'static str,
        error: io::Error,
    },
}

impl fmt::Display for KvmUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sandfork-vmm needs KVM: ")?;
        match self {
            KvmUnavailable::Missing => {
                write!(f, "{KVM_DEVICE} is missing (no kvm module loaded, or this host is itself a VM without nested virtualization)")
            }
            KvmUnavailable::NoDriver(e) => {
                write!(f, "{KVM_DEVICE} exists but no KVM driver answers ({e}): load kvm_intel, kvm_amd or kvm_pvm, or enable nested virtualization")
            }
            KvmUnavailable::PermissionDenied => write!(f, "no permission to open {KVM_DEVICE} (run as a member of the group that owns it, usually `kvm`)"),
            KvmUnavailable::OpenFailed(e) => write!(f, "cannot open {KVM_DEVICE}: {e}"),
            KvmUnavailable::ApiVersion(Ok(v)) => write!(f, "{KVM_DEVICE} speaks KVM API version {v}, not {KVM_API_VERSION}"),
            KvmUnavailable::ApiVersion(Err(e)) => write!(f, "KVM_GET_API_VERSION on {KVM_DEVICE} failed: {e}"),
            KvmUnavailable::MissingCapability(cap) => write!(f, "the host KVM lacks {cap}"),
            KvmUnavailable::Query { ioctl, error } => write!(f, "{ioctl} on {KVM_DEVICE} failed: {error}"),
        }
    }
}

impl std::error::Error for KvmUnavailable {}

impl From<KvmUnavailable> for io::Error {
    fn from(e: KvmUnavailable) -> io::Error {
        let kind = match e {
            KvmUnavailable::Missing | KvmUnavailable::NoDriver(_) => io::ErrorKind::NotFound,
            KvmUnavailable::PermissionDenied => io::ErrorKind::PermissionDenied,
            _ => io::ErrorKind::Unsupported,
        };
        io::Error::new(kind, e)
    }
}

/// Adds what was being done to an ioctl error.
fn context(what: &'static str) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// An open /dev/kvm whose API version and capabilities have been checked, with the answers
/// every VM needs (they do not change while the host runs).
pub struct Kvm {
    fd: OwnedFd,
    vcpu_mmap_size: usize,
    /// The CPUID table KVM can present to a guest on this host.
    supported_cpuid: Box<KvmCpuid2<MAX_CPUID_ENTRIES>>,
    /// What that table says about XSAVE and FSGSBASE (CR4 and XCR0 of every vCPU follow it).
    features: CpuFeatures,
    /// A new vCPU's segment and control registers (KVM_GET_SREGS), read from the first vCPU
    /// made: the same for every vCPU, so later ones skip the ioctl.
    reset_sregs: OnceLock<KvmSregs>,
    /// KVM_CAP_EXIT_ON_EMULATION_FAILURE is there (`KvmCpu` then makes memory slots on first
    /// touch).
    exit_on_emulation_failure: bool,
    /// KVM_CAP_SYNC_REGS covers the general registers (`KvmCpu` then passes them through the
    /// run page instead of KVM_GET_REGS/KVM_SET_REGS).
    sync_regs: bool,
    /// How a new vCPU's TSC becomes the host's (`align_tsc`), found on the first vCPU.
    tsc: OnceLock<TscAlignment>,
}

/// How a vCPU's TSC is made to read the host's (the guest's vDSO converts it with the VMM's
/// clock parameters, `vdso::clock`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TscAlignment {
    /// A new vCPU's TSC offset is 0 already (PVM: the guest's rdtsc is the host's).
    Already,
    /// A new vCPU's TSC starts near 0 (VT-x, SVM): its offset is set to 0 (KVM_VCPU_TSC_OFFSET).
    SetOffset,
    /// The offset cannot be read or set (Linux before 5.16): the guest's TSC is not the host's.
    Unavailable,
}

impl Kvm {
    pub fn open() -> Result<Kvm, KvmUnavailable> {
        // std opens with O_CLOEXEC.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(KVM_DEVICE)
            .map_err(classify_open_error)?;
        let fd: OwnedFd = file.into();
        match sys::ioctl_val(fd.as_raw_fd(), KVM_GET_API_VERSION, 0) {
            Ok(KVM_API_VERSION) => {}
            other => return Err(KvmUnavailable::ApiVersion(other)),
        }
        // The deadline watchdog relies on immediate_exit to close the race with KVM_RUN entry.
        if sys::ioctl_val(fd.as_raw_fd(), KVM_CHECK_EXTENSION, KVM_CAP_IMMEDIATE_EXIT).unwrap_or(0)
            <= 0
        {
            return Err(KvmUnavailable::MissingCapability(
                "KVM_CAP_IMMEDIATE_EXIT (Linux 4.11+)",
            ));
        }
        let query = |ioctl| move |error| KvmUnavailable::Query { ioctl, error };
        let vcpu_mmap_size = sys::ioctl_val(fd.as_raw_fd(), KVM_GET_VCPU_MMAP_SIZE, 0)
            .map_err(query("KVM_GET_VCPU_MMAP_SIZE"))?
            .cast_unsigned() as usize;
        let mut supported_cpuid = Box::new(KvmCpuid2::<MAX_CPUID_ENTRIES>::with_capacity());
        sys::ioctl_mut(
            fd.as_raw_fd(),
            KVM_GET_SUPPORTED_CPUID,
            supported_cpuid.as_mut(),
        )
        .map_err(query("KVM_GET_SUPPORTED_CPUID"))?;
        let features =
            CpuFeatures::from_cpuid(|function, index| supported_cpuid.leaf(function, index));
        // Where CPUID traps (VT-x, AMD-V) the guest sees neither KVM nor the host's model; on
        // PVM a CPL3 CPUID is the host's own, whatever this table says.
        supported_cpuid.for_guest(b"Sandfork virtual CPU");
        let exit_on_emulation_failure = sys::ioctl_val(
            fd.as_raw_fd(),
            KVM_CHECK_EXTENSION,
            KVM_CAP_EXIT_ON_EMULATION_FAILURE.into(),
        )
        .unwrap_or(0)
            > 0;
        let sync_regs = sys::ioctl_val(fd.as_raw_fd(), KVM_CHECK_EXTENSION, KVM_CAP_SYNC_REGS)
            .is_ok_and(|fields| u64::from(fields.cast_unsigned()) & KVM_SYNC_X86_REGS != 0);
        Ok(Kvm {
            fd,
            vcpu_mmap_size,
            supported_cpuid,
            features,
            reset_sregs: OnceLock::new(),
            exit_on_emulation_failure,
            sync_regs,
            tsc: OnceLock::new(),
        })
    }

    /// The process-wide /dev/kvm, opened and queried on first success, so that creating a VM
    /// costs no open or host queries.
    pub fn shared() -> Result<&'static Kvm, KvmUnavailable> {
        static SHARED: OnceLock<Kvm> = OnceLock::new();
        if let Some(kvm) = SHARED.get() {
            return Ok(kvm);
        }
        let kvm = Kvm::open()?;
        Ok(SHARED.get_or_init(|| kvm))
    }

    /// `Kvm::reset_sregs`, read with `read_new_vcpu` (KVM_GET_SREGS of a vCPU never run) the
    /// first time.
    fn reset_sregs(
        &self,
        read_new_vcpu: impl FnOnce() -> io::Result<KvmSregs>,
    ) -> io::Result<KvmSregs> {
        if let Some(sregs) = self.reset_sregs.get() {
            return Ok(*sregs);
        }
        let sregs = read_new_vcpu()?;
        Ok(*self.reset_sregs.get_or_init(|| sregs))
    }

    /// Makes the new vCPU `vcpu`'s TSC read the host's TSC; false if it cannot. The first vCPU
    /// tells which way this KVM needs (`TscAlignment`): on PVM no ioctl at all per vCPU.
    fn align_tsc(&self, vcpu: &OwnedFd) -> bool {
        let how = *self
            .tsc
            .get_or_init(|| match tsc_offset(vcpu, KVM_GET_DEVICE_ATTR, 0) {
                Ok(0) => TscAlignment::Already,
                Ok(_) => TscAlignment::SetOffset,
                Err(_) => TscAlignment::Unavailable,
            });
        match how {
            TscAlignment::Already => true,
            TscAlignment::SetOffset => tsc_offset(vcpu, KVM_SET_DEVICE_ATTR, 0).is_ok(),
            TscAlignment::Unavailable => false,
        }
    }

    fn create_vm(&self) -> io::Result<OwnedFd> {
        sys::ioctl_new_fd(self.fd.as_raw_fd(), KVM_CREATE_VM, 0).map_err(context("KVM_CREATE_VM"))
    }
}

/// The product's vCPU for a freshly loaded program (a `vm::CpuFactory`).
pub fn new_cpu<'m>(
    mem: &'m GuestMemory,
    loaded: &LoadedProgram,
) -> io::Result<Box<dyn GuestCpu + 'm>> {
    Ok(Box::new(KvmCpu::new(
        mem,
        loaded.entry,
        loaded.stack_pointer,
    )?))
}

/// The product's vCPU restored from a template snapshot (a `snapshot::RestoreFactory`; use it
/// with `ForkMemory::CopyOnWrite`).
pub fn restore_cpu<'m>(
    mem: &'m GuestMemory,
    snapshot: &CpuSnapshot,
) -> io::Result<Box<dyn GuestCpu + 'm>> {
    Ok(Box::new(KvmCpu::restore(mem, snapshot)?))
}

/// KVM_GET_DEVICE_ATTR (returns the vCPU's TSC offset) or KVM_SET_DEVICE_ATTR (sets it to
/// `value`) of the KVM_VCPU_TSC_OFFSET attribute.
fn tsc_offset(vcpu: &OwnedFd, request: std::ffi::c_ulong, value: u64) -> io::Result<u64> {
    let mut offset = value;
    let attr = abi::KvmDeviceAttr {
        flags: 0,
        group: abi::KVM_VCPU_TSC_CTRL,
        attr: abi::KVM_VCPU_TSC_OFFSET,
        addr: &mut offset as *mut u64 as u64,
    };
    sys::ioctl_ref(vcpu.as_raw_fd(), request, &attr)?;
    Ok(offset)
}

fn classify_open_error(e: io::Error) -> KvmUnavailable {
    const ENXIO: i32 = 6;
    const ENODEV: i32 = 19;
    match (e.kind(), e.raw_os_error()) {
        (io::ErrorKind::NotFound, _) => KvmUnavailable::Missing,
        (io::ErrorKind::PermissionDenied, _) => KvmUnavailable::PermissionDenied,
        (_, Some(ENXIO | ENODEV)) => KvmUnavailable::NoDriver(e),
        _ => KvmUnavailable::OpenFailed(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs everywhere: on a KVM host `open` succeeds; elsewhere (this CI machine) it must fail
    /// with the explanatory error, never a bare errno.
    #[test]
    fn open_succeeds_or_explains_why_kvm_is_unavailable() {
        match Kvm::open() {
            Ok(_) => assert!(std::path::Path::new(KVM_DEVICE).exists()),
            Err(e) => {
                let text = e.to_string();
                assert!(text.starts_with("sandfork-vmm needs KVM: "), "{text}");
                assert!(text.contains(KVM_DEVICE), "{text}");
                if !std::path::Path::new(KVM_DEVICE).exists() {
                    assert!(matches!(e, KvmUnavailable::Missing), "{e:?}");
                    assert!(text.contains("is missing"), "{text}");
                }
                let io_error: io::Error = e.into();
                assert!(
                    io_error
                        .get_ref()
                        .is_some_and(|inner| inner.is::<KvmUnavailable>()),
                    "the typed error survives"
                );
                assert_eq!(io_error.to_string(), text);
                // A failed open is not cached: the shared instance reports the same.
                assert_eq!(Kvm::shared().err().map(|e| e.to_string()), Some(text));
            }
        }
    }

    #[test]
    fn open_errors_are_classified() {
        let missing = classify_open_error(io::Error::from_raw_os_error(2));
        assert!(matches!(missing, KvmUnavailable::Missing));
        assert_eq!(io::Error::from(missing).kind(), io::ErrorKind::NotFound);
        assert!(matches!(
            classify_open_error(io::Error::from_raw_os_error(13)),
            KvmUnavailable::PermissionDenied
        ));
        let no_driver = classify_open_error(io::Error::from_raw_os_error(19));
        assert!(
            no_driver.to_string().contains("no KVM driver"),
            "{no_driver}"
        );
        assert!(matches!(
            classify_open_error(io::Error::from_raw_os_error(24)),
            KvmUnavailable::OpenFailed(_)
        ));
        assert!(KvmUnavailable::ApiVersion(Ok(11))
            .to_string()
            .contains("version 11"));
        let query = KvmUnavailable::Query {
            ioctl: "KVM_GET_SUPPORTED_CPUID",
            error: io::Error::from_raw_os_error(7),
        };
        assert!(
            query
                .to_string()
                .starts_with("sandfork-vmm needs KVM: KVM_GET_SUPPORTED_CPUID on /dev/kvm failed"),
            "{query}"
        );
    }
}
