//! How many VMs one process can hold at once, as far as the host's per-process limits go: each
//! VM holds `FDS_PER_VM` file descriptors (its VM and its vCPU: neither can be closed while the
//! VM lives, the VM's to change memory slots, the vCPU's to run) and `MAPPINGS_PER_VM` memory
//! mappings. The open-file limit (RLIMIT_NOFILE) is raised here as far as the process may; the
//! mapping limit (vm.max_map_count) is the host's, only read.

use std::io;

use crate::sys;

/// File descriptors a VM holds.
pub const FDS_PER_VM: u64 = 2;

/// Host memory mappings an idle VM of a template holds: its guest memory (with the vDSO clock's
/// page shown over it, which splits that mapping in three) and its vCPU's run page.
pub const MAPPINGS_PER_VM: u64 = 4;

/// The kernel's ceiling on any open-file limit.
const NR_OPEN: &str = "/proc/sys/fs/nr_open";
const MAX_MAP_COUNT: &str = "/proc/sys/vm/max_map_count";

/// The open-file limits to ask for, from the current `(soft, hard)`, the number of open files
/// `wanted` and the kernel's ceiling `nr_open`: the soft limit up to the hard one, and both up to
/// `wanted` when that is above the hard limit (only a process with CAP_SYS_RESOURCE may).
fn limits_for(current: (u64, u64), wanted: u64, nr_open: u64) -> (u64, u64) {
    let (soft, hard) = current;
    let hard = hard.max(wanted.min(nr_open));
    (soft.max(hard), hard)
}

/// Raises this process's open-file limit: the soft limit to the hard one, and both to `wanted`
/// (at most fs.nr_open) where the process may raise its hard limit. Returns the soft limit in
/// force afterwards.
pub fn raise_open_file_limit(wanted: u64) -> io::Result<u64> {
    let current = sys::open_file_limits()?;
    let nr_open = read_number(NR_OPEN).unwrap_or(current.1);
    let (soft, hard) = limits_for(current, wanted, nr_open);
    if (soft, hard) == current {
        return Ok(current.0);
    }
    if hard > current.1 && sys::set_open_file_limits(soft, hard).is_ok() {
        return Ok(soft);
    }
    // Not allowed to raise the hard limit: as far as it goes.
    let (soft, hard) = limits_for(current, 0, nr_open);
    sys::set_open_file_limits(soft, hard)?;
    Ok(soft)
}

/// The host's limit on memory mappings per process (vm.max_map_count), None if unreadable.
pub fn max_map_count() -> Option<u64> {
    read_number(MAX_MAP_COUNT)
}

/// How many VMs fit under `open_files` (besides `other_fds` open already) and `max_map_count`
/// (besides `other_mappings`).
pub fn vms_that_fit(
    open_files: u64,
    other_fds: u64,
    max_map_count: u64,
    other_mappings: u64,
) -> u64 {
    (open_files.saturating_sub(other_fds) / FDS_PER_VM)
        .min(max_map_count.saturating_sub(other_mappings) / MAPPINGS_PER_VM)
}

fn read_number(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_goes_up_to_the_hard_one_and_both_to_what_is_wanted() {
        // Nothing wanted beyond the hard limit: soft up to hard, hard unchanged.
        assert_eq!(limits_for((1024, 20_000), 0, 1 << 20), (20_000, 20_000));
        assert_eq!(
            limits_for((1024, 20_000), 15_000, 1 << 20),
            (20_000, 20_000)
        );
        // More than the hard limit: both raised, to the kernel's ceiling at most.
        assert_eq!(
            limits_for((1024, 20_000), 30_000, 1 << 20),
            (30_000, 30_000)
        );
        assert_eq!(
            limits_for((1024, 20_000), 5 << 20, 1 << 20),
            (1 << 20, 1 << 20)
        );
        // Never lowered.
        assert_eq!(limits_for((50_000, 60_000), 100, 1 << 20), (60_000, 60_000));
    }

    #[test]
    fn the_vms_that_fit_are_bounded_by_both_limits() {
        assert_eq!(vms_that_fit(20_000, 20, 65_530, 100), 9_990);
        assert_eq!(vms_that_fit(1 << 20, 20, 65_530, 130), 16_350);
        assert_eq!(vms_that_fit(10, 20, 65_530, 0), 0);
    }

    #[test]
    fn raising_the_limit_never_leaves_it_lower_than_before() {
        let (soft, hard) = sys::open_file_limits().unwrap();
        let now = raise_open_file_limit(0).unwrap();
        assert!(now >= soft, "{now} after {soft}");
        assert_eq!(now, hard, "the soft limit is the hard one");
        assert_eq!(sys::open_file_limits().unwrap(), (hard, hard));
    }
}
