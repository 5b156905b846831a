// Test support: an execution that ran on a gateway's credit lease and is ready to be recorded
// (db/leases.ts): it printed "42", finished 5 ms after it started, and was charged `chargedUnits`.
import { randomUUID } from "node:crypto";
import type { LeasedExecution } from "../leases.js";

export function leasedExecution(
  ids: { accountId: string; keyId: string },
  gatewayId: string,
  reservedUnits: number,
  chargedUnits: number,
): LeasedExecution {
  return {
    executionId: randomUUID(),
    ...ids,
    tokenId: null,
    idempotencyKey: null,
    requestHash: "h".repeat(64),
    template: "python",
    gatewayId,
    reservedUnits,
    createdAt: new Date(Date.now() - 5),
    settlement: {
      status: "completed",
      exitCode: 0,
      stdout: "42\n",
      stderr: "",
      truncated: false,
      timings: { queueMs: 0, forkMs: 1, execMs: 2, totalMs: 3 },
      network: null,
      chargedUnits,
    },
  };
}
