//! The daemon's server over a real Unix socket, with a scripted in-process executor standing
//! in for VMs: framing errors, the handshake, concurrency, `busy`, disconnects and shutdown.
//! (Real executions through the same server: daemon_ptrace.rs; the real binary:
//! daemon_binary.rs.)

mod daemon_support;

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use daemon_support::{
    assert_error, config, parse, scratch, str_of, u64_of, wait_for, Client, Running,
};
use sandfork_vmm::daemon::executor::{
    ExecuteError, ExecuteRequest, Execution, Executor, Health, PoolStats, TemplateInfo, Usage,
    VmOrigin,
};
use sandfork_vmm::daemon::frame;
use sandfork_vmm::daemon::server::{Server, ServerConfig};
use sandfork_vmm::process::{Output, OutputSink, Stream};
use sandfork_vmm::status::RunStatus;
use serde_json::Value;

/// Executes by script: code "block" waits until `release`, "stream" writes a first chunk of
/// output to the live sink, waits until `release` and writes a second, "panic" panics, anything
/// else "runs" at once and prints the code back. Template "fake" only.
#[derive(Default)]
struct ScriptedExecutor {
    released: Mutex<bool>,
    release_signal: Condvar,
    started: AtomicUsize,
    finished: AtomicUsize,
}

impl ScriptedExecutor {
    fn wait_for_release(&self) {
        let mut released = self.released.lock().unwrap();
        while !*released {
            released = self.release_signal.wait(released).unwrap();
        }
    }

    fn release(&self) {
        *self.released.lock().unwrap() = true;
        self.release_signal.notify_all();
    }
}

impl Executor for ScriptedExecutor {
    fn execute(
        &self,
        request: ExecuteRequest,
        live_output: OutputSink,
    ) -> Result<Execution, ExecuteError> {
        if request.template != "fake" {
            return Err(ExecuteError::UnknownTemplate(request.template.clone()));
        }
        self.started.fetch_add(1, Ordering::SeqCst);
        let mut output = Output::new(1 << 20);
        output.stream_to(live_output);
        match request.agent_request.code.as_str() {
            "block" => self.wait_for_release(),
            "stream" => {
                output.append(Stream::Stdout, b"first \xe2\x82");
                self.wait_for_release();
                output.append(Stream::Stderr, b"warning\n");
                output.append(Stream::Stdout, b"\xac\n");
            }
            "panic" => panic!("scripted executor panic"),
            _ => {}
        }
        self.finished.fetch_add(1, Ordering::SeqCst);
        let usage = Usage {
            wall_us: 5,
            cpu_us: 4,
            peak_memory_bytes: 4096,
            pages_copied: 0,
            syscalls: 3,
            exits: 3,
            threads_created: 1,
            thread_switches: 4,
            network: Default::default(),
            processes_created: 2,
        };
        let (stdout, stderr) = match output.total() {
            0 => (
                format!("{}\n", request.agent_request.code).into_bytes(),
                vec![],
            ),
            _ => output.into_parts(),
        };
        Ok(Execution {
            status: RunStatus::Exited { code: 0 },
            stdout,
            stderr,
            queue: Duration::ZERO,
            vm_setup: Duration::from_micros(1),
            run: Duration::from_micros(2),
            usage,
            vm: VmOrigin::Fresh,
            result: None,
            files: None,
        })
    }

    fn templates(&self) -> Vec<TemplateInfo> {
        vec![TemplateInfo {
            name: "fake".into(),
            content_hash: "00".repeat(32),
            language: "python".into(),
            languages: vec!["python".into()],
            ready: true,
        }]
    }

    fn health(&self) -> Health {
        Health {
            kvm: Ok(()),
            templates: 1,
        }
    }

    fn pools(&self) -> Vec<PoolStats> {
        vec![PoolStats {
            template: "fake".into(),
            ready: 2,
            target: 4,
            forks: 9,
            fork_us_mean: 350,
            resets: 5,
            reset_us_mean: 120,
            reset_pages_mean: 370,
            served: 7,
            warm_up: "on".into(),
        }]
    }
}

