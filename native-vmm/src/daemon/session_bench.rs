//! `sandfork-vmm bench sessions`: what a session's durability costs, measured in one run on
//! the daemon's own `Sessions` (no socket in the way), for two cells: one that writes a new
//! byte in every page of a buffer (its pages are almost all zeros: the friendly case for sparse
//! pages) and one that fills the buffer with fresh random bytes (nothing to leave out: the
//! worst case). For each: checkpoint p50/p99 of a session that dirtied 1 MiB and 32 MiB beyond
//! what its interpreter itself dirties, pause p50, resume p50 (request to the VM ready at its
//! first instruction: checkpoint read and verified, memory forked and filled, vCPU restored),
//! the bytes of the files written, and durable checkpoints per second with 8 sessions
//! checkpointing at once, each after a cell that wrote 1 MiB (checkpoints are incremental: each
//! holds what was written since the one before). Baselines from the same run: writing and
//! fdatasync'ing as many bytes as those checkpoints' files to a file natively (one at a time,
//! and from 8 threads at once), and spawning `/usr/bin/python3.11 -c pass`.
//!
//! Also here: a template saved from a session (`session_template`), which `bench exec
//! --from-session` measures beside the template it came from.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crate::bench::{measure_native, Latency, ARGS, PROGRAM};
use crate::daemon::bench::latency;
use crate::daemon::executor::ExecutionLimits;
use crate::daemon::sessions::{CellRun, SessionError, Sessions, SessionsConfig, TakenCheckpoint};
use crate::daemon::templates::load_folder;
use crate::kvm;
use crate::snapshot::sparse::PageCounts;
use crate::snapshot::SavedFork;

pub const DEFAULT_ITERATIONS: usize = 100;
const CONCURRENCY: usize = 8;

/// What a benchmark cell writes into its buffer each time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellBytes {
    /// A new byte in every page (a page written with the bytes it held is left out of a
    /// checkpoint), zeros elsewhere.
    OneBytePerPage,
    /// Fresh random bytes from /dev/urandom, read straight into the buffer.
    Random,
}

impl CellBytes {
    const ALL: [CellBytes; 2] = [CellBytes::OneBytePerPage, CellBytes::Random];

    fn key(self) -> &'static str {
        match self {
            CellBytes::OneBytePerPage => "one_byte_per_page",
            CellBytes::Random => "random",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            CellBytes::OneBytePerPage => "a new byte in every page (mostly zeros)",
            CellBytes::Random => "fresh random bytes (incompressible)",
        }
    }

    /// The cell that rewrites `mib` MiB of a buffer kept in the session, so that every
    /// checkpoint after it holds that many pages more than the interpreter's own.
    fn code(self, mib: u64) -> String {
        let setup = format!("try:\n    blob\nexcept NameError:\n    blob, k, view = bytearray({mib} << 20), 0, None\n");
        match self {
            CellBytes::OneBytePerPage => format!("{setup}k = k % 250 + 1\nblob[::4096] = bytes([k]) * (len(blob) // 4096)\nNone"),
            // Read in place: os.urandom would leave a second buffer's pages dirty too.
            CellBytes::Random => format!("{setup}if view is None:\n    view, rand = memoryview(blob), open('/dev/urandom', 'rb', buffering=0)\nn = 0\nwhile n < len(blob):\n    n += rand.readinto(view[n:])\nNone"),
        }
    }
}

/// One cell's figures at one dirty size.
#[derive(Debug, Clone)]
pub struct DirtyFigures {
    pub cell: CellBytes,
    pub written_mib: u64,
    /// Guest page bytes the checkpoint recorded (the interpreter's own pages included).
    pub dirty_bytes: u64,
    /// What its file held on average, and how the last one stored its pages.
    pub file_bytes: u64,
    pub pages: PageCounts,
    pub checkpoint: Latency,
    /// The CPU time of those checkpoints on the VM's thread: what the machine's load does not
    /// stretch (it does the wall times on a shared machine).
    pub checkpoint_cpu: Latency,
    /// Native write + fdatasync + rename of as many bytes as its files.
    pub native_write: Latency,
    pub pause: Latency,
    /// A pause's file (incremental on the checkpoint the session resumed from), on average.
    pub pause_file_bytes: u64,
    pub resume: Latency,
}

