// `npm run keys:create` (flags: `-- --help`). Creates a key directly in the configured database
// (for an operator at the gateway's host) and prints the secret once.
import { SCOPES, type Scope } from "../../db/keys.js";
import { loadConfig } from "../config.js";
import { issueKey } from "../key-service.js";
import { openConfiguredDatabase } from "../server.js";
import { commandLine } from "./command-line.js";

const { values, fail } = commandLine(
  "npm run keys:create -- --name NAME [--scopes execute,usage:read] [--credits N] [--account ID] [--expires-in SECONDS]",
  {
    name: { type: "string", default: "cli" },
    scopes: { type: "string", default: "execute,usage:read" },
    credits: { type: "string" },
    account: { type: "string" },
    "expires-in": { type: "string" },
  },
);

function positiveInteger(flag: string, raw: string | undefined): number | undefined {
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (!Number.isSafeInteger(n) || n <= 0) fail(`--${flag} must be a positive integer`);
  return n;
}

async function main(): Promise<void> {
  const scopes = values.scopes.split(",").map((s) => s.trim());
  const unknown = scopes.filter((s) => !(SCOPES as readonly string[]).includes(s));
  if (unknown.length > 0)
    fail(`--scopes: unknown scope(s) ${unknown.join(", ")}; known: ${SCOPES.join(", ")}`);
  const expiresIn = positiveInteger("expires-in", values["expires-in"]);
  const credits = positiveInteger("credits", values.credits);

  const config = loadConfig();
  const open = await openConfiguredDatabase(config);
  try {
    const { key, stored } = await issueKey(open.db, {
      name: values.name,
      scopes: scopes as Scope[],
      accountId: values.account,
      credits,
      expiresAt: expiresIn === undefined ? null : new Date(Date.now() + expiresIn * 1000),
      limits: config.defaultKeyLimits,
    });
    console.log(`key id:     ${stored.id}`);
    console.log(`account id: ${stored.accountId}`);
    console.log(`scopes:     ${stored.scopes.join(", ")}`);
    console.log(`secret (shown once): ${key}`);
  } finally {
    await open.close();
  }
}

try {
  await main();
} catch (error) {
  console.error(`keys:create: ${error instanceof Error ? error.message : String(error)}`);
  process.exitCode = 1;
}
