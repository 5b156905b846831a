//! The real `sandfork-vmm serve` binary with the Python template's real image. On this
//! development machine there is no /dev/kvm: the daemon must still start, say why in `health`,
//! list its template and answer `execute` with the retryable `unavailable` error. On a KVM host
//! the same test expects `kvm: available` and a real execution instead.

mod daemon_support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use daemon_support::{assert_error, scratch, str_of, templates_dir, u64_of, wait_for, Client};
use serde_json::Value;

/// A running daemon process, killed if the test ends without stopping it.
struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    fn spawn(socket: &Path, templates: &Path, extra: &[&str]) -> Child {
        Command::new(env!("CARGO_BIN_EXE_sandfork-vmm"))
            .arg("serve")
            .arg("--socket")
            .arg(socket)
            .arg("--templates")
            .arg(templates)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting sandfork-vmm serve")
    }

    /// Starts the daemon and waits until it accepts connections.
    fn start(dir: &Path) -> Daemon {
        Daemon::start_with(dir, templates_dir(), &["--max-concurrency", "3"])
    }

    /// Starts the daemon on `templates` with `extra` arguments and waits until it accepts
    /// connections.
    fn start_with(dir: &Path, templates: &Path, extra: &[&str]) -> Daemon {
        let socket = dir.join("s.sock");
        let mut daemon = Daemon {
            child: Daemon::spawn(&socket, templates, extra),
            socket,
        };
        let listening = wait_for(Duration::from_secs(30), || {
            std::os::unix::net::UnixStream::connect(&daemon.socket).is_ok()
                || matches!(daemon.child.try_wait(), Ok(Some(_)))
        });
        assert!(
            listening && daemon.child.try_wait().unwrap().is_none(),
            "the daemon did not start: {}",
            daemon.stderr()
        );
        daemon
    }

    fn stderr(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut text = String::new();
        if let Some(mut stderr) = self.child.stderr.take() {
            let _ = stderr.read_to_string(&mut text);
        }
        text
    }

    /// Sends SIGTERM (through kill(1): std can only send SIGKILL).
    fn terminate(&mut self) -> std::process::ExitStatus {
        let sent = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("running kill");
        assert!(sent.success());
        self.child.wait().expect("waiting for the daemon")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn serves_health_templates_and_execute_on_this_host() {
    let mut daemon = Daemon::start(&scratch("bin-serve"));
    let mut client = Client::hello(&daemon.socket);
    let kvm_present = Path::new("/dev/kvm").exists();

    let health = client.call(r#"{"id":1,"type":"health"}"#);
    assert_eq!(u64_of(&health, "templates"), 1, "{health}");
    // Every VM holds two open files: the daemon raised its soft limit to the hard one.
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", daemon.child.id())).unwrap();
    let open_files: Vec<&str> = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .map(|l| l.split_whitespace().skip(3).take(2).collect())
        .unwrap_or_default();
    assert_eq!(open_files.len(), 2, "{limits}");
    assert_eq!(open_files[0], open_files[1], "soft = hard: {limits}");
    let kvm = str_of(&health, "kvm");
    if kvm_present {
        assert_eq!(kvm, "available", "{health}");
    } else {
        assert!(
            kvm.starts_with("unavailable: /dev/kvm is missing"),
            "{health}"
        );
        assert_eq!(health.get("ok"), Some(&Value::Bool(false)), "{health}");
    }

    let listed = client.call(r#"{"id":2,"type":"list_templates"}"#);
    let templates = listed
        .get("templates")
        .and_then(Value::as_array)
        .expect("a template list");
    assert_eq!(templates.len(), 1, "{listed}");
    let image = sandfork_vmm::fs::Image::open(&templates_dir().join("python")).unwrap();
    let hash: String = image
        .content_hash()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        (
            str_of(&templates[0], "name"),
            str_of(&templates[0], "language"),
            str_of(&templates[0], "content_hash")
        ),
        ("python", "python", hash.as_str())
    );
    assert_eq!(templates[0].get("ready"), Some(&Value::Bool(kvm_present)));

    let answer =
        client.call(r#"{"id":3,"type":"execute","template":"python","code":"print(6*7)"}"#);
    if kvm_present {
        assert_eq!(
            (str_of(&answer, "status"), str_of(&answer, "stdout")),
            ("ok", "42\n"),
            "{answer}"
        );
    } else {
        assert_error(&answer, "unavailable", Some(3));
        assert!(str_of(&answer, "message").contains("/dev/kvm"), "{answer}");
    }
    assert_error(
        &client.call(r#"{"id":4,"type":"execute","template":"ruby","code":"x"}"#),
        "unknown_template",
        Some(4),
    );

    let stats = client.call(r#"{"id":5,"type":"stats"}"#);
    let syscalls = if kvm_present {
        u64_of(answer.get("usage").unwrap(), "syscalls")
    } else {
        0
    };
    assert_eq!(
        stats.to_string(),
        format!(
            r#"{{"id":5,"type":"stats","executions":{},"in_flight":0,"syscalls":{syscalls},"thread_switches":0,"admission":{{"running":0,"queued":0,"queued_by_template":{{}},"busy":{{"queue_full":0,"template_queue_full":0,"key_queue_full":0,"connections_full":0,"sessions_full":0}}}},"pools":[]}}"#,
            u64::from(kvm_present)
        )
    );
    drop(client);

    let status = daemon.terminate();
    assert!(
        status.success(),
        "exit status {status}: {}",
        daemon.stderr()
    );
    assert!(!daemon.socket.exists(), "SIGTERM removes the socket file");
    let log = daemon.stderr();
    assert!(
        log.contains("listening on") && log.contains("signal 15, stopping"),
        "{log}"
    );
    assert!(log.contains(" VMs; confined by seccomp"), "{log}");
}

/// The names `list_templates` answers.
fn names(listed: &Value) -> Vec<&str> {
    listed
        .get("templates")
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("a template list: {listed}"))
        .iter()
        .map(|t| str_of(t, "name"))
        .collect()
}

#[test]
fn a_template_built_after_the_start_is_loaded_and_unloaded() {
    let dir = scratch("bin-load");
    let templates = dir.join("templates");
    let sessions = dir.join("sessions");
    std::fs::create_dir_all(&templates).unwrap();
    std::fs::create_dir_all(&sessions).unwrap();
    let python = templates_dir().join("python");
    std::os::unix::fs::symlink(&python, templates.join("python")).unwrap();
    // Opening files after the start needs the filter of a daemon that keeps sessions.
    let sessions = sessions.to_str().unwrap();
    let mut daemon = Daemon::start_with(&dir, &templates, &["--sessions", sessions]);
    let mut client = Client::hello(&daemon.socket);

    assert_error(
        &client.call(r#"{"id":1,"type":"load_template","name":"custom@1"}"#),
        "unknown_template",
        Some(1),
    );
    for (id, name) in [(2, "../python"), (3, ".hidden"), (4, "")] {
        let answer = client.call(&format!(
            r#"{{"id":{id},"type":"load_template","name":"{name}"}}"#
        ));
        assert_error(&answer, "bad_request", Some(id));
    }
    std::fs::create_dir_all(templates.join("junk")).unwrap();
    std::fs::write(templates.join("junk/image.index"), b"not an image").unwrap();
    let answer = client.call(r#"{"id":5,"type":"load_template","name":"junk"}"#);
    assert_error(&answer, "bad_request", Some(5));
    assert!(str_of(&answer, "message").contains("junk"), "{answer}");

    std::os::unix::fs::symlink(&python, templates.join("custom@1")).unwrap();
    let loaded = client.call(r#"{"id":6,"type":"load_template","name":"custom@1"}"#);
    assert_eq!(names(&loaded), ["custom@1", "python"], "{loaded}");
    let listed = client.call(r#"{"id":7,"type":"list_templates"}"#);
    assert_eq!(names(&listed), ["custom@1", "python"], "{listed}");
    let answer =
        client.call(r#"{"id":8,"type":"execute","template":"custom@1","code":"print(6*7)"}"#);
    if Path::new("/dev/kvm").exists() {
        assert_eq!(str_of(&answer, "stdout"), "42\n", "{answer}");
    } else {
        assert_error(&answer, "unavailable", Some(8));
    }
    // Loading it again replaces it.
    let reloaded = client.call(r#"{"id":9,"type":"load_template","name":"custom@1"}"#);
    assert_eq!(names(&reloaded), ["custom@1", "python"], "{reloaded}");

    let unloaded = client.call(r#"{"id":10,"type":"unload_template","name":"custom@1"}"#);
    assert_eq!(names(&unloaded), ["python"], "{unloaded}");
    assert_error(
        &client.call(r#"{"id":11,"type":"execute","template":"custom@1","code":"1"}"#),
        "unknown_template",
        Some(11),
    );
    assert_error(
        &client.call(r#"{"id":12,"type":"unload_template","name":"custom@1"}"#),
        "unknown_template",
        Some(12),
    );
    drop(client);
    assert!(daemon.terminate().success(), "{}", daemon.stderr());
}

#[test]
fn a_second_daemon_on_a_live_socket_is_refused() {
    let dir = scratch("bin-twice");
    let mut first = Daemon::start(&dir);
    let second = Daemon::spawn(&first.socket, templates_dir(), &[])
        .wait_with_output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("another server is listening"),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    // The first one is unaffected.
    let mut client = Client::hello(&first.socket);
    assert_eq!(
        str_of(&client.call(r#"{"id":1,"type":"health"}"#), "type"),
        "health"
    );
    assert!(first.terminate().success());
}

#[test]
fn a_broken_template_stops_the_start() {
    let dir = scratch("bin-broken");
    let templates = dir.join("templates");
    std::fs::create_dir_all(templates.join("junk")).unwrap();
    std::fs::write(templates.join("junk/image.index"), b"not an image").unwrap();
    let output = Daemon::spawn(&dir.join("s.sock"), &templates, &[])
        .wait_with_output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("junk"), "{stderr}");
    assert!(!dir.join("s.sock").exists());

    let output = Daemon::spawn(&dir.join("s.sock"), &dir.join("missing"), &[])
        .wait_with_output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("listing templates"));
}

#[test]
fn sigterm_stops_a_daemon_whose_stderr_is_a_broken_pipe() {
    // A gateway killed with SIGKILL leaves its daemon writing into a closed pipe.
    let dir = scratch("bin-orphan");
    let mut daemon = Daemon::start(&dir);
    drop(daemon.child.stderr.take());
    drop(daemon.child.stdout.take());
    let sent = Command::new("kill")
        .arg("-TERM")
        .arg(daemon.child.id().to_string())
        .status()
        .expect("running kill");
    assert!(sent.success());
    let exited = wait_for(Duration::from_secs(10), || {
        matches!(daemon.child.try_wait(), Ok(Some(_)))
    });
    assert!(exited, "the daemon ignored SIGTERM");
    assert!(daemon.child.wait().unwrap().success());
    assert!(!daemon.socket.exists(), "SIGTERM removes the socket file");
}

/// The daemon confines itself once set up (src/seccomp.rs): a host system call off its
/// allow-list, made here by the test-only trip thread, kills it with SIGSYS (the supervisor then
/// restarts it: runtime/supervisor.test.ts).
#[test]
fn a_forbidden_host_system_call_kills_the_daemon() {
    use std::os::unix::process::ExitStatusExt;
    let dir = scratch("seccomp");
    let socket = dir.join("s.sock");
    let mut child = Daemon::spawn(
        &socket,
        templates_dir(),
        &["--test-forbidden-syscall-after-ms", "300"],
    );
    assert!(
        wait_for(Duration::from_secs(30), || matches!(
            child.try_wait(),
            Ok(Some(_))
        )),
        "the daemon is still running"
    );
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(
        status.signal(),
        Some(31),
        "expected SIGSYS, got {status:?}; stderr: {stderr}"
    );
    assert!(
        stderr.contains("confined by seccomp") && !stderr.contains("not confined"),
        "{stderr}"
    );
}
