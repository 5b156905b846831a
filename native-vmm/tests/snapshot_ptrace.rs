//! Template snapshots end to end on the test CPU (`common::test_cpu`: KVM in the KVM tier): the
//! Python template is booted to its agent's ready point, recorded to a file, loaded and
//! verified, and restored into independent VMs that serve requests. On KVM a restored VM's
//! memory is the product's copy-on-write fork of the template (`ForkMemory::CopyOnWrite`); the
//! ptrace CPU copies it (`ForkMemory::Copy`: its traced child shares the memory, which a private
//! mapping cannot be). Timings printed here are figures of the path the test ran on.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{describe, fork_memory, process_dir, python_image, restore_cpu, scaled, test_cpu};
use sandfork_vmm::agent::{AgentCommand, AgentRequest, PYTHON_AGENT};
use sandfork_vmm::memory::GuestMemory;
use sandfork_vmm::process::OutputSink;
use sandfork_vmm::snapshot::{
    self, BuildOutcome, ForkMemory, Template, TemplateError, TEMPLATE_FILE,
};
use sandfork_vmm::status::RunStatus;
use sandfork_vmm::vm::{self, RunLimits, RunOutcome};

const MEM_BYTES: u64 = vm::DEFAULT_MEM_BYTES;

fn limits() -> RunLimits {
    RunLimits {
        mem_bytes: MEM_BYTES,
        timeout: scaled(Duration::from_secs(20)),
        output_cap: 1 << 20,
        boot_timeout: scaled(vm::AGENT_BOOT_TIMEOUT),
        ..RunLimits::default()
    }
}

/// Checks a restored VM's count of copied pages: a full copy holds every stored page; a
/// copy-on-write fork copies some (the pages it wrote) but far from all.
fn assert_pages_copied(pages_copied: u64, how: ForkMemory) {
    let stored = template().stored().stored_bytes;
    match how {
        ForkMemory::Copy => assert!(
            pages_copied * 4096 >= stored,
            "a full copy holds every stored page: {pages_copied}"
        ),
        ForkMemory::CopyOnWrite => assert!(
            pages_copied > 0 && pages_copied * 4096 < stored,
            "a fork copies only the pages it wrote: {pages_copied} of {stored} bytes"
        ),
    }
}

/// The Python template, built once per test process; the first build's outcome is kept.
fn template_dir() -> &'static (PathBuf, BuildOutcome) {
    static BUILT: OnceLock<(PathBuf, BuildOutcome)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = process_dir("snapshot").join("python");
        let outcome = snapshot::build(
            python_image(),
            "python",
            &PYTHON_AGENT,
            &limits(),
            &test_cpu,
            &dir,
        )
        .unwrap_or_else(|e| panic!("building the template: {e}"));
        eprintln!("{outcome}");
        (dir, outcome)
    })
}

fn template() -> &'static Template {
    static LOADED: OnceLock<Template> = OnceLock::new();
    LOADED.get_or_init(|| {
        Template::load(&template_dir().0, python_image(), &PYTHON_AGENT)
            .unwrap_or_else(|e| panic!("loading the template: {e}"))
    })
}

fn serve(code: &str) -> RunOutcome {
    let restored = snapshot::serve_restored(
        template(),
        fork_memory(),
        &restore_cpu,
        AgentRequest::new(code),
        &limits(),
    )
    .unwrap_or_else(|e| panic!("serving a restored VM: {e}"));
    assert_pages_copied(restored.pages_copied, fork_memory());
    restored.outcome
}

fn stdout(outcome: &RunOutcome) -> String {
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(outcome)
    );
    String::from_utf8_lossy(&outcome.stdout).into_owned()
}

#[test]
fn the_first_build_boots_and_records_the_agent() {
    match &template_dir().1 {
        BuildOutcome::Built {
            file_bytes,
            memory,
            boot,
            ..
        } => {
            assert!(boot.syscalls > 100, "{boot:?}");
            assert!(
                memory.stored_bytes > 1 << 20 && memory.stored_bytes < MEM_BYTES,
                "{memory:?}"
            );
            assert!(*file_bytes > memory.stored_bytes);
        }
        other => panic!("a fresh directory must be built: {other}"),
    }
}

#[test]
fn restored_vms_serve_requests() {
    for _ in 0..2 {
        let outcome = serve("print(1+1)");
        assert_eq!(stdout(&outcome), "2\n");
        assert!(
            outcome.stats.syscalls < 200,
            "only the request's calls are counted: {:?}",
            outcome.stats.calls
        );
    }
    let outcome = serve("import json, sys\nprint(json.dumps({'argv': sys.argv}))\nsys.exit(3)");
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 3 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "{\"argv\": [\"main.py\"]}\n"
    );
}

