//! Encoding of the process state and the template file, without booting anything: a process
//! is given state through real system calls (`syscalls::dispatch`), encoded, decoded, and the
//! original and the decoded copy must then answer the same probing system calls identically.

use std::sync::Arc;

use sha2::Digest;

use super::checkpoint;
use super::file;
use super::sync_group::SyncGroup;
use super::TemplateError;
use crate::codec::{Decoder, Encoder};
use crate::cpu::{CpuSnapshot, UserRegs};
use crate::fs::Image;
use crate::image::testdir::TempDir;
use crate::memory::GuestMemory;
use crate::process::testing::{new_process, test_image, MEM, MIB};
use crate::process::GuestProcess;
use crate::syscalls::{dispatch, SyscallOutcome};

/// Argument strings and result buffers (below brk_start: never handed out by the map).
const SCRATCH: u64 = 0x20_0000;
const BUF: u64 = 0x30_0000;

const READ: u64 = 0;
const WRITE: u64 = 1;
const LSEEK: u64 = 8;
const MMAP: u64 = 9;
const BRK: u64 = 12;
const RT_SIGACTION: u64 = 13;
const DUP: u64 = 32;
const FCNTL: u64 = 72;
const GETCWD: u64 = 79;
const CHDIR: u64 = 80;
const UMASK: u64 = 95;
const OPENAT: u64 = 257;
const MKDIRAT: u64 = 258;
const UNLINKAT: u64 = 263;
const SYMLINKAT: u64 = 266;
const READLINKAT: u64 = 267;
const PIPE2: u64 = 293;
const AT_FDCWD: u64 = (-100i64).cast_unsigned();
const O_RDWR: u64 = 2;
const O_CREAT: u64 = 0o100;

fn call(proc: &mut GuestProcess, mem: &GuestMemory, nr: u64, args: [u64; 6]) -> u64 {
    match dispatch(proc, mem, nr, args) {
        SyscallOutcome::Return(v) => v,
        other => panic!("system call {nr}: {other:?}"),
    }
}

/// Writes NUL-terminated `path` at SCRATCH + `slot` * 256 and returns its address.
fn path(mem: &GuestMemory, slot: u64, path: &str) -> u64 {
    let addr = SCRATCH + slot * 256;
    mem.write(addr, path.as_bytes()).unwrap();
    mem.write(addr + path.len() as u64, &[0]).unwrap();
    addr
}

/// A process with overlay files and directories, a symlink, an open file at an offset, an
/// unlinked file still open, a pipe holding bytes, a dup, a changed cwd, a mapping, a heap,
/// a signal action and a umask.
fn busy_process(image: Arc<Image>, mem: &GuestMemory) -> GuestProcess {
    let mut p = new_process(image);
    assert_eq!(
        call(
            &mut p,
            mem,
            MKDIRAT,
            [AT_FDCWD, path(mem, 0, "/work/sub"), 0o755, 0, 0, 0]
        ),
        0
    );
    assert_eq!(
        call(
            &mut p,
            mem,
            CHDIR,
            [path(mem, 0, "/work/sub"), 0, 0, 0, 0, 0]
        ),
        0
    );
    let fd = call(
        &mut p,
        mem,
        OPENAT,
        [
            AT_FDCWD,
            path(mem, 0, "data.txt"),
            O_RDWR | O_CREAT,
            0o640,
            0,
            0,
        ],
    );
    mem.write(BUF, b"0123456789abcdef").unwrap();
    assert_eq!(call(&mut p, mem, WRITE, [fd, BUF, 16, 0, 0, 0]), 16);
    assert_eq!(call(&mut p, mem, LSEEK, [fd, 4, 0, 0, 0, 0]), 4);
    let doomed = call(
        &mut p,
        mem,
        OPENAT,
        [
            AT_FDCWD,
            path(mem, 0, "/tmp/doomed"),
            O_RDWR | O_CREAT,
            0o600,
            0,
            0,
        ],
    );
    assert_eq!(call(&mut p, mem, WRITE, [doomed, BUF, 10, 0, 0, 0]), 10);
    assert_eq!(
        call(
            &mut p,
            mem,
            UNLINKAT,
            [AT_FDCWD, path(mem, 0, "/tmp/doomed"), 0, 0, 0, 0]
        ),
        0
    );
    assert_eq!(
        call(
            &mut p,
            mem,
            SYMLINKAT,
            [
                path(mem, 0, "data.txt"),
                AT_FDCWD,
                path(mem, 1, "/work/sub/link"),
                0,
                0,
                0
            ]
        ),
        0
    );
    assert_eq!(call(&mut p, mem, PIPE2, [BUF + 0x100, 0, 0, 0, 0, 0]), 0);
    let read_end = u64::from(mem.read_u32(BUF + 0x100).unwrap());
    let write_end = u64::from(mem.read_u32(BUF + 0x104).unwrap());
    assert_eq!(call(&mut p, mem, WRITE, [write_end, BUF, 7, 0, 0, 0]), 7);
    assert!(call(&mut p, mem, DUP, [read_end, 0, 0, 0, 0, 0]) < 100);
    let brk = call(&mut p, mem, BRK, [0, 0, 0, 0, 0, 0]);
    assert_eq!(
        call(&mut p, mem, BRK, [brk + 3 * 4096, 0, 0, 0, 0, 0]),
        brk + 3 * 4096
    );
    assert!(call(&mut p, mem, MMAP, [0, 8192, 3, 0x22, u64::MAX, 0]) < MEM);
    mem.write(BUF + 0x200, &[0x11; 32]).unwrap();
    assert_eq!(
        call(&mut p, mem, RT_SIGACTION, [10, BUF + 0x200, 0, 8, 0, 0]),
        0
    );
    call(&mut p, mem, UMASK, [0o077, 0, 0, 0, 0, 0]);
    p
}

