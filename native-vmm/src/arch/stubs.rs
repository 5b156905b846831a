//! The stub code: the `syscall` entry (LSTAR) and one stub per exception vector, hand-assembled.
//!
//! The code does nothing but hand over to the VMM with an `out` (the vCPU stops; the VMM reads
//! and writes registers with KVM ioctls) and return to CPL3 with `iretq` (`sysretq` shuts the VM
//! down on the PVM backend). On PVM every CPL0 instruction goes through KVM's instruction
//! emulator, so the paths are as short as possible.
//!
//! Syscall entry. The CPU arrives still on the user stack, with rcx = user rip and r11 = user
//! rflags: at CPL0 on VT-x/SVM, but at guest CPL3 on the PVM backend (which is why the code
//! page and the syscall stack page are user pages and the TSS allows the `out` at CPL3). The
//! stub must not touch the user stack (the red zone below rsp may be in use, and rsp may be
//! garbage), so it writes the whole return frame straight into its slots at the top of the
//! syscall stack, points rsp at it, `out`s to SYSCALL_PORT and `iretq`s. CS and SS are written
//! afresh on every entry: the frame's page is user-writable, and on VT-x/SVM a program that
//! stored CS=0x08 there would otherwise have `iretq` return to its own code at CPL0.
//! Registers written: rsp only (restored by `iretq`), so everything the syscall ABI preserves
//! comes back unchanged; rcx and r11 still hold rip and rflags, as after a Linux `sysret`; the
//! VMM writes rax.
//!
//! Exceptions. Each vector's stub pushes a dummy error code if the CPU pushed none, pushes the
//! vector number and jumps to a common tail, which `out`s to EXCEPTION_PORT. The VMM reads the
//! frame (vector, error code, then what the CPU pushed: rip, cs, rflags, rsp, ss; see
//! `ExceptionFrame`) from the exception stack, so every general register but rsp still holds
//! the program's value: a signal handler's ucontext shows them. The vCPU never resumes in the
//! stub (a handler starts with the program's state loaded afresh); a `hlt` loop follows in
//! case it ever did.

use std::io;

use super::descriptors::{USER_CS, USER_SS};
use super::{
    too_small, CODE_ADDR, EXCEPTION_PORT, EXCEPTION_STACK_TOP, SYSCALL_PORT, SYSCALL_STACK_TOP,
};
use crate::memory::GuestMemory;

/// General registers the stubs name, with their x86 encoding numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reg {
    Rcx = 1,
    Rsp = 4,
    R11 = 11,
}

impl Reg {
    fn low_bits(self) -> u8 {
        self as u8 & 7
    }

    /// REX.W plus REX.R when the register is r8-r15 (it goes in the ModRM reg field).
    fn rex_w(self) -> u8 {
        0x48 | if self as u8 >= 8 { 0x04 } else { 0 }
    }
}

/// The few instructions the stubs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Insn {
    /// `mov qword [addr], src` with a 32-bit absolute address: REX.W 89 /r, SIB "disp32 only".
    StoreAbsolute { addr: u32, src: Reg },
    /// `mov qword [addr], imm32` (sign-extended), 32-bit absolute address: REX.W C7 /0, SIB.
    StoreImmediate { addr: u32, value: u32 },
    /// `mov rsp, imm32` (sign-extended): REX.W C7 /0.
    SetStackPointer(u32),
    /// `push imm8` (sign-extended to 64 bits): 6A ib.
    PushImm8(u8),
    /// `jmp rel32` to an absolute target: E9 cd.
    Jump { target: u64 },
    /// `jmp rel8`: EB cb.
    JumpShort(i8),
    /// `out imm8, al`: E6 ib. Touches no register.
    OutAl(u8),
    /// `hlt`: F4.
    Hlt,
    /// `iretq`: REX.W CF. Pops rip, cs, rflags, rsp, ss.
    Iretq,
}

