//! Helpers for the daemon's integration tests: a blocking protocol client over a real Unix
//! socket, per-process scratch directories and an in-process server.

#![allow(dead_code)] // each test binary uses its own subset of these helpers

// Tests that also load common/ hold a second copy of this module: it only reads the environment.
#[allow(clippy::duplicate_mod)]
#[path = "../common/time_scale.rs"]
mod time_scale;
#[allow(unused_imports)] // each test binary uses its own subset
pub use time_scale::{boot_limits, repetitions, scaled, scaled_ms, time_scale};

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use sandfork_vmm::daemon::executor::{ExecutionLimits, Executor};
use sandfork_vmm::daemon::frame;
use sandfork_vmm::daemon::request::LimitPolicy;
use sandfork_vmm::daemon::server::{Server, ServerConfig, Stopper};
use serde_json::Value;

/// A fresh directory for this test: `<CARGO_TARGET_TMPDIR>/d-<tag>-<pid>` (short, because a
/// socket path must fit in 108 bytes).
pub fn scratch(tag: &str) -> PathBuf {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("d-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

/// A templates directory holding the Python template's image, built once per test process.
pub fn templates_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("templates");
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates/python/image.json");
        sandfork_vmm::image::build(&manifest, &dir.join("python"))
            .unwrap_or_else(|e| panic!("building the Python image: {e}"));
        dir
    })
}

/// A templates directory with the Python template's image and its snapshot (built on the KVM
/// vCPU), built once per test process.
pub fn snapshot_templates_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("snapshot-templates");
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates/python/image.json");
        build_python_template(&manifest, &dir.join("python"));
        dir
    })
}

/// Builds the Python template into `template` (a folder of a templates directory): the image
/// `manifest` describes and its snapshot, booted on the KVM vCPU.
pub fn build_python_template(manifest: &Path, template: &Path) {
    sandfork_vmm::image::build(manifest, template)
        .unwrap_or_else(|e| panic!("building the Python image: {e}"));
    let image = sandfork_vmm::fs::Image::open(template).unwrap();
    let agent = &sandfork_vmm::agent::PYTHON_AGENT;
    sandfork_vmm::snapshot::build(
        image,
        "python",
        agent,
        &boot_limits(limits().memory_bytes()),
        &sandfork_vmm::kvm::new_cpu,
        template,
    )
    .unwrap_or_else(|e| panic!("building the snapshot: {e}"));
}

/// The servers' default and maximum limits: a 10 s time limit (scaled for the KVM tier's path),
/// 256 MiB, 1 MiB of output, 64 processes.
pub fn limits() -> ExecutionLimits {
    ExecutionLimits {
        timeout_ms: scaled_ms(10_000),
        memory_mib: 256,
        output_bytes: 1 << 20,
        processes: 64,
    }
}

/// `max_running` executions at once, none waiting (beyond them: `busy`).
pub fn config(max_running: usize) -> ServerConfig {
    ServerConfig {
        max_running,
        max_queued: 0,
        max_queued_per_template: 64,
        max_queued_per_key: 64,
        max_connections: 64,
        limits: LimitPolicy::new(limits(), limits()),
    }
}

/// A server running on its own thread.
pub struct Running {
    pub path: PathBuf,
    pub stopper: Stopper,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    pub fn start(dir: &Path, executor: Arc<dyn Executor>, config: ServerConfig) -> Running {
        let path = dir.join("s.sock");
        let server = Server::bind(&path, executor, config)
            .unwrap_or_else(|e| panic!("binding {}: {e}", path.display()));
        let stopper = server.stopper().expect("duplicating the listening socket");
        let thread = thread::spawn(move || server.run());
        Running {
            path,
            stopper,
            thread: Some(thread),
        }
    }

    /// Stops the server and waits until it has finished.
    pub fn stop(mut self) {
        self.stopper.stop();
        if let Some(thread) = self.thread.take() {
            thread.join().expect("server thread panicked");
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stopper.stop();
        }
    }
}

/// A protocol client that fails the test on any I/O error or timeout.
pub struct Client {
    pub stream: UnixStream,
}

impl Client {
    pub fn connect(path: &Path) -> Client {
        let stream = UnixStream::connect(path)
            .unwrap_or_else(|e| panic!("connecting to {}: {e}", path.display()));
        stream
            .set_read_timeout(Some(scaled(Duration::from_secs(120))))
            .unwrap();
        Client { stream }
    }

    /// Connects and completes the handshake.
    pub fn hello(path: &Path) -> Client {
        let mut client = Client::connect(path);
        let answer = client.call(r#"{"type":"hello","protocol":1}"#);
        assert_eq!(
            answer.get("type").and_then(Value::as_str),
            Some("hello"),
            "{answer}"
        );
        client
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("writing to the daemon");
    }

    /// Sends `payload` as one frame (any bytes, JSON or not).
    pub fn send_payload(&mut self, payload: &[u8]) {
        let mut bytes = (payload.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(payload);
        self.send_raw(&bytes);
    }

    pub fn send(&mut self, text: &str) {
        self.send_payload(text.as_bytes());
    }

    pub fn recv(&mut self) -> Value {
        frame::read_frame(&mut self.stream).unwrap_or_else(|e| panic!("reading a response: {e}"))
    }

    pub fn call(&mut self, text: &str) -> Value {
        self.send(text);
        self.recv()
    }

    /// True when the server has closed the connection (EOF), with no frame before it.
    pub fn is_closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

pub fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

pub fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{key} is not a string in {v}"))
}

pub fn u64_of(v: &Value, key: &str) -> u64 {
    v.get(key)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{key} is not an integer in {v}"))
}

/// Asserts `v` is an error frame with `code` and `id`.
pub fn assert_error(v: &Value, code: &str, id: Option<u64>) {
    assert_eq!(str_of(v, "type"), "error", "{v}");
    assert_eq!(str_of(v, "code"), code, "{v}");
    assert_eq!(
        v.get("id"),
        Some(&id.map_or(Value::Null, Value::from)),
        "{v}"
    );
    let retryable = matches!(code, "unavailable" | "busy" | "internal");
    assert_eq!(v.get("retryable"), Some(&Value::Bool(retryable)), "{v}");
}

/// Polls `condition` every 10 ms for up to `limit`.
pub fn wait_for(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if condition() {
            return true;
        }
        thread::sleep(Duration::from_millis(10));
    }
    condition()
}
