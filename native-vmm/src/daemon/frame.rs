//! The protocol's framing: a u32 big-endian length, then that many bytes holding one UTF-8
//! JSON object. Frames come from clients and are hostile: the length is checked against the
//! cap before anything is allocated, and every way a frame can be malformed is its own error,
//! so the server can tell the ones it can recover from (the payload was read whole) from the
//! ones that lose the frame boundary (the connection must close).

use std::fmt;
use std::io::{self, Read, Write};

use crate::json::{self, ParseError, Value};

/// The largest payload, in either direction (16 MiB).
pub const MAX_FRAME_BYTES: usize = 16 << 20;

/// Nesting allowed in a request. Requests are at most three levels deep (`files[i].path`), so
/// this only bounds the work hostile documents can cause.
const MAX_DEPTH: usize = 16;

/// Why no frame could be read.
#[derive(Debug)]
pub enum FrameError {
    /// The peer closed the connection cleanly, between frames.
    Closed,
    /// The length prefix exceeds `MAX_FRAME_BYTES`; the payload is not read.
    Oversized { length: u64 },
    /// The connection ended inside a frame (`got` of `expected` bytes of the header or payload).
    Truncated { expected: usize, got: usize },
    /// The payload is not UTF-8.
    NotUtf8 { valid_up_to: usize },
    /// The payload is UTF-8 but not JSON.
    NotJson(ParseError),
    /// The payload is JSON but not an object.
    NotObject,
    /// Reading from the connection failed.
    Io(io::Error),
}

impl FrameError {
    /// After this error the next frame boundary is unknown (or the connection is gone): the
    /// connection must be closed. Otherwise the whole payload was consumed and the peer may go on.
    pub fn loses_framing(&self) -> bool {
        matches!(self, FrameError::Closed | FrameError::Oversized { .. } | FrameError::Truncated { .. } | FrameError::Io(_))
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Closed => write!(f, "connection closed"),
            FrameError::Oversized { length } => write!(f, "frame length {length} exceeds the limit of {MAX_FRAME_BYTES} bytes"),
            FrameError::Truncated { expected, got } => write!(f, "connection closed inside a frame ({got} of {expected} bytes)"),
            FrameError::NotUtf8 { valid_up_to } => write!(f, "frame payload is not UTF-8 (invalid byte at offset {valid_up_to})"),
            FrameError::NotJson(e) => write!(f, "frame payload is not JSON: {e}"),
            FrameError::NotObject => write!(f, "frame payload is not a JSON object"),
            FrameError::Io(e) => write!(f, "reading the connection: {e}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Reads exactly `buf.len()` bytes; returns how many arrived before end of stream.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Reads one frame and returns its object.
pub fn read_frame(reader: &mut impl Read) -> Result<Value, FrameError> {
    let mut header = [0u8; 4];
    let got = read_full(reader, &mut header).map_err(FrameError::Io)?;
    match got {
        0 => return Err(FrameError::Closed),
        4 => {}
        _ => return Err(FrameError::Truncated { expected: 4, got }),
    }
    let length = u32::from_be_bytes(header);
    if length as usize > MAX_FRAME_BYTES {
        return Err(FrameError::Oversized { length: length.into() });
    }
    // The cap above bounds this allocation; the buffer is filled as bytes arrive.
    let mut payload = Vec::new();
    let got = reader.take(length.into()).read_to_end(&mut payload).map_err(FrameError::Io)?;
    if got < length as usize {
        return Err(FrameError::Truncated { expected: length as usize, got });
    }
    decode_payload(&payload)
}

/// Checks a complete payload: UTF-8, then JSON, then an object.
pub fn decode_payload(payload: &[u8]) -> Result<Value, FrameError> {
    std::str::from_utf8(payload).map_err(|e| FrameError::NotUtf8 { valid_up_to: e.valid_up_to() })?;
    let limits = json::Limits { max_bytes: MAX_FRAME_BYTES, max_depth: MAX_DEPTH };
    match json::parse_with(payload, limits).map_err(FrameError::NotJson)? {
        value @ Value::Object(_) => Ok(value),
        _ => Err(FrameError::NotObject),
    }
}

/// Encodes `message` as one frame (header and payload), or says why it cannot be sent.
pub fn encode_frame(message: &Value) -> Result<Vec<u8>, FrameTooLarge> {
    let payload = message.to_json();
    if payload.len() > MAX_FRAME_BYTES {
        return Err(FrameTooLarge { length: payload.len() });
    }
    let mut frame = Vec::with_capacity(4 + payload.len());
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(payload.as_bytes());
    Ok(frame)
}

/// A message whose encoding exceeds `MAX_FRAME_BYTES` (the daemon's limits keep responses far
/// below it; hitting this is a bug).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameTooLarge {
    pub length: usize,
}

impl fmt::Display for FrameTooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "response of {} bytes exceeds the frame limit of {MAX_FRAME_BYTES} bytes", self.length)
    }
}

