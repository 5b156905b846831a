// Runs `sandfork-vmm serve` as a child process: starts it, waits until its socket answers the
// protocol's hello, restarts it with exponential backoff when it dies, stops it on shutdown.
//
// When the daemon dies, the kernel closes its end of every client connection; the client fails
// the requests in flight on them with RuntimeConnectionLostError (retryable) and reconnects once
// the restarted daemon is ready (see onReady).
import type { ChildProcess } from "node:child_process";
import { readFile, rm, writeFile } from "node:fs/promises";
import { basename } from "node:path";
import { createInterface } from "node:readline";
import { DaemonConnection } from "./daemon-connection.js";
import { unixEndpoint } from "./daemon-endpoint.js";
import { RuntimeUnavailableError } from "./errors.js";
import { spawnAtStartingNice } from "./event-loop-priority.js";

export interface SupervisorOptions {
  /** The `sandfork-vmm` binary. */
  binary: string;
  socketPath: string;
  /**
   * Where the running daemon's pid and its supervisor's pid are kept (default: the socket path
   * + ".pid"). A daemon left running by a supervisor that died without stopping it (its process
   * was killed; the daemon now has another parent) is found through it and stopped before a new
   * one starts. A daemon whose supervisor still runs is never touched.
   */
  pidFile?: string;
  /** The daemon's --templates: one built template per folder (see templates.ts). */
  templatesDir: string;
  /** More `serve` options (e.g. ["--max-timeout-ms", "30000"]). */
  serveArgs?: string[];
  /** How long a start may take until the socket answers hello. */
  readyTimeoutMs?: number;
  /** Restart backoff: first delay, doubled per quick death up to the maximum. */
  restartMinMs?: number;
  restartMaxMs?: number;
  /** A daemon up this long has its backoff reset. */
  stableAfterMs?: number;
  /** After SIGTERM, how long to wait before SIGKILL. */
  stopTimeoutMs?: number;
  /**
   * A running daemon is probed (connect + hello) this often; after `livenessFailures` probes in a
   * row get no answer within `livenessTimeoutMs`, it is taken as hung, killed and restarted.
   */
  livenessIntervalMs?: number;
  livenessTimeoutMs?: number;
  livenessFailures?: number;
  /**
   * Run the daemon as this user and group (set when the supervisor runs as root: see
   * unprivileged.ts). The group should be the one owning /dev/kvm; the daemon also needs to
   * read the templates and to create its socket in the socket's directory.
   */
  runAs?: { uid: number; gid: number };
  log?: (line: string) => void;
}

export interface DaemonProcessInfo {
  pid: number;
  /** The daemon's hello `server` (name and version). */
  server: string;
}

type State = "idle" | "starting" | "running" | "waiting-to-restart" | "stopping" | "stopped";

/** Lines of the daemon's stderr kept for error messages. */
const STDERR_TAIL_LINES = 20;
const PROBE_INTERVAL_MS = 25;

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** SIGTERM to a process that is not our child, SIGKILL after `timeoutMs`; resolves once it is gone. */
async function terminate(pid: number, timeoutMs: number): Promise<void> {
  const signal = (name: NodeJS.Signals) => {
    try {
      process.kill(pid, name);
    } catch {
      // Already gone.
    }
  };
  signal("SIGTERM");
  const deadline = Date.now() + timeoutMs;
  while (alive(pid)) {
    if (Date.now() > deadline) signal("SIGKILL");
    await sleep(PROBE_INTERVAL_MS);
  }
}

export class DaemonSupervisor {
  private readonly options: Required<Omit<SupervisorOptions, "log" | "runAs">> &
    Pick<SupervisorOptions, "runAs">;
  private readonly log: (line: string) => void;
  private state: State = "idle";
  private child: ChildProcess | null = null;
  private stderrTail: string[] = [];
  private startedAt = 0;
  private backoffMs: number;
  private restartTimer: NodeJS.Timeout | undefined;
  private livenessTimer: NodeJS.Timeout | undefined;
  private readonly readyListeners = new Set<(info: DaemonProcessInfo) => void>();
  private restartCount = 0;
  private readonly killOnExit = () => this.child?.kill("SIGKILL");

