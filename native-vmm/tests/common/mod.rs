//! Shared helpers of the program tests (tests/*_ptrace.rs), which run real programs through the
//! real loader, syscall layer and file image on the test CPU (`test_cpu`: the product's KVM vCPU,
//! or the ptrace development CPU on request): compiling the C test programs, building file images
//! once per test process, launching runs, and the time scale of the KVM tier's path.

#![allow(dead_code)] // each test binary uses its own subset of these helpers

pub mod cpython;
mod time_scale;
#[allow(unused_imports)] // each test binary uses its own subset
pub use time_scale::{boot_limits, repetitions, scaled, scaled_ms, time_scale};

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sandfork_vmm::cpu::{CpuSnapshot, GuestCpu};
use sandfork_vmm::devcpu::PtraceCpu;
use sandfork_vmm::fs::Image;
use sandfork_vmm::loader::LoadedProgram;
use sandfork_vmm::memory::GuestMemory;
use sandfork_vmm::snapshot::ForkMemory;
use sandfork_vmm::status::RunStatus;
use sandfork_vmm::vm::{self, RunOutcome, RunRequest};

/// Per-test-binary scratch space under target/ (cargo's CARGO_TARGET_TMPDIR).
pub fn scratch_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

/// A directory owned by this test process: `<scratch>/<tag>-<pid>`. Directories left by test
/// processes that are gone are removed first, so concurrent `cargo test` runs never share a
/// directory (an image in use is never rewritten under another process's mappings).
pub fn process_dir(tag: &str) -> PathBuf {
    let scratch = scratch_dir();
    let prefix = format!("{tag}-");
    if let Ok(entries) = std::fs::read_dir(&scratch) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = scratch.join(format!("{prefix}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

/// How a C test program is linked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Linking {
    Static,
    Dynamic,
}

/// Compiles tests/programs/<name>.c with the host C compiler ($CC or `cc`) into `out_dir`.
pub fn compile(name: &str, linking: Linking, out_dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(format!("{name}.c"));
    let suffix = match linking {
        Linking::Static => "static",
        Linking::Dynamic => "dynamic",
    };
    let out = out_dir.join(format!("{name}-{suffix}"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let mut cmd = Command::new(&cc);
    cmd.arg("-O1").arg("-o").arg(&out).arg(&source);
    if linking == Linking::Static {
        cmd.arg("-static");
    }
    let result = cmd.output().unwrap_or_else(|e| {
        panic!("these tests compile C programs with `{cc}` (set CC to choose another compiler): cannot run it: {e}; on Debian: apt-get install gcc libc6-dev")
    });
    assert!(
        result.status.success(),
        "{cc} failed on {}:\n{}",
        source.display(),
        String::from_utf8_lossy(&result.stderr)
    );
    out
}

/// Builds an image from manifest JSON text into a fresh per-process directory and opens it.
pub fn build_image(tag: &str, manifest_json: &str) -> Arc<Image> {
    let dir = process_dir(tag);
    let manifest = dir.join("image.json");
    std::fs::write(&manifest, manifest_json).unwrap();
    build_image_from(&manifest, &dir.join("image"))
}

/// Builds the image of `manifest` into `out_dir` and opens it.
pub fn build_image_from(manifest: &Path, out_dir: &Path) -> Arc<Image> {
    let report = sandfork_vmm::image::build(manifest, out_dir)
        .unwrap_or_else(|e| panic!("building the image of {}: {e}", manifest.display()));
    eprintln!("{report}");
    Image::open(out_dir)
        .unwrap_or_else(|e| panic!("opening the image in {}: {e}", out_dir.display()))
}

/// The Python template's image (templates/python/image.json), built once per test process.
pub fn python_image() -> Arc<Image> {
    python_image_built().1.clone()
}

/// The folder `python_image` was built in (a `sandfork-vmm run --image`).
pub fn python_image_dir() -> PathBuf {
    python_image_built().0.clone()
}

fn python_image_built() -> &'static (PathBuf, Arc<Image>) {
    static IMAGE: OnceLock<(PathBuf, Arc<Image>)> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates/python/image.json");
        assert!(
            manifest.exists(),
            "the Python template's manifest {} is missing",
            manifest.display()
        );
        let dir = process_dir("python-image").join("image");
        let image = build_image_from(&manifest, &dir);
        (dir, image)
    })
}

/// Which vCPU the program tests run on (`SANDFORK_TEST_CPU`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestCpu {
    /// The product's KVM vCPU (the default; scripts/kvm-tier.sh runs these tests this way, on the
    /// host's /dev/kvm or inside a QEMU guest that has one).
    Kvm,
    /// The ptrace development CPU (`sandfork_vmm::devcpu`, `SANDFORK_TEST_CPU=ptrace`): the
    /// program runs natively in a traced child. A debugging aid, no isolation boundary.
    Ptrace,
}

