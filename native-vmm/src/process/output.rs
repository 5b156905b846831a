//! The program's captured stdout and stderr, kept apart, under one shared byte cap, and
//! optionally passed on as they are written (`OutputSink`: the daemon's streamed executions).

use std::fmt;
use std::sync::Arc;

/// Which captured stream a write goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// The result of appending to the capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Everything was kept.
    All,
    /// Only the first `kept` bytes fit under the cap; the run must stop.
    CapReached { kept: usize },
}

/// Where kept output also goes the moment the program writes it. Called on the vCPU's thread
/// inside the write system call, so it must not block (the daemon's sink only queues).
#[derive(Clone, Default)]
pub struct OutputSink(Option<Arc<SinkFn>>);

type SinkFn = dyn Fn(Stream, &[u8]) + Send + Sync;

impl OutputSink {
    pub fn new(sink: impl Fn(Stream, &[u8]) + Send + Sync + 'static) -> OutputSink {
        OutputSink(Some(Arc::new(sink)))
    }

    /// A sink that passes nothing on (output is only captured).
    pub fn none() -> OutputSink {
        OutputSink(None)
    }
}

impl fmt::Debug for OutputSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "OutputSink(set)"
        } else {
            "OutputSink(none)"
        })
    }
}

#[derive(Debug, Clone)]
pub struct Output {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    cap: u64,
    sink: OutputSink,
}

impl Output {
    pub fn new(cap: u64) -> Output {
        Output {
            stdout: Vec::new(),
            stderr: Vec::new(),
            cap,
            sink: OutputSink::none(),
        }
    }

    /// From now on, every kept byte also goes to `sink` as it is appended.
    pub fn stream_to(&mut self, sink: OutputSink) {
        self.sink = sink;
    }

    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// Bytes still accepted before the cap is reached.
    pub fn remaining(&self) -> u64 {
        self.cap.saturating_sub(self.total())
    }

    pub fn total(&self) -> u64 {
        (self.stdout.len() + self.stderr.len()) as u64
    }

    /// Appends `data`, keeping what fits under the cap. Reaching the cap exactly is not a stop;
    /// the stop comes with the first byte that does not fit.
    pub fn append(&mut self, stream: Stream, data: &[u8]) -> Appended {
        let room = self.remaining().min(data.len() as u64) as usize;
        let target = match stream {
            Stream::Stdout => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        };
        target.extend_from_slice(&data[..room]);
        if let (Some(sink), true) = (&self.sink.0, room > 0) {
            sink(stream, &data[..room]);
        }
        if room < data.len() {
            Appended::CapReached { kept: room }
        } else {
            Appended::All
        }
    }

    pub fn stdout(&self) -> &[u8] {
        &self.stdout
    }

    pub fn stderr(&self) -> &[u8] {
        &self.stderr
    }

    pub fn into_parts(self) -> (Vec<u8>, Vec<u8>) {
        (self.stdout, self.stderr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_is_shared_and_truncates_the_crossing_write() {
        let mut out = Output::new(10);
        assert_eq!(out.append(Stream::Stdout, b"hello"), Appended::All);
        assert_eq!(out.append(Stream::Stderr, b"wor"), Appended::All);
        assert_eq!(
            out.append(Stream::Stdout, b"ld!!"),
            Appended::CapReached { kept: 2 }
        );
        assert_eq!(out.stdout(), b"hellold");
        assert_eq!(out.stderr(), b"wor");
        assert_eq!(out.remaining(), 0);
        assert_eq!(out.append(Stream::Stderr, b""), Appended::All);
        assert_eq!(
            out.append(Stream::Stderr, b"x"),
            Appended::CapReached { kept: 0 }
        );
    }

    #[test]
    fn a_sink_gets_exactly_the_kept_bytes_in_order() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut out = Output::new(6);
        assert_eq!(out.append(Stream::Stdout, b"ab"), Appended::All);
        let log = seen.clone();
        out.stream_to(OutputSink::new(move |stream, data| {
            log.lock().unwrap().push((stream, data.to_vec()))
        }));
        out.append(Stream::Stderr, b"cd");
        out.append(Stream::Stdout, b"");
        assert_eq!(
            out.append(Stream::Stdout, b"efgh"),
            Appended::CapReached { kept: 2 }
        );
        out.append(Stream::Stdout, b"i");
        assert_eq!(
            *seen.lock().unwrap(),
            vec![
                (Stream::Stderr, b"cd".to_vec()),
                (Stream::Stdout, b"ef".to_vec())
            ]
        );
    }
}
