// `npm run bench:usage` (flags: `-- --help`): what GET /v1/usage's query costs over a key's
// month, on PGlite (on disk, as the gateway keeps it) and on PostgreSQL (lib/postgres-server.ts).
// It inserts --executions records of one key at random times over --days days (and a tenth as
// many of another key), then times, in blocks taken in turn, the query as db/usage.ts runs it (whole
// hours from the hourly sums, the rest from the records) and the baseline: the same usage summed
// from the records alone, as it was before. The first query, which sums the key's hours, is timed
// on its own. Both answers must agree.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { sql } from "drizzle-orm";
import { type DatabaseBackend, type OpenDatabase, openDatabase } from "../db/client.js";
import { emptyPostgresDatabase } from "../db/testing/fresh-database.js";
import { insertRecords, usageFromRecords } from "../db/testing/usage-records.js";
import { usageForKey } from "../db/usage.js";
import { commandLine } from "../gateway/cli/command-line.js";
import { percentile } from "./lib/measure.js";
import { durabilityOf, postgresServer } from "./lib/postgres-server.js";

const { values, fail } = commandLine("npm run bench:usage -- [--executions N] [--days D] [--blocks B] [--databases pglite,postgres]", {
  executions: { type: "string", default: "300000" },
  days: { type: "string", default: "30" },
  blocks: { type: "string", default: "10" },
  databases: { type: "string", default: "pglite,postgres" },
});
const executions = Number(values.executions);
const days = Number(values.days);
const blocks = Number(values.blocks);
if (!Number.isSafeInteger(executions) || executions < 1) fail(`--executions: a positive integer, got ${values.executions}`);
if (!(days > 0)) fail(`--days: a positive number, got ${values.days}`);
if (!Number.isSafeInteger(blocks) || blocks < 1) fail(`--blocks: a positive integer, got ${values.blocks}`);
const databases = (values.databases ?? "").split(",");
for (const d of databases) if (d !== "pglite" && d !== "postgres") fail(`--databases: pglite or postgres, got ${d}`);

const QUERIES_PER_BLOCK = 5;
const KEY_ID = "00000000-0000-4000-8000-0000000000a1";
const OTHER_KEY_ID = "00000000-0000-4000-8000-0000000000a2";

async function timed<T>(run: () => Promise<T>): Promise<{ ms: number; value: T }> {
  const started = performance.now();
  const value = await run();
  return { ms: performance.now() - started, value };
}

const round = (ms: number) => Math.round(ms * 100) / 100;

async function measure(backend: DatabaseBackend, open: OpenDatabase): Promise<void> {
  const inserted = await timed(async () => {
    await insertRecords(open.db, KEY_ID, executions, days);
    await insertRecords(open.db, OTHER_KEY_ID, Math.ceil(executions / 10), days);
    // As autovacuum would have, for both queries alike (PGlite has no autovacuum).
    await open.db.execute(sql`VACUUM ANALYZE executions`);
  });
  const [from, to] = [new Date(Date.now() - (days + 1) * 86_400_000), new Date(Date.now() + 60_000)];
  const first = await timed(() => usageForKey(open.db, KEY_ID, from, to));
  const baseline = await usageFromRecords(open.db, KEY_ID, from, to);
  if (JSON.stringify(first.value) !== JSON.stringify(baseline)) {
    throw new Error(`the two queries disagree: ${JSON.stringify(first.value)} against ${JSON.stringify(baseline)}`);
  }
  const withSums: number[] = [];
  const fromRecords: number[] = [];
  for (let block = 0; block < blocks; block++) {
    const turns = block % 2 === 0 ? ([[withSums, usageForKey], [fromRecords, usageFromRecords]] as const) : ([[fromRecords, usageFromRecords], [withSums, usageForKey]] as const);
    for (const [times, query] of turns) {
      for (let i = 0; i < QUERIES_PER_BLOCK; i++) times.push((await timed(() => query(open.db, KEY_ID, from, to))).ms);
    }
  }
  const figures = (times: number[]) => {
    const sorted = [...times].sort((a, b) => a - b);
    return `p50 ${round(percentile(sorted, 50))} ms, p95 ${round(percentile(sorted, 95))} ms`;
  };
  console.log(`${backend}: ${first.value.executions} executions of the key in ${days} days (inserted in ${Math.round(inserted.ms)} ms)`);
  console.log(`  first query, summing the key's hours: ${round(first.ms)} ms`);
  console.log(`  usage with hourly sums (db/usage.ts), ${withSums.length} queries: ${figures(withSums)}`);
  console.log(`  baseline, summed from the records alone, ${fromRecords.length} queries: ${figures(fromRecords)}`);
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
        console.log(`PostgreSQL server: fsync=${durability.fsync}, synchronous_commit=${durability.synchronous_commit}`);
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
