//! Python features agents commonly use that need more than files and memory: asyncio (epoll
//! and an in-memory socketpair), the /dev device nodes, file-system statistics and mmap of a
//! file. Run with Debian's python3.11 on the ptrace development CPU, as python_ptrace.rs.

mod common;

use std::time::Duration;

use common::{describe, python_image, request, run};
use sandfork_vmm::status::RunStatus;
use sandfork_vmm::vm::RunOutcome;

fn python(code: &str) -> RunOutcome {
    run(&python_image(), &request("python3", &["-c", code]))
}

/// Runs `code` and expects exit code 0 with exactly `stdout`.
fn assert_prints(code: &str, stdout: &str) {
    let outcome = python(code);
    assert_eq!(outcome.status, RunStatus::Exited { code: 0 }, "{}", describe(&outcome));
    assert_eq!(String::from_utf8_lossy(&outcome.stdout), stdout, "{}", describe(&outcome));
}

#[test]
fn asyncio_tasks_sleep_gather_and_queue() {
    let code = r#"
import asyncio, time

async def worker(name, delay, log):
    await asyncio.sleep(delay)
    log.append(name)
    return name.upper()

async def producer(q):
    for i in range(5):
        await q.put(i)
        await asyncio.sleep(0)
    await q.put(None)

async def consumer(q):
    total = 0
    while (item := await q.get()) is not None:
        total += item
    return total

async def main():
    log = []
    start = time.monotonic()
    results = await asyncio.gather(worker('b', 0.2, log), worker('a', 0.1, log), worker('c', 0, []))
    elapsed = time.monotonic() - start
    print(results, log, 0.18 <= elapsed < 2)
    q = asyncio.Queue(maxsize=2)
    _, total = await asyncio.gather(producer(q), consumer(q))
    print('queue total', total)
    task = asyncio.create_task(worker('t', 0.05, log))
    print(await task, task.done())
    try:
        await asyncio.wait_for(asyncio.sleep(5), timeout=0.1)
    except asyncio.TimeoutError:
        print('timed out')
    return 'done'

print(asyncio.run(main()))
"#;
    let outcome = python(code);
    assert_eq!(outcome.status, RunStatus::Exited { code: 0 }, "{}", describe(&outcome));
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "['B', 'A', 'C'] ['a', 'b'] True\nqueue total 10\nT True\ntimed out\ndone\n",
        "{}",
        describe(&outcome)
    );
    // wait_for's 5 s sleep was cancelled after 0.1 s: the run did not sleep it out.
    assert!(outcome.stats.wall < Duration::from_secs(4), "the run took {:?}", outcome.stats.wall);
}

#[test]
fn asyncio_run_in_executor_fails_cleanly() {
    let code = r#"
import asyncio
async def main():
    loop = asyncio.get_running_loop()
    try:
        print(await loop.run_in_executor(None, sum, [1, 2]))
    except RuntimeError as e:
        print('RuntimeError', e)
try:
    asyncio.run(main())
except RuntimeError as e:
    print('shutting down the executor:', e)
"#;
    // No threads: the executor's worker cannot start, and asyncio.run's executor shutdown
    // (a thread in 3.11) raises the same error at the end; both are plain exceptions.
    assert_prints(code, "RuntimeError can't start new thread\nshutting down the executor: can't start new thread\n");
}
