//! A pseudo-terminal pair (/dev/ptmx and /dev/pts/N) as the tree shares it: the settings
//! (termios, window size), the two queues between the ends and the line discipline between
//! them, as Linux's n_tty does the parts programs use. What the master writes is input: it is
//! translated (ICRNL, INLCR, IGNCR), may become a signal (ISIG), is edited into lines (ICANON:
//! ERASE, WERASE, KILL, EOF) and echoed (ECHO, ECHOE, ECHOK, ECHONL, ECHOCTL) before the slave
//! reads it. What the slave writes is output, translated (OPOST: ONLCR, OCRNL) for the
//! master. Which process a signal reaches and which fds hold the ends is the caller's
//! (`syscalls::terminal`, `process::fds`).

use std::collections::VecDeque;

use super::signals::{SIGINT, SIGQUIT, SIGTSTP};

// c_iflag bits.
const ISTRIP: u32 = 0o40;
const INLCR: u32 = 0o100;
const IGNCR: u32 = 0o200;
const ICRNL: u32 = 0o400;
const IXON: u32 = 0o2000;
const IUTF8: u32 = 0o40000;
// c_oflag bits.
const OPOST: u32 = 0o1;
const ONLCR: u32 = 0o4;
const OCRNL: u32 = 0o10;
// c_cflag bits.
const B38400: u32 = 0o17;
const CS8: u32 = 0o60;
const CREAD: u32 = 0o200;
// c_lflag bits.
const ISIG: u32 = 0o1;
const ICANON: u32 = 0o2;
const ECHO: u32 = 0o10;
const ECHOE: u32 = 0o20;
const ECHOK: u32 = 0o40;
const ECHONL: u32 = 0o100;
const NOFLSH: u32 = 0o200;
const ECHOCTL: u32 = 0o1000;
const ECHOKE: u32 = 0o4000;
const TOSTOP: u32 = 0o400;
const IEXTEN: u32 = 0o100000;
// c_cc indexes.
const VINTR: usize = 0;
const VQUIT: usize = 1;
const VERASE: usize = 2;
const VKILL: usize = 3;
const VEOF: usize = 4;
const VTIME: usize = 5;
const VMIN: usize = 6;
const VSUSP: usize = 10;
const VEOL: usize = 11;
const VWERASE: usize = 14;
const VEOL2: usize = 16;
/// Control characters in the kernel's struct termios.
pub const NCCS: usize = 19;
/// A c_cc value that disables its function.
const DISABLED: u8 = 0;

/// Bytes each direction holds at most (Linux's pty buffers are of this order): a write past
/// it waits for the other end to read.
pub const TERMINAL_CAPACITY: usize = 64 * 1024;
/// The longest line ICANON edits (Linux's N_TTY_BUF_SIZE less the newline); bytes past it are
/// dropped until the line ends.
const MAX_LINE: usize = 4095;

/// The kernel's `struct termios` (TCGETS/TCSETS), its speeds kept for `struct termios2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Termios {
    pub iflag: u32,
    pub oflag: u32,
    pub cflag: u32,
    pub lflag: u32,
    pub line: u8,
    pub cc: [u8; NCCS],
    pub ispeed: u32,
    pub ospeed: u32,
}

/// Bytes of `struct termios` and `struct termios2`.
pub const TERMIOS_BYTES: usize = 36;
pub const TERMIOS2_BYTES: usize = 44;

impl Default for Termios {
    /// What Linux gives a new pseudo-terminal's slave.
    fn default() -> Termios {
        Termios {
            iflag: ICRNL | IXON,
            oflag: OPOST | ONLCR,
            cflag: B38400 | CS8 | CREAD,
            lflag: ISIG | ICANON | ECHO | ECHOE | ECHOK | ECHOCTL | ECHOKE | IEXTEN,
            line: 0,
            cc: [
                0o3, 0o34, 0o177, 0o25, 0o4, 0, 1, 0, 0o21, 0o23, 0o32, 0, 0o22, 0o17, 0o27, 0o26,
                0, 0, 0,
            ],
            ispeed: 38400,
            ospeed: 38400,
        }
    }
}

impl Termios {
    /// The layout of `struct termios`, or with `speeds` of `struct termios2`.
    pub fn to_bytes(&self, speeds: bool) -> Vec<u8> {
        let mut b = Vec::with_capacity(TERMIOS2_BYTES);
        for flag in [self.iflag, self.oflag, self.cflag, self.lflag] {
            b.extend_from_slice(&flag.to_le_bytes());
        }
        b.push(self.line);
        b.extend_from_slice(&self.cc);
        if speeds {
            b.extend_from_slice(&self.ispeed.to_le_bytes());
            b.extend_from_slice(&self.ospeed.to_le_bytes());
        }
        b
    }

