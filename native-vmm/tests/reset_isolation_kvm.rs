//! A reset VM is indistinguishable from a fresh fork: one execution plants a secret everywhere
//! a program can (memory, files, env, argv, fds, registers, stack, FS base, signals), the next
//! looks for it everywhere (`daemon::isolation`). On the KVM vCPU, through the daemon's
//! executor: on a warm pool of one VM (the search runs on the VM the plant ran on, reset) and
//! with no pool (each execution on a fresh fork).

mod daemon_support;

use daemon_support::{limits, snapshot_templates_dir};
use sandfork_vmm::daemon::agent_executor::AgentExecutor;
use sandfork_vmm::daemon::executor::{ExecutionLimits, VmOrigin};
use sandfork_vmm::daemon::{isolation, templates};
use sandfork_vmm::process::OutputSink;

/// What a VM of the template reaches at its start: where the search looks.
fn reachable() -> Vec<(u64, u64)> {
    let loaded = templates::load(snapshot_templates_dir()).unwrap();
    let template = loaded[0]
        .snapshot
        .as_ref()
        .expect("the template has a snapshot");
    sandfork_vmm::kvm::reachable_memory(template.handed_out(), template.identity().mem_bytes)
}

fn check_limits() -> ExecutionLimits {
    ExecutionLimits {
        timeout_ms: daemon_support::scaled_ms(60_000),
        ..limits()
    }
}

#[test]
fn a_reset_vm_keeps_nothing_of_the_execution_before() {
    let executor =
        AgentExecutor::with_kvm(templates::load(snapshot_templates_dir()).unwrap(), 1).unwrap();
    let origins = isolation::run(&executor, "python", check_limits(), &reachable())
        .unwrap_or_else(|leak| panic!("{leak}"));
    assert_eq!(
        origins,
        [
            VmOrigin::Fresh,
            VmOrigin::Reset { resets: 1 },
            VmOrigin::Reset { resets: 2 }
        ],
        "all three on one VM"
    );
}

#[test]
fn a_fresh_fork_keeps_nothing_of_the_execution_before() {
    let executor =
        AgentExecutor::with_kvm(templates::load(snapshot_templates_dir()).unwrap(), 0).unwrap();
    let origins = isolation::run(&executor, "python", check_limits(), &reachable())
        .unwrap_or_else(|leak| panic!("{leak}"));
    assert_eq!(origins, [VmOrigin::Fresh; 3]);
}

/// `usage.pages_copied` of a reset VM counts only what its request newly copied: a repeat of
/// a request copies nothing (its pages are warm, and the count skips the scan when the run
/// took no page fault), a request that fills 8 MiB of new memory copies at least those pages,
/// and after its reset the same small request again copies nothing. A pooled VM is warmed up
/// before its first request (an empty program, then a reset): that request copies less than
/// half of what it copies on a fresh fork that no pool warmed.
#[test]
fn a_reset_vm_counts_only_the_pages_its_request_copied() {
    use sandfork_vmm::agent::AgentRequest;
    use sandfork_vmm::daemon::executor::{ExecuteRequest, Executor};
    let pooled =
        AgentExecutor::with_kvm(templates::load(snapshot_templates_dir()).unwrap(), 1).unwrap();
    let unpooled =
        AgentExecutor::with_kvm(templates::load(snapshot_templates_dir()).unwrap(), 0).unwrap();
    let run_on = |executor: &AgentExecutor, code: &str| {
        let request = ExecuteRequest {
            template: "python".to_owned(),
            agent_request: AgentRequest::new(code),
            limits: check_limits(),
            stream: false,
            defaulted: Default::default(),
        };
        let execution = executor
            .execute(request, OutputSink::none())
            .unwrap_or_else(|e| panic!("{code}: {e}"));
        assert_eq!(String::from_utf8_lossy(&execution.stderr), "", "{code}");
        (execution.vm, execution.usage.pages_copied)
    };
    let run = |code: &str| run_on(&pooled, code);
    let small = "print(1+1)";
    let big = "b = bytearray(8 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint(sum(b))";
    let (first, first_pages) = run(small);
    assert_eq!(first, VmOrigin::Fresh);
    let (unwarmed, unwarmed_pages) = run_on(&unpooled, small);
    assert_eq!(unwarmed, VmOrigin::Fresh);
    assert!(
        unwarmed_pages > 0,
        "a fresh fork copies the pages it writes"
    );
    eprintln!("pages copied by print(1+1): {first_pages} on a warmed pooled VM, {unwarmed_pages} on a fresh fork");
    assert!(
        first_pages * 2 < unwarmed_pages,
        "the pool's warm-up copied most of them: {first_pages} against {unwarmed_pages}"
    );
    assert_eq!(run(small), (VmOrigin::Reset { resets: 1 }, 0));
    let (origin, big_pages) = run(big);
    assert_eq!(origin, VmOrigin::Reset { resets: 2 });
    assert!(
        big_pages >= 2048,
        "8 MiB of new memory is at least 2048 new copies: {big_pages}"
    );
    assert_eq!(run(small), (VmOrigin::Reset { resets: 3 }, 0));
}
