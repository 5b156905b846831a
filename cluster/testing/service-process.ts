// For the cluster's tests: a node (cluster/node-main.ts) or a gateway (gateway/main.ts) in a
// child process of its own, optionally inside a network namespace (`ip netns exec NS`, which
// execs, so the pid is the service's), started once it prints its ready line.
import { type ChildProcess, spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

const REPOSITORY = fileURLToPath(new URL("../..", import.meta.url));

export const NODE_MAIN = fileURLToPath(new URL("../node-main.ts", import.meta.url));
export const GATEWAY_MAIN = fileURLToPath(new URL("../../gateway/main.ts", import.meta.url));
export const NODE_READY = /sandfork node \S+ serving/;
export const GATEWAY_READY = /sandfork gateway listening on (http:\/\/\S+)/;

export interface ServiceOptions {
  /** The TypeScript entry point. */
  main: string;
  ready: RegExp;
  env: Record<string, string>;
  /** The network namespace to run in; undefined: this one. */
  netns?: string | undefined;
  startTimeoutMs: number;
  /** Prefix of each line echoed to this process's stderr; undefined: not echoed. */
  echo?: string | undefined;
}

export interface ServiceProcess {
  pid: number;
  log: string[];
  /** The ready line's match. */
  ready: RegExpExecArray;
  exited: Promise<void>;
  stop(signal?: NodeJS.Signals): Promise<void>;
}

export async function startService(options: ServiceOptions): Promise<ServiceProcess> {
  const command = [process.execPath, "--import", "tsx", options.main];
  const argv =
    options.netns === undefined ? command : ["ip", "netns", "exec", options.netns, ...command];
  const child: ChildProcess = spawn(argv[0] as string, argv.slice(1), {
    cwd: REPOSITORY,
    env: { ...process.env, ...options.env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const log: string[] = [];
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const ready = new Promise<RegExpExecArray>((resolve, reject) => {
    const onLine = (line: string) => {
      log.push(line);
      if (options.echo !== undefined) process.stderr.write(`${options.echo} ${line}\n`);
      const match = options.ready.exec(line);
      if (match !== null) resolve(match);
    };
    createInterface({ input: child.stdout as NodeJS.ReadableStream }).on("line", onLine);
    createInterface({ input: child.stderr as NodeJS.ReadableStream }).on("line", onLine);
    child.once("exit", (code, signal) =>
      reject(
        new Error(`${options.main} exited during start-up (${signal ?? code}):\n${log.join("\n")}`),
      ),
    );
  });
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () =>
        reject(
          new Error(
            `${options.main} not ready in ${options.startTimeoutMs} ms:\n${log.join("\n")}`,
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
