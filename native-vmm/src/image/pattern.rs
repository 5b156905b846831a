//! Exclude patterns of a manifest: glob-ish matching of whole guest paths.
//!
//! `*` matches any run of characters within one path component, `**` any run including "/"
//! (`**/` also matches nothing), `?` one character other than "/"; everything else matches
//! itself. A pattern must match the
//! whole path ("/usr/lib/python3.11/test" excludes that directory and so its subtree;
//! "/usr/lib/python3.11/**/*.opt-1.pyc" excludes optimised bytecode at any depth).

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    text: String,
}

impl Pattern {
    /// A pattern must be absolute; "***" is refused as a likely typo.
    pub fn new(text: &str) -> Result<Pattern, String> {
        if !text.starts_with('/') {
            return Err(format!("exclude pattern {text:?} is not absolute"));
        }
        if text.contains("***") {
            return Err(format!("exclude pattern {text:?} contains \"***\""));
        }
        Ok(Pattern {
            text: text.to_owned(),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn matches(&self, path: &str) -> bool {
        glob(self.text.as_bytes(), path.as_bytes())
    }
}

fn glob(pat: &[u8], s: &[u8]) -> bool {
    match pat {
        [] => s.is_empty(),
        [b'*', b'*', rest @ ..] => {
            // "**/" also matches nothing, so "/a/**/b" matches "/a/b".
            if let [b'/', after @ ..] = rest {
                if glob(after, s) {
                    return true;
                }
            }
            (0..=s.len()).any(|i| glob(rest, &s[i..]))
        }
        [b'*', rest @ ..] => {
            let component_end = s.iter().position(|&c| c == b'/').unwrap_or(s.len());
            (0..=component_end).any(|i| glob(rest, &s[i..]))
        }
        [b'?', rest @ ..] => matches!(s.first(), Some(&c) if c != b'/') && glob(rest, &s[1..]),
        [c, rest @ ..] => s.first() == Some(c) && glob(rest, &s[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, s: &str) -> bool {
        Pattern::new(p).unwrap().matches(s)
    }

    #[test]
    fn literal_star_and_double_star() {
        assert!(m("/usr/lib/python3.11/test", "/usr/lib/python3.11/test"));
        assert!(!m(
            "/usr/lib/python3.11/test",
            "/usr/lib/python3.11/test/x.py"
        ));
        assert!(!m("/usr/lib/python3.11/test", "/usr/lib/python3.11/tests"));
        assert!(m("/usr/lib/*/test", "/usr/lib/python3.11/test"));
        assert!(!m("/usr/*/test", "/usr/lib/python3.11/test"));
        assert!(m("/usr/**/test", "/usr/lib/python3.11/test"));
        assert!(m("/a/**/*.pyc", "/a/x.pyc"));
        assert!(m(
            "/a/**/*.opt-1.pyc",
            "/a/b/__pycache__/m.cpython-311.opt-1.pyc"
        ));
        assert!(!m(
            "/a/**/*.opt-1.pyc",
            "/a/b/__pycache__/m.cpython-311.pyc"
        ));
        assert!(m("/a/?.py", "/a/b.py"));
        assert!(!m("/a/?.py", "/a//.py"));
        assert!(m("/a/**", "/a/b/c"));
        assert!(m("/a/**/b", "/a/b"));
        assert!(!m("/a/**/b", "/a/xb"));
    }

    #[test]
    fn rejects_bad_patterns() {
        assert!(Pattern::new("relative/*").is_err());
        assert!(Pattern::new("/a/***").is_err());
    }
}
