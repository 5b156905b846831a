//! `sandfork-vmm serve`: the daemon that runs code for the TypeScript runtime over a Unix
//! socket, speaking the protocol in ../../PROTOCOL.md.
//!
//! - `frame`: the length-prefixed JSON framing and its typed errors.
//! - `request`: typed, fully validated requests (the validation policy is documented there:
//!   unknown fields are rejected, limits are clamped).
//! - `response`: every frame the daemon sends.
//! - `server`: the listener, connections, the bound on in-flight executions, shutdown;
//!   `admission`: which executions run now and which wait, in lines bounded per template and
//!   per key; `request_threads`: the threads its requests run on, kept between requests.
//! - `executor`: the `Executor` trait the server calls, and the types crossing it.
//! - `live_output`: a streamed execution's `output` frames, sent while it runs.
//! - `agent_executor`: the production executor (a KVM VM per request, taken from the
//!   template's warm pool (`pool`) or restored from its snapshot when it has one, booted
//!   otherwise) and `templates`: the templates it serves (image, and snapshot when built).

pub mod admission;
pub mod agent_executor;
mod base64;
#[cfg(feature = "bench")]
pub mod bench;
#[cfg(feature = "bench")]
pub mod density;
pub mod executor;
pub mod frame;
pub mod isolation;
pub mod live_output;
pub mod pool;
pub mod request;
mod request_threads;
pub mod response;
pub mod server;
#[cfg(feature = "bench")]
pub mod session_bench;
pub mod session_protocol;
pub mod sessions;
pub mod templates;
pub mod wire;

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;

use crate::kvm;
use crate::process::{DEFAULT_PROCESS_LIMIT, MAX_PROCESS_LIMIT};
use crate::sys;
use agent_executor::AgentExecutor;
use executor::{ExecutionLimits, Executor};
use request::LimitPolicy;
use server::{Server, ServerConfig};

/// Largest `--max-output-bytes`: stdout and stderr are escaped into one response frame, and
/// JSON escaping can grow a byte sixfold; 2 MiB keeps every response under the 16 MiB frame.
pub const MAX_OUTPUT_BYTES_LIMIT: u64 = 2 << 20;
/// Largest `--max-timeout-ms` (one hour).
pub const MAX_TIMEOUT_MS_LIMIT: u64 = 3_600_000;
pub const MAX_CONCURRENCY_LIMIT: u64 = 1024;
pub const MAX_QUEUE_LIMIT: u64 = 4096;
/// Largest `--pool-size` (each pooled VM holds a worker thread and its guest memory).
pub const MAX_POOL_SIZE: u64 = 256;
/// Connections served at once (each holds a thread while idle).
pub const MAX_CONNECTIONS: usize = 1024;

/// What a request gets when it does not ask (each clamped to the daemon's maxima: for
/// processes, the maximum is the default).
pub const DEFAULT_LIMITS: ExecutionLimits = ExecutionLimits {
    timeout_ms: 10_000,
    memory_mib: 256,
    output_bytes: 1 << 20,
    processes: MAX_PROCESS_LIMIT,
};
/// Maxima when `serve` is not told otherwise.
pub const DEFAULT_MAXIMA: ExecutionLimits = ExecutionLimits {
    timeout_ms: 60_000,
    memory_mib: 2048,
    output_bytes: 1 << 20,
    processes: DEFAULT_PROCESS_LIMIT,
};

/// Executions running at once by default: two per core (a VM blocked in a system call's host
/// work leaves its core to another), at least two.
pub fn default_concurrency() -> usize {
    thread::available_parallelism()
        .map_or(2, |n| n.get() * 2)
        .max(2)
}

/// VMs kept ready per template by default: one per execution that can run at once, so a burst
/// of that many finds every VM ready.
pub fn default_pool_size() -> usize {
    default_concurrency()
}

/// Executions waiting for a slot by default: a burst of this many is absorbed without `busy`.
pub const DEFAULT_QUEUE: u64 = 64;

/// Executions of one template waiting by default: four per running slot (`default_concurrency`),
/// so one template cannot fill the whole line on a small machine, and a gateway's share of it
/// (it hands the daemon twice the running slots per template) always fits.
pub fn default_queue_per_template() -> usize {
    4 * default_concurrency()
}

