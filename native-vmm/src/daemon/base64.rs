//! Strict standard base64 (RFC 4648 §4, with padding) for `files[].content`, decoded by the
//! base64 crate. Its Debian version (0.13) also accepts missing padding ("Zg" for "Zg=="); the
//! length rule below refuses that, so each content has one spelling (the crate already refuses
//! whitespace, misplaced padding and bits set after the last byte).

use std::fmt;

/// Why a content is not strict base64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base64Error {
    /// The length is not a multiple of 4 (missing padding).
    Length,
    /// The base64 crate refused it: a byte outside the alphabet, misplaced padding, stray bits.
    Invalid(::base64::DecodeError),
}

impl fmt::Display for Base64Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Base64Error::Length => f.write_str("base64 length is not a multiple of 4"),
            Base64Error::Invalid(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Base64Error {}

pub fn decode(text: &str) -> Result<Vec<u8>, Base64Error> {
    if !text.len().is_multiple_of(4) {
        return Err(Base64Error::Length);
    }
    ::base64::decode(text).map_err(Base64Error::Invalid)
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn rfc4648_vectors() {
        for (text, bytes) in [
            ("", ""),
            ("Zg==", "f"),
            ("Zm8=", "fo"),
            ("Zm9v", "foo"),
            ("Zm9vYg==", "foob"),
            ("Zm9vYmE=", "fooba"),
            ("Zm9vYmFy", "foobar"),
        ] {
            assert_eq!(decode(text).unwrap(), bytes.as_bytes(), "{text}");
        }
        assert_eq!(decode("AP8+/w==").unwrap(), vec![0x00, 0xff, 0x3e, 0xff]);
    }

    #[test]
    fn malformed_input_is_refused() {
        for text in [
            "Zg", "Zg=", "Z===", "Zg==Zg==", "Zg=A", "Zm9v\n", "Zm 9", "Zh==", "Zm9=", "====",
            "Zm9v====", "Zm-_", "é123",
        ] {
            assert!(decode(text).is_err(), "{text:?}");
        }
    }
}
