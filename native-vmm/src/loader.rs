//! Loading a program into guest memory the way Linux's `execve` would: PT_LOAD segments, the
//! dynamic loader (PT_INTERP), the vDSO (`vdso`, below user memory), and the SysV x86-64
//! initial stack (argc, argv, envp, auxv with AT_SYSINFO_EHDR).
//!
//! User memory after loading (guest-virtual == guest-physical):
//!
//! ```text
//! USER_BASE ............ main program (non-PIE at its p_vaddr, PIE at PIE_BASE)
//! brk_start ............ heap grows up from here          \
//!                                                          } the mmap/brk arena
//! mmap_high ............ mmap grows down from here         /
//!                        the interpreter (ld.so)
//! stack bottom ......... stack (STACK_SIZE, less for small memories)
//! mem_size ............. top of guest memory
//! ```
//!
//! Segment permissions are not enforced by the CPU: the page tables are built once as an identity
//! map of all user memory, readable, writable and executable at CPL3 (DESIGN.md: a present
//! entry changed from the host is not seen by the guest), so p_flags and later mprotect calls are
//! bookkeeping only, and PT_GNU_STACK has nothing to decide. Isolation is the VM boundary, not
//! page permissions inside it.

use std::fmt;
use std::io;

use crate::abi::{GUEST_GID, GUEST_UID};
use crate::elf::{Elf, ElfError, ElfKind, PHDR_SIZE};
use crate::fs::Image;
use crate::layout::{page_align_down, PAGE_SIZE, USER_BASE, VDSO_ADDR};
use crate::memory::{GuestMemory, OutOfBounds};
use crate::process::AddressSpace;
use crate::sys;

/// Where a position-independent main program (ET_DYN) is placed.
pub const PIE_BASE: u64 = 0x20_0000;
/// Stack reserved at the top of guest memory (Linux's default RLIMIT_STACK).
pub const STACK_SIZE: u64 = 8 << 20;

// Auxiliary vector tags (linux/auxvec.h).
const AT_NULL: u64 = 0;
const AT_PHDR: u64 = 3;
const AT_PHENT: u64 = 4;
const AT_PHNUM: u64 = 5;
const AT_PAGESZ: u64 = 6;
const AT_BASE: u64 = 7;
const AT_FLAGS: u64 = 8;
const AT_ENTRY: u64 = 9;
const AT_UID: u64 = 11;
const AT_EUID: u64 = 12;
const AT_GID: u64 = 13;
const AT_EGID: u64 = 14;
const AT_PLATFORM: u64 = 15;
const AT_HWCAP: u64 = 16;
const AT_CLKTCK: u64 = 17;
const AT_SECURE: u64 = 23;
const AT_RANDOM: u64 = 25;
const AT_EXECFN: u64 = 31;
const AT_SYSINFO_EHDR: u64 = 33;

/// Where the program starts and where its heap and mappings may go.
#[derive(Debug, Clone, Copy)]
pub struct LoadedProgram {
    /// First instruction: the interpreter's entry for a dynamic program, else the program's.
    pub entry: u64,
    /// Initial rsp, pointing at argc (16-byte aligned).
    pub stack_pointer: u64,
    /// Load base added to the main program's p_vaddr (0 for ET_EXEC).
    pub program_base: u64,
    /// Load base of the interpreter, if there is one.
    pub interpreter_base: Option<u64>,
    pub space: AddressSpace,
}