/// Durable checkpoints per second of `CONCURRENCY` sessions at once, each after a 1 MiB cell.
#[derive(Debug, Clone)]
pub struct ConcurrentFigures {
    pub cell: CellBytes,
    /// In rounds that start together, and sustained (each session's own rate, 1 / its mean
    /// checkpoint time, summed, while the others run their cells and checkpoints as they come).
    pub rounds_per_s: f64,
    pub sustained_per_s: f64,
    /// What those checkpoints' files held on average (the full ones among them), and the rate
    /// of as many native durable writes of that size from `CONCURRENCY` threads.
    pub file_bytes: u64,
    pub native_per_s: f64,
    /// The mean CPU time of a checkpoint on its VM's thread (in rounds): the machine's cores
    /// divided by it bound the rate.
    pub cpu_per_checkpoint: Duration,
}

#[derive(Debug, Clone)]
pub struct SessionReport {
    pub iterations: usize,
    pub sizes: Vec<DirtyFigures>,
    pub concurrent: Vec<ConcurrentFigures>,
    pub native_python: Latency,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn kib(bytes: u64) -> f64 {
    bytes as f64 / 1024.0
}

impl fmt::Display for SessionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "session durability, {} iterations per figure",
            self.iterations
        )?;
        for s in &self.sizes {
            writeln!(
                f,
                "  {} MiB of {} ({:.1} MiB of pages in the checkpoint):",
                s.written_mib,
                s.cell.describe(),
                s.dirty_bytes as f64 / f64::from(1 << 20)
            )?;
            let p = s.pages;
            writeln!(f, "    file per checkpoint    {:.0} KiB  (the last one's pages: {} zero, {} sparse, {} changed chunks only, {} raw)", kib(s.file_bytes), p.zero, p.sparse, p.delta, p.raw)?;
            writeln!(
                f,
                "    checkpoint (durable)   p50 {:.2} ms  p99 {:.2} ms",
                ms(s.checkpoint.p50),
                ms(s.checkpoint.p99)
            )?;
            writeln!(f, "    its CPU time           p50 {:.2} ms  p99 {:.2} ms  (the VM thread's: capture, write, hash)", ms(s.checkpoint_cpu.p50), ms(s.checkpoint_cpu.p99))?;
            writeln!(f, "    native write+fdatasync p50 {:.2} ms  p99 {:.2} ms  (as many bytes as the files, baseline)", ms(s.native_write.p50), ms(s.native_write.p99))?;
            writeln!(
                f,
                "    pause                  p50 {:.2} ms  p99 {:.2} ms  ({:.0} KiB file)",
                ms(s.pause.p50),
                ms(s.pause.p99),
                kib(s.pause_file_bytes)
            )?;
            writeln!(
                f,
                "    resume (VM ready)      p50 {:.2} ms  p99 {:.2} ms",
                ms(s.resume.p50),
                ms(s.resume.p99)
            )?;
        }
        for c in &self.concurrent {
            writeln!(f, "  durable checkpoints at concurrency {CONCURRENCY}, each after a cell writing 1 MiB of {}:", c.cell.describe())?;
            writeln!(f, "    {:.0} per s in rounds of {CONCURRENCY} at once, {:.0} per s sustained  ({:.0} KiB files on average; {:.2} ms of CPU each on its VM's thread)", c.rounds_per_s, c.sustained_per_s, kib(c.file_bytes), ms(c.cpu_per_checkpoint))?;
            writeln!(f, "    native write+fdatasync of as many bytes, {CONCURRENCY} threads: {:.0} per s  (baseline)", c.native_per_s)?;
        }
        writeln!(
            f,
            "  native spawn of {PROGRAM} -c pass: p50 {:.2} ms (baseline for a resume)",
            ms(self.native_python.p50)
        )
    }
}

