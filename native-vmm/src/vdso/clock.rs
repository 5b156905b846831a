//! The clock the guests' vDSO reads and the emulated clock calls answer from: the host's TSC
//! converted with parameters in one page per VMM process (`SharedPage`), which every VM with
//! the host's TSC shows read-only at `layout::VVAR_ADDR`:
//!
//! ```text
//! monotonic ns = mono_base + ((tsc - tsc_base) * mult) >> 32      (128-bit product)
//! realtime ns  = monotonic + real_offset,  boottime ns = monotonic + boot_offset
//! ```
//!
//! `vdso/vdso.c` reads the page with the same formula under a sequence count (odd while it is
//! written); the VMM's clock_gettime (`now_ns`) does the same with the host's rdtsc, so both
//! paths give the same time and monotonic never goes backwards from one to the other.
//!
//! A thread (`sandfork-clock`) keeps the page on the host's clocks: every `UPDATE_PERIOD` it
//! reads the host's monotonic clock against the TSC and sets `mult` to the host's measured rate
//! corrected so that the error left closes over the next period (at most `MAX_SLEW` faster
//! or slower; a guest behind by more than `STEP_NS` jumps forward). Each update is anchored at
//! a TSC read after the count went odd: a reader that kept the old parameters read its TSC
//! before that anchor, where old and new agree, so no reader sees time go backwards. The
//! offsets follow the host's realtime and boottime (steps included; changes below
//! `OFFSET_NOISE_NS` are sampling noise and kept out).
//!
//! The TSC is used only where the host kernel itself keeps time with it (its clocksource is
//! `tsc`: invariant and synchronised across CPUs); elsewhere `shared` is None, no VM shows the
//! page and both paths read the host's clocks by system call.

use std::sync::atomic::{fence, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use crate::layout::VVAR_ADDR;
use crate::memory::{GuestMemory, SharedPage};
use crate::sys;

/// Words of the page, in the order of `struct vvar` in vdso/vdso.c.
#[derive(Clone, Copy)]
enum Word {
    Seq,
    Mode,
    TscBase,
    MonoBase,
    Mult,
    RealOffset,
    BootOffset,
}

/// `Word::Mode`: the TSC formula holds (0, the value of a page never written: make the call).
const MODE_TSC: u64 = 1;
pub const UPDATE_PERIOD: Duration = Duration::from_millis(500);
/// How long the first rate measurement spans.
const CALIBRATION: Duration = Duration::from_millis(10);
/// The largest correction of the rate, as a fraction of it (Linux's NTP slews at most 500 ppm).
const MAX_SLEW_PPM: i128 = 1000;
/// A guest clock behind the host's by more than this jumps forward instead of slewing.
const STEP_NS: i128 = 1_000_000;
/// Changes of the realtime or boottime offset smaller than this are noise of the sampling.
const OFFSET_NOISE_NS: i64 = 1000;

/// The conversion of the TSC to the guest's clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub tsc_base: u64,
    pub mono_base: u64,
    /// Nanoseconds per TSC cycle, times 2^32.
    pub mult: u64,
    pub real_offset: i64,
    pub boot_offset: i64,
}

impl Params {
    /// CLOCK_MONOTONIC at TSC `tsc` (a TSC before the base reads as the base).
    pub fn monotonic_at(&self, tsc: u64) -> u64 {
        let delta = u128::from(tsc.saturating_sub(self.tsc_base));
        self.mono_base
            .wrapping_add(((delta * u128::from(self.mult)) >> 32) as u64)
    }
}

/// Which of the guest's clocks (`syscalls::time` maps the clock ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Monotonic,
    Realtime,
    Boottime,
}

/// The host's clocks against its TSC at about one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    tsc: u64,
    mono: u64,
    real_offset: i64,
    boot_offset: i64,
}