/// System calls whose answers depend on all of the state above: return values and the bytes
/// they wrote to BUF.
fn probe(p: &mut GuestProcess, mem: &GuestMemory) -> Vec<(u64, Vec<u8>)> {
    let calls: Vec<(u64, [u64; 6])> = vec![
        (READ, [3, BUF, 64, 0, 0, 0]),
        (READ, [4, BUF, 64, 0, 0, 0]),
        (LSEEK, [4, 0, 0, 0, 0, 0]),
        (READ, [4, BUF, 64, 0, 0, 0]),
        (READ, [5, BUF, 3, 0, 0, 0]),
        (READ, [7, BUF, 64, 0, 0, 0]),
        (READ, [0, BUF, 8, 0, 0, 0]),
        (FCNTL, [6, 3, 0, 0, 0, 0]),
        (GETCWD, [BUF, 256, 0, 0, 0, 0]),
        (READLINKAT, [AT_FDCWD, path(mem, 2, "link"), BUF, 64, 0, 0]),
        (OPENAT, [AT_FDCWD, path(mem, 2, "/tmp/doomed"), 0, 0, 0, 0]),
        (
            OPENAT,
            [AT_FDCWD, path(mem, 2, "/work/sub/data.txt"), 0, 0, 0, 0],
        ),
        (BRK, [0, 0, 0, 0, 0, 0]),
        (MMAP, [0, 4096, 3, 0x22, u64::MAX, 0]),
        (RT_SIGACTION, [10, 0, BUF, 8, 0, 0]),
        (UMASK, [0o022, 0, 0, 0, 0, 0]),
    ];
    calls
        .into_iter()
        .map(|(nr, args)| {
            mem.fill(BUF, 256, 0).unwrap();
            (call(p, mem, nr, args), mem.read_vec(BUF, 256).unwrap())
        })
        .collect()
}

fn encode(p: &GuestProcess) -> Vec<u8> {
    let mut e = Encoder::new();
    p.encode_state(&mut e).unwrap();
    e.into_bytes()
}

#[test]
fn a_decoded_process_answers_as_the_original_does() {
    let (image, _dir) = test_image();
    let mem = GuestMemory::new(MEM).unwrap();
    let original = busy_process(image.clone(), &mem);
    let bytes = encode(&original);
    let mut d = Decoder::new(&bytes);
    let mut decoded = GuestProcess::decode_state(&mut d, image, 4096).unwrap();
    d.finish("process").unwrap();
    assert_eq!(
        encode(&decoded),
        bytes,
        "decoding then encoding gives the same bytes"
    );
    assert_eq!(decoded.config.output_cap, 4096);
    assert_eq!(decoded.total_syscalls(), 0, "counters start afresh");

    let mut reference = original.clone();
    let (expected, got) = (probe(&mut reference, &mem), probe(&mut decoded, &mem));
    assert_eq!(got, expected);
    // The probes saw real state, not errors everywhere.
    assert_eq!(
        &expected[0].1[..12],
        b"456789abcdef",
        "the open file kept its offset"
    );
    assert_eq!(
        (expected[1].0, expected[2].0),
        (0, 0),
        "the unlinked file's offset is at its end"
    );
    assert_eq!(
        &expected[3].1[..10],
        b"0123456789",
        "the unlinked file is still open"
    );
    assert_eq!(
        (&expected[4].1[..3], &expected[5].1[..4]),
        (&b"012"[..], &b"3456"[..]),
        "the pipe kept its bytes, the dup shares it"
    );
    assert_eq!(&expected[8].1[..10], b"/work/sub\0");
}