pub fn cpu_kind() -> TestCpu {
    match std::env::var("SANDFORK_TEST_CPU").as_deref() {
        Ok("kvm") | Err(_) => TestCpu::Kvm,
        Ok("ptrace") => TestCpu::Ptrace,
        Ok(other) => panic!("SANDFORK_TEST_CPU={other}: expected kvm or ptrace"),
    }
}

/// Adds, to a failure to create a KVM vCPU, where the program tests can run instead.
fn kvm_hint(e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("{e} (the program tests run on KVM: run them with `bash scripts/kvm-tier.sh`, which uses a QEMU guest when this machine has no usable /dev/kvm; SANDFORK_TEST_CPU=ptrace runs them on the ptrace development CPU)"),
    )
}

/// The vCPU factory the program tests run on (see `TestCpu`).
pub fn test_cpu<'m>(
    mem: &'m GuestMemory,
    program: &LoadedProgram,
) -> io::Result<Box<dyn GuestCpu + 'm>> {
    match cpu_kind() {
        TestCpu::Kvm => sandfork_vmm::kvm::new_cpu(mem, program).map_err(kvm_hint),
        TestCpu::Ptrace => Ok(Box::new(PtraceCpu::new(
            mem,
            program.entry,
            program.stack_pointer,
        )?)),
    }
}

/// The restore factory of the test CPU: a vCPU restored from a template snapshot.
pub fn restore_cpu<'m>(
    mem: &'m GuestMemory,
    snapshot: &CpuSnapshot,
) -> io::Result<Box<dyn GuestCpu + 'm>> {
    match cpu_kind() {
        TestCpu::Kvm => sandfork_vmm::kvm::restore_cpu(mem, snapshot).map_err(kvm_hint),
        TestCpu::Ptrace => Ok(Box::new(PtraceCpu::restore(mem, snapshot)?)),
    }
}

/// How a restored VM's memory is made on the test CPU: the product's copy-on-write fork on KVM;
/// a full copy on the ptrace CPU (its traced child shares the memory, which a private mapping
/// cannot be).
pub fn fork_memory() -> ForkMemory {
    match cpu_kind() {
        TestCpu::Kvm => ForkMemory::CopyOnWrite,
        TestCpu::Ptrace => ForkMemory::Copy,
    }
}

/// The test CPU's name, for printed figures ("kvm" or "ptrace").
pub fn cpu_name() -> &'static str {
    match cpu_kind() {
        TestCpu::Kvm => "kvm",
        TestCpu::Ptrace => "ptrace",
    }
}

/// Runs `req` in `image` on the test CPU; a launch error fails the test.
pub fn run(image: &Arc<Image>, req: &RunRequest) -> RunOutcome {
    vm::launch(image.clone(), req, &test_cpu)
        .unwrap_or_else(|e| panic!("launching {}: {e}", req.program))
}

/// A request for `program` with `args`, a 10 s limit (scaled) and the default memory and output
/// cap.
pub fn request(program: &str, args: &[&str]) -> RunRequest {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let mut req = RunRequest::new(program, &args);
    req.timeout = scaled(Duration::from_secs(10));
    req
}

