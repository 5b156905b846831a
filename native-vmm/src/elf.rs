//! A strict ELF64 little-endian x86-64 reader over a byte slice.
//!
//! The bytes come from the file image, which holds whatever the template's manifest listed, so
//! they are treated as hostile: every offset and size is bounds-checked, arithmetic is checked,
//! and anything malformed is a typed error rather than a panic. Only what the loader and the
//! image builder need is read: the file header, the program headers, the interpreter path and
//! the dynamic section's library names and search paths.

use std::fmt;

pub const PT_LOAD: u32 = 1;
pub const PT_DYNAMIC: u32 = 2;
pub const PT_INTERP: u32 = 3;
pub const PT_PHDR: u32 = 6;

/// Segment permission bits (p_flags).
pub const PF_X: u32 = 1;
pub const PF_W: u32 = 2;
pub const PF_R: u32 = 4;

const ET_EXEC: u16 = 2;
const ET_DYN: u16 = 3;
const EM_X86_64: u16 = 62;
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const EV_CURRENT: u8 = 1;

const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_STRSZ: u64 = 10;
const DT_RPATH: u64 = 15;
const DT_RUNPATH: u64 = 29;

/// Size of the ELF64 file header and of one program header / dynamic entry.
pub const EHDR_SIZE: usize = 64;
pub const PHDR_SIZE: usize = 56;
const DYN_SIZE: usize = 16;

/// Why a byte slice is not an ELF file this VMM can load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElfError {
    /// The file ends before the structure named here.
    Truncated(&'static str),
    BadMagic,
    /// Not ELFCLASS64.
    NotElf64,
    /// Not ELFDATA2LSB.
    NotLittleEndian,
    UnsupportedVersion,
    /// e_machine is not x86-64.
    NotX86_64 {
        machine: u16,
    },
    /// Neither ET_EXEC nor ET_DYN (relocatable objects and core files are not programs).
    UnsupportedType {
        e_type: u16,
    },
    /// e_phentsize is not the ELF64 program header size.
    BadProgramHeaderSize {
        size: u16,
    },
    /// A field's value is impossible (the message names the field and why).
    Malformed(&'static str),
    /// A name in the file is not valid UTF-8.
    NotUtf8(&'static str),
}

impl fmt::Display for ElfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ElfError::Truncated(what) => {
                write!(f, "ELF file truncated: {what} lies outside the file")
            }
            ElfError::BadMagic => write!(f, "not an ELF file (bad magic)"),
            ElfError::NotElf64 => write!(f, "not a 64-bit ELF file"),
            ElfError::NotLittleEndian => write!(f, "not a little-endian ELF file"),
            ElfError::UnsupportedVersion => write!(f, "unsupported ELF version"),
            ElfError::NotX86_64 { machine } => write!(f, "ELF machine {machine} is not x86-64"),
            ElfError::UnsupportedType { e_type } => {
                write!(f, "ELF type {e_type} is not an executable or shared object")
            }
            ElfError::BadProgramHeaderSize { size } => {
                write!(f, "program header size {size} is not {PHDR_SIZE}")
            }
            ElfError::Malformed(what) => write!(f, "malformed ELF file: {what}"),
            ElfError::NotUtf8(what) => write!(f, "malformed ELF file: {what} is not UTF-8"),
        }
    }
}

impl std::error::Error for ElfError {}

/// Whether the program is linked at a fixed address or can be placed anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElfKind {
    /// ET_EXEC: segments must be loaded at their p_vaddr.
    Executable,
    /// ET_DYN: a PIE or shared object (ld.so itself); p_vaddr is relative to a chosen base.
    SharedObject,
}

/// One program header, as in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgramHeader {
    pub p_type: u32,
    /// PF_R / PF_W / PF_X.
    pub flags: u32,
    pub offset: u64,
    pub vaddr: u64,
    pub filesz: u64,
    pub memsz: u64,
    pub align: u64,
}

impl ProgramHeader {
    /// First guest address past the segment's memory image (before adding a load base).
    pub fn vaddr_end(&self) -> u64 {
        // Checked at parse time for every header, so this cannot overflow.
        self.vaddr + self.memsz
    }
}

