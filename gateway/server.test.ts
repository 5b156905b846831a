// The real process path: PGlite in a data directory, first-start bootstrap, HTTP on a socket, restart.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { openDatabase } from "../db/open.js";
import { EMBEDDED_DATABASE_DIR, type GatewayConfig, loadConfig } from "./config.js";
import { startGateway } from "./server.js";

describe("gateway process on embedded PGlite", () => {
  const dataDir = mkdtempSync(join(tmpdir(), "sandfork-server-test-"));
  const config: GatewayConfig = { ...loadConfig({}), dataDir, port: 0 };
  afterAll(() => rmSync(dataDir, { recursive: true, force: true }));

  it("prints an admin key once on first start, keeps data and the token key across restarts", {
    timeout: 120_000,
  }, async () => {
    const firstLog: string[] = [];
    const first = await startGateway(config, { log: (l) => firstLog.push(l) });
    let adminKey: string;
    let token: string;
    try {
      adminKey = firstLog.join("\n").match(/sfk_[0-9A-Za-z]{38}/)?.[0] ?? "";
      expect(adminKey).not.toBe("");
      expect(firstLog.join("\n")).toContain("503 runtime-unavailable");
      const health = await fetch(`${first.url}/healthz`);
      expect(await health.json()).toMatchObject({ database: "ok", runtime: "unavailable" });
      const auth = { authorization: `Bearer ${adminKey}` };
      const keys = (await (await fetch(`${first.url}/v1/keys`, { headers: auth })).json()) as {
        keys: { scopes: string[] }[];
      };
      expect(keys.keys).toHaveLength(1);
      expect(keys.keys[0]?.scopes).toEqual(["admin", "execute", "usage:read"]);
      const grantPath = firstLog
        .join("\n")
        .match(/POST (\/v1\/accounts\/[0-9a-f-]+\/credits)/)?.[1];
      expect(grantPath).toBeDefined();
      const granted = await fetch(`${first.url}${grantPath}`, {
        method: "POST",
        headers: { ...auth, "content-type": "application/json" },
        body: JSON.stringify({ units: 100 }),
      });
      expect(await granted.json()).toMatchObject({ balance_units: 100 });
      const minted = await fetch(`${first.url}/v1/tokens`, {
        method: "POST",
        headers: { ...auth, "content-type": "application/json" },
        body: JSON.stringify({ ttl_seconds: 600 }),
      });
      token = ((await minted.json()) as { token: string }).token;
      // One process owns the data directory.
      await expect(
        openDatabase({ backend: "pglite", dataDir: join(dataDir, EMBEDDED_DATABASE_DIR) }),
      ).rejects.toThrow(/in use by process/);
    } finally {
      await first.stop();
    }

    const secondLog: string[] = [];
    const second = await startGateway(config, { log: (l) => secondLog.push(l) });
    try {
      expect(secondLog.join("\n")).not.toMatch(/sfk_/);
      expect(
        (await fetch(`${second.url}/v1/keys`, { headers: { authorization: `Bearer ${adminKey}` } }))
          .status,
      ).toBe(200);
      // The signing key persisted in the data directory: a token minted before the restart still verifies.
      const templates = await fetch(`${second.url}/v1/templates`, {
        headers: { authorization: `Bearer ${token}` },
      });
      expect(templates.status).toBe(503);
    } finally {
      await second.stop();
    }
  });
  it("reads request bodies from the socket under the key's cap: declared, chunked, not UTF-8, valid", {
    timeout: 120_000,
  }, async () => {
    const log: string[] = [];
    const gateway = await startGateway(
      { ...config, dataDir: mkdtempSync(join(tmpdir(), "sandfork-server-body-")) },
      { log: (l) => log.push(l) },
    );
    try {
      const adminKey = log.join("\n").match(/sfk_[0-9A-Za-z]{38}/)?.[0] ?? "";
      const created = await fetch(`${gateway.url}/v1/keys`, {
        method: "POST",
        headers: { authorization: `Bearer ${adminKey}`, "content-type": "application/json" },
        body: JSON.stringify({ name: "small", max_body_bytes: 1024 }),
      });
      const key = ((await created.json()) as { key: string }).key;
      const post = (body: RequestInit["body"], extra: RequestInit = {}) =>
        fetch(`${gateway.url}/v1/executions`, {
          method: "POST",
          headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
          body,
          ...extra,
        });
      const problemOf = async (response: Response) => ({
        status: response.status,
        type: ((await response.json()) as { type: string }).type.split("/").pop(),
      });
      const big = JSON.stringify({ template: "python", code: "x".repeat(2048) });
      expect(await problemOf(await post(big))).toEqual({ status: 413, type: "payload-too-large" });
      const chunked = new ReadableStream({
        start(controller) {
          for (let i = 0; i < 4; i++)
            controller.enqueue(
              new TextEncoder().encode(i === 0 ? big.slice(0, 600) : "x".repeat(600)),
            );
          controller.close();
        },
      });
      expect(await problemOf(await post(chunked, { duplex: "half" } as RequestInit))).toEqual({
        status: 413,
        type: "payload-too-large",
      });
      expect(await problemOf(await post(new Uint8Array([0x7b, 0xff, 0x7d])))).toEqual({
        status: 400,
        type: "malformed-request",
      });
      expect(await problemOf(await post(JSON.stringify({ template: "Py thon", code: 1 })))).toEqual(
        { status: 422, type: "validation-failed" },
      );
      // A valid body passes validation and reaches the runtime, which is not connected here.
      expect(
        await problemOf(await post(JSON.stringify({ template: "python", code: "print(1)" }))),
      ).toEqual({ status: 503, type: "runtime-unavailable" });
    } finally {
      await gateway.stop();
    }
  });
});
