// Sandfork's billing database. Every amount of credit is an integer number of billing units
// (bigint columns read as JS numbers: exact up to 2^53 - 1, the most a balance holds, which
// grantCredits in keys.ts enforces: only a grant adds to a balance).
import { sql } from "drizzle-orm";
import {
  bigint,
  bigserial,
  boolean,
  check,
  customType,
  doublePrecision,
  index,
  integer,
  jsonb,
  numeric,
  pgTable,
  primaryKey,
  text,
  timestamp,
  uniqueIndex,
  uuid,
} from "drizzle-orm/pg-core";

export const accounts = pgTable(
  "accounts",
  {
    id: uuid("id").primaryKey().defaultRandom(),
    name: text("name").notNull(),
    // Credits granted and not yet spent. Reserved credits are part of the balance until settled.
    balanceUnits: bigint("balance_units", { mode: "number" }).notNull().default(0),
    // Credits held by executions in flight (reserve, then settle) and by gateways' credit leases.
    reservedUnits: bigint("reserved_units", { mode: "number" }).notNull().default(0),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [
    // The database itself refuses any update that would overspend, whatever the caller does.
    check("accounts_balance_non_negative", sql`${t.balanceUnits} >= 0`),
    check("accounts_reserved_non_negative", sql`${t.reservedUnits} >= 0`),
    check("accounts_reserved_within_balance", sql`${t.reservedUnits} <= ${t.balanceUnits}`),
  ],
);

export const apiKeys = pgTable(
  "api_keys",
  {
    id: uuid("id").primaryKey().defaultRandom(),
    accountId: uuid("account_id")
      .notNull()
      .references(() => accounts.id),
    name: text("name").notNull(),
    // SHA-256 of the whole key, hex. The key itself is never stored.
    keyHash: text("key_hash").notNull(),
    // Non-secret reminder shown in listings, e.g. "sfk_…9xQ2".
    hint: text("hint").notNull(),
    scopes: text("scopes").array().notNull(),
    expiresAt: timestamp("expires_at", { withTimezone: true }),
    revokedAt: timestamp("revoked_at", { withTimezone: true }),
    rateLimitPerMinute: integer("rate_limit_per_minute").notNull(),
    maxConcurrency: integer("max_concurrency").notNull(),
    maxBodyBytes: integer("max_body_bytes").notNull(),
    // What the key's executions may reach over the network ({allow, maxConnections?, maxBytes?},
    // gateway/network-policy.ts); null: no network at all.
    networkPolicy: jsonb("network_policy"),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [
    uniqueIndex("api_keys_key_hash_unique").on(t.keyHash),
    index("api_keys_account_idx").on(t.accountId),
    check(
      "api_keys_limits_positive",
      sql`${t.rateLimitPerMinute} > 0 AND ${t.maxConcurrency} > 0 AND ${t.maxBodyBytes} > 0`,
    ),
  ],
);

export const executions = pgTable(
  "executions",
  {
    id: uuid("id").primaryKey(),
    // The account and API key it ran for (accounts.id, api_keys.id). Not foreign keys: every record
    // is written from an authenticated key's own row, and neither accounts nor keys are ever
    // deleted (a key is revoked), so the checks could never fail, while on this, the one insert of
    // every execution, they were two index lookups and a KEY SHARE row lock on the account each
    // (migration 0006_executions_without_foreign_keys).
    accountId: uuid("account_id").notNull(),
    keyId: uuid("key_id").notNull(),
    // Set when the call came with a minted token rather than the key itself.
    tokenId: text("token_id"),
    idempotencyKey: text("idempotency_key"),
    // SHA-256 of the canonical request: a reused Idempotency-Key with another request is refused.
    requestHash: text("request_hash").notNull(),
    template: text("template").notNull(),
    // The gateway process that reserved it (its database session's application_name says it is
    // alive): a running execution of a gateway that is gone is released at the next start.
    gatewayId: text("gateway_id"),
    // running → completed | timed_out | memory_exceeded | output_exceeded | crashed | unsupported_syscall | deadlocked
    // | network_exceeded, or aborted (the runtime failed; not billed)
    status: text("status").notNull(),
    exitCode: integer("exit_code"),
    stdout: text("stdout"),
    stderr: text("stderr"),
    truncated: boolean("truncated"),
    timings: jsonb("timings"),
    // What it did on the network ({bytesIn, bytesOut, connections, refused, dnsQueries}); null
    // when it was granted none.
    network: jsonb("network"),
    reservedUnits: bigint("reserved_units", { mode: "number" }).notNull(),
    chargedUnits: bigint("charged_units", { mode: "number" }),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
    // The database's now() (its transaction's start) in every statement that bills a record: the
    // usage sums rely on it (db/usage.ts). A record from embedded PGlite's record journal carries
    // when it was answered instead: every statement there first folds the journal, so no record
    // lands before a mark set after it was answered (db/record-journal.ts). An aborted record,
    // never usage, may carry another clock's.
    finishedAt: timestamp("finished_at", { withTimezone: true }),
  },
  (t) => [
    // Only keyed requests are deduplicated; a record without a key (most: every leased one) adds
    // no entry to this index, nor to the next, which holds only what is still running (the
    // recovery pass at each start reads those).
    uniqueIndex("executions_key_idempotency_unique")
      .on(t.keyId, t.idempotencyKey)
      .where(sql`${t.idempotencyKey} IS NOT NULL`),
    index("executions_running_idx").on(t.createdAt).where(sql`${t.status} = 'running'`),
    // A key's usage over a period (db/usage.ts): each finished record is its execution's entry in
    // the accounts' journal (its charged units), the usage ledger holds only grants and sessions.
    index("executions_key_finished_idx").on(t.keyId, t.finishedAt),
  ],
);

// A key's usage by hour (db/usage.ts): what its finished executions of each template were charged
// in each hour before its mark in execution_usage_keys, summed once (migrations
// 0007_execution_usage_hours, 0008_usage_sums_to_the_horizon); the row of the hour the mark falls
// in holds its part before the mark. A usage query reads these for its whole hours instead of
// every record, and the records themselves only for the hours at its ends and the last seconds.
export const executionUsageHours = pgTable(
  "execution_usage_hours",
  {
    keyId: uuid("key_id").notNull(),
    hour: timestamp("hour", { withTimezone: true }).notNull(),
    template: text("template").notNull(),
    executions: bigint("executions", { mode: "number" }).notNull(),
    units: bigint("units", { mode: "number" }).notNull(),
    // Network bytes and refusals of those executions (migration 0014_network_egress).
    networkBytesIn: bigint("network_bytes_in", { mode: "number" }).notNull().default(0),
    networkBytesOut: bigint("network_bytes_out", { mode: "number" }).notNull().default(0),
    networkRefused: bigint("network_refused", { mode: "number" }).notNull().default(0),
  },
  (t) => [primaryKey({ columns: [t.keyId, t.hour, t.template] })],
);

// How far each key's usage is summed: every execution that finished before `rolledUpBefore` is in
// execution_usage_hours (an hour with no executions has no row there).
export const executionUsageKeys = pgTable("execution_usage_keys", {
  keyId: uuid("key_id").primaryKey(),
  rolledUpBefore: timestamp("rolled_up_before", { withTimezone: true }).notNull(),
});

// A gateway's credit lease on an account (gateway/credit-leases.ts): credits it took from the
// account's available balance in one transaction and holds executions against in memory. They are
// part of the account's reserved units until spent (each execution's charge leaves both) or given
// back; a dead gateway's leases are given back by the next start's recovery pass.
export const creditLeases = pgTable(
  "credit_leases",
  {
    gatewayId: text("gateway_id").notNull(),
    accountId: uuid("account_id")
      .notNull()
      .references(() => accounts.id),
    // Held and not yet spent or given back.
    units: bigint("units", { mode: "number" }).notNull(),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [
    primaryKey({ columns: [t.gatewayId, t.accountId] }),
    check("credit_leases_units_non_negative", sql`${t.units} >= 0`),
  ],
);

// Stateful sessions (gateway/session-service.ts): a VM of the daemon's kept between requests.
// Their running time and stored checkpoints accrue here and are charged as they accrue.
export const sessions = pgTable(
  "sessions",
  {
    id: uuid("id").primaryKey(),
    accountId: uuid("account_id")
      .notNull()
      .references(() => accounts.id),
    keyId: uuid("key_id")
      .notNull()
      .references(() => apiKeys.id),
    tokenId: text("token_id"),
    template: text("template").notNull(),
    // running → paused → running ... → ended (its VM gone: the program stopped, or lost with no
    // checkpoint) → deleted. Only deleted sessions hold no checkpoints.
    state: text("state").notNull(),
    memoryMib: integer("memory_mib").notNull(),
    idleTimeoutS: integer("idle_timeout_s").notNull(),
    maxLifetimeS: integer("max_lifetime_s").notNull(),
    lastCheckpoint: integer("last_checkpoint"),
    lastCheckpointSha256: text("last_checkpoint_sha256"),
    // Bytes of the session's checkpoints on the daemon's disk now.
    checkpointBytes: bigint("checkpoint_bytes", { mode: "number" }).notNull().default(0),
    cells: integer("cells").notNull().default(0),
    // Set while the session holds a running VM: the start of the running time not yet accrued.
    runningSince: timestamp("running_since", { withTimezone: true }),
    // The end of the checkpoint storage time already accrued.
    storageSince: timestamp("storage_since", { withTimezone: true }).notNull().defaultNow(),
    // Accrued, exact: MiB of memory limit x milliseconds running; checkpoint bytes x milliseconds.
    runningMibMs: numeric("running_mib_ms").notNull().default("0"),
    storageByteMs: numeric("storage_byte_ms").notNull().default("0"),
    // Units charged for the running time and storage so far (cells are charged as executions).
    chargedUnits: bigint("charged_units", { mode: "number" }).notNull().default(0),
    endedReason: text("ended_reason"),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
    lastActiveAt: timestamp("last_active_at", { withTimezone: true }).notNull().defaultNow(),
    endedAt: timestamp("ended_at", { withTimezone: true }),
    // In a cluster, the node whose daemon holds the session (nodes.id); null on a single host.
    // Any gateway routes the session's requests there; a dead node's sessions move to another.
    nodeId: text("node_id"),
  },
  (t) => [
    index("sessions_key_state_idx").on(t.keyId, t.state),
    index("sessions_state_active_idx").on(t.state, t.lastActiveAt),
    check("sessions_state_known", sql`${t.state} IN ('running', 'paused', 'ended', 'deleted')`),
    check(
      "sessions_charged_non_negative",
      sql`${t.chargedUnits} >= 0 AND ${t.checkpointBytes} >= 0`,
    ),
  ],
);

// The nodes of a cluster (db/nodes.ts): each runs a VMM daemon served to gateways
// over mutual TLS at `address`, and rewrites its row every heartbeat. A gateway routes calls only
// to nodes whose heartbeat is fresh (cluster/placement.ts).
export const nodes = pgTable(
  "nodes",
  {
    id: text("id").primaryKey(),
    // host:port of its TLS endpoint, as gateways dial it.
    address: text("address").notNull(),
    // Templates its daemon serves ready to run.
    templates: text("templates").array().notNull(),
    // Executions it runs at once (its daemon's --max-concurrency), and how many it runs or queues now.
    capacity: integer("capacity").notNull(),
    load: integer("load").notNull(),
    startedAt: timestamp("started_at", { withTimezone: true }).notNull().defaultNow(),
    heartbeatAt: timestamp("heartbeat_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [
    index("nodes_heartbeat_idx").on(t.heartbeatAt),
    check("nodes_load_non_negative", sql`${t.capacity} > 0 AND ${t.load} >= 0`),
  ],
);

// Per-key limits shared by every gateway of a cluster (db/key-limits.ts): the executions each
// gateway runs for a key now (a dead gateway's rows are deleted by the live gateways' recovery
// pass), and each key's rate-limit token bucket.
export const keySlots = pgTable(
  "key_slots",
  {
    keyId: uuid("key_id").notNull(),
    gatewayId: text("gateway_id").notNull(),
    running: integer("running").notNull(),
  },
  (t) => [
    primaryKey({ columns: [t.keyId, t.gatewayId] }),
    check("key_slots_running_non_negative", sql`${t.running} >= 0`),
  ],
);

export const keyRates = pgTable("key_rates", {
  keyId: uuid("key_id").primaryKey(),
  // Requests the key may still make now (refilled at its rate per minute, up to one minute's).
  tokens: doublePrecision("tokens").notNull(),
  updatedAt: timestamp("updated_at", { withTimezone: true }).notNull(),
});

export const usageLedger = pgTable(
  "usage_ledger",
  {
    id: bigserial("id", { mode: "number" }).primaryKey(),
    accountId: uuid("account_id")
      .notNull()
      .references(() => accounts.id),
    keyId: uuid("key_id").references(() => apiKeys.id),
    sessionId: uuid("session_id").references(() => sessions.id),
    // "grant": credits added by an operator; "session": a session's running time and checkpoint
    // storage accrued since its last entry. An execution's charge is its record's charged_units
    // (one row and one statement, where a ledger row beside it cost a second insert each).
    kind: text("kind").notNull(),
    template: text("template"),
    units: bigint("units", { mode: "number" }).notNull(),
    // For "session" entries: what accrued (MiB x ms running, checkpoint bytes x ms stored).
    runningMibMs: numeric("running_mib_ms"),
    storageByteMs: numeric("storage_byte_ms"),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [
    index("usage_ledger_key_created_idx").on(t.keyId, t.createdAt),
    check("usage_ledger_units_non_negative", sql`${t.units} >= 0`),
    check("usage_ledger_kind_known", sql`${t.kind} IN ('grant', 'session')`),
  ],
);

/** PostgreSQL's bytea, read as a Buffer on both backends (postgres.js and PGlite differ). */
const bytea = customType<{ data: Buffer; driverData: Uint8Array }>({
  dataType: () => "bytea",
  fromDriver: (value) => Buffer.from(value),
});

// Files executions left under /work/out (db/output-files.ts), kept until expires_at for their
// account to download from any gateway, and counted against their key's output-file quota.
// No foreign keys: an execution's record may be written after its files (executions has none).
export const outputFiles = pgTable(
  "output_files",
  {
    executionId: uuid("execution_id").notNull(),
    // Relative to /work/out, as the guest named it and the gateway checked it.
    path: text("path").notNull(),
    accountId: uuid("account_id").notNull(),
    keyId: uuid("key_id").notNull(),
    // The token that ran the execution (null for the key itself): a token sees only its own.
    tokenId: text("token_id"),
    bytes: bigint("bytes", { mode: "number" }).notNull(),
    content: bytea("content").notNull(),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
    expiresAt: timestamp("expires_at", { withTimezone: true }).notNull(),
  },
  (t) => [
    primaryKey({ columns: [t.executionId, t.path] }),
    index("output_files_key_expires_idx").on(t.keyId, t.expiresAt),
    index("output_files_expires_idx").on(t.expiresAt),
    check("output_files_bytes_non_negative", sql`${t.bytes} >= 0`),
  ],
);

// Templates built through the API (POST /v1/templates): one row per name@version of an account,
// which is also its build (queued, building, then ready or failed). The runtime serves a ready one
// as `tpl-<id>` (gateway/template-service.ts).
export const customTemplates = pgTable(
  "custom_templates",
  {
    id: uuid("id").primaryKey().defaultRandom(),
    accountId: uuid("account_id")
      .notNull()
      .references(() => accounts.id),
    // The key that asked for the build.
    keyId: uuid("key_id").notNull(),
    name: text("name").notNull(),
    version: text("version").notNull(),
    // The definition as the API took it (files, wheels and setup program included).
    definition: jsonb("definition").notNull(),
    status: text("status").notNull(),
    // The build step running, or the one that failed.
    step: text("step"),
    error: text("error"),
    logs: text("logs").notNull().default(""),
    imageBytes: bigint("image_bytes", { mode: "number" }),
    snapshotBytes: bigint("snapshot_bytes", { mode: "number" }),
    // Visible to every account (an admin publishes it).
    published: boolean("published").notNull().default(false),
    // The gateway running the build: one no longer connected (db/billing.ts, liveGatewayIds)
    // will not finish it, and the recovery pass marks it failed.
    gatewayId: text("gateway_id"),
    createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
    finishedAt: timestamp("finished_at", { withTimezone: true }),
  },
  (t) => [
    uniqueIndex("custom_templates_account_name_version_unique").on(t.accountId, t.name, t.version),
    index("custom_templates_name_idx").on(t.name),
    check(
      "custom_templates_status_known",
      sql`${t.status} IN ('queued', 'building', 'ready', 'failed')`,
    ),
  ],
);

export const schema = {
  customTemplates,
  accounts,
  apiKeys,
  executions,
  executionUsageHours,
  executionUsageKeys,
  creditLeases,
  sessions,
  nodes,
  keySlots,
  keyRates,
  usageLedger,
  outputFiles,
};