/// A request that runs `code` with `python3 -c`.
pub fn python_request(code: &str) -> RunRequest {
    request("python3", &["-c", code])
}

/// Python that forks until a fork is refused and prints how many children it made and the
/// errno that stopped it (`2 EAGAIN`).
pub const FORK_UNTIL_REFUSED: &str = include_str!("../programs/fork_until_refused.py");

/// Runs `code` with the Python template's image.
pub fn python(code: &str) -> RunOutcome {
    run(&python_image(), &python_request(code))
}

/// Runs `code` and expects exit code 0 with exactly `stdout`.
pub fn assert_prints(code: &str, stdout: &str) {
    let outcome = python(code);
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        stdout,
        "{}",
        describe(&outcome)
    );
}

/// Runs `program` natively; it must succeed and print what the run in the VM printed.
pub fn assert_prints_as_natively(outcome: &RunOutcome, program: &Path) {
    let native = Command::new(program)
        .output()
        .unwrap_or_else(|e| panic!("running {} natively: {e}", program.display()));
    assert!(native.status.success(), "natively: {native:?}");
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        String::from_utf8_lossy(&native.stdout),
        "{}",
        describe(outcome)
    );
}

/// The run's stdout and stderr as text, for assertion messages.
pub fn describe(outcome: &RunOutcome) -> String {
    format!(
        "status: {}\nstdout: {}\nstderr: {}\nunsupported syscalls: {:?}",
        outcome.status,
        String::from_utf8_lossy(&outcome.stdout),
        String::from_utf8_lossy(&outcome.stderr),
        outcome.stats.unsupported
    )
}

/// The user a native run runs as: the host's own, or nobody when that is root, so that the
/// native run is as unprivileged as the guest (root passes permission and ownership tests the
/// guest must fail, and skips others).
pub fn unprivileged(cmd: &mut std::process::Command) {
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    if std::fs::metadata("/proc/self").map(|m| m.uid()).ok() == Some(0) {
        cmd.uid(65534).gid(65534); // std drops the supplementary groups too
    }
}

/// Runs `program` natively with `/usr/bin/python3.11 program.py args` in a directory of its own
/// (an empty environment but PATH and HOME); it must exit 0. Its stdout.
pub fn native_python(tag: &str, program: &str, args: &[&str]) -> String {
    let dir = process_dir(tag);
    std::fs::create_dir_all(&dir).expect("a directory for the native run");
    let script = dir.join("program.py");
    std::fs::write(&script, program).expect("writing the program");
    let native = Command::new("/usr/bin/python3.11")
        .arg(&script)
        .args(args)
        .current_dir(&dir)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", &dir)
        .output()
        .expect("running python3.11 natively");
    assert!(native.status.success(), "native: {native:?}");
    String::from_utf8_lossy(&native.stdout).into_owned()
}

/// Runs Python `program` in the VM (`python3 -c`, a 30 s limit, scaled) and natively: both must
/// exit 0 and print the same, which is returned (`prints_as_native`, in a directory named by
/// `tag`).
pub fn python_as_native(tag: &str, program: &str) -> String {
    let mut req = python_request(program);
    req.timeout = scaled(Duration::from_secs(30));
    prints_as_native(&req, tag, program, &[])
}

/// Runs `req` in the Python image, which runs `program` with `args`, and `program` natively
/// (`native_python`, in a directory named by `tag`): both must exit 0 and print the same,
/// which is returned.
pub fn prints_as_native(req: &RunRequest, tag: &str, program: &str, args: &[&str]) -> String {
    let outcome = run(&python_image(), req);
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{tag}: {}",
        describe(&outcome)
    );
    let printed = String::from_utf8_lossy(&outcome.stdout).into_owned();
    let native = native_python(tag, program, args);
    assert_eq!(printed, native, "{tag}: {}", describe(&outcome));
    printed
}
