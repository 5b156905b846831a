//! Building a read-only file image from a manifest of host paths (see ../../IMAGE.md).

pub mod format;
pub mod sha256;