fn host_ns(clock: i32) -> u64 {
    let (sec, nsec) = sys::clock_time(clock).unwrap_or((0, 0));
    (sec.max(0) as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(nsec.max(0) as u64)
}

/// When the guest's machine counts as booted, in Unix seconds (2026-01-01 00:00 UTC): every
/// guest's monotonic and boot clocks, `/proc/uptime`, `sysinfo` and `btime` count from it, so
/// none shows when the host booted.
pub const GUEST_BOOT_EPOCH_S: u64 = 1_767_225_600;

/// What the guest's monotonic and boot clocks add to the host's: the host's realtime since
/// `GUEST_BOOT_EPOCH_S` less its monotonic clock, read once per VMM process. It follows
/// realtime, not the host's uptime, so a checkpoint restored in another process or after a
/// host reboot does not see its monotonic clock go back.
pub fn guest_shift_ns() -> i64 {
    static SHIFT: OnceLock<i64> = OnceLock::new();
    *SHIFT.get_or_init(|| {
        let epoch = (GUEST_BOOT_EPOCH_S * 1_000_000_000) as i64;
        host_ns(libc::CLOCK_REALTIME) as i64 - epoch - host_ns(libc::CLOCK_MONOTONIC) as i64
    })
}

/// The host's monotonic clock against the TSC (the midpoint of the tightest of five reads), and
/// `clock` minus monotonic (likewise).
fn sample() -> Sample {
    let tightest = |read: &dyn Fn() -> (u64, u64, u64)| {
        (0..5)
            .map(|_| read())
            .min_by_key(|&(before, _, after)| after.wrapping_sub(before))
            .unwrap_or((0, 0, 0))
    };
    let (t1, mono, t2) = tightest(&|| {
        (
            sys::rdtsc_ordered(),
            host_ns(libc::CLOCK_MONOTONIC),
            sys::rdtsc_ordered(),
        )
    });
    let offset = |clock| {
        let (m1, other, m2) = tightest(&|| {
            (
                host_ns(libc::CLOCK_MONOTONIC),
                host_ns(clock),
                host_ns(libc::CLOCK_MONOTONIC),
            )
        });
        other as i64 - (m1 / 2 + m2 / 2) as i64
    };
    // The guest's monotonic clock is the host's shifted (`guest_shift_ns`); realtime is not.
    let shift = guest_shift_ns();
    Sample {
        tsc: t1 / 2 + t2 / 2,
        mono: mono.wrapping_add(shift as u64),
        real_offset: offset(libc::CLOCK_REALTIME) - shift,
        boot_offset: offset(libc::CLOCK_BOOTTIME),
    }
}

/// The host's rate between two samples: nanoseconds per cycle, times 2^32 (None: no time passed).
fn rate(from: &Sample, to: &Sample) -> Option<u64> {
    let cycles = to.tsc.checked_sub(from.tsc).filter(|&c| c > 0)?;
    let ns = to.mono.checked_sub(from.mono)?;
    u64::try_from((u128::from(ns) << 32) / u128::from(cycles)).ok()
}

/// The parameters after an update at TSC `anchor`: continuous with `current` there, with the
/// host's rate since `previous`, corrected for the error `now` shows, spread over the next
/// `UPDATE_PERIOD`; offsets from `now` where they changed by more than noise.
fn next_params(current: &Params, previous: &Sample, now: &Sample, anchor: u64) -> Params {
    let host_rate = i128::from(rate(previous, now).unwrap_or(current.mult));
    let error = i128::from(now.mono) - i128::from(current.monotonic_at(now.tsc));
    let (step, mult) = if error > STEP_NS {
        (error as u64, host_rate)
    } else {
        let period = UPDATE_PERIOD.as_nanos() as i128;
        let limit = host_rate * MAX_SLEW_PPM / 1_000_000;
        (
            0,
            host_rate + (host_rate * error / period).clamp(-limit, limit),
        )
    };
    let offset = |old: i64, new: i64| {
        if (new - old).abs() < OFFSET_NOISE_NS {
            old
        } else {
            new
        }
    };
    Params {
        tsc_base: anchor,
        mono_base: current.monotonic_at(anchor) + step,
        mult: mult.max(1) as u64,
        real_offset: offset(current.real_offset, now.real_offset),
        boot_offset: offset(current.boot_offset, now.boot_offset),
    }
}

/// The process's clock page and its writer's state.
pub struct Clock {
    page: SharedPage,
    /// The sample of the last update (only the update thread uses it after `start`).
    last: std::sync::Mutex<Sample>,
}

impl Clock {
    /// Calibrates the rate over `CALIBRATION` and writes the first parameters.
    fn calibrate() -> std::io::Result<Clock> {
        let page = SharedPage::new("sandfork-vdso-clock")?;
        let first = sample();
        std::thread::sleep(CALIBRATION);
        let second = sample();
        let mult = rate(&first, &second)
            .ok_or_else(|| std::io::Error::other("the TSC did not advance while calibrating"))?;
        let start = Params {
            tsc_base: second.tsc,
            mono_base: second.mono,
            mult,
            real_offset: second.real_offset,
            boot_offset: second.boot_offset,
        };
        let clock = Clock {
            page,
            last: std::sync::Mutex::new(second),
        };
        clock.publish(|anchor| Params {
            tsc_base: anchor,
            mono_base: start.monotonic_at(anchor),
            ..start
        });
        clock.word(Word::Mode).store(MODE_TSC, Ordering::Release);
        Ok(clock)
    }

    fn word(&self, word: Word) -> &std::sync::atomic::AtomicU64 {
        &self.page.words()[word as usize]
    }

    /// The parameters as readers see them, and a TSC read while they held.
    fn read(&self) -> (Params, u64) {
        loop {
            let seq = self.word(Word::Seq).load(Ordering::Acquire);
            if seq & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let params = self.stored();
            let tsc = sys::rdtsc_ordered();
            fence(Ordering::Acquire);
            if self.word(Word::Seq).load(Ordering::Relaxed) == seq {
                return (params, tsc);
            }
        }
    }

    /// Writes the parameters `next` gives for an anchor TSC read once the count is odd (see the
    /// module doc for why then). Only one thread writes at a time (calibration, then the update
    /// thread).
    fn publish(&self, next: impl FnOnce(u64) -> Params) -> Params {
        let seq = self.word(Word::Seq).load(Ordering::Relaxed);
        self.word(Word::Seq)
            .store(seq.wrapping_add(1), Ordering::Relaxed);
        // A full fence (mfence): the odd count is visible to every reader before the anchor.
        fence(Ordering::SeqCst);
        let params = next(sys::rdtsc_ordered());
        let store = |w, v| self.word(w).store(v, Ordering::Relaxed);
        store(Word::TscBase, params.tsc_base);
        store(Word::MonoBase, params.mono_base);
        store(Word::Mult, params.mult);
        store(Word::RealOffset, params.real_offset as u64);
        store(Word::BootOffset, params.boot_offset as u64);
        self.word(Word::Seq)
            .store(seq.wrapping_add(2), Ordering::Release);
        params
    }

    /// One update (the update thread's loop body).
    fn update(&self) {
        let now = sample();
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let previous = *last;
        // The writer reads its own last parameters: nobody else writes them.
        self.publish(|anchor| next_params(&self.stored(), &previous, &now, anchor));
        *last = now;
    }

    /// The parameters in the page, word by word (consistent only under the count, `read`).
    fn stored(&self) -> Params {
        let load = |w| self.word(w).load(Ordering::Relaxed);
        Params {
            tsc_base: load(Word::TscBase),
            mono_base: load(Word::MonoBase),
            mult: load(Word::Mult),
            real_offset: load(Word::RealOffset) as i64,
            boot_offset: load(Word::BootOffset) as i64,
        }
    }

    /// The guest clock `kind` now, in nanoseconds: what the vDSO reads at this instant.
    pub fn now_ns(&self, kind: Kind) -> u64 {
        let (params, tsc) = self.read();
        let mono = params.monotonic_at(tsc);
        match kind {
            Kind::Monotonic => mono,
            Kind::Realtime => mono.wrapping_add(params.real_offset as u64),
            Kind::Boottime => mono.wrapping_add(params.boot_offset as u64),
        }
    }
}

/// Whether the host keeps its own time with the TSC (its clocksource is `tsc`).
fn host_uses_tsc() -> bool {
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .is_ok_and(|s| s.trim() == "tsc")
}

/// The process's clock, calibrated and updated from the first call on (None: the host does not
/// keep time with the TSC, or the page could not be made). `sandfork-vmm serve` calls it before
/// it confines itself (it reads /sys).
pub fn shared() -> Option<&'static Clock> {
    static CLOCK: OnceLock<Option<Clock>> = OnceLock::new();
    CLOCK
        .get_or_init(|| {
            if !host_uses_tsc() {
                return None;
            }
            let clock = Clock::calibrate()
                .map_err(|e| {
                    eprintln!(
                        "sandfork-vmm: no vDSO clock (the guests' clock calls leave the VM): {e}"
                    )
                })
                .ok()?;
            let started = std::thread::Builder::new()
                .name("sandfork-clock".into())
                .spawn(|| loop {
                    std::thread::sleep(UPDATE_PERIOD);
                    if let Some(clock) = shared() {
                        clock.update();
                    }
                });
            started
                .map_err(|e| {
                    eprintln!(
                        "sandfork-vmm: no vDSO clock (the guests' clock calls leave the VM): {e}"
                    )
                })
                .ok()?;
            Some(clock)
        })
        .as_ref()
}