#[derive(Debug)]
pub enum LoadError {
    /// The program or its interpreter is not a regular file in the image.
    NotFound { path: String },
    /// The file is not a loadable x86-64 ELF.
    Elf { path: String, error: ElfError },
    /// The ELF is well-formed but cannot be loaded here (the message says why).
    Unloadable { path: String, reason: &'static str },
    /// The program, its interpreter and the stack do not fit in guest memory.
    DoesNotFit { path: String, mem_bytes: u64 },
    /// An argument or environment string contains a NUL byte.
    NulInArgument,
    /// argv + envp exceed the share of the stack reserved for them.
    ArgumentsTooLarge { bytes: u64, limit: u64 },
    /// The host could not provide AT_RANDOM bytes.
    Random(io::Error),
    /// A write fell outside guest memory (a loader bug: ranges are checked before writing).
    Memory(OutOfBounds),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::NotFound { path } => write!(f, "{path}: not found in the file image"),
            LoadError::Elf { path, error } => write!(f, "{path}: {error}"),
            LoadError::Unloadable { path, reason } => {
                write!(f, "{path}: cannot be loaded: {reason}")
            }
            LoadError::DoesNotFit { path, mem_bytes } => {
                write!(
                    f,
                    "{path}: does not fit in {} MiB of guest memory",
                    mem_bytes >> 20
                )
            }
            LoadError::NulInArgument => {
                write!(f, "an argument or environment string contains a NUL byte")
            }
            LoadError::ArgumentsTooLarge { bytes, limit } => {
                write!(
                    f,
                    "arguments and environment take {bytes} bytes; the limit is {limit}"
                )
            }
            LoadError::Random(e) => write!(f, "reading host randomness for AT_RANDOM: {e}"),
            LoadError::Memory(e) => write!(f, "loader wrote outside guest memory: {e}"),
        }
    }
}

impl std::error::Error for LoadError {}

impl From<OutOfBounds> for LoadError {
    fn from(e: OutOfBounds) -> LoadError {
        LoadError::Memory(e)
    }
}

/// Loads `path` from the image (and its interpreter, also from the image) and builds the
/// initial stack with `argv` (argv[0] included) and `envp` ("NAME=value" strings).
pub fn load_program(
    mem: &GuestMemory,
    image: &Image,
    path: &str,
    argv: &[String],
    envp: &[String],
) -> Result<LoadedProgram, LoadError> {
    let bytes = image.file_bytes(path).ok_or_else(|| LoadError::NotFound {
        path: path.to_owned(),
    })?;
    load_elf(mem, bytes, path, &|p| image.file_bytes(p), argv, envp)
}

/// The size of the stack for a guest of `mem_bytes`: 8 MiB, or an eighth of small memories.
pub fn stack_size(mem_bytes: u64) -> u64 {
    STACK_SIZE
        .min(page_align_down(mem_bytes / 8))
        .max(PAGE_SIZE)
}

/// Loads an executable given as bytes; `lookup` finds the interpreter's bytes by path. The
/// arguments and environment are bytes, as execve passes them (any encoding, no NUL).
pub fn load_elf<'a, S: AsRef<[u8]>>(
    mem: &GuestMemory,
    exe_bytes: &[u8],
    path: &str,
    lookup: &dyn Fn(&str) -> Option<&'a [u8]>,
    argv: &[S],
    envp: &[S],
) -> Result<LoadedProgram, LoadError> {
    let elf_err = |p: &str| {
        let p = p.to_owned();
        move |error| LoadError::Elf { path: p, error }
    };
    let exe = Elf::parse(exe_bytes).map_err(elf_err(path))?;
    let mem_size = mem.size();
    let stack_bottom = mem_size
        .checked_sub(stack_size(mem_size))
        .filter(|&b| b > USER_BASE)
        .ok_or_else(|| LoadError::DoesNotFit {
            path: path.to_owned(),
            mem_bytes: mem_size,
        })?;

    // Main program: ET_EXEC where it was linked, ET_DYN (PIE, static-PIE) at PIE_BASE.
    let program_base = match exe.kind {
        ElfKind::Executable => 0,
        ElfKind::SharedObject => {
            checked_align_up(PIE_BASE, max_align(&exe)).ok_or(LoadError::Unloadable {
                path: path.to_owned(),
                reason: "segment alignment too large",
            })?
        }
    };
    let (exe_low, exe_high) = exe.load_span();
    let exe_start = program_base.checked_add(exe_low);
    let exe_end = program_base
        .checked_add(exe_high)
        .and_then(|e| checked_align_up(e, PAGE_SIZE));
    let (Some(exe_start), Some(exe_end)) = (exe_start, exe_end) else {
        return Err(LoadError::Unloadable {
            path: path.to_owned(),
            reason: "segments outside the address space",
        });
    };
    if exe_start < USER_BASE {
        return Err(LoadError::Unloadable {
            path: path.to_owned(),
            reason: "segments below the start of user memory",
        });
    }
    if exe_end > stack_bottom {
        return Err(LoadError::DoesNotFit {
            path: path.to_owned(),
            mem_bytes: mem_size,
        });
    }

    // Interpreter: just below the stack, so the mmap arena is one contiguous range.
    let interp = match exe.interpreter().map_err(elf_err(path))? {
        None => None,
        Some(interp_path) => Some(place_interpreter(
            interp_path,
            lookup,
            stack_bottom,
            exe_end,
            mem_size,
        )?),
    };
    let mmap_high = interp.as_ref().map_or(stack_bottom, |i| i.lowest);

    let phdr = exe.phdr_vaddr().ok_or(LoadError::Unloadable {
        path: path.to_owned(),
        reason: "program headers are not inside a loaded segment",
    })?;
    let program_entry = program_base
        .checked_add(exe.entry)
        .ok_or(LoadError::Unloadable {
            path: path.to_owned(),
            reason: "entry point outside the address space",
        })?;
    if !(exe_start..exe_end).contains(&program_entry) {
        return Err(LoadError::Unloadable {
            path: path.to_owned(),
            reason: "entry point outside the loaded segments",
        });
    }
    let (entry, interpreter_base) = match &interp {
        Some(i) => (i.entry, Some(i.base)),
        None => (program_entry, None),
    };

    load_segments(mem, &exe, program_base)?;
    if let Some(i) = &interp {
        load_segments(mem, &i.elf, i.base)?;
    }
    crate::vdso::install(mem)?;

    let facts = StackFacts {
        phdr: program_base + phdr,
        phnum: u64::from(exe.phnum),
        base: interpreter_base.unwrap_or(0),
        entry: program_entry,
        execfn: path,
    };
    let stack_pointer = build_stack(mem, stack_bottom, argv, envp, &facts)?;
    let brk_start = exe_end;
    Ok(LoadedProgram {
        entry,
        stack_pointer,
        program_base,
        interpreter_base,
        space: AddressSpace {
            brk_start,
            mmap_low: brk_start,
            mmap_high,
        },
    })
}

