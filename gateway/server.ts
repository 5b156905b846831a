// Starting a gateway process: open (and migrate) the database, release the reservations of
// gateway processes that are gone, bootstrap the first admin key, serve HTTP.
import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { type ServerType, serve } from "@hono/node-server";
import { liveGatewayIds, releaseAbandonedReservations } from "../db/billing.js";
import type { OpenDatabase } from "../db/client.js";
import { failAbandonedBuilds } from "../db/custom-templates.js";
import { releaseAbandonedKeySlots } from "../db/key-limits.js";
import { countKeys } from "../db/keys.js";
import { releaseAbandonedLeases } from "../db/leases.js";
import { openDatabase } from "../db/open.js";
import type { ExecutionRuntime } from "../runtime/execution-runtime.js";
import { createGateway } from "./app.js";
import { loadSigningKey, TokenService } from "./auth/tokens.js";
import { EMBEDDED_DATABASE_DIR, type GatewayConfig } from "./config.js";
import { type IssuedKey, issueKey } from "./key-service.js";
import { createTelemetry } from "./telemetry.js";

/** An execution older than its longest timeout plus this is certainly not running any more, whoever ran it. */
const STALE_RESERVATION_MARGIN_MS = 60_000;

/** `gatewayId`: this process's id, which its PostgreSQL sessions carry (see liveGatewayIds). */
export function openConfiguredDatabase(
  config: GatewayConfig,
  gatewayId?: string,
): Promise<OpenDatabase> {
  return config.databaseUrl !== undefined
    ? openDatabase({
        backend: "postgres",
        url: config.databaseUrl,
        ...(gatewayId === undefined ? {} : { gatewayId }),
      })
    : openDatabase({ backend: "pglite", dataDir: join(config.dataDir, EMBEDDED_DATABASE_DIR) });
}

/** On an empty database, creates the operator's admin key; returns the secret, or null. */
async function bootstrapAdminKey(
  open: OpenDatabase,
  config: GatewayConfig,
): Promise<IssuedKey | null> {
  if ((await countKeys(open.db)) > 0) return null;
  return issueKey(open.db, {
    name: "operator",
    scopes: ["admin", "execute", "usage:read"],
    limits: config.defaultKeyLimits,
  });
}

/** Releases the holds of gateways that are gone (see releaseAbandonedReservations, releaseAbandonedLeases). */
async function recoveryPass(
  open: OpenDatabase,
  gatewayId: string,
  config: GatewayConfig,
  log: (line: string) => void,
): Promise<void> {
  const staleBefore = new Date(
    Date.now() - config.executionLimits.maxTimeoutMs - STALE_RESERVATION_MARGIN_MS,
  );
  const live = await liveGatewayIds(open, gatewayId);
  const released = await releaseAbandonedReservations(open.db, live, staleBefore);
  if (released > 0) log(`released ${released} reservation(s) left by a stopped gateway`);
  const slots = await releaseAbandonedKeySlots(open.db, live);
  if (slots > 0) log(`freed the key slots of ${slots} stopped gateway(s) and key(s)`);
  const builds = await failAbandonedBuilds(open.db, live);
  if (builds > 0) log(`marked ${builds} template build(s) of stopped gateways failed`);
  const givenBack = await releaseAbandonedLeases(open.db, live);
  if (givenBack.leases > 0)
    log(
      `gave back ${givenBack.leases} credit lease(s) of stopped gateways (${givenBack.units} units)`,
    );
}

export interface RunningGateway {
  url: string;
  server: ServerType;
  stop(): Promise<void>;
}

