//! Small C programs (tests/programs/) run end to end on the test CPU (`common::test_cpu`: KVM in
//! the KVM tier): the real ELF loader, syscall layer and file image.

mod common;

use std::sync::{Arc, OnceLock};

use common::{compile, describe, request, run, Linking};
use sandfork_vmm::fs::Image;
use sandfork_vmm::status::RunStatus;

/// The C programs, compiled once per test process, in an image of their own at /bin/<name>.
fn programs_image() -> Arc<Image> {
    static IMAGE: OnceLock<Arc<Image>> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let out = common::process_dir("programs");
            let programs = [
                ("hello", Linking::Static),
                ("hello", Linking::Dynamic),
                ("segfault", Linking::Static),
                ("illegal_instruction", Linking::Static),
                ("divide_by_zero", Linking::Static),
                ("threads", Linking::Static),
                ("threads", Linking::Dynamic),
                ("vdso_clock", Linking::Static),
                ("vdso_clock", Linking::Dynamic),
            ];
            let paths: Vec<String> = programs
                .iter()
                .map(|&(name, linking)| {
                    let binary = compile(name, linking, &out);
                    let file = binary
                        .file_name()
                        .and_then(|f| f.to_str())
                        .expect("program names are UTF-8");
                    format!(
                        r#"{{"host": "{}", "guest": "/bin/{file}"}}"#,
                        binary.display()
                    )
                })
                .collect();
            let manifest = format!(
                r#"{{"name": "c-programs", "paths": [{}], "writable_dirs": ["/tmp", "/work"]}}"#,
                paths.join(", ")
            );
            common::build_image("programs-image", &manifest)
        })
        .clone()
}

fn run_hello(program: &str, args: &[&str], stdin: &[u8]) -> sandfork_vmm::vm::RunOutcome {
    let mut req = request(program, args);
    req.stdin = stdin.to_vec();
    run(&programs_image(), &req)
}

#[test]
fn static_hello_prints_its_arguments_and_stdin() {
    let outcome = run_hello("/bin/hello-static", &[], b"from the host\n");
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "hello from /bin/hello-static\nstdin: from the host\n"
    );
    assert_eq!(outcome.stderr, b"bye\n");
}

/// tests/programs/threads.c: pthread_create/join, TLS, a condition-variable ping-pong, a
/// thread spinning without system calls (only preemption stops it), tgkill to itself.
#[test]
fn c_threads_join_hand_off_and_are_preempted() {
    for program in ["/bin/threads-static", "/bin/threads-dynamic"] {
        let outcome = run_hello(program, &[], b"");
        assert_eq!(
            outcome.status,
            RunStatus::Exited { code: 0 },
            "{program}: {}",
            describe(&outcome)
        );
        assert_eq!(
            String::from_utf8_lossy(&outcome.stdout),
            "join tls tids: 1, main tls 99
ping-pong: 1000 rounds, turn 0
spinner stopped: 1
tgkill self 0: 0
"
        );
        let threads = outcome.stats.threads;
        assert_eq!((threads.created, threads.refused), (7, 0), "{threads:?}");
        assert!(
            threads.switches >= 2000,
            "the ping-pong switches every round: {threads:?}"
        );
        assert!(
            threads.preemptions >= 1,
            "the spinner makes no system call: {threads:?}"
        );
    }
}

#[test]
fn static_hello_exit_code_comes_back() {
    let outcome = run_hello("/bin/hello-static", &["one", "two words"], b"");
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 3 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "hello from /bin/hello-static\narg 1: one\narg 2: two words\n"
    );
}

#[test]
fn dynamic_hello_runs_through_the_interpreter() {
    let outcome = run_hello("hello-dynamic", &["x"], b"line\n");
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 3 },
        "{}",
        describe(&outcome)
    );
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "hello from hello-dynamic\narg 1: x\nstdin: line\n"
    );
    assert_eq!(outcome.stderr, b"bye\n");
}

fn crash_of(program: &str) -> sandfork_vmm::status::GuestFault {
    let outcome = run_hello(program, &[], b"");
    match outcome.status {
        RunStatus::Crashed { fault } => fault,
        _ => panic!("expected a crash\n{}", describe(&outcome)),
    }
}

