//! A daemon serving the Python template from its snapshot through the warm pool, as `serve`
//! runs it: the production executor (`AgentExecutor`) with the template's real image, agent and
//! snapshot, over a real Unix socket, on the test CPU (`common::test_cpu` and
//! `common::restore_cpu`: KVM with copy-on-write forks in the KVM tier; the ptrace CPU copies
//! the template's memory instead). Used by the test binaries that declare `mod common;` and
//! `mod daemon_support;` beside it.

#![allow(dead_code)] // each test binary uses its own subset of these helpers

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::common;
use crate::daemon_support::{scratch, Running};
use sandfork_vmm::agent::PYTHON_AGENT;
use sandfork_vmm::daemon::agent_executor::{AgentExecutor, SharedRestoreFactory};
use sandfork_vmm::daemon::server::ServerConfig;
use sandfork_vmm::daemon::templates;
use sandfork_vmm::fs::Image;
use sandfork_vmm::snapshot;
use sandfork_vmm::vm;

/// A templates directory holding the Python template with its snapshot, built once per test
/// process (the snapshot's memory size is the daemon's default request size, 256 MiB).
pub fn templates_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("pool-templates");
        let folder = dir.join("python");
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates/python/image.json");
        sandfork_vmm::image::build(&manifest, &folder)
            .unwrap_or_else(|e| panic!("building the Python image: {e}"));
        let image = Image::open(&folder).unwrap_or_else(|e| panic!("{e}"));
        snapshot::build(
            image,
            "python",
            &PYTHON_AGENT,
            &crate::daemon_support::boot_limits(vm::DEFAULT_MEM_BYTES),
            &common::test_cpu,
            &folder,
        )
        .unwrap_or_else(|e| panic!("building the template: {e}"));
        dir
    })
}

/// A daemon whose executor keeps `pool_size` VMs of the template ready (0: restores a VM for
/// each request on the request's thread).
pub fn start(tag: &str, pool_size: usize, config: ServerConfig) -> Running {
    start_restoring(tag, pool_size, config, Arc::new(common::restore_cpu))
}

/// `start`, its VMs restored by `restore` (a wrapper of `common::restore_cpu`).
pub fn start_restoring(
    tag: &str,
    pool_size: usize,
    config: ServerConfig,
    restore: Arc<SharedRestoreFactory>,
) -> Running {
    let templates = templates::load(templates_dir()).unwrap_or_else(|e| panic!("{e}"));
    assert!(templates[0].snapshot.is_some());
    let executor = AgentExecutor::new(templates, Box::new(common::test_cpu), None)
        .restoring(restore, common::fork_memory())
        .pooled(pool_size)
        .unwrap_or_else(|e| panic!("starting the pool: {e}"));
    Running::start(&scratch(tag), Arc::new(executor), config)
}
