import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { findExecution } from "../../db/billing.js";
import { getBalance } from "../../db/keys.js";
import { accountWithKey } from "../../db/testing/accounts.js";
import { type FreshDatabase, freshDatabase } from "../../db/testing/fresh-database.js";
import type { ExecutionResult } from "../../runtime/execution-runtime.js";
import { daemonRequest as request } from "./execution.js";
import { openRecordBaseline } from "./record-baseline.js";

const result: ExecutionResult = {
  outcome: "completed",
  exitCode: 0,
  stdout: "42\n",
  stderr: "",
  truncated: false,
  timings: { queueMs: 0.1, forkMs: 0.2, execMs: 120.4 },
};

describe("the daemon-then-record baseline on PostgreSQL", () => {
  let fresh: FreshDatabase;
  beforeAll(async () => {
    fresh = await freshDatabase("postgres");
  });
  afterAll(async () => {
    await fresh?.dispose();
  });

  it("bills each record as the gateway would, on a lease of its executions' worst cases that the database holds it to", async () => {
    const ids = await accountWithKey(fresh.db, 1_000);
    const baseline = await openRecordBaseline(
      fresh.url as string,
      { id: ids.keyId, accountId: ids.accountId },
      { executions: 2, template: "python", timeoutMs: 5_000 },
    );
    try {
      // The default price: 1 unit + 10 a second; a 5 s timeout holds 51, 120.6 ms of fork and run charge 3.
      expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
        balanceUnits: 1_000,
        reservedUnits: 102,
      });
      const first = request();
      await baseline.record(first, result, 121.3);
      expect(await findExecution(fresh.db, first.executionId)).toMatchObject({
        status: "completed",
        stdout: "42\n",
        reservedUnits: 51,
        chargedUnits: 3,
        keyId: ids.keyId,
      });
      expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
        balanceUnits: 997,
        reservedUnits: 99,
      });
      // Charged as the gateway charges: never past the timeout (5 s: 51 units).
      const long = { ...result, timings: { ...result.timings, execMs: 9_000 } };
      const second = request();
      await baseline.record(second, long, 9_001);
      expect(await findExecution(fresh.db, second.executionId)).toMatchObject({ chargedUnits: 51 });
      expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
        balanceUnits: 946,
        reservedUnits: 48,
      });
      // The lease has 48 units left: the database refuses a charge of 51, and bills nothing of it.
      const third = request();
      await expect(baseline.record(third, long, 9_001)).rejects.toThrow();
      expect(await findExecution(fresh.db, third.executionId)).toBeUndefined();
      expect(await getBalance(fresh.db, ids.accountId)).toMatchObject({
        balanceUnits: 946,
        reservedUnits: 48,
      });
    } finally {
      await baseline.close();
    }
  });
});
