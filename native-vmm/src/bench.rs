//! `sandfork-vmm bench run`: the latency of one short program (`/usr/bin/python3.11 -c pass`) run
//! in a fresh guest, next to the same binary spawned natively on the host as the baseline.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::io;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::fs::Image;
use crate::status::RunStatus;
use crate::vm::{self, CpuFactory, LaunchError, RunOutcome, RunRequest};

/// The measured command: the same binary in the guest and on the host, named by its path. Never
/// a PATH lookup: on our machines `python3` on PATH is a pyenv shell shim, ten times slower to
/// spawn than the interpreter, which would flatter the VM.
pub const PROGRAM: &str = "/usr/bin/python3.11";
pub const ARGS: [&str; 2] = ["-c", "pass"];
pub const DEFAULT_ITERATIONS: usize = 50;

/// Latency percentiles of a series of runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latency {
    pub p50: Duration,
    pub p99: Duration,
    pub min: Duration,
    pub max: Duration,
}

impl Latency {
    /// Nearest-rank percentiles; None for an empty series.
    pub fn of(samples: &[Duration]) -> Option<Latency> {
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        let rank = |p: usize| sorted[((sorted.len() * p).div_ceil(100)).max(1) - 1];
        (!sorted.is_empty()).then(|| Latency {
            p50: rank(50),
            p99: rank(99),
            min: sorted[0],
            max: sorted[sorted.len() - 1],
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchReport {
    pub iterations: usize,
    /// Launch to exit of the program in a fresh guest (memory, load, vCPU, run).
    pub vm: Latency,
    /// The same command spawned on the host (fork+exec+wait).
    pub native: Latency,
    /// Per guest run (the same for every run of a deterministic program; the last run's).
    pub syscalls_per_run: u64,
    pub exits_per_run: u64,
}

#[derive(Debug)]
pub enum BenchError {
    Launch(LaunchError),
    /// The guest program did not exit with code 0.
    GuestFailed {
        status: RunStatus,
        stderr: String,
    },
    /// The native baseline could not be spawned, or did not exit with code 0.
    Native(io::Error),
    NoIterations,
}

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BenchError::Launch(e) => write!(f, "{e}"),
            BenchError::GuestFailed { status, stderr } => write!(
                f,
                "the guest run did not succeed: {status}; stderr: {stderr}"
            ),
            BenchError::Native(e) => write!(f, "native baseline: {e}"),
            BenchError::NoIterations => write!(f, "at least one iteration is needed"),
        }
    }
}

impl std::error::Error for BenchError {}

/// One guest run of a benchmark: `request` in a fresh guest, which must exit with code 0.
pub fn launch_exited(
    image: Arc<Image>,
    request: &RunRequest,
    make_cpu: &CpuFactory,
) -> Result<RunOutcome, BenchError> {
    let outcome = vm::launch(image, request, make_cpu).map_err(BenchError::Launch)?;
    if outcome.status != (RunStatus::Exited { code: 0 }) {
        return Err(BenchError::GuestFailed {
            status: outcome.status,
            stderr: String::from_utf8_lossy(&outcome.stderr).into_owned(),
        });
    }
    Ok(outcome)
}

/// One native baseline run that reports its own figures: `program args` spawned on the host,
/// which must exit with code 0; its stdout.
pub fn native_stdout(program: impl AsRef<OsStr>, args: &[String]) -> Result<Vec<u8>, BenchError> {
    let native = Command::new(program)
        .args(args)
        .output()
        .map_err(BenchError::Native)?;
    if !native.status.success() {
        return Err(BenchError::Native(io::Error::other(format!(
            "exited with {}: {}",
            native.status,
            String::from_utf8_lossy(&native.stderr)
        ))));
    }
    Ok(native.stdout)
}

/// The median of `values` (the lower of the middle two of an even count; 0 for none).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values
        .get(values.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0.0)
}

/// Times `iterations` calls of `run_once`, stopping at the first error.
pub fn time_runs<E>(
    iterations: usize,
    mut run_once: impl FnMut() -> Result<(), E>,
) -> Result<Vec<Duration>, E> {
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let start = Instant::now();
        run_once()?;
        samples.push(start.elapsed());
    }
    Ok(samples)
}

/// The native baseline: spawns `program args` on the host `iterations` times, output discarded.
pub fn measure_native(
    program: &str,
    args: &[&str],
    iterations: usize,
) -> io::Result<Vec<Duration>> {
    time_runs(iterations, || {
        let status = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "`{program} {}` exited with {status}",
                args.join(" ")
            )))
        }
    })
}