    /// Reads `struct termios` (36 bytes: the speeds are kept) or `struct termios2` (44).
    pub fn from_bytes(b: &[u8], old: &Termios) -> Termios {
        let word = |at: usize| {
            b.get(at..at + 4)
                .map_or(0, |w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        };
        let mut cc = [0u8; NCCS];
        if let Some(bytes) = b.get(17..17 + NCCS) {
            cc.copy_from_slice(bytes);
        }
        let speeds = b.len() >= TERMIOS2_BYTES;
        Termios {
            iflag: word(0),
            oflag: word(4),
            cflag: word(8),
            lflag: word(12),
            line: b.get(16).copied().unwrap_or(0),
            cc,
            ispeed: if speeds { word(36) } else { old.ispeed },
            ospeed: if speeds { word(40) } else { old.ospeed },
        }
    }

    fn local(&self, bits: u32) -> bool {
        self.lflag & bits == bits
    }

    /// `c` is control character `index`, which is not disabled.
    fn is(&self, index: usize, c: u8) -> bool {
        self.cc[index] != DISABLED && self.cc[index] == c
    }

    /// TOSTOP: a background process's write to the terminal stops its group (SIGTTOU).
    pub fn stops_background_writes(&self) -> bool {
        self.local(TOSTOP)
    }

    pub fn canonical(&self) -> bool {
        self.local(ICANON)
    }

    /// VMIN and VTIME (tenths of a second) of a non-canonical read.
    pub fn min_time(&self) -> (u8, u8) {
        (self.cc[VMIN], self.cc[VTIME])
    }
}

/// What a read of the slave came to.
#[derive(Debug, PartialEq, Eq)]
pub enum SlaveRead {
    Bytes(Vec<u8>),
    /// Nothing to read yet.
    Empty,
    /// End of file: an EOF character on an empty line, or the master is gone.
    EndOfFile,
}

/// One pseudo-terminal pair.
#[derive(Debug, Clone)]
pub struct Terminal {
    pub termios: Termios,
    /// struct winsize: rows, columns, x and y pixels.
    pub winsize: [u16; 4],
    /// TIOCSPTLCK: the slave cannot be opened by path while locked.
    pub locked: bool,
    /// Descriptions of each end that are open.
    pub masters: u32,
    pub slaves: u32,
    /// The slave has been open: from then on a master read past the output with no slave
    /// open is EIO, as Linux's.
    slave_opened: bool,
    /// The session it is the controlling terminal of, and its foreground process group.
    pub session: Option<u64>,
    pub foreground: Option<u64>,
    /// Input the slave may read: completed lines in canonical mode (an empty one is an EOF
    /// character on an empty line), chunks otherwise.
    ready: VecDeque<Vec<u8>>,
    /// The line being edited (canonical mode).
    line: Vec<u8>,
    /// Output for the master to read (the slave's writes and the echoes).
    output: VecDeque<u8>,
}

impl Default for Terminal {
    fn default() -> Terminal {
        Terminal {
            termios: Termios::default(),
            winsize: [0; 4],
            locked: true,
            masters: 0,
            slaves: 0,
            slave_opened: false,
            session: None,
            foreground: None,
            ready: VecDeque::new(),
            line: Vec::new(),
            output: VecDeque::new(),
        }
    }
}

impl Terminal {
    /// A slave description was opened.
    pub fn open_slave(&mut self) {
        self.slaves += 1;
        self.slave_opened = true;
    }

    /// Input bytes waiting for the slave (FIONREAD on it).
    pub fn input_buffered(&self) -> usize {
        self.ready.iter().map(Vec::len).sum()
    }

    /// Output bytes waiting for the master (FIONREAD on it).
    pub fn output_buffered(&self) -> usize {
        self.output.len()
    }

    /// The master closed for good: reads of the slave end, writes fail.
    pub fn hung_up(&self) -> bool {
        self.masters == 0
    }

    /// A master read would fail with EIO: nothing to read and the slave closed.
    pub fn master_eio(&self) -> bool {
        self.output.is_empty() && self.slaves == 0 && self.slave_opened
    }

    /// The slave has something to read (a whole line in canonical mode), or end of file.
    pub fn slave_readable(&self) -> bool {
        self.hung_up()
            || if self.termios.canonical() {
                !self.ready.is_empty()
            } else {
                self.ready.iter().any(|chunk| !chunk.is_empty())
            }
    }