fn host_ns(clock: i32) -> i64 {
    let (sec, nsec) = sandfork_vmm::sys::clock_time(clock).unwrap();
    sec * 1_000_000_000 + nsec
}

/// glibc found the vDSO when the template booted and kept its pointers in the snapshot; a fork
/// reads the current time through them (not the snapshot's: the clock's data page is the
/// VMM's, shown in every fork), with no VM exit per read on KVM; its CPU time starts at zero.
#[test]
fn a_fork_reads_the_current_time_through_the_templates_vdso() {
    template();
    std::thread::sleep(Duration::from_millis(100));
    let code = "import time\nt, m = time.time_ns(), time.monotonic_ns()\nfor _ in range(20000): time.monotonic()\nprint(t, m, time.monotonic_ns() >= m, time.process_time() < 1)";
    let (real_before, mono_before) = (
        host_ns(libc::CLOCK_REALTIME),
        host_ns(libc::CLOCK_MONOTONIC) + sandfork_vmm::vdso::clock::guest_shift_ns(),
    );
    let outcome = serve(code);
    let (real_after, mono_after) = (
        host_ns(libc::CLOCK_REALTIME),
        host_ns(libc::CLOCK_MONOTONIC) + sandfork_vmm::vdso::clock::guest_shift_ns(),
    );
    let printed = stdout(&outcome);
    let values: Vec<&str> = printed.split_whitespace().collect();
    // process_time counts from the fork, not the host thread's earlier work (template builds).
    let [real, mono, "True", "True"] = values[..] else {
        panic!("{}", describe(&outcome))
    };
    let (real, mono): (i64, i64) = (real.parse().unwrap(), mono.parse().unwrap());
    const SLACK: i64 = 1_000_000;
    assert!(
        real_before - SLACK <= real && real <= real_after + SLACK,
        "realtime {real} is not between the host's {real_before} and {real_after}"
    );
    assert!(
        mono_before - SLACK <= mono && mono <= mono_after + SLACK,
        "monotonic {mono} is not between the host's {mono_before} and {mono_after}"
    );
    if common::cpu_kind() == common::TestCpu::Kvm {
        let exits: u64 = outcome
            .stats
            .calls
            .iter()
            .filter(|c| c.name == Some("clock_gettime"))
            .map(|c| c.count)
            .sum();
        assert!(
            exits < 100,
            "{exits} clock_gettime calls left the VM for 20,000 reads"
        );
    }
}

#[test]
fn restored_vms_draw_their_own_randomness() {
    let code = "import os, random\nprint(random.random(), os.urandom(8).hex())";
    let runs: Vec<String> = (0..3).map(|_| stdout(&serve(code))).collect();
    assert!(
        runs[0] != runs[1] && runs[1] != runs[2] && runs[0] != runs[2],
        "{runs:?}"
    );
    let firsts: Vec<&str> = runs
        .iter()
        .map(|r| r.split_whitespace().next().unwrap_or(""))
        .collect();
    assert!(
        firsts[0] != firsts[1] && firsts[0] != firsts[2] && firsts[1] != firsts[2],
        "random.random() repeated: {firsts:?}"
    );
}

#[test]
fn files_written_in_one_vm_are_seen_by_no_other() {
    let write =
        "open('/tmp/left-behind', 'w').write('secret')\nprint(open('/tmp/left-behind').read())";
    let check = "import os\nprint(os.path.exists('/tmp/left-behind'), sorted(os.listdir('/tmp')))";
    assert_eq!(stdout(&serve(write)), "secret\n");
    assert_eq!(stdout(&serve(check)), "False []\n", "a later restore");
}

