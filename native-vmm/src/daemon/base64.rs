//! Strict standard base64 (RFC 4648 §4, with padding) for `files[].content`.

fn sextet(byte: u8) -> Option<u32> {
    match byte {
        b'A'..=b'Z' => Some((byte - b'A') as u32),
        b'a'..=b'z' => Some((byte - b'a') as u32 + 26),
        b'0'..=b'9' => Some((byte - b'0') as u32 + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

/// Decodes `text`; refuses whitespace, a length that is not a multiple of 4, misplaced
/// padding and non-zero bits after the last byte (so each input has one meaning).
pub fn decode(text: &str) -> Result<Vec<u8>, &'static str> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return Err("base64 length is not a multiple of 4");
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    let chunks = bytes.len() / 4;
    for (i, chunk) in bytes.chunks_exact(4).enumerate() {
        let padding = chunk.iter().rev().take_while(|&&b| b == b'=').count();
        if padding > 2 || (padding > 0 && i + 1 != chunks) {
            return Err("misplaced base64 padding");
        }
        let mut bits = 0u32;
        for &byte in &chunk[..4 - padding] {
            bits = bits << 6 | sextet(byte).ok_or("invalid base64 character")?;
        }
        bits <<= 6 * padding as u32;
        let decoded = [(bits >> 16) as u8, (bits >> 8) as u8, bits as u8];
        let kept = 3 - padding;
        if decoded[kept..].iter().any(|&b| b != 0) {
            return Err("non-canonical base64 (bits set after the last byte)");
        }
        out.extend_from_slice(&decoded[..kept]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn rfc4648_vectors() {
        for (text, bytes) in [("", ""), ("Zg==", "f"), ("Zm8=", "fo"), ("Zm9v", "foo"), ("Zm9vYg==", "foob"), ("Zm9vYmE=", "fooba"), ("Zm9vYmFy", "foobar")] {
            assert_eq!(decode(text).unwrap(), bytes.as_bytes(), "{text}");
        }
        assert_eq!(decode("AP8+/w==").unwrap(), vec![0x00, 0xff, 0x3e, 0xff]);
    }

    #[test]
    fn malformed_input_is_refused() {
        for text in ["Zg", "Zg=", "Z===", "Zg==Zg==", "Zm9v\n", "Zm 9", "Zh==", "Zm9=", "====", "Zm-_", "é123"] {
            assert!(decode(text).is_err(), "{text:?}");
        }
    }
}
