// GET /v1/templates; templates built through the API: POST /v1/templates, GET
// /v1/templates/{name}/builds/{id} (streamed with Accept: text/event-stream), DELETE
// /v1/templates/{ref}, POST /v1/templates/{ref}/publish.
import { createRoute, type OpenAPIHono, z } from "@hono/zod-openapi";
import { streamSSE } from "hono/streaming";
import type { CustomTemplateRow } from "../../db/custom-templates.js";
import type { AppEnv, GatewayContext } from "../context.js";
import { authenticate } from "../middleware.js";
import { priceOf } from "../pricing.js";
import {
  CustomTemplateSchema,
  TemplateBuildParamSchema,
  TemplateBuildSchema,
  TemplateDefinitionSchema,
  TemplateRefParamSchema,
  TemplateSchema,
} from "../schemas.js";
import { EVENT_STREAM, wantsStream } from "../streamed-execution.js";
import { AUTHENTICATED, problemResponses } from "./openapi-helpers.js";

/** How often a streamed build reads its row, and the longest it streams. */
const BUILD_POLL_MS = 250;
/** A log line that says a build step started (gateway/template-service.ts logs one per step). */
const STEP_LINE = /^step: (\w+)$/gm;
const BUILD_STREAM_MAX_MS = 30 * 60_000;

const iso = (d: Date | null) => (d === null ? null : d.toISOString());

/** A definition's own string field (a session template's `description`, `from_session`). */
function definitionText(row: CustomTemplateRow, field: string): string | null {
  const definition = row.definition as Record<string, unknown> | null;
  const value = definition?.[field];
  return typeof value === "string" ? value : null;
}

export function buildJson(row: CustomTemplateRow) {
  return {
    id: row.id,
    name: row.name,
    version: row.version,
    description: definitionText(row, "description"),
    from_session: definitionText(row, "from_session"),
    status: row.status as "queued" | "building" | "ready" | "failed",
    step: row.step,
    error: row.error,
    logs: row.logs,
    image_bytes: row.imageBytes,
    snapshot_bytes: row.snapshotBytes,
    published: row.published,
    created_at: row.createdAt.toISOString(),
    finished_at: iso(row.finishedAt),
  };
}

const finished = (row: CustomTemplateRow) => row.status === "ready" || row.status === "failed";

