//! How much slower than native the program tests' guests run on this path of the KVM tier.
//!
//! `SANDFORK_TEST_TIME_SCALE` (a whole number, default 1) is set by scripts/kvm-tier.sh: 1 on a
//! native /dev/kvm, ~15 inside the QEMU guest (TCG runs guest code ~13x slower, a VM exit ~60 us
//! instead of ~1-27 us). Budgets that only guard against a hang (a run's time limit, a wait for a
//! daemon or a pool) and wall-clock bounds are multiplied by it; a limit that is itself under test
//! (e.g. "times out at 300 ms") is not, only the slack allowed around it.
//!
//! Shared by tests/common and tests/daemon_support (included there with `#[path]`).

#![allow(dead_code)]

use std::sync::OnceLock;
use std::time::Duration;

/// The factor from SANDFORK_TEST_TIME_SCALE; an unparsable or zero value fails the test.
pub fn time_scale() -> u32 {
    static SCALE: OnceLock<u32> = OnceLock::new();
    *SCALE.get_or_init(|| match std::env::var("SANDFORK_TEST_TIME_SCALE") {
        Err(_) => 1,
        Ok(text) => match text.trim().parse::<u32>() {
            Ok(n) if n >= 1 => n,
            _ => panic!("SANDFORK_TEST_TIME_SCALE={text}: expected a whole number >= 1"),
        },
    })
}

/// `budget` on this path: `budget * time_scale()`.
pub fn scaled(budget: Duration) -> Duration {
    budget * time_scale()
}

/// The default limits with an agent boot of `vm::AGENT_BOOT_TIMEOUT` on this path, for VMs of
/// `mem_bytes` (what template builds in tests use).
pub fn boot_limits(mem_bytes: u64) -> sandfork_vmm::vm::RunLimits {
    sandfork_vmm::vm::RunLimits {
        mem_bytes,
        boot_timeout: scaled(sandfork_vmm::vm::AGENT_BOOT_TIMEOUT),
        ..Default::default()
    }
}

/// `ms` milliseconds on this path, for limits given in milliseconds.
pub fn scaled_ms(ms: u64) -> u64 {
    ms * u64::from(time_scale())
}

/// How many times to repeat a measurement or how large to make a burst whose size is not itself
/// under test: `native` on a native /dev/kvm, divided by the time scale on a slower path, never
/// below `floor` (what the test's checks need) nor above `native`.
pub fn repetitions(native: u64, floor: u64) -> u64 {
    (native / u64::from(time_scale())).max(floor).min(native)
}
