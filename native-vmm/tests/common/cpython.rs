//! CPython's own regression tests (Debian's libpython3.11-testsuite) run in the VM: an image of
//! the Python template with the `test` package and the `_test*` extension modules it needs,
//! `python3 -m test MODULE -v` with the tests listed in tests/cpython/skipped.txt left out, and
//! the VM's limits raised to what the suites start (test_queue runs 100 threads at once).

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sandfork_vmm::fs::Image;
use sandfork_vmm::status::RunStatus;

use super::{describe, process_dir, request, run, scaled};

/// The tests left out, as (pattern, reason).
pub fn skipped() -> Vec<(String, String)> {
    let list = include_str!("../cpython/skipped.txt");
    list.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (pattern, reason) = line.split_once("  ").unwrap_or_else(|| panic!("tests/cpython/skipped.txt: no reason given for {line:?}"));
            (pattern.to_owned(), reason.trim().to_owned())
        })
        .collect()
}

/// The Python template's image with the test suite, built once per test process.
pub fn test_image() -> Arc<Image> {
    static IMAGE: OnceLock<Arc<Image>> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            assert!(Path::new("/usr/lib/python3.11/test/test_threading.py").exists(), "CPython's tests are missing: apt-get install libpython3.11-testsuite (scripts/setup-debian.sh)");
            let templates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates/python");
            let mut manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(templates.join("image.json")).unwrap()).unwrap();
            manifest["name"] = "python-cpython-tests".into();
            // The agent is not needed; host paths of the others are absolute.
            manifest["paths"].as_array_mut().unwrap().retain(|p| p.is_string());
            manifest["exclude"].as_array_mut().unwrap().retain(|e| {
                let e = e.as_str().unwrap();
                !(e.ends_with("/test") || e.ends_with("**/tests") || e.contains("/_test"))
            });
            let dir = process_dir("cpython-tests");
            let path = dir.join("image.json");
            std::fs::write(&path, manifest.to_string()).unwrap();
            super::build_image_from(&path, &dir.join("image"))
        })
        .clone()
}

/// What a suite's run printed about itself.
pub struct SuiteRun {
    /// unittest's "Ran N tests" count.
    pub ran: u64,
    /// The suite's own skips (`... skipped 'reason'` lines).
    pub skipped_by_the_suite: Vec<String>,
}

/// unittest's "Ran N tests" count and the suite's own skip lines, from `-v` output.
fn summary(stdout: &str) -> SuiteRun {
    let ran = stdout.lines().find_map(|l| l.strip_prefix("Ran ")).and_then(|l| l.split_whitespace().next()).and_then(|n| n.parse().ok()).unwrap_or(0);
    let skipped_by_the_suite = stdout.lines().filter(|l| l.contains(" ... skipped ")).map(str::to_owned).collect();
    SuiteRun { ran, skipped_by_the_suite }
}

/// Runs `module` natively with /usr/bin/python3.11 and in the VM, both without the tests in
/// skipped.txt, and asserts that it passes in both with the same tests run and the same skips;
/// prints what was not run and why.
pub fn run_suite(module: &str, timeout: Duration) -> SuiteRun {
    let skips = skipped();
    let mut args = vec!["-m", "test", module, "-v"];
    for (pattern, _) in &skips {
        args.extend(["-i", pattern.as_str()]);
    }
    let native = std::process::Command::new("/usr/bin/python3.11").args(&args).current_dir(std::env::temp_dir()).output().expect("running /usr/bin/python3.11");
    let native_stdout = String::from_utf8_lossy(&native.stdout).into_owned();
    assert!(native.status.success(), "{module} natively:\n{native_stdout}");
    let native = summary(&native_stdout);
    let mut req = request("python3", &args);
    req.mem_bytes = 1 << 30;
    req.thread_limit = 256;
    req.timeout = scaled(timeout);
    let outcome = run(&test_image(), &req);
    let stdout = String::from_utf8_lossy(&outcome.stdout).into_owned();
    assert_eq!(outcome.status, RunStatus::Exited { code: 0 }, "{module}: {}", describe(&outcome));
    assert!(stdout.contains("Tests result: SUCCESS"), "{module}:\n{stdout}");
    let SuiteRun { ran, skipped_by_the_suite } = summary(&stdout);
    assert_eq!((ran, &skipped_by_the_suite), (native.ran, &native.skipped_by_the_suite), "{module}: the VM ran other tests than the native run");
    let prefix = format!("test.{module}.");
    eprintln!("{module}: {ran} tests passed in the VM in {:?}", outcome.stats.wall);
    for (pattern, reason) in skips.iter().filter(|(p, _)| p.starts_with(&prefix)) {
        eprintln!("  not run: {pattern}: {reason}");
    }
    for line in &skipped_by_the_suite {
        eprintln!("  skipped by the suite, natively too: {line}");
    }
    assert!(ran > 0, "{module}: no test ran:\n{stdout}");
    SuiteRun { ran, skipped_by_the_suite }
}