impl Insn {
    /// The machine code of this instruction placed at address `at`.
    pub fn encode(&self, at: u64) -> Vec<u8> {
        match *self {
            Insn::StoreAbsolute { addr, src } => {
                let mut code = vec![src.rex_w(), 0x89, 0x04 | src.low_bits() << 3, 0x25];
                code.extend_from_slice(&addr.to_le_bytes());
                code
            }
            Insn::StoreImmediate { addr, value } => {
                let mut code = vec![0x48, 0xC7, 0x04, 0x25];
                code.extend_from_slice(&addr.to_le_bytes());
                code.extend_from_slice(&value.to_le_bytes());
                code
            }
            Insn::SetStackPointer(value) => {
                let mut code = vec![0x48, 0xC7, 0xC4];
                code.extend_from_slice(&value.to_le_bytes());
                code
            }
            Insn::PushImm8(value) => vec![0x6A, value],
            Insn::Jump { target } => {
                let rel = target.wrapping_sub(at + 5) as u32;
                let mut code = vec![0xE9];
                code.extend_from_slice(&rel.to_le_bytes());
                code
            }
            Insn::JumpShort(rel) => vec![0xEB, rel.cast_unsigned()],
            Insn::OutAl(port) => vec![0xE6, port],
            Insn::Hlt => vec![0xF4],
            Insn::Iretq => vec![0x48, 0xCF],
        }
    }

    pub fn encoded_len(&self) -> u64 {
        self.encode(0).len() as u64
    }
}

pub const SYSCALL_ENTRY_ADDR: u64 = CODE_ADDR;
pub const EXCEPTION_COMMON_ADDR: u64 = CODE_ADDR + 0x40;
const EXCEPTION_STUBS_ADDR: u64 = CODE_ADDR + 0x80;
const EXCEPTION_STUB_STRIDE: u64 = 16;
const VECTORS: u8 = 32;

/// The iretq frame the syscall entry returns through, at the top of the syscall stack:
/// rip, cs, rflags, rsp, ss (lowest address first).
pub const SYSCALL_FRAME: u64 = SYSCALL_STACK_TOP - 40;
pub const FRAME_RIP: u64 = SYSCALL_FRAME;
pub const FRAME_CS: u64 = SYSCALL_FRAME + 8;
pub const FRAME_RFLAGS: u64 = SYSCALL_FRAME + 16;
pub const FRAME_RSP: u64 = SYSCALL_FRAME + 24;
const FRAME_SS: u64 = SYSCALL_FRAME + 32;

pub fn exception_stub_addr(vector: u8) -> u64 {
    EXCEPTION_STUBS_ADDR + u64::from(vector) * EXCEPTION_STUB_STRIDE
}

/// Vectors for which the CPU pushes an error code (#DF, #TS, #NP, #SS, #GP, #PF, #AC, #CP,
/// #VC, #SX).
pub fn has_error_code(vector: u8) -> bool {
    matches!(vector, 8 | 10..=14 | 17 | 21 | 29 | 30)
}

/// Where the exception tail's `out` finds the stack: the frame's seven words below its top.
pub const EXCEPTION_FRAME: u64 = EXCEPTION_STACK_TOP - 7 * 8;

/// `mov [addr], src` for a system-area address (always below 2 GiB, so a disp32 reaches it).
fn store(addr: u64, src: Reg) -> Insn {
    Insn::StoreAbsolute {
        addr: addr as u32,
        src,
    }
}

/// The LSTAR target.
pub fn syscall_entry() -> Vec<Insn> {
    vec![
        Insn::StoreImmediate {
            addr: FRAME_CS as u32,
            value: u32::from(USER_CS),
        }, // mov [frame.cs], USER_CS
        Insn::StoreImmediate {
            addr: FRAME_SS as u32,
            value: u32::from(USER_SS),
        }, // mov [frame.ss], USER_SS
        store(FRAME_RSP, Reg::Rsp), // mov [frame.rsp], rsp     user stack pointer
        store(FRAME_RFLAGS, Reg::R11), // mov [frame.rflags], r11  user rflags (saved by syscall)
        store(FRAME_RIP, Reg::Rcx), // mov [frame.rip], rcx     return address (saved by syscall)
        Insn::SetStackPointer(SYSCALL_FRAME as u32), // mov rsp, frame
        Insn::OutAl(SYSCALL_PORT as u8), // out SYSCALL_PORT, al     the VMM answers, sets rax
        Insn::Iretq,                // iretq                    back to CPL3 after the syscall
    ]
}

/// The tail every exception stub jumps to, with [rsp] = vector, error code, rip, cs, ...
pub fn exception_common() -> Vec<Insn> {
    vec![
        Insn::OutAl(EXCEPTION_PORT as u8), // out EXCEPTION_PORT, al   the VMM reads [rsp]
        Insn::Hlt,                         // hlt                 never resumed
        Insn::JumpShort(-3),               // jmp hlt
    ]
}

