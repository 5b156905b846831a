//! Streamed executions (`execute` with `"stream": true`): the program's output goes to the
//! client as `output` frames while it runs, before the `execution` answer.
//!
//! The sink runs on the vCPU's thread inside the guest's write call, so it only queues the
//! bytes (joined with the previous chunk of the same stream); a forwarder thread sends what has
//! queued whenever it wakes. A client that reads slowly therefore never stalls the guest, and
//! what waits is bounded by the execution's output cap. Chunks are decoded as UTF-8 the way the
//! answer's `stdout`/`stderr` are (invalid sequences become U+FFFD), holding back a sequence cut
//! at a chunk's end until its rest arrives, so the chunks of a stream joined are exactly the
//! answer's text.

use std::io;
use std::mem;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};

use crate::process::{OutputSink, Stream};

#[derive(Default)]
struct Pending {
    chunks: Vec<(Stream, Vec<u8>)>,
    done: bool,
}

#[derive(Default)]
struct Queue {
    pending: Mutex<Pending>,
    changed: Condvar,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // Every update is a whole push or take: a panicking holder leaves it consistent.
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One streamed execution's output forwarding.
pub struct LiveOutput {
    queue: Arc<Queue>,
    forwarder: JoinHandle<()>,
}

impl LiveOutput {
    /// Starts the forwarder; `send` gets each stream's text, in the order it was written.
    pub fn start(send: impl Fn(Stream, String) + Send + 'static) -> io::Result<LiveOutput> {
        let queue = Arc::new(Queue::default());
        let forwarding = queue.clone();
        let forwarder = thread::Builder::new()
            .name("sandfork-output".into())
            .spawn(move || forward(&forwarding, send))?;
        Ok(LiveOutput { queue, forwarder })
    }

    /// The sink to run the execution with.
    pub fn sink(&self) -> OutputSink {
        let queue = self.queue.clone();
        OutputSink::new(move |stream, data| {
            let mut pending = queue.lock();
            match pending.chunks.last_mut() {
                Some((last, bytes)) if *last == stream => bytes.extend_from_slice(data),
                _ => pending.chunks.push((stream, data.to_vec())),
            }
            drop(pending);
            queue.changed.notify_one();
        })
    }

    /// The execution ended: sends what is still queued and returns once all of it was sent.
    pub fn finish(self) {
        self.queue.lock().done = true;
        self.queue.changed.notify_one();
        let _ = self.forwarder.join();
    }
}

fn forward(queue: &Queue, send: impl Fn(Stream, String)) {
    let (mut stdout, mut stderr) = (Utf8Decoder::default(), Utf8Decoder::default());
    loop {
        let (chunks, done) = {
            let mut pending = queue.lock();
            while pending.chunks.is_empty() && !pending.done {
                pending = queue
                    .changed
                    .wait(pending)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            (mem::take(&mut pending.chunks), pending.done)
        };
        for (stream, bytes) in chunks {
            let decoder = if stream == Stream::Stdout {
                &mut stdout
            } else {
                &mut stderr
            };
            let text = decoder.push(&bytes);
            if !text.is_empty() {
                send(stream, text);
            }
        }
        if done {
            for (stream, decoder) in [(Stream::Stdout, &mut stdout), (Stream::Stderr, &mut stderr)]
            {
                let rest = decoder.finish();
                if !rest.is_empty() {
                    send(stream, rest);
                }
            }
            return;
        }
    }
}

/// Lossy UTF-8 decoding of a byte stream that arrives in pieces: the same text as
/// `String::from_utf8_lossy` of all the pieces joined.
#[derive(Default)]
struct Utf8Decoder {
    /// The start of a sequence cut at the end of the last piece (at most 3 bytes).
    carry: Vec<u8>,
}

impl Utf8Decoder {
    fn push(&mut self, piece: &[u8]) -> String {
        let mut input = mem::take(&mut self.carry);
        input.extend_from_slice(piece);
        let mut text = String::with_capacity(input.len());
        let mut rest = &input[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    text.push_str(valid);
                    return text;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    text.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        Some(invalid) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[invalid..];
                        }
                        None => {
                            self.carry = after.to_vec();
                            return text;
                        }
                    }
                }
            }
        }
    }

    /// What is left at the end of the stream: a cut sequence is invalid there.
    fn finish(&mut self) -> String {
        String::from_utf8_lossy(&mem::take(&mut self.carry)).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_decode_as_the_whole_does_wherever_they_are_cut() {
        let whole: &[u8] = "a€b😀c".as_bytes();
        let mut bytes = whole.to_vec();
        bytes.extend_from_slice(b"\xff\xe2\x82x\xf0\x9f");
        let expected = String::from_utf8_lossy(&bytes).into_owned();
        for cut in 0..=bytes.len() {
            for cut2 in cut..=bytes.len() {
                let mut decoder = Utf8Decoder::default();
                let text = decoder.push(&bytes[..cut])
                    + &decoder.push(&bytes[cut..cut2])
                    + &decoder.push(&bytes[cut2..])
                    + &decoder.finish();
                assert_eq!(text, expected, "cut at {cut} and {cut2}");
            }
        }
    }

    #[test]
    fn everything_queued_is_sent_in_order_before_finish_returns() {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let log = sent.clone();
        let live = LiveOutput::start(move |stream, text| log.lock().unwrap().push((stream, text)))
            .unwrap();
        let sink = live.sink();
        let write = |stream, data: &[u8]| {
            let mut out = crate::process::Output::new(1 << 20);
            out.stream_to(sink.clone());
            out.append(stream, data);
        };
        write(Stream::Stdout, b"one\n");
        write(Stream::Stdout, b"two \xe2\x82");
        write(Stream::Stderr, b"oops\n");
        write(Stream::Stdout, b"\xac\n");
        live.finish();
        let sent = sent.lock().unwrap();
        let text = |want| {
            sent.iter()
                .filter(|(s, _)| *s == want)
                .map(|(_, t)| t.as_str())
                .collect::<String>()
        };
        assert_eq!(text(Stream::Stdout), "one\ntwo €\n");
        assert_eq!(text(Stream::Stderr), "oops\n");
    }
}
