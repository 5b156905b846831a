// The HTTP server's telemetry, per the OpenTelemetry semantic conventions: a SERVER span per
// request (named "METHOD /route"; parented through the global propagator, none by default) when spans are recorded,
// http.server.request.duration by method, route and status, and http.server.active_requests.
// Our own rather than @hono/otel's: that one builds every request's header object twice, reads the
// response headers back, and makes three metric records a request; this makes one.
import {
  context,
  propagation,
  SpanKind,
  SpanStatusCode,
  type TextMapGetter,
} from "@opentelemetry/api";
import type { Context } from "hono";
import { createMiddleware } from "hono/factory";
import { routePath } from "hono/route";
import type { AppEnv } from "./context.js";
import type { Telemetry } from "./telemetry.js";

const requestHeaders: TextMapGetter<Headers> = {
  keys: (headers) => [...headers.keys()],
  get: (headers, key) => headers.get(key) ?? undefined,
};

export function httpTelemetry(telemetry: Telemetry) {
  const { tracer, recording, instruments } = telemetry;
  const { activeRequests, requestDuration } = instruments;
  const finish = (c: Context<AppEnv>, method: string, started: number) => {
    activeRequests.set(method, (activeRequests.get(method) ?? 1) - 1);
    requestDuration.record((performance.now() - started) / 1000, {
      "http.request.method": method,
      "http.route": routePath(c),
      "http.response.status_code": c.res.status,
    });
  };
  return createMiddleware<AppEnv>(async (c, next) => {
    const method = c.req.method;
    const started = performance.now();
    activeRequests.set(method, (activeRequests.get(method) ?? 0) + 1);
    if (!recording) {
      try {
        await next();
      } finally {
        finish(c, method, started);
      }
      return;
    }
    const parent = propagation.extract(context.active(), c.req.raw.headers, requestHeaders);
    const attributes = { "http.request.method": method, "url.path": c.req.path };
    await tracer.startActiveSpan(
      `${method} ${c.req.path}`,
      { kind: SpanKind.SERVER, attributes },
      parent,
      async (span) => {
        try {
          await next();
        } finally {
          // The route is known once routing is done; a thrown error has become c.res by now.
          const route = routePath(c);
          span.updateName(`${method} ${route}`);
          span.setAttributes({ "http.route": route, "http.response.status_code": c.res.status });
          if (c.res.status >= 500) span.setStatus({ code: SpanStatusCode.ERROR });
          finish(c, method, started);
          span.end();
        }
      },
    );
  });
}
