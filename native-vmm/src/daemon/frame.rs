//! The protocol's framing: a u32 big-endian length, then that many bytes holding one UTF-8
//! JSON object. Frames come from clients and are hostile: the length is checked against the
//! cap before anything is allocated, and every way a frame can be malformed is its own error,
//! so the server can tell the ones it can recover from (the payload was read whole) from the
//! ones that lose the frame boundary (the connection must close).
//!
//! serde_json reads the JSON; `StrictValue` builds the value and refuses what serde_json's own
//! `Value` would let through: a key given twice in one object (the later one would silently win,
//! so two readers of one frame could see two requests) and nesting deeper than `MAX_DEPTH`.

use std::fmt;
use std::io::{self, Read, Write};

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::Serialize;
use serde_json::{Map, Value};

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
    /// The payload is UTF-8 but not JSON (or has a duplicate key or nests too deep).
    NotJson(serde_json::Error),
    /// The payload is JSON but not an object.
    NotObject,
    /// Reading from the connection failed.
    Io(io::Error),
}

impl FrameError {
    /// After this error the next frame boundary is unknown (or the connection is gone): the
    /// connection must be closed. Otherwise the whole payload was consumed and the peer may go on.
    pub fn loses_framing(&self) -> bool {
        matches!(
            self,
            FrameError::Closed
                | FrameError::Oversized { .. }
                | FrameError::Truncated { .. }
                | FrameError::Io(_)
        )
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Closed => write!(f, "connection closed"),
            FrameError::Oversized { length } => write!(
                f,
                "frame length {length} exceeds the limit of {MAX_FRAME_BYTES} bytes"
            ),
            FrameError::Truncated { expected, got } => write!(
                f,
                "connection closed inside a frame ({got} of {expected} bytes)"
            ),
            FrameError::NotUtf8 { valid_up_to } => write!(
                f,
                "frame payload is not UTF-8 (invalid byte at offset {valid_up_to})"
            ),
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
        return Err(FrameError::Oversized {
            length: length.into(),
        });
    }
    // The cap above bounds this allocation; the buffer is filled as bytes arrive.
    let mut payload = Vec::new();
    let got = reader
        .take(length.into())
        .read_to_end(&mut payload)
        .map_err(FrameError::Io)?;
    if got < length as usize {
        return Err(FrameError::Truncated {
            expected: length as usize,
            got,
        });
    }
    decode_payload(&payload)
}

/// Checks a complete payload: UTF-8, then JSON, then an object.
pub fn decode_payload(payload: &[u8]) -> Result<Value, FrameError> {
    let text = std::str::from_utf8(payload).map_err(|e| FrameError::NotUtf8 {
        valid_up_to: e.valid_up_to(),
    })?;
    let mut reader = serde_json::Deserializer::from_str(text);
    let value = StrictValue { depth: 1 }
        .deserialize(&mut reader)
        .map_err(FrameError::NotJson)?;
    reader.end().map_err(FrameError::NotJson)?;
    match value {
        Value::Object(_) => Ok(value),
        _ => Err(FrameError::NotObject),
    }
}

/// Builds one JSON value at nesting `depth` (the top-level value is depth 1).
#[derive(Clone, Copy)]
struct StrictValue {
    depth: usize,
}

impl StrictValue {
    /// The seed for the members of an array or object at this depth.
    fn members<E: de::Error>(self) -> Result<StrictValue, E> {
        if self.depth > MAX_DEPTH {
            return Err(E::custom(format_args!(
                "nesting deeper than {MAX_DEPTH} levels"
            )));
        }
        Ok(StrictValue {
            depth: self.depth + 1,
        })
    }
}

impl<'de> DeserializeSeed<'de> for StrictValue {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictValue {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(n.into())
    }

    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(n.into())
    }

    /// Always a number: serde_json refuses non-finite ones while parsing (`from` maps them to null).
    fn visit_f64<E>(self, n: f64) -> Result<Value, E> {
        Ok(n.into())
    }

    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let member = self.members()?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(member)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let member = self.members()?;
        let mut members = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if members.contains_key(&key) {
                return Err(de::Error::custom(format_args!(
                    "duplicate object key {key:?}"
                )));
            }
            let value = map.next_value_seed(member)?;
            members.insert(key, value);
        }
        Ok(Value::Object(members))
    }
}