/// Shows the process's clock page in `mem` at `VVAR_ADDR`, for a VM whose TSC reads the
/// host's (without it the page there reads as zeros and the vDSO makes system calls).
pub fn show_in(mem: &GuestMemory) -> std::io::Result<()> {
    match shared() {
        Some(clock) => mem.show_shared_page(VVAR_ADDR, &clock.page),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GHZ_MULT: u64 = 1 << 32; // 1 ns per cycle

    fn sample_at(tsc: u64, mono: u64) -> Sample {
        Sample {
            tsc,
            mono,
            real_offset: 5_000,
            boot_offset: 0,
        }
    }

    #[test]
    fn an_update_is_continuous_at_its_anchor_and_closes_the_error() {
        let current = Params {
            tsc_base: 1000,
            mono_base: 1_000_000,
            mult: GHZ_MULT,
            real_offset: 5_000,
            boot_offset: 0,
        };
        // The host ran 100 ppm faster than the guest over the last 500 ms.
        let previous = sample_at(1000, 1_000_000);
        let now = sample_at(1000 + 500_000_000, 1_000_000 + 500_050_000);
        let anchor = now.tsc + 10;
        let next = next_params(&current, &previous, &now, anchor);
        assert_eq!(
            next.monotonic_at(anchor),
            current.monotonic_at(anchor),
            "continuous at the anchor"
        );
        assert!(
            next.mult > GHZ_MULT * 10001 / 10000,
            "faster than the host's rate to close the 50 us behind: {}",
            next.mult
        );
        // One period later the guest is within a microsecond of the host (which runs at its rate).
        let later = anchor + 500_000_000;
        let host_later = now.mono + (500_000_000u128 * 10001 / 10000) as u64 + 10;
        assert!(
            (next.monotonic_at(later) as i64 - host_later as i64).abs() < 1000,
            "{} vs {}",
            next.monotonic_at(later),
            host_later
        );
    }

    #[test]
    fn a_guest_far_behind_jumps_forward_and_one_ahead_only_slows_down() {
        let current = Params {
            tsc_base: 0,
            mono_base: 0,
            mult: GHZ_MULT,
            real_offset: 0,
            boot_offset: 0,
        };
        let previous = sample_at(0, 0);
        let behind = next_params(
            &current,
            &previous,
            &sample_at(1_000_000_000, 1_005_000_000),
            1_000_000_000,
        );
        assert_eq!(
            behind.monotonic_at(1_000_000_000),
            1_005_000_000,
            "stepped to the host"
        );
        let ahead = next_params(
            &current,
            &previous,
            &sample_at(1_000_000_000, 995_000_000),
            1_000_000_000,
        );
        assert_eq!(
            ahead.monotonic_at(1_000_000_000),
            1_000_000_000,
            "never backwards"
        );
        let rate = (995u128 << 32) / 1000;
        assert!(
            u128::from(ahead.mult) >= rate * 999 / 1000 && u128::from(ahead.mult) < rate,
            "slower by at most the slew limit: {}",
            ahead.mult
        );
    }

    #[test]
    fn offsets_follow_steps_but_not_noise() {
        let current = Params {
            tsc_base: 0,
            mono_base: 0,
            mult: GHZ_MULT,
            real_offset: 5_000,
            boot_offset: 0,
        };
        let previous = sample_at(0, 0);
        let noisy = Sample {
            real_offset: 5_300,
            ..sample_at(1000, 1000)
        };
        assert_eq!(
            next_params(&current, &previous, &noisy, 1000).real_offset,
            5_000
        );
        let stepped = Sample {
            real_offset: -3_000_000_000,
            boot_offset: 7_000_000,
            ..sample_at(1000, 1000)
        };
        let next = next_params(&current, &previous, &stepped, 1000);
        assert_eq!(
            (next.real_offset, next.boot_offset),
            (-3_000_000_000, 7_000_000)
        );
    }

    #[test]
    fn a_tsc_before_the_base_reads_as_the_base() {
        let params = Params {
            tsc_base: 1000,
            mono_base: 77,
            mult: GHZ_MULT * 3,
            real_offset: 0,
            boot_offset: 0,
        };
        assert_eq!(params.monotonic_at(10), 77);
        assert_eq!(params.monotonic_at(1010), 107);
        // Hours of cycles at 2.6 GHz do not overflow the product.
        let hours = Params {
            mult: (1u64 << 32) * 10 / 26,
            ..params
        };
        let ten_thousand_seconds = hours.monotonic_at(1000 + 26_000_000_000_000) - 77;
        assert!(
            10_000_000_000_000 - ten_thousand_seconds < 10_000,
            "{ten_thousand_seconds}: only the rounding of mult is lost"
        );
    }

    #[test]
    fn the_shared_clock_follows_the_host_and_is_monotonic() {
        let Some(clock) = shared() else {
            assert!(
                !host_uses_tsc(),
                "the host keeps time with the TSC, so the clock must exist"
            );
            return;
        };
        // The guest's monotonic clock is the host's, shifted to count from the guest's boot.
        let host_mono = || host_ns(libc::CLOCK_MONOTONIC).wrapping_add(guest_shift_ns() as u64);
        let mut last = 0;
        for _ in 0..1000 {
            let host = host_mono();
            let ours = clock.now_ns(Kind::Monotonic);
            assert!(ours >= last, "monotonic: {ours} after {last}");
            last = ours;
            assert!(
                (ours as i64 - host as i64).abs() < 1_000_000,
                "within 1 ms of the host: {ours} vs {host}"
            );
        }
        // Its boot is the guest's epoch, not the host's boot.
        let booted = clock.now_ns(Kind::Realtime) - clock.now_ns(Kind::Boottime);
        let host_booted = host_ns(libc::CLOCK_REALTIME) - host_ns(libc::CLOCK_BOOTTIME);
        assert!(
            (booted as i64 - (GUEST_BOOT_EPOCH_S * 1_000_000_000) as i64).abs() < 1_000_000_000,
            "booted at {booted}, not the guest's epoch"
        );
        assert!((booted as i64 - host_booted as i64).abs() > 1_000_000_000);
        let real = host_ns(libc::CLOCK_REALTIME) as i64;
        assert!((clock.now_ns(Kind::Realtime) as i64 - real).abs() < 1_000_000);
        // The update keeps it so.
        clock.update();
        let host = host_mono();
        assert!(clock.now_ns(Kind::Monotonic) >= last);
        assert!((clock.now_ns(Kind::Monotonic) as i64 - host as i64).abs() < 1_000_000);
    }
}
