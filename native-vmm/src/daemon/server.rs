//! The daemon's server: a Unix stream listener, a thread per connection, a thread per
//! in-flight execution (kept for the next one when it has answered: `request_threads`).
//!
//! - A connection first completes the handshake, then may send requests at any pace.
//!   `list_templates`, `health` and `stats` are answered on the connection's own thread;
//!   each `execute` gets a thread of its own, so one connection's requests run concurrently and
//!   their responses are written as they complete, one whole frame at a time under the
//!   connection's writer lock. A streamed execution's `output` frames come first, from its
//!   forwarder thread (`live_output`).
//! - At most `max_running` executions run at once over all connections; up to `max_queued`
//!   more wait for a free slot, first come, first served (the wait is the response's
//!   `queue_us`), at most `max_queued_per_template` of one template and `max_queued_per_key`
//!   of one `key_id` (`admission`). An execution beyond a bound is answered `busy` at once,
//!   with the bound as its `reason`. The queue absorbs bursts without clients spinning on
//!   `busy`; its bounds keep waiting threads and latency bounded, and one template or one key
//!   from filling it.
//! - A malformed frame gets a `bad_frame` error; when its length was oversized or the stream
//!   ended inside it, the connection is closed (the next frame boundary is unknown). Nothing a
//!   client does ends anything but its own connection: a client gone mid-execution only makes
//!   the response's write fail, and that is ignored. Writes time out (`WRITE_TIMEOUT`) so a
//!   client that stops reading cannot pin threads forever.
//! - At most `max_connections` connections are served at once; one more gets a `busy` error
//!   frame and is closed.
//! - Every `busy` answer is counted by reason (`stats`' `admission.busy`).

use std::collections::HashSet;
use std::fs;
use std::io::{self, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::daemon::admission::{FullLine, Line, RunLimits, RunQueue, Turn};
use crate::daemon::executor::{ExecuteError, ExecuteRequest, Executor};
use crate::daemon::frame::{self, FrameError};
use crate::daemon::live_output::LiveOutput;
use crate::daemon::request::{self, LimitPolicy, Request, RequestError};
use crate::daemon::request_threads::RequestThreads;
use crate::daemon::response::{self, BusyReason, ErrorCode, RequestTimes, Response};
use crate::daemon::session_protocol::{self, SessionOp};
use crate::daemon::sessions::{SessionError, Sessions};
use crate::process::OutputSink;
use crate::sys;

/// How long one response write may block on a client that does not read.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerConfig {
    /// Executions running at once, over all connections.
    pub max_running: usize,
    /// Executions waiting for a running slot, beyond which `execute` is `busy`.
    pub max_queued: usize,
    /// Executions of one template waiting, beyond which one more of it is `busy`.
    pub max_queued_per_template: usize,
    /// Executions of one `key_id` waiting, beyond which one more of it is `busy`.
    pub max_queued_per_key: usize,
    /// Connections served at once.
    pub max_connections: usize,
    pub limits: LimitPolicy,
}

/// A counter of things in progress with an upper bound, whose holders are RAII `Slot`s.
struct Gauge {
    count: Mutex<usize>,
    changed: Condvar,
    max: usize,
}

