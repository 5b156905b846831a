// Named prepared statements on either backend: a statement is parsed and described once per
// connection, then each call only binds and executes it. On PGlite (in the gateway's own process)
// the parse, plan and result typing of drizzle's unnamed statements were most of what billing
// cost: the reserve and settle of one execution took ~1.1 ms of CPU that way, ~0.4 ms prepared
// (a throwaway benchmark; README, Performance).
// Every column a statement returns is text (cast it in SQL), so both backends answer the same rows.
import { PGlite, protocol } from "@electric-sql/pglite";
import type { Sql } from "postgres";
import type { Database } from "./client.js";

export interface PreparedStatement {
  /** Unique among the statements of a process; names the server-side statement. */
  name: string;
  text: string;
}

export type TextRow = Record<string, string | null>;

type Param = string | null;

/** Runs `statement` with text parameters on the connection behind `db`; its rows, columns as text. */
export async function runPrepared(db: Database, statement: PreparedStatement, params: Param[]): Promise<TextRow[]> {
  const client = (db as unknown as { $client: unknown }).$client;
  if (client instanceof PGlite) return runOnPglite(client, statement, params);
  const rows = await (client as Sql).unsafe(statement.text, params, { prepare: true });
  return rows as unknown as TextRow[];
}

/** The statements parsed on each PGlite instance, with their result columns. */
const pgliteStatements = new WeakMap<PGlite, Map<string, string[]>>();

const { serialize } = protocol;

function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

interface ProtocolMessage {
  name: string;
  fields?: ({ name: string } | string | null)[];
}

/**
 * PGlite's execProtocol takes neither of the locks its query() and transaction() hold, so this
 * takes both (as its describeQuery does): a statement never lands inside another caller's open
 * transaction.
 */
function runOnPglite(pg: PGlite, statement: PreparedStatement, params: Param[]): Promise<TextRow[]> {
  return pg._runExclusiveTransaction(() =>
    pg._runExclusiveQuery(async () => {
      let parsed = pgliteStatements.get(pg);
      if (parsed === undefined) pgliteStatements.set(pg, (parsed = new Map()));
      let columns = parsed.get(statement.name);
      const parts: Uint8Array[] = [];
      if (columns === undefined) parts.push(serialize.parse({ name: statement.name, text: statement.text }), serialize.describe({ type: "S", name: statement.name }));
      parts.push(serialize.bind({ statement: statement.name, values: params }), serialize.execute(), serialize.sync());
      // syncToFs: false, as PGlite's query() inside a transaction: our data directories are NodeFS
      // or memory, whose syncToFs does nothing (writes reach the files as Postgres makes them),
      // and skipping it saves a mutex and two promises a statement.
      const { messages } = await pg.execProtocol(concat(parts), { throwOnError: false, syncToFs: false });
      const rows: TextRow[] = [];
      for (const message of messages as unknown as ProtocolMessage[]) {
        if (message.name === "rowDescription") parsed.set(statement.name, (columns = (message.fields as { name: string }[]).map((f) => f.name)));
        else if (message.name === "noData") parsed.set(statement.name, (columns = []));
        else if (message.name === "error") throw message;
        else if (message.name === "dataRow") {
          const row: TextRow = {};
          (message.fields as (string | null)[]).forEach((value, i) => (row[(columns as string[])[i] as string] = value));
          rows.push(row);
        }
      }
      return rows;
    }),
  );
}
