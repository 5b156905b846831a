// OTLP/HTTP export when configured: spans and metrics reach a collector (a loopback HTTP server).
import { createServer, type IncomingMessage } from "node:http";
import type { AddressInfo } from "node:net";
import { InMemorySpanExporter } from "@opentelemetry/sdk-trace-base";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTelemetry, otlpEndpoint } from "./telemetry.js";

describe("OTLP export", () => {
  const received: { path: string; bytes: number; type: string }[] = [];
  const collector = createServer((req: IncomingMessage, res) => {
    let bytes = 0;
    req.on("data", (chunk: Buffer) => (bytes += chunk.length));
    req.on("end", () => {
      received.push({ path: req.url ?? "", bytes, type: req.headers["content-type"] ?? "" });
      res.writeHead(200, { "content-type": "application/json" }).end("{}");
    });
  });
  let base = "";
  beforeAll(async () => {
    await new Promise<void>((resolve) => collector.listen(0, "127.0.0.1", resolve));
    base = `http://127.0.0.1:${(collector.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((resolve) => collector.close(() => resolve())));

  it("derives per-signal endpoints from OTEL_EXPORTER_OTLP_ENDPOINT, specific variables first", () => {
    expect(otlpEndpoint({}, "traces")).toBeUndefined();
    expect(otlpEndpoint({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318/" }, "traces")).toBe(
      "http://c:4318/v1/traces",
    );
    expect(
      otlpEndpoint(
        {
          OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318",
          OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: "http://m/x",
        },
        "metrics",
      ),
    ).toBe("http://m/x");
  });

  it("pushes spans and metrics to the collector", async () => {
    const telemetry = createTelemetry({ env: { OTEL_EXPORTER_OTLP_ENDPOINT: base } });
    telemetry.tracer.startSpan("exported").end();
    telemetry.instruments.executions.add(1, { template: "python", status: "completed" });
    await telemetry.flush();
    await telemetry.shutdown();
    const traces = received.find((r) => r.path === "/v1/traces");
    const metrics = received.find((r) => r.path === "/v1/metrics");
    expect(traces?.bytes).toBeGreaterThan(0);
    expect(metrics?.bytes).toBeGreaterThan(0);
  });

  it("exports nothing when not configured", async () => {
    const before = received.length;
    const telemetry = createTelemetry({ env: {} });
    const span = telemetry.tracer.startSpan("local only");
    // Nothing would receive it, so nothing is recorded.
    expect(span.isRecording()).toBe(false);
    span.end();
    const exported = createTelemetry({ env: {}, spanExporter: new InMemorySpanExporter() });
    expect(exported.tracer.startSpan("exported").isRecording()).toBe(true);
    await exported.shutdown();
    await telemetry.flush();
    await telemetry.shutdown();
    expect(received.length).toBe(before);
  });
});

describe("metrics at /metrics", () => {
  it("tallies counts per attribute set and reads them, with the requests in flight, when collected", async () => {
    const telemetry = createTelemetry({ env: {} });
    const { executions, billedUnits, activeRequests } = telemetry.instruments;
    executions.add(1, { template: "python", status: "completed" });
    executions.add(2, { template: "python", status: "completed" });
    executions.add(1, { template: "python", status: "timed_out" });
    billedUnits.add(7, { template: "node" });
    activeRequests.set("POST", 3);
    const text = await telemetry.prometheusText();
    expect(text).toMatch(
      /sandfork_executions_total\{[^}]*template="python",status="completed"[^}]*\} 3\b/,
    );
    expect(text).toMatch(
      /sandfork_executions_total\{[^}]*template="python",status="timed_out"[^}]*\} 1\b/,
    );
    expect(text).toMatch(/sandfork_billing_units_total\{[^}]*template="node"[^}]*\} 7\b/);
    expect(text).toMatch(/http_server_active_requests\{[^}]*http_request_method="POST"[^}]*\} 3\b/);
    executions.add(1, { template: "python", status: "completed" });
    expect(await telemetry.prometheusText()).toMatch(
      /sandfork_executions_total\{[^}]*status="completed"[^}]*\} 4\b/,
    );
    await telemetry.shutdown();
  });

  it("reads the event loop's delay since the previous collection", async () => {
    const telemetry = createTelemetry({ env: {} });
    const delay = (text: string, stat: string) =>
      Number(new RegExp(`nodejs_eventloop_delay_${stat}\\{[^}]*\\} (\\S+)`).exec(text)?.[1]);
    await telemetry.prometheusText();
    // The loop held for 150 ms: a callback due meanwhile waited about that long.
    await new Promise((resolve) => setTimeout(resolve, 5));
    const until = performance.now() + 150;
    while (performance.now() < until);
    await new Promise((resolve) => setTimeout(resolve, 5));
    const blocked = await telemetry.prometheusText();
    expect(delay(blocked, "max")).toBeGreaterThanOrEqual(0.1);
    expect(delay(blocked, "p50")).toBeLessThanOrEqual(delay(blocked, "max"));
    // Collected: the next reading starts afresh, without the block.
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(delay(await telemetry.prometheusText(), "max")).toBeLessThan(delay(blocked, "max"));
    await telemetry.shutdown();
  });
});