/// Names from the dynamic section.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DynamicInfo {
    /// DT_NEEDED, in file order.
    pub needed: Vec<String>,
    /// DT_RUNPATH entries (split on ':'), in order.
    pub runpath: Vec<String>,
    /// DT_RPATH entries (split on ':'), in order; ld.so ignores them when DT_RUNPATH is present.
    pub rpath: Vec<String>,
}

/// A parsed ELF file borrowing its bytes.
#[derive(Debug, Clone)]
pub struct Elf<'a> {
    bytes: &'a [u8],
    pub kind: ElfKind,
    /// e_entry (before adding a load base for ET_DYN).
    pub entry: u64,
    /// e_phoff: file offset of the program header table.
    pub phoff: u64,
    pub phnum: u16,
    pub program_headers: Vec<ProgramHeader>,
}

fn range<'a>(
    bytes: &'a [u8],
    offset: u64,
    len: u64,
    what: &'static str,
) -> Result<&'a [u8], ElfError> {
    let end = offset.checked_add(len).ok_or(ElfError::Truncated(what))?;
    if end > bytes.len() as u64 {
        return Err(ElfError::Truncated(what));
    }
    Ok(&bytes[offset as usize..end as usize])
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(v)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(v)
}

impl<'a> Elf<'a> {
    /// Parses and validates the file header and program headers.
    pub fn parse(bytes: &'a [u8]) -> Result<Elf<'a>, ElfError> {
        if bytes.len() >= 4 && &bytes[..4] != b"\x7fELF" {
            return Err(ElfError::BadMagic);
        }
        let eh = range(bytes, 0, EHDR_SIZE as u64, "ELF header")?;
        if &eh[..4] != b"\x7fELF" {
            return Err(ElfError::BadMagic);
        }
        if eh[4] != ELFCLASS64 {
            return Err(ElfError::NotElf64);
        }
        if eh[5] != ELFDATA2LSB {
            return Err(ElfError::NotLittleEndian);
        }
        if eh[6] != EV_CURRENT || u32_at(eh, 20) != u32::from(EV_CURRENT) {
            return Err(ElfError::UnsupportedVersion);
        }
        let e_type = u16_at(eh, 16);
        let kind = match e_type {
            ET_EXEC => ElfKind::Executable,
            ET_DYN => ElfKind::SharedObject,
            _ => return Err(ElfError::UnsupportedType { e_type }),
        };
        let machine = u16_at(eh, 18);
        if machine != EM_X86_64 {
            return Err(ElfError::NotX86_64 { machine });
        }
        let entry = u64_at(eh, 24);
        let phoff = u64_at(eh, 32);
        let phentsize = u16_at(eh, 54);
        let phnum = u16_at(eh, 56);
        if phentsize as usize != PHDR_SIZE {
            return Err(ElfError::BadProgramHeaderSize { size: phentsize });
        }
        // PN_XNUM (0xffff) moves the real count into section 0; no program needs that many.
        if phnum == 0 || phnum == 0xffff {
            return Err(ElfError::Malformed("program header count is 0 or PN_XNUM"));
        }
        let table = range(
            bytes,
            phoff,
            u64::from(phnum) * PHDR_SIZE as u64,
            "program header table",
        )?;
        let program_headers: Vec<ProgramHeader> = table
            .chunks_exact(PHDR_SIZE)
            .map(parse_program_header)
            .collect();
        validate_program_headers(bytes, &program_headers)?;
        let elf = Elf {
            bytes,
            kind,
            entry,
            phoff,
            phnum,
            program_headers,
        };
        Ok(elf)
    }

    /// The file bytes this view was parsed from.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// PT_LOAD headers in ascending vaddr order (validated at parse time).
    pub fn load_segments(&self) -> impl Iterator<Item = &ProgramHeader> {
        self.program_headers.iter().filter(|p| p.p_type == PT_LOAD)
    }

    fn first_of(&self, p_type: u32) -> Option<&ProgramHeader> {
        self.program_headers.iter().find(|p| p.p_type == p_type)
    }

    /// [lowest vaddr, highest vaddr end) over all PT_LOAD segments (unrelocated).
    pub fn load_span(&self) -> (u64, u64) {
        let low = self.load_segments().map(|p| p.vaddr).min().unwrap_or(0);
        let high = self
            .load_segments()
            .map(|p| p.vaddr_end())
            .max()
            .unwrap_or(0);
        (low, high)
    }

    /// Where the program header table is in memory (unrelocated), for AT_PHDR: PT_PHDR if
    /// present, otherwise the PT_LOAD segment whose file bytes contain e_phoff.
    pub fn phdr_vaddr(&self) -> Option<u64> {
        if let Some(p) = self.first_of(PT_PHDR) {
            return Some(p.vaddr);
        }
        let table_len = u64::from(self.phnum) * PHDR_SIZE as u64;
        self.load_segments()
            .find(|p| p.offset <= self.phoff && self.phoff + table_len <= p.offset + p.filesz)
            .map(|p| p.vaddr + (self.phoff - p.offset))
    }

    /// The PT_INTERP path (the dynamic loader), if the program has one.
    pub fn interpreter(&self) -> Result<Option<&'a str>, ElfError> {
        let Some(p) = self.first_of(PT_INTERP) else {
            return Ok(None);
        };
        let raw = range(self.bytes, p.offset, p.filesz, "PT_INTERP")?;
        let nul = raw
            .iter()
            .position(|&b| b == 0)
            .ok_or(ElfError::Malformed("PT_INTERP is not NUL-terminated"))?;
        if nul == 0 {
            return Err(ElfError::Malformed("PT_INTERP is empty"));
        }
        std::str::from_utf8(&raw[..nul])
            .map(Some)
            .map_err(|_| ElfError::NotUtf8("PT_INTERP"))
    }