#[test]
fn null_write_crashes_with_a_page_fault_at_address_zero() {
    let fault = crash_of("/bin/segfault-static");
    assert_eq!((fault.vector, fault.address), (14, Some(0)), "{fault:?}");
    assert!(
        fault.rip >= 0x40_0000,
        "rip {:#x} lies in the program",
        fault.rip
    );
}

#[test]
fn ud2_crashes_with_an_invalid_opcode() {
    let fault = crash_of("/bin/illegal_instruction-static");
    assert_eq!(fault.vector, 6, "{fault:?}");
    assert_eq!(RunStatus::Crashed { fault }.exit_code(), 132);
}

#[test]
fn division_by_zero_crashes_with_a_divide_error() {
    let fault = crash_of("/bin/divide_by_zero-static");
    assert_eq!(fault.vector, 0, "{fault:?}");
}

fn host_ns(clock: i32) -> i64 {
    let (sec, nsec) = sandfork_vmm::sys::clock_time(clock).unwrap();
    sec * 1_000_000_000 + nsec
}

/// The vDSO (src/vdso): glibc's clock_gettime, gettimeofday and time answered in the guest,
/// static and dynamic: the same clock as the host's (bracketed by host reads before and after
/// the run), monotonic never backwards across 200,000 vDSO reads and the raw system calls
/// between them, and no VM exit for the vDSO reads (only the raw calls reach the VMM). On the
/// ptrace CPU the vDSO has no data page and makes the system calls itself.
#[test]
fn the_vdso_clock_is_the_hosts_and_needs_no_exit() {
    const READS: u64 = 200_000;
    for program in ["/bin/vdso_clock-static", "/bin/vdso_clock-dynamic"] {
        let (real_before, mono_before) = (
            host_ns(libc::CLOCK_REALTIME),
            host_ns(libc::CLOCK_MONOTONIC) + sandfork_vmm::vdso::clock::guest_shift_ns(),
        );
        let outcome = run(
            &programs_image(),
            &request(program, &["check", &READS.to_string()]),
        );
        let (real_after, mono_after) = (
            host_ns(libc::CLOCK_REALTIME),
            host_ns(libc::CLOCK_MONOTONIC) + sandfork_vmm::vdso::clock::guest_shift_ns(),
        );
        assert_eq!(
            outcome.status,
            RunStatus::Exited { code: 0 },
            "{program}: {}",
            describe(&outcome)
        );
        let stdout = String::from_utf8_lossy(&outcome.stdout).into_owned();
        let words: Vec<&str> = stdout.split_whitespace().collect();
        let field = |name: &str| -> i64 {
            let at = words
                .iter()
                .position(|w| *w == name)
                .unwrap_or_else(|| panic!("{program}: no {name} in {stdout}"));
            words[at + 1]
                .parse()
                .unwrap_or_else(|_| panic!("{program}: {name} is {}", words[at + 1]))
        };
        assert_eq!(
            words.get(1),
            Some(&"0xfe000"),
            "{program}: AT_SYSINFO_EHDR names the vDSO: {stdout}"
        );
        assert_eq!(words.last(), Some(&"ok"), "{program}: {stdout}");
        const SLACK: i64 = 1_000_000;
        let within = |name: &str, value: i64, before: i64, after: i64| {
            assert!(
                before - SLACK <= value && value <= after + SLACK,
                "{program}: {name} {value} is not between the host's {before} and {after}"
            );
        };
        within("realtime", field("realtime"), real_before, real_after);
        within(
            "gettimeofday",
            field("gettimeofday") * 1000,
            real_before,
            real_after,
        );
        within(
            "time",
            field("time") * 1_000_000_000,
            real_before - 1_000_000_000,
            real_after,
        );
        within("monotonic", field("monotonic"), mono_before, mono_after);
        assert!(
            field("boottime") >= field("monotonic") - SLACK,
            "{program}: {stdout}"
        );
        assert_eq!(field("getcpu"), 0);
        let calls = |name: &str| {
            outcome
                .stats
                .calls
                .iter()
                .filter(|c| c.name == Some(name))
                .map(|c| c.count)
                .sum::<u64>()
        };
        let raw = READS / 100;
        if common::cpu_kind() == common::TestCpu::Kvm {
            assert!(
                calls("clock_gettime") <= raw + 2,
                "{program}: {} clock_gettime calls reached the VMM for {raw} raw ones",
                calls("clock_gettime")
            );
            assert_eq!((calls("gettimeofday"), calls("time")), (0, 0), "{program}");
        }
    }
}
