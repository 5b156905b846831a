// POST /v1/executions as a Server-Sent Events stream (Accept: text/event-stream, or
// "stream": true): `started` once the execution is reserved and handed to the runtime, then
// `output` events as the program writes, then `execution` with exactly the body the plain call
// answers (or `error` with a problem body if the runtime failed mid-run). A refusal before the
// start (credentials, credits, limits, validation) is the plain problem+json answer instead.
//
// The execution does not depend on the stream: a client that goes away stops nothing, the run
// ends and is settled (billed for what ran) as if it had waited.
import type { Context } from "hono";
import { streamSSE } from "hono/streaming";
import type { OutputChunk } from "../runtime/execution-runtime.js";
import type { AppEnv, GatewayContext } from "./context.js";
import type { ExecutionInput, ExecutionOutcome } from "./execution-service.js";
import { ProblemError } from "./problems.js";
import { executionJson } from "./routes/openapi-helpers.js";

export const EVENT_STREAM = "text/event-stream";

/** Whether the caller asked for the streamed answer. */
export function wantsStream(
  accept: string | undefined,
  body: { stream?: boolean | undefined },
): boolean {
  return (
    body.stream === true ||
    (accept?.split(",").some((type) => type.trim().split(";")[0]?.trim() === EVENT_STREAM) ?? false)
  );
}

type StreamEvent =
  | { event: "output"; chunk: OutputChunk }
  | { event: "execution"; body: unknown }
  | { event: "error"; body: unknown };

/** Events in arrival order for the one reader that writes them out. Bounded by the output cap. */
class EventQueue {
  private readonly events: StreamEvent[] = [];
  private wake: (() => void) | undefined;

  push(event: StreamEvent): void {
    this.events.push(event);
    this.wake?.();
  }

  async next(): Promise<StreamEvent> {
    for (;;) {
      const event = this.events.shift();
      if (event !== undefined) return event;
      await new Promise<void>((resolve) => {
        this.wake = resolve;
      });
      this.wake = undefined;
    }
  }
}

export async function streamExecution(
  c: Context<AppEnv>,
  ctx: GatewayContext,
  input: ExecutionInput,
  idempotencyKey: string | null,
): Promise<Response> {
  const queue = new EventQueue();
  let started: ((executionId: string) => void) | undefined;
  const start = new Promise<string>((resolve) => {
    started = resolve;
  });
  const run = ctx.executions.execute(c.get("principal"), input, idempotencyKey, {
    onStart: (executionId) => started?.(executionId),
    onOutput: (chunk) => queue.push({ event: "output", chunk }),
  });
  const settled = run.then(
    (outcome: ExecutionOutcome) => {
      queue.push({
        event: "execution",
        body: executionJson(outcome.record, ctx.config.pricing.unitName, outcome.output),
      });
      return outcome;
    },
    (error: unknown) => {
      const problem =
        error instanceof ProblemError
          ? error
          : new ProblemError("internal-error", "the gateway failed to handle this request");
      if (problem.slug === "internal-error") console.error("streamed execution failed", error);
      queue.push({ event: "error", body: problem.body(c.req.path) });
      throw error;
    },
  );
  // Once started, a failure is the stream's `error` event.
  settled.catch(() => {});
  // Refused before it started: this rejects, and the app answers with the problem. A replayed
  // Idempotency-Key never starts: it settles at once with the first request's record.
  const first = await Promise.race([
    start.then((id) => ({ id, replayed: false })),
    settled.then((o) => ({ id: o.record.id, replayed: o.replayed })),
  ]);
  if (first.replayed) c.header("idempotent-replayed", "true");

  return streamSSE(c, async (stream) => {
    await stream.writeSSE({ event: "started", data: JSON.stringify({ id: first.id }) });
    for (;;) {
      const event = await queue.next();
      if (stream.aborted) return;
      if (event.event === "output") {
        await stream.writeSSE({ event: "output", data: JSON.stringify(event.chunk) });
      } else {
        await stream.writeSSE({ event: event.event, data: JSON.stringify(event.body) });
        return;
      }
    }
  });
}