    /// Translates an unrelocated virtual address of `len` bytes to the file bytes behind it,
    /// through the PT_LOAD segment that maps it from the file.
    fn file_bytes_at(
        &self,
        vaddr: u64,
        len: u64,
        what: &'static str,
    ) -> Result<&'a [u8], ElfError> {
        let seg = self
            .load_segments()
            .find(|p| p.vaddr <= vaddr && vaddr - p.vaddr < p.filesz)
            .ok_or(ElfError::Malformed(
                "dynamic section address is not backed by a loaded file range",
            ))?;
        let within = vaddr - seg.vaddr;
        if len > seg.filesz - within {
            return Err(ElfError::Truncated(what));
        }
        range(self.bytes, seg.offset + within, len, what)
    }

    /// DT_NEEDED, DT_RUNPATH and DT_RPATH from PT_DYNAMIC; empty for a static program.
    pub fn dynamic_info(&self) -> Result<DynamicInfo, ElfError> {
        let Some(p) = self.first_of(PT_DYNAMIC) else {
            return Ok(DynamicInfo::default());
        };
        let table = range(self.bytes, p.offset, p.filesz, "PT_DYNAMIC")?;
        let mut strtab = None;
        let mut strsz = None;
        let mut needed_offsets = Vec::new();
        let mut runpath_offset = None;
        let mut rpath_offset = None;
        let mut terminated = false;
        for entry in table.chunks_exact(DYN_SIZE) {
            let (tag, val) = (u64_at(entry, 0), u64_at(entry, 8));
            match tag {
                DT_NULL => {
                    terminated = true;
                    break;
                }
                DT_NEEDED => needed_offsets.push(val),
                DT_STRTAB => strtab = Some(val),
                DT_STRSZ => strsz = Some(val),
                DT_RUNPATH => runpath_offset = Some(val),
                DT_RPATH => rpath_offset = Some(val),
                _ => {}
            }
        }
        if !terminated {
            return Err(ElfError::Malformed(
                "dynamic section has no DT_NULL terminator",
            ));
        }
        let has_names =
            !needed_offsets.is_empty() || runpath_offset.is_some() || rpath_offset.is_some();
        if !has_names {
            return Ok(DynamicInfo::default());
        }
        let (Some(strtab), Some(strsz)) = (strtab, strsz) else {
            return Err(ElfError::Malformed(
                "dynamic section names strings but has no DT_STRTAB/DT_STRSZ",
            ));
        };
        let strings = self.file_bytes_at(strtab, strsz, "dynamic string table")?;
        let name = |offset: u64, what: &'static str| -> Result<String, ElfError> {
            let tail = strings
                .get(offset as usize..)
                .filter(|_| offset < strsz)
                .ok_or(ElfError::Malformed(
                    "dynamic string offset is outside DT_STRSZ",
                ))?;
            let nul = tail
                .iter()
                .position(|&b| b == 0)
                .ok_or(ElfError::Malformed("dynamic string is not NUL-terminated"))?;
            std::str::from_utf8(&tail[..nul])
                .map(str::to_owned)
                .map_err(|_| ElfError::NotUtf8(what))
        };
        let split = |s: String| -> Vec<String> {
            s.split(':')
                .filter(|d| !d.is_empty())
                .map(str::to_owned)
                .collect()
        };
        let mut info = DynamicInfo::default();
        for off in needed_offsets {
            let lib = name(off, "DT_NEEDED name")?;
            if lib.is_empty() {
                return Err(ElfError::Malformed("empty DT_NEEDED name"));
            }
            info.needed.push(lib);
        }
        if let Some(off) = runpath_offset {
            info.runpath = split(name(off, "DT_RUNPATH")?);
        }
        if let Some(off) = rpath_offset {
            info.rpath = split(name(off, "DT_RPATH")?);
        }
        Ok(info)
    }
}