impl Gauge {
    fn new(max: usize) -> Gauge {
        Gauge {
            count: Mutex::new(0),
            changed: Condvar::new(),
            max,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, usize> {
        // The count stays consistent even if a holder panicked: recover it.
        self.count
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn try_acquire(self: &Arc<Gauge>) -> Option<Slot> {
        let mut count = self.lock();
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(Slot(self.clone()))
    }

    fn current(&self) -> usize {
        *self.lock()
    }

    fn wait_until_zero(&self) {
        let mut count = self.lock();
        while *count > 0 {
            count = self
                .changed
                .wait(count)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }
}

struct Slot(Arc<Gauge>);

impl Drop for Slot {
    fn drop(&mut self) {
        *self.0.lock() -= 1;
        self.0.changed.notify_all();
    }
}

/// `busy` answers by reason.
#[derive(Default)]
struct BusyCounts([AtomicU64; BusyReason::ALL.len()]);

impl BusyCounts {
    fn count(&self, reason: BusyReason) {
        self.0[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self, reason: BusyReason) -> u64 {
        self.0[reason as usize].load(Ordering::Relaxed)
    }
}

/// State shared by the listener and every connection.
struct Shared {
    executor: Arc<dyn Executor>,
    config: ServerConfig,
    /// Stateful sessions, when the daemon keeps them (`serve --sessions DIR`).
    sessions: Option<Arc<Sessions>>,
    /// Executions admitted and not yet finished (running or queued).
    admitted: Arc<Gauge>,
    /// Who runs now and who waits (`admission`).
    runs: Arc<RunQueue>,
    connections: Arc<Gauge>,
    /// `busy` answers sent, by reason.
    busy: Arc<BusyCounts>,
    /// Where executions and session requests run.
    threads: RequestThreads,
    /// Executions that ran to an outcome, and their system calls and thread switches.
    executions: AtomicU64,
    syscalls: AtomicU64,
    thread_switches: AtomicU64,
    stopping: AtomicBool,
}

impl Shared {
    /// Serves template folder `name` (`load_template`): its executions and warm pool, and
    /// sessions of it when the daemon keeps sessions.
    fn load_template(&self, name: &str) -> Result<(), ExecuteError> {
        let snapshot = self.executor.load_template(name)?;
        if let Some(sessions) = &self.sessions {
            sessions.serve_template(name, snapshot);
        }
        super::log(format_args!("loaded template {name}"));
        Ok(())
    }
}

/// The socket file this server created, removed when the server ends (if it is still ours).
struct SocketFile {
    path: PathBuf,
    device: u64,
    inode: u64,
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Ok(meta) = fs::symlink_metadata(&self.path) {
            if meta.dev() == self.device && meta.ino() == self.inode {
                let _ = fs::remove_file(&self.path);
            }
        }
    }
}

/// Binds `path`, replacing a stale socket file safely: a path that is not a socket is never
/// touched, and a socket with a live listener behind it is an error. The new socket is bound
/// under a temporary name, made owner-only (it runs code on request) and renamed into place,
/// so `path` never refers to a half-set-up socket.
fn bind_socket(path: &Path) -> io::Result<(UnixListener, SocketFile)> {
    match fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; not replacing it",
                    path.display()
                ),
            ));
        }
        Ok(_) => {
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{}: another server is listening there", path.display()),
                ));
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let temporary = path.with_file_name(format!(".sandfork-{}.sock", std::process::id()));
    let _ = fs::remove_file(&temporary);
    let listener = UnixListener::bind(&temporary)
        .map_err(|e| io::Error::new(e.kind(), format!("binding {}: {e}", temporary.display())))?;
    let placed = fs::set_permissions(&temporary, fs::Permissions::from_mode(0o600))
        .and_then(|()| fs::rename(&temporary, path));
    if let Err(e) = placed {
        let _ = fs::remove_file(&temporary);
        return Err(io::Error::new(
            e.kind(),
            format!("placing the socket at {}: {e}", path.display()),
        ));
    }
    let meta = fs::symlink_metadata(path)?;
    Ok((
        listener,
        SocketFile {
            path: path.to_owned(),
            device: meta.dev(),
            inode: meta.ino(),
        },
    ))
}

pub struct Server {
    listener: UnixListener,
    socket: SocketFile,
    shared: Arc<Shared>,
}

/// Stops a running server from another thread.
#[derive(Clone)]
pub struct Stopper {
    shared: Arc<Shared>,
    /// The listening socket (a duplicate descriptor of it).
    listener: Arc<UnixListener>,
}