/// Executions of one key waiting by default: two per running slot, so one caller can fill at
/// most half a template's line.
pub fn default_queue_per_key() -> usize {
    2 * default_concurrency()
}

#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub socket: PathBuf,
    pub templates: PathBuf,
    pub max_concurrency: usize,
    pub max_queue: usize,
    pub max_queue_per_template: usize,
    pub max_queue_per_key: usize,
    pub max_limits: ExecutionLimits,
    /// VMs kept ready per template with a snapshot (0: each is restored for its request).
    pub pool_size: usize,
    /// How long an agent booted for a request (a template without a snapshot) may take to
    /// reach its ready point.
    pub boot_timeout: std::time::Duration,
    /// Where stateful sessions live (`serve --sessions DIR`); None: no sessions.
    pub sessions: Option<PathBuf>,
    /// Sessions holding a running VM at once.
    pub max_sessions: usize,
    /// Checkpoints of a session kept: its newest N and those they build on
    /// (`sessions::SessionsConfig::keep_checkpoints`).
    pub keep_checkpoints: u64,
    /// A session unknown here is adopted from the folders beside `sessions`
    /// (`sessions::SessionsConfig::adopt_from_siblings`).
    pub adopt_sessions: bool,
    /// For the confinement's tests: a thread makes a forbidden system call this long after
    /// the filter is installed.
    pub forbidden_syscall_after: Option<std::time::Duration>,
}

/// Running sessions by default.
pub const DEFAULT_MAX_SESSIONS: u64 = 64;
/// Largest `--max-sessions` (each holds a thread and its VM's memory).
pub const MAX_SESSIONS_LIMIT: u64 = 4096;

/// Runs the daemon until SIGTERM or SIGINT: loads the templates, checks KVM (a host without it
/// still serves, answering `execute` with `unavailable`), binds the socket and serves; on a
/// signal it stops accepting, lets in-flight executions finish and removes the socket file.
/// Why `serve` could not start: the step that failed, and the error it met.
#[derive(Debug)]
pub enum ServeError {
    /// Blocking SIGTERM and SIGINT before any thread exists.
    BlockSignals(io::Error),
    /// Loading the templates folder.
    Templates(templates::TemplateError),
    /// Opening the sessions folder.
    Sessions { dir: PathBuf, error: io::Error },
    /// Starting the warm pools.
    Pools(io::Error),
    /// Binding the listening socket.
    Listen { socket: PathBuf, error: io::Error },
    /// Duplicating the listening socket for the signal thread.
    Stopper(io::Error),
    /// Starting one of the daemon's own threads.
    Thread {
        name: &'static str,
        error: io::Error,
    },
    /// Opening /proc/self/pagemap.
    Pagemap(io::Error),
    /// Installing the seccomp filter.
    Seccomp(io::Error),
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::BlockSignals(e) => write!(f, "blocking SIGTERM/SIGINT: {e}"),
            ServeError::Templates(e) => write!(f, "{e}"),
            ServeError::Sessions { dir, error } => {
                write!(f, "opening the sessions in {}: {error}", dir.display())
            }
            ServeError::Pools(e) => write!(f, "starting the warm pools: {e}"),
            ServeError::Listen { socket, error } => {
                write!(f, "listening on {}: {error}", socket.display())
            }
            ServeError::Stopper(e) => write!(f, "duplicating the listening socket: {e}"),
            ServeError::Thread { name, error } => write!(f, "starting the {name} thread: {error}"),
            ServeError::Pagemap(e) => write!(f, "opening /proc/self/pagemap: {e}"),
            ServeError::Seccomp(e) => write!(f, "installing the seccomp filter: {e}"),
        }
    }
}

impl std::error::Error for ServeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ServeError::Templates(e) => Some(e),
            ServeError::BlockSignals(error)
            | ServeError::Sessions { error, .. }
            | ServeError::Pools(error)
            | ServeError::Listen { error, .. }
            | ServeError::Stopper(error)
            | ServeError::Thread { error, .. }
            | ServeError::Pagemap(error)
            | ServeError::Seccomp(error) => Some(error),
        }
    }
}

