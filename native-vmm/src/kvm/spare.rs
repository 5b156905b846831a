//! Blank VMs made ahead of need: creating a VM and its vCPU (KVM_CREATE_VM, KVM_CREATE_VCPU,
//! the run page, TSC offset and CPUID) costs more than a fork of a template's memory on PVM.
//! One thread per process keeps `STOCK` of them made while nothing waits; `take`
//! hands one out, or makes one on the spot when none is ready, and the thread makes the next.
//!
//! A blank VM has no memory slot, no register state and has never run, and nothing else holds
//! its fds: one from the stock is the same as one made on the spot. The thread stops at its
//! first failure (too many fds, no memory): `take` then makes each VM itself and reports why
//! it cannot.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

use super::abi::{
    KvmEnableCap, KVM_CAP_EXIT_ON_EMULATION_FAILURE, KVM_CREATE_VCPU, KVM_ENABLE_CAP,
    KVM_SET_CPUID2,
};
use super::run_page::RunPage;
use super::{context, Kvm};
use crate::sys;

/// How many blank VMs the thread keeps ready: a resume, a fork and a pool refill at once.
const STOCK: usize = 2;

/// A VM with one vCPU, set up as every VM of ours is before it gets memory or state.
pub struct Blank {
    pub vm: OwnedFd,
    pub vcpu: OwnedFd,
    pub run_page: RunPage,
    /// KVM_CAP_EXIT_ON_EMULATION_FAILURE is on (`KvmCpu::slots_on_touch`).
    pub slots_on_touch: bool,
    /// The vCPU's TSC reads the host's (`Kvm::align_tsc`): the vDSO clock page may be shown.
    pub tsc_aligned: bool,
}

fn make(kvm: &Kvm) -> io::Result<Blank> {
    let vm = kvm.create_vm()?;
    let slots_on_touch = kvm.exit_on_emulation_failure
        && sys::ioctl_ref(
            vm.as_raw_fd(),
            KVM_ENABLE_CAP,
            &KvmEnableCap::new(KVM_CAP_EXIT_ON_EMULATION_FAILURE, 1),
        )
        .is_ok();
    let vcpu = sys::ioctl_new_fd(vm.as_raw_fd(), KVM_CREATE_VCPU, 0)
        .map_err(context("KVM_CREATE_VCPU"))?;
    let run_page = RunPage::map(&vcpu, kvm.vcpu_mmap_size)?;
    let tsc_aligned = kvm.align_tsc(&vcpu);
    // CPUID before any state: KVM checks CR4 and XCR0 against the CPUID the guest was given.
    sys::ioctl_ref(
        vcpu.as_raw_fd(),
        KVM_SET_CPUID2,
        kvm.supported_cpuid.as_ref(),
    )
    .map_err(context("KVM_SET_CPUID2"))?;
    Ok(Blank {
        vm,
        vcpu,
        run_page,
        slots_on_touch,
        tsc_aligned,
    })
}

struct Stock {
    ready: Mutex<Vec<Blank>>,
    /// Signalled when one is taken.
    taken: Condvar,
}

impl Stock {
    fn ready(&self) -> MutexGuard<'_, Vec<Blank>> {
        // A list of whole VMs stays usable even if a holder panicked: each push or pop is one step.
        self.ready
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The thread's loop: refill up to `STOCK`, sleep until one is taken; end at a failure.
    fn keep_filled(&self, kvm: &Kvm) {
        loop {
            let mut ready = self.ready();
            while ready.len() >= STOCK {
                ready = self
                    .taken
                    .wait(ready)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            drop(ready);
            match make(kvm) {
                Ok(blank) => self.ready().push(blank),
                Err(_) => return,
            }
        }
    }
}

/// The stock, its thread started on first use; None if the thread could not be started.
fn stock(kvm: &'static Kvm) -> Option<&'static Stock> {
    static STOCK_OF_BLANKS: OnceLock<Option<Stock>> = OnceLock::new();
    STOCK_OF_BLANKS
        .get_or_init(|| {
            let spawned = std::thread::Builder::new()
                .name("kvm-vm-stock".into())
                .spawn(move || {
                    if let Some(stock) = stock(kvm) {
                        stock.keep_filled(kvm);
                    }
                });
            spawned.ok().map(|_| Stock {
                ready: Mutex::new(Vec::with_capacity(STOCK)),
                taken: Condvar::new(),
            })
        })
        .as_ref()
}

/// A blank VM: from the stock when one is ready, else made now.
pub fn take(kvm: &'static Kvm) -> io::Result<Blank> {
    if let Some(stock) = stock(kvm) {
        let blank = stock.ready().pop();
        if let Some(blank) = blank {
            stock.taken.notify_one();
            return Ok(blank);
        }
    }
    make(kvm)
}
