//! sandfork-vmm: a kernel-less KVM VMM. The guest runs one unmodified Linux x86-64 program at CPL3
//! on an identity map; every system call and CPU exception leaves the VM through a tiny CPL0 stub
//! and is answered here. The repository's README.md describes the modules.
//!
//! The KVM backend (`arch`, `kvm`) runs on PVM, VT-x and AMD-V; the program tests run on it (the
//! KVM test tier: natively, or inside a QEMU guest on machines without /dev/kvm). The ptrace
//! development CPU (`devcpu`) is kept for debugging the syscall layer without a VM.

// The guest is x86-64 and so is the host: the VMM casts between usize and u64 freely.
#[cfg(not(all(target_arch = "x86_64", target_pointer_width = "64")))]
compile_error!("sandfork-vmm runs x86-64 guests under KVM on an x86-64 Linux host");

// The guest ABI's shared constants, and guest memory as the guest's own pointers may reach it.
pub mod abi;
pub mod usermem;

// Host side: FFI and guest RAM (with kvm/run_page.rs, net/host.rs and devcpu/ptrace_sys.rs, the
// only `unsafe`).
pub mod layout;
pub mod memory;
pub mod sys;

// The run loop's view of a vCPU, and how a run ends.
pub mod codec;
pub mod cpu;
pub mod errno;
pub mod status;

// The guest's file system: the read-only image (built from a manifest) and the per-VM overlay.
pub mod fs;
pub mod image;

// Network egress: host sockets carried for the guest, the policy they are under, DNS messages.
pub mod net;

// The guest process as the syscall layer sees it (fds, memory map, output) and the syscall table.
pub mod process;
pub mod syscalls;

// Loading a program: the ELF reader, the loader (segments, initial stack, the vDSO it names)
// and the run loop.
pub mod elf;
pub mod loader;
pub mod sandbox;
pub mod sched;
pub mod vdso;
pub mod vm;
// The in-VM agent's request and its hand-off at the template's ready point.
pub mod agent;

// `sandfork-vmm bench`: guest launch latency, thread hand-offs and system calls against native.
#[cfg(feature = "bench")]
pub mod bench;
#[cfg(feature = "bench")]
pub mod net_bench;
#[cfg(feature = "bench")]
pub mod processes_bench;
#[cfg(feature = "bench")]
pub mod syscalls_bench;
#[cfg(feature = "bench")]
pub mod threads_bench;

// The test-only CPU: runs the guest natively in a ptrace'd child (no isolation; never used by
// the CLI or daemon) so that real programs run end to end on machines without /dev/kvm.
#[cfg(any(test, feature = "testing"))]
pub mod devcpu;

// The KVM backend: the machine state the guest needs (page tables, descriptor tables, CPL0
// stubs, register values) and the ioctl layer that runs it as a `GuestCpu`.
pub mod arch;
pub mod kvm;

// `sandfork-vmm serve`: the daemon protocol (PROTOCOL.md), its server and the executor boundary,
// and the seccomp filter it confines itself with.
pub mod daemon;
pub mod seccomp;

// Template snapshots (file format, load, verification) and restoring VMs from them.
pub mod snapshot;

// Test support: seeded corruption of valid inputs for the fuzz tests, and their seeds.
#[cfg(any(test, feature = "testing"))]
pub mod fuzz;
