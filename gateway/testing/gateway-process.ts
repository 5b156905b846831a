// Test and load-test support: the gateway as `npm start` runs it (gateway/main.ts, a supervised
// `sandfork-vmm serve` under it) in a child process of its own, so that it can be measured
// (/proc/<pid>/stat) or killed with SIGKILL and started again on the same database; and
// startService, which starts any of the repository's entry points so (a cluster's nodes too).
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { copySeedTo } from "../../db/testing/pglite-seed.js";
import { EMBEDDED_DATABASE_DIR } from "../config.js";
import { testNodeFlags } from "./kvm-tier.js";

const REPOSITORY = fileURLToPath(new URL("../..", import.meta.url));
export const GATEWAY_MAIN = fileURLToPath(new URL("../main.ts", import.meta.url));
/** The gateway's ready line; its match's [1] is the URL it listens on. */
export const GATEWAY_LISTENING = /sandfork gateway listening on (http:\/\/\S+)/;
const ADMIN_KEY = /^\s+(sfk_[0-9A-Za-z]+)\s*$/;
const ADMIN_ACCOUNT = /POST \/v1\/accounts\/([0-9a-f-]{36})\/credits/;

export interface GatewayProcessOptions {
  /**
   * SANDFORK_DATA_DIR: the embedded database (unless DATABASE_URL is set; a new one is copied from
   * the test run's PGlite seed when there is one: db/testing/pglite-seed.ts) and the signing key.
   */
  dataDir: string;
  /** SANDFORK_VMM_SOCKET: the daemon's socket, so a caller can reach the daemon directly. */
  socketPath: string;
  /** SANDFORK_TEMPLATES_DIR: built templates (npm run build puts them in .sandfork/templates). */
  templatesDir: string;
  /** PostgreSQL server; undefined: embedded PGlite in dataDir. */
  databaseUrl?: string | undefined;
  /** More environment (e.g. SANDFORK_VMM_SERVE_ARGS). */
  env?: Record<string, string>;
  /** Node options before the script, e.g. --cpu-prof (after testNodeFlags). */
  nodeArgs?: string[];
  /** How long start-up (migrations, templates, the daemon's first hello) may take. */
  startTimeoutMs?: number;
  /** In a session of its own, as `setsid npm start` runs it (see ServiceOptions.ownSession). */
  ownSession?: boolean;
}

export interface GatewayProcess {
  url: string;
  pid: number;
  /** Printed on the first start of an empty database only. */
  admin: { key: string; accountId: string } | undefined;
  /** Everything it wrote to stdout and stderr so far. */
  log: string[];
  /** The supervised daemon's pid, from the supervisor's pid file. */
  daemonPid(): number;
  /** Sends `signal` and waits for the process to exit. */
  stop(signal?: NodeJS.Signals): Promise<void>;
}

/** A port that was free a moment ago (the gateway wants a fixed PORT). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() =>
        typeof address === "object" && address !== null
          ? resolve(address.port)
          : reject(new Error("no port")),
      );
    });
  });
}

export interface ServiceOptions {
  /** The TypeScript entry point. */
  main: string;
  /** Printed once the service is ready; the match is the ServiceProcess's `ready`. */
  ready: RegExp;
  /** Its environment (nothing of this process's is added). */
  env: NodeJS.ProcessEnv;
  /** Node options before the script, e.g. --cpu-prof (after testNodeFlags). */
  nodeArgs?: string[];
  /** A command the service runs under, e.g. `ip netns exec NS` (which execs: the pid is the service's). */
  launcher?: string[];
  startTimeoutMs: number;
  /**
   * In a session of its own (setsid): where the kernel groups tasks by session, its scheduling
   * group is then its own and not this process's (runtime/event-loop-priority.ts).
   */
  ownSession?: boolean;
}

export interface ServiceProcess {
  pid: number;
  /** Everything it wrote to stdout and stderr so far. */
  log: string[];
  /** The ready line's match. */
  ready: RegExpExecArray;
  exited: Promise<void>;
  /** Sends `signal` and waits for the process to exit. */
  stop(signal?: NodeJS.Signals): Promise<void>;
}