export function registerTemplateRoutes(app: OpenAPIHono<AppEnv>, ctx: GatewayContext): void {
  const unit = ctx.config.pricing.unitName;

  const listTemplates = createRoute({
    method: "get",
    path: "/v1/templates",
    summary: "Templates the caller may run, with their prices",
    description:
      "`templates`: the built-in templates the runtime offers. `custom_templates`: the account's templates built " +
      "through POST /v1/templates (any status) and those an admin published.",
    security: AUTHENTICATED,
    middleware: [authenticate(ctx, "execute")] as const,
    responses: {
      200: {
        description: "Templates",
        content: {
          "application/json": {
            schema: z.object({
              templates: z.array(TemplateSchema),
              custom_templates: z.array(CustomTemplateSchema),
            }),
          },
        },
      },
      ...problemResponses(401, 403, 429, 503),
    },
  });
  app.openapi(listTemplates, async (c) => {
    const principal = c.get("principal");
    const templates = await ctx.executions.templates();
    const custom = await ctx.templates.list(principal);
    return c.json(
      {
        templates: templates.map((t) => {
          const price = priceOf(ctx.config.pricing, t.name);
          return {
            name: t.name,
            language: t.language,
            languages: t.languages,
            content_hash: t.contentHash,
            ready: t.ready,
            price: {
              unit,
              base_units: price.baseUnits,
              units_per_second: price.unitsPerSecond,
              units_per_network_mib: price.unitsPerNetworkMib ?? 0,
            },
          };
        }),
        custom_templates: custom.map((row) => ({
          name: row.name,
          version: row.version,
          ref: `${row.name}@${row.version}`,
          status: row.status as "queued" | "building" | "ready" | "failed",
          build_id: row.id,
          published: row.published,
          own: row.accountId === principal.accountId,
          image_bytes: row.imageBytes,
          created_at: row.createdAt.toISOString(),
        })),
      },
      200,
    );
  });

  const create = createRoute({
    method: "post",
    path: "/v1/templates",
    summary: "Build a template from a definition",
    description:
      "Needs the templates scope (or admin). Answers 202 with the build, queued; follow it at " +
      "GET /v1/templates/{name}/builds/{id}. A version is immutable: building one that is built or " +
      "being built is 409 (a failed one may be built again).",
    security: AUTHENTICATED,
    middleware: [authenticate(ctx, "templates")] as const,
    request: {
      body: {
        required: true,
        content: { "application/json": { schema: TemplateDefinitionSchema } },
      },
    },
    responses: {
      202: {
        description: "The build, queued",
        content: { "application/json": { schema: TemplateBuildSchema } },
      },
      ...problemResponses(400, 401, 403, 409, 413, 415, 422, 429, 501, 503),
    },
  });
  app.openapi(create, async (c) => {
    const row = await ctx.templates.create(c.get("principal"), c.req.valid("json"));
    c.header("location", `/v1/templates/${row.name}/builds/${row.id}`);
    return c.json(buildJson(row), 202);
  });

  const getBuild = createRoute({
    method: "get",
    path: "/v1/templates/{name}/builds/{id}",
    summary: "A template build: status, step and logs",
    description:
      "With Accept: text/event-stream, a Server-Sent Events stream: `step` ({step}) as each step starts, " +
      "`log` ({text}) as lines are logged, then `build` with the body of the plain answer once it is ready or failed.",
    security: AUTHENTICATED,
    middleware: [authenticate(ctx, "templates")] as const,
    request: { params: TemplateBuildParamSchema },
    responses: {
      200: {
        description: "The build; or, streamed, its events",
        content: {
          "application/json": { schema: TemplateBuildSchema },
          [EVENT_STREAM]: {
            schema: z.string().openapi({ description: "event: step | log | build; data: JSON" }),
          },
        },
      },
      ...problemResponses(401, 403, 404, 422, 429),
    },
  });
  app.openapi(getBuild, async (c) => {
    const principal = c.get("principal");
    const { name, id } = c.req.valid("param");
    const first = await ctx.templates.build(principal, name, id);
    if (!wantsStream(c.req.header("accept"), {})) return c.json(buildJson(first), 200);
    return streamSSE(c, async (stream) => {
      let row = first;
      let sentLogs = 0;
      const deadline = performance.now() + BUILD_STREAM_MAX_MS;
      for (;;) {
        if (row.logs.length > sentLogs) {
          const text = row.logs.slice(sentLogs);
          // Steps are read from the log, where each start is a line, so none is missed
          // between two polls of a quick build.
          for (const [, step] of text.matchAll(STEP_LINE))
            await stream.writeSSE({ event: "step", data: JSON.stringify({ step }) });
          await stream.writeSSE({ event: "log", data: JSON.stringify({ text }) });
          sentLogs = row.logs.length;
        }
        if (finished(row) || performance.now() > deadline) {
          await stream.writeSSE({ event: "build", data: JSON.stringify(buildJson(row)) });
          return;
        }
        await stream.sleep(BUILD_POLL_MS);
        if (stream.aborted) return;
        row = await ctx.templates.build(principal, name, id);
      }
    });
  });

  const remove = createRoute({
    method: "delete",
    path: "/v1/templates/{ref}",
    summary: "Delete a template built through the API",
    description:
      "The caller's account's name@version (an admin: any account's). Executions running on it finish; " +
      "a build in progress is 409 template-in-use.",
    security: AUTHENTICATED,
    middleware: [authenticate(ctx, "templates")] as const,
    request: { params: TemplateRefParamSchema },
    responses: {
      204: { description: "Deleted" },
      ...problemResponses(401, 403, 404, 409, 422, 429),
    },
  });
  app.openapi(remove, async (c) => {
    await ctx.templates.remove(c.get("principal"), c.req.valid("param").ref);
    return c.body(null, 204);
  });

  const publish = createRoute({
    method: "post",
    path: "/v1/templates/{ref}/publish",
    summary: "Make a template visible to every account, or to its own only (admin)",
    security: AUTHENTICATED,
    middleware: [authenticate(ctx, "admin")] as const,
    request: {
      params: TemplateRefParamSchema,
      body: {
        required: true,
        content: {
          "application/json": { schema: z.object({ published: z.boolean() }).strict() },
        },
      },
    },
    responses: {
      200: {
        description: "The template's build",
        content: { "application/json": { schema: TemplateBuildSchema } },
      },
      ...problemResponses(401, 403, 404, 409, 422, 429),
    },
  });
  app.openapi(publish, async (c) => {
    const row = await ctx.templates.publish(
      c.get("principal"),
      c.req.valid("param").ref,
      c.req.valid("json").published,
    );
    return c.json(buildJson(row), 200);
  });
}