impl Stopper {
    /// Stops accepting connections; `Server::run` then waits for in-flight executions and
    /// returns.
    pub fn stop(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wake the blocked accept: shut down, a listening socket fails accept with EINVAL.
        // (Not a connection of our own: the confined daemon may not connect; seccomp.rs.)
        let _ = sys::shutdown_read(self.listener.as_raw_fd());
    }
}

impl Server {
    pub fn bind(
        path: &Path,
        executor: Arc<dyn Executor>,
        config: ServerConfig,
    ) -> io::Result<Server> {
        let (listener, socket) = bind_socket(path)?;
        let shared = Arc::new(Shared {
            executor,
            config,
            sessions: None,
            admitted: Arc::new(Gauge::new(config.max_running + config.max_queued)),
            runs: RunQueue::new(RunLimits {
                max_running: config.max_running,
                max_queued_per_template: config.max_queued_per_template,
                max_queued_per_key: config.max_queued_per_key,
            }),
            connections: Arc::new(Gauge::new(config.max_connections)),
            busy: Arc::new(BusyCounts::default()),
            threads: RequestThreads::default(),
            executions: AtomicU64::new(0),
            syscalls: AtomicU64::new(0),
            thread_switches: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
        });
        Ok(Server {
            listener,
            socket,
            shared,
        })
    }

    pub fn path(&self) -> &Path {
        &self.socket.path
    }