#[test]
fn a_process_with_output_or_a_pending_request_is_no_ready_point() {
    let (image, _dir) = test_image();
    let mem = GuestMemory::new(MEM).unwrap();
    let mut p = new_process(image.clone());
    p.agent_request = Some(crate::agent::AgentRequest::new(""));
    assert_eq!(
        p.encode_state(&mut Encoder::new()),
        Err("a request is pending")
    );
    let mut p = new_process(image);
    mem.write(BUF, b"x").unwrap();
    call(&mut p, &mem, WRITE, [1, BUF, 1, 0, 0, 0]);
    assert_eq!(
        p.encode_state(&mut Encoder::new()),
        Err("the program has written output")
    );
}

/// Every truncation and many single-byte corruptions of the state are refused or decoded,
/// never a panic (the content hash stops damage first; this is the second line).
#[test]
fn damaged_state_never_panics_the_decoder() {
    let (image, _dir) = test_image();
    let mem = GuestMemory::new(MEM).unwrap();
    let bytes = encode(&busy_process(image.clone(), &mem));
    for len in 0..bytes.len() {
        let mut d = Decoder::new(&bytes[..len]);
        assert!(
            GuestProcess::decode_state(&mut d, image.clone(), 4096).is_err(),
            "a prefix of {len} bytes decoded"
        );
    }
    for (i, flip) in (0..bytes.len())
        .step_by(7)
        .zip([0x01u8, 0x80, 0xff].into_iter().cycle())
    {
        let mut damaged = bytes.clone();
        damaged[i] ^= flip;
        let _ = GuestProcess::decode_state(&mut Decoder::new(&damaged), image.clone(), 4096);
    }
}

/// A session checkpoint's process tree: a live child's parked part and a zombie decode back as
/// they were; no prefix of it decodes, and a changed byte never panics the decoder.
#[test]
fn a_process_tree_round_trips_and_damage_never_panics_its_decoder() {
    let (image, _dir) = test_image();
    let mut p = new_process(image.clone());
    let child = p.tree.add_child(p.pid, p.threads.next_id(), 17).unwrap();
    let part = p.fork_part(child);
    p.parked.insert(child, part);
    let zombie = p.tree.add_child(p.pid, 0, 17).unwrap();
    p.tree
        .ended(zombie, crate::process::tree::exited_status(7), p.pid);
    let mut state = Encoder::new();
    p.encode_session_state(&mut state).unwrap();
    let mut tree = Encoder::new();
    p.encode_tree(&mut tree, std::time::Instant::now()).unwrap();
    let (state, tree) = (state.into_bytes(), tree.into_bytes());
    let decode = |tree: &[u8]| {
        let mut q =
            GuestProcess::decode_state(&mut Decoder::new(&state), image.clone(), 4096).unwrap();
        let mut d = Decoder::new(tree);
        q.decode_tree(&mut d, std::time::Instant::now(), true)
            .and_then(|()| d.finish("the tree"))
            .map(|()| q)
    };
    let q = decode(&tree).unwrap();
    assert_eq!(q.parked.keys().copied().collect::<Vec<_>>(), vec![child]);
    assert_eq!(q.parked[&child].pid, child);
    assert_eq!(q.tree.get(child), p.tree.get(child));
    assert_eq!(q.tree.get(zombie).unwrap().exit, Some(7 << 8));
    for len in 0..tree.len() {
        assert!(decode(&tree[..len]).is_err(), "a prefix of {len} bytes");
    }
    for (i, flip) in (0..tree.len()).zip([0x01u8, 0x80, 0xff].into_iter().cycle()) {
        let mut damaged = tree.clone();
        damaged[i] ^= flip;
        let _ = decode(&damaged);
    }
}

