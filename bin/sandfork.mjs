#!/usr/bin/env node
// `npx sandfork template build FILE.json`: the command line (client/cli.ts), loaded through tsx as `npm start` loads the gateway.
import { register } from "tsx/esm/api";

register();
await import("../client/cli.ts");