fn start(tag: &str, max_in_flight: usize) -> (Running, Arc<ScriptedExecutor>) {
    let executor = Arc::new(ScriptedExecutor::default());
    let running = Running::start(&scratch(tag), executor.clone(), config(max_in_flight));
    (running, executor)
}

fn execute(id: u64, code: &str) -> String {
    format!(
        r#"{{"id":{id},"type":"execute","template":"fake","code":{}}}"#,
        Value::from(code)
    )
}

/// A connection still works: a health request is answered.
fn assert_serves(client: &mut Client, id: u64) {
    let health = client.call(&format!(r#"{{"id":{id},"type":"health"}}"#));
    assert_eq!(
        (str_of(&health, "type"), u64_of(&health, "id")),
        ("health", id),
        "{health}"
    );
}

#[test]
fn handshake_then_list_health_and_stats() {
    let (server, _) = start("hello", 2);
    let mut client = Client::connect(&server.path);
    let hello = client.call(r#"{"type":"hello","protocol":1}"#);
    assert_eq!(
        hello,
        parse(concat!(
            r#"{"type":"hello","protocol":1,"server":"sandfork-vmm "#,
            env!("CARGO_PKG_VERSION"),
            r#""}"#
        ))
    );
    assert_eq!(
        client
            .call(r#"{"id":1,"type":"list_templates"}"#)
            .to_string(),
        format!(
            r#"{{"id":1,"type":"templates","templates":[{{"name":"fake","content_hash":"{}","language":"python","languages":["python"],"ready":true}}]}}"#,
            "00".repeat(32)
        )
    );
    assert_eq!(
        client.call(r#"{"id":2,"type":"health"}"#).to_string(),
        r#"{"id":2,"type":"health","ok":true,"kvm":"available","templates":1}"#
    );
    let answer = client.call(&execute(3, "hi"));
    assert_eq!(
        (
            str_of(&answer, "status"),
            str_of(&answer, "stdout"),
            u64_of(&answer, "id")
        ),
        ("ok", "hi\n", 3),
        "{answer}"
    );
    assert_eq!(
        client.call(r#"{"id":4,"type":"stats"}"#).to_string(),
        r#"{"id":4,"type":"stats","executions":1,"in_flight":0,"syscalls":3,"thread_switches":4,"admission":{"running":0,"queued":0,"queued_by_template":{},"busy":{"queue_full":0,"template_queue_full":0,"key_queue_full":0,"connections_full":0,"sessions_full":0}},"pools":[{"template":"fake","ready":2,"target":4,"forks":9,"fork_us_mean":350,"resets":5,"reset_us_mean":120,"reset_pages_mean":370,"served":7,"warm_up":"on"}]}"#
    );
    server.stop();
}

#[test]
fn the_process_limit_is_checked_clamped_and_echoed() {
    let (server, _) = start("processes", 2);
    let mut client = Client::hello(&server.path);
    let with_limits = |id: u64, limits: &str| {
        format!(r#"{{"id":{id},"type":"execute","template":"fake","code":"x","limits":{limits}}}"#)
    };
    let echoed = |answer: &Value| answer["limits"]["processes"].clone();
    let asked = client.call(&with_limits(1, r#"{"processes":5}"#));
    assert_eq!(echoed(&asked), Value::from(5), "{asked}");
    let clamped = client.call(&with_limits(2, r#"{"processes":9007199254740991}"#));
    assert_eq!(echoed(&clamped), Value::from(64), "{clamped}");
    let defaulted = client.call(&execute(3, "x"));
    assert_eq!(echoed(&defaulted), Value::from(64), "{defaulted}");
    assert_eq!(
        defaulted["usage"]["processes_created"],
        Value::from(2),
        "{defaulted}"
    );
    for (id, bad) in [
        (4, "0"),
        (5, "-1"),
        (6, "1.5"),
        (7, r#""3""#),
        (8, "9007199254740992"),
    ] {
        let refused = client.call(&with_limits(id, &format!(r#"{{"processes":{bad}}}"#)));
        assert_error(&refused, "bad_request", Some(id));
        assert!(
            str_of(&refused, "message").starts_with("limits.processes"),
            "{refused}"
        );
    }
    assert_serves(&mut client, 9);
    server.stop();
}

#[test]
fn a_wrong_protocol_version_is_refused_and_closed() {
    let (server, _) = start("version", 2);
    let mut client = Client::connect(&server.path);
    let answer = client.call(r#"{"type":"hello","protocol":2}"#);
    assert_error(&answer, "unsupported_protocol", None);
    assert!(
        str_of(&answer, "message").contains("protocol 1"),
        "{answer}"
    );
    assert!(client.is_closed());
    // A client that gets the version right is served.
    assert_serves(&mut Client::hello(&server.path), 1);
}

#[test]
fn requests_before_the_handshake_are_bad_requests_and_the_hello_still_works() {
    let (server, _) = start("prehello", 2);
    let mut client = Client::connect(&server.path);
    assert_error(
        &client.call(r#"{"id":1,"type":"health"}"#),
        "bad_request",
        None,
    );
    assert_error(
        &client.call(r#"{"type":"hello","protocol":"1"}"#),
        "bad_request",
        None,
    );
    assert_error(&client.call("[1]"), "bad_frame", None);
    assert_eq!(
        str_of(&client.call(r#"{"type":"hello","protocol":1}"#), "type"),
        "hello"
    );
    assert_error(
        &client.call(r#"{"id":5,"type":"hello","protocol":1}"#),
        "bad_request",
        Some(5),
    );
    assert_serves(&mut client, 6);
}

#[test]
fn malformed_frames_get_error_frames_and_the_connection_goes_on() {
    let (server, _) = start("malformed", 2);
    let mut client = Client::hello(&server.path);
    let mut other = Client::hello(&server.path);
    let payloads: [&[u8]; 8] = [
        b"",
        b"\xff\xfe",
        b"{\"a\":\"\xc3\"}",
        b"not json",
        b"[]",
        b"\"s\"",
        b"{\"a\":1,}",
        b"{\"id\":1,\"type\":\"health\"}{}",
    ];
    for payload in payloads {
        client.send_payload(payload);
        let answer = client.recv();
        assert_error(&answer, "bad_frame", None);
        assert_serves(&mut other, 1);
    }
    // Valid JSON objects that are not valid requests are bad requests, with the id when known.
    assert_error(
        &client.call(r#"{"id":9,"type":"execute","template":"fake"}"#),
        "bad_request",
        Some(9),
    );
    assert_error(
        &client.call(r#"{"id":-9,"type":"health"}"#),
        "bad_request",
        None,
    );
    assert_error(
        &client.call(r#"{"id":10,"type":"execute","template":"ruby","code":"x"}"#),
        "unknown_template",
        Some(10),
    );
    let nested = format!(
        r#"{{"id":11,"type":"execute","template":"fake","code":"x","env":{}1{}}}"#,
        "[".repeat(100),
        "]".repeat(100)
    );
    assert_error(&client.call(&nested), "bad_frame", None);
    assert_serves(&mut client, 12);
}

#[test]
fn an_oversized_length_closes_only_that_connection() {
    let (server, _) = start("oversized", 2);
    let mut client = Client::hello(&server.path);
    let mut other = Client::hello(&server.path);
    client.send_raw(&(16u32 << 20 | 1).to_be_bytes());
    let answer = client.recv();
    assert_error(&answer, "bad_frame", None);
    assert!(
        str_of(&answer, "message").contains("exceeds the limit"),
        "{answer}"
    );
    assert!(client.is_closed());
    assert_serves(&mut other, 1);
    assert_serves(&mut Client::hello(&server.path), 2);
}

#[test]
fn a_frame_cut_short_by_a_disconnect_harms_nobody() {
    let (server, _) = start("truncated", 2);
    for cut in [1, 3, 4, 10] {
        let mut client = Client::hello(&server.path);
        let mut frame = 40u32.to_be_bytes().to_vec();
        frame.extend_from_slice(br#"{"id":1,"type":"health"}"#);
        client.send_raw(&frame[..cut]);
        drop(client);
    }
    assert_serves(&mut Client::hello(&server.path), 1);
}

#[test]
fn responses_come_as_executions_complete() {
    let (server, executor) = start("order", 4);
    let mut client = Client::hello(&server.path);
    client.send(&execute(1, "block"));
    assert!(wait_for(Duration::from_secs(10), || executor
        .started
        .load(Ordering::SeqCst)
        == 1));
    // Requests on one connection run concurrently: id 2 finishes while id 1 is still running.
    let second = client.call(&execute(2, "quick"));
    assert_eq!(
        (u64_of(&second, "id"), str_of(&second, "stdout")),
        (2, "quick\n"),
        "{second}"
    );
    // An id already in flight on this connection is refused; other requests are still served.
    assert_error(&client.call(&execute(1, "again")), "bad_request", Some(1));
    let stats = client.call(r#"{"id":3,"type":"stats"}"#);
    assert_eq!(
        (u64_of(&stats, "in_flight"), u64_of(&stats, "executions")),
        (1, 1),
        "{stats}"
    );
    executor.release();
    let first = client.recv();
    assert_eq!(
        (u64_of(&first, "id"), str_of(&first, "stdout")),
        (1, "block\n"),
        "{first}"
    );
    server.stop();
}

#[test]
fn a_streamed_execution_sends_its_output_as_written_then_the_answer() {
    let (server, executor) = start("stream", 2);
    let mut client = Client::hello(&server.path);
    client.send(r#"{"id":5,"type":"execute","template":"fake","code":"stream","stream":true}"#);
    // The first chunk arrives while the execution still waits, without the cut '€'.
    let first = client.recv();
    assert_eq!(
        first.to_string(),
        r#"{"id":5,"type":"output","stream":"stdout","data":"first "}"#
    );
    assert_serves(&mut client, 6);
    executor.release();
    let mut frames = Vec::new();
    loop {
        let frame = client.recv();
        let last = str_of(&frame, "type") == "execution";
        frames.push(frame);
        if last {
            break;
        }
    }
    let (answer, chunks) = frames.split_last().unwrap();
    let joined = |stream: &str| {
        chunks
            .iter()
            .filter(|c| str_of(c, "stream") == stream)
            .map(|c| str_of(c, "data"))
            .collect::<String>()
    };
    assert!(
        chunks
            .iter()
            .all(|c| str_of(c, "type") == "output" && u64_of(c, "id") == 5),
        "{chunks:?}"
    );
    assert_eq!(
        (format!("first {}", joined("stdout")), joined("stderr")),
        ("first €\n".to_owned(), "warning\n".to_owned())
    );
    assert_eq!(
        (str_of(answer, "stdout"), str_of(answer, "stderr")),
        ("first €\n", "warning\n"),
        "{answer}"
    );
    // Without "stream" the same execution sends the answer alone.
    let plain = client.call(r#"{"id":7,"type":"execute","template":"fake","code":"stream"}"#);
    assert_eq!(
        (str_of(&plain, "type"), str_of(&plain, "stdout")),
        ("execution", "first €\n"),
        "{plain}"
    );
    server.stop();
}

#[test]
fn beyond_the_in_flight_limit_requests_are_busy() {
    let (server, executor) = start("busy", 2);
    let mut a = Client::hello(&server.path);
    let mut b = Client::hello(&server.path);
    a.send(&execute(1, "block"));
    b.send(&execute(1, "block"));
    assert!(wait_for(Duration::from_secs(10), || executor
        .started
        .load(Ordering::SeqCst)
        == 2));
    // The limit is over all connections.
    for client in [&mut a, &mut b] {
        let busy = client.call(&execute(2, "more"));
        assert_error(&busy, "busy", Some(2));
        assert_eq!(str_of(&busy, "reason"), "queue_full");
        assert!(
            str_of(&busy, "message").contains("maximum of 2 executions with 0 waiting"),
            "{busy}"
        );
    }
    // Non-execution requests are still answered.
    assert_serves(&mut a, 3);
    executor.release();
    for client in [&mut a, &mut b] {
        let done = client.recv();
        assert_eq!(
            (u64_of(&done, "id"), str_of(&done, "status")),
            (1, "ok"),
            "{done}"
        );
        // A slot is free again.
        let retried = client.call(&execute(2, "more"));
        assert_eq!(str_of(&retried, "stdout"), "more\n", "{retried}");
    }
    server.stop();
}

#[test]
fn executions_beyond_the_running_limit_wait_in_a_bounded_queue() {
    let executor = Arc::new(ScriptedExecutor::default());
    let server = Running::start(
        &scratch("queue"),
        executor.clone(),
        ServerConfig {
            max_queued: 1,
            ..config(1)
        },
    );
    let mut client = Client::hello(&server.path);
    client.send(&execute(1, "block"));
    assert!(wait_for(Duration::from_secs(10), || executor
        .started
        .load(Ordering::SeqCst)
        == 1));
    client.send(&execute(2, "queued"));
    let busy = client.call(&execute(3, "too many"));
    assert_error(&busy, "busy", Some(3));
    assert!(
        str_of(&busy, "message").contains("maximum of 1 executions with 1 waiting"),
        "{busy}"
    );
    let stats = client.call(r#"{"id":4,"type":"stats"}"#);
    assert_eq!(
        u64_of(&stats, "in_flight"),
        2,
        "running and queued are both in flight: {stats}"
    );
    assert_eq!(
        executor.started.load(Ordering::SeqCst),
        1,
        "the queued execution has not started"
    );
    std::thread::sleep(Duration::from_millis(50));
    executor.release();
    let mut answers = [client.recv(), client.recv()];
    answers.sort_by_key(|a| u64_of(a, "id"));
    assert_eq!(str_of(&answers[1], "stdout"), "queued\n", "{}", answers[1]);
    let queued_us = u64_of(answers[1].get("timings").unwrap(), "queue_us");
    assert!(
        queued_us >= 50_000,
        "the wait is reported as queue_us: {}",
        answers[1]
    );
    server.stop();
}

fn execute_as(id: u64, template: &str, key: Option<&str>, code: &str) -> String {
    let mut frame = parse(&execute(id, code));
    frame["template"] = Value::from(template);
    if let Some(key) = key {
        frame["key_id"] = Value::from(key);
    }
    frame.to_string()
}

/// The `admission` of a `stats` answer.
fn admission(client: &mut Client, id: u64) -> Value {
    let stats = client.call(&format!(r#"{{"id":{id},"type":"stats"}}"#));
    stats.get("admission").cloned().unwrap_or(Value::Null)
}

#[test]
fn past_a_templates_or_a_keys_line_an_execution_is_busy_with_that_reason_and_the_rest_wait() {
    let executor = Arc::new(ScriptedExecutor::default());
    let server = Running::start(
        &scratch("lines"),
        executor.clone(),
        ServerConfig {
            max_queued: 8,
            max_queued_per_template: 3,
            max_queued_per_key: 1,
            ..config(1)
        },
    );
    let mut client = Client::hello(&server.path);
    client.send(&execute_as(1, "fake", Some("key-a"), "block"));
    assert!(wait_for(Duration::from_secs(10), || executor
        .started
        .load(Ordering::SeqCst)
        == 1));
    client.send(&execute_as(2, "fake", Some("key-a"), "a waits"));
    let key_busy = client.call(&execute_as(3, "fake", Some("key-a"), "a again"));
    assert_error(&key_busy, "busy", Some(3));
    assert_eq!(str_of(&key_busy, "reason"), "key_queue_full", "{key_busy}");
    assert!(str_of(&key_busy, "message").contains("1 executions of this key_id already wait"));
    client.send(&execute_as(4, "fake", Some("key-b"), "b waits"));
    client.send(&execute_as(5, "fake", None, "no key waits"));
    let template_busy = client.call(&execute_as(6, "fake", Some("key-c"), "c"));
    assert_error(&template_busy, "busy", Some(6));
    assert_eq!(
        str_of(&template_busy, "reason"),
        "template_queue_full",
        "{template_busy}"
    );
    assert!(str_of(&template_busy, "message").contains("3 executions of template 'fake'"));
    // Another template's line is its own (this executor then refuses it as unknown).
    client.send(&execute_as(7, "other", Some("key-c"), "other waits"));
    assert!(wait_for(Duration::from_secs(10), || admission(
        &mut client,
        8
    )["queued"]
        == 4));
    assert_eq!(
        admission(&mut client, 9),
        parse(
            r#"{"running":1,"queued":4,"queued_by_template":{"fake":3,"other":1},
                "busy":{"queue_full":0,"template_queue_full":1,"key_queue_full":1,
                        "connections_full":0,"sessions_full":0}}"#
        )
    );
    assert_eq!(executor.started.load(Ordering::SeqCst), 1);

    executor.release();
    let mut answers: Vec<Value> = (0..5).map(|_| client.recv()).collect();
    answers.sort_by_key(|a| u64_of(a, "id"));
    let ids: Vec<u64> = answers.iter().map(|a| u64_of(a, "id")).collect();
    assert_eq!(ids, [1, 2, 4, 5, 7]);
    for answer in &answers[..4] {
        assert_eq!(str_of(answer, "status"), "ok", "{answer}");
    }
    assert_error(&answers[4], "unknown_template", Some(7));
    // The lines are empty again: the same key and template are admitted.
    let again = client.call(&execute_as(10, "fake", Some("key-a"), "a again"));
    assert_eq!(str_of(&again, "stdout"), "a again\n", "{again}");
    assert_eq!(
        admission(&mut client, 11)["queued_by_template"],
        parse("{}")
    );
    server.stop();
}

#[test]
fn a_client_gone_mid_execution_does_not_harm_the_server() {
    let (server, executor) = start("gone", 2);
    let mut client = Client::hello(&server.path);
    client.send(&execute(1, "block"));
    client.send(&execute(2, "block"));
    assert!(wait_for(Duration::from_secs(10), || executor
        .started
        .load(Ordering::SeqCst)
        == 2));
    drop(client);
    executor.release();
    assert!(wait_for(Duration::from_secs(10), || executor
        .finished
        .load(Ordering::SeqCst)
        == 2));
    let mut other = Client::hello(&server.path);
    assert!(wait_for(Duration::from_secs(10), || u64_of(
        &other.call(r#"{"id":1,"type":"stats"}"#),
        "in_flight"
    ) == 0));
    let answer = other.call(&execute(2, "after"));
    assert_eq!(str_of(&answer, "stdout"), "after\n", "{answer}");
    server.stop();
}

#[test]
fn an_executor_panic_is_an_internal_error() {
    let (server, _) = start("panic", 2);
    let mut client = Client::hello(&server.path);
    assert_error(&client.call(&execute(1, "panic")), "internal", Some(1));
    assert_eq!(str_of(&client.call(&execute(2, "fine")), "status"), "ok");
    server.stop();
}

#[test]
fn connections_beyond_the_limit_are_told_busy() {
    let executor = Arc::new(ScriptedExecutor::default());
    let config = ServerConfig {
        max_connections: 1,
        ..config(2)
    };
    let server = Running::start(&scratch("conns"), executor, config);
    let mut first = Client::hello(&server.path);
    let mut second = Client::connect(&server.path);
    let busy = second.recv();
    assert_error(&busy, "busy", None);
    assert_eq!(str_of(&busy, "reason"), "connections_full");
    assert!(second.is_closed());
    assert_serves(&mut first, 1);
    drop(first);
    // The slot comes back once the first connection is gone.
    assert!(wait_for(Duration::from_secs(10), || {
        // While the slot is still taken the server may close before the hello is written.
        let mut client = Client::connect(&server.path);
        let hello = br#"{"type":"hello","protocol":1}"#;
        let mut frame = (hello.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(hello);
        client.stream.write_all(&frame).is_ok()
            && frame::read_frame(&mut client.stream)
                .is_ok_and(|answer| str_of(&answer, "type") == "hello")
    }));
}

#[test]
fn stopping_finishes_in_flight_work_and_removes_the_socket() {
    let (server, executor) = start("stop", 2);
    let path = server.path.clone();
    let mut client = Client::hello(&path);
    client.send(&execute(1, "block"));
    assert!(wait_for(Duration::from_secs(10), || executor
        .started
        .load(Ordering::SeqCst)
        == 1));
    let stopper = server.stopper.clone();
    let stopping = std::thread::spawn(move || server.stop());
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !stopping.is_finished(),
        "the server waits for the execution in flight"
    );
    assert!(
        !path.exists() && std::os::unix::net::UnixStream::connect(&path).is_err(),
        "but no longer listens"
    );
    executor.release();
    let done = client.recv();
    assert_eq!(str_of(&done, "status"), "ok", "{done}");
    stopping.join().unwrap();
    assert!(!path.exists(), "the socket file is removed");
    stopper.stop(); // stopping twice is harmless
}

#[test]
fn the_socket_file_is_replaced_only_when_stale() {
    let dir = scratch("replace");
    let path = dir.join("s.sock");
    let executor: Arc<ScriptedExecutor> = Arc::new(ScriptedExecutor::default());

    // A regular file is never replaced.
    std::fs::write(&path, b"precious").unwrap();
    let error = Server::bind(&path, executor.clone(), config(1))
        .err()
        .expect("a regular file must not be replaced");
    assert!(error.to_string().contains("not a socket"), "{error}");
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
    std::fs::remove_file(&path).unwrap();

    // A stale socket (its listener is gone) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let server = Running::start(&dir, executor.clone(), config(1));
    assert_serves(&mut Client::hello(&path), 1);

    // A live one is not.
    let error = Server::bind(&path, executor, config(1))
        .err()
        .expect("a live socket must not be replaced");
    assert_eq!(error.kind(), std::io::ErrorKind::AddrInUse, "{error}");
    assert_serves(&mut Client::hello(&path), 2);
    server.stop();
    assert!(!path.exists());
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "no temporary socket is left behind"
    );
}

#[test]
fn random_byte_streams_never_take_the_server_down() {
    let (server, _) = start("garbage", 2);
    let mut state = 0x853c_49e6_748f_ea9bu64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for round in 0..300u64 {
        let mut client = Client::connect(&server.path);
        let mut bytes = Vec::new();
        if round % 3 == 0 {
            // A valid hello first, so the garbage reaches the request parser too.
            bytes.extend_from_slice(&30u32.to_be_bytes());
            bytes.extend_from_slice(br#"{"type":"hello","protocol":1}"#);
        }
        for _ in 0..next() % 8 {
            // Frames with small random lengths and random (or JSON-ish) payloads.
            let length = next() % 40;
            bytes.extend_from_slice(&(length as u32).to_be_bytes());
            let alphabet = br#"{}[]":,0123456789-.eEtruefalsnl idtypeexecutehealth"#;
            bytes.extend((0..length).map(|_| {
                if round % 2 == 0 {
                    next() as u8
                } else {
                    alphabet[(next() % alphabet.len() as u64) as usize]
                }
            }));
        }
        bytes.extend((0..next() % 16).map(|_| next() as u8));
        // The server may close first (oversized length, wrong protocol): that is fine.
        let _ = std::io::Write::write_all(&mut client.stream, &bytes);
        drop(client);
    }
    // The server frees a dropped connection's slot when its thread notices the close, which may
    // be after the next connect: until then a hello is refused with the retryable `busy`.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut client = loop {
        let mut client = Client::connect(&server.path);
        let answer = client.call(r#"{"type":"hello","protocol":1}"#);
        if str_of(&answer, "type") == "hello" {
            break client;
        }
        assert!(
            str_of(&answer, "code") == "busy" && Instant::now() < deadline,
            "{answer}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_serves(&mut client, 1);
    assert_eq!(
        str_of(&client.call(&execute(2, "still here")), "stdout"),
        "still here\n"
    );
    server.stop();
}
