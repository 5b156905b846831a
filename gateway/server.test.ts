// The real process path: PGlite in a data directory, first-start bootstrap, HTTP on a socket, restart.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { openDatabase } from "../db/client.js";
import { type GatewayConfig, loadConfig } from "./config.js";
import { EMBEDDED_DATABASE_DIR, startGateway } from "./server.js";

describe("gateway process on embedded PGlite", () => {
  const dataDir = mkdtempSync(join(tmpdir(), "sandfork-server-test-"));
  const config: GatewayConfig = { ...loadConfig({}), dataDir, port: 0 };
  afterAll(() => rmSync(dataDir, { recursive: true, force: true }));

  it("prints an admin key once on first start, keeps data and the token key across restarts", { timeout: 120_000 }, async () => {
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
      const keys = (await (await fetch(`${first.url}/v1/keys`, { headers: auth })).json()) as { keys: { scopes: string[] }[] };
      expect(keys.keys).toHaveLength(1);
      expect(keys.keys[0]?.scopes).toEqual(["admin", "execute", "usage:read"]);
      const grantPath = firstLog.join("\n").match(/POST (\/v1\/accounts\/[0-9a-f-]+\/credits)/)?.[1];
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
      await expect(openDatabase({ backend: "pglite", dataDir: join(dataDir, EMBEDDED_DATABASE_DIR) })).rejects.toThrow(/in use by process/);
    } finally {
      await first.stop();
    }

    const secondLog: string[] = [];
    const second = await startGateway(config, { log: (l) => secondLog.push(l) });
    try {
      expect(secondLog.join("\n")).not.toMatch(/sfk_/);
      expect((await fetch(`${second.url}/v1/keys`, { headers: { authorization: `Bearer ${adminKey}` } })).status).toBe(200);
      // The signing key persisted in the data directory: a token minted before the restart still verifies.
      const templates = await fetch(`${second.url}/v1/templates`, { headers: { authorization: `Bearer ${token}` } });
      expect(templates.status).toBe(503);
    } finally {
      await second.stop();
    }
  });
});