/// The IDT target for `vector`.
pub fn exception_stub(vector: u8) -> Vec<Insn> {
    let mut stub = Vec::new();
    if !has_error_code(vector) {
        stub.push(Insn::PushImm8(0)); // push 0        dummy error code: one frame layout for all
    }
    stub.push(Insn::PushImm8(vector)); // push vector
    stub.push(Insn::Jump {
        target: EXCEPTION_COMMON_ADDR,
    }); // jmp exception_common
    stub
}

/// Every instruction of the CPL0 code with its address.
pub fn program() -> Vec<(u64, Insn)> {
    let mut placed = Vec::new();
    let mut place = |start: u64, insns: Vec<Insn>| {
        let mut at = start;
        for insn in insns {
            placed.push((at, insn));
            at += insn.encoded_len();
        }
    };
    place(SYSCALL_ENTRY_ADDR, syscall_entry());
    place(EXCEPTION_COMMON_ADDR, exception_common());
    for vector in 0..VECTORS {
        place(exception_stub_addr(vector), exception_stub(vector));
    }
    placed
}

/// The bytes of the code area starting at CODE_ADDR; gaps are `hlt`.
pub fn code_image() -> Vec<u8> {
    let mut image = vec![0xF4u8; (exception_stub_addr(VECTORS) - CODE_ADDR) as usize];
    for (at, insn) in program() {
        let code = insn.encode(at);
        let start = (at - CODE_ADDR) as usize;
        image[start..start + code.len()].copy_from_slice(&code);
    }
    image
}

pub fn write_code(mem: &GuestMemory) -> io::Result<()> {
    mem.write(CODE_ADDR, &code_image()).map_err(too_small)
}

/// What the exception tail hands to the VMM: the stub's two words and the CPU's frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExceptionFrame {
    pub vector: u64,
    pub error_code: u64,
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
}

impl ExceptionFrame {
    /// The frame as the stack holds it at the EXCEPTION_PORT `out`, from `EXCEPTION_FRAME` up.
    pub fn from_words(words: [u64; 7]) -> ExceptionFrame {
        let [vector, error_code, rip, cs, rflags, rsp, _ss] = words;
        ExceptionFrame {
            vector,
            error_code,
            rip,
            cs,
            rflags,
            rsp,
        }
    }