fn parse_program_header(b: &[u8]) -> ProgramHeader {
    ProgramHeader {
        p_type: u32_at(b, 0),
        flags: u32_at(b, 4),
        offset: u64_at(b, 8),
        vaddr: u64_at(b, 16),
        filesz: u64_at(b, 32),
        memsz: u64_at(b, 40),
        align: u64_at(b, 48),
    }
}

fn validate_program_headers(bytes: &[u8], headers: &[ProgramHeader]) -> Result<(), ElfError> {
    let mut previous_end: Option<u64> = None;
    let mut loads = 0;
    for p in headers {
        if p.vaddr.checked_add(p.memsz).is_none() {
            return Err(ElfError::Malformed("segment address range overflows"));
        }
        if p.p_type != PT_LOAD {
            continue;
        }
        loads += 1;
        if p.filesz > p.memsz {
            return Err(ElfError::Malformed(
                "PT_LOAD file size exceeds its memory size",
            ));
        }
        range(bytes, p.offset, p.filesz, "PT_LOAD file range")?;
        if p.align > 1 && !p.align.is_power_of_two() {
            return Err(ElfError::Malformed(
                "PT_LOAD alignment is not a power of two",
            ));
        }
        // The ELF spec requires PT_LOAD entries sorted by vaddr; overlapping ones would let one
        // segment's bytes silently overwrite another's.
        if let Some(end) = previous_end {
            if p.vaddr < end {
                return Err(ElfError::Malformed(
                    "PT_LOAD segments overlap or are not in ascending order",
                ));
            }
        }
        previous_end = Some(p.vaddr + p.memsz);
    }
    if loads == 0 {
        return Err(ElfError::Malformed("no PT_LOAD segment"));
    }
    Ok(())
}

/// The PT_INTERP path of an ELF file, or None for a static program.
pub fn interpreter(bytes: &[u8]) -> Result<Option<String>, ElfError> {
    Ok(Elf::parse(bytes)?.interpreter()?.map(str::to_owned))
}