impl SessionReport {
    pub fn to_json(&self) -> String {
        let lat = |l: &Latency| serde_json::json!({"p50_ms": ms(l.p50), "p99_ms": ms(l.p99)});
        let sizes: Vec<_> = self
            .sizes
            .iter()
            .map(|s| {
                let pages = serde_json::json!({"zero": s.pages.zero, "sparse": s.pages.sparse, "delta": s.pages.delta, "raw": s.pages.raw});
                serde_json::json!({"cell": s.cell.key(), "written_mib": s.written_mib, "dirty_bytes": s.dirty_bytes, "file_bytes": s.file_bytes, "pages": pages, "checkpoint": lat(&s.checkpoint), "checkpoint_cpu": lat(&s.checkpoint_cpu), "native_write_fdatasync": lat(&s.native_write), "pause": lat(&s.pause), "pause_file_bytes": s.pause_file_bytes, "resume": lat(&s.resume)})
            })
            .collect();
        let concurrent: Vec<_> = self.concurrent.iter().map(|c| serde_json::json!({"cell": c.cell.key(), "checkpoints_per_s": c.rounds_per_s, "sustained_per_s": c.sustained_per_s, "file_bytes": c.file_bytes, "native_per_s": c.native_per_s, "cpu_per_checkpoint_ms": ms(c.cpu_per_checkpoint)})).collect();
        serde_json::json!({"iterations": self.iterations, "concurrency": CONCURRENCY, "sizes": sizes, "concurrent": concurrent, "native_python_p50_ms": ms(self.native_python.p50)}).to_string()
    }
}

/// A template saved from a session that ran a cell (`session_template`): in a scratch
/// templates folder beside a link to the template it came from, removed when dropped.
pub struct SessionTemplate {
    scratch: PathBuf,
    /// Its template folder.
    pub dir: PathBuf,
    pub saved: SavedFork,
}

impl Drop for SessionTemplate {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// Saves a session of the template folder `dir` that ran `cell` as a template
/// (`Sessions::save_template`, as the daemon's `session_template` does).
pub fn session_template(dir: &Path, cell: &str) -> Result<SessionTemplate, String> {
    kvm::Kvm::shared().map_err(|e| e.to_string())?;
    let template = load_folder(dir)?;
    let scratch =
        std::env::temp_dir().join(format!("sfbench-session-template-{}", std::process::id()));
    let templates = scratch.join("templates");
    let name = format!("{}-session", template.name);
    let saved = (|| {
        let base = dir
            .canonicalize()
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        std::fs::create_dir_all(&templates)
            .and_then(|()| std::os::unix::fs::symlink(&base, templates.join(&template.name)))
            .map_err(|e| format!("preparing {}: {e}", templates.display()))?;
        let config = SessionsConfig {
            dir: scratch.join("sessions"),
            max_live: 1,
            keep_checkpoints: super::sessions::DEFAULT_KEEP_CHECKPOINTS,
            adopt_from_siblings: false,
            templates_dir: Some(templates.clone()),
        };
        let sessions = Sessions::open(
            config,
            std::slice::from_ref(&template),
            Arc::new(kvm::restore_cpu),
        )
        .map_err(|e| e.to_string())?;
        let failed = |e: SessionError| e.message;
        sessions
            .create("prepare", &template.name, None)
            .map_err(failed)?;
        let ran = run_cell(&sessions, "prepare", cell.to_owned()).map_err(failed)?;
        if let Some(error) = ran.result.and_then(|r| r.error) {
            return Err(format!(
                "the session's cell failed: {}: {}",
                error.name, error.message
            ));
        }
        let saved = sessions
            .save_template("prepare", &name, &|_| Ok(()))
            .map_err(failed)?;
        sessions.delete("prepare").map_err(failed)?;
        Ok(saved)
    })();
    match saved {
        Ok(saved) => Ok(SessionTemplate {
            dir: templates.join(name),
            scratch,
            saved,
        }),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&scratch);
            Err(e)
        }
    }
}

/// Runs `code` as the next cell of session `id`, with the bench's limits and no network.
fn run_cell(sessions: &Sessions, id: &str, code: String) -> Result<CellRun, SessionError> {
    let limits = ExecutionLimits {
        timeout_ms: 30_000,
        memory_mib: 256,
        output_bytes: 1 << 16,
        processes: crate::process::DEFAULT_PROCESS_LIMIT,
    };
    sessions.execute(id, code, Vec::new(), limits, Default::default())
}

