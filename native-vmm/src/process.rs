//! The guest process as the syscall layer sees it: fds, memory map, output, counters.

use std::sync::Arc;

use crate::fs::Image;

/// What a run is given.
pub struct ProcessConfig {
    pub image: Arc<Image>,
    /// Working directory (writable, in the overlay).
    pub cwd: String,
    pub stdin: Vec<u8>,
    /// Cap on stdout+stderr bytes kept.
    pub output_cap: u64,
    /// Guest memory size in bytes (the memory limit).
    pub mem_limit: u64,
}

/// Where the loader left room for the program's heap and mappings (guest addresses).
#[derive(Debug, Clone, Copy)]
pub struct AddressSpace {
    /// First byte after the highest loaded segment of the main program, page aligned.
    pub brk_start: u64,
    /// [mmap_low, mmap_high) is free for mmap; it is below the stack and above brk's reach.
    pub mmap_low: u64,
    pub mmap_high: u64,
}

pub struct GuestProcess {
    pub config: ProcessConfig,
    pub space: AddressSpace,
}

impl GuestProcess {
    pub fn new(config: ProcessConfig, space: AddressSpace) -> Self {
        GuestProcess { config, space }
    }
}