/// An interpreter parsed and given a place below the stack.
struct PlacedInterpreter<'a> {
    elf: Elf<'a>,
    /// Added to its p_vaddr.
    base: u64,
    /// Its first page; the mmap arena ends here.
    lowest: u64,
    entry: u64,
}

/// Finds the interpreter in the image and places it as high as fits below `stack_bottom`.
fn place_interpreter<'a>(
    path: &str,
    lookup: &dyn Fn(&str) -> Option<&'a [u8]>,
    stack_bottom: u64,
    program_end: u64,
    mem_size: u64,
) -> Result<PlacedInterpreter<'a>, LoadError> {
    let unloadable = |reason| LoadError::Unloadable {
        path: path.to_owned(),
        reason,
    };
    let bytes = lookup(path).ok_or_else(|| LoadError::NotFound {
        path: path.to_owned(),
    })?;
    let elf = Elf::parse(bytes).map_err(|error| LoadError::Elf {
        path: path.to_owned(),
        error,
    })?;
    if elf.kind != ElfKind::SharedObject {
        return Err(unloadable("the interpreter is not position-independent"));
    }
    if elf
        .interpreter()
        .map_err(|error| LoadError::Elf {
            path: path.to_owned(),
            error,
        })?
        .is_some()
    {
        return Err(unloadable("the interpreter itself names an interpreter"));
    }
    let (low, high) = elf.load_span();
    if !(low..high).contains(&elf.entry) {
        return Err(unloadable("entry point outside the loaded segments"));
    }
    let align = max_align(&elf);
    let high_page = checked_align_up(high, PAGE_SIZE)
        .ok_or(unloadable("segments outside the address space"))?;
    let base = stack_bottom
        .checked_sub(high_page)
        .map(|b| b & !(align - 1));
    let lowest = base
        .and_then(|b| b.checked_add(page_align_down(low)))
        .filter(|&l| l >= program_end);
    let (Some(base), Some(lowest)) = (base, lowest) else {
        return Err(LoadError::DoesNotFit {
            path: path.to_owned(),
            mem_bytes: mem_size,
        });
    };
    Ok(PlacedInterpreter {
        entry: base + elf.entry,
        elf,
        base,
        lowest,
    })
}

