//! The daemon's server with the real production executor (`AgentExecutor`: the Python
//! template's real image and in-VM agent, booted fresh per request) over a real Unix socket, on
//! the test CPU (`common::test_cpu`: KVM in the KVM tier). What these tests check is the
//! daemon's side: concurrency, ids, and the mapping of every kind of run outcome to the
//! `execution` response.

mod common;
mod daemon_support;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use daemon_support::{
    config, repetitions, scaled, scaled_ms, scratch, str_of, templates_dir, time_scale, u64_of,
    Client, Running,
};
use sandfork_vmm::daemon::agent_executor::AgentExecutor;
use sandfork_vmm::daemon::executor::ExecutionLimits;
use sandfork_vmm::daemon::request::LimitPolicy;
use sandfork_vmm::daemon::server::ServerConfig;
use sandfork_vmm::daemon::templates;
use serde_json::Value;

fn start(tag: &str, config: ServerConfig) -> Running {
    let templates = templates::load(templates_dir()).unwrap_or_else(|e| panic!("{e}"));
    let executor = AgentExecutor::new(templates, Box::new(common::test_cpu), None)
        .booting_within(daemon_support::scaled(sandfork_vmm::vm::AGENT_BOOT_TIMEOUT));
    Running::start(&scratch(tag), Arc::new(executor), config)
}

fn execute(id: u64, code: &str, extra: &str) -> String {
    format!(
        r#"{{"id":{id},"type":"execute","template":"python","code":{}{}{extra}}}"#,
        Value::from(code),
        if extra.is_empty() { "" } else { "," }
    )
}

#[test]
fn one_execution_maps_to_the_protocol_response() {
    let server = start("pt-one", config(2));
    let mut client = Client::hello(&server.path);
    let started = Instant::now();
    let answer = client.call(&execute(1, "print(6*7)", ""));
    eprintln!("one execution: {:?}: {answer}", started.elapsed());
    assert_eq!(
        (
            str_of(&answer, "type"),
            u64_of(&answer, "id"),
            str_of(&answer, "status")
        ),
        ("execution", 1, "ok"),
        "{answer}"
    );
    assert_eq!(
        (
            answer.get("exit_code"),
            str_of(&answer, "stdout"),
            str_of(&answer, "stderr")
        ),
        (Some(&Value::from(0i64)), "42\n", ""),
        "{answer}"
    );
    assert_eq!(
        (answer.get("truncated"), answer.get("fault")),
        (Some(&Value::Bool(false)), Some(&Value::Null))
    );
    let limits = format!(
        r#"{{"timeout_ms":{},"memory_mib":256,"output_bytes":1048576,"processes":64}}"#,
        scaled_ms(10_000)
    );
    assert_eq!(answer.get("limits").map(Value::to_string), Some(limits));
    let timings = answer.get("timings").unwrap();
    let usage = answer.get("usage").unwrap();
    assert!(
        u64_of(timings, "fork_us") > 0 && u64_of(timings, "exec_us") > 0,
        "{answer}"
    );
    assert!(
        u64_of(timings, "total_us") >= u64_of(timings, "fork_us") + u64_of(timings, "exec_us"),
        "{answer}"
    );
    // The request's own counters: a handful of calls after the hand-off, not the boot's hundreds.
    assert!(
        (1..100).contains(&u64_of(usage, "syscalls")) && (1..100).contains(&u64_of(usage, "exits")),
        "{answer}"
    );
    assert!(u64_of(usage, "peak_memory_bytes") > 1 << 20, "{answer}");
    assert_eq!(u64_of(usage, "pages_copied"), 0);
    server.stop();
}

