//! `sandfork-vmm bench threads`: two Python threads hand a value back and forth through a
//! `threading.Condition` (10,000 hand-offs by default), timed inside the program so that
//! interpreter start-up is not counted; in a fresh guest and, as the baseline of the same run,
//! with the same binary spawned natively (`bench::PROGRAM`, never a PATH lookup).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::bench::{launch_exited, native_stdout, BenchError, Latency, PROGRAM};
use crate::fs::Image;
use crate::vm::{CpuFactory, RunRequest};

pub const DEFAULT_HANDOFFS: u64 = 10_000;
pub const DEFAULT_REPETITIONS: usize = 5;

/// Prints the seconds its `argv[1]` hand-offs took.
const PING_PONG: &str = r#"
import sys, threading, time
handoffs = int(sys.argv[1])
cond = threading.Condition()
turn = 0
def player(me, turns):
    global turn
    for _ in range(turns):
        with cond:
            while turn != me:
                cond.wait()
            turn = 1 - me
            cond.notify()
other = threading.Thread(target=player, args=(1, handoffs // 2))
start = time.perf_counter()
other.start()
player(0, handoffs - handoffs // 2)
other.join()
print(time.perf_counter() - start)
"#;

#[derive(Debug, Clone, PartialEq)]
pub struct ThreadsReport {
    pub handoffs: u64,
    pub repetitions: usize,
    /// The whole ping-pong per repetition, as the program measured it.
    pub vm: Latency,
    pub native: Latency,
    /// Per hand-off in the guest (the last repetition's): thread switches and system calls.
    pub switches_per_handoff: f64,
    pub syscalls_per_handoff: f64,
    /// Of those switches, the ones that preempted a thread in program code.
    pub preemptions: u64,
}

/// The seconds the program printed.
fn elapsed(stdout: &[u8]) -> Result<Duration, BenchError> {
    let text = String::from_utf8_lossy(stdout);
    let seconds: f64 = text.trim().parse().map_err(|_| {
        BenchError::Native(std::io::Error::other(format!(
            "the ping-pong printed {text:?}, not its time"
        )))
    })?;
    Ok(Duration::from_secs_f64(seconds.max(0.0)))
}

pub fn run(
    image: Arc<Image>,
    handoffs: u64,
    repetitions: usize,
    make_cpu: &CpuFactory,
) -> Result<ThreadsReport, BenchError> {
    if repetitions == 0 || handoffs < 2 {
        return Err(BenchError::NoIterations);
    }
    let args = ["-c".to_owned(), PING_PONG.to_owned(), handoffs.to_string()];
    let mut request = RunRequest::new(PROGRAM, &args);
    request.timeout = Duration::from_secs(600);
    let (mut vm_samples, mut native_samples, mut last) = (Vec::new(), Vec::new(), None);
    for _ in 0..repetitions {
        let outcome = launch_exited(image.clone(), &request, make_cpu)?;
        vm_samples.push(elapsed(&outcome.stdout)?);
        last = Some(outcome.stats);
        native_samples.push(elapsed(&native_stdout(PROGRAM, &args)?)?);
    }
    let stats = last.ok_or(BenchError::NoIterations)?;
    Ok(ThreadsReport {
        handoffs,
        repetitions,
        vm: Latency::of(&vm_samples).ok_or(BenchError::NoIterations)?,
        native: Latency::of(&native_samples).ok_or(BenchError::NoIterations)?,
        switches_per_handoff: stats.threads.switches as f64 / handoffs as f64,
        syscalls_per_handoff: stats.syscalls as f64 / handoffs as f64,
        preemptions: stats.threads.preemptions,
    })
}

impl ThreadsReport {
    fn per_handoff_us(&self, total: Duration) -> f64 {
        total.as_secs_f64() * 1e6 / self.handoffs as f64
    }

    pub fn table(&self) -> String {
        let mut out = format!("Condition ping-pong, {} hand-offs between two threads, {} repetitions (microseconds per hand-off)\n", self.handoffs, self.repetitions);
        let _ = writeln!(out, "{:<8} {:>10} {:>10} {:>10}", "", "p50", "min", "max");
        for (name, l) in [("vm", &self.vm), ("native", &self.native)] {
            let _ = writeln!(
                out,
                "{name:<8} {:>10.1} {:>10.1} {:>10.1}",
                self.per_handoff_us(l.p50),
                self.per_handoff_us(l.min),
                self.per_handoff_us(l.max)
            );
        }
        let _ = writeln!(out, "in the guest, per hand-off: {:.2} thread switches, {:.2} system calls ({} preemptions in all)", self.switches_per_handoff, self.syscalls_per_handoff, self.preemptions);
        out
    }

    pub fn to_json(&self) -> String {
        let round = |v: f64| (v * 100.0).round() / 100.0;
        let report = ReportJson {
            handoffs: self.handoffs,
            repetitions: self.repetitions,
            vm_us_per_handoff_p50: round(self.per_handoff_us(self.vm.p50)),
            native_us_per_handoff_p50: round(self.per_handoff_us(self.native.p50)),
            switches_per_handoff: round(self.switches_per_handoff),
            syscalls_per_handoff: round(self.syscalls_per_handoff),
            preemptions: self.preemptions,
        };
        serde_json::to_string(&report).expect("numbers always serialise")
    }
}

#[derive(Serialize)]
struct ReportJson {
    handoffs: u64,
    repetitions: usize,
    vm_us_per_handoff_p50: f64,
    native_us_per_handoff_p50: f64,
    switches_per_handoff: f64,
    syscalls_per_handoff: f64,
    preemptions: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_native_ping_pong_runs_and_prints_its_time() {
        let args = ["-c".to_owned(), PING_PONG.to_owned(), "200".to_owned()];
        let stdout = native_stdout(PROGRAM, &args).unwrap();
        let took = elapsed(&stdout).unwrap();
        assert!(
            took > Duration::ZERO && took < Duration::from_secs(30),
            "{took:?}"
        );
        assert!(elapsed(b"not a number").is_err());
    }

    #[test]
    fn the_report_is_per_hand_off() {
        let l = |ms| Latency {
            p50: Duration::from_millis(ms),
            p99: Duration::from_millis(ms),
            min: Duration::from_millis(ms),
            max: Duration::from_millis(ms),
        };
        let report = ThreadsReport {
            handoffs: 1000,
            repetitions: 3,
            vm: l(50),
            native: l(10),
            switches_per_handoff: 1.0,
            syscalls_per_handoff: 3.5,
            preemptions: 0,
        };
        assert_eq!(
            report.to_json(),
            r#"{"handoffs":1000,"repetitions":3,"vm_us_per_handoff_p50":50.0,"native_us_per_handoff_p50":10.0,"switches_per_handoff":1.0,"syscalls_per_handoff":3.5,"preemptions":0}"#
        );
        assert!(
            report
                .table()
                .contains("vm             50.0       50.0       50.0"),
            "{}",
            report.table()
        );
    }
}
