//! A small strict JSON (RFC 8259) reader and writer.
//!
//! Used for image manifests and for the daemon protocol, where the input comes from clients and
//! is hostile: the parser enforces a size limit and a nesting-depth limit (no recursion without
//! bound), rejects everything RFC 8259 does not allow (comments, trailing commas, leading zeros,
//! NaN, control characters in strings, lone surrogates, invalid UTF-8, trailing data) and also
//! duplicate object keys, and reports the byte offset and reason of the first error.

use std::collections::HashSet;
use std::fmt;
use std::hash::{BuildHasher, RandomState};

/// A JSON number, keeping integers exact.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// An integer literal that fits i64.
    Int(i64),
    /// A non-negative integer literal above i64::MAX that fits u64.
    UInt(u64),
    /// Anything else (fraction, exponent, or an integer beyond u64).
    Float(f64),
}

impl Number {
    pub fn as_f64(self) -> f64 {
        match self {
            Number::Int(i) => i as f64,
            Number::UInt(u) => u as f64,
            Number::Float(f) => f,
        }
    }

    /// The exact integer value, if this is an integer literal in i64 range.
    pub fn as_i64(self) -> Option<i64> {
        match self {
            Number::Int(i) => Some(i),
            _ => None,
        }
    }

    /// The exact integer value, if this is a non-negative integer literal in u64 range.
    pub fn as_u64(self) -> Option<u64> {
        match self {
            Number::Int(i) => u64::try_from(i).ok(),
            Number::UInt(u) => Some(u),
            Number::Float(_) => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<Value>),
    /// Members in document order; keys are unique.
    Object(Vec<(String, Value)>),
}

impl Value {
    /// An object from (key, value) pairs (later duplicates are the caller's responsibility).
    pub fn object<K: Into<String>>(members: impl IntoIterator<Item = (K, Value)>) -> Value {
        Value::Object(members.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    /// The member `key` of an object (None for other values or a missing key).
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&[(String, Value)]> {
        match self {
            Value::Object(members) => Some(members),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Number(n) => Some(n.as_f64()),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Number(n) => n.as_i64(),
            _ => None,
        }
    }

    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Number(n) => n.as_u64(),
            _ => None,
        }
    }

    /// Compact serialisation (no whitespace).
    pub fn to_json(&self) -> String {
        let mut out = String::new();
        write_value(&mut out, self);
        out
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_json())
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Value {
        Value::Bool(b)
    }
}

impl From<i64> for Value {
    fn from(i: i64) -> Value {
        Value::Number(Number::Int(i))
    }
}

impl From<u64> for Value {
    fn from(u: u64) -> Value {
        match i64::try_from(u) {
            Ok(i) => Value::Number(Number::Int(i)),
            Err(_) => Value::Number(Number::UInt(u)),
        }
    }
}

impl From<f64> for Value {
    fn from(f: f64) -> Value {
        Value::Number(Number::Float(f))
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::String(s)
    }
}

impl From<Vec<Value>> for Value {
    fn from(items: Vec<Value>) -> Value {
        Value::Array(items)
    }
}

fn write_value(out: &mut String, v: &Value) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(Number::Int(i)) => out.push_str(&i.to_string()),
        Value::Number(Number::UInt(u)) => out.push_str(&u.to_string()),
        // JSON has no NaN or infinity; `{:?}` prints the shortest round-trip form ("0.1",
        // "1e300", "2.0"), all valid JSON number syntax.
        Value::Number(Number::Float(f)) if f.is_finite() => out.push_str(&format!("{f:?}")),
        Value::Number(Number::Float(_)) => out.push_str("null"),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(members) => {
            out.push('{');
            for (i, (k, item)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, k);
                out.push(':');
                write_value(out, item);
            }
            out.push('}');
        }
    }
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Bounds on what `parse_with` accepts.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Maximum input length in bytes.
    pub max_bytes: usize,
    /// Maximum nesting of arrays and objects (the top-level value is depth 1).
    pub max_depth: usize,
}

impl Default for Limits {
    /// 16 MiB and 64 levels: generous for manifests and requests, small enough to be safe.
    fn default() -> Limits {
        Limits { max_bytes: 16 << 20, max_depth: 64 }
    }
}

/// Where and why parsing failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// Byte offset in the input.
    pub offset: usize,
    pub reason: &'static str,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid JSON at byte {}: {}", self.offset, self.reason)
    }
}

impl std::error::Error for ParseError {}

/// Parses one JSON document with the default limits.
pub fn parse(input: &[u8]) -> Result<Value, ParseError> {
    parse_with(input, Limits::default())
}