    /// Room for the master's next input bytes.
    pub fn input_room(&self) -> usize {
        TERMINAL_CAPACITY.saturating_sub(self.input_buffered() + self.line.len())
    }

    /// Room for the slave's next output bytes.
    pub fn output_room(&self) -> usize {
        TERMINAL_CAPACITY.saturating_sub(self.output.len())
    }

    /// The master reads up to `max` output bytes (None: nothing there).
    pub fn read_master(&mut self, max: usize) -> Option<Vec<u8>> {
        if self.output.is_empty() {
            return None;
        }
        let n = max.min(self.output.len());
        Some(self.output.drain(..n).collect())
    }

    /// The slave reads up to `max` input bytes: one line at most in canonical mode.
    pub fn read_slave(&mut self, max: usize) -> SlaveRead {
        if self.termios.canonical() {
            let Some(first) = self.ready.front_mut() else {
                return self.nothing_to_read();
            };
            if first.is_empty() {
                self.ready.pop_front();
                return SlaveRead::EndOfFile;
            }
            if first.len() > max {
                return SlaveRead::Bytes(first.drain(..max).collect());
            }
            return SlaveRead::Bytes(self.ready.pop_front().unwrap_or_default());
        }
        let mut out = Vec::new();
        while out.len() < max {
            let Some(first) = self.ready.front_mut() else {
                break;
            };
            let n = (max - out.len()).min(first.len());
            out.extend(first.drain(..n));
            if first.is_empty() {
                self.ready.pop_front();
            }
        }
        if out.is_empty() {
            self.nothing_to_read()
        } else {
            SlaveRead::Bytes(out)
        }
    }

    fn nothing_to_read(&self) -> SlaveRead {
        if self.hung_up() {
            SlaveRead::EndOfFile
        } else {
            SlaveRead::Empty
        }
    }

    /// The slave writes `data`: what fits goes out translated; returns how many of `data`'s
    /// bytes were taken.
    pub fn write_slave(&mut self, data: &[u8]) -> usize {
        let mut taken = 0;
        for &c in data {
            let out = self.translate_output(c);
            if out.len() > self.output_room() {
                break;
            }
            self.output.extend(out);
            taken += 1;
        }
        taken
    }

    fn translate_output(&self, c: u8) -> Vec<u8> {
        let oflag = self.termios.oflag;
        if oflag & OPOST == 0 {
            return vec![c];
        }
        match c {
            b'\n' if oflag & ONLCR != 0 => b"\r\n".to_vec(),
            b'\r' if oflag & OCRNL != 0 => vec![b'\n'],
            _ => vec![c],
        }
    }

    /// An echo: translated as output, dropped when the output is full (as Linux's echoes
    /// wait in a small ring that overwrites).
    fn echo(&mut self, bytes: &[u8]) {
        for &c in bytes {
            let out = self.translate_output(c);
            if out.len() <= self.output_room() {
                self.output.extend(out);
            }
        }
    }

    /// How a character echoes: control characters as ^X with ECHOCTL.
    fn echo_form(&self, c: u8) -> Vec<u8> {
        if self.termios.local(ECHOCTL) && (c < 0x20 || c == 0x7f) && c != b'\t' && c != b'\n' {
            vec![b'^', c ^ 0x40]
        } else {
            vec![c]
        }
    }

    /// The master writes `data`: what fits is taken as input (translated, edited, echoed);
    /// returns how many bytes were taken and the signals the input raised for the foreground
    /// process group, in order.
    pub fn write_master(&mut self, data: &[u8]) -> (usize, Vec<u64>) {
        let n = data.len().min(self.input_room());
        let echo_mark = self.output.len();
        let mut signals = Vec::new();
        for &c in &data[..n] {
            if let Some(sig) = self.receive(c, echo_mark) {
                signals.push(sig);
            }
        }
        (n, signals)
    }

