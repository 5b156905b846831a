// Writes the system area `arch::install` produces for a 16 MiB guest, and the register values
// KvmCpu would give the vCPU as assembler constants (built by run.sh against this crate).
use sandfork_vmm::arch::stubs::{self, Insn};
use sandfork_vmm::arch::{self, cpu_state, cpu_state::CpuFeatures, descriptors};
use sandfork_vmm::memory::GuestMemory;

fn main() {
    let out = std::path::PathBuf::from(std::env::args().nth(1).expect("output directory"));
    let mem = GuestMemory::new(16 << 20).unwrap();
    arch::install(&mem).unwrap();
    std::fs::write(out.join("sysarea.bin"), mem.read_vec(arch::PML4_ADDR, arch::FIRST_PD_ADDR).unwrap()).unwrap();
    // The features QEMU's "max" CPU has (XSAVE with AVX, FSGSBASE).
    let features = CpuFeatures { xsave: true, fsgsbase: true, supported_xcr0: 7 };
    // Where a reported exception leaves the vCPU: halted, rip just after the tail's `hlt`.
    let through_hlt = stubs::exception_common().iter().take_while(|insn| **insn != Insn::Hlt).map(Insn::encoded_len).sum::<u64>() + Insn::Hlt.encoded_len();
    let msr = |index| cpu_state::MSRS.iter().find(|(i, _)| *i == index).unwrap().1;
    let consts = [
        ("CR0", cpu_state::CR0),
        ("CR3", cpu_state::CR3),
        ("CR4", features.cr4()),
        ("EFER_WRITABLE", cpu_state::EFER & !cpu_state::EFER_LMA),
        ("STAR_LO", msr(cpu_state::MSR_STAR) & 0xFFFF_FFFF),
        ("STAR_HI", msr(cpu_state::MSR_STAR) >> 32),
        ("LSTAR", msr(cpu_state::MSR_LSTAR)),
        ("SFMASK", msr(cpu_state::MSR_SFMASK)),
        ("XCR0", features.xcr0().unwrap()),
        ("GDT_ADDR", arch::GDT_ADDR),
        ("GDT_LIMIT", descriptors::GDT_LIMIT as u64),
        ("IDT_ADDR", arch::IDT_ADDR),
        ("IDT_LIMIT", descriptors::IDT_LIMIT as u64),
        ("TSS_SELECTOR", descriptors::TSS_SELECTOR as u64),
        ("USER_CS", descriptors::USER_CS as u64),
        ("USER_SS", descriptors::USER_SS as u64),
        ("USER_RFLAGS", cpu_state::USER_RFLAGS),
        ("EXCEPTION_HALTED_RIP", stubs::EXCEPTION_COMMON_ADDR + through_hlt),
    ];
    let text: String = consts.iter().map(|(name, value)| format!(".set {name}, {value:#x}\n")).collect();
    std::fs::write(out.join("consts.s"), text).unwrap();
}