/// Guest memory of two restored VMs at once: a write in one is in neither the other nor the
/// template.
#[test]
fn memory_written_in_one_vm_is_not_in_another() {
    let template = template();
    let (mem_a, mem_b) = (
        template.new_memory(fork_memory()).unwrap(),
        template.new_memory(fork_memory()).unwrap(),
    );
    let vm_a = template.ready_guest(
        &mem_a,
        restore_cpu(&mem_a, template.cpu()).unwrap(),
        1 << 20,
    );
    let vm_b = template.ready_guest(
        &mem_b,
        restore_cpu(&mem_b, template.cpu()).unwrap(),
        1 << 20,
    );
    let marker = b"restored-vm-A-was-here";
    let code = format!(
        "import ctypes\nb = ctypes.create_string_buffer(b{:?} * 64)\nprint(ctypes.addressof(b))",
        std::str::from_utf8(marker).unwrap()
    );
    let a = vm_a
        .serve(AgentRequest::new(&code), scaled(Duration::from_secs(20)))
        .unwrap();
    let addr: u64 = stdout(&a).trim().parse().unwrap();
    assert_eq!(
        mem_a.read_vec(addr, marker.len() as u64).unwrap(),
        marker,
        "the write is in A's memory"
    );
    assert_ne!(
        mem_b.read_vec(addr, marker.len() as u64).unwrap(),
        marker,
        "not in B's"
    );
    let mut in_template = vec![0u8; marker.len()];
    template.memory().read(addr, &mut in_template).unwrap();
    assert_ne!(in_template, marker, "not in the template's");
    let b = vm_b
        .serve(
            AgentRequest::new("print('b')"),
            scaled(Duration::from_secs(20)),
        )
        .unwrap();
    assert_eq!(stdout(&b), "b\n");
}

/// The product's fork of the memory alone: private copy-on-write mappings of the real template's
/// memory; and how long creating one takes for this 256 MiB template.
#[test]
fn copy_on_write_forks_of_the_template_are_private_and_cheap() {
    let template = template();
    assert_eq!(template.memory().size(), 256 << 20);
    let (start, _) = *template.memory().data_extents().last().unwrap();
    let (a, b) = (
        template.new_memory(ForkMemory::CopyOnWrite).unwrap(),
        template.new_memory(ForkMemory::CopyOnWrite).unwrap(),
    );
    let original = a.read_u64(start).unwrap();
    assert_eq!(
        b.read_u64(start).unwrap(),
        original,
        "a fork reads the template's bytes"
    );
    a.write_u64(start, !original).unwrap();
    assert_eq!(a.read_u64(start).unwrap(), !original);
    assert_eq!(
        b.read_u64(start).unwrap(),
        original,
        "another fork does not see the write"
    );
    let mut word = [0u8; 8];
    template.memory().read(start, &mut word).unwrap();
    assert_eq!(u64::from_le_bytes(word), original, "nor does the template");

    const FORKS: usize = 1000;
    let mut times = Vec::with_capacity(FORKS);
    for _ in 0..FORKS {
        let started = Instant::now();
        let fork = GuestMemory::fork_of(template.memory()).unwrap();
        times.push(started.elapsed());
        drop(fork);
    }
    times.sort();
    let (p50, p99) = (times[FORKS / 2], times[FORKS * 99 / 100]);
    eprintln!("copy-on-write fork of the 256 MiB template's memory (mmap MAP_PRIVATE|MAP_NORESERVE), {FORKS} forks: p50 {p50:?}, p99 {p99:?}");
    assert!(
        p50 < Duration::from_millis(1),
        "p50 {p50:?}: a fork must copy nothing"
    );

    // Counting the pages a fork copied (for `usage.pages_copied`): a walk of /proc/self/pagemap.
    let fork = GuestMemory::fork_of(template.memory()).unwrap();
    for page in 0..5 {
        fork.write_u64(start + page * 4096, 1).unwrap();
    }
    let started = Instant::now();
    assert_eq!(fork.copied_pages().unwrap(), Some(5));
    eprintln!(
        "counting the copied pages of a 256 MiB fork: {:?}",
        started.elapsed()
    );
}

fn corrupt(contents: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut copy = contents.to_vec();
    edit(&mut copy);
    copy
}