  constructor(options: SupervisorOptions) {
    this.options = {
      binary: options.binary,
      socketPath: options.socketPath,
      pidFile: options.pidFile ?? `${options.socketPath}.pid`,
      templatesDir: options.templatesDir,
      serveArgs: options.serveArgs ?? [],
      readyTimeoutMs: options.readyTimeoutMs ?? 15_000,
      restartMinMs: options.restartMinMs ?? 200,
      restartMaxMs: options.restartMaxMs ?? 10_000,
      stableAfterMs: options.stableAfterMs ?? 30_000,
      stopTimeoutMs: options.stopTimeoutMs ?? 5_000,
      livenessIntervalMs: options.livenessIntervalMs ?? 5_000,
      livenessTimeoutMs: options.livenessTimeoutMs ?? 2_000,
      livenessFailures: options.livenessFailures ?? 3,
      runAs: options.runAs,
    };
    this.log = options.log ?? (() => {});
    this.backoffMs = this.options.restartMinMs;
  }

  /** The running daemon's pid, if one is running. */
  get pid(): number | undefined {
    return this.child?.pid;
  }

  /** How many times the daemon was restarted after dying. */
  get restarts(): number {
    return this.restartCount;
  }

  /** Called after every start that reached hello, including restarts. Returns an unsubscribe. */
  onReady(listener: (info: DaemonProcessInfo) => void): () => void {
    this.readyListeners.add(listener);
    return () => this.readyListeners.delete(listener);
  }

  /**
   * Starts the daemon and resolves once its socket answers hello. Rejects (and leaves nothing
   * running) when another server already answers at the socket path, or when this first start
   * fails; later deaths are restarted instead.
   */
  async start(): Promise<DaemonProcessInfo> {
    if (this.state !== "idle")
      throw new Error(`the supervisor was already started (${this.state})`);
    await this.stopLeftover();
    const existing = await DaemonConnection.open(unixEndpoint(this.options.socketPath), 1_000).then(
      (connection) => {
        connection.close();
        return connection.server;
      },
      () => null,
    );
    if (existing !== null) {
      this.state = "stopped";
      throw new Error(
        `${existing} is already serving at ${this.options.socketPath}; stop it or choose another socket path`,
      );
    }
    process.on("exit", this.killOnExit);
    try {
      return await this.launch();
    } catch (error) {
      await this.stop();
      throw error;
    }
  }

  /** Stops the daemon (SIGTERM: in-flight executions finish; SIGKILL after stopTimeoutMs). */
  async stop(): Promise<void> {
    if (this.state === "stopped") return;
    this.state = "stopping";
    clearTimeout(this.restartTimer);
    clearInterval(this.livenessTimer);
    process.off("exit", this.killOnExit);
    const child = this.child;
    if (child !== null && child.exitCode === null && child.signalCode === null) {
      const exited = new Promise<void>((r) => child.once("exit", () => r()));
      child.kill("SIGTERM");
      const killer = setTimeout(() => {
        this.log(
          `sandfork-vmm (pid ${child.pid}) did not stop within ${this.options.stopTimeoutMs} ms; killing it`,
        );
        child.kill("SIGKILL");
      }, this.options.stopTimeoutMs);
      await exited;
      clearTimeout(killer);
    }
    this.child = null;
    this.state = "stopped";
    if (child !== null) await this.forgetPid(child.pid);
  }