fn checked_align_up(addr: u64, align: u64) -> Option<u64> {
    addr.checked_add(align - 1).map(|a| a & !(align - 1))
}

/// The largest PT_LOAD alignment, at least a page (segments are placed page-granular).
fn max_align(elf: &Elf) -> u64 {
    elf.load_segments()
        .map(|p| p.align)
        .filter(|a| a.is_power_of_two())
        .max()
        .unwrap_or(PAGE_SIZE)
        .max(PAGE_SIZE)
}

/// Copies each PT_LOAD's file bytes to base+p_vaddr and zeroes the rest of its memory (bss).
fn load_segments(mem: &GuestMemory, elf: &Elf, base: u64) -> Result<(), LoadError> {
    for seg in elf.load_segments() {
        // Offsets and sizes were validated by Elf::parse; the caller checked the address span.
        let file = &elf.bytes()[seg.offset as usize..(seg.offset + seg.filesz) as usize];
        let addr = base + seg.vaddr;
        mem.write(addr, file)?;
        mem.fill(addr + seg.filesz, seg.memsz - seg.filesz, 0)?;
    }
    Ok(())
}

/// Auxiliary-vector values that depend on what was loaded.
struct StackFacts<'a> {
    phdr: u64,
    phnum: u64,
    base: u64,
    entry: u64,
    execfn: &'a str,
}

/// Writes strings top-down, handing out their guest addresses.
struct StringArea<'m> {
    mem: &'m GuestMemory,
    cursor: u64,
    floor: u64,
}

impl StringArea<'_> {
    fn push(&mut self, bytes: &[u8], nul: bool) -> Result<u64, LoadError> {
        let len = bytes.len() as u64 + u64::from(nul);
        let addr = self
            .cursor
            .checked_sub(len)
            .filter(|&a| a >= self.floor)
            .ok_or(LoadError::ArgumentsTooLarge {
                bytes: len,
                limit: self.cursor.saturating_sub(self.floor),
            })?;
        self.mem.write(addr, bytes)?;
        if nul {
            self.mem.write(addr + bytes.len() as u64, &[0])?;
        }
        self.cursor = addr;
        Ok(addr)
    }
}

