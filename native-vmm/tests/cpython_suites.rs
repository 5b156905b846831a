//! CPython's threading-related regression suites in the VM (`common::cpython`), each passing
//! as it passes natively, without the tests tests/cpython/skipped.txt lists (they need another
//! process). Not part of the KVM tier (test_queue and test_threading take minutes in the VM):
//! `npm run test:cpython`. The tier runs test_thread and test_threading_local (threads_kvm.rs).

mod common;

use std::time::Duration;

use common::cpython::run_suite;

#[test]
fn test_threading() {
    run_suite("test_threading", Duration::from_secs(900));
}

#[test]
fn test_queue() {
    run_suite("test_queue", Duration::from_secs(900));
}

#[test]
fn test_concurrent_futures() {
    run_suite("test_concurrent_futures", Duration::from_secs(900));
}

#[test]
fn test_thread() {
    run_suite("test_thread", Duration::from_secs(300));
}

#[test]
fn test_threading_local() {
    run_suite("test_threading_local", Duration::from_secs(300));
}
