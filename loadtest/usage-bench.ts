// `npm run bench:usage` (flags: `-- --help`): what GET /v1/usage's query costs over a key's
// month, on PGlite (on disk, as the gateway keeps it) and on PostgreSQL (lib/postgres-server.ts).
// It inserts --executions records of one key at random times over --days days, a third as many of
// a second key in the last 30 minutes (a busy current hour: before migration 0008 every query
// summed its records) and a tenth as many of a third key over the days. Then, for each of the
// first two keys, it times in blocks taken in turn the query as db/usage.ts runs it (sums up to 5
// s ago, the rest from the records) and the baseline: the same usage summed from the records
// alone, as it was before the sums. The first query, which sums the key's records, is timed on
// its own. Both answers must agree.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { sql } from "drizzle-orm";
import type { DatabaseBackend, OpenDatabase } from "../db/client.js";
import { openDatabase } from "../db/open.js";
import { emptyPostgresDatabase } from "../db/testing/fresh-database.js";
import { insertRecords, usageFromRecords } from "../db/testing/usage-records.js";
import { usageForKey } from "../db/usage.js";
import { commandLine } from "../gateway/cli/command-line.js";
import { percentile } from "./lib/measure.js";
import { durabilityOf, postgresServer } from "./lib/postgres-server.js";

const { values, fail } = commandLine(
  "npm run bench:usage -- [--executions N] [--days D] [--blocks B] [--databases pglite,postgres]",
  {
    executions: { type: "string", default: "300000" },
    days: { type: "string", default: "30" },
    blocks: { type: "string", default: "10" },
    databases: { type: "string", default: "pglite,postgres" },
  },
);
const executions = Number(values.executions);
const days = Number(values.days);
const blocks = Number(values.blocks);
if (!Number.isSafeInteger(executions) || executions < 1)
  fail(`--executions: a positive integer, got ${values.executions}`);
if (!(days > 0)) fail(`--days: a positive number, got ${values.days}`);
if (!Number.isSafeInteger(blocks) || blocks < 1)
  fail(`--blocks: a positive integer, got ${values.blocks}`);
const databases = (values.databases ?? "").split(",");
for (const d of databases)
  if (d !== "pglite" && d !== "postgres") fail(`--databases: pglite or postgres, got ${d}`);

const QUERIES_PER_BLOCK = 5;
/** The keys measured: one over the days, one busy in the last 30 minutes. */
const MEASURED = [
  { keyId: "00000000-0000-4000-8000-0000000000a1", count: executions, days, span: `${days} days` },
  {
    keyId: "00000000-0000-4000-8000-0000000000a3",
    count: Math.ceil(executions / 3),
    days: 30 / (24 * 60),
    span: "the last 30 minutes",
  },
];
const OTHER_KEY_ID = "00000000-0000-4000-8000-0000000000a2";

async function timed<T>(run: () => Promise<T>): Promise<{ ms: number; value: T }> {
  const started = performance.now();
  const value = await run();
  return { ms: performance.now() - started, value };
}

const round = (ms: number) => Math.round(ms * 100) / 100;

function figures(times: number[]): string {
  const sorted = [...times].sort((a, b) => a - b);
  return `p50 ${round(percentile(sorted, 50))} ms, p95 ${round(percentile(sorted, 95))} ms`;
}

async function measure(backend: DatabaseBackend, open: OpenDatabase): Promise<void> {
  const inserted = await timed(async () => {
    await insertRecords(open.db, OTHER_KEY_ID, Math.ceil(executions / 10), days);
    for (const key of MEASURED) await insertRecords(open.db, key.keyId, key.count, key.days);
    // As autovacuum would have, for both queries alike (PGlite has no autovacuum).
    await open.db.execute(sql`VACUUM ANALYZE executions`);
  });
  console.log(`${backend}: records inserted in ${Math.round(inserted.ms)} ms`);
  const [from, to] = [
    new Date(Date.now() - (days + 1) * 86_400_000),
    new Date(Date.now() + 60_000),
  ];
  for (const { keyId, span } of MEASURED) {
    const first = await timed(() => usageForKey(open.db, keyId, from, to));
    const baseline = await usageFromRecords(open.db, keyId, from, to);
    if (JSON.stringify(first.value) !== JSON.stringify(baseline)) {
      throw new Error(
        `the two queries disagree: ${JSON.stringify(first.value)} against ${JSON.stringify(baseline)}`,
      );
    }
    const withSums: number[] = [];
    const fromRecords: number[] = [];
    for (let block = 0; block < blocks; block++) {
      const turns =
        block % 2 === 0
          ? ([
              [withSums, usageForKey],
              [fromRecords, usageFromRecords],
            ] as const)
          : ([
              [fromRecords, usageFromRecords],
              [withSums, usageForKey],
            ] as const);
      for (const [times, query] of turns) {
        for (let i = 0; i < QUERIES_PER_BLOCK; i++)
          times.push((await timed(() => query(open.db, keyId, from, to))).ms);
      }
    }
    console.log(`  a key with ${first.value.executions} finished executions in ${span}:`);
    console.log(`    first query, summing the key's records: ${round(first.ms)} ms`);
    console.log(
      `    usage with the sums (db/usage.ts), ${withSums.length} queries: ${figures(withSums)}`,
    );
    console.log(
      `    baseline, summed from the records alone, ${fromRecords.length} queries: ${figures(fromRecords)}`,
    );
  }
}

let pg: { url: string; stop(): void } | undefined;
try {
  for (const backend of databases as DatabaseBackend[]) {
    if (backend === "pglite") {
      const dir = await mkdtemp(join(tmpdir(), "sfk-usage-bench-"));
      const open = await openDatabase({ backend: "pglite", dataDir: join(dir, "data") });
      try {
        await measure(backend, open);
      } finally {
        await open.close();
        await rm(dir, { recursive: true, force: true });
      }
    } else {
      pg = postgresServer({ dirName: "sandfork-bench-pg", port: 54342 });
      const durability = await durabilityOf(pg.url);
      const fresh = await emptyPostgresDatabase("sandfork_bench", pg.url);
      const open = await openDatabase({ backend: "postgres", url: fresh.url, maxConnections: 1 });
      try {
        console.log(
          `PostgreSQL server: fsync=${durability.fsync}, synchronous_commit=${durability.synchronous_commit}`,
        );
        await measure(backend, open);
      } finally {
        await open.close();
        await fresh.drop();
      }
    }
  }
} finally {
  pg?.stop();
}