/// Every kind of outcome, run concurrently on one connection, each answered under its own id.
#[test]
fn outcomes_map_to_statuses_concurrently_on_one_connection() {
    let server = start("pt-outcomes", config(8));
    let mut client = Client::hello(&server.path);
    let cases: Vec<(String, &str)> = vec![
        (execute(1, "import sys; print('partial'); sys.exit(3)", ""), "error"),
        (execute(2, "raise ValueError('boom')", ""), "error"),
        (execute(3, "while True: pass", r#""limits":{"timeout_ms":300}"#), "timeout"),
        (execute(4, "print('x' * 5000)", r#""limits":{"output_bytes":100}"#), "output_limit"),
        (execute(5, "import ctypes; ctypes.string_at(0)", ""), "crashed"),
        (execute(6, "import sys; sys.stdout.buffer.write(b'ok \\xff\\n')", ""), "ok"),
        (
            execute(
                7,
                "import os, sys; print(sys.argv, os.environ['GREETING'], input(), open('data/in.csv').read().split(), open('blob', 'rb').read())",
                r#""argv":["prog.py","--n","3"],"env":{"GREETING":"hi"},"stdin":"typed\n","files":[{"path":"data/in.csv","content":"a,b\n1,2\n"},{"path":"blob","content":"AP8=","encoding":"base64"}]"#,
            ),
            "ok",
        ),
        // A memory limit below what the agent needs is raised to that minimum, which boots it.
        (execute(8, "print(1)", r#""limits":{"timeout_ms":99999999,"memory_mib":16}"#), "ok"),
    ];
    for (request, _) in &cases {
        client.send(request);
    }
    let mut answers: Vec<Value> = (0..cases.len()).map(|_| client.recv()).collect();
    answers.sort_by_key(|a| u64_of(a, "id"));
    for (answer, (_, status)) in answers.iter().zip(&cases) {
        assert_eq!(str_of(answer, "status"), *status, "{answer}");
        let exit_code = answer.get("exit_code").unwrap();
        assert_eq!(
            exit_code.is_null(),
            !matches!(*status, "ok" | "error"),
            "{answer}"
        );
        assert_eq!(
            answer.get("fault").unwrap().is_null(),
            *status != "crashed",
            "{answer}"
        );
        assert_eq!(
            answer.get("truncated"),
            Some(&Value::Bool(*status == "output_limit")),
            "{answer}"
        );
    }
    let [exited, raised, timed_out, capped, crashed, binary, inputs, clamped] = &answers[..] else {
        unreachable!()
    };
    assert_eq!(
        (exited.get("exit_code"), str_of(exited, "stdout")),
        (Some(&Value::from(3i64)), "partial\n")
    );
    assert_eq!(raised.get("exit_code"), Some(&Value::from(1i64)));
    let traceback = str_of(raised, "stderr");
    assert!(
        traceback.starts_with("Traceback (most recent call last):")
            && traceback.ends_with("ValueError: boom\n"),
        "{traceback}"
    );
    assert!(
        u64_of(timed_out.get("timings").unwrap(), "exec_us") >= 300_000,
        "{timed_out}"
    );
    assert_eq!(
        str_of(capped, "stdout").len() + str_of(capped, "stderr").len(),
        100,
        "{capped}"
    );
    let fault = crashed.get("fault").unwrap();
    assert_eq!(
        (
            u64_of(fault, "vector"),
            str_of(fault, "name"),
            fault.get("address")
        ),
        (
            14,
            "segmentation fault (page fault)",
            Some(&Value::from(0u64))
        ),
        "{crashed}"
    );
    assert!(u64_of(fault, "rip") > 0);
    assert_eq!(
        str_of(binary, "stdout"),
        "ok \u{fffd}\n",
        "invalid UTF-8 is replaced"
    );
    assert_eq!(
        str_of(inputs, "stdout"),
        "['prog.py', '--n', '3'] hi typed ['a,b', '1,2'] b'\\x00\\xff'\n",
        "{inputs}"
    );
    let limits = format!(
        r#"{{"timeout_ms":{},"memory_mib":64,"output_bytes":1048576,"processes":64}}"#,
        scaled_ms(10_000)
    );
    assert_eq!(
        clamped.get("limits").map(Value::to_string),
        Some(limits),
        "clamped into [minimum, maximum]"
    );
    server.stop();
}

/// `limits.processes` reaches a VM whose agent is booted for the request: the program forks
/// until refused, and prints how many children it made. (A booted agent holds all of its
/// memory, and every copy counts against the tree's memory limit: 1 GiB leaves room for three.)
#[test]
fn the_process_limit_reaches_a_booted_agent() {
    let roomy = ExecutionLimits {
        memory_mib: 1024,
        ..daemon_support::limits()
    };
    let server = start(
        "pt-processes",
        ServerConfig {
            limits: LimitPolicy::new(roomy, roomy),
            ..config(2)
        },
    );
    let mut client = Client::hello(&server.path);
    let answer = client.call(&execute(
        1,
        common::FORK_UNTIL_REFUSED,
        r#""limits":{"processes":3,"memory_mib":1024}"#,
    ));
    assert_eq!(
        (str_of(&answer, "status"), str_of(&answer, "stdout")),
        ("ok", "2 EAGAIN\n"),
        "{answer}"
    );
    assert_eq!(answer["limits"]["processes"], Value::from(3), "{answer}");
    assert_eq!(
        u64_of(answer.get("usage").unwrap(), "processes_created"),
        2,
        "{answer}"
    );
    server.stop();
}

/// 200 executions (16 on the QEMU path: `repetitions`; each boots the agent) sent at once over 8 connections, each
/// `print(i*i)`: every one is answered once, under its own id, with its own output. The server
/// runs 4 at a time (2 per core here; on a slow path one per core, since each run boots the agent
/// and a boot has the VMM's fixed `vm::AGENT_BOOT_TIMEOUT`) and queues the rest. Prints the wall
/// time.
#[test]
fn a_burst_of_concurrent_executions() {
    let total = repetitions(200, 16);
    const CONNECTIONS: u64 = 8;
    let cores = thread::available_parallelism().map_or(2, |n| n.get());
    let running = if time_scale() > 1 { cores } else { 4 };
    let server = start(
        "pt-burst",
        ServerConfig {
            max_queued: total as usize,
            max_queued_per_template: total as usize,
            max_queued_per_key: total as usize,
            ..config(running)
        },
    );
    let started = Instant::now();
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|connection| {
            let path = server.path.clone();
            thread::spawn(move || {
                let mut client = Client::hello(&path);
                // A connection's first answer may come after most of the burst's boots: minutes
                // on a busy host.
                client
                    .stream
                    .set_read_timeout(Some(scaled(Duration::from_secs(900))))
                    .unwrap();
                let ids: Vec<u64> = (0..total)
                    .filter(|i| i % CONNECTIONS == connection)
                    .collect();
                for &i in &ids {
                    client.send(&execute(i, &format!("print({i}*{i})"), ""));
                }
                let mut answered = Vec::new();
                let mut timings = Vec::new();
                for _ in &ids {
                    let answer = client.recv();
                    let id = u64_of(&answer, "id");
                    assert_eq!(
                        (str_of(&answer, "status"), str_of(&answer, "stdout")),
                        ("ok", format!("{}\n", id * id).as_str()),
                        "{answer}"
                    );
                    answered.push(id);
                    let t = answer.get("timings").unwrap();
                    timings.push([
                        u64_of(t, "queue_us"),
                        u64_of(t, "fork_us"),
                        u64_of(t, "exec_us"),
                    ]);
                }
                answered.sort();
                assert_eq!(answered, ids, "each request answered exactly once");
                timings
            })
        })
        .collect();
    let timings: Vec<[u64; 3]> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("a client thread failed"))
        .collect();
    let elapsed = started.elapsed();
    let p50_ms = |column: usize| {
        let mut values: Vec<u64> = timings.iter().map(|t| t[column]).collect();
        values.sort();
        values[values.len() / 2] as f64 / 1000.0
    };
    eprintln!(
        "{total} concurrent executions over {CONNECTIONS} connections, {running} running at a time, {} CPU ({} build): {:.2} s wall, {:.1} ms per execution; p50 queue wait {:.0} ms, boot (fork_us) {:.1} ms, run (exec_us) {:.1} ms",
        common::cpu_name(),
        if cfg!(debug_assertions) { "debug" } else { "release" },
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1000.0 / total as f64,
        p50_ms(0),
        p50_ms(1),
        p50_ms(2),
    );
    let mut client = Client::hello(&server.path);
    let stats = client.call(r#"{"id":1,"type":"stats"}"#);
    assert_eq!(
        (u64_of(&stats, "executions"), u64_of(&stats, "in_flight")),
        (total, 0),
        "{stats}"
    );
    server.stop();
}
