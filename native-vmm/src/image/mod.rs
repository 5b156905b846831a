//! Building a read-only file image from a manifest of host paths (see ../../IMAGE.md).
//!
//! `build(manifest, out_dir)` is what `sandfork-vmm image build` runs; `crate::fs::Image`
//! reads the result.

mod build;
pub mod format;
pub mod manifest;
pub mod pattern;
pub mod sha256;
#[cfg(test)]
pub(crate) mod testdir;

pub use build::{build, build_from, BuildReport, LIBRARY_SEARCH_PATH};
pub use manifest::Manifest;
