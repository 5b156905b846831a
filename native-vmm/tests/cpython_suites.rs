//! CPython's threading-related regression suites in the VM (`common::cpython`), each passing
//! as it passes natively, without the tests tests/cpython/skipped.txt lists (with why). Not part of the KVM tier (test_queue and test_threading take minutes in the VM):
//! `npm run test:cpython`. The tier runs test_thread and test_threading_local (threads_kvm.rs).

mod common;

use std::time::Duration;

use common::cpython::run_suite;

/// One test per suite, named as the suite, with its time limit in seconds.
macro_rules! suites {
    ($($suite:ident: $seconds:expr),* $(,)?) => {
        $(
            #[test]
            fn $suite() {
                run_suite(stringify!($suite), Duration::from_secs($seconds));
            }
        )*
    };
}

suites! {
    test_threading: 900,
    test_queue: 900,
    test_concurrent_futures: 900,
    test_thread: 300,
    test_threading_local: 300,
}
