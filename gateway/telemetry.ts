// OpenTelemetry for the gateway: one tracer provider and one meter provider per gateway instance.
// Metrics are always readable at /metrics (Prometheus text); traces and metrics are also pushed by
// OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT (or the per-signal variables) is set. Spans are
// recorded only when something exports them (OTLP, or a test's exporter).
import { context, type Counter, type Histogram, type Meter, type Span, SpanStatusCode, type Tracer, type TracerProvider } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { OTLPMetricExporter } from "@opentelemetry/exporter-metrics-otlp-http";
import { PrometheusExporter, PrometheusSerializer } from "@opentelemetry/exporter-prometheus";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { MeterProvider, type MetricReader, PeriodicExportingMetricReader } from "@opentelemetry/sdk-metrics";
import { AlwaysOffSampler, BasicTracerProvider, BatchSpanProcessor, type SpanExporter, type SpanProcessor, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION } from "@opentelemetry/semantic-conventions";

export const SERVICE_NAME = "sandfork-gateway";
export const SERVICE_VERSION = "0.1.0";

export interface GatewayInstruments {
  executions: Counter;
  executionDuration: Histogram;
  billedUnits: Counter;
  rejectedRequests: Counter;
}

export interface Telemetry {
  tracerProvider: TracerProvider;
  meterProvider: MeterProvider;
  tracer: Tracer;
  meter: Meter;
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
export function inSpan<T>(tracer: Tracer, name: string, work: (span: Span) => Promise<T>): Promise<T> {
  return tracer.startActiveSpan(name, async (span) => {
    try {
      return await work(span);
    } catch (error) {
      span.setStatus({ code: SpanStatusCode.ERROR, message: error instanceof Error ? error.message : String(error) });
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
export function otlpEndpoint(env: NodeJS.ProcessEnv, signal: "traces" | "metrics"): string | undefined {
  const specific = env[`OTEL_EXPORTER_OTLP_${signal.toUpperCase()}_ENDPOINT`];
  if (specific) return specific;
  const base = env.OTEL_EXPORTER_OTLP_ENDPOINT;
  return base ? `${base.replace(/\/+$/, "")}/v1/${signal}` : undefined;
}

export function createTelemetry(options: TelemetryOptions = {}): Telemetry {
  const env = options.env ?? process.env;
  const resource = resourceFromAttributes({ [ATTR_SERVICE_NAME]: SERVICE_NAME, [ATTR_SERVICE_VERSION]: SERVICE_VERSION });

  const spanProcessors: SpanProcessor[] = [];
  if (options.spanExporter) spanProcessors.push(new SimpleSpanProcessor(options.spanExporter));
  const tracesUrl = otlpEndpoint(env, "traces");
  if (tracesUrl) spanProcessors.push(new BatchSpanProcessor(new OTLPTraceExporter({ url: tracesUrl })));
  // With nowhere to send spans, none is recorded (the SDK would build and drop each one), and
  // the async context that parents them stays off: in Node 20 it runs hooks on every promise.
  const recording = spanProcessors.length > 0;
  if (recording) installContextManager();
  const tracerProvider = new BasicTracerProvider({ resource, spanProcessors, ...(recording ? {} : { sampler: new AlwaysOffSampler() }) });

  const prometheus = new PrometheusExporter({ preventServerStart: true });
  const readers: MetricReader[] = [prometheus];
  const metricsUrl = otlpEndpoint(env, "metrics");
  if (metricsUrl) readers.push(new PeriodicExportingMetricReader({ exporter: new OTLPMetricExporter({ url: metricsUrl }) }));
  const meterProvider = new MeterProvider({ resource, readers });

  const tracer = tracerProvider.getTracer(SERVICE_NAME, SERVICE_VERSION);
  const meter = meterProvider.getMeter(SERVICE_NAME, SERVICE_VERSION);
  const instruments: GatewayInstruments = {
    executions: meter.createCounter("sandfork.executions", { description: "Executions finished, by template and status" }),
    executionDuration: meter.createHistogram("sandfork.execution.duration", {
      description: "Wall time of executions as measured by the gateway",
      unit: "s",
    }),
    billedUnits: meter.createCounter("sandfork.billing.units", { description: "Billing units charged, by template" }),
    rejectedRequests: meter.createCounter("sandfork.requests.rejected", { description: "Requests answered with a problem, by problem type" }),
  };
  const serializer = new PrometheusSerializer();

  return {
    tracerProvider,
    meterProvider,
    tracer,
    meter,
    instruments,
    async prometheusText() {
      const { resourceMetrics } = await prometheus.collect();
      return serializer.serialize(resourceMetrics);
    },
    async flush() {
      await Promise.all([tracerProvider.forceFlush(), meterProvider.forceFlush()]);
    },
    async shutdown() {
      await Promise.allSettled([tracerProvider.shutdown(), meterProvider.shutdown()]);
    },
  };
}