/** Starts `main` with tsx in a child process and waits for its ready line (SIGKILLed if none comes in time). */
export async function startService(options: ServiceOptions): Promise<ServiceProcess> {
  const argv = [
    ...(options.launcher ?? []),
    process.execPath,
    ...testNodeFlags,
    ...(options.nodeArgs ?? []),
    "--import",
    "tsx",
    options.main,
  ];
  const child = spawn(argv[0] as string, argv.slice(1), {
    cwd: REPOSITORY,
    env: options.env,
    stdio: ["ignore", "pipe", "pipe"],
    detached: options.ownSession ?? false,
  });
  const log: string[] = [];
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const ready = new Promise<RegExpExecArray>((resolve, reject) => {
    const onLine = (line: string) => {
      log.push(line);
      const match = options.ready.exec(line);
      if (match !== null) resolve(match);
    };
    createInterface({ input: child.stdout as NodeJS.ReadableStream }).on("line", onLine);
    createInterface({ input: child.stderr as NodeJS.ReadableStream }).on("line", onLine);
    child.once("exit", (code, signal) =>
      reject(
        new Error(
          `${options.main} exited during start-up (${signal ?? `code ${code}`}):\n${log.join("\n")}`,
        ),
      ),
    );
  });
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () =>
        reject(
          new Error(
            `${options.main} not ready within ${options.startTimeoutMs} ms:\n${log.join("\n")}`,
          ),
        ),
      options.startTimeoutMs,
    );
  });
  const stop = async (signal: NodeJS.Signals = "SIGTERM") => {
    if (child.exitCode === null && child.signalCode === null) child.kill(signal);
    await exited;
  };
  try {
    const match = await Promise.race([ready, timeout]);
    return { pid: child.pid as number, log, ready: match, exited, stop };
  } catch (error) {
    await stop("SIGKILL");
    throw error;
  } finally {
    clearTimeout(timer);
  }
}

/** The admin key and its account, printed on the first start of an empty database only. */
export function printedAdmin(
  log: readonly string[],
): { key: string; accountId: string } | undefined {
  let key: string | undefined;
  let accountId: string | undefined;
  for (const line of log) {
    key ??= ADMIN_KEY.exec(line)?.[1];
    accountId ??= ADMIN_ACCOUNT.exec(line)?.[1];
  }
  return key !== undefined && accountId !== undefined ? { key, accountId } : undefined;
}

export async function startGatewayProcess(options: GatewayProcessOptions): Promise<GatewayProcess> {
  if (options.databaseUrl === undefined)
    await copySeedTo(join(options.dataDir, EMBEDDED_DATABASE_DIR));
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    PORT: String(await freePort()),
    SANDFORK_DATA_DIR: options.dataDir,
    SANDFORK_VMM_SOCKET: options.socketPath,
    SANDFORK_TEMPLATES_DIR: options.templatesDir,
    SANDFORK_RUNTIME: "supervised",
    ...options.env,
  };
  if (options.databaseUrl === undefined) delete env.DATABASE_URL;
  else env.DATABASE_URL = options.databaseUrl;
  const service = await startService({
    main: GATEWAY_MAIN,
    ready: GATEWAY_LISTENING,
    env,
    nodeArgs: options.nodeArgs ?? [],
    startTimeoutMs: options.startTimeoutMs ?? 60_000,
    ownSession: options.ownSession ?? false,
  });
  return {
    url: service.ready[1] as string,
    pid: service.pid,
    admin: printedAdmin(service.log),
    log: service.log,
    daemonPid: () => Number(readFileSync(`${options.socketPath}.pid`, "utf8").split(" ")[0]),
    stop: service.stop,
  };
}

/** A key made with the admin key its first start printed: `credits` and limits no test reaches. */
export async function issueKey(
  gateway: Pick<GatewayProcess, "url" | "admin" | "log">,
  name: string,
  credits: number,
): Promise<{ key: string; accountId: string }> {
  const admin = gateway.admin;
  if (admin === undefined) throw new Error(`no admin key printed:\n${gateway.log.join("\n")}`);
  const created = await fetch(`${gateway.url}/v1/keys`, {
    method: "POST",
    headers: { authorization: `Bearer ${admin.key}`, "content-type": "application/json" },
    body: JSON.stringify({ name, credits, rate_limit_per_minute: 1_000_000, max_concurrency: 100 }),
  });
  if (created.status !== 201)
    throw new Error(`POST /v1/keys answered ${created.status}: ${await created.text()}`);
  const key = (await created.json()) as { key: string; account_id: string };
  return { key: key.key, accountId: key.account_id };
}
