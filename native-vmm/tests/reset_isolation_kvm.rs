//! A reset VM is indistinguishable from a fresh fork: one execution plants a secret everywhere
//! a program can (memory, files, env, argv, fds, registers, stack, FS base, signals), the next
//! looks for it everywhere (`daemon::isolation`). On the KVM vCPU, through the daemon's
//! executor: on a warm pool of one VM (the search runs on the VM the plant ran on, reset) and
//! with no pool (each execution on a fresh fork).

mod daemon_support;

use std::path::PathBuf;
use std::sync::OnceLock;

use daemon_support::{limits, scratch};
use sandfork_vmm::agent::PYTHON_AGENT;
use sandfork_vmm::daemon::agent_executor::AgentExecutor;
use sandfork_vmm::daemon::executor::{ExecutionLimits, VmOrigin};
use sandfork_vmm::daemon::{isolation, templates};
use sandfork_vmm::fs::Image;

/// A templates directory with the Python template's image and its snapshot, built once.
fn snapshot_templates() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("isolation-templates");
        let template = dir.join("python");
        let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates/python/image.json");
        sandfork_vmm::image::build(&manifest, &template).unwrap_or_else(|e| panic!("building the Python image: {e}"));
        let image = Image::open(&template).unwrap();
        sandfork_vmm::snapshot::build(image, "python", &PYTHON_AGENT, limits().memory_bytes(), &sandfork_vmm::kvm::new_cpu, &template).unwrap_or_else(|e| panic!("building the snapshot: {e}"));
        dir
    })
}

fn check_limits() -> ExecutionLimits {
    ExecutionLimits { timeout_ms: daemon_support::scaled_ms(60_000), ..limits() }
}

#[test]
fn a_reset_vm_keeps_nothing_of_the_execution_before() {
    let executor = AgentExecutor::with_kvm(templates::load(snapshot_templates()).unwrap(), 1).unwrap();
    let origins = isolation::run(&executor, "python", check_limits()).unwrap_or_else(|leak| panic!("{leak}"));
    assert_eq!(origins, [VmOrigin::Fresh, VmOrigin::Reset { resets: 1 }, VmOrigin::Reset { resets: 2 }], "all three on one VM");
}

#[test]
fn a_fresh_fork_keeps_nothing_of_the_execution_before() {
    let executor = AgentExecutor::with_kvm(templates::load(snapshot_templates()).unwrap(), 0).unwrap();
    let origins = isolation::run(&executor, "python", check_limits()).unwrap_or_else(|leak| panic!("{leak}"));
    assert_eq!(origins, [VmOrigin::Fresh; 3]);
}