#[test]
fn cpu_state_and_the_file_envelope_round_trip() {
    let regs = UserRegs {
        rax: 1,
        rbx: 2,
        rcx: 3,
        rdx: 4,
        rsi: 5,
        rdi: 6,
        rbp: 7,
        rsp: 8,
        r8: 9,
        r9: 10,
        r10: 11,
        r11: 12,
        r12: 13,
        r13: 14,
        r14: 15,
        r15: 16,
    };
    let cpu = CpuSnapshot {
        regs,
        rip: 0x40_1000,
        rflags: 0x246,
        fs_base: 0x7000,
        gs_base: 0,
        xsave: (0..832u32).map(|i| i as u8).collect(),
    };
    let mut e = Encoder::new();
    file::encode_cpu(&cpu, &mut e);
    let body = e.into_bytes();
    let sealed = file::seal(&body);
    let opened = file::open(&sealed).unwrap();
    assert_eq!(file::decode_cpu(&mut Decoder::new(opened)).unwrap(), cpu);
    // A state no program could be in (here a rip outside user space) does not decode: a
    // checkpoint file is as hostile as guest memory.
    let mut e = Encoder::new();
    file::encode_cpu(
        &CpuSnapshot {
            rip: 1 << 63,
            ..cpu.clone()
        },
        &mut e,
    );
    let refused = file::decode_cpu(&mut Decoder::new(&e.into_bytes())).unwrap_err();
    assert!(refused.to_string().contains("rip"), "{refused}");
    let short_xsave = CpuSnapshot {
        xsave: vec![0; 100],
        ..cpu
    };
    let mut e = Encoder::new();
    file::encode_cpu(&short_xsave, &mut e);
    assert!(file::decode_cpu(&mut Decoder::new(&e.into_bytes())).is_err());
    assert!(matches!(
        file::open(&sealed[..sealed.len() - 1]),
        Err(TemplateError::Truncated { .. })
    ));
}

#[test]
fn memory_is_stored_as_runs_of_non_zero_pages() {
    let mem = GuestMemory::new(MEM).unwrap();
    mem.write(0x10_0000, &[1; 4096]).unwrap();
    mem.write(0x10_1000, &[2; 10]).unwrap();
    mem.fill(0x20_0000, 4096, 0).unwrap(); // written, but zero: left out
    mem.write(0x30_0fff, &[3]).unwrap();
    let mut e = Encoder::new();
    let stats = file::encode_memory(&mem, &mem.data_extents().unwrap(), &mut e).unwrap();
    assert_eq!(
        stats,
        file::MemoryStats {
            runs: 2,
            stored_bytes: 3 * 4096
        }
    );
    let bytes = e.into_bytes();
    let copy = GuestMemory::new(MEM).unwrap();
    assert_eq!(
        file::decode_memory(&mut Decoder::new(&bytes), &copy).unwrap(),
        stats
    );
    for addr in [0x10_0000, 0x10_1000, 0x30_0000] {
        assert_eq!(
            copy.read_vec(addr, 4096).unwrap(),
            mem.read_vec(addr, 4096).unwrap(),
            "{addr:#x}"
        );
    }
    let too_small = GuestMemory::new(2 * MIB).unwrap();
    assert!(
        file::decode_memory(&mut Decoder::new(&bytes), &too_small).is_err(),
        "a run outside memory"
    );
}

/// Seeded corruptions of a whole template body (identity, AWAIT_REQUEST call, vCPU, process
/// state, memory), resealed so that the envelope's hash passes and the decoders behind it see
/// the damage: each load is refused with a typed error or yields a template, never a panic.
fn test_cpu() -> CpuSnapshot {
    let regs = UserRegs {
        rax: 1,
        rbx: 2,
        rcx: 3,
        rdx: 4,
        rsi: 5,
        rdi: 6,
        rbp: 7,
        rsp: 8,
        r8: 9,
        r9: 10,
        r10: 11,
        r11: 12,
        r12: 13,
        r13: 14,
        r14: 15,
        r15: 16,
    };
    CpuSnapshot {
        regs,
        rip: 0x40_1000,
        rflags: 0x246,
        fs_base: 0x7000,
        gs_base: 0,
        xsave: vec![0; 832],
    }
}

/// A template body of `process` and `mem` over `image`, for the python agent.
fn template_body(image: &Image, mem: &GuestMemory, process: &GuestProcess) -> Vec<u8> {
    let mut e = Encoder::new();
    file::encode_identity(
        &super::TemplateIdentity::new("fuzz", image, &crate::agent::PYTHON_AGENT, MEM),
        &mut e,
    );
    for v in [0x5346_0001u64, 0x30_0000, 4096, 0, 0, 0] {
        e.u64(v);
    }
    file::encode_cpu(&test_cpu(), &mut e);
    e.bytes(&encode(process));
    file::encode_memory(mem, &mem.data_extents().unwrap(), &mut e).unwrap();
    e.into_bytes()
}

