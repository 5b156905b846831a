//! `sandfork-vmm bench processes`: what making processes costs in the sandbox, against the same
//! program run natively in the same run (`bench::PROGRAM`, never a PATH lookup). One Python
//! program times each workload inside itself (interpreter start-up is not counted) and prints
//! the median of its repetitions:
//!
//! - fork, execve of /bin/true and wait (os.fork, os.execv, os.waitpid: what a C caller does);
//! - `subprocess.run(["/bin/true"])`;
//! - `os.fork()` + `os._exit(0)` + wait of a process holding 100 MiB it has written;
//! - a four-stage shell pipeline over 1 MiB;
//! - `multiprocessing.Pool(4).map` of 1,000 small tasks.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use crate::bench::{launch_exited, native_stdout, BenchError, PROGRAM};
use crate::fs::Image;
use crate::vm::{CpuFactory, RunRequest};

pub const DEFAULT_REPETITIONS: u64 = 20;

/// Times each workload `argv[1]` times; prints one JSON object of median seconds (null for a
/// workload that failed, with its error on stderr).
const WORKLOADS: &str = r#"
import json, os, statistics, subprocess, sys, time
reps = int(sys.argv[1])
def fork_exec_wait():
    pid = os.fork()
    if pid == 0:
        try:
            os.execv("/bin/true", ["true"])
        finally:
            os._exit(127)
    os.waitpid(pid, 0)
def subprocess_run():
    subprocess.run(["/bin/true"], check=True)
held = None
def fork_holding():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
def pipeline():
    out = subprocess.run("head -c 1048576 /dev/zero | tr '\\0' a | cat | wc -c", shell=True,
                         check=True, capture_output=True).stdout
    assert out.strip() == b"1048576", out
def pool_map():
    import multiprocessing
    with multiprocessing.get_context("fork").Pool(4) as pool:
        assert sum(pool.map(abs, range(1000))) == 499500
timings = {}
for name, work in [("fork_exec_wait", fork_exec_wait), ("subprocess_run", subprocess_run),
                   ("fork_100mib", fork_holding), ("pipeline_1mib", pipeline),
                   ("pool_map_1000", pool_map)]:
    if name == "fork_100mib":
        held = bytearray(100 << 20)
        for i in range(0, len(held), 4096):
            held[i] = 1
    samples = []
    try:
        for _ in range(reps if name != "pool_map_1000" else max(1, reps // 10)):
            start = time.perf_counter()
            work()
            samples.append(time.perf_counter() - start)
        timings[name] = statistics.median(samples)
    except Exception as e:
        print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
        timings[name] = None
    held = None
print(json.dumps(timings))
"#;

/// The workloads, in the order they are reported.
pub const NAMES: [&str; 5] = [
    "fork_exec_wait",
    "subprocess_run",
    "fork_100mib",
    "pipeline_1mib",
    "pool_map_1000",
];

#[derive(Debug, Clone, PartialEq)]
pub struct ProcessesReport {
    pub repetitions: u64,
    /// (workload, VM median, native median); None where the workload failed there.
    pub rows: Vec<(&'static str, Option<Duration>, Option<Duration>)>,
}

fn medians(stdout: &[u8]) -> Result<serde_json::Map<String, serde_json::Value>, BenchError> {
    let text = String::from_utf8_lossy(stdout);
    serde_json::from_str(text.trim()).map_err(|_| {
        BenchError::Native(std::io::Error::other(format!(
            "the workloads printed {text:?}, not their timings"
        )))
    })
}

fn seconds(map: &serde_json::Map<String, serde_json::Value>, name: &str) -> Option<Duration> {
    map.get(name)
        .and_then(serde_json::Value::as_f64)
        .map(|s| Duration::from_secs_f64(s.max(0.0)))
}

pub fn run(
    image: Arc<Image>,
    repetitions: u64,
    make_cpu: &CpuFactory,
) -> Result<ProcessesReport, BenchError> {
    if repetitions == 0 {
        return Err(BenchError::NoIterations);
    }
    let args = [
        "-c".to_owned(),
        WORKLOADS.to_owned(),
        repetitions.to_string(),
    ];
    let mut request = RunRequest::new(PROGRAM, &args);
    request.timeout = Duration::from_secs(600);
    request.mem_bytes = 512 << 20;
    let outcome = launch_exited(image, &request, make_cpu)?;
    let vm = medians(&outcome.stdout)?;
    let native = medians(&native_stdout(PROGRAM, &args)?)?;
    Ok(ProcessesReport {
        repetitions,
        rows: NAMES
            .iter()
            .map(|&name| (name, seconds(&vm, name), seconds(&native, name)))
            .collect(),
    })
}

impl ProcessesReport {
    pub fn table(&self) -> String {
        let mut out = format!(
            "Processes, median of {} repetitions (pool_map: a tenth), timed inside the program (ms)\n",
            self.repetitions
        );
        let _ = writeln!(
            out,
            "{:<16} {:>10} {:>10} {:>8}",
            "", "vm", "native", "ratio"
        );
        let ms = |d: Option<Duration>| {
            d.map_or("failed".to_owned(), |d| {
                format!("{:.3}", d.as_secs_f64() * 1e3)
            })
        };
        for (name, vm, native) in &self.rows {
            let ratio = match (vm, native) {
                (Some(v), Some(n)) if !n.is_zero() => {
                    format!("{:.2}x", v.as_secs_f64() / n.as_secs_f64())
                }
                _ => "-".to_owned(),
            };
            let _ = writeln!(
                out,
                "{name:<16} {:>10} {:>10} {ratio:>8}",
                ms(*vm),
                ms(*native)
            );
        }
        out
    }

    pub fn to_json(&self) -> String {
        let ms = |d: Option<Duration>| d.map(|d| (d.as_secs_f64() * 1e6).round() / 1e3);
        let rows: serde_json::Map<String, serde_json::Value> = self
            .rows
            .iter()
            .map(|(name, vm, native)| {
                (
                    (*name).to_owned(),
                    serde_json::json!({"vm_ms": ms(*vm), "native_ms": ms(*native)}),
                )
            })
            .collect();
        serde_json::json!({"repetitions": self.repetitions, "workloads": rows}).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workloads_run_natively_and_print_every_timing() {
        let args = ["-c".to_owned(), WORKLOADS.to_owned(), "2".to_owned()];
        let stdout = native_stdout(PROGRAM, &args).unwrap();
        let map = medians(&stdout).unwrap();
        for name in NAMES {
            assert!(seconds(&map, name).is_some(), "{name}: {map:?}");
        }
        assert!(medians(b"not json").is_err());
    }

    #[test]
    fn the_report_shows_ratios_and_failures() {
        let report = ProcessesReport {
            repetitions: 3,
            rows: vec![
                (
                    "fork_exec_wait",
                    Some(Duration::from_millis(2)),
                    Some(Duration::from_millis(1)),
                ),
                ("pool_map_1000", None, Some(Duration::from_millis(5))),
            ],
        };
        let table = report.table();
        assert!(table.contains("2.00x"), "{table}");
        assert!(table.contains("failed"), "{table}");
        assert!(report.to_json().contains("\"vm_ms\":null"));
    }
}
