//! The daemon's warm pool end to end: the production executor (`AgentExecutor`) with the
//! Python template's real image, agent and snapshot, over a real Unix socket, on the test CPU
//! (`common::test_cpu` and `common::restore_cpu`: KVM with copy-on-write forks in the KVM tier,
//! as the daemon runs; the ptrace CPU copies the template's memory instead). Timings printed
//! here are figures of the path the test ran on (a QEMU guest's are not product figures).

mod common;
mod daemon_support;
mod pool_support;

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use daemon_support::{config, repetitions, scaled, str_of, u64_of, Client, Running};
use pool_support::{start, start_restoring};
use sandfork_vmm::cpu::{CpuExit, CpuSnapshot, GuestCpu};
use sandfork_vmm::daemon::server::ServerConfig;
use sandfork_vmm::memory::{GuestMemory, PageSet};
use sandfork_vmm::snapshot::ForkMemory;
use serde_json::Value;

fn execute(id: u64, code: &str) -> String {
    format!(
        r#"{{"id":{id},"type":"execute","template":"python","code":{}}}"#,
        Value::from(code)
    )
}

fn stats(client: &mut Client) -> Value {
    client.call(r#"{"id":0,"type":"stats"}"#)
}

/// The python template's pool counters from `stats`.
fn pool_stats(client: &mut Client) -> Value {
    let stats = stats(client);
    match stats
        .get("pools")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
    {
        Some([pool]) if str_of(pool, "template") == "python" => pool.clone(),
        _ => panic!("expected one pool, for python: {stats}"),
    }
}

/// Polls `stats` until every pooled VM is ready again (the refill runs in the background).
fn wait_for_refill(client: &mut Client) -> Value {
    let deadline = Instant::now() + scaled(Duration::from_secs(60));
    loop {
        let pool = pool_stats(client);
        if u64_of(&pool, "ready") == u64_of(&pool, "target") {
            return pool;
        }
        assert!(Instant::now() < deadline, "the pool did not refill: {pool}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// One worker serves two requests in a row: on KVM on one VM, reset to the template between
/// them (a copy-on-write fork); on the ptrace CPU each on its own VM (a full copy, never
/// reset). Either way a file the first writes to /tmp is absent for the second, and each draws
/// its own randomness. The pool is ready again after each (ready == target), counts every VM
/// it created and reset, and a request that finds a ready VM waits for no VM creation
/// (`fork_us` far below what creating one costs).
#[test]
fn a_pooled_daemon_serves_each_request_on_a_fresh_or_reset_vm() {
    let server = start("pool-fresh", 1, config(2));
    let mut client = Client::hello(&server.path);
    let first_ready = wait_for_refill(&mut client);
    assert_eq!(
        (
            u64_of(&first_ready, "target"),
            u64_of(&first_ready, "forks"),
            u64_of(&first_ready, "served")
        ),
        (1, 1, 0),
        "{first_ready}"
    );

    let code = "import os, random\nprint(os.path.exists('/tmp/mark'), random.getrandbits(64))\nopen('/tmp/mark', 'w').write('x')";
    let mut seen = Vec::new();
    for id in 1..=2 {
        let answer = client.call(&execute(id, code));
        assert_eq!(
            (
                str_of(&answer, "type"),
                u64_of(&answer, "id"),
                str_of(&answer, "status")
            ),
            ("execution", id, "ok"),
            "{answer}"
        );
        let stdout = str_of(&answer, "stdout").to_owned();
        assert!(
            stdout.starts_with("False "),
            "the second request must not see the first one's /tmp/mark: {answer}"
        );
        seen.push(stdout);
        let timings = answer.get("timings").unwrap();
        let pool = wait_for_refill(&mut client);
        eprintln!("pooled request {id}: timings {}, pool {pool}", timings);
        // A full copy (ptrace) holds every stored page; a copy-on-write fork copies the pages
        // written (beyond those its warm-up copied), and a reset VM keeps its copies warm (the
        // second request copies few or none).
        let resets = common::fork_memory() == ForkMemory::CopyOnWrite;
        let origin = answer
            .get("vm")
            .and_then(|vm| vm.get("origin"))
            .and_then(Value::as_str);
        assert_eq!(
            origin,
            Some(if resets && id == 2 { "reset" } else { "fresh" }),
            "{answer}"
        );
        let least_copied = match (resets, id) {
            (false, _) => 1000,
            (true, 1) => 1,
            (true, _) => 0,
        };
        assert!(
            u64_of(timings, "exec_us") > 0
                && u64_of(answer.get("usage").unwrap(), "pages_copied") >= least_copied,
            "{answer}"
        );
    }
    assert_ne!(seen[0], seen[1], "two VMs drew the same randomness");
    // No request waited for a fork: one VM was made before them, and after each either it was
    // reset (copy-on-write) or the next was made ahead (a full copy).
    let pool = pool_stats(&mut client);
    let (forks, resets) = if common::fork_memory() == ForkMemory::CopyOnWrite {
        (1, 2)
    } else {
        (3, 0)
    };
    assert_eq!(
        (
            u64_of(&pool, "ready"),
            u64_of(&pool, "target"),
            u64_of(&pool, "forks"),
            u64_of(&pool, "resets"),
            u64_of(&pool, "served")
        ),
        (1, 1, forks, resets, 2),
        "{pool}"
    );
    server.stop();
}

/// Threaded requests on one pooled VM, reset between them: each sees only the main thread at
/// its start and ends with its threads joined; `usage` counts the threads it started and the
/// switches between them, and `stats` sums every execution's system calls and switches.
#[test]
fn threaded_requests_on_a_reset_vm_are_counted_in_usage_and_stats() {
    let server = start("pool-threads", 1, config(2));
    let mut client = Client::hello(&server.path);
    wait_for_refill(&mut client);
    let code = "import threading, queue\nq = queue.Queue()\nprint(threading.active_count(), end=' ')\nts = [threading.Thread(target=q.put, args=(i,)) for i in range(3)]\nfor t in ts: t.start()\nfor t in ts: t.join()\nprint(sorted(q.get() for _ in ts), threading.active_count())";
    let (mut syscalls, mut switches) = (0, 0);
    for id in 1..=2 {
        let answer = client.call(&execute(id, code));
        assert_eq!(
            (str_of(&answer, "status"), str_of(&answer, "stdout")),
            ("ok", "1 [0, 1, 2] 1\n"),
            "{answer}"
        );
        let usage = answer.get("usage").unwrap();
        assert_eq!(u64_of(usage, "threads_created"), 3, "{answer}");
        assert!(
            u64_of(usage, "thread_switches") >= 3,
            "each thread ran at least once: {answer}"
        );
        syscalls += u64_of(usage, "syscalls");
        switches += u64_of(usage, "thread_switches");
        wait_for_refill(&mut client);
    }
    let stats = stats(&mut client);
    assert_eq!(
        (
            u64_of(&stats, "syscalls"),
            u64_of(&stats, "thread_switches")
        ),
        (syscalls, switches),
        "{stats}"
    );
    server.stop();
}

/// `limits.processes` reaches pooled VMs (a fresh one, then the same one reset) and VMs
/// restored for their request: the program forks until refused and prints how many children
/// it made; a reset VM keeps nothing of the earlier request's limit.
#[test]
fn the_process_limit_reaches_pooled_and_restored_vms() {
    for pool_size in [1, 0] {
        let server = start(&format!("pool-processes-{pool_size}"), pool_size, config(2));
        let mut client = Client::hello(&server.path);
        for (id, limit) in [(1, 3), (2, 5)] {
            if pool_size > 0 {
                wait_for_refill(&mut client);
            }
            let answer = client.call(&format!(
                r#"{{"id":{id},"type":"execute","template":"python","code":{},"limits":{{"processes":{limit}}}}}"#,
                Value::from(common::FORK_UNTIL_REFUSED)
            ));
            assert_eq!(
                (str_of(&answer, "status"), str_of(&answer, "stdout")),
                ("ok", format!("{} EAGAIN\n", limit - 1).as_str()),
                "pool of {pool_size}: {answer}"
            );
            assert_eq!(
                u64_of(answer.get("usage").unwrap(), "processes_created"),
                limit - 1,
                "{answer}"
            );
        }
        server.stop();
    }
}

/// Pool size 0: no pool in `stats`, and each request gets a VM restored for it (the wait for
/// the restore is its `fork_us`).
#[test]
fn pool_size_zero_restores_a_vm_per_request() {
    let server = start("pool-none", 0, config(2));
    let mut client = Client::hello(&server.path);
    let answer = client.call(&execute(1, "print(6*7)"));
    assert_eq!(
        (str_of(&answer, "status"), str_of(&answer, "stdout")),
        ("ok", "42\n"),
        "{answer}"
    );
    assert!(
        u64_of(answer.get("timings").unwrap(), "fork_us") > 0,
        "{answer}"
    );
    assert_eq!(
        stats(&mut client)
            .get("pools")
            .map(Value::to_string)
            .as_deref(),
        Some("[]")
    );
    server.stop();
}

/// `total` executions sent at once over 8 connections, `print(i*i)`, 4 running at a time:
/// each answered once with its own output. Returns each one's take-to-first-instruction
/// (`queue_us + fork_us`), sorted, and the wall time.
fn concurrent_executions(server: &Running, total: u64) -> (Vec<u64>, Duration) {
    const CONNECTIONS: u64 = 8;
    let started = Instant::now();
    let clients: Vec<_> = (0..CONNECTIONS)
        .map(|connection| {
            let path = server.path.clone();
            thread::spawn(move || {
                let mut client = Client::hello(&path);
                let ids: Vec<u64> = (0..total)
                    .filter(|i| i % CONNECTIONS == connection)
                    .collect();
                for &i in &ids {
                    client.send(&execute(i, &format!("print({i}*{i})")));
                }
                let mut answered = Vec::new();
                let mut takes = Vec::new();
                for _ in &ids {
                    let answer = client.recv();
                    let id = u64_of(&answer, "id");
                    assert_eq!(
                        (str_of(&answer, "status"), str_of(&answer, "stdout")),
                        ("ok", format!("{}\n", id * id).as_str()),
                        "{answer}"
                    );
                    answered.push(id);
                    let timings = answer.get("timings").unwrap();
                    takes.push(u64_of(timings, "queue_us") + u64_of(timings, "fork_us"));
                }
                answered.sort();
                assert_eq!(answered, ids, "each request answered exactly once");
                takes
            })
        })
        .collect();
    let mut takes: Vec<u64> = clients
        .into_iter()
        .flat_map(|c| c.join().expect("a client thread failed"))
        .collect();
    takes.sort();
    (takes, started.elapsed())
}

fn percentile_ms(sorted: &[u64], p: usize) -> f64 {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)] as f64 / 1000.0
}

/// Take-to-first-instruction (`queue_us + fork_us`) at light load: `count` requests one after
/// another, each sent once the pool (if any) has refilled. Sorted.
fn sequential_takes(server: &Running, count: u64, pooled: bool) -> Vec<u64> {
    let mut client = Client::hello(&server.path);
    let mut takes: Vec<u64> = (0..count)
        .map(|id| {
            if pooled {
                wait_for_refill(&mut client);
            }
            let answer = client.call(&execute(id, "print(1)"));
            assert_eq!(
                (str_of(&answer, "status"), str_of(&answer, "stdout")),
                ("ok", "1\n"),
                "{answer}"
            );
            let timings = answer.get("timings").unwrap();
            u64_of(timings, "queue_us") + u64_of(timings, "fork_us")
        })
        .collect();
    takes.sort();
    takes
}

/// What the pool buys, printed (figures of the test CPU's path: the ptrace CPU copies memory per
/// VM, a QEMU guest runs ~13x slower; only a native /dev/kvm gives product figures):
/// take-to-first-instruction (`queue_us + fork_us`) p50/p99 of requests
/// at light load with a pool of 4 and with none (each VM restored on the request's path);
/// then 200 concurrent executions (fewer on a slow path: `repetitions`) through the socket with
/// the pool, 4 running at a time,
/// each answered once with its own output, and the pool's counters after its refill. In a
/// burst far larger than the pool, a request's wait is mostly for a worker: the restores
/// still happen, off the requests' path but on the same two cores.
#[test]
fn take_to_first_instruction_pooled_and_unpooled_and_a_burst() {
    let sequential = repetitions(30, 10);
    let total = repetitions(200, 40);
    const RUNNING: usize = 4;
    let build = format!(
        "{} CPU, {} build",
        common::cpu_name(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    let burst = ServerConfig {
        max_queued: total as usize,
        max_queued_per_template: total as usize,
        max_queued_per_key: total as usize,
        ..config(RUNNING)
    };

    let unpooled = start("pool-none-seq", 0, burst);
    let unpooled_takes = sequential_takes(&unpooled, sequential, false);
    unpooled.stop();

    let pooled = start("pool-burst", RUNNING, burst);
    let pooled_takes = sequential_takes(&pooled, sequential, true);
    for (what, takes) in [
        (format!("pool of {RUNNING}"), &pooled_takes),
        ("no pool".to_owned(), &unpooled_takes),
    ] {
        eprintln!(
            "{sequential} requests one at a time, {what} ({build}): take-to-first-instruction (queue_us + fork_us) p50 {:.2} ms, p99 {:.2} ms",
            percentile_ms(takes, 50),
            percentile_ms(takes, 99),
        );
    }
    // No assertion on these times: a shared 2-core machine makes them noisy (a pool worker's
    // wake-up can take a scheduler tick); `sandfork-vmm bench exec` is where they are read.

    let mut client = Client::hello(&pooled.path);
    let before = wait_for_refill(&mut client);
    let (takes, wall) = concurrent_executions(&pooled, total);
    let after = wait_for_refill(&mut client);
    eprintln!(
        "{total} concurrent executions, {RUNNING} running at a time, pool of {RUNNING} ({build}): {:.2} s wall; take-to-first-instruction p50 {:.1} ms, p99 {:.1} ms; pool {after}",
        wall.as_secs_f64(),
        percentile_ms(&takes, 50),
        percentile_ms(&takes, 99),
    );
    let served = |pool: &Value| u64_of(pool, "served");
    // A VM ready again is a new one or a used one reset (KVM resets; the ptrace CPU never does).
    let readied = |pool: &Value| u64_of(pool, "forks") + u64_of(pool, "resets");
    assert_eq!(
        (
            served(&after) - served(&before),
            readied(&after) - readied(&before)
        ),
        (total, total),
        "every used VM was reset or replaced: {before} then {after}"
    );
    assert_eq!(readied(&after), served(&after) + RUNNING as u64, "{after}");
    let stats = stats(&mut client);
    assert_eq!(
        (u64_of(&stats, "executions"), u64_of(&stats, "in_flight")),
        (sequential + total, 0),
        "{stats}"
    );
    pooled.stop();
}

/// A vCPU of the test CPU whose first run fails when `fail_once` is still set (then cleared):
/// the one place a warm-up can be made to fail on a healthy template.
struct FailsOnce<'m> {
    cpu: Box<dyn GuestCpu + 'm>,
    fail_once: Arc<AtomicBool>,
}

impl GuestCpu for FailsOnce<'_> {
    fn run(&mut self, deadline: Instant) -> io::Result<CpuExit> {
        if self.fail_once.swap(false, Ordering::SeqCst) {
            return Err(io::Error::other("an injected vCPU failure"));
        }
        self.cpu.run(deadline)
    }
    fn set_syscall_return(&mut self, value: u64) -> io::Result<()> {
        self.cpu.set_syscall_return(value)
    }
    fn set_fs_base(&mut self, base: u64) -> io::Result<()> {
        self.cpu.set_fs_base(base)
    }
    fn snapshot(&mut self) -> io::Result<CpuSnapshot> {
        self.cpu.snapshot()
    }
    fn map_memory(&mut self, ranges: &[(u64, u64)]) -> io::Result<()> {
        self.cpu.map_memory(ranges)
    }
    fn track_writes(&mut self) -> io::Result<bool> {
        self.cpu.track_writes()
    }
    fn take_written_pages(&mut self) -> io::Result<Option<PageSet>> {
        self.cpu.take_written_pages()
    }
    fn take_inner_exits(&mut self) -> u64 {
        self.cpu.take_inner_exits()
    }
    fn switches_threads(&self) -> bool {
        self.cpu.switches_threads()
    }
    fn load_thread(&mut self, state: &CpuSnapshot) -> io::Result<()> {
        self.cpu.load_thread(state)
    }
    fn interrupted_state(&mut self) -> io::Result<Option<CpuSnapshot>> {
        self.cpu.interrupted_state()
    }
    fn reset(&mut self, snapshot: &CpuSnapshot) -> io::Result<()> {
        self.cpu.reset(snapshot)
    }
}

/// A warm-up that fails costs the pool its warm-ups, not its service (pool.rs, serve_vm): the
/// VM is destroyed, `stats` says why (`warm_up: failed: ...`), and every request is answered
/// on VMs that were not warmed up, whose first request copies the pages it writes. On copy
/// forks (the ptrace CPU) there is no warm-up (`off`): nothing is made to fail there, and the
/// pool serves as it always does.
#[test]
fn a_failed_warm_up_leaves_the_pool_serving_unwarmed_vms() {
    let copy_on_write = common::fork_memory() == ForkMemory::CopyOnWrite;
    let fail_once = Arc::new(AtomicBool::new(copy_on_write));
    let failing = fail_once.clone();
    let server = start_restoring(
        "pool-warm-up-fails",
        1,
        config(2),
        Arc::new(
            move |mem: &GuestMemory,
                  snapshot: &CpuSnapshot|
                  -> io::Result<Box<dyn GuestCpu + '_>> {
                let cpu = common::restore_cpu(mem, snapshot)?;
                Ok(Box::new(FailsOnce {
                    cpu,
                    fail_once: failing.clone(),
                }))
            },
        ),
    );
    let mut client = Client::hello(&server.path);
    let ready = wait_for_refill(&mut client);
    assert!(
        !fail_once.load(Ordering::SeqCst),
        "the injected failure was never hit"
    );
    let warm_up = str_of(&ready, "warm_up").to_owned();
    if copy_on_write {
        assert!(
            warm_up.starts_with("failed: ") && warm_up.contains("an injected vCPU failure"),
            "{ready}"
        );
    } else {
        assert_eq!(warm_up, "off", "{ready}");
    }
    for id in 1..=3 {
        let answer = client.call(&execute(id, "print(6*7)"));
        assert_eq!(
            (str_of(&answer, "status"), str_of(&answer, "stdout")),
            ("ok", "42\n"),
            "{answer}"
        );
        // Unwarmed, a VM's first request copies every page it writes: the interpreter's, at
        // least 100 of them (a warmed VM's first request copies a handful).
        if id == 1 {
            assert!(
                u64_of(answer.get("usage").unwrap(), "pages_copied") >= 100,
                "{answer}"
            );
        }
        wait_for_refill(&mut client);
    }
    server.stop();
}
