// GET /v1/tools and POST /v1/tool-calls: the agent tools in the OpenAI and Anthropic formats.
// A tool call is answered with the message (OpenAI) or content block (Anthropic) to append to
// the conversation; whatever went wrong with the call itself is in that answer for the model.
import { createRoute, type OpenAPIHono, z } from "@hono/zod-openapi";
import type { AppEnv, GatewayContext } from "../context.js";
import { authenticate, limitBodyPerKey } from "../middleware.js";
import { formatTools } from "../tools/definitions.js";
import { type ToolResult, type ToolRunner, toolResultText } from "../tools/runner.js";
import {
  AUTHENTICATED,
  IDEMPOTENCY_KEY_HEADER,
  idempotencyKeyOf,
  problemResponses,
} from "./openapi-helpers.js";

export const EXECUTION_ID_HEADER = "sandfork-execution-id";

const OpenAIToolCallSchema = z
  .object({
    id: z.string().min(1).max(512),
    type: z.literal("function"),
    function: z
      .object({
        name: z.string(),
        arguments: z
          .string()
          .openapi({ description: "The model's JSON text; invalid JSON is reported to the model" }),
      })
      .loose(),
  })
  .loose()
  .openapi("OpenAIToolCall", {
    description: "One item of an OpenAI assistant message's tool_calls",
  });

const AnthropicToolUseSchema = z
  .object({
    type: z.literal("tool_use"),
    id: z.string().min(1).max(512),
    name: z.string(),
    input: z.unknown().openapi({ description: "The model's arguments object" }),
  })
  .loose()
  .openapi("AnthropicToolUse", {
    description: "A tool_use content block of an Anthropic assistant message",
  });

const OpenAIToolMessageSchema = z
  .object({ role: z.literal("tool"), tool_call_id: z.string(), content: z.string() })
  .openapi("OpenAIToolMessage", {
    description: "The message to append after the assistant message",
  });

const AnthropicToolResultSchema = z
  .object({
    type: z.literal("tool_result"),
    tool_use_id: z.string(),
    content: z
      .union([
        z.string(),
        z.array(
          z.union([
            z.object({ type: z.literal("text"), text: z.string() }),
            z.object({
              type: z.literal("image"),
              source: z.object({
                type: z.literal("base64"),
                media_type: z.enum(["image/png", "image/jpeg"]),
                data: z.string(),
              }),
            }),
          ]),
        ),
      ])
      .openapi({
        description:
          "The result's JSON as text; when the run showed images (charts), an array of a text block and an image block for each",
      }),
    is_error: z.boolean(),
  })
  .openapi("AnthropicToolResult", {
    description: "The content block to send in the next user message",
  });

/** An Anthropic tool_result's content: the text alone, or with an image block per image. */
function anthropicContent(result: ToolResult) {
  const text = toolResultText(result);
  if (result.isError || result.images.length === 0) return text;
  return [
    { type: "text" as const, text },
    ...result.images.map((image) => ({
      type: "image" as const,
      source: { type: "base64" as const, media_type: image.mimeType, data: image.data },
    })),
  ];
}

const ToolListSchema = z
  .object({ tools: z.array(z.record(z.string(), z.unknown())) })
  .openapi("ToolList");

export function registerToolRoutes(
  app: OpenAPIHono<AppEnv>,
  ctx: GatewayContext,
  runner: ToolRunner,
): void {
  const listTools = createRoute({
    method: "get",
    path: "/v1/tools",
    summary:
      "The agent tools (run_code, list_templates, and open_session, run_cell, close_session for state across calls), ready for an OpenAI or Anthropic request's `tools`",
    security: AUTHENTICATED,
    middleware: [authenticate(ctx, "execute")] as const,
    request: {
      query: z.object({
        format: z.enum(["openai", "anthropic"]).openapi({ description: "Whose tool format" }),
      }),
    },
    responses: {
      200: {
        description: "Tool definitions with the JSON Schema of their arguments",
        content: { "application/json": { schema: ToolListSchema } },
      },
      ...problemResponses(401, 403, 422, 429),
    },
  });
  app.openapi(listTools, (c) =>
    c.json({ tools: formatTools(runner.definitions, c.req.valid("query").format) }, 200),
  );

  const toolCall = createRoute({
    method: "post",
    path: "/v1/tool-calls",
    summary: "Run a model's tool call and get the message to append",
    description:
      "Takes an OpenAI `tool_calls[]` item or an Anthropic `tool_use` block as the model produced it. run_code is billed like " +
      "POST /v1/executions, the session tools like /v1/sessions (a run's execution id is in the Sandfork-Execution-Id header). " +
      "Charts come back as image blocks in the Anthropic format, and are described (type, pixel size, bytes) in OpenAI's, " +
      "whose tool messages hold text only. Invalid arguments, an unknown tool or language, " +
      "missing credits or a runtime failure are not HTTP errors: the answer is a tool result (is_error for Anthropic) whose " +
      "content is the problem+json body, for the model to read.",
    security: AUTHENTICATED,
    middleware: [authenticate(ctx, "execute"), limitBodyPerKey] as const,
    parameters: [IDEMPOTENCY_KEY_HEADER],
    request: {
      body: {
        required: true,
        content: {
          "application/json": { schema: z.union([OpenAIToolCallSchema, AnthropicToolUseSchema]) },
        },
      },
    },
    responses: {
      200: {
        description: "The tool message (OpenAI) or tool_result block (Anthropic)",
        content: {
          "application/json": {
            schema: z.union([OpenAIToolMessageSchema, AnthropicToolResultSchema]),
          },
        },
      },
      ...problemResponses(400, 401, 403, 413, 415, 422, 429),
    },
  });
  app.openapi(toolCall, async (c) => {
    const idempotencyKey = idempotencyKeyOf(c.req.header("idempotency-key"));
    const principal = c.get("principal");
    const call = c.req.valid("json");
    const withExecutionId = (result: ToolResult) => {
      if (!result.isError && result.executionId !== null)
        c.header(EXECUTION_ID_HEADER, result.executionId);
      return result;
    };
    if (call.type === "function") {
      const result = withExecutionId(
        await runner.callWithJson(
          principal,
          call.function.name,
          call.function.arguments,
          idempotencyKey,
        ),
      );
      return c.json(
        { role: "tool" as const, tool_call_id: call.id, content: toolResultText(result) },
        200,
      );
    }
    const result = withExecutionId(
      await runner.call(principal, call.name, call.input, idempotencyKey),
    );
    return c.json(
      {
        type: "tool_result" as const,
        tool_use_id: call.id,
        content: anthropicContent(result),
        is_error: result.isError,
      },
      200,
    );
  });
}