/// Builds the SysV x86-64 initial process stack below the top of memory; returns rsp.
///
/// From rsp upward: argc, argv[..], NULL, envp[..], NULL, auxv pairs, AT_NULL; above those the
/// 16 AT_RANDOM bytes and the strings.
fn build_stack<S: AsRef<[u8]>>(
    mem: &GuestMemory,
    stack_bottom: u64,
    argv: &[S],
    envp: &[S],
    facts: &StackFacts,
) -> Result<u64, LoadError> {
    if argv.iter().chain(envp).any(|s| s.as_ref().contains(&0))
        || facts.execfn.as_bytes().contains(&0)
    {
        return Err(LoadError::NulInArgument);
    }
    // Linux allows argv+envp a quarter of the stack limit; the rest is the program's.
    let stack_len = mem.size() - stack_bottom;
    let limit = stack_len / 4;
    let string_bytes: u64 = argv
        .iter()
        .chain(envp)
        .map(|s| s.as_ref().len() as u64 + 1)
        .sum::<u64>()
        + facts.execfn.len() as u64
        + 1;
    let vector_bytes = (argv.len() + envp.len() + 3) as u64 * 8;
    if string_bytes + vector_bytes > limit {
        return Err(LoadError::ArgumentsTooLarge {
            bytes: string_bytes + vector_bytes,
            limit,
        });
    }

    let mut random = [0u8; 16];
    sys::fill_random(&mut random).map_err(LoadError::Random)?;
    let mut area = StringArea {
        mem,
        cursor: mem.size() - 8,
        floor: mem.size() - limit,
    };
    let execfn = area.push(facts.execfn.as_bytes(), true)?;
    let mut env_ptrs = Vec::with_capacity(envp.len());
    for s in envp.iter().rev() {
        env_ptrs.push(area.push(s.as_ref(), true)?);
    }
    env_ptrs.reverse();
    let mut arg_ptrs = Vec::with_capacity(argv.len());
    for s in argv.iter().rev() {
        arg_ptrs.push(area.push(s.as_ref(), true)?);
    }
    arg_ptrs.reverse();
    let platform = area.push(b"x86_64", true)?;
    area.cursor &= !15;
    let random_addr = area.push(&random, false)?;

    let auxv: [(u64, u64); 19] = [
        (AT_SYSINFO_EHDR, VDSO_ADDR),
        (AT_PHDR, facts.phdr),
        (AT_PHENT, PHDR_SIZE as u64),
        (AT_PHNUM, facts.phnum),
        (AT_PAGESZ, PAGE_SIZE),
        (AT_BASE, facts.base),
        (AT_FLAGS, 0),
        (AT_ENTRY, facts.entry),
        (AT_UID, GUEST_UID),
        (AT_EUID, GUEST_UID),
        (AT_GID, GUEST_GID),
        (AT_EGID, GUEST_GID),
        (AT_SECURE, 0),
        (AT_RANDOM, random_addr),
        (AT_HWCAP, u64::from(std::arch::x86_64::__cpuid(1).edx)),
        (AT_CLKTCK, 100),
        (AT_PLATFORM, platform),
        (AT_EXECFN, execfn),
        (AT_NULL, 0),
    ];
    let mut words: Vec<u64> =
        Vec::with_capacity(3 + arg_ptrs.len() + env_ptrs.len() + auxv.len() * 2);
    words.push(arg_ptrs.len() as u64);
    words.extend(&arg_ptrs);
    words.push(0);
    words.extend(&env_ptrs);
    words.push(0);
    for (tag, value) in auxv {
        words.extend([tag, value]);
    }
    let vector_len = words.len() as u64 * 8;
    let rsp = area
        .cursor
        .checked_sub(vector_len)
        .map(|a| a & !15)
        .filter(|&a| a >= area.floor)
        .ok_or(LoadError::ArgumentsTooLarge {
            bytes: string_bytes + vector_len,
            limit,
        })?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    mem.write(rsp, &bytes)?;
    Ok(rsp)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::elf::{PF_R, PF_W, PF_X};
    use crate::layout::page_align_up;

    const MIB: u64 = 1 << 20;
    const PYTHON: &str = "/usr/bin/python3.11";
    const LD_SO_LINK: &str = "/lib64/ld-linux-x86-64.so.2";

    /// No arguments or environment.
    const NO_STRINGS: &[String] = &[];

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// A minimal x86-64 ELF: one RWX PT_LOAD at `vaddr` holding the headers and `code`, with
    /// `bss` extra zero bytes, entry at the code; PT_PHDR describes the header table.
    pub(crate) fn tiny_elf(
        e_type: u16,
        vaddr: u64,
        code: &[u8],
        bss: u64,
        interp: Option<&str>,
    ) -> Vec<u8> {
        let phnum: u16 = if interp.is_some() { 3 } else { 2 };
        let headers = 64 + u64::from(phnum) * 56;
        let interp_bytes = interp
            .map(|s| [s.as_bytes(), &[0]].concat())
            .unwrap_or_default();
        let code_off = headers + interp_bytes.len() as u64;
        let filesz = code_off + code.len() as u64;
        let mut b = Vec::new();
        b.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
        b.extend_from_slice(&e_type.to_le_bytes());
        b.extend_from_slice(&62u16.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&(vaddr + code_off).to_le_bytes()); // e_entry
        b.extend_from_slice(&64u64.to_le_bytes()); // e_phoff
        b.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
        b.extend_from_slice(&0u32.to_le_bytes()); // e_flags
        for v in [64u16, 56, phnum, 64, 0, 0] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let mut phdr =
            |p_type: u32, flags: u32, off: u64, va: u64, fsz: u64, msz: u64, align: u64| {
                b.extend_from_slice(&p_type.to_le_bytes());
                b.extend_from_slice(&flags.to_le_bytes());
                for v in [off, va, va, fsz, msz, align] {
                    b.extend_from_slice(&v.to_le_bytes());
                }
            };
        phdr(
            crate::elf::PT_PHDR,
            PF_R,
            64,
            vaddr + 64,
            u64::from(phnum) * 56,
            u64::from(phnum) * 56,
            8,
        );
        if interp.is_some() {
            phdr(
                crate::elf::PT_INTERP,
                PF_R,
                headers,
                vaddr + headers,
                interp_bytes.len() as u64,
                interp_bytes.len() as u64,
                1,
            );
        }
        phdr(
            crate::elf::PT_LOAD,
            PF_R | PF_W | PF_X,
            0,
            vaddr,
            filesz,
            filesz + bss,
            0x1000,
        );
        b.extend_from_slice(&interp_bytes);
        b.extend_from_slice(code);
        b
    }

    fn no_files(_: &str) -> Option<&'static [u8]> {
        None
    }

    /// The initial stack read back: argc, argv, envp, auxv as (tag, value) pairs.
    type InitialStack = (u64, Vec<String>, Vec<String>, Vec<(u64, u64)>);

    fn read_stack(mem: &GuestMemory, rsp: u64) -> InitialStack {
        let argc = mem.read_u64(rsp).unwrap();
        let mut at = rsp + 8;
        let read_strings = |at: &mut u64| {
            let mut out = Vec::new();
            loop {
                let p = mem.read_u64(*at).unwrap();
                *at += 8;
                if p == 0 {
                    return out;
                }
                out.push(String::from_utf8(mem.read_cstr(p, 4096).unwrap()).unwrap());
            }
        };
        let argv = read_strings(&mut at);
        let envp = read_strings(&mut at);
        let mut auxv = Vec::new();
        loop {
            let (tag, value) = (mem.read_u64(at).unwrap(), mem.read_u64(at + 8).unwrap());
            at += 16;
            auxv.push((tag, value));
            if tag == AT_NULL {
                break;
            }
        }
        (argc, argv, envp, auxv)
    }

    fn aux(auxv: &[(u64, u64)], tag: u64) -> u64 {
        auxv.iter()
            .find(|(t, _)| *t == tag)
            .unwrap_or_else(|| panic!("auxv lacks tag {tag}"))
            .1
    }

    #[test]
    fn static_executable_is_loaded_at_its_address_with_a_sysv_stack() {
        let mem = GuestMemory::new(32 * MIB).unwrap();
        let code = [0x90, 0x90, 0xf4];
        let exe = tiny_elf(2, 0x40_0000, &code, 0x3000, None);
        mem.fill(0x40_0000 + exe.len() as u64, 16, 0xaa).unwrap(); // must be zeroed as bss
        let argv = strings(&["prog", "arg one", ""]);
        let envp = strings(&["PATH=/usr/bin:/bin", "HOME=/tmp"]);
        let loaded = load_elf(&mem, &exe, "/usr/bin/prog", &no_files, &argv, &envp).unwrap();

        assert_eq!(mem.read_vec(0x40_0000, exe.len() as u64).unwrap(), exe);
        assert!(mem
            .read_vec(0x40_0000 + exe.len() as u64, 0x3000)
            .unwrap()
            .iter()
            .all(|&b| b == 0));
        let code_addr = 0x40_0000 + exe.len() as u64 - code.len() as u64;
        assert_eq!(loaded.entry, code_addr);
        assert_eq!(loaded.program_base, 0);
        assert_eq!(loaded.interpreter_base, None);
        assert_eq!(loaded.stack_pointer % 16, 0);
        assert_eq!(
            loaded.space.brk_start,
            page_align_up(0x40_0000 + exe.len() as u64 + 0x3000)
        );
        assert_eq!(loaded.space.mmap_low, loaded.space.brk_start);
        assert_eq!(loaded.space.mmap_high, 32 * MIB - stack_size(32 * MIB));

        let (argc, got_argv, got_envp, auxv) = read_stack(&mem, loaded.stack_pointer);
        assert_eq!(argc, 3);
        assert_eq!(got_argv, argv);
        assert_eq!(got_envp, envp);
        assert_eq!(aux(&auxv, AT_PHDR), 0x40_0040);
        assert_eq!(aux(&auxv, AT_PHENT), 56);
        assert_eq!(aux(&auxv, AT_PHNUM), 2);
        assert_eq!(aux(&auxv, AT_PAGESZ), 4096);
        assert_eq!(aux(&auxv, AT_BASE), 0);
        assert_eq!(aux(&auxv, AT_ENTRY), code_addr);
        assert_eq!(aux(&auxv, AT_SECURE), 0);
        assert_eq!(aux(&auxv, AT_CLKTCK), 100);
        assert_eq!(aux(&auxv, AT_UID), GUEST_UID);
        assert_eq!(
            aux(&auxv, AT_HWCAP),
            u64::from(std::arch::x86_64::__cpuid(1).edx)
        );
        assert_eq!(
            mem.read_cstr(aux(&auxv, AT_PLATFORM), 16).unwrap(),
            b"x86_64"
        );
        assert_eq!(
            mem.read_cstr(aux(&auxv, AT_EXECFN), 64).unwrap(),
            b"/usr/bin/prog"
        );
        let random = aux(&auxv, AT_RANDOM);
        assert!(random > loaded.stack_pointer && random + 16 <= 32 * MIB);
        assert_eq!(aux(&auxv, AT_SYSINFO_EHDR), VDSO_ADDR);
        assert_eq!(
            mem.read_vec(VDSO_ADDR, crate::vdso::IMAGE.len() as u64)
                .unwrap(),
            crate::vdso::IMAGE,
            "the vDSO is in place"
        );
        assert_eq!(auxv.last(), Some(&(AT_NULL, 0)));
    }

    #[test]
    fn at_random_is_fresh_per_load() {
        let exe = tiny_elf(2, 0x40_0000, &[0xf4], 0, None);
        let random_of = || {
            let mem = GuestMemory::new(16 * MIB).unwrap();
            let loaded = load_elf(&mem, &exe, "/p", &no_files, &strings(&["p"]), &[]).unwrap();
            let (_, _, _, auxv) = read_stack(&mem, loaded.stack_pointer);
            mem.read_vec(aux(&auxv, AT_RANDOM), 16).unwrap()
        };
        assert_ne!(random_of(), random_of());
    }

    #[test]
    fn static_pie_is_placed_at_the_pie_base() {
        let mem = GuestMemory::new(16 * MIB).unwrap();
        let exe = tiny_elf(3, 0, &[0xf4], 0, None);
        let loaded = load_elf(&mem, &exe, "/p", &no_files, &strings(&["p"]), &[]).unwrap();
        assert_eq!(loaded.program_base, PIE_BASE);
        assert_eq!(loaded.entry, PIE_BASE + exe.len() as u64 - 1);
        assert_eq!(mem.read_vec(PIE_BASE, 4).unwrap(), b"\x7fELF");
        let (_, _, _, auxv) = read_stack(&mem, loaded.stack_pointer);
        assert_eq!(aux(&auxv, AT_PHDR), PIE_BASE + 64);
        assert_eq!(aux(&auxv, AT_ENTRY), loaded.entry);
    }

    #[test]
    fn segments_outside_user_memory_are_rejected() {
        let mem = GuestMemory::new(16 * MIB).unwrap();
        let below = tiny_elf(2, 0x1000, &[0xf4], 0, None);
        assert!(matches!(
            load_elf(&mem, &below, "/p", &no_files, NO_STRINGS, NO_STRINGS),
            Err(LoadError::Unloadable { .. })
        ));
        let above = tiny_elf(2, 15 * MIB, &[0xf4], 0, None);
        assert!(matches!(
            load_elf(&mem, &above, "/p", &no_files, NO_STRINGS, NO_STRINGS),
            Err(LoadError::DoesNotFit { .. })
        ));
        let wrapping = tiny_elf(2, !0xfff, &[0xf4], 0, None);
        assert!(load_elf(&mem, &wrapping, "/p", &no_files, NO_STRINGS, NO_STRINGS).is_err());
    }

    #[test]
    fn bad_arguments_are_rejected() {
        let mem = GuestMemory::new(16 * MIB).unwrap();
        let exe = tiny_elf(2, 0x40_0000, &[0xf4], 0, None);
        let nul = strings(&["a\0b"]);
        assert!(matches!(
            load_elf(&mem, &exe, "/p", &no_files, &nul, &[]),
            Err(LoadError::NulInArgument)
        ));
        let huge = vec!["x".repeat(1 << 20)];
        assert!(matches!(
            load_elf(&mem, &exe, "/p", &no_files, &huge, &[]),
            Err(LoadError::ArgumentsTooLarge { .. })
        ));
    }

    #[test]
    fn missing_or_invalid_interpreter_is_an_error() {
        let mem = GuestMemory::new(16 * MIB).unwrap();
        let exe = tiny_elf(2, 0x40_0000, &[0xf4], 0, Some("/lib/ld.so"));
        match load_elf(&mem, &exe, "/p", &no_files, NO_STRINGS, NO_STRINGS) {
            Err(LoadError::NotFound { path }) => assert_eq!(path, "/lib/ld.so"),
            other => panic!("expected NotFound, got {other:?}"),
        }
        let fixed_address_interp = tiny_elf(2, 0x80_0000, &[0xf4], 0, None);
        let lookup = |_: &str| Some(&fixed_address_interp[..]);
        assert!(matches!(
            load_elf(&mem, &exe, "/p", &lookup, NO_STRINGS, NO_STRINGS),
            Err(LoadError::Unloadable { .. })
        ));
        let garbage = b"#!/bin/sh\n".to_vec();
        let lookup = |_: &str| Some(&garbage[..]);
        assert!(matches!(
            load_elf(&mem, &exe, "/p", &lookup, NO_STRINGS, NO_STRINGS),
            Err(LoadError::Elf { .. })
        ));
    }

    #[test]
    fn python_loads_with_ld_so_below_the_stack() {
        let python = std::fs::read(PYTHON).unwrap();
        let ld_so = std::fs::read(LD_SO_LINK).unwrap();
        let lookup = |p: &str| (p == LD_SO_LINK).then_some(&ld_so[..]);
        let mem = GuestMemory::new(256 * MIB).unwrap();
        let argv = strings(&["python3", "-c", "pass"]);
        let loaded = load_elf(
            &mem,
            &python,
            "/usr/bin/python3",
            &lookup,
            &argv,
            &strings(&["LANG=C.UTF-8"]),
        )
        .unwrap();

        let py = Elf::parse(&python).unwrap();
        let ld = Elf::parse(&ld_so).unwrap();
        let base = loaded.interpreter_base.unwrap();
        assert_eq!(base % PAGE_SIZE, 0);
        assert_eq!(loaded.entry, base + ld.entry);
        assert_eq!(loaded.program_base, 0);
        let stack_bottom = 256 * MIB - STACK_SIZE;
        assert!(base + ld.load_span().1 <= stack_bottom);
        assert_eq!(loaded.space.mmap_high, base);
        assert_eq!(loaded.space.brk_start, page_align_up(py.load_span().1));
        assert!(loaded.space.mmap_low < loaded.space.mmap_high);

        // Every segment's file bytes are in place and its bss is zero.
        for seg in py.load_segments() {
            let want = &python[seg.offset as usize..(seg.offset + seg.filesz) as usize];
            assert_eq!(mem.read_vec(seg.vaddr, seg.filesz).unwrap(), want);
            let bss = mem
                .read_vec(seg.vaddr + seg.filesz, seg.memsz - seg.filesz)
                .unwrap();
            assert!(bss.iter().all(|&b| b == 0));
        }
        for seg in ld.load_segments() {
            let want = &ld_so[seg.offset as usize..(seg.offset + seg.filesz) as usize];
            assert_eq!(mem.read_vec(base + seg.vaddr, seg.filesz).unwrap(), want);
        }

        let (argc, got_argv, _, auxv) = read_stack(&mem, loaded.stack_pointer);
        assert_eq!(argc, 3);
        assert_eq!(got_argv, argv);
        assert_eq!(aux(&auxv, AT_BASE), base);
        assert_eq!(aux(&auxv, AT_ENTRY), py.entry);
        assert_eq!(aux(&auxv, AT_PHDR), 0x40_0040);
        assert_eq!(aux(&auxv, AT_PHNUM), u64::from(py.phnum));
        assert!(loaded.stack_pointer > stack_bottom && loaded.stack_pointer.is_multiple_of(16));
    }

    #[test]
    fn python_does_not_fit_in_a_tiny_memory() {
        let python = std::fs::read(PYTHON).unwrap();
        let mem = GuestMemory::new(8 * MIB).unwrap();
        let lookup = |_: &str| None;
        assert!(matches!(
            load_elf(&mem, &python, "/p", &lookup, NO_STRINGS, NO_STRINGS),
            Err(LoadError::DoesNotFit { .. })
        ));
    }
}
