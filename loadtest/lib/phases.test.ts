// The phases of an execution as loadtest:phases reads them: spans sent by the gateway's own
// telemetry (gateway/telemetry.ts, its OTLP/HTTP exporter) to the receiver, then taken apart.
import { afterEach, describe, expect, it } from "vitest";
import { createTelemetry, inSpan, type Telemetry } from "../../gateway/telemetry.js";
import {
  executionPhases,
  type ReceivedSpan,
  type SpanReceiver,
  spansOfExport,
  startSpanReceiver,
} from "./phases.js";

/**
 * Waits at least `ms` by performance.now(), the clock spans read. A timer alone may end sooner by
 * it: it counts from the loop's cached time, which a busy machine's loop leaves behind.
 */
async function pause(ms: number): Promise<void> {
  const until = performance.now() + ms;
  while (performance.now() < until)
    await new Promise((resolve) => setTimeout(resolve, until - performance.now()));
}

/** The spans of one execution as execution-service.ts makes them, each phase `ms` long or so. */
async function traceAnExecution(
  telemetry: Telemetry,
  requestId: string,
  ms: Record<string, number>,
): Promise<void> {
  const { tracer } = telemetry;
  await tracer.startActiveSpan(
    "POST /v1/executions",
    { attributes: { "faas.invocation_id": requestId } },
    async (server) => {
      await pause(ms.before ?? 0);
      await inSpan(tracer, "auth", () => pause(ms.auth ?? 0));
      await inSpan(tracer, "billing.reserve", () => pause(ms.hold ?? 0));
      await inSpan(tracer, "runtime.execute", async () => {
        await pause(ms.runtime ?? 0);
        const at = Date.now();
        // As recordRuntimePhases lays them: from given times, end to end.
        for (const [name, length] of [
          ["queue", 1],
          ["fork", 2],
          ["exec", 3],
        ] as const)
          tracer.startSpan(name, { startTime: at }).end(at + length);
      });
      await inSpan(tracer, "billing.settle", () => pause(ms.record ?? 0));
      server.end();
    },
  );
}

describe("loadtest:phases", () => {
  let receiver: SpanReceiver | undefined;
  let telemetry: Telemetry | undefined;
  afterEach(async () => {
    await telemetry?.shutdown();
    await receiver?.close();
  });

  it("receives the gateway's exported spans and takes each execution's phases from their lengths", async () => {
    receiver = await startSpanReceiver();
    telemetry = createTelemetry({ env: { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: receiver.url } });
    await traceAnExecution(telemetry, "first", {
      before: 5,
      auth: 5,
      hold: 5,
      runtime: 30,
      record: 20,
    });
    await traceAnExecution(telemetry, "second", { runtime: 10 });
    await telemetry.shutdown();

    const phases = executionPhases(receiver.spans);
    expect(phases.map((p) => p.requestId).sort()).toEqual(["first", "second"]);
    const first = phases.find((p) => p.requestId === "first");
    // Each pause lasts at least what it asks, and longer by a little on a busy machine.
    expect(first?.auth).toBeGreaterThanOrEqual(4.5);
    expect(first?.record).toBeGreaterThanOrEqual(19.5);
    expect(first?.runtime).toBeGreaterThanOrEqual(29.5);
    expect(first?.runtime).toBeLessThan(first?.server ?? 0);
    expect(first?.vm).toBeCloseTo(6, 3);
    // The five before auth are in the rest, which is what the server span holds beyond the four phases.
    expect(first?.rest).toBeGreaterThanOrEqual(4.5);
    const sum =
      (first?.auth ?? 0) +
      (first?.hold ?? 0) +
      (first?.runtime ?? 0) +
      (first?.record ?? 0) +
      (first?.rest ?? 0);
    expect(sum).toBeCloseTo(first?.server ?? 0, 6);
  });

  it("leaves out a trace that misses a phase, and anything in an export that is not a span", () => {
    const span = (name: string, traceId = "t1"): ReceivedSpan => ({
      traceId,
      name,
      startNs: 0n,
      endNs: 1_000_000n,
      attributes: {},
    });
    const names = [
      "POST /v1/executions",
      "auth",
      "billing.reserve",
      "runtime.execute",
      "billing.settle",
      "queue",
      "fork",
      "exec",
    ];
    expect(executionPhases(names.map((n) => span(n)))).toHaveLength(1);
    expect(
      executionPhases(names.filter((n) => n !== "billing.settle").map((n) => span(n))),
    ).toEqual([]);

    const exported = {
      resourceSpans: [
        {
          scopeSpans: [
            {
              spans: [
                {
                  traceId: "t1",
                  name: "auth",
                  startTimeUnixNano: "1000",
                  endTimeUnixNano: "3500",
                  attributes: [
                    { key: "k", value: { stringValue: "v" } },
                    { key: "n", value: { intValue: 1 } },
                  ],
                },
                { traceId: "t1", name: "no times" },
                { name: "no trace", startTimeUnixNano: "1", endTimeUnixNano: "2" },
              ],
            },
          ],
        },
      ],
    };
    expect(spansOfExport(exported)).toEqual([
      { traceId: "t1", name: "auth", startNs: 1000n, endNs: 3500n, attributes: { k: "v" } },
    ]);
    expect(spansOfExport({ resourceSpans: "nope" })).toEqual([]);
    expect(spansOfExport(null)).toEqual([]);
  });
});