pub fn serve(options: &ServeOptions) -> Result<(), ServeError> {
    // Before any thread exists, so that every thread inherits the mask and only the waiter
    // below ever takes these signals.
    let signals =
        sys::block_signals(&[sys::SIGTERM, sys::SIGINT]).map_err(ServeError::BlockSignals)?;
    // Every VM holds two open files: the pools and sessions of many templates need more than
    // the usual soft limit.
    let vm_room = match kvm::capacity::raise_open_file_limit(0) {
        Ok(open_files) => format!(
            "open files for {} VMs",
            open_files / kvm::capacity::FDS_PER_VM
        ),
        Err(e) => format!("the open-file limit not raised: {e}"),
    };
    let templates = templates::load(&options.templates).map_err(ServeError::Templates)?;
    let sessions = match &options.sessions {
        Some(dir) if kvm::Kvm::shared().is_ok() => {
            let config = sessions::SessionsConfig {
                dir: dir.clone(),
                max_live: options.max_sessions,
                keep_checkpoints: options.keep_checkpoints,
                adopt_from_siblings: options.adopt_sessions,
                templates_dir: Some(options.templates.clone()),
            };
            Some(Arc::new(
                sessions::Sessions::open(config, &templates, Arc::new(kvm::restore_cpu)).map_err(
                    |error| ServeError::Sessions {
                        dir: dir.clone(),
                        error,
                    },
                )?,
            ))
        }
        _ => None,
    };
    let executor = AgentExecutor::with_kvm(templates, options.pool_size)
        .map_err(ServeError::Pools)?
        .booting_within(options.boot_timeout)
        .loading_from(options.templates.clone());
    let health = executor.health();
    let config = ServerConfig {
        max_running: options.max_concurrency,
        max_queued: options.max_queue,
        max_queued_per_template: options.max_queue_per_template,
        max_queued_per_key: options.max_queue_per_key,
        max_connections: MAX_CONNECTIONS,
        limits: LimitPolicy::new(DEFAULT_LIMITS, options.max_limits),
    };
    let mut server =
        Server::bind(&options.socket, Arc::new(executor), config).map_err(|error| {
            ServeError::Listen {
                socket: options.socket.clone(),
                error,
            }
        })?;
    if let Some(sessions) = sessions {
        server = server.with_sessions(sessions);
    }

    let stopper = server.stopper().map_err(ServeError::Stopper)?;
    thread::Builder::new()
        .name("sandfork-signals".into())
        .spawn(move || {
            if let Ok(signum) = sys::wait_for_signal(&signals) {
                log(format_args!("signal {signum}, stopping"));
            }
            stopper.stop();
        })
        .map_err(|error| ServeError::Thread {
            name: "signal",
            error,
        })?;

    let kvm = match &health.kvm {
        Ok(()) => "available".to_owned(),
        Err(reason) => format!("unavailable: {reason}"),
    };
    crate::memory::open_pagemap().map_err(ServeError::Pagemap)?;
    // The vDSO's clock reads /sys once to decide whether the TSC keeps time here.
    crate::vdso::clock::shared();
    let confinement = match options.sessions {
        Some(_) => crate::seccomp::Confinement::WithSessionFiles,
        None => crate::seccomp::Confinement::NoFiles,
    };
    crate::seccomp::confine(confinement).map_err(ServeError::Seccomp)?;
    if let Some(after) = options.forbidden_syscall_after {
        thread::Builder::new()
            .name("sandfork-trip".into())
            .spawn(move || {
                thread::sleep(after);
                // socket(2) is not on the allow-list: the filter kills the process here.
                let _ = std::net::UdpSocket::bind("127.0.0.1:0");
                log(format_args!(
                    "a forbidden system call returned: the daemon is not confined"
                ));
            })
            .map_err(|error| ServeError::Thread {
                name: "trip",
                error,
            })?;
    }
    log(format_args!(
        "listening on {} ({} templates, kvm {kvm}, {vm_room}; confined by seccomp)",
        server.path().display(),
        health.templates
    ));
    server.run();
    Ok(())
}

/// One line on the daemon's stderr. A supervisor that died leaves stderr a broken pipe; `eprintln!`
/// would then panic (in the signal thread: SIGTERM would be ignored), so write errors are dropped.
pub(crate) fn log(message: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "sandfork-vmm serve: {message}");
}