#[test]
fn damaged_or_mismatched_templates_are_refused_with_typed_errors() {
    let contents = std::fs::read(template_dir().0.join(TEMPLATE_FILE)).unwrap();
    let image = python_image();
    let load =
        |bytes: &[u8]| Template::from_file_contents(bytes, image.clone(), &PYTHON_AGENT).err();
    assert!(load(&contents).is_none(), "the intact file loads");

    let flipped = corrupt(&contents, |c| {
        let middle = c.len() / 2;
        c[middle] ^= 0x40;
    });
    assert!(
        matches!(load(&flipped), Some(TemplateError::Corrupted(ref why)) if why.contains("content hash")),
        "{:?}",
        load(&flipped)
    );
    let truncated = &contents[..contents.len() - 1000];
    match load(truncated) {
        Some(TemplateError::Truncated { expected, actual }) => assert_eq!(
            (expected, actual),
            (contents.len() as u64, truncated.len() as u64)
        ),
        other => panic!("expected Truncated, got {other:?}"),
    }
    assert!(matches!(
        load(&contents[..10]),
        Some(TemplateError::Truncated { .. })
    ));
    let future = corrupt(&contents, |c| {
        c[8..12].copy_from_slice(&(snapshot::FORMAT_VERSION + 1).to_le_bytes())
    });
    assert!(
        matches!(load(&future), Some(TemplateError::VersionMismatch { found, expected }) if found == expected + 1)
    );
    assert!(matches!(
        load(b"#!/bin/sh\necho not a template\n"),
        Some(TemplateError::NotATemplate)
    ));
    let trailing = corrupt(&contents, |c| c.push(0));
    assert!(matches!(load(&trailing), Some(TemplateError::Corrupted(_))));

    let other_image = common::build_image(
        "snapshot-other-image",
        r#"{"name": "other", "paths": ["/usr/bin/true"], "writable_dirs": ["/tmp"]}"#,
    );
    match Template::from_file_contents(&contents, other_image.clone(), &PYTHON_AGENT) {
        Err(TemplateError::ImageMismatch { template, image }) => assert_eq!(
            (template, image),
            (python_image().content_hash(), other_image.content_hash())
        ),
        other => panic!("expected ImageMismatch, got {:?}", other.err()),
    }
    let other_agent = AgentCommand {
        cwd: sandfork_vmm::fs::WORK_DIR,
        program: "python3",
        argv: &[
            "python3",
            "-I",
            "-X",
            "dev",
            sandfork_vmm::agent::PYTHON_AGENT_PATH,
        ],
    };
    assert!(matches!(
        Template::from_file_contents(&contents, image.clone(), &other_agent).err(),
        Some(TemplateError::AgentMismatch)
    ));
    for error in [
        TemplateError::NotATemplate,
        TemplateError::VersionMismatch {
            found: 9,
            expected: 1,
        },
        TemplateError::AgentMismatch,
    ] {
        assert!(error.to_string().len() > 20, "{error}");
    }
}

/// A template is rebuilt only when what it was built from changes (or it is damaged).
#[test]
fn builds_are_skipped_while_image_agent_and_memory_size_are_unchanged() {
    let (dir, _) = template_dir();
    let again = snapshot::build(
        python_image(),
        "python",
        &PYTHON_AGENT,
        &limits(),
        &test_cpu,
        dir,
    )
    .unwrap();
    assert!(matches!(again, BuildOutcome::UpToDate { .. }), "{again}");

    // A damaged copy of the template is rebuilt, and the rebuilt one is kept next time.
    let copy = process_dir("snapshot-rebuild");
    let mut contents = std::fs::read(dir.join(TEMPLATE_FILE)).unwrap();
    let last = contents.len() - 1;
    contents[last] ^= 1;
    std::fs::write(copy.join(TEMPLATE_FILE), &contents).unwrap();
    let build = |dir: &Path| {
        snapshot::build(
            python_image(),
            "python",
            &PYTHON_AGENT,
            &limits(),
            &test_cpu,
            dir,
        )
        .unwrap()
    };
    assert!(matches!(build(&copy), BuildOutcome::Built { .. }));
    assert!(matches!(build(&copy), BuildOutcome::UpToDate { .. }));
    // Another memory size is another template.
    let smaller = snapshot::build(
        python_image(),
        "python",
        &PYTHON_AGENT,
        &RunLimits {
            mem_bytes: MEM_BYTES / 2,
            ..limits()
        },
        &test_cpu,
        &copy,
    )
    .unwrap();
    assert!(matches!(smaller, BuildOutcome::Built { .. }), "{smaller}");
}

/// Boot to the ready point against restore to exit, for print(1+1), on the test CPU's path
/// (product figures only on a native /dev/kvm).
#[test]
fn timings_of_boot_and_restore() {
    let template = template();
    let mut boots = Vec::new();
    let mut restores = Vec::new();
    // Three on a native /dev/kvm; one where a boot takes ~15 s (the QEMU path).
    for _ in 0..common::repetitions(3, 1) {
        let started = Instant::now();
        vm::boot_agent(python_image(), &PYTHON_AGENT, &limits(), &test_cpu, |_| ()).unwrap();
        boots.push(started.elapsed());
        let started = Instant::now();
        let outcome = snapshot::serve_restored(
            template,
            fork_memory(),
            &restore_cpu,
            AgentRequest::new("print(1+1)"),
            &limits(),
        )
        .unwrap()
        .outcome;
        restores.push((started.elapsed(), outcome.stats.load));
        assert_eq!(stdout(&outcome), "2\n");
    }
    boots.sort();
    restores.sort();
    let median = boots.len() / 2;
    eprintln!(
        "{} CPU, median of {}: boot to ready point {:?}; restore (memory copy + vCPU) to exit of print(1+1) {:?}, of which restoring {:?}",
        common::cpu_name(),
        boots.len(),
        boots[median],
        restores[median].0,
        restores[median].1
    );
    assert!(
        restores[median].0 < boots[median],
        "a restore must beat a boot"
    );
}