/// Runs the benchmark on the template folder `dir` (image and snapshot), its checkpoints in
/// `data` (a folder on the disk to measure; created, and emptied afterwards).
pub fn run(dir: &Path, data: &Path, iterations: usize) -> Result<SessionReport, String> {
    kvm::Kvm::shared().map_err(|e| e.to_string())?;
    let template = load_folder(dir)?;
    let sessions_dir = data.join(format!("sfbench-sessions-{}", std::process::id()));
    let config = SessionsConfig {
        dir: sessions_dir.clone(),
        max_live: CONCURRENCY + 2,
        keep_checkpoints: super::sessions::DEFAULT_KEEP_CHECKPOINTS,
        adopt_from_siblings: false,
        templates_dir: None,
    };
    let sessions = Arc::new(
        Sessions::open(
            config,
            std::slice::from_ref(&template),
            Arc::new(kvm::restore_cpu),
        )
        .map_err(|e| e.to_string())?,
    );
    let result = (|| {
        let mut sizes = Vec::new();
        for cell in CellBytes::ALL {
            for mib in [1u64, 32] {
                sizes.push(one_session(
                    &sessions,
                    &template.name,
                    &sessions_dir,
                    cell,
                    mib,
                    iterations,
                )?);
            }
        }
        let mut concurrent = Vec::new();
        for cell in CellBytes::ALL {
            let (rounds_per_s, file_bytes, cpu_per_checkpoint) =
                concurrent_checkpoints(&sessions, &template.name, cell, iterations, true)?;
            let (sustained_per_s, _, _) =
                concurrent_checkpoints(&sessions, &template.name, cell, iterations, false)?;
            let native_per_s =
                native_concurrent_writes(&sessions_dir, file_bytes as usize, iterations)?;
            concurrent.push(ConcurrentFigures {
                cell,
                rounds_per_s,
                sustained_per_s,
                file_bytes,
                native_per_s,
                cpu_per_checkpoint,
            });
        }
        let native_python = latency(measure_native(PROGRAM, &ARGS, 20))?;
        Ok(SessionReport {
            iterations,
            sizes,
            concurrent,
            native_python,
        })
    })();
    drop(sessions);
    let _ = std::fs::remove_dir_all(&sessions_dir);
    result
}

/// One session running `cell` at `mib` MiB: `iterations` checkpoints after it, then up to 50
/// pauses and resumes; and the native baseline of the checkpoints' bytes.
fn one_session(
    sessions: &Sessions,
    template: &str,
    dir: &Path,
    cell: CellBytes,
    mib: u64,
    iterations: usize,
) -> Result<DirtyFigures, String> {
    let fail = |e: SessionError| e.message;
    let id = format!("bench-{}-{mib}", cell.key());
    sessions.create(&id, template, None).map_err(fail)?;
    let (mut checkpoint, mut checkpoint_cpu, mut pause, mut resume) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut last, mut file_bytes, mut pause_file_bytes) = (None::<TakenCheckpoint>, 0, 0);
    for _ in 0..iterations {
        run_cell(sessions, &id, cell.code(mib)).map_err(fail)?;
        let started = Instant::now();
        let taken = sessions.checkpoint(&id, false).map_err(fail)?;
        checkpoint.push(started.elapsed());
        checkpoint_cpu.push(taken.cpu);
        file_bytes += taken.info.file_bytes;
        last = Some(taken);
    }
    let pauses = iterations.min(50);
    for _ in 0..pauses {
        run_cell(sessions, &id, cell.code(mib)).map_err(fail)?;
        let started = Instant::now();
        pause_file_bytes += sessions
            .checkpoint(&id, true)
            .map_err(fail)?
            .info
            .file_bytes;
        pause.push(started.elapsed());
        let resumed = sessions
            .resume(&id)
            .map_err(fail)?
            .ok_or("the session was not paused")?;
        resume.push(resumed);
    }
    sessions.delete(&id).map_err(fail)?;
    let last = last.ok_or("no iterations")?;
    let file_bytes = file_bytes / iterations as u64;
    let native_write = latency(native_durable_writes(dir, file_bytes as usize, iterations))?;
    let of = |samples: Vec<Duration>| latency::<String>(Ok(samples));
    Ok(DirtyFigures {
        cell,
        written_mib: mib,
        dirty_bytes: last.info.dirty_bytes,
        file_bytes,
        pages: last.pages,
        checkpoint: of(checkpoint)?,
        checkpoint_cpu: of(checkpoint_cpu)?,
        native_write,
        pause: of(pause)?,
        pause_file_bytes: pause_file_bytes / pauses.max(1) as u64,
        resume: of(resume)?,
    })
}

