// Child process of the load runner: the gateway (in-memory PGlite, or DATABASE_URL) and a plain
// Hono "hello" app on loopback ports, plus a funded key with high limits. Prints one JSON line
// {gatewayUrl, helloUrl, key} when ready and serves until killed.
import { generateKeyPairSync } from "node:crypto";
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { Hono } from "hono";
import { openDatabase } from "../db/client.js";
import { createGateway } from "../gateway/app.js";
import { loadSigningKey, TokenService } from "../gateway/auth/tokens.js";
import { loadConfig } from "../gateway/config.js";
import { issueKey } from "../gateway/key-service.js";
import { createTelemetry } from "../gateway/telemetry.js";

const config = loadConfig();
const open =
  config.databaseUrl !== undefined
    ? await openDatabase({ backend: "postgres", url: config.databaseUrl })
    : await openDatabase({ backend: "pglite" });
const { key } = await issueKey(open.db, {
  name: "loadtest",
  scopes: ["execute", "usage:read"],
  credits: 1_000_000_000,
  limits: { rateLimitPerMinute: 100_000_000, maxConcurrency: 10_000, maxBodyBytes: 1024 * 1024 },
});
const signingKey =
  config.tokenSigningKeyPem !== undefined ? loadSigningKey(config.tokenSigningKeyPem, config.dataDir) : generateKeyPairSync("ed25519").privateKey;
const { app } = createGateway({
  db: open.db,
  config,
  telemetry: createTelemetry(),
  tokens: new TokenService(signingKey, config.tokenIssuer, config.tokenAudience),
  runtime: () => undefined,
});

const hello = new Hono();
hello.get("/hello", (c) => c.text("hello"));

const listen = (fetch: (request: Request) => Response | Promise<Response>) =>
  new Promise<string>((resolve) => {
    const server = serve({ fetch, hostname: "127.0.0.1", port: 0 }, () => {
      resolve(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
    });
  });

const [gatewayUrl, helloUrl] = await Promise.all([listen(app.fetch), listen(hello.fetch)]);
process.stdout.write(`${JSON.stringify({ gatewayUrl, helloUrl, key })}\n`);