export async function startGateway(
  config: GatewayConfig,
  options: { runtime?: () => ExecutionRuntime | undefined; log?: (line: string) => void } = {},
): Promise<RunningGateway> {
  const log = options.log ?? ((line: string) => console.log(line));
  const gatewayId = randomUUID();
  const open = await openConfiguredDatabase(config, gatewayId);
  const replay = open.journalReplay;
  if (replay !== undefined && replay.folded > 0)
    log(
      `billed ${replay.folded} execution(s) a stopped gateway had answered, from its record journal`,
    );
  if (replay !== undefined && replay.unreadable > 0) {
    log(
      `skipped ${replay.unreadable} unreadable line(s) of the record journal (appends that failed: their executions were not answered)`,
    );
  }
  // The recovery pass: executions a killed gateway never answered, and its credit leases, hold
  // credits until released here; its template builds will never end and are marked failed. On PostgreSQL, where other gateways share the books, it runs
  // again every recoveryIntervalMs, so that a gateway that died is not waited for until the
  // next start.
  const recover = () => recoveryPass(open, gatewayId, config, log);
  await recover();
  const recovery =
    open.backend === "postgres"
      ? setInterval(
          () =>
            void recover().catch((error: unknown) =>
              log(`the recovery pass failed: ${String(error)}`),
            ),
          config.recoveryIntervalMs,
        )
      : undefined;
  recovery?.unref();

  const admin = await bootstrapAdminKey(open, config);
  if (admin !== null) {
    log("");
    log("First start on an empty database: created an admin API key. It is shown only this once:");
    log(`  ${admin.key}`);
    log(
      `Its account has no credits yet: grant some with POST /v1/accounts/${admin.stored.accountId}/credits {"units": N}.`,
    );
    log("Create keys for callers with POST /v1/keys (or `npm run keys:create`).");
    log("");
  }

  const telemetry = createTelemetry();
  const tokens = new TokenService(
    loadSigningKey(config.tokenSigningKeyPem, config.dataDir),
    config.tokenIssuer,
    config.tokenAudience,
  );
  const shutdown = new AbortController();
  const { app, context } = createGateway({
    db: open.db,
    listen: open.listen,
    gatewayId,
    config,
    telemetry,
    tokens,
    runtime: options.runtime ?? (() => undefined),
    shutdownSignal: shutdown.signal,
  });
  await context.leases.start();
  // Idle sessions pause themselves, expired ones end.
  context.sessions.start();
  // Output files past their time are deleted.
  context.outputFiles.start();
  const server = await new Promise<ServerType>((resolve) => {
    const s = serve(
      {
        fetch: app.fetch,
        hostname: config.host,
        port: config.port,
        // Node checks these timeouts every connectionsCheckingInterval (30 s by default), so a
        // slow client would get up to that much more: check as often as the tighter one needs.
        serverOptions: {
          headersTimeout: config.headersTimeoutMs,
          requestTimeout: config.requestTimeoutMs,
          connectionsCheckingInterval: Math.min(config.headersTimeoutMs, 1_000),
        },
      },
      () => resolve(s),
    );
  });
  const address = server.address();
  const port = typeof address === "object" && address !== null ? address.port : config.port;
  const url = `http://${config.host.includes(":") ? `[${config.host}]` : config.host}:${port}`;
  const database =
    config.databaseUrl !== undefined
      ? "PostgreSQL (DATABASE_URL)"
      : `PGlite in ${join(config.dataDir, EMBEDDED_DATABASE_DIR)}`;
  log(`sandfork gateway listening on ${url} (database: ${database}); API docs at ${url}/docs`);
  if (options.runtime === undefined)
    log("no execution runtime connected: POST /v1/executions answers 503 runtime-unavailable");

  return {
    url,
    server,
    /**
     * Stops accepting requests and lets in-flight executions finish (and settle) for up to the
     * longest execution timeout; past that they are aborted and their reservations released.
     */
    async stop() {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      // Keep-alive connections would hold close() open; in-flight requests still finish.
      if ("closeIdleConnections" in server) server.closeIdleConnections();
      let drainTimer: NodeJS.Timeout | undefined;
      const drained = await Promise.race([
        closed.then(() => true),
        new Promise<boolean>(
          (resolve) =>
            (drainTimer = setTimeout(() => resolve(false), config.executionLimits.maxTimeoutMs)),
        ),
      ]);
      clearTimeout(drainTimer);
      clearInterval(recovery);
      context.sessions.stop();
      context.outputFiles.stop();
      if (!drained) {
        shutdown.abort();
        await closed;
      }
      // What is still held (an execution that would not end) the next start's recovery pass frees.
      await context.leases
        .close()
        .catch((error: unknown) => log(`credit leases not given back: ${String(error)}`));
      await telemetry.shutdown();
      await open.close();
    },
  };
}