#[test]
fn corrupted_template_bodies_are_refused_or_load() {
    let (image, _dir) = test_image();
    let mem = GuestMemory::new(MEM).unwrap();
    let process = busy_process(image.clone(), &mem);
    let command = &crate::agent::PYTHON_AGENT;
    let body = template_body(&image, &mem, &process);
    assert!(
        super::Template::from_file_contents(&file::seal(&body), image.clone(), command).is_ok(),
        "the undamaged body loads"
    );
    let (mut rng, cases) = crate::fuzz::start("template loader");
    let mut loaded = 0;
    for _ in 0..cases {
        let damaged = crate::fuzz::mutate(&mut rng, &body);
        if super::Template::from_file_contents(&file::seal(&damaged), image.clone(), command)
            .is_ok()
        {
            loaded += 1;
        }
    }
    eprintln!("{cases} damaged template bodies: {loaded} loaded, the rest refused");
}

/// A vCPU stopped at a ready point, as far as a checkpoint asks it.
struct StoppedCpu;

impl crate::cpu::GuestCpu for StoppedCpu {
    fn run(&mut self, _deadline: std::time::Instant) -> std::io::Result<crate::cpu::CpuExit> {
        Err(std::io::Error::other("a stopped test vCPU does not run"))
    }
    fn set_syscall_return(&mut self, _value: u64) -> std::io::Result<()> {
        Ok(())
    }
    fn set_fs_base(&mut self, _base: u64) -> std::io::Result<()> {
        Ok(())
    }
    fn snapshot(&mut self) -> std::io::Result<CpuSnapshot> {
        Ok(test_cpu())
    }
}

const PAGE: u64 = crate::layout::PAGE_SIZE;
/// Where the test template holds pages of 0xee, which the fork writes over.
const TEMPLATE_PAGES: u64 = 0x40_0000;

/// A checkpoint of a fork of a template whose pages at TEMPLATE_PAGES are 0xee, written over
/// with: zeros (a zero page over the template's), every other chunk, one chunk in each of the
/// 64 positions (sparse pages), a byte in every chunk and bytes everywhere (raw pages), a lone
/// byte where the template had zeros. Returns the template (and its image's folder), the fork,
/// the file's path, what was written and how.
fn checkpointed_fork(
    dir: &std::path::Path,
) -> (
    super::Template,
    TempDir,
    GuestMemory,
    std::path::PathBuf,
    checkpoint::Written,
    crate::snapshot::sparse::PageCounts,
) {
    let (template, image_dir) = template_of_ee_pages();
    let process = template.process.clone();
    let fork = template.new_memory(super::ForkMemory::CopyOnWrite).unwrap();
    fork.fill(TEMPLATE_PAGES, PAGE, 0).unwrap();
    for chunk in (0..64).step_by(2) {
        fork.fill(TEMPLATE_PAGES + PAGE + chunk * 64, 64, 0)
            .unwrap();
    }
    for chunk in 0..64 {
        let page = TEMPLATE_PAGES + (2 + chunk) * PAGE;
        fork.fill(page, PAGE, 0).unwrap();
        fork.write(page + chunk * 64 + chunk, &[chunk as u8 + 1])
            .unwrap();
    }
    let every_chunk = TEMPLATE_PAGES + 66 * PAGE;
    fork.fill(every_chunk, PAGE, 0).unwrap();
    for chunk in 0..64 {
        fork.write(every_chunk + chunk * 64 + 63 - chunk, &[0x80])
            .unwrap();
    }
    fork.write(
        TEMPLATE_PAGES + 67 * PAGE,
        &(0..PAGE).map(|i| (i % 253 + 1) as u8).collect::<Vec<_>>(),
    )
    .unwrap();
    fork.write(0x60_0000 + 4000, &[9]).unwrap();
    let checkpoint = checkpoint::Checkpoint::capture(
        &template,
        &fork,
        &mut StoppedCpu,
        &process,
        &[],
        [0; 6],
        checkpoint::Pages::Full,
    )
    .unwrap();
    let written = checkpoint
        .write_durably(dir, "1.sfck", &SyncGroup::of_folder(dir).unwrap())
        .unwrap();
    let pages = checkpoint.pages;
    assert_eq!(
        std::fs::metadata(dir.join("1.sfck")).unwrap().len(),
        written.file_bytes
    );
    drop(checkpoint);
    (
        template,
        image_dir,
        fork,
        dir.join("1.sfck"),
        written,
        pages,
    )
}