/// The daemon's executor restores from a template folder's snapshot (on the test CPU, with its
/// way of making memory), boots when the request asks for another memory size, and refuses to
/// start on a damaged snapshot.
#[test]
fn the_daemon_executor_restores_from_a_template_folders_snapshot() {
    use sandfork_vmm::daemon::agent_executor::AgentExecutor;
    use sandfork_vmm::daemon::executor::{ExecuteRequest, ExecutionLimits, Executor};
    use sandfork_vmm::daemon::templates;

    let templates_dir = process_dir("snapshot-daemon");
    let folder = templates_dir.join("python");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates/python/image.json");
    sandfork_vmm::image::build(&manifest, &folder).unwrap();
    std::fs::copy(
        template_dir().0.join(TEMPLATE_FILE),
        folder.join(TEMPLATE_FILE),
    )
    .unwrap();
    let loaded = templates::load(&templates_dir).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        loaded[0].snapshot.is_some(),
        "the snapshot in the folder is loaded"
    );
    let executor = AgentExecutor::new(loaded, Box::new(test_cpu), None)
        .booting_within(scaled(vm::AGENT_BOOT_TIMEOUT))
        .restoring(std::sync::Arc::new(restore_cpu), fork_memory());

    let request = |memory_mib| ExecuteRequest {
        template: "python".into(),
        agent_request: AgentRequest::new("import sys\nprint(sum(range(10)))"),
        limits: ExecutionLimits {
            timeout_ms: common::scaled_ms(20_000),
            memory_mib,
            output_bytes: 1 << 20,
            processes: sandfork_vmm::process::DEFAULT_PROCESS_LIMIT,
        },
        stream: false,
        defaulted: Default::default(),
    };
    let restored = executor
        .execute(request(MEM_BYTES >> 20), OutputSink::none())
        .unwrap_or_else(|e| panic!("{e}"));
    let booted = executor
        .execute(request(MEM_BYTES >> 19), OutputSink::none())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_pages_copied(restored.usage.pages_copied, fork_memory());
    assert_eq!(booted.usage.pages_copied, 0);
    for execution in [&restored, &booted] {
        assert_eq!(
            (&execution.status, execution.stdout.as_slice()),
            (&RunStatus::Exited { code: 0 }, &b"45\n"[..])
        );
    }
    eprintln!(
        "daemon executor on the {} CPU: VM from the snapshot in {:?}, booted VM in {:?}",
        common::cpu_name(),
        restored.vm_setup,
        booted.vm_setup
    );
    assert!(
        restored.vm_setup < booted.vm_setup,
        "restored {:?}, booted {:?}",
        restored.vm_setup,
        booted.vm_setup
    );

    let mut damaged = std::fs::read(folder.join(TEMPLATE_FILE)).unwrap();
    damaged[100] ^= 1;
    std::fs::write(folder.join(TEMPLATE_FILE), &damaged).unwrap();
    match templates::load(&templates_dir) {
        Err(e) => assert!(e.to_string().contains("template file is corrupted"), "{e}"),
        Ok(_) => panic!("a damaged snapshot must stop the daemon from starting"),
    }
}

/// The `bench fork` measurement on the test CPU (product figures only on a native /dev/kvm).
#[test]
fn fork_bench_times_memory_vcpu_and_serve() {
    let report = snapshot::bench::measure(template(), fork_memory(), &restore_cpu, 3)
        .unwrap_or_else(|e| panic!("{e}"));
    eprint!(
        "{} CPU, {:?} memory: {report}",
        common::cpu_name(),
        fork_memory()
    );
    assert_eq!(report.iterations, 3);
    assert!(
        report.fork.p50 >= report.memory.p50 && report.fork.p50 >= report.vcpu.p50,
        "{report}"
    );
    assert!(report.serve.min > Duration::ZERO, "{report}");
}
