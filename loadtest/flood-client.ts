// Child process of `npm run loadtest -- --overload` (lib/overload.ts): the measuring client, in a
// process and a session of its own so that it can run at the gateway's priority and so that the
// load runner's own work (metrics, the CPU hog's bookkeeping) never waits on its event loop. It
// reads one JSON FloodPhase from its first argument and, once its starter has set its priority,
// a line on stdin; then it sends POST requests at that concurrency for
// that long (each client its next request as soon as it has an answer, or, with
// `retry_after: "wait"`, after the Retry-After of a shed answer), classifies every answer, and
// prints one JSON FloodResult line.
import { monitorEventLoopDelay } from "node:perf_hooks";
import { setTimeout as pauseFor } from "node:timers/promises";
import { type FloodPhase, type FloodResult, floodAnswerKind } from "./lib/flood.js";
import { keepAliveClient } from "./lib/http-client.js";

const phase = JSON.parse(process.argv[2] ?? "") as FloodPhase;
const client = keepAliveClient(phase.concurrency);
const result: FloodResult = {
  ran_ms: [],
  shed_ms: [],
  shed: { "429": 0, "503": 0 },
  wrong: 0,
  wrong_examples: [],
  seconds: 0,
  loop_delay_p99_ms: 0,
};
const wrong = (example: string) => {
  result.wrong++;
  if (result.wrong_examples.length < 5) result.wrong_examples.push(example);
};

await new Promise((resolve) => process.stdin.once("data", resolve));
const loopDelay = monitorEventLoopDelay({ resolution: 1 });
loopDelay.enable();
const started = performance.now();
const deadline = started + phase.seconds * 1000;
let sent = 0;
// Started one after another over the first second, as independent callers arrive, not all in
// the same millisecond: a burst of calls that came together is answered one after the other.
const worker = async (index: number) => {
  await pauseFor((index * 1000) / phase.concurrency);
  while (performance.now() < deadline) {
    const kind = phase.kinds[sent++ % phase.kinds.length];
    if (kind === undefined) throw new Error("a flood phase needs at least one kind of call");
    const t0 = performance.now();
    let answer: Awaited<ReturnType<typeof client.call>>;
    try {
      answer = await client.call("POST", phase.url, phase.headers, kind.body);
    } catch (error) {
      wrong(`no answer: ${String(error)}`);
      continue;
    }
    const ms = performance.now() - t0;
    const classified = floodAnswerKind(kind, answer);
    if (classified === "true") result.ran_ms.push(ms);
    else if (classified === "shed") {
      result.shed_ms.push(ms);
      result.shed[answer.status === 429 ? "429" : "503"]++;
      if (phase.retry_after === "wait") {
        const retryAt = performance.now() + Number(answer.retryAfter) * 1000;
        if (retryAt >= deadline) return;
        await pauseFor(retryAt - performance.now());
      }
    } else wrong(`${answer.status} ${answer.body.slice(0, 300)}`);
  }
};
await Promise.all(Array.from({ length: phase.concurrency }, (_, i) => worker(i)));
loopDelay.disable();
result.seconds = (performance.now() - started) / 1000;
result.loop_delay_p99_ms = loopDelay.percentile(99) / 1e6;
client.destroy();
process.stdout.write(`${JSON.stringify(result)}\n`);