/// DT_NEEDED plus the DT_RUNPATH / DT_RPATH search directories of an ELF file.
pub fn dynamic_info(bytes: &[u8]) -> Result<DynamicInfo, ElfError> {
    Elf::parse(bytes)?.dynamic_info()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PYTHON: &str = "/usr/bin/python3.11";
    const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
    const LD_SO: &str = "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2";

    fn host_file(path: &str) -> Vec<u8> {
        std::fs::read(path).unwrap_or_else(|e| panic!("test needs host file {path}: {e}"))
    }

    #[test]
    fn python_is_a_non_pie_dynamic_executable() {
        let bytes = host_file(PYTHON);
        let elf = Elf::parse(&bytes).unwrap();
        assert_eq!(elf.kind, ElfKind::Executable);
        assert_eq!(elf.load_span().0, 0x40_0000);
        assert!(elf.entry > 0x40_0000 && elf.entry < elf.load_span().1);
        assert_eq!(elf.phdr_vaddr(), Some(0x40_0040));
        assert_eq!(
            elf.interpreter().unwrap(),
            Some("/lib64/ld-linux-x86-64.so.2")
        );
        let needed = dynamic_info(&bytes).unwrap().needed;
        assert!(needed.iter().any(|n| n == "libc.so.6"), "{needed:?}");
        assert!(needed.iter().any(|n| n == "libm.so.6"), "{needed:?}");
        let loads: Vec<_> = elf.load_segments().collect();
        assert!(loads.len() >= 2);
        assert!(loads.iter().any(|p| p.flags & PF_X != 0));
        assert!(loads.iter().any(|p| p.memsz > p.filesz), "python has a bss");
    }

    #[test]
    fn libc_is_a_shared_object_needing_ld_so() {
        let bytes = host_file(LIBC);
        let elf = Elf::parse(&bytes).unwrap();
        assert_eq!(elf.kind, ElfKind::SharedObject);
        assert_eq!(elf.load_span().0, 0);
        let needed = dynamic_info(&bytes).unwrap().needed;
        assert_eq!(needed, vec!["ld-linux-x86-64.so.2".to_string()]);
    }

    #[test]
    fn ld_so_has_no_interpreter_and_no_needed_libraries() {
        let bytes = host_file(LD_SO);
        let elf = Elf::parse(&bytes).unwrap();
        assert_eq!(elf.kind, ElfKind::SharedObject);
        assert_eq!(interpreter(&bytes).unwrap(), None);
        assert!(dynamic_info(&bytes).unwrap().needed.is_empty());
        assert!(elf.phdr_vaddr().is_some());
    }

    #[test]
    fn every_truncation_of_a_header_area_is_an_error() {
        let bytes = host_file(PYTHON);
        // Every cut inside the ELF header or program header table must fail cleanly.
        for len in 0..(EHDR_SIZE + 13 * PHDR_SIZE) {
            assert!(
                Elf::parse(&bytes[..len]).is_err(),
                "prefix of {len} bytes parsed"
            );
        }
        // Cut in the middle of the file: segments point past the end.
        assert!(matches!(
            Elf::parse(&bytes[..bytes.len() / 2]),
            Err(ElfError::Truncated(_))
        ));
    }

    #[test]
    fn wrong_identity_fields_are_rejected() {
        let good = host_file(PYTHON);
        let mutate = |off: usize, val: u8| {
            let mut b = good[..].to_vec();
            b[off] = val;
            Elf::parse(&b).map(|_| ()).unwrap_err()
        };
        assert_eq!(mutate(0, b'X'), ElfError::BadMagic);
        assert_eq!(mutate(4, 1), ElfError::NotElf64);
        assert_eq!(mutate(5, 2), ElfError::NotLittleEndian);
        assert_eq!(mutate(6, 0), ElfError::UnsupportedVersion);
        assert_eq!(mutate(16, 1), ElfError::UnsupportedType { e_type: 1 });
        assert_eq!(mutate(18, 3), ElfError::NotX86_64 { machine: 3 });
        assert_eq!(mutate(54, 57), ElfError::BadProgramHeaderSize { size: 57 });
        assert!(Elf::parse(b"not an elf").is_err());
    }

    fn phdr_offset(bytes: &[u8], p_type: u32) -> usize {
        let elf = Elf::parse(bytes).unwrap();
        let index = elf
            .program_headers
            .iter()
            .position(|p| p.p_type == p_type)
            .unwrap();
        elf.phoff as usize + index * PHDR_SIZE
    }

    #[test]
    fn corrupted_program_headers_are_rejected() {
        let good = host_file(PYTHON);
        let load = phdr_offset(&good, PT_LOAD);

        let mut huge_offset = good.clone();
        huge_offset[load + 8..load + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            Elf::parse(&huge_offset),
            Err(ElfError::Truncated(_))
        ));

        let mut wrapping_vaddr = good.clone();
        wrapping_vaddr[load + 16..load + 24].copy_from_slice(&(u64::MAX - 10).to_le_bytes());
        assert!(matches!(
            Elf::parse(&wrapping_vaddr),
            Err(ElfError::Malformed(_))
        ));

        let mut filesz_over_memsz = good.clone();
        filesz_over_memsz[load + 40..load + 48].copy_from_slice(&0u64.to_le_bytes());
        assert!(matches!(
            Elf::parse(&filesz_over_memsz),
            Err(ElfError::Malformed(_))
        ));

        let mut huge_phnum = good.clone();
        huge_phnum[56..58].copy_from_slice(&0xfffeu16.to_le_bytes());
        assert!(matches!(
            Elf::parse(&huge_phnum[..100_000]),
            Err(ElfError::Truncated(_))
        ));

        // Moving the second PT_LOAD onto the first makes them overlap.
        let mut overlapping = good.clone();
        let second = load + PHDR_SIZE;
        overlapping[second + 16..second + 24].copy_from_slice(&0x40_0000u64.to_le_bytes());
        assert!(matches!(
            Elf::parse(&overlapping),
            Err(ElfError::Malformed(_))
        ));
    }

    #[test]
    fn corrupted_interpreter_and_dynamic_section_are_errors() {
        let good = host_file(PYTHON);
        let interp = phdr_offset(&good, PT_INTERP);
        let interp_off = Elf::parse(&good)
            .unwrap()
            .program_headers
            .iter()
            .find(|p| p.p_type == PT_INTERP)
            .unwrap()
            .offset as usize;

        let mut unterminated = good.clone();
        unterminated[interp + 32..interp + 40].copy_from_slice(&5u64.to_le_bytes());
        assert!(interpreter(&unterminated).is_err());

        let mut bad_utf8 = good.clone();
        bad_utf8[interp_off] = 0xff;
        assert_eq!(interpreter(&bad_utf8), Err(ElfError::NotUtf8("PT_INTERP")));

        let dynamic = phdr_offset(&good, PT_DYNAMIC);
        let mut dyn_outside = good.clone();
        dyn_outside[dynamic + 8..dynamic + 16]
            .copy_from_slice(&(good.len() as u64 - 8).to_le_bytes());
        assert!(dynamic_info(&dyn_outside).is_err());

        // Point DT_STRTAB (an address) at nothing that is loaded from the file.
        let elf = Elf::parse(&good).unwrap();
        let dyn_hdr = elf
            .program_headers
            .iter()
            .find(|p| p.p_type == PT_DYNAMIC)
            .unwrap();
        let mut no_strtab = good.clone();
        let table = dyn_hdr.offset as usize..(dyn_hdr.offset + dyn_hdr.filesz) as usize;
        for at in table.step_by(DYN_SIZE) {
            if u64_at(&good, at) == DT_STRTAB {
                no_strtab[at + 8..at + 16].copy_from_slice(&0x10u64.to_le_bytes());
            }
        }
        assert!(dynamic_info(&no_strtab).is_err());

        // A DT_NEEDED offset past DT_STRSZ.
        let mut needed_out_of_range = good.clone();
        for at in
            (dyn_hdr.offset as usize..(dyn_hdr.offset + dyn_hdr.filesz) as usize).step_by(DYN_SIZE)
        {
            if u64_at(&good, at) == DT_NEEDED {
                needed_out_of_range[at + 8..at + 16].copy_from_slice(&u64::MAX.to_le_bytes());
            }
        }
        assert!(dynamic_info(&needed_out_of_range).is_err());
    }

    #[test]
    fn random_corruption_never_panics() {
        let good = host_file(LD_SO);
        // A deterministic xorshift so the test is repeatable; hits header, phdrs and dynamic.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut b = good[..4096.min(good.len())].to_vec();
            for _ in 0..4 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let at = (state % b.len() as u64) as usize;
                b[at] = (state >> 32) as u8;
            }
            if let Ok(elf) = Elf::parse(&b) {
                let _ = elf.interpreter();
                let _ = elf.dynamic_info();
                let _ = elf.phdr_vaddr();
            }
        }
    }
}