  /**
   * Stops the daemon recorded in the pid file if it still runs `serve` on our socket and its
   * recorded supervisor is no longer its parent: that supervisor was killed before it could stop
   * it. Any other process is left alone.
   */
  private async stopLeftover(): Promise<void> {
    const recorded = await this.readPidFile();
    if (recorded === null) return;
    const { daemon, supervisor } = recorded;
    const args = (await readFile(`/proc/${daemon}/cmdline`, "utf8").catch(() => "")).split("\0");
    const serving =
      basename(args[0] ?? "") === basename(this.options.binary) &&
      args.includes("serve") &&
      args[args.indexOf("--socket") + 1] === this.options.socketPath;
    if (!serving) return this.forgetPid(daemon);
    const stat = await readFile(`/proc/${daemon}/stat`, "utf8").catch(() => "");
    // Field 4 (ppid), after the parenthesised command name.
    const parent = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
    if (parent === supervisor) return; // still supervised: start() refuses the taken socket
    this.log(
      `stopping sandfork-vmm (pid ${daemon}), left running at ${this.options.socketPath} by an earlier start`,
    );
    await terminate(daemon, this.options.stopTimeoutMs);
    await this.forgetPid(daemon);
  }

  private async readPidFile(): Promise<{ daemon: number; supervisor: number } | null> {
    const text = await readFile(this.options.pidFile, "utf8").catch(() => "");
    const [daemon, supervisor] = text.trim().split(/\s+/).map(Number);
    if (
      !Number.isSafeInteger(daemon) ||
      !Number.isSafeInteger(supervisor) ||
      (daemon as number) <= 0
    )
      return null;
    return { daemon: daemon as number, supervisor: supervisor as number };
  }

  private async forgetPid(daemon: number | undefined): Promise<void> {
    if ((await this.readPidFile())?.daemon === daemon)
      await rm(this.options.pidFile, { force: true });
  }

  private async launch(): Promise<DaemonProcessInfo> {
    this.state = "starting";
    const args = [
      "serve",
      "--socket",
      this.options.socketPath,
      "--templates",
      this.options.templatesDir,
      ...this.options.serveArgs,
    ];
    const runAs = this.options.runAs;
    // In a session of its own: where the kernel groups tasks by session, the guests then share
    // no scheduling group with a gateway that raised its own (runtime/event-loop-priority.ts).
    const child = spawnAtStartingNice(this.options.binary, args, {
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
      ...(runAs === undefined ? {} : { uid: runAs.uid, gid: runAs.gid }),
    });
    this.child = child;
    this.stderrTail = [];
    this.startedAt = Date.now();
    const forward = (line: string) => {
      if (line.trim() === "") return;
      this.stderrTail.push(line);
      if (this.stderrTail.length > STDERR_TAIL_LINES) this.stderrTail.shift();
      this.log(`[sandfork-vmm] ${line}`);
    };
    if (child.stdout)
      createInterface({ input: child.stdout, crlfDelay: Infinity }).on("line", forward);
    if (child.stderr)
      createInterface({ input: child.stderr, crlfDelay: Infinity }).on("line", forward);
    let spawnError: Error | null = null;
    child.once("error", (error) => {
      spawnError = error;
    });
    child.once("exit", (code, signal) => this.exited(child, code, signal));
    // After "close" every line the child wrote has been forwarded.
    const outputDone = new Promise<void>((r) => child.once("close", () => r()));
    // Only now, with every listener attached (an await earlier could miss "exit" and "close").
    if (child.pid !== undefined)
      await writeFile(this.options.pidFile, `${child.pid} ${process.pid}\n`);

    const deadline = Date.now() + this.options.readyTimeoutMs;
    for (;;) {
      if (this.child !== child || this.isStopping()) {
        throw new Error("the supervisor was stopped while sandfork-vmm was starting");
      }
      if (spawnError !== null)
        throw new Error(`cannot start ${this.options.binary}: ${(spawnError as Error).message}`);
      if (child.exitCode !== null || child.signalCode !== null) {
        await outputDone;
        throw new Error(
          `sandfork-vmm exited during start-up (${child.signalCode ?? `exit code ${child.exitCode}`})${this.stderrSummary()}`,
        );
      }
      try {
        const probe = await DaemonConnection.open(unixEndpoint(this.options.socketPath), 1_000);
        probe.close();
        const info = { pid: child.pid as number, server: probe.server };
        this.state = "running";
        this.watchLiveness(child);
        this.log(`${info.server} serving at ${this.options.socketPath} (pid ${info.pid})`);
        for (const listener of this.readyListeners) listener(info);
        return info;
      } catch (error) {
        if (Date.now() > deadline) {
          child.kill("SIGKILL");
          throw new Error(
            `sandfork-vmm did not answer at ${this.options.socketPath} within ${this.options.readyTimeoutMs} ms (${(error as Error).message})${this.stderrSummary()}`,
          );
        }
        await sleep(PROBE_INTERVAL_MS);
      }
    }
  }

