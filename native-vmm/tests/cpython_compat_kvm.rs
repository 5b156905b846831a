//! Linux compatibility measured by CPython's own regression tests: each module of
//! tests/cpython/modules.txt runs natively and in the VM (`common::cpython::compare_module`),
//! and the share of the tests passing natively that also pass in the VM is printed per module
//! and in total.
//!
//! The KVM tier runs the modules marked `short` and requires every native pass to pass in the
//! VM. `npm run test:cpython-compat` runs all of them (SANDFORK_CPYTHON_MODULES=all, or a
//! space-separated list of modules) and prints the figures; the tests left failing are in the
//! report directory it names, and README's compatibility section says why.

mod common;

use std::time::Duration;

use common::cpython::{compare_module, compat_modules, print_header, print_row, print_total};

/// One module's limit in the VM (test_unittest and test_asyncio.test_events take minutes);
/// SANDFORK_CPYTHON_MODULE_LIMIT_S sets another, for the modules that need longer
/// (test_multiprocessing_fork and _spawn start processes in every test).
const MODULE_LIMIT: Duration = Duration::from_secs(900);

fn module_limit() -> Duration {
    match std::env::var("SANDFORK_CPYTHON_MODULE_LIMIT_S") {
        Ok(seconds) => Duration::from_secs(seconds.trim().parse().unwrap_or_else(|_| {
            panic!("SANDFORK_CPYTHON_MODULE_LIMIT_S={seconds:?} is not a number of seconds")
        })),
        Err(_) => MODULE_LIMIT,
    }
}

#[test]
fn native_passes_pass_in_the_vm() {
    let chosen = std::env::var("SANDFORK_CPYTHON_MODULES").unwrap_or_default();
    let (modules, short) = match chosen.trim() {
        "" => (compat_modules(true), true),
        "all" => (compat_modules(false), false),
        list => (list.split_whitespace().map(str::to_owned).collect(), false),
    };
    let limit = module_limit();
    let report = common::process_dir("cpython-compat");
    print_header();
    let results: Vec<_> = modules
        .iter()
        .map(|m| {
            let r = compare_module(m, limit);
            print_row(&r, &report);
            r
        })
        .collect();
    let (kept, of) = print_total(&results, &report);
    assert!(of > 0, "no test passed natively");
    if short {
        for r in &results {
            assert!(
                r.lost.is_empty(),
                "{}: native passes that fail in the VM ({}): {:?}\n{}",
                r.module,
                r.vm_status,
                r.lost,
                r.vm_output
            );
        }
        assert_eq!(kept, of);
    }
}
