//! Launching one program in a fresh guest and running it to completion: the backend-agnostic
//! run loop. The vCPU backend (KVM in the product, the ptrace development CPU in tests) is
//! passed in as a constructor, so this module never names one.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cpu::{CpuExit, GuestCpu};
use crate::fs::Image;
use crate::layout::page_align_up;
use crate::loader::{self, LoadError, LoadedProgram};
use crate::memory::GuestMemory;
use crate::process::{GuestProcess, ProcessConfig, SyscallCount};
use crate::status::RunStatus;
use crate::syscalls::{self, SyscallOutcome};

pub const DEFAULT_MEM_BYTES: u64 = 256 << 20;
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_OUTPUT_CAP: u64 = 1 << 20;
/// The working directory: writable (an overlay directory in every image).
pub const DEFAULT_CWD: &str = crate::fs::WORK_DIR;
pub const DEFAULT_ENV: [&str; 3] = ["PATH=/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8"];

/// One program to run in a fresh guest.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// Path in the image, or a bare name looked up in envp's PATH.
    pub program: String,
    /// The full argument vector, argv[0] included.
    pub argv: Vec<String>,
    /// "NAME=value" strings.
    pub envp: Vec<String>,
    pub stdin: Vec<u8>,
    pub cwd: String,
    /// Guest memory size, which is the memory limit (rounded up to whole pages).
    pub mem_bytes: u64,
    /// Wall-clock limit for the guest's run (loading is not counted).
    pub timeout: Duration,
    /// Cap on stdout+stderr bytes kept.
    pub output_cap: u64,
}

impl RunRequest {
    /// `program` with `args` after argv[0] = `program`, and the default limits and environment.
    pub fn new(program: &str, args: &[String]) -> RunRequest {
        RunRequest {
            program: program.to_owned(),
            argv: std::iter::once(program.to_owned()).chain(args.iter().cloned()).collect(),
            envp: DEFAULT_ENV.iter().map(|s| s.to_string()).collect(),
            stdin: Vec::new(),
            cwd: DEFAULT_CWD.to_owned(),
            mem_bytes: DEFAULT_MEM_BYTES,
            timeout: DEFAULT_TIMEOUT,
            output_cap: DEFAULT_OUTPUT_CAP,
        }
    }
}

/// Counters of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunStats {
    /// System calls the guest made.
    pub syscalls: u64,
    /// Times the guest left the VM (system calls plus faults).
    pub exits: u64,
    /// System calls answered ENOSYS or stopped as unsupported, per number.
    pub unsupported: Vec<SyscallCount>,
    /// From the start of the run loop to the end of the run.
    pub wall: Duration,
    /// Creating guest memory, loading the program and creating the vCPU.
    pub load: Duration,
}

#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub status: RunStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stats: RunStats,
}

