#!/usr/bin/env node
// `npx sandfork-mcp`: the stdio MCP server (client/mcp-stdio.ts), loaded through tsx as `npm start` loads the gateway.
import { register } from "tsx/esm/api";

register();
await import("../client/mcp-stdio.ts");
