// The gateway's MCP server: the agent tools (tools/) over the Model Context Protocol, one
// stateless server per HTTP request (Streamable HTTP, JSON answers), acting for the caller the
// route authenticated. Every failure of a call is a tool result with isError and our problem
// body as its text, never a JSON-RPC or transport error.
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { WebStandardStreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js";
import {
  CallToolRequestSchema,
  type CallToolResult,
  ListToolsRequestSchema,
} from "@modelcontextprotocol/sdk/types.js";
import type { Principal } from "./auth/principal.js";
import { SERVICE_NAME, SERVICE_VERSION } from "./telemetry.js";
import { type ToolResult, type ToolRunner, toolResultText } from "./tools/runner.js";

/** A tool result as MCP content: its JSON as text, then each image the run showed as image content. */
export function mcpResult(result: ToolResult): CallToolResult {
  const text = { type: "text" as const, text: toolResultText(result) };
  if (result.isError) return { isError: true, content: [text] };
  const images = result.images.map((image) => ({ type: "image" as const, ...image }));
  return { content: [text, ...images], structuredContent: result.structured };
}

/** An MCP server whose tools run as `principal`. */
export function mcpServer(runner: ToolRunner, principal: Principal): Server {
  const server = new Server(
    { name: SERVICE_NAME, version: SERVICE_VERSION },
    { capabilities: { tools: {} } },
  );
  server.setRequestHandler(ListToolsRequestSchema, () => ({
    tools: runner.definitions.map((tool) => ({
      name: tool.name,
      description: tool.description,
      inputSchema: { ...tool.parameters, type: "object" as const },
      outputSchema: { ...tool.result, type: "object" as const },
    })),
  }));
  server.setRequestHandler(CallToolRequestSchema, async (request) =>
    mcpResult(await runner.call(principal, request.params.name, request.params.arguments ?? {})),
  );
  return server;
}

/** Answers one MCP POST (its JSON already read: `parsedBody`) for `principal`. */
export async function handleMcpRequest(
  runner: ToolRunner,
  principal: Principal,
  request: Request,
  parsedBody: unknown,
): Promise<Response> {
  const server = mcpServer(runner, principal);
  // Stateless: no session id, each request is whole; answers are JSON rather than an SSE stream.
  const transport = new WebStandardStreamableHTTPServerTransport({
    sessionIdGenerator: undefined,
    enableJsonResponse: true,
  });
  await server.connect(transport);
  try {
    return await transport.handleRequest(request, { parsedBody });
  } finally {
    await server.close();
  }
}
