//! `sandfork-vmm bench fork`: how long a VM takes to come out of a template, split into its
//! memory (the copy-on-write fork), its vCPU (a VM with the snapshot's registers) and serving
//! it a trivial request (`pass`) from the hand-off to the agent's exit.

use std::fmt;
use std::time::{Duration, Instant};

use super::{ForkMemory, RestoreFactory, Template};
use crate::agent::AgentRequest;
use crate::bench::Latency;
use crate::status::RunStatus;
use crate::vm::{LaunchError, DEFAULT_OUTPUT_CAP};

/// The code every measured VM runs.
pub const CODE: &str = "pass";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkReport {
    pub iterations: usize,
    pub how: ForkMemory,
    /// New guest memory from the template.
    pub memory: Latency,
    /// The vCPU restored on it.
    pub vcpu: Latency,
    /// The VM ready to be handed a request: memory, vCPU and the copy of the template's
    /// VMM-side process state.
    pub fork: Latency,
    /// Hand-off to exit of `pass`, including the first touches of the template's pages.
    pub serve: Latency,
}

/// Creates `iterations` VMs of `template`, serves each `CODE`, and times the steps.
pub fn measure(
    template: &Template,
    how: ForkMemory,
    make_cpu: &RestoreFactory,
    iterations: usize,
) -> Result<ForkReport, LaunchError> {
    let (mut memory, mut vcpu, mut fork, mut serve) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..iterations {
        let started = Instant::now();
        let mem = template.new_memory(how).map_err(LaunchError::Memory)?;
        let mapped = Instant::now();
        let cpu = make_cpu(&mem, template.cpu()).map_err(LaunchError::Cpu)?;
        let restored = Instant::now();
        let ready = template.ready_guest(&mem, cpu, DEFAULT_OUTPUT_CAP);
        let ready_at = Instant::now();
        let outcome = ready.serve(AgentRequest::new(CODE), Duration::from_secs(10))?;
        let served = ready_at.elapsed();
        if outcome.status != (RunStatus::Exited { code: 0 }) {
            let reason = format!(
                "`{CODE}` ended with {} in a restored VM; stderr: {}",
                outcome.status,
                String::from_utf8_lossy(&outcome.stderr)
            );
            return Err(LaunchError::AgentNotReady { reason });
        }
        memory.push(mapped - started);
        vcpu.push(restored - mapped);
        fork.push(ready_at - started);
        serve.push(served);
    }
    let latency = |samples: &[Duration]| {
        Latency::of(samples).ok_or_else(|| {
            LaunchError::Memory(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no iterations",
            ))
        })
    };
    Ok(ForkReport {
        iterations,
        how,
        memory: latency(&memory)?,
        vcpu: latency(&vcpu)?,
        fork: latency(&fork)?,
        serve: latency(&serve)?,
    })
}

impl fmt::Display for ForkReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} VMs from the template, each served `{CODE}`:",
            self.iterations
        )?;
        writeln!(
            f,
            "{:<28} {:>12} {:>12} {:>12} {:>12}",
            "", "p50", "p99", "min", "max"
        )?;
        let memory = match self.how {
            ForkMemory::CopyOnWrite => "memory (copy-on-write fork)",
            ForkMemory::Copy => "memory (full copy)",
        };
        for (name, l) in [
            (memory, &self.memory),
            ("vCPU restore", &self.vcpu),
            ("fork (VM ready)", &self.fork),
            ("serve (hand-off to exit)", &self.serve),
        ] {
            writeln!(
                f,
                "{name:<28} {:>12?} {:>12?} {:>12?} {:>12?}",
                l.p50, l.p99, l.min, l.max
            )?;
        }
        Ok(())
    }
}
