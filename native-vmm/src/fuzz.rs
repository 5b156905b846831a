//! Test support for the fuzz tests: seeded corruption of valid inputs for the readers that take
//! bytes from outside (the daemon's frames, file images, template snapshots), and the seed the
//! syscall fuzzer (tests/syscall_fuzz_kvm.rs) starts from. One seed replays a whole test:
//! `SANDFORK_FUZZ_SEED` (decimal or 0x hex) sets it, otherwise it is drawn from the clock and
//! printed; `SANDFORK_FUZZ_CASES` sets how many inputs a reader's test tries (default 3000).

/// A xorshift generator: reproducible input without dependencies.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in 0..n (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// A number from the environment, decimal or 0x hex; a malformed one fails the test.
pub fn env_number(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={text}: expected a number")))
}

/// `SANDFORK_FUZZ_SEED`, or one drawn from the clock.
pub fn seed() -> u64 {
    env_number("SANDFORK_FUZZ_SEED").unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        now.as_nanos() as u64
    })
}

/// The generator of the fuzz test `test`, and how many cases it should try; prints the seed.
pub fn start(test: &str) -> (Rng, usize) {
    let seed = seed();
    let cases = env_number("SANDFORK_FUZZ_CASES").unwrap_or(3000) as usize;
    eprintln!("{test}: seed {seed:#x} (SANDFORK_FUZZ_SEED={seed:#x} replays it), {cases} cases");
    (Rng::new(seed), cases)
}

/// Values that break length and offset arithmetic when they land in a field.
const INTERESTING: [u64; 10] = [
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0x7fff_ffff,
    0xffff_ffff,
    1 << 32,
    i64::MAX as u64,
    u64::MAX,
];

/// `input` with one to four corruptions: bit flips, bytes set to edge values, little- or
/// big-endian integer fields overwritten with edge values, bytes inserted, ranges deleted or
/// duplicated, the end cut off.
pub fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        if out.is_empty() {
            out.push(rng.next_u64() as u8);
            continue;
        }
        let at = rng.below(out.len());
        match rng.below(8) {
            0 => out[at] ^= 1 << rng.below(8),
            1 => out[at] = INTERESTING[rng.below(INTERESTING.len())] as u8,
            2 | 3 => {
                let width = [2, 4, 8][rng.below(3)];
                let value = INTERESTING[rng.below(INTERESTING.len())];
                let bytes = if rng.below(2) == 0 {
                    value.to_le_bytes()
                } else {
                    value.to_be_bytes()
                };
                let end = (at + width).min(out.len());
                out[at..end].copy_from_slice(&bytes[..end - at]);
            }
            4 => {
                let n = 1 + rng.below(16);
                let fill: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                out.splice(at..at, fill);
            }
            5 => {
                let end = (at + 1 + rng.below(64)).min(out.len());
                out.drain(at..end);
            }
            6 => {
                let end = (at + 1 + rng.below(64)).min(out.len());
                let copy = out[at..end].to_vec();
                let to = rng.below(out.len());
                out.splice(to..to, copy);
            }
            _ => out.truncate(at),
        }
    }
    out
}
