// The PostgreSQL server the load test and the benchmarks measure on: the one DATABASE_URL or
// TEST_DATABASE_URL names, or else a private throwaway one from scripts/postgres.sh with fsync on,
// as PostgreSQL ships (the tests' servers run without it): a commit that waits for the disk is
// part of what billing costs on a real server. Each run gets a fresh database on it
// (emptyPostgresDatabase, as the tests do).
import { execFileSync } from "node:child_process";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import postgres from "postgres";

const SCRIPT = fileURLToPath(new URL("../../scripts/postgres.sh", import.meta.url));

/** A server URL and how to let go of it; a private server lives in tmpdir()/dirName on `port`. */
export function postgresServer(privateServer: { dirName: string; port: number }): {
  url: string;
  stop(): void;
} {
  const given = process.env.DATABASE_URL || process.env.TEST_DATABASE_URL;
  if (given) return { url: given, stop: () => {} };
  // Its own directory and port: another user's server from scripts/postgres.sh is left alone.
  const env = {
    ...process.env,
    SANDFORK_PG_DIR: join(tmpdir(), privateServer.dirName),
    SANDFORK_PG_PORT: String(privateServer.port),
    SANDFORK_PG_FSYNC: "on",
  };
  const exported = execFileSync("bash", [SCRIPT, "start"], { env, encoding: "utf8" });
  const url = /TEST_DATABASE_URL=(\S+)/.exec(exported)?.[1];
  if (url === undefined)
    throw new Error(`scripts/postgres.sh start printed no TEST_DATABASE_URL: ${exported}`);
  return { url, stop: () => execFileSync("bash", [SCRIPT, "stop"], { env, stdio: "ignore" }) };
}

/** How the server makes a commit durable: what the figures on it include. */
export interface Durability {
  fsync: string;
  synchronous_commit: string;
}

/** The server's fsync and synchronous_commit. */
export async function durabilityOf(serverUrl: string): Promise<Durability> {
  const sql = postgres(serverUrl, { max: 1, onnotice: () => {} });
  try {
    const [settings] = await sql.unsafe<Durability[]>(
      "SELECT current_setting('fsync') AS fsync, current_setting('synchronous_commit') AS synchronous_commit",
    );
    return {
      fsync: settings?.fsync ?? "unknown",
      synchronous_commit: settings?.synchronous_commit ?? "unknown",
    };
  } finally {
    await sql.end();
  }
}
