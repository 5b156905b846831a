// OpenTelemetry for the gateway: one tracer provider and one meter provider per gateway instance.
// Metrics are always readable at /metrics (Prometheus text); traces and metrics are also pushed by
// OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT (or the per-signal variables) is set. Spans are
// recorded only when something exports them (OTLP, or a test's exporter).
// Per-request cost matters here: every SDK record hashes its attribute set, so counts are
// tallied in memory and read when metrics are collected (TalliedCounter), and with nowhere to send
// spans the tracer is the API's no-op one (no ids generated, no sampling decision per span).
import { monitorEventLoopDelay } from "node:perf_hooks";
import {
  type Attributes,
  context,
  type Histogram,
  type Meter,
  ProxyTracerProvider,
  type Span,
  SpanStatusCode,
  type Tracer,
  ValueType,
} from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { OTLPMetricExporter } from "@opentelemetry/exporter-metrics-otlp-http";
import { PrometheusExporter, PrometheusSerializer } from "@opentelemetry/exporter-prometheus";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import {
  MeterProvider,
  type MetricReader,
  PeriodicExportingMetricReader,
} from "@opentelemetry/sdk-metrics";
import {
  AlwaysOffSampler,
  BasicTracerProvider,
  BatchSpanProcessor,
  SimpleSpanProcessor,
  type SpanExporter,
  type SpanProcessor,
} from "@opentelemetry/sdk-trace-base";
import { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION } from "@opentelemetry/semantic-conventions";
import type { NetworkUsage, RuntimeAdmission } from "../runtime/execution-runtime.js";

export const SERVICE_NAME = "sandfork-gateway";
export const SERVICE_VERSION = "0.1.0";

/**
 * A monotonic sum whose add() is a Map update keyed by the values of its declared attributes; the
 * SDK sees the totals only when a reader collects (an observable counter). Its attribute values
 * must come from small sets (templates, statuses, problem types), as any metric's should.
 */
export class TalliedCounter<K extends string> {
  private readonly totals = new Map<string, { attributes: Record<K, string>; value: number }>();

  constructor(
    meter: Meter,
    name: string,
    description: string,
    private readonly keys: readonly K[],
  ) {
    meter.createObservableCounter(name, { description }).addCallback((result) => {
      for (const total of this.totals.values()) result.observe(total.value, total.attributes);
    });
  }

  add(value: number, attributes: Record<K, string>): void {
    const key = this.keys.map((k) => attributes[k]).join("\u0000");
    const total = this.totals.get(key);
    if (total === undefined) this.totals.set(key, { attributes: { ...attributes }, value });
    else total.value += value;
  }
}

/** Counts a run's network traffic and refusals in the metrics. */
export function recordNetwork(
  instruments: GatewayInstruments,
  template: string,
  network: NetworkUsage,
): void {
  instruments.networkBytes.add(network.bytesIn, { direction: "in" });
  instruments.networkBytes.add(network.bytesOut, { direction: "out" });
  instruments.networkRefused.add(network.refused, { template });
}

export interface GatewayInstruments {
  executions: TalliedCounter<"template" | "status">;
  executionDuration: Histogram;
  billedUnits: TalliedCounter<"template">;
  /** Network payload bytes of executions and cells, by direction (in, out). */
  networkBytes: TalliedCounter<"direction">;
  /** Connects, sends and DNS questions the network policy refused, by template. */
  networkRefused: TalliedCounter<"template">;
  rejectedRequests: TalliedCounter<"problem">;
  /** http.server.request.duration, by method, route and status (semantic conventions). */
  requestDuration: Histogram<Attributes>;
  /** Requests being served, by method: read as http.server.active_requests when collected. */
  activeRequests: Map<string, number>;
  /** Executions shed by admission control or refused by a busy runtime, by reason. */
  shedCalls: TalliedCounter<"reason">;
  /** Read when collected: executions running and waiting per template, and waiting for a slot of their key. */
  admissionDepths: { read: () => AdmissionDepths };
  /** The runtime's own admission as last asked (GET /metrics asks it first); none: not shown. */
  runtimeAdmission: { latest: RuntimeAdmission | undefined };
}

export interface AdmissionDepths {
  templates: { template: string; running: number; queued: number }[];
  /** Over all keys (a key is no metric attribute: there are too many). */
  keysQueued: number;
}

export interface Telemetry {
  /** Whether spans are recorded (something exports them). */
  recording: boolean;
  tracer: Tracer;
  instruments: GatewayInstruments;
  /** The current metrics in Prometheus text exposition format. */
  prometheusText(): Promise<string>;
  /** Pushes buffered spans and metrics to the OTLP endpoints now. */
  flush(): Promise<void>;
  shutdown(): Promise<void>;
}