/// A template whose 70 pages at TEMPLATE_PAGES hold 0xee (and its image's folder).
fn template_of_ee_pages() -> (super::Template, TempDir) {
    let (image, image_dir) = test_image();
    let mem = GuestMemory::new(MEM).unwrap();
    mem.fill(TEMPLATE_PAGES, 70 * PAGE, 0xee).unwrap();
    let process = new_process(image.clone());
    (
        super::Template::from_file_contents(
            &file::seal(&template_body(&image, &mem, &process)),
            image,
            &crate::agent::PYTHON_AGENT,
        )
        .unwrap(),
        image_dir,
    )
}

/// Restores the checkpoint at `path` (its hash `known`, or checked) and the parents it names
/// (`<number>.sfck` beside it, with the hash `parent_known`, or checked); its memory or why not.
fn restore(
    template: &super::Template,
    path: &std::path::Path,
    known: Option<[u8; 32]>,
) -> Result<GuestMemory, TemplateError> {
    restore_chain(template, path, known, None)
}

fn restore_chain(
    template: &super::Template,
    path: &std::path::Path,
    known: Option<[u8; 32]>,
    parent_known: Option<[u8; 32]>,
) -> Result<GuestMemory, TemplateError> {
    let opened =
        checkpoint::OpenedCheckpoint::open(checkpoint::open_file(path)?, template, known.as_ref())?;
    let dir = path.parent().unwrap().to_owned();
    let chain = checkpoint::Chain::open(opened, template, |number| {
        Ok((
            checkpoint::open_file(&dir.join(format!("{number}.sfck")))?,
            parent_known,
        ))
    })?;
    chain.new_memory(template)
}

fn assert_same_memory(restored: &GuestMemory, expected: &GuestMemory, what: &str) {
    for start in (0..MEM).step_by(MIB as usize) {
        assert!(
            restored.read_vec(start, MIB).unwrap() == expected.read_vec(start, MIB).unwrap(),
            "{what}: the MiB at {start:#x} differs"
        );
    }
}

#[test]
fn a_checkpoint_restores_every_page_byte_exact_zero_sparse_and_raw() {
    let dir = TempDir::new("sparse-checkpoint");
    let (template, _image, fork, path, written, pages) = checkpointed_fork(&dir.0);
    assert_eq!(
        (pages.zero, pages.sparse, pages.raw),
        (1, 66, 2),
        "the zero page, 65 sparse ones and the lone byte, two raw"
    );
    assert_eq!(
        written.file_bytes,
        6 * PAGE,
        "a head of two blocks (the process state and tree), two raw pages, the packed ones and \
         the hash (69 pages whole would be 72 blocks)"
    );
    for known in [None, Some(written.hash)] {
        assert_same_memory(
            &restore(&template, &path, known).unwrap(),
            &fork,
            &format!("full, hash known: {}", known.is_some()),
        );
    }
    // An incremental one over it: the raw page zeroed, the zero page raw, a sparse page sparse
    // again with other chunks, a chunk of a raw page changed (a delta), a page written with
    // the bytes it held (left out).
    let fingerprints = {
        let mut fingerprints = checkpoint::PageFingerprints::new().unwrap();
        fingerprints.record(
            true,
            fingerprints
                .of_ranges(&fork, &fork.copied_ranges().unwrap().unwrap())
                .unwrap(),
        );
        fingerprints
    };
    let zero_page = TEMPLATE_PAGES;
    let (every_chunk, full) = (TEMPLATE_PAGES + 66 * PAGE, TEMPLATE_PAGES + 67 * PAGE);
    fork.fill(every_chunk, PAGE, 0).unwrap();
    fork.fill(zero_page, PAGE, 0x31).unwrap();
    fork.fill(TEMPLATE_PAGES + 2 * PAGE, PAGE, 0).unwrap();
    fork.write(TEMPLATE_PAGES + 2 * PAGE + 4095, &[7]).unwrap();
    fork.write(full + 64 * 20 + 3, &[0, 0]).unwrap();
    let rewritten = TEMPLATE_PAGES + 3 * PAGE;
    fork.write(rewritten, &fork.read_vec(rewritten, PAGE).unwrap())
        .unwrap();
    let mut written_pages = crate::memory::PageSet::with_capacity((MEM / PAGE) as usize);
    for page in [
        zero_page,
        TEMPLATE_PAGES + 2 * PAGE,
        rewritten,
        every_chunk,
        full,
    ] {
        written_pages.insert((page / PAGE) as usize);
    }
    let (changed, _) = fingerprints.changed(&fork, &written_pages).unwrap();
    let parent = checkpoint::Parent {
        number: 1,
        hash: written.hash,
        depth: 0,
    };
    let process = template.process.clone();
    let incremental = checkpoint::Checkpoint::capture(
        &template,
        &fork,
        &mut StoppedCpu,
        &process,
        &[],
        [0; 6],
        checkpoint::Pages::Since {
            parent,
            changed: &changed,
        },
    )
    .unwrap();
    let counts = incremental.pages;
    assert_eq!((counts.zero, counts.sparse, counts.raw, counts.delta), (1, 1, 1, 1), "zeroed; sparse (its one chunk costs less than a delta of the two that changed); raw; the raw page's changed chunk as a delta");
    let second = incremental
        .write_durably(&dir.0, "2.sfck", &SyncGroup::of_folder(&dir.0).unwrap())
        .unwrap();
    drop(incremental);
    // Every file hashed, or none: then each page is read from the newest file holding it.
    for (known, parent_known) in [(None, None), (Some(second.hash), Some(written.hash))] {
        assert_same_memory(
            &restore_chain(&template, &dir.0.join("2.sfck"), known, parent_known).unwrap(),
            &fork,
            &format!("incremental, hashes known: {}", known.is_some()),
        );
    }
}

