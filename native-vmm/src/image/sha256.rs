//! SHA-256 (the sha2 crate) as the image and template formats store it: a plain 32-byte array.

use sha2::Digest;

pub use sha2::Sha256;

/// SHA-256 of one byte slice.
pub fn digest(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// Lower-case hex of a digest (content hashes in listings and messages).
pub fn to_hex(digest: &[u8; 32]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_and_hex_match_fips_180() {
        assert_eq!(
            to_hex(&digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