/// Runs the benchmark: the guest series first (so a missing backend fails before anything is
/// measured), then the native baseline.
pub fn run(
    image: Arc<Image>,
    iterations: usize,
    make_cpu: &CpuFactory,
) -> Result<BenchReport, BenchError> {
    if iterations == 0 {
        return Err(BenchError::NoIterations);
    }
    let args: Vec<String> = ARGS.iter().map(|s| s.to_string()).collect();
    let request = RunRequest::new(PROGRAM, &args);
    let mut last_stats = None;
    let vm_samples = time_runs(iterations, || {
        last_stats = Some(launch_exited(image.clone(), &request, make_cpu)?.stats);
        Ok(())
    })?;
    let native_samples = measure_native(PROGRAM, &ARGS, iterations).map_err(BenchError::Native)?;
    let stats = last_stats.ok_or(BenchError::NoIterations)?;
    Ok(BenchReport {
        iterations,
        vm: Latency::of(&vm_samples).ok_or(BenchError::NoIterations)?,
        native: Latency::of(&native_samples).ok_or(BenchError::NoIterations)?,
        syscalls_per_run: stats.syscalls,
        exits_per_run: stats.exits,
    })
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

impl BenchReport {
    /// A human-readable table (microseconds).
    pub fn table(&self) -> String {
        let command = format!("{PROGRAM} {}", ARGS.join(" "));
        let mut out = format!("{command}, {} iterations (microseconds)\n", self.iterations);
        let _ = writeln!(
            out,
            "{:<8} {:>10} {:>10} {:>10} {:>10}",
            "", "p50", "p99", "min", "max"
        );
        for (name, l) in [("vm", &self.vm), ("native", &self.native)] {
            let _ = writeln!(
                out,
                "{name:<8} {:>10.0} {:>10.0} {:>10.0} {:>10.0}",
                micros(l.p50),
                micros(l.p99),
                micros(l.min),
                micros(l.max)
            );
        }
        let _ = writeln!(
            out,
            "guest syscalls per run: {}, VM exits per run: {}",
            self.syscalls_per_run, self.exits_per_run
        );
        out
    }

    /// One JSON object (microseconds as numbers, to a tenth).
    pub fn to_json(&self) -> String {
        let report = ReportJson {
            command: format!("{PROGRAM} {}", ARGS.join(" ")),
            iterations: self.iterations,
            vm: LatencyJson::of(&self.vm),
            native: LatencyJson::of(&self.native),
            syscalls_per_run: self.syscalls_per_run,
            exits_per_run: self.exits_per_run,
        };
        serde_json::to_string(&report).expect("numbers and strings always serialise")
    }
}

#[derive(Serialize)]
struct ReportJson {
    command: String,
    iterations: usize,
    vm: LatencyJson,
    native: LatencyJson,
    syscalls_per_run: u64,
    exits_per_run: u64,
}

#[derive(Serialize)]
struct LatencyJson {
    p50_us: f64,
    p99_us: f64,
    min_us: f64,
    max_us: f64,
}

impl LatencyJson {
    fn of(l: &Latency) -> LatencyJson {
        let tenths = |d: Duration| (micros(d) * 10.0).round() / 10.0;
        LatencyJson {
            p50_us: tenths(l.p50),
            p99_us: tenths(l.p99),
            min_us: tenths(l.min),
            max_us: tenths(l.max),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).rev().map(ms).collect();
        let l = Latency::of(&samples).unwrap();
        assert_eq!(
            (l.p50, l.p99, l.min, l.max),
            (ms(50), ms(99), ms(1), ms(100))
        );
        let one = Latency::of(&[ms(7)]).unwrap();
        assert_eq!((one.p50, one.p99), (ms(7), ms(7)));
        let three = Latency::of(&[ms(3), ms(1), ms(2)]).unwrap();
        assert_eq!((three.p50, three.p99), (ms(2), ms(3)));
        assert_eq!(Latency::of(&[]), None);
    }

    #[test]
    fn time_runs_stops_at_the_first_error() {
        let mut calls = 0;
        let result = time_runs(5, || {
            calls += 1;
            if calls == 3 {
                Err("boom")
            } else {
                Ok(())
            }
        });
        assert_eq!(result, Err("boom"));
        assert_eq!(calls, 3);
        assert_eq!(time_runs(4, || Ok::<(), ()>(())).unwrap().len(), 4);
    }

    #[test]
    fn native_baseline_spawns_real_processes_and_reports_failures() {
        assert_eq!(measure_native("/bin/true", &[], 3).unwrap().len(), 3);
        assert!(measure_native("/bin/false", &[], 3).is_err());
        assert!(measure_native("/nonexistent/program", &[], 1).is_err());
    }

    #[test]
    fn report_renders_as_table_and_json() {
        let l = Latency {
            p50: ms(1),
            p99: ms(2),
            min: Duration::from_micros(900),
            max: ms(3),
        };
        let report = BenchReport {
            iterations: 10,
            vm: l,
            native: l,
            syscalls_per_run: 690,
            exits_per_run: 691,
        };
        let json = report.to_json();
        assert!(
            json.starts_with("{\"command\":\"/usr/bin/python3.11 -c pass\",\"iterations\":10,"),
            "{json}"
        );
        assert!(
            json.contains(
                "\"vm\":{\"p50_us\":1000.0,\"p99_us\":2000.0,\"min_us\":900.0,\"max_us\":3000.0}"
            ),
            "{json}"
        );
        assert!(
            json.ends_with("\"syscalls_per_run\":690,\"exits_per_run\":691}"),
            "{json}"
        );
        let table = report.table();
        let vm_row: Vec<&str> = table
            .lines()
            .find(|l| l.starts_with("vm "))
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(vm_row, ["vm", "1000", "2000", "900", "3000"], "{table}");
        assert!(
            table.contains("guest syscalls per run: 690, VM exits per run: 691"),
            "{table}"
        );
    }
}
