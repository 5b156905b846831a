// Named prepared statements on either backend: a statement is parsed and described once per
// connection, then each call only binds and executes it. On PGlite (in the gateway's own process)
// the parse, plan and result typing of drizzle's unnamed statements were most of what billing
// cost, in the gateway's own thread.
// Every column a statement returns is text (cast it in SQL), so both backends answer the same rows.
// Every parameter is text too, cast in SQL; a boolean goes through text (`$1::text::bool`): to a
// parameter PostgreSQL types bool, postgres.js sends anything but JavaScript's true as false.
import { PGlite, protocol } from "@electric-sql/pglite";
import type { Sql } from "postgres";
import type { Database } from "./client.js";
import { bindExecuteSync, readResponse } from "./pglite-wire.js";
import { JournaledPGlite } from "./record-journal.js";

export interface PreparedStatement {
  /** Unique among the statements of a process; names the server-side statement. */
  name: string;
  text: string;
}

export type TextRow = Record<string, string | null>;

type Param = string | null;

export interface RunOptions {
  /**
   * False: run without first waiting for the record journal's folds (db/record-journal.ts), which
   * every statement does by default. For the fold itself, and for a read of what no record the
   * journal holds can change.
   */
  waitForJournal?: boolean;
}

/** Runs `statement` with text parameters on the connection behind `db`; its rows, columns as text. */
export async function runPrepared(
  db: Database,
  statement: PreparedStatement,
  params: Param[],
  options?: RunOptions,
): Promise<TextRow[]> {
  const client = (db as unknown as { $client: unknown }).$client;
  if (client instanceof PGlite) {
    const journal =
      client instanceof JournaledPGlite && options?.waitForJournal !== false
        ? client.journal
        : undefined;
    if (journal !== undefined && !journal.upToDate) await journal.settled();
    return runOnPglite(client, statement, params);
  }
  const rows = await (client as Sql).unsafe(statement.text, params, { prepare: true });
  return rows as unknown as TextRow[];
}

/** The statements parsed on each PGlite instance, with their result columns. */
const pgliteStatements = new WeakMap<PGlite, Map<string, string[]>>();

const { serialize } = protocol;

interface ProtocolMessage {
  name: string;
}

/**
 * PGlite's protocol calls take neither of the locks its query() and transaction() hold, so this
 * takes both (as its describeQuery does): a statement never lands inside another caller's open
 * transaction.
 */
function runOnPglite(
  pg: PGlite,
  statement: PreparedStatement,
  params: Param[],
): Promise<TextRow[]> {
  return pg._runExclusiveTransaction(() =>
    pg._runExclusiveQuery(async () => {
      let parsed = pgliteStatements.get(pg);
      if (parsed === undefined) {
        parsed = new Map();
        pgliteStatements.set(pg, parsed);
      }
      let columns = parsed.get(statement.name);
      const call = bindExecuteSync(statement.name, params);
      const request =
        columns !== undefined
          ? call
          : Buffer.concat([
              serialize.parse({ name: statement.name, text: statement.text }),
              serialize.describe({ type: "S", name: statement.name }),
              call,
            ]);
      // syncToFs: false, as PGlite's query() inside a transaction: our data directories are NodeFS
      // or memory, whose syncToFs does nothing (writes reach the files as Postgres makes them),
      // and skipping it saves a mutex and two promises a statement.
      // The raw-data stream, not execProtocolRaw: that one also runs every response through
      // PGlite's parser and keeps the parsed messages until its next query() (a growing heap when
      // only prepared statements run). PGlite's chunks are views of its memory: copied.
      const chunks: Uint8Array[] = [];
      await pg.execProtocolRawStream(request, {
        syncToFs: false,
        onRawData: (chunk) => chunks.push(chunk.slice()),
      });
      const raw = chunks.length === 1 ? (chunks[0] as Uint8Array) : Buffer.concat(chunks);
      const response = readResponse(raw);
      // Described even when the call then failed: the statement exists from now on.
      if (response.columns !== undefined) {
        columns = response.columns;
        parsed.set(statement.name, columns);
      }
      if (response.failed) {
        // The same error object PGlite's own query() throws.
        let error: ProtocolMessage | undefined;
        new protocol.Parser().parse(raw, (message) => {
          if ((message as ProtocolMessage).name === "error") error ??= message as ProtocolMessage;
        });
        throw error ?? new Error(`PGlite failed ${statement.name} without saying why`);
      }
      const names = columns ?? [];
      return response.rows.map((values) => {
        const row: TextRow = {};
        for (const [i, value] of values.entries()) row[names[i] as string] = value;
        return row;
      });
    }),
  );
}

const PING: PreparedStatement = { name: "sandfork_ping", text: "SELECT 1" };

/**
 * Resolves when the database answers a statement (GET /healthz): prepared, since on PGlite an
 * unnamed statement's parse and plan run on the gateway's thread each time.
 */
export async function ping(db: Database): Promise<void> {
  await runPrepared(db, PING, []);
}
