// /mcp: the MCP server (gateway/mcp.ts) over Streamable HTTP, authenticated like the REST API
// (an API key or an execute-only token) and billed the same way.
import { createRoute, type OpenAPIHono, z } from "@hono/zod-openapi";
import type { AppEnv, GatewayContext } from "../context.js";
import { handleMcpRequest } from "../mcp.js";
import { authenticate, limitBodyPerKey } from "../middleware.js";
import type { ToolRunner } from "../tools/runner.js";
import { AUTHENTICATED, problemResponses } from "./openapi-helpers.js";

export const MCP_PATH = "/mcp";

const JsonRpcMessageSchema = z.object({ jsonrpc: z.literal("2.0") }).loose();

export function registerMcpRoutes(
  app: OpenAPIHono<AppEnv>,
  ctx: GatewayContext,
  runner: ToolRunner,
): void {
  const post = createRoute({
    method: "post",
    path: MCP_PATH,
    summary:
      "Model Context Protocol (Streamable HTTP, stateless): tools run_code and list_templates",
    description:
      "JSON-RPC messages of MCP; answers are application/json. A tools/call of run_code is billed like POST /v1/executions; " +
      "its failures are tool results with isError: true whose text is the problem+json body.",
    security: AUTHENTICATED,
    middleware: [authenticate(ctx, "execute"), limitBodyPerKey] as const,
    request: {
      body: {
        required: true,
        content: {
          "application/json": {
            schema: z.union([JsonRpcMessageSchema, z.array(JsonRpcMessageSchema)]),
          },
        },
      },
    },
    responses: {
      200: {
        description: "JSON-RPC responses",
        content: {
          "application/json": {
            schema: z.union([JsonRpcMessageSchema, z.array(JsonRpcMessageSchema)]),
          },
        },
      },
      202: { description: "Notifications accepted" },
      ...problemResponses(400, 401, 403, 413, 415, 422, 429),
    },
  });
  app.openapi(post, (c) =>
    handleMcpRequest(runner, c.get("principal"), c.req.raw, c.req.valid("json")),
  );

  // GET (a stream for server-initiated messages) and DELETE (ending a session) have nothing to
  // do on a stateless server: MCP lets it answer 405.
  for (const method of ["get", "delete"] as const) {
    const route = createRoute({
      method,
      path: MCP_PATH,
      summary:
        method === "get"
          ? "MCP server-to-client stream: not offered (stateless server)"
          : "MCP session end: no sessions (stateless server)",
      security: AUTHENTICATED,
      middleware: [authenticate(ctx, "execute")] as const,
      responses: {
        405: { description: "Method not allowed on this stateless MCP server (Allow: POST)" },
        ...problemResponses(401, 403, 429),
      },
    });
    app.openapi(route, (c) =>
      c.json(
        {
          jsonrpc: "2.0" as const,
          error: { code: -32000, message: "this MCP server is stateless: POST only" },
          id: null,
        },
        405,
        { allow: "POST" },
      ),
    );
  }
}