    /// One input character of a write that began when the output was `echo_mark` long; a
    /// signal it raises.
    fn receive(&mut self, mut c: u8, echo_mark: usize) -> Option<u64> {
        let t = self.termios;
        if t.iflag & ISTRIP != 0 {
            c &= 0x7f;
        }
        match c {
            b'\r' if t.iflag & IGNCR != 0 => return None,
            b'\r' if t.iflag & ICRNL != 0 => c = b'\n',
            b'\n' if t.iflag & INLCR != 0 => c = b'\r',
            _ => {}
        }
        if t.local(ISIG) {
            let sig = [(VINTR, SIGINT), (VQUIT, SIGQUIT), (VSUSP, SIGTSTP)]
                .into_iter()
                .find(|&(index, _)| t.is(index, c))
                .map(|(_, sig)| sig);
            if let Some(sig) = sig {
                // The input and this write's echoes go, as Linux's isig() drops its echo
                // buffer (output the master could already read stays).
                if !t.local(NOFLSH) {
                    self.flush(true, false);
                    self.output.truncate(echo_mark);
                }
                if t.local(ECHO) {
                    let echoed = self.echo_form(c);
                    self.echo(&echoed);
                }
                return Some(sig);
            }
        }
        if !t.canonical() {
            if t.local(ECHO) {
                let echoed = self.echo_form(c);
                self.echo(&echoed);
            } else if c == b'\n' && t.local(ECHONL) {
                self.echo(b"\n");
            }
            match self.ready.back_mut() {
                Some(chunk) if !chunk.is_empty() => chunk.push(c),
                _ => self.ready.push_back(vec![c]),
            }
            return None;
        }
        if t.is(VERASE, c) {
            self.erase_chars(1);
        } else if t.local(IEXTEN) && t.is(VWERASE, c) {
            self.erase_word();
        } else if t.is(VKILL, c) {
            self.kill_line(c);
        } else if t.is(VEOF, c) {
            self.ready.push_back(std::mem::take(&mut self.line));
        } else if c == b'\n' || t.is(VEOL, c) || t.is(VEOL2, c) {
            if t.local(ECHO) || (c == b'\n' && t.local(ECHONL)) {
                let echoed = if c == b'\n' {
                    vec![c]
                } else {
                    self.echo_form(c)
                };
                self.echo(&echoed);
            }
            self.line.push(c);
            self.ready.push_back(std::mem::take(&mut self.line));
        } else if self.line.len() < MAX_LINE {
            if t.local(ECHO) {
                let echoed = self.echo_form(c);
                self.echo(&echoed);
            }
            self.line.push(c);
        }
        None
    }

    /// ERASE: takes the last `count` characters off the line (a UTF-8 character whole with
    /// IUTF8), echoing "\b \b" for each column with ECHOE.
    fn erase_chars(&mut self, count: usize) {
        let t = self.termios;
        for _ in 0..count {
            let Some(mut c) = self.line.pop() else {
                return;
            };
            if t.iflag & IUTF8 != 0 {
                while c & 0xc0 == 0x80 {
                    match self.line.pop() {
                        Some(lead) => c = lead,
                        None => break,
                    }
                }
            }
            if !t.local(ECHO) {
                continue;
            }
            if t.local(ECHOE) {
                let columns = self.echo_form(c).len();
                for _ in 0..columns {
                    self.echo(b"\x08 \x08");
                }
            } else {
                let echoed = self.echo_form(t.cc[VERASE]);
                self.echo(&echoed);
            }
        }
    }

    /// WERASE: the blanks before the cursor, then the word before them.
    fn erase_word(&mut self) {
        let blank = |c: &u8| *c == b' ' || *c == b'\t';
        let blanks = self.line.iter().rev().take_while(|c| blank(c)).count();
        let word = self.line[..self.line.len() - blanks]
            .iter()
            .rev()
            .take_while(|c| !blank(c))
            .count();
        self.erase_chars(blanks + word);
    }

    /// KILL: the whole line goes; erased on the screen with ECHOKE, else the KILL character
    /// echoed and (ECHOK) a newline.
    fn kill_line(&mut self, c: u8) {
        let t = self.termios;
        if t.local(ECHO) && t.local(ECHOE) && t.local(ECHOKE) {
            self.erase_chars(self.line.len());
            return;
        }
        self.line.clear();
        if t.local(ECHO) {
            let echoed = self.echo_form(c);
            self.echo(&echoed);
            if t.local(ECHOK) {
                self.echo(b"\n");
            }
        }
    }

    /// TCSETS*: new settings; leaving canonical mode makes the line being edited readable.
    pub fn set_termios(&mut self, termios: Termios) {
        if self.termios.canonical() && !termios.canonical() && !self.line.is_empty() {
            self.ready.push_back(std::mem::take(&mut self.line));
        }
        self.termios = termios;
    }