/// Encodes `message` as one frame (header and payload), or says why it cannot be sent.
pub fn encode_frame(message: &impl Serialize) -> Result<Vec<u8>, EncodeError> {
    // The header's room first, then the payload serialised after it.
    let mut frame = vec![0u8; 4];
    serde_json::to_writer(&mut frame, message).map_err(EncodeError::NotSerialisable)?;
    let length = frame.len() - 4;
    if length > MAX_FRAME_BYTES {
        return Err(EncodeError::TooLarge { length });
    }
    frame[..4].copy_from_slice(&(length as u32).to_be_bytes());
    Ok(frame)
}

/// Why a message cannot be sent. Both are bugs: the daemon's limits keep responses far below
/// the cap, and its messages are structs with string keys, which always serialise.
#[derive(Debug)]
pub enum EncodeError {
    TooLarge { length: usize },
    NotSerialisable(serde_json::Error),
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::TooLarge { length } => write!(
                f,
                "response of {length} bytes exceeds the frame limit of {MAX_FRAME_BYTES} bytes"
            ),
            EncodeError::NotSerialisable(e) => write!(f, "response cannot be serialised: {e}"),
        }
    }
}

/// Writes one frame with a single `write_all` (callers serialise writers on a connection).
pub fn write_frame(writer: &mut impl Write, message: &impl Serialize) -> io::Result<()> {
    let frame = encode_frame(message)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    writer.write_all(&frame)?;
    writer.flush()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut bytes = (payload.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(payload);
        bytes
    }

    fn read(bytes: &[u8]) -> Result<Value, FrameError> {
        read_frame(&mut &bytes[..])
    }

    #[test]
    fn a_frame_round_trips() {
        let message = json!({"type": "hello", "protocol": 1, "s": "é\u{1}\"\n"});
        let bytes = encode_frame(&message).unwrap();
        assert_eq!(&bytes[..4], &((bytes.len() - 4) as u32).to_be_bytes());
        assert_eq!(read(&bytes).unwrap(), message);

        // Two frames back to back are read one at a time.
        let mut stream = bytes.clone();
        stream.extend_from_slice(&frame(b"{}"));
        let mut reader = &stream[..];
        assert_eq!(read_frame(&mut reader).unwrap(), message);
        assert_eq!(read_frame(&mut reader).unwrap(), json!({}));
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
            assert!(
                !error.loses_framing(),
                "{payload:?}: the payload was consumed, the connection can go on"
            );
        }
    }

    #[test]
    fn deep_nesting_is_refused() {
        let deep = format!(
            "{{\"a\":{}1{}}}",
            "[".repeat(MAX_DEPTH),
            "]".repeat(MAX_DEPTH)
        );
        assert!(matches!(
            read(&frame(deep.as_bytes())),
            Err(FrameError::NotJson(_))
        ));
        let shallow = format!(
            "{{\"a\":{}1{}}}",
            "[".repeat(MAX_DEPTH - 2),
            "]".repeat(MAX_DEPTH - 2)
        );
        assert!(read(&frame(shallow.as_bytes())).is_ok());
        // A million opening brackets fail fast instead of recursing.
        let hostile = format!("{{\"a\":{}", "[".repeat(1 << 20));
        assert!(matches!(
            read(&frame(hostile.as_bytes())),
            Err(FrameError::NotJson(_))
        ));
    }

    #[test]
    fn random_bytes_never_panic_and_keep_the_stream_in_step() {
        let mut rng = crate::fuzz::Rng::new(0x9e37_79b9_7f4a_7c15);
        let alphabet = b"{}[]\":,0123456789.eE+-truefalsnl \\u\xc3\xa9\xff";
        for round in 0..5_000 {
            let len = (rng.next_u64() % 64) as usize;
            let payload: Vec<u8> = (0..len)
                .map(|_| {
                    let r = rng.next_u64();
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
            assert_eq!(
                read_frame(&mut reader).unwrap().get("next"),
                Some(&Value::Bool(true))
            );
            // And random bytes as a whole stream (header included) end in an error or a value.
            let raw: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            let _ = read(&raw);
        }
    }

    #[test]
    fn responses_larger_than_the_cap_are_not_encoded() {
        let big = json!({"s": "\u{1}".repeat(MAX_FRAME_BYTES / 6 + 1)});
        assert!(
            matches!(encode_frame(&big), Err(EncodeError::TooLarge { length }) if length > MAX_FRAME_BYTES)
        );
        assert!(write_frame(&mut Vec::new(), &big).is_err());
    }
}
