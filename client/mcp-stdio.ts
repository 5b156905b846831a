// `npm run mcp` / `npx sandfork-mcp`: an MCP server on stdio for desktop clients that only
// speak stdio. It forwards tools/list and tools/call to a gateway's /mcp (Streamable HTTP), so
// its tools, results, errors and billing are the gateway's own.
//
// Environment: SANDFORK_API_KEY (required: an API key or an execute-only token) and
// SANDFORK_URL (default http://127.0.0.1:8787). Logs go to stderr; stdout is the protocol.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const NAME = "sandfork-mcp";
const VERSION = "0.1.0";

function fail(message: string): never {
  process.stderr.write(`${NAME}: ${message}\n`);
  process.exit(1);
}

const apiKey = process.env.SANDFORK_API_KEY;
if (apiKey === undefined || apiKey === "")
  fail("set SANDFORK_API_KEY to an API key or token of the gateway");
const gateway = new URL("/mcp", process.env.SANDFORK_URL ?? "http://127.0.0.1:8787");

const remote = new Client({ name: NAME, version: VERSION });
try {
  await remote.connect(
    new StreamableHTTPClientTransport(gateway, {
      requestInit: { headers: { authorization: `Bearer ${apiKey}` } },
    }),
  );
} catch (error) {
  fail(`cannot open an MCP session with ${gateway.href}: ${(error as Error).message}`);
}

const server = new Server({ name: NAME, version: VERSION }, { capabilities: { tools: {} } });
server.setRequestHandler(ListToolsRequestSchema, (request) => remote.listTools(request.params));
server.setRequestHandler(CallToolRequestSchema, async (request) => {
  try {
    return await remote.callTool(request.params);
  } catch (error) {
    // The gateway did not answer the call (unreachable, restarted): the model is told so.
    return {
      isError: true,
      content: [
        {
          type: "text" as const,
          text: `the Sandfork gateway at ${gateway.origin} did not answer: ${(error as Error).message}`,
        },
      ],
    };
  }
});
server.onclose = () => {
  void remote.close();
};
await server.connect(new StdioServerTransport());