    /// TCFLSH and TCSETSF: drops pending input (and the line), or output.
    pub fn flush(&mut self, input: bool, output: bool) {
        if input {
            self.ready.clear();
            self.line.clear();
        }
        if output {
            self.output.clear();
        }
    }
}

/// The flags cfmakeraw clears, as Linux programs set raw mode (tests use them).
#[cfg(test)]
fn make_raw(t: &mut Termios) {
    const IGNBRK: u32 = 0o1;
    const BRKINT: u32 = 0o2;
    t.iflag &= !(IGNBRK | BRKINT | ISTRIP | INLCR | IGNCR | ICRNL | IXON);
    t.oflag &= !OPOST;
    t.lflag &= !(ECHO | ECHONL | ICANON | ISIG | IEXTEN);
    t.cflag |= CS8;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> Terminal {
        let mut t = Terminal {
            masters: 1,
            ..Terminal::default()
        };
        t.open_slave();
        t
    }

    fn output(t: &mut Terminal) -> Vec<u8> {
        t.read_master(usize::MAX).unwrap_or_default()
    }

    #[test]
    fn canonical_input_is_edited_echoed_and_read_a_line_at_a_time() {
        let mut t = open();
        assert_eq!(t.write_master(b"ab"), (2, vec![]));
        assert!(!t.slave_readable(), "no whole line yet");
        assert_eq!(t.write_master(b"\x7fc\rde"), (5, vec![]));
        assert!(t.slave_readable());
        assert_eq!(output(&mut t), b"ab\x08 \x08c\r\nde");
        t.write_master(b"\x15xy\x04\x04");
        assert_eq!(t.read_slave(2), SlaveRead::Bytes(b"ac".to_vec()));
        assert_eq!(t.read_slave(100), SlaveRead::Bytes(b"\n".to_vec()));
        assert_eq!(t.read_slave(100), SlaveRead::Bytes(b"xy".to_vec()));
        assert_eq!(
            t.read_slave(100),
            SlaveRead::EndOfFile,
            "^D on an empty line"
        );
        assert_eq!(t.read_slave(100), SlaveRead::Empty);
        assert_eq!(output(&mut t), b"\x08 \x08\x08 \x08xy");
        t.write_master(b"one two  \x17\x17x\n");
        assert_eq!(t.read_slave(100), SlaveRead::Bytes(b"x\n".to_vec()));
    }

    #[test]
    fn signal_characters_flush_and_echo_and_raw_mode_passes_bytes() {
        let mut t = open();
        assert_eq!(t.write_master(b"abc\x03\x1c\x1a"), (6, vec![2, 3, 20]));
        assert_eq!(output(&mut t), b"^Z", "each drops the echoes before it");
        assert!(!t.slave_readable());
        t.write_slave(b"kept");
        t.write_master(b"x\x03");
        assert_eq!(output(&mut t), b"kept^C");
        let mut raw = t.termios;
        make_raw(&mut raw);
        t.set_termios(raw);
        t.write_master(b"\x03\r\n");
        assert_eq!(t.read_slave(100), SlaveRead::Bytes(b"\x03\r\n".to_vec()));
        assert_eq!(output(&mut t), b"", "no echo in raw mode");
        assert_eq!(t.write_slave(b"a\nb"), 3);
        assert_eq!(output(&mut t), b"a\nb", "no ONLCR without OPOST");
    }

    #[test]
    fn output_is_translated_and_bounded_and_a_closed_slave_reads_eio() {
        let mut t = open();
        assert_eq!(t.write_slave(b"hi\n"), 3);
        assert_eq!(output(&mut t), b"hi\r\n");
        let big = vec![b'\n'; TERMINAL_CAPACITY];
        assert_eq!(
            t.write_slave(&big),
            TERMINAL_CAPACITY / 2,
            "each takes two bytes"
        );
        assert_eq!(t.output_room(), 0);
        t.slaves = 0;
        assert!(!t.master_eio(), "what was written is read first");
        t.flush(false, true);
        assert!(t.master_eio());
        t.masters = 0;
        assert_eq!(t.read_slave(1), SlaveRead::EndOfFile, "hung up");
    }

    #[test]
    fn termios_round_trips_both_layouts() {
        let t = Termios::default();
        let bytes = t.to_bytes(false);
        assert_eq!(bytes.len(), TERMIOS_BYTES);
        assert_eq!(&bytes[..4], &0x500u32.to_le_bytes());
        assert_eq!(Termios::from_bytes(&bytes, &t), t);
        let two = t.to_bytes(true);
        assert_eq!(two.len(), TERMIOS2_BYTES);
        assert_eq!(Termios::from_bytes(&two, &t), t);
    }
}