export interface TelemetryOptions {
  env?: NodeJS.ProcessEnv;
  /** Extra span exporter, exported synchronously (tests read spans from an in-memory one). */
  spanExporter?: SpanExporter;
}

/** Runs `work` in a new active span that always ends; a throw marks the span as an error. */
export function inSpan<T>(
  tracer: Tracer,
  name: string,
  work: (span: Span) => Promise<T>,
): Promise<T> {
  return tracer.startActiveSpan(name, async (span) => {
    try {
      return await work(span);
    } catch (error) {
      span.setStatus({
        code: SpanStatusCode.ERROR,
        message: error instanceof Error ? error.message : String(error),
      });
      throw error;
    } finally {
      span.end();
    }
  });
}

let contextManagerInstalled = false;

/** Child spans find their parent through async context; install that once per process. */
function installContextManager(): void {
  if (contextManagerInstalled) return;
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  contextManagerInstalled = true;
}

/** The OTLP/HTTP endpoint for one signal, following the OTEL_EXPORTER_OTLP_* conventions; undefined: off. */
export function otlpEndpoint(
  env: NodeJS.ProcessEnv,
  signal: "traces" | "metrics",
): string | undefined {
  const specific = env[`OTEL_EXPORTER_OTLP_${signal.toUpperCase()}_ENDPOINT`];
  if (specific) return specific;
  const base = env.OTEL_EXPORTER_OTLP_ENDPOINT;
  return base ? `${base.replace(/\/+$/, "")}/v1/${signal}` : undefined;
}

