// Builds left by a stopped gateway: on PostgreSQL several gateways share the rows, and a build
// runs in the process of the gateway that took it, so a build whose gateway is no longer
// connected will never end. The recovery pass (gateway/server.ts) marks those failed, naming the
// gateway, and leaves the live gateways' builds and every finished one as they are.
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  type CustomTemplateRow,
  failAbandonedBuilds,
  insertCustomTemplate,
  listVisibleTemplates,
  updateCustomTemplate,
} from "./custom-templates.js";
import { createAccount } from "./keys.js";
import { BACKENDS, type FreshDatabase, freshDatabase } from "./testing/fresh-database.js";

describe.each(BACKENDS)("template builds of stopped gateways on %s", (backend) => {
  let fresh: FreshDatabase;
  beforeAll(async () => {
    fresh = await freshDatabase(backend);
  });
  afterAll(async () => {
    await fresh?.dispose();
  });

  it("fails the queued and building rows of gateways not connected, naming the gateway", async () => {
    const accountId = await createAccount(fresh.db, "builds");
    const build = async (
      version: string,
      gatewayId: string,
      status: CustomTemplateRow["status"],
    ) => {
      const { row } = await insertCustomTemplate(fresh.db, {
        accountId,
        keyId: randomUUID(),
        name: "tool",
        version,
        definition: { base: "python" },
        gatewayId,
      });
      if (status !== "queued") await updateCustomTemplate(fresh.db, row.id, { status });
      return row.id;
    };
    await build("live-building", "gw-live", "building");
    await build("live-queued", "gw-live", "queued");
    await build("dead-building", "gw-dead", "building");
    await build("dead-queued", "gw-dead", "queued");
    await build("dead-ready", "gw-dead", "ready");

    expect(await failAbandonedBuilds(fresh.db, ["gw-live", "gw-other"])).toBe(2);
    const rows = new Map(
      (await listVisibleTemplates(fresh.db, accountId)).map((r) => [r.version, r]),
    );
    expect(Object.fromEntries([...rows].map(([version, r]) => [version, r.status]))).toEqual({
      "live-building": "building",
      "live-queued": "queued",
      "dead-building": "failed",
      "dead-queued": "failed",
      "dead-ready": "ready",
    });
    expect(rows.get("dead-building")?.error).toBe(
      "the gateway running the build (gw-dead) stopped before it ended; build it again",
    );
    expect(rows.get("dead-building")?.finishedAt).toBeInstanceOf(Date);
    // Once failed, a later pass finds nothing more; a failed version may be built again.
    expect(await failAbandonedBuilds(fresh.db, ["gw-live"])).toBe(0);
    const again = await insertCustomTemplate(fresh.db, {
      accountId,
      keyId: randomUUID(),
      name: "tool",
      version: "dead-building",
      definition: { base: "python" },
      gatewayId: "gw-live",
    });
    expect(again.created).toBe(true);
  });
});
