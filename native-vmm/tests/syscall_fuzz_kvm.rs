//! The syscall-argument fuzzer (tests/programs/syscall_fuzzer.c, a static C guest built here)
//! on the test CPU: runs of random system call numbers with random and adversarial arguments,
//! each run seeded from one master seed, which is printed (`SANDFORK_FUZZ_SEED=...` replays it).
//! Every run must end with a status within its time limit (no VMM error, panic or hang), and
//! nothing the guest can see may hold the secrets planted in this process, which is the VMM:
//! its environment, its heap and a host file.
//!
//! Budget: `SANDFORK_FUZZ_SECONDS` (default 3: the KVM tier's bounded run); `npm run fuzz`
//! runs it for 300 s, with the readers' fuzz tests at 100,000 cases each.

mod common;

use std::sync::{mpsc, Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use common::{compile, scaled, Linking};
use sandfork_vmm::fs::Image;
use sandfork_vmm::fuzz;
use sandfork_vmm::status::RunStatus;
use sandfork_vmm::vm::{self, RunRequest};

const CALLS_PER_RUN: u64 = 5_000;

fn fuzzer_image() -> Arc<Image> {
    static IMAGE: OnceLock<Arc<Image>> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let out = common::process_dir("fuzzer");
            let binary = compile("syscall_fuzzer", Linking::Static, &out);
            let manifest = format!(r#"{{"name": "fuzzer", "paths": [{{"host": "{}", "guest": "/bin/syscall_fuzzer"}}], "writable_dirs": ["/tmp", "/work"]}}"#, binary.display());
            common::build_image("fuzzer-image", &manifest)
        })
        .clone()
}

/// splitmix64: the seed of run `i` from the master seed.
fn run_seed(master: u64, i: u64) -> u64 {
    let mut z = master.wrapping_add((i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Secrets with the prefix the guest searches for, in the places a VMM bug could copy from.
fn plant_host_secrets() -> Vec<String> {
    let secrets: Vec<String> = ["env", "heap", "file"]
        .iter()
        .map(|place| {
            format!(
                "SFHOST::{place}-{:x}",
                run_seed(std::process::id().into(), 7)
            )
        })
        .collect();
    std::env::set_var("SANDFORK_FUZZ_HOST_SECRET", &secrets[0]);
    Box::leak(secrets[1].repeat(64).into_boxed_str());
    std::fs::write(
        common::process_dir("fuzzer-secret").join("secret"),
        &secrets[2],
    )
    .unwrap();
    secrets
}

#[test]
fn random_system_calls_end_in_a_status_and_never_see_host_data() {
    let master = fuzz::seed();
    let budget = Duration::from_secs(fuzz::env_number("SANDFORK_FUZZ_SECONDS").unwrap_or(3));
    eprintln!("syscall fuzzer: seed {master:#x} (SANDFORK_FUZZ_SEED={master:#x} replays it), budget {budget:?}, {CALLS_PER_RUN} calls a run");
    let secrets = plant_host_secrets();
    let image = fuzzer_image();
    // Short: a run that sleeps (nanosleep, poll or futex with a random time) just times out.
    let limit = scaled(Duration::from_millis(500));
    let started = Instant::now();
    let mut statuses = std::collections::BTreeMap::<&'static str, u64>::new();
    let (mut runs, mut calls) = (0, 0);
    while runs == 0 || started.elapsed() < budget {
        let seed = run_seed(master, runs);
        let mut req = RunRequest::new(
            "/bin/syscall_fuzzer",
            &[format!("{seed:#x}"), CALLS_PER_RUN.to_string()],
        );
        req.timeout = limit;
        req.mem_bytes = 64 << 20;
        let (done, result) = mpsc::channel();
        let image = image.clone();
        let sent = Instant::now();
        thread::spawn(move || {
            let _ =
                done.send(vm::launch(image, &req, &common::test_cpu).map_err(|e| e.to_string()));
        });
        let context = format!("run {runs} (seed {seed:#x}; master seed {master:#x})");
        let outcome = match result.recv_timeout(limit + scaled(Duration::from_secs(10))) {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(e)) => {
                panic!("{context}: the VMM failed instead of ending the run with a status: {e}")
            }
            Err(_) => panic!(
                "{context}: no answer {:?} after its {limit:?} time limit",
                sent.elapsed()
            ),
        };
        let output = [outcome.stdout.as_slice(), outcome.stderr.as_slice()].concat();
        for secret in &secrets {
            assert!(
                !output.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "{context}: the guest's output holds the host secret {secret}"
            );
        }
        assert_ne!(
            outcome.status,
            RunStatus::Exited { code: 99 },
            "{context}: host data reached guest memory: {}",
            String::from_utf8_lossy(&outcome.stdout)
        );
        if let RunStatus::Timeout { .. } = outcome.status {
            assert!(
                sent.elapsed() < limit + scaled(Duration::from_secs(2)),
                "{context}: timed out only after {:?}",
                sent.elapsed()
            );
        }
        let kind = match &outcome.status {
            RunStatus::Unsupported { name, .. } => name,
            other => other.kind(),
        };
        *statuses.entry(kind).or_default() += 1;
        calls += outcome.stats.syscalls;
        runs += 1;
    }
    eprintln!(
        "syscall fuzzer: {runs} runs, {calls} system calls in {:?}; how runs ended: {statuses:?}",
        started.elapsed()
    );
    assert!(statuses.values().sum::<u64>() == runs);
}