pub fn parse_with(input: &[u8], limits: Limits) -> Result<Value, ParseError> {
    if input.len() > limits.max_bytes {
        return Err(ParseError { offset: limits.max_bytes, reason: "document larger than the size limit" });
    }
    let mut p = Parser { bytes: input, pos: 0, max_depth: limits.max_depth };
    p.skip_ws();
    let v = p.value(1)?;
    p.skip_ws();
    if p.pos != input.len() {
        return p.fail("unexpected data after the document");
    }
    Ok(v)
}

struct Parser<'a> {
    bytes: &'a [u8],
    pos: usize,
    max_depth: usize,
}

impl Parser<'_> {
    fn fail<T>(&self, reason: &'static str) -> Result<T, ParseError> {
        Err(ParseError { offset: self.pos, reason })
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn expect_literal(&mut self, word: &'static [u8], v: Value) -> Result<Value, ParseError> {
        if self.bytes[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(v)
        } else {
            self.fail("invalid literal")
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, ParseError> {
        match self.peek() {
            None => self.fail("unexpected end of input"),
            Some(b'n') => self.expect_literal(b"null", Value::Null),
            Some(b't') => self.expect_literal(b"true", Value::Bool(true)),
            Some(b'f') => self.expect_literal(b"false", Value::Bool(false)),
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b'[') => self.array(depth),
            Some(b'{') => self.object(depth),
            Some(_) => self.fail("unexpected character"),
        }
    }

    fn enter(&self, depth: usize) -> Result<(), ParseError> {
        if depth > self.max_depth {
            self.fail("nesting deeper than the depth limit")
        } else {
            Ok(())
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, ParseError> {
        self.enter(depth)?;
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth + 1)?);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                None => return self.fail("unterminated array"),
                Some(_) => return self.fail("expected ',' or ']' in array"),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, ParseError> {
        self.enter(depth)?;
        self.pos += 1;
        let mut members: Vec<(String, Value)> = Vec::new();
        // Hashes (randomly keyed) of the keys so far: the duplicate check costs a lookup per
        // key; only equal hashes compare keys. A scan of all earlier keys made an object of n
        // keys cost n²/2 comparisons: hours of CPU for one 16 MiB daemon frame.
        let (hasher, mut key_hashes) = (RandomState::new(), HashSet::new());
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Value::Object(members));
        }
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return self.fail("expected a string key in object");
            }
            let key_at = self.pos;
            let key = self.string()?;
            if !key_hashes.insert(hasher.hash_one(&key)) && members.iter().any(|(k, _)| *k == key) {
                return Err(ParseError { offset: key_at, reason: "duplicate object key" });
            }
            self.skip_ws();
            if self.peek() != Some(b':') {
                return self.fail("expected ':' after object key");
            }
            self.pos += 1;
            self.skip_ws();
            let v = self.value(depth + 1)?;
            members.push((key, v));
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(members));
                }
                None => return self.fail("unterminated object"),
                Some(_) => return self.fail("expected ',' or '}' in object"),
            }
        }
    }

    fn number(&mut self) -> Result<Value, ParseError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return self.fail("leading zero in number");
                }
            }
            Some(b'1'..=b'9') => self.digits(),
            _ => return self.fail("expected a digit"),
        }
        let mut integral = true;
        if self.peek() == Some(b'.') {
            integral = false;
            self.pos += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return self.fail("expected a digit after '.'");
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            integral = false;
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return self.fail("expected a digit in exponent");
            }
            self.digits();
        }
        // The scanned bytes are ASCII digits, signs, '.', 'e': always valid UTF-8.
        let text = std::str::from_utf8(&self.bytes[start..self.pos]).unwrap_or("");
        if integral {
            if let Ok(i) = text.parse::<i64>() {
                return Ok(Value::Number(Number::Int(i)));
            }
            if let Ok(u) = text.parse::<u64>() {
                return Ok(Value::Number(Number::UInt(u)));
            }
        }
        match text.parse::<f64>() {
            Ok(f) if f.is_finite() => Ok(Value::Number(Number::Float(f))),
            _ => Err(ParseError { offset: start, reason: "number out of range" }),
        }
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }

    fn hex4(&mut self) -> Result<u32, ParseError> {
        let mut v = 0u32;
        for _ in 0..4 {
            let d = match self.peek() {
                Some(c @ b'0'..=b'9') => c - b'0',
                Some(c @ b'a'..=b'f') => c - b'a' + 10,
                Some(c @ b'A'..=b'F') => c - b'A' + 10,
                _ => return self.fail("expected four hex digits after \\u"),
            };
            v = v * 16 + d as u32;
            self.pos += 1;
        }
        Ok(v)
    }

    fn string(&mut self) -> Result<String, ParseError> {
        self.pos += 1; // opening quote
        let mut out: Vec<u8> = Vec::new();
        loop {
            let run_start = self.pos;
            while let Some(c) = self.peek() {
                if c == b'"' || c == b'\\' || c < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            let run = &self.bytes[run_start..self.pos];
            if let Err(e) = std::str::from_utf8(run) {
                return Err(ParseError { offset: run_start + e.valid_up_to(), reason: "invalid UTF-8 in string" });
            }
            out.extend_from_slice(run);
            match self.peek() {
                None => return self.fail("unterminated string"),
                Some(b'"') => {
                    self.pos += 1;
                    // Runs were checked and escapes push whole chars, so this cannot fail.
                    return String::from_utf8(out).map_err(|_| ParseError { offset: self.pos, reason: "invalid UTF-8 in string" });
                }
                Some(b'\\') => {
                    let esc_at = self.pos;
                    self.pos += 1;
                    let c = match self.peek() {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'/') => '/',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            self.pos += 1;
                            let c = self.unicode_escape(esc_at)?;
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                            continue;
                        }
                        _ => return self.fail("invalid escape in string"),
                    };
                    self.pos += 1;
                    out.push(c as u8);
                }
                Some(_) => return self.fail("control character in string"),
            }
        }
    }

    /// After "\u": one code point, combining a UTF-16 surrogate pair.
    fn unicode_escape(&mut self, esc_at: usize) -> Result<char, ParseError> {
        let lone = ParseError { offset: esc_at, reason: "unpaired UTF-16 surrogate in \\u escape" };
        let first = self.hex4()?;
        let code = match first {
            0xD800..=0xDBFF => {
                if !self.bytes[self.pos..].starts_with(b"\\u") {
                    return Err(lone);
                }
                self.pos += 2;
                let second = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return Err(lone);
                }
                0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
            }
            0xDC00..=0xDFFF => return Err(lone),
            c => c,
        };
        char::from_u32(code).ok_or(lone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Value, ParseError> {
        parse(s.as_bytes())
    }

    #[test]
    fn parses_all_value_kinds() {
        let v = p(r#" {"a": [1, -2, 3.5, 1e2, true, false, null], "b": {"c": "d"}, "": ""} "#).unwrap();
        let a = v.get("a").and_then(Value::as_array).unwrap();
        assert_eq!(a[0].as_i64(), Some(1));
        assert_eq!(a[1].as_i64(), Some(-2));
        assert_eq!(a[1].as_u64(), None);
        assert_eq!(a[2].as_f64(), Some(3.5));
        assert_eq!(a[2].as_i64(), None);
        assert_eq!(a[3].as_f64(), Some(100.0));
        assert_eq!(a[4].as_bool(), Some(true));
        assert!(a[6].is_null());
        assert_eq!(v.get("b").and_then(|b| b.get("c")).and_then(Value::as_str), Some("d"));
        assert_eq!(v.get("").and_then(Value::as_str), Some(""));
        assert_eq!(v.get("zz"), None);
        assert_eq!(v.as_object().map(<[_]>::len), Some(3));
    }

    #[test]
    fn integers_stay_exact() {
        assert_eq!(p("9223372036854775807").unwrap().as_i64(), Some(i64::MAX));
        assert_eq!(p("-9223372036854775808").unwrap().as_i64(), Some(i64::MIN));
        assert_eq!(p("18446744073709551615").unwrap().as_u64(), Some(u64::MAX));
        assert_eq!(p("18446744073709551615").unwrap().as_i64(), None);
        assert_eq!(p("18446744073709551616").unwrap().as_u64(), None);
        assert_eq!(p("18446744073709551616").unwrap().as_f64(), Some(18446744073709551616.0));
        assert_eq!(p("-0").unwrap().as_i64(), Some(0));
        assert_eq!(p("0.5e-3").unwrap().as_f64(), Some(0.0005));
    }

    #[test]
    fn string_escapes_and_surrogates() {
        let v = p(r#""q\"b\\s\/n\nt\tr\rb\bf\fu\u00e9\u20ac\ud83d\ude00""#).unwrap();
        assert_eq!(v.as_str(), Some("q\"b\\s/n\nt\tr\rb\u{8}f\u{c}u\u{e9}\u{20ac}\u{1F600}"));
        assert_eq!(p("\"h\u{e9}llo \u{1F600}\"").unwrap().as_str(), Some("h\u{e9}llo \u{1F600}"));
        let lone_high = p(r#""\ud83d""#).unwrap_err();
        assert_eq!((lone_high.offset, lone_high.reason), (1, "unpaired UTF-16 surrogate in \\u escape"));
        assert!(p(r#""\ud83dx""#).is_err());
        assert!(p(r#""\ud83d\u0041""#).is_err());
        assert!(p(r#""\ude00""#).is_err());
        assert!(p(r#""\u12g4""#).is_err());
    }

    #[test]
    fn duplicate_keys_are_found_in_linear_time() {
        let n = 200_000;
        let mut doc = String::from("{");
        for i in 0..n {
            doc.push_str(&format!("\"k{i}\":0,"));
        }
        let duplicate_at = doc.len();
        doc.push_str("\"k7\":1}");
        let started = std::time::Instant::now();
        assert_eq!(parse(doc.as_bytes()), Err(ParseError { offset: duplicate_at, reason: "duplicate object key" }));
        doc.replace_range(duplicate_at.., "\"last\":1}");
        assert!(matches!(parse(doc.as_bytes()), Ok(Value::Object(members)) if members.len() == n + 1));
        // Comparing every key with every earlier one took minutes for this object.
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    }

    #[test]
    fn malformed_input_reports_offset_and_reason() {
        let cases: &[(&[u8], usize, &str)] = &[
            (b"", 0, "unexpected end of input"),
            (b"[1,]", 3, "unexpected character"),
            (b"{\"a\":1,}", 7, "expected a string key in object"),
            (b"01", 1, "leading zero in number"),
            (b"1.", 2, "expected a digit after '.'"),
            (b"1e", 2, "expected a digit in exponent"),
            (b"-", 1, "expected a digit"),
            (b"NaN", 0, "unexpected character"),
            (b"tru", 0, "invalid literal"),
            (b"nulls", 4, "unexpected data after the document"),
            (b"[1 2]", 3, "expected ',' or ']' in array"),
            (b"{\"a\" 1}", 5, "expected ':' after object key"),
            (b"{\"a\":1 \"b\":2}", 7, "expected ',' or '}' in object"),
            (b"{\"a\":1,\"a\":2}", 7, "duplicate object key"),
            (b"\"abc", 4, "unterminated string"),
            (b"\"a\nb\"", 2, "control character in string"),
            (b"\"\\x\"", 2, "invalid escape in string"),
            (b"\"\xff\"", 1, "invalid UTF-8 in string"),
            (b"\"ok\xc3\"", 3, "invalid UTF-8 in string"),
            (b"[1", 2, "unterminated array"),
            (b"{\"a\":1", 6, "unterminated object"),
            (b"1e400", 0, "number out of range"),
            (b"/* c */ 1", 0, "unexpected character"),
            (b"\x0c1", 0, "unexpected character"),
        ];
        for &(input, offset, reason) in cases {
            let err = parse(input).unwrap_err();
            assert_eq!((err.offset, err.reason), (offset, reason), "input {:?}", String::from_utf8_lossy(input));
        }
        assert_eq!(parse(b"[1,]").unwrap_err().to_string(), "invalid JSON at byte 3: unexpected character");
    }

    #[test]
    fn depth_and_size_limits() {
        let limits = Limits { max_bytes: 100, max_depth: 3 };
        assert!(parse_with(b"[[[1]]]", limits).is_ok());
        let err = parse_with(b"[[[[1]]]]", limits).unwrap_err();
        assert_eq!((err.offset, err.reason), (3, "nesting deeper than the depth limit"));
        assert!(parse_with(b"{\"a\":{\"b\":{\"c\":{}}}}", limits).is_err());
        assert_eq!(parse_with(&[b' '; 101], limits).unwrap_err().reason, "document larger than the size limit");
        // The default limit stops a deeply nested hostile document without exhausting the stack.
        let deep = "[".repeat(100_000);
        assert_eq!(parse(deep.as_bytes()).unwrap_err().reason, "nesting deeper than the depth limit");
    }

    #[test]
    fn serialises_and_round_trips() {
        let v = Value::object([
            ("s", Value::from("a\"b\\c\n\u{1}\u{e9}")),
            ("i", Value::from(-5i64)),
            ("u", Value::from(u64::MAX)),
            ("f", Value::from(0.1)),
            ("big", Value::from(1e300)),
            ("nan", Value::from(f64::NAN)),
            ("a", Value::from(vec![Value::Null, Value::from(true)])),
            ("o", Value::object(Vec::<(String, Value)>::new())),
        ]);
        let text = v.to_json();
        assert_eq!(
            text,
            r#"{"s":"a\"b\\c\n\u0001é","i":-5,"u":18446744073709551615,"f":0.1,"big":1e300,"nan":null,"a":[null,true],"o":{}}"#
        );
        let back = parse(text.as_bytes()).unwrap();
        assert_eq!(back.get("s"), v.get("s"));
        assert_eq!(back.get("u").and_then(Value::as_u64), Some(u64::MAX));
        assert_eq!(back.get("f").and_then(Value::as_f64), Some(0.1));
        assert_eq!(back.get("big").and_then(Value::as_f64), Some(1e300));
        assert!(back.get("nan").is_some_and(Value::is_null));
        assert_eq!(format!("{}", Value::from(2.0)), "2.0");
    }
}
