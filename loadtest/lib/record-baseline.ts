// The floor under the gateway's p50 on a PostgreSQL server: the daemon's run, then that run's
// record committed on the same server, from the load-test process, with no HTTP and no gateway.
// The record is the gateway's own (db/leases.ts: the same statement, tables, lease and account,
// billed as the gateway bills it: settlementOf), on a connection of its own named as a gateway's
// is, so whatever a committed record costs on this server and machine (the round trip, the
// statement, the flush, waking the backend) is in this figure, and what the gateway adds on top
// of it is the HTTP p50 minus this one.
import { randomUUID } from "node:crypto";
import type { OpenDatabase } from "../../db/client.js";
import { acquireLease, recordAll } from "../../db/leases.js";
import { openDatabase } from "../../db/open.js";
import { loadConfig } from "../../gateway/config.js";
import { settlementOf } from "../../gateway/execution-service.js";
import { costUnits, priceOf } from "../../gateway/pricing.js";
import type { ExecutionRequest, ExecutionResult } from "../../runtime/execution-runtime.js";

export interface RecordBaseline {
  /** Commits `result`'s record, as the gateway's answer to `request` would have, `totalMs` after it was sent. */
  record(request: ExecutionRequest, result: ExecutionResult, totalMs: number): Promise<void>;
  close(): Promise<void>;
}

/**
 * Opens a connection to `databaseUrl` holding a credit lease on the key's account for `executions`
 * records of `template` executions with `timeoutMs` (each holds its worst case, as the gateway's
 * do), priced as the gateway this process starts prices them (its configuration, from this environment).
 */
export async function openRecordBaseline(
  databaseUrl: string,
  key: { id: string; accountId: string },
  { executions, template, timeoutMs }: { executions: number; template: string; timeoutMs: number },
): Promise<RecordBaseline> {
  // Short enough that its session's application_name (63 bytes at most) holds it whole: other
  // gateways tell a live gateway from a gone one by it, and release a gone one's lease.
  const gatewayId = `loadtest-${randomUUID()}`;
  const open: OpenDatabase = await openDatabase({
    backend: "postgres",
    url: databaseUrl,
    maxConnections: 1,
    gatewayId,
  });
  try {
    const price = priceOf(loadConfig().pricing, template);
    const reservedUnits = costUnits(price, timeoutMs);
    const units = reservedUnits * executions;
    const leased = await acquireLease(open.db, {
      gatewayId,
      accountId: key.accountId,
      keyId: key.id,
      minUnits: units,
      maxUnits: units,
    });
    if (leased.kind !== "leased")
      throw new Error(`the record baseline got no lease of ${units} units: ${leased.kind}`);
    return {
      // A record beyond what the lease holds is refused by the database, as the gateway's would be.
      async record(request, result, totalMs) {
        await recordAll(open.db, [
          {
            executionId: request.executionId,
            accountId: key.accountId,
            keyId: key.id,
            tokenId: null,
            idempotencyKey: null,
            requestHash: "0".repeat(64),
            template,
            gatewayId,
            reservedUnits,
            createdAt: new Date(Date.now() - totalMs),
            settlement: settlementOf(result, {
              price,
              reservedUnits,
              timeoutMs,
              totalMs,
              networkGranted: false,
            }),
          },
        ]);
      },
      close: () => open.close(),
    };
  } catch (error) {
    await open.close();
    throw error;
  }
}