    /// The exception came from the CPL0 stubs themselves rather than from the program.
    pub fn in_supervisor_code(&self) -> bool {
        self.cs & 3 == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::descriptors::KERNEL_CS;
    use std::collections::HashMap;

    /// Bytes GNU as 2.40 produced for the same code (`as` + `objdump -d`, see the listing in
    /// each test), so the encoder is checked against an independent assembler.
    const SYSCALL_ENTRY_AS: [u8; 59] = [
        0x48, 0xc7, 0x04, 0x25, 0xe0, 0x8f, 0x00, 0x00, 0x23, 0x00, 0x00,
        0x00, // mov QWORD PTR ds:0x8fe0, 0x23
        0x48, 0xc7, 0x04, 0x25, 0xf8, 0x8f, 0x00, 0x00, 0x1b, 0x00, 0x00,
        0x00, // mov QWORD PTR ds:0x8ff8, 0x1b
        0x48, 0x89, 0x24, 0x25, 0xf0, 0x8f, 0x00, 0x00, // mov QWORD PTR ds:0x8ff0, rsp
        0x4c, 0x89, 0x1c, 0x25, 0xe8, 0x8f, 0x00, 0x00, // mov QWORD PTR ds:0x8fe8, r11
        0x48, 0x89, 0x0c, 0x25, 0xd8, 0x8f, 0x00, 0x00, // mov QWORD PTR ds:0x8fd8, rcx
        0x48, 0xc7, 0xc4, 0xd8, 0x8f, 0x00, 0x00, // mov rsp, 0x8fd8
        0xe6, 0xe0, // out 0xe0, al
        0x48, 0xcf, // iretq
    ];
    const EXCEPTION_COMMON_AS: [u8; 5] = [
        0xe6, 0xe1, // out 0xe1, al
        0xf4, // hlt
        0xeb, 0xfd, // jmp <hlt>
    ];
    /// Stub 0 at code offset 0x80 and stub 14 at 0x160, common tail at 0x40.
    const STUB_0_AS: [u8; 9] = [0x6a, 0x00, 0x6a, 0x00, 0xe9, 0xb7, 0xff, 0xff, 0xff];
    const STUB_14_AS: [u8; 7] = [0x6a, 0x0e, 0xe9, 0xd9, 0xfe, 0xff, 0xff];

    fn at(offset: u64, len: usize) -> Vec<u8> {
        code_image()[offset as usize..offset as usize + len].to_vec()
    }

    #[test]
    fn encodings_match_gnu_as() {
        assert_eq!(CODE_ADDR, 0x7000, "the reference bytes assume this layout");
        assert_eq!(SYSCALL_STACK_TOP, 0x9000);
        assert_eq!((SYSCALL_PORT, EXCEPTION_PORT), (0xE0, 0xE1));
        assert_eq!(at(0, SYSCALL_ENTRY_AS.len()), SYSCALL_ENTRY_AS);
        assert_eq!(at(0x40, EXCEPTION_COMMON_AS.len()), EXCEPTION_COMMON_AS);
        assert_eq!(at(0x80, STUB_0_AS.len()), STUB_0_AS);
        assert_eq!(at(0x80 + 14 * 16, STUB_14_AS.len()), STUB_14_AS);
    }

    #[test]
    fn error_code_vectors_are_the_architectural_ones() {
        let with_code: Vec<u8> = (0..VECTORS).filter(|&v| has_error_code(v)).collect();
        assert_eq!(with_code, [8, 10, 11, 12, 13, 14, 17, 21, 29, 30]);
    }

    #[test]
    fn code_fits_its_slots() {
        let end =
            |start: u64, insns: Vec<Insn>| start + insns.iter().map(Insn::encoded_len).sum::<u64>();
        assert!(end(SYSCALL_ENTRY_ADDR, syscall_entry()) <= EXCEPTION_COMMON_ADDR);
        assert!(end(EXCEPTION_COMMON_ADDR, exception_common()) <= EXCEPTION_STUBS_ADDR);
        for v in 0..VECTORS {
            assert!(
                end(exception_stub_addr(v), exception_stub(v))
                    <= exception_stub_addr(v) + EXCEPTION_STUB_STRIDE
            );
        }
        assert!(CODE_ADDR + code_image().len() as u64 <= SYSCALL_STACK_TOP - 0x1000);
    }

    /// A value in the symbolic machine below: a named unknown or a known constant.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Value {
        Unknown(&'static str),
        Known(u64),
    }

    /// A symbolic x86 machine for the stub instructions: registers start as named unknowns,
    /// memory reads fall back to a guest memory prepared by `install`.
    struct Machine {
        regs: HashMap<Reg, Value>,
        mem: HashMap<u64, Value>,
        image: GuestMemory,
        ports: Vec<u8>,
    }

    enum End {
        Iret {
            rip: Value,
            cs: Value,
            rflags: Value,
            rsp: Value,
            ss: Value,
        },
        Halted,
    }

    impl Machine {
        fn new() -> Machine {
            let image = GuestMemory::new(4 << 20).unwrap();
            super::super::install(&image).unwrap();
            let names = [(Reg::Rcx, "rcx"), (Reg::Rsp, "rsp"), (Reg::R11, "r11")];
            let regs = names
                .into_iter()
                .map(|(r, name)| (r, Value::Unknown(name)))
                .collect();
            Machine {
                regs,
                mem: HashMap::new(),
                image,
                ports: Vec::new(),
            }
        }

        fn load(&self, addr: u64) -> Value {
            self.mem
                .get(&addr)
                .copied()
                .unwrap_or_else(|| Value::Known(self.image.read_u64(addr).unwrap()))
        }

        fn known_rsp(&self) -> u64 {
            match self.regs[&Reg::Rsp] {
                Value::Known(v) => v,
                other => panic!("stack access through an unknown rsp {other:?}"),
            }
        }

        /// Runs the CPL0 code from `rip` until `iretq` or `hlt`, recording the ports written.
        fn run(&mut self, mut rip: u64) -> End {
            let program: HashMap<u64, Insn> = program().into_iter().collect();
            for _ in 0..100 {
                let insn = program
                    .get(&rip)
                    .copied()
                    .unwrap_or_else(|| panic!("no instruction at {rip:#x}"));
                rip += insn.encoded_len();
                match insn {
                    Insn::StoreAbsolute { addr, src } => {
                        self.mem.insert(u64::from(addr), self.regs[&src]);
                    }
                    Insn::StoreImmediate { addr, value } => {
                        self.mem.insert(
                            u64::from(addr),
                            Value::Known(i64::from(value.cast_signed()).cast_unsigned()),
                        );
                    }
                    Insn::SetStackPointer(value) => {
                        self.regs.insert(Reg::Rsp, Value::Known(u64::from(value)));
                    }
                    Insn::PushImm8(value) => {
                        let rsp = self.known_rsp() - 8;
                        self.mem.insert(
                            rsp,
                            Value::Known(i64::from(value.cast_signed()).cast_unsigned()),
                        );
                        self.regs.insert(Reg::Rsp, Value::Known(rsp));
                    }
                    Insn::Jump { target } => rip = target,
                    Insn::JumpShort(rel) => rip = rip.wrapping_add(i64::from(rel).cast_unsigned()),
                    Insn::OutAl(port) => self.ports.push(port),
                    Insn::Hlt => return End::Halted,
                    Insn::Iretq => {
                        let rsp = self.known_rsp();
                        return End::Iret {
                            rip: self.load(rsp),
                            cs: self.load(rsp + 8),
                            rflags: self.load(rsp + 16),
                            rsp: self.load(rsp + 24),
                            ss: self.load(rsp + 32),
                        };
                    }
                }
            }
            panic!("the stub did not finish in 100 instructions")
        }
    }

    #[test]
    fn syscall_entry_returns_to_the_caller_with_its_registers() {
        let mut machine = Machine::new();
        // A program may have written anything into the user-writable frame since the last
        // entry, a kernel CS (to return at CPL0) included.
        machine
            .mem
            .insert(FRAME_CS, Value::Known(u64::from(KERNEL_CS)));
        machine.mem.insert(FRAME_SS, Value::Known(0x10));
        let before = machine.regs.clone();
        let End::Iret {
            rip,
            cs,
            rflags,
            rsp,
            ss,
        } = machine.run(SYSCALL_ENTRY_ADDR)
        else {
            panic!("the syscall entry must end in iretq");
        };
        assert_eq!(machine.ports, vec![SYSCALL_PORT as u8]);
        assert_eq!(
            rip,
            Value::Unknown("rcx"),
            "returns after the syscall instruction"
        );
        assert_eq!(rflags, Value::Unknown("r11"), "restores the user's rflags");
        assert_eq!(
            rsp,
            Value::Unknown("rsp"),
            "restores the user's stack pointer"
        );
        assert_eq!(cs, Value::Known(u64::from(USER_CS)));
        assert_eq!(ss, Value::Known(u64::from(USER_SS)));
        for (reg, value) in &before {
            if *reg != Reg::Rsp {
                assert_eq!(machine.regs[reg], *value, "{reg:?} must be preserved");
            }
        }
        // Nothing was written outside the frame (in particular, not the user stack).
        for addr in machine.mem.keys() {
            assert!(
                (SYSCALL_FRAME..SYSCALL_STACK_TOP).contains(addr),
                "wrote {addr:#x}"
            );
        }
    }

    #[test]
    fn exception_stubs_leave_the_frame_and_the_registers_for_the_vmm() {
        for vector in 0..VECTORS {
            let mut machine = Machine::new();
            // What the CPU pushes on IST1: ss, rsp, rflags, cs, rip and maybe an error code.
            let mut frame = vec![0x2b, 0x7fff_0000, 0x202, u64::from(USER_CS), 0x40_1234];
            if has_error_code(vector) {
                frame.push(0x14);
            }
            let mut rsp = EXCEPTION_STACK_TOP;
            for word in frame {
                rsp -= 8;
                machine.mem.insert(rsp, Value::Known(word));
            }
            machine.regs.insert(Reg::Rsp, Value::Known(rsp));
            let before = machine.regs.clone();
            assert!(matches!(
                machine.run(exception_stub_addr(vector)),
                End::Halted
            ));
            assert_eq!(machine.ports, vec![EXCEPTION_PORT as u8], "vector {vector}");
            assert_eq!(machine.known_rsp(), EXCEPTION_FRAME, "vector {vector}");
            let words =
                std::array::from_fn(|i| match machine.load(EXCEPTION_FRAME + 8 * i as u64) {
                    Value::Known(v) => v,
                    Value::Unknown(name) => panic!("{name} on the stack"),
                });
            let frame = ExceptionFrame::from_words(words);
            let error_code = if has_error_code(vector) { 0x14 } else { 0 };
            assert_eq!(
                frame,
                ExceptionFrame {
                    vector: u64::from(vector),
                    error_code,
                    rip: 0x40_1234,
                    cs: u64::from(USER_CS),
                    rflags: 0x202,
                    rsp: 0x7fff_0000,
                }
            );
            assert!(!frame.in_supervisor_code());
            for (reg, value) in &before {
                if *reg != Reg::Rsp {
                    assert_eq!(machine.regs[reg], *value, "{reg:?} must be the program's");
                }
            }
        }
    }
}