/// `CONCURRENCY` sessions, each on a thread of its own, `iterations` times `cell` writing
/// 1 MiB and then a checkpoint. `together`: the checkpoints of a round start at once (the cells
/// are outside the time measured), checkpoints per second over the rounds' checkpoint phases;
/// otherwise each session goes on at its own pace, and the rate is the sum of each one's
/// 1 / mean checkpoint time. Also the checkpoints' files' average size in bytes and their mean
/// CPU time on their VMs' threads.
fn concurrent_checkpoints(
    sessions: &Arc<Sessions>,
    template: &str,
    cell: CellBytes,
    iterations: usize,
    together: bool,
) -> Result<(f64, u64, Duration), String> {
    let ids: Vec<String> = (0..CONCURRENCY).map(|i| format!("bench-c{i}")).collect();
    for id in &ids {
        sessions.create(id, template, None).map_err(|e| e.message)?;
        run_cell(sessions, id, cell.code(1)).map_err(|e| e.message)?;
        sessions.checkpoint(id, false).map_err(|e| e.message)?;
    }
    let barrier = Arc::new(Barrier::new(CONCURRENCY));
    let workers: Vec<_> = ids
        .iter()
        .map(|id| {
            let (sessions, id, barrier) = (sessions.clone(), id.clone(), barrier.clone());
            thread::spawn(move || {
                let (mut busy, mut bytes, mut cpu, mut failed) =
                    (Duration::ZERO, 0, Duration::ZERO, None);
                for _ in 0..iterations {
                    let ran = run_cell(&sessions, &id, cell.code(1));
                    if together {
                        barrier.wait();
                    }
                    let started = Instant::now();
                    // Every thread reaches both barriers even after a failure, so none waits forever.
                    match ran.and_then(|_| sessions.checkpoint(&id, false)) {
                        Ok(taken) => {
                            bytes += taken.info.file_bytes;
                            cpu += taken.cpu;
                        }
                        Err(e) => failed = Some(e.message),
                    }
                    if together {
                        barrier.wait();
                    }
                    busy += started.elapsed();
                }
                failed.map_or(Ok((busy, bytes, cpu)), Err)
            })
        })
        .collect();
    let (mut rounds, mut sustained, mut bytes, mut cpu) = (Duration::ZERO, 0.0, 0, Duration::ZERO);
    for worker in workers {
        let (busy, written, used) = worker
            .join()
            .map_err(|_| "a checkpoint thread panicked".to_owned())??;
        cpu += used;
        // Together, every thread measured the same rounds (barrier to barrier): the slowest
        // clock counts.
        rounds = rounds.max(busy);
        sustained += iterations as f64 / busy.as_secs_f64();
        bytes += written;
    }
    let count = (CONCURRENCY * iterations) as u64;
    for id in &ids {
        sessions.delete(id).map_err(|e| e.message)?;
    }
    let rate = if together {
        count as f64 / rounds.as_secs_f64()
    } else {
        sustained
    };
    Ok((rate, bytes / count.max(1), cpu / count.max(1) as u32))
}

/// The native baseline of `concurrent_checkpoints`: `CONCURRENCY` threads each writing
/// `iterations` files of `bytes` durably; files per second.
fn native_concurrent_writes(dir: &Path, bytes: usize, iterations: usize) -> Result<f64, String> {
    let started = Instant::now();
    let workers: Vec<_> = (0..CONCURRENCY)
        .map(|i| {
            let dir = dir.join(format!("native-{i}"));
            thread::spawn(move || {
                std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
                native_durable_writes(&dir, bytes, iterations).map(drop)
            })
        })
        .collect();
    for worker in workers {
        worker
            .join()
            .map_err(|_| "a native writer panicked".to_owned())??;
    }
    Ok((CONCURRENCY * iterations) as f64 / started.elapsed().as_secs_f64())
}

/// The native baseline of a durable checkpoint: `bytes` written to a new file, fdatasync'ed,
/// renamed and the folder fsync'ed, as `Checkpoint::write_durably` does.
fn native_durable_writes(
    dir: &Path,
    bytes: usize,
    iterations: usize,
) -> Result<Vec<Duration>, String> {
    let data = vec![0x5a_u8; bytes];
    let (temporary, target): (PathBuf, PathBuf) =
        (dir.join(".native-baseline"), dir.join("native-baseline"));
    crate::bench::time_runs(iterations, || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(&data)?;
        file.sync_data()?;
        std::fs::rename(&temporary, &target)?;
        std::fs::File::open(dir)?.sync_all()
    })
    .map_err(|e| format!("the native baseline: {e}"))
}