    /// Serves session requests from `sessions` (before `run`; without it they are refused).
    pub fn with_sessions(mut self, sessions: Arc<Sessions>) -> Server {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.sessions = Some(sessions);
        }
        self
    }

    pub fn stopper(&self) -> io::Result<Stopper> {
        Ok(Stopper {
            shared: self.shared.clone(),
            listener: Arc::new(self.listener.try_clone()?),
        })
    }

    /// Serves until `Stopper::stop`, then closes and removes the socket and waits for the
    /// executions in flight to finish (their responses are still sent on their connections).
    pub fn run(self) {
        let Server {
            listener,
            socket,
            shared,
        } = self;
        for stream in listener.incoming() {
            if shared.stopping.load(Ordering::SeqCst) {
                break;
            }
            let stream = match stream {
                Ok(stream) => stream,
                // Out of descriptors or memory: refuse this one, keep serving the rest.
                Err(e) => {
                    super::log(format_args!("accept: {e}"));
                    thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let Some(slot) = shared.connections.try_acquire() else {
                let mut stream = stream;
                let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
                shared.busy.count(BusyReason::ConnectionsFull);
                let _ = frame::write_frame(
                    &mut stream,
                    &response::error(
                        None,
                        ErrorCode::Busy(BusyReason::ConnectionsFull),
                        "too many connections",
                    ),
                );
                continue;
            };
            let connection_shared = shared.clone();
            let spawned = thread::Builder::new()
                .name("sandfork-conn".into())
                .spawn(move || {
                    let _slot = slot;
                    Connection::serve(stream, connection_shared);
                });
            if let Err(e) = spawned {
                super::log(format_args!("starting a connection thread: {e}"));
            }
        }
        drop((listener, socket));
        shared.admitted.wait_until_zero();
    }
}

/// The writing half of a connection, shared by the threads that answer its requests; it
/// counts the `busy` answers it sends.
#[derive(Clone)]
struct Writer {
    stream: Arc<Mutex<UnixStream>>,
    busy: Arc<BusyCounts>,
}

impl Writer {
    /// Sends one frame. A failure means the client is gone or stuck: it is its loss only.
    fn send(&self, message: &Response) {
        if let Some(reason) = message.busy_reason() {
            self.busy.count(reason);
        }
        let mut stream = self
            .stream
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let result = match frame::encode_frame(message) {
            Ok(bytes) => stream.write_all(&bytes),
            Err(unsendable) => {
                let error =
                    response::error(message.id(), ErrorCode::Internal, &unsendable.to_string());
                frame::write_frame(&mut *stream, &error)
            }
        };
        if result.is_err() {
            // Unblock the reader too: the connection is over.
            let _ = stream.shutdown(std::net::Shutdown::Both);
        }
    }

    fn send_error(&self, e: &RequestError) {
        self.send(&response::error(e.id, e.code, &e.message));
    }

    fn close(&self) {
        let stream = self
            .stream
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let _ = stream.shutdown(std::net::Shutdown::Both);
    }
}

struct Connection {
    shared: Arc<Shared>,
    writer: Writer,
    /// Ids of this connection's executions in flight (ids must be unique among them).
    ids: Arc<Mutex<HashSet<u64>>>,
}

/// What to do after a frame error.
enum AfterError {
    Continue,
    Close,
}

impl Connection {
    fn serve(stream: UnixStream, shared: Arc<Shared>) {
        let Ok(write_half) = stream.try_clone() else {
            return;
        };
        let _ = write_half.set_write_timeout(Some(WRITE_TIMEOUT));
        let connection = Connection {
            writer: Writer {
                stream: Arc::new(Mutex::new(write_half)),
                busy: shared.busy.clone(),
            },
            shared,
            ids: Arc::new(Mutex::new(HashSet::new())),
        };
        let mut reader = BufReader::new(stream);
        if connection.handshake(&mut reader) {
            connection.requests(&mut reader);
        }
    }

    /// Answers a frame error; says whether the connection can go on.
    fn frame_error(&self, error: FrameError) -> AfterError {
        match error {
            FrameError::Closed | FrameError::Io(_) => AfterError::Close,
            e => {
                self.writer
                    .send(&response::error(None, ErrorCode::BadFrame, &e.to_string()));
                if e.loses_framing() {
                    self.writer.close();
                    AfterError::Close
                } else {
                    AfterError::Continue
                }
            }
        }
    }

    /// Reads frames until a valid hello; false when the connection ended instead.
    fn handshake(&self, reader: &mut BufReader<UnixStream>) -> bool {
        loop {
            match frame::read_frame(reader) {
                Ok(message) => match request::parse_hello(&message) {
                    Ok(_) => {
                        self.writer.send(&response::hello());
                        return true;
                    }
                    Err(e) => {
                        self.writer.send_error(&e);
                        if e.code == ErrorCode::UnsupportedProtocol {
                            self.writer.close();
                            return false;
                        }
                    }
                },
                Err(e) => {
                    if let AfterError::Close = self.frame_error(e) {
                        return false;
                    }
                }
            }
        }
    }

    fn requests(&self, reader: &mut BufReader<UnixStream>) {
        loop {
            let message = match frame::read_frame(reader) {
                Ok(message) => message,
                Err(e) => match self.frame_error(e) {
                    AfterError::Continue => continue,
                    AfterError::Close => return,
                },
            };
            let received = Instant::now();
            match request::parse_request(&message, &self.shared.config.limits) {
                Ok((id, Request::ListTemplates)) => self
                    .writer
                    .send(&response::templates(id, &self.shared.executor.templates())),
                Ok((id, Request::Health)) => self
                    .writer
                    .send(&response::health(id, &self.shared.executor.health())),
                Ok((id, Request::Stats)) => {
                    let shared = &self.shared;
                    let totals = response::Totals {
                        executions: shared.executions.load(Ordering::Relaxed),
                        in_flight: shared.admitted.current() as u64,
                        syscalls: shared.syscalls.load(Ordering::Relaxed),
                        thread_switches: shared.thread_switches.load(Ordering::Relaxed),
                    };
                    let admission = response::Admission::new(&shared.runs.depths(), |reason| {
                        shared.busy.get(reason)
                    });
                    self.writer.send(&response::stats(
                        id,
                        totals,
                        admission,
                        &shared.executor.pools(),
                    ));
                }
                Ok((id, Request::LoadTemplate(name))) => {
                    let executor = &self.shared.executor;
                    match self.shared.load_template(&name) {
                        Ok(()) => self
                            .writer
                            .send(&response::templates(id, &executor.templates())),
                        Err(error) => self.writer.send(&response::error(
                            Some(id),
                            ErrorCode::from(&error),
                            &error.to_string(),
                        )),
                    }
                }
                Ok((id, Request::UnloadTemplate(name))) => {
                    let executor = &self.shared.executor;
                    if executor.unload_template(&name) {
                        if let Some(sessions) = &self.shared.sessions {
                            sessions.serve_template(&name, None);
                        }
                        super::log(format_args!("unloaded template {name}"));
                        self.writer
                            .send(&response::templates(id, &executor.templates()))
                    } else {
                        let error = ExecuteError::UnknownTemplate(name);
                        self.writer.send(&response::error(
                            Some(id),
                            ErrorCode::from(&error),
                            &error.to_string(),
                        ))
                    }
                }
                Ok((id, Request::Execute(execute, key))) => {
                    self.start_execution(id, execute, key, received)
                }
                Ok((id, Request::Session(op))) => self.start_session_op(id, op, received),
                Err(e) => self.writer.send_error(&e),
            }
        }
    }

    /// Runs an execution on a thread of its own, or answers why it cannot start.
    fn start_execution(
        &self,
        id: u64,
        request: ExecuteRequest,
        key: Option<String>,
        received: Instant,
    ) {
        let fail =
            |code, message: &str| self.writer.send(&response::error(Some(id), code, message));
        let ServerConfig {
            max_running,
            max_queued,
            max_queued_per_template,
            max_queued_per_key,
            ..
        } = self.shared.config;
        let Some(admission) = self.shared.admitted.try_acquire() else {
            return fail(ErrorCode::Busy(BusyReason::QueueFull), &format!("the daemon is running its maximum of {max_running} executions with {max_queued} waiting"));
        };
        let line = Line {
            template: Some(&request.template),
            key: key.as_deref(),
        };
        let turn = match self.shared.runs.enter(line) {
            Ok(turn) => turn,
            Err(full) => {
                let (reason, waiting, whose) = match full {
                    FullLine::Template => (
                        BusyReason::TemplateQueueFull,
                        max_queued_per_template,
                        format!("template '{}'", request.template),
                    ),
                    FullLine::Key => (
                        BusyReason::KeyQueueFull,
                        max_queued_per_key,
                        "this key_id".to_owned(),
                    ),
                };
                let message = format!("{waiting} executions of {whose} already wait for a slot");
                return fail(ErrorCode::Busy(reason), &message);
            }
        };
        if !lock_ids(&self.ids).insert(id) {
            return fail(
                ErrorCode::BadRequest,
                &format!("id {id} is already in flight on this connection"),
            );
        }
        let (shared, writer, ids) = (self.shared.clone(), self.writer.clone(), self.ids.clone());
        let spawned = self.shared.threads.run(Box::new(move || {
            let response = if request.stream {
                let output_writer = writer.clone();
                match LiveOutput::start(move |stream, data| {
                    output_writer.send(&response::output(id, stream, data))
                }) {
                    Ok(live) => {
                        let response = run_execution(
                            &shared,
                            id,
                            request,
                            received,
                            (admission, turn),
                            live.sink(),
                        );
                        live.finish();
                        response
                    }
                    Err(e) => response::error(
                        Some(id),
                        ErrorCode::Internal,
                        &format!("starting the output thread: {e}"),
                    ),
                }
            } else {
                run_execution(
                    &shared,
                    id,
                    request,
                    received,
                    (admission, turn),
                    OutputSink::none(),
                )
            };
            lock_ids(&ids).remove(&id);
            writer.send(&response);
        }));
        if let Err(e) = spawned {
            lock_ids(&self.ids).remove(&id);
            fail(
                ErrorCode::Internal,
                &format!("starting an execution thread: {e}"),
            );
        }
    }
}

impl Connection {
    /// Answers a session request on a thread of its own (it may run a cell or write a checkpoint).
    /// A cell takes an execution's admission and running slots; every other request only an
    /// admission.
    fn start_session_op(&self, id: u64, op: SessionOp, received: Instant) {
        let fail =
            |code, message: &str| self.writer.send(&response::error(Some(id), code, message));
        let Some(sessions) = self.shared.sessions.clone() else {
            return fail(ErrorCode::Unavailable, "this daemon keeps no sessions (it needs serve --sessions DIR and a usable /dev/kvm)");
        };
        let Some(admission) = self.shared.admitted.try_acquire() else {
            return fail(
                ErrorCode::Busy(BusyReason::QueueFull),
                "the daemon is at its maximum of requests in flight",
            );
        };
        if !lock_ids(&self.ids).insert(id) {
            return fail(
                ErrorCode::BadRequest,
                &format!("id {id} is already in flight on this connection"),
            );
        }
        let (shared, writer, ids) = (self.shared.clone(), self.writer.clone(), self.ids.clone());
        let spawned = self.shared.threads.run(Box::new(move || {
            // A cell waits in the one line, counted in no template's or key's (so never refused).
            let running = if op.runs_code() {
                shared.runs.enter(Line::default()).ok().map(Turn::wait)
            } else {
                None
            };
            let runs_code = running.is_some();
            let result = panic::catch_unwind(AssertUnwindSafe(|| {
                let load = |name: &str| {
                    shared.load_template(name).map_err(|error| SessionError {
                        code: ErrorCode::from(&error),
                        message: error.to_string(),
                    })
                };
                session_protocol::handle(&sessions, &load, id, op, received)
            }));
            drop((running, admission));
            if runs_code {
                shared.executions.fetch_add(1, Ordering::Relaxed);
            }
            lock_ids(&ids).remove(&id);
            writer.send(&result.unwrap_or_else(|_| {
                response::error(
                    Some(id),
                    ErrorCode::Internal,
                    "the session request panicked",
                )
            }));
        }));
        if let Err(e) = spawned {
            lock_ids(&self.ids).remove(&id);
            fail(
                ErrorCode::Internal,
                &format!("starting a session thread: {e}"),
            );
        }
    }
}

fn lock_ids(ids: &Mutex<HashSet<u64>>) -> std::sync::MutexGuard<'_, HashSet<u64>> {
    ids.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Waits for its turn to run, runs one execution (its output also going to `live_output`) and
/// builds its response (the slots are given back before the response is written). A panic in
/// the executor is answered `internal` instead of losing the response.
fn run_execution(
    shared: &Shared,
    id: u64,
    mut request: ExecuteRequest,
    received: Instant,
    (admission, turn): (Slot, Turn),
    live_output: OutputSink,
) -> Response {
    shared.executor.complete(&mut request);
    let limits = request.limits;
    let running = turn.wait();
    let queue = received.elapsed();
    let result = panic::catch_unwind(AssertUnwindSafe(|| {
        shared.executor.execute(request, live_output)
    }));
    drop((running, admission));
    match result {
        Ok(Ok(execution)) => {
            shared.executions.fetch_add(1, Ordering::Relaxed);
            shared
                .syscalls
                .fetch_add(execution.usage.syscalls, Ordering::Relaxed);
            shared
                .thread_switches
                .fetch_add(execution.usage.thread_switches, Ordering::Relaxed);
            response::execution(
                id,
                &execution,
                &limits,
                RequestTimes {
                    queue,
                    total: received.elapsed(),
                },
            )
        }
        Ok(Err(e)) => response::error(Some(id), ErrorCode::from(&e), &e.to_string()),
        Err(_) => response::error(Some(id), ErrorCode::Internal, "the executor panicked"),
    }
}