#[test]
fn a_damaged_sparse_or_raw_page_is_refused_and_older_formats_too() {
    let dir = TempDir::new("sparse-damaged");
    let (template, _image, fork, path, written, _) = checkpointed_fork(&dir.0);
    let bytes = std::fs::read(&path).unwrap();
    let head_len = u64::from_le_bytes(bytes[24..32].try_into().unwrap()) as usize;
    let packed_at = head_len + 2 * PAGE as usize;
    let damaged = |at: usize, flip: u8| {
        let mut copy = bytes.clone();
        copy[at] ^= flip;
        std::fs::write(&path, &copy).unwrap();
    };
    // A raw page's byte, a mask's, a stored chunk's, the last stored byte.
    let packed_len = 66 * 8 + 32 * 64 + 64 * 64 + 64;
    for at in [
        head_len + 100,
        packed_at,
        packed_at + 8 + 5,
        packed_at + packed_len - 1,
    ] {
        damaged(at, 0x01);
        let refused = restore(&template, &path, None).err().map(|e| e.to_string());
        assert!(
            refused
                .as_deref()
                .is_some_and(|why| why.contains("content hash does not match")),
            "byte {at}: {refused:?}"
        );
        // A file trusted by its known hash is not hashed again: damage there never panics.
        let _ = restore(&template, &path, Some(written.hash));
    }
    damaged(packed_at, 0x01);
    assert!(
        restore(&template, &path, Some(written.hash))
            .is_err_and(|e| e.to_string().contains("packed pages")),
        "a mask that no longer fits"
    );
    for version in [2u32, 4, 9] {
        let mut old = bytes.clone();
        old[8..12].copy_from_slice(&version.to_le_bytes());
        std::fs::write(&path, &old).unwrap();
        assert!(
            matches!(restore(&template, &path, None), Err(TemplateError::VersionMismatch { found, expected: checkpoint::FORMAT_VERSION }) if found == version)
        );
    }
    // Format 5 is format 8 without the process tree (here the first process alone: its bytes
    // are taken out of the head) nor a full checkpoint's deltas (this one has none): it
    // restores.
    let mut tree = Encoder::new();
    template
        .process
        .encode_tree(&mut tree, std::time::Instant::now())
        .unwrap();
    tree.len(0);
    let tree = tree.into_bytes();
    let blob = [&(tree.len() as u64).to_le_bytes()[..], &tree].concat();
    let at = bytes[..head_len]
        .windows(blob.len())
        .position(|w| w == blob.as_slice())
        .expect("the process tree in the head");
    let mut five = bytes.clone();
    five.copy_within(at + blob.len()..head_len, at);
    five[head_len - blob.len()..head_len].fill(0);
    five[8..12].copy_from_slice(&5u32.to_le_bytes());
    let hash_at = five.len() - 32;
    let hash = <[u8; 32]>::from(sha2::Sha256::digest(&five[..hash_at]));
    five[hash_at..].copy_from_slice(&hash);
    std::fs::write(&path, &five).unwrap();
    assert_same_memory(&restore(&template, &path, None).unwrap(), &fork, "format 5");
    std::fs::write(&path, &bytes[..bytes.len() - 4096]).unwrap();
    assert!(matches!(
        restore(&template, &path, None),
        Err(TemplateError::Truncated { .. })
    ));
    std::fs::write(&path, &bytes).unwrap();
    assert!(
        restore(&template, &path, None).is_ok(),
        "the undamaged file"
    );
}