  /** Probes `child` while it is the running daemon; kills it when it stops answering. */
  private watchLiveness(child: ChildProcess): void {
    clearInterval(this.livenessTimer);
    let failures = 0;
    let probing = false;
    this.livenessTimer = setInterval(() => {
      if (probing) return;
      if (this.child !== child || this.state !== "running") {
        clearInterval(this.livenessTimer);
        return;
      }
      probing = true;
      DaemonConnection.open(unixEndpoint(this.options.socketPath), this.options.livenessTimeoutMs)
        .then(
          (probe) => {
            probe.close();
            failures = 0;
          },
          (error: Error) => {
            // An error frame (e.g. `busy`: too many connections) is an answer: the daemon is alive.
            if (!(error instanceof RuntimeUnavailableError)) {
              failures = 0;
              return;
            }
            failures += 1;
            if (
              failures < this.options.livenessFailures ||
              this.child !== child ||
              this.state !== "running"
            )
              return;
            this.log(
              `sandfork-vmm (pid ${child.pid}) did not answer ${failures} liveness probes in a row (${error.message}); killing it`,
            );
            clearInterval(this.livenessTimer);
            child.kill("SIGKILL");
          },
        )
        .finally(() => {
          probing = false;
        });
    }, this.options.livenessIntervalMs);
    this.livenessTimer.unref();
  }

  private isStopping(): boolean {
    return this.state === "stopping" || this.state === "stopped";
  }

  private stderrSummary(): string {
    return this.stderrTail.length === 0
      ? ""
      : `; its last output:\n  ${this.stderrTail.join("\n  ")}`;
  }

  private exited(child: ChildProcess, code: number | null, signal: NodeJS.Signals | null): void {
    if (this.child !== child) return;
    const how = signal !== null ? `killed by ${signal}` : `exit code ${code}`;
    if (this.isStopping()) {
      this.log(`sandfork-vmm (pid ${child.pid}) stopped (${how})`);
      return;
    }
    if (this.state === "starting") return; // launch() reports it
    if (Date.now() - this.startedAt >= this.options.stableAfterMs)
      this.backoffMs = this.options.restartMinMs;
    const delay = this.nextRestartDelay();
    this.log(`sandfork-vmm (pid ${child.pid}) died (${how}); restarting in ${delay} ms`);
    this.scheduleRestart(delay);
  }

  /** The current backoff delay; the next one is twice as long, up to restartMaxMs. */
  private nextRestartDelay(): number {
    const delay = this.backoffMs;
    this.backoffMs = Math.min(delay * 2, this.options.restartMaxMs);
    return delay;
  }

  private scheduleRestart(delay: number): void {
    this.state = "waiting-to-restart";
    this.child = null;
    this.restartTimer = setTimeout(() => {
      this.restartCount += 1;
      this.launch().catch((error: Error) => {
        if (this.isStopping()) return;
        const next = this.nextRestartDelay();
        this.log(`restarting sandfork-vmm failed: ${error.message}; next attempt in ${next} ms`);
        this.child?.kill("SIGKILL");
        this.scheduleRestart(next);
      });
    }, delay);
  }
}
