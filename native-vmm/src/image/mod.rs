//! Building a read-only file image from a manifest of host paths.