export function createTelemetry(options: TelemetryOptions = {}): Telemetry {
  const env = options.env ?? process.env;
  const resource = resourceFromAttributes({
    [ATTR_SERVICE_NAME]: SERVICE_NAME,
    [ATTR_SERVICE_VERSION]: SERVICE_VERSION,
  });

  const spanProcessors: SpanProcessor[] = [];
  if (options.spanExporter) spanProcessors.push(new SimpleSpanProcessor(options.spanExporter));
  const tracesUrl = otlpEndpoint(env, "traces");
  if (tracesUrl)
    spanProcessors.push(new BatchSpanProcessor(new OTLPTraceExporter({ url: tracesUrl })));
  // With nowhere to send spans, none is recorded (the SDK would build and drop each one), and
  // the async context that parents them stays off: in Node 20 it runs hooks on every promise.
  const recording = spanProcessors.length > 0;
  if (recording) installContextManager();
  const tracerProvider = new BasicTracerProvider({
    resource,
    spanProcessors,
    ...(recording ? {} : { sampler: new AlwaysOffSampler() }),
  });

  const prometheus = new PrometheusExporter({ preventServerStart: true });
  const readers: MetricReader[] = [prometheus];
  const metricsUrl = otlpEndpoint(env, "metrics");
  if (metricsUrl)
    readers.push(
      new PeriodicExportingMetricReader({ exporter: new OTLPMetricExporter({ url: metricsUrl }) }),
    );
  const meterProvider = new MeterProvider({ resource, readers });

  const tracer = (recording ? tracerProvider : new ProxyTracerProvider()).getTracer(
    SERVICE_NAME,
    SERVICE_VERSION,
  );
  const meter = meterProvider.getMeter(SERVICE_NAME, SERVICE_VERSION);
  const activeRequests = new Map<string, number>();
  meter
    .createObservableUpDownCounter("http.server.active_requests", {
      description: "HTTP requests being served",
      valueType: ValueType.INT,
    })
    .addCallback((result) => {
      for (const [method, count] of activeRequests)
        result.observe(count, { "http.request.method": method });
    });
  const instruments: GatewayInstruments = {
    executions: new TalliedCounter(
      meter,
      "sandfork.executions",
      "Executions finished, by template and status",
      ["template", "status"],
    ),
    executionDuration: meter.createHistogram("sandfork.execution.duration", {
      description: "Wall time of executions as measured by the gateway",
      unit: "s",
    }),
    billedUnits: new TalliedCounter(
      meter,
      "sandfork.billing.units",
      "Billing units charged, by template",
      ["template"],
    ),
    networkBytes: new TalliedCounter(
      meter,
      "sandfork.network.bytes",
      "Network payload bytes executions and cells received (in) and sent (out)",
      ["direction"],
    ),
    networkRefused: new TalliedCounter(
      meter,
      "sandfork.network.refused",
      "Connects, sends and DNS questions the network policy refused, by template",
      ["template"],
    ),
    rejectedRequests: new TalliedCounter(
      meter,
      "sandfork.requests.rejected",
      "Requests answered with a problem, by problem type",
      ["problem"],
    ),
    requestDuration: meter.createHistogram("http.server.request.duration", {
      description: "Duration of HTTP requests",
      unit: "s",
      advice: {
        explicitBucketBoundaries: [
          0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
        ],
      },
    }),
    activeRequests,
    shedCalls: new TalliedCounter(
      meter,
      "sandfork.admission.shed",
      "Executions shed at once (429/503), by reason: key_queue_full, template_queue_full, runtime_<the daemon's busy reason>, runtime_busy",
      ["reason"],
    ),
    admissionDepths: { read: () => ({ templates: [], keysQueued: 0 }) },
    runtimeAdmission: { latest: undefined },
  };
  meter
    .createObservableGauge("sandfork.runtime.admission.queued", {
      description:
        "Executions waiting in the runtime (the daemon) for a running slot: over all templates (queue=all), or of one (queue=template)",
      valueType: ValueType.INT,
    })
    .addCallback((result) => {
      const runtime = instruments.runtimeAdmission.latest;
      if (runtime === undefined) return;
      result.observe(runtime.queued, { queue: "all" });
      for (const [template, queued] of Object.entries(runtime.queuedByTemplate))
        result.observe(queued, { queue: "template", template });
    });
  meter
    .createObservableGauge("sandfork.runtime.admission.running", {
      description: "Executions running in the runtime (the daemon)",
      valueType: ValueType.INT,
    })
    .addCallback((result) => {
      const runtime = instruments.runtimeAdmission.latest;
      if (runtime !== undefined) result.observe(runtime.running);
    });
  meter
    .createObservableCounter("sandfork.runtime.admission.busy", {
      description:
        "Calls the runtime (the daemon) answered busy since it started, by reason: queue_full, template_queue_full, key_queue_full, connections_full, sessions_full",
    })
    .addCallback((result) => {
      const runtime = instruments.runtimeAdmission.latest;
      if (runtime === undefined) return;
      for (const [reason, count] of Object.entries(runtime.busy)) result.observe(count, { reason });
    });
  meter
    .createObservableGauge("sandfork.admission.queued", {
      description:
        "Executions waiting for a slot, by queue (template, with its name, or key, over all keys)",
      valueType: ValueType.INT,
    })
    .addCallback((result) => {
      const depths = instruments.admissionDepths.read();
      for (const t of depths.templates)
        result.observe(t.queued, { queue: "template", template: t.template });
      result.observe(depths.keysQueued, { queue: "key" });
    });
  meter
    .createObservableGauge("sandfork.admission.running", {
      description: "Executions handed to the runtime, by template",
      valueType: ValueType.INT,
    })
    .addCallback((result) => {
      for (const t of instruments.admissionDepths.read().templates)
        result.observe(t.running, { template: t.template });
    });
  // How long ready callbacks (a request's too) waited for the event loop since the previous
  // collection: a shed answer's wait behind other work, which its own duration does not show.
  const loopDelay = monitorEventLoopDelay({ resolution: 1 });
  loopDelay.enable();
  const loopGauges = {
    p50: meter.createObservableGauge("nodejs.eventloop.delay.p50", {
      description: "Event loop delay since the previous collection, 50th percentile",
      unit: "s",
    }),
    p99: meter.createObservableGauge("nodejs.eventloop.delay.p99", {
      description: "Event loop delay since the previous collection, 99th percentile",
      unit: "s",
    }),
    max: meter.createObservableGauge("nodejs.eventloop.delay.max", {
      description: "Event loop delay since the previous collection, the longest",
      unit: "s",
    }),
  };
  meter.addBatchObservableCallback((result) => {
    if (loopDelay.count === 0) return;
    result.observe(loopGauges.p50, loopDelay.percentile(50) / 1e9);
    result.observe(loopGauges.p99, loopDelay.percentile(99) / 1e9);
    result.observe(loopGauges.max, loopDelay.max / 1e9);
    loopDelay.reset();
  }, Object.values(loopGauges));
  const serializer = new PrometheusSerializer();

  return {
    recording,
    tracer,
    instruments,
    async prometheusText() {
      const { resourceMetrics } = await prometheus.collect();
      return serializer.serialize(resourceMetrics);
    },
    async flush() {
      await Promise.all([tracerProvider.forceFlush(), meterProvider.forceFlush()]);
    },
    async shutdown() {
      loopDelay.disable();
      await Promise.allSettled([tracerProvider.shutdown(), meterProvider.shutdown()]);
    },
  };
}
