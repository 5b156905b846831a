// Exactly once under faults, on KVM: the gateway as `npm start` runs it (gateway/main.ts in its own
// process, the real daemon supervised under it, the real python template), a few seconds of
// executions at 8 concurrent, and in the middle of it
//   - the gateway is killed with SIGKILL and started again on the same database, or
//   - the daemon is killed with SIGKILL (its supervisor restarts it).
// Half the requests carry an Idempotency-Key (on PostgreSQL reserved in the database before they
// run; on PGlite claimed in memory, gateway/idempotency-claims.ts), half do not (held of the
// gateway's credit lease in memory, recorded once they end: db/leases.ts).
// Then the books are reconciled: every execution answered 200 is billed exactly once (its record
// settled at the answered charge, its one entry), nothing is billed twice, no hold is left (the
// killed gateway's reservations and credit leases are released by the recovery pass of the next
// start: gateway/server.ts), what is reserved is exactly what live gateways' leases hold, the
// balance is the grant minus the settled usage, and a retry of every keyed request that got no
// answer or a retryable error, with its Idempotency-Key, gets 200 without a second charge.
//
// One test file a backend (gateway/exactly-once-pglite.kvm.test.ts, -postgres), so that the KVM
// tier's QEMU guests can run the two side by side. They need a /dev/kvm that runs guests, so they
// are not part of the normal vitest run (vitest.config.ts excludes *.kvm.test.ts); run them with
//   npx vitest run --config vitest.kvm.config.ts gateway/exactly-once-
// with TEST_DATABASE_URL set (scripts/postgres.sh) for the PostgreSQL one. Waits scale with
// SANDFORK_TEST_TIME_SCALE (1 native, ~15 in QEMU).
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { eq, sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { DatabaseBackend, OpenDatabase } from "../../db/client.js";
import { openDatabase } from "../../db/open.js";
import { JOURNAL_FILE } from "../../db/record-journal.js";
import { accounts, creditLeases, executions, usageLedger } from "../../db/schema.js";
import { type FreshDatabase, freshDatabase } from "../../db/testing/fresh-database.js";
import { requireVmmBinary } from "../../runtime/testing/real-daemon.js";
import { type GatewayProcess, issueKey, startGatewayProcess } from "./gateway-process.js";
import { scaledDaemonReadyEnv, templatesWithPrebuilt, timeScale } from "./kvm-tier.js";

const GRANT = 10_000_000;
const WORKERS = 8;
/**
 * Load before the kill (at least; killWhenAnswered also waits for answers), and (daemon case)
 * after the restart: a few seconds in all. Slower guests (QEMU: time scale 15) get more, but not
 * in proportion (~6 s there), so that the suite keeps a margin under the tier's suite limit.
 */
const LOAD_BEFORE_KILL_MS = 1_500 * Math.sqrt(timeScale);
const LOAD_AFTER_RESTART_MS = 1_000 * Math.sqrt(timeScale);
// A test that restarts the gateway or the daemon (migrations, the template's snapshot check, a
// warm pool) under load: ~20 s on a busy 2-core machine, more than the tier's default 30 s hang
// guard allows for.
const RESTART_TEST_TIMEOUT_MS = 120_000 * timeScale;
const BODY = JSON.stringify({ template: "python", code: "print(6*7)" });

interface Sent {
  /** The request's own name; sent as its Idempotency-Key when `keyed`. */
  idempotencyKey: string;
  keyed: boolean;
  /** undefined: no answer (the connection died with the gateway). */
  status: number | undefined;
  body: string;
}

interface Caller {
  key: string;
  accountId: string;
}

async function post(
  gateway: GatewayProcess,
  caller: Caller,
  idempotencyKey: string,
  keyed = true,
): Promise<Sent> {
  const headers: Record<string, string> = {
    authorization: `Bearer ${caller.key}`,
    "content-type": "application/json",
  };
  if (keyed) headers["idempotency-key"] = idempotencyKey;
  try {
    const response = await fetch(`${gateway.url}/v1/executions`, {
      method: "POST",
      headers,
      body: BODY,
      signal: AbortSignal.timeout(20_000 * timeScale),
    });
    return { idempotencyKey, keyed, status: response.status, body: await response.text() };
  } catch {
    return { idempotencyKey, keyed, status: undefined, body: "" };
  }
}

/**
 * When to kill: once a keyed and a keyless execution have been answered 200 (the tests need both
 * before the kill; on a slow path the first answers take longer than the load's few seconds) and
 * `atLeastMs` have passed; at the latest after 20 times that, with whatever was answered.
 */
function killWhenAnswered(atLeastMs: number): { onSent(sent: Sent): void; due: Promise<void> } {
  const seen = { keyed: false, keyless: false };
  let bothSeen = () => {};
  const answered = new Promise<void>((resolve) => (bothSeen = resolve));
  return {
    onSent(sent) {
      if (sent.status !== 200) return;
      seen[sent.keyed ? "keyed" : "keyless"] = true;
      if (seen.keyed && seen.keyless) bothSeen();
    },
    due: Promise.all([sleep(atLeastMs), Promise.race([answered, sleep(20 * atLeastMs)])]).then(
      () => {},
    ),
  };
}

/**
 * WORKERS loops sending executions until `until` resolves, each answer passed to `onSent`; each
 * request has its own name, every other one sent as its Idempotency-Key.
 */
function load(
  gateway: () => GatewayProcess,
  caller: Caller,
  prefix: string,
  until: Promise<unknown>,
  onSent: (sent: Sent) => void,
): Promise<Sent[]> {
  const sent: Sent[] = [];
  let stop = false;
  void until.then(() => (stop = true));
  let sequence = 0;
  const worker = async () => {
    // Bounded: stops at `until`, and after 10,000 requests whatever happens.
    while (!stop && sequence < 10_000) {
      const n = sequence++;
      const answer = await post(gateway(), caller, `${prefix}-${n}`, n % 2 === 0);
      sent.push(answer);
      onSent(answer);
    }
  };
  return Promise.all(Array.from({ length: WORKERS }, worker)).then(() => sent);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The tests on one backend. */
export function describeExactlyOnce(backend: DatabaseBackend): void {
  describe(`exactly once under SIGKILL, on ${backend}`, () => {
    let dir: string;
    let fresh: FreshDatabase | undefined;
    let gateway: GatewayProcess;
    /** Stopped to read the books (PGlite); started again when a test next needs it, not after the last. */
    let stoppedForBooks = false;
    let caller: Caller;
    // Across the tests on one account: every execution answered 200, and how many requests were not.
    const answeredEver = new Set<string>();
    let cutOffEver = 0;
    const start = () =>
      startGatewayProcess({
        dataDir: join(dir, "data"),
        socketPath: join(dir, "vmm.sock"),
        templatesDir: join(dir, "templates"),
        databaseUrl: fresh?.url,
        env: {
          SANDFORK_TEMPLATES: "python",
          SANDFORK_VMM_BIN: requireVmmBinary(),
          SANDFORK_VMM_SERVE_ARGS: "--pool-size 2",
          SANDFORK_VMM_BOOT_TIMEOUT_MS: String(30_000 * timeScale),
          ...scaledDaemonReadyEnv,
        },
        startTimeoutMs: 120_000 * timeScale,
      });

    beforeAll(async () => {
      dir = await mkdtemp(join(tmpdir(), "sfk-x1-"));
      await templatesWithPrebuilt(dir, ["python"]);
      if (backend === "postgres") fresh = await freshDatabase("postgres", { maxConnections: 2 });
      gateway = await start();
      caller = await issueKey(gateway, "exactly-once", GRANT);
    });

    afterAll(async () => {
      await gateway?.stop();
      await fresh?.dispose();
      if (dir !== undefined) await rm(dir, { recursive: true, force: true });
    });

    /**
     * Reads the books with the gateway stopped (PGlite admits one process) or beside it
     * (PostgreSQL). A stopped gateway is started again by running(), when it is next needed: in
     * QEMU a start costs minutes, and the last reconciliation needs none after it.
     */
    async function withBooks<T>(read: (open: OpenDatabase) => Promise<T>): Promise<T> {
      if (fresh !== undefined) return read(fresh);
      await gateway.stop();
      stoppedForBooks = true;
      const open = await openDatabase({ backend: "pglite", dataDir: join(dir, "data", "data") });
      try {
        return await read(open);
      } finally {
        await open.close();
      }
    }

    /** The gateway, started again if reading the books stopped it. */
    async function running(): Promise<GatewayProcess> {
      if (stoppedForBooks) {
        gateway = await start();
        stoppedForBooks = false;
      }
      return gateway;
    }

    /** Running executions and credit leases of the caller, read while the gateway is dead (so PGlite can be opened). */
    async function heldWhileDown(): Promise<{ running: number; leases: number }> {
      const dataDir = join(dir, "data", "data");
      // On PGlite, what the killed gateway answered and had not folded yet is in its record
      // journal (db/record-journal.ts), and opening the database bills it: every line, once.
      const journaled =
        fresh === undefined
          ? (await readFile(join(dataDir, JOURNAL_FILE), "utf8")).split("\n").length - 1
          : 0;
      const open = fresh ?? (await openDatabase({ backend: "pglite", dataDir }));
      if (open.journalReplay !== undefined) {
        console.log(
          `records the killed gateway left in its record journal: ${journaled}, billed at the next open: ${open.journalReplay.folded}`,
        );
        expect(open.journalReplay.folded + open.journalReplay.alreadyRecorded).toBe(journaled);
        expect(open.journalReplay.unreadable).toBe(0);
      }
      try {
        const rows = await open.db
          .select({ id: executions.id })
          .from(executions)
          .where(
            sql`${executions.accountId} = ${caller.accountId} AND ${executions.status} = 'running'`,
          );
        const leases = await open.db
          .select()
          .from(creditLeases)
          .where(eq(creditLeases.accountId, caller.accountId));
        return { running: rows.length, leases: leases.length };
      } finally {
        if (fresh === undefined) await open.close();
      }
    }

    /**
     * The reconciliation: what was answered is billed once, nothing else is held or billed twice;
     * of the requests that got no 200 (in this and the earlier tests on the account), some may be
     * billed once (committed, answer lost), and once the keyed ones were retried (`retried`) those
     * can only be keyless.
     */
    async function reconcile(
      answered: Map<string, { id: string; units: number }>,
      retried: boolean,
    ) {
      // One snapshot of the books: on PostgreSQL the live gateway may give an idle lease back between
      // two separate reads (the account's reserved units read before, the lease rows after).
      await withBooks(({ db }) =>
        db.transaction(
          async (tx) => {
            const rows = await tx
              .select()
              .from(executions)
              .where(eq(executions.accountId, caller.accountId));
            const byId = new Map(rows.map((r) => [r.id, r]));
            for (const [idempotencyKey, { id, units }] of answered) {
              expect(byId.get(id), `answered ${idempotencyKey}`).toMatchObject({
                status: "completed",
                chargedUnits: units,
              });
            }
            for (const a of answered.values()) answeredEver.add(a.id);
            const billedUnanswered = rows.filter(
              (r) => r.status === "completed" && !answeredEver.has(r.id),
            );
            expect(billedUnanswered.length).toBeLessThanOrEqual(cutOffEver);
            if (retried)
              expect(billedUnanswered.filter((r) => r.idempotencyKey !== null)).toEqual([]);
            // A record is its execution's one charge: only finished ones carry one; none still holds credits.
            expect(
              rows.filter((r) => (r.chargedUnits ?? 0) > 0 && r.status !== "completed"),
            ).toEqual([]);
            expect(rows.filter((r) => r.status === "running")).toEqual([]);
            // Each Idempotency-Key names at most one billed execution.
            const billedKeys = rows
              .filter((r) => r.status === "completed" && r.idempotencyKey !== null)
              .map((r) => r.idempotencyKey);
            expect(new Set(billedKeys).size).toBe(billedKeys.length);

            const [account] = await tx
              .select()
              .from(accounts)
              .where(eq(accounts.id, caller.accountId));
            const ledger = await tx
              .select()
              .from(usageLedger)
              .where(eq(usageLedger.accountId, caller.accountId));
            expect(ledger.map((l) => l.kind)).toEqual(["grant"]);
            const grants = ledger.reduce((sum, l) => sum + l.units, 0);
            const spent = rows.reduce((sum, r) => sum + (r.chargedUnits ?? 0), 0);
            expect(grants).toBe(GRANT);
            // Nothing is held but what the live gateway's credit lease holds (none of a dead one's).
            const leases = await tx
              .select()
              .from(creditLeases)
              .where(eq(creditLeases.accountId, caller.accountId));
            expect(
              new Set(leases.filter((l) => l.units > 0).map((l) => l.gatewayId)).size,
            ).toBeLessThanOrEqual(1);
            expect(account).toMatchObject({
              balanceUnits: grants - spent,
              reservedUnits: leases.reduce((sum, l) => sum + l.units, 0),
            });
            const [{ negative }] = (await tx
              .select({ negative: sql<number>`count(*)::int` })
              .from(accounts)
              .where(sql`${accounts.balanceUnits} < 0`)) as [{ negative: number }];
            expect(negative).toBe(0);
          },
          { isolationLevel: "repeatable read", accessMode: "read only" },
        ),
      );
    }

    /**
     * 200s by request name; everything else must be a retryable refusal or no answer at all. Only
     * keyed requests can be retried: a keyless one cut off is billed once (its record committed
     * before the answer was lost) or not at all.
     */
    function answeredOf(sent: Sent[]): {
      answered: Map<string, { id: string; units: number }>;
      unanswered: string[];
      cutOff: number;
    } {
      const answered = new Map<string, { id: string; units: number }>();
      const unanswered: string[] = [];
      for (const s of sent) {
        if (s.status === 200) {
          const body = JSON.parse(s.body) as {
            id: string;
            status: string;
            stdout: string;
            usage: { units: number };
          };
          expect(body).toMatchObject({ status: "completed", stdout: "42\n" });
          answered.set(s.idempotencyKey, { id: body.id, units: body.usage.units });
        } else {
          if (s.status !== undefined)
            expect(JSON.parse(s.body), s.body).toMatchObject({ retryable: true });
          if (s.keyed) unanswered.push(s.idempotencyKey);
        }
      }
      const cutOff = sent.filter((s) => s.status !== 200).length;
      cutOffEver += cutOff;
      return { answered, unanswered, cutOff };
    }

    /** Retries every request that got no 200, with its key: each now gets one, billed once. */
    async function retryUnanswered(
      unanswered: string[],
      answered: Map<string, { id: string; units: number }>,
    ) {
      for (const idempotencyKey of unanswered) {
        const gateway = await running();
        let retried = await post(gateway, caller, idempotencyKey);
        // A daemon restarting or a first attempt still settling answers retryably: try again shortly.
        for (let attempt = 0; attempt < 50 && retried.status !== 200; attempt++) {
          await sleep(100);
          retried = await post(gateway, caller, idempotencyKey);
        }
        expect(retried.status, retried.body).toBe(200);
        const body = JSON.parse(retried.body) as { id: string; usage: { units: number } };
        answered.set(idempotencyKey, { id: body.id, units: body.usage.units });
      }
    }

    it(
      "SIGKILL of the gateway mid-load: after the restart every 200 is billed once, the dead gateway's holds are released",
      async () => {
        await running();
        const trigger = killWhenAnswered(LOAD_BEFORE_KILL_MS);
        const killed = trigger.due.then(() => gateway.stop("SIGKILL"));
        const sent = await load(() => gateway, caller, "gateway-kill", killed, trigger.onSent);
        await killed;
        const { answered, unanswered, cutOff } = answeredOf(sent);
        expect(answered.size, "executions answered before the kill").toBeGreaterThan(0);
        expect(cutOff, "requests cut off by the kill").toBeGreaterThan(0);
        expect(
          sent.some((s) => s.status === 200 && !s.keyed),
          "keyless executions answered before the kill",
        ).toBe(true);

        // What the dead gateway left holding credits: exactly these the next start releases.
        const abandoned = await heldWhileDown();
        expect(abandoned.leases, "the dead gateway's credit lease").toBe(1);
        gateway = await start();
        const log = gateway.log.join("\n");
        const released = /released (\d+) reservation\(s\) left by a stopped gateway/.exec(log)?.[1];
        expect(Number(released ?? 0)).toBe(abandoned.running);
        const givenBack = /gave back (\d+) credit lease\(s\) of stopped gateways/.exec(log)?.[1];
        expect(Number(givenBack ?? 0)).toBe(abandoned.leases);
        // Before the retries too where the books can be read beside the gateway (PostgreSQL; on PGlite
        // it would cost another restart, and the reconciliation after the retries checks it all again).
        if (fresh !== undefined) await reconcile(answered, false);
        await retryUnanswered(unanswered, answered);
        await reconcile(answered, true);
      },
      RESTART_TEST_TIMEOUT_MS,
    );

    it(
      "SIGKILL of the daemon mid-load: every 200 is billed once, every failed execution released, retries bill once",
      async () => {
        const daemonPid = (await running()).daemonPid();
        const trigger = killWhenAnswered(LOAD_BEFORE_KILL_MS);
        const killed = trigger.due.then(() => process.kill(daemonPid, "SIGKILL"));
        // Load goes on through the restart of the daemon and a while after it.
        const sent = await load(
          () => gateway,
          caller,
          "daemon-kill",
          killed.then(() => sleep(LOAD_AFTER_RESTART_MS)),
          trigger.onSent,
        );
        const { answered, unanswered } = answeredOf(sent);
        expect(answered.size).toBeGreaterThan(0);
        expect(gateway.daemonPid(), "the supervisor restarted the daemon").not.toBe(daemonPid);

        // Before the retries too where the books can be read beside the gateway (PostgreSQL; on PGlite
        // it would cost another restart, and the reconciliation after the retries checks it all again).
        if (fresh !== undefined) await reconcile(answered, false);
        await retryUnanswered(unanswered, answered);
        await reconcile(answered, true);
      },
      RESTART_TEST_TIMEOUT_MS,
    );
  });
}
