// Where an execution's time goes inside the gateway, read off the gateway's own OpenTelemetry
// traces (gateway/telemetry.ts): a receiver for the OTLP/HTTP JSON its exporter sends, and the
// phases of each POST /v1/executions, from its server span and the spans under it: auth,
// billing.reserve (the hold), runtime.execute with the runtime's queue, fork and exec under it,
// billing.settle (the record).
import { createServer, type Server } from "node:http";

/** The parts of an OTLP span the phases need (opentelemetry-proto's JSON form). */
export interface ReceivedSpan {
  traceId: string;
  name: string;
  /** Nanoseconds since the epoch. */
  startNs: bigint;
  endNs: bigint;
  /** String attributes only: the request id is one. */
  attributes: Record<string, string>;
}

interface OtlpJsonSpan {
  traceId?: string;
  name?: string;
  startTimeUnixNano?: string | number;
  endTimeUnixNano?: string | number;
  attributes?: { key?: string; value?: { stringValue?: string } }[];
}

/** The spans of one OTLP ExportTraceServiceRequest in JSON; what is not a span is skipped. */
export function spansOfExport(body: unknown): ReceivedSpan[] {
  const out: ReceivedSpan[] = [];
  const resourceSpans = (
    body as { resourceSpans?: { scopeSpans?: { spans?: OtlpJsonSpan[] }[] }[] } | null
  )?.resourceSpans;
  for (const resource of Array.isArray(resourceSpans) ? resourceSpans : []) {
    for (const scope of resource.scopeSpans ?? []) {
      for (const span of scope.spans ?? []) {
        const { traceId, name, startTimeUnixNano, endTimeUnixNano } = span;
        if (
          typeof traceId !== "string" ||
          typeof name !== "string" ||
          startTimeUnixNano === undefined ||
          endTimeUnixNano === undefined
        )
          continue;
        const attributes: Record<string, string> = {};
        for (const a of span.attributes ?? [])
          if (a.key !== undefined && a.value?.stringValue !== undefined)
            attributes[a.key] = a.value.stringValue;
        out.push({
          traceId,
          name,
          startNs: BigInt(startTimeUnixNano),
          endNs: BigInt(endTimeUnixNano),
          attributes,
        });
      }
    }
  }
  return out;
}

/** An OTLP/HTTP trace receiver on loopback; `url` is what OTEL_EXPORTER_OTLP_TRACES_ENDPOINT takes. */
export interface SpanReceiver {
  url: string;
  spans: ReceivedSpan[];
  close(): Promise<void>;
}

export async function startSpanReceiver(): Promise<SpanReceiver> {
  const spans: ReceivedSpan[] = [];
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      try {
        spans.push(...spansOfExport(JSON.parse(Buffer.concat(chunks).toString("utf8"))));
        res.writeHead(200, { "content-type": "application/json" }).end("{}");
      } catch (error) {
        res.writeHead(400, { "content-type": "text/plain" }).end(String(error));
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  if (typeof address !== "object" || address === null)
    throw new Error("the span receiver has no port");
  return {
    url: `http://127.0.0.1:${address.port}/v1/traces`,
    spans,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

/** One execution's phases in ms, in the order they happen. */
export interface ExecutionPhases {
  /** The x-request-id it was sent with (faas.invocation_id). */
  requestId: string;
  /** The whole server span. */
  server: number;
  auth: number;
  /** Holding the worst-case cost (of the lease in memory, or reserved in the database). */
  hold: number;
  /** The runtime round trip as the gateway sees it (runtime.execute). */
  runtime: number;
  /** Of which the VM's queue, fork and exec, as the daemon measured them. */
  vm: number;
  /** Recording (and billing) it: billing.settle. */
  record: number;
  /**
   * The server span less the four above: the HTTP and request-id middleware, the body read and
   * validation, the template and limits, the answer's rendering.
   */
  rest: number;
}

/**
 * The phases of every POST /v1/executions whose trace holds all its spans. Only lengths are used:
 * the SDK takes a span's start from Date.now(), whole milliseconds, and measures its length with
 * the performance clock, so the gaps between spans are not known to better than a millisecond.
 */
export function executionPhases(spans: ReceivedSpan[]): ExecutionPhases[] {
  const byTrace = new Map<string, Map<string, ReceivedSpan>>();
  for (const span of spans) {
    let trace = byTrace.get(span.traceId);
    if (trace === undefined) {
      trace = new Map();
      byTrace.set(span.traceId, trace);
    }
    trace.set(span.name, span);
  }
  const phases: ExecutionPhases[] = [];
  for (const trace of byTrace.values()) {
    const length = (name: string) => {
      const span = trace.get(name);
      return span === undefined ? undefined : Number(span.endNs - span.startNs) / 1e6;
    };
    const [server, auth, hold, runtime, record, queue, fork, exec] = [
      "POST /v1/executions",
      "auth",
      "billing.reserve",
      "runtime.execute",
      "billing.settle",
      "queue",
      "fork",
      "exec",
    ].map(length);
    if (
      server === undefined ||
      auth === undefined ||
      hold === undefined ||
      runtime === undefined ||
      record === undefined
    )
      continue;
    if (queue === undefined || fork === undefined || exec === undefined) continue;
    phases.push({
      requestId: trace.get("POST /v1/executions")?.attributes["faas.invocation_id"] ?? "",
      server,
      auth,
      hold,
      runtime,
      vm: queue + fork + exec,
      record,
      rest: server - auth - hold - runtime - record,
    });
  }
  return phases;
}