/// Writes one frame with a single `write_all` (callers serialise writers on a connection).
pub fn write_frame(writer: &mut impl Write, message: &Value) -> io::Result<()> {
    let frame = encode_frame(message).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    writer.write_all(&frame)?;
    writer.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut bytes = (payload.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(payload);
        bytes
    }

    fn read(bytes: &[u8]) -> Result<Value, FrameError> {
        read_frame(&mut &bytes[..])
    }

    /// A xorshift generator: reproducible "random" input without dependencies.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn a_frame_round_trips() {
        let message = Value::object([("type", Value::from("hello")), ("protocol", Value::from(1u64)), ("s", Value::from("é\u{1}\"\n"))]);
        let bytes = encode_frame(&message).unwrap();
        assert_eq!(&bytes[..4], &((bytes.len() - 4) as u32).to_be_bytes());
        assert_eq!(read(&bytes).unwrap(), message);

        // Two frames back to back are read one at a time.
        let mut stream = bytes.clone();
        stream.extend_from_slice(&frame(b"{}"));
        let mut reader = &stream[..];
        assert_eq!(read_frame(&mut reader).unwrap(), message);
        assert_eq!(read_frame(&mut reader).unwrap(), Value::Object(vec![]));
        assert!(matches!(read_frame(&mut reader), Err(FrameError::Closed)));
    }

    #[test]
    fn every_truncation_is_detected() {
        let bytes = frame(br#"{"type":"health","id":3}"#);
        for cut in 1..bytes.len() {
            match read(&bytes[..cut]) {
                Err(e @ FrameError::Truncated { .. }) => assert!(e.loses_framing()),
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
        assert!(matches!(read(&[]), Err(FrameError::Closed)));
    }

    #[test]
    fn oversized_lengths_are_refused_before_reading_the_payload() {
        for length in [MAX_FRAME_BYTES as u32 + 1, u32::MAX, 0x8000_0000] {
            // No payload follows: the length alone decides.
            match read(&length.to_be_bytes()) {
                Err(e @ FrameError::Oversized { .. }) => {
                    assert!(e.loses_framing());
                    assert!(e.to_string().contains(&length.to_string()));
                }
                other => panic!("{length}: {other:?}"),
            }
        }
        // Exactly the cap is allowed (the payload is then judged on its content).
        let mut bytes = (MAX_FRAME_BYTES as u32).to_be_bytes().to_vec();
        bytes.extend(std::iter::repeat_n(b' ', MAX_FRAME_BYTES));
        assert!(matches!(read(&bytes), Err(FrameError::NotJson(_))));
    }

    #[test]
    fn payloads_must_be_utf8_json_objects() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "json"),
            (b"\xff\xfe{}", "utf8"),
            (b"{\"a\":\"\xc3\"}", "utf8"),
            (b"{\"a\":\"\xed\xa0\x80\"}", "utf8"), // an encoded surrogate
            (b"[1,2]", "object"),
            (b"\"text\"", "object"),
            (b"42", "object"),
            (b"null", "object"),
            (b"{\"a\":1,}", "json"),
            (b"{\"a\":1}{}", "json"),
            (b"{\"a\":1,\"a\":2}", "json"),
            (b"{\"a\":NaN}", "json"),
        ];
        for (payload, expected) in cases {
            let error = read(&frame(payload)).unwrap_err();
            let kind = match error {
                FrameError::NotUtf8 { .. } => "utf8",
                FrameError::NotJson(_) => "json",
                FrameError::NotObject => "object",
                ref other => panic!("{payload:?}: {other:?}"),
            };
            assert_eq!(kind, *expected, "{payload:?}: {error}");
            assert!(!error.loses_framing(), "{payload:?}: the payload was consumed, the connection can go on");
        }
    }

    #[test]
    fn deep_nesting_is_refused() {
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(matches!(read(&frame(deep.as_bytes())), Err(FrameError::NotJson(_))));
        let shallow = format!("{{\"a\":{}1{}}}", "[".repeat(MAX_DEPTH - 2), "]".repeat(MAX_DEPTH - 2));
        assert!(read(&frame(shallow.as_bytes())).is_ok());
        // A million opening brackets fail fast instead of recursing.
        let hostile = format!("{{\"a\":{}", "[".repeat(1 << 20));
        assert!(matches!(read(&frame(hostile.as_bytes())), Err(FrameError::NotJson(_))));
    }

    #[test]
    fn random_bytes_never_panic_and_keep_the_stream_in_step() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let alphabet = b"{}[]\":,0123456789.eE+-truefalsnl \\u\xc3\xa9\xff";
        for round in 0..5_000 {
            let len = (rng.next() % 64) as usize;
            let payload: Vec<u8> = (0..len)
                .map(|_| {
                    let r = rng.next();
                    if round % 2 == 0 {
                        r as u8
                    } else {
                        alphabet[(r % alphabet.len() as u64) as usize]
                    }
                })
                .collect();
            // Whatever the payload, a well-framed one is consumed exactly: the next frame reads.
            let mut stream = frame(&payload);
            stream.extend_from_slice(&frame(b"{\"next\":true}"));
            let mut reader = &stream[..];
            if let Err(e) = read_frame(&mut reader) {
                assert!(!e.loses_framing(), "{payload:?}: {e}");
            }
            assert_eq!(read_frame(&mut reader).unwrap().get("next"), Some(&Value::Bool(true)));
            // And random bytes as a whole stream (header included) end in an error or a value.
            let raw: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            let _ = read(&raw);
        }
    }

    #[test]
    fn responses_larger_than_the_cap_are_not_encoded() {
        let big = Value::object([("s", Value::from("\u{1}".repeat(MAX_FRAME_BYTES / 6 + 1)))]);
        let error = encode_frame(&big).unwrap_err();
        assert!(error.length > MAX_FRAME_BYTES);
        assert!(write_frame(&mut Vec::new(), &big).is_err());
    }
}