/// Why a program could not be run at all (as opposed to how a run ended, `RunStatus`).
#[derive(Debug)]
pub enum LaunchError {
    /// The program is not in the image (neither as a path nor on PATH).
    ProgramNotFound { program: String },
    /// Guest memory could not be allocated.
    Memory(io::Error),
    Load(LoadError),
    /// The VM's file system could not be set up over the image.
    FileSystem(crate::errno::Errno),
    /// The vCPU could not be created or failed while running.
    Cpu(io::Error),
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LaunchError::ProgramNotFound { program } => write!(f, "{program}: not found in the file image"),
            LaunchError::Memory(e) => write!(f, "allocating guest memory: {e}"),
            LaunchError::Load(e) => write!(f, "loading the program: {e}"),
            LaunchError::FileSystem(e) => write!(f, "setting up the file system: errno {}", e.0),
            LaunchError::Cpu(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for LaunchError {}

impl From<LoadError> for LaunchError {
    fn from(e: LoadError) -> LaunchError {
        LaunchError::Load(e)
    }
}

/// Creates the vCPU for a loaded program (the backend is the caller's choice). The vCPU may
/// borrow the guest memory it runs on.
pub type CpuFactory<'a> = dyn for<'m> Fn(&'m GuestMemory, &LoadedProgram) -> io::Result<Box<dyn GuestCpu + 'm>> + 'a;

/// Finds `program` in the image: a path containing '/' as is, a bare name in envp's PATH.
pub fn resolve_program(image: &Image, program: &str, envp: &[String]) -> Option<String> {
    if program.contains('/') {
        return image.file_bytes(program).map(|_| program.to_owned());
    }
    if program.is_empty() {
        return None;
    }
    let path = envp.iter().find_map(|e| e.strip_prefix("PATH=")).unwrap_or("/usr/bin:/bin");
    path.split(':').filter(|dir| dir.starts_with('/')).map(|dir| format!("{}/{program}", dir.trim_end_matches('/'))).find(|candidate| image.file_bytes(candidate).is_some())
}

/// Runs `req` in a fresh guest built from `image`, with a vCPU from `make_cpu`.
pub fn launch(image: Arc<Image>, req: &RunRequest, make_cpu: &CpuFactory) -> Result<RunOutcome, LaunchError> {
    let started = Instant::now();
    let program = resolve_program(&image, &req.program, &req.envp).ok_or_else(|| LaunchError::ProgramNotFound { program: req.program.clone() })?;
    let mem_bytes = page_align_up(req.mem_bytes.min(u64::MAX / 2));
    let mem = GuestMemory::new(mem_bytes).map_err(LaunchError::Memory)?;
    let loaded = loader::load_program(&mem, &image, &program, &req.argv, &req.envp)?;
    let vfs = crate::fs::Vfs::new(image, crate::fs::DEFAULT_OVERLAY_LIMIT).map_err(LaunchError::FileSystem)?;
    let config = ProcessConfig { vfs, cwd: req.cwd.clone(), stdin: req.stdin.clone(), output_cap: req.output_cap, mem_limit: mem_bytes };
    let mut process = GuestProcess::new(config, loaded.space);
    let mut cpu = make_cpu(&mem, &loaded).map_err(LaunchError::Cpu)?;
    let load = started.elapsed();

    let run_started = Instant::now();
    let limit_ms = req.timeout.as_millis().min(u64::MAX as u128) as u64;
    // A timeout too large for Instant is no practical limit: a year stands in for it.
    let deadline = run_started.checked_add(req.timeout).unwrap_or(run_started + Duration::from_secs(86_400 * 365));
    let (status, exits) = run_loop(cpu.as_mut(), &mut process, &mem, deadline, limit_ms).map_err(LaunchError::Cpu)?;
    let stats = RunStats { syscalls: process.total_syscalls(), exits, unsupported: process.unsupported_counts(), wall: run_started.elapsed(), load };
    let (stdout, stderr) = process.into_output().into_parts();
    Ok(RunOutcome { status, stdout, stderr, stats })
}

/// Runs the guest until it stops: each system call goes to the syscall table, a fault ends the
/// run as Crashed, the deadline as Timeout. Returns the status and the number of VM exits.
pub fn run_loop(cpu: &mut dyn GuestCpu, process: &mut GuestProcess, mem: &GuestMemory, deadline: Instant, limit_ms: u64) -> io::Result<(RunStatus, u64)> {
    // Sleeps and timed waits inside system calls end at the deadline too.
    process.set_deadline(Some(deadline));
    let mut exits = 0;
    let status = loop {
        match cpu.run(deadline)? {
            CpuExit::Syscall { nr, args } => {
                exits += 1;
                match syscalls::dispatch(process, mem, nr, args) {
                    SyscallOutcome::Return(value) => cpu.set_syscall_return(value)?,
                    SyscallOutcome::SetFsBase(base) => {
                        cpu.set_fs_base(base)?;
                        cpu.set_syscall_return(0)?;
                    }
                    SyscallOutcome::Stop(status) => break status,
                }
            }
            CpuExit::Fault(fault) => {
                exits += 1;
                break RunStatus::Crashed { fault };
            }
            CpuExit::DeadlineReached => break RunStatus::Timeout { limit_ms },
        }
    };
    Ok((status, exits))
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use super::*;
    use crate::image::format::{self, Entry, EntryKind, Index};
    use crate::image::testdir::TempDir;
    use crate::loader::tests::tiny_elf;
    use crate::status::GuestFault;

    const PROGRAM: &str = "/bin/prog";

    /// An image holding one tiny static program at /bin/prog, in a temporary directory that
    /// lives as long as the returned guard.
    fn test_image() -> (Arc<Image>, TempDir) {
        let dir = TempDir::new("vm");
        let program = tiny_elf(2, 0x40_0000, &[0xf4], 0, None);
        let entry = |path: &str, kind| Entry { path: path.into(), mode: 0o755, mtime_sec: 0, mtime_nsec: 0, kind };
        let mut index = Index {
            name: "vm-test".into(),
            writable_dirs: vec!["/tmp".into(), "/work".into()],
            entries: vec![
                entry("/", EntryKind::Dir),
                entry("/bin", EntryKind::Dir),
                entry(PROGRAM, EntryKind::File { offset: 0, size: program.len() as u64, sha256: [0; 32] }),
            ],
        };
        format::write(&dir.0, &mut index, |_| Ok(program.clone())).unwrap();
        (Image::open(&dir.0).unwrap(), dir)
    }

    /// Gives a closure the higher-ranked signature of a `CpuFactory`.
    fn factory<F>(f: F) -> F
    where
        F: for<'m> Fn(&'m GuestMemory, &LoadedProgram) -> io::Result<Box<dyn GuestCpu + 'm>>,
    {
        f
    }

    /// What the fake CPU was told by the run loop.
    #[derive(Debug, Default)]
    struct Log {
        returns: Vec<u64>,
        fs_bases: Vec<u64>,
    }

    /// A vCPU that replays a fixed list of exits (and reports the deadline when it runs out).
    struct ScriptedCpu {
        script: VecDeque<CpuExit>,
        log: Arc<Mutex<Log>>,
    }

    impl GuestCpu for ScriptedCpu {
        fn run(&mut self, _deadline: Instant) -> io::Result<CpuExit> {
            Ok(self.script.pop_front().unwrap_or(CpuExit::DeadlineReached))
        }
        fn set_syscall_return(&mut self, value: u64) -> io::Result<()> {
            self.log.lock().unwrap().returns.push(value);
            Ok(())
        }
        fn set_fs_base(&mut self, base: u64) -> io::Result<()> {
            self.log.lock().unwrap().fs_bases.push(base);
            Ok(())
        }
    }

    /// Launches /bin/prog on a scripted CPU; `script` gets the loaded program and guest memory
    /// (to place syscall buffers) and returns the exits to replay.
    fn launch_scripted(script: impl Fn(&GuestMemory, &LoadedProgram) -> Vec<CpuExit>) -> (RunOutcome, Arc<Mutex<Log>>) {
        let (image, _dir) = test_image();
        let log = Arc::new(Mutex::new(Log::default()));
        let cpu_log = log.clone();
        let make_cpu = factory(move |mem, loaded| Ok(Box::new(ScriptedCpu { script: script(mem, loaded).into(), log: cpu_log.clone() })));
        let mut request = RunRequest::new(PROGRAM, &[]);
        request.mem_bytes = 16 << 20;
        request.timeout = Duration::from_millis(1500);
        let outcome = launch(image, &request, &make_cpu).unwrap();
        (outcome, log)
    }

    const SYS_WRITE: u64 = 1;
    const SYS_ARCH_PRCTL: u64 = 158;
    const SYS_EXIT_GROUP: u64 = 231;
    const ARCH_SET_FS: u64 = 0x1002;

    #[test]
    fn write_then_exit_group_yields_the_bytes_and_the_exit_code() {
        let (outcome, log) = launch_scripted(|mem, loaded| {
            let buf = loaded.stack_pointer - 256;
            mem.write(buf, b"hello\n").unwrap();
            vec![
                CpuExit::Syscall { nr: SYS_WRITE, args: [1, buf, 6, 0, 0, 0] },
                CpuExit::Syscall { nr: SYS_WRITE, args: [2, buf, 2, 0, 0, 0] },
                CpuExit::Syscall { nr: SYS_EXIT_GROUP, args: [3, 0, 0, 0, 0, 0] },
            ]
        });
        assert_eq!(outcome.status, RunStatus::Exited { code: 3 });
        assert_eq!(outcome.stdout, b"hello\n");
        assert_eq!(outcome.stderr, b"he");
        assert_eq!(log.lock().unwrap().returns, vec![6, 2]);
        assert_eq!((outcome.stats.syscalls, outcome.stats.exits), (3, 3));
        assert!(outcome.stats.unsupported.is_empty());
    }

    #[test]
    fn arch_prctl_set_fs_reaches_the_cpu_and_returns_zero() {
        let (outcome, log) = launch_scripted(|_, _| {
            vec![
                CpuExit::Syscall { nr: SYS_ARCH_PRCTL, args: [ARCH_SET_FS, 0x7000, 0, 0, 0, 0] },
                CpuExit::Syscall { nr: SYS_EXIT_GROUP, args: [0, 0, 0, 0, 0, 0] },
            ]
        });
        assert_eq!(outcome.status, RunStatus::Exited { code: 0 });
        let log = log.lock().unwrap();
        assert_eq!(log.fs_bases, vec![0x7000]);
        assert_eq!(log.returns, vec![0]);
    }

    #[test]
    fn a_fault_is_a_crash_and_counts_as_an_exit() {
        let fault = GuestFault { vector: 14, error_code: 6, rip: 0x40_0078, address: Some(0) };
        let (outcome, _) = launch_scripted(move |_, _| vec![CpuExit::Fault(fault.clone())]);
        assert_eq!(outcome.status, RunStatus::Crashed { fault: GuestFault { vector: 14, error_code: 6, rip: 0x40_0078, address: Some(0) } });
        assert_eq!((outcome.stats.syscalls, outcome.stats.exits), (0, 1));
    }

    #[test]
    fn the_deadline_is_a_timeout_with_the_requested_limit() {
        let (outcome, _) = launch_scripted(|_, _| vec![]);
        assert_eq!(outcome.status, RunStatus::Timeout { limit_ms: 1500 });
        assert_eq!(outcome.stats.exits, 0);
    }

    #[test]
    fn enosys_answers_are_counted_by_number() {
        const UNKNOWN: u64 = 100_000;
        use crate::errno::Errno;
        let (outcome, log) = launch_scripted(|_, _| {
            vec![
                CpuExit::Syscall { nr: UNKNOWN, args: [0; 6] },
                CpuExit::Syscall { nr: UNKNOWN, args: [0; 6] },
                CpuExit::Syscall { nr: SYS_EXIT_GROUP, args: [0; 6] },
            ]
        });
        assert_eq!(outcome.status, RunStatus::Exited { code: 0 });
        assert_eq!(log.lock().unwrap().returns, vec![Errno::ENOSYS.as_return(); 2]);
        let unsupported: Vec<(Option<u64>, u64)> = outcome.stats.unsupported.iter().map(|c| (c.nr, c.count)).collect();
        assert_eq!(unsupported, vec![(None, 2)], "numbers past the x86-64 range share one bucket");
    }

    #[test]
    fn programs_are_found_by_path_or_on_path() {
        let (image, _dir) = test_image();
        let env = |p: &str| vec![format!("PATH={p}")];
        assert_eq!(resolve_program(&image, "/bin/prog", &[]), Some("/bin/prog".into()));
        assert_eq!(resolve_program(&image, "prog", &env("/usr/bin:/bin")), Some("/bin/prog".into()));
        assert_eq!(resolve_program(&image, "prog", &env("/usr/bin")), None);
        assert_eq!(resolve_program(&image, "prog", &env("relative:/bin/")), Some("/bin/prog".into()));
        assert_eq!(resolve_program(&image, "/bin/missing", &[]), None);
        assert_eq!(resolve_program(&image, "", &[]), None);
    }

    #[test]
    fn launch_errors_are_typed() {
        let (image, _dir) = test_image();
        let never = factory(|_, _| Err(io::Error::other("no /dev/kvm")));
        let missing = RunRequest::new("missing", &[]);
        assert!(matches!(launch(image.clone(), &missing, &never), Err(LaunchError::ProgramNotFound { .. })));
        let cpu_fails = RunRequest::new(PROGRAM, &[]);
        match launch(image, &cpu_fails, &never) {
            Err(LaunchError::Cpu(e)) => assert_eq!(e.to_string(), "no /dev/kvm"),
            other => panic!("expected a CPU error, got {other:?}"),
        }
    }
}