#[test]
fn a_full_checkpoint_stores_what_differs_from_the_template_and_leaves_out_the_same_bytes() {
    let dir = TempDir::new("template-delta");
    let (template, _image) = template_of_ee_pages();
    let fork = template.new_memory(super::ForkMemory::CopyOnWrite).unwrap();
    // One byte changed; the template's bytes written again; 48 chunks changed (too many for a
    // delta: raw); zeros over the template's bytes; a lone byte where the template has none.
    let (one_byte, same, many, zeroed, outside) = (
        TEMPLATE_PAGES,
        TEMPLATE_PAGES + PAGE,
        TEMPLATE_PAGES + 2 * PAGE,
        TEMPLATE_PAGES + 3 * PAGE,
        0x60_0000,
    );
    fork.write(one_byte + 100, &[1]).unwrap();
    fork.fill(same, PAGE, 0xee).unwrap();
    for chunk in 0..48 {
        fork.write(many + chunk * 64, &[2]).unwrap();
    }
    fork.fill(zeroed, PAGE, 0).unwrap();
    fork.write(outside, &[3]).unwrap();
    assert_eq!(
        fork.copied_pages().unwrap(),
        Some(5),
        "the fork holds copies of the five pages"
    );
    let process = template.process.clone();
    let checkpoint = checkpoint::Checkpoint::capture(
        &template,
        &fork,
        &mut StoppedCpu,
        &process,
        &[],
        [0; 6],
        checkpoint::Pages::Full,
    )
    .unwrap();
    let counts = checkpoint.pages;
    assert_eq!(
        (counts.delta, counts.raw, counts.zero, counts.sparse),
        (1, 1, 1, 1),
        "the changed chunk over the template's page; raw; zero; sparse"
    );
    assert_eq!(
        checkpoint.dirty_bytes,
        4 * PAGE,
        "the page holding the template's bytes is not stored"
    );
    let mut restored: Vec<u64> = checkpoint
        .restored_ranges()
        .iter()
        .flat_map(|&(start, end)| (start..end).step_by(PAGE as usize))
        .collect();
    restored.sort();
    assert_eq!(
        restored,
        vec![one_byte, same, many, zeroed, outside],
        "a restore gives every copied page back as it is (the left-out one as the template's)"
    );
    let written = checkpoint
        .write_durably(&dir.0, "1.sfck", &SyncGroup::of_folder(&dir.0).unwrap())
        .unwrap();
    assert_eq!(
        written.file_bytes,
        4 * PAGE,
        "a head of two blocks, the raw page, the packed chunks and the hash"
    );
    drop(checkpoint);
    for known in [None, Some(written.hash)] {
        let mem = restore(&template, &dir.0.join("1.sfck"), known).unwrap();
        assert_same_memory(&mem, &fork, &format!("hash known: {}", known.is_some()));
        assert_eq!(
            mem.copied_pages().unwrap(),
            Some(4),
            "the page equal to the template's is not copied by the restore"
        );
    }
}

#[test]
fn a_checkpoint_longer_than_a_piece_is_written_whole_and_hashed_in_order() {
    let dir = TempDir::new("long-checkpoint");
    let (template, _image) = template_of_ee_pages();
    let fork = template.new_memory(super::ForkMemory::CopyOnWrite).unwrap();
    // 5 MiB of bytes with no zero chunk, where the template has none: raw pages, three pieces.
    let long: Vec<u8> = (0..5 * MIB).map(|i| (i * 7 % 251 + 1) as u8).collect();
    fork.write(0x80_0000, &long).unwrap();
    let process = template.process.clone();
    let checkpoint = checkpoint::Checkpoint::capture(
        &template,
        &fork,
        &mut StoppedCpu,
        &process,
        &[],
        [0; 6],
        checkpoint::Pages::Full,
    )
    .unwrap();
    assert_eq!(checkpoint.pages.raw, 5 * MIB / PAGE);
    let written = checkpoint
        .write_durably(&dir.0, "1.sfck", &SyncGroup::of_folder(&dir.0).unwrap())
        .unwrap();
    drop(checkpoint);
    let bytes = std::fs::read(dir.0.join("1.sfck")).unwrap();
    assert_eq!(bytes.len() as u64, written.file_bytes);
    let (content, hash) = bytes.split_at(bytes.len() - 32);
    assert_eq!(
        <[u8; 32]>::from(sha2::Sha256::digest(content)),
        written.hash,
        "the hash is of the bytes as written, in order"
    );
    assert_eq!(hash, written.hash);
    assert_same_memory(
        &restore(&template, &dir.0.join("1.sfck"), None).unwrap(),
        &fork,
        "restored, hashed",
    );
}
