//! `sandfork-vmm bench syscalls`: what one system call round trip and one vDSO clock read cost
//! in a guest, next to the same static program on the host in the same run. The program
//! (tests/programs/vdso_clock.c, built by build.rs and embedded) makes N getppid() system calls
//! and N clock_gettime(CLOCK_MONOTONIC) calls through glibc (the vDSO in both places) and
//! prints the mean of each; in the guest the VMM also counts the clock_gettime calls that left
//! the VM (0 when the vDSO answered them all).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::bench::{launch_exited, median, native_stdout, BenchError};
use crate::fs::Image;
use crate::image::{self, Manifest};
use crate::vm::{CpuFactory, RunRequest};

/// The static bench program.
const PROGRAM_BYTES: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/vdso_clock"));
const GUEST_PATH: &str = "/vdso_clock";
pub const DEFAULT_CALLS: u64 = 100_000;
pub const DEFAULT_REPETITIONS: usize = 5;
const CLOCK_GETTIME: u64 = 228;

/// Nanoseconds per call, as the program printed them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PerCall {
    pub syscall_ns: f64,
    pub clock_gettime_ns: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SyscallsReport {
    pub calls: u64,
    pub repetitions: usize,
    /// The median of each figure over the repetitions.
    pub vm: PerCall,
    pub native: PerCall,
    /// clock_gettime calls that reached the VMM in the guest's last run.
    pub vm_clock_gettime_exits: u64,
}

/// A scratch folder with the program and its image, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes the program into `dir` and builds an image holding only it.
fn program_image(dir: &Path) -> std::io::Result<(PathBuf, std::sync::Arc<Image>)> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    let program = dir.join("vdso_clock");
    std::fs::write(&program, PROGRAM_BYTES)?;
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755))?;
    let manifest = serde_json::json!({ "name": "syscall-bench", "paths": [{ "host": program, "guest": GUEST_PATH }] });
    let manifest =
        Manifest::parse(manifest.to_string().as_bytes(), dir).map_err(std::io::Error::other)?;
    image::build_from(&manifest, &dir.join("image"))?;
    Ok((program, Image::open(&dir.join("image"))?))
}

fn parse(stdout: &[u8]) -> Result<PerCall, BenchError> {
    serde_json::from_slice(stdout).map_err(|e| {
        BenchError::Native(std::io::Error::other(format!(
            "the bench program printed {:?}: {e}",
            String::from_utf8_lossy(stdout)
        )))
    })
}

pub fn run(
    calls: u64,
    repetitions: usize,
    make_cpu: &CpuFactory,
) -> Result<SyscallsReport, BenchError> {
    if repetitions == 0 || calls == 0 {
        return Err(BenchError::NoIterations);
    }
    let scratch = Scratch(
        std::env::temp_dir().join(format!("sandfork-bench-syscalls-{}", std::process::id())),
    );
    let (program, image) = program_image(&scratch.0).map_err(BenchError::Native)?;
    let args = ["bench".to_owned(), calls.to_string()];
    let mut request = RunRequest::new(GUEST_PATH, &args);
    request.timeout = Duration::from_secs(600);
    let (mut vm_runs, mut native_runs, mut exits) = (Vec::new(), Vec::new(), 0);
    for _ in 0..repetitions {
        let outcome = launch_exited(image.clone(), &request, make_cpu)?;
        vm_runs.push(parse(&outcome.stdout)?);
        exits = outcome
            .stats
            .calls
            .iter()
            .filter(|c| c.nr == Some(CLOCK_GETTIME))
            .map(|c| c.count)
            .sum();
        native_runs.push(parse(&native_stdout(&program, &args)?)?);
    }
    let summary = |runs: &[PerCall]| PerCall {
        syscall_ns: median(runs.iter().map(|r| r.syscall_ns).collect()),
        clock_gettime_ns: median(runs.iter().map(|r| r.clock_gettime_ns).collect()),
    };
    Ok(SyscallsReport {
        calls,
        repetitions,
        vm: summary(&vm_runs),
        native: summary(&native_runs),
        vm_clock_gettime_exits: exits,
    })
}

#[derive(Serialize)]
struct ReportJson {
    calls: u64,
    repetitions: usize,
    vm: PerCall,
    native: PerCall,
    vm_clock_gettime_exits: u64,
}

impl SyscallsReport {
    pub fn table(&self) -> String {
        let mut out = format!(
            "{} calls of each, median of {} runs (nanoseconds per call)\n",
            self.calls, self.repetitions
        );
        let _ = writeln!(
            out,
            "{:<8} {:>22} {:>26}",
            "", "system call (getppid)", "clock_gettime (the vDSO)"
        );
        for (name, r) in [("vm", &self.vm), ("native", &self.native)] {
            let _ = writeln!(
                out,
                "{name:<8} {:>22.1} {:>26.1}",
                r.syscall_ns, r.clock_gettime_ns
            );
        }
        let _ = writeln!(
            out,
            "clock_gettime calls that left the VM: {}",
            self.vm_clock_gettime_exits
        );
        out
    }

    pub fn to_json(&self) -> String {
        let round = |r: PerCall| PerCall {
            syscall_ns: (r.syscall_ns * 10.0).round() / 10.0,
            clock_gettime_ns: (r.clock_gettime_ns * 10.0).round() / 10.0,
        };
        let report = ReportJson {
            calls: self.calls,
            repetitions: self.repetitions,
            vm: round(self.vm),
            native: round(self.native),
            vm_clock_gettime_exits: self.vm_clock_gettime_exits,
        };
        serde_json::to_string(&report).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_prints_both_figures_next_to_native() {
        let report = SyscallsReport {
            calls: 10,
            repetitions: 3,
            vm: PerCall {
                syscall_ns: 6012.34,
                clock_gettime_ns: 31.26,
            },
            native: PerCall {
                syscall_ns: 120.0,
                clock_gettime_ns: 20.0,
            },
            vm_clock_gettime_exits: 0,
        };
        assert_eq!(
            report.to_json(),
            r#"{"calls":10,"repetitions":3,"vm":{"syscall_ns":6012.3,"clock_gettime_ns":31.3},"native":{"syscall_ns":120.0,"clock_gettime_ns":20.0},"vm_clock_gettime_exits":0}"#
        );
        let table = report.table();
        assert!(
            table.contains("6012.3") && table.contains("120.0") && table.contains("left the VM: 0"),
            "{table}"
        );
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
    }
}
