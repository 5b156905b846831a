//! CPython's own regression tests (Debian's libpython3.11-testsuite) run in the VM: an image of
//! the Python template with the `test` package and the `_test*` extension modules it needs,
//! `python3 -m test MODULE -v` with the tests listed in tests/cpython/skipped.txt left out, and
//! the VM's limits raised to what the suites start (test_queue runs 100 threads at once).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use sandfork_vmm::fs::Image;
use sandfork_vmm::status::RunStatus;

use super::{describe, process_dir, request, run, scaled, unprivileged};

/// The tests left out, as (pattern, reason).
pub fn skipped() -> Vec<(String, String)> {
    let list = include_str!("../cpython/skipped.txt");
    list.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (pattern, reason) = line.split_once("  ").unwrap_or_else(|| {
                panic!("tests/cpython/skipped.txt: no reason given for {line:?}")
            });
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
            // The agent is not needed; the template's own files are named from its folder.
            let paths = manifest["paths"].as_array_mut().unwrap();
            paths.retain(|p| p["guest"] != "/opt/sandfork/agent.py");
            for path in paths.iter_mut().filter(|p| p.is_object()) {
                path["host"] = templates.join(path["host"].as_str().unwrap()).to_str().unwrap().into();
            }
            // The tests, and the extension modules only tests load (_testcapi, _ctypes_test,
            // xxlimited...: the template leaves out every one it names in lib-dynload).
            manifest["exclude"].as_array_mut().unwrap().retain(|e| {
                let e = e.as_str().unwrap();
                !(e.ends_with("/test") || e.ends_with("**/tests") || e.contains("/lib-dynload/"))
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
    let ran = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Ran "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let skipped_by_the_suite = stdout
        .lines()
        .filter(|l| l.contains(" ... skipped "))
        .map(str::to_owned)
        .collect();
    SuiteRun {
        ran,
        skipped_by_the_suite,
    }
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
    let native = std::process::Command::new("/usr/bin/python3.11")
        .args(&args)
        .current_dir(std::env::temp_dir())
        .output()
        .expect("running /usr/bin/python3.11");
    let native_stdout = String::from_utf8_lossy(&native.stdout).into_owned();
    assert!(
        native.status.success(),
        "{module} natively:\n{native_stdout}"
    );
    let native = summary(&native_stdout);
    let mut req = request("python3", &args);
    req.mem_bytes = 1 << 30;
    req.thread_limit = 256;
    req.timeout = scaled(timeout);
    let outcome = run(&test_image(), &req);
    let stdout = String::from_utf8_lossy(&outcome.stdout).into_owned();
    assert_eq!(
        outcome.status,
        RunStatus::Exited { code: 0 },
        "{module}: {}",
        describe(&outcome)
    );
    assert!(
        stdout.contains("Tests result: SUCCESS"),
        "{module}:\n{stdout}"
    );
    let SuiteRun {
        ran,
        skipped_by_the_suite,
    } = summary(&stdout);
    assert_eq!(
        (ran, &skipped_by_the_suite),
        (native.ran, &native.skipped_by_the_suite),
        "{module}: the VM ran other tests than the native run"
    );
    let prefix = format!("test.{module}.");
    eprintln!(
        "{module}: {ran} tests passed in the VM in {:?}",
        outcome.stats.wall
    );
    for (pattern, reason) in skips.iter().filter(|(p, _)| p.starts_with(&prefix)) {
        eprintln!("  not run: {pattern}: {reason}");
    }
    for line in &skipped_by_the_suite {
        eprintln!("  skipped by the suite, natively too: {line}");
    }
    assert!(ran > 0, "{module}: no test ran:\n{stdout}");
    SuiteRun {
        ran,
        skipped_by_the_suite,
    }
}

/// How one test ended in a run of tests/cpython/record_results.py.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestResult {
    Passed,
    Failed,
    Skipped,
}

/// Every test's result, and the reason of a failure or skip, from the "@@sandfork STATUS ID
/// [| REASON]" lines of record_results.py (a test with a failed subtest, or reported twice,
/// keeps its worst result).
pub fn test_results(stderr: &str) -> BTreeMap<String, (TestResult, String)> {
    let mut results = BTreeMap::new();
    for line in stderr.lines() {
        let Some((status, rest)) = line
            .strip_prefix("@@sandfork ")
            .and_then(|l| l.split_once(' '))
        else {
            continue;
        };
        let (id, detail) = rest.split_once(" | ").unwrap_or((rest, ""));
        let result = match status {
            "pass" => TestResult::Passed,
            "skip" => TestResult::Skipped,
            _ => TestResult::Failed,
        };
        let entry = results
            .entry(id.to_owned())
            .or_insert((result, detail.to_owned()));
        if result == TestResult::Failed && entry.0 != TestResult::Failed {
            *entry = (result, detail.to_owned());
        }
    }
    results
}

/// One module run natively and in the VM.
pub struct ModuleComparison {
    pub module: String,
    /// Tests that passed natively.
    pub native_passed: BTreeSet<String>,
    /// Of those, the ones that did not pass in the VM, with what the VM run said of them
    /// (None: never reported, the run ended first).
    pub lost: BTreeMap<String, Option<(TestResult, String)>>,
    /// How the VM run ended, its wall time, and the native run's.
    pub vm_status: RunStatus,
    pub vm_wall: Duration,
    pub native_wall: Duration,
    /// The VM run's output, for the report.
    pub vm_output: String,
}

impl ModuleComparison {
    /// Native passes that also pass in the VM.
    pub fn kept(&self) -> usize {
        self.native_passed.len() - self.lost.len()
    }
}

/// The modules of tests/cpython/modules.txt: all of them, or only those marked `short`.
pub fn compat_modules(short_only: bool) -> Vec<String> {
    include_str!("../cpython/modules.txt")
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter(|line| !short_only || line.split_whitespace().nth(1) == Some("short"))
        .map(|line| line.split_whitespace().next().unwrap().to_owned())
        .collect()
}

/// Runs `module` with record_results.py natively (/usr/bin/python3.11, the guest's
/// environment, in /tmp) and in the VM at the same time, and compares them test by test.
pub fn compare_module(module: &str, timeout: Duration) -> ModuleComparison {
    const DRIVER: &str = include_str!("../cpython/record_results.py");
    let args = ["-c", DRIVER, module];
    let (native, vm) = std::thread::scope(|scope| {
        let native = scope.spawn(|| {
            let started = Instant::now();
            let mut cmd = std::process::Command::new("/usr/bin/python3.11");
            cmd.args(args)
                .env_clear()
                .envs(
                    sandfork_vmm::vm::DEFAULT_ENV
                        .iter()
                        .filter_map(|kv| kv.split_once('=')),
                )
                .current_dir("/tmp");
            unprivileged(&mut cmd);
            let output = cmd.output().expect("running /usr/bin/python3.11");
            (output, started.elapsed())
        });
        let mut req = request("python3", &args);
        req.mem_bytes = 1 << 30;
        req.thread_limit = 256;
        req.output_cap = 64 << 20;
        req.timeout = scaled(timeout);
        let vm = run(&test_image(), &req);
        (native.join().unwrap(), vm)
    });
    let (native, native_wall) = native;
    let native_results = test_results(&String::from_utf8_lossy(&native.stderr));
    let vm_results = test_results(&String::from_utf8_lossy(&vm.stderr));
    let native_passed: BTreeSet<String> = native_results
        .iter()
        .filter(|(_, r)| r.0 == TestResult::Passed)
        .map(|(id, _)| id.clone())
        .collect();
    let lost = native_passed
        .iter()
        .filter(|id| vm_results.get(*id).map(|r| r.0) != Some(TestResult::Passed))
        .map(|id| (id.clone(), vm_results.get(id).cloned()))
        .collect();
    ModuleComparison {
        module: module.to_owned(),
        native_passed,
        lost,
        vm_status: vm.status.clone(),
        vm_wall: vm.stats.wall,
        native_wall,
        vm_output: format!(
            "{}\n{}",
            String::from_utf8_lossy(&vm.stdout),
            String::from_utf8_lossy(&vm.stderr)
        ),
    }
}

/// The share `kept / of` as a percentage with one decimal ("-" when nothing passed natively).
pub fn share(kept: usize, of: usize) -> String {
    if of == 0 {
        "-".to_owned()
    } else {
        format!("{:.1}%", 100.0 * kept as f64 / of as f64)
    }
}

/// The header of `print_row`'s table.
pub fn print_header() {
    println!(
        "{:<28} {:>7} {:>7} {:>7} {:>8} {:>8}  VM run",
        "module", "native", "in VM", "share", "native s", "VM s"
    );
}

/// One module's line: native passes, how many of them pass in the VM, the share, both times
/// and how the VM run ended; its VM output goes to `report_dir`/MODULE.log.
pub fn print_row(r: &ModuleComparison, report_dir: &Path) {
    std::fs::create_dir_all(report_dir).unwrap();
    std::fs::write(report_dir.join(format!("{}.log", r.module)), &r.vm_output).unwrap();
    println!(
        "{:<28} {:>7} {:>7} {:>7} {:>8.1} {:>8.1}  {}",
        r.module,
        r.native_passed.len(),
        r.kept(),
        share(r.kept(), r.native_passed.len()),
        r.native_wall.as_secs_f64(),
        r.vm_wall.as_secs_f64(),
        r.vm_status
    );
}

/// Prints the total and writes every lost test with its VM result to `report_dir`/lost.txt.
/// Returns (kept, native passes).
pub fn print_total(results: &[ModuleComparison], report_dir: &Path) -> (usize, usize) {
    let mut lost_list = String::new();
    for r in results {
        for (id, result) in &r.lost {
            let result = result
                .as_ref()
                .map_or("not run (the run had ended)".to_owned(), |(r, why)| {
                    format!("{r:?} {why}")
                });
            lost_list.push_str(&format!("{id}  {result}\n"));
        }
    }
    let kept: usize = results.iter().map(ModuleComparison::kept).sum();
    let of: usize = results.iter().map(|r| r.native_passed.len()).sum();
    let full = results.iter().filter(|r| r.lost.is_empty()).count();
    println!(
        "total: {kept} of {of} native passes pass in the VM: {} ({full} of {} modules fully)",
        share(kept, of),
        results.len()
    );
    std::fs::write(report_dir.join("lost.txt"), lost_list).unwrap();
    println!(
        "tests that pass natively but not in the VM: {}",
        report_dir.join("lost.txt").display()
    );
    (kept, of)
}
